"""Byzantine-robust aggregation: the coordinate-wise median and trimmed mean (Yin, Chen, Ramchandran,
Bartlett, ICML 2018, Definitions 1-2) as reduces, Krum and Multi-Krum (Blanchard, El Mhamdi,
Guerraoui, Stainer, NeurIPS 2017) as a pairwise weighting rule.

Every golden case has one parameter ``w`` of two coordinates, ``w_t = 0`` and 3-5 clients, so the
numbers can be checked by hand.  The Krum case: five updates, four close together and one far away,

    x1 = [1, 1], x2 = [2, 1], x3 = [1, 3], x4 = [3, 3], x5 = [10, 10] (the outlier);

squared distances ``||x_i - x_j||^2``::

          x1   x2   x3   x4   x5
    x1     -    1    4    8  162
    x2     1    -    5    5  145
    x3     4    5    -    4  130
    x4     8    5    4    -   98
    x5   162  145  130   98    -

With f = 1 each score sums the m - f - 2 = 2 smallest of its row: s = [1+4, 1+5, 4+4, 4+5, 98+130]
= [5, 6, 8, 9, 228].  Krum picks x1; Multi-Krum with multi = 2 averages x1, x2 = [1.5, 1]; with
multi = 3, x1, x2, x3 = [4/3, 5/3].
"""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import CONF_DIR, TINY, aggregate, compose, fedrun_ok, run_fedrun
from hydra.utils import instantiate

from fedrun import aggregators as A
from fedrun.server import reduce as R
from fedrun.errors import ConfigError
from fedrun.models.layers import Layer
from fedrun.diagnostics.nwda import layer_grams
from fedrun.server.weighting import krum_scores, squared_distances

W_LAYERS = [Layer("w", "fc", ("w",))]
AB_LAYERS = [Layer("a", "fc", ("a",)), Layer("b", "fc", ("b",))]


def stacked(*rows) -> dict:
    return {"w": torch.tensor(rows, dtype=torch.float64)}


def run_round(agg, deltas, n, layer_list=W_LAYERS):
    """One round from ``w_t = 0``."""
    params = {k: torch.zeros(v.shape[1:], dtype=v.dtype) for k, v in deltas.items()}
    return aggregate(agg, params, deltas, n, layer_list)


KRUM_CASE = stacked([1.0, 1.0], [2.0, 1.0], [1.0, 3.0], [3.0, 3.0], [10.0, 10.0])
ONES = (1, 1, 1, 1, 1)


# ----------------------------------------------------------------------------- median (Definition 1)

def test_median_golden():
    # Coordinate 0: med{1, 5, 2} = 2; coordinate 1: med{10, -2, 3} = 3.
    out = run_round(A.median(), stacked([1.0, 10.0], [5.0, -2.0], [2.0, 3.0]), n=(1, 3, 1))
    assert out.average["w"].tolist() == [2.0, 3.0]
    assert torch.equal(out.sent["w"], out.average["w"])  # identity server transform
    # Every client counts once (the paper's median), whatever n_k: recorded weights 1/m ...
    assert out.weights.tolist() == pytest.approx([1 / 3] * 3, rel=1e-15)
    # ... while N and E keep the base weights n_k / n = [0.2, 0.6, 0.2], as FedAvg's.
    ref = run_round(A.fedavg(), stacked([1.0, 10.0], [5.0, -2.0], [2.0, 3.0]), n=(1, 3, 1))
    assert out.stats_weights.tolist() == [0.2, 0.6, 0.2]
    assert (out.stats.N, out.stats.E) == (ref.stats.N, ref.stats.E)


def test_median_of_an_even_number_is_the_mean_of_the_two_middle_values():
    # med{1, 5, 2, 4} = (2 + 4) / 2 = 3; med{0, 0, 1, 7} = 0.5.
    out = run_round(A.median(), stacked([1.0, 0.0], [5.0, 0.0], [2.0, 1.0], [4.0, 7.0]), n=(1, 1, 1, 1))
    assert out.average["w"].tolist() == [3.0, 0.5]


