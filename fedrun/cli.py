"""The ``fedrun`` command: the only module that touches Hydra and OmegaConf.

It composes the config, turns it into plain objects (:func:`build`), and hands them to
:func:`fedrun.simulation.simulate`.  Before Hydra starts a run, :func:`main` composes the config
once more itself, so a bad value or unknown option is reported as one line naming the setting and
what is allowed, with a non-zero exit, before any run directory is touched.
"""
from __future__ import annotations

import dataclasses
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

from fedrun.augment import make_augmentation
from fedrun import partition as partitions
from fedrun.data import prepare
from fedrun.engine import LocalTraining
from fedrun.errors import ConfigError, DataError, DivergenceError, check
from fedrun.participation import Participation
from fedrun.simulation import Federation, refuse_existing_run, simulate

log = logging.getLogger("fedrun")

# Installed: the configs ship inside the package.  Source checkout / editable install: top-level conf/.
_PACKAGED = Path(__file__).resolve().parent / "conf"
CONF_DIR = _PACKAGED if (_PACKAGED / "config.yaml").is_file() else Path(__file__).resolve().parents[1] / "conf"
GROUPS = ("dataset", "model", "partition", "aggregator", "hyperparams", "engine", "experiment", "scale")
EXIT_CONFIG, EXIT_DIVERGED = 2, 3
# Sweep subdirectories are named after the overrides; "experiment=fednnnn/mnist_iid_b" must not
# become two nested folders.
OmegaConf.register_new_resolver("path_safe", lambda text: str(text).replace("/", "-"), replace=True)


def options(group: str) -> list[str]:
    """The options of a config group: its YAML files, relative to the group folder."""
    folder = CONF_DIR / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


# ----------------------------------------------------------------------------- config -> objects

def _typed(cfg: DictConfig, key: str, kind):
    value = OmegaConf.select(cfg, key)
    try:
        if kind is bool and not isinstance(value, bool):
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(key, value, f"must be a{'n' if kind is int else ''} {kind.__name__}") from None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError("device", name, "choose auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", name, "CUDA is not available here; use device=cpu or device=auto")
    return device


def build(cfg: DictConfig) -> dict:
    """Validate the config and build everything but the data: cheap, so it also runs before Hydra."""
    h = "hyperparams."
    # Centralized ("vanilla") training, the parameter-divergence paper's baseline column: one
    # learner holds the whole training set and a round is its E local epochs, so FedAvg's
    # average is that learner's model and the same loop, CSVs and scripts serve both.
    centralized = _typed(cfg, "centralized", bool)
    federation = Federation(rounds=_typed(cfg, h + "rounds", int),
                            num_clients=1 if centralized else _typed(cfg, h + "num_clients", int),
                            client_fraction=1.0 if centralized else _typed(cfg, h + "client_fraction", float),
                            eval_every=_typed(cfg, h + "eval_every", int),
                            vanilla_every=0 if centralized else _typed(cfg, "vanilla_every", int),
                            snapshots=tuple(_typed(cfg, f"snapshots.{i}", int) for i in range(len(cfg.snapshots))))
    local = LocalTraining(epochs=_typed(cfg, h + "local_epochs", int),
                          batch_size=_typed(cfg, h + "batch_size", int),
                          lr=_typed(cfg, h + "lr", float), momentum=_typed(cfg, h + "momentum", float),
                          nesterov=_typed(cfg, h + "nesterov", bool),
                          weight_decay=_typed(cfg, h + "weight_decay", float),
                          optimizer=str(cfg.hyperparams.optimizer),
                          betas=tuple(_typed(cfg, f"{h}betas.{i}", float) for i in range(2)),
                          weight_decay_mode=str(cfg.hyperparams.weight_decay_mode),
                          optimizer_state=str(cfg.hyperparams.optimizer_state),
                          lr_milestones=tuple(_typed(cfg, f"{h}lr_milestones.{i}", float)
                                              for i in range(len(cfg.hyperparams.lr_milestones))),
                          lr_gamma=_typed(cfg, h + "lr_gamma", float))
    make_augmentation(cfg.hyperparams.augment)  # validates it; built with the data's std in run()
    participation = Participation(stragglers=_typed(cfg, h + "stragglers", float),
                                  dropouts=_typed(cfg, h + "dropouts", float))
    validation = _typed(cfg, h + "validation_fraction", float)
    check(0 <= validation < 1, h + "validation_fraction", validation, "must be in [0, 1)")
    aggregator = _instantiate(cfg.aggregator, "aggregator")
    partition = functools.partial(partitions.iid) if centralized else _instantiate(cfg.partition, "partition")
    k = OmegaConf.select(cfg, "partition.classes_per_client")
    classes = _typed(cfg, "dataset.num_classes", int)
    if k is not None:
        check(isinstance(k, int) and 1 <= k <= classes, "partition.classes_per_client", k,
              f"must be between 1 and {classes} (the dataset's classes)")
    device = resolve_device(str(cfg.device))
    engine = _instantiate(cfg.engine, "engine")
    return dict(engine=engine, federation=federation, local=local, participation=participation,
                aggregator=aggregator, partition=partition,
                device=device, seed=_typed(cfg, "seed", int), validation=validation)


