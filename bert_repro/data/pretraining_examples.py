"""Pre-training examples for BERT's two objectives: masked LM and next sentence prediction.

What this implements
--------------------
The paper's section 3.1 and appendix A.2, as google-research/bert's ``create_pretraining_data.py``
builds them. For each document (a list of sentences, each a list of WordPiece tokens), ``dupe_factor``
times:

1. ``max_num_tokens = max_seq_length - 3``; the target length is ``max_num_tokens``, or with probability
   ``short_seq_prob`` a random length in ``[2, max_num_tokens]`` (drawn once per document and round).
2. Whole sentences are gathered into a chunk until it reaches the target or the document ends.
3. Segment A is the first ``a_end`` sentences of the chunk, ``a_end`` random in ``[1, len(chunk) - 1]``.
4. With probability 0.5, and always for a one-sentence chunk, the pair is NotNext: segment B is read
   from a random start sentence of a random other document up to ``target - len(A)`` tokens, and the
   chunk's unused sentences are put back for the next chunk. Otherwise IsNext: B is the rest of the chunk.
5. ``truncate_seq_pair`` drops one token at a time from the longer segment (B on a tie), from its front
   or back with probability 0.5 each, until the pair fits ``max_num_tokens``.
6. ``[CLS] A [SEP] B [SEP]`` with segment ids 0 for ``[CLS] A [SEP]`` and 1 for ``B [SEP]``.
7. Masking: ``min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))`` positions among
   all but ``[CLS]``/``[SEP]``, each replaced by ``[MASK]`` (80%), a random vocabulary entry (10%), or left
   unchanged (10%). Whole-word masking (an option of the reference code, released after the paper)
   masks the ``##`` pieces of a word together and never splits a word.

Without NSP (the paper's Table 5, ``PreTrainingDataConfig.objective``: "mlm" = No NSP, "ltr" = LTR & No NSP;
``bert_repro.model.configuration_bert_repro.PRETRAINING_OBJECTIVES`` is the one table of objectives), steps 1-2
are the same with ``max_num_tokens = max_seq_length - 2``, and each chunk is ONE segment of contiguous text,
truncated by step 5's rule (with an empty B) and laid out as ``[CLS] text [SEP]``, segment ids all 0; no
``next_sentence_label`` column is written. The chunking is the reference's so that the models of Table 5 differ
only in what the ablation removes. "mlm" masks as step 7. "ltr" stores no masks: ``PreTrainingCollator`` gives
it ``labels`` = the next token at every real position but the last (-100 there and at padding), already shifted,
so that the model's output head and loss read them as they read MLM labels.

``create_instances_from_document``, ``truncate_seq_pair`` and ``create_masked_lm_predictions`` make the
same calls on a ``random.Random`` in the same order as the reference, edge cases included: with one
document in the corpus (or ten unlucky draws) the "other" document of a NotNext pair is the current one;
a one-sentence chunk is always NotNext (and draws no coin); a ``##`` piece right after ``[SEP]`` joins the
previous word's group in whole-word masking. ``create_training_instances`` reproduces the reference's
whole-corpus loop with its single random stream (document shuffle, ``dupe_factor`` rounds, instance shuffle).

The datasets pipeline
---------------------
``tokenize_documents`` (sentence split + WordPiece, ``map(batched=True, num_proc=...)``),
``create_pretraining_instances`` (the loop above over a ``datasets.Dataset``) and
``create_pretraining_dataset`` (both) produce Arrow datasets with ``input_ids``, ``token_type_ids``,
``next_sentence_label`` (0 = IsNext, 1 = NotNext, the HF convention) and, with static masking,
``masked_lm_positions`` / ``masked_lm_ids``. ``PreTrainingCollator`` pads a batch and turns them into
``labels`` (-100 where nothing is predicted), or masks each batch afresh (dynamic masking).
``pretraining_statistics`` summarises a built dataset as a JSON-serialisable dict. With ``num_proc`` > 1 both
maps run over the rows reordered so that every worker's contiguous block carries about the same work (documents
differ in size by orders of magnitude), and the output is put back in input order: the same bytes for any
``num_proc``.

Departures, and why
-------------------
- One random stream per (seed, document, round) in the datasets pipeline, instead of the reference's
  single stream over the shuffled corpus: a document's instances then depend only on the seed, its index
  and the corpus, so the work splits over processes and the output is byte-identical for any
  ``num_proc``. The draws inside a document are the reference's. The final instance shuffle is
  ``Dataset.shuffle(seed)``. ``create_training_instances`` keeps the single stream for small corpora.
- NotNext draws its other document from the whole corpus in every worker: the workers read the
  tokenized corpus (memory-mapped Arrow when it lives in the cache; an in-memory one is copied to them).
- Tokens are ids, not strings; ``[CLS]``/``[SEP]`` are recognised by id. Text that spells a special token
  (a literal "[SEP]") is tokenized as ordinary text (``split_special_tokens=True``), as the reference's
  tokenizer does.
- Sentence splitting of raw text (``bert_repro.data.sentences``): the reference expects it done beforehand.
  Empty documents, empty sentences and text that looks like binary data are skipped and counted; a
  one-sentence document is kept, as the reference keeps it (its chunks are NotNext pairs).
- Options beyond the paper, off by default: dynamic masking (RoBERTa: a fresh mask for every batch,
  ``static_masking=False`` + ``PreTrainingCollator(dynamic_masking=True)``), other mask rates (MosaicBERT
  trains with ``masked_lm_prob=0.3``; raise ``max_predictions_per_seq`` with it) and other 80/10/10 splits
  (``mask_replace_prob`` / ``random_replace_prob``).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import json
import logging
import math
import random
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets import Dataset, Features, List, Value
from datasets.fingerprint import Hasher

from ..model.configuration_bert_repro import (
    DEFAULT_OBJECTIVE,
    PRETRAINING_OBJECTIVES,
    PreTrainingObjective,
    pretraining_objective,
)
from .sentences import (
    MAX_SENTENCE_CHARS,
    SENTENCE_PIECE_CHARS,
    bound_sentences,
    looks_like_binary,
    split_sentences,
)

__all__ = [
    "DOCUMENT_FEATURES",
    "IGNORE_INDEX",
    "IS_NEXT",
    "NOT_NEXT",
    "ArrowCorpus",
    "PreTrainingCollator",
    "PreTrainingDataConfig",
    "TrainingInstance",
    "WordPieceVocab",
    "create_instances_from_document",
    "create_masked_lm_predictions",
    "create_pretraining_dataset",
    "create_pretraining_instances",
    "create_training_instances",
    "document_rng",
    "instance_features",
    "mask_batch",
    "pretraining_statistics",
    "tokenize_documents",
    "truncate_seq_pair",
]

logger = logging.getLogger(__name__)

IS_NEXT, NOT_NEXT = 0, 1
#: Label ignored by the MLM loss (PyTorch's cross-entropy ``ignore_index``, the HF convention).
IGNORE_INDEX = -100

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


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass
class PreTrainingDataConfig:
    """The flags of the reference ``create_pretraining_data.py`` (same names, same defaults) plus options.

    Flat, so that ``transformers.HfArgumentParser`` can read it from a command line or a YAML file.
    """

    max_seq_length: int = field(default=128, metadata={"help": "Longest example, [CLS] and [SEP]s included."})
    max_predictions_per_seq: int = field(default=20, metadata={"help": "Most masked positions per example."})
    masked_lm_prob: float = field(default=0.15, metadata={"help": "Share of tokens to predict."})
    short_seq_prob: float = field(default=0.1, metadata={"help": "Chance of a shorter target length."})
    dupe_factor: int = field(default=10, metadata={"help": "Passes over the corpus, each with fresh masks."})
    random_seed: int = field(default=12345, metadata={"help": "Seed of all random choices."})
    do_whole_word_mask: bool = field(default=False, metadata={"help": "Mask the ## pieces of a word together."})
    static_masking: bool = field(
        default=True, metadata={"help": "Store masks in the data (paper); False leaves it to the collator."}
    )
    mask_replace_prob: float = field(default=0.8, metadata={"help": "Chosen position -> [MASK]."})
    random_replace_prob: float = field(default=0.1, metadata={"help": "Chosen position -> random token."})
    objective: str = field(
        default=DEFAULT_OBJECTIVE,
        metadata={
            "choices": list(PRETRAINING_OBJECTIVES),
            "help": "Pre-training objective, the paper's Table 5: "
            + ", ".join(f"{o.name} ({o.table5_row})" for o in PRETRAINING_OBJECTIVES.values())
            + ". Without NSP, examples are one segment [CLS] text [SEP]; ltr predicts the next token, unmasked.",
        },
    )

    def __post_init__(self) -> None:
        objective = self.pretraining_objective  # an unknown name raises, listing the choices
        if objective.next_sentence and self.max_seq_length < 5:
            raise ValueError(
                "max_seq_length must be at least 5 ([CLS] A [SEP] B [SEP] with a token in each of A and B), "
                f"got {self.max_seq_length}"
            )
        if self.max_seq_length < 4:
            raise ValueError(
                f"max_seq_length must be at least 4 ([CLS] text [SEP] with two text tokens) for "
                f"objective {objective.name!r}, got {self.max_seq_length}"
            )
        _check_masking(
            self.masked_lm_prob,
            self.max_predictions_per_seq,
            self.mask_replace_prob,
            self.random_replace_prob,
        )
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be at least 1, got {self.dupe_factor}")

    @property
    def pretraining_objective(self) -> PreTrainingObjective:
        """The ``PreTrainingObjective`` named by ``objective`` (the model config reads the same table)."""
        return pretraining_objective(self.objective)

    @property
    def max_num_tokens(self) -> int:
        """Room for the text: ``max_seq_length`` less ``[CLS]`` and two ``[SEP]`` (segments A and B), or one
        ``[SEP]`` for the one-segment examples of an objective without NSP."""
        return self.max_seq_length - (3 if self.pretraining_objective.next_sentence else 2)

    @property
    def stores_masks(self) -> bool:
        """Whether the built examples carry their masks: static masking of a masked-LM objective."""
        return self.static_masking and self.pretraining_objective.masked_lm


def _check_masking(
    masked_lm_prob: float, max_predictions_per_seq: int, mask_replace_prob: float, random_replace_prob: float
) -> None:
    if not 0.0 < masked_lm_prob <= 1.0:
        raise ValueError(f"masked_lm_prob must be in (0, 1], got {masked_lm_prob}")
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be at least 1, got {max_predictions_per_seq}")
    if mask_replace_prob < 0 or random_replace_prob < 0 or mask_replace_prob + random_replace_prob > 1 + 1e-9:
        raise ValueError(
            "mask_replace_prob and random_replace_prob must be >= 0 and sum to at most 1, "
            f"got {mask_replace_prob} and {random_replace_prob}"
        )


@dataclass(frozen=True)
class WordPieceVocab:
    """What pair building and masking need to know of the vocabulary, for tokens as strings or as ids.

    ``vocab_words`` is the whole vocabulary in id order (``range(size)`` for ids): a random replacement is
    ``vocab_words[rng.randint(0, len(vocab_words) - 1)]``, any entry, special ones included, as in the
    reference. ``subword_tokens`` are the tokens that continue a word (``##`` pieces).
    """

    cls_token: Hashable
    sep_token: Hashable
    mask_token: Hashable
    vocab_words: Sequence[Any]
    subword_tokens: frozenset = frozenset()
    pad_token: Hashable | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, as_ids: bool = True) -> WordPieceVocab:
        """From a (fast) BERT tokenizer; ``as_ids=False`` gives the string tokens of the reference code."""
        vocab: dict[str, int] = tokenizer.get_vocab()
        missing = [name for name in ("cls_token", "sep_token", "mask_token") if getattr(tokenizer, name) is None]
        if missing:
            raise ValueError(f"the tokenizer has no {', '.join(missing)}: BERT pre-training data needs all three")
        if as_ids:
            return cls(
                cls_token=tokenizer.cls_token_id,
                sep_token=tokenizer.sep_token_id,
                mask_token=tokenizer.mask_token_id,
                vocab_words=range(max(vocab.values()) + 1),
                subword_tokens=frozenset(i for t, i in vocab.items() if t.startswith("##")),
                pad_token=tokenizer.pad_token_id,
            )
        return cls.from_vocab_words(
            [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])],
            cls_token=tokenizer.cls_token,
            sep_token=tokenizer.sep_token,
            mask_token=tokenizer.mask_token,
            pad_token=tokenizer.pad_token,
        )

    @classmethod
    def from_vocab_words(
        cls,
        vocab_words: Sequence[str],
        *,
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        mask_token: str = "[MASK]",
        pad_token: str | None = "[PAD]",
    ) -> WordPieceVocab:
        """String tokens, as the reference reads them from ``vocab.txt`` (one token a line, in id order)."""
        return cls(
            cls_token=cls_token,
            sep_token=sep_token,
            mask_token=mask_token,
            vocab_words=list(vocab_words),
            subword_tokens=frozenset(t for t in vocab_words if t.startswith("##")),
            pad_token=pad_token,
        )


@dataclass
class TrainingInstance:
    """One sentence pair: ``[CLS] A [SEP] B [SEP]`` with its masked LM targets (reference names); without NSP
    one segment ``[CLS] text [SEP]`` and ``is_random_next`` None."""

    tokens: list[Any]
    segment_ids: list[int]
    is_random_next: bool | None
    masked_lm_positions: list[int] = field(default_factory=list)
    masked_lm_labels: list[Any] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# The reference algorithm (steps 1-7)
# --------------------------------------------------------------------------------------------------


def create_training_instances(
    documents: Iterable[Sequence[Sequence[Any]]],
    vocab: WordPieceVocab,
    config: PreTrainingDataConfig,
    rng: random.Random | None = None,
) -> list[TrainingInstance]:
    """The reference's whole-corpus loop with one random stream (``random.Random(config.random_seed)``).

    Empty sentences and empty documents are dropped, the documents shuffled, ``dupe_factor`` rounds run
    over all of them, and the instances shuffled. Holds everything in memory: for large corpora use
    ``create_pretraining_instances``.
    """
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
    """One pass (one ``dupe_factor`` round) over ``all_documents[document_index]``: steps 1-7.

    ``all_documents`` holds non-empty documents of non-empty sentences; any of them may give segment B of a
    NotNext pair. Masks are drawn right after each pair (as in the reference) when ``config.static_masking``.
    An objective without NSP makes each chunk one segment (the module docstring) and draws no pair.
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
    all_documents: Sequence[Sequence[Sequence[Any]]],
    document_index: int,
    target_b_length: int,
    rng: random.Random,
) -> list[Any]:
    """Segment B of a NotNext pair: sentences from a random start in a random other document.

    Ten tries to draw a document other than the current one, then the last draw is used whatever it is
    (the reference's rule: with a single document, B comes from the same document).
    """
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
    """Step 5, in place: drop a token from the front or back (p 0.5) of the longer segment until they fit.

    The same random draws as the reference's loop, but the lists are cut once at the end, so a segment of
    25,000 tokens (a 100,000-character line) costs one draw per dropped token and no quadratic list work.
    """
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
    """Step 6 (and 7 with static masking): ``[CLS] A [SEP] B [SEP]``, segment ids, masks; without NSP
    ``[CLS] A [SEP]`` (``tokens_b`` empty), segment ids 0, masks only for a masked-LM objective."""
    if config.pretraining_objective.next_sentence:
        tokens = [vocab.cls_token, *tokens_a, vocab.sep_token, *tokens_b, vocab.sep_token]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    else:
        tokens, segment_ids = [vocab.cls_token, *tokens_a, vocab.sep_token], [0] * (len(tokens_a) + 2)
    instance = TrainingInstance(tokens=tokens, segment_ids=segment_ids, is_random_next=is_random_next)
    if config.stores_masks:
        instance.tokens, instance.masked_lm_positions, instance.masked_lm_labels = create_masked_lm_predictions(
            tokens,
            config.masked_lm_prob,
            config.max_predictions_per_seq,
            vocab,
            rng,
            do_whole_word_mask=config.do_whole_word_mask,
            mask_replace_prob=config.mask_replace_prob,
            random_replace_prob=config.random_replace_prob,
        )
    return instance


