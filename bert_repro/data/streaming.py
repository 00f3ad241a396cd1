"""Pre-training examples from a corpus read as a stream, with no Arrow copy on disk.

Documents are tokenized and built into instances by the map-style pipeline's own code, and leave through a shuffle
buffer, pass after pass for ever; pass p builds round ``p % dupe_factor`` (the reference's copies). Local
``.txt``/``.jsonl`` files resume at a byte offset; a ``datasets`` stream resumes at its current shard.

The approximation (docs/pretraining.md): the reference draws NotNext's segment B from any other document, which needs
random access; here it comes from the ``document_buffer`` documents before A's, by the reference's rule. Its final
shuffle is a buffer of ``shuffle_buffer`` examples. ``state_dict()`` is JSON, and resuming from it gives exactly the
examples of an uninterrupted stream.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import TrainerCallback

from ..atomic import write_text
from .corpus import (
    HOW_TO_PASS_LOCAL_TEXT,
    TABLE_FORMATS,
    TEXT_SUFFIXES,
    CorpusError,
    _expand,
    _select_text,
    decode_text,
    load_corpus,
)
from .masking import WordPieceVocab
from .pretraining_config import PreTrainingDataConfig
from .pretraining_examples import _append_instance, _config_features
from .tokenized_documents import (
    _tokenize_batch,  # the map-style pipeline's own sentence split + WordPiece, so both tokenize alike
)
from .training_instances import create_instances_from_document, document_rng

__all__ = [
    "DATA_STATE",
    "DataStateCallback",
    "DatasetDocuments",
    "StreamingExamples",
    "TextFileDocuments",
    "WorkerStreams",
    "first_documents",
    "load_data_state",
    "open_document_source",
    "open_stream",
    "text_digest",
]

logger = logging.getLogger(__name__)

#: File name of a process's stream state inside a ``checkpoint-N`` folder.
DATA_STATE = "data_state-rank{rank}.json"
STATE_VERSION = 1


def text_digest(text: str) -> str:
    """Recognises held-out documents in the stream."""
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


class TextFileDocuments:
    """This process's share of the documents of local ``.txt`` and ``.jsonl`` files, read line by line.

    The position (file, byte offset after the last document yielded) advances before each yield; ``documents_read``
    counts documents parsed, kept or not.
    """

    def __init__(
        self,
        files: Sequence[str | os.PathLike],
        *,
        document_boundary: str = "blank_line",
        text_column: str = "text",
        rank: int = 0,
        world_size: int = 1,
        max_documents: int | None = None,
    ) -> None:
        if document_boundary not in ("blank_line", "file"):
            raise CorpusError(
                f"streaming local text needs document_boundary 'blank_line' or 'file', got {document_boundary!r}"
            )
        files = [str(f) for f in files]
        if not files:
            raise CorpusError(f"no input files to stream. {HOW_TO_PASS_LOCAL_TEXT}")
        self.document_boundary, self.text_column = document_boundary, text_column
        # Whole files per process when there are enough of them; else every process reads every file and keeps
        # every world_size-th document (reading is cheap next to tokenizing and training).
        if len(files) >= world_size:
            self.files, self._every, self._keep = files[rank::world_size], 1, 0
        else:
            self.files, self._every, self._keep = files, world_size, rank
        self.max_documents, self.documents_read = max_documents, 0
        self.rewind()
        self._warned: set[str] = set()  # files whose encoding was already reported

    def rewind(self) -> None:
        self._position = {"file": 0, "offset": 0, "row": 0, "kept": 0}

    def state_dict(self) -> dict[str, Any]:
        return {"files": len(self.files), **self._position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("files") != len(self.files):
            raise ValueError(
                f"the saved stream position is for {state.get('files')} files of this process, the "
                f"corpus now gives it {len(self.files)}: resume with the same corpus and processes"
            )
        self._position = {k: int(state[k]) for k in ("file", "offset", "row", "kept")}

    def __iter__(self) -> Iterator[str]:
        position = self._position
        while position["file"] < len(self.files):
            name = self.files[position["file"]]
            for text, end in self._documents(name, position["offset"]):
                if self.max_documents is not None and position["kept"] >= self.max_documents:
                    return
                self.documents_read += 1
                row = position["row"]
                position.update(offset=end, row=row + 1)
                if row % self._every != self._keep:
                    continue
                position["kept"] += 1
                yield text
            position.update(file=position["file"] + 1, offset=0)

    def _documents(self, name: str, offset: int) -> Iterator[tuple[str, int]]:
        """(text, byte offset after it) from ``offset``; empty text for a document that is not text."""
        suffix = Path(name).suffix.lower()
        if suffix in (".jsonl", ".json"):
            yield from self._json_lines(name, offset)
        elif self.document_boundary == "file":
            if offset == 0:
                raw = Path(name).read_bytes()
                yield self._decode(raw, name), len(raw)
        else:
            yield from self._paragraph_blocks(name, offset)

    def _decode(self, raw: bytes, name: str) -> str:
        text = decode_text(raw, name, warn=name not in self._warned)
        self._warned.add(name)
        return text or ""

    def _paragraph_blocks(self, name: str, offset: int) -> Iterator[tuple[str, int]]:
        with open(name, "rb") as f:
            if offset == 0 and f.read(2) in (b"\xff\xfe", b"\xfe\xff"):
                raise CorpusError(
                    f"{name} is UTF-16: streaming reads UTF-8 (or 8-bit) text line by line; convert "
                    "the file to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)"
                )
            f.seek(offset)
            lines: list[bytes] = []
            while True:
                line = f.readline()
                if line.strip():
                    lines.append(line)
                    continue
                if lines:  # a blank line or the end of the file ends a document
                    text = self._decode(b"".join(lines), name)
                    yield "\n".join(text.splitlines()), f.tell()
                    lines = []
                if not line:
                    return

    def _json_lines(self, name: str, offset: int) -> Iterator[tuple[str, int]]:
        with open(name, "rb") as f:
            f.seek(offset)
            for line in iter(f.readline, b""):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as err:
                    raise CorpusError(f"{name}: a line at byte {f.tell() - len(line)} is not JSON ({err})") from None
                if not isinstance(row, dict) or self.text_column not in row:
                    columns = sorted(row) if isinstance(row, dict) else type(row).__name__
                    raise CorpusError(
                        f"{name} has no column {self.text_column!r} (a line holds {columns}). Pass the "
                        "right one with text_column."
                    )
                text = row[self.text_column]
                yield (text if isinstance(text, str) else ""), f.tell()


class DatasetDocuments:
    """This process's share of a ``datasets.IterableDataset`` with a ``text`` column, at its ``state_dict()``."""

    def __init__(
        self, dataset: datasets.IterableDataset, *, rank: int = 0, world_size: int = 1, max_documents: int | None = None
    ) -> None:
        if world_size > 1:
            from datasets.distributed import split_dataset_by_node

            dataset = split_dataset_by_node(dataset, rank=rank, world_size=world_size)
        self.dataset, self.max_documents = dataset, max_documents
        self._start = dataset.state_dict()
        self._kept = 0

    def rewind(self) -> None:
        self.dataset.load_state_dict(self._start)
        self._kept = 0

    def state_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset.state_dict(), "kept": self._kept}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state["dataset"])
        self._kept = int(state["kept"])

    def __iter__(self) -> Iterator[str]:
        # iter(): iterating the dataset itself inside a DataLoader worker would split it again among the workers
        for batch in self.dataset.iter(batch_size=1):
            if self.max_documents is not None and self._kept >= self.max_documents:
                return
            self._kept += 1
            text = batch["text"][0]
            yield text if isinstance(text, str) else ""


