"""Model cards for what the recipes write: a pre-trained checkpoint or a fine-tuned one, ready for the Hub.

The card of a run is built from the files the run left in its output directory, never from memory or the
environment:

- pre-training (`bert_repro.training.pretrain`): `run_config.json` (every setting), `data_statistics.json`,
  `results.json`, `config.json`, and `training_curves.png` when present;
- fine-tuning (`bert_repro.training.finetune`): `results.json` (the grid, every run, the best one), `run_config.json`
  and the best model's `model/config.json`;
- optionally, for a pre-trained checkpoint, a benchmark directory of `bert_repro.training.reproduce` (`report.json`)
  and a study directory of `bert_repro.training.study` (`study.json`: the checkpoint fine-tuned against the same
  architecture randomly initialised).

Metadata go through huggingface_hub's `ModelCardData` / `EvalResult`, which write the `model-index` block the
Hub reads. The body is a Jinja template in `bert_repro/hub/model_cards/` (`pretrained.md`, `finetuned.md` and the
`_*.md` parts they include). Templates are rendered with our own Jinja environment rather than
`ModelCard.from_template`, for two reasons: the two cards share parts (`{% include %}` needs a loader, which
`from_template` does not give), and a misspelt variable must fail (`StrictUndefined`) instead of leaving a
blank. The contract is the one of `from_template`: the template receives `card_data` (the YAML block) and the
metadata fields, and the result is parsed by `ModelCard`.

Conventions of the cards:
- every score is in percent (our task metrics are fractions except SQuAD's, which are percent already, as in
  `bert_repro.training.reproduce.percent`), the paper's numbers as printed;
- GLUE numbers of the paper are TEST-server scores, ours are dev scores: the cards say so beside the table;
- a value the run did not record is written "not recorded", never "None";
- nothing from the environment goes in: settings that name where outputs, logs or trackers went are left out,
  local paths are reduced to their last component (the corpus's relative paths excepted: they name it as the run
  was given it), token-like fields are dropped, and a card that still contains the value of a secret environment
  variable is refused. Two looks outside the run's files: whether the corpus's folder holds a README.md or
  a manifest, which the card then names, and the framework versions installed now, for those the run did not
  record (labelled so).

`python -m bert_repro.hub.model_card RUN_DIR REPO_ID` writes the card as `README.md` beside the weights, where
`python -m bert_repro.hub` publishes it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import json
import math
import os
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..atomic import write_text
from ..data.travel_corpus import CORPUS_FILE, MANIFEST_FILE
from ..model.checkpoint_format import native_obstacles
from ..model.configuration_bert_repro import PRESETS
from ..model.conversion import weight_files
from ..model.modeling_bert_repro import AUTO_MAP
from ..tasks.kinds import TaskKind, kind_named
from ..tasks.registry import METRICS, TASKS, Result, Task, get_task
from ..versions import FRAMEWORKS, installed_version

TEMPLATE_PACKAGE_DIR = "model_cards"  # inside bert_repro.hub, so it ships in the wheel
NOT_RECORDED = "not recorded"
LICENSE = "apache-2.0"

# A task's display name and its metrics' labels and Hub ids come from the registry (`Task.display_name`,
# `METRICS`); its pipeline tag, Auto class, head description and usage example from its kind
# (`bert_repro.tasks.kinds`).
# Metric ids the Hub knows (hf.co/metrics), for the `metrics` field.
HUB_METRICS = {"accuracy", "f1", "exact_match", "matthews_correlation", "pearsonr", "spearmanr", "precision", "recall"}
TASK_TYPE_NAMES = {
    "fill-mask": "Fill-Mask",
    "text-classification": "Text Classification",
    "question-answering": "Question Answering",
    "multiple-choice": "Multiple Choice",
    "token-classification": "Token Classification",
}
SPLIT_NAMES = {
    "validation": "dev",
    "validation_matched": "dev matched",
    "validation_mismatched": "dev mismatched",
    "test": "test",
    "test_matched": "test matched",
    "test_mismatched": "test mismatched",
}
PRESET_NAMES = {
    "tiny": "BERT-Tiny",
    "mini": "BERT-Mini",
    "small": "BERT-Small",
    "medium": "BERT-Medium",
    "base": "BERT-BASE",
    "large": "BERT-LARGE",
}
# Licences of data sets and checkpoints the recipes commonly use, as their Hub pages state them.
KNOWN_LICENCES = {
    "wikimedia/wikipedia": "CC BY-SA 3.0 and GFDL",
    "Salesforce/wikitext": "CC BY-SA 3.0 and GFDL",
    "rajpurkar/squad": "CC BY-SA 4.0",
    "rajpurkar/squad_v2": "CC BY-SA 4.0",
}
# The paper's pre-training scale (section 3.1 and appendix A.2), to put a run's in perspective.
PAPER_STEPS, PAPER_BATCH = 1_000_000, 256
# Paper, footnote to section 3.1: "The final model achieves 97%-98% accuracy on NSP."
PAPER_NSP_ACCURACY = "97–98"

# Settings that say where outputs, logs and trackers went, or hold credentials: not hyper-parameters, and
# possibly private. Matched by exact name or by prefix / suffix.
_DROPPED_KEYS = {"output_dir", "logging_dir", "run_name", "project", "local_rank", "resume_from_checkpoint"}
_DROPPED_PREFIXES = ("hub_", "push_to_hub", "trackio_", "logging_")
_DROPPED_SUFFIXES = ("_token", "_api_key", "_secret", "_password")
# Settings that name files or directories (local paths are reduced to their last component).
_PATH_KEYS = {"corpus", "tokenizer", "init_from", "model", "data", "deepspeed", "fsdp_config"}
SECRET_ENV_VARS = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_API_TOKEN",
    "WANDB_API_KEY",
    "COMET_API_KEY",
    "NEPTUNE_API_TOKEN",
    "OPENAI_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "GITHUB_TOKEN",
)
_TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_FILE_SUFFIXES = (".txt", ".text", ".md", ".json", ".jsonl", ".parquet", ".csv", ".tsv", ".yaml", ".yml")

BIBTEX = """@inproceedings{devlin-etal-2019-bert,
    title = "{BERT}: Pre-training of Deep Bidirectional Transformers for Language Understanding",
    author = "Devlin, Jacob and Chang, Ming-Wei and Lee, Kenton and Toutanova, Kristina",
    booktitle = "Proceedings of the 2019 Conference of the North {A}merican Chapter of the Association for \
Computational Linguistics: Human Language Technologies, Volume 1 (Long and Short Papers)",
    month = jun,
    year = "2019",
    address = "Minneapolis, Minnesota",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/N19-1423",
    doi = "10.18653/v1/N19-1423",
    pages = "4171--4186"
}"""


class CardError(ValueError):
    """A directory that holds no run a card can be made of, or a card that would leak a secret."""


# ------------------------------------------------------------------------------------------------------------
# Small helpers: files, numbers, names
# ------------------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _plain(value: Any) -> str:
    """A setting in prose: whole floats without ".0", None as "not recorded"."""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return NOT_RECORDED if value is None else format_setting(value)


def _warmup(value: Any) -> str:
    """transformers 5.x `warmup_steps`: a float below 1 is a share of the steps."""
    if _is_number(value) and 0 < value < 1:
        return f"{100 * value:g}% of the steps"
    return f"{_plain(value)} steps"


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _percent(metric: str, value: float) -> float:
    """A score in percent: our metrics are fractions except SQuAD's (as `bert_repro.training.reproduce.percent`)."""
    return round(value if metric.startswith("squad") else 100 * value, 2)


