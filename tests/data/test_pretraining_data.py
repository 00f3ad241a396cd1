"""bert_repro.data.sentences and pretraining_examples against paper §3.1 / A.2 and create_pretraining_data.py.

Integer documents have every token unique, so each segment can be traced back to its document and offset.
"""

import copy
import dataclasses
import hashlib
import json
import logging
import math
import random
import re
import time

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.corpora import SPECIALS, pseudo_text, word_tokenizer, wordpiece_tokenizer
from support.models import hf_config_like, tiny_config
from transformers import BertTokenizer, HfArgumentParser

from bert_repro.data.balanced_map import _balanced_order
from bert_repro.data.example_statistics import pretraining_statistics
from bert_repro.data.masking import WordPieceVocab, create_masked_lm_predictions, mask_batch
from bert_repro.data.pretraining_config import PreTrainingDataConfig
from bert_repro.data.pretraining_examples import (
    IGNORE_INDEX,
    PreTrainingCollator,
    create_pretraining_dataset,
    create_pretraining_instances,
    instance_features,
)
from bert_repro.data.sentences import looks_like_binary, split_sentences
from bert_repro.data.tokenized_documents import tokenize_documents
from bert_repro.data.training_instances import (
    NOT_NEXT,
    TrainingInstance,
    create_instances_from_document,
    create_training_instances,
    document_rng,
    truncate_seq_pair,
)

# Integer corpora: ids 0-4 are special (as in a freshly trained vocabulary), corpus tokens start at 1000.
INT_VOCAB = WordPieceVocab(cls_token=2, sep_token=3, mask_token=4, vocab_words=range(50_000), pad_token=0)
FIVE_SIGMA = 5.0


# Helpers


def int_corpus(sentence_lengths: list[list[int]], first_token: int = 1000) -> list[list[list[int]]]:
    """Documents of sentences of the given lengths; every token in the corpus is a different integer."""
    next_token = first_token
    corpus = []
    for lengths in sentence_lengths:
        doc = []
        for n in lengths:
            doc.append(list(range(next_token, next_token + n)))
            next_token += n
        corpus.append(doc)
    return corpus


def locator(corpus: list[list[list[int]]]) -> tuple[dict[int, tuple[int, int]], list[list[int]]]:
    """token -> (document, offset in the document's token stream), and the streams themselves."""
    streams = [[t for s in doc for t in s] for doc in corpus]
    where = {t: (d, i) for d, stream in enumerate(streams) for i, t in enumerate(stream)}
    return where, streams


def restore(tokens: list, positions: list[int], labels: list) -> list:
    """Undo the masks: the original token at every masked position."""
    out = list(tokens)
    for p, label in zip(positions, labels, strict=True):
        out[p] = label
    return out


def split_pair(tokens: list, segment_ids: list[int], vocab: WordPieceVocab) -> tuple[list, list]:
    """Segments A and B of ``[CLS] A [SEP] B [SEP]``, checking the frame and the segment ids on the way."""
    n_a = segment_ids.count(0) - 2
    assert tokens[0] == vocab.cls_token
    assert tokens[n_a + 1] == vocab.sep_token and tokens[-1] == vocab.sep_token
    assert segment_ids == [0] * (n_a + 2) + [1] * (len(tokens) - n_a - 2)
    a, b = tokens[1 : n_a + 1], tokens[n_a + 2 : -1]
    assert a and b
    assert vocab.cls_token not in a + b and vocab.sep_token not in a + b
    return a, b


def slice_of(segment: list[int], where: dict, streams: list[list[int]]) -> tuple[int, int] | None:
    """(document, start offset) when ``segment`` is a contiguous slice of one document, else None."""
    located = [(k, where[t]) for k, t in enumerate(segment) if t in where]
    if not located:
        return None
    k, (doc, offset) = located[0]
    start = offset - k
    if start < 0 or streams[doc][start : start + len(segment)] != segment:
        return None
    return doc, start


def num_to_predict(length: int, masked_lm_prob: float, max_predictions_per_seq: int) -> int:
    return min(max_predictions_per_seq, max(1, round(length * masked_lm_prob)))


def assert_share(count: int, total: int, p: float, what: str) -> None:
    """``count`` out of ``total`` is within five binomial standard deviations of ``p``."""
    sigma = math.sqrt(p * (1 - p) / total)
    assert abs(count / total - p) <= FIVE_SIGMA * sigma, f"{what}: {count}/{total} = {count / total:.4f}, want {p}"


class ScriptedRandom:
    """Stands in for random.Random: returns scripted values, records every call; shuffle keeps the order."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.calls: list[tuple] = []

    def _next(self):
        return self.script.pop(0)

    def random(self) -> float:
        self.calls.append(("random",))
        return self._next()

    def randint(self, a: int, b: int) -> int:
        self.calls.append(("randint", a, b))
        value = self._next()
        assert a <= value <= b
        return value

    def shuffle(self, x: list) -> None:
        self.calls.append(("shuffle", len(x)))


def table_digest(ds: datasets.Dataset) -> str:
    """SHA-256 of the dataset's Arrow data (one chunk per column, so the chunk layout does not matter)."""
    table = ds.with_format("arrow")[:].combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


@pytest.fixture(scope="module")
def pseudo_corpus() -> list[str]:
    return pseudo_text(30)


@pytest.fixture(scope="module")
def trained_tokenizer(pseudo_corpus) -> BertTokenizer:
    # small, so that most pseudo-words are split into ## pieces
    return wordpiece_tokenizer(pseudo_corpus, vocab_size=150)


def unique_word_corpus(num_docs: int = 14, seed: int = 3) -> tuple[list[str], list[str]]:
    """Texts in which every word occurs once, and those words (lower-case), for an exact vocabulary."""
    rng = random.Random(seed)
    counter = 0
    words: list[str] = []
    texts = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.randint(1, 12)):
            sentence = []
            for _ in range(rng.randint(1, 15)):
                word, n = "", counter
                counter += 1
                for _ in range(4):
                    word, n = "abcdefghijklmnopqrstuvwxyz"[n % 26] + word, n // 26
                words.append("q" + word)
                sentence.append("q" + word)
            sentences.append(" ".join(sentence).capitalize() + ".")
        texts.append("\n".join(sentences[:2]) + "\n\n" + " ".join(sentences[2:]))
    return texts, words


@pytest.fixture(scope="module")
def unique_words():
    texts, words = unique_word_corpus()
    return texts, word_tokenizer(words)


# Sentence splitting


def test_split_sentences_rules():
    text = (
        "Mr. Smith went to Washington, D.C. on Jan. 5. He paid $3.50 for e.g. coffee! Did he? "
        'Yes... he did. "Stop." Then J. R. R. Tolkien wrote it.\n'
        "A wrapped\nline ends here.\n\nHeading without a period\n  \nNew paragraph."
    )
    assert split_sentences(text) == [
        "Mr. Smith went to Washington, D.C. on Jan. 5.",
        "He paid $3.50 for e.g. coffee!",
        "Did he?",
        "Yes... he did.",
        '"Stop."',
        "Then J. R. R. Tolkien wrote it.",
        "A wrapped line ends here.",
        "Heading without a period",
        "New paragraph.",
    ]
    assert split_sentences("One line\nAnother line", split_lines=True) == ["One line", "Another line"]
    assert split_sentences("第一句。第二句！Third.") == ["第一句。", "第二句！", "Third."]
    assert split_sentences("") == [] and split_sentences(" \n\n \t") == []


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aB .!?\n\"'()3。") + ["\u2026", "\u00a0"]), max_size=200))
def test_split_sentences_keeps_all_text_in_order(text):
    sentences = split_sentences(text)
    assert all(s and s == s.strip() for s in sentences)
    assert re.sub(r"\s", "", "".join(sentences)) == re.sub(r"\s", "", text)


