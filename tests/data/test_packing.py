"""Sequence packing for MLM + NSP pre-training (`bert_repro.data.pack_examples`, `bert_repro.model.packed_sequences`).

Every packed result is checked against the same examples unpacked; a reference variable-length kernel stands in for
FlashAttention on CPU.
"""

import math
from itertools import pairwise
from types import SimpleNamespace

import datasets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.corpora import pseudo_text, wordpiece_tokenizer
from support.models import tiny_config
from support.pretraining_runs import launch, write_config

from bert_repro.data.pack_examples import (
    PackingCollator,
    first_fit_decreasing,
    pack_rows,
    packed_rows_per_example,
    padding_statistics,
)
from bert_repro.data.pretraining_examples import (
    IGNORE_INDEX,
    PreTrainingCollator,
    PreTrainingDataConfig,
    create_pretraining_dataset,
)

MAX_LEN = 128


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece_tokenizer(pseudo_text(30), vocab_size=150)


def build_rows(tokenizer, **config_fields):
    """Pre-training examples of the pseudo corpus, as the recipe builds them (short_seq_prob raised for variety)."""
    defaults = {"max_seq_length": MAX_LEN, "max_predictions_per_seq": 20, "dupe_factor": 2, "short_seq_prob": 0.5}
    config = PreTrainingDataConfig(**{**defaults, **config_fields})
    ds = create_pretraining_dataset(datasets.Dataset.from_dict({"text": pseudo_text(30)}), tokenizer, config)
    return config, ds.to_list()


def examples_of(batch: dict[str, torch.Tensor]) -> list[dict[str, list[int]]]:
    """The examples of a packed batch, in row-major order, cut where position_ids restart at a real token."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        real = batch["attention_mask"][r].bool()
        starts = ((batch["position_ids"][r] == 0) & real).nonzero().flatten().tolist()
        ends = starts[1:] + [int(real.sum())] if starts else []  # an empty row (fixed-shape padding): none
        for s, e in zip(starts, ends, strict=True):
            out.append(
                {k: batch[k][r, s:e].tolist() for k in ("input_ids", "token_type_ids", "labels", "position_ids")}
            )
    return out


def packed_order(rows) -> list[int]:
    """The rows' indices in the order a PackingCollator lays them out (row-major over the packing)."""
    return [i for row in pack_rows([len(r["input_ids"]) for r in rows], MAX_LEN)[0] for i in row]


def examples_of_unpacked(batch: dict[str, torch.Tensor]) -> list[dict[str, list[int]]]:
    out = []
    for r in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][r].sum())
        out.append({k: batch[k][r, :n].tolist() for k in ("input_ids", "token_type_ids", "labels")})
    return out


# Packing invariants


@settings(max_examples=300, deadline=None)
@given(st.integers(5, 64).flatmap(lambda m: st.tuples(st.just(m), st.lists(st.integers(1, m), max_size=70))))
def test_packing_invariants(case):
    max_len, lengths = case
    for rows, width in ((first_fit_decreasing(lengths, max_len), max_len), pack_rows(lengths, max_len, step=3)):
        placed = [i for row in rows for i in row]
        assert sorted(placed) == list(range(len(lengths)))  # every example placed exactly once
        assert all(row == sorted(row) for row in rows)  # input order kept within a row
        assert [row[0] for row in rows] == sorted(row[0] for row in rows)  # rows in order of their first example
        assert all(sum(lengths[i] for i in row) <= width <= max_len for row in rows)  # no row over the width
        if lengths:
            assert len(rows) >= math.ceil(sum(lengths) / width)
            assert width >= max(lengths)
    # First-fit decreasing never leaves two rows that could be merged.
    ffd = first_fit_decreasing(lengths, max_len)
    loads = sorted(sum(lengths[i] for i in row) for row in ffd)
    assert len(loads) < 2 or loads[0] + loads[1] > max_len


def test_pack_rows_narrows_rows():
    # 8 examples of 100 tokens: 2 rows of 512 leave 224 positions empty; 2 rows of 400 leave none.
    rows, width = pack_rows([100] * 8, 512)
    assert width == 400 and len(rows) == 2
    with pytest.raises(ValueError, match="more than max_seq_length 128"):
        first_fit_decreasing([12, 129], 128)


