"""Parameter divergence between learners (the parameter-divergence paper, Definition 1).

Both metrics are cosine distances between the learners' *parameters* ``w_k^t = w^{t-1} + dw_k``
after local training (not between their updates), for one layer ``z_k`` (a subset of ``w_k``)
or for the whole model:

* PD-Ls, between local updates::

      zeta = C(K, 2)^-1 sum_{i<j} (1 - z_i . z_j / (|z_i| |z_j|))

* PD-VL, between the vanilla update and the local updates::

      xi = 1/K sum_k (1 - z_{-1} . z_k / (|z_{-1}| |z_k|))

  where ``w_{-1}^t`` is the round's global model trained on IID data for as many iterations as
  a learner (:func:`vanilla_indices` draws that data).

Definition 1 assumes equally sized learners, so both are plain (unweighted) means over the
round's learners.  The "universal set" is the trainable parameters (BatchNorm scales and shifts
included, running statistics not).  Computed in float64: late in training the cosines are
within 1e-8 of 1 and float32 would round the distances away.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedrun.models import Layer
from fedrun.norms import Params
from fedrun.seeding import torch_generator


@dataclass
class Divergence:
    """One round's parameter divergence: per layer ``[L]`` and for the whole model."""

    layer_ls: torch.Tensor  # [L] PD-Ls per layer
    ls: float  # PD-Ls of the whole model
    layer_vl: torch.Tensor | None = None  # [L] PD-VL per layer (None: no vanilla reference)
    vl: float | None = None


class LearnerParams(Mapping):
    """The learners' parameters ``w_k = w + dw_k`` as a read-only mapping of stacked tensors,
    each computed when read: the divergence needs one tensor at a time, so m copies of the
    model are never held at once (m = 100 clients of a 1M-parameter CNN would be 400 MB)."""

    def __init__(self, params: Params, deltas: Params):
        self.params, self.deltas = params, deltas

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.params[name].unsqueeze(0) + self.deltas[name]

    def __iter__(self):
        return iter(self.deltas)

    def __len__(self) -> int:
        return len(self.deltas)


def _gram(client_params: Mapping[str, torch.Tensor], names: tuple[str, ...],
          reference: Params | None) -> torch.Tensor:
    """The float64 Gram matrix ``[K(+1), K(+1)]`` of the learners' (and the reference's, last)
    parameter vectors restricted to ``names``: every cosine of Definition 1, and additive over
    layers, so the whole model's is the sum of its layers'."""
    gram = 0
    for p in names:
        z = client_params[p].double()
        z = z.reshape(z.shape[0], -1)
        if reference is not None:
            z = torch.cat([z, reference[p].double().reshape(1, -1)])
        gram = gram + z @ z.T
    return gram


def _distances(gram: torch.Tensor, k: int, with_reference: bool, eps: float) -> tuple[float, float | None]:
    """PD-Ls and PD-VL from a Gram matrix whose first ``k`` rows are the learners."""
    norms = gram.diagonal().sqrt().clamp_min(eps)
    cos = gram / (norms[:, None] * norms[None, :])
    pairs = torch.triu_indices(k, k, offset=1)
    ls = float((1 - cos[pairs[0], pairs[1]]).mean()) if k > 1 else float("nan")
    vl = float((1 - cos[k, :k]).mean()) if with_reference else None
    return ls, vl


def parameter_divergence(client_params: Mapping[str, torch.Tensor], layers: list[Layer], reference: Params | None = None,
                         eps: float = 1e-30) -> Divergence:
    """PD-Ls (and PD-VL when a ``reference`` ``w_{-1}`` is given) per layer and for the model.

    Each layer's cosines come from one Gram matrix of the K learners' (and the reference's)
    vectors; the whole model's Gram matrix is the sum of the layers', so it costs nothing more.

    Args:
      client_params: the learners' parameters ``w_k``, stacked ``[K, *shape]`` per name (a
        dict, or a :class:`LearnerParams` that adds each update to the global model when read).
      layers: the model's layers (:func:`fedrun.models.layers`).
      reference: the vanilla-updated parameters ``w_{-1}``, one ``[*shape]`` tensor per name.

    Returns:
      :class:`Divergence`; PD-Ls is NaN with fewer than two learners.  A zero vector's cosine is
      taken as 0 (distance 1), which only happens for an all-zero layer.
    """
    k = client_params[next(iter(client_params))].shape[0]
    grams = [_gram(client_params, layer.params, reference) for layer in layers]
    per_layer = [_distances(g, k, reference is not None, eps) for g in grams]
    ls, vl = _distances(sum(grams), k, reference is not None, eps)
    layer_ls = torch.tensor([d[0] for d in per_layer], dtype=torch.float64)
    if reference is None:
        return Divergence(layer_ls, ls)
    return Divergence(layer_ls, ls, torch.tensor([d[1] for d in per_layer], dtype=torch.float64), vl)


def vanilla_indices(num_train: int, size: int, seed: int, round_: int, device) -> torch.Tensor:
    """The IID training data of round ``round_``'s vanilla reference learner.

    ``size`` examples drawn uniformly without replacement from the whole training set (the
    population distribution), from a generator seeded by ``(seed, "vanilla", round)``.  Trained
    for E epochs at batch B this takes ``size / B`` iterations a round, as many as a learner
    holding ``size`` examples (Definition 1: "the same number of iterations with the actual
    learners (i.e. |P_k|/B)").
    """
    perm = torch.randperm(num_train, generator=torch_generator(seed, "vanilla", round_))
    return perm[: min(size, num_train)].sort().values.to(device)


def mean_size(num_examples: torch.Tensor) -> int:
    """The reference learner's data size: the round's mean learner size, rounded half up."""
    return int(np.floor(float(num_examples.double().mean()) + 0.5))
