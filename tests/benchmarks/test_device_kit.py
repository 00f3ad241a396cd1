"""benchmarks/gpu/run_gpu.sh on an emulated GPU machine gone wrong (no CUDA, a hanging nvidia-smi, a network that
never answers, a `python` without torch) ends by itself within a minute, says "no CUDA" and leaves nothing running;
and the results' way back, gpu_session.py's collect and record."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT
from support.device_machine import device_machine_env


@pytest.fixture
def gpu_session(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    return importlib.import_module("gpu_session")


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
    with device_machine_env(
        tmp_path, CUDA_VISIBLE_DEVICES="", PARTS="tests bench train", BUDGET="50", PROBE_LIMIT="30"
    ) as env:
        bin_dir = tmp_path / "bin"
        hang = bin_dir / "hang-in-nvidia-smi"
        shutil.copy(shutil.which("sleep"), hang)
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{hang} 600 &\nwait\n")  # a child outlives a plain kill
        (bin_dir / "nvidia-smi").chmod(0o755)
        start = time.monotonic()
        run = subprocess.run(
            ["bash", str(ROOT / "benchmarks/gpu/run_gpu.sh")], env=env, capture_output=True, text=True, timeout=120
        )
    seconds = time.monotonic() - start
    assert run.returncode == 3, run.stdout + run.stderr  # 3: no CUDA, the CUDA parts skipped
    assert seconds < 60, run.stdout
    assert "Killed" not in run.stderr, run.stderr  # no job-control noise on the call's output
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


def test_collect_and_record_turn_a_run_into_json_and_a_table(tmp_path, monkeypatch, gpu_session):
    results = tmp_path / "results"
    (results / "pretrain_small").mkdir(parents=True)
    (results / "progress.log").write_text(
        "08:00:00 +0 s start nvidia_smi (limit 30 s)\n08:00:01 +1 s end nvidia_smi: exit 0 after 1 s\n"
        "08:00:01 +1 s start bench_base_128 (limit 120 s)\n"
        "08:02:01 +121 s end bench_base_128: exit 137 after 120 s\n"
        "08:02:01 +121 s skip mrpc: no pre-trained model\n"
    )
    (results / "nvidia_smi.log").write_text("NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\n")
    (results / "cuda_tests.log").write_text(
        "tests/model/test_cuda.py::test_x PASSED\n===== 9 passed, 1 skipped in 41.2s =====\n"
    )

    def timed(tokens_per_second, mfu, ratio):
        return {"tokens_per_second": tokens_per_second, "mfu": mfu, "ratio_to_transformers_best": ratio}

    variants = {
        "transformers sdpa bf16 compile": timed(4.0e5, 0.40, 1.0),
        "ours sparse bf16 compile": timed(6.0e5, 0.60, 1.5),
        "ours packed sparse bf16 compile": {"error": "RuntimeError: out of memory"},
    }
    setting = {"preset": "base", "max_seq_length": 128, "batch_size": 256, "results": variants}
    (results / "bench_base_128.json").write_text(json.dumps({"bf16_matmul_peak_tflops": 700.0, "settings": [setting]}))
    history = [{"step": 25, "loss": 9.5}, {"step": 50, "loss": 7.25}, {"step": 50, "eval_loss": 7.0}]
    history.append({"step": 50, "train_runtime": 30.0})
    (results / "pretrain_small" / "log_history.json").write_text(json.dumps(history))
    (results / "pretrain_small" / "model.safetensors").write_bytes(b"")
    report = gpu_session.collect(results, tmp_path / "results.json", "bash benchmarks/gpu/run_gpu.sh")
    assert json.loads((tmp_path / "results.json").read_text()) == report
    assert (report["device"], report["driver"]) == ("NVIDIA H100 80GB HBM3", "580.65.06")
    assert report["cuda_tests"]["passed"] == 9 and report["cuda_tests"]["skipped"] == 1
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["bench_base_128"] == {"name": "bench_base_128", "limit_s": 120, "exit": 137, "seconds": 120}
    assert steps["mrpc"]["skipped"] == "no pre-trained model"
    ours = next(r for r in report["benchmark"] if r["variant"] == "ours sparse bf16 compile")
    expected = ("base:128", 6.0e5, 0.60, 1.5)
    assert (ours["setting"], ours["tokens_per_second"], ours["mfu"], ours["ratio_to_transformers_best"]) == expected
    assert report["pretraining"]["loss_curve"] == [[25, 9.5], [50, 7.25]]
    assert report["pretraining"]["finished"] and report["bf16_matmul_peak_tflops"] == 700.0

    monkeypatch.setattr(gpu_session, "ROOT", tmp_path)
    (tmp_path / "benchmarks").mkdir()
    log = tmp_path / "benchmarks" / "LOG.md"
    log.write_text(f"# Benchmarks: the log\n\n{gpu_session.MARKER}\n\nolder runs\n")
    gpu_session.record(tmp_path / "results.json")
    name = f"{report['date']}-nvidia-h100-80gb-hbm3.json"
    assert json.loads((tmp_path / "benchmarks" / "results" / name).read_text()) == report
    text = log.read_text()
    # MFU against the measured peak (700) and against the H100's data sheet (989.4 TFLOP/s)
    assert "| base:128 | ours sparse bf16 compile | 600,000 | 60.0% | 42.4% | 1.50 |" in text
    assert text.index(name) < text.index("older runs")
    assert "Steps that failed or were killed: bench_base_128." in " ".join(text.split())
    # the one-screen table follows the new file at once
    table = (tmp_path / "benchmarks" / "RESULTS.md").read_text()
    # (STALE before it: this fake run records no commit, see test_results_table.py)
    assert f"1.50x (600,000 tokens/s) | >= 1.5x | yes | NVIDIA H100 80GB HBM3 | {report['date']} | [{name}]" in table
    with pytest.raises(SystemExit, match="recorded already"):  # the same run is recorded once
        gpu_session.record(tmp_path / "results.json")
    report["command"] += " # a second call"  # another call that day: its own file, the first kept
    (tmp_path / "second.json").write_text(json.dumps(report))
    gpu_session.record(tmp_path / "second.json")
    second = tmp_path / "benchmarks" / "results" / name.replace(".json", "-2.json")
    assert json.loads(second.read_text()) == report
    assert json.loads((tmp_path / "benchmarks" / "results" / name).read_text())["command"] != report["command"]

    # A study's run: its table in results.json and LOG.md, the file named -study
    study = results / "study_pretraining"
    study.mkdir()
    (study / "study.json").write_text(json.dumps({"study": "pretraining", "rows": []}))
    (study / "study.md").write_text(
        "# Does our pre-training help?\n\n| variant | SST-2 |\n|---|---|\n| ours | 83.49 |\n"
    )
    report = gpu_session.collect(results, tmp_path / "study.json", "PARTS=study bash benchmarks/gpu/run_gpu.sh")
    assert (
        report["study"]["pretraining"]["rows"] == []
        and "| ours | 83.49 |" in report["study"]["pretraining"]["markdown"]
    )
    gpu_session.record(tmp_path / "study.json")
    assert (tmp_path / "benchmarks" / "results" / name.replace(".json", "-study.json")).is_file()
    log = log.read_text()
    assert "Study `pretraining`" in log and "| ours | 83.49 |" in log


def test_what_a_device_call_carries_is_measured_and_too_much_refused(tmp_path, capsys, gpu_session):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/.travel/\n/.gpu/\n")
    (tmp_path / "code.py").write_bytes(b"x" * 1000)
    (tmp_path / ".travel" / "books").mkdir(parents=True)
    (tmp_path / ".gpu").mkdir()
    (tmp_path / ".gpu" / "wheel.whl").write_bytes(b"w" * 3000)
    corpus = tmp_path / ".travel" / "books" / "corpus.parquet"
    corpus.write_bytes(b"c" * 5000)
    carried = [tmp_path / ".gpu", tmp_path / ".travel"]
    # the ignored folders count only when carried; .gitignore and code.py are the tree
    assert gpu_session.travelling_bytes(tmp_path, carried) == (1000 + len("/.travel/\n/.gpu/\n"), 8000)
    assert gpu_session.travels(tmp_path, carried) == 0
    with open(corpus, "r+b") as f:  # 63.5 MiB: within the limit, not within its margin
        f.truncate(63 * 2**20 + 2**19)
    assert gpu_session.travels(tmp_path, carried) == 1
    assert "error: more than the device's 64 MiB" in capsys.readouterr().err


def test_record_files_the_microbenchmarks_the_profile_and_invalid_variants(tmp_path, monkeypatch, gpu_session):
    """micro.json (written into OUT by the part micro) and the profile's split come back inside results.json and are
    filed by `record`; a variant whose record disagreed with its label shows as invalid, not as a rate."""
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    out.mkdir()
    (results / "progress.log").write_text("")
    (out / "micro.json").write_text(json.dumps({"stages": {"attention": {"rows": [{}, {}]}, "fp8": {"error": "x"}}}))
    split = {"ours sparse bf16 compile": {"GEMM": 24.3, "wall time": 52.6}}
    (results / "profile_split.json").write_text(json.dumps({"split_ms": split}))
    lie = {"error": "invalid: labelled compiled: 0 graphs compiled", "invalid": ["..."], "ran": {"graphs_compiled": 0}}
    bench = {"settings": [{"preset": "base", "max_seq_length": 128, "batch_size": 256, "results": {"cdt": lie}}]}
    (results / "bench_base_128.json").write_text(json.dumps(bench))
    report = gpu_session.collect(results, out / "results.json", "PARTS=... bash benchmarks/gpu/run_gpu.sh")
    assert report["micro"]["stages"]["attention"]["rows"] == [{}, {}]
    assert report["profile"]["split_ms"] == split
    assert report["benchmark"][0]["ran"] == {"graphs_compiled": 0}
    monkeypatch.setattr(gpu_session, "ROOT", tmp_path)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "LOG.md").write_text(f"{gpu_session.MARKER}\n")
    gpu_session.record(out / "results.json")
    filed = json.loads(next((tmp_path / "benchmarks" / "results").glob("*.json")).read_text())
    assert filed["micro"] == report["micro"] and filed["profile"] == report["profile"]
    log = (tmp_path / "benchmarks" / "LOG.md").read_text()
    assert "| base:128 | cdt | invalid: labelled compiled: 0 graphs compiled | | | |" in log
    assert "attention (2 rows), fp8 (failed)" in log and "| GEMM | 24.3 |" in log


def wheel_of(package: str, folder: Path) -> Path:
    """A stand-in for the kit's wheel of an installed pure-Python package: its files and dist-info, zipped."""
    import importlib.metadata as metadata
    import zipfile

    dist = metadata.distribution(package)
    wheel = folder / f"{package}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in dist.files:
            path = Path(dist.locate_file(file))
            if path.is_file() and not str(file).startswith(".."):
                archive.write(path, str(file))
    return wheel


