"""Pathological documents and the memory invariants of building pre-training data at scale.

The figures at 100 MB - 1 GB are in benchmarks/README.md ("Building examples at scale").
"""

from __future__ import annotations

import logging
import random
import re
import tracemalloc
from unittest import mock

import datasets
from hypothesis import given, settings
from hypothesis import strategies as st
from support.corpora import word_tokenizer

from bert_repro.data import corpus as corpus_module
from bert_repro.data.corpus import decode_text, load_corpus
from bert_repro.data.masking import WordPieceVocab
from bert_repro.data.pretraining_config import PreTrainingDataConfig
from bert_repro.data.pretraining_examples import create_pretraining_instances
from bert_repro.data.sentences import MAX_SENTENCE_CHARS, SENTENCE_PIECE_CHARS, cut_long_sentence, split_sentences
from bert_repro.data.tokenized_documents import tokenize_documents
from bert_repro.data.training_instances import IS_NEXT


def words_of(count: int, prefix: str = "w", seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [prefix + "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(count)]


def own_coverage(instances: datasets.Dataset) -> int:
    """Distinct positions of a one-document corpus that its examples use as segment A or as an IsNext B."""
    used = 0
    for row in instances:
        segments = row["token_type_ids"]
        a, b = segments.count(0) - 2, segments.count(1) - 1
        used += a + (b if row["next_sentence_label"] == IS_NEXT else 0)
    return used


# Overlong sentences


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet="abcXYZ\u00e9\u4e2d", min_size=1, max_size=40), min_size=1, max_size=60),
    st.integers(1, 50),
)
def test_cut_long_sentence_keeps_the_text_in_pieces_of_bounded_length(words, piece_chars):
    sentence = " ".join(words)
    pieces = cut_long_sentence(sentence, piece_chars)
    assert all(0 < len(p) <= piece_chars and p == p.strip() for p in pieces)
    assert "".join(pieces).replace(" ", "") == sentence.replace(" ", "")  # nothing lost, nothing added
    if all(len(w) <= piece_chars for w in words):
        assert " ".join(pieces) == sentence  # every cut at a space
    # Cuts fall at spaces: every word shorter than a piece stays whole in one piece.
    whole = [w for w in words if len(w) <= piece_chars]
    assert all(any(re.search(rf"(^| ){re.escape(w)}( |$)", p) for p in pieces) for w in whole)


def test_split_sentences_cuts_only_overlong_sentences():
    normal = "A normal sentence. Another one follows it."
    assert split_sentences(normal) == ["A normal sentence.", "Another one follows it."]
    long_run = " ".join(["Word"] + ["word"] * 599)  # 2,999 characters, no punctuation
    pieces = split_sentences(f"Before it. {long_run}. After it.")
    assert pieces[0] == "Before it." and pieces[-1] == "After it."
    assert len(pieces) == 2 + -(-len(long_run + ".") // SENTENCE_PIECE_CHARS)
    assert all(len(p) <= SENTENCE_PIECE_CHARS for p in pieces)
    assert " ".join(pieces[1:-1]) == long_run + "."
    assert split_sentences(long_run, max_sentence_chars=None) == [long_run]  # the reference's behaviour
    assert split_sentences("x" * (MAX_SENTENCE_CHARS + 1)) == ["x" * 250] * 4 + ["x"]  # no space: hard cuts


def test_a_2mb_document_without_punctuation_gives_examples_covering_most_of_it(caplog):
    words = words_of(2_000)
    rng = random.Random(1)
    text = " ".join(rng.choice(words) for _ in range(2_000_000 // 6))[:2_000_000]
    tokenizer = word_tokenizer(words)
    with caplog.at_level(logging.INFO, logger="bert_repro"):
        docs = tokenize_documents(datasets.Dataset.from_dict({"text": [text]}), tokenizer)
    tokens = docs["num_tokens"][0]
    assert docs["long_sentences"][0] == 1 and docs["num_sentences"][0] >= 2_000_000 // SENTENCE_PIECE_CHARS
    assert "1 'sentences' longer than 1000 characters in 1 of 1 documents" in caplog.text
    config = PreTrainingDataConfig(max_seq_length=128, dupe_factor=1)
    instances = create_pretraining_instances(docs, WordPieceVocab.from_tokenizer(tokenizer), config, shuffle=False)
    # The reference keeps one sentence of ~330,000 tokens: one example of at most 125 of them.
    assert len(instances) > tokens / config.max_num_tokens
    assert own_coverage(instances) > 0.6 * tokens


def test_the_corpus_reader_names_a_file_without_punctuation(tmp_path, caplog):
    (tmp_path / "fine.txt").write_text("A short book. It has sentences.\n\nAnd paragraphs.\n")
    (tmp_path / "one_line.txt").write_text(" ".join(["token"] * 5_000))  # 30 kB, one line, no period
    lines = "\n".join(" ".join(["item"] * 10) for _ in range(400))  # a list: short lines, no period
    (tmp_path / "list.txt").write_text(f"Title.\n\n{lines}\n")
    with caplog.at_level(logging.WARNING):
        docs = load_corpus(tmp_path, document_boundary="file", cache_dir=str(tmp_path / "cache"))
    assert len(docs) == 3
    warned = [r.getMessage() for r in caplog.records if "without sentence punctuation" in r.getMessage()]
    assert len(warned) == 2
    assert any(str(tmp_path / "one_line.txt") in m and "from line 1" in m for m in warned)
    assert any(str(tmp_path / "list.txt") in m and "from line 3" in m for m in warned)
    assert not any("fine.txt" in m for m in warned)


# Reading text files line by line


def whole_file_documents(raw: bytes, name: str, document_boundary: str) -> list[str]:
    """Reading the file whole (the earlier reader): the reference for the line-by-line one."""
    text = decode_text(raw, name, warn=False)
    if text is None:
        return []
    if document_boundary == "file":
        return [text] if text.strip() else []
    pieces, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            pieces.append("\n".join(current))
            current = []
    if current:
        pieces.append("\n".join(current))
    return [p for p in pieces if p.strip()]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["ab", "é", "\r\n", "\n", "\r", "\n\n", " ", ".", "\x0c", "\u2028", "\xe9", "Ω"]), max_size=80
    ),
    st.sampled_from(["utf-8", "utf-8-sig", "cp1252", "utf-16", "mixed"]),
    st.sampled_from(["file", "blank_line"]),
    st.integers(1, 9),
)
def test_reading_line_by_line_equals_reading_whole(tmp_path_factory, parts, encoding, boundary, block):
    text = "".join(parts)
    if encoding == "mixed":  # UTF-8 with a stray latin-1 byte
        raw = text.encode() + "é".encode() + b"\xe9"
    else:
        raw = text.encode(encoding, errors="replace")
    path = tmp_path_factory.mktemp("read") / "f.txt"
    path.write_bytes(raw)
    with mock.patch.object(corpus_module, "_READ_BLOCK", block):  # tiny blocks: sequences cut at block boundaries
        got = [d["text"] for d in corpus_module._text_documents([str(path)], boundary)]
    assert got == whole_file_documents(raw, str(path), boundary)