def _instantiate(node: DictConfig, group: str):
    try:
        return instantiate(node)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - hydra wraps the constructor's error
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):
            raise cause from None
        first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise ConfigError(group, OmegaConf.select(node, "_target_"), f"cannot be built: {first}") from None


# ----------------------------------------------------------------------------- the run

def run(cfg: DictConfig) -> dict:
    objects = build(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if not cfg.resume:
        refuse_existing_run(run_dir)  # before anything is written into it
    _write_config(cfg, run_dir)
    log.info("run directory %s", run_dir.resolve())
    raw = _instantiate_data(cfg)
    mean = None if cfg.dataset.mean is None else list(cfg.dataset.mean)
    std = None if cfg.dataset.std is None else list(cfg.dataset.std)
    data = prepare(raw, mean, std, objects["validation"], objects["seed"], objects["device"],
                   cfg.dataset.max_train, cfg.dataset.max_test)
    # Augmentation's brightness is in raw pixel units: it needs the std the data was divided by.
    objects["local"] = dataclasses.replace(objects["local"],
                                           augment=make_augmentation(cfg.hyperparams.augment, data.std))
    model_cfg = cfg.model
    summary = simulate(run_dir, data, functools.partial(instantiate, model_cfg), objects["partition"],
                       objects["aggregator"], objects["local"], objects["federation"],
                       objects["participation"], objects["engine"], seed=objects["seed"], device=objects["device"], resume=bool(cfg.resume),
                       targets=tuple(cfg.targets), progress=bool(cfg.progress))
    log.info("summary: %s", summary)
    return summary


def _instantiate_data(cfg: DictConfig):
    try:
        return instantiate(cfg.dataset.load)
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e
        if isinstance(cause, (DataError, ConfigError)):
            raise cause from None
        raise


def _write_config(cfg: DictConfig, run_dir: Path) -> None:
    """Write the resolved config; on resume, refuse a config that differs from the run's own."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    resolved = OmegaConf.to_container(cfg, resolve=True)
    # Which option of each config group made this run (model: neta_baseline, experiment: pd/iid):
    # scripts file runs by it.
    resolved["choices"] = {k: v for k, v in HydraConfig.get().runtime.choices.items()
                           if not k.startswith("hydra")}
    ignore = ("resume", "progress", "device")
    if cfg.resume and path.exists():
        old = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        diff = sorted(k for k in set(old) | set(resolved) if k not in ignore and old.get(k) != resolved.get(k))
        if diff:
            raise ConfigError("resume", "true", f"the settings differ from the run's config.yaml in: "
                              f"{', '.join(diff)}; resume with the original overrides")
        return
    path.write_text(OmegaConf.to_yaml(resolved))


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig):
    try:
        return run(cfg)
    except (ConfigError, DataError, DivergenceError) as e:
        code = EXIT_DIVERGED if isinstance(e, DivergenceError) else EXIT_CONFIG
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # One failed job must not stop a sweep: report it, go on, exit non-zero at the end.
            log.error("job failed: %s", e)
            _FAILED_JOBS.append((HydraConfig.get().runtime.output_dir, str(e), code))
            return None
        _fail(e, code)


_FAILED_JOBS: list[tuple[str, str, int]] = []


def _fail(error: Exception, code: int):
    print(f"fedrun: error: {error}", file=sys.stderr)
    sys.exit(code)


# ----------------------------------------------------------------------------- checking first

def precheck(overrides: list[str]) -> None:
    """Compose and validate a single run's config; raise ConfigError with a one-line message."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+~") in GROUPS and value and value != "null" and value not in options(key.lstrip("+~")):
            group = key.lstrip("+~")
            raise ConfigError(group, value, f"unknown option; choose one of: {', '.join(options(group))}")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        match = re.search(r"Could not override '([^']+)'", message)
        if match:
            raise ConfigError(match.group(1), "...", "unknown setting (see `fedrun --help` and README.md)") from None
        raise ConfigError("overrides", " ".join(overrides), message) from None
    build(cfg)
    run_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")), None)
    if run_dir and not cfg.resume:
        refuse_existing_run(Path(run_dir))


def main() -> None:
    """Console entry point: check a single run's overrides, then let Hydra run (or sweep)."""
    args = sys.argv[1:]
    if not any(a.startswith("-") for a in args):  # flags (-m, --help, --cfg ...) go to Hydra as is
        try:
            precheck(args)
        except ConfigError as e:
            _fail(e, EXIT_CONFIG)
    _hydra_main()
    if _FAILED_JOBS:
        for run_dir, message, _ in _FAILED_JOBS:
            print(f"fedrun: error: {run_dir}: {message}", file=sys.stderr)
        _fail(f"{len(_FAILED_JOBS)} job(s) of the sweep failed (listed above)", _FAILED_JOBS[0][2])


if __name__ == "__main__":
    main()
