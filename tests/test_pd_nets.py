"""The parameter-divergence paper's networks (Appendix A.1, Table 3, Table 5), their Appendix A.2
initialization, and Batch (Re)Normalization with footnote 8's federated moving variance."""
from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import CONF_DIR
from equivalence import assert_engines_agree
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from fedrun.server.aggregator import average_buffers
from fedrun.models.batchnorm import BatchRenorm2d, FederatedBatchNorm1d, FederatedBatchNorm2d
from fedrun.errors import ConfigError
from fedrun.models.layers import count_parameters, layers
from fedrun.client.local_training import LocalTraining
from fedrun.params import split_state
from fedrun.models.pd_nets import VARIANTS, CifarResNet, PDNet, pdnet, same_max_pool

TRUNC = 0.8796256610342398  # std of N(0, 1) truncated to [-2, 2]


FILES = {"NetA-Baseline": "neta_baseline", "NetA-Deeper": "neta_deeper", "NetA-Deepest": "neta_deepest",
         "NetA-Narrowest": "neta_narrowest", "NetA-Narrower": "neta_narrower", "NetB-Baseline": "netb_baseline",
         "NetB-Wider": "netb_wider", "NetB-Widest": "netb_widest", "NetC-Baseline": "netc_baseline",
         "NetC-Wider": "netc_wider", "NetC-Widest": "netc_widest"}
# Table 3 as printed: n, m, pooling after the last conv, v, u (None: "-").
TABLE3 = {"NetA-Baseline": (1, 4, "max2", 3, 2), "NetA-Deeper": (2, 4, "max2", 3, 2),
          "NetA-Deepest": (3, 4, "max2", 3, 2), "NetA-Narrowest": (1, 1, "max2", 3, 2),
          "NetA-Narrower": (1, 2, "max2", 3, 2), "NetB-Baseline": (1, 4, "avg", 3, 1),
          "NetB-Wider": (1, 4, "max4", 3, 1), "NetB-Widest": (1, 4, "max2", 3, 1),
          "NetC-Baseline": (1, 4, "avg", 1, None), "NetC-Wider": (1, 4, "max4", 1, None),
          "NetC-Widest": (1, 4, "max2", 1, None)}
F1_INPUT = {"max2": 4096, "max4": 1024, "avg": 256}


def convs(model) -> list[nn.Conv2d]:
    return [m for m in model.modules() if isinstance(m, nn.Conv2d)]


def fcs(model) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


# ----------------------------------------------------------------------------- architectures

@pytest.mark.parametrize("name", list(TABLE3))
def test_variant_has_its_table3_shapes(name):
    n, m, pooling, v, u = TABLE3[name]
    assert set(VARIANTS) == set(TABLE3)
    torch.manual_seed(0)
    net = pdnet(name)
    widths = [c.out_channels for c in convs(net)]
    assert widths == [16 * m] * n + [128] * n + [256] * n
    assert [getattr(net, f"C{i}{j}").out_channels for i in (1, 2, 3) for j in range(1, n + 1)] == widths
    outs = [256 * u, 256, 10] if v == 3 else [10]
    assert [f.out_features for f in fcs(net)] == outs
    assert net.F1.in_features == F1_INPUT[pooling]
    assert [layer.name for layer in layers(net)] == (
        [f"C{i}{j}" for i in (1, 2, 3) for j in range(1, n + 1)] + [f"F{j}" for j in range(1, v + 1)])
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    grey = pdnet(name, in_channels=1, image_size=28, num_classes=7)  # 28 -> 14 -> 7 -> 4 | 2 | 1
    assert grey.F1.in_features == F1_INPUT[pooling]
    assert grey(torch.randn(2, 1, 28, 28)).shape == (2, 7)


def test_paper_stated_sizes():
    # Sec. 3: NetB F1 has 256*256, 1024*256, 4096*256 weights; NetC's output layer 2560, 10240, 40960.
    assert [pdnet(f"NetB-{w}").F1.weight.numel() for w in ("Baseline", "Wider", "Widest")] == \
        [256 * 256, 1024 * 256, 4096 * 256]
    assert [pdnet(f"NetC-{w}").F1.weight.numel() for w in ("Baseline", "Wider", "Widest")] == [2560, 10240, 40960]
    assert [len(convs(pdnet(f"NetA-{d}"))) for d in ("Baseline", "Deeper", "Deepest")] == [3, 6, 9]