def test_reading_a_long_line_needs_memory_of_about_its_size(tmp_path):
    line = ("word " * 1_000_000).encode()  # 5 MB, one line
    path = tmp_path / "line.txt"
    path.write_bytes(line)
    tracemalloc.start()
    try:
        documents = list(corpus_module._text_documents([str(path)], "blank_line"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(documents) == 1 and len(documents[0]["text"]) == len(line)
    assert peak < 3.5 * len(line)  # the line (kept), the read buffer's chunks, one copy in flight


# The builder: Arrow, not Python lists of the corpus


def unique_documents(num_docs: int, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """Documents with disjoint vocabularies (document d's words start with "d<d>x"), and each one's words."""
    rng = random.Random(seed)
    texts, vocabularies = [], []
    for d in range(num_docs):
        words = words_of(30, prefix=f"d{d}x", seed=d)
        sentences = [
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))).capitalize() + "."
            for _ in range(rng.randint(2, 12))
        ]
        texts.append(" ".join(sentences))
        vocabularies.append(words)
    return texts, vocabularies


def test_the_builder_never_reads_the_whole_corpus_into_python(monkeypatch):
    texts, vocabularies = unique_documents(40, seed=1)
    tokenizer = word_tokenizer([w for ws in vocabularies for w in ws])
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": texts}), tokenizer)
    calls = []
    for name in ("to_list", "to_dict", "to_pandas", "__getitem__"):
        original = getattr(datasets.Dataset, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls.append((_name, args[:1]))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(datasets.Dataset, name, spy)
    config = PreTrainingDataConfig(max_seq_length=32, dupe_factor=2)
    create_pretraining_instances(docs, WordPieceVocab.from_tokenizer(tokenizer), config)
    # Whole columns (ds["sentences"]) or tables as Python objects would hold the corpus in a list.
    assert not [c for c in calls if c[0] != "__getitem__" or isinstance(c[1][0], str)], calls


def test_builder_python_memory_does_not_grow_with_the_corpus():
    texts, vocabularies = unique_documents(60, seed=2)
    tokenizer = word_tokenizer([w for ws in vocabularies for w in ws])
    vocab = WordPieceVocab.from_tokenizer(tokenizer)
    config = PreTrainingDataConfig(max_seq_length=32, dupe_factor=2)
    peaks = {}
    for copies in (1, 8):
        docs = tokenize_documents(datasets.Dataset.from_dict({"text": texts * copies}), tokenizer)
        tracemalloc.start()
        try:
            create_pretraining_instances(docs, vocab, config, shuffle=False)
            peaks[copies] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[8] < 2 * peaks[1], peaks
