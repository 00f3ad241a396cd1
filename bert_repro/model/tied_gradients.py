"""One gradient buffer for the token embeddings and the MLM decoder that shares them: the `tied_gradients` switch.

Autograd gives the shared (vocab, H) weight two dense gradients, the decoder's and the lookup's (zeros plus the
looked-up rows), and sums them into a third. Here the lookup adds its rows into the decoder's gradient in place: the
same sum, without two vocab-sized buffers. Measured in benchmarks/LOG.md ("Pre-training step, BERT-BASE").

The lookup hands its `TiedGradient` to the decoder through the shared weight itself (`PENDING`), so the two modules
need no link: a decoder whose weight is another finds none. Correct in any order of the backwards, and without the
decoder (each then returns its own gradient for autograd to sum). Plain autograd when the weight is not shared, with
`inputs_embeds`, and under create_graph. Not one graph under whole-model `torch.compile`; the recipes warn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .modeling_bert_repro import BertReproEmbeddings, BertReproMLMHead


class TiedGradient:
    """The decoder's gradient, waiting for the lookup to add its rows (one per forward)."""

    def __init__(self):
        self.pending: torch.Tensor | None = None
        self.lookup_done = False

    def take(self) -> torch.Tensor | None:
        """For the lookup's backward: the decoder's gradient to add its rows into, if it came first."""
        pending, self.pending = self.pending, None
        self.lookup_done = True
        return pending


class DecoderWeight(torch.autograd.Function):
    """Identity on the decoder's weight; its backward hands the gradient to the lookup."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, tied: TiedGradient) -> torch.Tensor:
        ctx.tied = tied
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        tied = ctx.tied
        if tied.lookup_done or torch.is_grad_enabled():  # lookup already done, or a double backward: plain autograd
            return grad, None
        tied.pending = grad if tied.pending is None else tied.pending + grad
        return None, None


class LookupInto(torch.autograd.Function):
    """`F.embedding` whose backward adds its rows into the decoder's pending gradient, if any."""

    @staticmethod
    def forward(ctx, input_ids: torch.Tensor, weight: torch.Tensor, tied: TiedGradient):
        ctx.save_for_backward(input_ids)
        ctx.tied, ctx.weight_shape = tied, weight.shape
        return F.embedding(input_ids, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (input_ids,) = ctx.saved_tensors
        rows, index = grad.reshape(-1, grad.shape[-1]), input_ids.reshape(-1)
        target = None if torch.is_grad_enabled() else ctx.tied.take()
        if target is None:
            return None, grad.new_zeros(ctx.weight_shape).index_add(0, index, rows), None
        return None, target.index_add_(0, index, rows), None


# The attribute of the shared weight that holds the `TiedGradient` of the forward under way (None when its lookup ran
# plain autograd), set by the lookup and taken by the decoder.
PENDING = "pending_tied_gradient"


def _plain_embedding(embedding: nn.Module) -> bool:
    return (
        type(embedding) is nn.Embedding
        and embedding.padding_idx is None
        and embedding.max_norm is None
        and not embedding.scale_grad_by_freq
        and not embedding.sparse
    )


class TiedGradientEmbeddings(BertReproEmbeddings):
    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        weight, tied = self.word_embeddings.weight, None
        if inputs_embeds is None and torch.is_grad_enabled() and weight.requires_grad:
            if _plain_embedding(self.word_embeddings):
                tied = TiedGradient()
                inputs_embeds, input_ids = LookupInto.apply(input_ids, weight, tied), None
        setattr(weight, PENDING, tied)  # also None: a decoder must never take an earlier forward's
        return super().forward(input_ids, token_type_ids, position_ids, inputs_embeds)


class TiedGradientMLMHead(BertReproMLMHead):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.decoder.weight
        tied = getattr(weight, PENDING, None)
        if tied is None:
            return super().forward(hidden_states)
        setattr(weight, PENDING, None)
        return F.linear(self.transform(hidden_states), DecoderWeight.apply(weight, tied), self.decoder.bias) + self.bias


__all__ = ["PENDING", "TiedGradient", "TiedGradientEmbeddings", "TiedGradientMLMHead"]
