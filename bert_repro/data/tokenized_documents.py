"""Raw documents -> sentences -> WordPiece ids: the first map of the pre-training examples, streamed or not.

Text that spells a special token ("[SEP]") is ordinary text, as in the reference tokenizer.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value
from datasets.fingerprint import Hasher

from .balanced_map import _balanced_order, _flatten
from .sentences import MAX_SENTENCE_CHARS, SENTENCE_PIECE_CHARS, bound_sentences, looks_like_binary, split_sentences

__all__ = ["DOCUMENT_FEATURES", "tokenize_documents"]

logger = logging.getLogger(__name__)


#: Columns of ``tokenize_documents``: one row per input document.
DOCUMENT_FEATURES = Features(
    {
        "sentences": List(List(Value("int32"))),
        "num_sentences": Value("int32"),
        "num_tokens": Value("int64"),
        # "" for a kept document, else why it was skipped: "empty" or "binary".
        "skip_reason": Value("string"),
        # Sentences longer than sentences.MAX_SENTENCE_CHARS, cut into pieces (text without sentence punctuation).
        "long_sentences": Value("int32"),
    }
)


def tokenize_documents(
    dataset: Dataset,
    tokenizer: Any,
    *,
    text_column: str = "text",
    split_lines: bool = False,
    num_proc: int | None = None,
    batch_size: int = 64,
) -> Dataset:
    """Each row's sentences as WordPiece ids without special tokens, the same bytes for any ``num_proc``.

    Rows of ``DOCUMENT_FEATURES``; overlong "sentences" are cut (our departure, ``sentences.py``) and logged.
    """
    _check_text_column(dataset, text_column)
    # The same fingerprint for any num_proc: the cache of a run with one serves runs with any other.
    fingerprint = Hasher.hash(
        [dataset._fingerprint, text_column, split_lines, tokenizer, _tokenize_table, "documents-2"]
    )
    order = _balanced_order(_text_bytes(dataset, text_column), num_proc)
    source = dataset if order is None else dataset.select(order)
    documents = source.map(
        _tokenize_table,
        batched=True,
        batch_size=batch_size,
        num_proc=num_proc,
        input_columns=[text_column],
        remove_columns=dataset.column_names,
        features=DOCUMENT_FEATURES,
        fn_kwargs={"tokenizer": tokenizer, "split_lines": split_lines},
        new_fingerprint=fingerprint if order is None else Hasher.hash([fingerprint, order]),
        desc="Sentence split + WordPiece",
    )
    if order is not None:  # back to the input's row order
        documents = _flatten(documents.select(np.argsort(order)), fingerprint)
    _log_skipped(documents)
    _log_long_sentences(documents)
    return documents


def _text_bytes(dataset: Dataset, text_column: str) -> np.ndarray:
    """UTF-8 bytes of each row's text, read from Arrow without decoding it."""
    lengths = pc.fill_null(pc.binary_length(dataset.data.column(text_column)), 0).to_numpy()
    indices = getattr(dataset, "_indices", None)
    return lengths if indices is None else lengths[indices.column(0).to_numpy()]


def _check_text_column(dataset: Dataset, text_column: str) -> None:
    if text_column not in dataset.column_names:
        raise ValueError(
            f"the dataset has no column {text_column!r} (its columns: {dataset.column_names}); "
            "pass text_column= to name the column that holds each document's text"
        )
    feature = dataset.features[text_column]
    if not (isinstance(feature, Value) and feature.dtype in ("string", "large_string", "binary", "large_binary")):
        raise TypeError(f"column {text_column!r} must hold text (one document a row), not {feature}")


# Sentences per call of the tokenizer: the encodings of one call live until their ids are in Arrow.
_ENCODE_SLICE = 4096


def _tokenize_batch(texts: list[Any], tokenizer: Any, split_lines: bool) -> dict[str, list[Any]]:
    return _tokenize_table(texts, tokenizer, split_lines).to_pydict()


