"""Task metrics on hand-checked cases, with scikit-learn 1.9.1, scipy 1.17.1 and seqeval 1.2.2 values pasted in.

test_metrics_reference.py compares with those libraries themselves (the `test` extra) on random inputs.
"""

import logging
import math

import numpy as np
import pytest

from bert_repro.tasks import metrics
from bert_repro.tasks.metrics import (
    accuracy,
    compute,
    compute_f1,
    conll_f1,
    f1,
    get_chunks,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    spearman,
    squad_v1,
    squad_v2,
)

# GLUE classification

# TP = 3, FN = 1, FP = 2, TN = 4 (references first, then predictions).
REFS_2X2 = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
PREDS_2X2 = [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]


def test_two_by_two_confusion_matrix():
    # accuracy = (TP + TN) / n = 7 / 10
    assert accuracy(PREDS_2X2, REFS_2X2) == pytest.approx(0.7)
    # F1 = 2 TP / (2 TP + FP + FN) = 6 / 9
    assert f1(PREDS_2X2, REFS_2X2) == pytest.approx(2 / 3)
    # MCC = (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))
    #     = (12 - 2) / sqrt(5 * 4 * 6 * 5) = 10 / sqrt(600)
    assert matthews_corrcoef(PREDS_2X2, REFS_2X2) == pytest.approx(10 / math.sqrt(600))
    # sklearn: matthews_corrcoef(y_true, y_pred) = 0.408248290463863, f1_score = 0.6666666666666666
    assert matthews_corrcoef(PREDS_2X2, REFS_2X2) == pytest.approx(0.408248290463863, abs=1e-15)
    assert f1(PREDS_2X2, REFS_2X2) == pytest.approx(0.6666666666666666, abs=1e-15)


def test_f1_of_the_chosen_positive_class():
    # With 0 as the positive class the roles swap: TP = 4, FP = 1, FN = 2 -> 8 / (8 + 1 + 2).
    assert f1(PREDS_2X2, REFS_2X2, positive_label=0) == pytest.approx(8 / 11)
    assert f1(["no", "yes", "yes"], ["yes", "yes", "no"], positive_label="yes") == pytest.approx(0.5)


def test_f1_degenerate_cases_follow_sklearn():
    # No predicted positive but true ones: 2*0 / (0 + 0 + 2) = 0, no warning (as sklearn).
    assert f1([0, 0, 0], [1, 1, 0]) == 0.0
    # No true and no predicted positive: undefined; sklearn's zero_division default gives 0.0 and warns.
    with pytest.warns(RuntimeWarning):
        assert f1([0, 0, 0], [0, 0, 0]) == 0.0
    # sklearn raises for more than two labels with average="binary", and for a positive label not present.
    with pytest.raises(ValueError):
        f1([0, 1, 2], [0, 1, 1])
    with pytest.raises(ValueError):
        f1([0, 2], [0, 2])


