"""Partitions: disjoint, complete, deterministic, with the class and size structure each scheme promises.

The standard labels (``labels_1000`` fixture): 1,000 samples, 100 of each of 10 classes.
"""
from __future__ import annotations

import numpy as np
import pytest

from fedrun.data import partition as P
from fedrun.errors import ConfigError, DataError
from fedrun.seeding import numpy_rng

# (scheme, kwargs): every scheme and option the papers use, on 10 clients.
CASES = {
    "iid": (P.iid, {}),
    "iid-powerlaw": (P.iid, {"sizes": "powerlaw"}),
    "classes2": (P.classes, {"classes_per_client": 2}),
    "classes1": (P.classes, {"classes_per_client": 1}),
    "classes2-powerlaw": (P.classes, {"classes_per_client": 2, "sizes": "powerlaw"}),
    "dirichlet": (P.dirichlet, {"alpha": 0.5}),
    "dirichlet-powerlaw": (P.dirichlet, {"alpha": 1.0, "sizes": "powerlaw"}),
    "mixed": (P.mixed, {"iid_clients": 4, "classes_per_client": 2}),
    "mixed-powerlaw": (P.mixed, {"iid_clients": 4, "sizes": "powerlaw"}),
    "shards": (P.shards, {}),
}
FULL = [c for c in CASES if c != "shards"]  # the schemes that use every sample


def build(case, labels, seed=0, num_clients=10, **extra):
    fn, kwargs = CASES[case]
    return fn(labels, num_clients=num_clients, num_classes=10, seed=seed, **{**kwargs, **extra})


def all_indices(parts):
    return np.concatenate(parts)


@pytest.mark.parametrize("case", list(CASES))
def test_disjoint_and_sorted(case, labels_1000):
    parts = build(case, labels_1000)
    assert len(parts) == 10
    idx = all_indices(parts)
    assert len(idx) == len(np.unique(idx)), "a sample was given to two clients"
    assert idx.min() >= 0 and idx.max() < 1000
    assert all(len(p) > 0 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts)


@pytest.mark.parametrize("case", FULL)
def test_coverage_uses_all_data(case, labels_1000):
    parts = build(case, labels_1000)
    assert np.array_equal(np.sort(all_indices(parts)), np.arange(1000))


def test_shards_coverage_leaves_only_the_remainder():
    # 1,003 samples, 10 clients x 2 shards = 20 shards of 1003 // 20 = 50: 1000 used, 3 left over.
    labels = np.arange(1003) % 10
    parts = P.shards(labels, num_clients=10, num_classes=10, seed=0, shards_per_client=2)
    assert [len(p) for p in parts] == [100] * 10
    assert len(np.unique(all_indices(parts))) == 1000


def test_shard_size_fixes_the_shard_length():
    # 1,000 labels sorted 0..9 (100 each), 10 clients x 2 shards = 20 segments of 1000 // 20 = 50;
    # shard s is positions [50 s, 50 s + 30) of the label-sorted order, i.e. 30 samples of class
    # s // 2.  So: 20 shards x 30 = 600 samples used (400 unused), 60 per client, 60 per class
    # (2 shards of 30), and every client's count of a class is 30 or 60.
    labels = np.repeat(np.arange(10), 100)
    parts = P.shards(labels, num_clients=10, num_classes=10, seed=0, shards_per_client=2, shard_size=30)
    assert [len(p) for p in parts] == [60] * 10
    idx = all_indices(parts)
    assert len(idx) == len(np.unique(idx)) == 600
    counts = P.class_counts(parts, labels, 10)
    assert counts.sum(0).tolist() == [60] * 10
    assert set(np.unique(counts)) <= {0, 30, 60}
    # Within a class the 30 of each 50-sample segment are a random draw, different per seed.
    other = P.shards(labels, num_clients=10, num_classes=10, seed=1, shards_per_client=2, shard_size=30)
    assert P.fingerprint(parts) != P.fingerprint(other)


@pytest.mark.parametrize("n", [1000, 1003])
def test_shard_size_at_the_segment_is_the_default(n, labels_1000):
    # shard_size = N // (K x shards) cuts exactly the shards of shard_size=null (N = 1,003: 50 each,
    # the last 3 samples unused either way).
    labels = np.concatenate([labels_1000, [0, 1, 2]])[:n]
    a = P.shards(labels, num_clients=10, num_classes=10, seed=3)
    b = P.shards(labels, num_clients=10, num_classes=10, seed=3, shard_size=50)
    c = P.shards(labels, num_clients=10, num_classes=10, seed=3, shard_size=None)
    assert P.fingerprint(a) == P.fingerprint(b) == P.fingerprint(c)


