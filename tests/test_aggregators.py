"""Aggregators, server transforms and NWDA (Nagura et al. eq. 3-13, Proposition 1).

Most tests use one parameter ``w`` of two entries, ``w_t = [0, 0]``, so every number can be
checked by hand.  The standard round: client updates ``dw_1 = [1, 0]``, ``dw_2 = [0, 1]`` with
``n = [1, 3]``:

* weights ``p = n / n.sum() = [0.25, 0.75]``;
* mean update ``sum_k p_k dw_k = [0.25, 0.75]`` (eq. 3);
* ``N = ||[0.25, 0.75]|| = sqrt(0.0625 + 0.5625) = sqrt(0.625) = 0.790569...`` (eq. 4);
* ``E = 0.25 * 1 + 0.75 * 1 = 1`` (eq. 5).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from conftest import CONF_DIR, aggregate, compose
from hydra.utils import instantiate
from torch import nn

from fedrun import aggregators as A
from fedrun.server import reduce as R
from fedrun.server import transforms as T
from fedrun.errors import ConfigError, DivergenceError
from fedrun.models.layers import Layer, layers
from fedrun.diagnostics.nwda import NormStats, nwda
from fedrun.params import split_state
from fedrun.server.weighting import base_rule

W_LAYERS = [Layer("w", "fc", ("w",))]
SQRT_0625 = math.sqrt(0.625)  # N of the standard round


def w(*values) -> dict:
    return {"w": torch.tensor(values, dtype=torch.float64)}


def stacked(*rows) -> dict:
    return {"w": torch.tensor(rows, dtype=torch.float64)}


def run_round(agg, params, state, deltas, n=(1, 3), buffers=None, layer_list=W_LAYERS):
    """One round; ``state``: the previous outcome's ``.state``, or None for a fresh one."""
    return aggregate(agg, params, deltas, n, layer_list, state, buffers=buffers)


STD_DELTAS = stacked([1.0, 0.0], [0.0, 1.0])


# ----------------------------------------------------------------------------- golden numbers

@pytest.mark.parametrize("make", [A.fedavg, lambda: A.fedprox(mu=0.01)], ids=["fedavg", "fedprox"])
def test_fedavg_and_fedprox_golden(make):
    agg = make()
    params = w(0.0, 0.0)
    out = run_round(agg, params, None, STD_DELTAS)
    assert out.weights.tolist() == [0.25, 0.75]
    assert torch.allclose(out.average["w"], torch.tensor([0.25, 0.75], dtype=torch.float64))
    # FedAvg sends the average model itself (eq. 3).
    assert torch.equal(out.sent["w"], out.average["w"])
    assert out.stats.N == pytest.approx(SQRT_0625, rel=1e-12)
    assert out.stats.E == pytest.approx(1.0, rel=1e-12)
    assert out.server_step == pytest.approx(SQRT_0625, rel=1e-12)  # step = mean, so ||step|| = N
    assert not out.skipped


def test_fedprox_carries_proximal_regularizer():
    agg = A.fedprox(mu=0.02)
    assert agg.regularizer is not None and agg.regularizer.mu == 0.02
    # penalty = mu/2 ||w - w_t||^2 = 0.01 * (3^2 + 4^2) = 0.25
    anchor = {"w": torch.zeros(2)}
    pen = agg.regularizer.penalty({}, {"w": torch.tensor([[3.0, 4.0]])}, anchor, torch.zeros(1, dtype=torch.long))
    assert pen.tolist() == pytest.approx([0.25])
    assert A.fedavg().regularizer is None


def test_fedavg_starting_from_nonzero_params():
    # w_t = [1, -1]: both models are w_t + [0.25, 0.75] = [1.25, -0.25].
    agg = A.fedavg()
    out = run_round(agg, w(1.0, -1.0), None, STD_DELTAS)
    assert torch.allclose(out.sent["w"], torch.tensor([1.25, -0.25], dtype=torch.float64))


