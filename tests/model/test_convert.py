"""Loading every public BERT checkpoint format into bert_repro, and the errors on bad input."""

import json
import logging

import numpy as np
import pytest
import torch
import transformers
from support.damaged import damage_model_dir
from support.google_checkpoint import expected_hf
from support.models import hf_config_like, padded_batch, tiny_config

from bert_repro import BertReproForPreTraining, BertReproModel
from bert_repro.model.conversion import CheckpointError, load_bert, main


def hf_checkpoint(tmp_path, hf_cls=transformers.BertForPreTraining, **config_overrides):
    torch.manual_seed(0)
    model = hf_cls(hf_config_like(tiny_config(), **config_overrides)).eval()
    model.save_pretrained(tmp_path)
    return model


def test_hf_pretraining_checkpoint_into_every_head(tmp_path):
    theirs = hf_checkpoint(tmp_path)
    batch = padded_batch(99)
    with torch.no_grad():
        expected = theirs(**batch)
        ours = load_bert(tmp_path, BertReproForPreTraining).eval()
        got = ours(**batch)
        for name in ("prediction_logits", "seq_relationship_logits"):
            assert (got[name] - expected[name]).abs().max() < 1e-5, name
        # The `bert.` prefix is dropped for the bare encoder; heads it lacks are not an error.
        base = load_bert(tmp_path, "base").eval()
        assert torch.allclose(base(**batch).pooler_output, theirs.bert(**batch).pooler_output, atol=1e-5)
        classifier = load_bert(tmp_path, "sequence_classification", num_labels=3)
        assert classifier.classifier.out_features == 3
        assert torch.equal(
            classifier.bert.embeddings.word_embeddings.weight, theirs.bert.embeddings.word_embeddings.weight
        )


def test_checkpoint_without_prefix_and_heads(tmp_path, caplog):
    """A `BertModel` checkpoint (keys without `bert.`, no cls.*), like sentence-transformers models."""
    theirs = hf_checkpoint(tmp_path, transformers.BertModel)
    with caplog.at_level(logging.WARNING):
        ours = load_bert(tmp_path, "pretraining").eval()
    assert "cls.seq_relationship.weight" in caplog.text  # the new heads are listed, not silent
    batch = padded_batch(99)
    with torch.no_grad():
        assert torch.allclose(ours.bert(**batch).last_hidden_state, theirs(**batch).last_hidden_state, atol=1e-5)


def test_legacy_pickle_with_gamma_beta_names(tmp_path, capsys):
    """Old pickles with gamma/beta names are read only when trusted (then weights_only=True), as the refusal says."""
    theirs = hf_checkpoint(tmp_path / "src")
    state = {}
    for key, value in theirs.state_dict().items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[key] = value.clone()
    with torch.no_grad():
        state["bert.embeddings.LayerNorm.gamma"].fill_(1.5)
    assert "cls.predictions.decoder.bias" in state
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    torch.save(state, legacy / "pytorch_model.bin")
    (legacy / "config.json").write_text((tmp_path / "src" / "config.json").read_text())
    command = f"python -m bert_repro.model.conversion import {legacy} {legacy}-safetensors --trust_pickle"
    with pytest.raises(CheckpointError, match=f"only as a pickle \\(pytorch_model.bin\\).*{command}"):
        load_bert(legacy, "pretraining")
    main(command.split()[3:])
    ours = load_bert(f"{legacy}-safetensors", "pretraining")
    assert torch.all(ours.bert.embeddings.LayerNorm.weight == 1.5)
    assert torch.equal(
        ours.bert.encoder.layer[1].output.LayerNorm.bias, theirs.bert.encoder.layer[1].output.LayerNorm.bias
    )


def test_trusted_pickle_that_holds_code_is_still_not_run(tmp_path, capsys):
    hf_checkpoint(tmp_path)
    damage_model_dir(tmp_path, "pickle")  # a pytorch_model.bin that would create tmp_path / "ran"
    with pytest.raises(SystemExit) as exit_:
        main(["import", str(tmp_path), str(tmp_path / "out"), "--trust_pickle"])
    assert exit_.value.code == 2
    assert "the pickle holds more than tensors, so it was not read" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


def test_command_line_import(tmp_path, capsys):
    hf_checkpoint(tmp_path / "hf")
    main(["import", str(tmp_path / "hf"), str(tmp_path / "ours")])
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["model_type"] == "bert"  # transformers' own format
    assert transformers.BertForPreTraining.from_pretrained(tmp_path / "ours") is not None
    with pytest.raises(SystemExit):
        main(["import", str(tmp_path / "hf"), str(tmp_path / "ours")])  # not empty: refused
    assert "not empty" in capsys.readouterr().err


# Bad input


def test_shape_mismatch_names_the_checkpoint(tmp_path):
    hf_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 40
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"Weights in {tmp_path} have other shapes than its config"):
        load_bert(tmp_path, "base")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_safetensors_names_the_file(tmp_path, damage):
    hf_checkpoint(tmp_path)
    weights = tmp_path / "model.safetensors"
    if damage == "truncated":
        damage_model_dir(tmp_path, "truncated")
    else:
        weights.write_bytes(b"\x00\x01 not a safetensors file" * 10)
    with pytest.raises(CheckpointError, match=f"{weights} cannot be read as safetensors.*incomplete"):
        load_bert(tmp_path, "pretraining")
    with pytest.raises(OSError, match=f"{weights} is not a valid safetensors file"):  # our classes, unchecked
        BertReproForPreTraining.from_pretrained(tmp_path)


def test_directory_without_weights(tmp_path):
    tiny_config().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=f"{tmp_path} holds no weights \\(model.safetensors\\)"):
        load_bert(tmp_path, "base")
    with pytest.raises(OSError, match=f"no file named model.safetensors.*{tmp_path}"):
        BertReproModel.from_pretrained(tmp_path)


def test_missing_encoder_weights_are_an_error_not_a_random_init(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_checkpoint(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["bert.encoder.layer.1.attention.self.query.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 1 weights.*encoder\.layer\.1\.attention\.self\.query\.weight"):
        load_bert(tmp_path, "pretraining")
    model = load_bert(tmp_path, "pretraining", allow_missing_encoder_weights=True)  # the explicit opt-out
    assert model is not None


def test_unknown_head():
    with pytest.raises(ValueError, match="Unknown head 'summarisation'"):
        load_bert("anything", "summarisation")


# Google's TensorFlow checkpoints (only where TensorFlow is installed: the `tf` extra)


def test_google_tf_checkpoint_through_load_bert(google_checkpoint):
    directory, weights = google_checkpoint
    model = load_bert(directory, "pretraining")
    assert model.config.hidden_act == "gelu_new"  # Google's code computes the tanh approximation
    state = model.state_dict()
    for key, value in expected_hf(weights).items():
        assert np.array_equal(state[key].numpy(), value), key
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    base = load_bert(directory, "base")
    assert torch.equal(base.pooler.dense.weight, model.bert.pooler.dense.weight)


def test_hub_id_from_the_local_cache(tmp_path):
    """A Hub id resolves through huggingface_hub's cache (offline here): the same call works online."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--google-bert--bert-tiny-test"
    theirs = hf_checkpoint(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    ours = load_bert("google-bert/bert-tiny-test", "pretraining", cache_dir=tmp_path / "cache").eval()
    batch = padded_batch(99)
    with torch.no_grad():
        assert torch.allclose(ours(**batch).prediction_logits, theirs(**batch).prediction_logits, atol=1e-5)
