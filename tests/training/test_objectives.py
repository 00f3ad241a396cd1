"""The paper's Table 5 objectives, "mlm_nsp" (BERT), "mlm" (No NSP) and "ltr" (left-to-right), against references
computed here: causal attention, the pooled token, examples, labels, losses, saved formats and refused settings."""

import contextlib
import json
import random
import warnings

import datasets
import pytest
import torch
import torch.nn.functional as F
from support.corpora import WORDS
from support.models import tiny_config
from support.pretraining_runs import run_recipe, write_config
from support.task_files import finetune_args

from bert_repro import BertReproConfig, BertReproForPreTraining, BertReproForSequenceClassification, BertReproModel
from bert_repro.data.example_statistics import pretraining_statistics
from bert_repro.data.masking import WordPieceVocab
from bert_repro.data.pretraining_config import PreTrainingDataConfig
from bert_repro.data.pretraining_examples import IGNORE_INDEX, PreTrainingCollator, create_pretraining_dataset
from bert_repro.data.training_instances import create_instances_from_document
from bert_repro.model.checkpoint_format import NotTransformersBertWarning
from bert_repro.model.configuration_bert_repro import (
    BIDIRECTIONAL_ONLY_SWITCHES,
    PRETRAINING_OBJECTIVES,
    SPEED_SWITCHES,
    ObjectiveConflictError,
)
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.pretraining.trainer import PreTrainingTrainer, metrics_from_sums, pretraining_sums

IMPLEMENTATIONS = ("eager", "sdpa")


def ltr_config(**overrides):
    return tiny_config(objective="ltr", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides)


