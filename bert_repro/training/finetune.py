"""Fine-tuning on the paper's tasks (section 4): one code path for every task, driven by its description in
`bert_repro.tasks.registry`.

A task's kind (`bert_repro.tasks.kinds`) is all that is per task, and this module asks it for each piece:
- the head: [CLS] classification or regression (GLUE), start/end vectors S and E (SQuAD), a score per choice
  (SWAG), per-token classification on the first sub-token of each word (CoNLL-2003 NER);
- the input encoding and batching: `[CLS] A [SEP] (B [SEP])`, SQuAD windows (`bert_repro.tasks.squad`), four
  `[CLS] context [SEP] ending [SEP]` inputs, or words split into sub-tokens;
- the evaluation: logits decoded in the task's terms (SQuAD's span search, NER's first sub-tokens), then the
  task's metrics (`bert_repro.tasks.metrics`).

The paper's protocol (section 4 and appendix A.3): every parameter is fine-tuned; hyper-parameters from the task's
grid (GLUE: lr in {5e-5, 4e-5, 3e-5, 2e-5}, batch 32, 3 epochs), several seeds ("random restarts"), the best run
on the first evaluation split is kept. Runs that finished are not run again.

The same path runs the paper's other heads (`bert_repro.model.bilstm_heads`): `--head bilstm` puts a randomly
initialised BiLSTM before the output layer (Table 5, "+ BiLSTM"), and `--features SET` is the feature-based approach
(section 5.3, Table 7): the encoder frozen, the feature set's hidden states into that BiLSTM.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import datasets
import numpy as np
import torch
from transformers import Trainer, TrainingArguments, set_seed

from ..atomic import write_json, write_text
from ..data.wordpiece import load_tokenizer, save_tokenizer
from ..hub.push import push
from ..model.bilstm_heads import FEATURE_SET_HELP, FeatureSetError, parse_feature_set
from ..model.configuration_bert_repro import (
    DEFAULT_OBJECTIVE,
    PRETRAINING_OBJECTIVES,
    SPEED_SWITCHES,
    BertReproConfig,
    check_objective_kept,
    check_objective_switches,
)
from ..model.conversion import check_model_dir, load_bert
from ..tasks.columns import TaskDataError
from ..tasks.files import describe_sources, load_task_data
from ..tasks.kinds import HEADS, SpanExtraction
from ..tasks.registry import FEATURE_BASED_GRID, TASKS, Task, get_task
from ..versions import framework_versions
from .checkpoints import checkpoints_newest_first, newest_valid_checkpoint
from .cli import (
    RESULTS,
    ConfigurationError,
    HelpLayout,
    SpeedSwitches,
    check_attention,
    check_output_dir,
    check_trainer_settings,
    closest,
    drop_tensorboard_if_missing,
    parse_with_config,
    pin_memory_only_with_an_accelerator,
    read_yaml_config,
    use_our_names,
    write_run_config,
)
from .cluster import lock_output_dir_once, stop_message
from .distributed import (
    TRAINER_STATE_NAME,
    EngineTrainer,
    check_deepspeed_installed,
    check_engine,
    hardware,
    write_trainer_state,
)
from .publishing import take_push_request

logger = logging.getLogger(__name__)

# Settings of the reference run_classifier.py / run_squad.py that the paper does not restate.
FINE_TUNING_DEFAULTS = dict(
    adam_epsilon=1e-6,
    weight_decay=0.01,
    warmup_steps=0.1,  # a float below 1 is a share of the steps (transformers 5.x)
    lr_scheduler_type="linear",
    max_grad_norm=1.0,
    # A run of the grid is a Trainer run as transformers' example scripts leave it: evaluated each epoch (with the
    # task's own metrics, `TaskTrainer`), a checkpoint each epoch (the newest kept: a preempted run resumes from
    # it), TensorBoard events.
    eval_strategy="epoch",
    save_strategy="epoch",
    save_total_limit=1,
    logging_steps=50,
    report_to="tensorboard",
    per_device_eval_batch_size=64,
    seed=42,
)
# Settings that do not change what a run trains (when it evaluates, saves or logs): a resumed grid may change them.
NOT_IDENTITY = (
    *("overwrite_output_dir", "num_proc", "report_to", "disable_tqdm", "resume_from_checkpoint", "eval_strategy"),
    *("eval_steps", "eval_delay", "eval_on_start", "save_strategy", "save_steps", "save_total_limit"),
)
# Keys of a task's `defaults` that belong to TrainingArguments (the rest are ours).
_TRAINING_KEYS = {"learning_rate", "num_train_epochs", "per_device_train_batch_size", "weight_decay"}


# --head_initializer -> the config's initializer_distribution (it draws only what the checkpoint does not hold)
HEAD_INITIALIZERS = {"reference": "truncated_normal", "transformers": "normal"}


@dataclass
class FineTuningArguments(SpeedSwitches):
    task: str = field(default="", metadata={"help": f"One of: {', '.join(TASKS)}."})
    model: str = field(default="", metadata={"help": "A bert_repro or any BERT checkpoint: directory or Hub id."})
    data: list[str] = field(
        default_factory=list,
        metadata={
            "help": "The task's data: a directory (original or HF-export layout), a file, or split=path pairs; "
            "else the Hub."
        },
    )
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer; by default the model's."})
    learning_rates: list[float] = field(
        default_factory=list,
        metadata={
            "help": "Learning-rate grid; by default the task's (GLUE: 5e-5 4e-5 3e-5 2e-5). One value (or "
            "--learning_rate X): no grid."
        },
    )
    seeds: list[int] = field(
        default_factory=lambda: [42],
        metadata={
            "help": "Random restarts: one run per seed and learning rate; the best on dev is kept. --seed S: the "
            "seeds {S}."
        },
    )
    features: str | None = field(
        default=None,
        metadata={
            "help": "The feature-based approach (paper section 5.3, Table 7) instead of fine-tuning: the "
            f"encoder frozen, these token features into a two-layer BiLSTM: {FEATURE_SET_HELP}. Learning rates: "
            f"{list(FEATURE_BASED_GRID['learning_rate'])} unless --learning_rates."
        },
    )
    head: str | None = field(
        default=None,
        metadata={
            "choices": list(HEADS),
            "help": "; ".join(f"{name}: {what}" for name, what in HEADS.items())
            + ". Default: linear when fine-tuning, bilstm with --features.",
        },
    )
    head_initializer: str = field(
        default="transformers",
        metadata={
            "choices": list(HEAD_INITIALIZERS),
            "help": "How the new head's weights are drawn: transformers (its plain normal(0, 0.02); the default, "
            "measured better on CoNLL-2003 and the same on MRPC and SST-2: benchmarks/RESULTS.md, row 'new heads') or "
            "reference "
            "(Google's code: normal(0, 0.02) cut at 2 standard deviations). The checkpoint's weights are loaded "
            "either way.",
        },
    )
    bilstm_hidden_size: int | None = field(
        default=None,
        metadata={
            "help": "BiLSTM head: units per direction (default: the encoder's hidden size, the paper's 768 for BASE)."
        },
    )
    max_seq_length: int | None = field(default=None, metadata={"help": "Tokens per input (task default)."})
    doc_stride: int = field(default=128, metadata={"help": "SQuAD: a new window every doc_stride tokens."})
    max_query_length: int = field(default=64, metadata={"help": "SQuAD: question tokens kept."})
    n_best_size: int = field(default=20, metadata={"help": "SQuAD: best starts x best ends considered."})
    max_answer_length: int = field(default=30, metadata={"help": "SQuAD: longest answer in tokens."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only so many training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only so many evaluation rows."})
    num_proc: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})
    attn_implementation: str = field(default="sdpa", metadata={"help": "eager, sdpa or flash_attention_2."})
    objective: str | None = field(
        default=None,
        metadata={
            "choices": list(PRETRAINING_OBJECTIVES),
            "help": "The model attends as it was pre-trained (its config's objective, the paper's Table 5; a "
            "left-to-right model stays left-to-right). Naming an objective here only checks that: one with "
            "another attention direction is refused.",
        },
    )
    predict_test: bool = field(
        default=True, metadata={"help": "Write GLUE test-set prediction files when the data has a test split."}
    )
    keep_all_runs: bool = field(
        default=False,
        metadata={"help": "Keep every run's weights (runs/<run>/model) and checkpoints, not only the best model."},
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Allow writing into an output directory that holds another run."}
    )


ARGUMENTS = (FineTuningArguments, TrainingArguments)
RECIPE = "recipes/finetune.py"
# Settings searched as a grid, and the single-value flag that names a grid of one (--learning_rate 2e-5 runs
# the grid {2e-5}; --seed 7 the seeds {7}).
GRIDS = {"learning_rate": "learning_rates", "seed": "seeds"}


# `--help`: the recipe's flags by stage, with the Trainer flags a fine-tuning run sets most, then Trainer's others.
HELP_GROUPS = {
    "data": ("task", "data", "tokenizer", "max_seq_length", "doc_stride", "max_query_length", "num_proc"),
    "model": (
        *("model", "head", "head_initializer", "features", "bilstm_hidden_size", "attn_implementation", "objective"),
        *SPEED_SWITCHES,
        "compile_layers",
    ),
    "training: the grid of learning rates x seeds, the best on dev kept": (
        *("learning_rates", "seeds", "learning_rate", "seed", "num_train_epochs", "max_steps"),
        *("per_device_train_batch_size", "warmup_steps", "weight_decay", "max_train_samples"),
    ),
    "evaluation": (
        *("eval_strategy", "eval_steps", "metric_for_best_model", "load_best_model_at_end"),
        *("max_eval_samples", "n_best_size", "max_answer_length", "predict_test"),
    ),
    "output and Hub": (
        *("output_dir", "resume_from_checkpoint", "overwrite_output_dir", "keep_all_runs", "save_strategy"),
        *("save_steps", "save_total_limit", "report_to", "logging_steps", "push_to_hub", "hub_model_id"),
    ),
}


def help_layout(task: Task) -> HelpLayout:
    grid = " ".join(f"{lr:g}" for lr in task.grid.get("learning_rate", ()))
    return HelpLayout(
        groups=HELP_GROUPS,
        helps={
            "output_dir": "Where the grid's runs (runs/lr<LR>_seed<SEED>/), the best model (model/), results.json "
            "and results.md go.",
            "resume_from_checkpoint": "Not needed: the same command continues an interrupted grid (each run from "
            "its newest checkpoint) and leaves a finished one as it is; true is taken and changes nothing.",
            "learning_rate": "One learning rate: the grid {X} (--learning_rates X).",
            "seed": "One seed: the seeds {S} (--seeds S).",
            "eval_strategy": "When each run of the grid is evaluated on the task's evaluation splits with the task's "
            "own metrics (logged as eval_<metric>: TensorBoard, trainer_state.json): epoch, steps (every --eval_steps) "
            "or no. The runs are ranked by the evaluation after training either way.",
            "metric_for_best_model": "With --load_best_model_at_end or --save_strategy best: one of the task's metrics "
            "(default: the metric the grid ranks by, e.g. accuracy).",
            "save_strategy": "When a run saves a checkpoint (the newest --save_total_limit kept): a preempted run "
            "resumes from it. A finished run's checkpoints are removed unless --keep_all_runs.",
        },
        shown_defaults={
            "learning_rates": f"{task.name}'s grid: {grid}" if grid else "--learning_rate's value",
            "learning_rate": "none: each of --learning_rates",
        },
        metavars={"resume_from_checkpoint": "true|PATH", "optim": "NAME"},
    )


def _peek_task(argv: list[str]) -> str | None:
    argv, _ = use_our_names(argv, {f.name for cls in ARGUMENTS for f in fields(cls)})  # --task_name
    task = next((token.split("=", 1)[1] for token in argv if token.startswith("--task=")), None)
    if task is None and "--task" in argv[:-1]:
        task = argv[argv.index("--task") + 1]
    if task is None and "--config" in argv[:-1]:
        task = read_yaml_config(argv[argv.index("--config") + 1], ARGUMENTS, RECIPE).get("task")
    return task


def find_task(name: str) -> Task:
    """--task by its name or its Hub dataset (--dataset_name rajpurkar/squad); an unknown one with the
    closest."""
    by_dataset = [t.name for t in TASKS.values() if t.hub_id == name]  # GLUE's one id names several tasks
    try:
        return get_task(by_dataset[0] if len(by_dataset) == 1 else name)
    except KeyError:
        close = closest(name.lower(), set(TASKS), prefix="")
        raise ConfigurationError(f"unknown task {name!r}{close}; tasks: {', '.join(TASKS)}.") from None


@dataclass(frozen=True)
class FineTuningRecipe:
    """A fine-tuning run as one typed object: the task, the model, its head and the grid (`finetuning`), and
    transformers' `TrainingArguments` (`training`), as given. Read at the edge (`from_args`, `from_yaml`: the
    reference code's settings < the task's paper hyper-parameters < YAML < command line), changed with `replace`
    under the flags' names; the task's defaults for what was not given (its learning-rate grid, its
    max_seq_length) are filled in by `resolved`, so that `replace(features=...)` also takes the feature-based grid.
    `run_finetuning(recipe)` runs it."""

    finetuning: FineTuningArguments
    training: TrainingArguments

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> FineTuningRecipe:
        argv = list(sys.argv[1:] if argv is None else argv)
        check_deepspeed_installed(argv)  # before TrainingArguments, which fails on it with an unrelated error
        name = _peek_task(argv)
        if not name and any(arg in ("-h", "--help") for arg in argv):
            name = "mrpc"  # --help alone: any task shows the same options
        if not name:  # a wrong flag (--task_nme) is said first
            parse_with_config(ARGUMENTS, FINE_TUNING_DEFAULTS, argv, RECIPE)
            raise ConfigurationError(f"Pass --task, one of: {', '.join(TASKS)}.")
        task = find_task(name)
        defaults = {**FINE_TUNING_DEFAULTS, **{k: v for k, v in task.defaults.items() if k in _TRAINING_KEYS}}
        if "warmup_proportion" in task.defaults:
            defaults["warmup_steps"] = task.defaults["warmup_proportion"]
        layout = help_layout(task)
        run, training = parse_with_config(ARGUMENTS, defaults, argv, RECIPE, grids=GRIDS, help_layout=layout)
        return cls(run, training)

    @classmethod
    def from_yaml(cls, path: str | Path, **changes: Any) -> FineTuningRecipe:
        """A YAML config (as `--config`), with `changes` as `replace` takes them."""
        recipe = cls.from_args(["--config", str(path)])
        return recipe.replace(**changes) if changes else recipe

    def __post_init__(self):
        if not self.finetuning.model:
            raise ConfigurationError("Pass --model: a bert_repro directory, a BERT checkpoint directory or a Hub id.")
        head_settings(find_task(self.finetuning.task), self.finetuning)  # an impossible --head / --features fails

    def replace(self, **changes: Any) -> FineTuningRecipe:
        """A copy with `changes`, each named as its flag (`output_dir="runs/x"`, `seeds=[3]`, `features="..."`).
        The task is chosen at the edge (its defaults are under everything else): another task is another recipe."""
        if "task" in changes and find_task(changes["task"]).name != find_task(self.finetuning.task).name:
            raise ConfigurationError(
                "FineTuningRecipe.replace(task=...): a task's defaults are part of its recipe; build one for it "
                "with FineTuningRecipe.from_args(['--task', ...])."
            )
        ours, theirs = _names(FineTuningArguments), _names(TrainingArguments)
        unknown = [name for name in changes if name not in ours | theirs]
        if unknown:
            raise ConfigurationError(
                f"FineTuningRecipe has no setting {unknown[0]!r}{closest(unknown[0], ours | theirs, '')}."
            )
        try:
            return FineTuningRecipe(
                replace(self.finetuning, **{k: v for k, v in changes.items() if k in ours}),
                replace(self.training, **{k: v for k, v in changes.items() if k in theirs and k not in ours}),
            )
        except ValueError as err:  # TrainingArguments' own checks
            raise ConfigurationError(" ".join(str(err).split())) from None

    def resolved(self) -> tuple[FineTuningArguments, TrainingArguments]:
        """The settings a run uses, copies: the task's max_seq_length and learning-rate grid (the feature-based
        grid with --features) where none was given, and with --save_strategy best the metric the grid ranks by."""
        task, run = find_task(self.finetuning.task), self.finetuning
        changes: dict[str, Any] = {}
        if run.max_seq_length is None:
            changes["max_seq_length"] = task.defaults.get("max_seq_length", 128)
        if not run.learning_rates:
            grid = FEATURE_BASED_GRID if run.features is not None else task.grid
            changes["learning_rates"] = list(grid.get("learning_rate", ())) or [self.training.learning_rate]
        training = replace(self.training)  # the run's own copy: the run takes the Hub token out of it
        if training.save_strategy == "best" and training.metric_for_best_model is None:
            # Trainer would stop with "must be provided"; the metric the grid ranks runs by is the one to keep
            training.metric_for_best_model, training.greater_is_better = task.kind.ranking_metric(task), True
        return replace(run, **changes), training


def _names(cls) -> set[str]:
    return {f.name for f in fields(cls) if f.init}


def parse_arguments(argv: list[str] | None = None) -> tuple[FineTuningArguments, TrainingArguments]:
    """The command line's settings as a run uses them (`FineTuningRecipe.from_args(argv).resolved()`)."""
    return FineTuningRecipe.from_args(argv).resolved()


