"""An emulated device machine (benchmarks/gpu/run_gpu.sh's conditions, without CUDA)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

# The image's Python lacks these (the kit brings their wheels); `missing=IMAGE_LACKS` hides them from this one.
IMAGE_LACKS = ("datasets", "dill", "multiprocess", "torchao")
# Run at the start of every Python of the emulated machine: a package hidden is importable only from the folder
# run_gpu.sh unpacks the kit's wheels into (SITE).
HIDE = """import importlib.machinery, os, sys
site = [p for p in sys.path if p and p.startswith(os.environ["SITE"])]
for name in {names!r}:
    if importlib.machinery.PathFinder.find_spec(name, site) is None:
        sys.modules[name] = None  # import fails, importlib.util.find_spec says None
"""


@contextlib.contextmanager
def device_machine_env(tmp_path: Path, missing: tuple[str, ...] = (), **settings: str):
    """benchmarks/gpu/run_gpu.sh's environment on a lent GPU machine, CUDA aside: a network that never answers, a
    `python` on PATH without torch, OUT and RESULTS in `tmp_path`, `settings` added; `tmp_path / "bin"` takes more
    stand-ins. `missing`: what the image's `python3` lacks unless run_gpu.sh unpacks it into `tmp_path / "site"`."""
    import socket

    hole = socket.socket()  # a black hole: connections are accepted into the backlog, no byte ever comes back
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text("#!/bin/sh\necho 'No module named torch' >&2\nexit 1\n")
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PIP_", "TRANSFORMERS_"))}
    env.update(dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "HF_ENDPOINT"), url))
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}",
        PIP_INDEX_URL=f"{url}/simple",
        OUT=str(tmp_path / "out"),
        RESULTS=str(tmp_path / "results"),
        HF_HOME=str(tmp_path / "hf_home"),  # a fresh machine's own cache, never the user's
    )
    env.update({"KIT": str(tmp_path / "no-kit"), "SITE": str(tmp_path / "site"), **settings})
    if missing:
        hide = tmp_path / "hide"
        hide.mkdir(exist_ok=True)
        (hide / "sitecustomize.py").write_text(HIDE.format(names=tuple(missing)))
        python = Path(sys.executable).parent / "python3"
        wrapper = f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{hide}" exec {python} "$@"\n'
        (bin_dir / "python3").write_text(wrapper)
        (bin_dir / "python3").chmod(0o755)
    try:
        yield env
    finally:
        hole.close()
