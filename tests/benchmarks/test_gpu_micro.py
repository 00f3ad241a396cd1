"""benchmarks/gpu/gpu_micro.py on the CPU: every stage's rows, a backend that cannot run is a row with its error, the
JSON is written after every stage (a stage that fails, or a run cut short, keeps what finished), and `--table` turns
the attention rows into `MEASURED_ORDER` entries."""

import importlib
import json
import sys

import pytest
from support import ROOT


@pytest.fixture
def micro(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    return importlib.import_module("gpu_micro")


def test_stages_rows_and_json_after_every_stage(micro, tmp_path, monkeypatch, capsys):
    written = []

    def broken(args):
        written.append(json.loads(out.read_text()))  # what the runner wrote before this stage
        raise RuntimeError("this stage fails")

    monkeypatch.setitem(micro.STAGES, "broken", broken)
    out = tmp_path / "micro.json"
    micro.main(["--device", "cpu", "--stages", "attention,broken,layer_norm", "--out", str(out), "--iters", "1"])
    report = json.loads(out.read_text())
    assert list(written[0]["stages"]) == ["attention"]  # on disk before the next stage started
    assert list(report["stages"]) == ["attention", "broken", "layer_norm"]
    assert report["stages"]["broken"]["error"] == "RuntimeError: this stage fails"

    rows = {(r["backend"], r["masked"]): r for r in report["stages"]["attention"]["rows"]}
    assert set(rows) == {
        (b, m) for b in ("cudnn", "flash", "efficient", "math", "default", "flash_varlen") for m in (0, 1)
    }
    for masked in (False, True):
        math = rows["math", masked]
        assert math["fwd_bwd_ms"] > 0 and math["dropout_applied"] and math["max_abs_diff_vs_math"] < 2e-2
        assert "error" in rows["flash_varlen", masked]  # no CPU kernel: a row, not a crash
    norm = report["stages"]["layer_norm"]["rows"]
    assert {(r["kernel"], r["residual"], r["p"]) for r in norm} == {
        (k, dtype, p) for k in ("compiled reference", "ours") for dtype in ("float32", "bfloat16") for p in (0.1, 0.0)
    }
    assert all(r["fwd_bwd_ms"] > 0 and r["gb_per_s"] > 0 for r in norm)

    capsys.readouterr()
    micro.main(["--table", str(out)])
    assert "(8, 128, True): ('math',)" in capsys.readouterr().out


def test_fp8_stage_rows(micro, tmp_path):
    """BERT-BASE's linear shapes (tiny on the CPU) in bf16 and in torchao's float8, emulated here."""
    pytest.importorskip("torchao.float8")  # the fp8 extra: .ci/run installs it after the tiers and runs this file
    out = tmp_path / "micro.json"
    micro.main(["--device", "cpu", "--stages", "fp8", "--out", str(out), "--iters", "1"])
    fp8 = json.loads(out.read_text())["stages"]["fp8"]
    assert {(r["linear"], r["precision"]) for r in fp8["rows"]} == {
        (name, p) for name, _, _ in micro.LINEAR_SHAPES["cpu"] for p in ("bf16", "fp8")
    }
    assert all(r["fwd_bwd_ms"] > 0 for r in fp8["rows"]) and fp8["emulated"]


def test_fp8_stage_without_torchao_says_so(micro, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # as if torchao were not installed
    out = tmp_path / "micro.json"
    micro.main(["--device", "cpu", "--stages", "fp8", "--out", str(out), "--iters", "1"])
    fp8 = json.loads(out.read_text())["stages"]["fp8"]
    assert fp8["rows"] == [] and "torchao is not installed" in fp8["skipped"]


def test_unknown_stage_is_refused(micro):
    with pytest.raises(SystemExit):
        micro.main(["--device", "cpu", "--stages", "nonsense"])
