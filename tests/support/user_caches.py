"""The caches the libraries write (Hugging Face's Hub, datasets and remote-code caches, torch's compiled kernels,
Triton's, matplotlib's fonts, Keras's settings) moved into the test session's temporary folder, and the user's own
measured before and after the session (tests/conftest.py)."""

import contextlib
import getpass
import os
import re
import sys
import tempfile
from pathlib import Path

# Variables that place a Hugging Face cache apart from HF_HOME: a user's value would send the tests there.
HF_PLACES = "HF_HUB_CACHE HUGGINGFACE_HUB_CACHE HF_ASSETS_CACHE HF_XET_CACHE HF_DATASETS_CACHE HF_MODULES_CACHE".split()


def user_caches() -> list[Path]:
    """The folders the libraries would use with the environment as it is, before `isolate`."""
    cache = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())  # as torch names its folder
    places = [
        *(os.environ.get("HF_HOME") or f"{cache}/huggingface", os.environ.get("MPLCONFIGDIR") or f"{cache}/matplotlib"),
        *(os.environ[name] for name in HF_PLACES if name in os.environ),
        os.environ.get("KERAS_HOME") or "~/.keras",  # tensorflow's Keras writes its keras.json on import
        os.environ.get("BERT_REPRO_CACHE") or f"{cache}/bert_repro",  # our inputs' fingerprints (training/lifecycle.py)
        os.environ.get("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")),
        os.environ.get("TRITON_CACHE_DIR", os.path.join(os.environ.get("TRITON_HOME", "~"), ".triton", "cache")),
    ]
    return sorted({Path(os.path.expandvars(place)).expanduser() for place in places})


def isolate(folder: Path) -> None:
    """Every cache in `folder`, for this process and those it starts. The Hugging Face libraries read the variables
    at import: they must not be imported yet."""
    if imported := {"huggingface_hub", "datasets", "transformers"} & set(sys.modules):
        raise RuntimeError(f"{imported} imported before the caches were moved: they would use the user's caches")
    for name in HF_PLACES:
        os.environ.pop(name, None)
    hf = folder / "huggingface"
    os.environ.update(HF_HOME=str(hf), HF_HUB_CACHE=str(hf / "hub"), HF_DATASETS_CACHE=str(hf / "datasets"))
    os.environ.update(TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"), TRITON_CACHE_DIR=str(folder / "triton"))
    os.environ.update(MPLCONFIGDIR=str(folder / "matplotlib"), KERAS_HOME=str(folder / "keras"))
    os.environ["BERT_REPRO_CACHE"] = str(folder / "bert_repro")


def files(folders: list[Path]) -> dict[str, int]:
    """Every file under `folders` -> its size (one removed meanwhile left out: other processes share these)."""
    found = {}
    for parent, _, names in (walked for folder in folders for walked in os.walk(folder)):
        for path in (os.path.join(parent, name) for name in names):
            with contextlib.suppress(OSError):
                found[path] = os.lstat(path).st_size
    return found


def compared(folders: list[Path], before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The summary's lines: the user's caches unchanged, or what the session added."""
    size = lambda found: f"{len(found):,} files, {sum(found.values()) / 1e6:,.1f} MB"  # noqa: E731
    if before == after:
        return [f"unchanged: {size(after)} in {', '.join(map(str, folders))}"]
    return [
        f"CHANGED: {size(before)} before, {size(after)} after in {', '.join(map(str, folders))}: a test wrote outside "
        "its temporary folder, or another process wrote there meanwhile. New files, the first five:",
        *sorted(set(after) - set(before))[:5],
    ]
