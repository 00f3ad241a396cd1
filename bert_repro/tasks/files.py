"""Reading the fine-tuning tasks' data, from the Hub or from the files people have, in one canonical form.

`load_task_data(task, source)` returns a `datasets.DatasetDict` with canonical split names and the columns of the
task's kind (`TaskKind.features`), from the Hub, a directory in the task's original layout, exports named by split
(also Hub-style shards under ``data/``), or files per split (docs/finetuning.md).

Bad input fails early with a `TaskDataError` naming the file, the line (1-based) or row (0-based) and what was
expected (`bert_repro.tasks.columns`). Every row is checked in Python, so MNLI from the Hub takes a few seconds.
"""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets

from ..data.hub_datasets import HubUnreachable, load_hub_dataset
from .columns import RawSplit, TaskDataError, answer_is_aligned
from .registry import Task, get_task

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
Source = PathLike | Mapping[str, PathLike | Sequence[PathLike]] | None

EXPORT_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv", ".tsv")
VALIDATION_ALIASES = ("dev", "val", "valid")  # file names may say these for "validation"
_SHARD = "-[0-9]*-of-[0-9]*"  # Hub parquet shards: train-00000-of-00002.parquet


# Split names


def split_aliases(split: str) -> tuple[str, ...]:
    """The names a canonical split may go by in file names and mappings ("validation": "dev", "val"...)."""
    if "validation" not in split:
        return (split,)
    return (split,) + tuple(split.replace("validation", alias) for alias in VALIDATION_ALIASES)


def _canonical_split(task: Task, name: str) -> str | None:
    return next((split for split in task.splits if name.strip().lower() in split_aliases(split)), None)


# Describing what is accepted


