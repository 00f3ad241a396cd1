"""The optimizers against the update rules written out by hand."""

import pytest
import torch

from bert_repro.training.optim import BertAdam, Lamb, optimizer_cls_and_kwargs


def two_steps(opt_cls, weight_decay, **kwargs):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    w0 = w.detach().clone()
    grads = [torch.randn(4, 3), torch.randn(4, 3)]
    opt = opt_cls([{"params": [w], "weight_decay": weight_decay}], lr=0.1, betas=(0.9, 0.999), eps=1e-6, **kwargs)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    return w0, grads, w.detach()


def test_bert_adam_has_no_bias_correction():
    w0, (g1, g2), w = two_steps(BertAdam, 0.01)
    expected = w0.clone()
    m = torch.zeros_like(w0)
    v = torch.zeros_like(w0)
    for g in (g1, g2):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        expected = expected - 0.1 * (m / (v.sqrt() + 1e-6) + 0.01 * expected)
    assert torch.allclose(w, expected, atol=1e-6)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_lamb_trust_ratio(weight_decay):
    w0, (g1, g2), w = two_steps(Lamb, weight_decay)
    expected = w0.clone()
    m = torch.zeros_like(w0)
    v = torch.zeros_like(w0)
    for step, g in enumerate((g1, g2), start=1):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        update = (m / (1 - 0.9**step)) / ((v / (1 - 0.999**step)).sqrt() + 1e-6)
        if weight_decay:
            update = update + weight_decay * expected
            update = update * (expected.norm() / update.norm())  # trust ratio on decayed tensors only
        expected = expected - 0.1 * update
    assert torch.allclose(w, expected, atol=1e-6)


def test_optimizer_choice():
    assert optimizer_cls_and_kwargs("adamw", lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01) is None
    cls, kwargs = optimizer_cls_and_kwargs("lamb", lr=6e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    assert cls is Lamb and kwargs["lr"] == 6e-3
    with pytest.raises(ValueError, match="Unknown optimizer 'sgdx'"):
        optimizer_cls_and_kwargs("sgdx", lr=1, betas=(0.9, 0.9), eps=1e-6, weight_decay=0)
