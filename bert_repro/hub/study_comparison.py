"""A study's fine-tuning comparison as the cards show it (`bert_repro.training.studies`'s `study.json`): a pre-trained
checkpoint fine-tuned beside the same architecture randomly initialised and the majority class, each difference with
its standard error. `StudyComparison` is the study section of a pre-trained checkpoint's card and the table of a
study's own card (`study_card`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult

from ..tasks.metrics import own_scale
from ..tasks.registry import METRICS, TASKS
from .card_base import read_json, split_name, task_result
from .numbers import format_setting, is_number, plural, score
from .secrets import CardError, public_value


def is_random_init(row: Mapping[str, Any]) -> bool:
    """A study row of weights drawn at random: `bert_repro.training.studies` records their pre-training as 0 steps."""
    return (row.get("pretraining") or {}).get("global_step") == 0


def _study_row(rows: list[dict[str, Any]], out: Path, path: Path, steps: Any) -> dict[str, Any]:
    """This checkpoint's row of a study: the row whose model is ``out``, else the first row that was pre-trained
    (a study run elsewhere names its own paths); refused when its pre-training steps are not the checkpoint's."""
    row = next((r for r in rows if r.get("model") and Path(r["model"]).resolve() == out.resolve()), None)
    row = row or next((r for r in rows if not is_random_init(r)), None)
    if row is None:
        raise CardError(f"{path} has no row of a pre-trained model, only randomly initialised ones.")
    theirs = (row.get("pretraining") or {}).get("global_step")
    if is_number(steps) and is_number(theirs) and theirs != steps:
        raise CardError(
            f"{path}: its row {row.get('variant')!r} was pre-trained for {theirs:,} steps, this checkpoint for "
            f"{steps:,}: not the same model."
        )
    return row


def _mean_cell(cell: Mapping[str, Any], seeds: int) -> str:
    """Mean ± standard error; a cell with fewer seeds than the study (failed runs) says how many it has."""
    ours, se, finished = cell.get("ours"), cell.get("se"), len(cell.get("seeds") or {})
    if not is_number(ours):
        return "–"
    spread = f" ± {se:.2f}" if is_number(se) else ""
    return f"{ours:.2f}{spread}" + (f" ({plural(finished, 'seed')})" if finished and finished != seeds else "")


def public_args(text: str) -> str:
    """Command-line arguments as a card may show them: absolute paths by their last component."""
    return " ".join(format_setting(public_value("", a)) for a in str(text).split())


def _verdict(rows: list[dict[str, Any]]) -> str:
    """The table in one sentence: where pre-training beats random init by over 2 SE, where the majority class wins."""
    better = [r["name"] for r in rows if r["clear"] and r["gain"] > 0]
    where = "every score" if len(better) == len(rows) else ", ".join(better) + " only" if better else "no score"
    sentence = (
        f"Pre-training beats random initialisation by more than twice the standard error of the difference on {where}"
    )
    below = [f"{r['name']} ({r['below_majority']})" for r in rows if r["below_majority"]]
    return sentence + (f", yet the majority class still scores higher on {', '.join(below)}" if below else "") + "."


def _comparison_row(task_name: str, label: str, split: str, cell: dict, other: dict, majority: Any, seeds: int) -> dict:
    """A table row: this model's cell beside random initialisation's, the difference with its standard error (those
    of the two means combined), and the majority class."""
    ours, theirs = cell.get("ours"), other.get("ours")
    both = is_number(ours) and is_number(theirs)
    errors = [e for e in (cell.get("se"), other.get("se")) if is_number(e)]
    se = math.sqrt(sum(e * e for e in errors)) if both and len(errors) == 2 else None
    gain = ours - theirs if both else None
    return {
        "name": f"{task_name} {label}",
        "task": task_name,
        "metric": label,
        "split": split,
        "ours": _mean_cell(cell, seeds),
        "random": _mean_cell(other, seeds),
        "gain": gain,
        "difference": "–" if gain is None else f"{gain:+.2f}" + (f" ± {se:.2f}" if se is not None else ""),
        "clear": gain is not None and se is not None and abs(gain) > 2 * se,
        "majority": score(majority),
        "below_majority": f"{majority:.2f} against {ours:.2f}"
        if is_number(ours) and is_number(majority) and ours <= majority
        else None,
    }


@dataclass
class StudyComparison:
    """One pre-trained row of a study against random initialisation: its model-index entries (the study's percent
    back in each metric's own scale), the table, how the runs were fine-tuned, and the table in one sentence."""

    eval_results: list[EvalResult]
    rows: list[dict[str, Any]]
    seeds: str | None  # None: each score is the best run of its learning-rate grid
    n_seeds: str
    finetune_args: str
    finetune_args_for: list[tuple[str, str]]  # per task (or variant), the task by its display name
    verdict: str | None  # it needs standard errors: seeds, and a randomly initialised row

    @classmethod
    def of(cls, study: Mapping[str, Any], row: Mapping[str, Any], split_in_names: bool = False) -> StudyComparison:
        """``row``'s comparison in ``study``; the model-index entries name the split too when ``split_in_names``."""
        rows = study.get("rows") or []
        random = next((r for r in rows if is_random_init(r)), {})
        baseline, seeds = study.get("majority_baseline") or {}, study.get("seeds") or []
        eval_results, table = [], []
        for column in study.get("columns") or []:
            if column.get("task") not in TASKS or column.get("metric") not in METRICS:
                continue  # a pre-training column (no fine-tuning) or a task this version does not know
            task, metric, split = TASKS[column["task"]], column["metric"], column.get("split") or "validation"
            cell, other = row["cells"].get(column["key"]) or {}, (random.get("cells") or {}).get(column["key"]) or {}
            label, shown, finished = METRICS[metric].label, split_name(split), len(cell.get("seeds") or {})
            if is_number(cell.get("ours")):
                how = f"mean of {plural(finished, 'seed')}" if finished else "best of the learning-rate grid"
                name = f"{label}, fine-tuned, " + (f"{shown}, " if split_in_names else "") + how
                eval_results.append(task_result(task, split, metric, own_scale(metric, cell["ours"]), name))
            majority = baseline.get(column["key"])
            table.append(_comparison_row(task.display_name, label, shown, cell, other, majority, len(seeds) or 1))
        return cls(
            eval_results=eval_results,
            rows=table,
            seeds=", ".join(str(s) for s in seeds) or None,
            n_seeds=plural(len(seeds) or 1, "fine-tuning seed"),
            finetune_args=public_args(study.get("finetune_args") or "") or "the defaults",
            finetune_args_for=[
                (TASKS[key].display_name if key in TASKS else key, public_args(args))
                for key, _, args in (k.partition("=") for k in study.get("finetune_args_for") or [])
            ],
            verdict=_verdict(table) if random and seeds else None,
        )

    @classmethod
    def from_dir(cls, study_dir: str | Path, out: Path, steps: Any) -> StudyComparison:
        """The comparison of the `recipes/study.py` run in ``study_dir`` for the checkpoint in ``out`` (trained for
        ``steps``)."""
        path = Path(study_dir) / "study.json"
        study = read_json(path)
        if study is None:
            raise CardError(f"{path}: no such file; --study takes the output directory of recipes/study.py.")
        return cls.of(study, _study_row(study.get("rows") or [], out, path, steps))
