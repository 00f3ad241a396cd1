"""Every check of a fine-tuning run's settings and model before any data is read (`check_inputs`), then of the data
against the stages asked for (`splits_at_hand`): a wrong value is one line naming its flag, file or split."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from transformers import PretrainedConfig, TrainingArguments

from ...model.bilstm_heads import FeatureSetError, parse_feature_set
from ...model.configuration_bert_repro import DEFAULT_OBJECTIVE, check_objective_kept, check_objective_switches
from ...model.conversion import check_model_dir
from ...tasks.columns import TaskDataError
from ...tasks.files import describe_sources
from ...tasks.kinds import SpanExtraction
from ...tasks.registry import Task
from ..checkpoints import checkpoint_problem
from ..cli import ConfigurationError, check_attention, check_tokenizer, check_trainer_settings
from ..distributed import check_engine
from .recipe import FineTuningArguments, find_task, needs_evaluations, resume_path

logger = logging.getLogger(__name__)

# The least value of each setting a run can use: max_seq_length 8 is [CLS] a [SEP] b [SEP] and a few tokens of each.
AT_LEAST = {"max_seq_length": 8, "weight_decay": 0, **dict.fromkeys(("num_proc", "doc_stride", "n_best_size"), 1)}
AT_LEAST |= dict.fromkeys(
    ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"), 1
)
AT_LEAST |= dict.fromkeys(("max_train_samples", "max_eval_samples", "max_query_length", "max_answer_length"), 1)


def check_inputs(run: FineTuningArguments, training: TrainingArguments, *, model_at_hand: bool = True) -> None:
    """The one place a fine-tuning run's arguments are checked, before any work; `model_at_hand=False` (a study
    before pre-training) leaves out what needs the model's files."""
    check_values(run, training)
    check_stages(run, training)
    check_evaluation(find_task(run.task), training)
    check_engine(training)
    check_trainer_settings(training)
    if model_at_hand:
        if run.tokenizer:
            check_tokenizer(run.tokenizer)
        check_model_dir(run.model)  # a pickle, damaged weights or config.json
        check_model_config(run, trains=training.do_train)


def check_values(run: FineTuningArguments, training: TrainingArguments) -> None:
    wrong = [f"--learning_rates {lr:g}" for lr in run.learning_rates if not lr > 0]
    wrong += [f"--seeds {seed}" for seed in run.seeds if not 0 <= seed < 2**32]
    values = {name: getattr(run if hasattr(run, name) else training, name) for name in AT_LEAST}
    wrong += [f"--{name} {value}" for name, value in values.items() if value is not None and value < AT_LEAST[name]]
    if training.max_steps <= 0 and not training.num_train_epochs > 0:
        wrong.append(f"--num_train_epochs {training.num_train_epochs:g}")
    if wrong:
        raise ConfigurationError(
            f"{', '.join(wrong)}: learning rates and epochs must be positive, seeds in [0, 2**32), --max_seq_length "
            "at least 8, the weight decay at least 0, batch sizes, sample counts, processes and the SQuAD settings "
            "at least 1."
        )
    for name, values in (("learning_rates", run.learning_rates), ("seeds", run.seeds)):
        if twice := sorted({value for value in values if values.count(value) > 1}):
            raise ConfigurationError(
                f"--{name} {' '.join(map(str, values))}: {', '.join(map(str, twice))} given twice; each value is "
                "one run of the grid."
            )
    check_attention(run.attn_implementation)


def check_stages(run: FineTuningArguments, training: TrainingArguments) -> None:
    """What --do_train / --do_eval / --do_predict and --resume_from_checkpoint PATH ask is possible."""
    if training.do_train and not training.do_eval:
        raise ConfigurationError("--do_train without --do_eval: the grid's runs are ranked on dev; add --do_eval.")
    if not (training.do_train or training.do_eval or training.do_predict):
        raise ConfigurationError("Nothing to do: pass --do_train --do_eval, --do_eval or --do_predict.")
    if training.do_predict and not find_task(run.task).glue_submission_names:
        raise ConfigurationError(
            f"--do_predict: test-set predictions are written in the GLUE leaderboard's format; {run.task} has none."
        )
    if not training.do_train and training.push_to_hub:
        raise ConfigurationError("--push_to_hub without --do_train: there is no fine-tuned model to publish.")
    if (path := resume_path(training)) is not None:
        if not training.do_train:
            raise ConfigurationError(f"--resume_from_checkpoint {path} without --do_train: nothing is trained.")
        if problem := checkpoint_problem(path):
            raise ConfigurationError(f"--resume_from_checkpoint {path}: {problem}.")
        if len(run.learning_rates) * len(run.seeds) > 1:
            raise ConfigurationError(
                f"--resume_from_checkpoint {path} resumes one run: pass one --learning_rate and one --seed (true "
                "resumes each run of a grid from its own newest checkpoint)."
            )


