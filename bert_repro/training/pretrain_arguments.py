"""The pre-training recipe's own arguments and the paper's training defaults, in a module of their own: the recipe
(`pretrain.py`) and each of its parts (`pretrain_data`, `pretrain_model`, `pretrain_phases`) read them from here,
so the pipeline imports one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cli import ConfigurationError, SpeedSwitches, check_attention
from .fp8 import fp8_problem

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

    corpus: list[str] = field(
        default_factory=list,
        metadata={"help": "Text: a folder, files or globs (.txt, .jsonl, .parquet, .csv), or a Hub dataset id."},
    )
    hub_config: str | None = field(default=None, metadata={"help": "Config of a Hub dataset (e.g. 20231101.en)."})
    split: str = field(default="train", metadata={"help": "Split of a Hub dataset."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read the corpus as a stream while training (no copy of it or of the examples on disk); NotNext "
            "segments come from a buffer of recent documents (bert_repro.data.streaming)."
        },
    )
    max_documents: int | None = field(
        default=None,
        metadata={"help": "Use at most this many documents (streaming: per pass over the stream, over all processes)."},
    )
    stream_document_buffer: int = field(
        default=1000,
        metadata={"help": "Streaming: NotNext segment B comes from one of this many documents read before A's."},
    )
    stream_shuffle_buffer: int = field(
        default=10_000, metadata={"help": "Streaming: examples shuffled in a buffer of this size (0: stream order)."}
    )
    stream_held_out_documents: int = field(
        default=200,
        metadata={
            "help": "Streaming: the stream's first documents held out for evaluation (never trained on; eval_fraction "
            "applies without streaming); 0 for none."
        },
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the text in table files."})
    document_boundary: str = field(
        default="blank_line",
        metadata={
            "choices": ["blank_line", "file", "wikitext"],
            "help": "Plain text: 'blank_line' (a blank line between documents) or 'file' (one document per file); "
            "'wikitext': WikiText's rows joined into articles at their ' = Title = ' lines.",
        },
    )
    split_lines: bool = field(
        default=False,
        metadata={"help": "Every line break ends a sentence (one paragraph per line), instead of hard-wrapped text."},
    )
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "An existing tokenizer (directory, vocab.txt, tokenizer.json or Hub id); else one is trained."
        },
    )
    vocab_size: int = field(default=30522, metadata={"help": "Size of a newly trained WordPiece vocabulary."})
    lowercase: bool = field(default=True, metadata={"help": "Uncased (lower-case, strip accents) or cased."})
    eval_fraction: float = field(default=0.01, metadata={"help": "Share of documents held out for evaluation."})
    eval_max_examples: int = field(default=2000, metadata={"help": "At most this many held-out examples."})
    num_proc: int | None = field(default=None, metadata={"help": "Processes for data preparation (all cores)."})
    preset: str = field(default="base", metadata={"help": "tiny, mini, small, medium, base or large."})
    model_overrides: str | None = field(
        default=None, metadata={"help": "JSON object of BertReproConfig fields, e.g. '{\"hidden_dropout_prob\": 0.0}'."}
    )
    attn_implementation: str = field(default="sdpa", metadata={"help": "eager, sdpa or flash_attention_2."})
    init_from: str | None = field(
        default=None,
        metadata={
            "help": "Start from the weights of this checkpoint (continued pre-training) instead of a random init."
        },
    )
    global_batch_size: int = field(
        default=256, metadata={"help": "Sequences per optimizer step; gradient accumulation is derived from it."}
    )
    phase2_fraction: float = field(
        default=0.1, metadata={"help": "Share of the steps in phase 2 (long sequences); 0 for one phase."}
    )
    phase2_max_seq_length: int = field(default=512, metadata={"help": "Sequence length of phase 2."})
    phase2_max_predictions_per_seq: int = field(default=80, metadata={"help": "Masked positions in phase 2."})
    optimizer: str = field(
        default="adamw",
        metadata={"choices": ["adamw", "bert_adam", "lamb"], "help": "adamw, bert_adam (reference code) or lamb."},
    )
    sparse_prediction: bool = field(
        default=True,
        metadata={"help": "Run the MLM decoder only at the masked positions (same loss and gradients, fewer FLOPs)."},
    )
    fp8: bool = field(
        default=False,
        metadata={
            "help": "Opt-in, not the paper's: the Transformer blocks' linear layers in float8 (torchao's float8 "
            "training, dynamic scaling; bert_repro/training/fp8.py). Needs torchao, --bf16 and a CUDA card of compute "
            "capability 8.9+ (refused elsewhere); gains under --torch_compile."
        },
    )
    packing: bool = field(
        default=False,
        metadata={
            "help": "Pack each batch's examples into shared rows, attention kept inside each example and NSP read at "
            "each example's [CLS] (same examples, losses and gradients; less padding)."
        },
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Allow writing into an output directory that holds another or a finished run."}
    )
    stop_after_steps: int | None = field(
        default=None,
        metadata={"help": "Stop this invocation after so many optimizer steps, with a checkpoint (resume it later)."},
    )
    plot: bool = field(default=True, metadata={"help": "Write training_curves.png at the end."})


def check_values(run: PreTrainingArguments, training) -> None:
    """Values no run can use, refused before any data is read or the run recorded (each of these used to end in a
    traceback after the corpus was read, or ran on with a meaning nobody asked for)."""
    wrong = [
        f"--{name} {value}"
        for name, value, ok in (
            ("learning_rate", training.learning_rate, training.learning_rate > 0),
            ("max_steps", training.max_steps, training.max_steps >= 1),
            ("global_batch_size", run.global_batch_size, run.global_batch_size >= 1),
            (
                "per_device_train_batch_size",
                training.per_device_train_batch_size,
                training.per_device_train_batch_size >= 1,
            ),
            ("eval_fraction", run.eval_fraction, 0 <= run.eval_fraction < 1),
            ("phase2_fraction", run.phase2_fraction, 0 <= run.phase2_fraction < 1),
            ("eval_max_examples", run.eval_max_examples, run.eval_max_examples >= 1),
            ("num_proc", run.num_proc, run.num_proc is None or run.num_proc >= 1),
            ("max_documents", run.max_documents, run.max_documents is None or run.max_documents >= 1),
            ("stop_after_steps", run.stop_after_steps, run.stop_after_steps is None or run.stop_after_steps >= 1),
            ("stream_document_buffer", run.stream_document_buffer, run.stream_document_buffer >= 1),
            ("stream_shuffle_buffer", run.stream_shuffle_buffer, run.stream_shuffle_buffer >= 0),
            ("stream_held_out_documents", run.stream_held_out_documents, run.stream_held_out_documents >= 0),
            ("weight_decay", training.weight_decay, training.weight_decay >= 0),
            ("seed", training.seed, 0 <= training.seed < 2**32),
            ("save_steps", training.save_steps, training.save_strategy != "steps" or training.save_steps > 0),
        )
        if not ok
    ]
    if wrong:
        raise ConfigurationError(
            f"{', '.join(wrong)}: the learning rate and save_steps must be positive; max_steps, the batch sizes, "
            "eval_max_examples, num_proc, max_documents, stop_after_steps and stream_document_buffer at least 1; "
            "the weight decay, stream_shuffle_buffer and stream_held_out_documents at least 0; the seed in "
            "[0, 2**32); eval_fraction and phase2_fraction in [0, 1)."
        )
    if problem := check_attention(run.attn_implementation):
        raise ConfigurationError(problem)
    if run.fp8 and (problem := fp8_problem(training.bf16)):
        raise ConfigurationError(problem)
