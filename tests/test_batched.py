"""The batched engine computes what the sequential engine computes, to float rounding.

Same config and seed: same batches per client (drawn from (seed, round, client) in both), same
optimizer arithmetic (fedrun.client.optim), so the updates agree up to the rounding of different
kernels (vmapped vs plain), which chaotic training can amplify: the tests take few steps at a
small learning rate and compare relative norms.

Dropout is the exception: the engines draw masks from different streams, so with dropout they
agree in distribution (a paired test on the training loss), not bitwise.  Also here: bf16 and
TF32 precision, torch.compile, and the memory arithmetic of ``clients_per_step=auto``.
"""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY, on_partition, run_fedrun
from equivalence import F32_RTOL, assert_engines_agree, assert_whole_runs_agree, both_engines, relative_difference

from fedrun import aggregators as A
from fedrun.client import engines
from fedrun.client.batched import BatchedEngine, choose_chunk, client_bytes
from fedrun.client.engines import auto_engine
from fedrun.errors import ConfigError
from fedrun.client.local_training import LocalTraining
from fedrun.models.nets import MLP, Cifar10CNN, MnistCNN, TFTutorialCNN
from fedrun.params import split_state
from fedrun.paths import conf_options
from fedrun.models.pd_nets import PDNet
from fedrun.client.regularizers import LayerAdaptive, Proximal
from fedrun.client.sequential import SequentialEngine
from fedrun.harness.federated_run import Federation

WITH_BATCHNORM = {"cifar10_cnn_bn"}  # compared in float64 only (tests/equivalence.py says why)


MODELS = {
    "mlp": lambda: MLP(hidden=[16]),
    "mnist_cnn": lambda: MnistCNN(),
    "fedlayerwise_cnn": lambda: MnistCNN(channels=(8, 16), hidden=32),
    "cifar10_cnn_bn": lambda: Cifar10CNN(),
    "tf_cnn": lambda: TFTutorialCNN(),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_family_matches(name):
    torch.manual_seed(1)
    local = LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5)
    seq, bat = assert_engines_agree(MODELS[name](), local, float32=name not in WITH_BATCHNORM, sizes=(13, 20, 7))
    assert seq.steps.tolist() == bat.steps.tolist() == [4, 6, 2]  # E * ceil(n_k / B)
    torch.testing.assert_close(seq.loss, bat.loss, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("local", [
    LocalTraining(epochs=2, batch_size=8, lr=0.01),
    LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-3),
    LocalTraining(epochs=1, batch_size=8, lr=1e-3, optimizer="adam"),
], ids=["sgd", "nesterov-wd", "adam"])
def test_optimizers_and_proximal_match(local):
    # Adam divides by sqrt(v): float32 rounding in near-zero gradients shows more (measured
    # 1e-4 here), hence 10x the float32 bound; float64 agrees to 1e-10 as everywhere.
    seq, bat = assert_engines_agree(MLP(hidden=[16]), local, regularizer=Proximal(0.5),
                                    f32_rtol=10 * F32_RTOL if local.optimizer == "adam" else F32_RTOL)
    torch.testing.assert_close(seq.extras["reg_loss"], bat.extras["reg_loss"], rtol=1e-3, atol=1e-7)


def test_stragglers_and_chunks_match():
    torch.manual_seed(1)
    local = LocalTraining(epochs=3, batch_size=8, lr=0.01, momentum=0.5)
    seq, bat = assert_engines_agree(MnistCNN(channels=(4, 8), hidden=16), local, epochs=[3, 1, 2, 3], chunk=3)
    assert bat.epochs.tolist() == [3, 1, 2, 3]
    assert seq.steps.tolist() == bat.steps.tolist() == [6, 5, 2, 12]  # epochs * ceil(n/8)


def test_chunking_gives_the_same_result():
    local = LocalTraining(epochs=1, batch_size=8, lr=0.05)
    torch.manual_seed(0)  # the same initial model for both (engines reseed the global generator)
    _, whole = both_engines(MLP(hidden=[16]), local)
    torch.manual_seed(0)
    _, chunked = both_engines(MLP(hidden=[16]), local, chunk=1)
    assert relative_difference(whole.deltas, chunked.deltas) < 1e-6


