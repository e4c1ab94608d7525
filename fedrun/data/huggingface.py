"""Bring your own data: any Hugging Face ``datasets`` dataset of images, and flwr-datasets'
partitioners, so that a Flower setup carries over.

* :func:`hf_dataset` (``dataset=huggingface``): a dataset from the Hub (where the network allows),
  a folder written by ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``, or local files through
  a builder (``imagefolder``, ``parquet``, ``csv``, ``json`` with ``data_files``/``data_dir``);
  its image and label columns become fedrun's tensors, and a client column (``client_column``)
  each example's client id for ``partition=natural``;
* :func:`flwr_partition` (``partition=flwr``): a flwr-datasets partitioner
  (``DirichletPartitioner``, ``IidPartitioner``, ``ShardPartitioner``, ``PathologicalPartitioner``
  ...) run on the training labels, its partitions turned into fedrun's index arrays.

Both libraries are optional (``pip install 'fedrun[huggingface]'``); without them these options
are one line saying so.
"""
from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from fedrun.data.datasets import RawData
from fedrun.data.partition import too_many_clients
from fedrun.errors import ConfigError, DataError, check, first_line
from fedrun.seeding import derive_seed, torch_generator


# The suffixes of data files and the builder that reads each (a file given as dataset.load.path).
FILE_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json",
                 ".arrow": "arrow", ".txt": "text"}
# The builders of local files, where datasets does not list them (its _PACKAGED_DATASETS_MODULES).
BUILDERS = {"arrow", "csv", "imagefolder", "json", "pandas", "parquet", "text", "webdataset"}


def _require(module: str, setting: str, value: str):
    if module == "datasets":  # its import logs "PyTorch version ... available" at INFO: a second stderr line
        logging.getLogger("datasets").setLevel(max(logging.getLogger("datasets").getEffectiveLevel(),
                                                   logging.WARNING))
    try:
        return __import__(module)
    except ImportError:
        raise ConfigError(setting, value, f"needs the {module} package: pip install 'fedrun[huggingface]'") from None


def _looks_local(path: str) -> bool:
    """Whether ``path`` names a local file or folder rather than a Hub dataset, whose ids are
    ``owner/name`` (``ylecun/mnist``): a bare name (a relative folder), an absolute, home or
    dotted path, a deeper one, or a data file's name.  Such a path is never sent to the Hub,
    which would retry it for half a minute before failing."""
    return ("/" not in path or path.startswith(("/", "~", "./", "../")) or "\\" in path or path.count("/") > 1
            or Path(path).suffix.lower() in FILE_BUILDERS)


def _plain(value):
    """``data_files`` as plain dicts and lists: ``datasets`` reads an OmegaConf DictConfig (what
    the command line's ``{train: a.parquet}`` arrives as) as a list of its keys."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


def _data_paths(value) -> list[str]:
    """The paths of (plain) ``data_files``: a path, a list, or ``{split: path or list}``."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in _data_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _data_paths(v)]
    return [str(value)]


def _check_local(path: str, data_dir: str | None, data_files) -> None:
    """What can be refused before ``datasets`` reads (and caches) anything, or asks the Hub: a
    builder without its files or with files that do not exist, and a local path that is not a
    folder save_to_disk wrote (:func:`_load` reads those)."""
    import datasets.packaged_modules

    if path in (getattr(datasets.packaged_modules, "_PACKAGED_DATASETS_MODULES", None) or BUILDERS):
        if data_dir is None and not data_files:
            raise ConfigError("dataset.load.path", path, "is a builder of local files: name them with dataset.load."
                              "data_files=<file, or {train: ..., test: ...}> or dataset.load.data_dir=<folder>")
        base = Path(data_dir).expanduser() if data_dir is not None else Path()
        if data_dir is not None and not base.is_dir():
            raise ConfigError("dataset.load.data_dir", data_dir, "no such folder")
        for file in _data_paths(data_files or []):
            pattern = any(c in file for c in "*?[") or "://" in file  # a glob or a URL: datasets resolves it
            if not pattern and not (base / Path(file).expanduser()).exists():
                where = f" in {data_dir}" if data_dir else ""
                raise ConfigError("dataset.load.data_files", file, f"no such file{where}")
        return
    folder = Path(path).expanduser()
    if folder.is_dir():
        # load_dataset would guess a builder from the folder's files (text for .txt) and write its
        # cache before fedrun checks a column.
        raise ConfigError("dataset.load.path", path, "is a folder that save_to_disk did not write (no "
                          "dataset_dict.json or dataset_info.json): for a folder of data files name their builder, "
                          f"e.g. dataset.load.path=imagefolder dataset.load.data_dir={path}")
    if folder.is_file():
        builder = FILE_BUILDERS.get(folder.suffix.lower(), "parquet")
        raise ConfigError("dataset.load.path", path, f"is a file: name its builder and the file, e.g. "
                          f"dataset.load.path={builder} dataset.load.data_files={path}")
    if _looks_local(path):
        raise ConfigError("dataset.load.path", path, "no such file or folder (a local path, so the Hub is not "
                          "asked): a folder save_to_disk wrote, a builder (imagefolder, parquet, csv, json) with "
                          "dataset.load.data_files, or a Hub name (owner/name)")


