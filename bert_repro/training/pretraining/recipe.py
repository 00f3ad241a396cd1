"""A pre-training run as one typed object, `PreTrainingRecipe`, by section: `data`, `examples`, `model`, `phases` (the
paper's two: 90% of the steps at 128 tokens, 10% at 512), `optimization`, `training` (transformers'
`TrainingArguments`) and `output`. Read at the edge (`from_args`, `from_yaml`), recorded as `run_config.json`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING, asdict, dataclass, fields
from dataclasses import replace as replace_fields
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from ...data.pretraining_examples import PreTrainingDataConfig
from ...data.wordpiece import BERT_SPECIAL_TOKENS
from ...model.configuration_bert_repro import SPEED_SWITCHES
from ..cli import (
    SECTIONS,
    ConfigurationError,
    HelpLayout,
    SpeedSwitches,
    check_attention,
    check_tokenizer,
    closest,
    field_names,
    flag,
    parse_with_config,
)
from ..distributed import check_deepspeed_installed
from ..fp8 import fp8_problem

RECIPE = "recipes/pretrain.py"
SCHEMA_VERSION = 2  # the layout of `PreTrainingRecipe.to_dict()`

# SPEC section 3: Adam lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01, 10,000 warm-up steps then linear
# decay, clipping at 1.0, 1,000,000 steps. Lowest precedence: a YAML config and the command line override them.
PAPER_TRAINING_DEFAULTS = dict(
    learning_rate=1e-4,
    adam_beta1=0.9,
    adam_beta2=0.999,
    adam_epsilon=1e-6,
    weight_decay=0.01,
    warmup_steps=10_000,
    lr_scheduler_type="linear",
    max_grad_norm=1.0,
    max_steps=1_000_000,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=64,
    logging_steps=100,
    save_steps=10_000,
    eval_steps=10_000,
    eval_strategy="steps",
    save_total_limit=3,
    report_to="tensorboard",
    seed=12345,
    remove_unused_columns=False,
    ddp_find_unused_parameters=False,
)


@dataclass
class DataSettings:
    """The corpus, the vocabulary, the held-out split and how batches are made of the examples."""

    help_group = "data"  # the section of --help (`HelpLayout`) for these flags, unless a flag says another
    corpus: list[str] = flag(
        factory=list,
        help="Text: a folder, files or globs (.txt, .jsonl, .parquet, .csv), or a Hub dataset id.",
        metavar="PATH|HUB_ID",
    )
    hub_config: str | None = flag(None, "Config of a Hub dataset (e.g. 20231101.en).")
    split: str = flag("train", "Split of a Hub dataset.")
    text_column: str = flag("text", "Column holding the text in table files.")
    document_boundary: str = flag(
        "blank_line",
        "Plain text: 'blank_line' (a blank line between documents) or 'file' (one document per file); "
        "'wikitext': WikiText's rows joined into articles at their ' = Title = ' lines.",
        choices=["blank_line", "file", "wikitext"],
    )
    split_lines: bool = flag(
        False, "Every line break ends a sentence (one paragraph per line), instead of hard-wrapped text."
    )
    max_documents: int | None = flag(
        None, "Use at most this many documents (streaming: per pass over the stream, over all processes)."
    )
    streaming: bool = flag(
        False,
        "Read the corpus as a stream while training (no copy of it or of the examples on disk); NotNext "
        "segments come from a buffer of recent documents (bert_repro.data.streaming).",
    )
    stream_document_buffer: int = flag(
        1000, "Streaming: NotNext segment B comes from one of this many documents read before A's."
    )
    stream_shuffle_buffer: int = flag(
        10_000, "Streaming: examples shuffled in a buffer of this size (0: stream order)."
    )
    stream_held_out_documents: int = flag(
        200,
        "Streaming: the stream's first documents held out for evaluation (never trained on; eval_fraction "
        "applies without streaming); 0 for none.",
    )
    tokenizer: str | None = flag(
        None, "An existing tokenizer (directory, vocab.txt, tokenizer.json or Hub id); else one is trained."
    )
    vocab_size: int = flag(30522, "Size of a newly trained WordPiece vocabulary.")
    lowercase: bool = flag(True, "Uncased (lower-case, strip accents) or cased.")
    num_proc: int | None = flag(None, "Processes for data preparation (all cores).")
    eval_fraction: float = flag(0.01, "Share of documents held out for evaluation.", group="evaluation")
    eval_max_examples: int = flag(2000, "At most this many held-out examples.", group="evaluation")
    packing: bool = flag(
        False,
        "Pack each batch's examples into shared rows, attention kept inside each example and NSP read at "
        "each example's [CLS] (same examples, losses and gradients; less padding).",
    )


@dataclass
class ModelSettings(SpeedSwitches):
    """The model trained: its size, where its weights start, how it computes (the speed switches)."""

    help_group = "model"
    preset: str = flag("base", "tiny, mini, small, medium, base or large.")
    model_overrides: str | None = flag(
        None, "JSON object of BertReproConfig fields, e.g. '{\"hidden_dropout_prob\": 0.0}'."
    )
    init_from: str | None = flag(
        None, "Start from the weights of this checkpoint (continued pre-training) instead of a random init."
    )
    attn_implementation: str = flag("sdpa", "eager, sdpa or flash_attention_2.")
    sparse_prediction: bool = flag(
        True, "Run the MLM decoder only at the masked positions (same loss and gradients, fewer FLOPs)."
    )
    fp8: bool = flag(
        False,
        "Opt-in, not the paper's: the Transformer blocks' linear layers in float8 (torchao's float8 "
        "training, dynamic scaling; bert_repro/training/fp8.py). Needs torchao, --bf16 and a CUDA card of compute "
        "capability 8.9+ (refused elsewhere); gains under --torch_compile.",
    )


@dataclass
class PhaseFlags:
    """The command line's names for the second phase (the recipe holds `phases`); read at the edge only."""

    help_group = "training"
    phase2_fraction: float = flag(0.1, "Share of the steps in phase 2 (long sequences); 0 for one phase.")
    phase2_max_seq_length: int = flag(512, "Sequence length of phase 2.", group="data")
    phase2_max_predictions_per_seq: int = flag(80, "Masked positions in phase 2.", group="data")


