"""Pre-training examples for masked LM and next sentence prediction (paper §3.1, appendix A.2).

As google-research/bert's ``create_pretraining_data.py`` builds them, for each document (sentences of WordPiece ids),
``dupe_factor`` times:

1. The target is ``max_num_tokens = max_seq_length - 3``, or with probability ``short_seq_prob`` a random length in
   ``[2, max_num_tokens]``, drawn once per document and round.
2. Whole sentences fill a chunk up to the target or the document's end.
3. Segment A is the chunk's first ``a_end`` sentences, ``a_end`` random in ``[1, len(chunk) - 1]``.
4. With probability 0.5, and always for a one-sentence chunk, NotNext: B starts at a random sentence of a random other
   document, up to ``target - len(A)`` tokens, and the unused sentences go back. Else IsNext: B is the chunk's rest.
5. ``truncate_seq_pair`` drops one token at a time from the longer segment (B on a tie), front or back at random.
6. ``[CLS] A [SEP] B [SEP]``, segment ids 0 for ``[CLS] A [SEP]`` and 1 for ``B [SEP]``.
7. ``min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))`` positions, never ``[CLS]``/``[SEP]``,
   become ``[MASK]`` (80%), a random token (10%) or stay (10%); whole-word masking takes a word's ``##`` pieces.

Without NSP (Table 5's "mlm" and "ltr" objectives) each chunk is one segment, ``[CLS] text [SEP]`` of up to
``max_seq_length - 2`` tokens, chunked as above so the ablation removes only NSP. "ltr" stores no masks:
``PreTrainingCollator`` gives it the next token as ``labels``.

The reference's quirks are kept: its random calls in its order; with one document (or ten unlucky draws) the "other"
document is the current one; a one-sentence chunk draws no coin; a ``##`` piece right after ``[SEP]`` joins the
previous word in whole-word masking. ``create_training_instances`` is its whole-corpus loop with one random stream.

Departures:
- One random stream per (seed, document, round), not one over the shuffled corpus, so the bytes are the same for any
  ``num_proc`` (``balanced_map`` evens out the workers, and the order is restored); the final shuffle is
  ``Dataset.shuffle(seed)``. NotNext still draws from the whole corpus in every worker.
- Raw text is split into sentences here (``sentences.py``); empty and binary-looking text is skipped and counted.
- Options, off by default: dynamic masking (RoBERTa), other mask rates (MosaicBERT's ``masked_lm_prob=0.3``; raise
  ``max_predictions_per_seq`` with it) and other 80/10/10 splits.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from datasets import Dataset, Features, List, Value
from datasets.fingerprint import Hasher

from ..model.configuration_bert_repro import DEFAULT_OBJECTIVE, PreTrainingObjective, pretraining_objective
from .balanced_map import _balanced_order, _flatten
from .example_statistics import pretraining_statistics
from .masking import WordPieceVocab, _check_masking, mask_batch, masking_settings
from .pretraining_config import PreTrainingDataConfig
from .tokenized_documents import tokenize_documents
from .training_instances import IS_NEXT, NOT_NEXT, TrainingInstance, create_instances_from_document, document_rng

__all__ = [
    "IGNORE_INDEX",
    "ArrowCorpus",
    "PreTrainingCollator",
    "create_pretraining_dataset",
    "create_pretraining_instances",
    "instance_features",
    # re-exported: training/pretraining/ and benchmarks/ import the pre-training data from this module
    "PreTrainingDataConfig",
    "WordPieceVocab",
    "pretraining_statistics",
    "tokenize_documents",
]

logger = logging.getLogger(__name__)

#: Label ignored by the MLM loss (PyTorch's cross-entropy ``ignore_index``, the HF convention).
IGNORE_INDEX = -100


def instance_features(static_masking: bool = True, next_sentence: bool = True) -> Features:
    """Columns of ``create_pretraining_instances``; ``_config_features`` gives them for a config."""
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
    """Steps 1-7 over ``tokenize_documents``'s output, the same bytes for any ``num_proc``.

    ``vocab`` must hold ids (``WordPieceVocab.from_tokenizer``); ``shuffle`` shuffles with ``config.random_seed``, as
    the reference shuffles its instances.
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
        # Each instance carries its document's row: a stable sort on it restores the one-process order.
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
    subwords = hashlib.sha256("\n".join(sorted(map(str, vocab.subword_tokens))).encode()).hexdigest()
    return json.dumps(
        [str(vocab.cls_token), str(vocab.sep_token), str(vocab.mask_token), len(vocab.vocab_words), subwords]
    )


