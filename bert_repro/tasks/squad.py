"""SQuAD v1.1 / v2.0: input windows and span selection, for ``datasets.map`` and after ``Trainer.predict``.

Examples use the Hugging Face ``squad`` / ``squad_v2`` columns (``answers`` lists are empty for an unanswerable
v2.0 question)::

    train = raw["train"].map(prepare_train_features, batched=True, remove_columns=raw["train"].column_names,
                             fn_kwargs={"tokenizer": tokenizer})
    dev = raw["validation"].map(prepare_eval_features, batched=True,
                                remove_columns=raw["validation"].column_names,
                                fn_kwargs={"tokenizer": tokenizer})
    output = trainer.predict(dev.remove_columns(["example_id", "offset_mapping", "token_is_max_context"]))
    predictions, null_score_diffs, nbest = postprocess_predictions(raw["validation"], dev, *output.predictions)

As the paper (§4.2/4.3) and google-research/bert's ``run_squad.py``:
- Input ``[CLS] question [SEP] window [SEP]``, token types 0 then 1, padded to ``max_seq_length`` (384); the
  question is cut to ``max_query_length`` (64) tokens.
- Windows hold ``max_seq_length - len(question) - 3`` context tokens and start at 0, ``doc_stride``, ...; the last
  is the first to reach the end (the reference's ``while start_offset < len(all_doc_tokens)``).
- Training labels: the answer's first and last token in the window, ``0`` ([CLS]) when it is not entirely inside
  or the question is unanswerable. Only the first gold answer is used.
- Span selection: the ``n_best_size`` (20) best starts x 20 best ends of each window, kept when both are in the
  context, start <= end, at most ``max_answer_length`` (30) tokens, and the start has maximum context. Score
  ``S.T_i + E.T_j``; the best over all windows wins. The n-best list keeps each text's best, with softmax
  probabilities.
- Maximum context (``_check_is_max_context``): a token starts a span only in the window with the largest
  ``min(left, right) + 0.01 * length`` (the first on ties).
- v2.0: ``s_null`` (the MINIMUM ``start_logit[CLS] + end_logit[CLS]`` over the windows) enters the n-best list; the
  prediction is ``""`` when ``s_null - best_non_null > null_score_diff_threshold``, so the paper's ``tau`` is
  ``-threshold``. The diffs are the official v2.0 script's ``na_probs``; its threshold search needs predictions made
  with ``null_score_diff_threshold=float("inf")`` (or ``apply_null_threshold``). The best threshold it reports is a
  ``null_score_diff_threshold`` to predict with elsewhere, except when answering nothing scored best: it then
  reports 0.0, and the threshold that scored best is ``-inf`` (always ``""``).

Departures:
- Answers map to tokens through the fast tokenizer's offsets into the ORIGINAL text (surviving lower-casing and
  accent stripping), not whitespace words plus ``_improve_answer_span``; the answer text is cut with the same
  offsets, extended over trailing combining marks, instead of ``get_final_text``.
- A training answer not at its ``answer_start`` is skipped with a warning (the reference's looser
  "Could not find answer").
- The windows are cut here: the tokenizer's ``stride`` is an overlap, which would need to depend on each question's
  length (``tokenizer_stride``). ``run_qa.py``'s ``--doc_stride R`` is that overlap: its windows are ours with
  ``doc_stride = max_seq_length - 3 - question tokens - R`` (its question is not cut at ``max_query_length``); at
  384, its 128 starts a window every ~240 tokens, not 128 (tests/tasks/test_squad_doc_stride.py).
- With no valid span the prediction is ``""`` (diff ``+inf`` in v2.0), not the reference's "empty". v1.1 returns
  no diffs.
"""

from __future__ import annotations

import collections
import logging
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DocSpan",
    "apply_null_threshold",
    "doc_spans",
    "max_context_flags",
    "postprocess_predictions",
    "prepare_eval_features",
    "prepare_train_features",
    "tokenizer_stride",
]

logger = logging.getLogger(__name__)

Offset = tuple[int, int]

#: Special tokens around the question and the context: [CLS] question [SEP] context [SEP].
NUM_SPECIAL_TOKENS = 3


# Windows


@dataclass(frozen=True)
class DocSpan:
    """A window over the context tokens: ``length`` tokens from token ``start``."""

    start: int
    length: int

    @property
    def end(self) -> int:
        """Index of the last context token in the window (inclusive)."""
        return self.start + self.length - 1


