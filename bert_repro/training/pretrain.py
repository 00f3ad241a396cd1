"""Pre-training BERT with Trainer: the paper's procedure (section 3.1, appendix A.2) as library code.

`recipes/pretrain.py` is a thin command line over `run_pretraining`. What lives here:

- `PreTrainingArguments`: everything a run needs beyond transformers' `TrainingArguments` (corpus, tokenizer,
  preset, the two phases, optimizer), and `parse_arguments` which reads a YAML config with any field
  overridable on the command line. Paper defaults (SPEC section 3) sit under both.
- The objective (`--objective`, the paper's Table 5: `mlm_nsp` BERT, `mlm` No NSP, `ltr` left-to-right): one name
  in `PreTrainingDataConfig` (how examples are built) and in the model config (how it attends), both reading
  `PRETRAINING_OBJECTIVES`. Without NSP the loss has no NSP term, NSP metrics are not logged and the model's
  pooler and NSP head take no part in training (frozen: no gradient, no weight decay, not reported as unused to
  DDP); "ltr" logs `lm_loss` / `lm_accuracy` (next token) instead of `mlm_*`.
- `PreTrainingTrainer`: Trainer that logs the MLM loss, NSP loss, MLM accuracy and NSP accuracy separately,
  evaluates them on a held-out slice of the corpus, and normalises the loss over the GLOBAL batch: the MLM loss
  is the mean over every masked token of the batch of `global_batch_size` sequences, however it is split into
  accumulation steps and processes; the NSP loss is the mean over its sequences. So one batch of 16, two
  accumulated batches of 8 and two DDP ranks of 8 give the same update (tested).
- `PhasedSampler`: the paper's two-phase schedule (90% of steps at 128 tokens, then 512) inside ONE Trainer run,
  so there is one learning-rate schedule across both phases and resuming works anywhere.
- Output-directory checks: a directory holding a different run is never overwritten.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from huggingface_hub.errors import StrictDataclassError
import pyarrow.compute as pc
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler
from transformers import IntervalStrategy, TrainerCallback, TrainingArguments, set_seed

from .cli import (RUN_CONFIG, RUN_LOCK, ConfigurationError, SpeedSwitches, check_output_dir,
                  parse_with_config, pin_memory_only_with_an_accelerator, take_push_request)
from .checkpoints import checkpoint_problem, checkpoint_step, newest_valid_checkpoint
from .cluster import lock_output_dir_once, stop_message
from .distributed import EngineTrainer, check_deepspeed_installed, check_engine
from ..model.configuration_bert_repro import (DEFAULT_OBJECTIVE, BertReproConfig, PreTrainingObjective,
                                              SPEED_SWITCHES, check_objective_switches, pretraining_objective)
from ..model.conversion import check_model_dir
from ..data.corpus import load_corpus
from ..hub.push import push_checkpoints
from ..model.speed_paths import BertReproForPreTraining
from .optim import optimizer_cls_and_kwargs
from ..data.pretraining_examples import (
    IGNORE_INDEX,
    PreTrainingCollator,
    PreTrainingDataConfig,
    WordPieceVocab,
    create_pretraining_instances,
    pretraining_statistics,
    tokenize_documents,
)
from ..data.packing import PackingCollator, padding_statistics
from ..data.streaming import (
    DataStateCallback,
    WorkerStreams,
    first_documents,
    load_data_state,
    open_document_source,
    open_stream,
    text_digest,
)
from ..data.wordpiece import load_tokenizer, save_tokenizer, train_wordpiece

logger = logging.getLogger(__name__)




TOKENIZER_DIR = "tokenizer"

# SPEC section 3: Adam lr 1e-4, betas 0.9/0.999, eps 1e-6, weight decay 0.01, 10,000 warm-up steps then linear
# decay, clipping at 1.0, 1,000,000 steps. Lowest precedence: a YAML config and the command line override them.
PAPER_TRAINING_DEFAULTS = dict(
    learning_rate=1e-4,
    adam_beta1=0.9,
    adam_beta2=0.999,
    adam_epsilon=1e-6,
    weight_decay=0.01,
    warmup_steps=10_000,
    lr_scheduler_type="linear",
    max_grad_norm=1.0,
    max_steps=1_000_000,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=64,
    logging_steps=100,
    save_steps=10_000,
    eval_steps=10_000,
    eval_strategy="steps",
    save_total_limit=3,
    report_to="tensorboard",
    seed=12345,
    remove_unused_columns=False,
    ddp_find_unused_parameters=False,
)


@dataclass
class PreTrainingArguments(SpeedSwitches):
    """The run's own settings (transformers' TrainingArguments and PreTrainingDataConfig hold the rest)."""

    corpus: list[str] = field(default_factory=list, metadata={
        "help": "Text: a folder, files or globs (.txt, .jsonl, .parquet, .csv), or a Hub dataset id."})
    hub_config: str | None = field(default=None, metadata={"help": "Config of a Hub dataset (e.g. 20231101.en)."})
    split: str = field(default="train", metadata={"help": "Split of a Hub dataset."})
    streaming: bool = field(default=False, metadata={
        "help": "Read the corpus as a stream while training (no copy of it or of the examples on disk); NotNext "
                "segments come from a buffer of recent documents (bert_repro.data.streaming)."})
    max_documents: int | None = field(default=None, metadata={
        "help": "Use at most this many documents (streaming: per pass over the stream, over all processes)."})
    stream_document_buffer: int = field(default=1000, metadata={
        "help": "Streaming: NotNext segment B comes from one of this many documents read before A's."})
    stream_shuffle_buffer: int = field(default=10_000, metadata={
        "help": "Streaming: examples shuffled in a buffer of this size (0: stream order)."})
    stream_held_out_documents: int = field(default=200, metadata={
        "help": "Streaming: the stream's first documents held out for evaluation (never trained on; eval_fraction "
                "applies without streaming); 0 for none."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text in table files."})
    document_boundary: str = field(default="blank_line", metadata={
        "help": "Plain text: 'blank_line' (a blank line between documents) or 'file' (one document per file)."})
    split_lines: bool = field(default=False, metadata={
        "help": "Every line break ends a sentence (one paragraph per line), instead of hard-wrapped text."})
    tokenizer: str | None = field(default=None, metadata={
        "help": "An existing tokenizer (directory, vocab.txt, tokenizer.json or Hub id); else one is trained."})
    vocab_size: int = field(default=30522, metadata={"help": "Size of a newly trained WordPiece vocabulary."})
    lowercase: bool = field(default=True, metadata={"help": "Uncased (lower-case, strip accents) or cased."})
    eval_fraction: float = field(default=0.01, metadata={"help": "Share of documents held out for evaluation."})
    eval_max_examples: int = field(default=2000, metadata={"help": "At most this many held-out examples."})
    num_proc: int | None = field(default=None, metadata={"help": "Processes for data preparation (all cores)."})
    preset: str = field(default="base", metadata={"help": "tiny, mini, small, medium, base or large."})
    model_overrides: str | None = field(default=None, metadata={
        "help": "JSON object of BertReproConfig fields, e.g. '{\"hidden_dropout_prob\": 0.0}'."})
    attn_implementation: str = field(default="sdpa", metadata={"help": "eager, sdpa or flash_attention_2."})
    init_from: str | None = field(default=None, metadata={
        "help": "Start from the weights of this checkpoint (continued pre-training) instead of a random init."})
    global_batch_size: int = field(default=256, metadata={
        "help": "Sequences per optimizer step; gradient accumulation is derived from it."})
    phase2_fraction: float = field(default=0.1, metadata={
        "help": "Share of the steps in phase 2 (long sequences); 0 for one phase."})
    phase2_max_seq_length: int = field(default=512, metadata={"help": "Sequence length of phase 2."})
    phase2_max_predictions_per_seq: int = field(default=80, metadata={"help": "Masked positions in phase 2."})
    optimizer: str = field(default="adamw", metadata={"help": "adamw, bert_adam (reference code) or lamb."})
    sparse_prediction: bool = field(default=True, metadata={
        "help": "Run the MLM decoder only at the masked positions (same loss and gradients, fewer FLOPs)."})
    packing: bool = field(default=False, metadata={
        "help": "Pack each batch's examples into shared rows, attention kept inside each example and NSP read at "
                "each example's [CLS] (same examples, losses and gradients; less padding)."})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Allow writing into an output directory that holds another or a finished run."})
    stop_after_steps: int | None = field(default=None, metadata={
        "help": "Stop this invocation after so many optimizer steps, with a checkpoint (resume it later)."})
    plot: bool = field(default=True, metadata={"help": "Write training_curves.png at the end."})


# Fields that may change between an interrupted run and its resumption.
RUN_CONTROL_FIELDS = {"overwrite_output_dir", "stop_after_steps", "resume_from_checkpoint", "num_proc", "plot",
                      *SPEED_SWITCHES, "compile_layers",  # speed switches: the same training either way
                      "packing",  # the same examples per step and the same losses, packed or not
                      "logging_steps", "report_to", "disable_tqdm", "log_level", "log_level_replica",
                      "dataloader_num_workers",
                      "gradient_accumulation_steps"}  # derived from global_batch_size and the processes


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None = None):
    """(PreTrainingArguments, PreTrainingDataConfig, TrainingArguments) from `--config x.yaml` and the command line.

    Precedence: the paper's defaults < the YAML file < the command line. Unknown YAML keys are an error that names
    the file and the key.
    """
    return parse_with_config((PreTrainingArguments, PreTrainingDataConfig, TrainingArguments),
                             PAPER_TRAINING_DEFAULTS, argv, "recipes/pretrain.py")


# ---------------------------------------------------------------------------------------------------------------
# The output directory: never overwrite another run
# ---------------------------------------------------------------------------------------------------------------


def run_record(run: PreTrainingArguments, data: PreTrainingDataConfig, training: TrainingArguments) -> dict:
    """What identifies a run: every setting except the ones that may change on resumption."""
    return run_identity({"run": asdict(run), "data": asdict(data), "training": training.to_dict()})


def run_identity(record: dict) -> dict:
    """`record` without the fields that may change on resumption (also applied to a saved record, which an
    earlier version may have written with more fields)."""
    record = {name: dict(section) for name, section in record.items()}
    for name, section in record.items():
        for key in list(section):
            if key in RUN_CONTROL_FIELDS or key.startswith(("logging_", "push_to_hub")) or (
                    key.startswith("hub_") and name == "training"):
                section.pop(key)
    return json.loads(json.dumps(record, default=str))


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------


def load_documents(run: PreTrainingArguments) -> datasets.Dataset:
    if not run.corpus:
        raise ConfigurationError("No corpus given: pass --corpus (a folder of .txt files, files, or a Hub dataset id).")
    source = run.corpus[0] if len(run.corpus) == 1 else run.corpus
    documents = load_corpus(
        source, text_column=run.text_column, document_boundary=run.document_boundary, hub_config=run.hub_config,
        split=run.split, num_proc=run.num_proc,
    )
    if run.max_documents is not None and len(documents) > run.max_documents:
        documents = documents.select(range(run.max_documents))
    return documents


def split_documents(documents: datasets.Dataset, run: PreTrainingArguments, seed: int):
    """(train, held-out) documents; the held-out slice is whole documents, so no text leaks into training."""
    if run.eval_fraction <= 0 or len(documents) < 2:
        return documents, None
    held_out = max(1, round(len(documents) * run.eval_fraction))
    parts = documents.train_test_split(test_size=held_out, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def get_tokenizer(run: PreTrainingArguments, train_documents: datasets.Dataset, output_dir: Path):
    """The run's tokenizer: given, already trained by this run (resumption, other ranks), or trained now."""
    cached = output_dir / TOKENIZER_DIR
    if (cached / "tokenizer.json").exists():
        return load_tokenizer(cached)
    if run.tokenizer:
        tokenizer = load_tokenizer(run.tokenizer)
    else:
        logger.info("training a WordPiece vocabulary of %d entries on %d documents", run.vocab_size,
                    len(train_documents))
        tokenizer = train_wordpiece(iterator=train_documents["text"], vocab_size=run.vocab_size,
                                    lowercase=run.lowercase)
    save_tokenizer(tokenizer, cached)  # WordPiece training is not deterministic: keep what this run uses
    return tokenizer


