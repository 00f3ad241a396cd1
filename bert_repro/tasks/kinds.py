"""The kinds of fine-tuning task in the paper, one object each: everything that differs between kinds.

BERT's fine-tuning (section 4, figure 4) changes only the output layer and the input encoding from task to task.
A `TaskKind` owns its kind's head, canonical columns (`bert_repro.tasks.columns`), encoding, decoding, scoring
(`bert_repro.tasks.metrics`) and Hub texts: `SentenceClassification` and `SentenceRegression` (GLUE), `SpanExtraction`
(SQuAD), `MultipleChoice` (SWAG), `TokenClassification` (CoNLL-2003, section 5.3).
A new kind is a new subclass here; no other module compares kinds.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import datasets
import numpy as np
from transformers import DataCollatorForMultipleChoice, DataCollatorForTokenClassification, DataCollatorWithPadding

from ..model.bilstm_heads import (
    BertReproForQuestionAnsweringWithBiLSTM,
    BertReproForSequenceClassificationWithBiLSTM,
    BertReproForTokenClassificationWithBiLSTM,
)
from ..model.modeling_bert_repro import (
    BertReproForMultipleChoice,
    BertReproForQuestionAnswering,
    BertReproForSequenceClassification,
    BertReproForTokenClassification,
)
from . import columns as checked
from . import metrics as metric_functions
from . import squad
from .columns import RawSplit, TaskDataError

if TYPE_CHECKING:
    from .registry import Task

_STRING = datasets.Value("string")

# The heads a kind can put on the encoder (the fine-tuning recipe's --head), with what each is.
HEADS: Mapping[str, str] = MappingProxyType(
    {
        "linear": "the paper's output layer on the encoder (section 4, figure 4)",
        "bilstm": "a randomly initialised two-layer BiLSTM before the output layer (paper Table 5, '+ BiLSTM'; the "
        "feature-based approach of Table 7 feeds its features to it)",
    }
)


class EncodingSettings(Protocol):
    """The settings ``encode`` and ``decode`` read (`bert_repro.training.finetuning.recipe` has them)."""

    max_seq_length: int
    doc_stride: int  # span: a new window every doc_stride tokens
    max_query_length: int  # span: question tokens kept
    n_best_size: int  # span: best starts x best ends considered
    max_answer_length: int  # span: longest answer in tokens
    num_proc: int | None


class TaskKind(abc.ABC):
    """What every task of one kind shares. Subclasses set the class attributes and implement each method."""

    name: str  # the kind's name, for messages and listings
    head_class: type  # a bert_repro model class: the paper's output layer
    bilstm_head_class: type | None = None  # the same output with a BiLSTM before it (None: no such head)
    auto_class: str  # the transformers Auto class that loads that head
    pipeline_tag: str  # the Hub's task id
    pipeline_task: str | None  # the transformers pipeline, None where there is none
    head_description: str  # the model card's words for the head
    uses_pooler: bool  # whether the head reads the pooled [CLS] output
    # Columns ``encode`` keeps for ``decode`` that are not model inputs.
    decode_columns: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<task kind {self.name}>"

    # The head ------------------------------------------------------------------------------------------

    def model_class(self, head: str | None = None, *, feature_based: bool = False) -> type:
        """The model class of ``head`` (a key of `HEADS`). None: the paper's choice, "bilstm" for the feature-based
        approach (section 5.3: the features feed a BiLSTM), else "linear". A ValueError says what is possible."""
        head = head or ("bilstm" if feature_based else "linear")
        if head not in HEADS:
            raise ValueError(f"Unknown head {head!r}; choose one of: {', '.join(HEADS)}.")
        if head == "linear":
            if feature_based:
                raise ValueError(
                    "The feature-based approach feeds the frozen encoder's features to a BiLSTM (paper "
                    "section 5.3): leave out --head linear, or drop --features to fine-tune."
                )
            return self.head_class
        if self.bilstm_head_class is None:
            kinds = ", ".join(k.name for k in KINDS if k.bilstm_head_class is not None)
            raise ValueError(
                f"{self.name} tasks have no BiLSTM head (there is one for {kinds}); "
                "use the linear head, without --features."
            )
        return self.bilstm_head_class

    def num_labels(self, task: Task) -> int:
        """Output size of the head: one logit per label."""
        return len(task.label_names)

    def head_parameters(self, hidden_size: int, num_labels: int) -> int:
        """Parameters of the head on top of the encoder (and pooler): by default a linear layer per label."""
        return (hidden_size + 1) * num_labels

    # The data ------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def features(self, task: Task) -> datasets.Features:
        """The canonical columns of every split of ``task``, whatever the source."""

    @abc.abstractmethod
    def canonicalise(self, task: Task, split: str, raw: RawSplit) -> dict[str, list]:
        """The canonical columns of one split, from the columns a file holds; `TaskDataError` on bad input."""

    def majority_predictions(self, task: Task, train: datasets.Dataset, split: datasets.Dataset) -> Any:
        """Predictions for ``split`` that always give the most frequent label of ``train`` (of a tie, the smaller
        label id), to score as the baseline a model must beat; None where the kind has no such baseline."""
        return None

    def labelled(self, task: Task, split: datasets.Dataset) -> bool:
        """Whether ``split`` carries gold labels (hidden-label test rows have label -1)."""
        return len(split) > 0 and min(split["label"]) >= 0

    # The model inputs ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def encode(
        self, task: Task, split: datasets.Dataset, tokenizer: Any, settings: EncodingSettings, *, train: bool
    ) -> datasets.Dataset:
        """Canonical rows -> the model's inputs (and ``labels``; ``decode_columns`` for evaluation)."""

    def collator(self, tokenizer: Any) -> Any:
        """Batches of encoded rows, padded."""
        return DataCollatorWithPadding(tokenizer)

    # The evaluation ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def decode(
        self, task: Task, logits: Any, raw: datasets.Dataset, encoded: datasets.Dataset, settings: EncodingSettings
    ) -> Any:
        """The model's outputs on ``encoded`` -> predictions for the rows of ``raw``, in the task's own terms."""

    @abc.abstractmethod
    def score(self, task: Task, raw: datasets.Dataset, predictions: Any) -> dict[str, float]:
        """The task's metrics (names in `bert_repro.tasks.registry.METRICS`) against the gold labels of ``raw``."""

    def ranking_metric(self, task: Task) -> str:
        """The metric runs are ranked by (and the paper's number is compared with)."""
        return task.main_metric

    # The Hub -------------------------------------------------------------------------------------------

    def card_labels(self, task: Task) -> tuple[str, ...] | None:
        """The labels the model card lists (None: none worth listing)."""
        return task.label_names

    @abc.abstractmethod
    def pipeline_example(self, task: Task) -> tuple[str, str]:
        """The model card's pipeline example: (variable name, the call on an example input)."""

    # Shared by the kinds -------------------------------------------------------------------------------

    @staticmethod
    def _map(split: datasets.Dataset, function: Any, settings: EncodingSettings, desc: str, **fn_kwargs: Any):
        columns = split.column_names
        return split.map(
            function, fn_kwargs=fn_kwargs, batched=True, num_proc=settings.num_proc, remove_columns=columns, desc=desc
        )

    def _tokens(self, function: Any, task: Task, split: datasets.Dataset, tokenizer: Any, settings: EncodingSettings):
        """``function(batch, tokenizer, task, max_len)`` over ``split``'s batches."""
        kwargs = {"tokenizer": tokenizer, "task": task, "max_len": settings.max_seq_length}
        return self._map(split, function, settings, f"{task.name} tokens", **kwargs)


