"""Opt-in FP8 training of the Transformer blocks' linear layers (`--fp8`; not the paper's): torchao's
`convert_to_float8_training` (e4m3 forward, e5m2 gradients, dynamic scales), which Trainer cannot ask Accelerate
for with our choice of layers, so the recipe converts the model. Only the blocks' linears, as torchao advises (the
MLM head's logits are the most sensitive); parameter names are unchanged, so checkpoints are the plain model's.
`unpad_inputs`' grouped attention runs its Q/K/V product in bf16.
"""

from __future__ import annotations

import re

import torch
from torch import nn

BLOCK_LINEAR = re.compile(r"(^|\.)encoder\.layer\.\d+\.")
# torch._scaled_mm wants both sides of the product in multiples of 16.
FP8_MULTIPLE = 16
# torchao's float8 products need compute capability 8.9 (Ada) or more.
MIN_CAPABILITY = (8, 9)


def fp8_layer_filter(module: nn.Module, fqn: str) -> bool:
    """An nn.Linear inside a Transformer block, both sizes multiples of 16."""
    return (
        isinstance(module, nn.Linear)
        and BLOCK_LINEAR.search(fqn) is not None
        and module.in_features % FP8_MULTIPLE == 0
        and module.out_features % FP8_MULTIPLE == 0
    )


def fp8_problem(bf16: bool) -> str | None:
    """Why `--fp8` cannot run here, or None. The float8 products run inside bf16 autocast, so `--bf16` is part of
    the requirement, not a separate choice."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "--fp8 needs torchao (pip install torchao), which is not installed."
    if not torch.cuda.is_available():
        return "--fp8 needs a CUDA GPU of compute capability 8.9 or more (Ada, Hopper); none is visible."
    if torch.cuda.get_device_capability() < MIN_CAPABILITY:
        name, capability = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
        return f"--fp8 needs compute capability 8.9 or more; {name} has {capability[0]}.{capability[1]}."
    if not bf16:
        return "--fp8 runs inside bf16 mixed precision: add --bf16 true."
    return None


def convert_to_fp8(model: nn.Module, emulate: bool = False) -> nn.Module:
    """The blocks' linears replaced in place by torchao's `Float8Linear`; `emulate`: on any device (tests)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return convert_to_float8_training(
        model, module_filter_fn=fp8_layer_filter, config=Float8LinearConfig(emulate=emulate)
    )


__all__ = ["convert_to_fp8", "fp8_layer_filter", "fp8_problem"]
