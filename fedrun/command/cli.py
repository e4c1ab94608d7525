"""The ``fedrun`` command: its arguments, the checks before Hydra starts, and ``main``.

A run's config is checked before Hydra starts it (:func:`precheck`: composed here once and
built by :func:`fedrun.command.build.build`), a sweep's every value (:func:`precheck_sweep`), so a bad
value or unknown option is one line naming the setting and what is allowed, with a non-zero
exit, before any run directory is touched.  Hydra then runs the job (:func:`_hydra_main`), which
builds and runs it (:mod:`fedrun.command.build`); a sweep's failed jobs are listed at its end
(:mod:`fedrun.command.sweeps`).  :func:`run_overrides` is the same from Python (``fedrun.run``).
"""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from fedrun.command import resolvers  # noqa: F401  (registers ${fedrun.num_clients:...}, used by the scale presets)
from fedrun.errors import (ConfigError, FedrunError, Interrupted, NoSpaceError, Terminated, did_you_mean, disk_full,
                           exit_with, first_line)
from fedrun.paths import conf_dir, conf_options, writable_folder
from fedrun.command.sweeps import (forget_failures, job_failed, last_sweep, record_failure, remove_if_empty,
                                   sweep_failures, sweep_jobs, sweep_table, write_sweep_tables)

# hydra/launcher=population: its config registers on import; main() registers its class.
from hydra_plugins.fedrun_population_launcher.population_launcher import PopulationLauncher

log = logging.getLogger("fedrun")
CONF_DIR = conf_dir()
# PyTorch and the simulation load when a run is checked or started (fedrun.command.build), not for
# `fedrun --help` or `--cfg job`, which then take half a second instead of two.


# ----------------------------------------------------------------------------- one job

