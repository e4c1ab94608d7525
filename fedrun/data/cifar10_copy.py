"""CIFAR-10 as a labelled lossy copy, and the exact-pixel subset that measures what the copy costs.

Where the canonical CIFAR-10 batches cannot be had (no network, no files), a copy of all 60,000
images stored as JPEG (IJG quality 75) keeps CIFAR-10's order, labels, shape and classes, but not
its pixels: the mean absolute error is about 5.8/255 and JPEG smooths the images, so a result on
the copy is a result on **"CIFAR-10 (JPEG q75 copy)"**, never on CIFAR-10.  The copy's dataset
option (``dataset=cifar10_jpeg``) carries that name as its ``label``, which run.json, summary.json,
figure titles, the paper scripts' tables and the dashboards' tags show.

* :func:`cifar10_jpeg`: the copy, decoded once and cached as raw pixels under the data root;
* :func:`cifar10_exact_subset`: the images whose exact canonical pixels are at hand (8,068
  training, 1,017 test), with the training pixels either exact or decoded from the copy, so the
  same model trained on each and tested on the same exact test images says what the copy costs
  (``dataset=cifar10_exact``, ``dataset.load.train_pixels=exact|jpeg``).

File layouts (NumPy ``.npz``, never pickled):

* the copy, ``.npz`` compressed with xz (``.npz.xz``) or not: ``train_jpeg`` / ``test_jpeg`` (all
  JPEG files of a split back to back, uint8), ``train_offsets`` / ``test_offsets`` (n + 1 byte
  offsets: image i is ``blob[off[i]:off[i + 1]]``), ``y_train`` / ``y_test`` (labels 0..9);
* the exact subset: ``x_train`` / ``x_test`` (N x 32 x 32 x 3 uint8), ``y_train`` / ``y_test``,
  ``train_index`` / ``test_index`` (each image's index in CIFAR-10's canonical order).
"""
from __future__ import annotations

import hashlib
import io
import logging
import lzma
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

from fedrun.data.datasets import RawData, _check_range, _images
from fedrun.errors import ConfigError, DataError

log = logging.getLogger(__name__)

COPY_LABEL = "CIFAR-10 (JPEG q75 copy)"
CLASSES = 10
SIDE = 32
SPLITS = ("train", "test")
COPY_KEYS = tuple(f"{k}_{s}" if k == "y" else f"{s}_{k}" for s in SPLITS for k in ("jpeg", "offsets", "y"))
EXACT_KEYS = ("x_train", "y_train", "train_index", "x_test", "y_test", "test_index")
CACHE_VERSION = 1  # bump when the cached layout changes: an older cache is then decoded afresh


def _file(path: str | None, setting: str, what: str) -> Path:
    """``path`` as an existing file, or a one-line DataError naming ``setting``."""
    if path is None or not str(path).strip():
        raise ConfigError(setting, path, f"must name {what}")
    file = Path(path).expanduser()
    if not file.is_file():
        kind = "a folder, not a file" if file.is_dir() else "not found"
        raise DataError(f"{setting}: {file} is {kind} ({what}; dataset=cifar10 reads the real CIFAR-10, "
                        "with download where the network allows)")
    return file


