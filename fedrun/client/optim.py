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
WEIGHT_DECAY_MODES = ("coupled", "decoupled")


def _decay(p: torch.Tensor, optimizer, lr) -> None:
    """Decoupled weight decay (Loshchilov & Hutter 2019, Alg. 1-2 line 12): ``w <- w - s_t wd w``.

    ``s_t`` is the learning-rate schedule's multiplier ``lr / lr_0`` (1, then 0.1, 0.01 after the
    drops), not the learning rate itself: the decay is independent of ``lr`` as in SGDW/AdamW and
    TensorFlow's ``DecoupledWeightDecayExtension`` that the parameter-divergence paper used
    (sec. 2.2; "weight decay is equivalent to L2 regularization only for pure SGD").  Applied to
    the weights before the step's update, which was computed from the gradient at the old weights.
    """
    p.mul_(1 - (lr / optimizer.lr) * optimizer.weight_decay)  # lr may be a per-client tensor


@dataclass(frozen=True)
class SGD:
    """``g = grad + wd w``; ``b = mu b + g``; ``w -= lr (g + mu b if nesterov else b)``.

    With ``momentum = 0`` this is the plain step of FedAvg's client (Nagura et al. Alg. 2 line 4).
    ``decoupled=True`` drops ``wd w`` from ``g`` and decays the weights directly (:func:`_decay`).
    """

    lr: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    decoupled: bool = False

    def init(self, params: list[torch.Tensor]) -> dict:
        return {"momentum": [torch.zeros_like(p) for p in params]} if self.momentum else {}

    @torch.no_grad()
    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor], state: dict,
             lr: float | torch.Tensor | None = None) -> None:
        lr = self.lr if lr is None else lr
        if not (isinstance(lr, torch.Tensor) or self.nesterov or self.decoupled):
            self._foreach_step(params, grads, state, lr)
            return
        for i, (p, g) in enumerate(zip(params, grads)):
            if self.weight_decay and not self.decoupled:
                g = g.add(p, alpha=self.weight_decay)
            if self.momentum:
                buf = state["momentum"][i]
                buf.mul_(self.momentum).add_(g)
                g = g.add(buf, alpha=self.momentum) if self.nesterov else buf
            if self.weight_decay and self.decoupled:
                _decay(p, self, lr)
            _descend(p, g, lr)

    def _foreach_step(self, params, grads, state, lr: float) -> None:
        """The same step on all tensors at once: on a GPU each line is a few fused kernels for every
        tensor instead of one kernel per tensor (a small model's lock-step is bound by its kernel
        count, docs/performance.md); on a CPU it is the per-tensor loop above, operation for operation."""
        g = torch._foreach_add(grads, params, alpha=self.weight_decay) if self.weight_decay else grads
        if self.momentum:
            buf = state["momentum"]
            torch._foreach_mul_(buf, self.momentum)
            torch._foreach_add_(buf, g)
            g = buf
        torch._foreach_add_(params, g, alpha=-lr)


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma & Ba) with bias correction, as ``torch.optim.Adam``; ``wd`` is coupled L2,
    or decoupled (AdamW's decay, :func:`_decay`) with ``decoupled=True``.

    The step counter is a 0-d tensor for one client, or ``[m]`` (one per stacked client) when
    clients carry their own optimizer state across rounds and may have taken different numbers
    of steps; the bias corrections then broadcast per client.
    """

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def init(self, params: list[torch.Tensor]) -> dict:
        # On the parameters' device, as every other state tensor (a GPU run's checkpoint and the
        # batched engine's per-client counters mix with no CPU tensor).
        return {"step": torch.zeros((), dtype=torch.float64, device=params[0].device if params else None),
                "exp_avg": [torch.zeros_like(p) for p in params],
                "exp_avg_sq": [torch.zeros_like(p) for p in params]}

    @torch.no_grad()
    def step(self, params, grads, state, lr=None) -> None:
        lr = self.lr if lr is None else lr
        state["step"] += 1
        step = state["step"]
        t = float(step) if step.ndim == 0 else None  # read once a step: on a GPU each read waits for it
        for p, g, m, v in zip(params, grads, state["exp_avg"], state["exp_avg_sq"]):
            if t is not None:  # one client: Python floats, exactly torch.optim.Adam's arithmetic
                correction1, correction2 = 1 - self.beta1 ** t, (1 - self.beta2 ** t) ** 0.5
            else:  # [m] stacked clients with their own counters
                shape = (-1,) + (1,) * (p.ndim - 1)
                correction1 = (1 - self.beta1 ** step).to(p.dtype).view(shape)
                correction2 = (1 - self.beta2 ** step).sqrt().to(p.dtype).view(shape)
            if self.weight_decay and not self.decoupled:
                g = g.add(p, alpha=self.weight_decay)
            m.lerp_(g, 1 - self.beta1)
            v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            denom = (v.sqrt() / correction2).add_(self.eps)
            if self.weight_decay and self.decoupled:
                _decay(p, self, lr)
            _descend(p, m / denom, lr / correction1)


def _descend(p: torch.Tensor, direction: torch.Tensor, lr) -> None:
    """``p -= lr * direction``; ``lr`` may be a tensor broadcasting over stacked clients."""
    if isinstance(lr, torch.Tensor):
        p.sub_(lr * direction)
    else:
        p.add_(direction, alpha=-lr)


def make_optimizer(name: str, lr: float, momentum: float = 0.0, nesterov: bool = False,
                   weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8, weight_decay_mode: str = "coupled"):
    """The client optimizer named by ``hyperparams.optimizer``."""
    if weight_decay_mode not in WEIGHT_DECAY_MODES:
        raise ConfigError("hyperparams.weight_decay_mode", weight_decay_mode,
                          f"choose one of: {', '.join(WEIGHT_DECAY_MODES)}")
    decoupled = weight_decay_mode == "decoupled"
    if name == "sgd":
        return SGD(lr, momentum, nesterov, weight_decay, decoupled)
    if name == "adam":
        check(0 <= betas[0] < 1 and 0 <= betas[1] < 1, "hyperparams.betas", list(betas), "each in [0, 1)")
        return Adam(lr, betas[0], betas[1], eps, weight_decay, decoupled)
    raise ConfigError("hyperparams.optimizer", name, f"choose one of: {', '.join(OPTIMIZERS)}")


# ----------------------------------------------------------------------------- state as named tensors

def state_dict(state: dict, names: list[str]) -> dict[str, torch.Tensor]:
    """An optimizer state as flat named tensors: ``momentum.<param>``, ``exp_avg.<param>``,
    ``exp_avg_sq.<param>``, ``step``; what a server averages and a checkpoint stores."""
    out = {}
    for key, value in state.items():
        if isinstance(value, list):
            out.update({f"{key}.{name}": t for name, t in zip(names, value)})
        else:
            out[key] = value
    return out


def load_state(flat: dict[str, torch.Tensor], template: dict, names: list[str]) -> dict:
    """The inverse of :func:`state_dict`, shaped like ``template`` (an ``init`` result)."""
    return {key: ([flat[f"{key}.{name}"] for name in names] if isinstance(value, list) else flat[key])
            for key, value in template.items()}


def lr_factor(round_: int, rounds: int, milestones: tuple[float, ...] = (), gamma: float = 0.1) -> float:
    """Step decay: the learning rate times ``gamma`` per milestone passed.

    ``milestones`` are fractions of the training: the parameter-divergence paper drops the rate
    "by 0.1 at 50% and 75% of the total training iterations" (Appendix A.2), i.e. milestones
    ``(0.5, 0.75)``.  A round has the same number of local iterations throughout, so the drop at
    a fraction f happens after round ``f * rounds``: with 300 rounds, rounds 1-150 use ``lr``,
    151-225 ``0.1 lr`` and 226-300 ``0.01 lr`` (round ``t`` runs iterations ``(t-1)R .. tR``).
    """
    passed = sum(1 for f in milestones if round_ > f * rounds + 1e-9)
    return gamma ** passed
