"""``tokenize_documents`` against the tokenizer called one sentence at a time, on every kind of row readers pass on."""

import datasets
import pytest
from support.corpora import pseudo_text, wordpiece_tokenizer

from bert_repro.data import tokenized_documents
from bert_repro.data.balanced_map import _balanced_order
from bert_repro.data.sentences import bound_sentences, split_sentences
from bert_repro.data.tokenized_documents import (
    DOCUMENT_FEATURES,
    _as_text,
    _text_bytes,
    _tokenize_batch,
    _tokenize_table,
    tokenize_documents,
)

ZERO_WIDTH = "\u200b\u200b"  # a line that is not blank but that BERT's normaliser removes whole

TEXTS = [
    "Kalo mitor ren. Velsha tor!\nDon ex pu\nDon",  # with split_lines, a sentence of one token
    f"Kalo mitor ren\n{ZERO_WIDTH}\nVelsha tor",  # its second line tokenizes to nothing
    ZERO_WIDTH,  # nothing but that line: empty
    "",
    None,
    "  \n\t ",
    "\x00 a NUL byte",
    "velsha " * 300,  # 2,100 characters without sentence punctuation: cut into pieces
    "Literal [SEP] and [MASK] stay text. Two.",
]
SKIPS = ["", "", "empty", "empty", "empty", "empty", "binary", "", ""]
LONG = [0, 0, 0, 0, 0, 0, 0, 1, 0]


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece_tokenizer(pseudo_text(10), vocab_size=150)


def sentence_ids(text, tokenizer, split_lines):
    """The ids of each sentence of ``text``, the tokenizer called on one sentence at a time."""
    sentences, _ = bound_sentences(split_sentences(text, split_lines=split_lines, max_sentence_chars=None))
    ids = [tokenizer(s, add_special_tokens=False, split_special_tokens=True)["input_ids"] for s in sentences]
    return [i for i in ids if i]


@pytest.mark.parametrize("split_lines", [False, True])
@pytest.mark.parametrize("slice_size", [None, 1, 2])
def test_each_row_is_its_sentences_ids(tokenizer, monkeypatch, split_lines, slice_size):
    if slice_size:
        monkeypatch.setattr(tokenized_documents, "_ENCODE_SLICE", slice_size)
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": TEXTS}), tokenizer, split_lines=split_lines)
    assert docs.features == DOCUMENT_FEATURES
    rows = docs.to_list()
    assert [r["skip_reason"] for r in rows] == SKIPS and [r["long_sentences"] for r in rows] == LONG
    for row, text, skip in zip(rows, TEXTS, SKIPS, strict=True):
        expected = [] if skip else sentence_ids(text, tokenizer, split_lines)
        assert row["sentences"] == expected
        assert row["num_sentences"] == len(expected)
        assert row["num_tokens"] == sum(map(len, expected))
    assert len(rows[0]["sentences"]) == (4 if split_lines else 3)
    assert [len(s) for s in rows[0]["sentences"]][-1] == (1 if split_lines else 4)  # "Don" alone: one token
    assert len(rows[1]["sentences"]) == (2 if split_lines else 1)
    assert rows[7]["num_sentences"] >= 2100 // 250
    assert rows == _tokenize_batch_rows(TEXTS, tokenizer, split_lines)  # the streaming pipeline's entry


def _tokenize_batch_rows(texts, tokenizer, split_lines):
    columns = _tokenize_batch(texts, tokenizer, split_lines)
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def test_bytes_are_read_as_utf8_text_and_undecodable_bytes_as_binary(tokenizer):
    texts = [t.encode() if t is not None else None for t in TEXTS] + [b"Kalo \xff\xfe mitor."]
    as_bytes = tokenize_documents(datasets.Dataset.from_dict({"text": texts}), tokenizer).to_list()
    as_text = tokenize_documents(datasets.Dataset.from_dict({"text": TEXTS}), tokenizer).to_list()
    assert as_bytes[:-1] == as_text
    assert as_bytes[-1]["skip_reason"] == "binary" and as_bytes[-1]["sentences"] == []


