"""Aggregators: the server side of a method, FedJAX-shaped.

An :class:`Aggregator` is three parts and a choice:

* a client-weighting rule (:mod:`fedrun.weighting`): ``examples`` (``n_k / n``), ``uniform``
  (``1 / m``, what FedNNNN uses in its unbalanced runs, sec. 5.1), or FedAdp/FedLayerWise's angle
  rules;
* a chain of server transforms (:mod:`fedrun.transforms`) applied to the weighted mean update;
* an optional client regularizer (:mod:`fedrun.regularizers`): FedProx, FedLap;
* which model is evaluated (below).

It is used as two pure functions over one state, as in FedJAX::

    state = aggregator.init(params, num_clients, layers)
    outcome, state = aggregator.apply(state, params, client_results)

The state is data (a dict of tensors, lists and strings: the transforms' state, the weighting
rule's state and the layer grouping), so a checkpoint is that dict.  The factories below are the
methods; each YAML file in ``conf/aggregator/`` names one of them as its ``_target_``.  A new
server-side method is one transform (or a chain of existing ones), one factory, one YAML.

FedNNNN keeps two models (sec. 4.1): the *average-aggregated* model ``w_t + sum_k p_k dw_k``,
"capable of performing highly-accurate inference", and the *normalized* model ``w_t + d_{t+1}``
that is sent to clients, whose own accuracy "remains extremely poor".  ``evaluate`` picks which
one the ``test_acc`` column reports (``average``, the paper's choice, or ``sent``); the other
model's accuracy is recorded as ``sent_test_acc`` whenever the two differ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedrun import transforms as T
from fedrun.errors import ConfigError, DivergenceError, check
from fedrun.layers import Layer
from fedrun.local_training import ClientResults
from fedrun.nwda import LayerGrams, NormStats, layer_norms, nwda
from fedrun.params import Params, weighted_mean, weighted_mean_by_layer
from fedrun.regularizers import LayerAdaptive, Proximal, Regularizer
from fedrun.weighting import WeightingRule, angle_rule, base_rule

EVALUATE = ("average", "sent")


@dataclass
class RoundOutcome:
    """What one round of aggregation produced, for the next round and for the CSVs."""

    sent: Params  # w_{t+1}: the model sent to clients next round
    average: Params  # w_t + sum_k p_k dw_k: the average-aggregated model
    buffers: Params  # averaged non-trainable state (BatchNorm running statistics)
    weights: torch.Tensor  # [m] aggregation weights, or [L, m] for a per-layer rule
    stats: NormStats  # N and E (eq. 4-5), with the base weights
    step_layer_norms: torch.Tensor  # [L] ||w_{t+1} - w_t|| per layer (eq. 24)
    skipped: bool  # the server kept w_t (N ~ 0 under norm normalization)
    stats_weights: torch.Tensor = None  # [m] the base weights of N and E
    diagnostics: dict = field(default_factory=dict)  # the rule's per-client values (smoothed angles)

    @property
    def client_weights(self) -> torch.Tensor:
        """``[m]``: each client's weight; for a per-layer rule, the mean over layers."""
        return self.weights if self.weights.ndim == 1 else self.weights.mean(0)

    @property
    def server_step(self) -> float:
        return float(self.step_layer_norms.pow(2).sum().sqrt())