@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    """One job: a single run, or one job of a sweep.  Returns the run's ``objective`` as a float,
    so Hydra's sweepers (Optuna, Nevergrad, Ax) can optimize it.

    A failed job of a sweep raises :class:`fedrun.command.sweeps.JobFailed` inside the job, so every
    launcher (basic, joblib, submitit, ray) reports it, and records it in the sweep folder, where
    :func:`main` lists every failed job once the sweep is over."""
    from fedrun.command.build import run
    from fedrun.harness.objective import objective

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    _thread_budget(cfg, hydra_cfg)
    try:
        summary = _guarded(run_dir, lambda: run(cfg, run_dir, hydra_cfg.runtime.choices, hydra_cfg.overrides.task))
        return objective(summary, run_dir, cfg.objective)
    except FedrunError as e:
        if hydra_cfg.mode == RunMode.MULTIRUN and not isinstance(e, Interrupted):
            raise job_failed(Path(hydra_cfg.sweep.dir), hydra_cfg.job.num, run_dir, e) from None
        remove_if_empty(run_dir)
        exit_with(e, e.exit_code)
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
    if threads is None and hydra_cfg.runtime.choices.get("hydra/launcher") == "joblib":
        n_jobs = OmegaConf.select(hydra_cfg, "launcher.n_jobs", default=-1) or 1
        cores = os.cpu_count() or 1
        threads = max(1, cores // (cores if n_jobs < 0 else min(n_jobs, cores)))
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
        log.info("%d CPU thread(s) for this job", threads)


def _guarded(run_dir: Path, job):
    """``job()``, with Ctrl-C, SIGTERM and a full disk turned into their one-line errors."""
    try:
        return job()
    except KeyboardInterrupt as e:
        raise Interrupted(None, terminated=isinstance(e, Terminated)) from None
    except Exception as e:
        if disk_full(e):
            raise NoSpaceError(f"no space left on the device writing to {run_dir}") from None
        raise


def _on_sigterm(signum, frame):
    """SIGTERM (``kill``, a SLURM time limit, preemption) stops a run as Ctrl-C does: after its last
    complete round, in one line, resumable (exit 143)."""
    raise Terminated()


# ----------------------------------------------------------------------------- checking first

def precheck(overrides: list[str], sweep: bool = False, swept: list[str] | None = None) -> None:
    """Compose and validate a single run's config (a sweep's job's with ``sweep``; ``swept``: the
    keys the sweep varies), and the folder it will write to; raise ConfigError with a one-line
    message."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from fedrun.command.build import build
    from fedrun.harness.rundir import check_sweep_folder, refuse_existing_run

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        missing = re.search(r"Could not find '([^']+)/([^']+)'", str(e))
        if missing:  # an option no folder of the search path has (conf/, hydra.searchpath, -cd)
            raise _unknown_option(missing.group(1), missing.group(2), str(e)) from None
        message = first_line(e, limit=1000)
        match = re.search(r"Could not override '([^']+)'", message)
        if match:
            raise _unknown_key(match.group(1), overrides) from None
        raise ConfigError("overrides", " ".join(overrides), message) from None
    chosen = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") == "centralized"), None)
    if chosen is not None:
        raise ConfigError("centralized", chosen.split("=", 1)[-1], "set by the mode group: choose mode=centralized "
                          "or mode=federated")
    folder = _output_folder(cfg, sweep)
    if sweep:
        _check_launcher(cfg)
        _check_subdir(cfg, swept or [])
        check_sweep_folder(folder)  # before Hydra writes multirun.yaml into it
    else:
        launcher = OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hydra/launcher")
        if launcher not in (None, "basic") and launcher not in _WARNED:
            _WARNED.add(launcher)  # a launcher only launches a sweep's jobs: a single run ignores it
            print(f"fedrun: warning: hydra/launcher={launcher}: has no effect without -m (a single run); "
                  "add -m to launch a sweep", file=sys.stderr)
    with open_dict(cfg):
        del cfg["hydra"]
    build(cfg)
    if not sweep and not cfg.resume:
        refuse_existing_run(folder)


_WARNED: set = set()  # the launcher warnings printed by this process (precheck runs once per run)


def _check_launcher(cfg: DictConfig) -> None:
    """The population launcher's and the Optuna sweeper's own settings, before Hydra writes the
    sweep's multirun.yaml (Optuna with no trial ends in a traceback of its own)."""
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default={})
    if choices.get("hydra/launcher") == "population":
        runs = OmegaConf.select(cfg, "hydra.launcher.max_runs")
        if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 1):
            raise ConfigError("hydra.launcher.max_runs", runs, "must be an integer >= 1 (runs a population holds "
                              "at most) or null (no limit)")
    if choices.get("hydra/sweeper") == "optuna":
        for key in ("n_trials", "n_jobs"):
            value = OmegaConf.select(cfg, f"hydra.sweeper.{key}")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"hydra.sweeper.{key}", value, "must be an integer >= 1")


# What makes every job's folder its own in hydra.sweep.subdir: the job's number or its overrides.
JOB_UNIQUE = ("hydra.job.num", "hydra.job.id", "hydra.job.override_dirname")


def _check_subdir(cfg: DictConfig, swept: list[str]) -> None:
    """``hydra.sweep.subdir`` names a folder inside the sweep folder, one of its own for every job:
    not empty, not absolute, no ``..`` (a job would write outside the sweep folder, or every job
    into one folder, the second refused as holding a run).  With Hydra's basic sweeper, a subdir
    naming neither the job's number nor its overrides must name every swept setting."""
    raw = OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("subdir")
    text = "" if raw is None else str(raw)
    parts = Path(text).parts
    if not text.strip() or text.strip() in (".", "./") or Path(text).is_absolute() or ".." in parts:
        raise ConfigError("hydra.sweep.subdir", text or "''", "must name a folder inside hydra.sweep.dir, one for "
                          "each job (e.g. ${hydra.job.num}, the default, or "
                          "${hydra:runtime.choices.aggregator}_seed${seed})")
    if OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hydra/sweeper", "basic") != "basic":
        return  # a sampler's trials differ by hydra.job.num alone
    if swept and not any(u in text for u in JOB_UNIQUE):
        named = [k for k in swept if re.search(r"[{:.]" + re.escape(k.lstrip("+~").split("/")[-1].split(".")[-1])
                                               + r"\}", text)]
        missing = [k.lstrip("+~") for k in swept if k not in named]
        if missing:
            first = missing[0]  # a config group is named by the option chosen, a setting by its value
            hint = f"hydra:runtime.choices.{first}" if (CONF_DIR / first).is_dir() else first
            raise ConfigError("hydra.sweep.subdir", text, f"names no folder of its own for jobs that differ in "
                              f"{', '.join(missing)}: those jobs would share one folder; add ${{{hint}}} (or "
                              "${hydra.job.num})")


