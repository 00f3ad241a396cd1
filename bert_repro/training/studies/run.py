"""The paper's section-5 experiments as studies (`tables.STUDIES`): pre-train each variant with the recipe's
arguments, fine-tune it with the fine-tuning protocol, and after every finished run write the table beside the
paper's (`report`). Runs go to `<output_dir>/pretrain/<variant>/` and `<output_dir>/finetune/<variant>/<run>/`;
finished ones are kept, so the same command continues a study.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...atomic import write_json
from ...model.conversion import TOKENIZER_FILES
from ...tasks.metrics import percent
from ...tasks.registry import get_task
from ..cli import ConfigurationError
from ..cluster import catching_stop_signals, signal_received
from ..finetuning import FineTuningRecipe, run_finetuning
from ..finetuning.checks import check_inputs as check_finetuning_inputs
from ..lifecycle import Stopped, check_stopped, fingerprints
from ..pretraining import PreTrainingRecipe, run_pretraining
from ..pretraining.plan import check as check_pretraining
from .arguments import StudyArguments, check_task_data, finetune_args_for, parse_reuse, redacted, select, split_args
from .report import write_study
from .tables import STUDIES, Column, Study, Variant, get_study

logger = logging.getLogger(__name__)

# What a study's runs depend on, with the pre-training config and the reused models by what they hold (seeds, jobs,
# tasks and variants may change: they add or pick runs, change none).
RECORDED_ARGUMENTS = ("study", "pretrain_args", "finetune_args", "finetune_args_for", "sizes")
PRETRAINING_NUMBERS = ("global_step", "train_runtime_s", "train_runtime_from_step", "tokens_per_second")
PRETRAINING_NUMBERS += ("eval_mlm_loss", "eval_mlm_accuracy", "eval_nsp_accuracy")


class StudyError(RuntimeError):
    """Runs of a study failed (their logs say why); the table of the others is written."""


def _results(directory: Path) -> dict[str, Any] | None:
    path = directory / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _finished(directory: Path) -> bool:
    return (directory / "results.json").is_file() and (directory / "config.json").is_file()


def check_same_study(output_dir: Path, args: StudyArguments) -> None:
    """Create `output_dir`, or check that its study ran with the same arguments and inputs: its finished runs are
    kept and not run again, so runs made with other arguments or inputs would pass for this study's."""
    reused = dict(item.split("=", 1) for item in args.reuse if "=" in item)
    config = args.pretrain_config if Path(args.pretrain_config).is_file() else None
    inputs = fingerprints({"pretrain_config": config, **{f"model {k}": v for k, v in reused.items()}})
    record = {**{k: getattr(args, k) for k in RECORDED_ARGUMENTS}, "inputs": inputs}
    path = output_dir / "study_args.json"
    if not path.is_file():
        output_dir.mkdir(parents=True, exist_ok=True)
        return write_json(path, record)
    was = json.loads(path.read_text())
    changed = [f"--{k} {was.get(k)!r} then, {record[k]!r} now" for k in RECORDED_ARGUMENTS if was.get(k) != record[k]]
    changed += [
        f"--{name.replace('model ', 'reuse ')}: other content than this study read"
        for name, value in inputs.items()
        if (was.get("inputs") or {}).get(name) != value
    ]
    if changed:
        raise ConfigurationError(
            f"{output_dir} holds a study run with other arguments or inputs ({'; '.join(changed)}), whose finished "
            f"runs would be kept as this one's. Pass another --output_dir, or remove {output_dir} to start again."
        )


def pretrain_variant(variant: Variant, base: PreTrainingRecipe, directory: Path, weights: dict[str, Path]) -> Path:
    """The variant's pre-trained model directory: reused, finished earlier, drawn at random, or pre-trained now."""
    if variant.key in weights:
        return weights[variant.key]
    if variant.random_init:
        return random_init_model(weights[variant.weights_of], directory)
    if _finished(directory):
        logger.info("pre-training of %s finished earlier, not run again", variant.key)
        return directory
    recipe = base.replace(**variant.pretraining, output_dir=str(directory))
    if any(directory.glob("checkpoint-*")):
        recipe = recipe.replace(resume_from_checkpoint="true")
    logger.info("pre-training %s in %s, the study's recipe with %s", variant.key, directory, dict(variant.pretraining))
    summary = check_stopped(run_pretraining(recipe))
    if "stopped_at_step" in summary:
        raise ConfigurationError(
            f"the pre-training of {variant.key} stopped at step {summary['stopped_at_step']} "
            "(--stop_after_steps); run the same study command again to continue it."
        )
    return directory


def random_init_model(pretrained: Path, directory: Path) -> Path:
    """`pretrained`'s architecture and vocabulary with freshly initialised weights (the recipe's initialisation)."""
    if _finished(directory):
        return directory
    import torch

    from ...model.configuration_bert_repro import BertReproConfig
    from ...model.modeling_bert_repro import BertReproForPreTraining

    torch.manual_seed(0)
    model = BertReproForPreTraining(BertReproConfig.from_pretrained(pretrained))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (pretrained / name).is_file():
            shutil.copy(pretrained / name, directory / name)
    record = {"random_init": True, "architecture_of": str(pretrained), "global_step": 0, "train_runtime_s": 0.0}
    write_json(directory / "results.json", record)
    return directory


