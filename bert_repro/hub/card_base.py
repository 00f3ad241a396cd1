"""What every model card shares: the templates and their rendering, the metadata block, the architecture table and
parameter counts, the settings tables, the "How to use" snippets, the licences and the paper's citation.

Each kind of card is a dataclass of facts (a `CardFacts`) that its module builds from a run's records and renders
with its template, as transformers' `TrainingSummary` builds a Trainer's card (`from_trainer`, `to_model_card`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from safetensors import safe_open

from ..model.checkpoint_format import native_obstacles
from ..model.configuration_bert_repro import PRESETS
from ..model.conversion import weight_files
from ..model.modeling_bert_repro import AUTO_MAP
from ..tasks.kinds import TaskKind, kind_named
from ..tasks.metrics import percent
from ..tasks.registry import METRICS, TASKS, Task
from ..versions import FRAMEWORKS, installed_version
from .numbers import FILTERS, NOT_RECORDED, count, format_setting, is_number
from .secrets import CardError, check_no_secrets, dropped, public_name, public_value

TEMPLATE_PACKAGE_DIR = "card_templates"  # inside bert_repro.hub, so it ships in the wheel
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


def read_json(path: Path) -> dict[str, Any] | None:
    """A run's JSON record, None when there is none; one that does not parse is a CardError naming it."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise CardError(f"{path}: not a JSON record ({err}).") from None


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


def split_name(split: str, unknown: str | None = None) -> str:
    return SPLIT_NAMES.get(split, split if unknown is None else unknown)


def licence_of(source: str | None) -> str | None:
    return KNOWN_LICENCES.get(source) if source else None


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


def architecture_rows(directory: Path, config: Mapping[str, Any], head: str | TaskKind = "pretraining") -> list:
    """The architecture table of the model saved in ``directory`` (none without its config.json): sizes from the
    config, parameters as stored, else as counted with ``head``."""
    if not config:
        return []
    parameters = stored_parameter_count(directory)
    if parameters is None and config.get("hidden_size"):
        parameters = parameter_count(config, head)
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


