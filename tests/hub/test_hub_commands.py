"""The publishing commands on bad input: one line naming what is wrong and exit code 2 (or argparse's usage), never a
traceback, and never the Hub blamed for a local mistake."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from support.run_records import finetuning_run

from bert_repro.hub import model_card
from bert_repro.hub.push import main as push_main


def exit_2(main, argv, capsys) -> str:
    """What ``main(argv)`` prints on stderr, once it has exited with code 2."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err, err
    return err


def test_the_card_command_on_bad_input_is_one_line(tmp_path, capsys):
    assert exit_2(model_card.main, [], capsys).startswith("usage: python -m bert_repro.hub.model_card")
    (tmp_path / "empty").mkdir()
    out = finetuning_run(tmp_path, "mrpc", {"_main": "f1", "validation": {"f1": 0.8}}, [])
    cases = [
        ([str(tmp_path / "missing"), "a/b"], f"{tmp_path / 'missing'}: no such directory."),
        ([str(tmp_path / "empty"), "a/b"], "neither a pre-training run"),
        ([str(out), "not an id!"], "'not an id!'"),
    ]
    for argv, expected in cases:
        err = exit_2(model_card.main, argv, capsys)
        assert expected in err and len(err.strip().splitlines()) == 1, err
    for content, expected in (("{", "results.json: not a JSON record"), ('{"task": "paws", "best": {}}', "'paws'")):
        (out / "results.json").write_text(content)  # a torn record; a task this version does not know
        err = exit_2(model_card.main, [str(out), "a/b"], capsys)
        assert expected in err and len(err.strip().splitlines()) == 1, err
    assert not (out / "README.md").exists()


@pytest.mark.parametrize(
    "checkpoints",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.xfail(
                strict=True,
                reason="push_checkpoints asks the Hub before it looks at the folder (bert_repro/hub/push.py, owned "
                "elsewhere): once it checks the folder first, this passes and the marker goes",
            ),
        ),
    ],
)
def test_a_push_of_a_missing_folder_names_the_folder_not_the_hub(tmp_path, capsys, checkpoints):
    missing = tmp_path / "missing" / "folder"
    err = exit_2(push_main, [str(missing), "--repo_id", "x/y", *(["--checkpoints"] if checkpoints else [])], capsys)
    assert err == f"error: {missing}: no such directory.\n"