# GLUE: one or two sentences -> a class or a score, from the pooled [CLS] output


def _encode_sentences(batch, tokenizer, task: Task, max_len: int):
    """`[CLS] A [SEP] (B [SEP])` with the label."""
    texts = [batch[c] for c in task.text_columns]
    encoded = tokenizer(*texts, truncation=True, max_length=max_len)
    encoded["labels"] = batch["label"]
    return encoded


_PAIR_EXAMPLE = (
    '{"text": "The company posted record profits this quarter.", '
    '"text_pair": "Profits at the company reached a record this quarter."}'
)


def _classifier_example(task: Task) -> tuple[str, str]:
    pair = len(task.text_columns) > 1
    return "classifier", f"classifier({_PAIR_EXAMPLE})" if pair else 'classifier("A gripping, well-acted film.")'


class SentenceClassification(TaskKind):
    """A class per sentence or sentence pair (MNLI, QQP, QNLI, SST-2, CoLA, MRPC, RTE, WNLI)."""

    name = "classification"
    head_class = BertReproForSequenceClassification
    bilstm_head_class = BertReproForSequenceClassificationWithBiLSTM
    auto_class = "AutoModelForSequenceClassification"
    pipeline_tag = pipeline_task = "text-classification"
    head_description = "a linear layer on the pooled [CLS] output, one logit per label"
    uses_pooler = True

    def _label_feature(self, task: Task) -> Any:
        return datasets.ClassLabel(names=list(task.label_names))

    def features(self, task: Task) -> datasets.Features:
        features = {column: _STRING for column in task.text_columns}
        features["label"] = self._label_feature(task)
        features["idx"] = datasets.Value("int32")
        return datasets.Features(features)

    def canonicalise(self, task: Task, split: str, raw: RawSplit) -> dict[str, list]:
        return checked.sentence_columns(task, split, raw)

    def majority_predictions(self, task, train, split):
        counts = Counter(train["label"])
        return np.full(len(split), max(counts, key=lambda label: (counts[label], -label)))

    def encode(self, task, split, tokenizer, settings, *, train):
        return self._tokens(_encode_sentences, task, split, tokenizer, settings)

    def decode(self, task, logits, raw, encoded, settings):
        return np.asarray(logits).argmax(-1)

    def score(self, task, raw, predictions):
        return metric_functions.compute(task.metrics, predictions, np.asarray(raw["label"]))

    def pipeline_example(self, task):
        return _classifier_example(task)


