"""A run built from a composed config: the config's objects, its data, its :class:`FederatedRun`.

:func:`build` checks every setting (:mod:`fedrun.command.settings`) and builds the config's objects (each
a ``_target_`` node, :data:`OBJECTS`) without touching data or disk, so the command checks a run,
or every run of a sweep, before Hydra starts it.  :func:`federated_run` then loads the data and
returns the run, ready to enter; :func:`run` runs one alone.  The command (:mod:`fedrun.command.cli`) and
the population launcher (``hydra/launcher=population``) both build runs here.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import re
from pathlib import Path

import torch
import yaml
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from fedrun.command import resolvers  # noqa: F401  (registers ${fedrun.num_clients:...}, used by the scale presets)
from fedrun.client import engines
from fedrun.client.parallel import ParallelEngine
from fedrun.command import settings
from fedrun.data.augment import make_augmentation
from fedrun.data.partition import client_ids
from fedrun.data.preparation import NORMALIZATIONS, prepare
from fedrun.data.datasets import DatasetConfig, check_labels
from fedrun.errors import ConfigError, DataError, FedrunError, check, first_line
from fedrun.harness.objective import LAST_N, check_objective
from fedrun.harness.rundir import refuse_existing_run
from fedrun.harness.federated_run import FederatedRun
from fedrun.paths import conf_dir
from fedrun.harness.simulation import run_alone

log = logging.getLogger("fedrun")

# Installed: the configs ship inside the package.  Source checkout / editable install: top-level conf/.
CONF_DIR = conf_dir()
# The config's object nodes (a _target_ each), built by Hydra in build().
OBJECTS = ("federation", "local", "participation", "aggregator", "partition", "engine", "logger", "privacy")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError("device", name, "choose auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError("device", name, "choose auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", name, "CUDA is not available here; use device=cpu or device=auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError("device", name, f"this machine has {torch.cuda.device_count()} CUDA device(s): "
                          f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return device


def resolved(cfg: DictConfig) -> dict:
    """The config as plain values, every interpolation resolved (one line if one cannot be)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        missing = re.search(r"Interpolation key '([^']+)' not found", str(e))
        if missing:  # a setting removed (~hyperparams.lr) that another one is built from
            raise ConfigError(missing.group(1), "missing", f"{key} is built from it (removed with "
                              f"~{missing.group(1)}?)") from None
        raise ConfigError(key, "...", f"cannot be resolved: {first_line(e)}") from None


def build(cfg: DictConfig) -> dict:
    """Validate the config and build everything but the data: cheap, so it also runs before Hydra.

    Every setting is type-checked first (:mod:`fedrun.command.settings`); the objects (:data:`OBJECTS`,
    each a ``_target_`` node) are then built, their constructors checking ranges and choices.
    The dataset node is completed in place with :class:`fedrun.data.datasets.DatasetConfig`'s defaults.
    An error about a copy of a setting (``dataset.load.num_classes: ${..num_classes}``) names the
    setting it copies, the one the user wrote (:func:`as_written`).
    """
    try:
        return _build(cfg)
    except ConfigError as e:
        raise as_written(cfg, e) from None


# A value that only copies another setting: ${key}, ${.key} (same node), ${..key} (the parent's) ...
_COPY = re.compile(r"^\$\{(\.*)([A-Za-z_][\w.]*)\}$")


def written_as(cfg: DictConfig, key: str) -> str:
    """The setting ``key`` copies (following a chain of copies), or ``key`` itself: where a user
    set the value an error found at ``key`` (``dataset.load.root: ${data_root}`` -> ``data_root``)."""
    for _ in range(10):  # a chain of copies, never a loop
        parent, _, leaf = key.rpartition(".")
        try:
            node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
            raw = node._get_node(leaf)._value() if isinstance(node, DictConfig) and leaf in node else None
        except Exception:  # noqa: BLE001 - a key the config does not hold as a node: as it is
            return key
        match = _COPY.match(raw) if isinstance(raw, str) else None
        if not match:
            return key
        dots, target = match.groups()
        base = parent.split(".") if parent else []
        base = base[:len(base) - (len(dots) - 1)] if dots else []  # ${.k}: this node, ${..k}: its parent ...
        key = ".".join([*base, target])
    return key


