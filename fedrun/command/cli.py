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
from fedrun.errors import (ConfigError, FedrunError, Interrupted, NoSpaceError, Terminated, UsageError, did_you_mean,
                           disk_full, exit_with, first_line)
from fedrun.logs import held_until_started
from fedrun.paths import conf_dir, conf_options, writable_folder
from fedrun.command.sweeps import (forget_failures, forget_sweep, job_failed, last_sweep, record_failure,
                                   remove_if_empty, sweep_failures, sweep_jobs, sweep_table, write_sweep_tables)

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
    try:
        # Lines before the run starts (threads, the data folder read) shown only once it does: a
        # job refused while loading its data or checking its run directory prints its one line alone.
        with held_until_started(on_release=_print_held):
            _thread_budget(cfg, hydra_cfg)
            summary = _guarded(run_dir, lambda: run(cfg, run_dir, hydra_cfg.runtime.choices,
                                                    hydra_cfg.overrides.task))
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


# The load average (runnable processes, over the last minute) per core above which a job left at
# PyTorch's default threads is told that threads=1 would run faster: half as much work again as the
# cores can take (a load just over the cores is often the job before this one still counted).  Measured on a
# 2-core CPU (docs/performance.md, "CPU threads"): idle, 2 threads ran 1.45x faster than 1; at a load
# of 4-5 (two other runs), 1 thread ran 3.3x-5.2x faster than 2, whose threads wait on each other.
BUSY_LOAD_PER_CORE = 1.5


def _thread_budget(cfg: DictConfig, hydra_cfg) -> None:
    """PyTorch's CPU threads for this job: ``threads`` when set; under a launcher that runs jobs
    side by side, the machine's cores shared among them (joblib's ``n_jobs``, submitit_local's
    ``array_parallelism``: 2 jobs on 2 cores get 1 thread each, not 2 x 2 threads fighting over 2
    cores).  Otherwise PyTorch's default, a thread a core: the fastest on an idle machine, and the
    same for every run of a machine (the thread count changes how sums round, so it is never
    chosen from the machine's load); on a busy machine the log says that ``threads=1`` is faster."""
    threads = cfg.threads
    launcher = hydra_cfg.runtime.choices.get("hydra/launcher")
    cores = os.cpu_count() or 1
    if threads is None and launcher == "joblib":
        n_jobs = OmegaConf.select(hydra_cfg, "launcher.n_jobs", default=-1) or 1
        threads = max(1, cores // (cores if n_jobs < 0 else min(n_jobs, cores)))
    elif threads is None and launcher == "submitit_local":
        side_by_side = OmegaConf.select(hydra_cfg, "launcher.array_parallelism", default=256) or 1
        threads = max(1, cores // min(side_by_side, cores))
    if threads is None:
        _say_if_busy(cores)
    if threads is not None:
        import torch

        from fedrun.client.parallel import available_cores

        cores = available_cores()
        if threads > cores:  # threads=1000 on 2 cores: no faster, and each thread a stack of its own
            log.warning("threads=%d: more than the %d core(s) this process may use; %d thread(s) instead",
                        threads, cores, cores)
            threads = cores
        torch.set_num_threads(threads)
        log.info("%d CPU thread(s) for this job", threads)


def _say_if_busy(cores: int) -> None:
    """A job at PyTorch's default threads on a machine with more runnable work than cores: one
    line saying that ``threads=1`` would run it several times faster there."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows)
        return
    if cores > 1 and load > BUSY_LOAD_PER_CORE * cores:
        # A line of advice, not a warning: the results are right whatever the threads.
        log.info("the machine is busy (load average %.1f on %d cores): threads=1 runs a job several times faster "
                    "on a busy machine than PyTorch's default of a thread a core (3-5x measured on 2 cores, "
                    "docs/performance.md#cpu-threads)", load, cores)


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


# ----------------------------------------------------------------------------- composing

def _compose(overrides: list[str], hydra: bool = True) -> DictConfig:
    """The config ``fedrun <overrides>`` runs, composed from conf/ as Hydra's app would (with the
    ``hydra`` node, which names the options chosen, unless ``hydra=False``): the one place the CLI
    composes, for its checks, its help, its sweeps' checks and ``fedrun.run``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


# ----------------------------------------------------------------------------- checking first

def precheck(overrides: list[str], sweep: bool = False, swept: list[str] | None = None) -> None:
    """Compose and validate a single run's config (a sweep's job's with ``sweep``; ``swept``: the
    keys the sweep varies), and the folder it will write to; raise ConfigError with a one-line
    message."""
    from hydra.errors import HydraException

    from fedrun.command.build import build
    from fedrun.harness.rundir import check_sweep_folder, refuse_existing_run

    _check_group_lists(overrides)
    try:
        cfg = _compose(overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        # "Could not load": an option of a list (logger=[tensorboard,nosuch])
        missing = re.search(r"Could not (?:find|load) '([^']+)/([^']+)'", str(e))
        if missing:  # an option no folder of the search path has (conf/, hydra.searchpath, -cd)
            error = _unknown_option(missing.group(1), missing.group(2), str(e))
            listed = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == error.setting
                           and o.split("=", 1)[1].startswith("[")), None)
            if listed is not None:  # the list as the user wrote it, and which of its options is unknown
                error = ConfigError(error.setting, listed, f"{missing.group(2)} is an {error.allowed}")
            raise error from None
        message = first_line(e, limit=1000)
        match = re.search(r"Could not override '([^']+)'", message)
        if match:
            raise _unknown_key(match.group(1), overrides) from None
        bad = _bad_override(overrides) or _named_override(overrides, e)
        if bad is not None:
            raise bad from None
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
    launcher = OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hydra/launcher")
    with open_dict(cfg):
        del cfg["hydra"]
    build(cfg)
    if not sweep and not cfg.resume:
        refuse_existing_run(folder)
    # Printed when the run starts (_print_held): a refusal, here or in the job, is its one line alone on stderr.
    if not sweep and launcher not in (None, "basic") and launcher not in _WARNED:
        _WARNED.add(launcher)  # a launcher only launches a sweep's jobs: a single run ignores it
        _HELD.append(f"fedrun: warning: hydra/launcher={launcher}: has no effect without -m (a single run); "
                     "add -m to launch a sweep")


