"""The format of a saved checkpoint: transformers' own BERT, with our code beside it.

A bert_repro model computes what transformers' `Bert*` classes compute, with the same parameter names. So
`config.json` says `model_type` "bert" and names transformers' classes: plain transformers opens it as its own BERT,
`trust_remote_code=True` as our classes (the `auto_map`). Where transformers' BERT cannot compute the model
(`native_obstacles`), `config.json` keeps "bert_repro" and saving warns.

This file is copied next to the weights, so it imports only the standard library, transformers and the config.
"""

from __future__ import annotations

import warnings

from .configuration_bert_repro import DEFAULT_OBJECTIVE, PRETRAINING_OBJECTIVES

REPRO_MODEL_TYPE = "bert_repro"
TRANSFORMERS_MODEL_TYPE = "bert"
REPRO_CONFIG_CLASS = "configuration_bert_repro.BertReproConfig"  # the auto_map entry that marks our checkpoints
_REPRO_PREFIX, _TRANSFORMERS_PREFIX = "BertRepro", "Bert"

# Config fields whose value transformers' BERT classes implement only as given here; another value needs our code.
TRANSFORMERS_BERT_COMPUTES = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}
# Heads whose output width transformers reads from num_labels where ours is fixed: question answering (S and E).
FIXED_HEAD_WIDTHS = {"ForQuestionAnswering": 2}
# Our spellings of an activation that transformers knows under another name (the same function).
TRANSFORMERS_ACTIVATION_NAMES = {"gelu_tanh": "gelu_pytorch_tanh"}


class NotTransformersBertWarning(UserWarning):
    """A checkpoint saved for bert_repro / remote code only: transformers' own BERT cannot compute its model."""


def native_obstacles(config: dict) -> list[str]:
    """Why transformers' own BERT cannot open `config` (a config.json dict) as the same model, one per field."""
    from transformers.activations import ACT2FN

    reasons = []
    act = config.get("hidden_act", "gelu")
    if act not in ACT2FN:
        hint = TRANSFORMERS_ACTIVATION_NAMES.get(act)
        reasons.append(
            f"hidden_act={act!r} is not an activation transformers knows (transformers.activations.ACT2FN)"
            + (f"; {hint!r} is the same function under transformers' name" if hint else "")
        )
    for field, value in TRANSFORMERS_BERT_COMPUTES.items():
        if config.get(field, value) != value:
            reasons.append(f"{field}={config[field]!r}: transformers' BERT implements only {value!r}")
    objective = PRETRAINING_OBJECTIVES.get(config.get("objective", DEFAULT_OBJECTIVE))
    if objective is not None and objective.causal:  # a bidirectional objective ("mlm") is plain BERT
        reasons.append(
            f"objective={objective.name!r} attends left-to-right and pools the last real token; "
            "transformers' BertModel pools the first token ([CLS])"
        )
    model_type = config.get("model_type", REPRO_MODEL_TYPE)
    if model_type not in (REPRO_MODEL_TYPE, TRANSFORMERS_MODEL_TYPE):  # e.g. "bert_repro_bilstm" (bilstm_heads.py)
        reasons.append(f"model_type={model_type!r} has a head that transformers' BERT classes do not have")
    num_labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    for architecture in config.get("architectures") or []:
        for head, width in FIXED_HEAD_WIDTHS.items():
            if architecture.endswith(head) and num_labels != width:
                reasons.append(
                    f"num_labels={num_labels} with {architecture}: transformers' head has num_labels "
                    f"outputs, ours always {width}; set num_labels={width}"
                )
    return reasons


def transformers_class_name(name: str) -> str:
    """BertReproForPreTraining -> BertForPreTraining (transformers' class computing the same model)."""
    return _TRANSFORMERS_PREFIX + name[len(_REPRO_PREFIX) :] if name.startswith(_REPRO_PREFIX) else name


def repro_class_name(name: str) -> str:
    """BertForPreTraining -> BertReproForPreTraining; our own names are returned as they are."""
    if name.startswith(_REPRO_PREFIX) or not name.startswith(_TRANSFORMERS_PREFIX):
        return name
    return _REPRO_PREFIX + name[len(_TRANSFORMERS_PREFIX) :]


def is_repro_checkpoint(config: dict) -> bool:
    """Whether a config.json dict was written by bert_repro (either format), not by transformers or another tool."""
    # "bert_repro", and "bert_repro_bilstm" for the BiLSTM heads.
    return (
        str(config.get("model_type") or "").startswith(REPRO_MODEL_TYPE)
        or (config.get("auto_map") or {}).get("AutoConfig") == REPRO_CONFIG_CLASS
    )


def config_file_dict(config: dict, *, warn: bool = True) -> dict:
    """What config.json holds for a bert_repro config dict: transformers' BERT type and class names when its BERT
    computes the same model, else model_type "bert_repro" and a warning."""
    obstacles = native_obstacles(config)
    if obstacles and warn:
        warnings.warn(
            "This checkpoint is saved for bert_repro and trust_remote_code=True only (config.json model_type "
            f"{REPRO_MODEL_TYPE!r}): transformers' own BERT classes cannot compute it, because "
            + "; ".join(obstacles)
            + ".",
            NotTransformersBertWarning,
            stacklevel=3,
        )
    class_name = repro_class_name if obstacles else transformers_class_name
    converted = {**config, "model_type": REPRO_MODEL_TYPE if obstacles else TRANSFORMERS_MODEL_TYPE}
    if config.get("architectures"):
        converted["architectures"] = [class_name(a) for a in config["architectures"]]
    return converted


__all__ = [
    "NotTransformersBertWarning",
    "config_file_dict",
    "is_repro_checkpoint",
    "native_obstacles",
    "repro_class_name",
    "transformers_class_name",
]
