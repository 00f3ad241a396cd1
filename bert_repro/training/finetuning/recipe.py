"""The fine-tuning recipe: our settings (`FineTuningArguments`) and transformers' `TrainingArguments` over the task's
paper hyper-parameters (`FineTuningRecipe`), read at the edge (`from_args`, `from_yaml`), and its `--help`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import IntervalStrategy, TrainingArguments
from transformers.hf_argparser import string_to_bool

from ...model.bilstm_heads import FEATURE_SET_HELP, parse_feature_set
from ...model.configuration_bert_repro import PRETRAINING_OBJECTIVES
from ...tasks.kinds import HEADS
from ...tasks.registry import FEATURE_BASED_GRID, TASKS, Task, get_task
from .. import cli
from ..cli import SECTIONS, ConfigurationError, HelpLayout, SpeedSwitches, closest, field_names, flag, values_of
from ..distributed import check_deepspeed_installed

# The reference run_classifier.py / run_squad.py's settings that the paper does not restate (a warmup_steps below 1
# is a share of the steps, transformers 5.x); as transformers' example scripts, evaluated and saved each epoch (the
# newest kept, to resume from).
FINE_TUNING_DEFAULTS = dict(adam_epsilon=1e-6, weight_decay=0.01, warmup_steps=0.1, lr_scheduler_type="linear")
FINE_TUNING_DEFAULTS |= dict(max_grad_norm=1.0, eval_strategy="epoch", save_strategy="epoch", save_total_limit=1)
FINE_TUNING_DEFAULTS |= dict(logging_steps=50, report_to="tensorboard", per_device_eval_batch_size=64, seed=42)
_TRAINING_KEYS = {"learning_rate", "num_train_epochs", "per_device_train_batch_size", "weight_decay"}
_TASK_DEFAULTS = ("num_train_epochs", "per_device_train_batch_size", "max_seq_length", "warmup_steps")
# --head_initializer -> the config's initializer_distribution (it draws only what the checkpoint does not hold)
HEAD_INITIALIZERS = {"reference": "truncated_normal", "transformers": "normal"}


@dataclass
class FineTuningArguments(SpeedSwitches):
    help_group = "model"  # the section of --help (`HelpLayout`) for these flags, unless a flag says another
    task: str = flag("", f"One of: {', '.join(TASKS)}.", group="data")
    model: str = flag("", "A bert_repro or any BERT checkpoint: directory or Hub id.")
    data: list[str] = flag(
        factory=list,
        help="The task's data: a directory (original or HF-export layout), a file, or split=path pairs; else the Hub.",
        group="data",
    )
    tokenizer: str | None = flag(None, "Tokenizer; by default the model's.", group="data")
    learning_rates: list[float] = flag(
        factory=list,
        help="Learning-rate grid; by default the task's (GLUE: 5e-5 4e-5 3e-5 2e-5). One value (or "
        "--learning_rate X): no grid.",
        group="training",
    )
    seeds: list[int] = flag(
        factory=lambda: [42],
        help="Random restarts: one run per seed and learning rate; the best on dev is kept. --seed S: the seeds {S}.",
        group="training",
    )
    features: str | None = flag(
        None,
        "The feature-based approach (paper section 5.3, Table 7) instead of fine-tuning: the "
        f"encoder frozen, these token features into a two-layer BiLSTM: {FEATURE_SET_HELP}. Learning rates: "
        f"{list(FEATURE_BASED_GRID['learning_rate'])} unless --learning_rates.",
    )
    head: str | None = flag(
        None,
        "; ".join(f"{name}: {what}" for name, what in HEADS.items())
        + ". Default: linear when fine-tuning, bilstm with --features.",
        choices=list(HEADS),
    )
    # The default is transformers' draw: measured better on CoNLL-2003, the same on MRPC and SST-2 (RESULTS.md).
    head_initializer: str = flag(
        "transformers",
        "How a new head's weights are drawn: transformers (normal(0, 0.02); the default, as good or better: "
        "benchmarks/RESULTS.md, row 'new heads') or reference (Google's: the same, cut at 2 standard deviations).",
        choices=list(HEAD_INITIALIZERS),
    )
    bilstm_hidden_size: int | None = flag(
        None, "BiLSTM head: units per direction (default: the encoder's hidden size, the paper's 768 for BASE)."
    )
    max_seq_length: int | None = flag(None, "Tokens per input (task default).", group="data")
    doc_stride: int = flag(
        128,
        "SQuAD: a new window every doc_stride tokens (Google's run_squad.py: the step between window starts). "
        "transformers' run_qa.py --doc_stride R is the overlap between windows: its windows are ours with "
        "max_seq_length - 3 - (question tokens) - R, for each question (at 384, its 128 is our 253 - question tokens).",
        group="data",
    )
    max_query_length: int = flag(64, "SQuAD: question tokens kept.", group="data")
    n_best_size: int = flag(20, "SQuAD: best starts x best ends considered.", group="evaluation")
    max_answer_length: int = flag(30, "SQuAD: longest answer in tokens.", group="evaluation")
    max_train_samples: int | None = flag(None, "Use only so many training rows.", group="training")
    max_eval_samples: int | None = flag(None, "Use only so many evaluation rows.", group="evaluation")
    num_proc: int | None = flag(None, "Processes for tokenisation.", group="data")
    attn_implementation: str = flag("sdpa", "eager, sdpa, flex_attention or flash_attention_2.")
    objective: str | None = flag(
        None,
        "Only checks the model's pre-training objective (paper Table 5): the model attends as it was pre-trained, "
        "and an objective with another attention direction is refused.",
        choices=list(PRETRAINING_OBJECTIVES),
    )
    predict_test: bool = flag(
        True,
        "Without --do_train/--do_eval/--do_predict: write GLUE test-set prediction files when the data "
        "has a test split (--do_predict says it with those flags).",
        group="evaluation",
    )
    keep_all_runs: bool = flag(False, "Also keep each run's final weights (runs/<run>/model).", group="output")
    overwrite_output_dir: bool = flag(False, "Allow an output directory that holds another run.", group="output")


ARGUMENTS = (FineTuningArguments, TrainingArguments)
RECIPE = "recipes/finetune.py"
# single-value flag -> the grid it names (--learning_rate 2e-5 runs the grid {2e-5})
GRIDS = {"learning_rate": "learning_rates", "seed": "seeds"}
# The task-dependent defaults `--help` shows without --task, where each task has its own.
_GRIDS_BY_KIND = "GLUE: 5e-5 4e-5 3e-5 2e-5; SQuAD, SWAG, CoNLL-2003: 5e-5 3e-5 2e-5"


def help_layout(task: Task | None) -> HelpLayout:
    grid = " ".join(f"{lr:g}" for lr in task.grid.get("learning_rate", ())) if task else _GRIDS_BY_KIND
    of_task = f"{task.name}'s grid: {grid}" if task else f"the task's grid ({grid})"
    return HelpLayout(  # our flags by their `group`, with the Trainer flags a fine-tuning run sets most
        titles=SECTIONS | {"training": "training: the grid of learning rates x seeds, the best on dev kept"},
        groups={
            "training": (
                *("do_train", "do_eval", "do_predict", "learning_rate", "seed", "num_train_epochs", "max_steps"),
                *("per_device_train_batch_size", "warmup_steps", "weight_decay"),
            ),
            "evaluation": ("eval_strategy", "eval_steps", "metric_for_best_model", "load_best_model_at_end"),
            "output": (
                *("output_dir", "resume_from_checkpoint", "save_strategy", "save_steps", "save_total_limit"),
                *("report_to", "logging_steps", "push_to_hub", "hub_model_id"),
            ),
        },
        helps={
            "output_dir": "A Trainer output directory: the best run's model, tokenizer, README.md card, "
            "trainer_state.json and *_results.json at the top, with results.json / results.md (every run); each run "
            "of the grid in runs/lr<LR>_seed<SEED>/ (its last checkpoint, TensorBoard events).",
            "resume_from_checkpoint": "true: each run of the grid from its newest checkpoint (the same command does "
            "that without it), and with a larger --max_steps or --num_train_epochs a finished grid trained further; "
            "PATH: the grid's one run (one learning rate, one seed) from that checkpoint.",
            "do_train": "Fine-tune the grid (with --do_eval, which ranks its runs). Without any of --do_train, "
            "--do_eval, --do_predict: all three (predictions where --predict_test).",
            "do_eval": "Alone: evaluate --model (a fine-tuned folder) on the task's evaluation splits, training "
            "nothing: eval_results.json.",
            "do_predict": "Write the GLUE test-set predictions (glue_submission/); alone: of --model as it is.",
            "learning_rate": "One learning rate: the grid {X} (--learning_rates X).",
            "seed": "One seed: the seeds {S} (--seeds S).",
            "eval_strategy": "When each run of the grid is evaluated with the task's own metrics (logged as "
            "eval_<metric>): epoch, steps (every --eval_steps) or no. Runs are ranked after training either way.",
            "metric_for_best_model": "With --load_best_model_at_end or --save_strategy best: one of the task's metrics "
            "(default: the metric the grid ranks by, e.g. accuracy).",
            "save_strategy": "When a run saves a checkpoint (the newest --save_total_limit kept), from which a "
            "preempted run resumes and a finished one is trained further.",
        },
        shown_defaults={
            "output_dir": "trainer_output (Trainer's)",
            **dict.fromkeys(STAGES, "true when none of the three is given"),
            "learning_rates": of_task if grid else "--learning_rate's value",
            "learning_rate": "none: each of --learning_rates",
            **({} if task else dict.fromkeys(_TASK_DEFAULTS, "the task's; --task T --help shows them")),
        },
        metavars={"resume_from_checkpoint": "true|PATH", "optim": "NAME"},
    )


def find_task(name: str) -> Task:
    """--task by its name or its Hub dataset (--dataset_name rajpurkar/squad)."""
    by_dataset = [t.name for t in TASKS.values() if t.hub_id == name]  # GLUE's one id names several tasks
    try:
        return get_task(by_dataset[0] if len(by_dataset) == 1 else name)
    except KeyError:
        close = closest(name.lower(), set(TASKS), prefix="")
        raise ConfigurationError(f"unknown task {name!r}{close}; tasks: {', '.join(TASKS)}.") from None


def data_source(data: list[str]):
    """--data: nothing (the Hub), one directory or file, or `split=path` pairs (`train=a.parquet dev=b.csv`)."""
    if not data:
        return None
    if all("=" in item for item in data):
        return dict(item.split("=", 1) for item in data)
    if len(data) == 1:
        return data[0]
    raise ConfigurationError(f"--data takes one directory or file, or split=path pairs; got {data}.")


@dataclass(frozen=True)
class FineTuningRecipe:
    """A fine-tuning run as given. Precedence: the reference code's settings < the task's paper hyper-parameters <
    YAML < command line; defaults that depend on other settings (the grid) are filled in by `resolved`."""

    finetuning: FineTuningArguments
    training: TrainingArguments

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> FineTuningRecipe:
        argv = list(sys.argv[1:] if argv is None else argv)
        check_deepspeed_installed(argv)  # before TrainingArguments, which fails on it with an unrelated error
        ours, given = cli.use_our_names(argv, field_names(*ARGUMENTS))  # --task_name: --task
        at = ours.index("--config") + 1 if "--config" in ours[:-1] else None
        config = cli.read_yaml_config(ours[at], ARGUMENTS, RECIPE) if at else {}
        name = (values_of(ours, "task") or [config.get("task")])[-1]  # the last, as argparse takes it
        if not name:  # --help shows no task's defaults as everyone's; a wrong flag (--task_nme) is said first
            cli.parse_with_config(ARGUMENTS, FINE_TUNING_DEFAULTS, argv, RECIPE, help_layout=help_layout(None))
            raise ConfigurationError(f"Pass --task, one of: {', '.join(TASKS)}.")
        task = find_task(name)
        defaults = {**FINE_TUNING_DEFAULTS, **{k: v for k, v in task.defaults.items() if k in _TRAINING_KEYS}}
        if "warmup_proportion" in task.defaults:
            defaults["warmup_steps"] = task.defaults["warmup_proportion"]
        defaults["max_seq_length"] = task.defaults.get("max_seq_length", 128)  # what the run uses, as --help shows
        layout = help_layout(task)
        run, training = cli.parse_with_config(ARGUMENTS, defaults, argv, RECIPE, grids=GRIDS, help_layout=layout)
        choose_stages(run, training, ours, config, given | set(config))
        return cls(run, training)

    @classmethod
    def from_yaml(cls, path: str | Path, **changes: Any) -> FineTuningRecipe:
        recipe = cls.from_args(["--config", str(path)])
        return recipe.replace(**changes) if changes else recipe

    def __post_init__(self):
        if not self.finetuning.model:
            raise ConfigurationError("Pass --model: a bert_repro directory, a BERT checkpoint directory or a Hub id.")
        head_settings(find_task(self.finetuning.task), self.finetuning)  # an impossible --head / --features fails

    def replace(self, **changes: Any) -> FineTuningRecipe:
        """A copy with `changes`, each named as its flag (`seeds=[3]`); another task is another recipe."""
        if "task" in changes and find_task(changes["task"]).name != find_task(self.finetuning.task).name:
            raise ConfigurationError(
                "FineTuningRecipe.replace(task=...): a task's defaults are part of its recipe; build one for it "
                "with FineTuningRecipe.from_args(['--task', ...])."
            )
        ours, theirs = field_names(FineTuningArguments), field_names(TrainingArguments)
        if unknown := [name for name in changes if name not in ours | theirs]:
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
        """Copies of the settings a run uses, with the task's max_seq_length and grid where none was given."""
        task, run = find_task(self.finetuning.task), self.finetuning
        changes = {"max_seq_length": task.defaults.get("max_seq_length", 128)} if run.max_seq_length is None else {}
        if not run.learning_rates:
            grid = FEATURE_BASED_GRID if run.features is not None else task.grid
            changes["learning_rates"] = list(grid.get("learning_rate", ())) or [self.training.learning_rate]
        training = replace(self.training)  # the run's own copy: the run takes the Hub token out of it
        training.do_eval = self.training.do_eval  # TrainingArguments turns it on for any eval_strategy but "no"
        if training.save_strategy == "best" and training.metric_for_best_model is None:
            # else Trainer stops with "must be provided"
            training.metric_for_best_model, training.greater_is_better = task.kind.ranking_metric(task), True
        return replace(run, **changes), training


