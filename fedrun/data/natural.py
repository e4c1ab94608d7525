"""Datasets whose clients are real: every example carries the id of the client that holds it.

* :func:`femnist`: LEAF's FEMNIST (Caldas et al., *LEAF: A Benchmark for Federated Settings*,
  2018), one writer a client, in LEAF's JSON layout;
* :func:`table`: any CSV table with a label column, a client column (a user, a device, a
  hospital) and feature columns;
* :func:`synthetic_writers`: synthetic clients of FEMNIST's shape (LEAF's number of writers and
  spread of their sizes), for cross-device scale where the real writers are not at hand.

``partition=natural`` (:func:`fedrun.data.partition.natural`) keeps these clients instead of
splitting the data itself.  Client ids are numbered 0 .. n-1 in the order of the sorted original
ids (writer names, the column's values), the same numbering in the training and the test split.
"""
from __future__ import annotations

import csv
import io
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
LEAF_PIXELS = LEAF_IMAGE * LEAF_IMAGE
# FEMNIST in LEAF's Table 1 (Caldas et al. 2018): 3,550 writers, 805,263 images, 226.83 +- 88.94 a writer.
LEAF_WRITERS, LEAF_MEAN_SIZE, LEAF_STD_SIZE = 3550, 226.83, 88.94
FLOAT32_MAX = float(np.finfo(np.float32).max)  # a table's features are read as float32


class _DuplicateKey(ValueError):
    """A key twice in one JSON object (raised by :func:`_unique_keys`)."""


def _unique_keys(pairs: list) -> dict:
    """``json.loads``' object hook: a key twice in one object is refused, where json would keep
    the last silently (a writer's ``user_data`` written twice would lose its first block)."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def _leaf_json(path: Path) -> dict:
    """One LEAF file, parsed: a folder, unreadable or non-UTF-8 bytes, an empty file, broken JSON
    and a key written twice are each one line naming the file."""
    if path.is_dir():
        raise DataError(f"{path}: is a folder, not a LEAF .json file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): LEAF's "
                        "files are JSON, written in UTF-8") from None
    if not text.strip():
        raise DataError(f"{path}: is empty: a LEAF file holds users and user_data[user].x / .y")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise DataError(f"{path}: the key {e.args[0]!r} appears twice in one JSON object (written twice?): "
                        "each writer and each of its x / y once") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not a LEAF file (JSONDecodeError: {e}); it needs users and "
                        "user_data[user].x / .y") from None


def _shown(value) -> str:
    """A JSON value as a message quotes it: its JSON text, cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _leaf_pixels(x: list, path: Path, writer: str) -> np.ndarray:
    """A writer's images as float32 ``[n, 784]``, each row checked: 784 values, numbers, finite,
    in [0, 1] (a NaN would surface later as a normalization failure that names no file)."""
    for i, row in enumerate(x):
        if not isinstance(row, list) or len(row) != LEAF_PIXELS:
            found = f"{len(row)} values" if isinstance(row, list) else f"a {type(row).__name__}"
            raise DataError(f"{path}: writer {writer}, image {i}: {found}: FEMNIST images are rows of "
                            f"{LEAF_PIXELS} pixels (28 x 28)")
    try:
        a = np.asarray(x) if x else np.zeros((0, LEAF_PIXELS))
    except ValueError:  # a pixel that is itself a list, of unequal lengths
        a = np.zeros(0, dtype=object)
    # A string, null, true or list among the pixels makes the array another kind or shape than a
    # table of numbers (given a dtype, numpy would read "0.5" as 0.5 and true as 1): found by a
    # scan, as a NaN or 255 is.
    numbers = a.dtype.kind in "iuf" and a.ndim == 2
    bad = np.argwhere(~np.isfinite(a) | (a < 0) | (a > 1)) if numbers else None
    if not numbers or len(bad):
        i, j = (int(k) for k in bad[0]) if numbers else next(
            (i, j) for i, row in enumerate(x) for j, v in enumerate(row)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1)
        raise DataError(f"{path}: writer {writer}, image {i}, pixel {j}: {_shown(x[i][j])} is not a number in "
                        "[0, 1]: LEAF's pixels are the grey levels scaled by 1/255")
    return a.astype(np.float32)


