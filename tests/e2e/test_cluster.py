"""Runs on a shared cluster (bert_repro.training.cluster): a signal (to one of two DDP/FSDP2 processes too) stops a
run with a checkpoint that resumes to the uninterrupted weights, a full disk is one message (exit 2) with no
complete-looking checkpoint, a second run on a held output directory is refused, and a run killed with -9 while
datasets' workers build its examples does not block the next."""

import contextlib
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

import pytest
from support import ROOT
from support.pretraining_runs import launch, weights, write_config
from support.task_files import finetune_args, fixture_files, write

from bert_repro.training.checkpoints import checkpoint_problem, newest_valid_checkpoint
from bert_repro.training.cluster import STAGING, STOPPED_EXIT_CODE, publish

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
RECIPE = str(ROOT / "recipes" / "pretrain.py")
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]
# 12 steps, the first periodic checkpoint at step 10: the signal comes at the first logged step.
STEPS = {"max_steps": 12, "save_steps": 10, "eval_fraction": 0.0, "global_batch_size": 8}


def run(cmd: list, env=ENV, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


def rank_process(launcher_pid: int, rank: int) -> int:
    """The pid of the worker of `rank` among the launcher's children (torchrun starts them as processes)."""
    for _ in range(600):
        for task in Path(f"/proc/{launcher_pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                if f"RANK={rank}".encode() in environ:
                    return int(child)
        time.sleep(0.1)
    raise AssertionError(f"no worker of rank {rank}")


def run_until_first_step(cmd: list[str], signal_pid=None) -> tuple[int, str]:
    """Start `cmd`, SIGTERM it (or `signal_pid(its pid)`) at the first logged training step: (exit code, output)."""
    process = subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True
    )
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "'loss'" in line:
                os.kill(signal_pid(process.pid) if signal_pid else process.pid, signal.SIGTERM)
                break
        output = "".join(lines) + process.communicate(timeout=300)[0]
    finally:  # processes that wait for each other for ever (they disagreed on the step to stop at) end here
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, output


def stopped_step(output: str, directory: Path) -> int:
    """The step of the one "stopped by SIGTERM" line, with its checkpoint complete and nothing left staged."""
    lines = [line for line in output.splitlines() if "stopped by SIGTERM at step" in line]
    assert len(lines) == 1, output[-3000:]
    step = int(lines[0].split("at step ")[1].split()[0])
    assert "resume with: " in lines[0] and "--resume_from_checkpoint true" in lines[0]
    assert 0 < step < STEPS["save_steps"], lines[0]  # before the first periodic checkpoint
    assert [p.name for p in directory.glob("checkpoint-*")] == [f"checkpoint-{step}"]
    assert checkpoint_problem(directory / f"checkpoint-{step}") is None
    assert not (directory / STAGING).exists() and not (directory / "model.safetensors").exists()
    return step


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus_and_tokenizer):
    """An uninterrupted one-process run, and the configs of one process (batch 8) and two (batch 4 each)."""
    corpus, tokenizer = corpus_and_tokenizer
    root = tmp_path_factory.mktemp("cluster")
    single = write_config(root / "single.yaml", corpus, tokenizer, per_device_train_batch_size=8, **STEPS)
    double = write_config(root / "double.yaml", corpus, tokenizer, per_device_train_batch_size=4, **STEPS)
    launch(single, root / "full")
    return root, single, double