def create_masked_lm_predictions(
    tokens: Sequence[Any],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab: WordPieceVocab,
    rng: random.Random,
    *,
    do_whole_word_mask: bool = False,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
) -> tuple[list[Any], list[int], list[Any]]:
    """Step 7: ``(output_tokens, masked_lm_positions, masked_lm_labels)``, positions ascending.

    Candidates are all positions but ``[CLS]``/``[SEP]`` (with whole-word masking: groups of a word-initial
    piece and the ``##`` pieces after it), shuffled; groups are taken in that order, a group that would
    overshoot the budget being skipped, until ``min(max_predictions_per_seq, max(1, round(len(tokens) *
    masked_lm_prob)))`` positions are chosen. Each chosen position becomes ``[MASK]`` with probability
    ``mask_replace_prob``, a random vocabulary entry with ``random_replace_prob``, else stays.
    """
    cand_indexes = _candidate_groups(tokens, vocab, do_whole_word_mask)
    rng.shuffle(cand_indexes)
    num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))
    keep_share = _keep_share(mask_replace_prob, random_replace_prob)

    output_tokens = list(tokens)
    masked: list[tuple[int, Any]] = []
    covered: set[int] = set()
    for index_set in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict or any(i in covered for i in index_set):
            continue
        for index in index_set:
            covered.add(index)
            output_tokens[index] = _replacement(tokens[index], vocab, rng, mask_replace_prob, keep_share)
            masked.append((index, tokens[index]))
    masked.sort(key=lambda m: m[0])
    return output_tokens, [m[0] for m in masked], [m[1] for m in masked]


