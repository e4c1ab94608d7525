"""Server transforms: what the server does with the mean client update.

Modelled on optax: a transform is a pair ``init(params) -> state`` and
``update(step, state, stats) -> (step, state)``, and :func:`chain` composes them, so Norm-Norm,
server Momentum and FedNNNN are three chains over the same two pieces, and FedOpt's methods
(Reddi et al., ICLR 2021) are :func:`adagrad`, :func:`adam`, :func:`yogi` or :func:`momentum`
followed by :func:`scale`.  State is a plain dict of tensors, so a checkpoint is just that data.

The input ``step`` is the mean update, the aggregator's reduce (``sum_k p_k dw_k``, FedAvg's step,
eq. 3, unless a robust reduce replaces it); the output is ``w_{t+1} - w_t``.  A transform returns
``None`` as its step to mean "leave ``w_t`` and every transform's state unchanged this round"
(Norm-Norm when N is ~0, sec. 4.2).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch

from fedrun.errors import check
from fedrun.diagnostics.nwda import NormStats
from fedrun.params import Params


class ServerTransform(NamedTuple):
    init: Callable[[Params], Any]
    update: Callable[[Params, Any, NormStats], tuple[Params | None, Any]]
    # Whether ``update`` reads ``stats`` (N and E of the raw updates) rather than the mean update
    # alone: such a server is not post-processing of a privatized mean (fedrun.server.privacy).
    reads_stats: bool = False


def identity() -> ServerTransform:
    """FedAvg: ``w_{t+1} = w_t + sum_k p_k dw_k`` (Nagura et al. eq. 3).  One object
    (:data:`IDENTITY`), so an aggregator can tell that its sent model is its average one."""
    return IDENTITY


IDENTITY = ServerTransform(lambda params: {}, lambda step, state, stats: (step, state))


def normalize_norm(beta: float, eps: float = 1e-6) -> ServerTransform:
    """Norm normalization (Nagura et al. eq. 8): ``step <- beta * (E / N) * step``.

    The server step then has norm ``beta * E`` (eq. 9).  When ``N <= eps * E`` (the clients'
    updates cancel, or nobody moved) the direction is numerical noise: the transform returns
    ``None`` and the server keeps ``w_t`` as is (sec. 4.2 reading note).

    Args:
      beta: scale of the normalized step, > 0 (Table 5: 0.6-1.1).
      eps: relative threshold on N / E below which the round is skipped.
    """
    check(beta > 0, "aggregator.beta", beta, "must be > 0")
    check(eps >= 0, "aggregator.eps", eps, "must be >= 0")

    def update(step, state, stats):
        # A non-finite N or E is divergence, not a degenerate direction: let it propagate to
        # the simulation's NaN/Inf check instead of silently skipping the round.
        if math.isfinite(stats.N) and math.isfinite(stats.E) and (stats.N == 0 or stats.N <= eps * stats.E):
            return None, state
        scale = beta * stats.E / stats.N
        return {k: v * scale for k, v in step.items()}, state

    return ServerTransform(lambda params: {}, update, reads_stats=True)


def momentum(gamma: float, setting: str = "aggregator.gamma") -> ServerTransform:
    """Server momentum (Nagura et al. eq. 10-11): ``d_{t+1} = gamma d_t + step``; step ``d_{t+1}``.

    ``d_0 = 0``.  Chained after :func:`normalize_norm` this is FedNNNN's eq. 12-13; followed by
    :func:`scale` it is FedAvgM (Hsu et al. 2019; Reddi et al. sec. 5).

    Args:
      gamma: momentum coefficient in [0, 1) (Table 5: 0.6-0.9).
      setting: the config key that sets it, for the error message.
    """
    check(0 <= gamma < 1, setting, gamma, "must be in [0, 1)")

    def init(params):
        return {"d": {k: torch.zeros_like(v) for k, v in params.items()}}

    def update(step, state, stats):
        d = {k: gamma * state["d"][k] + v for k, v in step.items()}
        return d, {"d": d}

    return ServerTransform(init, update)


def scale(rate: float, setting: str = "aggregator.server_lr") -> ServerTransform:
    """``step <- rate * step``: the server learning rate ``eta`` of FedOpt (Reddi et al. Alg. 2).

    Args:
      rate: > 0.
      setting: the config key that sets it, for the error message.
    """
    check(rate > 0, setting, rate, "must be > 0")
    return ServerTransform(lambda params: {},
                           lambda step, state, stats: ({k: v * rate for k, v in step.items()}, state))


def _adaptive(beta1: float, tau: float, second_moment: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
              ) -> ServerTransform:
    """Reddi et al. (ICLR 2021) Algorithm 2 around a second-moment rule ``v_t = second_moment(v_{t-1},
    Delta_t^2)``, with the mean update ``Delta_t`` as the (negative) pseudo-gradient::

        m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
        step = m_t / (sqrt(v_t) + tau)

    and ``x_{t+1} = x_t + eta step`` once :func:`scale` follows.  ``m_{-1} = 0`` and
    ``v_{-1} = tau^2``, the least the algorithm allows (``v_{-1} >= tau^2``); no bias correction,
    as in Algorithm 2.  ``tau`` sets the degree of adaptivity (smaller: more adaptive).
    """
    check(0 <= beta1 < 1, "aggregator.beta1", beta1, "must be in [0, 1)")
    check(tau > 0, "aggregator.tau", tau, "must be > 0")

    def init(params):
        return {"m": {k: torch.zeros_like(v) for k, v in params.items()},
                "v": {k: torch.full_like(v, tau ** 2) for k, v in params.items()}}

    def update(step, state, stats):
        m, v, out = {}, {}, {}
        for k, delta in step.items():
            m[k] = beta1 * state["m"][k] + (1 - beta1) * delta
            v[k] = second_moment(state["v"][k], delta * delta)
            out[k] = m[k] / (v[k].sqrt() + tau)
        return out, {"m": m, "v": v}

    return ServerTransform(init, update)


def adagrad(beta1: float = 0.9, tau: float = 1e-3) -> ServerTransform:
    """FedAdagrad's direction (Reddi et al., ICLR 2021, Algorithm 2, the FedAdagrad line)::

        v_t = v_{t-1} + Delta_t^2

    around the first moment and step of :func:`_adaptive`: ``m_t / (sqrt(v_t) + tau)``.

    Args:
      beta1: first-moment decay in [0, 1) (the paper: 0.9).
      tau: adaptivity, > 0 (the paper: 1e-3).
    """
    return _adaptive(beta1, tau, lambda v, sq: v + sq)


def adam(beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> ServerTransform:
    """FedAdam's direction (Reddi et al., ICLR 2021, Algorithm 2, the FedAdam line)::

        v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2

    around the first moment and step of :func:`_adaptive`: ``m_t / (sqrt(v_t) + tau)``.

    Args:
      beta1: first-moment decay in [0, 1) (the paper: 0.9).
      beta2: second-moment decay in [0, 1) (the paper: 0.99).
      tau: adaptivity, > 0 (the paper: 1e-3).
    """
    check(0 <= beta2 < 1, "aggregator.beta2", beta2, "must be in [0, 1)")
    return _adaptive(beta1, tau, lambda v, sq: beta2 * v + (1 - beta2) * sq)


def yogi(beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> ServerTransform:
    """FedYogi's direction (Reddi et al., ICLR 2021, Algorithm 2, the FedYogi line)::

        v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)

    around the first moment and step of :func:`_adaptive`: ``m_t / (sqrt(v_t) + tau)``.  Unlike
    Adam's, ``v`` moves towards ``Delta_t^2`` by an additive ``(1 - beta2) Delta_t^2`` at most.

    Args:
      beta1: first-moment decay in [0, 1) (the paper: 0.9).
      beta2: second-moment decay in [0, 1) (the paper: 0.99).
      tau: adaptivity, > 0 (the paper: 1e-3).
    """
    check(0 <= beta2 < 1, "aggregator.beta2", beta2, "must be in [0, 1)")
    return _adaptive(beta1, tau, lambda v, sq: v - (1 - beta2) * sq * torch.sign(v - sq))


def chain(*transforms: ServerTransform) -> ServerTransform:
    """Apply transforms in order; a ``None`` step from any of them skips the round."""

    def init(params):
        return [t.init(params) for t in transforms]

    def update(step, states, stats):
        new_states = []
        for t, s in zip(transforms, states):
            step, s = t.update(step, s, stats)
            if step is None:
                return None, states
            new_states.append(s)
        return step, new_states

    return ServerTransform(init, update, reads_stats=any(t.reads_stats for t in transforms))
