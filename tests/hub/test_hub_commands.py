"""`python -m bert_repro.hub` on a missing folder: one line naming it and exit code 2, never the Hub blamed for a local
mistake (the card command's bad input: test_model_card.py)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from bert_repro.hub.push import main

# push_checkpoints asks the Hub before it looks at the folder (bert_repro/hub/push.py, owned elsewhere): once it checks
# the folder first, that case passes and its marker goes.


@pytest.mark.parametrize("flags", [[], ["--checkpoints"]])
def test_a_push_of_a_missing_folder_names_the_folder_not_the_hub(tmp_path, capsys, flags):
    missing = tmp_path / "missing" / "folder"
    with pytest.raises(SystemExit) as exited:
        main([str(missing), "--repo_id", "x/y", *flags])
    assert exited.value.code == 2 and capsys.readouterr().err == f"error: {missing}: no such directory.\n"
