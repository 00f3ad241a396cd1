"""Documents -> training instances: steps 1-6 of ``pretraining_examples``' docstring, as google-research/bert's
``create_pretraining_data.py`` builds them, with masks drawn right after each pair when the config stores them."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .masking import WordPieceVocab, create_masked_lm_predictions, masking_settings
from .pretraining_config import PreTrainingDataConfig

__all__ = [
    "IS_NEXT",
    "NOT_NEXT",
    "TrainingInstance",
    "create_instances_from_document",
    "create_training_instances",
    "document_rng",
    "truncate_seq_pair",
]

IS_NEXT, NOT_NEXT = 0, 1


@dataclass
class TrainingInstance:
    """``[CLS] A [SEP] B [SEP]`` and its masked LM targets (the reference's names); ``is_random_next`` None: no NSP."""

    tokens: list[Any]
    segment_ids: list[int]
    is_random_next: bool | None
    masked_lm_positions: list[int] = field(default_factory=list)
    masked_lm_labels: list[Any] = field(default_factory=list)


def create_training_instances(
    documents: Iterable[Sequence[Sequence[Any]]],
    vocab: WordPieceVocab,
    config: PreTrainingDataConfig,
    rng: random.Random | None = None,
) -> list[TrainingInstance]:
    """The reference's whole-corpus loop with one random stream, in memory (``create_pretraining_instances`` scales)."""
    rng = random.Random(config.random_seed) if rng is None else rng
    all_documents = [doc for doc in ([list(s) for s in d if len(s)] for d in documents) if doc]
    rng.shuffle(all_documents)
    instances: list[TrainingInstance] = []
    for _ in range(config.dupe_factor):
        for document_index in range(len(all_documents)):
            instances.extend(create_instances_from_document(all_documents, document_index, vocab, rng, config))
    rng.shuffle(instances)
    return instances


def create_instances_from_document(
    all_documents: Sequence[Sequence[Sequence[Any]]],
    document_index: int,
    vocab: WordPieceVocab,
    rng: random.Random,
    config: PreTrainingDataConfig,
) -> list[TrainingInstance]:
    """Steps 1-7, one ``dupe_factor`` round, over ``all_documents[document_index]``.

    ``all_documents`` (non-empty documents of non-empty sentences) may each give a NotNext pair's segment B.
    """
    next_sentence = config.pretraining_objective.next_sentence
    document = all_documents[document_index]
    max_num_tokens = config.max_num_tokens
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[TrainingInstance] = []
    current_chunk: list[Sequence[Any]] = []
    current_length = 0
    i = 0
    while i < len(document):
        current_chunk.append(document[i])
        current_length += len(document[i])
        if i == len(document) - 1 or current_length >= target_seq_length:
            if next_sentence:
                tokens_a, tokens_b, is_random_next, num_unused = _segment_pair(
                    all_documents, document_index, current_chunk, target_seq_length, rng
                )
                i -= num_unused  # NotNext: put the chunk's unused sentences back.
            else:  # No NSP: the whole chunk is one segment of contiguous text
                tokens_a, tokens_b, is_random_next = [t for sentence in current_chunk for t in sentence], [], None
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append(_instance(tokens_a, tokens_b, is_random_next, vocab, rng, config))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _segment_pair(
    all_documents: Sequence[Sequence[Sequence[Any]]],
    document_index: int,
    chunk: list[Sequence[Any]],
    target_seq_length: int,
    rng: random.Random,
) -> tuple[list[Any], list[Any], bool, int]:
    """Steps 3-4: segments A and B of one chunk, whether B is random, and how many sentences go back."""
    a_end = 1
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
    tokens_a = [t for sentence in chunk[:a_end] for t in sentence]

    if len(chunk) == 1 or rng.random() < 0.5:
        tokens_b = _random_segment_b(all_documents, document_index, target_seq_length - len(tokens_a), rng)
        return tokens_a, tokens_b, True, len(chunk) - a_end
    tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
    return tokens_a, tokens_b, False, 0


def _random_segment_b(
    all_documents: Sequence[Sequence[Sequence[Any]]], document_index: int, target_b_length: int, rng: random.Random
) -> list[Any]:
    """Sentences from a random start in a random other document: ten tries, then the last draw whatever it is (the
    reference's rule: with a single document, B comes from the same document)."""
    for _ in range(10):
        random_document_index = rng.randint(0, len(all_documents) - 1)
        if random_document_index != document_index:
            break
    random_document = all_documents[random_document_index]
    random_start = rng.randint(0, len(random_document) - 1)
    tokens_b: list[Any] = []
    for j in range(random_start, len(random_document)):
        tokens_b.extend(random_document[j])
        if len(tokens_b) >= target_b_length:
            break
    return tokens_b


def truncate_seq_pair(tokens_a: list[Any], tokens_b: list[Any], max_num_tokens: int, rng: random.Random) -> None:
    """Step 5, in place, with the reference's random draws but one cut at the end (no quadratic work on long lines)."""
    a_lo, a_hi, b_lo, b_hi = 0, len(tokens_a), 0, len(tokens_b)
    while (a_hi - a_lo) + (b_hi - b_lo) > max_num_tokens:
        front = rng.random() < 0.5
        if a_hi - a_lo > b_hi - b_lo:
            a_lo, a_hi = (a_lo + 1, a_hi) if front else (a_lo, a_hi - 1)
        else:
            b_lo, b_hi = (b_lo + 1, b_hi) if front else (b_lo, b_hi - 1)
    del tokens_a[a_hi:], tokens_a[:a_lo], tokens_b[b_hi:], tokens_b[:b_lo]


def _instance(
    tokens_a: list[Any],
    tokens_b: list[Any],
    is_random_next: bool,
    vocab: WordPieceVocab,
    rng: random.Random,
    config: PreTrainingDataConfig,
) -> TrainingInstance:
    """Steps 6 and 7 (with stored masks)."""
    if config.pretraining_objective.next_sentence:
        tokens = [vocab.cls_token, *tokens_a, vocab.sep_token, *tokens_b, vocab.sep_token]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    else:
        tokens, segment_ids = [vocab.cls_token, *tokens_a, vocab.sep_token], [0] * (len(tokens_a) + 2)
    instance = TrainingInstance(tokens=tokens, segment_ids=segment_ids, is_random_next=is_random_next)
    if config.stores_masks:
        instance.tokens, instance.masked_lm_positions, instance.masked_lm_labels = create_masked_lm_predictions(
            tokens, vocab=vocab, rng=rng, **masking_settings(config)
        )
    return instance


def document_rng(seed: int, document_index: int, dupe_round: int) -> random.Random:
    """One document's random stream in one round: the reference has one stream, but documents go in any order here."""
    digest = hashlib.sha256(f"{seed}/{dupe_round}/{document_index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))