def _leaf_labels(y: list, path: Path, writer: str) -> np.ndarray:
    """A writer's labels as int64, each an integer 0..61 (3.7 would be cut to 3, true read as 1)."""
    for i, v in enumerate(y):
        integer = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
        if isinstance(v, bool) or not integer or not 0 <= v < LEAF_CLASSES:
            what = "is not an integer" if isinstance(v, bool) or not integer else f"is outside 0..{LEAF_CLASSES - 1}"
            raise DataError(f"{path}: writer {writer}, image {i}: label {_shown(v)} {what}: FEMNIST's "
                            f"labels are integers 0..{LEAF_CLASSES - 1}")
    return np.asarray(y, dtype=np.int64).reshape(-1)


def _leaf_split(folder: Path, setting: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{writer: (images [n, 784], labels [n])}`` from every ``*.json`` file of a LEAF split folder
    (``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``),
    every value checked.  A writer listed twice, in one file or two, is refused: its images would
    count twice (LEAF writes each writer of a split to one file, once)."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{setting}: no LEAF .json file in {folder} (LEAF writes them to "
                        "data/femnist/data/train and .../test: see docs/configuration.md#natural-clients)")
    users: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    found_in: dict[str, Path] = {}
    for path in files:
        data = _leaf_json(path)
        try:
            listed, counts = data["users"], data.get("num_samples")
            if not isinstance(listed, list) or not isinstance(data["user_data"], dict):
                raise TypeError("users must be a list and user_data an object")
            if counts is not None and (not isinstance(counts, list) or len(counts) != len(listed)):
                raise DataError(f"{path}: num_samples must list one count per writer of users ({len(listed)}), "
                                f"not {_shown(counts)}")
            for n, user in enumerate(listed):
                writer = str(user)
                if writer in found_in:
                    where = "twice in users" if found_in[writer] == path else f"in {found_in[writer]} too"
                    raise DataError(f"{path}: writer {writer} is listed {where}: each writer once in a split "
                                    "(its images would count twice)")
                found_in[writer] = path
                rows = data["user_data"][user]
                x, y = rows["x"], rows["y"]
                if not isinstance(x, list) or not isinstance(y, list):
                    raise TypeError(f"writer {writer}'s x and y must be lists")
                if len(x) != len(y):
                    raise DataError(f"{path}: writer {writer} has {len(x)} images but {len(y)} labels")
                if counts is not None and counts[n] != len(y):
                    raise DataError(f"{path}: writer {writer}: num_samples says {counts[n]} but it has {len(y)} "
                                    "images (a truncated or edited file?)")
                users[writer] = (_leaf_pixels(x, path, writer), _leaf_labels(y, path, writer))
            unlisted = sorted(set(map(str, data["user_data"])) - {str(u) for u in listed})
            if unlisted:  # their images would be left out without a word
                raise DataError(f"{path}: user_data holds writer {unlisted[0]}, which users does not list: "
                                "every writer in both")
        except (KeyError, TypeError) as e:
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
        if folder.exists() and not folder.is_dir():
            raise DataError(f"dataset.load.{split}: {folder} is a file, not a folder of LEAF's .json files")
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
            xs.append(x)
            ys.append(y)
            groups.append(np.full(len(y), ids[writer], dtype=np.int64))
        if not sum(len(y) for y in ys):
            raise DataError(f"dataset.load.{name}: the LEAF files in {folders[name]} hold no image")
        x = torch.from_numpy(np.concatenate(xs)).view(-1, 1, LEAF_IMAGE, LEAF_IMAGE)
        tensors += [x, torch.from_numpy(np.concatenate(ys)), torch.from_numpy(np.concatenate(groups))]
    train_x, train_y, train_groups, test_x, test_y, test_groups = tensors
    return RawData(train_x, train_y, test_x, test_y, LEAF_CLASSES, train_groups, test_groups)


