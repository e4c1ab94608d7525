"""m clients' BatchNorms as one BatchNorm over m*C channels (fedrun.client.vmap_batchnorm): the same
outputs, gradients and running statistics as each client's own F.batch_norm."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import on_partition
from torch.func import vmap

from fedrun.client import vmap_batchnorm
from fedrun.models.nets import MLP, Cifar10CNN
from fedrun.models.pd_nets import pdnet
from fedrun.client.vmap_batchnorm import FusedClientBatchNorm, uses_batch_norm

M, C = 3, 4


def per_client_reference(x, rm, rv, w, b, momentum=0.1, eps=1e-5):
    """Client k's own F.batch_norm, one after another; x is [m, B, C, ...]."""
    outs = [F.batch_norm(x[k], rm[k], rv[k], w[k], b[k], True, momentum, eps) for k in range(len(x))]
    return torch.stack(outs)


@pytest.mark.parametrize("shape", [(6, C), (6, C, 5, 5)], ids=["1d", "2d"])
@pytest.mark.parametrize("x_dim", [0, 1])
def test_fused_equals_each_clients_batchnorm(shape, x_dim):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(M, *shape, generator=gen) * 3 + 1
    w, b = torch.rand(M, C, generator=gen) + 0.5, torch.randn(M, C, generator=gen)
    stats = torch.randn(M, C, generator=gen), torch.rand(M, C, generator=gen) + 0.5

    ref_x, ref_w, ref_b = (t.clone().requires_grad_(True) for t in (x, w, b))
    ref_rm, ref_rv = (s.clone() for s in stats)
    ref = per_client_reference(ref_x, ref_rm, ref_rv, ref_w, ref_b)

    fx, fw, fb = (t.clone().requires_grad_(True) for t in (x, w, b))
    frm, frv = (s.clone() for s in stats)
    with FusedClientBatchNorm():
        batched = vmap(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=True),
                       in_dims=(x_dim, 0, 0, 0, 0))
        out = batched(fx.movedim(0, x_dim), frm, frv, fw, fb)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close((frm, frv), (ref_rm, ref_rv), rtol=1e-6, atol=1e-7)  # updated in place
    assert not torch.equal(frm, stats[0])

    up = torch.randn(ref.shape, generator=gen)
    grads = torch.autograd.grad((out * up).sum(), (fx, fw, fb))
    ref_grads = torch.autograd.grad((ref * up).sum(), (ref_x, ref_w, ref_b))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_running_statistics_with_the_client_dimension_elsewhere_are_written_back():
    # Stacked [C, m] buffers (client dimension 1): the flattened view is a copy, so the rule must
    # copy the update back into the caller's tensors.
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(M, 8, C, generator=gen)
    w, b = torch.ones(M, C), torch.zeros(M, C)
    rm, rv = torch.zeros(C, M), torch.ones(C, M)
    with FusedClientBatchNorm():
        vmap(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=True), in_dims=(0, 1, 1, 0, 0))(
            x, rm, rv, w, b)
    torch.testing.assert_close(rm.t(), 0.1 * x.mean(1))  # momentum 0.1 from 0
    torch.testing.assert_close(rv.t(), 0.9 + 0.1 * x.var(1, unbiased=True))


def test_other_calls_pass_through():
    x = torch.randn(8, C)
    rm, rv = torch.zeros(C), torch.ones(C)
    with FusedClientBatchNorm():  # not vmapped, and evaluation mode: plain F.batch_norm
        train = F.batch_norm(x, rm.clone(), rv.clone(), training=True)
        evaluation = F.batch_norm(x, rm, rv, training=False)
        relu = torch.relu(x)
    torch.testing.assert_close(train, F.batch_norm(x, rm.clone(), rv.clone(), training=True))
    torch.testing.assert_close(evaluation, x / (1 + 1e-5) ** 0.5)
    torch.testing.assert_close(relu, x.clamp_min(0))


def test_the_batched_engine_fuses_torch_batchnorm_only(monkeypatch):
    from fedrun.client.batched import BatchedEngine
    from fedrun.client.local_training import LocalTraining
    from fedrun.params import split_state

    assert uses_batch_norm(Cifar10CNN()) and not uses_batch_norm(MLP())
    assert not uses_batch_norm(pdnet("NetA-Baseline", norm="bn"))  # FederatedBatchNorm: elementwise ops
    calls = []
    rule = vmap_batchnorm.ClientBatchNorm.vmap
    monkeypatch.setattr(vmap_batchnorm.ClientBatchNorm, "vmap",
                        staticmethod(lambda *a: calls.append(1) or rule(*a)))
    torch.manual_seed(0)
    model = Cifar10CNN()
    x, y = torch.randn(20, 3, 32, 32), torch.randint(0, 10, (20,))
    params, buffers = split_state(model)
    engine = on_partition(BatchedEngine, model, x, y, [torch.arange(10), torch.arange(10, 20)],
                           LocalTraining(epochs=1, batch_size=5, lr=0.01), None, 0, None)
    engine.train(params, buffers, [0, 1], 1)
    assert len(calls) == 6 * 2  # 6 BatchNorm layers x 2 steps (10 samples, B = 5)
