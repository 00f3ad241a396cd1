"""Reports a reader cannot misread: beside each score the majority-class baseline (the training set's most frequent
label for every example), and a run whose predictions are all one label flagged (SST-2 at 50.92 with every
prediction "positive" was reported as a score beside the paper's, with no word)."""

import numpy as np
from helpers import fixture_files, write

from bert_repro.tasks.files import load_task_data
from bert_repro.tasks.registry import get_task
from bert_repro.training.finetune import majority_baseline, one_label, results_markdown


def test_one_label_names_the_label_of_a_run_that_predicts_nothing_else():
    sst2, squad = get_task("sst2"), get_task("squad")
    assert one_label(sst2, np.array([1, 1, 1])) == sst2.label_names[1]
    assert one_label(sst2, np.array([1, 0, 1])) is None
    assert one_label(squad, {"id": "text"}) is None  # spans: no classes
    assert one_label(get_task("stsb"), np.array([0.5, 0.5])) is None  # scores: no classes


def test_results_md_shows_the_majority_baseline_and_flags_a_one_label_run(tmp_path):
    task = get_task("sst2")
    data = load_task_data(task, str(write(tmp_path / "SST-2", fixture_files("sst2"))))
    baseline = majority_baseline(task, data)
    labels = list(data["train"]["label"])
    majority = max(set(labels), key=lambda label: (labels.count(label), -label))
    expected = float(np.mean(np.asarray(data["validation"]["label"]) == majority))
    assert baseline == {"validation": {"accuracy": expected}}
    runs = [
        {
            "learning_rate": 2e-5,
            "seed": 1,
            "validation": {"accuracy": expected},
            "score": expected,
            "train_seconds": 1.0,
            "one_label": {"validation": "positive"},
        },
        {"learning_rate": 3e-5, "seed": 1, "validation": {"accuracy": 0.9}, "score": 0.9, "train_seconds": 1.0},
    ]
    summary = {"model": "m", "features": None, "runs": runs, "best": runs[1], "majority_baseline": baseline}
    text = results_markdown(task, summary)
    assert f"| majority class | | {expected:.4f} | |" in text
    assert (
        "**Learned nothing beyond one label:** lr 2e-05 seed 1 predicts 'positive' for every example of "
        "validation." in text
    )
    del summary["majority_baseline"], runs[0]["one_label"]  # the results of an earlier version
    assert "majority" not in results_markdown(task, summary) and "Learned nothing" not in results_markdown(
        task, summary
    )
