"""How the training set is split among K clients.

Every scheme returns one index array per client, deterministic in the seed, with no training
sample given to two clients.  All schemes but ``shards`` build a clients x classes *count* matrix
and :func:`allocate` cuts each class's shuffled samples among the clients by it.  The counts come
from one of two rules:

* equal sizes (``sizes=balanced``): a *demand* matrix ``D[K, C]`` (how much of class c client k
  wants) and each class's samples cut among the clients in proportion to its column;
* the power law (``sizes=powerlaw``): client k gets exactly ``n_k = s_k N`` samples (the law's
  share of all N samples, :func:`client_sizes`), split over its classes as the scheme says, and
  :func:`fit_counts` makes the classes add up (see there for a class in short supply);
* ``samples_per_client=n`` gives every client exactly n samples, the rest of the data unused.

So the conditions of the papers combine freely:

* ``iid``: every client draws from every class in the dataset's proportions (FedNNNN's IID);
* ``classes``: k classes per client (FedNNNN's non-IID, k = 2; the parameter-divergence paper's
  Non-IID(2) and Non-IID(1));
* ``sizes=powerlaw``: client sizes follow a Zipf law (FedNNNN's unbalanced "UB" conditions);
* ``dirichlet``: each client's class proportions drawn from Dirichlet(alpha) (client-wise);
* ``dirichlet_labels``: each class split over the clients by Dirichlet(alpha) (label-wise:
  flwr-datasets' ``DirichletPartitioner``; with ``balance=True`` NIID-Bench's and FL-bench's);
* ``mixed``: n IID clients and the rest k-class (FedLayerWise's scenarios);
* ``shards``: McMahan et al.'s classic scheme, sort by label and deal 2K shards, 2 per client
  (``shard_size`` fixes the shard length: FedLap's 200-image CIFAR-10 shards).

Large federations.  Every scheme builds in O(N + K C) memory, and in time with no Python loop
over the clients but the class assignments (:func:`assign_classes`, :func:`niidbench_classes`,
:func:`deal_classes`: about a second at K = 100,000); each refuses a K it cannot make in one line
naming the largest K (``hyperparams.num_clients``).  A client needs at
least one sample, so K <= N for all; ``iid``, ``classes``, ``dirichlet`` and ``mixed`` (equal
sizes) make any K up to N (:func:`_build`); ``shards`` K <= N // shards_per_client;
``dirichlet_labels`` as many as its redraws can give ``min_size`` samples each
(:func:`labels_limit`); ``natural`` the data's clients.
"""
from __future__ import annotations

import hashlib
import math
from numbers import Integral, Real

import numpy as np

from fedrun.errors import ConfigError, DataError, check
from fedrun.seeding import numpy_rng

SIZES = ("balanced", "powerlaw")


# ----------------------------------------------------------------------------- argument checks

def _integer(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _positive(setting: str, value, what: str = "") -> None:
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    check(ok, setting, value, f"must be a finite number > 0{what}")


def _labels(labels, num_classes) -> np.ndarray:
    """The training labels as int64, checked against ``num_classes``."""
    check(_integer(num_classes) and num_classes >= 1, "dataset.num_classes", num_classes,
          "must be an integer >= 1")
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise DataError(f"dataset: the training labels must be integers, one per image (got "
                        f"{labels.dtype} of shape {labels.shape})")
    labels = labels.astype(np.int64, copy=False)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"dataset: training labels span {labels.min()}..{labels.max()} but the dataset "
                        f"has {num_classes} classes (the labels must be 0..{num_classes - 1})")
    return labels


def _check_clients(num_clients, labels, scheme: str):
    """K an integer >= 1 and at most N: every scheme but ``shards``, ``dirichlet_labels`` and
    ``natural`` gives every client at least one example and can make any K up to N."""
    check(_integer(num_clients) and num_clients >= 1, "hyperparams.num_clients", num_clients,
          "must be an integer >= 1")
    if num_clients > len(labels):
        raise too_many_clients(num_clients, len(labels), scheme, "gives every client at least one example and the "
                               f"training set has {len(labels):,}")


def too_many_clients(num_clients: int, largest: int, scheme: str, why: str) -> ConfigError:
    """The one-line refusal of a K beyond the largest a partition can make here, ``why`` saying what
    limits it: ``hyperparams.num_clients=K: partition=<scheme> <why>: the largest K here is <n>``."""
    return ConfigError("hyperparams.num_clients", num_clients, f"partition={scheme} {why}: the largest K here is "
                       f"{largest:,}")


def _check_samples_per_client(samples_per_client):
    if samples_per_client is not None:
        check(_integer(samples_per_client) and samples_per_client >= 1, "partition.samples_per_client",
              samples_per_client, "must be an integer >= 1, or null to use all the training data")


# ----------------------------------------------------------------------------- building blocks