DocumentSource = TextFileDocuments | DatasetDocuments


def open_document_source(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    text_column: str = "text",
    document_boundary: str = "blank_line",
    hub_config: str | None = None,
    split: str = "train",
    rank: int = 0,
    world_size: int = 1,
    max_documents: int | None = None,
) -> DocumentSource:
    """This process's share of a corpus, read lazily (``max_documents``: of the whole corpus)."""
    files = _expand(source)
    per_process = None if max_documents is None else max(1, -(-max_documents // world_size))
    share = {"rank": rank, "world_size": world_size, "max_documents": per_process}
    if files is None:
        dataset = load_corpus(
            source,
            text_column=text_column,
            document_boundary=document_boundary,
            hub_config=hub_config,
            split=split,
            streaming=True,
        )
        if document_boundary == "wikitext":
            logger.warning("WikiText articles are joined by one generator: resuming reads the consumed part again")
        return DatasetDocuments(dataset, **share)
    suffixes = {f.suffix.lower() for f in files}
    if suffixes <= {*TEXT_SUFFIXES, "", ".jsonl", ".json"}:
        return TextFileDocuments(files, document_boundary=document_boundary, text_column=text_column, **share)
    formats = {TABLE_FORMATS.get(s) for s in suffixes}
    if len(formats) != 1 or None in formats or formats == {"json"}:
        raise CorpusError(
            f"{source}: streaming reads .txt/.jsonl files together, or tables of one format "
            f"(.parquet, .csv or .tsv), not a mix ({sorted(suffixes)})."
        )
    fmt = formats.pop()
    names = [str(f) for f in files]
    kwargs = {"delimiter": "\t"} if fmt == "csv" and all(n.endswith(".tsv") for n in names) else {}
    dataset = datasets.load_dataset(fmt, data_files=names, split="train", streaming=True, **kwargs)
    return DatasetDocuments(_select_text(dataset, text_column, str(source)), **share)


def first_documents(source: DocumentSource, n: int) -> list[str]:
    """The first ``n`` non-blank texts of a source, which is rewound afterwards."""
    texts = list(itertools.islice((text for text in source if text.strip()), n))
    source.rewind()
    return texts


class StreamingExamples(torch.utils.data.IterableDataset):
    """The rows of ``create_pretraining_instances`` from a document stream, for ever; iterating again continues.

    Document ids for ``document_rng`` interleave the processes (position * world_size + rank). At a phase switch
    (``phase_examples``) the pending and shuffled examples are dropped; the documents stay.
    """

    def __init__(
        self,
        source: DocumentSource,
        tokenizer: Any,
        configs: PreTrainingDataConfig | Sequence[PreTrainingDataConfig],
        *,
        phase_examples: Sequence[int] = (),
        document_buffer: int = 1000,
        shuffle_buffer: int = 10_000,
        split_lines: bool = False,
        exclude: frozenset[str] | set[str] = frozenset(),
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        self.configs = [configs] if isinstance(configs, PreTrainingDataConfig) else list(configs)
        if len(phase_examples) != len(self.configs) - 1:
            raise ValueError(
                f"phase_examples needs one count per phase but the last ({len(self.configs) - 1}), "
                f"got {list(phase_examples)}"
            )
        if document_buffer < 1:
            raise ValueError(
                f"document_buffer must be at least 1 (NotNext segments come from the other documents of "
                f"the buffer), got {document_buffer}"
            )
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be 0 (no shuffling) or more, got {shuffle_buffer}")
        self.source, self.tokenizer, self.split_lines = source, tokenizer, split_lines
        self.vocab = WordPieceVocab.from_tokenizer(tokenizer)
        self.document_buffer, self.shuffle_buffer = document_buffer, shuffle_buffer
        self.exclude, self.rank, self.world_size = frozenset(exclude), rank, world_size
        self._boundaries = [sum(phase_examples[: p + 1]) for p in range(len(phase_examples))]
        seed = self.configs[0].random_seed
        self._rng = random.Random(
            int.from_bytes(hashlib.sha256(f"{seed}/shuffle/{rank}".encode()).digest()[:8], "little")
        )
        self._buffer: deque[list[Any]] = deque(maxlen=document_buffer + 1)  # [document id, processed, sentences]
        self._pending: deque[dict[str, list[int] | int]] = deque()
        self._shuffle: list[dict[str, list[int] | int]] = []
        self._phase = self._pass = self._document = self._kept = self._examples = 0
        self.skipped = {"empty": 0, "binary": 0, "held_out": 0}
        self._source_iter: Iterator[str] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            while self._phase < len(self._boundaries) and self._examples >= self._boundaries[self._phase]:
                self._phase += 1  # examples drawn at the old length are dropped; the documents stay
                self._pending.clear()
                self._shuffle.clear()
            if not self._pending:
                self._read_document()
                continue
            example = self._pending.popleft()
            if self.shuffle_buffer:
                if len(self._shuffle) < self.shuffle_buffer:
                    self._shuffle.append(example)
                    continue
                slot = self._rng.randrange(self.shuffle_buffer)
                example, self._shuffle[slot] = self._shuffle[slot], example
            self._examples += 1
            yield example

    def _read_document(self) -> None:
        if self._source_iter is None:
            self._source_iter = iter(self.source)
        text = next(self._source_iter, None)
        if text is None:
            self._end_pass()
            return
        document_id = self._document
        self._document += 1
        if self.exclude and text_digest(text) in self.exclude:
            self.skipped["held_out"] += 1
            return
        tokenized = _tokenize_batch([text], self.tokenizer, self.split_lines)
        sentences = tokenized["sentences"][0]
        if not sentences:
            reason = tokenized["skip_reason"][0] or "empty"
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
            return
        self._kept += 1
        self._buffer.append([document_id, False, sentences])
        if len(self._buffer) == self._buffer.maxlen:
            self._build_waiting()

    def _end_pass(self) -> None:
        if self._kept == 0:
            raise CorpusError(
                f"the stream gave no document with text in pass {self._pass + 1} (skipped: "
                f"{self.skipped}). {HOW_TO_PASS_LOCAL_TEXT}"
            )
        if self._kept == 1 and self._pass == 0:
            logger.warning("one document only: NotNext segments will come from that same document (reference rule)")
        self._build_waiting()  # a stream shorter than the buffer: its documents draw from each other
        self._pass += 1
        self._document = self._kept = 0
        self._buffer.clear()
        self.source.rewind()
        self._source_iter = None

    def _build_waiting(self) -> None:
        config = self.configs[self._phase]
        documents = [entry[2] for entry in self._buffer]
        for position, entry in enumerate(self._buffer):
            if entry[1]:
                continue
            entry[1] = True
            rng = document_rng(
                config.random_seed, entry[0] * self.world_size + self.rank, self._pass % config.dupe_factor
            )
            columns = {name: [] for name in _config_features(config)}  # the map-style builder's rows
            for instance in create_instances_from_document(documents, position, self.vocab, rng, config):
                _append_instance(columns, instance)
            self._pending.extend(dict(zip(columns, row)) for row in zip(*columns.values()))

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self._rng.getstate()
        return {
            "version": STATE_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "phase": self._phase,
            "pass": self._pass,
            "document": self._document,
            "kept": self._kept,
            "examples": self._examples,
            "skipped": dict(self.skipped),
            "source": self.source.state_dict(),
            "buffer": [list(entry) for entry in self._buffer],
            "pending": list(self._pending),
            "shuffle": list(self._shuffle),
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"stream state version {state.get('version')!r}, expected {STATE_VERSION}")
        if (state["rank"], state["world_size"]) != (self.rank, self.world_size):
            raise ValueError(
                f"the stream state is that of process {state['rank']} of {state['world_size']}, this is "
                f"process {self.rank} of {self.world_size}: resume with as many processes as before"
            )
        self.source.load_state_dict(state["source"])
        self._source_iter = None
        self._phase, self._pass, self._document = state["phase"], state["pass"], state["document"]
        self._kept, self._examples = state["kept"], state["examples"]
        self.skipped = dict(state["skipped"])
        self._buffer = deque((list(entry) for entry in state["buffer"]), maxlen=self.document_buffer + 1)
        self._pending = deque(state["pending"])
        self._shuffle = list(state["shuffle"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))


def open_stream(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    tokenizer: Any,
    configs: PreTrainingDataConfig | Sequence[PreTrainingDataConfig],
    *,
    reading: dict[str, Any],
    max_documents: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    **kwargs: Any,
) -> StreamingExamples:
    """``reading``: ``open_document_source``'s arguments; ``kwargs``: ``StreamingExamples``'."""
    documents = open_document_source(source, **reading, rank=rank, world_size=world_size, max_documents=max_documents)
    return StreamingExamples(documents, tokenizer, configs, rank=rank, world_size=world_size, **kwargs)


def stream_batches(stream: int, streams: int, batches: int) -> int:
    """How many of a process's first ``batches`` batches come from ``stream`` (batch i comes from i % streams)."""
    return max(0, (batches - stream + streams - 1) // streams)


class WorkerStreams(torch.utils.data.IterableDataset):
    """This process's batches from ``streams`` streams, one per DataLoader worker, in a fixed order.

    Batch i is stream i % streams' next ``batch_size`` examples, as the DataLoader takes its workers' batches in turn
    (so the examples depend on ``--dataloader_num_workers``). Workers run ahead of training, so each writes its
    state before every batch a checkpoint may follow (``plan_saves``), for ``state_text`` to gather at the save.
    """

    def __init__(
        self,
        make_stream: Callable[..., StreamingExamples],
        *,
        streams: int,
        batch_size: int,
        phase_batches: Sequence[int] = (),
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        self.make_stream, self.streams, self.batch_size = make_stream, streams, batch_size
        self.phase_batches, self.rank, self.world_size = list(phase_batches), rank, world_size
        self.first_batch = 0  # the batch this process reads next (after resuming: the first one not trained yet)
        self.states: list[dict[str, Any] | None] = [None] * streams
        self.save_every, self.save_at = (), frozenset()
        # Where workers leave positions; removed by this process at exit (workers leave with os._exit, no atexit)
        self._staging = tempfile.mkdtemp(prefix="bert_repro-stream-")
        atexit.register(shutil.rmtree, self._staging, ignore_errors=True)
        self.in_process: StreamingExamples | None = None  # the stream read without workers

    def plan_saves(self, every: Sequence[int] = (), at: Sequence[int] = ()) -> None:
        """Checkpoints may follow every ``n`` batches for each ``n`` in ``every`` (0: none), and ``at`` batches."""
        self.save_every, self.save_at = tuple(n for n in every if n), frozenset(at)

    def stream(self, index: int) -> StreamingExamples:
        """Stream ``index`` where this object's states put it."""
        passed, examples = 0, []
        for batches in self.phase_batches:  # each stream switches phase at its share of the switching batch
            passed += batches
            examples.append(stream_batches(index, self.streams, passed) * self.batch_size - sum(examples))
        stream = self.make_stream(
            rank=self.rank * self.streams + index, world_size=self.world_size * self.streams, phase_examples=examples
        )
        if self.states[index] is not None:
            stream.load_state_dict(self.states[index])
        return stream

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = torch.utils.data.get_worker_info()
        slots = worker.num_workers if worker else 1
        if slots != self.streams:
            raise ValueError(
                f"{self.streams} streams are read by as many DataLoader workers (0 or 1 for one stream), not by {slots}"
            )
        batch = self.first_batch + (worker.id if worker else 0)  # the next batch this slot gives
        stream = self.stream(batch % self.streams)
        if worker is None:
            self.in_process = stream
            yield from stream
            return
        if self._may_save_before(batch):
            self._write_state(stream, batch)
        examples = iter(stream)
        while True:
            for i in range(self.batch_size):
                example = next(examples)  # the stream's state counts it already
                if i == self.batch_size - 1 and self._may_save_before(batch + self.streams):
                    # written before this batch reaches the training process, so there when a save needs it
                    self._write_state(stream, batch + self.streams)
                yield example
            batch += self.streams

    def _may_save_before(self, batch: int) -> bool:
        """Whether a checkpoint may follow N batches, batch - streams < N <= batch (holding the state before it)."""
        earlier = batch - self.streams
        return any(batch // n > earlier // n for n in self.save_every) or any(
            earlier < n <= batch for n in self.save_at
        )

    def _write_state(self, stream: StreamingExamples, batch: int) -> None:
        # Whole or not there: the training process waits for it.
        write_text(Path(self._staging) / f"batch{batch}.json", json.dumps(stream.state_dict(), separators=(",", ":")))

    def state_text(self, batches: int) -> str:
        """The JSON of every stream's position after this process's first ``batches`` batches."""
        expected = [stream_batches(v, self.streams, batches) * self.batch_size for v in range(self.streams)]
        if self.in_process is not None:
            states = [self.in_process.state_dict()]
        else:
            states = []
            for v in range(self.streams):
                path = Path(self._staging) / f"batch{batches + (v - batches) % self.streams}.json"
                if not path.exists():
                    raise RuntimeError(
                        f"the worker of stream {v} kept no position for a save after batch "
                        f"{batches}: with workers, checkpoints are saved at the planned steps only"
                    )
                states.append(json.loads(path.read_text(encoding="utf-8")))
            # Positions before this save are needed no more; those just read may be by a save within `streams`
            # batches (a periodic save and the last step's), so they stay until then.
            for path in Path(self._staging).glob("batch*.json"):
                if int(path.stem[len("batch") :]) < batches:
                    path.unlink()
        given = [state["examples"] for state in states]
        if given != expected:
            raise RuntimeError(
                f"the streams gave {given} examples after {batches} batches of {self.batch_size}, "
                f"not {expected}: the data loader read ahead, its position cannot be saved"
            )
        return json.dumps({"version": STATE_VERSION, "batches": batches, "streams": states}, separators=(",", ":"))

    def load_states(self, state: dict[str, Any]) -> None:
        """Continue from the positions of ``state_text``: the same processes and streams only."""
        states = state["streams"]
        saved = (states[0]["world_size"] // len(states), len(states))
        if saved != (self.world_size, self.streams) or any(
            s["rank"] != self.rank * self.streams + v for v, s in enumerate(states)
        ):
            workers = lambda n: n if n > 1 else 0  # noqa: E731
            raise ValueError(
                f"the stream state was saved by {saved[0]} process(es) with --dataloader_num_workers "
                f"{workers(saved[1])}, this run has {self.world_size} with {workers(self.streams)}: "
                "resume with as many processes and workers as before"
            )
        self.states = list(states)
        self.first_batch = state["batches"]


class DataStateCallback(TrainerCallback):
    """Writes the streams' positions after the examples trained so far into every checkpoint, one file per process."""

    def __init__(self, streams: WorkerStreams, batches_per_step: int) -> None:
        self.streams, self.batches_per_step = streams, batches_per_step

    def on_save(self, args, state, control, **kwargs):
        text = self.streams.state_text(state.global_step * self.batches_per_step)
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / DATA_STATE.format(rank=self.streams.rank), text)  # a kill leaves no truncated state
        return control


def load_data_state(streams: WorkerStreams, checkpoint: str | os.PathLike) -> None:
    """Put ``streams`` where they were when ``checkpoint`` was saved."""
    path = Path(checkpoint) / DATA_STATE.format(rank=streams.rank)
    if not path.is_file():
        raise ValueError(
            f"{path} is missing: {Path(checkpoint).name} was not saved by a streamed run (or by fewer "
            "processes); resume it without --streaming, or start again"
        )
    streams.load_states(json.loads(path.read_text(encoding="utf-8")))
