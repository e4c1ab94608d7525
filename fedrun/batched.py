"""The batched client engine: every client of a round trained at once.

Models this small leave a GPU idle when clients train one after another.  Here the parameters of
the round's m clients are stacked (``[m, *shape]``), the model is evaluated for all of them in
one call (``torch.func.functional_call`` under ``torch.func.vmap``), and one optimizer step
(:mod:`fedrun.optim`, elementwise, so it runs on stacked tensors as is) updates every client.

Exactly the sequential engine's computation, reorganized:

* client k's batches come from the same generator ``(seed, "shuffle", round, k)`` in the same
  order, so client k's s-th step sees the same samples in both engines;
* clients whose s-th batch has the same size are vmapped together (nearly always one group: all
  clients with a full batch of B).  A client's last, smaller batch and a client that has already
  finished (fewer samples, or a straggler's fewer epochs) are handled by grouping, not by
  padding, so BatchNorm's batch statistics never see padding;
* BatchNorm running statistics are per client (stacked buffers updated in place under vmap).

Results equal the sequential engine's to float rounding (the tests check this for every
aggregator and model family).  ``clients_per_step`` bounds memory by training the round's
clients in chunks, with the same results.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedrun.engine import ClientResults, LocalTraining, SequentialEngine
from fedrun.errors import ConfigError, check
from fedrun.norms import Params
from fedrun.optim import load_state, state_dict
from fedrun.regularizers import Regularizer
from fedrun.seeding import torch_generator


class BatchedEngine:
    """Trains all clients of a round in lock-step; same interface as ``SequentialEngine``.

    Args:
      model, train_x, train_y, client_indices, local, regularizer, seed: as ``SequentialEngine``.
      clients_per_step: train at most this many clients at once (None: all of the round's).
    """

    def __init__(self, model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor,
                 client_indices: list[torch.Tensor], local: LocalTraining,
                 regularizer: Regularizer | None, seed: int, clients_per_step: int | None = None):
        if not supports(model, regularizer):
            raise ConfigError("engine", "batched", "does not support dropout yet; use engine=sequential")
        check(clients_per_step is None or clients_per_step >= 1, "engine.clients_per_step",
              clients_per_step, "must be >= 1 (or null: all clients at once)")
        self.model, self.x, self.y = model, train_x, train_y
        self.indices, self.local, self.regularizer, self.seed = client_indices, local, regularizer, seed
        self.clients_per_step = clients_per_step

        def forward(params, buffers, x):
            return functional_call(self.model, (params, buffers), (x,))

        self._forward = vmap(forward, in_dims=(0, 0, 0), randomness="different")

    def train(self, params: Params, buffers: Params, clients: list[int], round_: int,
              epochs: list[int] | None = None, lr: float | None = None,
              opt_states: Params | None = None) -> ClientResults:
        """As :meth:`fedrun.engine.SequentialEngine.train`."""
        epochs = [self.local.epochs] * len(clients) if epochs is None else list(epochs)
        size = self.clients_per_step or len(clients)
        parts = [self._train_chunk(params, buffers, clients[i : i + size], round_, epochs[i : i + size], lr,
                                   None if opt_states is None else {k: v[i : i + size] for k, v in opt_states.items()})
                 for i in range(0, len(clients), size)]
        if len(parts) == 1:
            return parts[0]
        cat = lambda key: {k: torch.cat([getattr(p, key)[k] for p in parts]) for k in getattr(parts[0], key)}  # noqa: E731
        return ClientResults(list(clients), cat("deltas"), cat("buffers"),
                             torch.cat([p.num_examples for p in parts]), torch.cat([p.loss for p in parts]),
                             torch.cat([p.steps for p in parts]), torch.cat([p.epochs for p in parts]),
                             {k: torch.cat([p.extras[k] for p in parts]) for k in parts[0].extras},
                             None if opt_states is None else cat("opt_states"))

    def _schedule(self, clients: list[int], round_: int, epochs: list[int]) -> list[list[torch.Tensor]]:
        """Each client's batches (index tensors), in the sequential engine's order."""
        out = []
        for k, e in zip(clients, epochs):
            shuffle = torch_generator(self.seed, "shuffle", round_, k)
            idx = self.indices[k]
            batches = []
            for _ in range(e):
                order = idx[torch.randperm(len(idx), generator=shuffle).to(idx.device)]
                batches += list(order.split(self.local.batch_size))
            out.append(batches)
        return out

    def _train_chunk(self, params: Params, buffers: Params, clients: list[int], round_: int,
                     epochs: list[int], lr: float | None = None, opt_states: Params | None = None) -> ClientResults:
        m, local = len(clients), self.local
        names = list(params)
        stacked = {k: v.unsqueeze(0).repeat(m, *([1] * v.ndim)) for k, v in params.items()}
        bufs = {k: v.unsqueeze(0).repeat(m, *([1] * v.ndim)) for k, v in buffers.items()}
        optimizer = local.make_optimizer()
        state = optimizer.init([stacked[k] for k in names])
        if "step" in state:  # one Adam step counter per client: clients may finish at different steps
            state["step"] = torch.zeros(m, dtype=torch.float64, device=state["step"].device)
        if opt_states is not None:
            state = load_state({k: v.clone() for k, v in opt_states.items()}, state, names)
        augment = local.augment
        draws = [torch_generator(self.seed, "augment", round_, k) for k in clients] if augment else None
        schedule = self._schedule(clients, round_, epochs)
        steps = torch.tensor([len(b) for b in schedule])
        device = next(iter(params.values())).device
        loss_sum = torch.zeros(m, dtype=torch.float64, device=device)
        reg_sum = torch.zeros(m, dtype=torch.float64, device=device)
        reg = self.regularizer
        reg_state = reg.stacked_state(m, params) if reg is not None else None
        per_epoch = [math.ceil(len(self.indices[k]) / local.batch_size) for k in clients]
        self.model.train()

        for s in range(int(steps.max())):
            groups: dict[int, list[int]] = {}
            for j, batches in enumerate(schedule):
                if s < len(batches):
                    groups.setdefault(len(batches[s]), []).append(j)
            starting = [j for j in range(m) if s < steps[j] and s % per_epoch[j] == 0]
            if reg is not None and starting:  # FedLap recomputes lambda when a client starts an epoch
                first = torch.tensor([s == 0 for _ in starting], device=device)
                reg.stacked_start_epoch(reg_state, torch.tensor(starting, device=device), first, stacked, params)
            for b, rows in groups.items():
                whole = len(rows) == m
                idx = torch.tensor(rows, device=device)
                p_g = {k: (v if whole else v[idx]).requires_grad_(True) for k, v in stacked.items()}
                b_g = bufs if whole else {k: v[idx] for k, v in bufs.items()}
                batch = torch.stack([schedule[j][s] for j in rows])  # [g, b]
                x = self.x[batch]
                if augment is not None:  # each client's own draws, in the sequential engine's order
                    x = torch.stack([augment(x[i], draws[j]) for i, j in enumerate(rows)])
                logits = self._forward(p_g, b_g, x)  # [g, b, C]
                loss = F.cross_entropy(logits.flatten(0, 1), self.y[batch].flatten(),
                                       reduction="none").view(len(rows), b).mean(1)  # [g]
                total = loss.sum()
                if reg is not None:
                    pen = reg.stacked_penalty(p_g, params, reg_state, idx)  # [g], separable over clients
                    total = total + pen.sum()
                    reg_sum[idx] += pen.detach().double()
                grads = torch.autograd.grad(total, [p_g[k] for k in names])
                loss_sum[idx] += loss.detach().double() * b
                with torch.no_grad():
                    weights = [p_g[k].detach() for k in names]
                    if whole:
                        optimizer.step(weights, list(grads), state, lr)
                    else:
                        sub = _gather(state, idx)
                        optimizer.step(weights, list(grads), sub, lr)
                        _scatter(state, sub, idx)
                        for k, w in zip(names, weights):
                            stacked[k][idx] = w
                        for k, v in b_g.items():
                            bufs[k][idx] = v
                for k in names:
                    stacked[k] = stacked[k].detach()

        deltas = {k: stacked[k] - params[k].unsqueeze(0) for k in names}
        sizes = torch.tensor([len(self.indices[k]) for k in clients])
        n_epochs = torch.tensor(epochs)
        extras = {}
        if reg is not None:
            extras["reg_loss"] = (reg_sum / steps.clamp_min(1).to(reg_sum)).cpu()
            extras.update(reg.stacked_metrics(reg_state))
        loss = (loss_sum / (sizes * n_epochs).to(loss_sum)).cpu()
        final = None if opt_states is None else state_dict(state, names)
        return ClientResults(list(clients), deltas, bufs, sizes, loss, steps, n_epochs, extras, final)


# Optimizer state: every entry is per client, lists of stacked [m, ...] tensors or an [m] tensor
# (Adam's step counters).

def _gather(state: dict, idx: torch.Tensor) -> dict:
    return {k: ([t[idx] for t in v] if isinstance(v, list) else v[idx]) for k, v in state.items()}


def _scatter(state: dict, sub: dict, idx: torch.Tensor) -> None:
    for k, v in sub.items():
        if isinstance(v, list):
            for full, part in zip(state[k], v):
                full[idx] = part
        else:
            state[k][idx] = v


def supports(model: nn.Module, regularizer: Regularizer | None) -> bool:
    """Whether the batched engine implements this model and regularizer."""
    return ((regularizer is None or hasattr(regularizer, "stacked_penalty"))
            and not any(isinstance(mod, nn.Dropout) for mod in model.modules()))


def auto_engine(model, train_x, train_y, client_indices, local, regularizer, seed,
                clients_per_step: int | None = None):
    """``engine=auto``: batched on CUDA when it supports the run, sequential otherwise.

    On a CPU the sequential engine is the default: the conv kernels run at the same rate
    whatever the batch, so stacking clients saves only Python overhead (see scripts/bench.py).
    """
    if train_x.device.type == "cuda" and supports(model, regularizer):
        return BatchedEngine(model, train_x, train_y, client_indices, local, regularizer, seed, clients_per_step)
    return SequentialEngine(model, train_x, train_y, client_indices, local, regularizer, seed)
