"""Norm-based weight divergence analysis (NWDA, Nagura et al. sec. 3.1), per layer and per model.

With client updates ``dw_k = w_k - w_t`` stacked as ``[m, *shape]`` tensors and client weights
``p_k`` (``n_k / n``, or whatever the aggregator uses):

* ``N = || sum_k p_k dw_k ||``       eq. (4): how far the averaged model moves;
* ``E = sum_k p_k || dw_k ||``       eq. (5): how far the clients moved on average;
* ``N <= E``                          Proposition 1 (triangle inequality), equality for m = 1;
* the server step ``|| w_{t+1} - w_t ||`` eq. (24), which differs from N once the server rescales
  or adds momentum.

Everything derives from one ``[m, L]`` table of per-client per-layer squared norms, so the same
numbers are available per layer, per layer type (the FC and conv curves of Figs. 8-9) and for the
whole model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedrun.models import Layer

Params = dict[str, torch.Tensor]


def weighted_mean(stacked: Params, weights: torch.Tensor) -> Params:
    """``sum_k p_k x_k`` for every stacked tensor ``x`` of shape ``[m, *shape]``."""
    return {name: torch.tensordot(weights.to(x.dtype), x, dims=1) for name, x in stacked.items()}


def weighted_mean_by_layer(stacked: Params, weights: torch.Tensor, layers: list[Layer]) -> Params:
    """``sum_k p_{k,l} x_k`` with a weight row per layer: ``weights`` is ``[L, m]`` (FedLayerWise eq. 7)."""
    row = {p: i for i, layer in enumerate(layers) for p in layer.params}
    return {name: torch.tensordot(weights[row[name]].to(x.dtype), x, dims=1) for name, x in stacked.items()}


def client_layer_sq_norms(stacked: Params, layers: list[Layer]) -> torch.Tensor:
    """``[m, L]``: ``||dw_{k,l}||^2``, client k's update restricted to layer l's parameters."""
    # float64 before squaring: float32 updates above ~1e19 would overflow to inf.
    cols = [sum(stacked[p].flatten(1).double().pow(2).sum(1) for p in layer.params) for layer in layers]
    return torch.stack(cols, dim=1)


def layer_norms(params: Params, layers: list[Layer]) -> torch.Tensor:
    """``[L]``: the norm of one (unstacked) parameter dict restricted to each layer."""
    return torch.stack([sum(params[p].double().pow(2).sum() for p in layer.params) for layer in layers]).sqrt()


def client_layer_dots(stacked: Params, other: Params, layers: list[Layer]) -> torch.Tensor:
    """``[m, L]``: ``<dw_{k,l}, v_l>`` for a stacked update and one parameter dict ``v``."""
    cols = [sum((stacked[p].flatten(1).double() @ other[p].flatten().double()) for p in layer.params)
            for layer in layers]
    return torch.stack(cols, dim=1)


def _angle(dot: torch.Tensor, norm_a: torch.Tensor, norm_b: torch.Tensor) -> torch.Tensor:
    """``arccos(dot / (|a| |b|))`` in radians; pi/2 (no alignment) where a norm is zero."""
    denom = norm_a * norm_b
    cos = torch.where(denom > 0, dot / denom.clamp_min(1e-300), torch.zeros_like(dot))
    return torch.arccos(cos.clamp(-1.0, 1.0))


@dataclass
class NormStats:
    """N and E (eq. 4-5) for the whole model, per layer, and the client update norms."""

    N: float
    E: float
    layer_N: torch.Tensor  # [L]
    layer_E: torch.Tensor  # [L]
    client_norms: torch.Tensor  # [m], ||dw_k|| over the whole model
    client_sq: torch.Tensor  # [m, L] squared norms, for any grouping of layers
    client_dot: torch.Tensor  # [m, L] <dw_{k,l}, mean update_l>

    def angles(self) -> torch.Tensor:
        """``[m]`` angle between each client's update and the weighted mean update (radians).

        FedAdp's instantaneous angle (FedLayerWise eq. 1 applied to the whole model): the client
        "gradient" ``-dw_k / eta`` (eq. 3) against the global one (eq. 2); the ``-1/eta`` scale
        cancels in the cosine.
        """
        return _angle(self.client_dot.sum(1), self.client_norms, torch.tensor(self.N, dtype=torch.float64))

    def layer_angles(self) -> torch.Tensor:
        """``[m, L]`` the same angle per layer (FedLayerWise eq. 1)."""
        return _angle(self.client_dot, self.client_sq.sqrt(), self.layer_N.unsqueeze(0))

    def group(self, mask: torch.Tensor, weights: torch.Tensor) -> tuple[float, float]:
        """N and E over the layers selected by a boolean ``mask`` ``[L]`` (e.g. all FC layers)."""
        n = float(self.layer_N[mask].pow(2).sum().sqrt())
        e = float((weights * self.client_sq[:, mask].sum(1).sqrt()).sum())
        return n, e


def nwda(deltas: Params, weights: torch.Tensor, layers: list[Layer],
         mean: Params | None = None) -> NormStats:
    """Compute N (eq. 4) and E (eq. 5) per layer and for the whole model.

    Args:
      deltas: client updates ``w_k - w_t``, stacked ``[m, *shape]`` per parameter name.
      weights: ``[m]`` aggregation weights ``p_k`` summing to one.
      layers: the model's layers (:func:`fedrun.models.layers`).
      mean: ``sum_k p_k dw_k`` if already computed.
    """
    weights = weights.to(torch.float64)
    mean = weighted_mean(deltas, weights) if mean is None else mean
    sq = client_layer_sq_norms(deltas, layers)  # [m, L]
    layer_N = layer_norms(mean, layers)
    layer_E = weights @ sq.sqrt()
    client_norms = sq.sum(1).sqrt()
    return NormStats(N=float(layer_N.pow(2).sum().sqrt()), E=float(weights @ client_norms),
                     layer_N=layer_N, layer_E=layer_E, client_norms=client_norms, client_sq=sq,
                     client_dot=client_layer_dots(deltas, mean, layers))