def phase_configs(data: PreTrainingDataConfig, run: PreTrainingArguments) -> list[PreTrainingDataConfig]:
    phases = [data]
    if run.phase2_fraction > 0:
        phases.append(PreTrainingDataConfig(**{
            **asdict(data),
            "max_seq_length": run.phase2_max_seq_length,
            "max_predictions_per_seq": run.phase2_max_predictions_per_seq,
        }))
    return phases


def build_datasets(run, data, training, output_dir: Path):
    """Documents -> tokenizer -> pre-training examples of each phase and of the held-out slice, with statistics."""
    documents = load_documents(run)
    train_docs, eval_docs = split_documents(documents, run, training.seed)
    tokenizer = get_tokenizer(run, train_docs, output_dir)
    vocab = WordPieceVocab.from_tokenizer(tokenizer)
    tokenized = tokenize_documents(train_docs, tokenizer, split_lines=run.split_lines, num_proc=run.num_proc)
    configs = phase_configs(data, run)
    phases = [create_pretraining_instances(tokenized, vocab, cfg, num_proc=run.num_proc) for cfg in configs]
    statistics = {
        f"phase{i + 1}": {"max_seq_length": cfg.max_seq_length, "objective": cfg.objective,
                          **pretraining_statistics(ds, tokenized, mask_token_id=tokenizer.mask_token_id),
                          "padding": padding_statistics(example_lengths(ds), training.per_device_train_batch_size,
                                                        cfg.max_seq_length, seed=training.seed)}
        for i, (cfg, ds) in enumerate(zip(configs, phases))
    }
    eval_dataset = None
    if eval_docs is not None:
        eval_dataset, statistics["held_out"] = held_out_examples(eval_docs, tokenizer, data, run)
    return tokenizer, phases, eval_dataset, statistics


