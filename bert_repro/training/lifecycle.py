"""One life for every run (pre-training, fine-tuning, reproduce, the studies): what it read, the folder it writes, and
the stages it has completed.

- **Identity from content.** A run is the settings that change its results and the fingerprints of what it read: a
  local file by its SHA-256 (cached by path, size and modification time, so that a BERT-LARGE folder is hashed once),
  a Hub input by its resolved commit. How a path is spelled, and settings that change no result, are not identity.
- **Its folder** is checked before any work and locked while the run writes; `--overwrite_output_dir` moves aside
  only a folder that holds a run, and never restarts one that is resumed.
- **Its stages** (train, records, card, push; a fine-tuning grid evaluates and predicts within each of its runs) are
  recorded in stages.json as each completes: the same command completes what is missing and repeats nothing, and
  every check comes before any change, so a refusal changes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ..atomic import fsync_dir, is_leftover, write_json
from .cli import ConfigurationError
from .cluster import folder_bytes, human_size

logger = logging.getLogger(__name__)

RUN_CONFIG = "run_config.json"  # the settings and the inputs' fingerprints: the run's identity
RESULTS = "results.json"  # the run's summary, written by its "records" stage
RUN_LOCK = "run.lock"  # held by the run writing into the folder
STAGES_FILE = "stages.json"  # {stage: what it did}, each written as it completes
STAGES = ("train", "records", "card", "push")

# The files a model or tokenizer is loaded from; a folder's other files (results, runs, cards) are not its identity.
MODEL_FILES = re.compile(
    r"(bert_)?config\.json|.*\.safetensors(\.index\.json)?|.*\.(bin|index|ckpt|py)|.*\.data-\d+-of-\d+|vocab\.txt|"
    r"tokenizer(_config)?\.json|special_tokens_map\.json|generation_config\.json"
)


class RunFinished(Exception):
    """The output directory holds this run with every stage asked for complete (a requeued job): exit 0."""


class Stopped(Exception):
    """A stop signal ended this invocation at a safe point, everything before it saved: the same command goes on.
    Raised by the recipes that run others (reproduce, the studies), whose own runs return {"stopped_by": name}."""


def check_stopped(result: dict) -> dict:
    """`result` of a run, or `Stopped` when a signal stopped it."""
    if "stopped_by" in result:
        raise Stopped(f"stopped by {result['stopped_by']}; the same command goes on from there")
    return result


def main(name: str, body: Callable[[], Any], user_errors: tuple, output_dir: Callable[[], Any] = lambda: None):
    """A recipe as a command, the same in every recipe: `body()` printed when it returns text; exit 0 when done or
    nothing is left to do, 2 with one line for what the user can fix (a full disk too), 75 when SIGTERM or SIGUSR1
    stopped it at a safe point (the same command goes on), 130 on Ctrl-C. `output_dir()`: where Ctrl-C looks for
    checkpoints."""
    from .checkpoints import interrupted
    from .cluster import STOPPED_EXIT_CODE, says_no_space
    from .distributed import end_processes

    def say(line: str) -> None:
        if os.environ.get("RANK", "0") == "0":
            print(f"{name}: {line}", file=sys.stderr)

    try:
        result = body()
        end_processes()  # all processes leave together (a distributed launch)
        if isinstance(result, str):
            print(result)
        if isinstance(result, dict) and "stopped_by" in result:
            sys.exit(STOPPED_EXIT_CODE)
    except KeyboardInterrupt:  # where the newest checkpoint is, and how to go on, instead of a traceback
        sys.exit(interrupted(name, output_dir()))
    except RunFinished as done:  # a requeued job: the run is complete, and nothing in it is touched
        say(str(done))
        sys.exit(0)
    except Stopped as err:
        say(str(err))
        sys.exit(STOPPED_EXIT_CODE)
    except user_errors as err:
        say(f"error: {err}")
        sys.exit(2)
    except OSError as err:
        if not says_no_space(err):
            raise
        say(
            f"error: the disk holding {err.filename or 'the output'} is full; free some space and run the same command "
            "again (what is complete is kept, and it goes on from there)."
        )
        sys.exit(2)


# -- fingerprints ------------------------------------------------------------------------------------------------


def _cache_file() -> Path:
    root = os.environ.get("BERT_REPRO_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "bert_repro"
    return Path(root).expanduser() / "fingerprints.json"


def _file_digest(path: Path, cache: dict) -> str:
    stat = path.stat()
    key, seen = str(path.resolve()), [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    if cache.get(key, [None])[:-1] == seen:
        return cache[key][-1]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    cache[key] = [*seen, digest.hexdigest()]
    return cache[key][-1]


def hub_commit(repo_id: str, repo_type: str = "model") -> str | None:
    """The commit a Hub repository's main branch resolves to: asked of the Hub (briefly), else the local cache's."""
    from huggingface_hub import HfApi, constants

    if not constants.HF_HUB_OFFLINE:
        with contextlib.suppress(Exception):
            return HfApi().repo_info(repo_id, repo_type=repo_type, timeout=3).sha
    ref = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None


def fingerprints(sources: dict[str, Any], *, hub_type: str = "model") -> dict[str, Any]:
    """{name: fingerprint} of each source: a path (file, folder or TF checkpoint prefix), a Hub id, a list of them
    or None. A model folder by the files it is loaded from (`MODEL_FILES`), a data folder by every file in it."""
    cache_path = _cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    before = dict(cache)

    def one(source: str, model: bool) -> str:
        path = Path(source).expanduser()
        if path.is_dir():
            found = path.iterdir() if model else path.rglob("*")
            files = [p for p in found if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".lock")]
            files = [p for p in files if not model or MODEL_FILES.fullmatch(p.name)]
        elif path.is_file():
            files, path = [path], path.parent
        elif path.parent.is_dir() and any(path.parent.glob(path.name + ".*")):  # a TF checkpoint's prefix
            files, path = sorted(path.parent.glob(path.name + ".*")), path.parent
        else:
            return f"hub:{source}@{hub_commit(source, 'model' if model else hub_type) or 'unresolved'}"
        digest = hashlib.sha256()
        for p in sorted(files):
            digest.update(f"{p.relative_to(path).as_posix()}\0{_file_digest(p, cache)}\n".encode())
        return "sha256:" + digest.hexdigest()

    out = {}
    for name, source in sources.items():
        model = name.startswith(("model", "tokenizer"))
        if isinstance(source, (list, tuple)):
            out[name] = [one(str(s).split("=", 1)[-1], model) for s in source] or None
        else:
            out[name] = one(str(source), model) if source else None
    if cache != before:
        with contextlib.suppress(OSError):  # a cache that cannot be written costs time, not correctness
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            write_json(cache_path, cache, indent=None)
    return out


# -- the output folder -------------------------------------------------------------------------------------------


def _changes(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{"section.key": (saved value, this command's value)} for every setting that differs."""
    out = {}
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        if not (isinstance(a, dict) and isinstance(b, dict)):  # a value of its own (a schema version)
            if a != b:
                out[section] = (a, b)
            continue
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out[f"{section}.{key}"] = (a.get(key), b.get(key))
    return out


