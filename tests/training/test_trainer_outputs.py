"""A fine-tuning run of the grid is a Trainer run as transformers' example scripts leave it: evaluated each epoch
with the task's own metrics, trainer_state.json, *_results.json and TensorBoard events in its folder; every
evaluation and saving strategy runs or is refused in one line before any work."""

import json

import pytest
import transformers
from support.task_files import fixture_files, write

from bert_repro.training.cli import ConfigurationError
from bert_repro.training.finetune import run_finetuning
from bert_repro.training.finetune_recipe import FineTuningRecipe


def finetune(tmp_path, model, *extra, task="sst2"):
    data = write(tmp_path / "data", fixture_files(task))
    argv = [
        *("--task", task, "--model", str(model), "--data", str(data), "--output_dir", str(tmp_path / "out")),
        *("--learning_rates", "1e-4", "--per_device_train_batch_size", "2", "--num_train_epochs", "2"),
        *("--use_cpu", "true", "--disable_tqdm", "true", "--max_seq_length", "32", *extra),
    ]
    return run_finetuning(FineTuningRecipe.from_args(argv))


def test_a_run_is_a_trainer_run(tmp_path, tiny_model, caplog):
    caplog.set_level("INFO")
    summary = finetune(tmp_path, tiny_model)
    out = tmp_path / "out"
    run = out / "runs" / "lr0.0001_seed42"
    state = json.loads((run / "trainer_state.json").read_text())
    evaluations = [entry for entry in state["log_history"] if "eval_accuracy" in entry]
    assert [entry["epoch"] for entry in evaluations] == [1.0, 2.0]  # each epoch, the task's metric
    assert state["global_step"] == state["max_steps"] > 0
    result = json.loads((run / "result.json").read_text())
    eval_results = json.loads((run / "eval_results.json").read_text())
    assert eval_results["eval_accuracy"] == result["validation"]["accuracy"] == evaluations[-1]["eval_accuracy"]
    assert "eval_loss" in eval_results
    train_results = json.loads((run / "train_results.json").read_text())
    assert {"train_loss", "train_runtime", "epoch"} <= set(train_results)
    assert json.loads((run / "all_results.json").read_text()) == {**train_results, **eval_results}
    assert list(run.glob("runs/*/events.out.tfevents.*")), "no TensorBoard events"
    assert not list(run.glob("checkpoint-*")), "a finished run keeps no checkpoint"
    assert (out / "model" / "model.safetensors").exists()
    assert f"The best run's model (lr0.0001_seed42): {out / 'model'}" in caplog.text
    assert summary["best"]["score"] == result["score"]
    # the versions a card lists, recorded by the run
    assert json.loads((out / "results.json").read_text())["versions"]["transformers"] == transformers.__version__


@pytest.mark.parametrize(
    "flags",
    [
        ("--eval_strategy", "no", "--save_strategy", "no"),
        ("--eval_strategy", "steps", "--eval_steps", "1", "--save_strategy", "steps", "--save_steps", "2"),
        ("--save_strategy", "best", "--keep_all_runs", "true"),
        ("--load_best_model_at_end", "true", "--metric_for_best_model", "accuracy"),
    ],
    ids=["no", "steps", "best", "load_best"],
)
def test_every_evaluation_and_saving_strategy_runs(tmp_path, tiny_model, flags):
    finetune(tmp_path, tiny_model, *flags)
    run = tmp_path / "out" / "runs" / "lr0.0001_seed42"
    assert (run / "result.json").exists() and (run / "trainer_state.json").exists()
    state = json.loads((run / "trainer_state.json").read_text())
    evaluated = [entry["step"] for entry in state["log_history"] if "eval_accuracy" in entry]
    if "no" in flags:
        assert len(evaluated) == 1  # the evaluation after training only
    elif "steps" in flags:
        assert evaluated == list(range(1, state["global_step"] + 1))
    if "best" in flags:  # kept with --keep_all_runs; chosen by the grid's metric
        assert list(run.glob("checkpoint-*")) and state["best_metric"] is not None


@pytest.mark.parametrize(
    "task, flags, message",
    [
        ("sst2", ("--eval_strategy", "no", "--save_strategy", "best"), "--save_strategy best needs evaluations"),
        ("sst2", ("--eval_strategy", "no", "--load_best_model_at_end", "true"), "match"),
        ("sst2", ("--metric_for_best_model", "f1", "--save_strategy", "best"), "sst2's evaluation logs accuracy, loss"),
        ("squad", ("--load_best_model_at_end", "true"), "loss (Trainer's default with --load_best_model_at_end)"),
        ("sst2", ("--prediction_loss_only", "true"), "need every evaluation example's prediction"),
        ("sst2", ("--eval_do_concat_batches", "false"), "need every evaluation example's prediction"),
        ("sst2", ("--dataloader_drop_last", "true"), "need every evaluation example's prediction"),
        ("sst2", ("--dataloader_multiprocessing_context", "spawn"), "add --dataloader_num_workers N"),
        ("sst2", ("--batch_eval_metrics", "true"), "a setting of Trainer's compute_metrics"),
        ("sst2", ("--lr_scheduler_kwargs", '{"power": 2.0}'), "with --lr_scheduler_type linear: .*power"),
    ],
)
def test_an_impossible_evaluation_setting_is_refused_before_work(tmp_path, tiny_model, task, flags, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        finetune(tmp_path, tiny_model, *flags, task=task)
    assert not (tmp_path / "out").exists()
