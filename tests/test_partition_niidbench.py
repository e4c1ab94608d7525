"""NIID-Bench's partitions (Li, Diao, Chen, He, ICDE 2022; its ``utils.partition_data``) as readings
of fedrun's: ``partition=classes partition.assign=niidbench`` (#C=k) and ``partition=dirichlet_labels
partition.balance=true`` (p_k ~ Dir(beta), ``noniid-labeldir``), and the presets that use them.

The standard labels (``labels_1000`` fixture): 1,000 samples, 100 of each of 10 classes.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import CONF_DIR, compose
from hydra.utils import instantiate

from fedrun.data import partition as P
from fedrun.errors import ConfigError


def niid(labels, k, num_clients=10, seed=0, **kwargs):
    return P.classes(labels, num_clients=num_clients, num_classes=10, seed=seed, classes_per_client=k,
                     assign="niidbench", **kwargs)


@pytest.mark.parametrize("k", [1, 2, 3, 10])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_niidbench_classes(k, seed, labels_1000):
    """Client i holds class i mod 10 and k - 1 others; each class's 100 samples split evenly
    (sizes within one) among the clients holding it; none given twice."""
    parts = niid(labels_1000, k, seed=seed)
    table = P.class_counts(parts, labels_1000, 10)
    assert ((table > 0).sum(1) == k).all()
    assert all(table[i, i % 10] > 0 for i in range(10))
    holders = (table > 0).sum(0)
    for c in range(10):
        shares = table[table[:, c] > 0, c]
        assert shares.sum() == 100 * (holders[c] > 0) and shares.max() - shares.min() <= 1
    everything = np.concatenate(parts)
    assert len(np.unique(everything)) == len(everything)


def test_niidbench_assignment_is_not_the_balanced_one(labels_1000):
    """fedrun's default gives every class as equal a number of holders as possible (2 each for
    K = 10, k = 2); NIID-Bench's random second class leaves some classes with 1 holder and some
    with 3 or more, so the clients' sizes differ."""
    balanced = P.class_counts(P.classes(labels_1000, 10, 10, 0, classes_per_client=2), labels_1000, 10)
    assert ((balanced > 0).sum(0) == 2).all()
    spreads = []
    for seed in range(5):
        table = P.class_counts(niid(labels_1000, 2, seed=seed), labels_1000, 10)
        spreads.append((table > 0).sum(0).max() - (table > 0).sum(0).min())
    assert max(spreads) >= 2
    # The default is the assignment fedrun always had.
    a, b = (P.classes(labels_1000, 10, 10, 3, classes_per_client=2, **kw) for kw in ({}, {"assign": "balanced"}))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_fewer_clients_than_classes_leave_classes_unused(labels_1000):
    parts = niid(labels_1000, 1, num_clients=4)
    assert sum(len(p) for p in parts) == 400  # clients 0..3 hold classes 0..3; classes 4..9 go unused


@pytest.mark.parametrize("kwargs,setting", [
    ({"assign": "random"}, "partition.assign"),
    ({"assign": "niidbench", "sizes": "powerlaw"}, "partition.assign"),
])
def test_bad_assignment_is_one_line(kwargs, setting, labels_1000):
    with pytest.raises(ConfigError) as info:
        P.classes(labels_1000, 10, 10, 0, **kwargs)
    assert info.value.setting == setting


@pytest.mark.parametrize("seed", range(6))
def test_balanced_dirichlet_stops_a_full_client(seed):
    """``balance=true``: once a client holds N/K samples or more, it takes nothing of the classes
    dealt after (in class order), and every client keeps min_size."""
    labels = np.random.default_rng(seed).permutation(np.arange(5000) % 10)
    parts = P.dirichlet_labels(labels, 10, 10, seed, alpha=0.3, min_size=10, balance=True)
    table = P.class_counts(parts, labels, 10)
    cap = len(labels) / 10
    for row in table:
        held = np.cumsum(row)
        full = np.flatnonzero(held >= cap)
        if len(full):
            assert row[full[0] + 1:].sum() == 0
    assert table.sum(1).min() >= 10 and table.sum() == len(labels)