def _npz(file: Path, keys: tuple[str, ...], setting: str) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of an ``.npz`` (xz-compressed when its name ends in ``.xz``); a file that
    is not one, or lacks a key, is one line naming it."""
    try:
        data = lzma.open(file).read() if file.suffix == ".xz" else file.read_bytes()
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DataError(f"{setting}: {file} lacks {', '.join(missing)} (it holds {', '.join(z.files) or 'nothing'}; "
                                f"expected {', '.join(keys)})")
            return {k: z[k] for k in keys}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, lzma.LZMAError, zipfile.BadZipFile) as e:
        raise DataError(f"{setting}: {file} is not a NumPy .npz{' compressed with xz' if file.suffix == '.xz' else ''} "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _decode(blob: np.ndarray, offsets: np.ndarray, where: str) -> np.ndarray:
    """JPEG files back to back -> uint8 ``[n, 32, 32, 3]`` RGB."""
    from PIL import Image  # torchvision's own dependency

    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    if n < 1 or offsets[0] != 0 or offsets[-1] != len(blob) or np.any(np.diff(offsets) <= 0):
        raise DataError(f"{where}: its offsets do not cut its {len(blob):,} bytes into images (they must rise "
                        "from 0 to the blob's length)")
    out = np.empty((n, SIDE, SIDE, 3), dtype=np.uint8)
    for i in range(n):
        try:
            with Image.open(io.BytesIO(blob[offsets[i]:offsets[i + 1]].tobytes())) as image:
                pixels = np.asarray(image.convert("RGB"))
        except Exception as e:  # noqa: BLE001 - PIL raises many kinds for a broken file
            raise DataError(f"{where}: image {i} cannot be decoded ({type(e).__name__}: {e})") from None
        if pixels.shape != (SIDE, SIDE, 3):
            raise DataError(f"{where}: image {i} is {pixels.shape[1]}x{pixels.shape[0]}, not CIFAR-10's 32x32")
        out[i] = pixels
    return out


def _cache_path(cache: str | None, file: Path, digest: str) -> Path | None:
    if cache is None or not str(cache).strip():
        return None
    return Path(cache).expanduser() / f"{file.name.split('.')[0]}.v{CACHE_VERSION}.{digest[:16]}.npz"


def _sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def decoded_copy(file: str, cache: str | None = None, setting: str = "dataset.load.file") -> dict[str, np.ndarray]:
    """The copy's pixels and labels: ``x_train`` (50,000 x 32 x 32 x 3 uint8), ``y_train``,
    ``x_test``, ``y_test``.  Decoding the 60,000 JPEGs takes about 10 s, so the first load writes
    them to ``cache`` (a folder; named by the copy's SHA-256, so a changed file is decoded
    afresh; written whole, then renamed) and later ones read that (about 0.2 s).  ``cache`` None:
    decode every time."""
    source = _file(file, setting, "the CIFAR-10 JPEG copy, cifar10_jpeg_q75.npz.xz")
    cached = _cache_path(cache, source, _sha256(source))
    if cached is not None and cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as z:
                return {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # a cache cut short: decode again
            log.warning("%s: unreadable cache (%s); decoding the copy again", cached, e)
    arrays = _npz(source, COPY_KEYS, setting)
    out = {}
    for split in SPLITS:
        x = _decode(arrays[f"{split}_jpeg"], arrays[f"{split}_offsets"], f"{source} ({split} split)")
        y = np.asarray(arrays[f"y_{split}"]).astype(np.int64)
        if len(y) != len(x):
            raise DataError(f"{source}: its {split} split has {len(x):,} images but {len(y):,} labels")
        out[f"x_{split}"], out[f"y_{split}"] = x, y
    if cached is not None:
        _write_cache(cached, out)
    return out


def _write_cache(cached: Path, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` into ``cached``, written whole beside it and then renamed, so a run stopped
    mid-write leaves no cache cut short; a folder that cannot be written only costs the next load
    its decoding."""
    part = None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(dir=cached.parent, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(part, cached)
    except OSError as e:  # a read-only or full data root: the run goes on from the decoded copy
        log.warning("%s: cannot write the decoded copy (%s); it is decoded again next time", cached, e)
        if part is not None:
            Path(part).unlink(missing_ok=True)


def _raw(x_train, y_train, x_test, y_test, where: str) -> RawData:
    tensors = []
    for split, x, y in (("training", x_train, y_train), ("test", x_test, y_test)):
        images = _images(np.asarray(x), f"{where} ({split} images)")
        labels = torch.from_numpy(np.asarray(y).astype(np.int64))
        _check_range(labels, CLASSES, f"{where} ({split} labels)")
        tensors += [images, labels]
    return RawData(*tensors, CLASSES)


def cifar10_jpeg(file: str, cache: str | None = None) -> RawData:
    """All 60,000 CIFAR-10 images (50,000 training, 10,000 test, CIFAR-10's order and labels) from
    the JPEG quality-75 copy: CIFAR-10's shape and classes, not its pixels (see the module)."""
    copy = decoded_copy(file, cache)
    return _raw(copy["x_train"], copy["y_train"], copy["x_test"], copy["y_test"], str(file))


def cifar10_exact_subset(file: str, train_pixels: str = "exact", jpeg_file: str | None = None,
                         cache: str | None = None) -> RawData:
    """The CIFAR-10 images whose exact pixels are at hand (``file``: 8,068 training and 1,017 test
    images) and the exact test images, with the training images' pixels ``exact`` or, for the
    same images, ``jpeg``: decoded from the copy ``jpeg_file`` (matched by canonical index).  The
    two runs differ in the training pixels alone, so their accuracy difference is what the copy
    costs a model trained on it."""
    if train_pixels not in ("exact", "jpeg"):
        raise ConfigError("dataset.load.train_pixels", train_pixels, "must be exact or jpeg")
    source = _file(file, "dataset.load.file", "the exact CIFAR-10 subset, cifar10_exact_subset.npz")
    exact = _npz(source, EXACT_KEYS, "dataset.load.file")
    x_train = exact["x_train"]
    if train_pixels == "jpeg":
        copy = decoded_copy(jpeg_file, cache, "dataset.load.jpeg_file")
        index = np.asarray(exact["train_index"], dtype=np.int64)
        if index.min() < 0 or index.max() >= len(copy["x_train"]):
            raise DataError(f"{source}: train_index spans {index.min()}..{index.max()}, outside the copy's "
                            f"{len(copy['x_train']):,} training images")
        if not np.array_equal(copy["y_train"][index], np.asarray(exact["y_train"], dtype=np.int64)):
            raise DataError(f"{source}: its labels differ from the copy's at the same canonical index: not the same "
                            "images")
        x_train = copy["x_train"][index]
    return _raw(x_train, exact["y_train"], exact["x_test"], exact["y_test"], str(source))
