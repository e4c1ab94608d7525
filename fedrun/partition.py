"""How the training set is split among K clients.

Every scheme returns one index array per client, deterministic in the seed, with no training
sample given to two clients.  All schemes but ``shards`` are one mechanism: a *demand* matrix
``D[K, C]`` (how much of class c client k wants) and :func:`allocate`, which cuts each class's
shuffled samples among the clients in proportion to its column.  So the conditions of the papers
combine freely:

* ``iid``: every row uniform over classes (FedNNNN's IID);
* ``classes``: k classes per client (FedNNNN's non-IID, k = 2; the parameter-divergence paper's
  Non-IID(2) and Non-IID(1));
* ``sizes=powerlaw`` scales the rows by power-law shares (FedNNNN's unbalanced "UB" conditions);
* ``dirichlet``: each class spread over clients by Dirichlet(alpha);
* ``mixed``: n IID clients and the rest k-class (FedLayerWise's scenarios);
* ``samples_per_client`` takes a fixed number of samples per client instead of all the data;
* ``shards``: McMahan et al.'s classic scheme, sort by label and deal 2K shards, 2 per client.
"""
from __future__ import annotations

import hashlib

import numpy as np

from fedrun.errors import ConfigError, check
from fedrun.seeding import numpy_rng

SIZES = ("balanced", "powerlaw")


# ----------------------------------------------------------------------------- building blocks

def power_law_shares(num_clients: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Client size shares ``s_k = r_k^(-a) / sum_j r_j^(-a)`` with ranks ``r`` in random order.

    A Zipf law over clients: with a = 1 and K = 100 the 10 largest clients hold 56% of the data,
    "a small number of clients hold most of the training images" (Nagura et al., sec. 5.1).
    """
    check(exponent > 0, "partition.power_law_exponent", exponent, "must be > 0")
    ranks = rng.permutation(num_clients) + 1.0
    shares = ranks ** -exponent
    return shares / shares.sum()


def client_shares(num_clients: int, sizes: str, exponent: float, rng) -> np.ndarray:
    """Relative client sizes: equal (``balanced``) or :func:`power_law_shares` (``powerlaw``)."""
    if sizes not in SIZES:
        raise ConfigError("partition.sizes", sizes, f"choose one of: {', '.join(SIZES)}")
    if sizes == "balanced":
        return np.full(num_clients, 1.0 / num_clients)
    return power_law_shares(num_clients, exponent, rng)


def assign_classes(num_clients: int, k: int, num_classes: int, rng) -> np.ndarray:
    """``[K, k]`` distinct classes per client, each class held by as equal a number of clients as
    possible: every client takes the k least-held classes, ties broken at random."""
    check(1 <= k <= num_classes, "partition.classes_per_client", k,
          f"must be between 1 and {num_classes} (the dataset's classes)")
    held = np.zeros(num_classes)
    out = np.empty((num_clients, k), dtype=np.int64)
    for client in range(num_clients):
        order = np.lexsort((rng.random(num_classes), held))  # least held first, random ties
        out[client] = np.sort(order[:k])
        held[out[client]] += 1
    return out


def allocate(labels: np.ndarray, demand: np.ndarray, rng: np.random.Generator,
             samples_per_client: int | None = None) -> list[np.ndarray]:
    """Cut every class's shuffled samples among clients in proportion to ``demand[:, c]``.

    Without ``samples_per_client`` every training sample is used: client k receives
    ``n_c * D[k, c] / sum_j D[j, c]`` samples of class c (largest-remainder rounding).  With it,
    client k receives ``samples_per_client * D[k, c] / sum_c' D[k, c']`` samples of class c and the
    rest of the data is left unused; too little of a class is a :class:`ConfigError`.
    """
    num_clients, num_classes = demand.shape
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    available = np.bincount(labels, minlength=num_classes)
    if samples_per_client is None:
        for c in range(num_classes):
            col = demand[:, c]
            if col.sum() > 0:
                counts[:, c] = _round_to_total(available[c] * col / col.sum(), available[c])
    else:
        check(samples_per_client >= 1, "partition.samples_per_client", samples_per_client, "must be >= 1")
        rows = demand / demand.sum(1, keepdims=True)
        counts = np.stack([_round_to_total(samples_per_client * r, samples_per_client) for r in rows])
        short = np.flatnonzero(counts.sum(0) > available)
        if len(short):
            c = short[0]
            raise ConfigError("partition.samples_per_client", samples_per_client,
                              f"cannot be built: clients need {counts[:, c].sum()} samples of class {c} "
                              f"but the training set has {available[c]}")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        pool = rng.permutation(np.flatnonzero(labels == c))
        bounds = np.concatenate([[0], np.cumsum(counts[:, c])])
        for k in range(num_clients):
            parts[k].append(pool[bounds[k] : bounds[k + 1]])
    return [np.sort(np.concatenate(p)) for p in parts]


def _round_to_total(x: np.ndarray, total: int) -> np.ndarray:
    """Round non-negative reals to integers summing to ``total`` (largest remainder)."""
    base = np.floor(x).astype(np.int64)
    rest = int(total - base.sum())
    if rest > 0:
        base[np.argsort(-(x - base), kind="stable")[:rest]] += 1
    return base


def _check_clients(num_clients, labels):
    check(num_clients >= 1, "hyperparams.num_clients", num_clients, "must be >= 1")
    check(num_clients <= len(labels), "hyperparams.num_clients", num_clients,
          f"must be <= the number of training samples ({len(labels)})")


def _nonempty(parts: list[np.ndarray], scheme: str) -> list[np.ndarray]:
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError("partition", scheme, f"cannot be built: client {empty[0]} gets no sample "
                          f"({len(empty)} empty clients); use fewer clients or more data")
    return parts


# ----------------------------------------------------------------------------- schemes

def iid(labels, num_clients: int, num_classes: int, seed: int, sizes: str = "balanced",
        power_law_exponent: float = 1.0, samples_per_client: int | None = None) -> list[np.ndarray]:
    """Every client draws from every class in the dataset's proportions."""
    _check_clients(num_clients, labels)
    rng = numpy_rng(seed, "partition")
    shares = client_shares(num_clients, sizes, power_law_exponent, rng)
    demand = shares[:, None] * np.ones((1, num_classes))
    return _nonempty(allocate(labels, demand, rng, samples_per_client), "iid")


