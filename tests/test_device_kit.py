"""benchmarks/run_gpu.sh on an emulated GPU machine gone wrong: no CUDA, an nvidia-smi that never returns, a
network that accepts connections and never answers (index, proxy, Hub), and a `python` that is not the one with
torch. The script must end by itself within a minute, say "no CUDA", and leave nothing running."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def processes_running(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(proc.name)
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_device_script_ends_cleanly_without_cuda_and_network(tmp_path):
    hole = socket.socket()  # a black hole: the connection is accepted into the backlog, no byte ever comes back
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hang = bin_dir / "hang-in-nvidia-smi"
    shutil.copy(shutil.which("sleep"), hang)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{hang} 600 &\nwait\n")  # a child that outlives a plain kill
    (bin_dir / "python").write_text("#!/bin/sh\necho 'No module named torch' >&2\nexit 1\n")  # a venv-less python
    for name in ("nvidia-smi", "python"):
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PIP_", "TRANSFORMERS_"))}
    env.update(PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}", CUDA_VISIBLE_DEVICES="",
               HTTP_PROXY=url, HTTPS_PROXY=url, http_proxy=url, https_proxy=url, PIP_INDEX_URL=f"{url}/simple",
               HF_ENDPOINT=url, OUT=str(tmp_path / "out"), RESULTS=str(tmp_path / "results"),
               KIT=str(tmp_path / "no-kit"), PARTS="tests bench train", BUDGET="50", PROBE_LIMIT="30")
    start = time.monotonic()
    try:
        run = subprocess.run(["bash", str(ROOT / "benchmarks/run_gpu.sh")], env=env, capture_output=True, text=True,
                             timeout=120)
    finally:
        hole.close()
    seconds = time.monotonic() - start
    assert run.returncode == 3, run.stdout + run.stderr  # 3: no CUDA, the CUDA parts skipped
    assert seconds < 60, run.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "no CUDA" in summary
    assert "KILLED" in (tmp_path / "results" / "nvidia_smi.log").read_text()
    assert not processes_running(str(hang)), "the hung nvidia-smi's child is still running"
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    by_name = {s["name"]: s for s in results["steps"]}
    assert by_name["nvidia_smi"]["exit"] == 137
    assert by_name["import_torch_1"]["exit"] == 3  # torch imports, without CUDA
    assert results["cuda"] is None and results["benchmark"] == [] and results["pretraining"] is None
    assert f"python: {Path(sys.executable).parent}/python3" in summary  # not the `python` without torch