def test_fedlap_cifar10_shards():
    # FedLap sec. V.A: CIFAR-10's 50,000 training images in 200 shards of 200, 2 per client: 200
    # segments of 250, 40,000 images used, 400 per client, 4,000 of each class, <= 2 classes a client.
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 5000))
    parts = P.shards(labels, num_clients=100, num_classes=10, seed=0, shards_per_client=2, shard_size=200)
    assert [len(p) for p in parts] == [400] * 100
    counts = P.class_counts(parts, labels, 10)
    assert counts.sum(0).tolist() == [4000] * 10
    assert ((counts > 0).sum(1) <= 2).all() and ((counts % 200) == 0).all()


def test_shards_are_label_sorted_pieces(labels_1000):
    # 20 shards of 50 from label-sorted data (100 per class): every shard is one class, so every
    # client holds at most 2 classes, each in a multiple of 50 samples.
    parts = P.shards(labels_1000, num_clients=10, num_classes=10, seed=0)
    counts = P.class_counts(parts, labels_1000, 10)
    assert ((counts % 50) == 0).all()
    assert ((counts > 0).sum(1) <= 2).all()
    assert (counts.sum(0) == 100).all()


@pytest.mark.parametrize("case", list(CASES))
def test_deterministic_in_seed(case, labels_1000):
    a, b = build(case, labels_1000, seed=5), build(case, labels_1000, seed=5)
    assert P.fingerprint(a) == P.fingerprint(b)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = build(case, labels_1000, seed=6)
    assert P.fingerprint(a) != P.fingerprint(c)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_classes_per_client_exact(k, labels_1000):
    parts = P.classes(labels_1000, num_clients=10, num_classes=10, seed=1, classes_per_client=k)
    counts = P.class_counts(parts, labels_1000, 10)
    assert ((counts > 0).sum(1) == k).all()
    # Each class is held by as equal a number of clients as possible: 10 k holdings over 10 classes.
    assert ((counts > 0).sum(0) == k).all()


def test_classes_with_many_clients(labels_1000):
    # FedNNNN's non-IID: K = 100, 2 classes each; every class is held by exactly 20 clients.
    parts = P.classes(labels_1000, num_clients=100, num_classes=10, seed=0, classes_per_client=2)
    counts = P.class_counts(parts, labels_1000, 10)
    assert ((counts > 0).sum(1) == 2).all()
    assert ((counts > 0).sum(0) == 20).all()
    assert [len(p) for p in parts] == [10] * 100  # 100 samples of a class / 20 holders = 5, x 2 classes


@pytest.mark.parametrize("case,num_clients", [("iid", 10), ("iid", 7), ("iid", 33), ("classes2", 10),
                                              ("mixed", 10)])
def test_balanced_sizes_differ_by_at_most_num_classes(case, num_clients, labels_1000):
    # Largest-remainder rounding per class: each client is off by < 1 sample per class.
    parts = build(case, labels_1000, num_clients=num_clients,
                  **({"iid_clients": 5} if case == "mixed" else {}))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 10


def test_iid_has_all_classes_in_proportion(labels_1000):
    parts = P.iid(labels_1000, num_clients=10, num_classes=10, seed=0)
    counts = P.class_counts(parts, labels_1000, 10)
    assert (counts == 10).all()  # 100 per class over 10 clients, exactly


@pytest.mark.parametrize("case", ["iid-powerlaw", "classes2-powerlaw", "mixed-powerlaw"])
def test_powerlaw_is_skewed(case):
    """Zipf shares with a = 1 and K = 100: the 10 largest clients hold H_10 / H_100 = 2.929 / 5.187
    = 56% of the data (the docstring's number); balanced would be 10%."""
    labels = np.random.default_rng(0).permutation(np.arange(20000) % 10)
    extra = {"iid_clients": 20} if case.startswith("mixed") else {}
    parts = build(case, labels, num_clients=100, **extra)
    sizes = np.sort([len(p) for p in parts])[::-1]
    top = sizes[:10].sum() / sizes.sum()
    assert top > 0.45
    if case == "iid-powerlaw":
        assert top == pytest.approx(2.9289683 / 5.1873775, abs=0.01)
        assert sizes[0] / sizes[-1] == pytest.approx(100, rel=0.1)  # rank 1 vs rank 100


