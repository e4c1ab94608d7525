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
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from fedrun import engines, results, settings
from fedrun.augment import make_augmentation
from fedrun.batched import BatchedEngine
from fedrun.data import NORMALIZATIONS, check_labels, prepare
from fedrun.errors import ConfigError, DataError, FedrunError, Interrupted, NoSpaceError, check, first_line
from fedrun.rundir import refuse_existing_run
from fedrun.simulation import FederatedRun, run_alone

# hydra/launcher=population: its config registers on import; main() registers its class.
from hydra_plugins.fedrun_population_launcher.population_launcher import PopulationLauncher

log = logging.getLogger("fedrun")

# Installed: the configs ship inside the package.  Source checkout / editable install: top-level conf/.
_PACKAGED = Path(__file__).resolve().parent / "conf"
CONF_DIR = _PACKAGED if (_PACKAGED / "config.yaml").is_file() else Path(__file__).resolve().parents[1] / "conf"
# The config's object nodes (a _target_ each), built by Hydra in build().
OBJECTS = ("federation", "local", "participation", "aggregator", "partition", "engine", "logger")


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
    results.check_objective(values["objective"])
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

def run(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str]) -> dict:
    """One run of a composed config into ``run_dir``; returns the summary.

    ``choices`` (which option of each config group made the run) and ``overrides`` (the command
    line's settings) are written into ``config.yaml`` beside the settings, so scripts file runs by
    them whatever the run directory is called."""
    summary = run_alone(federated_run(cfg, run_dir, choices, overrides), progress=bool(cfg.progress))
    log.info("summary: %s", summary)
    return summary


def federated_run(cfg: DictConfig, run_dir: Path, choices: dict, overrides: list[str],
                  datasets: dict | None = None, batched: bool = False) -> FederatedRun:
    """The :class:`fedrun.simulation.FederatedRun` of a composed config, ready to enter.

    ``datasets``: loaded data by :func:`data_key`, shared by the runs of a population (one copy
    on the device for all); ``batched``: train on the batched engine whatever ``engine=auto``
    would choose (a population's runs train in one batched call)."""
    objects = build(cfg)
    run_dir = Path(run_dir)
    if not cfg.resume:
        refuse_existing_run(run_dir)  # before the data is loaded
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
    make_engine = objects["engine"]
    if batched and make_engine.func is engines.auto_engine:
        make_engine = functools.partial(BatchedEngine, **make_engine.keywords)
    return FederatedRun(run_dir, data, functools.partial(instantiate, cfg.model), objects["partition"],
                        objects["aggregator"], objects["local"], objects["federation"], objects["participation"],
                        make_engine, seed=objects["seed"], device=objects["device"], resume=bool(cfg.resume),
                        targets=tuple(cfg.targets), config=config, dashboard=objects["logger"])


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
    """The dataset loaded, checked against the config's shape, normalized and on the device."""
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
    return prepare(raw, mean, std, objects["validation"], objects["seed"], objects["device"],
                   cfg.dataset.max_train, cfg.dataset.max_test,
                   normalize=OmegaConf.select(cfg, "dataset.normalize", default="per_channel"),
                   per_class=OmegaConf.select(cfg, "dataset.per_class", default=None))


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
def _hydra_main(cfg: DictConfig) -> float | None:
    """One job: a single run, or one job of a sweep.  Returns the run's ``objective`` as a float,
    so Hydra's sweepers (Optuna, Nevergrad, Ax) can optimize it.

    A failed job of a sweep raises :class:`JobFailed` inside the job, so every launcher (basic,
    joblib, submitit, ray) reports it, and records it in the sweep folder, where :func:`main`
    lists every failed job once the sweep is over."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    _thread_budget(cfg, hydra_cfg)
    try:
        summary = _guarded(run_dir, lambda: run(cfg, run_dir, hydra_cfg.runtime.choices, hydra_cfg.overrides.task))
        return results.objective(summary, run_dir, cfg.objective)
    except FedrunError as e:
        if hydra_cfg.mode == RunMode.MULTIRUN and not isinstance(e, Interrupted):
            raise job_failed(Path(hydra_cfg.sweep.dir), hydra_cfg.job.num, run_dir, e) from None
        _remove_if_empty(run_dir)
        _fail(e, e.exit_code)
    except Exception as e:  # a bug, e.g. in a user's own model: listed too, with Hydra's traceback
        if hydra_cfg.mode == RunMode.MULTIRUN:
            record_failure(Path(hydra_cfg.sweep.dir), hydra_cfg.job.num, run_dir,
                           f"{type(e).__name__}: {first_line(e)}", 1)
        raise


def _thread_budget(cfg: DictConfig, hydra_cfg) -> None:
    """PyTorch's CPU threads for this job: ``threads`` when set; under the joblib launcher, the
    machine's cores shared among its ``n_jobs`` parallel jobs (2 jobs on 2 cores: 1 thread each,
    not 2 x 2 threads fighting over 2 cores)."""
    threads = cfg.threads
    launcher = str(OmegaConf.select(hydra_cfg, "launcher._target_", default=""))
    if threads is None and launcher.endswith("JoblibLauncher"):
        n_jobs = OmegaConf.select(hydra_cfg, "launcher.n_jobs", default=-1) or 1
        cores = os.cpu_count() or 1
        threads = max(1, cores // (cores if n_jobs < 0 else min(n_jobs, cores)))
    if threads is not None:
        torch.set_num_threads(threads)
        log.info("%d CPU thread(s) for this job", threads)


def _guarded(run_dir: Path, job):
    """``job()``, with Ctrl-C and a full disk turned into their one-line errors."""
    try:
        return job()
    except KeyboardInterrupt:
        raise Interrupted(None) from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpaceError(f"no space left on the device writing to {run_dir}") from None
        raise


# ----------------------------------------------------------------------------- sweeps

class JobFailed(FedrunError, CompactHydraException):
    """A sweep job's failure, raised inside the job.  Hydra prints a CompactHydraException as its
    one line (no traceback); it pickles with its exit code, so launchers that run jobs in other
    processes (joblib, submitit, ray) hand it back intact."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):
        return JobFailed, (str(self), self.exit_code)


