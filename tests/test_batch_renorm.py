"""Batch Renormalization as TensorFlow 1.13 runs it (the parameter-divergence paper's code).

The expected numbers are worked out by hand in the comments, from the equations of
:class:`fedrun.models.batchnorm.BatchRenorm` (TF's ``_renorm_correction_and_moments``): with rate
alpha, ``renorm_mean <- (1 - alpha) renorm_mean + alpha mu_B`` and
``renorm_mean_weight <- (1 - alpha) renorm_mean_weight + alpha`` (likewise the standard
deviation); r and d use ``mu_mix = renorm_mean + (1 - weight) mu_B`` and ``sigma_mix``, taken
before the update; the inference statistics move toward the debiased renorm EMAs.  Most tests
use ``eps = 0`` and batches whose variances are perfect squares so every number is exact.
"""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, vmap

from fedrun.server.aggregator import average_buffers
from fedrun.models.batchnorm import BatchRenorm1d, BatchRenorm2d, FederatedBatchNorm1d, FederatedBatchNorm2d
from fedrun.models.pd_nets import PDNet, make_norm

RENORM_BUFFERS = ("renorm_mean", "renorm_mean_weight", "renorm_stddev", "renorm_stddev_weight")


def col(*values: float) -> torch.Tensor:
    """One channel, a batch of ``len(values)``: shape (N, 1)."""
    return torch.tensor(values, dtype=torch.float32).view(-1, 1)


def value(t: torch.Tensor) -> float:
    return float(t.reshape(-1)[0])


def test_brn_buffers_and_initial_state():
    brn = BatchRenorm2d(3)
    assert brn.momentum == brn.renorm_momentum == 0.01  # TF's momentum = renorm_momentum = 0.99
    assert (brn.r_max, brn.d_max, brn.eps) == (2.0, 2.0, 1e-3)  # fl_noniid.py l. 603-607, TF's epsilon
    assert set(dict(brn.named_buffers())) == {"running_mean", "running_sq", *RENORM_BUFFERS}
    assert brn.renorm_mean_weight.shape == brn.renorm_stddev_weight.shape == ()  # scalars, as TF's
    for name in RENORM_BUFFERS:  # TF's zeros_initializer
        assert getattr(brn, name).abs().sum() == 0 and getattr(brn, name).is_floating_point()
    assert brn.running_mean.abs().sum() == 0 and torch.equal(brn.running_var, torch.ones(3))  # TF: mean 0, variance 1
    # pd_nets.py builds it with make_norm(norm, features, dims, momentum): both rates are bn_momentum.
    made = make_norm("brn", 4, 1, 0.1)
    assert isinstance(made, BatchRenorm1d) and made.renorm_momentum == made.momentum == 0.1
    assert BatchRenorm1d(2, momentum=0.1, renorm_momentum=0.3).renorm_momentum == 0.3
    # reset_parameters (the nets' initialization) clears the renorm statistics too.
    brn.train()(torch.randn(4, 3, 2, 2))
    assert brn.renorm_mean_weight > 0
    brn.reset_parameters()
    assert all(getattr(brn, name).abs().sum() == 0 for name in RENORM_BUFFERS)
    with pytest.raises(ValueError, match="renorm_momentum"):
        BatchRenorm1d(2, renorm_momentum=0.0)


