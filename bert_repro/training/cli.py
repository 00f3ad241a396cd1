"""What the recipes share: `HfArgumentParser` with the recipe's defaults < a `--config` YAML < the command line,
user-facing configuration errors, and the rule that an output directory holding another run is never overwritten.
Nothing given is dropped without a word: transformers' names for our settings are taken, other unknown ones refused.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import sys
from collections.abc import Collection, Mapping
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import HfArg

from ..model.configuration_bert_repro import ONE_GRAPH_SWITCHES, SPEED_SWITCHES

logger = logging.getLogger(__name__)


def _no_load_report(record: logging.LogRecord) -> bool:
    """Drops transformers' LOAD REPORT (we name a new head in one line) unless it reports a shape mismatch."""
    message = record.getMessage()
    return "LOAD REPORT" not in message or "MISMATCH" in message


def quiet_load_reports() -> None:
    """Called once by each recipe (library users keep transformers' own report)."""
    target = logging.getLogger("transformers.modeling_utils")
    if _no_load_report not in target.filters:
        target.addFilter(_no_load_report)


class ConfigurationError(ValueError):
    """Settings that cannot work together; the recipes print the message without a traceback."""


def field_names(*classes: type) -> set[str]:
    return {f.name for cls in classes for f in fields(cls) if f.init}


def flag(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, **metadata: Any) -> Any:
    """A recipe's setting: transformers' `HfArg`, default first. HfArgumentParser passes a field's metadata to
    `add_argument`: `help`, `choices`, `metavar`, and `group`, the section of `--help` showing it (`RecipeParser`)."""
    return HfArg(default=default, default_factory=factory, help=help, metadata=metadata)


@dataclass
class _SpeedSwitchesBase:
    compile_layers: bool = flag(
        False, "Speed: torch.compile each Transformer block (regional compilation; seconds to compile).", group="speed"
    )

    def switches(self) -> dict[str, bool]:
        """The config fields among these switches (compile_layers is a method of the model instead)."""
        return {name: getattr(self, name) for name in SPEED_SWITCHES}

    def torch_compile_warning(self, torch_compile: bool) -> str | None:
        """The log line for `--torch_compile true` with switches that dynamo breaks into graphs (benchmarks/LOG.md)."""
        split = [name for name, on in self.switches().items() if on and name not in ONE_GRAPH_SWITCHES]
        if not torch_compile or not split:
            return None
        does = "this switch does" if len(split) == 1 else "these switches do"
        names = ", ".join("--" + name for name in split)
        return (
            f"--torch_compile true with {names}: {does} not compile to one graph (graph breaks each "
            'step, no CUDA graph); the defaults do. See benchmarks/LOG.md, "torch.compile".'
        )


# A flag per config speed switch (`SPEED_SWITCHES`) and --compile_layers; each default keeps the plain model's outputs.
SpeedSwitches = make_dataclass(
    "SpeedSwitches",
    [(name, bool, flag(False, help, group="speed")) for name, help in SPEED_SWITCHES.items()],
    bases=(_SpeedSwitchesBase,),
)
SpeedSwitches.__module__ = __name__


def as_cli(values: dict[str, Any]) -> list[str]:
    """{field: value} -> ["--field", "value", ...] (lists as several values, mappings as JSON)."""
    argv: list[str] = []
    for key, value in values.items():
        if value is not None:
            value = json.dumps(value) if isinstance(value, dict) else value
            argv += [f"--{key}", *map(str, value if isinstance(value, (list, tuple)) else [value])]
    return argv


# transformers' example scripts' flags (run_glue.py, run_qa.py, run_mlm.py) -> our setting: the first of these that
# the recipe has ("data:train": a train=path pair of --data).
TRANSFORMERS_NAMES = {
    "model_name_or_path": ("model", "init_from"),
    "task_name": ("task",),
    "dataset_name": ("task", "corpus"),
    "dataset_config_name": ("hub_config",),
    "tokenizer_name": ("tokenizer",),
    "train_file": ("data:train", "corpus"),
    "validation_file": ("data:validation",),
    "test_file": ("data:test",),
    "preprocessing_num_workers": ("num_proc",),
    "mlm_probability": ("masked_lm_prob",),
}
ALSO_SETS = {"init_from": "tokenizer"}  # run_mlm.py's --model_name_or_path is its tokenizer too, unless one is given


