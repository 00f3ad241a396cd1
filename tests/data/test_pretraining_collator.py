"""``PreTrainingCollator`` on rows written by hand; the statistical tests of its masks are in test_pretraining_data."""

import random

import pytest
import torch
from support.corpora import pseudo_text, wordpiece_tokenizer

from bert_repro.data.masking import mask_batch
from bert_repro.data.pretraining_config import PreTrainingDataConfig
from bert_repro.data.pretraining_examples import IGNORE_INDEX, PreTrainingCollator

SETTINGS = {  # none of them the default
    "masked_lm_prob": 0.3,
    "max_predictions_per_seq": 7,
    "mask_replace_prob": 0.5,
    "random_replace_prob": 0.3,
    "do_whole_word_mask": True,
}


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece_tokenizer(pseudo_text(10), vocab_size=150)


def pair_rows(tokenizer, lengths=(30, 9, 17)):
    """[CLS] A [SEP] B [SEP] rows of ordinary tokens (ids from 10 up), with their segment ids."""
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    rows = []
    for n in lengths:
        a, b = list(range(10, 10 + n // 2)), list(range(60, 60 + n - n // 2))
        ids = [cls, *a, sep, *b, sep]
        rows.append({"input_ids": ids, "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1)})
    return rows


def test_from_config_passes_every_setting_on(tokenizer):
    config = PreTrainingDataConfig(objective="mlm", static_masking=False, **SETTINGS)
    collator = PreTrainingCollator.from_config(tokenizer, config, pad_to_multiple_of=8)
    assert (collator.objective, collator.dynamic_masking, collator.pad_to_multiple_of) == ("mlm", True, 8)
    assert {name: getattr(collator, name) for name in SETTINGS} == SETTINGS
    assert not PreTrainingCollator.from_config(tokenizer, PreTrainingDataConfig()).dynamic_masking
    ltr = PreTrainingCollator.from_config(tokenizer, PreTrainingDataConfig(objective="ltr", static_masking=False))
    assert ltr.objective == "ltr" and not ltr.dynamic_masking  # nothing to mask


@pytest.mark.parametrize("batch", [1, 3])
def test_dynamic_masks_are_the_reference_rules_drawn_from_torchs_seed(tokenizer, batch):
    rows = pair_rows(tokenizer)[:batch]
    collator = PreTrainingCollator(tokenizer, dynamic_masking=True, **SETTINGS)
    torch.manual_seed(7)
    out = collator(rows)
    torch.manual_seed(7)
    rng = random.Random(int(torch.randint(0, 2**62, (1,)).item()))
    masked, targets = mask_batch([r["input_ids"] for r in rows], collator.vocab, rng, **SETTINGS)
    for i, (ids, (positions, labels)) in enumerate(zip(masked, targets, strict=True)):
        assert out["input_ids"][i, : len(ids)].tolist() == ids
        expected = torch.full((out["labels"].shape[1],), IGNORE_INDEX)
        expected[positions] = torch.tensor(labels)
        assert out["labels"][i].tolist() == expected.tolist()
    # rows of 33, 12 and 20 tokens: min(7, round(0.3 * n)), the cap binding on the first
    assert [len(p) for p, _ in targets] == [7, 4, 6][:batch]
    torch.manual_seed(8)
    assert not torch.equal(collator(rows)["labels"], out["labels"])


def test_ltr_labels_are_the_next_token_at_every_real_position_but_the_last(tokenizer):
    rows = pair_rows(tokenizer, lengths=(6, 2)) + [{"input_ids": [5], "token_type_ids": [0]}]
    for row in rows:
        row["token_type_ids"] = [0] * len(row["input_ids"])
    out = PreTrainingCollator(tokenizer, objective="ltr")(rows)
    for i, row in enumerate(rows):
        ids, width = row["input_ids"], out["labels"].shape[1]
        assert out["labels"][i].tolist() == ids[1:] + [IGNORE_INDEX] * (width - len(ids) + 1)
        assert out["input_ids"][i, : len(ids)].tolist() == ids  # unmasked
    assert "next_sentence_label" not in out


def test_static_masks_and_the_padding_of_every_column(tokenizer):
    rows = pair_rows(tokenizer, lengths=(6, 3))
    rows[0].update(masked_lm_positions=[2, 5], masked_lm_ids=[11, 61], next_sentence_label=1)
    rows[1].update(masked_lm_positions=[], masked_lm_ids=[], next_sentence_label=0)  # nothing to predict
    out = PreTrainingCollator(tokenizer, pad_to_multiple_of=4)(rows)
    pad = tokenizer.pad_token_id
    assert out["input_ids"].shape == (2, 12)  # 9 tokens, padded to a multiple of 4
    assert out["input_ids"][1].tolist() == rows[1]["input_ids"] + [pad] * 6
    assert out["token_type_ids"].tolist() == [
        row["token_type_ids"] + [0] * (12 - len(row["token_type_ids"])) for row in rows
    ]
    assert out["attention_mask"].tolist() == [[1] * 9 + [0] * 3, [1] * 6 + [0] * 6]
    assert out["labels"].tolist() == [
        [IGNORE_INDEX] * 2 + [11] + [IGNORE_INDEX] * 2 + [61] + [IGNORE_INDEX] * 6,
        [IGNORE_INDEX] * 12,
    ]
    assert out["next_sentence_label"].tolist() == [1, 0]
    # each row's label positions in the flattened batch (row 1 starts at 12), then its last position without a
    # label, up to max_predictions_per_seq (20) slots
    assert out["masked_positions"].tolist() == [[2, 5] + [8] * 18, [12 + 5] * 20]
    assert all(v.dtype == torch.long for v in out.values())
    one = PreTrainingCollator(tokenizer)(rows[:1])  # a batch of one row
    assert one["labels"][0].tolist() == out["labels"][0, :9].tolist() and one["next_sentence_label"].tolist() == [1]
    without_ids = [{key: value for key, value in rows[0].items() if key != "masked_lm_ids"}]
    with pytest.raises(ValueError, match="masked_lm_positions and masked_lm_ids"):
        PreTrainingCollator(tokenizer)(without_ids)
