"""Norm-based weight divergence analysis (NWDA, Nagura et al. sec. 3.1), per layer and per model.

With client updates ``dw_k = w_k - w_t`` stacked as ``[m, *shape]`` tensors and client weights
``p_k`` (``n_k / n``, or whatever the aggregator uses):

* ``N = || sum_k p_k dw_k ||``       eq. (4): how far the averaged model moves;
* ``E = sum_k p_k || dw_k ||``       eq. (5): how far the clients moved on average;
* ``N <= E``                          Proposition 1 (triangle inequality), equality for m = 1;
* the server step ``|| w_{t+1} - w_t ||`` eq. (24), which differs from N once the server rescales
  or adds momentum.

In a run, everything streams over the updates' columns in float64 blocks (:class:`RoundSums`), in
O(m d) time and O(m L) memory: the clients' squared norms per layer, the weighted mean update and
each client's dot with it (N, E, the angles), and the sums parameter divergence reads
(:mod:`fedrun.diagnostics.divergence`).  Only a rule that compares clients pairwise (Krum) asks
for the per-layer Gram matrices of the updates (:func:`layer_grams`, m^2 d multiply-adds), and
only then are they built.  The same numbers are available per layer, per layer type (the FC and
conv curves of Figs. 8-9) and for the whole model.
"""
from __future__ import annotations

import functools
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
      grams: the round's :class:`RoundSums` (the simulation shares them with parameter
        divergence), or the updates' :class:`LayerGrams` where already built; None: streamed here.

    Streamed (:meth:`RoundSums.stats`, O(m d)): ``||dw_{k,l}||^2``, the float64 mean update
    ``mu_l = sum_j p_j dw_{j,l}`` block by block, ``<dw_{k,l}, mu_l>`` and ``N_l = ||mu_l||``.
    From a Gram matrix ``D_l`` of layer l: ``||dw_{k,l}||^2 = D_l[k, k]``,
    ``<dw_{k,l}, mu_l> = (D_l p)_k`` and ``N_l^2 = p^T D_l p``.
    """
    if grams is None or isinstance(grams, RoundSums):  # streamed: no m x m matrix
        return (RoundSums(deltas, layers) if grams is None else grams).stats(weights)
    return _gram_stats(grams, weights)


def _gram_stats(grams: LayerGrams, weights: torch.Tensor) -> NormStats:
    """:class:`NormStats` from the updates' Gram matrices (:func:`nwda`)."""
    gram = grams.client_updates()  # [L, m, m]
    weights = weights.to(gram.device, torch.float64)
    sq = gram.diagonal(dim1=1, dim2=2).T  # [m, L]
    dot = (gram @ weights).T  # [m, L]
    layer_N = (weights @ dot).clamp_min(0).sqrt()  # p^T D p >= 0 up to rounding
    layer_E = weights @ sq.sqrt()
    client_norms = sq.sum(1).sqrt()
    return NormStats(N=float(layer_N.pow(2).sum().sqrt()), E=float(weights @ client_norms),
                     layer_N=layer_N, layer_E=layer_E, client_norms=client_norms, client_sq=sq, client_dot=dot)


# Values (clients x columns) converted to float64 at a time by the streamed sums (RoundSums): bounds
# their working memory whatever m and the layer's size.  On a CPU a block of 4 MiB stays in cache
# for the several reads a pass makes of it (measured with FedLap's MLP on a 2-core CPU with 32 MiB
# of L3: the round's two passes 3-5x faster at m = 100-300 than with 32 MiB blocks, 1.4x at
# m = 1,000, 1.3x at 10,000; docs/performance.md); a CUDA GPU reads from its own memory at any
# block size and pays a kernel launch a block, so it takes larger ones.  The block size orders the
# float64 sums, so it is part of a run's numerics: a device that stands in for a GPU in the tests
# (and every device but CUDA) sums as the CPU does.
STREAM_CHUNK = {"cuda": 2**22}
STREAM_CHUNK_DEFAULT = 2**19


def stream_chunk(device: torch.device) -> int:
    """The streamed sums' block size (values a block) on ``device``: :data:`STREAM_CHUNK`."""
    return STREAM_CHUNK.get(torch.device(device).type, STREAM_CHUNK_DEFAULT)


