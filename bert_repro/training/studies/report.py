"""Reports beside the paper, written after every finished run: `write_report` puts a report's markdown, its data
and its chart (`bar_chart`: ours against the paper's) side by side; `write_study` is a study's (study.md / .json /
.png, from the rows of its table, `run.table_row`): our numbers beside the paper's, the budget of each variant
(steps, sequences, time) and the ordering of the variants, ours against the paper's.
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


def write_report(output_dir: Path, name: str, lines: list[str], record: dict[str, Any], chart: dict) -> str:
    """`name`.md of `lines`, `name`.json of `record` and `name`.png (`bar_chart(**chart)`); returns the markdown."""
    text = "\n".join(lines) + "\n"
    write_text(output_dir / f"{name}.md", text)
    write_json(output_dir / f"{name}.json", record)
    bar_chart(output_dir / f"{name}.png", **chart)
    return text


def bar_chart(path: Path, panels: dict[str, tuple], title: str = "", paper: str = "paper") -> None:
    """Ours beside the paper's, a panel per title: (bar labels, ours, our standard errors, the paper's, a baseline)."""
    try:
        import matplotlib
    except ImportError:  # an optional extra: the report is written without its chart rather than lost
        logger.warning("matplotlib is not installed (pip install 'bert-repro[train]'): not writing %s", path.name)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(6.0, sum(0.8 * len(labels) + 1 for labels, *_ in panels.values()))
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 3.8), squeeze=False)
    for ax, (name, (labels, ours, errors, theirs, baseline)) in zip(axes[0], panels.items()):
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], [v or 0 for v in ours], width=0.4, yerr=errors, capsize=3, label="ours (dev)")
        if baseline is not None:
            ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="majority class")
        ax.bar([x + 0.2 for x in xs], [v or 0 for v in theirs], width=0.4, label=paper)
        ax.set_title(name, fontsize=10)
        ax.set_xticks(list(xs), labels, rotation=35, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=110, format=path.suffix[1:] or None)
    plt.close(fig)


def mean_scores(study: Study, rows: list[dict[str, Any]], which: str) -> dict[str, float]:
    """Each variant's mean of `which` ("ours" or "paper") over the fine-tuning columns every row has."""

    def value(row: dict[str, Any], column: str) -> float | None:
        if which == "paper":
            return study.paper.get(row["variant"], {}).get(column)
        return row["cells"].get(column, {}).get("ours")

    columns = [c.key for c in study.columns if c.task is not None and all(value(r, c.key) is not None for r in rows)]
    if not columns or not rows:
        return {}
    return {r["variant"]: sum(value(r, c) for c in columns) / len(columns) for r in rows}


def ordering_text(score: dict[str, float], labels: dict[str, str]) -> str:
    """Best first as "A > B = C": variants whose means agree to the two decimals printed are tied, not ranked."""
    order = sorted(score, key=lambda k: -score[k])
    text = labels[order[0]]
    for before, key in zip(order, order[1:]):
        text += f" {'=' if round(score[before], 2) == round(score[key], 2) else '>'} {labels[key]}"
    return text


def runs_time(rows: list[dict[str, Any]]) -> tuple[float, float, bool]:
    """The recorded training time behind a table, whichever invocation ran it: (pre-training of each model once,
    since a fine-tuning variant shares another's; fine-tuning; whether a pre-training was timed only from a step,
    resumed from a checkpoint that did not record the time before it)."""
    models: dict[str, dict[str, Any]] = {}
    for r in rows:
        models.setdefault(r["model"], r["pretraining"])
    pretraining = sum(p.get("train_runtime_s") or 0.0 for p in models.values())
    partly = any(p.get("train_runtime_from_step") for p in models.values())
    return pretraining, sum(r["finetune_seconds"] for r in rows), partly


def _number(cell: dict[str, Any]) -> str:
    ours, se, seeds = cell.get("ours"), cell.get("se"), cell.get("seeds")
    if ours is None:
        return ""
    return f"{ours:.2f}" + ("" if se is None else f" ± {se:.2f}") + ("" if seeds is None else f" ({len(seeds)})")


