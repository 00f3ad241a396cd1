"""What a transformers user meets in a first hour with the project: files that carry this machine's state, warnings
about our own shipped files, messages printed once per process."""

import json
import re

import pytest
from support import ROOT
from support.models import tiny_config
from transformers import AutoTokenizer

from bert_repro import BertReproForPreTraining
from bert_repro.data.wordpiece import load_tokenizer, save_tokenizer, train_wordpiece
from bert_repro.hub.push import stage
from bert_repro.training.lifecycle import RunFinished, main

LOAD_TIME_KEYS = {"local_files_only", "is_local"}  # what an offline from_pretrained adds to init_kwargs


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    texts = ["the cat sat on the mat.", "a dog ran in the park."] * 20
    save_tokenizer(train_wordpiece(iterator=texts, vocab_size=60, show_progress=False), directory)
    return directory


def test_a_saved_tokenizer_carries_no_load_time_keys(tmp_path, tokenizer_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the load then sets local_files_only
    save_tokenizer(load_tokenizer(tokenizer_dir), tmp_path)
    assert not LOAD_TIME_KEYS & set(json.loads((tmp_path / "tokenizer_config.json").read_text()))
    assert AutoTokenizer.from_pretrained(tmp_path).tokenize("the cat") == ["the", "cat"]


def test_a_push_cleans_a_tokenizer_config_saved_before(tmp_path, tokenizer_dir):
    run = tmp_path / "run"
    BertReproForPreTraining(tiny_config(vocab_size=60)).save_pretrained(run)
    save_tokenizer(load_tokenizer(tokenizer_dir), run)
    config = json.loads((run / "tokenizer_config.json").read_text())
    (run / "tokenizer_config.json").write_text(json.dumps({**config, "local_files_only": True, "is_local": True}))
    (tmp_path / "staged").mkdir()
    stage(run, "someone/model", tmp_path / "staged", with_card=False)
    assert not LOAD_TIME_KEYS & set(json.loads((tmp_path / "staged" / "tokenizer_config.json").read_text()))
    assert AutoTokenizer.from_pretrained(tmp_path / "staged").tokenize("the cat") == ["the", "cat"]


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_finished_run_is_announced_by_the_first_process_only(rank, monkeypatch, capsys):
    # every process of a launch finds the run finished; the line is the run's, not each process's
    def finished():
        raise RunFinished("runs/x already holds this run, finished")

    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit):
        main("pretrain.py", finished, ())
    said = capsys.readouterr().err.splitlines()
    assert said == (["pretrain.py: runs/x already holds this run, finished"] if rank == "0" else [])


def launch_commands() -> list[tuple[str, list[str]]]:
    """(file, the arguments before the script) of every `accelerate launch ... script.py` the README, the guides in
    docs/ and the recipes show (`$VARIABLES` as 0: the node rank and address of a multi-node command)."""
    found = []
    shown = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for path in [*shown, *sorted((ROOT / "recipes").rglob("*.py")), *sorted(ROOT.glob("recipes/*/*.yaml"))]:
        text = path.read_text().replace("\\\n", " ")
        for match in re.finditer(r"accelerate launch((?:\s+[^\s`]+)*?)\s+\S+\.py\b", text):
            found.append((path.name, ["0" if a.startswith("$") else a for a in match.group(1).split()]))
    return found


def test_our_launch_commands_pass_what_accelerate_asks_for(monkeypatch, caplog):
    """Every launch command we show gives what accelerate would otherwise fill in with five lines of warning ("The
    following values were not passed ..."), by accelerate's own validation, on a fresh machine (no `accelerate
    config`) and with OMP_NUM_THREADS set (else a many-core machine gets a line on the threads chosen)."""
    from accelerate.commands import launch

    monkeypatch.chdir(ROOT)  # the configs and their DeepSpeed JSON are named from the repository root
    monkeypatch.setattr(launch, "default_config_file", str(ROOT / "no-accelerate-config.yaml"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    commands = launch_commands()
    assert len(commands) > 5 and {"pretraining.md", "clusters.md"} <= {where for where, _ in commands}
    for where, arguments in commands:
        caplog.clear()
        launch._validate_launch_command(launch.launch_command_parser().parse_args([*arguments, "x.py"]))
        assert "were not passed" not in caplog.text, (where, arguments)


def test_the_first_screen_says_which_class_auto_model_gives(tmp_path):
    """`import bert_repro` registers our classes, yet AutoModel opens our checkpoints as transformers' BertModel (they
    are saved in its format on purpose): the README's first screen says so, with the one line that gives ours."""
    from transformers import AutoModel

    import bert_repro

    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    ours = re.search(r"`(model = \w+\.from_pretrained\(path\))`", first_screen)
    assert "`AutoModel.from_pretrained(path)`" in first_screen and "`BertModel`" in first_screen and ours
    bert_repro.BertReproForPreTraining(tiny_config()).save_pretrained(tmp_path)
    assert type(AutoModel.from_pretrained(tmp_path)).__name__ == "BertModel"
    scope = {**vars(bert_repro), "path": tmp_path}
    exec(ours.group(1), scope)
    assert type(scope["model"]) is bert_repro.BertReproModel
