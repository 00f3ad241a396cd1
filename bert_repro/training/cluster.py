"""What a run needs on a shared cluster: it stops cleanly when the scheduler asks (`StopOnSignal`), its saves are
all or nothing (`publish`), a full disk is one message (`disk_full`), one run per output directory (`lock_output_dir`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from transformers import TrainerCallback

from ..atomic import STAGING, fsync_dir, move_into, settle
from .cli import ConfigurationError, hide_credentials

logger = logging.getLogger(__name__)

# sysexits.h's EX_TEMPFAIL ("the user is invited to retry"): stopped on a signal, checkpoint saved.
STOPPED_EXIT_CODE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Slurm's KillWait and Kubernetes' terminationGracePeriodSeconds by default: a longer save says so.
GRACE_SECONDS = 30
AGREE_EVERY_ON_GPUS = 10


_RECEIVED: dict[str, float] = {}  # "signum" and "noticed" (monotonic time) of the first stop signal received


def _record(signum, frame):
    _RECEIVED.setdefault("signum", signum)
    _RECEIVED.setdefault("noticed", time.monotonic())


@contextlib.contextmanager
def catching_stop_signals():
    """SIGTERM / SIGUSR1 recorded while the block runs, acted on at the next safe point (`StopOnSignal`,
    `stop_between_runs`); nested blocks share the outermost's record."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(STOP_SIGNALS[0]) is _record:
        yield  # Python delivers signals to the main thread only; an outer block already records them
        return
    _RECEIVED.clear()
    previous = {sig: signal.signal(sig, _record) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def signal_received(processes: int = 1, device=None) -> int:
    """The stop signal any of `processes` received, the same on every process (with several, a collective)."""
    received = int(_RECEIVED.get("signum", 0))
    if processes == 1:
        return received
    import torch
    from accelerate.utils import gather

    return int(gather(torch.tensor([received], device=device)).max().item())


class StopOnSignal(TrainerCallback):
    """Turns SIGTERM (Slurm's and Kubernetes' before a kill) or SIGUSR1 (Slurm's `--signal`) into a checkpoint and
    a stop at the same step on every process. `stopped`: (signal name, step)."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.noticed, self.stopped = None, None
        # Several GPU processes agree every AGREE_EVERY_ON_GPUS steps: reading the gathered flag at every step would
        # keep the host from queueing the next one. Streamed DataLoader workers save only at planned steps.
        several_gpus = accelerator.num_processes > 1 and accelerator.device.type == "cuda"
        self.stop_every, self._announced = AGREE_EVERY_ON_GPUS if several_gpus else 1, False

    @property
    def received(self) -> int:
        return int(_RECEIVED.get("signum", 0))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.stop_every:  # every process skips the same steps: the collective stays matched
            if self.received and not self._announced:
                self._announced = True
                step = -(-state.global_step // self.stop_every) * self.stop_every
                agreed = self.stop_every == AGREE_EVERY_ON_GPUS
                why = "the processes agree on it" if agreed else "the stream's DataLoader workers keep their position"
                logger.warning(
                    f"{signal.Signals(self.received).name} received: the run stops at step {step}, the next step at "
                    f"which a stop can save (every {self.stop_every} steps: {why} then)"
                )
            return control
        signum = signal_received(self.accelerator.num_processes, self.accelerator.device)
        if signum and self.stopped is None:
            self.noticed = _RECEIVED.get("noticed", time.monotonic())
            self.stopped = (signal.Signals(signum).name, state.global_step)
            control.should_save = True
            control.should_training_stop = True
        return control


def stop_message(stop: StopOnSignal, resume: list[str] | None) -> str:
    """The line a run stopped in training logs. `resume`: the arguments to add to this command."""
    name, step = stop.stopped
    then = f"resume with: {resume_command(resume or [])}"
    return _stop_line(name, stop.noticed, f"at step {step} (checkpoint-{step} saved", then)


def stop_between_runs(training, where: str, then: str | None = None) -> dict | None:
    """A safe point outside training: {"stopped_by": signal name} when any process received a stop signal, else
    None. Every process must call it at the same point."""
    signum = signal_received(training.world_size, training.device)
    if not signum:
        return None
    name = signal.Signals(signum).name
    if training.process_index == 0:
        then = then or f"resume with: {resume_command([])}"
        logger.warning(_stop_line(name, _RECEIVED.get("noticed", time.monotonic()), f"{where} (all saved", then))
    return {"stopped_by": name}


def _stop_line(name: str, noticed: float, saved: str, then: str) -> str:
    seconds = time.monotonic() - noticed
    line = f"stopped by {name} {saved} {seconds:.1f} s after the signal); {then}"
    if seconds > GRACE_SECONDS:
        line += (
            f". The save took longer than the {GRACE_SECONDS} s many schedulers give before killing a "
            "job: ask for a longer grace period (Slurm --signal=B:TERM@SECONDS, Kubernetes "
            "terminationGracePeriodSeconds, TORCH_ELASTIC_SHUTDOWN_TIMEOUT under a launcher)"
        )
    return line


def log_from_the_main_process(training) -> None:
    """INFO lines from the main process only (under DDP each process would print them: N copies), warnings from all."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if training.process_index == 0 else logging.WARNING,
        datefmt="%H:%M:%S",
    )


def resume_command(extra: list[str]) -> str:
    """This process's command with `extra` in place of the same options, credentials hidden."""
    args, replaced = sys.argv[1:], set(extra[::2])
    argv = [arg for i, arg in enumerate(args) if arg not in replaced and (i == 0 or args[i - 1] not in replaced)]
    launched = "LOCAL_RANK" in os.environ or any(k.startswith("ACCELERATE_") for k in os.environ)
    launcher = "accelerate launch [the same launcher options] " if launched else "python "
    return launcher + shlex.join([sys.argv[0], *hide_credentials(argv), *extra])


def publish(staging: Path, target: Path) -> None:
    """Move a staged checkpoint folder to its name, or a staged model's files into `target`, weights last."""
    if staging.name != STAGING:  # a checkpoint folder: one rename
        settle(staging)  # durable, and the modes of the run's other files
        old = target.with_name(f"{STAGING}-{target.name}-replaced")
        if target.exists():  # a broken folder of that name
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
        fsync_dir(target.parent)
        return
    move_into(staging, target, last=("model.safetensors", "model.safetensors.index.json"))


def says_no_space(err: BaseException | None) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if any(text in str(err) for text in ("No space left", "StorageFull", "os error 28")):
            return True
        err = err.__cause__ or err.__context__
    return False


def human_size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def disk_full(err: BaseException, folder: Path, needed: int, what: str) -> ConfigurationError | None:
    """A `ConfigurationError` when `err` came from a full disk, else None. torch reports one as "file write failed",
    not ENOSPC: so the free space is checked too."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if not says_no_space(err) and free >= needed:
        return None
    return ConfigurationError(
        f"the disk holding {folder} is full: saving {what} needs about {human_size(needed)} and {human_size(free)} is "
        "free. Nothing incomplete was left behind; free some space (or choose another --output_dir) and run "
        "again (--resume_from_checkpoint true continues from the last complete checkpoint)."
    )
