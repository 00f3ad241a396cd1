"""Crash consistency at the write points: a tiny pre-training and fine-tuning are killed (SIGKILL) at their N-th
file write or rename (tests/write_points.py) and the same command, then any resume command it names, is run again.
Each rerun ends with the run done or one line naming the file and the fix (exit 2): never a traceback, a folder that
blocks later runs, or a result that differs from an uninterrupted run's.

Every point of a recipe (~140 each) takes most of an hour; the slow tier kills at a sample drawn afresh each session
(`chosen`: every class of point, the first and last of every stage), `make test-crash` at every point. The fast tier
kills pre-training at two: the kept tokenizer.json (a kill there once left a 0-byte file every rerun died on) and the
final results.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import ROOT
from support.pretraining_runs import write_config
from support.task_files import fixture_files, write

from bert_repro.atomic import FILE_MODE

RESUME = ["--resume_from_checkpoint", "true"]
# The stages of a run, by the paths their write points write under the scenario's folder: the first pattern that
# matches names a point's stage; a point none matches (a rename or replace publishing what a stage staged) belongs to
# the stage before it. A stage ends where another begins, or where the group "instance" differs (checkpoint-2, then
# checkpoint-4). A new stage: a line here, in the order a run reaches it.
STAGES = (
    ("run folder claimed", r"^out/(run\.lock|\.run_config\.json\.partial-\d+)$"),
    ("datasets cache", r"^datasets_cache/"),
    ("kept tokenizer", r"^out/tokenizer/"),
    ("data statistics", r"^out/\.data_statistics\.json\.partial-\d+$"),
    ("checkpoint", r"/(\.saving/)?(?P<instance>checkpoint-\d+)(/|$)"),
    ("a grid run's results", r"^out/runs/[^/]+/\.[^/]+\.partial-\d+$"),
    ("final model", r"^out/\.saving/"),
    ("final tokenizer", r"^out/\.saving-tokenizer-\d+/"),
    # each stage's record (training/lifecycle.py): a kill on either side of one is a stage boundary
    ("stage record", r"^out/\.stages\.json\.partial-\d+$"),
    ("card", r"^out/(\.README\.md\.partial-\d+|\.eval_results/)"),
    ("results", r"\.partial-\d+$"),
)
# What may differ between two runs of the same training: times, speeds, the machine.
TIMING = {"train_runtime_s", "tokens_per_second", "train_seconds", "seconds", "hardware", "train_runtime_from_step"}


class Harness:
    """tests/write_points.py in a fresh interpreter (its children must not inherit pytest), fed plans one by one."""

    def __init__(self):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        command = [sys.executable, str(ROOT / "tests" / "write_points.py"), str(len(os.sched_getaffinity(0)))]
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, plan: list[dict]) -> list[list[dict]]:
        self.process.stdin.write(json.dumps(plan) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the harness ended (exit {self.process.wait()})"
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture
def harness():
    started = Harness()
    yield started
    started.close()


def scenario(root: Path, command: list[str], kill_at: int, resume: list[str] | None) -> dict:
    out = ["--output_dir", str(root / "out")]
    commands = [{"argv": command + out, "kill_at": kill_at}, {"argv": command + out}]
    if resume:  # the fix a refusal names: run it and the run must complete
        commands.append({"argv": command + out + resume, "only_if_said": " ".join(resume)})
    return {"root": str(root), "commands": commands}


def without_timing(value):
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in TIMING and not k.endswith("_per_second")}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def finished(out: Path, model: str) -> tuple[dict, dict]:
    """(results.json without times, the final weights) of a finished run."""
    results = without_timing(json.loads((out / "results.json").read_text()))
    results.pop("eval_runtime", None)
    if "test_predictions" in results:  # paths in the run's folder, which differs between scenarios
        results["test_predictions"] = [Path(p).name for p in results["test_predictions"]]
    return results, load_file(out / model / "model.safetensors")


def check(done: list[dict], reference: Path, model: str, points: int) -> None:
    killed, *reruns = done
    where = f"killed at write {killed['kill_at']} of {points} ({killed['killed_at']})"
    assert killed["returncode"] == -9, f"{where}: not killed ({killed['returncode']}): {killed['stderr'][-2000:]}"
    for rerun in reruns:
        said = f"{where}, then {' '.join(rerun['argv'][-4:])}: exit {rerun['returncode']}\n{rerun['stderr'][-3000:]}"
        assert "Traceback" not in rerun["stderr"], said
        assert rerun["returncode"] in (0, 2), said
        if rerun["returncode"] == 2:
            errors = [line for line in rerun["stderr"].splitlines() if ".py: error: " in line]
            assert len(errors) == 1, said
    assert reruns and reruns[-1]["returncode"] == 0, f"{where}: the run never completed\n{reruns[-1]['stderr'][-3000:]}"
    out = Path(reruns[-1]["argv"][reruns[-1]["argv"].index("--output_dir") + 1])
    results, weights = finished(out, model)
    expected, expected_weights = finished(reference, model)
    assert results == expected, f"{where}: results differ from an uninterrupted run's"
    assert weights.keys() == expected_weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected_weights[name]), f"{where}: {name} differs from an uninterrupted run's"
    leftovers = [str(p) for p in out.rglob("*") if ".partial-" in p.name or p.name.startswith(".saving")]
    assert not leftovers, f"{where}: {leftovers}"


def pretraining_command(tmp_path: Path, corpus_and_tokenizer) -> list[str]:
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(tmp_path / "tiny.yaml", corpus, tokenizer, max_steps=4, save_steps=2)
    return [str(ROOT / "recipes" / "pretrain.py"), "--config", str(config)]


def finetuning_command(tmp_path: Path, tiny_model: Path) -> list[str]:
    data = write(tmp_path / "MRPC", fixture_files("mrpc"))
    return [
        *(str(ROOT / "recipes" / "finetune.py"), "--task", "mrpc", "--model", str(tiny_model), "--data", str(data)),
        *("--learning_rates", "1e-4", "--seeds", "1", "2", "--max_steps", "2", "--max_seq_length", "64"),
        *("--use_cpu", "true", "--num_proc", "1", "--disable_tqdm", "true"),
    ]


def counted(harness: Harness, command: list[str], tmp_path: Path) -> tuple[Path, list[str]]:
    """The uninterrupted run (the reference) and its write points, one line each: 'N kind path'."""
    (done,) = harness.run([scenario(tmp_path / "reference", command, 0, None)])
    assert done[0]["returncode"] == 0, done[0]["stderr"][-3000:]
    return tmp_path / "reference" / "out", done[0]["points_seen"]


def check_all(report: list[list[dict]], reference: Path, model: str, points: int) -> None:
    """Every scenario checked; the failures listed together (one kill point rarely fails alone)."""
    failures = []
    for done in report:
        try:
            check(done, reference, model, points)
        except AssertionError as failure:
            failures.append(str(failure).split("\nassert")[0])
    replay = f"WRITE_POINTS_SEED={os.environ['WRITE_POINTS_SEED']} draws them again"
    assert not failures, f"{len(failures)} of {len(report)} kill points failed ({replay}):\n\n" + "\n\n".join(failures)


def chosen(points: list[str], root: Path) -> list[int]:
    """The points to kill at: every one with WRITE_POINTS=all; else the first and last of each stage (STAGES) and one
    drawn from each class (a stage's points of one kind: open, os.open, rename, replace, torch's save...), drawn
    afresh with WRITE_POINTS_SEED (tests/conftest.py draws it, or it is given, to replay a failure)."""
    if os.environ.get("WRITE_POINTS") == "all":
        return list(range(1, len(points) + 1))
    stages, stage = [], ("unnamed", None)
    for line in points:
        relative = os.path.relpath(line.split(maxsplit=2)[2], root)
        for name, pattern in STAGES:
            if match := re.search(pattern, relative):
                stage = (name, match.groupdict().get("instance"))
                break
        stages.append(stage)
    picked = {1, len(points)}.union(*({n, n + 1} for n in range(1, len(points)) if stages[n - 1] != stages[n]))
    classes = defaultdict(list)  # a stage's points of one kind
    for n, (line, stage) in enumerate(zip(points, stages), 1):
        classes[stage[0], line.split()[1].split("(")[0]].append(n)
    seed = os.environ["WRITE_POINTS_SEED"]
    rng = random.Random(int(seed))
    picked |= {rng.choice(ns) for ns in classes.values()}
    print(f"{len(picked)} of {len(points)} write points, WRITE_POINTS_SEED={seed}: {sorted(picked)}")
    return sorted(picked)


def sample(points: list[str], *needles: str) -> list[int]:
    """The first write point whose line holds each needle."""
    return [next(int(line.split()[0]) for line in points if needle in line) for needle in needles]


def test_pretraining_survives_a_kill_at_sampled_write_points(tmp_path, corpus_and_tokenizer, harness):
    command = pretraining_command(tmp_path, corpus_and_tokenizer)
    reference, points = counted(harness, command, tmp_path)
    out = tmp_path / "reference" / "out"
    # The kept tokenizer's tokenizer.json torn (the 0-byte file); the last write of all (results.json).
    chosen = sample(points, f"tokenizer.save {out / 'tokenizer'}") + [len(points)]
    plan = [scenario(tmp_path / f"kill{n}", command, n, RESUME) for n in chosen]
    check_all(harness.run(plan), reference, ".", len(points))
    # Every file with the mode the umask asks for, the weights too (safetensors creates them with mode 600).
    modes = {str(p.relative_to(reference)): oct(p.stat().st_mode & 0o777) for p in reference.rglob("*") if p.is_file()}
    assert set(modes.values()) == {oct(FILE_MODE)}, modes


def test_the_sample_holds_every_class_of_point_and_each_stages_first_and_last(tmp_path, monkeypatch):
    lines = (
        "os.open out/run.lock; open(wb) out/.run_config.json.partial-7; replace out/run_config.json; os.open "
        f"datasets_cache/g.lock; {'; '.join(f'open(wb) datasets_cache/g/tmp{i}' for i in range(8))}; rename "
        "datasets_cache/g/0.0.0; open(w) out/tokenizer/.saving-tokenizer-7/tokenizer_config.json; replace "
        "out/tokenizer/tokenizer_config.json; os.open datasets_cache/g/tmp9; save_file out/.saving/checkpoint-2/x; "
        "save out/.saving/checkpoint-2/optimizer.pt; replace out/checkpoint-2; save_file out/.saving/checkpoint-4/x; "
        "replace out/checkpoint-4; open(w) out/.saving/config.json; save_file out/.saving/model.safetensors; replace "
        "out/config.json; replace out/model.safetensors; open(wb) out/.results.json.partial-7; replace out/results.json"
    ).split("; ")
    points = [f"{n} {line.split()[0]} {tmp_path / line.split()[1]}" for n, line in enumerate(lines, 1)]
    # Stages: 1-3, 4-13, 14-15, 16, 17-19 (checkpoint-2), 20-21 (checkpoint-4), 22-25, 26-27.
    ends = {1, 3, 4, 13, 14, 15, 16, 17, 19, 20, 21, 22, 25, 26, 27}
    classes = [{1}, {2}, {3}, {4, 16}, set(range(5, 13)), {13}, {14}, {15}, {17, 20}, {18}, {19, 21}, {22}, {23}]
    classes += [{24, 25}, {26}, {27}]
    samples = []
    for seed in range(12):
        monkeypatch.setenv("WRITE_POINTS_SEED", str(seed))
        sample = set(chosen(points, tmp_path))
        assert ends <= sample and all(sample & members for members in classes), (seed, sample)
        assert all(len((sample - ends) & members) <= 1 for members in classes), (seed, sample)  # one drawn a class
        assert sample == set(chosen(points, tmp_path))  # replayable
        samples.append(sample)
    assert len({frozenset(sample) for sample in samples}) > 3  # drawn afresh with each seed
    monkeypatch.setenv("WRITE_POINTS", "all")
    assert chosen(points, tmp_path) == list(range(1, len(points) + 1))


@pytest.mark.slow
def test_pretraining_survives_a_kill_at_every_kind_of_write_point(tmp_path, corpus_and_tokenizer, harness):
    command = pretraining_command(tmp_path, corpus_and_tokenizer)
    reference, points = counted(harness, command, tmp_path)
    plan = [scenario(tmp_path / f"kill{n}", command, n, RESUME) for n in chosen(points, tmp_path / "reference")]
    check_all(harness.run(plan), reference, ".", len(points))


@pytest.mark.slow
def test_finetuning_survives_a_kill_at_every_kind_of_write_point(tmp_path, tiny_model, harness):
    command = finetuning_command(tmp_path, tiny_model)
    reference, points = counted(harness, command, tmp_path)
    plan = [scenario(tmp_path / f"kill{n}", command, n, None) for n in chosen(points, tmp_path / "reference")]
    check_all(harness.run(plan), reference, ".", len(points))


@pytest.mark.parametrize(
    "field, saved, now", [("output_dir", "/scratch/me/run", "/home/me/run"), ("log_level", "passive", "info")]
)
def test_where_a_run_lives_and_its_log_level_are_not_what_identifies_it(tmp_path, field, saved, now):
    from bert_repro.training.lifecycle import check_output_dir
    from bert_repro.training.pretraining.recipe import run_identity

    def record(learning_rate, value):
        return {"run": {"preset": "tiny"}, "training": {"learning_rate": learning_rate, field: value}}

    (tmp_path / "run_config.json").write_text(json.dumps(record(1e-3, saved)))
    (tmp_path / "checkpoint-2").mkdir()
    here = run_identity(record(1e-3, now))
    assert here["run"] == {"preset": "tiny"} and here["training"] == {"learning_rate": 1e-3}
    check_output_dir(tmp_path, here, resume=True, overwrite=False, identity=run_identity)
    with pytest.raises(FileExistsError, match=field):  # compared without the identity, the field differs
        check_output_dir(tmp_path, here, resume=True, overwrite=False)
    with pytest.raises(FileExistsError, match="learning_rate: 0.001 -> 0.0001.*keep its settings"):
        check_output_dir(tmp_path, run_identity(record(1e-4, now)), resume=True, overwrite=False, identity=run_identity)


@pytest.mark.slow
def test_a_moved_run_folder_resumes(tmp_path, corpus_and_tokenizer, harness):
    """Stopped after 2 of 4 steps, moved to another folder and resumed there: the uninterrupted run's result."""
    command = pretraining_command(tmp_path, corpus_and_tokenizer)
    reference, _ = counted(harness, command, tmp_path)
    scratch, project = tmp_path / "moved" / "scratch", tmp_path / "moved" / "project"
    plan = [
        {
            "root": str(tmp_path / "moved"),
            "commands": [
                {"argv": command + ["--output_dir", str(scratch), "--stop_after_steps", "2"]},
                {"move": [str(scratch), str(project)]},
                {"argv": command + ["--output_dir", str(project), *RESUME]},
            ],
        }
    ]
    (report,) = harness.run(plan)
    for done in report:
        assert done["returncode"] == 0 and "Traceback" not in done["stderr"], done["stderr"][-3000:]
    results, weights = finished(project, ".")
    expected, expected_weights = finished(reference, ".")
    assert results == expected
    assert all(torch.equal(weights[name], expected_weights[name]) for name in expected_weights)