_WARNED: set = set()  # the launcher warnings printed by this process (precheck runs once per run)
_HELD: list[str] = []  # warning lines of the checks, printed once the run starts


def _print_held() -> None:
    """Print the warnings the checks held back (:data:`_HELD`), once."""
    while _HELD:
        print(_HELD.pop(0), file=sys.stderr)


def _check_launcher(cfg: DictConfig) -> None:
    """The population launcher's and the Optuna sweeper's own settings, before Hydra writes the
    sweep's multirun.yaml (Optuna with no trial ends in a traceback of its own)."""
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default={})
    for part in ("launcher", "sweeper"):  # +hydra.launcher.chunk=2: Hydra's 5-line block when it builds one
        _check_plugin_keys(OmegaConf.select(cfg, f"hydra.{part}"), f"hydra.{part}")
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


def _check_plugin_keys(node, path: str) -> None:
    """Every key of a launcher's or sweeper's node is an argument of its ``_target_`` (one that
    takes any keyword, as joblib's and submitit's do, is theirs to check)."""
    import inspect

    from fedrun.command.settings import HYDRA_KEYS, locate

    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        return
    try:
        params = inspect.signature(locate(node["_target_"])).parameters
    except Exception:  # noqa: BLE001 - a plugin that cannot be imported: Hydra says so
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    settable = [name for name in params if name != "self"]
    for key in node:
        if key not in settable and key not in HYDRA_KEYS:
            value = OmegaConf.to_container(node, resolve=False)[key]
            raise ConfigError(f"{path}.{key}", value, f"unknown setting of {node['_target_'].rsplit('.', 1)[-1]}; "
                              f"{did_you_mean(key, settable)}its settings are: {', '.join(settable) or 'none'}")


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


