"""`run_pretraining(recipe)`: the paper's pre-training (section 3.1, appendix A.2) as one call.

    from bert_repro.training import PreTrainingRecipe, run_pretraining
    run_pretraining(PreTrainingRecipe.from_yaml("recipes/configs/quickstart.yaml").replace(max_steps=500))

A directory holding a different run is never overwritten; the same run resumes or, finished, is left as it is.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from dataclasses import replace as replace_fields
from typing import Any

from transformers import IntervalStrategy, set_seed

from ...atomic import write_json
from ...data.wordpiece import save_tokenizer
from ...hub.push import push_checkpoints
from ...versions import framework_versions
from ..checkpoints import check_fits
from ..cluster import catching_stop_signals, log_from_the_main_process, stop_between_runs, stop_message
from ..distributed import hardware
from ..lifecycle import (
    RESULTS,
    RUN_CONFIG,
    STAGES,
    check_output_dir,
    complete,
    fingerprints,
    forget,
    holds_nothing,
    lock_output_dir_once,
    read_stages,
    release_output_dir,
)
from ..optim import optimizer_cls_and_kwargs
from ..publishing import PushRequest, take_push_request
from .examples import TOKENIZER_DIR, PreparedData
from .model import allow_data_dependent_shapes, build_model
from .phases import PhaseCollator, packed_rows
from .plan import PreTrainingPlan, plan
from .recipe import MAY_GROW, PreTrainingRecipe, check_extension, run_identity
from .records import held_out_warning, log_statistics, log_table, plot_curves
from .resume import (
    LongerSchedule,
    StopAfterSteps,
    TrainingClock,
    checkpoint_to_resume,
    forget_unstarted_run,
    whole_run_loss,
)
from .trainer import PreTrainingTrainer

logger = logging.getLogger(__name__)


def run_pretraining(recipe: PreTrainingRecipe) -> dict[str, Any]:
    """Returns results.json's summary, or {"stopped_at_step": N, ...} when this invocation stopped before the end."""
    the_plan = plan(recipe)
    log_from_the_main_process(the_plan.training)
    for warning in the_plan.warnings:
        logger.warning(warning)
    opened = open_output_dir(the_plan)
    if "records" in opened.done:  # trained and recorded earlier; the push is what is left
        with catching_stop_signals():
            result = push_stage(the_plan, opened, json.loads((the_plan.output_dir / RESULTS).read_text()))
        release_output_dir(the_plan.output_dir)
        return result
    prepared = prepare_data(the_plan, opened)
    model = build(the_plan, prepared)
    with catching_stop_signals():  # through the final evaluation and save too: a signal then stops before the push
        trainer, clock, elapsed = train(the_plan, opened, prepared, model)
        result = stopped_early(the_plan, trainer) or publish(the_plan, opened, prepared, trainer, clock, elapsed)
    release_output_dir(the_plan.output_dir)
    return result


@dataclass(frozen=True)
class OpenedRun:
    grown: dict[str, tuple[Any, Any]]  # {"training.max_steps": (saved, new)} when the run is extended
    resume_from: str | None  # the checkpoint Trainer resumes from
    push_to: PushRequest | None  # --push_to_hub, checked with the Hub
    fresh: bool  # the directory held nothing of this run
    record: dict  # run_config.json: the recipe and the fingerprints of what the run reads
    done: dict  # the stages completed before this invocation (`lifecycle.read_stages`)


