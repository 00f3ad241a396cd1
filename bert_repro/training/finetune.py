"""Fine-tuning on the paper's tasks (section 4): one code path for every task, driven by its description in
`bert_repro.tasks.registry`.

A task's `kind` picks three things, nothing else is per task:
- the head: [CLS] classification or regression (GLUE), start/end vectors S and E (SQuAD), a score per choice
  (SWAG), per-token classification on the first sub-token of each word (CoNLL-2003 NER);
- the input encoding: `[CLS] A [SEP] (B [SEP])`, SQuAD windows (`bert_repro.tasks.squad`), four `[CLS] context [SEP]
  ending [SEP]` inputs, or words split into sub-tokens;
- the evaluation: the task's metrics (`bert_repro.tasks.metrics`) after the paper's post-processing.

The paper's protocol (section 4 and appendix A.3): every parameter is fine-tuned; hyper-parameters from the task's
grid (GLUE: lr in {5e-5, 4e-5, 3e-5, 2e-5}, batch 32, 3 epochs), several seeds ("random restarts"), the best run
on the first evaluation split is kept. Runs that finished are not run again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from transformers import (
    DataCollatorForMultipleChoice,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

from ..tasks import metrics as metric_functions
from ..tasks import squad
from .cli import (
    RUN_CONFIG,
    ConfigurationError,
    SpeedSwitches,
    check_output_dir,
    parse_with_config,
    read_yaml_config,
    take_push_request,
)
from ..model.conversion import load_bert
from ..hub.push import push
from ..model.modeling_bert_repro import (
    BertReproForMultipleChoice,
    BertReproForQuestionAnswering,
    BertReproForSequenceClassification,
    BertReproForTokenClassification,
)
from ..data.task_files import load_task_data
from ..tasks.registry import TASKS, Task, get_task
from ..data.wordpiece import load_tokenizer, save_tokenizer

logger = logging.getLogger(__name__)

HEADS = {
    "classification": BertReproForSequenceClassification,
    "regression": BertReproForSequenceClassification,
    "span": BertReproForQuestionAnswering,
    "multiple_choice": BertReproForMultipleChoice,
    "token_classification": BertReproForTokenClassification,
}

# Settings of the reference run_classifier.py / run_squad.py that the paper does not restate.
FINE_TUNING_DEFAULTS = dict(
    adam_epsilon=1e-6,
    weight_decay=0.01,
    warmup_steps=0.1,  # a float below 1 is a share of the steps (transformers 5.x)
    lr_scheduler_type="linear",
    max_grad_norm=1.0,
    eval_strategy="no",
    save_strategy="no",
    logging_steps=50,
    report_to="none",
    per_device_eval_batch_size=64,
    seed=42,
)
# Keys of a task's `defaults` that belong to TrainingArguments (the rest are ours).
_TRAINING_KEYS = {"learning_rate", "num_train_epochs", "per_device_train_batch_size", "weight_decay"}


@dataclass
class FineTuningArguments(SpeedSwitches):
    task: str = field(default="", metadata={"help": f"One of: {', '.join(TASKS)}."})
    model: str = field(default="", metadata={"help": "A bert_repro or any BERT checkpoint: directory or Hub id."})
    data: list[str] = field(default_factory=list, metadata={
        "help": "The task's data: a directory (original or HF-export layout), a file, or split=path pairs; "
                "else the Hub."})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer; by default the model's."})
    learning_rates: list[float] = field(default_factory=list, metadata={
        "help": "Learning-rate grid; by default the task's (GLUE: 5e-5 4e-5 3e-5 2e-5). One value: no grid."})
    seeds: list[int] = field(default_factory=lambda: [42], metadata={
        "help": "Random restarts: one run per seed and learning rate; the best on dev is kept."})
    max_seq_length: int | None = field(default=None, metadata={"help": "Tokens per input (task default)."})
    doc_stride: int = field(default=128, metadata={"help": "SQuAD: a new window every doc_stride tokens."})
    max_query_length: int = field(default=64, metadata={"help": "SQuAD: question tokens kept."})
    n_best_size: int = field(default=20, metadata={"help": "SQuAD: best starts x best ends considered."})
    max_answer_length: int = field(default=30, metadata={"help": "SQuAD: longest answer in tokens."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only so many training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only so many evaluation rows."})
    num_proc: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})
    attn_implementation: str = field(default="sdpa", metadata={"help": "eager, sdpa or flash_attention_2."})
    predict_test: bool = field(default=True, metadata={
        "help": "Write GLUE test-set prediction files when the data has a test split."})
    keep_all_runs: bool = field(default=False, metadata={"help": "Keep every run's weights, not only the best."})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Allow writing into an output directory that holds another run."})


def _peek_task(argv: list[str]) -> str | None:
    if "--task" in argv:
        return argv[argv.index("--task") + 1]
    if "--config" in argv:
        return read_yaml_config(argv[argv.index("--config") + 1], (FineTuningArguments, TrainingArguments),
                                "recipes/finetune.py").get("task")
    return None


def parse_arguments(argv: list[str] | None = None) -> tuple[FineTuningArguments, TrainingArguments]:
    """Defaults: the reference code's fine-tuning settings < the task's paper hyper-parameters < YAML < command line."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    name = _peek_task(argv)
    if not name and any(arg in ("-h", "--help") for arg in argv):
        name = "mrpc"  # --help alone: any task shows the same options
    if not name:
        raise ConfigurationError(f"Pass --task, one of: {', '.join(TASKS)}.")
    task = get_task(name)
    defaults = {**FINE_TUNING_DEFAULTS, **{k: v for k, v in task.defaults.items() if k in _TRAINING_KEYS}}
    if "warmup_proportion" in task.defaults:
        defaults["warmup_steps"] = task.defaults["warmup_proportion"]
    run, training = parse_with_config((FineTuningArguments, TrainingArguments), defaults, argv, "recipes/finetune.py")
    if not run.model:
        raise ConfigurationError("Pass --model: a bert_repro directory, a BERT checkpoint directory or a Hub id.")
    if run.max_seq_length is None:
        run.max_seq_length = task.defaults.get("max_seq_length", 128)
    if not run.learning_rates:
        run.learning_rates = list(task.grid.get("learning_rate", ())) or [training.learning_rate]
    return run, training