def test_uniform_weighting():
    # weighting=uniform ignores n: p = [0.5, 0.5], mean [0.5, 0.5], N = sqrt(0.5), E = 1.
    agg = A.fedavg(weighting="uniform")
    out = run_round(agg, w(0.0, 0.0), None, STD_DELTAS, n=(1, 3))
    assert out.weights.tolist() == [0.5, 0.5]
    assert torch.allclose(out.average["w"], torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert out.stats.N == pytest.approx(math.sqrt(0.5))
    assert out.stats.E == pytest.approx(1.0)


@pytest.mark.parametrize("beta", [1.0, 0.5, 1.1])
def test_normnorm_step_has_norm_beta_E(beta):
    # eq. 8-9: step = beta (E / N) mean = beta / sqrt(0.625) * [0.25, 0.75]; ||step|| = beta * E = beta.
    agg = A.normnorm(beta=beta)
    out = run_round(agg, w(0.0, 0.0), None, STD_DELTAS)
    expected = torch.tensor([0.25, 0.75], dtype=torch.float64) * beta / SQRT_0625
    assert torch.allclose(out.sent["w"], expected)
    assert out.server_step == pytest.approx(beta * out.stats.E, rel=1e-12)
    # The average-aggregated model is FedAvg's (sec. 4.1), and it differs from the sent model.
    assert torch.allclose(out.average["w"], torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert not torch.allclose(out.sent["w"], out.average["w"])


def test_normnorm_beta1_golden_values():
    # beta = 1: sent = [0.25, 0.75] / 0.7905694 = [0.3162278, 0.9486833] (= [1, 3] / sqrt(10)).
    agg = A.normnorm(beta=1.0)
    out = run_round(agg, w(0.0, 0.0), None, STD_DELTAS)
    assert out.sent["w"].tolist() == pytest.approx([1 / math.sqrt(10), 3 / math.sqrt(10)], rel=1e-12)


def test_momentum_two_rounds():
    # eq. 10-11 with gamma = 0.9, same deltas twice, mean m = [0.25, 0.75]:
    # d1 = m, w1 = m; d2 = 0.9 m + m = 1.9 m, w2 = w1 + d2 = 2.9 m = [0.725, 2.175].
    agg = A.momentum(gamma=0.9)
    p0 = w(0.0, 0.0)
    r1 = run_round(agg, p0, None, STD_DELTAS)
    assert r1.sent["w"].tolist() == pytest.approx([0.25, 0.75])
    assert r1.state["server"]["d"]["w"].tolist() == pytest.approx([0.25, 0.75])
    r2 = run_round(agg, r1.sent, r1.state, STD_DELTAS)
    assert r2.state["server"]["d"]["w"].tolist() == pytest.approx([0.475, 1.425])
    assert r2.sent["w"].tolist() == pytest.approx([0.725, 2.175])
    # The average model of round 2 is w1 + m = [0.5, 1.5], not the sent one.
    assert r2.average["w"].tolist() == pytest.approx([0.5, 1.5])


def test_fednnnn_two_rounds_uniform():
    """eq. 12-13 with beta = 1, gamma = 0.5 and uniform weights (0.5 / 0.5).

    Round 1: dw = [1,0],[0,1]: mean [0.5, 0.5], N = 1/sqrt2, E = 1,
      step1 = 1 * (1 / (1/sqrt2)) [0.5, 0.5] = [1/sqrt2, 1/sqrt2] (norm 1 = beta E), d1 = step1,
      w1 = [0.70711, 0.70711]; average1 = [0.5, 0.5].
    Round 2: dw = [2,0],[0,2]: mean [1, 1], N = sqrt2, E = 2,
      step2 = (2 / sqrt2) [1, 1] = [sqrt2, sqrt2],
      d2 = 0.5 d1 + step2 = 1/(2 sqrt2) + sqrt2 = 5 / (2 sqrt2) = 1.767767 per entry,
      w2 = w1 + d2 = 7 / (2 sqrt2) = 2.474874; average2 = w1 + mean = 1.707107.
    """
    s2 = math.sqrt(2)
    agg = A.fednnnn(beta=1.0, gamma=0.5, weighting="uniform")
    p0 = w(0.0, 0.0)
    r1 = run_round(agg, p0, None, STD_DELTAS)
    assert r1.weights.tolist() == [0.5, 0.5]
    assert r1.stats.N == pytest.approx(1 / s2) and r1.stats.E == pytest.approx(1.0)
    assert r1.sent["w"].tolist() == pytest.approx([1 / s2, 1 / s2])
    assert r1.average["w"].tolist() == pytest.approx([0.5, 0.5])
    assert r1.server_step == pytest.approx(1.0)  # beta * E
    r2 = run_round(agg, r1.sent, r1.state, stacked([2.0, 0.0], [0.0, 2.0]))
    assert r2.stats.N == pytest.approx(s2) and r2.stats.E == pytest.approx(2.0)
    assert r2.sent["w"].tolist() == pytest.approx([7 / (2 * s2)] * 2)
    assert r2.average["w"].tolist() == pytest.approx([1 / s2 + 1] * 2)
    # ||w2 - w1|| = ||d2|| = sqrt2 * 5 / (2 sqrt2) = 2.5, larger than beta E = 2: momentum adds.
    assert r2.server_step == pytest.approx(2.5)


def test_fednnnn_momentum_is_eq10_accumulation():
    # d2 = gamma d1 + step2 where step2 is the Norm-Norm step of round 2 alone (eq. 12).
    gamma, beta = 0.8, 0.7
    nnnn, nn_only = A.fednnnn(beta=beta, gamma=gamma), A.normnorm(beta=beta)
    p0 = w(0.0, 0.0)
    d_round2 = stacked([3.0, 1.0], [-1.0, 2.0])
    r1 = run_round(nnnn, p0, None, STD_DELTAS)
    r2 = run_round(nnnn, r1.sent, r1.state, d_round2)
    d1 = r1.sent["w"] - p0["w"]
    step2 = run_round(nn_only, r1.sent, None, d_round2).sent["w"] - r1.sent["w"]
    assert torch.allclose(r2.sent["w"] - r1.sent["w"], gamma * d1 + step2)


def test_the_reduce_forms_the_average_model():
    # The reduce slot: the average model is w_t + reduce(dw, weights); here a reduce that keeps
    # client 2's update.  N and E keep the base weights whatever the reduce.
    agg = dataclasses.replace(A.fedavg(), reduce=lambda stacked, weights, layers: {k: v[1] for k, v in stacked.items()})
    out = run_round(agg, w(0.0, 0.0), None, STD_DELTAS)
    assert out.average["w"].tolist() == [0.0, 1.0] and out.sent["w"].tolist() == [0.0, 1.0]
    assert out.stats.N == pytest.approx(SQRT_0625, rel=1e-12) and out.stats.E == pytest.approx(1.0, rel=1e-12)
    assert A.fedavg().reduce is R.mean  # the default: the weighted mean (eq. 3)


def test_evaluate_option():
    assert A.fednnnn(evaluate="sent").evaluate == "sent"
    assert A.normnorm(evaluate="sent").evaluate == "sent"
    assert A.momentum(evaluate="sent").evaluate == "sent"
    assert A.fednnnn().evaluate == "average"


# ----------------------------------------------------------------------------- invariants

NAMES = sorted(p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml"))


@functools.cache
def build(name):
    """The aggregator ``fedrun aggregator=<name>`` runs (immutable, so shared between tests)."""
    return instantiate(compose([f"aggregator={name}"]).aggregator)


def random_round(m, seed):
    g = torch.Generator().manual_seed(seed)
    params = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)}
    deltas = {k: torch.randn(m, *v.shape, generator=g) for k, v in params.items()}
    n = torch.randint(1, 50, (m,), generator=g)
    lays = [Layer("a", "fc", ("a", "b"))]
    return params, deltas, n, lays


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m,seed", [(2, 0), (7, 1), (30, 2)])
def test_proposition1_N_le_E(name, m, seed):
    agg = build(name)
    params, deltas, n, lays = random_round(m, seed)
    try:
        out = aggregate(agg, params, deltas, n, lays)
    except ConfigError as e:  # a method that needs more clients a round (Krum: m > 2f + 2) says so in one line
        assert m == 2 and e.setting.startswith("aggregator.") and "\n" not in str(e)
        return
    assert out.stats.N <= out.stats.E * (1 + 1e-12)
    assert out.stats.N < out.stats.E  # random directions: strictly less
    assert out.weights.sum().item() == pytest.approx(1.0)


def test_N_equals_E_with_one_client():
    params, deltas, n, lays = random_round(1, 3)
    stats = nwda(deltas, base_rule("examples").base(n), lays)
    # float32 updates: N is the norm of a float32 mean, E a float64 sum of float32 squares.
    assert stats.N == pytest.approx(stats.E, rel=1e-6)
    assert stats.client_norms[0].item() == pytest.approx(stats.E, rel=1e-12)


def test_N_equals_E_when_all_clients_agree():
    g = torch.Generator().manual_seed(4)
    one = torch.randn(5, generator=g)
    deltas = {"x": one.expand(6, 5).clone()}
    stats = nwda(deltas, base_rule("examples").base(torch.arange(1, 7)), [Layer("x", "fc", ("x",))])
    assert stats.N == pytest.approx(stats.E, rel=1e-6)
    assert stats.N == pytest.approx(one.norm().item(), rel=1e-6)


@pytest.mark.parametrize("name", ["normnorm", "fednnnn"])
def test_opposite_updates_skip_round(name):
    """N = 0 (two opposite updates with equal weights): w_t and the momentum state are kept."""
    agg = getattr(A, name)()
    p0 = w(0.0, 0.0)
    r1 = run_round(agg, p0, None, STD_DELTAS)  # state with a non-zero d for fednnnn
    r2 = run_round(agg, r1.sent, r1.state, stacked([1.0, -2.0], [-1.0, 2.0]), n=(5, 5))
    assert r2.stats.N == 0 and r2.stats.E == pytest.approx(math.sqrt(5))
    assert r2.skipped
    assert torch.equal(r2.sent["w"], r1.sent["w"])
    assert r2.server_step == 0
    assert r2.state is r1.state or _state_equal(r2.state, r1.state)
    if name == "fednnnn":
        # momentum keeps d1; the round after behaves as if the skipped round had not happened.
        r3a = run_round(agg, r2.sent, r2.state, STD_DELTAS)
        r3b = run_round(agg, r1.sent, r1.state, STD_DELTAS)
        assert torch.allclose(r3a.sent["w"], r3b.sent["w"])


def test_nearly_opposite_updates_skip_below_eps():
    # dw = [1, 0], [-1, 1e-9]: mean [0, 5e-10], N = 5e-10 <= 1e-6 * E (E ~ 1): skipped.
    agg = A.normnorm(beta=1.0)
    out = run_round(agg, w(0.0, 0.0), None, stacked([1.0, 0.0], [-1.0, 1e-9]), n=(1, 1))
    assert out.skipped and torch.equal(out.sent["w"], torch.zeros(2, dtype=torch.float64))
    # FedAvg never skips: it moves by the tiny mean.
    out = run_round(A.fedavg(), w(0.0, 0.0), None, stacked([1.0, 0.0], [-1.0, 1e-9]), n=(1, 1))
    assert not out.skipped and out.sent["w"][1].item() == pytest.approx(5e-10)


def _state_equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_overflowing_norms_are_not_a_skipped_round():
    agg = A.normnorm(beta=1.0)
    params = {"w": torch.zeros(2)}
    deltas = {"w": torch.tensor([[3e19, 0.0], [0.0, 3e19]])}  # finite float32 values
    try:
        out = run_round(agg, params, None, deltas, n=(1, 1))
    except DivergenceError:
        return
    assert not out.skipped
    assert math.isfinite(out.stats.N) and math.isfinite(out.stats.E)


# ----------------------------------------------------------------------------- BatchNorm buffers

class LinBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.bn = nn.BatchNorm1d(2)


def test_batchnorm_buffers_weighted_and_excluded_from_norms():
    model = LinBN()
    lays = layers(model)
    assert [(l.name, l.type) for l in lays] == [("fc", "fc"), ("bn", "norm")]
    params, buffers = split_state(model)
    assert set(buffers) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    g = torch.Generator().manual_seed(0)
    deltas = {k: torch.randn(2, *v.shape, generator=g) for k, v in params.items()}
    stacked_buf = {
        "bn.running_mean": torch.tensor([[0.0, 0.0], [4.0, 8.0]]),
        "bn.running_var": torch.tensor([[1.0, 1.0], [5.0, 9.0]]),
        "bn.num_batches_tracked": torch.tensor([3, 5]),
    }
    agg = A.fedavg()
    out = aggregate(agg, params, deltas, torch.tensor([1, 3]), lays, buffers=stacked_buf)
    # p = [0.25, 0.75]: running_mean = 0.75 * [4, 8] = [3, 6]; running_var = 0.25 + 0.75 [5, 9] = [4, 7]
    assert out.buffers["bn.running_mean"].tolist() == pytest.approx([3.0, 6.0])
    assert out.buffers["bn.running_var"].tolist() == pytest.approx([4.0, 7.0])
    assert out.buffers["bn.num_batches_tracked"].item() == 5  # integer counter: the max
    assert set(out.sent) == set(params)  # buffers are not parameters of the step
    # Huge buffers change nothing in N, E or the server step.
    huge = {k: (v * 1000 if v.is_floating_point() else v) for k, v in stacked_buf.items()}
    out2 = aggregate(agg, params, deltas, torch.tensor([1, 3]), lays, buffers=huge)
    assert (out2.stats.N, out2.stats.E, out2.server_step) == (out.stats.N, out.stats.E, out.server_step)
    # ... and N/E equal the norms of the parameter deltas alone.
    flat = torch.cat([deltas[k].flatten(1) for k in params], 1).double()
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    assert out.stats.N == pytest.approx((p @ flat).norm().item(), rel=1e-6)
    assert out.stats.E == pytest.approx((p @ flat.norm(dim=1)).item(), rel=1e-6)


# ----------------------------------------------------------------------------- per layer

def _three_layer_round(m=5, seed=7):
    g = torch.Generator().manual_seed(seed)
    shapes = {"c.weight": (4, 3), "c.bias": (4,), "f1.weight": (6, 4), "f1.bias": (6,), "f2.weight": (2, 6)}
    deltas = {k: torch.randn(m, *s, generator=g) for k, s in shapes.items()}
    lays = [Layer("c", "conv", ("c.weight", "c.bias")), Layer("f1", "fc", ("f1.weight", "f1.bias")),
            Layer("f2", "fc", ("f2.weight",))]
    weights = base_rule("examples").base(torch.randint(1, 20, (m,), generator=g))
    return deltas, weights, lays


def test_layer_norms_recombine_to_model_norms():
    deltas, weights, lays = _three_layer_round()
    s = nwda(deltas, weights, lays)
    assert s.layer_N.shape == (3,) and s.layer_E.shape == (3,)
    assert s.N == pytest.approx(s.layer_N.pow(2).sum().sqrt().item(), rel=1e-12)
    assert s.E <= s.layer_E.sum().item() + 1e-12  # ||x|| <= sum_l ||x_l||
    assert s.E >= s.layer_E.pow(2).sum().sqrt().item() - 1e-12  # sum_k p_k ||.|| is a norm too
    assert bool((s.layer_N <= s.layer_E + 1e-12).all())  # Proposition 1 per layer
    # client norms: sqrt of the row sums of the [m, L] table.
    assert torch.allclose(s.client_norms, s.client_sq.sum(1).sqrt())
    assert s.E == pytest.approx(float(weights @ s.client_norms), rel=1e-12)


def test_normstats_group():
    deltas, weights, lays = _three_layer_round()
    s = nwda(deltas, weights, lays)
    assert s.group(torch.tensor([True, True, True]), weights) == pytest.approx((s.N, s.E), rel=1e-12)
    n_c, e_c = s.group(torch.tensor([True, False, False]), weights)
    assert (n_c, e_c) == pytest.approx((s.layer_N[0].item(), s.layer_E[0].item()), rel=1e-12)
    # FC group of two layers: N is the root of the sum of squares; E is recomputed from client norms.
    n_fc, e_fc = s.group(torch.tensor([False, True, True]), weights)
    assert n_fc == pytest.approx(s.layer_N[1:].pow(2).sum().sqrt().item(), rel=1e-12)
    fc_flat = torch.cat([deltas[k].flatten(1) for k in ("f1.weight", "f1.bias", "f2.weight")], 1).double()
    assert e_fc == pytest.approx(float(weights @ fc_flat.norm(dim=1)), rel=1e-6)
    assert n_fc <= e_fc <= s.layer_E[1:].sum().item() + 1e-12


def test_step_layer_norms_match_normnorm_scale():
    # Norm-Norm scales every layer by the same factor beta E / N, so per-layer steps are layer_N * that.
    deltas, weights, lays = _three_layer_round()
    params = {k: torch.zeros(v.shape[1:]) for k, v in deltas.items()}
    n = (weights * 1000).round().long()
    agg = A.normnorm(beta=0.8)
    out = aggregate(agg, params, deltas, n, lays)
    scale = 0.8 * out.stats.E / out.stats.N
    assert torch.allclose(out.step_layer_norms, out.stats.layer_N * scale, rtol=1e-5)
    assert out.server_step == pytest.approx(0.8 * out.stats.E, rel=1e-5)


# ----------------------------------------------------------------------------- transforms

def _stats(N, E):
    z = torch.zeros(1, dtype=torch.float64)
    return NormStats(N=N, E=E, layer_N=z, layer_E=z, client_norms=z, client_sq=z[None], client_dot=z[None])


def test_chain_order_matters():
    # d1 = [1, 0] in the momentum state; this round's mean step [0, 1], N = 0.5, E = 1, beta = 1, gamma = 0.5.
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    step = {"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}
    stats = _stats(0.5, 1.0)
    norm_then_mom = T.chain(T.normalize_norm(1.0), T.momentum(0.5))
    mom_then_norm = T.chain(T.momentum(0.5), T.normalize_norm(1.0))
    s_a = norm_then_mom.init(params)
    s_a[1]["d"]["w"] = torch.tensor([1.0, 0.0], dtype=torch.float64)
    s_b = mom_then_norm.init(params)
    s_b[0]["d"]["w"] = torch.tensor([1.0, 0.0], dtype=torch.float64)
    # normalize then momentum: 0.5 [1, 0] + 2 [0, 1] = [0.5, 2]  (eq. 12)
    out_a, new_a = norm_then_mom.update(step, s_a, stats)
    assert out_a["w"].tolist() == [0.5, 2.0]
    assert new_a[1]["d"]["w"].tolist() == [0.5, 2.0]
    # momentum then normalize: 2 * (0.5 [1, 0] + [0, 1]) = [1, 2]; momentum state [0.5, 1]
    out_b, new_b = mom_then_norm.update(step, s_b, stats)
    assert out_b["w"].tolist() == [1.0, 2.0]
    assert new_b[0]["d"]["w"].tolist() == [0.5, 1.0]


def test_chain_skip_returns_previous_states():
    params = {"w": torch.zeros(2)}
    ch = T.chain(T.momentum(0.5), T.normalize_norm(1.0))  # momentum first: its update is discarded
    states = ch.init(params)
    out, new = ch.update({"w": torch.ones(2)}, states, _stats(0.0, 1.0))
    assert out is None and new is states
    assert torch.equal(new[0]["d"]["w"], torch.zeros(2))


def test_identity_transform():
    step = {"w": torch.tensor([1.0, 2.0])}
    out, state = T.identity().update(step, {}, _stats(1.0, 2.0))
    assert out is step and state == {}


# ----------------------------------------------------------------------------- bad values

@pytest.mark.parametrize("make,setting", [
    (lambda: A.normnorm(beta=0), "aggregator.beta"),
    (lambda: A.normnorm(beta=-1), "aggregator.beta"),
    (lambda: A.fednnnn(beta=0.0), "aggregator.beta"),
    (lambda: A.fednnnn(gamma=1.0), "aggregator.gamma"),
    (lambda: A.fednnnn(gamma=-0.1), "aggregator.gamma"),
    (lambda: A.momentum(gamma=1.5), "aggregator.gamma"),
    (lambda: A.fedprox(mu=-0.01), "aggregator.mu"),
    (lambda: A.fedavg(weighting="foo"), "aggregator.weighting"),
    (lambda: A.fednnnn(weighting="foo"), "aggregator.weighting"),
    (lambda: A.normnorm(evaluate="foo"), "aggregator.evaluate"),
    (lambda: A.fednnnn(evaluate="foo"), "aggregator.evaluate"),
    (lambda: A.normnorm(eps=-1), "aggregator.eps"),
])
def test_bad_values_raise_config_error(make, setting):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.setting == setting
    assert str(info.value).startswith(setting + "=")


def test_gamma_zero_and_mu_zero_allowed():
    # The boundaries that are allowed: gamma = 0 (no memory), mu = 0 (FedAvg).
    agg = A.momentum(gamma=0.0)
    p0 = w(0.0, 0.0)
    r1 = run_round(agg, p0, None, STD_DELTAS)
    r2 = run_round(agg, r1.sent, r1.state, STD_DELTAS)
    assert r2.sent["w"].tolist() == pytest.approx([0.5, 1.5])  # = two FedAvg steps
    assert A.fedprox(mu=0.0).regularizer.mu == 0.0


def test_round_without_clients_is_an_error():
    with pytest.raises(ConfigError):
        aggregate(A.fedavg(), w(0.0, 0.0), {"w": torch.zeros(0, 2, dtype=torch.float64)},
                  torch.zeros(0, dtype=torch.long), W_LAYERS)
