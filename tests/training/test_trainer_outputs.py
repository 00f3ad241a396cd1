"""A fine-tune's output directory is a Trainer output_dir, each grid run a Trainer run beneath it; --do_train /
--do_eval / --do_predict and --resume_from_checkpoint behave as in run_glue; a finished fine-tune is trained further;
records and card say what ran; every evaluation and saving strategy runs or is refused in one line before any work."""

import json
import re
import shutil
from pathlib import Path

import pytest
import transformers
from support.task_files import finetune_args, fixture_files, tsv, write

from bert_repro.training.cli import ConfigurationError
from bert_repro.training.finetuning import FineTuningRecipe
from bert_repro.training.finetuning.run import GROW, run_finetuning, run_identity
from bert_repro.training.lifecycle import RunFinished, check_output_dir


def finetune(tmp_path, model, *extra, task="sst2"):
    data = write(tmp_path / "data", fixture_files(task))
    small = dict(learning_rates="1e-4", per_device_train_batch_size=2, num_train_epochs=2, max_seq_length=32)
    argv = finetune_args(task, model, data, tmp_path / "out", *extra, **small)
    return run_finetuning(FineTuningRecipe.from_args(argv))


# SST-2 with four training rows (two steps an epoch at batch 2; label 1 the most frequent) and four dev rows, whose
# first is label 1 and the others 0: the majority class scores 1.0 on the first row and 0.25 on all four.
SST2 = {
    "train.tsv": tsv(["sentence", "label"], [["hide new secretions", 1], ["a charming journey", 1]] * 2),
    "dev.tsv": tsv(["sentence", "label"], [["unflinchingly bleak", 1], ["bleak", 0], ["new", 0], ["journey", 0]]),
    "test.tsv": tsv(["index", "sentence"], [[0, "uneasy mishmash"], [1, "charming"]]),
}
SST2["train.tsv"] = SST2["train.tsv"].replace("journey\t1\n", "journey\t0\n", 1)  # labels 1 0 1 1
RUN = "lr0.0001_seed42"


def sst2_argv(data, model, out, *extra):
    small = dict(learning_rate="1e-4", per_device_train_batch_size=2, max_seq_length=32, logging_steps=1)
    return finetune_args("sst2", model, data, out, *extra, **small)


@pytest.fixture(scope="module")
def sst2(tmp_path_factory, tiny_model):
    """(data, output directory) of a fine-tune stopped by --max_steps 3 at 1.5 of its 2 epochs, scored on the
    first dev row only (--max_eval_samples 1). Tests copy the output directory before they write into it."""
    root = tmp_path_factory.mktemp("sst2")
    data = write(root / "data", SST2)
    argv = sst2_argv(data, tiny_model, root / "out", "--num_train_epochs", "2", "--max_steps", "3")
    run_finetuning(FineTuningRecipe.from_args([*argv, "--max_eval_samples", "1"]))
    return data, root / "out", tiny_model


def test_the_output_directory_is_a_trainer_output_dir(sst2):
    """The top holds what `Trainer.save_model` + `save_state` leave for the best run; each grid run beneath keeps its
    last checkpoint."""
    from transformers import pipeline

    _, out, _ = sst2
    classify = pipeline("text-classification", model=str(out), device="cpu")
    assert classify("a charming journey")[0]["label"] in ("negative", "positive")
    run = out / "runs" / RUN
    for name in ("trainer_state.json", "train_results.json", "eval_results.json", "all_results.json"):
        assert (out / name).read_text() == (run / name).read_text(), name
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and [p.name for p in run.glob("checkpoint-*")] == ["checkpoint-3"]
    assert state["best_model_checkpoint"] is None or Path(state["best_model_checkpoint"]).is_dir()
    assert list(run.glob("events.out.tfevents.*")), "no TensorBoard events in the run's folder"
    evaluations = [entry for entry in state["log_history"] if "eval_accuracy" in entry]
    assert [entry["epoch"] for entry in evaluations] == [1.0, 1.5]  # each epoch and at the end, the task's metric
    result = json.loads((run / "result.json").read_text())
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert eval_results["eval_accuracy"] == result["validation"]["accuracy"] == evaluations[-1]["eval_accuracy"]
    train_results = json.loads((out / "train_results.json").read_text())
    assert {"train_loss", "train_runtime", "epoch"} <= set(train_results) and "eval_loss" in eval_results
    assert json.loads((out / "all_results.json").read_text()) == {**train_results, **eval_results}
    assert json.loads((out / "results.json").read_text())["versions"]["transformers"] == transformers.__version__
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "model-index" in card
    assert not (out / "model").exists()


