"""Damaged model directories and checkpoints: a pickle that would run code, weights cut short, a broken config,
hand-made checkpoint folders."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


class RunsCode:
    """Unpickled, it would create the file `path`: what a malicious pickle does."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def damage_model_dir(directory: Path, problem: str) -> str:
    """Give a saved model directory one problem: "pickle" (its weights only as a pytorch_model.bin that would
    create `directory / "ran"` if unpickled), "truncated" (model.safetensors cut short) or "config" (a broken
    config.json). Returns the start of the message that names the problem."""
    weights = directory / "model.safetensors"
    if problem == "pickle":
        weights.unlink()
        torch.save(
            {"bert.pooler.dense.bias": torch.zeros(32), "code": RunsCode(directory / "ran")},
            directory / "pytorch_model.bin",
        )
        return f"{directory} holds its weights only as a pickle (pytorch_model.bin), which is not opened"
    if problem == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
        return f"{weights} cannot be read as safetensors (Error while deserializing header: incomplete"
    assert problem == "config", problem
    (directory / "config.json").write_text('{"hidden_size": 32,\n')
    return f"{directory / 'config.json'} is not a valid config.json (Expecting property name"


def fake_checkpoint(folder, step):
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    torch.save({"state": {}, "param_groups": []}, folder / "optimizer.pt")
    return folder


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
