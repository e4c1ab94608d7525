"""The parameter-divergence paper's networks: the NetA/NetB/NetC family and CIFAR ResNet-14/20.

Appendix A.1 (Figure 6, Table 3) defines one CNN template with four knobs: n conv layers per
group (depth), 16 m channels in the first group (width), the pooling after the last conv layer
(the width of F1's input) and the FC stack (v layers, 256 u units in F1).  Table 5 adds
ResNet-14 and ResNet-20 (He et al. 2016).  All are initialized as in Appendix A.2
(:func:`he_truncated_normal_`).  Normalization layers are those of :mod:`fedrun.models.batchnorm`,
whose running statistics average across clients as in the paper's footnote 8.

Every model takes ``in_channels``, ``image_size`` and ``num_classes`` (from the dataset config);
modules are named as in the paper's figures (``C11 .. C3n``, ``F1 .. Fv``) so ``layers.csv``
and the per-layer divergence plots use the paper's labels.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from fedrun.models.batchnorm import BatchRenorm1d, BatchRenorm2d, FederatedBatchNorm, FederatedBatchNorm1d, FederatedBatchNorm2d
from fedrun.errors import check

NORMS = {"none": None, "bn": (FederatedBatchNorm1d, FederatedBatchNorm2d), "brn": (BatchRenorm1d, BatchRenorm2d)}
POOLINGS = ("max2", "max4", "avg")


def make_norm(norm: str, features: int, dims: int, momentum: float) -> nn.Module | None:
    """The normalization after a layer: None, federated BN or BRN over 1-D (FC) or 2-D (conv) inputs."""
    check(norm in NORMS, "model.norm", norm, f"must be one of {', '.join(NORMS)}")
    if NORMS[norm] is None:
        return None
    return NORMS[norm][dims - 1](features, momentum=momentum)


def same_max_pool(x: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """Max pooling with TensorFlow's ``padding="SAME"``: ceil(side / stride) outputs per side.

    TF pads ``max((ceil(H/s) - 1) s + k - H, 0)`` positions in all, the extra one (odd total) at
    the bottom/right, and ignores the padding in the max.  ``nn.MaxPool2d(3, 2, padding=1)`` has
    the same output size but pads one on each side, which shifts every window by one on even
    sides; here the padding is TF's (with -inf, so it never wins the max).
    """
    pads = []
    for side in (x.shape[-1], x.shape[-2]):  # F.pad lists the last dimension first
        total = max((math.ceil(side / stride) - 1) * stride + kernel - side, 0)
        pads += [total // 2, total - total // 2]
    if any(pads):
        x = F.pad(x, pads, value=float("-inf"))
    return F.max_pool2d(x, kernel, stride)


# ----------------------------------------------------------------------------- NetA / NetB / NetC

class PDNet(nn.Module):
    """The paper's CNN template (Appendix A.1, Figure 6, Table 3).

    Three groups of n 3x3 conv layers ("same" padding, ReLU) with 16 m, 128 and 256 channels.
    Groups 1 and 2 end with 3x3 max pooling, stride 2; group 3 with 3x3 max pooling, stride 2
    (``pooling="max2"``) or 4 (``"max4"``), or global average pooling (``"avg"``); all max pooling
    is TensorFlow's "SAME" (:func:`same_max_pool`), so 32x32 inputs go 32 -> 16 -> 8 -> 4 | 2 | 1
    and 28x28 inputs 28 -> 14 -> 7 -> 4 | 2 | 1: F1 sees 4096, 1024 or 256 features either way.
    The FC stack is v = 3 layers with 256 u, 256, num_classes outputs (ReLU on the hidden ones)
    or v = 1 layer with num_classes outputs; softmax is in the loss.

    Module names follow the paper's figures (Appendix C): conv layer j of group i is ``C{i}{j}``,
    FC layer j is ``F{j}``; the normalization after ``C{i}{j}`` is ``BN{i}{j}`` and after ``F{j}``
    ``BNF{j}`` (whatever ``norm`` is); dropout modules are ``D{i}{j}`` and ``DF{j}``.

    Normalization (``norm="bn"`` federated Batch Normalization, ``"brn"`` Batch Renormalization,
    :mod:`fedrun.models.batchnorm`): after every conv layer and every hidden FC layer, before the
    ReLU, as in Ioffe & Szegedy (2015) who normalize every nonlinearity's input; the paper only
    says BN "is employed to the baseline", and normalizing the FC layers too is what makes F1/F2
    (the layers whose divergence it plots) subject to it.  The output layer is not normalized.
    A normalized layer has no bias (the BN shift replaces it; its gradient would be 0).

    Dropout (``dropout=True``; Appendix C.7: "rates 0.2 and 0.5 for convolutional layers and
    fully-connected layers"): Dropout(0.2) after the ReLU of every conv layer, before the pooling
    (``D{i}{j}``), and Dropout(0.5) after the ReLU of each hidden FC layer (``DF1``, ``DF2``; none
    when v = 1), where the paper's released code puts them (fl-noniid/fl-noniid, fl_noniid.py
    lines 205-266: ``tf.layers.dropout`` right after each ``tf.nn.relu``).  (The batched engine
    draws each client's masks independently; with dropout it agrees with the sequential engine in
    distribution, not bitwise.)

    Args:
      in_channels, image_size, num_classes: from the dataset.
      n: conv layers per group (1 baseline, 2 Deeper, 3 Deepest).
      m: the first group has 16 m channels (4 baseline, 2 Narrower, 1 Narrowest).
      pooling: after the last conv layer: "max2", "max4" or "avg".
      v: FC layers, 3 or 1.
      u: F1 has 256 u outputs (v = 3 only).
      norm: "none", "bn" or "brn".
      dropout: add the dropout layers above.
      bn_momentum: the normalization's moving-average rate (PyTorch convention; 0.01 = TF decay 0.99).
      init: the He std of the other layers (:func:`he_truncated_normal_`): ``authors`` (the
        released code's: fan-out for convs, sqrt(1 / fan_in) for hidden FC layers) or ``fan_in``.
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_classes: int = 10,
                 n: int = 1, m: int = 4, pooling: str = "max2", v: int = 3, u: int = 2,
                 norm: str = "none", dropout: bool = False, bn_momentum: float = 0.01, init: str = "authors"):
        super().__init__()
        check(n >= 1, "model.n", n, "must be >= 1")
        check(m >= 1, "model.m", m, "must be >= 1")
        check(pooling in POOLINGS, "model.pooling", pooling, f"must be one of {', '.join(POOLINGS)}")
        check(v in (1, 3), "model.v", v, "must be 3 (256u-256-classes) or 1 (classes)")
        check(u >= 1, "model.u", u, "must be >= 1")
        self.n, self.pooling, self.v = n, pooling, v
        normed = norm != "none"
        c_in = in_channels
        for i, width in enumerate((16 * m, 128, 256), start=1):
            for j in range(1, n + 1):
                self.add_module(f"C{i}{j}", nn.Conv2d(c_in, width, 3, padding=1, bias=not normed))
                if normed:
                    self.add_module(f"BN{i}{j}", make_norm(norm, width, 2, bn_momentum))
                if dropout:
                    self.add_module(f"D{i}{j}", nn.Dropout(0.2))
                c_in = width
        side = math.ceil(math.ceil(image_size / 2) / 2)
        side = 1 if pooling == "avg" else math.ceil(side / int(pooling[3:]))
        sizes = [256 * side * side, *((256 * u, 256) if v == 3 else ()), num_classes]
        for j, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
            hidden = j < v
            self.add_module(f"F{j}", nn.Linear(a, b, bias=not (hidden and normed)))
            if hidden and normed:
                self.add_module(f"BNF{j}", make_norm(norm, b, 1, bn_momentum))
            if hidden and dropout:
                self.add_module(f"DF{j}", nn.Dropout(0.5))
        # Appendix A.2: std 0.05 for the first conv group and the last FC layer.
        self.fixed_std_layers = tuple(f"C1{j}" for j in range(1, n + 1)) + (f"F{v}",)
        self.init_rule = init
        he_truncated_normal_(self)

    def _maybe(self, name: str, x: torch.Tensor) -> torch.Tensor:
        module = getattr(self, name, None)
        return x if module is None else module(x)

    def forward(self, x):
        for i in (1, 2, 3):
            for j in range(1, self.n + 1):
                x = self._maybe(f"D{i}{j}", torch.relu(self._maybe(f"BN{i}{j}", getattr(self, f"C{i}{j}")(x))))
            if i < 3 or self.pooling != "avg":
                x = same_max_pool(x, 3, 2 if i < 3 else int(self.pooling[3:]))
            else:
                x = x.mean((2, 3))
        x = x.flatten(1)
        for j in range(1, self.v):
            x = self._maybe(f"DF{j}", torch.relu(self._maybe(f"BNF{j}", getattr(self, f"F{j}")(x))))
        return getattr(self, f"F{self.v}")(x)