def as_written(cfg: DictConfig, error: ConfigError) -> ConfigError:
    """``error`` about the setting the user wrote when it was found on a copy of it."""
    source = written_as(cfg, str(error.setting))
    return error if source == error.setting else ConfigError(source, error.value, error.allowed)


def _build(cfg: DictConfig) -> dict:
    complete_dataset(cfg)
    check_one_source(cfg)
    values = resolved(cfg)
    settings.validate(values)
    hp, ds = values["hyperparams"], values["dataset"]
    _check_dataset(ds)
    check(all(0 <= t <= 1 for t in values["targets"]), "targets", values["targets"], "accuracies, each in [0, 1]")
    check_objective(values["objective"])
    last = LAST_N.match(values["objective"])
    check(not last or int(last.group(1)) <= hp["rounds"], "objective", values["objective"],
          f"averages the last n evaluated rounds, and the run has {hp['rounds']} (hyperparams.rounds): choose "
          f"n <= {hp['rounds']}")
    check("_val_acc" not in values["objective"] or hp["validation_fraction"] > 0, "objective",
          values["objective"], "a validation accuracy needs hyperparams.validation_fraction > 0; choose another "
          "objective (best_test_acc, ...) or hold out a validation split")
    check(values["threads"] is None or values["threads"] >= 1, "threads", values["threads"], "must be >= 1 or null")
    augment = make_augmentation(hp["augment"], dataset=ds["name"])  # validates it; built with the data's std in run()
    check(augment is None or augment.pipeline == "code" or augment.brightness == 0
          or ds.get("normalize", "per_channel") == "per_channel", "hyperparams.augment.pipeline", "text",
          "its brightness shift is in units of the dataset's per-channel std: use dataset.normalize=per_channel, "
          "hyperparams.augment.brightness=0, or pipeline=code")
    validation = hp["validation_fraction"]
    check(0 <= validation < 1, "hyperparams.validation_fraction", validation, "must be in [0, 1)")
    k = OmegaConf.select(cfg, "partition.classes_per_client")
    if k is not None:
        check(isinstance(k, int) and 1 <= k <= ds["num_classes"], "partition.classes_per_client", k,
              f"must be between 1 and {ds['num_classes']} (the dataset's classes)")
    objects = {name: _instantiate(cfg[name], name) for name in OBJECTS}
    # After the objects' own range checks: hyperparams.client_fraction=7 is out of range in any mode,
    # which names the setting the user wrote better than a conflict with the mode.
    if values["centralized"]:  # mode=centralized: one learner holding all the training data
        for key, one in (("num_clients", 1), ("client_fraction", 1.0)):
            check(hp[key] == one, f"hyperparams.{key}", hp[key], f"mode=centralized trains one learner on all the "
                  f"data (hyperparams.{key}={one}); use mode=federated for {key}={hp[key]}")
    engines.check(objects["engine"])
    model = _instantiate(cfg.model, "model")  # its constructor's own checks (model.init=xavier), before any data or job
    if hasattr(objects["logger"], "check"):  # a dashboard's folder or store
        objects["logger"].check()
    if values["objective"] in ("final_average_test_acc", "final_sent_test_acc"):
        check(objects["aggregator"].two_models, "objective", values["objective"],
              f"aggregator={objects['aggregator'].name} sends its average model, so the run has one model: "
              "choose final_test_acc (or an aggregator with a server step, e.g. fednnnn)")
    objects["aggregator"].check_local(objects["local"])  # FedNova, SCAFFOLD: SGD's step coefficients
    # privacy.clip: DP-FedAvg around the aggregator's mean, or one line for what cannot be private.
    objects["aggregator"] = objects["privacy"].attach(objects["aggregator"], objects["federation"],
                                                      objects["participation"], objects["local"],
                                                      values["centralized"], model)
    least, per_round = objects["aggregator"].weighting.min_clients, objects["federation"].per_round
    check(per_round >= least, "hyperparams.client_fraction", hp["client_fraction"],
          f"aggregator={objects['aggregator'].name} needs at least {least} clients a round, and "
          f"{hp['client_fraction']} of {hp['num_clients']} clients is {per_round}: raise "
          f"hyperparams.client_fraction or hyperparams.num_clients (or lower the aggregator's f)")
    selects = objects["aggregator"].weighting.selects
    check(selects <= per_round, "aggregator.multi", selects, f"must be at most the clients a round: "
          f"{hp['client_fraction']} of {hp['num_clients']} clients is {per_round}")
    return dict(objects, device=resolve_device(values["device"]), seed=values["seed"], validation=validation,
                notes=no_effect(values, objects))


