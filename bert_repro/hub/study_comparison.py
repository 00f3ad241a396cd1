"""A study's fine-tuning comparison as the cards show it (`bert_repro.training.studies`'s `study.json`): a pre-trained
checkpoint fine-tuned beside the same architecture randomly initialised and the majority class, each difference with
its standard error. `_study` is the study section of a pre-trained checkpoint's card; `study_card` shows the same table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult

from ..tasks.metrics import own_scale
from ..tasks.registry import METRICS, TASKS
from . import card_common as card
from .finetuned_card import _task_result


def _is_random_init(row: Mapping[str, Any]) -> bool:
    """A study row of weights drawn at random: `bert_repro.training.studies` records their pre-training as 0 steps."""
    return (row.get("pretraining") or {}).get("global_step") == 0


def _study_row(rows: list[dict[str, Any]], out: Path, path: Path, steps: Any) -> dict[str, Any]:
    """This checkpoint's row of a study: the row whose model is ``out``, else the first row that was pre-trained
    (a study run elsewhere names its own paths); refused when its pre-training steps are not the checkpoint's."""
    row = next((r for r in rows if r.get("model") and Path(r["model"]).resolve() == out.resolve()), None)
    row = row or next((r for r in rows if not _is_random_init(r)), None)
    if row is None:
        raise card.CardError(f"{path} has no row of a pre-trained model, only randomly initialised ones.")
    theirs = (row.get("pretraining") or {}).get("global_step")
    if card.is_number(steps) and card.is_number(theirs) and theirs != steps:
        raise card.CardError(
            f"{path}: its row {row.get('variant')!r} was pre-trained for {theirs:,} steps, this checkpoint for "
            f"{steps:,}: not the same model."
        )
    return row


def _mean_cell(cell: Mapping[str, Any], seeds: int) -> str:
    """Mean ± standard error; a cell with fewer seeds than the study (failed runs) says how many it has."""
    ours, se, finished = cell.get("ours"), cell.get("se"), len(cell.get("seeds") or {})
    if not card.is_number(ours):
        return "–"
    spread = f" ± {se:.2f}" if card.is_number(se) else ""
    return f"{ours:.2f}{spread}" + (f" ({card.plural(finished, 'seed')})" if finished and finished != seeds else "")


def _public_args(text: str) -> str:
    return " ".join(card.format_setting(card.public_value("", a)) for a in str(text).split())


def finetune_args_for(study: Mapping[str, Any], shown: Callable[[str], str]) -> list[tuple[str, str]]:
    """The study's per-task (or per-variant) fine-tuning arguments, the task by its display name."""
    return [
        (TASKS[key].display_name if key in TASKS else key, shown(args))
        for key, _, args in (k.partition("=") for k in study.get("finetune_args_for") or [])
    ]


def _study_verdict(rows: list[dict[str, Any]]) -> str:
    """The table in one sentence: where pre-training beats random init by over 2 SE, where the majority class wins."""
    better = [r["name"] for r in rows if r["clear"] and r["gain"] > 0]
    where = "every score" if len(better) == len(rows) else ", ".join(better) + " only" if better else "no score"
    sentence = (
        f"Pre-training beats random initialisation by more than twice the standard error of the difference on {where}"
    )
    below = [f"{r['name']} ({r['below_majority']})" for r in rows if r["below_majority"]]
    return sentence + (f", yet the majority class still scores higher on {', '.join(below)}" if below else "") + "."


def fine_tuning_comparison(
    study: Mapping[str, Any], row: Mapping[str, Any], result_name: Callable[[str, str, int], str]
) -> tuple[list[EvalResult], list[dict[str, Any]]]:
    """Model-index entries of `row`'s fine-tuning scores (the study's percent back in each metric's own scale), named
    by `result_name(label, split, seeds finished)`, and table rows beside random initialisation and the majority
    class, with the difference and its standard error."""
    rows = study.get("rows") or []
    random = next((r for r in rows if _is_random_init(r)), {})
    baseline, seeds = study.get("majority_baseline") or {}, len(study.get("seeds") or []) or 1
    eval_results, table = [], []
    for column in study.get("columns") or []:
        if column.get("task") not in TASKS or column.get("metric") not in METRICS:
            continue  # a pre-training column (no fine-tuning) or a task this version does not know
        task, metric, split = TASKS[column["task"]], column["metric"], column.get("split") or "validation"
        cell, other = row["cells"].get(column["key"]) or {}, (random.get("cells") or {}).get(column["key"]) or {}
        ours, theirs, majority = cell.get("ours"), other.get("ours"), baseline.get(column["key"])
        split_name = card.SPLIT_NAMES.get(split, split)
        if card.is_number(ours):
            name = result_name(METRICS[metric].label, split_name, len(cell.get("seeds") or {}))
            eval_results.append(_task_result(task, split, metric, own_scale(metric, ours), name))
        both = card.is_number(ours) and card.is_number(theirs)
        errors = [e for e in (cell.get("se"), other.get("se")) if card.is_number(e)]
        se = math.sqrt(sum(e * e for e in errors)) if both and len(errors) == 2 else None
        gain = ours - theirs if both else None
        table.append(
            {
                "name": f"{task.display_name} {METRICS[metric].label}",
                "task": task.display_name,
                "metric": METRICS[metric].label,
                "split": split_name,
                "ours": _mean_cell(cell, seeds),
                "random": _mean_cell(other, seeds),
                "gain": gain,
                "difference": "–" if gain is None else f"{gain:+.2f}" + (f" ± {se:.2f}" if se is not None else ""),
                "clear": gain is not None and se is not None and abs(gain) > 2 * se,
                "majority": card.score(majority),
                "below_majority": f"{majority:.2f} against {ours:.2f}"
                if card.is_number(ours) and card.is_number(majority) and ours <= majority
                else None,
            }
        )
    return eval_results, table


def _study(study_dir: str | Path | None, out: Path, steps: Any) -> tuple[list[EvalResult], dict[str, Any] | None]:
    """The model-index entries and table of the `recipes/study.py` run in ``study_dir`` for this checkpoint."""
    if study_dir is None:
        return [], None
    path = Path(study_dir) / "study.json"
    study = card.read_json(path)
    if study is None:
        raise card.CardError(f"{path}: no such file; --study takes the output directory of recipes/study.py.")
    rows = study.get("rows") or []
    row = _study_row(rows, out, path, steps)
    seeds = len(study.get("seeds") or []) or 1
    random = next((r for r in rows if _is_random_init(r)), {})

    def result_name(label: str, split: str, finished: int) -> str:
        how = f"mean of {card.plural(finished, 'seed')}" if finished else "best of the learning-rate grid"
        return f"{label}, fine-tuned, {how}"

    eval_results, table = fine_tuning_comparison(study, row, result_name)
    return eval_results, {
        "rows": table,
        "seeds": ", ".join(str(s) for s in study.get("seeds") or []) or None,  # None: the best run of each grid
        "n_seeds": card.plural(seeds, "fine-tuning seed"),
        "finetune_args": _public_args(study.get("finetune_args") or "") or "the defaults",
        "finetune_args_for": finetune_args_for(study, _public_args),
        "verdict": _study_verdict(table) if random and study.get("seeds") else None,  # it needs standard errors
    }