@dataclass
class OptimizationSettings:
    """What transformers' TrainingArguments does not hold: the global batch and the optimizer."""

    help_group = "training"
    global_batch_size: int = flag(256, "Sequences per optimizer step; gradient accumulation is derived from it.")
    optimizer: str = flag("adamw", "adamw, bert_adam (reference code) or lamb.", choices=["adamw", "bert_adam", "lamb"])


@dataclass
class OutputSettings:
    """What this invocation does with the output directory (none of it identifies the run)."""

    help_group = "output"
    overwrite_output_dir: bool = flag(
        False, "Allow writing into an output directory that holds another or a finished run."
    )
    stop_after_steps: int | None = flag(
        None,
        "Stop this invocation after so many optimizer steps, with a checkpoint (resume it later).",
        group="training",
    )
    plot: bool = flag(True, "Write training_curves.png at the end.")


@dataclass(frozen=True)
class Phase:
    """One stretch of the run: its examples' length, their masked positions, and its share of the steps."""

    max_seq_length: int
    max_predictions_per_seq: int
    fraction: float


PHASE_FIELDS = ("max_seq_length", "max_predictions_per_seq")  # phase 1's, given as the examples' flags


def phases_from_flags(examples: PreTrainingDataConfig, flags: PhaseFlags) -> tuple[Phase, ...]:
    """The command line's phases: phase 1 with the examples' lengths, phase 2 when --phase2_fraction > 0."""
    first = Phase(examples.max_seq_length, examples.max_predictions_per_seq, 1 - flags.phase2_fraction)
    if flags.phase2_fraction <= 0:
        return (replace_fields(first, fraction=1.0),)
    return first, Phase(flags.phase2_max_seq_length, flags.phase2_max_predictions_per_seq, flags.phase2_fraction)


# The classes the command line fills, in this order (`PreTrainingRecipe.from_args`).
PARSED = (DataSettings, PreTrainingDataConfig, ModelSettings, PhaseFlags, OptimizationSettings, OutputSettings)
SECTION_CLASSES = {
    "data": DataSettings,
    "examples": PreTrainingDataConfig,
    "model": ModelSettings,
    "optimization": OptimizationSettings,
    "training": TrainingArguments,
    "output": OutputSettings,
}


