"""Loss surfaces around a model: ``L(a, b) = loss(theta + a d1 + b d2)`` on a grid of (a, b).

This is the visualization of Li, Xu, Taylor, Studer and Goldstein, "Visualizing the loss landscape
of neural nets" (NeurIPS 2018), as used by the parameter-divergence paper (its Figure 4 and
Figures 31-32, footnote 9: "Based on Li et al. (2018), the visualization of loss surface was
conducted by L(alpha, beta) = l(theta* + alpha delta + beta gamma), where theta* is a center point
of the model parameters, and delta and gamma is the orthogonal direction vectors").

Li et al.'s *filter normalization* (their sec. 4) makes surfaces of different networks, and of one
network at different weight scales, comparable: a Gaussian random direction ``d`` is rescaled
filter by filter so that every filter ``d_i`` has the norm of the corresponding filter
``theta_i`` of the model, ``d_i <- d_i / ||d_i|| * ||theta_i||``.  A *filter* is one output
channel of a convolution's weight (``weight[i]``) or, for a fully connected layer, one output
neuron's row of the weight matrix.  As in their code, 1-D parameters (biases, the scale and shift
of normalization layers) get a zero direction: the surface moves only the weights.

Buffers (BatchNorm's running statistics) stay those of the centre point, and the loss is measured
in eval mode with :func:`fedrun.diagnostics.evaluation.evaluate`, i.e. the network the server would test.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import nn

from fedrun.diagnostics.evaluation import evaluate

Params = dict[str, torch.Tensor]

__all__ = ["filter_normalized_direction", "orthogonalize", "inner", "loss_surface", "sharpness"]


def filter_normalized_direction(params: Params, generator: torch.Generator | None = None,
                                zero_1d: bool = True) -> Params:
    """A Gaussian random direction, filter-normalized to ``params`` (Li et al. 2018, sec. 4).

    Args:
      params: the centre point theta, ``{name: tensor}`` (trainable parameters only).
      generator: a CPU ``torch.Generator``: the same seed gives the same direction.  The
        direction is drawn on the CPU (so it does not depend on the device) and moved to each
        parameter's device and dtype.
      zero_1d: give 1-D tensors (biases, normalization scales and shifts) a zero direction, as Li et
        al. do; False normalizes them as one filter each.

    Returns:
      ``{name: d}`` with ``d.shape == params[name].shape``; for a tensor of 2 or more dimensions
      every slice ``d[i]`` has the norm of ``params[name][i]`` (a zero filter of the model gets a
      zero direction).
    """
    out = {}
    for name, p in params.items():
        if p.dim() <= 1 and zero_1d:
            out[name] = torch.zeros_like(p)
            continue
        d = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        ref = p.detach().to("cpu", torch.float64)
        if p.dim() <= 1:
            d = d * (ref.norm() / d.norm().clamp_min(1e-12))
        else:
            d_norms = d.flatten(1).norm(dim=1).clamp_min(1e-12)
            p_norms = ref.flatten(1).norm(dim=1)
            d = d * (p_norms / d_norms).view(-1, *([1] * (p.dim() - 1)))
        out[name] = d.to(p.device, p.dtype)
    return out


def inner(a: Params, b: Params) -> float:
    """The inner product of two directions, over all their entries (float64)."""
    return float(sum((a[k].double() * b[k].double()).sum() for k in a))


def orthogonalize(d1: Params, d2: Params, keep_norm: bool = True) -> Params:
    """``d2`` made orthogonal to ``d1`` (one Gram-Schmidt step over the whole flattened model).

    The paper's footnote 9 asks for orthogonal directions; two filter-normalized random directions
    of a network with many parameters are already nearly orthogonal (Li et al. rely on that), and
    this removes what is left.  With ``keep_norm`` the result is rescaled to ``d2``'s total norm so
    the surface keeps its scale; its filter norms then differ from the model's by about the
    (small) cosine between ``d1`` and ``d2``.  Entries where both are zero (biases) stay zero.
    """
    denom = inner(d1, d1)
    coef = inner(d1, d2) / denom if denom > 0 else 0.0
    out = {k: d2[k] - coef * d1[k] for k in d2}
    if keep_norm:
        before, after = math.sqrt(inner(d2, d2)), math.sqrt(inner(out, out))
        if after > 0:
            out = {k: v * (before / after) for k, v in out.items()}
    return out


def _ce_loss(x: torch.Tensor, y: torch.Tensor, batch_size: int):
    def loss(model: nn.Module, state: Params) -> tuple[float, float]:
        acc, value = evaluate(model, state, x, y, batch_size)
        return value, acc
    return loss


@torch.no_grad()
def loss_surface(model: nn.Module, params: Params, buffers: Params, x: torch.Tensor | None,
                 y: torch.Tensor | None, d1: Params, d2: Params, alphas: Iterable[float],
                 betas: Iterable[float], batch_size: int = 1000,
                 loss_fn: Callable[[nn.Module, Params], float | tuple[float, float]] | None = None,
                 return_accuracy: bool = False):
    """``L[i, j] = loss(theta + alphas[i] d1 + betas[j] d2)`` (Li et al. 2018; the paper's footnote 9).

    Args:
      model: the architecture; its state is overwritten for every grid point (load afterwards
        what you need).
      params, buffers: the centre point theta (trainable parameters) and the buffers kept fixed.
      x, y: the examples the loss is averaged over (e.g. a subset of the training set).
      d1, d2: the two directions (:func:`filter_normalized_direction`, :func:`orthogonalize`).
      alphas, betas: the grid coordinates along ``d1`` (rows) and ``d2`` (columns).
      batch_size: evaluation batch size.
      loss_fn: ``loss_fn(model, state) -> loss`` (or ``(loss, accuracy)``) in place of the mean
        cross-entropy of :func:`fedrun.diagnostics.evaluation.evaluate` on ``(x, y)`` in eval mode.
      return_accuracy: also return the accuracy grid (NaN when ``loss_fn`` gives none).

    Returns:
      a float64 tensor ``[len(alphas), len(betas)]`` (and the accuracy grid with ``return_accuracy``).
    """
    alphas, betas = [float(a) for a in alphas], [float(b) for b in betas]
    fn = loss_fn or _ce_loss(x, y, batch_size)
    losses = torch.empty(len(alphas), len(betas), dtype=torch.float64)
    accs = torch.full_like(losses, float("nan"))
    for i, a in enumerate(alphas):
        for j, b in enumerate(betas):
            state = {k: v + a * d1[k] + b * d2[k] for k, v in params.items()}
            value = fn(model, {**state, **buffers})
            if isinstance(value, tuple):
                losses[i, j], accs[i, j] = value[0], value[1]
            else:
                losses[i, j] = value
    return (losses, accs) if return_accuracy else losses


def sharpness(losses: torch.Tensor, alphas: Iterable[float], betas: Iterable[float],
              radius: float | None = None) -> dict:
    """Summary numbers of a surface around its centre ``(0, 0)`` (which must be a grid point).

    ``centre``: L(0, 0); ``min`` and ``argmin`` (a, b) over the grid; ``keskar``: the sharpness of
    Keskar et al. (2017) restricted to the plane, ``100 (max_{a^2+b^2 <= r^2} L(a, b) - L(0, 0)) /
    (1 + L(0, 0))`` with ``r = radius`` (default: half the grid's extent); ``curvature``: the mean
    of the second differences at the centre along the two directions,
    ``(L(h, 0) - 2 L(0, 0) + L(-h, 0)) / h^2`` (and the same along b), where the grid has the
    neighbours.  Larger values mean a sharper minimum.
    """
    a = torch.tensor([float(v) for v in alphas], dtype=torch.float64)
    b = torch.tensor([float(v) for v in betas], dtype=torch.float64)
    i0, j0 = int(a.abs().argmin()), int(b.abs().argmin())
    tol = 1e-6 * max(float(a.abs().max()), float(b.abs().max()), 1e-12)  # float32 grids: -6e-8
    if abs(float(a[i0])) > tol or abs(float(b[j0])) > tol:
        raise ValueError("the grid must contain the centre (0, 0)")
    centre = float(losses[i0, j0])
    if radius is None:
        radius = 0.5 * min(float(a.abs().max()), float(b.abs().max()))
    dist = (a.view(-1, 1) ** 2 + b.view(1, -1) ** 2).sqrt()
    inside = losses[dist <= radius + 1e-12]
    finite = torch.nan_to_num(losses, nan=float("inf"))
    k = int(finite.argmin())
    curv = []
    for axis, (coords, idx) in enumerate(((a, i0), (b, j0))):
        if 0 < idx < len(coords) - 1:
            h1, h2 = float(coords[idx] - coords[idx - 1]), float(coords[idx + 1] - coords[idx])
            lo = losses[idx - 1, j0] if axis == 0 else losses[i0, idx - 1]
            hi = losses[idx + 1, j0] if axis == 0 else losses[i0, idx + 1]
            # Second divided difference on a possibly uneven grid.
            curv.append(2 * (float(hi) / (h2 * (h1 + h2)) - centre / (h1 * h2) + float(lo) / (h1 * (h1 + h2))))
    return {
        "centre": centre,
        "min": float(losses.flatten()[k]),
        "argmin": (float(a[k // len(b)]), float(b[k % len(b)])),
        "keskar": 100.0 * (float(inside.max()) - centre) / (1.0 + centre),
        "radius": float(radius),
        "curvature": sum(curv) / len(curv) if curv else float("nan"),
    }
