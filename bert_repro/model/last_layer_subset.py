"""The last Transformer block at the positions a head reads only: the `last_layer_subset` switch.

What it speeds up: training and inference of the heads that read the last layer at a few positions: [CLS] for
sequence classification, multiple choice and NSP; [CLS] and the masked tokens for pre-training, the masked tokens
for MLM (both with `config.sparse_prediction` and labels). The last block projects its attention context and runs
its feed-forward network only there (its attention still reads every token as key and value), about three
quarters of that block. What it measured (CPU, interleaved A/Bs of the MRPC and BERT-BASE pre-training steps, and
MRPC fine-tuning end to end): benchmarks/LOG.md, "MRPC fine-tuning" and "Pre-training step"; the current figures:
benchmarks/RESULTS.md.

How the positions travel, as arguments:
- The head models in `READS` (their `speed_paths.py` classes, `passing_read_positions`) compute
  `read_positions`, a (batch, seq) bool mask of the positions the head reads, from their inputs ([CLS]: position
  0, or each example's first token in a packed batch; masked tokens: `labels != -100`), and pass it to their
  `BertReproModel`, whose forward passes its keyword arguments to the encoder (the model file's convention).
- The encoder (`unpadding.SpeedEncoder`, option `last_layer_subset`) turns the mask into `read_rows`, the indices
  of those positions among the rows of its hidden-state matrix, and gives them to its last `SpeedLayer`. It
  returns a full-shaped (batch, seq, hidden) `last_hidden_state` whose unread rows are ZEROS, so the model file's
  pooler and heads read it unchanged.
- The whole last layer runs when hidden states or attentions are asked for, or when no positions are given (the
  bare `BertReproModel`, question answering, token classification, MLM without labels or without
  `sparse_prediction`). Works under gradient checkpointing (the rows are a keyword argument of the layer call) and
  `compile_layers` (`SpeedLayer` is a `BertReproLayer`).

Under whole-model `torch.compile` it does not make one graph: the rows the last layer reads are found with
`nonzero` on the data (benchmarks/LOG.md, "torch.compile"); the recipes warn when both are asked for.
"""

from __future__ import annotations

import torch

from .modeling_bert_repro import (
    BertReproForMaskedLM,
    BertReproForMultipleChoice,
    BertReproForNextSentencePrediction,
    BertReproForPreTraining,
    BertReproForSequenceClassification,
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


def read_positions(inputs: dict, cls: bool, masked: bool, sparse_prediction: bool) -> torch.Tensor | None:
    """The (batch, seq) bool mask of the positions a head reads, from a head model's forward arguments `inputs`
    (by name); None when it reads every position (an MLM head without labels or without sparse prediction)."""
    if masked:
        labels = inputs.get("labels")
        if labels is None or not sparse_prediction:
            return None
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
    return read


__all__ = ["READS", "place_rows", "read_positions", "select_rows"]
