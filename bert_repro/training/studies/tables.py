"""The paper's section-5 tables as data (`STUDIES`): each study's variants, columns and the paper's numbers.

- `table5`: the pre-training tasks (MLM + NSP, No NSP, LTR & No NSP, + BiLSTM on the LTR model).
- `table6`: model size (L / H / A); also the held-out MLM perplexity of each pre-trained model.
- `table7`: the feature-based approach on CoNLL-2003 (a BiLSTM on six feature sets) against fine-tuning.
- `table8`: the masking mixes ([MASK] / same / random) on MNLI and NER, fine-tuned and feature-based.
- `pretraining`: not in the paper: pre-trained against randomly initialised, the evidence that pre-training helps
  at the budget given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ...model.bilstm_heads import FEATURE_SETS
from ...tasks.registry import get_task
from ..cli import ConfigurationError


@dataclass(frozen=True)
class Column:
    """One column of a table: a task's dev metric after fine-tuning, or (task None) a measure of pre-training."""

    key: str  # directory name of its fine-tuning runs
    label: str  # as the paper's table heads it
    task: str | None
    metric: str  # a task metric, or "mlm_perplexity" (held-out, from the pre-training run)
    split: str = "validation"
    finetuning: Mapping[str, Any] = field(default_factory=dict)  # FineTuningRecipe.replace's changes (Table 8)

    @property
    def run(self) -> str:
        """The fine-tuning run this column reads: columns of one task share a run (MRPC's accuracy and F1 are one
        fine-tuning's), but one that fine-tunes differently (feature-based) needs a run of its own."""
        return self.key if self.finetuning else str(self.task)


@dataclass(frozen=True)
class Variant:
    """One row: what its pre-training (or fine-tuning) changes, relative to the arguments the user gives."""

    key: str  # directory name
    label: str  # as the paper's table names it
    pretraining: Mapping[str, Any] = field(default_factory=dict)  # PreTrainingRecipe.replace's changes
    finetuning: Mapping[str, Any] = field(default_factory=dict)  # FineTuningRecipe.replace's changes
    weights_of: str | None = None  # fine-tune this variant's pre-trained model instead of pre-training its own
    random_init: bool = False  # no pre-training: the architecture of `weights_of`, its weights drawn at random


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    source: str  # where the paper prints it
    variants: tuple[Variant, ...]
    columns: tuple[Column, ...]
    paper: Mapping[str, Mapping[str, float]]  # variant key -> column key -> the paper's number (percent)
    note: str = ""

    def __post_init__(self):  # the tables are module-wide: read-only
        object.__setattr__(self, "paper", MappingProxyType({k: MappingProxyType(v) for k, v in self.paper.items()}))

    def variant(self, key: str) -> Variant:
        return next(v for v in self.variants if v.key == key)


def _size(layers: int, hidden: int, heads: int) -> Variant:
    overrides = dict(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden
    )
    return Variant(
        f"L{layers}_H{hidden}_A{heads}",
        f"L={layers}, H={hidden}, A={heads}",
        pretraining=MappingProxyType({"model_overrides": json.dumps(overrides)}),
    )


def _masking(mask: int, same: int, random: int) -> Variant:
    return Variant(
        f"mask{mask}_same{same}_rnd{random}",
        f"{mask}% / {same}% / {random}%",
        pretraining=MappingProxyType({"mask_replace_prob": mask / 100, "random_replace_prob": random / 100}),
    )


MNLI_M = Column("mnli", "MNLI-m", "mnli", "accuracy", split="validation_matched")
QNLI = Column("qnli", "QNLI", "qnli", "accuracy")
MRPC = Column("mrpc", "MRPC", "mrpc", "accuracy")
SST2 = Column("sst2", "SST-2", "sst2", "accuracy")
SQUAD = Column("squad", "SQuAD F1", "squad", "squad_f1")
NER = Column("conll2003", "NER (F1)", "conll2003", "entity_f1")
# The feature set the paper uses for Table 8's feature-based column: the last four layers concatenated.
NER_FEATURES = Column(
    "conll2003_features",
    "NER feature-based (F1)",
    "conll2003",
    "entity_f1",
    finetuning=MappingProxyType({"features": "concat_last_four"}),
)

# Table 7: the feature sets and the paper's dev F1 of each, as the task registry keeps them.
_CONLL = get_task("conll2003")
TABLE7_FEATURES = tuple(
    (name, FEATURE_SETS[name].table7_row, result.value) for name, result in _CONLL.paper_feature_based.items()
)
TABLE7_FINETUNING = next(r.value for r in _CONLL.paper if r.model == "base" and r.split == "validation")

