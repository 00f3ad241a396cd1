"""Microbenchmarks of the step's parts on a CUDA GPU (issue 41): one stage per part, JSON after every stage.

Stages (`STAGES`, name -> function; `--stages` picks them, in the order given):
- `attention`: forward + backward of BERT-BASE's attention (256 x 12 heads x 128 tokens x 64, bf16, dropout 0.1) for
  each SDPA backend (cuDNN, flash, memory-efficient, math) forced with `sdpa_kernel`, with and without the key-padding
  mask, torch's own pick (`default`), and FlashAttention through a fixed-shape variable-length call
  (`attention_backend.flash_varlen_attention`, the table's `flash_varlen`). Each row also says whether the backend
  computes the paper's attention: its output without dropout against math's in fp32 at the real tokens
  (`max_abs_diff_vs_math`: a backend that ignored the mask would differ), and whether dropout changed the output
  (`dropout_applied`). A backend that cannot run the call is a row with its `error`. `--table` turns these rows
  into `attention_backend.MEASURED_ORDER` entries.
- `layer_norm`: dropout + residual add + LayerNorm, forward + backward, at BERT-BASE's 32,768 x 768: the compiled
  reference against our Triton kernels (`dropout_add_layer_norm`, the `fused_dropout_add_norm` switch), float32 and
  bf16 residual, dropout 0.1 and 0, with the bandwidth each reaches on the fused kernels' bytes.
- `fp8`: forward + backward of BERT-BASE's four linear shapes at 32,768 tokens (768 -> 2304 fused Q/K/V or 768 -> 768
  each, 768 -> 768, 768 -> 3072, 3072 -> 768): bf16 autocast (fp32 weights, as the training step) against torchao's
  float8 training (`convert_to_float8_training`, dynamic tensorwise scaling), both `torch.compile`d on CUDA. Without
  torchao (the GPU image has none: carry its wheel) the stage says so.

`--device cpu` runs every stage at tiny sizes as a smoke test (torchao's float8 emulated): no figure from it means
anything, it proves the code and the JSON. Figures go to benchmarks/results/ and benchmarks/LOG.md, not here.

    python benchmarks/gpu/gpu_micro.py --out $OUT/micro.json                         # on the GPU, every stage
    python benchmarks/gpu/gpu_micro.py --device cpu --out /tmp/micro.json            # here: the smoke test
    python benchmarks/gpu/gpu_micro.py --table $OUT/micro.json                       # MEASURED_ORDER's entries
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common.py, shared with the CPU benchmarks

import torch
import torch.nn.functional as F
from common import machine
from torch.nn.attention import sdpa_kernel

from bert_repro.model import BACKENDS, flash_varlen_attention, table_from_micro

# Sizes per device: BERT-BASE's on CUDA; tiny on CPU (a smoke test of the code, seconds).
ATTENTION_SHAPE = {
    "cuda": dict(batch=256, heads=12, seq=128, head_size=64),
    "cpu": dict(batch=4, heads=2, seq=16, head_size=8),
}
# (name, in_features, out_features) of BERT-BASE's linears ("square": query, key and value unfused, and the attention
# output), and the tokens of a 256 x 128 batch.
LINEAR_SHAPES = {
    "cuda": [("qkv", 768, 2304), ("square", 768, 768), ("ffn_in", 768, 3072), ("ffn_out", 3072, 768)],
    "cpu": [("qkv", 64, 192), ("square", 64, 64), ("ffn_in", 64, 256), ("ffn_out", 256, 64)],
}
LINEAR_TOKENS = {"cuda": 32768, "cpu": 128}
DROPOUT = 0.1


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object], device: str, warmup: int, iters: int) -> float:
    """Median milliseconds of `fn()` over `iters` calls in 5 rounds, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        rounds.append((time.perf_counter() - start) * 1e3 / iters)
    return sorted(rounds)[len(rounds) // 2]


def timed(row: dict, step: Callable[[], object], args, label: str, rates: Callable[[float], dict]) -> dict:
    """`row` with `step`'s forward + backward milliseconds and the `rates` of that time, or the error that stopped it
    (a row that already holds an error is not run); one line printed."""
    if "error" not in row:
        try:
            ms = time_ms(step, args.device, args.warmup, args.iters)
            row.update(fwd_bwd_ms=ms, **rates(ms))
        except Exception as error:
            row["error"] = error_text(error)
    print(f"{label}: " + (f"{row['fwd_bwd_ms']:.3f} ms" if "fwd_bwd_ms" in row else row["error"]), flush=True)
    return row


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:500]


# --- attention ---------------------------------------------------------------------------------------------------


