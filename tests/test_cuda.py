"""The engines on a GPU: the same numbers as on the CPU, chunking from real free memory, precision.

Skipped where there is no CUDA (CI never has one); ``scripts/bench/gpu_check.sh draw`` runs them on a
GPU machine (its first step), with ``FEDRUN_TEST_CAPTURE=on`` (the batched engine's
``engine.capture`` in every test here; default ``auto``, which also captures on CUDA).  The CPU suite proves the engines equal; these prove that nothing CUDA-specific
(cuDNN kernels, TF32 defaults, ``mem_get_info``, device-side generators, autocast to bf16)
breaks that.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY, on_partition, run_fedrun
from equivalence import relative_difference

from fedrun.client.batched import MAX_CHUNK, MEMORY_SAFETY, BatchedEngine, choose_chunk, client_bytes
from fedrun.client.engines import auto_engine
from fedrun.client.local_training import LocalTraining
from fedrun.models.nets import MLP, Cifar10CNN, MnistCNN
from fedrun.params import split_state
from fedrun.models.pd_nets import pdnet
from fedrun.client.sequential import SequentialEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
RTOL = 2e-4  # as in test_batched: relative norm of the difference of two updates
CAPTURE = os.environ.get("FEDRUN_TEST_CAPTURE", "auto")


def train(make_model, device, engine, sizes=(13, 40, 7, 25), shape=(1, 28, 28), local=None, chunk="auto",
          precision="fp32", init=1, capture=CAPTURE, regularizer=None, rounds=1, keep=None):
    """One round of unbalanced clients on ``device``; the same data, model and batches everywhere."""
    torch.manual_seed(init)
    model = make_model()
    n = sum(sizes)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, *shape, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    bounds = np.cumsum([0, *sizes])
    idx = [torch.arange(bounds[i], bounds[i + 1], device=device) for i in range(len(sizes))]
    model = model.to(device)
    params, buffers = split_state(model)
    local = local or LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5)
    options = dict(precision=precision)
    if engine is BatchedEngine:
        options.update(clients_per_step=chunk, capture=capture)
    eng = on_partition(engine, model, x.to(device), y.to(device), idx, local, regularizer, 0, **options)
    if keep is not None:
        keep.append(eng.engine)
    for r in range(rounds):  # later rounds replay what the first captured, from other global models
        out = eng.train(params, buffers, list(range(len(sizes))), 3 + r)
        params = {k: v + out.deltas[k].mean(0) for k, v in params.items()}
    return out


# name -> (model, input shape, dtype).  BatchNorm over a few samples can amplify kernel rounding
# by 1/sqrt(eps) (a channel with almost no variance in a small last batch; see test_batched), so
# the BN families are compared in float64, where equal computations agree to ~1e-14.
FAMILIES = {
    "mlp": (lambda: MLP(hidden=[16]), (1, 28, 28), torch.float32),
    "mnist_cnn": (lambda: MnistCNN(), (1, 28, 28), torch.float32),
    "cifar10_cnn_bn": (lambda: Cifar10CNN(), (3, 32, 32), torch.float64),
    "neta_bn": (lambda: pdnet("NetA-Baseline", norm="bn"), (3, 32, 32), torch.float64),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_engines_agree_on_cuda_and_with_the_cpu(name):
    make, shape, dtype = FAMILIES[name]
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        cpu = train(make, torch.device("cpu"), SequentialEngine, shape=shape)
        seq = train(make, CUDA, SequentialEngine, shape=shape)
        bat = train(make, CUDA, BatchedEngine, shape=shape)
    finally:
        torch.set_default_dtype(old)
    tol = RTOL if dtype == torch.float32 else 1e-9
    assert relative_difference(seq.deltas, bat.deltas) < tol
    # CPU vs GPU kernels: different summation orders, the same rounding-level agreement
    # (fp32 turns cuDNN's default TF32 off during local training).  The BN families (float64)
    # amplify the kernels' rounding through BatchNorm's small batches (the comment above FAMILIES):
    # on an NVIDIA H200 (torch 2.11.0+cu130, 2026-11-27) the CPU and CUDA updates differed by
    # 4.6e-8 (cifar10_cnn_bn) and 6.9e-8 (neta_bn), while the two engines on CUDA agreed below 1e-9.
    assert relative_difference(cpu.deltas, seq.deltas) < (10 * tol if dtype == torch.float32 else 1e-6)
    assert seq.steps.tolist() == bat.steps.tolist() == cpu.steps.tolist()


def test_auto_chunk_uses_real_free_memory_and_changes_nothing():
    make, shape, _ = FAMILIES["mnist_cnn"]
    torch.manual_seed(1)
    model = make().to(CUDA)
    params, buffers = split_state(model)
    x = torch.randn(8, *shape, device=CUDA)
    clients = [torch.arange(8, device=CUDA)] * 5000  # more clients than fit, so memory decides
    local = LocalTraining(batch_size=8)
    engine = BatchedEngine(model, x, torch.zeros(8, dtype=torch.long, device=CUDA), local, None, 0, "auto")
    free = engine._free_bytes()
    per = client_bytes(model, params, buffers, x, local)
    expected = min(len(clients), choose_chunk(free, per, MAX_CHUNK, MEMORY_SAFETY))
    assert 1 <= engine.chunk_size(params, buffers, len(clients)) == expected
    whole = train(make, CUDA, BatchedEngine, shape=shape, chunk="auto")
    chunked = train(make, CUDA, BatchedEngine, shape=shape, chunk=2)
    assert relative_difference(whole.deltas, chunked.deltas) < 1e-5


# Bounds on the relative difference of a round's updates from FP32.  bf16 rounds to 2^-8; the
# updates, sums of gradients that partly cancel, amplify that.  Measured on CPU (bf16 autocast,
# same helper): MNIST CNN 3.6% / 2.7% (sequential / batched), the BN CNN 21% / 12%.  TF32
# (2^-11) on an NVIDIA H200 (2026-11-27): the BN CNN's batched engine 11.2%, its sequential one
# under 10%: BatchNorm's amplification of rounding, not the format's 2^-11, sets the difference,
# so its bound is bf16's order.  Parameters kept in bf16 would make small updates vanish
# (difference ~100%), which every bound catches.
BOUNDS = {("mnist_cnn", "tf32"): 0.02, ("mnist_cnn", "bf16"): 0.15,
          ("cifar10_cnn_bn", "tf32"): 0.3, ("cifar10_cnn_bn", "bf16"): 0.5}


@pytest.mark.parametrize("family,precision", list(BOUNDS))
def test_lower_precision_stays_close_to_fp32(family, precision):
    # cifar10_cnn_bn: under CUDA autocast the convolutions return bf16, so the batched engine's
    # fused BatchNorm (fedrun.client.vmap_batchnorm) sees bf16 inputs with FP32 parameters.
    make, shape, _ = FAMILIES[family]
    bound = BOUNDS[family, precision]
    for engine in (SequentialEngine, BatchedEngine):
        # full batches only: BatchNorm over a 1-sample last batch would amplify any rounding
        fp32 = train(make, CUDA, engine, sizes=(16, 24, 8), shape=shape)
        low = train(make, CUDA, engine, sizes=(16, 24, 8), shape=shape, precision=precision)
        assert all(v.dtype == torch.float32 for v in low.deltas.values())  # parameters stay fp32
        assert relative_difference(fp32.deltas, low.deltas) < bound, engine.__name__


def test_auto_engine_is_batched_on_cuda():
    x = torch.randn(10, 1, 28, 28, device=CUDA)
    engine = auto_engine(MLP(), x, torch.zeros(10, dtype=torch.long, device=CUDA), LocalTraining(), None, 0)
    assert isinstance(engine, BatchedEngine)


def test_whole_run_on_cuda_matches_the_cpu(tmp_path, repo_root):
    runs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        done = run_fedrun(TINY + [f"device={device}", f"hydra.run.dir={out}", "aggregator=fednnnn"], cwd=repo_root)
        assert done.returncode == 0, done.stderr
        runs[device] = pd.read_csv(out / "rounds.csv")
    for col in ("test_acc", "N", "E", "train_loss"):
        np.testing.assert_allclose(runs["cpu"][col], runs["cuda"][col], rtol=1e-3, atol=2e-3, err_msg=col)


def test_population_on_cuda_equals_runs_alone(tmp_path):
    """A population on the GPU (auto chunk from free memory, stacked evaluation): each run's
    CSVs are those of the run alone on the batched engine on the GPU."""
    from test_population import BASE, MEMBERS, population_equals_alone

    assert "device=cpu" in BASE  # overridden per member
    members = [MEMBERS[k] + ["device=cuda"] for k in ("fedavg", "fednnnn", "fedprox_stragglers", "fedlap")]
    population_equals_alone(tmp_path, members, rtol=1e-4)


# ----------------------------------------------------------------------------- captured lock-steps

@pytest.mark.parametrize("name", list(FAMILIES))
def test_captured_steps_equal_eager_ones(name):
    # Three rounds: the first warms each step shape up and captures it, the later ones replay the
    # graphs from other global models through the same workspace.
    make, shape, dtype = FAMILIES[name]
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    kept = []
    try:
        eager = train(make, CUDA, BatchedEngine, shape=shape, capture="off", rounds=3)
        captured = train(make, CUDA, BatchedEngine, shape=shape, capture="on", rounds=3, keep=kept)
    finally:
        torch.set_default_dtype(old)
    tol = RTOL if dtype == torch.float32 else 1e-9
    assert relative_difference(eager.deltas, captured.deltas) < tol
    if captured.buffers:
        assert relative_difference(eager.buffers, captured.buffers) < tol
    torch.testing.assert_close(eager.loss, captured.loss, rtol=1e-4, atol=1e-6)
    graphs = next(iter(kept[0]._workspaces._kept.values())).graphs
    assert graphs.failed is None and graphs.captures > 0 and graphs.replays > graphs.captures


@pytest.mark.parametrize("regularizer,local", [
    ("fedprox", LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("fedlap", LocalTraining(epochs=3, batch_size=8, lr=0.05, momentum=0.5)),
    ("scaffold", LocalTraining(epochs=2, batch_size=8, lr=0.05)),
    ("adam", LocalTraining(epochs=2, batch_size=8, lr=1e-3, optimizer="adam")),
])
def test_captured_steps_with_regularizers_and_adam(regularizer, local):
    from fedrun.client.regularizers import ControlVariate, LayerAdaptive, Proximal

    make = {"fedprox": lambda: Proximal(0.5), "fedlap": lambda: LayerAdaptive(0.5), "scaffold": lambda: ControlVariate("after_step"),
            "adam": lambda: None}[regularizer]
    runs = [train(FAMILIES["mnist_cnn"][0], CUDA, BatchedEngine, local=local, capture=c, regularizer=make(), rounds=2)
            for c in ("off", "on")]
    assert relative_difference(runs[0].deltas, runs[1].deltas) < (10 if regularizer == "adam" else 1) * RTOL
    for name in runs[0].extras:
        torch.testing.assert_close(runs[0].extras[name], runs[1].extras[name], rtol=1e-3, atol=1e-6)


def test_a_captured_run_from_the_cli_matches_an_eager_one(tmp_path, repo_root):
    runs = {}
    for capture in ("on", "off"):
        out = tmp_path / capture
        done = run_fedrun(TINY + ["device=cuda", "engine=batched", f"engine.capture={capture}", f"hydra.run.dir={out}",
                                  "aggregator=fednnnn", "hyperparams.rounds=3"], cwd=repo_root)
        assert done.returncode == 0, done.stderr
        runs[capture] = pd.read_csv(out / "rounds.csv")
    for col in ("test_acc", "N", "E", "train_loss"):
        np.testing.assert_allclose(runs["on"][col], runs["off"][col], rtol=1e-3, atol=2e-3, err_msg=col)