def _bad_override(overrides: list[str], sweep: bool = False) -> ConfigError | None:
    """The override a failure of Hydra's is about, as one line naming it (None: none found): a
    value Hydra's grammar cannot read (a non-ASCII character outside quotes, an empty
    ``choice()``), or, without ``-m``, several values (``seed=0,1``, ``range(...)``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in overrides:
        key, _, value = text.partition("=")
        try:
            parsed = parser.parse_overrides([text])[0]
        except HydraException as e:
            odd = next((c for c in text if ord(c) > 127), None)
            if odd is not None:  # Hydra's grammar takes non-ASCII characters in quoted values only
                return ConfigError(key.lstrip("+~"), value, f"Hydra reads a character such as {odd!r} only inside "
                                   f"quotes: write '{key}=\"{value}\"' (the shell's quotes around Hydra's)")
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            why = next((line for line in lines if not line.startswith(("Error parsing override", "See https"))),
                       lines[0] if lines else type(e).__name__)
            return ConfigError(key.lstrip("+~"), value, f"cannot be read as a Hydra override ({why})")
        if parsed.is_sweep_override() and not sweep:
            many = (f"; {key} options in one run are written as a list: {key}=[{value}]"
                    if key == "logger" and "," in value and "(" not in value else "")
            return ConfigError(key.lstrip("+~"), value, f"sweeps several values, one job each: add -m to run the "
                               f"sweep (fedrun -m ...){many}")
    return None


def _named_override(overrides: list[str], error: BaseException) -> FedrunError | None:
    """The override a composition error of Hydra's is about (its text, or its key quoted, in the
    message), in one line with the cause, instead of every override of the command line: ``+seed=1``
    (a setting there already), ``~nosuch`` (none to remove), ``hydra.run.dir=null``, ``hyperparams=5``."""
    message = str(error)
    for text in overrides:
        key, _, value = text.partition("=")
        bare = key.lstrip("+~")
        if not bare:
            return UsageError(f"{text}: names no setting; write key=value")
        if "Config group override must be" in message and (CONF_DIR / bare).is_dir() and \
                value not in conf_options(bare) and not value.startswith("["):
            return ConfigError(bare, value, f"choose an option of the {bare} group: {', '.join(conf_options(bare))}")
        if text not in message and f"'{bare}'" not in message:
            continue
        if "Could not append" in message:
            why = f"{bare} is a setting already: write {bare}={value} (a + adds one the config does not have)"
        elif "Could not delete" in message:
            why = f"the config has no {bare} to remove"
        else:
            why = f"cannot be set ({first_line(error.__cause__ or error)})"
        return UsageError(f"{text}: {why}")
    return None


def _check_group_lists(overrides: list[str]) -> None:
    """A config group given as a list (``logger=[tensorboard,mlflow]``, whose options merge)
    chooses at least one option, and ``none`` (no dashboard) alone: ``logger=[]`` would remove
    the group, ``logger=[none,tensorboard]`` is tensorboard whatever none says."""
    for text in overrides:
        key, _, value = text.partition("=")
        group = key.lstrip("+~")
        if not (value.startswith("[") and value.endswith("]")) or "/" in group or not (CONF_DIR / group).is_dir():
            continue
        options = [v.strip() for v in value[1:-1].split(",") if v.strip()]
        if not options:
            raise ConfigError(group, value, f"chooses no option: choose one ({group}=none for none)"
                              if "none" in conf_options(group) else f"chooses no option: choose one of: "
                              f"{', '.join(conf_options(group))}")
        if "none" in options and len(options) > 1:
            others = [o for o in options if o != "none"]
            raise ConfigError(group, value, f"none chooses no {group}, the others some: choose {group}=none alone, "
                              f"or {group}=[{','.join(others)}]")


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
    except HydraException:  # a value Hydra's grammar cannot read (choice(), a non-ASCII character)
        bad = _bad_override(overrides, sweep=True)
        if bad is not None:
            raise bad from None
        return
    prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++", OverrideType.DEL: "~"}
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    swept = []
    for o in parsed:
        if not o.is_sweep_override():
            continue
        key = prefix.get(o.type, "") + o.key_or_group + (f"@{o.package}" if o.package else "")
        values = _sweep_values(o, key, fixed)
        if values is None:  # interval(...) under a sampling sweeper (Optuna): the sweeper's to sample
            continue
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


def _sweep_values(o, key: str, fixed: list[str]) -> list[str] | None:
    """The values a sweep override runs, as Hydra's basic sweeper will (None: ``interval(...)``
    for a sweeper that samples it); what it cannot sweep is one line naming it, not the
    traceback Hydra's sweeper would end in: ``interval(...)`` with the basic sweeper, a ``range``
    of step 0, a ``glob`` that matches no option (a sweep of no job).  ``fixed``: the sweep's
    other, single-valued overrides (the sweeper chosen, the search path)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.types import Glob, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    value = o.input_line.split("=", 1)[-1]
    if isinstance(o.value(), IntervalSweep):
        try:  # the sweeper the sweep runs with (an experiment's defaults may choose it)
            sweeper = _compose(fixed).hydra.runtime.choices.get("hydra/sweeper")
        except Exception:  # noqa: BLE001 - the sweep's precheck names what is wrong with the overrides
            return None
        if sweeper == "basic":
            raise ConfigError(key, value, "is a range a sampler draws from (hydra/sweeper=optuna); the basic sweeper "
                              "runs listed values: a,b,c or range(start,stop,step)")
        return None
    if isinstance(o.value(), Glob):  # matched against the group's options, as Hydra's sweeper does
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fedrun"):
            options = GlobalHydra.instance().config_loader().get_group_options(o.key_or_group, overrides=fixed)
        values = o.value().filter(options)
        if not values:
            raise ConfigError(key, value, f"matches no option of {o.key_or_group}, so the sweep would run no job; "
                              f"its options: {', '.join(options) or 'none'}")
        return values
    try:
        return list(o.sweep_string_iterator())
    except (HydraException, ValueError) as e:  # range(0.1,1,0): Python's range() refuses step 0
        step = o.value().step if isinstance(o.value(), RangeSweep) else None
        raise ConfigError(key, value, "range(start,stop,step) needs a step other than 0" if step == 0 else
                          f"cannot be swept: {first_line(e)}") from None


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
        cfg = _compose([*fixed, *others, *combo], hydra=False)
        try:
            check_partition(cfg, data)
        except ConfigError as e:
            raise ConfigError(e.setting, e.value, f"{e.allowed} (the sweep's job with {' '.join(combo)}; "
                              "nothing was run)") from None