def check_inputs(run: FineTuningArguments, training: TrainingArguments, *, model_at_hand: bool = True) -> None:
    """The one place where a fine-tuning run's arguments are checked, before any data is read, weights loaded or
    anything written; a new flag gets its check here. The values (`check_values`), the engine, and with the model
    at hand (a study checks its runs before it has pre-trained their model) the tokenizer, the checkpoint's files,
    its positions against --max_seq_length, its depth against --features and its pre-training objective. Next,
    before the model loads: the output directory (`check_output_dir`), the Hub request, and the task's data as it
    is read (`load_task_data`, `splits_at_hand`)."""
    check_values(run, training)
    check_evaluation(find_task(run.task), training)
    check_engine(training)
    check_trainer_settings(training)
    if model_at_hand:
        if run.tokenizer:
            try:
                load_tokenizer(run.tokenizer)
            except (OSError, ValueError) as err:
                raise ConfigurationError(f"--tokenizer {run.tokenizer}: {' '.join(str(err).split())}") from None
        check_model_dir(run.model)  # a pickle, damaged weights or config.json
        check_positions(run)
        check_feature_layers(run)
        check_objective(run)


def check_values(run: FineTuningArguments, training: TrainingArguments) -> None:
    """Values no run can use (part of `check_inputs`)."""
    wrong = [f"--learning_rates {lr:g}" for lr in run.learning_rates if not lr > 0]
    wrong += [f"--seeds {seed}" for seed in run.seeds if not 0 <= seed < 2**32]
    wrong += [
        f"--{name} {value}"
        for name, value, least in (
            ("max_seq_length", run.max_seq_length, 8),  # [CLS] a [SEP] b [SEP] and a few tokens of each
            ("per_device_train_batch_size", training.per_device_train_batch_size, 1),
            ("per_device_eval_batch_size", training.per_device_eval_batch_size, 1),
            ("gradient_accumulation_steps", training.gradient_accumulation_steps, 1),
            ("max_train_samples", run.max_train_samples, 1),
            ("max_eval_samples", run.max_eval_samples, 1),
            ("num_proc", run.num_proc, 1),
            ("doc_stride", run.doc_stride, 1),
            ("max_query_length", run.max_query_length, 1),
            ("n_best_size", run.n_best_size, 1),
            ("max_answer_length", run.max_answer_length, 1),
            ("weight_decay", training.weight_decay, 0),
        )
        if value is not None and value < least
    ]
    if training.max_steps <= 0 and not training.num_train_epochs > 0:
        wrong.append(f"--num_train_epochs {training.num_train_epochs:g}")
    if wrong:
        raise ConfigurationError(
            f"{', '.join(wrong)}: learning rates and epochs must be positive, seeds in [0, 2**32), --max_seq_length "
            "at least 8, the weight decay at least 0, batch sizes, sample counts, processes and the SQuAD settings "
            "at least 1."
        )
    if problem := check_attention(run.attn_implementation):
        raise ConfigurationError(problem)


