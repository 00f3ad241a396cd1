"""The card of a pre-trained checkpoint (`recipes/pretrain.py`'s output directory): `PreTrainedFacts`, rendered with
`pretrained.md`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from huggingface_hub import EvalResult, ModelCardData

from ..data.travel_corpus import CORPUS_FILE, MANIFEST_FILE
from ..training.pretraining.recipe import PreTrainingRecipe
from . import card_base as base
from .numbers import NOT_RECORDED, count, is_number, plural
from .secrets import CardError, is_hub_id, last_component
from .study_comparison import StudyComparison

# The paper's pre-training scale (section 3.1 and appendix A.2), to put a run's in perspective.
PAPER_STEPS, PAPER_BATCH = 1_000_000, 256


def _shown_path(path: str) -> str:
    """A corpus path as given when relative to the run's directory, else by its last component (nothing private)."""
    parts = Path(path).parts
    return last_component(path) if Path(path).is_absolute() or path.startswith("~") or ".." in parts else path


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
    return last_component(str(Path(source).parent) if Path(source).name == CORPUS_FILE else source)


def _corpus_total(statistics: Mapping[str, Any], key: str) -> int | None:
    """A count of the whole corpus: the training documents' plus the held-out ones' (None: not recorded)."""
    counts = [(statistics.get(k) or {}).get(key) for k in ("phase1", "held_out")]
    return sum(n for n in counts if is_number(n)) if is_number(counts[0]) else None


def _tokens_seen(statistics: Mapping[str, Any], recipe: PreTrainingRecipe, results: Mapping[str, Any]) -> int | None:
    """Tokens the run trained on: each phase's steps x global batch x its mean example length."""
    steps, batch = results.get("global_step"), recipe.optimization.global_batch_size
    if not is_number(steps):
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


def _last_loss(out: Path) -> str | None:
    """The training loss logged last (log_history.json), beside results.json's mean over the whole run."""
    history = base.read_json(out / "log_history.json")
    entries = history if isinstance(history, list) else []
    losses = [e for e in entries if isinstance(e, dict) and is_number(e.get("loss"))]
    return f"{losses[-1]['loss']:.4f} at step {count(losses[-1].get('step'))}" if losses else None


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
    if is_number(accumulation) and accumulation != training.get("gradient_accumulation_steps"):
        notes["training"] = {
            "gradient_accumulation_steps": f"the run used {accumulation}, derived from global_batch_size"
        }
    # --tokenizer overrides vocab_size, and a trained vocabulary can come out smaller: show the model's own size.
    if is_number(config.get("vocab_size")) and run.get("vocab_size") != config["vocab_size"]:
        record = {**record, "data": {**run, "vocab_size": config["vocab_size"]}}
        notes["data"] = {"vocab_size": f"the model's, from config.json; the run's setting was {run.get('vocab_size')}"}
    return record, notes


