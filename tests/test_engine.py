"""The sequential client engine (Nagura et al. Alg. 2) and evaluation."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import on_partition, tiny_mlp
from torch import nn

from fedrun.errors import ConfigError
from fedrun.diagnostics.evaluation import evaluate
from fedrun.client.local_training import LocalTraining
from fedrun.params import split_state
from fedrun.client.regularizers import Proximal
from fedrun.client.sequential import SequentialEngine

# Three clients of uneven sizes over the 60 training samples of ``tiny_data``.
SPLIT = [range(0, 10), range(10, 33), range(33, 60)]  # n_k = 10, 23, 27


def make_engine(data, local=None, regularizer=None, seed=0, model_seed=0):
    model = tiny_mlp(model_seed)
    indices = [torch.tensor(list(r)) for r in SPLIT]
    local = local or LocalTraining(epochs=2, batch_size=7, lr=0.1)
    return on_partition(SequentialEngine, model, data.train_x, data.train_y, indices, local, regularizer, seed), model


def test_train_shapes_examples_and_steps(tiny_data):
    engine, model = make_engine(tiny_data)
    params, buffers = split_state(model)
    res = engine.train(params, buffers, [0, 1, 2], round_=1)
    assert res.clients == [0, 1, 2]
    for name, p in params.items():
        assert res.deltas[name].shape == (3, *p.shape)
    assert res.num_examples.tolist() == [10, 23, 27]
    # steps = E * ceil(n_k / B) with E = 2, B = 7: 2*ceil(10/7) = 4, 2*ceil(23/7) = 8, 2*ceil(27/7) = 8
    assert res.steps.tolist() == [2 * math.ceil(n / 7) for n in (10, 23, 27)] == [4, 8, 8]
    assert res.loss.shape == (3,) and bool(torch.isfinite(res.loss).all())
    assert bool((res.loss > 0).all())
    # Every client moved; w_t itself is untouched by training.
    norms = torch.stack([torch.cat([res.deltas[k][j].flatten() for k in params]).norm() for j in range(3)])
    assert bool((norms > 0).all())
    assert all(torch.equal(params[k], v) for k, v in split_state(tiny_mlp(0))[0].items())


def test_steps_with_one_big_batch(tiny_data):
    local = LocalTraining(epochs=3, batch_size=100, lr=0.1)
    engine, model = make_engine(tiny_data, local)
    res = engine.train(*split_state(model), [0, 2], round_=1)
    assert res.steps.tolist() == [3, 3]  # ceil(n / 100) = 1 step per epoch


def test_single_step_is_one_sgd_step(tiny_data):
    """E = 1 and B >= n_k: the update is exactly -lr * grad of the mean loss over the client's data."""
    local = LocalTraining(epochs=1, batch_size=100, lr=0.3)
    engine, model = make_engine(tiny_data, local)
    params, buffers = split_state(model)
    res = engine.train(params, buffers, [0], round_=1)
    ref = tiny_mlp(0)
    idx = torch.arange(0, 10)
    loss = nn.functional.cross_entropy(ref(tiny_data.train_x[idx]), tiny_data.train_y[idx])
    loss.backward()
    for name, p in ref.named_parameters():
        assert torch.allclose(res.deltas[name][0], -0.3 * p.grad, atol=1e-6)
    assert res.loss[0].item() == pytest.approx(loss.item(), rel=1e-6)


def test_deterministic_and_order_independent(tiny_data):
    e1, m1 = make_engine(tiny_data)
    e2, m2 = make_engine(tiny_data)
    params, buffers = split_state(m1)
    a = e1.train(params, buffers, [0, 1, 2], round_=3)
    b = e2.train(params, buffers, [0, 1, 2], round_=3)
    assert all(torch.equal(a.deltas[k], b.deltas[k]) for k in params)
    assert torch.equal(a.loss, b.loss)
    # Client 2's batches derive from (seed, round, client): training it alone gives the same update.
    c = e2.train(params, buffers, [2], round_=3)
    assert all(torch.equal(a.deltas[k][2], c.deltas[k][0]) for k in params)