def _score(value: Any) -> str:
    return f"{value:.2f}" if _is_number(value) else NOT_RECORDED


def _count(value: Any) -> str:
    return f"{value:,}" if _is_number(value) else NOT_RECORDED


def _share(value: Any) -> str:
    return f"{100 * value:.1f}%" if _is_number(value) else NOT_RECORDED


def is_hub_id(value: Any) -> bool:
    """Whether ``value`` names a Hub repository ("owner/name") rather than a local file or directory."""
    if not isinstance(value, str) or value.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(value):
        return False
    return not value.lower().endswith(_FILE_SUFFIXES) and not Path(value).exists()


def public_name(value: str) -> str:
    """A source as a card may name it: a Hub id as it is, a local path by its last component only."""
    if is_hub_id(value):
        return value
    return f"{_last_component(value)} (local)"


def _last_component(path: str) -> str:
    return Path(str(path).rstrip("/\\")).name or str(path)


def repo_name(repo_id: str) -> str:
    return repo_id.rstrip("/").split("/")[-1]


def preset_of(config: Mapping[str, Any]) -> str | None:
    """The preset whose L, H, A and FFN sizes ``config`` has, or None for a custom size."""
    for name, sizes in PRESETS.items():
        if all(config.get(key) == value for key, value in sizes.items()):
            return name
    return None


def framework_lines(recorded: Mapping[str, Any] | None, saved_with: str | None = None) -> list[str]:
    """The "Framework versions" lines of a card: those the run recorded (results.json's `versions`), else
    transformers' from config.json (``saved_with``, written when the model was saved) and the others installed now,
    labelled as such: the card may be made long after the run, elsewhere."""
    lines = []
    for name, package in FRAMEWORKS.items():
        if recorded:
            lines.append(f"{name} {recorded.get(package) or NOT_RECORDED}")
        elif package == "transformers" and saved_with:
            lines.append(f"{name} {saved_with} (config.json: the version that saved the model)")
        else:
            now = installed_version(package) or "not installed"
            lines.append(f"{name} {now} (installed when this card was made; the run did not record it)")
    return lines


# ------------------------------------------------------------------------------------------------------------
# Architecture and parameters
# ------------------------------------------------------------------------------------------------------------


def _encoder_parameters(config: Mapping[str, Any], pooler: bool) -> int:
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    positions, segments = config.get("max_position_embeddings", 512), config.get("type_vocab_size", 2)
    embeddings = (v + positions + segments) * h + 2 * h  # + LayerNorm
    layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    return embeddings + config["num_hidden_layers"] * layer + (h * h + h if pooler else 0)


def parameter_count(config: Mapping[str, Any], head: str | TaskKind = "pretraining") -> int:
    """Parameters of a model with ``head`` ("pretraining", or a task kind or its name), as transformers counts
    them (the MLM decoder weight is tied to the token embeddings and counted once)."""
    h = config["hidden_size"]
    labels = len(config.get("id2label") or {}) or 2
    if head == "pretraining":  # MLM transform + LayerNorm + output bias, NSP
        mlm = (h * h + h) + 2 * h + config["vocab_size"]
        return _encoder_parameters(config, True) + mlm + (2 * h + 2)
    try:
        kind = kind_named(head)
    except KeyError:
        raise ValueError(f"Unknown head {head!r}.") from None
    return _encoder_parameters(config, kind.uses_pooler) + kind.head_parameters(h, labels)


def safetensors_parameter_count(path: Path) -> int | None:
    """Parameters stored in a safetensors file, from its header alone (no tensor is read)."""
    if not path.is_file():
        return None
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def stored_parameter_count(directory: Path) -> int | None:
    """Parameters of the model saved in ``directory``: `model.safetensors` or all the shards its index names."""
    files = weight_files(directory) if directory.is_dir() else []
    return sum(safetensors_parameter_count(f) or 0 for f in files) or None


def architecture_rows(config: Mapping[str, Any], parameters: int | None) -> list[tuple[str, str]]:
    preset = preset_of(config)
    preset_text = f"`{preset}` ({PRESET_NAMES[preset]} size)" if preset else "custom size (no preset)"
    return [
        ("Preset", preset_text),
        ("Layers (L)", _count(config.get("num_hidden_layers"))),
        ("Hidden size (H)", _count(config.get("hidden_size"))),
        ("Attention heads (A)", _count(config.get("num_attention_heads"))),
        ("Feed-forward size", _count(config.get("intermediate_size"))),
        ("Vocabulary", _count(config.get("vocab_size"))),
        ("Positions", _count(config.get("max_position_embeddings"))),
        ("Activation", str(config.get("hidden_act", NOT_RECORDED))),
        ("Parameters", _count(parameters)),
    ]