def held_out_examples(eval_docs: datasets.Dataset, tokenizer, data: PreTrainingDataConfig, run: PreTrainingArguments):
    """(examples, statistics) of the held-out documents."""
    # Fixed masks, so that every evaluation scores the same predictions (also with dynamic masking in training).
    eval_cfg = PreTrainingDataConfig(**{**asdict(data), "dupe_factor": 1, "static_masking": True})
    eval_tokenized = tokenize_documents(eval_docs, tokenizer, split_lines=run.split_lines, num_proc=run.num_proc)
    eval_dataset = create_pretraining_instances(eval_tokenized, WordPieceVocab.from_tokenizer(tokenizer), eval_cfg,
                                                num_proc=run.num_proc)
    eval_dataset = eval_dataset.select(range(min(len(eval_dataset), run.eval_max_examples)))
    return eval_dataset, {"objective": data.objective, **pretraining_statistics(
        eval_dataset, eval_tokenized, mask_token_id=tokenizer.mask_token_id)}


#: Streaming without --tokenizer: a WordPiece vocabulary is trained on this many documents from the stream's start.
STREAM_TOKENIZER_DOCUMENTS = 10_000
# With DataLoader workers a stream's position exists only at steps planned ahead, and each costs the workers a
# write of their state (buffers included): a stop on a signal waits for the next multiple of this many steps.
STREAM_STOP_EVERY = 20


def build_streaming_datasets(run, data, training, output_dir: Path, steps: list[int]):
    """--streaming: the stream's first documents held out (and a sample for a new tokenizer), then this process's
    stream of examples for `steps` optimizer steps per phase (bert_repro.data.streaming); nothing is copied to disk."""
    if not run.corpus:
        raise ConfigurationError("No corpus given: pass --corpus (a folder of .txt files, files, or a Hub dataset id).")
    source = run.corpus[0] if len(run.corpus) == 1 else run.corpus
    reading = {"text_column": run.text_column, "document_boundary": run.document_boundary,
               "hub_config": run.hub_config, "split": run.split}
    held = run.stream_held_out_documents
    need_sample = not run.tokenizer and not (output_dir / TOKENIZER_DIR / "tokenizer.json").exists()
    first = first_documents(open_document_source(source, **reading),
                            held + (STREAM_TOKENIZER_DOCUMENTS if need_sample else 1))
    if len(first) <= held:
        raise ConfigurationError(f"The corpus holds {len(first)} documents: --stream_held_out_documents {held} leaves "
                                 "none to train on; lower it.")
    tokenizer = get_tokenizer(run, datasets.Dataset.from_dict({"text": first[held:]}), output_dir)
    configs = phase_configs(data, run)
    make_stream = functools.partial(
        open_stream, source, tokenizer, configs, reading=reading, max_documents=run.max_documents,
        document_buffer=run.stream_document_buffer, shuffle_buffer=run.stream_shuffle_buffer,
        split_lines=run.split_lines, exclude={text_digest(text) for text in first[:held]})
    # One stream per DataLoader worker (each its own share of the corpus), or one read by this process.
    stream = WorkerStreams(make_stream, streams=max(1, training.dataloader_num_workers),
                           batch_size=training.per_device_train_batch_size,
                           phase_batches=[n * training.gradient_accumulation_steps for n in steps[:-1]],
                           rank=training.process_index, world_size=training.world_size)
    statistics = {f"phase{i + 1}": {"max_seq_length": cfg.max_seq_length, "objective": cfg.objective,
                                    "streamed": True, "document_buffer": run.stream_document_buffer,
                                    "shuffle_buffer": run.stream_shuffle_buffer}
                  for i, cfg in enumerate(configs)}
    eval_dataset = None
    if held:
        eval_dataset, statistics["held_out"] = held_out_examples(
            datasets.Dataset.from_dict({"text": first[:held]}), tokenizer, data, run)
    return tokenizer, stream, eval_dataset, statistics