def classes(labels, num_clients: int, num_classes: int, seed: int, classes_per_client: int = 2,
            sizes: str = "balanced", power_law_exponent: float = 1.0,
            samples_per_client: int | None = None) -> list[np.ndarray]:
    """k classes per client ("clients have images of only 2 classes", Nagura et al. sec. 5.1)."""
    _check_clients(num_clients, labels)
    rng = numpy_rng(seed, "partition")
    shares = client_shares(num_clients, sizes, power_law_exponent, rng)
    held = assign_classes(num_clients, classes_per_client, num_classes, rng)
    demand = np.zeros((num_clients, num_classes))
    np.put_along_axis(demand, held, 1.0 / classes_per_client, axis=1)
    return _nonempty(allocate(labels, demand * shares[:, None], rng, samples_per_client), "classes")


def dirichlet(labels, num_clients: int, num_classes: int, seed: int, alpha: float = 0.5,
              sizes: str = "balanced", power_law_exponent: float = 1.0,
              samples_per_client: int | None = None) -> list[np.ndarray]:
    """Client class proportions ``p_k ~ Dir(alpha)``: small alpha, few classes per client."""
    _check_clients(num_clients, labels)
    check(alpha > 0, "partition.alpha", alpha, "must be > 0")
    rng = numpy_rng(seed, "partition")
    shares = client_shares(num_clients, sizes, power_law_exponent, rng)
    demand = rng.dirichlet(np.full(num_classes, alpha), size=num_clients) * shares[:, None]
    return _nonempty(allocate(labels, demand, rng, samples_per_client), "dirichlet")


def mixed(labels, num_clients: int, num_classes: int, seed: int, iid_clients: int = 5,
          classes_per_client: int = 2, sizes: str = "balanced", power_law_exponent: float = 1.0,
          samples_per_client: int | None = None) -> list[np.ndarray]:
    """The first ``iid_clients`` clients IID, the others ``classes_per_client`` classes each
    (FedLayerWise's scenarios: 5 IID + 5 non-IID, 2 IID + 8 non-IID)."""
    _check_clients(num_clients, labels)
    check(0 <= iid_clients <= num_clients, "partition.iid_clients", iid_clients,
          f"must be between 0 and num_clients ({num_clients})")
    rng = numpy_rng(seed, "partition")
    shares = client_shares(num_clients, sizes, power_law_exponent, rng)
    demand = np.full((num_clients, num_classes), 1.0 / num_classes)
    skewed = num_clients - iid_clients
    if skewed:
        held = assign_classes(skewed, classes_per_client, num_classes, rng)
        rows = np.zeros((skewed, num_classes))
        np.put_along_axis(rows, held, 1.0 / classes_per_client, axis=1)
        demand[iid_clients:] = rows
    return _nonempty(allocate(labels, demand * shares[:, None], rng, samples_per_client), "mixed")


def shards(labels, num_clients: int, num_classes: int, seed: int,
           shards_per_client: int = 2) -> list[np.ndarray]:
    """Sort by label, cut into ``shards_per_client * K`` equal shards, deal them at random.

    McMahan et al.'s pathological non-IID split (FedLap: "200 label-sorted shards, 2 per client").
    Samples left over by the integer division are not used.
    """
    _check_clients(num_clients, labels)
    check(shards_per_client >= 1, "partition.shards_per_client", shards_per_client, "must be >= 1")
    num_shards = num_clients * shards_per_client
    check(num_shards <= len(labels), "partition.shards_per_client", shards_per_client,
          f"cannot be built: {num_shards} shards need at least as many samples ({len(labels)} here)")
    rng = numpy_rng(seed, "partition")
    # Shuffle before the stable sort so a shard's samples within one label are a random draw.
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    size = len(labels) // num_shards
    dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([order[s * size : (s + 1) * size] for s in row])) for row in dealt]


# ----------------------------------------------------------------------------- records

def class_counts(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The clients x classes table of sample counts."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def fingerprint(parts: list[np.ndarray]) -> str:
    """A 16-hex-digit hash of who holds which sample: equal iff the partitions are equal."""
    h = hashlib.sha256()
    for p in parts:
        h.update(np.asarray(p, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]
