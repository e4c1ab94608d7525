"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1, option II) and FedNova (Wang et al., NeurIPS
2020): hand-checked rounds, their equalities with FedAvg, both engines, resume, populations, bad
settings.

The server-side case (as in test_aggregators.py): one parameter ``w`` of two entries, ``w_t = 0``,
clients with updates ``dw = [1, 0]`` and ``[0, 1]`` and ``n = (1, 3)`` (base weights 0.25, 0.75).

The local-step case: a linear model without bias, ``logits = W x`` with ``W`` 2 x 4 starting at 0,
two clients of one sample each, one step of SGD at lr 0.5 (B = 1, E = 1).  At ``W = 0`` the softmax
is [0.5, 0.5], so the cross-entropy gradient is ``(p - e_y) x^T``:

* client 0, ``x = [1, 0, 0, 0]``, label 0: ``g_0 = [[-0.5, 0, 0, 0], [0.5, 0, 0, 0]]``;
* client 1, ``x = [0, 2, 0, 0]``, label 1: ``g_1 = [[0, 1, 0, 0], [0, -1, 0, 0]]``.
"""
from __future__ import annotations

import copy
import functools
import io
import logging
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import (RESUMABLE, TINY, aggregate, csv_without_wall, fedrun_ok, interrupted_while_recording, on_partition,
                      run_fedrun, same_run)
from equivalence import F32_RTOL, F64_RTOL, default_dtype, relative_difference

from fedrun import aggregators as A
from fedrun.harness import federated_run
from fedrun.data import partition as P
from fedrun.client.batched import BatchedEngine
from fedrun.data.preparation import prepare
from fedrun.data.datasets import synthetic
from fedrun.errors import ConfigError
from fedrun.harness.federated_run import Federation
from fedrun.models.layers import Layer
from fedrun.client.local_training import LocalTraining
from fedrun.models.nets import MLP
from fedrun.params import split_state
from fedrun.harness.recorder import TIMING_COLUMNS
from fedrun.client.regularizers import ControlVariate
from fedrun.client.sequential import SequentialEngine
from fedrun.harness.simulation import simulate

W_LAYERS = [Layer("w", "fc", ("w",))]
STD = {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)}


def w(*values) -> dict:
    return {"w": torch.tensor(values, dtype=torch.float64)}


def approx(t: torch.Tensor, expected) -> bool:
    """``t`` holds the hand-computed ``expected`` (nested lists) to float64 rounding."""
    want = torch.tensor(expected, dtype=torch.float64)
    close = t.flatten().tolist() == pytest.approx(want.flatten().tolist(), rel=1e-12, abs=1e-15)
    return t.shape == want.shape and close


# ----------------------------------------------------------------------------- SCAFFOLD, the server's side

def dense(corr: dict, num_clients: int) -> torch.Tensor:
    """Every client's c_k as one [K, ...] tensor: the kept rows, 0 for a client that has not trained."""
    kept = corr["c_k"]["w"]
    out = kept.new_zeros((num_clients, *kept.shape[1:]))
    out[corr["clients"]] = kept
    return out


