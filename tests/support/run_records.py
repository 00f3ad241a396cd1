"""Run records as bert_repro's recipes leave them, for model cards: config.json, Trainer's arguments (with the
fields that must not reach a card), a fine-tuning run's results.json and run_config.json."""

from __future__ import annotations

import json
from pathlib import Path

from support.task_files import GLUE_HP

FAKE_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def update_json(path: Path, **fields) -> None:
    """Add or replace top-level fields of a JSON record."""
    write_json(path, {**json.loads(path.read_text()), **fields})


def bert_config(preset: str = "tiny", vocab_size: int = 8192, **extra) -> dict:
    from bert_repro.model.configuration_bert_repro import PRESETS

    return {
        "architectures": ["BertReproForPreTraining"],
        "model_type": "bert_repro",
        "hidden_act": "gelu",
        "vocab_size": vocab_size,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "layer_norm_eps": 1e-12,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        **PRESETS[preset],
        **extra,
    }


def training_arguments(**overrides) -> dict:
    """A realistic slice of `TrainingArguments.to_dict()`, with the fields that must not reach a card."""
    return {
        "output_dir": "/home/someone/private/runs/out",
        "per_device_train_batch_size": 32,
        "num_train_epochs": 3.0,
        "max_steps": 1000,
        "learning_rate": 0.001,
        "lr_scheduler_type": "linear",
        "warmup_steps": 100.0,
        "optim": "adamw_torch_fused",
        "weight_decay": 0.01,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-06,
        "gradient_accumulation_steps": 1,
        "max_grad_norm": 1.0,
        "bf16": False,
        "fp16": False,
        "tf32": None,
        "eval_strategy": "steps",
        "eval_steps": 250,
        "save_steps": 500,
        "seed": 12345,
        "data_seed": None,
        "run_name": "private-run-name",
        "project": "huggingface",
        "deepspeed": None,
        "accelerator_config": {"split_batches": False, "even_batches": True, "use_seedable_sampler": True},
        "debug": [],
        "hub_token": FAKE_TOKEN,
        "hub_model_id": "someone/private-repo",
        "push_to_hub": False,
        "trackio_space_id": "someone/private-space",
        "local_rank": -1,
        **overrides,
    }


def finetuning_run(
    root: Path,
    name: str,
    best: dict,
    runs: list[dict],
    *,
    task: str | None = None,
    model: str = "runs/base",
    hp: dict = GLUE_HP,
    run_fields: dict | None = None,
    num_labels: int = 2,
    head: str = "BertReproForSequenceClassification",
) -> Path:
    """A fine-tuning output directory under ``root / name`` (the task: ``name`` unless given)."""
    task = task or name
    out = root / name
    summary = {
        "task": task,
        "model": model,
        "main_metric": best.pop("_main"),
        "best": best,
        "runs": runs,
        "hyperparameters": hp,
        "seconds": 1290.4,
        "test_predictions": [],
    }
    write_json(out / "results.json", summary)
    run = {
        "task": task,
        "model": model,
        "data": [],
        "tokenizer": None,
        "learning_rates": hp["learning_rates"],
        "seeds": hp["seeds"],
        "max_seq_length": hp["max_seq_length"],
        "doc_stride": 128,
        "max_query_length": 64,
        "n_best_size": 20,
        "max_answer_length": 30,
        "max_train_samples": None,
        "max_eval_samples": None,
        "attn_implementation": "sdpa",
        "predict_test": True,
        "keep_all_runs": False,
        **(run_fields or {}),
    }
    training = training_arguments(
        learning_rate=2e-05, warmup_steps=0.1, max_steps=-1, seed=42, adam_epsilon=1e-06, eval_strategy="no"
    )
    write_json(out / "run_config.json", {"schema_version": 2, "finetuning": run, "training": training})
    labels = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    write_json(out / "config.json", bert_config("base", 30522, architectures=[head], id2label=labels))
    return out