def test_weighted_median_golden():
    # Coordinate 0: values 1, 5, 2 with weights 0.2, 0.6, 0.2; sorted 1 (0.2), 2 (0.2), 5 (0.6):
    # the cumulative weight reaches 1/2 only at 5 from below, and from above already at 5: 5.
    # Coordinate 1: -2 (0.6), 3 (0.2), 10 (0.2): -2 from both ends.
    out = run_round(A.median(weighted=True), stacked([1.0, 10.0], [5.0, -2.0], [2.0, 3.0]), n=(1, 3, 1))
    assert out.average["w"].tolist() == [5.0, -2.0]
    assert out.weights.tolist() == [0.2, 0.6, 0.2]  # the base weights are the median's weights
    # Equal weights: the weighted median is Definition 1's, for odd and even m (two middle values).
    g = torch.Generator().manual_seed(0)
    for m in (3, 4, 5, 6, 7):
        x = {"w": torch.randn(m, 20, generator=g, dtype=torch.float64)}
        plain = R.median()(x, torch.full((m,), 1 / m, dtype=torch.float64), W_LAYERS)
        weighted = R.median(weighted=True)(x, torch.full((m,), 1 / m, dtype=torch.float64), W_LAYERS)
        assert torch.equal(plain["w"], weighted["w"])
        assert torch.allclose(plain["w"], x["w"].quantile(0.5, dim=0), rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- trimmed mean (Definition 2)

TRIM_CASE = stacked([1.0, -50.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [100.0, 5.0])


def test_trimmed_mean_golden():
    # beta = 0.2 of m = 5 drops floor(1) value at each end: coordinate 0 keeps {2, 3, 4} -> 3,
    # coordinate 1 keeps {0, 1, 2} -> 1 (the plain mean would be 22 and -8.4).
    out = run_round(A.trimmed_mean(beta=0.2), TRIM_CASE, n=(2, 1, 1, 1, 5))
    assert out.average["w"].tolist() == [3.0, 1.0]
    assert out.weights.tolist() == pytest.approx([0.2] * 5, rel=1e-15)


def test_trimmed_mean_trims_floor_beta_m():
    # beta = 0.1 of m = 5: floor(0.5) = 0, nothing is trimmed: the plain mean [22, -8.4].
    out = run_round(A.trimmed_mean(beta=0.1), TRIM_CASE, n=ONES)
    assert out.average["w"].tolist() == pytest.approx([22.0, -8.4], rel=1e-15)
    cases = [(0.2, 5), (0.1, 10), (0.29, 100), (0.49, 3), (0.0, 7)]
    assert [R.trimmed_count(beta, m) for beta, m in cases] == [1, 1, 29, 1, 0]


def test_weighted_trimmed_mean_golden():
    """n = (2, 1, 1, 1, 5): weights 0.2, 0.1, 0.1, 0.1, 0.5; beta = 0.2 keeps the weight in [0.2, 0.8].

    Coordinate 0, values sorted 1, 2, 3, 4, 100 (the clients' order): cumulative weights 0.2, 0.3,
    0.4, 0.5, 1.0; the kept parts are 0, 0.1, 0.1, 0.1, 0.3 (100 holds [0.5, 1.0], of which [0.5, 0.8]
    is kept): (0.2 + 0.3 + 0.4 + 30) / 0.6 = 51.5.  Coordinate 1, values -50, 0, 1, 2, 5 in the same
    order: (0 + 0.1 + 0.2 + 1.5) / 0.6 = 3.
    """
    out = run_round(A.trimmed_mean(beta=0.2, weighted=True), TRIM_CASE, n=(2, 1, 1, 1, 5))
    assert out.average["w"].tolist() == pytest.approx([51.5, 3.0], rel=1e-12)
    # Equal weights and a whole beta m: Definition 2 again.
    uniform = run_round(A.trimmed_mean(beta=0.2, weighted=True, weighting="uniform"), TRIM_CASE, n=(2, 1, 1, 1, 5))
    assert uniform.average["w"].tolist() == pytest.approx([3.0, 1.0], rel=1e-12)


def test_trimmed_mean_at_beta_zero_is_the_mean():
    g = torch.Generator().manual_seed(1)
    x = {"w": torch.randn(6, 9, generator=g, dtype=torch.float64)}
    p = torch.tensor([0.1, 0.3, 0.05, 0.25, 0.2, 0.1], dtype=torch.float64)
    assert torch.allclose(R.trimmed_mean(0.0)(x, p, W_LAYERS)["w"], x["w"].mean(0), rtol=1e-14)
    assert torch.allclose(R.trimmed_mean(0.0, weighted=True)(x, p, W_LAYERS)["w"], p @ x["w"], rtol=1e-14)


# ----------------------------------------------------------------------------- the reduces' plumbing

@pytest.mark.parametrize("reduce", [R.mean, R.median(), R.median(weighted=True), R.trimmed_mean(0.2),
                                    R.trimmed_mean(0.2, weighted=True)],
                         ids=["mean", "median", "weighted_median", "trimmed", "weighted_trimmed"])
def test_per_layer_weights_take_each_layers_row(reduce):
    # [L, m] weights: parameter "a" uses row 0, "b" row 1, as if each were reduced alone.
    g = torch.Generator().manual_seed(2)
    x = {"a": torch.randn(5, 3, generator=g, dtype=torch.float64), "b": torch.randn(5, 2, 2, generator=g,
                                                                                    dtype=torch.float64)}
    weights = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2], [0.5, 0.1, 0.1, 0.2, 0.1]], dtype=torch.float64)
    both = reduce(x, weights, AB_LAYERS)
    for i, name in enumerate(("a", "b")):
        alone = reduce({name: x[name]}, weights[i], AB_LAYERS)
        assert torch.equal(both[name], alone[name]) and both[name].shape == x[name].shape[1:]


