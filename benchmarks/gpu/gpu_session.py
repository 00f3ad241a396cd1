"""The machine-readable side of `benchmarks/gpu/run_gpu.sh`: probe the machine, gather a run's results, record.

    python benchmarks/gpu/gpu_session.py probe --out runs/gpu/probe.json   # versions, imports, CUDA (3: none)
    python benchmarks/gpu/gpu_session.py collect --results runs/gpu --out runs/gpu/results.json
    python benchmarks/gpu/gpu_session.py record path/to/results.json       # on any machine, after the run
    python benchmarks/gpu/gpu_session.py pack MODEL_DIR OUT/prefix         # a model as bf16 parts under 16 MiB
    python benchmarks/gpu/gpu_session.py travels .gpu .travel              # what a device call carries (1: too much)

`pack` writes a model directory as a tar (bf16 safetensors) cut into parts that a device call can
return (`cat prefix.tar.* | tar x` puts it together again).

`probe` and `collect` run on the GPU machine (run_gpu.sh calls them); `collect` imports nothing heavy, so that
it can run after every step and a run cut short still returns what it measured. `record` writes
`benchmarks/results/<date>-<device>[-study].json`, adds the run's table to `benchmarks/LOG.md` (section "GPU runs as
recorded") and rewrites `benchmarks/RESULTS.md` and the README's table (benchmarks/results_table.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- gpu_session.py record adds each run's table below this line -->"
# Dense bf16 peaks from the cards' data sheets (TFLOP/s, without sparsity), by a part of the device's name: the
# issue's MFU target is against these; the benchmark's own MFU is against the matmul peak measured in the run.
SPEC_BF16_PEAK = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200": 989.4, "A100": 312.0}
PACKAGES = [
    "torch",
    "transformers",
    "datasets",
    "accelerate",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "numpy",
    "pyarrow",
    "triton",
    "flash_attn",
    "torchao",
]


# ------------------------------------------------------------------------------------------------------------
# probe: what this machine has, each import timed and printed before it starts (a hang shows where)
# ------------------------------------------------------------------------------------------------------------


def probe(out: Path) -> int:
    import importlib
    import importlib.metadata as metadata
    import platform

    report = {"python": sys.executable, "python_version": platform.python_version(), "versions": {}}
    for name in PACKAGES:
        try:
            report["versions"][name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            report["versions"][name] = None
    # torchao unpacked by run_gpu.sh is on the FP8 processes' path only
    for found in metadata.distributions(path=[os.environ["FP8_PATH"]] if os.environ.get("FP8_PATH") else []):
        name = found.metadata["Name"]
        report["versions"][name] = report["versions"].get(name) or found.version
    print(json.dumps(report, indent=1), flush=True)
    modules = ["torch", "transformers", "datasets", "accelerate", "bert_repro", "bert_repro.training"]
    for module in modules:
        print(f"import {module} ...", end=" ", flush=True)
        start = time.perf_counter()
        importlib.import_module(module)
        print(f"{time.perf_counter() - start:.1f} s", flush=True)
    import torch

    report["cuda"] = torch.cuda.is_available()
    if report["cuda"]:
        print("CUDA: first matrix product ...", flush=True)
        sys.path.insert(0, str(ROOT / "benchmarks"))  # common.py, shared with the CPU benchmarks
        from common import matmul_peak

        report["device"] = torch.cuda.get_device_name()
        report["bf16_matmul_tflops"] = round(matmul_peak(torch.bfloat16, n=8192, device="cuda") / 1e3, 1)
        print(f"{report['device']}: bf16 matmul {report['bf16_matmul_tflops']} TFLOP/s", flush=True)
    else:
        print("no CUDA: torch.cuda.is_available() is False", flush=True)
    out.write_text(json.dumps(report, indent=1))
    return 0 if report["cuda"] else 3


# ------------------------------------------------------------------------------------------------------------
# collect: the run's files -> one JSON
# ------------------------------------------------------------------------------------------------------------


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(progress: Path) -> list[dict]:
    """progress.log's lines `... start NAME (limit Ls)` / `... end NAME: exit RC after Ss` as records."""
    found: dict[str, dict] = {}
    text = progress.read_text() if progress.is_file() else ""
    for m in re.finditer(r"start (\S+) \(limit (\d+) s\)", text):
        found[m[1]] = {"name": m[1], "limit_s": int(m[2]), "exit": None, "seconds": None}
    for m in re.finditer(r"end (\S+): exit (\d+) after (\d+) s", text):
        found.setdefault(m[1], {"name": m[1]}).update(exit=int(m[2]), seconds=int(m[3]))
    for m in re.finditer(r"skip (\S+): (.*)", text):
        found[m[1]] = {"name": m[1], "skipped": m[2]}
    return list(found.values())


