"""Norm-based weight divergence analysis (NWDA, Nagura et al. sec. 3.1), per layer and per model.

With client updates ``dw_k = w_k - w_t`` stacked as ``[m, *shape]`` tensors and client weights
``p_k`` (``n_k / n``, or whatever the aggregator uses):

* ``N = || sum_k p_k dw_k ||``       eq. (4): how far the averaged model moves;
* ``E = sum_k p_k || dw_k ||``       eq. (5): how far the clients moved on average;
* ``N <= E``                          Proposition 1 (triangle inequality), equality for m = 1;
* the server step ``|| w_{t+1} - w_t ||`` eq. (24), which differs from N once the server rescales
  or adds momentum.

Everything derives from one Gram matrix of the updates per layer (:func:`layer_grams`), so the
same numbers are available per layer, per layer type (the FC and conv curves of Figs. 8-9) and
for the whole model, and parameter divergence (:mod:`fedrun.diagnostics.divergence`) reads the same matrices.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedrun.models.layers import Layer
from fedrun.params import Params


def layer_norms(params: Params, layers: list[Layer]) -> torch.Tensor:
    """``[L]``: the norm of one (unstacked) parameter dict restricted to each layer."""
    return torch.stack([sum(params[p].double().pow(2).sum() for p in layer.params) for layer in layers]).sqrt()


# Columns of the stacked updates converted to float64 at a time: bounds the Gram's working memory
# (m x CHUNK x 8 bytes, 32 MiB) whatever the layer's size.
GRAM_CHUNK = 2**22


@dataclass
class LayerGrams:
    """Every inner product the round's diagnostics need, per layer, in float64.

    ``updates[l, j, k] = <dw_{j,l}, dw_{k,l}>`` for the m stacked client updates (and, as row and
    column m, an ``extra`` update such as the PD-VL reference's); with the global model ``w``,
    ``with_model[l, k] = <w_l, dw_{k,l}>`` and ``model_sq[l] = ||w_l||^2``.  From these follow the
    client norms and N, E (eq. 4-5: ``N_l^2 = p^T D_l p``), each client's dot with the mean update
    (``D_l p``), and the Gram matrix of the learners' parameters ``w + dw_k`` that parameter
    divergence needs (:meth:`learners`): one pass over the updates for all of them.
    """

    updates: torch.Tensor  # [L, m(+1), m(+1)]
    with_model: torch.Tensor | None = None  # [L, m(+1)]
    model_sq: torch.Tensor | None = None  # [L]
    clients: int = 0  # m: the rows that are client updates (an extra row follows them)

    def client_updates(self) -> torch.Tensor:
        """``[L, m, m]``: the clients' block."""
        return self.updates[:, : self.clients, : self.clients]

    def learners(self) -> torch.Tensor:
        """``[L, m(+1), m(+1)]``: ``<w + dw_j, w + dw_k>`` per layer, expanded exactly in float64
        (no float32 rounding of ``w + dw``)."""
        a = self.with_model
        return self.updates + a[:, :, None] + a[:, None, :] + self.model_sq[:, None, None]


def layer_grams(stacked: Params, layers: list[Layer], params: Params | None = None,
                extra: Params | None = None, chunk: int = GRAM_CHUNK) -> LayerGrams:
    """:class:`LayerGrams` of stacked updates ``[m, *shape]`` (plus one ``extra`` update
    ``[*shape]``), and their dots with ``params`` when given.

    Each parameter is read once, ``chunk // m`` columns at a time converted to float64 (float64
    before squaring: float32 updates above ~1e19 would overflow, and late in training the
    learners' cosines are within 1e-8 of 1)."""
    first = stacked[next(iter(stacked))]
    m = first.shape[0]
    rows = m + (extra is not None)
    device, f64 = first.device, torch.float64
    updates = torch.zeros(len(layers), rows, rows, dtype=f64, device=device)
    with_model = torch.zeros(len(layers), rows, dtype=f64, device=device) if params is not None else None
    model_sq = torch.zeros(len(layers), dtype=f64, device=device) if params is not None else None
    width = max(chunk // rows, 1)
    for i, layer in enumerate(layers):
        for name in layer.params:
            x = stacked[name].reshape(m, -1)
            if extra is not None:
                x = torch.cat([x, extra[name].reshape(1, -1).to(x.dtype)])
            w = params[name].reshape(-1) if params is not None else None
            for start in range(0, x.shape[1], width):
                block = x[:, start:start + width].to(f64)
                updates[i] += block @ block.T
                if w is not None:
                    w_block = w[start:start + width].to(f64)
                    with_model[i] += block @ w_block
                    model_sq[i] += w_block @ w_block
    return LayerGrams(updates, with_model, model_sq, m)


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


def nwda(deltas: Params, weights: torch.Tensor, layers: list[Layer], grams: LayerGrams | None = None) -> NormStats:
    """Compute N (eq. 4) and E (eq. 5) per layer and for the whole model.

    Args:
      deltas: client updates ``w_k - w_t``, stacked ``[m, *shape]`` per parameter name.
      weights: ``[m]`` aggregation weights ``p_k`` summing to one.
      layers: the model's layers (:func:`fedrun.models.layers.layers`).
      grams: the updates' :class:`LayerGrams` if already computed (the simulation computes them
        once a round for these norms and for parameter divergence).

    With ``D_l`` the updates' Gram matrix of layer l: ``||dw_{k,l}||^2 = D_l[k, k]``,
    ``<dw_{k,l}, sum_j p_j dw_{j,l}> = (D_l p)_k`` and ``N_l^2 = p^T D_l p``.
    """
    grams = layer_grams(deltas, layers) if grams is None else grams
    gram = grams.client_updates()  # [L, m, m]
    weights = weights.to(gram.device, torch.float64)
    sq = gram.diagonal(dim1=1, dim2=2).T  # [m, L]
    dot = (gram @ weights).T  # [m, L]
    layer_N = (weights @ dot).clamp_min(0).sqrt()  # p^T D p >= 0 up to rounding
    layer_E = weights @ sq.sqrt()
    client_norms = sq.sum(1).sqrt()
    return NormStats(N=float(layer_N.pow(2).sum().sqrt()), E=float(weights @ client_norms),
                     layer_N=layer_N, layer_E=layer_E, client_norms=client_norms, client_sq=sq, client_dot=dot)
