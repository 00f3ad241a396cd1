"""The model, the first stage: the paper's BERT (`modeling_bert_repro`), its config, the speed paths chosen from
that config, and conversion from and to other BERT checkpoint formats (transformers, Google's TensorFlow)."""

from ..exports import lazy_exports

# Names beyond `bert_repro`'s own (the benchmarks use them), imported on first use (PEP 562).
_PUBLIC = {
    "SPEED_SWITCHES": "configuration_bert_repro",
    "CheckpointError": "conversion",
    "TOKENIZER_FILES": "conversion",
    "load_bert": "conversion",
    "BACKENDS": "attention_backend",
    "backend_order": "attention_backend",
    "flash_varlen_attention": "attention_backend",
    "table_from_micro": "attention_backend",
    "paper_dropout_add_layer_norm": "dropout_add_layer_norm",
}
# Renamed: a package attribute named as a submodule is replaced by the submodule once that is imported.
_RENAMED = {"fused_dropout_add_layer_norm": ("dropout_add_layer_norm", "dropout_add_layer_norm")}
__all__ = sorted([*_PUBLIC, *_RENAMED])
__getattr__ = lazy_exports(__name__, {**_PUBLIC, **_RENAMED})