def benchmark_rows(results: Path) -> tuple[list[dict], float | None]:
    rows, peak = [], None
    for path in sorted(results.glob("bench_*.json")):
        report = read_json(path) or {}
        peak = report.get("bf16_matmul_peak_tflops", peak)
        for setting in report.get("settings", []):
            for variant, r in setting["results"].items():
                row = {
                    "setting": f"{setting['preset']}:{setting['max_seq_length']}",
                    "batch_size": setting["batch_size"],
                    "variant": variant,
                }
                keys = (
                    "tokens_per_second",
                    "mfu",
                    "ratio_to_transformers_best",
                    "max_memory_gib",
                    "warmup_seconds",
                    "error",
                    "ran",
                )
                row.update({k: r[k] for k in keys if k in r})
                rows.append(row)
    return rows, peak


def test_counts(log: Path) -> dict | None:
    if not log.is_file():
        return None
    summary = re.compile(r"\d+ (passed|failed|skipped|error)")
    lines = [line for line in log.read_text().splitlines() if summary.search(line)]
    if not lines:
        return {"summary": "no summary line (killed?)"}
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)", lines[-1])}
    return {"summary": lines[-1].strip("= "), **counts}


def pretraining(run: Path) -> dict | None:
    history = read_json(run / "log_history.json")
    if history is None:  # killed before the end: the latest checkpoint's state
        states = sorted(run.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
        history = (read_json(states[-1]) or {}).get("log_history") if states else None
    if not history:
        return None
    losses = [[h["step"], round(h["loss"], 4)] for h in history if "loss" in h]
    evals = {k: v for h in history for k, v in h.items() if k.startswith("eval_")}
    end = next((h for h in reversed(history) if "train_runtime" in h), {})
    return {
        "steps": max((h.get("step", 0) for h in history), default=0),
        "loss_curve": losses,
        "final_loss": losses[-1][1] if losses else None,
        "last_eval": evals,
        "train_runtime_s": end.get("train_runtime"),
        "finished": (run / "model.safetensors").is_file(),
    }


def micro(folder: Path) -> dict | None:
    """The part micro's JSON, with the stages of its FP8 process (micro_fp8.json) added."""
    report, fp8 = read_json(folder / "micro.json"), read_json(folder / "micro_fp8.json")
    if report and fp8:
        report["stages"].update(fp8.get("stages", {}))
    return report or fp8


def collect(results: Path, out: Path, command: str) -> dict:
    probe_report = read_json(results / "probe.json") or {}
    smi = (results / "nvidia_smi.log").read_text().strip() if (results / "nvidia_smi.log").is_file() else ""
    fields = [f.strip() for f in smi.splitlines()[-1].split(",")] if smi and smi.count(",") >= 2 else []
    rows, peak = benchmark_rows(results)
    commit = (results / "commit.txt").read_text().strip() if (results / "commit.txt").is_file() else None
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "device": probe_report.get("device") or (fields[0] if fields else None),
        "driver": fields[1] if len(fields) > 1 else None,
        "memory": fields[2] if len(fields) > 2 else None,
        "cuda": probe_report.get("cuda"),
        "python": probe_report.get("python_version"),
        "versions": probe_report.get("versions", {}),
        "commit": commit,
        "command": command,
        "bf16_matmul_peak_tflops": peak or probe_report.get("bf16_matmul_tflops"),
        "steps": steps(results / "progress.log"),
        "cuda_tests": test_counts(results / "cuda_tests.log"),
        "benchmark": rows,
        "pretraining": pretraining(results / "pretrain_small"),
        "mrpc": read_json(results / "mrpc" / "results.json"),
        # benchmarks/gpu/study_gpu.sh: each study's table, and the pre-training behind the first
        "study": {
            name: {**read_json(d / "study.json"), "markdown": (d / "study.md").read_text()}
            for name in ("pretraining", "table5")
            if (d := results / f"study_{name}").joinpath("study.json").is_file() and (d / "study.md").is_file()
        },
        "study_pretraining": pretraining(results / "study_pretraining" / "pretrain" / "pretrained"),
        # the part micro writes into OUT, the part profile's split of the step's time (profile_split.py)
        "micro": micro(out.parent) or micro(results),
        "profile": read_json(results / "profile_split.json"),
    }
    if report["mrpc"]:
        report["mrpc"] = {k: report["mrpc"].get(k) for k in ("best", "runs", "hyperparameters", "seconds")}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out)
    return report


