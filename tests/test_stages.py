"""The package's stages import one way: model -> data -> tasks -> training -> hub, no module a later stage.

Read from the source with ast (nothing is imported), so a function-level import counts as much as a top one.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bert_repro"
STAGES = ("model", "data", "tasks", "training", "hub")
# The one import against the order: a run started with --push_to_hub hands its output to the Hub's push at its
# end (and checks the Hub is reachable before it starts). Publishing itself needs nothing from training.
ALLOWED = {("training", "bert_repro.hub.push")}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in one file of the package, relative ones resolved."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            if node.module:  # from ..model.conversion import check_model_dir
                found.append((node.lineno, base))
            else:  # from ..model import modeling_bert_repro: the names are modules
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "bert_repro" and len(parts) > 1 and parts[1] in STAGES else None


def test_every_subpackage_is_a_stage():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(STAGES)


def test_no_module_imports_a_later_stage():
    wrong = []
    for stage in STAGES:
        for path in sorted((PACKAGE / stage).rglob("*.py")):
            for line, module in imported_modules(path):
                target = stage_of(module)
                if target is None or (stage, module) in ALLOWED:
                    continue
                if STAGES.index(target) > STAGES.index(stage):
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({stage}) imports {module} ({target})")
    assert not wrong, "imports against the order " + " -> ".join(STAGES) + ":\n" + "\n".join(wrong)


def test_data_reads_no_task():
    """The task files are read in tasks/ (`bert_repro.tasks.files`): data/ knows corpora, not tasks."""
    for path in (PACKAGE / "data").rglob("*.py"):
        assert not [m for _, m in imported_modules(path) if stage_of(m) == "tasks"], path


def test_imports_are_found():
    """The reader sees relative, absolute and function-level imports (or the tests above could not fail)."""
    found = {m for _, m in imported_modules(PACKAGE / "training" / "cli.py")}
    assert "bert_repro.hub.push" in found  # a function-level relative import
    found = {m for _, m in imported_modules(PACKAGE / "training" / "finetune.py")}
    assert {"bert_repro.tasks.files", "bert_repro.model.conversion", "transformers"} <= found


def test_every_public_name_imports_from_the_package():
    """`from bert_repro import *` gives every name of `bert_repro.__all__` (modules moved inside stay hidden)."""
    namespace = {}
    exec("from bert_repro import *", namespace)
    import bert_repro

    assert [name for name in bert_repro.__all__ if name not in namespace] == []