@pytest.mark.parametrize("name", list(FILES))
def test_config_file_is_its_variant(name):
    raw = OmegaConf.load(CONF_DIR / "model" / f"{FILES[name]}.yaml")
    n, m, pooling, v, u = TABLE3[name]
    assert raw._target_ == "fedrun.models.pd_nets.PDNet"
    assert (raw.n, raw.m, raw.pooling, raw.v) == (n, m, pooling, v) and (u is None or raw.u == u)
    assert (raw.norm, raw.dropout) == ("none", False)
    text = (CONF_DIR / "model" / f"{FILES[name]}.yaml").read_text()
    stated = int(re.search(r"([\d,]+) parameters on 32x32x3", text).group(1).replace(",", ""))
    cfg = OmegaConf.merge({"dataset": {"channels": 3, "image_size": 32, "num_classes": 10}}, {"model": raw})
    assert count_parameters(instantiate(cfg.model)) == stated == count_parameters(pdnet(name))


@pytest.mark.parametrize("depth,conv_layers,params", [(14, 13, 172_506), (20, 19, 269_722)])
def test_resnet_layer_counts(depth, conv_layers, params):
    torch.manual_seed(0)
    net = CifarResNet(depth=depth)
    assert len(convs(net)) == conv_layers and len(fcs(net)) == 1  # Table 5 note: 13 + 1, 19 + 1
    assert count_parameters(net) == params  # He et al.: ResNet-20 has 0.27M
    kinds = [layer.type for layer in layers(net)]
    assert kinds.count("conv") == conv_layers and kinds.count("fc") == 1 and kinds.count("norm") == conv_layers
    assert layers(net)[2].name == "stage1.block1.conv1"
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert CifarResNet(1, 28, 10, depth=depth)(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    raw = OmegaConf.load(CONF_DIR / "model" / f"resnet{depth}.yaml")
    cfg = OmegaConf.merge({"dataset": {"channels": 3, "image_size": 32, "num_classes": 10}}, {"model": raw})
    assert count_parameters(instantiate(cfg.model)) == params
    assert f"{params:,} parameters on 32x32x3" in (CONF_DIR / "model" / f"resnet{depth}.yaml").read_text()


def test_normalization_placement_and_names():
    net = pdnet("NetA-Deeper", norm="bn")
    names = [(layer.name, layer.type) for layer in layers(net)]
    assert names[:4] == [("C11", "conv"), ("BN11", "norm"), ("C12", "conv"), ("BN12", "norm")]
    assert names[-5:] == [("F1", "fc"), ("BNF1", "norm"), ("F2", "fc"), ("BNF2", "norm"), ("F3", "fc")]
    assert all(c.bias is None for c in convs(net)) and net.F1.bias is None and net.F3.bias is not None
    assert isinstance(net.BN11, FederatedBatchNorm2d) and isinstance(net.BNF1, FederatedBatchNorm1d)
    assert isinstance(pdnet("NetC-Baseline", norm="brn").BN31, BatchRenorm2d)
    assert not hasattr(pdnet("NetC-Baseline", norm="brn"), "BNF1")  # v = 1: no hidden FC layer
    buffers = dict(net.named_buffers())
    assert "BN11.running_sq" in buffers and not any("running_var" in k or "num_batches" in k for k in buffers)


def test_bad_settings_are_config_errors():
    for kwargs in (dict(pooling="max3"), dict(v=2), dict(norm="ln"), dict(n=0)):
        with pytest.raises(ConfigError):
            PDNet(**kwargs)
    with pytest.raises(ConfigError, match="depth"):
        CifarResNet(depth=16)


def test_tf_same_max_pooling():
    x = torch.arange(16.0).view(1, 1, 4, 4)
    # TF SAME, 3x3 stride 2 on 4x4: one padding row/column at the bottom/right only.
    assert same_max_pool(x, 3, 2).flatten().tolist() == [10, 11, 14, 15]
    assert nn.MaxPool2d(3, 2, padding=1)(x).flatten().tolist() == [5, 7, 13, 15]  # symmetric: shifted
    y = torch.arange(49.0).view(1, 1, 7, 7)  # 7 -> 2 at stride 4: no padding, windows start at 0 and 4
    assert same_max_pool(y, 3, 4).flatten().tolist() == [16, 20, 44, 48]
    assert same_max_pool(-y, 3, 2)[0, 0, 0, 0] == 0  # padding never wins the max


# ----------------------------------------------------------------------------- initialization

def test_he_truncated_normal_initialization():
    torch.manual_seed(0)
    net = pdnet("NetA-Deeper", init="fan_in")
    for name, module in net.named_modules():
        if not isinstance(module, (nn.Conv2d, nn.Linear)):
            continue
        w = module.weight.detach()
        s = 0.05 if name in ("C11", "C12", "F3") else math.sqrt(2.0 / w[0].numel())
        assert float(w.abs().max()) <= 2 * s * (1 + 1e-6), name  # truncated at 2 stddev
        assert float(w.std()) == pytest.approx(TRUNC * s, rel=0.06), name
        assert abs(float(w.mean())) < 0.1 * s, name
        assert float(module.bias.detach().abs().max()) == 0.0


def test_the_authors_initialization_is_the_default():
    # fl-noniid/fl-noniid, fl_noniid.py 554-596: conv groups 2-3 sqrt(2 / (9 C_out)), hidden FC
    # sqrt(1 / fan_in), 0.05 for group 1 and the output layer.  NetA-Baseline: C21 64 -> 128,
    # C31 128 -> 256, F1 4096 -> 512, F2 512 -> 256.
    expected = {"C11": 0.05, "C21": math.sqrt(2 / (9 * 128)), "C31": math.sqrt(2 / (9 * 256)),
                "F1": math.sqrt(1 / 4096), "F2": math.sqrt(1 / 512), "F3": 0.05}
    assert [round(v, 4) for v in expected.values()] == [0.05, 0.0417, 0.0295, 0.0156, 0.0442, 0.05]
    torch.manual_seed(0)
    net = pdnet("NetA-Baseline")
    for name, s in expected.items():
        w = getattr(net, name).weight.detach()
        assert float(w.abs().max()) <= 2 * s * (1 + 1e-6), name
        assert float(w.std()) == pytest.approx(TRUNC * s, rel=0.06), name
    with pytest.raises(ConfigError, match=r"^model\.init=he: choose one of: fan_in, authors$"):
        pdnet("NetA-Baseline", init="he")


def test_initialization_of_normalization_and_resnet():
    bn = pdnet("NetA-Baseline", norm="bn")
    assert bn.BN11.weight.eq(1).all() and bn.BN11.bias.eq(0).all()
    res = CifarResNet(depth=14)
    assert res.fixed_std_layers == ("conv1", "stage1.block1.conv1", "stage1.block1.conv2",
                                    "stage1.block2.conv1", "stage1.block2.conv2", "fc")
    assert float(res.stage1.block1.conv1.weight.detach().abs().max()) <= 0.1
    assert float(res.stage2.block1.conv1.weight.detach().abs().max()) > 0.1  # He: sqrt(2/144) = 0.118


# ----------------------------------------------------------------------------- normalization

def _bn_with_buffers(cls, buffers, **kwargs):
    module = cls(3, momentum=1.0, **kwargs)
    module.load_state_dict({**module.state_dict(), **buffers})
    return module.eval()


@pytest.mark.parametrize("weights", ["uniform", "sizes"])
def test_federated_bn_averaged_buffers_give_the_pooled_variance(weights):
    torch.manual_seed(0)
    # Two "clients" with very different activations (non-IID): different sizes, means and scales.
    a = torch.randn(6, 3, 4, 4) * 2 + torch.tensor([3.0, -1.0, 0.0]).view(1, 3, 1, 1)
    shift = torch.tensor([-3.0, 2.0, 3.0]).view(1, 3, 1, 1)
    b = torch.randn(6 if weights == "uniform" else 10, 3, 4, 4) * 0.5 + shift
    states = []
    for batch in (a, b):
        module = FederatedBatchNorm2d(3, momentum=1.0).train()  # momentum 1: running stats = this batch's
        module(batch)
        states.append({k: v.clone() for k, v in module.state_dict().items() if "running" in k})
    sizes = torch.tensor([len(a), len(b)], dtype=torch.float32)
    p = sizes / sizes.sum()  # footnote 8's 1/K when the sizes are equal (the paper's 5000 each)
    avg = average_buffers({k: torch.stack([s[k] for s in states]) for k in states[0]}, p)
    pooled = torch.cat([a, b])
    mean, var = pooled.mean((0, 2, 3)), pooled.var((0, 2, 3), unbiased=False)
    server = _bn_with_buffers(FederatedBatchNorm2d, avg)
    server.weight.data = torch.tensor([1.0, 2.0, 0.5])
    server.bias.data = torch.tensor([0.0, 1.0, -1.0])
    torch.testing.assert_close(server.running_mean, mean)
    torch.testing.assert_close(server.running_var, var, rtol=1e-5, atol=1e-5)
    x = torch.randn(5, 3, 4, 4)
    expected = (x - mean.view(1, 3, 1, 1)) / torch.sqrt(var.view(1, 3, 1, 1) + server.eps)
    expected = expected * server.weight.view(1, 3, 1, 1) + server.bias.view(1, 3, 1, 1)
    torch.testing.assert_close(server(x), expected, rtol=1e-5, atol=1e-5)
    # Averaging the clients' variances (PyTorch's running_var) misses the spread of their means.
    naive = p[0] * a.var((0, 2, 3), unbiased=False) + p[1] * b.var((0, 2, 3), unbiased=False)
    assert (naive < 0.8 * var).all()


def test_federated_bn_training_and_moving_averages():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5) * 3 + 1
    ours, ref = FederatedBatchNorm1d(3, momentum=0.1), nn.BatchNorm1d(3, eps=1e-3, momentum=0.1)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)  # batch statistics, biased
    mean, sq = x.mean((0, 2)), x.pow(2).mean((0, 2))
    torch.testing.assert_close(ours.running_mean, 0.1 * mean)
    torch.testing.assert_close(ours.running_sq, 0.9 + 0.1 * sq)
    with pytest.raises(ValueError, match="4D"):
        FederatedBatchNorm2d(3)(x)


