"""The models with the speed switches: the classes `bert_repro` exports.

Each class is the model file's class of the same name, built from the parts its config's switches pick
(`speed_parts`). The parameters are the model file's, so checkpoints and tied weights are unchanged. The model file
does not import this module: saved code is the paper's model, which ignores the switches as transformers' BERT does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import replace

from torch import nn

from . import modeling_bert_repro as modeling
from .configuration_bert_repro import SPEED_SWITCHES, check_objective_switches
from .dropout_add_layer_norm import FusedOutput, FusedSelfOutput
from .fast_dropout import FastDropout
from .last_layer_subset import READS, read_positions
from .modeling_bert_repro import PAPER_PARTS, BertReproParts
from .tied_gradients import TiedGradientEmbeddings, TiedGradientMLMHead, link_tied_gradients
from .unpadding import SpeedEncoder, SpeedLayer, SpeedSelfAttention

_ROWS = {"encoder": SpeedEncoder, "layer": SpeedLayer, "self_attention": SpeedSelfAttention}
SPEED_PATHS: dict[str, dict[str, type[nn.Module]]] = {
    "unpad_inputs": _ROWS,
    "last_layer_subset": _ROWS,
    "fast_dropout": {"dropout": FastDropout, "self_attention": SpeedSelfAttention},
    "tied_gradients": {"embeddings": TiedGradientEmbeddings, "mlm_head": TiedGradientMLMHead},
    "fused_dropout_add_norm": {"self_output": FusedSelfOutput, "output": FusedOutput},
    "fused_qkv": {"self_attention": SpeedSelfAttention},
    "measured_sdpa": {"self_attention": SpeedSelfAttention},
}
assert tuple(SPEED_PATHS) == tuple(SPEED_SWITCHES), "one entry per config switch, in the config's order"


def speed_parts(config) -> BertReproParts:
    """The paper's parts, but for those `SPEED_PATHS` names for each switch that is on. Switches the objective rules
    out raise `ObjectiveConflictError`, also when set after the config was built."""
    check_objective_switches(config)
    picked: dict[str, type[nn.Module]] = {}
    for switch, parts in SPEED_PATHS.items():
        if getattr(config, switch, False):
            picked.update(parts)
    return replace(PAPER_PARTS, **picked)


def passing_read_positions(paper_class: type) -> Callable:
    """`paper_class.forward`, passing the positions its head reads to the encoder with `last_layer_subset`. It keeps
    the signature (Trainer reads it to pick the dataset's columns)."""
    forward, (cls, masked) = paper_class.forward, READS[paper_class]
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def forward_passing_read_positions(self, *args, **kwargs):
        if self.config.last_layer_subset:
            inputs = signature.bind(self, *args, **kwargs).arguments
            positions = read_positions(inputs, cls, masked, self.config.sparse_prediction)
            if positions is not None:
                kwargs["read_positions"] = positions
        return forward(self, *args, **kwargs)

    return forward_passing_read_positions


def _link_tied_gradients(model) -> None:
    if model.config.tied_gradients:
        link_tied_gradients(model.bert.embeddings, model.cls.predictions)


class BertReproModel(modeling.BertReproModel):
    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config, add_pooling_layer, parts=speed_parts(config))


class BertReproForPreTraining(modeling.BertReproForPreTraining):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))
        _link_tied_gradients(self)

    forward = passing_read_positions(modeling.BertReproForPreTraining)


class BertReproForMaskedLM(modeling.BertReproForMaskedLM):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))
        _link_tied_gradients(self)

    forward = passing_read_positions(modeling.BertReproForMaskedLM)


class BertReproForNextSentencePrediction(modeling.BertReproForNextSentencePrediction):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))

    forward = passing_read_positions(modeling.BertReproForNextSentencePrediction)


class BertReproForSequenceClassification(modeling.BertReproForSequenceClassification):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))

    forward = passing_read_positions(modeling.BertReproForSequenceClassification)


class BertReproForQuestionAnswering(modeling.BertReproForQuestionAnswering):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))


class BertReproForMultipleChoice(modeling.BertReproForMultipleChoice):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))

    forward = passing_read_positions(modeling.BertReproForMultipleChoice)


class BertReproForTokenClassification(modeling.BertReproForTokenClassification):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))


__all__ = [
    "SPEED_PATHS",
    "BertReproForMaskedLM",
    "BertReproForMultipleChoice",
    "BertReproForNextSentencePrediction",
    "BertReproForPreTraining",
    "BertReproForQuestionAnswering",
    "BertReproForSequenceClassification",
    "BertReproForTokenClassification",
    "BertReproModel",
    "passing_read_positions",
    "speed_parts",
]