def check_evaluation(task: Task, training: TrainingArguments) -> None:
    """Trainer's evaluation settings against what the task's evaluation logs (`evaluation_metrics`), before work:
    Trainer itself would find a missing metric at the first evaluation, after an epoch of training."""
    needs = {
        "--load_best_model_at_end true": training.load_best_model_at_end,
        "--save_strategy best": training.save_strategy == "best",
        "--lr_scheduler_type reduce_lr_on_plateau": training.lr_scheduler_type == "reduce_lr_on_plateau",
    }
    needs_one = [flag for flag, given in needs.items() if given]
    if needs_one and training.eval_strategy == "no":
        raise ConfigurationError(f"{needs_one[0]} needs evaluations: pass --eval_strategy epoch (or steps).")
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
    metric = (training.metric_for_best_model or "").removeprefix("eval_")
    if metric and metric not in (known := evaluation_metrics(task)):
        default = " (Trainer's default with --load_best_model_at_end)" if metric == "loss" else ""
        raise ConfigurationError(
            f"--metric_for_best_model {training.metric_for_best_model}{default}: {task.name}'s evaluation logs "
            f"{', '.join(known)}; pass one of them."
        )


def check_positions(run: FineTuningArguments) -> None:
    """--max_seq_length within the positions a local model has (a Hub model's config is read when it loads)."""
    config = Path(run.model) / "config.json"
    if not config.is_file():
        return
    positions = json.loads(config.read_text()).get("max_position_embeddings")
    if isinstance(positions, int) and run.max_seq_length > positions:
        raise ConfigurationError(
            f"--max_seq_length {run.max_seq_length} is longer than {run.model} can read "
            f"(max_position_embeddings {positions}); lower --max_seq_length."
        )