def no_effect(values: dict, objects: dict) -> list[str]:
    """Settings that are valid alone but do nothing, or only approximately what they say, in this
    combination: one line each, logged as warnings when the run starts (console and fedrun.log).
    They are not refused, so a sweep over them (stragglers x local epochs, ...) still runs whole."""
    hp, local, aggregator = values["hyperparams"], objects["local"], objects["aggregator"]
    notes = []
    if hp["stragglers"] > 0 and hp["local_epochs"] == 1:
        notes.append(f"hyperparams.stragglers={hp['stragglers']}: has no effect with hyperparams.local_epochs=1 "
                     "(a straggler trains between 1 and E epochs)")
    if local.optimizer_state != "reset" and not local.carries_state:
        notes.append(f"hyperparams.optimizer_state={local.optimizer_state}: has no effect: the client optimizer "
                     f"({local.optimizer}, momentum {local.momentum}) keeps no state between steps")
    elif local.carries_state and aggregator.client_optimizers:
        notes.append(f"hyperparams.optimizer_state={local.optimizer_state}: aggregator={aggregator.name} counts "
                     "each client's steps from a zero momentum buffer (||a_k||_1); a buffer carried over from "
                     "earlier rounds makes that count approximate")
    return notes


def complete_dataset(cfg: DictConfig) -> None:
    """Fill the dataset node's missing settings with :class:`fedrun.data.datasets.DatasetConfig`'s defaults,
    so a dataset file of one's own needs only what has none; a missing one of those is one line."""
    node = cfg.get("dataset")
    if not isinstance(node, DictConfig):
        raise ConfigError("dataset", settings.show(node), "must be a dataset config (a group of settings)")
    missing = [key for key in DatasetConfig.required() if key not in node]
    if missing:
        raise ConfigError(f"dataset.{missing[0]}", "missing", f"a dataset config needs "
                          f"{', '.join(DatasetConfig.required())} (docs/sweeps.md: your own datasets)")
    with open_dict(cfg):
        for key, default in DatasetConfig.defaults().items():
            if key not in node:
                node[key] = default


# The nodes of the objects built from hyperparams and the top-level settings (config.yaml): each
# key an interpolation of the setting it comes from, so that setting is the run's one value.
MIRRORS = ("federation", "local", "participation")


@functools.cache
def _mirror_templates() -> dict:
    config = yaml.safe_load((CONF_DIR / "config.yaml").read_text())
    return {name: config[name] for name in MIRRORS}


def check_one_source(cfg: DictConfig) -> None:
    """The objects :data:`MIRRORS` take every value from ``hyperparams`` and the top-level
    settings, which config.yaml records and the scripts read: setting one of their keys directly
    (``local.lr=0.3``) would train with a value no record shows, so it is refused, naming the
    setting to use (``hyperparams.lr``)."""
    for name, template in _mirror_templates().items():
        node = cfg.get(name)
        raw = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node
        if not isinstance(raw, dict):
            raise ConfigError(name, settings.show(raw), "is built from hyperparams; set those instead")
        for key in sorted(set(raw) | set(template)):
            if raw.get(key, "<missing>") == template.get(key, "<missing>"):
                continue
            source = template.get(key)
            source = source[2:-1] if isinstance(source, str) and source.startswith("${") else None
            value = "missing" if key not in raw else settings.show(raw[key])
            allowed = (f"set by {source}; set that instead ({source}={value})" if source and key in raw else
                       f"cannot be removed: it is built from {source}" if source else
                       f"not a setting of {name}, which is built from hyperparams")
            raise ConfigError(f"{name}.{key}", value, allowed)


