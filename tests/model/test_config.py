import json
import logging

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from support.models import ARCH_FIELDS

from bert_repro import PRESETS, BertReproConfig, BertReproForPreTraining

# huggingface_hub's @strict (as in transformers' BertConfig) wraps our ValueError; the message is ours.
CONFIG_ERRORS = (ValueError, StrictDataclassError)

# SPEC section 1: parameter counts with MLM + NSP heads at vocabulary 30,522, as transformers counts them.
EXPECTED_PARAMS = {
    "tiny": 4_433_468,
    "mini": 11_267_900,
    "small": 29_058_876,
    "medium": 41_668_412,
    "base": 110_106_428,
    "large": 336_226_108,
}


@pytest.mark.parametrize("name", list(EXPECTED_PARAMS))
def test_preset_parameter_counts(name):
    config = BertReproConfig.from_preset(name)
    with torch.device("meta"):
        model = BertReproForPreTraining(config)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[name]
    # The decoder is tied to the token embeddings, not a second matrix.
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_presets_match_the_paper():
    assert PRESETS["base"] == dict(
        num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072
    )
    assert PRESETS["large"] == dict(
        num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096
    )
    assert BertReproConfig.from_preset("BERT-Base", vocab_size=1000).vocab_size == 1000


def test_unknown_preset():
    with pytest.raises(ValueError, match="Unknown BERT preset 'huge'.*tiny, mini, small, medium, base, large"):
        BertReproConfig.from_preset("huge")


def test_hidden_size_not_divisible_by_heads():
    with pytest.raises(CONFIG_ERRORS, match=r"hidden_size \(100\) must be divisible by num_attention_heads \(12\)"):
        BertReproConfig(hidden_size=100, num_attention_heads=12)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("hidden_act", "tanh", "hidden_act must be one of"),
        ("initializer_distribution", "uniform", "initializer_distribution must be one of"),
        ("position_embedding_type", "relative_key", "not supported"),
        ("num_hidden_layers", 0, "num_hidden_layers must be a positive integer"),
        # checked before anything divides or compares by them: no ZeroDivisionError or TypeError naming no field
        ("num_attention_heads", 0, "num_attention_heads must be a positive integer, got 0"),
        ("vocab_size", "abc", "vocab_size must be a positive integer, got 'abc'"),
        ("hidden_size", -1, "hidden_size must be a positive integer, got -1"),
        ("hidden_size", True, "hidden_size must be a positive integer"),
        ("hidden_dropout_prob", 1.5, "hidden_dropout_prob must be a dropout probability"),
        ("classifier_dropout", -0.1, "classifier_dropout must be a dropout probability"),
    ],
)
def test_bad_fields(field, value, message):
    with pytest.raises(CONFIG_ERRORS, match=message):
        BertReproConfig(**{field: value})


def test_reads_a_bert_config_json_as_it_is(tmp_path, caplog):
    # The config.json of google-bert/bert-base-uncased, as transformers 4.x wrote it.
    bert_config = {
        "architectures": ["BertForMaskedLM"],
        "attention_probs_dropout_prob": 0.1,
        "gradient_checkpointing": False,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 768,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "model_type": "bert",
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "transformers_version": "4.6.0.dev0",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": 30522,
    }
    (tmp_path / "config.json").write_text(json.dumps(bert_config))
    with caplog.at_level(logging.WARNING):
        config = BertReproConfig.from_pretrained(tmp_path)
    assert "model of type" not in caplog.text
    for key in set(ARCH_FIELDS) - {"num_labels"}:  # the architecture the file gives
        assert getattr(config, key) == bert_config[key], key
    assert config.model_type == "bert_repro"


def test_decoder_bert_config_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "is_decoder": True}))
    with pytest.raises(ValueError, match="decoder"):
        BertReproConfig.from_pretrained(tmp_path)


def test_config_round_trip(tmp_path):
    config = BertReproConfig.from_preset("mini", hidden_act="gelu_new", initializer_distribution="normal")
    config.save_pretrained(tmp_path)
    again = BertReproConfig.from_pretrained(tmp_path)
    assert again.to_dict() == config.to_dict()
