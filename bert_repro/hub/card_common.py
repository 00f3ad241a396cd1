"""What the model cards share: metadata, rendering, how a card writes numbers, names and settings (nothing private),
the architecture table and the secrets check. Used as one namespace (`from . import card_common as card`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from safetensors import safe_open

from ..model.checkpoint_format import native_obstacles
from ..model.configuration_bert_repro import PRESETS
from ..model.conversion import weight_files
from ..model.modeling_bert_repro import AUTO_MAP
from ..tasks.kinds import TaskKind, kind_named
from ..tasks.registry import Task
from ..versions import FRAMEWORKS, installed_version

TEMPLATE_PACKAGE_DIR = "model_cards"  # inside bert_repro.hub, so it ships in the wheel
NOT_RECORDED = "not recorded"
LICENSE = "apache-2.0"
SPLIT_NAMES = {
    "validation": "dev",
    "validation_matched": "dev matched",
    "validation_mismatched": "dev mismatched",
    "test": "test",
    "test_matched": "test matched",
    "test_mismatched": "test mismatched",
}
# Licences of data sets and checkpoints the recipes commonly use, as their Hub pages state them.
KNOWN_LICENCES = {
    "wikimedia/wikipedia": "CC BY-SA 3.0 and GFDL",
    "Salesforce/wikitext": "CC BY-SA 3.0 and GFDL",
    "rajpurkar/squad": "CC BY-SA 4.0",
    "rajpurkar/squad_v2": "CC BY-SA 4.0",
}

# Settings of outputs, logs, trackers or credentials: not hyper-parameters, and possibly private.
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


# Small helpers: files, numbers, names


def read_json(path: Path) -> dict[str, Any] | None:
    """A run's JSON record, None when there is none; one that does not parse is a CardError naming it."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise CardError(f"{path}: not a JSON record ({err}).") from None


def plain(value: Any) -> str:
    """A setting in prose: whole floats without ".0", None as "not recorded"."""
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return NOT_RECORDED if value is None else format_setting(value)


def warmup(value: Any) -> str:
    """transformers 5.x `warmup_steps`: a float below 1 is a share of the steps."""
    if is_number(value) and 0 < value < 1:
        return f"{100 * value:g}% of the steps"
    return f"{plain(value)} steps"


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def duration(seconds: Any) -> str:
    """A time as people read it: "42 s", "3.1 min", "2.0 h"."""
    if not is_number(seconds):
        return NOT_RECORDED
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3570 else f"{seconds / 3600:.1f} h"


def score(value: Any, missing: str = NOT_RECORDED) -> str:
    return f"{value:.2f}" if is_number(value) else missing


def count(value: Any) -> str:
    return f"{value:,}" if is_number(value) else NOT_RECORDED


def share(value: Any) -> str:
    return f"{100 * value:.1f}%" if is_number(value) else NOT_RECORDED


def is_hub_id(value: Any) -> bool:
    """Whether ``value`` names a Hub repository ("owner/name") rather than a local file or directory."""
    if not isinstance(value, str) or value.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(value):
        return False
    return not value.lower().endswith(_FILE_SUFFIXES) and not Path(value).exists()


def public_name(value: str) -> str:
    """A source as a card may name it: a Hub id as it is, a local path by its last component only."""
    if is_hub_id(value):
        return value
    return f"{last_component(value)} (local)"


def last_component(path: str) -> str:
    return Path(str(path).rstrip("/\\")).name or str(path)


def repo_name(repo_id: str) -> str:
    return repo_id.rstrip("/").split("/")[-1]


def preset_name(preset: str) -> str:
    """A preset as the papers name it: BERT-BASE and BERT-LARGE (Devlin et al.), BERT-Tiny to -Medium (Turc et al.)."""
    return "BERT-" + (preset.upper() if preset in ("base", "large") else preset.capitalize())


def preset_of(config: Mapping[str, Any]) -> str | None:
    """The preset whose L, H, A and FFN sizes ``config`` has, or None for a custom size."""
    for name, sizes in PRESETS.items():
        if all(config.get(key) == value for key, value in sizes.items()):
            return name
    return None


def framework_lines(recorded: Mapping[str, Any] | None, saved_with: str | None = None) -> list[str]:
    """The versions the run recorded (results.json's `versions`), else config.json's transformers (``saved_with``)
    and those installed now, labelled as such: a card may be made long after the run, elsewhere."""
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


# Architecture and parameters


def _encoder_parameters(config: Mapping[str, Any], pooler: bool) -> int:
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    positions, segments = config.get("max_position_embeddings", 512), config.get("type_vocab_size", 2)
    embeddings = (v + positions + segments) * h + 2 * h  # + LayerNorm
    layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    return embeddings + config["num_hidden_layers"] * layer + (h * h + h if pooler else 0)


def parameter_count(config: Mapping[str, Any], head: str | TaskKind = "pretraining") -> int:
    """Parameters with ``head`` ("pretraining", or a task kind or its name), the tied MLM decoder counted once."""
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
    with safe_open(path, "np") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def stored_parameter_count(directory: Path) -> int | None:
    """Parameters of the model saved in ``directory``: `model.safetensors` or all the shards its index names."""
    files = weight_files(directory) if directory.is_dir() else []
    return sum(safetensors_parameter_count(f) or 0 for f in files) or None


