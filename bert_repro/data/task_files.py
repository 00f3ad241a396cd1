"""Reading the fine-tuning tasks' data, from the Hub or from the files people have, in one canonical form.

`load_task_data(task, source)` returns a `datasets.DatasetDict` whose splits carry canonical names ("train",
"validation", "test"; MNLI "validation_matched" / "validation_mismatched" / "test_matched" /
"test_mismatched") and canonical columns, one layout per task kind:

- classification / regression (GLUE): the task's ``text_columns`` (the Hub's names: ``sentence``,
  ``sentence1``/``sentence2``, ``premise``/``hypothesis``, ``question1``/``question2``, ``question``/
  ``sentence``), ``label`` (class id as a ``ClassLabel``, or a float32 score for STS-B; -1 for a test row
  whose label is hidden) and ``idx`` (the row id GLUE submissions are keyed by);
- span (SQuAD): ``id``, ``title``, ``context``, ``question``, ``answers`` = {"text": [...], "answer_start":
  [...]} (empty lists for an unanswerable v2.0 question);
- multiple_choice (SWAG): ``context`` (SWAG's sent1), ``question`` (sent2, the start of every ending),
  ``endings`` (4 strings), ``label``;
- token_classification (CoNLL-2003): ``id``, ``tokens``, ``ner_tags`` (ids into ``Task.label_names``, IOB2).

Sources (``source`` argument):

- None: the Hub dataset ``Task.hub_id`` / ``Task.hub_config`` through ``datasets.load_dataset``.
- A directory in the task's ORIGINAL layout: GLUE's TSVs (``train.tsv``, ``dev.tsv``, ``test.tsv``; MNLI
  ``dev_matched.tsv`` ...), SQuAD's JSON (``train-v1.1.json``, ``dev-v2.0.json`` ...), SWAG's CSVs
  (``train.csv``, ``val.csv``, ``test.csv``), CoNLL-2003's column files (``eng.train``/``eng.testa``/
  ``eng.testb`` or ``train.txt``/``valid.txt``/``test.txt``).
- A directory of exports named by split: ``train.*``, ``validation.*`` (or ``dev.*``, ``val.*``), ``test.*``
  as parquet, csv, tsv, json or jsonl, or Hub-style shards ``train-00000-of-00002.parquet`` (also under
  ``data/``). Columns may have the canonical names or the original ones (``Task.source_columns``).
- A mapping from split to file(s), e.g. ``{"train": "a.parquet", "validation": "b.csv"}``; or a single file
  whose name says its split.

Format rules: TSV files are read literally, as GLUE's are (tab-separated, NO quote processing: MRPC and
others hold unbalanced double quotes), with an optional UTF-8 byte-order mark; GLUE's CoLA train/dev files
have no header (source, label, author mark, sentence). CSV files use standard quoting. A ``.json`` file is
either SQuAD's nested format, a JSON array of records, or JSON lines (what ``Dataset.to_json`` writes).
CoNLL-2003's original files tag entities in IOB1 (``I-`` opens an entity unless it continues one of the
same type); they are converted to the IOB2 tags of ``Task.label_names`` (the Hub dataset's), and any tag
outside that set is an error. ``-DOCSTART-`` lines are dropped. GLUE's ``idx`` is the row number (as on the
Hub) except in hidden-label test files, where it is the file's own ``index`` (QQP: ``id``) column.

Bad input fails early, in the calling process, with a `TaskDataError` that names the file and the line
(text files, 1-based) or row (parquet and Hub, 0-based) and what was expected: a label outside the task's
set, a missing column (the columns present are listed), an empty split, a SWAG row without four endings, a
malformed CoNLL line. One departure from "fail on bad input", taken from the reference ``run_squad.py``: a
SQuAD TRAINING question whose answer text is not found at its ``answer_start`` (the reference's test: the
whitespace-separated words covering those characters must contain the answer) is skipped, and the number
skipped is logged; evaluation splits keep such questions, since the official evaluation compares texts only.
Every row is checked in Python, so a large Hub dataset (MNLI) takes a few seconds to canonicalise.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from ..tasks.registry import Task, get_task

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
Source = PathLike | Mapping[str, PathLike | Sequence[PathLike]] | None

EXPORT_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv", ".tsv")
VALIDATION_ALIASES = ("dev", "val", "valid")  # file names may say these for "validation"
GLUE_TEST_INDEX_COLUMNS = ("index", "id")  # GLUE's hidden-label test files key rows by these
_SHARD = "-[0-9]*-of-[0-9]*"  # Hub parquet shards: train-00000-of-00002.parquet


class TaskDataError(ValueError):
    """Task data that cannot be read; the message names the file and row and what was expected."""


@dataclass
class _Raw:
    """One split as read from one source, column by column, before checking; ``locate(i)`` names row i."""

    columns: dict[str, list]
    num_rows: int
    source: str
    locate: Callable[[int], str]


# --------------------------------------------------------------------------------------------------------
# Split names


def split_aliases(split: str) -> tuple[str, ...]:
    """The names a canonical split may go by in file names and mappings ("validation": "dev", "val"...)."""
    if "validation" not in split:
        return (split,)
    return (split,) + tuple(split.replace("validation", alias) for alias in VALIDATION_ALIASES)


def _canonical_split(task: Task, name: str) -> str | None:
    name = name.strip().lower()
    for split in task.splits:
        if name in split_aliases(split):
            return split
    return None


# --------------------------------------------------------------------------------------------------------
# Describing what is accepted


def describe_sources(task: Task | str) -> str:
    """A short text listing the file layouts accepted for ``task`` (used in error messages)."""
    task = get_task(task)
    original = "/".join(names[0] for names in task.original_files.values())
    kind_of_layout = {
        "glue_tsv": "GLUE layout, tab-separated, read literally",
        "squad_json": 'SQuAD JSON {"data": [{"title", "paragraphs": [{"context", "qas"}]}]}',
        "swag_csv": "SWAG CSV with sent1, sent2, ending0..ending3, label",
        "conll": "CoNLL-2003 'token POS chunk NER' lines, IOB1 or IOB2",
    }[task.original_format]
    if task.original_format == "conll":
        original += " (or " + "/".join(names[1] for names in task.original_files.values()) + ")"
    exports = "/".join(f"{split}.*" for split in task.splits)
    return (
        f"{original} ({kind_of_layout}) or {exports} (parquet, csv, tsv, json, jsonl; 'dev' may stand for "
        f"'validation') with columns {', '.join(canonical_columns(task))}, or a mapping "
        f"{{split: file}}; with no path, the Hub dataset {task.hub_id}"
        + (f" ({task.hub_config})" if task.hub_config else "")
    )


def canonical_columns(task: Task) -> tuple[str, ...]:
    """The columns of every split `load_task_data` returns for ``task``."""
    return tuple(canonical_features(task))


def canonical_features(task: Task) -> datasets.Features:
    """The `datasets.Features` of the canonical form of ``task`` (the same whatever the source)."""
    string = datasets.Value("string")
    if task.kind in ("classification", "regression"):
        features = {column: string for column in task.text_columns}
        features["label"] = (
            datasets.Value("float32")
            if task.kind == "regression"
            else datasets.ClassLabel(names=list(task.label_names))
        )
        features["idx"] = datasets.Value("int32")
    elif task.kind == "span":
        features = {
            "id": string,
            "title": string,
            "context": string,
            "question": string,
            "answers": {
                "text": datasets.List(string),
                "answer_start": datasets.List(datasets.Value("int32")),
            },
        }
    elif task.kind == "multiple_choice":
        features = {
            "context": string,
            "question": string,
            "endings": datasets.List(string),
            "label": datasets.ClassLabel(names=list(task.label_names)),
        }
    elif task.kind == "token_classification":
        features = {
            "id": string,
            "tokens": datasets.List(string),
            "ner_tags": datasets.List(datasets.ClassLabel(names=list(task.label_names))),
        }
    else:
        raise ValueError(f"{task.name}: unknown task kind {task.kind!r}")
    return datasets.Features(features)


# --------------------------------------------------------------------------------------------------------
# Readers: one per file format, each returning a _Raw


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise TaskDataError(f"{path}: not UTF-8 text ({error}).") from error


def _known_names(task: Task) -> set[str]:
    names = set(task.text_columns) | {"label", "idx", "id", "index"}
    for alternatives in task.source_columns.values():
        names.update(alternatives)
    return names


def _columns_from_rows(
    path: Path, header: Sequence[str], rows: list[tuple[int, list[str]]], separator: str
) -> _Raw:
    if len(set(header)) != len(header):
        raise TaskDataError(f"{path}: repeated column names in the header {list(header)}.")
    width = len(header)
    columns: dict[str, list] = {name: [] for name in header}
    lines: list[int] = []
    for line, fields in rows:
        if len(fields) > width and not any(fields[width:]):
            fields = fields[:width]  # trailing empty fields
        if len(fields) != width:
            raise TaskDataError(
                f"{path}, line {line}: expected {width} {separator}-separated fields ({', '.join(header)}), "
                f"found {len(fields)}."
            )
        for name, value in zip(header, fields):
            columns[name].append(value)
        lines.append(line)
    return _Raw(columns, len(lines), str(path), lambda i: f"{path}, line {lines[i]}")


def _split_header(task: Task, records: list[tuple[int, list[str]]]) -> tuple[list[str], list]:
    """The header and the data rows; a headerless GLUE file (CoLA train/dev) gets the task's column names."""
    first = records[0][1]
    if task.headerless_columns is not None and not (set(first) & _known_names(task)):
        return list(task.headerless_columns), records
    return first, records[1:]


