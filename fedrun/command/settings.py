"""Every setting fedrun reads, with its type, checked before anything runs or is written.

A composed config has two kinds of node:

* plain settings (``seed``, ``hyperparams.*``, ``dataset.channels`` ...), declared in
  :data:`SCHEMA` with their types;
* objects (``model``, ``partition``, ``aggregator``, ``engine``, ``federation``, ``local``,
  ``participation``, ``privacy``, ``dataset.load``), nodes with a
  ``_target_``, whose settings are the target's keyword arguments and whose types are its
  annotations, so a new model or aggregator needs no entry here.

:func:`validate` walks the whole config and refuses, each with one line naming the setting and
what is allowed: a key nothing reads (``+hyperparams.roundz=3``), a value of the wrong type (an
integer setting given 1.7, a list given 3, a number given ``big``), a float that is infinite or
NaN, an interpolation that cannot be resolved.  Ranges and choices (``lr > 0``, ``weighting`` in
``examples | uniform``) are checked where the values are used, by the objects' constructors and
the dataclasses they fill, which :func:`fedrun.command.build.build` calls before the run directory exists.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Union

from fedrun.errors import ConfigError, did_you_mean, first_line

TARGET = "_target_"
# Hydra's own keys in an object node: how to build it, not settings of it.
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
ANY = object()  # a free-form node (labels, per-method tuned values read by interpolation)

SCHEMA: dict[str, Any] = {
    "seed": int,
    "device": str,
    "resume": bool,
    "data_root": str,
    "progress": bool,
    "targets": list[float],
    "objective": str,
    "threads": Union[int, None],
    "vanilla_every": int,
    "divergence_every": int,
    "snapshots": list[int],
    "client_eval_every": Union[int, None],
    "client_test_fraction": float,
    "client_eval_clients": str,
    "personalize_epochs": int,
    "checkpoint_every": int,
    "tuned": ANY,
    "tags": ANY,
    "centralized": bool,
    "dataset": "dataset",  # fedrun.data.datasets.DatasetConfig's fields (below)
    "model": TARGET,
    "partition": TARGET,
    "aggregator": TARGET,
    "engine": TARGET,
    "logger": TARGET,
    "federation": TARGET,
    "local": TARGET,
    "participation": TARGET,
    "privacy": TARGET,
    "hyperparams": {
        "rounds": int, "num_clients": int, "client_fraction": float, "local_epochs": int,
        "batch_size": int, "lr": float, "optimizer": str, "momentum": float, "nesterov": bool,
        "weight_decay": float, "weight_decay_mode": str, "optimizer_state": str,
        "lr_milestones": list[float], "lr_gamma": float, "augment": Union[bool, dict, None],
        "betas": tuple[float, float], "adam_eps": float, "eval_every": int, "validation_fraction": float,
        "stragglers": float, "dropouts": float, "sampling": str, "availability": Union[float, str, None],
    },
}


def _dataset_schema() -> dict:
    """The dataset node's keys and types: :class:`fedrun.data.datasets.DatasetConfig`'s fields."""
    from fedrun.data.datasets import DatasetConfig

    hints = typing.get_type_hints(DatasetConfig)
    return {f.name: TARGET if f.name == "load" else hints[f.name] for f in dataclasses.fields(DatasetConfig)}


SCHEMA["dataset"] = _dataset_schema()


def validate(config: Mapping) -> None:
    """Check every key and value of a resolved config (a plain dict) against :data:`SCHEMA`."""
    _check_node(config, SCHEMA, "")


def _check_node(node, schema, path: str) -> None:
    if not isinstance(node, Mapping):
        raise ConfigError(path.rstrip("."), show(node), "must be a group of settings (key: value)")
    for key in schema:  # a setting deleted on the command line (~seed) or left out of a file
        if key not in node:
            raise ConfigError(f"{path}{key}", "missing", f"every run needs it (removed with ~{path}{key}?); "
                              "docs/configuration.md gives its default")
    for key, value in node.items():
        name = f"{path}{key}"
        if key not in schema:
            raise ConfigError(name, show(value), f"unknown setting; {did_you_mean(key, schema)}"
                              f"{path.rstrip('.') or 'the top level'} has: {', '.join(schema)}")
        rule = schema[key]
        if rule is ANY:
            continue
        if rule == TARGET:
            check_object(value, name)
        elif isinstance(rule, dict):
            _check_node(value, rule, name + ".")
        else:
            check_value(value, rule, name)


def check_object(node, path: str) -> None:
    """An object node: its ``_target_`` exists and every other key is one of its arguments, of
    the annotated type.  Arguments fedrun passes itself (a partial's required ones) are refused."""
    if not isinstance(node, Mapping) or TARGET not in node:
        raise ConfigError(path, show(node), "must be a group of settings with a _target_ (a fedrun object)")
    target = node[TARGET]
    fn = _locate(target, path)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: let the constructor judge
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # takes any keyword
    settable = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and not (node.get("_partial_") and p.default is inspect.Parameter.empty)]
    hints = _hints(fn)
    short = str(target).rsplit(".", 1)[-1]
    for key, value in node.items():
        if key in HYDRA_KEYS:
            continue
        if key not in settable:
            supplied = " (fedrun passes it itself)" if key in params else ""
            raise ConfigError(f"{path}.{key}", show(value), f"unknown setting of {short}{supplied}; "
                              f"{did_you_mean(key, settable) if not supplied else ''}its settings are: "
                              f"{', '.join(settable) or 'none'}")
        if key in hints:
            check_value(value, hints[key], f"{path}.{key}")


