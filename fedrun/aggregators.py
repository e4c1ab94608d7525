"""Aggregators: one object picks a method's client side and its server side.

An :class:`Aggregator` is a client-weighting rule (``examples``: ``n_k / n``; ``uniform``: ``1/m``,
what FedNNNN uses in its unbalanced runs, sec. 5.1), a chain of server transforms
(:mod:`fedrun.transforms`), an optional client regularizer (:mod:`fedrun.regularizers`) and which
model is evaluated.  The factories below are the methods of the FedNNNN paper; each YAML file in
``conf/aggregator/`` names one of them as its ``_target_``.  FedAdp and FedLayerWise replace the
weighting by an angle rule (:mod:`fedrun.weighting`); FedLap is a client regularizer.

FedNNNN keeps two models (sec. 4.1): the *average-aggregated* model ``w_t + sum_k p_k dw_k``,
"capable of performing highly-accurate inference", and the *normalized* model ``w_t + d_{t+1}``
that is sent to clients, whose own accuracy "remains extremely poor".  ``evaluate`` picks which
one the ``test_acc`` column reports (``average``, the paper's choice, or ``sent``); the other
model's accuracy is recorded as ``sent_test_acc`` whenever the two differ.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedrun import transforms as T
from fedrun.errors import ConfigError, check
from fedrun.layers import Layer
from fedrun.nwda import LayerGrams, NormStats, Params, layer_norms, nwda, weighted_mean, weighted_mean_by_layer
from fedrun.regularizers import LayerAdaptive, Proximal, Regularizer
from fedrun.weighting import WeightingRule, angle_rule

WEIGHTINGS = ("examples", "uniform")
EVALUATE = ("average", "sent")


@dataclass(frozen=True)
class Aggregator:
    name: str
    server: T.ServerTransform
    weighting: str = "examples"
    regularizer: Regularizer | None = None
    evaluate: str = "average"
    rule: WeightingRule | None = None  # angle-based client weights replacing ``weighting``

    def __post_init__(self):
        if self.weighting not in WEIGHTINGS:
            raise ConfigError("aggregator.weighting", self.weighting, f"choose one of: {', '.join(WEIGHTINGS)}")
        if self.evaluate not in EVALUATE:
            raise ConfigError("aggregator.evaluate", self.evaluate, f"choose one of: {', '.join(EVALUATE)}")


# ----------------------------------------------------------------------------- the methods

def fedavg(weighting: str = "examples") -> Aggregator:
    """FedAvg (McMahan et al.; Nagura et al. eq. 1): ``w_{t+1} = sum_k (n_k/n) w_k``."""
    return Aggregator("fedavg", T.identity(), weighting)


def fedprox(mu: float = 0.01, weighting: str = "examples") -> Aggregator:
    """FedProx (Li et al.; Nagura et al. eq. 7): FedAvg with ``mu/2 ||w - w_t||^2`` on clients."""
    return Aggregator("fedprox", T.identity(), weighting, Proximal(mu))


def normnorm(beta: float = 1.0, weighting: str = "examples", evaluate: str = "average",
             eps: float = 1e-6) -> Aggregator:
    """Norm-Norm (Nagura et al. eq. 8): the mean update rescaled to norm ``beta * E``."""
    return Aggregator("normnorm", T.normalize_norm(beta, eps), weighting, None, evaluate)


def momentum(gamma: float = 0.9, weighting: str = "examples", evaluate: str = "average") -> Aggregator:
    """Server momentum (Nagura et al. eq. 10-11): ``d = gamma d + mean update``, ``w += d``."""
    return Aggregator("momentum", T.momentum(gamma), weighting, None, evaluate)


def fednnnn(beta: float = 0.7, gamma: float = 0.8, weighting: str = "examples",
            evaluate: str = "average", eps: float = 1e-6) -> Aggregator:
    """FedNNNN (Nagura et al. eq. 12-13): normalization then momentum,
    ``d_{t+1} = gamma d_t + beta (E/N) sum_k p_k dw_k``, ``w_{t+1} = w_t + d_{t+1}``."""
    chain = T.chain(T.normalize_norm(beta, eps), T.momentum(gamma))
    return Aggregator("fednnnn", chain, weighting, None, evaluate)


def fedadp(alpha: float = 5.0, gompertz: str = "decreasing", weighting: str = "examples") -> Aggregator:
    """FedAdp (Wu & Wang): client weights ``softmax(n_k e^{f(smoothed angle_k)})`` (FedLayerWise
    eq. 4-6 applied to the whole model), ``w_{t+1} = w_t + sum_k psi_k dw_k``."""
    return Aggregator("fedadp", T.identity(), weighting, rule=angle_rule(alpha, gompertz, per_layer=False))


def fedlayerwise(alpha: float = 5.0, gompertz: str = "decreasing", weighting: str = "examples") -> Aggregator:
    """FedLayerWise (Lanjewar et al. eq. 1-7): FedAdp's weights computed per layer,
    ``w_l(t) = sum_k psi_{k,l} w_{k,l}``."""
    return Aggregator("fedlayerwise", T.identity(), weighting, rule=angle_rule(alpha, gompertz, per_layer=True))


def fedlap(q: float = 0.5, form: str = "linear", weighting: str = "examples") -> Aggregator:
    """FedLap (Charteros & Koutsopoulos eq. 10): FedAvg with the layer-wise regularizer
    ``q/2 sum_l <lambda_l, d_l>`` on clients (:class:`fedrun.regularizers.LayerAdaptive`): eq. 10
    as printed at q = 1, half of it at the default q = 0.5 (``form=linear``)."""
    return Aggregator("fedlap", T.identity(), weighting, LayerAdaptive(q, form))


# ----------------------------------------------------------------------------- one server round

def client_weights(weighting: str, num_examples: torch.Tensor) -> torch.Tensor:
    """``[m]`` float64 weights summing to one: ``n_k / n`` or ``1 / m``."""
    n = num_examples.to(torch.float64)
    if weighting == "uniform":
        return torch.full_like(n, 1.0 / len(n))
    return n / n.sum()


@dataclass
class RoundOutcome:
    sent: Params  # w_{t+1}: the model sent to clients next round (the server state)
    average: Params  # w_t + sum_k p_k dw_k: the average-aggregated model
    buffers: Params  # averaged non-trainable state (BatchNorm running statistics)
    server_state: object
    weights: torch.Tensor  # [m] aggregation weights, or [L, m] for a per-layer rule
    stats: NormStats  # N and E (eq. 4-5), with the base weights
    step_layer_norms: torch.Tensor  # [L] ||w_{t+1} - w_t|| per layer (eq. 24)
    skipped: bool  # the server kept w_t (N ~ 0 under norm normalization)
    stats_weights: torch.Tensor = None  # [m] the base weights of N and E
    rule_state: object = None  # the weighting rule's state (FedAdp's smoothed angles)
    diagnostics: dict = field(default_factory=dict)  # the rule's per-client values

    @property
    def client_weights(self) -> torch.Tensor:
        """``[m]``: each client's weight; for a per-layer rule, the mean over layers."""
        return self.weights if self.weights.ndim == 1 else self.weights.mean(0)

    @property
    def server_step(self) -> float:
        return float(self.step_layer_norms.pow(2).sum().sqrt())