def test_power_law_shares_formula():
    rng = np.random.default_rng(0)
    shares = P.power_law_shares(4, 1.0, rng)
    # ranks 1..4 in some order: shares are {1, 1/2, 1/3, 1/4} / (25/12) = {12, 6, 4, 3} / 25.
    assert sorted(shares.tolist()) == pytest.approx([3 / 25, 4 / 25, 6 / 25, 12 / 25])


# ----------------------------------------------------------------------------- sizes=powerlaw: the law, exactly

# K = 100, a = 1: H_100 = sum_{r<=100} 1/r = 5.187378, so the client of rank r holds s_r N =
# 60,000 / (5.187378 r) = 11,566.54 / r images: 11,566.54, 5,783.27, 3,855.51, 2,891.63, 2,313.31,
# 1,927.76, 1,652.36, 1,445.82, 1,285.17, 1,156.65 (ranks 1-10) ... 115.67 (rank 100).  The floors
# sum to 59,951; the 49 left over go to the 49 largest fractions, which include .538 (rank 1),
# .513, .635, .756, .817, .654 (ranks 3, 4, 6, 8, 10) but not .269, .308, .363, .171 (ranks 2, 5,
# 7, 9).  So the 10 largest hold 11,567 + 5,783 + 3,856 + 2,892 + 2,313 + 1,928 + 1,652 + 1,446 +
# 1,285 + 1,157 = 33,879 = 56.5% of the data (H_10 / H_100 = 2.928968 / 5.187378 = 0.5646), the
# smallest 116.  The multiset of sizes is the same for every seed (only who has which rank changes).
# (Before sizes were fixed, `classes` cut each class among its holders in proportion to their
# demand, which flattened the law: the 10 largest held 46.8%, the largest 6,545 images at seed 0.)
LAW_TOP10 = [11567, 5783, 3856, 2892, 2313, 1928, 1652, 1446, 1285, 1157]
POWERLAW = {
    "iid": (P.iid, {}),
    "classes": (P.classes, {"classes_per_client": 2}),
    "dirichlet": (P.dirichlet, {"alpha": 0.5}),
    "mixed": (P.mixed, {"iid_clients": 20, "classes_per_client": 2}),
}


@pytest.fixture(scope="module")
def labels_60000():
    """60,000 labels, 6,000 of each of 10 classes (MNIST's size), shuffled."""
    return np.random.default_rng(0).permutation(np.arange(60000) % 10)


@pytest.mark.parametrize("scheme", list(POWERLAW))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_powerlaw_sizes_are_the_law(scheme, seed, labels_60000):
    fn, kwargs = POWERLAW[scheme]
    parts = fn(labels_60000, num_clients=100, num_classes=10, seed=seed, sizes="powerlaw", **kwargs)
    sizes = np.array([len(p) for p in parts])
    ranked = np.sort(sizes)[::-1]
    assert ranked[:10].tolist() == LAW_TOP10 and ranked[-1] == 116
    assert ranked[:10].sum() == 33879 and round(100 * ranked[:10].sum() / 60000, 1) == 56.5
    # Client k's size is round(s_k N), s_k the shares drawn from the seed (same draws as the code).
    shares = P.client_shares(100, "powerlaw", 1.0, numpy_rng(seed, "partition"))
    assert sizes.tolist() == P.client_sizes(shares, 60000).tolist()
    assert np.abs(sizes - 60000 * shares).max() < 1
    # Every sample used exactly once.
    assert np.array_equal(np.sort(all_indices(parts)), np.arange(60000))


@pytest.mark.parametrize("seed", range(5))
def test_powerlaw_classes_keep_exactly_k_classes(seed, labels_60000):
    parts = P.classes(labels_60000, num_clients=100, num_classes=10, seed=seed, classes_per_client=2,
                      sizes="powerlaw")
    counts = P.class_counts(parts, labels_60000, 10)
    assert ((counts > 0).sum(1) == 2).all()
    # Split about evenly: within 8% of n_k / 2 (at these seeds at most 7.3%: a small client sharing
    # a class with the largest, whose 11,567 leave 433 of its 2 classes of 6,000 to the others).
    n = counts.sum(1)
    assert (np.abs(counts - n[:, None] / 2)[counts > 0] <= 0.08 * np.repeat(n, 2)).all()
    assert counts.sum(0).tolist() == [6000] * 10


