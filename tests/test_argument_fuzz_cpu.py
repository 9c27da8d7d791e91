"""A seeded random fuzzer of the entry points' arguments (no GPU): every call either succeeds
or raises FlashAttnValueError / FlashAttnTypeError / ValueError / TypeError / RuntimeError whose
message names one of the arguments that were changed - never any other exception (an
IndexError from the KV-cache append, an AssertionError from CpuExt's kernel preconditions, a
ZeroDivisionError...), and a rejected KV-cache call leaves the caches as they were.

The calls run on CPU tensors through the real Python layer and op implementations, with the
extension replaced by fa_test_utils.CpuExt (whose asserts are the kernels' preconditions), so
the value checks of the index tensors run too (on the host)."""

import math
import random

import numpy as np
import pytest
import torch

from flash_attn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from flash_attn.flash_attn_interface import FlashAttnTypeError, FlashAttnValueError

from fa_test_utils import install_cpu_ext

ALLOWED = (FlashAttnValueError, FlashAttnTypeError, ValueError, TypeError, RuntimeError)
CALLS = 250  # per entry point

B, S, SK, H, HK, D = 2, 6, 9, 4, 2, 16


def _i32(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def _bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


COMMON = {
    "dropout_p": [0.0, 0.1, 0, np.float64(0.2), torch.tensor(0.1), 1.0, -0.1, float("nan"),
                  "0.1", None, True, [0.1]],
    "softmax_scale": [None, 0.0, -0.0, -0.3, 0.5, 2, np.float32(0.1), torch.tensor(0.3),
                      float("nan"), float("inf"), -float("inf"), 1e39, "0.5", True, [1.0]],
    "causal": [False, True, 0, 1, np.bool_(True), torch.tensor(True), "False", None, 2, 1.0],
    "window_size": [(-1, -1), (2, 0), [3, 1], (0, 0), (-7, 2), torch.tensor([2, 1]),
                    torch.tensor([1, 0], dtype=torch.int32), (torch.tensor(2), 1),
                    (np.int64(3), np.int32(0)), (2**40, -(2**40)), (2.5, 0), (1, 2, 3), "ab",
                    None, 5, (True, 0), torch.tensor([1.0, 2.0]), torch.tensor([1, 2, 3]),
                    ("1", 0)],
    "softcap": [0.0, 3.0, -1.0, 0, 2, torch.tensor(2.0), None, "1.0", float("nan"),
                float("inf")],
    "alibi_slopes": ["H", "BH", None, "F16", "SHAPE", "LIST", "META"],
}
DENSE = dict(COMMON, deterministic=[False, True, 0, "yes", None],
             return_attn_probs=[False, True, np.bool_(True), None, "no"])
VARLEN = dict(DENSE, cu_seqlens_q=["OK", "START1", "DECREASING", "PAST_END", "INT64", "2D",
                                   "LIST", "SHORT", "NEGATIVE"],
              cu_seqlens_k=["OK", "START1", "DECREASING", "PAST_END", "INT64", "LIST"],
              max_seqlen_q=[7, 100, 0, 6, -1, 2**31, 2**31 - 1, 7.0, "7", torch.tensor(7),
                            np.int64(7), True, None],
              max_seqlen_k=[7, 100, 0, 3, -1, 2**31, 7.0, torch.tensor(7), None])
KVCACHE = {
    "softmax_scale": COMMON["softmax_scale"],
    "causal": COMMON["causal"],
    "window_size": COMMON["window_size"],
    "softcap": COMMON["softcap"],
    "alibi_slopes": COMMON["alibi_slopes"],
    "num_splits": [0, 1, 3, 200, np.int32(2), torch.tensor(2), -1, 2**31, 2**63, 1.5, "2",
                   True, None],
    "rotary_interleaved": [True, False, None, "yes"],
    "return_softmax_lse": [False, True, None, "no"],
    "cache_seqlens": [None, 3, 0, 28, 29, 30, -1, 3.0, "3", np.int64(4), "T_OK", "T_NEG",
                      "T_OVER", "T_INT64", "T_SHAPE"],
    "cache_batch_idx": [None, "OK", "OVER", "NEG", "INT64"],
    "cache_leftpad": [None, "ZERO", "SOME", "NEG", "OVER"],
    "block_table": [None, None, "OK", "BAD_ENTRY", "NEG_ENTRY", "FEW_COLS", "INT64", "UNUSED_BAD"],
    "kv_new": [True, True, False],
}


def _alibi(kind):
    return {"H": torch.rand(H) * 0.5, "BH": torch.rand(B, H) * 0.5, None: None,
            "F16": torch.rand(H).half(), "SHAPE": torch.rand(H + 1),
            "LIST": [0.1] * H, "META": torch.empty(H, device="meta")}[kind]


def _resolve(kwargs):
    kwargs = dict(kwargs)
    if "alibi_slopes" in kwargs:
        kwargs["alibi_slopes"] = _alibi(kwargs["alibi_slopes"])
    return kwargs


def _mutations(rng, pool):
    names = rng.sample(sorted(pool), k=rng.choice([1, 1, 2, 3]))
    return {n: pool[n][rng.randrange(len(pool[n]))] for n in names}


def _check_outcome(call, changed, what):
    try:
        call()
    except ALLOWED as e:
        msg = str(e)
        names = set(changed)
        if "kv_new" in names:
            names |= {"k", "v", "seqlen_new"}
        if names & {"cu_seqlens_q", "cu_seqlens_k"}:
            names |= {"cu_seqlens"}
        if "softcap" in names or "dropout_p" in names:
            names |= {"softcap", "dropout_p"}
        assert any(n in msg for n in names), (
            f"{what}: {type(e).__name__} names none of the changed arguments {sorted(changed)}: "
            f"{msg}")
        return False
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{what}: {type(e).__name__} is not a clear error: {e}") from e
    return True


@pytest.fixture
def cpu_ext(monkeypatch):
    return install_cpu_ext(monkeypatch)


@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_fuzz_dense(cpu_ext, variant):
    rng = random.Random(f"dense-{variant}")
    torch.manual_seed(1)
    q, k, v = _bf16(B, S, H, D), _bf16(B, SK, HK, D), _bf16(B, SK, HK, D)
    qkv, kv = _bf16(B, S, 3, H, D), _bf16(B, SK, 2, HK, D)
    ok = 0
    for i in range(CALLS):
        changed = _mutations(rng, DENSE)
        kw = _resolve(changed)
        if variant == "func":
            call = lambda: flash_attn_func(q, k, v, **kw)  # noqa: E731
        elif variant == "qkvpacked":
            call = lambda: flash_attn_qkvpacked_func(qkv, **kw)  # noqa: E731
        else:
            call = lambda: flash_attn_kvpacked_func(q, kv, **kw)  # noqa: E731
        ok += _check_outcome(call, changed, f"{variant} call {i} {changed}")
    assert 0 < ok < CALLS


def _cu(kind, lens, total):
    cu = [0] + list(np.cumsum(lens))
    if kind == "OK":
        return _i32(*cu)
    if kind == "START1":
        return _i32(*[c + 1 for c in cu])
    if kind == "DECREASING":
        return _i32(*(cu[:2] + [cu[1] - 1] + cu[3:]))
    if kind == "PAST_END":
        return _i32(*(cu[:-1] + [total + 1]))
    if kind == "INT64":
        return torch.tensor(cu)
    if kind == "2D":
        return _i32(*cu).view(1, -1)
    if kind == "LIST":
        return cu
    if kind == "SHORT":
        return _i32(0)
    if kind == "NEGATIVE":
        return _i32(*[-c for c in cu])
    raise AssertionError(kind)


@pytest.mark.parametrize("variant", ["func", "qkvpacked", "kvpacked"])
def test_fuzz_varlen(cpu_ext, variant):
    rng = random.Random(f"varlen-{variant}")
    torch.manual_seed(2)
    lens = [5, 0, 7]
    total = sum(lens) + 2
    q, k, v = _bf16(total, H, D), _bf16(total, HK, D), _bf16(total, HK, D)
    qkv, kv = _bf16(total, 3, H, D), _bf16(total, 2, HK, D)
    ok = 0
    for i in range(CALLS):
        changed = _mutations(rng, VARLEN)
        kw = _resolve(changed)
        args = {"cu_seqlens_q": _cu(kw.pop("cu_seqlens_q", "OK"), lens, total),
                "cu_seqlens_k": _cu(kw.pop("cu_seqlens_k", "OK"), lens, total),
                "max_seqlen_q": kw.pop("max_seqlen_q", 7), "max_seqlen_k": kw.pop("max_seqlen_k", 7)}
        if variant == "func":
            call = lambda: flash_attn_varlen_func(q, k, v, *args.values(), **kw)  # noqa: E731
        elif variant == "qkvpacked":
            call = lambda: flash_attn_varlen_qkvpacked_func(  # noqa: E731
                qkv, args["cu_seqlens_q"], args["max_seqlen_q"], **kw)
            changed = {("cu_seqlens" if n.startswith("cu_seqlens") else
                        "max_seqlen" if n.startswith("max_seqlen") else n): x
                       for n, x in changed.items() if n not in ("cu_seqlens_k", "max_seqlen_k")}
            if not changed:
                continue
        else:
            call = lambda: flash_attn_varlen_kvpacked_func(q, kv, *args.values(), **kw)  # noqa
        ok += _check_outcome(call, changed, f"varlen {variant} call {i} {changed}")
    assert 0 < ok < CALLS


def _kv_index(kind, name, b, batch_cache, seqlens):
    if kind is None:
        return None
    if name == "cache_batch_idx":
        return {"OK": _i32(2, 0), "OVER": _i32(0, batch_cache), "NEG": _i32(-1, 0),
                "INT64": torch.tensor([0, 1])}[kind]
    if isinstance(seqlens, torch.Tensor) and seqlens.shape == (b,):
        s = seqlens.tolist()
    else:
        s = [seqlens if isinstance(seqlens, int) else 0] * b
    return {"ZERO": _i32(0, 0), "SOME": _i32(*[x // 2 for x in s]), "NEG": _i32(-1, 0),
            "OVER": _i32(*[x + 1 for x in s])}[kind]


def test_fuzz_kvcache(cpu_ext):
    rng = random.Random("kvcache")
    torch.manual_seed(3)
    seqlen_cache, page, hk, d = 32, 16, HK, D
    q = _bf16(B, 2, H, d)
    dense_k, dense_v = _bf16(B + 1, seqlen_cache, hk, d), _bf16(B + 1, seqlen_cache, hk, d)
    paged_k, paged_v = _bf16(5, page, hk, d), _bf16(5, page, hk, d)
    kn, vn = _bf16(B, 2, hk, d), _bf16(B, 2, hk, d)
    tables = {"OK": _i32(0, 3, 4, 1).view(2, 2), "BAD_ENTRY": _i32(0, 3, 4, 5).view(2, 2),
              "NEG_ENTRY": _i32(0, -1, 4, 1).view(2, 2), "FEW_COLS": _i32(0, 4).view(2, 1),
              "INT64": torch.tensor([[0, 3], [4, 1]]), "UNUSED_BAD": _i32(0, 3, 4, 9).view(2, 2)}
    ok = 0
    for i in range(CALLS):
        changed = _mutations(rng, KVCACHE)
        kw = _resolve(changed)
        new = kw.pop("kv_new", True)
        table = kw.pop("block_table", None)
        seqlens = kw.pop("cache_seqlens", None)
        if isinstance(seqlens, str) and seqlens.startswith("T_"):
            seqlens = {"T_OK": _i32(3, 20), "T_NEG": _i32(3, -2), "T_OVER": _i32(3, 31),
                       "T_INT64": torch.tensor([3, 4]), "T_SHAPE": _i32(3)}[seqlens]
        if table == "UNUSED_BAD":
            seqlens = _i32(3, 4)  # sequence 1 uses one page: its bad second entry is unused
        for name in ("cache_batch_idx", "cache_leftpad"):
            if name in kw:
                kw[name] = _kv_index(kw[name], name, B, B + 1, seqlens)
        if table is not None:
            kc, vc, bt = paged_k.clone(), paged_v.clone(), tables[table]
        else:
            kc, vc, bt = dense_k.clone(), dense_v.clone(), None
        before = kc.clone(), vc.clone()
        k_new, v_new = (kn, vn) if new else (None, None)
        call = lambda: flash_attn_with_kvcache(  # noqa: E731
            q, kc, vc, k_new, v_new, cache_seqlens=seqlens, block_table=bt, **kw)
        if table is not None:
            changed = dict(changed, block_table=table)
        if not _check_outcome(call, changed, f"kvcache call {i} {changed}"):
            assert torch.equal(kc, before[0]) and torch.equal(vc, before[1]), (
                f"kvcache call {i} {changed}: a rejected call wrote the cache")
        else:
            ok += 1
    assert 0 < ok < CALLS


def test_fuzzer_sees_every_failure_kind(cpu_ext):
    """The fuzzer's own check catches a missing check: an exception of another type, or a
    message naming none of the changed arguments, fails it."""
    with pytest.raises(AssertionError, match="not a clear error"):
        _check_outcome(lambda: [][1], {"x": 1}, "probe")
    with pytest.raises(AssertionError, match="names none"):
        _check_outcome(lambda: (_ for _ in ()).throw(ValueError("flash_attn: q is bad")),
                       {"softcap": 1}, "probe")
    assert _check_outcome(lambda: None, {"x": 1}, "probe")
    assert math.isfinite(CALLS)
