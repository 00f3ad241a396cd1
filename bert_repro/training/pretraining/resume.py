"""Stopping and resuming a pre-training run: which checkpoint to resume, a stop after so many steps, and the
training time and loss kept across invocations."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from transformers import TrainerCallback

from ...atomic import write_json
from ..checkpoints import checkpoint_problem, checkpoint_step, newest_valid_checkpoint
from ..cli import ConfigurationError
from ..lifecycle import RUN_CONFIG
from .examples import TOKENIZER_DIR

logger = logging.getLogger(__name__)


class StopAfterSteps(TrainerCallback):
    """Ends this invocation after `steps` optimizer steps with a checkpoint, for time-limited jobs."""

    def __init__(self, steps: int):
        self.steps, self.first_step = steps, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.first_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step - self.first_step >= self.steps and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
        return control


class LongerSchedule(TrainerCallback):
    """A run extended to more steps continues on the longer schedule from its first step: Trainer restores the
    optimizer's rate as the shorter schedule left it (0 after a linear decay), so it is set to the longer one's."""

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper holds torch's scheduler
        if not hasattr(scheduler, "lr_lambdas"):  # not a LambdaLR (Trainer's schedules are): nothing to mend
            return
        groups = scheduler.optimizer.param_groups
        for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * factor(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in groups]  # what Trainer logs as learning_rate


TRAINING_TIME = "training_time.json"


class TrainingClock(TrainerCallback):
    """The training time of all invocations of a run, recorded in each checkpoint (`training_time.json`); without
    that record the clock counts from the checkpoint's step (`from_step`), and the results say so."""

    def __init__(self, resume_from: str | Path | None):
        self.before, self.from_step = 0.0, 0
        if resume_from and (Path(resume_from) / TRAINING_TIME).is_file():
            self.before = float(json.loads((Path(resume_from) / TRAINING_TIME).read_text())["train_seconds"])
        elif resume_from:
            self.from_step = checkpoint_step(resume_from)
            logger.warning(
                "%s has no %s: the time trained before step %d is unknown, "
                "so train_runtime_s counts from there (results.json: train_runtime_from_step)",
                resume_from,
                TRAINING_TIME,
                self.from_step,
            )
        self.start = time.time()

    def seconds(self) -> float:
        return self.before + time.time() - self.start

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.time()

    def on_save(self, args, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            write_json(
                checkpoint / TRAINING_TIME,
                {"train_seconds": round(self.seconds(), 3), "global_step": state.global_step},
                indent=None,
            )


def whole_run_loss(log_history: list[dict]) -> float | None:
    """The mean training loss over every step of the run, from the losses logged: Trainer's own `training_loss`
    covers only the last invocation's steps (0.0 for a run resumed at its last checkpoint)."""
    total, last = 0.0, 0
    for entry in log_history:
        if "loss" in entry and entry.get("step", 0) > last:
            total += entry["loss"] * (entry["step"] - last)
            last = entry["step"]
    return total / last if last else None


def checkpoint_to_resume(output_dir: Path, resume_from: bool | str | None, streamed: bool = False) -> str | None:
    """The newest complete checkpoint for `True` (None when nothing was saved yet), or the named one, checked."""
    if resume_from is True:
        found = newest_valid_checkpoint(output_dir, streamed=streamed)
        if found is None:
            logger.info("no checkpoint in %s yet: starting at step 0", output_dir)
            return None
        logger.info("resuming from %s (the newest complete checkpoint)", found)
        return str(found)
    if resume_from:
        problem = checkpoint_problem(resume_from, streamed=streamed)
        if problem:
            raise ConfigurationError(f"Cannot resume from {resume_from}: {problem}.")
        logger.info("resuming from %s", resume_from)
    return resume_from or None


def forget_unstarted_run(output_dir: Path) -> None:
    """Remove what a run wrote into its (new or empty) output directory before its data preparation failed."""
    (output_dir / RUN_CONFIG).unlink(missing_ok=True)
    shutil.rmtree(output_dir / TOKENIZER_DIR, ignore_errors=True)
    if output_dir.is_dir() and not any(output_dir.iterdir()):
        output_dir.rmdir()
