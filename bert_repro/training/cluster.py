"""What a run needs on a shared cluster: it stops cleanly when the scheduler asks (`StopOnSignal`,
`stop_between_runs`), its saves are all or nothing (`publish`: staged under `.saving/`, named when complete), a
full disk is one message (`disk_full`), and one output directory holds one run at a time (`lock_output_dir`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from transformers import TrainerCallback

from ..atomic import STAGING, fsync_dir, move_into, settle
from .cli import RUN_LOCK, ConfigurationError, hide_credentials, holds_nothing

logger = logging.getLogger(__name__)

# sysexits.h's EX_TEMPFAIL, "a temporary failure; the user is invited to retry": the run stopped on a signal
# after saving a checkpoint and continues with --resume_from_checkpoint true (0: finished, 1: failed, 2: a
# user error).
STOPPED_EXIT_CODE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# The time between the signal and the kill by default: Slurm's KillWait and Kubernetes'
# terminationGracePeriodSeconds. A stop whose save takes longer says so.
GRACE_SECONDS = 30
AGREE_EVERY_ON_GPUS = 10


_RECEIVED: dict[str, float] = {}  # "signum" and "noticed" (monotonic time) of the first stop signal received


def _record(signum, frame):
    _RECEIVED.setdefault("signum", signum)
    _RECEIVED.setdefault("noticed", time.monotonic())


@contextlib.contextmanager
def catching_stop_signals():
    """SIGTERM / SIGUSR1 recorded, not acted on, while the block runs: each is acted on at the next safe point
    (`StopOnSignal` at a step's end, `stop_between_runs` outside training). A block inside another shares its
    record; the outermost starts it empty and puts the previous handlers back, also when training fails."""
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
    """The stop signal any of `processes` received (the highest number), the same on every process: with several,
    a collective that every process reaches at the same point."""
    received = int(_RECEIVED.get("signum", 0))
    if processes == 1:
        return received
    import torch
    from accelerate.utils import gather

    return int(gather(torch.tensor([received], device=device)).max().item())


class StopOnSignal(TrainerCallback):
    """Turns SIGTERM (what Slurm and Kubernetes send before a kill) or SIGUSR1 (Slurm's `--signal`) into a
    checkpoint at the end of the current optimizer step and a stop, at the same step on every process.
    `stopped` is (signal name, step) once the run stopped; `noticed` the monotonic time of the signal."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.noticed, self.stopped = None, None
        # The steps at which a stop may save: multiples of `stop_every`. Several GPU processes agree every
        # AGREE_EVERY_ON_GPUS steps: reading the gathered flag waits for the step to finish on the device, and at
        # every step that would keep the host from queueing the next one ahead. A streamed run with DataLoader
        # workers can save its data position only at steps planned ahead (`WorkerStreams.plan_saves`).
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
    """The one line a run stopped in training logs: which signal, which step, how long the save took and how to go
    on. `resume`: the arguments to add to this command (None: the same command continues the run)."""
    name, step = stop.stopped
    then = f"resume with: {resume_command(resume or [])}"
    return _stop_line(name, stop.noticed, f"at step {step} (checkpoint-{step} saved", then)


def stop_between_runs(training, where: str, then: str | None = None) -> dict | None:
    """A safe point outside training (`where`: "before run X"): {"stopped_by": signal name} when any process received
    a stop signal, the stop said in one line (`then`: what to do next; by default, run the same command again);
    else None. Every process must call it at the same point."""
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


def resume_command(extra: list[str]) -> str:
    """This process's command with `extra` in place of the same options (their values dropped), a credential in it
    hidden."""
    args, replaced = sys.argv[1:], set(extra[::2])
    argv = [arg for i, arg in enumerate(args) if arg not in replaced and (i == 0 or args[i - 1] not in replaced)]
    launched = "LOCAL_RANK" in os.environ or any(k.startswith("ACCELERATE_") for k in os.environ)
    launcher = "accelerate launch [the same launcher options] " if launched else "python "
    return launcher + shlex.join([sys.argv[0], *hide_credentials(argv), *extra])


# ------------------------------------------------------------------------------------------------------------
# Saves that are all or nothing
# ------------------------------------------------------------------------------------------------------------


def publish(staging: Path, target: Path) -> None:
    """Move what `staging` holds to `target`: a staged checkpoint folder to its name (replacing a broken folder of
    that name), or a staged model's files into `target`. Weights go last, so a folder with weights has the rest."""
    if staging.name != STAGING:  # a checkpoint folder: one rename
        settle(staging)  # durable, and the modes of the run's other files
        if target.exists():
            old = target.with_name(f"{STAGING}-{target.name}-replaced")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
        fsync_dir(target.parent)
        return
    move_into(staging, target, last=("model.safetensors", "model.safetensors.index.json"))


def _says_no_space(err: BaseException | None) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if any(text in str(err) for text in ("No space left", "StorageFull", "os error 28")):
            return True
        err = err.__cause__ or err.__context__
    return False


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def disk_full(err: BaseException, folder: Path, needed: int, what: str) -> ConfigurationError | None:
    """A `ConfigurationError` (exit 2, one line) when `err` (raised while saving `what` into `folder`) came from a
    full disk, else None. torch reports one as "file write failed" or an iostream error, not ENOSPC: so the free
    space is checked too."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if not _says_no_space(err) and free >= needed:
        return None
    return ConfigurationError(
        f"the disk holding {folder} is full: saving {what} needs about {_size(needed)} and {_size(free)} is "
        "free. Nothing incomplete was left behind; free some space (or choose another --output_dir) and run "
        "again (--resume_from_checkpoint true continues from the last complete checkpoint)."
    )


# ------------------------------------------------------------------------------------------------------------
# One run per output directory
# ------------------------------------------------------------------------------------------------------------


_HELD: dict[str, int] = {}  # output directory -> the lock's file descriptor, open until the process ends
_HOLDER: dict[str, int] = {}  # "pid": the process holding them, the parent of any child that inherits them


def _drop_locks_in_child() -> None:
    # Forked children (datasets' num_proc workers, DataLoader workers) share the lock's open file description, and
    # flock holds while any descriptor of it is open: the orphans of a run killed with -9 (datasets' wait for work
    # for ever) would keep its directory locked. Closing the child's copy keeps the parent's lock (LOCK_UN would
    # release it for both); a child that execs never has it (close on exec). A check that the recorded pid is
    # alive could not take a lock that the kernel still holds.
    if not _HELD:
        return
    for fd in _HELD.values():
        os.close(fd)
    _HELD.clear()
    _end_with_parent()


def _end_with_parent() -> None:
    """A worker forked by a run is killed with it (Linux): datasets' pool and its manager would otherwise wait for
    work for ever after the run is killed with -9. SIGKILL, not SIGTERM: a forked child inherits the run's SIGTERM
    handler, which saves instead of ending, and a worker has nothing of its own to save."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != _HOLDER["pid"]:  # the run ended before the signal was armed
            os._exit(1)


os.register_at_fork(after_in_child=_drop_locks_in_child)


def lock_output_dir(output_dir: str | Path) -> None:
    """Take `output_dir`'s lock (`flock` on run.lock, with the holder's pid) for the rest of this process, or raise
    a `ConfigurationError` naming the process that holds it. The kernel releases it when the process dies."""
    out = Path(output_dir)
    if str(out.resolve()) in _HELD:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise ConfigurationError(
            f"cannot write to the output directory {out}: {error.strerror or error} ({error.filename}). "
            "Choose another --output_dir, one you can write to."
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process that is starting"
        os.close(fd)
        raise ConfigurationError(
            f"{out} is in use by another run ({holder}); wait for it to end, or choose another --output_dir."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(
        fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0
    )
    _HELD[str(out.resolve())] = fd
    _HOLDER["pid"] = os.getpid()


def release_output_dir(output_dir: str | Path) -> None:
    """The run in `output_dir` has ended: its lock file removed (while still held, so that no other run took it in
    between), then the lock released. Nothing happens in a process that does not hold it."""
    out = Path(output_dir)
    fd = _HELD.pop(str(out.resolve()), None)
    if fd is not None:
        (out / RUN_LOCK).unlink(missing_ok=True)
        os.close(fd)


def move_aside(output_dir: str | Path) -> Path | None:
    """`--overwrite_output_dir true` into a directory holding something: the directory renamed, in one step, to a
    free sibling `<name>.replaced-<time>` (said in the log; nothing is deleted) and made again, empty and locked, for
    the new run. A kill leaves the old run whole in one of the two places, never mixed with the new one. Only under
    this process's lock on it (`lock_output_dir_once`)."""
    out = Path(output_dir)
    key = str(out.resolve())
    if key not in _HELD or holds_nothing(out):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = next(p for n in range(1000) if not (p := out.with_name(f"{out.name}.replaced-{stamp}-{n}")).exists())
    try:
        os.rename(out, aside)
    except OSError as error:
        raise ConfigurationError(
            f"--overwrite_output_dir true: cannot move {out} aside to {aside} ({error.strerror or error}); move or "
            "delete it yourself, or choose another --output_dir."
        ) from None
    fsync_dir(out.parent)
    old_lock = _HELD.pop(key)
    lock_output_dir(out)
    os.close(old_lock)
    logger.warning("--overwrite_output_dir true: %s moved to %s (nothing deleted); starting afresh", out, aside)
    return aside


def lock_output_dir_once(output_dir: str | Path, training, check, overwrite: bool = False) -> None:
    """`lock_output_dir`, then with `overwrite` (--overwrite_output_dir true) `move_aside`, then `check()` (the
    output-directory check, again: a run may have ended since it was made), by the main process of a (possibly
    distributed) run. Every process raises its error, so that all of them stop with the same message instead of
    waiting for the one that stopped."""
    error = None
    if training.process_index == 0:
        try:
            lock_output_dir(output_dir)
            if overwrite:
                move_aside(output_dir)
            check()
        except (ConfigurationError, FileExistsError) as err:
            error = str(err)
    if training.world_size > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error], from_process=0)[0]
    if error is not None:
        raise ConfigurationError(error)
