"""The BERT model family (Devlin et al., 2018), written from the paper.

Paper section -> code:
- 3 / Figure 2, input representation: `BertReproEmbeddings` (token + learned position + segment embeddings,
  LayerNorm, dropout).
- 3, model architecture (Vaswani et al.'s encoder, post-LN): `BertReproSelfAttention`, `BertReproLayer`,
  `BertReproEncoder`. Attention runs through transformers' attention interface, so "eager", "sdpa" and
  "flash_attention_2" (where installed) are chosen with `attn_implementation=...`.
- 3.1 task #1, masked LM: `BertReproMLMHead` (dense, gelu, LayerNorm, then a decoder tied to the token embeddings
  with its own output bias); task #2, NSP: a linear layer on the pooled [CLS] output.
- 4 / Figure 4, fine-tuning heads: sequence classification or regression on the pooled output (GLUE, STS-B);
  start/end span vectors S and E (SQuAD); one score per choice, softmax over the choices (SWAG); per-token
  classification (NER).
- 5.3 feature-based use: `output_hidden_states=True` returns the embeddings and every layer's output;
  `concat_last_layers` builds the paper's best feature set (the last four layers concatenated).

Parameter names follow the layout of the public BERT checkpoints (Google's TensorFlow variable names as the
Hugging Face format spells them: `bert.embeddings.word_embeddings.weight`,
`bert.encoder.layer.0.attention.self.query.weight`, `cls.predictions.transform.dense.weight`, ...), so every
public checkpoint loads with `from_pretrained` and no renaming, and `bert_repro.export` writes one back.

Losses follow the HF conventions: label -100 is ignored in token-level losses; `next_sentence_label` 0 means
IsNext and 1 NotNext. Each loss is the mean over its own labelled items in the batch (as the reference code does
per TPU core); the model sets `accepts_loss_kwargs = False` so that Trainer divides by the number of
gradient-accumulation steps instead of assuming the model normalises by `num_items_in_batch`.

This file is copied next to the weights by `save_pretrained` (trust_remote_code loading), so it imports only
torch, safetensors, transformers and its sibling `configuration_bert_repro`.
"""

from __future__ import annotations

import os
import sys
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from safetensors import SafetensorError
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput, logging
from transformers.utils.generic import is_flash_attention_requested

from .configuration_bert_repro import EXACT_GELU, TANH_GELU, BertReproConfig

logger = logging.get_logger(__name__)


def activation(name: str):
    """The feed-forward activation named in the config (transformers' spellings)."""
    if name in EXACT_GELU:
        return F.gelu
    if name in TANH_GELU:
        return lambda x: F.gelu(x, approximate="tanh")
    return {"relu": F.relu, "silu": F.silu, "swish": F.silu}[name]


# ---------------------------------------------------------------------------------------------------------------
# Embeddings and encoder
# ---------------------------------------------------------------------------------------------------------------


