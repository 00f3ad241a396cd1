"""The settings of the pre-training examples, including Table 5's objective."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.configuration_bert_repro import (
    DEFAULT_OBJECTIVE,
    PRETRAINING_OBJECTIVES,
    PreTrainingObjective,
    pretraining_objective,
)
from .masking import _check_masking

__all__ = ["PreTrainingDataConfig"]


@dataclass
class PreTrainingDataConfig:
    """google-research/bert's ``create_pretraining_data.py`` flags (same names, same defaults) plus options.

    Flat, so that ``transformers.HfArgumentParser`` reads it from a command line or a YAML file.
    """

    max_seq_length: int = field(default=128, metadata={"help": "Longest example, [CLS] and [SEP]s included."})
    max_predictions_per_seq: int = field(default=20, metadata={"help": "Most masked positions per example."})
    masked_lm_prob: float = field(default=0.15, metadata={"help": "Share of tokens to predict."})
    short_seq_prob: float = field(default=0.1, metadata={"help": "Chance of a shorter target length."})
    dupe_factor: int = field(default=10, metadata={"help": "Passes over the corpus, each with fresh masks."})
    random_seed: int = field(default=12345, metadata={"help": "Seed of all random choices."})
    do_whole_word_mask: bool = field(default=False, metadata={"help": "Mask the ## pieces of a word together."})
    static_masking: bool = field(
        default=True, metadata={"help": "Store masks in the data (paper); False leaves it to the collator."}
    )
    mask_replace_prob: float = field(default=0.8, metadata={"help": "Chosen position -> [MASK]."})
    random_replace_prob: float = field(default=0.1, metadata={"help": "Chosen position -> random token."})
    objective: str = field(
        default=DEFAULT_OBJECTIVE,
        metadata={
            "choices": list(PRETRAINING_OBJECTIVES),
            "help": "Pre-training objective, the paper's Table 5: "
            + ", ".join(f"{o.name} ({o.table5_row})" for o in PRETRAINING_OBJECTIVES.values())
            + ". Without NSP, examples are one segment [CLS] text [SEP]; ltr predicts the next token, unmasked.",
        },
    )

    def __post_init__(self) -> None:
        objective = self.pretraining_objective  # an unknown name raises, listing the choices
        if objective.next_sentence and self.max_seq_length < 5:
            raise ValueError(
                "max_seq_length must be at least 5 ([CLS] A [SEP] B [SEP] with a token in each of A and B), "
                f"got {self.max_seq_length}"
            )
        if self.max_seq_length < 4:
            raise ValueError(
                f"max_seq_length must be at least 4 ([CLS] text [SEP] with two text tokens) for "
                f"objective {objective.name!r}, got {self.max_seq_length}"
            )
        _check_masking(
            self.masked_lm_prob, self.max_predictions_per_seq, self.mask_replace_prob, self.random_replace_prob
        )
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be at least 1, got {self.dupe_factor}")

    @property
    def pretraining_objective(self) -> PreTrainingObjective:
        """The ``PreTrainingObjective`` named by ``objective`` (the model config reads the same table)."""
        return pretraining_objective(self.objective)

    @property
    def max_num_tokens(self) -> int:
        """Room for the text: ``max_seq_length`` less ``[CLS]`` and the ``[SEP]`` (two with NSP)."""
        return self.max_seq_length - (3 if self.pretraining_objective.next_sentence else 2)

    @property
    def stores_masks(self) -> bool:
        """Whether the built examples carry their masks: static masking of a masked-LM objective."""
        return self.static_masking and self.pretraining_objective.masked_lm
