"""The card of a pre-trained checkpoint (`recipes/pretrain.py`'s output directory), rendered with `pretrained.md`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard

from ..data.pretraining_config import PreTrainingDataConfig
from ..data.travel_corpus import CORPUS_FILE, MANIFEST_FILE
from ..tasks.metrics import percent
from ..tasks.registry import METRICS, TASKS
from ..training.pretraining.recipe import DataSettings, PreTrainingRecipe
from . import card_common as card
from .study_comparison import _study

__all__ = ["card_for_pretraining"]


# The paper's pre-training scale (section 3.1 and appendix A.2), to put a run's in perspective.
PAPER_STEPS, PAPER_BATCH = 1_000_000, 256
# Paper, footnote to section 3.1: "The final model achieves 97%-98% accuracy on NSP."
PAPER_NSP_ACCURACY = "97–98"


def _shown_path(path: str) -> str:
    """A corpus path as given when relative to the run's directory, else by its last component (nothing private)."""
    parts = Path(path).parts
    return card.last_component(path) if Path(path).is_absolute() or path.startswith("~") or ".." in parts else path


def _corpus_documentation(sources: list[str]) -> list[str]:
    """The README.md or manifest in a local source's folder or the one above it; not the working directory's or
    above, whose README is the project's."""
    found = []
    for source in sources:
        folder = Path(source) if Path(source).is_dir() else Path(source).parent
        for directory in (folder, folder.parent):
            if Path.cwd().is_relative_to(directory.resolve()):
                continue
            found += [
                f"{_shown_path(str(directory))}/{n}" for n in ("README.md", MANIFEST_FILE) if (directory / n).is_file()
            ]
    return list(dict.fromkeys(found))


def _corpus_name(source: str) -> str:
    """A local source by its last component; a corpus file of `bert_repro.data.travel_corpus` by its folder's."""
    return card.last_component(str(Path(source).parent) if Path(source).name == CORPUS_FILE else source)


def _corpus_total(statistics: Mapping[str, Any], key: str) -> int | None:
    """A count of the whole corpus: the training documents' plus the held-out ones' (None: not recorded)."""
    counts = [(statistics.get(k) or {}).get(key) for k in ("phase1", "held_out")]
    return sum(n for n in counts if card.is_number(n)) if card.is_number(counts[0]) else None


def _corpus(run: DataSettings, statistics: Mapping[str, Any]) -> dict[str, Any]:
    """The corpus as the card describes it: Hub id or local paths, documents and the files that describe it."""
    sources = run.corpus
    hub_id = sources[0] if len(sources) == 1 and card.is_hub_id(sources[0]) else None
    name = hub_id or ", ".join(map(_corpus_name, sources)) or card.NOT_RECORDED
    documents, tokens = (_corpus_total(statistics, key) for key in ("documents", "document_tokens"))
    return {
        "hub_id": hub_id,
        "name": name,
        "given": " and ".join(f"`{_shown_path(s)}`" for s in sources) or card.NOT_RECORDED,
        "documents": "number of documents not recorded" if documents is None else card.plural(documents, "document"),
        "tokens": card.count(tokens),
        "documentation": " and ".join(f"`{d}`" for d in _corpus_documentation(sources)) if not hub_id else "",
        "slug": re.sub(r"[^\w.-]+", "-", name).strip("-") or "corpus",
        "config": run.hub_config if hub_id else None,
        "split": run.split if hub_id else None,
        "document_boundary": run.document_boundary,
        "licence": card.licence_of(hub_id),
        "wiki": "wiki" in name.lower(),
    }