def test_brn_first_step_is_batch_norm_whatever_the_inference_statistics():
    # Weights 0: mu_mix = mu_B and sigma_mix = sigma_B, so r = 1 and d = 0 (TF l. 489-495).  The
    # inference statistics play no part in training, so odd values there change nothing.
    torch.manual_seed(0)
    x = torch.randn(8, 3, 4, 4) * 3 + 2
    bn, brn = FederatedBatchNorm2d(3), BatchRenorm2d(3)
    for module in (bn, brn):
        module.weight.data = torch.tensor([1.0, 2.0, 0.5])
        module.bias.data = torch.tensor([0.0, 1.0, -1.0])
    brn.running_mean.fill_(50.0)
    brn.running_sq.fill_(2600.0)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = bn(xa), brn(xb)
    torch.testing.assert_close(yb, ya)
    g = torch.randn_like(x)
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad)
    torch.testing.assert_close(brn.weight.grad, bn.weight.grad)
    torch.testing.assert_close(brn.bias.grad, bn.bias.grad)
    # After the step (alpha = m = 0.01, eps = 1e-3): weights 0.01, renorm EMAs 0.01 x the batch's,
    # so the debiased EMAs are the batch's own and sigma_hat^2 - eps = var_B.  The stored moving
    # mean 50 and variance 2600 - 50^2 = 100 then move as TF's: (1 - m) old + m (mu_B, var_B).
    mu_b, var_b = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    torch.testing.assert_close(brn.renorm_mean_weight, torch.tensor(0.01))
    torch.testing.assert_close(brn.renorm_stddev_weight, torch.tensor(0.01))
    torch.testing.assert_close(brn.renorm_mean, 0.01 * mu_b)
    torch.testing.assert_close(brn.renorm_stddev, 0.01 * torch.sqrt(var_b + 1e-3))
    torch.testing.assert_close(brn.running_mean, 0.99 * 50 + 0.01 * mu_b)
    torch.testing.assert_close(brn.running_var, 0.99 * (2600 - 50 ** 2) + 0.01 * var_b, rtol=1e-5, atol=1e-3)


def test_brn_renorm_buffers_are_hand_computed_debiased_emas():
    # alpha = 0.5 for the renorm statistics, m = 0.25 for the inference ones, eps = 0.
    brn = BatchRenorm1d(1, eps=0.0, momentum=0.25, renorm_momentum=0.5)
    # Step 1: batch (0, 4, 0, 4): mu_B = 2, var_B = 4, sigma_B = 2.  Weights 0 -> r = 1, d = 0.
    y = brn(col(0, 4, 0, 4))
    torch.testing.assert_close(y, col(-1, 1, -1, 1))  # (x - 2) / 2
    # renorm_mean = 0.5 * 2 = 1, renorm_stddev = 0.5 * 2 = 1, weights 0.5; debiased: 2 and 2.
    # moving_mean = 0.75 * 0 + 0.25 * 2 = 0.5; moving_variance = 0.75 * 1 + 0.25 * 2^2 = 1.75.
    assert [value(getattr(brn, k)) for k in RENORM_BUFFERS] == [1.0, 0.5, 1.0, 0.5]
    assert value(brn.running_mean) == 0.5 and value(brn.running_var) == 1.75
    assert value(brn.running_sq) == 1.75 + 0.5 ** 2

    # Step 2: batch (5, 7, 5, 7): mu_B = 6, var_B = 1, sigma_B = 1.
    # mu_mix = 1 + (1 - 0.5) * 6 = 4, sigma_mix = 1 + (1 - 0.5) * 1 = 1.5
    # r = 1 / 1.5 = 2/3, d = (6 - 4) / 1.5 = 4/3: y = (x - 6) * 2/3 + 4/3 = 2/3 or 2.
    y = brn(col(5, 7, 5, 7))
    torch.testing.assert_close(y, col(2 / 3, 2, 2 / 3, 2))
    # renorm_mean = 0.5 * 1 + 0.5 * 6 = 3.5, renorm_stddev = 0.5 * 1 + 0.5 * 1 = 1, weights 0.75
    # (= 1 - 0.5^2).  Debiased: mu_hat = 3.5 / 0.75 = 14/3 (= (0.25 * 2 + 0.5 * 6) / 0.75, the
    # debiased EMA of 2, 6), sigma_hat = 1 / 0.75 = 4/3.
    torch.testing.assert_close(brn.renorm_mean, torch.tensor([3.5]))
    torch.testing.assert_close(brn.renorm_stddev, torch.tensor([1.0]))
    assert value(brn.renorm_mean_weight) == value(brn.renorm_stddev_weight) == 0.75
    # moving_mean = 0.75 * 0.5 + 0.25 * 14/3; moving_variance = 0.75 * 1.75 + 0.25 * (4/3)^2.
    mean2, var2 = 0.75 * 0.5 + 0.25 * 14 / 3, 0.75 * 1.75 + 0.25 * (4 / 3) ** 2
    torch.testing.assert_close(brn.running_mean, torch.tensor([mean2]))
    torch.testing.assert_close(brn.running_var, torch.tensor([var2]))

    # Step 3: batch (3, 5, 3, 5): mu_B = 4, sigma_B = 1.
    # mu_mix = 3.5 + 0.25 * 4 = 4.5, sigma_mix = 1 + 0.25 * 1 = 1.25
    # r = 1 / 1.25 = 0.8, d = (4 - 4.5) / 1.25 = -0.4: y = (x - 4) * 0.8 - 0.4 = -1.2 or 0.4.
    y = brn(col(3, 5, 3, 5))
    torch.testing.assert_close(y, col(-1.2, 0.4, -1.2, 0.4))
    # renorm_mean = 0.5 * 3.5 + 0.5 * 4 = 3.75, weight 0.875: mu_hat = 3.75 / 0.875 = 30/7.
    torch.testing.assert_close(brn.renorm_mean, torch.tensor([3.75]))
    assert value(brn.renorm_mean_weight) == 0.875
    torch.testing.assert_close(brn.renorm_mean / brn.renorm_mean_weight, torch.tensor([30 / 7]))
    torch.testing.assert_close(brn.running_mean, torch.tensor([0.75 * mean2 + 0.25 * 30 / 7]))


