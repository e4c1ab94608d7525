"""Local training: "train these m clients from w_t, return their stacked updates".

This is the hot path (~99% of a run).  The interface is one method,
``engine.train(params, buffers, clients, round_) -> ClientResults``, so a batched engine can
replace the :class:`SequentialEngine` without touching aggregators: everything downstream reads
stacked ``[m, *shape]`` tensors.

Local training is the client side of FedAvg (Nagura et al., Alg. 2): split the client's data into
batches of B, run E epochs of ``w <- w - eta grad l(w; batch)`` (SGD, optionally with momentum,
Nesterov and weight decay), plus the method's regularizer.  The batch order of client k in round t
comes from a generator seeded by ``(seed, round, client)``, so every method sees the same batches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedrun.errors import check
from fedrun.norms import Params
from fedrun.regularizers import Regularizer
from fedrun.seeding import derive_seed, torch_generator


@dataclass(frozen=True)
class LocalTraining:
    """The client optimizer (Nagura et al. Table 1: E, B, eta, lambda)."""

    epochs: int = 1
    batch_size: int = 50
    lr: float = 0.05
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self):
        check(self.epochs >= 1, "hyperparams.local_epochs", self.epochs, "must be >= 1")
        check(self.batch_size >= 1, "hyperparams.batch_size", self.batch_size, "must be >= 1")
        check(self.lr > 0, "hyperparams.lr", self.lr, "must be > 0")
        check(0 <= self.momentum < 1, "hyperparams.momentum", self.momentum, "must be in [0, 1)")
        check(not self.nesterov or self.momentum > 0, "hyperparams.nesterov", self.nesterov,
              "needs hyperparams.momentum > 0")
        check(self.weight_decay >= 0, "hyperparams.weight_decay", self.weight_decay, "must be >= 0")

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, nesterov=self.nesterov,
                               weight_decay=self.weight_decay)


@dataclass
class ClientResults:
    """One round's client outputs, stacked along a leading client dimension of size m."""

    clients: list[int]
    deltas: Params  # w_k - w_t per parameter, [m, *shape]
    buffers: Params  # final buffers per client, [m, *shape]
    num_examples: torch.Tensor  # [m] n_k
    loss: torch.Tensor  # [m] mean local training loss over all local steps (without regularizer)
    steps: torch.Tensor  # [m] optimizer steps taken


def split_state(model: nn.Module) -> tuple[Params, Params]:
    """Detached copies of the model's trainable parameters and of its buffers."""
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    return params, buffers


class SequentialEngine:
    """One client after another on one ``nn.Module``: the reference every engine is checked against.

    Args:
      model: the architecture (its weights are overwritten with ``w_t`` for every client).
      train_x, train_y: the whole training set, already on the device.
      client_indices: the partition, one index tensor per client (on the device).
      local: the client optimizer.
      regularizer: added to the loss (FedProx), or None.
      seed: the run's seed.
    """

    def __init__(self, model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor,
                 client_indices: list[torch.Tensor], local: LocalTraining,
                 regularizer: Regularizer | None, seed: int):
        self.model, self.x, self.y = model, train_x, train_y
        self.indices, self.local, self.regularizer, self.seed = client_indices, local, regularizer, seed

    def train(self, params: Params, buffers: Params, clients: list[int], round_: int) -> ClientResults:
        m = len(clients)
        deltas = {k: torch.empty((m, *v.shape), dtype=v.dtype, device=v.device) for k, v in params.items()}
        stacked_buffers = {k: torch.empty((m, *v.shape), dtype=v.dtype, device=v.device)
                           for k, v in buffers.items()}
        losses, steps = torch.zeros(m, dtype=torch.float64), torch.zeros(m, dtype=torch.long)
        for j, k in enumerate(clients):
            losses[j], steps[j] = self._train_client(params, buffers, k, round_)
            for name, p in self.model.named_parameters():
                deltas[name][j] = p.detach() - params[name]
            for name, b in self.model.named_buffers():
                stacked_buffers[name][j] = b
        sizes = torch.tensor([len(self.indices[k]) for k in clients])
        return ClientResults(list(clients), deltas, stacked_buffers, sizes, losses, steps)

    def _train_client(self, params: Params, buffers: Params, client: int, round_: int):
        model, local = self.model, self.local
        model.load_state_dict({**params, **buffers})
        model.train()
        optimizer = local.optimizer(model.parameters())
        live = dict(model.named_parameters())
        # Dropout (and any other randomness in the forward pass) is seeded per (round, client).
        torch.manual_seed(derive_seed(self.seed, "forward", round_, client))
        shuffle = torch_generator(self.seed, "shuffle", round_, client)
        idx = self.indices[client]
        n = len(idx)
        loss_sum = torch.zeros((), dtype=torch.float64, device=idx.device)
        steps = 0
        for epoch in range(local.epochs):
            if self.regularizer is not None:
                self.regularizer.start_epoch(epoch, live, params)
            order = idx[torch.randperm(n, generator=shuffle).to(idx.device)]
            for start in range(0, n, local.batch_size):
                batch = order[start : start + local.batch_size]
                loss = F.cross_entropy(model(self.x[batch]), self.y[batch])
                total = loss if self.regularizer is None else loss + self.regularizer.penalty(live, params)
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                optimizer.step()
                loss_sum += loss.detach() * len(batch)
                steps += 1
        return float(loss_sum) / (n * local.epochs), steps


@torch.no_grad()
def evaluate(model: nn.Module, state: Params, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 2000) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``model`` loaded with ``state`` on ``(x, y)``."""
    model.load_state_dict(state)
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=y.device)
    loss = torch.zeros((), dtype=torch.float64, device=y.device)
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss += F.cross_entropy(logits, target, reduction="sum").double()
        correct += (logits.argmax(1) == target).sum()
    return float(correct) / len(y), float(loss) / len(y)
