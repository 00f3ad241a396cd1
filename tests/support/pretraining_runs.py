"""Pre-training runs through the real launcher: a tiny run's config file, a corpus of the first documents, the
launch itself (`accelerate launch recipes/pretrain.py`) and the weights it leaves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from safetensors.torch import load_file

from support import ROOT


def write_config(path, corpus, tokenizer, **overrides):
    config = {
        "corpus": [str(corpus)],
        "document_boundary": "file",
        "tokenizer": str(tokenizer),
        "preset": "tiny",
        "model_overrides": {
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
        "max_seq_length": 32,
        "max_predictions_per_seq": 5,
        "dupe_factor": 2,
        "phase2_fraction": 0.25,
        "phase2_max_seq_length": 64,
        "phase2_max_predictions_per_seq": 10,
        "global_batch_size": 8,
        "per_device_train_batch_size": 8,
        "max_steps": 8,
        "warmup_steps": 2,
        "learning_rate": 0.002,
        "logging_steps": 1,
        "save_steps": 4,
        "eval_steps": 4,
        "eval_fraction": 0.2,
        "use_cpu": True,
        "report_to": "none",
        "disable_tqdm": True,
        "num_proc": 1,
        "plot": False,
        **overrides,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def first_documents(corpus: Path, folder: Path, n: int) -> Path:
    """A corpus folder holding copies of the fixture corpus's first `n` documents."""
    folder.mkdir()
    for path in sorted(corpus.glob("*.txt"))[:n]:
        (folder / path.name).write_text(path.read_text())
    return folder


# `accelerate launch` of one plain process, whatever the machine's accelerate config says.
ONE_PROCESS = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def run_recipe(recipe, *args, launcher=None, check=False, env=None, timeout=900):
    """`python recipes/RECIPE ARGS`, or `accelerate launch LAUNCHER recipes/RECIPE ARGS`: offline, from the
    repository root (the DeepSpeed configs name their JSON from it). check: assert that it succeeded."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    start = [sys.executable] if launcher is None else [sys.executable, "-m", "accelerate.commands.launch", *launcher]
    cmd = [*start, str(ROOT / "recipes" / recipe), *map(str, args)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def accelerate_launch(launcher, recipe, *args, check=True, env=None):
    return run_recipe(recipe, *args, launcher=launcher, check=check, env=env)


def hide_packages(tmp_path, *names) -> dict:
    """An environment in which `import NAME` fails for each name, as where the extra that installs it is missing."""
    for name in names:
        fake = tmp_path / "hidden" / name
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(f"raise ImportError('{name} hidden by the test')\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "hidden"), os.environ.get("PYTHONPATH", "")])}


def launch(config, output_dir, *extra, processes=1, check=True, env=None):
    """A pre-training run of `config`: one process, or two DDP processes on CPU (gloo) with the shipped config."""
    launcher = (
        ["--config_file", str(ROOT / "recipes" / "accelerate" / "ddp_cpu.yaml")] if processes == 2 else ONE_PROCESS
    )
    args = ("--config", config, "--output_dir", output_dir, *extra)
    return accelerate_launch(launcher, "pretrain.py", *args, check=check, env=env)


def weights(directory):
    return load_file(Path(directory) / "model.safetensors")