def _unknown_key(key: str, overrides: list[str]) -> ConfigError:
    """``group.key=value`` for a key the config does not have: the error lists the keys it has."""

    from fedrun.command import settings

    value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), "...")
    parent, _, _ = key.rpartition(".")
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    try:
        cfg = _compose(rest, hydra=False)
    except Exception:  # noqa: BLE001 - the hint is optional; the error is not
        cfg = None
    node = OmegaConf.select(cfg, parent) if parent and cfg is not None else None
    keys = [k for k in node if k not in settings.HYDRA_KEYS] if isinstance(node, DictConfig) else []
    top = key.split(".", 1)[0]
    if cfg is not None and top not in cfg:
        # A misspelt group or top-level setting (partiton=iid, hyperparam.lr=0.1): the closest of them.
        names = [k for k in cfg if k not in settings.HYDRA_KEYS]
        names += sorted(d.name for d in CONF_DIR.iterdir() if d.is_dir() and d.name not in ("hydra", "__pycache__"))
        hint = did_you_mean(top, dict.fromkeys(names))
        return ConfigError(key, value, f"unknown setting; {hint}see `fedrun --help` and docs/configuration.md")
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
    forget_sweep()  # a sweep of an earlier call in this process (fedrun.run, a test's driver) is not this one's
    _HELD.clear()  # nor the warnings of one that was refused
    args = sys.argv[1:]
    words = _nested_completion(args)
    if words is not None:
        print(" ".join(words))
        return
    try:
        _check_flags(args)
    except FedrunError as e:
        exit_with(e, e.exit_code)
    overrides, config_dirs = _split_config_dirs(args)
    missing = next((d for d in config_dirs if not Path(d).is_dir()), None)
    if missing is not None:  # Hydra: a warning, then its block ("Additional config directory ... not found")
        exit_with(f"--config-dir={missing}: not a folder; name the folder of your own config groups "
                  "(docs/sweeps.md)", 2)
    sweep = any(a in ("-m", "--multirun") for a in overrides)
    if any(a in ("--help", "-h") for a in overrides):  # fedrun's own: settings described, internal ones hidden
        try:
            given = [a for a in overrides if not a.startswith("-")]
            print(_help(_first_values(given) if sweep else given, config_dirs), end="")
        except FedrunError as e:
            exit_with(e, e.exit_code)
        return
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
    if last_sweep() is not None and not failed and not sweep_jobs(last_sweep()):
        # The sweeper (or launcher) stopped before any job, or had none to run: a table of 0 jobs
        # would hide it, and a sweep of no job is no success.
        remove_if_empty(last_sweep())
        if code:
            exit_with("no job of the sweep ran: Hydra's sweeper stopped before the first one (its error is above)",
                      code)
        exit_with("no job of the sweep ran: its sweeper had no job to run", 2)
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