def _raised(values: tuple[Any, Any]) -> bool:
    """A setting raised: numbers both, the old one set (max_steps -1 is "unset": its run ran by epochs)."""
    old, new = values
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return numbers and 0 < old < new


def _said(name: str, values: tuple[Any, Any]) -> str:
    if name.startswith("inputs."):
        return f"--{name.removeprefix('inputs.')}: other content than this run read"
    return f"{name}: {values[0]!r} -> {values[1]!r}"


def read_stages(output_dir: str | Path) -> dict[str, Any]:
    """The stages completed in `output_dir` ({} for none): stages.json's, and "records" when results.json is there
    (a folder written before stages.json: every stage but the push)."""
    out = Path(output_dir)
    try:
        done = json.loads((out / STAGES_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        done = dict.fromkeys(("train", "card"), {}) if (out / RESULTS).exists() else {}
    except (OSError, ValueError):
        done = {}  # torn or unreadable: every stage is done again, each writing whole files
    if (out / RESULTS).exists():  # the "records" stage's last write: its own record, so a kill cannot split them
        done.setdefault("records", {})
    return done


def complete(output_dir: str | Path, stage: str, **what: Any) -> None:
    """Record `stage` as complete in `output_dir` (the main process only)."""
    done = read_stages(output_dir)
    done[stage] = what
    write_json(Path(output_dir) / STAGES_FILE, done)


def forget(output_dir: str | Path, *stages: str) -> None:
    """Mark `stages` as not done: a run trained further must train, record, card and push again."""
    done = read_stages(output_dir)
    if any(s in done for s in stages):
        write_json(Path(output_dir) / STAGES_FILE, {k: v for k, v in done.items() if k not in stages})


def check_output_dir(
    output_dir: str | Path,
    record: dict,
    *,
    resume: bool,
    overwrite: bool,
    identity: Callable[[dict], dict] | None = None,
    may_grow: Collection[str] = (),
    wanted: Collection[str] | dict[str, dict] = ("records",),
    resumed: bool = False,
) -> dict[str, tuple[Any, Any]]:
    """Refuse to write into a directory that holds something else, saying what to do. `identity` (what made
    `record`) is applied to the saved record too; `may_grow`: settings ("training.max_steps") a resumption may raise,
    returned as {name: (saved, new)}. The same run with every stage of `wanted` complete (with the values given, as
    {"push": {"repo_id": ...}}) is `RunFinished`. `resumed`: --resume_from_checkpoint was given, so that
    --overwrite_output_dir keeps this run (a requeued job) and moves aside only another."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"--output_dir {out} is a file; choose a folder (new or a run's).")
    if holds_nothing(out):
        return {}
    if overwrite:  # another run, or a folder that holds none, is moved aside (`move_aside`); this run resumed is kept
        with contextlib.suppress(FileExistsError):
            if resumed:
                return check_output_dir(
                    out, record, resume=resume, overwrite=False, identity=identity, may_grow=may_grow, wanted=wanted
                )
        return {}
    saved = out / RUN_CONFIG
    if not saved.exists():
        raise FileExistsError(
            f"{out} is not empty and holds no bert_repro run ({RUN_CONFIG} missing). Choose another output_dir, "
            "or pass --overwrite_output_dir true to write into it anyway."
        )
    try:
        old = json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # damaged since it was written
        raise FileExistsError(
            f"{saved} cannot be read ({err}), so this run cannot be told from another. If {out} holds this run, "
            f"delete {saved} (it is written again) and run the same command; else choose another output_dir."
        ) from None
    changes = _changes(identity(old) if identity else old, identity(record) if identity else record)
    grown = {name: values for name, values in changes.items() if name in may_grow and _raised(values)}
    differences = [_said(name, v) for name, v in changes.items() if name not in grown or not resume]
    if differences:
        shown = "; ".join(differences[:6]) + (" ..." if len(differences) > 6 else "")
        if set(changes) <= set(may_grow) and all(map(_raised, changes.values())):  # only raised, without a resume
            flags = " ".join(f"--{name.split('.')[-1]} {new}" for name, (_, new) in changes.items())
            advice = f"To train that run further, pass {flags} with --resume_from_checkpoint true"
        elif set(changes) <= set(may_grow):
            advice = f"A resumption may only raise {', '.join('--' + n.split('.')[-1] for n in sorted(changes))}"
        else:
            advice = "To continue that run, keep its settings and inputs"
        raise FileExistsError(
            f"{out} holds a different run ({shown}). {advice}; for this one choose another --output_dir, or pass "
            "--overwrite_output_dir true to start again in this folder (what it holds is moved aside)."
        )
    done, need = read_stages(out), wanted if isinstance(wanted, dict) else dict.fromkeys(wanted, {})
    finished = all(s in done and all(done[s].get(k) == v for k, v in to.items()) for s, to in need.items())
    if finished and not grown and not resume:
        raise FileExistsError(
            f"{out} already holds this finished run ({RESULTS}); to publish it: python -m bert_repro.hub {out} "
            "--repo_id ID; to train it again, pass --overwrite_output_dir true."
        )
    if finished and not grown:
        further = (
            f" To train it further, raise {' or '.join('--' + n.split('.')[-1] for n in may_grow)}." if may_grow else ""
        )
        raise RunFinished(
            f"{out} already holds this run, finished ({RESULTS}): nothing to do, nothing written.{further}"
        )
    if "records" in done and not grown:
        return grown  # trained and recorded: the same command completes the later stages (the push)
    if any(out.glob("checkpoint-*")) and not resume:
        raise FileExistsError(
            f"{out} already holds checkpoints of this run; pass --resume_from_checkpoint true to continue it, or "
            "--overwrite_output_dir true to start again."
        )
    return grown


def holds_nothing(output_dir: Path) -> bool:
    """Whether `output_dir` holds nothing but the lock and leftovers of an interrupted write of ours."""
    return not output_dir.exists() or all(p.name == RUN_LOCK or is_leftover(p.name) for p in output_dir.iterdir())


def write_run_config(output_dir: str | Path, record: dict) -> None:
    """Create the output directory and record the run in it; an unwritable one is a `ConfigurationError`."""
    out = Path(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / RUN_CONFIG, record)
    except OSError as error:
        raise ConfigurationError(
            f"cannot write to the output directory {out}: {error.strerror or error} ({error.filename}). "
            "Choose another --output_dir, one you can write to."
        ) from None


# -- the lock: one run per output directory ------------------------------------------------------------------------

_HELD: dict[str, int] = {}  # output directory -> the lock's file descriptor, open until the process ends
_HOLDER: dict[str, int] = {}  # "pid": the process holding them, the parent of any child that inherits them


def _drop_locks_in_child() -> None:
    # Forked children share the lock's file description, and flock holds while any descriptor of it is open: the
    # orphans of a run killed with -9 would keep its directory locked. Closing the child's copy keeps the parent's
    # lock (LOCK_UN would release it for both).
    if not _HELD:
        return
    for fd in _HELD.values():
        os.close(fd)
    _HELD.clear()
    _end_with_parent()


def _end_with_parent() -> None:
    """A worker forked by a run dies with it (Linux), not waiting for work for ever. SIGKILL: a forked child
    inherits the run's SIGTERM handler, which saves instead of ending."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != _HOLDER["pid"]:  # the run ended before the signal was armed
            os._exit(1)


os.register_at_fork(after_in_child=_drop_locks_in_child)


def lock_output_dir(output_dir: str | Path) -> None:
    """Take `output_dir`'s `flock` for the rest of this process (the kernel releases it when the process dies), or
    raise a `ConfigurationError` naming its holder."""
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
    """Remove the lock file while still held (so that no other run takes it in between), then release it."""
    out = Path(output_dir)
    fd = _HELD.pop(str(out.resolve()), None)
    if fd is not None:
        (out / RUN_LOCK).unlink(missing_ok=True)
        os.close(fd)


def move_aside(output_dir: str | Path) -> Path | None:
    """`--overwrite_output_dir true`: a folder that holds a run renamed in one step to `<name>.replaced-<time>`
    (nothing deleted; through a symlink, its target) and made again, empty and locked, so that a kill never mixes the
    old run with the new. A folder that holds no run, or the working directory, is refused. Under this lock only."""
    out = Path(output_dir)
    key, real = str(out.resolve()), out.resolve()
    if key not in _HELD or holds_nothing(real):
        return None
    if not (real / RUN_CONFIG).exists():
        raise ConfigurationError(
            f"--overwrite_output_dir true: {out} holds files but no bert_repro run ({RUN_CONFIG} missing), so it is "
            "not moved aside; choose another --output_dir, or empty it yourself."
        )
    if Path.cwd().resolve().is_relative_to(real):
        raise ConfigurationError(
            f"--overwrite_output_dir true: {out} is the working directory or holds it, so it is not moved aside; "
            "choose a folder inside it as --output_dir, or run from elsewhere."
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = next(p for n in range(1000) if not (p := real.with_name(f"{real.name}.replaced-{stamp}-{n}")).exists())
    try:
        os.rename(real, aside)
    except OSError as error:
        raise ConfigurationError(
            f"--overwrite_output_dir true: cannot move {out} aside to {aside} ({error.strerror or error}); move or "
            "delete it yourself, or choose another --output_dir."
        ) from None
    fsync_dir(real.parent)
    old_lock = _HELD.pop(key)
    lock_output_dir(real)
    os.close(old_lock)
    kept = sorted(real.parent.glob(f"{real.name}.replaced-*"))
    logger.warning(
        "--overwrite_output_dir true: %s moved to %s (nothing deleted); %d folder(s) %s.replaced-* now hold %s: "
        "delete those you no longer need. Starting afresh",
        out,
        aside,
        len(kept),
        real.name,
        human_size(sum(map(folder_bytes, kept))),
    )
    return aside


def lock_output_dir_once(output_dir: str | Path, training, check, overwrite: bool = False, resumed: bool = False):
    """`lock_output_dir`, `move_aside` with `overwrite` (not when `resumed` and the folder holds this run: a requeued
    job goes on), then `check()` again, on the main process; every process raises its error, so that none waits for
    one that stopped."""
    error = None
    if training.process_index == 0:
        try:
            lock_output_dir(output_dir)
            if overwrite and not (resumed and _holds_this_run(check)):
                move_aside(output_dir)
            check()
        except (ConfigurationError, FileExistsError) as err:
            error = str(err)
    if training.world_size > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error], from_process=0)[0]
    if error is not None:
        raise ConfigurationError(error)


def _holds_this_run(check) -> bool:
    try:
        check(overwrite=False)
    except FileExistsError:
        return False
    except RunFinished:
        pass
    return True