def test_scaffold_two_rounds_by_hand():
    """N = 3 clients; round 1: clients 0 and 2, round 2: clients 1 and 2 (client 0 keeps its c_0).

    Round 1 (c = c_k = 0), K = (2, 4), eta_l = 0.5, so K eta_l = (1, 2):
      option II  c_0+ = 0 - 0 - [1, 0] / 1 = [-1, 0],  c_2+ = -[0, 1] / 2 = [0, -0.5];
      line 17    c = 0 + (1/3) ([-1, 0] + [0, -0.5]) = [-1/3, -1/6];
      x = 0.25 [1, 0] + 0.75 [0, 1] = [0.25, 0.75] (eta_g = 1; eta_g = 2: [0.5, 1.5]).
    Round 2's inputs c - c_k: client 1 (c_1 = 0) [-1/3, -1/6]; client 2 [-1/3, -1/6] - [0, -0.5] = [-1/3, 1/3].
    Round 2: dw_1 = [2, 0], dw_2 = [0, 0.5], K = 1, eta_l = 0.5:
      c_1+ = 0 - [-1/3, -1/6] - [4, 0] = [-11/3, 1/6];
      c_2+ = [0, -0.5] - [-1/3, -1/6] - [0, 1] = [1/3, -4/3];
      c = [-1/3, -1/6] + (1/3) ([-11/3, 1/6] + [1/3, -5/6]) = [-13/9, -7/18].
    """
    agg = A.scaffold()
    r1 = aggregate(agg, w(0.0, 0.0), STD, (1, 3), W_LAYERS, clients=[0, 2], steps=(2, 4), lr=0.5, num_clients=3)
    assert approx(r1.sent["w"], [0.25, 0.75]) and torch.equal(r1.sent["w"], r1.average["w"])
    corr = r1.state["correction"]
    assert approx(dense(corr, 3), [[-1.0, 0.0], [0.0, 0.0], [0.0, -0.5]])
    assert corr["clients"].tolist() == [0, 2]  # the clients that have trained keep a row, in that order
    assert approx(corr["c"]["w"], [-1 / 3, -1 / 6])
    assert approx(agg.client_inputs(r1.state, [1, 2])["w"], [[-1 / 3, -1 / 6], [-1 / 3, 1 / 3]])
    r2 = aggregate(agg, r1.sent, w_rows([2.0, 0.0], [0.0, 0.5]), (1, 1), W_LAYERS, r1.state, clients=[1, 2],
                   steps=(1, 1), lr=0.5)
    corr = r2.state["correction"]
    assert approx(dense(corr, 3), [[-1.0, 0.0], [-11 / 3, 1 / 6], [1 / 3, -4 / 3]])
    assert corr["clients"].tolist() == [0, 2, 1]
    assert approx(corr["c"]["w"], [-13 / 9, -7 / 18])
    assert approx(r2.sent["w"], [0.25 + 1.0, 0.75 + 0.25])  # equal sizes: the plain mean of the updates
    # The global step size eta_g scales the server's step only (lines 16-17).
    r1_g = aggregate(A.scaffold(eta_g=2.0), w(0.0, 0.0), STD, (1, 3), W_LAYERS, clients=[0, 2], steps=(2, 4),
                     lr=0.5, num_clients=3)
    assert approx(r1_g.sent["w"], [0.5, 1.5]) and approx(r1_g.average["w"], [0.25, 0.75])
    assert torch.equal(r1_g.state["correction"]["c"]["w"], r1.state["correction"]["c"]["w"])
    # Algorithm 1's own 1/|S| mean: weighting=uniform.
    r1_u = aggregate(A.scaffold(weighting="uniform"), w(0.0, 0.0), STD, (1, 3), W_LAYERS, clients=[0, 2],
                     steps=(2, 4), lr=0.5, num_clients=3)
    assert approx(r1_u.sent["w"], [0.5, 0.5])


def w_rows(*rows) -> dict:
    return {"w": torch.tensor(rows, dtype=torch.float64)}


def test_scaffold_state_is_data_and_survives_a_checkpoint():
    agg = A.scaffold()
    r1 = aggregate(agg, w(0.0, 0.0), STD, (1, 3), W_LAYERS, clients=[0, 2], steps=(2, 4), lr=0.5, num_clients=3)
    before = {k: v.clone() for k, v in r1.state["correction"]["c_k"].items()}
    buffer = io.BytesIO()
    torch.save(r1.state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    a = aggregate(agg, r1.sent, STD, (1, 3), W_LAYERS, r1.state, clients=[1, 0], steps=(3, 1), lr=0.5)
    b = aggregate(agg, r1.sent, STD, (1, 3), W_LAYERS, loaded, clients=[1, 0], steps=(3, 1), lr=0.5)
    for key in ("c", "c_k"):
        assert torch.equal(a.state["correction"][key]["w"], b.state["correction"][key]["w"])
    assert torch.equal(r1.state["correction"]["c_k"]["w"], before["w"])  # apply returned new tensors
    assert A.fedavg().init(w(0.0, 0.0), 3, W_LAYERS).keys() == {"server", "weighting", "layers"}  # others unchanged


# ----------------------------------------------------------------------------- SCAFFOLD, the client's side

def linear_clients(dtype=torch.float64):
    """The module docstring's model (W = 0, 2 x 4) and two one-sample clients."""
    x = torch.zeros(2, 1, 2, 2, dtype=dtype)
    x[0, 0, 0, 0] = 1.0  # flattened [1, 0, 0, 0]
    x[1, 0, 0, 1] = 2.0  # flattened [0, 2, 0, 0]
    y = torch.tensor([0, 1])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2, bias=False)).to(dtype)
    with torch.no_grad():
        model[1].weight.zero_()
    return model, x, y, [torch.tensor([0]), torch.tensor([1])]