def _ranks(num_clients: int, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(num_clients) + 1.0


def _zipf(ranks: np.ndarray, exponent: float) -> np.ndarray:
    with np.errstate(under="ignore"):
        shares = ranks ** -float(exponent)
        return shares / shares.sum()


def power_law_shares(num_clients: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Client size shares ``s_k = r_k^(-a) / sum_j r_j^(-a)`` with ranks ``r`` in random order.

    A Zipf law over clients: with a = 1 and K = 100 the 10 largest clients hold
    H_10 / H_100 = 2.929 / 5.187 = 56.5% of the data and the largest 1 / H_100 = 19.3%, "a small
    number of clients hold most of the training images" (Nagura et al., sec. 5.1).  Client k then
    holds exactly ``client_sizes(shares, N)[k]`` samples under every scheme.
    """
    _positive("partition.power_law_exponent", exponent)
    shares = _zipf(_ranks(num_clients, rng), exponent)
    if not shares.min() > 0:
        raise _underflow(exponent, num_clients)
    return shares


def _underflow(exponent, num_clients) -> ConfigError:
    """The smallest Zipf share ``K^-a`` rounds to 0 beyond a ~ 700 / ln K."""
    return ConfigError("partition.power_law_exponent", exponent,
                       f"must be at most {700 / math.log(num_clients):.0f} for {num_clients} clients (the "
                       "smallest share underflows to 0)")


def client_shares(num_clients: int, sizes: str, exponent: float, rng) -> np.ndarray:
    """Relative client sizes: equal (``balanced``) or :func:`power_law_shares` (``powerlaw``)."""
    shares, _ = _shares(num_clients, sizes, exponent, rng)
    if not shares.min() > 0:
        raise _underflow(exponent, num_clients)
    return shares


def client_sizes(shares: np.ndarray, num_samples: int) -> np.ndarray:
    """The law's client sizes: ``n_k = s_k N`` rounded to integers that sum to N (largest
    remainder: floors first, then one more sample to the clients with the largest fractions)."""
    return _round_to_total(num_samples * np.asarray(shares, dtype=float), int(num_samples))


def _check_k(k, num_classes):
    check(_integer(k) and 1 <= k <= num_classes, "partition.classes_per_client", k,
          f"must be an integer between 1 and {num_classes} (the dataset's classes)")


def assign_classes(num_clients: int, k: int, num_classes: int, rng) -> np.ndarray:
    """``[K, k]`` distinct classes per client, each class held by as equal a number of clients as
    possible: every client takes the k least-held classes, ties broken at random (equal sizes)."""
    _check_k(k, num_classes)
    held = np.zeros(num_classes)
    out = np.empty((num_clients, k), dtype=np.int64)
    for client in range(num_clients):
        order = np.lexsort((rng.random(num_classes), held))  # least held first, random ties
        out[client] = np.sort(order[:k])
        held[out[client]] += 1
    return out


def deal_classes(sizes: np.ndarray, k: int, available: np.ndarray, rng,
                 promised: np.ndarray | None = None) -> np.ndarray:
    """``[K, C]`` which classes each client holds when client sizes differ (``sizes=powerlaw``).

    Counting holders, as :func:`assign_classes` does, would give the largest clients' classes as
    many holders as the others' and ask far more of them than they have (K = 100, a = 1: the
    largest client alone wants 5,783 of each of its 2 classes of 6,000).  So classes are dealt by
    *samples*: from the largest client down (equal sizes: lower index first), each takes the k
    classes with the most samples not yet promised (to larger clients, or in ``promised``: what
    ``mixed``'s IID clients take), ranked after a random jitter of up to one of its pieces n_k / k
    so that equally full classes are not always dealt together; if those have less left than it
    needs, the k with the most left; and if even their full sizes cannot hold it, the next
    fullest too, until they do (the law is kept and the class count gives: 10 clients, a = 1,
    1,000 samples in 10 classes: the largest wants 341 and takes 4 classes).  It then promises
    ``n_k / m`` of each of its m classes.  The largest clients' classes thus have few holders.
    """
    num_classes = len(available)
    _check_k(k, num_classes)
    free = available.astype(float) - (0.0 if promised is None else promised)
    held = np.zeros((len(sizes), num_classes), dtype=bool)
    for client in np.argsort(-sizes, kind="stable"):
        order = np.argsort(-(free + rng.random(num_classes) * sizes[client] / k), kind="stable")
        m = k
        if free[order[:k]].sum() < sizes[client]:  # too little left in those: the k with the most
            order = np.argsort(-free, kind="stable")
            while m < num_classes and available[order[:m]].sum() < sizes[client]:
                m += 1
        held[client, order[:m]] = True
        free[order[:m]] -= sizes[client] / m
    return held


def _counts(available: np.ndarray, demand: np.ndarray, samples_per_client: int | None) -> np.ndarray:
    """``[K, C]`` how many samples of each class each client receives (see :func:`allocate`)."""
    num_clients, num_classes = demand.shape
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    if samples_per_client is None:
        for c in range(num_classes):
            col = demand[:, c]
            if col.sum() > 0:
                counts[:, c] = _round_to_total(available[c] * col / col.sum(), available[c])
        return counts
    rows = demand / demand.sum(1, keepdims=True)
    return _round_rows(samples_per_client * rows, np.full(num_clients, samples_per_client))


def allocate(labels: np.ndarray, demand: np.ndarray, rng: np.random.Generator,
             samples_per_client: int | None = None, sizes: np.ndarray | None = None) -> list[np.ndarray]:
    """Cut every class's shuffled samples among clients by a clients x classes count matrix.

    Without ``samples_per_client`` or ``sizes`` every training sample is used: client k receives
    ``n_c * D[k, c] / sum_j D[j, c]`` samples of class c (largest-remainder rounding).  With
    ``samples_per_client``, client k receives ``samples_per_client * D[k, c] / sum_c' D[k, c']``
    samples of class c and the rest of the data is left unused; too little of a class is a
    :class:`ConfigError`.  With ``sizes`` (the power law's, summing to the number of samples),
    ``demand`` is each client's split over the classes and :func:`fit_counts` gives the counts:
    client k receives exactly ``sizes[k]`` samples.
    """
    num_clients, num_classes = demand.shape
    available = np.bincount(labels, minlength=num_classes)
    _check_samples_per_client(samples_per_client)
    if sizes is not None:
        sizes = np.asarray(sizes, dtype=np.int64)
        if sizes.shape != (num_clients,) or sizes.min() < 0 or sizes.sum() != len(labels):
            raise ValueError(f"allocate: sizes must be {num_clients} counts >= 0 summing to the "
                             f"{len(labels)} samples (got {sizes.sum()})")
        counts = fit_counts(available, sizes, demand)
    else:
        counts = _counts(available, demand, samples_per_client)
    if samples_per_client is not None and sizes is None:
        short = np.flatnonzero(counts.sum(0) > available)
        if len(short):
            c = short[0]
            fits = lambda n: bool((_counts(available, demand, n).sum(0) <= available).all())  # noqa: E731
            lo, hi = 0, samples_per_client  # fits(lo) (or lo = 0), not fits(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
            allowed = (f"must be at most {lo} here (the training set has {len(labels)} samples for "
                       f"{num_clients} clients)" if lo else
                       "no value works: use fewer clients (hyperparams.num_clients)")
            raise ConfigError("partition.samples_per_client", samples_per_client,
                              f"cannot be built: the clients need {counts[:, c].sum()} samples of class "
                              f"{c} but the training set has {available[c]}; {allowed}")
    return deal(labels, counts, rng)


def deal(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Client k receives the next ``counts[k, c]`` of class c's shuffled samples, clients in order
    (class c's samples shuffled once, classes in order); each client's indices sorted.

    O(N + K C) time and memory: every sample is labelled with its client and the samples are
    sorted by client once (stably, so each client's indices come out ascending); the K arrays
    returned are views into that one sorted array.
    """
    num_clients, num_classes = counts.shape
    owner = np.full(len(labels), num_clients, dtype=np.int64)  # num_clients: no client (sorts last)
    clients = np.arange(num_clients)
    for c in range(num_classes):
        pool = rng.permutation(np.flatnonzero(labels == c))
        col = counts[:, c]
        owner[pool[: int(col.sum())]] = np.repeat(clients, col)
    order = np.argsort(owner, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts.sum(1))]).tolist()
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


# ----------------------------------------------------------------------------- sizes fixed by the law