def example_lengths(instances: datasets.Dataset) -> np.ndarray:
    """Tokens of each example, in dataset order (read from the Arrow offsets, nothing decoded)."""
    return np.concatenate([pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False)
                           for table in instances.with_format("arrow").iter(batch_size=65_536)])


class PhaseCollator:
    """Routes each batch to the collator of its phase (dynamic masking uses each phase's prediction budget);
    rows that carry their masks (the held-out slice) always keep them, with their phase's prediction budget.
    With `packing`, each phase packs its batches into rows of its max_seq_length; `compiled` (torch.compile)
    then makes every row that long, so that only the number of rows changes between batches (one
    recompilation, not two)."""

    def __init__(self, tokenizer, phases: list[PreTrainingDataConfig], packing: bool = False,
                 compiled: bool = False):
        def fixed(cfg):
            return {"pad_to_multiple_of": cfg.max_seq_length} if packing and compiled else {}

        def static(cfg):
            slots = {"max_predictions_per_seq": cfg.max_predictions_per_seq}
            if packing:
                return PackingCollator(tokenizer, max_seq_length=cfg.max_seq_length, **slots, **fixed(cfg))
            return PreTrainingCollator(tokenizer, **slots)

        collator = PackingCollator if packing else PreTrainingCollator
        self.collators = [(cfg.max_seq_length, collator.from_config(tokenizer, cfg, **fixed(cfg)))
                          for cfg in phases]
        self.static = [(cfg.max_seq_length, static(cfg)) for cfg in phases]

    def __call__(self, features):
        collators = self.static if "masked_lm_positions" in features[0] else self.collators
        longest = max(len(f["input_ids"]) for f in features)
        for max_len, collator in collators:
            if longest <= max_len:
                return collator(features)
        return collators[-1][1](features)


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------


class PhasedSampler(Sampler[int]):
    """Indices into the concatenated phase datasets: `samples[p]` draws from phase p, in phase order.

    Each phase is drawn in passes over its examples, reshuffled every pass, with a seeded generator: the same
    order on every process and after resumption (Trainer skips the batches already seen).
    """

    def __init__(self, sizes: list[int], samples: list[int], seed: int):
        if any(n > 0 and size == 0 for size, n in zip(sizes, samples)):
            raise ValueError(f"A phase has no examples to draw from (sizes {sizes}).")
        self.sizes, self.samples, self.seed = sizes, samples, seed

    def __len__(self) -> int:
        return sum(self.samples)

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        offset = 0
        for size, n in zip(self.sizes, self.samples):
            drawn = 0
            while drawn < n:
                order = rng.permutation(size)[: n - drawn]
                yield from (offset + order).tolist()
                drawn += len(order)
            offset += size


def allow_data_dependent_shapes() -> None:
    """Let torch.compile trace a packed batch whole: how many examples its rows hold (the pooler's and the NSP
    head's rows) is known from the data only, which dynamo otherwise leaves to eager code between graphs."""
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    torch._dynamo.config.capture_scalar_outputs = True


def phase_steps(max_steps: int, phase2_fraction: float, num_phases: int) -> list[int]:
    if num_phases == 1:
        return [max_steps]
    second = max(1, round(max_steps * phase2_fraction))
    return [max_steps - second, second]


_SUMS = ("mlm_loss", "mlm_correct", "mlm_count", "nsp_loss", "nsp_correct", "nsp_count")


def pretraining_sums(prediction_logits, seq_relationship_logits, labels, next_sentence_label,
                     masked_positions=None) -> torch.Tensor:
    """Summed losses and counts of a batch: (mlm loss sum, mlm correct, masked tokens, nsp loss sum, nsp correct, n).

    `prediction_logits` is (batch, seq, vocab), or from a sparse prediction (masked positions, vocab), or
    (slots, vocab) when the model was given `masked_positions` (pass them here too). The "mlm" entries are the
    token-level task's: masked tokens, or for a left-to-right objective the next tokens (its labels are
    shifted by the collator). Without `next_sentence_label` (an objective without NSP) the NSP entries are 0, so
    the loss built from them has no NSP term."""
    if prediction_logits.dim() == 2 and masked_positions is not None:
        mlm_logits, mlm_labels = prediction_logits.float(), labels.reshape(-1)[masked_positions.reshape(-1)]
    else:
        masked = labels != IGNORE_INDEX
        mlm_logits = prediction_logits if prediction_logits.dim() == 2 else prediction_logits[masked]
        mlm_logits, mlm_labels = mlm_logits.float(), labels[masked]
    predicted = mlm_labels != IGNORE_INDEX
    mlm = [F.cross_entropy(mlm_logits, mlm_labels, reduction="sum", ignore_index=IGNORE_INDEX),
           ((mlm_logits.argmax(-1) == mlm_labels) & predicted).sum().float(), predicted.sum().float()]
    if next_sentence_label is None:
        return torch.stack(mlm + [mlm_logits.new_zeros(())] * 3)
    nsp_logits = seq_relationship_logits.float()
    return torch.stack(mlm + [
        F.cross_entropy(nsp_logits, next_sentence_label, reduction="sum"),
        (nsp_logits.argmax(-1) == next_sentence_label).sum().float(),
        torch.tensor(float(next_sentence_label.numel()), device=nsp_logits.device),
    ])


def metrics_from_sums(sums: torch.Tensor, prefix: str = "", objective: PreTrainingObjective | None = None
                      ) -> dict[str, float]:
    """The logged metrics of `objective` (the paper's BERT by default): the token-level task's loss and accuracy
    (`mlm_*`, or `lm_*` for next-token prediction) and, with NSP, the NSP loss and accuracy."""
    objective = objective or pretraining_objective(DEFAULT_OBJECTIVE)
    s = dict(zip(_SUMS, sums.tolist()))
    mlm_n, nsp_n = max(s["mlm_count"], 1.0), max(s["nsp_count"], 1.0)
    task, nsp = f"{prefix}{objective.token_task}", objective.next_sentence
    metrics = {f"{task}_loss": s["mlm_loss"] / mlm_n}
    metrics.update({f"{prefix}nsp_loss": s["nsp_loss"] / nsp_n} if nsp else {})
    metrics[f"{task}_accuracy"] = s["mlm_correct"] / mlm_n
    metrics.update({f"{prefix}nsp_accuracy": s["nsp_correct"] / nsp_n} if nsp else {})
    return metrics