def _candidate_groups(tokens: Sequence[Any], vocab: WordPieceVocab, do_whole_word_mask: bool) -> list[list[int]]:
    """Positions that may be masked, grouped by word with whole-word masking (as the reference groups them:
    a ``##`` piece joins the group before it, even across a ``[SEP]``)."""
    if not do_whole_word_mask:
        return [[i] for i, token in enumerate(tokens) if token != vocab.cls_token and token != vocab.sep_token]
    groups: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token == vocab.cls_token or token == vocab.sep_token:
            continue
        if groups and token in vocab.subword_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _keep_share(mask_replace_prob: float, random_replace_prob: float) -> float:
    """Chance of "unchanged" once "[MASK]" was not drawn (0.5 for 80/10/10, exactly, as in the reference)."""
    if mask_replace_prob >= 1.0:
        return 0.0
    return round((1.0 - mask_replace_prob - random_replace_prob) / (1.0 - mask_replace_prob), 12)


def _replacement(
    token: Any, vocab: WordPieceVocab, rng: random.Random, mask_replace_prob: float, keep_share: float
) -> Any:
    """What a chosen position shows the model: ``[MASK]``, itself, or a random vocabulary entry."""
    if rng.random() < mask_replace_prob:
        return vocab.mask_token
    if rng.random() < keep_share:
        return token
    return vocab.vocab_words[rng.randint(0, len(vocab.vocab_words) - 1)]