@pytest.mark.parametrize("reduce", [R.median(), R.median(weighted=True), R.trimmed_mean(0.2),
                                    R.trimmed_mean(0.2, weighted=True)],
                         ids=["median", "weighted_median", "trimmed", "weighted_trimmed"])
def test_robust_reduces_work_in_column_blocks(reduce, monkeypatch):
    # The result does not depend on how many coordinates are sorted at a time (R.CHUNK), up to the
    # float32 summation order of the weighted trimmed mean.
    g = torch.Generator().manual_seed(3)
    x = {"w": torch.randn(5, 7, 3, generator=g)}  # float32, like real updates
    p = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2], dtype=torch.float64)
    whole = reduce(x, p, W_LAYERS)
    monkeypatch.setattr(R, "CHUNK", 5 * 4)  # blocks of 4 coordinates (21 = 4 + 4 + 4 + 4 + 4 + 1)
    blocks = reduce(x, p, W_LAYERS)
    torch.testing.assert_close(whole["w"], blocks["w"])
    assert whole["w"].dtype == torch.float32


# ----------------------------------------------------------------------------- Krum

def test_krum_scores_golden():
    grams = layer_grams(KRUM_CASE, W_LAYERS)
    distances = squared_distances(grams)
    assert distances[0].tolist() == [0.0, 1.0, 4.0, 8.0, 162.0]
    assert distances[4].tolist() == [162.0, 145.0, 130.0, 98.0, 0.0]
    assert krum_scores(distances, f=1).tolist() == [5.0, 6.0, 8.0, 9.0, 228.0]
    # f = 0: the 3 nearest: [1+4+8, 1+5+5, 4+4+5, 4+5+8, 98+130+145].
    assert krum_scores(distances, f=0).tolist() == [13.0, 11.0, 13.0, 17.0, 373.0]


