"""Runs as tables: every run directory under some folders, one DataFrame.

A *run directory* is a folder holding ``config.yaml`` and ``rounds.csv`` (what one ``fedrun`` run,
or one job of ``fedrun -m``, writes).  :func:`load` reads them all into one long table, one row
per run and round, with the run's identity as columns: ``run_dir``, the option of each config
group (``aggregator``, ``dataset``, ``model``, ``partition``, ...) and every setting that differs
between the loaded runs (``seed``, ``hyperparams.lr``, ``aggregator.beta``, ...), so a sweep's
runs can be grouped, averaged over seeds and plotted without opening a file by hand::

    df = fedrun.results.load("outputs/multirun/2026-11-23")
    df[df["round"] == df["round"].max()].groupby(["aggregator", "aggregator.beta"]).test_acc.mean()

:func:`load_layers` and :func:`load_clients` do the same for ``layers.csv`` and ``clients.csv``.
:func:`find_runs` lists run directories (``require=FINISHED_FILES``: the finished ones, with or
without ``rounds.csv``); :func:`read_config`, :func:`read_summary` and :func:`read_csv` read one.
:func:`objective` is what a job returns to Hydra's sweepers.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import yaml

from fedrun.errors import ConfigError, RunDirectoryError

if TYPE_CHECKING:  # pandas loads when a table is made, not with every fedrun command
    import pandas as pd

# Keys of config.yaml that are not settings of the run: how it was launched and labelled.
NOT_SETTINGS = ("choices", "overrides", "resume", "progress", "device", "data_root", "threads", "checkpoint_every")
# summary.json's numbers a sweep can optimize; see objective().
SUMMARY_OBJECTIVES = ("best_test_acc", "final_test_acc", "final_test_loss", "best_round", "final_val_acc",
                      "best_val_acc", "final_average_test_acc", "final_sent_test_acc")
LAST_N = re.compile(r"^mean_test_acc_last_(\d+)$")


def check_objective(name: str) -> None:
    """One line for an ``objective`` that no run can report."""
    if name in SUMMARY_OBJECTIVES or (LAST_N.match(name) and int(LAST_N.match(name).group(1)) >= 1):
        return
    raise ConfigError("objective", name, f"choose one of: {', '.join(SUMMARY_OBJECTIVES)}, or "
                      "mean_test_acc_last_<n> (the mean test accuracy of the last n evaluated rounds)")


def objective(summary: dict, run_dir: str | Path, name: str) -> float:
    """The run's value of ``objective`` as a float: a number of ``summary.json``, or
    ``mean_test_acc_last_<n>``, the mean ``test_acc`` of the last n evaluated rounds (steadier
    than the final or best accuracy for tuning)."""
    import pandas as pd

    check_objective(name)
    match = LAST_N.match(name)
    if match:
        rounds = pd.read_csv(Path(run_dir) / "rounds.csv").dropna(subset=["test_acc"])
        return float(rounds["test_acc"].tail(int(match.group(1))).mean())
    value = summary.get(name)
    if value is None:
        raise ConfigError("objective", name, "this run has no such value (final_val_acc and best_val_acc need "
                          "hyperparams.validation_fraction > 0; final_average/sent_test_acc need an aggregator "
                          "whose two models differ)")
    return float(value)


# ----------------------------------------------------------------------------- finding and reading runs

# The files that make a folder a run directory for find_runs() and load(): a run that has written
# its configuration and at least one round.
RUN_FILES = ("config.yaml", "rounds.csv")
# A run that has ended (fedrun writes summary.json last), with or without rounds.csv.
FINISHED_FILES = ("config.yaml", "summary.json")


def find_runs(*paths: str | os.PathLike, require: Iterable[str] = RUN_FILES) -> list[Path]:
    """Every run directory at or below ``paths`` (each once, resolved, sorted).

    ``require``: the files a folder must hold to count as a run directory; by default
    :data:`RUN_FILES` (``config.yaml`` and ``rounds.csv``).  :data:`FINISHED_FILES`
    (``config.yaml`` and ``summary.json``) finds the finished runs only, including one that
    wrote no ``rounds.csv``; ``("config.yaml",)`` every run that started.  A path that does not
    exist raises :class:`~fedrun.errors.RunDirectoryError`."""
    require = tuple(require)
    found = set()
    for top in paths:
        top = Path(top)
        if not top.exists():
            raise RunDirectoryError(f"{top}: no such file or directory")
        for folder, _, files in os.walk(top):
            if all(name in files for name in require):
                found.add(Path(folder).resolve())
    return sorted(found)


def read_config(run: str | os.PathLike) -> dict:
    """A run directory's ``config.yaml`` as a dict (``{}`` when the file is empty)."""
    return yaml.safe_load((Path(run) / "config.yaml").read_text()) or {}


