"""The study of Tables 1-2, the whole benchmark for one checkpoint: every task of the paper fine-tuned into
`<output_dir>/<task>/` (finished tasks skipped), then `report.md` / `.json` / `.png` (our dev scores beside the
paper's; its GLUE numbers are TEST-set, Table 1) and `glue_submission.zip` for the leaderboard.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
import zipfile
from functools import partial
from pathlib import Path
from typing import Any

from ...atomic import atomic_path
from ...tasks.metrics import percent
from ...tasks.registry import GLUE_TASKS, PAPER_GLUE_AVERAGE, Task, get_task
from ..cli import ConfigurationError, hide_credentials
from ..finetuning import FineTuningRecipe, run_finetuning
from ..finetuning.checks import check_inputs as check_finetuning_inputs
from ..finetuning.recipe import find_task
from ..lifecycle import (
    RunFinished,
    check_output_dir,
    check_stopped,
    fingerprints,
    lock_output_dir_once,
    release_output_dir,
    write_run_config,
)
from .arguments import ReproduceArguments, check_task_data
from .report import write_report

logger = logging.getLogger(__name__)
SUBSAMPLING = ("max_train_samples", "max_eval_samples")


def task_row(task: Task, summary: dict[str, Any], paper_model: str) -> dict[str, Any]:
    """One line of the report: our main metric on the first evaluation split beside the paper's number."""
    best = summary["best"]
    split = task.eval_splits[0]
    metric = task.kind.ranking_metric(task)  # SQuAD v2.0: the paper's numbers use the threshold tuned on dev
    papers = [r for r in task.paper if r.model == paper_model and r.metric == metric]
    paper = next((r for r in papers if r.split in (split, "test", "test_matched")), None)
    majority = summary["majority_baseline"].get(split, {}).get(metric)
    return {
        "task": task.name,
        "metric": metric,
        "split": split,
        "ours": percent(metric, best[split][metric]),
        "paper": paper.value if paper else None,
        "paper_split": paper.split if paper else None,
        "learning_rate": best["learning_rate"],
        "seed": best["seed"],
        "seconds": summary["seconds"],
        "runs": len(summary["runs"]),
        "majority": percent(metric, majority),
        "one_label": (best.get("one_label") or {}).get(split),
        "subsampled": {k: v for k, v in summary["hyperparameters"].items() if k in SUBSAMPLING and v},
    }


def glue_average(rows: list[dict[str, Any]]) -> float | None:
    """The paper's GLUE score: the mean of the eight tasks' main metrics (MNLI-m for MNLI), WNLI left out."""
    values = [r["ours"] for r in rows if get_task(r["task"]).in_glue_average]
    expected = sum(1 for name in GLUE_TASKS if get_task(name).in_glue_average)
    return round(sum(values) / len(values), 2) if len(values) == expected else None


