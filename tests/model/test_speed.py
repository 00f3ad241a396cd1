"""The speed switches each leave the results as they are, within float rounding.

Sparse MLM prediction and parity with transformers under `unpad_inputs` are in test_modeling.py.
"""

import ast
import importlib
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from support.models import padded_batch, tiny_config
from transformers import AttentionInterface

import bert_repro.model.grouped_attention as grouped_attention
import bert_repro.model.modeling_bert_repro as modeling
from bert_repro import BertReproForMaskedLM, BertReproForPreTraining, BertReproForSequenceClassification, BertReproModel
from bert_repro.model.configuration_bert_repro import SPEED_SWITCHES
from bert_repro.model.fast_dropout import FastDropout, fast_dropout
from bert_repro.model.grouped_attention import GroupedAttention
from bert_repro.model.speed_paths import SPEED_PATHS
from bert_repro.model.tied_gradients import TiedGradientEmbeddings, TiedGradientMLMHead
from bert_repro.model.unpadding import SpeedEncoder, SpeedLayer, SpeedSelfAttention, Unpadded

ALL_SWITCHES = dict.fromkeys(SPEED_SWITCHES, True)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def without_dropout(model):
    """The model in training mode with every dropout probability (layers and attention) set to 0."""
    for module in model.train().modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.config.attention_probs_dropout_prob = 0.0
    for layer in model.bert.encoder.layer:
        layer.attention.self.dropout_prob = 0.0
    return model


def same_weights(model_cls, switches: dict, **fields):
    torch.manual_seed(0)
    plain, fast = model_cls(tiny_config(**fields)), model_cls(tiny_config(**fields, **switches))
    fast.load_state_dict(plain.state_dict())
    return plain, fast


@st.composite
def masks(draw):
    batch = draw(st.integers(1, 5))
    seq = draw(st.integers(1, 9))
    rows = draw(st.lists(st.lists(st.booleans(), min_size=seq, max_size=seq), min_size=batch, max_size=batch))
    return torch.tensor(rows, dtype=torch.long)


@settings(max_examples=60, deadline=None)
@given(masks(), st.integers(1, 4))
def test_unpad_pad_round_trip(mask, width):
    """Any mask (left/right padding, holes, empty rows): unpad then pad is the identity with zeros at padding."""
    unpadded = Unpadded.from_attention_mask(mask)
    if bool(mask.all()) or not bool(mask.any()):
        assert unpadded is None  # nothing to remove or nothing to keep: the padded path runs unchanged
        return
    x = torch.randn(*mask.shape, width)
    tokens = unpadded.unpad(x)
    assert torch.equal(tokens, x[mask.bool()])  # boolean indexing is row-major too
    assert torch.equal(unpadded.pad(tokens), x * mask[..., None])
    assert torch.equal(unpadded.unpad(unpadded.pad(tokens)), tokens)
    assert unpadded.cu_seqlens.tolist() == [0] + mask.sum(1).cumsum(0).tolist()
    assert unpadded.max_seqlen == int(mask.sum(1).max())


def _train_step(model, batch, **labels):
    model.zero_grad()
    out = model(**batch, **labels)
    out.loss.backward()
    return out, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _left_padded(batch):
    lengths = batch["attention_mask"].sum(1)
    out = {k: torch.zeros_like(v) for k, v in batch.items()}
    seq = batch["input_ids"].shape[1]
    for row, n in enumerate(lengths.tolist()):
        for key in batch:
            out[key][row, seq - n :] = batch[key][row, :n]
    return out