def setting_rows(section: Mapping[str, Any], notes: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(name, value) of every setting of a run_config.json section, private ones left out."""
    notes = notes or {}
    rows = []
    for key, value in section.items():
        if not dropped(key):
            shown = format_setting(public_value(key, value))
            rows.append((key, f"{shown} ({notes[key]})" if key in notes else shown))
    return rows


def hyperparameter_sections(
    record: Mapping[str, Any], titles: Mapping[str, str], notes: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, rows): one collapsible table per section of run_config.json."""
    return [(title, setting_rows(record[key], notes.get(key))) for key, title in titles.items() if record.get(key)]


# Metadata and usage


def metadata(
    repo_id: str, pipeline_tag: str, eval_results: list[EvalResult], tags: tuple[str, ...] = (), **fields: Any
) -> ModelCardData:
    """The card's metadata block; ``tags``: those after "bert", "bert_repro" and the pipeline tag; ``fields``: the
    other fields of `ModelCardData` (datasets, base_model, metrics)."""
    return ModelCardData(
        language="en",
        license=LICENSE,
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=["bert", "bert_repro", pipeline_tag, *tags],
        model_name=repo_id.rstrip("/").split("/")[-1],
        eval_results=eval_results or None,
        **fields,
    )


# The pre-training objectives scored on the held-out documents: model-index task type, task name, metric label.
HELD_OUT_TASKS = {
    "mlm_accuracy": ("fill-mask", "Masked language modelling", "MLM accuracy"),
    "nsp_accuracy": ("text-classification", "Next sentence prediction", "NSP accuracy"),
}


def held_out_results(
    scores: Mapping[str, Any], dataset: str, corpus: str, note: str = "", config: str | None = None
) -> list[EvalResult]:
    """The model-index entries of the MLM and NSP accuracies in ``scores`` (`eval_mlm_accuracy`, ...) on ``corpus``'s
    held-out documents: fractions, as every score of a model-index here (as `evaluate`'s accuracy; the cards' tables
    give percent)."""
    return [
        EvalResult(
            task_type=task_type,
            task_name=task_name,
            dataset_type=dataset,
            dataset_name=f"{corpus}, held-out documents",
            dataset_config=config,
            dataset_split="held-out",
            metric_type="accuracy",
            metric_value=scores[f"eval_{key}"],
            metric_name=f"{label}{note}",
        )
        for key, (task_type, task_name, label) in HELD_OUT_TASKS.items()
        if is_number(scores.get(f"eval_{key}"))
    ]


TASK_TYPE_NAMES = {
    "fill-mask": "Fill-Mask",
    "text-classification": "Text Classification",
    "question-answering": "Question Answering",
    "multiple-choice": "Multiple Choice",
    "token-classification": "Token Classification",
}


def task_result(task: Task, split: str, metric: str, value: float, name: str) -> EvalResult:
    """A model-index entry for a score of ``task`` on ``split``, named as the registry names it."""
    return EvalResult(
        task_type=task.kind.pipeline_tag,
        task_name=TASK_TYPE_NAMES[task.kind.pipeline_tag],
        dataset_type=task.hub_id,
        dataset_name=task.display_name,
        dataset_config=task.hub_config,
        dataset_split=split,
        metric_type=METRICS[metric].hub_id,
        metric_value=value,
        metric_name=name,
    )


@dataclasses.dataclass(frozen=True)
class Usage:
    """The "How to use" section: the Auto classes, a pipeline example, our class, and why the checkpoint needs remote
    code if it does (`checkpoint_format.native_obstacles` of its config.json)."""

    repo_id: str
    auto_class: str
    remote_auto_class: str
    pipeline_task: str
    pipeline_variable: str
    pipeline_call: str
    remote_code_reason: str

    @property
    def repro_class(self) -> str:
        return AUTO_MAP[self.auto_class].split(".")[1]

    @classmethod
    def of(cls, repo_id: str, task: Task | None = None, config: Mapping[str, Any] | None = None) -> Usage:
        """A ``task``'s model, or without one a pre-trained model (fill-mask)."""
        if task is None:
            classes = ("AutoModelForPreTraining", "AutoModelForMaskedLM", "fill-mask")
            example: tuple[str, str] = ("fill", 'fill("The capital of France is [MASK].")')
        else:
            classes = (task.kind.auto_class, task.kind.auto_class, task.kind.pipeline_task)
            example = task.kind.pipeline_example(task)
        return cls(repo_id, *classes, *example, "; ".join(native_obstacles(dict(config or {}))))


# Rendering


def _cell(value: Any) -> str:
    """A Markdown table cell: pipes escaped, line breaks removed."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _finalize(value: Any) -> Any:
    return NOT_RECORDED if value is None else value


# The templates' filters: `numbers`' formats and names; a task or metric the registry does not know (a record of
# another version) is shown as written.
_FILTERS = {
    **FILTERS,
    "licence": licence_of,
    "public_name": public_name,
    "split_name": split_name,
    "metric_label": lambda m: METRICS[m].label if m in METRICS else m,
    "task_name": lambda t: TASKS[t].display_name if t in TASKS else t,
    "percent": lambda value, metric: percent(metric, value),
}


def template_environment(template_dir: str | Path | None = None) -> jinja2.Environment:
    """The Jinja environment of the cards: templates from ``template_dir`` or the package's; strict, so that a
    misspelt variable fails rather than leaves a blank."""
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
    env.filters.update({name: _strict(f) for name, f in _FILTERS.items()}, cell=_cell)
    env.tests["recorded"] = is_number
    return env


def _strict(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` as a filter that fails on an undefined variable as printing it would, rather than read "not recorded"."""

    def strict(value: Any, *args: Any) -> Any:
        if isinstance(value, jinja2.Undefined):
            str(value)  # StrictUndefined: raises UndefinedError, naming the variable
        return f(value, *args)

    return strict


class CardFacts:
    """What one kind of card states, as a dataclass whose fields its template reads; subclasses give the template's
    name and the metadata block, and a constructor from the run's records."""

    template: ClassVar[str]

    def card_data(self) -> ModelCardData:
        raise NotImplementedError

    def to_model_card(self, template_dir: str | Path | None = None) -> ModelCard:
        """The card: the template (of ``template_dir``, else the package's) rendered with this object's fields, the
        metadata block, the title and the paper's BibTeX; refused if it holds a secret."""
        card_data = self.card_data()
        # The variables ModelCard.from_template gives a template, plus ours.
        variables = {**card_data.to_dict(), "title": card_data.model_name, "bibtex": BIBTEX, **vars(self)}
        content = (
            template_environment(template_dir)
            .get_template(self.template)
            .render(**variables, card_data=card_data.to_yaml())
        )
        content = re.sub(r"\n{3,}", "\n\n", content)  # blank lines left by skipped blocks
        check_no_secrets(content)
        return ModelCard(content)