@pytest.mark.parametrize("q,form,vectors", [(0.5, "linear", "fan_out"), (0.5, "interpolate", "fan_out"),
                                            (1.0, "interpolate", "fan_out"), (0.5, "linear", "fan_in")])
def test_fedlap_matches(q, form, vectors):
    torch.manual_seed(1)
    local = LocalTraining(epochs=3, batch_size=8, lr=0.05, momentum=0.5)
    seq, bat = assert_engines_agree(MnistCNN(channels=(4, 8), hidden=16), local,
                                    regularizer=LayerAdaptive(q, form, vectors),
                                    epochs=[3, 1, 2, 3])
    torch.testing.assert_close(seq.extras["lambda_mean"], bat.extras["lambda_mean"], rtol=1e-4, atol=1e-8)
    torch.testing.assert_close(seq.extras["reg_loss"], bat.extras["reg_loss"], rtol=1e-4, atol=1e-9)
    assert torch.isfinite(bat.extras["lambda_mean"]).all()  # 1 - cos is clamped at 0: no NaN from lambda^(1-q)
    assert bat.extras["lambda_mean"][1] == 0  # one epoch only: lambda never computed past epoch 1


def test_auto_engine_is_sequential_on_a_cpu_and_batched_runs_dropout():
    x, y = torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,))
    with_dropout = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(784, 10))
    BatchedEngine(with_dropout, x, y, LocalTraining(), None, 0)  # dropout: supported
    assert isinstance(auto_engine(MLP(), x, y, LocalTraining(), Proximal(0.1), 0), SequentialEngine)  # CPU tensors


# Every method of conf/aggregator (a new one is tested as soon as its YAML exists), with its factory's
# defaults; FedProx with a mu that moves one epoch's updates visibly (its default 0.01 hardly does).
SETTINGS = {"fedprox": dict(mu=0.1)}
# Krum keeps m > 2f + 2 clients a round: 6 of 10.
FEDERATIONS = {"krum": Federation(rounds=3, num_clients=10, client_fraction=0.6)}


@pytest.mark.parametrize("method", conf_options("aggregator"))
def test_whole_runs_match_for_every_aggregator(method, tmp_path):
    aggregator = getattr(A, method)(**SETTINGS.get(method, {}))
    assert_whole_runs_agree(tmp_path, aggregator, BatchedEngine, LocalTraining(epochs=1, batch_size=10, lr=0.02),
                            FEDERATIONS.get(method, Federation(rounds=3, num_clients=6, client_fraction=0.5)))


def test_batchnorm_engines_agree_exactly_in_float64():
    # An initialization whose float32 updates differ by ~2% between the engines on PyTorch 2.14
    # (a BatchNorm batch of 4 amplifying kernel rounding); in float64 they agree to ~1e-14.
    torch.manual_seed(102)
    assert_engines_agree(Cifar10CNN(), LocalTraining(epochs=1, batch_size=8, lr=0.01), float32=False, sizes=(13, 20))


# ----------------------------------------------------------------------------- dropout