def test_matthews_multiclass_and_degenerate():
    refs = [0, 1, 2, 0, 1, 2, 0, 1, 2, 2]
    preds = [0, 2, 1, 0, 0, 2, 1, 1, 2, 2]
    # sklearn.metrics.matthews_corrcoef(refs, preds) = 0.3939393939393939
    assert matthews_corrcoef(preds, refs) == pytest.approx(0.3939393939393939, abs=1e-15)
    # By hand: t = (3, 3, 4), p = (3, 3, 4), c = 6, s = 10: (60 - 34) / (100 - 34) = 26 / 66.
    assert matthews_corrcoef(preds, refs) == pytest.approx(26 / 66)
    assert matthews_corrcoef([1, 1, 0, 0], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(-1.0)
    # A constant prediction or reference makes MCC undefined: 0.0, as sklearn.
    assert matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0
    assert matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0


def test_inputs_as_arrays_and_bad_inputs():
    assert accuracy(np.array([1, 2, 3]), [1, 2, 4]) == pytest.approx(2 / 3)
    assert accuracy(["entailment", "neutral"], ["entailment", "contradiction"]) == 0.5
    with pytest.raises(ValueError):
        accuracy([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        accuracy([], [])
    # The message names the side at fault.
    with pytest.raises(ValueError, match=r"^predictions must be one-dimensional, got shape \(2, 2\)"):
        accuracy([[1, 2], [3, 4]], [1, 2])
    with pytest.raises(ValueError, match=r"^references must be one-dimensional, got shape \(2, 2\)"):
        accuracy([1, 2], [[1, 2], [3, 4]])


# STS-B correlations


def test_pearson_of_known_relations():
    x = [0.0, 1.0, 2.5, 4.0, 5.0]
    assert pearson([2 * v + 1 for v in x], x) == pytest.approx(1.0)
    assert pearson([-3 * v for v in x], x) == pytest.approx(-1.0)
    # Centred: (-1.5, -.5, .5, 1.5) and (-1.5, .5, -.5, 1.5): dot 4, squared norms 5 and 5 -> 0.8.
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # A regression head's (n, 1) output is accepted.
    assert pearson(np.array([[1.0], [2.0], [3.0], [4.0]]), [1, 3, 2, 4]) == pytest.approx(0.8)


def test_spearman_with_ties():
    # Ranks of (1, 2, 2, 3) are (1, 2.5, 2.5, 4); of (1, 3, 2, 4) are (1, 3, 2, 4). Centred: (-1.5, 0, 0, 1.5)
    # and (-1.5, .5, -.5, 1.5): dot 4.5, squared norms 4.5 and 5 -> 4.5 / sqrt(22.5).
    # scipy.stats.spearmanr: 0.9486832980505139
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486832980505139, abs=1e-15)
    # Monotone but not linear: Spearman 1, Pearson below 1.
    assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [1, 4, 9, 100]) < 0.9


def test_correlations_match_scipy():
    a = [0.3, 1.7, 2.2, 2.2, 4.9, 3.1, 0.0, 5.0]
    b = [1.0, 1.5, 2.5, 2.0, 4.0, 4.0, 0.5, 3.5]
    # scipy.stats.pearsonr(a, b)[0] and scipy.stats.spearmanr(a, b)[0]
    assert pearson(a, b) == pytest.approx(0.9156914486215001, abs=1e-14)
    assert spearman(a, b) == pytest.approx(0.9156626506024095, abs=1e-14)


def test_correlations_undefined_are_nan_like_scipy():
    with pytest.warns(RuntimeWarning):
        assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    with pytest.warns(RuntimeWarning):
        assert math.isnan(spearman([1, 2, 3], [2, 2, 2]))
    assert math.isnan(pearson([1, float("nan"), 3], [1, 2, 3]))


def test_correlation_edges_the_random_cases_miss():
    import warnings

    nan = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NaN input is NaN at once: not ranked, not checked for being constant
        assert math.isnan(pearson([1.0, nan, 3.0], [2, 2, 2]))
        assert math.isnan(pearson([2, 2, 2], [1.0, nan, 3.0]))
        assert math.isnan(spearman([1.0, nan, 3.0], [1, 2, 3]))
        assert math.isnan(spearman([1, 2, 3], [1.0, nan, 3.0]))
    # Rounding takes the raw r of these to 1 + 2e-16 and -1 - 2e-16: clamped to [-1, 1], as scipy does.
    x = [1.3, 0.95, -0.7]
    assert pearson(x, x) == 1.0 and pearson(x, [-v for v in x]) == -1.0
    # Deviations whose squares overflow float64: each input is scaled by its largest deviation first.
    assert pearson([1.0, 2.0, 4.0], [1e200, 2e200, 4e200]) == pytest.approx(1.0, abs=1e-15)
    assert pearson([1e200, 2e200, 4e200], [1.0, 2.0, 4.0]) == pytest.approx(1.0, abs=1e-15)
    # float32 scores (a model's logits) are correlated in float64, not in float32 (5e-9 off here).
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50).astype(np.float32), rng.normal(size=50).astype(np.float32)
    assert pearson(a, b) == pearson(a.astype(np.float64), b.astype(np.float64))


def test_compute_dispatches_by_name():
    result = compute(["accuracy", "f1", "matthews_correlation"], PREDS_2X2, REFS_2X2)
    assert result == pytest.approx({"accuracy": 0.7, "f1": 2 / 3, "matthews_correlation": 10 / math.sqrt(600)})
    correlations = compute(["pearson", "spearman"], [1, 2, 3, 4], [1, 3, 2, 4])
    assert correlations == pytest.approx({"pearson": 0.8, "spearman": 0.8})
    assert compute("accuracy", [1], [1]) == {"accuracy": 1.0}
    with pytest.raises(ValueError, match="unknown metric"):
        compute(["bleu"], [1], [1])


# SQuAD normalisation