@pytest.mark.parametrize("seed", range(3))
def test_powerlaw_iid_and_mixed_split_in_proportion(seed, labels_60000):
    # IID: each client holds n_k / 10 of every class, each count the floor or the ceiling.
    parts = P.iid(labels_60000, num_clients=100, num_classes=10, seed=seed, sizes="powerlaw")
    counts = P.class_counts(parts, labels_60000, 10)
    assert (np.abs(counts - counts.sum(1, keepdims=True) / 10) < 1).all()
    # mixed: 20 IID clients with every class, 80 with exactly 2.
    parts = P.mixed(labels_60000, num_clients=100, num_classes=10, seed=seed, iid_clients=20, sizes="powerlaw")
    counts = P.class_counts(parts, labels_60000, 10)
    assert ((counts[:20] > 0).sum(1) == 10).all() and ((counts[20:] > 0).sum(1) == 2).all()


def test_powerlaw_small_example_by_hand():
    # 4 clients, a = 1: shares {1, 1/2, 1/3, 1/4} / (25/12) = {12, 6, 4, 3} / 25, so on 100 samples
    # (10 of each class) the sizes are exactly 48, 24, 16 and 12 under every scheme.
    labels = np.arange(100) % 10
    for fn, kwargs in POWERLAW.values():
        kwargs = {**kwargs, "iid_clients": 1} if fn is P.mixed else kwargs
        parts = fn(labels, num_clients=4, num_classes=10, seed=0, sizes="powerlaw", **kwargs)
        assert sorted(len(p) for p in parts) == [12, 16, 24, 48], fn.__name__
        assert np.array_equal(np.sort(all_indices(parts)), np.arange(100))
    # IID: 4.8, 2.4, 1.6, 1.2 of each class, rounded down or up.
    counts = P.class_counts(P.iid(labels, 4, 10, 0, sizes="powerlaw"), labels, 10)
    assert sorted(counts.sum(1).tolist()) == [12, 16, 24, 48]
    assert (np.abs(counts - counts.sum(1, keepdims=True) / 10) < 1).all()
    # classes, k = 2: the client of 48 cannot fit in 2 classes of 10, so it takes 5 (50 >= 48), and
    # the one of 24 takes 3 (30 >= 24): the law is kept, the class count gives.
    counts = P.class_counts(P.classes(labels, 4, 10, 0, classes_per_client=2, sizes="powerlaw"), labels, 10)
    held = dict(zip(counts.sum(1).tolist(), (counts > 0).sum(1).tolist()))
    assert held[48] == 5 and held[24] == 3


def test_powerlaw_with_samples_per_client_has_equal_sizes(labels_1000):
    # samples_per_client fixes every size; the law then has nothing to set.
    parts = P.classes(labels_1000, 10, 10, 0, classes_per_client=2, sizes="powerlaw", samples_per_client=20)
    assert [len(p) for p in parts] == [20] * 10


# Fingerprints of the partitions before sizes=powerlaw fixed sizes and shard_size was added: equal
# sizes, samples_per_client and shards cut the same samples for the same seed as then.
GOLDEN = {
    "iid": (P.iid, 10, {}, ["ebb2824d6f000b8e", "52eedf2d9dec9221", "7ac962f1028fb88c"]),
    "classes2": (P.classes, 10, {"classes_per_client": 2}, ["7815308a42525c74", "3cf3a9f65e639bf7",
                                                           "b3d630937d23f409"]),
    "classes1": (P.classes, 10, {"classes_per_client": 1}, ["9c1a173bef820943", "9457f060804aba3f",
                                                           "bd5213c9430be972"]),
    "classes2-K100": (P.classes, 100, {"classes_per_client": 2}, ["cb990ace311ba81d", "125b46684616eaf1",
                                                                  "e4c420065f963d95"]),
    "dirichlet": (P.dirichlet, 10, {"alpha": 0.5}, ["c52c3c2e063445f8", "1feef8e79b474093", "c2800fae58e953cc"]),
    "mixed": (P.mixed, 10, {"iid_clients": 4}, ["ca224cf27634ffd4", "9d35c429a03d5ced", "d8fd35e89c21b579"]),
    "shards": (P.shards, 10, {"shards_per_client": 2}, ["c952922402454c3c", "53cb53ef080d2785",
                                                       "d25970dd403b8909"]),
    "iid-powerlaw-spc": (P.iid, 10, {"samples_per_client": 20, "sizes": "powerlaw"},
                         ["06c4786dbdda2eb7", "4e83de687a1640a6", "0f5320404b0fe576"]),
}


