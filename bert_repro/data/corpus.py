"""Reading a pre-training corpus (text files, tables, a Hub dataset) as a `datasets.Dataset` with one row a document.

NSP needs document boundaries (paper §3.1: "it is critical to use a document-level corpus rather than a shuffled
sentence-level corpus"). Plain text is split into documents at blank lines (the reference's input format) or per
file. Empty and binary documents are skipped with a logged count; text that is not UTF-8 is decoded with a warning,
never damaged silently; a corpus with no text is one `CorpusError` before any dataset is built.
"""

from __future__ import annotations

import codecs
import glob
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from datasets.exceptions import DatasetGenerationError

from .hub_datasets import HubUnreachable, load_hub_dataset
from .sentences import MAX_SENTENCE_CHARS, SENTENCE_END_CHARS, SENTENCE_PIECE_CHARS, looks_like_binary

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".text", ".md")
TABLE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "csv"}
HOW_TO_PASS_LOCAL_TEXT = (
    "Pass local text instead: a folder of .txt files (--corpus path/to/folder), text files or a glob, or "
    ".jsonl / .parquet / .csv files with a text column (--text_column NAME). With make: make quickstart "
    "CORPUS=path/to/folder."
)


_KNOWN_SUFFIXES = TEXT_SUFFIXES + tuple(TABLE_FORMATS)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "wikitext" or "Salesforce/wikitext"


class CorpusError(ValueError):
    """A corpus that cannot be read; the message names the source and what was expected."""