class PreTrainingTrainer(EngineTrainer):
    """Trainer for MLM + NSP with global-batch loss normalisation and the four pre-training metrics."""

    def __init__(self, *args, phase_sizes: list[int] | None = None, phase_samples: list[int] | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.phase_sizes, self.phase_samples = phase_sizes, phase_samples
        self.loss_is_scaled_for_ga = True  # compute_loss divides by the global counts itself
        self._train_sums: torch.Tensor | None = None
        self.tokens_seen = 0  # this invocation's real training tokens in this process

    def _get_train_sampler(self, train_dataset=None):
        if self.phase_sizes is None:
            return super()._get_train_sampler(train_dataset)
        return PhasedSampler(self.phase_sizes, self.phase_samples, self.args.seed)

    def get_train_dataloader(self):
        if not isinstance(self.train_dataset, WorkerStreams):
            return super().get_train_dataloader()
        # This process's own part of the stream (accelerate's sharding would make every process read everything),
        # one stream per worker, whose batches the DataLoader returns in turn (WorkerStreams).
        workers = self.args.dataloader_num_workers
        return DataLoader(self.train_dataset, batch_size=self._train_batch_size, collate_fn=self.data_collator,
                          pin_memory=self.args.dataloader_pin_memory, num_workers=workers,
                          prefetch_factor=self.args.dataloader_prefetch_factor if workers else None)

    def _get_num_items_in_batch(self, batch_samples, device):
        """Masked tokens and sequences in the whole global batch (all accumulation steps, all processes)."""
        self.tokens_seen += sum(int(b["attention_mask"].sum()) for b in batch_samples)  # on the CPU: no sync
        counts = torch.tensor(
            [sum(int(b["labels"].ne(IGNORE_INDEX).sum()) for b in batch_samples),
             sum(int(b["next_sentence_label"].numel()) for b in batch_samples if "next_sentence_label" in b)],
            dtype=torch.float64, device=device,
        )
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        return counts

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        next_sentence_label = inputs.pop("next_sentence_label", None)  # None: an objective without NSP
        # With config.sparse_prediction the MLM decoder runs only at the masked positions (same loss, fewer FLOPs).
        outputs = model(**inputs, labels=labels)
        sums = pretraining_sums(outputs.prediction_logits, outputs.seq_relationship_logits, labels,
                                next_sentence_label, inputs.get("masked_positions"))
        if num_items_in_batch is None:  # one batch on its own
            mlm_n, nsp_n = sums[2].clamp(min=1), sums[5].clamp(min=1)
            loss = sums[0] / mlm_n + sums[3] / nsp_n
        else:
            mlm_n, nsp_n = num_items_in_batch.to(sums.dtype).clamp(min=1)
            # DDP averages gradients over processes: scale back up so the sum over the global batch is kept.
            loss = (sums[0] / mlm_n + sums[3] / nsp_n) * self.accelerator.num_processes
        if model.training:
            detached = sums.detach()
            self._train_sums = detached if self._train_sums is None else self._train_sums + detached
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._train_sums is not None:
            sums = self._train_sums
            if self.accelerator.num_processes > 1:
                sums = self.accelerator.reduce(sums, reduction="sum")
            logs.update(metrics_from_sums(sums, objective=self.model.config.pretraining_objective))
            self._train_sums = None
        super().log(logs, start_time)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        dataloader = self.get_eval_dataloader(eval_dataset)
        model = self.model
        was_training = model.training
        model.eval()
        sums = torch.zeros(len(_SUMS), device=self.args.device)
        start = time.time()
        with torch.no_grad():
            for batch in dataloader:
                batch = self._prepare_inputs(batch)
                labels, nsp = batch.pop("labels"), batch.pop("next_sentence_label", None)
                with self.autocast_smart_context_manager():
                    out = model(**batch, labels=labels)
                sums += pretraining_sums(out.prediction_logits, out.seq_relationship_logits, labels, nsp,
                                         batch.get("masked_positions"))
        if self.accelerator.num_processes > 1:
            sums = self.accelerator.reduce(sums, reduction="sum")
        model.train(was_training)
        metrics = metrics_from_sums(sums, prefix=f"{metric_key_prefix}_",
                                    objective=self.model.config.pretraining_objective)
        metrics[f"{metric_key_prefix}_loss"] = sum(v for k, v in metrics.items() if k.endswith("_loss"))
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 3)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


class StopAfterSteps(TrainerCallback):
    """Ends this invocation after `steps` optimizer steps with a checkpoint, for time-limited jobs."""

    def __init__(self, steps: int):
        self.steps, self.first_step = steps, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.first_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step - self.first_step >= self.steps and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
        return control


TRAINING_TIME = "training_time.json"


def tokens_trained(statistics: dict, steps: list[int], global_batch_size: int, after_step: int = 0) -> float:
    """The tokens of the optimizer steps after `after_step`: each phase's steps (`steps`, in order) times the batch
    times that phase's mean tokens per example (data_statistics.json)."""
    tokens, first = 0.0, 0
    for i, n in enumerate(steps):
        phase = statistics[f"phase{i + 1}"]
        tokens += phase["tokens"] / max(phase["examples"], 1) * max(0, first + n - max(first, after_step)) \
            * global_batch_size
        first += n
    return tokens


