"""Pre-training BERT with Trainer: the paper's procedure (section 3.1, appendix A.2) as library code.

`recipes/pretrain.py` is a thin command line over `run_pretraining`, the whole job. What lives here:

- `PreTrainingArguments`: everything a run needs beyond transformers' `TrainingArguments` (corpus, tokenizer,
  preset, the two phases, optimizer), and `parse_arguments` which reads a YAML config with any field
  overridable on the command line. Paper defaults (SPEC section 3) sit under both.
- The objective (`--objective`, the paper's Table 5: `mlm_nsp` BERT, `mlm` No NSP, `ltr` left-to-right): one name
  in `PreTrainingDataConfig` (how examples are built) and in the model config (how it attends), both reading
  `PRETRAINING_OBJECTIVES`. Without NSP the loss has no NSP term, NSP metrics are not logged and the model's
  pooler and NSP head take no part in training (frozen: no gradient, no weight decay, not reported as unused to
  DDP); "ltr" logs `lm_loss` / `lm_accuracy` (next token) instead of `mlm_*`.
- Output-directory checks: a directory holding a different run is never overwritten (`run_record`).

The job's parts, one module each: `pretrain_data` (corpus, tokenizer, examples), `pretrain_phases` (the two
phases in one run: data configs, steps, sampler, collator), `pretrain_model` (the model and its config),
`pretrain_trainer` (`PreTrainingTrainer`: the losses over the global batch, the four metrics), `pretrain_resume`
(stopping, resuming, the run's clock) and `pretrain_records` (the log's tables, warnings, curves).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import IntervalStrategy, TrainingArguments, set_seed

from ..atomic import write_json
from ..data.pretraining_examples import PreTrainingDataConfig
from ..data.streaming import DataStateCallback, load_data_state
from ..data.wordpiece import BERT_SPECIAL_TOKENS, load_tokenizer, save_tokenizer
from ..hub.push import push_checkpoints
from ..model.configuration_bert_repro import SPEED_SWITCHES
from ..versions import framework_versions
from .checkpoints import checkpoint_step
from .cli import (
    RESULTS,
    RUN_CONFIG,
    ConfigurationError,
    HelpLayout,
    check_output_dir,
    check_trainer_settings,
    drop_tensorboard_if_missing,
    holds_nothing,
    importable,
    parse_with_config,
    pin_memory_only_with_an_accelerator,
    take_push_request,
)
from .cluster import lock_output_dir_once, stop_message
from .distributed import check_deepspeed_installed, check_engine, hardware
from .optim import optimizer_cls_and_kwargs
from .pretrain_arguments import PAPER_TRAINING_DEFAULTS, PreTrainingArguments, check_values
from .pretrain_data import STREAM_STOP_EVERY, build_datasets, build_streaming_datasets
from .pretrain_model import allow_data_dependent_shapes, build_model, check_lengths, model_config
from .pretrain_phases import PhaseCollator, PhasedSampler, packed_rows, phase_configs, phase_steps  # noqa: F401
from .pretrain_records import log_statistics, log_table, plot_curves, repetition_warnings
from .pretrain_resume import (
    LongerSchedule,
    StopAfterSteps,
    TrainingClock,
    checkpoint_to_resume,
    forget_unstarted_run,
    tokens_trained,
    whole_run_loss,
)
from .pretrain_trainer import PreTrainingTrainer, metrics_from_sums, pretraining_sums  # noqa: F401

logger = logging.getLogger(__name__)


# Fields that may change between an interrupted run and its resumption.
RUN_CONTROL_FIELDS = {
    "overwrite_output_dir",
    "stop_after_steps",
    "resume_from_checkpoint",
    "num_proc",
    "plot",
    *SPEED_SWITCHES,
    "compile_layers",  # speed switches: the same training either way
    "packing",  # the same examples per step and the same losses, packed or not
    "fp8",  # opt-in precision of the blocks' products (runs recorded before it existed have no such field)
    "logging_steps",
    "report_to",
    "disable_tqdm",
    "log_level",
    "log_level_replica",
    "dataloader_num_workers",
    "gradient_accumulation_steps",
}  # derived from global_batch_size and the processes
# What a resumption may raise, extending the run (a finished one too): Trainer continues from the checkpoint with
# the schedule stretched to the new end. Nothing else about the steps already taken changes (`check_extension`).
MAY_GROW = ("training.max_steps",)
# Where a run lives is not what it trains: a run folder moved or copied (scratch -> project space) resumes.
LOCATION_FIELDS = {"output_dir"}


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


SPEED_FIELDS = (*SPEED_SWITCHES, "compile_layers")
# `--help`: the recipe's flags by stage, with the Trainer flags a pre-training run sets most, then Trainer's others.
HELP = HelpLayout(
    groups={
        "data: corpus, vocabulary, pre-training examples": (
            *("corpus", "hub_config", "split", "text_column", "document_boundary", "split_lines", "max_documents"),
            *("streaming", "stream_document_buffer", "stream_shuffle_buffer", "stream_held_out_documents"),
            *("tokenizer", "vocab_size", "lowercase", "num_proc", "objective", "max_seq_length"),
            *("max_predictions_per_seq", "masked_lm_prob", "mask_replace_prob", "random_replace_prob"),
            *("short_seq_prob", "dupe_factor", "random_seed", "do_whole_word_mask", "static_masking"),
            *("phase2_max_seq_length", "phase2_max_predictions_per_seq", "packing"),
        ),
        "model": ("preset", "model_overrides", "init_from", "attn_implementation", "sparse_prediction", "fp8"),
        "model speed switches (the same training, faster)": SPEED_FIELDS,
        "training": (
            *("max_steps", "global_batch_size", "per_device_train_batch_size", "phase2_fraction", "optimizer"),
            *("learning_rate", "warmup_steps", "lr_scheduler_type", "weight_decay", "seed", "stop_after_steps"),
        ),
        "evaluation": ("eval_fraction", "eval_max_examples", "eval_steps"),
        "output and Hub": (
            *("output_dir", "resume_from_checkpoint", "overwrite_output_dir", "save_steps", "logging_steps"),
            *("plot", "push_to_hub", "hub_model_id"),
        ),
    },
    set_by_recipe={
        "optim": "--optimizer chooses the optimizer, --learning_rate, --adam_* and --weight_decay its settings",
        "gradient_accumulation_steps": "--global_batch_size / (--per_device_train_batch_size x processes)",
        "ignore_data_skip": "true with --streaming, which restores the stream's own position",
    },
    helps={
        "resume_from_checkpoint": "true: continue from the newest complete checkpoint in --output_dir (a finished "
        "run is left as it is, so a requeued job can always pass it); or the path of a checkpoint folder. With a "
        "larger --max_steps it extends the run.",
    },
    metavars={"resume_from_checkpoint": "true|PATH", "optim": "NAME", "corpus": "PATH|HUB_ID"},
)


def parse_arguments(argv: list[str] | None = None):
    """(PreTrainingArguments, PreTrainingDataConfig, TrainingArguments) from `--config x.yaml` and the command line.

    Precedence: the paper's defaults < the YAML file < the command line. Unknown YAML keys are an error that names
    the file and the key.
    """
    return parse_with_config(
        (PreTrainingArguments, PreTrainingDataConfig, TrainingArguments),
        PAPER_TRAINING_DEFAULTS,
        argv,
        "recipes/pretrain.py",
        help_layout=HELP,
    )


# ---------------------------------------------------------------------------------------------------------------
# The output directory: never overwrite another run
# ---------------------------------------------------------------------------------------------------------------


def run_record(run: PreTrainingArguments, data: PreTrainingDataConfig, training: TrainingArguments) -> dict:
    """What identifies a run: every setting except the ones that may change on resumption and where it lives."""
    return run_identity({"run": asdict(run), "data": asdict(data), "training": training.to_dict()})


def run_identity(record: dict) -> dict:
    """`record` without the fields that may change on resumption (also applied to a saved record, which an
    earlier version may have written with more fields)."""
    record = {name: dict(section) for name, section in record.items()}
    for name, section in record.items():
        for key in list(section):
            if (
                key in RUN_CONTROL_FIELDS
                or key in LOCATION_FIELDS
                or key.startswith(("logging_", "push_to_hub"))
                or (key.startswith("hub_") and name == "training")
            ):
                section.pop(key)
    return json.loads(json.dumps(record, default=str))


def check_extension(grown: dict, run: PreTrainingArguments, phases: int) -> None:
    """A run extended to more steps trains the steps it has taken on the same examples: true of one phase read from
    an index, whose sampler's order for more steps begins with its order for fewer (`PhasedSampler`). Two phases
    split max_steps between them (`--phase2_fraction`), so more steps move the boundary; a stream plans its
    checkpoints' positions for max_steps."""
    old, new = grown["training.max_steps"]
    why = "its two phases split --max_steps (--phase2_fraction)" if phases > 1 else ""
    why = why or ("it reads its corpus as a stream (--streaming)" if run.streaming else "")
    if why:
        raise ConfigurationError(
            f"--max_steps {new}: a run of {old} steps can be extended only when its steps keep their examples, and "
            f"{why}. Keep --max_steps {old}, or train the longer run in another --output_dir."
        )


