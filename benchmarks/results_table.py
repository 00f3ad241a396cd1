"""benchmarks/RESULTS.md, the one-screen table of where the project stands: one row per target, its latest figure,
the goal, whether it is met, the machine, the date and the results file the figure comes from; and the README's
status table, some of the same rows (`README_ROWS`), between its two marker comments.

    python benchmarks/results_table.py            # rewrites both from benchmarks/results/*.json
    python benchmarks/results_table.py --check    # exit 1 when either is not what the files give

The goals are data here (`GOALS`); every figure is read from a results file, never written here, so a new file in
benchmarks/results/ (`gpu/gpu_session.py record` and `bench_cpu.py` write them, and rerun this) moves the table. A
target takes the latest file that holds its figure (files sort by their date prefix). A figure is marked STALE when
the code its benchmark imports (`SCRIPTS`, followed through their imports) has changed in git since the commit its
file records, or when the file records none. tests/benchmarks/test_results_table.py checks in CI that the checked-in
tables are current, so a commit that changes measured code also regenerates them.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))  # the cards' data-sheet peaks live with the GPU kit

from gpu_session import SPEC_BF16_PEAK

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# target -> (what is measured, the goal in words, test of the figure's value: met or not)
GOALS: dict[str, tuple[str, str, Callable[[float], bool] | None]] = {
    "gpu_step": ("pre-training step, BASE/128, x transformers' best (bf16, compiled)", ">= 1.5x", lambda v: v >= 1.5),
    "gpu_mfu": ("same, MFU of the card's data-sheet peak, useful FLOPs", ">= 50%", lambda v: v >= 0.50),
    "gpu_step_512": ("pre-training step, BASE/512, x transformers' best", ">= 1.3x", lambda v: v >= 1.3),
    "gpu_large": ("pre-training step, LARGE/128, x transformers' best", "none set", None),
    "gpu_split": (
        "where the BASE/128 step's time goes (profile)",
        "<= transformers' step / 1.5",
        lambda v: v <= 1 / 1.5,
    ),
    "real_tokens": ("real tokens in a BASE/128 batch", ">= 97%", lambda v: v >= 0.97),
    "cuda_tests": ("CUDA tests (`pytest -m cuda`)", "none fails", lambda v: v == 0),
    "study_sst2": ("pre-trained - random init, SST-2 accuracy (3 seeds)", ">= +3 points, > 2 SE", lambda v: v >= 3),
    "study_mrpc": ("pre-trained - random init, MRPC F1 (3 seeds)", ">= +2 points, > 2 SE", lambda v: v >= 2),
    "finetune_fidelity": ("fine-tuning recipe - transformers script, dev score", "within 1 point", lambda v: v <= 1),
    "head_init": ("new heads: transformers' init - reference's, dev score", ">= -1 point", lambda v: v >= -1),
    "cpu_step": ("CPU pre-training step, BASE fp32, x transformers", ">= 1.3x", lambda v: v >= 1.3),
    "cpu_mfu": ("same, MFU of the measured fp32 peak", ">= 70%", lambda v: v >= 0.70),
    "cpu_bf16": ("CPU step, bf16 autocast, x transformers fp32", ">= 2x", lambda v: v >= 2),
    "cpu_mrpc": ("CPU MRPC fine-tuning, train time / transformers'", "<= 0.6x", lambda v: v <= 0.6),
    "cpu_encode": ("CPU encoding throughput, x transformers", ">= 1.3x", lambda v: v >= 1.3),
    "cpu_build": ("building examples, 2 processes / 1", ">= 1.7x", lambda v: v >= 1.7),
}

GPU_BENCH = "benchmarks/gpu/gpu_pretrain.py"
# target -> the scripts whose run gives its figure (relative to the repository's root)
SCRIPTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ("gpu_step", "gpu_mfu", "gpu_step_512", "gpu_large", "real_tokens"), ("benchmarks/gpu/gpu_pretrain.py",)
    ),
    "gpu_split": (GPU_BENCH, "benchmarks/gpu/profile_split.py"),
    "cuda_tests": ("tests/model/test_cuda.py",),
    "study_sst2": ("recipes/study.py",),
    "study_mrpc": ("recipes/study.py",),
    "finetune_fidelity": ("benchmarks/head_init.py",),
    "head_init": ("benchmarks/head_init.py",),
    **dict.fromkeys(("cpu_step", "cpu_mfu", "cpu_bf16"), ("benchmarks/pretrain_step.py",)),
    "cpu_mrpc": ("benchmarks/finetune_mrpc.py",),
    "cpu_encode": ("benchmarks/encode.py",),
    "cpu_build": ("benchmarks/build_examples.py",),
}

# A figure: (the value the goal tests, its text); None where a file does not hold it.
Figure = tuple[float, str] | None


def _spec(device: str | None) -> float | None:
    return next((v for k, v in SPEC_BF16_PEAK.items() if device and k in device), None)


def _bench_rows(report: dict) -> list[dict]:
    """The benchmark's rows of a GPU run, from `record`'s files and from the profile's (one setting)."""
    rows = [r for r in report.get("benchmark") or [] if "error" not in r]
    setting = report.get("setting")
    if isinstance(setting, dict):
        name = f"{setting['preset']}:{setting['max_seq_length']}"
        for variant, r in setting.get("results", {}).items():
            if "error" not in r:
                flops = setting.get("useful_flops_per_real_token")
                rows.append({"setting": name, "variant": variant, **r, "useful_flops": flops})
    return rows


