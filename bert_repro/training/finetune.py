"""Fine-tuning on the paper's tasks (section 4): one code path for every task; the task's kind
(`bert_repro.tasks.kinds`) gives what differs (head, encoding, decoding, metrics).

The paper's protocol (appendix A.3): the task's grid of learning rates x seeds ("random restarts"), the best run on
the first evaluation split kept. `--head bilstm` (Table 5) and `--features SET` (section 5.3, Table 7) share it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

import datasets
import numpy as np
import torch
from transformers import Trainer, TrainingArguments, set_seed

from ..atomic import write_json, write_text
from ..data.wordpiece import load_tokenizer, save_tokenizer
from ..hub.model_card import card_for_finetuning
from ..hub.push import HubPushError, push
from ..model.bilstm_heads import FeatureSetError
from ..model.conversion import CheckpointError, load_bert
from ..tasks.columns import TaskDataError
from ..tasks.files import describe_sources, load_task_data
from ..tasks.registry import Task
from ..versions import framework_versions
from .checkpoints import newest_valid_checkpoint
from .cli import ConfigurationError, fit_to_this_machine
from .cluster import catching_stop_signals, stop_between_runs, stop_message
from .distributed import TRAINER_STATE_NAME, EngineTrainer, hardware, write_trainer_state
from .finetune_recipe import (
    HEAD_INITIALIZERS,
    FineTuningArguments,
    FineTuningRecipe,
    check_inputs,
    find_task,
    grid_plan,
    head_settings,
    record_of,
    resume_path,
)
from .lifecycle import RESULTS, check_output_dir, lock_output_dir_once, release_output_dir, write_run_config
from .pretraining.resume import LongerSchedule
from .publishing import take_push_request

logger = logging.getLogger(__name__)

# Settings that do not change what a run trains: a resumed grid may change them.
NOT_IDENTITY = (
    *("overwrite_output_dir", "num_proc", "report_to", "disable_tqdm", "resume_from_checkpoint", "eval_strategy"),
    *("eval_steps", "eval_delay", "eval_on_start", "save_strategy", "save_steps", "save_total_limit"),
    *("logging_steps", "logging_strategy", "logging_first_step", "logging_nan_inf_filter"),
)
# What a grid may raise on resumption, training every run further from its last checkpoint.
GROW = ("training.max_steps", "training.num_train_epochs")
# Problems the user can fix: the recipes say them in one line and exit 2, without a traceback.
USER_ERRORS = (ConfigurationError, CheckpointError, TaskDataError, HubPushError, FileExistsError, FileNotFoundError)


def model_inputs(task: Task, raw: datasets.Dataset, encoded: datasets.Dataset) -> datasets.Dataset:
    """What the model reads of an encoded split: without the columns decoding needs, nor hidden test labels (-1)."""
    drop = list(task.kind.decode_columns) + ([] if task.kind.labelled(task, raw) else ["labels"])
    return encoded.remove_columns([c for c in drop if c in encoded.column_names])


def predict(task: Task, trainer: Trainer, raw: datasets.Dataset, encoded: datasets.Dataset, run) -> tuple[Any, Any]:
    """A raw split's decoded predictions, and the mean loss (None where the model reads no labels: SQuAD's dev)."""
    output = trainer.predict(model_inputs(task, raw, encoded))
    return task.kind.decode(task, output.predictions, raw, encoded, run), output.metrics.get("test_loss")


def run_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}_seed{seed}"


def _rank(result: dict) -> float:
    """A run's score for choosing the best; NaN (e.g. constant predictions) ranks last."""
    value = result["score"]
    return float("-inf") if value != value else value


def data_source(data: list[str]):
    """--data: nothing (the Hub), one directory or file, or `split=path` pairs (`train=a.parquet dev=b.csv`)."""
    if not data:
        return None
    if all("=" in item for item in data):
        return dict(item.split("=", 1) for item in data)
    if len(data) == 1:
        return data[0]
    raise ConfigurationError(f"--data takes one directory or file, or split=path pairs; got {data}.")


def _subset(split: datasets.Dataset, n: int | None) -> datasets.Dataset:
    return split if n is None or len(split) <= n else split.select(range(n))


def task_rows(task: Task, data, run: FineTuningArguments, *, train: bool = True) -> dict[str, datasets.Dataset]:
    """{split: the rows a run reads}, cut to --max_train_samples and --max_eval_samples."""
    rows = {"train": _subset(data["train"], run.max_train_samples)} if train else {}
    return rows | {name: _subset(data[name], run.max_eval_samples) for name in task.eval_splits}


