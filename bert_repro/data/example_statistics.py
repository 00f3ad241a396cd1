"""Statistics of built pre-training examples, read from Arrow in batches (``data_statistics.json``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset

from .tokenized_documents import _skip_counts
from .training_instances import IS_NEXT

__all__ = ["pretraining_statistics"]


def pretraining_statistics(
    instances: Dataset,
    documents: Dataset | None = None,
    *,
    mask_token_id: int | None = None,
    num_bins: int = 16,
    batch_size: int = 65_536,
) -> dict[str, Any]:
    """Lengths, the IsNext share, the masked share and the 80/10/10 split drawn, as a JSON-serialisable dict.

    ``tokens`` include special tokens and are ``masked_share``'s base, as ``masked_lm_prob``'s; ``length_histogram``
    bounds are inclusive. The split needs ``mask_token_id`` (a random draw of the original token counts as
    unchanged); ``documents`` adds the corpus's counts and skips.
    """
    stats: dict[str, Any] = {} if documents is None else _document_statistics(documents)
    static = "masked_lm_positions" in instances.column_names
    pairs = "next_sentence_label" in instances.column_names
    length_counts = np.zeros(0, dtype=np.int64)
    is_next = masked = as_mask = unchanged = 0
    for table in instances.with_format("arrow").iter(batch_size=batch_size):
        input_ids = _combined(table.column("input_ids"))
        lengths = pc.list_value_length(input_ids).to_numpy(zero_copy_only=False).astype(np.int64)
        length_counts = _add_counts(length_counts, np.bincount(lengths))
        if pairs:
            is_next += int(np.sum(table.column("next_sentence_label").to_numpy() == IS_NEXT))
        if static:
            shown, originals = _masked_tokens(table, input_ids, lengths)
            masked += len(shown)
            if mask_token_id is not None:
                as_mask += int(np.sum(shown == mask_token_id))
                unchanged += int(np.sum((shown == originals) & (shown != mask_token_id)))
    examples = int(length_counts.sum())
    tokens = int(np.dot(np.arange(len(length_counts)), length_counts))
    stats.update(examples=examples, tokens=tokens)
    if pairs:
        stats["is_next_share"] = is_next / examples if examples else None
    stats["length_histogram"] = _histogram(length_counts, num_bins)
    if static:
        stats.update(masked=masked, masked_share=masked / max(1, tokens))
        if mask_token_id is not None and masked:
            stats["masked_split"] = {
                "mask": as_mask / masked,
                "random": (masked - as_mask - unchanged) / masked,
                "unchanged": unchanged / masked,
            }
    return stats


def _combined(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _add_counts(total: np.ndarray, counts: np.ndarray) -> np.ndarray:
    size = max(len(total), len(counts))
    return np.pad(total, (0, size - len(total))) + np.pad(counts, (0, size - len(counts)))


def _masked_tokens(table: pa.Table, input_ids: pa.Array, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the model is shown at each stored masked position, and the original token there."""
    positions = _combined(table.column("masked_lm_positions"))
    originals = _combined(table.column("masked_lm_ids")).flatten().to_numpy()
    parents = pc.list_parent_indices(positions).to_numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    shown = input_ids.flatten().to_numpy()[starts[parents] + positions.flatten().to_numpy()]
    return shown, originals


def _document_statistics(documents: Dataset) -> dict[str, Any]:
    counts = documents.data.column("num_sentences").to_numpy()
    return {
        "documents": int(np.sum(counts > 0)),
        "documents_skipped": _skip_counts(documents),
        "one_sentence_documents": int(np.sum(counts == 1)),
        "sentences": int(counts.sum()),
        "document_tokens": int(documents.data.column("num_tokens").to_numpy().sum()),
        # Overlong "sentences" cut into pieces (text without sentence punctuation; see sentences.py).
        "long_sentences_cut": (
            int(documents.data.column("long_sentences").to_numpy().sum())
            if "long_sentences" in documents.column_names
            else 0
        ),
    }


def _histogram(length_counts: np.ndarray, num_bins: int) -> dict[str, int]:
    """Exact length counts -> ``num_bins`` bins of equal width over ``[0, longest]``."""
    if not length_counts.sum():
        return {}
    width = max(1, math.ceil(len(length_counts) / num_bins))
    bins = np.add.reduceat(length_counts, np.arange(0, len(length_counts), width))
    return {f"{b * width}-{(b + 1) * width - 1}": int(n) for b, n in enumerate(bins) if n}
