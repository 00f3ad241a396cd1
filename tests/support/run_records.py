"""Run records as bert_repro's recipes leave them, for model cards: config.json, Trainer's arguments (with the
fields that must not reach a card), and the other records a pre-training or fine-tuning run leaves."""

from __future__ import annotations

import json
from pathlib import Path

from bert_repro.training.pretraining.recipe import PreTrainingRecipe
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
    task: str,
    best: dict,
    runs: list[dict],
    *,
    model: str = "runs/base",
    hp: dict = GLUE_HP,
    run_fields: dict | None = None,
    num_labels: int = 2,
    head: str = "BertReproForSequenceClassification",
) -> Path:
    """A fine-tuning output directory of the task `task`, under ``root / task``."""
    out = root / task
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


def _stats(documents, sentences, examples, tokens, masked, is_next=0.4709, max_seq_length=None) -> dict:
    stats = {
        "documents": documents,
        "documents_skipped": {"empty": 0, "binary": 0},
        "one_sentence_documents": 0,
        "sentences": sentences,
        "document_tokens": tokens // 3,
        "examples": examples,
        "tokens": tokens,
        "is_next_share": is_next,
        "length_histogram": {"0-8": 2, "27-35": 304, "117-125": 609, "126-134": examples - 915},
        "masked": masked,
        "masked_share": masked / tokens,
        "masked_split": {"mask": 0.7999, "random": 0.0997, "unchanged": 0.1004},
    }
    return stats if max_seq_length is None else {"max_seq_length": max_seq_length, **stats}


def make_pretraining_run(
    root: Path,
    *,
    name: str = "pretrain",
    corpus=("Salesforce/wikitext",),
    phase2: bool = True,
    with_results: bool = True,
    **run_overrides,
) -> Path:
    """A pre-training output directory under `root / name`: records, config.json, curves (no weights)."""
    out = root / name
    run = {  # what differs from PreTrainingRecipe's defaults
        "corpus": list(corpus),
        "document_boundary": "wikitext",
        "vocab_size": 8192,
        "eval_fraction": 0.02,
        "eval_max_examples": 1000,
        "preset": "tiny",
        "global_batch_size": 32,
        "phase2_fraction": 0.1 if phase2 else 0.0,
        "phase2_max_seq_length": 512,
        "phase2_max_predictions_per_seq": 80,
        "dupe_factor": 3,
        **run_overrides,
    }
    record = PreTrainingRecipe.from_dict({}).replace(**run).to_dict()
    write_json(out / "run_config.json", {**record, "training": training_arguments()})
    statistics = {
        "phase1": _stats(600, 85_211, 46_441, 5_674_364, 842_939, max_seq_length=128),
        "held_out": _stats(12, 1_730, 1_000, 119_448, 17_760, is_next=0.4796),
    }
    if phase2:
        statistics["phase2"] = _stats(600, 85_211, 11_024, 5_401_210, 803_770, max_seq_length=512)
    write_json(out / "data_statistics.json", statistics)
    write_json(out / "config.json", bert_config())
    if with_results:
        write_json(
            out / "results.json",
            {
                "train_runtime_s": 730.8,
                "global_step": 1000,
                "train_loss": 7.078088714599609,
                "processes": 1,
                "gradient_accumulation_steps": 1,
                "tokens_per_second": 5350.1,
                "eval_mlm_loss": 6.125084593949045,
                "eval_nsp_loss": 0.7306662166819853,
                "eval_mlm_accuracy": 0.09757961783439491,
                "eval_nsp_accuracy": 0.5113122171945701,
                "eval_loss": 6.85575081063103,
                "eval_runtime": 2.573,
                "epoch": 1.0,
            },
        )
        (out / "training_curves.png").write_bytes(b"\x89PNG\r\n\x1a\n")
        write_json(out / "log_history.json", [{"loss": 9.25, "mlm_loss": 8.56, "nsp_loss": 0.69, "step": 50}])
    return out
