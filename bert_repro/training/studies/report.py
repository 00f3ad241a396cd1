"""A study's report, written after every finished run from the rows of its table (`study.table_row`):
- `study.md`: our numbers beside the paper's, the budget of each variant (steps, sequences, time) and the ordering
  of the variants, ours against the paper's;
- `study.json`: the same as data; `study.png`: ours against the paper's, one panel per column.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...atomic import atomic_path, write_json, write_text
from .arguments import StudyArguments
from .tables import Study

logger = logging.getLogger(__name__)


def ordering(study: Study, rows: list[dict[str, Any]], which: str) -> list[str]:
    """Variants from best to worst by the mean of `which` ("ours" or "paper") over the columns every row has."""
    score = mean_scores(study, rows, which)
    return sorted(score, key=lambda k: -score[k])


def ordering_text(study: Study, rows: list[dict[str, Any]], which: str, labels: dict[str, str]) -> str:
    """The ordering as "A > B = C": variants whose means agree to the two decimals printed are tied, not ranked."""
    score, order = mean_scores(study, rows, which), ordering(study, rows, which)
    text = labels[order[0]] if order else ""
    for before, key in zip(order, order[1:]):
        text += f" {'=' if round(score[before], 2) == round(score[key], 2) else '>'} {labels[key]}"
    return text


def mean_scores(study: Study, rows: list[dict[str, Any]], which: str) -> dict[str, float]:
    def value(row: dict[str, Any], column: str) -> float | None:
        if which == "paper":
            return study.paper.get(row["variant"], {}).get(column)
        return row["cells"].get(column, {}).get("ours")

    columns = [c.key for c in study.columns if c.task is not None and all(value(r, c.key) is not None for r in rows)]
    if not columns or not rows:
        return {}
    return {r["variant"]: sum(value(r, c) for c in columns) / len(columns) for r in rows}


def runs_time(rows: list[dict[str, Any]]) -> tuple[float, float, bool]:
    """The recorded training time behind a table, whichever invocation ran it: (pre-training of each model once,
    fine-tuning, whether a pre-training was timed only from a step)."""
    models: dict[str, dict[str, Any]] = {}
    for r in rows:
        models.setdefault(r["model"], r["pretraining"])
    pretraining = sum(p.get("train_runtime_s") or 0.0 for p in models.values())
    partly = any(p.get("train_runtime_from_step") for p in models.values())
    return pretraining, sum(r["finetune_seconds"] for r in rows), partly


def _number(cell: dict[str, Any]) -> str:
    ours, se = cell.get("ours"), cell.get("se")
    if ours is None:
        return ""
    return (
        f"{ours:.2f}"
        + (f" ± {se:.2f}" if se is not None else "")
        + (f" ({len(cell['seeds'])})" if "seeds" in cell else "")
    )


def write_study(
    output_dir: Path,
    study: Study,
    rows: list[dict[str, Any]],
    args: StudyArguments,
    seconds: float,
    baseline: Mapping[str, float] | None = None,
    failed: list[str] | None = None,
) -> str:
    """Write study.md, study.json and study.png into `output_dir`; returns study.md's text."""
    baseline = baseline or {}
    orders = {"ours": ordering(study, rows, "ours"), "paper": ordering(study, rows, "paper")}
    times = runs_time(rows)
    lines = [
        *_heading(study, args),
        *_table(study, rows, baseline),
        *_ordering_lines(study, rows, orders),
        *(["", study.note] if study.note else []),
        *_time_lines(output_dir, args, seconds, times),
        *_failed_lines(failed),
    ]
    text = "\n".join(lines) + "\n"
    write_text(output_dir / "study.md", text)
    write_json(output_dir / "study.json", _study_record(study, rows, args, seconds, baseline, failed, orders, times))
    plot_study(study, rows, output_dir / "study.png", baseline)
    return text


def _heading(study: Study, args: StudyArguments) -> list[str]:
    head = " | ".join(f"{c.label} ours | paper" for c in study.columns)
    per_key = "".join(f", {item.partition('=')[0]} also `{item.partition('=')[2]}`" for item in args.finetune_args_for)
    return [
        f"# {study.title}",
        "",
        f"Paper: {study.source}. Ours: dev set, "
        + (
            f"mean ± standard error over {len(args.seeds)} fine-tuning seeds (seeds finished in brackets)"
            if args.seeds
            else "best of the fine-tuning grid"
        )
        + f"; every variant pre-trained from `{args.pretrain_config}` with "
        f"`{args.pretrain_args or '(no other arguments)'}`"
        + (f", fine-tuned with `{args.finetune_args}`" if args.finetune_args else "")
        + per_key
        + ".",
        "",
        f"| variant | {head} | steps | pre-training (s) | fine-tuning (s) |",
        "|---|" + "---|---|" * len(study.columns) + "---|---|---|",
    ]


