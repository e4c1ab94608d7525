"""FedOpt (Reddi et al., ICLR 2021): FedAvgM, FedAdagrad, FedAdam, FedYogi as server transforms.

Golden numbers on two clients: w_t = 0, updates dw = [1, 0] and [0, 1] with n = (1, 3), so the
weighted mean update is Delta = [0.25, 0.75] (as in test_aggregators.py).  The expected values are
Algorithm 2's arithmetic written out per coordinate in plain floats.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from conftest import TINY, aggregate, fedrun_ok

from fedrun import aggregators as A
from fedrun.server import transforms as T
from fedrun.errors import ConfigError
from fedrun.models.layers import Layer

LAYERS = [Layer("w", "fc", ("w",))]
DELTAS = {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)}
DELTA = (0.25, 0.75)  # the weighted mean update with n = (1, 3)


def two_rounds(agg):
    p0 = {"w": torch.zeros(2, dtype=torch.float64)}
    r1 = aggregate(agg, p0, DELTAS, (1, 3), LAYERS)
    r2 = aggregate(agg, r1.sent, DELTAS, (1, 3), LAYERS, r1.state)
    return r1, r2


def test_fedavgm_golden():
    # m1 = Delta, x1 = 0.5 m1; m2 = 0.9 m1 + Delta = 1.9 Delta, x2 = x1 + 0.5 m2 = 1.45 Delta.
    r1, r2 = two_rounds(A.fedavgm(server_lr=0.5, beta1=0.9))
    assert r1.sent["w"].tolist() == pytest.approx([0.5 * d for d in DELTA], rel=1e-12)
    assert r2.sent["w"].tolist() == pytest.approx([1.45 * d for d in DELTA], rel=1e-12)
    assert r2.server_step == pytest.approx(0.5 * 1.9 * math.hypot(*DELTA), rel=1e-12)


def test_fedavgm_at_server_lr_one_is_fednnnn_server_momentum():
    a1, a2 = two_rounds(A.fedavgm(server_lr=1.0, beta1=0.6))
    b1, b2 = two_rounds(A.momentum(gamma=0.6))
    assert torch.equal(a2.sent["w"], b2.sent["w"]) and torch.equal(a1.sent["w"], b1.sent["w"])


def adaptive_step(v: float, m: float, tau: float) -> float:
    return m / (math.sqrt(v) + tau)


@pytest.mark.parametrize("rule", ["adagrad", "adam", "yogi"])
def test_adaptive_golden(rule):
    beta1, beta2, tau, eta = 0.5, 0.5, 0.25, 2.0
    make = {"adagrad": lambda: A.fedadagrad(server_lr=eta, beta1=beta1, tau=tau),
            "adam": lambda: A.fedadam(server_lr=eta, beta1=beta1, beta2=beta2, tau=tau),
            "yogi": lambda: A.fedyogi(server_lr=eta, beta1=beta1, beta2=beta2, tau=tau)}[rule]
    r1, r2 = two_rounds(make())
    x, m, v = [0.0, 0.0], [0.0, 0.0], [tau ** 2] * 2  # m_{-1} = 0, v_{-1} = tau^2
    for outcome in (r1, r2):
        for i, d in enumerate(DELTA):
            m[i] = beta1 * m[i] + (1 - beta1) * d
            if rule == "adagrad":
                v[i] = v[i] + d * d
            elif rule == "adam":
                v[i] = beta2 * v[i] + (1 - beta2) * d * d
            else:
                v[i] = v[i] - (1 - beta2) * d * d * math.copysign(1.0, v[i] - d * d) * (v[i] != d * d)
            x[i] += eta * adaptive_step(v[i], m[i], tau)
        assert outcome.sent["w"].tolist() == pytest.approx(x, rel=1e-12)
        assert outcome.state["server"][0]["v"]["w"].tolist() == pytest.approx(v, rel=1e-12)
    # By hand, round 1 of FedAdam and FedYogi: m1 = Delta/2 = [0.125, 0.375]; coordinate 0 has
    # Delta^2 = tau^2, so v1 = 0.0625 (Yogi: sign(0) = 0) and x1 = 2 * 0.125 / (0.25 + 0.25) = 0.5.
    if rule in ("adam", "yogi"):
        assert r1.sent["w"][0].item() == pytest.approx(0.5, rel=1e-12)


def test_adaptive_methods_differ_where_the_second_moment_does():
    # Coordinate 1 (Delta^2 = 0.5625 > v = 0.0625): Yogi adds (1 - beta2) Delta^2 to v (-> 0.34375),
    # Adam moves v halfway to Delta^2 (-> 0.3125): the same first round then steps differently.
    yogi = two_rounds(A.fedyogi(server_lr=1.0, beta1=0.5, beta2=0.5, tau=0.25))[0]
    adam = two_rounds(A.fedadam(server_lr=1.0, beta1=0.5, beta2=0.5, tau=0.25))[0]
    assert yogi.state["server"][0]["v"]["w"].tolist() == pytest.approx([0.0625, 0.34375])
    assert adam.state["server"][0]["v"]["w"].tolist() == pytest.approx([0.0625, 0.3125])
    assert yogi.sent["w"][1] < adam.sent["w"][1]  # a larger v: a smaller step


@pytest.mark.parametrize("rule,v1", [("adagrad", 25.0), ("adam", 12.5), ("yogi", 17.0)])
def test_each_rule_is_its_own_transform(rule, v1):
    """One step from m = 0, v = tau^2 = 9 (tau = 3), with Delta = 4 (Delta^2 = 16), beta1 = beta2 = 0.5:
    m = 0.5 * 4 = 2 for all three, and Algorithm 2's line for v:
    adagrad 9 + 16 = 25; adam 0.5 * 9 + 0.5 * 16 = 12.5; yogi 9 - 0.5 * 16 * sign(9 - 16) = 17.
    The step is m / (sqrt(v) + tau): adagrad's 2 / (5 + 3) = 0.25."""
    transform = {"adagrad": lambda: T.adagrad(beta1=0.5, tau=3.0), "adam": lambda: T.adam(0.5, 0.5, 3.0),
                 "yogi": lambda: T.yogi(0.5, 0.5, 3.0)}[rule]()
    params = {"w": torch.zeros(1, dtype=torch.float64)}
    step, state = transform.update({"w": torch.tensor([4.0], dtype=torch.float64)}, transform.init(params), None)
    assert state["m"]["w"].item() == 2.0 and state["v"]["w"].item() == v1
    assert step["w"].item() == pytest.approx(2.0 / (math.sqrt(v1) + 3.0), rel=1e-15)
    assert rule != "adagrad" or step["w"].item() == 0.25


