"""fedrun.diagnostics.landscape: filter-normalized directions (Li et al. 2018) and loss surfaces."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fedrun.diagnostics.evaluation import evaluate
from fedrun.diagnostics.landscape import filter_normalized_direction, inner, loss_surface, orthogonalize, sharpness
from fedrun.params import split_state


class SmallConvNet(nn.Module):
    """conv 3x3 (2 -> 4) + BatchNorm + FC 4*4*4 -> 3: every kind of tensor a direction meets."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _model(seed=0):
    torch.manual_seed(seed)
    model = SmallConvNet()
    with torch.no_grad():  # non-trivial running statistics, so buffers matter in eval mode
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def _data(n=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 4, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_filter_norms_match_the_parameters_and_1d_tensors_are_zero():
    params, _ = split_state(_model())
    with torch.no_grad():
        params["conv.weight"][1].zero_()  # a dead filter gets a zero direction, not NaN
    d = filter_normalized_direction(params, torch.Generator().manual_seed(0))
    assert d.keys() == params.keys()
    for name, p in params.items():
        assert d[name].shape == p.shape and d[name].dtype == p.dtype
        if p.dim() == 1:
            assert torch.count_nonzero(d[name]) == 0, name
        else:
            torch.testing.assert_close(d[name].flatten(1).norm(dim=1), p.flatten(1).norm(dim=1))
    assert torch.count_nonzero(d["conv.weight"][1]) == 0
    assert torch.count_nonzero(d["conv.weight"][0]) > 0
    # Per filter, not per tensor: the fc rows have different norms and each keeps its own.
    assert d["fc.weight"].norm(dim=1).std() > 0
    # The direction is random, not the parameters themselves.
    assert not torch.allclose(d["fc.weight"], params["fc.weight"])
    # zero_1d=False: the bias is one filter of its own.
    d_all = filter_normalized_direction(params, torch.Generator().manual_seed(0), zero_1d=False)
    torch.testing.assert_close(d_all["fc.bias"].norm(), params["fc.bias"].norm())


def test_directions_are_deterministic_by_seed():
    params, _ = split_state(_model())
    a = filter_normalized_direction(params, torch.Generator().manual_seed(7))
    b = filter_normalized_direction(params, torch.Generator().manual_seed(7))
    c = filter_normalized_direction(params, torch.Generator().manual_seed(8))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["fc.weight"], c["fc.weight"])


def test_orthogonalize():
    params, _ = split_state(_model())
    g = torch.Generator().manual_seed(0)
    d1, d2 = filter_normalized_direction(params, g), filter_normalized_direction(params, g)
    o = orthogonalize(d1, d2)
    assert abs(inner(d1, o)) < 1e-6 * inner(d1, d1)  # float32 entries
    assert inner(o, o) == pytest.approx(inner(d2, d2))
    assert torch.count_nonzero(o["fc.bias"]) == 0
    # Already orthogonal directions are left alone.
    e1 = {"w": torch.tensor([[1.0, 0.0]])}
    e2 = {"w": torch.tensor([[0.0, 2.0]])}
    torch.testing.assert_close(orthogonalize(e1, e2)["w"], e2["w"])
    # A parallel pair keeps its norm as is ... and becomes zero when nothing is left.
    assert torch.count_nonzero(orthogonalize(e1, {"w": torch.tensor([[3.0, 0.0]])})["w"]) == 0


def test_surface_centre_is_the_models_loss_and_buffers_are_used():
    model = _model()
    params, buffers = split_state(model)
    x, y = _data()
    g = torch.Generator().manual_seed(0)
    d1, d2 = filter_normalized_direction(params, g), filter_normalized_direction(params, g)
    alphas, betas = [-0.5, 0.0, 0.5], [-1.0, 0.0, 1.0, 2.0]
    surf, acc = loss_surface(model, params, buffers, x, y, d1, d2, alphas, betas, batch_size=16,
                             return_accuracy=True)
    assert surf.shape == (3, 4) and acc.shape == (3, 4)
    want_acc, want = evaluate(model, {**params, **buffers}, x, y)
    assert surf[1, 1].item() == pytest.approx(want, rel=1e-6)
    assert acc[1, 1].item() == pytest.approx(want_acc)
    # Row i moves along d1 by alphas[i], column j along d2 by betas[j].
    moved = {k: v + 0.5 * d1[k] + 2.0 * d2[k] for k, v in params.items()}
    assert surf[2, 3].item() == pytest.approx(evaluate(model, {**moved, **buffers}, x, y)[1], rel=1e-6)
    assert torch.isfinite(surf).all() and (surf > 0).all()
    # Eval mode with the centre's running statistics: other buffers give another loss.
    other = dict(buffers, **{"bn.running_mean": buffers["bn.running_mean"] + 1.0})
    centre_other = loss_surface(model, params, other, x, y, d1, d2, [0.0], [0.0])
    assert centre_other.item() != pytest.approx(want, rel=1e-6)


def test_quadratic_toy_gives_the_expected_bowl():
    """loss(w) = ||w - c||^2 with orthonormal directions: L(a, b) = (a - a*)^2 + (b - b*)^2 + r."""
    c = torch.tensor([[0.3, -0.2, 0.5]])
    params = {"w": torch.zeros(1, 3)}
    d1 = {"w": torch.tensor([[1.0, 0.0, 0.0]])}
    d2 = {"w": torch.tensor([[0.0, 1.0, 0.0]])}
    grid = torch.linspace(-1, 1, 21)

    def quad(_model, state):
        return float(((state["w"] - c) ** 2).sum())

    surf = loss_surface(nn.Identity(), params, {}, None, None, d1, d2, grid, grid, loss_fn=quad)
    a, b = grid.double().view(-1, 1), grid.double().view(1, -1)
    expected = (a - 0.3) ** 2 + (b + 0.2) ** 2 + 0.25
    torch.testing.assert_close(surf, expected)
    s = sharpness(surf, grid, grid)
    assert s["centre"] == pytest.approx(0.3 ** 2 + 0.2 ** 2 + 0.25)
    assert s["argmin"] == pytest.approx((0.3, -0.2), abs=1e-6)
    assert s["min"] == pytest.approx(0.25)
    assert s["curvature"] == pytest.approx(2.0, rel=1e-4)  # d^2/da^2 of (a - a*)^2
    # A steeper bowl is sharper by both measures.
    steep = sharpness(4 * surf, grid, grid)
    assert steep["curvature"] > s["curvature"] and steep["keskar"] > s["keskar"]
    with pytest.raises(ValueError):
        sharpness(surf[:, :5], grid, grid[:5])  # no b = 0 column
