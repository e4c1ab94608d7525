"""Datasets as tensors on the run's device.

A loader returns :class:`RawData` (images as float tensors in [0, 1], shape ``[N, C, H, W]``, and
integer labels).  :func:`prepare` then carves the validation split, normalizes by the dataset's
per-channel mean and std (Nagura et al., sec. 5.1: "we normalized input images by subtracting
the mean and dividing by the standard deviation") and moves everything to the device once, so
local training indexes tensors instead of re-wrapping per-client DataLoaders every round.

Real loaders use torchvision with ``download`` where the network allows; MNIST and FashionMNIST
are also read straight from IDX files already on disk (``<root>/<MNIST|FashionMNIST>/raw``, the
Debian package ``dataset-fashion-mnist`` in ``/usr/share/datasets/fashion-mnist``, or any folder
listed in ``search``), compressed or not.
"""
from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrun.errors import ConfigError, DataError, check
from fedrun.seeding import torch_generator

IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


@dataclass
class RawData:
    """A dataset as loaded: images float32 in [0, 1] ``[N, C, H, W]``, labels int64 ``[N]``."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int


@dataclass
class FederatedData:
    """Normalized tensors on the run's device; ``val_*`` is None without a validation split."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    val_x: torch.Tensor | None
    val_y: torch.Tensor | None
    num_classes: int
    std: tuple[float, ...] | None = None  # the per-channel std the images were divided by


# ----------------------------------------------------------------------------- IDX files

def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzip-compressed or not, into a NumPy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    shape = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(name: str, folders: list[Path]) -> Path | None:
    for folder in folders:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _images(array: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, H, W]`` or ``[N, H, W, C]`` -> float32 ``[N, C, H, W]`` in [0, 1]."""
    x = torch.from_numpy(np.array(array, copy=True))
    if x.ndim == 3:
        x = x.unsqueeze(1)
    elif x.ndim == 4 and x.shape[-1] in (1, 3):
        x = x.permute(0, 3, 1, 2)
    return x.float().div_(255.0)


def _mnist_like(folder_name: str, torchvision_class: str, root: str, download: bool,
                search: list[str] | None, system_dirs: list[str]) -> RawData:
    root_path = Path(root).expanduser()
    folders = [root_path / folder_name / "raw", root_path]
    folders += [Path(s).expanduser() for s in (search or [])] + [Path(s) for s in system_dirs]
    files = {split: [_find(n, folders) for n in names] for split, names in IDX_FILES.items()}
    reason = "download disabled (dataset.download=false)"
    if not all(p for ps in files.values() for p in ps) and download:
        reason = "downloaded files not found"
        import torchvision

        try:
            for train in (True, False):
                getattr(torchvision.datasets, torchvision_class)(str(root_path), train=train,
                                                                 download=True)
        except Exception as e:  # noqa: BLE001 - any network or disk failure means "not here"
            reason = f"download failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        files = {split: [_find(n, folders) for n in names] for split, names in IDX_FILES.items()}
    if not all(p for ps in files.values() for p in ps):
        names = ", ".join(n for ns in IDX_FILES.values() for n in ns)
        where = ", ".join(str(f) for f in folders)
        raise DataError(f"{folder_name} not found: expected {names} (optionally .gz) in one of "
                        f"{where}; {reason}")
    (trx, try_), (tex, tey) = files["train"], files["test"]
    return RawData(_images(read_idx(trx)), torch.from_numpy(read_idx(try_).astype(np.int64)),
                   _images(read_idx(tex)), torch.from_numpy(read_idx(tey).astype(np.int64)), 10)


def mnist(root: str = "data", download: bool = True, search: list[str] | None = None) -> RawData:
    """MNIST (60,000 train / 10,000 test, 28x28 grey) from IDX files or torchvision's download."""
    return _mnist_like("MNIST", "MNIST", root, download, search, [])


def fashion_mnist(root: str = "data", download: bool = True,
                  search: list[str] | None = None) -> RawData:
    """FashionMNIST, also found where Debian's ``dataset-fashion-mnist`` package installs it."""
    return _mnist_like("FashionMNIST", "FashionMNIST", root, download, search,
                       ["/usr/share/datasets/fashion-mnist"])


def _torchvision_or_fail(make, expected: str):
    try:
        return make(True)
    except Exception:  # noqa: BLE001 - offline: fall back to the files already on disk
        pass
    try:
        return make(False)
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{expected}; {type(e).__name__}: {str(e).splitlines()[0][:160]}") from e


def cifar10(root: str = "data", download: bool = True) -> RawData:
    """CIFAR-10 (50,000 / 10,000, 32x32 RGB) through ``torchvision.datasets.CIFAR10``."""
    import torchvision

    expected = (f"CIFAR-10 not found: expected {Path(root) / 'cifar-10-batches-py'}/data_batch_1..5 "
                "and test_batch (the python version), and it could not be downloaded")
    sets = []
    for train in (True, False):
        make = lambda dl, train=train: torchvision.datasets.CIFAR10(  # noqa: E731
            root, train=train, download=dl and download)
        sets.append(_torchvision_or_fail(make, expected))
    tr, te = sets
    return RawData(_images(tr.data), torch.tensor(tr.targets, dtype=torch.int64),
                   _images(te.data), torch.tensor(te.targets, dtype=torch.int64), 10)