@pytest.mark.parametrize("make,setting", [
    (lambda: T.adam(beta2=1.0), "aggregator.beta2"),
    (lambda: T.yogi(beta1=-0.1), "aggregator.beta1"),
    (lambda: T.adagrad(tau=0.0), "aggregator.tau"),
    (lambda: A.fedadam(server_lr=0.0), "aggregator.server_lr"),
    (lambda: A.fedyogi(beta2=1.0), "aggregator.beta2"),
    (lambda: A.fedadagrad(tau=0.0), "aggregator.tau"),
    (lambda: A.fedavgm(beta1=1.0), "aggregator.beta1"),
])
def test_bad_settings_name_the_setting(make, setting):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.setting == setting


@pytest.mark.parametrize("name", ["fedavgm", "fedadam"])
def test_whole_run_writes_the_norm_columns(name, tmp_path):
    run = tmp_path / name
    fedrun_ok(TINY + [f"aggregator={name}", f"hydra.run.dir={run}"], tmp_path)
    rounds = pd.read_csv(run / "rounds.csv")
    assert len(rounds) == 2 and (rounds.N <= rounds.E * (1 + 1e-9)).all() and (rounds.server_step > 0).all()
    # The evaluated model is the server's (Reddi et al.); where it differs from the average-aggregated
    # one (round 2: momentum, or the adaptive scaling), that one is recorded beside it.
    last = rounds.iloc[-1]
    assert last.test_acc == last.sent_test_acc and not pd.isna(last.average_test_acc)