def open_output_dir(plan: PreTrainingPlan) -> OpenedRun:
    """The directory checked and locked for this run, the push and the checkpoint to resume checked: before any data."""
    recipe, training, output_dir = plan.recipe, plan.training, plan.output_dir
    sources = {"corpus": recipe.data.corpus, "tokenizer": recipe.data.tokenizer}
    record = {**plan.record, "inputs": fingerprints(sources, hub_type="dataset")}
    wanted = {"records": {}}
    if training.push_to_hub:
        wanted["push"] = {"repo_id": training.hub_model_id, "revision": training.hub_revision}

    def check_dir(overwrite: bool = recipe.output.overwrite_output_dir) -> dict:
        return check_output_dir(
            output_dir,
            record,
            resume=plan.resume is not None,
            overwrite=overwrite,
            identity=run_identity,
            may_grow=MAY_GROW,
            wanted=wanted,
            resumed=plan.resume is not None,
        )

    grown = check_dir()
    if grown:
        check_extension(grown, recipe)
    push_to = take_push_request(training)
    overwrite = recipe.output.overwrite_output_dir
    lock_output_dir_once(output_dir, training, check_dir, overwrite=overwrite, resumed=plan.resume is not None)
    done = {} if grown else read_stages(output_dir)
    streamed = plan.source.streamed
    resume_from = None if "records" in done else checkpoint_to_resume(output_dir, plan.resume, streamed=streamed)
    if grown and training.process_index == 0:
        # Before the record changes: a directory with results.json is finished, and the longer run is not yet.
        forget(output_dir, *STAGES)
        (output_dir / RESULTS).unlink(missing_ok=True)
        old, new = grown["training.max_steps"]
        schedule = getattr(training.lr_scheduler_type, "value", training.lr_scheduler_type)
        logger.info(
            f"extending the run from max_steps {old} to {new}: the learning-rate schedule ({schedule}, "
            f"{training.warmup_steps} warm-up steps) now ends at step {new}, so the rate after the checkpoint is that "
            f"of a {new}-step schedule"
        )
    return OpenedRun(grown, resume_from, push_to, fresh=holds_nothing(output_dir), record=record, done=done)


def prepare_data(plan: PreTrainingPlan, opened: OpenedRun) -> PreparedData:
    """Data: the run recorded, then its tokenizer and examples, the main process first (the others read them)."""
    training, output_dir = plan.training, plan.output_dir
    with training.main_process_first(desc="preparing pre-training data"):
        if training.process_index == 0:
            output_dir.mkdir(parents=True, exist_ok=True)
            write_json(output_dir / RUN_CONFIG, opened.record)
        try:
            prepared = plan.source.prepare(plan)
        except BaseException:
            if opened.fresh and training.process_index == 0:
                forget_unstarted_run(output_dir)  # so that a retry with other data is not "a different run"
            raise
    if training.process_index == 0:
        write_json(output_dir / "data_statistics.json", prepared.statistics)
        log_statistics(prepared.statistics)
        for warning in [*plan.source.warnings(prepared, plan), held_out_warning(prepared.statistics)]:
            if warning:
                logger.warning(warning)
    return prepared


def build(plan: PreTrainingPlan, prepared: PreparedData):
    """The model, from the same seed whatever data preparation drew before."""
    set_seed(plan.training.seed)
    if plan.training.torch_compile and plan.recipe.data.packing:
        allow_data_dependent_shapes()
    return build_model(plan.recipe.model, prepared.tokenizer, list(plan.phase_configs))


def train(plan: PreTrainingPlan, opened: OpenedRun, prepared: PreparedData, model):
    """Training: Trainer over the phases' examples, resumed where the run stopped; (trainer, clock, seconds)."""
    recipe, training, optimization = plan.recipe, plan.training, plan.recipe.optimization
    if prepared.eval_dataset is None and training.eval_strategy != IntervalStrategy.NO:  # nothing was held out
        training = replace_fields(training)
        training.eval_strategy = IntervalStrategy.NO
    if opened.resume_from:
        check_fits(opened.resume_from, model.config)
    clock = TrainingClock(opened.resume_from)
    callbacks = [clock] + ([StopAfterSteps(recipe.output.stop_after_steps)] if recipe.output.stop_after_steps else [])
    if opened.grown and opened.resume_from:
        callbacks.append(LongerSchedule())
    callbacks += plan.source.callbacks(prepared, plan, opened.resume_from)
    trainer = PreTrainingTrainer(
        model=model,
        args=training,
        train_dataset=plan.source.train_dataset(prepared),
        eval_dataset=prepared.eval_dataset,
        data_collator=PhaseCollator(
            prepared.tokenizer,
            list(plan.phase_configs),
            packing=recipe.data.packing,
            compiled=training.torch_compile,
            rows_per_example=packed_rows(prepared.statistics, len(plan.phase_configs)),
        ),
        processing_class=prepared.tokenizer,
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs(
            optimization.optimizer,
            lr=training.learning_rate,
            betas=(training.adam_beta1, training.adam_beta2),
            eps=training.adam_epsilon,
            weight_decay=training.weight_decay,
        ),
        phase_sizes=plan.source.phase_sizes(prepared),
        phase_samples=[n * optimization.global_batch_size for n in plan.phase_steps],
        callbacks=callbacks,
    )
    if plan.source.stop_every:
        trainer.stop_on_signal.stop_every = plan.source.stop_every
    start = time.time()
    trainer.train(resume_from_checkpoint=opened.resume_from)
    return trainer, clock, time.time() - start  # this invocation's seconds