def _expand(source: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path] | None:
    """Local files named by `source`, or None when `source` names no local path (a Hub id, then)."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    files: list[Path] = []
    for item in items:
        text = os.fspath(item)
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _KNOWN_SUFFIXES)
            if not found:
                raise CorpusError(f"{path} holds no .txt, .jsonl, .parquet or .csv files.")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif any(ch in text for ch in "*?["):
            matched = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
            if not matched:
                raise CorpusError(f"No file matches {text!r}.")
            files.extend(matched)
        elif len(items) == 1 and _HUB_ID.fullmatch(text) and path.suffix.lower() not in _KNOWN_SUFFIXES:
            return None
        else:
            raise CorpusError(f"{text}: no such file or directory.")
    return files


# Text in another 8-bit encoding almost never holds a multi-byte UTF-8 sequence: a file with some is UTF-8 with
# stray bytes rather than latin-1.
_UTF8_MULTIBYTE = re.compile(rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}")
# Files are read in blocks or line by line, never whole: the memory is that of the largest document.
_READ_BLOCK = 1 << 20
_HEAD_BYTES = 1 << 20
_WRITER_BATCH_ROWS = 100
# Verse and enumerations in real books reach a few thousand characters without sentence punctuation (cut quietly);
# ten times the cut bound is a list, a table or text without punctuation: the file is named in a warning.
_WARN_STRETCH_CHARS = 10 * MAX_SENTENCE_CHARS
_CP1252_UNDEFINED = b"\x81\x8d\x8f\x90\x9d"


@dataclass(frozen=True)
class _Encoding:
    codec: str
    errors: str = "strict"
    warning: str | None = None


def _blocks(name: str) -> Iterator[bytes]:
    with open(name, "rb") as f:
        while block := f.read(_READ_BLOCK):
            yield block


def _decodes(blocks: Iterable[bytes], codec: str) -> bool:
    decoder = codecs.getincrementaldecoder(codec)("strict")
    try:
        for block in blocks:
            decoder.decode(block)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _has_utf8_multibyte(blocks: Iterable[bytes]) -> bool:
    tail = b""
    for block in blocks:
        if _UTF8_MULTIBYTE.search(tail + block):
            return True
        tail = block[-3:]  # a sequence cut by the block boundary
    return False


def _first_non_ascii(text: str, context: int = 12) -> str:
    i = next((i for i, ch in enumerate(text) if ord(ch) > 127), 0)
    return text[max(0, i - context) : i + context]


def _encoding_of(head: bytes, blocks: Callable[[], Iterable[bytes]]) -> _Encoding | None:
    """How to decode bytes that start with ``head`` (``blocks()`` reads them all again), or None when not text.

    A UTF-16 byte-order mark is honoured; bytes that are not UTF-8 are Windows-1252 (latin-1 where that leaves a
    byte undefined), unless they hold multi-byte UTF-8 sequences: then the stray bytes are replaced.
    """
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return _Encoding("utf-16") if _decodes(blocks(), "utf-16") else None
    if b"\x00" in head[:65536]:
        return None
    if _decodes(blocks(), "utf-8-sig"):
        text = head.decode("utf-8-sig", errors="ignore")  # the block may end inside a character
        return None if looks_like_binary(text[:65536]) else _Encoding("utf-8-sig")
    if _has_utf8_multibyte(blocks()):
        if looks_like_binary(head.decode("utf-8", errors="replace")):
            return None
        return _Encoding(
            "utf-8-sig",
            "replace",
            "{name}: {bad} byte(s) are not UTF-8 and were replaced by U+FFFD "
            "(the rest is UTF-8); convert the file to UTF-8 to keep those characters",
        )
    codec, label = "cp1252", "Windows-1252"
    if any(_CP1252_UNDEFINED[i : i + 1] in block for block in blocks() for i in range(5)):
        codec, label = "latin-1", "latin-1"
    text = head.decode(codec)
    if looks_like_binary(text):
        return None
    return _Encoding(
        codec,
        "strict",
        f"{{name}} is not UTF-8: read as {label} (e.g. {_first_non_ascii(text)!r}); "
        "convert it to UTF-8 if that is not its encoding",
    )


def decode_text(raw: bytes, name: str = "text", *, warn: bool = True) -> str | None:
    """The text of a file's bytes (decoded by ``_encoding_of``'s rules, with a warning naming `name`), or None."""
    encoding = _encoding_of(raw[:_HEAD_BYTES], lambda: [raw])
    if encoding is None:
        return None
    text = raw.decode(encoding.codec, encoding.errors)
    if warn and encoding.warning:
        logger.warning(encoding.warning.format(name=name, bad=text.count("\ufffd")))
    return text


def detect_encoding(name: str) -> _Encoding | None:
    with open(name, "rb") as f:
        head = f.read(_HEAD_BYTES)
    return _encoding_of(head, lambda: _blocks(name))


def _open_text(name: str, encoding: _Encoding):
    # newline="": lines keep their own ends ("\r\n" stays), so a file read whole is its text unchanged.
    return open(name, encoding=encoding.codec, errors=encoding.errors, newline="")


_SENTENCE_ENDS = re.compile(f"[{re.escape(SENTENCE_END_CHARS)}]")


class _UnpunctuatedStretch:
    """The longest stretch without sentence punctuation or a blank line, fed line by line (an overlong "sentence")."""

    def __init__(self) -> None:
        self.run = self.longest = self.longest_line = self.line = self._run_start = 0

    def feed(self, line: str) -> None:
        self.line += 1
        if not line.strip():
            self.run = 0
            return
        for k, piece in enumerate(_SENTENCE_ENDS.split(line)):
            if k or self.run == 0:  # a stretch starts after a sentence end or a blank line
                self.run, self._run_start = 0, self.line
            self.run += len(piece)
            if self.run > self.longest:
                self.longest, self.longest_line = self.run, self._run_start


def _file_documents(name: str, document_boundary: str) -> Iterator[str]:
    encoding = detect_encoding(name)
    if encoding is None:
        logger.warning("skipped %s: not text (binary content)", name)
        return
    stretch = _UnpunctuatedStretch()
    replaced = 0
    with _open_text(name, encoding) as f:
        current: list[str] = []
        for raw in f:
            stretch.feed(raw)
            if encoding.errors == "replace":
                replaced += raw.count("\ufffd")
            if document_boundary == "file":
                current.append(raw)
                continue
            for line in raw.splitlines() or [raw]:
                if line.strip():
                    current.append(line)
                elif current:
                    yield "\n".join(current)
                    current = []
        if current:
            yield ("" if document_boundary == "file" else "\n").join(current)
    if encoding.warning:
        logger.warning(encoding.warning.format(name=name, bad=replaced))
    if stretch.longest > _WARN_STRETCH_CHARS:
        logger.warning(
            "%s: %d characters without sentence punctuation (%s) or a blank line, from line %d: text without "
            "sentences (a list, a table, one long line). Each stretch over %d characters is cut into pieces of at "
            "most %d characters at spaces, which are used as sentences (bert_repro.data.sentences); check the file "
            "if that is not what it holds",
            name,
            stretch.longest,
            " ".join(SENTENCE_END_CHARS),
            stretch.longest_line,
            MAX_SENTENCE_CHARS,
            SENTENCE_PIECE_CHARS,
        )


def _text_documents(files: list[str], document_boundary: str, stamps=None) -> Iterator[dict[str, str]]:
    """`stamps` (sizes and modification times) is unused: in datasets' cache key, it makes an edited file read again."""
    for name in files:
        for piece in _file_documents(name, document_boundary):
            if piece.strip():
                yield {"text": piece, "source": name}


