"""The label-wise Dirichlet partition (``partition=dirichlet_labels``): each class split over the
clients by ``q_c ~ Dir(alpha 1_K)``, as flwr-datasets does (``balance=true``: as NIID-Bench and FL-bench do).

The standard labels (``labels_1000`` fixture): 1,000 samples, 100 of each of 10 classes.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY, fedrun_ok, run_fedrun

from fedrun.data import partition as P
from fedrun.errors import ConfigError


def build(labels, seed=0, num_clients=10, num_classes=10, **kwargs):
    return P.dirichlet_labels(labels, num_clients=num_clients, num_classes=num_classes, seed=seed, **kwargs)


def counts(parts, labels, num_classes=10):
    return P.class_counts(parts, labels, num_classes)  # [K, C]


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.5, 1.0, 100.0])
def test_every_sample_exactly_once(alpha, labels_1000):
    parts = build(labels_1000, alpha=alpha, min_size=1)
    assert len(parts) == 10
    everything = np.concatenate(parts)
    assert len(everything) == len(labels_1000)
    assert np.array_equal(np.sort(everything), np.arange(len(labels_1000)))
    for p in parts:
        assert p.dtype.kind in "iu" and np.array_equal(p, np.sort(p))


def test_large_alpha_splits_each_class_evenly():
    labels = np.random.default_rng(3).permutation(np.arange(20_000) % 10)  # 2,000 a class
    table = counts(build(labels, num_clients=10, alpha=1000.0), labels)
    # q_ck ~ Beta(1000, 9000): sd 0.003, so each client holds 200 +- 6 of every class.
    assert np.abs(table - 200).max() <= 40, table


def test_small_alpha_puts_each_class_on_one_client():
    labels = np.random.default_rng(3).permutation(np.arange(20_000) % 10)
    # min_size=1: with most of each class on one client, some clients may hold little.
    table = counts(build(labels, num_clients=10, alpha=0.01, min_size=1), labels)
    top = table.max(0) / table.sum(0)  # per class, the share of its largest holder
    assert np.median(top) > 0.9, top
    assert (top > 0.5).sum() >= 8, top


def test_alpha_orders_concentration():
    # The mean largest-holder share falls as alpha grows (and is near 1/K for large alpha).
    labels = np.random.default_rng(4).permutation(np.arange(10_000) % 10)
    top = []
    for alpha in (0.05, 0.5, 5.0, 500.0):
        tables = [counts(build(labels, seed=s, alpha=alpha, min_size=1), labels) for s in range(5)]
        top.append(np.mean([(t.max(0) / t.sum(0)).mean() for t in tables]))
    assert top == sorted(top, reverse=True), top
    assert top[-1] < 0.15 and top[0] > 0.6, top


def test_class_split_is_dirichlet_mean_and_variance():
    # Over many seeds client k's share of a class is Beta(alpha, (K - 1) alpha):
    # mean 1/K, variance (K - 1) / (K^2 (K alpha + 1)).
    labels = np.repeat(np.arange(2), 5000)  # 2 classes of 5,000
    k, alpha = 5, 0.5
    tables = [counts(build(labels, seed=s, num_clients=k, num_classes=2, alpha=alpha, min_size=1), labels, 2)
              for s in range(200)]
    shares = np.concatenate([t.T / 5000 for t in tables])  # [400, K]: rows are draws of q_c
    assert abs(shares.mean() - 1 / k) < 0.01
    var = (k - 1) / (k**2 * (k * alpha + 1))  # 0.0457
    assert abs(shares.var() - var) < 0.2 * var, (shares.var(), var)


@pytest.mark.parametrize("alpha,min_size", [(0.3, 1), (0.3, 30), (1.0, 80)])
def test_min_size_respected(alpha, min_size, labels_1000):
    for seed in range(5):
        parts = build(labels_1000, seed=seed, alpha=alpha, min_size=min_size)
        assert min(len(p) for p in parts) >= min_size
        assert sum(len(p) for p in parts) == 1000


def test_min_size_redraws(labels_1000):
    # alpha = 0.5 on 10 clients: a draw often leaves a client under 40; the result never does.
    sizes = [min(len(p) for p in build(labels_1000, seed=s, alpha=0.5, min_size=1)) for s in range(20)]
    assert min(sizes) < 40  # the redraw is needed for some seeds
    for s in range(20):
        assert min(len(p) for p in build(labels_1000, seed=s, alpha=0.5, min_size=40)) >= 40


def test_reproducible_and_seed_dependent(labels_1000):
    a = build(labels_1000, seed=7, alpha=0.5)
    b = build(labels_1000, seed=7, alpha=0.5)
    c = build(labels_1000, seed=8, alpha=0.5)
    assert P.fingerprint(a) == P.fingerprint(b)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert P.fingerprint(a) != P.fingerprint(c)
    assert not np.array_equal(counts(a, labels_1000), counts(c, labels_1000))


def test_differs_from_client_wise(labels_1000):
    assert P.fingerprint(build(labels_1000, seed=0, alpha=0.5)) != P.fingerprint(
        P.dirichlet(labels_1000, num_clients=10, num_classes=10, seed=0, alpha=0.5))


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("alpha", [0, -1, -0.5, float("nan"), float("inf"), True, "a"])
def test_bad_alpha_is_one_line_error(alpha, labels_1000):
    with pytest.raises(ConfigError) as err:
        build(labels_1000, alpha=alpha)
    assert one_line(err).startswith("partition.alpha=")


@pytest.mark.parametrize("min_size", [0, -3, 101, 2.5, None])
def test_bad_min_size_is_one_line_error(min_size, labels_1000):
    # 1,000 samples for 10 clients: at most 100 each.
    with pytest.raises(ConfigError) as err:
        build(labels_1000, alpha=0.5, min_size=min_size)
    message = one_line(err)
    assert message.startswith("partition.min_size=") and "100" in message


def test_unreachable_min_size_is_one_line_error(labels_1000):
    # 100 each is possible only if every class is cut exactly evenly: alpha = 0.05 never does.
    with pytest.raises(ConfigError) as err:
        build(labels_1000, alpha=0.05, min_size=100)
    message = one_line(err)
    assert message.startswith("partition.min_size=100")
    assert "raise partition.alpha or lower partition.min_size" in message


def test_uses_the_module_checks(labels_1000):
    with pytest.raises(ConfigError, match=r"^hyperparams\.num_clients="):
        build(labels_1000, num_clients=1001, alpha=0.5, min_size=1)
    with pytest.raises(Exception, match="0..9"):
        build(labels_1000, num_classes=5, alpha=0.5)


def test_cli_run(tmp_path):
    run = tmp_path / "run"
    fedrun_ok([*TINY, "partition=dirichlet_labels", f"hydra.run.dir={run}"], tmp_path)
    table = np.loadtxt(run / "partition.csv", delimiter=",", skiprows=1)
    assert table.shape[0] == 4
    assert (run / "rounds.csv").exists()


def test_cli_bad_alpha_is_one_line(tmp_path):
    args = [*TINY, "partition=dirichlet_labels", "partition.alpha=0", f"hydra.run.dir={tmp_path}/run"]
    proc = run_fedrun(args, tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedrun: error: partition.alpha=0"), proc.stderr
