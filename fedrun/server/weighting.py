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

A *pairwise rule* weighs clients by how their updates compare with one another, from the round's
Gram matrices (:class:`fedrun.diagnostics.nwda.LayerGrams`, ``<dw_j, dw_k>`` per layer):

* Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017): all the weight on
  the update (or the ``multi`` updates) closest to its ``m - f - 2`` nearest others.

The *equal rule* gives every client ``1/m`` whatever its ``n_k``: the weights of the unweighted
median and trimmed mean (:mod:`fedrun.server.reduce`), which let every client count once.

A *step rule* weighs clients by how much local work their update holds:

* FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): each update divided by its client's
  ``||a_k||_1`` (local steps, or their momentum coefficients) and the mean scaled by
  ``tau_eff = sum_k p_k ||a_k||_1``, i.e. weights ``tau_eff p_k / ||a_k||_1``.

A rule is ``base(num_examples) -> [m]`` weights summing to one, ``init(num_clients, num_layers)
-> state`` and ``update(stats, base_weights, clients, state, grams, steps=None) -> (weights,
state, diagnostics)``, with ``stats`` the round's N and E (:func:`fedrun.diagnostics.nwda.nwda`, base
weights), ``grams`` its :class:`~fedrun.diagnostics.nwda.LayerGrams` and ``steps`` the clients' ``[m]``
effective local steps ``||a_k||_1`` (:attr:`fedrun.client.local_training.ClientResults.effective_steps`;
rules that need none of these ignore them); ``weights`` is ``[m]`` or ``[L, m]`` (``per_layer``),
on the base weights' device.  The state is a dict of tensors (the angle rules' smoothed angles,
kept per client across rounds; empty for the others).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch

from fedrun.errors import ConfigError, check
from fedrun.diagnostics.nwda import LayerGrams, NormStats

GOMPERTZ_FORMS = ("decreasing", "literal")
BASES = ("examples", "uniform")


class WeightingRule(NamedTuple):
    base: Callable[[torch.Tensor], torch.Tensor]
    init: Callable[[int, int], Any]
    update: Callable[..., tuple[torch.Tensor, Any, dict]]  # (stats, base, clients, state, grams, steps=None)
    per_layer: bool = False
    min_clients: int = 1  # the fewest clients a round the rule can weigh (Krum: 2f + 3), checked before a run
    selects: int = 1  # updates the rule picks from each round (Multi-Krum's multi), checked before a run too


def _examples(num_examples: torch.Tensor) -> torch.Tensor:
    n = num_examples.to(torch.float64)
    return n / n.sum()


def _uniform(num_examples: torch.Tensor) -> torch.Tensor:
    return torch.full((len(num_examples),), 1.0 / len(num_examples), dtype=torch.float64, device=num_examples.device)


def _no_state(num_clients: int, num_layers: int) -> dict:
    return {}


def _base_weights(stats, base, clients, state, grams, steps=None):
    return base, state, {}


def _equal_weights(stats, base, clients, state, grams, steps=None):
    return torch.full_like(base, 1.0 / len(base)), state, {}


def base_rule(weighting: str = "examples") -> WeightingRule:
    """``examples``: ``p_k = n_k / n`` (FedAvg, Nagura et al. eq. 1); ``uniform``: ``p_k = 1 / m``."""
    if weighting not in BASES:
        raise ConfigError("aggregator.weighting", weighting, f"choose one of: {', '.join(BASES)}")
    return WeightingRule(_examples if weighting == "examples" else _uniform, _no_state, _base_weights)


def base_weighting(rule: WeightingRule) -> str | None:
    """``examples`` or ``uniform`` when ``rule`` aggregates with its base weights unchanged (a
    :func:`base_rule`); None for a rule that computes weights of its own (angles, Krum, FedNova,
    the equal weights of the robust statistics).  Client-level privacy runs only on the former."""
    if rule.update is not _base_weights:
        return None
    return "examples" if rule.base is _examples else "uniform" if rule.base is _uniform else None