def dropout_net(p: float, seed: int = 0) -> torch.nn.Module:
    """8x8 grey images -> 10 classes, dropout p on the input and on the hidden layer."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(p), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Dropout(p), torch.nn.Linear(32, 10))


def test_dropout_p0_matches_sequential():
    # The parameter-divergence nets' dropout modules (D11, D21, D31, DF1, DF2) at rate 0: exactly the
    # model without dropout, so the engines agree as everywhere else.
    torch.manual_seed(1)
    net = PDNet(3, 8, 10, m=1, dropout=True)
    drops = [mod for mod in net.modules() if isinstance(mod, torch.nn.Dropout)]
    assert len(drops) == 5
    for mod in drops:
        mod.p = 0.0
    assert_engines_agree(net, LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5),
                         sizes=(13, 20, 7), shape=(3, 8, 8))


def twin_clients(p: float, seed: int = 0, chunk=None):
    """Two clients holding the very same 10 samples (one batch each), trained by the batched engine."""
    torch.manual_seed(3)
    x, y = torch.randn(10, 1, 8, 8), torch.randint(0, 10, (10,))
    model = dropout_net(p)
    params, buffers = split_state(model)
    engine = on_partition(BatchedEngine, model, x, y, [torch.arange(10)] * 2, LocalTraining(epochs=2, batch_size=10, lr=0.1),
                           None, seed, chunk)
    return engine.train(params, buffers, [0, 1], 1).deltas


def test_dropout_is_reproducible_and_per_client():
    first, again = twin_clients(0.5), twin_clients(0.5)
    assert all(torch.equal(first[k], again[k]) for k in first)  # same seed: identical updates
    other = twin_clients(0.5, seed=1)
    assert relative_difference(first, other) > 0.05  # another seed: other masks
    chunked = twin_clients(0.5, chunk=1)
    assert relative_difference(first, chunked) > 0.05  # documented: chunking changes the draws
    # Identical data and start: without dropout the twins' updates agree to rounding (their
    # batch orders differ); with it each client's masks are its own.
    twins = lambda d: relative_difference({k: v[0] for k, v in d.items()}, {k: v[1] for k, v in d.items()})  # noqa: E731
    assert twins(twin_clients(0.0)) < 1e-5
    assert twins(first) > 0.05


def test_dropout_loss_agrees_in_distribution():
    # At a negligible learning rate a client's mean training loss is its data's loss under its
    # dropout masks.  Pairing clients (same data in both engines) leaves only the masks'
    # randomness: the mean paired difference must be within 4 standard errors of 0 (measured over
    # 60 seeds: mean difference 0.002 +- 0.003, |t| <= 3.6), while dropout's own effect (same
    # engine, p = 0.5 vs 0) is several standard errors (t = 5.9 here), so the test can see it.
    m, n = 48, 20
    torch.manual_seed(1)
    x, y = torch.randn(m * n, 1, 8, 8), torch.randint(0, 10, (m * n,))
    idx = [torch.arange(k * n, (k + 1) * n) for k in range(m)]
    local = LocalTraining(epochs=1, batch_size=10, lr=1e-4)
    losses = {}
    for p in (0.5, 0.0):
        model = dropout_net(p)
        params, buffers = split_state(model)
        for name, make in (("seq", SequentialEngine), ("bat", BatchedEngine)):
            losses[name, p] = on_partition(make, model, x, y, idx, local, None, 0).train(params, buffers, list(range(m)), 1).loss

    def t_stat(d):
        return float(d.mean() / (d.std() / m ** 0.5))

    assert abs(t_stat(losses["seq", 0.5] - losses["bat", 0.5])) < 4
    assert t_stat(losses["bat", 0.5] - losses["bat", 0.0]) > 4
    torch.testing.assert_close(losses["seq", 0.0], losses["bat", 0.0], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- precision, compile

def test_bf16_updates_are_close_to_fp32():
    # bf16 keeps 8 mantissa bits (relative rounding 2^-8 = 0.4%).  Measured relative difference of
    # the updates bf16 vs fp32 on this MLP for initializations 0-3, both engines alike: 8.1%,
    # 0.30%, 0.97%, 0.29%.  The outlier is a ReLU whose input is near 0 on some sample and flips
    # sign with the rounding (the same amplification as between engines), so the test bounds the
    # median (2%) and the worst (15%).  Both would fail by far if parameters or optimizer state
    # were bf16 (steps of ~1e-5 on weights of ~3e-2 vanish below bf16's resolution, 1.2e-4); the
    # floor checks that autocast ran.  The mean training losses agree to 0.1%.
    local = LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5)
    diffs = []
    for init in range(4):
        torch.manual_seed(init)
        fp32 = both_engines(MLP(hidden=[16]), local, sizes=(13, 20, 7))
        torch.manual_seed(init)
        bf16 = both_engines(MLP(hidden=[16]), local, sizes=(13, 20, 7), precision="bf16")
        for a, b in zip(fp32, bf16):
            diffs.append(relative_difference(a.deltas, b.deltas))
            assert all(v.dtype == torch.float32 for v in b.deltas.values())
            torch.testing.assert_close(a.loss, b.loss, rtol=2e-3, atol=0)
    assert min(diffs) > 1e-4 and np.median(diffs) < 0.02 and max(diffs) < 0.15, diffs


def test_tf32_is_fp32_on_cpu(caplog):
    local = LocalTraining(epochs=1, batch_size=8, lr=0.01)
    torch.manual_seed(0)
    with caplog.at_level("INFO"):
        tf32 = both_engines(MLP(hidden=[16]), local, sizes=(13, 7), precision="tf32")
    torch.manual_seed(0)
    fp32 = both_engines(MLP(hidden=[16]), local, sizes=(13, 7))
    for a, b in zip(fp32, tf32):
        assert all(torch.equal(a.deltas[k], b.deltas[k]) for k in a.deltas)
    assert "engine.precision=tf32 has no effect on cpu" in caplog.text


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="PyTorch < 2.9")
def test_tf32_switch_uses_the_new_api_and_restores_a_users_setting():
    # Reading the legacy allow_tf32 after a user set the new fp32_precision flag raises in
    # PyTorch >= 2.9 ("mix of the legacy and new APIs"); set_tf32 must not touch the legacy one.
    from fedrun.client.precision import set_tf32

    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    try:
        matmul.fp32_precision = "tf32"  # the user's choice, made with the new API
        restore = set_tf32(False)
        assert (matmul.fp32_precision, conv.fp32_precision) == ("ieee", "ieee")
        restore()
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", before[1])
        restore = set_tf32(True)
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")
        restore()
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def test_bad_engine_options_are_refused():
    """The engine group's options are checked when the config is built (before any run directory)."""
    with pytest.raises(ConfigError, match=r"^engine\.precision=fp16: choose one of: fp32, tf32, bf16$"):
        engines.check(functools.partial(BatchedEngine, precision="fp16"))
    with pytest.raises(ConfigError, match=r"^engine\.compile=yes"):
        engines.check(functools.partial(SequentialEngine, compile="yes"))
    with pytest.raises(ConfigError, match=r"^engine\.clients_per_step=0"):
        engines.check(functools.partial(auto_engine, clients_per_step=0))
    with pytest.raises(ConfigError, match=r"^engine=SequentialEngine: must be built with _partial_: true"):
        engines.check(SequentialEngine(MLP(), torch.zeros(1, 1, 28, 28), torch.zeros(1, dtype=torch.long),
                                       LocalTraining(), None, 0))