G0 = [[-0.5, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0]]
G1 = [[0.0, 1.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0]]


@pytest.mark.parametrize("correction", ["gradient", "after_step"])
@pytest.mark.parametrize("make", [SequentialEngine, BatchedEngine])
def test_scaffold_round_on_a_linear_model_by_hand(make, correction):
    """Inputs c - c_k of 0.2 (client 0) and -0.4 (client 1) everywhere (c = 0, c_0 = -0.2, c_1 = 0.4),
    one step each, so both corrections take the same step (after_step: y = x - 0.5 g_k, then
    y -= 0.5 (c - c_k)) and divide by the same K_k = ||a_k||_1 = 1:

    line 10  y_k = x - 0.5 (g_k + c - c_k):
      client 0: -0.5 ([[-0.5, 0, 0, 0], [0.5, 0, 0, 0]] + 0.2) = [[0.15, -0.1, -0.1, -0.1], [-0.35, -0.1, -0.1, -0.1]]
      client 1: -0.5 ([[0, 1, 0, 0], [0, -1, 0, 0]] - 0.4) = [[0.2, -0.3, 0.2, 0.2], [0.2, 0.7, 0.2, 0.2]]
    option II, K = 1: c_k+ = c_k - c + (x - y_k) / eta_l = c_k - c + g_k + c - c_k = g_k: the gradient at x;
    c = 0 + (1/2) ((g_0 + 0.2) + (g_1 - 0.4)); x = the mean of the two updates (n = 1, 1).
    """
    model, x, y, idx = linear_clients()
    agg = A.scaffold(correction=correction)
    local = LocalTraining(epochs=1, batch_size=1, lr=0.5)
    params, buffers = split_state(model)
    state = agg.init({"1.weight": params["1.weight"]}, 2, [Layer("fc", "fc", ("1.weight",))])
    w0 = params["1.weight"]  # clients 0 and 1 have trained before: their kept c_k
    state["correction"] = {**state["correction"], "clients": torch.tensor([0, 1]),
                           "c_k": {"1.weight": torch.stack([torch.full_like(w0, -0.2), torch.full_like(w0, 0.4)])}}
    inputs = agg.client_inputs(state, [0, 1])
    with default_dtype(torch.float64):
        engine = on_partition(make, model, x, y, idx, local, agg.regularizer, 0)
        res = engine.train(params, buffers, [0, 1], 1, None, local.lr, None, inputs)
    d0 = [[0.15, -0.1, -0.1, -0.1], [-0.35, -0.1, -0.1, -0.1]]
    d1 = [[0.2, -0.3, 0.2, 0.2], [0.2, 0.7, 0.2, 0.2]]
    assert approx(res.deltas["1.weight"], [d0, d1])
    assert res.steps.tolist() == [1, 1] and res.lr.tolist() == [0.5, 0.5]
    outcome, new = agg.apply(state, params, res)
    c_k = new["correction"]["c_k"]["1.weight"]
    assert approx(c_k, [G0, G1])
    # c = (1/2) ((g_0 + 0.2) + (g_1 - 0.4)) = (g_0 + g_1) / 2 - 0.1
    assert approx(new["correction"]["c"]["1.weight"], [[-0.35, 0.4, -0.1, -0.1], [0.15, -0.6, -0.1, -0.1]])
    # x = (d_0 + d_1) / 2
    assert approx(outcome.sent["1.weight"], [[0.175, -0.2, 0.05, 0.05], [-0.075, 0.3, 0.05, 0.05]])
    # reg_loss: the mean over the steps of <c - c_k, y - x> at the step's start (y = x: 0).
    assert res.extras["reg_loss"].tolist() == [0.0, 0.0]


def niidbench_scaffold_client(model, x, y, c, c_k, epochs, lr, rho, wd):
    """NIID-Bench's ``train_net_scaffold`` (experiments.py), written out again: ``torch.optim.SGD``
    with momentum and weight decay on the plain loss, then ``w -= lr (c - c_k)`` after every step;
    option II over the counted steps: ``c_k+ = c_k - c + (x - y) / (cnt lr)``.  Returns ``y - x``
    and ``c_k+``."""
    net = copy.deepcopy(model)
    start = {k: v.detach().clone() for k, v in net.named_parameters()}
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=rho, weight_decay=wd)
    cnt = 0
    for _ in range(epochs):  # one batch an epoch: the client's whole data
        opt.zero_grad()
        # The loss in float32, as fedrun's engines take it (for bf16 autocast): the only numerical
        # difference left, so the comparison can be to float64 rounding.
        torch.nn.functional.cross_entropy(net(x).float(), y).backward()
        opt.step()
        with torch.no_grad():
            for k, p in net.named_parameters():
                p -= lr * (c[k] - c_k[k])
        cnt += 1
    delta = {k: p.detach() - start[k] for k, p in net.named_parameters()}
    return delta, {k: c_k[k] - c[k] - delta[k] / (cnt * lr) for k in delta}


