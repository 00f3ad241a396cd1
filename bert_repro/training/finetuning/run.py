"""`run_finetuning(recipe)`: the paper's protocol (appendix A.3), the task's grid of learning rates x seeds, the best
on dev kept, in stages the same command completes: train, records (results.json, results.md), card, push."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainingArguments, set_seed

from ...atomic import write_json, write_text
from ...data.wordpiece import load_tokenizer, save_tokenizer
from ...hub.model_card import card_for_finetuning
from ...hub.push import HubPushError, push
from ...model.conversion import CheckpointError
from ...tasks.columns import TaskDataError
from ...tasks.files import load_task_data
from ...tasks.registry import Task
from ...versions import framework_versions
from .. import lifecycle
from ..cli import ConfigurationError, fit_to_this_machine
from ..cluster import catching_stop_signals, log_from_the_main_process, stop_between_runs, stop_message
from ..distributed import TRAINER_STATE_NAME, hardware
from ..publishing import take_push_request
from .checks import check_inputs, splits_at_hand, test_prediction_files
from .recipe import FineTuningArguments, FineTuningRecipe, data_source, find_task, head_settings, resume_path
from .trainer import encode_splits, load_model, one_run, predict, task_rows, task_trainer

logger = logging.getLogger(__name__)

# Problems the user can fix: the recipes say them in one line and exit 2, without a traceback.
USER_ERRORS = (ConfigurationError, CheckpointError, TaskDataError, HubPushError, FileExistsError, FileNotFoundError)


def run_finetuning(recipe: FineTuningRecipe) -> dict[str, Any]:
    """The whole protocol for one task (the grid, the best on dev kept), in stages that the same command completes:
    train, records (results.json), card, push. Without --do_train, `evaluate_model`."""
    run, training = recipe.resolved()
    check_inputs(run, training)
    log_from_the_main_process(training)
    if not training.do_train:
        return evaluate_model(run, training)
    lrs, seeds = len(run.learning_rates), len(run.seeds)
    plan = f"{lrs} learning rate(s) x {seeds} seed(s) = {lrs * seeds} run(s)"
    if not recipe.finetuning.learning_rates and lrs > 1:  # a grid by default: said with its rates, as it costs
        grid = "the feature-based grid" if run.features is not None else f"the paper's grid for {run.task}"
        plan += f" ({grid}: {' '.join(f'{lr:g}' for lr in run.learning_rates)}); pass --learning_rate to train one"
    logger.info(plan)
    if warning := run.torch_compile_warning(training.torch_compile):
        logger.warning(warning)
    fit_to_this_machine(training)
    task, data, missing_splits, push_to = open_output_dir(run, training)
    output_dir, start = Path(training.output_dir), time.time()
    # Read once, on every process: each stage below is a collective (`stop_between_runs`).
    done = lifecycle.read_stages(output_dir)
    with catching_stop_signals():  # one that comes between two runs or stages is not lost: each boundary acts on it
        runs, best, stopped = train_grid(task, data, run, training)
        if stopped is None and "records" not in done:
            summary = run_summary(task, data, run, training, runs, best, missing_splits, time.time() - start)
            if training.process_index == 0:
                write_records(output_dir, task, summary)
            stopped = stop_between_runs(training, "after the records")
        summary = json.loads((output_dir / lifecycle.RESULTS).read_text()) if stopped is None else {}
        if stopped is None and "card" not in done:
            if training.process_index == 0:
                repo_id = training.hub_model_id or output_dir.resolve().name
                write_text(output_dir / "README.md", str(card_for_finetuning(output_dir, repo_id, summary=summary)))
                lifecycle.complete(output_dir, "card")
            stopped = stop_between_runs(training, "after the card")
        if stopped is None and push_to is not None and not pushed(done, push_to):
            if training.process_index == 0:
                summary["pushed"] = push_to.push(output_dir, push)
                lifecycle.complete(output_dir, "push", **push_to.target, commit=summary["pushed"].commit)
            stopped = stop_between_runs(training, "after the push")
    lifecycle.release_output_dir(output_dir)
    if stopped is not None:
        return stopped
    logger.info("\n%s", results_markdown(task, summary))
    logger.info("The best run's model (%s): %s", run_name(best["learning_rate"], best["seed"]), output_dir)
    return summary


def run_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}_seed{seed}"


SCHEMA_VERSION = 2  # the layout of `run_config.json`
# What says where outputs and pushes go, and credentials: not part of the record (a moved folder resumes).
NOT_RECORDED = ("output_dir", "hub_", "push_")
# Settings that change no result: a resumed grid may change them. Paths are not identity either: what they hold is
# (the record's "inputs", `fingerprints`), and the stages asked for are the stage record's.
NOT_IDENTITY = (
    *("overwrite_output_dir", "num_proc", "report_to", "disable_tqdm", "resume_from_checkpoint", "eval_strategy"),
    *("eval_steps", "eval_delay", "eval_on_start", "save_strategy", "save_steps", "save_total_limit"),
    *("logging_steps", "logging_strategy", "logging_first_step", "logging_nan_inf_filter", "logging_dir"),
    *("per_device_eval_batch_size", "eval_accumulation_steps", "dataloader_num_workers", "log_level", "run_name"),
    *("model", "tokenizer", "data"),
)
# What a grid may raise on resumption, training every run further from its last checkpoint.
GROW = ("training.max_steps", "training.num_train_epochs")


def run_identity(record: dict) -> dict:
    """A run's record without the settings a resumed grid may change (`NOT_IDENTITY`)."""
    return {
        section: {k: v for k, v in values.items() if k not in NOT_IDENTITY}
        if isinstance(values, dict) and section != "inputs"
        else values
        for section, values in record.items()
    }


