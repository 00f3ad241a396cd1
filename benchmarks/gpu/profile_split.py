"""Where a compiled pre-training step's time goes on the GPU, from the GPU kit's `profile` part: every kernel of
torch.profiler's table (benchmarks/gpu/gpu_pretrain.py --profile writes them as JSON) sorted into kinds, in ms a
step, beside the step's wall time and the floors its work allows.

    python benchmarks/gpu/profile_split.py RESULTS   # RESULTS: profile_base_128.json and profile/*.json of a run

Kinds, by kernel name: GEMM (cuBLAS/cuBLASLt/CUTLASS matrix products and their split-K reductions), attention
(cuDNN / flash SDPA kernels), LayerNorm + dropout + residual (inductor's fused kernels that hold a layer norm or a
dropout), GELU, MLM + NSP loss (log-softmax and NLL), optimizer (fused AdamW), other (casts, sums, fills).
Idle = wall time - every kernel's time: launch gaps and host synchronisation.
Floors: GEMM and attention FLOPs (the useful FLOPs of gpu_pretrain.py: encoder at real tokens, MLM decoder at
the masked positions only) at the matmul peak measured in the same run and at the data sheet's; the elementwise
bytes at the data sheet's memory bandwidth, counting for each layer and token the fewest bf16 vectors a fused
kernel must read or write: two LayerNorm blocks of width hidden (forward reads 2 and writes 1, backward reads 2
and writes 2: 14) and GELU at the intermediate width (forward 1 + 1, backward 2 + 1: 5).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from gpu_session import SPEC_BF16_PEAK

from bert_repro import PRESETS

# Memory bandwidth from the cards' data sheets (TB/s), by a part of the device's name (the most specific first)
SPEC_BANDWIDTH = {"H100 PCIe": 2.0, "H100 NVL": 3.9, "H200": 4.8, "H100": 3.35, "A100": 2.0}
KINDS = [  # (kind, pattern on the kernel's name): the first that matches
    ("attention", r"sdpa|flash|fmha|attention|cudnn|philox"),
    ("GEMM", r"nvjet|gemm|cutlass|cublas|splitKreduce|xmma"),
    ("MLM + NSP loss", r"triton.*(log_softmax|nll_loss)"),
    ("LayerNorm + dropout + residual", r"triton.*(layer_norm|dropout)"),
    ("GELU", r"triton.*gelu"),
    ("optimizer", r"multi_tensor_apply|adam"),
    ("other", r""),
]
# annotations the profiler also places on the GPU's timeline: spans over kernels already counted
ANNOTATION = re.compile(r"#|^## |Torch-Compiled Region|^CompiledFunction|^ProfilerStep")


def kind_of(name: str) -> str:
    return next(kind for kind, pattern in KINDS if re.search(pattern, name, re.IGNORECASE))


def split(profile: dict) -> dict[str, float]:
    """ms a step by kind, from one variant's profile JSON."""
    per_step = {kind: 0.0 for kind, _ in KINDS}
    for event in profile["events"]:
        if event["device_type"] == "CUDA" and not ANNOTATION.search(event["name"]):
            per_step[kind_of(event["name"])] += event["self_device_us"] / 1000 / profile["steps"]
    return per_step


def floors(setting: dict, device: str, measured_tflops: float) -> dict[str, str]:
    """The least time a step's GEMMs, attention and elementwise bytes can take on this card."""
    sizes = PRESETS[setting["preset"]]
    layers, hidden, ffn = sizes["num_hidden_layers"], sizes["hidden_size"], sizes["intermediate_size"]
    batch, length = setting["batch_size"], setting["max_seq_length"]
    result = next(r for r in setting["results"].values() if "real_tokens" in r)  # not a failed or invalid one
    steps = result["real_tokens"] / (batch * length * (1 - setting["padding_share"]))
    tokens = result["real_tokens"] / steps
    attention = 3 * layers * 4 * hidden * batch * length**2  # every example at full length: an upper bound
    gemm = setting["useful_flops_per_real_token"] * tokens - attention
    sheet = next((v for k, v in SPEC_BF16_PEAK.items() if k in device), None)
    bandwidth = next((v for k, v in SPEC_BANDWIDTH.items() if k in device), None)
    elementwise = layers * (14 * hidden + 5 * ffn) * batch * length * 2  # bytes

    def at(flops: float) -> str:
        ms = [f"{1000 * flops / (t * 1e12):.1f}" for t in (measured_tflops, sheet) if t]
        return " / ".join(ms)

    return {
        "GEMM": at(gemm),
        "attention": at(attention),
        "elementwise": f"{1000 * elementwise / (bandwidth * 1e12):.1f}" if bandwidth else "-",
        "tokens": tokens,
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="A run's RESULTS: profile_base_128.json and profile/.")
    parser.add_argument("--out", type=Path, help="Also write the split as JSON here.")
    parser.add_argument(
        "--peak_tflops", type=float, help="The measured bf16 matmul peak for the floors (default: the run's own)."
    )
    args = parser.parse_args()
    run = json.loads((args.results / "profile_base_128.json").read_text())
    device = run["machine"].split(";")[0]
    setting = run["settings"][0]
    prefix = f"{setting['preset']}_{setting['max_seq_length']}_"
    floor = floors(setting, device, args.peak_tflops or run["bf16_matmul_peak_tflops"])
    columns, report = [], {}
    for variant, result in setting["results"].items():
        path = args.results / "profile" / f"{prefix}{variant.replace(' ', '_')}.json"
        if not path.is_file() or "seconds" not in result:
            continue
        per_step = split(json.loads(path.read_text()))
        wall = 1000 * result["seconds"] / floor["steps"]
        per_step["idle (launch gaps, host waits)"] = wall - sum(per_step.values())
        per_step["wall time"] = wall
        report[variant] = {k: round(v, 2) for k, v in per_step.items()}
        columns.append(variant)
    rows = [kind for kind, _ in KINDS] + ["idle (launch gaps, host waits)", "wall time"]
    floor_of = {"GEMM": floor["GEMM"], "attention": floor["attention"]}
    floor_of["LayerNorm + dropout + residual"] = floor_of["GELU"] = f"{floor['elementwise']} (both)"
    print(f"{device}, {setting['preset']} at {setting['max_seq_length']}, batch {setting['batch_size']}: ms a step")
    print()
    print("| kind | " + " | ".join(columns) + " | floor (measured peak / data sheet) |")
    print("|---|" + "---|" * (len(columns) + 1))
    for row in rows:
        cells = [f"{report[c][row]:.1f}" for c in columns]
        print(f"| {row} | " + " | ".join(cells) + f" | {floor_of.get(row, '')} |")
    if args.out:
        args.out.write_text(json.dumps({"device": device, "date": run.get("date"), "setting": setting,
                                        "peak_tflops": args.peak_tflops or run["bf16_matmul_peak_tflops"],
                                        "split_ms": report, "floors_ms": floor}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