def init_rule_state(aggregator: Aggregator, num_clients: int, layers: list[Layer]):
    return None if aggregator.rule is None else aggregator.rule.init(num_clients, len(layers))


def server_round(aggregator: Aggregator, params: Params, server_state, deltas: Params,
                 buffers: Params, num_examples: torch.Tensor, layers: list[Layer],
                 clients: list[int] | None = None, rule_state=None, grams: LayerGrams | None = None) -> RoundOutcome:
    """Aggregate one round's stacked client updates into the next global model.

    Args:
      params: the global model ``w_t`` (trainable parameters).
      server_state: the transforms' state from the previous round.
      deltas: ``w_k - w_t`` stacked ``[m, *shape]`` per parameter.
      buffers: the clients' final buffers stacked ``[m, *shape]`` (BatchNorm running statistics);
        averaged with the same client weights, and kept out of N, E and the server step.
      num_examples: ``[m]`` the clients' training-set sizes ``n_k``.
      clients, rule_state: the clients' ids and the weighting rule's state (angle rules only).
      grams: the updates' :func:`fedrun.nwda.layer_grams`, if already computed.

    N and E always use the base weights (``examples`` or ``uniform``), as eq. 4-5 define them, so
    they compare across aggregators; an angle rule's weights then form the mean update.
    """
    check(len(num_examples) > 0, "round", 0, "needs at least one client update")
    base = client_weights(aggregator.weighting, num_examples)
    mean = weighted_mean(deltas, base)
    stats = nwda(deltas, base, layers, grams)
    weights, diagnostics = base, {}
    if aggregator.rule is not None:
        if clients is None:
            clients = list(range(len(num_examples)))
        if rule_state is None:
            rule_state = aggregator.rule.init(max(clients) + 1, len(layers))
        weights, rule_state, diagnostics = aggregator.rule.update(stats, base, clients, rule_state)
        mean = (weighted_mean_by_layer(deltas, weights, layers) if aggregator.rule.per_layer
                else weighted_mean(deltas, weights))
    step, new_state = aggregator.server.update(mean, server_state, stats)
    skipped = step is None
    if skipped:
        step, new_state = {k: torch.zeros_like(v) for k, v in mean.items()}, server_state
    sent = {k: params[k] + step[k] for k in params}
    average = {k: params[k] + mean[k] for k in params}
    # BatchNorm statistics are averaged with the base weights: they are not updates to weigh.
    return RoundOutcome(sent, average, average_buffers(buffers, base), new_state, weights, stats,
                        layer_norms(step, layers).to(torch.float64), skipped, base, rule_state, diagnostics)


def average_buffers(buffers: Params, weights: torch.Tensor) -> Params:
    """Weighted mean of float buffers; integer counters (``num_batches_tracked``) take the max."""
    out = {}
    for name, stacked in buffers.items():
        if stacked.is_floating_point():
            out[name] = torch.tensordot(weights.to(stacked.dtype), stacked, dims=1)
        else:
            out[name] = stacked.max(0).values
    return out
