"""The data step of a pre-training run: documents split into training and held-out ones, the WordPiece vocabulary, then
the examples from one of two sources (`ExampleSource`): `BuiltExamples` (Arrow datasets built before training) or
`StreamedExamples` (--streaming, read while training; its position is part of every checkpoint).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import pyarrow.compute as pc
import torch

from ...data.corpus import load_corpus
from ...data.pack_examples import padding_statistics
from ...data.pretraining_examples import (
    PreTrainingDataConfig,
    WordPieceVocab,
    create_pretraining_instances,
    pretraining_statistics,
    tokenize_documents,
)
from ...data.streaming import (
    DataStateCallback,
    WorkerStreams,
    first_documents,
    load_data_state,
    open_document_source,
    open_stream,
    text_digest,
)
from ...data.wordpiece import load_tokenizer, save_tokenizer, train_wordpiece
from ..checkpoints import checkpoint_step
from ..cli import ConfigurationError
from .records import repetition_warnings

if TYPE_CHECKING:
    from .recipe import DataSettings

logger = logging.getLogger(__name__)


def corpus_source(run: DataSettings) -> str | list[str]:
    if not run.corpus:
        raise ConfigurationError("No corpus given: pass --corpus (a folder of .txt files, files, or a Hub dataset id).")
    return run.corpus[0] if len(run.corpus) == 1 else run.corpus


def corpus_reading(run: DataSettings) -> dict[str, Any]:
    """How --corpus is read, as `load_corpus` and the stream's readers take it."""
    return {key: getattr(run, key) for key in ("text_column", "document_boundary", "hub_config", "split")}


def load_documents(run: DataSettings) -> datasets.Dataset:
    documents = load_corpus(corpus_source(run), **corpus_reading(run), num_proc=run.num_proc)
    if run.max_documents is not None and len(documents) > run.max_documents:
        documents = documents.select(range(run.max_documents))
    return documents


