"""The caches the libraries write (Hugging Face's Hub, datasets and remote-code caches, torch's compiled kernels,
Triton's, matplotlib's fonts) moved into the test session's temporary folder, and the user's own measured before and
after the session (tests/conftest.py): a test that writes to them shows in the summary."""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import sys
import tempfile
from pathlib import Path

# Variables that place a cache of their own apart from HF_HOME: a user's value would send the tests there.
HF_PLACES = (
    *("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HUGGINGFACE_ASSETS_CACHE", "HF_XET_CACHE"),
    *("HF_DATASETS_CACHE", "HF_MODULES_CACHE", "TRANSFORMERS_CACHE", "HF_TOKEN_PATH"),
)


def user_caches() -> list[Path]:
    """Where the caches are with the environment as it is, before `isolate`: the folders the libraries would use."""
    cache = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())  # as torch names its folder
    places = [
        os.environ.get("HF_HOME") or os.path.join(cache, "huggingface"),
        os.environ.get("MPLCONFIGDIR") or os.path.join(cache, "matplotlib"),
        *(os.environ[name] for name in HF_PLACES if name != "HF_TOKEN_PATH" and name in os.environ),
        os.environ.get("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")),
        os.environ.get("TRITON_CACHE_DIR", os.path.join(os.environ.get("TRITON_HOME", "~"), ".triton", "cache")),
    ]
    return sorted({Path(os.path.expandvars(place)).expanduser() for place in places})


def isolate(folder: Path) -> None:
    """Every cache in `folder`, for this process and the processes it starts. The Hugging Face libraries read
    these variables once, at import: they must not be imported yet."""
    imported = [name for name in ("huggingface_hub", "datasets", "transformers") if name in sys.modules]
    if imported:
        raise RuntimeError(f"{imported} imported before the caches were moved: they would use the user's caches")
    for name in HF_PLACES:
        os.environ.pop(name, None)
    os.environ.update(
        HF_HOME=str(folder / "huggingface"),
        HF_HUB_CACHE=str(folder / "huggingface" / "hub"),
        HF_DATASETS_CACHE=str(folder / "huggingface" / "datasets"),
        TORCHINDUCTOR_CACHE_DIR=str(folder / "torchinductor"),
        TRITON_CACHE_DIR=str(folder / "triton"),
        MPLCONFIGDIR=str(folder / "matplotlib"),
    )


def files(folders: list[Path]) -> dict[str, int]:
    """Every file under `folders` -> its size (files removed while walking are left out)."""
    found = {}
    for folder in folders:
        for parent, _, names in os.walk(folder):
            for name in names:
                with contextlib.suppress(OSError):
                    found[os.path.join(parent, name)] = os.lstat(os.path.join(parent, name)).st_size
    return found


def compared(folders: list[Path], before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The summary's lines: the user's caches unchanged, or what the session added."""
    where = ", ".join(map(str, folders))
    size = lambda found: f"{len(found):,} files, {sum(found.values()) / 1e6:,.1f} MB"  # noqa: E731
    if before == after:
        return [f"unchanged: {size(after)} ({where})"]
    new = sorted(set(after) - set(before))
    return [
        f"CHANGED during the session: {size(before)} before, {size(after)} after ({where}); a test wrote outside its "
        "temporary folder, or another process wrote there meanwhile. New files, the first five:",
        *new[:5],
    ]
