"""Round bookkeeping that grows like the work: N, E, the client norms and angles and parameter
divergence stream over the updates in O(m d) (fedrun.diagnostics.nwda.RoundSums) and equal the
Gram-derived values; the m x m Gram matrices are built only for a rule that reads them (Krum)."""
from __future__ import annotations

import functools
import itertools
import math

import pandas as pd
import pytest
import torch

from fedrun import aggregators as A
from fedrun.client.local_training import LocalTraining
from fedrun.data import partition as P
from fedrun.data.datasets import synthetic
from fedrun.data.preparation import prepare
from fedrun.diagnostics import nwda as nwda_module
from fedrun.errors import ConfigError
from fedrun.diagnostics.divergence import divergence_from_grams, round_divergence
from fedrun.diagnostics.nwda import RoundSums, layer_grams, nwda
from fedrun.harness.federated_run import Federation
from fedrun.harness.simulation import simulate
from fedrun.models.layers import Layer
from fedrun.models.nets import MLP

LAYERS = [Layer("C11", "conv", ("C11.weight", "C11.bias")), Layer("F1", "fc", ("F1.weight", "F1.bias"))]
ONE = [Layer("F1", "fc", ("F1.weight",))]


def model(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"C11.weight": torch.randn(4, 3, 3, 3, generator=g), "C11.bias": torch.randn(4, generator=g),
            "F1.weight": torch.randn(10, 6, generator=g), "F1.bias": torch.randn(10, generator=g)}


def updates(m: int, seed: int, scale: float = 1e-2) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(m, *v.shape, generator=g) for k, v in model().items()}