@pytest.mark.slow
def test_an_overwrite_killed_as_it_moves_the_old_run_aside_leaves_one_run_or_the_other(
    tmp_path, corpus_and_tokenizer, harness
):
    """--overwrite_output_dir true over a finished run, killed at the rename that moves the old run aside and at the
    first write after it: the old run is whole in one place, and the same command then ends as an uninterrupted run."""
    command = pretraining_command(tmp_path, corpus_and_tokenizer)
    reference, _ = counted(harness, command, tmp_path)
    old, overwrite = command + ["--learning_rate", "0.001"], command + ["--overwrite_output_dir", "true"]

    def plan(root: Path, kill_at: int) -> dict:
        out = ["--output_dir", str(root / "out")]
        return {"root": str(root), "commands": [{"argv": old + out}, {"argv": overwrite + out, "kill_at": kill_at}]}

    (counting,) = harness.run([plan(tmp_path / "counting", 0)])
    points = counting[1]["points_seen"]
    (moved,) = [int(line.split()[0]) for line in points if line.split()[1] == "rename" and ".replaced-" in line]
    scenarios = [plan(tmp_path / f"kill{n}", n) for n in (moved, moved + 1)]
    for scenario in scenarios:
        scenario["commands"].append({"argv": scenario["commands"][1]["argv"]})
    for scenario, done in zip(scenarios, harness.run(scenarios)):
        check(done[1:], reference, ".", len(points))
        root = Path(scenario["root"])
        asides = [p for p in root.glob("out.replaced-*") if any(p.iterdir())]
        assert (
            len(asides) == 1
            and json.loads((asides[0] / "run_config.json").read_text())["training"]["learning_rate"] == 0.001
        )
        assert (asides[0] / "results.json").exists() and (asides[0] / "model.safetensors").exists()
