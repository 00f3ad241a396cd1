"""Stage 1, the model: the paper's BERT (`modeling_bert_repro`), its config, the speed paths chosen from that
config, and conversion from and to other BERT checkpoint formats (transformers, Google's TensorFlow)."""
