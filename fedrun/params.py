"""Models as data: named tensors, and the weighted means the server takes of stacked ones.

``Params`` is a model's trainable parameters (or its buffers, or an optimizer state) as a plain
``{name: tensor}`` dict: what the server aggregates, the transforms update and a checkpoint
stores.  Client results stack m of them along a leading dimension, ``[m, *shape]``.
"""
from __future__ import annotations

import torch
from torch import nn

Params = dict[str, torch.Tensor]


def split_state(model: nn.Module) -> tuple[Params, Params]:
    """Detached copies of the model's trainable parameters and of its buffers."""
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    return params, buffers


def weighted_mean(stacked: Params, weights: torch.Tensor) -> Params:
    """``sum_k p_k x_k`` for every stacked tensor ``x`` of shape ``[m, *shape]``."""
    return {name: torch.tensordot(weights.to(x.device, x.dtype), x, dims=1) for name, x in stacked.items()}


def weighted_mean_by_layer(stacked: Params, weights: torch.Tensor, layers) -> Params:
    """``sum_k p_{k,l} x_k`` with a weight row per layer: ``weights`` is ``[L, m]`` (FedLayerWise eq. 7)."""
    row = {p: i for i, layer in enumerate(layers) for p in layer.params}
    return {name: torch.tensordot(weights[row[name]].to(x.device, x.dtype), x, dims=1) for name, x in stacked.items()}
