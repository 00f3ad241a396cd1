"""The last Transformer block at the positions a head reads only: the `last_layer_subset` switch.

What it speeds up: training and inference of the heads that read the last layer at a few positions: [CLS] for
sequence classification, multiple choice and NSP; [CLS] and the masked tokens for pre-training, the masked tokens
for MLM (both with `config.sparse_prediction` and labels). The last block projects its attention context and runs
its feed-forward network only there (its attention still reads every token as key and value), about three
quarters of that block. Measured (benchmarks/README.md, 2026-11-22, CPU, interleaved A/Bs): 0.886x and 0.901x
the MRPC step time (MiniLM), 0.940x the BERT-BASE pre-training step time; MRPC fine-tuning with all switches went
from 0.67x-0.68x to 0.56x-0.60x transformers' training time when it was added.

How the positions travel, without any argument in the model file's signatures:
- `install_read_positions_hook` (run once at build, by `speed_paths`) adds a forward pre-hook to the head models in
  `READS`. It computes `read_positions`, a (batch, seq) bool mask of the positions the head reads, from the
  head's inputs ([CLS]: position 0; masked tokens: `labels != -100`) and adds it to the forward's kwargs, which
  the model file passes on to `BertReproModel` and its encoder.
- `LastLayerSubsetEncoder` (padded inputs) and `unpadding.UnpaddedEncoder` turn the mask into `read_rows`, the
  indices of those positions among the rows of their hidden-state matrix, and call the last layer, a
  `ReadRowsLayer`, with them. The encoder returns a full-shaped (batch, seq, hidden) `last_hidden_state` whose
  unread rows are ZEROS, so the model file's pooler and heads read it unchanged.
- The whole last layer runs when hidden states or attentions are asked for, or when no hook added positions (the
  bare `BertReproModel`, question answering, token classification, MLM without labels or without
  `sparse_prediction`). Works under gradient checkpointing (the rows are a keyword argument of the layer call) and
  `compile_layers` (`ReadRowsLayer` is a `BertReproLayer`).

Under whole-model `torch.compile` it does not make one graph: the rows the last layer reads are found with
`nonzero` on the data (benchmarks/README.md, "torch.compile"); the recipes warn when both are asked for.
"""

from __future__ import annotations

import inspect
from functools import partial

import torch
from transformers.modeling_outputs import BaseModelOutput

from .modeling_bert_repro import (
    BertReproEncoder,
    BertReproForMaskedLM,
    BertReproForMultipleChoice,
    BertReproForNextSentencePrediction,
    BertReproForPreTraining,
    BertReproForSequenceClassification,
    BertReproLayer,
    attention_inputs,
)

# The positions each head model reads from the last layer: ([CLS], the masked tokens).
READS: dict[type, tuple[bool, bool]] = {
    BertReproForSequenceClassification: (True, False),
    BertReproForMultipleChoice: (True, False),
    BertReproForNextSentencePrediction: (True, False),
    BertReproForPreTraining: (True, True),
    BertReproForMaskedLM: (False, True),
}


def select_rows(x: torch.Tensor, read_rows: torch.Tensor | None) -> torch.Tensor:
    """(.., hidden) -> (rows, hidden): the rows `read_rows` of x flattened to a matrix (all of x when None)."""
    return x if read_rows is None else x.reshape(-1, x.shape[-1]).index_select(0, read_rows)


