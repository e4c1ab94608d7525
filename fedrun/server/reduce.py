"""Reduces: how the server turns the round's stacked client updates into one mean update.

A reduce is the aggregator's slot between the weighting rule and the server transforms::

    weights = rule.update(...)                       # [m], or [L, m] for a per-layer rule
    mean_update = reduce(deltas, weights, layers)    # deltas: {name: [m, *shape]}
    step = server.update(mean_update, ...)           # w_{t+1} = w_t + step; "average" = w_t + mean_update

It is a pure function ``(stacked, weights, layers) -> Params``.  ``weights`` is the rule's: one
weight per client ``[m]``, or one row per layer ``[L, m]`` (FedLayerWise), in which case every
parameter takes the row of the layer that owns it (:func:`rows`).

* :func:`mean`, the default: ``sum_k p_k dw_k`` (FedAvg, Nagura et al. eq. 3), per layer with
  ``[L, m]`` weights (FedLayerWise, Lanjewar et al. eq. 7);
* :func:`median`: the coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, ICML 2018,
  "Byzantine-robust distributed learning: towards optimal statistical rates", Definition 1);
* :func:`trimmed_mean`: the coordinate-wise beta-trimmed mean (Yin et al., Definition 2).

Weights and the robust reduces.  Yin et al.'s median and trimmed mean are unweighted: every client
counts once, whatever its ``n_k``.  That is the default (``weighted=False``): the reduce ignores
the weights, and the median and trimmed-mean aggregators then report ``1/m`` as every client's
weight (:func:`fedrun.server.weighting.equal_rule`).  ``weighted=True`` uses the rule's weights instead:
the weighted median and the weighted trimmed mean below, which are the paper's at uniform weights
(the trimmed mean where ``beta m`` is a whole number).  Either way N, E and the BatchNorm
statistics keep the base weights, as for every method.  N is the norm of the base-weighted mean,
not of the reduce's output: a server transform that reads N (Norm-Norm's ``beta E / N``) after a
robust reduce scales the robust update by the mean's N.

The robust reduces sort each coordinate's m values; they work ``CHUNK // m`` coordinates at a time
so the sort's working memory stays bounded whatever the layer's size.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from fedrun.errors import check
from fedrun.models.layers import Layer
from fedrun.params import Params, weighted_mean, weighted_mean_by_layer

Reduce = Callable[[Params, torch.Tensor, list[Layer]], Params]

# Values (clients x coordinates) the robust reduces sort at a time: 2**22, so a block's sorted values,
# indices and cumulative weights take ~100-200 MiB whatever the layer's size (as nwda.GRAM_CHUNK).
CHUNK = 2**22


def rows(stacked: Params, weights: torch.Tensor, layers: list[Layer]) -> dict[str, torch.Tensor]:
    """Each parameter's ``[m]`` weights: ``weights`` itself (``[m]``), or the row of the layer that
    owns the parameter (``[L, m]``, one row per layer of ``layers``)."""
    if weights.ndim == 1:
        return {name: weights for name in stacked}
    row = {p: i for i, layer in enumerate(layers) for p in layer.params}
    return {name: weights[row[name]] for name in stacked}


def mean(stacked: Params, weights: torch.Tensor, layers: list[Layer]) -> Params:
    """The weighted mean update, the default reduce.

    ``[m]`` weights: ``sum_k p_k dw_k`` (FedAvg, Nagura et al. eq. 3).
    ``[L, m]`` weights: ``sum_k p_{k,l} dw_{k,l}`` for each layer l (FedLayerWise, Lanjewar et al. eq. 7).
    """
    return weighted_mean(stacked, weights) if weights.ndim == 1 else weighted_mean_by_layer(stacked, weights, layers)


def _columnwise(fn: Callable[..., torch.Tensor], x: torch.Tensor, *args) -> torch.Tensor:
    """``fn(block, *args)`` over blocks of the coordinates of ``x`` ``[m, *shape]`` (each block
    ``[m, c]``), the result ``[*shape]``: a coordinate-wise reduce with bounded working memory."""
    m = x.shape[0]
    flat = x.reshape(m, -1)
    width = max(CHUNK // max(m, 1), 1)
    out = [fn(flat[:, start:start + width], *args) for start in range(0, flat.shape[1], width)]
    return torch.cat(out).reshape(x.shape[1:]) if out else x.new_zeros(x.shape[1:])


# ----------------------------------------------------------------------------- median

def _median(x: torch.Tensor) -> torch.Tensor:
    """Yin et al. Definition 1 on each column of ``x`` ``[m, c]``: the middle value for odd m, the
    mean of the two middle ones for even m."""
    m = x.shape[0]
    upper = x.kthvalue(m // 2 + 1, dim=0).values  # k is 1-based
    if m % 2:
        return upper
    return (x.kthvalue(m // 2, dim=0).values + upper) / 2


def _weighted_median(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The weighted median of each column of ``x`` ``[m, c]`` with client weights ``w`` ``[m]``: the
    midpoint of the lower weighted median (the smallest value whose cumulative weight from below
    reaches half the total) and the upper one (the largest value whose cumulative weight from above
    does).  Both are computed the same way from either end, so with equal weights they are the two
    middle values exactly (rounding cannot break the symmetry) and this is Definition 1."""
    values, order = x.sort(dim=0)
    sorted_w = w[order]  # [m, c]: each column's weights in its values' order
    below, above = sorted_w.cumsum(0), sorted_w.flip(0).cumsum(0).flip(0)
    total = below[-1:]
    lower = (2 * below < total).sum(0, keepdim=True)  # first index with 2 * cum >= total
    upper = (2 * above >= total).sum(0, keepdim=True) - 1  # last index with 2 * cum-from-above >= total
    return ((values.gather(0, lower) + values.gather(0, upper)) / 2).squeeze(0)