@dataclass(frozen=True)
class Aggregator:
    name: str
    server: T.ServerTransform
    weighting: WeightingRule = field(default_factory=base_rule)
    regularizer: Regularizer | None = None
    evaluate: str = "average"

    def __post_init__(self):
        if self.evaluate not in EVALUATE:
            raise ConfigError("aggregator.evaluate", self.evaluate, f"choose one of: {', '.join(EVALUATE)}")

    def init(self, params: Params, num_clients: int, layers: list[Layer]) -> dict:
        """The server's state before round 1: the transforms' (``d_0 = 0``, FedOpt's moments), the
        weighting rule's (per client, so ``num_clients``) and the layer grouping the rules use."""
        return {"server": self.server.init(params), "weighting": self.weighting.init(num_clients, len(layers)),
                "layers": [(layer.name, layer.type, tuple(layer.params)) for layer in layers]}

    def apply(self, state: dict, params: Params, results: ClientResults,
              grams: LayerGrams | None = None) -> tuple[RoundOutcome, dict]:
        """Aggregate one round's client results into the next global model.

        Args:
          state: from :meth:`init` or the previous round.
          params: the global model ``w_t`` (trainable parameters).
          results: the clients' stacked updates ``w_k - w_t``, final buffers and sizes ``n_k``.
          grams: the updates' :func:`fedrun.nwda.layer_grams`, when the caller already computed
            them (the simulation shares them with parameter divergence); computed here otherwise.

        N and E always use the base weights (``examples`` or ``uniform``), as eq. 4-5 define them,
        so they compare across aggregators; an angle rule's weights then form the mean update.
        BatchNorm statistics are averaged with the base weights too: they are not updates to weigh.
        """
        check(len(results.num_examples) > 0, "round", 0, "needs at least one client update")
        layers = [Layer(*layer) for layer in state["layers"]]
        base = self.weighting.base(results.num_examples)
        stats = nwda(results.deltas, base, layers, grams)
        weights, rule_state, diagnostics = self.weighting.update(stats, base, results.clients, state["weighting"])
        mean = (weighted_mean_by_layer(results.deltas, weights, layers) if self.weighting.per_layer
                else weighted_mean(results.deltas, weights))
        step, server_state = self.server.update(mean, state["server"], stats)
        skipped = step is None
        if skipped:
            step, server_state = {k: torch.zeros_like(v) for k, v in mean.items()}, state["server"]
        outcome = RoundOutcome(sent={k: params[k] + step[k] for k in params},
                               average={k: params[k] + mean[k] for k in params},
                               buffers=average_buffers(results.buffers, base), weights=weights, stats=stats,
                               step_layer_norms=layer_norms(step, layers).to(torch.float64), skipped=skipped,
                               stats_weights=base, diagnostics=diagnostics)
        return outcome, {**state, "server": server_state, "weighting": rule_state}


def average_buffers(buffers: Params, weights: torch.Tensor) -> Params:
    """Weighted mean of float buffers; integer counters (``num_batches_tracked``) take the max."""
    out = {}
    for name, stacked in buffers.items():
        if stacked.is_floating_point():
            out[name] = torch.tensordot(weights.to(stacked.dtype), stacked, dims=1)
        else:
            out[name] = stacked.max(0).values
    return out


def check_finite(outcome: RoundOutcome, losses: torch.Tensor, t: int, name: str) -> None:
    """Raise :class:`DivergenceError` when a round diverged: NaN or Inf in either model (the one
    sent to clients, e.g. FedNNNN's normalized model, and the evaluated average; they differ when
    the server transforms), in N or E, or in the local losses.  One host transfer for all checks."""
    models = {"sent": outcome.sent, "average": outcome.average}
    names = [(which, k) for which, model in models.items() for k in model]
    flags = [torch.isfinite(models[which][k]).all() for which, k in names]
    flags.append(torch.isfinite(losses).all().to(flags[0].device))
    finite = torch.stack(flags).tolist()
    bad = [name for name, ok in zip(names, finite) if not ok]
    norms_ok = math.isfinite(outcome.stats.N) and math.isfinite(outcome.stats.E)
    if bad or not norms_ok or not finite[-1]:
        what = (f"parameter {bad[0][1]} of the {bad[0][0]} model" if bad else "the update norm N or E"
                if not norms_ok else "the local training loss")
        raise DivergenceError(f"round {t}: {what} is NaN or Inf after aggregation with {name}; the "
                              f"CSVs hold rounds before {t}. Try a smaller hyperparams.lr (or beta/gamma)")


# ----------------------------------------------------------------------------- FedNNNN's methods

def fedavg(weighting: str = "examples") -> Aggregator:
    """FedAvg (McMahan et al.; Nagura et al. eq. 1): ``w_{t+1} = sum_k (n_k/n) w_k``."""
    return Aggregator("fedavg", T.identity(), base_rule(weighting))


def fedprox(mu: float = 0.01, weighting: str = "examples") -> Aggregator:
    """FedProx (Li et al.; Nagura et al. eq. 7): FedAvg with ``mu/2 ||w - w_t||^2`` on clients."""
    return Aggregator("fedprox", T.identity(), base_rule(weighting), Proximal(mu))


def normnorm(beta: float = 1.0, weighting: str = "examples", evaluate: str = "average",
             eps: float = 1e-6) -> Aggregator:
    """Norm-Norm (Nagura et al. eq. 8): the mean update rescaled to norm ``beta * E``."""
    return Aggregator("normnorm", T.normalize_norm(beta, eps), base_rule(weighting), None, evaluate)


def momentum(gamma: float = 0.9, weighting: str = "examples", evaluate: str = "average") -> Aggregator:
    """Server momentum (Nagura et al. eq. 10-11): ``d = gamma d + mean update``, ``w += d``."""
    return Aggregator("momentum", T.momentum(gamma), base_rule(weighting), None, evaluate)