def gradient_accumulation(global_batch_size: int, per_device: int, world_size: int) -> int:
    per_step = per_device * world_size
    if global_batch_size % per_step:
        raise ConfigurationError(
            f"global_batch_size {global_batch_size} is not a multiple of per_device_train_batch_size {per_device} "
            f"x {world_size} processes."
        )
    return global_batch_size // per_step


def check_vocabulary(run: PreTrainingArguments) -> None:
    """The tokenizer given is readable, or the vocabulary to train has room beyond the special tokens: said now,
    not after the corpus is read."""
    if run.tokenizer:
        try:
            load_tokenizer(run.tokenizer)
        except ValueError as err:
            raise ConfigurationError(f"--tokenizer {run.tokenizer}: {err}") from None
    elif run.vocab_size <= len(BERT_SPECIAL_TOKENS):
        raise ConfigurationError(
            f"--vocab_size {run.vocab_size}: a WordPiece vocabulary needs more than its {len(BERT_SPECIAL_TOKENS)} "
            "special tokens (BERT's: 30522)."
        )


def check_inputs(run: PreTrainingArguments, data: PreTrainingDataConfig, training: TrainingArguments) -> None:
    """The one place where a pre-training run's arguments are checked, before the corpus is read or anything
    written; a new flag gets its check here. The values (`check_values`), the engine and optimizer, every phase's
    lengths against the model's positions, the tokenizer file or vocabulary size, and the combinations no run can
    use. Next, still before any data work: the output directory (`check_output_dir`) and the Hub request; the
    corpus files are checked as they are read."""
    check_values(run, training)
    check_engine(training, optimizer=run.optimizer)
    check_trainer_settings(training)
    derived = gradient_accumulation(run.global_batch_size, training.per_device_train_batch_size, training.world_size)
    if training.gradient_accumulation_steps not in (1, derived):  # given, and not what the batch sizes make
        steps = training.gradient_accumulation_steps
        raise ConfigurationError(
            f"--gradient_accumulation_steps {steps}: pre-training derives it from --global_batch_size "
            f"{run.global_batch_size} / (--per_device_train_batch_size {training.per_device_train_batch_size} x "
            f"{training.world_size} processes) = {derived}. For {steps} steps, pass --global_batch_size "
            f"{steps * training.per_device_train_batch_size * training.world_size}."
        )
    check_lengths(model_config(run, data.objective, **run.switches()), phase_configs(data, run))
    check_vocabulary(run)
    if run.packing and data.pretraining_objective.causal:
        raise ConfigurationError(
            f"--packing true cannot be used with --objective {data.objective}: packed rows keep "
            "each example to itself in both directions, not left-to-right. Turn packing off."
        )
    if run.streaming and training.dataloader_num_workers and training.save_strategy not in ("steps", "no"):
        raise ConfigurationError(
            "--streaming true with --dataloader_num_workers keeps the stream's position at planned steps: use "
            f"--save_strategy steps (not {training.save_strategy.value}), or no workers."
        )


