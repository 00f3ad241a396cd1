"""Official metrics of the paper's fine-tuning tasks (SPEC section 4), offline, with numpy only.

`evaluate` 0.4.6 ships no metric code (`evaluate.load` downloads scripts) and scipy / scikit-learn are not
dependencies, so each metric here matches the reference behind the published numbers (sklearn, scipy, the official
SQuAD scripts, conlleval), undefined values included: `pearson` / `spearman` are NaN with a RuntimeWarning for a
constant input, and NaN for a NaN input. Values are fractions EXCEPT the SQuAD metrics, in percent as the official
scripts print them. Empty inputs and length mismatches raise `ValueError`.

SQuAD's normalisation drops ASCII `string.punctuation` only ("«" stays) and `\\b(a|an|the)\\b` ("theatre" stays).
CoNLL: I-X after O or another type starts a chunk, so IOB1 and IOB2 give the same chunks.
"""

from __future__ import annotations

import collections
import logging
import math
import re
import string
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "METRICS",
    "accuracy",
    "compute",
    "compute_exact",
    "compute_f1",
    "conll_f1",
    "f1",
    "get_chunks",
    "matthews_corrcoef",
    "normalize_answer",
    "pearson",
    "spearman",
    "squad_v1",
    "squad_v2",
]


# Input checks


def _as_1d(values: Any, name: str, dtype: Any = None) -> np.ndarray:
    array = np.asarray(values, dtype=dtype)
    if array.ndim == 2 and array.shape[1] == 1:  # a regression head's (n, 1) output
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


def _pair(predictions: Any, references: Any, dtype: Any = None) -> tuple[np.ndarray, np.ndarray]:
    preds = _as_1d(predictions, "predictions", dtype)
    refs = _as_1d(references, "references", dtype)
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions for {len(refs)} references")
    if len(refs) == 0:
        raise ValueError("no predictions to score")
    return preds, refs


# Classification (GLUE)


def accuracy(predictions: Sequence[Any] | np.ndarray, references: Sequence[Any] | np.ndarray) -> float:
    """Fraction of predictions equal to their reference."""
    preds, refs = _pair(predictions, references)
    return float(np.mean(preds == refs))


def f1(
    predictions: Sequence[Any] | np.ndarray, references: Sequence[Any] | np.ndarray, positive_label: Any = 1
) -> float:
    """Binary F1 of `positive_label`, as sklearn's `f1_score(average="binary")` with its errors and warning."""
    preds, refs = _pair(predictions, references)
    present = np.unique(np.concatenate([refs, preds]))
    if len(present) > 2:
        raise ValueError(f"binary F1 needs at most two labels, got {present.tolist()}")
    if len(present) == 2 and positive_label not in present.tolist():
        raise ValueError(f"positive_label={positive_label!r} is not one of the labels {present.tolist()}")
    pred_pos = preds == positive_label
    true_pos = refs == positive_label
    tp = int(np.sum(pred_pos & true_pos))
    denominator = int(np.sum(pred_pos)) + int(np.sum(true_pos))  # = 2 TP + FP + FN
    if denominator == 0:
        warnings.warn("F1 is undefined with no true nor predicted positives; set to 0.0", RuntimeWarning, stacklevel=2)
        return 0.0
    return 2.0 * tp / denominator


def matthews_corrcoef(predictions: Sequence[Any] | np.ndarray, references: Sequence[Any] | np.ndarray) -> float:
    """Matthews correlation in sklearn's multi-class form (the usual MCC for two classes); 0.0 when undefined."""
    preds, refs = _pair(predictions, references)
    _, codes = np.unique(np.concatenate([refs, preds]), return_inverse=True)
    n = len(refs)
    true_codes, pred_codes = codes[:n], codes[n:]
    n_labels = int(codes.max()) + 1
    t_sum = np.bincount(true_codes, minlength=n_labels).astype(np.float64)
    p_sum = np.bincount(pred_codes, minlength=n_labels).astype(np.float64)
    n_correct = float(np.sum(true_codes == pred_codes))
    s = float(n)
    cov_ytyp = n_correct * s - float(np.dot(t_sum, p_sum))
    cov_ypyp = s * s - float(np.dot(p_sum, p_sum))
    cov_ytyt = s * s - float(np.dot(t_sum, t_sum))
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return cov_ytyp / math.sqrt(cov_ytyt * cov_ypyp)