@pytest.mark.parametrize("case", list(GOLDEN))
def test_unchanged_partitions(case, labels_1000):
    fn, num_clients, kwargs, prints = GOLDEN[case]
    for seed, expected in enumerate(prints):
        parts = fn(labels_1000, num_clients=num_clients, num_classes=10, seed=seed, **kwargs)
        assert P.fingerprint(parts) == expected, (case, seed)


def test_mixed_iid_clients_first(labels_1000):
    parts = P.mixed(labels_1000, num_clients=10, num_classes=10, seed=2, iid_clients=3,
                    classes_per_client=2)
    counts = P.class_counts(parts, labels_1000, 10)
    assert ((counts[:3] > 0).sum(1) == 10).all()  # IID clients: all classes
    assert ((counts[3:] > 0).sum(1) == 2).all()  # the others: 2 classes
    all_iid = P.mixed(labels_1000, num_clients=10, num_classes=10, seed=2, iid_clients=10)
    assert ((P.class_counts(all_iid, labels_1000, 10) > 0).sum(1) == 10).all()


@pytest.mark.parametrize("case", FULL)
def test_samples_per_client_exact(case, labels_1000):
    parts = build(case, labels_1000, samples_per_client=30)
    assert [len(p) for p in parts] == [30] * 10
    idx = all_indices(parts)
    assert len(np.unique(idx)) == 300


def test_samples_per_client_keeps_class_structure(labels_1000):
    parts = P.classes(labels_1000, num_clients=10, num_classes=10, seed=0, classes_per_client=2,
                      samples_per_client=20)
    counts = P.class_counts(parts, labels_1000, 10)
    assert (counts.sum(1) == 20).all()
    assert ((counts > 0).sum(1) == 2).all()
    assert ((counts == 10) | (counts == 0)).all()  # 20 split evenly over the 2 classes


def test_dirichlet_small_alpha_concentrates(labels_1000):
    # Dir(0.05) puts almost all of a client's mass on one or two classes; Dir(100) is near uniform.
    def mean_top_share(alpha):
        parts = P.dirichlet(labels_1000, num_clients=10, num_classes=10, seed=0, alpha=alpha,
                            samples_per_client=50)
        counts = P.class_counts(parts, labels_1000, 10)
        return (counts.max(1) / counts.sum(1)).mean()
    assert mean_top_share(0.05) > 0.6
    assert mean_top_share(100.0) < 0.3


# ----------------------------------------------------------------------------- impossible requests

@pytest.mark.parametrize("call,setting", [
    (lambda y: P.classes(y, 10, 10, 0, classes_per_client=11), "partition.classes_per_client"),
    (lambda y: P.classes(y, 10, 10, 0, classes_per_client=0), "partition.classes_per_client"),
    (lambda y: P.mixed(y, 10, 10, 0, iid_clients=2, classes_per_client=12), "partition.classes_per_client"),
    (lambda y: P.shards(y, 600, 10, 0, shards_per_client=2), "partition.shards_per_client"),
    (lambda y: P.shards(y, 10, 10, 0, shards_per_client=0), "partition.shards_per_client"),
    (lambda y: P.iid(y, 10, 10, 0, samples_per_client=101), "partition.samples_per_client"),
    (lambda y: P.classes(y, 10, 10, 0, classes_per_client=1, samples_per_client=101),
     "partition.samples_per_client"),
    (lambda y: P.iid(y, 10, 10, 0, samples_per_client=0), "partition.samples_per_client"),
    (lambda y: P.iid(y, 1001, 10, 0), "hyperparams.num_clients"),
    (lambda y: P.shards(y, 1001, 10, 0), "hyperparams.num_clients"),
    (lambda y: P.dirichlet(y, 0, 10, 0), "hyperparams.num_clients"),
    (lambda y: P.iid(y, 10, 10, 0, sizes="foo"), "partition.sizes"),
    (lambda y: P.iid(y, 10, 10, 0, sizes="powerlaw", power_law_exponent=0), "partition.power_law_exponent"),
    (lambda y: P.dirichlet(y, 10, 10, 0, alpha=0), "partition.alpha"),
    (lambda y: P.mixed(y, 10, 10, 0, iid_clients=11), "partition.iid_clients"),
    (lambda y: P.dirichlet_labels(y, 1001, 10, 0), "hyperparams.num_clients"),
    (lambda y: P.mixed(y, 2000, 10, 0), "hyperparams.num_clients"),
])
def test_impossible_partitions(call, setting, labels_1000):
    with pytest.raises(ConfigError) as info:
        call(labels_1000)
    assert info.value.setting == setting
    assert str(info.value).startswith(setting + "=")