# transformers' flags without a counterpart, with what to use instead (--line_by_line is not --split_lines).
TRANSFORMERS_WITHOUT_COUNTERPART = {
    "line_by_line": "run_mlm.py's one example per line; here examples are sentence pairs filled up to "
    "--max_seq_length from documents, as the paper's. --split_lines true reads each line as a sentence, "
    "--document_boundary tells documents apart",
    "validation_file": "the held-out documents are drawn from --corpus and never trained on (--eval_fraction, "
    "--eval_max_examples)",
}


def _flag(token: str) -> str | None:
    """The field a token names ("--seed=3" -> "seed"); None for a value (as for argparse, one with a space)."""
    if token.startswith("--") and len(token) > 2 and " " not in token:
        return token[2:].split("=", 1)[0].replace("-", "_")
    return None


def closest(name: str, names: set[str], prefix: str = "--") -> str:
    """' (did you mean --a or --b?)' with the names closest to `name` (or containing it), or ''."""
    close = (
        difflib.get_close_matches(name, sorted(names), n=3)
        or [other for other in sorted(names) if len(name) > 3 and name in other][:3]
    )  # --epochs
    return f" (did you mean {' or '.join(prefix + c for c in close)}?)" if close else ""


_CREDENTIAL = re.compile(r"--[\w-]*(token|api_key|secret|password)")


def hide_credentials(argv: list[str]) -> list[str]:
    """`argv` as reports and logs show it: a credential's value (--hub_token X, --hub_token=X) replaced by HIDDEN."""
    shown: list[str] = []
    for i, token in enumerate(argv):
        flag, equals, _ = token.partition("=")
        if equals and _CREDENTIAL.fullmatch(flag):
            token = f"{flag}=HIDDEN"
        elif i and _CREDENTIAL.fullmatch(argv[i - 1]):
            token = "HIDDEN"
        shown.append(token)
    return shown


def hide_secrets(tokens: list[str], argv: list[str]) -> list[str]:
    """`tokens` (leftovers of `argv`) with any credential's value given in `argv` replaced by HIDDEN: a value given
    twice (--hub_token T T) is left over without its flag."""
    secrets = {t for t, shown in zip(argv, hide_credentials(argv)) if t != shown}
    secrets |= {t.partition("=")[2] for t in secrets if "=" in t}
    return ["HIDDEN" if t in secrets else t for t in hide_credentials(tokens)]


def use_our_names(argv: list[str], known: set[str], also_given: set[str] = frozenset()) -> tuple[list[str], set[str]]:
    """`argv` with transformers' names (`TRANSFORMERS_NAMES`) replaced by ours, and the fields it sets. Two names for
    one field are refused, except split=path pairs of --data; `ALSO_SETS` yields to a field given here or in
    `also_given` (a --config file's)."""
    starts = [i for i, token in enumerate(argv) if i == 0 or _flag(token) is not None]  # each flag and its values
    named = []  # (our field, "" if unknown: refused by `check_names`; its tokens in our names; its values)
    spellings: dict[str, dict[str, None]] = {}  # field -> its flags as given, in order
    implied: dict[str, list[str]] = {}
    for tokens in (argv[start:end] for start, end in zip(starts, [*starts[1:], len(argv)])):
        name, (flag, *values) = _flag(tokens[0]), tokens[0].split("=", 1) + tokens[1:]
        theirs = (name,) if name in known else TRANSFORMERS_NAMES.get(name, ())
        ours = next((o for o in theirs if o.split(":")[0] in known), None)
        field, _, split = (ours or "").partition(":")
        values = [f"{split}={v}" for v in values] if split else values
        if ours and ours != name:
            tokens = [f"--{field}", *values]
            implied.update({ALSO_SETS[field]: values} if field in ALSO_SETS else {})
        named.append((field, tokens, values))
        spellings.setdefault(field, {})[flag] = None
    out: list[str] = []
    for field, tokens, _ in named:
        if not field or len(spellings[field]) == 1:
            out += tokens
        elif f"--{field}" not in out:  # one field, several names: split=path pairs only, together
            merged = [v for other, _, values in named if other == field for v in values]
            if not all("=" in v for v in merged):
                raise ConfigurationError(f"{' and '.join(spellings[field])} both set --{field}; give one of them.")
            out += [f"--{field}", *merged]
    given = set(spellings) - {""}
    defaults = [t for f, values in implied.items() if f not in given | set(also_given) for t in (f"--{f}", *values)]
    return defaults + out, given


