"""Tiny models and batches: a small BertReproConfig, transformers' BertConfig of the same architecture, a padded
batch, and the parity report printed at the end of a run."""

from __future__ import annotations

import torch

# The architecture fields shared by BertConfig and BertReproConfig.
ARCH_FIELDS = tuple(
    "vocab_size hidden_size num_hidden_layers num_attention_heads intermediate_size hidden_act hidden_dropout_prob "
    "attention_probs_dropout_prob max_position_embeddings type_vocab_size layer_norm_eps initializer_range "
    "num_labels".split()
)


def tiny_config(**overrides):
    from bert_repro import BertReproConfig

    fields = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    return BertReproConfig(**{**fields, **overrides})


def hf_config_like(config, **overrides):
    """transformers' BertConfig with the same architecture as a BertReproConfig."""
    from transformers import BertConfig

    return BertConfig(**{**{k: getattr(config, k) for k in ARCH_FIELDS}, **overrides})


def padded_batch(vocab_size: int, batch: int = 3, seq: int = 16, seed: int = 0):
    """Random ids with a pair structure and padding of different lengths in the batch."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch, seq), generator=g)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    token_type_ids = torch.zeros(batch, seq, dtype=torch.long)
    for row in range(batch):
        length = seq - (row * seq) // (batch + 1)
        attention_mask[row, length:] = 0
        input_ids[row, length:] = 0
        token_type_ids[row, length // 2 : length] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


# Worst differences measured by the parity tests, printed at the end of every run (not only with -s), and the
# largest they may be (fp32, eval mode: the same function in another order of float operations).
PARITY_REPORT: list[tuple[str, float]] = []
PARITY_TOLERANCE = 1e-5
