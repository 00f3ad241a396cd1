"""`measured_sdpa` (attention_backend.py): which SDPA backend runs attention, and that what runs is the paper's.

The choice is pure Python, tested for every table it could be given; the CUDA branch runs on CPU tensors that say
they are CUDA (SDPA then takes math). The CUDA backends themselves are checked by benchmarks/gpu/gpu_micro.py.
"""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from bert_repro.model import attention_backend
from bert_repro.model.attention_backend import (
    BACKENDS,
    DEFAULT_ORDER,
    MASKLESS,
    VARLEN,
    backend_order,
    flash_varlen_attention,
    key_padding_lengths,
    measured_sdpa_attention,
    sdpa_under,
    shape_class,
    table_from_micro,
)


class Attention(nn.Module):
    """What the SDPA interface reads from a self-attention module."""

    is_causal = False


def inputs(batch=3, heads=2, seq=10, head_size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq, head_size, generator=g) for _ in range(3))
    lengths = torch.tensor([seq, seq - 3, 2])[:batch]
    real = torch.arange(seq)[None, :] < lengths[:, None]
    return q, k, v, real, real[:, None, None, :].expand(batch, 1, seq, seq)


TABLES = [
    {},
    {(64, 128, True): ("flash", "efficient", "cudnn"), (64, 128, False): ("flash", "cudnn")},
    {(64, 128, True): ("math",), (64, 512, True): ("flash",), (64, 512, False): ("bogus", "flash", "flash_varlen")},
    {(64, 128, True): ("flash_varlen", "cudnn"), (64, 128, False): ("flash_varlen", "flash")},
]


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("seq", [16, 128, 300, 512, 2048])
def test_a_masked_call_never_gets_a_backend_that_cannot_take_the_mask(table, seq):
    for masked in (False, True):
        order = backend_order(seq, 64, masked, table)
        assert order[-1] == "math" and order.count("math") == 1
        if masked:
            assert not set(order) & MASKLESS
        else:  # the variable-length call reads the rows' lengths from the mask
            assert VARLEN not in order
        assert set(order) <= {*BACKENDS, VARLEN}
    assert backend_order(128, 64, True, {}) == DEFAULT_ORDER == ("cudnn", "efficient", "math")
    assert backend_order(100, 64, False, TABLES[1]) == ("flash", "cudnn", "math")  # measured, and no mask to keep
    assert backend_order(100, 64, True, TABLES[1]) == ("efficient", "cudnn", "math")


def test_shape_classes():
    assert shape_class(1, 64, True) == shape_class(128, 64, True) == (64, 128, True)
    assert shape_class(129, 64, False) == (64, 256, False)
    assert shape_class(4096, 64, True) == (64, 512, True)


def test_table_keeps_only_backends_that_ran_and_equalled_math():
    row = dict(seq=128, head_size=64, batch=256, heads=12)
    rows = [
        # fastest, but its masked output differed from math's: a mask ignored
        {**row, "backend": "cudnn", "masked": True, "fwd_bwd_ms": 0.5, "max_abs_diff_vs_math": 40.0},
        {**row, "backend": "efficient", "masked": True, "fwd_bwd_ms": 1.0, "max_abs_diff_vs_math": 0.004},
        # cannot take a mask (a row that says otherwise is not believed)
        {**row, "backend": "flash", "masked": True, "fwd_bwd_ms": 0.4, "max_abs_diff_vs_math": 0.004},
        {**row, "backend": "math", "masked": True, "fwd_bwd_ms": 9.0, "max_abs_diff_vs_math": 0.004},
        {**row, "backend": "flash", "masked": False, "fwd_bwd_ms": 0.7, "max_abs_diff_vs_math": 0.004},
        {**row, "backend": "cudnn", "masked": False, "error": "RuntimeError: no kernel"},
        {**row, "backend": "default", "masked": False, "fwd_bwd_ms": 0.1, "max_abs_diff_vs_math": 0.0},
        {**row, "backend": "flash_varlen", "masked": True, "fwd_bwd_ms": 0.1, "max_abs_diff_vs_math": 0.0},
    ]
    expected = {(64, 128, True): ("flash_varlen", "efficient", "math"), (64, 128, False): ("flash",)}
    assert table_from_micro({"stages": {"attention": {"rows": rows}}}) == expected


