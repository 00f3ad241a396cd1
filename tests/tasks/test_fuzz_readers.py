"""Every task and corpus reader, fed damaged files, parses or raises its own error (one line, exit 2), nothing else."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.task_files import GLUE_FIXTURES, fixture_files, write

from bert_repro.data.corpus import CorpusError, load_corpus
from bert_repro.data.wordpiece import load_tokenizer
from bert_repro.tasks.columns import TaskDataError
from bert_repro.tasks.files import load_task_data
from bert_repro.training.cli import ConfigurationError, read_yaml_config
from bert_repro.training.finetuning.recipe import FineTuningArguments

# One fixture per reader: GLUE TSVs (one and two sentences), SQuAD v1.1 / v2.0 JSON, SWAG CSV, CoNLL-2003.
READERS = ["sst2", "mrpc", "mnli", "squad", "squad_v2", "swag", "conll2003"]
FUZZ = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def damage(data: bytes, seed: int) -> bytes:
    """`data` with one to three random edits: bytes overwritten, cut, repeated or inserted, or the tail cut off."""
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not out:
            break
        i = rng.randrange(len(out))
        j = min(len(out), i + rng.randint(1, 16))
        edit = rng.choice(("overwrite", "cut", "repeat", "insert", "truncate"))
        if edit == "overwrite":
            out[i:j] = bytes(rng.randrange(256) for _ in range(j - i))
        elif edit == "cut":
            del out[i:j]
        elif edit == "repeat":
            out[i:i] = out[i:j]
        elif edit == "insert":
            out[i:i] = rng.choice((b"\t", b"\n", b'"', b",", b"{", b"]", b"\x00", b"\xff\xfe", "é".encode()))
        else:
            del out[i:]
    return bytes(out)


def rows(data) -> dict:
    return {split: data[split].to_list() for split in data}


@pytest.mark.parametrize("name", READERS)
@FUZZ
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 2))
def test_a_damaged_task_file_is_parsed_or_one_clear_error(name, seed, which, tmp_path_factory):
    files = fixture_files(name)
    target = sorted(files)[which % len(files)]
    folder = tmp_path_factory.mktemp(name)
    write(folder, files)
    (folder / target).write_bytes(damage(files[target].encode("utf-8"), seed))
    try:
        load_task_data(name, folder)
    except TaskDataError as err:
        assert str(err).strip(), "an error without a message"


@pytest.mark.parametrize("name", READERS)
def test_a_bom_and_crlf_line_ends_read_as_the_original(name, tmp_path):
    files = fixture_files(name)
    original = rows(load_task_data(name, write(tmp_path / "plain", files)))
    for variant, encode in (
        ("bom", lambda t: "\ufeff" + t.lstrip("\ufeff")),
        ("crlf", lambda t: t.replace("\r\n", "\n").replace("\n", "\r\n")),
    ):
        folder = write(tmp_path / variant, {k: encode(v) for k, v in files.items()})
        assert rows(load_task_data(name, folder)) == original, variant


def test_extra_columns_are_ignored_and_a_missing_split_is_absent(tmp_path):
    files = dict(GLUE_FIXTURES["sst2"][0])
    extra = {k: "\n".join(line + "\textra" for line in v.rstrip("\n").split("\n")) + "\n" for k, v in files.items()}
    assert rows(load_task_data("sst2", write(tmp_path / "extra", extra))) == rows(
        load_task_data("sst2", write(tmp_path / "plain", files))
    )
    only_train = write(tmp_path / "train_only", {"train.tsv": files["train.tsv"]})
    assert list(load_task_data("sst2", only_train)) == ["train"]


CORPUS_TEXT = "A first sentence. A second one here.\n\nAnother document, with one line.\n"


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv", ".tsv", ".parquet"])
@FUZZ
@given(seed=st.integers(0, 2**32 - 1))
def test_a_damaged_corpus_file_is_read_or_one_clear_error(suffix, seed, tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    path = folder / f"corpus{suffix}"
    documents = [d for d in CORPUS_TEXT.split("\n\n") if d.strip()]
    if suffix == ".txt":
        valid = CORPUS_TEXT.encode()
    elif suffix == ".jsonl":
        valid = "".join(json.dumps({"text": d}) + "\n" for d in documents).encode()
    elif suffix in (".csv", ".tsv"):
        sep = "," if suffix == ".csv" else "\t"
        valid = (
            "text\n" + "".join(f'"{d}"\n' if sep == "," else d.replace("\n", " ") + "\n" for d in documents)
        ).encode()
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": documents}), path)
        valid = path.read_bytes()
    path.write_bytes(damage(valid, seed))
    try:
        load_corpus(str(path))
    except CorpusError as err:
        assert str(err).strip()


@FUZZ
@given(seed=st.integers(0, 2**32 - 1))
def test_a_damaged_config_file_is_read_or_one_clear_error(seed, tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "run.yaml"
    valid = "task: mrpc\nlearning_rates: [2.0e-5, 3.0e-5]\nseeds: [1, 2]\nmax_seq_length: 128\n"
    path.write_bytes(damage(valid.encode(), seed))
    try:
        read_yaml_config(path, (FineTuningArguments,), "recipes/finetune.py")
    except (ConfigurationError, FileNotFoundError) as err:
        assert str(err).strip()


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.txt"])
@FUZZ
@given(seed=st.integers(0, 2**32 - 1))
def test_a_damaged_tokenizer_file_loads_or_is_one_clear_error(name, seed, tmp_path_factory):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "on", "mat"]
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n")
    valid = vocab.read_text() if name == "vocab.txt" else load_tokenizer(vocab).backend_tokenizer.to_str()
    folder = tmp_path_factory.mktemp("tokenizer")
    (folder / name).write_bytes(damage(valid.encode(), seed))
    try:
        load_tokenizer(folder)
    except (ValueError, FileNotFoundError) as err:  # the recipes print these as one line
        assert str(err).strip()