def check_names(parser: HfArgumentParser, args: list[str], known: set[str], recipe: str) -> None:
    """Refuse what the recipe does not know, each unknown flag with the closest of our names."""
    _, unknown = parser.parse_known_args(args=args)
    if not unknown:
        return
    notes = dict.fromkeys(TRANSFORMERS_NAMES, f"transformers' name, which {recipe} has no setting for")
    notes |= TRANSFORMERS_WITHOUT_COUNTERPART
    said = [f"--{n}" + (f" ({notes[n]})" if n in notes else closest(n, known)) for n in map(_flag, unknown) if n]
    raise ConfigurationError(
        f"unknown argument(s): {'; '.join(said) or ' '.join(hide_secrets(unknown, args))}. See python {recipe} --help."
    )


def read_yaml_config(path: str | Path, dataclass_types: tuple[type, ...], recipe: str) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Config file {path} does not exist.")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigurationError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}).") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigurationError(f"{path}{where}: not valid YAML ({problem}).") from None
    if not isinstance(values, dict):
        raise ConfigurationError(f"{path}: expected a mapping of field: value, got {type(values).__name__}.")
    known = field_names(*dataclass_types)
    unknown = sorted(set(values) - known)
    if unknown:
        said = "; ".join(f"{name}{closest(name, known, prefix='')}" for name in unknown)
        raise ConfigurationError(f"{path}: unknown field(s) {said}; see `python {recipe} --help`.")
    return values


def grids_from_single_values(
    parsed: tuple, grids: Mapping[str, str], given: set[str], in_config: set[str], config: str | None
) -> None:
    """--learning_rate X (or --seed S) is the grid {X}, not a value the grid replaces; both in one place: refused."""
    holder = {f.name: obj for obj in parsed for f in fields(obj)}
    for single, grid in grids.items():
        for names, where in ((given, "on the command line"), (in_config, f"in {config}")):
            if single in names and grid in names:
                raise ConfigurationError(
                    f"--{single} and --{grid} both given {where}: --{single} X runs the "
                    f"grid {{X}}, --{grid} the values listed; give one of them."
                )
        chosen = given if single in given or grid in given else in_config
        if single in chosen:
            setattr(holder[grid], grid, [getattr(holder[single], single)])


# The recipes' sections of `--help`, in this order: a flag's `group` -> its title.
SECTIONS = {
    **{"data": "data", "model": "model", "speed": "model speed switches (the same training, faster)"},
    **{"training": "training", "evaluation": "evaluation", "output": "output and Hub"},
}


@dataclass(frozen=True)
class HelpLayout:
    """How a recipe's `--help` reads: its flags by section, then the rest of Trainer's. Our flags name their section
    (`flag(group=...)`, or their dataclass's `help_group`); `groups` places others' (Trainer's)."""

    titles: dict[str, str] = field(default_factory=lambda: SECTIONS)  # group -> its section's title, in this order
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> fields of others' dataclasses in it
    set_by_recipe: dict[str, str] = field(default_factory=dict)  # Trainer field -> what the recipe sets it from
    helps: dict[str, str] = field(default_factory=dict)  # field -> help text that replaces transformers'
    shown_defaults: dict[str, str] = field(default_factory=dict)  # field -> the default a run uses, if not the parser's
    metavars: dict[str, str] = field(default_factory=dict)
    usage: str = "[--config FILE.yaml] [--field value ...]"
    epilog: str | None = None  # printed after the flags


TRAINING_ARGUMENTS_DOCS = "huggingface.co/docs/transformers/main_classes/trainer"
TRAINERS = "transformers' TrainingArguments (Trainer's own flags; those marked [set by the recipe] are overridden)"
CONFIG_HELP = (
    "A YAML file of field: value pairs, any flag below (recipes/configs/). Precedence: the recipe's defaults "
    "(shown below) < this file < the command line."
)


