"""Angle-based client weights: FedAdp and FedLayerWise (Lanjewar et al. eq. 1-7).

Most tests use one parameter ``w`` of two entries, ``w_t = [0, 0]``, and two clients with
``n = (1, 1)``, so every number can be checked by hand.  The standard case: ``dw_1 = [1, 0]``
(a client that moved), ``dw_2 = [0, 0]`` (a client that did not):

* mean update (eq. 2, base weights 1/2) ``= [0.5, 0]``, parallel to ``dw_1``;
* angles (eq. 1): ``theta_1 = arccos(0.5 / (1 * 0.5)) = 0``; ``theta_2 = pi/2`` (zero update: no
  alignment, by convention, instead of 0/0);
* Gompertz (decreasing form, alpha = 5), ``f(theta) = 5 (1 - exp(-exp(-5 (theta - 1))))``:
  ``f(0) = 5 (1 - exp(-e^5)) = 5 (1 - exp(-148.4)) = 5.0`` (to double precision);
  ``f(pi/2) = 5 (1 - exp(-exp(-5 * 0.570796))) = 5 (1 - exp(-exp(-2.853982)))
  = 5 (1 - exp(-0.057637)) = 5 * 0.056001 = 0.279931``;
* eq. 6: ``psi_1 = e^5 / (e^5 + e^0.279931) = 1 / (1 + e^(0.279931 - 5)) = 1 / (1 + e^-4.720069)
  = 1 / (1 + 0.0089146) = 0.991164``, ``psi_2 = 0.008836``.
"""
from __future__ import annotations

import math

import pytest
import torch
from conftest import aggregate, compose

from fedrun import aggregators as A
from fedrun.server import reduce as R
from fedrun.errors import ConfigError
from fedrun.models.layers import Layer
from fedrun.diagnostics.nwda import layer_grams, nwda
from fedrun.server.weighting import angle_rule, gompertz

W_LAYERS = [Layer("w", "fc", ("w",))]
AB_LAYERS = [Layer("a", "fc", ("a",)), Layer("b", "fc", ("b",))]

F_HALF_PI = 5 * (1 - math.exp(-math.exp(-5 * (math.pi / 2 - 1))))  # 0.279931 (see above)
PSI_ALIGNED = 1 / (1 + math.exp(F_HALF_PI - 5.0))  # 0.991164


def w(*values) -> dict:
    return {"w": torch.tensor(values, dtype=torch.float64)}


def stacked(*rows) -> dict:
    return {"w": torch.tensor(rows, dtype=torch.float64)}


def run_round(agg, deltas, n=(1, 1), layer_list=W_LAYERS, params=None, clients=None, state=None):
    """One round from w_t = 0 (or ``params``); ``state``: the aggregator's, or None for a fresh one."""
    params = params if params is not None else {k: torch.zeros(v.shape[1:], dtype=v.dtype)
                                                for k, v in deltas.items()}
    return aggregate(agg, params, deltas, n, layer_list, state, clients)


ALIGNED_VS_STILL = stacked([1.0, 0.0], [0.0, 0.0])


# ----------------------------------------------------------------------------- Gompertz (eq. 5)

def test_gompertz_decreasing_and_literal_monotone():
    theta = torch.linspace(0, math.pi, 50, dtype=torch.float64)
    dec = gompertz(theta, 5.0, "decreasing")
    lit = gompertz(theta, 5.0, "literal")
    assert bool((dec[1:] <= dec[:-1]).all()) and dec[0] > dec[-1]
    assert bool((lit[1:] >= lit[:-1]).all()) and lit[0] < lit[-1]
    # Bounded by the ceiling alpha (0 < f < alpha).
    assert bool((dec > 0).all() and (dec <= 5).all() and (lit > 0).all() and (lit <= 5).all())
    # The default form is the decreasing one.
    assert torch.equal(gompertz(theta, 5.0), dec)


