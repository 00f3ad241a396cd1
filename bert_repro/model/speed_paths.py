"""The speed paths: which config switch installs what, applied once, when a model is built.

`BertReproPreTrainedModel.post_init` calls `install_speed_paths(model)` when any switch of `SPEED_SWITCHES` is on
(the inner `BertReproModel` and the head model around it both do; installing is idempotent). Each switch names
the modules it gives a subclass holding the SAME parameters (so state_dict keys, tied weights and optimizer
references are unchanged) by setting their `__class__`, as `torch.nn.utils.parametrize` does, and an optional
setup step. Where two switches change the same module (unpad_inputs and fast_dropout: the self-attention; unpad_inputs
and last_layer_subset: the encoder) the module gets one class deriving from both, in the table's order. Nothing
is re-decided per forward here; a module's own forward decides only what depends on the batch (padding, training
mode, device). A switch changed on the config after the model is built takes effect at the next
`install_speed_paths(model)`, which also undoes the switches turned off.

The table (`SPEED_PATHS`), switch -> module: speed subclass; setup step:
- unpad_inputs (padded batches; unpadding.py): encoder: `UnpaddedEncoder`; self-attention: `UnpaddedSelfAttention`.
- last_layer_subset (heads that read few positions; last_layer_subset.py): encoder: `LastLayerSubsetEncoder`;
  last layer: `ReadRowsLayer`; setup: the head model's pre-hook that adds `read_positions` to its kwargs.
- fast_dropout (training on CPU; fast_dropout.py): `nn.Dropout`: `FastDropout`; self-attention:
  `FastDropoutSelfAttention`.
- tied_gradients (training with an MLM head; tied_gradients.py): embeddings: `TiedGradientEmbeddings`; MLM head:
  `TiedGradientMLMHead`; setup: one `TiedGradientLink` for the two.
Each module's docstring says how much it speeds up, as measured in benchmarks/README.md.

`compile_layers(model)` (also `model.compile_layers()`) is regional `torch.compile`, not a config switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from .configuration_bert_repro import SPEED_SWITCHES, check_objective_switches
from .fast_dropout import FastDropout, FastDropoutSelfAttention
from .last_layer_subset import LastLayerSubsetEncoder, ReadRowsLayer, install_read_positions_hook, is_last_layer
from .modeling_bert_repro import (
    BertReproEmbeddings,
    BertReproEncoder,
    BertReproLayer,
    BertReproMLMHead,
    BertReproSelfAttention,
)
from .tied_gradients import TiedGradientEmbeddings, TiedGradientMLMHead, link_tied_gradients
from .packed_sequences import PackedSequences
from .unpadding import UnpaddedEncoder, UnpaddedSelfAttention


def _everywhere(model: nn.Module, module: nn.Module) -> bool:
    return True


@dataclass(frozen=True)
class Swap:
    """The modules of class `target` (where `where(model, module)` holds) become `speed_class`, a subclass."""

    target: type
    speed_class: type
    where: Callable[[nn.Module, nn.Module], bool] = _everywhere


@dataclass(frozen=True)
class SpeedPath:
    swaps: tuple[Swap, ...]
    setup: Callable[[nn.Module, bool], None] | None = None  # (model, switch on?), after the swaps


SPEED_PATHS: dict[str, SpeedPath] = {
    "unpad_inputs": SpeedPath((Swap(BertReproEncoder, UnpaddedEncoder),
                               Swap(BertReproSelfAttention, UnpaddedSelfAttention))),
    "last_layer_subset": SpeedPath((Swap(BertReproEncoder, LastLayerSubsetEncoder),
                                    Swap(BertReproLayer, ReadRowsLayer, is_last_layer)),
                                   setup=install_read_positions_hook),
    "fast_dropout": SpeedPath((Swap(nn.Dropout, FastDropout), Swap(BertReproSelfAttention, FastDropoutSelfAttention))),
    "tied_gradients": SpeedPath((Swap(BertReproEmbeddings, TiedGradientEmbeddings),
                                 Swap(BertReproMLMHead, TiedGradientMLMHead)),
                                setup=link_tied_gradients),
}
assert tuple(SPEED_PATHS) == SPEED_SWITCHES, "one entry per config switch, in the config's order"

SPEED_CLASSES = frozenset(swap.speed_class for path in SPEED_PATHS.values() for swap in path.swaps)
_COMBINED: dict[tuple[type, ...], type] = {}


def _reference_class(cls: type) -> type:
    """The model file's (or torch's) class under any speed subclasses."""
    return next(c for c in cls.__mro__ if c not in SPEED_CLASSES and c not in _COMBINED.values())


def _combined(classes: tuple[type, ...]) -> type:
    """One class deriving from several speed subclasses of the same module, in the table's order."""
    if len(classes) == 1:
        return classes[0]
    if classes not in _COMBINED:
        name = "With".join(c.__name__ for c in classes)
        combined = type(name, classes, {"__module__": __name__, "__doc__": " + ".join(c.__name__ for c in classes)})
        globals()[name] = combined  # so that pickle finds it
        _COMBINED[classes] = combined
    return _COMBINED[classes]


def install_speed_paths(model: nn.Module) -> nn.Module:
    """Give every module of `model` the classes its config's switches ask for (`SPEED_PATHS`), and run the setup
    steps. Idempotent; undoes the switches that are off. Returns the model. Switches that the config's pre-training
    objective rules out (a causal model: `BIDIRECTIONAL_ONLY_SWITCHES`) raise `ObjectiveConflictError`, also when
    set on the config after it was built."""
    check_objective_switches(model.config)
    on = {name: bool(getattr(model.config, name, False)) for name in SPEED_PATHS}
    swaps = [swap for name, path in SPEED_PATHS.items() if on[name] for swap in path.swaps]
    for module in list(model.modules()):
        reference = _reference_class(type(module))
        classes = tuple(s.speed_class for s in swaps if issubclass(reference, s.target) and s.where(model, module))
        wanted = _combined(classes) if classes else reference
        if type(module) is not wanted:
            module.__class__ = wanted
    for name, path in SPEED_PATHS.items():
        if path.setup is not None:
            path.setup(model, on[name])
    return model


def packed_sequences(position_ids, attention_mask) -> PackedSequences | None:
    """The examples of a packed batch (`packing.py`), or None: the model file's link to packing, taken (lazily)
    only when a forward is given position_ids."""
    return PackedSequences.from_inputs(position_ids, attention_mask)


def compile_layers(model: nn.Module, **compile_kwargs) -> nn.Module:
    """`torch.compile` every Transformer block in place (regional compilation) and return the model.

    The L blocks share one compiled graph (their weights are graph inputs), so compiling takes seconds rather than
    the minutes a whole-model `torch.compile` needs, and the data-dependent parts outside the blocks (unpadding,
    the sparse MLM selection) stay eager. The outputs equal the eager model's to float rounding (dropout draws
    its random numbers differently when compiled). Measured on CPU (benchmarks/README.md): from -14% to +27% of a
    pre-training step over six runs, slower for encoding and MRPC fine-tuning: meant for GPUs. kwargs go to
    `torch.compile`."""
    for module in model.modules():
        if isinstance(module, BertReproLayer):
            module.compile(**compile_kwargs)
    return model


__all__ = ["SPEED_PATHS", "SpeedPath", "Swap", "compile_layers", "install_speed_paths", "packed_sequences"]