def doc_spans(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[DocSpan]:
    """The reference's windows: starts 0, doc_stride, ... until one reaches the end; never a gap, none if empty."""
    if max_tokens_for_doc < 1:
        raise ValueError(f"max_tokens_for_doc must be >= 1, got {max_tokens_for_doc}")
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be >= 1, got {doc_stride}")
    spans: list[DocSpan] = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append(DocSpan(start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def tokenizer_stride(max_tokens_for_doc: int, doc_stride: int) -> int:
    """The tokenizer's ``stride`` that starts a window every ``doc_stride`` tokens, as the reference: an overflowing
    tokenizer's stride is an overlap, so it starts one every ``max_tokens_for_doc - stride`` tokens."""
    return max(0, max_tokens_for_doc - doc_stride)


def max_context_flags(spans: Sequence[DocSpan], num_tokens: int) -> list[list[bool]]:
    """Per window, whether each token has its maximum context there (the reference's ``_check_is_max_context``)."""
    best_score = [-math.inf] * num_tokens
    owner = [-1] * num_tokens
    for index, span in enumerate(spans):
        for position in range(span.start, span.end + 1):
            score = min(position - span.start, span.end - position) + 0.01 * span.length
            if score > best_score[position]:
                best_score[position] = score
                owner[position] = index
    return [[owner[p] == index for p in range(span.start, span.end + 1)] for index, span in enumerate(spans)]


# Features


@dataclass
class _Tokenized:
    """One example's question tokens (already truncated), context tokens and their character offsets."""

    question_ids: list[int]
    context_ids: list[int]
    context_offsets: list[Offset]

    @property
    def context_start(self) -> int:
        """Index of the first context token in every window: after [CLS] question [SEP]."""
        return len(self.question_ids) + 2


def _tokenize(examples: Mapping[str, Sequence], tokenizer: Any, max_query_length: int) -> list[_Tokenized]:
    plain = {"add_special_tokens": False, "return_attention_mask": False, "return_token_type_ids": False}
    questions = tokenizer(list(examples["question"]), verbose=False, **plain)["input_ids"]
    contexts = tokenizer(list(examples["context"]), return_offsets_mapping=True, verbose=False, **plain)
    return [
        _Tokenized(list(q[:max_query_length]), list(ids), [tuple(o) for o in offsets])
        for q, ids, offsets in zip(questions, contexts["input_ids"], contexts["offset_mapping"])
    ]


def _spans_for(tokens: _Tokenized, max_seq_length: int, doc_stride: int) -> list[DocSpan]:
    max_tokens_for_doc = max_seq_length - len(tokens.question_ids) - NUM_SPECIAL_TOKENS
    if max_tokens_for_doc < 1:
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for the context after a question of "
            f"{len(tokens.question_ids)} tokens: raise max_seq_length or lower max_query_length"
        )
    return doc_spans(len(tokens.context_ids), max_tokens_for_doc, doc_stride)


def _encode_window(
    tokens: _Tokenized, span: DocSpan, tokenizer: Any, max_seq_length: int, pad_to_max_length: bool
) -> dict[str, list[int]]:
    """``[CLS] question [SEP] window [SEP]`` with token type ids and attention mask, padded if asked."""
    context = tokens.context_ids[span.start : span.end + 1]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    input_ids = [cls, *tokens.question_ids, sep, *context, sep]
    token_type_ids = [0] * (len(tokens.question_ids) + 2) + [1] * (len(context) + 1)
    attention_mask = [1] * len(input_ids)
    padding = max_seq_length - len(input_ids) if pad_to_max_length else 0
    return {
        "input_ids": input_ids + [tokenizer.pad_token_id] * padding,
        "token_type_ids": token_type_ids + [0] * padding,
        "attention_mask": attention_mask + [0] * padding,
    }


def _normalise_space(text: str) -> str:
    return " ".join(text.split())


def _answer_token_span(context: str, offsets: Sequence[Offset], text: str, char_start: int) -> tuple[int, int] | None:
    """First and last context token of the answer; None when ``char_start`` misses the text or no token covers it."""
    char_end = char_start + len(text)
    if _normalise_space(context[char_start:char_end]) != _normalise_space(text):
        return None
    first = next((i for i, (_, end) in enumerate(offsets) if end > char_start), None)
    last = next((i for i in reversed(range(len(offsets))) if offsets[i][0] < char_end), None)
    if first is None or last is None or first > last:
        return None
    return first, last


def _window_label(answer: tuple[int, int] | None, span: DocSpan, context_start: int) -> tuple[int, int]:
    """Answer token positions inside the window's sequence, or (0, 0) ([CLS]) when it is not fully inside."""
    if answer is None or answer[0] < span.start or answer[1] > span.end:
        return 0, 0
    return answer[0] - span.start + context_start, answer[1] - span.start + context_start


def _check_lengths(max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    if max_query_length < 0:
        raise ValueError(f"max_query_length must be >= 0, got {max_query_length}")
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be >= 1, got {doc_stride}")
    if max_seq_length <= NUM_SPECIAL_TOKENS:
        raise ValueError(f"max_seq_length must exceed {NUM_SPECIAL_TOKENS}, got {max_seq_length}")


def prepare_train_features(
    examples: Mapping[str, Sequence],
    tokenizer: Any,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    pad_to_max_length: bool = True,
) -> dict[str, list]:
    """Batched ``datasets.map`` function: SQuAD examples -> one row per window, with ``start/end_positions``."""
    _check_lengths(max_seq_length, doc_stride, max_query_length)
    features: dict[str, list] = collections.defaultdict(list)
    skipped = 0
    for index, tokens in enumerate(_tokenize(examples, tokenizer, max_query_length)):
        context, answers = examples["context"][index], examples["answers"][index]
        answer = None
        if len(answers["text"]) > 0:
            answer = _answer_token_span(
                context, tokens.context_offsets, answers["text"][0], int(answers["answer_start"][0])
            )
            if answer is None:
                skipped += 1
                continue
        for span in _spans_for(tokens, max_seq_length, doc_stride):
            encoded = _encode_window(tokens, span, tokenizer, max_seq_length, pad_to_max_length)
            for key, value in encoded.items():
                features[key].append(value)
            start, end = _window_label(answer, span, tokens.context_start)
            features["start_positions"].append(start)
            features["end_positions"].append(end)
    if skipped:
        logger.warning("skipped %d training example(s) whose answer_start does not point at the answer text", skipped)
    keys = ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions")
    return {key: features[key] for key in keys}


def prepare_eval_features(
    examples: Mapping[str, Sequence],
    tokenizer: Any,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    pad_to_max_length: bool = True,
) -> dict[str, list]:
    """Batched ``datasets.map`` function: SQuAD examples -> evaluation windows.

    Adds per window ``example_id``, ``offset_mapping`` (None outside the context) and ``token_is_max_context``:
    drop those before ``Trainer.predict`` and pass the full features to ``postprocess_predictions``.
    """
    _check_lengths(max_seq_length, doc_stride, max_query_length)
    features: dict[str, list] = collections.defaultdict(list)
    for index, tokens in enumerate(_tokenize(examples, tokenizer, max_query_length)):
        spans = _spans_for(tokens, max_seq_length, doc_stride)
        for span, flags in zip(spans, max_context_flags(spans, len(tokens.context_ids))):
            encoded = _encode_window(tokens, span, tokenizer, max_seq_length, pad_to_max_length)
            for key, value in encoded.items():
                features[key].append(value)
            before = [None] * tokens.context_start
            after = [None] * (len(encoded["input_ids"]) - tokens.context_start - span.length)
            features["example_id"].append(examples["id"][index])
            window_offsets = tokens.context_offsets[span.start : span.end + 1]
            features["offset_mapping"].append(before + window_offsets + after)
            features["token_is_max_context"].append([False] * tokens.context_start + flags + [False] * len(after))
    keys = ("input_ids", "token_type_ids", "attention_mask", "example_id", "offset_mapping", "token_is_max_context")
    return {key: features[key] for key in keys}


# Span selection


@dataclass(frozen=True)
class _Candidate:
    text: str
    start_logit: float
    end_logit: float

    @property
    def score(self) -> float:
        return self.start_logit + self.end_logit


def _best_indexes(logits: np.ndarray, n_best_size: int) -> list[int]:
    """Indices of the n largest logits, largest first (earlier index first on ties)."""
    return [int(i) for i in np.argsort(-logits, kind="stable")[:n_best_size]]


def _cut(context: str, start_char: int, end_char: int) -> str:
    """``context[start_char:end_char]``, extended over combining marks left out of the offsets."""
    while end_char < len(context) and unicodedata.combining(context[end_char]):
        end_char += 1
    return context[start_char:end_char]


def _window_candidates(
    context: str,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: Sequence[Offset | None],
    max_context: Sequence[bool] | None,
    n_best_size: int,
    max_answer_length: int,
) -> list[_Candidate]:
    """Valid spans among the n best starts x n best ends of one window."""

    def in_context(index: int) -> bool:
        return index < len(offsets) and offsets[index] is not None

    ends = _best_indexes(end_logits, n_best_size)
    candidates = []
    for start in _best_indexes(start_logits, n_best_size):
        if not in_context(start) or (max_context is not None and not max_context[start]):
            continue
        for end in ends:
            if not in_context(end) or end < start or end - start + 1 > max_answer_length:
                continue
            text = _cut(context, offsets[start][0], offsets[end][1])
            candidates.append(_Candidate(text, float(start_logits[start]), float(end_logits[end])))
    return candidates


def _min_null(start_logits: np.ndarray, end_logits: np.ndarray, rows: Sequence[int]) -> _Candidate | None:
    """The null answer with the lowest ``start_logit[CLS] + end_logit[CLS]`` over the windows."""
    nulls = [_Candidate("", float(start_logits[f][0]), float(end_logits[f][0])) for f in rows]
    return min(nulls, key=lambda candidate: candidate.score) if nulls else None


def _nbest(candidates: Iterable[_Candidate], n_best_size: int, null: _Candidate | None) -> list[_Candidate]:
    """Best-first list of distinct texts (null included when given), at most n_best_size long (+ the null)."""
    pool = list(candidates) + ([null] if null is not None else [])
    pool.sort(key=lambda candidate: candidate.score, reverse=True)
    seen: set[str] = set()
    best: list[_Candidate] = []
    for candidate in pool:
        if len(best) >= n_best_size:
            break
        if candidate.text not in seen:
            seen.add(candidate.text)
            best.append(candidate)
    if null is not None and "" not in seen:
        best.append(null)
    return best


def _best_span(best: Sequence[_Candidate]) -> tuple[str, float]:
    """Text and score of the best non-null entry; ("", -inf) when there is none."""
    span = next((candidate for candidate in best if candidate.text), None)
    return (span.text, span.score) if span is not None else ("", -math.inf)


def _nbest_entries(best: Sequence[_Candidate]) -> list[dict[str, Any]]:
    """The n-best list as dicts, with softmax probabilities over the listed scores."""
    top = max((c.score for c in best), default=0.0)
    exps = [math.exp(c.score - top) for c in best]
    total = sum(exps)
    return [
        dict(text=c.text, score=c.score, start_logit=c.start_logit, end_logit=c.end_logit, probability=e / total)
        for c, e in zip(best, exps)
    ]


def postprocess_predictions(
    examples: Any,
    features: Any,
    start_logits: Any,
    end_logits: Any,
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
    require_max_context: bool = True,
) -> tuple[dict[str, str], dict[str, float], dict[str, list[dict]]]:
    """Pick each example's answer from the logits of all its windows.

    ``features`` is ``prepare_eval_features``'s output in the logits' (num_features, seq_len) order.
    Returns id -> text, id -> ``s_null - best_non_null`` (v2.0 only), and id -> n-best list of dicts, best first.
    """
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    example_ids = list(features["example_id"])
    if start_logits.shape[0] != len(example_ids) or end_logits.shape[0] != len(example_ids):
        raise ValueError(
            f"got {start_logits.shape[0]} start / {end_logits.shape[0]} end logit rows for {len(example_ids)} features"
        )
    offsets = list(features["offset_mapping"])
    max_context = list(features["token_is_max_context"]) if require_max_context else [None] * len(example_ids)
    grouped: dict[str, list[int]] = collections.defaultdict(list)
    for index, example_id in enumerate(example_ids):
        grouped[example_id].append(index)

    predictions: dict[str, str] = {}
    diffs: dict[str, float] = {}
    nbest_json: dict[str, list[dict]] = {}
    for example_id, context in zip(list(examples["id"]), list(examples["context"])):
        rows = grouped.get(example_id, [])
        candidates: list[_Candidate] = []
        for f in rows:
            candidates += _window_candidates(
                context, start_logits[f], end_logits[f], offsets[f], max_context[f], n_best_size, max_answer_length
            )
        null = _min_null(start_logits, end_logits, rows) if version_2_with_negative else None
        best = _nbest(candidates, n_best_size, null)
        nbest_json[example_id] = _nbest_entries(best)
        span_text, span_score = _best_span(best)
        predictions[example_id] = span_text
        if version_2_with_negative:
            # No window at all (empty context): the null answer is the only answer, diff +inf.
            diffs[example_id] = null.score - span_score if null is not None else math.inf
            if diffs[example_id] > null_score_diff_threshold:
                predictions[example_id] = ""
    return predictions, diffs, nbest_json


def apply_null_threshold(
    nbest: Mapping[str, Sequence[Mapping[str, Any]]], null_score_diffs: Mapping[str, float], threshold: float
) -> dict[str, str]:
    """v2.0 predictions for another ``null_score_diff_threshold``, from the n-best lists and diffs that
    ``postprocess_predictions`` returned (no second pass over the logits)."""
    predictions = {}
    for example_id, entries in nbest.items():
        best_span = next((entry["text"] for entry in entries if entry["text"]), "")
        predictions[example_id] = "" if null_score_diffs[example_id] > threshold else best_span
    return predictions