FAILURES = ".failed_jobs"  # in the sweep folder: one JSON per failed job, written by the job itself


def record_failure(sweep_dir: Path, job_num: int, run_dir: Path, error: str, exit_code: int) -> None:
    """Leave a note of the failed job where the launching process finds it, whichever process
    (or machine, with a shared file system) ran the job."""
    folder = sweep_dir / FAILURES
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{job_num}.json").write_text(json.dumps(
        {"job": job_num, "run_dir": str(run_dir), "error": error, "exit_code": exit_code}))


def job_failed(sweep_dir: Path, job_num: int, run_dir: Path, error: FedrunError) -> JobFailed:
    """A sweep job's one-line failure: its directory removed if it holds nothing, the error logged
    and noted for the final list (:func:`record_failure`); the :class:`JobFailed` to hand Hydra."""
    _remove_if_empty(run_dir)
    log.error("job %d failed: %s", job_num, error)
    record_failure(sweep_dir, job_num, run_dir, str(error), error.exit_code)
    return JobFailed(f"{run_dir}: {error}", error.exit_code)


def sweep_failures(sweep_dir: Path) -> list[dict]:
    """The failed jobs of a sweep, in job order."""
    folder = Path(sweep_dir) / FAILURES
    notes = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(notes, key=lambda n: n["job"])


class SweepCallback(Callback):
    """In the launching process: clears the sweep's failure notes before its jobs run (a re-run
    sweep lists only its own failures) and remembers the sweep folder for :func:`main`."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        global _SWEEP_DIR
        _SWEEP_DIR = Path(config.hydra.sweep.dir)
        shutil.rmtree(_SWEEP_DIR / FAILURES, ignore_errors=True)


_SWEEP_DIR: Path | None = None


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

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        missing = re.search(r"Could not find '([^']+)/([^']+)'", str(e))
        if missing:  # an option no folder of the search path has (conf/, hydra.searchpath, -cd)
            raise _unknown_option(missing.group(1), missing.group(2), str(e)) from None
        message = first_line(e, limit=1000)
        match = re.search(r"Could not override '([^']+)'", message)
        if match:
            raise _unknown_key(match.group(1), overrides) from None
        raise ConfigError("overrides", " ".join(overrides), message) from None
    build(cfg)
    run_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")), None)
    if run_dir and not cfg.resume:
        refuse_existing_run(Path(run_dir))


def _unknown_option(path: str, value: str, message: str) -> ConfigError:
    """``group=option`` that Hydra cannot find: one line with the options Hydra lists (those of
    every folder on the search path), or fedrun's own for a nested group Hydra gives none for."""
    group = path if path.startswith("hydra/") else path.split("/")[0]  # hydra/launcher: a plugin's group
    listed = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", message)
    choices = [line.strip() for line in listed.group(1).splitlines() if line.strip()] if listed else \
        options(group) if (CONF_DIR / group).is_dir() else []
    value = path[len(group) + 1:] + "/" + value if path != group and "/" in path else value
    plugin = " (Hydra's sweepers and launchers: pip install 'fedrun[sweeps]')" if group.startswith("hydra/") else ""
    return ConfigError(group, value, f"unknown option; choose one of: {', '.join(choices)}{plugin}" if choices
                       else f"unknown option{plugin}")


