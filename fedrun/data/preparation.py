"""Preparation of a loaded dataset for a run: a class-balanced pool, a validation split, a subset,
normalization (per channel, or per image as TensorFlow), and the tensors moved to the run's
device once (:func:`prepare` -> :class:`FederatedData`), so local training indexes tensors
instead of re-wrapping per-client DataLoaders every round.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import numpy as np
import torch

from fedrun.data.datasets import RawData
from fedrun.errors import ConfigError, DataError, check
from fedrun.seeding import torch_generator


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
    train_groups: torch.Tensor | None = None  # natural clients: each training example's client id (CPU)
    test_groups: torch.Tensor | None = None  # and each test example's


# ----------------------------------------------------------------------------- preparation

def _subset(n_all: int, n, seed, name) -> torch.Tensor | None:
    """A random subset of ``n`` of ``n_all`` examples (sorted indices), or None for all."""
    if n is None or n >= n_all:
        return None
    return torch.randperm(n_all, generator=torch_generator(seed, name))[:n].sort().values


def _take(tensors: tuple, keep: torch.Tensor | None) -> tuple:
    """Rows ``keep`` of every tensor (None stays None; ``keep`` None: all)."""
    return tuple(t if t is None or keep is None else t[keep] for t in tensors)


NORMALIZATIONS = ("per_channel", "per_image", "per_feature")


def per_image_standardization(x: torch.Tensor) -> torch.Tensor:
    """TensorFlow's ``tf.image.per_image_standardization`` of ``[N, C, H, W]`` images in [0, 1]:
    each image minus its mean over all pixels and channels, divided by
    ``max(std, 1 / sqrt(C H W))``.  TF applies it to pixels in [0, 255], where the floor is
    ``1 / sqrt(C H W)``; on the [0, 1] scale used here the same floor is that divided by 255."""
    flat = x.flatten(1)
    mean = flat.mean(1)
    floor = 1.0 / (255.0 * math.sqrt(flat.shape[1]))
    std = flat.std(1, unbiased=False).clamp_min(floor)
    return (x - mean.view(-1, 1, 1, 1)) / std.view(-1, 1, 1, 1)


def feature_statistics(train_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each feature's (each value's of ``[C, H, W]``) mean and standard deviation over the
    training rows, as scikit-learn's ``StandardScaler`` computes them: the population std
    (``ddof=0``), 1 for a feature without variance (a constant column, the zero padding of a
    table), so it is centred and not scaled.  Shaped ``[1, C, H, W]``."""
    mean = train_x.mean(0, keepdim=True)
    std = train_x.std(0, unbiased=False, keepdim=True)
    return mean, torch.where(std > 0, std, torch.ones_like(std))


