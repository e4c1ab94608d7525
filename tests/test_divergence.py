"""Parameter divergence (Definition 1): PD-Ls and PD-VL per layer and for the whole model."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from fedrun.diagnostics.divergence import mean_size, parameter_divergence, round_divergence, vanilla_indices
from fedrun.models.layers import Layer
from fedrun.diagnostics.nwda import layer_grams

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


# ----------------------------------------------------------------------------- from the updates' Gram matrices

def test_layer_grams_golden():
    # One layer, w = [1, 1], updates dw_1 = [1, 0], dw_2 = [0, 2], reference update [0, -1]:
    # D = [[1, 0, 0], [0, 4, -2], [0, -2, 1]], <w, dw> = [1, 2, -1], |w|^2 = 2; the learners
    # w + dw = [2, 1], [1, 3] and the reference [1, 0] have the Gram matrix [[5, 5, 2], [5, 10, 1], [2, 1, 1]].
    layer = [Layer("F1", "fc", ("F1.weight",))]
    grams = layer_grams({"F1.weight": torch.tensor([[1.0, 0.0], [0.0, 2.0]])}, layer,
                        {"F1.weight": torch.tensor([1.0, 1.0])}, extra={"F1.weight": torch.tensor([0.0, -1.0])})
    assert grams.updates[0].tolist() == [[1, 0, 0], [0, 4, -2], [0, -2, 1]]
    assert grams.with_model[0].tolist() == [1, 2, -1] and grams.model_sq.tolist() == [2]
    assert grams.client_updates()[0].tolist() == [[1, 0], [0, 4]]
    assert grams.learners()[0].tolist() == [[5, 5, 2], [5, 10, 1], [2, 1, 1]]
    d = round_divergence(grams)
    # PD-Ls = 1 - 5 / sqrt(50); PD-VL = 1 - (2 / sqrt(5) + 1 / sqrt(10)) / 2.
    assert d.ls == pytest.approx(1 - 5 / math.sqrt(50), rel=1e-14)
    assert d.vl == pytest.approx(1 - (2 / math.sqrt(5) + 1 / math.sqrt(10)) / 2, rel=1e-14)


def test_round_divergence_equals_the_learners_own():
    g = torch.Generator().manual_seed(5)
    w = {k: v[0] for k, v in learners(1, seed=7).items()}
    deltas = {k: 1e-3 * torch.randn(6, *v.shape, generator=g) for k, v in w.items()}
    ref = {k: 1e-3 * torch.randn(v.shape, generator=g) for k, v in w.items()}
    direct = parameter_divergence({k: w[k].double() + deltas[k].double() for k in w}, LAYERS,
                                  {k: w[k].double() + ref[k].double() for k in w})
    for chunk in (7, 2**22):  # a Gram accumulated over column blocks is the same matrix
        d = round_divergence(layer_grams(deltas, LAYERS, w, extra=ref, chunk=chunk))
        assert d.ls == pytest.approx(direct.ls, rel=1e-9) and d.vl == pytest.approx(direct.vl, rel=1e-9)
        assert torch.allclose(d.layer_ls, direct.layer_ls, rtol=1e-9)
        assert torch.allclose(d.layer_vl, direct.layer_vl, rtol=1e-9)