def test_records_and_card_say_what_ran(sst2):
    """They say --max_steps 3 stopped at 1.5 of 2 epochs, the seed ordered the data, and 1 of 4 dev rows was scored."""
    from huggingface_hub import ModelCard

    _, out, _ = sst2
    results = json.loads((out / "results.json").read_text())
    best = results["best"]
    assert (best["epochs"], best["steps"], best["data_seed"]) == (1.5, 3, 42)
    assert results["hyperparameters"]["logging_steps"] == 1
    assert json.loads((out / "run_config.json").read_text())["training"]["logging_steps"] == 1
    assert results["eval_rows"] == {"validation": [1, 4]}
    card = ModelCard.load(out / "README.md")
    assert "1.5 epochs (3 steps)" in card.text and "first 1 of 4 rows" in card.text
    assert "| data_seed | none (each run's seed) |" in card.text or "each run's seed" in card.text
    (entry,) = card.data.eval_results
    assert entry.metric_value == best["validation"]["accuracy"] <= 1  # a fraction, as evaluate's accuracy gives it


def test_the_majority_class_is_scored_on_the_models_rows(sst2):
    """With --max_eval_samples 1 the model is scored on the first dev row: so is the majority class (1.0 there,
    0.25 on all four rows), in results.json, results.md and the card."""
    _, out, _ = sst2
    results = json.loads((out / "results.json").read_text())
    assert results["majority_baseline"] == {"validation": {"accuracy": 1.0}}
    assert "| majority class | | 1.0000 | |" in (out / "results.md").read_text()
    assert re.search(r"\| Accuracy \(main\) \| [\d.]+ \| 100\.00 \|", (out / "README.md").read_text())


@pytest.mark.parametrize(
    "stage, written", [("--do_eval", {"eval_results.json", "all_results.json"}), ("--do_predict", {"glue_submission"})]
)
def test_do_eval_or_do_predict_alone_trains_nothing_and_writes_only_its_results(sst2, tmp_path, stage, written):
    data, finetuned, _ = sst2
    out = tmp_path / "out"
    summary = run_finetuning(FineTuningRecipe.from_args(sst2_argv(data, finetuned, out, stage)))
    assert {p.name for p in out.iterdir()} == written  # as run_glue: no run, no record, no lock left
    if stage == "--do_eval":
        metrics = json.loads((out / "eval_results.json").read_text())
        assert metrics["eval_accuracy"] == summary["eval"]["validation"]["accuracy"]
        assert "train_loss" not in json.loads((out / "all_results.json").read_text())
    else:
        lines = (out / "glue_submission" / "SST-2.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == 3


def test_resume_from_checkpoint_path_resumes_from_it_or_refuses(sst2, tmp_path):
    """A seed-7 run from the checkpoint at step 3 has its steps 1-3 (seed 42's), then a step 4 of its own."""
    data, finetuned, model = sst2
    checkpoint = finetuned / "runs" / RUN / "checkpoint-3"
    argv = sst2_argv(data, model, tmp_path / "resumed", "--max_steps", "4", "--seed", "7")
    run_finetuning(FineTuningRecipe.from_args([*argv, "--resume_from_checkpoint", str(checkpoint)]))
    state = json.loads((tmp_path / "resumed" / "runs" / "lr0.0001_seed7" / "trainer_state.json").read_text())
    losses = {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}
    before = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    assert [losses[step] for step in (1, 2, 3)] == [entry["loss"] for entry in before if "loss" in entry]
    assert state["global_step"] == 4 and 4 in losses
    argv = sst2_argv(data, model, tmp_path / "refused", "--resume_from_checkpoint", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigurationError, match=r"^--resume_from_checkpoint .*nowhere: not a folder\.$"):
        run_finetuning(FineTuningRecipe.from_args(argv))
    assert not (tmp_path / "refused").exists()


def test_a_finished_fine_tune_is_trained_further(sst2, tmp_path):
    """3 -> 5 steps with --resume_from_checkpoint true: from the run's last checkpoint, on the longer schedule."""
    data, finetuned, model = sst2
    out = shutil.copytree(finetuned, tmp_path / "out")
    argv = sst2_argv(data, model, out, "--num_train_epochs", "2", "--max_eval_samples", "1")
    run_finetuning(FineTuningRecipe.from_args([*argv, "--max_steps", "5", "--resume_from_checkpoint", "true"]))
    state = json.loads((out / "trainer_state.json").read_text())
    steps = {e["step"]: e for e in state["log_history"] if "loss" in e}
    assert state["global_step"] == 5 and list(steps)[-2:] == [4, 5]
    assert steps[4]["learning_rate"] > 0  # the 5-step schedule's rate, not the 3-step one's end (0)
    assert json.loads((out / "results.json").read_text())["best"]["steps"] == 5
    assert (out / "runs" / RUN / "checkpoint-5").is_dir()
    with pytest.raises(RunFinished):
        run_finetuning(FineTuningRecipe.from_args([*argv, "--max_steps", "5", "--resume_from_checkpoint", "true"]))
    # more epochs, likewise
    record = run_identity(json.loads((out / "run_config.json").read_text()))
    record["training"]["num_train_epochs"] += 1
    grown = check_output_dir(out, record, resume=True, overwrite=False, identity=run_identity, may_grow=GROW)
    assert grown == {"training.num_train_epochs": (2.0, 3.0)}


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
