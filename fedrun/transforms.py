"""Server transforms: what the server does with the weighted mean client update.

Modelled on optax: a transform is a pair ``init(params) -> state`` and
``update(step, state, stats) -> (step, state)``, and :func:`chain` composes them, so Norm-Norm,
server Momentum and FedNNNN are three chains over the same two pieces.  State is a plain dict of
tensors, so a checkpoint is just that data.

The input ``step`` is the weighted mean update ``sum_k p_k dw_k`` (FedAvg's step, eq. 3); the
output is ``w_{t+1} - w_t``.  A transform returns ``None`` as its step to mean "leave ``w_t`` and
every transform's state unchanged this round" (Norm-Norm when N is ~0, sec. 4.2).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch

from fedrun.errors import check
from fedrun.nwda import NormStats, Params


class ServerTransform(NamedTuple):
    init: Callable[[Params], Any]
    update: Callable[[Params, Any, NormStats], tuple[Params | None, Any]]


def identity() -> ServerTransform:
    """FedAvg: ``w_{t+1} = w_t + sum_k p_k dw_k`` (Nagura et al. eq. 3)."""
    return ServerTransform(lambda params: {}, lambda step, state, stats: (step, state))


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

    return ServerTransform(lambda params: {}, update)


def momentum(gamma: float) -> ServerTransform:
    """Server momentum (Nagura et al. eq. 10-11): ``d_{t+1} = gamma d_t + step``; step ``d_{t+1}``.

    ``d_0 = 0``.  Chained after :func:`normalize_norm` this is FedNNNN's eq. 12-13.

    Args:
      gamma: momentum coefficient in [0, 1) (Table 5: 0.6-0.9).
    """
    check(0 <= gamma < 1, "aggregator.gamma", gamma, "must be in [0, 1)")

    def init(params):
        return {"d": {k: torch.zeros_like(v) for k, v in params.items()}}

    def update(step, state, stats):
        d = {k: gamma * state["d"][k] + v for k, v in step.items()}
        return d, {"d": d}

    return ServerTransform(init, update)


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

    return ServerTransform(init, update)