# ---------------------------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------------------------


def _encode_pairs(batch, tokenizer, task: Task, max_len: int):
    texts = [batch[c] for c in task.text_columns]
    encoded = tokenizer(*texts, truncation=True, max_length=max_len)
    encoded["labels"] = batch["label"]
    return encoded


def _encode_choices(batch, tokenizer, task: Task, max_len: int):
    """Each example -> num_choices pairs `[CLS] context [SEP] question + ending [SEP]`, regrouped per example."""
    n = task.num_choices or len(batch["endings"][0])
    firsts = [c for c in batch["context"] for _ in range(n)]
    seconds = [f"{q} {e}".strip() for q, endings in zip(batch["question"], batch["endings"]) for e in endings]
    flat = tokenizer(firsts, seconds, truncation=True, max_length=max_len)
    encoded = {k: [v[i : i + n] for i in range(0, len(v), n)] for k, v in flat.items()}
    encoded["labels"] = batch["label"]
    return encoded


def _encode_words(batch, tokenizer, task: Task, max_len: int):
    """Words -> sub-tokens; the label sits on the first sub-token of each word, -100 elsewhere (paper 5.3)."""
    encoded = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_len)
    labels, first_tokens = [], []
    for i, tags in enumerate(batch["ner_tags"]):
        word_ids = encoded.word_ids(i)
        row, firsts, previous = [], [], None
        for position, word in enumerate(word_ids):
            if word is not None and word != previous:
                row.append(tags[word])
                firsts.append(position)
            else:
                row.append(-100)
            previous = word
        labels.append(row)
        first_tokens.append(firsts)
    encoded["labels"] = labels
    return encoded


def encode(task: Task, split: datasets.Dataset, tokenizer, run: FineTuningArguments, *, train: bool):
    """A raw split -> model inputs (SQuAD evaluation keeps `example_id` and `offset_mapping` for post-processing)."""
    kwargs = dict(batched=True, num_proc=run.num_proc, remove_columns=split.column_names)
    if task.kind == "span":
        prepare = squad.prepare_train_features if train else squad.prepare_eval_features
        return split.map(prepare, fn_kwargs=dict(tokenizer=tokenizer, max_seq_length=run.max_seq_length,
                                                 doc_stride=run.doc_stride, max_query_length=run.max_query_length),
                         desc=f"{task.name} windows", **kwargs)
    function = {"multiple_choice": _encode_choices, "token_classification": _encode_words}.get(
        task.kind, _encode_pairs)
    return split.map(function, fn_kwargs=dict(tokenizer=tokenizer, task=task, max_len=run.max_seq_length),
                     desc=f"{task.name} tokens", **kwargs)