# Flag name -> the section holding it; the phase flags and phase 1's lengths act on `phases`.
SECTION_OF = {name: section for section, cls in SECTION_CLASSES.items() for name in field_names(cls)}
SECTION_OF.update({name: "phases" for name in field_names(PhaseFlags)})


@dataclass(frozen=True)
class PreTrainingRecipe:
    """Every setting of a pre-training run, by section (see the module's docstring)."""

    data: DataSettings
    examples: PreTrainingDataConfig
    model: ModelSettings
    phases: tuple[Phase, ...]
    optimization: OptimizationSettings
    training: TrainingArguments
    output: OutputSettings

    def __post_init__(self):
        lengths = (self.examples.max_seq_length, self.examples.max_predictions_per_seq)
        if not self.phases or (self.phases[0].max_seq_length, self.phases[0].max_predictions_per_seq) != lengths:
            raise ConfigurationError(
                "The recipe's first phase must have the examples' max_seq_length and max_predictions_per_seq "
                "(build it with from_args, from_yaml or replace)."
            )

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> PreTrainingRecipe:
        """From the command line (`sys.argv[1:]` when None): the paper's defaults < `--config FILE.yaml` < flags.
        Unknown YAML keys and flags are an error that names the file and the key."""
        argv = list(sys.argv[1:] if argv is None else argv)
        check_deepspeed_installed(argv)  # before TrainingArguments, which fails on it with an unrelated error
        parsed = parse_with_config(
            (*PARSED, TrainingArguments), PAPER_TRAINING_DEFAULTS, argv, RECIPE, help_layout=HELP
        )
        data, examples, model, flags, optimization, output, training = parsed
        return cls(data, examples, model, phases_from_flags(examples, flags), optimization, training, output)

    @classmethod
    def from_yaml(cls, path: str | Path, **changes: Any) -> PreTrainingRecipe:
        """A YAML config (as `--config`), with `changes` as `replace` takes them."""
        recipe = cls.from_args(["--config", str(path)])
        return recipe.replace(**changes) if changes else recipe

    def phase_flags(self) -> PhaseFlags:
        """The phases under the command line's names."""
        if len(self.phases) == 1:
            return PhaseFlags(phase2_fraction=0.0)
        second = self.phases[1]
        return PhaseFlags(second.fraction, second.max_seq_length, second.max_predictions_per_seq)

    def replace(self, **changes: Any) -> PreTrainingRecipe:
        """A copy with `changes` named as their flags (`max_steps=500`); an unknown name is a ConfigurationError."""
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if name not in SECTION_OF:
                raise ConfigurationError(
                    f"PreTrainingRecipe has no setting {name!r}{closest(name, set(SECTION_OF), '')}."
                )
            by_section.setdefault(SECTION_OF[name], {})[name] = value
        flags = replace_fields(self.phase_flags(), **by_section.pop("phases", {}))
        sections = {name: getattr(self, name) for name in SECTION_CLASSES}
        for name, values in by_section.items():
            sections[name] = replace_fields(sections[name], **values)
        try:
            return PreTrainingRecipe(**sections, phases=phases_from_flags(sections["examples"], flags))
        except ValueError as err:  # TrainingArguments' own checks
            raise ConfigurationError(" ".join(str(err).split())) from None

    def to_dict(self) -> dict[str, Any]:
        """`run_config.json`: every setting by section, JSON types, the Hub token left out."""
        record = {
            "schema_version": SCHEMA_VERSION,
            "data": asdict(self.data),
            "examples": {k: v for k, v in asdict(self.examples).items() if k not in PHASE_FIELDS},
            "model": asdict(self.model),
            "phases": [asdict(phase) for phase in self.phases],
            "optimization": asdict(self.optimization),
            "training": {k: v for k, v in self.training.to_dict().items() if k != "hub_token"},
            "output": asdict(self.output),
        }
        return json.loads(json.dumps(record, default=str))

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> PreTrainingRecipe:
        """A run's record, to read, not to run: missing settings take their defaults, and `training` is not checked
        against this machine (a GPU run's bf16 on a CPU)."""
        sections = {
            name: _filled(cls_, record.get(name) or {})
            for name, cls_ in SECTION_CLASSES.items()
            if name not in ("examples", "training")
        }
        phases = tuple(Phase(**phase) for phase in record.get("phases") or [])
        first = phases[0] if phases else Phase(128, 20, 1.0)
        lengths = {"max_seq_length": first.max_seq_length, "max_predictions_per_seq": first.max_predictions_per_seq}
        examples = _filled(PreTrainingDataConfig, {**(record.get("examples") or {}), **lengths})
        training = _unchecked(TrainingArguments, record.get("training") or {})
        return cls(**sections, examples=examples, phases=phases or (first,), training=training)