def test_brn_clips_r_and_d_with_an_extreme_batch():
    # renorm_momentum = 0.9 (alpha): after one step the weights are 0.9, so the next batch mixes in
    # at 10% only.  eps = 1e-3 (TF's); clipping r in [0.5, 2], d in [-2, 2] (the paper's).
    brn = BatchRenorm1d(3, momentum=0.9)
    brn(torch.tensor([-1.0, 1.0, -1.0, 1.0]).view(4, 1).repeat(1, 3))  # every channel: mu 0, var 1
    s1 = (1 + 1e-3) ** 0.5
    torch.testing.assert_close(brn.renorm_stddev, torch.full((3,), 0.9 * s1))
    # Channel 0, (+-10): sigma_B ~ 10, sigma_mix = 0.9 s1 + 0.1 * 10 ~ 1.9: r ~ 5.3 -> 2; d = 0.
    # Channel 1, 100 +- 1: sigma_B = s1 = sigma_mix -> r = 1; mu_mix = 0 + 0.1 * 100 = 10:
    #   d = (100 - 10) / s1 ~ 90 -> 2.
    # Channel 2, -100 +- 0.1: sigma_B ~ 0.105, sigma_mix ~ 0.911: r ~ 0.12 -> 0.5;
    #   mu_mix = -10, d ~ -90 / 0.911 -> -2.
    pm = torch.tensor([-1.0, 1.0, -1.0, 1.0]).view(4, 1)
    x = torch.cat([10 * pm, 100 + pm, -100 + 0.1 * pm], dim=1)
    xg = x.clone().requires_grad_(True)
    y = brn(xg)
    sigma_b = torch.sqrt(torch.tensor([100.0, 1.0, 0.01]) + 1e-3)
    r, d = torch.tensor([2.0, 1.0, 0.5]), torch.tensor([0.0, 2.0, -2.0])
    x_bn = (x - x.mean(0)) / sigma_b  # plain batch norm: +-10/sigma_B, +-1/sigma_B, +-0.1/sigma_B
    torch.testing.assert_close(y, x_bn * r + d)
    # r and d are constants for the gradient: d(y)/dx = r * d(batch norm)/dx.
    g = torch.randn_like(x)
    (y * g).sum().backward()
    xb = x.clone().requires_grad_(True)
    (FederatedBatchNorm1d(3)(xb) * g * r).sum().backward()
    torch.testing.assert_close(xg.grad, xb.grad, rtol=1e-4, atol=1e-5)