def _read_tsv(path: Path, task: Task) -> _Raw:
    """A tab-separated file read literally (GLUE's convention: quotes are ordinary characters)."""
    records = [
        (number, line.rstrip("\r").split("\t"))
        for number, line in enumerate(_read_text(path).split("\n"), start=1)
        if line.rstrip("\r")
    ]
    if not records:
        raise TaskDataError(f"{path}: empty file.")
    header, rows = _split_header(task, records)
    return _columns_from_rows(path, header, rows, "tab")


def _read_csv(path: Path, task: Task) -> _Raw:
    """A comma-separated file with standard CSV quoting (SWAG's files, `Dataset.to_csv` exports)."""
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    records = []
    start = 1
    try:
        for fields in reader:
            if fields:
                records.append((start, fields))
            start = reader.line_num + 1
    except csv.Error as error:
        raise TaskDataError(f"{path}, line {reader.line_num}: not valid CSV ({error}).") from error
    if not records:
        raise TaskDataError(f"{path}: empty file.")
    header, rows = _split_header(task, records)
    return _columns_from_rows(path, header, rows, "comma")


def _read_parquet(path: Path) -> _Raw:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises several types for a file that is not parquet
        raise TaskDataError(f"{path}: not a readable parquet file ({error}).") from error
    return _Raw(table.to_pydict(), table.num_rows, str(path), lambda i: f"{path}, row {i}")


