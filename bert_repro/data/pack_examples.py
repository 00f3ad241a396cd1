"""Sequence packing for pre-training with both objectives, masked LM and next sentence prediction.

Short examples (``short_seq_prob``, document ends) leave padding; packing puts several into one row. transformers'
``DataCollatorWithFlattening`` packs for MLM only (it drops ``token_type_ids`` and the NSP label); here every example
keeps its segments, masks, [CLS] and NSP label, so the losses and gradients are the unpacked batch's. Packing is per
batch, so a step still holds ``global_batch_size`` examples and the sampler, phases and resumption are unchanged.

A batch's ``input_ids``, ``token_type_ids``, ``labels``, ``attention_mask`` and ``position_ids`` are (rows, width);
an example starts where ``position_ids == 0`` at a real token (transformers' variable-length FlashAttention
convention, read by ``bert_repro.model.packed_sequences``). ``next_sentence_label``, ``masked_positions`` and
``cls_positions`` (each [CLS] in the flattened batch, the pooler's gather) are per example, in row-major order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .pretraining_config import PreTrainingDataConfig
from .pretraining_examples import IGNORE_INDEX, PreTrainingCollator

__all__ = ["PackingCollator", "first_fit_decreasing", "pack_rows", "packed_rows_per_example", "padding_statistics"]


def first_fit_decreasing(lengths: Sequence[int], max_seq_length: int) -> list[list[int]]:
    """Rows of indices into ``lengths`` of at most ``max_seq_length`` tokens each, in input order where packing allows.

    First-fit decreasing needs at most 11/9 of the fewest rows possible, plus one.
    """
    too_long = [i for i, n in enumerate(lengths) if n > max_seq_length]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"example {i} has {lengths[i]} tokens, more than max_seq_length {max_seq_length}: pack with the "
            "max_seq_length the examples were built with"
        )
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: ties keep the input order
        for r, left in enumerate(room):
            if lengths[i] <= left:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(max_seq_length - lengths[i])
    return sorted((sorted(row) for row in rows), key=lambda row: row[0])


def pack_rows(lengths: Sequence[int], max_seq_length: int, step: int = 8) -> tuple[list[list[int]], int]:
    """``first_fit_decreasing`` rows of the width, in steps of ``step``, that leaves the least padding (the widest on
    a tie), and that width: 8 examples of 100 tokens leave 224 positions empty in 2 rows of 512, none in 2 of 400."""
    if not lengths:
        return [], 0
    total, longest = sum(lengths), max(lengths)

    def packed(capacity: int) -> tuple[int, int, list[list[int]]]:
        rows = first_fit_decreasing(lengths, capacity)
        width = max(sum(lengths[i] for i in row) for row in rows)
        return len(rows) * width - total, width, rows

    padding, width, rows = packed(max_seq_length)
    capacity = max_seq_length - step
    while capacity >= longest and padding > 0:
        candidate = packed(capacity)
        if candidate[0] < padding:
            padding, width, rows = candidate
        capacity -= step
    return rows, width


@dataclass
class PackingCollator(PreTrainingCollator):
    """``PreTrainingCollator`` whose batch is packed rows of at most ``max_seq_length`` tokens, masked as unpacked.

    ``fixed_shape`` (for ``torch.compile``: one graph): rows of ``max_seq_length``, ``examples`` example slots (the
    missing ones ignored by the losses) and ``ceil(rows_per_example * slots)`` rows, or one row per slot for a batch
    that needs more (``packed_rows_per_example`` makes that rare).
    """

    max_seq_length: int = 128
    fixed_shape: bool = False
    examples: int | None = None
    rows_per_example: float = 1.0

    @classmethod
    def from_config(cls, tokenizer: Any, config: PreTrainingDataConfig, **kwargs: Any) -> PackingCollator:
        return super().from_config(tokenizer, config, max_seq_length=config.max_seq_length, **kwargs)

    def _layout(self, lengths: list[int]) -> tuple[list[list[int]], int, int, int]:
        """(rows of example indices, width, row count, example slots)."""
        if not self.fixed_shape:
            rows, longest_row = pack_rows(lengths, self.max_seq_length, self.pad_to_multiple_of or 8)
            return rows, self._padded_width(longest_row), len(rows), len(lengths)
        rows = first_fit_decreasing(lengths, self.max_seq_length)  # the width is fixed: the fewest rows
        slots = len(lengths) if self.examples is None else self.examples
        if len(lengths) > slots:
            raise ValueError(f"a batch of {len(lengths)} examples, more than the fixed {slots} (examples)")
        fixed_rows = min(slots, math.ceil(self.rows_per_example * slots - 1e-9))  # a ratio of counts, rounded
        return rows, self.max_seq_length, fixed_rows if len(rows) <= fixed_rows else slots, slots

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        input_ids, targets = self._masked(features)
        lengths = [len(ids) for ids in input_ids]
        rows, width, row_count, slots = self._layout(lengths)
        shape = (row_count, width)
        batch = {
            "input_ids": torch.full(shape, self.vocab.pad_token, dtype=torch.long),
            "token_type_ids": torch.zeros(shape, dtype=torch.long),
            "position_ids": torch.zeros(shape, dtype=torch.long),
            "attention_mask": torch.zeros(shape, dtype=torch.long),
            "labels": torch.full(shape, IGNORE_INDEX, dtype=torch.long),
        }
        starts = [0] * len(features)  # each example's first position in the flattened batch
        for r, row in enumerate(rows):
            start = 0
            for i in row:
                starts[i] = r * width + start
                end = start + lengths[i]
                batch["input_ids"][r, start:end] = torch.as_tensor(input_ids[i], dtype=torch.long)
                batch["token_type_ids"][r, start:end] = torch.as_tensor(list(features[i]["token_type_ids"]))
                batch["position_ids"][r, start:end] = torch.arange(lengths[i])
                batch["attention_mask"][r, start:end] = 1
                positions, ids = targets[i]
                batch["labels"][r, start + torch.as_tensor(positions, dtype=torch.long)] = torch.as_tensor(
                    ids, dtype=torch.long
                )
                start = end
        order = [i for row in rows for i in row]
        missing = slots - len(order)
        # A missing example reads the first [CLS] (position 0): unlabelled, and its NSP label is ignored.
        masked_positions = self._masked_positions(
            [targets[i] for i in order], [starts[i] for i in order], [lengths[i] for i in order]
        )
        batch["masked_positions"] = torch.cat(
            [masked_positions, masked_positions.new_zeros(missing, *masked_positions.shape[1:])]
        )
        batch["cls_positions"] = torch.tensor([starts[i] for i in order] + [0] * missing)
        if "next_sentence_label" in features[0]:
            labels = [int(features[i]["next_sentence_label"]) for i in order]
            batch["next_sentence_label"] = torch.tensor(labels + [IGNORE_INDEX] * missing)
        return batch


def packed_rows_per_example(statistics: Mapping[str, Any]) -> float:
    """``PackingCollator.rows_per_example``: the most rows a measured batch needed (more about once in batches + 1)."""
    return statistics["most_rows_at_full_width"] / statistics["batch_size"] if statistics.get("batches") else 1.0


def padding_statistics(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    max_seq_length: int,
    *,
    seed: int = 0,
    max_batches: int | None = 2000,
) -> dict[str, Any]:
    """Share of padding without and with packing, in up to ``max_batches`` batches drawn as the training sampler does
    (a seeded permutation; an incomplete last batch dropped unless it is the only one)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if len(lengths) == 0:
        return {"batch_size": batch_size, "batches": 0}
    order = np.random.default_rng(seed).permutation(len(lengths))
    count = max(1, len(lengths) // batch_size)
    if max_batches is not None:
        count = min(count, max_batches)
    real = unpacked = packed = rows = most_rows = 0
    for b in range(count):
        batch = lengths[order[b * batch_size : (b + 1) * batch_size]]
        real += int(batch.sum())
        unpacked += len(batch) * int(batch.max())
        packed_rows, width = pack_rows(batch.tolist(), max_seq_length)
        rows += len(packed_rows)
        packed += len(packed_rows) * width
        most_rows = max(most_rows, len(first_fit_decreasing(batch.tolist(), max_seq_length)))
    return {
        "batch_size": batch_size,
        "batches": count,
        "padding_share_unpacked": 1 - real / unpacked,
        "padding_share_packed": 1 - real / packed,
        "rows_per_batch": rows / count,
        "most_rows_at_full_width": most_rows,
    }
