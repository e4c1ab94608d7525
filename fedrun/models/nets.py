"""The FL papers' small models: FedNNNN's MNIST and CIFAR-10 CNNs (Tables 3-4), the FedLayerWise
CNN, the FedLap models (TensorFlow tutorial CNN, MLP), LEAF's FEMNIST CNN.  The parameter-divergence paper's
NetA/B/C and ResNets are in :mod:`fedrun.models.pd_nets`; the grouping of any model's parameters into
layers is :mod:`fedrun.models.layers`.

Every model takes ``in_channels``, ``image_size`` and ``num_classes`` (filled from the dataset
config), so any model runs on any image dataset.  PyTorch's default initialization is used, as in
the FedNNNN paper ("implemented using the PyTorch framework").
"""
from __future__ import annotations

import torch
from torch import nn

from fedrun.errors import ConfigError, check


INITS = ("torch", "keras")


def initialize(model: nn.Module, init: str) -> None:
    """``model.init``: ``torch``, PyTorch's default (He-uniform with a = sqrt(5), uniform biases),
    the FedNNNN paper's framework; ``keras``, Keras/TensorFlow's default for Conv2D and Dense
    layers: Glorot-uniform weights (U(+-sqrt(6 / (fan_in + fan_out))), fans counting the kernel's
    area as PyTorch's ``xavier_uniform_`` does) and zero biases, the framework of papers whose
    code is Keras (FedLayerWise's, FedAdp's)."""
    if init not in INITS:
        raise ConfigError("model.init", init, f"choose one of: {', '.join(INITS)}")
    if init == "keras":
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)


class MnistCNN(nn.Module):
    """Two 5x5 conv + pool blocks and two FC layers.

    Defaults: the FedNNNN MNIST CNN (Nagura et al., Table 3), 431,080 parameters on 28x28x1:
    Conv1 5x5 1->20, ReLU, maxpool 2 | Conv2 5x5 20->50, ReLU, maxpool 2 | Fc1 800->500, ReLU |
    Fc2 500->10.  All layers have biases (sec. 5.1).  ``channels=(32, 64), hidden=512`` is the
    FedLayerWise CNN (Lanjewar et al. sec. IV.A), 582,026 parameters.
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10,
                 channels: tuple[int, int] = (20, 50), hidden: int = 500, init: str = "torch"):
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(in_channels, c1, 5)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        side = ((image_size - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(c2 * side * side, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        initialize(self, init)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class SimpleCNN(nn.Module):
    """NIID-Bench's "simple-cnn" (Li, Diao, Chen, He, ICDE 2022, sec. V; ``SimpleCNNMNIST`` and
    ``SimpleCNN`` in its ``model.py``), LeNet-5's shape: Conv 5x5 6, ReLU, maxpool 2 | Conv 5x5 16,
    ReLU, maxpool 2 | FC 120, ReLU | FC 84, ReLU | FC 10 (valid padding, biases everywhere).
    44,426 parameters on 28x28x1 (MNIST, FashionMNIST: FC 256 -> 120), 62,006 on 32x32x3 (CIFAR-10,
    SVHN: FC 400 -> 120).
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10,
                 channels: tuple[int, int] = (6, 16), hidden: tuple[int, int] = (120, 84)):
        super().__init__()
        c1, c2 = channels
        h1, h2 = hidden
        self.conv1 = nn.Conv2d(in_channels, c1, 5)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        side = ((image_size - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(c2 * side * side, h1)
        self.fc2 = nn.Linear(h1, h2)
        self.fc3 = nn.Linear(h2, num_classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1))))))