@pytest.mark.parametrize(
    "text", ["x. " * 30_000, "." * 100_000, "a" * 100_000, "word " * 20_000, ". A" * 33_000, '!" ' * 30_000]
)
def test_split_sentences_is_fast_on_pathological_lines(text):
    start = time.perf_counter()
    split_sentences(text)
    assert time.perf_counter() - start < 2.0


def test_looks_like_binary():
    assert looks_like_binary("abc\x00def")
    assert looks_like_binary(bytes(range(256)).decode("latin-1"))
    assert looks_like_binary("\ufffd\ufffdab")
    assert not looks_like_binary("Plain text.\n\tWith tabs and new lines.")
    assert not looks_like_binary("")


# Configuration


@pytest.mark.parametrize(
    "bad",
    [
        {"max_seq_length": 4},
        {"max_seq_length": 0},
        {"masked_lm_prob": 0.0},
        {"max_predictions_per_seq": 0},
        {"short_seq_prob": 1.5},
        {"dupe_factor": 0},
        {"mask_replace_prob": 0.9, "random_replace_prob": 0.2},
    ],
)
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        PreTrainingDataConfig(**bad)


def test_config_defaults_are_the_reference_flags():
    c = PreTrainingDataConfig()
    fields = "max_seq_length max_predictions_per_seq masked_lm_prob short_seq_prob dupe_factor random_seed"
    assert [getattr(c, f) for f in fields.split()] == [128, 20, 0.15, 0.1, 10, 12345]
    assert (c.do_whole_word_mask, c.static_masking) == (False, True)
    assert c.max_num_tokens == 125
    parsed = HfArgumentParser(PreTrainingDataConfig).parse_args_into_dataclasses(
        ["--max_seq_length", "512", "--max_predictions_per_seq", "80", "--do_whole_word_mask", "--dupe_factor", "5"]
    )[0]
    assert (parsed.max_seq_length, parsed.max_predictions_per_seq, parsed.do_whole_word_mask) == (512, 80, True)


# The reference algorithm, call by call


def test_random_draws_follow_the_reference_isnext_then_forced_notnext():
    corpus = [[[10, 11], [12, 13], [14, 15]], [[20, 21, 22]]]
    config = PreTrainingDataConfig(max_seq_length=7, max_predictions_per_seq=1, masked_lm_prob=0.15)
    vocab = WordPieceVocab(cls_token=2, sep_token=3, mask_token=4, vocab_words=range(30))
    rng = ScriptedRandom([0.5, 1, 0.7, 0.9, 0.2, 1, 0, 0.3, 0.95, 0.7, 17])
    instances = create_instances_from_document(corpus, 0, vocab, rng, config)
    assert rng.calls == [
        ("random",),  # short_seq_prob: no, target = max_num_tokens = 4
        ("randint", 1, 1),  # a_end of the two-sentence chunk
        ("random",),  # coin: >= 0.5, IsNext
        ("shuffle", 4),
        ("random",),
        ("random",),  # one position: not [MASK], then "unchanged"
        # The last sentence is a one-sentence chunk: NotNext without a coin.
        ("randint", 0, 1),  # the other document (1 != 0: taken at the first try)
        ("randint", 0, 0),  # its start sentence
        ("random",),  # truncation of B (3 > 2 tokens) from the front
        ("shuffle", 4),
        ("random",),
        ("random",),
        ("randint", 0, 29),  # random replacement, vocabulary id 17
    ]
    assert not rng.script
    assert instances == [
        TrainingInstance([2, 10, 11, 3, 12, 13, 3], [0, 0, 0, 0, 1, 1, 1], False, [1], [10]),
        TrainingInstance([2, 17, 15, 3, 21, 22, 3], [0, 0, 0, 0, 1, 1, 1], True, [1], [14]),
    ]


def test_random_draws_follow_the_reference_single_document_and_put_back():
    corpus = [[[10], [11], [12]]]
    config = PreTrainingDataConfig(max_seq_length=8, static_masking=False)
    rng = ScriptedRandom([0.05, 2, 1, 0.1] + [0] * 10 + [2, 1, 0.6])
    instances = create_instances_from_document(corpus, 0, INT_VOCAB, rng, config)
    assert rng.calls == [
        ("random",),
        ("randint", 2, 5),  # a short target: 2 tokens
        ("randint", 1, 1),
        ("random",),  # chunk [10] [11]: A = [10], coin < 0.5: NotNext
        *[("randint", 0, 0)] * 10,  # ten tries for another document; there is none: the same one is used
        ("randint", 0, 2),  # B starts at sentence 2
        ("randint", 1, 1),
        ("random",),  # [11] was put back: chunk [11] [12], IsNext
    ]
    assert [(i.tokens, i.is_random_next) for i in instances] == [([2, 10, 3, 12, 3], True), ([2, 11, 3, 12, 3], False)]


def test_whole_word_groups_and_budget_follow_the_reference():
    tokens = ["[CLS]", "un", "##believ", "##able", "story", "[SEP]", "##s", "end", "[SEP]"]
    vocab = WordPieceVocab.from_vocab_words(SPECIALS + ["un", "##believ", "##able", "story", "##s", "end"])
    rng = ScriptedRandom([0.1] * 4)
    out, positions, labels = create_masked_lm_predictions(tokens, 0.5, 20, vocab, rng, do_whole_word_mask=True)
    # Groups [1, 2, 3], [4, 6] (a ## piece after [SEP] joins the word before it, as in the reference), [7];
    # budget round(9 * 0.5) = 4: the first group (3) is taken, the second (2 more) skipped, the third taken.
    assert rng.calls == [("shuffle", 3)] + [("random",)] * 4
    assert positions == [1, 2, 3, 7] and labels == ["un", "##believ", "##able", "end"]
    assert out == ["[CLS]", "[MASK]", "[MASK]", "[MASK]", "story", "[SEP]", "##s", "[MASK]", "[SEP]"]


