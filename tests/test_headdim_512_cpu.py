"""Argument checks of head dims 257-512 (the forward alone), on meta tensors: accepted by the dense
and varlen forwards without pages (shapes from the ops' fakes), refused by name elsewhere."""

import pytest
import torch

from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flash_attn.flash_attn_interface import FlashAttnValueError, _flash_attn_backward


def _m(*shape, grad=False):
    return torch.randn(*shape, device="meta", dtype=torch.bfloat16, requires_grad=grad)


def test_forward_accepts_head_dims_up_to_512():
    for d in (264, 300, 512):
        with torch.no_grad():
            out = flash_attn_func(_m(2, 17, 4, d), _m(2, 33, 2, d), _m(2, 33, 2, d), causal=True)
        assert out.shape == (2, 17, 4, d)
    cu = torch.tensor([0, 10, 30], dtype=torch.int32, device="meta")
    with torch.inference_mode():
        out = flash_attn_varlen_func(_m(30, 4, 320), _m(30, 2, 320), _m(30, 2, 320), cu, cu, 20, 20)
    assert out.shape == (30, 4, 320)


def test_refusals_name_the_reason():
    q, k, v = _m(1, 8, 2, 512), _m(1, 8, 2, 512), _m(1, 8, 2, 512)
    with pytest.raises(FlashAttnValueError, match=r"head dims above 256 \(here 512\) have a forward only"):
        flash_attn_func(_m(1, 8, 2, 512, grad=True), k, v)
    with torch.no_grad():
        for kwargs in (dict(dropout_p=0.1), dict(softcap=5.0),
                       dict(alibi_slopes=torch.rand(1, 2, device="meta"))):
            with pytest.raises(FlashAttnValueError, match="run plain attention only"):
                flash_attn_func(q, k, v, **kwargs)
        with pytest.raises(FlashAttnValueError, match="headdim 520; headdim must be between 1 and 512"):
            flash_attn_func(_m(1, 8, 2, 520), _m(1, 8, 2, 520), _m(1, 8, 2, 520))
        with pytest.raises(FlashAttnValueError, match="between 1 and 256"):
            flash_attn_with_kvcache(q, k, v)
        cu = torch.tensor([0, 8], dtype=torch.int32, device="meta")
        table = torch.zeros(1, 1, dtype=torch.int32, device="meta")
        with pytest.raises(FlashAttnValueError, match="between 1 and 256"):
            flash_attn_varlen_func(q[0], _m(1, 256, 2, 512), _m(1, 256, 2, 512), cu, cu, 8, 8,
                                   block_table=table)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    with pytest.raises(FlashAttnValueError, match="between 1 and 256"):
        _flash_attn_backward(q, q, k, v, q, torch.empty(1, 2, 8, device="meta"), dq, dk, dv, 0.0,
                             512 ** -0.5, False, -1, -1, 0.0, None, False)