@pytest.mark.parametrize("batch_size", [4, 21], ids=["one-group", "three-groups"])
@pytest.mark.parametrize("layout", ["right", "left"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_unpadded_training_equals_padded(layout, checkpointing, batch_size):
    """Loss and every gradient with the sparse MLM head equal the padded model's (left padding: no pooler to read)."""
    model_cls = BertReproForPreTraining if layout == "right" else BertReproForMaskedLM
    padded, unpadded = same_weights(model_cls, {"unpad_inputs": True}, sparse_prediction=True, **NO_DROPOUT)
    if checkpointing:
        unpadded.activation_checkpointing_enable()
    batch = padded_batch(99, batch=batch_size, seq=16)
    if layout == "left":
        batch = _left_padded(batch)
    real = batch["attention_mask"].bool()
    labels = torch.full_like(batch["input_ids"], -100)
    picks = real & (torch.rand(real.shape, generator=torch.Generator().manual_seed(1)) < 0.3)
    labels[picks] = batch["input_ids"][picks]
    extra = {"next_sentence_label": torch.arange(batch_size) % 2} if layout == "right" else {}
    a, grads_a = _train_step(padded, batch, labels=labels, **extra)
    b, grads_b = _train_step(unpadded, batch, labels=labels, **extra)
    assert torch.allclose(a.loss, b.loss, atol=1e-6)
    logits_a, logits_b = (o.prediction_logits if layout == "right" else o.logits for o in (a, b))
    assert logits_a.shape[0] == int(picks.sum())  # sparse: the masked positions only
    assert torch.allclose(logits_a, logits_b, atol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    worst = max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a)
    assert worst < 1e-5, worst


def test_batches_without_padding_take_the_grouped_attention_when_it_runs(monkeypatch):
    """A full batch still takes the grouped attention (eager), with the plain loss and gradients; SDPA eval does not."""
    calls = []
    apply = GroupedAttention.apply
    monkeypatch.setattr(GroupedAttention, "apply", lambda *args: calls.append(1) or apply(*args))
    config = tiny_config(sparse_prediction=True, **NO_DROPOUT)
    torch.manual_seed(0)
    plain = BertReproForPreTraining._from_config(config, attn_implementation="eager")
    switched = tiny_config(unpad_inputs=True, last_layer_subset=True, sparse_prediction=True, **NO_DROPOUT)
    fast = BertReproForPreTraining._from_config(switched, attn_implementation="eager")
    fast.load_state_dict(plain.state_dict())
    batch = padded_batch(config.vocab_size, batch=5, seq=12)
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    labels = batch["input_ids"].masked_fill(torch.rand(batch["input_ids"].shape) > 0.3, -100)
    extra = dict(labels=labels, next_sentence_label=torch.tensor([0, 1, 1, 0, 1]))
    a, grads_a = _train_step(plain, batch, **extra)
    assert calls == []
    b, grads_b = _train_step(fast, batch, **extra)
    assert len(calls) == config.num_hidden_layers
    assert torch.allclose(a.loss, b.loss, atol=1e-6)
    worst = max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a)
    assert worst < 1e-5, worst
    sdpa = BertReproModel(tiny_config(unpad_inputs=True)).eval()
    with torch.no_grad():
        sdpa(**batch)
    assert len(calls) == config.num_hidden_layers


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=20), st.integers(1, 5))
def test_attention_groups_cover_every_token_once(lengths, rows_per_group):
    """Every real token sits in one grid cell of its own row at its own position; the key mask hides the rest."""
    seq = max(max(lengths), 1)
    mask = torch.tensor([[1] * n + [0] * (seq - n) for n in lengths])
    unpadded = Unpadded.from_attention_mask(mask)
    if unpadded is None:
        return
    groups = unpadded.attention_groups(rows_per_group)
    tokens = int(mask.sum())
    row_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # token -> its row
    position_of = torch.cat([torch.arange(n) for n in lengths])  # token -> its position in the row
    assert torch.equal(groups.gather[groups.scatter], torch.arange(tokens))  # cell of token t holds token t
    assert len(set(groups.scatter.tolist())) == tokens
    cells, firsts_seen = 0, []
    for size, (rows, width, key_mask) in zip(groups.sizes, groups.groups, strict=True):
        assert size == rows * width and rows <= rows_per_group
        first, cells = cells, cells + size
        grid = groups.gather[first : first + rows * width].view(rows, width)
        assert width == max(lengths[int(row_of[r[0]])] for r in grid)  # padded to the group's longest row
        for r in grid:  # one source row per grid row, its tokens in order at the front
            assert len(set(row_of[r].tolist())) == 1
        real_cells = torch.zeros(rows * width, dtype=torch.bool)
        real_cells[[c - first for c in groups.scatter.tolist() if first <= c < first + rows * width]] = True
        real_cells = real_cells.view(rows, width)
        assert torch.equal(position_of[grid][real_cells], torch.arange(width).expand(rows, width)[real_cells])
        if groups.starts[len(firsts_seen)] is not None:  # a grid read as a slice: consecutive tokens
            start = groups.starts[len(firsts_seen)]
            assert torch.equal(grid.flatten(), torch.arange(start, start + rows * width))
        firsts_seen.append(first)
        if key_mask is None:
            assert bool(real_cells.all())
        else:  # the key mask marks exactly the cells that hold their own token
            assert torch.equal(key_mask.reshape(rows, width), real_cells)
    assert cells == len(groups.gather)
    firsts = torch.tensor([0, *groups.sizes[:-1]]).cumsum(0)
    group_lengths = [lengths[int(row_of[groups.gather[first]])] for first in firsts]
    assert group_lengths == sorted(group_lengths, reverse=True)  # longest first