# ------------------------------------------------------------------------------------------------------------
# Hyper-parameters: every recorded setting, with nothing private
# ------------------------------------------------------------------------------------------------------------


def _dropped(key: str) -> bool:
    return key in _DROPPED_KEYS or key.startswith(_DROPPED_PREFIXES) or key.endswith(_DROPPED_SUFFIXES)


def _public_value(key: str, value: Any) -> Any:
    if key in _PATH_KEYS and isinstance(value, str):
        return public_name(value)
    if key in _PATH_KEYS and isinstance(value, list):
        return [public_name(v) if isinstance(v, str) else v for v in value]
    if isinstance(value, str) and (value.startswith(("/", "~")) or re.match(r"[A-Za-z]:\\", value)):
        return public_name(value)  # an absolute path under any name
    return value


def format_setting(value: Any) -> str:
    """One recorded setting as the card shows it (JSON spelling: true/false, lists and mappings as JSON)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def setting_rows(section: Mapping[str, Any], notes: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(name, value) of every setting of a run_config.json section, private ones left out."""
    notes = notes or {}
    rows = []
    for key, value in section.items():
        if _dropped(key):
            continue
        shown = format_setting(_public_value(key, value))
        rows.append((key, f"{shown} ({notes[key]})" if key in notes else shown))
    return rows


# ------------------------------------------------------------------------------------------------------------
# Secrets
# ------------------------------------------------------------------------------------------------------------


def check_no_secrets(text: str) -> None:
    """Refuse a card that contains an access token or the value of a secret environment variable."""
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name, "")
        if len(value) >= 8 and value in text:
            raise CardError(f"The card contains the value of ${name}; it is not written.")
    if _TOKEN_PATTERN.search(text):
        raise CardError("The card contains what looks like a Hugging Face access token; it is not written.")


# ------------------------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    """A Markdown table cell: pipes escaped, line breaks removed."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _finalize(value: Any) -> Any:
    return NOT_RECORDED if value is None else value


def template_environment(template_dir: str | Path | None = None) -> jinja2.Environment:
    """The Jinja environment of the cards: templates from ``template_dir`` or the package's; strict."""
    if template_dir is None:
        loader: jinja2.BaseLoader = jinja2.FunctionLoader(_package_template)
    else:
        loader = jinja2.FileSystemLoader(str(template_dir))
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
    )
    env.filters["cell"] = _cell
    return env


def _package_template(name: str) -> str | None:
    resource = importlib.resources.files("bert_repro.hub").joinpath(TEMPLATE_PACKAGE_DIR, name)
    return resource.read_text(encoding="utf-8") if resource.is_file() else None


def render_card(
    template: str, card_data: ModelCardData, context: Mapping[str, Any], template_dir: str | Path | None = None
) -> ModelCard:
    """``template`` rendered with the metadata block and ``context``, parsed as a `ModelCard`."""
    env = template_environment(template_dir)
    # The variables ModelCard.from_template gives a template, plus ours.
    variables = {**card_data.to_dict(), **context, "card_data": card_data.to_yaml()}
    content = env.get_template(template).render(**variables)
    content = re.sub(r"\n{3,}", "\n\n", content)  # blank lines left by skipped blocks
    check_no_secrets(content)
    return ModelCard(content)


def _card_data(
    *,
    repo_id: str,
    pipeline_tag: str,
    tags: list[str],
    datasets: list[str],
    eval_results: list[EvalResult],
    base_model: str | None,
    metrics: list[str] | None = None,
) -> ModelCardData:
    return ModelCardData(
        language="en",
        license=LICENSE,
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=tags,
        datasets=datasets or None,
        base_model=base_model,
        metrics=metrics or None,
        model_name=repo_name(repo_id),
        eval_results=eval_results or None,
    )