def test_padding_statistics_hand_checked():
    # One batch of lengths 8, 4, 4, 2 into rows of 8: unpadded width 8 (32 positions, 18 real); packed: rows
    # [8], [4, 4], [2] would be width 8 (24 positions) -- narrower rows of 6 fail, so 24.
    stats = padding_statistics([8, 4, 4, 2], batch_size=4, max_seq_length=8, max_batches=None)
    assert stats["batches"] == 1
    assert stats["padding_share_unpacked"] == pytest.approx(1 - 18 / 32)
    assert stats["padding_share_packed"] == pytest.approx(1 - 18 / 24)
    assert stats["rows_per_batch"] == 3
    assert stats["most_rows_at_full_width"] == 3 and packed_rows_per_example(stats) == 3 / 4
    # The recipe's collator: each phase's share from its statistics, one row per example without them (streamed).
    from bert_repro.training.pretraining.phases import packed_rows

    assert packed_rows({"phase1": {"padding": stats}, "phase2": {"examples": 10}}, 2) == [3 / 4, 1.0]


# The packed collator against the unpacked one


def test_packed_batch_holds_the_unpacked_examples(tokenizer):
    config, rows = build_rows(tokenizer)
    rows = rows[:40]
    assert len({len(r["input_ids"]) for r in rows}) > 5, "the test needs examples of several lengths"
    packed = PackingCollator.from_config(tokenizer, config)(rows)
    unpacked = PreTrainingCollator.from_config(tokenizer, config)(rows)
    assert packed["input_ids"].shape[0] < len(rows)  # several examples share a row
    assert packed["input_ids"].shape[1] <= MAX_LEN
    assert all(v.dtype == torch.long for v in packed.values())
    got = examples_of(packed)
    assert len(got) == len(rows) == packed["next_sentence_label"].numel()
    # Pair each packed example with its unpacked original: the collator's order is row-major over the packing.
    order = packed_order(rows)
    want = examples_of_unpacked(unpacked)
    for g, i in zip(got, order, strict=True):
        assert g["position_ids"] == list(range(len(g["input_ids"])))  # positions restart at each [CLS]
        assert g["input_ids"][0] == tokenizer.cls_token_id
        assert {k: g[k] for k in want[i]} == want[i]
    assert packed["next_sentence_label"].tolist() == [rows[i]["next_sentence_label"] for i in order]
    assert int((packed["labels"] != IGNORE_INDEX).sum()) == int((unpacked["labels"] != IGNORE_INDEX).sum())
    # Padding: attention 0, pad id, label -100, segment 0, position 0.
    pad = packed["attention_mask"] == 0
    assert (packed["input_ids"][pad] == tokenizer.pad_token_id).all()
    assert (packed["labels"][pad] == IGNORE_INDEX).all()
    assert (packed["position_ids"][pad] == 0).all() and (packed["token_type_ids"][pad] == 0).all()
    assert int(packed["attention_mask"].sum()) == sum(len(r["input_ids"]) for r in rows)


def test_dynamic_masking_packed_as_unpacked(tokenizer):
    config, rows = build_rows(tokenizer, static_masking=False, masked_lm_prob=0.3, max_predictions_per_seq=14)
    rows = rows[:32]
    packing = PackingCollator.from_config(tokenizer, config)
    assert packing.dynamic_masking
    torch.manual_seed(7)
    packed = packing(rows)
    torch.manual_seed(7)
    unpacked = PreTrainingCollator.from_config(tokenizer, config)(rows)
    want, got = examples_of_unpacked(unpacked), examples_of(packed)
    for g, i in zip(got, packed_order(rows), strict=True):
        assert {k: g[k] for k in want[i]} == want[i]
    assert any(g["labels"].count(IGNORE_INDEX) < len(g["labels"]) for g in got)
    torch.manual_seed(8)
    assert not torch.equal(packing(rows)["labels"], packed["labels"])  # fresh masks for every batch


def fixed_shape_collator(tokenizer, config, examples: int, rows: int) -> PackingCollator:
    """Batches of `examples` example slots in `rows` rows of MAX_LEN (`rows_per_example` set to give that)."""
    return PackingCollator.from_config(
        tokenizer, config, fixed_shape=True, examples=examples, rows_per_example=rows / examples
    )