# Table 3 (NetA-Baseline is listed twice there: once per family of NetA variants).
VARIANTS: dict[str, dict] = {
    "NetA-Baseline": dict(n=1, m=4, pooling="max2", v=3, u=2),
    "NetA-Deeper": dict(n=2, m=4, pooling="max2", v=3, u=2),
    "NetA-Deepest": dict(n=3, m=4, pooling="max2", v=3, u=2),
    "NetA-Narrowest": dict(n=1, m=1, pooling="max2", v=3, u=2),
    "NetA-Narrower": dict(n=1, m=2, pooling="max2", v=3, u=2),
    "NetB-Baseline": dict(n=1, m=4, pooling="avg", v=3, u=1),
    "NetB-Wider": dict(n=1, m=4, pooling="max4", v=3, u=1),
    "NetB-Widest": dict(n=1, m=4, pooling="max2", v=3, u=1),
    "NetC-Baseline": dict(n=1, m=4, pooling="avg", v=1, u=1),
    "NetC-Wider": dict(n=1, m=4, pooling="max4", v=1, u=1),
    "NetC-Widest": dict(n=1, m=4, pooling="max2", v=1, u=1),
}


def pdnet(variant: str, **kwargs) -> PDNet:
    """A Table 3 variant by name (``pdnet("NetA-Deeper", norm="bn")``); kwargs override."""
    check(variant in VARIANTS, "model.variant", variant, f"must be one of {', '.join(VARIANTS)}")
    return PDNet(**{**VARIANTS[variant], **kwargs})