class RecipeParser(HfArgumentParser):
    """HfArgumentParser; given a `layout`, a parser for `--help` only. HfArgumentParser calls `add_argument` once a
    field, with the field's metadata: there each flag goes to its section (stages, each holding several dataclasses'
    flags, Trainer's among them: not HfArgumentParser's one group a dataclass), by one name with a short value name
    (--vocab_size N); Trainer's other flags are listed by name."""

    def __init__(self, dataclass_types, layout: HelpLayout | None = None, recipe: str = "", valued: Collection = ()):
        self.layout, self.valued, self.sections = layout, set(valued), {}
        if layout is None:  # No abbreviations: --learning_rat is not taken for --learning_rate.
            super().__init__(dataclass_types, allow_abbrev=False)
            return
        of_layout = {name: group for group, names in layout.groups.items() for name in names}
        self.group_of = {  # a flag's group, else its dataclass's `help_group`, else the layout's
            f.name: f.metadata.get("group", getattr(c, "help_group", None)) or of_layout.get(f.name)
            for c in dataclass_types
            for f in fields(c)
        }
        shown = {*layout.set_by_recipe, *self.valued}
        rest = ", ".join(f"--{name}" for name, group in self.group_of.items() if not group and name not in shown)
        self.rest = rest and f"Each a flag, as TrainingArguments documents it ({TRAINING_ARGUMENTS_DOCS}): {rest}"
        super().__init__(dataclass_types, usage=f"python {recipe} {layout.usage}", epilog=layout.epilog)
        super().add_argument("--config", metavar="FILE.yaml", help=CONFIG_HELP, default=argparse.SUPPRESS)

    def add_argument(self, *names: str, **kwargs: Any) -> Any:
        kwargs.pop("group", None)  # our `flag`'s, read in `group_of`; argparse has no such argument
        layout = self.layout
        if layout is None or names[0] == "-h":  # parsing: every name, one section
            return super().add_argument(*names, **kwargs)
        name = names[0][2:]
        group = self.group_of.get(name)  # a bool's --no_x has none, and --x false says the same
        if not (group or name in layout.set_by_recipe or name in self.valued) or kwargs.get("action") == "store_false":
            return None  # Trainer's others are named in their section's description
        if not self.sections:  # the layout's sections in its order, then Trainer's
            self.sections = {g: self.add_argument_group(title) for g, title in layout.titles.items()}
            self.sections[None] = self.add_argument_group(TRAINERS, self.rest or None)
        if group not in self.sections:
            self.sections[group] = self.add_argument_group(group)
        kwargs["help"] = layout.helps.get(name, kwargs.get("help") or "")
        if name in layout.set_by_recipe:
            kwargs["help"] = f"[set by the recipe: {layout.set_by_recipe[name]}] {kwargs['help']}"
        short = None if kwargs.get("choices") else {int: "N", float: "X"}.get(kwargs.get("type"))
        short = "BOOL" if kwargs.get("const") is True else short  # HfArgumentParser's bool: --x [BOOL]
        kwargs["metavar"] = layout.metavars.get(name) or kwargs.get("metavar") or short
        return self.sections[group].add_argument(names[0], **kwargs)


def parse_with_config(
    dataclass_types: tuple[type, ...],
    defaults: dict[str, Any],
    argv: list[str] | None,
    recipe: str,
    grids: Mapping[str, str] | None = None,
    help_layout: HelpLayout | None = None,
) -> tuple:
    """Parse `dataclass_types` from defaults < `--config FILE.yaml` < the command line (`grids`: {single: grid})."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config_values: dict[str, Any] = {}
    config = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 == len(argv):
            raise ConfigurationError("--config needs a YAML file.")
        config = argv[i + 1]
        config_values = read_yaml_config(config, dataclass_types, recipe)
        del argv[i : i + 2]
    known = field_names(*dataclass_types)
    argv, given = use_our_names(argv, known, set(config_values))
    if "-h" in argv or "--help" in argv:
        # --help shows the values a run will use (the recipe's defaults and the --config file's), not the dataclasses'.
        values = {**defaults, **config_values}
        layout = help_layout or HelpLayout()
        parser = RecipeParser(dataclass_types, layout, recipe, values)
        parser.set_defaults(**{key: value for key, value in values.items() if value is not None})
        parser.set_defaults(**{key: shown for key, shown in layout.shown_defaults.items() if key not in config_values})
        parser.print_help()
        parser.exit()
    parser = RecipeParser(dataclass_types)
    args = auto_bf16(as_cli(defaults) + as_cli(config_values) + argv)
    check_names(parser, args, known, recipe)
    try:
        parsed = parser.parse_args_into_dataclasses(args=args)
    except ValueError as err:  # the dataclasses' own checks, e.g. TrainingArguments' `--bf16 true` on a CPU
        raise ConfigurationError(" ".join(str(err).split())) from None
    grids_from_single_values(parsed, grids or {}, given, set(config_values), config)
    return parsed


def values_of(args: list[str], name: str) -> list[str]:
    """Each value of --`name` in `args`, in order (a bare boolean flag: "true")."""
    values = []
    for i, token in enumerate(args):
        if _flag(token) == name:
            _, equals, after = token.partition("=")
            values.append(after if equals else next((v for v in args[i + 1 : i + 2] if _flag(v) is None), "true"))
    return values


def auto_bf16(args: list[str]) -> list[str]:
    """`--bf16 auto`: bf16 where a CUDA device has it, else float32 (transformers refuses `--bf16 true` without a
    GPU, and on CPU bf16 is many times slower). A later --bf16 true|false overrides it."""
    values = values_of(args, "bf16")
    if "auto" not in values:
        return args
    value = values[-1]
    if value == "auto":
        import torch

        use_cpu = (values_of(args, "use_cpu") or ["false"])[-1].lower() in ("true", "1", "yes")
        value = str(not use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported()).lower()
        if value == "false":
            logger.warning("bf16: auto: %s, so training in float32", "--use_cpu" if use_cpu else "no CUDA device")
    flag = [_flag(token) == "bf16" and "=" not in token for token in args]
    kept = [t for i, t in enumerate(args) if _flag(t) != "bf16" and not (i and flag[i - 1] and _flag(t) is None)]
    return [*kept, "--bf16", value]


def check_attention(name: str) -> None:
    """--attn_implementation: eager, a kernel transformers registered, or a Hub kernel (`org/repo`)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    known = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    if name not in known and "/" not in name:
        close = closest(name, set(known), prefix="")
        raise ConfigurationError(
            f"--attn_implementation {name}: not a kernel transformers knows{close}; one of {', '.join(known)}."
        )


