"""A run is what it read (bert_repro/training/lifecycle.py): its identity is the content of its inputs, not how their
paths are spelled; its stages are recorded as they complete, so the same command completes what is missing (the push
too), never repeats what is done, and ends as an uninterrupted run would; a refusal changes nothing."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.task_files import finetune_args, tsv, write

from bert_repro.hub.push import HubPushError
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning
from bert_repro.training.lifecycle import (
    _HELD,
    RunFinished,
    check_output_dir,
    fingerprints,
    lock_output_dir,
    move_aside,
)

# Eight training rows at batch 2: four steps an epoch, so checkpoint-2 (the last, --max_steps 2) is mid-epoch, where
# Trainer, resumed from it, would take a third step.
SST2 = {
    "train.tsv": tsv(["sentence", "label"], [["hide new secretions", 1], ["a charming journey", 0]] * 4),
    "dev.tsv": tsv(["sentence", "label"], [["unflinchingly bleak", 1], ["bleak", 0], ["new", 0]]),
}
RUN = "lr0.0001_seed42"


def argv(data, model, out, *extra):
    small = dict(learning_rate="1e-4", per_device_train_batch_size=2, max_seq_length=32, logging_steps=1)
    return finetune_args("sst2", model, data, out, "--max_steps", "2", "--save_steps", "2", *extra, **small)


def finetune(*args, **kwargs):
    return run_finetuning(FineTuningRecipe.from_args(argv(*args, **kwargs)))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model):
    """(data, model, output directory) of an uninterrupted fine-tune. Tests copy what they change."""
    root = tmp_path_factory.mktemp("lifecycle")
    data, model = write(root / "data", SST2), root / "model"
    shutil.copytree(tiny_model, model)
    finetune(data, model, root / "out")
    return data, model, root / "out"


def copied(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / folder.name)


def test_a_kill_after_the_final_checkpoint_ends_as_an_uninterrupted_run(finished, tmp_path):
    data, model, done = finished
    out = copied(done, tmp_path)
    # What a kill right after checkpoint-2 leaves: the record and the run's checkpoint, nothing after it.
    for path in [*out.iterdir(), *(out / "runs" / RUN).iterdir()]:
        if path.name not in ("run_config.json", "runs", "checkpoint-2"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    summary = finetune(data, model, out)
    assert summary["best"]["steps"] == 2
    assert {k: v for k, v in summary["best"].items() if k != "train_seconds"} == {
        k: v for k, v in json.loads((done / "results.json").read_text())["best"].items() if k != "train_seconds"
    }
    before, now = load_file(done / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == now.keys() and all(torch.equal(before[k], now[k]) for k in before)


def test_the_same_content_elsewhere_or_otherwise_spelled_is_the_same_run(finished, tmp_path):
    data, model, done = finished
    out, data_copy, model_copy = (copied(folder, tmp_path) for folder in (done, data, model))
    with pytest.raises(RunFinished):
        finetune(f"{data_copy}/", f"{model_copy}/", out, "--per_device_eval_batch_size", "3")


@pytest.mark.parametrize("changed", ["model", "data"])
def test_an_input_changed_in_place_is_another_run_and_nothing_is_altered(finished, tmp_path, changed):
    data, model, done = finished
    out, data, model = (copied(folder, tmp_path) for folder in (done, data, model))
    if changed == "model":  # other weights under the same name (re-pre-trained, or copied over)
        weights = load_file(model / "model.safetensors")
        moved = {k: v + 0.01 if v.is_floating_point() else v for k, v in weights.items()}
        save_file(moved, model / "model.safetensors")
    else:  # a dev label edited
        (data / "dev.tsv").write_text((data / "dev.tsv").read_text().replace("bleak\t0", "bleak\t1"))
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(
        FileExistsError, match=rf"holds a different run \(--{changed}: other content than this run read"
    ):
        finetune(data, model, out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files


def test_a_push_that_did_not_happen_is_done_by_the_same_command_once(finished, tmp_path, local_hub, monkeypatch):
    data, model, done = finished
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    out = copied(done, tmp_path)
    push = ("--push_to_hub", "true", "--hub_model_id", "someone/tiny-sst2")
    with local_hub.patch_client(tmp_path / "hf"):
        local_hub.fail_next(kind="commit", mode="403", times=1)
        with pytest.raises(HubPushError):
            finetune(data, model, out, *push)
        summary = finetune(data, model, out, *push)  # trained, recorded and carded: only the push is left
        assert summary["best"]["steps"] == 2 and "pushed" in summary
        assert "model.safetensors" in local_hub.repo_files("someone/tiny-sst2")
        with pytest.raises(RunFinished):
            finetune(data, model, out, *push)
    assert json.loads((out / "stages.json").read_text())["push"]["repo_id"] == "someone/tiny-sst2"


def test_fingerprints_are_cached_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("BERT_REPRO_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "results.json").write_text("{}")  # not what a model is loaded from
    first = fingerprints({"model": str(folder)})["model"]
    assert fingerprints({"model": f"{folder}/"})["model"] == first
    (folder / "results.json").write_text('{"other": 1}')
    assert fingerprints({"model": str(folder)})["model"] == first
    (folder / "config.json").write_text('{"a": 1}')
    assert fingerprints({"model": str(folder)})["model"] != first
    cached = json.loads((tmp_path / "cache" / "fingerprints.json").read_text())
    assert [entry[:2] for entry in cached.values()] == [[8, os.stat(folder / "config.json").st_mtime_ns]]
    assert fingerprints({"model": "someone/bert"})["model"] == "hub:someone/bert@unresolved"


def test_an_unset_max_steps_is_not_raised(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps({"training": {"max_steps": -1}}))
    with pytest.raises(FileExistsError, match=r"training.max_steps: -1 -> 2"):
        check_output_dir(
            out, {"training": {"max_steps": 2}}, resume=True, overwrite=False, may_grow=["training.max_steps"]
        )


def test_overwrite_moves_aside_only_a_run_and_through_a_symlink(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text("print()")
    lock_output_dir(src)
    try:
        with pytest.raises(ConfigurationError, match=r"src holds files but no bert_repro run"):
            move_aside(src)
        (src / "run_config.json").write_text("{}")
        monkeypatch.chdir(src)
        with pytest.raises(ConfigurationError, match=r"is the working directory or holds it"):
            move_aside(src)
        monkeypatch.chdir(tmp_path)
    finally:
        os.close(_HELD.pop(str(src.resolve())))
    link = tmp_path / "link"
    link.symlink_to(src)
    lock_output_dir(link)
    try:
        moved = move_aside(link)
        assert link.is_symlink() and (moved / "main.py").exists() and moved.parent == tmp_path
        assert sorted(p.name for p in src.iterdir()) == ["run.lock"]
    finally:
        os.close(_HELD.pop(str(link.resolve())))


def test_overwrite_with_a_resume_continues_the_same_run(finished, tmp_path):
    data, model, done = finished
    out = copied(done, tmp_path)
    with pytest.raises(RunFinished):
        finetune(data, model, out, "--overwrite_output_dir", "true", "--resume_from_checkpoint", "true")
    assert not list(tmp_path.glob("out.replaced-*"))


def test_run_glue_habits_without_training(finished, tmp_path, tiny_model):
    data, model, done = finished
    fine_tuned = copied(done, tmp_path)
    files = {p: p.read_bytes() for p in fine_tuned.rglob("*") if p.is_file()}
    # evaluate in place: eval_results.json and all_results.json written into the model's folder, nothing else
    finetune(data, fine_tuned, fine_tuned, "--do_eval", "true", "--overwrite_output_dir", "true")
    now = {p: p.read_bytes() for p in fine_tuned.rglob("*") if p.is_file()}
    assert {p.name for p in now.keys() ^ files.keys()} == set()
    assert {p.name for p in now if now[p] != files[p]} <= {"eval_results.json", "all_results.json"}
    # predict-only with a test file and no dev split
    only_test = write(tmp_path / "test-only", {"test.tsv": tsv(["index", "sentence"], [[0, "bleak"], [1, "new"]])})
    finetune(only_test, fine_tuned, tmp_path / "predicted", "--do_predict", "true")
    assert len((tmp_path / "predicted" / "glue_submission" / "SST-2.tsv").read_text().splitlines()) == 3
    # another task's labels are not scored as this task's
    mrpc = write(tmp_path / "mrpc", {"dev.tsv": SST2["dev.tsv"]})
    with pytest.raises(ConfigurationError, match=r"the model's labels are \['negative', 'positive'\], mrpc's are"):
        args = finetune_args("mrpc", fine_tuned, mrpc, tmp_path / "e", "--do_eval", "true", max_seq_length=32)
        run_finetuning(FineTuningRecipe.from_args(args))


def test_do_train_alone_is_refused(finished, tmp_path):
    data, model, _ = finished
    with pytest.raises(ConfigurationError, match=r"--do_train without --do_eval"):
        finetune(data, model, tmp_path / "out", "--do_train", "true")


def test_resuming_another_models_checkpoint_is_one_line(finished, tmp_path, corpus_and_tokenizer):
    data, model, done = finished
    other = tmp_path / "other"
    shutil.copytree(done / "runs" / RUN / "checkpoint-2", other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": config["hidden_size"] * 2}))
    with pytest.raises(ConfigurationError, match=r"Cannot resume from .*other: its model is not this run's"):
        finetune(data, model, tmp_path / "out", "--resume_from_checkpoint", str(other))


def test_the_launchers_precision_on_a_cpu_is_refused_not_recorded_as_float32(finished, tmp_path, monkeypatch):
    data, model, _ = finished
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # recipes/accelerate/ddp.yaml's, with --use_cpu true
    with pytest.raises(ConfigurationError, match=r"mixed_precision is bf16 .* launch with recipes/accelerate/ddp_cpu"):
        finetune(data, model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_credential_given_twice_is_not_echoed(finished, tmp_path):
    data, model, _ = finished
    with pytest.raises(ConfigurationError, match=r"unknown argument\(s\): HIDDEN\.") as refused:
        finetune(data, model, tmp_path / "out", "--hub_token", "hf_secret_1", "hf_secret_1")
    assert "hf_secret_1" not in str(refused.value)


def test_sigterm_during_the_push_finishes_it_records_it_and_stops(finished, tmp_path, local_hub, monkeypatch):
    """The signal is acted on at the next stage boundary: the push is whole, recorded, and the same command then has
    nothing left to do (it had exited 143 with an empty repository, and the rerun never pushed)."""
    import signal

    from bert_repro.hub import push as push_module
    from bert_repro.training.finetuning import run as finetune_module

    data, model, done = finished
    out = copied(done, tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")

    def push_under_sigterm(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return push_module.push(*args, **kwargs)

    monkeypatch.setattr(finetune_module, "push", push_under_sigterm)
    push = ("--push_to_hub", "true", "--hub_model_id", "someone/tiny-sst2")
    with local_hub.patch_client(tmp_path / "hf"):
        assert finetune(data, model, out, *push) == {"stopped_by": "SIGTERM"}
        assert "model.safetensors" in local_hub.repo_files("someone/tiny-sst2")
        with pytest.raises(RunFinished):
            finetune(data, model, out, *push)


def test_sigterm_inside_reproduce_stops_it_at_a_safe_point(tmp_path, tiny_model, monkeypatch):
    import signal

    from support.task_files import fixture_files

    from bert_repro.training.finetuning import run as finetune_module
    from bert_repro.training.lifecycle import Stopped
    from bert_repro.training.studies import reproduce

    records = finetune_module.write_records

    def records_under_sigterm(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        return records(*args)

    monkeypatch.setattr(finetune_module, "write_records", records_under_sigterm)
    glue = write(tmp_path / "glue" / "MRPC", fixture_files("mrpc")).parent
    args = reproduce.ReproduceArguments(
        model=str(tiny_model), output_dir=str(tmp_path / "bench"), tasks=["mrpc"], data_root=str(glue)
    )
    grid = ["--learning_rates", "1e-4", "--max_steps", "2", "--use_cpu", "true", "--disable_tqdm", "true"]
    with pytest.raises(Stopped, match=r"stopped by SIGTERM"):
        reproduce.run_reproduce(args, grid)
    monkeypatch.setattr(finetune_module, "write_records", records)
    assert "mrpc" in reproduce.run_reproduce(args, grid)  # the same command completes it


def test_a_resume_path_gives_way_to_the_runs_own_newer_checkpoint(finished, tmp_path, caplog):
    """After a kill, the same command with --resume_from_checkpoint PATH goes on from the run's own newest checkpoint,
    not from PATH again."""
    data, model, done = finished
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    finetune(data, model, out, "--max_steps", "4")
    shutil.copytree(done / "runs" / RUN / "checkpoint-2", elsewhere / "checkpoint-2")  # kept elsewhere
    for path in [*out.iterdir(), *(out / "runs" / RUN).iterdir()]:  # a kill after checkpoint-4
        if path.name not in ("run_config.json", "runs", "checkpoint-4"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    with caplog.at_level("INFO"):
        summary = finetune(data, model, out, "--max_steps", "4", "--resume_from_checkpoint", elsewhere / "checkpoint-2")
    assert f"resuming from {out / 'runs' / RUN / 'checkpoint-4'}" in caplog.text and summary["best"]["steps"] == 4


@pytest.mark.parametrize(
    ("raised", "code", "said"),
    [
        (KeyboardInterrupt(), 130, "interrupted: no checkpoint was saved yet"),
        (None, 75, ""),  # the run returned {"stopped_by": ...}: it said so itself
        ("stopped", 75, "stopped by SIGTERM"),
        (ConfigurationError("--x: wrong"), 2, "recipe.py: error: --x: wrong"),
        (OSError(28, "No space left on device", "/out/README.md"), 2, "the disk holding /out/README.md is full"),
        (RunFinished("nothing to do"), 0, "recipe.py: nothing to do"),
    ],
)
def test_every_recipe_ends_with_one_line_and_its_exit_code(raised, code, said, capsys):
    """recipes/*.py all run through `lifecycle.main`: a signal is 75 (SIGTERM, SIGUSR1) or 130 (Ctrl-C), what the user
    can fix is 2 with one line (a full disk while a card or records are written too), a finished run is 0."""
    from bert_repro.training.lifecycle import Stopped, main

    def body():
        if raised is None:
            return {"stopped_by": "SIGTERM"}
        raise Stopped("stopped by SIGTERM after the records") if raised == "stopped" else raised

    with pytest.raises(SystemExit) as ended:
        main("recipe.py", body, (ConfigurationError,))
    err = capsys.readouterr().err
    assert ended.value.code == code and said in err and "Traceback" not in err and len(err.splitlines()) <= 1