def split_documents(documents: datasets.Dataset, run: DataSettings, seed: int):
    """(train, held-out) documents; the held-out slice is whole documents, so no text leaks into training."""
    if run.eval_fraction <= 0:
        return documents, None
    if len(documents) < 2:
        logger.warning(
            "The corpus holds %d document: no held-out evaluation (--eval_fraction holds out whole documents, so it "
            "needs at least 2; results.json records held_out_evaluation: none). Split the text into documents "
            "(--document_boundary) to evaluate.",
            len(documents),
        )
        return documents, None
    held_out = max(1, round(len(documents) * run.eval_fraction))
    parts = documents.train_test_split(test_size=held_out, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


TOKENIZER_DIR = "tokenizer"  # the run's tokenizer until the run ends, when it is saved beside the model instead


def kept_tokenizer_dir(output_dir: Path) -> Path:
    """`TOKENIZER_DIR` while the run trains, the output directory once finished (where an extended run reads it)."""
    ending = output_dir / TOKENIZER_DIR
    finished = not (ending / "tokenizer.json").exists() and (output_dir / "tokenizer.json").exists()
    return output_dir if finished else ending


def get_tokenizer(run: DataSettings, train_documents: datasets.Dataset, output_dir: Path):
    """The run's tokenizer: given, already trained by this run (resumption, other ranks), or trained now."""
    cached = kept_tokenizer_dir(output_dir)
    if (cached / "tokenizer.json").exists():
        try:
            return load_tokenizer(cached)
        except (OSError, ValueError) as err:  # damaged since it was written
            problem = f"{cached} cannot be read ({type(err).__name__}: {err})"
        trained = any(output_dir.glob("checkpoint-*")) or (output_dir / "model.safetensors").exists()
        if trained and not run.tokenizer:  # a new WordPiece vocabulary would not be the one the model learnt
            raise ConfigurationError(
                f"{problem}; the run's checkpoints were trained with it and a vocabulary trained again would "
                "differ. Pass --overwrite_output_dir true to start the run again, or --tokenizer with a copy of it."
            )
        logger.warning("%s: made again from %s", problem, run.tokenizer or "the corpus")
    if run.tokenizer:
        tokenizer = load_tokenizer(run.tokenizer)
    else:
        logger.info(
            "training a WordPiece vocabulary of %d entries on %d documents", run.vocab_size, len(train_documents)
        )
        tokenizer = train_wordpiece(
            iterator=train_documents["text"], vocab_size=run.vocab_size, lowercase=run.lowercase
        )
    save_tokenizer(tokenizer, cached)  # WordPiece training is not deterministic: keep what this run uses
    return tokenizer


def build_datasets(run: DataSettings, configs: list[PreTrainingDataConfig], training, output_dir: Path):
    """Documents -> tokenizer -> each phase's examples and the held-out ones, with their statistics."""
    documents = load_documents(run)
    train_docs, eval_docs = split_documents(documents, run, training.seed)
    tokenizer = get_tokenizer(run, train_docs, output_dir)
    vocab = WordPieceVocab.from_tokenizer(tokenizer)
    tokenized = tokenize_documents(train_docs, tokenizer, split_lines=run.split_lines, num_proc=run.num_proc)
    phases = [create_pretraining_instances(tokenized, vocab, cfg, num_proc=run.num_proc) for cfg in configs]
    statistics = {
        f"phase{i + 1}": {
            "max_seq_length": cfg.max_seq_length,
            "objective": cfg.objective,
            **pretraining_statistics(ds, tokenized, mask_token_id=tokenizer.mask_token_id),
            "padding": padding_statistics(
                example_lengths(ds), training.per_device_train_batch_size, cfg.max_seq_length, seed=training.seed
            ),
        }
        for i, (cfg, ds) in enumerate(zip(configs, phases))
    }
    eval_dataset = None
    if eval_docs is not None:
        eval_dataset, statistics["held_out"] = held_out_examples(eval_docs, tokenizer, configs[0], run)
    return tokenizer, phases, eval_dataset, statistics


def held_out_examples(eval_docs: datasets.Dataset, tokenizer, data: PreTrainingDataConfig, run: DataSettings):
    """(examples, statistics) of the held-out documents, with fixed masks: every evaluation scores the same ones."""
    eval_cfg = PreTrainingDataConfig(**{**asdict(data), "dupe_factor": 1, "static_masking": True})
    eval_tokenized = tokenize_documents(eval_docs, tokenizer, split_lines=run.split_lines, num_proc=run.num_proc)
    eval_dataset = create_pretraining_instances(
        eval_tokenized, WordPieceVocab.from_tokenizer(tokenizer), eval_cfg, num_proc=run.num_proc
    )
    eval_dataset = eval_dataset.select(range(min(len(eval_dataset), run.eval_max_examples)))
    return eval_dataset, {
        "objective": data.objective,
        **pretraining_statistics(eval_dataset, eval_tokenized, mask_token_id=tokenizer.mask_token_id),
    }


#: Streaming without --tokenizer: a WordPiece vocabulary is trained on this many documents from the stream's start.
STREAM_TOKENIZER_DOCUMENTS = 10_000
# With DataLoader workers a stream's position exists only at steps planned ahead, each a write of the workers'
# state: a stop on a signal waits for the next multiple of this many steps.
STREAM_STOP_EVERY = 20


def build_streaming_datasets(
    run: DataSettings, configs: list[PreTrainingDataConfig], training, output_dir: Path, steps: list[int]
):
    """--streaming: the stream's first documents held out, then this process's stream; nothing is copied to disk."""
    source, reading = corpus_source(run), corpus_reading(run)
    held = run.stream_held_out_documents
    need_sample = not run.tokenizer and not (kept_tokenizer_dir(output_dir) / "tokenizer.json").exists()
    first = first_documents(
        open_document_source(source, **reading), held + (STREAM_TOKENIZER_DOCUMENTS if need_sample else 1)
    )
    if len(first) <= held:
        raise ConfigurationError(
            f"The corpus holds {len(first)} documents: --stream_held_out_documents {held} leaves "
            "none to train on; lower it."
        )
    tokenizer = get_tokenizer(run, datasets.Dataset.from_dict({"text": first[held:]}), output_dir)
    make_stream = functools.partial(
        open_stream,
        source,
        tokenizer,
        configs,
        reading=reading,
        max_documents=run.max_documents,
        document_buffer=run.stream_document_buffer,
        shuffle_buffer=run.stream_shuffle_buffer,
        split_lines=run.split_lines,
        exclude={text_digest(text) for text in first[:held]},
    )
    stream = WorkerStreams(
        make_stream,
        streams=max(1, training.dataloader_num_workers),
        batch_size=training.per_device_train_batch_size,
        phase_batches=[n * training.gradient_accumulation_steps for n in steps[:-1]],
        rank=training.process_index,
        world_size=training.world_size,
    )
    statistics = {
        f"phase{i + 1}": {
            "max_seq_length": cfg.max_seq_length,
            "objective": cfg.objective,
            "streamed": True,
            "document_buffer": run.stream_document_buffer,
            "shuffle_buffer": run.stream_shuffle_buffer,
        }
        for i, cfg in enumerate(configs)
    }
    eval_dataset = None
    if held:
        eval_dataset, statistics["held_out"] = held_out_examples(
            datasets.Dataset.from_dict({"text": first[:held]}), tokenizer, configs[0], run
        )
    return tokenizer, stream, eval_dataset, statistics


def example_lengths(instances: datasets.Dataset) -> np.ndarray:
    """Tokens of each example, read from the Arrow offsets."""
    return np.concatenate(
        [
            pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False)
            for table in instances.with_format("arrow").iter(batch_size=65_536)
        ]
    )