def _check_dataset(ds: dict) -> None:
    """The dataset's shape and preprocessing settings (its loader's are the loader's to check)."""
    for key in ("channels", "image_size", "num_classes"):
        check(ds[key] >= 1, f"dataset.{key}", ds[key], "must be >= 1")
    check(ds["num_classes"] >= 2, "dataset.num_classes", ds["num_classes"], "must be >= 2")
    for key in ("max_train", "max_test", "per_class"):
        check(ds.get(key) is None or ds[key] >= 1, f"dataset.{key}", ds.get(key), "must be >= 1 or null (all)")
    normalize = ds.get("normalize", "per_channel")
    check(normalize in NORMALIZATIONS, "dataset.normalize", normalize, f"choose one of: {', '.join(NORMALIZATIONS)}")
    for key in ("mean", "std"):
        if ds[key] is not None:
            check(len(ds[key]) == ds["channels"], f"dataset.{key}", settings.show(ds[key]),
                  f"needs one value per channel (dataset.channels={ds['channels']}), or null to compute it")
    if ds["std"] is not None:
        check(all(v > 0 for v in ds["std"]), "dataset.std", settings.show(ds["std"]),
              "must be > 0, one per channel (or null to compute it from the training images)")


def _instantiate(node: DictConfig, group: str):
    try:
        return instantiate(node)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - hydra wraps the constructor's error
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(group, OmegaConf.select(node, "_target_"), f"cannot be built: {first_line(cause)}") from None


# ----------------------------------------------------------------------------- the run

def run(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str]) -> dict:
    """One run of a composed config into ``run_dir``; returns the summary.

    ``choices`` (which option of each config group made the run) and ``overrides`` (the command
    line's settings) are written into ``config.yaml`` beside the settings, so scripts file runs by
    them whatever the run directory is called."""
    return run_alone(federated_run(cfg, run_dir, choices, overrides), progress=bool(cfg.progress))


def federated_run(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str],
                  datasets: dict | None = None, batched: bool = False) -> FederatedRun:
    """The :class:`fedrun.harness.federated_run.FederatedRun` of a composed config, ready to enter.

    ``datasets``: loaded data by :func:`data_key`, shared by the runs of a population (one copy
    on the device for all); ``batched``: train on the batched engine whatever ``engine=auto``
    would choose (a population's runs train in one batched call)."""
    objects = build(cfg)
    run_dir = Path(run_dir)
    if not cfg.resume:
        refuse_existing_run(run_dir)  # before the data is loaded
    make_engine = engines.as_batched(objects["engine"]) if batched else objects["engine"]
    if make_engine.func is ParallelEngine:
        # Every process computes with one thread, the run's own from the data's preparation on,
        # so that the run equals engine=sequential threads=1 (sums over two threads round otherwise).
        torch.set_num_threads(1)
    key = data_key(cfg)
    data = datasets.get(key) if datasets is not None else None
    if data is None:
        data = _prepare_data(cfg, objects)
        if datasets is not None:
            datasets[key] = data
    # Augmentation's brightness is in raw pixel units: it needs the std the data was divided by.
    objects["local"] = dataclasses.replace(objects["local"], augment=make_augmentation(
        cfg.hyperparams.augment, data.std, dataset=cfg.dataset.name))
    config = resolved(cfg)
    config["choices"] = {k: v for k, v in choices.items() if not k.startswith("hydra")}
    config["overrides"] = list(overrides)
    return FederatedRun(run_dir, data, functools.partial(instantiate, cfg.model), objects["partition"],
                        objects["aggregator"], objects["local"], objects["federation"], objects["participation"],
                        make_engine, seed=objects["seed"], device=objects["device"], resume=bool(cfg.resume),
                        targets=tuple(cfg.targets), config=config, dashboard=objects["logger"],
                        objective=str(cfg.objective), notes=tuple(objects["notes"]),
                        data_digest=getattr(data, "source_digest", None), data_source=data_source(cfg))


def check_partition(cfg: DictConfig, data: dict) -> None:
    """Build the run's partition on its data (prepared once per :func:`data_key` into ``data``):
    a partition this data cannot give (more shards or classes than it holds) raises the
    partition's one-line ConfigError, as the run would."""
    objects = build(cfg)
    key = data_key(cfg)
    if key not in data:
        data[key] = _prepare_data(cfg, objects)
    prepared = data[key]
    objects["partition"](labels=prepared.train_y.cpu().numpy(), num_clients=objects["federation"].num_clients,
                         num_classes=prepared.num_classes, seed=objects["seed"],
                         **client_ids(objects["partition"], prepared.train_groups))


