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

In a run no m x m matrix is formed (:func:`round_divergence`, O(m d)): with the learners' unit
vectors ``v_k = z_k / |z_k|`` and their mean ``v``, ``sum_{i<j} |v_i - v_j|^2 = K sum_k |v_k - v|^2``,
so PD-Ls is a spread around the mean direction::

    zeta = 1 - (1/K) sum_k |v_k|^2 + (sum_k |v_k|^2 - K |v|^2) / (K - 1)   (= K (1 - |v|^2) / (K - 1))

from the learners' norms (streamed with N and E, :class:`fedrun.diagnostics.nwda.RoundSums`,
``|w + dw_k|^2 = |w|^2 + 2 <w, dw_k> + |dw_k|^2``) and one more pass for ``|v|^2``; PD-VL needs
only each learner's dot with the reference.  :func:`parameter_divergence` takes the Gram matrices
of given learners instead (:func:`fedrun.diagnostics.nwda.layer_grams`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedrun.models.layers import Layer
from fedrun.diagnostics.nwda import LayerGrams, RoundSums, layer_grams
from fedrun.params import Params
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


def divergence_from_grams(grams: torch.Tensor, k: int, with_reference: bool, eps: float = 1e-30) -> Divergence:
    """PD-Ls (and PD-VL) from the learners' per-layer Gram matrices ``[L, k(+1), k(+1)]`` (the
    reference, if any, last): each layer's cosines from its matrix, the whole model's from their
    sum (the Gram matrix of the concatenated vectors), so it costs nothing more."""
    stack = torch.cat([grams, grams.sum(0, keepdim=True)])  # [L + 1, ...]: the layers, then the model
    norms = stack.diagonal(dim1=1, dim2=2).sqrt().clamp_min(eps)
    cos = stack / (norms[:, :, None] * norms[:, None, :])
    nan = torch.full((len(stack),), float("nan"), dtype=stack.dtype, device=stack.device)
    if k > 1:
        pairs = torch.triu_indices(k, k, offset=1, device=stack.device)
        ls = (1 - cos[:, pairs[0], pairs[1]]).mean(1)
    else:
        ls = nan
    vl = (1 - cos[:, k, :k]).mean(1) if with_reference else nan
    ls, vl = torch.stack([ls, vl]).cpu()  # one transfer for the round's divergence
    if not with_reference:
        return Divergence(ls[:-1], float(ls[-1]))
    return Divergence(ls[:-1], float(ls[-1]), vl[:-1], float(vl[-1]))


def round_divergence(grams: RoundSums | LayerGrams, eps: float = 1e-30) -> Divergence:
    """A round's divergence from its :class:`fedrun.diagnostics.nwda.RoundSums` (streamed, O(m d):
    the module's spread form) or from the updates' :func:`fedrun.diagnostics.nwda.layer_grams`, both
    taken with the global model (and the vanilla reference's update as the extra one): the learners'
    inner products are expanded from the updates' exactly, so no learner's ``w + dw_k`` is ever built."""
    if isinstance(grams, RoundSums) and grams.single:  # one learner: the 1 x 1 Gram path (RoundSums.single)
        grams = grams.grams()
    if isinstance(grams, LayerGrams):
        return divergence_from_grams(grams.learners(), grams.clients, grams.updates.shape[1] > grams.clients, eps)
    return streamed_divergence(grams, eps)


def streamed_divergence(sums: RoundSums, eps: float = 1e-30) -> Divergence:
    """PD-Ls and PD-VL per layer and for the model without a Gram matrix (the module's spread form):
    the learners' norms from :meth:`~fedrun.diagnostics.nwda.RoundSums.sums`, the squared norm of
    their mean unit vector from one more pass (:meth:`~fedrun.diagnostics.nwda.RoundSums.mean_direction`).
    A zero vector's cosine is 0 (distance 1), as in :func:`divergence_from_grams`."""
    s, k = sums.sums(), sums.clients
    layer_sq = s.learner_sq().clamp_min(0)  # [k, L]
    sq = torch.cat([layer_sq, layer_sq.sum(1, keepdim=True)], 1)  # [k, L + 1]: the layers, then the model
    raw = sq.sqrt()
    norms = raw.clamp_min(eps)
    units = (raw / norms).square()  # |v_k|^2: 1, or 0 for a zero vector
    nan = torch.full((sq.shape[1],), float("nan"), dtype=sq.dtype, device=sq.device)
    if k > 1:
        inverse = 1 / (k * norms)  # [k, L + 1]
        scales = torch.stack([inverse[:, :-1], inverse[:, -1:].expand_as(inverse[:, :-1])])  # [2, k, L]
        mean_sq = sums.mean_direction(scales)  # [2, L]: per layer; the model's mean direction, by layer
        mean_sq = torch.cat([mean_sq[0], mean_sq[1].sum(0, keepdim=True)])  # [L + 1]: |v|^2
        total = units.sum(0)
        ls = 1 - total / k + (total - k * mean_sq) / (k - 1)
    else:
        ls = nan
    if s.extra_dot is not None:
        ref_sq = s.reference_sq().clamp_min(0)
        ref_norms = torch.cat([ref_sq, ref_sq.sum(0, keepdim=True)]).sqrt().clamp_min(eps)  # [L + 1]
        dots = s.reference_dot()
        dots = torch.cat([dots, dots.sum(1, keepdim=True)], 1)  # [k, L + 1]
        vl = (1 - dots / (ref_norms[None, :] * norms)).mean(0)
    else:
        vl = nan
    ls, vl = torch.stack([ls, vl]).cpu()  # one transfer for the round's divergence
    if s.extra_dot is None:
        return Divergence(ls[:-1], float(ls[-1]))
    return Divergence(ls[:-1], float(ls[-1]), vl[:-1], float(vl[-1]))


def parameter_divergence(client_params: Mapping[str, torch.Tensor], layers: list[Layer], reference: Params | None = None,
                         eps: float = 1e-30) -> Divergence:
    """PD-Ls (and PD-VL when a ``reference`` ``w_{-1}`` is given) per layer and for the model.

    Args:
      client_params: the learners' parameters ``w_k``, stacked ``[K, *shape]`` per name.
      layers: the model's layers (:func:`fedrun.models.layers.layers`).
      reference: the vanilla-updated parameters ``w_{-1}``, one ``[*shape]`` tensor per name.

    Returns:
      :class:`Divergence`; PD-Ls is NaN with fewer than two learners.  A zero vector's cosine is
      taken as 0 (distance 1), which only happens for an all-zero layer.
    """
    grams = layer_grams(dict(client_params), layers, extra=reference)
    return divergence_from_grams(grams.updates, grams.clients, reference is not None, eps)


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


def train_vanilla(engine, params: Params, buffers: Params, results, learner: int, num_train: int, seed: int,
                  round_: int, epochs: int, lr: float, starts: Params | None):
    """Train round ``round_``'s vanilla reference learner ``w_{-1}^t`` of Definition 1.

    It starts from the round's global model with the mean of the clients' starting optimizer
    states (when they carry state), trains on :func:`vanilla_indices` data of the round's mean
    learner size for E epochs, and is client ``learner`` (= K, one past the clients) to the engine,
    so its batches derive from ``(seed, round, K)``.  Returns the engine's results (m = 1).
    """
    device = next(iter(params.values())).device
    data = vanilla_indices(num_train, mean_size(results.num_examples), seed, round_, device)
    start = None if starts is None else {k: v.mean(0, keepdim=True) for k, v in starts.items()}
    return engine.train(params, buffers, [learner], [data], round_, [epochs], lr, start)