def _load(path: str, name: str | None, data_dir: str | None, data_files):
    """A ``DatasetDict``: a folder that ``save_to_disk`` wrote, else ``load_dataset``'s (a Hub
    name, or a builder of local files), checked first by :func:`_check_local`."""
    datasets = _require("datasets", "dataset", "huggingface")
    folder = Path(path).expanduser()
    if folder.is_dir() and ((folder / "dataset_dict.json").is_file() or (folder / "dataset_info.json").is_file()):
        loaded = datasets.load_from_disk(str(folder))
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    data_files = _plain(data_files)
    _check_local(path, data_dir, data_files)
    try:
        return datasets.load_dataset(path, name, data_dir=data_dir, data_files=data_files)
    except Exception as e:  # noqa: BLE001 - the library's many errors (no network, no such dataset), in one line
        raise DataError(f"dataset.load.path={path}: Hugging Face datasets cannot load it ({type(e).__name__}: "
                        f"{first_line(e)})") from None


def _labels(values: list, split: str, path: str) -> torch.Tensor:
    """Integer labels as int64, each checked: numpy's cast would cut 3.7 to 3 and read true as 1,
    and a missing label (None) would fail with a bare TypeError."""
    y = np.asarray(values)
    if y.dtype.kind in "iu" or (y.dtype.kind == "f" and np.all(np.mod(y, 1) == 0)):
        return torch.from_numpy(y.astype(np.int64))
    i, v = next((i, v) for i, v in enumerate(values) if isinstance(v, (bool, np.bool_)) or not isinstance(
        v, (int, float, np.integer, np.floating)) or not float(v).is_integer())
    raise DataError(f"dataset.load.label_column: the {split} label of example {i} of {path} is {v!r}: labels are "
                    "integers 0..C-1")