STAGES = ("do_train", "do_eval", "do_predict")


def choose_stages(run, training: TrainingArguments, argv: list[str], config: dict, given: set[str]) -> None:
    """--do_train / --do_eval / --do_predict as run_glue reads them; none given, the whole protocol. Read from `argv`
    and `config` because TrainingArguments turns do_eval on whenever eval_strategy is not "no"."""
    asked = {name: bool(config[name]) for name in STAGES if name in config}
    asked.update({name: string_to_bool(said[-1]) for name in STAGES if (said := values_of(argv, name))})
    if not asked:
        training.do_train = training.do_eval = True
        training.do_predict = run.predict_test and bool(find_task(run.task).glue_submission_names)
        return
    if "predict_test" in given:
        raise ConfigurationError("--predict_test with --do_train/--do_eval/--do_predict: --do_predict says it.")
    training.do_train, training.do_eval, training.do_predict = (asked.get(name, False) for name in STAGES)
    if not training.do_train:  # no training, so no evaluation during it (and do_eval stays as asked on `replace`)
        if needs := needs_evaluations(training):
            raise ConfigurationError(
                f"{needs[0]} without --do_train: a setting of training, and this run trains nothing."
            )
        training.eval_strategy = IntervalStrategy.NO


def needs_evaluations(training: TrainingArguments) -> list[str]:
    needs = {
        "--load_best_model_at_end true": training.load_best_model_at_end,
        "--save_strategy best": training.save_strategy == "best",
        "--lr_scheduler_type reduce_lr_on_plateau": training.lr_scheduler_type == "reduce_lr_on_plateau",
    }
    return [flag for flag, given in needs.items() if given]


def resume_path(training: TrainingArguments) -> str | None:
    """--resume_from_checkpoint PATH, or None (not given, true or false)."""
    given = training.resume_from_checkpoint
    return None if given in (None, "", "true", "True", "false", "False") else given


def head_settings(task: Task, run: FineTuningArguments) -> tuple[type, dict[str, Any]]:
    """The model class (`bert_repro.tasks.kinds.HEADS`) and the BiLSTM head's config fields (--features: frozen)."""
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