def test_normalize_answer_official_edge_cases():
    assert normalize_answer("The  Cat!") == "cat"
    # Articles only as whole words: "theatre", "another", "banana" keep their letters.
    assert normalize_answer("the theatre") == "theatre"
    assert normalize_answer("another banana") == "another banana"
    # Punctuation goes before articles are removed: "the-cat" -> "thecat" keeps its "the".
    assert normalize_answer("the-cat") == "thecat"
    assert normalize_answer("?!...") == ""
    # string.punctuation is ASCII only: guillemets, curly quotes and dashes stay.
    assert normalize_answer("«Cat»") == "«cat»"
    assert normalize_answer("“cat” — dog") == "“cat” — dog"
    assert normalize_answer("Café.") == "café"


def test_squad_v1_single_answers():
    def one(prediction, gold):
        return squad_v1({"q": prediction}, {"q": [gold]})

    assert one("The  Cat!", "cat") == {"exact_match": 100.0, "f1": 100.0}
    # Article inside a word is not removed, so "theatre" never matches "atre".
    assert one("theatre", "atre") == {"exact_match": 0.0, "f1": 0.0}
    # Punctuation-only answers both normalise to "": equal strings (EM 100) but no shared token (v1.1 F1 0).
    assert one("!!!", "?") == {"exact_match": 100.0, "f1": 0.0}
    # Unicode punctuation is kept, so "«cat»" and "cat" are different tokens.
    assert one("«cat»", "cat") == {"exact_match": 0.0, "f1": 0.0}
    # "the big cat" -> [big, cat] vs [big, red, cat]: 2 shared, P = 1, R = 2/3, F1 = 0.8.
    assert one("the big cat", "a big red cat") == pytest.approx({"exact_match": 0.0, "f1": 80.0})
    # Repeated tokens count with multiplicity: [cat, cat] vs [cat]: 1 shared, P = 1/2, R = 1, F1 = 2/3.
    assert one("cat cat", "cat")["f1"] == pytest.approx(200 / 3)


def test_squad_v1_max_over_gold_answers_and_missing(caplog):
    references = {
        # EM from the second gold answer.
        "q1": ["dog", "A big cat."],
        # F1 max: vs "cat" 2/3 (P 1/2, R 1); vs "big cat sat" 0.8 (P 1, R 2/3).
        "q2": ["cat", "big cat sat"],
        "q3": ["anything"],
    }
    predictions = {"q1": "big cat", "q2": "the big cat", "unknown": "ignored"}
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        result = squad_v1(predictions, references)
    # q3 has no prediction: it scores 0 and stays in the total of 3.
    assert result == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 0.8) / 3})
    assert "1 of 3 questions have no prediction; they score 0" in caplog.text


def test_squad_v1_rejects_a_question_without_gold_answer():
    with pytest.raises(ValueError):
        squad_v1({"q": "x"}, {"q": []})


# SQuAD v2.0

V2_REFERENCES = {"q1": ["Paris"], "q2": ["big red dog", "the big red dog"], "q3": [], "q4": [], "q5": ["blue"]}
V2_PREDICTIONS = {"q1": "Paris", "q2": "red dog", "q3": "London", "q4": "", "q5": "green"}
V2_NA_PROBS = {"q1": 0.1, "q2": 0.3, "q3": 0.6, "q4": 0.2, "q5": 0.9}


def test_v2_compute_f1_empty_rule():
    # Either side without tokens: 1 if both are empty, else 0 (unlike v1.1, where both empty gives 0).
    assert compute_f1("", "") == 1.0
    assert compute_f1("the", "!!") == 1.0
    assert compute_f1("", "London") == 0.0
    assert compute_f1("Paris", "") == 0.0


def test_squad_v2_has_ans_and_no_ans_split():
    result = squad_v2(V2_PREDICTIONS, V2_REFERENCES)
    # Raw scores (EM, F1): q1 (1, 1); q2 (0, 0.8: [red, dog] vs [big, red, dog]); q3 (0, 0: an answer to an
    # unanswerable question); q4 (1, 1: no answer, rightly); q5 (0, 0).
    expected = {
        "exact": 100 * 2 / 5,
        "f1": 100 * 2.8 / 5,
        "total": 5,
        "HasAns_exact": 100 * 1 / 3,
        "HasAns_f1": 100 * 1.8 / 3,
        "HasAns_total": 3,
        "NoAns_exact": 50.0,
        "NoAns_f1": 50.0,
        "NoAns_total": 2,
    }
    assert result == pytest.approx(expected)
    assert set(result) == set(expected)  # no best_* keys without na_probs


