"""`make bench-cpu`: the CPU rows of RESULTS.md (and the README's CPU rows) measured again on HEAD's code.

Runs the CPU benchmarks behind those rows, each in its own process, then writes one dated results file,
benchmarks/results/DATE-cpu[-N].json, naming the commit it measured, the machine and its load average around each
part (the development machine is shared: ratios within a run are what counts), and regenerates RESULTS.md and
the README's table.
Refused while the code the benchmarks import has uncommitted changes: the file could not say what it measured.

    python benchmarks/bench_cpu.py [--parts pretrain_step,encode,build_examples,finetune_mrpc] [--note TEXT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import results_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def pretrain_step(report: dict) -> dict:
    r = report["results"]
    fp32 = report["matmul_peak_measurements"]["fp32"]
    switches = r["ours fp32 switches"]
    return {
        "transformers_fp32_tokens_per_s": r["transformers fp32"]["tokens_per_second"],
        "ours_default_tokens_per_s": r["ours fp32"]["tokens_per_second"],
        "ours_switches_tokens_per_s": switches["tokens_per_second"],
        "ours_switches_compile_tokens_per_s": r["ours fp32 switches+compile"]["tokens_per_second"],
        "ours_bf16_tokens_per_s": r["ours bf16 switches+compile"]["tokens_per_second"],
        "ours_switches_mfu": switches["mfu_fp32_peak"],
        "ours_switches_mfu_executed": switches["mfu_fp32_peak_executed"],
        "fp32_peak_gflops": max(fp32),
        # the MFU's denominator held within 10% through the run: a neighbour's load did not move it
        "peak_trusted": min(fp32) >= 0.9 * max(fp32),
    }


def encode(report: dict) -> dict:
    names = {"minilm": "all-MiniLM-L6-v2", "base": "BERT-BASE"}
    return {
        "inputs_per_s": {
            names.get(model, model): {
                "transformers": rows["transformers BertModel (sdpa)"]["inputs_per_second"],
                "ours_unpad": rows["ours, unpad_inputs"]["inputs_per_second"],
            }
            for model, rows in report["models"].items()
        }
    }


def finetune_mrpc(report: dict) -> dict:
    theirs = [r["train_seconds"] for r in report["transformers_runs"]]
    ours = report["results"]["ours all switches"]
    return {
        "transformers_train_s": theirs,
        "ours_train_s": ours["train_seconds"],
        "ratio_to_mean": ours["train_seconds"] / statistics.mean(theirs),
        "dev": {
            side: {k: round(100 * v if v <= 1 else v, 2) for k, v in r.items() if k in ("accuracy", "f1")}
            for side, r in (("ours", ours), ("transformers", report["results"]["transformers"]))
        },
    }


# part -> (script and arguments, its benchmark.json -> what the results file keeps of one run)
PARTS = {
    "pretrain_step": (
        ["pretrain_step.py", "--preset", "base", "--accumulation", "4", "--steps", "2", "--warmup", "2"],
        pretrain_step,
    ),
    "encode": (["encode.py", "--rounds", "2"], encode),
    "build_examples": (["build_examples.py"], lambda report: report),
    "finetune_mrpc": (["finetune_mrpc.py", "--epochs", "1", "--variants", "ours all switches"], finetune_mrpc),
}
SCRIPTS = {part: (f"benchmarks/{argv[0]}",) for part, (argv, _) in PARTS.items()}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def results_path(results: Path, date: str) -> Path:
    """DATE-cpu.json, or that day's next free DATE-cpu-N.json (as gpu_session.py's `record` numbers them)."""
    path, n = results / f"{date}-cpu.json", 1
    while path.exists():
        n += 1
        path = results / f"{date}-cpu-{n}.json"
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--runs", type=int, default=1, help="runs of each part (each a line of its table)")
    parser.add_argument("--note", default="", help="what the file should say about the machine or the run")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := [p for p in parts if p not in PARTS]:
        parser.exit(2, f"bench_cpu.py: error: --parts: unknown {', '.join(unknown)}; known: {', '.join(PARTS)}\n")
    code = sorted({f for p in parts for f in results_table.measured_code(ROOT, SCRIPTS[p])})
    if dirty := git("status", "--porcelain", "--", *code):
        parser.exit(2, f"bench_cpu.py: error: commit first; the measured code has changes:\n{dirty}\n")

    from common import machine

    commit = git("rev-parse", "HEAD")
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit,
        "machine": machine(),
        "card": f"CPU ({os.cpu_count()} cores)",
        "command": "python benchmarks/bench_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "note": args.note,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as scratch:
        for part in parts:
            script, keep = PARTS[part]
            runs = []
            for k in range(args.runs):
                out = Path(scratch, f"{part}-{k}")
                load_before = os.getloadavg()[0]
                subprocess.run(
                    [sys.executable, str(HERE / script[0]), *script[1:], "--out", str(out)], env=env, check=True
                )
                run = keep(json.loads((out / "benchmark.json").read_text()))
                runs.append({**run, "load_average": [load_before, os.getloadavg()[0]]})
            report[part] = {"command": f"python benchmarks/{' '.join(script)}", "runs": runs}
    path = results_path(args.results, report["date"])
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return results_table.main(["--results", str(args.results)])


if __name__ == "__main__":
    sys.exit(main())