# Correlation (STS-B)


def _constant(x: np.ndarray) -> bool:
    return bool(np.all(x == x[0]))


def _pearson_r(x: np.ndarray, y: np.ndarray) -> float:
    if np.isnan(x).any() or np.isnan(y).any():
        return float("nan")
    if len(x) < 2:
        raise ValueError("correlation needs at least two values")
    if _constant(x) or _constant(y):
        warnings.warn("an input is constant: the correlation is not defined (NaN)", RuntimeWarning, stacklevel=3)
        return float("nan")
    xm = x - x.mean()
    ym = y - y.mean()
    # Scaled by the largest magnitude first, as scipy does, so the norms cannot overflow.
    xm = xm / np.max(np.abs(xm))
    ym = ym / np.max(np.abs(ym))
    r = float(np.dot(xm / np.linalg.norm(xm), ym / np.linalg.norm(ym)))
    return max(min(r, 1.0), -1.0)


def pearson(predictions: Sequence[float] | np.ndarray, references: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation coefficient, as `scipy.stats.pearsonr(predictions, references)[0]`."""
    preds, refs = _pair(predictions, references, dtype=np.float64)
    return _pearson_r(preds, refs)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of their ranks (`scipy.stats.rankdata(method="average")`)."""
    order = np.argsort(values, kind="mergesort")
    inverse = np.empty(len(values), dtype=np.intp)
    inverse[order] = np.arange(len(values))
    ordered = values[order]
    new_value = np.r_[True, ordered[1:] != ordered[:-1]]
    group = np.cumsum(new_value)[inverse]  # 1-based index of each value's tie group
    group_starts = np.r_[np.nonzero(new_value)[0], len(values)]
    return 0.5 * (group_starts[group] + group_starts[group - 1] + 1)


def spearman(predictions: Sequence[float] | np.ndarray, references: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation: Pearson of the average ranks, as `scipy.stats.spearmanr(...)[0]`."""
    preds, refs = _pair(predictions, references, dtype=np.float64)
    if np.isnan(preds).any() or np.isnan(refs).any():
        return float("nan")
    return _pearson_r(_average_ranks(preds), _average_ranks(refs))


# SQuAD: normalisation and per-answer scores of the official scripts

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra white space (both official SQuAD scripts)."""
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _v1_f1(prediction: str, ground_truth: str) -> float:
    """v1.1's `f1_score`: bag-of-tokens F1; 0 when nothing is shared (also when both are empty)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    num_same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _get_tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
    """Exact match of one gold answer (both official scripts): 1 if the normalised strings are equal."""
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """v2.0's F1 of one gold answer; when either side has no tokens, 1.0 if both have none, else 0.0."""
    gold_tokens, pred_tokens = _get_tokens(a_gold), _get_tokens(a_pred)
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    return _token_f1(pred_tokens, gold_tokens)


def _warn_missing(missing: int, total: int, consequence: str) -> None:
    if missing:
        logger.warning("%d of %d questions have no prediction; %s", missing, total, consequence)


# SQuAD v1.1


def squad_v1(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """The official SQuAD v1.1 evaluation of id -> text against id -> gold texts: {"exact_match", "f1"} in percent.

    As the script, a question without a prediction scores 0 (here with a warning); unknown ids are ignored.
    """
    if not references:
        raise ValueError("no references to score")
    exact_match = f1_sum = 0.0
    for qid, gold_answers in references.items():
        if not gold_answers:
            raise ValueError(f"question {qid!r} has no gold answer (SQuAD v1.1 questions are all answerable)")
        if qid not in predictions:
            continue
        prediction = predictions[qid]
        exact_match += max(compute_exact(gold, prediction) for gold in gold_answers)
        f1_sum += max(_v1_f1(prediction, gold) for gold in gold_answers)
    _warn_missing(sum(qid not in predictions for qid in references), len(references), "they score 0")
    total = len(references)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1_sum / total}


# SQuAD v2.0


def _v2_raw_scores(
    predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]
) -> tuple[dict[str, int], dict[str, float]]:
    """`get_raw_scores`: the max over gold answers, those normalising to "" dropped ("" if none is left)."""
    exact_scores: dict[str, int] = {}
    f1_scores: dict[str, float] = {}
    for qid, answers in references.items():
        if qid not in predictions:
            continue
        gold_answers = [a for a in answers if normalize_answer(a)] or [""]
        prediction = predictions[qid]
        exact_scores[qid] = max(compute_exact(a, prediction) for a in gold_answers)
        f1_scores[qid] = max(compute_f1(a, prediction) for a in gold_answers)
    return exact_scores, f1_scores


def _apply_no_ans_threshold(
    scores: Mapping[str, float], na_probs: Mapping[str, float], has_ans: Mapping[str, bool], thresh: float
) -> dict[str, float]:
    """Where na_prob > thresh the prediction becomes "no answer": 1 on unanswerable questions, else 0."""
    return {qid: float(not has_ans[qid]) if na_probs[qid] > thresh else s for qid, s in scores.items()}


def _eval_dict(exact: Mapping[str, float], f1_scores: Mapping[str, float], qids: Sequence[str]) -> dict[str, float]:
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / total,
        "f1": 100.0 * sum(f1_scores[q] for q in qids) / total,
        "total": total,
    }


