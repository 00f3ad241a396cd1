"""The README's GPU command (`accelerate launch --config_file recipes/accelerate/ddp.yaml ...`) on a machine without a
GPU: one line, from one process, before anything else is printed, naming ddp_cpu.yaml. torchrun's own report of
the failed process follows it (accelerate launch -q leaves out accelerate's traceback of it)."""

import pytest
import torch
from support import ROOT
from support.pretraining_runs import accelerate_launch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the command trains")


@pytest.fixture
def no_gpu_world(monkeypatch):
    for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "8")


@pytest.mark.parametrize("argv", [[], ["--use_cpu", "false"], ["--use_cpu=no", "--max_steps", "5"]])
def test_several_processes_without_gpu_nor_use_cpu_are_refused_in_one_line(no_gpu_world, argv):
    from bert_repro.training.cli import ConfigurationError
    from bert_repro.training.distributed import check_deepspeed_installed

    with pytest.raises(ConfigurationError) as refused:
        check_deepspeed_installed(argv)
    message = str(refused.value)
    assert message.startswith("8 processes were launched on a machine without a GPU, without --use_cpu")
    assert "recipes/accelerate/ddp_cpu.yaml" in message and "\n" not in message
    assert "then --use_cpu true" in message  # ddp_cpu.yaml's own use_cpu does not reach the processes


@pytest.mark.parametrize("argv", [["--use_cpu"], ["--use_cpu", "true", "--max_steps", "5"], ["--use_cpu=1"]])
def test_use_cpu_given_lets_them_run(no_gpu_world, argv):
    from bert_repro.training.distributed import check_deepspeed_installed

    check_deepspeed_installed(argv)


def test_use_cpu_in_the_config_or_the_accelerate_config_lets_them_run(no_gpu_world, tmp_path, monkeypatch):
    from bert_repro.training.cli import ConfigurationError
    from bert_repro.training.distributed import check_deepspeed_installed

    config = tmp_path / "c.yaml"
    config.write_text("use_cpu: true\nmax_steps: 5\n")
    check_deepspeed_installed(["--config", str(config)])
    with pytest.raises(ConfigurationError):  # the command line over the config, as the recipe reads them
        check_deepspeed_installed(["--config", str(config), "--use_cpu", "false"])
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # ddp_cpu.yaml's use_cpu: true
    check_deepspeed_installed([])


def test_the_other_processes_leave_quietly_with_0(no_gpu_world, monkeypatch, capsys):
    from bert_repro.training.distributed import check_deepspeed_installed

    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(SystemExit) as left:
        check_deepspeed_installed([])
    assert left.value.code == 0
    assert capsys.readouterr() == ("", "")


@pytest.mark.slow
def test_the_readme_gpu_command_says_it_once(tmp_path):
    # Its 8 processes, as the README runs it: with fewer, the first rarely finished before the others had left.
    launcher = ["--config_file", str(ROOT / "recipes" / "accelerate" / "ddp.yaml"), "--main_process_port", "0", "-q"]
    args = ("--config", ROOT / "recipes" / "configs" / "bert_base.yaml", "--output_dir", tmp_path / "base")
    result = accelerate_launch(launcher, "pretrain.py", *args, check=False)
    assert result.returncode != 0
    first, *rest = result.stderr.splitlines()
    assert first.startswith("pretrain.py: error: 8 processes were launched on a machine without a GPU"), result.stderr
    assert "ddp_cpu.yaml" in first and "ddp_cpu.yaml" not in "\n".join(rest), result.stderr
    # The other seven processes left before the first: torchrun stopped none of them.
    assert "SIGTERM" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "base").exists()


SIBLING = "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\ntime.sleep(10)"
FIRST = """import pathlib, sys
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.distributed import check_deepspeed_installed
pathlib.Path(sys.argv[1]).touch()
try:
    check_deepspeed_installed([])
except ConfigurationError:
    sys.exit(2)"""


@pytest.mark.slow
def test_the_first_process_fails_only_after_the_others_left(tmp_path):
    # torchrun stops every process still running when one fails, and lists each: the first one waits for its
    # siblings (the other processes of the machine), here one that leaves 10 s after the first reached the check.
    # As torchrun's agent, this process reaps it as soon as it has left.
    import os
    import subprocess
    import sys
    import threading

    ready = tmp_path / "ready"
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "test"}
    env.pop("ACCELERATE_USE_CPU", None)
    sibling = subprocess.Popen([sys.executable, "-c", SIBLING, ready])
    threading.Thread(target=sibling.wait, daemon=True).start()
    first = subprocess.run([sys.executable, "-c", FIRST, ready], env=env, cwd=ROOT, timeout=300)
    assert first.returncode == 2 and sibling.returncode == 0
