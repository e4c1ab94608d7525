"""A round's lock-step plan: which clients take each local step, and on which samples, worked out
before the first step.

The batched engine trains a chunk of clients in lock-step: step s of the loop is every client's
s-th optimizer step (Nagura et al. Alg. 2 line 4, for all clients at once).  Client k, holding
n_k samples, with batch size B and E_k local epochs (fewer for a straggler), takes

    tau_k = E_k * ceil(n_k / B)                                                     (1)

steps; its step s uses the batch of ``min(B, n_k - i B)`` samples, ``i = s mod ceil(n_k / B)``,
cut from the permutation it drew for epoch ``floor(s / ceil(n_k / B))``.  So the whole round's
schedule follows from (n_k, B, E_k) alone: which clients are still training at step s, in groups of
equal batch size (vmapped together; nearly always one group), and where each group's batches
start in the round's sample order.  :class:`RoundPlan` computes all of it on the host at once, and
moves it to the device in one transfer, so the training loop does no host work per step: no
Python loop over clients, no ``torch.tensor`` from lists, no device sync.

Compaction.  A client that has finished leaves the step.  With ``bucketed=True`` a group of g
clients is padded to a fixed size, the next power of two (at most the chunk's m), so the shapes
repeat from step to step and each shape's step can be captured once and replayed
(:mod:`fedrun.client.captured`): a round of an unbalanced partition, whose largest client takes
ten times the mean client's steps, runs its last steps as a one-client step.  Padding rows point
at a scratch row of every stacked tensor: they compute on a real batch (sample 0's), and what they
write lands in the scratch row, never in a client's update, BatchNorm statistic, optimizer state
or loss.  A population's chunk holds several runs (shares); each run's part of a group is padded
on its own, with its own scratch row, so each run's rows sit at fixed positions of the step and
its regularizer and optimizer act on a fixed slice (runs of one partition, as a paper's column of
methods is, take the same shapes as one run).

The figures a benchmark reports come from here too (:func:`lock_step_profile`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


def bucket(g: int, m: int) -> int:
    """The padded size of a group of ``g`` rows in a chunk of ``m``: the next power of two, at most m."""
    return min(1 << max(0, (g - 1).bit_length()), m)


@dataclass(frozen=True)
class Group:
    """One vmapped call of a lock-step: the rows (clients of the chunk) whose s-th batch has ``size``
    samples.

    ``rows`` (host, sorted) are the real rows; ``index`` and ``starts`` (device, ``[G]``) are the
    rows to gather and where each row's batch starts in the round's sample order.  ``parts`` gives,
    for each share (run) with rows in the group, ``(share, position, width)``: its rows are
    ``index[position:position + width]``.  In a bucketed plan each share's part is padded to
    :func:`bucket` rows with that share's scratch row (start 0), and ``index`` counts rows as the
    static layout stores them: share n's clients and then its scratch row, share after share."""

    size: int
    rows: np.ndarray
    index: torch.Tensor
    starts: torch.Tensor
    parts: tuple[tuple[int, int, int], ...]

    @property
    def padded(self) -> int:
        return len(self.index)


@dataclass(frozen=True)
class LockStep:
    """Step s of the chunk: its groups, and the rows that start a local epoch at it (``first``:
    their first epoch), for a regularizer that recomputes its coefficients then (FedLap): sorted, on
    the host (``epoch_rows``, ``epoch_first``) and as device views (``epoch_index``, ``epoch_is_first``)."""

    groups: tuple[Group, ...]
    epoch_rows: np.ndarray
    epoch_first: np.ndarray
    epoch_index: torch.Tensor
    epoch_is_first: torch.Tensor