def _images(column, channels: int, image_size: int, split: str, path: str) -> torch.Tensor:
    """``[N, C, H, W]`` float32 in [0, 1] from a column of PIL images or arrays (uint8 0..255, or
    floats already in [0, 1]), every pixel checked: a NaN, or floats of 0..255 that the scale
    would leave as they are, would reach the normalization, which names no example."""
    column = list(column)  # datasets 4's lazy Column decodes its images on each pass
    missing = next((i for i, v in enumerate(column) if v is None), None)
    if missing is not None:
        raise DataError(f"dataset.load.image_column: the {split} image of example {missing} of {path} is missing "
                        "(None): every example needs its image")
    arrays = [np.asarray(v) for v in column]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise DataError(f"dataset.load.image_column: the {split} images have several shapes ({sorted(shapes)[:3]} "
                        "...); fedrun needs one size (resize them first)")
    x = np.stack(arrays)
    if x.ndim == 3:  # [N, H, W]: grey
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):  # [N, H, W, C]
        x = x.transpose(0, 3, 1, 2)
    elif x.ndim == 2:  # [N, features]: laid out as a square
        side = int(round(np.sqrt(x.shape[1] / channels)))
        if channels * side * side != x.shape[1]:
            raise DataError(f"dataset.load.image_column: rows of {x.shape[1]} values are not {channels} square "
                            "channel(s)")
        x = x.reshape(len(x), channels, side, side)
    if x.shape[1:] != (channels, image_size, image_size):
        raise ConfigError("dataset.image_size", image_size, f"the {split} images are {x.shape[1]} x {x.shape[2]} x "
                          f"{x.shape[3]} (channels x height x width): set dataset.channels={x.shape[1]} "
                          f"dataset.image_size={x.shape[2]}" if x.ndim == 4 and x.shape[2] == x.shape[3] else
                          f"the {split} images' shape is {x.shape[1:]}: fedrun needs square images")
    scale = 255.0 if np.issubdtype(x.dtype, np.integer) else 1.0
    if x.dtype.kind not in "iufb":
        raise DataError(f"dataset.load.image_column: the {split} images of {path} hold {x.dtype} values: pixels "
                        "are numbers (integers 0..255, or floats in [0, 1])")
    if x.dtype.kind != "b":
        bad = ~np.isfinite(x) | (x < 0) | (x > (255 if scale == 255.0 else 1))
        if bad.any():
            i = int(np.argwhere(bad)[0][0])
            raise DataError(f"dataset.load.image_column: the {split} image of example {i} of {path} holds "
                            f"{x[bad][0]:g}: pixels are integers 0..255, or floats in [0, 1]")
    return torch.from_numpy(x.astype(np.float32) / scale)


def hf_dataset(path: str | None = None, name: str | None = None, data_dir: str | None = None, data_files=None,
               train_split: str = "train", test_split: str | None = "test", image_column: str = "image",
               label_column: str = "label", client_column: str | None = None, channels: int = 1,
               image_size: int = 28, num_classes: int | None = None, test_fraction: float = 0.2,
               split_seed: int = 0) -> RawData:
    """A Hugging Face dataset of images as fedrun's :class:`RawData`.

    Args:
      path: a Hub name (``ylecun/mnist``, ``flwrlabs/femnist``), a builder for local files
        (``imagefolder``, ``parquet``, ``csv``, ``json``) with ``data_dir``/``data_files``, or a
        folder ``save_to_disk`` wrote.
      name: the dataset's configuration, if it has several.
      train_split, test_split: the splits to read; a missing test split (or ``test_split`` null)
        holds out ``test_fraction`` of the training split (by ``split_seed``).
      image_column, label_column: the images (PIL images, or arrays) and the integer labels.
      client_column: each example's client (a writer, a user): ``partition=natural`` keeps them.
      channels, image_size: the images' shape (the dataset's ``channels``/``image_size``).
      num_classes: None: from the label feature's names, else 1 + the largest label.
    """
    s = "dataset.load."
    if path is None:
        raise ConfigError(s + "path", None, "dataset=huggingface needs a dataset: a Hub name, a builder "
                          "(imagefolder, parquet, csv) with data_files, or a folder save_to_disk wrote")
    loaded = _load(path, name, data_dir, data_files)
    if train_split not in loaded:
        raise ConfigError(s + "train_split", train_split, f"not a split of {path}; it has: {', '.join(loaded)}")
    train = loaded[train_split]
    for setting, column in ((s + "image_column", image_column), (s + "label_column", label_column),
                            (s + "client_column", client_column)):
        if column is not None and column not in train.column_names:
            raise ConfigError(setting, column, f"is not a column of {path}; it has: {', '.join(train.column_names)}")
    test = loaded[test_split] if test_split is not None and test_split in loaded else None
    for setting, column in ((s + "image_column", image_column), (s + "label_column", label_column),
                            (s + "client_column", client_column)):
        if test is not None and column is not None and column not in test.column_names:  # a bare KeyError later
            raise ConfigError(setting, column, f"is not a column of {path}'s {test_split} split; it has: "
                              f"{', '.join(test.column_names)}")
    if test is None:
        check(0 < test_fraction < 1, s + "test_fraction", test_fraction, "must be in (0, 1)")
        n_test = min(max(int(round(test_fraction * len(train))), 1), len(train) - 1)
        perm = torch.randperm(len(train), generator=torch_generator(split_seed, "hf_split")).tolist()
        train, test = train.select(sorted(perm[n_test:])), train.select(sorted(perm[:n_test]))
    feature = train.features.get(label_column)
    classes = num_classes or (len(feature.names) if hasattr(feature, "names") else None)
    tensors, names = [], None
    if client_column is not None:
        names = {c: i for i, c in enumerate(sorted({str(v) for v in train[client_column]} |
                                                  {str(v) for v in test[client_column]}))}
    for split, part in (("training", train), ("test", test)):
        clients = None if client_column is None else list(part[client_column])
        if clients is not None and None in clients:  # str(None) would make a client named "None"
            raise DataError(f"dataset.load.client_column: the {split} example {clients.index(None)} of {path} has no "
                            "client (None): every example names the client that holds it")
        x = _images(part[image_column], channels, image_size, split, path)
        y = _labels(list(part[label_column]), split, path)
        groups = None if names is None else torch.as_tensor([names[str(v)] for v in clients])
        tensors.append((x, y, groups))
    (train_x, train_y, train_groups), (test_x, test_y, test_groups) = tensors
    classes = classes or int(max(train_y.max(), test_y.max())) + 1
    for split, y in (("training", train_y), ("test", test_y)):  # ClassLabel writes -1 for a missing label
        outside = torch.nonzero((y < 0) | (y >= classes)).flatten()
        if len(outside):
            raise DataError(f"dataset.load.label_column: the {split} label of example {int(outside[0])} of {path} is "
                            f"{int(y[outside[0]])}: labels are integers 0..{classes - 1}")
    return RawData(train_x, train_y, test_x, test_y, classes, train_groups, test_groups)