def _ours(report: dict, setting: str) -> dict | None:
    return next((r for r in _bench_rows(report) if r["setting"] == setting and r["variant"] == OURS), None)


OURS = "ours sparse bf16 compile"  # the recipe's GPU default, measured against transformers' best


def _ratio(setting: str) -> Callable[[dict], Figure]:
    def figure(report: dict) -> Figure:
        r = _ours(report, setting)
        if r is None:
            return None
        v = r["ratio_to_transformers_best"]
        return v, f"{v:.2f}x ({r['tokens_per_second']:,.0f} tokens/s)"

    return figure


def gpu_mfu(report: dict) -> Figure:
    r, spec = _ours(report, "base:128"), _spec(report.get("device"))
    if r is None or spec is None:
        return None
    if r.get("useful_flops"):
        v = r["tokens_per_second"] * r["useful_flops"] / (spec * 1e12)
    elif report.get("bf16_matmul_peak_tflops"):
        v = r["mfu"] * report["bf16_matmul_peak_tflops"] / spec
    else:
        return None
    return v, f"{v:.1%} (of {spec} TFLOP/s)"


def gpu_split(report: dict) -> Figure:
    split = report.get("split_ms")
    if not split or OURS not in split:
        return None
    ours, best = split[OURS]["wall time"], split.get("transformers sdpa bf16 compile", {}).get("wall time")
    if not best:
        return None
    elementwise = split[OURS]["LayerNorm + dropout + residual"] + split[OURS]["GELU"]
    floors = report.get("floors_ms", {})
    return ours / best, (
        f"{ours:.1f} ms a step against {best:.1f} (1.5x: {best / 1.5:.1f}); GEMM {split[OURS]['GEMM']:.1f} (floor "
        f"{floors.get('GEMM', '?').split(' / ')[0]}), elementwise {elementwise:.1f} (floor "
        f"{floors.get('elementwise', '?')}), idle {split[OURS]['idle (launch gaps, host waits)']:.1f}"
    )


def real_tokens(report: dict) -> Figure:
    setting = report.get("setting")
    if not isinstance(setting, dict) or "padding_share" not in setting:
        return None
    v = 1 - setting["padding_share"]
    return v, f"{v:.1%} unpacked, {1 - setting['packed_padding_share']:.1%} packed"


def cuda_tests(report: dict) -> Figure:
    tests = report.get("cuda_tests")
    if not tests:
        return None
    return tests.get("failed", 0) + tests.get("errors", 0), tests["summary"].split(" in ")[0]


def _study(cell: str) -> Callable[[dict], Figure]:
    def figure(report: dict) -> Figure:
        study = (report.get("study") or {}).get("pretraining")
        if not study:
            return None
        rows = {r["variant"]: r["cells"].get(cell) for r in study["rows"]}
        pre, rnd = rows.get("pretrained"), rows.get("random")
        if not pre or not rnd or pre.get("se") is None or rnd.get("se") is None:
            return None  # a study cut short: not both sides finished
        diff, se = pre["ours"] - rnd["ours"], math.hypot(pre["se"], rnd["se"])
        steps = next(r["pretraining"]["global_step"] for r in study["rows"] if r["variant"] == "pretrained")
        # the goal holds only beyond noise: a difference within 2 standard errors counts as none
        return (
            diff if diff > 2 * se else 0.0
        ), f"{diff:+.2f} (SE {se:.2f}; {pre['ours']} against {rnd['ours']}, {steps:,} steps)"

    return figure


