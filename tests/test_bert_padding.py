"""Tests of flash_attn.bert_padding (pure PyTorch: run on the CPU, and on CUDA when present)."""

import pytest
import torch

from flash_attn.bert_padding import (index_first_axis, index_first_axis_residual,
                                     index_put_first_axis, pad_input, unpad_input,
                                     unpad_input_for_concatenated_sequences)

from fa_test_utils import DEVICES


def random_mask(batch, seqlen, device, contiguous=True):
    """(batch, seqlen) bool mask; row 0 is all False, row 1 all True, the others random
    (a valid prefix when contiguous, else scattered tokens)."""
    assert batch >= 3
    if contiguous:
        lengths = torch.randint(0, seqlen + 1, (batch,), device=device)
        lengths[0], lengths[1] = 0, seqlen
        return torch.arange(seqlen, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    mask = torch.rand(batch, seqlen, device=device) < 0.5
    mask[0] = False
    mask[1] = True
    return mask


def unpad_reference(x, mask):
    """Per-sequence loop: (packed tokens, indices, cu_seqlens, max_seqlen, seqlens)."""
    batch, seqlen = mask.shape
    rows, idx, lens = [], [], []
    for b in range(batch):
        pos = [s for s in range(seqlen) if bool(mask[b, s])]
        rows += [x[b, s] for s in pos]
        idx += [b * seqlen + s for s in pos]
        lens.append(len(pos))
    packed = torch.stack(rows) if rows else x.new_zeros((0, *x.shape[2:]))
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return packed, idx, cu, max(lens), lens


# ---------------------------------------------------------------------------------------
# unpad_input / pad_input
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32])
@pytest.mark.parametrize("trailing", [(8,), (3, 5)])
def test_unpad_input_matches_reference(device, contiguous, mask_dtype, trailing):
    batch, seqlen = 6, 13
    x = torch.randn(batch, seqlen, *trailing, device=device)
    mask = random_mask(batch, seqlen, device, contiguous)
    out, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask.to(mask_dtype))
    ref, ref_idx, ref_cu, ref_max, ref_lens = unpad_reference(x, mask)

    assert out.shape == (len(ref_idx), *trailing)
    assert torch.equal(out, ref)
    assert indices.dtype == torch.int64 and indices.tolist() == ref_idx
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == ref_cu
    assert type(max_seqlen) is int and max_seqlen == ref_max == seqlen  # row 1 is full
    assert seqused.dtype == torch.int32 and seqused.tolist() == ref_lens
    assert seqused[0].item() == 0
    for t in (indices, cu_seqlens, seqused):
        assert t.device == x.device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("contiguous", [True, False])
def test_pad_unpad_round_trip(device, contiguous):
    batch, seqlen = 5, 11
    x = torch.randn(batch, seqlen, 4, 6, device=device)
    mask = random_mask(batch, seqlen, device, contiguous)
    packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(x, mask)

    padded = pad_input(packed, indices, batch, seqlen)
    assert padded.shape == x.shape and padded.dtype == x.dtype
    assert torch.equal(padded, x * mask[:, :, None, None])

    # And back: unpadding the re-padded tensor gives the same tokens.
    packed2, indices2, cu2, max2, _ = unpad_input(padded, mask)
    assert torch.equal(packed2, packed) and torch.equal(indices2, indices)
    assert torch.equal(cu2, cu_seqlens) and max2 == max_seqlen

    # Sequence b of the packed tensor lies in rows cu_seqlens[b]:cu_seqlens[b+1].
    for b in range(batch):
        lo, hi = cu_seqlens[b].item(), cu_seqlens[b + 1].item()
        assert torch.equal(packed[lo:hi], x[b][mask[b]])


@pytest.mark.parametrize("device", DEVICES)
def test_unpad_input_unused_mask(device):
    batch, seqlen = 4, 10
    x = torch.randn(batch, seqlen, 3, device=device)
    used_len = torch.tensor([0, 10, 3, 5], device=device)
    unused_len = torch.tensor([2, 0, 4, 1], device=device)
    pos = torch.arange(seqlen, device=device).unsqueeze(0)
    attention_mask = pos < used_len.unsqueeze(1)
    unused_mask = (pos >= used_len.unsqueeze(1)) & (pos < (used_len + unused_len).unsqueeze(1))

    out, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask, unused_mask)
    ref, ref_idx, ref_cu, ref_max, _ = unpad_reference(x, attention_mask | unused_mask)
    assert torch.equal(out, ref) and indices.tolist() == ref_idx
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == ref_cu
    assert max_seqlen == ref_max == 10
    assert seqused.dtype == torch.int32 and seqused.tolist() == used_len.tolist()

    # Integer masks give the same result.
    res_int = unpad_input(x, attention_mask.int(), unused_mask.int())
    assert torch.equal(res_int[0], out) and torch.equal(res_int[2], cu_seqlens)
    assert torch.equal(res_int[4], seqused)