def _usage(repo_id: str, task: Task | None = None, *, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the "How to use" section needs: the Auto classes, and a pipeline with an example input
    (a pre-trained checkpoint when ``task`` is None, else the task's kind says), our class, and why the checkpoint
    needs remote code when transformers' own BERT cannot compute it (``config``: its config.json; see
    `checkpoint_format`)."""
    if task is None:
        auto, remote, pipeline_task = "AutoModelForPreTraining", "AutoModelForMaskedLM", "fill-mask"
        variable, call = "fill", 'fill("The capital of France is [MASK].")'
    else:
        auto = remote = task.kind.auto_class
        pipeline_task = task.kind.pipeline_task
        variable, call = task.kind.pipeline_example(task)
    return {
        "repo_id": repo_id,
        "auto_class": auto,
        "remote_auto_class": remote,
        "pipeline_task": pipeline_task,
        "pipeline_variable": variable,
        "pipeline_call": call,
        "repro_class": AUTO_MAP[auto].split(".")[1],
        "remote_code_reason": "; ".join(native_obstacles(dict(config or {}))),
    }


def _task_result(task: Task, split: str, metric: str, value: float, name: str) -> EvalResult:
    """A model-index entry for a score (percent) of ``task`` on ``split``, named as the registry names it."""
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


def _licence_of(source: str | None) -> str | None:
    return KNOWN_LICENCES.get(source) if source else None


# ------------------------------------------------------------------------------------------------------------
# Pre-trained checkpoints
# ------------------------------------------------------------------------------------------------------------


def _shown_path(path: str) -> str:
    """A local corpus path as the card shows it: as recorded when relative to the run's working directory (it names
    the corpus as the run was given it), by its last component when absolute or outside that directory."""
    parts = Path(path).parts
    return _last_component(path) if Path(path).is_absolute() or path.startswith("~") or ".." in parts else path


def _corpus_documentation(sources: list[str]) -> list[str]:
    """The README.md or manifest (`bert_repro.data.travel_corpus`) in a local source's folder or the one above it,
    as the card shows them; only their presence is checked. The working directory and those above it are skipped:
    their README is the project's, not the corpus's."""
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
    return _last_component(str(Path(source).parent) if Path(source).name == CORPUS_FILE else source)


def _corpus_total(statistics: Mapping[str, Any], key: str) -> int | None:
    """A count of the whole corpus: the training documents' plus the held-out ones' (None: not recorded)."""
    counts = [(statistics.get(k) or {}).get(key) for k in ("phase1", "held_out")]
    return sum(n for n in counts if _is_number(n)) if _is_number(counts[0]) else None


def _corpus(run: Mapping[str, Any], statistics: Mapping[str, Any]) -> dict[str, Any]:
    """The pre-training corpus as the card describes it: Hub id (and config / split) or the local paths as given,
    with its documents (trained on and held out) and the files that describe its sources."""
    sources = run.get("corpus") or []
    hub_id = sources[0] if len(sources) == 1 and is_hub_id(sources[0]) else None
    name = hub_id or ", ".join(map(_corpus_name, sources)) or NOT_RECORDED
    documents, tokens = (_corpus_total(statistics, key) for key in ("documents", "document_tokens"))
    return {
        "hub_id": hub_id,
        "name": name,
        "given": " and ".join(f"`{_shown_path(s)}`" for s in sources) or NOT_RECORDED,
        "documents": _plural(documents, "document") if documents is not None else "number of documents not recorded",
        "tokens": _count(tokens),
        "documentation": " and ".join(f"`{d}`" for d in _corpus_documentation(sources)) if not hub_id else "",
        "slug": re.sub(r"[^\w.-]+", "-", name).strip("-") or "corpus",
        "config": run.get("hub_config") if hub_id else None,
        "split": run.get("split") if hub_id else None,
        "document_boundary": run.get("document_boundary"),
        "licence": _licence_of(hub_id),
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
        masking = " / ".join(_share(split.get(k)) for k in ("mask", "random", "unchanged")) if split else NOT_RECORDED
        rows.append(
            {
                "name": label,
                "max_seq_length": _count(stats.get("max_seq_length")) if key != "held_out" else "as phase 1",
                "documents": _count(stats.get("documents")),
                "sentences": _count(stats.get("sentences")),
                "examples": _count(stats.get("examples")),
                "tokens": _count(stats.get("tokens")),
                "is_next": _share(stats.get("is_next_share")),
                "masked": _share(stats.get("masked_share")),
                "masking": masking,
            }
        )
    return rows


def _tokens_seen(statistics: Mapping[str, Any], run: Mapping[str, Any], results: Mapping[str, Any]) -> int | None:
    """Tokens the run trained on: each phase's steps x global batch x its mean example length."""
    steps, batch = results.get("global_step"), run.get("global_batch_size")
    if not _is_number(steps) or not _is_number(batch):
        return None
    fraction = run.get("phase2_fraction") or 0.0
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
    dataset_type = corpus["hub_id"] or corpus["slug"]
    held_out = f"{corpus['name']}, held-out documents"
    entries = [
        ("mlm_accuracy", "fill-mask", "Masked language modelling", "MLM accuracy", "not reported in the paper"),
        (
            "nsp_accuracy",
            "text-classification",
            "Next sentence prediction",
            "NSP accuracy",
            f"{PAPER_NSP_ACCURACY} (final models, paper section 3.1)",
        ),
    ]
    eval_results, rows = [], []
    for key, task_type, task_name, label, paper in entries:
        value = results.get(f"eval_{key}")
        if _is_number(value):
            eval_results.append(
                EvalResult(
                    task_type=task_type,
                    task_name=task_name,
                    dataset_type=dataset_type,
                    dataset_name=held_out,
                    dataset_config=corpus["config"],
                    dataset_split="held-out",
                    metric_type="accuracy",
                    metric_value=_percent(key, value),
                    metric_name=f"{label} (%)",
                )
            )
        rows.append(
            {"metric": label, "ours": _score(_percent(key, value) if _is_number(value) else None), "paper": paper}
        )
    for key, label in (("mlm_loss", "MLM loss"), ("nsp_loss", "NSP loss")):
        value = results.get(f"eval_{key}")
        rows.append(
            {
                "metric": label,
                "ours": f"{value:.4f}" if _is_number(value) else NOT_RECORDED,
                "paper": "not reported in the paper",
            }
        )
    return eval_results, rows


def _last_loss(out: Path) -> str | None:
    """The training loss logged last (log_history.json), beside results.json's mean over the whole run."""
    history = _read_json(out / "log_history.json")
    losses = (
        [e for e in history if isinstance(e, dict) and _is_number(e.get("loss"))] if isinstance(history, list) else []
    )
    return f"{losses[-1]['loss']:.4f} at step {_count(losses[-1].get('step'))}" if losses else None


def _benchmark(benchmark_dir: str | Path | None) -> dict[str, Any] | None:
    """The rows of a `bert_repro.training.reproduce` report, for the pre-trained card."""
    if benchmark_dir is None:
        return None
    report = _read_json(Path(benchmark_dir) / "report.json")
    if report is None:
        raise CardError(f"{benchmark_dir} holds no report.json (written by recipes/reproduce.py).")
    rows = [
        {  # a name the registry does not know (a report of another version) is shown as written
            "task": TASKS[r["task"]].display_name if r["task"] in TASKS else r["task"],
            "metric": METRICS[r["metric"]].label if r["metric"] in METRICS else r["metric"],
            "ours": _score(r.get("ours")),
            "paper": f"{r['paper']:.1f}" if _is_number(r.get("paper")) else "not reported",
            "paper_split": SPLIT_NAMES.get(r.get("paper_split") or "", "–"),
            "majority": _score(r["majority"]) if _is_number(r.get("majority")) else "–",
            "one_label": r.get("one_label"),
        }
        for r in report.get("tasks", [])
    ]
    return {
        "rows": rows,
        "paper_model": str(report.get("paper_model", "base")).upper(),
        "glue_average": _score(report.get("glue_average")),
        "paper_glue_average": _score(report.get("paper_glue_average")),
    }


def _is_random_init(row: Mapping[str, Any]) -> bool:
    """A study row of weights drawn at random: `bert_repro.training.study` records their pre-training as 0 steps."""
    return (row.get("pretraining") or {}).get("global_step") == 0


