"""An emulated device machine (benchmarks/gpu/run_gpu.sh's conditions, without CUDA)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def device_machine_env(tmp_path: Path, **settings: str):
    """The environment of benchmarks/gpu/run_gpu.sh on a lent GPU machine, CUDA aside: a network that accepts
    connections and never answers (Hub, package index, proxies), a `python` first on PATH that is not the one with
    torch (a symlink that lost its venv), OUT and RESULTS in `tmp_path`, no kit; `settings` added. Its bin folder
    (`tmp_path / "bin"`) takes more stand-ins."""
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
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}",
        HTTP_PROXY=url,
        HTTPS_PROXY=url,
        http_proxy=url,
        https_proxy=url,
        HF_ENDPOINT=url,
        PIP_INDEX_URL=f"{url}/simple",
        OUT=str(tmp_path / "out"),
        RESULTS=str(tmp_path / "results"),
        KIT=str(tmp_path / "no-kit"),
        **settings,
    )
    try:
        yield env
    finally:
        hole.close()