def head_settings(task: Task, run: FineTuningArguments) -> tuple[type, dict[str, Any]]:
    """The model class (the task kind's linear or BiLSTM head, `bert_repro.tasks.kinds.HEADS`) and the config fields
    of the BiLSTM head: with --features, the feature-based approach (frozen encoder, that feature set)."""
    try:
        model_class = task.kind.model_class(run.head, feature_based=run.features is not None)
        fields: dict[str, Any] = {}
        if run.features is not None:
            fields.update(feature_set=parse_feature_set(run.features).name, freeze_encoder=True)
    except ValueError as err:  # FeatureSetError included
        given = " ".join(
            f"--{name} {value}" for name, value in (("head", run.head), ("features", run.features)) if value is not None
        )
        raise ConfigurationError(f"{given}: {err}") from None
    if run.bilstm_hidden_size is not None:
        if model_class is task.kind.head_class:
            raise ConfigurationError("--bilstm_hidden_size is a setting of the BiLSTM head: add --head bilstm.")
        if run.bilstm_hidden_size <= 0:
            raise ConfigurationError(f"--bilstm_hidden_size must be a positive integer, got {run.bilstm_hidden_size}.")
        fields["bilstm_hidden_size"] = run.bilstm_hidden_size
    return model_class, fields


def check_objective(run: FineTuningArguments) -> None:
    """The checkpoint's pre-training objective against --objective and the speed switches, before any data is read:
    a left-to-right checkpoint is never fine-tuned with bidirectional attention (`check_objective_kept`)."""
    try:
        saved = BertReproConfig.get_config_dict(run.model)[0].get("objective", DEFAULT_OBJECTIVE)
    except (OSError, ValueError):
        return  # no config.json to read (e.g. a TensorFlow checkpoint): a BERT, checked when the model is built
    try:
        if run.objective is not None:
            check_objective_kept(saved, run.objective, run.model)
        check_objective_switches(SimpleNamespace(objective=saved, **run.switches()))
    except ValueError as err:  # ObjectiveConflictError, or an objective name this version does not know
        raise ConfigurationError(f"--model {run.model}: {err}") from None