def fit_counts(available: np.ndarray, sizes: np.ndarray, split: np.ndarray) -> np.ndarray:
    """``[K, C]`` counts with row sums ``sizes`` (the law) and column sums ``available`` (every
    sample used once), as close as the classes allow to ``sizes[k] * split[k]``.

    ``split[k]`` is client k's share of each class as its scheme says (``iid``: the dataset's
    class proportions; ``classes``: 1/k on each of its classes; ``dirichlet``: its Dirichlet
    draw); a class it has no share of stays 0.  The split alone rarely fits the classes (the
    large clients of a class may want more of it than exists), so:

    1. *Iterative proportional fitting* (Deming & Stephan): a class in short supply is cut in
       proportion to what its clients want ("take what the class has"), each client then takes
       its shortfall from its other classes in proportion to its split, and again until both
       sums hold.  For ``iid`` the split already fits: no client's proportions change.
    2. Rounding keeps both sums: every count is the floor or the ceiling of the fitted value
       (each row rounded by largest remainder, then units moved between a client's classes to
       make the columns add up).

    When no split within the clients' own classes can give every client its size (e.g. k = 1:
    each class would have to be the exact sum of its clients' sizes), the law still holds and the
    classes give: clients are served from the largest down, each taking its split or what a class
    has left, the rest from its own classes with samples left, then from the classes with the
    most samples left (so such a client may hold more classes than the scheme gives it).
    """
    split = np.asarray(split, dtype=float)
    split = split / split.sum(1, keepdims=True)
    fitted = _fit(sizes, available, split)
    if fitted is not None:
        counts = _round_counts(fitted, sizes, available, split > 0)
        if counts is not None:
            return counts
    return _serve(sizes, available, split)


def _fit(sizes: np.ndarray, available: np.ndarray, split: np.ndarray) -> np.ndarray | None:
    """Iterative proportional fitting of ``sizes * split`` to the row sums ``sizes`` and column sums
    ``available``; None when it does not converge (no such matrix on the split's support)."""
    x = sizes[:, None] * split
    best, stalled = np.inf, 0
    for _ in range(20_000):
        col = x.sum(0)
        x *= np.divide(available, col, out=np.zeros(len(col)), where=col > 0)
        row = x.sum(1)
        err = float(np.abs(row - sizes).max())
        if err <= 1e-6:
            return x
        if err < best * (1 - 1e-4):
            best, stalled = err, 0
        else:
            stalled += 1
            if stalled > 200:
                return None
        x *= np.divide(sizes, row, out=np.zeros(len(row)), where=row > 0)[:, None]
    return None


def _round_counts(x: np.ndarray, sizes, available, support) -> np.ndarray | None:
    """Integers with the row sums ``sizes`` and column sums ``available``, each the floor or the
    ceiling of ``x`` (which has those sums): rows by largest remainder, then the columns repaired by
    moving single units between two classes of one client (a path through several clients when no
    client holds both), first within floor/ceiling, then anywhere on the support keeping >= 1."""
    t = _round_rows(x, sizes)
    lo, hi = np.floor(x + 1e-6), np.ceil(x - 1e-6)
    while True:
        excess = t.sum(0) - available
        if not (excess > 0).any():
            return t
        if _swap(t, x, excess, lo, hi) or _augment(t, excess, t > lo, t < hi) \
                or _augment(t, excess, t > support, support):
            continue
        return None


def _swap(t, x, excess, lo, hi) -> bool:
    """Move units from over-full to short classes within single clients whose count is above its
    floor in the first and below its ceiling in the second, those that overshoot most first."""
    moved = False
    for c in np.flatnonzero(excess > 0):
        for d in np.flatnonzero(excess < 0):
            n = min(excess[c], -excess[d])
            if n <= 0:
                continue
            who = np.flatnonzero((t[:, c] > lo[:, c]) & (t[:, d] < hi[:, d]))
            if not len(who):
                continue
            gain = (t[who, c] - x[who, c]) - (t[who, d] - x[who, d])
            who = who[np.argsort(-gain, kind="stable")[:n]]
            t[who, c] -= 1
            t[who, d] += 1
            excess[c] -= len(who)
            excess[d] += len(who)
            moved = True
    return moved


def _augment(t, excess, down, up) -> bool:
    """One unit from an over-full class to a short one along a shortest path class -> client ->
    class -> ... (each client gives one unit of the class before it, where ``down`` allows, and takes
    one of the class after it, where ``up`` allows); False if there is none."""
    num_clients, num_classes = t.shape
    col_from = np.full(num_classes, -2)  # the client a class was reached through (-1: a source)
    row_from = np.full(num_clients, -1)  # the class a client was reached from
    frontier = np.flatnonzero(excess > 0)
    col_from[frontier] = -1
    while len(frontier):
        reach = down[:, frontier] & (row_from < 0)[:, None]
        rows = np.flatnonzero(reach.any(1))
        if not len(rows):
            return False
        row_from[rows] = frontier[reach[rows].argmax(1)]
        reach = up[rows] & (col_from == -2)[None, :]
        cols = np.flatnonzero(reach.any(0))
        if not len(cols):
            return False
        col_from[cols] = rows[reach[:, cols].argmax(0)]
        short = cols[excess[cols] < 0]
        if len(short):
            c = short[0]
            while col_from[c] != -1:
                k = col_from[c]
                t[k, c] += 1
                c = row_from[k]
                t[k, c] -= 1
            return True
        frontier = cols
    return False


def _serve(sizes, available, split) -> np.ndarray:
    """The fallback of :func:`fit_counts`: clients served from the largest down."""
    left = available.astype(np.int64).copy()
    t = np.zeros(split.shape, dtype=np.int64)
    for k in np.argsort(-sizes, kind="stable"):
        take = np.minimum(_round_to_total(sizes[k] * split[k], int(sizes[k])), left)
        t[k] += take
        left -= take
        need = int(sizes[k] - take.sum())
        while need > 0:
            own = (split[k] > 0) & (left > 0)
            if own.any():
                w = split[k] * own
                take = np.minimum(_round_to_total(need * w / w.sum(), need), left)
            else:  # its own classes are spent: the fullest other class
                take = np.zeros_like(left)
                c = int(np.argmax(left))
                take[c] = min(need, left[c])
            t[k] += take
            left -= take
            need -= int(take.sum())
    return t


def _round_to_total(x: np.ndarray, total: int) -> np.ndarray:
    """Round non-negative reals to integers summing to ``total`` (largest remainder)."""
    base = np.floor(x).astype(np.int64)
    rest = int(total - base.sum())
    if rest > 0:
        base[np.argsort(-(x - base), kind="stable")[:rest]] += 1
    return base


