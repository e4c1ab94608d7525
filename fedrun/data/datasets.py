"""Datasets as tensors on the run's device.

A loader returns :class:`RawData` (images as float tensors in [0, 1], shape ``[N, C, H, W]``, and
integer labels).  :func:`fedrun.data.preparation.prepare` then carves the validation split, normalizes by the dataset's
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
import logging
import math
import re
import struct
import zlib
from dataclasses import MISSING, dataclass, fields
from typing import Any, Union
from pathlib import Path

import numpy as np
import torch

from fedrun.errors import ConfigError, DataError, check
from fedrun.seeding import torch_generator

log = logging.getLogger(__name__)

IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


@dataclass
class DatasetConfig:
    """A dataset config (``conf/dataset/<name>.yaml``, or a file of one's own): what it must say
    (the fields without a default) and what it may (the rest, with fedrun's defaults)."""

    name: str  # the dataset's name (file labels, augmentation presets)
    load: Any  # the loader: a node whose _target_ returns RawData
    channels: int  # image channels (1 grey, 3 RGB)
    image_size: int  # square images: height = width
    num_classes: int  # the labels' count: labels are 0 .. num_classes - 1
    mean: Union[list[float], None] = None  # per-channel mean to subtract; null: from the training images
    std: Union[list[float], None] = None  # per-channel std to divide by; null: from the training images
    max_train: Union[int, None] = None  # keep a random subset of the training set
    max_test: Union[int, None] = None  # keep a random subset of the test set
    normalize: str = "per_channel"  # per_channel ((x - mean) / std) | per_image (TF per_image_standardization) | per_feature (each value its own, as StandardScaler)
    per_class: Union[int, None] = None  # keep the first n training images of each class
    label: Union[str, None] = None  # the name titles, tables, run.json and dashboards show; null: from name

    @classmethod
    def required(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.default is MISSING]

    @classmethod
    def defaults(cls) -> dict:
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


@dataclass
class RawData:
    """A dataset as loaded: images float32 in [0, 1] ``[N, C, H, W]``, labels int64 ``[N]``; for
    data with natural clients (LEAF's FEMNIST writers, a table's user column), each example's
    client id, int64 ``[N]`` (ids 0 .. n-1, shared by the two splits), which ``partition=natural``
    keeps as the clients."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    train_groups: torch.Tensor | None = None
    test_groups: torch.Tensor | None = None

    def __post_init__(self):
        for split, x, y in (("training", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if len(x) != len(y):
                raise DataError(f"dataset: the {split} set has {len(x):,} images but {len(y):,} labels")
            if len(x) == 0:
                raise DataError(f"dataset: the {split} set has no image (it needs at least one)")
        for split, y, groups in (("training", self.train_y, self.train_groups), ("test", self.test_y, self.test_groups)):
            if groups is not None and len(groups) != len(y):
                raise DataError(f"dataset: the {split} set has {len(y):,} labels but {len(groups):,} client ids")


# ----------------------------------------------------------------------------- errors

def _first_line(e: BaseException, limit: int = 160) -> str:
    """``Type: first line`` of an exception (two lines where the first ends with a colon)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    # torchvision's advice to download is wrong where fedrun already tried (or was told not to).
    text = re.sub(r"\s*You can use download=True to download it\.?", "", text).strip()
    return f"{type(e).__name__}: {text[:limit]}" if text else type(e).__name__


def _span(y: torch.Tensor) -> tuple[int, int]:
    return int(y.min()), int(y.max())


def _check_range(y: torch.Tensor, num_classes: int, where, setting: str | None = None) -> None:
    """DataError unless ``y`` is in ``0..num_classes-1``; ``setting`` names where the count comes
    from (None: the dataset's fixed classes)."""
    if len(y) == 0:
        return
    lo, hi = _span(y)
    if lo < 0 or hi >= num_classes:
        said = f"{setting}={num_classes}" if setting else f"the dataset has {num_classes} classes"
        raise DataError(f"{where}: labels span {lo}..{hi} but {said} (the labels must be "
                        f"0..{num_classes - 1})")


def check_labels(raw: RawData, num_classes: int, where: str = "dataset",
                 setting: str = "dataset.num_classes") -> None:
    """Raise :class:`DataError` unless every train and test label is in ``0..num_classes-1``.

    ``where`` starts the message (the dataset or a file), ``setting`` names the class count, e.g.
    ``dataset: labels span 0..12 but dataset.num_classes=10 (the labels must be 0..9)``.
    """
    check(isinstance(num_classes, (int, np.integer)) and not isinstance(num_classes, bool)
          and num_classes >= 1, setting, num_classes, "must be an integer >= 1")
    _check_range(torch.cat([raw.train_y.flatten(), raw.test_y.flatten()]), num_classes, where, setting)


# ----------------------------------------------------------------------------- IDX files

_IDX_TYPES = {0x08: "unsigned byte", 0x09: "signed byte", 0x0B: "short", 0x0C: "int", 0x0D: "float",
              0x0E: "double"}


def _read_bytes(path: Path) -> tuple[bytes, bool]:
    """The file's bytes, gunzipped when it is gzip data (whatever its name); and whether it was."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or _first_line(e)})") from None
    if data[:2] != b"\x1f\x8b":
        return data, False
    try:
        return gzip.decompress(data), True
    except (gzip.BadGzipFile, EOFError, zlib.error, OSError) as e:
        raise DataError(f"{path}: corrupt or truncated gzip file ({_first_line(e)})") from None


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzip-compressed or not, into a NumPy array.

    Raises :class:`DataError` naming the file for anything but a whole unsigned-byte IDX file:
    empty, truncated, trailing bytes, a corrupt gzip stream, another format.
    """
    path = Path(path)
    data, gz = _read_bytes(path)
    unzipped = " after decompression" if gz else ""
    if not data:
        raise DataError(f"{path}: empty{unzipped}, not an IDX file")
    if len(data) < 4:
        raise DataError(f"{path}: too short for an IDX file ({len(data)} bytes{unzipped}; "
                        "the header alone needs at least 8)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code not in _IDX_TYPES or ndim == 0:
        named = " (and its .gz name notwithstanding, not gzip data)" if path.suffix == ".gz" and not gz else ""
        raise DataError(f"{path}: not an IDX file{named}: it starts with {data[:4].hex()}, an IDX file "
                        "with 00 00, a type byte and the number of dimensions (00000803 for images)")
    if dtype_code != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()}: "
                        f"{_IDX_TYPES[dtype_code]} values; only unsigned bytes, type 0x08, are read)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header: {ndim} dimensions need {header} bytes but the "
                        f"file has {len(data)}{unzipped}")
    shape = struct.unpack(">" + "I" * ndim, data[4:header])
    need, have = math.prod(shape), len(data) - header
    if have != need:
        dims = "x".join(str(d) for d in shape)
        what = "truncated IDX file" if have < need else f"{have - need:,} bytes too many"
        raise DataError(f"{path}: {what}: the header says {dims} ({need:,} bytes) but {have:,} "
                        f"follow{unzipped}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _find(name: str, folder: Path) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _data_root(root: str) -> Path:
    """The data root as a folder; an empty one (``FEDRUN_DATA`` set to nothing) would be the
    working directory, where a download would scatter its folders: refused in one line."""
    if not str(root).strip():
        raise ConfigError("data_root", repr(str(root)), "is empty (FEDRUN_DATA set to nothing?); name a folder, "
                          "or unset FEDRUN_DATA to use ./data")
    return Path(root).expanduser()


def _snapshot(root: Path) -> tuple[Path, set[Path]]:
    """The nearest existing folder at or above ``root``, and every path below ``root`` now."""
    existing = next(p for p in (root, *root.absolute().parents) if p.exists())
    return existing, set(root.rglob("*")) if root.is_dir() else set()


def _undo(root: Path, before: tuple[Path, set[Path]]) -> None:
    """Remove what a failed download made below (and of) ``root``: every path that was not there
    before, deepest first, then the folders made up to the one that existed."""
    existing, paths = before
    made = set(root.rglob("*")) - paths if root.is_dir() else set()
    for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        except OSError:
            pass
    folder = root.absolute()
    while folder != existing.absolute() and existing.absolute() in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            break
        folder = folder.parent


def _check_images(array: np.ndarray, where) -> None:
    dims = "x".join(str(d) for d in array.shape)
    ok = array.ndim == 3 or (array.ndim == 4 and array.shape[-1] in (1, 3))
    if not ok:
        raise DataError(f"{where}: images must be N x height x width (or N x height x width x 1 or 3 "
                        f"channels), not {dims}")
    if 0 in array.shape[1:]:
        raise DataError(f"{where}: images of size {dims} hold no pixel")


def _images(array: np.ndarray, where="images") -> torch.Tensor:
    """uint8 ``[N, H, W]`` or ``[N, H, W, C]`` -> float32 ``[N, C, H, W]`` in [0, 1]."""
    _check_images(array, where)
    x = torch.from_numpy(np.array(array, copy=True))
    if x.ndim == 3:
        x = x.unsqueeze(1)
    else:
        x = x.permute(0, 3, 1, 2)
    return x.float().div_(255.0)


def _labels(array: np.ndarray, where) -> torch.Tensor:
    if array.ndim != 1:
        raise DataError(f"{where}: labels must be one number per image (1 dimension), not "
                        f"{'x'.join(str(d) for d in array.shape)}")
    return torch.from_numpy(array.astype(np.int64))


def _pair(images: Path, labels: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read an images/labels IDX pair, checked to be images, labels and of one count."""
    x, y = read_idx(images), read_idx(labels)
    _check_images(x, images)
    y = _labels(y, labels)
    if len(x) != len(y):
        raise DataError(f"{images} holds {len(x):,} images but {labels} holds {len(y):,} labels: the "
                        f"{split} files must have one label per image")
    if len(x) == 0:
        raise DataError(f"{images}: holds no image (the {split} set needs at least one)")
    return _images(x, images), y


_DOWNLOAD = "dataset.load.download"
DEFAULT_ROOT = "data"  # conf/config.yaml's data_root when FEDRUN_DATA is unset


def _mnist_like(folder_name: str, torchvision_class: str, root: str, download: bool,
                search: list[str] | None, system_dirs: list[str]) -> RawData:
    """The four IDX files of MNIST or FashionMNIST, all four from one folder: the first of
    ``<root>/<folder_name>/raw``, the ``search`` folders and ``system_dirs`` that holds them all
    (never train files from one folder and test files from another; never the bare data root,
    which may hold the other dataset's files under the same names).  Else torchvision's download
    into ``<root>/<folder_name>/raw``; a failed download leaves nothing behind."""
    root_path = _data_root(root)
    folders = [root_path / folder_name / "raw"] + [Path(s).expanduser() for s in (search or [])]
    folders += [Path(s) for s in system_dirs]
    names = [n for ns in IDX_FILES.values() for n in ns]

    def complete(folder: Path) -> list[Path] | None:
        found = [_find(n, folder) for n in names]
        return found if all(found) else None

    chosen = next(((f, paths) for f in folders if (paths := complete(f))), None)
    reason = f"download is disabled: {_DOWNLOAD}=true would fetch them"
    if chosen is None and download:
        reason = "the download reported no error but left no files there"
        import torchvision

        before = _snapshot(root_path)
        try:
            for train in (True, False):
                getattr(torchvision.datasets, torchvision_class)(str(root_path), train=train, download=True)
        except Exception as e:  # noqa: BLE001 - any network or disk failure means "not here"
            reason = f"the download failed ({_first_line(e, 120)}); nothing was left behind"
            _undo(root_path, before)
        chosen = next(((f, paths) for f in folders[:1] if (paths := complete(f))), None)
    if chosen is None:
        partial = [f"{f} holds {n} of the 4" for f in folders
                   if 0 < (n := sum(_find(name, f) is not None for name in names)) < 4]
        where = ", ".join(str(f) for f in folders)
        raise DataError(f"{folder_name} not found: expected {', '.join(names)} (optionally .gz), all four in one "
                        f"of {where}{' (' + '; '.join(partial) + ')' if partial else ''}; {reason}")
    folder, (trx, try_, tex, tey) = chosen
    if str(folder) in system_dirs and str(root) != DEFAULT_ROOT:
        # A data root the user chose holds no copy: say which copy is read instead, not as a
        # passing info line (the same dataset, so not refused; the user may have meant their own).
        log.warning("data_root=%s holds no %s (%s): reading the system's copy in %s", root, folder_name,
                    folders[0], folder)
    else:
        log.info("%s: reading %s", folder_name, folder)
    train_x, train_y = _pair(trx, try_, "training")
    test_x, test_y = _pair(tex, tey, "test")
    for path, y in ((try_, train_y), (tey, test_y)):
        _check_range(y, 10, path)
    return RawData(train_x, train_y, test_x, test_y, 10)


def mnist(root: str = "data", download: bool = True, search: list[str] | None = None) -> RawData:
    """MNIST (60,000 train / 10,000 test, 28x28 grey) from IDX files or torchvision's download."""
    return _mnist_like("MNIST", "MNIST", root, download, search, [])


def fashion_mnist(root: str = "data", download: bool = True,
                  search: list[str] | None = None) -> RawData:
    """FashionMNIST, also found where Debian's ``dataset-fashion-mnist`` package installs it."""
    return _mnist_like("FashionMNIST", "FashionMNIST", root, download, search,
                       ["/usr/share/datasets/fashion-mnist"])


def _torchvision_or_fail(make, name: str, download: bool, root: Path, folder: Path, expected: str,
                         files: list[tuple[Path, str]], read):
    """``make(download)`` a torchvision dataset, or a :class:`DataError` saying which case failed.

    ``files`` are the (path, md5) pairs it needs in ``folder`` (``expected`` describes them), a
    folder at or below the data ``root``, where a failed download leaves nothing behind;
    ``read(path)`` reads one the way torchvision does, raising on a bad one.  The three failures:
    files missing with download off, the download failed, files present but unreadable.
    """
    download_error = None
    if download:
        before = _snapshot(root)
        try:
            return make(True)
        except Exception as e:  # noqa: BLE001 - offline: fall back to the files already on disk
            download_error = e
            _undo(root, before)  # a failed download leaves nothing behind
    try:
        return make(False)
    except Exception as e:  # noqa: BLE001
        error = e
    missing = [p.name for p, _ in files if not p.is_file()]
    if missing:
        lacking = f"{', '.join(missing)} missing from {folder} (expected {expected})"
        if download_error is None:
            raise DataError(f"{name} not found: {lacking}; download is disabled: "
                            f"{_DOWNLOAD}=true would fetch them") from None
        raise DataError(f"{name}: the download failed ({_first_line(download_error)}); {lacking}; "
                        "download them by hand, or retry where the network allows") from None
    if "not found or corrupted" in str(error):  # torchvision's checksum test failed
        from torchvision.datasets.utils import check_integrity

        for path, md5 in files:
            if not check_integrity(str(path), md5):
                tail = (f"; replacing it by a download failed ({_first_line(download_error)})"
                        if download_error is not None else f"; delete it and set {_DOWNLOAD}=true")
                raise DataError(f"{path}: cannot be read (checksum mismatch: a corrupt or incomplete "
                                f"file, not the official {name} one){tail}") from None
    for path, _ in files:
        try:
            read(path)
        except Exception as e:  # noqa: BLE001
            raise DataError(f"{path}: cannot be read ({_first_line(e)})") from None
    raise DataError(f"{folder}: cannot be read ({_first_line(error)})") from None


def _read_cifar_batch(path: Path) -> None:
    import pickle

    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    if path.name == "batches.meta":
        return
    if not isinstance(entry, dict) or "data" not in entry or not ({"labels", "fine_labels"} & set(entry)):
        raise ValueError("not a CIFAR batch (a dict with 'data' and 'labels')")
    data = np.asarray(entry["data"])
    labels = entry.get("labels", entry.get("fine_labels"))
    if data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"'data' has shape {data.shape}, expected (N, 3072)")
    if len(labels) != len(data):
        raise ValueError(f"{len(data)} images but {len(labels)} labels")


def cifar10(root: str = "data", download: bool = True) -> RawData:
    """CIFAR-10 (50,000 / 10,000, 32x32 RGB) through ``torchvision.datasets.CIFAR10``."""
    import torchvision

    cls = torchvision.datasets.CIFAR10
    folder = _data_root(root) / cls.base_folder
    files = [(folder / n, md5) for n, md5 in cls.train_list + cls.test_list]
    files.append((folder / cls.meta["filename"], cls.meta["md5"]))
    expected = "data_batch_1..5, test_batch and batches.meta: the python version"
    sets = []
    for train in (True, False):
        make = lambda dl, train=train: cls(root, train=train, download=dl)  # noqa: E731
        try:
            sets.append(_torchvision_or_fail(make, "CIFAR-10", download, folder.parent, folder, expected, files,
                                             _read_cifar_batch))
        except DataError as e:
            if any(p.is_file() for p, _ in files):  # a broken file of one's own: its message says which
                raise
            raise DataError(f"{e}; offline, dataset=cifar10_jpeg reads a JPEG copy of CIFAR-10 (shown as "
                            f"\"CIFAR-10 (JPEG q75 copy)\", not CIFAR-10)") from None
    tr, te = sets
    out = []
    for ds, split in ((tr, "training"), (te, "test")):
        x = _images(np.asarray(ds.data), f"{folder} ({split} set)")
        y = torch.tensor(ds.targets, dtype=torch.int64)
        _check_range(y, 10, f"{folder} ({split} set)")
        out += [x, y]
    return RawData(*out, 10)


def _read_svhn(path: Path) -> None:
    import scipy.io

    mat = scipy.io.loadmat(str(path))
    x, y = mat["X"], mat["y"]
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise ValueError(f"'X' has shape {x.shape}, expected (32, 32, 3, N)")
    if y.size != x.shape[3]:
        raise ValueError(f"{x.shape[3]} images but {y.size} labels")


def svhn(root: str = "data", download: bool = True, extra: int = 0) -> RawData:
    """SVHN (73,257 / 26,032, 32x32 RGB) through ``torchvision.datasets.SVHN`` (needs scipy).

    ``extra``: append the first ``extra`` images of SVHN's extra set (531,131 images, a 1.3 GB
    download) to the training images, as the parameter-divergence paper's code does with 10,000
    (fl-noniid/fl-noniid, svhn_input.py lines 10-23) so that every digit has the 5,000 training
    images of its class-balanced 10 x 5,000 pool (the train set has 4,659 nines and 4,948 zeros).
    """
    import torchvision

    check(isinstance(extra, int) and not isinstance(extra, bool) and extra >= 0, "dataset.load.extra", extra,
          "must be an integer >= 0 (images taken from SVHN's extra set)")

    try:
        import scipy.io  # noqa: F401
    except ImportError as e:
        raise DataError("SVHN is stored as .mat files: pip install scipy (or fedrun[svhn])") from e
    cls = torchvision.datasets.SVHN
    folder = _data_root(root)
    out = []
    for split in ("train", "test", "extra") if extra else ("train", "test"):
        _, filename, md5 = cls.split_list[split]
        make = lambda dl, split=split: cls(root, split=split, download=dl)  # noqa: E731
        ds = _torchvision_or_fail(make, "SVHN", download, folder, folder, filename, [(folder / filename, md5)],
                                  _read_svhn)
        where = folder / filename
        keep = slice(extra) if split == "extra" else slice(None)  # float32 of all 531,131 would be 6.5 GB
        x = _images(np.asarray(ds.data)[keep].transpose(0, 2, 3, 1), where)
        y = torch.from_numpy(np.asarray(ds.labels)[keep].astype(np.int64).reshape(-1))
        if len(x) != len(y):
            raise DataError(f"{where}: holds {len(x):,} images but {len(y):,} labels")
        _check_range(y, 10, where)
        out += [x, y]
    if extra:  # the first `extra` images of the extra set join the training images
        tx, ty, vx, vy, ex, ey = out
        out = [torch.cat([tx, ex]), torch.cat([ty, ey]), vx, vy]
    return RawData(*out, 10)


def idx(train_images: str, train_labels: str, test_images: str | None = None,
        test_labels: str | None = None, test_fraction: float = 0.2, split_seed: int = 0,
        num_classes: int | None = None) -> RawData:
    """Any IDX-format dataset; without test files a random ``test_fraction`` is held out.

    Used for the first 10,000 MNIST training images shipped beside this project
    (``dataset=mnist_train10k``), which have no test set of their own.  Without ``num_classes`` the
    classes are 0..(largest label).
    """
    s = "dataset.load."
    for setting, path in ((s + "train_images", train_images), (s + "train_labels", train_labels),
                          (s + "test_images", test_images), (s + "test_labels", test_labels)):
        if path is not None and not Path(path).expanduser().is_file():
            raise DataError(f"{setting}: file {path} not found")
    if (test_images is None) != (test_labels is None):
        given, other = ("test_images", "test_labels") if test_images is not None else ("test_labels",
                                                                                       "test_images")
        raise ConfigError(s + other, None, f"must be set together with {s}{given} (or both left null "
                          f"to hold out {s}test_fraction of the training files)")
    if num_classes is not None:
        check(isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 1,
              s + "num_classes", num_classes, "must be an integer >= 1 or null")
    ex = lambda p: Path(p).expanduser()  # noqa: E731
    x, y = _pair(ex(train_images), ex(train_labels), "training")
    splits = [(ex(train_labels), y)]
    if test_images is not None:
        tx, ty = _pair(ex(test_images), ex(test_labels), "test")
        splits.append((ex(test_labels), ty))
    if num_classes is not None:
        for path, labels in splits:
            _check_range(labels, num_classes, path, s + "num_classes")
    classes = num_classes or max(int(labels.max()) for _, labels in splits) + 1
    if test_images is not None:
        return RawData(x, y, tx, ty, classes)
    n = len(y)
    check(isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1, s + "test_fraction",
          test_fraction, "must be in (0, 1)")
    n_test = int(round(test_fraction * n))
    check(1 <= n_test <= n - 1, s + "test_fraction", test_fraction,
          f"holds out {n_test} of the {n} images; must leave at least one in each split "
          f"(between {1 / n:.3g} and {1 - 1 / n:.3g} here)" if n > 1 else
          f"cannot split {n} image into a training and a test set; give test files")
    perm = torch.randperm(n, generator=torch_generator(split_seed, "test_split"))
    test, train = perm[:n_test], perm[n_test:]
    return RawData(x[train], y[train], x[test], y[test], classes)


def synthetic(num_train: int = 2000, num_test: int = 500, channels: int = 1, image_size: int = 28,
              num_classes: int = 10, noise: float = 1.0, seed: int = 0) -> RawData:
    """Learnable synthetic images of any shape: a random template per class plus Gaussian noise.

    ``x = template[y] + noise * N(0, 1)``; with ``noise`` around 1 a small CNN needs a few rounds
    to separate the classes, which makes tests and benchmarks exercise real learning.
    """
    check(num_classes >= 2, "dataset.num_classes", num_classes, "must be >= 2")
    check(num_train >= num_classes, "dataset.load.num_train", num_train,
          f"must be >= num_classes ({num_classes})")
    check(num_test >= 1, "dataset.load.num_test", num_test, "must be >= 1")
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
