"""bert_repro.tasks.squad: windows, labels and span selection.

Every filler word is one token of the vocabulary trained here, so token positions follow from word positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from support.models import tiny_config

from bert_repro.data.wordpiece import train_wordpiece
from bert_repro.tasks.squad import (
    DocSpan,
    apply_null_threshold,
    doc_spans,
    max_context_flags,
    postprocess_predictions,
    prepare_eval_features,
    prepare_train_features,
    tokenizer_stride,
)

FILLER = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu red green blue black white brown "
    "pink gray gold silver one two three four five six seven eight nine ten"
).split()
CORPUS = [
    " ".join(FILLER),
    "what is the name of the place where who",
    "The Café Müller is a U.S.-based place in Paris (1895-1943).",
]

# Geometry of the window tests: question of 3 tokens, [CLS] q q q [SEP] = 5, 8 context tokens, [SEP].
QUESTION = "what is alpha"
CONTEXT_START = 5
MAX_SEQ = 14  # max_tokens_for_doc = 14 - 3 - 3 = 8
STRIDE = 3  # windows over 20 tokens: [0-7] [3-10] [6-13] [9-16] [12-19]


@pytest.fixture(scope="module")
def tok():
    tokenizer = train_wordpiece(iterator=CORPUS * 3, vocab_size=1000, min_frequency=1, show_progress=False)
    assert tokenizer.tokenize(" ".join(FILLER)) == FILLER  # one token per filler word
    assert len(tokenizer.tokenize(QUESTION)) == 3
    return tokenizer


def words(start: int, stop: int) -> str:
    return " ".join(FILLER[start:stop])


def char_start(context: str, word_index: int) -> int:
    return len(" ".join(context.split()[:word_index])) + (1 if word_index else 0)


def examples(*rows: tuple[str, str, str, list[str], list[int]]) -> dict[str, list]:
    """Batch columns from (id, question, context, answer texts, answer starts) rows."""
    return {
        "id": [row[0] for row in rows],
        "title": ["t"] * len(rows),
        "question": [row[1] for row in rows],
        "context": [row[2] for row in rows],
        "answers": [{"text": row[3], "answer_start": row[4]} for row in rows],
    }


def answered(example_id: str, question: str, context: str, answer: str) -> tuple:
    return example_id, question, context, [answer], [context.index(answer)]


def window_context_ids(feature_ids: list[int], tok) -> list[int]:
    """The context tokens of a window: between the first and the second [SEP]."""
    first = feature_ids.index(tok.sep_token_id)
    second = feature_ids.index(tok.sep_token_id, first + 1)
    return feature_ids[first + 1 : second]


def logits_like(features: dict, base: float = -5.0) -> tuple[np.ndarray, np.ndarray]:
    shape = (len(features["input_ids"]), len(features["input_ids"][0]))
    return np.full(shape, base), np.full(shape, base)


def reference_doc_spans(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """The loop of the reference run_squad.py, transcribed."""
    spans, start_offset = [], 0
    while start_offset < num_tokens:
        length = min(num_tokens - start_offset, max_tokens_for_doc)
        spans.append((start_offset, length))
        if start_offset + length == num_tokens:
            break
        start_offset += min(length, doc_stride)
    return spans


def reference_is_max_context(spans: list[tuple[int, int]], cur_span_index: int, position: int) -> bool:
    """The reference's _check_is_max_context, transcribed."""
    best_score, best_span_index = None, None
    for span_index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_span_index = score, span_index
    return cur_span_index == best_span_index


# Windows


def test_doc_spans_examples():
    assert doc_spans(20, 8, 3) == [DocSpan(0, 8), DocSpan(3, 8), DocSpan(6, 8), DocSpan(9, 8), DocSpan(12, 8)]
    assert doc_spans(10, 4, 6) == [DocSpan(0, 4), DocSpan(4, 4), DocSpan(8, 2)]  # stride > window: adjacent
    assert doc_spans(5, 8, 3) == [DocSpan(0, 5)]
    assert doc_spans(0, 8, 3) == []


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 60), st.integers(1, 80))
def test_doc_spans_match_reference_and_cover(num_tokens, max_tokens_for_doc, doc_stride):
    spans = doc_spans(num_tokens, max_tokens_for_doc, doc_stride)
    expected = reference_doc_spans(num_tokens, max_tokens_for_doc, doc_stride)
    assert [(s.start, s.length) for s in spans] == expected
    covered = {p for s in spans for p in range(s.start, s.end + 1)}
    assert covered == set(range(num_tokens))


