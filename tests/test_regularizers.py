"""A regularizer knows the model's layers and their kinds (conv, fc, norm), as the engines do:
the run hands them over before training (``Regularizer.for_layers``); where it writes its
penalty's gradient out (``Regularizer.closed_form``), the engines train to the same bits as with
autograd's gradient of the penalty."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from bench_regularizers import autograd_only as _autograd_only  # scripts/bench, on the tests' path
from conftest import TINY, compose, on_partition
from torch import nn

from fedrun.client.batched import BatchedEngine, Share, train_shares
from fedrun.client.local_training import LocalTraining
from fedrun.client.regularizers import ControlVariate, LayerAdaptive, Proximal
from fedrun.client.sequential import SequentialEngine
from fedrun.command.build import federated_run
from fedrun.models.layers import layers
from fedrun.models.nets import SimpleCNN
from fedrun.params import split_state


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


# ----------------------------------------------------------------------------- closed-form gradients

CLOSED = [Proximal(0.1), LayerAdaptive(0.5, form="interpolate"), LayerAdaptive(1.0, vectors="fan_in"),
          ControlVariate("gradient"), ControlVariate("after_step")]


def _train(engine, reg, model, x, y, idx, inputs, sizes):
    local = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-5)
    make = SequentialEngine if engine == "sequential" else BatchedEngine
    model = copy.deepcopy(model)  # the sequential engine trains the model's own parameters
    params, buffers = (({k: v.detach().clone() for k, v in part.items()}) for part in split_state(model))
    clients = list(range(len(sizes)))
    return on_partition(make, model, x, y, idx, local, reg, 0).train(params, buffers, clients, 3, inputs=inputs)


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize("reg", CLOSED, ids=["fedprox", "fedlap_interpolate", "fedlap_fan_in", "scaffold",
                                             "scaffold_after_step"])
def test_a_closed_form_gradient_is_autograds_bit_for_bit(engine, reg):
    """FedProx's ``mu (w - w_t)``, FedLap's ``c (w - w_g)`` and SCAFFOLD's ``c - c_k``, added to the
    loss's gradient, give the updates, losses and penalties that autograd's gradient of the
    penalty gives, to the last bit: every client's weights after two epochs of momentum SGD, on
    unbalanced clients (the batched engine's partial groups: the gradient added to a slice)."""
    torch.manual_seed(0)
    model = SimpleCNN()
    sizes = (13, 40, 7, 25)
    x, y = torch.randn(sum(sizes), 1, 28, 28), torch.randint(0, 10, (sum(sizes),))
    bounds = np.cumsum([0, *sizes])
    idx = [torch.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    inputs = ({k: 0.1 * torch.randn(len(sizes), *v.shape) for k, v in model.named_parameters()}
              if isinstance(reg, ControlVariate) else None)
    closed = _train(engine, reg, model, x, y, idx, inputs, sizes)
    auto = _train(engine, _autograd_only(reg), model, x, y, idx, inputs, sizes)
    moved = max(float(d.abs().max()) for d in closed.deltas.values())
    assert moved > 1e-3  # the clients trained
    for k in closed.deltas:
        assert torch.equal(closed.deltas[k], auto.deltas[k]), k
    assert torch.equal(closed.loss, auto.loss)
    assert closed.extras.keys() == auto.extras.keys() and "reg_loss" in closed.extras
    for k in closed.extras:
        assert torch.equal(closed.extras[k], auto.extras[k]), k
    if not isinstance(reg, ControlVariate) or reg.correction == "gradient":
        assert float(closed.extras["reg_loss"].abs().max()) > 0  # a penalty that acts


def test_a_population_of_regularized_runs_adds_each_runs_gradient_to_its_own_rows():
    """Two FedProx runs (mu 0.1 and 0.5) around a FedAvg run, trained as one population (one
    chunk, so each run's penalty gradient goes to a slice of the rows): the same bits as the same
    population with autograd's gradients of the penalties."""
    torch.manual_seed(1)
    model = SimpleCNN()
    sizes = (13, 40, 7)
    x, y = torch.randn(sum(sizes), 1, 28, 28), torch.randint(0, 10, (sum(sizes),))
    bounds = np.cumsum([0, *sizes])
    idx = [torch.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    local = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9)
    params, buffers = split_state(model)
    regs = (Proximal(0.1), None, Proximal(0.5))

    def population(wrap):
        engines = [BatchedEngine(model, x, y, local, None if r is None else wrap(r), 0, clients_per_step=None)
                   for r in regs]
        return train_shares([Share(e, params, buffers, [0, 1, 2], idx, 3, None, local.lr) for e in engines])

    closed, auto = population(lambda r: r), population(_autograd_only)
    for c, a in zip(closed, auto):
        for k in c.deltas:
            assert torch.equal(c.deltas[k], a.deltas[k]), k
        assert torch.equal(c.extras.get("reg_loss", c.loss), a.extras.get("reg_loss", a.loss))
    assert not torch.equal(closed[0].deltas["fc3.weight"], closed[2].deltas["fc3.weight"])  # each its own mu