def test_round_and_seed_change_batches(tiny_data):
    engine, model = make_engine(tiny_data)
    params, buffers = split_state(model)
    r1 = engine.train(params, buffers, [1], round_=1)
    r2 = engine.train(params, buffers, [1], round_=2)
    assert not torch.equal(r1.deltas["fc1.weight"], r2.deltas["fc1.weight"])
    other_seed, _ = make_engine(tiny_data, seed=1)
    r1b = other_seed.train(params, buffers, [1], round_=1)
    assert not torch.equal(r1.deltas["fc1.weight"], r1b.deltas["fc1.weight"])
    # One full batch per epoch: the order no longer matters, so rounds agree up to float rounding.
    full = LocalTraining(epochs=1, batch_size=100, lr=0.1)
    e_full, _ = make_engine(tiny_data, full)
    f1 = e_full.train(params, buffers, [1], round_=1)
    f2 = e_full.train(params, buffers, [1], round_=2)
    assert torch.allclose(f1.deltas["fc1.weight"], f2.deltas["fc1.weight"], atol=1e-6)


def test_proximal_mu_zero_equals_no_regularizer(tiny_data):
    plain, model = make_engine(tiny_data)
    prox0, _ = make_engine(tiny_data, regularizer=Proximal(0.0))
    params, buffers = split_state(model)
    a = plain.train(params, buffers, [0, 1, 2], round_=1)
    b = prox0.train(params, buffers, [0, 1, 2], round_=1)
    assert all(torch.equal(a.deltas[k], b.deltas[k]) for k in params)
    assert torch.equal(a.loss, b.loss)


def test_large_mu_shrinks_updates(tiny_data):
    # lr * mu = 0.1 * 5 = 0.5 < 2: the proximal pull is stable and keeps w_k near w_t (eq. 7).
    plain, model = make_engine(tiny_data)
    prox, _ = make_engine(tiny_data, regularizer=Proximal(5.0))
    params, buffers = split_state(model)

    def norms(res):
        return torch.stack([torch.cat([res.deltas[k][j].flatten() for k in params]).norm()
                            for j in range(len(res.clients))])

    n_plain = norms(plain.train(params, buffers, [0, 1, 2], round_=1))
    n_prox = norms(prox.train(params, buffers, [0, 1, 2], round_=1))
    assert bool((n_prox < 0.8 * n_plain).all())


def test_proximal_penalty_value():
    # mu/2 * ||w - w_t||^2 = 0.5 * 4 * (1 + 4 + 9) = 28
    # Two clients stacked: [1, 2], [3] and zeros (penalty 0).
    reg = Proximal(4.0)
    stacked = {"a": torch.tensor([[1.0, 2.0], [0.0, 0.0]]), "b": torch.tensor([[3.0], [0.0]])}
    anchor = {"a": torch.zeros(2), "b": torch.zeros(1)}
    pen = reg.penalty(reg.init(anchor, 2), stacked, anchor, torch.arange(2))
    assert pen.tolist() == pytest.approx([28.0, 0.0])
    with pytest.raises(ConfigError, match="aggregator.mu"):
        Proximal(-1.0)


def test_momentum_and_weight_decay_change_training(tiny_data):
    engine, model = make_engine(tiny_data)
    params, buffers = split_state(model)
    base = engine.train(params, buffers, [1], round_=1)
    for local in (LocalTraining(epochs=2, batch_size=7, lr=0.1, momentum=0.9),
                  LocalTraining(epochs=2, batch_size=7, lr=0.1, momentum=0.9, nesterov=True),
                  LocalTraining(epochs=2, batch_size=7, lr=0.1, weight_decay=0.1)):
        other, _ = make_engine(tiny_data, local)
        res = other.train(params, buffers, [1], round_=1)
        assert not torch.equal(res.deltas["fc1.weight"], base.deltas["fc1.weight"])
        assert res.steps.tolist() == base.steps.tolist()


