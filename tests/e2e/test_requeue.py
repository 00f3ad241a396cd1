"""A requeued job and a longer run: the README recommends `--resume_from_checkpoint true` for jobs a cluster
restarts, so a finished run given it again must be left exactly as it is (exit 0, one line that says so), and
raising `--max_steps` is the one change a resumption accepts: the run continues from its newest checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, file_digests
from support.pretraining_runs import launch, write_config
from support.task_files import TINY_RUN, finetune_args, fixture_files, write

from bert_repro.training.lifecycle import RunFinished, check_output_dir
from bert_repro.training.pretraining.recipe import MAY_GROW, run_identity


def finished_run(tmp_path: Path, max_steps: int = 20) -> tuple[Path, dict]:
    record = run_identity({"run": {"preset": "tiny"}, "training": {"max_steps": max_steps, "learning_rate": 1e-3}})
    out = tmp_path / "run"
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps(record))
    (out / "checkpoint-20").mkdir()
    (out / "results.json").write_text("{}")
    return out, record


def test_the_same_finished_run_resumed_is_finished(tmp_path):
    out, record = finished_run(tmp_path)
    with pytest.raises(RunFinished, match=r"already holds this run, finished .*nothing written.*--max_steps"):
        check_output_dir(out, record, resume=True, overwrite=False, identity=run_identity, may_grow=MAY_GROW)
    with pytest.raises(FileExistsError, match="already holds this finished run"):  # without a resume: as before
        check_output_dir(out, record, resume=False, overwrite=False, identity=run_identity, may_grow=MAY_GROW)


def test_raising_max_steps_is_the_one_change_a_resumption_accepts(tmp_path):
    out, _ = finished_run(tmp_path)
    longer = run_identity({"run": {"preset": "tiny"}, "training": {"max_steps": 30, "learning_rate": 1e-3}})
    grown = check_output_dir(out, longer, resume=True, overwrite=False, identity=run_identity, may_grow=MAY_GROW)
    assert grown == {"training.max_steps": (20, 30)}
    with pytest.raises(FileExistsError, match="pass --max_steps 30 with --resume_from_checkpoint true"):
        check_output_dir(out, longer, resume=False, overwrite=False, identity=run_identity, may_grow=MAY_GROW)
    shorter = run_identity({"run": {"preset": "tiny"}, "training": {"max_steps": 10, "learning_rate": 1e-3}})
    with pytest.raises(FileExistsError, match="may only raise --max_steps"):
        check_output_dir(out, shorter, resume=True, overwrite=False, identity=run_identity, may_grow=MAY_GROW)
    other = run_identity({"run": {"preset": "tiny"}, "training": {"max_steps": 30, "learning_rate": 1e-4}})
    with pytest.raises(FileExistsError, match="learning_rate: 0.001 -> 0.0001"):
        check_output_dir(out, other, resume=True, overwrite=False, identity=run_identity, may_grow=MAY_GROW)
    # Fine-tuning grows nothing: a raised setting there is a different run.
    with pytest.raises(FileExistsError, match="max_steps: 20 -> 30"):
        check_output_dir(out, longer, resume=True, overwrite=False, identity=run_identity)


@pytest.mark.slow
def test_a_requeued_pretraining_run_is_left_byte_for_byte_and_can_be_extended(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(
        tmp_path / "tiny.yaml", corpus, tokenizer, max_steps=20, save_steps=10, eval_fraction=0.0, phase2_fraction=0.0
    )
    out = tmp_path / "out"
    launch(config, out, "--resume_from_checkpoint", "true")  # the requeue-safe command from its first start
    before = file_digests(out)
    again = launch(config, out, "--resume_from_checkpoint", "true")
    assert file_digests(out) == before
    said = [line for line in again.stderr.splitlines() if "pretrain.py: " in line]
    assert len(said) == 1 and "already holds this run, finished" in said[0], again.stderr[-3000:]
    assert "Traceback" not in again.stderr

    # Extended, and stopped on the way (a time-limited job): no longer finished, so the same command goes on.
    longer = launch(config, out, "--max_steps", "30", "--resume_from_checkpoint", "true", "--stop_after_steps", "5")
    assert f"resuming from {out / 'checkpoint-20'}" in longer.stderr, longer.stderr[-3000:]
    assert "extending the run from max_steps 20 to 30" in longer.stderr
    assert (out / "checkpoint-25").is_dir() and not (out / "results.json").exists()
    longer = launch(config, out, "--max_steps", "30", "--resume_from_checkpoint", "true")
    assert f"resuming from {out / 'checkpoint-25'}" in longer.stderr, longer.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["global_step"] == 30
    history = json.loads((out / "log_history.json").read_text())
    rates = {e["step"]: e["learning_rate"] for e in history if "loss" in e and "learning_rate" in e}
    assert sorted(rates) == list(range(1, 31))  # one record a step: none lost, none repeated
    # Linear decay after 2 warm-up steps (the rate logged at step s is the one step s used, the schedule's value
    # after s - 1 steps): to 0 at the end of 20 steps before the extension, of 30 after it.
    for step in range(3, 21):
        assert rates[step] == pytest.approx(0.002 * (21 - step) / 18), (step, rates)
    for step in range(21, 31):
        assert rates[step] == pytest.approx(0.002 * (31 - step) / 28), (step, rates)
    # The logged epoch is the passes over the examples (Trainer's, over its sampler of max_steps x batch, was 1.0
    # at step 20 and again at step 30).
    examples = json.loads((out / "data_statistics.json").read_text())["phase1"]["examples"]
    for entry in history:
        if "loss" in entry:
            assert entry["epoch"] == pytest.approx(entry["step"] * 8 / examples, abs=1e-4), entry
    # The longer run is finished in its turn: requeued, it is left alone.
    before = file_digests(out)
    launch(config, out, "--max_steps", "30", "--resume_from_checkpoint", "true")
    assert file_digests(out) == before


@pytest.mark.slow
def test_a_requeued_finetuning_run_is_left_byte_for_byte(tmp_path, tiny_model):
    data = write(tmp_path / "MRPC", fixture_files("mrpc"))
    argv = finetune_args("mrpc", tiny_model, data, tmp_path / "out", seeds=1, num_proc=1, **TINY_RUN)
    command = [sys.executable, str(ROOT / "recipes" / "finetune.py"), *argv]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    first = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    before = file_digests(tmp_path / "out")
    for extra in ([], ["--resume_from_checkpoint", "true"]):
        again = subprocess.run(command + extra, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "already holds this run, finished" in again.stderr and "Traceback" not in again.stderr
        assert file_digests(tmp_path / "out") == before, extra
