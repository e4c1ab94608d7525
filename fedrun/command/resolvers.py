"""The config resolvers fedrun adds to OmegaConf (registered when the command floor, :mod:`fedrun.command.cli` or
:mod:`fedrun.command.build`, is imported).

``${fedrun.num_clients:K0,M,C,centralized}``: the number of clients K of a shrunk run
(``scale=tiny``, ``scale=smoke``) that keeps the preset's client fraction C and still trains at
least M clients a round: the smallest K >= K0 with ``m = max(C K, 1) >= M``; 1 for a centralized
run (``mode=centralized``: one learner).  With C = 0.1 and K0 = 10, one client
a round would make FedAvg, FedProx, Norm-Norm and Momentum the same method (N = E when one
client trains); K = 30 keeps three.

``${fedrun.default_of:CLASS,${.partitioner},VALUE}``: VALUE when the partitioner chosen is CLASS (by
its name or a dotted path ending in it), else null: ``partition=flwr``'s defaults are
DirichletPartitioner's alone, so another partitioner named never gets one of them, and the run's
config.yaml records what was passed.
"""
from __future__ import annotations

import math

from omegaconf import OmegaConf


def num_clients_for(at_least: int, per_round: int, client_fraction: float, centralized: bool = False) -> int:
    """The smallest K >= ``at_least`` whose rounds of ``m = max(C K, 1)`` clients (C K rounded half
    up, as :func:`fedrun.seeding.clients_per_round`) hold at least ``per_round`` clients; 1 when
    ``centralized``.  A fraction outside (0, 1] returns ``at_least`` and is refused by the
    settings check."""
    if centralized is True:
        return 1
    at_least, per_round, fraction = int(at_least), int(per_round), float(client_fraction)
    if not 0 < fraction <= 1:
        return at_least
    k = at_least
    while max(math.floor(fraction * k + 0.5), 1) < per_round:
        k += 1
    return k


def default_of(owner: str, chosen, value):
    """``value`` when ``chosen`` (``partition.partitioner``: a class name or ``module.Class``) is
    the class ``owner``, else None (not passed: the chosen class's own default)."""
    return value if str(chosen).rsplit(".", 1)[-1] == owner else None


OmegaConf.register_new_resolver("fedrun.num_clients", num_clients_for, replace=True)
OmegaConf.register_new_resolver("fedrun.default_of", default_of, replace=True)
