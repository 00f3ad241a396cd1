"""What the recipes share: YAML configs with command-line overrides, user-facing configuration errors, and the
rule that an output directory holding another run is never overwritten.

Each recipe parses a tuple of dataclasses (its own arguments, transformers' `TrainingArguments`, ...) with
`HfArgumentParser`. Precedence: the recipe's defaults (the paper's hyper-parameters) < a YAML file given with
`--config` < the command line.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser


RUN_CONFIG = "run_config.json"
RUN_LOCK = "run.lock"  # held by the run writing into the directory (bert_repro.training.cluster)


class _LoadReportFilter(logging.Filter):
    """Drops transformers' LOAD REPORT table unless it reports a shape mismatch.

    The table lists the checkpoint's weights a model does not use and the weights it initialises; when a recipe
    builds a task head on a pre-trained checkpoint both are expected (the MLM/NSP heads unused, the classifier new),
    and our `from_pretrained` already names the new weights in one line. A mismatch of shapes is an error whose
    message points at the table, so that table stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "LOAD REPORT" not in message or "MISMATCH" in message


def quiet_load_reports() -> None:
    """Called once by each recipe (library users keep transformers' own report)."""
    target = logging.getLogger("transformers.modeling_utils")
    if not any(isinstance(f, _LoadReportFilter) for f in target.filters):
        target.addFilter(_LoadReportFilter())


class ConfigurationError(ValueError):
    """Settings that cannot work together; the recipes print the message without a traceback."""


@dataclass
class SpeedSwitches:
    """The model's speed switches, shared by the recipes; each default keeps the plain model's outputs."""

    unpad_inputs: bool = field(default=False, metadata={
        "help": "Speed: run the encoder on the real tokens only, padding removed (same outputs at real tokens)."})
    compile_layers: bool = field(default=False, metadata={
        "help": "Speed: torch.compile each Transformer block (regional compilation; seconds to compile)."})
    fast_dropout: bool = field(default=False, metadata={
        "help": "Speed on CPU: dropout masks from 15-bit random numbers (p rounded to a multiple of 1/32768)."})
    last_layer_subset: bool = field(default=False, metadata={
        "help": "Speed: the last Transformer block computes only the positions the heads read ([CLS], masked "
                "positions); the same losses and logits."})
    tied_gradients: bool = field(default=False, metadata={
        "help": "Speed: the token lookup adds its gradient rows into the tied MLM decoder's gradient (one "
                "vocab-sized buffer instead of three); the same gradients."})

    def switches(self) -> dict[str, bool]:
        """The config fields among these switches (compile_layers is a method of the model instead)."""
        return {name: getattr(self, name) for name in ("unpad_inputs", "fast_dropout", "last_layer_subset",
                                                      "tied_gradients")}


