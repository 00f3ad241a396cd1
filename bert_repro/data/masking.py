"""Masked-LM predictions, step 7 of ``pretraining_examples``' docstring: google-research/bert's random calls in its
order, for the static masks stored in the data and the dynamic ones ``mask_batch`` draws per batch alike."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["WordPieceVocab", "create_masked_lm_predictions", "mask_batch", "masking_settings"]


@dataclass(frozen=True)
class WordPieceVocab:
    """The vocabulary as pair building and masking read it, for tokens as strings or as ids.

    A random replacement is any entry of ``vocab_words`` (in id order), special ones included, as in the reference.
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


def masking_settings(source: Any) -> dict[str, Any]:
    """``source``'s masking settings (a ``PreTrainingDataConfig``'s or a ``PreTrainingCollator``'s), as keywords."""
    names = "masked_lm_prob max_predictions_per_seq do_whole_word_mask mask_replace_prob random_replace_prob".split()
    return {name: getattr(source, name) for name in names}


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

    As in the reference, shuffled candidate groups are taken in turn, skipping a word that would overshoot the budget.
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
    """As the reference groups them: a ``##`` piece joins the group before it, even across a ``[SEP]``."""
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
    if rng.random() < mask_replace_prob:
        return vocab.mask_token
    if rng.random() < keep_share:
        return token
    return vocab.vocab_words[rng.randint(0, len(vocab.vocab_words) - 1)]


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
    """Dynamic masking: the masked rows and each row's ``(masked_lm_positions, masked_lm_ids)``.

    Right-padded rows need their ``attention_mask``: only the real tokens are masked and returned.
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
