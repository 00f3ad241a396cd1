"""Reports a reader cannot misread: beside each score the majority-class baseline (the training set's most frequent
label for every example), and a run whose predictions are all one label flagged (SST-2 at 50.92, all "positive")."""

import numpy as np
from datasets import Dataset
from support.task_files import fixture_files, write

from bert_repro.tasks.files import load_task_data
from bert_repro.tasks.registry import get_task
from bert_repro.training.finetuning.run import majority_baseline, results_markdown
from bert_repro.training.finetuning.trainer import one_label


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
    # the training set's majority, not the evaluation split's: here they differ
    skewed = {"train": Dataset.from_dict({"label": [1, 1, 0]}), "validation": Dataset.from_dict({"label": [0, 0, 1]})}
    assert majority_baseline(task, skewed) == {"validation": {"accuracy": 1 / 3}}
    one_label = {"validation": {"accuracy": expected}, "score": expected, "one_label": {"validation": "positive"}}
    runs = [
        {"learning_rate": 2e-5, "seed": 1, "train_seconds": 1.0, **one_label},
        {"learning_rate": 3e-5, "seed": 1, "validation": {"accuracy": 0.9}, "score": 0.9, "train_seconds": 1.0},
    ]
    summary = {"model": "m", "features": None, "runs": runs, "best": runs[1], "majority_baseline": baseline}
    text = results_markdown(task, summary)
    assert f"| majority class | | {expected:.4f} | |" in text
    said = "**Learned nothing beyond one label:** lr 2e-05 seed 1 predicts 'positive' for every example of validation."
    assert said in text
    summary["majority_baseline"] = {}  # a task without classes
    del runs[0]["one_label"]
    plain = results_markdown(task, summary)
    assert "majority" not in plain and "Learned nothing" not in plain


def test_the_reproduce_report_shows_the_baseline_the_flag_the_subsampling_and_the_arguments(tmp_path):
    from bert_repro.training.studies import ReproduceArguments
    from bert_repro.training.studies.reproduce import task_row, write_benchmark

    best = {"learning_rate": 2e-5, "seed": 1, "validation": {"accuracy": 0.5092}}
    best["one_label"] = {"validation": "positive"}  # a best run that predicted nothing else
    summary = {"best": best, "runs": [best], "seconds": 10.0, "majority_baseline": {"validation": {"accuracy": 0.5092}}}
    summary["hyperparameters"] = {"max_train_samples": 1000, "max_eval_samples": None}
    row = task_row(get_task("sst2"), summary, "base")
    assert (row["majority"], row["one_label"], row["subsampled"]) == (50.92, "positive", {"max_train_samples": 1000})
    args = ReproduceArguments(model="m", output_dir=str(tmp_path), tasks=["sst2"])
    text = write_benchmark(tmp_path, [row], args, 10.0, ["--max_train_samples", "1000", "--seeds", "1 2"])
    assert "| sst2 | accuracy | 50.92 (every prediction 'positive') | 50.92 | 93.5 |" in text
    assert "**Learned nothing beyond one label:** the best run of sst2 ('positive')" in text
    assert "Subsampled, so not comparable with the paper: sst2 (max_train_samples 1000)." in text
    assert "Fine-tuning arguments (after --): `--max_train_samples 1000 --seeds '1 2'`" in text
    # No baseline for the split, no flag, nothing subsampled.
    plain = {"best": {**best, "one_label": None}, "runs": [best], "seconds": 1.0}
    plain |= {"majority_baseline": {}, "hyperparameters": {"max_train_samples": None}}
    row = task_row(get_task("sst2"), plain, "base")
    assert (row["majority"], row["one_label"], row["subsampled"]) == (None, None, {})