class RoundPlan:
    """Every lock-step of one chunk of clients, from each row's (n, B, E) (module docstring).

    Args:
      shapes: per row (client of the chunk, in order), ``(n_k, B, E_k)``.
      device: where the index tensors live (the training set's device).
      bucketed: pad each share's part of every group to :func:`bucket` rows with its scratch row.
      spans: the shares' rows, ``[(lo, hi), ...]`` in order (a population's runs); None: one share.
    """

    def __init__(self, shapes: list[tuple[int, int, int]], device: torch.device | str = "cpu",
                 bucketed: bool = False, spans: list[tuple[int, int]] | None = None):
        self.m = m = len(shapes)
        self.spans = spans = [(0, m)] if spans is None else list(spans)
        n = np.array([s[0] for s in shapes], dtype=np.int64)
        b = np.array([s[1] for s in shapes], dtype=np.int64)
        e = np.array([s[2] for s in shapes], dtype=np.int64)
        per_epoch = np.where(n > 0, -(-n // np.maximum(b, 1)), 0)
        self.steps = (e * per_epoch).tolist()  # eq. (1), per row
        self.per_epoch = per_epoch.tolist()
        # Row j's samples in the round's order: e_j permutations of its n_j samples, row after row.
        offsets = np.concatenate([[0], np.cumsum(e * n)[:-1]]) if m else np.zeros(0, dtype=np.int64)
        self.bucketed = bucketed
        steps = np.array(self.steps, dtype=np.int64)
        pe = np.maximum(per_epoch, 1)
        plan: list[tuple[list, np.ndarray, np.ndarray]] = []
        flat_index, flat_starts = [], []
        for s in range(int(steps.max()) if m else 0):
            active = np.flatnonzero(steps > s)
            i = s % pe[active]
            sizes = np.minimum(b[active], n[active] - i * b[active])
            starts = offsets[active] + (s // pe[active]) * n[active] + i * b[active]
            groups = []
            for size in np.unique(sizes):  # nearly always one: every active client's full batch
                pick = sizes == size
                rows, index, begin, parts = self._parts(active[pick], starts[pick])
                groups.append((int(size), rows, len(flat_index), parts))
                flat_index.append(index)
                flat_starts.append(begin)
            starting = active[i == 0]
            plan.append((groups, starting, s // pe[starting] == 0))
        # One transfer for the whole round (a copy from the host waits for the device: one a round,
        # not one a step); each step's tensors are views of these.
        index, starts = _to_device(flat_index, device), _to_device(flat_starts, device)
        epoch_index = _to_device([rows for _, rows, _ in plan], device)
        epoch_first = _to_device([first for _, _, first in plan], device, np.bool_)
        bounds = np.concatenate([[0], np.cumsum([len(x) for x in flat_index])]).tolist()
        ends = np.concatenate([[0], np.cumsum([len(rows) for _, rows, _ in plan])]).tolist()
        self.lock_steps: list[LockStep] = [
            LockStep(tuple(Group(size, rows, index[bounds[k]:bounds[k + 1]], starts[bounds[k]:bounds[k + 1]], parts)
                           for size, rows, k, parts in groups), epoch_rows, first,
                     epoch_index[ends[s]:ends[s + 1]], epoch_first[ends[s]:ends[s + 1]])
            for s, (groups, epoch_rows, first) in enumerate(plan)]

    def _parts(self, rows: np.ndarray, starts: np.ndarray):
        """A group's rows split by share: ``(rows, index, starts, parts)`` (:class:`Group`)."""
        if len(self.spans) == 1 and not self.bucketed:
            return rows, rows, starts, ((0, 0, len(rows)),)
        cuts = np.searchsorted(rows, [edge for span in self.spans for edge in span]).reshape(-1, 2)
        index, begin, parts, position = [], [], [], 0
        for n, ((lo, hi), (i0, i1)) in enumerate(zip(self.spans, cuts.tolist())):
            if i0 == i1:
                continue
            if not self.bucketed:
                index.append(rows[i0:i1])
                begin.append(starts[i0:i1])
                parts.append((n, position, i1 - i0))
                position += i1 - i0
                continue
            width = bucket(i1 - i0, hi - lo)
            pad = width - (i1 - i0)
            index.append(np.concatenate([rows[i0:i1] + n, np.full(pad, hi + n, dtype=np.int64)]))  # scratch: hi + n
            begin.append(np.concatenate([starts[i0:i1], np.zeros(pad, dtype=np.int64)]))
            parts.append((n, position, width))
            position += width
        return rows, np.concatenate(index), np.concatenate(begin), tuple(parts)

    @property
    def critical_path(self) -> int:
        """The longest client's steps: the chunk's lock-steps, however many clients it holds."""
        return max(self.steps, default=0)

    @property
    def calls(self) -> int:
        """Vmapped calls over the round: a lock-step makes one per group."""
        return sum(len(step.groups) for step in self.lock_steps)

    def shapes(self) -> set[tuple]:
        """The distinct step shapes, ``(G, b)`` for one share (each share's width and b for a
        population): what a captured step is keyed by."""
        return {(g.padded, g.size) if len(self.spans) == 1 else (tuple(w for _, _, w in g.parts), g.size)
                for step in self.lock_steps for g in step.groups}


def _to_device(parts: list[np.ndarray], device, dtype=np.int64) -> torch.Tensor:
    """The arrays ``parts`` end to end, as one tensor on ``device``."""
    flat = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
    return torch.from_numpy(flat).to(device)


def lock_step_profile(sizes: list[int], batch_size: int, epochs: int | list[int] = 1,
                      chunk: int | None = None) -> dict[str, float]:
    """What a round costs in lock-steps, from the clients' sizes alone (eq. 1).

    ``chunk`` clients train at once (None: all); chunks run one after another, so the round's
    lock-steps are the sum of each chunk's longest client.  Returns ``clients``, ``total_steps``
    (sum of tau_k, what the sequential engine takes), ``mean_steps``, ``critical_path`` (max tau_k),
    ``lock_steps`` (sum over chunks), ``shapes`` (distinct bucketed (G, B) shapes, i.e. captured
    graphs), and ``occupancy``: the mean share of a lock-step's rows that are real clients when every
    group is padded to a power of two (1.0: no padding)."""
    epochs = [epochs] * len(sizes) if isinstance(epochs, int) else list(epochs)
    size = max(1, len(sizes) if chunk is None else chunk)
    lock, shapes, real, padded = 0, set(), 0, 0
    for lo in range(0, len(sizes), size):
        part = [(n, batch_size, e) for n, e in zip(sizes[lo:lo + size], epochs[lo:lo + size])]
        plan = RoundPlan(part, bucketed=True)
        lock += plan.critical_path
        shapes |= plan.shapes()
        for step in plan.lock_steps:
            for group in step.groups:
                real += len(group.rows)
                padded += group.padded
    steps = [e * math.ceil(n / batch_size) for n, e in zip(sizes, epochs)]
    return {"clients": len(sizes), "total_steps": sum(steps), "mean_steps": sum(steps) / max(1, len(steps)),
            "critical_path": max(steps, default=0), "lock_steps": lock, "shapes": len(shapes),
            "occupancy": real / padded if padded else 1.0}