@pytest.mark.parametrize("alpha", [1.0, 5.0, 7.5])
@pytest.mark.parametrize("form", ["decreasing", "literal"])
def test_gompertz_at_one(alpha, form):
    # theta = 1: exp(+-alpha * 0) = 1, so f = alpha (1 - e^-1) = 0.632121 alpha for both forms.
    value = float(gompertz(torch.tensor([1.0], dtype=torch.float64), alpha, form))
    assert value == pytest.approx(alpha * (1 - math.exp(-1)), rel=1e-12)


def test_gompertz_golden():
    # f(0) = 5 (1 - exp(-e^5)) = 5.0; f(pi/2) = 0.279931 (module docstring).
    values = gompertz(torch.tensor([0.0, math.pi / 2], dtype=torch.float64), 5.0)
    assert values.tolist() == pytest.approx([5.0, 0.2799308563640185], rel=1e-12)
    assert F_HALF_PI == pytest.approx(0.279931, abs=1e-6)


# ----------------------------------------------------------------------------- FedAdp

def test_fedadp_golden_aligned_vs_still():
    out = run_round(A.fedadp(alpha=5.0), ALIGNED_VS_STILL)
    assert out.diagnostics["angle"].tolist() == pytest.approx([0.0, math.pi / 2], abs=1e-12)
    assert out.weights.tolist() == pytest.approx([PSI_ALIGNED, 1 - PSI_ALIGNED], rel=1e-12)
    assert PSI_ALIGNED == pytest.approx(0.991164, abs=1e-6)
    # The aggregated model is w_t + sum_k psi_k dw_k = [psi_1, 0].
    assert out.average["w"].tolist() == pytest.approx([PSI_ALIGNED, 0.0], rel=1e-12)
    assert torch.equal(out.sent["w"], out.average["w"])  # identity server transform
    assert out.weights.sum().item() == pytest.approx(1.0, abs=1e-15)


def test_fedadp_aligned_client_gets_more_weight_than_orthogonal():
    # Three clients, n = (1, 1, 1): dw = [2, 0], [1, 0], [0, 0]; mean [1, 0].  Client 1 and 2 are
    # parallel to the mean (angle 0), client 3 is not aligned at all (pi/2).
    deltas = stacked([2.0, 0.0], [1.0, 0.0], [0.0, 0.0])
    out = run_round(A.fedadp(), deltas, n=(1, 1, 1))
    psi = out.weights
    assert psi[0] == pytest.approx(float(psi[1]), rel=1e-12)  # same angle, same n: same weight
    assert psi[0] > psi[2] and psi[1] > psi[2]
    assert float(psi.sum()) == pytest.approx(1.0, abs=1e-15)
    # Under the literal eq. 5 (increasing in theta) the order flips.
    lit = run_round(A.fedadp(gompertz="literal"), deltas, n=(1, 1, 1)).weights
    assert lit[2] > lit[0]
    assert float(lit.sum()) == pytest.approx(1.0, abs=1e-15)


def test_fedadp_anti_parallel_clients():
    # dw = [2, 0], [-1, 0], n = (1, 1): mean [0.5, 0]; angles 0 and pi.
    # f(pi) = 5 (1 - exp(-exp(-5 (pi - 1)))) = 5 (1 - exp(-2.237e-5)) = 1.118e-4;
    # psi_1 = 1 / (1 + e^(1.118e-4 - 5)) = 1 / (1 + 0.0067382) = 0.993306.
    out = run_round(A.fedadp(), stacked([2.0, 0.0], [-1.0, 0.0]))
    assert out.diagnostics["angle"].tolist() == pytest.approx([0.0, math.pi], abs=1e-7)
    assert float(out.weights[0]) == pytest.approx(0.993306405586866, rel=1e-9)