def test_batchnorm_buffers_are_returned(tiny_data):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 10))
    indices = [torch.tensor(list(r)) for r in SPLIT]
    engine = on_partition(SequentialEngine, model, tiny_data.train_x, tiny_data.train_y, indices,
                              LocalTraining(epochs=1, batch_size=7, lr=0.1), None, 0)
    params, buffers = split_state(model)
    res = engine.train(params, buffers, [0, 2], round_=1)
    # num_batches_tracked counts the client's steps: ceil(10/7) = 2 and ceil(27/7) = 4.
    assert res.buffers["2.num_batches_tracked"].tolist() == [2, 4]
    assert res.buffers["2.running_mean"].shape == (2, 6)
    assert not torch.equal(res.buffers["2.running_mean"][0], res.buffers["2.running_mean"][1])
    assert torch.equal(buffers["2.running_mean"], torch.zeros(6))  # the input buffers are untouched


@pytest.mark.parametrize("kwargs,setting", [
    ({"nesterov": True}, "hyperparams.nesterov"),
    ({"nesterov": True, "momentum": 0.0}, "hyperparams.nesterov"),
    ({"epochs": 0}, "hyperparams.local_epochs"),
    ({"batch_size": 0}, "hyperparams.batch_size"),
    ({"lr": 0.0}, "hyperparams.lr"),
    ({"momentum": 1.0}, "hyperparams.momentum"),
    ({"momentum": -0.1}, "hyperparams.momentum"),
    ({"weight_decay": -1e-4}, "hyperparams.weight_decay"),
])
def test_local_training_validation(kwargs, setting):
    with pytest.raises(ConfigError) as info:
        LocalTraining(**kwargs)
    assert info.value.setting == setting
    assert str(info.value).startswith(setting + "=")


def test_local_training_optimizer():
    opt = LocalTraining(lr=0.2, momentum=0.5, nesterov=True, weight_decay=1e-3).make_optimizer()
    assert (opt.lr, opt.momentum, opt.nesterov, opt.weight_decay) == (0.2, 0.5, True, 1e-3)
    adam = LocalTraining(lr=0.005, optimizer="adam", betas=(0.8, 0.99)).make_optimizer()
    assert (adam.lr, adam.beta1, adam.beta2) == (0.005, 0.8, 0.99)
    with pytest.raises(ConfigError, match="hyperparams.optimizer"):
        LocalTraining(optimizer="rmsprop")


# ----------------------------------------------------------------------------- evaluate

class Identity2(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x)


def test_evaluate_perfect_and_half():
    """A Linear(2, 2) loaded with W = I, b = 0 on x = 10 * onehot(y): logits [10, 0] or [0, 10].

    Accuracy 1; loss = log(1 + e^-10) = 4.5398899e-05 per sample.
    """
    model = Identity2()
    state = {"lin.weight": torch.eye(2), "lin.bias": torch.zeros(2)}
    y = torch.tensor([0, 1, 1, 0, 1])
    x = 10 * nn.functional.one_hot(y, 2).float()
    for batch_size in (2000, 2):  # one batch, and several with a short last one
        acc, loss = evaluate(model, state, x, y, batch_size=batch_size)
        assert acc == 1.0
        assert loss == pytest.approx(math.log1p(math.exp(-10)), rel=1e-3)  # float32 log-softmax
    # Labels of the first two flipped: 3 of 5 right; the two wrong cost log(1 + e^10) = 10.0000454 each.
    y_bad = torch.tensor([1, 0, 1, 0, 1])
    acc, loss = evaluate(model, state, x, y_bad, batch_size=2)
    assert acc == pytest.approx(0.6)
    assert loss == pytest.approx((2 * math.log1p(math.exp(10)) + 3 * math.log1p(math.exp(-10))) / 5, rel=1e-5)
    assert not model.training  # evaluation mode