def encode_splits(task: Task, rows: dict, tokenizer, run: FineTuningArguments) -> dict[str, tuple]:
    """{split: (raw rows, model inputs)} of `task_rows`, encoded once for the whole grid."""
    encode = task.kind.encode
    return {name: (raw, encode(task, raw, tokenizer, run, train=name == "train")) for name, raw in rows.items()}


class TaskTrainer(EngineTrainer):
    """Trainer whose evaluation is the task's own (SQuAD's span search, every evaluation split), so that Trainer's
    `eval_strategy`, `metric_for_best_model`, `load_best_model_at_end` and logs carry the task's numbers."""

    def __init__(self, *args, task: Task, splits: dict[str, tuple], settings: FineTuningArguments, **kwargs):
        super().__init__(*args, **kwargs)
        self.task, self.splits, self.settings = task, splits, settings
        # the last evaluation: (step, {split: metrics, "one_label": {split: label}}, logged metrics)
        self.evaluated: tuple[int, dict, dict] | None = None

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        # A DataLoader draws its seed from torch's generator: restored, evaluating leaves later dropout masks alone.
        devices = [self.args.device] if self.args.device.type == "cuda" else []
        result: dict[str, Any] = {}
        metrics = {}
        with torch.random.fork_rng(devices=devices):
            for i, split_name in enumerate(self.task.eval_splits):
                raw, encoded = self.splits[split_name]
                predictions, loss = predict(self.task, self, raw, encoded, self.settings)
                result[split_name] = self.task.kind.score(self.task, raw, predictions)
                if (label := one_label(self.task, predictions)) is not None:
                    result.setdefault("one_label", {})[split_name] = label
                prefix = metric_key_prefix if i == 0 else f"{metric_key_prefix}_{split_name}"
                values = {"loss": loss} if loss is not None else {}
                values.update({k: v for k, v in result[split_name].items() if isinstance(v, (int, float))})
                metrics.update({f"{prefix}_{name}": value for name, value in values.items()})
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self.evaluated = (self.state.global_step, result, metrics)
        return metrics


def load_model(task: Task, run: FineTuningArguments):
    """--model with the task's head (its own, else a new one drawn as --head_initializer)."""
    label_kwargs = {"id2label": task.id2label, "label2id": task.label2id} if task.label_names else {}
    model_class, head_fields = head_settings(task, run)
    try:
        model = load_bert(
            run.model,
            model_class,
            num_labels=task.num_labels,
            attn_implementation=run.attn_implementation,
            initializer_distribution=HEAD_INITIALIZERS[run.head_initializer],
            **run.switches(),
            **label_kwargs,
            **head_fields,
        )
    except FeatureSetError as err:
        raise ConfigurationError(f"--features {run.features} with {run.model}: {err}") from None
    if run.compile_layers:
        model.compile_layers()
    return model


def task_trainer(task, splits, tokenizer, run, training: TrainingArguments, model, **changes) -> TaskTrainer:
    args = TrainingArguments(**{**training.to_dict(), **changes})
    environment = {}
    if "output_dir" in changes:  # a run's TensorBoard events in its folder, or in <run>/ of an exported folder
        logs = os.environ.get("TENSORBOARD_LOGGING_DIR")
        environment["TENSORBOARD_LOGGING_DIR"] = (
            os.path.join(logs, Path(args.output_dir).name) if logs else args.output_dir
        )
    if training.torch_compile:
        # Batches of many widths: dynamic from the start is one graph, not two recompiles (test_compile.py).
        environment["ACCELERATE_DYNAMO_USE_DYNAMIC"] = os.environ.get("ACCELERATE_DYNAMO_USE_DYNAMIC", "true")
    first = task.eval_splits[0]
    with patch.dict(os.environ, environment):
        return TaskTrainer(
            model=model,
            args=args,
            train_dataset=splits["train"][1] if "train" in splits else None,
            eval_dataset=model_inputs(task, *splits[first]) if first in splits else None,  # `evaluate` reads raw
            data_collator=task.kind.collator(tokenizer),
            processing_class=tokenizer,
            callbacks=[LongerSchedule()],  # a run trained further (a larger --max_steps) on its longer schedule
            task=task,
            splits=splits,
            settings=run,
        )