def test_batch_renorm_at_r1_d0_is_batch_norm():
    torch.manual_seed(0)
    bn, brn = FederatedBatchNorm2d(3, momentum=0.3), BatchRenorm2d(3, momentum=0.3, r_max=1.0, d_max=0.0)
    for step in range(2):  # the second step's renorm statistics differ from the batch's: r, d clipped to 1, 0
        x = torch.randn(8, 3, 4, 4) * 2 + 1 + 4 * step
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        g = torch.randn(8, 3, 4, 4)
        ya, yb = bn(xa), brn(xb)
        torch.testing.assert_close(ya, yb)
        (ya * g).sum().backward()
        (yb * g).sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad)
        torch.testing.assert_close(bn.weight.grad, brn.weight.grad)
        bn.zero_grad()
        brn.zero_grad()
    # The moving statistics are TF's under renorm (tests/test_batch_renorm.py), not BN's E[phi^2].
    assert brn.renorm_mean_weight == pytest.approx(1 - 0.7 ** 2)


def test_batch_renorm_clips_r_and_d_and_treats_them_as_constants():
    torch.manual_seed(0)
    x = torch.randn(16, 3, 2, 2) * torch.tensor([1.0, 4.0, 0.2]).view(1, 3, 1, 1)
    mu_b, var_b = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    sigma_b = torch.sqrt(var_b + 1e-3)
    brn = BatchRenorm2d(3)  # r_max = d_max = 2 (Appendix C.5)
    mu = torch.tensor([0.1, 30.0, -30.0])  # channel 0 unclipped; d clipped at -2 and +2
    var = torch.tensor([1.2, 1.0, 1.0])  # sigma_B / sigma: ~0.9 | ~4 -> 2 | ~0.2 -> 0.5
    sigma = torch.sqrt(var + 1e-3)
    # Warmed-up renorm statistics (weights 1): TF's mixed mean and stddev are mu and sigma.
    brn.renorm_mean.copy_(mu)
    brn.renorm_stddev.copy_(sigma)
    brn.renorm_mean_weight.fill_(1.0)
    brn.renorm_stddev_weight.fill_(1.0)
    r = (sigma_b / sigma).clamp(0.5, 2.0)
    d = ((mu_b - mu) / sigma).clamp(-2.0, 2.0)
    assert r[1] == 2.0 and r[2] == 0.5 and d[1] == -2.0 and d[2] == 2.0 and 0.5 < r[0] < 2 and abs(d[0]) < 2
    xg = x.clone().requires_grad_(True)
    y = brn(xg)
    v = lambda t: t.view(1, 3, 1, 1)  # noqa: E731
    torch.testing.assert_close(y, (x - v(mu_b)) / v(sigma_b) * v(r) + v(d), rtol=1e-4, atol=1e-5)
    g = torch.randn_like(x)
    (y * g).sum().backward()
    # r, d constant: d(x_hat)/dx = r * d(BN x_hat)/dx, and gradients reach gamma, beta and x.
    xb = x.clone().requires_grad_(True)
    (FederatedBatchNorm2d(3)(xb) * g * v(r)).sum().backward()
    torch.testing.assert_close(xg.grad, xb.grad, rtol=1e-4, atol=1e-5)
    assert brn.weight.grad.abs().sum() > 0 and brn.bias.grad.abs().sum() > 0
    # Moving averages updated after r and d are computed, with alpha = 0.01 (the weights stay 1).
    torch.testing.assert_close(brn.renorm_mean, 0.99 * mu + 0.01 * mu_b)
    torch.testing.assert_close(brn.running_mean, 0.01 * (0.99 * mu + 0.01 * mu_b))  # moving mean from 0
    brn.eval()  # evaluation: the moving statistics
    mu_e, var_e = brn.running_mean, brn.running_sq - brn.running_mean ** 2
    torch.testing.assert_close(brn(x), (x - v(mu_e)) / torch.sqrt(v(var_e) + 1e-3))


