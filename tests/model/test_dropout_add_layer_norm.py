"""The fused dropout + add + LayerNorm kernels (`fused_dropout_add_norm`) under Triton's CPU interpreter.

The interpreter runs each program in numpy (conftest.py sets TRITON_INTERPRET=1), so the sizes stay small.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from support.models import tiny_config
from torch import nn

pytest.importorskip("triton")

from bert_repro import BertReproForPreTraining
from bert_repro.model import dropout_add_layer_norm as fused
from bert_repro.model.dropout_add_layer_norm import (
    FusedOutput,
    FusedSelfOutput,
    dropout_add_layer_norm,
    random_numbers,
    threshold_and_scale,
)


def layer_norm(n: int, seed: int = 0) -> nn.LayerNorm:
    torch.manual_seed(seed)
    norm = nn.LayerNorm(n, eps=1e-12)
    nn.init.normal_(norm.weight, 1.0, 0.5)
    nn.init.normal_(norm.bias, 0.0, 0.5)
    return norm


def keep_mask(seed, rows, n, p):
    """(rows, n) bool: the columns the forward kernel keeps (its sum at x = 1, residual = 0)."""
    ones, zeros = torch.ones(rows, n), torch.zeros(rows, n)
    _, z, _, _ = fused._forward(ones, zeros, torch.ones(n), torch.zeros(n), seed, float(p), 1e-12, 0)
    return z != 0


def fused_and_reference(rows, n, p, x_dtype=torch.float32, residual_dtype=torch.float32, out_dtype=None, seed=11):
    """Fused and reference (torch ops in float32 with the kernel's own keep mask) output and gradients."""
    torch.manual_seed(1)
    x = torch.randn(rows, n).to(x_dtype)
    residual = torch.randn(rows, n).to(residual_dtype)
    norm = layer_norm(n)
    seed = torch.tensor([seed])
    a, b = (x.clone().requires_grad_(), residual.clone().requires_grad_())
    y = dropout_add_layer_norm(a, b, norm, p, True, out_dtype=out_dtype, seed=seed)
    dy = torch.randn(y.shape).to(y.dtype)
    y.backward(dy)
    got = (y, a.grad, b.grad, norm.weight.grad, norm.bias.grad)

    keep = keep_mask(seed, rows, n, p)
    scale = threshold_and_scale(p)[1]
    a2, b2 = x.float().requires_grad_(), residual.float().requires_grad_()
    w2, bias2 = norm.weight.detach().clone().requires_grad_(), norm.bias.detach().clone().requires_grad_()
    y2 = F.layer_norm(b2 + a2 * keep * scale, (n,), w2, bias2, norm.eps)
    y2.backward(dy.float())
    return got, (y2, a2.grad, b2.grad, w2.grad, bias2.grad), keep


NAMES = ("output", "x grad", "residual grad", "weight grad", "bias grad")


@pytest.mark.parametrize("rows,n", [(7, 48), (5, 40), (3, 64)])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_float32_output_and_gradients_equal_the_reference_with_the_kernels_mask(rows, n, p):
    """Rows not a multiple of the backward's programs (7 rows, 4 programs), widths not a power of two (48, 40)."""
    got, want, keep = fused_and_reference(rows, n, p)
    assert 0 < int(keep.sum()) < keep.numel()
    for name, a, b in zip(NAMES, got, want):
        assert a.dtype == torch.float32, name
        assert (a - b).abs().max() < 1e-5, f"{name}: {(a - b).abs().max():.2e}"


@pytest.mark.parametrize("out_dtype,tolerance", [(None, 2e-2), (torch.bfloat16, 3e-2)], ids=["float32", "bf16-opt-in"])
def test_bf16_input_with_the_float32_residual_stream_as_under_autocast(out_dtype, tolerance):
    """bf16 x with a float32 residual: float32 output (bf16 opt-in), bf16 x gradient, values at bf16 tolerance."""
    got, want, _ = fused_and_reference(6, 64, 0.1, x_dtype=torch.bfloat16, out_dtype=out_dtype)
    assert [t.dtype for t in got[:3]] == [out_dtype or torch.float32, torch.bfloat16, torch.float32]
    for name, a, b in zip(NAMES, got, want):
        assert (a.float() - b).abs().max() < tolerance * (1 + b.abs().max()), name


def test_without_dropout_it_is_layer_norm_of_the_sum():
    """p = 0 (and eval mode): exactly LayerNorm(x + residual), no column dropped."""
    torch.manual_seed(2)
    x, residual, norm = torch.randn(5, 48), torch.randn(5, 48), layer_norm(48)
    want = F.layer_norm(residual + x, (48,), norm.weight, norm.bias, norm.eps)
    for p, training in ((0.0, True), (0.1, False)):
        got = dropout_add_layer_norm(x, residual, norm, p, training)
        assert (got - want).abs().max() < 1e-5


def test_keep_rate_within_binomial_bounds_over_a_million_numbers():
    p = 0.1
    keep = keep_mask(torch.tensor([3]), 64, 16384, p)
    n, q = keep.numel(), 1 - threshold_and_scale(p)[0] / 65536
    assert n >= 10**6
    assert abs(int(keep.sum()) - n * q) < 5 * math.sqrt(n * q * (1 - q))
    # rows and seeds draw their own numbers
    assert not torch.equal(keep[0], keep[1])
    assert not torch.equal(keep_mask(torch.tensor([4]), 2, 64, p), keep_mask(torch.tensor([3]), 2, 64, p))


def test_the_backward_drops_exactly_what_the_forward_dropped():
    """x's gradient is zero exactly where the forward dropped x: the backward regenerates the forward's mask."""
    got, _, keep = fused_and_reference(8, 64, 0.3)
    _, x_grad, residual_grad, _, _ = got
    scale = threshold_and_scale(0.3)[1]
    assert torch.equal(x_grad == 0, ~keep)
    assert (x_grad - residual_grad * keep * scale).abs().max() < 1e-6


def test_a_number_equal_to_the_threshold_is_kept():
    """keep = number >= round(p * 65536), in the forward and the backward alike."""
    seed, rows, n = torch.tensor([5]), 4, 64
    numbers = random_numbers(seed, rows, n)
    assert numbers.min() >= 0 and numbers.max() < 65536
    edge = int(numbers[2, 17])
    p = edge / 65536
    assert threshold_and_scale(p)[0] == edge
    keep = keep_mask(seed, rows, n, p)
    assert torch.equal(keep, numbers >= edge)
    a = torch.ones(rows, n, requires_grad=True)
    dropout_add_layer_norm(a, torch.randn(rows, n), layer_norm(n), p, True, seed=seed).sum().backward()
    assert torch.equal(a.grad != 0, numbers >= edge)


def test_eight_numbers_per_philox_draw():
    """Column k * M + j takes half k % 2 of word k // 2 of draw j (M = n / 8), against Philox4x32-10 written out."""
    seed, rows, n = 0x1234ABCD, 2, 64
    numbers = random_numbers(torch.tensor([seed]), rows, n)
    m = n // 8
    for row in range(rows):
        for j in range(0, m, 3):
            words = philox4x32(row * m + j, seed)
            for k in range(8):
                assert int(numbers[row, k * m + j]) == (words[k // 2] >> (16 * (k % 2))) & 0xFFFF


def philox4x32(counter: int, seed: int, rounds: int = 10) -> list[int]:
    """Philox4x32 (Salmon et al., 2011) on counter (counter, 0, 0, 0), as Triton's `randint4x` computes it."""
    mask = 0xFFFFFFFF
    c = [counter & mask, 0, 0, 0]
    k0, k1 = seed & mask, (seed >> 32) & mask
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & mask, p1 & mask, ((p0 >> 32) ^ c[3] ^ k1) & mask, p0 & mask]
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return c


def test_custom_ops_pass_opcheck():
    torch.manual_seed(0)
    x, residual, norm = torch.randn(5, 40), torch.randn(5, 40), layer_norm(40)
    seed = torch.tensor([9])
    args = (x, residual, norm.weight, norm.bias, seed, 0.1, 1e-12, 0)
    torch.library.opcheck(torch.ops.bert_repro.dropout_add_layer_norm.default, args)
    with torch.no_grad():
        y, z, mean, rstd = torch.ops.bert_repro.dropout_add_layer_norm(*args)
    torch.library.opcheck(
        torch.ops.bert_repro.dropout_add_layer_norm_backward.default,
        (torch.randn_like(y), z, norm.weight.detach(), mean, rstd, seed, 0.1, 0),
    )


def test_the_switch_builds_the_fused_modules_and_keeps_the_models_values():
    """With dropout off, the switched model has the plain model's state_dict keys, loss and gradients."""
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    plain = BertReproForPreTraining(tiny_config(**no_dropout))
    fast = BertReproForPreTraining(tiny_config(fused_dropout_add_norm=True, **no_dropout))
    fast.load_state_dict(plain.state_dict())  # strict: the same keys

    layer = fast.bert.encoder.layer[0]
    assert type(layer.attention.output) is FusedSelfOutput and type(layer.output) is FusedOutput
    batch = _batch()
    a, b = plain(**batch), fast(**batch)
    a.loss.backward()
    b.loss.backward()
    assert (a.loss - b.loss).abs() < 1e-5
    for (name, p1), p2 in zip(plain.named_parameters(), fast.parameters()):
        assert (p1.grad - p2.grad).abs().max() < 1e-5, name


def _batch():
    torch.manual_seed(3)
    ids = torch.randint(5, 99, (2, 8))
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": labels,
        "next_sentence_label": torch.tensor([0, 1]),
    }


def test_compiled_training_step_is_one_graph():
    """Under torch.compile, one compilation with no graph break over steps of new masks (the seed is drawn in-graph)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = BertReproForPreTraining(tiny_config(fused_dropout_add_norm=True)).train()
    backend = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=backend)
    losses, batch = [], _batch()
    for _ in range(3):
        loss = compiled(**batch).loss
        loss.backward()
        losses.append(float(loss))
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert backend.frame_count == 1
    assert len(set(losses)) == 3  # each step its own dropout masks
    torch._dynamo.reset()


def test_kernels_run_only_where_they_can(monkeypatch):
    """On the CPU only under the interpreter; elsewhere the module computes the paper's ops."""
    assert fused.runs_kernel(torch.zeros(1))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not fused.runs_kernel(torch.zeros(1))


def test_p_one_drops_everything_as_torch_does():
    """p = 1 gives LayerNorm(residual) and a zero x gradient, as torch's dropout does, never dividing by 1 - p."""
    torch.manual_seed(4)
    x, residual, norm = torch.randn(3, 48, requires_grad=True), torch.randn(3, 48), layer_norm(48)
    got = dropout_add_layer_norm(x, residual, norm, 1.0, True, seed=torch.tensor([7]))
    want = F.layer_norm(residual, (48,), norm.weight, norm.bias, norm.eps)
    assert (got - want).abs().max() < 1e-5
    got.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("affine,bias", [(False, False), (True, False)])
def test_layer_norm_without_affine_parameters_or_bias(affine, bias):
    """A LayerNorm without weight or bias: the kernels take ones and zeros, and match torch."""
    torch.manual_seed(5)
    norm = nn.LayerNorm(40, elementwise_affine=affine, bias=bias)
    x, residual = torch.randn(4, 40), torch.randn(4, 40)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = dropout_add_layer_norm(a, residual, norm, 0.0, True)
    want = norm(residual + b)
    assert (got - want).abs().max() < 1e-5
    dy = torch.randn(4, 40)
    got.backward(dy)
    want.backward(dy)
    assert (a.grad - b.grad).abs().max() < 1e-5