@pytest.mark.parametrize("make", [SequentialEngine, BatchedEngine])
def test_scaffold_after_step_is_niidbenchs_client_loop(make):
    """``aggregator.correction=after_step`` under momentum 0.9 and weight decay, 4 steps: each
    client's update and its new control variate equal NIID-Bench's loop, written out above (float64,
    one batch an epoch, so the batch order does not matter); the ``gradient`` reading differs."""
    torch.manual_seed(0)
    dtype, sizes = torch.float64, (5, 3)
    x, y = torch.randn(8, 1, 4, 4, dtype=dtype), torch.randint(0, 3, (8,))
    idx = [torch.arange(0, 5), torch.arange(5, 8)]
    model = MLP(in_channels=1, image_size=4, num_classes=3, hidden=[6]).to(dtype)
    reference = copy.deepcopy(model)  # w_t: the engines overwrite the model they train
    params, buffers = split_state(model)
    c = {k: 0.1 * torch.randn(v.shape, dtype=dtype) for k, v in params.items()}
    c_k = {k: 0.1 * torch.randn(2, *v.shape, dtype=dtype) for k, v in params.items()}
    local = LocalTraining(epochs=4, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-5)
    agg = A.scaffold(correction="after_step")
    state = {"c": c, "c_k": c_k}
    inputs = {k: c[k].unsqueeze(0) - c_k[k] for k in c}
    with default_dtype(dtype):
        res = on_partition(make, model, x, y, idx, local, agg.regularizer, 0).train(
            params, buffers, [0, 1], 1, None, local.lr, None, inputs)
        other = on_partition(make, model, x, y, idx, local, ControlVariate("gradient"), 0).train(
            params, buffers, [0, 1], 1, None, local.lr, None, inputs)
    new = agg.correction.update(state, res)["c_k"]
    for j in range(2):
        want_delta, want_c = niidbench_scaffold_client(reference, x[idx[j]], y[idx[j]], c,
                                                       {k: v[j] for k, v in c_k.items()}, 4, 0.05, 0.9, 1e-5)
        for k in params:
            torch.testing.assert_close(res.deltas[k][j], want_delta[k], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(new[k][j], want_c[k], rtol=1e-9, atol=1e-10)
    assert res.steps.tolist() == [4, 4]
    assert relative_difference(res.deltas, other.deltas) > 1e-3  # the two readings part from step 2 on


def test_control_variate_without_inputs_is_no_correction():
    reg = ControlVariate()
    state = reg.init({"w": torch.zeros(2)}, 3, None)
    pen = reg.penalty(state, {"w": torch.ones(3, 2)}, {"w": torch.zeros(2)}, torch.arange(3))
    assert pen.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("correction", ["gradient", "after_step"])
def test_both_engines_agree_with_control_variates_and_chunks(correction):
    """Random inputs c - c_k, unbalanced clients, stragglers' epochs, momentum, chunks of 2 that
    cut the round (a regularizer's rows index its chunk's clients): the engines agree in float64 to
    rounding and in float32 within the usual bound, for either correction."""
    for dtype, bound in ((torch.float64, F64_RTOL), (torch.float32, F32_RTOL)):
        torch.manual_seed(0)
        sizes, n = (13, 40, 7, 25), 85
        x, y = torch.randn(n, 1, 6, 6).to(dtype), torch.randint(0, 10, (n,))
        bounds = np.cumsum([0, *sizes])
        idx = [torch.arange(bounds[i], bounds[i + 1]) for i in range(4)]
        model = MLP(in_channels=1, image_size=6, num_classes=10, hidden=[8]).to(dtype)
        local = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.5)
        with default_dtype(dtype):
            params, buffers = split_state(model)
            inputs = {k: 0.3 * torch.randn(4, *v.shape, dtype=dtype) for k, v in params.items()}
            seq = on_partition(SequentialEngine, model, x, y, idx, local, ControlVariate(correction), 0).train(
                params, buffers, [0, 1, 2, 3], 3, [2, 1, 2, 2], local.lr, None, inputs)
            bat = on_partition(BatchedEngine, model, x, y, idx, local, ControlVariate(correction), 0, 2).train(
                params, buffers, [0, 1, 2, 3], 3, [2, 1, 2, 2], local.lr, None, inputs)
            plain = on_partition(SequentialEngine, model, x, y, idx, local, None, 0).train(
                params, buffers, [0, 1, 2, 3], 3, [2, 1, 2, 2])
        assert relative_difference(seq.deltas, bat.deltas) < bound
        assert relative_difference(seq.deltas, plain.deltas) > 0.01  # the correction did act
        torch.testing.assert_close(seq.extras["reg_loss"], bat.extras["reg_loss"], rtol=1e-4, atol=1e-6)
        assert torch.equal(seq.effective_steps, bat.effective_steps)