def test_squad_v2_best_threshold_beats_the_default():
    result = squad_v2(V2_PREDICTIONS, V2_REFERENCES, na_probs=V2_NA_PROBS)
    # na_prob 1.0 threshold changes nothing: as above.
    assert result["f1"] == pytest.approx(56.0)
    # F1 scan, by increasing na_prob, from 2 (number of unanswerable questions, all answered ""):
    # q1 (.1) +1 -> 3 [best, .1]; q4 (.2) "" on unanswerable +0 -> 3; q2 (.3) +0.8 -> 3.8 [best, .3];
    # q3 (.6) an answer on an unanswerable question -1 -> 2.8; q5 (.9) +0 -> 2.8. best_f1 = 3.8 / 5.
    assert result["best_f1"] == pytest.approx(76.0)
    assert result["best_f1_thresh"] == 0.3
    # EM scan: 2 -> q1 3 [best, .1] -> q4 3 -> q2 3 (not better) -> q3 2 -> q5 2. best_exact = 3 / 5.
    assert result["best_exact"] == pytest.approx(60.0)
    assert result["best_exact_thresh"] == 0.1
    assert result["best_f1"] > result["f1"]
    # Applying the best F1 threshold reproduces best_f1: q3 and q5 (na_prob > .3) become "no answer".
    applied = squad_v2(V2_PREDICTIONS, V2_REFERENCES, na_probs=V2_NA_PROBS, na_prob_thresh=0.3)
    assert applied["f1"] == pytest.approx(76.0)
    assert applied["exact"] == pytest.approx(60.0)
    assert applied["NoAns_exact"] == pytest.approx(100.0)
    assert applied["HasAns_f1"] == pytest.approx(100 * 1.8 / 3)


def test_squad_v2_best_threshold_when_answering_nothing_is_best():
    # Every answer is wrong, so the best is to answer nothing: the scan never improves on its start and the
    # official script reports threshold 0.0.
    references = {"a": ["x"], "b": []}
    predictions = {"a": "y", "b": "z"}
    result = squad_v2(predictions, references, na_probs={"a": 0.4, "b": 0.7})
    assert result["exact"] == 0.0
    assert result["best_exact"] == pytest.approx(50.0)
    assert result["best_exact_thresh"] == 0.0


def test_squad_v2_default_threshold_and_questions_without_prediction():
    # The official default --na-prob-thresh is 1.0: an na_prob of 1.5 (a score, not a probability) turns the answer
    # into "no answer", wrong on an answerable question.
    assert squad_v2({"q1": "Paris"}, {"q1": ["Paris"]}, na_probs={"q1": 1.5})["exact"] == 0.0
    assert squad_v2({"q1": "Paris"}, {"q1": ["Paris"]}, na_probs={"q1": 1.0})["exact"] == 100.0
    # The threshold walk passes over a question without a prediction (the lowest na_prob here) and goes on.
    result = squad_v2({"q2": "b"}, {"q1": ["a"], "q2": ["b"]}, na_probs={"q1": 0.0, "q2": 0.5})
    assert result["best_exact"] == 100.0 and result["best_exact_thresh"] == 0.5


def test_squad_v2_gold_answers_that_normalise_to_nothing():
    # A non-empty answer list makes the question answerable (HasAns), even if every gold answer normalises to
    # "": the gold answers are then [""], and only an empty prediction is right.
    references = {"q1": ["The", "!"], "q2": ["", "Paris"]}
    result = squad_v2({"q1": "", "q2": "paris."}, references)
    assert result["HasAns_total"] == 2 and "NoAns_total" not in result
    assert result["exact"] == 100.0 and result["f1"] == 100.0


def test_squad_v2_missing_predictions_are_left_out(caplog):
    with caplog.at_level(logging.WARNING, logger=metrics.__name__):
        result = squad_v2({"q1": "Paris", "q3": ""}, V2_REFERENCES)
    assert result["total"] == 2 and result["exact"] == 100.0
    assert result["HasAns_total"] == 1 and result["NoAns_total"] == 1
    assert "3 of 5 questions have no prediction; they are left out of the totals" in caplog.text
    with pytest.raises(ValueError, match="na_probs"):
        squad_v2(V2_PREDICTIONS, V2_REFERENCES, na_probs={"q1": 0.5})


# CoNLL-2003 chunk F1


def test_iob1_and_iob2_give_the_same_chunks():
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "O", "B-ORG"]
    # IOB1 uses B- only between two adjacent chunks of one type.
    iob1 = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "O", "I-ORG"]
    expected = [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 5), ("ORG", 7, 7)]
    assert get_chunks(iob2) == expected
    assert get_chunks(iob1) == expected
    # An I- of another type starts a new chunk.
    assert get_chunks(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]
    assert conll_f1([iob1], [iob2])["f1"] == 1.0