@pytest.mark.slow
def test_every_wheel_of_the_kit_is_unpacked_where_the_image_lacks_its_package(tmp_path):
    """The image's Python lacks datasets, dill, multiprocess and torchao: run_gpu.sh unpacks the kit's wheels (.gpu/fp8
    for the FP8 processes only), the probe imports datasets and the project, and a torch of another minor version
    than the kit's leaves the FP8 variants out with one line."""
    from support.device_machine import IMAGE_LACKS

    kit = tmp_path / "kit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "fp8").mkdir()
    for package in ("datasets", "dill", "multiprocess"):
        wheel_of(package, kit / "wheels")
    import zipfile

    with zipfile.ZipFile(kit / "fp8" / "torchao-0.18.0-cp310-abi3-manylinux_2_28_x86_64.whl", "w") as archive:
        archive.writestr("torchao/__init__.py", "__version__ = '0.18.0'\n")
    (kit / "kit.txt").write_text("torch=2.4\n")
    settings = dict(CUDA_VISIBLE_DEVICES="", PARTS="probe", BUDGET="200", KIT=str(kit))
    with device_machine_env(tmp_path, missing=IMAGE_LACKS, **settings) as env:
        run = subprocess.run(
            ["bash", str(ROOT / "benchmarks/gpu/run_gpu.sh")], env=env, capture_output=True, text=True, timeout=300
        )
    assert run.returncode == 3, run.stdout + run.stderr  # no CUDA here
    unpacked = (tmp_path / "results" / "wheels.log").read_text()
    for package in ("datasets", "dill", "multiprocess"):
        assert f"/{package}-" in unpacked, unpacked
    assert "/torchao-" in (tmp_path / "results" / "wheels_fp8.log").read_text()
    # torchao (here a stand-in that transformers cannot use) is on the FP8 processes' path only: the probe's
    # imports of transformers and the project do not see it
    probe = (tmp_path / "results" / "probe.log").read_text()
    assert "import datasets ... " in probe and "import bert_repro.training ... " in probe, probe
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "the kit was prepared for torch 2.4" in summary
    assert "the FP8 variants and micro's fp8 stage are left out" in summary