def check_value(value, kind, name: str) -> None:
    """Raise ConfigError unless ``value`` has type ``kind`` (int, float, bool, str, dict, list[X],
    tuple[X, ...], unions and Optional); floats must be finite."""
    if not _conforms(value, kind):
        raise ConfigError(name, show(value), f"must be {describe(kind)}")


def _conforms(value, kind) -> bool:
    if kind is Any or kind is object:
        return True
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, k) for k in typing.get_args(kind))
    if kind is type(None) or kind is None:
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:  # within a 64-bit integer, as PyTorch needs (seeds, counts)
        return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is str:
        return isinstance(value, str)
    if kind is dict or origin is dict or kind is Mapping:
        return isinstance(value, Mapping)
    if origin in (list, tuple, Sequence) or kind in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in typing.get_args(kind) if a is not Ellipsis]
        if origin is tuple and args and Ellipsis not in typing.get_args(kind):
            return len(value) == len(args) and all(_conforms(v, a) for v, a in zip(value, args))
        return not args or all(_conforms(v, args[0]) for v in value)
    return True  # a type fedrun does not check here (a model, a callable): the constructor does


def describe(kind) -> str:
    """``int`` -> "an integer"; ``list[float] | None`` -> "a list of numbers or null"."""
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(describe(k) for k in typing.get_args(kind)))
    if kind is type(None) or kind is None:
        return "null"
    if origin in (list, tuple) or kind in (list, tuple):
        args = [a for a in typing.get_args(kind) if a is not Ellipsis]
        if origin is tuple and len(args) > 1 and Ellipsis not in typing.get_args(kind):
            return f"a list of {len(args)} {_plural(args[0])}"
        return f"a list of {_plural(args[0])}" if args else "a list"
    return {bool: "true or false", int: "an integer (64-bit)", float: "a finite number", str: "a string",
            dict: "a group of settings (key: value)"}.get(kind, getattr(kind, "__name__", str(kind)))


def _plural(kind) -> str:
    return {int: "integers", float: "finite numbers", str: "strings", bool: "booleans"}.get(kind, describe(kind))


def locate(dotted: str):
    """The object a ``_target_`` names (``fedrun.models.nets.MLP``): the longest importable module
    prefix, then attributes.  Raises ImportError or AttributeError."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module named {parts[0]!r}")


def _locate(target, path: str):
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{path}._target_", show(target), "must name a class or function (module.name)")
    try:
        return locate(target)
    except Exception as e:  # noqa: BLE001 - any import failure of the user's module
        raise ConfigError(f"{path}._target_", target, f"cannot be imported ({type(e).__name__}: {first_line(e)})") from None


def _hints(fn) -> dict:
    try:
        return typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else fn)
    except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated: no type check
        return {}


def show(value) -> str:
    """A value as the user typed it: Hydra's syntax (null, true, [1, 2])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)