@dataclass(frozen=True)
class FineTuningRun:
    """A variant's model fine-tuned on one column's task (one seed of it, with --seeds)."""

    variant: str
    run: str  # the column's run (Column.run)
    seed: int | None
    directory: Path
    recipe: FineTuningRecipe | None

    @property
    def results(self) -> dict[str, Any] | None:
        return _results(self.directory)


def planned_runs(
    study: Study, args: StudyArguments, output_dir: Path, models: Mapping[str, str], data_dirs: dict[str, Path | None]
) -> list[FineTuningRun]:
    """Every fine-tuning run, seed by seed (a study cut short has the same seeds of every variant)."""
    common = split_args(args.finetune_args, "--finetune_args")
    per_key = finetune_args_for(study, args)
    if args.seeds and any(a.split("=")[0] in ("--seed", "--seeds") for a in common + sum(per_key.values(), [])):
        raise ConfigurationError(
            "--seeds of the study gives each run its seed: leave --seed(s) out of the fine-tuning arguments."
        )
    runs: dict[Path, FineTuningRun] = {}
    for seed in args.seeds or [None]:
        for column in (c for c in study.columns if c.task):
            for variant in study.variants:
                directory = output_dir / "finetune" / variant.key / column.run
                directory = directory if seed is None else directory / f"seed{seed}"
                if directory in runs:
                    continue
                theirs = [*common, *per_key.get(column.task, []), *per_key.get(variant.key, [])]
                recipe = FineTuningRecipe.from_args(["--task", column.task, "--model", models[variant.key], *theirs])
                recipe = recipe.replace(
                    **variant.finetuning,
                    **column.finetuning,
                    output_dir=str(directory),
                    **({} if seed is None else {"seeds": [seed]}),
                    **({} if data_dirs[column.task] is None else {"data": [str(data_dirs[column.task])]}),
                )
                runs[directory] = FineTuningRun(variant.key, column.run, seed, directory, recipe)
    return list(runs.values())


def _finetune_in_process(recipe: FineTuningRecipe, log: str, threads: int) -> None:
    """One fine-tuning run in a process of its own (--jobs), its output in `log`."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizers' thread pool, before its first use
    import torch

    torch.set_num_threads(threads)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        return run_finetuning(recipe)


def run_finetuning_jobs(runs: list[FineTuningRun], jobs: int, output_dir: Path, after_each) -> list[str]:
    """Run what is not finished, `jobs` at a time, `after_each()` after every run; returns the failures."""
    if kept := [str(run.directory) for run in runs if run.results is not None]:
        logger.info("fine-tuning finished earlier, not run again: %s", ", ".join(kept))
    todo = [run for run in runs if run.results is None]
    if jobs <= 1:
        for run in todo:
            logger.info("fine-tuning %s in %s", run.variant, run.directory)
            check_stopped(run_finetuning(run.recipe))
            after_each()
        return []
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // jobs)
    failed, stopped = [], []
    # spawn: a fresh interpreter each (CUDA cannot be forked); one run per process, so each starts clean
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        futures = {}
        for run in todo:
            log = output_dir / "logs" / f"{run.directory.relative_to(output_dir / 'finetune')}.log".replace("/", "-")
            logger.info("fine-tuning %s in %s (log %s)", run.variant, run.directory, log)
            futures[pool.submit(_finetune_in_process, run.recipe, str(log), threads)] = (run, log)
        for future in as_completed(futures):
            run, log = futures[future]
            try:
                if "stopped_by" in (future.result() or {}):
                    stopped.append(str(run.directory))
                    continue
                logger.info("fine-tuning %s finished", run.directory)
            except Exception as err:  # reported with its log; the other runs go on
                failed.append(f"{run.directory}: {type(err).__name__}: {err} (log: {log})")
                logger.error("fine-tuning %s failed: %s", run.directory, failed[-1])
            after_each()
    if stopped:
        raise Stopped(f"fine-tuning stopped by a signal in {', '.join(stopped)}; the same command goes on from there")
    return failed


def fine_tuned_cell(column: Column, runs: list[FineTuningRun]) -> dict[str, Any]:
    """A cell from its finished runs (percent): the one run's number, or the seeds' mean, standard error and numbers."""
    finished = [(r.seed, results) for r in runs if (results := r.results) is not None]
    values = {seed: percent(column.metric, results["best"][column.split][column.metric]) for seed, results in finished}
    if not values:
        return {"ours": None}
    if list(values) == [None]:
        return {"ours": values[None]}
    numbers = list(values.values())
    mean = sum(numbers) / len(numbers)
    se = statistics.stdev(numbers) / math.sqrt(len(numbers)) if len(numbers) > 1 else None
    return {"ours": round(mean, 2), "se": None if se is None else round(se, 2), "seeds": values}


def majority_baseline(study: Study, data_dirs: dict[str, Path | None]) -> dict[str, float]:
    """Each classification column's score for always predicting the most frequent training label."""
    from ...tasks.files import load_task_data
    from ..finetuning.recipe import data_source

    out, data = {}, {}
    for column in (c for c in study.columns if c.task):
        task = get_task(column.task)
        if task.name not in data:
            where = data_dirs[task.name]
            data[task.name] = load_task_data(task, data_source([str(where)] if where else []))
        splits = data[task.name]
        predictions = task.kind.majority_predictions(task, splits["train"], splits[column.split])
        if predictions is not None:
            score = task.kind.score(task, splits[column.split], predictions)[column.metric]
            out[column.key] = percent(column.metric, score)
    return out