def _fast_keep_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """The keep-mask of `_FastDropoutFunction` for a tensor like x (bool, x's shape) and the scale of kept values."""
    n = x.numel()
    draws = torch.empty((n + 1) // 2, dtype=torch.int32, device=x.device).random_()  # 31 random bits each
    threshold = round(p * 32768)
    # Each draw read as two 16-bit halves (a view, no copy); 15 bits of each: bits 0-14 and 16-30.
    halves = draws.view(torch.int16)[:n] & 0x7FFF
    return (halves >= threshold).view(x.shape), 32768 / (32768 - threshold)


class _FastDropoutFunction(torch.autograd.Function):
    """Dropout whose keep-mask comes from 15-bit random numbers: two per 32-bit draw of the CPU generator.

    On CPU, drawing the random numbers is most of dropout's cost (`bernoulli_` draws one 32-bit number per element
    through MT19937); this draws half as many and keeps the mask as bool for the backward. The drop probability is
    rounded to a multiple of 1/32768 (0.1 -> 0.100006) and the kept values are scaled by exactly 1/(1 - that), so
    the expectation is unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, ctx.scale = _fast_keep_mask(x, p)
        ctx.save_for_backward(keep)
        return torch.mul(x, keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.scale), None


def fast_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout` with the mask drawn as in `_FastDropoutFunction` on CPU (the `fast_dropout` switch); elsewhere,
    and for p = 0 or 1, plain `F.dropout` (CUDA's generator is fast, and fused attention kernels drop in-kernel)."""
    if not training or x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    return _FastDropoutFunction.apply(x, p)


class BertReproDropout(nn.Dropout):
    """`nn.Dropout`, or `fast_dropout` when the config's `fast_dropout` switch is on."""

    def __init__(self, p: float, fast: bool = False):
        super().__init__(p)
        self.fast = fast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_dropout(x, self.p, self.training) if self.fast else super().forward(x)


class TiedGradient:
    """One gradient buffer for the token embeddings when the MLM decoder shares them (created per forward).

    Autograd would give the shared weight two dense (vocab, H) gradients, the decoder's and the lookup's (a zero
    matrix with the looked-up rows added), and sum them into a third. Here the decoder's gradient is kept and the
    lookup adds its rows into it in place: the same sum, without two vocab-sized buffers and two passes over them
    (about 10% of a BERT-BASE pre-training step on CPU). Correct in any order: if the lookup's backward runs
    before the decoder's, or in a second backward over the same graph, each returns its own gradient and autograd
    sums them as usual."""

    def __init__(self):
        self.pending: torch.Tensor | None = None  # the decoder's gradient, waiting for the lookup's rows
        self.lookup_done = False

    @staticmethod
    def for_forward(model, input_ids, inputs_embeds) -> "TiedGradient | None":
        """A buffer when this forward looks tokens up in the weight its decoder uses and gradients are recorded."""
        weight = model.bert.embeddings.word_embeddings.weight
        if input_ids is None or inputs_embeds is not None or not torch.is_grad_enabled() or not weight.requires_grad:
            return None
        return TiedGradient() if model.cls.predictions.decoder.weight is weight else None

    def take(self, shape, like: torch.Tensor) -> torch.Tensor | None:
        """For the lookup's backward: the decoder's gradient to add its rows into, if it came first."""
        pending, self.pending = self.pending, None
        self.lookup_done = True
        return pending


class _DecoderWeight(torch.autograd.Function):
    """Identity on the decoder's weight; its backward hands the gradient to the lookup (see TiedGradient)."""

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


class GradientBuffer:
    """Keeps the token embeddings' dense (vocab, H) gradient tensor from one training step to the next.

    The lookup's backward builds a (vocab, H) gradient: zeros with the looked-up rows added. Optimizers drop
    `.grad` after each step (`zero_grad(set_to_none=True)`), so every step asks the allocator for a new
    vocab-sized block, and on CPU glibc serves blocks that large (over 32 MiB) with fresh pages from the kernel,
    whose first touch is slow (reusing the tensor: 0.976x the time of a MiniLM MRPC step in an interleaved A/B).
    Here the lookup's backward takes back the previous step's gradient tensor once nothing else holds it, clears
    it in place (pages already mapped), adds its rows and hands it to autograd, which keeps it as `.grad` without
    a copy. A gradient still referenced anywhere (`.grad` itself during gradient accumulation, a tensor or view
    kept by the user, a bucket view of DDP) is never reused: the lookup then allocates as usual. Values are the
    same either way.
    """

    def __init__(self):
        self._buffer: torch.Tensor | None = None
        self._weight: weakref.ref | None = None
        self._hook = None

    def watch(self, weight: nn.Parameter) -> None:
        """Remember the gradients that `weight` accumulates (re-hooked when the weight is replaced)."""
        if self._weight is None or self._weight() is not weight:
            if self._hook is not None:
                self._hook.remove()
            self._buffer = None
            self._hook = weight.register_post_accumulate_grad_hook(self._keep)
            self._weight = weakref.ref(weight)

    def _keep(self, weight: torch.Tensor) -> None:
        grad = weight.grad
        if grad is not None and grad.layout == torch.strided and grad._base is None and grad.is_contiguous():
            self._buffer = grad

    def take(self, shape, like: torch.Tensor) -> torch.Tensor | None:
        """The kept tensor, zeroed, if it fits and nothing else references it; else None."""
        buffer, self._buffer = self._buffer, None
        weight = self._weight() if self._weight is not None else None
        if buffer is None or weight is None or buffer.shape != shape or buffer.dtype != like.dtype \
                or buffer.device != like.device or weight.grad is buffer:
            return None
        try:  # Python references (this local and getrefcount's argument), C++ references, storage references
            sole = (sys.getrefcount(buffer) == 2 and buffer._use_count() == 1
                    and torch._C._storage_Use_Count(buffer.untyped_storage()._cdata) == 2)
        except (AttributeError, RuntimeError):  # no way to count references in this torch: never reuse
            sole = False
        return buffer.zero_() if sole else None

    def __deepcopy__(self, memo):  # a copied model starts without a kept tensor or a hook
        return GradientBuffer()

    def __getstate__(self):
        return {"_buffer": None, "_weight": None, "_hook": None}


class _LookupInto(torch.autograd.Function):
    """`F.embedding` whose backward adds its rows into a dense tensor that `into.take` hands over (the tied
    decoder's pending gradient, see TiedGradient; the previous step's gradient tensor, see GradientBuffer) instead
    of a new zero matrix; a new one when `take` has none, and in a differentiable backward (create_graph)."""

    @staticmethod
    def forward(ctx, input_ids: torch.Tensor, weight: torch.Tensor, into: TiedGradient | GradientBuffer):
        ctx.save_for_backward(input_ids)
        ctx.into, ctx.weight_shape = into, weight.shape
        return F.embedding(input_ids, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (input_ids,) = ctx.saved_tensors
        rows, index = grad.reshape(-1, grad.shape[-1]), input_ids.reshape(-1)
        target = None if torch.is_grad_enabled() else ctx.into.take(ctx.weight_shape, grad)
        if target is None:
            return None, grad.new_zeros(ctx.weight_shape).index_add(0, index, rows), None
        return None, target.index_add_(0, index, rows), None


def _plain_embedding(embedding: nn.Module) -> bool:
    """An nn.Embedding without options that change its lookup or its gradient."""
    return (type(embedding) is nn.Embedding and embedding.padding_idx is None and embedding.max_norm is None
            and not embedding.scale_grad_by_freq and not embedding.sparse)


class BertReproEmbeddings(nn.Module):
    """Token + learned absolute position + segment (A = 0, B = 1) embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = BertReproDropout(config.hidden_dropout_prob, config.fast_dropout)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings)[None], persistent=False)
        self.gradient_buffer = GradientBuffer()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        tied_gradient: TiedGradient | None = None,
    ) -> torch.Tensor:
        """(batch, seq) ids -> (batch, seq, hidden) embeddings."""
        if inputs_embeds is None:
            weight, into = self.word_embeddings.weight, tied_gradient
            if (into is None and torch.is_grad_enabled() and weight.requires_grad
                    and _plain_embedding(self.word_embeddings)):
                self.gradient_buffer.watch(weight)
                into = self.gradient_buffer
            if into is None:
                inputs_embeds = self.word_embeddings(input_ids)
            else:
                inputs_embeds = _LookupInto.apply(input_ids, weight, into)
        seq_length = inputs_embeds.shape[1]
        if seq_length > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"Input of {seq_length} tokens is longer than the model's {self.position_embeddings.num_embeddings} "
                "positions (max_position_embeddings); truncate it."
            )
        if position_ids is None:
            position_ids = self.position_ids[:, :seq_length]
        if token_type_ids is None:
            segment_embeddings = self.token_type_embeddings.weight[0]
        else:
            segment_embeddings = self.token_type_embeddings(token_type_ids)
        embeddings = inputs_embeds + segment_embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T * scaling + mask) V, written out.

    query/key/value: (batch, heads, seq, head_size); attention_mask: additive (batch, 1, seq, seq) or None.
    Returns the context as (batch, seq, heads, head_size) and the probabilities (batch, heads, seq, seq).
    """
    # Scaling and masking in place: the product's backward needs its inputs only, so no new (.., seq, seq) buffer.
    scores = torch.matmul(query, key.transpose(-1, -2))
    scores.mul_(scaling)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores.add_(attention_mask)
    probs = F.softmax(scores, dim=-1)
    if getattr(module.config, "fast_dropout", False):
        probs = fast_dropout(probs, dropout, module.training)
    else:
        probs = F.dropout(probs, p=dropout, training=module.training)
    context = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return context, probs


def _attention_function(config, dropout: float, device: torch.device):
    """The attention kernel of `config._attn_implementation`, except `eager_attention` in place of SDPA when
    training with `fast_dropout` on CPU: SDPA's CPU path has no dropout kernel either, so the same mathematics,
    with the faster mask."""
    if dropout and config.fast_dropout and device.type == "cpu" and config._attn_implementation == "sdpa":
        return eager_attention
    return ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention)


def _grouped_attention(config) -> bool:
    """Whether the unpadded encoder pads sequences in length groups for attention (eager and SDPA, the kernels
    without a variable-length form); other non-flash kernels get the whole batch padded back, with the model's mask."""
    return config._attn_implementation in ("eager", "sdpa")


class Unpadded:
    """Where the real tokens of a padded (batch, seq) batch are (the `unpad_inputs` switch).

    `unpad` takes (batch, seq, ...) to (tokens, ...) in row-major order, so each sequence's tokens stay together and
    in order; `pad` puts them back, with zeros at the padding. `cu_seqlens` and `max_seqlen` describe the same
    rows for variable-length attention kernels; `mask` is the padded attention mask for the other kernels.
    `attention_groups` splits the rows, longest first, into groups of similar length for kernels without a
    variable-length form. Every step is differentiable (index_select / index_copy).
    """

    def __init__(self, keep: torch.Tensor):
        """keep: (batch, seq) bool, True at real tokens."""
        self.batch, self.seq = keep.shape
        self.keep = keep
        self.indices = keep.flatten().nonzero().flatten()
        lengths = keep.sum(dim=1, dtype=torch.int32)
        self.cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        self.max_seqlen = int(lengths.max())
        self.lengths = lengths.tolist()
        # each non-empty sequence's first token, as a row of the (tokens, ...) matrix
        self.first_tokens = self.cu_seqlens[:-1][lengths > 0].long()
        self.mask: torch.Tensor | None = None
        self._groups: AttentionGroups | None = None

    def attention_groups(self, rows_per_group: int = 8) -> AttentionGroups:
        """The rows split, longest first, into groups of similar length, each padded to its longest for attention
        (kernels without a variable-length form); computed once per forward and shared by the layers."""
        if self._groups is None:
            self._groups = AttentionGroups(self, rows_per_group)
        return self._groups

    @classmethod
    def from_attention_mask(cls, attention_mask: torch.Tensor | None, without_padding: bool = False
                            ) -> "Unpadded | None":
        """None when there is nothing to remove (no mask, or no padding in the batch, unless `without_padding`)
        or nothing to keep."""
        if attention_mask is None or attention_mask.dim() != 2:
            return None
        keep = attention_mask.bool()
        if (bool(keep.all()) and not without_padding) or not bool(keep.any()):
            return None
        return cls(keep)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.batch * self.seq, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        full = x.new_zeros(self.batch * self.seq, *x.shape[1:]).index_copy(0, self.indices, x)
        return full.view(self.batch, self.seq, *x.shape[1:])


class AttentionGroups:
    """Sequences of similar length padded together, for attention kernels that need a rectangle.

    The rows are sorted longest first and cut into groups of `rows_per_group`; group g is a (rows, seq) grid,
    seq being its longest row. All grids lie one after another in one (cells, ...) matrix: `gather` says, for each
    cell, which row of the (tokens, ...) matrix fills it, and `scatter` says, for each token, which cell holds it
    (so `grid.index_select(0, scatter)` gives the tokens back in order). A padding cell repeats a real token of
    its own row, so no zero-filled buffer is built: `key_mask` hides it as a key (its probability is exactly 0, and
    so is its gradient), and its output as a query is never read. `groups` lists (rows, seq, key_mask), key_mask
    being the (rows, 1, 1, seq) boolean mask of real keys, or None when the grid is full; `sizes` the cells of
    each grid (rows * seq), in order.
    Attention then covers sum(rows * seq^2) query-key pairs instead of batch * max_seqlen^2."""

    def __init__(self, unpadded: Unpadded, rows_per_group: int = 8):
        lengths, starts = unpadded.lengths, unpadded.cu_seqlens.tolist()
        order = sorted((r for r in range(unpadded.batch) if lengths[r]), key=lambda r: -lengths[r])
        gather, scatter, self.groups = [], torch.empty(starts[-1], dtype=torch.long), []
        # `starts`: for a grid whose cells are consecutive tokens (rows of one length, next to each other in the
        # batch, as in every grid of a batch without padding), its first token, else None: `_GroupedAttention`
        # then reads and writes the grid's rows as one slice.
        self.starts = []
        cells = 0
        for first in range(0, len(order), rows_per_group):
            members = order[first:first + rows_per_group]
            seq = lengths[members[0]]
            consecutive = members == list(range(members[0], members[0] + len(members)))
            self.starts.append(starts[members[0]] if consecutive and lengths[members[-1]] == seq else None)
            key_mask = None
            if any(lengths[r] < seq for r in members):
                real = torch.tensor([lengths[r] for r in members])
                key_mask = (torch.arange(seq)[None, :] < real[:, None])[:, None, None, :]
                key_mask = key_mask.to(unpadded.indices.device)
            self.groups.append((len(members), seq, key_mask))
            for r in members:
                n = lengths[r]
                tokens = torch.arange(starts[r], starts[r] + n)
                gather.append(torch.cat([tokens, tokens.new_full((seq - n,), starts[r])]))
                scatter[starts[r]:starts[r] + n] = torch.arange(cells, cells + n)
                cells += seq
        self.gather = torch.cat(gather).to(unpadded.indices.device)
        self.sizes = [rows * seq for rows, seq, _ in self.groups]  # cells per grid
        self.scatter = scatter.to(unpadded.indices.device)
        # `dest`: for each cell, the token it holds; padding cells name row `tokens`, one past the last token
        # (`_GroupedAttention` writes into a buffer with that extra row and drops it).
        dest = torch.full((cells,), starts[-1], dtype=torch.long)
        dest[scatter] = torch.arange(starts[-1])
        self.dest = dest.to(unpadded.indices.device)
        # `first`: for each grid row, its sequence's rank among the non-empty sequences (where its first token's
        # row lies in `Unpadded.first_tokens`); `row_sizes`: rows per grid.
        rank = {r: i for i, r in enumerate(sorted(order))}
        self.first = torch.tensor([rank[r] for r in order], dtype=torch.long, device=unpadded.indices.device)
        self.row_sizes = [rows for rows, _, _ in self.groups]

    def per_grid(self):
        """For each grid: (rows, seq, key_mask), and its parts of `gather`, `dest` and `first`, and its start."""
        return zip(self.groups, self.gather.split(self.sizes), self.dest.split(self.sizes),
                   self.first.split(self.row_sizes), self.starts)


class _GroupedAttention(torch.autograd.Function):
    """Eager attention over the length groups of `AttentionGroups`, forward and backward written out.

    Input: the fused (tokens, 3 * hidden) query/key/value projections of the real tokens; output: the (tokens,
    hidden) context. The same mathematics as gathering the cells, running `eager_attention` on each grid and
    gathering the tokens back, with fewer passes over memory: each grid's Q, K, V are gathered straight into the
    (heads * rows, seq, head_size) layout of the batched products (batch order head-major, which needs no
    transpose of a 5-d view), the context rows are copied to their tokens with one `index_copy_`, and the
    backward writes the query, key and value gradients into one (tokens, 3 * hidden) buffer with one
    `index_copy_` per grid, where autograd would stack, concatenate, zero-fill and `index_add` (0.97x the time of
    a MiniLM MRPC training step). Dropout on the probabilities draws its mask like `fast_dropout` (the `fast`
    flag) or like `F.dropout`; the scale of the kept values is folded into the products with V. The backward is
    not itself differentiable (no double backward).

    With `queries` ((sequences, hidden): the query projections at each non-empty sequence's first token, in
    sequence order) the input is the (tokens, 2 * hidden) key/value projections and the output is the context at
    those first tokens only: the last layer under `last_layer_subset` when the head reads [CLS] only."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, groups: "AttentionGroups", heads: int, scaling: float, dropout: float,
                fast: bool, queries: torch.Tensor | None = None) -> torch.Tensor:
        tokens, width = qkv.shape
        first_only = queries is not None
        parts = 2 if first_only else 3
        head_size = width // (parts * heads)
        hidden = heads * head_size
        # Everything runs in qkv's dtype (under autocast, the projection's): autocast would not change it.
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
                scores = torch.baddbmm(_empty_like(qkv, batch, n, seq), query, key.transpose(1, 2), beta=0,
                                       alpha=scaling)
                if key_mask is not None:  # (rows, 1, 1, seq) -> (1, rows, 1, seq) for the head-major batch
                    scores.view(heads, rows, n, seq).masked_fill_(~key_mask.view(1, rows, 1, seq),
                                                                 torch.finfo(scores.dtype).min)
                probs = torch.softmax(scores, dim=-1)
                del scores
                mask, scale = None, 1.0
                if dropout:
                    if fast:
                        mask, scale = _fast_keep_mask(probs, dropout)
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
        for (rows, seq, scale, has_mask), dest, first, start in zip(ctx.layout, all_dest.split(ctx.sizes),
                                                                    all_first.split(ctx.row_sizes), ctx.starts):
            cells, probs, kept = saved[i:i + 3]
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
            grad_probs = torch.baddbmm(_empty_like(grad, batch, n, seq), grad_context, value.transpose(1, 2),
                                       beta=0, alpha=scale)
            if mask is not None:
                grad_probs.mul_(mask)
            grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
            del grad_probs
            torch.baddbmm(grads[-2], grad_scores.transpose(1, 2), query, beta=0, alpha=scaling, out=grads[-2])
            if first_only:
                grad_query = torch.baddbmm(_empty_like(grad, batch, n, head_size), grad_scores, key, beta=0,
                                           alpha=scaling)
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
    """(rows * n, parts * heads * head_size) cells, n per grid row, -> (parts, heads * rows, n, head_size): the
    layout of the batched products, batch index head * rows + row (a copy)."""
    return x.view(rows * n, parts * heads, -1).transpose(0, 1).reshape(parts, heads * rows, n, -1)


def _tokens_first(x: torch.Tensor, heads: int, cells: int) -> torch.Tensor:
    """The inverse of `_heads_first` for one part: (heads * rows, n, head_size) -> (rows * n, heads * head_size);
    with parts stacked in x, pass heads = parts * heads (a copy)."""
    return x.view(heads, cells, -1).transpose(0, 1).reshape(cells, -1)


def _tokens_first_into(target: torch.Tensor, x: torch.Tensor, heads: int) -> None:
    """`_tokens_first(x, heads, len(target))` copied into target (a (cells, heads * head_size) slice): one pass."""
    cells = target.shape[0]
    target.view(cells, heads, -1).transpose(0, 1).copy_(x.view(heads, cells, -1))


def _empty_like(x: torch.Tensor, *shape: int) -> torch.Tensor:
    """A (shape) tensor of x's dtype and device, without memory: the ignored `input` of baddbmm with beta=0."""
    return x.new_empty(()).expand(*shape)


class BertReproSelfAttention(nn.Module):
    """Multi-head self-attention; the kernel is picked by `config._attn_implementation`."""

    is_causal = False  # read by the sdpa / flash-attention interfaces: BERT attends in both directions

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_size**-0.5
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        unpadded: Unpadded | None = None,
        keep: torch.Tensor | None = None,
        **kwargs,
    ):
        """keep: the rows of the flattened (.., hidden) context to return (see `BertReproEncoder`), all when None;
        attention still reads every token as key and value."""
        dropout = self.dropout_prob if self.training else 0.0
        attention_fn = _attention_function(self.config, dropout, hidden_states.device)
        if unpadded is not None:
            return self._unpadded_attention(attention_fn, hidden_states, unpadded, dropout, keep, **kwargs)
        batch, seq, _ = hidden_states.shape
        shape = (batch, seq, self.num_heads, self.head_size)
        query = self.query(hidden_states).view(shape).transpose(1, 2)
        key = self.key(hidden_states).view(shape).transpose(1, 2)
        value = self.value(hidden_states).view(shape).transpose(1, 2)
        context, probs = attention_fn(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=dropout,
            **kwargs,
        )
        if keep is not None:
            return context.reshape(batch * seq, -1).index_select(0, keep), probs
        return context.reshape(batch, seq, -1), probs

    def _fused_qkv(self, hidden_states: torch.Tensor, parts: tuple[str, ...] = ("query", "key", "value")):
        """(tokens, 3 * hidden): the query, key and value projections as one matrix product (or those in `parts`)."""
        weight = torch.cat([getattr(self, part).weight for part in parts])
        bias = torch.cat([getattr(self, part).bias for part in parts])
        return F.linear(hidden_states, weight, bias)

    def _unpadded_attention(self, attention_fn, hidden_states, unpadded: Unpadded, dropout: float,
                            keep: torch.Tensor | None, **kwargs):
        """hidden_states: (tokens, hidden), the real tokens of the batch only; returns the context at rows `keep`."""
        shape = (hidden_states.shape[0], self.num_heads, self.head_size)

        def kept(context: torch.Tensor) -> torch.Tensor:
            return context if keep is None else context.index_select(0, keep)

        if _grouped_attention(self.config):
            # Kernels without a variable-length form: sequences of similar length are padded together for
            # attention only; every projection and feed-forward runs unpadded. One Q/K/V product, one gather
            # into the grids, one gather back: no zero-filled buffers (see AttentionGroups).
            groups = unpadded.attention_groups()
            if attention_fn is eager_attention:  # written out: see _GroupedAttention
                fast = self.config.fast_dropout and hidden_states.device.type == "cpu"
                parts, queries = ("query", "key", "value"), None
                if keep is not None and keep.shape == unpadded.first_tokens.shape and torch.equal(
                        keep, unpadded.first_tokens):
                    # Only each sequence's first token ([CLS]) is read after this layer: queries there only.
                    parts, queries, keep = ("key", "value"), self.query(hidden_states.index_select(0, keep)), None
                context = _GroupedAttention.apply(self._fused_qkv(hidden_states, parts), groups, self.num_heads,
                                                  self.scaling, dropout, fast, queries)
                return kept(context), None
            cells = self._fused_qkv(hidden_states).index_select(0, groups.gather)
            outputs = []
            # split, not slicing: its backward is one cat, where each slice's would be a full-size zero buffer
            for grid, (rows, seq, key_mask) in zip(cells.split(groups.sizes), groups.groups):
                grid = grid.view(rows, seq, 3, *shape[1:])
                query, key, value = (x.transpose(1, 2) for x in grid.unbind(2))
                context, _ = attention_fn(
                    self, query, key, value, key_mask, scaling=self.scaling, dropout=dropout, **kwargs
                )
                outputs.append(context.reshape(rows * seq, -1))
            return kept(torch.cat(outputs).index_select(0, groups.scatter)), None
        query = self.query(hidden_states).view(shape)
        key = self.key(hidden_states).view(shape)
        value = self.value(hidden_states).view(shape)
        if is_flash_attention_requested(self.config):
            # Variable-length kernel: the sequences lie one after the other in a batch of one, told apart by
            # cu_seqlens; no padding is ever materialised.
            context, probs = attention_fn(
                self,
                *(x.unsqueeze(0).transpose(1, 2) for x in (query, key, value)),
                None,
                scaling=self.scaling,
                dropout=dropout,
                cu_seq_lens_q=unpadded.cu_seqlens,
                cu_seq_lens_k=unpadded.cu_seqlens,
                max_length_q=unpadded.max_seqlen,
                max_length_k=unpadded.max_seqlen,
                **kwargs,
            )
            return kept(context.reshape(shape[0], -1)), probs
        # Any other kernel: the whole batch padded back for attention, with the model's own mask.
        query, key, value = (unpadded.pad(x).transpose(1, 2) for x in (query, key, value))
        context, probs = attention_fn(
            self, query, key, value, unpadded.mask, scaling=self.scaling, dropout=dropout, **kwargs
        )
        return kept(unpadded.unpad(context.reshape(unpadded.batch, unpadded.seq, -1))), probs


