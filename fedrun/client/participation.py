"""Unreliable clients: stragglers and drop-outs, drawn per round from (seed, round).

* A **straggler** "performs a random number of local updates in [1, E] and sends back to the
  server the LM it learned up to that time" (FedLap sec. V.C, after FedProx): here a random
  number of local *epochs*, uniform in {1, ..., E}.
* A **drop-out** returns nothing that round; the server aggregates the others.

Both are redrawn every round from the seed, so every aggregator faces the same failures.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedrun.errors import check
from fedrun.seeding import torch_generator


def _pick(fraction: float, pool: list[int], generator: torch.Generator, most: int | None = None) -> list[int]:
    """``round(fraction * len(pool))`` members of ``pool`` (rounded half up, at most ``most``)."""
    count = int(fraction * len(pool) + 0.5)
    if most is not None:
        count = min(count, most)
    chosen = set(torch.randperm(len(pool), generator=generator)[:count].tolist())
    return [c for i, c in enumerate(pool) if i in chosen]


@dataclass(frozen=True)
class Participation:
    stragglers: float = 0.0  # share of the round's (non-dropped) clients that straggle
    dropouts: float = 0.0  # share of the round's sampled clients that return nothing

    def __post_init__(self):
        check(0 <= self.stragglers <= 1, "hyperparams.stragglers", self.stragglers, "must be in [0, 1]")
        check(0 <= self.dropouts < 1, "hyperparams.dropouts", self.dropouts, "must be in [0, 1)")

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
