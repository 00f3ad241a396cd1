"""The paper's two-phase schedule (90% of the steps at 128 tokens, then 512) inside ONE Trainer run, so there is
one learning-rate schedule across both phases and resuming works anywhere."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from torch.utils.data import Sampler

from ...data.pack_examples import PackingCollator, packed_rows_per_example
from ...data.pretraining_examples import PreTrainingCollator, PreTrainingDataConfig

if TYPE_CHECKING:
    from .recipe import PreTrainingRecipe


def phase_configs(recipe: PreTrainingRecipe) -> list[PreTrainingDataConfig]:
    """How each phase's examples are built: the recipe's `examples` with the phase's lengths."""
    return [
        replace(recipe.examples, max_seq_length=p.max_seq_length, max_predictions_per_seq=p.max_predictions_per_seq)
        for p in recipe.phases
    ]


def phase_steps(max_steps: int, phase2_fraction: float, num_phases: int) -> list[int]:
    if num_phases == 1:
        return [max_steps]
    second = max(1, round(max_steps * phase2_fraction))
    return [max_steps - second, second]


class PhasedSampler(Sampler[int]):
    """Indices into the concatenated phase datasets: `samples[p]` draws from phase p, in phase order, in passes
    reshuffled by a seeded generator (the same order on every process and after resumption)."""

    def __init__(self, sizes: list[int], samples: list[int], seed: int):
        if any(n > 0 and size == 0 for size, n in zip(sizes, samples)):
            raise ValueError(f"A phase has no examples to draw from (sizes {sizes}).")
        self.sizes, self.samples, self.seed = sizes, samples, seed

    def __len__(self) -> int:
        return sum(self.samples)

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        offset = 0
        for size, n in zip(self.sizes, self.samples):
            drawn = 0
            while drawn < n:
                order = rng.permutation(size)[: n - drawn]
                yield from (offset + order).tolist()
                drawn += len(order)
            offset += size


def packed_rows(statistics: dict, num_phases: int) -> list[float]:
    """Each phase's packed rows per example from its padding statistics; one where a phase has none (streamed)."""
    return [packed_rows_per_example(statistics.get(f"phase{i + 1}", {}).get("padding", {})) for i in range(num_phases)]


class PhaseCollator:
    """Routes each batch to its phase's collator; rows that carry their masks (held out) keep them. With `packing` and
    `compiled` each phase's batches get one shape, `rows_per_example[phase]` rows per example."""

    def __init__(
        self,
        tokenizer,
        phases: list[PreTrainingDataConfig],
        packing: bool = False,
        compiled: bool = False,
        rows_per_example: list[float] | None = None,
    ):
        shares = rows_per_example or [1.0] * len(phases)

        def fixed(share):
            return {"fixed_shape": True, "rows_per_example": share} if packing and compiled else {}

        def static(cfg, share):
            slots = {"max_predictions_per_seq": cfg.max_predictions_per_seq}
            if packing:
                return PackingCollator(tokenizer, max_seq_length=cfg.max_seq_length, **slots, **fixed(share))
            return PreTrainingCollator(tokenizer, **slots)

        collator = PackingCollator if packing else PreTrainingCollator
        self.collators = [
            (cfg.max_seq_length, collator.from_config(tokenizer, cfg, **fixed(share)))
            for cfg, share in zip(phases, shares, strict=True)
        ]
        self.static = [(cfg.max_seq_length, static(cfg, share)) for cfg, share in zip(phases, shares, strict=True)]

    def __call__(self, features):
        collators = self.static if "masked_lm_positions" in features[0] else self.collators
        longest = max(len(f["input_ids"]) for f in features)
        for max_len, collator in collators:
            if longest <= max_len:
                return collator(features)
        return collators[-1][1](features)
