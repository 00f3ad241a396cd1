"""The paper's fine-tuning tasks, each described once, as data.

The eleven tasks of section 4 (GLUE's eight, SQuAD v1.1 and v2.0, SWAG) and CoNLL-2003 NER (section 5.3); WNLI is
registered for complete GLUE submissions but ``in_glue_average=False``, as the paper leaves it out. A `Task`'s
``kind`` owns what differs between kinds; the rest is data (``label_names`` in the Hub's id order, results in percent
as printed). ``eval_splits`` are labelled (CoNLL's "test" is eng.testb); ``test_splits`` hide labels (-1).

Departures and choices:
- The paper picks GLUE's learning rate on dev from {5e-5, 4e-5, 3e-5, 2e-5} (``grid``); ``defaults`` holds 2e-5,
  the most common winner for BASE.
- SQuAD v2.0: the paper's dev numbers tune tau on dev (``squad_best_f1``); ``main_metric`` is ``squad_f1`` (tau = 0),
  so runs compare without tuning.
- SWAG's and CoNLL's ``max_seq_length`` (128) and CoNLL's hyper-parameters (the grid's middle) are not in the paper.
- Feature-based (Table 7) trains a new BiLSTM with no hyper-parameters given; fine-tuning's rates are far below
  LSTMs', so `FEATURE_BASED_GRID` (Adam's default 1e-3, our choice) replaces the grid when the encoder is frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..model.bilstm_heads import FEATURE_SETS
from .kinds import CLASSIFICATION, KINDS, MULTIPLE_CHOICE, REGRESSION, SPAN, TOKEN_CLASSIFICATION, TaskKind


@dataclass(frozen=True)
class Metric:
    """A task's metric: what it measures, its name for readers, and the Hub metric id of a card's model-index."""

    description: str
    label: str
    hub_id: str


# Metric names used in `Task.metrics`. Each evaluation returns fractions in [0, 1] (correlations in [-1, 1]).
METRICS: Mapping[str, Metric] = MappingProxyType(
    {
        "accuracy": Metric("fraction of examples whose predicted label is the gold label", "Accuracy", "accuracy"),
        "f1": Metric("F1 of the positive class (label id 1), as GLUE scores MRPC and QQP", "F1", "f1"),
        "matthews_correlation": Metric(
            "Matthews correlation coefficient (CoLA)", "Matthews correlation", "matthews_correlation"
        ),
        "pearson": Metric(
            "Pearson correlation of predicted and gold scores (STS-B)", "Pearson correlation", "pearsonr"
        ),
        "spearman": Metric(
            "Spearman rank correlation of predicted and gold scores (STS-B)", "Spearman correlation", "spearmanr"
        ),
        "squad_exact_match": Metric(
            "official SQuAD exact match after normalisation, max over gold answers", "Exact match", "exact_match"
        ),
        "squad_f1": Metric("official SQuAD bag-of-tokens F1 after normalisation, max over gold answers", "F1", "f1"),
        "squad_best_exact_match": Metric(
            "SQuAD v2.0 exact match at the null-score threshold best on the set",
            "Exact match, null threshold tuned on this split",
            "best_exact",
        ),
        "squad_best_f1": Metric(
            "SQuAD v2.0 F1 at the null-score threshold that maximises it on the set",
            "F1, null threshold tuned on this split",
            "best_f1",
        ),
        "squad_has_ans_f1": Metric(
            "SQuAD v2.0 F1 on the answerable questions only", "F1 on answerable questions", "HasAns_f1"
        ),
        "squad_no_ans_f1": Metric(
            "SQuAD v2.0 F1 on the unanswerable questions only", "F1 on unanswerable questions", "NoAns_f1"
        ),
        "entity_f1": Metric(
            "CoNLL entity-level F1 (an entity counts when its type and exact span match; IOB2 tags)", "Entity F1", "f1"
        ),
        "entity_precision": Metric("CoNLL entity-level precision", "Entity precision", "precision"),
        "entity_recall": Metric("CoNLL entity-level recall", "Entity recall", "recall"),
    }
)

# Paper Table 1: the GLUE score averaged over the eight tasks (WNLI left out).
PAPER_GLUE_AVERAGE: Mapping[str, float] = MappingProxyType({"base": 79.6, "large": 82.1})

# The learning rates searched when the encoder is frozen (see the module docstring).
FEATURE_BASED_GRID: Mapping[str, tuple] = MappingProxyType({"learning_rate": (1e-3,)})


@dataclass(frozen=True)
class Result:
    """One reported number: ``value`` (percent, as printed) of ``metric`` on ``split`` for model ``model``."""

    model: str  # "base" | "large" | a checkpoint name
    split: str  # canonical split name ("validation", "test", "test_matched", ...)
    metric: str  # a name in METRICS
    value: float
    source: str  # where the number is printed


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Task:
    """One fine-tuning task. See the module docstring for what each group of fields is for."""

    name: str
    kind: TaskKind
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str
    hub_id: str
    hub_config: str | None
    # Names a canonical column (or "label" / "idx") may have in files, in order of preference.
    source_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    # The task's original distribution: its format and the file names per canonical split.
    original_format: str = "glue_tsv"  # "glue_tsv" | "squad_json" | "swag_csv" | "conll"
    original_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    # GLUE's CoLA train/dev files have no header: their column names, in order.
    headerless_columns: tuple[str, ...] | None = None
    eval_splits: tuple[str, ...] = ("validation",)
    test_splits: tuple[str, ...] = ("test",)
    label_range: tuple[float, float] | None = None  # regression: the gold scores' range
    num_choices: int | None = None  # multiple_choice
    allows_no_answer: bool = False  # span: SQuAD v2.0 has unanswerable questions
    defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)
    grid: Mapping[str, tuple] = field(default_factory=dict, hash=False)
    paper: tuple[Result, ...] = ()
    other_reported: tuple[Result, ...] = ()
    # The feature-based approach: {feature set name (bert_repro.model.bilstm_heads.FEATURE_SETS): Result}.
    paper_feature_based: Mapping[str, Result] = field(default_factory=dict, hash=False)
    glue_submission_names: Mapping[str, str] | None = field(default=None, hash=False)
    # GLUE server test predictions: "names" (MNLI, QNLI, RTE), "ids" (the other classifiers), "float" (STS-B).
    submission_labels: str | None = None
    in_glue_average: bool = False
    display_name: str = ""  # the task as people write it ("GLUE MRPC", "SQuAD v1.1"): model cards, tables
    description: str = ""

    @property
    def splits(self) -> tuple[str, ...]:
        """Every canonical split: train, then the evaluation splits, then the hidden-label test splits."""
        return tuple(dict.fromkeys(("train",) + self.eval_splits + self.test_splits))

    @property
    def num_labels(self) -> int:
        """Output size of the task head: classes, 1 (regression), 2 (span start/end); its kind decides."""
        return self.kind.num_labels(self)

    @property
    def id2label(self) -> dict[int, str] | None:
        return None if self.label_names is None else dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.label_names is None else {name: i for i, name in enumerate(self.label_names)}

    def glue_submission_name(self, split: str = "test") -> str:
        """The file name GLUE's server expects for the predictions on ``split`` ("MRPC.tsv", "MNLI-m.tsv")."""
        names = self.glue_submission_names or {}
        if split not in names:
            raise KeyError(f"{self.name} has no GLUE submission file for split {split!r}; known: {dict(names)}")
        return names[split]

    def format_submission_value(self, prediction: float) -> str:
        """One prediction as GLUE's server reads it: a label name, an integer id, or a score."""
        if self.submission_labels == "names":
            return self.label_names[int(prediction)]
        if self.submission_labels == "ids":
            return str(int(prediction))
        if self.submission_labels == "float":
            return f"{float(prediction):.3f}"
        raise ValueError(f"{self.name} is not a GLUE task: it has no submission format")


