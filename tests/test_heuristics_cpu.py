"""The size-dependent kernel choices (csrc/common/heuristics.h) through the compiled extension,
on the CPU: the split-KV split counts, the deterministic backward's dq_accum slices and the
warp-specialised forward's persistent / 128-row-tile choices, at the sizes their comments cite."""

import pytest

from fa_test_utils import load_extension

ext, _err = load_extension()
pytestmark = pytest.mark.skipif(ext is None or not hasattr(ext, "heuristic_splitkv_splits"),
                                reason="flash_attn._C is not built")
SMS = 132  # H100 / H200


def _decode_ctas(batch, kv_heads=8):
    return batch * kv_heads  # one 16-row block of packed query rows per (batch, kv head)


@pytest.mark.parametrize("batch, seqlen_k, sm80_splits, sm90_splits",
                         [(16, 4096, 1, 1), (16, 32768, 4, 1), (4, 131072, 16, 4)])
def test_splitkv_splits_of_the_decode_cells(batch, seqlen_k, sm80_splits, sm90_splits):
    ctas = _decode_ctas(batch)
    assert ext.heuristic_splitkv_splits(ctas, SMS, seqlen_k, False, False) == sm80_splits
    assert ext.heuristic_splitkv_splits(ctas, SMS, seqlen_k, False, True) == sm90_splits


@pytest.mark.parametrize("one_cta_per_sm", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_splitkv_splits_bounds(paged, one_cta_per_sm):
    for ctas in (1, 7, 64, 200, 1000):
        for seqlen_k in (1, 127, 128, 1000, 8192, 100_000, 1 << 20):
            s = ext.heuristic_splitkv_splits(ctas, SMS, seqlen_k, paged, one_cta_per_sm)
            assert 1 <= s <= 128 and s <= max(1, seqlen_k // 128), (ctas, seqlen_k, s)
    # A batch that already fills the GPU is not split.
    assert ext.heuristic_splitkv_splits(2 * SMS, SMS, 1 << 20, paged, False) == 1


def test_deterministic_splits():
    assert ext.heuristic_deterministic_splits(16, 64, SMS) == 8   # few heads, long keys: 8 slices fit one wave
    assert ext.heuristic_deterministic_splits(SMS, 10, SMS) == 1  # one CTA per SM already
    for bh in (1, 5, 64, 1000):
        for n_blocks in (1, 3, 100):
            assert 1 <= ext.heuristic_deterministic_splits(bh, n_blocks, SMS) <= min(8, n_blocks)


def test_bwd_ws_causal_head_group():
    # The d128 tile from 1k queries: the group's Q, dO and fp32 dQ (8 bytes per element) within
    # 32 MB, 1 to 16 heads; elsewhere one head after the other.
    assert ext.heuristic_bwd_ws_causal_head_group(128, 2048) == 16
    assert ext.heuristic_bwd_ws_causal_head_group(128, 8192) == 4
    assert ext.heuristic_bwd_ws_causal_head_group(128, 1 << 20) == 1
    assert ext.heuristic_bwd_ws_causal_head_group(128, 512) == 1
    assert ext.heuristic_bwd_ws_causal_head_group(256, 8192) == 1
    assert ext.heuristic_bwd_ws_causal_head_group(64, 2048) == 1


def test_bwd_ws_d128_block_m():
    # FA3's 80-row query blocks for the d128 backward without a window; 64 rows under a causal
    # or local mask.
    assert ext.heuristic_bwd_ws_d128_block_m(-1, -1) == 80
    assert ext.heuristic_bwd_ws_d128_block_m(-1, 0) == 64
    assert ext.heuristic_bwd_ws_d128_block_m(256, 256) == 64
    assert ext.heuristic_bwd_ws_d128_block_m(256, -1) == 64


@pytest.mark.parametrize("tile, sq, sk, left, right, expected", [
    (64, 512, 512, -1, 0, (True, True)),        # short causal d64: persistent, 128-row tiles
    (64, 2048, 2048, -1, 0, (True, False)),     # longer causal: FA3's 192-row tiles
    (64, 4096, 4096, 256, 0, (True, True)),     # a narrow window
    (64, 4096, 4096, -1, -1, (True, False)),
    (128, 8192, 8192, -1, -1, (True, False)),   # persistent up to 8k keys
    (128, 16384, 16384, -1, -1, (False, False)),
    (256, 512, 512, -1, -1, (False, False)),    # d256: one CTA per tile
])
def test_fwd_ws_choices(tile, sq, sk, left, right, expected):
    assert tuple(ext.heuristic_fwd_ws_choice(tile, sq, sk, left, right)) == expected