def test_brn_eval_uses_the_inference_statistics():
    brn = BatchRenorm1d(1, eps=0.0, momentum=0.25, renorm_momentum=0.5)
    brn.weight.data.fill_(2.0)
    brn.bias.data.fill_(1.0)
    brn(col(0, 4, 0, 4))
    brn(col(5, 7, 5, 7))  # as in the hand-computed test: moving mean and variance below
    mean, var = 0.75 * 0.5 + 0.25 * 14 / 3, 0.75 * 1.75 + 0.25 * (4 / 3) ** 2
    before = {k: v.clone() for k, v in brn.named_buffers()}
    x = col(-1, 0, 2, 10)
    y = brn.eval()(x)
    torch.testing.assert_close(y, 2 * (x - mean) / var ** 0.5 + 1)  # no batch statistics, r = 1, d = 0
    for k, v in brn.named_buffers():
        assert torch.equal(v, before[k]), k  # evaluation moves nothing
    torch.testing.assert_close(brn(col(3.0)), 2 * (col(3.0) - mean) / var ** 0.5 + 1)  # batch of 1


def test_brn_buffers_average_across_clients_into_the_federated_variance():
    # Two clients, one step each (alpha = m = 0.5, eps = 0).
    #   A: (0, 4, 0, 4): mu 2, var 4 -> renorm_mean 1, renorm_stddev 1, weights 0.5;
    #      moving_mean 0.5 * 2 = 1, moving_variance 0.5 * 1 + 0.5 * 4 = 2.5 (running_sq 3.5).
    #   B: (5, 7, 5, 7): mu 6, var 1 -> renorm_mean 3, renorm_stddev 0.5, weights 0.5;
    #      moving_mean 3, moving_variance 0.5 + 0.5 * 1 = 1 (running_sq 10).
    states = []
    for batch in (col(0, 4, 0, 4), col(5, 7, 5, 7)):
        client = BatchRenorm1d(1, eps=0.0, momentum=0.5)
        client(batch)
        states.append(dict(client.named_buffers()))
    stacked = {k: torch.stack([s[k] for s in states]) for k in states[0]}
    avg = average_buffers(stacked, torch.tensor([0.5, 0.5]))  # the paper's 1/K (equal n_k)
    server = BatchRenorm1d(1, eps=0.0, momentum=0.5)
    server.load_state_dict({**server.state_dict(), **avg})
    # Every float buffer is plainly averaged (fl_noniid.py l. 333-345), the weights included ...
    assert value(server.renorm_mean) == 2.0 and value(server.renorm_stddev) == 0.75
    assert value(server.renorm_mean_weight) == value(server.renorm_stddev_weight) == 0.5
    assert value(server.running_mean) == 2.0
    # ... and the moving variance is the authors' mean_k(var_k + mean_k^2) - (mean_k mean_k)^2
    # (l. 365-383): (3.5 + 10) / 2 - 2^2 = 2.75, not the mean variance (2.5 + 1) / 2 = 1.75.
    assert value(server.running_var) == 2.75
    # Client weights p_k = n_k / n: p = (1/4, 3/4): mean 0.25 + 2.25 = 2.5,
    # variance 0.25 * 3.5 + 0.75 * 10 - 2.5^2 = 2.125.
    avg = average_buffers(stacked, torch.tensor([0.25, 0.75]))
    assert float(avg["running_mean"]) == 2.5 and float(avg["running_sq"] - avg["running_mean"] ** 2) == 2.125
    assert float(avg["renorm_stddev"]) == 0.25 * 1 + 0.75 * 0.5
    # The next round starts from the averaged renorm statistics: batch (1, 3, 1, 3), mu 2, sigma 1:
    # mu_mix = 2 + 0.5 * 2 = 3, sigma_mix = 0.75 + 0.5 * 1 = 1.25, r = 0.8, d = -0.8:
    # y = (x - 2) * 0.8 - 0.8 = -1.6 or 0.
    torch.testing.assert_close(server.train()(col(1, 3, 1, 3)), col(-1.6, 0, -1.6, 0))