def _study_row(rows: list[dict[str, Any]], out: Path, path: Path, steps: Any) -> dict[str, Any]:
    """This checkpoint's row of a study: the row whose model is ``out``, else the first row that was pre-trained
    (a study run elsewhere names its own paths); refused when its pre-training steps are not the checkpoint's."""
    row = next((r for r in rows if r.get("model") and Path(r["model"]).resolve() == out.resolve()), None)
    row = row or next((r for r in rows if not _is_random_init(r)), None)
    if row is None:
        raise CardError(f"{path} has no row of a pre-trained model, only randomly initialised ones.")
    theirs = (row.get("pretraining") or {}).get("global_step")
    if _is_number(steps) and _is_number(theirs) and theirs != steps:
        raise CardError(
            f"{path}: its row {row.get('variant')!r} was pre-trained for {theirs:,} steps, this checkpoint for "
            f"{steps:,}: not the same model."
        )
    return row


def _mean_cell(cell: Mapping[str, Any], seeds: int) -> str:
    """Mean ± standard error; a cell with fewer seeds than the study (failed runs) says how many it has."""
    ours, se, finished = cell.get("ours"), cell.get("se"), len(cell.get("seeds") or {})
    if not _is_number(ours):
        return "–"
    spread = f" ± {se:.2f}" if _is_number(se) else ""
    return f"{ours:.2f}{spread}" + (f" ({_plural(finished, 'seed')})" if finished and finished != seeds else "")


def _public_args(text: str) -> str:
    return " ".join(format_setting(_public_value("", a)) for a in str(text).split())


def _study_verdict(rows: list[dict[str, Any]]) -> str:
    """What the table shows, in one sentence: where pre-training beats random initialisation by more than twice the
    standard error of the difference, and where the majority class still does better."""
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
    """A study's fine-tuning columns for its `row` (a pre-trained model): model-index entries of its scores (named
    by `result_name(metric label, split name, seeds finished)`) and the table's rows beside the randomly
    initialised model's and the majority class's, with their difference and its standard error."""
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
        split_name = SPLIT_NAMES.get(split, split)
        if _is_number(ours):
            name = result_name(METRICS[metric].label, split_name, len(cell.get("seeds") or {}))
            eval_results.append(_task_result(task, split, metric, ours, name))
        both = _is_number(ours) and _is_number(theirs)
        errors = [e for e in (cell.get("se"), other.get("se")) if _is_number(e)]
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
                "majority": _score(majority),
                "below_majority": f"{majority:.2f} against {ours:.2f}"
                if _is_number(ours) and _is_number(majority) and ours <= majority
                else None,
            }
        )
    return eval_results, table


def _study(study_dir: str | Path | None, out: Path, steps: Any) -> tuple[list[EvalResult], dict[str, Any] | None]:
    """model-index entries (each fine-tuning column's mean over seeds) and table rows of a `bert_repro.training.study`
    run that fine-tuned this checkpoint beside the same architecture randomly initialised."""
    if study_dir is None:
        return [], None
    path = Path(study_dir) / "study.json"
    study = _read_json(path)
    if study is None:
        raise CardError(f"{path}: no such file; --study takes the output directory of recipes/study.py.")
    rows = study.get("rows") or []
    row = _study_row(rows, out, path, steps)
    seeds = len(study.get("seeds") or []) or 1
    random = next((r for r in rows if _is_random_init(r)), {})

    def result_name(label: str, split: str, finished: int) -> str:
        how = f"mean of {_plural(finished, 'seed')}" if finished else "best of the learning-rate grid"
        return f"{label} (%), fine-tuned, {how}"

    eval_results, table = fine_tuning_comparison(study, row, result_name)
    return eval_results, {
        "rows": table,
        "seeds": ", ".join(str(s) for s in study.get("seeds") or []) or None,  # None: the best run of each grid
        "n_seeds": _plural(seeds, "fine-tuning seed"),
        "finetune_args": _public_args(study.get("finetune_args") or "") or "the defaults",
        "finetune_args_for": [
            (TASKS[key].display_name if key in TASKS else key, _public_args(args))
            for key, _, args in (k.partition("=") for k in study.get("finetune_args_for") or [])
        ],
        "verdict": _study_verdict(table) if random and study.get("seeds") else None,  # it needs standard errors
    }


def _masking_recipe(data: Mapping[str, Any]) -> str:
    """How examples were masked, from the recorded flags (paper: 15%; 80% [MASK], 10% random, 10% kept)."""
    prob, mask = data.get("masked_lm_prob"), data.get("mask_replace_prob")
    rand = data.get("random_replace_prob")
    if not all(_is_number(v) for v in (prob, mask, rand)):
        return "masking settings not recorded"
    kept = max(0.0, 1 - mask - rand)
    return (
        f"{100 * prob:g}% of the tokens chosen for prediction (at most "
        f"{_plain(data.get('max_predictions_per_seq'))} per example), of which {100 * mask:g}% become "
        f"[MASK], {100 * rand:g}% a random token and {100 * kept:.3g}% stay"
    )


