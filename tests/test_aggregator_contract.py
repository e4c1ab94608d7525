"""The contract every aggregator in conf/aggregator/ keeps (FedJAX-shaped ``init``/``apply``).

Over a random round of m = 5 clients of a two-layer model, each client one local step: Proposition 1
(N <= E, per layer too); the aggregation weights sum to one (per layer for a per-layer rule;
FedNova's sum to one when every client takes as many steps); the state survives a
checkpoint (``torch.save`` / ``torch.load(weights_only=True)``) and the next round from the
loaded state equals the next round from the original; a round where no client moved leaves
finite models; a round where every client sends the same update ``d`` gives the average model
``w + d`` (whatever the weights or the reduce: a mean, a median and Krum's choice of identical
updates are that update), and the server's step to the model it sends follows ``d``: in every
coordinate it has ``d``'s sign and is not zero, round after round (a multiple of ``d`` for the
mean-based servers, scaled per coordinate for FedOpt's adaptive ones), so a server that never
moves, or moves elsewhere, fails.  A new method added as one YAML is checked by these tests without new
code: every list of methods here is the YAML files of ``conf/aggregator/``.
"""
from __future__ import annotations

import dataclasses
import functools
import io

import pytest
import torch
from conftest import CONF_DIR, aggregate, compose
from hydra.utils import instantiate

from fedrun import aggregators as A
from fedrun.models.layers import Layer