def load_corpus(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    text_column: str = "text",
    document_boundary: str = "blank_line",
    hub_config: str | None = None,
    split: str = "train",
    streaming: bool = False,
    num_proc: int | None = None,
    cache_dir: str | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """Documents in a `text` column from a folder, glob, file list, table files or a Hub id (``hub_config``, ``split``);
    ``document_boundary="wikitext"`` joins WikiText's rows into articles at its " = Title = " headings."""
    if document_boundary not in ("file", "blank_line", "wikitext"):
        raise CorpusError(f"document_boundary must be 'file', 'blank_line' or 'wikitext', got {document_boundary!r}.")
    files = _expand(source)
    if files is None:
        dataset = _select_text(
            _load_hub(str(source), hub_config, split, streaming, cache_dir), text_column, str(source)
        )
        if document_boundary == "wikitext":
            dataset = _wikitext_articles(dataset, streaming)
        return dataset
    if not files:
        raise CorpusError(f"{source}: no input files. {HOW_TO_PASS_LOCAL_TEXT}")

    text_files = [str(f) for f in files if f.suffix.lower() in TEXT_SUFFIXES or f.suffix == ""]
    table_files = [f for f in files if f.suffix.lower() in TABLE_FORMATS]
    other = [str(f) for f in files if str(f) not in text_files and f not in table_files]
    if other:
        raise CorpusError(f"Unsupported corpus file type: {other[0]} (expected .txt, .jsonl, .parquet, .csv, .tsv).")
    parts = []
    if empty := [str(f) for f in table_files if f.stat().st_size == 0]:
        logger.warning("skipped %d empty files: %s", len(empty), _listing(empty))
        table_files = [f for f in table_files if str(f) not in empty]
        if not table_files and not text_files:
            raise CorpusError(f"{source}: the corpus holds no text (every file is empty). {HOW_TO_PASS_LOCAL_TEXT}")
    if text_files and not any(_holds_text(name) for name in text_files):
        if not table_files:
            raise CorpusError(
                f"{source}: the corpus holds no text (every file is empty or not text: "
                f"{_listing(text_files)}). {HOW_TO_PASS_LOCAL_TEXT}"
            )
        logger.warning("skipped %d text files: every one is empty or not text", len(text_files))
        text_files = []
    if text_files:
        dataset = datasets.Dataset.from_generator(
            _text_documents,
            gen_kwargs={
                "files": text_files,
                "document_boundary": document_boundary,
                "stamps": [(os.stat(n).st_size, os.stat(n).st_mtime_ns) for n in text_files],
            },
            features=datasets.Features({"text": datasets.Value("string"), "source": datasets.Value("string")}),
            num_proc=min(num_proc or 1, len(text_files)),
            cache_dir=cache_dir,
            # Rows are buffered until a batch is written: 1,000 (the default) books of several MB would be GBs.
            writer_batch_size=_WRITER_BATCH_ROWS,
        )
        # Counted in Arrow: a column of millions of documents is never turned into Python strings.
        skipped = len(text_files) - pc.count_distinct(dataset.data.column("source")).as_py()
        if skipped:
            logger.warning("%d of %d text files gave no document (empty or binary)", skipped, len(text_files))
        parts.append(dataset.select_columns(["text"]))
    for fmt in sorted({TABLE_FORMATS[f.suffix.lower()] for f in table_files}):
        names = [str(f) for f in table_files if TABLE_FORMATS[f.suffix.lower()] == fmt]
        kwargs = {"delimiter": "\t"} if fmt == "csv" and all(n.endswith(".tsv") for n in names) else {}
        parts.append(_select_text(_load_table(fmt, names, cache_dir, kwargs), text_column, ", ".join(names)))
    dataset = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    return _drop_empty(dataset, str(source), num_proc)


def _load_table(fmt: str, names: list[str], cache_dir: str | None, kwargs: dict) -> datasets.Dataset:
    """A file that cannot be parsed is a CorpusError naming it and the parser's reason (datasets hides the reason)."""
    try:
        table = datasets.load_dataset(fmt, data_files=names, split="train", cache_dir=cache_dir, **kwargs)
        table.data.table.validate(full=True)  # Arrow's JSON parser lets a string hold bytes that are not UTF-8
        return table
    except (DatasetGenerationError, ValueError, OSError, pa.ArrowException) as err:
        if len(names) > 1:  # find the file at fault: each alone
            for name in names:
                _load_table(fmt, [name], cache_dir, kwargs)
        cause = err.__cause__ or err
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise CorpusError(f"{_listing(names)}: not readable as {fmt} ({reason}).") from None


def _holds_text(name: str) -> bool:
    """Whether a text file gives a document (stops at the first, so a corpus is usually checked in one file)."""
    if not any(block.strip() for block in _blocks(name)):
        return False
    encoding = detect_encoding(name)
    if encoding is None:
        return False
    with _open_text(name, encoding) as f:
        return any(block.strip() for block in iter(lambda: f.read(_READ_BLOCK), ""))


def _listing(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")
_WIKITEXT_HEADING = re.compile(r"^ (= )+.*( =)+ $")


def wikitext_articles(lines) -> Iterator[dict[str, str]]:
    """WikiText rows (one line each) -> articles: a new one at each " = Title = ", heading lines dropped."""
    article: list[str] = []
    for line in lines:
        line = line.rstrip("\n")
        if _WIKITEXT_TITLE.match(line):
            if article:
                yield {"text": "\n\n".join(article)}
            article = []
        elif line.strip() and not _WIKITEXT_HEADING.match(line):
            article.append(line.strip())
    if article:
        yield {"text": "\n\n".join(article)}


def _wikitext_articles(dataset, streaming: bool):
    if streaming:
        return datasets.IterableDataset.from_generator(lambda: wikitext_articles(row["text"] for row in dataset))
    return datasets.Dataset.from_generator(wikitext_articles, gen_kwargs={"lines": dataset["text"]})


def _select_text(dataset, text_column: str, where: str):
    columns = dataset.column_names or []
    if text_column not in columns:
        raise CorpusError(
            f"{where} has no column {text_column!r}; its columns are {columns}. Pass the right one with text_column."
        )
    if text_column != "text":
        dataset = dataset.rename_column(text_column, "text")
    return dataset.select_columns(["text"])


def _drop_empty(dataset: datasets.Dataset, where: str, num_proc: int | None) -> datasets.Dataset:
    kept = dataset.filter(lambda t: isinstance(t, str) and bool(t.strip()), input_columns="text", num_proc=num_proc)
    if len(kept) < len(dataset):
        logger.warning("%s: skipped %d empty documents", where, len(dataset) - len(kept))
    if len(kept) == 0:
        raise CorpusError(f"{where}: the corpus holds no text. {HOW_TO_PASS_LOCAL_TEXT}")
    return kept


def _load_hub(repo_id: str, config: str | None, split: str, streaming: bool, cache_dir: str | None):
    """Fails within seconds, saying how to pass local text, when the Hub is out of reach and nothing is cached."""
    try:
        return load_hub_dataset(repo_id, config, split=split, streaming=streaming, cache_dir=cache_dir)
    except HubUnreachable as err:
        raise CorpusError(
            f"{repo_id!r} is neither a local path nor reachable on the Hub ({err}). {HOW_TO_PASS_LOCAL_TEXT}"
        ) from None
    except (ConnectionError, OSError, FileNotFoundError, ValueError) as err:
        raise CorpusError(
            f"Could not load the Hub dataset {repo_id!r} (config {config!r}, split {split!r}): {err}. "
            f"{HOW_TO_PASS_LOCAL_TEXT}"
        ) from err