def _pretraining_facts(
    run: Mapping[str, Any],
    data: Mapping[str, Any],
    training: Mapping[str, Any],
    results: Mapping[str, Any],
    statistics: Mapping[str, Any],
) -> dict[str, Any]:
    """What the training-procedure section says, each value ready to print."""
    steps = results.get("global_step")
    batch = run.get("global_batch_size")
    sequences = steps * batch if _is_number(steps) and _is_number(batch) else None
    phase2 = run.get("phase2_fraction") or 0.0
    runtime, loss = results.get("train_runtime_s"), results.get("train_loss")
    processes = results.get("processes")
    casing = {True: "uncased (lower-cased, accents stripped)", False: "cased"}.get(run.get("lowercase"))
    return {
        "steps": _count(steps),
        "global_batch_size": _count(batch),
        "sequences": _count(sequences),
        "tokens_seen": _count(_tokens_seen(statistics, run, results)),
        "paper_share": (f"{100 * sequences / (PAPER_STEPS * PAPER_BATCH):.3g}%" if sequences else NOT_RECORDED),
        "phase2": (
            f"the last {100 * phase2:g}% of the steps at {run.get('phase2_max_seq_length')} tokens"
            if phase2 > 0
            else None
        ),
        "max_seq_length": data.get("max_seq_length"),
        "optimizer": run.get("optimizer", NOT_RECORDED),
        "learning_rate": _plain(training.get("learning_rate")),
        "warmup": _warmup(training.get("warmup_steps")),
        "schedule": training.get("lr_scheduler_type", NOT_RECORDED),
        "weight_decay": _plain(training.get("weight_decay")),
        "precision": "bf16" if training.get("bf16") else "fp16" if training.get("fp16") else "fp32",
        "processes": (
            f"{processes:,} process" + ("" if processes == 1 else "es")
            if _is_number(processes)
            else "number of processes not recorded"
        ),
        "accumulation": _count(results.get("gradient_accumulation_steps")),
        "runtime_hours": f"{runtime / 3600:.2f}" if _is_number(runtime) else NOT_RECORDED,
        "timed_from_step": (
            _count(results["train_runtime_from_step"]) if results.get("train_runtime_from_step") else None
        ),
        "tokens_per_second": _count(results.get("tokens_per_second")),
        "hardware": results.get("hardware") or NOT_RECORDED,
        "train_loss": f"{loss:.4f}" if _is_number(loss) else NOT_RECORDED,
        "recipe": _masking_recipe(data),
        "masking": "static (masks stored in the data, as the paper)"
        if data.get("static_masking", True)
        else "dynamic (fresh masks per batch, as RoBERTa)",
        "whole_word_mask": bool(data.get("do_whole_word_mask")),
        "casing": casing or "casing not recorded",
        "uncased": run.get("lowercase") is True,
        "vocab_trained": not run.get("tokenizer"),
        "tokenizer": public_name(run["tokenizer"]) if run.get("tokenizer") else None,
        "eval_fraction": _share(run.get("eval_fraction")) if run.get("eval_fraction") else None,
    }


def _hyperparameter_sections(
    record: Mapping[str, Any], titles: Mapping[str, str], notes: Mapping[str, Mapping[str, str]]
) -> list[dict[str, Any]]:
    """One collapsible table per section of run_config.json."""
    return [
        {"title": title, "rows": setting_rows(record.get(key) or {}, notes.get(key))}
        for key, title in titles.items()
        if record.get(key)
    ]


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

    ``base_model``: the checkpoint the run continued from (its `init_from`) when that is a Hub id; by default
    `init_from` itself if it is one. ``benchmark_dir``: a `recipes/reproduce.py` output directory for this
    checkpoint, whose report is added to the card. ``study_dir``: a `recipes/study.py` output directory
    (`study.json`) that fine-tuned this checkpoint against the same architecture randomly initialised; its row
    for this checkpoint (see `_study_row`) goes in the model-index and its table in the card. ``template_dir``:
    other templates than the package's.
    """
    out = Path(output_dir)
    record = _read_json(out / "run_config.json")
    config = _read_json(out / "config.json")
    if record is None or config is None:
        raise CardError(f"{out} is not a pre-training output directory (needs run_config.json, config.json).")
    statistics = _read_json(out / "data_statistics.json") or {}
    results = _read_json(out / "results.json") or {}
    run, data, training = record.get("run") or {}, record.get("data") or {}, record.get("training") or {}
    if base_model is None and is_hub_id(run.get("init_from")):
        base_model = run["init_from"]
    corpus = _corpus(run, statistics)
    eval_results, eval_rows = _pretraining_eval(results, corpus)
    study_results, study = _study(study_dir, out, results.get("global_step"))
    parameters = stored_parameter_count(out) or parameter_count(config)
    card_data = _card_data(
        repo_id=repo_id,
        pipeline_tag="fill-mask",
        tags=["bert", "bert_repro", "fill-mask"],
        datasets=[corpus["hub_id"]] if corpus["hub_id"] else [],
        eval_results=eval_results + study_results,
        base_model=base_model,
    )
    # run_config.json is written before the run derives the accumulation from global_batch_size.
    accumulation = results.get("gradient_accumulation_steps")
    notes: dict[str, dict[str, str]] = {}
    if _is_number(accumulation) and accumulation != training.get("gradient_accumulation_steps"):
        notes["training"] = {
            "gradient_accumulation_steps": f"the run used {accumulation}, derived from global_batch_size"
        }
    # --tokenizer overrides vocab_size, and a trained vocabulary can come out smaller: show the model's own size.
    if _is_number(config.get("vocab_size")) and run.get("vocab_size") != config["vocab_size"]:
        record = {**record, "run": {**run, "vocab_size": config["vocab_size"]}}
        notes["run"] = {"vocab_size": f"the model's, from config.json; the run's setting was {run.get('vocab_size')}"}
    held_out = statistics.get("held_out") or {}
    context = {
        "title": repo_name(repo_id),
        "architecture": architecture_rows(config, parameters),
        "corpus": corpus,
        "data_rows": _data_rows(statistics),
        "length_histogram": (statistics.get("phase1") or {}).get("length_histogram") or {},
        "facts": {**_pretraining_facts(run, data, training, results, statistics), "last_loss": _last_loss(out)},
        "hyperparameters": _hyperparameter_sections(
            record,
            {
                "run": "Run (corpus, vocabulary, model, schedule)",
                "data": "Pre-training examples (the reference create_pretraining_data.py flags)",
                "training": "Trainer (transformers TrainingArguments)",
            },
            notes,
        ),
        "eval_rows": eval_rows,
        "held_out_examples": _count(held_out.get("examples")),
        "held_out_documents": _count(held_out.get("documents")),
        "benchmark": _benchmark(benchmark_dir),
        "study": study,
        "curves": (out / "training_curves.png").is_file(),
        "versions": framework_lines(results.get("versions"), config.get("transformers_version")),
        "usage": _usage(repo_id, config=config),
        "base_model": base_model,
        "base_licence": _licence_of(base_model),
        "bibtex": BIBTEX,
    }
    return render_card("pretrained.md", card_data, context, template_dir)


# ------------------------------------------------------------------------------------------------------------
# Fine-tuned checkpoints
# ------------------------------------------------------------------------------------------------------------


def _metric_keys(task: Task, scores: Mapping[str, Any]) -> list[str]:
    """The metrics of a split's scores, the task's declared ones first; thresholds and counts left out."""
    extra = [k for k in scores if k not in task.metrics and k in METRICS]
    return [k for k in (*task.metrics, *extra) if k in scores]


def _paper_value(task: Task, metric: str, model: str, split: str) -> Result | None:
    """The paper's number for our (metric, split): the same split, else its test counterpart (GLUE's numbers
    are test-server scores), else the paper's only number for the metric."""
    found = [r for r in task.paper if r.model == model and r.metric == metric]
    for wanted in (split, split.replace("validation", "test")):
        for result in found:
            if result.split == wanted:
                return result
    return found[0] if len(found) == 1 else None


