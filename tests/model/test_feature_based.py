"""The feature-based approach (paper §5.3, Table 7) and the "+ BiLSTM" head (Table 5): bert_repro.model.bilstm_heads,
through the task kinds and the fine-tuning recipe, against references computed by hand.
"""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import ROOT
from support.models import padded_batch, tiny_config
from support.task_files import finetune_args, fixture_files, write
from support.without_package import assert_same_outputs, inputs_for, our_outputs, run_without_package

import bert_repro
from bert_repro import BertReproForPreTraining, concat_last_layers
from bert_repro.model.bilstm_heads import (
    FEATURE_SETS,
    BertReproBiLSTMConfig,
    BertReproForQuestionAnsweringWithBiLSTM,
    BertReproForSequenceClassificationWithBiLSTM,
    BertReproForTokenClassificationWithBiLSTM,
    FeatureSetError,
    parse_feature_set,
)
from bert_repro.tasks.kinds import KINDS, SPAN, TOKEN_CLASSIFICATION
from bert_repro.tasks.registry import FEATURE_BASED_GRID, get_task
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.finetuning import FineTuningRecipe

LAYERS = 5  # so that "the last four" and "all" differ
SIZES = {"num_hidden_layers": LAYERS, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 24}
BILSTM_CLASSES = (
    BertReproForTokenClassificationWithBiLSTM,
    BertReproForQuestionAnsweringWithBiLSTM,
    BertReproForSequenceClassificationWithBiLSTM,
)


def bilstm_config(**overrides) -> BertReproBiLSTMConfig:
    fields = {**tiny_config(**SIZES).to_dict(), "num_labels": 3, "bilstm_hidden_size": 8, **overrides}
    for key in ("model_type", "transformers_version", "architectures", "auto_map", "id2label", "label2id"):
        fields.pop(key, None)
    return BertReproBiLSTMConfig(**fields)


def bilstm_model(model_class=BertReproForTokenClassificationWithBiLSTM, seed=0, **overrides):
    torch.manual_seed(seed)
    model = model_class(bilstm_config(**overrides))
    for module in model.modules():  # weights away from their initial values, so that a lost weight shows
        if type(module).__name__ == "ScalarMix":
            with torch.no_grad():
                module.weights.copy_(torch.randn_like(module.weights))
                module.gamma.fill_(1.7)
    return model


# Feature sets against the hidden states, by hand


def weighted(states, indices, mix):
    weights = torch.softmax(mix.weights.detach(), dim=0)
    return mix.gamma.detach() * sum(w * states[i] for w, i in zip(weights, indices))


# for L = 5: hidden state 0 is the embeddings, 5 the last layer
BY_HAND = {
    "embeddings": lambda hs, mix: hs[0],
    "second_to_last_hidden": lambda hs, mix: hs[4],
    "last_hidden": lambda hs, mix: hs[5],
    "weighted_sum_last_four": lambda hs, mix: weighted(hs, (2, 3, 4, 5), mix),
    "concat_last_four": lambda hs, mix: torch.cat([hs[2], hs[3], hs[4], hs[5]], dim=-1),
    "weighted_sum_all": lambda hs, mix: weighted(hs, (1, 2, 3, 4, 5), mix),
    "layers=-2": lambda hs, mix: hs[4],
    "layers=0,5,1": lambda hs, mix: torch.cat([hs[0], hs[5], hs[1]], dim=-1),
    "weighted_layers=-1,1": lambda hs, mix: weighted(hs, (5, 1), mix),
}


@pytest.mark.parametrize("spec", sorted({*FEATURE_SETS, *BY_HAND}))  # a named set without its by-hand: KeyError
def test_feature_set_equals_hidden_states_by_hand(spec):
    model = bilstm_model(feature_set=spec, freeze_encoder=True).eval()
    batch = padded_batch(model.config.vocab_size, batch=3, seq=10)
    with torch.no_grad():
        states = model.bert(**batch, output_hidden_states=True).hidden_states
    assert len(states) == LAYERS + 1
    expected = BY_HAND[spec](states, model.token_features.mix)
    width = {"concat_last_four": 4, "layers=0,5,1": 3}.get(spec, 1) * 16
    assert expected.shape == (3, 10, width) == (3, 10, model.bilstm.lstm.input_size)
    seen = []  # what the BiLSTM is fed
    handle = model.bilstm.register_forward_hook(lambda module, args, output: seen.append(args[0].detach()))
    with torch.no_grad():
        model(**batch)
    handle.remove()
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=1e-6)
    if spec == "concat_last_four":  # the model file's helper for the paper's best feature set
        torch.testing.assert_close(seen[0], concat_last_layers(states, 4), rtol=0, atol=0)