def attention_inputs(device: str, batch: int, heads: int, seq: int, head_size: int):
    """q, k, v as (batch, seq, heads, head_size) bf16 leaves (the layout the model's projections give); each row's
    real length (a quarter of the rows full, the
    rest between a quarter and all of `seq`, real tokens first); the (batch, 1, seq, seq) boolean mask the model's
    SDPA path gets (True = attend)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, seq, heads, head_size, generator=generator) for _ in range(3))
    lengths = torch.randint(max(1, seq // 4), seq + 1, (batch,), generator=generator)
    lengths[: batch // 4] = seq
    real = torch.arange(seq)[None, :] < lengths[:, None]
    mask = real[:, None, None, :].expand(batch, 1, seq, seq)
    to = dict(device=device, dtype=torch.bfloat16)
    return [x.to(**to).requires_grad_() for x in (q, k, v)], lengths.to(device), real.to(device), mask.to(device)


def sdpa_call(backend: str | None, mask):
    """attention(q, k, v, dropout) through SDPA under one backend (None: torch's own pick); (batch, seq, heads,
    head_size) in and out, transposed views as the model passes them."""

    def call(q, k, v, dropout):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout).transpose(1, 2)
        with sdpa_kernel([BACKENDS[backend]]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout).transpose(1, 2)

    return call


def varlen_call(lengths):
    def call(q, k, v, dropout):
        return flash_varlen_attention(q, k, v, lengths, dropout, q.shape[-1] ** -0.5)

    return call


def attention_stage(args) -> dict:
    shape = ATTENTION_SHAPE[args.device]
    (q, k, v), lengths, real, mask = attention_inputs(args.device, **shape)
    full = torch.full_like(lengths, shape["seq"])
    # The check of what a backend computes, without dropout: values far out at the padded keys, so that a backend
    # giving them any weight differs from the reference by far more than bf16's rounding; the reference is math in
    # fp32. Compared at real query positions (varlen's padding rows attend to padding only, by design, and no layer
    # reads them).
    with torch.no_grad():
        v_check = v.detach().masked_fill(~real[:, :, None, None], 100.0)
    with sdpa_kernel([BACKENDS["math"]]), torch.no_grad():
        reference = {
            masked: F.scaled_dot_product_attention(
                *(x.float().transpose(1, 2) for x in (q, k, v_check if masked else v)),
                attn_mask=mask if masked else None,
            ).transpose(1, 2)
            for masked in (False, True)
        }
    cases = [
        (name, masked, sdpa_call(name, mask if masked else None))
        for name in (*BACKENDS, None)
        for masked in (False, True)
    ]
    cases += [("flash_varlen", masked, varlen_call(lengths if masked else full)) for masked in (False, True)]
    rows = []
    grad = torch.randn_like(q)
    for name, masked, call in cases:
        row = dict(backend=name or "default", masked=masked, **shape, dtype="bfloat16", dropout=DROPOUT)
        try:
            with torch.no_grad():
                plain = call(q, k, v_check if masked else v, 0.0)
                rows_read = real if masked else torch.ones_like(real)
                diff = (plain.float() - reference[masked])[rows_read].abs().max()
                row["max_abs_diff_vs_math"] = float(diff)
                row["dropout_applied"] = bool((call(q, k, v_check if masked else v, DROPOUT) != plain).any())

            def step():
                call(q, k, v, DROPOUT).backward(grad)

            row["fwd_bwd_ms"] = time_ms(step, args.device, args.warmup, args.iters)
            q.grad = k.grad = v.grad = None
        except Exception as error:  # a backend that cannot run the call is a result, not a crash
            row["error"] = error_text(error)
        rows.append(row)
        timed = f"{row.get('fwd_bwd_ms', 0):8.3f} ms  diff {row.get('max_abs_diff_vs_math', 0):.2e}"
        print(f"attention {row['backend']:13s} masked={masked!s:5s} {row.get('error', timed)}", flush=True)
    return {"rows": rows}


# --- fp8 ---------------------------------------------------------------------------------------------------------


def fp8_stage(args) -> dict:
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as error:
        return {"skipped": f"torchao is not installed ({error_text(error)}): no float8 rows", "rows": []}
    tokens, rows = LINEAR_TOKENS[args.device], []
    # On CPU torchao emulates the float8 matrix product (the smoke test); on CUDA it runs it (compute capability 8.9+).
    config = Float8LinearConfig(emulate=args.device != "cuda")
    compiled = args.device == "cuda"
    for name, n_in, n_out in LINEAR_SHAPES[args.device]:
        torch.manual_seed(0)
        x = torch.randn(tokens, n_in, device=args.device, requires_grad=True)
        grad = torch.randn(tokens, n_out, device=args.device, dtype=torch.bfloat16)
        base = torch.nn.Sequential(torch.nn.Linear(n_in, n_out)).to(args.device)
        for precision in ("bf16", "fp8"):
            row = dict(linear=name, in_features=n_in, out_features=n_out, tokens=tokens, precision=precision)
            try:
                module = base
                if precision == "fp8":
                    module = convert_to_float8_training(
                        torch.nn.Sequential(torch.nn.Linear(n_in, n_out)).to(args.device), config=config
                    )
                    module.load_state_dict(base.state_dict())
                forward = torch.compile(module) if compiled else module

                def step(forward=forward):
                    with torch.autocast(args.device, dtype=torch.bfloat16):
                        out = forward(x)
                    out.backward(grad)

                row["compiled"] = compiled
            except Exception as error:  # the conversion or compilation failed: the row says why, nothing is timed
                row["error"], step = error_text(error), None
            flops = 6 * tokens * n_in * n_out
            rows.append(timed(row, step, args, f"fp8 {name:17s} {precision}", lambda ms: {"tflops": flops / ms / 1e9}))
    return {"rows": rows, "emulated": config.emulate}


# --- layer_norm --------------------------------------------------------------------------------------------------


def layer_norm_stage(args) -> dict:
    """LayerNorm(residual + dropout(x)) forward + backward at BERT-BASE's 32,768 x 768 (x bf16 as the dense layer
    gives it, the residual float32 as autocast keeps it): the compiled reference (what inductor makes of the paper's
    ops) against our kernels (`dropout_add_layer_norm`), float32 and bf16 residual, dropout 0.1 and 0; the byte
    floor is what the fused forward and backward must read and write at the card's bandwidth."""
    from bert_repro.model import fused_dropout_add_layer_norm as dropout_add_layer_norm
    from bert_repro.model import paper_dropout_add_layer_norm

    tokens, width = LINEAR_TOKENS[args.device], LINEAR_SHAPES[args.device][1][1]
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(width, eps=1e-12).to(args.device)
    reference = torch.compile(paper_dropout_add_layer_norm) if args.device == "cuda" else paper_dropout_add_layer_norm
    rows = []
    for residual_dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(tokens, width, device=args.device, dtype=torch.bfloat16, requires_grad=True)
        residual = torch.randn(tokens, width, device=args.device, dtype=residual_dtype, requires_grad=True)
        grad = torch.randn(tokens, width, device=args.device, dtype=residual_dtype)
        # bytes: forward reads x and the residual, writes y and the saved sum; backward reads dy and the sum,
        # writes dx and the residual's gradient (the weight's few bytes left out)
        r, b = residual.element_size(), x.element_size()
        floor_bytes = tokens * width * (b + r + 2 * r + 2 * r + b + r)
        for p in (0.1, 0.0):
            for name, fn in (
                ("compiled reference", lambda: reference(x, residual, norm, p)),
                ("ours", lambda: dropout_add_layer_norm(x, residual, norm, p, True, out_dtype=residual_dtype)),
            ):
                row = dict(kernel=name, residual=str(residual_dtype).removeprefix("torch."), p=p, tokens=tokens)
                row["floor_bytes"] = floor_bytes
                label = f"layer_norm {name:18s} residual {row['residual']:8s} p={p}"
                rows.append(
                    timed(
                        row,
                        lambda fn=fn: fn().backward(grad),
                        args,
                        label,
                        lambda ms: {"gb_per_s": floor_bytes / ms / 1e6},
                    )
                )
    return {"rows": rows}


