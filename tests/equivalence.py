"""The engine-equivalence check shared by the engine tests: same clients through both engines.

Two engines that compute the same function agree to float rounding, but training is chaotic: a
ReLU or max-pool winner that flips on a last-bit difference, or a BatchNorm statistic over a few
samples, can amplify float32 rounding to percents, and whether that happens for a given seed
depends on PyTorch's kernels, which change between releases (PyTorch 2.15 turned one fixed
initialization of the BatchNorm CNN from 1e-6 into 1e-3).  So equivalence is proven where
rounding cannot be amplified into a false alarm:

1. float64, every model family: the same model and data, cast to float64, through both engines.
   Rounding is then ~1e-16 per operation and the updates, losses and BatchNorm statistics agree
   to ``F64_RTOL`` (measured 2e-16 to 6e-14 over 5 initializations x 8 families, PyTorch 2.14
   and 2.15): the engines compute the same function.  A wrong gradient, a missed step or two
   clients mixed up gives ~1.
2. float32, the well-conditioned families (no statistics over the batch): the path users run.
   ``F32_RTOL`` is 100x the largest difference measured between the engines' float32 updates
   (2e-6: MNIST and TF CNNs, 5 initializations, PyTorch 2.14 and 2.15; MLP 2e-7).  With
   BatchNorm the same measurement ranged from 3e-6 to 3e-2 (a flip on 2 of 5 initializations,
   different ones on different releases), so BatchNorm families are compared in float64 only.
"""
from __future__ import annotations

import contextlib
import dataclasses
import copy

import numpy as np
import pandas as pd
import torch
from conftest import on_partition

from fedrun.client.batched import BatchedEngine
from fedrun.params import split_state
from fedrun.client.sequential import SequentialEngine

F64_RTOL = 1e-10
F32_RTOL = 2e-4


def relative_difference(a: dict, b: dict) -> float:
    """``|a - b| / |a|`` over all tensors of two parameter dicts, in float64 on the CPU."""
    num = sum(float((a[k].double().cpu() - b[k].double().cpu()).pow(2).sum()) for k in a) ** 0.5
    den = sum(float(a[k].double().cpu().pow(2).sum()) for k in a) ** 0.5
    return num / max(den, 1e-30)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def input_shape(model) -> tuple[int, int, int]:
    """One input's (channels, side, side) for fedrun.models.nets' networks."""
    channels = (model.conv1.in_channels if hasattr(model, "conv1") else
                model.conv11.in_channels if hasattr(model, "conv11") else 1)
    return (channels, *(2 * [32 if channels == 3 else 28]))


def both_engines(model, local, regularizer=None, sizes=(13, 40, 7, 25), epochs=None, chunk=None, seed=0,
                 shape=None, dtype=torch.float32, batched=BatchedEngine, **options):
    """Train the same unbalanced clients with both engines; return both ClientResults.

    The data is drawn in float32 from ``seed`` and cast, with a copy of ``model``, to ``dtype``,
    so a float64 run starts from exactly the float32 run's model and data.  ``shape``: one
    input's (channels, side, side), inferred for fedrun.models.nets' CNNs; ``batched``: the batched
    engine's class (or a partial of it with options of its own, e.g. ``capture="on"``); ``options``:
    both engines' precision / compile."""
    torch.manual_seed(seed)
    shape = shape or input_shape(model)
    n = sum(sizes)
    x, y = torch.randn(n, *shape).to(dtype), torch.randint(0, 10, (n,))
    model = copy.deepcopy(model).to(dtype)
    bounds = np.cumsum([0, *sizes])
    idx = [torch.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    clients = list(range(len(sizes)))
    with default_dtype(dtype):  # tensors the engines create (optimizer state) follow the model
        params, buffers = split_state(model)
        seq = on_partition(SequentialEngine, model, x, y, idx, local, regularizer, seed, **options).train(
            params, buffers, clients, 3, epochs)
        bat = on_partition(batched, model, x, y, idx, local, regularizer, seed, chunk, **options).train(
            params, buffers, clients, 3, epochs)
    return seq, bat


def assert_engines_agree(model, local, float32: bool = True, f32_rtol: float = F32_RTOL, **kwargs):
    """Both engines on the same clients: equal in float64 and (``float32``) in float32.

    Returns the last compared results (sequential, batched): float32, or float64 without it."""
    seq, bat = both_engines(model, local, dtype=torch.float64, **kwargs)
    exact = relative_difference(seq.deltas, bat.deltas)
    assert exact < F64_RTOL, f"float64 updates differ by {exact:.2e}: the engines compute different functions"
    if seq.buffers:  # BatchNorm running statistics, per client
        assert relative_difference(seq.buffers, bat.buffers) < F64_RTOL
    # The engines take the loss of logits cast to float32 (bf16 autocast's rule): float32 rounding.
    torch.testing.assert_close(seq.loss, bat.loss, rtol=1e-6, atol=1e-7)
    assert seq.steps.tolist() == bat.steps.tolist() and seq.epochs.tolist() == bat.epochs.tolist()
    for name in seq.extras:  # regularizer values (FedProx, FedLap)
        torch.testing.assert_close(seq.extras[name], bat.extras[name], rtol=1e-9, atol=1e-12)
    if not float32:
        return seq, bat
    seq, bat = both_engines(model, local, **kwargs)
    diff = relative_difference(seq.deltas, bat.deltas)
    assert diff < f32_rtol, f"float32 updates differ by {diff:.2e}"
    return seq, bat


class BNMLP(torch.nn.Module):
    """A one-hidden-layer MLP with BatchNorm on 12 x 12 images: a model every personalized method runs on."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = torch.nn.Linear(144, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x.flatten(1)))))


def assert_whole_runs_agree(tmp_path, aggregator, engine, local, federation) -> None:
    """Three-round runs of ``aggregator`` on a small synthetic MLP task, on the sequential engine
    and on ``engine``: their rounds.csv agree to float rounding in accuracy, N, E, server step and
    training loss."""
    from fedrun.data.datasets import synthetic
    from fedrun.data.partition import iid
    from fedrun.data.preparation import prepare
    from fedrun.harness.simulation import simulate
    from fedrun.models.nets import MLP

    data = prepare(synthetic(num_train=240, num_test=60, image_size=12, noise=0.5), None, None)
    make_model, columns = (lambda: MLP(image_size=12, hidden=[16])), ["test_acc", "N", "E", "server_step", "train_loss"]
    if aggregator.personal is not None:  # FedBN, FedPer, Ditto: BatchNorm to keep, each client's test data to score
        make_model, columns = BNMLP, columns + ["pers_acc_mean"]
        federation = dataclasses.replace(federation, client_test_fraction=0.25, client_eval_every=1)
    runs = {}
    for name, make in (("seq", SequentialEngine), ("other", engine)):
        simulate(tmp_path / name, data, make_model, iid, aggregator, local, federation, make_engine=make,
                 progress=False)
        runs[name] = pd.read_csv(tmp_path / name / "rounds.csv")
    for col in columns:
        np.testing.assert_allclose(runs["seq"][col], runs["other"][col], rtol=1e-3, atol=2e-3, err_msg=col)