def _columns_from_records(path: Path, records: list, where: Callable[[int], str]) -> _Raw:
    names: dict[str, None] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise TaskDataError(
                f"{where(i)}: expected a JSON object (one row), found {type(record).__name__}."
            )
        names.update(dict.fromkeys(record))
    columns = {name: [record.get(name) for record in records] for name in names}
    return _Raw(columns, len(records), str(path), where)


def _read_jsonl(path: Path, text: str) -> _Raw:
    records, lines = [], []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise TaskDataError(f"{path}, line {number}: not valid JSON ({error.msg}).") from error
        lines.append(number)
    return _columns_from_records(path, records, lambda i: f"{path}, line {lines[i]}")


def _read_json(path: Path, task: Task) -> _Raw:
    """SQuAD's nested JSON, a JSON array of records, or JSON lines (also under a .json name)."""
    text = _read_text(path)
    if path.suffix.lower() == ".jsonl" or not text.lstrip().startswith(("[", "{")):
        return _read_jsonl(path, text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        if text.lstrip().startswith("{"):
            return _read_jsonl(path, text)
        raise TaskDataError(f"{path}, line {error.lineno}: not valid JSON ({error.msg}).") from error
    if isinstance(value, dict) and "data" in value:
        if task.kind != "span":
            raise TaskDataError(f"{path}: a SQuAD-format JSON file, but {task.name} is a {task.kind} task.")
        return _read_squad_json(path, value["data"], task)
    records = value if isinstance(value, list) else [value]
    return _columns_from_records(path, records, lambda i: f"{path}, record {i}")


def _read_squad_json(path: Path, articles: Any, task: Task) -> _Raw:
    """SQuAD's {"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}, one row per question."""
    if not isinstance(articles, list):
        raise TaskDataError(f"{path}: 'data' should be a list of articles, found {type(articles).__name__}.")
    columns: dict[str, list] = {name: [] for name in ("id", "title", "context", "question", "answers")}
    places: list[str] = []
    for a, article in enumerate(articles):
        title = article.get("title", "") if isinstance(article, dict) else None
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise TaskDataError(f"{path}, article {a}: expected an object with a 'paragraphs' list.")
        for p, paragraph in enumerate(paragraphs):
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(qas, list) or not isinstance(context, str):
                raise TaskDataError(
                    f"{path}, article {a}, paragraph {p}: expected 'context' (text) and 'qas' (a list)."
                )
            for q, qa in enumerate(qas):
                place = f"{path}, article {a}, paragraph {p}, question {q}"
                if not isinstance(qa, dict) or "id" not in qa or "question" not in qa:
                    raise TaskDataError(f"{place}: expected an object with 'id', 'question' and 'answers'.")
                place += f" (id {qa['id']})"
                answers = qa.get("answers", [])
                if qa.get("is_impossible", False):
                    if not task.allows_no_answer:
                        raise TaskDataError(
                            f"{place}: an unanswerable question (is_impossible) in {task.name}: this looks "
                            "like a SQuAD 2.0 file; use the squad_v2 task."
                        )
                    answers = []
                for name, value in (
                    ("id", qa["id"]),
                    ("title", title),
                    ("context", context),
                    ("question", qa["question"]),
                    ("answers", answers),
                ):
                    columns[name].append(value)
                places.append(place)
    return _Raw(columns, len(places), str(path), lambda i: places[i])


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (``I-X`` opens an entity unless it continues one of type X) to IOB2 (every entity opens with B-).

    IOB2 input comes back unchanged, so the conversion is safe on files of either scheme.
    """
    converted: list[str] = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
        previous = tag
    return converted


def _read_conll(path: Path, task: Task) -> _Raw:
    """CoNLL-2003 column files: 'token POS chunk NER' per line, a blank line between sentences."""
    allowed = set(task.label_names)
    ids: list[str] = []
    sentences: list[list[str]] = []
    sentence_tags: list[list[str]] = []
    starts: list[int] = []
    tokens: list[str] = []
    tags: list[str] = []

    def close_sentence() -> None:
        if tokens:
            ids.append(str(len(ids)))
            sentences.append(list(tokens))
            sentence_tags.append(iob1_to_iob2(tags))
            tokens.clear()
            tags.clear()

    for number, line in enumerate(_read_text(path).split("\n"), start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            close_sentence()
            continue
        if len(fields) != 4:
            raise TaskDataError(
                f"{path}, line {number}: expected 4 space-separated fields (token POS chunk NER), "
                f"found {len(fields)}: {line.rstrip()!r}."
            )
        if fields[3] not in allowed:
            raise TaskDataError(
                f"{path}, line {number}: unknown NER tag {fields[3]!r}; expected one of "
                f"{', '.join(task.label_names)}."
            )
        if not tokens:
            starts.append(number)
        tokens.append(fields[0])
        tags.append(fields[3])
    close_sentence()
    columns = {"id": ids, "tokens": sentences, "ner_tags": sentence_tags}
    return _Raw(columns, len(ids), str(path), lambda i: f"{path}, line {starts[i]}")


def _read_file(path: Path, task: Task) -> _Raw:
    suffix = path.suffix.lower()
    if task.original_format == "conll" and suffix not in (".parquet", ".json", ".jsonl"):
        return _read_conll(path, task)
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".tsv":
        return _read_tsv(path, task)
    if suffix == ".csv":
        return _read_csv(path, task)
    if suffix in (".json", ".jsonl"):
        return _read_json(path, task)
    raise TaskDataError(
        f"{path}: cannot read this kind of file for {task.name}. Expected: {describe_sources(task)}."
    )


def _concat(parts: list[_Raw]) -> _Raw:
    """Shards of one split as one _Raw; every shard must have the same columns."""
    if len(parts) == 1:
        return parts[0]
    for part in parts[1:]:
        if set(part.columns) != set(parts[0].columns):
            raise TaskDataError(
                f"{part.source}: columns {list(part.columns)} differ from those of {parts[0].source}: "
                f"{list(parts[0].columns)}."
            )
    columns = {name: [value for part in parts for value in part.columns[name]] for name in parts[0].columns}
    offsets = [0]
    for part in parts:
        offsets.append(offsets[-1] + part.num_rows)

    def locate(i: int) -> str:
        k = bisect.bisect_right(offsets, i) - 1
        return parts[k].locate(i - offsets[k])

    return _Raw(columns, offsets[-1], ", ".join(part.source for part in parts), locate)


# --------------------------------------------------------------------------------------------------------
# Finding the files of each split


def _files_in_directory(task: Task, directory: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for split in task.splits:
        candidates: list[tuple[Path, ...]] = []
        for name in task.original_files.get(split, ()):
            if (directory / name).is_file():
                candidates.append((directory / name,))
        for folder in (directory, directory / "data"):
            for stem in split_aliases(split):
                for suffix in EXPORT_SUFFIXES:
                    if (folder / f"{stem}{suffix}").is_file():
                        candidates.append((folder / f"{stem}{suffix}",))
                    shards = tuple(sorted(folder.glob(f"{stem}{_SHARD}{suffix}")))
                    if shards:
                        candidates.append(shards)
        candidates = list(dict.fromkeys(candidates))
        if len(candidates) > 1:
            names = "; ".join(", ".join(p.name for p in c) for c in candidates)
            raise TaskDataError(
                f"{directory}: several candidates for the {split} split of {task.name} ({names}); keep one, "
                f"or pass files explicitly, e.g. {{'{split}': '{candidates[0][0]}'}}."
            )
        if candidates:
            found[split] = list(candidates[0])
    return found


def _split_of_file(task: Task, path: Path) -> str | None:
    for split, names in task.original_files.items():
        if path.name in names:
            return split
    stem = re.match(r"[A-Za-z_]*", path.name).group(0)
    return _canonical_split(task, stem)


def _explicit_files(task: Task, files: Mapping[str, Any]) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for key, value in files.items():
        split = _canonical_split(task, str(key))
        if split is None:
            raise TaskDataError(
                f"unknown split {key!r} for {task.name}; expected one of {', '.join(task.splits)} "
                "('dev' or 'val' may stand for 'validation')."
            )
        paths = [Path(value)] if isinstance(value, (str, os.PathLike)) else [Path(v) for v in value]
        for path in paths:
            if not path.is_file():
                raise TaskDataError(f"{path}: no such file (given for the {split} split of {task.name}).")
        found[split] = paths
    return found


def _local_files(task: Task, source: PathLike | Mapping[str, Any]) -> dict[str, list[Path]]:
    if isinstance(source, Mapping):
        return _explicit_files(task, source)
    path = Path(source)
    if path.is_dir():
        found = _files_in_directory(task, path)
        if not found:
            raise TaskDataError(f"no data for {task.name} in {path}: expected {describe_sources(task)}.")
        return found
    if path.is_file():
        split = _split_of_file(task, path)
        if split is None:
            raise TaskDataError(
                f"{path}: cannot tell which split of {task.name} this file holds; name it after the split or "
                f"pass {{'train': '{path}'}}."
            )
        return {split: [path]}
    raise TaskDataError(
        f"{path}: no such file or directory. Pass a directory or files ({describe_sources(task)})."
    )


def _read_hub(task: Task, cache_dir: PathLike | None) -> dict[str, _Raw]:
    label = task.hub_id + (f" ({task.hub_config})" if task.hub_config else "")
    try:
        loaded = datasets.load_dataset(task.hub_id, task.hub_config, cache_dir=cache_dir)
    except Exception as error:  # offline, unknown id, ...: say what to do instead
        raise TaskDataError(
            f"could not load {label} from the Hub ({type(error).__name__}: {error}). Offline? Pass local "
            f"files instead: {describe_sources(task)}."
        ) from error
    raws: dict[str, _Raw] = {}
    for name, dataset in loaded.items():
        split = _canonical_split(task, name)
        if split is None:
            logger.info("%s: ignoring split %r of %s", task.name, name, label)
            continue
        raws[split] = _Raw(
            dataset.to_dict(), len(dataset), f"{label} {name}", _row_locator(f"{label} {name}")
        )
    return raws


def _row_locator(prefix: str) -> Callable[[int], str]:
    return lambda i: f"{prefix}, row {i}"


# --------------------------------------------------------------------------------------------------------
# Canonicalisation: one function per task kind, from a _Raw to canonical columns


def _column(task: Task, raw: _Raw, name: str, required: bool = True) -> list | None:
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


def _text(raw: _Raw, i: int, value: Any, column: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        raise TaskDataError(f"{raw.locate(i)}: no value in column {column!r}.")
    raise TaskDataError(
        f"{raw.locate(i)}: column {column!r} should hold text, found {type(value).__name__} {value!r}."
    )


def _texts(raw: _Raw, values: list, column: str) -> list[str]:
    return [_text(raw, i, value, column) for i, value in enumerate(values)]


def _is_unlabeled(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip() in ("", "-1", "-1.0")
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == -1


def _class_id(task: Task, raw: _Raw, i: int, value: Any, unlabeled_ok: bool, what: str = "label") -> int:
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


def _score(task: Task, raw: _Raw, i: int, value: Any, unlabeled_ok: bool) -> float:
    if _is_unlabeled(value):
        if unlabeled_ok:
            return -1.0
        raise TaskDataError(
            f"{raw.locate(i)}: no score (found {value!r}); only hidden-label test splits may lack one."
        )
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise TaskDataError(f"{raw.locate(i)}: score {value!r} is not a number.") from None
    low, high = task.label_range or (float("-inf"), float("inf"))
    if not low <= score <= high:
        raise TaskDataError(f"{raw.locate(i)}: score {score} is outside {task.name}'s range {low}..{high}.")
    return score


def _int(raw: _Raw, i: int, value: Any, column: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TaskDataError(f"{raw.locate(i)}: column {column!r} should hold an integer, found {value!r}.")


def _glue_idx(task: Task, split: str, raw: _Raw) -> list[int]:
    values = _column(task, raw, "idx", required=False)
    if values is None and split in task.test_splits:
        values = next((raw.columns[c] for c in GLUE_TEST_INDEX_COLUMNS if c in raw.columns), None)
    if values is None:
        return list(range(raw.num_rows))
    return [_int(raw, i, value, "idx") for i, value in enumerate(values)]


def _canonical_sentences(task: Task, split: str, raw: _Raw) -> dict[str, list]:
    """Classification and regression (GLUE)."""
    columns: dict[str, list] = {c: _texts(raw, _column(task, raw, c), c) for c in task.text_columns}
    unlabeled_ok = split in task.test_splits
    labels = _column(task, raw, "label", required=not unlabeled_ok)
    convert = _score if task.kind == "regression" else _class_id
    if labels is None:
        columns["label"] = [convert(task, raw, i, None, True) for i in range(raw.num_rows)]
    else:
        columns["label"] = [convert(task, raw, i, value, unlabeled_ok) for i, value in enumerate(labels)]
    columns["idx"] = _glue_idx(task, split, raw)
    return columns


def _answers(task: Task, raw: _Raw, i: int, value: Any) -> dict[str, list]:
    """HF's {"text": [...], "answer_start": [...]} from that layout or SQuAD's [{"text", "answer_start"}]."""
    if isinstance(value, list):
        if not all(isinstance(a, dict) and "text" in a and "answer_start" in a for a in value):
            raise TaskDataError(f"{raw.locate(i)}: answers should be objects with 'text' and 'answer_start'.")
        value = {"text": [a["text"] for a in value], "answer_start": [a["answer_start"] for a in value]}
    if not (
        isinstance(value, dict)
        and isinstance(value.get("text"), list)
        and isinstance(value.get("answer_start"), list)
    ):
        raise TaskDataError(
            f"{raw.locate(i)}: answers should be {{'text': [...], 'answer_start': [...]}}, found {value!r}."
        )
    texts, starts = value["text"], [_int(raw, i, s, "answer_start") for s in value["answer_start"]]
    if len(texts) != len(starts) or not all(isinstance(t, str) for t in texts) or any(s < 0 for s in starts):
        raise TaskDataError(
            f"{raw.locate(i)}: answers need as many texts as non-negative starts, found {value!r}."
        )
    if not texts and not task.allows_no_answer:
        raise TaskDataError(
            f"{raw.locate(i)}: a question without answers in {task.name} (SQuAD v1.1 questions all have one; "
            "unanswerable questions belong to squad_v2)."
        )
    return {"text": list(texts), "answer_start": starts}


def _canonical_span(task: Task, split: str, raw: _Raw) -> dict[str, list]:
    """SQuAD v1.1 / v2.0."""
    ids = [
        str(v) if isinstance(v, int) else _text(raw, i, v, "id")
        for i, v in enumerate(_column(task, raw, "id"))
    ]
    titles = _column(task, raw, "title", required=False)
    contexts = _texts(raw, _column(task, raw, "context"), "context")
    return {
        "id": ids,
        "title": [""] * raw.num_rows
        if titles is None
        else ["" if t is None else _text(raw, i, t, "title") for i, t in enumerate(titles)],
        "context": contexts,
        "question": _texts(raw, _column(task, raw, "question"), "question"),
        "answers": [_answers(task, raw, i, v) for i, v in enumerate(_column(task, raw, "answers"))],
    }


def _endings(task: Task, raw: _Raw) -> list[list[str]]:
    n = task.num_choices
    if "endings" in raw.columns:
        rows = raw.columns["endings"]
        names = None
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
            empty = (
                ""
                if names is None
                else " (empty: "
                + ", ".join(name for name, e in zip(names, row) if not (isinstance(e, str) and e.strip()))
                + ")"
            )
            raise TaskDataError(f"{raw.locate(i)}: {len(present)} endings, expected {n}{empty}.")
        endings.append(present)
    return endings


def _canonical_choices(task: Task, split: str, raw: _Raw) -> dict[str, list]:
    """SWAG."""
    unlabeled_ok = split in task.test_splits
    labels = _column(task, raw, "label", required=not unlabeled_ok)
    return {
        "context": _texts(raw, _column(task, raw, "context"), "context"),
        "question": _texts(raw, _column(task, raw, "question"), "question"),
        "endings": _endings(task, raw),
        "label": [-1] * raw.num_rows
        if labels is None
        else [_class_id(task, raw, i, v, unlabeled_ok) for i, v in enumerate(labels)],
    }


def _canonical_tokens(task: Task, split: str, raw: _Raw) -> dict[str, list]:
    """CoNLL-2003."""
    ids = _column(task, raw, "id", required=False)
    tokens = _column(task, raw, "tokens")
    tags = _column(task, raw, "ner_tags")
    out: dict[str, list] = {"id": [], "tokens": [], "ner_tags": []}
    for i in range(raw.num_rows):
        words, labels = tokens[i], tags[i]
        if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
            raise TaskDataError(f"{raw.locate(i)}: 'tokens' should be a list of strings, found {words!r}.")
        if not isinstance(labels, list) or len(labels) != len(words):
            raise TaskDataError(
                f"{raw.locate(i)}: 'ner_tags' should be a list of one tag per token, found {labels!r}."
            )
        out["id"].append(str(i) if ids is None or ids[i] is None else str(ids[i]))
        out["tokens"].append(words)
        out["ner_tags"].append([_class_id(task, raw, i, tag, False, what="NER tag") for tag in labels])
    return out


_CANONICALISE: dict[str, Callable[[Task, str, _Raw], dict[str, list]]] = {
    "classification": _canonical_sentences,
    "regression": _canonical_sentences,
    "span": _canonical_span,
    "multiple_choice": _canonical_choices,
    "token_classification": _canonical_tokens,
}


# --------------------------------------------------------------------------------------------------------
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


def _drop_misaligned_answers(task: Task, raw: _Raw, columns: dict[str, list]) -> dict[str, list]:
    """Training questions whose first answer is not at its answer_start are skipped, and counted."""
    cache: dict = {}
    keep = [
        not answers["text"]
        or answer_is_aligned(context, answers["text"][0], answers["answer_start"][0], cache)
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


# --------------------------------------------------------------------------------------------------------
# The entry point


def _read_sources(task: Task, source: Source, hub_cache_dir: PathLike | None) -> dict[str, _Raw]:
    if source is None:
        return _read_hub(task, hub_cache_dir)
    files = _local_files(task, source)
    return {split: _concat([_read_file(path, task) for path in paths]) for split, paths in files.items()}


def _canonical_split_dataset(task: Task, split: str, raw: _Raw) -> datasets.Dataset:
    if raw.num_rows == 0:
        raise TaskDataError(f"{raw.source}: the {split} split of {task.name} is empty (no data rows).")
    columns = _CANONICALISE[task.kind](task, split, raw)
    if task.kind == "span" and split == "train":
        columns = _drop_misaligned_answers(task, raw, columns)
        if not columns["id"]:
            raise TaskDataError(f"{raw.source}: no training question of {task.name} has an aligned answer.")
    return datasets.Dataset.from_dict(columns, features=canonical_features(task), split=split)


def load_task_data(
    task: Task | str,
    data_dir_or_files: Source = None,
    *,
    hub_cache_dir: PathLike | None = None,
) -> datasets.DatasetDict:
    """The splits of ``task`` in canonical form, from the Hub (no path) or from local files (see module doc).

    ``data_dir_or_files``: a directory (original layout or exports named by split), one file named after its
    split, or a mapping {split: file or list of files}. Splits not found are absent from the result.
    Raises `TaskDataError` on bad input, naming the file, the row and what was expected.
    """
    task = get_task(task)
    raws = _read_sources(task, data_dir_or_files, hub_cache_dir)
    if not raws:
        raise TaskDataError(f"no split of {task.name} found; expected {describe_sources(task)}.")
    ordered = [split for split in task.splits if split in raws]
    return datasets.DatasetDict(
        {split: _canonical_split_dataset(task, split, raws[split]) for split in ordered}
    )


__all__ = [
    "TaskDataError",
    "answer_is_aligned",
    "canonical_columns",
    "canonical_features",
    "describe_sources",
    "iob1_to_iob2",
    "load_task_data",
    "split_aliases",
]
