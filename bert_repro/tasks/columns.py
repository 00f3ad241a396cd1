"""From the columns a task's files hold to its canonical columns, every value checked.

A task's kind builds its columns from each `RawSplit` that `bert_repro.tasks.files` reads, with the ``*_columns``
function of its layout. A value that does not fit raises `TaskDataError` naming the file, the line or row, and what
was expected. As ``run_squad.py``, SQuAD TRAINING questions whose answer is not at its ``answer_start`` are skipped
and counted (`drop_misaligned_answers`); evaluation keeps them, since the official script compares texts only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .registry import Task

logger = logging.getLogger(__name__)

GLUE_TEST_INDEX_COLUMNS = ("index", "id")  # GLUE's hidden-label test files key rows by these


class TaskDataError(ValueError):
    """Task data that cannot be read; the message names the file and row and what was expected."""


@dataclass
class RawSplit:
    """One split as read from one source, column by column, before checking; ``locate(i)`` names row i."""

    columns: dict[str, list]
    num_rows: int
    source: str
    locate: Callable[[int], str]


def find_column(task: Task, raw: RawSplit, name: str, required: bool = True) -> list | None:
    accepted = task.source_columns.get(name, (name,))
    for candidate in accepted:
        if candidate in raw.columns:
            return raw.columns[candidate]
    if required:
        raise TaskDataError(
            f"{raw.source}: no {name!r} column for {task.name} (accepted names: {', '.join(accepted)}); "
            f"columns present: {', '.join(map(str, raw.columns)) or 'none'}."
        )
    return None


def _text(raw: RawSplit, i: int, value: Any, column: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        raise TaskDataError(f"{raw.locate(i)}: no value in column {column!r}.")
    raise TaskDataError(f"{raw.locate(i)}: column {column!r} should hold text, found {type(value).__name__} {value!r}.")


def texts(raw: RawSplit, values: list, column: str) -> list[str]:
    return [_text(raw, i, value, column) for i, value in enumerate(values)]


def _is_unlabeled(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip() in ("", "-1", "-1.0")
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == -1


def class_id(task: Task, raw: RawSplit, i: int, value: Any, unlabeled_ok: bool, what: str = "label") -> int:
    if _is_unlabeled(value):
        if unlabeled_ok:
            return -1
        raise TaskDataError(
            f"{raw.locate(i)}: no {what} (found {value!r}); only hidden-label test splits may lack one."
        )
    number = value
    if isinstance(value, str):
        if value.strip() in task.label2id:
            return task.label2id[value.strip()]
        number = int(value) if re.fullmatch(r"\s*\d+\s*", value) else value
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if isinstance(number, int) and not isinstance(number, bool) and 0 <= number < len(task.label_names):
        return number
    raise TaskDataError(
        f"{raw.locate(i)}: {what} {value!r} is not one of {task.name}'s labels "
        f"({', '.join(task.label_names)}, or their ids 0..{len(task.label_names) - 1})."
    )


def _score(task: Task, raw: RawSplit, i: int, value: Any, unlabeled_ok: bool) -> float:
    if _is_unlabeled(value):
        if unlabeled_ok:
            return -1.0
        raise TaskDataError(f"{raw.locate(i)}: no score (found {value!r}); only hidden-label test splits may lack one.")
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise TaskDataError(f"{raw.locate(i)}: score {value!r} is not a number.") from None
    low, high = task.label_range or (float("-inf"), float("inf"))
    if not low <= score <= high:
        raise TaskDataError(f"{raw.locate(i)}: score {score} is outside {task.name}'s range {low}..{high}.")
    return score


def _int(raw: RawSplit, i: int, value: Any, column: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TaskDataError(f"{raw.locate(i)}: column {column!r} should hold an integer, found {value!r}.")


def _glue_idx(task: Task, split: str, raw: RawSplit) -> list[int]:
    """The row number, as on the Hub, except in hidden-label test files: their ``index`` (QQP ``id``)."""
    values = find_column(task, raw, "idx", required=False)
    if values is None and split in task.test_splits:
        values = next((raw.columns[c] for c in GLUE_TEST_INDEX_COLUMNS if c in raw.columns), None)
    if values is None:
        return list(range(raw.num_rows))
    return [_int(raw, i, value, "idx") for i, value in enumerate(values)]


def sentence_columns(task: Task, split: str, raw: RawSplit, *, scores: bool = False) -> dict[str, list]:
    """Classification (class ids) and, with ``scores``, regression (GLUE)."""
    columns: dict[str, list] = {c: texts(raw, find_column(task, raw, c), c) for c in task.text_columns}
    columns["label"] = _labels(task, split, raw, _score if scores else class_id)
    columns["idx"] = _glue_idx(task, split, raw)
    return columns


def _labels(task: Task, split: str, raw: RawSplit, convert: Callable[..., Any] = class_id) -> list:
    """The label column, each value checked by ``convert``; a hidden-label test split may lack the column."""
    unlabeled_ok = split in task.test_splits
    labels = find_column(task, raw, "label", required=not unlabeled_ok) or [None] * raw.num_rows
    return [convert(task, raw, i, value, unlabeled_ok) for i, value in enumerate(labels)]


def _answers(task: Task, raw: RawSplit, i: int, value: Any) -> dict[str, list]:
    """HF's {"text": [...], "answer_start": [...]} from that layout or SQuAD's [{"text", "answer_start"}]."""
    if isinstance(value, list):
        if not all(isinstance(a, dict) and "text" in a and "answer_start" in a for a in value):
            raise TaskDataError(f"{raw.locate(i)}: answers should be objects with 'text' and 'answer_start'.")
        value = {"text": [a["text"] for a in value], "answer_start": [a["answer_start"] for a in value]}
    if not (
        isinstance(value, dict) and isinstance(value.get("text"), list) and isinstance(value.get("answer_start"), list)
    ):
        raise TaskDataError(
            f"{raw.locate(i)}: answers should be {{'text': [...], 'answer_start': [...]}}, found {value!r}."
        )
    texts, starts = value["text"], [_int(raw, i, s, "answer_start") for s in value["answer_start"]]
    if len(texts) != len(starts) or not all(isinstance(t, str) for t in texts) or any(s < 0 for s in starts):
        raise TaskDataError(f"{raw.locate(i)}: answers need as many texts as non-negative starts, found {value!r}.")
    if not texts and not task.allows_no_answer:
        raise TaskDataError(
            f"{raw.locate(i)}: a question without answers in {task.name} (SQuAD v1.1 questions all have one; "
            "unanswerable questions belong to squad_v2)."
        )
    return {"text": list(texts), "answer_start": starts}


def span_columns(task: Task, split: str, raw: RawSplit) -> dict[str, list]:
    """SQuAD v1.1 / v2.0."""
    ids = [str(v) if isinstance(v, int) else _text(raw, i, v, "id") for i, v in enumerate(find_column(task, raw, "id"))]
    first: dict[str, int] = {}
    for i, question_id in enumerate(ids):
        # Predictions and the official score are keyed by id: a repeated id would drop out of the score.
        if first.setdefault(question_id, i) != i:
            raise TaskDataError(
                f"{raw.locate(i)}: the question id {question_id!r} again, first at {raw.locate(first[question_id])}; "
                "every question needs an id of its own."
            )
    titles = find_column(task, raw, "title", required=False) or [None] * raw.num_rows
    return {
        "id": ids,
        "title": ["" if t is None else _text(raw, i, t, "title") for i, t in enumerate(titles)],
        "context": texts(raw, find_column(task, raw, "context"), "context"),
        "question": texts(raw, find_column(task, raw, "question"), "question"),
        "answers": [_answers(task, raw, i, v) for i, v in enumerate(find_column(task, raw, "answers"))],
    }


def _endings(task: Task, raw: RawSplit) -> list[list[str]]:
    n = task.num_choices
    if "endings" in raw.columns:
        rows, names = raw.columns["endings"], None
    else:
        names = [f"ending{k}" for k in range(n)]
        missing = [name for name in names if name not in raw.columns]
        if missing:
            raise TaskDataError(
                f"{raw.source}: no {', '.join(missing)} column; {task.name} rows need ending0..ending{n - 1} "
                f"(or an 'endings' list); columns present: {', '.join(map(str, raw.columns))}."
            )
        rows = [list(values) for values in zip(*(raw.columns[name] for name in names))]
    endings = []
    for i, row in enumerate(rows):
        present = [e for e in row if isinstance(e, str) and e.strip()] if isinstance(row, list) else []
        if not isinstance(row, list) or len(row) != n or len(present) != n:
            empty = [name for name, e in zip(names, row) if not (isinstance(e, str) and e.strip())] if names else []
            empty_text = f" (empty: {', '.join(empty)})" if empty else ""
            raise TaskDataError(f"{raw.locate(i)}: {len(present)} endings, expected {n}{empty_text}.")
        endings.append(present)
    return endings


def choice_columns(task: Task, split: str, raw: RawSplit) -> dict[str, list]:
    """SWAG."""
    return {
        "context": texts(raw, find_column(task, raw, "context"), "context"),
        "question": texts(raw, find_column(task, raw, "question"), "question"),
        "endings": _endings(task, raw),
        "label": _labels(task, split, raw),
    }


def token_columns(task: Task, split: str, raw: RawSplit) -> dict[str, list]:
    """CoNLL-2003."""
    ids = find_column(task, raw, "id", required=False)
    tokens = find_column(task, raw, "tokens")
    tags = find_column(task, raw, "ner_tags")
    out: dict[str, list] = {"id": [], "tokens": [], "ner_tags": []}
    for i in range(raw.num_rows):
        words, labels = tokens[i], tags[i]
        if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
            raise TaskDataError(f"{raw.locate(i)}: 'tokens' should be a list of strings, found {words!r}.")
        if not isinstance(labels, list) or len(labels) != len(words):
            raise TaskDataError(f"{raw.locate(i)}: 'ner_tags' should be a list of one tag per token, found {labels!r}.")
        out["id"].append(str(i) if ids is None or ids[i] is None else str(ids[i]))
        out["tokens"].append(words)
        out["ner_tags"].append([class_id(task, raw, i, tag, False, what="NER tag") for tag in labels])
    return out


# SQuAD training answers that are not where they are said to be


def _whitespace_words(context: str) -> tuple[list[str], list[int]]:
    """The reference's paragraph tokenisation: words split on whitespace, and the word index of each char."""
    words: list[str] = []
    word_of_char: list[int] = []
    after_space = True
    for char in context:
        if char in " \t\r\n" or ord(char) == 0x202F:
            after_space = True
        else:
            if after_space:
                words.append(char)
            else:
                words[-1] += char
            after_space = False
        word_of_char.append(len(words) - 1)
    return words, word_of_char


