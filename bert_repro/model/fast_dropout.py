"""Dropout masks from 15-bit random numbers, two per draw of the CPU generator: the `fast_dropout` switch.

On CPU, drawing the random numbers is most of dropout's cost: `bernoulli_` draws one 32-bit MT19937 number per
element. Here each 32-bit draw gives two 15-bit numbers, and the mask is kept as bool for the backward. Measured in
benchmarks/LOG.md ("Pre-training step", "MRPC fine-tuning"). No effect on GPUs or in eval mode.

The drop probability is rounded to a multiple of 1/32768 (0.1 -> 0.100006), kept values scaled by exactly 1 / (1 -
that). Not one graph under whole-model `torch.compile` (dynamo does not trace `random_()`); the recipes warn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fast_keep_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """The keep-mask for a tensor like x (bool, x's shape) and the scale of the kept values."""
    n = x.numel()
    draws = torch.empty((n + 1) // 2, dtype=torch.int32, device=x.device).random_()  # 31 random bits each
    threshold = round(p * 32768)
    # Each draw read as two 16-bit halves (a view, no copy); 15 bits of each: bits 0-14 and 16-30.
    halves = draws.view(torch.int16)[:n] & 0x7FFF
    return (halves >= threshold).view(x.shape), 32768 / (32768 - threshold)


class FastDropoutFunction(torch.autograd.Function):
    """Dropout with the mask of `fast_keep_mask`, saved as bool for the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, ctx.scale = fast_keep_mask(x, p)
        ctx.save_for_backward(keep)
        return torch.mul(x, keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.scale), None


def fast_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout` with the mask of `fast_keep_mask` on CPU; elsewhere, and for p = 0 or 1, plain `F.dropout`."""
    if not training or x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    return FastDropoutFunction.apply(x, p)


class FastDropout(nn.Dropout):
    """`nn.Dropout` drawing its mask with `fast_dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_dropout(x, self.p, self.training)


def eager_attention_fast_dropout(
    module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs
):
    """`eager_attention` of the model file with the probabilities dropped by `fast_dropout`."""
    scores = torch.matmul(query, key.transpose(-1, -2))
    scores.mul_(scaling)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores.add_(attention_mask)
    probs = fast_dropout(F.softmax(scores, dim=-1), dropout, module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def takes_fast_dropout_kernel(self_attention: nn.Module, hidden_states: torch.Tensor) -> bool:
    """Whether a self-attention runs `eager_attention_fast_dropout`: training with dropout on CPU, eager or SDPA."""
    return bool(
        self_attention.training
        and self_attention.dropout_prob
        and hidden_states.device.type == "cpu"
        and self_attention.config._attn_implementation in ("eager", "sdpa")
    )


__all__ = ["FastDropout", "eager_attention_fast_dropout", "fast_dropout", "fast_keep_mask", "takes_fast_dropout_kernel"]