def check_feature_layers(run: FineTuningArguments) -> None:
    """--features against the depth of the model's config, before any data is read or encoded."""
    if run.features is None:
        return
    try:
        layers = BertReproConfig.get_config_dict(run.model)[0]["num_hidden_layers"]
    except (OSError, KeyError, ValueError):
        return  # no config.json to read (e.g. a TensorFlow checkpoint): checked when the model is built
    try:
        parse_feature_set(run.features).indices(layers)
    except FeatureSetError as err:
        raise ConfigurationError(f"--features {run.features} with {run.model}: {err}") from None


# ---------------------------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------------------------


def encode(task: Task, split: datasets.Dataset, tokenizer, run: FineTuningArguments, *, train: bool):
    """A raw split -> model inputs, by the task's kind (evaluation features keep its `decode_columns`)."""
    return task.kind.encode(task, split, tokenizer, run, train=train)


# ---------------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------------


def model_inputs(task: Task, raw: datasets.Dataset, encoded: datasets.Dataset) -> datasets.Dataset:
    """What the model reads of an encoded split: without the columns decoding needs, nor hidden test labels (-1)."""
    drop = list(task.kind.decode_columns) + ([] if task.kind.labelled(task, raw) else ["labels"])
    return encoded.remove_columns([c for c in drop if c in encoded.column_names])


def predict(task: Task, trainer: Trainer, raw: datasets.Dataset, encoded: datasets.Dataset, run) -> tuple[Any, Any]:
    """Predictions for a raw split, in its own terms (class ids, scores, answer texts or tag sequences), and the
    mean loss where the split has labels the model reads (None for SQuAD's evaluation, which has none)."""
    output = trainer.predict(model_inputs(task, raw, encoded))
    return task.kind.decode(task, output.predictions, raw, encoded, run), output.metrics.get("test_loss")


def evaluate_splits(task: Task, trainer: Trainer, splits: dict[str, tuple], run) -> tuple[dict[str, Any], dict]:
    """Every evaluation split scored in the task's terms: ({split: metrics, "one_label": {split: label} where a
    classifier gave every example one label}, {split: mean loss} where there is one)."""
    result: dict[str, Any] = {}
    losses: dict[str, float] = {}
    for split_name in task.eval_splits:
        raw, encoded = splits[split_name]
        predictions, loss = predict(task, trainer, raw, encoded, run)
        result[split_name] = score(task, raw, predictions)
        if loss is not None:
            losses[split_name] = loss
        if (label := one_label(task, predictions)) is not None:
            result.setdefault("one_label", {})[split_name] = label
    return result, losses


def evaluation_metrics(task: Task) -> list[str]:
    """The names `TaskTrainer.evaluate` logs (without Trainer's "eval_"): the first evaluation split's metrics as
    they are, a later split's prefixed with its name (MNLI's "dev_mismatched_accuracy")."""
    names = [*dict.fromkeys([*task.metrics, task.kind.ranking_metric(task)])]
    names += ["loss"] if not isinstance(task.kind, SpanExtraction) else []  # SQuAD's evaluation reads no answers
    return names + [f"{split}_{name}" for split in task.eval_splits[1:] for name in names]