# The stages, in their default order: name -> function(args) -> a JSON-able dict (rows, and anything else to keep).
# The runner writes the JSON after each.
STAGES: dict[str, Callable[[argparse.Namespace], dict]] = {
    "layer_norm": layer_norm_stage,
    "attention": attention_stage,
    "fp8": fp8_stage,
}


def run(args) -> dict:
    report = {"machine": machine(), "device": args.device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.device == "cuda":
        report["card"] = torch.cuda.get_device_name()
        report["cuda"] = torch.version.cuda
    report["stages"] = {}
    for name in args.stages.split(","):
        name = name.strip()
        start = time.perf_counter()
        try:
            result = STAGES[name](args)
        except Exception as error:  # one stage failing keeps the others' figures
            traceback.print_exc()
            result = {"error": error_text(error)}
        result["seconds"] = time.perf_counter() - start
        report["stages"][name] = result
        if args.out:  # after every stage: a run cut short still returns what finished
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--stages", default=",".join(STAGES), help=f"Comma-separated, in order: {', '.join(STAGES)}.")
    parser.add_argument("--out", default="", help="JSON file, rewritten after every stage.")
    parser.add_argument("--warmup", type=int, default=None, help="Calls before timing (default 5 on CUDA, 1 on CPU).")
    parser.add_argument("--iters", type=int, default=None, help="Calls per timed round (default 20 on CUDA, 2 on CPU).")
    parser.add_argument("--table", default="", help="Print attention_backend.MEASURED_ORDER entries from this JSON.")
    args = parser.parse_args(argv)
    if args.table:
        for key, order in table_from_micro(json.loads(Path(args.table).read_text())).items():
            print(f"    {key!r}: {order!r},")
        return
    unknown = [s for s in args.stages.split(",") if s.strip() not in STAGES]
    if unknown:
        parser.error(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    cuda = args.device == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    args.iters = args.iters if args.iters is not None else (20 if cuda else 2)
    print(machine(), flush=True)
    run(args)


if __name__ == "__main__":
    main()