def _check_flags(args: list[str]) -> None:
    """The command line's flags as Hydra's own parser reads them, refused in one line (argparse
    prints its whole usage block first): ``--help=true``, ``--cfg=bad``, ``--nosuch``.  fedrun
    takes ``-m`` anywhere (Hydra only first)."""
    from hydra._internal.utils import get_args_parser

    from fedrun.errors import ArgumentParser

    if "--version" in args:  # Hydra's to print
        return
    parser = get_args_parser()
    parser.error = ArgumentParser.error.__get__(parser)  # a UsageError, one line, instead of usage and exit
    given = [a for a in args if a not in ("-m", "--multirun")]
    flag = next((a for a in given if re.match(r"^(--help|-h|--hydra-help|--resolve|--run|-r)=", a)), None)
    if flag is not None:  # argparse's "ignored explicit argument 'true'" names no fix
        name, _, value = flag.partition("=")
        raise UsageError(f"{flag}: {name} takes no value; write {name} alone")
    parser.parse_intermixed_args(given)  # the flags wherever they are (fedrun takes -cd DIR anywhere too)


def _first_values(overrides: list[str]) -> list[str]:
    """A sweep's overrides with each swept setting at its first value: the job ``--help -m``
    describes (the sweep's first)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    out = []
    for text in overrides:
        try:
            parsed = OverridesParser.create().parse_overrides([text])[0]
            values = list(parsed.sweep_string_iterator()) if parsed.is_sweep_override() else None
        except (HydraException, ValueError):  # the help's compose names what is wrong with it
            values = None
        out.append(f"{text.split('=', 1)[0]}={values[0]}" if values else text)
    return out


def _help(overrides: list[str], config_dirs: list[str]) -> str:
    """``fedrun [overrides] --help``: the run those overrides make, every setting a user may set
    with its value, what it does and what it takes (:mod:`fedrun.command.help`)."""
    from hydra.errors import HydraException

    from fedrun.command.help import help_text

    if config_dirs and not any(o.startswith("hydra.searchpath=") for o in overrides):
        overrides = overrides + [f"hydra.searchpath=[{','.join('file://' + d for d in config_dirs)}]"]
    try:
        cfg = _compose(overrides)
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

    from fedrun.command.build import run
    from fedrun.logs import ensure_console

    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, (list, tuple)) or \
            not all(isinstance(o, str) for o in overrides):
        raise ConfigError("overrides", repr(overrides), "must be a list of key=value strings, "
                          "e.g. fedrun.run(['aggregator=fedavg', 'hyperparams.rounds=5'])")
    if run_dir is not None and (not isinstance(run_dir, (str, os.PathLike)) or not os.fspath(run_dir).strip()):
        # Path(123) is a TypeError; Path("") the working directory, where a run's files would land among the user's
        raise ConfigError("run_dir", repr(run_dir), "must be a folder's path (a str or pathlib.Path), e.g. "
                          "fedrun.run([...], run_dir='runs/a'), or None for hydra.run.dir's")
    overrides = list(overrides)
    flag = next((o for o in overrides if o.startswith("-")), None)
    if flag is not None:  # -m, --cfg ...: the command's, which Hydra's override grammar cannot read
        raise ConfigError("overrides", flag, "is a flag of the fedrun command; fedrun.run runs one job from "
                          "key=value overrides (a sweep: fedrun -m on the command line)")
    if run_dir is not None:
        overrides = [o for o in overrides if not o.startswith("hydra.run.dir=")]
        overrides.append(f"hydra.run.dir={_quoted(Path(run_dir).expanduser().resolve())}")
    _HELD.clear()
    precheck(overrides)
    _print_held()
    cfg = _compose(overrides)
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
