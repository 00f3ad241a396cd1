"""The last Transformer block at the positions a head reads only: the `last_layer_subset` switch.

Some heads read the last layer at a few positions: [CLS] for classification, multiple choice and NSP; the masked
tokens with `config.sparse_prediction` and labels. The last block's output projection and feed-forward then run
there only, about three quarters of that block (its attention still reads every token as key and value). Measured
in benchmarks/LOG.md ("MRPC fine-tuning", "Pre-training step"); figures in benchmarks/RESULTS.md.

The head models pass the positions they read (`modeling_bert_repro.read_positions`) to the encoder, and
`unpadding.SpeedEncoder` computes those rows only in its last block; its `last_hidden_state` is zero elsewhere. Not
one graph under whole-model `torch.compile` (`nonzero`); the recipes warn.
"""

from __future__ import annotations

import torch


def select_rows(x: torch.Tensor, read_rows: torch.Tensor | None) -> torch.Tensor:
    """(.., hidden) -> (rows, hidden): the rows `read_rows` of x flattened (all of x when None)."""
    return x if read_rows is None else x.reshape(-1, x.shape[-1]).index_select(0, read_rows)


def place_rows(values: torch.Tensor, read_rows: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of `select_rows` into zeros: a tensor of `shape` holding `values` at rows `read_rows`."""
    flat = values.new_zeros(shape.numel() // shape[-1], shape[-1]).index_copy(0, read_rows, values)
    return flat.view(shape)


__all__ = ["place_rows", "select_rows"]