def equal_rule(weighting: str = "examples") -> WeightingRule:
    """Every client counts once in the aggregation, ``1/m``, whatever its ``n_k``: the weights of
    the unweighted median and trimmed mean (Yin et al. 2018).  N, E and the BatchNorm statistics
    keep the base rule's weights (``weighting``), so they compare with every other method's."""
    return base_rule(weighting)._replace(update=_equal_weights)


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
    # The state starts on the CPU (init) and follows the angles to the updates' device.
    idx = torch.as_tensor(clients, dtype=torch.long, device=theta.device)
    smoothed, count = smoothed.to(theta.device, copy=True), count.to(theta.device, copy=True)
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

    def update(stats: NormStats, base: torch.Tensor, clients: list[int], state, grams: LayerGrams, steps=None):
        theta = stats.layer_angles() if per_layer else stats.angles()  # [m, L] or [m]
        smoothed, count = _smooth(state["smoothed"], state["count"], clients, theta)
        s = smoothed[torch.as_tensor(clients, dtype=torch.long, device=smoothed.device)]
        f = gompertz(s, alpha, gompertz_form)
        weights = _softmax_weights(base, f.T if per_layer else f)  # [L, m] or [m]
        diagnostics = {"angle": theta, "smoothed_angle": s}
        return weights, {"smoothed": smoothed, "count": count}, diagnostics

    return WeightingRule(base_weights, init, update, per_layer)


# ----------------------------------------------------------------------------- Krum (pairwise)

def squared_distances(grams: LayerGrams) -> torch.Tensor:
    """``[m, m]``: ``||dw_i - dw_j||^2 = sum_l (G_l[i, i] + G_l[j, j] - 2 G_l[i, j])`` from the
    round's per-layer Gram matrices (float64; clamped at 0 against rounding)."""
    gram = grams.client_updates().sum(0)  # [m, m] over the whole model
    sq = gram.diagonal()
    return (sq[:, None] + sq[None, :] - 2 * gram).clamp_min(0)