@pytest.mark.parametrize(
    "spec, message", [("layers=6", "index 6"), ("layers=-7", "index -7"), ("weighted_layers=1,9", "index 9")]
)
def test_layer_index_out_of_range_names_the_layer_count(spec, message):
    with pytest.raises(Exception, match="feature layer " + message) as caught:
        bilstm_config(feature_set=spec)
    assert "the model has 5 layers" in str(caught.value) and "0..5" in str(caught.value)
    with pytest.raises(FeatureSetError, match="the model has 5 layers"):
        parse_feature_set(spec).indices(LAYERS)
    assert parse_feature_set("layers=5").indices(LAYERS) == (5,)  # the edges are in range
    assert parse_feature_set("layers=-6").indices(LAYERS) == (0,)


def test_last_four_on_a_two_layer_model_and_bad_specs():
    with pytest.raises(FeatureSetError, match="'concat_last_four' is out of range: the model has 2 layers"):
        FEATURE_SETS["concat_last_four"].indices(2)
    for bad, message in (
        ("bogus", "unknown feature set 'bogus'"),
        ("layers=", "layer indices as integers"),
        ("layers=a,b", "layer indices as integers"),
    ):
        with pytest.raises(FeatureSetError, match=message):
            parse_feature_set(bad)
    with pytest.raises(Exception, match="bilstm_num_layers must be a positive integer"):
        bilstm_config(bilstm_num_layers=0)


# Freezing, padding


@pytest.mark.parametrize("spec", ["concat_last_four", "weighted_sum_all"])
def test_frozen_encoder_gets_no_gradient_and_keeps_its_weights(spec):
    model = bilstm_model(
        feature_set=spec, freeze_encoder=True, hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5
    )
    model.train()
    assert not model.bert.training and model.bilstm.training  # the encoder's dropout stays off
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = padded_batch(model.config.vocab_size, batch=3, seq=10)
    labels = torch.randint(0, 3, (3, 10))
    seen = []  # the encoder's hidden states in each forward
    handle = model.bert.register_forward_hook(lambda module, args, out: seen.append(torch.stack(out.hidden_states)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    loss = model(**batch, labels=labels).loss
    loss.backward()
    for name, parameter in model.named_parameters():
        if name.startswith("bert."):
            assert not parameter.requires_grad and parameter.grad is None, name
        else:
            assert parameter.requires_grad and parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    optimizer.step()
    model(**batch, labels=labels)  # a second training-mode forward: the same hidden states (no dropout)
    handle.remove()
    torch.testing.assert_close(seen[0], seen[1], rtol=0, atol=0)
    after = model.state_dict()
    for key, value in before.items():
        if key.startswith("bert."):
            assert torch.equal(value, after[key]), key
    assert not torch.equal(before["classifier.weight"], after["classifier.weight"])
    assert not torch.equal(before["bilstm.lstm.weight_ih_l0"], after["bilstm.lstm.weight_ih_l0"])


def test_bilstm_fine_tuning_trains_the_encoder_too():
    model = bilstm_model(BertReproForQuestionAnsweringWithBiLSTM).train()
    assert model.bert.training
    batch = padded_batch(model.config.vocab_size, batch=3, seq=10)
    model(**batch, start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 2, 4])).loss.backward()
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


def test_bilstm_on_a_left_to_right_encoder_adds_the_right_context(tmp_path):
    """Table 5's "+ BiLSTM" on the causal LTR encoder: the right context reaches a position only through the BiLSTM."""
    import warnings

    torch.manual_seed(0)
    with warnings.catch_warnings():  # a causal checkpoint is saved for remote code only, with a warning
        warnings.simplefilter("ignore")
        BertReproForPreTraining(tiny_config(objective="ltr", **SIZES)).save_pretrained(tmp_path)
    model = BertReproForQuestionAnsweringWithBiLSTM.from_pretrained(tmp_path, bilstm_hidden_size=8).eval()
    assert model.config.objective == "ltr"
    batch = padded_batch(model.config.vocab_size, batch=2, seq=10)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["input_ids"][:, 5] = 7  # a token after the positions compared
    with torch.no_grad():
        encoder = [model.bert(**b).last_hidden_state[:, :5] for b in (batch, changed)]
        start = [model(**b).start_logits[:, :5] for b in (batch, changed)]
    torch.testing.assert_close(encoder[0], encoder[1], rtol=0, atol=1e-6)
    assert (start[0] - start[1]).abs().max() > 1e-4