def _table(study: Study, rows: list[dict[str, Any]], baseline: Mapping[str, float]) -> list[str]:
    """The table's lines: a variant each (ours and the paper's per column, its budget), then the majority class."""
    columns = study.columns
    lines = []
    for r in rows:
        cells = []
        for c in columns:
            cell = r["cells"].get(c.key, {})
            paper = study.paper.get(r["variant"], {}).get(c.key)
            cells.append(f"{_number(cell)} | {'' if paper is None else f'{paper:.1f}'}")
        p = r["pretraining"]
        runtime, since = p.get("train_runtime_s"), p.get("train_runtime_from_step")
        runtime = "" if runtime is None else f"{runtime:.0f}" + (f" (from step {since})" if since else "")
        lines.append(
            f"| {r['label']} | {' | '.join(cells)} | {p.get('global_step') or ''} | {runtime} | "
            f"{r['finetune_seconds']:.0f} |"
        )
    if baseline:
        cells = " | ".join(f"{baseline[c.key]:.2f} | " if c.key in baseline else " | " for c in columns)
        lines.append(f"| majority class (the training set's most frequent label) | {cells} | | | |")
    return lines


def _ordering_lines(study: Study, rows: list[dict[str, Any]], orders: dict[str, list[str]]) -> list[str]:
    """The variants' ordering, ours and (where the paper has the table) the paper's; nothing before any number."""
    if not orders["ours"]:
        return []
    labels = {r["variant"]: r["label"] for r in rows}
    lines = [
        "",
        "Ordering by the mean of the fine-tuning columns (best first; = where the means are equal):",
        f"- ours: {ordering_text(study, rows, 'ours', labels)}",
    ]
    if orders["paper"]:
        lines.append(f"- paper: {ordering_text(study, rows, 'paper', labels)}")
    return lines


def _time_lines(output_dir: Path, args: StudyArguments, seconds: float, times: tuple[float, float, bool]) -> list[str]:
    pretraining, finetuning, partly_timed = times
    return [
        "",
        f"Time of the runs: {(pretraining + finetuning) / 3600:.2f} h (pre-training "
        f"{pretraining / 3600:.2f} h{', part of it timed only from a step' if partly_timed else ''}, "
        f"fine-tuning {finetuning / 3600:.2f} h; each model counted once, kept runs included"
        + (f"; the fine-tuning ran {args.jobs} at a time" if args.jobs > 1 else "")
        + f"); this invocation {seconds / 3600:.2f} h. Runs: `{output_dir}/pretrain/<variant>/`, "
        f"`{output_dir}/finetune/<variant>/<task>/{'seed<S>/' if args.seeds else ''}`.",
    ]


def _failed_lines(failed: list[str] | None) -> list[str]:
    if not failed:
        return []
    return [
        "",
        f"Failed runs ({len(failed)}; their cells are missing or have fewer seeds):",
        *(f"- {f}" for f in failed),
    ]


def _study_record(
    study: Study,
    rows: list[dict[str, Any]],
    args: StudyArguments,
    seconds: float,
    baseline: Mapping[str, float],
    failed: list[str] | None,
    orders: dict[str, list[str]],
    times: tuple[float, float, bool],
) -> dict[str, Any]:
    pretraining, finetuning, _ = times
    return {
        "study": study.name,
        "title": study.title,
        "paper_source": study.source,
        "columns": [
            {"key": c.key, "label": c.label, "task": c.task, "metric": c.metric, "split": c.split}
            for c in study.columns
        ],
        "rows": rows,
        "ordering": orders,
        "pretrain_config": args.pretrain_config,
        "pretrain_args": args.pretrain_args,
        "finetune_args": args.finetune_args,
        "finetune_args_for": args.finetune_args_for,
        "seeds": args.seeds,
        "majority_baseline": dict(baseline),
        "failed": failed or [],
        "seconds": round(seconds, 1),
        "run_seconds": {"pretraining": round(pretraining, 1), "finetuning": round(finetuning, 1)},
    }


def plot_study(
    study: Study, rows: list[dict[str, Any]], path: Path, baseline: Mapping[str, float] | None = None
) -> None:
    try:
        import matplotlib
    except ImportError:  # an optional extra: the table is written without its chart rather than lost
        logger.warning("matplotlib is not installed (pip install 'bert-repro[train]'): not writing %s", path.name)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = study.columns
    fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns) + 1, 3.6), squeeze=False)
    xs = range(len(rows))
    for ax, column in zip(axes[0], columns):
        ours = [r["cells"].get(column.key, {}).get("ours") for r in rows]
        errors = [r["cells"].get(column.key, {}).get("se") or 0 for r in rows]
        paper = [study.paper.get(r["variant"], {}).get(column.key) for r in rows]
        ax.bar([x - 0.2 for x in xs], [v or 0 for v in ours], width=0.4, yerr=errors, capsize=3, label="ours")
        if baseline and column.key in baseline:
            ax.axhline(baseline[column.key], color="grey", linestyle="--", linewidth=1, label="majority class")
        ax.bar([x + 0.2 for x in xs], [v or 0 for v in paper], width=0.4, label="paper")
        ax.set_title(column.label, fontsize=10)
        ax.set_xticks(list(xs), [r["label"] for r in rows], rotation=35, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{study.title} ({study.source})", fontsize=11)
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=110, format=Path(path).suffix[1:] or None)
    plt.close(fig)


__all__ = ["ordering", "plot_study", "write_study"]