def reference_truncate(tokens_a, tokens_b, max_num_tokens, rng):
    """create_pretraining_data.py's truncate_seq_pair, transcribed."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.integers(2, 50),
    st.lists(st.sampled_from([0.0, 0.3, 0.5, 0.7]), min_size=1),
)
def test_truncate_seq_pair_is_the_references_loop(len_a, len_b, max_num_tokens, draws):
    a, b = list(range(len_a)), list(range(100, 100 + len_b))
    want_a, want_b = list(a), list(b)
    # the same draws on both sides, 0.5 among them ("front" is a draw below it); at most 78 tokens are dropped
    truncate_seq_pair(a, b, max_num_tokens, ScriptedRandom(draws * 80))
    reference_truncate(want_a, want_b, max_num_tokens, ScriptedRandom(draws * 80))
    assert (a, b) == (want_a, want_b)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(1, 60), st.integers(2, 80), st.integers(0, 2**32))
def test_truncate_seq_pair(len_a, len_b, max_num_tokens, seed):
    a, b = list(range(len_a)), list(range(100, 100 + len_b))
    truncate_seq_pair(a, b, max_num_tokens, random.Random(seed))
    # The lengths do not depend on the draws: one token at a time off the longer segment, B on a tie.
    want_a, want_b = len_a, len_b
    while want_a + want_b > max_num_tokens:
        want_a, want_b = (want_a - 1, want_b) if want_a > want_b else (want_a, want_b - 1)
    assert (len(a), len(b)) == (want_a, want_b)
    assert a and b
    # What is left is a contiguous piece of each segment.
    assert a == list(range(a[0], a[0] + len(a))) and b == list(range(b[0], b[0] + len(b)))


# Pairs: structure, IsNext / NotNext provenance, coverage


def check_instances(instances, corpus, config, vocab=INT_VOCAB):
    """Frame, segments, provenance and mask counts of every instance built from an integer corpus."""
    where, streams = locator(corpus)
    for inst in instances:
        assert len(inst.tokens) <= config.max_seq_length
        original = restore(inst.tokens, inst.masked_lm_positions, inst.masked_lm_labels)
        a, b = split_pair(original, inst.segment_ids, vocab)
        loc_a, loc_b = slice_of(a, where, streams), slice_of(b, where, streams)
        assert loc_a is not None and loc_b is not None, "a segment is not contiguous text of one document"
        if inst.is_random_next:
            assert loc_b[0] != loc_a[0], "NotNext B from the same document"
        else:
            assert loc_b[0] == loc_a[0] and loc_b[1] >= loc_a[1] + len(a), "IsNext B does not follow A"
        if config.static_masking:
            positions = inst.masked_lm_positions
            assert positions == sorted(set(positions))
            assert all(original[p] not in (vocab.cls_token, vocab.sep_token) for p in positions)
            budget = num_to_predict(len(inst.tokens), config.masked_lm_prob, config.max_predictions_per_seq)
            assert len(positions) == budget if not config.do_whole_word_mask else len(positions) <= budget
            unmasked = [i for i in range(len(original)) if i not in set(positions)]
            assert all(inst.tokens[i] == original[i] for i in unmasked)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=8), min_size=8, max_size=12),
    st.integers(5, 70),
    st.sampled_from([0.0, 0.1, 0.6]),
    st.integers(0, 2**32),
)
def test_pairs_are_well_formed_and_traceable(lengths, max_seq_length, short_seq_prob, seed):
    corpus = int_corpus(lengths)
    config = PreTrainingDataConfig(
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        dupe_factor=2,
        max_predictions_per_seq=max(1, max_seq_length // 5),
    )
    instances = create_training_instances(corpus, INT_VOCAB, config, random.Random(seed))
    assert instances
    check_instances(instances, corpus, config)


def test_every_sentence_is_used_exactly_dupe_factor_times():
    # 4-token sentences, max_num_tokens 16, no short targets: nothing is truncated, so every sentence shows up
    # whole, once per round, in A or in an IsNext B.
    rng = random.Random(7)
    corpus = int_corpus([[4] * rng.randint(1, 30) for _ in range(25)])
    config = PreTrainingDataConfig(max_seq_length=19, short_seq_prob=0.0, dupe_factor=3)
    instances = create_training_instances(corpus, INT_VOCAB, config, random.Random(1))
    check_instances(instances, corpus, config)
    where, _ = locator(corpus)
    uses: dict[tuple[int, int], int] = {}
    for inst in instances:
        a, b = split_pair(
            restore(inst.tokens, inst.masked_lm_positions, inst.masked_lm_labels), inst.segment_ids, INT_VOCAB
        )
        assert len(a) % 4 == 0 and len(b) % 4 == 0 and len(a) + len(b) <= 16
        own = a if inst.is_random_next else a + b
        doc, start = where[own[0]]
        assert start % 4 == 0
        for k in range(len(own) // 4):
            uses[(doc, start // 4 + k)] = uses.get((doc, start // 4 + k), 0) + 1
    expected = {(d, s): 3 for d, doc in enumerate(corpus) for s in range(len(doc))}
    assert uses == expected


def test_nsp_labels_are_balanced():
    # Only a document's last chunk may be a single sentence (forced NotNext); every other chunk gets a fair coin.
    corpus = int_corpus([[5] * 60 for _ in range(40)])
    config = PreTrainingDataConfig(max_seq_length=23, dupe_factor=4, static_masking=False)
    instances = create_training_instances(corpus, INT_VOCAB, config, random.Random(3))
    n, not_next = len(instances), sum(i.is_random_next for i in instances)
    forced_at_most = len(corpus) * config.dupe_factor
    sigma = math.sqrt(0.25 / n)
    assert 0.5 - FIVE_SIGMA * sigma <= not_next / n <= 0.5 + FIVE_SIGMA * sigma + forced_at_most / n


def test_single_document_corpus_follows_the_reference():
    corpus = int_corpus([[6] * 20])
    config = PreTrainingDataConfig(max_seq_length=20, dupe_factor=2)
    instances = create_training_instances(corpus, INT_VOCAB, config, random.Random(0))
    where, streams = locator(corpus)
    not_next = [i for i in instances if i.is_random_next]
    assert not_next  # B then comes from the only document there is
    for inst in instances:
        a, b = split_pair(
            restore(inst.tokens, inst.masked_lm_positions, inst.masked_lm_labels), inst.segment_ids, INT_VOCAB
        )
        assert slice_of(a, where, streams) and slice_of(b, where, streams)


def test_same_seed_same_instances_and_one_sentence_documents_kept():
    corpus = int_corpus([[3, 4], [7], [2, 2, 2], [9], [1, 1]])
    config = PreTrainingDataConfig(max_seq_length=12, dupe_factor=3)
    first = create_training_instances(corpus, INT_VOCAB, config)
    assert first == create_training_instances(corpus, INT_VOCAB, config)
    seed_1 = create_training_instances(
        corpus, INT_VOCAB, PreTrainingDataConfig(max_seq_length=12, dupe_factor=3, random_seed=1)
    )
    assert first != seed_1
    assert create_training_instances(corpus, INT_VOCAB, config, random.Random(1)) == seed_1  # a given stream wins
    where, _ = locator(corpus)
    # Each one-sentence document yields one NotNext instance per round, with that sentence as segment A.
    for doc in (1, 3):
        firsts = [
            i
            for i in first
            if where.get(restore(i.tokens, i.masked_lm_positions, i.masked_lm_labels)[1], (None,))[0] == doc
        ]
        assert len(firsts) == 3 and all(i.is_random_next for i in firsts)


# Masking statistics


@pytest.mark.parametrize("masked_lm_prob,max_pred,p_mask,p_random", [(0.15, 20, 0.8, 0.1), (0.3, 40, 0.5, 0.3)])
def test_masked_share_and_replacement_split(masked_lm_prob, max_pred, p_mask, p_random):
    rng = random.Random(11)
    corpus = int_corpus([[rng.randint(3, 30) for _ in range(rng.randint(2, 25))] for _ in range(150)])
    config = PreTrainingDataConfig(
        max_seq_length=128,
        max_predictions_per_seq=max_pred,
        dupe_factor=5,
        masked_lm_prob=masked_lm_prob,
        mask_replace_prob=p_mask,
        random_replace_prob=p_random,
    )
    instances = create_training_instances(corpus, INT_VOCAB, config, random.Random(5))
    check_instances(instances, corpus, config)  # exact count per instance: min(max_pred, max(1, round(len * p)))
    shown = [
        (inst.tokens[p], label)
        for inst in instances
        for p, label in zip(inst.masked_lm_positions, inst.masked_lm_labels, strict=True)
    ]
    total = len(shown)
    assert total > 20_000
    as_mask = sum(s == INT_VOCAB.mask_token for s, _ in shown)
    unchanged = sum(s == label for s, label in shown)
    # A random draw equal to the original counts as unchanged: probability 1 / vocabulary size.
    p_same = p_random / len(INT_VOCAB.vocab_words)
    assert_share(as_mask, total, p_mask, "[MASK]")
    assert_share(unchanged, total, 1 - p_mask - p_random + p_same, "unchanged")
    assert_share(total - as_mask - unchanged, total, p_random - p_same, "random")
    tokens = sum(len(i.tokens) for i in instances)
    expected = sum(num_to_predict(len(i.tokens), masked_lm_prob, max_pred) for i in instances)
    assert total == expected and total / tokens <= masked_lm_prob + 0.01


def word_spans(tokens: list[int], vocab: WordPieceVocab) -> list[list[int]]:
    """Positions of each word inside one segment: a word-initial piece and the ## pieces right after it."""
    spans: list[list[int]] = []
    for i, t in enumerate(tokens):
        if t in (vocab.cls_token, vocab.sep_token):
            spans.append([])
        elif t in vocab.subword_tokens and spans and spans[-1]:
            spans[-1].append(i)
        elif t not in vocab.subword_tokens:
            spans.append([i])
    return [s for s in spans if len(s) > 1]


