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
    assert cls is Lamb and kwargs == dict(lr=6e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    with pytest.raises(ValueError, match="Unknown optimizer 'sgdx'"):
        optimizer_cls_and_kwargs("sgdx", lr=1, betas=(0.9, 0.9), eps=1e-6, weight_decay=0)


def test_defaults_are_the_papers():
    w = torch.nn.Parameter(torch.zeros(2))
    for cls in (BertAdam, Lamb):
        assert cls([w]).defaults == dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)


@pytest.mark.parametrize(
    "settings",
    [dict(lr=-1e-4), dict(eps=-1e-6), dict(weight_decay=-0.01), dict(betas=(1.0, 0.999)), dict(betas=(0.9, 1.0))],
    ids=["lr", "eps", "weight_decay", "beta1", "beta2"],
)
def test_each_setting_out_of_range_is_refused_alone(settings):
    kwargs = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01) | settings
    for cls in (BertAdam, Lamb):
        with pytest.raises(ValueError, match="Invalid optimizer settings: lr="):
            cls([torch.nn.Parameter(torch.zeros(2))], **kwargs)


def test_the_edges_of_the_ranges_are_accepted():
    for cls in (BertAdam, Lamb):
        cls([torch.nn.Parameter(torch.zeros(2))], lr=0.0, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0)


@pytest.mark.parametrize("opt_cls", [BertAdam, Lamb])
def test_eps_matters_where_the_gradients_are_small(opt_cls):
    # At eps = 1e-6 against gradients of ~1 its sign changes the update by ~1e-7: below the tolerance above. Here
    # eps is as large as the gradients, so it halves the step.
    w = torch.nn.Parameter(torch.ones(3))
    opt = opt_cls([{"params": [w], "weight_decay": 0.0}], lr=0.1, betas=(0.9, 0.999), eps=1e-3)
    w.grad = torch.full((3,), 1e-3)
    opt.step()
    # Step 1: m = 0.1 g, v = 0.001 g^2; with bias correction (LAMB) m_hat = g, sqrt(v_hat) = g.
    step = 1e-3 / (1e-3 + 1e-3) if opt_cls is Lamb else 1e-4 / (1e-3 * 0.001**0.5 + 1e-3)
    torch.testing.assert_close(w.detach(), torch.full((3,), 1 - 0.1 * step), rtol=0, atol=1e-7)


def test_lamb_trust_ratio_binds_below_norm_one():
    # One small weight, one small update: both norms below 1, where the ratio still applies.
    w = torch.nn.Parameter(torch.tensor([0.5]))
    opt = Lamb([{"params": [w], "weight_decay": 0.01}], lr=0.1, betas=(0.9, 0.999), eps=1.0)
    w.grad = torch.tensor([0.1])
    opt.step()
    update = 0.1 / (0.1 + 1.0) + 0.01 * 0.5  # 0.0959: its norm is below 1
    torch.testing.assert_close(w.detach(), torch.tensor([0.5 - 0.1 * update * (0.5 / update)]), rtol=0, atol=1e-7)


def test_lamb_zero_initialised_weight_takes_the_plain_adam_step():
    # ||w|| = 0 (a zero-initialised bias in a decayed group): the trust ratio 0 / ||u|| would freeze it for ever.
    w = torch.nn.Parameter(torch.zeros(3))
    opt = Lamb([{"params": [w], "weight_decay": 0.01}], lr=0.1, betas=(0.9, 0.999), eps=1e-6)
    w.grad = torch.tensor([1.0, -2.0, 0.5])
    opt.step()
    torch.testing.assert_close(w.detach(), -0.1 * torch.tensor([1.0, -1.0, 1.0]), rtol=0, atol=1e-6)


def test_lamb_zero_update_stays_finite():
    # ||u|| = 0 with ||w|| > 0 (no gradient signal, a decay too small for float32): the ratio ||w|| / 0 must not
    # turn the zero step into NaN.
    w = torch.nn.Parameter(torch.ones(3))
    opt = Lamb([{"params": [w], "weight_decay": 1e-50}], lr=0.1, betas=(0.9, 0.999), eps=1e-6)
    w.grad = torch.zeros(3)
    opt.step()
    assert torch.equal(w.detach(), torch.ones(3))