def _parts(report: dict) -> dict:
    parts = report.get("parts")
    return parts if isinstance(parts, dict) and all(isinstance(p, dict) for p in parts.values()) else {}


def _scores(a: dict, b: dict) -> tuple[float, float]:
    """The two runs' headline dev metric, the first that both report (the script reports more than the recipe)."""
    key = next(k for k in ("entity_f1", "f1", "accuracy") if k in a and k in b)
    return a[key], b[key]


def finetune_fidelity(report: dict) -> Figure:
    gaps = [
        abs(ours - theirs)
        for runs in _parts(report).values()
        for seed in runs.get("transformers", {})
        if seed in runs.get("transformers script", {})
        for ours, theirs in [_scores(runs["transformers"][seed], runs["transformers script"][seed])]
    ]
    if not gaps:
        return None
    return max(gaps), f"at most {max(gaps):.2f} points ({len(gaps)} runs, {', '.join(_parts(report))})"


def head_init(report: dict) -> Figure:
    means = {}
    for part, runs in _parts(report).items():
        seeds = [s for s in runs.get("reference", {}) if s in runs.get("transformers", {})]
        if seeds:
            diffs = [a - b for s in seeds for a, b in [_scores(runs["transformers"][s], runs["reference"][s])]]
            means[part] = sum(diffs) / len(diffs)
    if not means:
        return None
    text = ", ".join(f"{part} {v:+.2f}" for part, v in means.items())
    return min(means.values()), f"{text} (mean over seeds)"


def _cpu(section: str, value: Callable[[dict], Figure]) -> Callable[[dict], Figure]:
    return lambda report: value(report[section]) if section in report else None


def _cpu_step(key: str, trusted_only: bool = False) -> Callable[[dict], Figure]:
    def figure(step: dict) -> Figure:
        runs = [r for r in step["runs"] if r.get("peak_trusted") or not trusted_only]
        if not runs:
            return None
        if key == "mfu":
            values = [r["ours_switches_mfu"] for r in runs]
            return min(values), ", ".join(f"{v:.1%}" for v in values) + " (runs with a trusted peak)"
        values = [r[key] / r["transformers_fp32_tokens_per_s"] for r in runs]
        return min(values), ", ".join(f"{v:.2f}x" for v in values) + f" ({len(values)} run{'s' * (len(values) > 1)})"

    return figure


def cpu_mrpc(mrpc: dict) -> Figure:
    values = [r["ratio_to_mean"] for r in mrpc["runs"]]
    dev = mrpc["dev"] if "dev" in mrpc else mrpc["runs"][-1]["dev"]  # bench_cpu.py's files: each run's own
    return max(values), (
        f"{min(values):.3f}x-{max(values):.3f}x ({len(values)} runs); F1 {dev['ours']['f1']} against "
        f"{dev['transformers']['f1']}"
    )


def cpu_encode(encode: dict) -> Figure:
    inputs = encode["inputs_per_s"] if "inputs_per_s" in encode else encode["runs"][-1]["inputs_per_s"]
    ratios = {m: r["ours_unpad"] / r["transformers"] for m, r in inputs.items()}
    return min(ratios.values()), ", ".join(f"{v:.2f}x {m}" for m, v in ratios.items())


def cpu_build(build: dict) -> Figure:
    values = [r["ratio"] for r in build["runs"]]
    return min(values), " and ".join(f"{v:.2f}x" for v in values)


FIGURES: dict[str, Callable[[dict], Figure]] = {
    "gpu_step": _ratio("base:128"),
    "gpu_mfu": gpu_mfu,
    "gpu_step_512": _ratio("base:512"),
    "gpu_large": _ratio("large:128"),
    "gpu_split": gpu_split,
    "real_tokens": real_tokens,
    "cuda_tests": cuda_tests,
    "study_sst2": _study("sst2"),
    "study_mrpc": _study("mrpc_f1"),
    "finetune_fidelity": finetune_fidelity,
    "head_init": head_init,
    "cpu_step": _cpu("pretrain_step", _cpu_step("ours_switches_tokens_per_s")),
    "cpu_mfu": _cpu("pretrain_step", _cpu_step("mfu", trusted_only=True)),
    "cpu_bf16": _cpu("pretrain_step", _cpu_step("ours_bf16_tokens_per_s")),
    "cpu_mrpc": _cpu("finetune_mrpc", cpu_mrpc),
    "cpu_encode": _cpu("encode", cpu_encode),
    "cpu_build": _cpu("build_examples", cpu_build),
}