def split_words(instances: list[TrainingInstance], vocab: WordPieceVocab) -> tuple[int, int]:
    """(multi-piece words partly masked, multi-piece words wholly masked) over all instances."""
    partly = wholly = 0
    for inst in instances:
        masked = set(inst.masked_lm_positions)
        original = restore(inst.tokens, inst.masked_lm_positions, inst.masked_lm_labels)
        for span in word_spans(original, vocab):
            hit = sum(p in masked for p in span)
            partly += 0 < hit < len(span)
            wholly += hit == len(span)
    return partly, wholly


def test_whole_word_masking_never_splits_a_word(pseudo_corpus, trained_tokenizer):
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": pseudo_corpus}), trained_tokenizer)
    corpus = [d for d in docs["sentences"] if d]
    wwm = PreTrainingDataConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=4, do_whole_word_mask=True)
    instances = create_training_instances(corpus, vocab, wwm)
    partly, wholly = split_words(instances, vocab)
    assert partly == 0 and wholly > 200
    for inst in instances:
        assert len(inst.masked_lm_positions) <= num_to_predict(len(inst.tokens), 0.15, 10)
    # The check can fail: masking token by token does split words of this corpus.
    per_token = create_training_instances(
        corpus, vocab, PreTrainingDataConfig(max_seq_length=64, dupe_factor=4, max_predictions_per_seq=10)
    )
    assert split_words(per_token, vocab)[0] > 50


# datasets pipeline


def test_pipeline_pairs_trace_back_to_the_text(unique_words):
    texts, tokenizer = unique_words
    vocab = WordPieceVocab.from_tokenizer(tokenizer)
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": texts}), tokenizer)
    corpus = [d for d in docs["sentences"] if d]
    assert sum(len(d) for d in corpus) == sum(t.count(".") for t in texts)  # one period per sentence
    config = PreTrainingDataConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=3)
    ds = create_pretraining_instances(docs, vocab, config, num_proc=2)
    rows = ds.to_list()
    assert {r["next_sentence_label"] for r in rows} == {0, 1}
    instances = [
        TrainingInstance(
            r["input_ids"],
            r["token_type_ids"],
            r["next_sentence_label"] == NOT_NEXT,
            r["masked_lm_positions"],
            r["masked_lm_ids"],
        )
        for r in rows
    ]
    # Periods are the only token that occurs more than once; tokens are located by their unique words.
    period = tokenizer.convert_tokens_to_ids(".")
    stripped = [[[t for t in s if t != period] for s in d] for d in corpus]
    for inst in instances:
        original = restore(inst.tokens, inst.masked_lm_positions, inst.masked_lm_labels)
        keep = [k for k, t in enumerate(original) if t != period]
        inst.tokens = [original[k] for k in keep]
        inst.segment_ids = [inst.segment_ids[k] for k in keep]
        inst.masked_lm_positions, inst.masked_lm_labels = [], []
    usable = [i for i in instances if i.segment_ids.count(0) > 2 and i.segment_ids.count(1) > 1]
    assert len(usable) > 0.8 * len(instances)
    check_instances(usable, stripped, PreTrainingDataConfig(max_seq_length=32, static_masking=False), vocab)


def test_document_streams_are_distinct_and_pinned():
    draws = {
        (seed, doc, r): document_rng(seed, doc, r).random() for seed in (0, 1) for doc in range(20) for r in range(3)
    }
    assert len(set(draws.values())) == len(draws)
    # The derivation is part of the data format: the same seed must give the same bytes in later versions.
    assert document_rng(12345, 0, 0).random() == 0.10044395476077217
    assert document_rng(12345, 7, 3).random() == 0.008108005142069774


def test_pipeline_matches_the_core_algorithm_document_by_document(pseudo_corpus, trained_tokenizer):
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    texts = pseudo_corpus[:12] + ["", "A single sentence.", ""]  # an empty document last, too
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": texts}), trained_tokenizer)
    config = PreTrainingDataConfig(max_seq_length=40, dupe_factor=2, random_seed=99, do_whole_word_mask=True)
    built = create_pretraining_instances(docs, vocab, config, shuffle=False).to_list()

    corpus = [d for d in docs["sentences"] if d]
    rows = [row for row, d in enumerate(docs["sentences"]) if d]
    expected = []
    for position, row in enumerate(rows):
        for dupe_round in range(config.dupe_factor):
            rng = document_rng(config.random_seed, row, dupe_round)
            for inst in create_instances_from_document(corpus, position, vocab, rng, config):
                expected.append(
                    {
                        "input_ids": inst.tokens,
                        "token_type_ids": inst.segment_ids,
                        "next_sentence_label": int(inst.is_random_next),
                        "masked_lm_positions": inst.masked_lm_positions,
                        "masked_lm_ids": inst.masked_lm_labels,
                    }
                )
    assert built == expected


def test_documents_in_several_arrow_chunks_give_the_same_instances(pseudo_corpus, trained_tokenizer):
    docs = [
        tokenize_documents(datasets.Dataset.from_dict({"text": part}), trained_tokenizer)
        for part in (pseudo_corpus[:5], pseudo_corpus[5:9], pseudo_corpus[9:14])
    ]
    chunked = datasets.concatenate_datasets(docs)
    assert chunked.data.column("sentences").num_chunks == 3
    whole = datasets.Dataset.from_dict(chunked.to_dict(), features=chunked.features)
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    config = PreTrainingDataConfig(max_seq_length=40, dupe_factor=2, random_seed=4)
    built = create_pretraining_instances(chunked, vocab, config).to_list()
    assert len(built) > 100 and built == create_pretraining_instances(whole, vocab, config).to_list()


def test_create_pretraining_dataset_is_the_two_steps_with_its_settings(pseudo_corpus, trained_tokenizer):
    texts = [t.replace(". ", "\n", 3) for t in pseudo_corpus[:6]]  # lines that are not sentences
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)

    def two_steps(split_lines, config, shuffle):
        docs = tokenize_documents(
            datasets.Dataset.from_dict({"text": texts}), trained_tokenizer, split_lines=split_lines
        )
        return create_pretraining_instances(docs, vocab, config, shuffle=shuffle).to_list()

    defaults = create_pretraining_dataset(datasets.Dataset.from_dict({"text": texts}), trained_tokenizer)
    assert defaults.to_list() == two_steps(False, PreTrainingDataConfig(), shuffle=True)
    config = PreTrainingDataConfig(max_seq_length=32, dupe_factor=2)
    body = datasets.Dataset.from_dict({"body": texts})
    given = create_pretraining_dataset(
        body, trained_tokenizer, config, text_column="body", split_lines=True, shuffle=False
    )
    assert given.to_list() == two_steps(True, config, shuffle=False) != two_steps(False, config, shuffle=False)


def test_instance_columns_follow_the_objective(pseudo_corpus, trained_tokenizer):
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": pseudo_corpus[:4]}), trained_tokenizer)
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    masks, pairs = {"masked_lm_positions", "masked_lm_ids"}, {"next_sentence_label"}
    assert set(instance_features()) == {"input_ids", "token_type_ids"} | masks | pairs
    for objective, static, columns in [
        ("mlm_nsp", True, masks | pairs),
        ("mlm_nsp", False, pairs),
        ("mlm", True, masks),
        ("ltr", True, set()),
    ]:
        config = PreTrainingDataConfig(max_seq_length=32, dupe_factor=1, objective=objective, static_masking=static)
        built = create_pretraining_instances(docs, vocab, config)
        assert set(built.column_names) == {"input_ids", "token_type_ids"} | columns, objective


