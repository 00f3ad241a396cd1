"""The last Transformer block at the positions a head reads only: the `last_layer_subset` switch.

Some heads read the last layer at a few positions: [CLS] for classification, multiple choice and NSP; the masked
tokens with `config.sparse_prediction` and labels. The last block's output projection and feed-forward then run
there only, about three quarters of that block (its attention still reads every token as key and value). Measured
in benchmarks/LOG.md ("MRPC fine-tuning", "Pre-training step"); figures in benchmarks/RESULTS.md.

The head models in `READS` pass `read_positions` to `unpadding.SpeedEncoder`, whose `last_hidden_state` is zero in
the unread rows. Not one graph under whole-model `torch.compile` (`nonzero`); the recipes warn.
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
    """(.., hidden) -> (rows, hidden): the rows `read_rows` of x flattened (all of x when None)."""
    return x if read_rows is None else x.reshape(-1, x.shape[-1]).index_select(0, read_rows)


def place_rows(values: torch.Tensor, read_rows: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of `select_rows` into zeros: a tensor of `shape` holding `values` at rows `read_rows`."""
    flat = values.new_zeros(shape.numel() // shape[-1], shape[-1]).index_copy(0, read_rows, values)
    return flat.view(shape)


def read_positions(inputs: dict, cls: bool, masked: bool, sparse_prediction: bool) -> torch.Tensor | None:
    """(batch, seq) bool: the positions a head reads, from its forward's arguments; None when it reads them all."""
    if masked:
        labels = inputs.get("labels")
        if labels is None or not sparse_prediction:
            return None
        read = labels.reshape(-1, labels.shape[-1]) != -100
    else:
        ids = inputs.get("input_ids")
        tokens = ids if ids is not None else inputs.get("inputs_embeds")[..., 0]
        read = torch.zeros_like(tokens, dtype=torch.bool).reshape(-1, tokens.shape[-1])
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
