"""The models with the speed switches: the classes `bert_repro` exports.

Each class here is the model file's class of the same name (`modeling_bert_repro.py`, the paper's model), built
from the parts its config's switches pick: `speed_parts(config)` reads the one table, `SPEED_PATHS` (switch ->
the parts it builds otherwise), and passes the result down the model file's constructors (`BertReproParts`).
Nothing is changed after construction: every module is an instance of its class from the start, and the same
parameters as the model file's (so state_dict keys, tied weights and checkpoints are unchanged). The model file
does not import this module: saved code (`save_pretrained`, `trust_remote_code=True`) is the paper's model,
which ignores the switches as transformers' BERT does.

The table, switch -> part: class (module):
- unpad_inputs (padded batches): encoder: `SpeedEncoder`, layer: `SpeedLayer`, self-attention:
  `SpeedSelfAttention` (unpadding.py).
- last_layer_subset (heads that read few positions): the same three; the head models in `READS` pass the
  positions their head reads to the encoder (`ReadsFewPositions`, last_layer_subset.py).
- fast_dropout (training on CPU): dropout: `FastDropout` (fast_dropout.py); self-attention: `SpeedSelfAttention`,
  whose kernel is then `eager_attention_fast_dropout`.
- tied_gradients (training with an MLM head): embeddings: `TiedGradientEmbeddings`, MLM head:
  `TiedGradientMLMHead` (tied_gradients.py), given one link by the models with an MLM head.
Two switches that build the same part build it with the same class, whose options (`SpeedEncoder.unpad_inputs`,
`.last_layer_subset`, `SpeedSelfAttention.fast_dropout`) are the config's. Each module's docstring says how much
it speeds up, as measured in benchmarks/README.md. Regional `torch.compile` is not a config switch:
`model.compile_layers()`.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from torch import nn

from . import modeling_bert_repro as modeling
from .configuration_bert_repro import SPEED_SWITCHES, check_objective_switches
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
}
assert tuple(SPEED_PATHS) == tuple(SPEED_SWITCHES), "one entry per config switch, in the config's order"


def speed_parts(config) -> BertReproParts:
    """The classes a model with `config`'s switches is built from: the paper's, but for the parts `SPEED_PATHS`
    names for each switch that is on. Switches the config's objective rules out (a causal model:
    `BIDIRECTIONAL_ONLY_SWITCHES`) raise `ObjectiveConflictError`, also when set after the config was built."""
    check_objective_switches(config)
    picked: dict[str, type[nn.Module]] = {}
    for switch, parts in SPEED_PATHS.items():
        if getattr(config, switch, False):
            picked.update(parts)
    return replace(PAPER_PARTS, **picked)


class ReadsFewPositions:
    """For the head models in `READS`: with `last_layer_subset`, the forward passes the (batch, seq) positions its
    head reads to the encoder as `read_positions` (`last_layer_subset.read_positions`)."""

    def forward(self, *args, **kwargs):
        if self.config.last_layer_subset:
            inputs = inspect.signature(super().forward).bind(*args, **kwargs).arguments
            cls, masked = next(reads for model_class, reads in READS.items() if isinstance(self, model_class))
            positions = read_positions(inputs, cls, masked, self.config.sparse_prediction)
            if positions is not None:
                kwargs["read_positions"] = positions
        return super().forward(*args, **kwargs)


def _link_tied_gradients(model) -> None:
    if model.config.tied_gradients:
        link_tied_gradients(model.bert.embeddings, model.cls.predictions)


class BertReproModel(modeling.BertReproModel):
    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config, add_pooling_layer, parts=speed_parts(config))


class BertReproForPreTraining(ReadsFewPositions, modeling.BertReproForPreTraining):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))
        _link_tied_gradients(self)


class BertReproForMaskedLM(ReadsFewPositions, modeling.BertReproForMaskedLM):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))
        _link_tied_gradients(self)


class BertReproForNextSentencePrediction(ReadsFewPositions, modeling.BertReproForNextSentencePrediction):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))


class BertReproForSequenceClassification(ReadsFewPositions, modeling.BertReproForSequenceClassification):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))


class BertReproForQuestionAnswering(modeling.BertReproForQuestionAnswering):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))


class BertReproForMultipleChoice(ReadsFewPositions, modeling.BertReproForMultipleChoice):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))


class BertReproForTokenClassification(modeling.BertReproForTokenClassification):
    def __init__(self, config):
        super().__init__(config, speed_parts(config))


__all__ = ["SPEED_PATHS", "BertReproForMaskedLM", "BertReproForMultipleChoice", "BertReproForNextSentencePrediction",
           "BertReproForPreTraining", "BertReproForQuestionAnswering", "BertReproForSequenceClassification",
           "BertReproForTokenClassification", "BertReproModel", "ReadsFewPositions", "speed_parts"]