def flwr_partition(labels, num_clients: int, num_classes: int, seed: int, partitioner=None) -> list[np.ndarray]:
    """A flwr-datasets partitioner's split of the training set, as fedrun's index arrays.

    ``partitioner``: the partitioner's class or a partial of it with its own settings
    (``partition=flwr`` builds one from the config: :func:`fedrun.data.flower.flwr_partitioner`).
    fedrun gives it what is fedrun's, where the class takes it: ``num_partitions`` (K),
    ``partition_by`` (``label``) and, unless the partial holds a seed of the user's, a ``seed``
    derived from the run's seed.  It partitions a dataset of the training labels (column
    ``label``) with each example's row number beside it, which comes back as the client's indices.
    """
    datasets = _require("datasets", "partition", "flwr")
    _require("flwr_datasets", "partition", "flwr")
    if partitioner is None:
        raise ConfigError("partition.partitioner", None, "name a flwr-datasets partitioner, e.g. "
                          "partition.partitioner=IidPartitioner")
    base = getattr(partitioner, "func", partitioner)
    given = getattr(partitioner, "keywords", None) or {}
    params = inspect.signature(base).parameters
    kwargs = {}
    if "num_partitions" in params:
        kwargs["num_partitions"] = num_clients
    if "partition_by" in params and "partition_by" not in given:
        kwargs["partition_by"] = "label"
    if "seed" in params and given.get("seed") is None:  # a seed the user gave is the partitioner's own
        kwargs["seed"] = derive_seed(seed, "flwr_partition") % 2**32
    try:
        made = partitioner(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError("partition.partitioner", base.__name__, f"cannot be built: {first_line(e)}") from None
    labels = np.asarray(labels, dtype=np.int64)
    if num_clients > len(labels):
        raise too_many_clients(num_clients, len(labels), "flwr", "gives every client at least one example (fedrun's "
                               f"clients train on their own) and the training set has {len(labels):,}")
    made.dataset = datasets.Dataset.from_dict({"label": labels, "_fedrun_row": np.arange(len(labels))})
    if "num_partitions" not in params:  # sized by its own settings (InnerDirichletPartitioner's partition_sizes)
        _check_count(made, base.__name__, given, num_clients)
    try:
        with warnings.catch_warnings():  # pyarrow's deprecation notes about how datasets sorts: not the user's
            warnings.filterwarnings("ignore", category=FutureWarning, module="pyarrow")
            parts = _flwr_parts(made, num_clients)
    except ValueError as e:  # the partitioner's own checks (min_partition_size not reached ...)
        raise ConfigError("partition.partitioner", base.__name__,
                          f"cannot split these labels: {first_line(e)}") from None
    empty = [k for k, p in enumerate(parts) if not len(p)]
    if empty:
        raise ConfigError("partition.partitioner", base.__name__,
                          f"left {len(empty):,} of {num_clients:,} clients without an example (the first is client "
                          f"{empty[0]}), and fedrun's clients each train on their own: use fewer clients "
                          "(hyperparams.num_clients) or the partitioner's own minimum (e.g. "
                          "partition.min_partition_size=1)")
    return parts


def _check_count(made, name: str, given: Mapping, num_clients: int) -> None:
    """A partitioner that takes no ``num_partitions`` makes as many partitions as its settings say
    (``partition_sizes``: one size a client): they must be the run's K clients."""
    sizes = given.get("partition_sizes")
    if sizes is not None and not callable(sizes):
        if len(sizes) != num_clients:
            raise ConfigError("partition.partition_sizes", _shown(sizes), f"gives {len(sizes):,} partitions, one "
                              f"a client, and the run has K={num_clients:,} clients (hyperparams.num_clients)")
        return
    try:
        count = made.num_partitions
    except (TypeError, ValueError) as e:
        raise ConfigError("partition.partitioner", name, f"cannot split these labels: {first_line(e)}") from None
    if count != num_clients:
        raise ConfigError("partition.partitioner", name, f"makes {count:,} partitions, and the run has "
                          f"K={num_clients:,} clients (hyperparams.num_clients): make them equal")


def _shown(values) -> str:
    """A list setting as an override writes it, shortened: ``[10,10,10]``, ``[10,10,...]`` (20 values)."""
    values = list(values)
    head = ",".join(str(v) for v in values[:8])
    return f"[{head}]" if len(values) <= 8 else f"[{head},...] ({len(values):,} values)"


def _rows(dataset) -> np.ndarray:
    """A dataset's ``_fedrun_row`` column as one array, read as a NumPy batch (``dataset[name]``
    is a lazy column in datasets 4, which NumPy would read one decoded row at a time)."""
    return np.asarray(dataset.with_format("numpy", columns=["_fedrun_row"])[:]["_fedrun_row"], dtype=np.int64)


def _flwr_parts(made, num_clients: int) -> list[np.ndarray]:
    """Every partition's rows (the ``_fedrun_row`` column).  Partitioners that compute all the
    partitions at once and keep them (flwr-datasets' ``_partition_id_to_indices``: Dirichlet, Shard,
    Pathological, InnerDirichlet, Linear, Size, NaturalId ...) are read from that table in one pass,
    and ``IidPartitioner``'s contiguous shards (``datasets.Dataset.shard(K, k, contiguous=True)``:
    ``N // K`` rows each, the first ``N mod K`` one more) are cut directly, in either case after the
    first and last partitions, loaded as usual, are checked to agree; any other partitioner is loaded
    one by one, ``load_partition(k)``, which costs some milliseconds a partition (minutes at
    K = 100,000)."""
    def load(k: int) -> np.ndarray:
        return _rows(made.load_partition(k))

    first, parts = load(0), None
    table = getattr(made, "_partition_id_to_indices", None)
    if isinstance(table, Mapping) and len(table) == num_clients and all(k in table for k in range(num_clients)):
        rows = _rows(made.dataset)  # in the partitioner's own order (Shard sorts)
        parts = [rows[np.asarray(table[k], dtype=np.int64)] for k in range(num_clients)]
    elif type(made).__name__ == "IidPartitioner":
        rows = _rows(made.dataset)
        div, mod = divmod(len(rows), num_clients)
        bounds = (div * np.arange(num_clients + 1) + np.minimum(np.arange(num_clients + 1), mod)).tolist()
        parts = [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    if parts is not None and np.array_equal(parts[0], first) and np.array_equal(parts[-1], load(num_clients - 1)):
        return parts
    return [first] + [load(k) for k in range(1, num_clients)]
