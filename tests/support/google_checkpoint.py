"""Google's TensorFlow checkpoints: a tiny model in Google's layout, and what it must become."""

from __future__ import annotations

from pathlib import Path

import numpy as np

NUM_LAYERS = 2
HIDDEN = 8
HEADS = 2
INTERMEDIATE = 16
VOCAB = 20
MAX_POSITIONS = 32
TYPE_VOCAB = 2

SKIPPED_NAMES = [
    "bert/embeddings/word_embeddings/adam_m",
    "bert/embeddings/word_embeddings/adam_v",
    "bert/encoder/layer_0/attention/self/query/kernel/adam_m",
    "bert/encoder/layer_0/attention/self/query/kernel/adam_v",
    "global_step",
]


def google_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Every weight of Google's BERT pre-training graph, named as Google's code names them."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    weights = {
        "bert/embeddings/word_embeddings": rand(VOCAB, HIDDEN),
        "bert/embeddings/position_embeddings": rand(MAX_POSITIONS, HIDDEN),
        "bert/embeddings/token_type_embeddings": rand(TYPE_VOCAB, HIDDEN),
        "bert/embeddings/LayerNorm/gamma": rand(HIDDEN),
        "bert/embeddings/LayerNorm/beta": rand(HIDDEN),
        "bert/pooler/dense/kernel": rand(HIDDEN, HIDDEN),
        "bert/pooler/dense/bias": rand(HIDDEN),
        "cls/predictions/output_bias": rand(VOCAB),
        "cls/predictions/transform/dense/kernel": rand(HIDDEN, HIDDEN),
        "cls/predictions/transform/dense/bias": rand(HIDDEN),
        "cls/predictions/transform/LayerNorm/gamma": rand(HIDDEN),
        "cls/predictions/transform/LayerNorm/beta": rand(HIDDEN),
        "cls/seq_relationship/output_weights": rand(2, HIDDEN),
        "cls/seq_relationship/output_bias": rand(2),
    }
    for i in range(NUM_LAYERS):
        layer = f"bert/encoder/layer_{i}"
        for proj in ("query", "key", "value"):
            weights[f"{layer}/attention/self/{proj}/kernel"] = rand(HIDDEN, HIDDEN)
            weights[f"{layer}/attention/self/{proj}/bias"] = rand(HIDDEN)
        weights[f"{layer}/attention/output/dense/kernel"] = rand(HIDDEN, HIDDEN)
        weights[f"{layer}/attention/output/dense/bias"] = rand(HIDDEN)
        weights[f"{layer}/attention/output/LayerNorm/gamma"] = rand(HIDDEN)
        weights[f"{layer}/attention/output/LayerNorm/beta"] = rand(HIDDEN)
        weights[f"{layer}/intermediate/dense/kernel"] = rand(HIDDEN, INTERMEDIATE)
        weights[f"{layer}/intermediate/dense/bias"] = rand(INTERMEDIATE)
        weights[f"{layer}/output/dense/kernel"] = rand(INTERMEDIATE, HIDDEN)
        weights[f"{layer}/output/dense/bias"] = rand(HIDDEN)
        weights[f"{layer}/output/LayerNorm/gamma"] = rand(HIDDEN)
        weights[f"{layer}/output/LayerNorm/beta"] = rand(HIDDEN)
    return weights


def expected_hf(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The HF ``BertForPreTraining`` state dict, spelled out by hand (independent of the module)."""
    w = weights
    out = {
        "bert.embeddings.word_embeddings.weight": w["bert/embeddings/word_embeddings"],
        "bert.embeddings.position_embeddings.weight": w["bert/embeddings/position_embeddings"],
        "bert.embeddings.token_type_embeddings.weight": w["bert/embeddings/token_type_embeddings"],
        "bert.embeddings.LayerNorm.weight": w["bert/embeddings/LayerNorm/gamma"],
        "bert.embeddings.LayerNorm.bias": w["bert/embeddings/LayerNorm/beta"],
        "bert.pooler.dense.weight": w["bert/pooler/dense/kernel"].T,
        "bert.pooler.dense.bias": w["bert/pooler/dense/bias"],
        "cls.predictions.bias": w["cls/predictions/output_bias"],
        "cls.predictions.transform.dense.weight": w["cls/predictions/transform/dense/kernel"].T,
        "cls.predictions.transform.dense.bias": w["cls/predictions/transform/dense/bias"],
        "cls.predictions.transform.LayerNorm.weight": w["cls/predictions/transform/LayerNorm/gamma"],
        "cls.predictions.transform.LayerNorm.bias": w["cls/predictions/transform/LayerNorm/beta"],
        "cls.seq_relationship.weight": w["cls/seq_relationship/output_weights"],  # already [2, H]
        "cls.seq_relationship.bias": w["cls/seq_relationship/output_bias"],
    }
    for i in range(NUM_LAYERS):
        tf_layer, hf_layer = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            out[f"{hf_layer}.attention.self.{proj}.weight"] = w[f"{tf_layer}/attention/self/{proj}/kernel"].T
            out[f"{hf_layer}.attention.self.{proj}.bias"] = w[f"{tf_layer}/attention/self/{proj}/bias"]
        out[f"{hf_layer}.attention.output.dense.weight"] = w[f"{tf_layer}/attention/output/dense/kernel"].T
        out[f"{hf_layer}.attention.output.dense.bias"] = w[f"{tf_layer}/attention/output/dense/bias"]
        attention_ln = f"{tf_layer}/attention/output/LayerNorm"
        out[f"{hf_layer}.attention.output.LayerNorm.weight"] = w[f"{attention_ln}/gamma"]
        out[f"{hf_layer}.attention.output.LayerNorm.bias"] = w[f"{attention_ln}/beta"]
        out[f"{hf_layer}.intermediate.dense.weight"] = w[f"{tf_layer}/intermediate/dense/kernel"].T
        out[f"{hf_layer}.intermediate.dense.bias"] = w[f"{tf_layer}/intermediate/dense/bias"]
        out[f"{hf_layer}.output.dense.weight"] = w[f"{tf_layer}/output/dense/kernel"].T
        out[f"{hf_layer}.output.dense.bias"] = w[f"{tf_layer}/output/dense/bias"]
        out[f"{hf_layer}.output.LayerNorm.weight"] = w[f"{tf_layer}/output/LayerNorm/gamma"]
        out[f"{hf_layer}.output.LayerNorm.bias"] = w[f"{tf_layer}/output/LayerNorm/beta"]
    return out


def google_config() -> dict:
    return {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POSITIONS,
        "num_attention_heads": HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "type_vocab_size": TYPE_VOCAB,
        "vocab_size": VOCAB,
    }


def write_google_checkpoint(tf, prefix: Path, variables: dict[str, np.ndarray]) -> None:
    """Save ``variables`` TF1-style, so the keys are exactly these names as in Google's releases
    (``tf.train.Checkpoint`` would store object-graph keys, ``.../.ATTRIBUTES/VARIABLE_VALUE``)."""
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        for name, value in variables.items():
            v1.get_variable(name, initializer=tf.constant(value))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            v1.train.Saver().save(sess, str(prefix), write_meta_graph=False)


def optimizer_state(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    state = {name: np.zeros_like(weights[name.rsplit("/", 1)[0]]) for name in SKIPPED_NAMES[:-1]}
    state["global_step"] = np.array(1000, dtype=np.int64)
    return state