@pytest.mark.parametrize("make", [SequentialEngine, BatchedEngine])
def test_compile_failure_is_one_line(make, monkeypatch):
    from torch._inductor.exc import InductorError

    def broken(fn, *args, **kwargs):
        def call(*a, **k):
            raise InductorError(RuntimeError("Failed to find C++ compiler"), None)
        return call

    monkeypatch.setattr(torch, "compile", broken)
    x, y = torch.randn(10, 1, 4, 4), torch.randint(0, 10, (10,))
    engine = on_partition(make, MLP(image_size=4, hidden=[8]), x, y, [torch.arange(10)], LocalTraining(batch_size=5), None, 0,
                  compile=True)
    params, buffers = split_state(engine.model)
    with pytest.raises(ConfigError) as err:
        engine.train(params, buffers, [0], 1)
    line = str(err.value)
    assert line.startswith("engine.compile=true: torch.compile failed (InductorError")
    assert "C++ compiler" in line and line.endswith("run with engine.compile=false") and "\n" not in line


@pytest.mark.parametrize("make", [SequentialEngine, BatchedEngine])
def test_compiled_engine_matches_eager(make):
    # Compiling takes 3 s (sequential) and 9 s (batched) on this 2-core CPU, with gcc; skipped
    # where inductor has no C++ compiler (then the run fails with the one line tested above).
    import shutil

    if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        pytest.skip("no C++ compiler: torch.compile cannot build CPU kernels here")
    torch.manual_seed(0)
    x, y = torch.randn(40, 1, 4, 4), torch.randint(0, 10, (40,))
    idx = [torch.arange(0, 20), torch.arange(20, 40)]
    local = LocalTraining(epochs=1, batch_size=10, lr=0.05)
    runs = []
    for compile in (False, True):
        torch.manual_seed(0)
        model = MLP(image_size=4, hidden=[8])
        params, buffers = split_state(model)
        runs.append(on_partition(make, model, x, y, idx, local, None, 0, compile=compile).train(params, buffers, [0, 1], 1))
    assert relative_difference(runs[0].deltas, runs[1].deltas) < 1e-6  # measured 2.9e-8