def test_examples_enter_the_softmax():
    # Equal angles give equal f, so psi = n_k e^f / sum_j n_j e^f = n_k / n: the base weights.
    # dw = [1, 0], [0, 1], n = (1, 1): mean [0.5, 0.5], both angles pi/4, psi = [0.5, 0.5].
    out = run_round(A.fedadp(), stacked([1.0, 0.0], [0.0, 1.0]), n=(1, 1))
    assert out.diagnostics["angle"].tolist() == pytest.approx([math.pi / 4] * 2, rel=1e-12)
    assert out.weights.tolist() == pytest.approx([0.5, 0.5], rel=1e-12)
    # Identical updates dw = [1, 0] twice, n = (1, 3): both angles 0, psi = n / n = [0.25, 0.75].
    same = stacked([1.0, 0.0], [1.0, 0.0])
    out = run_round(A.fedadp(), same, n=(1, 3))
    assert out.weights.tolist() == pytest.approx([0.25, 0.75], rel=1e-12)
    # weighting=uniform ignores n: psi = [0.5, 0.5].
    uni = run_round(A.fedadp(weighting="uniform"), same, n=(1, 3))
    assert uni.weights.tolist() == pytest.approx([0.5, 0.5], rel=1e-12)


def test_zero_update_angle_is_half_pi_without_nan():
    # One zero update among others (standard case) and all updates zero (N = 0).
    out = run_round(A.fedadp(), ALIGNED_VS_STILL)
    assert float(out.stats.angles()[1]) == pytest.approx(math.pi / 2, rel=1e-15)
    assert float(out.stats.layer_angles()[1, 0]) == pytest.approx(math.pi / 2, rel=1e-15)
    for make in (A.fedadp, A.fedlayerwise):
        out = run_round(make(), stacked([0.0, 0.0], [0.0, 0.0]), n=(1, 3))
        assert out.stats.angles().tolist() == [math.pi / 2] * 2
        assert out.stats.layer_angles().tolist() == [[math.pi / 2]] * 2
        # Equal angles: the weights are the base weights, no NaN anywhere, the model stays put.
        assert torch.allclose(out.weights.reshape(-1, 2), torch.tensor([0.25, 0.75], dtype=torch.float64))
        assert not torch.isnan(out.weights).any()
        assert out.average["w"].tolist() == [0.0, 0.0]


def test_nwda_angles_golden():
    # Direct NWDA (no rule): dw = [1, 0], [0, 1] with p = [0.25, 0.75]: mean [0.25, 0.75],
    # N = sqrt(0.625); cos_1 = 0.25 / 0.790569 = 0.316228 -> 1.249046; cos_2 = 0.75 / 0.790569
    # = 0.948683 -> 0.321751.
    stats = nwda(stacked([1.0, 0.0], [0.0, 1.0]), torch.tensor([0.25, 0.75], dtype=torch.float64), W_LAYERS)
    assert stats.angles().tolist() == pytest.approx([math.acos(1 / math.sqrt(10)), math.acos(3 / math.sqrt(10))],
                                                    rel=1e-12)
    assert stats.angles().tolist() == pytest.approx([1.2490457723982544, 0.3217505543966422], rel=1e-12)


# ----------------------------------------------------------------------------- smoothing (eq. 4)