class BertReproSelfOutput(nn.Module):
    """Projection of the attention context, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = BertReproDropout(config.hidden_dropout_prob, config.fast_dropout)

    def forward(self, context: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(context)))


class BertReproAttention(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.self = BertReproSelfAttention(config)
        self.output = BertReproSelfOutput(config)

    def forward(self, hidden_states, attention_mask, keep: torch.Tensor | None = None, **kwargs):
        """keep: rows of the flattened (.., hidden) states that the rest of the block computes (see
        `BertReproEncoder`); attention itself still reads every token as key and value."""
        context, probs = self.self(hidden_states, attention_mask, keep=keep, **kwargs)
        if keep is not None:
            hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, keep)
        return self.output(context, hidden_states), probs


class BertReproIntermediate(nn.Module):
    """W1 and the activation of the position-wise feed-forward network."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(hidden_states))


class BertReproOutput(nn.Module):
    """W2 of the feed-forward network, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = BertReproDropout(config.hidden_dropout_prob, config.fast_dropout)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(hidden_states)))


class BertReproLayer(GradientCheckpointingLayer):
    """One Transformer encoder block: x = LN(x + Drop(SelfAttn(x))); x = LN(x + Drop(W2 gelu(W1 x)))."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.attention = BertReproAttention(config)
        self.intermediate = BertReproIntermediate(config)
        self.output = BertReproOutput(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                keep: torch.Tensor | None = None, **kwargs):
        attention_output, probs = self.attention(hidden_states, attention_mask, keep=keep, **kwargs)
        layer_output = self.output(self.intermediate(attention_output), attention_output)
        return layer_output, probs