def _tokenize_table(texts: list[Any], tokenizer: Any, split_lines: bool) -> pa.Table:
    """Sentences go to Arrow a slice at a time: a 100 MB document never exists as Python lists of ids."""
    reasons: list[str] = []
    split: list[list[str]] = []
    long_counts: list[int] = []
    for text in texts:
        text, reason = _as_text(text)
        reasons.append(reason)
        sentences, cut = bound_sentences(split_sentences(text, split_lines=split_lines, max_sentence_chars=None))
        split.append(sentences if not reason else [])
        long_counts.append(cut)
    flat = [s for sentences in split for s in sentences]
    values, lengths = [], []
    for k in range(0, len(flat), _ENCODE_SLICE):
        ids = tokenizer(
            flat[k : k + _ENCODE_SLICE],
            add_special_tokens=False,
            split_special_tokens=True,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )["input_ids"]
        lengths.append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
        values.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths[-1].sum())))
    token_values = np.concatenate(values) if values else np.zeros(0, np.int32)
    sentence_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    # The reference drops sentences that tokenize to nothing.
    per_document = np.array([len(s) for s in split], dtype=np.int64)
    document_of = np.repeat(np.arange(len(split)), per_document)
    kept = sentence_lengths > 0
    num_sentences = np.bincount(document_of[kept], minlength=len(split)).astype(np.int32)
    num_tokens = np.bincount(document_of, weights=sentence_lengths, minlength=len(split)).astype(np.int64)
    sentence_offsets = np.concatenate([[0], np.cumsum(sentence_lengths[kept])]).astype(np.int32)
    document_offsets = np.concatenate([[0], np.cumsum(num_sentences)]).astype(np.int32)
    sentences_column = pa.ListArray.from_arrays(
        pa.array(document_offsets), pa.ListArray.from_arrays(pa.array(sentence_offsets), pa.array(token_values))
    )
    skip = [reason or ("" if n else "empty") for reason, n in zip(reasons, num_sentences, strict=True)]
    return pa.table(
        {
            "sentences": sentences_column,
            "num_sentences": pa.array(num_sentences),
            "num_tokens": pa.array(num_tokens),
            "skip_reason": pa.array(skip, pa.string()),
            "long_sentences": pa.array(long_counts, pa.int32()),
        },
        schema=DOCUMENT_FEATURES.arrow_schema,
    )


def _as_text(text: Any) -> tuple[str, str]:
    """``(text, skip_reason)``: bytes are decoded as UTF-8; None, blank and binary-looking rows are skipped"""
    if text is None:
        return "", "empty"
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            return "", "binary"
    if looks_like_binary(text):
        return "", "binary"
    if not text.strip():
        return "", "empty"
    return text, ""


def _log_long_sentences(documents: Dataset, shown: int = 5) -> None:
    counts = documents.data.column("long_sentences").to_numpy()
    rows = np.flatnonzero(counts)
    if len(rows):
        # Said, not warned: real prose has such sentences (a few in Austen's novels); the corpus reader warns about
        # text without sentence punctuation.
        logger.info(
            "%d 'sentences' longer than %d characters in %d of %d documents (long sentences, or text without "
            "sentence punctuation) were cut into pieces of at most %d characters (rows %s%s)",
            int(counts.sum()),
            MAX_SENTENCE_CHARS,
            len(rows),
            len(documents),
            SENTENCE_PIECE_CHARS,
            ", ".join(map(str, rows[:shown].tolist())),
            " ..." if len(rows) > shown else "",
        )


def _log_skipped(documents: Dataset) -> None:
    counts = _skip_counts(documents)
    if any(counts.values()):
        logger.warning(
            "skipped %d empty and %d binary-looking documents of %d", counts["empty"], counts["binary"], len(documents)
        )


def _skip_counts(documents: Dataset) -> dict[str, int]:
    counts = pc.value_counts(documents.data.column("skip_reason")).to_pylist()
    found = {c["values"]: c["counts"] for c in counts}
    return {reason: int(found.get(reason, 0)) for reason in ("empty", "binary")}
