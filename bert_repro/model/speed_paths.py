"""The speed switches' module classes, registered with the model file (`modeling_bert_repro.SPEED_PATHS`).

A model built while this module is imported (the package imports it) takes, for each switch its config turns on, the
classes named here instead of the paper's (`modeling_bert_repro.model_parts`). They subclass the paper's modules and
keep their parameters, so checkpoints and tied weights are unchanged. The model file does not import this module:
saved code is the paper's model, which ignores the switches as transformers' BERT does.
"""

from __future__ import annotations

from .configuration_bert_repro import SPEED_SWITCHES
from .dropout_add_layer_norm import FusedOutput, FusedSelfOutput
from .fast_dropout import FastDropout
from .modeling_bert_repro import SPEED_PATHS
from .tied_gradients import TiedGradientEmbeddings, TiedGradientMLMHead
from .unpadding import SpeedEncoder, SpeedLayer, SpeedSelfAttention

_ROWS = {"encoder": SpeedEncoder, "layer": SpeedLayer, "self_attention": SpeedSelfAttention}
SPEED_PATHS.update(
    {
        "unpad_inputs": _ROWS,
        "last_layer_subset": _ROWS,
        "fast_dropout": {"dropout": FastDropout, "self_attention": SpeedSelfAttention},
        "tied_gradients": {"embeddings": TiedGradientEmbeddings, "mlm_head": TiedGradientMLMHead},
        "fused_dropout_add_norm": {"self_output": FusedSelfOutput, "output": FusedOutput},
        "fused_qkv": {"self_attention": SpeedSelfAttention},
        "measured_sdpa": {"self_attention": SpeedSelfAttention},
    }
)
assert tuple(SPEED_PATHS) == tuple(SPEED_SWITCHES), "one entry per config switch, in the config's order"

__all__ = ["SPEED_PATHS"]