def fednnnn(beta: float = 0.7, gamma: float = 0.8, weighting: str = "examples",
            evaluate: str = "average", eps: float = 1e-6) -> Aggregator:
    """FedNNNN (Nagura et al. eq. 12-13): normalization then momentum,
    ``d_{t+1} = gamma d_t + beta (E/N) sum_k p_k dw_k``, ``w_{t+1} = w_t + d_{t+1}``."""
    chain = T.chain(T.normalize_norm(beta, eps), T.momentum(gamma))
    return Aggregator("fednnnn", chain, base_rule(weighting), None, evaluate)


# ----------------------------------------------------------------------------- angle weighting

def fedadp(alpha: float = 5.0, gompertz: str = "decreasing", weighting: str = "examples") -> Aggregator:
    """FedAdp (Wu & Wang): client weights ``softmax(n_k e^{f(smoothed angle_k)})`` (FedLayerWise
    eq. 4-6 applied to the whole model), ``w_{t+1} = w_t + sum_k psi_k dw_k``."""
    return Aggregator("fedadp", T.identity(), angle_rule(alpha, gompertz, per_layer=False, weighting=weighting))


def fedlayerwise(alpha: float = 5.0, gompertz: str = "decreasing", weighting: str = "examples") -> Aggregator:
    """FedLayerWise (Lanjewar et al. eq. 1-7): FedAdp's weights computed per layer,
    ``w_l(t) = sum_k psi_{k,l} w_{k,l}``."""
    return Aggregator("fedlayerwise", T.identity(), angle_rule(alpha, gompertz, per_layer=True, weighting=weighting))


# ----------------------------------------------------------------------------- layer-wise regularization

def fedlap(q: float = 0.5, form: str = "linear", weighting: str = "examples") -> Aggregator:
    """FedLap (Charteros & Koutsopoulos eq. 10): FedAvg with the layer-wise regularizer
    ``q/2 sum_l <lambda_l, d_l>`` on clients (:class:`fedrun.regularizers.LayerAdaptive`): eq. 10
    as printed at q = 1, half of it at the default q = 0.5 (``form=linear``)."""
    return Aggregator("fedlap", T.identity(), base_rule(weighting), LayerAdaptive(q, form))


# ----------------------------------------------------------------------------- FedOpt (Reddi et al., ICLR 2021)
# The server's model x_{t+1} is the model these methods evaluate (``evaluate="sent"``): with a
# server learning rate or adaptive scaling, ``w_t + mean update`` is not a model the method has.

def fedavgm(server_lr: float = 1.0, beta1: float = 0.9, weighting: str = "examples",
            evaluate: str = "sent") -> Aggregator:
    """FedAvgM (Hsu et al. 2019; Reddi et al. sec. 5): server SGD with momentum on the mean update,
    ``m_t = beta1 m_{t-1} + Delta_t``, ``x_{t+1} = x_t + eta m_t``.  At ``server_lr = 1`` it is
    FedNNNN's server Momentum (eq. 10-11) with ``gamma = beta1``."""
    chain = T.chain(T.momentum(beta1, "aggregator.beta1"), T.scale(server_lr))
    return Aggregator("fedavgm", chain, base_rule(weighting), None, evaluate)


def _fedopt(rule: str, server_lr: float, beta1: float, beta2: float, tau: float, weighting: str,
            evaluate: str) -> Aggregator:
    chain = T.chain(T.adaptive(rule, beta1, beta2, tau), T.scale(server_lr))
    return Aggregator(f"fed{rule}", chain, base_rule(weighting), None, evaluate)


def fedadagrad(server_lr: float = 0.1, beta1: float = 0.9, tau: float = 1e-3, weighting: str = "examples",
               evaluate: str = "sent") -> Aggregator:
    """FedAdagrad (Reddi et al. Algorithm 2): ``v_t = v_{t-1} + Delta_t^2``,
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)`` (:func:`fedrun.transforms.adaptive`)."""
    return _fedopt("adagrad", server_lr, beta1, 0.0, tau, weighting, evaluate)


def fedadam(server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
            weighting: str = "examples", evaluate: str = "sent") -> Aggregator:
    """FedAdam (Reddi et al. Algorithm 2): ``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``,
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)`` (:func:`fedrun.transforms.adaptive`)."""
    return _fedopt("adam", server_lr, beta1, beta2, tau, weighting, evaluate)


def fedyogi(server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
            weighting: str = "examples", evaluate: str = "sent") -> Aggregator:
    """FedYogi (Reddi et al. Algorithm 2):
    ``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``,
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)`` (:func:`fedrun.transforms.adaptive`)."""
    return _fedopt("yogi", server_lr, beta1, beta2, tau, weighting, evaluate)