def precheck_sweep(overrides: list[str]) -> None:
    """A sweep's settings, checked before any job starts: every value of every swept setting
    (``a=1,2``, ``range(...)``), each with the other swept settings at their first value, so a
    typo in any of them is one line up front instead of one failed job per combination.  Ranges
    a sweeper samples (``interval(...)``) are left to the jobs, and so is anything this cannot
    parse: Hydra then reports it as usual."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return
    prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}
    fixed, swept = [], []
    for o in parsed:
        if not o.is_sweep_override():
            fixed.append(o.input_line)
            continue
        try:
            values = list(o.sweep_string_iterator())
        except HydraException:  # interval(...): the sweeper's to sample
            continue
        key = prefix.get(o.type, "") + o.key_or_group + (f"@{o.package}" if o.package else "")
        swept.append((key, values))
    firsts = [f"{key}={values[0]}" for key, values in swept]
    precheck(fixed + firsts)
    for i, (key, values) in enumerate(swept):
        for value in values[1:]:
            precheck(fixed + firsts[:i] + [f"{key}={value}"] + firsts[i + 1:])


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
    """Console entry point: check a single run's overrides, then let Hydra run (or sweep).

    A run's settings are checked first (:func:`precheck`), a sweep's every value
    (:func:`precheck_sweep`), with ``-cd DIR`` / ``--config-dir DIR`` (a folder of the user's own
    configs) on the search path; other flags (``--help``, ``--cfg`` ...) go to Hydra as they
    are.  After a sweep, every failed job is listed and the exit code is the first failure's."""
    args = sys.argv[1:]
    overrides, config_dirs = _split_config_dirs(args)
    sweep = any(a in ("-m", "--multirun") for a in overrides)
    overrides = [a for a in overrides if a not in ("-m", "--multirun")]
    if not any(a.startswith("-") for a in overrides):  # --help, --cfg ...: Hydra's alone
        if config_dirs and not any(o.startswith("hydra.searchpath=") for o in overrides):
            overrides = overrides + [f"hydra.searchpath=[{','.join('file://' + d for d in config_dirs)}]"]
        try:
            (precheck_sweep if sweep else precheck)(overrides)
        except FedrunError as e:
            _fail(e, e.exit_code)
        except KeyboardInterrupt:
            _fail(Interrupted(None), Interrupted.exit_code)
    # Hydra's plugin scan finds the launcher in an installed wheel, but not behind an editable
    # install's import hook: registered by hand, it is found either way.
    from hydra.core.plugins import Plugins

    Plugins.instance().register(PopulationLauncher)
    code = 0
    try:
        _hydra_main()
    except SystemExit as e:  # Hydra exits 1 after printing a job's JobFailed line
        code = e.code if isinstance(e.code, int) else 1
    failed = sweep_failures(_SWEEP_DIR) if _SWEEP_DIR is not None else []
    if failed:
        for note in failed:
            print(f"fedrun: error: job {note['job']}: {note['error']}", file=sys.stderr)
        _fail(f"{len(failed)} job(s) of the sweep failed (listed above)", failed[0]["exit_code"])
    if code:
        sys.exit(code)


def _split_config_dirs(args: list[str]) -> tuple[list[str], list[str]]:
    """``args`` without ``-cd DIR`` / ``--config-dir DIR`` / ``--config-dir=DIR``, and those DIRs
    (absolute)."""
    rest, dirs, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a in ("-cd", "--config-dir") and i + 1 < len(args):
            dirs.append(str(Path(args[i + 1]).resolve()))
            i += 2
            continue
        if a.startswith("--config-dir="):
            dirs.append(str(Path(a.split("=", 1)[1]).resolve()))
        else:
            rest.append(a)
        i += 1
    return rest, dirs


# ----------------------------------------------------------------------------- from Python

def run_overrides(overrides: list[str] | tuple[str, ...] = (), run_dir: str | Path | None = None) -> dict:
    """Run one fedrun job from Python (a script, a notebook): the same validation, run directory,
    outputs and one-line errors (raised as :class:`fedrun.errors.FedrunError`) as the command
    ``fedrun <overrides>``.  ``run_dir``: where to write (default: the config's
    ``hydra.run.dir``, under ``outputs/``).  Returns the summary (``summary.json``)."""
    from hydra import compose, initialize_config_dir

    overrides = [o for o in overrides if not (run_dir is not None and o.startswith("hydra.run.dir="))]
    if run_dir is not None:
        overrides.append(f"hydra.run.dir={Path(run_dir).resolve()}")
    precheck(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # resolves ${hydra:...} in the run directory's name
    target = Path(cfg.hydra.run.dir)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    if logging.getLogger("fedrun").level == logging.NOTSET:  # fedrun.log gets INFO records
        logging.getLogger("fedrun").setLevel(logging.INFO)
    try:
        return _guarded(target, lambda: run(cfg, target, choices, list(overrides)))
    except FedrunError:
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        raise


if __name__ == "__main__":
    main()