@dataclass
class PreTrainedFacts(base.CardFacts):
    """What the card of a pre-trained checkpoint states. The template reads the run's settings from ``recipe`` and
    its measurements from ``results`` (results.json) and ``statistics`` (data_statistics.json); the other fields are
    what the card derives from them."""

    template: ClassVar[str] = "pretrained.md"
    repo_id: str
    recipe: PreTrainingRecipe
    results: dict[str, Any]
    statistics: dict[str, Any]
    base_model: str | None  # the checkpoint pre-training continued from, a Hub id
    architecture: list[tuple[str, str]]
    corpus_hub_id: str | None
    corpus_name: str
    corpus_given: str  # the paths of --corpus, as given
    corpus_documents: str
    corpus_tokens: int | None
    corpus_documentation: str  # the local corpus's README or manifest
    eval_results: list[EvalResult]
    sequences: int | None  # sequences trained on
    tokens_seen: int | None
    paper_share: str  # of the paper's pre-training sequences
    last_loss: str | None
    hyperparameters: list[tuple[str, list[tuple[str, str]]]]
    benchmark: dict[str, Any] | None  # report.json of recipes/reproduce.py
    study: StudyComparison | None
    curves: bool
    versions: list[str]
    usage: base.Usage

    @classmethod
    def from_run(
        cls,
        output_dir: str | Path,
        repo_id: str,
        *,
        base_model: str | None = None,
        benchmark_dir: str | Path | None = None,
        study_dir: str | Path | None = None,
    ) -> PreTrainedFacts:
        """The facts of a pre-training run's output directory, to publish as ``repo_id``. ``base_model`` defaults to
        `init_from` when that is a Hub id. ``benchmark_dir`` (`recipes/reproduce.py`) adds its report; ``study_dir``
        (`recipes/study.py`: this checkpoint against random initialisation) its table and model-index entries."""
        out = Path(output_dir)
        record, config = base.read_json(out / "run_config.json"), base.read_json(out / "config.json")
        if record is None or config is None:
            raise CardError(f"{out} is not a pre-training output directory (needs run_config.json, config.json).")
        statistics = base.read_json(out / "data_statistics.json") or {}
        results = base.read_json(out / "results.json") or {}
        recipe = PreTrainingRecipe.from_dict(record)
        sources = recipe.data.corpus
        hub_id = sources[0] if len(sources) == 1 and is_hub_id(sources[0]) else None
        name = hub_id or ", ".join(map(_corpus_name, sources)) or NOT_RECORDED
        slug = re.sub(r"[^\w.-]+", "-", name).strip("-") or "corpus"
        config_name = recipe.data.hub_config if hub_id else None
        steps = results.get("global_step")
        sequences = steps * recipe.optimization.global_batch_size if is_number(steps) else None
        report = None
        if benchmark_dir is not None:
            report = base.read_json(Path(benchmark_dir) / "report.json")
            if report is None:
                raise CardError(f"{benchmark_dir} holds no report.json (written by recipes/reproduce.py).")
        record, notes = _setting_notes(record, config, results)
        documents = _corpus_total(statistics, "documents")
        return cls(
            repo_id=repo_id,
            recipe=recipe,
            results=results,
            statistics=statistics,
            base_model=base_model or (recipe.model.init_from if is_hub_id(recipe.model.init_from) else None),
            architecture=base.architecture_rows(out, config),
            corpus_hub_id=hub_id,
            corpus_name=name,
            corpus_given=" and ".join(f"`{_shown_path(s)}`" for s in sources) or NOT_RECORDED,
            corpus_documents="number of documents not recorded" if documents is None else plural(documents, "document"),
            corpus_tokens=_corpus_total(statistics, "document_tokens"),
            corpus_documentation="" if hub_id else " and ".join(f"`{d}`" for d in _corpus_documentation(sources)),
            eval_results=base.held_out_results(results, hub_id or slug, name, config=config_name),
            sequences=sequences,
            tokens_seen=_tokens_seen(statistics, recipe, results),
            paper_share=f"{100 * sequences / (PAPER_STEPS * PAPER_BATCH):.3g}%" if sequences else NOT_RECORDED,
            last_loss=_last_loss(out),
            hyperparameters=base.hyperparameter_sections(
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
            benchmark=report,
            study=StudyComparison.from_dir(study_dir, out, steps) if study_dir is not None else None,
            curves=(out / "training_curves.png").is_file(),
            versions=base.framework_lines(results.get("versions"), config.get("transformers_version")),
            usage=base.Usage.of(repo_id, config=config),
        )

    def card_data(self) -> ModelCardData:
        return base.metadata(
            repo_id=self.repo_id,
            pipeline_tag="fill-mask",
            datasets=[self.corpus_hub_id] if self.corpus_hub_id else None,
            eval_results=self.eval_results + (self.study.eval_results if self.study else []),
            base_model=self.base_model,
        )