def data_key(cfg: DictConfig) -> str:
    """What the prepared data depends on: the dataset's settings, the device, the validation split
    and, when a split or subset is drawn, the seed.  Jobs with equal keys share one copy."""
    values = resolved(cfg)
    ds, hp = values["dataset"], values["hyperparams"]
    seeded = hp["validation_fraction"] > 0 or ds.get("max_train") is not None or ds.get("max_test") is not None
    return json.dumps({"dataset": ds, "device": str(resolve_device(values["device"])),
                       "validation": hp["validation_fraction"], "seed": values["seed"] if seeded else None},
                      sort_keys=True, default=str)


def _prepare_data(cfg: DictConfig, objects: dict):
    """The dataset loaded, checked against the config's shape, normalized and on the device; its
    ``source_digest`` is :func:`data_digest` of the data as loaded."""
    try:
        prepared = _prepare(cfg, objects)
    except ConfigError as e:  # a loader's error about a copy (dataset.load.num_classes): the user's setting
        raise as_written(cfg, e) from None
    return prepared


def data_digest(raw) -> str:
    """SHA-256 of a dataset as loaded (every tensor of :class:`fedrun.data.datasets.RawData`, with
    its shape and type), before any normalization: a checkpoint records it, so a resume refuses
    data changed since the run stopped (a table edited).  The loaded values, not the normalized
    ones: those depend on the thread count the statistics were summed with, which a resume may change."""
    digest = hashlib.sha256()
    for field in dataclasses.fields(raw):
        value = getattr(raw, field.name)
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().contiguous()
            digest.update(f"{field.name}:{value.dtype}:{tuple(value.shape)};".encode())
            digest.update(value.view(-1).view(torch.uint8).numpy() if value.numel() else b"")
        else:
            digest.update(f"{field.name}={value!r};".encode())
    return digest.hexdigest()


def data_source(cfg: DictConfig) -> str:
    """The dataset and the file settings of its loader as written (``dataset=table
    (dataset.load.path=rows.csv)``, ``dataset=mnist (data_root=data)``): what a data refusal names."""
    load = OmegaConf.select(cfg, "dataset.load")
    files = []
    if isinstance(load, DictConfig):
        for key in load:
            value = OmegaConf.select(load, key, throw_on_resolution_failure=False)
            if isinstance(value, str) and key != "_target_" and Path(value).expanduser().exists():
                files.append(f"{written_as(cfg, f'dataset.load.{key}')}={value}")
    return f"dataset={cfg.dataset.name}" + (f" ({', '.join(files)})" if files else "")


def _prepare(cfg: DictConfig, objects: dict):
    raw = _load_data(cfg)
    check_labels(raw, cfg.dataset.num_classes)
    shape = tuple(raw.train_x.shape[1:])
    expected = (cfg.dataset.channels, cfg.dataset.image_size, cfg.dataset.image_size)
    if shape != expected:
        raise ConfigError("dataset.channels/image_size", f"{expected[0]}/{expected[1]}",
                          f"the loaded images are {'x'.join(map(str, shape))} (channels x height x width); set "
                          f"dataset.channels={shape[0]} dataset.image_size={shape[1]}" if shape[1] == shape[2] else
                          f"the loaded images are {'x'.join(map(str, shape))}: fedrun's models take square images")
    mean = None if cfg.dataset.mean is None else list(cfg.dataset.mean)
    std = None if cfg.dataset.std is None else list(cfg.dataset.std)
    prepared = prepare(raw, mean, std, objects["validation"], objects["seed"], objects["device"],
                       cfg.dataset.max_train, cfg.dataset.max_test,
                       normalize=OmegaConf.select(cfg, "dataset.normalize", default="per_channel"),
                       per_class=OmegaConf.select(cfg, "dataset.per_class", default=None))
    prepared.source_digest = data_digest(raw)  # travels with the data a population shares (datasets)
    return prepared


def _load_data(cfg: DictConfig):
    """The dataset's loader; any failure is one line naming the dataset (the loaders name files)."""
    try:
        return instantiate(cfg.dataset.load)
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e
        if isinstance(cause, FedrunError):
            raise cause from None
        if isinstance(cause, KeyboardInterrupt):
            raise cause
        raise DataError(f"dataset={cfg.dataset.name}: cannot be loaded ({type(cause).__name__}: "
                        f"{first_line(cause)})") from None