# ----------------------------------------------------------------------------- FedNova

def test_fednova_round_by_hand():
    """dw_0 = [1, 0], dw_1 = [0, 1], p = (0.25, 0.75), tau = (2, 4).

    Plain SGD, ||a|| = tau: tau_eff = 0.25 * 2 + 0.75 * 4 = 3.5; weights tau_eff p_k / tau_k =
    (3.5 * 0.25 / 2, 3.5 * 0.75 / 4) = (0.4375, 0.65625), so w = [0.4375, 0.65625] (FedAvg: [0.25, 0.75]).
    Momentum 0.5: ||a||_1 = sum_j (1 - 0.5^j) / 0.5 = 1 + 1.5 = 2.5 (2 steps) and 1 + 1.5 + 1.75 + 1.875
    = 6.125 (4 steps); tau_eff = 0.625 + 4.59375 = 5.21875; weights (0.521875, 3.9140625 / 6.125).
    """
    out = aggregate(A.fednova(), w(0.0, 0.0), STD, (1, 3), W_LAYERS, steps=(2, 4))
    assert approx(out.weights, [0.4375, 0.65625]) and approx(out.average["w"], [0.4375, 0.65625])
    assert torch.equal(out.sent["w"], out.average["w"])
    assert out.stats_weights.tolist() == [0.25, 0.75]  # N and E keep the base weights
    a = LocalTraining(momentum=0.5).effective_steps(torch.tensor([2, 4]))
    assert a.tolist() == [2.5, 6.125]
    from fedrun.client.local_training import ClientResults

    res = ClientResults([0, 1], STD, {}, torch.tensor([1, 3]), torch.zeros(2, dtype=torch.float64),
                        torch.tensor([2, 4]), torch.ones(2, dtype=torch.long), effective_steps=a)
    agg = A.fednova()
    out, _ = agg.apply(agg.init(w(0.0, 0.0), 2, W_LAYERS), w(0.0, 0.0), res)
    assert approx(out.average["w"], [0.521875, 3.9140625 / 6.125])


def test_effective_steps_by_hand():
    # Nesterov: step k moves (1 - rho^(k+1)) / (1 - rho) of a constant gradient: 1.5 + 1.75 = 3.25 (rho 0.5).
    assert LocalTraining(momentum=0.5, nesterov=True).effective_steps(torch.tensor([2])).tolist() == [3.25]
    assert LocalTraining().effective_steps(torch.tensor([3, 7])).tolist() == [3.0, 7.0]
    # The momentum coefficients are what an update is worth: SGD with momentum 0.9 from a zero buffer,
    # a constant gradient g, K steps: y - x = -lr ||a||_1 g.
    local = LocalTraining(lr=0.1, momentum=0.9)
    opt, p = local.make_optimizer(), [torch.zeros(1, dtype=torch.float64)]
    state = opt.init(p)
    for _ in range(5):
        opt.step(p, [torch.ones(1, dtype=torch.float64)], state)
    assert p[0].item() == pytest.approx(-0.1 * local.effective_steps(torch.tensor([5])).item(), rel=1e-12)


def test_fednova_with_equal_steps_is_fedavg_exactly():
    params = w(0.3, -0.2)
    for n in ((1, 3), (5, 5)):
        nova = aggregate(A.fednova(), params, STD, n, W_LAYERS, steps=(7, 7))
        avg = aggregate(A.fedavg(), params, STD, n, W_LAYERS, steps=(7, 7))
        assert torch.equal(nova.weights, avg.weights) and torch.equal(nova.sent["w"], avg.sent["w"])


