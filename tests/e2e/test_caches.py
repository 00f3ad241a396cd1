"""The libraries find their caches in the session's temporary folder, here (an xdist worker) and in a process a test
starts: never the user's (tests/conftest.py, support/user_caches.py)."""

import json
import os
import subprocess
import sys

PLACES = """import json, os, datasets.config as d, huggingface_hub.constants as h, transformers.utils.hub as t
print(json.dumps([h.HF_HOME, h.HF_HUB_CACHE, h.HF_ASSETS_CACHE, h.HF_XET_CACHE, str(d.HF_DATASETS_CACHE),
    str(d.HF_MODULES_CACHE), t.HF_MODULES_CACHE, *(os.environ.get(name, name) for name in
    ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MPLCONFIGDIR", "KERAS_HOME"))]))"""


def test_every_cache_is_in_the_sessions_temporary_folder(tmp_path_factory, capsys):
    exec(PLACES)  # here, first: the libraries' constants as the test modules imported them
    here = json.loads(capsys.readouterr().out)
    started = json.loads(subprocess.run([sys.executable, "-c", PLACES], capture_output=True, check=True).stdout)
    for place in here + started:
        assert os.path.abspath(place).startswith(f"{tmp_path_factory.getbasetemp()}/"), place
