"""The recipe trains as plain transformers does: from the same examples, initial weights and hyper-parameters, the
same per-step MLM and NSP losses (fp32, CPU, dropout off), through gradient accumulation and the switch to phase 2.

The reference is `BertForPreTraining` and `Trainer` on the recipe's examples in its sampler's order, one schedule and
optimizer across both phases as in the paper, each batch in one forward pass: transformers 5.x's Trainer adds up the
micro-batches' mean losses unscaled, so with 2 it logs twice the loss and clips twice the gradient, while the recipe's
accumulated batch must train as one, as the paper's 256 did. `benchmarks/trajectory.py` compares them with dropout.
"""

import json
from pathlib import Path

import datasets
import pytest
import torch
import torch.nn.functional as F
from support.pretraining_runs import write_config
from transformers import BertForPreTraining, Trainer, TrainingArguments

from bert_repro import BertReproConfig, BertReproForPreTraining
from bert_repro.data.pretraining_examples import IGNORE_INDEX
from bert_repro.data.wordpiece import load_tokenizer
from bert_repro.training.pretraining.examples import build_datasets
from bert_repro.training.pretraining.phases import PhasedSampler, phase_configs, phase_steps
from bert_repro.training.pretraining.recipe import PreTrainingRecipe
from bert_repro.training.pretraining.run import run_pretraining

STEPS, TOLERANCE = 120, 1e-5
LOGGED = ("loss", "mlm_loss", "nsp_loss", "grad_norm", "learning_rate")


def straightforward_collator(pad_id):
    """Rows of the builder (static masks) -> padded inputs; labels: the original ids at masked positions."""

    def collate(rows):
        shape = (len(rows), max(len(r["input_ids"]) for r in rows))
        batch = {
            "input_ids": torch.full(shape, pad_id),
            "token_type_ids": torch.zeros(shape, dtype=torch.long),
            "attention_mask": torch.zeros(shape, dtype=torch.long),
            "labels": torch.full(shape, IGNORE_INDEX),
            "next_sentence_label": torch.tensor([r["next_sentence_label"] for r in rows]),
        }
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            batch["input_ids"][i, :n] = torch.tensor(r["input_ids"])
            batch["token_type_ids"][i, :n] = torch.tensor(r["token_type_ids"])
            batch["attention_mask"][i, :n] = 1
            batch["labels"][i, r["masked_lm_positions"]] = torch.tensor(r["masked_lm_ids"])
        return batch

    return collate


class InOrder(torch.utils.data.IterableDataset):
    """The examples in the order given (Trainer draws a map-style dataset at random)."""

    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def transformers_trajectory(argv, init, output_dir):
    """Per step: loss, MLM/NSP losses, gradient norm, learning rate and width of plain transformers on `argv`'s data."""
    recipe = PreTrainingRecipe.from_args(argv)
    training, batch = recipe.training, recipe.optimization.global_batch_size
    _, phases, _, _ = build_datasets(recipe.data, phase_configs(recipe), training, output_dir / "data")
    steps = phase_steps(training.max_steps, recipe.phase_flags().phase2_fraction, len(phases))
    order = PhasedSampler([len(p) for p in phases], [n * batch for n in steps], training.seed)
    everything = datasets.concatenate_datasets(phases)
    examples = [everything[i] for i in order]

    model = BertForPreTraining.from_pretrained(init)
    losses = []

    def record(module, args, kwargs, out):  # each training forward's two losses, as transformers defines them
        if module.training:
            mlm = F.cross_entropy(out.prediction_logits.flatten(0, 1), kwargs["labels"].flatten())
            nsp = F.cross_entropy(out.seq_relationship_logits, kwargs["next_sentence_label"])
            losses.append((mlm.item(), nsp.item(), kwargs["labels"].shape[1]))

    model.register_forward_hook(record, with_kwargs=True)
    args = TrainingArguments(
        **{
            **training.to_dict(),
            "output_dir": str(output_dir / "reference"),
            "per_device_train_batch_size": batch,
            "gradient_accumulation_steps": 1,
            "save_strategy": "no",
            "eval_strategy": "no",
        }
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=InOrder(examples),
        data_collator=straightforward_collator(load_tokenizer(recipe.data.tokenizer).pad_token_id),
    )
    trainer.train()
    logged = [e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e]
    assert len(logged) == len(losses) == training.max_steps
    return [
        {
            "loss": e["loss"],
            "mlm_loss": mlm,
            "nsp_loss": nsp,
            "grad_norm": e["grad_norm"],
            "learning_rate": e["learning_rate"],
            "width": width,
        }
        for e, (mlm, nsp, width) in zip(logged, losses)
    ]


def recipe_trajectory(argv):
    """The same quantities from the recipe's own log (`log_history.json`, one entry per step)."""
    recipe = PreTrainingRecipe.from_args(argv)
    run_pretraining(recipe)
    training = recipe.training
    history = json.loads((Path(training.output_dir) / "log_history.json").read_text())
    return [{key: e[key] for key in LOGGED} for e in history if "mlm_loss" in e]


@pytest.mark.slow
def test_recipe_trains_as_transformers(tmp_path, corpus_and_tokenizer, one_thread):
    corpus, tokenizer = corpus_and_tokenizer
    torch.manual_seed(0)
    sizes = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = BertReproConfig.from_preset("tiny", vocab_size=len(load_tokenizer(tokenizer)), **sizes, **no_dropout)
    BertReproForPreTraining(config).save_pretrained(tmp_path / "init")  # safetensors, read by both
    # 90 steps at 32 tokens, then 30 at 64; the recipe takes each batch of 8 as 2 micro-batches of 4.
    schedule = dict(max_steps=STEPS, warmup_steps=10, learning_rate=1e-3, weight_decay=0.01)
    settings = dict(model_overrides=None, init_from=str(tmp_path / "init"), per_device_train_batch_size=4)
    run_config = write_config(
        tmp_path / "run.yaml", corpus, tokenizer, save_steps=10_000, eval_fraction=0.0, **settings, **schedule
    )
    argv = ["--config", str(run_config), "--output_dir", str(tmp_path / "recipe")]
    ours = recipe_trajectory(argv)
    reference = transformers_trajectory(argv, tmp_path / "init", tmp_path)
    assert len(ours) == len(reference) == STEPS
    widths = [step["width"] for step in reference]
    assert max(widths[:90]) <= 32 < max(widths[90:]) <= 64  # phase 2 really began at step 91
    for key in LOGGED:
        diffs = [abs(a[key] - b[key]) for a, b in zip(ours, reference)]
        step = max(range(STEPS), key=diffs.__getitem__)
        assert diffs[step] < TOLERANCE, (
            f"{key} differs by {diffs[step]:.2e} at step {step + 1}: {ours[step]} vs {reference[step]}"
        )