def score(task: Task, raw: datasets.Dataset, predictions) -> dict[str, float]:
    """The task's metrics (named as in `bert_repro.tasks.registry.METRICS`) of `predictions` against the gold
    labels of `raw`. SQuAD scores are in percent, as the official scripts print them; the others are fractions.
    """
    return task.kind.score(task, raw, predictions)


def main_score(task: Task, values: dict[str, float]) -> float:
    """The number runs are ranked by: the task's main metric (SQuAD v2.0: F1 at the best null threshold, which the
    paper tunes on dev)."""
    metric = task.kind.ranking_metric(task)
    return values[metric] if metric in values else values[task.main_metric]


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------


def run_name(lr: float, seed: int) -> str:
    """A run's folder under runs/."""
    return f"lr{lr:g}_seed{seed}"


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


def encode_splits(task: Task, data, tokenizer, run: FineTuningArguments) -> dict[str, tuple]:
    """{split: (raw rows, model inputs)} for training and every evaluation split, encoded once for the whole grid."""
    raws = {"train": _subset(data["train"], run.max_train_samples)}
    raws.update({name: _subset(data[name], run.max_eval_samples) for name in task.eval_splits})
    return {name: (raw, encode(task, raw, tokenizer, run, train=name == "train")) for name, raw in raws.items()}


class TaskTrainer(EngineTrainer):
    """Trainer whose evaluation is the task's own (`evaluate_splits`: SQuAD's span search, NER's first sub-tokens,
    the task's metrics on every evaluation split), so that Trainer's `eval_strategy`, `metric_for_best_model`,
    `load_best_model_at_end` and its logs (TensorBoard, trainer_state.json) carry the task's numbers."""

    def __init__(self, *args, task: Task, splits: dict[str, tuple], settings: FineTuningArguments, **kwargs):
        super().__init__(*args, **kwargs)
        self.task, self.splits, self.settings = task, splits, settings
        self.evaluated: tuple[int, dict, dict] | None = None  # (step, evaluate_splits' result, metrics) of the last

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        # Each DataLoader draws its base seed from torch's generator: evaluating would change the dropout masks of
        # every later step. With the generators restored, a run trains the same whenever it is evaluated.
        devices = [self.args.device] if self.args.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            result, losses = evaluate_splits(self.task, self, self.splits, self.settings)
        metrics = {}
        for i, split_name in enumerate(self.task.eval_splits):
            prefix = metric_key_prefix if i == 0 else f"{metric_key_prefix}_{split_name}"
            values = {"loss": losses[split_name]} if split_name in losses else {}
            values.update({k: v for k, v in result[split_name].items() if isinstance(v, (int, float))})
            metrics.update({f"{prefix}_{name}": value for name, value in values.items()})
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self.evaluated = (self.state.global_step, result, metrics)
        return metrics


def one_run(
    task,
    splits: dict[str, tuple],
    tokenizer,
    run: FineTuningArguments,
    training: TrainingArguments,
    lr: float,
    seed: int,
    run_dir: Path,
) -> tuple[dict[str, Any], Trainer]:
    """Fine-tune once (one learning rate, one seed), evaluate on every evaluation split, and leave in `run_dir`
    what Trainer's example scripts leave (`write_trainer_files`)."""
    set_seed(seed)
    label_kwargs = {"id2label": task.id2label, "label2id": task.label2id} if task.label_names else {}
    model_class, head_fields = head_settings(task, run)
    try:
        model = load_bert(
            run.model,
            model_class,
            num_labels=task.num_labels,
            attn_implementation=run.attn_implementation,
            initializer_distribution=HEAD_INITIALIZERS[run.head_initializer],
            **run.switches(),
            **label_kwargs,
            **head_fields,
        )
    except FeatureSetError as err:
        raise ConfigurationError(f"--features {run.features} with {run.model}: {err}") from None
    if run.compile_layers:
        model.compile_layers()
    data_seed = seed if training.data_seed is None else training.data_seed  # --data_seed: the same order
    args = TrainingArguments(
        **{**training.to_dict(), "output_dir": str(run_dir), "learning_rate": lr, "seed": seed, "data_seed": data_seed}
    )
    # Compiled, a fine-tuning step sees batches of many widths (padded to their longest) and, at an epoch's end,
    # a smaller one: with dynamic shapes from the start that is one graph and no recompilation, where dynamo's
    # default specialises and recompiles twice (tests/test_compile.py). accelerate's own setting, which the
    # Trainer's dynamo plugin reads; a value the user exported wins.
    dynamic = {"ACCELERATE_DYNAMO_USE_DYNAMIC": os.environ.get("ACCELERATE_DYNAMO_USE_DYNAMIC", "true")}
    first = task.eval_splits[0]
    with patch.dict(os.environ, dynamic if training.torch_compile else {}):
        trainer = TaskTrainer(
            model=model,
            args=args,
            train_dataset=splits["train"][1],
            eval_dataset=model_inputs(task, *splits[first]),  # Trainer's check; `evaluate` scores the raw splits
            data_collator=task.kind.collator(tokenizer),
            processing_class=tokenizer,
            task=task,
            splits=splits,
            settings=run,
        )
    start = time.time()
    # A run stopped by a signal left a checkpoint in its folder: it goes on from there.
    checkpoint = newest_valid_checkpoint(run_dir)
    if checkpoint:
        logger.info("%s: resuming from %s", run_dir, checkpoint)
    trained = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if trainer.stop_on_signal.stopped:
        return {"stopped_by": trainer.stop_on_signal.stopped[0]}, trainer
    seconds = round(time.time() - start, 1)
    step = trainer.state.global_step
    if trainer.evaluated is None or trainer.evaluated[0] != step or training.load_best_model_at_end:
        trainer.evaluate()  # the model as it ends (with --load_best_model_at_end, the best checkpoint's)
    _, scores, eval_metrics = trainer.evaluated
    result: dict[str, Any] = {
        "learning_rate": lr,
        "seed": seed,
        "train_seconds": seconds,
        "engine": trainer.engine,
        **scores,
    }
    result["score"] = main_score(task, result[first])
    write_trainer_files(trainer, run_dir, trained.metrics, eval_metrics)
    return result, trainer