def test_smoothing_counts_rounds_the_client_took_part_in():
    """Three clients over three rounds, each round two of them (dw = [1, 0] aligned, [0, 0] still):

    round 1, clients (0, 1): angles (0, pi/2) -> smoothed 0 (count 1), pi/2 (count 1)
    round 2, clients (1, 2): angles (0, pi/2) -> client 1: (1/2) pi/2 + (1/2) 0 = pi/4 (count 2);
                                                 client 2 first time: pi/2 (count 1; with the global
                                                 round t = 2 it would wrongly be pi/4);
                                                 client 0 absent: keeps 0
    round 3, clients (0, 2): angles (pi/2, 0) -> client 0: (1/2) 0 + (1/2) pi/2 = pi/4 (count 2;
                                                 with t = 3 it would be pi/6);
                                                 client 2: (1/2) pi/2 + 0 = pi/4; client 1 keeps pi/4
    """
    agg = A.fedadp()
    state = agg.init({}, 3, W_LAYERS)
    rule = state["weighting"]
    assert rule["smoothed"].tolist() == [0.0, 0.0, 0.0] and rule["count"].tolist() == [0, 0, 0]
    hp, qp = math.pi / 2, math.pi / 4

    r1 = run_round(agg, ALIGNED_VS_STILL, clients=[0, 1], state=state)
    assert r1.state["weighting"]["smoothed"].tolist() == pytest.approx([0.0, hp, 0.0], abs=1e-12)
    assert r1.state["weighting"]["count"].tolist() == [1, 1, 0]
    assert r1.diagnostics["smoothed_angle"].tolist() == pytest.approx([0.0, hp], abs=1e-12)
    assert r1.weights.tolist() == pytest.approx([PSI_ALIGNED, 1 - PSI_ALIGNED], rel=1e-12)
    # The input state is not modified in place.
    assert state["weighting"]["count"].tolist() == [0, 0, 0]

    r2 = run_round(agg, ALIGNED_VS_STILL, clients=[1, 2], state=r1.state)
    assert r2.state["weighting"]["smoothed"].tolist() == pytest.approx([0.0, qp, hp], abs=1e-12)
    assert r2.state["weighting"]["count"].tolist() == [1, 2, 1]
    assert r2.diagnostics["angle"].tolist() == pytest.approx([0.0, hp], abs=1e-12)  # instantaneous
    assert r2.diagnostics["smoothed_angle"].tolist() == pytest.approx([qp, hp], abs=1e-12)
    # The weights follow the smoothed angles: f(pi/4) = 5 (1 - exp(-exp(-5 (0.785398 - 1))))
    # = 5 (1 - exp(-2.926)) = 4.731453; psi = 1 / (1 + e^(0.279931 - 4.731453)) = 0.988474.
    assert float(r2.weights[0]) == pytest.approx(0.9884735980545601, rel=1e-9)

    r3 = run_round(agg, stacked([0.0, 0.0], [1.0, 0.0]), clients=[0, 2], state=r2.state)
    assert r3.state["weighting"]["smoothed"].tolist() == pytest.approx([qp, qp, qp], abs=1e-12)
    assert r3.state["weighting"]["count"].tolist() == [2, 2, 2]
    # Equal smoothed angles and equal n: equal weights, although the instantaneous angles differ.
    assert r3.weights.tolist() == pytest.approx([0.5, 0.5], rel=1e-12)


def test_smoothing_per_layer_state_shape():
    agg = A.fedlayerwise()
    state = agg.init({}, 5, AB_LAYERS)
    assert state["weighting"]["smoothed"].shape == (5, 2) and state["weighting"]["count"].shape == (5,)
    deltas = {"a": torch.tensor([[1.0], [1.0]], dtype=torch.float64),
              "b": torch.tensor([[1.0], [0.0]], dtype=torch.float64)}
    out = run_round(agg, deltas, layer_list=AB_LAYERS, clients=[3, 1], state=state)
    # Layer a: both parallel (0, 0); layer b: client 3 aligned (0), client 1 still (pi/2).
    assert out.state["weighting"]["smoothed"][3].tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    assert out.state["weighting"]["smoothed"][1].tolist() == pytest.approx([0.0, math.pi / 2], abs=1e-12)
    assert out.state["weighting"]["count"].tolist() == [0, 1, 0, 1, 0]
    assert out.diagnostics["smoothed_angle"].shape == (2, 2)  # [m, L]


# ----------------------------------------------------------------------------- FedLayerWise