def _csv_table(file: Path, setting: str, given) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """A CSV file's header and its rows, each with its line number, checked as text: a folder, an
    empty file, bytes that are not UTF-8, malformed CSV, a column named twice and a row of more or
    fewer fields than the header (csv.DictReader would drop the extra fields, or read the missing
    ones as None) are each one line naming the file and the line.  A UTF-8 byte-order mark (as
    Excel writes) is read as what it is, not as part of the first column's name."""
    if file.is_dir():
        raise DataError(f"{setting}: {given} is a folder, not a CSV file")
    if not file.is_file():
        raise DataError(f"{setting}: file {given} not found")
    try:
        data = file.read_bytes()
    except OSError as e:
        raise DataError(f"{file}: cannot be read ({e.strerror or e})") from None
    if not data.strip():
        raise DataError(f"{file}: is empty ({len(data)} bytes{' of white space' if data else ''}): a CSV table needs "
                        "a header row naming the columns, then a row an example")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{file}: line {line}: byte 0x{data[e.start]:02x} is not UTF-8 "
                        "(Latin-1 or another encoding?): save the table as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next((row for row in reader if row), None)  # csv.DictReader's rule: blank lines skipped
        rows = [(reader.line_num, row) for row in reader if row]
    except csv.Error as e:
        raise DataError(f"{file}: line {reader.line_num}: not CSV ({e})") from None
    if header is None:
        raise DataError(f"{file}: holds no header row: a CSV table needs one naming the columns")
    first: dict[str, int] = {}
    for i, name in enumerate(header):
        if name in first:  # DictReader would keep the last column of the name and drop the other
            raise DataError(f"{file}: column {name!r} is named twice in the header (columns {first[name] + 1} and "
                            f"{i + 1}): name each column once")
        first[name] = i
    for line, row in rows:
        if len(row) != len(header):
            raise DataError(f"{file}: line {line} has {len(row)} fields but the header names {len(header)} columns: "
                            "one value per column in every row")
    return header, rows


def _table_features(file: Path, rows: list, columns: list[int], header: list[str]) -> np.ndarray:
    """The feature cells as float32 ``[rows, features]``, each a finite number: "nan", "inf" and
    1e39 (infinite in float32) would reach the normalization, which would blame the data's std
    without naming the file; the first bad cell is one line naming its line and column."""
    try:
        with np.errstate(over="ignore"):  # 1e39 becomes inf in float32: found below
            x = np.asarray([[float(row[j]) for j in columns] for _, row in rows], dtype=np.float32)
        bad = np.nonzero(~np.isfinite(x).all(axis=1))[0]
        if not len(bad):
            return x
        first = int(bad[0])
    except ValueError:  # a cell that is not a number: look for it from the start
        first = 0
    for line, row in rows[first:]:
        for j in columns:
            try:
                value = float(row[j])
                what = "" if math.isfinite(value) and abs(value) <= FLOAT32_MAX else "is not finite (in float32)"
            except ValueError:
                what = "is not a number"
            if what:
                raise DataError(f"{file}: line {line}, column {header[j]}: {row[j]!r} {what}: features are finite "
                                "numbers")
    raise AssertionError("a feature cell failed to convert, yet each converts alone")  # unreachable


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
    header, rows = _csv_table(file, s + "path", path)
    for setting, column in ((s + "label_column", label_column), (s + "client_column", client_column)):
        if column not in header:
            raise ConfigError(setting, column, f"is not a column of {file.name}; it has: {', '.join(header)}")
    check(client_column != label_column, s + "client_column", client_column,
          f"is {s}label_column too: name the column of the clients")
    features = list(feature_columns) if feature_columns else [c for c in header
                                                              if c not in (label_column, client_column)]
    missing = [c for c in features if c not in header]
    if missing:
        raise ConfigError(s + "feature_columns", missing, f"not columns of {file.name}; it has: {', '.join(header)}")
    check(bool(features), s + "feature_columns", features, "needs at least one feature column")
    twice = [c for c in features if features.count(c) > 1]
    check(not twice, s + "feature_columns", features, f"lists {twice[0] if twice else ''} twice: each feature once")
    # A model given its label (or its client's id) as an input learns to read it back, not the task.
    held = [c for c in features if c in (label_column, client_column)]
    check(not held, s + "feature_columns", features, f"lists {held[0] if held else ''}, the "
          f"{'label' if held and held[0] == label_column else 'client'} column: leave it out of the features")
    if not rows:
        raise DataError(f"{s}path: {file} has a header but no row")
    at = {c: i for i, c in enumerate(header)}
    x = _table_features(file, rows, [at[c] for c in features], header)
    y = np.empty(len(rows), dtype=np.int64)
    for r, (line, row) in enumerate(rows):
        try:
            y[r] = int(row[at[label_column]])  # "3.7" and "" fail here, where a float cast would cut to 3
        except (ValueError, OverflowError):
            raise DataError(f"{file}: line {line}: label {row[at[label_column]]!r} is not an integer: labels are "
                            "integers 0..C-1") from None
        if not row[at[client_column]].strip():
            raise DataError(f"{file}: line {line}: the client column {client_column} is empty: every row names "
                            "the client that holds it")
    clients = [row[at[client_column]] for _, row in rows]
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
    outside = np.nonzero((y < 0) | (y >= classes))[0]
    if len(outside):
        said = f" (dataset.num_classes={num_classes})" if num_classes else ""
        raise DataError(f"{file}: line {rows[outside[0]][0]}: label {y[outside[0]]} is outside 0..{classes - 1}{said}: "
                        f"labels are integers 0..C-1")
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