def answer_is_aligned(context: str, text: str, start: int, _cache: dict | None = None) -> bool:
    """run_squad.py's test: the words covering ``text``'s characters at ``start`` contain ``text``."""
    if not text or start < 0 or start + len(text) > len(context):
        return False
    if _cache is not None and _cache.get("context") == context:
        words, word_of_char = _cache["words"]
    else:
        words, word_of_char = _whitespace_words(context)
        if _cache is not None:
            _cache.update(context=context, words=(words, word_of_char))
    first, last = word_of_char[start], word_of_char[start + len(text) - 1]
    return " ".join(text.split()) in " ".join(words[max(first, 0) : last + 1])


def drop_misaligned_answers(task: Task, raw: RawSplit, columns: dict[str, list]) -> dict[str, list]:
    """Training questions whose first answer is not at its answer_start are skipped, and counted."""
    cache: dict = {}
    keep = [
        not answers["text"] or answer_is_aligned(context, answers["text"][0], answers["answer_start"][0], cache)
        for context, answers in zip(columns["context"], columns["answers"])
    ]
    skipped = [i for i, ok in enumerate(keep) if not ok]
    if not skipped:
        return columns
    logger.warning(
        "%s train: skipped %d of %d questions whose answer text is not found at its answer_start (as the "
        "reference run_squad.py does); first: %s",
        task.name,
        len(skipped),
        len(keep),
        raw.locate(skipped[0]),
    )
    return {name: [value for value, ok in zip(values, keep) if ok] for name, values in columns.items()}


__all__ = [
    "GLUE_TEST_INDEX_COLUMNS",
    "RawSplit",
    "TaskDataError",
    "answer_is_aligned",
    "choice_columns",
    "class_id",
    "drop_misaligned_answers",
    "find_column",
    "sentence_columns",
    "span_columns",
    "texts",
    "token_columns",
]