def test_krum_picks_the_update_closest_to_the_others():
    out = run_round(A.krum(f=1), KRUM_CASE, n=(1, 2, 3, 4, 5))
    assert out.weights.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert out.average["w"].tolist() == [1.0, 1.0]  # x1, not the mean [3.4, 3.6] the outlier pulls
    assert torch.equal(out.sent["w"], out.average["w"])
    assert out.diagnostics["krum_score"].tolist() == [5.0, 6.0, 8.0, 9.0, 228.0]
    # N and E keep the base weights n_k / n, as every method's.
    ref = run_round(A.fedavg(), KRUM_CASE, n=(1, 2, 3, 4, 5))
    assert (out.stats.N, out.stats.E) == (ref.stats.N, ref.stats.E)


@pytest.mark.parametrize("multi,expected", [(2, [1.5, 1.0]), (3, [4 / 3, 5 / 3])])
def test_multi_krum_averages_the_lowest_scores(multi, expected):
    out = run_round(A.krum(f=1, multi=multi), KRUM_CASE, n=(5, 1, 1, 1, 1))
    assert out.weights.tolist() == pytest.approx([1 / multi] * multi + [0.0] * (5 - multi), rel=1e-15)
    assert out.average["w"].tolist() == pytest.approx(expected, rel=1e-15)  # not weighted by n_k


def test_krum_distances_sum_over_layers():
    # The two coordinates as two layers: the same distances, scores and choice.
    split = {"a": KRUM_CASE["w"][:, :1], "b": KRUM_CASE["w"][:, 1:]}
    grams = layer_grams(split, AB_LAYERS)
    assert krum_scores(squared_distances(grams), f=1).tolist() == [5.0, 6.0, 8.0, 9.0, 228.0]
    out = run_round(A.krum(f=1), split, n=ONES, layer_list=AB_LAYERS)
    assert (out.average["a"].tolist(), out.average["b"].tolist()) == ([1.0], [1.0])


def test_krum_ties_go_to_the_first_client():
    # x1 replaced by a copy of x2: both score 0 + 5 = 5, the lowest; the first listed wins.
    same = stacked([2.0, 1.0], [2.0, 1.0], [1.0, 3.0], [3.0, 3.0], [10.0, 10.0])
    out = run_round(A.krum(f=1), same, n=ONES)
    assert out.weights.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    out = run_round(A.krum(f=1), stacked(*[[0.0, 0.0]] * 5), n=ONES)  # nobody moved: all scores 0
    assert out.weights.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_krum_needs_more_than_2f_plus_2_clients_in_a_round():
    # 10 clients in the federation, 4 of them in this round (drop-outs, say): 4 <= 2f + 2 = 4.
    agg, four = A.krum(f=1), stacked([1.0, 1.0], [2.0, 1.0], [1.0, 3.0], [3.0, 3.0])
    state = agg.init({}, 10, W_LAYERS)
    with pytest.raises(ConfigError) as info:
        aggregate(agg, {"w": torch.zeros(2, dtype=torch.float64)}, four, (1, 1, 1, 1), W_LAYERS, state, [3, 1, 4, 9])
    message = str(info.value)
    assert info.value.setting == "aggregator.f" and message.startswith("aggregator.f=1: ")
    assert "2f + 2 = 4" in message and "a round had 4" in message and "\n" not in message
    assert run_round(A.krum(f=0), four, n=(1, 1, 1, 1)).weights.sum() == 1  # f = 0 needs 3
    # A federation of 4 clients can never have 5 in a round: refused at init, before any training.
    with pytest.raises(ConfigError, match=r"^aggregator.f=1: .*the federation has 4"):
        agg.init({}, 4, W_LAYERS)
    with pytest.raises(ConfigError) as info:
        run_round(A.krum(f=1, multi=6), KRUM_CASE, n=ONES)
    assert info.value.setting == "aggregator.multi" and "had 5" in str(info.value)


# ----------------------------------------------------------------------------- settings