def test_fednova_removes_fedavgs_objective_inconsistency_on_quadratics():
    """Wang et al.'s quadratic case: client i minimizes F_i(x) = (x - e_i)^2 / 2, e = (0, 1),
    p = (0.5, 0.5), with tau = (2, 10) steps of gradient descent at lr 0.01 a round.  tau steps
    from x end at e_i + 0.99^tau (x - e_i), so dx_i = c_i (e_i - x), c_i = 1 - 0.99^tau_i =
    (0.0199, 0.0956179...).  The rounds' fixed points:

    * FedAvg: sum_i p_i c_i (e_i - x) = 0, x = c_1 / (c_0 + c_1) = 0.82773: the minimizer of the
      surrogate sum p_i tau_i F_i (10/12 = 0.8333 as lr -> 0), not of the true objective;
    * FedNova: sum_i p_i (c_i / tau_i) (e_i - x) = 0, x = 0.0095618 / (0.00995 + 0.0095618) = 0.49005:
      the true objective's minimizer 0.5 (exactly, as lr -> 0).
    """
    e, p, tau, lr = torch.tensor([[0.0], [1.0]], dtype=torch.float64), (1, 1), (2, 10), 0.01
    c = 1 - (1 - lr) ** torch.tensor(tau, dtype=torch.float64)
    limits = {}
    for name, agg in (("fedavg", A.fedavg()), ("fednova", A.fednova())):
        x, state = w(0.25), None
        for _ in range(600):  # each round contracts x - x* by about 0.94
            out = aggregate(agg, x, {"w": c[:, None] * (e - x["w"])}, p, W_LAYERS, state=state, steps=tau)
            x, state = out.sent, out.state
        limits[name] = x["w"].item()
    assert limits["fedavg"] == pytest.approx((c[1] / c.sum()).item(), rel=1e-9)
    assert limits["fedavg"] == pytest.approx(0.82773, abs=1e-5)
    nova = c / torch.tensor(tau, dtype=torch.float64)
    assert limits["fednova"] == pytest.approx((nova[1] / nova.sum()).item(), rel=1e-9)
    assert limits["fednova"] == pytest.approx(0.49005, abs=1e-5)
    assert abs(limits["fednova"] - 0.5) < 0.01 < abs(limits["fedavg"] - 0.5)


# ----------------------------------------------------------------------------- whole runs

@pytest.fixture(scope="module")
def data():
    return prepare(synthetic(num_train=240, num_test=60, image_size=8, noise=0.5, seed=1), None, None)


def run(tmp_path, data, aggregator, engine=SequentialEngine, partition=P.iid, rounds=3, local=None):
    """A whole run of 6 clients, 3 a round, on the module's synthetic data; its CSVs."""
    simulate(tmp_path, data, lambda: MLP(image_size=8, hidden=[16]), partition, aggregator,
             local or LocalTraining(epochs=1, batch_size=20, lr=0.05),
             Federation(rounds=rounds, num_clients=6, client_fraction=0.5), make_engine=engine, progress=False)
    return {name: pd.read_csv(tmp_path / f"{name}.csv") for name in ("rounds", "layers", "clients")}


def test_fednova_equals_fedavg_when_every_client_takes_the_same_steps(tmp_path, data):
    # IID with equal sizes: 240 / 6 = 40 samples, B = 20, E = 1: 2 steps each, every round.
    nova, avg = run(tmp_path / "nova", data, A.fednova()), run(tmp_path / "avg", data, A.fedavg())
    assert (nova["clients"]["steps"] == 2).all()
    for name in ("rounds", "layers", "clients"):
        assert csv_without_wall(tmp_path / "nova" / f"{name}.csv") == csv_without_wall(tmp_path / "avg" / f"{name}.csv")
    # Unequal sizes (power law): the steps differ and so does FedNova.
    skew = functools.partial(P.iid, sizes="powerlaw")
    nova, avg = run(tmp_path / "nova2", data, A.fednova(), partition=skew), run(tmp_path / "avg2", data, A.fedavg(),
                                                                                 partition=skew)
    assert nova["clients"]["steps"].nunique() > 1
    assert not np.allclose(nova["rounds"]["test_loss"], avg["rounds"]["test_loss"])
    weights = nova["clients"].groupby("round")["weight"].sum()
    assert (weights >= 1 - 1e-9).all() and (weights > 1 + 1e-6).any()  # tau_eff sum p_k / ||a_k|| >= 1