# ----------------------------------------------------------------------------- ResNet-14 / 20

class BasicBlock(nn.Module):
    """He et al. (2016) basic block: conv3x3-norm-ReLU-conv3x3-norm, + shortcut, ReLU.

    The shortcut is option A: the identity, subsampled (``x[:, :, ::2, ::2]``) and zero-padded
    with the new channels where the block halves the side and widens; it has no parameters, so
    the network keeps the paper's 13 / 19 conv layers (Table 5).
    """

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, bn_momentum: float):
        super().__init__()
        normed = norm != "none"
        self.stride, self.extra = stride, c_out - c_in
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=not normed)
        self.bn1 = make_norm(norm, c_out, 2, bn_momentum) or nn.Identity()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=not normed)
        self.bn2 = make_norm(norm, c_out, 2, bn_momentum) or nn.Identity()

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1:
            shortcut = shortcut[:, :, :: self.stride, :: self.stride]
        if self.extra:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.extra))
        return torch.relu(out + shortcut)


class CifarResNet(nn.Module):
    """He et al. (2016, sec. 4.2) CIFAR ResNet with 6 b + 2 layers: ResNet-14 (b = 2), ResNet-20 (b = 3).

    ``conv1`` (3x3, 16) + ``bn1`` + ReLU, then three stages of b basic blocks with 16, 32, 64
    channels (the first block of stages 2 and 3 has stride 2), global average pooling and one FC
    layer ``fc``: 6 b + 1 conv layers and 1 FC (13 + 1, 19 + 1; the paper's Table 5 note).
    Blocks are ``stage{s}.block{k}`` with ``conv1, bn1, conv2, bn2``; shortcuts are option A
    (:class:`BasicBlock`).  Normalization is the federated Batch Normalization (footnote 8) by
    default; ``norm="brn"`` or ``"none"`` (conv layers then have biases) as for :class:`PDNet`.

    Initialization (:func:`he_truncated_normal_`): std 0.05 for the first conv group, taken as
    He et al.'s first group, the 1 + 2 b conv layers at the input resolution (``conv1`` and
    stage 1), like PDNet's group 1 (the layers before the first downsampling), and for ``fc``.
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_classes: int = 10,
                 depth: int = 20, norm: str = "bn", bn_momentum: float = 0.01):
        super().__init__()
        check(depth >= 8 and (depth - 2) % 6 == 0, "model.depth", depth, "must be 6 b + 2 (14, 20, 32, ...)")
        blocks = (depth - 2) // 6
        normed = norm != "none"
        self.image_size = image_size  # global average pooling: any size works
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=not normed)
        self.bn1 = make_norm(norm, 16, 2, bn_momentum) or nn.Identity()
        c_in = 16
        for s, width in enumerate((16, 32, 64), start=1):
            stage = OrderedDict()
            for k in range(1, blocks + 1):
                stage[f"block{k}"] = BasicBlock(c_in, width, 2 if (s > 1 and k == 1) else 1, norm, bn_momentum)
                c_in = width
            self.add_module(f"stage{s}", nn.Sequential(stage))
        self.fc = nn.Linear(64, num_classes)
        stage1 = (f"stage1.block{k}.conv{c}" for k in range(1, blocks + 1) for c in (1, 2))
        self.fixed_std_layers = ("conv1", *stage1, "fc")
        he_truncated_normal_(self)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.stage3(self.stage2(self.stage1(x)))
        return self.fc(x.mean((2, 3)))


# ----------------------------------------------------------------------------- initialization

INIT_RULES = ("fan_in", "authors")


def he_truncated_normal_(model: nn.Module, fixed: Iterable[str] | None = None,
                         fixed_std: float = 0.05, rule: str | None = None) -> nn.Module:
    """Appendix A.2: truncated normal, mean 0, He std; std 0.05 for the first conv group and last FC.

    Every conv and FC weight is drawn from N(0, s^2) truncated to [-2 s, 2 s] (TensorFlow's
    ``truncated_normal(stddev=s)``), with s = ``fixed_std`` for the modules named in ``fixed``
    (default: the model's ``fixed_std_layers``) and otherwise, by ``rule`` (default: the model's
    ``init_rule``, else ``fan_in``):

    * ``fan_in``: s = sqrt(2 / fan_in) for every layer (He et al. 2015; fan_in = C_in k^2 for a
      conv layer, the input size for an FC layer);
    * ``authors``: what the paper's released code does (fl-noniid/fl-noniid, fl_noniid.py
      lines 554-596, ``_conv`` and ``_fc``): s = sqrt(2 / (k^2 C_out)) for a conv layer (He's
      fan-out form) and s = sqrt(1 / fan_in) for a hidden FC layer.  The paper says only "based
      on He et al."; this rule is the one that produced its tables.

    As in TF, s is the distribution's parameter: truncation at 2 s leaves a standard deviation of
    0.8796 s (Keras' ``he_normal`` would divide s by 0.8796; neither the paper nor its code does).
    Biases are 0; normalization layers get scale 1, shift 0 (and fresh running statistics).
    """
    fixed = set(getattr(model, "fixed_std_layers", ()) if fixed is None else fixed)
    rule = rule or getattr(model, "init_rule", "fan_in")
    check(rule in INIT_RULES, "model.init", rule, f"choose one of: {', '.join(INIT_RULES)}")
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (nn.modules.conv._ConvNd, nn.Linear)):
                std = fixed_std if name in fixed else _he_std(module, rule)
                nn.init.trunc_normal_(module.weight, 0.0, std, -2 * std, 2 * std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, (FederatedBatchNorm, nn.modules.batchnorm._NormBase)):
                module.reset_parameters()
    return model


def _he_std(module: nn.Module, rule: str) -> float:
    fan_in = module.weight[0].numel()
    if rule == "fan_in":
        return math.sqrt(2.0 / fan_in)
    if isinstance(module, nn.modules.conv._ConvNd):  # k^2 C_out: the fan-out
        return math.sqrt(2.0 / (module.weight[0, 0].numel() * module.out_channels))
    return math.sqrt(1.0 / fan_in)