def run_pretraining(argv: list[str] | None = None) -> dict[str, Any]:
    """The whole job: arguments -> data -> model -> Trainer -> saved checkpoint, statistics, curves."""
    check_deepspeed_installed(sys.argv[1:] if argv is None else argv)
    run, data, training = parse_arguments(argv)
    check_inputs(run, data, training)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO, datefmt="%H:%M:%S"
    )
    output_dir = Path(training.output_dir)
    resume_arg = training.resume_from_checkpoint
    resume = resume_arg not in (None, "", "false", "False")
    resume_from = (True if resume_arg in ("true", "True") else resume_arg) if resume else None
    training.gradient_accumulation_steps = gradient_accumulation(
        run.global_batch_size, training.per_device_train_batch_size, training.world_size
    )
    record = run_record(run, data, training)
    grown = check_output_dir(
        output_dir, record, resume=resume, overwrite=run.overwrite_output_dir, identity=run_identity, may_grow=MAY_GROW
    )
    phase_cfgs = phase_configs(data, run)
    if grown:
        check_extension(grown, run, len(phase_cfgs))
    resume_from = checkpoint_to_resume(output_dir, resume_from, streamed=run.streaming)
    pin_memory_only_with_an_accelerator(training)
    if warning := run.torch_compile_warning(training.torch_compile):
        logger.warning(warning)
    if training.torch_compile and run.packing:
        allow_data_dependent_shapes()
    if run.streaming:
        training.ignore_data_skip = True  # resuming restores the stream's own position instead of re-reading it
    push_to = take_push_request(training)  # the Hub reachable and the token accepted, before any data work too
    if run.plot and not importable("matplotlib"):
        logger.warning("matplotlib is not installed (pip install 'bert-repro[train]'): not writing training_curves.png")
        run.plot = False
    drop_tensorboard_if_missing(training)

    lock_output_dir_once(
        output_dir,
        training,
        lambda: check_output_dir(  # one run per directory from here on
            output_dir,
            record,
            resume=resume,
            overwrite=run.overwrite_output_dir,
            identity=run_identity,
            may_grow=MAY_GROW,
        ),
    )
    if grown and training.process_index == 0:
        # Before the record changes: a directory with results.json is finished, and the longer run is not yet.
        (output_dir / RESULTS).unlink(missing_ok=True)
        (old_steps, new_steps) = grown["training.max_steps"]
        logger.info(
            "extending the run from max_steps %d to %d: the learning-rate schedule (%s, %s warm-up steps) now ends "
            "at step %d, so the rate after the checkpoint is that of a %d-step schedule",
            old_steps,
            new_steps,
            str(getattr(training.lr_scheduler_type, "value", training.lr_scheduler_type)),
            training.warmup_steps,
            new_steps,
            new_steps,
        )
    fresh = holds_nothing(output_dir)
    with training.main_process_first(desc="preparing pre-training data"):
        if training.process_index == 0:
            output_dir.mkdir(parents=True, exist_ok=True)
            write_json(output_dir / RUN_CONFIG, record)
        try:
            if run.streaming:
                tokenizer, phases, eval_dataset, statistics = build_streaming_datasets(
                    run,
                    data,
                    training,
                    output_dir,
                    phase_steps(training.max_steps, run.phase2_fraction, len(phase_cfgs)),
                )
            else:
                tokenizer, phases, eval_dataset, statistics = build_datasets(run, data, training, output_dir)
        except BaseException:
            if fresh and training.process_index == 0:
                forget_unstarted_run(output_dir)  # so that a retry with other data is not "a different run"
            raise
    if training.process_index == 0:
        write_json(output_dir / "data_statistics.json", statistics)
        log_statistics(statistics)

    set_seed(training.seed)  # the initial weights must not depend on what data preparation drew before
    model = build_model(run, tokenizer, phase_cfgs)
    steps = phase_steps(training.max_steps, run.phase2_fraction, len(phase_cfgs))
    if training.process_index == 0 and not run.streaming:
        for warning in repetition_warnings(statistics, steps, run.global_batch_size, phase_cfgs):
            logger.warning(warning)
    clock = TrainingClock(resume_from)
    callbacks = [clock] + ([StopAfterSteps(run.stop_after_steps)] if run.stop_after_steps else [])
    if grown and resume_from:
        callbacks.append(LongerSchedule())
    if run.streaming:  # `phases` is this process's stream of examples, all phases in one
        per_step = training.gradient_accumulation_steps  # batches
        callbacks.append(DataStateCallback(phases, per_step))
        if resume_from:
            try:
                load_data_state(phases, resume_from)
            except ValueError as err:
                raise ConfigurationError(f"Cannot resume the stream: {err}.") from None
        # Where Trainer will save (its own rule, DefaultFlowCallback): the workers keep their positions there.
        every = training.save_steps
        every = int(every) if every >= 1 else math.ceil(training.max_steps * every)
        start = checkpoint_step(resume_from) if resume_from else 0
        stop = start + run.stop_after_steps if run.stop_after_steps else training.max_steps
        # A stop on a signal saves too: with workers, at the next multiple of STREAM_STOP_EVERY steps.
        stop_every = STREAM_STOP_EVERY if training.dataloader_num_workers else 0
        periodic = every if training.save_strategy == "steps" else 0
        phases.plan_saves(
            every=[periodic * per_step, stop_every * per_step], at=[stop * per_step, training.max_steps * per_step]
        )
    if eval_dataset is None:
        training.eval_strategy = IntervalStrategy.NO
    trainer = PreTrainingTrainer(
        model=model,
        args=training,
        train_dataset=phases
        if run.streaming
        else phases[0]
        if len(phases) == 1
        else datasets.concatenate_datasets(phases),
        eval_dataset=eval_dataset,
        data_collator=PhaseCollator(
            tokenizer,
            phase_cfgs,
            packing=run.packing,
            compiled=training.torch_compile,
            rows_per_example=packed_rows(statistics, len(phase_cfgs)),
        ),
        processing_class=tokenizer,
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs(
            run.optimizer,
            lr=training.learning_rate,
            betas=(training.adam_beta1, training.adam_beta2),
            eps=training.adam_epsilon,
            weight_decay=training.weight_decay,
        ),
        phase_sizes=None if run.streaming else [len(p) for p in phases],
        phase_samples=[n * run.global_batch_size for n in steps],
        callbacks=callbacks or None,
    )
    if run.streaming and training.dataloader_num_workers:
        trainer.stop_on_signal.stop_every = STREAM_STOP_EVERY
    start = time.time()
    trainer.train(resume_from_checkpoint=resume_from)
    elapsed = time.time() - start  # this invocation's
    if trainer.stop_on_signal.stopped:
        name, step = trainer.stop_on_signal.stopped
        if trainer.is_world_process_zero():
            logger.warning(stop_message(trainer.stop_on_signal, ["--resume_from_checkpoint", "true"]))
        return {"stopped_at_step": step, "stopped_by": name}
    if trainer.state.global_step < training.max_steps:
        logger.info(
            "stopped after step %d of %d; continue with --resume_from_checkpoint true",
            trainer.state.global_step,
            training.max_steps,
        )
        return {"stopped_at_step": trainer.state.global_step}

    summary = {
        "train_runtime_s": round(clock.seconds(), 1),
        "global_step": trainer.state.global_step,
        "train_loss": whole_run_loss(trainer.state.log_history),
        "processes": training.world_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "engine": trainer.engine,
        "hardware": hardware(training.device),
        "versions": framework_versions(),  # the card lists them as transformers' cards do
    }
    if run.streaming:  # the tokens this invocation trained on, summed over the processes, over its time
        tokens = trainer.accelerator.reduce(
            torch.tensor(float(trainer.tokens_seen), device=training.device), reduction="sum"
        ).item()
        summary["tokens_per_second"] = round(tokens / elapsed, 1)
    else:  # the tokens of every step the clock timed (all of them, unless it starts at from_step), over its time
        tokens = tokens_trained(statistics, steps, run.global_batch_size, after_step=clock.from_step)
        summary["tokens_per_second"] = round(tokens / clock.seconds(), 1)
    if clock.from_step:
        summary["train_runtime_from_step"] = clock.from_step
    if eval_dataset is not None:
        summary.update(trainer.evaluate())
    else:  # said at the start when it was not asked for (bert_repro.training.pretrain_data)
        summary["held_out_evaluation"] = "none"
    trainer.save_full_model(str(output_dir))  # every process: FSDP gathers the shards
    if trainer.is_world_process_zero():
        save_tokenizer(tokenizer, output_dir)
        write_json(output_dir / "log_history.json", trainer.state.log_history, indent=1)
        if run.plot:
            plot_curves(trainer.state.log_history, output_dir / "training_curves.png", data.pretraining_objective)
        write_json(output_dir / RESULTS, summary)  # last: a run with results.json is finished (`check_output_dir`)
        log_table("results", summary)
        if push_to is not None:  # every checkpoint as branch step-N, the final model on --hub_revision (main)
            push_to.push(output_dir, push_checkpoints, "--checkpoints")
    return summary