def _paper_cell(result: Result | None) -> str:
    return "–" if result is None else f"{result.value:.1f} ({SPLIT_NAMES.get(result.split, result.split)})"


def _finetuning_eval(
    task: Task, best: Mapping[str, Any], baseline: Mapping[str, Any] | None = None
) -> tuple[list[EvalResult], list[dict[str, str]]]:
    """model-index entries (percent) and table rows beside the majority class (`baseline`: results.json's
    majority_baseline, where the task has classes and the run recorded it) and the paper's BASE and LARGE numbers."""
    eval_results, rows = [], []
    for split in task.eval_splits:
        scores = best.get(split) or {}
        majority = (baseline or {}).get(split) or {}
        for metric in _metric_keys(task, scores):
            value = scores[metric]
            label = METRICS[metric].label
            ours = _percent(metric, value) if _is_number(value) else None
            if ours is not None:
                eval_results.append(_task_result(task, split, metric, ours, f"{label} (%)"))
            rows.append(
                {
                    "split": SPLIT_NAMES.get(split, split),
                    "metric": label,
                    "ours": _score(ours) if ours is not None else "undefined",
                    "majority": _score(_percent(metric, majority[metric])) if _is_number(majority.get(metric)) else "–",
                    "base": _paper_cell(_paper_value(task, metric, "base", split)),
                    "large": _paper_cell(_paper_value(task, metric, "large", split)),
                    "main": "yes" if metric == task.main_metric else "",
                }
            )
    return eval_results, rows


def _other_reported(task: Task) -> list[str]:
    return [
        f"{METRICS[r.metric].label} {r.value:g} on {SPLIT_NAMES.get(r.split, r.split)} ({r.model}; {r.source})"
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
                "learning_rate": format_setting(r.get("learning_rate")),
                "seed": format_setting(r.get("seed")),
                "score": (_score(_percent(task.main_metric, score)) if _is_number(score) else NOT_RECORDED),
                "seconds": _count(r.get("train_seconds")),
                "best": "yes" if (r.get("learning_rate"), r.get("seed")) == kept else "",
            }
        )
    return rows


def _finetuning_base(summary: Mapping[str, Any], record: Mapping[str, Any], base_model: str | None) -> dict[str, Any]:
    """The pre-trained checkpoint: a Hub id goes in the metadata, a local path only by its last component."""
    source = base_model or summary.get("model") or (record.get("run") or {}).get("model")
    hub = base_model if base_model else (source if is_hub_id(source) else None)
    return {
        "hub_id": hub,
        "name": hub or (public_name(source) if source else NOT_RECORDED),
        "licence": _licence_of(hub),
    }


def _finetuning_facts(task: Task, summary: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """What the training-procedure section says, each value ready to print."""
    hp = summary.get("hyperparameters") or {}
    best = summary.get("best") or {}
    run = record.get("run") or {}
    training = record.get("training") or {}
    threshold = (best.get(task.eval_splits[0]) or {}).get("squad_best_f1_threshold")
    ranking = task.kind.ranking_metric(task)
    return {
        "ranking_metric": METRICS[ranking].label,
        "schedule": training.get("lr_scheduler_type", NOT_RECORDED),
        "optim": training.get("optim", NOT_RECORDED),
        "adam_epsilon": _plain(training.get("adam_epsilon")),
        "learning_rates": ", ".join(map(format_setting, hp.get("learning_rates") or [])) or NOT_RECORDED,
        "seeds": ", ".join(str(v) for v in hp.get("seeds") or []) or NOT_RECORDED,
        "runs": _plural(len(summary.get("runs") or []), "run"),
        "best_learning_rate": format_setting(best.get("learning_rate")),
        "best_seed": format_setting(best.get("seed")),
        "epochs": _plain(hp.get("num_train_epochs")),
        "batch_size": _plain(hp.get("per_device_train_batch_size")),
        "max_seq_length": _plain(hp.get("max_seq_length")),
        "warmup": _warmup(hp.get("warmup")),
        "weight_decay": _plain(hp.get("weight_decay")),
        "hours": f"{summary['seconds'] / 3600:.2f}" if _is_number(summary.get("seconds")) else NOT_RECORDED,
        "hardware": summary.get("hardware") or NOT_RECORDED,
        # --data: a directory, a file, or split=path pairs; shown by their last components
        "data_source": ", ".join(_last_component(d.split("=")[-1]) for d in run.get("data") or []) or None,
        "max_train_samples": run.get("max_train_samples"),
        "max_eval_samples": run.get("max_eval_samples"),
        "null_threshold": f"{threshold:.4g}" if _is_number(threshold) else None,
    }


def _task_context(task: Task) -> dict[str, Any]:
    """What the card says about the task, from its description in `bert_repro.tasks.registry`."""
    splits = [SPLIT_NAMES.get(s, s) for s in task.eval_splits]
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
        "data_licence": _licence_of(task.hub_id),
        "paper_glue_test": any(r.split.startswith("test") for r in task.paper),
        "v2": task.allows_no_answer,
    }


