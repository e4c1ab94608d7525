"""Datasets whose clients are real: every example carries the id of the client that holds it.

* :func:`femnist`: LEAF's FEMNIST (Caldas et al., *LEAF: A Benchmark for Federated Settings*,
  2018), one writer a client, in LEAF's JSON layout;
* :func:`table`: any CSV table with a label column, a client column (a user, a device, a
  hospital) and feature columns.

``partition=natural`` (:func:`fedrun.data.partition.natural`) keeps these clients instead of
splitting the data itself.  Client ids are numbered 0 .. n-1 in the order of the sorted original
ids (writer names, the column's values), the same numbering in the training and the test split.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import torch

from fedrun.data.datasets import RawData
from fedrun.errors import ConfigError, DataError, check
from fedrun.seeding import torch_generator

LEAF_IMAGE = 28  # FEMNIST's images: 28 x 28 grey, 784 values a row
LEAF_CLASSES = 62  # 10 digits, 26 upper-case and 26 lower-case letters


def _leaf_split(folder: Path, setting: str) -> dict[str, tuple[list, list]]:
    """``{writer: (rows of 784 pixels, labels)}`` from every ``*.json`` file of a LEAF split folder
    (``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``)."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{setting}: no LEAF .json file in {folder} (LEAF writes them to "
                        "data/femnist/data/train and .../test: see docs/configuration.md#natural-clients)")
    users: dict[str, tuple[list, list]] = {}
    for path in files:
        try:
            data = json.loads(path.read_text())
            for user in data["users"]:
                rows = data["user_data"][user]
                xs, ys = users.setdefault(str(user), ([], []))
                if len(rows["x"]) != len(rows["y"]):
                    raise DataError(f"{path}: writer {user} has {len(rows['x'])} images but {len(rows['y'])} labels")
                xs.extend(rows["x"])
                ys.extend(rows["y"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DataError(f"{path}: not a LEAF file ({type(e).__name__}: {e}); it needs users and "
                            "user_data[user].x / .y") from None
    return users


def femnist(root: str = "data", train: str | None = None, test: str | None = None) -> RawData:
    """LEAF's FEMNIST: 62 classes of 28 x 28 handwritten characters, one client per writer.

    LEAF's scripts (``./preprocess.sh -s niid --sf 0.05 -k 0 -t sample`` in ``data/femnist``)
    write the training and test splits as JSON files, each user's images as rows of 784 pixel
    values in [0, 1] (LEAF scales the grey PNGs by 1/255, so the background is 1 and the ink
    darker: the inverse of MNIST's polarity, which the normalization's mean and std absorb).

    Args:
      root: where ``femnist/data/train`` and ``femnist/data/test`` are looked for (LEAF's own
        ``data`` folder works as it is).
      train, test: the two folders of JSON files, when they are elsewhere.
    """
    base = Path(root).expanduser() / "femnist" / "data"
    folders = {"train": Path(train).expanduser() if train else base / "train",
               "test": Path(test).expanduser() if test else base / "test"}
    for split, folder in folders.items():
        if not folder.is_dir():
            raise DataError(f"dataset.load.{split}: folder {folder} not found (LEAF's FEMNIST JSON files; fedrun "
                            "cannot download them: see docs/configuration.md#natural-clients)")
    splits = {name: _leaf_split(folder, f"dataset.load.{name}") for name, folder in folders.items()}
    writers = sorted(set(splits["train"]) | set(splits["test"]))
    ids = {w: i for i, w in enumerate(writers)}
    tensors = []
    for name in ("train", "test"):
        xs, ys, groups = [], [], []
        for writer, (x, y) in splits[name].items():
            xs.extend(x)
            ys.extend(y)
            groups.extend([ids[writer]] * len(y))
        if not ys:
            raise DataError(f"dataset.load.{name}: the LEAF files in {folders[name]} hold no image")
        x = np.asarray(xs, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != LEAF_IMAGE * LEAF_IMAGE:
            raise DataError(f"dataset.load.{name}: FEMNIST rows must hold {LEAF_IMAGE * LEAF_IMAGE} pixels "
                            f"(28 x 28), found {x.shape[1:] if x.ndim == 2 else 'rows of unequal length'}")
        y = torch.as_tensor(np.asarray(ys, dtype=np.int64))
        if int(y.min()) < 0 or int(y.max()) >= LEAF_CLASSES:
            raise DataError(f"dataset.load.{name}: FEMNIST labels are 0..{LEAF_CLASSES - 1}, found "
                            f"{int(y.min())}..{int(y.max())}")
        tensors += [torch.from_numpy(x).view(-1, 1, LEAF_IMAGE, LEAF_IMAGE), y,
                    torch.as_tensor(np.asarray(groups, dtype=np.int64))]
    train_x, train_y, train_groups, test_x, test_y, test_groups = tensors
    return RawData(train_x, train_y, test_x, test_y, LEAF_CLASSES, train_groups, test_groups)


def table(path: str | None = None, label_column: str = "label", client_column: str = "client",
          feature_columns: list[str] | None = None, channels: int = 1, image_size: int | None = None,
          test_fraction: float = 0.2, split_seed: int = 0, num_classes: int | None = None) -> RawData:
    """A CSV table with one example a row: a label, the client that holds it, and features.

    The features become ``channels x image_size x image_size`` "images" (a table of pixels, as
    MNIST's CSV exports, reads as its images; other features are zero-padded at the end to that
    size, which the MLP sees as constant inputs).  Each client's rows are split into its own
    training and test rows (``test_fraction`` of each client's, at least one where it has two
    rows or more), so every client also has test data of its own.

    Args:
      path: the CSV file (a header row naming the columns).
      label_column, client_column: the label (integers 0..C-1) and the client id (any text: ids
        are numbered in sorted order).
      feature_columns: the features, in order; None: every other column.
      channels, image_size: the shape the features are laid out in (the dataset's
        ``channels``/``image_size``); image_size None: the smallest square that holds them.
      test_fraction, split_seed: each client's held-out share and the split's seed.
      num_classes: None: 1 + the largest label.
    """
    s = "dataset.load."
    if path is None:
        raise ConfigError(s + "path", None, "dataset=table reads a CSV file: set dataset.load.path=<file.csv>")
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"{s}path: file {path} not found")
    with open(file, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        for setting, column in ((s + "label_column", label_column), (s + "client_column", client_column)):
            if column not in header:
                raise ConfigError(setting, column, f"is not a column of {file.name}; it has: {', '.join(header)}")
        features = list(feature_columns) if feature_columns else [c for c in header
                                                                  if c not in (label_column, client_column)]
        missing = [c for c in features if c not in header]
        if missing:
            raise ConfigError(s + "feature_columns", missing, f"not columns of {file.name}; it has: {', '.join(header)}")
        check(bool(features), s + "feature_columns", features, "needs at least one feature column")
        rows = list(reader)
    if not rows:
        raise DataError(f"{s}path: {file} has a header but no row")
    try:
        x = np.asarray([[float(r[c]) for c in features] for r in rows], dtype=np.float32)
        y = np.asarray([int(r[label_column]) for r in rows], dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise DataError(f"{s}path: {file}: a feature is not a number or a label not an integer ({e})") from None
    clients = [r[client_column] for r in rows]
    names = sorted(set(clients))
    number = {name: i for i, name in enumerate(names)}
    groups = np.asarray([number[c] for c in clients], dtype=np.int64)
    side = image_size or math.ceil(math.sqrt(len(features) / channels))
    size = channels * side * side
    check(len(features) <= size, s + "feature_columns", len(features),
          f"features cannot fit in {channels} x {side} x {side} = {size} values: raise dataset.image_size "
          f"(or dataset.channels)")
    x = np.pad(x, ((0, 0), (0, size - len(features))))
    classes = num_classes or int(y.max()) + 1
    if int(y.min()) < 0 or int(y.max()) >= classes:
        raise DataError(f"{s}label_column: labels must be 0..{classes - 1}, found {int(y.min())}..{int(y.max())}")
    check(isinstance(test_fraction, (int, float)) and 0 < test_fraction < 1, s + "test_fraction", test_fraction,
          "must be in (0, 1)")
    g = torch_generator(split_seed, "table_split")
    test = np.zeros(len(y), dtype=bool)
    for client in range(len(names)):
        rows_k = np.nonzero(groups == client)[0]
        if len(rows_k) < 2:
            continue  # a client of one row keeps it for training
        n_test = min(max(int(round(test_fraction * len(rows_k))), 1), len(rows_k) - 1)
        test[rows_k[torch.randperm(len(rows_k), generator=g)[:n_test].numpy()]] = True
    if not test.any():
        raise DataError(f"{s}path: no client of {file.name} has two rows, so none can hold out test rows")
    images = torch.from_numpy(x).view(-1, channels, side, side)
    y_t, g_t = torch.from_numpy(y), torch.from_numpy(groups)
    train_rows, test_rows = torch.from_numpy(np.nonzero(~test)[0]), torch.from_numpy(np.nonzero(test)[0])
    return RawData(images[train_rows], y_t[train_rows], images[test_rows], y_t[test_rows], classes,
                   g_t[train_rows], g_t[test_rows])
