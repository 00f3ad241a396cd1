"""The whole benchmark for one checkpoint: every task of the paper fine-tuned into `<output_dir>/<task>/` (finished
tasks skipped), then `report.md` / `.json` / `.png` (our dev scores beside the paper's; its GLUE numbers are TEST-set,
Table 1) and `glue_submission.zip` for the leaderboard.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..atomic import atomic_path, write_json, write_text
from ..tasks.metrics import percent
from ..tasks.registry import GLUE_TASKS, PAPER_GLUE_AVERAGE, Task, get_task
from .cli import ConfigurationError, HelpLayout, flag, hide_credentials
from .finetuning import FineTuningRecipe, run_finetuning
from .finetuning.checks import check_inputs as check_finetuning_inputs
from .finetuning.recipe import find_task
from .lifecycle import (
    RunFinished,
    check_output_dir,
    check_stopped,
    fingerprints,
    lock_output_dir_once,
    release_output_dir,
    write_run_config,
)

logger = logging.getLogger(__name__)

DEFAULT_TASKS = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte", "squad", "squad_v2", "swag")
# The directory names users have for each task (GLUE's download script, SQuAD/SWAG/CoNLL conventions).
DIRECTORY_NAMES = {
    "sst2": ("SST-2",),
    "stsb": ("STS-B",),
    "cola": ("CoLA",),
    "squad": ("SQuAD", "squad_v1.1"),
    "squad_v2": ("SQuAD2", "squad2"),
    "conll2003": ("CoNLL-2003", "conll"),
}


HELP_LAYOUT = HelpLayout(
    usage="--model M [--tasks T ...] [--data_root DIR] [--output_dir DIR] [-- FINE-TUNING FLAGS ...]",
    epilog="Arguments after -- go to every task's fine-tuning (python recipes/finetune.py --task mrpc --help lists "
    "them), e.g. -- --seeds 1 2 3 --max_train_samples 2000; report.md records them and any subsampling. Tasks that "
    "finished are not run again: the same command resumes an interrupted benchmark.",
)


@dataclass
class ReproduceArguments:
    help_group = "the benchmark"  # --help's section for these flags
    model: str = flag("", "The checkpoint to benchmark (directory or Hub id).")
    output_dir: str = flag("runs/reproduce", "One sub-directory per task, and the report.")
    tasks: list[str] = flag(
        factory=lambda: list(DEFAULT_TASKS),
        help="Tasks to run (default: the paper's 11; add conll2003 and wnli if wanted).",
    )
    data_root: str | None = flag(
        None, "A directory with one sub-directory per task (MRPC/, SST-2/, SQuAD/ ...); tasks without one use the Hub."
    )
    paper_model: str = flag("base", "Which of the paper's models to compare with.")
    overwrite_output_dir: bool = flag(False, "Start again in a folder holding another benchmark (moved aside first).")


def task_data_dir(task: Task, data_root: str | None) -> Path | None:
    if not data_root:
        return None
    root = Path(data_root)
    candidates = {task.name.lower(), *(n.lower() for n in DIRECTORY_NAMES.get(task.name, ()))}
    for child in sorted(root.iterdir()) if root.is_dir() else ():
        if child.is_dir() and child.name.lower() in candidates:
            return child
    return None


def check_task_data(tasks: list[Task], data_root: str | None) -> dict[str, Path | None]:
    """Each task's directory under --data_root, found before any work: offline, a missing one is an error now."""
    dirs = {task.name: task_data_dir(task, data_root) for task in tasks}
    missing = [name for name, directory in dirs.items() if directory is None]
    if missing and os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        where = f"under --data_root {data_root}" if data_root else "(no --data_root given)"
        raise ConfigurationError(
            f"No local data for task(s) {', '.join(missing)} {where}, and the Hub is off (HF_HUB_OFFLINE=1). Put "
            f"each task's files in a sub-directory named after it (e.g. MRPC/, SST-2/) or run only the tasks you "
            f"have with --tasks."
        )
    if missing and data_root:
        logger.warning("No directory for %s under --data_root %s: from the Hub.", ", ".join(missing), data_root)
    return dirs