def test_documents_as_a_selection_without_token_counts_and_with_missing_columns(pseudo_corpus, trained_tokenizer):
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": pseudo_corpus[:8]}), trained_tokenizer)
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    config = PreTrainingDataConfig(max_seq_length=40, dupe_factor=1)
    reversed_rows = docs.select(range(len(docs) - 1, -1, -1))  # an indices mapping over the Arrow table
    written_out = datasets.Dataset.from_dict(reversed_rows.to_dict(), features=docs.features)
    built = create_pretraining_instances(reversed_rows, vocab, config).to_list()
    assert built == create_pretraining_instances(written_out, vocab, config).to_list()
    # the shuffle is the default, and a choice
    assert built != create_pretraining_instances(written_out, vocab, config, shuffle=False).to_list()
    # without num_tokens (work is balanced by sentence counts): the same instances
    minimal = written_out.select_columns(["sentences", "num_sentences"])
    assert create_pretraining_instances(minimal, vocab, config, num_proc=2).to_list() == built
    with pytest.raises(ValueError, match=r"missing \['num_sentences'\]"):
        create_pretraining_instances(written_out.select_columns(["sentences"]), vocab, config)


def test_the_instances_fingerprint_names_the_documents_the_config_and_the_vocabulary(pseudo_corpus, trained_tokenizer):
    """datasets reuses a cached map whose fingerprint matches: every input that changes the instances must change it."""
    from dataclasses import replace

    docs = tokenize_documents(datasets.Dataset.from_dict({"text": pseudo_corpus[:6]}), trained_tokenizer)
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    config = PreTrainingDataConfig(max_seq_length=32, dupe_factor=1)

    def fingerprint(documents=docs, vocab=vocab, config=config):
        return create_pretraining_instances(documents, vocab, config, shuffle=False)._fingerprint

    base = fingerprint()
    assert fingerprint() == base
    others = [
        fingerprint(config=PreTrainingDataConfig(max_seq_length=32, dupe_factor=1, random_seed=1)),
        fingerprint(documents=docs.select([0, 2, 4])),  # not contiguous: selections with an indices mapping
        fingerprint(documents=docs.select([1, 3, 5])),
        fingerprint(vocab=replace(vocab, cls_token=vocab.sep_token)),
        fingerprint(vocab=replace(vocab, sep_token=vocab.cls_token)),
        fingerprint(vocab=replace(vocab, mask_token=vocab.cls_token)),
        fingerprint(vocab=replace(vocab, vocab_words=range(len(vocab.vocab_words) + 1))),
        fingerprint(vocab=replace(vocab, subword_tokens=frozenset())),
    ]
    assert len({base, *others}) == len(others) + 1


def test_a_cached_build_is_never_reused_for_other_settings(tmp_path, trained_tokenizer):
    """datasets caches each map beside documents on disk: a build with other settings must not read those files."""
    texts = pseudo_text(2, seed=11, min_sentences=60, max_sentences=80) + pseudo_text(10, seed=12, max_sentences=4)
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": texts}), trained_tokenizer)
    assert _balanced_order(np.array(docs["num_tokens"]), 2) is not None  # the reordered map runs
    docs.save_to_disk(str(tmp_path / "documents"))
    on_disk = datasets.load_from_disk(str(tmp_path / "documents"))
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    for seed in (1, 2, 1):
        config = PreTrainingDataConfig(max_seq_length=40, dupe_factor=1, random_seed=seed)
        expected = create_pretraining_instances(docs, vocab, config).to_list()
        for num_proc in (2, None):  # the parallel map first: its result is not yet cached under the final name
            assert create_pretraining_instances(on_disk, vocab, config, num_proc=num_proc).to_list() == expected
    assert len(list((tmp_path / "documents").glob("cache-*.arrow"))) > 2


def test_one_document_is_said_and_two_are_not(trained_tokenizer, caplog):
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    config = PreTrainingDataConfig(max_seq_length=32, dupe_factor=1)
    for texts, said in [(["Kalo mitor. Ren tor."], True), (["Kalo mitor. Ren tor.", "Velsha don. Ex pu."], False)]:
        caplog.clear()
        docs = tokenize_documents(datasets.Dataset.from_dict({"text": texts}), trained_tokenizer)
        with caplog.at_level(logging.WARNING, logger="bert_repro"):
            create_pretraining_instances(docs, vocab, config)
        assert ("one document only" in caplog.text) is said


def test_flatten_keeps_the_datasets_format():
    from bert_repro.data.balanced_map import _flatten

    ds = datasets.Dataset.from_dict({"a": [1, 2, 3], "b": [4, 5, 6]}).select([2, 0])
    ds = ds.with_format("torch", columns=["a"], output_all_columns=True, dtype=torch.float64)
    flat = _flatten(ds, "f" * 16)
    assert flat._indices is None and flat._fingerprint == "f" * 16
    assert flat.format == ds.format and flat[0] == ds[0] == {"a": torch.tensor(3.0, dtype=torch.float64), "b": 6}


def test_pipeline_is_reproducible_and_independent_of_num_proc(pseudo_corpus, trained_tokenizer):
    ds = datasets.Dataset.from_dict({"text": pseudo_corpus})
    config = PreTrainingDataConfig(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=2, random_seed=5)
    one = create_pretraining_dataset(ds, trained_tokenizer, config, num_proc=1)
    two = create_pretraining_dataset(ds, trained_tokenizer, config, num_proc=2)
    again = create_pretraining_dataset(ds, trained_tokenizer, config, num_proc=1)
    other_seed = create_pretraining_dataset(ds, trained_tokenizer, dataclasses.replace(config, random_seed=6))
    assert len(one) > 200
    assert table_digest(one) == table_digest(two) == table_digest(again)
    assert table_digest(one) != table_digest(other_seed)
    columns = {"input_ids", "token_type_ids", "next_sentence_label", "masked_lm_positions", "masked_lm_ids"}
    assert one.features == two.features and set(one.column_names) == columns


def shard_loads(weights: np.ndarray, order: np.ndarray, num_shards: int) -> list[int]:
    """Work of each worker of ``map(num_proc=num_shards)`` over ``select(order)`` (datasets' own sharding)."""
    reordered = datasets.Dataset.from_dict({"w": weights[order].tolist()})
    return [sum(reordered.shard(num_shards, k, contiguous=True)["w"]) for k in range(num_shards)]


def test_balanced_order_evens_out_the_workers():
    weights = np.array([900, 700, 650, 400, 380] + [3, 1, 2] * 12 + [0])  # books first, then speeches
    for num_shards in (2, 3, 4):
        order = _balanced_order(weights, num_shards)
        assert sorted(order.tolist()) == list(range(len(weights)))
        bound = weights.sum() / num_shards + weights.max()  # greedy largest-first guarantee
        assert max(shard_loads(weights, np.arange(len(weights)), num_shards)) > bound  # contiguous: unequal
        assert max(shard_loads(weights, order, num_shards)) <= bound
    assert _balanced_order(weights, None) is None and _balanced_order(weights, 1) is None
    assert _balanced_order(np.full(10, 5), 2) is None  # already balanced: no reordering
    assert _balanced_order(np.array([7]), 4) is None and _balanced_order(np.zeros(0, np.int64), 2) is None