def test_conll_boundary_error_is_a_false_positive_and_a_false_negative():
    references = [["B-ORG", "I-ORG", "I-ORG", "O", "B-PER"]]
    predictions = [["B-ORG", "I-ORG", "O", "O", "B-PER"]]
    # True: ORG(0-2), PER(4). Predicted: ORG(0-1) (wrong end: FP and FN), PER(4). P = 1/2, R = 1/2.
    result = conll_f1(predictions, references)
    assert result == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "accuracy": 0.8})


def test_conll_type_error():
    references = [["B-LOC", "O", "B-PER", "I-PER"]]
    predictions = [["B-ORG", "O", "B-PER", "I-PER"]]
    # LOC(0) predicted as ORG(0): both wrong. P = R = 1/2.
    assert conll_f1(predictions, references) == pytest.approx(
        {"precision": 0.5, "recall": 0.5, "f1": 0.5, "accuracy": 0.75}
    )


def test_conll_matches_seqeval_over_several_sentences():
    references = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "I-ORG", "I-ORG"], ["O", "B-MISC", "O", "B-PER"]]
    predictions = [["B-PER", "I-PER", "O", "B-ORG", "O", "B-ORG", "I-ORG", "O"], ["O", "B-MISC", "O", "O"]]
    # True chunks 5, predicted 4, correct 2 (PER, MISC): P = 2/4, R = 2/5, F1 = 2 * .2 / .9;
    # 9 of 12 tags right.
    # seqeval: precision 0.5, recall 0.4, f1 0.4444444444444445, accuracy 0.75
    result = conll_f1(predictions, references)
    assert result == pytest.approx({"precision": 0.5, "recall": 0.4, "f1": 0.4444444444444445, "accuracy": 0.75})
    # Chunks do not run across sentence ends.
    assert conll_f1([["B-PER"], ["I-PER"]], [["B-PER"], ["B-PER"]])["f1"] == 1.0


def test_conll_no_chunks_and_bad_input():
    assert conll_f1([["O", "O"]], [["O", "O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0}
    with pytest.raises(ValueError):
        conll_f1([["O"]], [["O", "O"]])
    with pytest.raises(ValueError):
        conll_f1([["PER"]], [["O"]])
    with pytest.raises(ValueError, match="neither 'O' nor"):
        get_chunks(["X-PER"])  # a dash, a type, but no known prefix


def test_iobes_chunks_as_conlleval_reads_them():
    # E and S close a chunk; I or E after E, S or O opens one; B and S always open one (seqeval.get_entities gives
    # the same lists). Same-type neighbours, so that only these rules, not a change of type, split the chunks.
    assert get_chunks(["S-PER", "S-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert get_chunks(["B-PER", "E-PER", "B-PER", "E-PER"]) == [("PER", 0, 1), ("PER", 2, 3)]
    assert get_chunks(["B-PER", "E-PER", "E-PER"]) == [("PER", 0, 1), ("PER", 2, 2)]
    assert get_chunks(["S-PER", "I-PER", "E-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]
    assert get_chunks(["S-PER", "E-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert get_chunks(["B-PER", "S-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert get_chunks(["I-PER", "S-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    # A type may hold dashes: only the first one ends the prefix.
    assert get_chunks(["B-SUB-TYPE", "I-SUB-TYPE"]) == [("SUB-TYPE", 0, 1)]


def test_percent_is_the_papers_scale_and_own_scale_its_inverse():
    """Cards, reports and studies print our fractions (SQuAD's already percent) as the paper's percent, to its two
    decimals; a missing or non-numeric score is None, never a number."""
    assert metrics.percent("accuracy", 0.123456) == 12.35 and metrics.percent("accuracy", 1) == 100
    assert metrics.percent("matthews_correlation", -0.5) == -50.0
    assert metrics.percent("squad_f1", 88.51234) == 88.51 and metrics.percent("squad_v2_best_f1", 0.5) == 0.5
    for missing in (None, "0.5", True, math.nan, math.inf):
        assert metrics.percent("accuracy", missing) is None and metrics.own_scale("accuracy", missing) is None
    assert metrics.own_scale("accuracy", 12.3456789) == 0.123457 and metrics.own_scale("squad_exact", 81.2) == 81.2
    assert metrics.own_scale("f1", metrics.percent("f1", 0.8456)) == 0.8456