# Shared pieces of the registry.

_GLUE_FILES = {"train": ("train.tsv",), "validation": ("dev.tsv",), "test": ("test.tsv",)}
_GLUE_DEFAULTS = {
    "learning_rate": 2e-5,
    "num_train_epochs": 3,
    "per_device_train_batch_size": 32,
    "max_seq_length": 128,
    "warmup_proportion": 0.1,  # reference run_classifier.py
    "weight_decay": 0.01,
}


def _defaults(**changes: Any) -> Mapping[str, Any]:
    """GLUE's defaults with ``changes`` (SWAG and CoNLL-2003 differ in one value, SQuAD in more)."""
    return _frozen({**_GLUE_DEFAULTS, **changes})


_GLUE_GRID = {"learning_rate": (5e-5, 4e-5, 3e-5, 2e-5)}
_PAPER_GRID = {
    "per_device_train_batch_size": (16, 32),
    "learning_rate": (5e-5, 3e-5, 2e-5),
    "num_train_epochs": (2, 3, 4),
}
_TABLE1 = "paper Table 1 (GLUE test server)"
_HF_RUN_GLUE = "transformers run_glue README, bert-base-cased, dev"


def _paper(metric: str, base: float, large: float, split: str = "test", source: str = _TABLE1) -> tuple[Result, ...]:
    return (Result("base", split, metric, base, source), Result("large", split, metric, large, source))


