"""The contract every aggregator in conf/aggregator/ keeps (FedJAX-shaped ``init``/``apply``).

Over a random round of m = 5 clients of a two-layer model: Proposition 1 (N <= E, per layer
too); the aggregation weights sum to one (per layer for a per-layer rule); the state survives a
checkpoint (``torch.save`` / ``torch.load(weights_only=True)``) and the next round from the
loaded state equals the next round from the original; a round where no client moved leaves
finite models.  A new method added as one YAML is checked by these tests without new code.
"""
from __future__ import annotations

import io

import pytest
import torch
from conftest import CONF_DIR, aggregate, compose
from hydra.utils import instantiate

from fedrun.layers import Layer

NAMES = sorted(p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml"))
LAYERS = [Layer("fc1", "fc", ("fc1.weight", "fc1.bias")), Layer("fc2", "fc", ("fc2.weight",))]
SHAPES = {"fc1.weight": (4, 3), "fc1.bias": (4,), "fc2.weight": (2, 4)}
N = torch.tensor([3, 1, 4, 1, 5])


def build(name):
    return instantiate(compose([f"aggregator={name}"]).aggregator)


def random_round(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    params = {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}
    deltas = {k: scale * torch.randn(len(N), *s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}
    return params, deltas


def test_every_method_is_covered():
    assert {"fedavg", "fedprox", "normnorm", "momentum", "fednnnn", "fedadp", "fedlayerwise", "fedlap",
            "fedavgm", "fedadagrad", "fedadam", "fedyogi"} <= set(NAMES)


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
