"""The Hub out of reach: one short request, then one line naming --data / --corpus (not datasets' ~23 s of retries)."""

import logging
import time

import datasets
import pytest
from huggingface_hub import constants

from bert_repro.data.corpus import CorpusError, load_corpus
from bert_repro.tasks.columns import TaskDataError
from bert_repro.tasks.files import load_task_data

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path):
    for module in (constants, datasets.config):
        monkeypatch.setattr(module, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", CLOSED)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # nothing cached


def test_a_task_without_data_names_data(unreachable_hub, caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(TaskDataError) as raised:
        load_task_data("mrpc", None)
    assert time.monotonic() - start < 10
    message = str(raised.value)
    assert "--data" in message and f"{CLOSED} did not answer" in message and "\n" not in message
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == len(set(warnings)) <= 1  # no retry storm


def test_a_hub_corpus_names_corpus(unreachable_hub):
    start = time.monotonic()
    with pytest.raises(CorpusError, match=f"{CLOSED} did not answer.*--corpus"):
        load_corpus("someone/corpus")
    assert time.monotonic() - start < 10