def architecture_rows(config: Mapping[str, Any], parameters: int | None) -> list[tuple[str, str]]:
    preset = preset_of(config)
    preset_text = f"`{preset}` ({preset_name(preset)} size)" if preset else "custom size (no preset)"
    return [
        ("Preset", preset_text),
        ("Layers (L)", count(config.get("num_hidden_layers"))),
        ("Hidden size (H)", count(config.get("hidden_size"))),
        ("Attention heads (A)", count(config.get("num_attention_heads"))),
        ("Feed-forward size", count(config.get("intermediate_size"))),
        ("Vocabulary", count(config.get("vocab_size"))),
        ("Positions", count(config.get("max_position_embeddings"))),
        ("Activation", str(config.get("hidden_act", NOT_RECORDED))),
        ("Parameters", count(parameters)),
    ]


# Hyper-parameters: every recorded setting, with nothing private


def _dropped(key: str) -> bool:
    return key in _DROPPED_KEYS or key.startswith(_DROPPED_PREFIXES) or key.endswith(_DROPPED_SUFFIXES)


def public_value(key: str, value: Any) -> Any:
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
        shown = format_setting(public_value(key, value))
        rows.append((key, f"{shown} ({notes[key]})" if key in notes else shown))
    return rows


def hyperparameter_sections(
    record: Mapping[str, Any], titles: Mapping[str, str], notes: Mapping[str, Mapping[str, str]]
) -> list[dict[str, Any]]:
    """One collapsible table per section of run_config.json."""
    return [
        {"title": title, "rows": setting_rows(record.get(key) or {}, notes.get(key))}
        for key, title in titles.items()
        if record.get(key)
    ]


# Secrets


def check_no_secrets(text: str) -> None:
    """Refuse a card that contains an access token or the value of a secret environment variable."""
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name, "")
        if len(value) >= 8 and value in text:
            raise CardError(f"The card contains the value of ${name}; it is not written.")
    if _TOKEN_PATTERN.search(text):
        raise CardError("The card contains what looks like a Hugging Face access token; it is not written.")


# Rendering


def _cell(value: Any) -> str:
    """A Markdown table cell: pipes escaped, line breaks removed."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _finalize(value: Any) -> Any:
    return NOT_RECORDED if value is None else value


def template_environment(template_dir: str | Path | None = None) -> jinja2.Environment:
    """The Jinja environment of the cards: templates from ``template_dir`` or the package's; strict."""
    if template_dir is None:
        loader: jinja2.BaseLoader = jinja2.PackageLoader("bert_repro.hub", TEMPLATE_PACKAGE_DIR)
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


def render_card(
    template: str, card_data: ModelCardData, context: Mapping[str, Any], template_dir: str | Path | None = None
) -> ModelCard:
    """``template`` rendered with the metadata block, the title, the paper's BibTeX and ``context``."""
    env = template_environment(template_dir)
    # The variables ModelCard.from_template gives a template, plus ours.
    variables = {**card_data.to_dict(), "title": card_data.model_name, "bibtex": BIBTEX, **context}
    variables["card_data"] = card_data.to_yaml()
    content = env.get_template(template).render(**variables)
    content = re.sub(r"\n{3,}", "\n\n", content)  # blank lines left by skipped blocks
    check_no_secrets(content)
    return ModelCard(content)


def metadata(
    *,
    repo_id: str,
    pipeline_tag: str,
    eval_results: list[EvalResult],
    tags: tuple[str, ...] = (),
    datasets: list[str] | None = None,
    base_model: str | None = None,
    metrics: list[str] | None = None,
) -> ModelCardData:
    """The card's metadata block; ``tags``: those after "bert", "bert_repro" and the pipeline tag."""
    return ModelCardData(
        language="en",
        license=LICENSE,
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=["bert", "bert_repro", pipeline_tag, *tags],
        datasets=datasets or None,
        base_model=base_model,
        metrics=metrics or None,
        model_name=repo_name(repo_id),
        eval_results=eval_results or None,
    )


def usage(repo_id: str, task: Task | None = None, *, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The "How to use" section's Auto classes, pipeline example (fill-mask without ``task``), our class, and why
    the checkpoint needs remote code (``config``: its config.json; see `checkpoint_format`)."""
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


# The pre-training objectives scored on the held-out documents: model-index task type, task name, metric label.
HELD_OUT_TASKS = {
    "mlm_accuracy": ("fill-mask", "Masked language modelling", "MLM accuracy"),
    "nsp_accuracy": ("text-classification", "Next sentence prediction", "NSP accuracy"),
}


def held_out_result(
    key: str, value: float, dataset: str, corpus: str, note: str = "", config: str | None = None
) -> EvalResult:
    """The model-index entry of MLM or NSP accuracy (``key``) on ``corpus``'s held-out documents: a fraction, as
    every score of a model-index here (as `evaluate`'s accuracy; the cards' tables give percent)."""
    task_type, task_name, label = HELD_OUT_TASKS[key]
    return EvalResult(
        task_type=task_type,
        task_name=task_name,
        dataset_type=dataset,
        dataset_name=f"{corpus}, held-out documents",
        dataset_config=config,
        dataset_split="held-out",
        metric_type="accuracy",
        metric_value=value,
        metric_name=f"{label}{note}",
    )


def licence_of(source: str | None) -> str | None:
    return KNOWN_LICENCES.get(source) if source else None