class LeafCNN(nn.Module):
    """LEAF's FEMNIST CNN (Caldas et al., *LEAF: A Benchmark for Federated Settings*, 2018;
    ``models/femnist/cnn.py`` of github.com/TalwalkarLab/leaf): Conv 5x5 32 'same', ReLU, maxpool 2 |
    Conv 5x5 64 'same', ReLU, maxpool 2 | FC 3136->2048, ReLU | FC 2048->62.  6,603,710 parameters
    on 28x28x1 with 62 classes.

    TensorFlow's 'same' padding of a 5x5 kernel at stride 1 is 2 pixels on every side, PyTorch's
    ``padding=2``.  ``init="keras"`` (the default) is LEAF's: ``tf.layers.conv2d`` and ``dense``
    draw Glorot-uniform weights and zero biases (:func:`initialize`).
    """

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 62,
                 channels: tuple[int, int] = (32, 64), hidden: int = 2048, init: str = "keras"):
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(in_channels, c1, 5, padding=2)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=2)
        side = image_size // 2 // 2
        self.fc1 = nn.Linear(c2 * side * side, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        initialize(self, init)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class TFTutorialCNN(nn.Module):
    """The TensorFlow CNN tutorial's CIFAR-10 model, used by FedLap (sec. V.A): 122,570 parameters.

    Conv 3x3 32, ReLU, maxpool 2 | Conv 3x3 64, ReLU, maxpool 2 | Conv 3x3 64, ReLU |
    FC 1024->64, ReLU | FC 64->10 (valid padding, as in the tutorial).
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.conv3 = nn.Conv2d(64, 64, 3)
        side = ((image_size - 2) // 2 - 2) // 2 - 2
        self.fc1 = nn.Linear(64 * side * side, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.conv3(x))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class Cifar10CNN(nn.Module):
    """The FedNNNN CIFAR-10 CNN (Nagura et al., Table 4): 6 conv 3x3 with BatchNorm, 3 FC.

    [Conv 3x3 (pad 1) + BN + ReLU] x 2 then maxpool 2, for 32, 64 and 128 channels (layers named
    ``conv11 .. conv32`` and ``bn11 .. bn32`` as in the table); Fc1 128*4*4 -> 382, ReLU,
    Fc2 382 -> 192, ReLU, Fc3 192 -> 10.  1,146,088 parameters on 32x32x3 (1,145,192 without BN).
    ``batch_norm=False`` drops the BN layers (Table 1's "BN" column).
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32, num_classes: int = 10,
                 batch_norm: bool = True):
        super().__init__()
        self.blocks = []  # (conv name, bn name or None) in forward order
        c_in = in_channels
        for group, width in enumerate((32, 64, 128), start=1):
            for j in (1, 2):
                self.add_module(f"conv{group}{j}", nn.Conv2d(c_in, width, 3, padding=1))
                if batch_norm:
                    self.add_module(f"bn{group}{j}", nn.BatchNorm2d(width))
                self.blocks.append((f"conv{group}{j}", f"bn{group}{j}" if batch_norm else None))
                c_in = width
        side = image_size // 8
        self.fc1 = nn.Linear(128 * side * side, 382)
        self.fc2 = nn.Linear(382, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x):
        for i, (conv, bn) in enumerate(self.blocks):
            x = getattr(self, conv)(x)
            if bn is not None:
                x = getattr(self, bn)(x)
            x = torch.relu(x)
            if i % 2 == 1:
                x = torch.max_pool2d(x, 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


class MLP(nn.Module):
    """A multilayer perceptron on flattened images; ``hidden=[200]`` is FedLap's 2-layer MLP.
    ``batch_norm``: a BatchNorm after each hidden layer, before its ReLU (``bn1``, ``bn2``, ...: the
    layers FedBN keeps on its clients)."""

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10,
                 hidden: list[int] = (200,), batch_norm: bool = False):
        super().__init__()
        check(all(isinstance(h, int) and h >= 1 for h in hidden), "model.hidden", list(hidden),
              "each hidden layer needs >= 1 unit ([] for none: a linear model)")
        sizes = [in_channels * image_size * image_size, *hidden, num_classes]
        self.depth, self.batch_norm = len(sizes) - 1, bool(batch_norm)
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
            self.add_module(f"fc{i}", nn.Linear(a, b))
            if self.batch_norm and i < self.depth:
                self.add_module(f"bn{i}", nn.BatchNorm1d(b))

    def forward(self, x):
        x = x.flatten(1)
        for i in range(1, self.depth + 1):
            x = getattr(self, f"fc{i}")(x)
            if i < self.depth:
                x = torch.relu(getattr(self, f"bn{i}")(x) if self.batch_norm else x)
        return x


# ----------------------------------------------------------------------------- layers