def weights(m: int, seed: int) -> torch.Tensor:
    p = torch.rand(m, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.1
    return p / p.sum()


# ----------------------------------------------------------------------------- N, E, norms, angles

def test_streamed_stats_hand_checked():
    # dw_1 = [1, 0], dw_2 = [0, 2], p = [1/4, 3/4]: the mean update mu = [1/4, 3/2], N^2 = 1/16 + 9/4,
    # E = 1/4 * 1 + 3/4 * 2, <dw_k, mu> = [1/4, 3], the squared norms [1, 4].
    deltas = {"F1.weight": torch.tensor([[1.0, 0.0], [0.0, 2.0]])}
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    s = RoundSums(deltas, ONE).stats(p)
    assert s.N == math.sqrt(1 / 16 + 9 / 4) and s.E == 1.75
    assert s.client_sq.tolist() == [[1.0], [4.0]] and s.client_dot.tolist() == [[0.25], [3.0]]
    assert s.client_norms.tolist() == [1.0, 2.0]
    cos = torch.tensor([0.25 / s.N, 3.0 / (2 * s.N)], dtype=torch.float64)
    assert torch.allclose(s.angles(), torch.arccos(cos), rtol=0, atol=1e-15)


@pytest.mark.parametrize("m", [1, 2, 9])
@pytest.mark.parametrize("chunk", [1, 7, 2**22])
def test_streamed_stats_equal_the_gram_derived(m, chunk):
    deltas, p = updates(m, seed=m), weights(m, seed=m)
    gram = nwda(deltas, p, LAYERS, layer_grams(deltas, LAYERS))
    streamed = RoundSums(deltas, LAYERS, chunk=chunk).stats(p)
    assert streamed.N == pytest.approx(gram.N, rel=1e-13) and streamed.E == pytest.approx(gram.E, rel=1e-13)
    for name in ("layer_N", "layer_E", "client_norms", "client_sq", "client_dot"):
        assert torch.allclose(getattr(streamed, name), getattr(gram, name), rtol=1e-12, atol=1e-18), name
    if m == 1:  # one client's angle to itself is arccos(1 +- ulp): the 1 x 1 Gram path, to the bit (RoundSums.single)
        assert torch.equal(streamed.angles(), gram.angles()) and torch.equal(streamed.layer_angles(), gram.layer_angles())
    else:
        assert torch.allclose(streamed.angles(), gram.angles(), rtol=0, atol=1e-12)
        assert torch.allclose(streamed.layer_angles(), gram.layer_angles(), rtol=0, atol=1e-12)
    assert streamed.N <= streamed.E * (1 + 1e-12)


def test_nwda_without_grams_streams(monkeypatch):
    deltas, p = updates(5, seed=1), weights(5, seed=1)
    expected = nwda(deltas, p, LAYERS, layer_grams(deltas, LAYERS))
    monkeypatch.setattr(nwda_module, "layer_grams", _no_gram)
    s = nwda(deltas, p, LAYERS)
    assert s.N == pytest.approx(expected.N, rel=1e-13) and s.E == pytest.approx(expected.E, rel=1e-13)


def test_stats_after_the_sums_pass_and_before_it_agree():
    deltas, w, p = updates(6, seed=2), model(), weights(6, seed=2)
    first = RoundSums(deltas, LAYERS, w)
    first.sums()  # the weight-free pass first (as a caller that asks for divergence first)
    a = first.stats(p)
    b = RoundSums(deltas, LAYERS, w).stats(p)  # one pass for both
    assert a.N == b.N and a.E == b.E and torch.equal(a.client_dot, b.client_dot)


# ----------------------------------------------------------------------------- parameter divergence

def pairwise(vectors: list[torch.Tensor]) -> float:
    """Definition 1 literally: the mean over pairs i < j of 1 - cos (0 for a zero vector)."""
    def cos(a, b):
        return 0.0 if a.norm() == 0 or b.norm() == 0 else float(a @ b / (a.norm() * b.norm()))
    pairs = list(itertools.combinations(vectors, 2))
    return sum(1 - cos(a, b) for a, b in pairs) / len(pairs)


def test_streamed_divergence_hand_checked():
    # As test_divergence.test_layer_grams_golden: w = [1, 1], dw = [1, 0], [0, 2], reference [0, -1]:
    # the learners [2, 1], [1, 3] and the reference [1, 0].
    sums = RoundSums({"F1.weight": torch.tensor([[1.0, 0.0], [0.0, 2.0]])}, ONE, {"F1.weight": torch.tensor([1.0, 1.0])},
                     extra={"F1.weight": torch.tensor([0.0, -1.0])})
    s = sums.sums()
    assert s.sq.tolist() == [[1.0], [4.0]] and s.with_model.tolist() == [[1.0], [2.0]] and s.model_sq.tolist() == [2.0]
    assert s.extra_dot.tolist() == [[0.0], [-2.0]] and s.extra_sq.tolist() == [1.0] and s.extra_model.tolist() == [-1.0]
    assert s.learner_sq().tolist() == [[5.0], [10.0]] and s.reference_dot().tolist() == [[2.0], [1.0]]
    d = round_divergence(sums)
    assert d.ls == pytest.approx(1 - 5 / math.sqrt(50), rel=1e-14)
    assert d.vl == pytest.approx(1 - (2 / math.sqrt(5) + 1 / math.sqrt(10)) / 2, rel=1e-14)


@pytest.mark.parametrize("m", [1, 2, 7])
@pytest.mark.parametrize("chunk", [5, 2**22])
def test_streamed_divergence_equals_the_gram_derived_and_the_definition(m, chunk):
    w, deltas = model(3), updates(m, seed=10 + m, scale=0.3)
    ref = {k: v[0] for k, v in updates(1, seed=99, scale=0.3).items()}
    gram = round_divergence(layer_grams(deltas, LAYERS, w, ref))
    streamed = round_divergence(RoundSums(deltas, LAYERS, w, ref, chunk=chunk))
    assert streamed.vl == pytest.approx(gram.vl, rel=1e-12)
    assert torch.allclose(streamed.layer_vl, gram.layer_vl, rtol=1e-12)
    if m == 1:
        assert math.isnan(streamed.ls) and torch.isnan(streamed.layer_ls).all()
        return
    assert streamed.ls == pytest.approx(gram.ls, rel=1e-12)
    assert torch.allclose(streamed.layer_ls, gram.layer_ls, rtol=1e-12)
    learners = [torch.cat([(w[p].double() + deltas[p][k].double()).flatten() for p in w]) for k in range(m)]
    assert streamed.ls == pytest.approx(pairwise(learners), rel=1e-10)


def test_streamed_divergence_of_a_zero_learner_is_distance_one():
    # Layer F1 of learner 0 is w + dw = 0 (w_F1 = 0, dw_0 = 0 there): its cosine is 0 against everyone
    # (distance 1), as on the Gram path.
    w = model(4)
    deltas = updates(4, seed=5, scale=0.5)
    for p in ("F1.weight", "F1.bias"):
        w[p].zero_()
        deltas[p][0] = 0
    gram = round_divergence(layer_grams(deltas, LAYERS, w))
    streamed = round_divergence(RoundSums(deltas, LAYERS, w))
    assert torch.allclose(streamed.layer_ls, gram.layer_ls, rtol=1e-12)
    f1 = [(w["F1.weight"] + deltas["F1.weight"][k]).double().flatten() for k in range(4)]
    f1 = [torch.cat([a, (w["F1.bias"] + deltas["F1.bias"][k]).double()]) for k, a in enumerate(f1)]
    assert float(streamed.layer_ls[1]) == pytest.approx(pairwise(f1), rel=1e-12)


def test_identical_learners_stream_to_zero_divergence():
    w = model(6)
    deltas = {k: v[:1].repeat(5, *([1] * (v.ndim - 1))) for k, v in updates(1, seed=6).items()}
    d = round_divergence(RoundSums(deltas, LAYERS, w))
    assert d.ls == pytest.approx(0, abs=1e-13) and torch.allclose(d.layer_ls, torch.zeros(2, dtype=torch.float64),
                                                                   atol=1e-13)


def test_divergence_from_grams_is_unchanged():
    # parameter_divergence of given learners keeps its Gram path (divergence_from_grams).
    w, deltas = model(7), updates(4, seed=7)
    grams = layer_grams(deltas, LAYERS, w)
    d = divergence_from_grams(grams.learners(), 4, False)
    assert d.ls == round_divergence(grams).ls


# ----------------------------------------------------------------------------- no m x m matrix in a FedAvg round

def _no_gram(*args, **kwargs):
    raise AssertionError("an m x m Gram matrix was built")


def _run(tmp_path, aggregator, clients: int, vanilla_every: int = 0, rounds: int = 2, **federation):
    raw = synthetic(num_train=4 * clients, num_test=40, channels=1, image_size=8, num_classes=4, seed=0)
    data = prepare(raw, None, None, seed=0)
    make = functools.partial(MLP, in_channels=1, image_size=8, num_classes=4, hidden=[8])
    simulate(tmp_path, data, make, functools.partial(P.iid), aggregator, LocalTraining(batch_size=4, lr=0.05),
             Federation(rounds=rounds, num_clients=clients, client_fraction=1.0, vanilla_every=vanilla_every,
                        **federation),
             seed=0, progress=False)
    return pd.read_csv(tmp_path / "rounds.csv")


TIMING = ("wall_s", "train_s", "eval_s")


def test_divergence_every_leaves_the_other_rounds_empty_and_every_other_value_as_it_was(tmp_path):
    # 5 rounds, divergence_every=2: rounds 2, 4 and the last (5) have PD-Ls; PD-VL's rounds (vanilla_every=3:
    # rounds 1 and 4) have both PD values whatever divergence_every says.  Everything else equals the
    # run that computes them every round.
    every = _run(tmp_path / "every", A.fedavg(), clients=6, vanilla_every=3, rounds=5)
    some = _run(tmp_path / "some", A.fedavg(), clients=6, vanilla_every=3, rounds=5, divergence_every=2)
    only_vl = _run(tmp_path / "vl", A.fedavg(), clients=6, vanilla_every=3, rounds=5, divergence_every=0)
    assert some["pd_ls"].notna().tolist() == [True, True, False, True, True]
    assert only_vl["pd_ls"].notna().tolist() == [True, False, False, True, False]
    assert only_vl["pd_vl"].notna().tolist() == every["pd_vl"].notna().tolist() == [True, False, False, True, False]
    kept = some["pd_ls"].notna()
    assert some.loc[kept, "pd_ls"].tolist() == every.loc[kept, "pd_ls"].tolist()
    rest = [c for c in every.columns if c not in ("pd_ls", "pd_vl", *TIMING)]
    pd.testing.assert_frame_equal(some[rest], every[rest])
    layers = pd.read_csv(tmp_path / "some" / "layers.csv")
    assert layers.groupby("round")["pd_ls"].apply(lambda s: s.notna().all()).tolist() == [True, True, False, True, True]


def test_divergence_every_refuses_a_negative_count():
    with pytest.raises(ConfigError, match=r"divergence_every=-1: must be an integer >= 0"):
        Federation(divergence_every=-1)


def test_a_fedavg_round_builds_no_gram_matrix(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(nwda_module, "layer_grams", lambda *a, **k: built.append(1) or _no_gram())
    monkeypatch.setattr(torch.Tensor, "__matmul__", _square_guard(torch.Tensor.__matmul__, 400))
    rounds = _run(tmp_path, A.fedavg(), clients=400, vanilla_every=1)
    assert not built and len(rounds) == 2
    assert rounds["pd_ls"].notna().all() and rounds["pd_vl"].notna().all() and (rounds["N"] <= rounds["E"]).all()


def _square_guard(matmul, m):
    """``@`` that fails where its result would be m x m."""
    def guarded(a, b):
        out = matmul(a, b)
        if out.ndim >= 2 and out.shape[-2:] == (m, m):
            raise AssertionError("an m x m matrix was built")
        return out
    return guarded


def test_krum_still_reads_the_gram_matrices(tmp_path, monkeypatch):
    calls = []
    real = nwda_module.layer_grams
    monkeypatch.setattr(nwda_module, "layer_grams", lambda *a, **k: calls.append(1) or real(*a, **k))
    _run(tmp_path, A.krum(1), clients=6)
    assert len(calls) == 2  # once a round, for the rule
