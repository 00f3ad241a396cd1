"""The card of a fine-tuned checkpoint (`recipes/finetune.py`'s output directory), rendered with `finetuned.md`, and
its `.eval_results/<task>.yaml`: huggingface_hub 2.x's evaluation results, which the Hub shows on the model page and
on the benchmark dataset's leaderboard (the card's model-index stays, for older tools).

`_task_result` also names a study's fine-tuning scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, EvalResultEntry, ModelCard, eval_result_entries_to_yaml
from huggingface_hub.constants import EVAL_RESULTS_FOLDER

from ..atomic import write_text
from ..tasks.metrics import percent
from ..tasks.registry import METRICS, Result, Task, get_task
from . import card_common as card

__all__ = ["card_for_finetuning", "eval_result_entries", "write_eval_results"]


# Metric ids the Hub knows (hf.co/metrics), for the `metrics` field.
HUB_METRICS = {"accuracy", "f1", "exact_match", "matthews_correlation", "pearsonr", "spearmanr", "precision", "recall"}
TASK_TYPE_NAMES = {
    "fill-mask": "Fill-Mask",
    "text-classification": "Text Classification",
    "question-answering": "Question Answering",
    "multiple-choice": "Multiple Choice",
    "token-classification": "Token Classification",
}


def _task_result(task: Task, split: str, metric: str, value: float, name: str) -> EvalResult:
    """A model-index entry for a score of ``task`` on ``split``, named as the registry names it."""
    task_type = task.kind.pipeline_tag
    return EvalResult(
        task_type=task_type,
        task_name=TASK_TYPE_NAMES[task_type],
        dataset_type=task.hub_id,
        dataset_name=task.display_name,
        dataset_config=task.hub_config,
        dataset_split=split,
        metric_type=METRICS[metric].hub_id,
        metric_value=value,
        metric_name=name,
    )


# The one configuration of each dataset the registry loads without naming it (hub_config None), as the Hub names it.
_ONLY_CONFIG = {"rajpurkar/squad": "plain_text", "rajpurkar/squad_v2": "squad_v2", "eriktks/conll2003": "conll2003"}


def benchmark_task_id(task: Task, split: str) -> str:
    """The task id of an `.eval_results` entry: the Hub configuration that holds ``split`` (MNLI's dev splits have
    their own, `mnli_matched` and `mnli_mismatched`), since a benchmark's `eval.yaml` names a task by its
    configuration and split."""
    if task.hub_config == "mnli" and split.startswith("validation_"):
        return "mnli_" + split.removeprefix("validation_")
    return task.hub_config or _ONLY_CONFIG.get(task.hub_id, "default")


def eval_result_entries(summary: Mapping[str, Any]) -> list[EvalResultEntry]:
    """The kept run's main metric on each dev split of results.json's ``summary``, in the metric's own scale: one
    number per benchmark task, as a leaderboard ranks. Test splits are left to the model-index (CoNLL's test is
    scored too, but a leaderboard of the dev split must not mix it in)."""
    task = get_task(summary["task"])
    label = METRICS[task.main_metric].label
    entries = []
    for split in task.eval_splits:
        value = ((summary.get("best") or {}).get(split) or {}).get(task.main_metric)
        if split.startswith("validation") and card.is_number(value):
            notes = f"{label}, {split} split; the best run of a learning-rate grid, chosen on this split (bert_repro)"
            entries.append(EvalResultEntry(task.hub_id, benchmark_task_id(task, split), float(value), notes=notes))
    return entries


def write_eval_results(folder: str | Path, summary: Mapping[str, Any]) -> Path | None:
    """Write `folder/.eval_results/<task>.yaml` with huggingface_hub's own serialisation; None when the run has no
    dev score to give."""
    entries = eval_result_entries(summary)
    if not entries:
        return None
    path = Path(folder) / EVAL_RESULTS_FOLDER / f"{summary['task']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, yaml.safe_dump(eval_result_entries_to_yaml(entries), sort_keys=False))


def _metric_keys(task: Task, scores: Mapping[str, Any]) -> list[str]:
    """The metrics of a split's scores, the task's declared ones first; thresholds and counts left out."""
    extra = [k for k in scores if k not in task.metrics and k in METRICS]
    return [k for k in (*task.metrics, *extra) if k in scores]


def _paper_value(task: Task, metric: str, model: str, split: str) -> Result | None:
    """The paper's number for (metric, split), else its test split's (GLUE's are test-server scores), else its only."""
    found = [r for r in task.paper if r.model == model and r.metric == metric]
    for wanted in (split, split.replace("validation", "test")):
        for result in found:
            if result.split == wanted:
                return result
    return found[0] if len(found) == 1 else None


def _paper_cell(result: Result | None) -> str:
    return "–" if result is None else f"{result.value:.1f} ({card.SPLIT_NAMES.get(result.split, result.split)})"


def _finetuning_eval(
    task: Task, best: Mapping[str, Any], baseline: Mapping[str, Any] | None = None
) -> tuple[list[EvalResult], list[dict[str, str]]]:
    """model-index entries (in the metric's own scale, as `evaluate`'s) and table rows (percent) beside the majority
    class and the paper's BASE and LARGE numbers."""
    eval_results, rows = [], []
    for split in task.eval_splits:
        scores = best.get(split) or {}
        majority = (baseline or {}).get(split) or {}
        for metric in _metric_keys(task, scores):
            value = scores[metric]
            label = METRICS[metric].label
            ours = percent(metric, value)
            if ours is not None:
                eval_results.append(_task_result(task, split, metric, value, label))
            rows.append(
                {
                    "split": card.SPLIT_NAMES.get(split, split),
                    "metric": label,
                    "ours": card.score(ours, "undefined"),
                    "majority": card.score(percent(metric, majority.get(metric)), "–"),
                    "base": _paper_cell(_paper_value(task, metric, "base", split)),
                    "large": _paper_cell(_paper_value(task, metric, "large", split)),
                    "main": "yes" if metric == task.main_metric else "",
                }
            )
    return eval_results, rows


def _other_reported(task: Task) -> list[str]:
    return [
        f"{METRICS[r.metric].label} {r.value:g} on {card.SPLIT_NAMES.get(r.split, r.split)} ({r.model}; {r.source})"
        for r in task.other_reported
        if r.metric in METRICS
    ]


def _run_rows(task: Task, summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per run of the grid: its ranking score (percent) and whether it is the model kept."""
    best = summary.get("best") or {}
    kept = (best.get("learning_rate"), best.get("seed"))
    rows = []
    for r in summary.get("runs") or []:
        score = r.get("score")  # the main metric (SQuAD v2.0: F1 at the tuned threshold), in its own scale
        rows.append(
            {
                "learning_rate": card.format_setting(r.get("learning_rate")),
                "seed": card.format_setting(r.get("seed")),
                "score": card.score(percent(task.main_metric, score)),
                "seconds": card.count(r.get("train_seconds")),
                "best": "yes" if (r.get("learning_rate"), r.get("seed")) == kept else "",
            }
        )
    return rows


def _finetuning_base(summary: Mapping[str, Any], record: Mapping[str, Any], base_model: str | None) -> dict[str, Any]:
    """The pre-trained checkpoint: a Hub id goes in the metadata, a local path only by its last component."""
    source = base_model or summary.get("model") or (record.get("finetuning") or {}).get("model")
    hub = base_model if base_model else (source if card.is_hub_id(source) else None)
    return {
        "hub_id": hub,
        "name": hub or (card.public_name(source) if source else card.NOT_RECORDED),
        "licence": card.licence_of(hub),
    }


def _epochs(value: Any) -> str:
    """What the kept run trained (--max_steps may stop it within an epoch): "1 epoch", "2.5 epochs"."""
    if not card.is_number(value):
        return "epochs: not recorded"
    return f"{card.plain(value)} epoch" + ("" if value == 1 else "s")


def _finetuning_facts(task: Task, summary: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """What the training-procedure section says, each value ready to print."""
    hp = summary.get("hyperparameters") or {}
    best = summary.get("best") or {}
    run = record.get("finetuning") or {}
    training = record.get("training") or {}
    threshold = (best.get(task.eval_splits[0]) or {}).get("squad_best_f1_threshold")
    ranking = task.kind.ranking_metric(task)
    return {
        "ranking_metric": METRICS[ranking].label,
        "schedule": training.get("lr_scheduler_type", card.NOT_RECORDED),
        "optim": training.get("optim", card.NOT_RECORDED),
        "adam_epsilon": card.plain(training.get("adam_epsilon")),
        "learning_rates": ", ".join(map(card.format_setting, hp.get("learning_rates") or [])) or card.NOT_RECORDED,
        "seeds": ", ".join(str(v) for v in hp.get("seeds") or []) or card.NOT_RECORDED,
        "runs": card.plural(len(summary.get("runs") or []), "run"),
        "best_learning_rate": card.format_setting(best.get("learning_rate")),
        "best_seed": card.format_setting(best.get("seed")),
        "epochs": _epochs(best.get("epochs", hp.get("num_train_epochs"))),
        "steps": card.plural(best["steps"], "step") if card.is_number(best.get("steps")) else "steps not recorded",
        "batch_size": card.plain(hp.get("per_device_train_batch_size")),
        "max_seq_length": card.plain(hp.get("max_seq_length")),
        "warmup": card.warmup(hp.get("warmup")),
        "weight_decay": card.plain(hp.get("weight_decay")),
        "duration": card.duration(summary.get("seconds")),
        "hardware": summary.get("hardware") or card.NOT_RECORDED,
        # --data: a directory, a file, or split=path pairs; shown by their last components
        "data_source": ", ".join(card.last_component(d.split("=")[-1]) for d in run.get("data") or []) or None,
        "max_train_samples": run.get("max_train_samples"),
        # {split: [rows scored, rows it has]}
        "eval_rows": {
            card.SPLIT_NAMES.get(k, k): v for k, v in (summary.get("eval_rows") or {}).items() if v and v[0] < v[1]
        },
        "null_threshold": f"{threshold:.4g}" if card.is_number(threshold) else None,
    }


def _task_context(task: Task) -> dict[str, Any]:
    """What the card says about the task, from its description in `bert_repro.tasks.registry`."""
    splits = [card.SPLIT_NAMES.get(s, s) for s in task.eval_splits]
    labels = task.kind.card_labels(task)
    return {
        "display": task.display_name,
        "type": TASK_TYPE_NAMES[task.kind.pipeline_tag].lower(),
        "inputs": ", ".join(f"`{c}`" for c in task.text_columns),
        "description": task.description,
        "hub_id": task.hub_id,
        "hub_config": task.hub_config,
        "head": task.kind.head_description,
        "labels": ", ".join(labels) if labels else None,
        "main_metric": METRICS[task.main_metric].label,
        "eval_split": splits[0],
        "eval_splits": "the " + " and ".join(splits) + (" splits" if len(splits) > 1 else " split"),
        "data_licence": card.licence_of(task.hub_id),
        "paper_glue_test": any(r.split.startswith("test") for r in task.paper),
        "v2": task.allows_no_answer,
    }


def card_for_finetuning(
    output_dir: str | Path,
    repo_id: str,
    *,
    base_model: str | None = None,
    template_dir: str | Path | None = None,
    summary: Mapping[str, Any] | None = None,
) -> ModelCard:
    """The card of a fine-tuning output directory's best model, to publish as ``repo_id``.

    ``base_model`` defaults to the run's `--model` when that is a Hub id. ``template_dir``: other templates than the
    package's. ``summary``: results.json's content, for the run writing ``output_dir`` (it has not written
    results.json yet): its `.eval_results/<task>.yaml` is written there too, for a push to carry. Without it the
    directory is only read."""
    out = Path(output_dir)
    running = summary is not None
    summary = summary or card.read_json(out / "results.json")
    if summary is None or "task" not in summary or "best" not in summary:
        raise card.CardError(f"{out} is not a fine-tuning output directory (needs results.json with task, best).")
    try:
        task = get_task(summary["task"])
    except KeyError as err:  # a run of another version's task
        raise card.CardError(f"{out / 'results.json'}: {err.args[0]}") from None
    record = card.read_json(out / "run_config.json")
    record = record if isinstance(record, dict) else {}
    config = card.read_json(out / "config.json") or {}
    training = record.get("training") or {}
    best = summary["best"] or {}
    eval_results, eval_rows = _finetuning_eval(task, best, summary.get("majority_baseline"))
    base = _finetuning_base(summary, record, base_model)
    parameters = card.stored_parameter_count(out)
    if parameters is None and config.get("hidden_size"):
        parameters = card.parameter_count(config, task.kind)
    metrics = [m for m in dict.fromkeys(METRICS[m].hub_id for m in task.metrics) if m in HUB_METRICS]
    glue = ("glue",) if task.hub_id == "nyu-mll/glue" else ()
    card_data = card.metadata(
        repo_id=repo_id,
        pipeline_tag=task.kind.pipeline_tag,
        tags=(*glue, task.name),
        datasets=[task.hub_id],
        eval_results=eval_results,
        base_model=base["hub_id"],
        metrics=metrics,
    )
    context = {
        "task": _task_context(task),
        "architecture": card.architecture_rows(config, parameters) if config else [],
        "base": base,
        "facts": _finetuning_facts(task, summary, record),
        "eval_rows": eval_rows,
        "majority_recorded": bool(summary.get("majority_baseline")),
        # the split -> the one label the kept run predicted for all its examples: it learned nothing else
        "one_label": {card.SPLIT_NAMES.get(k, k): v for k, v in (best.get("one_label") or {}).items()},
        "other_reported": _other_reported(task),
        "run_rows": _run_rows(task, summary),
        "hyperparameters": card.hyperparameter_sections(
            record,
            {"finetuning": "Fine-tuning run (bert_repro)", "training": "Trainer (transformers TrainingArguments)"},
            {
                "training": {
                    "learning_rate": "each run sets its own, from the grid",
                    "seed": "each run sets its own, from the seeds",
                    **({"data_seed": "each run's seed"} if training.get("data_seed") is None else {}),
                }
            },
        ),
        "versions": card.framework_lines(summary.get("versions"), config.get("transformers_version")),
        "usage": card.usage(repo_id, task, config=config),
    }
    rendered = card.render_card("finetuned.md", card_data, context, template_dir)
    if running:
        write_eval_results(out, summary)
    return rendered
