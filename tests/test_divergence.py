"""Parameter divergence (Definition 1): PD-Ls and PD-VL per layer and for the whole model."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from fedrun.divergence import mean_size, parameter_divergence, vanilla_indices
from fedrun.models import Layer

LAYERS = [Layer("C11", "conv", ("C11.weight", "C11.bias")), Layer("F1", "fc", ("F1.weight", "F1.bias"))]


def learners(k: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"C11.weight": torch.randn(k, 4, 3, 3, 3, generator=g), "C11.bias": torch.randn(k, 4, generator=g),
            "F1.weight": torch.randn(k, 10, 6, generator=g), "F1.bias": torch.randn(k, 10, generator=g)}


def pairwise(vectors: list[torch.Tensor]) -> float:
    """Definition 1 literally: the mean over pairs i < j of 1 - cos."""
    pairs = list(itertools.combinations(vectors, 2))
    return sum(1 - float(torch.dot(a, b) / (a.norm() * b.norm())) for a, b in pairs) / len(pairs)


def flat(params: dict, names, j: int) -> torch.Tensor:
    return torch.cat([params[p][j].double().flatten() for p in names])


def test_identical_learners_have_zero_divergence():
    one = learners(1)
    same = {k: v.repeat(5, *([1] * (v.ndim - 1))) for k, v in one.items()}
    d = parameter_divergence(same, LAYERS, {k: v[0] for k, v in one.items()})
    assert d.ls == pytest.approx(0, abs=1e-12) and d.vl == pytest.approx(0, abs=1e-12)
    assert torch.allclose(d.layer_ls, torch.zeros(2, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(d.layer_vl, torch.zeros(2, dtype=torch.float64), atol=1e-12)


def test_opposite_learners_have_divergence_two():
    one = learners(1)
    opposite = {k: torch.cat([v, -v]) for k, v in one.items()}
    d = parameter_divergence(opposite, LAYERS, {k: v[0] for k, v in one.items()})
    assert d.ls == pytest.approx(2) and d.layer_ls.tolist() == pytest.approx([2, 2])
    # PD-VL against learner 0: the mean of 0 (itself) and 2 (its opposite).
    assert d.vl == pytest.approx(1) and d.layer_vl.tolist() == pytest.approx([1, 1])


def test_pd_vl_of_the_reference_against_itself_is_zero():
    one = learners(1, seed=3)
    assert parameter_divergence(one, LAYERS, {k: v[0] for k, v in one.items()}).vl == pytest.approx(0, abs=1e-12)


def test_matches_the_pairwise_definition_per_layer_and_for_the_model():
    w = learners(6, seed=1)
    ref = {k: v[0] * 0.5 + 0.1 for k, v in learners(1, seed=2).items()}
    d = parameter_divergence(w, LAYERS, ref)
    for i, layer in enumerate(LAYERS):
        vectors = [flat(w, layer.params, j) for j in range(6)]
        assert float(d.layer_ls[i]) == pytest.approx(pairwise(vectors), rel=1e-10)
        r = torch.cat([ref[p].double().flatten() for p in layer.params])
        vl = sum(1 - float(torch.dot(r, v) / (r.norm() * v.norm())) for v in vectors) / 6
        assert float(d.layer_vl[i]) == pytest.approx(vl, rel=1e-10)
    everything = [p for layer in LAYERS for p in layer.params]
    assert d.ls == pytest.approx(pairwise([flat(w, everything, j) for j in range(6)]), rel=1e-10)


def test_golden_two_dimensional_example():
    # z1 = (1, 0), z2 = (0, 1), z3 = (1, 1): cosines 0, 1/sqrt2, 1/sqrt2 -> PD-Ls = 1 - sqrt2/3.
    w = {"F1.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])}
    d = parameter_divergence(w, [Layer("F1", "fc", ("F1.weight",))], {"F1.weight": torch.tensor([1.0, 0.0])})
    assert d.ls == pytest.approx(1 - math.sqrt(2) / 3)
    # Reference (1, 0): distances 0, 1, 1 - 1/sqrt2.
    assert d.vl == pytest.approx((0 + 1 + 1 - 1 / math.sqrt(2)) / 3)


def test_scale_invariant_and_single_learner_is_nan():
    w = learners(4)
    scaled = {k: v * torch.tensor([1.0, 3.0, 0.5, 7.0]).view(-1, *([1] * (v.ndim - 1))) for k, v in w.items()}
    # Cosine distances ignore each learner's scale.
    assert parameter_divergence(scaled, LAYERS).ls == pytest.approx(parameter_divergence(w, LAYERS).ls)
    assert math.isnan(parameter_divergence(learners(1), LAYERS).ls)


def test_vanilla_data_is_a_seeded_iid_draw():
    a = vanilla_indices(1000, 100, seed=0, round_=3, device="cpu")
    assert len(a) == 100 and len(set(a.tolist())) == 100 and int(a.max()) < 1000
    assert torch.equal(a, vanilla_indices(1000, 100, 0, 3, "cpu"))
    assert not torch.equal(a, vanilla_indices(1000, 100, 0, 4, "cpu"))
    assert mean_size(torch.tensor([5000, 5000, 4999, 5000])) == 5000
    assert mean_size(torch.tensor([1, 2])) == 2  # 1.5 rounds half up