def assert_resumes_to(reference_dir: Path, cmd: list[str], directory: Path, tolerance: float) -> None:
    result = run([*cmd, "--resume_from_checkpoint", "true"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    a, b = weights(reference_dir), weights(directory)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= tolerance, worst


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_resumes_to_the_same_weights(reference):
    root, single, _ = reference
    out = root / "stopped"
    cmd = [sys.executable, RECIPE, "--config", str(single), "--output_dir", str(out)]
    code, output = run_until_first_step(cmd)
    assert code == STOPPED_EXIT_CODE, output[-3000:]
    assert "Traceback" not in output
    stopped_step(output, out)
    assert_resumes_to(root / "full", cmd, out, tolerance=1e-6)  # as test_resume.py (float32 rounding)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp_cpu", "fsdp_cpu"])
def test_a_signal_to_one_of_two_processes_stops_both_at_the_same_step(reference, engine):
    """Only rank 1 is signalled: rank 0 must save the same step (every rank writes its part of the checkpoint,
    rng_state_0 and rng_state_1), and the resumed run ends where one uninterrupted process does (DDP and FSDP2
    add the same gradients in another order: float32 rounding, as in test_distributed.py)."""
    root, _, double = reference
    out = root / engine
    cmd = [
        *LAUNCH,
        "--config_file",
        str(ROOT / "recipes" / "accelerate" / f"{engine}.yaml"),
        "--main_process_port",
        "0",
        RECIPE,
        "--config",
        str(double),
        "--output_dir",
        str(out),
    ]
    code, output = run_until_first_step(cmd, signal_pid=lambda pid: rank_process(pid, 1))
    assert code != 0, output[-3000:]  # the launcher reports the workers' exit code 75 as its own failure
    assert f"exitcode  : {STOPPED_EXIT_CODE}" in output, output[-3000:]
    step = stopped_step(output, out)
    for name in ("rng_state_0.pth", "rng_state_1.pth"):
        assert (out / f"checkpoint-{step}" / name).exists(), name
    assert_resumes_to(root / "full", cmd, out, tolerance=1e-5)


@pytest.mark.slow
def test_a_streamed_run_with_workers_stops_where_its_workers_kept_the_position(tmp_path, corpus_and_tokenizer):
    """DataLoader workers read ahead and keep their streams' positions only at steps planned ahead: a signal
    stops the run at the next multiple of STREAM_STOP_EVERY, with the stream's position in the checkpoint, and the
    resumed run ends where the uninterrupted one does."""
    from bert_repro.training.pretraining.examples import STREAM_STOP_EVERY

    corpus, tokenizer = corpus_and_tokenizer
    steps = STREAM_STOP_EVERY + 4
    streamed = dict(streaming=True, stream_document_buffer=4, stream_shuffle_buffer=16, stream_held_out_documents=2)
    steps = dict(max_steps=steps, save_steps=steps - 1, eval_fraction=0.0, phase2_fraction=0.0)
    config = write_config(tmp_path / "stream.yaml", corpus, tokenizer, **streamed, **steps, dataloader_num_workers=2)
    launch(config, tmp_path / "full")
    out = tmp_path / "stopped"
    cmd = [sys.executable, RECIPE, "--config", str(config), "--output_dir", str(out)]
    code, output = run_until_first_step(cmd)
    assert code == STOPPED_EXIT_CODE and "Traceback" not in output, output[-3000:]
    assert f"SIGTERM received: the run stops at step {STREAM_STOP_EVERY}" in output, output[-3000:]
    assert f"stopped by SIGTERM at step {STREAM_STOP_EVERY} " in output, output[-3000:]
    assert [p.name for p in out.glob("checkpoint-*")] == [f"checkpoint-{STREAM_STOP_EVERY}"]
    assert (out / f"checkpoint-{STREAM_STOP_EVERY}" / "data_state-rank0.json").exists()
    assert_resumes_to(tmp_path / "full", cmd, out, tolerance=1e-6)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (room for one checkpoint, not two), or None where this process may not mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, check=False
    )
    mounted = mount.returncode == 0
    yield disk if mounted else None
    if mounted:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.slow
def test_a_full_disk_is_one_message_and_keeps_the_last_good_checkpoint(tmp_path, small_disk, corpus_and_tokenizer):
    """checkpoint-8 does not fit: exit 2, one message naming the directory and the space needed and free, no
    checkpoint-8 in any state, checkpoint-4 kept despite save_total_limit 1 (rotation waits for the new one).
    Without a tmpfs, ENOSPC is injected into torch.save."""
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(tmp_path / "c.yaml", corpus, tokenizer, eval_fraction=0.0, save_total_limit=1)
    env = dict(ENV)
    if small_disk is None:
        inject = tmp_path / "inject"
        inject.mkdir()
        (inject / "sitecustomize.py").write_text(
            "import errno, torch\nsave = torch.save\n"
            "def full(obj, f, *a, **k):\n"
            "    if 'checkpoint-8' in str(f):\n"
            "        raise OSError(errno.ENOSPC, 'No space left on device', str(f))\n"
            "    return save(obj, f, *a, **k)\n"
            "torch.save = full\n"
        )
        env["PYTHONPATH"] = os.pathsep.join([str(inject), env.get("PYTHONPATH", "")])
    out = (small_disk or tmp_path) / "out"
    result = run([sys.executable, RECIPE, "--config", str(config), "--output_dir", str(out)], env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = [line for line in result.stderr.splitlines() if "pretrain.py: error:" in line]
    assert len(message) == 1 and f"the disk holding {out} is full" in message[0], result.stderr[-3000:]
    assert "saving checkpoint-8 needs about" in message[0] and "is free" in message[0], message[0]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    assert checkpoint_problem(out / "checkpoint-4") is None
    assert newest_valid_checkpoint(out) == out / "checkpoint-4"
    assert not (out / STAGING).exists()


@pytest.mark.slow
def test_a_second_run_on_the_same_directory_is_refused_until_the_first_ends(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    out = tmp_path / "out"
    hold = (
        "import sys, time; from bert_repro.training.lifecycle import lock_output_dir; "
        "lock_output_dir(sys.argv[1]); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        config = write_config(tmp_path / "c.yaml", corpus, tokenizer, eval_fraction=0.0)
        result = run([sys.executable, RECIPE, "--config", str(config), "--output_dir", str(out)])
        assert result.returncode == 2, result.stderr[-3000:]
        assert f"is in use by another run (pid {holder.pid} on " in result.stderr, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and not (out / "run_config.json").exists()
    finally:
        holder.kill()  # as a scheduler kills a job: the kernel releases the lock with the process
        holder.wait()
    check = run([sys.executable, "-c", hold.replace("time.sleep(600)", "pass"), str(out)], timeout=300)
    assert check.stdout.strip() == "held", check.stderr[-3000:]


def processes_naming(directory: Path) -> list[int]:
    """The live processes whose command line names `directory`: a run's, and the workers it left behind."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):  # a process that ended while being looked at
            if proc.name.isdigit() and str(directory).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


@pytest.mark.slow
def test_a_run_killed_while_its_workers_build_examples_does_not_block_the_next(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    big = write(tmp_path / "corpus", {f"doc{i:04d}.txt": texts[i % len(texts)] for i in range(1000)})  # ~1 s a map
    config = write_config(tmp_path / "c.yaml", big, tokenizer, eval_fraction=0.0, num_proc=2, max_steps=2)
    out = tmp_path / "out"
    cmd = [sys.executable, RECIPE, "--config", str(config), "--output_dir", str(out)]
    env = {**ENV, "HF_DATASETS_CACHE": str(tmp_path / "cache")}  # nothing cached: the run builds its examples
    log = tmp_path / "first.log"
    try:
        with log.open("w") as sink:  # a file, not a pipe: the orphaned workers would keep a pipe open for ever
            first = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        while len(processes_naming(out)) < 4 and first.poll() is None:  # the run, two workers, their queue's manager
            time.sleep(0.01)
        assert first.poll() is None, log.read_text()[-3000:]
        os.kill(first.pid, signal.SIGKILL)  # the run only, as the OOM killer does
        first.wait()
        for _ in range(100):  # its workers and their manager are killed with it
            if not processes_naming(out):
                break
            time.sleep(0.05)
        assert not processes_naming(out), "orphaned workers outlived the run"
        second = run(cmd, env=env)
        assert second.returncode == 0, second.stderr[-3000:]
    finally:
        for pid in processes_naming(out):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_staged_saves_are_not_checkpoints_until_published(tmp_path):
    """A folder being written (`.saving/checkpoint-N`) is invisible to resumption and rotation; publishing
    renames it, replacing a broken folder of the same name; a staged model's files move, the weights last."""
    from transformers.trainer_utils import get_last_checkpoint, sort_checkpoints

    staged = tmp_path / STAGING / "checkpoint-6"
    staged.mkdir(parents=True)
    (staged / "trainer_state.json").write_text("{}")
    assert newest_valid_checkpoint(tmp_path) is None and get_last_checkpoint(str(tmp_path)) is None
    assert sort_checkpoints(str(tmp_path)) == []
    (tmp_path / "checkpoint-6").mkdir()
    (tmp_path / "checkpoint-6" / "truncated").write_text("x")
    publish(staged, tmp_path / "checkpoint-6")
    assert sorted(p.name for p in (tmp_path / "checkpoint-6").iterdir()) == ["trainer_state.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [STAGING, "checkpoint-6"]

    model = tmp_path / "model"
    (model / STAGING).mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "vocab.txt"):
        (model / STAGING / name).write_text(name)
    moved = []
    real_replace = os.replace
    try:
        os.replace = lambda a, b: (moved.append(Path(a).name), real_replace(a, b))
        publish(model / STAGING, model)
    finally:
        os.replace = real_replace
    assert moved[-1] == "model.safetensors" and sorted(p.name for p in model.iterdir()) == sorted(moved)


@pytest.mark.slow
def test_fine_tuning_stopped_by_sigterm_goes_on_with_the_same_command(tmp_path, tiny_model):
    """A fine-tuning run (no periodic checkpoints: save_strategy "no") stopped by SIGTERM saves checkpoint-N
    in its grid run's folder; the same command resumes it there and ends with the uninterrupted model."""
    data = write(tmp_path / "data", fixture_files("mrpc"))
    settings = dict(
        learning_rates="1e-3", max_steps=12, logging_steps=1, per_device_train_batch_size=1, max_seq_length=64
    )
    recipe = str(ROOT / "recipes" / "finetune.py")
    finetune = [sys.executable, recipe, *finetune_args("mrpc", tiny_model, data, predict_test=False, **settings)]
    full = run([*finetune, "--output_dir", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr[-3000:]
    out = tmp_path / "stopped"
    cmd = [*finetune, "--output_dir", str(out)]
    code, output = run_until_first_step(cmd)
    assert code == STOPPED_EXIT_CODE and "Traceback" not in output, output[-3000:]
    line = next(line for line in output.splitlines() if "stopped by SIGTERM at step" in line)
    step = int(line.split("at step ")[1].split()[0])
    assert line.endswith(f"resume with: python {' '.join(cmd[1:])}"), line
    run_dir = out / "runs" / "lr0.001_seed42"
    assert [p.name for p in run_dir.glob("checkpoint-*")] == [f"checkpoint-{step}"] and step < 12
    assert not (run_dir / "result.json").exists() and not (out / "results.json").exists()
    resumed = run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("'loss'") == 12 - step  # the steps after the checkpoint, not all again
    a, b = (weights(directory) for directory in (tmp_path / "full", out))
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


@pytest.mark.parametrize("device, processes, stops_at", [("cuda", 2, 10), ("cpu", 2, 3), ("cuda", 1, 3)])
def test_several_gpu_processes_agree_on_a_stop_every_few_steps(device, processes, stops_at):
    """On several GPUs the ranks agree on a stop every AGREE_EVERY_ON_GPUS steps (reading the gathered flag waits
    for the device: at every step the host could not queue ahead); on CPUs and one GPU at the step itself."""
    import torch
    from transformers import TrainerControl, TrainerState

    from bert_repro.training import cluster

    accelerator = SimpleNamespace(num_processes=processes, device=torch.device(device))
    stop = cluster.StopOnSignal(accelerator)
    state, control = TrainerState(), TrainerControl()
    # the collective itself is tested with two processes above
    with patch.object(cluster, "signal_received", lambda *_: stop.received), cluster.catching_stop_signals():
        for step in range(1, 2 * cluster.AGREE_EVERY_ON_GPUS + 1):
            state.global_step = step
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            stop.on_step_end(None, state, control)
            if control.should_training_stop:
                break
    assert stop.stopped == ("SIGTERM", stops_at) and control.should_save


@pytest.mark.parametrize("eval_strategy", ["epoch", "no"])
def test_a_signal_between_two_runs_of_a_grid_stops_before_the_next(
    tmp_path, tiny_model, monkeypatch, caplog, eval_strategy
):
    """SIGTERM during the evaluation that ends the grid's first run (Trainer's after the last step's end, or the
    grid's own after training): that run is saved, the second is not started and the recipe exits 75; the same
    command then trains the second only."""
    from bert_repro.training.finetuning.trainer import TaskTrainer

    data = write(tmp_path / "data", fixture_files("mrpc"))
    out = tmp_path / "out"
    settings = dict(learning_rates="1e-3", seeds=[1, 2], max_steps=1, per_device_train_batch_size=2, max_seq_length=32)
    args = finetune_args("mrpc", tiny_model, data, out, predict_test=False, eval_strategy=eval_strategy, **settings)
    monkeypatch.setattr(sys, "argv", ["recipes/finetune.py", *args])
    evaluated, evaluate = [], TaskTrainer.evaluate

    def signalled_evaluate(trainer, *args, **kwargs):
        evaluated.append(Path(trainer.args.output_dir).name)
        if evaluated == ["lr0.001_seed1"]:
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(trainer, *args, **kwargs)

    monkeypatch.setattr(TaskTrainer, "evaluate", signalled_evaluate)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a signal nothing records does not end pytest
    try:
        with pytest.raises(SystemExit) as stopped, caplog.at_level("WARNING"):
            runpy.run_path(str(ROOT / "recipes" / "finetune.py"), run_name="__main__")
        assert stopped.value.code == STOPPED_EXIT_CODE
        assert "stopped by SIGTERM before run lr0.001_seed2" in caplog.text
        assert (out / "runs" / "lr0.001_seed1" / "result.json").exists() and not (out / "results.json").exists()
        assert not (out / "runs" / "lr0.001_seed2").exists() and evaluated == ["lr0.001_seed1"]
        runpy.run_path(str(ROOT / "recipes" / "finetune.py"), run_name="__main__")  # the same command goes on
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert evaluated == ["lr0.001_seed1", "lr0.001_seed2"]
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 2


def test_a_signal_during_the_final_evaluation_stops_pretraining_before_its_push(
    tmp_path, corpus_and_tokenizer, local_hub, monkeypatch, caplog
):
    """SIGTERM during the held-out evaluation after the last step: the evaluation and the final save complete, and
    the run stops (exit 75) before the push, saying how to publish the finished run; the same command then pushes it
    without training, once."""
    from bert_repro.training.lifecycle import RunFinished
    from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining
    from bert_repro.training.pretraining.trainer import PreTrainingTrainer

    config = write_config(tmp_path / "run.yaml", *corpus_and_tokenizer, max_steps=2, save_steps=100, eval_steps=100)
    evaluate = PreTrainingTrainer.evaluate

    def signalled_evaluate(trainer, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(trainer, *args, **kwargs)

    monkeypatch.setattr(PreTrainingTrainer, "evaluate", signalled_evaluate)
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # check_hub_access reads it
    out = tmp_path / "out"
    argv = ["--config", str(config), "--output_dir", str(out), "--push_to_hub", "true"]
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a signal nothing records does not end pytest
    try:
        with local_hub.patch_client(tmp_path / "hf_home"), caplog.at_level("WARNING"):
            result = run_pretraining(PreTrainingRecipe.from_args([*argv, "--hub_model_id", "local-user/tiny"]))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result == {"stopped_by": "SIGTERM"} and (out / "results.json").exists()
    assert "stopped by SIGTERM after the final save" in caplog.text
    assert f"publish it with: python -m bert_repro.hub {out} --repo_id local-user/tiny --checkpoints" in caplog.text
    assert not any("/commit/" in path for _, path, _ in local_hub.requests)  # nothing pushed
    monkeypatch.setattr(PreTrainingTrainer, "evaluate", evaluate)
    with local_hub.patch_client(tmp_path / "hf_home"):
        again = run_pretraining(PreTrainingRecipe.from_args([*argv, "--hub_model_id", "local-user/tiny"]))
        assert again["global_step"] == 2 and "model.safetensors" in local_hub.repo_files("local-user/tiny")
        with pytest.raises(RunFinished):  # a requeued job: nothing to do
            resume = ["--resume_from_checkpoint", "true", "--hub_model_id", "local-user/tiny"]
            run_pretraining(PreTrainingRecipe.from_args([*argv, *resume]))