def collator_for(task: Task, tokenizer):
    if task.kind == "multiple_choice":
        return DataCollatorForMultipleChoice(tokenizer)
    if task.kind == "token_classification":
        return DataCollatorForTokenClassification(tokenizer)
    return DataCollatorWithPadding(tokenizer)


# ---------------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------------


def predict(task: Task, trainer: Trainer, raw: datasets.Dataset, encoded: datasets.Dataset, run):
    """Predictions for a raw split, in its own terms: class ids, scores, answer texts or tag sequences."""
    drop = ["example_id", "offset_mapping"] + ([] if _labelled(raw, task) else ["labels"])  # hidden test labels: -1
    model_inputs = encoded.remove_columns([c for c in drop if c in encoded.column_names])
    output = trainer.predict(model_inputs)
    logits = output.predictions
    if task.kind == "span":
        start_logits, end_logits = logits
        # v2.0: the best non-null span of every question (threshold +inf) and its null-score difference, so that
        # the official best-threshold search can run; the default threshold (0) is applied in `score`.
        answers, null_diffs, _ = squad.postprocess_predictions(
            raw, encoded, start_logits, end_logits, n_best_size=run.n_best_size,
            max_answer_length=run.max_answer_length, version_2_with_negative=task.allows_no_answer,
            null_score_diff_threshold=float("inf"))
        return {"answers": answers, "null_diffs": null_diffs}
    if task.kind == "regression":
        return np.asarray(logits).reshape(-1)
    if task.kind == "token_classification":
        ids = np.asarray(logits).argmax(-1)
        tags = []
        for row, labels in zip(ids, encoded["labels"]):
            tags.append([task.label_names[p] for p, gold in zip(row, labels) if gold != -100])
        return tags
    return np.asarray(logits).argmax(-1)


def score(task: Task, raw: datasets.Dataset, predictions) -> dict[str, float]:
    """The task's metrics (named as in `bert_repro.tasks.registry.METRICS`) of `predictions` against the gold labels of `raw`.

    SQuAD scores are in percent, as the official scripts print them; the others are fractions.
    """
    if task.kind == "span":
        references = {i: a["text"] for i, a in zip(raw["id"], raw["answers"])}
        if not task.allows_no_answer:
            v1 = metric_functions.squad_v1(predictions["answers"], references)
            return {"squad_exact_match": v1["exact_match"], "squad_f1": v1["f1"]}
        diffs = predictions["null_diffs"]
        at_zero = {i: "" if diffs[i] > 0 else text for i, text in predictions["answers"].items()}
        plain = metric_functions.squad_v2(at_zero, references)  # null answer when s_null > best span
        best = metric_functions.squad_v2(predictions["answers"], references, na_probs=diffs)
        values = {"squad_exact_match": plain["exact"], "squad_f1": plain["f1"],
                  "squad_best_exact_match": best["best_exact"], "squad_best_f1": best["best_f1"],
                  # the null-score threshold tau chosen on this split (use it when predicting elsewhere)
                  "squad_best_f1_threshold": best["best_f1_thresh"]}
        for theirs, ours in (("HasAns_f1", "squad_has_ans_f1"), ("NoAns_f1", "squad_no_ans_f1")):
            values[ours] = plain.get(theirs, float("nan"))  # absent when the split has no such question
        return {k: float(v) for k, v in values.items()}
    if task.kind == "token_classification":
        gold = [[task.label_names[t] for t in tags] for tags in raw["ner_tags"]]
        # A word cut off by max_seq_length has no prediction: count it as "O", as a pipeline would output nothing.
        padded = [p + ["O"] * (len(g) - len(p)) for p, g in zip(predictions, gold)]
        values = metric_functions.conll_f1(padded, gold)
        return {"entity_f1": values["f1"], "entity_precision": values["precision"],
                "entity_recall": values["recall"], "accuracy": values["accuracy"]}
    return metric_functions.compute(task.metrics, predictions, np.asarray(raw["label"]))


