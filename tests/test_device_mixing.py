"""The server on a GPU, checked on the CPU: no op mixes the engines' CPU counts with GPU tensors.

The engines return the updates on the model's device and ``n_k``, steps, losses and learning
rates on the CPU (tests/fake_gpu.py says how a CPU run stands in for the GPU).  Every aggregator
then weighs, reduces and transforms the updates in two rounds (the second with the first's state,
as a run and a resumed run hand it on) without meeting a CPU tensor, returns its models where the
updates are, and computes what it computes on the CPU.
"""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import CONF_DIR, aggregate, compose
from fake_gpu import FAKE, DeviceMix, fake_gpu, is_on_gpu, on_gpu
from hydra.utils import instantiate

from fedrun.models.layers import Layer
from fedrun.params import weighted_mean

NAMES = sorted(p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml"))
LAYERS = [Layer("conv", "conv", ("conv.weight", "conv.bias")), Layer("fc", "fc", ("fc.weight",))]


@functools.cache
def build(name):
    return instantiate(compose([f"aggregator={name}"]).aggregator)


def round_inputs(m=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {"conv.weight": torch.randn(4, 3, generator=g), "conv.bias": torch.randn(4, generator=g),
              "fc.weight": torch.randn(2, 4, generator=g)}
    deltas = {k: 0.1 * torch.randn(m, *v.shape, generator=g) for k, v in params.items()}
    buffers = {"bn.running_mean": torch.randn(m, 4, generator=g),
               "bn.num_batches_tracked": torch.randint(0, 9, (m,), generator=g)}
    n = torch.randint(1, 50, (m,), generator=g)
    steps = torch.randint(1, 20, (m,), generator=g)
    return params, deltas, buffers, n, steps


def two_rounds(agg, params, deltas, buffers, n, steps):
    first = aggregate(agg, params, deltas, n, LAYERS, buffers=buffers, steps=steps, lr=0.1, num_clients=10)
    second = aggregate(agg, first.sent, {k: -0.5 * v for k, v in deltas.items()}, n, LAYERS, first.state,
                       clients=[2, 3, 4, 5, 6, 7, 8], buffers=buffers, steps=steps, lr=0.1)
    return first, second


def test_the_stand_in_refuses_what_cuda_refuses():
    with fake_gpu():
        x = on_gpu(torch.ones(3, 2))
        assert x.device == FAKE and is_on_gpu(x * 2)
        with pytest.raises(DeviceMix):
            torch.tensordot(torch.ones(3), x, dims=1)  # CPU weights, GPU updates: the bug CUDA found
        with pytest.raises(DeviceMix):
            x.numpy()
        assert is_on_gpu(torch.zeros(3, device=x.device))
        assert is_on_gpu(torch.ones(3).to(x.device)) and not is_on_gpu(x.cpu()) and is_on_gpu(x)
        assert is_on_gpu(x[torch.tensor([0, 2])])  # a CPU index is fine, as on CUDA
        assert is_on_gpu(x * torch.tensor(2.0))  # so is a 0-dim CPU tensor
        assert is_on_gpu(weighted_mean({"w": x}, torch.ones(3) / 3)["w"])


@pytest.mark.parametrize("name", NAMES)
def test_every_aggregator_keeps_to_the_updates_device(name):
    agg = build(name)
    params, deltas, buffers, n, steps = round_inputs()
    on_cpu = two_rounds(agg, params, deltas, buffers, n, steps)
    with fake_gpu():
        on_dev = two_rounds(agg, on_gpu(params), on_gpu(deltas), on_gpu(buffers), n, steps)
        for cpu, dev in zip(on_cpu, on_dev):
            for models in ("sent", "average", "buffers"):
                for k, v in getattr(dev, models).items():
                    assert is_on_gpu(v), (models, k)
                    assert torch.equal(v.cpu(), getattr(cpu, models)[k]), (models, k)
            assert torch.equal(dev.weights.cpu(), cpu.weights)


# Whole runs (the sequential engine; the batched one trains under torch.func, which the stand-in
# cannot follow): every round's steps on the stand-in GPU, the same CSVs as on the CPU.
RUNS = {
    "fednnnn": ["aggregator=fednnnn"],
    "scaffold_momentum": ["aggregator=scaffold", "hyperparams.momentum=0.5"],
    "fedlap_validation": ["aggregator=fedlap", "hyperparams=fedlap", "hyperparams.validation_fraction=0.2"],
    "fedlayerwise_stragglers": ["aggregator=fedlayerwise", "hyperparams.momentum=0.9", "hyperparams.optimizer_state=average",
                                "hyperparams.stragglers=0.5", "hyperparams.dropouts=0.3", "hyperparams.local_epochs=2"],
    "adam_average": ["aggregator=fedadp", "hyperparams.optimizer=adam", "hyperparams.lr=0.001",
                     "hyperparams.optimizer_state=average", "vanilla_every=1", "hyperparams.eval_every=2",
                     "hyperparams.rounds=3"],
    "pd_net_brn_adam_local": ["model=neta_baseline", "model.norm=brn", "dataset.channels=3", "dataset.image_size=32",
                              "dataset.load.num_train=200", "aggregator=normnorm", "hyperparams=pd_adam_wb",
                              "hyperparams.num_clients=4", "hyperparams.client_fraction=0.5", "hyperparams.rounds=2",
                              "hyperparams.augment=true", "vanilla_every=1", "snapshots=[1]"],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_whole_run_on_the_stand_in_gpu_equals_the_cpu(name, tmp_path, monkeypatch):
    import pandas as pd
    from conftest import TINY

    import fedrun.command.build as build

    overrides = RUNS[name]
    base = [o for o in TINY if not o.startswith("model")] if any(o.startswith("model=") for o in overrides) else TINY
    cfg = compose([*base, "engine=sequential", *overrides])
    build.run(cfg, tmp_path / "cpu", {}, [])
    monkeypatch.setattr(build, "resolve_device", lambda name: FAKE)
    with fake_gpu():
        build.run(cfg, tmp_path / "gpu", {}, [])
    for table in ("rounds", "clients", "layers", "client_layers"):
        cpu, gpu = (pd.read_csv(tmp_path / where / f"{table}.csv") for where in ("cpu", "gpu"))
        columns = [c for c in cpu.columns if not c.endswith("_s")]  # timings differ
        pd.testing.assert_frame_equal(gpu[columns], cpu[columns], check_exact=True)
