"""One run of the grid: the rows encoded once for the grid, the model with the task's head (`load_model`), `TaskTrainer`
(Trainer evaluating with the task's own metrics) and `one_run`, which leaves what Trainer's example scripts leave."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

import datasets
import numpy as np
import torch
from transformers import Trainer, TrainerState, TrainingArguments, set_seed
from transformers.trainer_utils import TrainOutput

from ...atomic import write_json
from ...model.bilstm_heads import FeatureSetError
from ...model.conversion import load_bert
from ...tasks.registry import Task
from ..checkpoints import check_fits, newest_valid_checkpoint
from ..cli import ConfigurationError
from ..distributed import TRAINER_STATE_NAME, EngineTrainer, write_trainer_state
from ..pretraining.resume import LongerSchedule, whole_run_loss
from .recipe import HEAD_INITIALIZERS, FineTuningArguments, head_settings, resume_path

logger = logging.getLogger(__name__)


def task_rows(task: Task, data, run: FineTuningArguments, *, train: bool = True) -> dict[str, datasets.Dataset]:
    """{split: the rows a run reads}, cut to --max_train_samples and --max_eval_samples."""
    cut = {"train": run.max_train_samples} if train else {}
    cut |= dict.fromkeys(task.eval_splits, run.max_eval_samples)
    return {k: data[k] if n is None or len(data[k]) <= n else data[k].select(range(n)) for k, n in cut.items()}


def encode_splits(task: Task, rows: dict, tokenizer, run: FineTuningArguments) -> dict[str, tuple]:
    """{split: (raw rows, model inputs)} of `task_rows`, encoded once for the whole grid."""
    encode = task.kind.encode
    return {name: (raw, encode(task, raw, tokenizer, run, train=name == "train")) for name, raw in rows.items()}


def model_inputs(task: Task, raw: datasets.Dataset, encoded: datasets.Dataset) -> datasets.Dataset:
    """What the model reads of an encoded split: without the columns decoding needs, nor hidden test labels (-1)."""
    drop = list(task.kind.decode_columns) + ([] if task.kind.labelled(task, raw) else ["labels"])
    return encoded.remove_columns([c for c in drop if c in encoded.column_names])


def load_model(task: Task, run: FineTuningArguments):
    """--model with the task's head (its own, else a new one drawn as --head_initializer)."""
    model_class, fields = head_settings(task, run)
    fields |= {"id2label": task.id2label, "label2id": task.label2id} if task.label_names else {}
    fields |= dict(num_labels=task.num_labels, attn_implementation=run.attn_implementation, **run.switches())
    fields["initializer_distribution"] = HEAD_INITIALIZERS[run.head_initializer]
    try:
        model = load_bert(run.model, model_class, **fields)
    except FeatureSetError as err:
        raise ConfigurationError(f"--features {run.features} with {run.model}: {err}") from None
    if run.compile_layers:
        model.compile_layers()
    return model


def predict(task: Task, trainer: Trainer, raw, encoded, run) -> tuple[Any, Any]:
    """A raw split's decoded predictions, and the mean loss (None where the model reads no labels: SQuAD's dev)."""
    output = trainer.predict(model_inputs(task, raw, encoded))
    return task.kind.decode(task, output.predictions, raw, encoded, run), output.metrics.get("test_loss")


def one_label(task: Task, predictions) -> str | None:
    """The one label a classifier predicted for every example, or None."""
    if not task.label_names or not isinstance(predictions, np.ndarray) or predictions.ndim != 1:
        return None
    labels = np.unique(predictions)
    return task.label_names[int(labels[0])] if len(labels) == 1 else None


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
        result, metrics = {}, {}
        with torch.random.fork_rng(devices=[self.args.device] if self.args.device.type == "cuda" else []):
            for i, split_name in enumerate(self.task.eval_splits):
                raw, encoded = self.splits[split_name]
                predictions, loss = predict(self.task, self, raw, encoded, self.settings)
                result[split_name] = self.task.kind.score(self.task, raw, predictions)
                if (label := one_label(self.task, predictions)) is not None:
                    result.setdefault("one_label", {})[split_name] = label
                prefix = metric_key_prefix if i == 0 else f"{metric_key_prefix}_{split_name}"
                values = {"loss": loss, **result[split_name]}  # a loss of None (SQuAD's) is not a number: left out
                metrics.update({f"{prefix}_{k}": v for k, v in values.items() if isinstance(v, (int, float))})
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self.evaluated = (self.state.global_step, result, metrics)
        return metrics


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


def one_run(task, splits, tokenizer, run, training: TrainingArguments, lr: float, seed: int, run_dir: Path):
    """Fine-tune once, evaluate, and leave in `run_dir` what Trainer's example scripts leave. (result, trainer)"""
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
        model = load_model(task, replace(run, model=best or str(checkpoint)))
        trainer.model = trainer.model_wrapped = model.to(trainer.args.device)
        trainer.state = state
        metrics = dict(epoch=state.epoch, total_flos=state.total_flos, train_loss=whole_run_loss(state.log_history))
        trained = TrainOutput(state.global_step, 0.0, metrics)
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
    result = {"learning_rate": lr, "seed": seed, "data_seed": data_seed, "steps": step, "train_seconds": seconds}
    # epochs: what ran (--max_steps may stop a run within an epoch)
    result |= {"epochs": round(trainer.state.epoch or 0.0, 4), "engine": trainer.engine, **scores}
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
    if not (path := Path(checkpoint) / TRAINER_STATE_NAME).is_file():
        return None
    state = TrainerState.load_from_json(str(path))
    if training.max_steps > 0:
        return state if state.global_step >= training.max_steps else None
    return state if state.epoch is not None and state.epoch >= training.num_train_epochs - 1e-6 else None