def _columns(stacked: Params, layers: list[Layer], params: Params | None, extra: Params | None, chunk: int):
    """``(layer index, block [m, c], w [c] or None, extra [c] or None)`` over every column of every
    layer's parameters, ``chunk // m`` columns at a time, in float64 (products of float32 values are
    exact in float64; only the sums round)."""
    first = stacked[next(iter(stacked))]
    m, f64 = first.shape[0], torch.float64
    width = max(chunk // m, 1)
    for i, layer in enumerate(layers):
        for name in layer.params:
            x = stacked[name].reshape(m, -1)
            w = params[name].reshape(-1) if params is not None else None
            e = extra[name].reshape(-1) if extra is not None else None
            for start in range(0, x.shape[1], width):
                end = start + width
                yield (i, x[:, start:end].to(f64), None if w is None else w[start:end].to(f64),
                       None if e is None else e[start:end].to(f64))


@dataclass
class ClientSums:
    """One streamed pass over the round's m stacked updates (:meth:`RoundSums.sums`), per layer, in
    float64: ``sq[k, l] = ||dw_{k,l}||^2``; with the global model ``w``, ``with_model[k, l] =
    <w_l, dw_{k,l}>`` and ``model_sq[l] = ||w_l||^2``; with an extra (reference) update ``e``,
    ``extra_dot[k, l] = <e_l, dw_{k,l}>``, ``extra_sq[l] = ||e_l||^2`` and ``extra_model[l] =
    <w_l, e_l>``."""

    sq: torch.Tensor  # [m, L]
    with_model: torch.Tensor | None = None  # [m, L]
    model_sq: torch.Tensor | None = None  # [L]
    extra_dot: torch.Tensor | None = None  # [m, L]
    extra_sq: torch.Tensor | None = None  # [L]
    extra_model: torch.Tensor | None = None  # [L]

    def learner_sq(self) -> torch.Tensor:
        """``[m, L]``: ``||w_l + dw_{k,l}||^2``, expanded in float64 as :meth:`LayerGrams.learners`'s diagonal."""
        a = self.with_model
        return self.sq + a + a + self.model_sq

    def reference_sq(self) -> torch.Tensor:
        """``[L]``: ``||w_l + e_l||^2``."""
        a = self.extra_model
        return self.extra_sq + a + a + self.model_sq

    def reference_dot(self) -> torch.Tensor:
        """``[m, L]``: ``<w_l + e_l, w_l + dw_{k,l}>``, as :meth:`LayerGrams.learners`'s last row."""
        return self.extra_dot + self.extra_model + self.with_model + self.model_sq


class RoundSums:
    """A round's stacked updates ``[m, *shape]`` and what its diagnostics read of them, each computed
    when first asked for, in float64 blocks of columns (``chunk`` values at a time; None: :func:`stream_chunk`):

    * :meth:`stats` (N, E, the client norms and angles: :class:`NormStats`) and :meth:`sums`
      (:class:`ClientSums`, which parameter divergence also reads): one pass, O(m d);
    * :meth:`mean_direction`: one more pass for PD-Ls, O(m d) (:func:`fedrun.diagnostics.divergence.round_divergence`);
    * :meth:`client_updates`: the per-layer Gram matrices ``[L, m, m]`` of the updates, m^2 d
      multiply-adds and ``L m^2`` float64 of memory, built only for a rule that reads them (Krum).

    ``params`` is the global model ``w`` (for the learners' ``w + dw_k``), ``extra`` one more update
    ``[*shape]`` (PD-VL's reference learner) that takes part in none of the clients' statistics.
    """

    def __init__(self, stacked: Params, layers: list[Layer], params: Params | None = None,
                 extra: Params | None = None, chunk: int | None = None):
        self.stacked, self.layers, self.params, self.extra = stacked, layers, params, extra
        first = stacked[next(iter(stacked))]
        self.clients, self.device = first.shape[0], first.device
        self.chunk = stream_chunk(self.device) if chunk is None else chunk
        self._sums: ClientSums | None = None
        self._grams: LayerGrams | None = None

    @property
    def single(self) -> bool:
        """One client: its 1 x 1 Gram matrix (:meth:`grams`) costs what the streamed sums cost, O(d),
        and the statistics come from it as on the Gram path, to the bit.  A single client's angle to
        the mean update (itself) is ``arccos(1 +- 1 ulp)``, 0 or ~1.5e-8 by rounding alone: only the
        same sums in the same order print the same digits."""
        return self.clients == 1

    def sums(self) -> ClientSums:
        if self._sums is None:
            self._stream(None)
        return self._sums

    def stats(self, weights: torch.Tensor) -> NormStats:
        """:class:`NormStats` with the weights ``p`` (the base weights): ``N_l = ||sum_k p_k dw_{k,l}||``
        from the float64 mean update itself, formed block by block, and each client's dot with it
        (``(D_l p)_k`` of :func:`nwda`), in the pass that gives :meth:`sums` if that has not run yet."""
        weights = weights.to(self.device, torch.float64)
        if self.single:
            return _gram_stats(self.grams(), weights)
        sq, dot, mean_sq = self._stream(weights)
        return _norm_stats(sq, dot, mean_sq, weights)

    def _stream(self, weights: torch.Tensor | None):
        """One pass: :class:`ClientSums` (unless already computed) and, with ``weights``, the
        clients' dots with the weighted mean update and its squared norm per layer."""
        m, L, f64 = self.clients, len(self.layers), torch.float64
        zeros = functools.partial(torch.zeros, dtype=f64, device=self.device)
        fresh = self._sums is None
        if fresh:
            has_w, has_e = self.params is not None, self.extra is not None
            s = ClientSums(zeros(m, L), *((zeros(m, L), zeros(L)) if has_w else (None, None)),
                           *((zeros(m, L), zeros(L), zeros(L) if has_w else None) if has_e else (None, None, None)))
        dot = zeros(m, L) if weights is not None else None
        mean_sq = zeros(L) if weights is not None else None
        # The vectors each client's update is dotted with, as the columns of one matrix product (one
        # read of the block for all of them, where a product per vector reads it once each); w and e
        # are in it on every pass that has them, so a client's dot with the mean update comes from
        # the same product, to the bit, whether or not the sums were computed before.
        for i, block, w, e in _columns(self.stacked, self.layers, self.params, self.extra, self.chunk):
            vectors = [v for v in (w, e) if v is not None]
            if weights is not None:
                mean = block.T @ weights  # [c]: the weighted mean update's columns
                vectors.append(mean)
                mean_sq[i] += mean @ mean
            if fresh:
                # ||dw_k||^2 as the square of a norm: a row reduction many times faster than the
                # row-wise dot products, equal to them within a few ulp.
                s.sq[:, i] += torch.linalg.vector_norm(block, dim=1).square()
            if not vectors:
                continue
            dots = block @ torch.stack(vectors).T  # [m, len(vectors)]: a column-major right factor, the faster product
            if fresh and w is not None:
                s.with_model[:, i] += dots[:, 0]
                s.model_sq[i] += w @ w
            if fresh and e is not None:
                j = int(w is not None)
                s.extra_dot[:, i] += dots[:, j]
                s.extra_sq[i] += e @ e
                if w is not None:
                    s.extra_model[i] += w @ e
            if weights is not None:
                dot[:, i] += dots[:, -1]
        if fresh:
            self._sums = s
        return self._sums.sq, dot, mean_sq

    def mean_direction(self, scales: torch.Tensor) -> torch.Tensor:
        """``[G, L]``: for each of G scalings ``scales[g]`` ``[m, L]`` of the learners, the squared
        norm per layer of ``sum_k scales[g, k, l] (w_l + dw_{k,l})`` (PD-Ls' mean direction: with
        ``scales = 1 / (m ||w + dw_k||)`` the mean of the learners' unit vectors)."""
        g_count = scales.shape[0]
        scales = scales.to(self.device, torch.float64)
        total = scales.sum(1)  # [G, L]: the coefficient of w
        out = torch.zeros(g_count, len(self.layers), dtype=torch.float64, device=self.device)
        for i, block, w, _ in _columns(self.stacked, self.layers, self.params, None, self.chunk):
            mean = scales[:, :, i] @ block  # [G, c]
            if w is not None:
                mean += total[:, i:i + 1] * w
            out[:, i] += (mean * mean).sum(1)
        return out

    def grams(self) -> LayerGrams:
        """The updates' :func:`layer_grams` (with the model and the extra update): m^2 d multiply-adds."""
        if self._grams is None:
            self._grams = layer_grams(self.stacked, self.layers, self.params, self.extra)
        return self._grams

    def client_updates(self) -> torch.Tensor:
        """``[L, m, m]``: the clients' block of :meth:`grams` (what Krum reads, as :meth:`LayerGrams.client_updates`)."""
        return self.grams().client_updates()


def _norm_stats(sq: torch.Tensor, dot: torch.Tensor, mean_sq: torch.Tensor, weights: torch.Tensor) -> NormStats:
    """:class:`NormStats` from the clients' squared norms and dots with the mean update ``[m, L]``
    and the mean update's squared norm per layer ``[L]``."""
    layer_N = mean_sq.clamp_min(0).sqrt()
    layer_E = weights @ sq.sqrt()
    client_norms = sq.sum(1).sqrt()
    return NormStats(N=float(layer_N.pow(2).sum().sqrt()), E=float(weights @ client_norms),
                     layer_N=layer_N, layer_E=layer_E, client_norms=client_norms, client_sq=sq, client_dot=dot)