def table_row(study: Study, variant: Variant, model: Path, runs: list[FineTuningRun]) -> dict[str, Any]:
    """One variant's row: its pre-training's numbers and a cell per column."""
    pretraining = _results(model) or {}
    own = [r for r in runs if r.variant == variant.key]
    cells = {}
    for column in study.columns:
        if column.task is not None:
            cell = fine_tuned_cell(column, [r for r in own if r.run == column.run])
        elif variant.weights_of and not variant.random_init:
            cell = {"ours": None}  # a fine-tuning variant of another's model: its pre-training is that row's
        else:  # the held-out MLM perplexity
            loss = pretraining.get("eval_mlm_loss")
            cell = {"ours": None if loss is None else round(math.exp(loss), 2)}
        cells[column.key] = {**cell, "paper": study.paper.get(variant.key, {}).get(column.key)}
    return {
        "variant": variant.key,
        "label": variant.label,
        "model": str(model),
        "pretraining": {k: pretraining.get(k) for k in PRETRAINING_NUMBERS},
        "cells": cells,
        "finetune_seconds": sum(results.get("seconds", 0.0) for r in own if (results := r.results) is not None),
    }


def stop_here(where: str) -> None:
    """`Stopped` when a stop signal came: a study's runs each end at a safe point, and so does the study."""
    if signum := signal_received():
        raise Stopped(f"stopped by {signal.Signals(signum).name} {where}; the same command goes on from there")


def run_study(args: StudyArguments) -> str:
    """Pre-train every variant, then fine-tune them, writing the report after every finished run."""
    if not args.study:
        raise ConfigurationError(f"Pass --study: one of {', '.join(STUDIES)}.")
    if args.jobs < 1:
        raise ConfigurationError(f"--jobs {args.jobs}: at least 1.")
    study = select(get_study(args.study), args)
    reused = parse_reuse(study, args.reuse)
    tasks = [get_task(t) for t in dict.fromkeys(c.task for c in study.columns if c.task)]
    data_dirs = check_task_data(tasks, args.data_root)
    # a wrong flag in the fine-tuning arguments fails now, not after the pre-training
    for run in planned_runs(study, args, Path("(output)"), defaultdict(lambda: "(pre-trained)"), data_dirs):
        check_finetuning_inputs(*run.recipe.resolved(), model_at_hand=False)
    pretrained = [v for v in study.variants if v.key not in reused and not v.random_init]
    if pretrained and not Path(args.pretrain_config).is_file():
        raise ConfigurationError(
            f"--pretrain_config {args.pretrain_config}: no such file (a YAML config of recipes/pretrain.py, e.g. "
            "recipes/configs/quickstart.yaml)."
        )
    # every variant starts from --pretrain_config with --pretrain_args; each recipe is checked before the first runs
    pretrain_args = ["--config", args.pretrain_config, *split_args(args.pretrain_args, "--pretrain_args")]
    base = PreTrainingRecipe.from_args(pretrain_args) if pretrained else None
    for variant in pretrained:
        check_pretraining(base.replace(**variant.pretraining, output_dir="(output)"))
    baseline = majority_baseline(study, data_dirs)  # reads every task's data: a broken file fails now too
    output_dir = Path(args.output_dir or f"runs/{study.name}")
    shown = redacted(args)  # the arguments as the study's record and reports show them
    check_same_study(output_dir, shown)
    weights: dict[str, Path] = dict(reused)
    start, failed = time.time(), []
    with catching_stop_signals():  # acted on by each run, and between runs here
        for variant in study.variants:
            if variant.weights_of and not variant.random_init:
                weights[variant.key] = weights[variant.weights_of]
            weights[variant.key] = pretrain_variant(variant, base, output_dir / "pretrain" / variant.key, weights)
            stop_here("after a pre-training")
        runs = planned_runs(study, args, output_dir, {k: str(v) for k, v in weights.items()}, data_dirs)

        def report() -> str:
            rows = [table_row(study, variant, weights[variant.key], runs) for variant in study.variants]
            return write_study(output_dir, study, rows, shown, time.time() - start, baseline, failed)

        report()  # the pre-training's numbers, before any fine-tuning
        failed += run_finetuning_jobs(runs, args.jobs, output_dir, report)
        text = report()
        stop_here("after the fine-tuning runs")
    if failed:
        raise StudyError(f"{len(failed)} fine-tuning run(s) failed; the table has the others:\n" + "\n".join(failed))
    return text