@pytest.mark.parametrize("model_class", BILSTM_CLASSES)
def test_bilstm_reads_the_real_tokens_only(model_class):
    """Outputs at real tokens do not depend on the padding after them; right padding is required."""
    model = bilstm_model(model_class, feature_set="weighted_sum_last_four").eval()
    batch = padded_batch(model.config.vocab_size, batch=3, seq=12)
    length = int(batch["attention_mask"][2].sum())
    alone = {k: v[2:, :length] for k, v in batch.items()}
    with torch.no_grad():
        padded, unpadded = model(**batch), model(**alone)
    for name in ("logits", "start_logits", "end_logits"):
        if name in unpadded:
            got = padded[name][2:] if name == "logits" and padded[name].dim() == 2 else padded[name][2:, :length]
            torch.testing.assert_close(got, unpadded[name], rtol=0, atol=1e-5)
    left = {k: v.flip(-1) for k, v in batch.items()}
    with pytest.raises(ValueError, match="right-padded"):
        model(**left)


def test_bilstm_against_an_lstm_run_on_each_sequence_alone():
    """The packed BiLSTM and its final states (what classification reads) equal torch's LSTM on each row alone."""
    from bert_repro.model.bilstm_heads import BiLSTM

    torch.manual_seed(0)
    bilstm = BiLSTM(6, 5, num_layers=2).eval()
    features = torch.randn(3, 9, 6)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for row, length in enumerate((9, 4, 1)):
        mask[row, :length] = 1
    with torch.no_grad():
        outputs, final = bilstm(features, mask)
        for row, length in enumerate((9, 4, 1)):
            alone, _ = bilstm.lstm(features[row : row + 1, :length])
            torch.testing.assert_close(outputs[row, :length], alone[0], rtol=0, atol=1e-6)
            assert not outputs[row, length:].any()  # zero at padding
            torch.testing.assert_close(final[row], torch.cat([alone[0, -1, :5], alone[0, 0, 5:]]), rtol=0, atol=1e-6)


def test_new_head_starts_as_documented(tmp_path):
    """From a checkpoint: PyTorch's LSTM init, the scalar mix at equal weights and gamma 1, the encoder as saved."""
    torch.manual_seed(0)
    BertReproForPreTraining(tiny_config(**SIZES)).save_pretrained(tmp_path)
    model = BertReproForTokenClassificationWithBiLSTM.from_pretrained(
        tmp_path, num_labels=3, feature_set="weighted_sum_all", freeze_encoder=True, bilstm_hidden_size=8
    )
    bound = 8**-0.5
    for name, parameter in model.bilstm.named_parameters():
        assert parameter.abs().max() <= bound and parameter.std() > bound / 3, name
    assert torch.equal(model.token_features.mix.weights, torch.zeros(LAYERS))
    assert model.token_features.mix.gamma.item() == 1.0
    saved = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items() if k.startswith("bert."))


# Saving and loading


