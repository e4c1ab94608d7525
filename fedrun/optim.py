"""Client optimizers as plain functions of tensors: ``init(params) -> state``, ``step(...)``.

Written out rather than taken from ``torch.optim`` for three reasons: the update is elementwise,
so the very same code updates one client's tensors or all clients' stacked ``[m, *shape]``
tensors (the batched engine); the optimizer state is a plain dict of tensors that a server can
average (the parameter-divergence paper's "-A" optimizers); and building a ``torch.optim``
optimizer costs seconds the first time in a process.  The arithmetic follows ``torch.optim.SGD``
and ``torch.optim.Adam`` (no dampening, no amsgrad) so results match them to float rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedrun.errors import ConfigError, check

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class SGD:
    """``g = grad + wd w``; ``b = mu b + g``; ``w -= lr (g + mu b if nesterov else b)``.

    With ``momentum = 0`` this is the plain step of FedAvg's client (Nagura et al. Alg. 2 line 4).
    """

    lr: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def init(self, params: list[torch.Tensor]) -> dict:
        return {"momentum": [torch.zeros_like(p) for p in params]} if self.momentum else {}

    @torch.no_grad()
    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor], state: dict,
             lr: float | torch.Tensor | None = None) -> None:
        lr = self.lr if lr is None else lr
        for i, (p, g) in enumerate(zip(params, grads)):
            if self.weight_decay:
                g = g.add(p, alpha=self.weight_decay)
            if self.momentum:
                buf = state["momentum"][i]
                buf.mul_(self.momentum).add_(g)
                g = g.add(buf, alpha=self.momentum) if self.nesterov else buf
            _descend(p, g, lr)


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma & Ba) with bias correction, as ``torch.optim.Adam``; ``wd`` is coupled L2."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def init(self, params: list[torch.Tensor]) -> dict:
        return {"step": torch.zeros((), dtype=torch.float64),
                "exp_avg": [torch.zeros_like(p) for p in params],
                "exp_avg_sq": [torch.zeros_like(p) for p in params]}

    @torch.no_grad()
    def step(self, params, grads, state, lr=None) -> None:
        lr = self.lr if lr is None else lr
        state["step"] += 1
        t = float(state["step"])
        correction1, correction2 = 1 - self.beta1 ** t, 1 - self.beta2 ** t
        for p, g, m, v in zip(params, grads, state["exp_avg"], state["exp_avg_sq"]):
            if self.weight_decay:
                g = g.add(p, alpha=self.weight_decay)
            m.lerp_(g, 1 - self.beta1)
            v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            denom = (v.sqrt() / correction2 ** 0.5).add_(self.eps)
            _descend(p, m / denom, lr / correction1)


def _descend(p: torch.Tensor, direction: torch.Tensor, lr) -> None:
    """``p -= lr * direction``; ``lr`` may be a tensor broadcasting over stacked clients."""
    if isinstance(lr, torch.Tensor):
        p.sub_(lr * direction)
    else:
        p.add_(direction, alpha=-lr)


def make_optimizer(name: str, lr: float, momentum: float = 0.0, nesterov: bool = False,
                   weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8):
    """The client optimizer named by ``hyperparams.optimizer``."""
    if name == "sgd":
        return SGD(lr, momentum, nesterov, weight_decay)
    if name == "adam":
        check(0 <= betas[0] < 1 and 0 <= betas[1] < 1, "hyperparams.betas", list(betas), "each in [0, 1)")
        return Adam(lr, betas[0], betas[1], eps, weight_decay)
    raise ConfigError("hyperparams.optimizer", name, f"choose one of: {', '.join(OPTIMIZERS)}")