def test_windows_follow_doc_stride_with_correct_segments(tok):
    context = words(0, 21)  # 21 tokens: starts 0 3 6 9 12 15, the last window 6 tokens long
    batch = examples(answered("a", QUESTION, context, "alpha"))
    features = prepare_train_features(batch, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE, max_query_length=64)
    context_ids = tok(context, add_special_tokens=False)["input_ids"]
    question_ids = tok(QUESTION, add_special_tokens=False)["input_ids"]
    starts = [0, 3, 6, 9, 12, 15]
    assert len(features["input_ids"]) == len(starts)
    covered = set()
    columns = (features["input_ids"], features["token_type_ids"], features["attention_mask"])
    for ids, types, mask, start in zip(*columns, starts):
        length = min(8, 21 - start)
        expected = [
            tok.cls_token_id,
            *question_ids,
            tok.sep_token_id,
            *context_ids[start : start + length],
            tok.sep_token_id,
        ]
        padding = MAX_SEQ - len(expected)
        assert ids == expected + [tok.pad_token_id] * padding
        assert types == [0] * CONTEXT_START + [1] * (length + 1) + [0] * padding
        assert mask == [1] * len(expected) + [0] * padding
        covered.update(range(start, start + length))
    assert covered == set(range(21))


@pytest.mark.parametrize("num_words,max_seq_length,doc_stride", [(21, 14, 3), (40, 20, 5), (30, 14, 20)])
def test_tokenizer_stride_gives_the_same_windows(tok, num_words, max_seq_length, doc_stride):
    """The tokenizer's stride is an overlap: max_tokens_for_doc - doc_stride reproduces our windows."""
    context = " ".join(FILLER[i % len(FILLER)] for i in range(num_words))
    batch = examples(answered("a", QUESTION, context, "alpha"))
    features = prepare_train_features(
        batch, tok, max_seq_length=max_seq_length, doc_stride=doc_stride, pad_to_max_length=False
    )
    stride = tokenizer_stride(max_seq_length - 3 - 3, doc_stride)  # max_tokens_for_doc
    windows = {"truncation": "only_second", "max_length": max_seq_length, "return_overflowing_tokens": True}
    encoded = tok(QUESTION, context, stride=stride, **windows)
    assert encoded["input_ids"] == features["input_ids"]
    assert encoded["token_type_ids"] == features["token_type_ids"]


def test_question_truncated_to_max_query_length(tok):
    question = words(10, 40)
    context = words(0, 10)
    batch = examples(answered("a", question, context, "alpha"))
    features = prepare_eval_features(batch, tok, max_seq_length=32, max_query_length=4)
    ids = features["input_ids"][0]
    assert ids[: 4 + 2] == [tok.cls_token_id, *tok.convert_tokens_to_ids(FILLER[10:14]), tok.sep_token_id]
    assert window_context_ids(ids, tok) == tok.convert_tokens_to_ids(FILLER[:10])
    assert features["token_type_ids"][0][:7] == [0] * 6 + [1]
    assert features["offset_mapping"][0][:6] == [None] * 6


def test_too_long_question_for_max_seq_length_raises(tok):
    with pytest.raises(ValueError, match="no room"):
        # 20 question tokens + 3 special tokens leave no room in 22 positions.
        batch = examples(answered("a", words(0, 20), "alpha", "alpha"))
        prepare_train_features(batch, tok, max_seq_length=22)


# Labels and answers across windows


def boundary_example() -> tuple:
    context = words(0, 20)
    return "b", QUESTION, context, [words(6, 9)], [char_start(context, 6)]  # tokens 6..8