def stopped_early(plan: PreTrainingPlan, trainer: PreTrainingTrainer) -> dict[str, Any] | None:
    """What to return when this invocation ended before the run's last step (a signal, --stop_after_steps)."""
    if trainer.stop_on_signal.stopped:
        name, step = trainer.stop_on_signal.stopped
        if trainer.is_world_process_zero():
            logger.warning(stop_message(trainer.stop_on_signal, ["--resume_from_checkpoint", "true"]))
        return {"stopped_at_step": step, "stopped_by": name}
    step = trainer.state.global_step
    if step < plan.training.max_steps:
        logger.info(
            f"stopped after step {step} of {plan.training.max_steps}; continue with --resume_from_checkpoint true"
        )
        return {"stopped_at_step": step}
    return None


def publish(
    plan: PreTrainingPlan, opened: OpenedRun, prepared: PreparedData, trainer: PreTrainingTrainer, clock, elapsed
) -> dict[str, Any]:
    """Records: the held-out evaluation, the final model, records and curves, results.json last, then the push."""
    training, output_dir = plan.training, plan.output_dir
    summary = {
        "train_runtime_s": round(clock.seconds(), 1),
        "global_step": trainer.state.global_step,
        "train_loss": whole_run_loss(trainer.state.log_history),
        "processes": training.world_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "engine": trainer.engine,
        "hardware": hardware(training.device),
        "versions": framework_versions(),  # the card lists them as transformers' cards do
        "tokens_per_second": plan.source.tokens_per_second(trainer, prepared, plan, clock, elapsed),
    }
    if clock.from_step:
        summary["train_runtime_from_step"] = clock.from_step
    if prepared.eval_dataset is not None:
        summary.update(trainer.evaluate())
    else:
        summary["held_out_evaluation"] = "none"
    trainer.save_full_model(str(output_dir))  # every process: FSDP gathers the shards
    if trainer.is_world_process_zero():
        save_tokenizer(prepared.tokenizer, output_dir)
        shutil.rmtree(output_dir / TOKENIZER_DIR, ignore_errors=True)  # the run's copy until now: one is enough
        write_json(output_dir / "log_history.json", trainer.state.log_history, indent=1)
        if plan.plot:
            objective = plan.phase_configs[0].pretraining_objective
            plot_curves(trainer.state.log_history, output_dir / "training_curves.png", objective)
        complete(output_dir, "train")
        write_json(output_dir / RESULTS, summary)  # last: the "records" stage is done when it is there
        log_table("results", summary)
    return push_stage(plan, opened, summary)


def push_stage(plan: PreTrainingPlan, opened: OpenedRun, summary: dict[str, Any]) -> dict[str, Any]:
    """The "push" stage: every checkpoint as branch step-N, the final model on --hub_revision (main); recorded, so
    that the same command pushes a run whose push was interrupted, and only once."""
    training, output_dir, push_to = plan.training, plan.output_dir, opened.push_to
    if push_to is None:
        return summary
    then = f"the same command publishes it, or publish it with: {push_to.push_command(output_dir, '--checkpoints')}"
    if stopped := stop_between_runs(training, "after the final save", then):
        return stopped
    if training.process_index == 0:
        pushed = push_to.push(output_dir, push_checkpoints, "--checkpoints")
        complete(output_dir, "push", **push_to.target, commits={rev: p.commit for rev, p in pushed.items()})
    return stop_between_runs(training, "after the push") or summary
