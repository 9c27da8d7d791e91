"""Padding helpers for variable-length batches (upstream flash-attn 2.8.x
``flash_attn.bert_padding``).

A padded batch ``(batch, seqlen, ...)`` with a boolean/0-1 ``attention_mask`` is turned into the
"unpadded" (packed) layout ``(total_nnz, ...)`` that the ``*_varlen_*`` attention functions take,
plus the bookkeeping needed to go back:

* ``indices`` (int64, ``(total_nnz,)``): for each packed token, its row in the flattened
  ``(batch * seqlen, ...)`` input;
* ``cu_seqlens`` (int32, ``(batch + 1,)``): cumulative sequence lengths starting at 0, so that
  sequence ``b`` occupies rows ``cu_seqlens[b]:cu_seqlens[b + 1]`` of the packed tensor;
* ``max_seqlen_in_batch`` (a Python ``int``).

Pure PyTorch; works on any device.  The gather/scatter along the first axis are written as
autograd Functions (as upstream) so that the backward is a plain scatter/gather instead of the
generic advanced-indexing backward.
"""

import torch
import torch.nn.functional as F

__all__ = [
    "IndexFirstAxis",
    "IndexPutFirstAxis",
    "IndexFirstAxisResidual",
    "index_first_axis",
    "index_put_first_axis",
    "index_first_axis_residual",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
    "pad_input",
]


def _scatter_rows(rows, indices, first_axis_dim, base=None):
    """A ``(first_axis_dim, *rows.shape[1:])`` tensor that is ``base`` (zeros if None) with
    ``rows[i]`` added to row ``indices[i]`` for every i (repeated indices accumulate)."""
    if base is None:
        base = rows.new_zeros((first_axis_dim, *rows.shape[1:]))
    return base.index_add(0, indices, rows)


class IndexFirstAxis(torch.autograd.Function):
    """``input[indices]`` along the first axis; backward scatters the gradient back."""

    @staticmethod
    def forward(ctx, input, indices):
        assert input.ndim >= 1, "index_first_axis needs a tensor with at least one dimension"
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return torch.index_select(input, 0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return _scatter_rows(grad_output, indices, ctx.first_axis_dim), None


index_first_axis = IndexFirstAxis.apply


class IndexPutFirstAxis(torch.autograd.Function):
    """A zero tensor with ``first_axis_dim`` rows whose rows ``indices`` are set to ``values``;
    backward gathers those rows of the gradient."""

    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        assert indices.ndim == 1, "indices must be 1-D"
        assert values.ndim >= 1, "values needs at least one dimension"
        ctx.save_for_backward(indices)
        output = values.new_zeros((first_axis_dim, *values.shape[1:]))
        output[indices] = values
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return torch.index_select(grad_output, 0, indices), None, None


index_put_first_axis = IndexPutFirstAxis.apply


class IndexFirstAxisResidual(torch.autograd.Function):
    """Returns ``(input[indices], input)``: the gathered rows plus the input itself as a second
    output (a residual that the caller keeps using).  The input's gradient is the residual's
    gradient plus the gathered rows' gradient scattered back into place."""

    @staticmethod
    def forward(ctx, input, indices):
        assert input.ndim >= 1, "index_first_axis_residual needs at least one dimension"
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        # The residual is returned detached (as upstream) so that autograd treats it as a
        # fresh output of this Function rather than the input itself.
        return input[indices], input.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_residual):
        (indices,) = ctx.saved_tensors
        assert grad_residual.shape[1:] == grad_output.shape[1:]
        return _scatter_rows(grad_output, indices, ctx.first_axis_dim, base=grad_residual), None


index_first_axis_residual = IndexFirstAxisResidual.apply


def _flatten_batch(hidden_states):
    """(batch, seqlen, ...) -> (batch * seqlen, ...)."""
    return hidden_states.reshape(-1, *hidden_states.shape[2:])


def _cu_seqlens(seqlens):
    """Per-sequence lengths -> int32 cumulative lengths with a leading 0, and the max (int)."""
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() > 0 else 0
    return cu_seqlens, max_seqlen


