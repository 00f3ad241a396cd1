"""``Dataset.map(num_proc=...)`` over rows of very different sizes, with the same output bytes for any ``num_proc``."""

from __future__ import annotations

import heapq

import numpy as np
from datasets import Dataset


def _balanced_order(weights: np.ndarray, num_proc: int | None) -> np.ndarray | None:
    """A row order giving each ``map(num_proc=...)`` worker about the same work; ``None``: one process or a gain < 5%.

    ``Dataset.map`` gives worker ``k`` the ``k``-th contiguous block, and a corpus concatenated from sources lists
    its long documents together, so one worker could get most of the work.
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
    """``flatten_indices`` with Arrow batches, not rows cast one at a time (benchmarks/LOG.md, "Building pre-training
    examples")."""
    fmt = dataset.format
    flat = dataset.with_format("arrow").flatten_indices(new_fingerprint=fingerprint)
    flat = flat.with_format(fmt["type"], fmt["columns"], fmt["output_all_columns"], **fmt["format_kwargs"])
    flat._fingerprint = fingerprint  # the format is the input's again: same data, same fingerprint
    return flat