class SentenceRegression(SentenceClassification):
    """A score per sentence pair (STS-B): the same head with one output, trained with mean squared error."""

    name = "regression"
    head_description = "a linear layer on the pooled [CLS] output giving one score (regression)"

    def num_labels(self, task: Task) -> int:
        return 1

    def head_parameters(self, hidden_size, num_labels):
        return hidden_size + 1  # one score

    def _label_feature(self, task: Task) -> Any:
        return datasets.Value("float32")

    def canonicalise(self, task, split, raw):
        return checked.sentence_columns(task, split, raw, scores=True)

    def majority_predictions(self, task, train, split):
        return None  # scores, not classes

    def decode(self, task, logits, raw, encoded, settings):
        return np.asarray(logits).reshape(-1)


# SQuAD: the answer is a span of the paragraph (v2.0: or none)


class SpanExtraction(TaskKind):
    """Start and end vectors S and E over the paragraph's tokens (SQuAD v1.1 and v2.0, `bert_repro.tasks.squad`)."""

    name = "span"
    head_class = BertReproForQuestionAnswering
    bilstm_head_class = BertReproForQuestionAnsweringWithBiLSTM
    auto_class = "AutoModelForQuestionAnswering"
    pipeline_tag = pipeline_task = "question-answering"
    head_description = "two vectors S and E scoring each token as the start and the end of the answer span"
    uses_pooler = False
    decode_columns = ("example_id", "offset_mapping")

    def num_labels(self, task: Task) -> int:
        return 2  # a start and an end logit per token

    def features(self, task):
        return datasets.Features(
            {
                "id": _STRING,
                "title": _STRING,
                "context": _STRING,
                "question": _STRING,
                "answers": {"text": datasets.List(_STRING), "answer_start": datasets.List(datasets.Value("int32"))},
            }
        )

    def canonicalise(self, task, split, raw):
        columns = checked.span_columns(task, split, raw)
        if split == "train":
            columns = checked.drop_misaligned_answers(task, raw, columns)
            if not columns["id"]:
                raise TaskDataError(f"{raw.source}: no training question of {task.name} has an aligned answer.")
        return columns

    def labelled(self, task, split):
        return True  # an unanswerable question's gold answer is "no answer"

    def encode(self, task, split, tokenizer, settings, *, train):
        prepare = squad.prepare_train_features if train else squad.prepare_eval_features
        lengths = {name: getattr(settings, name) for name in ("max_seq_length", "doc_stride", "max_query_length")}
        return self._map(split, prepare, settings, f"{task.name} windows", tokenizer=tokenizer, **lengths)

    def decode(self, task, logits, raw, encoded, settings):
        start_logits, end_logits = logits
        # v2.0: the best non-null span of every question (threshold +inf) and its null-score difference, so that
        # the official best-threshold search can run; the default threshold (0) is applied in `score`.
        answers, null_diffs, _ = squad.postprocess_predictions(
            raw,
            encoded,
            start_logits,
            end_logits,
            n_best_size=settings.n_best_size,
            max_answer_length=settings.max_answer_length,
            version_2_with_negative=task.allows_no_answer,
            null_score_diff_threshold=float("inf"),
        )
        return {"answers": answers, "null_diffs": null_diffs}

    def score(self, task, raw, predictions):
        """SQuAD's scores are in percent, as the official scripts print them."""
        references = {i: a["text"] for i, a in zip(raw["id"], raw["answers"])}
        if not task.allows_no_answer:
            v1 = metric_functions.squad_v1(predictions["answers"], references)
            return {"squad_exact_match": v1["exact_match"], "squad_f1": v1["f1"]}
        diffs = predictions["null_diffs"]
        at_zero = {i: "" if diffs[i] > 0 else text for i, text in predictions["answers"].items()}
        plain = metric_functions.squad_v2(at_zero, references)  # null answer when s_null > best span
        best = metric_functions.squad_v2(predictions["answers"], references, na_probs=diffs)
        values = {
            "squad_exact_match": plain["exact"],
            "squad_f1": plain["f1"],
            "squad_best_exact_match": best["best_exact"],
            "squad_best_f1": best["best_f1"],
            # the official search's null_score_diff_threshold on this split (the paper's tau is minus it); 0.0
            # also when answering nothing scored best, where -inf gives squad_best_f1 and 0.0 gives squad_f1
            "squad_best_f1_threshold": best["best_f1_thresh"],
        }
        for theirs, ours in (("HasAns_f1", "squad_has_ans_f1"), ("NoAns_f1", "squad_no_ans_f1")):
            values[ours] = plain.get(theirs, float("nan"))  # absent when the split has no such question
        return {k: float(v) for k, v in values.items()}

    def ranking_metric(self, task):
        # v2.0: the paper's dev numbers use the null threshold tuned on dev
        return "squad_best_f1" if task.allows_no_answer else task.main_metric

    def head_parameters(self, hidden_size, num_labels):
        return 2 * hidden_size + 2  # S and E with their biases

    def pipeline_example(self, task):
        return "qa", 'qa(question="Where is the Eiffel Tower?", context="The Eiffel Tower is a landmark in Paris.")'


