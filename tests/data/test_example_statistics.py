"""``pretraining_statistics`` on hand-written examples, every figure exact (test_pretraining_data.py bounds them)."""

import datasets
import pytest

from bert_repro.data.example_statistics import pretraining_statistics
from bert_repro.data.pretraining_examples import instance_features
from bert_repro.data.tokenized_documents import DOCUMENT_FEATURES

MASK = 4

# Four examples; at the masked positions the model is shown [MASK], a random token or the original one.
COLUMNS = ("input_ids", "next_sentence_label", "masked_lm_positions", "masked_lm_ids")
ROWS = [
    dict(zip(COLUMNS, row))
    for row in [
        ([2, MASK, 11, 3, 12, 3], 0, [1, 4], [10, 12]),  # 6 tokens, IsNext; [MASK] (was 10), unchanged (12)
        ([2, 7, 99, 3, 8, 9, 5, 6, 3], 1, [2], [20]),  # 9 tokens, NotNext; a random token (99, was 20)
        ([2, 30, 3], 0, [], []),  # 3 tokens, IsNext, nothing masked
        # 17 tokens, NotNext; [MASK] twice, random
        ([2, MASK, MASK, 77, *range(40, 52), 3], 1, [1, 2, 3], [41, 42, 43]),
    ]
]
TOKENS = 6 + 9 + 3 + 17


def examples(rows=ROWS, static=True, pairs=True):
    columns = {name: [r[name] for r in rows] for name in COLUMNS}
    columns["token_type_ids"] = [[0] * len(r["input_ids"]) for r in rows]
    features = instance_features(static_masking=static, next_sentence=pairs)
    return datasets.Dataset.from_dict({name: columns[name] for name in features}, features=features)


def documents(long_sentences=True):
    columns = {
        "sentences": [[[5, 6, 7]], [], [[8, 9, 10]], [], [[11], [12], [13, 14]]],
        "num_sentences": [1, 0, 1, 0, 3],
        "num_tokens": [3, 0, 3, 0, 4],
        "skip_reason": ["", "empty", "", "binary", ""],
        "long_sentences": [0, 0, 2, 0, 1],
    }
    features = DOCUMENT_FEATURES.copy()
    if not long_sentences:
        del columns["long_sentences"], features["long_sentences"]
    return datasets.Dataset.from_dict(columns, features=features)


@pytest.mark.parametrize("batch_size", [None, 1, 3])
def test_every_figure_counted_by_hand(batch_size):
    kwargs = {} if batch_size is None else {"batch_size": batch_size}  # 3: a batch boundary inside the rows
    stats = pretraining_statistics(examples(), documents(), mask_token_id=MASK, **kwargs)
    assert stats == {
        "documents": 3,
        "documents_skipped": {"empty": 1, "binary": 1},
        "one_sentence_documents": 2,
        "sentences": 5,
        "document_tokens": 10,
        "long_sentences_cut": 3,
        "examples": 4,
        "tokens": TOKENS,
        "is_next_share": 0.5,
        # 16 bins over lengths 0..17: width 2
        "length_histogram": {"2-3": 1, "6-7": 1, "8-9": 1, "16-17": 1},
        "masked": 6,
        "masked_share": 6 / TOKENS,
        "masked_split": {"mask": 3 / 6, "random": 2 / 6, "unchanged": 1 / 6},
    }


def test_histogram_bins_and_what_each_option_leaves_out():
    # 4 bins over lengths 0..17: width ceil(18 / 4) = 5; an empty bin is left out
    stats = pretraining_statistics(examples(), num_bins=4)
    assert stats["length_histogram"] == {"0-4": 1, "5-9": 2, "15-19": 1}
    assert "masked_split" not in stats and "documents" not in stats  # no mask id, no documents
    assert pretraining_statistics(examples(ROWS[2:3]), num_bins=4)["length_histogram"] == {"3-3": 1}
    assert pretraining_statistics(examples(ROWS[3:]), num_bins=17)["length_histogram"] == {"16-17": 1}
    assert pretraining_statistics(examples(ROWS[3:]), num_bins=18)["length_histogram"] == {"17-17": 1}
    without_masks = pretraining_statistics(examples(static=False, pairs=False), mask_token_id=MASK)
    assert without_masks == {
        "examples": 4,
        "tokens": TOKENS,
        "length_histogram": pretraining_statistics(examples())["length_histogram"],
    }
    assert pretraining_statistics(examples(), documents(long_sentences=False))["long_sentences_cut"] == 0
    no_binary = pretraining_statistics(examples(), documents().select([0, 1, 2]))
    assert no_binary["documents_skipped"] == {"empty": 1, "binary": 0}


def test_an_input_in_several_arrow_chunks_counts_every_row():
    chunked = datasets.concatenate_datasets([examples(ROWS[:1]), examples(ROWS[1:3]), examples(ROWS[3:])])
    assert chunked.data.column("input_ids").num_chunks == 3
    for batch_size in (2, 65_536):
        assert pretraining_statistics(chunked, mask_token_id=MASK, batch_size=batch_size) == pretraining_statistics(
            examples(), mask_token_id=MASK
        )


def test_the_default_bins_and_the_shortest_examples():
    # lengths 0..16 in the default 16 bins: width ceil(17 / 16) = 2
    sixteen = {**ROWS[3], "input_ids": ROWS[3]["input_ids"][:16]}
    assert pretraining_statistics(examples([sixteen]))["length_histogram"] == {"16-17": 1}
    one_token = {"input_ids": [MASK], "next_sentence_label": 0, "masked_lm_positions": [0], "masked_lm_ids": [9]}
    stats = pretraining_statistics(examples([one_token]), mask_token_id=MASK)
    assert stats["masked_share"] == 1.0 and stats["masked_split"] == {"mask": 1.0, "random": 0.0, "unchanged": 0.0}


def test_no_examples_and_no_masked_positions():
    none = pretraining_statistics(examples(rows=[]), mask_token_id=MASK)
    expected = {"examples": 0, "tokens": 0, "is_next_share": None, "length_histogram": {}, "masked": 0}
    assert none == {**expected, "masked_share": 0.0}
    unmasked = pretraining_statistics(examples(rows=ROWS[2:3]), mask_token_id=MASK)
    assert unmasked["masked"] == 0 and "masked_split" not in unmasked
    assert unmasked["is_next_share"] == 1.0 and unmasked["masked_share"] == 0.0