# --------------------------------------------------------------------------------------------------
# datasets pipeline: documents -> sentences -> WordPiece ids
# --------------------------------------------------------------------------------------------------


def tokenize_documents(
    dataset: Dataset,
    tokenizer: Any,
    *,
    text_column: str = "text",
    split_lines: bool = False,
    num_proc: int | None = None,
    batch_size: int = 64,
) -> Dataset:
    """Split each row's text into sentences and each sentence into WordPiece ids (no special tokens).

    Returns one row per input row with the columns of ``DOCUMENT_FEATURES``; a row that is empty, holds
    only white space or looks like binary data keeps no sentences and says why in ``skip_reason``
    (the counts are logged). ``split_lines``: see ``bert_repro.data.sentences.split_sentences``. A "sentence"
    longer than ``sentences.MAX_SENTENCE_CHARS`` characters (text without sentence punctuation) is cut into
    pieces of at most ``sentences.SENTENCE_PIECE_CHARS`` characters, counted in ``long_sentences`` and logged
    as a warning with the rows concerned: our departure from the reference, which would keep it whole and
    make one truncated example of it (see the module docstring of ``bert_repro.data.sentences``).
    """
    _check_text_column(dataset, text_column)
    # The fingerprint of the result, whatever num_proc (the balanced order below changes only how the work
    # is split, not the output): the cache of a run with one num_proc serves runs with any other.
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
    """UTF-8 bytes of each row's text, in the dataset's row order (read from Arrow, no text decoded)."""
    lengths = pc.fill_null(pc.binary_length(dataset.data.column(text_column)), 0).to_numpy()
    indices = getattr(dataset, "_indices", None)
    return lengths if indices is None else lengths[indices.column(0).to_numpy()]


def _balanced_order(weights: np.ndarray, num_proc: int | None) -> np.ndarray | None:
    """A row order in which every worker of ``map(num_proc=...)`` gets about the same share of the work.

    Why: ``Dataset.map`` gives worker ``k`` the ``k``-th contiguous block of rows
    (``shard(contiguous=True)``), and documents differ in size by orders of magnitude (a book against a
    speech; a corpus concatenated from sources lists all the long documents together), so one worker can get
    most of the work while the others wait. The heaviest rows go first, each to the lightest block that
    still has room (the blocks keep the row counts that ``shard`` gives them); a block keeps its rows in
    their input order. The caller maps over ``select(order)`` and puts the output back in input order, so
    the result does not depend on ``num_proc``. ``None``: nothing to balance (one process), or the
    reordering would cut the heaviest block's work by less than 5% (not worth putting the rows back in
    order).
    """
    weights = np.asarray(weights, dtype=np.int64)
    n = len(weights)
    if not num_proc or num_proc < 2 or n < 2:
        return None
    num_shards = min(num_proc, n)
    div, mod = divmod(n, num_shards)
    room = [div + (1 if k < mod else 0) for k in range(num_shards)]
    blocks: list[list[int]] = [[] for _ in range(num_shards)]
    heap = [(0, k) for k in range(num_shards)]  # (load, block) of the blocks with room left
    for row in np.argsort(-weights, kind="stable").tolist():
        load, k = heapq.heappop(heap)
        blocks[k].append(row)
        if len(blocks[k]) < room[k]:
            heapq.heappush(heap, (load + int(weights[row]), k))
    contiguous = np.add.reduceat(weights, np.cumsum([0, *room[:-1]])).max()
    balanced = max(int(weights[b].sum()) for b in blocks)
    if balanced >= 0.95 * contiguous:
        return None
    return np.concatenate([np.sort(np.asarray(b, dtype=np.int64)) for b in blocks])


def _flatten(dataset: Dataset, fingerprint: str) -> Dataset:
    """``flatten_indices`` (a cached map) with Arrow batches: the rows are written as whole tables, not cast
    one row at a time as ``flatten_indices`` does with Python batches after a shuffle (about 6x faster)."""
    fmt = dataset.format
    flat = dataset.with_format("arrow").flatten_indices(new_fingerprint=fingerprint)
    flat = flat.with_format(fmt["type"], fmt["columns"], fmt["output_all_columns"], **fmt["format_kwargs"])
    flat._fingerprint = fingerprint  # the format is the input's again: same data, same fingerprint
    return flat


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
    """``_tokenize_table`` as Python lists (for callers that take a few documents at a time)."""
    return _tokenize_table(texts, tokenizer, split_lines).to_pydict()


def _tokenize_table(texts: list[Any], tokenizer: Any, split_lines: bool) -> pa.Table:
    """One batch of documents as an Arrow table of ``DOCUMENT_FEATURES``. Sentences are encoded a slice at a time
    and each slice goes to Arrow at once: a document of 100 MB never exists as Python lists of token ids (the
    tokenizer's encodings and Python integers take many times the bytes of the ids)."""
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
        ids = _encode(tokenizer, flat[k : k + _ENCODE_SLICE])
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


