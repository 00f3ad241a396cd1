"""Checkpoints bert_repro writes open as transformers' own BERT without bert_repro or remote code, with our outputs.

With trust_remote_code=True they open as our classes; a config transformers' BERT cannot compute is saved for
remote code only, with a warning (bert_repro.model.checkpoint_format).
"""

import itertools
import json
import os
import random
from pathlib import Path

import pytest
import torch
from support.models import padded_batch, tiny_config
from support.pretraining_runs import launch, run_recipe, write_config
from support.task_files import TINY_RUN, finetune_args, fixture_files, write
from support.without_package import (
    MASKED,
    SENTENCES,
    TOLERANCE,
    assert_same_outputs,
    inputs_for,
    our_outputs,
    run_without_package,
)

import bert_repro
from bert_repro.data.wordpiece import load_tokenizer, save_tokenizer, train_wordpiece
from bert_repro.hub.push import code_files
from bert_repro.model.checkpoint_format import NotTransformersBertWarning, repro_class_name, transformers_class_name
from bert_repro.model.configuration_bert_repro import SPEED_SWITCHES
from bert_repro.model.modeling_bert_repro import AUTO_MAP

OUR_CLASSES = {auto: path.split(".")[1] for auto, path in AUTO_MAP.items() if auto != "AutoConfig"}
WORDS = "the a cat dog sat ran on under mat house garden big small red blue king queen river old new".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(200)]
    return train_wordpiece(iterator=texts, vocab_size=80, show_progress=False)


def save_every_head(root: Path, tokenizer, **config_overrides) -> dict[str, tuple[Path, object]]:
    """One directory per Auto class, written by `save_pretrained` of our matching class, tokenizer included."""
    saved = {}
    for auto_name, class_name in OUR_CLASSES.items():
        # two labels elsewhere: transformers' question-answering head has num_labels outputs, ours S and E
        labels = 3 if auto_name in ("AutoModelForSequenceClassification", "AutoModelForTokenClassification") else 2
        config = tiny_config(vocab_size=len(tokenizer), num_labels=labels, **config_overrides)
        torch.manual_seed(0)
        model = getattr(bert_repro, class_name)(config).eval()
        model.save_pretrained(root / auto_name)
        save_tokenizer(tokenizer, root / auto_name)
        saved[auto_name] = (root / auto_name, model)
    return saved


# save_pretrained, every head


