"""``Dataset.map(num_proc=...)`` over rows of very different sizes: a row order that gives every worker about the same
work (``_balanced_order``), and the mapped rows written back in input order (``_flatten``), so that the output is the
same bytes for any ``num_proc``. Both map-style pipelines of the pre-training examples use them
(``bert_repro.data.tokenized_documents``, ``bert_repro.data.pretraining_examples``).
"""

from __future__ import annotations

import heapq

import numpy as np
from datasets import Dataset


def _balanced_order(weights: np.ndarray, num_proc: int | None) -> np.ndarray | None:
    """A row order that gives every worker of ``map(num_proc=...)`` about the same share of the work.

    ``Dataset.map`` gives worker ``k`` the ``k``-th contiguous block, and documents differ in size by orders of
    magnitude (a corpus concatenated from sources lists its long documents together), so one worker can get most
    of the work. The heaviest rows go first, each to the lightest block with room; a block keeps its rows in input
    order. ``None``: one process, or a gain under 5% (not worth putting the rows back).
    """
    weights = np.asarray(weights, dtype=np.int64)
    n = len(weights)
    if not num_proc or num_proc < 2 or n < 2:
        return None
    num_shards = min(num_proc, n)
    div, mod = divmod(n, num_shards)
    room = [div + (1 if k < mod else 0) for k in range(num_shards)]
    blocks: list[list[int]] = [[] for _ in range(num_shards)]
    heap = [(0, k) for k in range(num_shards)]  # (load, block) of the blocks with room left
    for row in np.argsort(-weights, kind="stable").tolist():
        load, k = heapq.heappop(heap)
        blocks[k].append(row)
        if len(blocks[k]) < room[k]:
            heapq.heappush(heap, (load + int(weights[row]), k))
    contiguous = np.add.reduceat(weights, np.cumsum([0, *room[:-1]])).max()
    balanced = max(int(weights[b].sum()) for b in blocks)
    if balanced >= 0.95 * contiguous:
        return None
    return np.concatenate([np.sort(np.asarray(b, dtype=np.int64)) for b in blocks])


def _flatten(dataset: Dataset, fingerprint: str) -> Dataset:
    """``flatten_indices`` (a cached map) with Arrow batches: the rows are written as whole tables, not cast
    one row at a time as ``flatten_indices`` does with Python batches after a shuffle (faster: benchmarks/LOG.md,
    "Building pre-training examples")."""
    fmt = dataset.format
    flat = dataset.with_format("arrow").flatten_indices(new_fingerprint=fingerprint)
    flat = flat.with_format(fmt["type"], fmt["columns"], fmt["output_all_columns"], **fmt["format_kwargs"])
    flat._fingerprint = fingerprint  # the format is the input's again: same data, same fingerprint
    return flat