def describe_sources(task: Task | str) -> str:
    """A short text listing the file layouts accepted for ``task`` (used in error messages)."""
    task = get_task(task)
    original = "/".join(names[0] for names in task.original_files.values())
    kind_of_layout = {
        "glue_tsv": "GLUE layout, tab-separated, read literally unless CSV-quoted throughout",
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
    return tuple(task.kind.features(task))


# Readers: one per file format, each returning a RawSplit


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise TaskDataError(f"{path}: not UTF-8 text ({error}).") from error


def _delimited_columns(path: Path, task: Task, records: list[tuple[int, list[str]]], separator: str) -> RawSplit:
    """The columns of (line number, fields) records; no header when the task's files have none (CoLA train/dev)."""
    if not records:
        raise TaskDataError(f"{path}: empty file.")
    header, rows = records[0][1], records[1:]
    known = {"label", "idx", "id", "index", *task.text_columns, *(n for ns in task.source_columns.values() for n in ns)}
    if task.headerless_columns is not None and not (set(header) & known):
        header, rows = list(task.headerless_columns), records
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
    return RawSplit(columns, len(lines), str(path), lambda i: f"{path}, line {lines[i]}")


class _LastRow:
    """The file object of a csv.writer that keeps only the last row written (one row's text at a time)."""

    text = ""

    def write(self, text: str) -> None:
        self.text = text


def _csv_quoted_tsv(text: str) -> tuple[list[tuple[int, list[str]]] | None, str | None, str | None]:
    """(records if every one round-trips through csv.writer's QUOTE_MINIMAL or QUOTE_ALL, else None; the first
    CSV-quoted line; the first line that does not fit). GLUE's own TSVs fail: MRPC holds unquoted ``"the witness"``.
    """
    pieces = re.findall(r"[^\n]*\n|[^\n]+\Z", text)  # the lines, each with its "\n" (the last may lack it)
    reader = csv.reader(pieces, delimiter="\t", quotechar='"', doublequote=True, strict=True)
    row = _LastRow()
    writers = {
        style: csv.writer(row, delimiter="\t", quotechar='"', lineterminator="\n", quoting=style)
        for style in (csv.QUOTE_MINIMAL, csv.QUOTE_ALL)
    }
    fits = dict.fromkeys(writers, True)
    records: list[tuple[int, list[str]]] = []
    first_quoted = first_misfit = None
    start = 1
    try:
        for fields in reader:
            end = reader.line_num
            raw = "".join(pieces[start - 1 : end])  # line ends are "\n" (_read_text: universal newlines)
            raw += "" if raw.endswith("\n") else "\n"
            if fields:
                records.append((start, fields))
                for style, writer in writers.items():
                    writer.writerow(fields)
                    fits_here = row.text == raw
                    fits[style] = fits[style] and fits_here
                    if fits_here and (fits[style] or style == csv.QUOTE_MINIMAL) and '"' in raw:
                        first_quoted = first_quoted or f"line {start}"
                if first_misfit is None and not any(fits.values()):
                    first_misfit = f"line {start}"
            start = end + 1
    except csv.Error as error:
        return None, first_quoted, f"line {reader.line_num} ({error})"
    return (records if any(fits.values()) else None), first_quoted, first_misfit


def _read_tsv(path: Path, task: Task) -> RawSplit:
    """A TSV read literally (GLUE's convention) unless a datasets/pandas export's CSV quoting is undone; logged."""
    text = _read_text(path)
    records = None
    if '"' in text:
        records, first_quoted, first_misfit = _csv_quoted_tsv(text)
        if records is not None:
            logger.info(
                "%s: read with CSV-style quoting (a datasets/pandas export: quoted fields, inner quotes "
                "doubled, first at %s); the quote marks that do this are not part of the text",
                path,
                first_quoted,
            )
        elif first_quoted is not None:
            logger.warning(
                "%s: read literally, as GLUE's own TSVs are (every quote mark kept as text), although %s "
                "looks like a CSV-quoted field: %s does not follow CSV quoting. If the file is a "
                "datasets/pandas export, export it again as parquet or csv.",
                path,
                first_quoted,
                first_misfit,
            )
    if records is None:
        records = [
            (number, line.rstrip("\r").split("\t"))
            for number, line in enumerate(text.split("\n"), start=1)
            if line.rstrip("\r")
        ]
    return _delimited_columns(path, task, records, "tab")


def _read_csv(path: Path, task: Task) -> RawSplit:
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
    return _delimited_columns(path, task, records, "comma")


def _read_parquet(path: Path) -> RawSplit:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises several types for a file that is not parquet
        raise TaskDataError(f"{path}: not a readable parquet file ({error}).") from error
    return RawSplit(table.to_pydict(), table.num_rows, str(path), lambda i: f"{path}, row {i}")


def _columns_from_records(path: Path, records: list, where: Callable[[int], str]) -> RawSplit:
    names: dict[str, None] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise TaskDataError(f"{where(i)}: expected a JSON object (one row), found {type(record).__name__}.")
        names.update(dict.fromkeys(record))
    columns = {name: [record.get(name) for record in records] for name in names}
    return RawSplit(columns, len(records), str(path), where)


def _read_jsonl(path: Path, text: str) -> RawSplit:
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


def _read_json(path: Path, task: Task) -> RawSplit:
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
        if task.original_format != "squad_json":
            raise TaskDataError(f"{path}: a SQuAD-format JSON file, but {task.name} is a {task.kind.name} task.")
        return _read_squad_json(path, value["data"], task)
    records = value if isinstance(value, list) else [value]
    return _columns_from_records(path, records, lambda i: f"{path}, record {i}")


def _read_squad_json(path: Path, articles: Any, task: Task) -> RawSplit:
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
                for name, value in zip(columns, (qa["id"], title, context, qa["question"], answers)):
                    columns[name].append(value)
                places.append(place)
    return RawSplit(columns, len(places), str(path), lambda i: places[i])


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (``I-X`` opens an entity unless it continues one of type X) to IOB2; IOB2 input comes back unchanged."""
    converted: list[str] = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
        previous = tag
    return converted


def _read_conll(path: Path, task: Task) -> RawSplit:
    """CoNLL-2003 column files: 'token POS chunk NER' per line, sentences split by blank and ``-DOCSTART-`` lines."""
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
                f"{path}, line {number}: unknown NER tag {fields[3]!r}; expected one of {', '.join(task.label_names)}."
            )
        if not tokens:
            starts.append(number)
        tokens.append(fields[0])
        tags.append(fields[3])
    close_sentence()
    columns = {"id": ids, "tokens": sentences, "ner_tags": sentence_tags}
    return RawSplit(columns, len(ids), str(path), lambda i: f"{path}, line {starts[i]}")


def _read_file(path: Path, task: Task) -> RawSplit:
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
    raise TaskDataError(f"{path}: cannot read this kind of file for {task.name}. Expected: {describe_sources(task)}.")


def _concat(parts: list[RawSplit]) -> RawSplit:
    """Shards of one split as one RawSplit; every shard must have the same columns."""
    if len(parts) == 1:
        return parts[0]
    for part in parts[1:]:
        if set(part.columns) != set(parts[0].columns):
            raise TaskDataError(
                f"{part.source}: columns {list(part.columns)} differ from those of {parts[0].source}: "
                f"{list(parts[0].columns)}."
            )
    columns = {name: [value for part in parts for value in part.columns[name]] for name in parts[0].columns}
    offsets = [0, *itertools.accumulate(part.num_rows for part in parts)]

    def locate(i: int) -> str:
        k = bisect.bisect_right(offsets, i) - 1
        return parts[k].locate(i - offsets[k])

    return RawSplit(columns, offsets[-1], ", ".join(part.source for part in parts), locate)


# Finding the files of each split


def _command_line_form(files: Mapping[str, Path]) -> str:
    """The recipes' way to name files per split, for error messages: ``--data train=PATH validation=PATH``."""
    return "--data " + " ".join(f"{split}={path}" for split, path in files.items())


def _files_in_directory(task: Task, directory: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    ambiguous: dict[str, list[tuple[Path, ...]]] = {}
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
            ambiguous[split] = candidates
        if candidates:
            found[split] = list(candidates[0])
    if ambiguous:
        split, candidates = next(iter(ambiguous.items()))
        names = "; ".join(", ".join(p.name for p in c) for c in candidates)
        raise TaskDataError(
            f"{directory}: several candidates for the {split} split of {task.name} ({names}); keep one, "
            "or name the file of each split: "
            f"{_command_line_form({s: paths[0] for s, paths in found.items()})} "
            "(in Python, a mapping {split: path})."
        )
    return found


def _split_of_file(task: Task, path: Path) -> str | None:
    split = next((split for split, names in task.original_files.items() if path.name in names), None)
    return split or _canonical_split(task, re.match(r"[A-Za-z_]*", path.name).group(0))


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
                f"{path}: cannot tell which split of {task.name} this file holds; name it after the split "
                f"(train.*, validation.*, ...) or say it: {_command_line_form({'train': path})}."
            )
        return {split: [path]}
    raise TaskDataError(f"{path}: no such file or directory. Pass a directory or files ({describe_sources(task)}).")


def _read_hub(task: Task, cache_dir: PathLike | None) -> dict[str, RawSplit]:
    label = task.hub_id + (f" ({task.hub_config})" if task.hub_config else "")
    try:
        loaded = load_hub_dataset(task.hub_id, task.hub_config, cache_dir=cache_dir)
    except Exception as error:  # offline, unknown id, ...: say what to do instead
        cause = str(error) if isinstance(error, HubUnreachable) else f"{type(error).__name__}: {error}"
        raise TaskDataError(
            f"could not load {label} from the Hub ({cause}). Offline? Pass local files instead with "
            f"--data: {describe_sources(task)}."
        ) from error
    raws: dict[str, RawSplit] = {}
    for name, dataset in loaded.items():
        split = _canonical_split(task, name)
        if split is None:
            logger.info("%s: ignoring split %r of %s", task.name, name, label)
            continue
        where = f"{label} {name}"
        raws[split] = RawSplit(dataset.to_dict(), len(dataset), where, lambda i, where=where: f"{where}, row {i}")
    return raws


# The entry point


def load_task_data(
    task: Task | str, data_dir_or_files: Source = None, *, hub_cache_dir: PathLike | None = None
) -> datasets.DatasetDict:
    """The splits of ``task`` found in canonical form; `TaskDataError` on bad input.

    ``data_dir_or_files``: None (the Hub), a directory, one file named after its split, or {split: file(s)}.
    """
    task = get_task(task)
    if data_dir_or_files is None:
        raws = _read_hub(task, hub_cache_dir)
    else:
        files = _local_files(task, data_dir_or_files).items()
        raws = {split: _concat([_read_file(path, task) for path in paths]) for split, paths in files}
    if not raws:
        raise TaskDataError(f"no split of {task.name} found; expected {describe_sources(task)}.")
    splits = {}
    for split in [split for split in task.splits if split in raws]:
        if raws[split].num_rows == 0:
            raise TaskDataError(f"{raws[split].source}: the {split} split of {task.name} is empty (no data rows).")
        columns = task.kind.canonicalise(task, split, raws[split])
        splits[split] = datasets.Dataset.from_dict(columns, features=task.kind.features(task), split=split)
    return datasets.DatasetDict(splits)


__all__ = [
    "TaskDataError",
    "answer_is_aligned",
    "canonical_columns",
    "describe_sources",
    "iob1_to_iob2",
    "load_task_data",
    "split_aliases",
]