def test_bf16_run_from_the_cli_and_bad_precision_is_one_line(tmp_path):
    ok = run_fedrun([*TINY, "engine=batched", "engine.precision=bf16", f"hydra.run.dir={tmp_path}/ok"], tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    rounds = pd.read_csv(tmp_path / "ok" / "rounds.csv")
    assert len(rounds) == 2 and rounds["test_acc"].notna().all()
    bad = run_fedrun([*TINY, "engine.precision=fp16", f"hydra.run.dir={tmp_path}/bad"], tmp_path)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines() == ["fedrun: error: engine.precision=fp16: choose one of: fp32, tf32, bf16"]
    assert not (tmp_path / "bad").exists()  # refused before the run directory is created


# ----------------------------------------------------------------------------- clients_per_step=auto

def test_choose_chunk_arithmetic():
    MiB, GiB = 2**20, 2**30
    assert choose_chunk(10 * GiB, 100 * MiB, 100, 0.5) == 51  # 5 GiB / 100 MiB = 51.2
    assert choose_chunk(10 * GiB, 100 * MiB, 20, 0.5) == 20  # all fit: never more than m
    assert choose_chunk(50 * MiB, 100 * MiB, 20, 0.5) == 1  # none fits: one at a time
    assert choose_chunk(10 * GiB, 0, 7, 0.5) == 7
    assert choose_chunk(80 * GiB, 24 * MiB, 100, 0.7) == 100  # MNIST CNN, B = 50, on an H100


def test_client_bytes_counts_parameters_state_and_activations():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 10))
    params, buffers = split_state(model)
    x = torch.randn(5, 1, 4, 4)
    p = 170 * 4  # 16 x 10 + 10 float32
    plain = client_bytes(model, params, buffers, x, LocalTraining())
    # 4 copies of the parameters, the batch, twice the forward's new tensors (the [5, 10] output;
    # flatten is a view)
    assert plain == 4 * p + x.numel() * 4 + 2 * 5 * 10 * 4
    assert client_bytes(model, params, buffers, x, LocalTraining(momentum=0.9)) == plain + p  # momentum buffer
    assert client_bytes(model, params, buffers, x, LocalTraining(optimizer="adam")) >= plain + 2 * p


def test_auto_chunk_from_free_memory_gives_the_same_updates(monkeypatch):
    torch.manual_seed(1)
    local = LocalTraining(epochs=1, batch_size=8, lr=0.05)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    idx = [torch.arange(16 * k, 16 * (k + 1)) for k in range(4)]
    model = MLP(hidden=[16])
    params, buffers = split_state(model)
    whole = on_partition(BatchedEngine, model, x, y, idx, local, None, 0, "auto")
    from fedrun.client.batched import CPU_CHUNK
    assert whole.chunk_size(params, buffers, 4) == min(4, CPU_CHUNK)  # CPU: the cache-friendly chunk
    assert whole.chunk_size(params, buffers, 100) == CPU_CHUNK
    per = client_bytes(model, params, buffers, x[:8], local)
    small = on_partition(BatchedEngine, model, x, y, idx, local, None, 0, "auto")
    monkeypatch.setattr(small.engine, "_free_bytes", lambda: 2.5 * per / 0.7)  # as if a GPU had room for 2.5
    assert small.chunk_size(params, buffers, 4) == 2
    assert small.chunk_size(params, buffers, 1) == 1  # a round with fewer clients
    a = whole.train(params, buffers, [0, 1, 2, 3], 1)
    b = small.train(params, buffers, [0, 1, 2, 3], 1)
    assert relative_difference(a.deltas, b.deltas) < 1e-6