def _instances_batch(
    batch_sentences: list[list[list[int]]],
    indices: list[int],
    corpus: ArrowCorpus,
    vocab: WordPieceVocab,
    config: PreTrainingDataConfig,
    rows: np.ndarray | None = None,
) -> dict[str, list[Any]]:
    """``rows``: the documents' rows when the map runs over a reordered selection (``indices`` index it); each
    instance then gets its ``document`` row."""
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
    out["input_ids"].append(instance.tokens)
    out["token_type_ids"].append(instance.segment_ids)
    if "next_sentence_label" in out:
        out["next_sentence_label"].append(NOT_NEXT if instance.is_random_next else IS_NEXT)
    if "masked_lm_positions" in out:
        out["masked_lm_positions"].append(instance.masked_lm_positions)
        out["masked_lm_ids"].append(instance.masked_lm_labels)


class ArrowCorpus(Sequence):
    """The non-empty documents of a ``tokenize_documents`` dataset (the reference drops empty ones), read lazily.

    Sentences become lists one at a time, so a NotNext draw from a book-sized document reads only what it uses.
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
    """Raw documents (one a row, in ``text_column``) -> pre-training instances, the same bytes for any ``num_proc``."""
    config = PreTrainingDataConfig() if config is None else config
    documents = tokenize_documents(
        dataset, tokenizer, text_column=text_column, split_lines=split_lines, num_proc=num_proc
    )
    return create_pretraining_instances(
        documents, WordPieceVocab.from_tokenizer(tokenizer), config, num_proc=num_proc, shuffle=shuffle
    )


@dataclass
class PreTrainingCollator:
    """Pads pre-training instances into ``BertForPreTraining``'s inputs, all ``torch.long``.

    ``labels`` hold the original token where masked, -100 elsewhere; ``next_sentence_label`` (0 = IsNext, the HF
    convention) comes when the rows have it. ``masked_positions`` (examples, max_predictions_per_seq) is Google's
    ``masked_lm_positions`` made batch-wide: indices into the flattened labels, unused slots naming the example's last
    token, so the sparse MLM head's shapes depend on the batch size only (one compiled graph).

    ``dynamic_masking`` (RoBERTa; data built with ``static_masking=False``) draws fresh masks per call from torch's
    generator, which ``DataLoader`` seeds per worker and epoch. "ltr" is not masked: its ``labels`` are the next token,
    shifted here, so the model reads them as MLM labels.
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
            self.masked_lm_prob, self.max_predictions_per_seq, self.mask_replace_prob, self.random_replace_prob
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
            **masking_settings(config),
            **kwargs,
        )

    def _masked(self, features: list[Mapping[str, Any]]) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
        """Each row's token ids after masking and its (masked positions, original ids)."""
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
        """(examples, slots): each example's label positions, sorted, then its last position without a label, offset
        by ``starts`` (the example's start in the flattened batch); slots: max_predictions_per_seq or more."""
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
        self, features: list[Mapping[str, Any]], input_ids: list[list[int]]
    ) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
        if "masked_lm_positions" in features[0]:
            raise ValueError(
                "these rows already carry static masks (their input_ids hold [MASK]s): build the data with "
                "static_masking=False for dynamic masking"
            )
        rng = random.Random(int(torch.randint(0, 2**62, (1,)).item()))
        return mask_batch(input_ids, self.vocab, rng, **masking_settings(self))


def _pad(rows: list[list[int]], width: int, value: int) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out