def test_every_head_opens_as_transformers_bert_and_as_ours_with_remote_code(tmp_path, tokenizer):
    saved = save_every_head(tmp_path / "saved", tokenizer)
    vocab = len(tokenizer)
    encoder_inputs = inputs_for("AutoModel", vocab, tmp_path / "encoder_inputs.pt")
    plan, expected = {"models": {}}, {}
    for auto_name, (directory, model) in saved.items():
        config = json.loads((directory / "config.json").read_text())
        assert config["model_type"] == "bert" and config["auto_map"] == AUTO_MAP
        assert config["architectures"] == [transformers_class_name(type(model).__name__)]
        # every module the modeling code imports is saved beside it, and the Hub push ships the same list
        assert {"model.safetensors", "checkpoint_format.py", *(p.name for p in code_files())} <= set(
            os.listdir(directory)
        )
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
        assert tokenizer_config["tokenizer_class"] == "BertTokenizer" and "auto_map" not in tokenizer_config
        inputs = inputs_for(auto_name, vocab, tmp_path / f"{auto_name}.pt")
        expected[auto_name] = (type(model).__name__, our_outputs(model, inputs))
    # One pre-trained directory through every Auto class too: the encoder is the same, heads are added where needed.
    pretrained, pretrained_model = saved["AutoModelForPreTraining"]
    for auto_name, remote in itertools.product(OUR_CLASSES, (False, True)):
        job = {
            "auto": auto_name,
            "inputs": str(tmp_path / f"{auto_name}.pt"),  # written above
            "encoder_inputs": encoder_inputs,
            "kwargs": {"trust_remote_code": True} if remote else {},
        }
        plan["models"][f"{auto_name}/{remote}"] = {**job, "dir": str(saved[auto_name][0])}
        plan["models"][f"pretrained/{auto_name}/{remote}"] = {**job, "dir": str(pretrained)}
    plan["tokenizers"] = {auto_name: str(directory) for auto_name, (directory, _) in saved.items()}

    got = run_without_package(tmp_path, plan)
    tokenizers, got = got["tokenizers"], got["models"]

    for auto_name, (class_name, ours) in expected.items():
        native, remote = got[f"{auto_name}/False"], got[f"{auto_name}/True"]
        assert native["class"] == transformers_class_name(class_name), native["class"]
        assert native["module"].startswith("transformers.models.bert."), native["module"]
        assert native["config_class"] == "BertConfig"
        assert_same_outputs(native["outputs"], ours, f"{auto_name} without remote code")
        assert remote["class"] == class_name and remote["module"].startswith("transformers_modules"), remote
        assert remote["config_class"] == "BertReproConfig"
        assert remote["outputs"].keys() == ours.keys()  # our own code: bit for bit
        assert all(torch.equal(remote["outputs"][name], ours[name]) for name in ours), auto_name
    with torch.no_grad():
        encoded = pretrained_model.bert(**torch.load(encoder_inputs, weights_only=True)).last_hidden_state
    for auto_name in OUR_CLASSES:
        diff = (got[f"pretrained/{auto_name}/False"]["encoder"] - encoded).abs().max().item()
        assert diff <= TOLERANCE, (auto_name, diff)
        assert torch.equal(got[f"pretrained/{auto_name}/True"]["encoder"], encoded), auto_name
    ids = tokenizer(SENTENCES)["input_ids"]
    for auto_name in saved:
        loaded = tokenizers[auto_name]
        assert loaded["class"] in ("BertTokenizer", "BertTokenizerFast") and loaded["ids"] == ids, loaded
        assert loaded["seconds"] < 10, loaded["seconds"]  # the remote-code prompt waits 15 s


def test_speed_switches_and_every_activation_load_natively(tmp_path, tokenizer):
    """transformers ignores the speed switches, and computes every activation we accept the same way."""
    from transformers import BertForSequenceClassification
    from transformers.activations import ACT2FN

    from bert_repro.model.configuration_bert_repro import ACTIVATIONS

    variants = [dict.fromkeys(SPEED_SWITCHES, True), *(dict(hidden_act=act) for act in ACTIVATIONS if act in ACT2FN)]
    batch = padded_batch(len(tokenizer), batch=4, seq=12)
    for i, overrides in enumerate(variants):
        torch.manual_seed(i)
        ours = bert_repro.BertReproForSequenceClassification(tiny_config(vocab_size=len(tokenizer), **overrides))
        ours.save_pretrained(tmp_path / str(i))
        assert json.loads((tmp_path / str(i) / "config.json").read_text())["model_type"] == "bert", overrides
        theirs = BertForSequenceClassification.from_pretrained(tmp_path / str(i)).eval()
        with torch.no_grad():
            diff = (theirs(**batch).logits - ours.eval()(**batch).logits).abs().max().item()
        assert diff <= TOLERANCE, (overrides, diff)