def _gather_kept(hidden_states, kept, seqlens_in_batch):
    """(tokens, indices, cu_seqlens, max_seqlen_in_batch) of the unpad functions: the tokens of
    hidden_states (batch, seqlen, ...) where kept (batch, seqlen) is True, in batch-major order,
    and the sequences' lengths seqlens_in_batch."""
    # Integer indices rather than a boolean mask: indexing with a bool mask would expand it
    # over the trailing dims first, and the indices are needed by pad_input anyway.
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    cu_seqlens, max_seqlen_in_batch = _cu_seqlens(seqlens_in_batch)
    return (index_first_axis(_flatten_batch(hidden_states), indices), indices, cu_seqlens,
            max_seqlen_in_batch)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Remove the padding tokens of a batch.

    Arguments:
        hidden_states: (batch, seqlen, ...).
        attention_mask: (batch, seqlen), bool or int; nonzero (1) marks a valid token, 0 padding.
        unused_mask: optional (batch, seqlen), bool or int; nonzero marks a token that is
            allocated (kept in the packed output and counted in cu_seqlens) but not used, e.g.
            preallocated room at the end of each sequence.  It should not overlap attention_mask.
    Return:
        hidden_states: (total_nnz, ...), the tokens selected by attention_mask or unused_mask, in
            batch-major order.
        indices: (total_nnz,) int64, each kept token's index in the flattened (batch * seqlen)
            input.
        cu_seqlens: (batch + 1,) int32, cumulative kept lengths starting with 0.
        max_seqlen_in_batch: int, the largest kept length.
        seqused: (batch,) int32, the number of valid tokens (attention_mask only) per sequence;
            with no unused_mask it equals cu_seqlens.diff().
    """
    used = attention_mask != 0
    kept = used if unused_mask is None else (used | (unused_mask != 0))
    seqlens_in_batch = kept.sum(dim=-1, dtype=torch.int32)
    seqused = used.sum(dim=-1, dtype=torch.int32)
    return _gather_kept(hidden_states, kept, seqlens_in_batch) + (seqused,)


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Unpad a batch whose rows each hold several short samples concatenated together.

    Row b of attention_mask_in_length lists the lengths of the samples packed (left-aligned,
    one after another) into row b of hidden_states, followed by zeros.  Each sample becomes its
    own sequence in the output, so attention does not cross sample boundaries.  For example,
    with seqlen = 6 the row ``[2, 3, 0, 0, 0, 0]`` means tokens 0-1 are one sample, tokens 2-4
    another, and token 5 is padding.  (This is useful for packing variable-length samples for
    fine-tuning; see upstream issue Dao-AILab/flash-attention#432.)

    Arguments:
        hidden_states: (batch, seqlen, ...).
        attention_mask_in_length: (batch, seqlen), int; the nonzero entries of each row are the
            lengths of its concatenated samples, 0 means none.
    Return:
        hidden_states: (total_nnz, ...), the tokens of all samples, in order.
        indices: (total_nnz,) int64, each kept token's index in the flattened input.
        cu_seqlens: (num_samples + 1,) int32, cumulative sample lengths starting with 0.
        max_seqlen_in_batch: int, the longest sample.
    """
    seqlen = attention_mask_in_length.shape[-1]
    row_total = attention_mask_in_length.sum(dim=-1)
    positions = torch.arange(seqlen, device=attention_mask_in_length.device)
    kept = positions.unsqueeze(0) < row_total.unsqueeze(-1)
    flat_lengths = attention_mask_in_length.flatten()
    seqlens_in_batch = flat_lengths[flat_lengths != 0]
    return _gather_kept(hidden_states, kept, seqlens_in_batch)


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of unpad_input: put the packed tokens back into a zero-padded batch.

    Arguments:
        hidden_states: (total_nnz, ...), the packed tokens.
        indices: (total_nnz,), each token's index in the flattened (batch * seqlen) batch, as
            returned by unpad_input.
        batch: int, batch size of the padded output.
        seqlen: int, sequence length of the padded output.
    Return:
        hidden_states: (batch, seqlen, ...), zeros where no token was placed.
    """
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.reshape(batch, seqlen, *output.shape[1:])
