"""The tests never touch the user's caches: the libraries here, in xdist's workers and in the processes the tests
start find theirs in the session's temporary folder (tests/conftest.py, support/user_caches.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path


def places() -> list[str]:
    """Where the Hub client, datasets, transformers' remote code, torch's compiler, Triton and matplotlib put their
    caches."""
    import datasets.config as data
    import huggingface_hub.constants as hub
    import transformers.utils.hub as code

    found = [hub.HF_HOME, hub.HF_HUB_CACHE, hub.HF_ASSETS_CACHE, hub.HF_XET_CACHE, hub.HF_TOKEN_PATH]
    found += [str(data.HF_DATASETS_CACHE), str(data.HF_MODULES_CACHE), code.HF_MODULES_CACHE]
    return found + [
        os.environ.get(name, f"{name} unset")
        for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MPLCONFIGDIR")
    ]


def test_every_cache_is_in_the_sessions_temporary_folder(tmp_path_factory):
    child = f"import json, sys; sys.path[:0] = [{str(Path(__file__).parent)!r}]; import test_caches as t; "
    here = places()
    started = subprocess.run(
        [sys.executable, "-c", child + "print(json.dumps(t.places()))"], capture_output=True, text=True, check=True
    )
    folder = tmp_path_factory.getbasetemp()
    for place in here + json.loads(started.stdout):
        assert Path(place).is_relative_to(folder), place
