"""What a kill leaves behind: files written whole or not at all (`bert_repro.atomic`), the tokenizer a run keeps
made again (or named) when it cannot be read, leftovers that do not block the next run, and push staging folders
that the next push removes. The kill itself, at every write point of real runs: tests/e2e/test_crash_consistency.py."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from bert_repro.atomic import FILE_MODE, atomic_path, write_json, write_text
from bert_repro.data.wordpiece import load_tokenizer, save_tokenizer
from bert_repro.hub.push import STAGING_PREFIX, remove_stranded_staging
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.lifecycle import check_output_dir
from bert_repro.training.pretraining.examples import TOKENIZER_DIR, get_tokenizer


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    path = write_json(tmp_path / "results.json", {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and path.stat().st_mode & 0o777 == FILE_MODE
    with pytest.raises(RuntimeError), atomic_path(path) as temporary:
        temporary.write_text('{"a": ')
        raise RuntimeError("killed")
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    (tmp_path / ".results.json.partial-999999").write_text("")  # what a SIGKILL leaves
    write_text(path, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_folder_with_only_leftovers_is_empty_and_an_unreadable_record_is_named(tmp_path):
    record = {"run": {"preset": "tiny"}}
    (tmp_path / ".run_config.json.partial-123").write_text("")
    (tmp_path / ".saving").mkdir()
    check_output_dir(tmp_path, record, resume=False, overwrite=False)  # nothing of a run there: no refusal
    (tmp_path / "run_config.json").write_text("")  # cut short by a kill under an earlier version
    with pytest.raises(FileExistsError, match="run_config.json cannot be read .*delete .*run_config.json"):
        check_output_dir(tmp_path, record, resume=True, overwrite=False)


def test_an_unreadable_kept_tokenizer_is_made_again_or_named(tmp_path, corpus_and_tokenizer):
    _, given = corpus_and_tokenizer
    cached = tmp_path / TOKENIZER_DIR
    save_tokenizer(load_tokenizer(given), cached)
    assert (cached / "tokenizer.json").stat().st_mode & 0o777 == FILE_MODE
    (cached / "tokenizer.json").write_bytes(b"")  # what the in-place save of earlier versions left
    run = SimpleNamespace(tokenizer=str(given), vocab_size=120, lowercase=True)
    tokenizer = get_tokenizer(run, None, tmp_path)  # made again from --tokenizer
    assert tokenizer.get_vocab() == load_tokenizer(given).get_vocab() == load_tokenizer(cached).get_vocab()
    (cached / "tokenizer.json").write_bytes(b"")
    (tmp_path / "checkpoint-2").mkdir()  # trained with the vocabulary that a new training would not give again
    with pytest.raises(ConfigurationError, match=r"tokenizer cannot be read .*--overwrite_output_dir true"):
        get_tokenizer(SimpleNamespace(tokenizer=None, vocab_size=120, lowercase=True), None, tmp_path)


def test_the_next_push_removes_a_killed_push_staging(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stranded = tmp_path / f"{STAGING_PREFIX}{gone.stdout.strip()}-abc"
    live = tmp_path / f"{STAGING_PREFIX}{os.getpid()}-def"  # a push in progress
    for folder in (stranded, live):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"0" * 100)
    assert remove_stranded_staging() == [stranded]
    assert not stranded.exists() and live.exists()
    assert Path(tempfile.gettempdir()) == tmp_path
