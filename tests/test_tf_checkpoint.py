"""Tests for reading Google's original TensorFlow BERT checkpoints (bert_repro.model.tf_checkpoint).

The tests that write a real checkpoint need TensorFlow (the optional ``tf`` extra) and are skipped
without it; the name mapping, config and missing-TensorFlow tests run everywhere.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from bert_repro.model.tf_checkpoint import (  # noqa: E402
    load_tf_checkpoint,
    read_google_bert_config,
    resolve_checkpoint_prefix,
    tf_name_to_hf,
)

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


# ---------------------------------------------------------------------------------------------
# A tiny model in Google's layout, and what it must become
# ---------------------------------------------------------------------------------------------


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
    """Save ``variables`` TF1-style, so the checkpoint keys are exactly these names (as Google's are).

    ``tf.train.Checkpoint`` would store object-graph keys (``.../.ATTRIBUTES/VARIABLE_VALUE``)
    instead, which is not what Google's releases contain.
    """
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


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def google_checkpoint(tf, tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A Google-layout checkpoint directory: bert_model.ckpt.{index,data-*} plus optimizer state."""
    directory = tmp_path_factory.mktemp("uncased_L-2_H-8_A-2")
    weights = google_weights()
    write_google_checkpoint(tf, directory / "bert_model.ckpt", {**weights, **optimizer_state(weights)})
    (directory / "bert_config.json").write_text(json.dumps(google_config()))
    return directory, weights


# ---------------------------------------------------------------------------------------------
# Without TensorFlow
# ---------------------------------------------------------------------------------------------


def test_missing_tensorflow_gives_install_hint(tmp_path, monkeypatch):
    prefix = tmp_path / "bert_model.ckpt"
    prefix.with_name("bert_model.ckpt.index").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` raise ImportError
    with pytest.raises(ImportError) as info:
        load_tf_checkpoint(tmp_path)
    message = str(info.value)
    assert 'pip install "bert-repro[tf]"' in message
    assert str(prefix) in message


def test_missing_checkpoint_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="bert_model.ckpt"):
        load_tf_checkpoint(tmp_path / "bert_model.ckpt")
    with pytest.raises(FileNotFoundError, match=r"\.index"):
        load_tf_checkpoint(tmp_path)


def test_resolve_checkpoint_prefix_forms(tmp_path):
    prefix = tmp_path / "bert_model.ckpt"
    for suffix in (".index", ".data-00000-of-00001"):
        prefix.with_name(prefix.name + suffix).write_bytes(b"")
    assert resolve_checkpoint_prefix(tmp_path) == prefix
    assert resolve_checkpoint_prefix(prefix) == prefix
    assert resolve_checkpoint_prefix(str(prefix) + ".index") == prefix
    assert resolve_checkpoint_prefix(str(prefix) + ".data-00000-of-00001") == prefix


def test_directory_with_several_checkpoints_is_ambiguous(tmp_path):
    for name in ("model.ckpt-100.index", "model.ckpt-200.index"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ValueError, match="model.ckpt-100.index, model.ckpt-200.index"):
        resolve_checkpoint_prefix(tmp_path)
    assert resolve_checkpoint_prefix(tmp_path / "model.ckpt-200") == tmp_path / "model.ckpt-200"


def test_name_mapping_covers_google_layout():
    weights = google_weights()
    expected = expected_hf(weights)
    mapped = {}
    for name, value in weights.items():
        target = tf_name_to_hf(name)
        mapped[target.key] = value.T if target.transpose else value
        assert value.ndim == target.rank, name
    assert mapped.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(mapped[key], value, err_msg=key)


@pytest.mark.parametrize(
    "name",
    [
        "output_weights",  # run_classifier's head: not part of the pre-training layout
        "cls/squad/output_bias",
        "bert/encoder/layer_0/attention/self/query/weights",
        "bert/encoder/layer_x/output/dense/kernel",
        "bert/embeddings/LayerNorm/moving_mean",
        "bert/encoder/layer_0/attention/self/LayerNorm/gamma",
    ],
)
def test_unknown_names_raise(name):
    with pytest.raises(ValueError, match=name):
        tf_name_to_hf(name)


# ---------------------------------------------------------------------------------------------
# bert_config.json
# ---------------------------------------------------------------------------------------------


def test_read_google_bert_config(tmp_path):
    raw = {**google_config(), "directionality": "bidi", "pooler_fc_size": 768}
    (tmp_path / "bert_config.json").write_text(json.dumps(raw))
    config = read_google_bert_config(tmp_path)
    assert config == {
        **google_config(),
        "hidden_act": "gelu_new",  # Google's "gelu" is the tanh approximation
        "layer_norm_eps": 1e-12,
    }
    assert read_google_bert_config(tmp_path / "bert_config.json") == config


def test_config_usable_by_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "bert_config.json").write_text(json.dumps(google_config()))
    config = transformers.BertConfig(**read_google_bert_config(tmp_path))
    assert config.hidden_act == "gelu_new"
    assert config.num_hidden_layers == NUM_LAYERS and config.vocab_size == VOCAB


def test_malformed_config(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text('{"hidden_size": 768,')
    with pytest.raises(ValueError, match="bert_config.json.*not valid JSON"):
        read_google_bert_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        read_google_bert_config(path)


def test_config_missing_field(tmp_path):
    raw = google_config()
    del raw["num_attention_heads"]
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="bert_config.json.*num_attention_heads"):
        read_google_bert_config(path)


@pytest.mark.parametrize(
    "field,value",
    [("hidden_size", "768"), ("num_hidden_layers", 0), ("vocab_size", True), ("hidden_act", "swish")],
)
def test_config_bad_values(tmp_path, field, value):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**google_config(), field: value}))
    with pytest.raises(ValueError, match=field):
        read_google_bert_config(path)


def test_config_file_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="bert_config.json"):
        read_google_bert_config(tmp_path)


# ---------------------------------------------------------------------------------------------
# With TensorFlow: a real checkpoint in Google's layout
# ---------------------------------------------------------------------------------------------


def test_load_google_checkpoint(google_checkpoint):
    directory, weights = google_checkpoint
    state_dict, skipped = load_tf_checkpoint(directory / "bert_model.ckpt")
    expected = expected_hf(weights)

    assert sorted(state_dict) == sorted(expected)
    for key, value in expected.items():
        tensor = state_dict[key]
        assert tensor.dtype == torch.float32, key
        assert tensor.is_contiguous(), key
        assert tuple(tensor.shape) == value.shape, key
        np.testing.assert_array_equal(tensor.numpy(), value, err_msg=key)
    assert skipped == sorted(SKIPPED_NAMES)

    # The directory form reads the same checkpoint.
    from_dir, skipped_from_dir = load_tf_checkpoint(directory)
    assert from_dir.keys() == state_dict.keys() and skipped_from_dir == skipped


def test_transposed_kernel_computes_the_tf_dense_layer(google_checkpoint):
    """torch's Linear with the converted weight must compute TF's ``x @ kernel + bias``."""
    directory, weights = google_checkpoint
    state_dict, _ = load_tf_checkpoint(directory)
    x = np.random.default_rng(1).standard_normal((3, HIDDEN)).astype(np.float32)
    kernel = weights["bert/encoder/layer_1/intermediate/dense/kernel"]
    bias = weights["bert/encoder/layer_1/intermediate/dense/bias"]
    linear = torch.nn.Linear(HIDDEN, INTERMEDIATE)
    linear.load_state_dict(
        {
            "weight": state_dict["bert.encoder.layer.1.intermediate.dense.weight"],
            "bias": state_dict["bert.encoder.layer.1.intermediate.dense.bias"],
        }
    )
    with torch.no_grad():
        out = linear(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, x @ kernel + bias, rtol=1e-5, atol=1e-5)


def test_state_dict_loads_into_bert_for_pretraining(google_checkpoint):
    transformers = pytest.importorskip("transformers")
    directory, _ = google_checkpoint
    state_dict, _ = load_tf_checkpoint(directory)
    config = transformers.BertConfig(**read_google_bert_config(directory))
    model = transformers.BertForPreTraining(config)
    result = model.load_state_dict(state_dict, strict=False)
    assert result.unexpected_keys == []
    # Only the decoder, tied to the word embeddings and cls.predictions.bias, is not in the checkpoint.
    assert set(result.missing_keys) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    model.tie_weights()
    assert torch.equal(
        model.cls.predictions.decoder.weight, state_dict["bert.embeddings.word_embeddings.weight"]
    )


def test_unexpected_variable_raises(tf, tmp_path):
    weights = google_weights()
    prefix = tmp_path / "bert_model.ckpt"
    write_google_checkpoint(tf, prefix, {**weights, "output_weights": np.zeros((3, HIDDEN), np.float32)})
    with pytest.raises(ValueError, match="'output_weights'"):
        load_tf_checkpoint(prefix)


def test_wrong_rank_raises(tf, tmp_path):
    weights = google_weights()
    weights["bert/pooler/dense/bias"] = np.zeros((HIDDEN, 1), np.float32)
    prefix = tmp_path / "bert_model.ckpt"
    write_google_checkpoint(tf, prefix, weights)
    with pytest.raises(ValueError, match="bert/pooler/dense/bias.*rank 1"):
        load_tf_checkpoint(prefix)
