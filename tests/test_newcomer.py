"""A newcomer's first hour: the quick start runs offline on the corpus shipped with the project, and bad input
(text that is not UTF-8, a corpus with no text, a missing optional package) gets one clear message, exit code 2,
no traceback and nothing lost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "recipes" / "data" / "quickstart_corpus"


def pretrain(*args, cwd=ROOT, env=None, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "recipes" / "pretrain.py"), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_shipped_corpus_is_documented_and_text():
    readme = (SHIPPED / "README.md").read_text()
    files = sorted(SHIPPED.rglob("*.txt"))
    assert len(files) == 68
    for path in files:
        assert path.name in readme or path.parent.name == "state_union", path
        text = path.read_bytes().decode("utf-8")  # UTF-8, as shipped
        assert "gutenberg" not in text.lower(), path  # the licence asks for no trademark in a redistribution
    assert sum(p.stat().st_size for p in files) < 5_000_000
    assert "public domain" in readme and "17 U.S.C." in readme


@pytest.mark.slow
def test_quickstart_config_runs_offline_without_corpus(tmp_path):
    """The README's first command with no Hub access and no --corpus (a few steps on part of the corpus)."""
    out = tmp_path / "quickstart"
    result = pretrain("--config", "recipes/configs/quickstart.yaml", "--output_dir", out, "--max_documents", 8,
                      "--dupe_factor", 1, "--max_steps", 2, "--warmup_steps", 1, "--eval_steps", 2,
                      "--save_steps", 2, "--eval_max_examples", 16, "--report_to", "none", "--plot", "false",
                      "--disable_tqdm", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "pin_memory" not in result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["global_step"] == 2 and "eval_mlm_accuracy" in results
    corpus = json.loads((out / "run_config.json").read_text())["run"]["corpus"]
    assert all("quickstart_corpus" in c for c in corpus)