def test_fedlayerwise_equals_fedadp_on_one_layer():
    # One layer owning two parameters (weight and bias), three clients, random updates, two rounds.
    g = torch.Generator().manual_seed(7)
    one = [Layer("fc", "fc", ("fc.weight", "fc.bias"))]
    params = {"fc.weight": torch.randn(3, 2, generator=g, dtype=torch.float64),
              "fc.bias": torch.randn(3, generator=g, dtype=torch.float64)}
    adp, lw = A.fedadp(), A.fedlayerwise()
    s_adp, s_lw = adp.init({}, 4, one), lw.init({}, 4, one)
    for clients in ([0, 1, 2], [3, 1, 2]):
        deltas = {k: torch.randn(3, *v.shape, generator=g, dtype=torch.float64) for k, v in params.items()}
        n = torch.tensor([5, 1, 3])
        a = aggregate(adp, params, deltas, n, one, s_adp, clients)
        b = aggregate(lw, params, deltas, n, one, s_lw, clients)
        assert b.weights.shape == (1, 3) and a.weights.shape == (3,)
        assert torch.equal(b.weights[0], a.weights)
        assert torch.equal(b.client_weights, a.client_weights)
        for k in params:
            assert torch.equal(a.average[k], b.average[k]) and torch.equal(a.sent[k], b.sent[k])
        assert torch.equal(b.state["weighting"]["smoothed"][:, 0], a.state["weighting"]["smoothed"])
        s_adp, s_lw, params = a.state, b.state, a.sent