@pytest.mark.parametrize(
    "model_class, spec, frozen",
    [
        (BertReproForTokenClassificationWithBiLSTM, "weighted_sum_last_four", True),
        (BertReproForQuestionAnsweringWithBiLSTM, "last_hidden", False),
        (BertReproForSequenceClassificationWithBiLSTM, "layers=-2,-1", False),
    ],
)
def test_save_and_load_give_the_same_weights_and_logits(tmp_path, model_class, spec, frozen):
    import transformers

    model = bilstm_model(model_class, feature_set=spec, freeze_encoder=frozen).eval()
    batch = padded_batch(model.config.vocab_size, batch=3, seq=10)
    with torch.no_grad():
        expected = model(**batch)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "bert_repro_bilstm" and config["architectures"] == [model_class.__name__]
    assert config["feature_set"] == spec and config["freeze_encoder"] is frozen and config["bilstm_hidden_size"] == 8
    assert config["auto_map"] == bert_repro.BILSTM_AUTO_MAP
    code = {p.name for p in tmp_path.glob("*.py")}
    assert {"bilstm_heads.py", "modeling_bert_repro.py", "configuration_bert_repro.py"} <= code
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    auto = next(a for a, p in bert_repro.BILSTM_AUTO_MAP.items() if p.endswith("." + model_class.__name__))
    auto = getattr(transformers, auto)
    saved = model.state_dict()
    for loaded in (model_class.from_pretrained(tmp_path), auto.from_pretrained(tmp_path)):
        assert type(loaded) is model_class
        assert loaded.state_dict().keys() == saved.keys()
        assert all(torch.equal(value, saved[key]) for key, value in loaded.state_dict().items())
        assert all(p.requires_grad != frozen for n, p in loaded.named_parameters() if n.startswith("bert."))
        with torch.no_grad():
            got = loaded.eval()(**batch)
        for name, value in expected.items():
            if torch.is_tensor(value):
                # the LSTM's products may round differently (1e-9) with the weights at other memory addresses
                torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_remote_code_without_the_package(tmp_path):
    """Without bert_repro, trust_remote_code=True loads the saved code with the same outputs; without it, refused."""
    model = bilstm_model(feature_set="concat_last_four", freeze_encoder=True).eval()
    model.save_pretrained(tmp_path / "ner")
    inputs = inputs_for("AutoModelForTokenClassification", model.config.vocab_size, tmp_path / "inputs.pt")
    job = dict(auto="AutoModelForTokenClassification", dir=str(tmp_path / "ner"), inputs=inputs, encoder_inputs=inputs)
    got = run_without_package(
        tmp_path, {"models": {"remote": {**job, "kwargs": {"trust_remote_code": True}}, "plain": job}}, refusals=True
    )["models"]
    assert got["remote"]["class"] == "BertReproForTokenClassificationWithBiLSTM"
    assert_same_outputs(got["remote"]["outputs"], our_outputs(model, inputs), "BiLSTM head, remote code")
    assert "trust_remote_code=True" in got["plain"]["error"]


# Task kinds, registry, recipe arguments


def test_kinds_pick_the_head():
    assert TOKEN_CLASSIFICATION.model_class() is bert_repro.BertReproForTokenClassification
    assert TOKEN_CLASSIFICATION.model_class(feature_based=True) is BertReproForTokenClassificationWithBiLSTM
    assert SPAN.model_class("bilstm") is BertReproForQuestionAnsweringWithBiLSTM
    assert get_task("stsb").kind.model_class("bilstm") is BertReproForSequenceClassificationWithBiLSTM
    assert {k.bilstm_head_class for k in KINDS} == {None, *BILSTM_CLASSES}
    # the refusals (no BiLSTM head, an unknown head, a linear feature-based head): test_task_kinds.py


def test_table7_numbers_are_the_papers():
    task = get_task("conll2003")
    assert {name: r.value for name, r in task.paper_feature_based.items()} == {
        "embeddings": 91.0,
        "second_to_last_hidden": 95.6,
        "last_hidden": 94.9,
        "weighted_sum_last_four": 95.9,
        "concat_last_four": 96.1,
        "weighted_sum_all": 95.5,
    }
    assert list(task.paper_feature_based) == list(FEATURE_SETS)  # the paper's order
    rows = task.paper_feature_based.values()
    assert all((r.model, r.split, r.metric) == ("base", "validation", "entity_f1") for r in rows)
    assert [r.value for r in task.paper if r.model == "base" and r.split == "validation"] == [96.4]  # fine-tuning's
    assert "Concat Last Four Hidden" in task.paper_feature_based["concat_last_four"].source


def test_recipe_arguments(tmp_path):
    common = ["--task", "conll2003", "--model", "m", "--output_dir", str(tmp_path)]
    run, _ = FineTuningRecipe.from_args(common + ["--features", "concat_last_four"]).resolved()
    assert run.features == "concat_last_four" and run.learning_rates == list(FEATURE_BASED_GRID["learning_rate"])
    run, _ = FineTuningRecipe.from_args(common + ["--head", "bilstm"]).resolved()
    assert run.learning_rates == list(get_task("conll2003").grid["learning_rate"])  # fine-tuning: the task's grid
    for extra, message in (
        (["--features", "bogus"], "unknown feature set 'bogus'"),
        (["--features", "last_hidden", "--head", "linear"], "leave out --head linear"),
        (["--bilstm_hidden_size", "8"], "add --head bilstm"),
        (["--head", "bilstm", "--bilstm_hidden_size", "0"], "positive integer"),
    ):
        with pytest.raises(ConfigurationError, match=message):
            FineTuningRecipe.from_args(common + extra)
    with pytest.raises(ConfigurationError, match="swag: .*no BiLSTM head|multiple_choice tasks have no BiLSTM"):
        FineTuningRecipe.from_args(["--task", "swag", *common[2:], "--head", "bilstm"])


