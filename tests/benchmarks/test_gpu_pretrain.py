"""benchmarks/gpu/gpu_pretrain.py on the CPU in the kit's process layout (CUDA-graph and FP8 variants each in a
process of its own): every variant's record of what ran (model, switches, compiled graphs, inductor settings) agrees
with its label, and a variant whose record disagrees is marked invalid instead of timed."""

import importlib
import json

import numpy as np
import pytest
import torch
from support import ROOT
from support.corpora import pseudo_text, wordpiece_tokenizer

from bert_repro.data import save_tokenizer

VARIANTS = "ours sparse bf16 compile,ours sparse bf16 compile cdt,ours sparse bf16 compile graphs"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the variants' own processes import this checkout
    return importlib.import_module("gpu_pretrain")


@pytest.fixture
def examples(tmp_path):
    """examples_128.npz and tokenizer/ as `gpu_pretrain.py --export` writes them, from the fixture corpus."""
    tokenizer = wordpiece_tokenizer(pseudo_text(30), 120)
    save_tokenizer(tokenizer, tmp_path / "tokenizer")
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 30, 12)
    cls, sep = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    ids = [np.r_[cls, rng.integers(5, len(tokenizer), n - 2), sep] for n in lengths]
    positions = [np.sort(rng.choice(np.arange(1, n - 1), 3, replace=False)) for n in lengths]
    np.savez_compressed(
        tmp_path / "examples_128.npz",
        input_ids=np.concatenate(ids).astype(np.int16),
        token_type_ids=np.zeros(int(lengths.sum()), np.int8),
        lengths=lengths.astype(np.int32),
        masked_lm_positions=np.concatenate(positions).astype(np.int16),
        masked_lm_ids=rng.integers(5, len(tokenizer), 3 * len(lengths)).astype(np.int16),
        masked_counts=np.full(len(lengths), 3, np.int32),
        next_sentence_label=rng.integers(0, 2, len(lengths)).astype(np.int8),
        vocab_size=np.asarray(len(tokenizer)),
    )
    return tmp_path


def run(bench, examples, variants: str) -> dict:
    out = examples / "bench.json"
    bench.main(
        ["--examples", str(examples), "--settings", "tiny:128", "--variants", variants, "--device", "cpu"]
        + ["--batch_128", "2", "--steps", "1", "--warmup", "1", "--rounds", "1", "--peak", "1"]
        + ["--compile_backend", "aot_eager", "--out", str(out)]
    )
    return json.loads(out.read_text())["settings"][0]["results"]


@pytest.mark.slow  # ~50 s on a busy 2-core machine: three compilations and a process importing torch
def test_every_variant_runs_what_its_label_says(bench, examples):
    """dynamo's recompile limit at 1: two compiled variants in one process pass it only if each compiles
    afresh; the cdt variant's graph is compiled under its own inductor setting, not reused from today's best's."""
    import os

    with torch._dynamo.config.patch(recompile_limit=1):
        results = run(bench, examples, VARIANTS)
    assert list(results) == VARIANTS.split(",")
    for name, result in results.items():
        assert "error" not in result, (name, result)
        ran = result["ran"]
        assert bench.disagreements(bench.claims(name, "cpu"), ran) == [], name
        assert ran["graphs_compiled"] >= 1 and ran["frames_failed"] == 0, name
    processes = {name: r["ran"]["process"] for name, r in results.items()}
    assert processes["ours sparse bf16 compile"] == processes["ours sparse bf16 compile cdt"] == os.getpid()
    assert processes["ours sparse bf16 compile graphs"] != os.getpid()  # a CUDA-graph variant: its own process
    assert results["ours sparse bf16 compile cdt"]["ran"]["inductor"]["coordinate_descent_tuning"] is True
    assert results["ours sparse bf16 compile"]["ran"]["inductor"]["coordinate_descent_tuning"] is False


def test_a_variant_that_reuses_an_earlier_graph_is_invalid_not_timed(bench, examples, monkeypatch):
    """Without a fresh compilation per variant (one dynamo cache for the list) the cdt variant runs the previous
    variant's cached graph: its record shows no graph compiled under its setting, so it is invalid, not timed."""
    torch._dynamo.reset()  # nothing compiled by an earlier test
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    results = run(bench, examples, "ours sparse bf16 compile,ours sparse bf16 compile cdt")
    assert "tokens_per_second" in results["ours sparse bf16 compile"]
    cdt = results["ours sparse bf16 compile cdt"]
    assert "tokens_per_second" not in cdt and cdt["error"].startswith("invalid: labelled compiled: 0 graphs")


def test_disagreements_name_each_lie(bench):
    claimed = bench.claims("ours all fp8 compile graphs", "cuda")
    assert claimed["cuda_graph"] and claimed["fp8"] and claimed["fused_qkv"] and claimed["sparse_prediction"]
    ran = {**claimed, "graphs_compiled": 9, "frames_failed": 1, "graphs_compiled_while_timed": 0, "fp8": False}
    found = bench.disagreements(claimed, ran)
    assert found[0].startswith("labelled compiled: 9 graphs compiled, 1 frames failed") and len(found) == 2
    assert "fp8: label says True, ran False" in found
    eager = bench.claims("transformers sdpa bf16", "cuda")
    assert bench.disagreements(eager, {**eager, "graphs_compiled": 1}) == ["labelled eager: 1 graphs compiled"]