# SWAG: which ending follows?


def _encode_choices(batch, tokenizer, task: Task, max_len: int):
    """Each example -> num_choices pairs `[CLS] context [SEP] question + ending [SEP]`, regrouped per example."""
    n = task.num_choices or len(batch["endings"][0])
    firsts = [c for c in batch["context"] for _ in range(n)]
    seconds = [f"{q} {e}".strip() for q, endings in zip(batch["question"], batch["endings"]) for e in endings]
    flat = tokenizer(firsts, seconds, truncation=True, max_length=max_len)
    encoded = {k: [v[i : i + n] for i in range(0, len(v), n)] for k, v in flat.items()}
    encoded["labels"] = batch["label"]
    return encoded


class MultipleChoice(TaskKind):
    """One score per choice from the pooled [CLS] output, softmax over the choices (SWAG)."""

    name = "multiple_choice"
    head_class = BertReproForMultipleChoice
    auto_class = "AutoModelForMultipleChoice"
    pipeline_tag = "multiple-choice"
    pipeline_task = None  # transformers has no multiple-choice pipeline
    head_description = (
        "one score per choice from the pooled [CLS] output of "
        "`[CLS] context [SEP] ending [SEP]`, softmax over the choices"
    )
    uses_pooler = True

    def features(self, task):
        return datasets.Features(
            {
                "context": _STRING,
                "question": _STRING,
                "endings": datasets.List(_STRING),
                "label": datasets.ClassLabel(names=list(task.label_names)),
            }
        )

    def canonicalise(self, task, split, raw):
        return checked.choice_columns(task, split, raw)

    def encode(self, task, split, tokenizer, settings, *, train):
        return self._tokens(_encode_choices, task, split, tokenizer, settings)

    def collator(self, tokenizer):
        return DataCollatorForMultipleChoice(tokenizer)

    # The best-scoring choice, scored as a class: the classifier's own.
    decode, score = SentenceClassification.decode, SentenceClassification.score

    def head_parameters(self, hidden_size, num_labels):
        return hidden_size + 1  # one score, whatever the number of choices

    def card_labels(self, task):
        return None  # the labels are the choices' positions

    def pipeline_example(self, task):
        return _classifier_example(task)  # shown only where there is a pipeline


