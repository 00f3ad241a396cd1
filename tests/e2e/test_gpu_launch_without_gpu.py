"""The README's GPU command (ddp.yaml) without a GPU: one line, from one process, first, naming ddp_cpu.yaml."""

import os
import subprocess
import sys
import threading

import pytest
import torch
from support import ROOT
from support.pretraining_runs import accelerate_launch

from bert_repro.training.cli import ConfigurationError
from bert_repro.training.distributed import check_deepspeed_installed as check_launch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the command trains")


REFUSED, ALLOWED = ["", "--use_cpu false", "--config C --use_cpu=no"], ["--use_cpu", "--use_cpu=1", "--config C"]


@pytest.mark.parametrize("line", REFUSED + ALLOWED)
def test_several_processes_need_a_gpu_or_use_cpu(monkeypatch, tmp_path, capsys, line):
    for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "8")
    (tmp_path / "c.yaml").write_text("use_cpu: true\n")  # the recipe's config "C": as the flag, which overrides it
    argv = [str(tmp_path / "c.yaml") if arg == "C" else arg for arg in line.split()]
    monkeypatch.setattr(sys, "argv", ["pretrain.py", *argv])  # the command line's: a recipe built in Python may change
    if line in ALLOWED:
        return check_launch(argv)
    with pytest.raises(ConfigurationError, match="^8 processes were launched on a machine without a GPU") as error:
        check_launch(argv)
    assert "recipes/accelerate/ddp_cpu.yaml" in str(error.value) and "\n" not in str(error.value)
    check_launch([*argv, "--seed", "1"])  # a recipe built in Python (`from_yaml`): check_engine judges what it becomes
    monkeypatch.setenv("LOCAL_RANK", "3")  # the other processes of the machine leave quietly
    with pytest.raises(SystemExit) as left:
        check_launch(argv)
    assert left.value.code == 0 and capsys.readouterr() == ("", "")


@pytest.mark.slow
def test_the_readme_gpu_command_says_it_once_from_the_first_process_after_the_others_left(tmp_path):
    # 8 processes as in the README (fewer rarely race): the first says it once the others left; none is stopped.
    launcher = ["--config_file", str(ROOT / "recipes" / "accelerate" / "ddp.yaml"), "--main_process_port", "0", "-q"]
    args = ("--config", ROOT / "recipes" / "configs" / "bert_base.yaml", "--output_dir", tmp_path / "base")
    result = accelerate_launch(launcher, "pretrain.py", *args, check=False)
    first, *rest = result.stderr.splitlines()
    assert result.returncode != 0 and first.startswith("pretrain.py: error: 8 processes were launched"), result.stderr
    assert "ddp_cpu.yaml" in first and "ddp_cpu.yaml" not in "\n".join(rest), result.stderr
    assert "SIGTERM" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    # The waiting itself, as under torchrun: a sibling leaving 10 s after the first reached the check, reaped at once.
    wait = "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\ntime.sleep(10)"
    first = "import pathlib, sys\nfrom bert_repro.training.distributed import check_deepspeed_installed as check\n"
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "test", "ACCELERATE_USE_CPU": "0"}
    sibling = subprocess.Popen([sys.executable, "-c", wait, tmp_path / "ready"])
    threading.Thread(target=sibling.wait, daemon=True).start()
    first += "pathlib.Path(sys.argv[1]).touch()\ncheck(sys.argv[1:])"
    done = subprocess.run([sys.executable, "-c", first, tmp_path / "ready"], env=env, cwd=ROOT, capture_output=True)
    assert b"ConfigurationError" in done.stderr and sibling.returncode == 0