def _encode(tokenizer: Any, sentences: list[str]) -> list[list[int]]:
    if not sentences:
        return []
    encoded = tokenizer(
        sentences,
        add_special_tokens=False,
        split_special_tokens=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )
    return encoded["input_ids"]


def _log_long_sentences(documents: Dataset, shown: int = 5) -> None:
    counts = documents.data.column("long_sentences").to_numpy()
    rows = np.flatnonzero(counts)
    if len(rows):
        # Said, not warned: real prose has such sentences (a few in Austen's novels), and the text is kept, in
        # pieces. Text without sentence punctuation is warned about by the corpus reader, which names the file.
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
            "skipped %d empty and %d binary-looking documents of %d",
            counts["empty"],
            counts["binary"],
            len(documents),
        )


# --------------------------------------------------------------------------------------------------
# datasets pipeline: WordPiece documents -> training instances
# --------------------------------------------------------------------------------------------------


def document_rng(seed: int, document_index: int, dupe_round: int) -> random.Random:
    """The random stream of one document in one ``dupe_factor`` round (a departure from the reference's
    single stream, so that documents can be processed in any order and in parallel)."""
    digest = hashlib.sha256(f"{seed}/{dupe_round}/{document_index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def instance_features(static_masking: bool = True, next_sentence: bool = True) -> Features:
    """Columns of ``create_pretraining_instances`` (``PreTrainingDataConfig.stores_masks`` and its objective's
    ``next_sentence``: ``_config_features``)."""
    columns: dict[str, Any] = {"input_ids": List(Value("int32")), "token_type_ids": List(Value("int8"))}
    if next_sentence:
        columns["next_sentence_label"] = Value("int8")
    if static_masking:
        columns["masked_lm_positions"] = List(Value("int32"))
        columns["masked_lm_ids"] = List(Value("int32"))
    return Features(columns)


def _config_features(config: PreTrainingDataConfig) -> Features:
    return instance_features(config.stores_masks, config.pretraining_objective.next_sentence)


def create_pretraining_instances(
    documents: Dataset,
    vocab: WordPieceVocab,
    config: PreTrainingDataConfig,
    *,
    num_proc: int | None = None,
    shuffle: bool = True,
    batch_size: int = 16,
) -> Dataset:
    """Steps 1-7 over every document of ``tokenize_documents``'s output, ``config.dupe_factor`` times.

    Document ``d`` in round ``r`` draws from ``document_rng(config.random_seed, d, r)`` (a departure from the
    reference's single stream over the corpus, made so the work parallelises); the result is the same
    bytes for any ``num_proc``. NotNext segments come from the whole corpus in every worker. With
    ``shuffle`` the instances are shuffled with ``config.random_seed``, as the reference shuffles them.
    ``vocab`` must hold ids (``WordPieceVocab.from_tokenizer(tokenizer)``).
    """
    missing = {"sentences", "num_sentences"} - set(documents.column_names)
    if missing:
        raise ValueError(f"documents need the columns of tokenize_documents, missing {sorted(missing)}")
    if getattr(documents, "_indices", None) is not None:
        # The corpus is read from the Arrow table by row number.
        documents = _flatten(documents, Hasher.hash([documents._fingerprint, "flat"]))
    corpus = ArrowCorpus(documents)
    if len(corpus) == 0:
        raise ValueError("no document with at least one sentence: nothing to build examples from")
    if len(corpus) == 1:
        logger.warning("one document only: NotNext segments will come from that same document (reference rule)")
    fingerprint = Hasher.hash([documents._fingerprint, asdict(config), _vocab_key(vocab), "instances-1"])
    features = _config_features(config)
    size = "num_tokens" if "num_tokens" in documents.column_names else "num_sentences"
    order = _balanced_order(documents.data.column(size).to_numpy(), num_proc)
    map_kwargs = dict(
        batched=True,
        batch_size=batch_size,
        num_proc=num_proc,
        with_indices=True,
        input_columns=["sentences"],
        remove_columns=documents.column_names,
        desc="Pre-training instances",
    )
    fn_kwargs = {"corpus": corpus, "vocab": vocab, "config": config}
    if order is None:
        instances = documents.map(
            _instances_batch, features=features, fn_kwargs=fn_kwargs, new_fingerprint=fingerprint, **map_kwargs
        )
    else:
        # Balanced blocks of documents (see _balanced_order); each instance carries its document's row, and
        # a stable sort on it restores the order of the one-process run before the shuffle.
        instances = documents.select(order).map(
            _instances_batch,
            features=Features({**features, "document": Value("int64")}),
            fn_kwargs={**fn_kwargs, "rows": order},
            new_fingerprint=Hasher.hash([fingerprint, order]),
            **map_kwargs,
        )
        restore = np.argsort(instances.data.column("document").to_numpy(), kind="stable")
        instances = instances.remove_columns("document").select(restore)
        if not shuffle:
            instances = _flatten(instances, fingerprint)
    if shuffle:
        shuffled = instances.shuffle(seed=config.random_seed)
        instances = _flatten(shuffled, Hasher.hash([fingerprint, "shuffled", config.random_seed]))
    return instances


def _vocab_key(vocab: WordPieceVocab) -> str:
    subwords = sorted(map(str, vocab.subword_tokens))
    return json.dumps(
        [
            str(vocab.cls_token),
            str(vocab.sep_token),
            str(vocab.mask_token),
            len(vocab.vocab_words),
            hashlib.sha256("\n".join(subwords).encode()).hexdigest(),
        ]
    )


def _instances_batch(
    batch_sentences: list[list[list[int]]],
    indices: list[int],
    corpus: ArrowCorpus,
    vocab: WordPieceVocab,
    config: PreTrainingDataConfig,
    rows: np.ndarray | None = None,
) -> dict[str, list[Any]]:
    """Instances of a batch of documents; ``rows``: the documents' rows when the map runs over a reordered
    selection (``indices`` are then positions in it), and each instance gets its ``document`` row."""
    out: dict[str, list[Any]] = {name: [] for name in _config_features(config)}
    if rows is not None:
        indices, out["document"] = [int(rows[i]) for i in indices], []
    for document, row in zip(batch_sentences, indices, strict=True):
        position = corpus.position(row)
        if position is None:
            continue
        view = _WithCurrent(corpus, position, document)
        for dupe_round in range(config.dupe_factor):
            rng = document_rng(config.random_seed, row, dupe_round)
            for instance in create_instances_from_document(view, position, vocab, rng, config):
                _append_instance(out, instance)
                if rows is not None:
                    out["document"].append(row)
    return out


def _append_instance(out: dict[str, list[Any]], instance: TrainingInstance) -> None:
    """One instance into the columns of ``out`` (those of ``_config_features``)."""
    out["input_ids"].append(instance.tokens)
    out["token_type_ids"].append(instance.segment_ids)
    if "next_sentence_label" in out:
        out["next_sentence_label"].append(NOT_NEXT if instance.is_random_next else IS_NEXT)
    if "masked_lm_positions" in out:
        out["masked_lm_positions"].append(instance.masked_lm_positions)
        out["masked_lm_ids"].append(instance.masked_lm_labels)


class ArrowCorpus(Sequence):
    """The non-empty documents of a ``tokenize_documents`` dataset as a sequence of documents, read lazily.

    ``corpus[j]`` is the ``j``-th document with at least one sentence (the reference drops empty ones);
    its sentences are converted to Python lists one at a time, when asked for, so drawing a NotNext
    segment from a book-sized document reads only the sentences it uses. Pickles as the dataset does
    (a memory-mapped dataset by file name).
    """

    def __init__(self, documents: Dataset) -> None:
        self._documents = documents
        self._index: tuple[list[pa.Array], list[int], np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_documents": self._documents, "_index": None}

    def _build_index(self) -> tuple[list[pa.Array], list[int], np.ndarray]:
        if self._index is None:
            table = self._documents.data
            chunks = table.column("sentences").chunks
            starts = np.cumsum([0] + [len(c) for c in chunks[:-1]]).tolist()
            counts = table.column("num_sentences").to_numpy()
            self._index = (chunks, starts, np.flatnonzero(counts > 0))
        return self._index

    def __len__(self) -> int:
        return len(self._build_index()[2])

    def position(self, row: int) -> int | None:
        """Position among the non-empty documents of dataset row ``row`` (None if that row is empty)."""
        rows = self._build_index()[2]
        position = int(np.searchsorted(rows, row))
        return position if position < len(rows) and rows[position] == row else None

    def __getitem__(self, position: int) -> _ArrowDocument:  # type: ignore[override]
        chunks, starts, rows = self._build_index()
        row = int(rows[position])
        c = bisect.bisect_right(starts, row) - 1
        return _ArrowDocument(chunks[c][row - starts[c]].values)


class _ArrowDocument(Sequence):
    """A document's sentences (an Arrow list array), each converted to a list of ints on access."""

    def __init__(self, sentences: pa.Array) -> None:
        self._sentences = sentences

    def __len__(self) -> int:
        return len(self._sentences)

    def __getitem__(self, k: int) -> list[int]:  # type: ignore[override]
        return self._sentences[k].as_py()


class _WithCurrent(Sequence):
    """The corpus, with the document being processed already decoded (it is read whole)."""

    def __init__(self, corpus: ArrowCorpus, position: int, document: list[list[int]]) -> None:
        self._corpus, self._position, self._document = corpus, position, document

    def __len__(self) -> int:
        return len(self._corpus)

    def __getitem__(self, position: int) -> Sequence[Sequence[int]]:  # type: ignore[override]
        return self._document if position == self._position else self._corpus[position]


def create_pretraining_dataset(
    dataset: Dataset,
    tokenizer: Any,
    config: PreTrainingDataConfig | None = None,
    *,
    text_column: str = "text",
    split_lines: bool = False,
    num_proc: int | None = None,
    shuffle: bool = True,
) -> Dataset:
    """Raw documents (one a row, in ``text_column``) -> pre-training instances: ``tokenize_documents`` then
    ``create_pretraining_instances``. Same ``config.random_seed`` -> same bytes, whatever ``num_proc``."""
    config = PreTrainingDataConfig() if config is None else config
    documents = tokenize_documents(
        dataset, tokenizer, text_column=text_column, split_lines=split_lines, num_proc=num_proc
    )
    return create_pretraining_instances(
        documents, WordPieceVocab.from_tokenizer(tokenizer), config, num_proc=num_proc, shuffle=shuffle
    )


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------


def pretraining_statistics(
    instances: Dataset,
    documents: Dataset | None = None,
    *,
    mask_token_id: int | None = None,
    num_bins: int = 16,
    batch_size: int = 65_536,
) -> dict[str, Any]:
    """Counts and shares of a built dataset, as a JSON-serialisable dict (read in batches of ``batch_size``).

    ``examples``, ``tokens`` (all positions, special tokens included), ``is_next_share`` (only for data with
    NSP pairs, i.e. a ``next_sentence_label`` column), ``length_histogram`` (``"lo-hi"`` -> examples, inclusive
    bounds); with static masks ``masked`` and
    ``masked_share`` (of ``tokens``, the base of ``masked_lm_prob``), and with ``mask_token_id`` the split of
    the masked positions into ``[MASK]`` / random / unchanged (a random draw that hits the original token
    counts as unchanged). With ``documents`` (``tokenize_documents``'s output): documents, sentences and
    tokens of the corpus and the skipped documents by reason.
    """
    stats: dict[str, Any] = {} if documents is None else _document_statistics(documents)
    static = "masked_lm_positions" in instances.column_names
    pairs = "next_sentence_label" in instances.column_names
    length_counts = np.zeros(0, dtype=np.int64)
    is_next = masked = as_mask = unchanged = 0
    for table in instances.with_format("arrow").iter(batch_size=batch_size):
        input_ids = _combined(table.column("input_ids"))
        lengths = pc.list_value_length(input_ids).to_numpy(zero_copy_only=False).astype(np.int64)
        length_counts = _add_counts(length_counts, np.bincount(lengths))
        if pairs:
            is_next += int(np.sum(table.column("next_sentence_label").to_numpy() == IS_NEXT))
        if static:
            shown, originals = _masked_tokens(table, input_ids, lengths)
            masked += len(shown)
            if mask_token_id is not None:
                as_mask += int(np.sum(shown == mask_token_id))
                unchanged += int(np.sum((shown == originals) & (shown != mask_token_id)))
    examples = int(length_counts.sum())
    tokens = int(np.dot(np.arange(len(length_counts)), length_counts))
    stats.update(examples=examples, tokens=tokens)
    if pairs:
        stats["is_next_share"] = is_next / examples if examples else None
    stats["length_histogram"] = _histogram(length_counts, num_bins)
    if static:
        stats.update(masked=masked, masked_share=masked / max(1, tokens))
        if mask_token_id is not None and masked:
            stats["masked_split"] = {
                "mask": as_mask / masked,
                "random": (masked - as_mask - unchanged) / masked,
                "unchanged": unchanged / masked,
            }
    return stats


def _combined(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _add_counts(total: np.ndarray, counts: np.ndarray) -> np.ndarray:
    size = max(len(total), len(counts))
    return np.pad(total, (0, size - len(total))) + np.pad(counts, (0, size - len(counts)))


def _masked_tokens(table: pa.Table, input_ids: pa.Array, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the model is shown at each stored masked position, and the original token there."""
    positions = _combined(table.column("masked_lm_positions"))
    originals = _combined(table.column("masked_lm_ids")).flatten().to_numpy()
    parents = pc.list_parent_indices(positions).to_numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    shown = input_ids.flatten().to_numpy()[starts[parents] + positions.flatten().to_numpy()]
    return shown, originals


def _skip_counts(documents: Dataset) -> dict[str, int]:
    counts = pc.value_counts(documents.data.column("skip_reason")).to_pylist()
    found = {c["values"]: c["counts"] for c in counts}
    return {reason: int(found.get(reason, 0)) for reason in ("empty", "binary")}


def _document_statistics(documents: Dataset) -> dict[str, Any]:
    counts = documents.data.column("num_sentences").to_numpy()
    return {
        "documents": int(np.sum(counts > 0)),
        "documents_skipped": _skip_counts(documents),
        "one_sentence_documents": int(np.sum(counts == 1)),
        "sentences": int(counts.sum()),
        "document_tokens": int(documents.data.column("num_tokens").to_numpy().sum()),
        # Overlong "sentences" cut into pieces (text without sentence punctuation; see sentences.py).
        "long_sentences_cut": (
            int(documents.data.column("long_sentences").to_numpy().sum())
            if "long_sentences" in documents.column_names
            else 0
        ),
    }


def _histogram(length_counts: np.ndarray, num_bins: int) -> dict[str, int]:
    """Exact length counts -> ``num_bins`` bins of equal width over ``[0, longest]``."""
    if not length_counts.sum():
        return {}
    width = max(1, math.ceil(len(length_counts) / num_bins))
    bins = np.add.reduceat(length_counts, np.arange(0, len(length_counts), width))
    return {f"{b * width}-{(b + 1) * width - 1}": int(n) for b, n in enumerate(bins) if n}


# --------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------


@dataclass
class PreTrainingCollator:
    """Pads a batch of pre-training instances and gives the inputs of ``BertForPreTraining``.

    Output: ``input_ids``, ``token_type_ids``, ``attention_mask``, ``labels`` (the original token at each
    masked position, -100 elsewhere) and, when the rows have it, ``next_sentence_label`` (0 = IsNext,
    1 = NotNext), all ``torch.long``, padded to the longest row (or to ``pad_to_multiple_of``); and
    ``masked_positions`` (examples, max_predictions_per_seq): where each example's labels lie, as indices
    into the flattened (batch * width) labels, the unused slots naming a position without a label (the
    example's last token): Google's ``masked_lm_positions`` made batch-wide. The model's sparse MLM
    prediction gathers there, a number of positions that depends on the batch size only, so its shapes do not
    change with the masks (``torch.compile``: one graph, no recompilation). An example with more labels (the
    "ltr" objective, stored masks of a larger budget) widens the slots to its count.

    Static masking (default, the paper): the masks stored by ``create_pretraining_instances``
    (``masked_lm_positions`` / ``masked_lm_ids``). Dynamic masking (RoBERTa, ``dynamic_masking=True``, for
    data built with ``static_masking=False``): every call draws fresh masks with the reference rules
    (``create_masked_lm_predictions``), seeded from torch's random generator, which ``DataLoader`` seeds
    differently in each worker and each epoch (``torch.manual_seed`` makes runs repeatable).

    ``objective`` (a name of ``PRETRAINING_OBJECTIVES``): a masked-LM objective is handled as above; "ltr" (the
    left-to-right control of Table 5) is not masked, and its ``labels`` are the next token at every real position
    but the last (-100 at the last real token and at padding), shifted here so that the model reads them as MLM
    labels: position i is trained to predict token i + 1.
    """

    tokenizer: Any
    dynamic_masking: bool = False
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    do_whole_word_mask: bool = False
    pad_to_multiple_of: int | None = None
    objective: str = DEFAULT_OBJECTIVE
    vocab: WordPieceVocab = field(init=False, repr=False)
    pretraining_objective: PreTrainingObjective = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_masking(
            self.masked_lm_prob,
            self.max_predictions_per_seq,
            self.mask_replace_prob,
            self.random_replace_prob,
        )
        self.vocab = WordPieceVocab.from_tokenizer(self.tokenizer)
        if self.vocab.pad_token is None:
            raise ValueError("the tokenizer has no pad token")
        self.pretraining_objective = pretraining_objective(self.objective)
        if self.dynamic_masking and not self.pretraining_objective.masked_lm:
            raise ValueError(
                f"objective {self.objective!r} predicts the next token and masks nothing: dynamic_masking must be False"
            )

    @classmethod
    def from_config(cls, tokenizer: Any, config: PreTrainingDataConfig, **kwargs: Any) -> PreTrainingCollator:
        """A collator that matches how ``config`` built the data (dynamic masking when it stored no masks)."""
        return cls(
            tokenizer,
            objective=config.objective,
            dynamic_masking=config.pretraining_objective.masked_lm and not config.static_masking,
            masked_lm_prob=config.masked_lm_prob,
            max_predictions_per_seq=config.max_predictions_per_seq,
            mask_replace_prob=config.mask_replace_prob,
            random_replace_prob=config.random_replace_prob,
            do_whole_word_mask=config.do_whole_word_mask,
            **kwargs,
        )

    def _masked(self, features: list[Mapping[str, Any]]) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
        """Each row's token ids after masking and its (masked positions, original ids): the stored masks, or fresh
        ones drawn with the reference rules under dynamic masking."""
        if not self.pretraining_objective.masked_lm:
            raise ValueError(f"objective {self.objective!r} predicts the next token: its rows have no masks")
        input_ids = [list(f["input_ids"]) for f in features]
        if self.dynamic_masking:
            return self._mask_dynamically(features, input_ids)
        return input_ids, self._stored_masks(features)

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if self.pretraining_objective.masked_lm:
            input_ids, targets = self._masked(features)
        else:  # the next token at each position but the last
            input_ids = [list(f["input_ids"]) for f in features]
            targets = [(list(range(len(ids) - 1)), ids[1:]) for ids in input_ids]
        width = self._padded_width(max(len(ids) for ids in input_ids))
        batch = {
            "input_ids": _pad(input_ids, width, self.vocab.pad_token),
            "token_type_ids": _pad([list(f["token_type_ids"]) for f in features], width, 0),
            "attention_mask": _pad([[1] * len(ids) for ids in input_ids], width, 0),
            "labels": torch.full((len(features), width), IGNORE_INDEX, dtype=torch.long),
        }
        for row, (positions, ids) in enumerate(targets):
            batch["labels"][row, torch.as_tensor(positions, dtype=torch.long)] = torch.as_tensor(ids, dtype=torch.long)
        batch["masked_positions"] = self._masked_positions(
            targets, [r * width for r in range(len(targets))], [len(ids) for ids in input_ids]
        )
        if "next_sentence_label" in features[0]:
            batch["next_sentence_label"] = torch.tensor([int(f["next_sentence_label"]) for f in features])
        return batch

    def _masked_positions(
        self, targets: list[tuple[list[int], list[int]]], starts: list[int], lengths: list[int]
    ) -> torch.Tensor:
        """(examples, slots): each example's label positions, sorted, then its last position without a
        label (its [SEP]; the last token for "ltr"), all offset by `starts` (where the example begins in the
        flattened batch); slots: max_predictions_per_seq, or an example's most labels."""
        slots = max([self.max_predictions_per_seq] + [len(positions) for positions, _ in targets])
        out = torch.empty((len(targets), slots), dtype=torch.long)
        for i, ((positions, _), start, length) in enumerate(zip(targets, starts, lengths)):
            free = max(set(range(length)) - set(positions))
            out[i] = start + torch.as_tensor(sorted(positions) + [free] * (slots - len(positions)))
        return out

    def _padded_width(self, longest: int) -> int:
        multiple = self.pad_to_multiple_of
        return longest if not multiple else -(-longest // multiple) * multiple

    def _stored_masks(self, features: list[Mapping[str, Any]]) -> list[tuple[list[int], list[int]]]:
        if "masked_lm_positions" not in features[0] or "masked_lm_ids" not in features[0]:
            raise ValueError(
                "static masking needs masked_lm_positions and masked_lm_ids in every row: build the data "
                "with static_masking=True, or use PreTrainingCollator(dynamic_masking=True)"
            )
        return [(list(f["masked_lm_positions"]), list(f["masked_lm_ids"])) for f in features]

    def _mask_dynamically(
        self,
        features: list[Mapping[str, Any]],
        input_ids: list[list[int]],
    ) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
        if "masked_lm_positions" in features[0]:
            raise ValueError(
                "these rows already carry static masks (their input_ids hold [MASK]s): build the data with "
                "static_masking=False for dynamic masking"
            )
        rng = random.Random(int(torch.randint(0, 2**62, (1,)).item()))
        return mask_batch(
            input_ids,
            self.vocab,
            rng,
            masked_lm_prob=self.masked_lm_prob,
            max_predictions_per_seq=self.max_predictions_per_seq,
            do_whole_word_mask=self.do_whole_word_mask,
            mask_replace_prob=self.mask_replace_prob,
            random_replace_prob=self.random_replace_prob,
        )


def mask_batch(
    input_ids: Sequence[Sequence[int]] | torch.Tensor,
    vocab: WordPieceVocab,
    rng: random.Random,
    *,
    attention_mask: Sequence[Sequence[int]] | torch.Tensor | None = None,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
    do_whole_word_mask: bool = False,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
    """Dynamic masking of id sequences: lists, or the rows of a tensor.

    Padded rows (right padding) need their ``attention_mask``: only the first ``sum(attention_mask[i])``
    ids of row ``i`` are used and returned. Returns the masked sequences and, per sequence,
    ``(masked_lm_positions, masked_lm_ids)``, drawn with the rules of the static masks
    (``create_masked_lm_predictions``).
    """
    rows = input_ids.tolist() if isinstance(input_ids, torch.Tensor) else [list(r) for r in input_ids]
    if attention_mask is not None:
        lengths = torch.as_tensor(attention_mask).sum(-1).tolist()
        rows = [row[:n] for row, n in zip(rows, lengths, strict=True)]
    masked_rows, targets = [], []
    for ids in rows:
        out, positions, labels = create_masked_lm_predictions(
            ids,
            masked_lm_prob,
            max_predictions_per_seq,
            vocab,
            rng,
            do_whole_word_mask=do_whole_word_mask,
            mask_replace_prob=mask_replace_prob,
            random_replace_prob=random_replace_prob,
        )
        masked_rows.append(out)
        targets.append((positions, labels))
    return masked_rows, targets


def _pad(rows: list[list[int]], width: int, value: int) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out