def _table(study: Study, rows: list[dict[str, Any]], baseline: Mapping[str, float]) -> list[str]:
    """The table's lines: a variant each (ours and the paper's per column, its budget), then the majority class."""
    lines = [
        f"| variant | {' | '.join(f'{c.label} ours | paper' for c in study.columns)} | steps | pre-training (s) | "
        "fine-tuning (s) |",
        "|---|" + "---|---|" * len(study.columns) + "---|---|---|",
    ]
    for r in rows:
        cells = []
        for c in study.columns:
            paper = study.paper.get(r["variant"], {}).get(c.key)
            cells.append(f"{_number(r['cells'].get(c.key, {}))} | {'' if paper is None else f'{paper:.1f}'}")
        p = r["pretraining"]
        runtime, since = p.get("train_runtime_s"), p.get("train_runtime_from_step")
        runtime = "" if runtime is None else f"{runtime:.0f}" + (f" (from step {since})" if since else "")
        lines.append(
            f"| {r['label']} | {' | '.join(cells)} | {p.get('global_step') or ''} | {runtime} | "
            f"{r['finetune_seconds']:.0f} |"
        )
    if baseline:
        cells = " | ".join(f"{baseline[c.key]:.2f} | " if c.key in baseline else " | " for c in study.columns)
        lines.append(f"| majority class (the training set's most frequent label) | {cells} | | | |")
    return lines


def write_study(
    output_dir: Path,
    study: Study,
    rows: list[dict[str, Any]],
    args: StudyArguments,
    seconds: float,
    baseline: Mapping[str, float] | None = None,
    failed: list[str] | None = None,
) -> str:
    """study.md, study.json and study.png; returns study.md's text."""
    baseline, failed = baseline or {}, failed or []
    scores = {which: mean_scores(study, rows, which) for which in ("ours", "paper")}
    labels = {r["variant"]: r["label"] for r in rows}
    protocol = f"mean ± standard error over {len(args.seeds)} fine-tuning seeds (seeds finished in brackets)"
    protocol = protocol if args.seeds else "best of the fine-tuning grid"
    lines = [
        f"# {study.title}",
        "",
        f"Paper: {study.source}. Ours: dev set, {protocol}; every variant pre-trained from `{args.pretrain_config}` "
        f"with `{args.pretrain_args or '(no other arguments)'}`"
        + (f", fine-tuned with `{args.finetune_args}`" if args.finetune_args else "")
        + "".join(f", {key} also `{text}`" for key, _, text in (item.partition("=") for item in args.finetune_args_for))
        + ".",
        "",
        *_table(study, rows, baseline),
    ]
    if scores["ours"]:  # nothing before any number
        lines += ["", "Ordering by the mean of the fine-tuning columns (best first; = where the means are equal):"]
        lines += [f"- {which}: {ordering_text(score, labels)}" for which, score in scores.items() if score]
    pretraining, finetuning, partly = runs_time(rows)
    lines += [
        *(["", study.note] if study.note else []),
        "",
        f"Time of the runs: {(pretraining + finetuning) / 3600:.2f} h (pre-training {pretraining / 3600:.2f} h"
        f"{', part of it timed only from a step' if partly else ''}, fine-tuning {finetuning / 3600:.2f} h; each "
        "model counted once, kept runs included"
        + (f"; the fine-tuning ran {args.jobs} at a time" if args.jobs > 1 else "")
        + f"); this invocation {seconds / 3600:.2f} h. Runs: `{output_dir}/pretrain/<variant>/`, "
        f"`{output_dir}/finetune/<variant>/<task>/{'seed<S>/' if args.seeds else ''}`.",
    ]
    if failed:
        lines += ["", f"Failed runs ({len(failed)}; their cells are missing or have fewer seeds):"]
        lines += [f"- {f}" for f in failed]
    columns = [{k: getattr(c, k) for k in ("key", "label", "task", "metric", "split")} for c in study.columns]
    record = {"study": study.name, "title": study.title, "paper_source": study.source, "columns": columns, "rows": rows}
    record["ordering"] = {which: sorted(score, key=lambda k: -score[k]) for which, score in scores.items()}
    for name in ("pretrain_config", "pretrain_args", "finetune_args", "finetune_args_for", "seeds"):
        record[name] = getattr(args, name)
    record |= {"majority_baseline": dict(baseline), "failed": failed, "seconds": round(seconds, 1)}
    record["run_seconds"] = {"pretraining": round(pretraining, 1), "finetuning": round(finetuning, 1)}
    panels = {
        c.label: (
            [r["label"] for r in rows],
            [r["cells"].get(c.key, {}).get("ours") for r in rows],
            [r["cells"].get(c.key, {}).get("se") or 0 for r in rows],
            [study.paper.get(r["variant"], {}).get(c.key) for r in rows],
            baseline.get(c.key),
        )
        for c in study.columns
    }
    chart = dict(panels=panels, title=f"{study.title} ({study.source})")
    return write_report(output_dir, "study", lines, record, chart)
