"""A regularizer knows the model's layers and their kinds (conv, fc, norm), as the engines do:
the run hands them over before training (``Regularizer.for_layers``)."""
from __future__ import annotations

from conftest import TINY, compose
from torch import nn

from fedrun.command.build import federated_run
from fedrun.models.layers import layers
from fedrun.client.regularizers import Proximal


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(8, 3)


def test_for_layers_gives_each_parameter_its_layers_kind():
    reg = Proximal(0.1)
    bound = reg.for_layers(layers(SmallCNN()))
    assert [(layer.name, layer.type) for layer in bound.layers] == [("conv", "conv"), ("bn", "norm"), ("fc", "fc")]
    assert {p: bound.kind(p) for p in ("conv.weight", "conv.bias", "bn.weight", "fc.bias")} == \
        {"conv.weight": "conv", "conv.bias": "conv", "bn.weight": "norm", "fc.bias": "fc"}
    assert bound.kind("nowhere") == "other"
    # A copy: the aggregator's regularizer is untouched and keeps its settings.
    assert reg.layers == () and reg.kind("conv.weight") == "other" and bound.mu == reg.mu == 0.1


def test_a_runs_regularizer_knows_its_models_layers(tmp_path):
    run = federated_run(compose([*TINY, "aggregator=fedprox"]), tmp_path / "r", {}, [])
    reg = run.engine.regularizer
    assert reg is not None and [layer.name for layer in reg.layers] == [layer.name for layer in run.layers]
    for name, _ in run.model.named_parameters():
        owner = next(layer for layer in run.layers if name in layer.params)
        assert reg.kind(name) == owner.type == "fc"  # TINY's MLP: dense layers only
