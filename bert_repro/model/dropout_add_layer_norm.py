"""Dropout + residual add + LayerNorm in one Triton kernel, forward and backward: the `fused_dropout_add_norm`
switch.

It speeds up `LayerNorm(residual + dropout(dense(x)))`, which ends both halves of every block, in training on CUDA.
Inductor's kernels for it run at over twice their byte floor (benchmarks/LOG.md, "Where the step's time goes";
figures in benchmarks/RESULTS.md). Here the forward reads x and the residual once, and the backward regenerates the
mask from the Philox seed (`dropout_add_layer_norm_kernels.py`).

The sum and the norm are float32, the output the residual's dtype (float32 under bf16 autocast, so the compiled
paper model's to float rounding); p is rounded to a multiple of 1/65536. Custom ops, so `torch.compile` keeps one
graph; on CPU the kernels run under `TRITON_INTERPRET=1` (tests), else torch's ops do the same.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .modeling_bert_repro import BertReproOutput, BertReproSelfOutput

# Drop decisions compare a 16-bit random number with round(p * RANDOM_RANGE).
RANDOM_RANGE = 65536
# config.residual_dtype -> the output's dtype (None: the residual's own, float32 under autocast).
OUT_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


@functools.cache
def _kernels():
    from . import dropout_add_layer_norm_kernels

    return dropout_add_layer_norm_kernels


# Looked up without importing triton (seconds).
HAS_TRITON = importlib.util.find_spec("triton") is not None


def runs_kernel(x: Tensor) -> bool:
    """Whether the Triton kernels run on x's device: CUDA, or CPU under `TRITON_INTERPRET=1`."""
    return HAS_TRITON and (x.is_cuda or (x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"))


def threshold_and_scale(p: float) -> tuple[int, float]:
    """The kernel's keep threshold for drop probability p, and the scale of kept values (0 at p = 1, as torch)."""
    threshold = round(p * RANDOM_RANGE)
    return threshold, RANDOM_RANGE / (RANDOM_RANGE - threshold) if threshold < RANDOM_RANGE else 0.0


def _tile(n: int) -> int:
    """M: a row of n columns is an (8, M) tile."""
    import triton

    return max(triton.next_power_of_2(n) // 8, 1)


def _rows_per_program(n: int, device: torch.device) -> int:
    """R, the rows a program holds: about 2048 values on CUDA, 16384 in the interpreter (its cost is per op)."""
    per_program = 2048 if device.type == "cuda" else 16384
    return max(per_program // (8 * _tile(n)), 1)


def _launch(rows: int, n: int, device: torch.device) -> dict:
    """The grid and block arguments shared by the kernels: R rows per program, M."""
    r = _rows_per_program(n, device)
    options = {"num_warps": 8} if device.type == "cuda" else {}
    return {"blocks": -(-rows // r), "R": r, "M": _tile(n), **options}


def _programs(blocks: int, device: torch.device) -> int:
    """Programs of the backward: a few per multiprocessor on CUDA, so each accumulates many rows' dW and dB."""
    if device.type == "cuda":
        return min(blocks, 4 * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(blocks, 2)


@torch.library.custom_op("bert_repro::dropout_add_layer_norm", mutates_args=(), device_types=("cuda", "cpu"))
def _forward(
    x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, seed: Tensor, p: float, eps: float, out_dtype: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(rows, N) x and residual -> y = LayerNorm(z), z = residual + dropout(x), each row's mean and 1/std."""
    rows, n = x.shape
    dtype = _DTYPES[out_dtype]
    y, z = torch.empty(rows, n, dtype=dtype, device=x.device), torch.empty(rows, n, dtype=dtype, device=x.device)
    mean, rstd = (torch.empty(rows, dtype=torch.float32, device=x.device) for _ in range(2))
    threshold, scale = threshold_and_scale(p)
    launch = _launch(rows, n, x.device)
    _kernels().forward_kernel[(launch.pop("blocks"),)](
        x, residual, weight, bias, y, z, mean, rstd, seed, rows, n, eps, threshold, scale, HAS_DROPOUT=p > 0, **launch
    )
    return y, z, mean, rstd


@_forward.register_fake
def _(x, residual, weight, bias, seed, p, eps, out_dtype):
    rows, n = x.shape
    dtype = _DTYPES[out_dtype]
    return (
        x.new_empty(rows, n, dtype=dtype),
        x.new_empty(rows, n, dtype=dtype),
        x.new_empty(rows, dtype=torch.float32),
        x.new_empty(rows, dtype=torch.float32),
    )


@torch.library.custom_op("bert_repro::dropout_add_layer_norm_backward", mutates_args=(), device_types=("cuda", "cpu"))
def _backward(
    dy: Tensor, z: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, seed: Tensor, p: float, x_dtype: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of x, the residual, the weight and the bias."""
    rows, n = z.shape
    dx = torch.empty(rows, n, dtype=_DTYPES[x_dtype], device=z.device)
    dr = torch.empty(rows, n, dtype=z.dtype, device=z.device)
    launch = _launch(rows, n, z.device)
    blocks = launch.pop("blocks")
    programs = _programs(blocks, z.device)
    dw, db = (torch.empty(programs, n, dtype=torch.float32, device=z.device) for _ in range(2))
    threshold, scale = threshold_and_scale(p)
    _kernels().backward_kernel[(programs,)](
        dy.contiguous(),
        z,
        weight,
        mean,
        rstd,
        seed,
        dx,
        dr,
        dw,
        db,
        rows,
        n,
        threshold,
        scale,
        BLOCKS_PER_PROGRAM=-(-blocks // programs),
        HAS_DROPOUT=p > 0,
        **launch,
    )
    return dx, dr, dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype)


@_backward.register_fake
def _(dy, z, weight, mean, rstd, seed, p, x_dtype):
    return (
        z.new_empty(z.shape, dtype=_DTYPES[x_dtype]),
        z.new_empty(z.shape),
        weight.new_empty(weight.shape),
        (weight.new_empty(weight.shape)),
    )


# Dtypes travel through the ops' schemas as indices (a custom op's schema has no dtype type).
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _setup_context(ctx, inputs, output):
    x, _, weight, _, seed, p, _, _ = inputs
    _, z, mean, rstd = output
    ctx.save_for_backward(z, weight, mean, rstd, seed)
    ctx.p, ctx.x_dtype = p, _DTYPES.index(x.dtype)


def _autograd_backward(ctx, dy, _dz, _dmean, _drstd):
    z, weight, mean, rstd, seed = ctx.saved_tensors
    dx, dr, dw, db = _backward(dy, z, weight, mean, rstd, seed, ctx.p, ctx.x_dtype)
    return dx, dr, dw, db, None, None, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def dropout_add_layer_norm(
    x: Tensor,
    residual: Tensor,
    norm: nn.LayerNorm,
    p: float,
    training: bool,
    out_dtype: torch.dtype | None = None,
    seed: Tensor | None = None,
) -> Tensor:
    """norm(residual + dropout(x, p)) by the kernels where they run, else torch's ops. seed: a 1-element int64
    tensor on x's device, by default drawn from torch."""
    p = p if training else 0.0
    if not runs_kernel(x):
        return paper_dropout_add_layer_norm(x, residual, norm, p, out_dtype)
    dtype = out_dtype or residual.dtype
    if seed is None:
        # A tensor, not a Python number: drawn inside the compiled graph, so each step has its own mask.
        seed = torch.randint(0, 2**31 - 1, (1,), device=x.device) if p > 0 else torch.zeros(1, device=x.device)
    shape = x.shape
    ones, zeros = (torch.full((shape[-1],), v, dtype=torch.float32, device=x.device) for v in (1.0, 0.0))
    y, _, _, _ = _forward(
        x.reshape(-1, shape[-1]).contiguous(),
        residual.reshape(-1, shape[-1]).contiguous(),
        ones if norm.weight is None else norm.weight,
        zeros if norm.bias is None else norm.bias,
        seed.to(torch.int64),
        float(p),
        float(norm.eps),
        _DTYPES.index(dtype),
    )
    return y.view(shape)


def paper_dropout_add_layer_norm(
    x: Tensor, residual: Tensor, norm: nn.LayerNorm, p: float, out_dtype: torch.dtype | None = None
) -> Tensor:
    """The model file's arithmetic, `norm(residual + dropout(x))`, with torch's dropout."""
    y = norm(residual + F.dropout(x, p, training=p > 0))
    return y if out_dtype is None else y.to(out_dtype)


def random_numbers(seed: Tensor, rows: int, n: int) -> Tensor:
    """(rows, n) int32 in [0, 65536): the numbers the kernels compare with the keep threshold."""
    numbers = torch.empty(rows, n, dtype=torch.int32, device=seed.device)
    launch = _launch(rows, n, seed.device)
    _kernels().random_numbers_kernel[(launch.pop("blocks"),)](numbers, seed.to(torch.int64), rows, n, **launch)
    return numbers


class FusedDropoutAddNorm:
    """A mixin: the post-LN output modules through `dropout_add_layer_norm`, with the paper modules' parameters."""

    def __init__(self, config, parts):
        super().__init__(config, parts)
        self.out_dtype = OUT_DTYPES[config.residual_dtype]

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return dropout_add_layer_norm(
            self.dense(hidden_states), residual, self.LayerNorm, self.dropout.p, self.training, self.out_dtype
        )


class FusedSelfOutput(FusedDropoutAddNorm, BertReproSelfOutput):
    """`BertReproSelfOutput` (attention output) with the fused dropout + residual + LayerNorm."""


class FusedOutput(FusedDropoutAddNorm, BertReproOutput):
    """`BertReproOutput` (feed-forward output) with the fused dropout + residual + LayerNorm."""


__all__ = [
    "FusedOutput",
    "FusedSelfOutput",
    "dropout_add_layer_norm",
    "paper_dropout_add_layer_norm",
    "random_numbers",
    "runs_kernel",
    "threshold_and_scale",
]