def _output_folder(cfg: DictConfig, sweep: bool) -> Path:
    """The run's directory (``hydra.run.dir``), or the sweep's folder (``hydra.sweep.dir``),
    resolved as Hydra will; refused in one line when it cannot be resolved, is a file, or lies
    in a folder this process may not write to."""
    setting = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)  # ${hydra:...} and ${now:...} as in the job
    try:
        text = str(OmegaConf.select(cfg, setting))
        folder = Path(text)
    except OmegaConfBaseException as e:
        raise ConfigError(setting, OmegaConf.to_container(cfg.hydra, resolve=False)[setting.split(".")[1]]["dir"],
                          f"cannot be resolved: {first_line(e)}") from None
    finally:
        HydraConfig.instance().cfg = saved
    if not text.strip():  # Path("") is the working directory: a run's files would land among the user's
        raise ConfigError(setting, "''", "is empty; name a folder for the results")
    writable_folder(setting, folder)
    return folder


def _unknown_option(path: str, value: str, message: str) -> ConfigError:
    """``group=option`` that Hydra cannot find: one line with the options Hydra lists (those of
    every folder on the search path), or fedrun's own for a nested group Hydra gives none for."""
    group = path if path.startswith("hydra/") else path.split("/")[0]  # hydra/launcher: a plugin's group
    listed = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)+)", message)
    choices = [line.strip() for line in listed.group(1).splitlines() if line.strip()] if listed else \
        conf_options(group) if (CONF_DIR / group).is_dir() else []
    value = path[len(group) + 1:] + "/" + value if path != group and "/" in path else value
    plugin = " (Hydra's sweepers and launchers: pip install 'fedrun[sweeps]')" if group.startswith("hydra/") else ""
    return ConfigError(group, value, f"unknown option; {did_you_mean(value, choices)}choose one of: "
                       f"{', '.join(choices)}{plugin}" if choices else f"unknown option{plugin}")


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
        if not values:
            raise ConfigError(key, o.input_line.split("=", 1)[-1], "sweeps no value: give at least one "
                              "(range(a,b) runs a, a+1, ..., b-1)")
        swept.append((key, values))
    firsts = [f"{key}={values[0]}" for key, values in swept]
    varied = [key for key, values in swept if len(values) > 1]
    precheck(fixed + firsts, sweep=True, swept=varied)
    for i, (key, values) in enumerate(swept):
        for value in values[1:]:
            precheck(fixed + firsts[:i] + [f"{key}={value}"] + firsts[i + 1:], sweep=True, swept=varied)
    _check_partitions(fixed, swept)


# Settings a run's partition depends on: a sweep over any of them has its partitions built first.
PARTITION_KEYS = ("partition", "dataset", "hyperparams.num_clients", "seed", "hyperparams.validation_fraction",
                  "hyperparams", "experiment", "scale", "mode")
PARTITION_CHECKS = 200  # at most this many combinations of them are built before a sweep starts


def _check_partitions(fixed: list[str], swept: list[tuple[str, list[str]]]) -> None:
    """Every combination of the swept settings a partition depends on (:data:`PARTITION_KEYS`),
    with the others at their first value: its partition built on its data (loaded once per
    dataset setting), so a partition that is impossible for some jobs only (more shards than the
    data has, ...) is one line before any job runs, as every other setting is."""
    import itertools

    from hydra import compose, initialize_config_dir

    from fedrun.command.build import check_partition

    depends = [(k, v) for k, v in swept if k.lstrip("+~").split(".")[0] in PARTITION_KEYS
               and (k.lstrip("+~") in PARTITION_KEYS or k.lstrip("+~").startswith(("partition.", "dataset.")))]
    if not depends:
        return
    others = [f"{k}={v[0]}" for k, v in swept if (k, v) not in depends]
    combos = list(itertools.islice(itertools.product(*[[f"{k}={x}" for x in v] for k, v in depends]),
                                   PARTITION_CHECKS))
    data: dict = {}
    for combo in combos:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            cfg = compose("config", overrides=[*fixed, *others, *combo])
        try:
            check_partition(cfg, data)
        except ConfigError as e:
            raise ConfigError(e.setting, e.value, f"{e.allowed} (the sweep's job with {' '.join(combo)}; "
                              "nothing was run)") from None


