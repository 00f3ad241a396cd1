"""Every file a run writes is whole or not there (a kill mid-`Path.write_text` leaves a truncated file).

A file is written as `.NAME.partial-PID` beside its target, fsynced, given the umask's mode and renamed over it.
Folders that libraries write (`save_pretrained`, Trainer's checkpoints) are staged beside their target and moved in
when complete; `settle` fixes their modes, since safetensors writes 600 whatever the umask. `is_leftover` names what a
kill leaves, so a folder of leftovers counts as empty.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PARTIAL = ".partial-"
STAGING = ".saving"  # a folder written by a library, moved to its name when complete


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: set it straight back
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()
DIR_MODE = 0o777 & ~_umask()


def process_alive(pid: int) -> bool:
    """Whether process `pid` is running on this machine (its temporary files are not leftovers)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def is_leftover(name: str) -> bool:
    """Whether `name` is what an interrupted write of ours leaves: a temporary file or a staging folder."""
    return PARTIAL in name or name == STAGING or name.startswith(STAGING + "-")


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in `folder` durable (the directory entry, not only the file's data)."""
    with contextlib.suppress(OSError):  # some file systems (and Windows) cannot open a folder
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _flush(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, FILE_MODE)


def settle(path: str | os.PathLike) -> None:
    """Fsync a file (or a folder's files) a library wrote, and give it the umask's mode (safetensors writes 600)."""
    path = Path(path)
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if item.is_symlink():
            continue
        if item.is_dir():
            os.chmod(item, DIR_MODE)
            continue
        _flush(item)


def move_into(staging: Path, target: Path, *, last: tuple[str, ...] = ()) -> list[Path]:
    """Move `staging`'s contents into `target`, each settled and renamed whole, the names in `last` (what a reader
    checks for) last; return the moved paths."""
    moved = []
    for path in sorted(staging.iterdir(), key=lambda p: (p.name in last, p.name)):
        settle(path)
        os.replace(path, target / path.name)
        moved.append(target / path.name)
    fsync_dir(target)
    staging.rmdir()
    return moved


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` for any writer (`torch.save`, `savefig`): renamed to `path` if the block succeeds,
    else removed."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}{PARTIAL}*"):
        # a killed write's, not a live process's (ranks of a multi-process run write the same record)
        writer = stale.name.rsplit(PARTIAL, 1)[1]
        if not (writer.isdigit() and process_alive(int(writer))):
            stale.unlink(missing_ok=True)
    temporary = path.with_name(f".{path.name}{PARTIAL}{os.getpid()}")
    try:
        yield temporary
        _flush(temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8, lines as given) to `path`, whole or not at all."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(text.encode("utf-8"))
    return Path(path)


def write_json(path: str | os.PathLike, value: Any, *, indent: int | None = 2, **dumps: Any) -> Path:
    """`json.dumps(value)` written to `path`, whole or not at all."""
    return write_text(path, json.dumps(value, indent=indent, **dumps))
