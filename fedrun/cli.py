"""The ``fedrun`` command: the only module that touches Hydra and OmegaConf.

It composes the config, turns it into plain objects (:func:`build`), and hands them to
:func:`fedrun.simulation.simulate`.  Before Hydra starts a run, :func:`main` composes the config
once more itself, so a bad value or unknown option is reported as one line naming the setting and
what is allowed, with a non-zero exit, before any run directory is touched.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import re
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedrun import engines, settings
from fedrun.augment import make_augmentation
from fedrun.data import NORMALIZATIONS, check_labels, prepare
from fedrun.errors import ConfigError, DataError, FedrunError, Interrupted, NoSpaceError, check, first_line
from fedrun.rundir import refuse_existing_run
from fedrun.simulation import simulate

log = logging.getLogger("fedrun")

# Installed: the configs ship inside the package.  Source checkout / editable install: top-level conf/.
_PACKAGED = Path(__file__).resolve().parent / "conf"
CONF_DIR = _PACKAGED if (_PACKAGED / "config.yaml").is_file() else Path(__file__).resolve().parents[1] / "conf"
GROUPS = ("dataset", "model", "partition", "aggregator", "hyperparams", "engine", "experiment", "scale", "mode")
# The config's object nodes (a _target_ each), built by Hydra in build().
OBJECTS = ("federation", "local", "participation", "aggregator", "partition", "engine")
# Sweep subdirectories are named after the overrides; "experiment=fednnnn/mnist_iid_b" must not
# become two nested folders.
OmegaConf.register_new_resolver("path_safe", lambda text: str(text).replace("/", "-"), replace=True)


def options(group: str) -> list[str]:
    """The options of a config group: its YAML files, relative to the group folder."""
    folder = CONF_DIR / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


# ----------------------------------------------------------------------------- config -> objects

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
        raise ConfigError(key, "...", f"cannot be resolved: {first_line(e)}") from None


def build(cfg: DictConfig) -> dict:
    """Validate the config and build everything but the data: cheap, so it also runs before Hydra.

    Every setting is type-checked first (:mod:`fedrun.settings`); the objects (:data:`OBJECTS`,
    each a ``_target_`` node) are then built, their constructors checking ranges and choices."""
    values = resolved(cfg)
    settings.validate(values)
    hp, ds = values["hyperparams"], values["dataset"]
    _check_dataset(ds)
    check(all(0 <= t <= 1 for t in values["targets"]), "targets", values["targets"], "accuracies, each in [0, 1]")
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
    engines.check(objects["engine"])
    return dict(objects, device=resolve_device(values["device"]), seed=values["seed"], validation=validation)


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

def run(cfg: DictConfig) -> dict:
    """One run of a composed config into Hydra's output directory."""
    objects = build(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if not cfg.resume:
        refuse_existing_run(run_dir)  # before the data is loaded
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
    data = prepare(raw, mean, std, objects["validation"], objects["seed"], objects["device"],
                   cfg.dataset.max_train, cfg.dataset.max_test,
                   normalize=OmegaConf.select(cfg, "dataset.normalize", default="per_channel"),
                   per_class=OmegaConf.select(cfg, "dataset.per_class", default=None))
    # Augmentation's brightness is in raw pixel units: it needs the std the data was divided by.
    objects["local"] = dataclasses.replace(objects["local"], augment=make_augmentation(
        cfg.hyperparams.augment, data.std, dataset=cfg.dataset.name))
    config = resolved(cfg)
    # Which option of each config group made this run (model: neta_baseline, experiment: pd/iid):
    # scripts file runs by it.
    config["choices"] = {k: v for k, v in HydraConfig.get().runtime.choices.items() if not k.startswith("hydra")}
    model_cfg = cfg.model
    summary = simulate(run_dir, data, functools.partial(instantiate, model_cfg), objects["partition"],
                       objects["aggregator"], objects["local"], objects["federation"],
                       objects["participation"], objects["engine"], seed=objects["seed"], device=objects["device"],
                       resume=bool(cfg.resume), targets=tuple(cfg.targets), progress=bool(cfg.progress),
                       config=config)
    log.info("summary: %s", summary)
    return summary


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


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig):
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        try:
            return run(cfg)
        except KeyboardInterrupt:
            raise Interrupted(None) from None
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(f"no space left on the device writing to {run_dir}") from None
            raise
    except FedrunError as e:
        _remove_if_empty(run_dir)
        if HydraConfig.get().mode == RunMode.MULTIRUN and not isinstance(e, Interrupted):
            # One failed job must not stop a sweep: report it, go on, exit non-zero at the end.
            log.error("job failed: %s", e)
            _FAILED_JOBS.append((str(run_dir), str(e), e.exit_code))
            return None
        _fail(e, e.exit_code)