def read_summary(run: str | os.PathLike) -> dict:
    """A run directory's ``summary.json`` as a dict; ``{}`` when there is none (the run has not
    finished)."""
    path = Path(run) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def read_csv(run: str | os.PathLike, name: str = "rounds.csv") -> pd.DataFrame | None:
    """One CSV of a run directory (``rounds.csv``, ``layers.csv``, ``clients.csv`` ...) as a
    DataFrame; None when the file is missing, empty or not CSV (a run cut off mid-write)."""
    import pandas as pd

    path = Path(run) / name
    if not path.is_file():
        return None
    try:
        return pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError):
        return None


def _flatten(node, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


def run_identity(runs: list[Path]) -> pd.DataFrame:
    """One row per run: ``run_dir``, the config group options and the settings that differ."""
    import pandas as pd

    configs = [read_config(run) for run in runs]
    settings = [_flatten({k: v for k, v in c.items() if k not in NOT_SETTINGS}) for c in configs]
    keys = sorted(set().union(*settings)) if settings else []
    # Left out: mirrors of hyperparams (the objects built from them) and _target_s (the group's
    # option, a column of its own, names them).
    differ = [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1
              and not k.startswith(("federation.", "local.", "participation.")) and not k.endswith("._target_")]
    groups = sorted(set().union(*(c.get("choices", {}) for c in configs))) if configs else []
    rows = []
    for run, config, flat in zip(runs, configs, settings):
        row = {"run_dir": str(run)}
        row.update({g: config.get("choices", {}).get(g) for g in groups})
        row.update({k: flat.get(k) for k in differ if k not in row})
        rows.append(row)
    return pd.DataFrame(rows)


def _load(paths, csv_name: str) -> pd.DataFrame:
    import pandas as pd

    runs = find_runs(*paths)
    if not runs:
        raise RunDirectoryError(f"no run directories (config.yaml and rounds.csv) under {', '.join(map(str, paths))}")
    identity = run_identity(runs)
    frames = []
    for run, (_, who) in zip(runs, identity.iterrows()):
        path = run / csv_name
        if not path.is_file() or path.stat().st_size == 0:
            continue
        df = pd.read_csv(path)
        for column, value in who.items():
            df[column] = [value] * len(df)
        frames.append(df)
    columns = list(identity.columns)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    return out[columns + [c for c in out.columns if c not in columns]]


def load(*paths: str | os.PathLike) -> pd.DataFrame:
    """``rounds.csv`` of every run under ``paths`` (runs or sweep folders): one row per run and
    round, identity columns first (module docstring)."""
    return _load(paths, "rounds.csv")


def load_layers(*paths: str | os.PathLike) -> pd.DataFrame:
    """As :func:`load`, for ``layers.csv`` (one row per run, round and layer)."""
    return _load(paths, "layers.csv")


def load_clients(*paths: str | os.PathLike) -> pd.DataFrame:
    """As :func:`load`, for ``clients.csv`` (one row per run, round and client)."""
    return _load(paths, "clients.csv")


def summaries(*paths: str | os.PathLike) -> pd.DataFrame:
    """One row per run: identity columns and ``summary.json``'s numbers (runs without one: NaN)."""
    import pandas as pd

    runs = find_runs(*paths)
    identity = run_identity(runs)
    rows = []
    for run in runs:
        summary = read_summary(run)
        rows.append({k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                     and not (isinstance(v, float) and math.isnan(v))})
    return pd.concat([identity, pd.DataFrame(rows)], axis=1)