def tokens_trained(statistics: dict, steps: list[int], global_batch_size: int, after_step: int = 0) -> float:
    """The tokens of the optimizer steps after `after_step`: each phase's steps (`steps`, in order) times the batch
    times that phase's mean tokens per example (data_statistics.json)."""
    tokens, first = 0.0, 0
    for i, n in enumerate(steps):
        phase = statistics[f"phase{i + 1}"]
        tokens += (
            phase["tokens"] / max(phase["examples"], 1) * max(0, first + n - max(first, after_step)) * global_batch_size
        )
        first += n
    return tokens


@dataclass
class PreparedData:
    """What the data step hands on; `train` is the per-phase datasets or this process's stream."""

    tokenizer: Any
    train: Any
    eval_dataset: datasets.Dataset | None
    statistics: dict[str, Any]


class BuiltExamples:
    """Every phase's examples built before training, cached by `datasets`."""

    streamed, stop_every = False, 0

    def prepare(self, plan) -> PreparedData:
        return PreparedData(*build_datasets(plan.recipe.data, list(plan.phase_configs), plan.training, plan.output_dir))

    def train_dataset(self, prepared: PreparedData):
        return datasets.concatenate_datasets(prepared.train) if len(prepared.train) > 1 else prepared.train[0]

    def phase_sizes(self, prepared: PreparedData) -> list[int]:
        return [len(p) for p in prepared.train]

    def warnings(self, prepared: PreparedData, plan) -> list[str]:
        batch = plan.recipe.optimization.global_batch_size
        return repetition_warnings(prepared.statistics, list(plan.phase_steps), batch, list(plan.phase_configs))

    def callbacks(self, prepared: PreparedData, plan, resume_from: str | None) -> list:
        return []

    def tokens_per_second(self, trainer, prepared: PreparedData, plan, clock, elapsed: float):
        """The tokens of every step the clock timed, over its time."""
        batch = plan.recipe.optimization.global_batch_size
        tokens = tokens_trained(prepared.statistics, list(plan.phase_steps), batch, after_step=clock.from_step)
        return round(tokens / clock.seconds(), 1)


class StreamedExamples:
    """--streaming: this process's stream of examples, all phases in one, read while training."""

    streamed = True  # its checkpoints hold the stream's position

    def __init__(self, workers: int):
        self.stop_every = STREAM_STOP_EVERY if workers else 0

    def prepare(self, plan) -> PreparedData:
        configs, steps = list(plan.phase_configs), list(plan.phase_steps)
        return PreparedData(*build_streaming_datasets(plan.recipe.data, configs, plan.training, plan.output_dir, steps))

    def train_dataset(self, prepared: PreparedData):
        return prepared.train

    def phase_sizes(self, prepared: PreparedData) -> None:
        return None

    def warnings(self, prepared: PreparedData, plan) -> list[str]:
        return []  # a stream's repetition is the corpus's passes, not known before it is read

    def callbacks(self, prepared: PreparedData, plan, resume_from: str | None) -> list:
        """The stream's position saved where Trainer saves (DefaultFlowCallback's rule) or a stop may, and restored."""
        training, stream = plan.training, prepared.train
        per_step = training.gradient_accumulation_steps  # batches
        if resume_from:
            try:
                load_data_state(stream, resume_from)
            except ValueError as err:
                raise ConfigurationError(f"Cannot resume the stream: {err}.") from None
        every = training.save_steps
        every = int(every) if every >= 1 else math.ceil(training.max_steps * every)
        start = checkpoint_step(resume_from) if resume_from else 0
        stop_after = plan.recipe.output.stop_after_steps
        stop = start + stop_after if stop_after else training.max_steps
        periodic = every if training.save_strategy == "steps" else 0
        stream.plan_saves(
            every=[periodic * per_step, self.stop_every * per_step],
            at=[stop * per_step, training.max_steps * per_step],
        )
        return [DataStateCallback(stream, per_step)]

    def tokens_per_second(self, trainer, prepared: PreparedData, plan, clock, elapsed: float):
        """The tokens this invocation trained on, summed over the processes, over its time."""
        seen = torch.tensor(float(trainer.tokens_seen), device=plan.training.device)
        return round(trainer.accelerator.reduce(seen, reduction="sum").item() / elapsed, 1)


# Where a run's examples come from, and all that depends on it: the two answer the same questions.
ExampleSource = BuiltExamples | StreamedExamples


def example_source(recipe) -> ExampleSource:
    return StreamedExamples(recipe.training.dataloader_num_workers) if recipe.data.streaming else BuiltExamples()
