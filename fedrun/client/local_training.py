"""How clients train: the client optimizer's settings, what a round's training returns, and the
client optimizer state the server keeps between rounds.

Local training is the client side of FedAvg (Nagura et al., Alg. 2): split the client's data into
batches of B, run E epochs of ``w <- w - eta grad l(w; batch)`` (SGD, optionally with momentum,
Nesterov and weight decay, or Adam: :mod:`fedrun.client.optim`), plus the method's regularizer
(:mod:`fedrun.client.regularizers`).  The engines (:mod:`fedrun.client.sequential`, :mod:`fedrun.client.batched`) run
it; everything downstream reads their :class:`ClientResults`, stacked ``[m, *shape]`` tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedrun.errors import ConfigError, check
from fedrun.client.optim import lr_factor, make_optimizer, state_dict
from fedrun.params import Params


@dataclass(frozen=True)
class LocalTraining:
    """How clients train: Nagura et al. Table 1 (E, B, eta, lambda), Adam for FedLayerWise, and
    the parameter-divergence paper's optimizer-state averaging, decoupled weight decay, step
    learning-rate decay and data augmentation (its sec. 2.2, 4.2, Appendix A.2, C.6)."""

    epochs: int = 1
    batch_size: int = 50
    lr: float = 0.05
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    optimizer: str = "sgd"  # sgd | adam
    betas: tuple[float, float] = (0.9, 0.999)  # Adam
    adam_eps: float = 1e-8  # Adam's epsilon: PyTorch's 1e-8; Keras/TensorFlow's default is 1e-7
    weight_decay_mode: str = "coupled"  # coupled (L2 in the gradient) | decoupled (SGDW/AdamW)
    optimizer_state: str = "reset"  # reset every round | average (-A) | local (-WB)
    lr_milestones: tuple[float, ...] = ()  # fractions of the rounds after which lr *= lr_gamma
    lr_gamma: float = 0.1
    augment: object = None  # fedrun.data.augment.Augmentation applied to every training batch, or None

    def __post_init__(self):
        for name in ("betas", "lr_milestones"):  # lists from the config
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check(self.epochs >= 1, "hyperparams.local_epochs", self.epochs, "must be >= 1")
        check(self.batch_size >= 1, "hyperparams.batch_size", self.batch_size, "must be >= 1")
        check(self.lr > 0, "hyperparams.lr", self.lr, "must be > 0")
        check(0 <= self.momentum < 1, "hyperparams.momentum", self.momentum, "must be in [0, 1)")
        check(not self.nesterov or self.momentum > 0, "hyperparams.nesterov", self.nesterov,
              "needs hyperparams.momentum > 0")
        check(self.weight_decay >= 0, "hyperparams.weight_decay", self.weight_decay, "must be >= 0")
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise ConfigError("hyperparams.optimizer_state", self.optimizer_state,
                              f"choose one of: {', '.join(OPTIMIZER_STATES)}")
        check(all(0 < f < 1 for f in self.lr_milestones), "hyperparams.lr_milestones",
              list(self.lr_milestones), "fractions of the rounds, each in (0, 1)")
        check(list(self.lr_milestones) == sorted(set(self.lr_milestones)), "hyperparams.lr_milestones",
              list(self.lr_milestones), "must be increasing (each the fraction of the rounds after which the "
              "learning rate drops once more)")
        # Adam's and Yogi's moment decays: a value of 1 never forgets (and divides by zero in the bias
        # correction); checked whatever the optimizer, so a preset's betas are right when it changes.
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "hyperparams.betas", list(self.betas),
              "must be two numbers, each in [0, 1)")
        check(0 < self.lr_gamma <= 1, "hyperparams.lr_gamma", self.lr_gamma, "must be in (0, 1]")
        check(self.adam_eps > 0, "hyperparams.adam_eps", self.adam_eps, "must be > 0")
        self.make_optimizer()  # validates the optimizer's name and settings

    def make_optimizer(self):
        return make_optimizer(self.optimizer, self.lr, self.momentum, self.nesterov, self.weight_decay,
                              tuple(self.betas), self.adam_eps, weight_decay_mode=self.weight_decay_mode)

    def lr_at(self, round_: int, rounds: int) -> float:
        """Round ``round_``'s learning rate under the step decay (:func:`fedrun.client.optim.lr_factor`)."""
        return self.lr * lr_factor(round_, rounds, tuple(self.lr_milestones), self.lr_gamma)

    @property
    def carries_state(self) -> bool:
        """Whether the optimizer state outlives a round (it has one, and it is not reset)."""
        return self.optimizer_state != "reset" and bool(self.fresh_state({"w": torch.zeros(1)}))

    def effective_steps(self, steps: torch.Tensor) -> torch.Tensor:
        """``||a_k||_1``: how many gradients a client's update is worth after ``steps`` local steps
        from a zero momentum buffer, ``[m]`` float64 (FedNova, Wang et al. 2020, sec. 4 and
        Appendix: ``a_k`` holds the coefficients with which the K_k steps' gradients enter the
        update, ``y - x = -lr sum_k a_{k,j} g_j``).

        Plain SGD: ``K`` (every gradient enters once).  SGD with momentum rho (``b = rho b + g``,
        ``w -= lr b``): gradient j enters ``(1 - rho^(K - j + 1)) / (1 - rho)`` times, so
        ``||a||_1 = sum_{k=1..K} (1 - rho^k) / (1 - rho) = (K - rho (1 - rho^K) / (1 - rho)) / (1 - rho)``
        (NIID-Bench's ``a_i``).  Nesterov (``w -= lr (g + rho b)``): step k moves by
        ``(1 - rho^(k+1)) / (1 - rho)`` of a constant gradient, so
        ``||a||_1 = (K - rho^2 (1 - rho^K) / (1 - rho)) / (1 - rho)``.  Weight decay is part of
        the gradient.  Adam has no such coefficients: its steps are returned as they are (the
        methods that need ``a_k`` refuse Adam, :attr:`fedrun.server.aggregator.Aggregator.client_optimizers`).
        A momentum buffer carried over from an earlier round (``optimizer_state`` average or
        local) makes the early steps count more than this; ``||a||_1`` ignores it.
        """
        k = steps.to(torch.float64)
        rho = self.momentum if self.optimizer == "sgd" else 0.0
        if rho == 0:
            return k
        first = rho * rho if self.nesterov else rho
        return (k - first * (1 - rho ** k) / (1 - rho)) / (1 - rho)

    def fresh_state(self, params: Params) -> Params:
        """A zero optimizer state as named tensors (``momentum.<p>``, ``exp_avg.<p>``, ``step``...):
        what a client starts from when it has no state; zeros are exactly ``init``'s state."""
        names = list(params)
        return state_dict(self.make_optimizer().init([params[k] for k in names]), names)


