"""Which of SDPA's CUDA backends runs attention: the `measured_sdpa` switch.

torch's `scaled_dot_product_attention` takes the first backend of a fixed order that accepts the call. With BERT's
padding mask, which flash does not take, the fastest of cuDNN, memory-efficient and math depends on the card and the
shape. `MEASURED_ORDER` holds, per shape class, the backends fastest first as benchmarks/gpu/gpu_micro.py's
`attention` stage timed them, keeping only those whose masked output equalled math's. Until a GPU fills it, every
shape gets `DEFAULT_ORDER`. On CPU the kernel is transformers' `sdpa_attention_forward` unchanged.

"flash_varlen" runs a padded batch as one fixed-shape variable-length FlashAttention call, each row two segments (its
tokens, then its padding). It is taken for a bidirectional bf16/fp16 call whose mask puts the real tokens first; a
device-side assertion stops any other mask.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

BACKENDS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# Backends that cannot take an attention mask: never chosen for a masked call.
MASKLESS = frozenset({"flash"})
# FlashAttention as one fixed-shape variable-length call, for masked calls only.
VARLEN = "flash_varlen"
DEFAULT_ORDER: tuple[str, ...] = ("cudnn", "efficient", "math")
# Sequence lengths are grouped into classes by the smallest of these that holds them (longer: the last).
SEQ_CLASSES = (128, 256, 512)

# (head_size, sequence class, masked) -> backend names, fastest first, as
# `python benchmarks/gpu/gpu_micro.py --table RESULTS.json` prints them. Empty until a GPU measures it.
MEASURED_ORDER: dict[tuple[int, int, bool], tuple[str, ...]] = {}


def shape_class(seq_len: int, head_size: int, masked: bool) -> tuple[int, int, bool]:
    """The key of `MEASURED_ORDER` for a call: (head_size, the smallest of `SEQ_CLASSES` >= seq_len, masked)."""
    seq_class = next((s for s in SEQ_CLASSES if seq_len <= s), SEQ_CLASSES[-1])
    return head_size, seq_class, masked


def backend_order(seq_len: int, head_size: int, masked: bool, table=None) -> tuple[str, ...]:
    """The backends to try for a call of this shape: the measured order or `DEFAULT_ORDER`, less those that cannot
    take a mask when `masked`, ending with math (it accepts every call)."""
    table = MEASURED_ORDER if table is None else table
    order = table.get(shape_class(seq_len, head_size, masked), DEFAULT_ORDER)
    known = [name for name in order if name in BACKENDS or (name == VARLEN and masked)]
    kept = [name for name in known if not (masked and name in MASKLESS) and name != "math"]
    return (*kept, "math")


def measured_sdpa_attention(
    module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA kernel, on CUDA under the `backend_order` for the call's shape."""
    if not query.is_cuda:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    order = backend_order(key.shape[-2], query.shape[-1], attention_mask is not None)
    if order[0] == VARLEN and takes_varlen(module, query, attention_mask):
        lengths = key_padding_lengths(attention_mask)
        context = flash_varlen_attention(*(x.transpose(1, 2) for x in (query, key, value)), lengths, dropout, scaling)
        return context, None
    order = tuple(name for name in order if name != VARLEN)
    return sdpa_under(order, module, query, key, value, attention_mask, scaling, dropout, **kwargs)


def takes_varlen(module, query: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """A boolean 4-D mask, bidirectional, and what FlashAttention takes (bf16/fp16, head size 8k up to 256)."""
    return (
        attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.dim() == 4
        and not getattr(module, "is_causal", False)
        and query.dtype in (torch.bfloat16, torch.float16)
        and query.shape[-1] % 8 == 0
        and query.shape[-1] <= 256
    )


def key_padding_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch,) int32 real tokens per row of a boolean key-padding mask with the real tokens first; any other mask
    fails a device-side assertion."""
    lengths = attention_mask[:, 0, 0, :].sum(-1, dtype=torch.int32)
    first = torch.arange(attention_mask.shape[-1], device=attention_mask.device) < lengths[:, None]
    torch._assert_async((attention_mask == first[:, None, None, :]).all(), "flash_varlen: not a key-padding mask")
    return lengths


def sdpa_under(
    order: tuple[str, ...], module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA kernel, taking the first backend of `order` that accepts the call."""
    with sdpa_kernel([BACKENDS[name] for name in order], set_priority=True):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )


def flash_varlen_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor, dropout: float, scaling: float
) -> torch.Tensor:
    """FlashAttention over a padded (batch, seq, heads, head_size) batch as one variable-length call: row i is two
    segments, `cu_seqlens = [i*L, i*L + len_i, (i+1)*L]`. The context at padding is not to be read."""
    batch, seq = query.shape[:2]
    starts = torch.arange(batch, device=query.device, dtype=torch.int32) * seq
    bounds = torch.stack([starts, starts + lengths.to(torch.int32)], dim=1).flatten()
    cu_seqlens = torch.cat([bounds, bounds.new_full((1,), batch * seq)])
    flat = [x.reshape(batch * seq, *x.shape[2:]) for x in (query, key, value)]
    return _flash_forward(*flat, cu_seqlens, seq, dropout, scaling).view(query.shape)


def _flash_forward(query, key, value, cu_seqlens, max_seqlen: int, dropout: float, scaling: float) -> torch.Tensor:
    """aten's variable-length FlashAttention (CUDA only): (tokens, heads, head_size) in and out."""
    return torch.ops.aten._flash_attention_forward(
        query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout, False, False, scale=scaling
    )[0]


def table_from_micro(report: dict, tolerance: float = 2e-2) -> dict[tuple[int, int, bool], tuple[str, ...]]:
    """`MEASURED_ORDER` entries from gpu_micro.py's JSON: per shape, fastest first, the backends that ran and whose
    output equalled math's within `tolerance` (a backend that ignores the mask is left out)."""
    table: dict[tuple[int, int, bool], list[tuple[float, str]]] = {}
    for row in report.get("stages", {}).get("attention", {}).get("rows", []):
        name, diff = row.get("backend"), row.get("max_abs_diff_vs_math")
        if name not in (*BACKENDS, VARLEN) or row.get("error") or diff is None or diff > tolerance:
            continue
        if (row["masked"] and name in MASKLESS) or (name == VARLEN and not row["masked"]):
            continue
        key = shape_class(row["seq"], row["head_size"], row["masked"])
        table.setdefault(key, []).append((row["fwd_bwd_ms"], name))
    return {key: tuple(name for _, name in sorted(rows)) for key, rows in table.items()}


__all__ = [
    "BACKENDS",
    "DEFAULT_ORDER",
    "MEASURED_ORDER",
    "VARLEN",
    "backend_order",
    "flash_varlen_attention",
    "key_padding_lengths",
    "measured_sdpa_attention",
    "sdpa_under",
    "shape_class",
    "table_from_micro",
    "takes_varlen",
]
