"""How much sentiment a model's frozen features hold: a linear probe on SST-2, no fine-tuning.

Each model encodes SST-2 sentences once (no gradient); the mean over the tokens of its embedding output and of its
last hidden layer are fed to a logistic regression (scikit-learn) trained on 2,000 and on 8,000 training
sentences (the same random ones for every model), scored on the dev set. A pre-trained model whose features carry
nothing the task can use scores like a randomly initialised one; a well pre-trained one scores far above it.
It takes about a minute per small model on one CPU core, so it tells in minutes whether a pre-training run is worth
fine-tuning (README, "The paper's experiments").

    python benchmarks/feature_probe.py --sst2 path/to/glue/SST-2 runs/pretrained runs/random path/to/other-bert
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from transformers import AutoModel, AutoTokenizer


def read_sst2(path: Path) -> tuple[list[str], np.ndarray]:
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows], np.array([int(r["label"]) for r in rows])


def load(model_dir: str):
    directory = Path(model_dir)
    # A Trainer checkpoint-N directory holds the weights; its run's tokenizer is one level up.
    tokenizer_dir = directory if (directory / "tokenizer.json").exists() or not directory.exists() else directory.parent
    return AutoTokenizer.from_pretrained(str(tokenizer_dir)), AutoModel.from_pretrained(model_dir).eval()


def mean_pooled(tokenizer, model, sentences: list[str], batch_size: int = 256) -> dict[str, np.ndarray]:
    """Mean over the real tokens of the embedding output ("embeddings") and of the last layer ("last")."""
    out: dict[str, list[np.ndarray]] = {"embeddings": [], "last": []}
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            batch = tokenizer(
                sentences[start : start + batch_size], padding=True, truncation=True, max_length=64, return_tensors="pt"
            )
            hidden = model(**batch, output_hidden_states=True).hidden_states
            mask = batch["attention_mask"].unsqueeze(-1).float()
            for name, states in (("embeddings", hidden[0]), ("last", hidden[-1])):
                out[name].append(((states * mask).sum(1) / mask.sum(1)).numpy())
    return {name: np.concatenate(parts) for name, parts in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model directories (or Hub ids) with a BERT encoder")
    parser.add_argument("--sst2", required=True, type=Path, help="a directory with GLUE's SST-2 train.tsv and dev.tsv")
    parser.add_argument("--sizes", nargs="+", type=int, default=[2000, 8000], help="training sentences per probe")
    args = parser.parse_args(argv)
    for name in ("train.tsv", "dev.tsv"):
        if not (args.sst2 / name).is_file():
            print(
                f"feature_probe.py: error: {args.sst2 / name} does not exist; --sst2 takes GLUE's SST-2 directory.",
                file=sys.stderr,
            )
            return 2
    train_x, train_y = read_sst2(args.sst2 / "train.tsv")
    dev_x, dev_y = read_sst2(args.sst2 / "dev.tsv")
    chosen = np.random.default_rng(0).permutation(len(train_x))[: max(args.sizes)]
    train_x, train_y = [train_x[i] for i in chosen], train_y[chosen]
    print("| model | " + " | ".join(f"{f} @ {n}" for f in ("embeddings", "last") for n in args.sizes) + " |")
    print("|---|" + "---|" * (2 * len(args.sizes)))
    for model_dir in args.models:
        tokenizer, model = load(model_dir)
        train_f, dev_f = mean_pooled(tokenizer, model, train_x), mean_pooled(tokenizer, model, dev_x)
        scores = []
        for features in ("embeddings", "last"):
            for n in args.sizes:
                probe = LogisticRegression(max_iter=2000).fit(train_f[features][:n], train_y[:n])
                scores.append(f"{100 * probe.score(dev_f[features], dev_y):.1f}")
        print(f"| {model_dir} | " + " | ".join(scores) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