def median(weighted: bool = False) -> Reduce:
    """The coordinate-wise median (Yin et al. 2018, Definition 1): for every coordinate j,

        g_j = med{ dw_{1,j}, ..., dw_{m,j} }

    the middle value (the mean of the two middle values for even m).  ``weighted=True``: the
    weighted median with the rule's weights (:func:`_weighted_median`), Definition 1 at equal weights.
    """

    def reduce(stacked: Params, weights: torch.Tensor, layers: list[Layer]) -> Params:
        if not weighted:
            return {name: _columnwise(_median, x) for name, x in stacked.items()}
        w = rows(stacked, weights, layers)
        return {name: _columnwise(_weighted_median, x, w[name].to(x.device, x.dtype)) for name, x in stacked.items()}

    return reduce


# ----------------------------------------------------------------------------- trimmed mean

def trimmed_count(beta: float, m: int) -> int:
    """How many values the unweighted trimmed mean drops at each end: ``floor(beta m)`` (Definition 2
    takes ``beta m`` to be a whole number; rounding down trims no more than asked, as
    ``scipy.stats.trim_mean`` does).  ``beta < 1/2`` keeps at least one value."""
    # + 1e-9: a product that should be whole may round just below it (0.29 * 100 = 28.999999999999996).
    return math.floor(beta * m + 1e-9)


def _trimmed_mean(x: torch.Tensor, beta: float) -> torch.Tensor:
    """Yin et al. Definition 2 on each column of ``x`` ``[m, c]``: the mean of the ``m - 2k`` values
    left after dropping the ``k = floor(beta m)`` largest and the ``k`` smallest (``m - 2k`` is the
    definition's ``(1 - 2 beta) m`` when ``beta m`` is whole)."""
    k = trimmed_count(beta, x.shape[0])
    if k == 0:
        return x.mean(0)
    return x.sort(dim=0).values[k: x.shape[0] - k].mean(0)


def _weighted_trimmed_mean(x: torch.Tensor, w: torch.Tensor, beta: float) -> torch.Tensor:
    """The weighted trimmed mean of each column of ``x`` ``[m, c]``: the values sorted, client k
    holds the slice ``[c_{k-1}, c_k]`` of the cumulative weight (normalized to 1); the part of each
    slice inside ``[beta, 1 - beta]`` is its weight in the mean, divided by ``1 - 2 beta``.  With
    equal weights and ``beta m`` whole this drops ``beta m`` values at each end: Definition 2."""
    values, order = x.sort(dim=0)
    sorted_w = w[order] / w.sum()
    upto = sorted_w.cumsum(0)
    kept = upto.clamp(beta, 1 - beta) - (upto - sorted_w).clamp(beta, 1 - beta)
    return (kept * values).sum(0) / (1 - 2 * beta)


def trimmed_mean(beta: float, weighted: bool = False) -> Reduce:
    """The coordinate-wise beta-trimmed mean (Yin et al. 2018, Definition 2): for every coordinate j,

        g_j = 1 / ((1 - 2 beta) m) * sum_{x in U_j} x

    with ``U_j`` the values ``dw_{1,j}, ..., dw_{m,j}`` less the largest and the smallest beta
    fraction (``floor(beta m)`` each, :func:`trimmed_count`).  ``beta = 0`` is the plain mean.
    ``weighted=True``: the weighted trimmed mean with the rule's weights (:func:`_weighted_trimmed_mean`).

    Args:
      beta: the trim fraction at each end, in [0, 0.5).
      weighted: use the rule's weights (default: every client counts once, as in the paper).
    """
    check(0 <= beta < 0.5, "aggregator.beta", beta, "must be in [0, 0.5) (the fraction trimmed at each end)")

    def reduce(stacked: Params, weights: torch.Tensor, layers: list[Layer]) -> Params:
        if not weighted:
            return {name: _columnwise(_trimmed_mean, x, beta) for name, x in stacked.items()}
        w = rows(stacked, weights, layers)
        return {name: _columnwise(_weighted_trimmed_mean, x, w[name].to(x.device, x.dtype), beta)
                for name, x in stacked.items()}

    return reduce