def test_scaffold_first_round_is_fedavgs(tmp_path, data):
    scaffold, avg = run(tmp_path / "s", data, A.scaffold()), run(tmp_path / "a", data, A.fedavg())
    # The same round 1, but SCAFFOLD sends twice the bytes (its control variates): not compared here.
    first = lambda df: df[df["round"] == 1].drop(columns=[c for c in (*TIMING_COLUMNS, "bytes_down", "bytes_up",  # noqa: E731
                                                                      "bytes_total") if c in df])
    pd.testing.assert_frame_equal(first(scaffold["rounds"]), first(avg["rounds"]))
    pd.testing.assert_frame_equal(first(scaffold["layers"]), first(avg["layers"]))
    cols = ["client", "weight", "update_norm", "loss", "steps"]
    pd.testing.assert_frame_equal(first(scaffold["clients"])[cols], first(avg["clients"])[cols])
    assert (first(scaffold["clients"])["reg_loss"] == 0).all()
    later = lambda df: df[df["round"] > 1]["test_loss"].to_numpy()  # noqa: E731
    assert not np.array_equal(later(scaffold["rounds"]), later(avg["rounds"]))  # then the correction acts


@pytest.mark.parametrize("aggregator", [A.scaffold(), A.fednova(), A.scaffold(eta_g=0.5, weighting="uniform"),
                                       A.scaffold(correction="after_step")],
                         ids=["scaffold", "fednova", "scaffold-eta", "scaffold-after-step"])
def test_whole_runs_match_in_both_engines(tmp_path, data, aggregator):
    local = LocalTraining(epochs=2, batch_size=10, lr=0.02, momentum=0.5)
    skew = functools.partial(P.iid, sizes="powerlaw")
    seq = run(tmp_path / "seq", data, aggregator, local=local, partition=skew, rounds=4)
    bat = run(tmp_path / "bat", data, aggregator, BatchedEngine, local=local, partition=skew, rounds=4)
    for col in ("test_acc", "N", "E", "server_step", "train_loss", "test_loss"):
        np.testing.assert_allclose(seq["rounds"][col], bat["rounds"][col], rtol=1e-3, atol=2e-3, err_msg=col)
    np.testing.assert_allclose(seq["clients"]["weight"], bat["clients"]["weight"], rtol=1e-9)


def test_scaffold_resume_after_ctrl_c_is_byte_exact(tmp_path, data, monkeypatch):
    """Ctrl-C while round 3 is recorded: the checkpoint of round 2 holds the control variates of
    the clients sampled so far (the others' are still 0); the resume ends with an uninterrupted
    run's CSVs."""
    local = LocalTraining(epochs=1, batch_size=10, lr=0.05, momentum=0.5)
    go = functools.partial(simulate, data=data, make_model=lambda: MLP(image_size=8, hidden=[16]),
                           partition=functools.partial(P.classes, classes_per_client=2), aggregator=A.scaffold(),
                           local=local, federation=Federation(rounds=5, num_clients=8, client_fraction=0.25),
                           progress=False)
    go(tmp_path / "whole")
    interrupted_while_recording(monkeypatch, 3, lambda: go(tmp_path / "cut"))
    ckpt = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 2
    corr = ckpt["aggregator"]["correction"]
    kept = corr["clients"].tolist()
    assert 0 < len(kept) <= 4 and len(set(kept)) == len(kept)  # the 2 x 2 clients sampled so far, each once
    assert all(v.shape[0] == len(kept) for v in corr["c_k"].values()) and int(corr["num_clients"]) == 8
    go(tmp_path / "cut", resume=True)
    same_run(tmp_path / "whole", tmp_path / "cut")
    end = [torch.load(tmp_path / d / "checkpoint.pt", weights_only=True)["aggregator"]["correction"] for d in
           ("whole", "cut")]
    assert all(torch.equal(end[0][key][k], end[1][key][k]) for key in ("c", "c_k") for k in end[0]["c"])
    assert torch.equal(end[0]["clients"], end[1]["clients"])