@pytest.mark.parametrize("make,setting", [
    (lambda: A.trimmed_mean(beta=0.5), "aggregator.beta"),
    (lambda: A.trimmed_mean(beta=-0.1), "aggregator.beta"),
    (lambda: A.krum(f=-1), "aggregator.f"),
    (lambda: A.krum(multi=0), "aggregator.multi"),
    (lambda: A.median(weighting="foo"), "aggregator.weighting"),
    (lambda: A.trimmed_mean(weighting="foo"), "aggregator.weighting"),
    (lambda: A.krum(weighting="foo"), "aggregator.weighting"),
])
def test_bad_settings_are_one_line_config_errors(make, setting):
    with pytest.raises(ConfigError) as info:
        make()
    message = str(info.value)
    assert info.value.setting == setting and message.startswith(setting + "=") and "\n" not in message
    assert ": must be" in message or ": choose one of" in message  # the allowed values


@pytest.mark.parametrize("name,defaults", [
    ("median", {"weighting": "examples", "weighted": False}),
    ("trimmed_mean", {"beta": 0.1, "weighting": "examples", "weighted": False}),
    ("krum", {"f": 1, "multi": 1, "weighting": "examples"}),
])
def test_yaml_defaults(name, defaults):
    assert (CONF_DIR / "aggregator" / f"{name}.yaml").is_file()
    cfg = compose([f"aggregator={name}"], resolve=True)["aggregator"]
    assert cfg == {"_target_": f"fedrun.aggregators.{name}", **defaults}
    agg = instantiate(compose([f"aggregator={name}"]).aggregator)
    assert agg.name == name and agg.evaluate == "average" and agg.regularizer is None


# ----------------------------------------------------------------------------- whole runs

ROBUST_RUN = [*TINY, "hyperparams.num_clients=10", "hyperparams.client_fraction=0.5"]  # 5 a round: Krum's f=1 fits


@pytest.mark.slow
@pytest.mark.parametrize("name", ["median", "trimmed_mean", "krum"])
def test_whole_run_writes_the_norm_columns(name, tmp_path):
    run = tmp_path / name
    fedrun_ok([*ROBUST_RUN, f"aggregator={name}", "aggregator.weighting=uniform", f"hydra.run.dir={run}"], tmp_path)
    rounds = pd.read_csv(run / "rounds.csv")
    assert len(rounds) == 2 and (rounds.N <= rounds.E * (1 + 1e-9)).all() and (rounds.server_step > 0).all()
    weights = pd.read_csv(run / "clients.csv").groupby("round").weight
    assert weights.sum().tolist() == pytest.approx([1.0, 1.0]) and (weights.count() == 5).all()


@pytest.mark.slow
def test_krum_with_too_few_clients_a_round_is_a_one_line_error(tmp_path):
    # Too few sampled a round (3 of 10): refused before anything runs.
    small = [*ROBUST_RUN, "hyperparams.client_fraction=0.3"]
    proc = run_fedrun([*small, "aggregator=krum", f"hydra.run.dir={tmp_path / 'k'}"], tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "k").exists()
    assert proc.stderr.strip().splitlines() == [
        "fedrun: error: hyperparams.client_fraction=0.3: aggregator=krum needs at least 5 clients a round, "
        "and 0.3 of 10 clients is 3: raise hyperparams.client_fraction or hyperparams.num_clients "
        "(or lower the aggregator's f)"]
    # Enough sampled (5), but drop-outs leave a round with fewer: the run stops there in one line.
    dropping = [*ROBUST_RUN, "hyperparams.dropouts=0.4", "hyperparams.rounds=3"]
    proc = run_fedrun([*dropping, "aggregator=krum", f"hydra.run.dir={tmp_path / 'd'}"], tmp_path)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "aggregator.f=1: Krum needs more than 2f + 2 = 4" in errors[0]
    assert "a round had 3" in errors[0] and "Traceback" not in proc.stderr