# CoNLL-2003 NER: a tag per word


def _encode_words(batch, tokenizer, task: Task, max_len: int):
    """Words -> sub-tokens; the label sits on the first sub-token of each word, -100 elsewhere (paper 5.3)."""
    encoded = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_len)
    labels = []
    for i, tags in enumerate(batch["ner_tags"]):
        row, previous = [], None
        for word in encoded.word_ids(i):
            row.append(tags[word] if word is not None and word != previous else -100)
            previous = word
        labels.append(row)
    encoded["labels"] = labels
    return encoded


class TokenClassification(TaskKind):
    """A tag per word, predicted at its first sub-token (CoNLL-2003 NER, paper section 5.3)."""

    name = "token_classification"
    head_class = BertReproForTokenClassification
    bilstm_head_class = BertReproForTokenClassificationWithBiLSTM
    auto_class = "AutoModelForTokenClassification"
    pipeline_tag = pipeline_task = "token-classification"
    head_description = "a linear layer on each word's first sub-token, one logit per tag"
    uses_pooler = False

    def features(self, task):
        return datasets.Features(
            {
                "id": _STRING,
                "tokens": datasets.List(_STRING),
                "ner_tags": datasets.List(datasets.ClassLabel(names=list(task.label_names))),
            }
        )

    def canonicalise(self, task, split, raw):
        return checked.token_columns(task, split, raw)

    def labelled(self, task, split):
        return True

    def encode(self, task, split, tokenizer, settings, *, train):
        return self._tokens(_encode_words, task, split, tokenizer, settings)

    def collator(self, tokenizer):
        return DataCollatorForTokenClassification(tokenizer)

    def decode(self, task, logits, raw, encoded, settings):
        """The tag at each word's first sub-token (the positions whose label is not -100)."""
        ids = np.asarray(logits).argmax(-1)
        return [
            [task.label_names[p] for p, gold in zip(row, labels) if gold != -100]
            for row, labels in zip(ids, encoded["labels"])
        ]

    def score(self, task, raw, predictions):
        gold = [[task.label_names[t] for t in tags] for tags in raw["ner_tags"]]
        # A word cut off by max_seq_length has no prediction: count it as "O", as a pipeline would output nothing.
        padded = [p + ["O"] * (len(g) - len(p)) for p, g in zip(predictions, gold)]
        values = metric_functions.conll_f1(padded, gold)
        return {
            "entity_f1": values["f1"],
            "entity_precision": values["precision"],
            "entity_recall": values["recall"],
            "accuracy": values["accuracy"],
        }

    def pipeline_example(self, task):
        return "tagger", 'tagger("The European Commission met in Brussels on Monday.")'


CLASSIFICATION = SentenceClassification()
REGRESSION = SentenceRegression()
SPAN = SpanExtraction()
MULTIPLE_CHOICE = MultipleChoice()
TOKEN_CLASSIFICATION = TokenClassification()

KINDS: tuple[TaskKind, ...] = (CLASSIFICATION, REGRESSION, SPAN, MULTIPLE_CHOICE, TOKEN_CLASSIFICATION)


def kind_named(name: str | TaskKind) -> TaskKind:
    """The kind called ``name`` ("classification", "regression", "span", "multiple_choice", ...)."""
    if isinstance(name, TaskKind):
        return name
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise KeyError(f"Unknown task kind {name!r}. Known kinds: {', '.join(k.name for k in KINDS)}.")


__all__ = [
    "CLASSIFICATION",
    "HEADS",
    "KINDS",
    "MULTIPLE_CHOICE",
    "REGRESSION",
    "SPAN",
    "TOKEN_CLASSIFICATION",
    "EncodingSettings",
    "MultipleChoice",
    "SentenceClassification",
    "SentenceRegression",
    "SpanExtraction",
    "TaskKind",
    "TokenClassification",
    "kind_named",
]