def _unknown_key(key: str, overrides: list[str]) -> ConfigError:
    """``group.key=value`` for a key the config does not have: the error lists the keys it has."""
    from hydra import compose, initialize_config_dir

    from fedrun.command import settings

    value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), "...")
    parent, _, _ = key.rpartition(".")
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            node = OmegaConf.select(compose("config", overrides=rest), parent) if parent else None
        keys = [k for k in node if k not in settings.HYDRA_KEYS] if isinstance(node, DictConfig) else []
    except Exception:  # noqa: BLE001 - the hint is optional; the error is not
        keys = []
    has = f"; {did_you_mean(key.rpartition('.')[2], keys)}{parent} has: {', '.join(keys)}" if keys else \
        " (see `fedrun --help` and docs/configuration.md)"
    return ConfigError(key, value, f"unknown setting{has}")


def main() -> None:
    """Console entry point: check a single run's overrides, then let Hydra run (or sweep).

    A run's settings are checked first (:func:`precheck`), a sweep's every value
    (:func:`precheck_sweep`), with ``-cd DIR`` / ``--config-dir DIR`` (a folder of the user's own
    configs) on the search path; other flags (``--help``, ``--cfg`` ...) go to Hydra as they
    are.  After a sweep, every failed job is listed and the exit code is the first failure's."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    args = sys.argv[1:]
    words = _nested_completion(args)
    if words is not None:
        print(" ".join(words))
        return
    overrides, config_dirs = _split_config_dirs(args)
    if any(a in ("--help", "-h") for a in overrides):  # fedrun's own: settings described, internal ones hidden
        try:
            print(_help([a for a in overrides if not a.startswith("-")], config_dirs), end="")
        except FedrunError as e:
            exit_with(e, e.exit_code)
        return
    sweep = any(a in ("-m", "--multirun") for a in overrides)
    overrides = [a for a in overrides if a not in ("-m", "--multirun")]
    if not any(a.startswith("-") for a in overrides):  # --help, --cfg ...: Hydra's alone
        if config_dirs and not any(o.startswith("hydra.searchpath=") for o in overrides):
            overrides = overrides + [f"hydra.searchpath=[{','.join('file://' + d for d in config_dirs)}]"]
        try:
            (precheck_sweep if sweep else precheck)(overrides)
        except FedrunError as e:
            exit_with(e, e.exit_code)
        except KeyboardInterrupt as e:
            stopped = Interrupted(None, terminated=isinstance(e, Terminated))
            exit_with(stopped, stopped.exit_code)
    # Hydra's plugin scan finds the launcher in an installed wheel, but not behind an editable
    # install's import hook: registered by hand, it is found either way.
    from hydra.core.plugins import Plugins

    Plugins.instance().register(PopulationLauncher)
    if sweep:  # Hydra's parser takes -m only before the overrides; fedrun takes it anywhere
        sys.argv = [sys.argv[0], "-m", *(a for a in sys.argv[1:] if a not in ("-m", "--multirun"))]
    code = 0
    try:
        _hydra_main()
    except SystemExit as e:  # Hydra exits 1 after printing a job's JobFailed line
        code = e.code if isinstance(e.code, int) else 1
    failed = sweep_failures(last_sweep()) if last_sweep() is not None else []
    if last_sweep() is not None and code and not failed and not sweep_jobs(last_sweep()):
        # The sweeper (or launcher) stopped before any job: a table of 0 jobs would hide it.
        print("fedrun: error: no job of the sweep ran: Hydra's sweeper stopped before the first one (its error "
              "is above)", file=sys.stderr)
    elif last_sweep() is not None:
        print("\n".join(sweep_table(last_sweep())))
        # The same table for a paper or a README, before the failure notes it reads are removed.
        written = write_sweep_tables(last_sweep())
        if written:
            print(f"the table as Markdown and LaTeX: {', '.join(map(str, written))}")
        forget_failures(last_sweep())
    if failed:
        for note in failed:
            print(f"fedrun: error: job {note['job']}: {note['error']}", file=sys.stderr)
        exit_with(f"{len(failed)} job(s) of the sweep failed (listed above)", failed[0]["exit_code"])
    if code:
        sys.exit(code)


def _help(overrides: list[str], config_dirs: list[str]) -> str:
    """``fedrun [overrides] --help``: the run those overrides make, every setting a user may set
    with its value, what it does and what it takes (:mod:`fedrun.command.help`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from fedrun.command.help import help_text

    if config_dirs and not any(o.startswith("hydra.searchpath=") for o in overrides):
        overrides = overrides + [f"hydra.searchpath=[{','.join('file://' + d for d in config_dirs)}]"]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError):
        precheck(overrides)  # the one-line error the run itself would give
        raise
    return help_text(cfg, cfg.hydra.help.header, cfg.hydra.help.footer)