# ------------------------------------------------------------------------------------------------------------
# record: a returned results.json -> benchmarks/results/<date>-<device>.json + a table in benchmarks/LOG.md
# ------------------------------------------------------------------------------------------------------------


def spec_peak(device: str | None) -> float | None:
    return next((v for k, v in SPEC_BF16_PEAK.items() if device and k in device), None)


def markdown(report: dict, name: str) -> str:
    v = report.get("versions", {})
    device = report.get("device") or "no CUDA device"
    peak, spec = report.get("bf16_matmul_peak_tflops"), spec_peak(report.get("device"))
    lines = [
        f"### {report['date']}, {device} (`benchmarks/results/{name}`)",
        "",
        textwrap.fill(
            f"Driver {report.get('driver')}, torch {v.get('torch')}, transformers "
            f"{v.get('transformers')}, datasets {v.get('datasets')}, Python {report.get('python')}; "
            f"commit {report.get('commit')}; measured bf16 matmul peak "
            f"{peak if peak is None else round(peak, 1)} TFLOP/s (the card's data sheet: "
            f"{spec} TFLOP/s dense bf16); command "
            f"`{report.get('command')}`.",
            110,
        ),
        "",
    ]
    if report.get("benchmark"):
        lines += [
            "| setting | variant | tokens/s | MFU (measured peak) | MFU (data sheet) | x transformers' best |",
            "|---|---|---|---|---|---|",
        ]
        for r in report["benchmark"]:
            if "error" in r:  # failed, or invalid: its record disagreed with its label (gpu_pretrain.py)
                text = r["error"][:80] if r["error"].startswith("invalid") else f"failed: {r['error'][:80]}"
                lines.append(f"| {r['setting']} | {r['variant']} | {text} | | | |")
            else:
                sheet = f"{r['mfu'] * peak / spec:.1%}" if peak and spec else "?"
                lines.append(
                    f"| {r['setting']} | {r['variant']} | {r['tokens_per_second']:,.0f} "
                    f"| {r['mfu']:.1%} | {sheet} | {r['ratio_to_transformers_best']:.2f} |"
                )
        lines.append("")
    tests = report.get("cuda_tests")
    pre, mrpc = report.get("pretraining"), report.get("mrpc")
    text = f"CUDA tests: {tests['summary'] if tests else 'not run'}."
    if pre:
        text += f" Pre-training: {pre['steps']} steps, final loss {pre['final_loss']}."
    if mrpc and mrpc.get("best"):
        scores = ", ".join(f"{k} {100 * v:.2f}" for k, v in mrpc["best"]["validation"].items())
        text += f" MRPC dev: {scores} (learning rate {mrpc['best']['learning_rate']})."
    no_cuda = {"probe", "import_torch_1", "import_torch_2", "import_torch_3"}  # exit 3: "no CUDA", said above
    failed = [
        s["name"]
        for s in report.get("steps", [])
        if s.get("exit") not in (0, None) and not (s["exit"] == 3 and s["name"] in no_cuda)
    ]
    if failed:
        text += f" Steps that failed or were killed: {', '.join(failed)}."
    lines.append(textwrap.fill(text, 110))
    micro = report.get("micro") or {}
    if micro.get("stages"):
        counts = {k: "failed" if "error" in v else f"{len(v.get('rows', []))} rows" for k, v in micro["stages"].items()}
        stages = ", ".join(f"{k} ({n})" for k, n in counts.items())
        lines += ["", f"Microbenchmarks (`gpu_micro.py`, in the results file under `micro`): {stages}."]
    profile = report.get("profile") or {}
    if profile.get("split_ms"):
        columns = list(profile["split_ms"])
        lines += ["", "Where the step's time goes (`profile_split.py`, ms a step):", ""]
        lines += ["| kind | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for kind in profile["split_ms"][columns[0]]:
            lines.append(f"| {kind} | " + " | ".join(f"{profile['split_ms'][c][kind]:.1f}" for c in columns) + " |")
    for name, study in (report.get("study") or {}).items():  # its own table, as study.py wrote it
        lines += ["", f"Study `{name}` (`benchmarks/gpu/study_gpu.sh`):", "", *study["markdown"].splitlines()[2:]]
    return "\n".join(lines) + "\n"


def record(path: Path) -> None:
    report = read_json(path)
    if not isinstance(report, dict) or "steps" not in report:
        sys.exit(f"error: {path} is not a results.json written by `gpu_session.py collect`")
    device = re.sub(r"[^a-z0-9]+", "-", (report.get("device") or "no-cuda").lower()).strip("-")
    results = ROOT / "benchmarks" / "results"
    if any(json.loads(f.read_text()) == report for f in results.glob("*.json")):
        sys.exit(f"error: {path} is recorded already (nothing was written)")
    kind = "-study" if report.get("study") else ""
    name, n = f"{report['date']}-{device}{kind}.json", 1
    while (results / name).exists():  # several calls a day on one card: -2, -3, ...
        n += 1
        name = f"{report['date']}-{device}{kind}-{n}.json"
    target = results / name
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps(report, indent=1) + "\n")
    log = ROOT / "benchmarks" / "LOG.md"
    text = log.read_text()
    if MARKER not in text:
        sys.exit(f"error: {log} lacks the line {MARKER!r}; wrote {target} only")
    log.write_text(text.replace(MARKER, MARKER + "\n\n" + markdown(report, name).rstrip("\n"), 1))
    # the one-screen table follows the files at once, so that CI never finds it behind them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import results_table

    results_table.main(["--results", str(results), "--out", str(ROOT / "benchmarks" / "RESULTS.md")])
    print(f"wrote {target} and its table in {log}")