def test_on_cpu_the_kernel_is_transformers_sdpa_call():
    """The same values and the same random numbers as the path without the switch, dropout on."""
    module = Attention().train()
    q, k, v, _, mask = inputs()
    torch.manual_seed(1)
    ours, _ = measured_sdpa_attention(module, q, k, v, mask, scaling=0.3, dropout=0.2)
    torch.manual_seed(1)
    theirs, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3, dropout=0.2)
    assert torch.equal(ours, theirs)


class PretendCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: runs `measured_sdpa_attention`'s CUDA branch here."""

    @property
    def is_cuda(self):
        return True


def test_the_cuda_branch_runs_sdpa_under_the_chosen_order(monkeypatch):
    asked = []
    real_sdpa_kernel = attention_backend.sdpa_kernel

    def recording(backends, set_priority=False):
        asked.append((list(backends), set_priority))
        return real_sdpa_kernel(backends, set_priority=set_priority)

    monkeypatch.setattr(attention_backend, "sdpa_kernel", recording)
    monkeypatch.setattr(attention_backend, "MEASURED_ORDER", {(8, 128, True): ("flash", "efficient")})
    q, k, v, _, mask = inputs()
    module = Attention().eval()
    ours, _ = measured_sdpa_attention(
        module, *(torch.Tensor._make_subclass(PretendCuda, x) for x in (q, k, v)), mask, 0.3
    )
    assert asked == [([BACKENDS["efficient"], BACKENDS["math"]], True)]
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert torch.allclose(ours, expected, atol=1e-6)


def test_masked_keys_get_no_weight_and_no_gradient():
    """Masked keys' values set to 1e6 do not move the output; their keys' and values' gradients are exactly 0."""
    module = Attention().eval()
    q, k, v, real, mask = inputs()
    padding = ~real[:, None, :, None]
    k, v = k.requires_grad_(), v.requires_grad_()
    out, _ = sdpa_under(("math",), module, q, k, v, mask, scaling=0.35)
    far, _ = sdpa_under(("math",), module, q, k, v.detach().masked_fill(padding, 1e6), mask, scaling=0.35)
    assert torch.equal(out, far)
    out.sum().backward()
    for grad in (k.grad, v.grad):
        assert grad.masked_select(padding).numel() and not grad.masked_select(padding).any()
    assert k.grad.masked_select(~padding).abs().sum() > 0


def test_dropout_drops_probabilities_and_rescales_the_rest():
    """One-hot values make the context the probabilities: each 0 or eval / (1 - p), about p dropped, masked ones 0."""
    p, seq = 0.25, 64
    q, k, _, real, mask = inputs(batch=3, heads=4, seq=seq, head_size=8)
    v = torch.eye(seq).expand(3, 4, seq, seq)
    module = Attention()
    probs, _ = sdpa_under(("math",), module.eval(), q, k, v, mask, scaling=0.35)
    torch.manual_seed(0)
    dropped, _ = sdpa_under(("math",), module.train(), q, k, v, mask, scaling=0.35, dropout=p)
    probs, dropped = probs.transpose(1, 2), dropped.transpose(1, 2)  # (batch, heads, query, key)
    kept = dropped != 0
    assert torch.allclose(dropped[kept], probs[kept] / (1 - p), rtol=1e-5)
    assert not dropped.masked_select(~real[:, None, None, :]).any()
    share = 1 - kept[real[:, None, None, :].expand_as(kept)].float().mean().item()
    assert abs(share - p) < 0.02


def test_compiles_without_graph_breaks():
    """The order's lookup and `sdpa_kernel` trace into the graph (dynamo handles the context manager)."""
    torch._dynamo.reset()
    counters.clear()
    module = Attention().train()

    def attend(q, k, v, mask):
        order = backend_order(k.shape[-2], q.shape[-1], mask is not None)
        return sdpa_under(order[-1:], module, q, k, v, mask, scaling=0.3, dropout=0.1)[0]

    backend = CompileCounterWithBackend("aot_eager")
    q, k, v, _, mask = inputs()
    q.requires_grad_()
    torch.compile(attend, backend=backend)(q, k, v, mask).sum().backward()
    assert dict(counters["graph_break"]) == {} and backend.frame_count == 1
    torch._dynamo.reset()