def open_output_dir(run: FineTuningArguments, training: TrainingArguments):
    """Check the output directory (this run's by what it read), the push and the task's data before anything is
    written, then lock the directory. (task, data, missing splits, push)"""
    task, output_dir = find_task(run.task), Path(training.output_dir)
    # run_config.json: the settings the run uses, by section, in JSON types, then the fingerprints of what it reads
    record = {"schema_version": SCHEMA_VERSION, "finetuning": asdict(run)}
    record["training"] = {k: v for k, v in training.to_dict().items() if not k.startswith(NOT_RECORDED)}
    record = json.loads(json.dumps(record, default=str))
    inputs = {"model": run.model, "tokenizer": run.tokenizer, "data": run.data or task.hub_id}
    record["inputs"] = lifecycle.fingerprints(inputs, hub_type="dataset")
    wanted = dict.fromkeys(("train", "records", "card"), {})
    if training.push_to_hub:
        wanted["push"] = {"repo_id": training.hub_model_id, "revision": training.hub_revision}
    resumed = resume_path(training) is not None or str(training.resume_from_checkpoint).lower() == "true"
    check = partial(lifecycle.check_output_dir, output_dir, record, resume=True, identity=run_identity, may_grow=GROW)
    check = partial(check, wanted=wanted, overwrite=run.overwrite_output_dir, resumed=resumed)
    grown = check()
    push_to = take_push_request(training)
    if push_to and not grown and "records" in (done := lifecycle.read_stages(output_dir)) and not pushed(done, push_to):
        logger.info("%s: trained, recorded and carded earlier; now pushing it", output_dir)
    data = load_task_data(task, data_source(run.data))  # bad data fails before the run is recorded
    task, missing_splits = splits_at_hand(task, data, run, training)
    lifecycle.lock_output_dir_once(output_dir, training, check, overwrite=run.overwrite_output_dir, resumed=resumed)
    with training.main_process_first(local=False, desc="opening the output directory"):
        if grown and training.process_index == 0:
            # Before the record changes: the grid and each run are unfinished again, and so are the later stages.
            logger.info("training the grid further: %s", ", ".join(f"{k} {a} -> {b}" for k, (a, b) in grown.items()))
            lifecycle.forget(output_dir, *lifecycle.STAGES)
            for done in [output_dir / lifecycle.RESULTS, *output_dir.glob("runs/*/result.json")]:
                done.unlink(missing_ok=True)
    lifecycle.write_run_config(output_dir, record)
    return task, data, missing_splits, push_to


def pushed(done: dict, push_to) -> bool:
    """Whether the "push" stage is done, to the same repository and revision as asked now."""
    return "push" in done and all(done["push"].get(k) == v for k, v in push_to.target.items())