# 3 rows per group below. "scattered": 3 grids, two with padding cells, one empty row. "slices": the first and last
# grids are consecutive tokens without padding (read and written as slices), the middle one is not.
GROUP_LENGTHS = {"scattered": [5, 1, 7, 7, 2, 6, 3, 0, 4], "slices": [7, 7, 7, 5, 5, 0, 3, 3]}


def _grouped_inputs(dtype, first_only, lengths="scattered", heads=2, head_size=3, seed=0):
    """Inputs of `GroupedAttention`: (tokens, 3H) projections, or (tokens, 2H) plus (sequences, H) first queries."""
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in GROUP_LENGTHS[lengths]])
    groups = Unpadded.from_attention_mask(mask).attention_groups(rows_per_group=3)
    assert groups.starts == ([None, None, None] if lengths == "scattered" else [0, None, 34])
    generator = torch.Generator().manual_seed(seed)
    hidden = heads * head_size
    qkv = torch.randn(int(mask.sum()), (2 if first_only else 3) * hidden, dtype=dtype, generator=generator)
    queries = torch.randn(int((mask.sum(1) > 0).sum()), hidden, dtype=dtype, generator=generator)
    return mask, groups, qkv.requires_grad_(), (queries.requires_grad_() if first_only else None)


@pytest.mark.parametrize("lengths", list(GROUP_LENGTHS))
@pytest.mark.parametrize("first_only", [False, True], ids=["all-queries", "first-token-queries"])
@pytest.mark.parametrize(
    "dropout,fast", [(0.0, False), (0.3, False), (0.3, True)], ids=["no-dropout", "bernoulli-dropout", "fast-dropout"]
)
def test_grouped_attention_backward_is_the_gradient_of_its_forward(dropout, fast, first_only, lengths):
    """The hand-written backward against finite differences; reseeding makes every evaluation draw the same mask."""
    _, groups, qkv, queries = _grouped_inputs(torch.float64, first_only, lengths)

    def attention(x, *q):
        torch.manual_seed(7)
        return GroupedAttention.apply(x, groups, 2, 0.5, dropout, fast, *q)

    inputs = (qkv, queries) if first_only else (qkv,)
    assert torch.autograd.gradcheck(attention, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("lengths", list(GROUP_LENGTHS))
@pytest.mark.parametrize("first_only", [False, True], ids=["all-queries", "first-token-queries"])
def test_grouped_attention_equals_padded_attention_with_the_same_dropout_mask(monkeypatch, first_only, lengths):
    """Forward and gradients against plain padded attention that drops exactly the recorded fast-dropout masks."""
    heads, head_size, scaling, p = 2, 3, 0.5, 0.3
    hidden = heads * head_size
    mask, groups, qkv, queries = _grouped_inputs(torch.float32, first_only, lengths, heads, head_size)
    drawn = []

    def recording(x, q):
        keep, scale = fast_keep_mask(x, q)
        drawn.append((keep, scale))
        return keep, scale

    fast_keep_mask = grouped_attention.fast_keep_mask
    monkeypatch.setattr(grouped_attention, "fast_keep_mask", recording)
    inputs = (qkv, queries) if first_only else (qkv,)
    out = GroupedAttention.apply(qkv, groups, heads, scaling, p, True, *inputs[1:])
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, grad)
    assert len(drawn) == len(groups.groups)
    # Grid g's batch index is head * rows + grid row; its source row is the row of the token in its first cell.
    batch, seq = mask.shape
    unpadded = Unpadded.from_attention_mask(mask)
    nonempty = mask.sum(1) > 0
    row_of = torch.repeat_interleave(torch.arange(batch), mask.sum(1))
    multiplier = torch.zeros(batch, heads, seq, seq)
    first = 0
    for (rows, width, _), (keep, scale) in zip(groups.groups, drawn):
        grid = groups.gather[first : first + rows * width].view(rows, width)
        keep = keep.view(heads, rows, -1, width)
        for r in range(rows):
            multiplier[row_of[grid[r, 0]], :, : keep.shape[2], :width] = keep[:, r].float() * scale
        first += rows * width
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    parts = [unpadded.pad(t).view(batch, seq, heads, head_size).transpose(1, 2) for t in xs[0].split(hidden, 1)]
    if first_only:
        q = torch.zeros(batch, seq, hidden).index_put((nonempty.nonzero()[:, 0], torch.tensor(0)), xs[1])
        parts.insert(0, q.view(batch, seq, heads, head_size).transpose(1, 2))
    q, k, v = parts
    scores = (q @ k.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(scores.dtype).min)
    context = ((scores.softmax(-1) * multiplier) @ v).transpose(1, 2).reshape(batch, seq, hidden)
    expected = context[nonempty, 0] if first_only else unpadded.unpad(context)
    expected_grads = torch.autograd.grad(expected, xs, grad)
    assert (out - expected).abs().max() < 1e-5
    for a, b in zip(grads, expected_grads, strict=True):
        assert (a - b).abs().max() < 1e-5
    dropped = torch.cat([keep.flatten() for keep, _ in drawn]).logical_not().float().mean().item()
    assert 0.15 < dropped < 0.45
    assert (out - GroupedAttention.apply(qkv, groups, heads, scaling, 0.0, True, *inputs[1:])).abs().max() > 1e-2


