"""Tests of sequence packing for pre-training with MLM and NSP (bert_repro.data.packing and the model's packed path).

Data side: the packing invariants (hypothesis), the packed collator against the unpacked one (the same tokens,
segments, masks and NSP labels, static and dynamic masking), the padding statistics on a hand-checked case.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math  # noqa: E402

import datasets  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_pretraining_data import pseudo_text, wordpiece_tokenizer  # noqa: E402

from bert_repro.data.packing import PackingCollator, first_fit_decreasing, pack_rows, padding_statistics  # noqa: E402
from bert_repro.data.pretraining_examples import (  # noqa: E402
    IGNORE_INDEX,
    PreTrainingCollator,
    PreTrainingDataConfig,
    create_pretraining_dataset,
)

MAX_LEN = 128


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece_tokenizer(pseudo_text(30), vocab_size=150)


def build_rows(tokenizer, **config_fields):
    """Pre-training examples of the pseudo corpus, as the recipe builds them (short_seq_prob raised for variety)."""
    config = PreTrainingDataConfig(
        **{"max_seq_length": MAX_LEN, "max_predictions_per_seq": 20, "dupe_factor": 2, "short_seq_prob": 0.5,
           **config_fields}
    )
    ds = create_pretraining_dataset(datasets.Dataset.from_dict({"text": pseudo_text(30)}), tokenizer, config)
    return config, ds.to_list()


def examples_of(batch: dict[str, torch.Tensor]) -> list[dict[str, list[int]]]:
    """The examples of a packed batch, in row-major order, cut where position_ids restart at a real token."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        real = batch["attention_mask"][r].bool()
        starts = ((batch["position_ids"][r] == 0) & real).nonzero().flatten().tolist()
        ends = starts[1:] + [int(real.sum())]
        for s, e in zip(starts, ends, strict=True):
            out.append({k: batch[k][r, s:e].tolist() for k in ("input_ids", "token_type_ids", "labels",
                                                                "position_ids")})
    return out


def examples_of_unpacked(batch: dict[str, torch.Tensor]) -> list[dict[str, list[int]]]:
    out = []
    for r in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][r].sum())
        out.append({k: batch[k][r, :n].tolist() for k in ("input_ids", "token_type_ids", "labels")})
    return out


# --------------------------------------------------------------------------------------------------
# Packing invariants
# --------------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(5, 64).flatmap(lambda m: st.tuples(st.just(m), st.lists(st.integers(1, m), max_size=70))))
def test_packing_invariants(case):
    max_len, lengths = case
    for rows, width in ((first_fit_decreasing(lengths, max_len), max_len), pack_rows(lengths, max_len, step=3)):
        placed = [i for row in rows for i in row]
        assert sorted(placed) == list(range(len(lengths)))  # every example placed exactly once
        assert all(row == sorted(row) for row in rows)  # input order kept within a row
        assert [row[0] for row in rows] == sorted(row[0] for row in rows)  # rows in order of their first example
        assert all(sum(lengths[i] for i in row) <= width <= max_len for row in rows)  # no row over the width
        if lengths:
            assert len(rows) >= math.ceil(sum(lengths) / width)
            assert width >= max(lengths)
    # First-fit decreasing never leaves two rows that could be merged.
    ffd = first_fit_decreasing(lengths, max_len)
    loads = sorted(sum(lengths[i] for i in row) for row in ffd)
    assert len(loads) < 2 or loads[0] + loads[1] > max_len


def test_pack_rows_narrows_rows():
    # 8 examples of 100 tokens: 2 rows of 512 leave 224 positions empty; 2 rows of 400 leave none.
    rows, width = pack_rows([100] * 8, 512)
    assert width == 400 and len(rows) == 2
    with pytest.raises(ValueError, match="more than max_seq_length 128"):
        first_fit_decreasing([12, 129], 128)


def test_padding_statistics_hand_checked():
    # One batch of lengths 8, 4, 4, 2 into rows of 8: unpadded width 8 (32 positions, 18 real); packed: rows
    # [8], [4, 4], [2] would be width 8 (24 positions) -- narrower rows of 6 fail, so 24.
    stats = padding_statistics([8, 4, 4, 2], batch_size=4, max_seq_length=8, max_batches=None)
    assert stats["batches"] == 1
    assert stats["padding_share_unpacked"] == pytest.approx(1 - 18 / 32)
    assert stats["padding_share_packed"] == pytest.approx(1 - 18 / 24)
    assert stats["rows_per_batch"] == 3


# --------------------------------------------------------------------------------------------------
# The packed collator against the unpacked one
# --------------------------------------------------------------------------------------------------


def test_packed_batch_holds_the_unpacked_examples(tokenizer):
    config, rows = build_rows(tokenizer)
    rows = rows[:40]
    assert len({len(r["input_ids"]) for r in rows}) > 5, "the test needs examples of several lengths"
    packed = PackingCollator.from_config(tokenizer, config)(rows)
    unpacked = PreTrainingCollator.from_config(tokenizer, config)(rows)
    assert packed["input_ids"].shape[0] < len(rows)  # several examples share a row
    assert packed["input_ids"].shape[1] <= MAX_LEN
    assert all(v.dtype == torch.long for v in packed.values())
    got = examples_of(packed)
    assert len(got) == len(rows) == packed["next_sentence_label"].numel()
    # Pair each packed example with its unpacked original: the collator's order is row-major over the packing.
    order = [i for row in pack_rows([len(r["input_ids"]) for r in rows], MAX_LEN)[0] for i in row]
    want = examples_of_unpacked(unpacked)
    for g, i in zip(got, order, strict=True):
        assert g["position_ids"] == list(range(len(g["input_ids"])))  # positions restart at each [CLS]
        assert g["input_ids"][0] == tokenizer.cls_token_id
        assert {k: g[k] for k in want[i]} == want[i]
    assert packed["next_sentence_label"].tolist() == [rows[i]["next_sentence_label"] for i in order]
    assert int((packed["labels"] != IGNORE_INDEX).sum()) == int((unpacked["labels"] != IGNORE_INDEX).sum())
    # Padding: attention 0, pad id, label -100, segment 0, position 0.
    pad = packed["attention_mask"] == 0
    assert (packed["input_ids"][pad] == tokenizer.pad_token_id).all()
    assert (packed["labels"][pad] == IGNORE_INDEX).all()
    assert (packed["position_ids"][pad] == 0).all() and (packed["token_type_ids"][pad] == 0).all()
    assert int(packed["attention_mask"].sum()) == sum(len(r["input_ids"]) for r in rows)


def test_dynamic_masking_packed_as_unpacked(tokenizer):
    config, rows = build_rows(tokenizer, static_masking=False, masked_lm_prob=0.3, max_predictions_per_seq=14)
    rows = rows[:32]
    packing = PackingCollator.from_config(tokenizer, config)
    assert packing.dynamic_masking
    torch.manual_seed(7)
    packed = packing(rows)
    torch.manual_seed(7)
    unpacked = PreTrainingCollator.from_config(tokenizer, config)(rows)
    order = [i for row in pack_rows([len(r["input_ids"]) for r in rows], MAX_LEN)[0] for i in row]
    want = examples_of_unpacked(unpacked)
    got = examples_of(packed)
    for g, i in zip(got, order, strict=True):
        assert {k: g[k] for k in want[i]} == want[i]
    assert any(g["labels"].count(IGNORE_INDEX) < len(g["labels"]) for g in got)
    torch.manual_seed(8)
    assert not torch.equal(packing(rows)["labels"], packed["labels"])  # fresh masks for every batch