def one_run(
    task,
    splits: dict[str, tuple],
    tokenizer,
    run: FineTuningArguments,
    training: TrainingArguments,
    lr: float,
    seed: int,
    run_dir: Path,
) -> tuple[dict[str, Any], Trainer]:
    """Fine-tune once, evaluate, and leave in `run_dir` what Trainer's example scripts leave."""
    set_seed(seed)
    model = load_model(task, run)
    data_seed = seed if training.data_seed is None else training.data_seed  # --data_seed: the same order
    changes = {"output_dir": str(run_dir), "learning_rate": lr, "seed": seed, "data_seed": data_seed}
    trainer = task_trainer(task, splits, tokenizer, run, training, model, **changes)
    start = time.time()
    # a run stopped by a signal, or trained further, goes on from its newest checkpoint
    checkpoint = resume_path(training) or newest_valid_checkpoint(run_dir)
    if checkpoint:
        logger.info("%s: resuming from %s", run_dir, checkpoint)
    trained = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if trainer.stop_on_signal.stopped:
        return {"stopped_by": trainer.stop_on_signal.stopped[0]}, trainer
    seconds = round(time.time() - start, 1)
    step = trainer.state.global_step
    if trainer.evaluated is None or trainer.evaluated[0] != step or training.load_best_model_at_end:
        trainer.evaluate()  # the model as it ends (with --load_best_model_at_end, the best checkpoint's)
    _, scores, eval_metrics = trainer.evaluated
    result: dict[str, Any] = {
        "learning_rate": lr,
        "seed": seed,
        "data_seed": data_seed,
        "epochs": round(trainer.state.epoch or 0.0, 4),  # what ran: --max_steps may stop a run within an epoch
        "steps": step,
        "train_seconds": seconds,
        "engine": trainer.engine,
        **scores,
    }
    # SQuAD v2.0 ranks by F1 at the best null threshold, which the paper tunes on dev
    first, metric = result[task.eval_splits[0]], task.kind.ranking_metric(task)
    result["score"] = first[metric] if metric in first else first[task.main_metric]
    if trainer.is_world_process_zero():
        # What `save_metrics` and `save_state` leave, written whole: a torn all_results.json stops their merge.
        write_json(run_dir / "train_results.json", trained.metrics, sort_keys=True)
        write_json(run_dir / "eval_results.json", eval_metrics, sort_keys=True)
        write_json(run_dir / "all_results.json", {**trained.metrics, **eval_metrics}, sort_keys=True)
        write_trainer_state(trainer.state, run_dir / TRAINER_STATE_NAME)
    return result, trainer


TRAINER_FILES = ("train_results.json", "eval_results.json", "all_results.json", TRAINER_STATE_NAME)


def one_label(task: Task, predictions) -> str | None:
    """The one label a classifier predicted for every example, or None."""
    if not task.label_names or not isinstance(predictions, np.ndarray) or predictions.ndim != 1:
        return None
    labels = np.unique(predictions)
    return task.label_names[int(labels[0])] if len(labels) == 1 else None


def majority_baseline(task: Task, rows) -> dict[str, dict[str, float]]:
    """Each evaluation split's metrics for always predicting the most frequent training label: the score to beat."""
    out = {}
    for name in task.eval_splits:
        predictions = task.kind.majority_predictions(task, rows["train"], rows[name])
        if predictions is not None and task.kind.labelled(task, rows[name]):
            out[name] = task.kind.score(task, rows[name], predictions)
    return out


def test_prediction_files(task: Task, data, output_dir: Path) -> dict[str, Path]:
    """{test split: the file of its predictions} for a GLUE task whose data has test splits."""
    if not task.glue_submission_names:
        return {}
    folder = output_dir / "glue_submission"
    return {name: folder / task.glue_submission_name(name) for name in task.test_splits if name in data}


def write_test_predictions(task: Task, trainer: Trainer, data, tokenizer, run, output_dir: Path) -> list[Path]:
    """GLUE test-set predictions in the leaderboard's format: `index<TAB>prediction`, one file per test split."""
    written = []
    for split_name, path in test_prediction_files(task, data, output_dir).items():
        raw = data[split_name]
        predictions, _ = predict(task, trainer, raw, task.kind.encode(task, raw, tokenizer, run, train=False), run)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["index\tprediction"] + [
            f"{i}\t{task.format_submission_value(p)}" for i, p in zip(raw["idx"], predictions)
        ]
        write_text(path, "\n".join(lines) + "\n")
        written.append(path)
    return written


