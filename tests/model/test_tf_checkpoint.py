"""Reading Google's TensorFlow BERT checkpoints (bert_repro.model.tf_checkpoint); real ones need the ``tf`` extra."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import sys

import numpy as np
import pytest
import torch
from support.google_checkpoint import (
    HIDDEN,
    INTERMEDIATE,
    NUM_LAYERS,
    SKIPPED_NAMES,
    VOCAB,
    expected_hf,
    google_config,
    google_weights,
    write_google_checkpoint,
)

from bert_repro.model.tf_checkpoint import (
    load_tf_checkpoint,
    read_google_bert_config,
    resolve_checkpoint_prefix,
    tf_name_to_hf,
)

# Without TensorFlow


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


# bert_config.json


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


WITHOUT_HEADS = {k: v for k, v in google_config().items() if k != "num_attention_heads"}
BAD_VALUES = [("hidden_size", "768"), ("num_hidden_layers", 0), ("vocab_size", True), ("hidden_act", "swish")]


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"hidden_size": 768,', "bert_config.json.*not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps(WITHOUT_HEADS), "bert_config.json.*num_attention_heads"),
        *[(json.dumps({**google_config(), field: value}), field) for field, value in BAD_VALUES],
    ],
    ids=["malformed", "not-an-object", "missing-field", *(field for field, _ in BAD_VALUES)],
)
def test_bad_config(tmp_path, text, message):
    (tmp_path / "bert_config.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        read_google_bert_config(tmp_path / "bert_config.json")


def test_config_file_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="bert_config.json"):
        read_google_bert_config(tmp_path)


# With TensorFlow: a real checkpoint in Google's layout


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
    assert torch.equal(model.cls.predictions.decoder.weight, state_dict["bert.embeddings.word_embeddings.weight"])


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