def test_unpadded_outputs_are_zero_at_padding_and_equal_elsewhere():
    model, fast = (m.eval() for m in same_weights(BertReproModel, {"unpad_inputs": True}))
    batch = padded_batch(99, batch=3, seq=12)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        a, b = model(**batch, output_hidden_states=True), fast(**batch, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert (x[real] - y[real]).abs().max() < 1e-5
        assert y[~real].abs().max() == 0
    assert torch.allclose(a.pooler_output, b.pooler_output, atol=1e-6)
    # No padding in the batch, output_attentions: the padded path, bit for bit.
    full = {k: v[:1, :8] for k, v in batch.items()}
    with torch.no_grad():
        assert torch.equal(model(**full).last_hidden_state, fast(**full).last_hidden_state)


def _reference_varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A variable-length flash kernel as one SDPA call per sequence: (1, heads, tokens, d) -> (1, tokens, heads, d)."""
    cu_seq_lens_q = kwargs["cu_seq_lens_q"]
    assert attention_mask is None and query.shape[0] == 1
    assert kwargs["max_length_q"] == int(cu_seq_lens_q.diff().max()) and torch.equal(
        cu_seq_lens_q, kwargs["cu_seq_lens_k"]
    )
    bounds = cu_seq_lens_q.tolist()
    parts = [
        F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], scale=scaling)
        for s, e in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(parts, dim=2).transpose(1, 2), None


def test_variable_length_attention_call():
    """A flash kernel is called in its variable-length form (no mask, cu_seqlens) and gives the padded outputs."""
    AttentionInterface.register("reference_flash_varlen", _reference_varlen_attention)
    pair = same_weights(BertReproForSequenceClassification, {"unpad_inputs": True}, num_labels=3)
    model, varlen = (m.eval() for m in pair)
    varlen.config._attn_implementation = "reference_flash_varlen"  # not a real kernel: set it directly
    batch = padded_batch(99, batch=4, seq=14)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        a = model(**batch, output_hidden_states=True)
        b = varlen(**batch, output_hidden_states=True)
    assert (a.hidden_states[-1][real] - b.hidden_states[-1][real]).abs().max() < 1e-5
    assert (a.logits - b.logits).abs().max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("switches", [{}, ALL_SWITCHES], ids=["plain", "all-switches+checkpointing"])
def test_compiled_layers_equal_eager(switches):
    """Regional torch.compile: eval outputs and one step's gradients equal eager, also with every switch on."""
    eager, compiled = same_weights(BertReproForPreTraining, switches, sparse_prediction=True, **NO_DROPOUT)
    if switches:
        compiled.activation_checkpointing_enable()
    compiled.compile_layers()
    batch = padded_batch(99, batch=4, seq=16)
    real = batch["attention_mask"].bool()
    labels = batch["input_ids"].masked_fill(~real, -100)
    labels[:, ::2] = -100
    with torch.no_grad():
        a, b = eager.eval()(**batch), compiled.eval()(**batch)
    assert (a.prediction_logits[real] - b.prediction_logits[real]).abs().max() < 1e-4
    nsp = torch.tensor([0, 1, 1, 0])
    out_a, grads_a = _train_step(eager.train(), batch, labels=labels, next_sentence_label=nsp)
    out_b, grads_b = _train_step(compiled.train(), batch, labels=labels, next_sentence_label=nsp)
    assert torch.allclose(out_a.loss, out_b.loss, atol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    worst = max((grads_a[k] - grads_b[k]).abs().max().item() for k in grads_a)
    assert worst < 1e-4, worst


def test_fast_dropout_draws_the_right_share_and_its_gradient_uses_the_same_mask():
    torch.manual_seed(0)
    x = torch.ones(400_000, requires_grad=True)
    y = fast_dropout(x, 0.1, training=True)
    dropped = y == 0
    scale = 32768 / (32768 - round(0.1 * 32768))
    assert abs(dropped.float().mean().item() - 0.1) < 0.003  # 4 standard deviations at n = 400,000
    assert torch.allclose(y[~dropped], torch.full_like(y[~dropped], scale))
    assert abs(y.mean().item() - 1.0) < 0.01
    grad = torch.randn_like(x)
    y.backward(grad)
    assert torch.equal(x.grad, grad * (~dropped) * scale)
    # the two halves of each 32-bit draw feed neighbouring elements
    halves = dropped.view(-1, 2).T.float()
    assert abs(torch.corrcoef(halves)[0, 1].item()) < 0.01
    z = torch.randn(10)
    assert torch.equal(fast_dropout(z, 0.1, training=False), z)
    assert torch.equal(fast_dropout(z, 0.0, training=True), z)


def test_fast_dropout_switch_changes_only_training_noise():
    """Eval is bit-identical to the plain model; training with p = 0 gives the same outputs."""
    plain, fast = (m.eval() for m in same_weights(BertReproForPreTraining, {"fast_dropout": True}))
    batch = padded_batch(99, batch=4, seq=16)
    with torch.no_grad():
        assert torch.equal(plain(**batch).prediction_logits, fast(**batch).prediction_logits)
    plain, fast = without_dropout(plain), without_dropout(fast)
    with torch.no_grad():
        assert (plain(**batch).prediction_logits - fast(**batch).prediction_logits).abs().max() < 1e-5


def test_other_kernels_get_the_whole_batch_padded_back():
    """Any other kernel gets the batch padded back with the model's mask, and the padded model's outputs."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    calls = []

    def recording_kernel(module, query, key, value, attention_mask, **kwargs):
        calls.append((tuple(query.shape), attention_mask is not None))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("reference_padded", recording_kernel)
    AttentionMaskInterface.register("reference_padded", sdpa_mask)  # a custom kernel declares its mask format
    model, other = (m.eval() for m in same_weights(BertReproModel, {"unpad_inputs": True}))
    other.config._attn_implementation = "reference_padded"
    batch = padded_batch(99, batch=3, seq=12)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        a, b = model(**batch).last_hidden_state, other(**batch).last_hidden_state
    assert calls and all(shape[0] == 3 and shape[2] == 12 and masked for shape, masked in calls)
    assert (a[real] - b[real]).abs().max() < 1e-5


CASES = "both-losses sparse nsp-only mlm-only two-micro-batches backward-twice checkpointing masked-lm".split()


@pytest.mark.parametrize("case", CASES)
def test_tied_gradients_equal_plain_autograd(case):
    """`tied_gradients` equals plain autograd in every way a backward can reach the two uses of the tied weight."""
    model_cls = BertReproForMaskedLM if case == "masked-lm" else BertReproForPreTraining
    plain, tied = same_weights(model_cls, {"tied_gradients": True}, sparse_prediction=case == "sparse", **NO_DROPOUT)
    batch = padded_batch(99, batch=4, seq=12)
    picks = torch.rand(batch["input_ids"].shape, generator=torch.Generator().manual_seed(1)) < 0.3
    labels = torch.where(picks, batch["input_ids"], -100)
    extra = {} if case == "masked-lm" else {"next_sentence_label": torch.tensor([0, 1, 1, 0])}

    def run(model):
        if case == "checkpointing":
            model.activation_checkpointing_enable()
        out = model(**batch, labels=labels, **extra)
        loss = {"nsp-only": out.get("next_sentence_loss"), "mlm-only": out.get("masked_lm_loss")}.get(case, out.loss)
        if case == "backward-twice":
            loss.backward(retain_graph=True)
        loss.backward()
        if case == "two-micro-batches":
            model(**batch, labels=labels, **extra).loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    reference, shared = run(plain), run(tied)
    assert shared.keys() == reference.keys()
    weight = "bert.embeddings.word_embeddings.weight"
    assert not shared[weight].is_sparse and bool(shared[weight].abs().sum() > 0)
    worst = max((shared[k] - reference[k]).abs().max().item() for k in shared)
    assert worst < 1e-6, worst


def test_tied_gradients_need_no_dense_lookup_gradient():
    """With the switch on no (vocab, H) lookup gradient is built nor added; off, both happen (so the test can tell)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    config = tiny_config()
    vocab_sized = (config.vocab_size, config.hidden_size)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            lookup = "embedding_dense_backward" in str(func) and args[2] == config.vocab_size  # num_weights
            if lookup or (str(func).startswith("aten.add") and shapes == [vocab_sized, vocab_sized]):
                self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    batch = padded_batch(config.vocab_size, batch=4, seq=12)
    for tied in (True, False):
        model = BertReproForPreTraining(tiny_config(tied_gradients=tied)).train()
        loss = model(**batch, labels=batch["input_ids"]).loss
        with Ops() as ops:
            loss.backward()
        assert (ops.seen == []) == tied, ops.seen


# The split: the model file is the paper's model; the speed classes are picked once, at construction.

MODEL_DIR = Path(modeling.__file__).parent


def _relative_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    return found


def test_model_file_holds_no_speed_machinery():
    """No autograd.Function, no private torch API, and no sibling imported but the config and packing."""
    source = (MODEL_DIR / "modeling_bert_repro.py").read_text()
    assert "autograd.Function" not in source
    tree = ast.parse(source)
    private = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and (ast.unparse(node.value).startswith("torch") or node.attr in ("_base", "_use_count", "_cdata"))
    ]
    assert private == []
    top_level = {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.level}
    siblings = _relative_imports(MODEL_DIR / "modeling_bert_repro.py")
    assert top_level == siblings == {"configuration_bert_repro", "packed_sequences"}


SPEED_MODULES = set(
    "speed_paths unpadding grouped_attention last_layer_subset fast_dropout tied_gradients dropout_add_layer_norm "
    "dropout_add_layer_norm_kernels".split()
)


def test_no_import_cycle_through_the_model_file_or_a_speed_module():
    """The speed modules import the model file, never the other way round, and nothing imports itself back."""
    graph = {path.stem: _relative_imports(path) for path in MODEL_DIR.glob("*.py")}
    assert SPEED_MODULES <= set(graph) and "modeling_bert_repro" in graph["speed_paths"]

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for imported in graph.get(todo.pop(), ()):
                if imported not in seen:
                    seen.add(imported)
                    todo.append(imported)
        return seen

    for name in sorted(SPEED_MODULES | {"modeling_bert_repro"}):
        assert name not in reachable(name), f"{name} imports itself back through {sorted(reachable(name))}"
    assert reachable("modeling_bert_repro").isdisjoint(SPEED_MODULES)


def _module_types(model) -> list[tuple[str, type]]:
    return [(name, type(module)) for name, module in model.named_modules()]


def _parts(model) -> dict[str, set[type]]:
    bert = model if isinstance(model, modeling.BertReproModel) else model.bert
    return {
        "embeddings": {type(bert.embeddings)},
        "encoder": {type(bert.encoder)},
        "layer": {type(layer) for layer in bert.encoder.layer},
        "self_attention": {type(layer.attention.self) for layer in bert.encoder.layer},
        "self_output": {type(layer.attention.output) for layer in bert.encoder.layer},
        "output": {type(layer.output) for layer in bert.encoder.layer},
        "dropout": {type(m) for m in model.modules() if isinstance(m, torch.nn.Dropout)},
        "mlm_head": {type(m) for m in model.modules() if isinstance(m, modeling.BertReproMLMHead)},
    }


@pytest.mark.parametrize("switch", SPEED_SWITCHES)
def test_each_switch_builds_the_classes_of_its_table_entry(switch):
    """One switch builds its `SPEED_PATHS` classes and the model file's elsewhere, with the plain state_dict."""
    plain = BertReproForPreTraining(tiny_config())
    fast = BertReproForPreTraining(tiny_config(**{switch: True}))
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in fast.state_dict().items()}
    expected = _parts(plain)
    expected.update({part: {cls} for part, cls in SPEED_PATHS[switch].items()})
    assert _parts(fast) == expected


