"""fedrun.client.optim reproduces torch.optim's SGD and Adam, on single and on stacked tensors."""
import pytest
import torch

from fedrun.client.optim import SGD, Adam


def step_both(mine, make_reference, shapes, steps: int):
    """The same random gradients through ``mine`` and a torch.optim optimizer made by
    ``make_reference(params)``: (our weights, our state, their weights, their optimizer)."""
    torch.manual_seed(0)
    ours = [torch.randn(*shape) for shape in shapes]
    theirs = [p.clone().requires_grad_() for p in ours]
    opt = make_reference(theirs)
    state = mine.init(ours)
    for _ in range(steps):
        grads = [torch.randn_like(p) for p in ours]
        mine.step(ours, grads, state)
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        opt.step()
    return ours, state, theirs, opt


@pytest.mark.parametrize("mine,reference", [
    (SGD(0.1), dict(cls=torch.optim.SGD, lr=0.1)),
    (SGD(0.1, momentum=0.9), dict(cls=torch.optim.SGD, lr=0.1, momentum=0.9)),
    (SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
     dict(cls=torch.optim.SGD, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (Adam(0.01), dict(cls=torch.optim.Adam, lr=0.01)),
    (Adam(0.005, 0.8, 0.99, 1e-6, 0.001),
     dict(cls=torch.optim.Adam, lr=0.005, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.001)),
])
def test_matches_torch_optim(mine, reference):
    kwargs = dict(reference)
    cls = kwargs.pop("cls")
    ours, _state, theirs, _opt = step_both(mine, lambda params: cls(params, **kwargs), [(5, 3), (4,)], 6)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-5), (0.0, 0.01)])
def test_sgd_on_all_tensors_at_once_is_the_per_tensor_step_bit_for_bit(momentum, wd):
    """SGD.step with a float learning rate steps every tensor at once (torch._foreach_*: fewer GPU
    kernels); on a CPU it must be exactly torch.optim.SGD's per-tensor step (foreach=False), so
    CPU runs keep their CSVs to the last bit."""
    ours, state, theirs, opt = step_both(
        SGD(0.05, momentum=momentum, weight_decay=wd),
        lambda params: torch.optim.SGD(params, lr=0.05, momentum=momentum, weight_decay=wd, foreach=False),
        [(5, 3), (4,), (2, 1, 3, 3)], 5)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b.detach())
    if momentum:
        for a, b in zip(state["momentum"], theirs):
            assert torch.equal(a, opt.state[b]["momentum_buffer"])


def test_plain_sgd_golden():
    # w = 1, grad = 2, lr = 0.1, wd = 0.5: g = 2 + 0.5 * 1 = 2.5, w = 1 - 0.25 = 0.75.
    w = [torch.tensor([1.0])]
    SGD(0.1, weight_decay=0.5).step(w, [torch.tensor([2.0])], {})
    assert w[0].item() == pytest.approx(0.75)


def test_momentum_accumulates():
    # mu = 0.5, grads 1 then 1: b1 = 1, b2 = 0.5 + 1 = 1.5; w = 0 - 0.1 - 0.15 = -0.25.
    opt = SGD(0.1, momentum=0.5)
    w = [torch.zeros(1)]
    state = opt.init(w)
    for _ in range(2):
        opt.step(w, [torch.ones(1)], state)
    assert w[0].item() == pytest.approx(-0.25)
    assert state["momentum"][0].item() == pytest.approx(1.5)


def test_stacked_clients_with_per_client_lr():
    # The same step on stacked [m, ...] tensors with an lr per client equals m separate steps.
    opt = SGD(0.1, momentum=0.9)
    stacked = [torch.ones(3, 2)]
    state = opt.init(stacked)
    lr = torch.tensor([0.1, 0.2, 0.0]).view(3, 1)
    opt.step(stacked, [torch.ones(3, 2)], state, lr=lr)
    assert stacked[0][:, 0].tolist() == pytest.approx([0.9, 0.8, 1.0])
