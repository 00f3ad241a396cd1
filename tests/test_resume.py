"""Resuming pre-training: `--resume_from_checkpoint true` takes the newest checkpoint that can really be loaded,
says which newer ones it skipped and why, and ends with the same weights as a run that was never interrupted."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, fake_checkpoint, launch, truncate, weights, write_config

from bert_repro.training.checkpoints import NoUsableCheckpoint, checkpoint_problem, newest_valid_checkpoint


def test_each_kind_of_broken_checkpoint_is_named(tmp_path):
    good = fake_checkpoint(tmp_path / "checkpoint-5", 5)
    assert checkpoint_problem(good) is None
    cases = {
        "empty folder": lambda f: [p.unlink() for p in f.iterdir()],
        "trainer_state.json is missing": lambda f: (f / "trainer_state.json").unlink(),
        "trainer_state.json cannot be read": lambda f: (f / "trainer_state.json").write_text('{"global_st'),
        "model.safetensors is missing": lambda f: (f / "model.safetensors").unlink(),
        "model.safetensors cannot be read": lambda f: truncate(f / "model.safetensors"),
        "optimizer.pt is truncated": lambda f: truncate(f / "optimizer.pt"),
    }
    for i, (reason, damage) in enumerate(cases.items()):
        folder = fake_checkpoint(tmp_path / f"case{i}" / "checkpoint-9", 9)
        damage(folder)
        assert reason in (checkpoint_problem(folder) or ""), reason


def test_newest_valid_checkpoint_falls_back_and_reports(tmp_path, caplog):
    assert newest_valid_checkpoint(tmp_path) is None  # nothing saved yet
    fake_checkpoint(tmp_path / "checkpoint-5", 5)
    fake_checkpoint(tmp_path / "checkpoint-10", 10)
    truncate(tmp_path / "checkpoint-10" / "model.safetensors")
    (tmp_path / "checkpoint-20").mkdir()
    (tmp_path / "checkpoint-notes").mkdir()  # not a checkpoint name: ignored
    with caplog.at_level("WARNING"):
        assert newest_valid_checkpoint(tmp_path) == tmp_path / "checkpoint-5"  # numeric order, not text order
    assert "skipped checkpoint-20: empty folder" in caplog.text
    assert "skipped checkpoint-10: model.safetensors cannot be read" in caplog.text
    truncate(tmp_path / "checkpoint-5" / "model.safetensors")
    with pytest.raises(
        NoUsableCheckpoint, match="checkpoint-20: empty folder; checkpoint-10: .*--overwrite_output_dir"
    ):
        newest_valid_checkpoint(tmp_path)
    assert (tmp_path / "checkpoint-10" / "trainer_state.json").exists()  # nothing deleted


def test_the_clock_starts_where_the_checkpoint_says(tmp_path, caplog):
    from bert_repro.training.pretrain import TrainingClock

    assert (TrainingClock(None).before, TrainingClock(None).from_step) == (0.0, 0)
    timed = tmp_path / "checkpoint-6"
    timed.mkdir()
    (timed / "training_time.json").write_text(json.dumps({"train_seconds": 1000.0, "global_step": 6}))
    (timed / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    clock = TrainingClock(timed)
    assert (clock.before, clock.from_step) == (1000.0, 0) and 1000.0 <= clock.seconds() < 1010.0
    # A checkpoint of an older version, without the record: the time before it is unknown, and said to be.
    old = tmp_path / "checkpoint-8"
    old.mkdir()
    (old / "trainer_state.json").write_text(json.dumps({"global_step": 8}))
    with caplog.at_level("WARNING"):
        clock = TrainingClock(old)
    assert (clock.before, clock.from_step) == (0.0, 8) and clock.seconds() < 10.0
    assert "time trained before step 8 is unknown" in caplog.text


def test_tokens_per_second_counts_the_steps_the_clock_timed():
    from bert_repro.training.pretrain import tokens_trained

    statistics = {"phase1": {"tokens": 1000, "examples": 10}, "phase2": {"tokens": 4000, "examples": 10}}
    assert tokens_trained(statistics, [90, 10], 2) == 90 * 2 * 100 + 10 * 2 * 400
    assert tokens_trained(statistics, [90, 10], 2, after_step=80) == 10 * 2 * 100 + 10 * 2 * 400
    assert tokens_trained(statistics, [90, 10], 2, after_step=95) == 5 * 2 * 400


@pytest.mark.slow
def test_resume_from_truncated_newest_checkpoint_matches_uninterrupted_run(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(
        tmp_path / "tiny.yaml",
        corpus,
        tokenizer,
        max_steps=16,
        save_steps=6,
        eval_steps=100,
        eval_fraction=0.0,
        phase2_fraction=0.0,
    )
    full = tmp_path / "full"
    launch(config, full)

    broken = tmp_path / "broken"
    launch(config, broken, "--stop_after_steps", "9")  # checkpoint-6 (save_steps) and checkpoint-9 (the stop)
    assert (broken / "checkpoint-6").is_dir() and (broken / "checkpoint-9").is_dir()
    # Each checkpoint carries the training time up to it; the resumed run's time starts there (checkpoint-6:
    # checkpoint-9 is broken below), so its results are the whole run's, not the last invocation's.
    trained = json.loads((broken / "checkpoint-6" / "training_time.json").read_text())
    assert trained["global_step"] == 6 and trained["train_seconds"] > 0
    (broken / "checkpoint-6" / "training_time.json").write_text(json.dumps({"train_seconds": 1000.0, "global_step": 6}))
    truncate(broken / "checkpoint-9" / "model.safetensors")  # killed while saving
    (broken / "checkpoint-12").mkdir()  # killed before writing anything
    result = launch(config, broken, "--resume_from_checkpoint", "true")
    assert "skipped checkpoint-12: empty folder" in result.stderr
    assert "skipped checkpoint-9: model.safetensors cannot be read" in result.stderr
    assert "Traceback" not in result.stderr
    a, b = weights(full), weights(broken)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-6, worst
    results = json.loads((broken / "results.json").read_text())
    assert (
        1000.0
        < results["train_runtime_s"]
        < 1000.0 + json.loads((full / "results.json").read_text())["train_runtime_s"] * 5
    ), results["train_runtime_s"]

    # No usable checkpoint at all: one message, exit code 2, nothing deleted.
    nothing = tmp_path / "nothing"
    launch(config, nothing, "--stop_after_steps", "3")
    truncate(nothing / "checkpoint-3" / "model.safetensors")
    # Without accelerate's launcher, which wraps a failed script in a traceback of its own.
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "recipes" / "pretrain.py"),
            "--config",
            str(config),
            "--output_dir",
            str(nothing),
            "--resume_from_checkpoint",
            "true",
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "No checkpoint in" in result.stderr and "checkpoint-3: model.safetensors cannot be read" in result.stderr
    assert "Traceback" not in result.stderr and (nothing / "checkpoint-3" / "trainer_state.json").exists()