# Every impossible request: one ConfigError naming the setting and what is allowed.
BAD = [
    (lambda y: P.dirichlet(y, 10, 10, 0, alpha=0), r"partition\.alpha=0: must be a finite number > 0"),
    (lambda y: P.dirichlet(y, 10, 10, 0, alpha=-1.5), r"partition\.alpha=-1\.5: must be a finite number > 0"),
    (lambda y: P.dirichlet(y, 10, 10, 0, alpha=float("inf")), r"partition\.alpha=inf: must be a finite number > 0"),
    (lambda y: P.dirichlet(y, 10, 10, 0, alpha=float("nan")), r"partition\.alpha=nan: must be a finite number > 0"),
    (lambda y: P.dirichlet(y, 10, 10, 0, alpha="big"), r"partition\.alpha=big: must be a finite number > 0"),
    (lambda y: P.iid(y, 10, 10, 0, sizes="powerlaw", power_law_exponent=float("inf")),
     r"partition\.power_law_exponent=inf: must be a finite number > 0$"),
    (lambda y: P.classes(y, 10, 10, 0, sizes="powerlaw", power_law_exponent=float("nan")),
     r"partition\.power_law_exponent=nan: must be a finite number > 0$"),
    (lambda y: P.mixed(y, 10, 10, 0, sizes="powerlaw", power_law_exponent=-2),
     r"partition\.power_law_exponent=-2: must be a finite number > 0$"),
    (lambda y: P.iid(y, 10, 10, 0, sizes="powerlaw", power_law_exponent=500, samples_per_client=5),
     r"partition\.power_law_exponent=500: must be at most 304 for 10 clients \(the smallest share underflows"),
    (lambda y: P.shards(y, 10, 10, 0, shards_per_client=101),
     r"partition\.shards_per_client=101: must be an integer between 1 and 100 \(every shard needs a sample: "
     r"the training set has 1000 samples for 10 clients\); or use at most 9 clients \(hyperparams\.num_clients\)$"),
    (lambda y: P.shards(y, 10, 10, 0, shards_per_client=0), r"partition\.shards_per_client=0: must be an integer "
                                                            r"between 1 and 100"),
    (lambda y: P.shards(y, 10, 10, 0, shards_per_client=1.5), r"partition\.shards_per_client=1\.5: must be an "
                                                              r"integer between 1 and 100"),
    (lambda y: P.shards(y, 600, 10, 0), r"partition\.shards_per_client=2: must be an integer between 1 and 1 "),
    (lambda y: P.shards(y, 10, 10, 0, shard_size=51),
     r"partition\.shard_size=51: must be an integer between 1 and 50, or null for 50 \(the training set has 1000 "
     r"samples for 10 clients x 2 shards\)$"),
    (lambda y: P.shards(y, 10, 10, 0, shard_size=0), r"partition\.shard_size=0: must be an integer between 1 and 50"),
    (lambda y: P.shards(y, 10, 10, 0, shard_size=2.5), r"partition\.shard_size=2\.5: must be an integer between 1 "
                                                        r"and 50"),
    (lambda y: P.shards(y, 100, 10, 0, shards_per_client=3, shard_size=4),
     r"partition\.shard_size=4: must be an integer between 1 and 3, or null for 3 \(the training set has 1000 "
     r"samples for 100 clients x 3 shards\)$"),
    (lambda y: P.iid(y, 20, 10, 0, samples_per_client=60),
     r"partition\.samples_per_client=60: cannot be built: the clients need 120 samples of class 0 but the "
     r"training set has 100; must be at most 50 here \(the training set has 1000 samples for 20 clients\)$"),
    (lambda y: P.classes(y, 10, 10, 0, classes_per_client=1, samples_per_client=101),
     r"partition\.samples_per_client=101: cannot be built: .* must be at most 100 here"),
    (lambda y: P.iid(y, 10, 10, 0, samples_per_client=2.5), r"partition\.samples_per_client=2\.5: must be an "
                                                            r"integer >= 1, or null to use all the training data$"),
    (lambda y: P.dirichlet(y, 10, 10, 0, samples_per_client=-3), r"partition\.samples_per_client=-3: must be an "
                                                                 r"integer >= 1"),
    (lambda y: P.mixed(y, 10, 10, 0, iid_clients=11), r"partition\.iid_clients=11: must be an integer between 0 "
                                                      r"and num_clients \(10\)$"),
    (lambda y: P.mixed(y, 10, 10, 0, iid_clients=-1), r"partition\.iid_clients=-1: must be an integer between 0 "
                                                      r"and num_clients \(10\)$"),
    (lambda y: P.mixed(y, 10, 10, 0, iid_clients=2.5), r"partition\.iid_clients=2\.5: must be an integer"),
    (lambda y: P.classes(y, 10, 10, 0, classes_per_client=1.5), r"partition\.classes_per_client=1\.5: must be "
                                                                r"an integer between 1 and 10"),
    (lambda y: P.iid(y, 2.5, 10, 0), r"hyperparams\.num_clients=2\.5: must be an integer >= 1$"),
    (lambda y: P.shards(y, 0, 10, 0), r"hyperparams\.num_clients=0: must be an integer >= 1$"),
    (lambda y: P.iid(y, 1001, 10, 0), r"hyperparams\.num_clients=1001: partition=iid gives every client at least "
                                      r"one example and the training set has 1,000: the largest K here is 1,000$"),
    (lambda y: P.shards(y, 1001, 10, 0, shards_per_client=3),
     r"hyperparams\.num_clients=1001: partition=shards deals every client partition\.shards_per_client=3 shards "
     r"of at least one sample and the training set has 1,000: the largest K here is 333$"),
    (lambda y: P.iid(y, 10, 0, 0), r"dataset\.num_classes=0: must be an integer >= 1$"),
]