def card(report: dict) -> str:
    return report.get("device") or report.get("card") or "CPU (2 cores)"


def _order(path: Path) -> tuple[str, int]:
    """Files by name, a day's later calls (`-2`, `-3`, as `record` numbers them) after its first."""
    base, _, n = path.stem.rpartition("-")
    return (base, int(n)) if n.isdigit() and len(n) < 3 else (path.stem, 1)


def _module_files(root: Path, name: str, near: Path) -> list[Path]:
    """The files importing module `name` runs: each package's __init__.py on the way, then the module; a top-level
    name outside bert_repro is one of the benchmarks' own modules (they put their folders on sys.path) or nothing."""
    parts = name.split(".")
    if parts[0] != "bert_repro":
        found = (d / f"{name}.py" for d in (near, root / "benchmarks", root / "benchmarks" / "gpu"))
        return [f for f in found if f.is_file()][:1]
    files = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts) + 1)]
    return [*files, root.joinpath(*parts[:-1], parts[-1] + ".py")]


def _lazy_exports(init: Path) -> dict[str, str]:
    """name -> module of a package's exports read on first use (`bert_repro.exports.lazy_exports`' dictionaries)."""
    found = {}
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                target = v.elts[0] if isinstance(v, ast.Tuple) and v.elts else v
                if isinstance(k, ast.Constant) and isinstance(target, ast.Constant) and isinstance(target.value, str):
                    found[k.value] = target.value
    return found


def measured_code(root: Path, scripts: tuple[str, ...]) -> list[str]:
    """The files a figure depends on: its scripts and every module of the repository they import, followed through
    the imports of those modules (a function's imports count too: read from the source, nothing is run)."""
    seen: set[Path] = set()
    todo = [root / s for s in scripts]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        package = path.parent.relative_to(root).parts if path.is_relative_to(root / "bert_repro") else ()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo += [f for a in node.names for f in _module_files(root, a.name, path.parent)]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
                if node.level and not package:
                    continue
                todo += _module_files(root, base, path.parent)
                init = root.joinpath(*base.split("."), "__init__.py")
                lazy = _lazy_exports(init) if init.is_file() else {}
                for a in node.names:  # `from package import name`: a submodule, or a lazy export's module
                    module = lazy.get(a.name, a.name)
                    todo += _module_files(root, f"{base}.{module}", path.parent)[-2:]
    return sorted(str(p.relative_to(root)) for p in seen)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def _code(root: Path, revision: str, path: str) -> str | None:
    """A Python file's code at `revision`, without its comments and docstrings (None: not Python, or absent)."""
    shown = _git(root, "show", f"{revision}:{path}")
    if not path.endswith(".py") or shown.returncode:
        return None
    try:
        tree = ast.parse(shown.stdout)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and type(first.value.value) is str:
                node.body = node.body[1:]
    return ast.dump(tree)


def staleness(root: Path, commit: str | None, scripts: tuple[str, ...]) -> str | None:
    """Why a figure measured at `commit` no longer describes HEAD's code (None: it does). A change to comments and
    docstrings alone leaves a figure as it was."""
    if not commit:
        return "no commit recorded"
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode:
        return f"commit {commit[:7]} is not in this repository"
    changed = _git(root, "diff", "--name-only", commit, "HEAD", "--", *measured_code(root, scripts)).stdout.split()
    changed = [f for f in changed if (old := _code(root, commit, f)) is None or old != _code(root, "HEAD", f)]
    if not changed:
        return None
    more = f" and {len(changed) - 2} more" if len(changed) > 2 else ""
    return f"{', '.join(changed[:2])}{more} changed since {commit[:7]}"


# The README's status table: the targets it shows, named as there (each linking the guide that explains it).
README_ROWS = {
    "gpu_step": "[pre-training step](docs/speed.md#what-was-measured), BERT-BASE, 128 tokens, against transformers' "
    "best (bf16, compiled)",
    "gpu_mfu": "same, MFU of the card's data-sheet peak",
    "cpu_step": "[pre-training step on CPU](docs/speed.md#what-was-measured), BERT-BASE fp32, against transformers",
    "cpu_mfu": "same, MFU of the measured fp32 peak",
    "finetune_fidelity": "[fine-tuning recipe against transformers' script](docs/finetuning.md), dev score",
    "study_mrpc": "[our pre-training against random initialisation](docs/studies.md#on-one-gpu-our-pre-training-beats-"
    "random-initialisation) (`small`), 3 seeds: MRPC F1",
    "study_sst2": "same, SST-2 accuracy",
}
README_BEGIN = "<!-- generated by benchmarks/results_table.py from benchmarks/results/ (do not edit) -->"
README_END = "<!-- end of the generated table -->"