def test_text_columns_of_every_arrow_text_type_and_the_default_split(tokenizer):
    texts = [t for t in TEXTS if t is not None]
    plain = datasets.Dataset.from_dict({"text": texts})
    expected = tokenize_documents(plain, tokenizer).to_list()
    assert expected == tokenize_documents(plain, tokenizer, split_lines=False).to_list()
    assert expected != tokenize_documents(plain, tokenizer, split_lines=True).to_list()
    encoded = [t.encode() for t in texts]
    for dtype, column in [("large_string", texts), ("binary", encoded), ("large_binary", encoded)]:
        typed = datasets.Dataset.from_dict({"text": column}).cast_column("text", datasets.Value(dtype))
        assert tokenize_documents(typed, tokenizer).to_list() == expected, dtype


def test_text_bytes_in_the_datasets_row_order():
    ds = datasets.Dataset.from_dict({"text": ["ab", None, "ë", "abcd"]})
    assert _text_bytes(ds, "text").tolist() == [2, 0, 2, 4]
    assert _text_bytes(ds.select([3, 0, 1]), "text").tolist() == [4, 2, 0]


def test_documents_on_disk_are_never_read_from_the_cache_of_other_settings(tmp_path, tokenizer):
    """datasets caches each map beside a dataset on disk: other settings or reordered rows must not read those files."""
    texts = pseudo_text(2, seed=3, min_sentences=80, max_sentences=90) + [t or "" for t in TEXTS] * 3
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "texts"))
    on_disk = datasets.load_from_disk(str(tmp_path / "texts"))
    in_memory = datasets.Dataset.from_dict({"text": texts})
    assert _balanced_order(_text_bytes(on_disk, "text"), 2) is not None  # the parallel map runs over reordered rows
    for split_lines in (False, True, False):
        expected = tokenize_documents(in_memory, tokenizer, split_lines=split_lines).to_list()
        for num_proc in (2, None):  # the parallel map first: its result is not yet cached under the final name
            got = tokenize_documents(on_disk, tokenizer, split_lines=split_lines, num_proc=num_proc).to_list()
            assert got == expected, (split_lines, num_proc)
    assert len(list((tmp_path / "texts").glob("cache-*.arrow"))) > 2


def test_a_batch_is_an_arrow_table_of_the_document_features(tokenizer):
    """The map writes the table as it comes: its schema (types and the features' metadata) is DOCUMENT_FEATURES'."""
    table = _tokenize_table(TEXTS, tokenizer, False)
    assert table.schema.equals(DOCUMENT_FEATURES.arrow_schema, check_metadata=True)


def test_a_batch_of_no_documents():
    assert _tokenize_batch([], None, False) == {name: [] for name in DOCUMENT_FEATURES}


def test_as_text():
    assert _as_text("Some text.") == ("Some text.", "")
    assert _as_text(bytearray("Tëxt.".encode())) == ("Tëxt.", "")
    assert _as_text(b"\xff") == ("", "binary")
    assert _as_text("\x00abc") == ("", "binary")
    assert _as_text(None) == ("", "empty")
    assert _as_text(" \n\t") == ("", "empty")
    assert _as_text(b"") == ("", "empty")


def test_no_warning_about_the_models_maximum_length(caplog):
    """Sentences are tokenized whole, so the maximum-length warning would be noise (fresh tokenizer: it warns once)."""
    tokenizer = wordpiece_tokenizer(pseudo_text(4), vocab_size=150)
    tokenizer.model_max_length = 8
    with caplog.at_level("WARNING"):
        docs = tokenize_documents(
            datasets.Dataset.from_dict({"text": ["Kalo mitor ren velsha tor don ex pu."]}), tokenizer
        )
        assert docs[0]["num_tokens"] > 8
        assert "longer than the specified maximum" not in caplog.text
        tokenizer(["Kalo mitor ren velsha tor don ex pu."])  # the same call with transformers' default: warned
    assert "longer than the specified maximum" in caplog.text


def test_the_long_sentences_log_names_the_first_five_rows(tokenizer, caplog):
    texts = ["Kalo mitor."] + ["velsha " * 300] * 6
    with caplog.at_level("INFO", logger="bert_repro"):
        tokenize_documents(datasets.Dataset.from_dict({"text": texts}), tokenizer)
    assert "in 6 of 7 documents" in caplog.text and "(rows 1, 2, 3, 4, 5 ...)" in caplog.text