def test_fixed_shape_batches(tokenizer):
    """A compiled step's batches keep their shapes (empty rows, ignored examples); more rows only when needed."""
    config, rows = build_rows(tokenizer)
    needed = [len(first_fit_decreasing([len(r["input_ids"]) for r in rows[i : i + 24]], MAX_LEN)) for i in (0, 24)]
    collator = fixed_shape_collator(tokenizer, config, examples=28, rows=max(needed) + 2)
    first, second = collator(rows[:24]), collator(rows[24:48])
    for batch, n in ((first, needed[0]), (second, needed[1])):
        assert {k: tuple(v.shape) for k, v in batch.items()} == {
            **{
                k: (max(needed) + 2, MAX_LEN)
                for k in ("input_ids", "token_type_ids", "position_ids", "attention_mask", "labels")
            },
            "masked_positions": (28, config.max_predictions_per_seq),
            "cls_positions": (28,),
            "next_sentence_label": (28,),
        }
        assert not batch["attention_mask"][n:].any()  # the rows beyond the packing are empty
        starts = ((batch["position_ids"] == 0) & batch["attention_mask"].bool()).flatten().nonzero().flatten()
        assert batch["cls_positions"].tolist() == starts.tolist() + [0] * 4  # missing examples read position 0
        assert batch["next_sentence_label"][24:].tolist() == [IGNORE_INDEX] * 4
        assert (batch["masked_positions"][24:] == 0).all() and batch["labels"].flatten()[0] == IGNORE_INDEX
    unpacked = PackingCollator.from_config(tokenizer, config)(rows[:24])
    assert examples_of(first) == examples_of(unpacked)  # the same packing, at the full width
    assert first["next_sentence_label"][:24].tolist() == unpacked["next_sentence_label"].tolist()
    # Too few rows for a batch: one row per slot, the count that always suffices.
    short = fixed_shape_collator(tokenizer, config, examples=28, rows=needed[0] - 1)(rows[:24])
    assert short["input_ids"].shape == (28, MAX_LEN) and examples_of(short) == examples_of(unpacked)
    with pytest.raises(ValueError, match="more than the fixed 28"):
        collator(rows[:29])


# The model on packed batches

SWITCHES = {  # speed switches that read the packed examples themselves
    "plain": {},
    "unpad_inputs": {"unpad_inputs": True},
    "last_layer_subset": {"last_layer_subset": True, "sparse_prediction": True},
    "unpad+subset": {"unpad_inputs": True, "last_layer_subset": True, "sparse_prediction": True},
}


def packed_and_unpacked(tokenizer, count: int = 24, fixed_shape: bool = False):
    """(rows, packed batch, unpacked batch); `fixed_shape` adds 4 missing examples and 2 empty rows."""
    config, rows = build_rows(tokenizer)
    rows = rows[:count]
    packing = PackingCollator.from_config(tokenizer, config)
    if fixed_shape:
        needed = len(first_fit_decreasing([len(r["input_ids"]) for r in rows], MAX_LEN))
        packing = fixed_shape_collator(tokenizer, config, examples=count + 4, rows=needed + 2)
    return rows, packing(rows), PreTrainingCollator.from_config(tokenizer, config)(rows)


def tiny_model(tokenizer, attn: str, **switches):
    from bert_repro import BertReproForPreTraining

    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    config = tiny_config(vocab_size=len(tokenizer), max_position_embeddings=MAX_LEN, **no_dropout, **switches)
    torch.manual_seed(0)
    return BertReproForPreTraining._from_config(config, attn_implementation=attn)