def place_rows(values: torch.Tensor, read_rows: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of `select_rows` into zeros: a tensor of `shape` holding `values` at rows `read_rows`."""
    flat = values.new_zeros(shape.numel() // shape[-1], shape[-1]).index_copy(0, read_rows, values)
    return flat.view(shape)


class ReadRowsLayer(BertReproLayer):
    """The last block; with `read_rows`, the attention output and the feed-forward network at those rows only."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                read_rows: torch.Tensor | None = None, **kwargs):
        if read_rows is None:
            return super().forward(hidden_states, attention_mask, **kwargs)
        self_attention = self.attention.self
        if getattr(self_attention, "takes_read_rows", False):  # it computes the context at those rows itself
            context, probs = self_attention(hidden_states, attention_mask, read_rows=read_rows, **kwargs)
        else:
            context, probs = self_attention(hidden_states, attention_mask, **kwargs)
            context = select_rows(context, read_rows)
        attention_output = self.attention.output(context, select_rows(hidden_states, read_rows))
        return self.output(self.intermediate(attention_output), attention_output), probs


class LastLayerSubsetEncoder(BertReproEncoder):
    """The encoder for padded inputs; with `read_positions`, the last layer at those positions only and zeros
    elsewhere in `last_hidden_state`."""

    def forward(self, hidden_states, attention_mask=None, output_hidden_states=False, output_attentions=False,
                read_positions: torch.Tensor | None = None, **kwargs) -> BaseModelOutput:
        if read_positions is None or output_hidden_states or output_attentions:
            return super().forward(hidden_states, attention_mask, output_hidden_states, output_attentions, **kwargs)
        mask, kernel_kwargs = attention_inputs(self.config, hidden_states, attention_mask, kwargs.pop("packed", None))
        kwargs.update(kernel_kwargs)
        shape = hidden_states.shape
        for layer in self.layer[:-1]:
            hidden_states, _ = layer(hidden_states, mask, **kwargs)
        read_rows = read_positions.flatten().nonzero().flatten()
        values, _ = self.layer[-1](hidden_states, mask, read_rows=read_rows, **kwargs)
        return BaseModelOutput(last_hidden_state=place_rows(values, read_rows, shape))


def is_last_layer(model: torch.nn.Module, module: torch.nn.Module) -> bool:
    return any(module is encoder.layer[-1] for encoder in model.modules() if isinstance(encoder, BertReproEncoder))


def add_read_positions(model, args, kwargs, *, signature: inspect.Signature, cls: bool, masked: bool):
    """Forward pre-hook of a head model: `read_positions` added to its kwargs (see the module docstring)."""
    inputs = signature.bind(*args, **kwargs).arguments
    if masked:
        labels = inputs.get("labels")
        if labels is None or not model.config.sparse_prediction:
            return None  # the MLM head reads every position
        read = labels.reshape(-1, labels.shape[-1]) != -100
    else:
        ids, embeds = inputs.get("input_ids"), inputs.get("inputs_embeds")
        seq = ids.shape[-1] if ids is not None else embeds.shape[-2]
        count = ids.numel() // seq if ids is not None else embeds[..., 0].numel() // seq
        read = torch.zeros(count, seq, dtype=torch.bool, device=(ids if ids is not None else embeds).device)
    if cls:  # each sequence's first token; in a packed batch each example's ([CLS]: position 0)
        position_ids = inputs.get("position_ids")
        if position_ids is None:
            read[:, 0] = True
        else:
            mask = inputs.get("attention_mask")
            first = position_ids.reshape(read.shape) == 0
            read |= first if mask is None else first & mask.reshape(read.shape).bool()
    return args, {**kwargs, "read_positions": read}


def install_read_positions_hook(model: torch.nn.Module, on: bool) -> None:
    """Add (once) or remove the `add_read_positions` pre-hook of a head model in `READS`."""
    handle = model.__dict__.pop("_read_positions_hook", None)
    if handle is not None:
        handle.remove()
    reads = next((r for cls, r in READS.items() if isinstance(model, cls)), None)
    if on and reads is not None:
        hook = partial(add_read_positions, signature=inspect.signature(model.forward), cls=reads[0], masked=reads[1])
        model._read_positions_hook = model.register_forward_pre_hook(hook, with_kwargs=True)


__all__ = ["LastLayerSubsetEncoder", "READS", "ReadRowsLayer", "install_read_positions_hook"]
