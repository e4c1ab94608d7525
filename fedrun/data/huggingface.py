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
from pathlib import Path

import numpy as np
import torch

from fedrun.data.datasets import RawData
from fedrun.errors import ConfigError, DataError, check, first_line
from fedrun.seeding import derive_seed, torch_generator


def _require(module: str, setting: str, value: str):
    try:
        return __import__(module)
    except ImportError:
        raise ConfigError(setting, value, f"needs the {module} package: pip install 'fedrun[huggingface]'") from None


def _load(path: str, name: str | None, data_dir: str | None, data_files):
    """A ``DatasetDict``: a folder that ``save_to_disk`` wrote, else ``load_dataset``'s."""
    datasets = _require("datasets", "dataset", "huggingface")
    folder = Path(path).expanduser()
    if folder.is_dir() and ((folder / "dataset_dict.json").is_file() or (folder / "dataset_info.json").is_file()):
        loaded = datasets.load_from_disk(str(folder))
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    try:
        return datasets.load_dataset(path, name, data_dir=data_dir, data_files=data_files)
    except Exception as e:  # noqa: BLE001 - the library's many errors (no network, no such dataset), in one line
        raise DataError(f"dataset.load.path={path}: Hugging Face datasets cannot load it ({type(e).__name__}: "
                        f"{first_line(e)})") from None


def _images(column, channels: int, image_size: int, split: str) -> torch.Tensor:
    """``[N, C, H, W]`` float32 in [0, 1] from a column of PIL images or arrays (uint8 0..255, or
    floats already in [0, 1])."""
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
        x = _images(part[image_column], channels, image_size, split)
        y = torch.as_tensor(np.asarray(part[label_column], dtype=np.int64))
        groups = None if names is None else torch.as_tensor([names[str(v)] for v in part[client_column]])
        tensors.append((x, y, groups))
    (train_x, train_y, train_groups), (test_x, test_y, test_groups) = tensors
    classes = classes or int(max(train_y.max(), test_y.max())) + 1
    return RawData(train_x, train_y, test_x, test_y, classes, train_groups, test_groups)


def flwr_partition(labels, num_clients: int, num_classes: int, seed: int, partitioner=None) -> list[np.ndarray]:
    """A flwr-datasets partitioner's split of the training set, as fedrun's index arrays.

    ``partitioner``: the partitioner's class or a partial of it with its settings (from the
    config: ``partition.partitioner._target_: flwr_datasets.partitioner.DirichletPartitioner``,
    ``partition_by: label``, ``alpha: 0.5`` ...); fedrun gives it ``num_partitions`` (K) and, where
    it takes one, a ``seed`` derived from the run's seed.  It partitions a dataset of the training
    labels (column ``label``) with each example's row number beside it, which comes back as the
    client's indices.
    """
    datasets = _require("datasets", "partition", "flwr")
    _require("flwr_datasets", "partition", "flwr")
    if partitioner is None:
        raise ConfigError("partition.partitioner", None, "name a flwr-datasets partitioner, e.g. "
                          "partition.partitioner._target_=flwr_datasets.partitioner.IidPartitioner")
    base = getattr(partitioner, "func", partitioner)
    kwargs = {"num_partitions": num_clients}
    if "seed" in inspect.signature(base).parameters:
        kwargs["seed"] = derive_seed(seed, "flwr_partition") % 2**32
    try:
        made = partitioner(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError("partition.partitioner", base.__name__, f"cannot be built: {first_line(e)}") from None
    labels = np.asarray(labels, dtype=np.int64)
    made.dataset = datasets.Dataset.from_dict({"label": labels, "_fedrun_row": np.arange(len(labels))})
    try:
        return [np.asarray(made.load_partition(k)["_fedrun_row"], dtype=np.int64) for k in range(num_clients)]
    except ValueError as e:  # the partitioner's own checks (min_partition_size not reached ...)
        raise ConfigError("partition.partitioner", base.__name__, f"cannot split these labels: {first_line(e)}") from None