def loss_and_gradients(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", ["packed", "fixed shape"])
@pytest.mark.parametrize("switches", SWITCHES, ids=list(SWITCHES))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_loss_and_gradients_equal_unpacked(tokenizer, attn, switches, layout):
    rows, packed, unpacked = packed_and_unpacked(tokenizer, fixed_shape=layout == "fixed shape")
    assert packed["input_ids"].shape[0] < unpacked["input_ids"].shape[0]
    model = tiny_model(tokenizer, attn, **SWITCHES[switches]).train()  # dropout 0: training mode, deterministic
    a, grads_a = loss_and_gradients(model, unpacked)
    b, grads_b = loss_and_gradients(model, packed)
    for name in ("loss", "masked_lm_loss", "next_sentence_loss"):
        assert torch.allclose(getattr(a, name), getattr(b, name), atol=1e-5), name
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == len(list(model.parameters()))
    for name, grad in grads_a.items():
        assert torch.allclose(grad, grads_b[name], atol=1e-5), name
    # NSP: one prediction per example, from its own [CLS], in the packed order.
    order = packed_order(rows)
    if layout == "fixed shape":
        order = [i for row in first_fit_decreasing([len(r["input_ids"]) for r in rows], MAX_LEN) for i in row]
    assert torch.allclose(b.seq_relationship_logits[: len(rows)], a.seq_relationship_logits[order], atol=1e-5)


def test_fixed_shape_batch_compiles_to_one_graph_with_the_unpacked_results(tokenizer):
    """A fixed-shape batch compiles to one graph with the unpacked batch's losses, sums and gradients."""
    import torch._dynamo

    from bert_repro.training.pretraining.trainer import PreTrainingTrainer, pretraining_sums

    rows, packed, unpacked = packed_and_unpacked(tokenizer, fixed_shape=True)
    model = tiny_model(tokenizer, "sdpa", sparse_prediction=True).train()
    a, grads_a = loss_and_gradients(model, unpacked)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False, capture_scalar_outputs=False):
        model.zero_grad(set_to_none=True)
        b = torch.compile(model, backend="eager", fullgraph=True)(**packed)
        b.loss.backward()
    torch._dynamo.reset()
    grads_b = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads_a.keys() == grads_b.keys()
    for name in ("loss", "masked_lm_loss", "next_sentence_loss"):
        assert torch.allclose(getattr(a, name), getattr(b, name), atol=1e-5), name
    for name, grad in grads_a.items():
        assert torch.allclose(grad, grads_b[name], atol=1e-5), name
    targets = ("labels", "next_sentence_label", "masked_positions")
    sums = [
        pretraining_sums(out.prediction_logits, out.seq_relationship_logits, *(batch[k] for k in targets))
        for out, batch in ((a, unpacked), (b, packed))
    ]
    assert sums[0][5] == len(rows) and torch.allclose(sums[0], sums[1], atol=1e-4)  # missing examples count for 0
    trainer = SimpleNamespace(tokens_seen=0, accelerator=SimpleNamespace(num_processes=1))
    counts = [PreTrainingTrainer._get_num_items_in_batch(trainer, [batch], "cpu") for batch in (unpacked, packed)]
    assert counts[0].tolist() == counts[1].tolist() == [sums[0][2].item(), len(rows)]  # the global batch's counts


def test_cls_positions_are_checked(tokenizer):
    _, packed, _ = packed_and_unpacked(tokenizer)
    model = tiny_model(tokenizer, "sdpa").eval()
    inputs = {k: v for k, v in packed.items() if k not in ("labels", "next_sentence_label", "masked_positions")}
    with torch.no_grad():
        found = model.bert(**{k: v for k, v in inputs.items() if k != "cls_positions"}).pooler_output
        assert torch.equal(model.bert(**inputs).pooler_output, found)
        for wrong in (inputs["cls_positions"] + 1, inputs["cls_positions"].flip(0), inputs["cls_positions"][1:]):
            with pytest.raises(ValueError, match="cls_positions must name each example"):
                model.bert(**{**inputs, "cls_positions": wrong})


def test_no_attention_across_examples(tokenizer):
    _, packed, _ = packed_and_unpacked(tokenizer)
    model = tiny_model(tokenizer, "sdpa").eval()
    starts = (packed["position_ids"] == 0) & packed["attention_mask"].bool()
    row = int(starts.sum(1).argmax())  # the row with the most examples
    example_ids = starts.cumsum(1) * packed["attention_mask"]
    assert int(example_ids[row].max()) >= 2
    changed = {k: v.clone() for k, v in packed.items() if k not in ("labels", "next_sentence_label")}
    victim = example_ids[row] == 1
    changed["input_ids"][row, victim] = (changed["input_ids"][row, victim] + 1) % len(tokenizer)
    with torch.no_grad():
        before = model.bert(**{k: v for k, v in packed.items() if k not in ("labels", "next_sentence_label")})
        after = model.bert(**changed)
    others = example_ids[row] >= 2
    assert torch.equal(before.last_hidden_state[row, others], after.last_hidden_state[row, others])
    assert not torch.allclose(before.last_hidden_state[row, victim], after.last_hidden_state[row, victim])
    # The pooled [CLS] of each example: only the changed example's moves.
    assert before.pooler_output.shape[0] == int(starts.sum())
    first = int(starts[:row].sum())  # the changed example's rank in row-major order
    moved = (before.pooler_output - after.pooler_output).abs().amax(-1) > 0
    assert moved.nonzero().flatten().tolist() == [first]