@pytest.mark.parametrize("call,match", BAD)
def test_bad_settings_say_what_is_allowed(call, match, labels_1000):
    with pytest.raises(ConfigError, match="^" + match):
        call(labels_1000)


def test_limits_given_in_messages_work(labels_1000):
    """The maxima the messages report are real: the partition builds at the limit."""
    P.iid(labels_1000, 20, 10, 0, samples_per_client=50)
    P.iid(labels_1000, 100, 10, 0)
    P.shards(labels_1000, 10, 10, 0, shards_per_client=100)
    labels = np.random.default_rng(0).permutation(np.arange(1000) % 10)
    with pytest.raises(ConfigError) as info:
        P.iid(labels, 100, 10, 0, sizes="powerlaw", power_law_exponent=3)
    msg = str(info.value)
    # a = 3: sum_{r<=100} r^-3 = 1.20201, so rank r wants 1000 r^-3 / 1.20201 = 831.94 r^-3 samples:
    # floors 831, 103, 30, 12, 6, 3, 2, 1, 1 (ranks 1-9) sum to 989; the 11 left over go to the 11
    # largest fractions (ranks 4 .999, 2 .993, 1 .942, 6 .852, 10 .832, 3 .813, 5 .656, 11 .625,
    # 8 .625, 12 .481, 7 .426): ranks 1-12 get samples, 88 clients none.
    assert msg.startswith("partition.power_law_exponent=3: partition.sizes=powerlaw cannot be built: 88 of 100 "
                          "clients would get no sample")
    top = float(msg.split("must be at most ")[1].split(" ")[0])
    assert 0 < top < 3
    P.iid(labels, 100, 10, 0, sizes="powerlaw", power_law_exponent=top)
    # The largest K at this exponent, which the message names, builds; one more does not.
    most = int(msg.split("the largest K here is ")[1].split(";")[0].replace(",", ""))
    assert 2 <= most < 100
    P.iid(labels, most, 10, 0, sizes="powerlaw", power_law_exponent=3)
    with pytest.raises(ConfigError, match=r"^partition\.power_law_exponent=3: "):
        P.iid(labels, most + 1, 10, 0, sizes="powerlaw", power_law_exponent=3)
    # classes: a safe number of clients is offered.
    few = np.repeat(np.arange(10), 5)[:-2]  # class 9 has 3 samples
    with pytest.raises(ConfigError, match=r"^partition=classes: cannot be built: 1 of 40 clients would get no "
                                          r"sample of its own classes .*class 9: 3 samples shared by 4 clients.*at "
                                          r"most 30 clients always works with balanced sizes$"):
        P.classes(few, 40, 10, 0, classes_per_client=1)
    P.classes(few, 30, 10, 0, classes_per_client=1)
    # With 2 classes a client, class 9's 4 holders take the rest from their other class.
    parts = P.classes(few, 40, 10, 0, classes_per_client=2)
    assert min(len(p) for p in parts) >= 1