def test_brn_under_vmap_with_per_client_buffers():
    # fedrun.client.batched runs the model with functional_call under vmap, buffers stacked per client
    # and updated in place: the same numbers as each client's own module.
    torch.manual_seed(0)
    module = BatchRenorm2d(3, momentum=0.3)
    params = {k: v.detach() for k, v in module.named_parameters()}
    batches = [torch.randn(2, 6, 3, 2, 2) * torch.tensor([1.0, 3.0]).view(2, 1, 1, 1, 1) + 1 for _ in range(3)]
    buffers = {k: v.unsqueeze(0).repeat(2, *([1] * v.ndim)) for k, v in module.named_buffers()}
    outs = []
    for x in batches:  # three steps for two clients at once
        outs.append(vmap(lambda b, x: functional_call(module, (params, b), (x,)))(buffers, x))
    assert float(buffers["renorm_mean_weight"][0]) == pytest.approx(1 - 0.7 ** 3)
    for k in range(2):
        own = BatchRenorm2d(3, momentum=0.3)
        for s, x in enumerate(batches):
            torch.testing.assert_close(own(x[k]), outs[s][k])
        for name, v in own.named_buffers():
            torch.testing.assert_close(buffers[name][k], v)
    assert not torch.equal(buffers["renorm_mean"][0], buffers["renorm_mean"][1])


def test_brn_pdnet_has_the_renorm_buffers():
    net = PDNet(3, 8, 10, m=1, norm="brn", bn_momentum=0.01)
    names = dict(net.named_buffers())
    assert {"BN11.renorm_mean", "BN11.renorm_mean_weight", "BN11.renorm_stddev", "BN11.renorm_stddev_weight",
            "BN11.running_mean", "BN11.running_sq"} <= set(names)
    assert all(v.is_floating_point() for v in names.values())  # all averaged by the server


def test_brn_matches_a_transcription_of_tf_renorm_over_many_steps():
    # TF 1.13's BatchNormalization(renorm=True) step written out with its own variables
    # (moving_variance kept as such; fedrun stores running_sq = moving_variance + moving_mean^2),
    # in float64 over 30 random batches whose mean and scale drift.
    torch.manual_seed(0)
    c, decay, renorm_decay, eps = 4, 0.9, 0.8, 1e-3  # TF's momentum, renorm_momentum, epsilon
    brn = BatchRenorm1d(c, momentum=1 - decay, renorm_momentum=1 - renorm_decay).double()
    tf = {k: torch.zeros(c, dtype=torch.float64) for k in ("moving_mean", "renorm_mean", "renorm_stddev")}
    tf["moving_variance"] = torch.ones(c, dtype=torch.float64)
    w_mean = w_std = 0.0

    def assign_moving_average(var, value, momentum):  # TF l. 414-430
        return var - (var - value) * (1.0 - momentum)

    for step in range(30):
        x = torch.randn(16, c, dtype=torch.float64) * (1 + step % 5) + 3 * torch.sin(torch.tensor(step / 3.0))
        mean, variance = x.mean(0), x.var(0, unbiased=False)  # nn.moments
        stddev = torch.sqrt(variance + eps)
        mixed_mean = tf["renorm_mean"] + (1.0 - w_mean) * mean
        mixed_std = tf["renorm_stddev"] + (1.0 - w_std) * stddev
        r = (stddev / mixed_std).clamp(0.5, 2.0)
        d = ((mean - mixed_mean) / mixed_std).clamp(-2.0, 2.0)
        expected = (x - mean) / torch.sqrt(variance + eps) * r + d
        tf["renorm_mean"] = assign_moving_average(tf["renorm_mean"], mean, renorm_decay)
        w_mean = assign_moving_average(w_mean, 1.0, renorm_decay)
        tf["renorm_stddev"] = assign_moving_average(tf["renorm_stddev"], stddev, renorm_decay)
        w_std = assign_moving_average(w_std, 1.0, renorm_decay)
        new_mean, new_stddev = tf["renorm_mean"] / w_mean, tf["renorm_stddev"] / w_std
        tf["moving_mean"] = assign_moving_average(tf["moving_mean"], new_mean, decay)
        tf["moving_variance"] = assign_moving_average(tf["moving_variance"], new_stddev ** 2 - eps, decay)
        torch.testing.assert_close(brn.train()(x), expected)
    torch.testing.assert_close(brn.renorm_mean, tf["renorm_mean"])
    torch.testing.assert_close(brn.renorm_stddev, tf["renorm_stddev"])
    torch.testing.assert_close(float(brn.renorm_mean_weight), w_mean)
    torch.testing.assert_close(brn.running_mean, tf["moving_mean"])
    torch.testing.assert_close(brn.running_var, tf["moving_variance"])
    assert 0.5 < float(brn.running_var.min())  # a real variance, far from the clamp at 0