def test_fedlayerwise_weights_per_layer_golden():
    """Two layers, n = (1, 1).  Layer a: dw = [1, 0] and [1, 0] (the clients agree): angles 0, 0,
    psi = [0.5, 0.5].  Layer b: dw = [2, 0] and [-1, 0] (they disagree): mean [0.5, 0], angles 0
    and pi, psi = [0.993306, 0.006694] (see test_fedadp_anti_parallel_clients).

    Aggregated: a = 0.5 [1, 0] + 0.5 [1, 0] = [1, 0];
                b = 0.993306 [2, 0] + 0.006694 [-1, 0] = [1.979919, 0].
    """
    deltas = {"a": torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64),
              "b": torch.tensor([[2.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)}
    out = run_round(A.fedlayerwise(), deltas, layer_list=AB_LAYERS)
    psi_b = 0.993306405586866
    assert out.weights.shape == (2, 2)  # [L, m]
    assert out.weights[0].tolist() == pytest.approx([0.5, 0.5], rel=1e-12)
    assert out.weights[1].tolist() == pytest.approx([psi_b, 1 - psi_b], rel=1e-9)
    assert out.weights.sum(1).tolist() == pytest.approx([1.0, 1.0], abs=1e-15)  # each row sums to 1
    assert out.average["a"].tolist() == pytest.approx([1.0, 0.0], rel=1e-12)
    assert out.average["b"].tolist() == pytest.approx([2 * psi_b - (1 - psi_b), 0.0], rel=1e-9)
    assert out.average["b"][0].item() == pytest.approx(1.979919, abs=1e-6)
    # The per-client summary is the mean over layers: [(0.5 + 0.993306) / 2, ...] and sums to 1.
    assert out.client_weights.tolist() == pytest.approx([(0.5 + psi_b) / 2, (0.5 + 1 - psi_b) / 2], rel=1e-9)
    # FedAdp on the same updates gives one weight for both layers: whole-model angles
    # (mean [1, 0, 0.5, 0]; client 1 [1, 0, 2, 0] at arccos(2 / (sqrt 5 * sqrt 1.25)) = arccos(0.8)
    # = 0.6435, client 2 [1, 0, -1, 0] at arccos(0.5 / (sqrt 2 * sqrt 1.25)) = arccos(0.316228) = 1.2490).
    adp = run_round(A.fedadp(), deltas, layer_list=AB_LAYERS)
    assert adp.diagnostics["angle"].tolist() == pytest.approx([math.acos(0.8), math.acos(1 / math.sqrt(10))],
                                                              rel=1e-12)
    # FedAdp's psi_1 = 1 / (1 + e^(f(1.2490) - f(0.6435))) differs from layer b's 0.993306.
    assert adp.average["b"][0].item() != pytest.approx(out.average["b"][0].item(), rel=1e-3)


def test_fedlayerwise_weights_rows_sum_to_one_random():
    g = torch.Generator().manual_seed(3)
    deltas = {"a": torch.randn(4, 3, generator=g, dtype=torch.float64),
              "b": torch.randn(4, 2, 2, generator=g, dtype=torch.float64)}
    out = run_round(A.fedlayerwise(), deltas, n=(3, 1, 4, 1), layer_list=AB_LAYERS)
    assert out.weights.shape == (2, 4)
    assert torch.allclose(out.weights.sum(1), torch.ones(2, dtype=torch.float64), atol=1e-14)
    assert bool((out.weights > 0).all())
    assert float(out.client_weights.sum()) == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("make", [A.fedadp, A.fedlayerwise], ids=["fedadp", "fedlayerwise"])
def test_N_and_E_use_the_base_weights(make):
    # n = (1, 3): base weights [0.25, 0.75] (eq. 2), N = sqrt(0.625), E = 1, as FedAvg's.
    deltas = stacked([1.0, 0.0], [0.0, 1.0])
    out = run_round(make(), deltas, n=(1, 3))
    ref = run_round(A.fedavg(), deltas, n=(1, 3))
    assert out.stats_weights.tolist() == [0.25, 0.75]
    assert out.stats.N == ref.stats.N == pytest.approx(math.sqrt(0.625), rel=1e-12)
    assert out.stats.E == ref.stats.E == pytest.approx(1.0, rel=1e-12)
    assert torch.equal(out.stats.layer_N, ref.stats.layer_N)
    # ... while the aggregation weights are the rule's, not the base ones.
    assert out.client_weights.tolist() != pytest.approx([0.25, 0.75])
    # The aggregated model is sum_k psi_k dw_k with the rule's weights.
    psi = out.weights.reshape(-1, 2)[0]
    assert out.average["w"].tolist() == pytest.approx(psi.tolist(), rel=1e-12)


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("alpha", [0.0, -1.0])
@pytest.mark.parametrize("make", [A.fedadp, A.fedlayerwise], ids=["fedadp", "fedlayerwise"])
def test_bad_alpha(make, alpha):
    with pytest.raises(ConfigError) as err:
        make(alpha=alpha)
    assert err.value.setting == "aggregator.alpha"
    assert "aggregator.alpha" in str(err.value)


@pytest.mark.parametrize("make", [A.fedadp, A.fedlayerwise], ids=["fedadp", "fedlayerwise"])
def test_bad_gompertz_form(make):
    with pytest.raises(ConfigError) as err:
        make(gompertz="increasing")
    assert err.value.setting == "aggregator.gompertz"
    assert "decreasing" in str(err.value) and "literal" in str(err.value)
    with pytest.raises(ConfigError, match="aggregator.gompertz"):
        gompertz(torch.zeros(1), 5.0, "Decreasing")


def test_bad_settings_through_the_cli_precheck():
    from fedrun.command.cli import precheck

    with pytest.raises(ConfigError) as err:
        precheck(["aggregator=fedadp", "aggregator.alpha=0"])
    assert err.value.setting == "aggregator.alpha"
    with pytest.raises(ConfigError) as err:
        precheck(["aggregator=fedlayerwise", "aggregator.gompertz=flat"])
    assert err.value.setting == "aggregator.gompertz"


def test_rule_per_layer_flag():
    assert angle_rule(per_layer=True).per_layer and not angle_rule().per_layer
    assert A.fedlayerwise().weighting.per_layer and not A.fedadp().weighting.per_layer
    assert not A.fedavg().weighting.per_layer and A.fedavg().init({}, 3, W_LAYERS)["weighting"] == {}


def test_per_layer_weights_are_the_reduces_job():
    """FedLayerWise keeps the default reduce: :func:`fedrun.server.reduce.mean` takes one weight row per
    layer (eq. 7).  Layer a: 0.25 [1, 0] + 0.75 [3, 0] = [2.5, 0]; layer b: 0.5 [0, 2] + 0.5 [0, 4] = [0, 3]."""
    assert A.fedlayerwise().reduce is R.mean and A.fedadp().reduce is R.mean
    deltas = {"a": torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=torch.float64),
              "b": torch.tensor([[0.0, 2.0], [0.0, 4.0]], dtype=torch.float64)}
    weights = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)  # [L, m]
    out = R.mean(deltas, weights, AB_LAYERS)
    assert out["a"].tolist() == [2.5, 0.0] and out["b"].tolist() == [0.0, 3.0]