def write_trainer_files(trainer: Trainer, run_dir: Path, train_metrics: dict, eval_metrics: dict) -> None:
    """What `Trainer.save_metrics` and `save_state` leave in transformers' example scripts' output directory:
    train_results.json, eval_results.json, all_results.json and trainer_state.json. Written whole
    (`bert_repro.atomic`), as every file of a run: a torn all_results.json would stop `save_metrics`' merge."""
    if not trainer.is_world_process_zero():
        return
    write_json(run_dir / "train_results.json", train_metrics, sort_keys=True)
    write_json(run_dir / "eval_results.json", eval_metrics, sort_keys=True)
    write_json(run_dir / "all_results.json", {**train_metrics, **eval_metrics}, sort_keys=True)
    write_trainer_state(trainer.state, run_dir / TRAINER_STATE_NAME)


def one_label(task: Task, predictions) -> str | None:
    """The label a classifier predicted for every example (a run that learned nothing beyond the majority), or
    None: several labels, or a kind without classes (spans, scores, tags)."""
    if not task.label_names or not isinstance(predictions, np.ndarray) or predictions.ndim != 1:
        return None
    labels = np.unique(predictions)
    return task.label_names[int(labels[0])] if len(labels) == 1 else None


def majority_baseline(task: Task, data) -> dict[str, dict[str, float]]:
    """Each evaluation split's metrics for always predicting the training set's most frequent label, where the
    task's kind has classes: the score a run must beat to have learned anything."""
    out = {}
    for name in task.eval_splits:
        predictions = task.kind.majority_predictions(task, data["train"], data[name])
        if predictions is not None and task.kind.labelled(task, data[name]):
            out[name] = score(task, data[name], predictions)
    return out


def test_prediction_files(task: Task, data, output_dir: Path) -> dict[str, Path]:
    """{test split: the file of its predictions} for a GLUE task whose data has test splits."""
    if not task.glue_submission_names:
        return {}
    folder = output_dir / "glue_submission"
    return {name: folder / task.glue_submission_name(name) for name in task.test_splits if name in data}


def write_test_predictions(task: Task, trainer: Trainer, data, tokenizer, run, output_dir: Path) -> list[Path]:
    """GLUE test-set predictions in the leaderboard's format: `index<TAB>prediction`, one file per test split."""
    written = []
    for split_name, path in test_prediction_files(task, data, output_dir).items():
        raw = data[split_name]
        predictions, _ = predict(task, trainer, raw, encode(task, raw, tokenizer, run, train=False), run)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["index\tprediction"] + [
            f"{i}\t{task.format_submission_value(p)}" for i, p in zip(raw["idx"], predictions)
        ]
        write_text(path, "\n".join(lines) + "\n")
        written.append(path)
    return written


def splits_at_hand(task: Task, data: datasets.DatasetDict, where: list[str]) -> tuple[Task, list[str]]:
    """The task narrowed to the evaluation splits the data has, and those it lacks. Training and the first evaluation
    split (it ranks the runs) are needed; a later one missing (CoNLL-2003's test set) is said once, here."""
    source = " ".join(where) or "the Hub"
    for needed in ("train", task.eval_splits[0]):
        if needed not in data:
            raise TaskDataError(
                f"{source}: no {needed} split of {task.name} (found: {', '.join(data) or 'none'}); expected "
                f"{describe_sources(task)}."
            )
    missing = [name for name in task.eval_splits if name not in data]
    if missing:
        logger.warning(
            "%s: no %s split of %s: evaluating on %s only.",
            source,
            " or ".join(missing),
            task.name,
            ", ".join(n for n in task.eval_splits if n in data),
        )
    return replace(task, eval_splits=tuple(n for n in task.eval_splits if n in data)), missing