def reference_flash_varlen(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' flash path given cu_seq_lens: one SDPA call per [start, end) of the flattened batch."""
    cu_seq_lens_q, max_length_q = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
    assert attention_mask is None and torch.equal(cu_seq_lens_q, kwargs["cu_seq_lens_k"])
    assert max_length_q == kwargs["max_length_k"] == int(cu_seq_lens_q.diff().max())
    batch, heads, seq, size = query.shape
    q, k, v = (x.transpose(1, 2).reshape(batch * seq, heads, size).transpose(0, 1) for x in (query, key, value))
    bounds = cu_seq_lens_q.tolist()
    parts = [
        torch.nn.functional.scaled_dot_product_attention(q[:, s:e], k[:, s:e], v[:, s:e], scale=scaling)
        for s, e in pairwise(bounds)
    ]
    return torch.cat(parts, dim=1).transpose(0, 1).reshape(batch, seq, heads, size), None


def test_attention_kernel_choice(tokenizer):
    """sdpa / eager get the block-diagonal mask; flash gets cu_seqlens per example and gives the unpacked outputs."""
    from transformers import AttentionInterface

    from bert_repro.model.modeling_bert_repro import attention_inputs
    from bert_repro.model.packed_sequences import PackedSequences

    rows, packed, unpacked = packed_and_unpacked(tokenizer)
    sequences = PackedSequences.from_inputs(packed["position_ids"], packed["attention_mask"])
    model = tiny_model(tokenizer, "sdpa").eval()
    mask, extra = attention_inputs(model.config, None, packed["attention_mask"], sequences)
    assert extra == {} and mask.dtype == torch.bool
    assert mask.shape == (len(packed["input_ids"]), 1, *packed["input_ids"].shape[1:] * 2)
    ids = sequences.example_ids
    assert torch.equal(mask[:, 0], ids[:, :, None] == ids[:, None, :])
    # Not packed: position_ids absent or counting up in every row.
    assert PackedSequences.from_inputs(None, unpacked["attention_mask"]) is None
    positions = torch.arange(unpacked["input_ids"].shape[1]).expand_as(unpacked["input_ids"])
    assert PackedSequences.from_inputs(positions, unpacked["attention_mask"]) is None

    AttentionInterface.register("reference_flash_varlen", reference_flash_varlen)
    model.config._attn_implementation = "reference_flash_varlen"  # a flash-attention name; not a real kernel
    mask, extra = attention_inputs(model.config, None, packed["attention_mask"], sequences)
    assert mask is None
    cu = extra["cu_seq_lens_q"].tolist()
    width = packed["input_ids"].shape[1]
    lengths = [len(r["input_ids"]) for r in rows]
    expected = []
    for r, row in enumerate(pack_rows(lengths, MAX_LEN)[0]):
        start = r * width
        for i in row:
            expected.append(start)
            start += lengths[i]
        if start < (r + 1) * width:
            expected.append(start)  # the row's padding
    assert cu == expected + [len(packed["input_ids"]) * width]
    with torch.no_grad():
        flash = model(**packed)
        model.config._attn_implementation = "sdpa"
        sdpa = model(**packed)
    assert torch.allclose(flash.prediction_logits, sdpa.prediction_logits, atol=1e-5)
    assert torch.allclose(flash.seq_relationship_logits, sdpa.seq_relationship_logits, atol=1e-5)
    # The unpadding speed path with a flash-attention name: one row of real tokens, cu_seqlens per example.
    varlen = tiny_model(tokenizer, "sdpa", unpad_inputs=True).eval()
    varlen.load_state_dict(model.state_dict())
    varlen.config._attn_implementation = "reference_flash_varlen"
    with torch.no_grad():
        unpadded = varlen(**packed)
    real = packed["attention_mask"].bool()
    assert torch.allclose(unpadded.prediction_logits[real], sdpa.prediction_logits[real], atol=1e-5)
    assert torch.allclose(unpadded.seq_relationship_logits, sdpa.seq_relationship_logits, atol=1e-5)


# The recipe


@pytest.mark.slow
def test_recipe_with_packing_trains_as_without(tmp_path, corpus_and_tokenizer):
    """`--packing true` logs the same losses; data_statistics.json holds each phase's padding shares, both ways."""
    import json

    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(
        tmp_path / "run.yaml", corpus, tokenizer, max_steps=4, save_steps=100, eval_steps=100, short_seq_prob=0.5
    )
    histories = {}
    for packing in ("false", "true"):
        out = tmp_path / f"packing_{packing}"
        launch(config, out, "--packing", packing)
        histories[packing] = [e for e in json.loads((out / "log_history.json").read_text()) if "mlm_loss" in e]
        stats = json.loads((out / "data_statistics.json").read_text())
        for phase in ("phase1", "phase2"):
            padding = stats[phase]["padding"]
            assert 0 <= padding["padding_share_packed"] < padding["padding_share_unpacked"] < 1
    assert len(histories["true"]) == len(histories["false"]) == 4
    for a, b in zip(histories["false"], histories["true"], strict=True):
        for key in ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
            assert a[key] == pytest.approx(b[key], abs=2e-4), (a["step"], key)