@pytest.mark.parametrize("per_layer", [False, True])
def test_angle_rules_ignore_the_grams(per_layer):
    # WeightingRule.update receives the round's Gram matrices (for pairwise rules such as Krum);
    # the angle rules read only the NWDA statistics.
    deltas = {"a": torch.tensor([[1.0, 0.0], [2.0, 1.0]], dtype=torch.float64),
              "b": torch.tensor([[0.0, 2.0], [1.0, 4.0]], dtype=torch.float64)}
    rule = angle_rule(per_layer=per_layer)
    base = torch.tensor([0.25, 0.75], dtype=torch.float64)
    grams = layer_grams(deltas, AB_LAYERS)
    stats = nwda(deltas, base, AB_LAYERS, grams)
    with_grams = rule.update(stats, base, [0, 1], rule.init(2, 2), grams)
    without = rule.update(stats, base, [0, 1], rule.init(2, 2), None)
    assert torch.equal(with_grams[0], without[0])


# ----------------------------------------------------------------------------- experiment presets



@pytest.mark.parametrize("preset,iid", [("mnist_2iid_8noniid", 2), ("mnist_5iid_5noniid", 5)])
def test_fedlayerwise_presets(preset, iid):
    import numpy as np
    from hydra.utils import instantiate

    from fedrun.command import build
    from fedrun.models.layers import count_parameters

    cfg = compose([f"experiment=fedlayerwise/{preset}"])
    assert cfg.dataset.name == "mnist"
    assert cfg.partition._target_ == "fedrun.data.partition.mixed"
    assert (cfg.partition.iid_clients, cfg.partition.classes_per_client, cfg.partition.samples_per_client) == (iid, 2, 600)
    h = cfg.hyperparams
    assert (h.optimizer, h.lr, h.batch_size, h.local_epochs, h.rounds) == ("adam", 0.005, 16, 1, 30)
    assert (h.num_clients, h.client_fraction, h.stragglers, h.dropouts) == (10, 1.0, 0.0, 0.0)
    assert cfg.aggregator._target_ == "fedrun.aggregators.fedlayerwise"
    assert (cfg.aggregator.alpha, cfg.aggregator.gompertz) == (5.0, "decreasing")
    assert cfg.tags.scenario == preset.removeprefix("mnist_")
    model = instantiate(cfg.model)
    assert type(model).__name__ == "MnistCNN" and count_parameters(model) == 582_026
    objects = build.build(cfg)
    assert objects["local"].optimizer == "adam" and objects["local"].lr == 0.005
    assert objects["aggregator"].name == "fedlayerwise" and objects["aggregator"].weighting.per_layer
    assert objects["federation"].per_round == 10
    # The partition: 10 clients x 600, the first `iid` holding all 10 classes, the rest 2 each.
    labels = np.random.default_rng(0).permutation(np.arange(20_000) % 10)
    parts = objects["partition"](labels=labels, num_clients=10, num_classes=10, seed=0)
    assert [len(p) for p in parts] == [600] * 10
    assert [len(np.unique(labels[p])) for p in parts] == [10] * iid + [2] * (10 - iid)
    # The same preset with FedAdp or FedAvg for the comparison of Table I.
    for agg in ("fedadp", "fedavg"):
        other = compose([f"experiment=fedlayerwise/{preset}", f"aggregator={agg}"])
        assert other.aggregator._target_ == f"fedrun.aggregators.{agg}"
        assert other.hyperparams.optimizer == "adam" and other.partition.iid_clients == iid
    assert compose([f"experiment=fedlayerwise/{preset}", "aggregator=fedadp"]).aggregator.alpha == 5.0
