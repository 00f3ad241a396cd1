"""The task metrics against scikit-learn, scipy, seqeval and the official SQuAD scripts, on random and edge inputs.

The scripts' scoring functions are written out below as in `evaluate-v1.1.py` / `evaluate-v2.0.py`; scikit-learn
and seqeval come with the `test` extra (skipped without them).
"""

import collections
import math
import re
import string
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_repro.tasks.metrics import (
    accuracy,
    conll_f1,
    f1,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    spearman,
    squad_v1,
    squad_v2,
)

sklearn_metrics = pytest.importorskip("sklearn.metrics")
scipy_stats = pytest.importorskip("scipy.stats")

SETTINGS = settings(max_examples=200, deadline=None)


def sk(function, *args, **kwargs):
    """A scikit-learn metric, its warnings silenced (a single label in the inputs: expected here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def close(a, b, tol=1e-9):
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


# Classification: scikit-learn


def label_pairs(labels, min_size=1):
    return st.integers(min_size, 40).flatmap(
        lambda n: st.tuples(
            st.lists(st.sampled_from(labels), min_size=n, max_size=n),
            st.lists(st.sampled_from(labels), min_size=n, max_size=n),
        )
    )


@SETTINGS
@given(label_pairs([0, 1]))
def test_binary_metrics_match_sklearn(pair):
    preds, refs = pair
    assert close(accuracy(preds, refs), sk(sklearn_metrics.accuracy_score, refs, preds))
    assert close(matthews_corrcoef(preds, refs), sk(sklearn_metrics.matthews_corrcoef, refs, preds))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both warn, on purpose, when F1 is undefined (no positive at all)
        ours = f1(preds, refs)
        theirs = sklearn_metrics.f1_score(refs, preds, zero_division="warn")
    assert close(ours, theirs)


@SETTINGS
@given(label_pairs(["a", "b", "c", "d"]))
def test_multiclass_accuracy_and_matthews_match_sklearn(pair):
    preds, refs = pair
    assert close(accuracy(preds, refs), sk(sklearn_metrics.accuracy_score, refs, preds))
    assert close(matthews_corrcoef(preds, refs), sk(sklearn_metrics.matthews_corrcoef, refs, preds))


def test_classification_edge_cases_match_sklearn():
    cases = [
        ([1], [1]),
        ([0], [0]),
        ([0], [1]),
        ([1, 1, 1], [1, 1, 1]),
        ([0, 0, 0], [1, 1, 1]),
        ([1, 0] * 5, [0, 1] * 5),
        ([1] * 9 + [0], [1] * 10),
    ]
    for preds, refs in cases:
        assert close(matthews_corrcoef(preds, refs), sk(sklearn_metrics.matthews_corrcoef, refs, preds)), (preds, refs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert close(f1(preds, refs), sklearn_metrics.f1_score(refs, preds)), (preds, refs)
    with pytest.warns(RuntimeWarning, match="F1 is undefined"):
        assert f1([0, 0], [0, 0]) == 0.0  # the expected warning, caught where it is expected


# Correlation: scipy

floats = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
few_values = st.sampled_from([0.0, 1.0, 2.5, 2.5, 4.0, 5.0])  # ties, as in STS-B's scores


def float_pairs(values):
    return st.integers(2, 30).flatmap(
        lambda n: st.tuples(st.lists(values, min_size=n, max_size=n), st.lists(values, min_size=n, max_size=n))
    )


def scipy_correlation(function, x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConstantInputWarning: NaN expected, ours warns too
        return float(function(x, y)[0])


@SETTINGS
@given(st.one_of(float_pairs(floats), float_pairs(few_values)))
def test_correlations_match_scipy(pair):
    x, y = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: NaN, with a warning from both
        ours_p, ours_s = pearson(x, y), spearman(x, y)
    theirs_p = scipy_correlation(scipy_stats.pearsonr, x, y)
    theirs_s = scipy_correlation(scipy_stats.spearmanr, x, y)
    assert close(ours_p, theirs_p, tol=1e-7), (ours_p, theirs_p)
    assert close(ours_s, theirs_s, tol=1e-7), (ours_s, theirs_s)


def test_correlation_edge_cases_match_scipy():
    cases = [
        ([1.0, 2.0], [2.0, 1.0]),
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
        ([1e-300, 2e-300, 3e-300], [3.0, 1.0, 2.0]),
        ([1e300, -1e300, 0.0], [1.0, 2.0, 3.0]),
        ([5.0, 5.0, 5.0, 6.0], [1.0, 1.0, 2.0, 2.0]),
    ]
    for x, y in cases:
        assert close(pearson(x, y), scipy_correlation(scipy_stats.pearsonr, x, y), tol=1e-7), (x, y)
        assert close(spearman(x, y), scipy_correlation(scipy_stats.spearmanr, x, y), tol=1e-7), (x, y)
    with pytest.warns(RuntimeWarning, match="constant"):
        assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


# CoNLL chunk F1: seqeval

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def sentences_pair():
    lengths = st.lists(st.integers(1, 12), min_size=1, max_size=6)
    return lengths.flatmap(
        lambda ns: st.tuples(
            st.tuples(*[st.lists(st.sampled_from(TAGS), min_size=n, max_size=n) for n in ns]),
            st.tuples(*[st.lists(st.sampled_from(TAGS), min_size=n, max_size=n) for n in ns]),
        )
    )


@SETTINGS
@given(sentences_pair())
def test_conll_f1_matches_seqeval(pair):
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    preds, refs = (list(map(list, p)) for p in pair)  # may hold I- tags without a B- (conlleval starts a chunk)
    ours = conll_f1(preds, refs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # UndefinedMetricWarning: no predicted or no true chunk
        names = ("precision", "recall", "f1", "accuracy")
        theirs = {name: getattr(seqeval_metrics, f"{name}_score")(refs, preds) for name in names}
    for key, value in theirs.items():
        assert close(ours[key], float(value)), (key, ours, theirs)


# SQuAD v1.1: the official evaluate-v1.1.py


def v1_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v1_f1_score(prediction, ground_truth):
    prediction_tokens = v1_normalize_answer(prediction).split()
    ground_truth_tokens = v1_normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def v1_exact_match_score(prediction, ground_truth):
    return v1_normalize_answer(prediction) == v1_normalize_answer(ground_truth)


def v1_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    return max(metric_fn(prediction, ground_truth) for ground_truth in ground_truths)


def v1_evaluate(references, predictions):
    f1_total = exact_match = total = 0
    for qid, ground_truths in references.items():
        total += 1
        if qid not in predictions:
            continue
        prediction = predictions[qid]
        exact_match += v1_metric_max_over_ground_truths(v1_exact_match_score, prediction, ground_truths)
        f1_total += v1_metric_max_over_ground_truths(v1_f1_score, prediction, ground_truths)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1_total / total}


# Words that exercise the normalisation: articles (whole words only), case, punctuation inside and around words,
# accents, digits with separators, empty strings and white space.
WORDS = (
    "the The a An an theory cat Cat. cats dog (dog) dog's 1,000 1000 é naïve Naïve! - ... U.S. us banana Nathan sedan"
).split() + ["", " ", "\t"]
answers = st.lists(st.sampled_from(WORDS), max_size=5).map(" ".join)


@SETTINGS
@given(st.one_of(answers, st.text(max_size=30)))
def test_answer_normalisation_matches_the_official_scripts(text):
    assert normalize_answer(text) == v1_normalize_answer(text) == v2_normalize_answer(text)


@SETTINGS
@given(st.lists(st.tuples(st.lists(answers, min_size=1, max_size=3), answers, st.booleans()), min_size=1, max_size=8))
def test_squad_v1_matches_the_official_script(rows):
    references = {f"q{i}": gold for i, (gold, _, _) in enumerate(rows)}
    predictions = {f"q{i}": pred for i, (_, pred, present) in enumerate(rows) if present or i == 0}
    ours = squad_v1(predictions, references)
    theirs = v1_evaluate(references, predictions)
    assert close(ours["exact_match"], theirs["exact_match"]) and close(ours["f1"], theirs["f1"]), (ours, theirs)


# SQuAD v2.0: the official evaluate-v2.0.py


def v2_normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v2_get_tokens(s):
    if not s:
        return []
    return v2_normalize_answer(s).split()


def v2_compute_exact(a_gold, a_pred):
    return int(v2_normalize_answer(a_gold) == v2_normalize_answer(a_pred))


def v2_compute_f1(a_gold, a_pred):
    gold_toks = v2_get_tokens(a_gold)
    pred_toks = v2_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def v2_get_raw_scores(references, preds):
    exact_scores, f1_scores = {}, {}
    for qid, answer_texts in references.items():
        gold_answers = [a for a in answer_texts if v2_normalize_answer(a)]
        if not gold_answers:
            gold_answers = [""]
        if qid not in preds:
            continue
        a_pred = preds[qid]
        exact_scores[qid] = max(v2_compute_exact(a, a_pred) for a in gold_answers)
        f1_scores[qid] = max(v2_compute_f1(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores


def v2_apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    new_scores = {}
    for qid, s in scores.items():
        pred_na = na_probs[qid] > na_prob_thresh
        new_scores[qid] = float(not qid_to_has_ans[qid]) if pred_na else s
    return new_scores


def v2_make_eval_dict(exact_scores, f1_scores, qid_list=None):
    if not qid_list:
        total = len(exact_scores)
        return collections.OrderedDict(
            [
                ("exact", 100.0 * sum(exact_scores.values()) / total),
                ("f1", 100.0 * sum(f1_scores.values()) / total),
                ("total", total),
            ]
        )
    total = len(qid_list)
    return collections.OrderedDict(
        [
            ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
            ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
            ("total", total),
        ]
    )


def v2_merge_eval(main_eval, new_eval, prefix):
    for k in new_eval:
        main_eval[f"{prefix}_{k}"] = new_eval[k]


def v2_find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def v2_evaluate(references, preds, na_probs=None, na_prob_thresh=1.0):
    has_na_prob_file = na_probs is not None
    if na_probs is None:
        na_probs = {k: 0.0 for k in preds}
    qid_to_has_ans = {qid: bool(answer_texts) for qid, answer_texts in references.items()}
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = v2_get_raw_scores(references, preds)
    exact_thresh = v2_apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = v2_apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out_eval = v2_make_eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        v2_merge_eval(out_eval, v2_make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids), "HasAns")
    if no_ans_qids:
        v2_merge_eval(out_eval, v2_make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids), "NoAns")
    if has_na_prob_file:
        out_eval["best_exact"], out_eval["best_exact_thresh"] = v2_find_best_thresh(
            preds, exact_raw, na_probs, qid_to_has_ans
        )
        out_eval["best_f1"], out_eval["best_f1_thresh"] = v2_find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
    return dict(out_eval)


# The official script reads every prediction; a question without one breaks its HasAns/NoAns split, so every
# question has a prediction here ("" = no answer).
v2_rows = st.lists(
    st.tuples(st.lists(answers, max_size=3), st.one_of(st.just(""), answers), st.sampled_from([0.0, 0.1, 0.5, 0.9])),
    min_size=1,
    max_size=8,
)


@SETTINGS
@given(v2_rows, st.booleans(), st.sampled_from([0.0, 0.5, 1.0]))
def test_squad_v2_matches_the_official_script(rows, with_probs, thresh):
    references = {f"q{i}": gold for i, (gold, _, _) in enumerate(rows)}
    predictions = {f"q{i}": pred for i, (_, pred, _) in enumerate(rows)}
    na_probs = {f"q{i}": p for i, (_, _, p) in enumerate(rows)} if with_probs else None
    ours = squad_v2(predictions, references, na_probs=na_probs, na_prob_thresh=thresh)
    theirs = v2_evaluate(references, predictions, na_probs=na_probs, na_prob_thresh=thresh)
    assert set(ours) == set(theirs), (ours, theirs)
    for key in theirs:
        assert close(float(ours[key]), float(theirs[key])), (key, ours, theirs)


def test_squad_edge_cases_match_the_official_scripts():
    refs = {"a": ["The Cat"], "b": ["1,000 dogs", "a thousand dogs"], "c": ["naïve!"]}
    preds = {"a": "cat", "b": "dogs 1000", "c": "Naïve"}
    assert squad_v1(preds, refs) == pytest.approx(v1_evaluate(refs, preds))
    refs2 = {"a": ["the"], "b": [], "c": ["an answer"]}  # "the" normalises to "": unanswerable in effect
    preds2 = {"a": "", "b": "", "c": "answer"}
    assert squad_v2(preds2, refs2) == pytest.approx(v2_evaluate(refs2, preds2))
    assert np.isfinite(squad_v2(preds2, refs2, na_probs={"a": 0.2, "b": 0.2, "c": 0.2})["best_f1"])