def main_score(task: Task, values: dict[str, float]) -> float:
    """The number runs are ranked by: the task's main metric (SQuAD v2.0: F1 at the best null threshold, which the
    paper tunes on dev)."""
    if task.kind == "span" and task.allows_no_answer and "squad_best_f1" in values:
        return values["squad_best_f1"]
    return values[task.main_metric]


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------


def _rank(result: dict) -> float:
    """A run's score for choosing the best; an undefined score (NaN: e.g. constant predictions) ranks last."""
    value = result["score"]
    return float("-inf") if value != value else value


def data_source(data: list[str]):
    """--data: nothing (the Hub), one directory or file, or `split=path` pairs (`train=a.parquet dev=b.csv`)."""
    if not data:
        return None
    if all("=" in item for item in data):
        return dict(item.split("=", 1) for item in data)
    if len(data) == 1:
        return data[0]
    raise ConfigurationError(f"--data takes one directory or file, or split=path pairs; got {data}.")


def _subset(split: datasets.Dataset, n: int | None) -> datasets.Dataset:
    return split if n is None or len(split) <= n else split.select(range(n))


def _labelled(split: datasets.Dataset, task: Task) -> bool:
    if task.kind in ("span", "token_classification"):
        return True
    return len(split) > 0 and min(split["label"]) >= 0


def encode_splits(task: Task, data, tokenizer, run: FineTuningArguments) -> dict[str, tuple]:
    """{split: (raw rows, model inputs)} for training and every evaluation split, encoded once for the whole grid."""
    raws = {"train": _subset(data["train"], run.max_train_samples)}
    raws.update({name: _subset(data[name], run.max_eval_samples) for name in task.eval_splits})
    return {name: (raw, encode(task, raw, tokenizer, run, train=name == "train")) for name, raw in raws.items()}


def one_run(task, splits: dict[str, tuple], tokenizer, run: FineTuningArguments, training: TrainingArguments,
            lr: float, seed: int, run_dir: Path) -> tuple[dict[str, Any], Trainer]:
    """Fine-tune once (one learning rate, one seed) and evaluate on every evaluation split."""
    set_seed(seed)
    num_labels = 1 if task.kind == "regression" else task.num_labels
    label_kwargs = {"id2label": task.id2label, "label2id": task.label2id} if task.label_names else {}
    model = load_bert(run.model, HEADS[task.kind], num_labels=num_labels,
                      attn_implementation=run.attn_implementation, unpad_inputs=run.unpad_inputs,
                      fast_dropout=run.fast_dropout, last_layer_subset=run.last_layer_subset, **label_kwargs)
    if run.compile_layers:
        model.compile_layers()
    args = TrainingArguments(**{**training.to_dict(), "output_dir": str(run_dir), "learning_rate": lr,
                                "seed": seed, "data_seed": seed})
    trainer = Trainer(model=model, args=args, train_dataset=splits["train"][1],
                      data_collator=collator_for(task, tokenizer),
                      processing_class=tokenizer)
    start = time.time()
    trainer.train()
    result: dict[str, Any] = {"learning_rate": lr, "seed": seed, "train_seconds": round(time.time() - start, 1)}
    for split_name in task.eval_splits:
        raw, encoded = splits[split_name]
        result[split_name] = score(task, raw, predict(task, trainer, raw, encoded, run))
    result["score"] = main_score(task, result[task.eval_splits[0]])
    return result, trainer