def test_balanced_order_by_hand():
    # Heaviest first, each to the lightest block with room (blocks of 5 and 4 rows, as datasets shards 9 rows):
    # 9 -> A, 8 -> B, then the ones to B, A, B, A, B (B full at 4 rows), A, A: loads 13 and 11 against 20 and 4
    assert _balanced_order(np.array([9, 8, 1, 1, 1, 1, 1, 1, 1]), 2).tolist() == [0, 3, 5, 7, 8, 1, 2, 4, 6]
    assert _balanced_order(np.array([9, 8, 1, 1, 1, 1, 1, 1, 1]), 3).tolist() == [0, 6, 8, 1, 5, 7, 2, 3, 4]
    # Not worth it: a cut of exactly 5% (38 against 40), or none (the heaviest block holds 5 either way)
    assert _balanced_order(np.array([20, 20, 0, 18, 18, 0]), 2) is None
    assert _balanced_order(np.array([1, 1, 1, 5, 0, 0, 5, 0, 0]), 3) is None
    # 6 rows in 4 blocks: 2, 2, 1 and 1 rows, as datasets shards them (not worth reordering: 5 is the heaviest block)
    assert _balanced_order(np.array([1, 1, 1, 0, 5, 1]), 4) is None
    # Rows of equal weight are taken in row order (a stable sort): the same order on every machine
    weights = np.array([1, 30, 2, 1, 1, 1, 30, 2, 1, 1, 30, 1, 1, 30, 1, 30, 1, 30, 30, 30, 1, 2, 1, 30])
    expected = [1, 9, 10, 11, 12, 14, 15, 16, 18, 20, 22, 23, 0, 2, 3, 4, 5, 6, 7, 8, 13, 17, 19, 21]
    assert _balanced_order(weights, 2).tolist() == expected


def test_balanced_sharding_gives_the_same_data_for_any_num_proc(trained_tokenizer):
    # Long documents first make map's contiguous worker blocks unequal, so the rows are reordered and put back.
    texts = (
        pseudo_text(3, seed=11, min_sentences=150, max_sentences=200)
        + pseudo_text(25, seed=12, min_sentences=1, max_sentences=4)
        + ["", "One sentence."]
    )
    ds = datasets.Dataset.from_dict({"text": texts})
    byte_counts = np.array([len(t.encode()) for t in texts])
    assert _balanced_order(byte_counts, 2) is not None
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    config = PreTrainingDataConfig(max_seq_length=64, max_predictions_per_seq=9, dupe_factor=2, random_seed=8)

    docs = {n: tokenize_documents(ds, trained_tokenizer, num_proc=n) for n in (1, 2)}
    assert docs[1]["sentences"] == docs[2]["sentences"] and docs[1]["skip_reason"][-2:] == ["empty", ""]
    assert table_digest(docs[1]) == table_digest(docs[2]) and docs[1]._fingerprint == docs[2]._fingerprint
    assert _balanced_order(np.array(docs[1]["num_tokens"]), 2) is not None
    for shuffle in (True, False):
        built = [create_pretraining_instances(docs[n], vocab, config, num_proc=n, shuffle=shuffle) for n in (1, 2)]
        assert len(built[0]) > 300 and "document" not in built[1].column_names
        assert table_digest(built[0]) == table_digest(built[1])
        assert built[0]._fingerprint == built[1]._fingerprint
    # An input with an indices mapping (here the rows reversed): sizes are read in its row order.
    reversed_rows = ds.select(range(len(ds) - 1, -1, -1))
    assert _balanced_order(byte_counts[::-1], 2) is not None
    assert table_digest(tokenize_documents(reversed_rows, trained_tokenizer, num_proc=2)) == table_digest(
        tokenize_documents(reversed_rows, trained_tokenizer, num_proc=1)
    )