STUDIES: Mapping[str, Study] = MappingProxyType(
    {
        "table5": Study(
            "table5",
            "Ablation over the pre-training tasks",
            "Table 5 (dev, BERT-BASE)",
            variants=(
                Variant("mlm_nsp", "BERT (MLM + NSP)"),
                Variant("mlm", "No NSP", pretraining=MappingProxyType({"objective": "mlm"})),
                Variant("ltr", "LTR & No NSP", pretraining=MappingProxyType({"objective": "ltr"})),
                Variant("ltr_bilstm", "+ BiLSTM", finetuning=MappingProxyType({"head": "bilstm"}), weights_of="ltr"),
            ),
            columns=(MNLI_M, QNLI, MRPC, SST2, SQUAD),
            paper={
                "mlm_nsp": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst2": 92.7, "squad": 88.5},
                "mlm": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst2": 92.6, "squad": 87.9},
                "ltr": {"mnli": 82.1, "qnli": 84.3, "mrpc": 77.5, "sst2": 92.1, "squad": 77.8},
                "ltr_bilstm": {"mnli": 82.1, "qnli": 84.1, "mrpc": 75.7, "sst2": 91.6, "squad": 84.9},
            },
            note="The paper's ordering: MLM + NSP >= No NSP > LTR & No NSP; the BiLSTM recovers part of LTR's loss on "
            "SQuAD only.",
        ),
        "table6": Study(
            "table6",
            "Ablation over model size",
            "Table 6 (dev, MLM perplexity of held-out training data)",
            variants=tuple(
                _size(*s)
                for s in ((3, 768, 12), (6, 768, 3), (6, 768, 12), (12, 768, 12), (12, 1024, 16), (24, 1024, 16))
            ),
            columns=(Column("mlm_ppl", "LM (ppl)", None, "mlm_perplexity"), MNLI_M, MRPC, SST2),
            paper={
                "L3_H768_A12": {"mlm_ppl": 5.84, "mnli": 77.9, "mrpc": 79.8, "sst2": 88.4},
                "L6_H768_A3": {"mlm_ppl": 5.24, "mnli": 80.6, "mrpc": 82.2, "sst2": 90.7},
                "L6_H768_A12": {"mlm_ppl": 4.68, "mnli": 81.9, "mrpc": 84.8, "sst2": 91.3},
                "L12_H768_A12": {"mlm_ppl": 3.99, "mnli": 84.4, "mrpc": 86.7, "sst2": 92.9},
                "L12_H1024_A16": {"mlm_ppl": 3.54, "mnli": 85.7, "mrpc": 86.9, "sst2": 93.3},
                "L24_H1024_A16": {"mlm_ppl": 3.23, "mnli": 86.6, "mrpc": 87.8, "sst2": 93.7},
            },
            note="The paper: larger models are better on every task, even MRPC's 3,600 training examples. Pass "
            "--sizes to study other sizes at a smaller budget.",
        ),
        "table7": Study(
            "table7",
            "Feature-based approach on CoNLL-2003 NER",
            "Table 7 (dev F1, BERT-BASE)",
            variants=(
                Variant("finetune", "Fine-tuning approach"),
                *(
                    Variant(name, label, finetuning=MappingProxyType({"features": name}), weights_of="finetune")
                    for name, label, _ in TABLE7_FEATURES
                ),
            ),
            columns=(NER,),
            paper={
                "finetune": {"conll2003": TABLE7_FINETUNING},
                **{name: {"conll2003": value} for name, _, value in TABLE7_FEATURES},
            },
            note="One pre-trained model; every feature-based row freezes it and trains a two-layer BiLSTM on the "
            "features. The paper: concatenating the last four layers is within 0.3 F1 of fine-tuning.",
        ),
        "table8": Study(
            "table8",
            "Ablation over the masking procedure ([MASK] / same / random)",
            "Table 8 (dev)",
            variants=tuple(
                _masking(*m) for m in ((80, 10, 10), (100, 0, 0), (80, 0, 20), (80, 20, 0), (0, 20, 80), (0, 0, 100))
            ),
            columns=(Column("mnli", "MNLI", "mnli", "accuracy", split="validation_matched"), NER, NER_FEATURES),
            paper={
                "mask80_same10_rnd10": {"mnli": 84.2, "conll2003": 95.4, "conll2003_features": 94.9},
                "mask100_same0_rnd0": {"mnli": 84.3, "conll2003": 94.9, "conll2003_features": 94.0},
                "mask80_same0_rnd20": {"mnli": 84.4, "conll2003": 95.2, "conll2003_features": 94.6},
                "mask80_same20_rnd0": {"mnli": 84.1, "conll2003": 95.2, "conll2003_features": 94.7},
                "mask0_same20_rnd80": {"mnli": 83.7, "conll2003": 94.8, "conll2003_features": 94.6},
                "mask0_same0_rnd100": {"mnli": 83.6, "conll2003": 94.9, "conll2003_features": 94.6},
            },
            note="The paper: fine-tuning is robust to the mix; the feature-based approach suffers most with [MASK] "
            "only (a mismatch between pre-training and use).",
        ),
        "pretraining": Study(
            "pretraining",
            "Does our pre-training help? Pre-trained against randomly initialised",
            "not in the paper",
            variants=(
                Variant("pretrained", "pre-trained (MLM + NSP)"),
                Variant("random", "random initialisation", weights_of="pretrained", random_init=True),
            ),
            columns=(SST2, MRPC, Column("mrpc_f1", "MRPC F1", "mrpc", "f1")),
            paper={},
            note="The same architecture, vocabulary and fine-tuning protocol; only the initial weights differ.",
        ),
    }
)


def get_study(name: str) -> Study:
    if name not in STUDIES:
        raise ConfigurationError(f"Unknown study {name!r}; choose one of: {', '.join(STUDIES)}.")
    return STUDIES[name]
