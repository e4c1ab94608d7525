"""Who takes part in a round: which clients the server asks (sampling), and unreliable clients
among them (stragglers and drop-outs), all drawn per round from (seed, round).

Sampling (``hyperparams.sampling``), m = max(C K, 1) clients a round:

* ``uniform`` (the papers' FedAvg, Nagura et al. Alg. 1 lines 3-4; McMahan et al. 2017): m of the K
  clients, without replacement, each set equally likely.  Every client is in a round with
  probability m/K, so the aggregate's weights (``n_k / n`` over the sampled) estimate the
  full-participation average with a bias only from the ratio of sums (none with equal sizes).
* ``poisson``: each client independently with probability ``q = m/K`` (Poisson sampling), so a
  round has m clients on average (binomial; it may have none, and the server then keeps ``w_t``).
  The sampling that DP-FedAvg's analysis assumes (McMahan et al., ICLR 2018; Andrew et al., NeurIPS
  2021): with ``privacy.accounting=poisson`` the epsilon fedrun reports is then a guarantee for the
  run.  Every client is in a round with probability q, as under ``uniform``; the aggregate's
  ``n_k / n`` weights are a ratio estimator again (unbiased with equal sizes), but over a random
  number of clients (more variance than ``uniform`` at the same m).
* ``size``: m of the K without replacement, drawn one after another with probability proportional
  to n_k (``torch.multinomial``), as FLGo's and pfl-research's size-weighted samplers.  Large clients
  are then both likelier sampled and, with ``aggregator.weighting=examples``, weighted more: the
  aggregate leans towards them (biased).  Li et al. (ICLR 2020, "On the convergence of FedAvg on
  non-IID data", scheme I) sample *with* replacement by n_k and average *uniformly*, which is
  unbiased; without replacement and with ``weighting=uniform`` the estimate is unbiased only as
  m/K -> 0 (drawing without replacement flattens the probabilities of the largest clients).
* ``available``: only clients reachable that round can be asked (cross-device FL: phones idle,
  charging, on Wi-Fi).  ``hyperparams.availability`` is either a probability p (each client
  reachable in each round with probability p, independently, drawn from (seed, round)) or the path
  of a CSV trace with columns ``round,client`` (one row for each client reachable in that round;
  rounds past the trace's last repeat it from its first).  m of the reachable clients are asked
  (uniformly; all of them when fewer than m are), so a round may have fewer than m.  A round
  in which no client is reachable asks the one whose draw came closest (a trace must list at
  least one client every round).  The aggregate estimates the average over the clients that are
  often reachable: biased wherever reachability goes with the data (Eichner et al., ICML 2019,
  "Semi-cyclic SGD").

Unreliable clients among the asked:

* A **straggler** "performs a random number of local updates in [1, E] and sends back to the
  server the LM it learned up to that time" (FedLap sec. V.C, after FedProx): here a random
  number of local *epochs*, uniform in {1, ..., E}.
* A **drop-out** returns nothing that round; the server aggregates the others.

All are redrawn every round from the seed, so every aggregator faces the same clients and failures.
"""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import torch

from fedrun.errors import ConfigError, DataError, check
from fedrun.seeding import sample_clients, torch_generator

SAMPLINGS = ("uniform", "poisson", "size", "available")


def _pick(fraction: float, pool: list[int], generator: torch.Generator, most: int | None = None) -> list[int]:
    """``round(fraction * len(pool))`` members of ``pool`` (rounded half up, at most ``most``)."""
    count = int(fraction * len(pool) + 0.5)
    if most is not None:
        count = min(count, most)
    chosen = set(torch.randperm(len(pool), generator=generator)[:count].tolist())
    return [c for i, c in enumerate(pool) if i in chosen]


def read_trace(path: str | Path) -> dict[int, list[int]]:
    """An availability trace: ``{round: sorted clients reachable}`` from a CSV with columns
    ``round,client`` (integers; rounds from 1, clients from 0).  Every round from 1 to the last
    listed needs at least one client.  A bad file is one line naming it (and the line)."""
    file = Path(path).expanduser()
    where = f"hyperparams.availability: {file}"
    if not file.is_file():
        raise DataError(f"{where} not found (a CSV of round,client rows: the clients reachable in each round)")
    rounds: dict[int, set[int]] = {}
    with open(file, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"round", "client"} <= set(reader.fieldnames):
            raise DataError(f"{where}: needs the columns round and client (it has: {', '.join(reader.fieldnames or [])})")
        for line, row in enumerate(reader, start=2):
            try:
                t, k = int(row["round"]), int(row["client"])
            except (TypeError, ValueError):
                raise DataError(f"{where}, line {line}: round and client must be integers "
                                f"(got {row['round']!r}, {row['client']!r})") from None
            if t < 1 or k < 0:
                raise DataError(f"{where}, line {line}: rounds count from 1 and clients from 0 (got round {t}, "
                                f"client {k})")
            rounds.setdefault(t, set()).add(k)
    if not rounds:
        raise DataError(f"{where}: lists no client")
    empty = [t for t in range(1, max(rounds) + 1) if t not in rounds]
    if empty:
        raise DataError(f"{where}: round {empty[0]} lists no client (every round of the trace needs one reachable)")
    return {t: sorted(clients) for t, clients in rounds.items()}