def test_balance_narrows_the_sizes():
    labels = np.random.default_rng(7).permutation(np.arange(20000) % 10)
    spread = {b: np.mean([np.ptp([len(p) for p in P.dirichlet_labels(labels, 10, 10, s, alpha=0.5, balance=b)])
                          for s in range(8)]) for b in (False, True)}
    assert spread[True] < spread[False]
    # Off (the default), the partition is the one before this option existed: the same draws.
    a = P.dirichlet_labels(labels, 10, 10, 1, alpha=0.5)
    b = P.dirichlet_labels(labels, 10, 10, 1, alpha=0.5, balance=False)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def _flbench_dirichlet(labels, num_clients, alpha, least_samples, rng):
    """FL-bench's label Dirichlet as its ``data/utils/schemes/dirichlet.py`` describes it, written
    here independently of fedrun: each class's shares ~ Dir(alpha), zeroed for the clients already
    holding N/K samples or more, renormalized, cut at floor(n_c cumsum(q)); redrawn until every
    client holds ``least_samples``."""
    n, classes = len(labels), labels.max() + 1
    while True:
        parts = [np.array([], dtype=int) for _ in range(num_clients)]
        for c in range(classes):
            members = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(num_clients, alpha)) * np.array([len(p) < n / num_clients for p in parts])
            cuts = (np.cumsum(q / q.sum()) * len(members)).astype(int)[:-1]
            parts = [np.concatenate([p, s]) for p, s in zip(parts, np.split(members, cuts))]
        if min(map(len, parts)) >= least_samples:
            return parts


def _size_cv_and_entropy(parts, labels):
    """Client-size coefficient of variation, and the clients' mean label entropy in bits."""
    sizes = np.array([len(p) for p in parts])
    freqs = [np.bincount(labels[p], minlength=10) / len(p) for p in parts]
    entropy = np.mean([-(f[f > 0] * np.log2(f[f > 0])).sum() for f in freqs])
    return sizes.std() / sizes.mean(), entropy


def test_balance_is_fl_benchs_dirichlet_and_off_is_flwrs_default():
    """Which peer each setting matches (docs/configuration.md): ``balance=true`` has the statistics
    of FL-bench's partition (which always caps a client at N/K), ``balance=false`` those of the
    uncapped draw (flwr-datasets' DirichletPartitioner, self_balancing=False): averaged over 30
    seeds at alpha 0.5, 10 clients, 20,000 samples."""
    labels = np.random.default_rng(3).permutation(np.arange(20000) % 10)
    seeds = range(30)
    ours = {b: np.mean([_size_cv_and_entropy(P.dirichlet_labels(labels, 10, 10, s, alpha=0.5, balance=b), labels)
                        for s in seeds], axis=0) for b in (False, True)}
    peer = np.mean([_size_cv_and_entropy(_flbench_dirichlet(labels, 10, 0.5, 10, np.random.default_rng(s)), labels)
                    for s in seeds], axis=0)
    assert abs(ours[True][0] - peer[0]) < 0.03 and abs(ours[True][1] - peer[1]) < 0.05
    # Uncapped, sizes spread more and clients hold more classes: it is not FL-bench's partition.
    assert ours[False][0] > peer[0] + 0.07 and ours[False][1] > peer[1] + 0.1


PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment" / "niidbench").glob("*.yaml"))


def test_presets_cover_table3():
    assert PRESETS == sorted(f"{d}_{p}" for d in ("mnist", "fmnist") for p in ("c1", "c2", "c3", "dir05", "iid"))


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_set_niidbench(preset):
    cfg = compose([f"experiment=niidbench/{preset}", "aggregator=fedprox"], resolve=True)
    dataset, partition = preset.split("_")
    hp = cfg["hyperparams"]
    assert (hp["rounds"], hp["num_clients"], hp["client_fraction"], hp["local_epochs"], hp["batch_size"],
            hp["lr"], hp["momentum"], hp["optimizer"]) == (50, 10, 1.0, 10, 64, 0.01, 0.9, "sgd")
    assert cfg["model"]["_target_"] == "fedrun.models.nets.SimpleCNN" and cfg["dataset"]["name"] == dataset
    assert cfg["dataset"]["mean"] == [0.0] and cfg["dataset"]["std"] == [1.0]
    assert cfg["aggregator"]["mu"] == 0.01
    assert cfg["tags"] == {"paper": "niidbench", "dataset": dataset, "partition": partition}
    part = cfg["partition"]
    if partition.startswith("c"):
        assert part["classes_per_client"] == int(partition[1]) and part["assign"] == "niidbench"
    elif partition == "dir05":
        assert (part["alpha"], part["min_size"], part["balance"]) == (0.5, 10, True)
    else:
        assert part["_target_"] == "fedrun.data.partition.iid"
    labels = np.random.default_rng(0).permutation(np.arange(6000) % 10)
    parts = instantiate(compose([f"experiment=niidbench/{preset}"]).partition)(labels=labels, num_clients=10,
                                                                                num_classes=10, seed=0)
    assert len(parts) == 10 and min(len(p) for p in parts) >= 10