_FAILED_JOBS: list[tuple[str, str, int]] = []


def _remove_if_empty(run_dir: Path) -> None:
    """Hydra creates the job's directory before fedrun runs; a job refused before writing anything
    leaves nothing behind: the empty directory and the empty parents Hydra made for it go (up to
    the working directory; a directory holding anything is never touched)."""
    cwd, path = Path.cwd().resolve(), run_dir.resolve()
    while path != cwd and cwd in path.parents:
        try:
            path.rmdir()  # only succeeds on an empty directory
        except OSError:
            return
        path = path.parent


def _fail(error, code: int):
    kind = "" if isinstance(error, Interrupted) else "error: "  # Ctrl-C is the user's choice
    print(f"fedrun: {kind}{error}", file=sys.stderr)
    sys.exit(code)


# ----------------------------------------------------------------------------- checking first

def precheck(overrides: list[str]) -> None:
    """Compose and validate a single run's config; raise ConfigError with a one-line message."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+~") in GROUPS and value and value != "null" and value not in options(key.lstrip("+~")):
            group = key.lstrip("+~")
            raise ConfigError(group, value, f"unknown option; choose one of: {', '.join(options(group))}")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        message = first_line(e, limit=1000)
        match = re.search(r"Could not override '([^']+)'", message)
        if match:
            raise _unknown_key(match.group(1), overrides) from None
        raise ConfigError("overrides", " ".join(overrides), message) from None
    build(cfg)
    run_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")), None)
    if run_dir and not cfg.resume:
        refuse_existing_run(Path(run_dir))


def _unknown_key(key: str, overrides: list[str]) -> ConfigError:
    """``group.key=value`` for a key the config does not have: the error lists the keys it has."""
    from hydra import compose, initialize_config_dir

    value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), "...")
    parent, _, _ = key.rpartition(".")
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            node = OmegaConf.select(compose("config", overrides=rest), parent) if parent else None
        keys = [k for k in node if k not in settings.HYDRA_KEYS] if isinstance(node, DictConfig) else []
    except Exception:  # noqa: BLE001 - the hint is optional; the error is not
        keys = []
    has = f"; {parent} has: {', '.join(keys)}" if keys else " (see `fedrun --help` and docs/configuration.md)"
    return ConfigError(key, value, f"unknown setting{has}")


def main() -> None:
    """Console entry point: check a single run's overrides, then let Hydra run (or sweep)."""
    args = sys.argv[1:]
    if not any(a.startswith("-") for a in args):  # flags (-m, --help, --cfg ...) go to Hydra as is
        try:
            precheck(args)
        except FedrunError as e:
            _fail(e, e.exit_code)
        except KeyboardInterrupt:
            _fail(Interrupted(None), Interrupted.exit_code)
    _hydra_main()
    if _FAILED_JOBS:
        for run_dir, message, _ in _FAILED_JOBS:
            print(f"fedrun: error: {run_dir}: {message}", file=sys.stderr)
        _fail(f"{len(_FAILED_JOBS)} job(s) of the sweep failed (listed above)", _FAILED_JOBS[0][2])


if __name__ == "__main__":
    main()
