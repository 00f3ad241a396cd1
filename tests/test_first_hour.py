"""What a transformers user meets in a first hour with the project (issue 45): files that carry this machine's
state, warnings about our own shipped files, messages printed once per process."""

import json

import pytest
from helpers import tiny_config
from transformers import AutoTokenizer

from bert_repro import BertReproForPreTraining
from bert_repro.data.wordpiece import load_tokenizer, save_tokenizer, train_wordpiece
from bert_repro.hub.push import stage
from bert_repro.training.cli import RunFinished

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
    monkeypatch.setenv("RANK", rank)
    RunFinished("runs/x already holds this run, finished").say("pretrain.py")
    said = capsys.readouterr().err.splitlines()
    assert said == (["pretrain.py: runs/x already holds this run, finished"] if rank == "0" else [])
