"""Client-weighting rules: the coefficients of the weighted mean update.

Every aggregator has one rule.  The base rules are ``examples`` (``p_k = n_k / n``, FedAvg) and
``uniform`` (``p_k = 1 / m``, what FedNNNN uses in its unbalanced runs, sec. 5.1).  Their weights,
``base``, are also the weights of the NWDA diagnostics N and E (eq. 4-5) and of the BatchNorm
statistics, whatever rule aggregates, so those compare across methods.  An *angle rule* keeps a
base rule for these and replaces its weights in the aggregation:

* FedAdp (Wu & Wang; FedLayerWise's reference [3]): one weight per client from the angle between
  its update and the weighted mean update, smoothed over the rounds it took part in;
* FedLayerWise (Lanjewar et al. eq. 1-7): the same per layer, so every layer has its own client
  weights.

A rule is ``base(num_examples) -> [m]`` weights summing to one, ``init(num_clients, num_layers)
-> state`` and ``update(stats, base_weights, clients, state) -> (weights, state, diagnostics)``;
``weights`` is ``[m]`` or ``[L, m]`` (``per_layer``).  The state is a dict of tensors (the angle
rules' smoothed angles, kept per client across rounds; empty for the base rules).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from fedrun.errors import ConfigError, check
from fedrun.nwda import NormStats

GOMPERTZ_FORMS = ("decreasing", "literal")
BASES = ("examples", "uniform")


class WeightingRule(NamedTuple):
    base: Callable[[torch.Tensor], torch.Tensor]
    init: Callable[[int, int], Any]
    update: Callable[[NormStats, torch.Tensor, list[int], Any], tuple[torch.Tensor, Any, dict]]
    per_layer: bool = False


def _examples(num_examples: torch.Tensor) -> torch.Tensor:
    n = num_examples.to(torch.float64)
    return n / n.sum()


def _uniform(num_examples: torch.Tensor) -> torch.Tensor:
    return torch.full((len(num_examples),), 1.0 / len(num_examples), dtype=torch.float64)


def _no_state(num_clients: int, num_layers: int) -> dict:
    return {}


def _base_weights(stats, base, clients, state):
    return base, state, {}


def base_rule(weighting: str = "examples") -> WeightingRule:
    """``examples``: ``p_k = n_k / n`` (FedAvg, Nagura et al. eq. 1); ``uniform``: ``p_k = 1 / m``."""
    if weighting not in BASES:
        raise ConfigError("aggregator.weighting", weighting, f"choose one of: {', '.join(BASES)}")
    return WeightingRule(_examples if weighting == "examples" else _uniform, _no_state, _base_weights)


def gompertz(theta: torch.Tensor, alpha: float, form: str = "decreasing") -> torch.Tensor:
    """The Gompertz mapping of a smoothed angle (FedLayerWise eq. 5, FedAdp).

    ``decreasing`` (default, FedAdp's original): ``f = alpha (1 - exp(-exp(-alpha (theta - 1))))``,
    large for small angles, as the text intends ("amplify the impact of angles closer to 0").
    ``literal``: eq. 5 as printed, ``alpha (1 - exp(-exp(alpha (theta - 1))))``, which grows with
    the angle.
    """
    if form == "decreasing":
        return alpha * (1 - torch.exp(-torch.exp(-alpha * (theta - 1))))
    if form == "literal":
        return alpha * (1 - torch.exp(-torch.exp(alpha * (theta - 1))))
    raise ConfigError("aggregator.gompertz", form, f"choose one of: {', '.join(GOMPERTZ_FORMS)}")


def _smooth(smoothed: torch.Tensor, count: torch.Tensor, clients: list[int], theta: torch.Tensor):
    """Eq. 4: ``s(t) = (t-1)/t s(t-1) + theta(t)/t``, t = rounds client k has taken part in."""
    idx = torch.as_tensor(clients, dtype=torch.long)
    smoothed, count = smoothed.clone(), count.clone()
    count[idx] += 1
    t = count[idx].to(torch.float64).view(-1, *([1] * (theta.ndim - 1)))
    smoothed[idx] = (t - 1) / t * smoothed[idx] + theta / t
    return smoothed, count


def _softmax_weights(base: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Eq. 6: ``psi_k = n_k e^{f_k} / sum_j n_j e^{f_j}`` along the client dimension (last)."""
    logits = torch.log(base) + f
    return torch.softmax(logits, dim=-1)


def angle_rule(alpha: float = 5.0, gompertz_form: str = "decreasing", per_layer: bool = False,
               weighting: str = "examples") -> WeightingRule:
    """FedAdp (``per_layer=False``) or FedLayerWise (``per_layer=True``) weighting.

    Args:
      alpha: the Gompertz ceiling (both papers use 5).
      gompertz_form: ``decreasing`` (intent) or ``literal`` (eq. 5 as printed).
      per_layer: one weight per client and layer (FedLayerWise) instead of per client (FedAdp).
      weighting: the base rule: ``n_k`` of eq. 6 (``examples``) or 1 (``uniform``).
    """
    check(alpha > 0, "aggregator.alpha", alpha, "must be > 0")
    base_weights = base_rule(weighting).base
    gompertz(torch.zeros(1), alpha, gompertz_form)  # validates the form

    def init(num_clients: int, num_layers: int):
        shape = (num_clients, num_layers) if per_layer else (num_clients,)
        return {"smoothed": torch.zeros(shape, dtype=torch.float64),
                "count": torch.zeros(num_clients, dtype=torch.long)}

    def update(stats: NormStats, base: torch.Tensor, clients: list[int], state):
        theta = stats.layer_angles() if per_layer else stats.angles()  # [m, L] or [m]
        smoothed, count = _smooth(state["smoothed"], state["count"], clients, theta)
        s = smoothed[torch.as_tensor(clients, dtype=torch.long)]
        f = gompertz(s, alpha, gompertz_form)
        weights = _softmax_weights(base, f.T if per_layer else f)  # [L, m] or [m]
        diagnostics = {"angle": theta, "smoothed_angle": s}
        return weights, {"smoothed": smoothed, "count": count}, diagnostics

    return WeightingRule(base_weights, init, update, per_layer)