def _data_rows(statistics: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per phase and for the held-out slice."""
    rows = []
    for key, label in (("phase1", "phase 1"), ("phase2", "phase 2"), ("held_out", "held-out")):
        stats = statistics.get(key)
        if not stats:
            continue
        split = stats.get("masked_split") or {}
        shares = [card.share(split.get(k)) for k in ("mask", "random", "unchanged")]
        masking = " / ".join(shares) if split else card.NOT_RECORDED
        rows.append(
            {
                "name": label,
                "max_seq_length": card.count(stats.get("max_seq_length")) if key != "held_out" else "as phase 1",
                "documents": card.count(stats.get("documents")),
                "sentences": card.count(stats.get("sentences")),
                "examples": card.count(stats.get("examples")),
                "tokens": card.count(stats.get("tokens")),
                "is_next": card.share(stats.get("is_next_share")),
                "masked": card.share(stats.get("masked_share")),
                "masking": masking,
            }
        )
    return rows


def _tokens_seen(statistics: Mapping[str, Any], recipe: PreTrainingRecipe, results: Mapping[str, Any]) -> int | None:
    """Tokens the run trained on: each phase's steps x global batch x its mean example length."""
    steps, batch = results.get("global_step"), recipe.optimization.global_batch_size
    if not card.is_number(steps):
        return None
    fraction = recipe.phase_flags().phase2_fraction
    second = max(1, round(steps * fraction)) if "phase2" in statistics and fraction > 0 else 0
    total = 0.0
    for key, n in (("phase1", steps - second), ("phase2", second)):
        stats = statistics.get(key) or {}
        if n and not stats.get("examples"):
            return None
        if n:
            total += stats["tokens"] / stats["examples"] * n * batch
    return int(total)


def _pretraining_eval(
    results: Mapping[str, Any], corpus: dict[str, Any]
) -> tuple[list[EvalResult], list[dict[str, str]]]:
    """model-index entries and table rows for MLM and NSP accuracy on the held-out documents."""
    dataset = corpus["hub_id"] or corpus["slug"]
    papers = {
        "mlm_accuracy": "not reported in the paper",
        "nsp_accuracy": f"{PAPER_NSP_ACCURACY} (final models, paper section 3.1)",
    }
    eval_results, rows = [], []
    for key, paper in papers.items():
        value = results.get(f"eval_{key}")
        if card.is_number(value):
            eval_results.append(card.held_out_result(key, value, dataset, corpus["name"], config=corpus["config"]))
        rows.append({"metric": card.HELD_OUT_TASKS[key][2], "ours": card.score(percent(key, value)), "paper": paper})
    for key, label in (("mlm_loss", "MLM loss"), ("nsp_loss", "NSP loss")):
        value = results.get(f"eval_{key}")
        ours = f"{value:.4f}" if card.is_number(value) else card.NOT_RECORDED
        rows.append({"metric": label, "ours": ours, "paper": "not reported in the paper"})
    return eval_results, rows


def _last_loss(out: Path) -> str | None:
    """The training loss logged last (log_history.json), beside results.json's mean over the whole run."""
    history = card.read_json(out / "log_history.json")
    entries = history if isinstance(history, list) else []
    losses = [e for e in entries if isinstance(e, dict) and card.is_number(e.get("loss"))]
    return f"{losses[-1]['loss']:.4f} at step {card.count(losses[-1].get('step'))}" if losses else None


def _benchmark(benchmark_dir: str | Path | None) -> dict[str, Any] | None:
    """The rows of a `bert_repro.training.studies.reproduce` report, for the pre-trained card."""
    if benchmark_dir is None:
        return None
    report = card.read_json(Path(benchmark_dir) / "report.json")
    if report is None:
        raise card.CardError(f"{benchmark_dir} holds no report.json (written by recipes/reproduce.py).")
    rows = [
        {  # a name the registry does not know (a report of another version) is shown as written
            "task": TASKS[r["task"]].display_name if r["task"] in TASKS else r["task"],
            "metric": METRICS[r["metric"]].label if r["metric"] in METRICS else r["metric"],
            "ours": card.score(r.get("ours")),
            "paper": f"{r['paper']:.1f}" if card.is_number(r.get("paper")) else "not reported",
            "paper_split": card.SPLIT_NAMES.get(r.get("paper_split") or "", "–"),
            "majority": card.score(r.get("majority"), "–"),
            "one_label": r.get("one_label"),
        }
        for r in report.get("tasks", [])
    ]
    return {
        "rows": rows,
        "paper_model": str(report.get("paper_model", "base")).upper(),
        "glue_average": card.score(report.get("glue_average")),
        "paper_glue_average": card.score(report.get("paper_glue_average")),
    }


def _masking_recipe(data: PreTrainingDataConfig) -> str:
    """How examples were masked, from the recorded flags (paper: 15%; 80% [MASK], 10% random, 10% kept)."""
    prob, mask, rand = data.masked_lm_prob, data.mask_replace_prob, data.random_replace_prob
    kept = max(0.0, 1 - mask - rand)
    return (
        f"{100 * prob:g}% of the tokens chosen for prediction (at most "
        f"{card.plain(data.max_predictions_per_seq)} per example), of which {100 * mask:g}% become "
        f"[MASK], {100 * rand:g}% a random token and {100 * kept:.3g}% stay"
    )


def _pretraining_facts(
    recipe: PreTrainingRecipe, results: Mapping[str, Any], statistics: Mapping[str, Any]
) -> dict[str, Any]:
    """What the training-procedure section says, each value ready to print."""
    run, data, training = recipe.data, recipe.examples, recipe.training
    steps = results.get("global_step")
    batch = recipe.optimization.global_batch_size
    sequences = steps * batch if card.is_number(steps) else None
    phase2 = recipe.phases[1] if len(recipe.phases) > 1 else None
    runtime, loss = results.get("train_runtime_s"), results.get("train_loss")
    processes = results.get("processes")
    casing = "uncased (lower-cased, accents stripped)" if run.lowercase else "cased"
    return {
        "steps": card.count(steps),
        "global_batch_size": card.count(batch),
        "sequences": card.count(sequences),
        "tokens_seen": card.count(_tokens_seen(statistics, recipe, results)),
        "paper_share": (f"{100 * sequences / (PAPER_STEPS * PAPER_BATCH):.3g}%" if sequences else card.NOT_RECORDED),
        "phase2": (
            f"the last {100 * phase2.fraction:g}% of the steps at {phase2.max_seq_length} tokens" if phase2 else None
        ),
        "max_seq_length": data.max_seq_length,
        "optimizer": recipe.optimization.optimizer,
        "learning_rate": card.plain(training.learning_rate),
        "warmup": card.warmup(training.warmup_steps),
        "schedule": str(getattr(training.lr_scheduler_type, "value", training.lr_scheduler_type)),
        "weight_decay": card.plain(training.weight_decay),
        "precision": "bf16" if training.bf16 else "fp16" if training.fp16 else "fp32",
        "processes": (
            f"{processes:,} process" + ("" if processes == 1 else "es")
            if card.is_number(processes)
            else "number of processes not recorded"
        ),
        "accumulation": card.count(results.get("gradient_accumulation_steps")),
        "runtime": card.duration(runtime),
        "timed_from_step": (
            card.count(results["train_runtime_from_step"]) if results.get("train_runtime_from_step") else None
        ),
        "tokens_per_second": card.count(results.get("tokens_per_second")),
        "hardware": results.get("hardware") or card.NOT_RECORDED,
        "train_loss": f"{loss:.4f}" if card.is_number(loss) else card.NOT_RECORDED,
        "recipe": _masking_recipe(data),
        "masking": "static (masks stored in the data, as the paper)"
        if data.static_masking
        else "dynamic (fresh masks per batch, as RoBERTa)",
        "whole_word_mask": data.do_whole_word_mask,
        "casing": casing,
        "uncased": run.lowercase,
        "vocab_trained": not run.tokenizer,
        "tokenizer": card.public_name(run.tokenizer) if run.tokenizer else None,
        "eval_fraction": card.share(run.eval_fraction) if run.eval_fraction else None,
    }


def _phase_rows(recipe: PreTrainingRecipe) -> dict[str, str]:
    return {
        f"phase {i + 1}": f"{p.max_seq_length} tokens, at most {p.max_predictions_per_seq} masked positions, "
        f"{100 * p.fraction:g}% of the steps"
        for i, p in enumerate(recipe.phases)
    }


def _setting_notes(
    record: Mapping[str, Any], config: Mapping[str, Any], results: Mapping[str, Any]
) -> tuple[Mapping[str, Any], dict[str, dict[str, str]]]:
    """run_config.json for the hyper-parameter tables, with a note on each setting the run did not use as recorded."""
    run, training = record.get("data") or {}, record.get("training") or {}
    # run_config.json is written before the run derives the accumulation from global_batch_size.
    accumulation = results.get("gradient_accumulation_steps")
    notes: dict[str, dict[str, str]] = {}
    if card.is_number(accumulation) and accumulation != training.get("gradient_accumulation_steps"):
        notes["training"] = {
            "gradient_accumulation_steps": f"the run used {accumulation}, derived from global_batch_size"
        }
    # --tokenizer overrides vocab_size, and a trained vocabulary can come out smaller: show the model's own size.
    if card.is_number(config.get("vocab_size")) and run.get("vocab_size") != config["vocab_size"]:
        record = {**record, "data": {**run, "vocab_size": config["vocab_size"]}}
        notes["data"] = {"vocab_size": f"the model's, from config.json; the run's setting was {run.get('vocab_size')}"}
    return record, notes


def card_for_pretraining(
    output_dir: str | Path,
    repo_id: str,
    *,
    base_model: str | None = None,
    benchmark_dir: str | Path | None = None,
    study_dir: str | Path | None = None,
    template_dir: str | Path | None = None,
) -> ModelCard:
    """The card of a pre-training run's output directory (`recipes/pretrain.py`), to publish as ``repo_id``.

    ``base_model`` defaults to `init_from` when that is a Hub id. ``benchmark_dir`` (`recipes/reproduce.py`) adds its
    report; ``study_dir`` (`recipes/study.py`: this checkpoint against random initialisation) its table and
    model-index entries. ``template_dir``: other templates than the package's.
    """
    out = Path(output_dir)
    record = card.read_json(out / "run_config.json")
    config = card.read_json(out / "config.json")
    if record is None or config is None:
        raise card.CardError(f"{out} is not a pre-training output directory (needs run_config.json, config.json).")
    statistics = card.read_json(out / "data_statistics.json") or {}
    results = card.read_json(out / "results.json") or {}
    recipe = PreTrainingRecipe.from_dict(record)
    if base_model is None and card.is_hub_id(recipe.model.init_from):
        base_model = recipe.model.init_from
    corpus = _corpus(recipe.data, statistics)
    eval_results, eval_rows = _pretraining_eval(results, corpus)
    study_results, study = _study(study_dir, out, results.get("global_step"))
    parameters = card.stored_parameter_count(out) or card.parameter_count(config)
    card_data = card.metadata(
        repo_id=repo_id,
        pipeline_tag="fill-mask",
        datasets=[corpus["hub_id"]] if corpus["hub_id"] else None,
        eval_results=eval_results + study_results,
        base_model=base_model,
    )
    record, notes = _setting_notes(record, config, results)
    held_out = statistics.get("held_out") or {}
    context = {
        "architecture": card.architecture_rows(config, parameters),
        "corpus": corpus,
        "data_rows": _data_rows(statistics),
        "length_histogram": (statistics.get("phase1") or {}).get("length_histogram") or {},
        "facts": {**_pretraining_facts(recipe, results, statistics), "last_loss": _last_loss(out)},
        "hyperparameters": card.hyperparameter_sections(
            {**record, "phases": _phase_rows(recipe)},
            {
                "data": "Corpus, vocabulary and held-out split",
                "examples": "Pre-training examples (the reference create_pretraining_data.py flags)",
                "phases": "Phases",
                "model": "Model",
                "optimization": "Batch and optimizer",
                "training": "Trainer (transformers TrainingArguments)",
            },
            notes,
        ),
        "eval_rows": eval_rows,
        "held_out_examples": card.count(held_out.get("examples")),
        "held_out_documents": card.count(held_out.get("documents")),
        "benchmark": _benchmark(benchmark_dir),
        "study": study,
        "curves": (out / "training_curves.png").is_file(),
        "versions": card.framework_lines(results.get("versions"), config.get("transformers_version")),
        "usage": card.usage(repo_id, config=config),
        "base_model": base_model,
        "base_licence": card.licence_of(base_model),
    }
    return card.render_card("pretrained.md", card_data, context, template_dir)
