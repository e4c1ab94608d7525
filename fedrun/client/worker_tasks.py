"""What a worker of the parallel engine does with a task, wherever it runs (a forked process,
:mod:`fedrun.client.parallel`, or a Ray actor, :mod:`fedrun.client.ray_workers`), and how the run
puts its workers' answers back together.

A task is a tuple: ``("train", w_t, buffers, clients, indices, round, epochs, lr, optimizer states,
regularizer inputs, own values)`` trains the given clients one after another with the reference
:class:`~fedrun.client.sequential.SequentialEngine` (one thread), ``("evaluate", state, split, batch
starts, batch size)`` scores a range of an evaluation split's batches.  Each client's update depends
only on ``w_t`` and seeds derived from ``(seed, round, client)``, so whichever worker trains it, the
round's results, put back in client order by :func:`merge_results`, are the sequential engine's.
"""
from __future__ import annotations

import torch

from fedrun.client.local_training import ClientResults
from fedrun.client.sequential import SequentialEngine
from fedrun.diagnostics.evaluation import batch_scores
from fedrun.errors import FedrunError
from fedrun.params import Params


class WorkerError(FedrunError, RuntimeError):
    """A worker process of the parallel engine died or failed."""


def do_task(conn, task: tuple, engine: SequentialEngine, shared: dict):
    """One task in a worker: a range of batch scores (``evaluate``, on the split ``shared`` holds
    under the task's key), or the task's clients trained one at a time (``train``), each one
    announced on ``conn`` before it starts (None: nobody to tell, as in a Ray actor)."""
    kind, *args = task
    if kind == "evaluate":
        state, key, starts, batch_size = args
        x, y = shared[key]
        return batch_scores(engine.model, state, x, y, batch_size, starts)
    params, buffers, clients, indices, round_, epochs, lr, opt_states, inputs, own = args
    parts = []
    for j, k in enumerate(clients):
        if conn is not None:  # which client it trains now, should the worker die
            conn.send(("client", k))
        one = [j]
        parts.append((one, engine.train(params, buffers, [k], [indices[j]], round_, [epochs[j]], lr,
                                        rows_of(opt_states, one), rows_of(inputs, one), rows_of(own, one))))
    return merge_results(parts, clients)


def rows_of(stacked: Params | None, rows: list[int]) -> Params | None:
    """The ``rows`` (client positions) of every stacked tensor of ``stacked``; None stays None."""
    if stacked is None:
        return None
    index = torch.tensor(rows)
    return {k: v[index] for k, v in stacked.items()}


def merge_results(parts: list[tuple[list[int], ClientResults]], clients: list[int]) -> ClientResults:
    """One round's :class:`ClientResults` from the workers' parts: part ``(rows, results)`` holds the
    clients at positions ``rows`` of ``clients``; every stacked tensor is put back in client order.
    A regularizer metric a part lacks is NaN for its clients, as the sequential engine leaves it."""
    m = len(clients)
    first = parts[0][1]

    def stack(get) -> torch.Tensor | None:
        sample = get(first)
        if sample is None:
            return None
        out = torch.empty((m, *sample.shape[1:]), dtype=sample.dtype, device=sample.device)
        for rows, part in parts:
            out[torch.tensor(rows)] = get(part)
        return out

    def named(get) -> Params | None:
        if get(first) is None:
            return None
        return {name: stack(lambda p, name=name: get(p)[name]) for name in get(first)}

    extras: dict[str, torch.Tensor] = {}
    for rows, part in parts:
        for name, values in part.extras.items():
            extras.setdefault(name, torch.full((m,), float("nan"), dtype=values.dtype))[torch.tensor(rows)] = values
    return ClientResults(list(clients), named(lambda p: p.deltas), named(lambda p: p.buffers),
                         stack(lambda p: p.num_examples), stack(lambda p: p.loss), stack(lambda p: p.steps),
                         stack(lambda p: p.epochs), extras, named(lambda p: p.opt_states),
                         stack(lambda p: p.lr), stack(lambda p: p.effective_steps))


def task_label(client, what: str) -> str:
    """What a worker was doing, for an error: ``client 7 of round 3``, or ``what`` alone."""
    return f"client {client} of {what}" if client is not None else what


def note(error: BaseException, text: str) -> None:
    """Add ``text`` to ``error``'s traceback (where the worker was), on Python 3.11 and later."""
    if hasattr(error, "add_note"):  # Python >= 3.11
        error.add_note(text)
