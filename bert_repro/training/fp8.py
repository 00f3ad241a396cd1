"""Opt-in FP8 training of the Transformer blocks' linear layers (`--fp8`; not the paper's): torchao's float8
training (e4m3 forward, e5m2 gradients, dynamic per-tensor scales), everything else as `--bf16` makes it.

It is torchao's `convert_to_float8_training`, what Accelerate's `mixed_precision="fp8"` with the AO backend calls;
Trainer cannot ask Accelerate for it with our choice of layers (it passes only "fp16"/"bf16" and no recipe
handler), so the recipe converts the model when it builds it. Only the blocks' linears, as torchao advises: the MLM
head (whose logits are the most sensitive), the pooler and NSP head stay in bf16. Parameter names are unchanged,
so checkpoints are the plain model's. `unpad_inputs`' grouped attention reads the weights directly and runs its
Q/K/V product in bf16.
"""

from __future__ import annotations

import re

import torch
from torch import nn

# The linears of the Transformer blocks: bert.encoder.layer.<i>.(attention.self.query|key|value,
# attention.output.dense, intermediate.dense, output.dense).
BLOCK_LINEAR = re.compile(r"(^|\.)encoder\.layer\.\d+\.")
# torch._scaled_mm wants both sides of the product in multiples of 16.
FP8_MULTIPLE = 16
# torchao's float8 products need compute capability 8.9 (Ada) or more.
MIN_CAPABILITY = (8, 9)


def fp8_layer_filter(module: nn.Module, fqn: str) -> bool:
    """Whether `convert_to_float8_training` converts the module at `fqn`: an nn.Linear inside a Transformer block,
    both sizes multiples of 16."""
    return (
        isinstance(module, nn.Linear)
        and BLOCK_LINEAR.search(fqn) is not None
        and module.in_features % FP8_MULTIPLE == 0
        and module.out_features % FP8_MULTIPLE == 0
    )


def fp8_problem(bf16: bool) -> str | None:
    """Why `--fp8` cannot run here (None when it can): torchao missing, no CUDA card of compute capability 8.9+, or
    no `--bf16` (the float8 products run inside bf16 autocast)."""
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
    """The model with its blocks' linears replaced by torchao's `Float8Linear` (in place; the same parameters).
    emulate: torchao computes the float8 products in higher precision with float8 rounding (any device; tests)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return convert_to_float8_training(
        model, module_filter_fn=fp8_layer_filter, config=Float8LinearConfig(emulate=emulate)
    )


__all__ = ["convert_to_fp8", "fp8_layer_filter", "fp8_problem"]