def test_pipeline_handles_bad_input(trained_tokenizer, caplog):
    caplog.set_level(logging.INFO, logger="bert_repro")
    long_line = " ".join(["kalo", "mitor", "velsha"] * 7000)[:100_000]
    texts = [
        "First sentence here. And a second one! A third?",
        "",
        None,
        "  \n\n \t ",
        "".join(chr(i) for i in range(32)) * 50,  # control characters: binary junk
        "Only one sentence in this document.",
        long_line,
        "Literal [SEP] and [MASK] and [CLS] in text. They stay text.",
        "Kalo mitor. Velsha ren tor. Don ex pu. Nor ti gan.",
    ]
    start = time.perf_counter()
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": texts}), trained_tokenizer)
    assert list(docs["skip_reason"]) == ["", "empty", "empty", "empty", "binary", "", "", "", ""]
    # A line without punctuation is cut into pieces of at most 250 characters (the reference keeps one sentence).
    assert docs["num_sentences"][5] == 1 and docs["num_sentences"][6] >= 100_000 // 250
    assert docs["long_sentences"][6] == 1 and "longer than 1000 characters in 1 of 9 documents" in caplog.text
    assert "skipped 3 empty and 1 binary" in caplog.text
    specials = {trained_tokenizer.convert_tokens_to_ids(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
    assert not specials & {t for d in docs["sentences"] for s in d for t in s}

    config = PreTrainingDataConfig(max_seq_length=32, dupe_factor=2)
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    instances = create_pretraining_instances(docs, vocab, config)
    assert time.perf_counter() - start < 20
    assert len(instances) > 0
    for row in instances:
        assert len(row["input_ids"]) <= 32 and len(row["input_ids"]) == len(row["token_type_ids"])
    stats = pretraining_statistics(instances, docs)
    assert stats["documents"] == 5 and stats["documents_skipped"] == {"empty": 3, "binary": 1}
    assert stats["one_sentence_documents"] == 1 and stats["long_sentences_cut"] == 1


def test_missing_text_column_is_a_clear_error(trained_tokenizer):
    ds = datasets.Dataset.from_dict({"body": ["Some text."], "id": [1]})
    with pytest.raises(ValueError, match=r"no column 'text'.*\['body', 'id'\]"):
        create_pretraining_dataset(ds, trained_tokenizer)
    with pytest.raises(TypeError, match="must hold text"):
        tokenize_documents(ds, trained_tokenizer, text_column="id")


def test_empty_corpus_is_a_clear_error(trained_tokenizer):
    ds = datasets.Dataset.from_dict({"text": ["", "   "]})
    with pytest.raises(ValueError, match="no document"):
        create_pretraining_dataset(ds, trained_tokenizer)


def test_statistics(pseudo_corpus, trained_tokenizer):
    docs = tokenize_documents(datasets.Dataset.from_dict({"text": pseudo_corpus}), trained_tokenizer)
    config = PreTrainingDataConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3)
    vocab = WordPieceVocab.from_tokenizer(trained_tokenizer)
    ds = create_pretraining_instances(docs, vocab, config)
    stats = pretraining_statistics(ds, docs, mask_token_id=trained_tokenizer.mask_token_id)
    json.dumps(stats)
    assert pretraining_statistics(ds, docs, mask_token_id=trained_tokenizer.mask_token_id, batch_size=7) == stats
    rows = ds.to_list()
    assert stats["examples"] == len(rows)
    assert stats["tokens"] == sum(len(r["input_ids"]) for r in rows)
    assert stats["masked"] == sum(len(r["masked_lm_positions"]) for r in rows)
    assert stats["masked_share"] == pytest.approx(stats["masked"] / stats["tokens"])
    assert stats["is_next_share"] == pytest.approx(sum(r["next_sentence_label"] == 0 for r in rows) / len(rows))
    assert sum(stats["length_histogram"].values()) == len(rows)
    assert sum(stats["masked_split"].values()) == pytest.approx(1.0)
    assert stats["masked_split"]["mask"] == pytest.approx(0.8, abs=0.05)
    mask_id = trained_tokenizer.mask_token_id
    shown = [(r["input_ids"][p], o) for r in rows for p, o in zip(r["masked_lm_positions"], r["masked_lm_ids"])]
    assert stats["masked_split"]["mask"] == pytest.approx(sum(s == mask_id for s, _ in shown) / len(shown))
    assert stats["masked_split"]["unchanged"] == pytest.approx(
        sum(s == o and s != mask_id for s, o in shown) / len(shown)
    )
    assert stats["masked_split"]["unchanged"] > 0
    assert stats["documents"] == len(pseudo_corpus)
    assert stats["sentences"] == sum(len(split_sentences(t)) for t in pseudo_corpus)
    dynamic = create_pretraining_instances(docs, vocab, PreTrainingDataConfig(max_seq_length=64, static_masking=False))
    assert "masked" not in pretraining_statistics(dynamic)


# Collator


def test_collator_static_masks(pseudo_corpus, trained_tokenizer):
    config = PreTrainingDataConfig(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=1)
    ds = create_pretraining_dataset(datasets.Dataset.from_dict({"text": pseudo_corpus}), trained_tokenizer, config)
    rows = ds.select(range(16)).to_list()
    batch = PreTrainingCollator.from_config(trained_tokenizer, config, pad_to_multiple_of=8)(rows)
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0 and width >= max(len(r["input_ids"]) for r in rows)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == r["input_ids"]
        assert (batch["input_ids"][i, n:] == trained_tokenizer.pad_token_id).all()
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (width - n)
        assert batch["token_type_ids"][i, :n].tolist() == r["token_type_ids"]
        labels = batch["labels"][i]
        assert labels[r["masked_lm_positions"]].tolist() == r["masked_lm_ids"]
        assert (labels != IGNORE_INDEX).sum() == len(r["masked_lm_positions"])
    assert batch["next_sentence_label"].tolist() == [r["next_sentence_label"] for r in rows]
    assert all(v.dtype == torch.long for v in batch.values())

    from transformers import BertForPreTraining

    model = BertForPreTraining(hf_config_like(tiny_config(vocab_size=len(trained_tokenizer))))
    assert torch.isfinite(model(**batch).loss)


def test_mask_batch_on_padded_tensors():
    ids = torch.tensor([[2, 10, 11, 12, 3, 13, 14, 3, 0, 0], [2, 20, 3, 21, 3, 0, 0, 0, 0, 0]])
    attention_mask = (ids != 0).long()
    masked, targets = mask_batch(ids, INT_VOCAB, random.Random(0), attention_mask=attention_mask)
    assert [len(r) for r in masked] == [8, 5]
    for row, (positions, labels) in zip(ids.tolist(), targets, strict=True):
        assert len(positions) == num_to_predict(len([t for t in row if t]), 0.15, 20)
        assert all(row[p] == label and label not in (0, 2, 3) for p, label in zip(positions, labels, strict=True))
    again = mask_batch(ids, INT_VOCAB, random.Random(0), attention_mask=attention_mask)
    assert again == (masked, targets)


def test_collator_dynamic_masks(pseudo_corpus, trained_tokenizer):
    config = PreTrainingDataConfig(
        max_seq_length=64, dupe_factor=2, static_masking=False, masked_lm_prob=0.3, max_predictions_per_seq=40
    )
    ds = create_pretraining_dataset(datasets.Dataset.from_dict({"text": pseudo_corpus}), trained_tokenizer, config)
    assert "masked_lm_positions" not in ds.column_names
    rows = ds.to_list()
    collator = PreTrainingCollator.from_config(trained_tokenizer, config)
    assert collator.dynamic_masking
    torch.manual_seed(0)
    first, second = collator(rows[:32]), collator(rows[:32])
    assert not torch.equal(first["labels"], second["labels"])  # fresh masks for every batch
    vocab = collator.vocab
    counts = {"mask": 0, "same": 0, "total": 0}
    for start in range(0, 3 * len(rows), 64):  # three epochs, fresh masks each time
        chunk = (rows * 3)[start : start + 64]
        batch = collator(chunk)
        for i, r in enumerate(chunk):
            original = torch.tensor(r["input_ids"])
            n = len(original)
            chosen = (batch["labels"][i] != IGNORE_INDEX).nonzero().flatten()
            assert len(chosen) == num_to_predict(n, 0.3, 40)
            assert (chosen < n).all()
            assert not any(original[p].item() in (vocab.cls_token, vocab.sep_token) for p in chosen)
            assert torch.equal(batch["labels"][i, chosen], original[chosen])
            shown = batch["input_ids"][i, chosen]
            counts["mask"] += int((shown == vocab.mask_token).sum())
            counts["same"] += int((shown == original[chosen]).sum())
            counts["total"] += len(chosen)
            others = torch.ones(n, dtype=torch.bool)
            others[chosen] = False
            assert torch.equal(batch["input_ids"][i, :n][others], original[others])
    assert counts["total"] > 5000
    assert_share(counts["mask"], counts["total"], 0.8, "[MASK]")
    assert_share(counts["same"], counts["total"], 0.1 + 0.1 / len(vocab.vocab_words), "unchanged")

    with pytest.raises(ValueError, match="static_masking=True"):
        PreTrainingCollator(trained_tokenizer)(rows[:2])
    five = datasets.Dataset.from_dict({"text": pseudo_corpus[:5]})
    static_rows = create_pretraining_dataset(
        five, trained_tokenizer, PreTrainingDataConfig(max_seq_length=64)
    ).to_list()
    with pytest.raises(ValueError, match="static_masking=False"):
        collator(static_rows[:2])


def test_one_document_means_no_held_out_evaluation_and_says_so(caplog):
    import datasets

    from bert_repro.training.pretraining.examples import split_documents
    from bert_repro.training.pretraining.recipe import DataSettings

    run = DataSettings(eval_fraction=0.1)
    one = datasets.Dataset.from_dict({"text": ["One long book."]})
    with caplog.at_level(logging.WARNING, logger="bert_repro.training.pretraining.examples"):
        assert split_documents(one, run, seed=0) == (one, None)
    assert "The corpus holds 1 document: no held-out evaluation" in caplog.text
    two = datasets.Dataset.from_dict({"text": ["One book.", "Another."]})
    train, held_out = split_documents(two, run, seed=0)
    assert len(train) == 1 and len(held_out) == 1  # whole documents, at least one held out
    caplog.clear()
    run.eval_fraction = 0.0  # asked for: nothing to say
    with caplog.at_level(logging.WARNING, logger="bert_repro.training.pretraining.examples"):
        assert split_documents(one, run, seed=0) == (one, None)
    assert not caplog.text


# The masking rules at their edges (each pins a bound or a default that a statistical test cannot see)


def test_masking_settings_at_their_bounds():
    from bert_repro.data.masking import _check_masking

    # masked_lm_prob 1, a budget of 1, either share 0, shares summing to exactly 1
    good = [(1.0, 1, 0.8, 0.1), (0.15, 20, 0.0, 0.1), (0.15, 20, 0.8, 0.0), (0.15, 20, 0.8, 0.2), (0.15, 20, 1.0, 0.0)]
    for ok in good:
        _check_masking(*ok)
    bad = [(1.5, 20, 0.8, 0.1), (0.0, 20, 0.8, 0.1), (0.15, 0, 0.8, 0.1), (0.15, 20, -0.1, 0.1), (0.15, 20, 0.8, -0.1)]
    for wrong in bad:
        with pytest.raises(ValueError):
            _check_masking(*wrong)


def test_a_draw_equal_to_the_share_is_not_in_it():
    """rng.random() is in [0, 1): "[MASK] with probability p" is a draw below p, not at it."""
    from bert_repro.data.masking import _replacement

    vocab = WordPieceVocab(cls_token=2, sep_token=3, mask_token=4, vocab_words=[7, 8, 9])
    assert _replacement(50, vocab, ScriptedRandom([0.8, 0.5, 0]), 0.8, 0.5) == 7  # neither [MASK] nor kept: random
    assert _replacement(50, vocab, ScriptedRandom([0.7999]), 0.8, 0.5) == 4
    assert _replacement(50, vocab, ScriptedRandom([0.9, 0.4999]), 0.8, 0.5) == 50


def test_masking_defaults_are_the_references_and_mask_batch_passes_its_settings_on():
    words = [2] + [100 + i if i % 3 == 0 else 20_000 + i for i in range(200)] + [3]
    vocab = WordPieceVocab(2, 3, 4, range(50_000), frozenset(range(20_000, 21_000)))  # [CLS], [SEP], [MASK], words, ##
    reference = {"do_whole_word_mask": False, "mask_replace_prob": 0.8, "random_replace_prob": 0.1}
    assert create_masked_lm_predictions(words, 0.5, 100, vocab, random.Random(1)) == create_masked_lm_predictions(
        words, 0.5, 100, vocab, random.Random(1), **reference
    )
    rows = [words, words[:50]]
    defaults = mask_batch(rows, vocab, random.Random(2))
    assert defaults == mask_batch(
        rows, vocab, random.Random(2), masked_lm_prob=0.15, max_predictions_per_seq=20, **reference
    )
    assert [len(positions) for positions, _ in defaults[1]] == [20, 8]  # the cap of 20 binds on 202 tokens
    settings = {"do_whole_word_mask": True, "mask_replace_prob": 0.5, "random_replace_prob": 0.3}
    rng, expected = random.Random(3), []
    for row in rows:
        out, positions, labels = create_masked_lm_predictions(row, 0.3, 40, vocab, rng, **settings)
        expected.append((out, (positions, labels)))
    got = mask_batch(rows, vocab, random.Random(3), masked_lm_prob=0.3, max_predictions_per_seq=40, **settings)
    assert got == ([e[0] for e in expected], [e[1] for e in expected])


def test_mask_batch_returns_plain_ints_and_needs_a_mask_row_per_row():
    ids = torch.tensor([[2, 10, 11, 12, 3], [2, 20, 21, 3, 0]])
    masked, targets = mask_batch(ids, INT_VOCAB, random.Random(0))
    assert all(type(token) is int for row in masked for token in row)
    assert all(type(label) is int for _, labels in targets for label in labels)
    with pytest.raises(ValueError):
        mask_batch(ids, INT_VOCAB, random.Random(0), attention_mask=[[1] * 5] * 3)


def test_vocab_from_vocab_words_reads_vocab_txt_as_the_reference_does():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat", "##s"]
    expected = WordPieceVocab("[CLS]", "[SEP]", "[MASK]", words, frozenset({"##s"}), pad_token="[PAD]")
    assert WordPieceVocab.from_vocab_words(words) == expected
    assert WordPieceVocab.from_vocab_words(tuple(words)).vocab_words == words  # a list, whatever the sequence
    assert WordPieceVocab.from_vocab_words(words, pad_token=None).pad_token is None


def test_every_chosen_position_is_masked_when_the_mask_share_is_one():
    tokens = [2] + list(range(100, 140)) + [3]
    out, positions, _ = create_masked_lm_predictions(
        tokens, 0.5, 40, INT_VOCAB, random.Random(0), mask_replace_prob=1.0, random_replace_prob=0.0
    )
    assert len(positions) == 21 and all(out[p] == INT_VOCAB.mask_token for p in positions)


def test_vocab_from_tokenizer_as_ids_and_as_strings(trained_tokenizer):
    vocab = trained_tokenizer.get_vocab()
    words = sorted(vocab, key=vocab.get)
    assert WordPieceVocab.from_tokenizer(trained_tokenizer) == WordPieceVocab(
        cls_token=trained_tokenizer.cls_token_id,
        sep_token=trained_tokenizer.sep_token_id,
        mask_token=trained_tokenizer.mask_token_id,
        vocab_words=range(len(vocab)),  # every id a random replacement may draw, and no other
        subword_tokens=frozenset(vocab[w] for w in words if w.startswith("##")),
        pad_token=trained_tokenizer.pad_token_id,
    )
    assert WordPieceVocab.from_tokenizer(trained_tokenizer, as_ids=False) == WordPieceVocab(
        "[CLS]", "[SEP]", "[MASK]", words, frozenset(w for w in words if w.startswith("##")), pad_token="[PAD]"
    )
    assert words != sorted(vocab)  # id order is not alphabetical order


def test_vocab_as_strings_reads_the_tokenizers_own_special_tokens(trained_tokenizer):
    for name in ("cls_token", "sep_token", "mask_token", "pad_token"):
        tokenizer = copy.deepcopy(trained_tokenizer)
        setattr(tokenizer, name, "[UNK]")  # not the default string of its field
        assert getattr(WordPieceVocab.from_tokenizer(tokenizer, as_ids=False), name) == "[UNK]", name


def test_a_tokenizer_without_a_mask_token_is_refused(trained_tokenizer):
    tokenizer = copy.deepcopy(trained_tokenizer)
    tokenizer.mask_token = None
    with pytest.raises(ValueError, match="has no mask_token"):
        WordPieceVocab.from_tokenizer(tokenizer)


def test_exact_draws_at_the_short_length_and_the_nsp_coin():
    """rng.random() is in [0, 1): a draw equal to short_seq_prob keeps the full length, one of 0.5 is IsNext."""
    corpus = int_corpus([[3, 3], [4]])
    config = PreTrainingDataConfig(max_seq_length=20, short_seq_prob=0.1, static_masking=False, dupe_factor=1)
    rng = ScriptedRandom([0.1, 1, 0.5])
    (instance,) = create_instances_from_document(corpus, 0, INT_VOCAB, rng, config)
    assert rng.calls == [("random",), ("randint", 1, 1), ("random",)] and not instance.is_random_next


def test_a_one_sentence_chunk_before_the_documents_end_puts_nothing_back():
    # The first sentence alone reaches the target (13 = max_seq_length - 3): the next chunk starts at the second.
    corpus = int_corpus([[13, 2, 2, 2], [3, 3, 3]])
    second = corpus[0][1]
    config = PreTrainingDataConfig(max_seq_length=16, short_seq_prob=0.0, static_masking=False, dupe_factor=1)
    for seed in range(20):
        instances = create_instances_from_document(corpus, 0, INT_VOCAB, random.Random(seed), config)
        assert instances[0].is_random_next
        assert instances[1].tokens[1 : 1 + len(second)] == second, seed


def test_one_segment_examples_without_nsp():
    corpus = int_corpus([[3, 4], [5, 2], [6]])
    config = PreTrainingDataConfig(max_seq_length=12, objective="mlm", static_masking=False, dupe_factor=1)
    for instance in create_instances_from_document(corpus, 0, INT_VOCAB, random.Random(0), config):
        tokens = instance.tokens
        assert tokens[0] == INT_VOCAB.cls_token and tokens[-1] == INT_VOCAB.sep_token and 3 not in tokens[1:-1]
        assert instance.segment_ids == [0] * len(tokens) and instance.is_random_next is None


def test_config_bounds_per_objective():
    PreTrainingDataConfig(objective="mlm", max_seq_length=4)  # [CLS] two tokens [SEP]
    PreTrainingDataConfig(max_seq_length=5)  # [CLS] a [SEP] b [SEP]
    PreTrainingDataConfig(short_seq_prob=1.0)
    PreTrainingDataConfig(short_seq_prob=0.0)
    for bad in [{"objective": "mlm", "max_seq_length": 3}, {"max_seq_length": 4}, {"short_seq_prob": 1.01}]:
        with pytest.raises(ValueError):
            PreTrainingDataConfig(**bad)
