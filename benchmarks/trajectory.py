"""The recipe's training against plain transformers' with dropout on: the same curve within seed noise?

For each seed: a small BERT initialised with that seed and saved (safetensors); the recipe (`run_pretraining`,
batches of 16 as 2 accumulated micro-batches of 8) and plain transformers (`BertForPreTraining` + `Trainer`,
one batch of 16, the collator of tests/training/test_trajectory.py) train it on the same examples in the same order
with the same hyper-parameters and dropout 0.1, for `--steps` steps (the last 10% in phase 2: 64 tokens
instead of 32). With dropout on, the two cannot agree step by step (their dropout masks differ). Printed: the
mean MLM and NSP losses over windows of steps for both loops, the recipe minus transformers on each seed, and
seed minus seed for each loop (the noise those differences are judged against). The equality step by step,
dropout off, is tests/training/test_trajectory.py.

    python benchmarks/trajectory.py [--steps 1600] [--seeds 1 2] [--corpus ../shared/data/corpus/gutenberg]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/support
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "training"))  # the reference loop is the test's

import torch
import yaml
from common import machine
from test_trajectory import recipe_trajectory, transformers_trajectory

from bert_repro import BertReproConfig, BertReproForPreTraining
from bert_repro.data import load_corpus, save_tokenizer, train_wordpiece

BOOKS = [
    "austen-persuasion.txt",
    "chesterton-brown.txt",
    "chesterton-thursday.txt",
    "shakespeare-hamlet.txt",
    "blake-songs.txt",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared/data/corpus/gutenberg"))
    parser.add_argument("--work_dir", default="/tmp/bert_repro_trajectory")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--jobs", type=int, default=2, help="seeds trained at once, one process each")
    args = parser.parse_args()
    work = Path(args.work_dir)
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for name in BOOKS:  # one document per book
        (corpus / name).write_text((Path(args.corpus) / name).read_text(encoding="utf-8", errors="replace"))
    if not (work / "tokenizer" / "tokenizer.json").exists():  # once: WordPiece training is not deterministic
        texts = load_corpus(str(corpus), document_boundary="file")["text"]
        tokenizer = train_wordpiece(iterator=texts, vocab_size=2000, show_progress=False)
        save_tokenizer(tokenizer, work / "tokenizer")
    vocab_size = len((work / "tokenizer" / "vocab.txt").read_text().splitlines())

    jobs = [(seed, vocab_size, work, args) for seed in args.seeds]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        curves = {key: curve for result in pool.map(train_seed, *zip(*jobs)) for key, curve in result.items()}
    (work / "curves.json").write_text(json.dumps({f"{n}-{s}": c for (n, s), c in curves.items()}))
    torch.set_num_threads(args.threads)  # as in each process, for the machine's description
    print(
        f"\n{machine()}, {args.jobs} processes; {args.steps} steps, dropout 0.1, seeds {args.seeds}; "
        f"curves in {work / 'curves.json'}\n"
    )
    print(table(curves, args.steps, args.seeds))


def train_seed(seed: int, vocab_size: int, work: Path, args) -> dict:
    """Both loops from one initialisation of `seed`: {(loop, seed): per-step losses}."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(seed)
    config = BertReproConfig.from_preset(
        "tiny",
        vocab_size=vocab_size,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    init = work / f"init-{seed}"
    BertReproForPreTraining(config).save_pretrained(init)
    run_config = work / f"run-{seed}.yaml"
    run_config.write_text(
        yaml.safe_dump(
            {
                "corpus": [str(work / "corpus")],
                "document_boundary": "file",
                "tokenizer": str(work / "tokenizer"),
                "init_from": str(init),
                "max_seq_length": 32,
                "max_predictions_per_seq": 5,
                "dupe_factor": 3,
                "phase2_fraction": 0.1,
                "phase2_max_seq_length": 64,
                "phase2_max_predictions_per_seq": 10,
                "global_batch_size": 16,
                "per_device_train_batch_size": 8,
                "max_steps": args.steps,
                "warmup_steps": args.steps // 10,
                "learning_rate": 1e-3,
                "seed": seed,
                "logging_steps": 1,
                "save_steps": 10 * args.steps,
                "eval_fraction": 0.0,
                "use_cpu": True,
                "report_to": "none",
                "disable_tqdm": True,
                "num_proc": 1,
                "plot": False,
            }
        )
    )
    argv = ["--config", str(run_config), "--output_dir", str(work / f"recipe-{seed}"), "--overwrite_output_dir", "true"]
    curves = {}
    for name, train in (
        ("recipe", lambda: recipe_trajectory(argv)),
        ("transformers", lambda: transformers_trajectory(argv, init, work / f"ref-{seed}")),
    ):
        start = time.time()
        curves[name, seed] = train()
        print(f"{name}, seed {seed}: {args.steps} steps in {time.time() - start:.0f} s", flush=True)
    return curves


def table(curves: dict, steps: int, seeds: list[int]) -> str:
    """Mean losses over windows of steps: each loop (mean over the seeds), the recipe minus transformers on
    each seed, and seed minus seed for each loop."""
    phase1 = steps - round(steps * 0.1)
    edges = [0, phase1 // 6, phase1 // 3, 2 * phase1 // 3, phase1, steps]
    first, last = seeds[0], seeds[-1]
    header = (
        f"| steps | loss | recipe | transformers | recipe − transformers, per seed "
        f"| seed {first} − seed {last}: recipe, transformers |"
    )
    lines = [header, "|---|---|---|---|---|---|"]
    for lo, hi in zip(edges, edges[1:]):
        for key in ("mlm_loss", "nsp_loss"):
            mean = {k: sum(e[key] for e in c[lo:hi]) / (hi - lo) for k, c in curves.items()}
            ours = sum(mean["recipe", s] for s in seeds) / len(seeds)
            theirs = sum(mean["transformers", s] for s in seeds) / len(seeds)
            deltas = ", ".join(f"{mean['recipe', s] - mean['transformers', s]:+.4f}" for s in seeds)
            spread = (
                f"{mean['recipe', first] - mean['recipe', last]:+.4f}, "
                f"{mean['transformers', first] - mean['transformers', last]:+.4f}"
            )
            window = f"{lo + 1}-{hi}" + (" (phase 2)" if lo >= phase1 else "")
            lines.append(f"| {window} | {key[:3].upper()} | {ours:.4f} | {theirs:.4f} | {deltas} | {spread} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