def splits_at_hand(task: Task, data: datasets.DatasetDict, run, training) -> tuple[Task, list[str]]:
    """The task narrowed to the evaluation splits the data has, and those it lacks; a split the stages need is
    refused when missing, a later evaluation split (CoNLL-2003's test) only said."""
    source = " ".join(run.data) or "the Hub"
    needed = ["train"] if training.do_train else []
    needed += [task.eval_splits[0]] if training.do_eval else []
    for name in needed:
        if name not in data:
            raise TaskDataError(
                f"{source}: no {name} split of {task.name} (found: {', '.join(data) or 'none'}); expected "
                f"{describe_sources(task)}."
            )
    if training.do_predict and not test_prediction_files(task, data, Path()):
        tests = " or ".join(task.test_splits)
        if not training.do_train and not training.do_eval:
            raise TaskDataError(f"--do_predict: {source} has no {tests} split of {task.name} to predict.")
        logger.warning("%s: no %s split of %s: no test-set predictions.", source, tests, task.name)
    missing = [name for name in task.eval_splits if name not in data]
    if missing and training.do_eval:
        logger.warning(
            "%s: no %s split of %s: evaluating on %s only.",
            source,
            " or ".join(missing),
            task.name,
            ", ".join(n for n in task.eval_splits if n in data),
        )
    return replace(task, eval_splits=tuple(n for n in task.eval_splits if n in data)), missing


def run_finetuning(recipe: FineTuningRecipe) -> dict[str, Any]:
    """The whole protocol for one task (the grid, the best on dev kept); without --do_train, `evaluate_model`."""
    run, training = recipe.resolved()
    check_inputs(run, training)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO, datefmt="%H:%M:%S"
    )
    logger.info(grid_plan(recipe.finetuning, run))
    if warning := run.torch_compile_warning(training.torch_compile):
        logger.warning(warning)
    fit_to_this_machine(training)
    task, data, missing_splits, push_to = open_output_dir(record_of(run, training), run, training)
    if not training.do_train:
        return evaluate_model(task, data, run, training)
    start = time.time()
    with catching_stop_signals():  # one that comes between two runs is not lost: `train_grid` acts on it
        runs, best, stopped = train_grid(task, data, run, training)
    if stopped is not None:
        release_output_dir(training.output_dir)
        return stopped
    output_dir, rows = Path(training.output_dir), task_rows(task, data, run)
    submissions = [p for p in test_prediction_files(task, data, output_dir).values() if p.exists()]
    summary = {
        "task": task.name,
        "model": run.model,
        "main_metric": task.main_metric,
        "model_class": head_settings(task, run)[0].__name__,
        "features": run.features,
        "best": best,
        "runs": runs,
        "hyperparameters": {
            "learning_rates": run.learning_rates,
            "seeds": run.seeds,
            "num_train_epochs": training.num_train_epochs,
            "per_device_train_batch_size": training.per_device_train_batch_size,
            "max_seq_length": run.max_seq_length,
            "warmup": training.warmup_steps,
            "weight_decay": training.weight_decay,
            "max_steps": training.max_steps,
            "logging_steps": training.logging_steps,
            "data_seed": training.data_seed,  # None: each run's seed (its result's data_seed)
            "max_train_samples": run.max_train_samples,
            "max_eval_samples": run.max_eval_samples,
        },
        "seconds": round(time.time() - start, 1),
        "hardware": hardware(training.device),
        "versions": framework_versions(),  # the card lists them as transformers' cards do
        "test_predictions": [str(p) for p in submissions if training.do_predict],
        "missing_splits": missing_splits,
        "majority_baseline": majority_baseline(task, rows),
        "eval_rows": {name: [len(rows[name]), len(data[name])] for name in task.eval_splits},  # [scored, of]
    }
    best_dir = output_dir / "runs" / run_name(best["learning_rate"], best["seed"])
    if training.process_index == 0:
        for name in TRAINER_FILES:  # the best run's, where Trainer's `save_state` and `save_metrics` leave them
            write_text(output_dir / name, (best_dir / name).read_text())
        write_text(output_dir / "results.md", results_markdown(task, summary))
        repo_id = training.hub_model_id or output_dir.resolve().name
        write_text(output_dir / "README.md", str(card_for_finetuning(output_dir, repo_id, summary=summary)))
        write_json(output_dir / RESULTS, summary)  # last: the runs' summary, once every file it names is there
    logger.info("\n%s", results_markdown(task, summary))
    logger.info("The best run's model (%s): %s", run_name(best["learning_rate"], best["seed"]), output_dir)
    if push_to is not None:
        summary["pushed"] = push_to.push(output_dir, push)
    release_output_dir(output_dir)
    return summary


