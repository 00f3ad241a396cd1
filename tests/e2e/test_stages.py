"""The package's stages import one way, model -> data -> tasks -> training -> hub, read from the source with ast so
that a function-level import counts as much as a top one."""

import ast
from pathlib import Path

from support import ROOT

PACKAGE = ROOT / "bert_repro"
STAGES = ("model", "data", "tasks", "training", "hub")
# The imports against the order: a run started with --push_to_hub hands its output to the Hub's push at its end
# (and checks the Hub is reachable before it starts), and a finished fine-tune writes its model card, as Trainer
# does. Publishing itself needs nothing from training.
ALLOWED = {("training", "bert_repro.hub.push"), ("training", "bert_repro.hub.model_card")}


def absolute_base(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` reads from, relative to `package` resolved."""
    if not node.level:
        return node.module or ""
    parent = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
    return f"{parent}.{node.module}" if node.module else parent


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in one file of the package, relative ones resolved."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute_base(node, package)
            if node.module:  # from ..model.conversion import check_model_dir
                found.append((node.lineno, base))
            else:  # from ..model import modeling_bert_repro: the names are modules
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "bert_repro" and len(parts) > 1 and parts[1] in STAGES else None


def test_every_subpackage_is_a_stage_and_each_kind_of_run_has_a_recipe_and_a_run():
    assert {p.parent.name for p in PACKAGE.glob("*/__init__.py")} == set(STAGES)
    runs = {p.parent.name for p in (PACKAGE / "training").glob("*/__init__.py")}
    assert runs == {"pretraining", "finetuning", "studies"}
    assert all((PACKAGE / "training" / run / "run.py").is_file() for run in runs)


def test_the_layout_doc_names_every_module():
    """docs/layout.md is the map of the package: a module it does not name has been added or moved without it."""
    layout = (ROOT / "docs" / "layout.md").read_text()
    modules = [p for p in PACKAGE.rglob("*.py") if p.stem not in ("__init__", "__main__")]
    assert not [
        str(p.relative_to(ROOT))
        for p in modules
        if f"`{p.name}`" not in layout and f"`{p.relative_to(ROOT)}`" not in layout
    ]


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
    found = {m for _, m in imported_modules(PACKAGE / "training" / "publishing.py")}
    assert "bert_repro.hub.push" in found  # a function-level relative import
    found = {m for _, m in imported_modules(PACKAGE / "training" / "finetuning" / "run.py")}
    assert {"bert_repro.tasks.files", "bert_repro.model.conversion", "transformers"} <= found


def test_every_public_name_imports_from_the_package():
    """`from bert_repro import *` gives every name of `bert_repro.__all__` (modules moved inside stay hidden)."""
    namespace = {}
    exec("from bert_repro import *", namespace)
    import bert_repro

    assert [name for name in bert_repro.__all__ if name not in namespace] == []


# Circles left in the import graph, each with why breaking it would not make the code plainer.
CIRCLES = {
    frozenset({"bert_repro.model.checkpoint_format", "bert_repro.model.configuration_bert_repro"}): (
        "config.json's writer (BertReproConfig.to_json_file) asks the checkpoint format which type to write, and "
        "the format reads the objectives from the config module; both are copied next to the weights for remote "
        "code, so one function-level import joins two files that must each stand alone"
    ),
    frozenset({"bert_repro.tasks.columns", "bert_repro.tasks.kinds", "bert_repro.tasks.registry"}): (
        "annotations only (under TYPE_CHECKING): a Task names its kind, and the kinds' and the columns' functions "
        "take a Task; nothing imports in a circle when the code runs"
    ),
}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, function-level and TYPE_CHECKING imports included."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = absolute_base(node, package)
                # a name that is a module is that module; any other name comes from the module `base`
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = (targets & modules.keys()) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or v not in component:
                component.add(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circle_but_those_listed():
    found = set(circles(import_graph()))
    assert found <= set(CIRCLES), "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in found - set(CIRCLES))
    assert set(CIRCLES) <= found, "a listed circle is gone: take it off the list"
    # the reader finds a circle (or the test could not fail)
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