# ----------------------------------------------------------------------------- engines

ENGINE_MODELS = {
    "neta-bn": lambda: PDNet(3, 8, 10, m=1, norm="bn", bn_momentum=0.1),
    "neta-brn": lambda: PDNet(3, 8, 10, m=1, norm="brn", bn_momentum=0.1),
    "resnet14-bn": lambda: CifarResNet(3, 8, 10, depth=14, norm="bn", bn_momentum=0.1),
}


@pytest.mark.parametrize("name", list(ENGINE_MODELS))
def test_sequential_and_batched_engines_agree(name):
    # Batch statistics over 4-8 samples: compared in float64 (tests/equivalence.py says why).
    torch.manual_seed(0)
    model = ENGINE_MODELS[name]()
    _, start = split_state(model)
    local = LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5)
    # last batches of 5, 4 and 7: grouped, never padded
    seq, bat = assert_engines_agree(model, local, float32=False, sizes=(13, 20, 7), shape=(3, 8, 8))
    assert set(seq.buffers) == set(start) and all("running_" in k or ".renorm_" in k for k in start)
    for k in seq.buffers:  # per-client moving E[phi], E[phi^2] (and BRN's renorm EMAs), updated in place under vmap
        assert not torch.equal(bat.buffers[k][0], start[k].double())  # the buffers did move
        assert not torch.equal(bat.buffers[k][0], bat.buffers[k][1])  # per client