def write_test_predictions(task: Task, trainer: Trainer, data, tokenizer, run, output_dir: Path) -> list[Path]:
    """GLUE test-set predictions in the leaderboard's format: `index<TAB>prediction`, one file per test split."""
    written = []
    if not task.glue_submission_names:
        return written
    for split_name in task.test_splits:
        if split_name not in data:
            continue
        raw = data[split_name]
        predictions = predict(task, trainer, raw, encode(task, raw, tokenizer, run, train=False), run)
        path = output_dir / "glue_submission" / task.glue_submission_name(split_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["index\tprediction"] + [f"{i}\t{task.format_submission_value(p)}"
                                         for i, p in zip(raw["idx"], predictions)]
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


def run_finetuning(argv: list[str] | None = None) -> dict[str, Any]:
    """The whole protocol for one task: the grid of learning rates x seeds, the best on dev kept, results written."""
    run, training = parse_arguments(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        datefmt="%H:%M:%S")
    task = get_task(run.task)
    output_dir = Path(training.output_dir)
    record = {"run": asdict(run), "training": {k: v for k, v in training.to_dict().items()
                                               if not k.startswith(("logging", "output_dir", "hub_", "push_"))}}
    record = json.loads(json.dumps(record, default=str))
    for section in record.values():
        for key in ("overwrite_output_dir", "num_proc", "report_to", "disable_tqdm"):
            section.pop(key, None)
    check_output_dir(output_dir, record, resume=True, overwrite=run.overwrite_output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / RUN_CONFIG).write_text(json.dumps(record, indent=2))

    push_to = take_push_request(training)
    data = load_task_data(task, data_source(run.data))
    tokenizer = load_tokenizer(run.tokenizer or run.model)
    runs, best, best_trainer, splits = [], None, None, None
    start = time.time()
    for lr in run.learning_rates:
        for seed in run.seeds:
            run_dir = output_dir / "runs" / f"lr{lr:g}_seed{seed}"
            done = run_dir / "result.json"
            if done.exists():  # finished earlier: not run again
                result, trainer = json.loads(done.read_text()), None
            else:
                splits = splits or encode_splits(task, data, tokenizer, run)  # only when a run is left to do
                result, trainer = one_run(task, splits, tokenizer, run, training, lr, seed, run_dir)
                done.parent.mkdir(parents=True, exist_ok=True)
                done.write_text(json.dumps(result, indent=2))
            runs.append(result)
            logger.info("%s lr=%g seed=%d: %s %.4f", task.name, lr, seed, task.main_metric, result["score"])
            if best is None or _rank(result) > _rank(best):
                best = result
                if trainer is not None:
                    best_trainer = trainer
                    trainer.save_model(str(output_dir / "model"))
                    save_tokenizer(tokenizer, output_dir / "model")  # with vocab.txt
            if trainer is not None and run.keep_all_runs:
                trainer.save_model(str(run_dir / "model"))
    submissions = []
    if best_trainer is not None and run.predict_test:
        submissions = write_test_predictions(task, best_trainer, data, tokenizer, run, output_dir)
    summary = {
        "task": task.name,
        "model": run.model,
        "main_metric": task.main_metric,
        "best": best,
        "runs": runs,
        "hyperparameters": {"learning_rates": run.learning_rates, "seeds": run.seeds,
                            "num_train_epochs": training.num_train_epochs,
                            "per_device_train_batch_size": training.per_device_train_batch_size,
                            "max_seq_length": run.max_seq_length, "warmup": training.warmup_steps,
                            "weight_decay": training.weight_decay},
        "seconds": round(time.time() - start, 1),
        "test_predictions": [str(p) for p in submissions],
    }
    (output_dir / "results.json").write_text(json.dumps(summary, indent=2))
    (output_dir / "results.md").write_text(results_markdown(task, summary))
    logger.info("\n%s", results_markdown(task, summary))
    if push_to is not None:
        summary["pushed"] = push(output_dir, push_to["repo_id"], revision=push_to["revision"],
                                 private=push_to["private"])
    return summary


def _flat_metrics(result: dict, task: Task) -> dict[str, float]:
    out = {}
    for split_name in task.eval_splits:
        for key, value in result.get(split_name, {}).items():
            if isinstance(value, float) and not key.endswith(("_total", "thresh", "_threshold")):
                out[f"{split_name}/{key}" if len(task.eval_splits) > 1 else key] = value
    return out


def results_markdown(task: Task, summary: dict) -> str:
    """The runs of a task as a Markdown table, the best marked."""
    rows = summary["runs"]
    keys = list(_flat_metrics(rows[0], task)) if rows else []
    lines = [f"# {task.name}: fine-tuning {summary['model']}", "",
             f"Main metric: {task.main_metric} on {task.eval_splits[0]}; best run marked with *.", "",
             "| lr | seed | " + " | ".join(keys) + " | train s |",
             "|---|---|" + "---|" * len(keys) + "---|"]
    for r in rows:
        values = _flat_metrics(r, task)
        mark = "*" if r is summary["best"] or r == summary["best"] else ""
        lines.append(f"| {r['learning_rate']:g}{mark} | {r['seed']} | "
                     + " | ".join(f"{values.get(k, float('nan')):.4f}" for k in keys)
                     + f" | {r['train_seconds']} |")
    return "\n".join(lines) + "\n"