def _filled(cls, values: dict[str, Any]):
    known = field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in known})


def _unchecked(cls, values: dict[str, Any]):
    """`cls` with `values` over its defaults, without its `__post_init__` (which checks this machine)."""
    obj = object.__new__(cls)
    for f in fields(cls):
        default = (
            f.default_factory() if f.default_factory is not MISSING else (None if f.default is MISSING else f.default)
        )
        object.__setattr__(obj, f.name, values.get(f.name, default))
    return obj


# `--help`: the recipe's flags by stage, with the Trainer flags a pre-training run sets most, then Trainer's others.
HELP = HelpLayout(
    titles=SECTIONS | {"data": "data: corpus, vocabulary, pre-training examples"},
    groups={
        "data": tuple(f.name for f in fields(PreTrainingDataConfig)),
        "training": (
            *("max_steps", "per_device_train_batch_size", "learning_rate", "warmup_steps", "lr_scheduler_type"),
            *("weight_decay", "seed", "bf16"),
        ),
        "evaluation": ("eval_steps",),
        "output": (
            *("output_dir", "resume_from_checkpoint", "save_steps"),
            *("logging_steps", "push_to_hub", "hub_model_id"),
        ),
    },
    set_by_recipe={
        "optim": "--optimizer chooses the optimizer, --learning_rate, --adam_* and --weight_decay its settings",
        "gradient_accumulation_steps": "--global_batch_size / (--per_device_train_batch_size x processes)",
        "ignore_data_skip": "true with --streaming, which restores the stream's own position",
    },
    helps={
        "bf16": "true, false or auto (the shipped configs': bf16 where a CUDA device has it, else float32).",
        "resume_from_checkpoint": "true: continue from the newest complete checkpoint in --output_dir (a finished "
        "run is left as it is, so a requeued job can always pass it); or the path of a checkpoint folder. With a "
        "larger --max_steps it extends the run.",
    },
    metavars={"resume_from_checkpoint": "true|PATH", "optim": "NAME"},
)


def check_values(recipe: PreTrainingRecipe) -> None:
    """Values no run can use, refused before any data is read or the run recorded."""
    data, training, output = recipe.data, recipe.training, recipe.output
    batch, phase2 = recipe.optimization.global_batch_size, recipe.phase_flags().phase2_fraction
    per_device, stop = training.per_device_train_batch_size, output.stop_after_steps
    wrong = [
        f"--{name} {value}"
        for name, value, ok in (
            ("learning_rate", training.learning_rate, training.learning_rate > 0),
            ("max_steps", training.max_steps, training.max_steps >= 1),
            ("global_batch_size", batch, batch >= 1),
            ("per_device_train_batch_size", per_device, per_device >= 1),
            ("eval_fraction", data.eval_fraction, 0 <= data.eval_fraction < 1),
            ("phase2_fraction", phase2, 0 <= phase2 < 1),
            ("eval_max_examples", data.eval_max_examples, data.eval_max_examples >= 1),
            ("num_proc", data.num_proc, data.num_proc is None or data.num_proc >= 1),
            ("max_documents", data.max_documents, data.max_documents is None or data.max_documents >= 1),
            ("stop_after_steps", stop, stop is None or stop >= 1),
            ("stream_document_buffer", data.stream_document_buffer, data.stream_document_buffer >= 1),
            ("stream_shuffle_buffer", data.stream_shuffle_buffer, data.stream_shuffle_buffer >= 0),
            ("stream_held_out_documents", data.stream_held_out_documents, data.stream_held_out_documents >= 0),
            ("weight_decay", training.weight_decay, training.weight_decay >= 0),
            ("seed", training.seed, 0 <= training.seed < 2**32),
            ("save_steps", training.save_steps, training.save_strategy != "steps" or training.save_steps > 0),
        )
        if not ok
    ]
    if wrong:
        raise ConfigurationError(
            f"{', '.join(wrong)}: the learning rate and save_steps must be positive; max_steps, the batch sizes, "
            "eval_max_examples, num_proc, max_documents, stop_after_steps and stream_document_buffer at least 1; "
            "the weight decay, stream_shuffle_buffer and stream_held_out_documents at least 0; the seed in "
            "[0, 2**32); eval_fraction and phase2_fraction in [0, 1)."
        )
    check_attention(recipe.model.attn_implementation)
    if recipe.model.fp8 and (problem := fp8_problem(training.bf16)):
        raise ConfigurationError(problem)