def check_evaluation(task: Task, training: TrainingArguments) -> None:
    """Trainer's evaluation settings against the task's metrics, before work, not after an epoch of training."""
    if (needs := needs_evaluations(training)) and training.eval_strategy == "no":
        raise ConfigurationError(f"{needs[0]} needs evaluations: pass --eval_strategy epoch (or steps).")
    wrong = {
        "--prediction_loss_only true": training.prediction_loss_only,
        "--eval_do_concat_batches false": not training.eval_do_concat_batches,
        "--dataloader_drop_last true": training.dataloader_drop_last,  # Trainer drops evaluation rows too
    }
    if given := [flag for flag, on in wrong.items() if on]:
        raise ConfigurationError(
            f"{', '.join(given)}: the task's metrics need every evaluation example's prediction; leave it out."
        )
    unused = {
        "--batch_eval_metrics true": training.batch_eval_metrics,
        "--include_for_metrics": training.include_for_metrics,
    }
    if given := [flag for flag, on in unused.items() if on]:
        raise ConfigurationError(
            f"{', '.join(given)}: a setting of Trainer's compute_metrics, which the recipe does not use (each task's "
            "metrics are computed from all its predictions, bert_repro.tasks.metrics); leave it out."
        )
    # What `TaskTrainer.evaluate` logs, without "eval_" (a later split's prefixed: "dev_mismatched_accuracy").
    known = [*dict.fromkeys([*task.metrics, task.kind.ranking_metric(task)])]
    known += ["loss"] if not isinstance(task.kind, SpanExtraction) else []  # SQuAD's evaluation reads no answers
    known += [f"{split}_{name}" for split in task.eval_splits[1:] for name in known]
    metric = (training.metric_for_best_model or "").removeprefix("eval_")
    if metric and metric not in known:
        default = " (Trainer's default with --load_best_model_at_end)" if metric == "loss" else ""
        raise ConfigurationError(
            f"--metric_for_best_model {training.metric_for_best_model}{default}: {task.name}'s evaluation logs "
            f"{', '.join(known)}; pass one of them."
        )


def check_model_config(run: FineTuningArguments, *, trains: bool = True) -> None:
    """The checkpoint's config against --max_seq_length, --features, --objective and the speed switches (a
    left-to-right checkpoint is never fine-tuned bidirectionally); not trained, against the task's labels."""
    try:
        config = PretrainedConfig.get_config_dict(run.model)[0]
    except (OSError, ValueError):
        return  # no config.json to read (e.g. a TensorFlow checkpoint): a BERT, checked when the model is built
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and run.max_seq_length > positions:
        raise ConfigurationError(
            f"--max_seq_length {run.max_seq_length} is longer than {run.model} can read "
            f"(max_position_embeddings {positions}); lower --max_seq_length."
        )
    if run.features is not None and "num_hidden_layers" in config:
        try:
            parse_feature_set(run.features).indices(config["num_hidden_layers"])
        except FeatureSetError as err:
            raise ConfigurationError(f"--features {run.features} with {run.model}: {err}") from None
    saved = config.get("objective", DEFAULT_OBJECTIVE)
    try:
        if run.objective is not None:
            check_objective_kept(saved, run.objective, run.model)
        check_objective_switches(SimpleNamespace(objective=saved, **run.switches()))
    except ValueError as err:  # ObjectiveConflictError, or an unknown objective
        raise ConfigurationError(f"--model {run.model}: {err}") from None
    # A classifier fine-tuned on another task's labels is not scored as if its labels were this task's.
    task, saved = find_task(run.task), config.get("id2label") or {}
    names = [saved[k] for k in sorted(saved, key=int)]
    if trains or not task.label_names or not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return
    if names != list(task.label_names):
        raise ConfigurationError(
            f"{run.model}/config.json: the model's labels are {names}, {task.name}'s are {list(task.label_names)}: it "
            f"was fine-tuned on another task. Evaluate it on its own task, or fine-tune it on {task.name} (--do_train)."
        )


def splits_at_hand(task: Task, data, run, training) -> tuple[Task, list[str]]:
    """The task narrowed to the evaluation splits the data has, and those it lacks; a split the stages need is
    refused when missing, a later evaluation split (CoNLL-2003's test) only said."""
    source = " ".join(run.data) or "the Hub"
    for name, needed in (("train", training.do_train), (task.eval_splits[0], training.do_eval)):
        if needed and name not in data:
            raise TaskDataError(
                f"{source}: no {name} split of {task.name} (found: {', '.join(data) or 'none'}); expected "
                f"{describe_sources(task)}."
            )
    if training.do_predict and not test_prediction_files(task, data, Path()):
        tests = " or ".join(task.test_splits)
        if not training.do_train and not training.do_eval:
            raise TaskDataError(f"--do_predict: {source} has no {tests} split of {task.name} to predict.")
        logger.warning("%s: no %s split of %s: no test-set predictions.", source, tests, task.name)
    missing = [name for name in task.eval_splits if name not in data]
    kept = tuple(name for name in task.eval_splits if name in data)
    if missing and training.do_eval:
        logger.warning(
            "%s: no %s split of %s: evaluating on %s only.", source, " or ".join(missing), task.name, ", ".join(kept)
        )
    return replace(task, eval_splits=kept), missing


def test_prediction_files(task: Task, data, output_dir: Path) -> dict[str, Path]:
    """{test split: the file of its predictions} for a GLUE task whose data has test splits."""
    folder, names = output_dir / "glue_submission", task.test_splits if task.glue_submission_names else ()
    return {name: folder / task.glue_submission_name(name) for name in names if name in data}
