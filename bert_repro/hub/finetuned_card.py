"""The card of a fine-tuned checkpoint (`recipes/finetune.py`'s output directory): `FineTunedFacts`, rendered with
`finetuned.md`; and its `.eval_results/<task>.yaml`: huggingface_hub 2.x's evaluation results, which the Hub shows on
the model page and on the benchmark dataset's leaderboard (the card's model-index stays, for older tools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml
from huggingface_hub import EvalResult, EvalResultEntry, ModelCard, ModelCardData, eval_result_entries_to_yaml
from huggingface_hub.constants import EVAL_RESULTS_FOLDER

from ..atomic import write_text
from ..tasks.metrics import percent
from ..tasks.registry import METRICS, Result, Task, get_task
from . import card_base as base
from .numbers import NOT_RECORDED, is_number, plain, score
from .secrets import CardError, is_hub_id, last_component, public_name

# Metric ids the Hub knows (hf.co/metrics), for the `metrics` field.
HUB_METRICS = {"accuracy", "f1", "exact_match", "matthews_correlation", "pearsonr", "spearmanr", "precision", "recall"}


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
        if split.startswith("validation") and is_number(value):
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
    return "–" if result is None else f"{result.value:.1f} ({base.split_name(result.split)})"


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
                eval_results.append(base.task_result(task, split, metric, value, label))
            papers = [_paper_cell(_paper_value(task, metric, model, split)) for model in ("base", "large")]
            majority_score = score(percent(metric, majority.get(metric)), "–")
            rows.append((split, label, metric == task.main_metric, score(ours, "undefined"), majority_score, *papers))
    return eval_results, rows


@dataclass
class FineTunedFacts(base.CardFacts):
    """What the card of a fine-tuned model (the best run of its learning-rate grid) states. The template reads the
    task from ``task`` (its description in `bert_repro.tasks.registry`), the grid and its scores from ``summary``
    (results.json), the settings from ``run`` and ``training`` (run_config.json's sections); the other fields are
    what the card derives from them."""

    template: ClassVar[str] = "finetuned.md"
    repo_id: str
    task: Task
    summary: dict[str, Any]
    run: dict[str, Any]
    training: dict[str, Any]
    base_model: str | None  # the pre-trained checkpoint, a Hub id
    base_name: str  # the pre-trained checkpoint as the card names it: a local path by its last component
    task_type: str  # as the Hub names it, lower-cased for prose
    paper_on_test: bool  # the paper's numbers are test-server scores (GLUE)
    architecture: list[tuple[str, str]]
    data_source: str | None  # --data: a directory, a file, or split=path pairs, by their last components
    epochs: str  # what the kept run trained (--max_steps may stop it within an epoch): "1 epoch", "2.5 epochs"
    null_threshold: str | None  # SQuAD v2.0's, tuned on dev
    eval_results: list[EvalResult]
    eval_rows: list[tuple[str, str, bool, str, str, str, str]]  # split, metric, main, ours, majority, paper BASE, LARGE
    hyperparameters: list[tuple[str, list[tuple[str, str]]]]
    versions: list[str]
    usage: base.Usage

    @classmethod
    def from_run(
        cls, output_dir: str | Path, repo_id: str, *, base_model: str | None = None, summary: dict | None = None
    ) -> FineTunedFacts:
        """The facts of a fine-tuning output directory's best model, to publish as ``repo_id``. ``base_model``
        defaults to the run's `--model` when that is a Hub id. ``summary``: results.json's content, for the run
        that has not written it yet."""
        out = Path(output_dir)
        summary = summary or base.read_json(out / "results.json")
        if summary is None or "task" not in summary or "best" not in summary:
            raise CardError(f"{out} is not a fine-tuning output directory (needs results.json with task, best).")
        try:
            task = get_task(summary["task"])
        except KeyError as err:  # a run of another version's task
            raise CardError(f"{out / 'results.json'}: {err.args[0]}") from None
        record = base.read_json(out / "run_config.json")
        record = record if isinstance(record, dict) else {}
        config = base.read_json(out / "config.json") or {}
        run, training = record.get("finetuning") or {}, record.get("training") or {}
        best, hp = summary["best"] or {}, summary.get("hyperparameters") or {}
        source = base_model or summary.get("model") or run.get("model")
        base_model = base_model or (source if is_hub_id(source) else None)
        epochs = best.get("epochs", hp.get("num_train_epochs"))
        threshold = (best.get(task.eval_splits[0]) or {}).get("squad_best_f1_threshold")
        eval_results, eval_rows = _finetuning_eval(task, best, summary.get("majority_baseline"))
        notes = {
            "learning_rate": "each run sets its own, from the grid",
            "seed": "each run sets its own, from the seeds",
        }
        if training.get("data_seed") is None:
            notes["data_seed"] = "each run's seed"
        return cls(
            repo_id=repo_id,
            task=task,
            summary=dict(summary),
            run=run,
            training=training,
            base_model=base_model,
            base_name=base_model or (public_name(source) if source else NOT_RECORDED),
            task_type=base.TASK_TYPE_NAMES[task.kind.pipeline_tag].lower(),
            paper_on_test=any(r.split.startswith("test") for r in task.paper),
            architecture=base.architecture_rows(out, config, task.kind),
            data_source=", ".join(last_component(d.split("=")[-1]) for d in run.get("data") or []) or None,
            epochs=f"{plain(epochs)} epoch" + ("" if epochs == 1 else "s")
            if is_number(epochs)
            else "epochs: not recorded",
            null_threshold=f"{threshold:.4g}" if is_number(threshold) else None,
            eval_results=eval_results,
            eval_rows=eval_rows,
            hyperparameters=base.hyperparameter_sections(
                record,
                {"finetuning": "Fine-tuning run (bert_repro)", "training": "Trainer (transformers TrainingArguments)"},
                {"training": notes},
            ),
            versions=base.framework_lines(summary.get("versions"), config.get("transformers_version")),
            usage=base.Usage.of(repo_id, task, config),
        )

    def card_data(self) -> ModelCardData:
        task = self.task
        return base.metadata(
            repo_id=self.repo_id,
            pipeline_tag=task.kind.pipeline_tag,
            tags=(*(("glue",) if task.hub_id == "nyu-mll/glue" else ()), task.name),
            datasets=[task.hub_id],
            eval_results=self.eval_results,
            base_model=self.base_model,
            metrics=[m for m in dict.fromkeys(METRICS[m].hub_id for m in task.metrics) if m in HUB_METRICS] or None,
        )


def card_for_finetuning(
    output_dir: str | Path, repo_id: str, template_dir: str | Path | None = None, **kwargs: Any
) -> ModelCard:
    """`FineTunedFacts.from_run(output_dir, repo_id, **kwargs)`'s card (``template_dir``: other templates than the
    package's). With a ``summary``, for the run writing ``output_dir``, its `.eval_results/<task>.yaml` is written
    there too, for a push to carry; without one the directory is only read."""
    card = FineTunedFacts.from_run(output_dir, repo_id, **kwargs).to_model_card(template_dir)
    if kwargs.get("summary") is not None:
        write_eval_results(output_dir, kwargs["summary"])
    return card
