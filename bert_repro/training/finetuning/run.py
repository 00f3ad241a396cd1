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
from transformers import Trainer, TrainerState, TrainingArguments, set_seed
from transformers.trainer_utils import TrainOutput

from ...atomic import write_json, write_text
from ...data.wordpiece import load_tokenizer, save_tokenizer
from ...hub.model_card import card_for_finetuning
from ...hub.push import HubPushError, push
from ...model.bilstm_heads import FeatureSetError
from ...model.conversion import CheckpointError, load_bert
from ...tasks.columns import TaskDataError
from ...tasks.files import describe_sources, load_task_data
from ...tasks.registry import Task
from ...versions import framework_versions
from ..checkpoints import check_fits, newest_valid_checkpoint
from ..cli import ConfigurationError, fit_to_this_machine
from ..cluster import catching_stop_signals, log_from_the_main_process, stop_between_runs, stop_message
from ..distributed import TRAINER_STATE_NAME, EngineTrainer, hardware, write_trainer_state
from ..lifecycle import (
    RESULTS,
    STAGES,
    check_output_dir,
    complete,
    fingerprints,
    forget,
    lock_output_dir,
    lock_output_dir_once,
    read_stages,
    release_output_dir,
    write_run_config,
)
from ..pretraining.resume import LongerSchedule, whole_run_loss
from ..publishing import take_push_request
from .recipe import (
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

logger = logging.getLogger(__name__)

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
    first = task.eval_splits[0] if task.eval_splits else None  # predict-only data may have no evaluation split
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
    # a run stopped by a signal, or trained further, goes on from its own newest checkpoint, else from PATH
    checkpoint = newest_valid_checkpoint(run_dir) or resume_path(training)
    set_seed(seed)
    head_note = logging.getLogger("bert_repro.model.modeling_bert_repro")
    level = head_note.level
    head_note.setLevel(logging.ERROR if checkpoint else level)  # resumed, the head is the checkpoint's, not new
    try:
        model = load_model(task, run)
    finally:
        head_note.setLevel(level)
    data_seed = seed if training.data_seed is None else training.data_seed  # --data_seed: the same order
    changes = {"output_dir": str(run_dir), "learning_rate": lr, "seed": seed, "data_seed": data_seed}
    trainer = task_trainer(task, splits, tokenizer, run, training, model, **changes)
    start = time.time()
    if checkpoint:
        logger.info("%s: resuming from %s", run_dir, checkpoint)
        check_fits(checkpoint, model.config)
    if checkpoint and (state := finished_state(checkpoint, training)) is not None:
        # Its last step is saved (a kill came after it): Trainer would take one step more, so it is not called.
        best = state.best_model_checkpoint if training.load_best_model_at_end else None
        trainer.model = trainer.model_wrapped = load_model(task, replace(run, model=best or str(checkpoint))).to(
            trainer.args.device
        )
        trainer.state = state
        trained = TrainOutput(state.global_step, 0.0, finished_metrics(state))
    else:
        try:
            trained = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        except (RuntimeError, ValueError, KeyError) as err:
            if not checkpoint:
                raise
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigurationError(f"cannot resume from {checkpoint}: {first[:300]}") from None
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


def finished_state(checkpoint: str | Path, training: TrainingArguments) -> TrainerState | None:
    """The checkpoint's TrainerState when it holds the run's last step (its max_steps, or all its epochs), else None."""
    path = Path(checkpoint) / TRAINER_STATE_NAME
    if not path.is_file():
        return None
    state = TrainerState.load_from_json(str(path))
    if training.max_steps > 0:
        return state if state.global_step >= training.max_steps else None
    return state if state.epoch is not None and state.epoch >= training.num_train_epochs - 1e-6 else None


def finished_metrics(state: TrainerState) -> dict[str, float]:
    """train_results.json for a run whose training had ended before this invocation: what its state says."""
    return {"epoch": state.epoch, "total_flos": state.total_flos, "train_loss": whole_run_loss(state.log_history)}


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
    """The whole protocol for one task (the grid, the best on dev kept), in stages that the same command completes:
    train, records (results.json), card, push. Without --do_train, `evaluate_model`."""
    run, training = recipe.resolved()
    check_inputs(run, training)
    log_from_the_main_process(training)
    if not training.do_train:
        return evaluate_model(run, training)
    logger.info(grid_plan(recipe.finetuning, run))
    if warning := run.torch_compile_warning(training.torch_compile):
        logger.warning(warning)
    fit_to_this_machine(training)
    task, data, missing_splits, push_to = open_output_dir(run, training)
    output_dir, start = Path(training.output_dir), time.time()
    done = read_stages(output_dir)  # once, on every process: each stage below is a collective (`stop_between_runs`)
    with catching_stop_signals():  # one that comes between two runs or stages is not lost: each boundary acts on it
        runs, best, stopped = train_grid(task, data, run, training)
        if stopped is None and "records" not in done:
            summary = run_summary(task, data, run, training, runs, best, missing_splits, time.time() - start)
            if training.process_index == 0:
                write_records(output_dir, task, summary)
            stopped = stop_between_runs(training, "after the records")
        summary = json.loads((output_dir / RESULTS).read_text()) if stopped is None else {}
        if stopped is None and "card" not in done:
            if training.process_index == 0:
                repo_id = training.hub_model_id or output_dir.resolve().name
                write_text(output_dir / "README.md", str(card_for_finetuning(output_dir, repo_id, summary=summary)))
                complete(output_dir, "card")
            stopped = stop_between_runs(training, "after the card")
        if stopped is None and push_to is not None and not pushed(done, push_to):
            if training.process_index == 0:
                summary["pushed"] = push_to.push(output_dir, push)
                complete(output_dir, "push", **push_to.target, commit=summary["pushed"].commit)
            stopped = stop_between_runs(training, "after the push")
    release_output_dir(output_dir)
    if stopped is not None:
        return stopped
    logger.info("\n%s", results_markdown(task, summary))
    logger.info("The best run's model (%s): %s", run_name(best["learning_rate"], best["seed"]), output_dir)
    return summary


def run_summary(task, data, run, training, runs, best, missing_splits, seconds: float) -> dict[str, Any]:
    """results.json: the grid's runs, the best, the settings a reader needs, the baseline to beat."""
    rows, output_dir = task_rows(task, data, run), Path(training.output_dir)
    submissions = [p for p in test_prediction_files(task, data, output_dir).values() if p.exists()]
    return {
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
        "seconds": round(seconds, 1),
        "hardware": hardware(training.device),
        "versions": framework_versions(),  # the card lists them as transformers' cards do
        "test_predictions": [str(p) for p in submissions if training.do_predict],
        "missing_splits": missing_splits,
        "majority_baseline": majority_baseline(task, rows),
        "eval_rows": {name: [len(rows[name]), len(data[name])] for name in task.eval_splits},  # [scored, of]
    }


def write_records(output_dir: Path, task: Task, summary: dict) -> None:
    """The "records" stage: the best run's Trainer files at the top, results.md, then results.json."""
    best = summary["best"]
    best_dir = output_dir / "runs" / run_name(best["learning_rate"], best["seed"])
    for name in TRAINER_FILES:  # the best run's, where Trainer's `save_state` and `save_metrics` leave them
        write_text(output_dir / name, (best_dir / name).read_text())
    write_text(output_dir / "results.md", results_markdown(task, summary))
    complete(output_dir, "train")
    write_json(output_dir / RESULTS, summary)  # last: the "records" stage is done when it is there


def pushed(done: dict, push_to) -> bool:
    """Whether the "push" stage is done, to the same repository and revision as asked now."""
    return "push" in done and all(done["push"].get(k) == v for k, v in push_to.target.items())


def evaluate_model(run: FineTuningArguments, training: TrainingArguments) -> dict[str, Any]:
    """--do_eval and/or --do_predict without --do_train, as run_glue does them: --model as it is, eval_results.json
    and the test-set predictions written into --output_dir (the model's own folder too), nothing else touched."""
    task, output_dir = find_task(run.task), Path(training.output_dir)
    if run.overwrite_output_dir:
        logger.info("--overwrite_output_dir: an evaluation replaces only its own files; nothing is moved aside")
    take_push_request(training)  # checked; an evaluation publishes nothing: said in `check_stages`
    check_label_names(task, run.model)
    data = load_task_data(task, data_source(run.data))
    task, _ = splits_at_hand(task, data, run, training)
    if training.process_index == 0:
        lock_output_dir(output_dir)
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
            written = write_test_predictions(task, trainer, data, tokenizer, run, output_dir)
            summary["test_predictions"] = [str(p) for p in written]
        stopped = stop_between_runs(training, "after the evaluation")
    release_output_dir(output_dir)
    return stopped or summary


def check_label_names(task: Task, model: str) -> None:
    """A classifier fine-tuned on another task's labels is not scored as if its labels were this task's."""
    try:
        saved = json.loads((Path(model) / "config.json").read_text(encoding="utf-8")).get("id2label") or {}
    except (OSError, ValueError):
        return  # a Hub id or a checkpoint of another format: its head is new, drawn for this task
    names = [saved[k] for k in sorted(saved, key=int)]
    if not task.label_names or not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return
    if names != list(task.label_names):
        raise ConfigurationError(
            f"{model}/config.json: the model's labels are {names}, {task.name}'s are {list(task.label_names)}: it was "
            f"fine-tuned on another task. Evaluate it on its own task, or fine-tune it on {task.name} (--do_train)."
        )


def open_output_dir(run: FineTuningArguments, training: TrainingArguments):
    """Check the output directory (this run's by what it read), the push and the task's data before anything is
    written, then lock the directory. (task, data, missing splits, push)"""
    task, output_dir = find_task(run.task), Path(training.output_dir)
    inputs = fingerprints(
        {"model": run.model, "tokenizer": run.tokenizer, "data": run.data or task.hub_id}, hub_type="dataset"
    )
    record = {**record_of(run, training), "inputs": inputs}
    wanted = dict.fromkeys(("train", "records", "card"), {})
    if training.push_to_hub:
        wanted["push"] = {"repo_id": training.hub_model_id, "revision": training.hub_revision}
    resumed = resume_path(training) is not None or str(training.resume_from_checkpoint).lower() == "true"
    check = partial(
        check_output_dir, output_dir, record, resume=True, identity=run_identity, may_grow=GROW, wanted=wanted
    )
    check = partial(check, overwrite=run.overwrite_output_dir, resumed=resumed)
    grown = check()
    push_to = take_push_request(training)
    if (
        push_to is not None
        and "records" in (done := read_stages(output_dir))
        and not grown
        and not pushed(done, push_to)
    ):
        logger.info("%s: trained, recorded and carded earlier; now pushing it", output_dir)
    data = load_task_data(task, data_source(run.data))  # bad data fails before the run is recorded
    task, missing_splits = splits_at_hand(task, data, run, training)
    lock_output_dir_once(output_dir, training, check, overwrite=run.overwrite_output_dir, resumed=resumed)
    with training.main_process_first(local=False, desc="opening the output directory"):
        if grown and training.process_index == 0:
            # Before the record changes: the grid and each run are unfinished again, and so are the later stages.
            logger.info("training the grid further: %s", ", ".join(f"{k} {a} -> {b}" for k, (a, b) in grown.items()))
            forget(output_dir, *STAGES)
            for done in [output_dir / RESULTS, *output_dir.glob("runs/*/result.json")]:
                done.unlink(missing_ok=True)
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
        section: {k: v for k, v in values.items() if k not in NOT_IDENTITY}
        if isinstance(values, dict) and section != "inputs"
        else values
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