class BertReproEncoder(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.layer = nn.ModuleList([BertReproLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask, output_hidden_states=False, output_attentions=False,
                last_layer_keep: torch.Tensor | None = None, **kwargs):
        """last_layer_keep: indices into the flattened (.., hidden) states of the rows that anything reads after
        the encoder. The last block then projects the attention context and runs its feed-forward network only
        at those rows (its attention still covers every token), and returns them as a (rows, hidden) matrix."""
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            keep = last_layer_keep if i == last else None
            hidden_states, probs = layer(hidden_states, attention_mask, keep=keep, **kwargs)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (probs,)
        return hidden_states, all_hidden_states, all_attentions


class BertReproPooler(nn.Module):
    """tanh(W h_[CLS]): the sentence-level representation used by NSP and the classification heads."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))


# ---------------------------------------------------------------------------------------------------------------
# Pre-training heads
# ---------------------------------------------------------------------------------------------------------------


class BertReproMLMTransform(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden_states)))


class BertReproMLMHead(nn.Module):
    """Masked-LM head: transform, then a decoder tied to the token embeddings plus an output-only bias."""

    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.transform = BertReproMLMTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor, tied_gradient: TiedGradient | None = None) -> torch.Tensor:
        if tied_gradient is None:
            return self.decoder(self.transform(hidden_states)) + self.bias
        weight = _DecoderWeight.apply(self.decoder.weight, tied_gradient)
        return F.linear(self.transform(hidden_states), weight, self.decoder.bias) + self.bias


class BertReproPreTrainingHeads(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.predictions = BertReproMLMHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertReproOnlyMLMHead(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.predictions = BertReproMLMHead(config)


class BertReproOnlyNSPHead(nn.Module):
    def __init__(self, config: BertReproConfig):
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


# ---------------------------------------------------------------------------------------------------------------
# Base class: initialisation, flags, loading checks, saving with remote code
# ---------------------------------------------------------------------------------------------------------------

# Every Auto class a saved directory can be opened with (transformers writes only the saved class by default).
AUTO_MAP = {
    "AutoConfig": "configuration_bert_repro.BertReproConfig",
    "AutoModel": "modeling_bert_repro.BertReproModel",
    "AutoModelForPreTraining": "modeling_bert_repro.BertReproForPreTraining",
    "AutoModelForMaskedLM": "modeling_bert_repro.BertReproForMaskedLM",
    "AutoModelForNextSentencePrediction": "modeling_bert_repro.BertReproForNextSentencePrediction",
    "AutoModelForSequenceClassification": "modeling_bert_repro.BertReproForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_bert_repro.BertReproForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_bert_repro.BertReproForMultipleChoice",
    "AutoModelForTokenClassification": "modeling_bert_repro.BertReproForTokenClassification",
}


def _safetensors_files(path) -> str:
    """The safetensors file(s) a local checkpoint directory holds, for error messages."""
    if os.path.isdir(path):
        names = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        return ", ".join(os.path.join(path, f) for f in names) or str(path)
    return str(path)


class BertReproPreTrainedModel(PreTrainedModel):
    config_class = BertReproConfig
    config: BertReproConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["BertReproEmbeddings", "BertReproLayer"]
    # Trainer must divide by the accumulation steps: every loss here is a mean over its own batch (module docstring).
    accepts_loss_kwargs = False
    # Some older checkpoints store the MLM output bias a second time under the decoder; ours lives in
    # `cls.predictions.bias` only.
    _keys_to_ignore_on_load_unexpected = [r"cls\.predictions\.decoder\.bias"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if self.config.initializer_distribution == "truncated_normal":
                init.trunc_normal_(module.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, BertReproMLMHead):
            init.zeros_(module.bias)
        elif isinstance(module, BertReproEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1])[None])

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, allow_missing_encoder_weights=False, **kwargs):
        """`PreTrainedModel.from_pretrained`, but a checkpoint that lacks encoder weights is an error.

        A task head that the checkpoint does not have (a classifier on a pre-trained encoder, the MLM head on a
        sentence-embedding model) is initialised and listed in a warning, as transformers does. A missing
        embedding, encoder or pooler weight means the checkpoint is not the model you think it is, so it raises
        unless `allow_missing_encoder_weights=True`.
        """
        return_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        except SafetensorError as err:
            raise OSError(
                f"Could not read the weights of {pretrained_model_name_or_path}: {_safetensors_files(pretrained_model_name_or_path)} "
                f"is not a valid safetensors file ({err}). It is damaged or incomplete: download or save it again."
            ) from err
        except RuntimeError as err:
            if "ignore_mismatched_sizes" not in str(err):
                raise
            raise ValueError(
                f"Weights in {pretrained_model_name_or_path} have other shapes than its config describes (the table "
                "above lists each one with both shapes). Check vocab_size, hidden_size, num_attention_heads and "
                "intermediate_size in config.json, or pass ignore_mismatched_sizes=True to re-initialise those "
                "weights (e.g. a classification head with a new number of labels)."
            ) from err
        prefix = f"{cls.base_model_prefix}."
        head_free = isinstance(model, BertReproModel)
        missing_encoder = sorted(
            k for k in info["missing_keys"] if head_free or k.startswith(prefix)
        )
        if missing_encoder and not allow_missing_encoder_weights:
            shown = ", ".join(missing_encoder[:8]) + (" ..." if len(missing_encoder) > 8 else "")
            raise ValueError(
                f"{pretrained_model_name_or_path} lacks {len(missing_encoder)} weights of the BERT encoder that "
                f"{cls.__name__} needs: {shown}. They would be randomly initialised. Check that this is a BERT "
                "checkpoint of the same architecture, or pass allow_missing_encoder_weights=True."
            )
        missing_heads = sorted(set(info["missing_keys"]) - set(missing_encoder))
        if missing_heads:
            logger.warning(
                f"{cls.__name__}: newly initialised (not in {pretrained_model_name_or_path}): {', '.join(missing_heads)}"
            )
        return (model, info) if return_info else model

    def compile_layers(self, **compile_kwargs) -> "BertReproPreTrainedModel":
        """`torch.compile` every Transformer block in place (regional compilation) and return the model.

        The L blocks share one compiled graph (their weights are graph inputs), so compiling takes seconds rather
        than the minutes a whole-model `torch.compile` needs, and the data-dependent parts outside the blocks
        (unpadding, the sparse MLM selection) stay eager. The outputs equal the eager model's to float rounding
        (dropout draws its random numbers differently when compiled). kwargs go to `torch.compile`.
        """
        for module in self.modules():
            if isinstance(module, BertReproLayer):
                module.compile(**compile_kwargs)
        return self

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save weights (safetensors), config and this model's code with an `auto_map` for every Auto class."""
        self.config.auto_map = dict(AUTO_MAP)
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _last_layer_positions(self, shape, attention_mask, kwargs, reads: torch.Tensor | None = None):
        """The (batch, seq) positions a head reads from the last layer, for the `last_layer_subset` switch:
        [CLS] when the model has a pooler, and `reads`. None (the whole last layer runs) when the switch is off,
        when hidden states or attentions are asked for, or when a position read is padding."""
        config = self.config
        wanted = [kwargs.get(flag) if kwargs.get(flag) is not None else getattr(config, flag)
                  for flag in ("output_hidden_states", "output_attentions")]
        if not config.last_layer_subset or any(wanted):
            return None
        device = self.bert.embeddings.position_ids.device
        positions = torch.zeros(shape, dtype=torch.bool, device=device) if reads is None else reads.clone()
        if self.bert.pooler is not None:
            positions[:, 0] = True
        if attention_mask is not None and attention_mask.dim() == 2 and bool((positions & ~attention_mask.bool()).any()):
            return None
        return positions

    def _run_bert(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs,
                  cls_only: bool = False):
        """Call the encoder of a head model, forwarding the output flags. cls_only: the head reads the pooled
        output only (then `last_layer_subset` computes the last layer at [CLS] only)."""
        if cls_only:
            shape = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
            kwargs = {**kwargs, "last_layer_positions": self._last_layer_positions(shape, attention_mask, kwargs)}
        return self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )


# ---------------------------------------------------------------------------------------------------------------
# The encoder and the task models
# ---------------------------------------------------------------------------------------------------------------


def _as_tuple_if_asked(output: ModelOutput, return_dict: bool | None, config) -> ModelOutput | tuple:
    if return_dict is None:
        return_dict = config.return_dict
    return output if return_dict else output.to_tuple()


class BertReproModel(BertReproPreTrainedModel):
    """The bare BERT encoder: embeddings, L Transformer blocks, and (optionally) the pooler."""

    def __init__(self, config: BertReproConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertReproEmbeddings(config)
        self.encoder = BertReproEncoder(config)
        self.pooler = BertReproPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        tied_gradient: TiedGradient | None = None,
        last_layer_positions: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling | tuple:
        """
        Args:
            input_ids: (batch, seq) token ids: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, padded with [PAD].
            attention_mask: (batch, seq), 1 for real tokens and 0 for padding.
            token_type_ids: (batch, seq) segment ids, 0 for `[CLS] A [SEP]` and 1 for `B [SEP]`.
            output_hidden_states: return the embedding output and every layer's output (L + 1 tensors).
            output_attentions: return every layer's attention probabilities (needs attn_implementation="eager").
            tied_gradient: set by the models with an MLM head, whose decoder shares the token embeddings.
            last_layer_positions: (batch, seq) bool, the positions whose last hidden state the caller reads (the
                task models' `last_layer_subset` switch). The last block then projects its attention context
                and runs its feed-forward network only there, and `last_hidden_state` is a (positions, hidden)
                matrix in the order of `last_layer_positions.nonzero()` (padding positions left out when
                `unpad_inputs` is on). With a pooler, position 0 must be among them. Not with
                `output_hidden_states` or `output_attentions`.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_attentions and self.config._attn_implementation != "eager":
            raise ValueError(
                f"output_attentions needs the eager attention kernel, but the model uses "
                f"{self.config._attn_implementation!r}: load it with attn_implementation='eager'."
            )

        embedding_output = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, tied_gradient)
        unpadded = None
        if self.config.unpad_inputs and not output_attentions:
            # Batches without padding take the unpadded path too where it runs `_GroupedAttention` (one fused
            # Q/K/V product, attention written out): 0.96x the time of a BERT-BASE pre-training step.
            dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
            without_padding = (_grouped_attention(self.config) and
                               _attention_function(self.config, dropout, embedding_output.device) is eager_attention)
            unpadded = Unpadded.from_attention_mask(attention_mask, without_padding)
        if unpadded is not None and (is_flash_attention_requested(self.config) or _grouped_attention(self.config)):
            mask = None  # the variable-length kernel reads cu_seqlens, the length groups build their own key masks
        else:
            mask = create_bidirectional_mask(
                config=self.config, inputs_embeds=embedding_output, attention_mask=attention_mask
            )
        keep = kept = None
        if last_layer_positions is not None:
            if output_hidden_states or output_attentions:
                raise ValueError("last_layer_positions cannot be combined with output_hidden_states or "
                                 "output_attentions: the last layer is then computed at those positions only.")
            kept = last_layer_positions.bool()
            if self.pooler is not None and not bool(kept[:, 0].all()):
                raise ValueError("last_layer_positions must include position 0 ([CLS]), which the pooler reads.")
            if unpadded is not None:
                kept = kept & unpadded.keep
                keep = kept.flatten()[unpadded.indices].nonzero().flatten()
            else:
                keep = kept.flatten().nonzero().flatten()
        if unpadded is None:
            sequence_output, hidden_states, attentions = self.encoder(
                embedding_output, mask, output_hidden_states, output_attentions, last_layer_keep=keep, **kwargs
            )
        else:
            unpadded.mask = mask
            sequence_output, hidden_states, attentions = self.encoder(
                unpadded.unpad(embedding_output), None, output_hidden_states, output_attentions,
                last_layer_keep=keep, unpadded=unpadded, **kwargs
            )
            if keep is None:
                sequence_output = unpadded.pad(sequence_output)
            if hidden_states is not None:
                hidden_states = tuple(unpadded.pad(h) for h in hidden_states)
        pooled_output = None
        if self.pooler is not None and keep is None:
            pooled_output = self.pooler(sequence_output)
        elif self.pooler is not None:
            # The [CLS] rows of the (positions, hidden) output: each sequence's first kept row. A sequence with
            # no real token has none (unpad_inputs) and reads zeros, as the unpadded model's padding does.
            counts = kept.sum(dim=1)
            first = counts.cumsum(0) - counts
            cls = sequence_output.index_select(0, first.clamp(max=max(sequence_output.shape[0] - 1, 0)))
            cls = cls * kept[:, :1].to(cls.dtype)
            pooled_output = self.pooler(cls[:, None])
        output = BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=pooled_output,
            hidden_states=hidden_states,
            attentions=attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


def concat_last_layers(hidden_states: tuple[torch.Tensor, ...], n: int = 4) -> torch.Tensor:
    """The paper's best feature-based representation (Table 7): the last `n` layers concatenated, (batch, seq, n*H)."""
    if n > len(hidden_states) - 1:
        raise ValueError(f"Asked for the last {n} layers, but the model has {len(hidden_states) - 1}.")
    return torch.cat(hidden_states[-n:], dim=-1)


@dataclass
class BertReproForPreTrainingOutput(ModelOutput):
    """Output of `BertReproForPreTraining`: the total loss and its two parts, which training logs separately.

    loss: masked_lm_loss + next_sentence_loss (each present when its labels were given).
    prediction_logits: (batch, seq, vocab) MLM scores.  seq_relationship_logits: (batch, 2) NSP scores, index 0 IsNext.
    """

    loss: torch.Tensor | None = None
    masked_lm_loss: torch.Tensor | None = None
    next_sentence_loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def _mlm_logits(head: nn.Module, hidden_states: torch.Tensor, labels: torch.Tensor | None, sparse: bool,
                tied_gradient: TiedGradient | None = None):
    """MLM logits at every position, or (sparse, with labels) only where a token is to be predicted: the decoder
    over the vocabulary is the largest matrix of the model, and only ~15% of the positions need it."""
    if not sparse or labels is None:
        return head(hidden_states, tied_gradient), labels
    masked = labels != -100
    return head(hidden_states[masked], tied_gradient), labels[masked]


def _mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the masked positions (labels != -100)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)


class _TiedMLMMixin:
    """Shared by the two models that carry the MLM head: the encoder + MLM logits with the tied gradient, output
    embeddings and vocabulary resizing."""

    _tied_weights_keys = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"}

    def _encode_and_predict(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels,
                            sparse_prediction: bool, kwargs):
        """(encoder outputs, MLM logits, their labels); the decoder and the lookup share one gradient buffer."""
        tied = TiedGradient.for_forward(self, input_ids, inputs_embeds)
        positions = masked = None
        if sparse_prediction and labels is not None:
            masked = labels != -100
            positions = self._last_layer_positions(masked.shape, attention_mask, kwargs, reads=masked)
        outputs = self._run_bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 {**kwargs, "tied_gradient": tied, "last_layer_positions": positions})
        if positions is None:
            logits, labels = _mlm_logits(self.cls.predictions, outputs.last_hidden_state, labels,
                                         sparse_prediction, tied)
        else:  # the encoder returned the rows at `positions` only; the masked ones among them, in order
            logits = self.cls.predictions(outputs.last_hidden_state[masked[positions]], tied)
            labels = labels[masked]
        return outputs, logits, labels

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings

    def resize_token_embeddings(self, *args, **kwargs):
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        bias = self.cls.predictions.bias
        new_size = embeddings.weight.shape[0]
        if bias.shape[0] != new_size:  # the output bias follows the vocabulary; new entries start at 0
            resized = bias.new_zeros(new_size)
            keep = min(new_size, bias.shape[0])
            resized[:keep] = bias.data[:keep]
            self.cls.predictions.bias = nn.Parameter(resized)
        return embeddings