def _round_rows(x: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """:func:`_round_to_total` of every row of ``x`` to its ``totals[k]``, all rows at once."""
    base = np.floor(x).astype(np.int64)
    rest = np.asarray(totals, dtype=np.int64) - base.sum(1)
    order = np.argsort(-(x - base), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(x.shape[1])[None, :], axis=1)
    return base + (rank < rest[:, None])


def _shares(num_clients, sizes, exponent, rng):
    """:func:`client_shares` (same draws) and the power-law ranks (None for balanced sizes)."""
    if sizes not in SIZES:
        raise ConfigError("partition.sizes", sizes, f"choose one of: {', '.join(SIZES)}")
    if sizes == "balanced":
        return np.full(num_clients, 1.0 / num_clients), None
    _positive("partition.power_law_exponent", exponent)
    ranks = _ranks(num_clients, rng)
    return _zipf(ranks, exponent), ranks


def _build(scheme: str, labels: np.ndarray, rows: np.ndarray, shares: np.ndarray, exponent, rng,
           samples_per_client, sizes=None) -> list[np.ndarray]:
    """Allocate ``rows * shares`` (or ``rows`` as each client's split of its law ``sizes``).

    Equal sizes with all the data: client k's share of class c is
    ``x_kc = n_c D_kc / sum_j D_jc`` (``D = rows * shares``), each class's column rounded on its own
    (:func:`allocate`: largest remainder, ties to the lower client).  With more clients than that
    rounding can serve (K near a class's size: FashionMNIST's 6,000 images a class and K > 6,000
    for ``iid``) the ties hand every class's spare samples to the same first clients and leave the
    last ones nothing; samples are then moved within each class from clients above their share
    of the data to clients below it (:func:`_even_out`), so that every client holds at least one
    sample of its own classes and about its share ``sum_c x_kc``.  Any K up to N so builds unless
    a class is too small for its holders (``classes`` beyond ``C min_c n_c / k`` clients:
    refused, naming that K); a partition that built before is unchanged.
    """
    if samples_per_client is not None and not shares.min() > 0:
        raise _underflow(exponent, len(shares))
    if sizes is not None:
        return allocate(labels, rows, rng, sizes=sizes)
    if samples_per_client is not None:
        return allocate(labels, rows * shares[:, None], rng, samples_per_client)
    num_classes = rows.shape[1]
    available = np.bincount(labels, minlength=num_classes)
    demand = rows * shares[:, None]
    counts = _counts(available, demand, None)
    empty = np.flatnonzero(counts.sum(1) == 0)
    if not len(empty):
        return deal(labels, counts, rng)
    own = rows > 0
    unserved = np.flatnonzero(~(own & (available > 0)).any(1))
    if len(unserved):  # clients whose classes have no training sample at all
        raise _empty_error(scheme, labels, rows, empty, unserved[0])
    held = demand.sum(0)
    x = demand * np.divide(available, held, out=np.zeros(num_classes), where=held > 0)  # x_kc
    counts = _even_out(counts, x, _at_least_one(x.sum(1), len(labels)))
    empty = np.flatnonzero(counts.sum(1) == 0)
    if len(empty) and not _fill_empty(counts, own):  # some client's classes cannot give it a sample
        raise _empty_error(scheme, labels, rows, empty, empty[0], own_classes=True)
    return deal(labels, counts, rng)


def _even_out(counts: np.ndarray, x: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Move single samples within classes from clients holding more than ``targets`` to clients
    holding fewer, every count staying the floor or the ceiling of its share ``x`` (so each class
    keeps its total and a client gets only classes it has a share of).

    In passes over the classes: in class c, the clients furthest above their target that hold
    more than ``floor(x_kc)`` give one sample each to as many clients furthest below theirs that
    hold less than ``ceil(x_kc)``; until a pass moves nothing.  O(K C log K) a pass.
    """
    t = counts.copy()
    lo, hi = np.floor(x + 1e-9), np.ceil(x - 1e-9)
    held = t.sum(1)
    while True:
        moved = 0
        for c in range(t.shape[1]):
            gap = held - targets
            give = np.flatnonzero((gap > 0) & (t[:, c] > lo[:, c]))
            take = np.flatnonzero((gap < 0) & (t[:, c] < hi[:, c]))
            n = min(len(give), len(take))
            if not n:
                continue
            give = give[np.argsort(-gap[give], kind="stable")[:n]]
            take = take[np.argsort(gap[take], kind="stable")[:n]]
            t[give, c] -= 1
            t[take, c] += 1
            held[give] -= 1
            held[take] += 1
            moved += n
        if not moved:
            return t


def _fill_empty(t: np.ndarray, own: np.ndarray) -> bool:
    """Give every client without a sample one of its own classes (``own``), in place: one sample
    at a time along a shortest path from a client holding two or more, client -> class -> client
    ... (each client on the way gives one sample of the class before it and takes one of the class
    after it, so it keeps its total): :func:`_augment` on the transposed table, clients in the
    role of classes.  False if some client cannot be reached (its classes' samples all held by
    clients that hold one only)."""
    while True:
        held = t.sum(1)
        if held.min() > 0:
            return True
        excess = np.where(held > 1, held - 1, -(held == 0).astype(np.int64))
        if not _augment(t.T, excess, (t > 0).T, own.T):
            return False


def _at_least_one(totals: np.ndarray, total: int) -> np.ndarray:
    """Non-negative reals summing to ``total`` >= their number, rounded to integers summing to
    ``total`` of at least 1 each: largest remainder (:func:`_round_to_total`), then every 0 raised
    to 1 with units taken from the largest, one at a time from whichever is then largest (ties:
    the lower index)."""
    sizes = _round_to_total(totals, total)
    need = int((sizes == 0).sum())
    if not need:
        return sizes
    sizes = np.maximum(sizes, 1)
    spare = sizes - 1  # unit j (0-based) of client k is given at size sizes[k] - j
    owner = np.repeat(np.arange(len(sizes)), spare)
    at = sizes[owner] - (np.arange(len(owner)) - np.repeat(np.cumsum(spare) - spare, spare))
    given = owner[np.lexsort((owner, -at))[:need]]
    return sizes - np.bincount(given, minlength=len(sizes))


def _law_sizes(labels, shares, ranks, exponent, samples_per_client) -> np.ndarray | None:
    """:func:`client_sizes` under ``sizes=powerlaw`` with all the data (None otherwise: equal
    sizes, or ``samples_per_client``); a client whose share rounds to 0 samples is a ConfigError
    giving the largest exponent at which none does (same ranks)."""
    if ranks is None or samples_per_client is not None:
        return None
    total = len(labels)
    sizes = client_sizes(shares, total)
    empty = np.flatnonzero(sizes == 0)
    if not len(empty):
        return sizes
    num_clients = len(shares)
    lo, hi = 0.0, float(exponent)  # lo works (equal sizes, when K <= N), hi does not
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if client_sizes(_zipf(ranks, mid), total).min() > 0 else (lo, mid)
    allowed = f"must be at most {_floor3(lo):.3g} here" if lo > 0 else "no value > 0 works"
    fits = lambda k: client_sizes(_zipf(np.arange(1.0, k + 1), exponent), total).min() > 0  # noqa: E731
    lo, hi = 1, num_clients  # fits(1); not fits(num_clients) (the ranks' order changes no size)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    message = (f"partition.sizes=powerlaw cannot be built: {len(empty)} of {num_clients} clients would get "
               f"no sample (the first is client {empty[0]}), the smallest client's share being "
               f"{total * shares.min():.2g} of the {total} samples; {allowed} (or use fewer clients: at this "
               f"exponent the largest K here is {lo:,}; or set partition.samples_per_client)")
    raise ConfigError("partition.power_law_exponent", exponent, message)


def _floor3(x: float) -> float:
    """``x`` rounded down to 3 significant digits."""
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.floor(x / step) * step


def _empty_error(scheme, labels, rows, empty, first, own_classes: bool = False) -> ConfigError:
    """Equal sizes: why clients get nothing (``own_classes``: nothing of their own classes), the
    first of them being client ``first``, and what is allowed: for ``classes`` at most
    ``K' = floor(C min_c n_c / k)`` clients always works, every class then having at least one
    sample for each of its ``ceil(K' k / C)`` holders."""
    num_clients, num_classes = rows.shape
    available = np.bincount(labels, minlength=num_classes)
    what = "no sample of its own classes" if own_classes else "no sample"
    head = f"{len(empty)} of {num_clients} clients would get {what} (the first is client {first})"
    if scheme == "dirichlet":
        return ConfigError("partition", scheme,
                           f"cannot be built: {head}; raise partition.alpha, use fewer clients "
                           "(hyperparams.num_clients) or set partition.samples_per_client (every client "
                           "then gets exactly that many)")
    # classes, mixed: the client's classes are dealt to more clients than they can serve.
    held = np.flatnonzero(rows[first] > 0)
    holders = (rows > 0).sum(0)
    detail = ", ".join(f"class {c}: {available[c]} samples shared by {holders[c]} clients" for c in held[:3])
    detail += f" and {len(held) - 3} more" if len(held) > 3 else ""
    absent = [int(c) for c in held if available[c] == 0]
    if absent:
        advice = (f"class {absent[0]} has no training sample (the training labels cover only "
                  f"{', '.join(str(c) for c in np.flatnonzero(available))})")
    else:
        advice = ("use fewer clients (hyperparams.num_clients), more classes per client "
                  "(partition.classes_per_client), or set partition.samples_per_client")
        per = int(round(1 / rows[rows > 0].max())) if scheme == "classes" else 0  # classes per client
        safe = num_classes * int(available.min()) // per if per else 0
        if safe >= 1:
            advice += f"; at most {safe} clients always works with balanced sizes"
    return ConfigError("partition", scheme, f"cannot be built: {head}; its classes are dealt to more "
                       f"clients than they can serve ({detail}); {advice}")


# ----------------------------------------------------------------------------- schemes

def iid(labels, num_clients: int, num_classes: int, seed: int, sizes: str = "balanced",
        power_law_exponent: float = 1.0, samples_per_client: int | None = None) -> list[np.ndarray]:
    """Every client draws from every class in the dataset's proportions (``n_c / K`` of class c;
    with K above a class's size, each client gets about ``N / K`` samples, at least one: any
    K <= N builds, :func:`_build`).

    ``sizes=powerlaw``: client k holds exactly ``n_k = s_k N`` samples (:func:`client_sizes`),
    ``n_k n_c / N`` of class c (rounded keeping both sums: :func:`fit_counts`).
    """
    labels = _labels(labels, num_classes)
    _check_clients(num_clients, labels, "iid")
    _check_samples_per_client(samples_per_client)
    rng = numpy_rng(seed, "partition")
    shares, ranks = _shares(num_clients, sizes, power_law_exponent, rng)
    law = _law_sizes(labels, shares, ranks, power_law_exponent, samples_per_client)
    if law is None:
        rows = np.ones((num_clients, num_classes))
    else:
        rows = np.tile(np.bincount(labels, minlength=num_classes) / len(labels), (num_clients, 1))
    return _build("iid", labels, rows, shares, power_law_exponent, rng, samples_per_client, law)


ASSIGNMENTS = ("balanced", "niidbench")


def niidbench_classes(num_clients: int, k: int, num_classes: int, rng) -> np.ndarray:
    """``[K, k]`` classes per client as NIID-Bench assigns them (Li, Diao, Chen, He, ICDE 2022,
    "quantity-based label imbalance", ``noniid-#label<k>`` in its ``utils.partition_data``):
    client i takes class ``i mod C`` first, then ``k - 1`` other classes drawn uniformly at random
    until distinct.  A class may so have many holders or none (its samples are then unused)."""
    _check_k(k, num_classes)
    out = np.empty((num_clients, k), dtype=np.int64)
    for client in range(num_clients):
        held = [client % num_classes]
        while len(held) < k:
            c = int(rng.integers(num_classes))
            if c not in held:
                held.append(c)
        out[client] = held
    return out


def classes(labels, num_clients: int, num_classes: int, seed: int, classes_per_client: int = 2,
            sizes: str = "balanced", power_law_exponent: float = 1.0,
            samples_per_client: int | None = None, assign: str = "balanced") -> list[np.ndarray]:
    """k classes per client ("clients have images of only 2 classes", Nagura et al. sec. 5.1).

    Equal sizes: each class held by as equal a number of clients as possible
    (:func:`assign_classes`) and its samples split evenly among them.  ``sizes=powerlaw``: client k
    holds exactly ``n_k = s_k N`` samples (:func:`client_sizes`), about ``n_k / k`` of each of its
    classes, dealt so that the classes can serve them (:func:`deal_classes`, :func:`fit_counts`).

    ``assign=niidbench``: NIID-Bench's ``#C=k`` (:func:`niidbench_classes`): client i holds class
    ``i mod C`` and ``k - 1`` classes drawn at random, each class's samples split evenly among its
    holders (so clients differ in size, and with K < C or an unlucky draw a class goes unused).
    It needs ``sizes=balanced``.
    """
    labels = _labels(labels, num_classes)
    _check_clients(num_clients, labels, "classes")
    _check_samples_per_client(samples_per_client)
    if assign not in ASSIGNMENTS:
        raise ConfigError("partition.assign", assign, f"choose one of: {', '.join(ASSIGNMENTS)}")
    check(assign == "balanced" or sizes == "balanced", "partition.assign", assign,
          "NIID-Bench's assignment fixes the clients' sizes by the classes' holders: use partition.sizes=balanced")
    rng = numpy_rng(seed, "partition")
    shares, ranks = _shares(num_clients, sizes, power_law_exponent, rng)
    law = _law_sizes(labels, shares, ranks, power_law_exponent, samples_per_client)
    if assign == "niidbench":
        held = niidbench_classes(num_clients, classes_per_client, num_classes, rng)
        rows = np.zeros((num_clients, num_classes))
        np.put_along_axis(rows, held, 1.0 / classes_per_client, axis=1)
        # A class nobody holds goes unused, as in NIID-Bench (allocate gives a class nobody asks for to nobody).
        return _build("classes", labels, rows, shares, power_law_exponent, rng, samples_per_client, law)
    if law is None:
        held = assign_classes(num_clients, classes_per_client, num_classes, rng)
        rows = np.zeros((num_clients, num_classes))
        np.put_along_axis(rows, held, 1.0 / classes_per_client, axis=1)
    else:
        available = np.bincount(labels, minlength=num_classes)
        rows = deal_classes(law, classes_per_client, available, rng).astype(float)
    return _build("classes", labels, rows, shares, power_law_exponent, rng, samples_per_client, law)


def dirichlet(labels, num_clients: int, num_classes: int, seed: int, alpha: float = 0.5,
              sizes: str = "balanced", power_law_exponent: float = 1.0,
              samples_per_client: int | None = None) -> list[np.ndarray]:
    """Client class proportions ``p_k ~ Dir(alpha)``: small alpha, few classes per client.

    ``sizes=powerlaw``: client k holds exactly ``n_k = s_k N`` samples, split by ``p_k`` as far as
    the classes allow (a class wanted beyond its size is cut and the client's shortfall taken
    from its other classes in proportion to ``p_k``: :func:`fit_counts`).
    """
    labels = _labels(labels, num_classes)
    _check_clients(num_clients, labels, "dirichlet")
    _positive("partition.alpha", alpha, " (small: few classes per client; large: near IID)")
    _check_samples_per_client(samples_per_client)
    rng = numpy_rng(seed, "partition")
    shares, ranks = _shares(num_clients, sizes, power_law_exponent, rng)
    law = _law_sizes(labels, shares, ranks, power_law_exponent, samples_per_client)
    rows = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
    if not (np.isfinite(rows).all() and (rows.sum(1) > 0).all()):  # alpha so small it underflows
        raise ConfigError("partition.alpha", alpha, "is too small to draw class proportions; must be a "
                          "finite number > 0, e.g. 0.01 or more")
    return _build("dirichlet", labels, rows, shares, power_law_exponent, rng, samples_per_client, law)


LABEL_DRAWS = 1000  # dirichlet_labels: how many draws may fail partition.min_size before the error


def _balance(shares: np.ndarray, available: np.ndarray, num_clients: int) -> np.ndarray:
    """NIID-Bench's "Balance" step of ``noniid-labeldir`` (its ``utils.partition_data``): classes are
    dealt in order, and a client that already holds ``N / K`` samples or more takes no share of the
    classes after; each class's shares are renormalized over the clients left."""
    cap = available.sum() / num_clients
    held = np.zeros(num_clients)
    out = np.empty_like(shares)
    for c, q in enumerate(shares):
        open_ = held < cap
        q = q * open_
        # Dirichlet shares that underflow to 0 on every open client: split the class among them evenly.
        out[c] = q / q.sum() if q.sum() > 0 else open_ / open_.sum()
        held += _round_to_total(available[c] * out[c], int(available[c]))
    return out


def dirichlet_labels(labels, num_clients: int, num_classes: int, seed: int, alpha: float = 0.5,
                     min_size: int = 10, balance: bool = False) -> list[np.ndarray]:
    """Each class split over the clients by ``q_c ~ Dir(alpha 1_K)`` (label-wise Dirichlet).

    For every class c with ``n_c`` samples a share vector over the K clients is drawn,
    ``q_c = (q_c1, ..., q_cK) ~ Dir(alpha, ..., alpha)``, and client k receives
    ``n_ck ~= n_c q_ck`` of class c's shuffled samples (largest-remainder rounding, so
    ``sum_k n_ck = n_c``: every sample goes to exactly one client).  Client sizes follow from the
    draw (``n_k = sum_c n_ck``).  If a client gets fewer than ``min_size`` samples, all the
    classes are drawn again, up to :data:`LABEL_DRAWS` times; a draw that leaves
    :data:`SHORT_STOP` clients or more short ends the redraws (the number short being about
    Poisson, a draw leaving none then has a chance of about ``exp(-40)``), and the refusal names
    about the largest K a draw serves half the time (:func:`labels_limit`).

    ``balance=False`` is flwr-datasets' ``DirichletPartitioner(partition_by="label",
    self_balancing=False)`` (its default; Yurochkin et al. 2019), so an alpha here means what it
    means there; it too redraws until every client holds ``min_partition_size`` samples (default
    10).  It cuts class c at ``floor(n_c cumsum(q_c))``, which differs from the rounding here by at
    most one sample per client and class.  :func:`dirichlet` is the client-wise scheme:
    ``p_k ~ Dir(alpha 1_C)`` over the classes for each client, and the same alpha gives a
    different split.

    ``balance=True``: NIID-Bench's ``noniid-labeldir`` (Li, Diao, Chen, He, ICDE 2022, "p_k ~
    Dir(beta)") and FL-bench's ``data/utils/schemes/dirichlet.py``, which always balances: the
    classes are dealt in order and a client already holding ``N / K`` samples takes no share of
    the classes after (:func:`_balance`), redrawing while a client has fewer than ``min_size``
    (10 in NIID-Bench; FL-bench's ``--least_samples`` defaults to 40).  Client sizes then stay
    closer to ``N / K`` and clients hold fewer classes (alpha 0.5, 10 clients: size CV 0.25 and
    2.30 bits of label entropy against 0.37 and 2.49 unbalanced;
    ``tests/test_partition_niidbench.py`` checks these against FL-bench's rule).  flwr-datasets'
    ``self_balancing=True`` closes a client only above ``N / K`` (``>`` where these use ``>=``).
    """
    labels = _labels(labels, num_classes)
    check(_integer(num_clients) and num_clients >= 1, "hyperparams.num_clients", num_clients,
          "must be an integer >= 1")
    _positive("partition.alpha", alpha, " (small: each class on few clients; large: near IID)")
    total, most = len(labels), len(labels) // num_clients
    available = np.bincount(labels, minlength=num_classes)
    valid = _integer(min_size) and min_size >= 1

    def largest() -> str:  # only on a refusal: it draws
        limit = labels_limit(available, alpha, min_size if valid else 1, balance, seed)
        return (f"the largest K here is about {limit:,} (where a draw leaves every client partition.min_size="
                f"{min_size if valid else 1} samples or more half the time)")

    if num_clients > total:
        raise ConfigError("hyperparams.num_clients", num_clients,
                          f"partition=dirichlet_labels gives every client at least partition.min_size="
                          f"{min_size if valid else 1} samples and the training set has {total:,}: {largest()}")
    if not (valid and min_size <= most):
        raise ConfigError("partition.min_size", min_size,
                          f"must be an integer between 1 and {most} (the training set has {total} samples for "
                          f"{num_clients} clients)" + (f"; or use fewer clients (hyperparams.num_clients): "
                                                        f"{largest()}" if valid else ""))
    rng = numpy_rng(seed, "partition")
    concentration = np.full(num_clients, float(alpha))
    for draw in range(1, LABEL_DRAWS + 1):
        shares = rng.dirichlet(concentration, size=num_classes)  # [C, K]: row c is q_c
        if not (np.isfinite(shares).all() and (shares.sum(1) > 0).all()):  # alpha so small it underflows
            raise ConfigError("partition.alpha", alpha, "is too small to draw class shares; must be a "
                              "finite number > 0, e.g. 0.01 or more")
        if balance:
            shares = _balance(shares, available, num_clients)
        counts = _counts(available, shares.T, None)
        short = int((counts.sum(1) < min_size).sum())
        if not short:
            return deal(labels, counts, rng)
        if short >= SHORT_STOP:  # a draw with none short has a chance of about exp(-short): stop drawing
            break
    if draw == LABEL_DRAWS and short < SHORT_STOP:
        what = (f"in each of {LABEL_DRAWS} draws of Dirichlet(alpha={alpha}) over {num_clients:,} clients some client "
                f"got fewer than {min_size} samples")
    else:  # a draw leaving that many short: one leaving none has a chance of about exp(-short)
        what = (f"draw {draw} of Dirichlet(alpha={alpha}) over {num_clients:,} clients left {short:,} of them with "
                f"fewer than {min_size} samples, so no redraw will leave none")
    raise ConfigError("partition.min_size", min_size, f"not met: {what}; raise partition.alpha or lower "
                      f"partition.min_size, or use fewer clients (hyperparams.num_clients): {largest()}")


SHORT_STOP = 40  # dirichlet_labels: a draw leaving this many clients short ends the redraws


def _label_sizes(available: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """The client sizes of a label-wise draw ``shares`` ``[C, K]``: each class's largest-remainder
    cut as :func:`_counts` makes it, ties among equal remainders broken in any order (an estimate's
    input: O(K) a class, :func:`numpy.argpartition` where :func:`_counts` sorts)."""
    sizes = np.zeros(shares.shape[1], dtype=np.int64)
    for n, q in zip(available.tolist(), shares):
        x = n * q / q.sum() if q.sum() > 0 else q
        base = np.floor(x).astype(np.int64)
        rest = int(n - base.sum())
        if rest > 0:
            base[np.argpartition(base - x, rest - 1)[:rest]] += 1
        sizes += base
    return sizes


def labels_limit(available: np.ndarray, alpha: float, min_size: int, balance: bool, seed: int) -> int:
    """About the largest K at which a draw of :func:`dirichlet_labels` gives every client
    ``min_size`` samples or more at least half the time.

    The number of clients a draw leaves short is about Poisson (many clients, each short with a
    small chance), so a draw succeeds with chance about ``exp(-m)``, ``m`` its mean: the largest K
    with ``m <= ln 2``, ``m`` counted over draws of its own (as many as give 50,000 clients, at
    most 20, or one that leaves 10 or more short; seeded from ``seed``, so the answer is
    reproducible), by bisection between K = 1 (one client holds all N samples) and ``N // min_size``.
    """
    rng = numpy_rng(seed, "partition", "limit")

    def mean_short(num_clients: int) -> float:
        draws, short = int(min(20, max(1, 50_000 // num_clients))), 0
        for draw in range(1, draws + 1):
            shares = rng.dirichlet(np.full(num_clients, float(alpha)), size=len(available))
            if not np.isfinite(shares).all():
                return math.inf
            if balance:
                shares = _balance(shares, available, num_clients)
            short += int((_label_sizes(available, shares) < min_size).sum())
            if short >= 10:  # far above ln 2 already
                return short / draw
        return short / draws

    lo, hi = 1, int(available.sum()) // min_size + 1  # lo: one client holds everything; hi: too many
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if mean_short(mid) <= math.log(2) else (lo, mid)
    return lo


def mixed(labels, num_clients: int, num_classes: int, seed: int, iid_clients: int = 5,
          classes_per_client: int = 2, sizes: str = "balanced", power_law_exponent: float = 1.0,
          samples_per_client: int | None = None) -> list[np.ndarray]:
    """The first ``iid_clients`` clients IID, the others ``classes_per_client`` classes each
    (FedLayerWise's scenarios: 5 IID + 5 non-IID, 2 IID + 8 non-IID).

    ``sizes=powerlaw``: client k holds exactly ``n_k = s_k N`` samples, the IID ones in the
    dataset's class proportions, the others dealt classes around what the IID ones take
    (:func:`deal_classes`, :func:`fit_counts`).
    """
    labels = _labels(labels, num_classes)
    _check_clients(num_clients, labels, "mixed")
    check(_integer(iid_clients) and 0 <= iid_clients <= num_clients, "partition.iid_clients",
          iid_clients, f"must be an integer between 0 and num_clients ({num_clients})")
    _check_samples_per_client(samples_per_client)
    rng = numpy_rng(seed, "partition")
    shares, ranks = _shares(num_clients, sizes, power_law_exponent, rng)
    law = _law_sizes(labels, shares, ranks, power_law_exponent, samples_per_client)
    rows = np.full((num_clients, num_classes), 1.0 / num_classes)
    skewed = num_clients - iid_clients
    if law is not None:
        available = np.bincount(labels, minlength=num_classes)
        rows[:iid_clients] = available / len(labels)
        if skewed:
            promised = law[:iid_clients].sum() * available / len(labels)
            rows[iid_clients:] = deal_classes(law[iid_clients:], classes_per_client, available, rng, promised)
    elif skewed:
        held = assign_classes(skewed, classes_per_client, num_classes, rng)
        skewed_rows = np.zeros((skewed, num_classes))
        np.put_along_axis(skewed_rows, held, 1.0 / classes_per_client, axis=1)
        rows[iid_clients:] = skewed_rows
    return _build("mixed", labels, rows, shares, power_law_exponent, rng, samples_per_client, law)


def shards(labels, num_clients: int, num_classes: int, seed: int, shards_per_client: int = 2,
           shard_size: int | None = None) -> list[np.ndarray]:
    """Sort by label, cut ``S = shards_per_client * K`` shards, deal them at random.

    McMahan et al.'s pathological non-IID split (FedLap sec. V.A: "we sort data by the class label,
    we divide it into 200 chunks of size 300, 300, and 200 respectively for MNIST, FashionMNIST,
    and CIFAR10, and we give 2 chunks to each client").  The label-sorted data is cut into S
    segments of ``L = N // S`` samples (the N - S L left over by the division are not used);
    shard s is the first ``shard_size`` samples of segment s (all L when ``shard_size`` is null),
    the rest of the segment unused.  Within a label the order is random, so the unused samples
    are a random draw and each class keeps its share: CIFAR-10 (N = 50,000), 100 clients x 2
    shards of 200: 200 segments of 250, 40,000 images used, 4,000 of each class.
    """
    labels = _labels(labels, num_classes)
    check(_integer(num_clients) and num_clients >= 1, "hyperparams.num_clients", num_clients,
          "must be an integer >= 1")
    total, valid = len(labels), _integer(shards_per_client) and shards_per_client >= 1
    per = shards_per_client if valid else 1
    if num_clients > total:
        raise too_many_clients(num_clients, total // per, "shards", f"deals every client partition.shards_per_client="
                               f"{per} shards of at least one sample and the training set has {total:,}")
    most = total // num_clients
    check(valid and shards_per_client <= most, "partition.shards_per_client", shards_per_client,
          f"must be an integer between 1 and {most} (every shard needs a sample: the training set has {total} "
          f"samples for {num_clients} clients)" + (f"; or use at most {total // per:,} clients "
                                                   "(hyperparams.num_clients)" if valid and total >= per else ""))
    num_shards = num_clients * shards_per_client
    segment = len(labels) // num_shards
    if shard_size is not None:
        check(_integer(shard_size) and 1 <= shard_size <= segment, "partition.shard_size", shard_size,
              f"must be an integer between 1 and {segment}, or null for {segment} (the training set has "
              f"{len(labels)} samples for {num_clients} clients x {shards_per_client} shards)")
    size = segment if shard_size is None else shard_size
    rng = numpy_rng(seed, "partition")
    # Shuffle before the stable sort so a shard's samples within one label are a random draw.
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    # [K, shards_per_client * size]: client k's shards s, each order[s L : s L + size], sorted.
    held = order[(dealt[:, :, None] * segment + np.arange(size)).reshape(num_clients, -1)]
    return list(np.sort(held, axis=1))


# ----------------------------------------------------------------------------- records

def class_counts(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The clients x classes table of sample counts (O(N + K C): one bincount over all clients)."""
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    if not sizes.sum():
        return np.zeros((len(parts), num_classes), dtype=np.int64)
    owner = np.repeat(np.arange(len(parts)), sizes)
    held = np.asarray(labels)[np.concatenate(parts)]
    return np.bincount(owner * num_classes + held, minlength=len(parts) * num_classes).reshape(len(parts), num_classes)


def fingerprint(parts: list[np.ndarray]) -> str:
    """A 16-hex-digit hash of who holds which sample: equal iff the partitions are equal."""
    h = hashlib.sha256()
    for p in parts:
        h.update(np.asarray(p, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


NATURAL_ORDERS = ("largest", "id")


def natural(labels, num_clients: int, num_classes: int, seed: int, groups=None, min_examples: int = 1,
            order: str = "largest") -> list[np.ndarray]:
    """The data's own clients (LEAF's writers, a table's users: :mod:`fedrun.data.natural`): K of
    them, each with its own examples, as flwr-datasets' ``NaturalIdPartitioner`` keeps them.

    Of the clients with at least ``min_examples`` training examples, the K = ``num_clients``
    largest (``order=largest``; ties to the lower id) or the K first by id (``order=id``) are kept,
    and returned in the order of their ids; the other clients' examples go unused.  ``groups``:
    each training example's client id (the run hands it over from the dataset); ``seed`` does not
    enter (the clients are the data's).
    """
    labels = _labels(labels, num_classes)
    if groups is None:
        raise ConfigError("partition", "natural", "keeps the clients a dataset names, and this dataset has no client "
                          "ids: use dataset=femnist or dataset=table (with its client_column), or another partition")
    groups = np.asarray(groups, dtype=np.int64)
    check(len(groups) == len(labels), "partition", "natural", f"needs one client id per training example "
          f"({len(labels):,}), got {len(groups):,}")
    check(_integer(min_examples) and min_examples >= 1, "partition.min_examples", min_examples,
          "must be an integer >= 1")
    if order not in NATURAL_ORDERS:
        raise ConfigError("partition.order", order, f"choose one of: {', '.join(NATURAL_ORDERS)}")
    check(_integer(num_clients) and num_clients >= 1, "hyperparams.num_clients", num_clients, "must be an integer >= 1")
    ids, counts = np.unique(groups, return_counts=True)
    eligible = counts >= min_examples
    ids, counts = ids[eligible], counts[eligible]
    if len(ids) < num_clients:
        raise ConfigError("hyperparams.num_clients", num_clients, f"partition=natural keeps that many of the data's "
                          f"clients, and it has {len(ids):,} with at least {min_examples} training example(s): choose "
                          f"hyperparams.num_clients <= {len(ids):,}" + (" or a lower partition.min_examples"
                                                                         if min_examples > 1 else ""))
    rank = np.lexsort((ids, -counts)) if order == "largest" else np.argsort(ids, kind="stable")
    kept = np.sort(ids[rank[:num_clients]])
    # One pass over the examples: sorted by client (stably, so each client's rows keep file order).
    by_client = np.argsort(groups, kind="stable")
    starts = np.searchsorted(groups[by_client], kept, side="left")
    ends = np.searchsorted(groups[by_client], kept, side="right")
    return [by_client[a:b].astype(np.int64) for a, b in zip(starts, ends)]


def client_ids(partition, train_groups) -> dict:
    """The keyword a partition takes for the data's own clients: ``groups`` (each training
    example's client id) for :func:`natural` (any partition whose signature names ``groups``),
    nothing for the others, which split the data themselves whatever clients it has."""
    import inspect

    try:
        takes = "groups" in inspect.signature(partition).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return {}
    return {"groups": None if train_groups is None else train_groups.cpu().numpy()}


def client_test_rows(parts: list[np.ndarray], train_groups, test_groups) -> list[np.ndarray] | None:
    """Each client's own test examples: the test rows whose client id is the id its training
    examples share (natural clients, :func:`natural`).  None when the data has no per-client test
    split, or when a partition mixed the data's clients (then no client owns test data)."""
    if train_groups is None or test_groups is None:
        return None
    train_groups = np.asarray(train_groups.cpu() if hasattr(train_groups, "cpu") else train_groups)
    test_groups = np.asarray(test_groups.cpu() if hasattr(test_groups, "cpu") else test_groups)
    ids = []
    for part in parts:
        own = np.unique(train_groups[part])
        if len(own) != 1:
            return None
        ids.append(own[0])
    order = np.argsort(test_groups, kind="stable")
    sorted_ids = test_groups[order]
    starts, ends = np.searchsorted(sorted_ids, ids, side="left"), np.searchsorted(sorted_ids, ids, side="right")
    return [order[a:b].astype(np.int64) for a, b in zip(starts, ends)]