def _find_best_thresh(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_ans: Mapping[str, bool],
) -> tuple[float, float]:
    """`find_best_thresh`, with its quirks: ties walk in `na_probs`' order, and the raw (not normalised) prediction
    is tested for being empty. The threshold is the na_prob of the last question answered: answering where na_prob
    <= it scores the best (up to ties); but when answering nothing scores best it is 0.0, as the official script
    reports it, and only a threshold below every na_prob gives that score (0.0 gives the score at threshold 0)."""
    cur_score = best_score = float(sum(not v for v in has_ans.values()))
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def squad_v2(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """The official SQuAD 2.0 evaluation, in percent, with its keys (HasAns_*, NoAns_*, best_* with `na_probs`).

    An empty gold list marks an unanswerable question, a "" prediction "no answer". `na_probs` and `na_prob_thresh`
    are `--na-prob-file` and `--na-prob-thresh` (na_probs default to 0.0). Questions without a prediction are
    left out of every total, with a warning (the official script's HasAns/NoAns split fails on them).
    """
    has_ans = {qid: bool(answers) for qid, answers in references.items()}
    exact_raw, f1_raw = _v2_raw_scores(predictions, references)
    _warn_missing(len(references) - len(exact_raw), len(references), "they are left out of the totals")
    if not exact_raw:
        raise ValueError("no question of the references has a prediction")
    probs = dict(na_probs) if na_probs is not None else {qid: 0.0 for qid in predictions}
    missing_probs = [qid for qid in exact_raw if qid not in probs]
    if missing_probs:
        raise ValueError(f"na_probs lacks {len(missing_probs)} predicted questions, e.g. {missing_probs[0]!r}")

    exact_thresh = _apply_no_ans_threshold(exact_raw, probs, has_ans, na_prob_thresh)
    f1_thresh = _apply_no_ans_threshold(f1_raw, probs, has_ans, na_prob_thresh)
    result = _eval_dict(exact_thresh, f1_thresh, list(exact_thresh))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid in exact_thresh if has_ans[qid] is wanted]
        if qids:
            result.update(
                {f"{prefix}_{key}": value for key, value in _eval_dict(exact_thresh, f1_thresh, qids).items()}
            )
    if na_probs is not None:
        result["best_exact"], result["best_exact_thresh"] = _find_best_thresh(predictions, exact_raw, probs, has_ans)
        result["best_f1"], result["best_f1_thresh"] = _find_best_thresh(predictions, f1_raw, probs, has_ans)
    return result