NAMES = sorted(p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml"))
LAYERS = [Layer("fc1", "fc", ("fc1.weight", "fc1.bias")), Layer("fc2", "fc", ("fc2.weight",))]
SHAPES = {"fc1.weight": (4, 3), "fc1.bias": (4,), "fc2.weight": (2, 4)}
N = torch.tensor([3, 1, 4, 1, 5])


@functools.cache
def build(name):
    """The aggregator ``fedrun aggregator=<name>`` runs (its YAML's defaults); immutable, so shared."""
    return instantiate(compose([f"aggregator={name}"]).aggregator)


def random_round(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    params = {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}
    deltas = {k: scale * torch.randn(len(N), *s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}
    return params, deltas


def test_every_yaml_builds_its_method():
    # The glob found the YAMLs (the tests below are not vacuous), and each names a factory of
    # fedrun.aggregators that builds the method of its file's name.
    assert len(NAMES) >= 15
    for name in NAMES:
        cfg = compose([f"aggregator={name}"]).aggregator
        assert cfg._target_ == f"fedrun.aggregators.{name}" and callable(getattr(A, name))
        assert isinstance(build(name), A.Aggregator) and build(name).name == name


@pytest.mark.parametrize("name", NAMES)
def test_n_le_e_and_weights_sum_to_one(name):
    agg = build(name)
    params, deltas = random_round(0)
    out = aggregate(agg, params, deltas, N, LAYERS, clients=[7, 2, 9, 0, 4])
    assert out.stats.N <= out.stats.E * (1 + 1e-12)
    assert (out.stats.layer_N <= out.stats.layer_E * (1 + 1e-12)).all()
    sums = out.weights.sum(-1)  # [L] for a per-layer rule, a scalar otherwise
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-12)
    assert (out.weights >= 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_state_round_trips_a_checkpoint(name):
    agg = build(name)
    params, deltas = random_round(1)
    first = aggregate(agg, params, deltas, N, LAYERS)
    buffer = io.BytesIO()
    torch.save(first.state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # what resume reads
    _, deltas2 = random_round(2)
    a = aggregate(agg, first.sent, deltas2, N, LAYERS, first.state)
    b = aggregate(agg, first.sent, deltas2, N, LAYERS, loaded)
    assert all(torch.equal(a.sent[k], b.sent[k]) for k in a.sent)
    assert all(torch.equal(a.average[k], b.average[k]) for k in a.average)


@pytest.mark.parametrize("name", NAMES)
def test_a_round_where_nobody_moved_is_handled(name):
    agg = build(name)
    params, deltas = random_round(3, scale=0.0)
    out = aggregate(agg, params, deltas, N, LAYERS)
    assert out.stats.N == 0 and out.stats.E == 0
    assert all(torch.isfinite(v).all() for v in out.sent.values())
    assert all(torch.equal(out.average[k], params[k]) for k in params)  # the mean update is zero
    assert out.server_step == 0 or not out.skipped  # a zero step, or a skipped round


def same_update_gives_w_plus_d(agg, seed=4):
    """The property: every client sends the same update ``d`` (any sizes ``n_k``), so the
    average-aggregated model is ``w + d``: a weighted mean (weights summing to one), a median,
    a trimmed mean or Krum's choice of m copies of ``d`` is ``d``.  Raises AssertionError if not."""
    params, deltas = random_round(seed)
    d = {k: v[0] for k, v in deltas.items()}
    same = {k: v.expand(len(N), *v.shape).clone() for k, v in d.items()}
    out = aggregate(agg, params, same, N, LAYERS, clients=[7, 2, 9, 0, 4])
    for k in params:
        assert torch.allclose(out.average[k], params[k] + d[k], rtol=1e-12, atol=1e-12), k
    assert out.stats.N == pytest.approx(out.stats.E, rel=1e-9)  # Proposition 1's equality case


@pytest.mark.parametrize("name", NAMES)
def test_all_clients_sending_the_same_update_d_give_w_plus_d(name):
    same_update_gives_w_plus_d(build(name))


def sent_step_follows_d(agg, seed=5, rounds=3):
    """Every client sends the same update ``d`` for ``rounds`` rounds: each round the sent model's
    step ``w_{t+1} - w_t`` is non-zero and has ``d``'s sign in every coordinate where ``d`` is
    not zero (zero where it is).  Raises AssertionError if not."""
    params, deltas = random_round(seed)
    d = {k: v[0] for k, v in deltas.items()}
    same = {k: v.expand(len(N), *v.shape).clone() for k, v in d.items()}
    w, state = params, None
    for t in range(rounds):
        out = aggregate(agg, w, same, N, LAYERS, state, clients=[7, 2, 9, 0, 4])
        step = {k: out.sent[k] - w[k] for k in w}
        assert sum(float((step[k] * d[k]).sum()) for k in d) > 0, f"round {t + 1}: the sent step does not follow d"
        for k in d:
            agree = torch.where(d[k] == 0, step[k] == 0, torch.sign(step[k]) == torch.sign(d[k]))
            assert agree.all(), f"round {t + 1}: {k}'s step has the wrong sign in {int((~agree).sum())} coordinates"
        w, state = out.sent, out.state


@pytest.mark.parametrize("name", NAMES)
def test_the_sent_step_follows_a_shared_update(name):
    sent_step_follows_d(build(name))


def test_the_sent_step_property_catches_a_server_that_never_moves():
    # A FedAvg whose server drops the step keeps w + d as its average model (the property
    # above holds) but sends w_t back every round: only this property fails it.
    from fedrun.server import transforms as T

    still = T.ServerTransform(lambda params: {}, lambda step, state, stats: ({k: 0 * v for k, v in step.items()}, state))
    broken = dataclasses.replace(build("fedavg"), server=still)
    same_update_gives_w_plus_d(broken)
    sent_step_follows_d(build("fedavg"))
    with pytest.raises(AssertionError, match="does not follow d"):
        sent_step_follows_d(broken)


def test_the_same_update_property_catches_a_broken_reduce():
    # A median whose reduce returns zeros keeps every other property (weights sum to one, N <= E,
    # its state round-trips, a round where nobody moved is fine): only this one fails it.
    def zeros(stacked, weights, layers):
        return {k: torch.zeros_like(v[0]) for k, v in stacked.items()}

    broken = dataclasses.replace(build("median"), reduce=zeros)
    same_update_gives_w_plus_d(build("median"))
    with pytest.raises(AssertionError):
        same_update_gives_w_plus_d(broken)