@pytest.mark.parametrize("device", DEVICES)
def test_unpad_input_all_padding(device):
    x = torch.randn(3, 4, 2, device=device)
    mask = torch.zeros(3, 4, dtype=torch.bool, device=device)
    out, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    assert out.shape == (0, 2) and indices.numel() == 0
    assert cu_seqlens.tolist() == [0, 0, 0, 0] and max_seqlen == 0
    assert torch.equal(pad_input(out, indices, 3, 4), torch.zeros_like(x))


# ---------------------------------------------------------------------------------------
# unpad_input_for_concatenated_sequences
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_unpad_concatenated_sequences_example(device):
    lengths = torch.tensor(
        [[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]],
        device=device,
    )
    x = torch.randn(4, 6, 5, device=device)
    out, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == [0, 2, 5, 8, 10, 16]
    assert type(max_seqlen) is int and max_seqlen == 6
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10] + list(range(12, 18))
    assert torch.equal(out, x.reshape(24, 5)[indices])
    kept = torch.zeros(4, 6, dtype=torch.bool, device=device)
    kept[0, :5] = kept[1, :5] = kept[2, :] = True
    assert torch.equal(pad_input(out, indices, 4, 6), x * kept.unsqueeze(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_unpad_concatenated_sequences_random(device):
    batch, seqlen = 5, 12
    rows = []
    for b in range(batch):
        budget = 0 if b == 0 else (seqlen if b == 1 else int(torch.randint(0, seqlen + 1, ())))
        row = []
        while budget > 0:
            n = int(torch.randint(1, budget + 1, ()))
            row.append(n)
            budget -= n
        rows.append(row + [0] * (seqlen - len(row)))
    lengths = torch.tensor(rows, device=device, dtype=torch.int32)
    x = torch.randn(batch, seqlen, 3, device=device)
    out, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)

    flat = [n for row in rows for n in row if n]
    ref_cu = [0]
    for n in flat:
        ref_cu.append(ref_cu[-1] + n)
    assert cu_seqlens.tolist() == ref_cu and cu_seqlens.dtype == torch.int32
    assert max_seqlen == max(flat)
    ref_idx = [b * seqlen + s for b, row in enumerate(rows) for s in range(sum(row))]
    assert indices.tolist() == ref_idx
    assert torch.equal(out, x.reshape(-1, 3)[indices])


# ---------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_index_functions_gradcheck(device):
    x = torch.randn(7, 2, 3, device=device, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([4, 0, 6, 2], device=device)
    dup = torch.tensor([1, 5, 1, 3, 5, 5], device=device)  # repeated rows accumulate
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, idx), (x,))
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, dup), (x,))
    assert torch.autograd.gradcheck(lambda t: index_first_axis_residual(t, dup), (x,))
    vals = torch.randn(4, 2, 3, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: index_put_first_axis(t, idx, 9), (vals,))


@pytest.mark.parametrize("device", DEVICES)
def test_index_functions_values(device):
    x = torch.randn(7, 3, device=device)
    idx = torch.tensor([4, 0, 6], device=device)
    assert torch.equal(index_first_axis(x, idx), x[idx])
    out, residual = index_first_axis_residual(x, idx)
    assert torch.equal(out, x[idx]) and torch.equal(residual, x)
    put = index_put_first_axis(x[:3], idx, 8)
    ref = torch.zeros(8, 3, device=device)
    ref[idx] = x[:3]
    assert torch.equal(put, ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("contiguous", [True, False])
def test_unpad_pad_gradcheck(device, contiguous):
    batch, seqlen = 4, 5
    mask = random_mask(batch, seqlen, device, contiguous)
    x = torch.randn(batch, seqlen, 2, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: unpad_input(t, mask)[0], (x,))
    _, indices, *_ = unpad_input(x.detach(), mask)
    packed = torch.randn(indices.numel(), 2, device=device, dtype=torch.float64,
                         requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices, batch, seqlen), (packed,))
    # The composite: d(pad(unpad(x)))/dx is the mask.
    y = pad_input(unpad_input(x, mask)[0], indices, batch, seqlen)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    assert torch.equal(gx, g * mask.unsqueeze(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_unpad_concatenated_gradcheck(device):
    lengths = torch.tensor([[2, 1, 0, 0], [4, 0, 0, 0], [0, 0, 0, 0]], device=device)
    x = torch.randn(3, 4, 2, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: unpad_input_for_concatenated_sequences(t, lengths)[0], (x,)
    )