def train_grid(task: Task, data, run: FineTuningArguments, training: TrainingArguments):
    """Every run of the grid not finished before, the best model saved at the top of the output directory as it is
    found. (runs' results, the best, the result of a run stopped by a signal or None)."""
    output_dir, tokenizer = Path(training.output_dir), load_tokenizer(run.tokenizer or run.model)
    runs, best, splits = [], None, None
    for lr in run.learning_rates:
        for seed in run.seeds:
            if stopped := stop_between_runs(training, f"before run {run_name(lr, seed)}"):
                return runs, best, stopped
            run_dir = output_dir / "runs" / run_name(lr, seed)
            done = run_dir / "result.json"
            if done.exists():  # finished earlier: not run again
                result, trainer = json.loads(done.read_text()), None
            else:
                splits = splits or encode_splits(task, task_rows(task, data, run), tokenizer, run)  # a run left to do
                result, trainer = one_run(task, splits, tokenizer, run, training, lr, seed, run_dir)
                if "stopped_by" in result:  # SIGTERM / SIGUSR1: the same command continues this run
                    if trainer.is_world_process_zero():
                        logger.warning(stop_message(trainer.stop_on_signal, None))
                    return runs, best, result
            runs.append(result)
            logger.info("%s lr=%g seed=%d: %s %.4f", task.name, lr, seed, task.main_metric, result["score"])
            # the best so far, NaN (e.g. constant predictions) ranking last
            if best is None or not math.isnan(result["score"]) and not result["score"] <= best["score"]:
                best = result
                if trainer is not None:
                    trainer.save_full_model(str(output_dir))  # every process: FSDP gathers the shards
                    save_tokenizer(tokenizer, output_dir)  # with vocab.txt
                    if training.do_predict:  # now, with the best model at hand: a rerun may not train it again
                        write_test_predictions(task, trainer, data, tokenizer, run, output_dir)
            if trainer is not None:
                if run.keep_all_runs:
                    trainer.save_full_model(str(run_dir / "model"))
                # Last: a run with result.json is not run again, so its model (when best) must be saved already.
                done.parent.mkdir(parents=True, exist_ok=True)
                write_json(done, result)
    return runs, best, stop_between_runs(training, "after the grid's last run")


TRAINER_FILES = ("train_results.json", "eval_results.json", "all_results.json", TRAINER_STATE_NAME)
# results.json's "hyperparameters" (warmup_steps as "warmup"; a data_seed of None: each run's seed)
HYPERPARAMETERS = (
    *("learning_rates", "seeds", "num_train_epochs", "per_device_train_batch_size", "max_seq_length", "warmup_steps"),
    *("weight_decay", "max_steps", "logging_steps", "data_seed", "max_train_samples", "max_eval_samples"),
)


def majority_baseline(task: Task, rows) -> dict[str, dict[str, float]]:
    """Each evaluation split's metrics for always predicting the most frequent training label: the score to beat."""
    out = {}
    for name in task.eval_splits:
        predictions = task.kind.majority_predictions(task, rows["train"], rows[name])
        if predictions is not None and task.kind.labelled(task, rows[name]):
            out[name] = task.kind.score(task, rows[name], predictions)
    return out


def run_summary(task, data, run, training, runs, best, missing_splits, seconds: float) -> dict[str, Any]:
    """results.json: the grid's runs, the best, the settings a reader needs, the baseline to beat."""
    rows, files = task_rows(task, data, run), test_prediction_files(task, data, Path(training.output_dir)).values()
    hyperparameters = {k: getattr(run if hasattr(run, k) else training, k) for k in HYPERPARAMETERS}
    hyperparameters["warmup"] = hyperparameters.pop("warmup_steps")
    summary = {"task": task.name, "model": run.model, "main_metric": task.main_metric, "features": run.features}
    summary |= {"model_class": head_settings(task, run)[0].__name__, "best": best, "runs": runs}
    summary |= {"hyperparameters": hyperparameters, "seconds": round(seconds, 1), "hardware": hardware(training.device)}
    summary["versions"] = framework_versions()  # the card lists them as transformers' cards do
    summary["test_predictions"] = [str(p) for p in files if training.do_predict and p.exists()]
    summary |= {"missing_splits": missing_splits, "majority_baseline": majority_baseline(task, rows)}
    summary["eval_rows"] = {name: [len(rows[name]), len(data[name])] for name in task.eval_splits}  # [scored, of]
    return summary


def write_records(output_dir: Path, task: Task, summary: dict) -> None:
    """The "records" stage: the best run's Trainer files at the top, results.md, then results.json."""
    best_dir = output_dir / "runs" / run_name(summary["best"]["learning_rate"], summary["best"]["seed"])
    for name in TRAINER_FILES:  # the best run's, where Trainer's `save_state` and `save_metrics` leave them
        write_text(output_dir / name, (best_dir / name).read_text())
    write_text(output_dir / "results.md", results_markdown(task, summary))
    lifecycle.complete(output_dir, "train")
    write_json(output_dir / lifecycle.RESULTS, summary)  # last: the "records" stage is done when it is there