def test_empty_clients_explained():
    # A class no sample has: its holders get nothing.
    five = np.repeat(np.arange(5), 100)
    with pytest.raises(ConfigError, match=r"^partition=classes: cannot be built: 5 of 10 clients would get no "
                                          r"sample \(the first is client 1\); .*class 9 has no training sample "
                                          r"\(the training labels cover only 0, 1, 2, 3, 4\)$"):
        P.classes(five, 10, 10, 0, classes_per_client=1)
    # More holders of class 9 (3 samples) than it has samples, and no other class to take from.
    few = np.repeat(np.arange(10), 5)[:-2]
    with pytest.raises(ConfigError, match=r"^partition=mixed: cannot be built: 1 of 40 clients would get no "
                                          r"sample of its own classes .*class 9: 3 samples shared by \d+ clients\); "
                                          r"use fewer clients \(hyperparams\.num_clients\)"):
        P.mixed(few, 40, 10, 0, iid_clients=2, classes_per_client=1)


def test_bad_labels_are_data_errors(labels_1000):
    with pytest.raises(DataError, match=r"^dataset: training labels span 0\.\.12 but the dataset has 10 classes "
                                        r"\(the labels must be 0\.\.9\)$"):
        P.iid(np.where(labels_1000 == 3, 12, labels_1000), 10, 10, 0)
    with pytest.raises(DataError, match=r"^dataset: training labels span -1\.\.9"):
        P.shards(labels_1000 - (labels_1000 == 0), 10, 10, 0)
    with pytest.raises(DataError, match=r"^dataset: the training labels must be integers"):
        P.classes(labels_1000.astype(float), 10, 10, 0)


def test_samples_per_client_at_the_limit(labels_1000):
    # 10 IID clients x 100 samples = all 100 of each class: possible, and uses everything.
    parts = P.iid(labels_1000, 10, 10, 0, samples_per_client=100)
    assert np.array_equal(np.sort(all_indices(parts)), np.arange(1000))


# ----------------------------------------------------------------------------- records

def test_fingerprint():
    a = [np.array([0, 1]), np.array([2, 3])]
    assert P.fingerprint(a) == P.fingerprint([np.array([0, 1]), np.array([2, 3])])
    assert len(P.fingerprint(a)) == 16 and int(P.fingerprint(a), 16) >= 0
    assert P.fingerprint(a) != P.fingerprint([np.array([0, 2]), np.array([1, 3])])  # same sizes
    assert P.fingerprint(a) != P.fingerprint([np.array([2, 3]), np.array([0, 1])])  # swapped clients
    assert P.fingerprint(a) != P.fingerprint([np.array([0]), np.array([1, 2, 3])])  # moved boundary


@pytest.mark.parametrize("case", list(CASES))
def test_class_counts_sums(case, labels_1000):
    parts = build(case, labels_1000)
    counts = P.class_counts(parts, labels_1000, 10)
    assert counts.shape == (10, 10)
    assert counts.sum(1).tolist() == [len(p) for p in parts]
    if case in FULL:
        assert counts.sum(0).tolist() == [100] * 10
    for k, p in enumerate(parts):
        assert counts[k].tolist() == np.bincount(labels_1000[p], minlength=10).tolist()


def test_class_counts_golden():
    labels = np.array([0, 1, 1, 2, 2, 2])
    counts = P.class_counts([np.array([0, 3]), np.array([1, 2, 4, 5])], labels, 4)
    assert counts.tolist() == [[1, 0, 1, 0], [0, 2, 2, 0]]
