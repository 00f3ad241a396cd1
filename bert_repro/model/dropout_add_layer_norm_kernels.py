"""The Triton kernels of `dropout_add_layer_norm.py`: y = LayerNorm(residual + dropout(x)), forward and backward.

A row of the hidden size N is held as an (8, M) tile, M = next_power_of_2(N) / 8, column `k * M + j` at [k, j];
a program takes R rows. One Philox draw (counter `row * M + j`) gives eight 16-bit numbers, for the columns [0..7, j].
So the numbers depend on (seed, row, column) only, and the backward draws them again: no mask is stored.
The forward also writes z = residual + dropout(x), which the backward reads. Each backward program sums the weight
and bias gradients of its share of the rows in registers and writes one partial sum. flash-attn's
`ops/triton/layer_norm.py` and Liger's `ops/layer_norm.py` are the general versions.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(first_row, rows, N, R: tl.constexpr, M: tl.constexpr):
    """(R, 1, 1) row indices from first_row, (1, 8, M) column indices, and which (R, 8, M) cells lie inside."""
    row = first_row + tl.arange(0, R)[:, None, None]
    cols = tl.arange(0, 8)[None, :, None] * M + tl.arange(0, M)[None, None, :]
    return row, cols, (row < rows) & (cols < N)


@triton.jit
def _random_16(seed, row, M: tl.constexpr):
    """(R, 8, M) int32 in [0, 65536): the 16-bit numbers of R rows ((R, 1, 1) indices), eight per Philox draw."""
    r0, r1, r2, r3 = tl.randint4x(seed, row * M + tl.arange(0, M)[None, None, :])
    k = tl.arange(0, 8)[None, :, None]
    words = tl.where(
        k < 4,
        tl.where(k < 2, tl.where(k == 0, r0, r0 >> 16), tl.where(k == 2, r1, r1 >> 16)),
        tl.where(k < 6, tl.where(k == 4, r2, r2 >> 16), tl.where(k == 6, r3, r3 >> 16)),
    )
    return (words & 0xFFFF).to(tl.int32)


@triton.jit
def _keep(seed, row, threshold, M: tl.constexpr):
    """(R, 8, M) bool: the columns that dropout keeps."""
    return _random_16(seed, row, M) >= threshold


@triton.jit
def _row_sum(t):
    """(R, 8, M) -> (R, 1, 1)."""
    return tl.sum(tl.sum(t, axis=2), axis=1)[:, None, None]


@triton.jit
def random_numbers_kernel(OUT, SEED, rows, N, R: tl.constexpr, M: tl.constexpr):
    """The 16-bit numbers (int32, rows x N) behind the keep mask: for tests."""
    row, cols, inside = _tile(tl.program_id(0) * R, rows, N, R, M)
    tl.store(OUT + row * N + cols, _random_16(tl.load(SEED), row, M), mask=inside)


@triton.jit
def forward_kernel(
    X,
    RES,
    W,
    B,
    Y,
    Z,
    MEAN,
    RSTD,
    SEED,
    rows,
    N,
    eps,
    threshold,
    scale,
    R: tl.constexpr,
    M: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
):
    row, cols, inside = _tile(tl.program_id(0) * R, rows, N, R, M)
    offsets = row.to(tl.int64) * N + cols
    x = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
    if HAS_DROPOUT:
        x = tl.where(_keep(tl.load(SEED), row, threshold, M), x * scale, 0.0)
    z = x + tl.load(RES + offsets, mask=inside, other=0.0).to(tl.float32)
    mean = _row_sum(z) / N
    centred = tl.where(inside, z - mean, 0.0)
    rstd = 1.0 / tl.sqrt(_row_sum(centred * centred) / N + eps)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(Y + offsets, (centred * rstd * w + b).to(Y.dtype.element_ty), mask=inside)
    tl.store(Z + offsets, z.to(Z.dtype.element_ty), mask=inside)
    tl.store(MEAN + row, mean, mask=row < rows)
    tl.store(RSTD + row, rstd, mask=row < rows)


@triton.jit
def backward_kernel(
    DY,
    Z,
    W,
    MEAN,
    RSTD,
    SEED,
    DX,
    DRES,
    DW,
    DB,
    rows,
    N,
    threshold,
    scale,
    R: tl.constexpr,
    M: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
):
    program = tl.program_id(0)
    cols = tl.arange(0, 8)[None, :, None] * M + tl.arange(0, M)[None, None, :]
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    dw = tl.zeros((R, 8, M), dtype=tl.float32)
    db = tl.zeros((R, 8, M), dtype=tl.float32)
    seed = tl.load(SEED)
    for block in range(0, BLOCKS_PER_PROGRAM):
        # Rows past the end read zeros and write nothing (no branch: one code path).
        row, cols, inside = _tile((program * BLOCKS_PER_PROGRAM + block) * R, rows, N, R, M)
        offsets = row.to(tl.int64) * N + cols
        dy = tl.load(DY + offsets, mask=inside, other=0.0).to(tl.float32)
        z = tl.load(Z + offsets, mask=inside, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row, mask=row < rows, other=0.0)
        rstd = tl.load(RSTD + row, mask=row < rows, other=0.0)
        xhat = tl.where(inside, (z - mean) * rstd, 0.0)
        g = dy * w
        dz = (g - xhat * (_row_sum(xhat * g) / N) - _row_sum(g) / N) * rstd
        dw += dy * xhat
        db += dy
        tl.store(DRES + offsets, dz.to(DRES.dtype.element_ty), mask=inside)
        if HAS_DROPOUT:
            dz = tl.where(_keep(seed, row, threshold, M), dz * scale, 0.0)
        tl.store(DX + offsets, dz.to(DX.dtype.element_ty), mask=inside)
    cols = tl.arange(0, 8)[:, None] * M + tl.arange(0, M)[None, :]
    tl.store(DW + program * N + cols, tl.sum(dw, axis=0), mask=cols < N)
    tl.store(DB + program * N + cols, tl.sum(db, axis=0), mask=cols < N)
