"""`fused_qkv`: the query, key and value projections as one matrix product, from the three nn.Linear parameters."""

import pytest
import torch
import torch._dynamo
from support.models import padded_batch, tiny_config
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from bert_repro import BertReproForPreTraining
from bert_repro.model.unpadding import SpeedSelfAttention

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def twins(attn: str = "sdpa", **switches):
    """The plain and `fused_qkv` models on wide weights (std 0.2: every projection matters), training, no dropout."""
    torch.manual_seed(0)
    plain = BertReproForPreTraining._from_config(tiny_config(**NO_DROPOUT), attn_implementation=attn)
    with torch.no_grad():
        for param in plain.parameters():
            param.normal_(0.0, 0.2) if param.dim() > 1 else param.add_(torch.randn_like(param) * 0.1)
    config = tiny_config(fused_qkv=True, **NO_DROPOUT, **switches)
    fused = BertReproForPreTraining._from_config(config, attn_implementation=attn)
    fused.load_state_dict(plain.state_dict())
    return plain.train(), fused.train()


def loss_and_grads(model, batch):
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    out = model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "attn,switches",
    [("sdpa", {}), ("eager", {}), ("sdpa", dict(unpad_inputs=True, last_layer_subset=True, measured_sdpa=True))],
    ids=["sdpa", "eager", "with-unpadding"],
)
def test_same_outputs_and_gradients_as_three_projections(attn, switches):
    plain, fused = twins(attn, **switches)
    assert all(type(layer.attention.self) is SpeedSelfAttention for layer in fused.bert.encoder.layer)
    assert all(layer.attention.self.fused_qkv for layer in fused.bert.encoder.layer)
    batch = padded_batch(99, batch=3, seq=12)
    a, grads_a = loss_and_grads(plain, batch)
    b, grads_b = loss_and_grads(fused, batch)
    assert abs(a.loss.item() - b.loss.item()) < 1e-5
    assert (a.seq_relationship_logits - b.seq_relationship_logits).abs().max() < 1e-5
    assert grads_a.keys() == grads_b.keys()
    for name, grad in grads_a.items():  # absolute slack for the key bias, whose gradient is zero but for rounding
        assert torch.allclose(grad, grads_b[name], rtol=1e-5, atol=1e-6), name


def test_one_product_per_layer(monkeypatch):
    """The projections run as one (hidden -> 3 x hidden) F.linear, not three."""
    _, fused = twins()
    shapes = []
    linear = torch.nn.functional.linear

    def counting(x, weight, bias=None):
        shapes.append(tuple(weight.shape))
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", counting)
    with torch.no_grad():
        fused.bert.encoder.layer[0].attention.self(torch.randn(2, 5, 32))
    assert shapes == [(96, 32)]


def test_compiles_to_one_graph():
    torch._dynamo.reset()
    counters.clear()
    _, fused = twins(measured_sdpa=True)
    backend = CompileCounterWithBackend("eager")
    compiled = torch.compile(fused, backend=backend)
    loss_and_grads(compiled, padded_batch(99, batch=3, seq=12))
    assert dict(counters["graph_break"]) == {}
    assert backend.frame_count == 1
    torch._dynamo.reset()
