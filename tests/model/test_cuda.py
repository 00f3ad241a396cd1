"""The CUDA path (bf16/fp16, SDPA and FlashAttention, torch.compile, fused AdamW) against fp32 on the same batch.

Run with `python -m pytest -m cuda` (skipped without CUDA). bf16 keeps 8 mantissa bits (~4e-3 per rounding), fp16 11.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from bert_repro import BertReproConfig, BertReproForPreTraining, BertReproForSequenceClassification
from bert_repro.model.configuration_bert_repro import SPEED_SWITCHES

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

HAS_FLASH = importlib.util.find_spec("flash_attn") is not None


def config(**overrides) -> BertReproConfig:
    fields = dict(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertReproConfig(**{**fields, **overrides})


def batch(device="cuda", rows=4, seq=64, vocab=512, seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([seq, seq - 9, seq // 2, 7])[:rows]
    attention_mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    input_ids = torch.randint(5, vocab, (rows, seq), generator=g) * attention_mask
    labels = torch.full((rows, seq), -100)
    masked = (torch.rand(rows, seq, generator=g) < 0.15) & attention_mask.bool()
    masked[:, 1] = True
    labels[masked] = input_ids[masked]
    token_type_ids = ((torch.arange(seq)[None] >= (lengths[:, None] // 2)) & attention_mask.bool()).long()
    out = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        labels=labels,
        next_sentence_label=torch.tensor([0, 1, 0, 1])[:rows],
    )
    return {k: v.to(device) for k, v in out.items()}


def loss_and_grads(model, inputs, autocast_dtype=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().float(), grads


def reference(**overrides):
    torch.manual_seed(0)
    model = BertReproForPreTraining._from_config(config(**overrides), attn_implementation="eager").cuda().train()
    return model


def assert_close_grads(ours, ref, rtol, atol):
    assert ours.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("attn", ["sdpa", "flex_attention"])  # against the eager reference
def test_fp32_kernels_agree_on_cuda(attn):
    ref = reference()
    model = copy.deepcopy(ref)
    model.config._attn_implementation = attn
    inputs = batch()
    ref_loss, ref_grads = loss_and_grads(ref, inputs)
    loss, grads = loss_and_grads(model, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert_close_grads(grads, ref_grads, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_equals_fp32_within_its_tolerance(dtype):
    ref = reference()
    inputs = batch()
    ref_loss, ref_grads = loss_and_grads(ref, inputs)
    model = copy.deepcopy(ref)
    model.config._attn_implementation = "sdpa"
    loss, grads = loss_and_grads(model, inputs, dtype)
    tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
    torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
    # gradients: compare direction and size per tensor (elementwise bf16 noise is large on tiny values)
    for name, g in ref_grads.items():
        if name.endswith("attention.self.key.bias"):  # softmax ignores a shift of every score: zero, up to noise
            continue
        cosine = torch.nn.functional.cosine_similarity(grads[name].flatten(), g.flatten(), dim=0)
        assert cosine > (0.99 if dtype == torch.bfloat16 else 0.995), name


def test_fp16_training_with_loss_scaling_steps_like_fp32():
    ref = reference()
    model = copy.deepcopy(ref)
    inputs = batch()
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(3):
        loss_and_grads(ref, inputs)
        opt_ref.step()
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(**inputs).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=2e-2, atol=2e-3, msg=lambda m: f"{name}: {m}")


def test_whole_model_compile_equals_eager():
    ref = reference()
    model = copy.deepcopy(ref)
    model.config._attn_implementation = "sdpa"
    compiled = torch.compile(model)
    inputs = batch()
    ref_loss, ref_grads = loss_and_grads(ref, inputs)
    loss, grads = loss_and_grads(compiled, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-4)
    assert_close_grads({k.removeprefix("_orig_mod."): v for k, v in grads.items()}, ref_grads, rtol=1e-3, atol=1e-4)


def test_fused_adamw_equals_the_loop_implementation():
    ref = reference()
    model = copy.deepcopy(ref)
    inputs = batch()
    for m, fused in ((ref, False), (model, True)):
        opt = torch.optim.AdamW(
            m.parameters(), lr=1e-3, eps=1e-6, weight_decay=0.01, fused=fused, foreach=False if fused else None
        )
        for _ in range(2):
            loss_and_grads(m, inputs)
            opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_sparse_prediction_and_the_cpu_switches_leave_cuda_results_unchanged():
    """The CPU-only tricks must never break the GPU path: every switch on, same loss and gradients."""
    ref = reference()
    inputs = batch()
    ref_loss, ref_grads = loss_and_grads(ref, inputs)
    switches = dict(sparse_prediction=True, **dict.fromkeys(SPEED_SWITCHES, True))
    torch.manual_seed(0)
    model = BertReproForPreTraining._from_config(config(**switches), attn_implementation="eager").cuda().train()
    model.load_state_dict(ref.state_dict())
    loss, grads = loss_and_grads(model, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    assert_close_grads(grads, ref_grads, rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(not HAS_FLASH, reason="flash-attn is not installed")
def test_flash_attention_varlen_on_unpadded_tokens_equals_sdpa():
    torch.manual_seed(0)
    ref = BertReproForSequenceClassification._from_config(config(), attn_implementation="sdpa").cuda().eval()
    model = (
        BertReproForSequenceClassification._from_config(
            config(unpad_inputs=True), attn_implementation="flash_attention_2"
        )
        .cuda()
        .eval()
    )
    model.load_state_dict(ref.state_dict())
    inputs = {k: v for k, v in batch().items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits.float(), ref(**inputs).logits.float(), rtol=3e-2, atol=3e-2)


def pack(inputs: dict[str, torch.Tensor], rows: list[list[int]], width: int) -> dict[str, torch.Tensor]:
    """A padded batch's examples packed into `rows` of `width` tokens, positions restarting at each [CLS]."""
    lengths = inputs["attention_mask"].sum(1).tolist()
    out = {
        k: torch.zeros(len(rows), width, dtype=torch.long)
        for k in ("input_ids", "token_type_ids", "attention_mask", "position_ids")
    }
    out["labels"] = torch.full((len(rows), width), -100)
    order = []
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            n = lengths[i]
            for key in ("input_ids", "token_type_ids", "attention_mask", "labels"):
                out[key][r, at : at + n] = inputs[key][i, :n].cpu()
            out["position_ids"][r, at : at + n] = torch.arange(n)
            at += n
            order.append(i)
    out["next_sentence_label"] = inputs["next_sentence_label"].cpu()[order]
    return {k: v.cuda() for k, v in out.items()}


@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_packed_batch_on_cuda_equals_the_same_examples_unpacked(attn):
    if attn == "flash_attention_2" and not HAS_FLASH:
        pytest.skip("flash-attn is not installed")
    ref = reference(sparse_prediction=True)
    inputs = batch()
    ref_loss, ref_grads = loss_and_grads(ref, inputs)
    model = copy.deepcopy(ref)
    model.config._attn_implementation = attn
    packed = pack(inputs, [[0, 1], [2, 3]], 128)
    dtype = torch.bfloat16 if attn == "flash_attention_2" else None  # flash kernels run in 16-bit only
    loss, grads = loss_and_grads(model, packed, dtype)
    tol = 3e-2 if dtype else 1e-4
    torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
    if dtype is None:
        assert_close_grads(grads, ref_grads, rtol=1e-3, atol=1e-4)
