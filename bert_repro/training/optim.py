"""Optimizers of the BERT pre-training recipes (SPEC section 3).

- "adamw" (default): torch's AdamW, lr 1e-4, betas (0.9, 0.999), eps 1e-6, decoupled weight decay 0.01 not on
  LayerNorm and bias parameters. The paper says "Adam ... L2 weight decay of 0.01"; Adam with bias correction and
  decoupled decay is the closest standard optimizer and what later reproductions use.
- "bert_adam": Google's reference `AdamWeightDecayOptimizer` exactly: Adam WITHOUT bias correction, decoupled
  weight decay added to the update. Choose it to reproduce the reference code's training dynamics.
- "lamb": the large-batch LAMB of You et al. (2019) as NVIDIA's BERT recipe uses it (global batch 65,536 / 32,768,
  lr 6e-3 / 4e-3): the decayed Adam update scaled per tensor by the trust ratio ||w|| / ||update||; as in NVIDIA's
  code, LayerNorm and bias parameters take the plain Adam step.

Parameter groups (which tensors decay) come from Trainer, which excludes LayerNorm weights and biases.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer


class _AdamFamily(Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or weight_decay < 0:
            raise ValueError(
                f"Invalid optimizer settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}"
            )
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.add_(self._update(p, m, v, state["step"], group), alpha=-group["lr"])
        return loss

    def _update(self, p, m, v, step, group) -> torch.Tensor:
        raise NotImplementedError


class BertAdam(_AdamFamily):
    """The reference code's AdamWeightDecayOptimizer: no bias correction, decoupled weight decay."""

    def _update(self, p, m, v, step, group):
        update = m / (v.sqrt() + group["eps"])
        return update.add_(p, alpha=group["weight_decay"]) if group["weight_decay"] else update


class Lamb(_AdamFamily):
    """LAMB (You et al., 2019), NVIDIA's BERT variant: trust ratio on the decayed tensors."""

    def _update(self, p, m, v, step, group):
        beta1, beta2 = group["betas"]
        update = (m / (1 - beta1**step)) / ((v / (1 - beta2**step)).sqrt() + group["eps"])
        if not group["weight_decay"]:
            return update
        update.add_(p, alpha=group["weight_decay"])
        w_norm, u_norm = p.norm(), update.norm()
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        return update.mul_(trust)


OPTIMIZERS = {"bert_adam": BertAdam, "lamb": Lamb}


def optimizer_cls_and_kwargs(name: str, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float):
    """For `Trainer(optimizer_cls_and_kwargs=...)`; None for "adamw" (Trainer's own AdamW is used)."""
    if name == "adamw":
        return None
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; choose adamw, bert_adam or lamb.")
    return OPTIMIZERS[name], dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