@dataclass(frozen=True)
class Participation:
    stragglers: float = 0.0  # share of the round's (non-dropped) clients that straggle
    dropouts: float = 0.0  # share of the round's sampled clients that return nothing
    sampling: str = "uniform"  # which clients are asked: uniform | size | available (see the module)
    availability: Union[float, str, None] = None  # sampling=available: a probability, or a CSV trace's path

    def __post_init__(self):
        check(0 <= self.stragglers <= 1, "hyperparams.stragglers", self.stragglers, "must be in [0, 1]")
        check(0 <= self.dropouts < 1, "hyperparams.dropouts", self.dropouts, "must be in [0, 1)")
        check(self.sampling in SAMPLINGS, "hyperparams.sampling", self.sampling, f"must be one of {', '.join(SAMPLINGS)}")
        if self.sampling != "available":
            check(self.availability is None, "hyperparams.availability", self.availability,
                  "is read only with hyperparams.sampling=available (leave it null)")
        elif isinstance(self.availability, bool) or not isinstance(self.availability, (int, float, str)):
            raise ConfigError("hyperparams.availability", self.availability, "must be a probability in (0, 1] or "
                              "the path of a CSV of round,client rows (sampling=available)")
        elif isinstance(self.availability, (int, float)):
            check(0 < self.availability <= 1, "hyperparams.availability", self.availability,
                  "must be a probability in (0, 1] (each client's chance to be reachable in a round)")
        else:
            self.trace  # read now: a bad file is refused before the run starts

    @functools.cached_property
    def trace(self) -> dict[int, list[int]] | None:
        """The availability trace, read once (None unless ``availability`` names a file)."""
        return read_trace(self.availability) if isinstance(self.availability, str) else None

    def check_clients(self, num_clients: int) -> None:
        """A trace's clients must be among the K: one line naming the first that is not."""
        if self.trace is not None:
            top = max(max(c) for c in self.trace.values())
            check(top < num_clients, "hyperparams.availability", self.availability,
                  f"lists client {top}, but there are K = {num_clients} clients (0 .. {num_clients - 1})")

    def reachable(self, seed: int, round_: int, num_clients: int) -> list[int]:
        """The clients reachable in ``round_`` (sampling=available): the trace's row (cyclic), or a
        Bernoulli(p) draw each; none drawn: the one whose draw came closest."""
        if self.trace is not None:
            return self.trace[(round_ - 1) % len(self.trace) + 1]
        draw = torch.rand(num_clients, generator=torch_generator(seed, "availability", round_))
        up = torch.nonzero(draw < self.availability).flatten().tolist()
        return up or [int(draw.argmin())]

    def sample(self, seed: int, round_: int, sizes: list[int], per_round: int) -> list[int]:
        """The clients asked in ``round_``, sorted: ``per_round`` of the ``len(sizes)`` clients (of
        ``sizes[k]`` examples each) by :attr:`sampling` (see the module)."""
        num_clients = len(sizes)
        if self.sampling == "available":
            pool = self.reachable(seed, round_, num_clients)
            if len(pool) <= per_round:
                return pool
            perm = torch.randperm(len(pool), generator=torch_generator(seed, "clients", round_))
            return sorted(pool[i] for i in perm[:per_round].tolist())
        if self.sampling == "uniform":  # Nagura et al., Alg. 1 lines 3-4
            return sample_clients(seed, round_, num_clients, per_round)
        if self.sampling == "poisson":  # each client with probability q = m/K, independently
            draw = torch.rand(num_clients, generator=torch_generator(seed, "poisson", round_))
            return torch.nonzero(draw < per_round / num_clients).flatten().tolist()
        if per_round >= num_clients:
            return list(range(num_clients))
        if self.sampling == "size":
            weights = torch.as_tensor(sizes, dtype=torch.float64)
            count = min(per_round, int((weights > 0).sum()))  # a client without examples is never drawn
            picked = torch.multinomial(weights, count, replacement=False,
                                       generator=torch_generator(seed, "clients", round_))
            return sorted(picked.tolist())
        raise AssertionError(self.sampling)  # __post_init__ allows no other

    def draw(self, seed: int, round_: int, clients: list[int], epochs: int):
        """Split the sampled clients into those who report and those who dropped out.

        Returns:
          ``(active, local_epochs, dropped, stragglers)``: the reporting clients, the epochs each
          runs (E, or uniform in [1, E] for a straggler), the dropped clients, and the set of
          clients drawn as stragglers (one may still draw all E epochs).
        """
        # Fewer than all: with dropouts < 1 at least one client reports every round.
        dropped = _pick(self.dropouts, clients, torch_generator(seed, "dropouts", round_), len(clients) - 1)
        active = [c for c in clients if c not in set(dropped)]
        slow = set(_pick(self.stragglers, active, torch_generator(seed, "stragglers", round_)))
        local_epochs = [
            int(torch.randint(1, epochs + 1, (1,), generator=torch_generator(seed, "straggler", round_, c)))
            if c in slow else epochs
            for c in active
        ]
        return active, local_epochs, dropped, slow
