"""Client corrections: server state kept for every client that changes how each client trains.

The aggregator's fifth slot (after the weighting rule, the reduce, the server transforms and the
client regularizer).  Some methods correct each client's local steps with state that belongs to
that client and lives across rounds, sampled or not: SCAFFOLD's control variates ``c_k`` and the
server's ``c`` (Karimireddy et al., ICML 2020).  Such state is part of the aggregator's state, so
a checkpoint holds it and a resumed run continues with it.  A correction is three pure functions
over that state, a dict of tensors::

    state = correction.init(params, num_clients)       # before round 1 (w_0, K)
    inputs = correction.inputs(state, clients)          # before training: [m, ...] per round's client
    state = correction.update(state, results)           # after training, from the ClientResults

``inputs`` are named tensors stacked ``[m, *shape]`` in the round's client order.  The round loop
hands them to the engine with the clients (``engine.train(..., inputs=...)``), and the engine to
the aggregator's regularizer through its ``init(anchor, m, inputs)`` for exactly the clients it
initializes: one client in the sequential engine, a chunk's rows in the batched one (and each
run's own rows in a population).  The regularizer turns them into the local correction
(:class:`fedrun.client.regularizers.ControlVariate`: the penalty ``<c - c_k, y - x>``).  ``update``
reads what training did: each client's update ``y_k - x``, its local steps (``effective_steps``:
``||a_k||_1``, K_k for plain SGD) and its learning rate (``lr``).  ``communicated`` says how many
model-sized tensors the correction adds to each message between the server and a client, each
way (SCAFFOLD: 1, its ``c`` down and ``c_k+ - c_k`` up), which the bytes columns of ``rounds.csv``
count (:mod:`fedrun.diagnostics.communication`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from fedrun.client.local_training import ClientResults
from fedrun.params import Params
from fedrun.server import client_rows


class ClientCorrection(NamedTuple):
    init: Callable[[Params, int], dict]
    inputs: Callable[[dict, list[int]], Params]
    update: Callable[[dict, ClientResults], dict]
    # Model-sized tensors the correction adds to each message, each way, in a deployment where
    # every client keeps its own state: SCAFFOLD's server c down with the model, the change
    # c_k+ - c_k up with the update (the rounds.csv bytes columns, fedrun.diagnostics.communication).
    communicated: int = 1


def _steps(results: ClientResults, counted: bool = False) -> torch.Tensor:
    """``eta_l ||a_k||_1`` per client, float64: the number of gradients the update is worth, at the
    round's learning rate (``eta_l K_k`` for plain SGD); with ``counted``, ``eta_l K_k`` whatever
    the optimizer (NIID-Bench's ``cnt * lr``)."""
    steps = results.steps if counted or results.effective_steps is None else results.effective_steps
    if results.lr is None:
        raise ValueError("ClientResults.lr is needed by a client correction (the engines fill it)")
    return results.lr.to(torch.float64) * steps.to(torch.float64)


def _num_clients(state: dict) -> int:
    """N, the federation's clients: stored, or (a checkpoint of a dense store) the rows of c_k."""
    if "num_clients" in state:
        return int(state["num_clients"])
    return next(iter(state["c_k"].values())).shape[0]


def _client_rows(state: dict, clients: list[int], pos: list[int] | None) -> Params:
    """``c_k`` of each of ``clients``, stacked ``[m, ...]`` in their order: a kept row (at ``pos``,
    :func:`fedrun.server.client_rows.positions`), or 0 for a client that has not trained yet.  A
    state without ``"clients"`` (a checkpoint written when every client's row was kept, K x d;
    ``pos`` None) is read by client id."""
    c_k = state["c_k"]
    device = next(iter(state["c"].values())).device
    if pos is None:
        idx = torch.as_tensor(clients, dtype=torch.long, device=device)
        return {k: v[idx] for k, v in c_k.items()}
    at = torch.as_tensor(pos, dtype=torch.long, device=device)
    kept = at >= 0
    out = {}
    for k, v in c_k.items():
        rows = v.new_zeros((len(clients), *v.shape[1:]))
        rows[kept] = v[at[kept]]
        out[k] = rows
    return out


def _positions(state: dict, clients: list[int]) -> list[int] | None:
    """The clients' kept rows, or None for a dense K x d store (an earlier checkpoint's)."""
    return client_rows.positions(state["clients"], clients) if "clients" in state else None


def control_variates(counted: bool = False) -> ClientCorrection:
    """SCAFFOLD's control variates (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020,
    Algorithm 1), with option II for the clients' update:

    * state: the server's ``c`` and every client's ``c_k``, zero before round 1; they live across
      rounds for every client, sampled or not, and are kept for the clients that have trained (the
      others' are still 0), so the state grows with the clients sampled so far, not with K;
    * inputs (line 5, line 10): ``c - c_k`` for each of the round's clients, the correction its
      local steps add to the gradient, ``y <- y - eta_l (g_k(y) - c_k + c)``;
    * update, line 12, option II: ``c_k+ = c_k - c + (x - y_k) / (K_k eta_l)``, with
      ``K_k eta_l`` read as ``eta_l ||a_k||_1`` (:meth:`fedrun.client.local_training.LocalTraining.effective_steps`):
      ``K_k eta_l`` for plain SGD; under momentum, the gradients' summed coefficients, so that
      ``c_k+`` stays the mean corrected gradient the client saw (with ``K_k`` the correction
      would be counted ``1 / (1 - rho)`` times over and the control variates would oscillate);
    * update, lines 16-17: ``c <- c + |S|/N (1/|S|) sum_{k in S} (c_k+ - c_k)``, N the federation's
      clients, S the round's (reporting) clients.

    ``counted=True`` divides by ``K_k eta_l`` even under momentum: NIID-Bench's reading, where the
    correction is applied after each momentum step (``ControlVariate("after_step")``), so ``c_k``
    estimate the momentum-amplified gradients the clients stepped with.

    The server's model step, lines 16-17's ``x <- x + eta_g (1/|S|) sum_k (y_k - x)``, is the
    aggregator's weighting and server transform (:func:`fedrun.aggregators.scaffold`).
    """

    def init(params: Params, num_clients: int) -> dict:
        # c_k is kept for the clients that have trained, in the order they first did ("clients": their
        # ids): every other client's c_k is still 0.  Memory and checkpoint grow with the clients
        # sampled so far, not with K (at K = 100,000 a dense K x d store of the MNIST CNN is 172 GB).
        first = next(iter(params.values()))
        return {"c": {k: torch.zeros_like(v) for k, v in params.items()},
                "c_k": {k: v.new_zeros((0, *v.shape)) for k, v in params.items()},
                "clients": torch.zeros(0, dtype=torch.long, device=first.device),
                "num_clients": torch.tensor(num_clients, dtype=torch.long)}

    def inputs(state: dict, clients: list[int]) -> Params:
        c = state["c"]
        rows = _client_rows(state, clients, _positions(state, clients))
        return {k: c[k].unsqueeze(0) - rows[k] for k in c}

    def update(state: dict, results: ClientResults) -> dict:
        c = state["c"]
        total = _num_clients(state)  # N
        denominator = _steps(results, counted)
        pos = _positions(state, results.clients)
        old_rows = _client_rows(state, results.clients, pos)
        new_c, fresh_rows = {}, {}
        for k, old in c.items():
            delta = results.deltas[k]  # y_k - x, [m, *shape]
            scale = denominator.to(device=delta.device, dtype=delta.dtype).view(-1, *([1] * (delta.ndim - 1)))
            rows = old_rows[k]
            fresh = rows - old.unsqueeze(0) - delta / scale  # option II: c_k - c + (x - y_k) / (K eta_l)
            fresh_rows[k] = fresh
            new_c[k] = old + (fresh - rows).sum(0) / total
        if pos is None:  # a dense K x d store, as an earlier checkpoint holds it
            idx = torch.as_tensor(results.clients, dtype=torch.long, device=next(iter(c.values())).device)
            return {**state, "c": new_c, "c_k": {k: v.index_copy(0, idx, fresh_rows[k]) for k, v in state["c_k"].items()}}
        c_k, ids = client_rows.store(state["c_k"], state["clients"], results.clients, pos, fresh_rows)
        return {**state, "c": new_c, "c_k": c_k, "clients": ids}

    return ClientCorrection(init, inputs, update)
