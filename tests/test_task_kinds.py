"""Task kinds (`bert_repro.tasks.kinds`): every registered task's kind provides every hook, a new kind defined
in one place (here, in the test) runs through data loading, fine-tuning and evaluation unchanged, and no module
outside the kinds compares kinds."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import transformers
from helpers import tiny_config
from transformers import DataCollatorWithPadding, TrainingArguments

import bert_repro
from bert_repro import BertReproForPreTraining, BertReproForSequenceClassification
from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece
from bert_repro.hub.model_card import TASK_TYPE_NAMES, parameter_count
from bert_repro.tasks import metrics
from bert_repro.tasks.columns import class_id, find_column, texts
from bert_repro.tasks.files import load_task_data
from bert_repro.tasks.kinds import KINDS, TaskKind, kind_named
from bert_repro.tasks.registry import TASKS, Task
from bert_repro.training.finetune import FineTuningArguments, encode_splits, one_run

ATTRIBUTES = (
    "name",
    "head_class",
    "auto_class",
    "pipeline_tag",
    "pipeline_task",
    "head_description",
    "uses_pooler",
    "decode_columns",
)
METHODS = (
    "num_labels",
    "head_parameters",
    "features",
    "canonicalise",
    "labelled",
    "encode",
    "collator",
    "decode",
    "score",
    "ranking_metric",
    "card_labels",
    "pipeline_example",
)


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(iterator=["the cat sat on the mat", "a dog ran"] * 3, vocab_size=60, show_progress=False)


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_kind_provides_every_hook(name, tokenizer):
    task = TASKS[name]
    kind = task.kind
    assert isinstance(kind, TaskKind) and kind in KINDS and kind_named(kind.name) is kind
    assert not type(kind).__abstractmethods__
    for attribute in ATTRIBUTES:
        assert hasattr(kind, attribute), attribute
    for method in METHODS:
        assert callable(getattr(kind, method)), method
    assert issubclass(kind.head_class, bert_repro.BertReproPreTrainedModel)
    assert kind.head_class.__name__ in bert_repro.AUTO_MAP[kind.auto_class]
    assert hasattr(transformers, kind.auto_class)
    assert kind.pipeline_tag in TASK_TYPE_NAMES and kind.head_description
    assert kind.pipeline_task in (None, kind.pipeline_tag)
    assert isinstance(kind.features(task), datasets.Features) and kind.features(task)
    assert kind.ranking_metric(task) in task.metrics
    assert kind.collator(tokenizer) is not None
    variable, call = kind.pipeline_example(task)
    assert call.startswith(f"{variable}(")
    labels = kind.card_labels(task)
    assert labels is None or set(labels) <= set(task.label_names)
    # The head's parameters, as the model card counts them, are those of the head class.
    config = tiny_config(num_labels=kind.num_labels(task))
    model = kind.head_class(config)
    assert parameter_count(config.to_dict(), kind) == sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------
# A kind the package does not have, defined here and nowhere else.


class PairAgreement(TaskKind):
    """Toy kind: does sentence b say the same as sentence a? A [CLS] classifier whose decision is P(same) above a
    threshold, with its own column names ("a", "b", "same")."""

    name = "pair_agreement"
    head_class = BertReproForSequenceClassification
    auto_class = "AutoModelForSequenceClassification"
    pipeline_tag = pipeline_task = "text-classification"
    head_description = "a linear layer on the pooled [CLS] output, P(same) thresholded"
    uses_pooler = True
    threshold = 0.5

    def __init__(self):
        self.calls = []

    def features(self, task):
        string = datasets.Value("string")
        return datasets.Features({"a": string, "b": string, "same": datasets.ClassLabel(names=list(task.label_names))})

    def canonicalise(self, task, split, raw):
        self.calls.append(("canonicalise", split))
        return {
            "a": texts(raw, find_column(task, raw, "a"), "a"),
            "b": texts(raw, find_column(task, raw, "b"), "b"),
            "same": [class_id(task, raw, i, v, False) for i, v in enumerate(find_column(task, raw, "same"))],
        }

    def labelled(self, task, split):
        return True

    def encode(self, task, split, tokenizer, settings, *, train):
        self.calls.append(("encode", train))

        def encode_batch(batch):
            encoded = tokenizer(batch["a"], batch["b"], truncation=True, max_length=settings.max_seq_length)
            return {**encoded, "labels": batch["same"]}

        return split.map(encode_batch, batched=True, remove_columns=split.column_names)

    def collator(self, tokenizer):
        return DataCollatorWithPadding(tokenizer)

    def decode(self, task, logits, raw, encoded, settings):
        self.calls.append(("decode", len(raw)))
        probabilities = torch.softmax(torch.as_tensor(logits), -1)[:, 1].numpy()
        return (probabilities > self.threshold).astype(np.int64)

    def score(self, task, raw, predictions):
        self.calls.append(("score", len(raw)))
        return metrics.compute(task.metrics, predictions, np.asarray(raw["same"]))

    def pipeline_example(self, task):
        return "classifier", 'classifier({"text": "a cat", "text_pair": "the cat"})'


def test_a_new_kind_runs_through_finetuning_in_one_place(tmp_path: Path):
    kind = PairAgreement()
    task = Task(
        name="toy_pairs",
        kind=kind,
        text_columns=("a", "b"),
        label_names=("different", "same"),
        metrics=("accuracy", "f1"),
        main_metric="f1",
        hub_id="local/toy_pairs",
        hub_config=None,
        test_splits=(),
    )
    rows = [
        {"a": "the cat sat", "b": "the cat sat", "same": "same"},
        {"a": "a dog ran", "b": "the mat", "same": 0},
        {"a": "the mat", "b": "the mat", "same": 1},
        {"a": "a cat", "b": "a dog ran", "same": "different"},
    ]
    files = {}
    for split in ("train", "validation"):
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = load_task_data(task, files)
    assert data["validation"]["same"] == [1, 0, 1, 0] and data["train"].features == kind.features(task)

    tokenizer = train_wordpiece(iterator=[r["a"] + " " + r["b"] for r in rows] * 3, vocab_size=60, show_progress=False)
    model_dir = tmp_path / "tiny"
    torch.manual_seed(0)
    BertReproForPreTraining(tiny_config(vocab_size=len(tokenizer))).save_pretrained(model_dir)
    save_tokenizer(tokenizer, model_dir)
    run = FineTuningArguments(task=task.name, model=str(model_dir), max_seq_length=32)
    training = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
    )
    splits = encode_splits(task, data, tokenizer, run)
    result, trainer = one_run(task, splits, tokenizer, run, training, 1e-4, 0, tmp_path / "out" / "run")

    assert isinstance(trainer.model, BertReproForSequenceClassification) and trainer.model.num_labels == 2
    assert set(result["validation"]) == {"accuracy", "f1"}
    assert result["score"] == result["validation"]["f1"]
    assert kind.calls == [
        ("canonicalise", "train"),
        ("canonicalise", "validation"),
        ("encode", True),
        ("encode", False),
        ("decode", 4),
        ("score", 4),
    ]


# ---------------------------------------------------------------------------------------------------------
# Nothing outside the kinds module decides by kind.

_KIND_TEST = re.compile(r"\bkind(?:\.name)?\s*(?:==|!=|(?:not\s+)?in\b)|\[[^\]\n]*\.kind\]")


def test_no_module_outside_the_kinds_compares_kinds():
    package = Path(bert_repro.__file__).parent
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "kinds.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if _KIND_TEST.search(line)
    ]
    assert not found, "\n".join(found)