def svhn(root: str = "data", download: bool = True) -> RawData:
    """SVHN (73,257 / 26,032, 32x32 RGB) through ``torchvision.datasets.SVHN`` (needs scipy)."""
    import torchvision

    try:
        import scipy.io  # noqa: F401
    except ImportError as e:
        raise DataError("SVHN is stored as .mat files: pip install scipy (or fedrun[svhn])") from e
    expected = (f"SVHN not found: expected {Path(root)}/train_32x32.mat and test_32x32.mat, "
                "and they could not be downloaded")
    sets = []
    for split in ("train", "test"):
        make = lambda dl, split=split: torchvision.datasets.SVHN(  # noqa: E731
            root, split=split, download=dl and download)
        sets.append(_torchvision_or_fail(make, expected))
    tr, te = sets
    return RawData(_images(tr.data.transpose(0, 2, 3, 1)), torch.from_numpy(tr.labels.astype(np.int64)),
                   _images(te.data.transpose(0, 2, 3, 1)), torch.from_numpy(te.labels.astype(np.int64)),
                   10)


def idx(train_images: str, train_labels: str, test_images: str | None = None,
        test_labels: str | None = None, test_fraction: float = 0.2, split_seed: int = 0,
        num_classes: int | None = None) -> RawData:
    """Any IDX-format dataset; without test files a random ``test_fraction`` is held out.

    Used for the first 10,000 MNIST training images shipped beside this project
    (``dataset=mnist_train10k``), which have no test set of their own.
    """
    for setting, path in (("dataset.train_images", train_images), ("dataset.train_labels", train_labels),
                          ("dataset.test_images", test_images), ("dataset.test_labels", test_labels)):
        if path is not None and not Path(path).expanduser().is_file():
            raise DataError(f"{setting}: file {path} not found")
    x = _images(read_idx(Path(train_images).expanduser()))
    y = torch.from_numpy(read_idx(Path(train_labels).expanduser()).astype(np.int64))
    classes = num_classes or int(y.max()) + 1
    if test_images and test_labels:
        tx = _images(read_idx(Path(test_images).expanduser()))
        ty = torch.from_numpy(read_idx(Path(test_labels).expanduser()).astype(np.int64))
        return RawData(x, y, tx, ty, classes)
    check(0 < test_fraction < 1, "dataset.test_fraction", test_fraction, "must be in (0, 1)")
    perm = torch.randperm(len(y), generator=torch_generator(split_seed, "test_split"))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return RawData(x[train], y[train], x[test], y[test], classes)


def synthetic(num_train: int = 2000, num_test: int = 500, channels: int = 1, image_size: int = 28,
              num_classes: int = 10, noise: float = 1.0, seed: int = 0) -> RawData:
    """Learnable synthetic images of any shape: a random template per class plus Gaussian noise.

    ``x = template[y] + noise * N(0, 1)``; with ``noise`` around 1 a small CNN needs a few rounds
    to separate the classes, which makes tests and benchmarks exercise real learning.
    """
    check(num_classes >= 2, "dataset.num_classes", num_classes, "must be >= 2")
    check(num_train >= num_classes, "dataset.num_train", num_train, f"must be >= num_classes ({num_classes})")
    g = torch_generator(seed, "synthetic")
    templates = torch.rand(num_classes, channels, image_size, image_size, generator=g)

    def draw(n: int, split: str):
        gs = torch_generator(seed, "synthetic", split)
        y = torch.arange(n) % num_classes
        y = y[torch.randperm(n, generator=gs)]
        x = templates[y] + noise * torch.randn(n, channels, image_size, image_size, generator=gs)
        return x, y

    trx, tr_y = draw(num_train, "train")
    tex, te_y = draw(num_test, "test")
    return RawData(trx, tr_y, tex, te_y, num_classes)


# ----------------------------------------------------------------------------- preparation

def _subset(x, y, n, seed, name):
    if n is None or n >= len(y):
        return x, y
    idx_ = torch.randperm(len(y), generator=torch_generator(seed, name))[:n].sort().values
    return x[idx_], y[idx_]


def prepare(raw: RawData, mean: list[float] | None, std: list[float] | None,
            validation_fraction: float = 0.0, seed: int = 0, device: str | torch.device = "cpu",
            max_train: int | None = None, max_test: int | None = None) -> FederatedData:
    """Carve a validation split, normalize per channel, and move to ``device``.

    Args:
      raw: the loaded dataset.
      mean, std: per-channel statistics; None computes them from the (remaining) training images.
      validation_fraction: share of the training images held out for tuning, as the FedNNNN
        appendix does ("divide the training dataset into two datasets"); 0 disables it.
      seed: the run's seed (the validation split derives from it).
      max_train, max_test: keep a random subset (the smoke scale).
    """
    check(0 <= validation_fraction < 1, "hyperparams.validation_fraction", validation_fraction,
          "must be in [0, 1)")
    train_x, train_y = _subset(raw.train_x, raw.train_y, max_train, seed, "max_train")
    test_x, test_y = _subset(raw.test_x, raw.test_y, max_test, seed, "max_test")
    val_x = val_y = None
    if validation_fraction > 0:
        perm = torch.randperm(len(train_y), generator=torch_generator(seed, "validation"))
        n_val = max(int(round(validation_fraction * len(train_y))), 1)
        val, keep = perm[:n_val].sort().values, perm[n_val:].sort().values
        val_x, val_y, train_x, train_y = train_x[val], train_y[val], train_x[keep], train_y[keep]
    if mean is None or std is None:
        dims = (0, 2, 3)
        mean, std = train_x.mean(dims).tolist(), train_x.std(dims).tolist()
    channels = train_x.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ConfigError("dataset.mean/std", f"{list(mean)}/{list(std)}",
                          f"need one value per channel ({channels})")
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    def norm(x):
        return None if x is None else ((x - m) / s).to(device)

    def to(y):
        return None if y is None else y.to(device)

    return FederatedData(norm(train_x), to(train_y), norm(test_x), to(test_y), norm(val_x), to(val_y),
                         raw.num_classes, tuple(float(v) for v in std))