class BertReproForPreTraining(_TiedMLMMixin, BertReproPreTrainedModel):
    """BERT with the two pre-training heads: masked LM and next sentence prediction (paper section 3.1)."""

    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config)
        self.cls = BertReproPreTrainingHeads(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        return_dict: bool | None = None,
        sparse_prediction: bool = False,
        **kwargs,
    ) -> BertReproForPreTrainingOutput | tuple:
        """
        labels: (batch, seq) original token ids at masked positions, -100 elsewhere.
        next_sentence_label: (batch,) 0 = IsNext (B follows A), 1 = NotNext (B from another document).
        sparse_prediction: with labels, run the MLM head only at the masked positions (MosaicBERT); the loss is
            the same, `prediction_logits` is then (masked positions, vocab) in the order of `labels != -100`.
        """
        outputs, prediction_logits, labels = self._encode_and_predict(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels, sparse_prediction, kwargs
        )
        seq_relationship_logits = self.cls.seq_relationship(outputs.pooler_output)

        mlm_loss = _mlm_loss(prediction_logits, labels) if labels is not None else None
        nsp_loss = (
            F.cross_entropy(seq_relationship_logits.float(), next_sentence_label.reshape(-1))
            if next_sentence_label is not None
            else None
        )
        parts = [x for x in (mlm_loss, nsp_loss) if x is not None]
        output = BertReproForPreTrainingOutput(
            loss=sum(parts) if parts else None,
            masked_lm_loss=mlm_loss,
            next_sentence_loss=nsp_loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForMaskedLM(_TiedMLMMixin, BertReproPreTrainedModel):
    """BERT with the masked-LM head only (no pooler), e.g. for fill-mask or MLM-only pre-training."""

    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config, add_pooling_layer=False)
        self.cls = BertReproOnlyMLMHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, return_dict=None, sparse_prediction: bool = False,
                **kwargs) -> MaskedLMOutput | tuple:
        """sparse_prediction: as in `BertReproForPreTraining.forward`."""
        outputs, logits, labels = self._encode_and_predict(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels, sparse_prediction, kwargs
        )
        output = MaskedLMOutput(
            loss=_mlm_loss(logits, labels) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForNextSentencePrediction(BertReproPreTrainedModel):
    """BERT with the NSP head only: does segment B follow segment A? (index 0 = IsNext)."""

    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config)
        self.cls = BertReproOnlyNSPHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, return_dict=None, **kwargs) -> NextSentencePredictorOutput | tuple:
        outputs = self._run_bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs,
                                 cls_only=True)
        logits = self.cls.seq_relationship(outputs.pooler_output)
        output = NextSentencePredictorOutput(
            loss=F.cross_entropy(logits.float(), labels.reshape(-1)) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


def _classifier_dropout(config: BertReproConfig) -> BertReproDropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return BertReproDropout(p, config.fast_dropout)


class BertReproForSequenceClassification(BertReproPreTrainedModel):
    """A linear layer on the pooled [CLS] output: classification (GLUE) or, with num_labels == 1, regression (STS-B)."""

    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertReproModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, return_dict=None, **kwargs) -> SequenceClassifierOutput | tuple:
        outputs = self._run_bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs,
                                 cls_only=True)
        logits = self.classifier(self.dropout(outputs.pooler_output))
        output = SequenceClassifierOutput(
            loss=self._loss(logits, labels) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        problem_type = self.config.problem_type
        if problem_type is None:  # the transformers convention
            if self.num_labels == 1:
                problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                problem_type = "single_label_classification"
            else:
                problem_type = "multi_label_classification"
        if problem_type == "regression":
            return F.mse_loss(logits.squeeze(-1).float(), labels.reshape(logits.shape[:-1]).float()) \
                if self.num_labels == 1 else F.mse_loss(logits.float(), labels.float())
        if problem_type == "single_label_classification":
            return F.cross_entropy(logits.reshape(-1, self.num_labels).float(), labels.reshape(-1))
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class BertReproForQuestionAnswering(BertReproPreTrainedModel):
    """SQuAD span prediction: start logit S.T_i and end logit E.T_j for every token (`qa_outputs` holds S and E)."""

    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions=None, end_positions=None, return_dict=None,
                **kwargs) -> QuestionAnsweringModelOutput | tuple:
        """start_positions / end_positions: (batch,) token indices of the answer span ([CLS] = 0 for no answer)."""
        outputs = self._run_bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            # Positions outside this window (clamped to seq) are ignored, as in transformers.
            seq = start_logits.shape[1]
            start = start_positions.reshape(-1).clamp(0, seq)
            end = end_positions.reshape(-1).clamp(0, seq)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=seq)
                + F.cross_entropy(end_logits.float(), end, ignore_index=seq)
            ) / 2
        output = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits.contiguous(),
            end_logits=end_logits.contiguous(),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForMultipleChoice(BertReproPreTrainedModel):
    """SWAG: each choice `[CLS] context [SEP] ending [SEP]` is scored by a vector dotted with its pooled [CLS] output;
    softmax over the choices."""

    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.bert = BertReproModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, return_dict=None, **kwargs) -> MultipleChoiceModelOutput | tuple:
        """Inputs are (batch, num_choices, seq); labels (batch,) the index of the right choice."""
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(x):
            return None if x is None else x.reshape(-1, *x.shape[2:])

        outputs = self._run_bert(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                                 flat(inputs_embeds), kwargs, cls_only=True)
        logits = self.classifier(self.dropout(outputs.pooler_output)).reshape(-1, num_choices)
        output = MultipleChoiceModelOutput(
            loss=F.cross_entropy(logits.float(), labels.reshape(-1)) if labels is not None else None,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


class BertReproForTokenClassification(BertReproPreTrainedModel):
    """NER: a linear layer on every token; the paper labels the first sub-token of each word (others get -100)."""

    def __init__(self, config: BertReproConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertReproModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, return_dict=None, **kwargs) -> TokenClassifierOutput | tuple:
        outputs = self._run_bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels).float(), labels.reshape(-1), ignore_index=-100)
        output = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return _as_tuple_if_asked(output, return_dict, self.config)


# So that `save_pretrained` copies this file and its config next to the weights (trust_remote_code loading).
BertReproConfig.register_for_auto_class()
for _auto_class, _path in AUTO_MAP.items():
    if _auto_class != "AutoConfig":
        globals()[_path.split(".")[1]].register_for_auto_class(_auto_class)

__all__ = [
    "BertReproModel",
    "BertReproPreTrainedModel",
    "BertReproForPreTraining",
    "BertReproForPreTrainingOutput",
    "BertReproForMaskedLM",
    "BertReproForNextSentencePrediction",
    "BertReproForSequenceClassification",
    "BertReproForQuestionAnswering",
    "BertReproForMultipleChoice",
    "BertReproForTokenClassification",
    "concat_last_layers",
]