def check_tokenizer(name: str) -> None:
    from ..data.wordpiece import load_tokenizer

    try:
        load_tokenizer(name)
    except (OSError, ValueError) as err:
        raise ConfigurationError(f"--tokenizer {name}: {' '.join(str(err).split())}") from None


def importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def fit_to_this_machine(training) -> None:
    """No pinned memory without an accelerator (torch warns on every data loader); no tensorboard logs without it."""
    if training.dataloader_pin_memory and (training.use_cpu or not accelerator_available()):
        training.dataloader_pin_memory = False
    if training.report_to and "tensorboard" in training.report_to and not importable("tensorboard"):
        logger.warning("tensorboard is not installed (pip install 'bert-repro[train]'): not writing its logs")
        training.report_to = [r for r in training.report_to if r != "tensorboard"]


def check_trainer_settings(training) -> None:
    """Trainer's flags that Trainer or torch refuse only once training starts, refused before work."""
    import torch
    from transformers import get_scheduler

    if (training.fp16 or training.fp16_full_eval) and training.device.type == "cpu":  # as Trainer refuses --bf16
        raise ConfigurationError(
            "--fp16 true: half precision needs a GPU, and this run is on the CPU; leave it out (or pass --bf16 true, "
            "which a CPU may support)."
        )
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if launcher != "no" and training.device.type == "cpu" and not (launcher == "bf16" and training.bf16):
        # Accelerate would autocast every step to the launcher's precision while the run records float32.
        raise ConfigurationError(
            f"the launcher's mixed_precision is {launcher} (its --config_file) and this run is float32 on the CPU; "
            "launch with recipes/accelerate/ddp_cpu.yaml (mixed_precision: no), or pass --bf16 true to train in bf16."
        )
    context = training.dataloader_multiprocessing_context
    given = [f"--dataloader_multiprocessing_context {context}"] if context is not None else []
    given += ["--dataloader_persistent_workers true"] if training.dataloader_persistent_workers else []
    if given and training.dataloader_num_workers == 0:
        raise ConfigurationError(
            f"{' and '.join(given)}: a setting of data-loading processes; add --dataloader_num_workers N (N > 0)."
        )
    if training.lr_scheduler_kwargs:
        stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        try:
            get_scheduler(
                training.lr_scheduler_type,
                stand_in,
                num_warmup_steps=0,
                num_training_steps=10,
                scheduler_specific_kwargs=training.lr_scheduler_kwargs,
            )
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                f"--lr_scheduler_kwargs {json.dumps(training.lr_scheduler_kwargs)} with --lr_scheduler_type "
                f"{getattr(training.lr_scheduler_type, 'value', training.lr_scheduler_type)}: {err}"
            ) from None


def accelerator_available() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6; CUDA only before
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