def rows(results: Path, root: Path = ROOT) -> dict[str, dict | None]:
    """target -> its latest figure: text, met, card, file (its name starts with the date), stale (why, or None).
    None: not measured."""
    files = sorted(results.glob("*.json"), key=_order)  # the last file holding a figure is the latest
    reports = [(f, json.loads(f.read_text())) for f in files]
    stale: dict[tuple, str | None] = {}  # (commit, scripts) -> why, once per render
    table: dict[str, dict | None] = {}
    for key, (_, goal, test) in GOALS.items():
        found = [(f, report, fig) for f, report in reports if (fig := FIGURES[key](report)) is not None]
        if not found:
            table[key] = None
            continue
        f, report, (value, text) = found[-1]
        known = (report.get("commit"), SCRIPTS[key])
        if known not in stale:
            stale[known] = staleness(root, *known)
        met = "-" if test is None else ("yes" if test(value) else "no")
        table[key] = {"text": text, "met": met, "card": card(report), "file": f.name, "stale": stale[known]}
    return table


def render(results: Path, root: Path = ROOT, table: dict | None = None) -> str:
    table = rows(results, root) if table is None else table
    lines = [
        "# Results",
        "",
        "Where the project stands: one row per target, its latest figure. Generated by `python",
        "benchmarks/results_table.py` from [results/](results/) (do not edit; CI checks it is current). How each",
        "figure was measured: [README.md](README.md) and the dated [LOG.md](LOG.md). **STALE**: the code the figure's",
        "benchmark imports has changed since the commit it measured (or the file names no commit); measure it again.",
        "",
        "| target | figure | goal | met | card | date | file |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, (what, goal, _) in GOALS.items():
        if (row := table[key]) is None:
            lines.append(f"| {what} | not measured | {goal} | | | | |")
            continue
        text = row["text"] if row["stale"] is None else f"**STALE** ({row['stale']}): {row['text']}"
        name = row["file"]
        lines.append(
            f"| {what} | {text} | {goal} | {row['met']} | {row['card']} | {name[:10]} | [{name}](results/{name}) |"
        )
    return "\n".join(lines) + "\n"


def readme_table(table: dict) -> str:
    """The README's rows (`README_ROWS`) of the same figures; why each STALE one is stale is in RESULTS.md."""
    lines = [README_BEGIN, "| what | figure | goal | met | card, date |", "|---|---|---|---|---|"]
    for key, what in README_ROWS.items():
        row, goal = table[key], GOALS[key][1]
        if row is None:
            lines.append(f"| {what} | not measured | {goal} | | |")
            continue
        text = row["text"] if row["stale"] is None else f"**STALE**: {row['text']}"
        lines.append(f"| {what} | {text} | {goal} | {row['met']} | {row['card']}, {row['file'][:10]} |")
    return "\n".join([*lines, README_END])


def with_readme_table(readme: str, table: dict) -> str:
    """`readme` with its generated table (between README_BEGIN and README_END) made from `table`."""
    start, end = readme.find(README_BEGIN), readme.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"the README has no table between {README_BEGIN!r} and {README_END!r}")
    return readme[:start] + readme_table(table) + readme[end + len(README_END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("--readme", type=Path, help="whose table to rewrite too (default: ours, with our RESULTS.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 when --out or --readme differ from --results")
    args = parser.parse_args(argv)
    table = rows(args.results)
    texts = {args.out: render(args.results, table=table)}
    # The repository's README goes with its own RESULTS.md only: a table written elsewhere leaves it alone.
    readme = args.readme or (ROOT / "README.md" if args.out.resolve() == HERE / "RESULTS.md" else None)
    if readme is not None and readme.is_file():
        texts[readme] = with_readme_table(readme.read_text(), table)
    if args.check:
        stale = [path for path, text in texts.items() if not path.is_file() or path.read_text() != text]
        for path in stale:
            print(f"{path} is not current: run `python benchmarks/results_table.py`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in texts.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