def first_per_class(x: torch.Tensor, y: torch.Tensor, per_class: int, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``per_class`` training images of every class, in file order (as the
    parameter-divergence paper's code takes them: a class-balanced 10 x 5,000 pool)."""
    keep = _first_per_class_rows(y, per_class, num_classes)
    return x[keep], y[keep]


def _first_per_class_rows(y: torch.Tensor, per_class: int, num_classes: int) -> torch.Tensor:
    """The rows of :func:`first_per_class`; a class short of images is a one-line error."""
    counts = torch.bincount(y, minlength=num_classes)
    short = [c for c in range(num_classes) if counts[c] < per_class]
    if short:
        have = ", ".join(f"class {c}: {int(counts[c]):,}" for c in short)
        raise ConfigError("dataset.per_class", per_class, f"the training set has fewer images of some classes "
                          f"({have}); use at most {int(counts.min())}, or add training images (SVHN: "
                          "dataset.load.extra=10000 adds the first 10,000 of its extra set, as the paper's code does)")
    return torch.cat([torch.nonzero(y == c).flatten()[:per_class] for c in range(num_classes)]).sort().values


def prepare(raw: RawData, mean: list[float] | None, std: list[float] | None,
            validation_fraction: float = 0.0, seed: int = 0, device: str | torch.device = "cpu",
            max_train: int | None = None, max_test: int | None = None, normalize: str = "per_channel",
            per_class: int | None = None) -> FederatedData:
    """Keep a class-balanced pool, carve a validation split, normalize, and move to ``device``.

    Args:
      raw: the loaded dataset.
      mean, std: per-channel statistics; None computes them from the (remaining) training images.
      validation_fraction: share of the training images held out for tuning, as the FedNNNN
        appendix does ("divide the training dataset into two datasets"); 0 disables it.
      seed: the run's seed (the validation split derives from it).
      max_train, max_test: keep a random subset (the smoke scale).
      normalize: ``per_channel`` (``(x - mean_c) / std_c``, the papers' "subtracting the mean
        and dividing by the standard deviation"), ``per_image``
        (:func:`per_image_standardization` of every image, what the parameter-divergence paper's
        code feeds its networks; ``mean``/``std`` are then unused) or ``per_feature`` (every
        value standardized by its own mean and std over the training rows,
        :func:`feature_statistics`: a table's columns, as scikit-learn's ``StandardScaler``;
        ``mean``/``std`` must be null).
      per_class: keep only the first ``per_class`` training images of each class
        (:func:`first_per_class`); None keeps all.
    """
    _check_settings(validation_fraction, max_train, max_test, normalize, per_class, mean, std)
    train, test = _pool(raw, per_class, max_train, max_test, seed)
    (train_x, train_y, train_groups), (val_x, val_y, _) = _split_validation(train, validation_fraction, seed)
    test_x, test_y, test_groups = test
    groups = dict(train_groups=train_groups, test_groups=test_groups)
    if normalize == "per_image":
        def standardized(x):
            return None if x is None else per_image_standardization(x).to(device)

        def on_device(y):
            return None if y is None else y.to(device)

        return FederatedData(standardized(train_x), on_device(train_y), standardized(test_x), on_device(test_y),
                             standardized(val_x), on_device(val_y), raw.num_classes, None, **groups)
    if normalize == "per_feature":
        m, s = feature_statistics(train_x)

        def scaled(x):
            return None if x is None else ((x - m) / s).to(device)

        def moved(y):
            return None if y is None else y.to(device)

        return FederatedData(scaled(train_x), moved(train_y), scaled(test_x), moved(test_y), scaled(val_x),
                             moved(val_y), raw.num_classes, None, **groups)
    mean, std = _channel_statistics(train_x, mean, std)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    def norm(x):
        return None if x is None else ((x - m) / s).to(device)

    def to(y):
        return None if y is None else y.to(device)

    return FederatedData(norm(train_x), to(train_y), norm(test_x), to(test_y), norm(val_x), to(val_y),
                         raw.num_classes, tuple(float(v) for v in std), **groups)


def _check_settings(validation_fraction, max_train, max_test, normalize, per_class, mean, std) -> None:
    """Every setting of :func:`prepare` in range, each a one-line error naming it."""
    check(normalize in NORMALIZATIONS, "dataset.normalize", normalize, f"choose one of: {', '.join(NORMALIZATIONS)}")
    for setting, values in (("dataset.mean", mean), ("dataset.std", std)):
        check(normalize != "per_feature" or values is None, setting, None if values is None else list(values),
              "must be null with dataset.normalize=per_feature (each feature's own, from the training rows)")
    check(per_class is None or (isinstance(per_class, int) and per_class >= 1), "dataset.per_class", per_class,
          "must be an integer >= 1, or null for all the training images")
    check(0 <= validation_fraction < 1, "hyperparams.validation_fraction", validation_fraction,
          "must be in [0, 1)")
    for setting, n in (("dataset.max_train", max_train), ("dataset.max_test", max_test)):
        check(n is None or (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1),
              setting, n, "must be >= 1 or null")
    for setting, values in (("dataset.mean", mean), ("dataset.std", std)):
        if values is None:
            continue
        numbers = all(isinstance(v, Real) and not isinstance(v, bool) for v in values)
        if setting == "dataset.std":
            check(numbers and all(math.isfinite(v) and v > 0 for v in values), setting, list(values),
                  "must be > 0, one per channel (or null to compute it from the training images)")
        else:
            check(numbers and all(math.isfinite(v) for v in values), setting, list(values),
                  "must be finite numbers, one per channel (or null to compute it)")


def _pool(raw: RawData, per_class, max_train, max_test, seed):
    """The examples a run uses: the class-balanced pool (``per_class``), then the random subsets
    (``max_train``, ``max_test``): ``(train_x, train_y, train_groups), (test_x, test_y,
    test_groups)``, the client ids (None without natural clients) kept beside their examples."""
    train = (raw.train_x, raw.train_y, raw.train_groups)
    if per_class is not None:
        train = _take(train, _first_per_class_rows(raw.train_y, per_class, raw.num_classes))
    train = _take(train, _subset(len(train[1]), max_train, seed, "max_train"))
    test = (raw.test_x, raw.test_y, raw.test_groups)
    test = _take(test, _subset(len(test[1]), max_test, seed, "max_test"))
    return train, test


def _split_validation(train: tuple, validation_fraction: float, seed: int):
    """The validation split, drawn from (seed, "validation"): ``(train_x, train_y, train_groups),
    (val_x, val_y, val_groups)`` (the second all None without one)."""
    train_y = train[1]
    if not validation_fraction > 0:
        return train, (None, None, None)
    perm = torch.randperm(len(train_y), generator=torch_generator(seed, "validation"))
    n_val = max(int(round(validation_fraction * len(train_y))), 1)
    check(n_val < len(train_y), "hyperparams.validation_fraction", validation_fraction,
          f"holds out {n_val} of the {len(train_y)} training images; must leave at least one "
          f"(below {(len(train_y) - 0.5) / len(train_y):.3g} here)" if len(train_y) > 1 else
          "cannot split 1 training image into training and validation; use 0")
    val, keep = perm[:n_val].sort().values, perm[n_val:].sort().values
    return _take(train, keep), _take(train, val)


def _channel_statistics(train_x, mean, std) -> tuple[list[float], list[float]]:
    """The per-channel mean and std to normalize by: the given ones, else the training images'
    (a channel without variance is a one-line error), one per channel."""
    if mean is None or std is None:
        dims = (0, 2, 3)
        mean, std = train_x.mean(dims).tolist(), train_x.std(dims).tolist()
        for c, s in enumerate(std):
            if not s > 0:  # 0, or NaN from a single pixel
                raise DataError(f"dataset: channel {c} of the training images has no variance (every "
                                f"pixel is {mean[c]:.4g}), so it cannot be normalized by its std; set "
                                f"dataset.std (and dataset.mean) to values > 0, one per channel")
    channels = train_x.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ConfigError("dataset.mean/std", f"{list(mean)}/{list(std)}",
                          f"need one value per channel ({channels})")
    return mean, std