def test_the_switch_picks_the_kernel_for_sdpa_only():
    """The switch routes SDPA (only) to `measured_sdpa_attention`; without it SDPA is transformers' own."""
    from support.models import tiny_config

    from bert_repro import BertReproModel

    hidden = torch.zeros(1, 4, 32)
    for attn, switch, expected in [
        ("sdpa", True, measured_sdpa_attention),
        ("sdpa", False, sdpa_attention_forward),
        ("eager", True, None),
    ]:
        model = BertReproModel._from_config(tiny_config(measured_sdpa=switch), attn_implementation=attn)
        kernel = model.encoder.layer[0].attention.self.attention_function(hidden)
        assert kernel is expected if expected else kernel.__name__ == "eager_attention"


def reference_flash(query, key, value, cu_seqlens, max_seqlen, dropout, scaling):
    """What aten's variable-length FlashAttention computes (without dropout): each segment attends to itself."""
    out = torch.zeros_like(query)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            segment = [x[start:end].transpose(0, 1) for x in (query, key, value)]
            out[start:end] = F.scaled_dot_product_attention(*segment, scale=scaling).transpose(0, 1)
    return out


def test_varlen_call_is_masked_attention_at_the_real_tokens(monkeypatch):
    """Each row two segments (its tokens, its padding): at real queries, exactly the key-padding-masked attention."""
    monkeypatch.setattr(attention_backend, "_flash_forward", reference_flash)
    q, k, v, real, mask = inputs(seq=12)
    lengths = real.sum(-1)
    ours = flash_varlen_attention(*(x.transpose(1, 2) for x in (q, k, v)), lengths, 0.0, 0.3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3).transpose(1, 2)
    assert torch.allclose(ours[real], expected[real], atol=1e-6)


def test_the_cuda_branch_takes_the_varlen_call_only_where_it_keeps_the_mask(monkeypatch):
    calls = []

    def recording_flash(*args):
        calls.append(args[3].tolist())
        return reference_flash(*args)

    monkeypatch.setattr(attention_backend, "_flash_forward", recording_flash)
    monkeypatch.setattr(attention_backend, "MEASURED_ORDER", {(8, 128, True): ("flash_varlen", "efficient")})
    q, k, v, real, mask = inputs(seq=12)
    module = Attention().eval()
    pretend = [torch.Tensor._make_subclass(PretendCuda, x.bfloat16()) for x in (q, k, v)]
    ours, _ = measured_sdpa_attention(module, *pretend, mask, 0.3)
    assert calls == [[0, 12, 12, 21, 24, 26, 36]]  # rows of 12, 9 and 2 real tokens
    # against fp32 attention of the same bf16 inputs: ours is off by its output's bf16 rounding (half a step, 4e-3 at
    # magnitudes below 2), where a mask that let padding in moves outputs by tenths
    expected = F.scaled_dot_product_attention(*(x.bfloat16().float() for x in (q, k, v)), attn_mask=mask, scale=0.3)
    assert torch.allclose(ours[real].float(), expected.transpose(1, 2)[real], atol=1e-2)
    # fp32 (FlashAttention takes no fp32) and a causal module: the SDPA backends of the order, never the varlen call
    for dtype, causal in ((torch.float32, False), (torch.bfloat16, True)):
        module.is_causal = causal
        pretend = [torch.Tensor._make_subclass(PretendCuda, x.to(dtype)) for x in (q, k, v)]
        measured_sdpa_attention(module, *pretend, mask, 0.3)
    assert len(calls) == 1


def test_a_mask_that_is_not_key_padding_stops_the_varlen_call():
    """A packed row or left padding fails the assertion: no attention across segments is computed."""
    _, _, _, real, mask = inputs(seq=12)
    assert key_padding_lengths(mask).tolist() == [12, 9, 2]
    packed = mask.clone()
    packed[0, 0, :6, 6:] = False
    packed[0, 0, 6:, :6] = False
    with pytest.raises(RuntimeError, match="key-padding"):
        key_padding_lengths(packed)
    with pytest.raises(RuntimeError, match="key-padding"):
        key_padding_lengths(mask.flip(-1))  # padding first


def test_the_lengths_compile_without_graph_breaks():
    torch._dynamo.reset()
    counters.clear()
    backend = CompileCounterWithBackend("aot_eager")
    _, _, _, _, mask = inputs(seq=12)
    assert torch.compile(key_padding_lengths, backend=backend)(mask).tolist() == [12, 9, 2]
    assert dict(counters["graph_break"]) == {} and backend.frame_count == 1
    torch._dynamo.reset()