def run_finetuning(recipe: FineTuningRecipe) -> dict[str, Any]:
    """The whole protocol for one task: the grid of learning rates x seeds, the best on dev kept, results written."""
    run, training = recipe.resolved()
    check_inputs(run, training)
    pin_memory_only_with_an_accelerator(training)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO, datefmt="%H:%M:%S"
    )
    if warning := run.torch_compile_warning(training.torch_compile):
        logger.warning(warning)
    drop_tensorboard_if_missing(training)
    task = find_task(run.task)
    output_dir = Path(training.output_dir)
    record = {
        "run": asdict(run),
        "training": {
            k: v for k, v in training.to_dict().items() if not k.startswith(("logging", "output_dir", "hub_", "push_"))
        },
    }
    record = run_identity(json.loads(json.dumps(record, default=str)))
    check_output_dir(output_dir, record, resume=True, overwrite=run.overwrite_output_dir, identity=run_identity)
    push_to = take_push_request(training)
    data = load_task_data(task, data_source(run.data))  # bad data fails before the run is recorded
    task, missing_splits = splits_at_hand(task, data, run.data)
    lock_output_dir_once(
        output_dir,
        training,
        lambda: check_output_dir(  # one run per directory from here on
            output_dir, record, resume=True, overwrite=run.overwrite_output_dir, identity=run_identity
        ),
    )
    write_run_config(output_dir, record)
    tokenizer = load_tokenizer(run.tokenizer or run.model)
    runs, best, splits = [], None, None
    start = time.time()
    for lr in run.learning_rates:
        for seed in run.seeds:
            run_dir = output_dir / "runs" / run_name(lr, seed)
            done = run_dir / "result.json"
            if done.exists():  # finished earlier: not run again
                result, trainer = json.loads(done.read_text()), None
            else:
                splits = splits or encode_splits(task, data, tokenizer, run)  # only when a run is left to do
                result, trainer = one_run(task, splits, tokenizer, run, training, lr, seed, run_dir)
                if "stopped_by" in result:  # SIGTERM / SIGUSR1: the same command continues this run
                    if trainer.is_world_process_zero():
                        logger.warning(stop_message(trainer.stop_on_signal, None))
                    return result
            runs.append(result)
            logger.info("%s lr=%g seed=%d: %s %.4f", task.name, lr, seed, task.main_metric, result["score"])
            if best is None or _rank(result) > _rank(best):
                best = result
                if trainer is not None:
                    trainer.save_full_model(str(output_dir / "model"))  # every process: FSDP gathers the shards
                    save_tokenizer(tokenizer, output_dir / "model")  # with vocab.txt
                    if run.predict_test:  # now, with the best model at hand: a rerun may not train it again
                        write_test_predictions(task, trainer, data, tokenizer, run, output_dir)
            if trainer is not None and run.keep_all_runs:
                trainer.save_full_model(str(run_dir / "model"))
            if trainer is not None:
                # Last: a run with result.json is not run again, so its model (when best) must be saved already.
                done.parent.mkdir(parents=True, exist_ok=True)
                write_json(done, result)
                if not run.keep_all_runs and trainer.is_world_process_zero():
                    # A finished run is never resumed: its checkpoints only filled the disk (a grid is many runs).
                    for folder in checkpoints_newest_first(run_dir):
                        shutil.rmtree(folder)
    submissions = [p for p in test_prediction_files(task, data, output_dir).values() if p.exists() and run.predict_test]
    summary = {
        "task": task.name,
        "model": run.model,
        "main_metric": task.main_metric,
        "model_class": head_settings(task, run)[0].__name__,
        "features": run.features,
        "best": best,
        "runs": runs,
        "hyperparameters": {
            "learning_rates": run.learning_rates,
            "seeds": run.seeds,
            "num_train_epochs": training.num_train_epochs,
            "per_device_train_batch_size": training.per_device_train_batch_size,
            "max_seq_length": run.max_seq_length,
            "warmup": training.warmup_steps,
            "weight_decay": training.weight_decay,
            "max_train_samples": run.max_train_samples,
            "max_eval_samples": run.max_eval_samples,
        },
        "seconds": round(time.time() - start, 1),
        "hardware": hardware(training.device),
        "versions": framework_versions(),  # the card lists them as transformers' cards do
        "test_predictions": [str(p) for p in submissions],
        "missing_splits": missing_splits,
        "majority_baseline": majority_baseline(task, data),
    }
    write_text(output_dir / "results.md", results_markdown(task, summary))
    write_json(output_dir / RESULTS, summary)  # last: the runs' summary, once every file it names is there
    logger.info("\n%s", results_markdown(task, summary))
    logger.info("The best run's model (%s): %s", run_name(best["learning_rate"], best["seed"]), output_dir / "model")
    if push_to is not None:
        summary["pushed"] = push_to.push(output_dir, push)
    return summary


def run_identity(record: dict) -> dict:
    """A run's record without the settings a resumed grid may change (`NOT_IDENTITY`; resume_from_checkpoint among
    them: the same command always continues the grid, with the flag or without it)."""
    return {section: {k: v for k, v in values.items() if k not in NOT_IDENTITY} for section, values in record.items()}


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
    approach = f"feature-based ({summary['features']})" if summary.get("features") else "fine-tuning"
    lines = [
        f"# {task.name}: {approach} {summary['model']}",
        "",
        f"Main metric: {task.main_metric} on {task.eval_splits[0]}; best run marked with *.",
        "",
        "| lr | seed | " + " | ".join(keys) + " | train s |",
        "|---|---|" + "---|" * len(keys) + "---|",
    ]
    for r in rows:
        values = _flat_metrics(r, task)
        mark = "*" if r is summary["best"] or r == summary["best"] else ""
        lines.append(
            f"| {r['learning_rate']:g}{mark} | {r['seed']} | "
            + " | ".join(f"{values.get(k, float('nan')):.4f}" for k in keys)
            + f" | {r['train_seconds']} |"
        )
    baseline = summary.get("majority_baseline") or {}  # absent from the results of earlier versions
    if baseline:
        values = _flat_metrics(baseline, task)
        cells = " | ".join(f"{values[k]:.4f}" if k in values else "" for k in keys)
        lines.append(f"| majority class | | {cells} | |")
        lines += ["", "majority class: the training set's most frequent label for every example, the score to beat."]
    degenerate = [
        f"lr {r['learning_rate']:g} seed {r['seed']} predicts {label!r} for every example of {split}"
        for r in rows
        for split, label in (r.get("one_label") or {}).items()
    ]
    if degenerate:
        lines += ["", "**Learned nothing beyond one label:** " + "; ".join(degenerate) + "."]
    return "\n".join(lines) + "\n"