def test_every_engine_keeps_the_engine_protocol(tiny_data):
    """A run calls only what fedrun.client.protocol.Engine lists, on every engine alike (no probing):
    the in-process engines have nothing to fit, share, start or close, and leave evaluation to the run."""
    from fedrun.client.batched import BatchedEngine
    from fedrun.client.parallel import ParallelEngine
    from fedrun.client.protocol import Engine, InProcessEngine

    local = LocalTraining(epochs=1, batch_size=7, lr=0.1)
    args = (tiny_mlp(0), tiny_data.train_x, tiny_data.train_y, local, None, 0)
    for engine in (SequentialEngine(*args), BatchedEngine(*args)):
        assert isinstance(engine, Engine) and isinstance(engine, InProcessEngine)
        assert engine.fit(10) is None and engine.share(tiny_data.test_x, tiny_data.test_y) is None
        assert engine.start() is None and engine.close() is None and engine.evaluate is None
        assert engine.summary == type(engine).__name__
    parallel = ParallelEngine(*args, workers=2)
    assert isinstance(parallel, Engine) and not isinstance(parallel, InProcessEngine)
    assert callable(parallel.evaluate) and parallel.summary.startswith("ParallelEngine, ")
    assert parallel.fit(1).startswith("engine.workers=2: more than can run at once; 1 worker process(es)")
    parallel.close()

    class TrainsOnly:  # an engine that skips the lifecycle is not one
        def train(self, *args, **kwargs): ...

    assert not isinstance(TrainsOnly(), Engine)


def test_every_engine_requires_the_rounds_lr(tiny_data):
    """``lr`` is a required argument of ``engine.train`` (and of a lock-step ``Share``): a call
    without it, or with None, is a TypeError before any training, never a round at ``local.lr``;
    the rate given is the one trained with and reported."""
    from fedrun.client.batched import BatchedEngine, Share
    from fedrun.client.parallel import ParallelEngine

    local = LocalTraining(epochs=1, batch_size=7, lr=0.1)
    args = (tiny_mlp(0), tiny_data.train_x, tiny_data.train_y, local, None, 0)
    params, buffers = split_state(tiny_mlp(0))
    indices = [torch.arange(0, 10), torch.arange(10, 33)]
    parallel = ParallelEngine(*args, workers=2)
    try:
        for engine in (SequentialEngine(*args), BatchedEngine(*args), parallel):
            with pytest.raises(TypeError, match="lr"):
                engine.train(params, buffers, [0, 1], indices, 1)
            with pytest.raises(TypeError, match="lr"):
                engine.train(params, buffers, [0, 1], indices, 1, None)
            with pytest.raises(TypeError, match="lr must be this round's learning rate"):
                engine.train(params, buffers, [0, 1], indices, 1, None, None)
        assert parallel._pool is None  # refused in the run's process, no worker started
        batched = BatchedEngine(*args)
        with pytest.raises(TypeError, match="lr"):
            Share(batched, params, buffers, [0, 1], indices, 1, None)
        with pytest.raises(TypeError, match="lr must be this round's learning rate"):
            Share(batched, params, buffers, [0, 1], indices, 1, None, None)
        # The round's rate, not local.lr: after a schedule's drop the updates are smaller.
        for engine in (SequentialEngine(*args), BatchedEngine(*args)):
            dropped = engine.train(params, buffers, [0, 1], indices, 1, None, 0.01)
            full = engine.train(params, buffers, [0, 1], indices, 1, None, local.lr)
            assert dropped.lr.tolist() == [0.01, 0.01] and full.lr.tolist() == [0.1, 0.1]
            assert not torch.equal(dropped.deltas["fc1.weight"], full.deltas["fc1.weight"])
    finally:
        parallel.close()