@pytest.mark.parametrize("norm", ["bn", "brn"])
def test_engines_agree_exactly_in_float64(norm):
    # In float32 some initializations (seed 1 here, with bn) reach ~0.4%: over 4-sample batches a
    # ReLU or max-pool winner that flips on kernel rounding amplifies it; in float64 the engines
    # agree to ~1e-14: the same function.
    torch.manual_seed(1)
    assert_engines_agree(PDNet(3, 8, 10, m=1, norm=norm, bn_momentum=0.1),
                         LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5), float32=False,
                         sizes=(13, 20, 7), shape=(3, 8, 8))


# ----------------------------------------------------------------------------- dropout

def test_dropout_variant():
    torch.manual_seed(0)
    net = pdnet("NetA-Baseline", image_size=8, dropout=True)
    rates = {name: m.p for name, m in net.named_modules() if isinstance(m, nn.Dropout)}
    assert rates == {"D11": 0.2, "D21": 0.2, "D31": 0.2, "DF1": 0.5, "DF2": 0.5}
    assert count_parameters(net) == count_parameters(pdnet("NetA-Baseline", image_size=8))
    assert "D31" in dict(pdnet("NetC-Baseline", dropout=True).named_modules())
    deeper = [name for name, m in pdnet("NetA-Deeper", dropout=True).named_modules() if isinstance(m, nn.Dropout)]
    assert deeper == ["D11", "D12", "D21", "D22", "D31", "D32", "DF1", "DF2"]  # after every conv layer


def test_conv_dropout_comes_before_the_pooling():
    # The released code drops after each conv's ReLU, then max-pools (fl_noniid.py 205-246): the
    # hooks record the order of the calls and the shapes each module sees.
    net = pdnet("NetA-Baseline", image_size=8, dropout=True)
    calls = []
    for name, module in net.named_modules():
        if name in ("C11", "D11", "C21"):
            module.register_forward_hook(lambda mod, inp, out, name=name: calls.append((name, tuple(inp[0].shape))))
    net.train()(torch.randn(2, 3, 8, 8))
    # D11 sees C11's full-resolution output (8x8); C21 sees the pooled 4x4 maps.
    assert calls == [("C11", (2, 3, 8, 8)), ("D11", (2, 64, 8, 8)), ("C21", (2, 64, 4, 4))]
    x = torch.randn(4, 3, 8, 8)
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(net.train()(x))
    torch.testing.assert_close(runs[0], runs[1])
    assert not torch.allclose(runs[0], runs[2])
    net.eval()
    torch.testing.assert_close(net(x), net(x))
