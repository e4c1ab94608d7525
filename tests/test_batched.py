"""The batched engine computes what the sequential engine computes, to float rounding.

Same config and seed: same batches per client (drawn from (seed, round, client) in both), same
optimizer arithmetic (fedrun.optim), so the updates agree up to the rounding of different
kernels (vmapped vs plain), which chaotic training can amplify: the tests take few steps at a
small learning rate and compare relative norms.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedrun import aggregators as A
from fedrun.batched import BatchedEngine, auto_engine
from fedrun.data import prepare, synthetic
from fedrun.engine import LocalTraining, SequentialEngine, split_state
from fedrun.errors import ConfigError
from fedrun.models import MLP, Cifar10CNN, MnistCNN, TFTutorialCNN
from fedrun.partition import iid
from fedrun.regularizers import LayerAdaptive, Proximal
from fedrun.simulation import Federation, simulate

RTOL = 2e-4  # relative norm of the difference of two engines' updates


def relative_difference(a: dict, b: dict) -> float:
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a) ** 0.5
    den = sum(float(a[k].double().pow(2).sum()) for k in a) ** 0.5
    return num / max(den, 1e-30)


def both_engines(model, local, regularizer=None, sizes=(13, 40, 7, 25), epochs=None, chunk=None, seed=0):
    """Train the same unbalanced clients with both engines; return both ClientResults."""
    torch.manual_seed(seed)
    shape = (model.conv1.in_channels if hasattr(model, "conv1") else
             model.conv11.in_channels if hasattr(model, "conv11") else 1)
    side = 32 if shape == 3 else 28
    n = sum(sizes)
    x, y = torch.randn(n, shape, side, side), torch.randint(0, 10, (n,))
    bounds = np.cumsum([0, *sizes])
    idx = [torch.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    params, buffers = split_state(model)
    clients = list(range(len(sizes)))
    seq = SequentialEngine(model, x, y, idx, local, regularizer, seed).train(params, buffers, clients, 3, epochs)
    bat = BatchedEngine(model, x, y, idx, local, regularizer, seed, chunk).train(params, buffers, clients, 3, epochs)
    return seq, bat


MODELS = {
    "mlp": lambda: MLP(hidden=[16]),
    "mnist_cnn": lambda: MnistCNN(),
    "fedlayerwise_cnn": lambda: MnistCNN(channels=(8, 16), hidden=32),
    "cifar10_cnn_bn": lambda: Cifar10CNN(),
    "tf_cnn": lambda: TFTutorialCNN(),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_family_matches(name):
    # BatchNorm over a few samples can be ill-conditioned (a channel with almost no variance
    # multiplies rounding by 1/sqrt(eps)); a fixed initialization keeps this test about the engine.
    torch.manual_seed(1)
    local = LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5)
    seq, bat = both_engines(MODELS[name](), local, sizes=(13, 20, 7))
    assert relative_difference(seq.deltas, bat.deltas) < RTOL
    assert seq.steps.tolist() == bat.steps.tolist() == [4, 6, 2]  # E * ceil(n_k / B)
    torch.testing.assert_close(seq.loss, bat.loss, rtol=1e-4, atol=1e-5)
    for k in seq.buffers:  # BatchNorm running statistics, per client
        torch.testing.assert_close(seq.buffers[k].double(), bat.buffers[k].double(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("local", [
    LocalTraining(epochs=2, batch_size=8, lr=0.01),
    LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-3),
    LocalTraining(epochs=1, batch_size=8, lr=1e-3, optimizer="adam"),
], ids=["sgd", "nesterov-wd", "adam"])
def test_optimizers_and_proximal_match(local):
    seq, bat = both_engines(MLP(hidden=[16]), local, Proximal(0.5))
    # Adam divides by sqrt(v): rounding in near-zero gradients shows more, hence a looser bound.
    assert relative_difference(seq.deltas, bat.deltas) < (2e-3 if local.optimizer == "adam" else RTOL)
    torch.testing.assert_close(seq.extras["reg_loss"], bat.extras["reg_loss"], rtol=1e-3, atol=1e-7)


def test_stragglers_and_chunks_match():
    torch.manual_seed(1)
    local = LocalTraining(epochs=3, batch_size=8, lr=0.01, momentum=0.5)
    seq, bat = both_engines(MnistCNN(channels=(4, 8), hidden=16), local, epochs=[3, 1, 2, 3], chunk=3)
    assert relative_difference(seq.deltas, bat.deltas) < RTOL
    assert bat.epochs.tolist() == [3, 1, 2, 3]
    assert seq.steps.tolist() == bat.steps.tolist() == [6, 5, 2, 12]  # epochs * ceil(n/8)


def test_chunking_gives_the_same_result():
    local = LocalTraining(epochs=1, batch_size=8, lr=0.05)
    _, whole = both_engines(MLP(hidden=[16]), local)
    _, chunked = both_engines(MLP(hidden=[16]), local, chunk=1)
    assert relative_difference(whole.deltas, chunked.deltas) < 1e-6


@pytest.mark.parametrize("q,form", [(0.5, "linear"), (0.5, "interpolate"), (1.0, "interpolate")])
def test_fedlap_matches(q, form):
    torch.manual_seed(1)
    local = LocalTraining(epochs=3, batch_size=8, lr=0.05, momentum=0.5)
    seq, bat = both_engines(MnistCNN(channels=(4, 8), hidden=16), local, LayerAdaptive(q, form), epochs=[3, 1, 2, 3])
    assert relative_difference(seq.deltas, bat.deltas) < RTOL
    torch.testing.assert_close(seq.extras["lambda_mean"], bat.extras["lambda_mean"], rtol=1e-4, atol=1e-8)
    torch.testing.assert_close(seq.extras["reg_loss"], bat.extras["reg_loss"], rtol=1e-4, atol=1e-9)
    assert torch.isfinite(bat.extras["lambda_mean"]).all()  # 1 - cos is clamped at 0: no NaN from lambda^(1-q)
    assert bat.extras["lambda_mean"][1] == 0  # one epoch only: lambda never computed past epoch 1


def test_unsupported_features_are_refused_and_auto_falls_back():
    x, y = torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,))
    with_dropout = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(784, 10))
    args = (with_dropout, x, y, [torch.arange(10)], LocalTraining(), None, 0)
    with pytest.raises(ConfigError, match="engine"):
        BatchedEngine(*args)
    assert isinstance(auto_engine(*args), SequentialEngine)  # dropout: sequential
    plain = (MLP(), x, y, [torch.arange(10)], LocalTraining(), None, 0)
    assert isinstance(auto_engine(*plain), SequentialEngine)  # CPU tensors: sequential


@pytest.mark.parametrize("aggregator", [A.fedavg(), A.fedprox(0.1), A.normnorm(1.0), A.momentum(0.9),
                                        A.fednnnn(0.7, 0.8), A.fedadp(), A.fedlayerwise(), A.fedlap(0.5)],
                         ids=lambda a: a.name)
def test_whole_runs_match_for_every_aggregator(aggregator, tmp_path):
    raw = synthetic(num_train=240, num_test=60, image_size=12, noise=0.5)
    data = prepare(raw, None, None)
    runs = {}
    for name, engine in (("seq", SequentialEngine), ("bat", BatchedEngine)):
        simulate(tmp_path / name, data, lambda: MLP(image_size=12, hidden=[16]), iid, aggregator,
                 LocalTraining(epochs=1, batch_size=10, lr=0.02), Federation(rounds=3, num_clients=6, client_fraction=0.5),
                 make_engine=engine, progress=False)
        runs[name] = pd.read_csv(tmp_path / name / "rounds.csv")
    for col in ("test_acc", "N", "E", "server_step", "train_loss"):
        np.testing.assert_allclose(runs["seq"][col], runs["bat"][col], rtol=1e-3, atol=2e-3, err_msg=col)


def test_batchnorm_engines_agree_exactly_in_float64():
    # In float32 a BatchNorm channel with almost no variance over a 4-sample batch can amplify
    # kernel rounding to ~1% (seen for some initializations); in float64 the two engines agree
    # to ~1e-14, which shows they compute the same function.
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(102)  # an initialization whose float32 difference is ~2%
        seq, bat = both_engines(Cifar10CNN(), LocalTraining(epochs=1, batch_size=8, lr=0.01), sizes=(13, 20))
    finally:
        torch.set_default_dtype(old)
    assert relative_difference(seq.deltas, bat.deltas) < 1e-10