def write_benchmark(
    output_dir: Path, rows: list[dict[str, Any]], args: ReproduceArguments, seconds: float, finetune_args=()
) -> str:
    """report.md, report.json and report.png; returns report.md's text."""
    finetune_args = hide_credentials(list(finetune_args))
    average, paper_average = glue_average(rows), PAPER_GLUE_AVERAGE.get(args.paper_model)
    lines = [
        f"# Benchmark of {args.model}",
        "",
        f"Ours: dev set, best of the learning-rate grid x seeds. Paper: BERT-{args.paper_model.upper()}; its GLUE "
        "numbers are TEST-set scores (Table 1), the only GLUE numbers the paper prints, so expect ours (dev) to "
        "differ by a point or two even for an exact reproduction.",
        "",
        "| task | metric | ours (dev) | majority class | paper | paper split | lr | seed | runs | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        paper = "" if r["paper"] is None else f"{r['paper']:.1f}"
        majority = "" if r.get("majority") is None else f"{r['majority']:.2f}"
        flag = f" (every prediction {r['one_label']!r})" if r.get("one_label") else ""
        lines.append(
            f"| {r['task']} | {r['metric']} | {r['ours']:.2f}{flag} | {majority} | {paper} | {r['paper_split'] or ''} "
            f"| {r['learning_rate']:g} | {r['seed']} | {r['runs']} | {r['seconds']:.0f} |"
        )
    lines += ["", "Majority class: the score of always predicting the training set's most frequent label."]
    if one_label := [f"{r['task']} ({r['one_label']!r})" for r in rows if r.get("one_label")]:
        lines.append(
            f"**Learned nothing beyond one label:** the best run of {', '.join(one_label)} predicts that label "
            "for every dev example; its score is the majority class's, not a reproduction."
        )
    if subsampled := [(r["task"], r["subsampled"]) for r in rows if r.get("subsampled")]:
        texts = (f"{task} ({', '.join(f'{k} {v}' for k, v in values.items())})" for task, values in subsampled)
        lines.append(f"Subsampled, so not comparable with the paper: {'; '.join(texts)}.")
    ours = "n/a (not all eight tasks ran)" if average is None else f"{average:.2f}"
    lines += [
        "",
        "Fine-tuning arguments (after --): " + (f"`{shlex.join(finetune_args)}`" if finetune_args else "none."),
        "",
        f"GLUE average (8 tasks, WNLI left out): ours {ours}, paper {paper_average}.",
        "",
        f"Total time: {seconds / 3600:.2f} h.",
    ]
    record = {"model": args.model, "paper_model": args.paper_model, "tasks": rows, "glue_average": average}
    record |= {"paper_glue_average": paper_average, "seconds": round(seconds, 1), "finetune_args": finetune_args}
    bars = ([r["task"] for r in rows], [r["ours"] for r in rows], None, [r["paper"] for r in rows], None)
    chart = dict(panels={"score (%)": bars}, title=f"Benchmark of {args.model}", paper=f"paper BERT-{args.paper_model}")
    return write_report(output_dir, "report", lines, record, chart)


def run_reproduce(args: ReproduceArguments, finetune_args: list[str]) -> str:
    """Run every task (skipping finished ones), then write the report. `finetune_args` go to every fine-tuning."""
    if not args.model:
        raise ConfigurationError("Pass --model: the checkpoint to benchmark.")
    tasks = [find_task(t) for t in args.tasks]  # an unknown one with the closest
    # The flags after `--` read once per task (its defaults are under them): a wrong one (or a task longer than the
    # model's positions) fails now, not when the task that reads it comes.
    recipes = {
        t.name: FineTuningRecipe.from_args(["--task", t.name, "--model", args.model, *finetune_args]) for t in tasks
    }
    for recipe in recipes.values():
        check_finetuning_inputs(*recipe.resolved())
    data_dirs = check_task_data(tasks, args.data_root)
    # the model by what it holds: its folder re-pre-trained in place is another benchmark, `base/` and `base` the same
    output_dir, record = Path(args.output_dir), {"inputs": fingerprints({"model": args.model})}
    overwrite = args.overwrite_output_dir or any(r.finetuning.overwrite_output_dir for r in recipes.values())
    check = partial(check_output_dir, output_dir, record, resume=True, overwrite=overwrite)
    lock_output_dir_once(output_dir, recipes[tasks[0].name].training, check, overwrite=overwrite)
    write_run_config(output_dir, record)
    rows, start = [], time.time()
    for task in tasks:
        data = {} if data_dirs[task.name] is None else {"data": [str(data_dirs[task.name])]}
        try:  # a task's folder holding other settings' results is refused by the fine-tuning's own check
            check_stopped(run_finetuning(recipes[task.name].replace(output_dir=str(output_dir / task.name), **data)))
        except RunFinished:
            logger.info("%s: finished earlier, not run again", task.name)
        results = json.loads((output_dir / task.name / "results.json").read_text())
        rows.append(task_row(task, results, args.paper_model))
        write_benchmark(output_dir, rows, args, time.time() - start, finetune_args)  # a partial report after each task
    if files := [p for t in tasks for p in sorted((output_dir / t.name / "glue_submission").glob("*.tsv"))]:
        zipped = atomic_path(output_dir / "glue_submission.zip")  # whole or not there, as every file a run writes
        with zipped as path, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for f in files:  # GLUE's test-set predictions, ready for the leaderboard
                archive.write(f, f.name)
    report = write_benchmark(output_dir, rows, args, sum(r["seconds"] for r in rows), finetune_args)
    release_output_dir(output_dir)
    return report