def write_test_predictions(task: Task, trainer: Trainer, data, tokenizer, run, output_dir: Path) -> list[str]:
    """GLUE test-set predictions in the leaderboard's format: `index<TAB>prediction`, one file per test split."""
    files = test_prediction_files(task, data, output_dir)
    for split_name, path in files.items():
        raw = data[split_name]
        predictions, _ = predict(task, trainer, raw, task.kind.encode(task, raw, tokenizer, run, train=False), run)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(f"{i}\t{task.format_submission_value(p)}\n" for i, p in zip(raw["idx"], predictions))
        write_text(path, "index\tprediction\n" + lines)
    return [str(path) for path in files.values()]


def _flat_metrics(result: dict, task: Task) -> dict[str, float]:
    out = {}
    for split_name in task.eval_splits:
        for key, value in result.get(split_name, {}).items():
            if isinstance(value, float) and not key.endswith(("_total", "thresh", "_threshold")):
                out[f"{split_name}/{key}" if len(task.eval_splits) > 1 else key] = value
    return out


def results_markdown(task: Task, summary: dict) -> str:
    """The runs of a task as a Markdown table, the best marked."""
    rows = summary["runs"]
    keys = list(_flat_metrics(rows[0], task)) if rows else []
    approach = f"feature-based ({summary['features']})" if summary.get("features") else "fine-tuning"
    lines = [f"# {task.name}: {approach} {summary['model']}", ""]
    lines += [f"Main metric: {task.main_metric} on {task.eval_splits[0]}; best run marked with *.", ""]
    lines += ["| lr | seed | " + " | ".join(keys) + " | train s |", "|---|---|" + "---|" * len(keys) + "---|"]
    for r in rows:
        values, mark = _flat_metrics(r, task), "*" if r == summary["best"] else ""
        cells = " | ".join(f"{values.get(k, float('nan')):.4f}" for k in keys)
        lines.append(f"| {r['learning_rate']:g}{mark} | {r['seed']} | {cells} | {r['train_seconds']} |")
    if baseline := summary["majority_baseline"]:
        values = _flat_metrics(baseline, task)
        cells = " | ".join(f"{values[k]:.4f}" if k in values else "" for k in keys)
        lines.append(f"| majority class | | {cells} | |")
        lines += ["", "majority class: the training set's most frequent label for every example, the score to beat."]
    if degenerate := [
        f"lr {r['learning_rate']:g} seed {r['seed']} predicts {label!r} for every example of {split}"
        for r in rows
        for split, label in (r.get("one_label") or {}).items()
    ]:
        lines += ["", "**Learned nothing beyond one label:** " + "; ".join(degenerate) + "."]
    return "\n".join(lines) + "\n"


def evaluate_model(run: FineTuningArguments, training: TrainingArguments) -> dict[str, Any]:
    """--do_eval and/or --do_predict without --do_train, as run_glue does them: --model as it is, eval_results.json
    and the test-set predictions written into --output_dir (the model's own folder too), nothing else touched."""
    task, output_dir = find_task(run.task), Path(training.output_dir)
    if run.overwrite_output_dir:
        logger.info("--overwrite_output_dir: an evaluation replaces only its own files; nothing is moved aside")
    take_push_request(training)  # checked; an evaluation publishes nothing: said in `check_stages`
    data = load_task_data(task, data_source(run.data))
    task, _ = splits_at_hand(task, data, run, training)
    if training.process_index == 0:
        lifecycle.lock_output_dir(output_dir)
    with catching_stop_signals():
        tokenizer = load_tokenizer(run.tokenizer or run.model)
        rows = task_rows(task, data, run, train=False) if training.do_eval else {}
        splits = encode_splits(task, rows, tokenizer, run)
        set_seed(training.seed)
        trainer = task_trainer(task, splits, tokenizer, run, training, load_model(task, run))
        summary: dict[str, Any] = {"task": task.name, "model": run.model}
        if training.do_eval:
            metrics = trainer.evaluate()
            summary["eval"] = trainer.evaluated[1]
            if trainer.is_world_process_zero():
                write_json(output_dir / "eval_results.json", metrics, sort_keys=True)
                write_json(output_dir / "all_results.json", metrics, sort_keys=True)
        if training.do_predict:
            summary["test_predictions"] = write_test_predictions(task, trainer, data, tokenizer, run, output_dir)
        stopped = stop_between_runs(training, "after the evaluation")
    lifecycle.release_output_dir(output_dir)
    return stopped or summary
