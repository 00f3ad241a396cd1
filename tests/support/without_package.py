"""Loading in a process where bert_repro cannot be imported: the child process, its plan, and the comparison of
its outputs with ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from support.models import padded_batch

TOLERANCE = 1e-5
SENTENCES = ["the cat sat on the mat", "a big red dog ran under the old house", "the queen"]
MASKED = "the cat sat on the [MASK]"

# The child process: a machine where bert_repro was never installed. It runs a plan of loads and records what it got.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.modules["bert_repro"] = None  # `import bert_repro` fails from here on
    import torch, transformers
    try:
        import bert_repro  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("bert_repro is importable in the child process")
    plan = json.load(open(sys.argv[1]))
    results = {"models": {}, "tokenizers": {}, "fill_mask": {}, "sentence_transformers": {}}
    for key, job in plan.get("models", {}).items():
        auto = getattr(transformers, job["auto"])
        try:
            model = auto.from_pretrained(job["dir"], **job.get("kwargs", {})).eval()
        except Exception as err:  # recorded: some loads are expected to be refused
            results["models"][key] = {"error": f"{type(err).__name__}: {err}"}
            continue
        inputs = torch.load(job["inputs"], weights_only=True)
        with torch.no_grad():
            output = model(**inputs)
            encoder = model.base_model(**torch.load(job["encoder_inputs"], weights_only=True))[0]
        results["models"][key] = {"class": type(model).__name__, "module": type(model).__module__,
                        "config_class": type(model.config).__name__, "encoder": encoder,
                        "outputs": {k: v for k, v in output.items() if torch.is_tensor(v)}}
    for key, directory in plan.get("tokenizers", {}).items():
        start = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        seconds = time.perf_counter() - start
        results["tokenizers"][key] = {"class": type(tokenizer).__name__, "seconds": seconds,
                        "ids": tokenizer(plan["sentences"])["input_ids"]}
    for key, directory in plan.get("fill_mask", {}).items():
        fill = transformers.pipeline("fill-mask", model=directory, device="cpu")
        results["fill_mask"][key] = [(r["token"], r["score"]) for r in fill(plan["masked"], top_k=3)]
    for key, directory in plan.get("sentence_transformers", {}).items():
        from sentence_transformers import SentenceTransformer

        encoder = SentenceTransformer(directory, device="cpu")
        results["sentence_transformers"][key] = encoder.encode(plan["sentences"], convert_to_tensor=True).cpu()
    torch.save(results, sys.argv[2])
    """
)


def run_without_package(tmp_path: Path, plan: dict, *, refusals: bool = False) -> dict:
    """Run `plan` in a fresh interpreter where bert_repro cannot be imported, with stdin closed (a prompt for
    remote code would read end-of-file and fail, not wait), outside the source tree, offline. Unless `refusals`
    (the plan holds loads that must be refused), nothing may ask whether to run remote code."""
    work = tmp_path / f"child-{len(list(tmp_path.glob('child-*')))}"
    work.mkdir()
    (work / "plan.json").write_text(json.dumps({"sentences": SENTENCES, "masked": MASKED, **plan}))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(work / "modules"), TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-c", CHILD, str(work / "plan.json"), str(work / "out.pt")]
    result = subprocess.run(
        command, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    if not refusals:
        assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    return torch.load(work / "out.pt", weights_only=False)


def inputs_for(auto_name: str, vocab_size: int, path: Path) -> str:
    batch = padded_batch(vocab_size, batch=4, seq=12)
    if auto_name == "AutoModelForMultipleChoice":
        batch = {k: v.reshape(2, 2, -1) for k, v in batch.items()}
    torch.save(batch, path)
    return str(path)


def our_outputs(model, inputs_file: str) -> dict:
    with torch.no_grad():
        output = model.eval()(**torch.load(inputs_file, weights_only=True))
    return {k: v for k, v in output.items() if torch.is_tensor(v)}


def assert_same_outputs(got: dict, ours: dict, what: str) -> None:
    """Every output both models return agrees within the tolerance (logits, hidden states, pooled output)."""
    shared = set(got) & set(ours)
    assert shared, (what, sorted(got), sorted(ours))
    for name in sorted(shared):
        diff = (got[name] - ours[name]).abs().max().item()
        assert diff <= TOLERANCE, f"{what}: {name} differs by {diff:.3e}"