DEVICE_LIMIT = 64 * 2**20  # what one device call carries: the tree git does not ignore, and the carried paths
MARGIN = 2**20  # the transfer's own files


def travelling_bytes(root: Path, carried: list[Path]) -> tuple[int, int]:
    """(bytes of the tree git does not ignore, bytes of the carried paths) as a device call sends them."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.split(b"\0")
    tree = sum((root / os.fsdecode(n)).stat().st_size for n in listed if n and (root / os.fsdecode(n)).is_file())
    extra = 0
    for path in carried:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        extra += sum(f.stat().st_size for f in files)
    return tree, extra


def travels(root: Path, carried: list[Path]) -> int:
    """Print what a device call would carry; 1 when it passes the limit (less a margin), else 0."""
    tree, extra = travelling_bytes(root, carried)
    total = tree + extra
    names = " ".join(str(p) for p in carried)
    print(f"travels: tree {tree // 1024} KiB + {names} {extra // 1024} KiB = {total / 2**20:.1f} MiB (limit 64 MiB)")
    if total >= DEVICE_LIMIT - MARGIN:
        print(f"error: more than the device's {DEVICE_LIMIT // 2**20} MiB: carry less", file=sys.stderr)
        return 1
    return 0


def pack(model: Path, prefix: Path, part_mib: int = 15) -> list[Path]:
    """`model` (a saved bert_repro model) in bf16, as a tar of its safetensors and other files, cut
    into parts of `part_mib` MiB: `prefix.tar.0`, `.1`, ..."""
    import io
    import tarfile
    import tempfile

    import torch

    from bert_repro import BertReproForPreTraining
    from bert_repro.model import TOKENIZER_FILES

    weights = BertReproForPreTraining.from_pretrained(model, dtype=torch.bfloat16)
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        weights.save_pretrained(tmp)  # one file: the tar is cut into parts anyway
        for name in TOKENIZER_FILES + (
            "results.json",
            "log_history.json",
            "training_curves.png",
            "run_config.json",
            "data_statistics.json",
        ):
            if (model / name).is_file():
                Path(tmp, name).write_bytes((model / name).read_bytes())
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(tmp, arcname=model.name)
    data, parts = buffer.getvalue(), []
    size = part_mib * 1024 * 1024
    for i in range(0, len(data), size):
        parts.append(prefix.with_name(f"{prefix.name}.tar.{i // size}"))
        parts[-1].write_bytes(data[i : i + size])
    print(f"{model}: {len(data) / 2**20:.1f} MiB in {len(parts)} part(s) {prefix}.tar.*")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("collect")
    c.add_argument("--results", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--command", default="bash benchmarks/gpu/run_gpu.sh")
    r = sub.add_parser("record")
    r.add_argument("results_json", type=Path)
    t = sub.add_parser("travels")
    t.add_argument("carried", type=Path, nargs="*")
    k = sub.add_parser("pack")
    k.add_argument("model", type=Path)
    k.add_argument("prefix", type=Path)
    args = parser.parse_args()
    if args.action == "probe":
        sys.exit(probe(args.out))
    if args.action == "collect":
        collect(args.results, args.out, args.command)
    elif args.action == "travels":
        sys.exit(travels(ROOT, args.carried))
    elif args.action == "pack":
        pack(args.model, args.prefix)
    else:
        record(args.results_json)


if __name__ == "__main__":
    main()
