"""A model card names tasks and metrics as the task registry does (`Task.display_name`, `METRICS`' `Metric`
records), so a task or metric added to the registry comes with its own words on the card, never its raw name."""

import dataclasses
import os
from types import MappingProxyType

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.run_records import finetuning_run

from bert_repro.hub import card_base, finetuned_card
from bert_repro.tasks import registry
from bert_repro.tasks.registry import METRICS, TASKS, Metric, get_task


def test_every_task_and_metric_has_words_for_readers():
    for name, task in TASKS.items():
        assert task.display_name and task.display_name != name, name
    for name, metric in METRICS.items():
        assert metric.label and metric.hub_id and metric.description, name


def test_a_task_added_to_the_registry_is_named_on_its_card(tmp_path, monkeypatch):
    metrics = {**METRICS, "macro_f1": Metric("mean of the classes' F1", "Macro-averaged F1", "f1")}
    names = dict(
        name="paws", display_name="PAWS-X paraphrases", hub_id="google-research-datasets/paws-x", hub_config="en"
    )
    scores = dict(metrics=("accuracy", "macro_f1"), main_metric="macro_f1", paper=(), other_reported=())
    paws = dataclasses.replace(get_task("mrpc"), **names, **scores)
    monkeypatch.setattr(registry, "TASKS", MappingProxyType({**TASKS, "paws": paws}))
    for module in (registry, finetuned_card, card_base):  # each reads the registry's metrics
        monkeypatch.setattr(module, "METRICS", MappingProxyType(metrics))

    run = {"learning_rate": 2e-05, "seed": 42, "train_seconds": 60.0, "validation": {"accuracy": 0.9, "macro_f1": 0.88}}
    out = finetuning_run(tmp_path, "paws", {"_main": "macro_f1", **run, "score": 0.88}, [run])
    card = finetuned_card.card_for_finetuning(out, "someone/bert-paws")

    assert "fine-tuned on PAWS-X paraphrases with bert_repro" in card.text
    assert "the main metric is Macro-averaged F1" in card.text
    assert "| dev | Macro-averaged F1 (main) | 88.00 |" in card.text
    results = card.data.eval_results
    assert {r.dataset_name for r in results} == {"PAWS-X paraphrases"}
    assert {r.metric_name for r in results} == {"Accuracy", "Macro-averaged F1"}