def krum_scores(distances: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score (Blanchard et al. 2017, sec. 4): ``s(i) = sum_{i -> j} ||dw_i - dw_j||^2``,
    where ``i -> j`` ranges over the ``m - f - 2`` updates closest to ``dw_i`` (itself excluded).

    Args:
      distances: ``[m, m]`` squared distances (:func:`squared_distances`).
      f: the number of Byzantine clients assumed, with ``m > 2f + 2``.
    """
    m = distances.shape[0]
    others = distances + torch.diag(torch.full((m,), math.inf, dtype=distances.dtype, device=distances.device))
    return others.sort(dim=1).values[:, : m - f - 2].sum(1)


def krum_rule(f: int = 1, multi: int = 1, weighting: str = "examples") -> WeightingRule:
    """Krum (``multi = 1``) and Multi-Krum (Blanchard et al. 2017, sec. 4 and sec. 5) as weights.

    Krum selects ``dw_{i*}``, ``i* = argmin_i s(i)`` (:func:`krum_scores`): weights one-hot on
    ``i*``.  Multi-Krum averages the ``multi`` updates of lowest score: weights ``1/multi`` on each,
    whatever their ``n_k``.  Ties go to the client listed first in the round (a stable sort), so a
    round is reproducible.  The base weights (``weighting``) still give N, E and the BatchNorm
    statistics.

    Krum needs ``m > 2f + 2`` clients in a round (the paper's condition ``2f + 2 < n``; it leaves
    ``m - f - 2 >= 1`` neighbours to score).  Clients per round can vary (drop-outs), so this is
    checked every round: a round with fewer is a :class:`~fedrun.errors.ConfigError` naming
    ``aggregator.f`` and the round's m; a federation with fewer clients in all fails at ``init``,
    before any training.

    Args:
      f: the number of Byzantine clients assumed, >= 0.
      multi: how many lowest-scoring updates to average, >= 1 (1: Krum); at most the round's m.
      weighting: the base rule for N and E: ``examples`` or ``uniform``.
    """
    check(isinstance(f, int) and f >= 0, "aggregator.f", f, "must be an integer >= 0 (Byzantine clients assumed)")
    check(isinstance(multi, int) and multi >= 1, "aggregator.multi", multi,
          "must be an integer >= 1 (updates averaged; 1 is Krum)")
    base_weights = base_rule(weighting).base
    needs = f"Krum needs more than 2f + 2 = {2 * f + 2} clients in every round"

    def init(num_clients: int, num_layers: int) -> dict:
        # The federation's size bounds every round's: fail before any training where it is too small.
        check(num_clients > 2 * f + 2, "aggregator.f", f, f"{needs}; the federation has {num_clients} "
              f"(lower aggregator.f, or raise hyperparams.num_clients)")
        return {}

    def update(stats: NormStats, base: torch.Tensor, clients: list[int], state, grams: LayerGrams, steps=None):
        m = len(clients)
        check(m > 2 * f + 2, "aggregator.f", f, f"{needs}; a round had {m} "
              f"(lower aggregator.f, or raise hyperparams.client_fraction)")
        check(multi <= m, "aggregator.multi", multi, f"must be at most the clients in a round; a round had {m}")
        scores = krum_scores(squared_distances(grams), f)
        chosen = torch.sort(scores.cpu(), stable=True).indices[:multi].to(base.device)
        weights = torch.zeros_like(base)
        weights[chosen] = 1.0 / multi
        return weights, state, {"krum_score": scores}

    return WeightingRule(base_weights, init, update, min_clients=2 * f + 3, selects=multi)


# ----------------------------------------------------------------------------- FedNova (local steps)

def nova_rule(weighting: str = "examples") -> WeightingRule:
    """FedNova's normalized averaging (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020, "Tackling the
    objective inconsistency problem in heterogeneous federated optimization") as weights.

    FedNova's update is ``x_{t+1} - x_t = -tau_eff sum_k p_k eta d_k`` with the normalized
    gradient ``eta d_k = (x_t - y_k) / ||a_k||_1`` and ``tau_eff = sum_k p_k ||a_k||_1``:
    ``||a_k||_1`` is client k's number of local steps tau_k for plain SGD, and
    ``sum_{j=1..tau_k} (1 - rho^j) / (1 - rho)`` with client momentum rho (the ``steps`` the engines
    report, :meth:`fedrun.client.local_training.LocalTraining.effective_steps`).  So the new model is
    ``w_t + sum_k q_k dw_k`` with the weights

        q_k = tau_eff p_k / ||a_k||_1,

    which the mean reduce applies (``average`` model = FedNova's model).  They sum to
    ``tau_eff sum_k p_k / ||a_k||_1 >= 1`` (Jensen), with equality when every client took as many
    steps: FedNova is then FedAvg with the base weights, and this rule returns them exactly (in
    exact arithmetic ``tau_eff / ||a_k||_1 = 1``; skipping the float division keeps it to the bit).

    Args:
      weighting: ``p_k``: ``examples`` (``n_k / n``, the paper's and NIID-Bench's) or ``uniform``.
    """
    base_weights = base_rule(weighting).base

    def update(stats: NormStats, base: torch.Tensor, clients: list[int], state, grams: LayerGrams, steps=None):
        check(steps is not None, "aggregator", "fednova", "needs the clients' local steps (ClientResults.steps)")
        a = steps.to(device=base.device, dtype=base.dtype)
        if bool((a == a[0]).all()):
            return base, state, {}
        tau_eff = (base * a).sum()
        return base * tau_eff / a, state, {}

    return WeightingRule(base_weights, _no_state, update)
