"""The model a pre-training run trains, from --preset and --model_overrides or --init_from's checkpoint."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
from huggingface_hub.errors import StrictDataclassError

from ...model.configuration_bert_repro import DEFAULT_OBJECTIVE, BertReproConfig, check_objective_switches
from ...model.conversion import check_model_dir
from ...model.modeling_bert_repro import BertReproForPreTraining
from ..cli import ConfigurationError
from ..fp8 import convert_to_fp8

if TYPE_CHECKING:
    from ...data.pretraining_examples import PreTrainingDataConfig
    from .recipe import ModelSettings


def model_config(model_settings: ModelSettings, objective: str = DEFAULT_OBJECTIVE, **fields) -> BertReproConfig:
    """The preset with `fields` and --model_overrides, or --init_from's config; a ConfigurationError if invalid."""
    try:
        overrides = json.loads(model_settings.model_overrides) if model_settings.model_overrides else {}
    except json.JSONDecodeError as err:
        raise ConfigurationError(
            f"--model_overrides is not valid JSON ({err}); write a JSON object of "
            "BertReproConfig fields, e.g. '{\"hidden_dropout_prob\": 0.0}'."
        ) from None
    if not isinstance(overrides, dict):
        raise ConfigurationError(
            f"--model_overrides must be a JSON object of BertReproConfig fields, got {overrides!r}."
        )
    if "objective" in overrides:
        raise ConfigurationError(
            "Set the pre-training objective with --objective (it decides how the data are built "
            "too), not in --model_overrides."
        )
    if model_settings.init_from:
        check_model_dir(model_settings.init_from)
    try:
        if model_settings.init_from:  # continued pre-training keeps the checkpoint's attention direction
            config = BertReproConfig.from_pretrained(model_settings.init_from, objective=objective)
            for name, value in model_settings.switches().items():
                setattr(config, name, value)
            check_objective_switches(config)
            return config
        return BertReproConfig.from_preset(model_settings.preset, **{**fields, "objective": objective, **overrides})
    except (StrictDataclassError, ValueError, TypeError) as err:  # the config's own checks name the field
        reason = str(err).strip().splitlines()[-1].strip()
        source = (
            f"--init_from {model_settings.init_from}"
            if model_settings.init_from
            else f"--preset {model_settings.preset}, --model_overrides"
        )
        raise ConfigurationError(
            f"The model configuration ({source}, --objective {objective}) is invalid: {reason}"
        ) from None


def build_model(
    model_settings: ModelSettings, tokenizer, phases: list[PreTrainingDataConfig]
) -> BertReproForPreTraining:
    config = model_config(
        model_settings, phases[0].objective, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id
    )
    if len(tokenizer) > config.vocab_size:
        raise ConfigurationError(f"The tokenizer has {len(tokenizer)} tokens but the model only {config.vocab_size}.")
    if model_settings.init_from:
        model = BertReproForPreTraining.from_pretrained(
            model_settings.init_from,
            attn_implementation=model_settings.attn_implementation,
            sparse_prediction=model_settings.sparse_prediction,
            objective=config.objective,
            **model_settings.switches(),
        )
    else:
        for name, value in {**model_settings.switches(), "sparse_prediction": model_settings.sparse_prediction}.items():
            setattr(config, name, value)
        model = BertReproForPreTraining._from_config(config, attn_implementation=model_settings.attn_implementation)
    if not config.pretraining_objective.next_sentence:
        # No NSP: the pooler and NSP head stay as initialised (a fine-tune starts them afresh, as the paper's No NSP
        # model must); frozen so that DDP finds no unused parameter and weight decay leaves them alone.
        model.bert.pooler.requires_grad_(False)
        model.cls.seq_relationship.requires_grad_(False)
    if model_settings.fp8:  # opt-in; `check_values` refused it where it cannot run
        convert_to_fp8(model)
    return model.compile_layers() if model_settings.compile_layers else model


def allow_data_dependent_shapes() -> None:
    """Let torch.compile trace a packed batch whole: how many examples its rows hold is known from the data only."""
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    torch._dynamo.config.capture_scalar_outputs = True
