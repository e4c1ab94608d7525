"""The layers the papers analyse: a model's parameters grouped by the module that owns them.

N and E (:mod:`fedrun.diagnostics.nwda`), parameter divergence (:mod:`fedrun.diagnostics.divergence`), FedLayerWise's
per-layer weights and ``layers.csv`` all work per layer; the FedNNNN figures sum them per layer
type ("of fully connected layer", "of convolutional layer").  Works for any ``nn.Module``.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fedrun.models.batchnorm import FederatedBatchNorm

_TYPES = (
    (nn.modules.conv._ConvNd, "conv"),
    (nn.Linear, "fc"),
    ((nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, FederatedBatchNorm), "norm"),
)


@dataclass(frozen=True)
class Layer:
    """A module that owns parameters: its name (``conv1``, ``features.0``), type and parameters."""

    name: str
    type: str  # conv | fc | norm | other
    params: tuple[str, ...]  # full parameter names, e.g. ("conv1.weight", "conv1.bias")


def layers(model: nn.Module) -> list[Layer]:
    """The model's layers in definition order, each with its type and parameter names.

    The FedNNNN figures plot N and E "of fully connected layer" and "of convolutional layer"
    separately; the per-layer norms of :mod:`fedrun.diagnostics.nwda` are summed by these types.
    """
    out = []
    for name, module in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
        if not own:
            continue
        kind = next((t for cls, t in _TYPES if isinstance(module, cls)), "other")
        out.append(Layer(name or "model", kind, tuple(own)))
    return out


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