def card_for_finetuning(
    output_dir: str | Path, repo_id: str, *, base_model: str | None = None, template_dir: str | Path | None = None
) -> ModelCard:
    """The card of a fine-tuning output directory (`recipes/finetune.py`): its best model, to publish as
    ``repo_id``. ``base_model``: the Hub id of the pre-trained checkpoint (by default the run's `--model` when
    that is a Hub id; a local path is not, and stays out of the metadata). ``template_dir``: other
    templates than the package's."""
    out = Path(output_dir)
    summary = _read_json(out / "results.json")
    if summary is None or "task" not in summary or "best" not in summary:
        raise CardError(f"{out} is not a fine-tuning output directory (needs results.json with task, best).")
    task = get_task(summary["task"])
    record = _read_json(out / "run_config.json") or {}
    config = _read_json(out / "model" / "config.json") or {}
    best = summary["best"] or {}
    eval_results, eval_rows = _finetuning_eval(task, best, summary.get("majority_baseline"))
    base = _finetuning_base(summary, record, base_model)
    parameters = stored_parameter_count(out / "model")
    if parameters is None and config.get("hidden_size"):
        parameters = parameter_count(config, task.kind)
    metrics = [m for m in dict.fromkeys(METRICS[m].hub_id for m in task.metrics) if m in HUB_METRICS]
    glue = ["glue"] if task.hub_id == "nyu-mll/glue" else []
    tags = ["bert", "bert_repro", task.kind.pipeline_tag, *glue, task.name]
    card_data = _card_data(
        repo_id=repo_id,
        pipeline_tag=task.kind.pipeline_tag,
        tags=tags,
        datasets=[task.hub_id],
        eval_results=eval_results,
        base_model=base["hub_id"],
        metrics=metrics,
    )
    context = {
        "title": repo_name(repo_id),
        "task": _task_context(task),
        "architecture": architecture_rows(config, parameters) if config else [],
        "base": base,
        "facts": _finetuning_facts(task, summary, record),
        "eval_rows": eval_rows,
        "majority_recorded": bool(summary.get("majority_baseline")),
        # the split -> the one label the kept run predicted for all its examples: it learned nothing else
        "one_label": {SPLIT_NAMES.get(k, k): v for k, v in (best.get("one_label") or {}).items()},
        "other_reported": _other_reported(task),
        "run_rows": _run_rows(task, summary),
        "hyperparameters": _hyperparameter_sections(
            record,
            {"run": "Fine-tuning run (bert_repro)", "training": "Trainer (transformers TrainingArguments)"},
            {
                "training": {
                    "learning_rate": "each run sets its own, from the grid",
                    "seed": "each run sets its own, from the seeds",
                }
            },
        ),
        "versions": framework_lines(summary.get("versions"), config.get("transformers_version")),
        "usage": _usage(repo_id, task, config=config),
        "bibtex": BIBTEX,
    }
    return render_card("finetuned.md", card_data, context, template_dir)


# ------------------------------------------------------------------------------------------------------------
# Any run directory
# ------------------------------------------------------------------------------------------------------------


def _finetuning_dir(path: Path) -> Path | None:
    """The fine-tuning output directory ``path`` is, or holds as its `model/` (None if neither)."""
    for directory in (path, path.parent):
        summary = _read_json(directory / "results.json")
        if isinstance(summary, dict) and "task" in summary and "best" in summary:
            return directory
    return None


def run_kind(path: str | Path) -> str:
    """ "pretraining" or "finetuning", from the files in ``path`` (a fine-tuning directory or its `model/`)."""
    path = Path(path)
    if _finetuning_dir(path) is not None:
        return "finetuning"
    record = _read_json(path / "run_config.json")
    if isinstance(record, dict) and "data" in record and (path / "config.json").is_file():
        return "pretraining"
    raise CardError(
        f"{path} holds neither a pre-training run (run_config.json with a data section, config.json) nor a "
        "fine-tuning run (results.json with task and best)."
    )


def card_for_directory(path: str | Path, repo_id: str, **kwargs: Any) -> ModelCard:
    """The card of whatever run ``path`` holds (see `run_kind`); keyword arguments go to the card function."""
    path = Path(path)
    finetuning = _finetuning_dir(path)
    if finetuning is not None:
        return card_for_finetuning(finetuning, repo_id, **kwargs)
    run_kind(path)  # a clear error for a directory that holds no run
    return card_for_pretraining(path, repo_id, **kwargs)


def card_path(path: str | Path) -> Path:
    """Where a run's card belongs: beside the weights that get uploaded (`<dir>/model/` for fine-tuning)."""
    path = Path(path)
    finetuning = _finetuning_dir(path)
    if finetuning is not None and (finetuning / "model").is_dir():
        return finetuning / "model" / "README.md"
    return path / "README.md"


def main(argv: Iterable[str] | None = None) -> Path:
    """`python -m bert_repro.hub.model_card RUN_DIR REPO_ID`: write the run's card, return its path."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_repro.hub.model_card", description="Write the model card (README.md) of a bert_repro run."
    )
    parser.add_argument("run_dir", help="a pre-training or fine-tuning output directory")
    parser.add_argument("repo_id", help="the Hub repository the model will be published as (owner/name)")
    parser.add_argument("--base_model", default=None, help="Hub id of the checkpoint this one started from")
    parser.add_argument(
        "--benchmark", default=None, help="pre-training: a recipes/reproduce.py output directory for this checkpoint"
    )
    parser.add_argument(
        "--output", default=None, help="where to write the card (default: README.md beside the weights)"
    )
    parser.add_argument(
        "--study",
        default=None,
        help="pre-training: a recipes/study.py output directory (study.json) of this checkpoint",
    )
    args = parser.parse_args(None if argv is None else list(argv))
    kwargs: dict[str, Any] = {"base_model": args.base_model}
    for flag, key in (("benchmark", "benchmark_dir"), ("study", "study_dir")):
        if getattr(args, flag):
            if run_kind(args.run_dir) != "pretraining":
                parser.error(f"--{flag} goes with a pre-training directory")
            kwargs[key] = getattr(args, flag)
    card = card_for_directory(args.run_dir, args.repo_id, **kwargs)
    output = Path(args.output) if args.output else card_path(args.run_dir)
    write_text(output, str(card))  # what ModelCard.save writes, whole or not at all
    print(f"wrote {output}")
    return output


__all__ = [
    "CardError",
    "card_for_directory",
    "card_for_finetuning",
    "card_for_pretraining",
    "card_path",
    "check_no_secrets",
    "is_hub_id",
    "parameter_count",
    "run_kind",
]


if __name__ == "__main__":
    main()