def writer_sizes(writers: int, mean: float, std: float, seed: int) -> np.ndarray:
    """``writers`` client sizes (examples a client, both splits), drawn i.i.d. from the log-normal
    with this mean and standard deviation, rounded, at least 2 (one to train on, one to test):
    ``n_k = max(2, round(exp(mu + s z_k)))`` with ``s^2 = ln(1 + std^2 / mean^2)`` and
    ``mu = ln(mean) - s^2 / 2``, ``z_k ~ N(0, 1)`` from ``(seed, "writer-sizes")``.  LEAF reports a
    mean and a standard deviation only; a log-normal is positive and right-skewed, as writers'
    sizes are."""
    check(isinstance(writers, int) and writers >= 1, "dataset.load.writers", writers, "must be an integer >= 1")
    check(mean >= 2, "dataset.load.size_mean", mean, "must be >= 2 (each client trains on one example and tests on one)")
    check(std >= 0, "dataset.load.size_std", std, "must be >= 0")
    s2 = math.log1p((std / mean) ** 2)
    z = torch.randn(writers, generator=torch_generator(seed, "writer-sizes"), dtype=torch.float64).numpy()
    return np.maximum(np.rint(np.exp(math.log(mean) - s2 / 2 + math.sqrt(s2) * z)), 2).astype(np.int64)


def synthetic_writers(writers: int = LEAF_WRITERS, size_mean: float = LEAF_MEAN_SIZE, size_std: float = LEAF_STD_SIZE,
                      test_fraction: float = 0.1, channels: int = 1, image_size: int = LEAF_IMAGE,
                      num_classes: int = LEAF_CLASSES, noise: float = 1.0, style: float = 0.5, seed: int = 0) -> RawData:
    """Synthetic natural clients of FEMNIST's shape: ``writers`` clients with sizes drawn as LEAF's
    (:func:`writer_sizes`: 3,550 writers of 226.83 +- 88.94 images by default: 803,309 in all with seed 0, LEAF 805,263),
    each split into its own training and test examples as LEAF's ``--tf 0.9`` (``test_fraction`` of
    a writer's examples, rounded down, held out; at least one each).

    An image of class y by writer k is ``template[y] + style * s_k + noise * N(0, 1)``: the class
    templates of ``dataset=synthetic``, plus the writer's own fixed random image ``s_k`` (a
    handwriting of sorts: feature skew, as FEMNIST's writers differ), labels uniform over the
    classes.  Everything is drawn from ``seed``; the cost of a round depends on the sizes only,
    which is what this set is for (cross-device benchmarks, ``partition=natural``); accuracy on it
    says nothing about FEMNIST's.
    """
    s = "dataset.load."
    check(0 <= test_fraction < 1, s + "test_fraction", test_fraction, "must be in [0, 1)")
    check(num_classes >= 2, "dataset.num_classes", num_classes, "must be >= 2")
    sizes = writer_sizes(writers, size_mean, size_std, seed)
    tests = np.clip(np.floor(test_fraction * sizes), 1 if test_fraction > 0 else 0, sizes - 1).astype(np.int64)
    g = torch_generator(seed, "synthetic-writers")
    shape = (channels, image_size, image_size)
    templates = torch.rand(num_classes, *shape, generator=g)
    styles = torch.randn(writers, *shape, generator=g)
    out = []
    for split, counts in (("train", sizes - tests), ("test", tests)):
        gs = torch_generator(seed, "synthetic-writers", split)
        groups = torch.from_numpy(np.repeat(np.arange(writers, dtype=np.int64), counts))
        y = torch.randint(num_classes, (len(groups),), generator=gs)
        x = torch.empty(len(groups), *shape)
        for start in range(0, len(groups), 65536):  # in blocks: the peak stays near the images' own size
            end = min(start + 65536, len(groups))
            x[start:end] = templates[y[start:end]] + style * styles[groups[start:end]] \
                + noise * torch.randn(end - start, *shape, generator=gs)
        out.append((x, y, groups))
    (train_x, train_y, train_groups), (test_x, test_y, test_groups) = out
    return RawData(train_x, train_y, test_x, test_y, num_classes, train_groups, test_groups)