OPTIMIZER_STATES = ("reset", "average", "local")


@dataclass
class ClientResults:
    """One round's client outputs, stacked along a leading client dimension of size m."""

    clients: list[int]
    deltas: Params  # w_k - w_t per parameter, [m, *shape]
    buffers: Params  # final buffers per client, [m, *shape]
    num_examples: torch.Tensor  # [m] n_k
    loss: torch.Tensor  # [m] mean local training loss over all local steps (without regularizer)
    steps: torch.Tensor  # [m] optimizer steps taken
    epochs: torch.Tensor  # [m] local epochs run (fewer than E for stragglers)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # [m] regularizer diagnostics
    opt_states: Params | None = None  # final optimizer states [m, ...] when they outlive the round
    lr: torch.Tensor | None = None  # [m] float64: each client's learning rate this round (SCAFFOLD's eta_l)
    effective_steps: torch.Tensor | None = None  # [m] float64: ||a_k||_1 (LocalTraining.effective_steps)


class OptimizerStates:
    """Client optimizer state across rounds (``hyperparams.optimizer_state``).

    ``reset``: none (every client starts from zero each round).  ``average`` (the
    parameter-divergence paper's "-A"): the server averages the clients' final states with the
    aggregation's base weights, as it averages weights and biases, and sends the mean to the next
    round's clients.  ``local`` ("-WB"): only weights and biases are averaged; each client keeps
    its own state for the next time it is sampled (zero before its first round).
    """

    def __init__(self, local: LocalTraining, params: Params):
        self.mode = local.optimizer_state if local.carries_state else "reset"
        self.fresh = local.fresh_state(params)
        self.state = None if self.mode == "reset" else {} if self.mode == "local" else self.fresh

    def starting(self, clients: list[int]) -> Params | None:
        """The round's starting states, stacked ``[m, ...]`` in client order (None: reset)."""
        if self.mode == "reset":
            return None
        if self.mode == "average":
            return {k: v.unsqueeze(0).expand(len(clients), *v.shape).clone() for k, v in self.state.items()}
        own = [self.state.get(k, self.fresh) for k in clients]
        return {name: torch.stack([s[name] for s in own]) for name in self.fresh}

    def finish(self, clients: list[int], final: Params | None, weights: torch.Tensor) -> None:
        if self.mode == "average":
            self.state = {k: torch.tensordot(weights.to(v.device, v.dtype), v, dims=1) for k, v in final.items()}
        elif self.mode == "local":
            for j, k in enumerate(clients):
                self.state[k] = {name: v[j].clone() for name, v in final.items()}
