"""Personalized federated learning: what each client keeps of its own across rounds.

The aggregator's sixth slot (after the weighting rule, the reduce, the server transforms, the
client regularizer and the client correction).  In a personalized method every client k keeps
some values ``v_k`` of its own from one round it is sampled to the next, and its *personal model*
(not the global one) is what it is scored with on its own test data:

* **FedBN** (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, Algorithm 1): the BatchNorm layers (their
  scale and shift, and their running statistics) stay local.  Client k trains from
  ``w_t`` with its own BatchNorm layers; the server averages every other parameter.
* **FedPer** (Arivazhagan, Aggarwal, Singh, Choudhary 2019, sec. 3): the last ``local_layers``
  layers (the "personalization layers") stay local, the base layers are averaged.
* **Ditto** (Li, Hu, Beirami, Smith, ICML 2021, Algorithm 1): the global model is FedAvg's, and
  each sampled client also takes local steps on a whole personal model,
  ``v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w_t))`` (line 7, the regularized objective
  of eq. 2), kept across rounds.

The state is data, part of the aggregator's state (so of the checkpoint): ``w_0``'s values of the
kept tensors, which every client starts from, and the kept values of each client that has trained,
stacked ``[n, *shape]`` in the order the clients first trained.  So it grows with the clients
sampled so far, not with K: n x the local layers (Ditto: n x the model), at most K x.  Three pure
functions over it::

    state = personal.init(params, buffers, num_clients, layers)  # before round 1
    own = personal.own(state, clients)       # stacked [m, ...]: the clients' kept values
    state = personal.keep(state, clients, values)               # after training

For FedBN and FedPer the kept values are the clients' starting point (the engines' ``own``
argument); the server never sees them: their updates and buffers are taken out of what is
aggregated (:meth:`Personalization.shared_only`), so the global model keeps ``w_0``'s values there
and N, E and the divergence columns measure what clients send.  For Ditto the whole model is kept
and the global training is FedAvg's; the round loop trains the personal models with the
regularizer ``lambda/2 ||v - w_t||^2`` (:class:`fedrun.client.regularizers.Proximal`) from ``v_k``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from fedrun.client.local_training import ClientResults
from fedrun.errors import check
from fedrun.models.layers import Layer
from fedrun.server import client_rows
from fedrun.params import Params

KINDS = ("fedbn", "fedper", "ditto")


@dataclass(frozen=True)
class Personalization:
    """What a personalized method keeps on its clients (module docstring).

    Args:
      kind: ``fedbn`` | ``fedper`` | ``ditto``.
      local_layers: FedPer: how many of the model's last layers (modules owning parameters, in
        definition order) stay local, >= 1.
      lam: Ditto's lambda, >= 0: the personal models' pull toward the global one (0: purely local
        models; large: the global model).
      epochs: Ditto: the personal model's local epochs each time its client is sampled (None:
        ``hyperparams.local_epochs``, as the global update).
    """

    kind: str
    local_layers: int = 1
    lam: float = 1.0
    epochs: int | None = None

    def __post_init__(self):
        check(self.kind in KINDS, "aggregator.personal", self.kind, f"choose one of: {', '.join(KINDS)}")
        check(isinstance(self.local_layers, int) and self.local_layers >= 1, "aggregator.local_layers",
              self.local_layers, "must be an integer >= 1 (FedPer's personalization layers, counted from the output)")
        check(isinstance(self.lam, (int, float)) and math.isfinite(self.lam) and self.lam >= 0, "aggregator.lam",
              self.lam, "must be a finite number >= 0 (Ditto's lambda)")
        check(self.epochs is None or (isinstance(self.epochs, int) and self.epochs >= 1), "aggregator.personal_epochs",
              self.epochs, "must be an integer >= 1, or null for hyperparams.local_epochs")

    @property
    def whole_model(self) -> bool:
        """Ditto: a whole personal model beside the global one (trained by a second local step)."""
        return self.kind == "ditto"

    def local_names(self, params: Params, buffers: Params, layers: list[Layer], model: str = "the model",
                    strict: bool = True) -> list[str]:
        """The parameters and buffers each client keeps, in the model's order.  ``strict``: a model
        with nothing to keep (FedBN without BatchNorm), or nothing left to share (FedPer keeping every
        layer), is refused in one line (the run checks this before it starts; the server's state alone,
        as in a test of the aggregator's contract, keeps what there is)."""
        if self.kind == "ditto":
            return [*params, *buffers]
        if self.kind == "fedbn":
            kept = [layer for layer in layers if layer.type == "norm"]
            check(bool(kept) or not strict, "aggregator", "fedbn", f"keeps the BatchNorm layers local, and {model} has none "
                  "(a model with BatchNorm: model=mlp model.batch_norm=true, model=cifar10_cnn, or model=neta_baseline model.norm=bn)")
        else:
            check(self.local_layers < len(layers) or not strict, "aggregator.local_layers", self.local_layers,
                  f"must be below the number of layers with parameters ({len(layers)} in {model}): FedPer keeps "
                  "the last ones local and averages the rest")
            kept = layers[-self.local_layers:]
        owners = {layer.name for layer in kept}
        names = [k for layer in kept for k in layer.params]
        # A layer's buffers (BatchNorm's running statistics) go with it: ``bn1.running_mean`` belongs to ``bn1``.
        names += [k for k in buffers if k.rpartition(".")[0] in owners]
        return names

    def init(self, params: Params, buffers: Params, num_clients: int, layers: list[Layer]) -> dict:
        """Before round 1: ``w_0``'s values of the kept tensors (every client's until it trains) and
        no client's own yet."""
        names = self.local_names(params, buffers, layers, strict=False)
        source = {**params, **buffers}
        return {"names": names, "initial": {k: source[k].clone() for k in names},
                "clients": torch.zeros(0, dtype=torch.long),
                "own": {k: source[k].new_zeros((0, *source[k].shape)) for k in names}}

    @staticmethod
    def rows(state: dict, clients: list[int]) -> list[int]:
        """Each client's row in ``state["own"]``, -1 for a client that has not trained yet."""
        return client_rows.positions(state["clients"], clients)

    @staticmethod
    def own(state: dict, clients: list[int]) -> Params:
        """The clients' kept values, stacked ``[m, ...]`` in their order (``w_0``'s for a client that
        has not trained yet)."""
        rows = Personalization.rows(state, clients)
        return {k: torch.stack([own[r] if r >= 0 else state["initial"][k] for r in rows])
                for k, own in state["own"].items()}

    @staticmethod
    def keep(state: dict, clients: list[int], values: Params) -> dict:
        """The state with ``values`` (stacked ``[m, ...]``) kept for ``clients``: a client that trained
        before has its row replaced, a new one is appended.  A new state, the old one untouched (the
        state is data)."""
        if not state["names"]:
            return state
        own, ids = client_rows.store(state["own"], state["clients"], clients, Personalization.rows(state, clients),
                                     values)
        return {**state, "clients": ids, "own": own}

    @staticmethod
    def trained(state: dict, params: Params, results: ClientResults) -> Params:
        """The clients' kept values after training: ``w_t + dw_k`` for parameters (the engines
        measure updates from ``w_t``), the final values for buffers."""
        return {k: params[k].unsqueeze(0) + results.deltas[k] if k in params else results.buffers[k]
                for k in state["names"]}

    @staticmethod
    def shared_only(state: dict, params: Params, buffers: Params, results: ClientResults) -> ClientResults:
        """What the server aggregates of FedBN's or FedPer's round: the clients' results with the
        local layers taken out (their updates zero, their buffers ``w_t``'s), so the global model
        keeps its values there and N, E and parameter divergence measure the layers clients send."""
        names = set(state["names"])
        deltas = {k: torch.zeros_like(v) if k in names else v for k, v in results.deltas.items()}
        kept = {k: buffers[k].unsqueeze(0).expand_as(v).clone() if k in names else v for k, v in results.buffers.items()}
        return replace(results, deltas=deltas, buffers=kept)

    @staticmethod
    def models(state: dict, clients: list[int], params: Params, buffers: Params):
        """Each of ``clients``' personal model in turn: the global ``params`` and ``buffers`` with its
        kept values in place (Ditto: its whole model; ``w_0``'s for a client that has not trained).
        The clients' rows are looked up once, and one model is built at a time (a generator: Ditto's
        K whole models are never stacked to be scored)."""
        for row in Personalization.rows(state, clients):
            yield {**params, **buffers,
                   **{k: own[row] if row >= 0 else state["initial"][k] for k, own in state["own"].items()}}

    @staticmethod
    def client_bytes(state: dict) -> int:
        """The bytes one client's kept values take (the local layers; Ditto: the model)."""
        return sum(v.numel() * v.element_size() for v in state["initial"].values())