# CoNLL-2003 NER: chunk F1

_PREFIXES = frozenset("BIES")


def _split_tag(label: str) -> tuple[str, str]:
    if label == "O":
        return "O", ""
    prefix, dash, chunk_type = label.partition("-")
    if not dash or prefix not in _PREFIXES or not chunk_type:
        raise ValueError(f"tag {label!r} is neither 'O' nor B-, I-, E- or S- followed by a type")
    return prefix, chunk_type


def _chunk_ends(prev_tag: str, tag: str, prev_type: str, chunk_type: str) -> bool:
    """conlleval's endOfChunk: does the chunk open before this token end here?"""
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag != "O" and prev_type != chunk_type


def _chunk_starts(prev_tag: str, tag: str, prev_type: str, chunk_type: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at this token?"""
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag != "O" and prev_type != chunk_type


def get_chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of one sentence as (type, first token, last token), both ends inclusive."""
    chunks: list[tuple[str, int, int]] = []
    prev_tag, prev_type, start = "O", "", 0
    for i, label in enumerate([*tags, "O"]):
        tag, chunk_type = _split_tag(label)
        if _chunk_ends(prev_tag, tag, prev_type, chunk_type):
            chunks.append((prev_type, start, i - 1))
        if _chunk_starts(prev_tag, tag, prev_type, chunk_type):
            start = i
        prev_tag, prev_type = tag, chunk_type
    return chunks


def conll_f1(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro-averaged chunk precision, recall, F1 (0.0 where undefined) and token accuracy, as seqeval's default."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predicted sentences for {len(references)} references")
    n_correct = n_pred = n_true = tokens = right_tokens = 0
    for i, (pred_tags, true_tags) in enumerate(zip(predictions, references)):
        if len(pred_tags) != len(true_tags):
            raise ValueError(f"sentence {i}: {len(pred_tags)} predicted tags for {len(true_tags)} reference tags")
        pred_chunks, true_chunks = set(get_chunks(pred_tags)), set(get_chunks(true_tags))
        n_correct += len(pred_chunks & true_chunks)
        n_pred += len(pred_chunks)
        n_true += len(true_chunks)
        tokens += len(true_tags)
        right_tokens += sum(p == t for p, t in zip(pred_tags, true_tags))
    if tokens == 0:
        raise ValueError("no tokens to score")
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_true if n_true else 0.0
    f1_value = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1_value, "accuracy": right_tokens / tokens}


# Dispatch

METRICS: dict[str, Callable[[Any, Any], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute(metric_names: Sequence[str], predictions: Any, references: Any) -> dict[str, float]:
    """{name: value} for the named simple metrics (keys of `METRICS`); "f1" is the F1 of label 1."""
    if isinstance(metric_names, str):
        metric_names = [metric_names]
    unknown = [name for name in metric_names if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(METRICS)}")
    return {name: METRICS[name](predictions, references) for name in metric_names}


def is_number(value: Any) -> bool:
    """A score or count that can be printed as one: a finite int or float, not a bool (JSON's true is no score)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def percent(metric: str, value: Any) -> float | None:
    """A score in percent, as the paper prints them: our metrics are fractions except SQuAD's (percent, as the
    official scripts give them). Rounded to the paper's two decimals; None for a missing score."""
    if not is_number(value):
        return None
    return round(value if metric.startswith("squad") else 100 * value, 2)


def own_scale(metric: str, percent_value: Any) -> float | None:
    """`percent`'s inverse: a score given in percent (a study's cells) back in ``metric``'s own scale, the
    model-index's (rounded to undo the float noise of the division)."""
    if not is_number(percent_value):
        return None
    return percent_value if metric.startswith("squad") else round(percent_value / 100, 6)