def as_cli(values: dict[str, Any]) -> list[str]:
    """{field: value} -> ["--field", "value", ...] (lists as several values, mappings as JSON)."""
    argv: list[str] = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, dict):
            value = json.dumps(value)
        if isinstance(value, (list, tuple)):
            argv += [f"--{key}", *map(str, value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def read_yaml_config(path: str | Path, dataclass_types: tuple[type, ...], recipe: str) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Config file {path} does not exist.")
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ConfigurationError(f"{path}: expected a mapping of field: value, got {type(values).__name__}.")
    known = {f.name for cls in dataclass_types for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigurationError(f"{path}: unknown field(s) {unknown}; see `python {recipe} --help`.")
    return values


def parse_with_config(dataclass_types: tuple[type, ...], defaults: dict[str, Any], argv: list[str] | None,
                      recipe: str) -> tuple:
    """Parse `dataclass_types` from defaults < `--config FILE.yaml` < the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config_values: dict[str, Any] = {}
    if "--config" in argv:
        i = argv.index("--config")
        config_values = read_yaml_config(argv[i + 1], dataclass_types, recipe)
        del argv[i : i + 2]
    parser = HfArgumentParser(dataclass_types)
    if "-h" in argv or "--help" in argv:
        # --help shows the values a run will use (the recipe's defaults and the --config file), not the dataclasses'.
        parser.set_defaults(**{key: value for key, value in {**defaults, **config_values}.items() if value is not None})
    try:
        return parser.parse_args_into_dataclasses(args=as_cli(defaults) + as_cli(config_values) + argv)
    except ValueError as err:  # the dataclasses' own checks, e.g. TrainingArguments' `--bf16 true` on a CPU
        raise ConfigurationError(" ".join(str(err).split())) from None


def _differences(old: dict, new: dict) -> list[str]:
    out = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out.append(f"{section}.{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return out


def check_output_dir(output_dir: str | Path, record: dict, *, resume: bool, overwrite: bool,
                     identity: Callable[[dict], dict] | None = None) -> None:
    """Refuse to write into a directory that holds something else, with a message that says what to do.

    `identity` (the function that made `record`) is applied to the saved record too, so that a field that no
    longer identifies a run (one a later version lets change on resumption) does not make an old run "different".
    """
    out = Path(output_dir)
    if overwrite or not out.exists() or not any(p.name != RUN_LOCK for p in out.iterdir()):
        return
    saved = out / RUN_CONFIG
    if not saved.exists():
        raise FileExistsError(
            f"{out} is not empty and holds no bert_repro run ({RUN_CONFIG} missing). Choose another output_dir, "
            "or pass --overwrite_output_dir true to write into it anyway."
        )
    old = json.loads(saved.read_text())
    differences = _differences(identity(old) if identity else old, record)
    if differences:
        shown = "; ".join(differences[:6]) + (" ..." if len(differences) > 6 else "")
        raise FileExistsError(
            f"{out} holds a different run ({shown}). Choose another output_dir, or pass --overwrite_output_dir true."
        )
    has_checkpoints = any(out.glob("checkpoint-*"))
    if (out / "model.safetensors").exists() and not resume:
        raise FileExistsError(f"{out} already holds this finished run; pass --overwrite_output_dir true to redo it.")
    if has_checkpoints and not resume:
        raise FileExistsError(
            f"{out} already holds checkpoints of this run; pass --resume_from_checkpoint true to continue it, or "
            "--overwrite_output_dir true to start again."
        )


def write_run_config(output_dir: str | Path, record: dict) -> None:
    """Create the output directory and record the run in it; a directory that cannot be written (read-only,
    a file in its path) is a `ConfigurationError` that names it, raised before any work is done."""
    out = Path(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_CONFIG).write_text(json.dumps(record, indent=2))
    except OSError as error:
        raise ConfigurationError(
            f"cannot write to the output directory {out}: {error.strerror or error} ({error.filename}). "
            "Choose another --output_dir, one you can write to."
        ) from None


def take_push_request(training) -> dict[str, Any] | None:
    """`--push_to_hub --hub_model_id ID` is done by `bert_repro.hub.push` at the end, not by Trainer, whose own push
    would upload pickles (training_args.bin) and no model card."""
    if not training.push_to_hub:
        return None
    if not training.hub_model_id:
        raise ConfigurationError("--push_to_hub needs --hub_model_id (e.g. your-name/bert-base-repro).")
    from ..hub.push import HubPushError, check_hub_access

    try:  # now, not after training: a wrong id, a refused token or no network fail in seconds
        check_hub_access(training.hub_model_id, token=training.hub_token)
    except HubPushError as err:
        raise ConfigurationError(str(err)) from None
    request = {"repo_id": training.hub_model_id, "private": bool(training.hub_private_repo),
               "revision": training.hub_revision}
    training.push_to_hub = False
    return request


def pin_memory_only_with_an_accelerator(training) -> None:
    """Pinned memory only speeds copies to an accelerator; without one torch warns on every data loader."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6; CUDA only before
    available = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    if training.dataloader_pin_memory and (training.use_cpu or not available):
        training.dataloader_pin_memory = False