def _hf_dev(metric: str, value: float, split: str = "validation") -> Result:
    return Result("bert-base-cased", split, metric, value, _HF_RUN_GLUE)


def _glue(
    name: str,
    text_columns: tuple[str, ...],
    label_names: tuple[str, ...] | None,
    metrics: tuple[str, ...],
    main_metric: str,
    source_columns: Mapping[str, tuple[str, ...]],
    submission_file: str,
    submission_labels: str,
    **overrides: Any,
) -> Task:
    fields: dict[str, Any] = {
        "name": name,
        "kind": CLASSIFICATION if label_names else REGRESSION,
        "text_columns": text_columns,
        "label_names": label_names,
        "metrics": metrics,
        "main_metric": main_metric,
        "hub_id": "nyu-mll/glue",
        "hub_config": name,
        "source_columns": _frozen(source_columns),
        "original_format": "glue_tsv",
        "original_files": _frozen(_GLUE_FILES),
        "defaults": _frozen(_GLUE_DEFAULTS),
        "grid": _frozen(_GLUE_GRID),
        "glue_submission_names": _frozen({"test": submission_file}),
        "submission_labels": submission_labels,
        "in_glue_average": True,
    }
    fields.update(overrides)
    return Task(**fields)


# SQuAD's settings in the reference run_squad.py (with GLUE's warm-up and weight decay).
_SQUAD_DEFAULTS = dict(
    learning_rate=5e-5, max_seq_length=384, doc_stride=128, max_query_length=64, max_answer_length=30
)


_SPAN_SOURCES = {"context": ("context", "paragraph"), "answers": ("answers",), "id": ("id",), "title": ("title",)}

# The registry.