def batch_with_changed_tail(vocab_size=99, seq=12, cut=6, seed=0, padded=True):
    """Two batches equal up to position `cut` (exclusive) and different after it; row 1 is padded from 9 (or no
    padding at all: SDPA could then be left a causal flag instead of a mask)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (2, seq), generator=g)
    changed = ids.clone()
    changed[:, cut:] = torch.randint(5, vocab_size, (2, seq - cut), generator=g)
    mask = torch.ones(2, seq, dtype=torch.long)
    if padded:
        mask[1, 9:] = 0
    return ids, changed, mask


def assert_causal(encode, cut=6, padded=True):
    """`encode(ids, mask)` -> (batch, seq, hidden): outputs before `cut` unchanged when the tokens from `cut` on
    change, and outputs from `cut` on changed (so that the model does read its input)."""
    ids, changed, mask = batch_with_changed_tail(cut=cut, padded=padded)
    before, after = encode(ids, mask), encode(changed, mask)
    assert (before[:, :cut] - after[:, :cut]).abs().max().item() < 1e-6
    assert (before[0, cut:] - after[0, cut:]).abs().max().item() > 1e-3


# --- The table and the config


def test_the_three_objectives_of_table_5():
    assert list(PRETRAINING_OBJECTIVES) == ["mlm_nsp", "mlm", "ltr"]
    mlm_nsp, mlm, ltr = PRETRAINING_OBJECTIVES.values()
    assert (mlm_nsp.causal, mlm_nsp.next_sentence, mlm_nsp.masked_lm) == (False, True, True)
    assert (mlm.causal, mlm.next_sentence, mlm.masked_lm) == (False, False, True)
    assert (ltr.causal, ltr.next_sentence, ltr.masked_lm) == (True, False, False)
    assert BertReproConfig().objective == "mlm_nsp" and BertReproConfig().pretraining_objective is mlm_nsp
    assert PreTrainingDataConfig().objective == "mlm_nsp"
    assert PreTrainingDataConfig(objective="ltr").pretraining_objective is ltr


def test_unknown_objective_names_the_choices():
    for build in (lambda: tiny_config(objective="gpt"), lambda: PreTrainingDataConfig(objective="gpt")):
        with pytest.raises(Exception, match=r"objective must be one of mlm_nsp, mlm, ltr .*got 'gpt'"):
            build()


def test_objective_is_saved_in_config_json(tmp_path):
    tiny_config(objective="mlm").save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["objective"] == "mlm"
    assert BertReproConfig.from_pretrained(tmp_path).pretraining_objective.name == "mlm"


# --- Causal attention and the pooler


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_ltr_model_is_causal_and_bidirectional_model_is_not(implementation):
    torch.manual_seed(0)
    model = BertReproForPreTraining._from_config(ltr_config(), attn_implementation=implementation).eval()
    with torch.no_grad():
        for padded in (True, False):
            assert_causal(lambda ids, mask: model.bert(ids, mask).last_hidden_state, padded=padded)
            assert_causal(lambda ids, mask: model(ids, mask).prediction_logits, padded=padded)
        assert_causal(lambda ids, mask: model.bert(ids).last_hidden_state)  # no mask given
    bidirectional = BertReproModel._from_config(tiny_config(), attn_implementation=implementation).eval()
    with torch.no_grad(), pytest.raises(AssertionError):
        assert_causal(lambda ids, mask: bidirectional(ids, mask).last_hidden_state)


def test_eager_and_sdpa_agree_for_the_causal_model():
    torch.manual_seed(0)
    eager = BertReproModel._from_config(ltr_config(), attn_implementation="eager").eval()
    sdpa = BertReproModel._from_config(ltr_config(), attn_implementation="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    ids, _, mask = batch_with_changed_tail()
    with torch.no_grad():
        a, b = eager(ids, mask), sdpa(ids, mask)
    real = mask.bool()
    assert (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max() < 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max() < 1e-5


def test_pooler_reads_the_last_real_token_of_a_causal_model_and_cls_otherwise():
    torch.manual_seed(0)
    ids, _, mask = batch_with_changed_tail()
    for config, positions in ((ltr_config(), [11, 8]), (tiny_config(), [0, 0])):
        model = BertReproModel(config).eval()
        with torch.no_grad():
            out = model(ids, mask)
            expected = torch.tanh(model.pooler.dense(out.last_hidden_state[torch.arange(2), positions]))
        assert torch.allclose(out.pooler_output, expected, atol=1e-6), config.objective


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_ltr_checkpoint_stays_causal_in_a_fine_tuning_head(tmp_path, implementation):
    torch.manual_seed(0)
    with pytest.warns(NotTransformersBertWarning, match="objective='ltr'"):
        BertReproForPreTraining(ltr_config()).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "bert_repro" and saved["objective"] == "ltr"

    settings = {"num_labels": 2, "attn_implementation": implementation}
    classifier = BertReproForSequenceClassification.from_pretrained(tmp_path, **settings).eval()
    assert classifier.config.pretraining_objective.causal
    with torch.no_grad():
        assert_causal(lambda ids, mask: classifier.bert(ids, mask).last_hidden_state)
        ids, _, mask = batch_with_changed_tail()
        hidden = classifier.bert(ids, mask).last_hidden_state
        pooled = torch.tanh(classifier.bert.pooler.dense(hidden[torch.arange(2), [11, 8]]))
        assert torch.allclose(classifier(ids, mask).logits, classifier.classifier(pooled), atol=1e-6)

    # Without bert_repro's classes: the code saved beside the weights (trust_remote_code) computes the same model.
    from transformers import AutoModelForSequenceClassification

    remote = AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=True, **settings).eval()
    remote.load_state_dict(classifier.state_dict())
    with torch.no_grad():
        assert_causal(lambda ids, mask: remote.bert(ids, mask).last_hidden_state)
        assert torch.allclose(remote(ids, mask).logits, classifier(ids, mask).logits, atol=1e-6)


def test_mlm_checkpoint_is_plain_transformers_bert(tmp_path):
    from transformers import AutoModelForPreTraining

    torch.manual_seed(0)
    model = BertReproForPreTraining(tiny_config(objective="mlm")).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotTransformersBertWarning)
        model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "bert"
    theirs = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "BertForPreTraining"
    ids, _, mask = batch_with_changed_tail()
    with torch.no_grad():
        logits = theirs(ids, attention_mask=mask).prediction_logits, model(ids, mask).prediction_logits
        assert (logits[0] - logits[1]).abs().max() < 1e-5
    assert BertReproForPreTraining.from_pretrained(tmp_path).config.objective == "mlm"


@pytest.mark.parametrize("switch", [s for s in SPEED_SWITCHES if s not in BIDIRECTIONAL_ONLY_SWITCHES])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_speed_switches_a_causal_model_allows_keep_it_causal(switch, implementation):
    """In training mode (where these switches act): the same seed draws the same dropout masks for both inputs."""
    torch.manual_seed(0)
    config = tiny_config(objective="ltr", **{switch: True})
    model = BertReproForPreTraining._from_config(config, attn_implementation=implementation).train()

    def encode(ids, mask):
        torch.manual_seed(1)
        return model(ids, mask).prediction_logits.detach()

    for padded in (True, False):
        assert_causal(encode, padded=padded)


@pytest.mark.parametrize("switch", BIDIRECTIONAL_ONLY_SWITCHES)
def test_causal_model_refuses_bidirectional_only_switches(switch):
    with pytest.raises(Exception, match=f"{switch} cannot be used with objective='ltr'"):
        tiny_config(objective="ltr", **{switch: True})
    config = ltr_config()
    setattr(config, switch, True)  # set after the config was checked: building the speed paths refuses it
    with pytest.raises(ObjectiveConflictError, match=switch):
        BertReproForPreTraining(config)
    tiny_config(objective="mlm", **{switch: True})  # bidirectional objectives keep them


def test_causal_model_refuses_a_packed_batch():
    model = BertReproModel(ltr_config()).eval()
    ids = torch.randint(5, 99, (1, 8))
    with pytest.raises(ValueError, match="Packed batches are not supported with objective='ltr'"):
        model(ids, position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]]))


def test_ltr_checkpoint_is_never_loaded_bidirectionally(tmp_path):
    with pytest.warns(NotTransformersBertWarning):
        BertReproForPreTraining(ltr_config()).save_pretrained(tmp_path)
    for objective in ("mlm_nsp", "mlm"):
        with pytest.raises(ObjectiveConflictError, match=f"objective='ltr'.*objective='{objective}'.*bidirectional"):
            BertReproForSequenceClassification.from_pretrained(tmp_path, num_labels=2, objective=objective)
    BertReproForSequenceClassification.from_pretrained(tmp_path, num_labels=2, objective="ltr")  # the same: fine


# --- Examples, labels and losses

VOCAB = WordPieceVocab.from_vocab_words(["[PAD]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(60)])
DOCUMENTS = [[[f"w{j}" for j in range(s, s + 5)] for s in range(0, 55, 5)] for _ in range(3)]


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_no_nsp_examples_are_one_contiguous_segment(objective):
    config = PreTrainingDataConfig(max_seq_length=16, objective=objective, short_seq_prob=0.0)
    instances = create_instances_from_document(DOCUMENTS, 0, VOCAB, random.Random(3), config)
    assert len(instances) > 2
    for instance in instances:
        tokens = instance.tokens
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "[SEP]" not in tokens[1:-1]
        assert len(tokens) <= 16 and instance.segment_ids == [0] * len(tokens) and instance.is_random_next is None
        text = [int(t[1:]) for t in tokens[1:-1] if t != "[MASK]"]
        assert text == sorted(text) and len(set(text)) == len(text)  # in document order, nothing from elsewhere
        if objective == "ltr":
            assert instance.masked_lm_positions == [] and "[MASK]" not in tokens
        else:
            assert 1 <= len(instance.masked_lm_positions) <= config.max_predictions_per_seq


def test_bert_examples_are_unchanged_pairs():
    config = PreTrainingDataConfig(max_seq_length=16, short_seq_prob=0.0)
    instances = create_instances_from_document(DOCUMENTS, 0, VOCAB, random.Random(3), config)
    assert all(
        i.tokens.count("[SEP]") == 2 and 1 in i.segment_ids and i.is_random_next in (True, False) for i in instances
    )


@pytest.fixture(scope="module")
def tokenizer():
    from bert_repro.data.wordpiece import train_wordpiece

    rng = random.Random(0)
    texts = [
        " ".join(" ".join(rng.choice(WORDS) for _ in range(8)).capitalize() + "." for _ in range(12)) for _ in range(6)
    ]
    return train_wordpiece(iterator=texts, vocab_size=120, show_progress=False), texts


def built(tokenizer, objective, **fields):
    tok, texts = tokenizer
    config = PreTrainingDataConfig(max_seq_length=32, objective=objective, dupe_factor=1, **fields)
    return create_pretraining_dataset(datasets.Dataset.from_dict({"text": texts}), tok, config, num_proc=1), config


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_no_nsp_datasets_have_no_nsp_column_and_statistics_without_nsp(tokenizer, objective):
    instances, _ = built(tokenizer, objective)
    assert "next_sentence_label" not in instances.column_names
    assert ("masked_lm_positions" in instances.column_names) == (objective == "mlm")
    assert all(set(row) == {0} for row in instances["token_type_ids"])
    stats = pretraining_statistics(instances, mask_token_id=tokenizer[0].mask_token_id)
    assert "is_next_share" not in stats and stats["examples"] == len(instances)
    bert, _ = built(tokenizer, "mlm_nsp")
    assert "next_sentence_label" in bert.column_names and "is_next_share" in pretraining_statistics(bert)


def test_ltr_labels_are_the_next_tokens(tokenizer):
    instances, config = built(tokenizer, "ltr")
    collator = PreTrainingCollator.from_config(tokenizer[0], config)
    rows = [instances[i] for i in range(4)]
    batch = collator(rows)
    assert "next_sentence_label" not in batch
    for r, row in enumerate(rows):
        ids = row["input_ids"]
        assert batch["input_ids"][r, : len(ids)].tolist() == ids  # nothing masked
        expected = ids[1:] + [IGNORE_INDEX] * (batch["labels"].shape[1] - len(ids) + 1)
        assert batch["labels"][r].tolist() == expected
    with pytest.raises(ValueError, match="masks nothing"):
        PreTrainingCollator(tokenizer[0], objective="ltr", dynamic_masking=True)


def test_no_nsp_loss_is_the_mlm_loss_alone(tokenizer):
    instances, config = built(tokenizer, "mlm")
    batch = PreTrainingCollator.from_config(tokenizer[0], config)([instances[i] for i in range(6)])
    assert "next_sentence_label" not in batch
    torch.manual_seed(0)
    model = BertReproForPreTraining(tiny_config(objective="mlm", vocab_size=len(tokenizer[0]))).eval()
    with torch.no_grad():
        out = model(**batch)
        masked = batch["labels"] != IGNORE_INDEX
        by_hand = F.cross_entropy(out.prediction_logits[masked], batch["labels"][masked])
    assert out.next_sentence_loss is None and torch.allclose(out.loss, by_hand, atol=1e-6)

    trainer_loss = PreTrainingTrainer.compute_loss(None, model, dict(batch))  # the recipe's loss, one batch
    assert torch.allclose(trainer_loss, by_hand, atol=1e-6)
    sums = pretraining_sums(out.prediction_logits, out.seq_relationship_logits, batch["labels"], None)
    metrics = metrics_from_sums(sums, "eval_", model.config.pretraining_objective)
    assert set(metrics) == {"eval_mlm_loss", "eval_mlm_accuracy"}
    assert metrics["eval_mlm_loss"] == pytest.approx(by_hand.item(), abs=1e-5)


def test_ltr_loss_is_next_token_cross_entropy(tokenizer):
    instances, config = built(tokenizer, "ltr")
    batch = PreTrainingCollator.from_config(tokenizer[0], config)([instances[i] for i in range(6)])
    torch.manual_seed(0)
    weights = BertReproForPreTraining(tiny_config(objective="ltr", vocab_size=len(tokenizer[0]))).state_dict()
    for sparse in (False, True):  # the MLM decoder at every position, or only where a label is
        ltr = tiny_config(objective="ltr", vocab_size=len(tokenizer[0]), sparse_prediction=sparse)
        model = BertReproForPreTraining(ltr).eval()
        model.load_state_dict(weights)
        with torch.no_grad():
            out = model(**batch)
            dense = model.cls.predictions(model.bert(batch["input_ids"], batch["attention_mask"]).last_hidden_state)
            real = batch["attention_mask"].bool()
            predicting = real[:, :-1] & real[:, 1:]  # positions i whose token i + 1 is real
            by_hand = F.cross_entropy(dense[:, :-1][predicting], batch["input_ids"][:, 1:][predicting])
        assert torch.allclose(out.loss, by_hand, atol=1e-5), sparse
    logits = (out.prediction_logits, out.seq_relationship_logits)
    sums = pretraining_sums(*logits, batch["labels"], None, batch["masked_positions"])
    assert set(metrics_from_sums(sums, "", model.config.pretraining_objective)) == {"lm_loss", "lm_accuracy"}


# --- The recipes


def pretraining_argv(tmp_path, corpus_and_tokenizer, objective):
    """A 6-step run of one phase with `objective` into tmp_path/out."""
    settings = dict(objective=objective, dupe_factor=1, phase2_fraction=0, max_steps=6, warmup_steps=1, eval_steps=3)
    config = write_config(tmp_path / "run.yaml", *corpus_and_tokenizer, save_steps=100, **settings)
    return ["--config", str(config), "--output_dir", str(tmp_path / "out")]


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm", "ltr"])
def test_pretraining_model_trains_the_nsp_head_only_with_nsp(tmp_path, corpus_and_tokenizer, objective):
    """Without NSP the pooler and NSP head are frozen: no gradient, no weight decay, no unused parameter for DDP."""
    from bert_repro.data.wordpiece import load_tokenizer
    from bert_repro.training.pretraining.model import build_model
    from bert_repro.training.pretraining.recipe import PreTrainingRecipe

    recipe = PreTrainingRecipe.from_args(pretraining_argv(tmp_path, corpus_and_tokenizer, objective))
    model = build_model(recipe.model, load_tokenizer(corpus_and_tokenizer[1]), [recipe.examples])
    assert model.config.objective == objective
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    heads = {name for name, _ in model.named_parameters() if name.startswith(("bert.pooler.", "cls.seq_relationship."))}
    assert len(heads) == 4 and frozen == (set() if objective == "mlm_nsp" else heads)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--packing", "true"], "--packing true cannot be used with --objective ltr"),
        (["--unpad_inputs", "true"], "unpad_inputs cannot be used with objective='ltr'"),
        (["--model_overrides", '{"objective": "mlm"}'], "with --objective"),
    ],
)
def test_pretraining_recipe_refuses_settings_the_objective_rules_out(tmp_path, corpus_and_tokenizer, argv, message):
    from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining

    base = pretraining_argv(tmp_path, corpus_and_tokenizer, "ltr")
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        run_pretraining(PreTrainingRecipe.from_args(base + argv))
    assert not (tmp_path / "out").exists()  # refused before any data work


def test_pretraining_recipe_rejects_an_unknown_objective(tmp_path):
    result = run_recipe("pretrain.py", "--objective", "gpt", "--output_dir", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "invalid choice: 'gpt'" in result.stderr and "mlm_nsp" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm", "ltr"])
def test_pretraining_end_to_end_with_each_objective(tmp_path, corpus_and_tokenizer, objective):
    from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining

    out = tmp_path / "out"
    saving = pytest.warns(NotTransformersBertWarning) if objective == "ltr" else contextlib.nullcontext()
    argv = pretraining_argv(tmp_path, corpus_and_tokenizer, objective)
    with saving:  # a left-to-right checkpoint is saved in the remote-code-only format, with its warning
        results = run_pretraining(PreTrainingRecipe.from_args(argv))
    task = PRETRAINING_OBJECTIVES[objective].token_task
    nsp = {"eval_nsp_loss", "eval_nsp_accuracy"}
    assert {f"eval_{task}_loss", f"eval_{task}_accuracy"} <= set(results)
    assert (nsp <= set(results)) == (objective == "mlm_nsp")
    history = json.loads((out / "log_history.json").read_text())
    train = [e for e in history if f"{task}_loss" in e and "eval_loss" not in e]
    assert len(train) == 6 and all(("nsp_loss" in e) == (objective == "mlm_nsp") for e in train)
    if objective != "mlm_nsp":  # the loss is the token-level loss alone
        assert all(e["loss"] == pytest.approx(e[f"{task}_loss"], abs=2e-4) for e in train)
    stats = json.loads((out / "data_statistics.json").read_text())
    assert stats["phase1"]["objective"] == objective
    assert ("is_next_share" in stats["phase1"]) == (objective == "mlm_nsp")
    saved = json.loads((out / "config.json").read_text())
    assert saved["objective"] == objective
    assert saved["model_type"] == ("bert_repro" if objective == "ltr" else "bert")

    if objective == "ltr":  # fine-tuning it: causal, and a bidirectional fine-tune refused
        classifier = BertReproForSequenceClassification.from_pretrained(out, num_labels=2).eval()
        with torch.no_grad():
            assert_causal(lambda ids, mask: classifier.bert(ids, mask).last_hidden_state)
        args = finetune_args("sst2", out, None, tmp_path / "ft", cpu=False, objective="mlm_nsp")
        result = run_recipe("finetune.py", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "objective='ltr'" in result.stderr and "bidirectional" in result.stderr
        assert not (tmp_path / "ft").exists()