def test_fill_mask_pipeline_and_sentence_transformers(tmp_path, tokenizer):
    torch.manual_seed(0)
    config = tiny_config(vocab_size=len(tokenizer))
    directory = tmp_path / "pretrained"
    model = bert_repro.BertReproForPreTraining(config).eval()
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)

    both = {"pretrained": str(directory)}
    got = run_without_package(tmp_path, {"fill_mask": both, "sentence_transformers": both})

    ours = load_tokenizer(directory)
    encoded = ours(MASKED, return_tensors="pt")
    position = encoded["input_ids"][0].tolist().index(ours.mask_token_id)
    with torch.no_grad():
        probabilities = model(**encoded).prediction_logits[0, position].softmax(-1)
    top = probabilities.topk(3)
    filled = got["fill_mask"]["pretrained"]
    assert [token for token, _ in filled] == top.indices.tolist()
    assert max(abs(score - p) for (_, score), p in zip(filled, top.values.tolist())) <= TOLERANCE

    # sentence-transformers' default for a plain BERT directory: mean of the last layer over the real tokens.
    batch = ours(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.bert(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean_pooled = (hidden * mask).sum(1) / mask.sum(1)
    diff = (got["sentence_transformers"]["pretrained"] - mean_pooled).abs().max().item()
    assert diff <= TOLERANCE, diff


# Older checkpoints, configs transformers cannot compute, the Hub staging


def write_old_format(directory: Path) -> None:
    """What save_pretrained wrote before checkpoints took transformers' BERT type."""
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "bert_repro"
    config["architectures"] = [repro_class_name(a) for a in config["architectures"]]
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def test_old_format_still_loads_and_a_push_stages_it_natively(tmp_path, tokenizer):
    from transformers import AutoModelForPreTraining

    from bert_repro.hub.push import stage

    torch.manual_seed(0)
    model = bert_repro.BertReproForPreTraining(tiny_config(vocab_size=len(tokenizer))).eval()
    old = tmp_path / "old"
    model.save_pretrained(old)
    save_tokenizer(tokenizer, old)
    write_old_format(old)
    inputs = inputs_for("AutoModelForPreTraining", len(tokenizer), tmp_path / "inputs.pt")
    expected = our_outputs(model, inputs)

    # With bert_repro imported: the registered model type, and our classes directly.
    for loaded in (
        AutoModelForPreTraining.from_pretrained(old),
        bert_repro.BertReproForPreTraining.from_pretrained(old),
    ):
        assert type(loaded) is bert_repro.BertReproForPreTraining
        assert_same_outputs(our_outputs(loaded, inputs), expected, "old format, bert_repro imported")

    staged = tmp_path / "staged"
    staged.mkdir()
    stage(old, "someone/old", staged, with_card=False)
    config = json.loads((staged / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForPreTraining"]
    assert config["auto_map"] == AUTO_MAP
    assert {p.name for p in old.glob("*.py")} <= {p.name for p in staged.glob("*.py")}

    encoder_inputs = inputs_for("AutoModel", len(tokenizer), tmp_path / "encoder.pt")
    job = {"auto": "AutoModelForPreTraining", "inputs": inputs, "encoder_inputs": encoder_inputs}
    models = {
        "old/remote": {**job, "dir": str(old), "kwargs": {"trust_remote_code": True}},
        "old/plain": {**job, "dir": str(old)},
        "staged/plain": {**job, "dir": str(staged)},
    }
    got = run_without_package(tmp_path, {"models": models}, refusals=True)["models"]
    assert got["old/remote"]["class"] == "BertReproForPreTraining"
    assert_same_outputs(got["old/remote"]["outputs"], expected, "old format with remote code")
    assert "trust_remote_code=True" in got["old/plain"]["error"]
    assert got["staged/plain"]["class"] == "BertForPreTraining"
    assert_same_outputs(got["staged/plain"]["outputs"], expected, "old format after staging for the Hub")


def test_config_transformers_cannot_compute_falls_back_to_remote_code(tmp_path, tokenizer):
    """hidden_act="gelu_tanh" (the reference code's tanh GELU under our spelling) is not in transformers' ACT2FN."""
    from bert_repro.hub.card_base import Usage

    torch.manual_seed(0)
    model = bert_repro.BertReproForMaskedLM(tiny_config(vocab_size=len(tokenizer), hidden_act="gelu_tanh")).eval()
    directory = tmp_path / "tanh"
    with pytest.warns(NotTransformersBertWarning, match=r"hidden_act='gelu_tanh'.*gelu_pytorch_tanh"):
        model.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "bert_repro" and config["architectures"] == ["BertReproForMaskedLM"]
    assert config["auto_map"] == AUTO_MAP
    inputs = inputs_for("AutoModelForMaskedLM", len(tokenizer), tmp_path / "inputs.pt")
    job = {"auto": "AutoModelForMaskedLM", "dir": str(directory), "inputs": inputs, "encoder_inputs": inputs}
    got = run_without_package(
        tmp_path, {"models": {"remote": {**job, "kwargs": {"trust_remote_code": True}}, "plain": job}}, refusals=True
    )["models"]
    assert got["remote"]["class"] == "BertReproForMaskedLM"
    assert_same_outputs(got["remote"]["outputs"], our_outputs(model, inputs), "remote code only")
    assert "trust_remote_code=True" in got["plain"]["error"]
    assert type(bert_repro.BertReproForMaskedLM.from_pretrained(directory)) is bert_repro.BertReproForMaskedLM

    usage = Usage.of("someone/tanh", config=config)
    assert "gelu_tanh" in usage.remote_code_reason

    # A question-answering head with num_labels other than 2: transformers would build a head of another width.
    with pytest.warns(NotTransformersBertWarning, match=r"num_labels=3 with BertReproForQuestionAnswering"):
        bert_repro.BertReproForQuestionAnswering(tiny_config(num_labels=3)).save_pretrained(tmp_path / "qa")
    assert json.loads((tmp_path / "qa" / "config.json").read_text())["model_type"] == "bert_repro"


# The recipes' output directories


@pytest.mark.slow
def test_pretraining_recipe_output_opens_natively(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer_dir = corpus_and_tokenizer
    out = tmp_path / "run"
    launch(write_config(tmp_path / "tiny.yaml", corpus, tokenizer_dir, max_steps=4, save_steps=2, eval_steps=4), out)
    directories = {"final": out, "checkpoint": out / "checkpoint-2"}
    vocab = len(load_tokenizer(out))
    inputs = inputs_for("AutoModelForPreTraining", vocab, tmp_path / "inputs.pt")
    plan = {
        "models": {
            name: {"auto": "AutoModelForPreTraining", "dir": str(d), "inputs": inputs, "encoder_inputs": inputs}
            for name, d in directories.items()
        },
        "tokenizers": {"final": str(out)},
        "fill_mask": {"final": str(out)},
    }
    got = run_without_package(tmp_path, plan)
    for name, directory in directories.items():
        loaded = got["models"][name]
        assert loaded["class"] == "BertForPreTraining", loaded
        ours = bert_repro.BertReproForPreTraining.from_pretrained(directory)
        assert_same_outputs(loaded["outputs"], our_outputs(ours, inputs), f"pre-training {name}")
    assert got["tokenizers"]["final"]["ids"] == load_tokenizer(out)(SENTENCES)["input_ids"]
    assert len(got["fill_mask"]["final"]) == 3


@pytest.mark.slow
def test_finetuning_recipe_output_opens_natively_and_a_missing_tokenizer_is_named(tmp_path, tokenizer):
    from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning

    torch.manual_seed(0)
    texts = [text for text in fixture_files("mrpc").values()]
    tok = train_wordpiece(iterator=texts * 3, vocab_size=200, show_progress=False)
    start = tmp_path / "start"
    config = tiny_config(vocab_size=len(tok), max_position_embeddings=512)
    bert_repro.BertReproForPreTraining(config).save_pretrained(start)
    data = write(tmp_path / "data", fixture_files("mrpc"))
    args = finetune_args("mrpc", start, data, **TINY_RUN)

    # No tokenizer beside the weights and no --tokenizer: a message naming the directory, exit code 2, no traceback.
    refused = run_recipe("finetune.py", *args, "--output_dir", tmp_path / "refused", timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert str(start) in refused.stderr and "tokenizer" in refused.stderr and "Traceback" not in refused.stderr

    save_tokenizer(tok, start)
    out = tmp_path / "out"
    switches = ["--unpad_inputs", "true", "--last_layer_subset", "true"]
    run_finetuning(FineTuningRecipe.from_args([*args, "--output_dir", str(out), *switches]))
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForSequenceClassification"]
    inputs = inputs_for("AutoModelForSequenceClassification", len(tok), tmp_path / "inputs.pt")
    job = {"auto": "AutoModelForSequenceClassification", "dir": str(out), "inputs": inputs, "encoder_inputs": inputs}
    got = run_without_package(tmp_path, {"models": {"model": job}, "tokenizers": {"model": str(out)}})
    assert got["models"]["model"]["class"] == "BertForSequenceClassification"
    ours = bert_repro.BertReproForSequenceClassification.from_pretrained(out)
    assert_same_outputs(got["models"]["model"]["outputs"], our_outputs(ours, inputs), "fine-tuned model")
    assert got["tokenizers"]["model"]["ids"] == tok(SENTENCES)["input_ids"]