def task_row(task: Task, summary: dict[str, Any], paper_model: str) -> dict[str, Any]:
    """One line of the report: our main metric on the first evaluation split beside the paper's number."""
    best = summary["best"]
    split = task.eval_splits[0]
    metric = task.kind.ranking_metric(task)  # SQuAD v2.0: the paper's numbers use the threshold tuned on dev
    ours = percent(metric, best[split][metric])
    papers = [r for r in task.paper if r.model == paper_model and r.metric == metric]
    paper = next((r for r in papers if r.split in (split, "test", "test_matched")), None)
    majority = summary["majority_baseline"].get(split, {}).get(metric)
    return {
        "task": task.name,
        "metric": metric,
        "split": split,
        "ours": ours,
        "paper": paper.value if paper else None,
        "paper_split": paper.split if paper else None,
        "learning_rate": best["learning_rate"],
        "seed": best["seed"],
        "seconds": summary["seconds"],
        "runs": len(summary["runs"]),
        "majority": percent(metric, majority),
        "one_label": (best.get("one_label") or {}).get(split),
        "subsampled": {
            key: value
            for key, value in summary["hyperparameters"].items()
            if key in ("max_train_samples", "max_eval_samples") and value
        },
    }


def glue_average(rows: list[dict[str, Any]]) -> float | None:
    """The paper's GLUE score: the mean of the eight tasks' main metrics (MNLI-m for MNLI), WNLI left out."""
    values = [r["ours"] for r in rows if get_task(r["task"]).in_glue_average]
    expected = sum(1 for name in GLUE_TASKS if get_task(name).in_glue_average)
    return round(sum(values) / len(values), 2) if len(values) == expected else None


def write_report(
    output_dir: Path, rows: list[dict[str, Any]], args: ReproduceArguments, seconds: float, finetune_args=()
) -> str:
    finetune_args = hide_credentials(list(finetune_args))
    average = glue_average(rows)
    paper_average = PAPER_GLUE_AVERAGE.get(args.paper_model)
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
    one_label = [f"{r['task']} ({r['one_label']!r})" for r in rows if r.get("one_label")]
    if one_label:
        lines.append(
            f"**Learned nothing beyond one label:** the best run of {', '.join(one_label)} predicts that label "
            "for every dev example; its score is the majority class's, not a reproduction."
        )
    subsampled = [
        f"{r['task']} ({', '.join(f'{k} {v}' for k, v in r['subsampled'].items())})"
        for r in rows
        if r.get("subsampled")
    ]
    if subsampled:
        lines.append(f"Subsampled, so not comparable with the paper: {'; '.join(subsampled)}.")
    lines += [
        "",
        "Fine-tuning arguments (after --): " + (f"`{shlex.join(finetune_args)}`" if finetune_args else "none."),
        "",
        f"GLUE average (8 tasks, WNLI left out): ours "
        f"{'n/a (not all eight tasks ran)' if average is None else f'{average:.2f}'}, paper "
        f"{paper_average}.",
        "",
        f"Total time: {seconds / 3600:.2f} h.",
    ]
    text = "\n".join(lines) + "\n"
    write_text(output_dir / "report.md", text)
    report = {"model": args.model, "paper_model": args.paper_model, "tasks": rows, "glue_average": average}
    report |= {"paper_glue_average": paper_average, "seconds": round(seconds, 1), "finetune_args": finetune_args}
    write_json(output_dir / "report.json", report)
    plot_report(rows, output_dir / "report.png", args.paper_model)
    return text


def plot_report(rows: list[dict[str, Any]], path: Path, paper_model: str) -> None:
    try:
        import matplotlib
    except ImportError:  # an optional extra: the report is written without its chart rather than lost
        logger.warning("matplotlib is not installed (pip install 'bert-repro[train]'): not writing %s", path.name)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["task"] for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    ax.bar([x - 0.2 for x in xs], [r["ours"] for r in rows], width=0.4, label="ours (dev)")
    ax.bar([x + 0.2 for x in xs], [r["paper"] or 0 for r in rows], width=0.4, label=f"paper BERT-{paper_model}")
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set_ylabel("score (%)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=110, format=Path(path).suffix[1:] or None)
    plt.close(fig)


def zip_submissions(output_dir: Path, tasks: list[Task]) -> Path | None:
    files = [p for t in tasks for p in sorted((output_dir / t.name / "glue_submission").glob("*.tsv"))]
    if not files:
        return None
    path = output_dir / "glue_submission.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for f in files:
            archive.write(f, f.name)
    return path


def run_reproduce(args: ReproduceArguments, finetune_args: list[str]) -> str:
    """Run every task (skipping finished ones), then write the report. `finetune_args` go to every fine-tuning."""
    if not args.model:
        raise ConfigurationError("Pass --model: the checkpoint to benchmark.")
    tasks = [find_task(t) for t in args.tasks]  # an unknown one with the closest
    # The flags after `--` read once per task (its defaults are under them): a wrong one fails now.
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
        write_report(output_dir, rows, args, time.time() - start, finetune_args)  # a partial report after each task
    zip_submissions(output_dir, tasks)
    report = write_report(output_dir, rows, args, sum(r["seconds"] for r in rows), finetune_args)
    release_output_dir(output_dir)
    return report