def evaluate_model(task: Task, data, run: FineTuningArguments, training: TrainingArguments) -> dict[str, Any]:
    """--do_eval and/or --do_predict without --do_train: --model as it is (as run_glue's `save_metrics("eval")`)."""
    output_dir = Path(training.output_dir)
    tokenizer = load_tokenizer(run.tokenizer or run.model)
    splits = encode_splits(task, task_rows(task, data, run, train=False), tokenizer, run) if training.do_eval else {}
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
        summary["test_predictions"] = [
            str(p) for p in write_test_predictions(task, trainer, data, tokenizer, run, output_dir)
        ]
    return summary


def open_output_dir(record: dict[str, Any], run: FineTuningArguments, training: TrainingArguments):
    """Check the output directory, the push and the task's data before the run is recorded, then lock the directory.
    (task, data, missing splits, push)"""
    task, output_dir = find_task(run.task), Path(training.output_dir)
    overwrite = run.overwrite_output_dir
    check = partial(check_output_dir, output_dir, run_identity(record), resume=True, overwrite=overwrite)
    check = partial(check, identity=run_identity, may_grow=GROW)
    grown = check()
    push_to = take_push_request(training)
    data = load_task_data(task, data_source(run.data))  # bad data fails before the run is recorded
    task, missing_splits = splits_at_hand(task, data, run, training)
    lock_output_dir_once(output_dir, training, check, overwrite=overwrite)
    with training.main_process_first(local=False, desc="opening the output directory"):
        if grown and training.process_index == 0:
            # Before the record changes: results.json says the grid is finished, result.json that a run is.
            logger.info("training the grid further: %s", ", ".join(f"{k} {a} -> {b}" for k, (a, b) in grown.items()))
            for done in [output_dir / RESULTS, *output_dir.glob("runs/*/result.json")]:
                done.unlink()
    write_run_config(output_dir, record)
    return task, data, missing_splits, push_to


def train_grid(task: Task, data, run: FineTuningArguments, training: TrainingArguments):
    """Every run of the grid not finished before, the best model saved at the top of the output directory as it is
    found. (runs' results, the best, the result of a run stopped by a signal or None)."""
    output_dir = Path(training.output_dir)
    tokenizer = load_tokenizer(run.tokenizer or run.model)
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
            if best is None or _rank(result) > _rank(best):
                best = result
                if trainer is not None:
                    trainer.save_full_model(str(output_dir))  # every process: FSDP gathers the shards
                    save_tokenizer(tokenizer, output_dir)  # with vocab.txt
                    if training.do_predict:  # now, with the best model at hand: a rerun may not train it again
                        write_test_predictions(task, trainer, data, tokenizer, run, output_dir)
            if trainer is not None and run.keep_all_runs:
                trainer.save_full_model(str(run_dir / "model"))
            if trainer is not None:
                # Last: a run with result.json is not run again, so its model (when best) must be saved already.
                done.parent.mkdir(parents=True, exist_ok=True)
                write_json(done, result)
    return runs, best, stop_between_runs(training, "after the grid's last run")


def run_identity(record: dict) -> dict:
    """A run's record without the settings a resumed grid may change (`NOT_IDENTITY`)."""
    return {
        section: {k: v for k, v in values.items() if k not in NOT_IDENTITY} if isinstance(values, dict) else values
        for section, values in record.items()
    }


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
    lines = [
        f"# {task.name}: {approach} {summary['model']}",
        "",
        f"Main metric: {task.main_metric} on {task.eval_splits[0]}; best run marked with *.",
        "",
        "| lr | seed | " + " | ".join(keys) + " | train s |",
        "|---|---|" + "---|" * len(keys) + "---|",
    ]
    for r in rows:
        values = _flat_metrics(r, task)
        mark = "*" if r is summary["best"] or r == summary["best"] else ""
        lines.append(
            f"| {r['learning_rate']:g}{mark} | {r['seed']} | "
            + " | ".join(f"{values.get(k, float('nan')):.4f}" for k in keys)
            + f" | {r['train_seconds']} |"
        )
    if baseline := summary["majority_baseline"]:
        values = _flat_metrics(baseline, task)
        cells = " | ".join(f"{values[k]:.4f}" if k in values else "" for k in keys)
        lines.append(f"| majority class | | {cells} | |")
        lines += ["", "majority class: the training set's most frequent label for every example, the score to beat."]
    degenerate = [
        f"lr {r['learning_rate']:g} seed {r['seed']} predicts {label!r} for every example of {split}"
        for r in rows
        for split, label in (r.get("one_label") or {}).items()
    ]
    if degenerate:
        lines += ["", "**Learned nothing beyond one label:** " + "; ".join(degenerate) + "."]
    return "\n".join(lines) + "\n"