def test_answer_across_a_window_boundary_is_labelled_only_where_it_fits(tok):
    features = prepare_train_features(examples(boundary_example()), tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    # Windows [0-7] (cuts the answer), [3-10] and [6-13] (hold it), [9-16], [12-19] (miss it).
    assert features["start_positions"] == [0, 6 - 3 + CONTEXT_START, 6 - 6 + CONTEXT_START, 0, 0]
    assert features["end_positions"] == [0, 8 - 3 + CONTEXT_START, 8 - 6 + CONTEXT_START, 0, 0]
    for ids, start, end in zip(features["input_ids"], features["start_positions"], features["end_positions"]):
        if start:
            assert tok.convert_ids_to_tokens(ids[start : end + 1]) == FILLER[6:9]


def test_postprocess_recovers_an_answer_that_crosses_a_boundary(tok):
    example = examples(boundary_example())
    features = prepare_eval_features(example, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    start_logits, end_logits = logits_like(features)
    start_logits[1, 6 - 3 + CONTEXT_START] = end_logits[1, 8 - 3 + CONTEXT_START] = 4.0  # answer in window 1
    start_logits[0, 1 + CONTEXT_START] = end_logits[0, 2 + CONTEXT_START] = 3.0  # a weaker span in window 0
    predictions, diffs, nbest = postprocess_predictions(example, features, start_logits, end_logits)
    assert predictions == {"b": words(6, 9)}
    assert diffs == {}
    best = nbest["b"][0]
    assert best["text"] == words(6, 9)
    assert (best["score"], best["start_logit"], best["end_logit"]) == pytest.approx((8.0, 4.0, 4.0))
    assert words(1, 3) in [entry["text"] for entry in nbest["b"]]


NORMALISED_CONTEXT = "The   Café  MÜLLER is a U.S.-based place  in   Paris (1895-1943)."


@pytest.mark.parametrize(
    "answer,tokens",
    [
        ("Café  MÜLLER", ["cafe", "muller"]),
        ("U.S.-based", ["u", ".", "s", ".", "-", "based"]),
        ("U.S.", ["u", ".", "s", "."]),
        ("1895", ["1895"]),
        ("Paris (1895-1943).", ["paris", "(", "1895", "-", "1943", ")", "."]),
    ],
)
def test_normalised_characters_label_and_recover_exactly(tok, answer, tokens):
    example = examples(answered("n", "where is the place", NORMALISED_CONTEXT, answer))
    train = prepare_train_features(example, tok, max_seq_length=64)
    start, end = train["start_positions"][0], train["end_positions"][0]
    assert tok.convert_ids_to_tokens(train["input_ids"][0][start : end + 1]) == tokens

    features = prepare_eval_features(example, tok, max_seq_length=64)
    start_logits, end_logits = logits_like(features)
    start_logits[0, start] = end_logits[0, end] = 5.0
    predictions, _, _ = postprocess_predictions(example, features, start_logits, end_logits)
    assert predictions["n"] == answer


@pytest.mark.parametrize("answer", ["Cafe\u0301", "Cafe\u0301 Mu\u0308ller"])
def test_decomposed_accents_are_kept_in_the_answer(tok, answer):
    context = "The Cafe\u0301 Mu\u0308ller is a place."
    example = examples(answered("d", "where is the place", context, answer))
    train = prepare_train_features(example, tok, max_seq_length=64)
    start, end = train["start_positions"][0], train["end_positions"][0]
    assert start > 0
    features = prepare_eval_features(example, tok, max_seq_length=64)
    start_logits, end_logits = logits_like(features)
    start_logits[0, start] = end_logits[0, end] = 5.0
    assert postprocess_predictions(example, features, start_logits, end_logits)[0]["d"] == answer


def test_misaligned_training_answer_is_skipped(tok):
    context = words(0, 10)
    bad = ("x", QUESTION, context, ["charlie"], [0])  # answer_start points at "alpha"
    features = prepare_train_features(examples(bad, answered("y", QUESTION, context, "delta")), tok)
    assert len(features["input_ids"]) == 1
    assert features["start_positions"] == [3 + CONTEXT_START]


# n-best selection


def test_invalid_spans_are_never_chosen(tok):
    context = words(0, 40)
    example = examples(answered("s", QUESTION, context, "alpha"))
    features = prepare_eval_features(example, tok, max_seq_length=64)
    assert len(features["input_ids"]) == 1
    start_logits, end_logits = logits_like(features, base=-100.0)  # pairs using a base logit score < 0
    c = CONTEXT_START
    start_logits[0, 1] = end_logits[0, 2] = 50.0  # inside the question
    start_logits[0, 0] = end_logits[0, 0] = 40.0  # [CLS]: no null answer in v1.1
    start_logits[0, c + 36], start_logits[0, c + 0], start_logits[0, c + 5] = 15.0, 13.0, 10.0
    end_logits[0, c + 35], end_logits[0, c + 10], end_logits[0, c + 8] = 15.0, 14.0, 9.0
    # (36, 35) and (36, 10): end before start; (0, 35) 36 tokens and (5, 35) 31 tokens: too long.
    predictions, _, nbest = postprocess_predictions(example, features, start_logits, end_logits)
    assert predictions["s"] == words(0, 11)
    assert nbest["s"][0]["score"] == pytest.approx(27.0)
    expected = {words(0, 11): 27.0, words(0, 9): 22.0, words(5, 11): 24.0, words(5, 9): 19.0}
    got = {entry["text"]: entry["score"] for entry in nbest["s"] if entry["score"] > 0}
    assert got == pytest.approx(expected)
    scores = [entry["score"] for entry in nbest["s"]]
    assert scores == sorted(scores, reverse=True)
    assert sum(entry["probability"] for entry in nbest["s"]) == pytest.approx(1.0)
    for entry in nbest["s"]:
        indices = [FILLER.index(word) for word in entry["text"].split()]
        assert indices == list(range(indices[0], indices[0] + len(indices))) and len(indices) <= 30


def test_max_answer_length_is_inclusive_of_30_tokens(tok):
    context = words(0, 40)
    example = examples(answered("s", QUESTION, context, "alpha"))
    features = prepare_eval_features(example, tok, max_seq_length=64)
    start_logits, end_logits = logits_like(features)
    start_logits[0, CONTEXT_START + 2] = end_logits[0, CONTEXT_START + 31] = 9.0  # exactly 30 tokens
    predictions, _, _ = postprocess_predictions(example, features, start_logits, end_logits)
    assert predictions["s"] == words(2, 32)
    predictions, _, _ = postprocess_predictions(example, features, start_logits, end_logits, max_answer_length=29)
    assert predictions["s"] != words(2, 32)


@pytest.mark.parametrize("better_window", [0, 4])
def test_best_span_over_all_windows_wins(tok, better_window):
    example = examples(boundary_example())
    features = prepare_eval_features(example, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    start_logits, end_logits = logits_like(features)
    scores = {0: 3.0, 4: 3.0}
    scores[better_window] = 3.5
    start_logits[0, CONTEXT_START + 1] = end_logits[0, CONTEXT_START + 2] = scores[0]  # tokens 1-2
    start_logits[4, CONTEXT_START + 17 - 12] = end_logits[4, CONTEXT_START + 18 - 12] = scores[4]  # 17-18
    predictions, _, nbest = postprocess_predictions(example, features, start_logits, end_logits)
    assert predictions["b"] == (words(1, 3) if better_window == 0 else words(17, 19))
    assert nbest["b"][0]["score"] == pytest.approx(7.0)
    assert nbest["b"][1]["score"] == pytest.approx(6.0)


def test_nbest_keeps_each_text_once_with_its_best_score(tok):
    example = examples(boundary_example())
    features = prepare_eval_features(example, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    start_logits, end_logits = logits_like(features)
    start_logits[1, CONTEXT_START + 7 - 3] = end_logits[1, CONTEXT_START + 8 - 3] = 4.0  # 7-8 in [3-10]
    start_logits[2, CONTEXT_START + 7 - 6] = end_logits[2, CONTEXT_START + 8 - 6] = 3.0  # the same in [6-13]
    logits = (start_logits, end_logits)
    _, _, nbest = postprocess_predictions(example, features, *logits, require_max_context=False, n_best_size=5)
    # The other top-5 indices are [CLS] and question tokens: the two windows' span is the only valid one.
    assert [entry["text"] for entry in nbest["b"]] == [words(7, 9)]
    assert nbest["b"][0]["score"] == pytest.approx(8.0)


# SQuAD v2.0


def test_unanswerable_training_examples_label_cls(tok):
    context = words(0, 20)
    batch = examples(("u", QUESTION, context, [], []), boundary_example())
    features = prepare_train_features(batch, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    assert len(features["input_ids"]) == 10
    assert features["start_positions"][:5] == [0] * 5 and features["end_positions"][:5] == [0] * 5
    assert any(features["start_positions"][5:])


def v2_logits(features: dict, cls_scores: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """A span of score 4 in window [3-10] (tokens 6-7) and [CLS] logits giving each window's s_null."""
    start_logits, end_logits = logits_like(features)
    start_logits[1, CONTEXT_START + 3] = end_logits[1, CONTEXT_START + 4] = 2.0
    for window, score in enumerate(cls_scores):
        start_logits[window, 0] = end_logits[window, 0] = score / 2
    return start_logits, end_logits


def test_v2_null_uses_the_minimum_over_windows_and_the_threshold(tok):
    example = examples(boundary_example())
    features = prepare_eval_features(example, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)

    # s_null = min(6, 1, 8, 8, 8) = 1 < best span 4: a span (the maximum, 8, would have given "").
    predictions, diffs, nbest = postprocess_predictions(
        example, features, *v2_logits(features, [6, 1, 8, 8, 8]), version_2_with_negative=True
    )
    assert diffs["b"] == pytest.approx(1.0 - 4.0)
    assert predictions["b"] == words(6, 8)
    null_entries = [entry for entry in nbest["b"] if entry["text"] == ""]
    assert len(null_entries) == 1 and null_entries[0]["score"] == pytest.approx(1.0)

    # s_null = 6 beats the span by 2.
    logits = v2_logits(features, [6] * 5)
    for threshold, expected in [(0.0, ""), (1.9, ""), (2.1, words(6, 8))]:
        predictions, diffs, nbest = postprocess_predictions(
            example, features, *logits, version_2_with_negative=True, null_score_diff_threshold=threshold
        )
        assert diffs["b"] == pytest.approx(2.0)
        assert predictions["b"] == expected
        assert apply_null_threshold(nbest, diffs, threshold) == predictions
    assert apply_null_threshold(nbest, diffs, float("inf")) == {"b": words(6, 8)}


def test_v1_never_predicts_the_null_answer(tok):
    example = examples(boundary_example())
    features = prepare_eval_features(example, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    predictions, diffs, nbest = postprocess_predictions(example, features, *v2_logits(features, [30] * 5))
    assert predictions["b"] == words(6, 8) and diffs == {}
    assert all(entry["text"] for entry in nbest["b"])


# Maximum context


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 120), st.integers(1, 30), st.integers(1, 40))
def test_max_context_flags_match_reference(num_tokens, max_tokens_for_doc, doc_stride):
    spans = doc_spans(num_tokens, max_tokens_for_doc, doc_stride)
    flags = max_context_flags(spans, num_tokens)
    pairs = [(s.start, s.length) for s in spans]
    for index, span in enumerate(spans):
        expected = [reference_is_max_context(pairs, index, p) for p in range(span.start, span.end + 1)]
        assert flags[index] == expected
    owners = [
        sum(flags[i][p - s.start] for i, s in enumerate(spans) if s.start <= p <= s.end) for p in range(num_tokens)
    ]
    assert owners == [1] * num_tokens  # every token has exactly one owning window


def test_max_context_rule_takes_the_start_from_the_most_central_window(tok):
    example = examples(boundary_example())
    features = prepare_eval_features(example, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    # Token 6: window [0-7] context min(6, 1) = 1, window [3-10] min(3, 4) = 3, window [6-13] min(0, 7) = 0.
    flags = features["token_is_max_context"]
    token_6 = [flags[window][CONTEXT_START + 6 - start] for window, start in enumerate([0, 3, 6])]
    assert token_6 == [False, True, False]
    start_logits, end_logits = logits_like(features)
    start_logits[0, CONTEXT_START + 6] = end_logits[0, CONTEXT_START + 7] = 10.0  # tokens 6-7 in window [0-7]
    start_logits[1, CONTEXT_START + 3] = end_logits[1, CONTEXT_START + 3] = 4.0  # token 6 in window [3-10]
    predictions, _, nbest = postprocess_predictions(example, features, start_logits, end_logits)
    assert predictions["b"] == FILLER[6] and nbest["b"][0]["score"] == pytest.approx(8.0)
    predictions, _, _ = postprocess_predictions(example, features, start_logits, end_logits, require_max_context=False)
    assert predictions["b"] == words(6, 8)


# datasets.map and the model


def test_datasets_map_round_trip_and_model_inputs(tok):
    from bert_repro import BertReproForQuestionAnswering

    raw = Dataset.from_dict(examples(boundary_example(), answered("n", "where", NORMALISED_CONTEXT, "U.S.-based")))
    kwargs = {"tokenizer": tok, "max_seq_length": MAX_SEQ + 4, "doc_stride": STRIDE}
    train = raw.map(
        prepare_train_features, batched=True, batch_size=1, remove_columns=raw.column_names, fn_kwargs=kwargs
    )
    dev = raw.map(prepare_eval_features, batched=True, remove_columns=raw.column_names, fn_kwargs=kwargs)
    assert len(train) == len(dev)

    model = BertReproForQuestionAnswering(tiny_config(vocab_size=len(tok), num_hidden_layers=1, num_attention_heads=2))
    model.eval()
    batch = {key: torch.tensor(train[key]) for key in train.column_names}
    assert torch.isfinite(model(**batch).loss)
    inputs = {key: torch.tensor(dev[key]) for key in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        output = model(**inputs)
    predictions, _, nbest = postprocess_predictions(raw, dev, output.start_logits.numpy(), output.end_logits.numpy())
    for example_id, context in zip(raw["id"], raw["context"]):
        assert predictions[example_id] and predictions[example_id] in context
        assert len(nbest[example_id]) <= 20

    # Hand-made logits through the Arrow round trip (offsets come back as lists, None kept).
    # Train and eval windows come in the same order; use the training labels of example "n"'s window.
    start_logits, end_logits = logits_like(dev[:])
    row = next(i for i, example_id in enumerate(dev["example_id"]) if example_id == "n")
    start_logits[row, train["start_positions"][row]] = end_logits[row, train["end_positions"][row]] = 5.0
    assert postprocess_predictions(raw, dev, start_logits, end_logits)[0]["n"] == "U.S.-based"


# Boundaries, defaults and edge cases (each pins one rule a mutation of the code would change)


def test_the_smallest_settings_are_accepted_and_the_one_below_refused(tok):
    """max_query_length 0, stride 1 and one-context-token windows are valid; 3 positions leave none for context."""
    context = words(0, 3)
    batch = examples(answered("a", QUESTION, context, "bravo"))
    features = prepare_eval_features(batch, tok, max_seq_length=4, doc_stride=1, max_query_length=0)
    cls, sep = tok.cls_token_id, tok.sep_token_id
    assert features["input_ids"] == [[cls, sep, i, sep] for i in tok.convert_tokens_to_ids(FILLER[:3])]
    assert features["token_is_max_context"] == [[False, False, True, False]] * 3
    train = prepare_train_features(batch, tok, max_seq_length=4, doc_stride=1, max_query_length=0)
    assert (train["start_positions"], train["end_positions"]) == ([0, 2, 0], [0, 2, 0])
    with pytest.raises(ValueError, match="max_seq_length must exceed 3"):
        prepare_eval_features(batch, tok, max_seq_length=3, max_query_length=0)
    with pytest.raises(ValueError, match="doc_stride must be >= 1"):
        prepare_eval_features(batch, tok, doc_stride=0)
    with pytest.raises(ValueError, match="max_query_length must be >= 0"):
        prepare_eval_features(batch, tok, max_query_length=-1)
    with pytest.raises(ValueError, match="max_tokens_for_doc must be >= 1"):
        doc_spans(3, 0, 1)
    with pytest.raises(ValueError, match="doc_stride must be >= 1"):
        doc_spans(3, 1, 0)


def test_the_reference_defaults_384_128_64_and_no_length_warning():
    """Google's defaults 384 / 128 / 64, and no tokenizer length warning: windows cut long inputs themselves."""
    tokenizer = train_wordpiece(iterator=CORPUS * 3, vocab_size=1000, min_frequency=1, show_progress=False)
    question = " ".join(FILLER[i % len(FILLER)] for i in range(520))
    context_words = [FILLER[i % len(FILLER)] for i in range(600)]
    batch = examples(("d", question, " ".join(context_words), [FILLER[0]], [0]))
    context_ids = tokenizer.convert_tokens_to_ids(context_words)
    # max_tokens_for_doc = 384 - 64 - 3 = 317: windows start at 0, 128, 256 and 384 (which reaches the end).
    for features in (prepare_train_features(batch, tokenizer), prepare_eval_features(batch, tokenizer)):
        assert [len(ids) for ids in features["input_ids"]] == [384] * 4
        for window, start in enumerate([0, 128, 256, 384]):
            ids = features["input_ids"][window]
            assert ids.index(tokenizer.sep_token_id) == 64 + 1
            assert window_context_ids(ids, tokenizer) == context_ids[start : start + 317]
    assert "sequence-length-is-longer-than-the-specified-maximum" not in tokenizer.deprecation_warnings


def test_eval_feature_columns_line_up_with_the_input_ids(tok):
    """offset_mapping and token_is_max_context: one entry per position, None / False outside the window's context."""
    context = words(0, 16)  # max_tokens_for_doc 14, stride 3: windows [0-13] and [3-15] (13 tokens)
    example = examples(answered("a", QUESTION, context, "alpha"))
    offsets_all = tok(context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    offsets_all = [tuple(o) for o in offsets_all]
    for pad, tails in ((True, [1, 2]), (False, [1, 1])):  # the [SEP] after the context, then padding
        features = prepare_eval_features(example, tok, max_seq_length=20, doc_stride=STRIDE, pad_to_max_length=pad)
        for window, (start, length) in enumerate([(0, 14), (3, 13)]):
            ids = features["input_ids"][window]
            assert len(ids) == CONTEXT_START + length + tails[window]
            window_offsets = offsets_all[start : start + length]
            after = [None] * tails[window]
            assert features["offset_mapping"][window] == [None] * CONTEXT_START + window_offsets + after
            flags = features["token_is_max_context"][window]
            assert len(flags) == len(ids)
            assert not any(flags[:CONTEXT_START]) and not any(flags[CONTEXT_START + length :])


def test_max_context_scores_only_the_windows_that_hold_the_token():
    """Only windows that contain a token score it: a long window starting just after the token must not claim it."""
    assert max_context_flags([DocSpan(0, 1), DocSpan(1, 300)], 301) == [[True], [True] * 300]


def test_an_answer_that_starts_before_the_window_is_not_labelled_there(tok):
    context = words(0, 20)
    batch = examples(("c", QUESTION, context, [words(2, 5)], [char_start(context, 2)]))  # tokens 2..4
    features = prepare_train_features(batch, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    # Window [0-7] holds it; [3-10] holds its end only.
    assert features["start_positions"] == [2 + CONTEXT_START, 0, 0, 0, 0]
    assert features["end_positions"] == [4 + CONTEXT_START, 0, 0, 0, 0]


def test_whitespace_answers_cover_no_token_and_are_skipped_and_counted(tok, caplog):
    context = " alpha  bravo charlie "
    rows = [
        ("lead", QUESTION, context, [" "], [0]),  # before every token
        ("gap", QUESTION, context, [" "], [7]),  # between alpha and bravo
        ("tail", QUESTION, context, [" "], [len(context) - 1]),  # after every token
        answered("ok", QUESTION, context, "bravo"),
    ]
    with caplog.at_level("WARNING", logger="bert_repro.tasks.squad"):
        features = prepare_train_features(examples(*rows), tok, max_seq_length=32)
    assert (features["start_positions"], features["end_positions"]) == ([1 + CONTEXT_START], [1 + CONTEXT_START])
    skipped = "skipped 3 training example(s) whose answer_start does not point at the answer text"
    assert [r.getMessage() for r in caplog.records] == [skipped]
    caplog.clear()
    with caplog.at_level("WARNING", logger="bert_repro.tasks.squad"):
        prepare_train_features(examples(rows[-1]), tok, max_seq_length=32)
    assert not caplog.records  # nothing skipped: no warning


def test_start_ties_go_to_the_earlier_token(tok):
    """Equal logits: the n best are taken in position order (a stable sort), so the first tied token wins."""
    context = words(0, 40)
    example = examples(answered("t", QUESTION, context, "alpha"))
    features = prepare_eval_features(example, tok, max_seq_length=64)
    start_logits, end_logits = logits_like(features)
    start_logits[0, CONTEXT_START + 10 : CONTEXT_START + 40] = 1.0
    end_logits[0, CONTEXT_START + 12 : CONTEXT_START + 40] = 1.0
    predictions, _, _ = postprocess_predictions(example, features, start_logits, end_logits, n_best_size=1)
    assert predictions["t"] == words(10, 13)


def test_logits_wider_than_the_offsets_are_fine(tok):
    """Unpadded features with logits padded to a longer row: a top logit just past the last offset is no token."""
    context = words(0, 5)
    example = examples(answered("w", QUESTION, context, "alpha"))
    features = prepare_eval_features(example, tok, max_seq_length=32, pad_to_max_length=False)
    width = len(features["offset_mapping"][0])
    start_logits, end_logits = np.full((1, width + 4), -5.0), np.full((1, width + 4), -5.0)
    start_logits[0, width] = end_logits[0, width] = 9.0
    start_logits[0, CONTEXT_START + 1] = end_logits[0, CONTEXT_START + 2] = 1.0
    assert postprocess_predictions(example, features, start_logits, end_logits)[0] == {"w": words(1, 3)}
    with pytest.raises(ValueError, match="got 2 start / 1 end logit rows for 1 features"):
        postprocess_predictions(example, features, np.vstack([start_logits] * 2), end_logits)
    with pytest.raises(ValueError, match="got 1 start / 2 end logit rows for 1 features"):
        postprocess_predictions(example, features, start_logits, np.vstack([end_logits] * 2))


def test_an_example_without_windows_or_without_a_valid_span(tok):
    """No window, or no valid span: "" (v2.0: the null answer alone) with diff +inf."""
    batch = examples(("empty", QUESTION, "", [], []), ("q", QUESTION, words(0, 5), [], []))
    features = prepare_eval_features(batch, tok, max_seq_length=32)
    assert features["example_id"] == ["q"]
    start_logits, end_logits = logits_like(features)
    start_logits[0, 1] = end_logits[0, 1] = 5.0  # a question token
    for v2 in (False, True):
        predictions, diffs, nbest = postprocess_predictions(
            batch, features, start_logits, end_logits, n_best_size=1, version_2_with_negative=v2
        )
        assert predictions == {"empty": "", "q": ""}
        assert diffs == ({"empty": float("inf"), "q": float("inf")} if v2 else {})
        assert nbest["empty"] == []
        assert [entry["text"] for entry in nbest["q"]] == ([""] if v2 else [])
        assert apply_null_threshold(nbest, diffs, 0.0) == predictions if v2 else True


def test_nbest_list_length_and_where_the_null_answer_stands(tok):
    """The n-best list holds n_best_size texts; v2.0's null answer is ranked among them, or added after the cut."""
    example = examples(answered("n", QUESTION, words(0, 10), "alpha"))
    features = prepare_eval_features(example, tok, max_seq_length=32)
    start_logits, end_logits = logits_like(features)
    start_logits[0, CONTEXT_START] = 4.0  # spans from token 0 to tokens 0, 1, 2: scores 8, 6, 4
    end_logits[0, CONTEXT_START : CONTEXT_START + 3] = [4.0, 2.0, 0.0]
    start_logits[0, 0] = end_logits[0, 0] = 2.5  # s_null = 5
    v2 = {"version_2_with_negative": True}
    _, _, nbest = postprocess_predictions(example, features, start_logits, end_logits, n_best_size=3, **v2)
    assert [entry["text"] for entry in nbest["n"]] == [words(0, 1), words(0, 2), ""]  # 8, 6, null 5; not 4
    _, _, nbest = postprocess_predictions(example, features, start_logits, end_logits, n_best_size=1, **v2)
    assert [entry["text"] for entry in nbest["n"]] == [words(0, 1), ""]
    start_logits[0, 0] = end_logits[0, 0] = 9.0  # s_null = 18: first
    _, _, nbest = postprocess_predictions(example, features, start_logits, end_logits, n_best_size=2, **v2)
    assert [entry["text"] for entry in nbest["n"]] == ["", words(0, 1)]


def test_nbest_probabilities_do_not_overflow_at_large_logits(tok):
    example = examples(answered("p", QUESTION, words(0, 10), "alpha"))
    features = prepare_eval_features(example, tok, max_seq_length=32)
    start_logits, end_logits = logits_like(features)
    # Spans 0-1 and 1-1, scores 800 and 800 - log 3: probabilities 3/4 and 1/4.
    start_logits[0, CONTEXT_START : CONTEXT_START + 2] = [400.0, 400.0 - np.log(3)]
    end_logits[0, CONTEXT_START + 1] = 400.0
    _, _, nbest = postprocess_predictions(example, features, start_logits, end_logits, n_best_size=2)
    assert [entry["probability"] for entry in nbest["p"]] == pytest.approx([0.75, 0.25])


def test_v2_default_threshold_is_zero_and_a_tie_keeps_the_span(tok):
    """The reference's rule: "" only when s_null - best_non_null EXCEEDS the threshold (default 0)."""
    example = examples(boundary_example())
    features = prepare_eval_features(example, tok, max_seq_length=MAX_SEQ, doc_stride=STRIDE)
    for s_null, expected in [(4.5, ""), (4.0, words(6, 8)), (3.5, words(6, 8))]:  # the span scores 4
        predictions, diffs, nbest = postprocess_predictions(
            example, features, *v2_logits(features, [s_null] * 5), version_2_with_negative=True
        )
        assert diffs["b"] == s_null - 4.0 and predictions["b"] == expected
        assert apply_null_threshold(nbest, diffs, 0.0) == predictions


def test_apply_null_threshold_without_a_span():
    nbest = {"null": [{"text": "", "score": 1.0}], "none": [], "span": [{"text": "x"}, {"text": ""}]}
    diffs = {"null": -1.0, "none": -1.0, "span": 0.5}
    assert apply_null_threshold(nbest, diffs, 0.5) == {"null": "", "none": "", "span": "x"}
    assert apply_null_threshold(nbest, diffs, 0.0) == {"null": "", "none": "", "span": ""}