class TrainingClock(TrainerCallback):
    """Keeps the training time of all invocations of a run: each checkpoint records the seconds trained up to it
    (`training_time.json`), and a resumed run starts its clock there, so that its `train_runtime_s` and
    `tokens_per_second` are the whole run's, not the last invocation's. A checkpoint without the record (written by
    an older version) leaves the time before it unknown: the clock then counts from that checkpoint's step
    (`from_step`), and the results say so rather than pass part of a run's time off as the whole."""

    def __init__(self, resume_from: str | Path | None):
        self.before, self.from_step = 0.0, 0
        if resume_from and (Path(resume_from) / TRAINING_TIME).is_file():
            self.before = float(json.loads((Path(resume_from) / TRAINING_TIME).read_text())["train_seconds"])
        elif resume_from:
            self.from_step = checkpoint_step(resume_from)
            logger.warning("%s has no %s (written by an older version): the time trained before step %d is unknown, "
                           "so train_runtime_s counts from there (results.json: train_runtime_from_step)",
                           resume_from, TRAINING_TIME, self.from_step)
        self.start = time.time()

    def seconds(self) -> float:
        return self.before + time.time() - self.start

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.time()

    def on_save(self, args, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            (checkpoint / TRAINING_TIME).write_text(json.dumps(
                {"train_seconds": round(self.seconds(), 1), "global_step": state.global_step}))


def model_config(run: PreTrainingArguments, objective: str = DEFAULT_OBJECTIVE, **fields) -> BertReproConfig:
    """The model's config: the preset with `fields` and --model_overrides, or --init_from's config, with the run's
    `objective` (--objective; the data are built for it too). Settings that cannot work are a ConfigurationError."""
    try:
        overrides = json.loads(run.model_overrides) if run.model_overrides else {}
    except json.JSONDecodeError as err:
        raise ConfigurationError(f"--model_overrides is not valid JSON ({err}); write a JSON object of "
                                 "BertReproConfig fields, e.g. '{\"hidden_dropout_prob\": 0.0}'.") from None
    if not isinstance(overrides, dict):
        raise ConfigurationError(f"--model_overrides must be a JSON object of BertReproConfig fields, got {overrides!r}.")
    if "objective" in overrides:
        raise ConfigurationError("Set the pre-training objective with --objective (it decides how the data are built "
                                 "too), not in --model_overrides.")
    if run.init_from:
        check_model_dir(run.init_from)
    try:
        if run.init_from:  # continued pre-training keeps the checkpoint's attention direction (from_pretrained checks)
            config = BertReproConfig.from_pretrained(run.init_from, objective=objective)
            for name, value in run.switches().items():
                setattr(config, name, value)
            check_objective_switches(config)
            return config
        return BertReproConfig.from_preset(run.preset, **{**fields, "objective": objective, **overrides})
    except (StrictDataclassError, ValueError, TypeError) as err:  # the config's own checks name the field
        reason = str(err).strip().splitlines()[-1].strip()
        source = f"--init_from {run.init_from}" if run.init_from else f"--preset {run.preset}, --model_overrides"
        raise ConfigurationError(f"The model configuration ({source}, --objective {objective}) is invalid: "
                                 f"{reason}") from None


def check_lengths(config: BertReproConfig, phases: list[PreTrainingDataConfig]) -> None:
    longest = max(cfg.max_seq_length for cfg in phases)
    if longest > config.max_position_embeddings:
        raise ConfigurationError(
            f"max_seq_length {longest} is longer than the model's max_position_embeddings "
            f"({config.max_position_embeddings}); lower max_seq_length / phase2_max_seq_length."
        )


def build_model(run: PreTrainingArguments, tokenizer, phases: list[PreTrainingDataConfig]) -> BertReproForPreTraining:
    config = model_config(run, phases[0].objective, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    check_lengths(config, phases)
    if len(tokenizer) > config.vocab_size:
        raise ConfigurationError(f"The tokenizer has {len(tokenizer)} tokens but the model only {config.vocab_size}.")
    if run.init_from:
        model = BertReproForPreTraining.from_pretrained(
            run.init_from, attn_implementation=run.attn_implementation, sparse_prediction=run.sparse_prediction,
            objective=config.objective, **run.switches(),
        )
    else:
        for name, value in {**run.switches(), "sparse_prediction": run.sparse_prediction}.items():
            setattr(config, name, value)
        model = BertReproForPreTraining._from_config(config, attn_implementation=run.attn_implementation)
    if not config.pretraining_objective.next_sentence:
        # No NSP: the pooler and NSP head stay as initialised (a fine-tune starts them afresh, as the paper's No NSP
        # model must); frozen so that DDP finds no unused parameter and weight decay leaves them alone.
        model.bert.pooler.requires_grad_(False)
        model.cls.seq_relationship.requires_grad_(False)
    return model.compile_layers() if run.compile_layers else model


def gradient_accumulation(global_batch_size: int, per_device: int, world_size: int) -> int:
    per_step = per_device * world_size
    if global_batch_size % per_step:
        raise ConfigurationError(
            f"global_batch_size {global_batch_size} is not a multiple of per_device_train_batch_size {per_device} "
            f"x {world_size} processes."
        )
    return global_batch_size // per_step


def checkpoint_to_resume(output_dir: Path, resume_from: bool | str | None, streamed: bool = False) -> str | None:
    """`--resume_from_checkpoint true`: the newest complete checkpoint (broken newer ones skipped, with the reason),
    or None when nothing was saved yet; a named checkpoint is checked the same way."""
    if resume_from is True:
        found = newest_valid_checkpoint(output_dir, streamed=streamed)
        if found is None:
            logger.info("no checkpoint in %s yet: starting at step 0", output_dir)
        return None if found is None else str(found)
    if resume_from:
        problem = checkpoint_problem(resume_from, streamed=streamed)
        if problem:
            raise ConfigurationError(f"Cannot resume from {resume_from}: {problem}.")
    return resume_from or None


def forget_unstarted_run(output_dir: Path) -> None:
    """Remove what a run wrote into its (new or empty) output directory before its data preparation failed."""
    (output_dir / RUN_CONFIG).unlink(missing_ok=True)
    shutil.rmtree(output_dir / TOKENIZER_DIR, ignore_errors=True)
    if output_dir.is_dir() and not any(output_dir.iterdir()):
        output_dir.rmdir()


def _importable(module: str) -> bool:
    """Whether an optional package imports: checked before training, so that none is missed after hours of it."""
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def run_pretraining(argv: list[str] | None = None) -> dict[str, Any]:
    """The whole job: arguments -> data -> model -> Trainer -> saved checkpoint, statistics, curves."""
    check_deepspeed_installed(sys.argv[1:] if argv is None else argv)
    run, data, training = parse_arguments(argv)
    check_engine(training, optimizer=run.optimizer)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        datefmt="%H:%M:%S")
    output_dir = Path(training.output_dir)
    resume_arg = training.resume_from_checkpoint
    resume = resume_arg not in (None, "", "false", "False")
    resume_from = (True if resume_arg in ("true", "True") else resume_arg) if resume else None
    training.gradient_accumulation_steps = gradient_accumulation(
        run.global_batch_size, training.per_device_train_batch_size, training.world_size)
    record = run_record(run, data, training)
    check_output_dir(output_dir, record, resume=resume, overwrite=run.overwrite_output_dir, identity=run_identity)
    resume_from = checkpoint_to_resume(output_dir, resume_from, streamed=run.streaming)
    pin_memory_only_with_an_accelerator(training)
    phase_cfgs = phase_configs(data, run)
    check_lengths(model_config(run, data.objective, **run.switches()), phase_cfgs)  # before any data work
    if warning := run.torch_compile_warning(training.torch_compile):
        logger.warning(warning)
    if training.torch_compile and run.packing:
        allow_data_dependent_shapes()
    if run.packing and data.pretraining_objective.causal:
        raise ConfigurationError(f"--packing true cannot be used with --objective {data.objective}: packed rows keep "
                                 "each example to itself in both directions, not left-to-right. Turn packing off.")
    if run.streaming:
        if training.dataloader_num_workers and training.save_strategy not in ("steps", "no"):
            raise ConfigurationError(
                "--streaming true with --dataloader_num_workers keeps the stream's position at planned steps: use "
                f"--save_strategy steps (not {training.save_strategy.value}), or no workers.")
        training.ignore_data_skip = True  # resuming restores the stream's own position instead of re-reading it
    push_to = take_push_request(training)  # the Hub reachable and the token accepted, before any data work too
    if run.plot and not _importable("matplotlib"):
        logger.warning("matplotlib is not installed (pip install 'bert-repro[train]'): not writing training_curves.png")
        run.plot = False
    if training.report_to and "tensorboard" in training.report_to:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            logger.warning("tensorboard is not installed (pip install 'bert-repro[train]'): not writing its logs")
            training.report_to = [r for r in training.report_to if r != "tensorboard"]

    lock_output_dir_once(output_dir, training, lambda: check_output_dir(  # one run per directory from here on
        output_dir, record, resume=resume, overwrite=run.overwrite_output_dir, identity=run_identity))
    fresh = not any(p.name != RUN_LOCK for p in output_dir.iterdir())
    with training.main_process_first(desc="preparing pre-training data"):
        if training.process_index == 0:
            output_dir.mkdir(parents=True, exist_ok=True)
            (output_dir / RUN_CONFIG).write_text(json.dumps(record, indent=2))
        try:
            if run.streaming:
                tokenizer, phases, eval_dataset, statistics = build_streaming_datasets(
                    run, data, training, output_dir, phase_steps(training.max_steps, run.phase2_fraction,
                                                                 len(phase_cfgs)))
            else:
                tokenizer, phases, eval_dataset, statistics = build_datasets(run, data, training, output_dir)
        except BaseException:
            if fresh and training.process_index == 0:
                forget_unstarted_run(output_dir)  # so that a retry with other data is not "a different run"
            raise
    if training.process_index == 0:
        (output_dir / "data_statistics.json").write_text(json.dumps(statistics, indent=2))
        log_statistics(statistics)

    set_seed(training.seed)  # the initial weights must not depend on what data preparation drew before
    model = build_model(run, tokenizer, phase_cfgs)
    steps = phase_steps(training.max_steps, run.phase2_fraction, len(phase_cfgs))
    if training.process_index == 0 and not run.streaming:
        for warning in repetition_warnings(statistics, steps, run.global_batch_size, phase_cfgs):
            logger.warning(warning)
    clock = TrainingClock(resume_from)
    callbacks = [clock] + ([StopAfterSteps(run.stop_after_steps)] if run.stop_after_steps else [])
    if run.streaming:  # `phases` is this process's stream of examples, all phases in one
        per_step = training.gradient_accumulation_steps  # batches
        callbacks.append(DataStateCallback(phases, per_step))
        if resume_from:
            try:
                load_data_state(phases, resume_from)
            except ValueError as err:
                raise ConfigurationError(f"Cannot resume the stream: {err}.") from None
        # Where Trainer will save (its own rule, DefaultFlowCallback): the workers keep their positions there.
        every = training.save_steps
        every = int(every) if every >= 1 else math.ceil(training.max_steps * every)
        start = checkpoint_step(resume_from) if resume_from else 0
        stop = start + run.stop_after_steps if run.stop_after_steps else training.max_steps
        # A stop on a signal saves too: with workers, at the next multiple of STREAM_STOP_EVERY steps.
        stop_every = STREAM_STOP_EVERY if training.dataloader_num_workers else 0
        periodic = every if training.save_strategy == "steps" else 0
        phases.plan_saves(every=[periodic * per_step, stop_every * per_step],
                          at=[stop * per_step, training.max_steps * per_step])
    if eval_dataset is None:
        training.eval_strategy = IntervalStrategy.NO
    trainer = PreTrainingTrainer(
        model=model,
        args=training,
        train_dataset=phases if run.streaming else phases[0] if len(phases) == 1 else datasets.concatenate_datasets(
            phases),
        eval_dataset=eval_dataset,
        data_collator=PhaseCollator(tokenizer, phase_cfgs, packing=run.packing,
                                    compiled=training.torch_compile),
        processing_class=tokenizer,
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs(
            run.optimizer, lr=training.learning_rate, betas=(training.adam_beta1, training.adam_beta2),
            eps=training.adam_epsilon, weight_decay=training.weight_decay),
        phase_sizes=None if run.streaming else [len(p) for p in phases],
        phase_samples=[n * run.global_batch_size for n in steps],
        callbacks=callbacks or None,
    )
    if run.streaming and training.dataloader_num_workers:
        trainer.stop_on_signal.stop_every = STREAM_STOP_EVERY
    start = time.time()
    result = trainer.train(resume_from_checkpoint=resume_from)
    elapsed = time.time() - start  # this invocation's
    if trainer.stop_on_signal.stopped:
        name, step = trainer.stop_on_signal.stopped
        if trainer.is_world_process_zero():
            logger.warning(stop_message(trainer.stop_on_signal, ["--resume_from_checkpoint", "true"]))
        return {"stopped_at_step": step, "stopped_by": name}
    if trainer.state.global_step < training.max_steps:
        logger.info("stopped after step %d of %d; continue with --resume_from_checkpoint true",
                    trainer.state.global_step, training.max_steps)
        return {"stopped_at_step": trainer.state.global_step}

    summary = {"train_runtime_s": round(clock.seconds(), 1), "global_step": trainer.state.global_step,
               "train_loss": result.training_loss, "processes": training.world_size,
               "gradient_accumulation_steps": training.gradient_accumulation_steps, "engine": trainer.engine}
    if run.streaming:  # the tokens this invocation trained on, summed over the processes, over its time
        tokens = trainer.accelerator.reduce(torch.tensor(float(trainer.tokens_seen), device=training.device),
                                            reduction="sum").item()
        summary["tokens_per_second"] = round(tokens / elapsed, 1)
    else:  # the tokens of every step the clock timed (all of them, unless it starts at from_step), over its time
        tokens = tokens_trained(statistics, steps, run.global_batch_size, after_step=clock.from_step)
        summary["tokens_per_second"] = round(tokens / clock.seconds(), 1)
    if clock.from_step:
        summary["train_runtime_from_step"] = clock.from_step
    if eval_dataset is not None:
        summary.update(trainer.evaluate())
    trainer.save_full_model(str(output_dir))  # every process: FSDP gathers the shards
    if trainer.is_world_process_zero():
        save_tokenizer(tokenizer, output_dir)
        (output_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
        (output_dir / "results.json").write_text(json.dumps(summary, indent=2))
        if run.plot:
            plot_curves(trainer.state.log_history, output_dir / "training_curves.png", data.pretraining_objective)
        log_table("results", summary)
        if push_to is not None:  # every checkpoint as branch step-N, the final model on main
            push_checkpoints(output_dir, push_to["repo_id"], private=push_to["private"])
    return summary


# ---------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------


def log_table(title: str, values: dict[str, Any]) -> None:
    width = max(len(k) for k in values)
    lines = [f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in values.items()]
    logger.info("%s\n%s", title, "\n".join(lines))


# The paper's repetition: 40 epochs over its text, built with dupe_factor 10 (the reference code's default), so each
# statically masked example is seen about 4 times (section A.2, create_pretraining_data.py).
PAPER_TEXT_PASSES, PAPER_EXAMPLE_REPEATS = 40, 4


def repetition_warnings(statistics: dict[str, dict], steps: list[int], global_batch_size: int,
                        phase_cfgs: list[PreTrainingDataConfig]) -> list[str]:
    """What a run repeats more than the paper does, per phase: the same masked examples (static masks), or its text.
    A small corpus trained for many steps is memorised, its training loss parting from the held-out one (measured
    in README, "Where this size spends its budget"), so the user hears it before the steps are spent."""
    warnings = []
    for i, (n, cfg) in enumerate(zip(steps, phase_cfgs)):
        examples = statistics.get(f"phase{i + 1}", {}).get("examples")
        if not examples or not n:
            continue
        showings = n * global_batch_size / examples  # how often each built example is drawn
        text_passes = showings * cfg.dupe_factor
        if cfg.stores_masks and showings > PAPER_EXAMPLE_REPEATS:
            warnings.append(
                f"phase{i + 1}: {n:,} steps of {global_batch_size} show each of its {examples:,} examples "
                f"{showings:.1f} times with the same masks (the paper: about {PAPER_EXAMPLE_REPEATS}); the model will "
                "learn them by heart. Give it more text (--corpus), more maskings (--dupe_factor) or fresh masks per "
                "batch (--static_masking false).")
        elif text_passes > PAPER_TEXT_PASSES:
            warnings.append(
                f"phase{i + 1}: {n:,} steps of {global_batch_size} pass over its text about {text_passes:.0f} times "
                f"(the paper: {PAPER_TEXT_PASSES}); on this little text the model will learn it by heart. Give it "
                "more text (--corpus) or fewer steps.")
    return warnings


def log_statistics(statistics: dict[str, dict]) -> None:
    for name, stats in statistics.items():
        log_table(f"pre-training data, {name}",
                  {k: v for k, v in stats.items() if not isinstance(v, (dict, list))})


def plot_curves(log_history: list[dict], path: Path, objective: PreTrainingObjective | None = None) -> None:
    """Training and held-out curves of the pre-training metrics (those of `metrics_from_sums`), one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objective = objective or pretraining_objective(DEFAULT_OBJECTIVE)
    task = objective.token_task
    panels = ([f"{task}_loss", "nsp_loss", f"{task}_accuracy", "nsp_accuracy"] if objective.next_sentence
              else [f"{task}_loss", f"{task}_accuracy"])
    fig, axes = plt.subplots(len(panels) // 2, 2, figsize=(10, 3.5 * (len(panels) // 2)), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        for prefix, style in (("", "-"), ("eval_", "o-")):
            points = [(e["step"], e[prefix + key]) for e in log_history if prefix + key in e]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, label="held-out" if prefix else "training", markersize=3)
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