_TASK_LIST: tuple[Task, ...] = (
    _glue(
        "mnli",
        ("premise", "hypothesis"),
        ("entailment", "neutral", "contradiction"),
        ("accuracy",),
        "accuracy",
        {
            "premise": ("premise", "sentence1"),
            "hypothesis": ("hypothesis", "sentence2"),
            "label": ("label", "gold_label"),
        },
        "MNLI-m.tsv",
        "names",
        eval_splits=("validation_matched", "validation_mismatched"),
        test_splits=("test_matched", "test_mismatched"),
        original_files=_frozen(
            {
                "train": ("train.tsv",),
                "validation_matched": ("dev_matched.tsv",),
                "validation_mismatched": ("dev_mismatched.tsv",),
                "test_matched": ("test_matched.tsv",),
                "test_mismatched": ("test_mismatched.tsv",),
            }
        ),
        glue_submission_names=_frozen({"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}),
        paper=_paper("accuracy", 84.6, 86.7, "test_matched") + _paper("accuracy", 83.4, 85.9, "test_mismatched"),
        other_reported=(
            _hf_dev("accuracy", 83.91, "validation_matched"),
            _hf_dev("accuracy", 84.10, "validation_mismatched"),
        ),
        display_name="GLUE MNLI",
        description="Multi-Genre NLI: does the premise entail, contradict or neither the hypothesis?",
    ),
    _glue(
        "qqp",
        ("question1", "question2"),
        ("not_duplicate", "duplicate"),
        ("accuracy", "f1"),
        "f1",
        {"label": ("label", "is_duplicate")},
        "QQP.tsv",
        "ids",
        paper=_paper("f1", 71.2, 72.1),
        other_reported=(_hf_dev("f1", 87.49),),
        display_name="GLUE QQP",
        description="Quora Question Pairs: are the two questions duplicates?",
    ),
    _glue(
        "qnli",
        ("question", "sentence"),
        ("entailment", "not_entailment"),
        ("accuracy",),
        "accuracy",
        {},
        "QNLI.tsv",
        "names",
        paper=_paper("accuracy", 90.5, 92.7),
        other_reported=(_hf_dev("accuracy", 90.66),),
        display_name="GLUE QNLI",
        description="Question NLI (from SQuAD): does the sentence contain the answer to the question?",
    ),
    _glue(
        "sst2",
        ("sentence",),
        ("negative", "positive"),
        ("accuracy",),
        "accuracy",
        {},
        "SST-2.tsv",
        "ids",
        paper=_paper("accuracy", 93.5, 94.9),
        other_reported=(_hf_dev("accuracy", 92.32),),
        display_name="GLUE SST-2",
        description="Stanford Sentiment Treebank, binary sentence sentiment.",
    ),
    _glue(
        "cola",
        ("sentence",),
        ("unacceptable", "acceptable"),
        ("matthews_correlation",),
        "matthews_correlation",
        {"label": ("label", "is_acceptable")},
        "CoLA.tsv",
        "ids",
        headerless_columns=("source", "label", "author_mark", "sentence"),
        paper=_paper("matthews_correlation", 52.1, 60.5),
        other_reported=(_hf_dev("matthews_correlation", 56.53),),
        display_name="GLUE CoLA",
        description="Corpus of Linguistic Acceptability: is the sentence grammatical?",
    ),
    _glue(
        "stsb",
        ("sentence1", "sentence2"),
        None,
        ("pearson", "spearman"),
        "spearman",
        {"label": ("label", "score")},
        "STS-B.tsv",
        "float",
        label_range=(0.0, 5.0),
        paper=_paper("spearman", 85.8, 86.5),
        other_reported=(_hf_dev("pearson", 88.64),),
        display_name="GLUE STS-B",
        description="Semantic Textual Similarity Benchmark: a similarity score from 0 to 5 (regression).",
    ),
    _glue(
        "mrpc",
        ("sentence1", "sentence2"),
        ("not_equivalent", "equivalent"),
        ("accuracy", "f1"),
        "f1",
        {
            "sentence1": ("sentence1", "#1 String"),
            "sentence2": ("sentence2", "#2 String"),
            "label": ("label", "Quality"),
        },
        "MRPC.tsv",
        "ids",
        paper=_paper("f1", 88.9, 89.3),
        other_reported=(
            _hf_dev("f1", 88.85),
            Result("base", "validation", "accuracy", 84.55, "reference-code README (84-88 across reruns)"),
        ),
        display_name="GLUE MRPC",
        description="Microsoft Research Paraphrase Corpus: are the two sentences paraphrases?",
    ),
    _glue(
        "rte",
        ("sentence1", "sentence2"),
        ("entailment", "not_entailment"),
        ("accuracy",),
        "accuracy",
        {},
        "RTE.tsv",
        "names",
        paper=_paper("accuracy", 66.4, 70.1),
        other_reported=(_hf_dev("accuracy", 65.70),),
        display_name="GLUE RTE",
        description="Recognizing Textual Entailment (RTE1-3, RTE5), two classes.",
    ),
    _glue(
        "wnli",
        ("sentence1", "sentence2"),
        ("not_entailment", "entailment"),
        ("accuracy",),
        "accuracy",
        {},
        "WNLI.tsv",
        "ids",
        in_glue_average=False,
        display_name="GLUE WNLI",
        description="Winograd NLI; not in the paper's GLUE average (GLUE's baseline predicts the majority).",
    ),
    Task(
        name="squad",
        kind=SPAN,
        text_columns=("question", "context"),
        label_names=None,
        metrics=("squad_exact_match", "squad_f1"),
        main_metric="squad_f1",
        hub_id="rajpurkar/squad",
        hub_config=None,
        source_columns=_frozen(_SPAN_SOURCES),
        original_format="squad_json",
        original_files=_frozen({"train": ("train-v1.1.json",), "validation": ("dev-v1.1.json",)}),
        test_splits=(),
        defaults=_defaults(**_SQUAD_DEFAULTS, n_best_size=20),
        grid=_frozen(_PAPER_GRID),
        paper=_paper("squad_exact_match", 80.8, 84.1, "validation", "paper Table 2")
        + _paper("squad_f1", 88.5, 90.9, "validation", "paper Table 2"),
        other_reported=(
            Result("base", "validation", "squad_exact_match", 81.25, "reference-code README"),
            Result("base", "validation", "squad_f1", 88.41, "reference-code README"),
        ),
        display_name="SQuAD v1.1",
        description="SQuAD v1.1: the answer is a span of the paragraph.",
    ),
    Task(
        name="squad_v2",
        kind=SPAN,
        text_columns=("question", "context"),
        label_names=None,
        metrics=(
            "squad_exact_match",
            "squad_f1",
            "squad_best_exact_match",
            "squad_best_f1",
            "squad_has_ans_f1",
            "squad_no_ans_f1",
        ),
        main_metric="squad_f1",
        hub_id="rajpurkar/squad_v2",
        hub_config=None,
        source_columns=_frozen(_SPAN_SOURCES),
        original_format="squad_json",
        original_files=_frozen({"train": ("train-v2.0.json",), "validation": ("dev-v2.0.json",)}),
        test_splits=(),
        allows_no_answer=True,
        defaults=_defaults(**_SQUAD_DEFAULTS, n_best_size=20, num_train_epochs=2, per_device_train_batch_size=48),
        grid=_frozen(_PAPER_GRID),
        paper=(
            Result("large", "validation", "squad_best_exact_match", 78.7, "paper Table 3 (tau tuned on dev)"),
            Result("large", "validation", "squad_best_f1", 81.9, "paper Table 3 (tau tuned on dev)"),
        ),
        display_name="SQuAD v2.0",
        description="SQuAD v2.0: a span of the paragraph, or no answer.",
    ),
    Task(
        name="swag",
        kind=MULTIPLE_CHOICE,
        text_columns=("context",),
        label_names=("0", "1", "2", "3"),
        metrics=("accuracy",),
        main_metric="accuracy",
        hub_id="allenai/swag",
        hub_config="regular",
        source_columns=_frozen({"context": ("context", "sent1"), "question": ("question", "sent2")}),
        original_format="swag_csv",
        original_files=_frozen({"train": ("train.csv",), "validation": ("val.csv",), "test": ("test.csv",)}),
        num_choices=4,
        defaults=_defaults(per_device_train_batch_size=16),
        grid=_frozen(_PAPER_GRID),
        paper=_paper("accuracy", 81.6, 86.6, "validation", "paper Table 4"),
        display_name="SWAG",
        description="SWAG: which of four endings follows? Each input is `context [SEP] question + ending`.",
    ),
    Task(
        name="conll2003",
        kind=TOKEN_CLASSIFICATION,
        text_columns=("tokens",),
        label_names=("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"),
        metrics=("entity_f1", "entity_precision", "entity_recall", "accuracy"),
        main_metric="entity_f1",
        hub_id="eriktks/conll2003",
        hub_config=None,
        source_columns=_frozen({"id": ("id",), "ner_tags": ("ner_tags",)}),
        original_format="conll",
        original_files=_frozen(
            {
                "train": ("eng.train", "train.txt"),
                "validation": ("eng.testa", "valid.txt", "dev.txt"),
                "test": ("eng.testb", "test.txt"),
            }
        ),
        eval_splits=("validation", "test"),
        test_splits=(),
        defaults=_defaults(learning_rate=3e-5),
        grid=_frozen(_PAPER_GRID),
        paper=_paper("entity_f1", 96.4, 96.6, "validation", "paper Table 7")
        + _paper("entity_f1", 92.4, 92.8, "test", "paper Table 7"),
        paper_feature_based=_frozen(
            {
                # Table 7, "Feature-based approach (BERT-BASE)": dev F1, the frozen encoder's features into a
                # two-layer BiLSTM; the fine-tuning approach's dev F1 (96.4 for BASE) is in `paper` above.
                name: Result(
                    "base",
                    "validation",
                    "entity_f1",
                    value,
                    f"paper Table 7 (feature-based: {FEATURE_SETS[name].table7_row})",
                )
                for name, value in (
                    ("embeddings", 91.0),
                    ("second_to_last_hidden", 95.6),
                    ("last_hidden", 94.9),
                    ("weighted_sum_last_four", 95.9),
                    ("concat_last_four", 96.1),
                    ("weighted_sum_all", 95.5),
                )
            }
        ),
        display_name="CoNLL-2003",
        description="CoNLL-2003 English NER, IOB2 tags; the paper tags each word's first sub-token (cased).",
    ),
)

TASKS: Mapping[str, Task] = MappingProxyType({task.name: task for task in _TASK_LIST})

GLUE_TASKS: tuple[str, ...] = tuple(t.name for t in _TASK_LIST if t.hub_id == "nyu-mll/glue")


def get_task(name: str | Task) -> Task:
    """The registered task called ``name`` (case-insensitive; "sst-2", "sts-b", "squad_v1.1" also work)."""
    if isinstance(name, Task):
        return name
    key = name.strip().lower().replace("-", "")
    key = {
        "squadv1.1": "squad",
        "squad_v1.1": "squad",
        "squadv2": "squad_v2",
        "squadv2.0": "squad_v2",
        "squad_v2.0": "squad_v2",
        "conll": "conll2003",
        "ner": "conll2003",
    }.get(key, key)
    if key not in TASKS:
        raise KeyError(f"Unknown task {name!r}. Known tasks: {', '.join(TASKS)}.")
    return TASKS[key]


__all__ = [
    "FEATURE_BASED_GRID",
    "GLUE_TASKS",
    "KINDS",
    "METRICS",
    "Metric",
    "PAPER_GLUE_AVERAGE",
    "TASKS",
    "Result",
    "Task",
    "get_task",
]