@pytest.mark.parametrize(
    "model_cls",
    [BertReproForPreTraining, BertReproForMaskedLM, BertReproForSequenceClassification, BertReproModel],
    ids=lambda c: c.__name__,
)
def test_switches_build_the_speed_classes_at_construction(model_cls):
    """Every switch on: the speed classes are in place at construction, with no hook and the plain state_dict."""
    plain = model_cls(tiny_config(num_labels=2))
    fast = model_cls(tiny_config(num_labels=2, **ALL_SWITCHES))
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in fast.state_dict().items()}
    assert model_cls is getattr(modeling, model_cls.__name__)
    plain_types = [t.__module__ for _, t in _module_types(plain)[1:]]
    assert all(m == modeling.__name__ or m.startswith("torch") for m in plain_types)
    bert = fast if model_cls is BertReproModel else fast.bert
    assert type(bert.encoder) is SpeedEncoder and bert.encoder.unpad_inputs and bert.encoder.last_layer_subset
    assert all(type(layer) is SpeedLayer for layer in bert.encoder.layer)
    attention = [layer.attention.self for layer in bert.encoder.layer]
    assert all(type(a) is SpeedSelfAttention and a.fast_dropout for a in attention)
    dropouts = [m for m in fast.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(type(m) is FastDropout for m in dropouts)
    assert type(bert.embeddings) is TiedGradientEmbeddings
    assert not any(module._forward_pre_hooks or module._forward_hooks for module in fast.modules())
    if model_cls in (BertReproForPreTraining, BertReproForMaskedLM):
        # The two find each other through the weight they share (tied_gradients.PENDING).
        assert type(fast.cls.predictions) is TiedGradientMLMHead
        assert fast.cls.predictions.decoder.weight is bert.embeddings.word_embeddings.weight
    before = _module_types(fast)
    batch = padded_batch(99, batch=2, seq=8)
    fast.train()(**batch, labels=torch.tensor([0, 1]) if model_cls is BertReproForSequenceClassification else None)
    assert _module_types(fast) == before


@pytest.mark.parametrize(
    "name", [n for n in modeling.__all__ if n.startswith("BertReproFor") and "Output" not in n] + ["BertReproModel"]
)
def test_each_public_name_is_one_class(name):
    """`bert_repro.X` is the model file's X (a traceback names one class), and no speed module defines an X."""
    import inspect

    import bert_repro

    assert getattr(bert_repro, name) is getattr(modeling, name)
    for module in SPEED_MODULES - {"dropout_add_layer_norm_kernels"}:
        assert not hasattr(importlib.import_module(f"bert_repro.model.{module}"), name), module
    # The positions a head reads reach the encoder as an ordinary argument, not through a rebound forward.
    assert "read_positions" in inspect.signature(modeling.BertReproModel.forward).parameters
    assert "inspect" not in (MODEL_DIR / "speed_paths.py").read_text()


def test_saved_code_alone_is_the_paper_model(tmp_path, monkeypatch):
    """save_pretrained copies no speed module; that code alone (trust_remote_code) computes what the package does."""
    model = BertReproForPreTraining(tiny_config(sparse_prediction=True, **ALL_SWITCHES))
    saved = tmp_path / "bert_with_switches"
    model.save_pretrained(saved)
    paper_files = ("configuration_bert_repro", "modeling_bert_repro", "packed_sequences")
    saved_code = {p.stem for p in saved.glob("*.py")}
    assert set(paper_files) <= saved_code and saved_code.isdisjoint(SPEED_MODULES)
    (saved / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        remote = importlib.import_module("bert_with_switches.modeling_bert_repro")
        config = remote.BertReproConfig.from_pretrained(saved)
        assert all(config.to_dict()[switch] for switch in SPEED_SWITCHES)
        copy = remote.BertReproForPreTraining(config)
        assert {type(m).__module__.split(".")[0] for m in copy.modules()} <= {"bert_with_switches", "torch"}
        copy.load_state_dict(model.state_dict())
        batch = padded_batch(99, batch=4, seq=12)
        real = batch["attention_mask"].bool()
        with torch.no_grad():
            a, b = copy.eval()(**batch), model.eval()(**batch)
        assert (a.prediction_logits[real] - b.prediction_logits[real]).abs().max() < 1e-5
        assert (a.seq_relationship_logits - b.seq_relationship_logits).abs().max() < 1e-5
        labels = batch["input_ids"].masked_fill((torch.rand(real.shape) > 0.3) | ~real, -100)
        nsp = torch.tensor([0, 1, 1, 0])
        a, b = (without_dropout(each)(**batch, labels=labels, next_sentence_label=nsp) for each in (model, copy))
        assert (a.loss - b.loss).abs() < 1e-5 and (a.prediction_logits - b.prediction_logits).abs().max() < 1e-5
        imported = {name.split(".")[1] for name in sys.modules if name.startswith("bert_with_switches.")}
        assert imported <= set(paper_files), imported
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "bert_with_switches"]:
            del sys.modules[name]