def _nested_completion(args: list[str]) -> list[str] | None:
    """Shell completion (``fedrun -sc install=bash``) of a group whose options lie in folders:
    ``experiment=<TAB>`` lists ``experiment=fednnnn/mnist_iid_b`` ..., the form fedrun takes,
    where Hydra's own completion offers nothing (and ``experiment/fednnnn=`` for
    ``experiment/<TAB>``, a form fedrun refuses).  None: Hydra completes as usual."""
    if not any(a.startswith(("-sc", "--shell-completion")) for a in args) or "COMP_LINE" not in os.environ:
        return None
    line = os.environ["COMP_LINE"][: int(os.environ.get("COMP_POINT", len(os.environ["COMP_LINE"])))]
    word = "" if line.endswith(" ") else line.split()[-1]
    group, sep, typed = word.partition("=")
    if not sep:
        group, _, typed = word.partition("/")
    nested = [o for o in conf_options(group)] if group and (CONF_DIR / group).is_dir() else []
    if not any("/" in o for o in nested):
        return None
    return [f"{group}={o}" for o in nested if o.startswith(typed)]


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

def run_overrides(overrides: list[str] | tuple[str, ...] = (), run_dir: str | os.PathLike | None = None) -> dict:
    """Run one fedrun job from Python (a script, a notebook): the same validation, run directory,
    outputs and one-line errors (raised as :class:`fedrun.errors.FedrunError`) as the command
    ``fedrun <overrides>``.  ``overrides``: a list of ``key=value`` strings; ``run_dir``: where
    to write, any path (default: the config's ``hydra.run.dir``, under ``outputs/``).  Returns
    the summary (``summary.json``) with ``run_dir``, where the results are.  Log lines go to the
    console (and the run's ``fedrun.log``) as from the command; a notebook shows tqdm's widget."""
    from hydra import compose, initialize_config_dir

    from fedrun.command.build import run
    from fedrun.logs import ensure_console

    if isinstance(overrides, (str, bytes)):
        raise ConfigError("overrides", repr(overrides), "must be a list of key=value strings, "
                          "e.g. fedrun.run(['aggregator=fedavg', 'hyperparams.rounds=5'])")
    overrides = [str(o) for o in overrides]
    if run_dir is not None:
        overrides = [o for o in overrides if not o.startswith("hydra.run.dir=")]
        overrides.append(f"hydra.run.dir={_quoted(Path(run_dir).expanduser().resolve())}")
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
    console = ensure_console()
    try:
        summary = _guarded(target, lambda: run(cfg, target, choices, list(overrides)))
    except FedrunError:
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        raise
    finally:
        if console is not None:
            logging.getLogger("fedrun").removeHandler(console)
    return {**summary, "run_dir": str(target)}


def _quoted(path: Path) -> str:
    """A path as a Hydra override value: single-quoted, so commas, ``=``, brackets, ``~``, spaces
    and any other character stay part of it.  In Hydra's quoted strings a backslash escapes only
    a quote or the backslashes before one: a quote becomes ``\\'`` and backslashes before a quote
    (or the closing one) are doubled."""
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", str(path))
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text) + "'"


if __name__ == "__main__":
    main()
