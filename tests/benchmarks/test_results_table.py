"""The benchmarks' wing as CI sees it: benchmarks/RESULTS.md is what benchmarks/results_table.py makes of
benchmarks/results/*.json, every target has a figure reader, and the benchmarks import only the package's public
API (names a stage package exports in its `__all__`), so that they keep running while the package's modules move."""

from __future__ import annotations

import ast
import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from support import ROOT

BENCHMARKS = ROOT / "benchmarks"
STAGES = {"bert_repro.model", "bert_repro.data", "bert_repro.tasks", "bert_repro.hub"}
PUBLIC_PACKAGES = {"bert_repro", "bert_repro.training", *STAGES}


@pytest.fixture
def results_table(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("results_table")


def test_results_md_and_the_readme_table_are_current(results_table):
    # Each file not current is named, with the command: `python benchmarks/results_table.py`, then commit both.
    assert results_table.main(["--check"]) == 0


def test_check_fails_on_a_stale_table_and_says_the_command(results_table, tmp_path, capsys):
    out, readme = tmp_path / "RESULTS.md", tmp_path / "README.md"
    for path, source in ((out, BENCHMARKS / "RESULTS.md"), (readme, ROOT / "README.md")):
        path.write_text(source.read_text().replace("| yes |", "| no |", 1))
    assert results_table.main(["--check", "--out", str(out), "--readme", str(readme)]) == 1
    said = "".join(f"{path} is not current: run `python benchmarks/results_table.py`\n" for path in (out, readme))
    assert capsys.readouterr().err == said


def test_the_readme_shows_results_md_figures_with_their_stale_mark(results_table):
    results, readme = (BENCHMARKS / "RESULTS.md").read_text(), (ROOT / "README.md").read_text()
    shown = readme[readme.index(results_table.README_BEGIN) : readme.index(results_table.README_END)].splitlines()[3:]
    assert len(shown) == len(results_table.README_ROWS) >= 5
    for key, line in zip(results_table.README_ROWS, shown):
        row = next(r for r in results.splitlines() if r.startswith(f"| {results_table.GOALS[key][0]} | "))
        figure, goal = row.split(" | ")[1:3]  # the README gives a STALE figure's reason in RESULTS.md only
        assert line.split(" | ")[1:3] == [re.sub(r"^\*\*STALE\*\* \(.*?\): ", "**STALE**: ", figure), goal], key


def test_every_target_has_a_reader_and_a_row(results_table):
    assert set(results_table.GOALS) == set(results_table.FIGURES)
    rows = [line for line in results_table.render(BENCHMARKS / "results").splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(results_table.GOALS)  # the header, then one row per target


def test_a_newer_file_moves_its_target_and_a_figure_is_judged_against_its_goal(results_table, tmp_path):
    def bench(ratio: float) -> dict:
        row = {"setting": "base:128", "variant": results_table.OURS, "tokens_per_second": 7e5, "mfu": 0.6}
        return {"device": "NVIDIA H100 80GB HBM3", "bf16_matmul_peak_tflops": 800.0, "benchmark": [
            {**row, "ratio_to_transformers_best": ratio}]}  # fmt: skip

    (tmp_path / "2026-12-01-nvidia-h100.json").write_text(json.dumps(bench(1.2)))
    (tmp_path / "2026-12-01-nvidia-h100-2.json").write_text(json.dumps(bench(1.6)))  # that day's second call
    (tmp_path / "2026-11-30-nvidia-h100.json").write_text(json.dumps(bench(1.1)))
    table = results_table.render(tmp_path)
    step = next(line for line in table.splitlines() if "BASE/128, x transformers' best" in line)
    assert "(no commit recorded): 1.60x (700,000 tokens/s) | >= 1.5x | yes | NVIDIA H100 80GB HBM3 |" in step
    assert "[2026-12-01-nvidia-h100-2.json]" in step
    assert "| pre-training step, BASE/512, x transformers' best | not measured |" in table


def test_study_gain_within_two_standard_errors_does_not_meet_its_goal(results_table):
    def study(sst2: float, se: float) -> dict:
        cells = {"sst2": {"ours": sst2, "se": se}, "mrpc_f1": {"ours": 80.0, "se": 0.1}}
        base = {"sst2": {"ours": 80.0, "se": se}, "mrpc_f1": {"ours": 70.0, "se": 0.1}}
        return {"study": {"pretraining": {"rows": [
            {"variant": "pretrained", "cells": cells, "pretraining": {"global_step": 10}},
            {"variant": "random", "cells": base, "pretraining": {"global_step": 0}}]}}}  # fmt: skip

    value, _ = results_table.FIGURES["study_sst2"](study(84.0, 0.5))
    assert results_table.GOALS["study_sst2"][2](value)
    value, text = results_table.FIGURES["study_sst2"](study(84.0, 3.0))  # +4 points, but within 2 SE
    assert not results_table.GOALS["study_sst2"][2](value) and text.startswith("+4.00 (SE 4.24")


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import of bert_repro in `path`; name None for `import module`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "bert_repro"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "bert_repro":
            found += [(node.lineno, node.module, a.name) for a in node.names]
    return found


def test_benchmarks_import_only_the_public_api():
    scripts = sorted(BENCHMARKS.rglob("*.py"))
    assert BENCHMARKS / "gpu" / "gpu_pretrain.py" in scripts
    wrong = []
    for path in scripts:
        for line, module, name in imports(path):
            public = module in PUBLIC_PACKAGES and name is not None
            if public:
                package = importlib.import_module(module)
                public = name in getattr(package, "__all__", ())
            if not public:
                what = f"from {module} import {name}" if name else f"import {module}"
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not wrong, (
        "benchmarks import what their stage package does not export (add the name to the package's __all__, "
        "or import it from where it is exported):\n" + "\n".join(wrong)
    )


@pytest.mark.parametrize("package", sorted(STAGES))
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    for name in getattr(module, "__all__", ()):
        assert getattr(module, name) is not None, f"{package}.{name}"
    with pytest.raises(AttributeError):
        module.not_a_public_name


def test_importing_a_stage_package_does_not_import_its_heavy_modules():
    """The exports are read on first use: importing bert_repro.data does not import the streaming pipeline."""
    import subprocess

    code = (
        "import sys, bert_repro.data, bert_repro.tasks\n"
        "print('bert_repro.data.streaming' in sys.modules, 'bert_repro.tasks.files' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


@pytest.fixture
def measured_repo(tmp_path):
    """A git repository laid out as this one: a benchmark importing bert_repro.a (which imports .b) and, through
    the package's lazy exports, bert_repro.data.corpus; bert_repro.c is imported by nothing."""
    import subprocess

    files = {
        "bert_repro/__init__.py": "",
        "bert_repro/a.py": "from . import b\n",
        "bert_repro/b.py": "X = 1\n",
        "bert_repro/c.py": "Y = 1\n",
        "bert_repro/data/__init__.py": '_PUBLIC = {"load_corpus": "corpus"}\n',
        "bert_repro/data/corpus.py": "def load_corpus(): ...\n",
        "benchmarks/build_examples.py": "from common import machine\nfrom bert_repro.a import b\n\n\ndef main():\n"
        "    from bert_repro.data import load_corpus\n",
        "benchmarks/common.py": "def machine(): ...\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "measured")
    return tmp_path, git


def test_a_figure_is_stale_once_the_code_its_benchmark_imports_changes(results_table, measured_repo, tmp_path):
    root, git = measured_repo
    measured = git("rev-parse", "HEAD")
    results = tmp_path / "results"
    results.mkdir()
    (results / "2026-12-01-cpu.json").write_text(json.dumps({"commit": measured, "build_examples": {"runs": [
        {"ratio": 1.9}]}}))  # fmt: skip
    script = ("benchmarks/build_examples.py",)
    read = ["benchmarks/build_examples.py", "benchmarks/common.py", "bert_repro/__init__.py", "bert_repro/a.py"]
    read += ["bert_repro/b.py", "bert_repro/data/__init__.py", "bert_repro/data/corpus.py"]  # not bert_repro/c.py
    assert results_table.measured_code(root, script) == read

    def row() -> str:
        return next(line for line in results_table.render(results, root).splitlines() if "2 processes / 1" in line)

    assert results_table.staleness(root, measured, script) is None and "| 1.90x | >= 1.7x | yes |" in row()
    (root / "bert_repro" / "c.py").write_text("Y = 2\n")  # imported by nothing the benchmark runs
    git("commit", "-qam", "elsewhere")
    assert results_table.staleness(root, measured, script) is None
    (root / "bert_repro" / "b.py").write_text('"""Its docstring."""\n\nX = 1  # and a comment\n')  # the same code
    git("commit", "-qam", "words only")
    assert results_table.staleness(root, measured, script) is None
    for changed in ("bert_repro/b.py", "bert_repro/data/corpus.py", "benchmarks/common.py"):
        git("reset", "-q", "--hard", measured)
        (root / changed).write_text("Z = 3\n")
        assert results_table.staleness(root, measured, script) is None  # not committed: HEAD is what counts
        git("commit", "-qam", "measured code")
        assert results_table.staleness(root, measured, script) == f"{changed} changed since {measured[:7]}"
        assert f"| **STALE** ({changed} changed since {measured[:7]}): 1.90x |" in row()
    assert results_table.staleness(root, None, script) == "no commit recorded"
    assert results_table.staleness(root, "0" * 40, script) == "commit 0000000 is not in this repository"