# The recipe, end to end on a tiny CoNLL-2003 (and SQuAD) fixture


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece

    texts = [t for name in ("conll2003", "squad") for t in fixture_files(name).values()]
    tokenizer = train_wordpiece(iterator=texts * 3, vocab_size=200, show_progress=False)
    directory = tmp_path_factory.mktemp("tiny-bert-5-layers")
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(tokenizer), max_position_embeddings=128, **SIZES)
    BertReproForPreTraining(config).save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    return directory


def finetune(name, checkpoint, tmp_path, *extra) -> dict:
    """The recipe's run in this process: a few steps on the task's fixture files, into tmp_path / "out"."""
    from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning

    data = write(tmp_path / "data", fixture_files(name))
    settings = dict(max_steps=3, per_device_train_batch_size=2, max_seq_length=64, doc_stride=16, bilstm_hidden_size=8)
    args = finetune_args(name, checkpoint, data, tmp_path / "out", *extra, **settings)
    return run_finetuning(FineTuningRecipe.from_args(args))


def encoder_weights(directory: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in load_file(directory / "model.safetensors").items() if k.startswith("bert.")}


@pytest.mark.slow
def test_feature_based_recipe_end_to_end(tmp_path, tiny_checkpoint):
    task = get_task("conll2003")
    summary = finetune("conll2003", tiny_checkpoint, tmp_path, "--features", "concat_last_four")
    out = tmp_path / "out"
    assert summary["features"] == "concat_last_four"
    assert summary["model_class"] == "BertReproForTokenClassificationWithBiLSTM"
    assert summary["best"]["learning_rate"] == FEATURE_BASED_GRID["learning_rate"][0]
    for split in task.eval_splits:
        assert set(task.metrics) <= set(summary["best"][split])
    assert (out / "results.md").read_text().startswith("# conll2003: feature-based (concat_last_four)")
    config = json.loads((out / "config.json").read_text())
    assert config["feature_set"] == "concat_last_four" and config["freeze_encoder"] is True
    trained, pretrained = encoder_weights(out), encoder_weights(tiny_checkpoint)
    assert len(trained) > 20 and trained.keys() <= pretrained.keys()  # every weight but the pooler's
    assert all(torch.equal(trained[k], pretrained[k]) for k in trained)  # the frozen encoder is unchanged
    assert BertReproForTokenClassificationWithBiLSTM.from_pretrained(out).config.freeze_encoder


@pytest.mark.slow
@pytest.mark.parametrize("name", ["conll2003", "squad"])
def test_bilstm_head_recipe_end_to_end(tmp_path, tiny_checkpoint, name):
    task = get_task(name)
    summary = finetune(name, tiny_checkpoint, tmp_path, "--head", "bilstm", "--learning_rates", "1e-3")
    out = tmp_path / "out"
    assert summary["model_class"] == task.kind.bilstm_head_class.__name__ and summary["features"] is None
    assert set(task.metrics) <= set(summary["best"][task.eval_splits[0]])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [task.kind.bilstm_head_class.__name__] and config["freeze_encoder"] is False
    trained, pretrained = encoder_weights(out), encoder_weights(tiny_checkpoint)
    assert any(not torch.equal(trained[k], pretrained[k]) for k in trained)  # fine-tuned: the encoder moved


@pytest.mark.slow
def test_recipe_bad_features_exit_2(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    """A layer the model lacks is named with the model's depth before any data is read: exit 2, no traceback."""
    paths = (tiny_checkpoint, tmp_path / "none", tmp_path / "out")
    args = finetune_args("conll2003", *paths, cpu=False, features="layers=-1,7")
    monkeypatch.setattr(sys, "argv", ["finetune.py", *args])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "recipes" / "finetune.py"), run_name="__main__")
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2, stderr
    assert "Traceback" not in stderr and stderr.startswith("finetune.py: error: ")
    assert "feature layer index 7" in stderr and "the model has 5 layers" in stderr
    assert not (tmp_path / "out").exists()


def test_a_bilstm_checkpoint_counts_as_ours_for_the_hub_push():
    """A re-push of a BiLSTM checkpoint to its own repository is not refused as "not saved by bert_repro"."""
    from bert_repro.model.checkpoint_format import is_repro_checkpoint

    for model_type, ours in (("bert_repro_bilstm", True), ("bert_repro", True), ("bert", False), ("roberta", False)):
        assert is_repro_checkpoint({"model_type": model_type}) is ours, model_type
