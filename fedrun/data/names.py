"""How a dataset is named to people: figure titles, table captions, ``run.json``, ``summary.json``
and the dashboards' tags.

A dataset option may carry a ``label`` (``conf/dataset/cifar10_jpeg.yaml``: "CIFAR-10 (JPEG q75
copy)"); that label is the name it is shown by wherever its runs are, so data that stands in for a
paper's dataset is never shown under that dataset's name.  Without a label, an option of fedrun's is
shown by :data:`DATASET_NAMES`, any other by its option name.
"""
from __future__ import annotations

from typing import Mapping

DATASET_NAMES = {"mnist": "MNIST", "fmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "svhn": "SVHN",
                 "mnist_train10k": "MNIST (10k training images)", "synthetic": "synthetic data",
                 "femnist": "FEMNIST", "cifar10_jpeg": "CIFAR-10 (JPEG q75 copy)",
                 "cifar10_exact": "CIFAR-10 (exact-pixel subset)"}


def dataset_name(option: str | None) -> str | None:
    """The shown name of a dataset option (``cifar10`` -> ``CIFAR-10``); an unknown one as it is."""
    return None if option is None else DATASET_NAMES.get(option, option)


def own_label(config: Mapping | None) -> str | None:
    """The ``label`` a run's dataset option gives itself (a stand-in's, "CIFAR-10 (JPEG q75 copy)"),
    else None: the dashboards tag a run with it only where it says more than the option's name."""
    node = config.get("dataset") if isinstance(config, Mapping) else None
    label = node.get("label") if isinstance(node, Mapping) else None
    return label if isinstance(label, str) and label.strip() else None


def dataset_label(config: Mapping | None) -> str | None:
    """The name of the data a run read, from its config (``config.yaml`` as a dict): its dataset's
    ``label`` where the option has one, else :func:`dataset_name` of the option chosen
    (``choices.dataset``) or of ``dataset.name``; None where the config names no dataset."""
    if not isinstance(config, Mapping):
        return None
    if own_label(config):
        return own_label(config)
    node = config.get("dataset") if isinstance(config.get("dataset"), Mapping) else {}
    choices = config.get("choices") if isinstance(config.get("choices"), Mapping) else {}
    return dataset_name(choices.get("dataset") or node.get("name"))
