"""``partition=flwr``: a flwr-datasets partitioner named and set as a Flower user writes it.

In Flower a partitioner is a class and its keyword arguments::

    ShardPartitioner(num_partitions=10, partition_by="label", num_shards_per_partition=2)

and so it is here: ``partition.partitioner`` names the class (``ShardPartitioner``, any class of
``flwr_datasets.partitioner`` by its name, or ``module.Class`` for one of your own) and the other
``partition.*`` settings are its own arguments::

    fedrun partition=flwr partition.partitioner=ShardPartitioner partition.num_shards_per_partition=2

fedrun passes the two that are its own: ``num_partitions`` (the run's K clients,
``hyperparams.num_clients``) and ``partition_by`` (the training labels).  A setting left null is
not passed (the class's own default); an argument the class does not take is one line naming
the setting and the arguments it does take, checked when the config is built, before any data
is read.  The defaults ``partition=flwr`` writes (``alpha`` 0.5, ``min_partition_size`` 0) are
``DirichletPartitioner``'s, the class it names: conf/partition/flwr.yaml makes them null for any
other class, so naming another never passes one of them.

The seed: a ``partition.seed`` the user gives is the partitioner's (as in Flower); left null,
fedrun derives one from the run's seed, as every partition of fedrun does (:func:`flwr_partition`).
"""
from __future__ import annotations

import functools
import importlib
import inspect

from fedrun.data.huggingface import _plain, _require, flwr_partition
from fedrun.errors import ConfigError

# The arguments fedrun gives the partitioner itself, and what each comes from.
FEDRUN_PASSES = {"num_partitions": "hyperparams.num_clients (K)",
                 "partition_by": "the training labels (fedrun's column 'label')"}
MODULE = "flwr_datasets.partitioner"


def partitioner_class(name):
    """The partitioner class ``name`` names: a class of ``flwr_datasets.partitioner`` by its name
    (``ShardPartitioner``), or ``module.Class`` (a partitioner of one's own, or the full path);
    a class as it is.  Anything else is one line listing the classes flwr-datasets has."""
    _require("flwr_datasets", "partition", "flwr")
    import flwr_datasets.partitioner as partitioners

    if inspect.isclass(name):
        return name
    if not isinstance(name, str) or not name:
        raise ConfigError("partition.partitioner", name, f"name a partitioner class, e.g. ShardPartitioner "
                          f"(one of {MODULE}: {', '.join(_names(partitioners))})")
    module, _, short = name.rpartition(".")
    if not module:
        found = getattr(partitioners, name, None)
        if not inspect.isclass(found):
            raise ConfigError("partition.partitioner", name, f"not a partitioner of {MODULE}; it has: "
                              f"{', '.join(_names(partitioners))} (or name a class of your own as module.Class)")
        return found
    try:
        found = getattr(importlib.import_module(module), short)
    except (ImportError, AttributeError) as e:
        raise ConfigError("partition.partitioner", name, f"cannot be imported ({type(e).__name__}: {e}); a class "
                          f"of {MODULE} is named alone, e.g. ShardPartitioner") from None
    if not (inspect.isclass(found) and issubclass(found, partitioners.Partitioner)):
        raise ConfigError("partition.partitioner", name, f"is not a flwr-datasets partitioner (a subclass of "
                          f"{MODULE}.Partitioner)")
    return found


def _names(partitioners) -> list[str]:
    """The partitioner classes flwr-datasets exports (its ``__all__``), but the abstract base."""
    return [n for n in getattr(partitioners, "__all__", dir(partitioners))
            if n.endswith("Partitioner") and n != "Partitioner" and inspect.isclass(getattr(partitioners, n, None))]


def own_arguments(cls) -> list[str]:
    """The arguments of ``cls`` a user sets: its keyword arguments but fedrun's own
    (:data:`FEDRUN_PASSES`)."""
    params = inspect.signature(cls).parameters
    return [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and n not in FEDRUN_PASSES]


def partitioner_arguments(cls, arguments: dict) -> dict:
    """The keyword arguments to build ``cls`` with: ``arguments`` (the ``partition.*`` settings)
    without the null ones, each checked to be an argument of ``cls``; fedrun's own
    (:data:`FEDRUN_PASSES`) are refused, but ``partition_by: label``, which is what fedrun passes
    (a config of an earlier fedrun wrote it).  A required argument left out is one line too."""
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    own = own_arguments(cls)
    taken = ", ".join(own) or "none"
    kwargs = {}
    for key, value in arguments.items():
        if value is None:  # null: not given, the class's own default
            continue
        if key == "partition_by" and value == "label":
            continue
        if key in FEDRUN_PASSES:
            raise ConfigError(f"partition.{key}", value, f"fedrun passes it itself: {FEDRUN_PASSES[key]}; "
                              "leave it out")
        if key not in own and not takes_any:
            raise ConfigError(f"partition.{key}", value, f"not an argument of {cls.__name__}; it takes: {taken} "
                              "(fedrun passes num_partitions and partition_by)")
        kwargs[key] = _plain(value)  # lists as lists: InnerDirichletPartitioner checks for one
    missing = [n for n in own if params[n].default is inspect.Parameter.empty and n not in kwargs
               and params[n].kind is not params[n].VAR_POSITIONAL]
    if missing:
        raise ConfigError(f"partition.{missing[0]}", "null", f"{cls.__name__} needs it (its arguments: {taken})")
    return kwargs


def flwr_partitioner(partitioner="DirichletPartitioner", **arguments):
    """``partition=flwr``'s factory (conf/partition/flwr.yaml): the partition function of the
    class ``partitioner`` built with ``arguments``, checked here, when the config is built.

    ``partitioner`` is a class name, ``module.Class``, a class, or a partial of one (Hydra's
    ``_target_``/``_partial_`` node, as earlier configs wrote it: its keywords count as given).
    The function returned is fedrun's partition, ``(labels, num_clients, num_classes, seed)`` ->
    the clients' index arrays (:func:`fedrun.data.huggingface.flwr_partition`)."""
    if isinstance(partitioner, functools.partial):
        arguments = {**partitioner.keywords, **arguments}
        partitioner = partitioner.func
    cls = partitioner_class(partitioner)
    kwargs = partitioner_arguments(cls, arguments)
    return functools.partial(flwr_partition, partitioner=functools.partial(cls, **kwargs))
