"""The data stage, after the model: corpora, WordPiece vocabularies and pre-training examples (docs/layout.md)."""

from ..exports import lazy_exports

# Read on first use (PEP 562): importing one module of this package does not import datasets' whole pipeline.
_PUBLIC = {
    "decode_text": "corpus",
    "load_corpus": "corpus",
    "load_tokenizer": "wordpiece",
    "save_tokenizer": "wordpiece",
    "train_wordpiece": "wordpiece",
    "WorkerStreams": "streaming",
    "open_stream": "streaming",
    "PackingCollator": "pack_examples",
    "first_fit_decreasing": "pack_examples",
    "padding_statistics": "pack_examples",
    "IGNORE_INDEX": "pretraining_examples",
    "PreTrainingCollator": "pretraining_examples",
    "PreTrainingDataConfig": "pretraining_examples",
    "create_pretraining_dataset": "pretraining_examples",
    "create_pretraining_instances": "pretraining_examples",
    "tokenize_documents": "tokenized_documents",
    "WordPieceVocab": "masking",
}
__all__ = sorted(_PUBLIC)
__getattr__ = lazy_exports(__name__, _PUBLIC)
