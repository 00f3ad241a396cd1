"""Eager attention over groups of similar-length sequences, forward and backward written out (`GroupedAttention`).

It serves the unpadded encoder (`unpad_inputs`) when the kernel is eager (also SDPA training with `fast_dropout` on
CPU). Autograd over gather, per-group `eager_attention` and gather back would stack, concatenate, zero-fill and
`index_add` in the backward; one function makes fewer passes over memory. Measured in benchmarks/LOG.md ("MRPC
fine-tuning", "Pre-training step"); figures in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import torch

from .fast_dropout import fast_keep_mask


class GroupedAttention(torch.autograd.Function):
    """Per-grid `eager_attention` over `groups` (an `unpadding.AttentionGroups`): fused (tokens, 3 * hidden) Q/K/V
    projections in, the (tokens, hidden) context out. Each grid's Q, K, V are gathered straight into the head-major
    layout of the batched products, and the backward writes their gradients into one buffer. Dropout is `fast_dropout`'s
    (`fast`) or `F.dropout`'s. No double backward.

    With `queries` (each sequence's first-token query: `last_layer_subset` reading [CLS] only) the input is the
    (tokens, 2 * hidden) K/V projections and the output the context at those first tokens.
    """

    @staticmethod
    def forward(
        ctx,
        qkv: torch.Tensor,
        groups,
        heads: int,
        scaling: float,
        dropout: float,
        fast: bool,
        queries: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens, width = qkv.shape
        first_only = queries is not None
        parts = 2 if first_only else 3
        head_size = width // (parts * heads)
        hidden = heads * head_size
        # Everything runs in qkv's dtype (under autocast, the projection's).
        with torch.autocast(qkv.device.type, enabled=False):
            # the padding cells' context goes to row `tokens`, dropped (first tokens are never padding)
            out = qkv.new_empty(len(queries) if first_only else tokens + 1, hidden)
            saved, layout = [], []
            for (rows, seq, key_mask), gather, dest, first, start in groups.per_grid():
                batch = heads * rows
                rows_in = qkv.narrow(0, start, rows * seq) if start is not None else qkv.index_select(0, gather)
                cells = _heads_first(rows_in, parts, heads, rows, seq)
                if first_only:
                    key, value = cells.unbind(0)
                    query = _heads_first(queries.index_select(0, first), 1, heads, rows, 1)[0]
                else:
                    query, key, value = cells.unbind(0)
                n = query.shape[1]  # queries per grid row
                scores = torch.baddbmm(
                    _empty_like(qkv, batch, n, seq), query, key.transpose(1, 2), beta=0, alpha=scaling
                )
                if key_mask is not None:  # (rows, 1, 1, seq) -> (1, rows, 1, seq) for the head-major batch
                    scores.view(heads, rows, n, seq).masked_fill_(
                        ~key_mask.view(1, rows, 1, seq), torch.finfo(scores.dtype).min
                    )
                probs = torch.softmax(scores, dim=-1)
                del scores
                mask, scale = None, 1.0
                if dropout:
                    if fast:
                        mask, scale = fast_keep_mask(probs, dropout)
                    else:  # what F.dropout does on CPU: Bernoulli(1 - p) noise scaled by 1 / (1 - p)
                        mask = torch.empty_like(probs).bernoulli_(1 - dropout).div_(1 - dropout)
                kept = probs if mask is None else probs * mask
                context = torch.baddbmm(_empty_like(qkv, batch, n, head_size), kept, value, beta=0, alpha=scale)
                if start is not None and not first_only:
                    _tokens_first_into(out.narrow(0, start, rows * n), context, heads)
                else:
                    out.index_copy_(0, first if first_only else dest, _tokens_first(context, heads, rows * n))
                saved += [cells, probs, kept] + ([query] if first_only else []) + ([mask] if mask is not None else [])
                layout.append((rows, seq, scale, mask is not None))
        ctx.save_for_backward(*saved, groups.dest, groups.first)
        ctx.layout, ctx.heads, ctx.scaling, ctx.first_only, ctx.tokens = layout, heads, scaling, first_only, tokens
        ctx.sizes, ctx.row_sizes, ctx.starts = groups.sizes, groups.row_sizes, groups.starts
        return out if first_only else out[:tokens]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        *saved, all_dest, all_first = ctx.saved_tensors
        heads, scaling, first_only, tokens = ctx.heads, ctx.scaling, ctx.first_only, ctx.tokens
        parts = 2 if first_only else 3
        hidden = grad.shape[1]
        head_size = hidden // heads
        grad_queries = grad.new_empty(grad.shape) if first_only else None
        if not first_only and None in ctx.starts:
            # A zero row at `tokens`: the padding cells' queries read it, so they add nothing to K and V's gradients.
            grad = torch.cat([grad, grad.new_zeros(1, hidden)])
        grad_qkv = grad.new_empty(tokens + 1, parts * hidden)  # row `tokens` takes the padding cells' (dropped)
        i = 0
        for (rows, seq, scale, has_mask), dest, first, start in zip(
            ctx.layout, all_dest.split(ctx.sizes), all_first.split(ctx.row_sizes), ctx.starts
        ):
            cells, probs, kept = saved[i : i + 3]
            i += 3
            if first_only:
                (key, value), query = cells.unbind(0), saved[i]
                i += 1
            else:
                query, key, value = cells.unbind(0)
            mask = saved[i] if has_mask else None
            i += has_mask
            batch, n = heads * rows, query.shape[1]
            if first_only:
                grad_rows = grad.index_select(0, first)
            else:
                grad_rows = grad.narrow(0, start, rows * n) if start is not None else grad.index_select(0, dest)
            grad_context = _heads_first(grad_rows, 1, heads, rows, n)[0]
            grads = grad.new_empty(parts, batch, seq, head_size)  # (d query |) d key | d value, head-major
            torch.baddbmm(grads[-1], kept.transpose(1, 2), grad_context, beta=0, alpha=scale, out=grads[-1])
            grad_probs = torch.baddbmm(
                _empty_like(grad, batch, n, seq), grad_context, value.transpose(1, 2), beta=0, alpha=scale
            )
            if mask is not None:
                grad_probs.mul_(mask)
            # softmax's backward: probs * (grad_probs - sum(grad_probs * probs)), in place in grad_probs
            grad_scores = grad_probs.mul_(probs)
            grad_scores.addcmul_(probs, grad_scores.sum(-1, keepdim=True), value=-1)
            torch.baddbmm(grads[-2], grad_scores.transpose(1, 2), query, beta=0, alpha=scaling, out=grads[-2])
            if first_only:
                grad_query = torch.baddbmm(
                    _empty_like(grad, batch, n, head_size), grad_scores, key, beta=0, alpha=scaling
                )
                grad_queries.index_copy_(0, first, _tokens_first(grad_query, heads, rows))
            else:
                torch.baddbmm(grads[0], grad_scores, key, beta=0, alpha=scaling, out=grads[0])
            grads = grads.view(parts * batch, seq, head_size)
            if start is not None:
                _tokens_first_into(grad_qkv.narrow(0, start, rows * seq), grads, parts * heads)
            else:
                grad_qkv.index_copy_(0, dest, _tokens_first(grads, parts * heads, rows * seq))
        return grad_qkv[:tokens], None, None, None, None, None, grad_queries


def _heads_first(x: torch.Tensor, parts: int, heads: int, rows: int, n: int) -> torch.Tensor:
    """(rows * n, parts * heads * head_size) -> (parts, heads * rows, n, head_size), batch index head * rows + row."""
    return x.view(rows * n, parts * heads, -1).transpose(0, 1).reshape(parts, heads * rows, n, -1)


def _tokens_first(x: torch.Tensor, heads: int, cells: int) -> torch.Tensor:
    """The inverse of `_heads_first` for one part (with parts stacked in x, pass heads = parts * heads)."""
    return x.view(heads, cells, -1).transpose(0, 1).reshape(cells, -1)


def _tokens_first_into(target: torch.Tensor, x: torch.Tensor, heads: int) -> None:
    """`_tokens_first(x, heads, len(target))` copied into target in one pass."""
    cells = target.shape[0]
    target.view(cells, heads, -1).transpose(0, 1).copy_(x.view(heads, cells, -1))


def _empty_like(x: torch.Tensor, *shape: int) -> torch.Tensor:
    """The ignored `input` of baddbmm with beta=0, without memory."""
    return x.new_empty(()).expand(*shape)


__all__ = ["GroupedAttention"]