def gradient_accumulation(recipe: PreTrainingRecipe) -> int:
    """Batches per optimizer step: the global batch over (the batch per device x the processes)."""
    training, global_batch_size = recipe.training, recipe.optimization.global_batch_size
    per_step = training.per_device_train_batch_size * training.world_size
    if global_batch_size % per_step:
        raise ConfigurationError(
            f"global_batch_size {global_batch_size} is not a multiple of per_device_train_batch_size "
            f"{training.per_device_train_batch_size} x {training.world_size} processes."
        )
    return global_batch_size // per_step


def check_vocabulary(data: DataSettings) -> None:
    """A readable --tokenizer, or a --vocab_size with room beyond the special tokens: said before the corpus is read."""
    if data.tokenizer:
        check_tokenizer(data.tokenizer)
    elif data.vocab_size <= len(BERT_SPECIAL_TOKENS):
        raise ConfigurationError(
            f"--vocab_size {data.vocab_size}: a WordPiece vocabulary needs more than its {len(BERT_SPECIAL_TOKENS)} "
            "special tokens (BERT's: 30522)."
        )


# Settings that may change between an interrupted run and its resumption (an output directory holds one run).
RUN_CONTROL_FIELDS = {
    *("overwrite_output_dir", "stop_after_steps", "resume_from_checkpoint", "num_proc", "plot", "logging_steps"),
    *("report_to", "disable_tqdm", "log_level", "log_level_replica", "dataloader_num_workers"),
    # the same training either way: the speed switches, packing (the same examples and losses), fp8 (opt-in precision)
    *(*SPEED_SWITCHES, "compile_layers", "packing", "fp8"),
    "gradient_accumulation_steps",  # derived from global_batch_size and the processes
}
# What a resumption may raise, extending the run (a finished one too; `check_extension`).
MAY_GROW = ("training.max_steps",)
# Where a run lives is not what it trains: a run folder moved or copied (scratch -> project space) resumes. Nor is
# how its inputs' paths are spelled: what they hold is (the record's "inputs").
LOCATION_FIELDS = {"output_dir", "corpus", "tokenizer"}


def run_identity(record: dict) -> dict:
    """What two invocations of one run share: the record without what may change on resumption, phases by number."""
    phases = record.get("phases") or []
    identity: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "phases": phases if isinstance(phases, dict) else {f"phase{i + 1}": p for i, p in enumerate(phases)},
    }
    for name, section in record.items():
        if name == "inputs":
            identity[name] = section
        elif isinstance(section, dict) and name != "phases":
            identity[name] = {
                key: value
                for key, value in section.items()
                if not (
                    key in RUN_CONTROL_FIELDS
                    or key in LOCATION_FIELDS
                    or key.startswith(("logging_", "push_to_hub"))
                    or (key.startswith("hub_") and name == "training")
                )
            }
    return json.loads(json.dumps(identity, default=str))


def check_extension(grown: dict, recipe: PreTrainingRecipe) -> None:
    """More steps keep the steps taken on their examples only with one phase read from an index (`PhasedSampler`);
    two phases split max_steps between them, and a stream plans its checkpoints' positions for max_steps."""
    old, new = grown["training.max_steps"]
    why = "its two phases split --max_steps (--phase2_fraction)" if len(recipe.phases) > 1 else ""
    why = why or ("it reads its corpus as a stream (--streaming)" if recipe.data.streaming else "")
    if why:
        raise ConfigurationError(
            f"--max_steps {new}: a run of {old} steps can be extended only when its steps keep their examples, and "
            f"{why}. Keep --max_steps {old}, or train the longer run in another --output_dir."
        )
