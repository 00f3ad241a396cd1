"""`plan(recipe) -> PreTrainingPlan`: what the run does with a recipe (Trainer's arguments with what they derive,
each phase's examples and steps, the example source), checked and resolved once, before the corpus is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace as replace_fields
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from ...data.pretraining_examples import PreTrainingDataConfig
from ..cli import ConfigurationError, check_trainer_settings, fit_to_this_machine, importable
from ..distributed import check_engine
from .examples import ExampleSource, example_source
from .model import model_config
from .phases import phase_configs, phase_steps
from .recipe import PreTrainingRecipe, check_values, check_vocabulary, gradient_accumulation


@dataclass(frozen=True)
class PreTrainingPlan:
    recipe: PreTrainingRecipe
    training: TrainingArguments  # what Trainer runs with: the recipe's, with what the plan derives
    output_dir: Path
    phase_configs: tuple[PreTrainingDataConfig, ...]
    phase_steps: tuple[int, ...]  # optimizer steps of each phase
    source: ExampleSource
    resume: bool | str | None  # --resume_from_checkpoint: True (the newest checkpoint), a path, or None
    plot: bool  # training_curves.png at the end
    record: dict[str, Any]  # run_config.json: the recipe, whole
    warnings: tuple[str, ...]  # said once the log is set up


def check(recipe: PreTrainingRecipe) -> None:
    """The one place where a pre-training recipe is checked, before any data work; a new setting gets its check here."""
    data, training = recipe.data, recipe.training
    check_values(recipe)
    check_engine(training, optimizer=recipe.optimization.optimizer)
    check_trainer_settings(training)
    derived = gradient_accumulation(recipe)
    if training.gradient_accumulation_steps not in (1, derived):  # given, and not what the batch sizes make
        steps, batch = training.gradient_accumulation_steps, recipe.optimization.global_batch_size
        raise ConfigurationError(
            f"--gradient_accumulation_steps {steps}: pre-training derives it from --global_batch_size "
            f"{batch} / (--per_device_train_batch_size {training.per_device_train_batch_size} x "
            f"{training.world_size} processes) = {derived}. For {steps} steps, pass --global_batch_size "
            f"{steps * training.per_device_train_batch_size * training.world_size}."
        )
    positions = model_config(recipe.model, recipe.examples.objective, **recipe.model.switches()).max_position_embeddings
    if (longest := max(phase.max_seq_length for phase in recipe.phases)) > positions:
        raise ConfigurationError(
            f"max_seq_length {longest} is longer than the model's max_position_embeddings ({positions}); lower "
            "max_seq_length / phase2_max_seq_length."
        )
    check_vocabulary(data)
    if data.packing and recipe.examples.pretraining_objective.causal:
        raise ConfigurationError(
            f"--packing true cannot be used with --objective {recipe.examples.objective}: packed rows keep "
            "each example to itself in both directions, not left-to-right. Turn packing off."
        )
    if data.streaming and training.dataloader_num_workers and training.save_strategy not in ("steps", "no"):
        raise ConfigurationError(
            "--streaming true with --dataloader_num_workers keeps the stream's position at planned steps: use "
            f"--save_strategy steps (not {training.save_strategy.value}), or no workers."
        )


def plan(recipe: PreTrainingRecipe) -> PreTrainingPlan:
    """Check `recipe` (`check`) and resolve what the run does with it."""
    check(recipe)
    training = recipe.training
    warnings = [w for w in (recipe.model.torch_compile_warning(training.torch_compile), warmup_warning(training)) if w]
    plot = recipe.output.plot and importable("matplotlib")
    if recipe.output.plot and not plot:
        warnings.append(
            "matplotlib is not installed (pip install 'bert-repro[train]'): not writing training_curves.png"
        )
    given = training.resume_from_checkpoint
    resume = None if given in (None, "", "false", "False") else True if given in ("true", "True") else given
    return PreTrainingPlan(
        recipe=recipe,
        training=trainer_arguments(recipe),
        output_dir=Path(training.output_dir),
        phase_configs=tuple(phase_configs(recipe)),
        phase_steps=tuple(phase_steps(training.max_steps, recipe.phase_flags().phase2_fraction, len(recipe.phases))),
        source=example_source(recipe),
        resume=resume,
        plot=plot,
        record=recipe.to_dict(),
        warnings=tuple(warnings),
    )


def warmup_warning(training: TrainingArguments) -> str | None:
    """One line when warm-up takes half the run or more (a large config's 10,000 warm-up steps on a short run)."""
    steps, warmup = training.max_steps, training.get_warmup_steps(training.max_steps)
    if warmup * 2 < steps:
        return None
    lr, share = training.learning_rate, min(1.0, warmup / steps)
    return (
        f"--warmup_steps {warmup:,} of --max_steps {steps:,}: the learning rate rises for {share:.0%} of the run and "
        f"peaks at {lr * min(1.0, steps / warmup):.2g} (--learning_rate {lr:g}); for a short run lower --warmup_steps "
        "(the paper warms up for 1% of its steps: --warmup_steps 0.01)."
    )


def trainer_arguments(recipe: PreTrainingRecipe) -> TrainingArguments:
    """The run's own copy of the recipe's TrainingArguments, with what the recipe derives: Trainer pickles it into
    every checkpoint (`take_push_request` takes the Hub token out of it first)."""
    training = replace_fields(recipe.training)
    training.gradient_accumulation_steps = gradient_accumulation(recipe)
    if recipe.data.streaming:
        training.ignore_data_skip = True  # resuming restores the stream's own position instead of re-reading it
    fit_to_this_machine(training)
    return training