def test_scaffold_resume_after_sigkill_from_the_cli(tmp_path):
    import signal

    from conftest import start_fedrun, wait_for_rows

    args = [*RESUMABLE, "aggregator=scaffold", "hyperparams.momentum=0.5"]
    fedrun_ok([*args, f"hydra.run.dir={tmp_path / 'whole'}"], tmp_path)
    proc = start_fedrun([*args, f"hydra.run.dir={tmp_path / 'cut'}"], tmp_path)
    wait_for_rows(proc, tmp_path / "cut" / "rounds.csv", 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    fedrun_ok([*args, f"hydra.run.dir={tmp_path / 'cut'}", "resume=true"], tmp_path)
    same_run(tmp_path / "whole", tmp_path / "cut")


def test_large_state_is_logged_at_the_start(tmp_path, data, monkeypatch, caplog):
    monkeypatch.setattr(federated_run, "STATE_NOTE_BYTES", 0)
    with caplog.at_level(logging.INFO, logger="fedrun"):
        run(tmp_path / "s", data, A.scaffold(), rounds=1)
    params = sum(p.numel() for p in MLP(image_size=8, hidden=[16]).parameters())
    assert (f"scaffold: each client keeps a control variate c_k once it has trained, {4 * params / 1024:.1f} KiB "
            "a client") in caplog.text
    state = A.scaffold().init({"w": torch.zeros(params)}, 6, [Layer("w", "fc", ("w",))])
    # c, and no client's c_k before it trains: the state grows with the clients that have trained, not K.
    assert federated_run.tensor_bytes(state) == 4 * params + 8


def test_scaffold_reads_a_checkpoint_that_kept_every_clients_row():
    """A state written when c_k was kept for all K clients (K x d, no "clients") goes on as it was:
    the same inputs and the same next state as the kept-rows store holding the same values."""
    agg = A.scaffold()
    r1 = aggregate(agg, w(0.0, 0.0), STD, (1, 3), W_LAYERS, clients=[0, 2], steps=(2, 4), lr=0.5, num_clients=3)
    corr = r1.state["correction"]
    old = {**r1.state, "correction": {"c": corr["c"], "c_k": {"w": dense(corr, 3)}}}
    assert torch.equal(agg.client_inputs(old, [1, 2])["w"], agg.client_inputs(r1.state, [1, 2])["w"])
    a = aggregate(agg, r1.sent, w_rows([2.0, 0.0], [0.0, 0.5]), (1, 1), W_LAYERS, r1.state, clients=[1, 2],
                  steps=(1, 1), lr=0.5)
    b = aggregate(agg, r1.sent, w_rows([2.0, 0.0], [0.0, 0.5]), (1, 1), W_LAYERS, old, clients=[1, 2],
                  steps=(1, 1), lr=0.5)
    assert torch.equal(a.sent["w"], b.sent["w"]) and torch.equal(a.state["correction"]["c"]["w"], b.state["correction"]["c"]["w"])
    assert torch.equal(dense(a.state["correction"], 3), b.state["correction"]["c_k"]["w"])


# ----------------------------------------------------------------------------- settings

@pytest.mark.parametrize("eta_g", [0.0, -1.0, math.inf, math.nan])
def test_bad_global_step_size_is_refused(eta_g):
    with pytest.raises(ConfigError) as info:
        A.scaffold(eta_g=eta_g)
    assert info.value.setting == "aggregator.eta_g"


def test_an_unknown_correction_is_refused():
    with pytest.raises(ConfigError) as info:
        A.scaffold(correction="outside")
    assert info.value.setting == "aggregator.correction" and "gradient, after_step" in str(info.value)


def test_bad_settings_are_one_line_from_the_cli(tmp_path):
    bad = run_fedrun([*TINY, "aggregator=scaffold", "aggregator.eta_g=0", f"hydra.run.dir={tmp_path}/a"], tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "fedrun: error: aggregator.eta_g=0: must be a finite number > 0 (SCAFFOLD's global step size; the paper: 1)"]
    adam = run_fedrun([*TINY, "aggregator=fednova", "hyperparams.optimizer=adam", f"hydra.run.dir={tmp_path}/b"],
                      tmp_path)
    assert adam.returncode == 2 and len(adam.stderr.strip().splitlines()) == 1
    assert adam.stderr.startswith("fedrun: error: hyperparams.optimizer=adam: aggregator=fednova is defined for "
                                  "client sgd")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_adam_is_refused_by_the_library_too(tmp_path, data):
    with pytest.raises(ConfigError, match="hyperparams.optimizer"):
        run(tmp_path, data, A.scaffold(), local=LocalTraining(optimizer="adam", lr=1e-3))
