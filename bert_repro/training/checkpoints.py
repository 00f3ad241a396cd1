"""Which `checkpoint-N` folder a run resumes from: the newest one that Trainer can really load.

Trainer's own choice is the highest-numbered folder, whatever its state; a killed save leaves a truncated or partial
one, and resuming from it fails deep inside the library. Here each folder is checked cheaply (headers, no tensor
read), broken ones are reported and skipped (not deleted), and the newest complete one is used.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from pathlib import Path

from .cli import ConfigurationError

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def checkpoint_problem(folder: str | Path, *, streamed: bool = False) -> str | None:
    """Why Trainer could not resume from `folder`, or None when it looks complete. `streamed`: the run reads its
    corpus as a stream, whose position (`data_state-rank0.json`, written after Trainer's files) must be there too."""
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    if not any(folder.iterdir()):
        return "empty folder"
    state = folder / "trainer_state.json"
    if not state.is_file():
        return "trainer_state.json is missing"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: invalid JSON or bytes that are not UTF-8
        return f"trainer_state.json cannot be read ({err})"
    weights = _weight_files(folder)
    if not weights and not _sharded_fsdp_weights(folder):
        return "model.safetensors is missing"
    from safetensors import safe_open

    for path in weights:
        try:
            with safe_open(str(path), framework="pt"):
                pass  # the header is checked against the file size: a truncated file fails here
        except Exception as err:
            return f"{path.name} cannot be read ({err})"
    for path in sorted(folder.glob("*.pt")) + sorted(folder.glob("*.pth")) + sorted(folder.glob("*.bin")):
        # optimizer.pt, scheduler.pt, rng_state.pth (FSDP: optimizer.bin, pytorch_model_fsdp.bin): torch.save
        # writes a zip archive whose directory sits at the end of the file, so a truncated one is not a zip file.
        if not zipfile.is_zipfile(path):
            return f"{path.name} is truncated or not a torch file"
        if path.name != "training_args.bin" and (problem := _load_problem(path)):  # a pickle Trainer never loads
            return f"{path.name} cannot be loaded ({problem})"
    if streamed and not (folder / "data_state-rank0.json").is_file():
        return "data_state-rank0.json is missing (the stream's position)"
    for path in sorted(folder.glob("data_state-rank*.json")):  # a streamed run's position in its stream
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            return f"{path.name} cannot be read ({err})"
    return None


# The config fields that set the weights' shapes.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
SHAPE_FIELDS += ("max_position_embeddings", "type_vocab_size")


def check_fits(checkpoint: str | Path, config) -> None:
    """Another run's checkpoint (another vocabulary or size) is one line, not torch's size-mismatch traceback."""
    try:
        saved = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # FSDP's sharded checkpoints keep no config.json: left to Trainer
        return
    wrong = [
        f"{k} {saved[k]} there, {getattr(config, k)} here"
        for k in SHAPE_FIELDS
        if saved.get(k, getattr(config, k)) != getattr(config, k)
    ]
    if wrong:
        raise ConfigurationError(
            f"Cannot resume from {checkpoint}: its model is not this run's ({'; '.join(wrong)}). Resume a checkpoint "
            "of this run, or start it without --resume_from_checkpoint."
        )


def _load_problem(path: Path) -> str | None:
    """Why Trainer's own `torch.load` (weights only, numpy's types allowed) fails on `path`, or None: a file altered
    since its save (another archive, a pickle of other objects). The tensors are mapped, not read; no code runs."""
    import torch
    from transformers.trainer_pt_utils import safe_globals

    try:
        with safe_globals():
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises its own, pickle's and zip's errors
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"
    if path.name == "optimizer.pt" and not (isinstance(loaded, dict) and {"state", "param_groups"} <= loaded.keys()):
        return "not an optimizer's state: no state or param_groups"  # else Trainer's KeyError at every rerun
    return None


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return [index]  # reported as unreadable by safe_open
        return [folder / name for name in shards]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def _sharded_fsdp_weights(folder: Path) -> bool:
    """FSDP's SHARDED_STATE_DICT weights: a torch.distributed.checkpoint folder, its `.metadata` written last."""
    return any((shards / ".metadata").is_file() for shards in folder.glob("pytorch_model_fsdp_*") if shards.is_dir())


def checkpoint_step(folder: str | Path) -> int:
    """The optimizer step a `checkpoint-N` folder was saved at (Trainer names it by its global step)."""
    return int(_CHECKPOINT.fullmatch(Path(folder).name).group(1))


def checkpoints_newest_first(output_dir: str | Path) -> list[Path]:
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and _CHECKPOINT.fullmatch(p.name)]
    return sorted(folders, key=checkpoint_step, reverse=True)


class NoUsableCheckpoint(ConfigurationError):
    """Checkpoints exist but none can be resumed from; the message lists each one and why."""


def newest_valid_checkpoint(output_dir: str | Path, *, streamed: bool = False) -> Path | None:
    """The newest complete `checkpoint-N` in `output_dir` (None without any), logging each newer one skipped.
    `NoUsableCheckpoint` when none is complete."""
    skipped = []
    for folder in checkpoints_newest_first(output_dir):
        problem = checkpoint_problem(folder, streamed=streamed)
        if problem is None:
            if skipped:
                logger.warning("resuming from %s, the newest complete checkpoint", folder.name)
            return folder
        logger.warning("skipped %s: %s", folder.name, problem)
        skipped.append(f"{folder.name}: {problem}")
    if skipped:
        raise NoUsableCheckpoint(
            f"No checkpoint in {output_dir} can be resumed from ({'; '.join(skipped)}). Pass "
            "--overwrite_output_dir true to start the run again, or --resume_from_checkpoint PATH for a checkpoint "
            "kept elsewhere."
        )
    return None


def interrupted(recipe: str, output_dir: str | Path | None) -> int:
    """Ctrl-C: instead of a traceback, one line from the first process saying where the newest complete checkpoint
    is and how to go on. Returns SIGINT's exit status (130)."""
    import os
    import sys

    found = sorted(
        (p for p in Path(output_dir).rglob("checkpoint-*") if _CHECKPOINT.fullmatch(p.name) and p.is_dir())
        if output_dir is not None and Path(output_dir).is_dir()
        else (),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    newest = next((p for p in found if checkpoint_problem(p) is None), None)
    if newest is not None:
        said = f"the newest checkpoint is {newest}; the same command with --resume_from_checkpoint true goes on from it"
    else:
        said = "no checkpoint was saved yet (--save_steps / --save_strategy): the same command starts again"
    if os.environ.get("RANK", "0") == "0":
        print(f"{recipe}: interrupted: {said}.", file=sys.stderr)
    return 130
