"""Runs as tables: every run directory under some folders, one DataFrame.

A *run directory* is a folder holding ``config.yaml`` and ``rounds.csv`` (what one ``fedrun`` run,
or one job of ``fedrun -m``, writes).  :func:`load` reads them all into one long table, one row
per run and round, with the run's identity as columns: ``run_dir``; ``method``, the method's
name (``FedAvg``, ``FedNNNN``, ...); ``group``, a label shared by the runs that differ only in
their seed (``FedNNNN, beta=0.5``); the option of each config group (``aggregator``,
``dataset``, ``model``, ``partition``, ...) and every setting that differs between the loaded
runs (``seed``, ``hyperparams.lr``, ``aggregator.beta``, ...), so a sweep's runs can be grouped,
averaged over seeds and plotted without opening a file by hand::

    df = fedrun.results.load("outputs/multirun/2026-11-23")
    fedrun.results.last_round(df).groupby("group").test_acc.agg(["mean", "std", "count"])

``method`` and ``group`` are never empty.  A setting column is NaN for a run that does not have
the setting (``aggregator.beta`` for FedAvg), and pandas' ``groupby`` leaves out the rows whose
key is NaN: group by ``group``, or pass ``dropna=False`` when grouping by setting columns.
:func:`seed_curves` gives each group's mean and band over seeds, round by round (what
``fedrun-plot``, :mod:`fedrun.plot`, draws).

:func:`load_layers` and :func:`load_clients` do the same for ``layers.csv`` and ``clients.csv``
(or ``clients.csv.gz``: a finished run may keep its per-client CSVs gzipped, :func:`compress_csvs`).
:func:`find_runs` lists run directories (``require=FINISHED_FILES``: the finished ones, with or
without ``rounds.csv``); :func:`read_config`, :func:`read_summary` and :func:`read_csv` read one.
:func:`objective` (from :mod:`fedrun.harness.objective`) is what a job returns to Hydra's sweepers.

One run at a time: :class:`Run` is a run directory's config, summary and (read once, on demand)
CSVs; :func:`load_runs` reads the finished runs under some folders as :class:`Run` objects, with
the folders it passed over and why (what the papers' table and plot scripts file into cells).

Every reader takes one folder where it takes several (``load("outputs/run")``,
``load_runs("outputs/run")``, :func:`folders`), and refuses in one line
(:class:`~fedrun.errors.RunDirectoryError`) what it cannot read: a path that is no folder, folders
without a run, a config.yaml that is not YAML, not a mapping, another tool's, or holds a seed that
is no integer or a config group that is no mapping; a CSV without its key columns (``round``;
rounds.csv's ``test_acc``) or with text where numbers belong.  :func:`read_rounds` also refuses a
rounds.csv without a row (the run stopped before its first round; :func:`stopped` says whether it
diverged), so that a figure or table is never empty unsaid.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import yaml

from fedrun.errors import ConfigError, FedrunError, RunDirectoryError, first_line

if TYPE_CHECKING:  # pandas loads when a table is made, not with every fedrun command
    import pandas as pd

# Keys of config.yaml that are not settings of the run: how it was launched and labelled (and
# ``centralized``, which the ``mode`` column names).
NOT_SETTINGS = ("choices", "overrides", "resume", "progress", "device", "data_root", "threads", "checkpoint_every",
                "centralized")
# Settings that change what a run logs or reports, not its rounds' numbers: the dashboards, what a
# sweep is returned, the summary's rounds-to-accuracy and the saved snapshots.  They never tell
# groups apart (runs with and without TensorBoard are one group).
NOT_RESULTS = ("logger", "objective", "targets", "snapshots")
# What a job returns to a sweeper lives with the run (fedrun.harness.objective); named here too, as before.
from fedrun.harness.objective import LAST_N, MEAN_ACC, SUMMARY_OBJECTIVES, check_objective, objective  # noqa: E402,F401


# ----------------------------------------------------------------------------- finding and reading runs

# The files that make a folder a run directory for find_runs() and load(): a run that has written
# its configuration and at least one round.
RUN_FILES = ("config.yaml", "rounds.csv")
# A run that has ended (fedrun writes summary.json last), with or without rounds.csv.
FINISHED_FILES = ("config.yaml", "summary.json")
# The processes that ran a run's rounds (fedrun.harness.provenance.RUN_FILE; named here so reading results
# needs no torch).
RUN_FILE = "run.json"


def folders(paths) -> list[Path]:
    """``paths`` as a list of folders, each checked: one path (a ``str`` or ``Path``, what a caller
    means by ``load("outputs/run")`` or ``load_runs("outputs/run")``) is a list of one, and a list
    passed where paths are spread (``load(["a", "b"])``) is its paths.  A path that does not exist
    or is a file, anything that is not a path, and no path at all raise one line
    (:class:`~fedrun.errors.RunDirectoryError`, :class:`~fedrun.errors.ConfigError`)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    items = [p for item in items for p in (item if isinstance(item, (list, tuple)) else [item])]
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise ConfigError("paths", repr(item)[:80], "not a path: give folders as str or pathlib.Path, or a list "
                              "of them")
    out = [Path(item) for item in items]
    if not out:
        raise RunDirectoryError("no folders given: name run directories, or folders that hold them")
    for top in out:
        if not top.exists():
            raise RunDirectoryError(f"{top}: no such file or directory")
        if not top.is_dir():
            raise RunDirectoryError(f"{top}: a file, not a folder: give a run directory or a folder that holds runs")
    return out


def find_runs(*paths: str | os.PathLike, require: Iterable[str] = RUN_FILES) -> list[Path]:
    """Every run directory at or below ``paths`` (each once, resolved, sorted).

    ``require``: the files a folder must hold to count as a run directory; by default
    :data:`RUN_FILES` (``config.yaml`` and ``rounds.csv``).  :data:`FINISHED_FILES`
    (``config.yaml`` and ``summary.json``) finds the finished runs only, including one that
    wrote no ``rounds.csv``; ``("config.yaml",)`` every run that started.  ``paths`` as
    :func:`folders` takes them: a path that does not exist or is a file raises
    :class:`~fedrun.errors.RunDirectoryError`."""
    require = tuple(require)
    found = set()
    for top in folders(paths):
        for folder, _, files in os.walk(top):
            if all(name in files for name in require):
                found.add(Path(folder).resolve())
    return sorted(found)


def no_runs(paths, require: Iterable[str] = RUN_FILES) -> RunDirectoryError:
    """The one line for folders without a run directory: where was looked and what a run holds."""
    return RunDirectoryError(f"no run directories ({' and '.join(require)}) under "
                             f"{', '.join(map(str, folders(paths)))}: give fedrun's run or sweep folders")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise RunDirectoryError(f"{path}: cannot be read ({e.strerror or first_line(e)})") from None


def read_config(run: str | os.PathLike) -> dict:
    """A run directory's ``config.yaml`` as a dict (``{}`` when the file is empty).  A file that
    is missing, not YAML or not a mapping of settings raises
    :class:`~fedrun.errors.RunDirectoryError` naming it (one line)."""
    path = Path(run) / "config.yaml"
    try:
        config = yaml.safe_load(_read(path)) or {}
    except (yaml.YAMLError, ValueError) as e:
        raise RunDirectoryError(f"{path}: not valid YAML ({first_line(e)})") from None
    if not isinstance(config, dict):
        raise RunDirectoryError(f"{path}: not a mapping of settings ({type(config).__name__})")
    _check_config(config, path)
    return config


# config.yaml's nodes that fedrun writes as mappings of settings (the config groups and the
# objects built from them), and the keys of which a fedrun config.yaml (or a hand-made one for the
# readers: a seed, or a paper's tags) has at least one, and another tool's hardly any.
SECTIONS = ("dataset", "model", "partition", "aggregator", "hyperparams", "engine", "logger", "choices", "tags",
            "tuned", "federation", "local", "participation")
FEDRUN_KEYS = ("seed", "aggregator", "hyperparams", "choices", "tags")


def _check_config(config: dict, path: Path) -> None:
    """One line naming ``path`` for a config.yaml that is not a fedrun run's, damaged or hand-made:
    none of fedrun's keys (another tool's config), a ``seed`` that is no integer, or a config
    group that is no mapping (``hyperparams: 5``).  Every reader then finds what fedrun writes."""
    if config and not any(key in config for key in FEDRUN_KEYS):
        raise RunDirectoryError(f"{path}: not a fedrun config (its keys: {', '.join(map(str, list(config)[:6]))}; "
                                f"fedrun's have {', '.join(FEDRUN_KEYS)})")
    seed = config.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RunDirectoryError(f"{path}: seed={seed!r}: not an integer (a damaged or hand-edited config)")
    for key in SECTIONS:
        node = config.get(key)
        if node is not None and not isinstance(node, dict):
            raise RunDirectoryError(f"{path}: {key}={str(node)[:40]}: not a mapping of settings "
                                    f"({type(node).__name__})")


def read_summary(run: str | os.PathLike) -> dict:
    """A run directory's ``summary.json`` as a dict; ``{}`` when there is none (the run has not
    finished).  One that is not a JSON object raises :class:`~fedrun.errors.RunDirectoryError`
    naming it (one line)."""
    path = Path(run) / "summary.json"
    if not path.is_file():
        return {}
    try:
        summary = json.loads(_read(path))
    except ValueError as e:
        raise RunDirectoryError(f"{path}: not valid JSON ({first_line(e)})") from None
    if not isinstance(summary, dict):
        raise RunDirectoryError(f"{path}: not a JSON object ({type(summary).__name__})")
    return summary


# The per-client CSVs, the largest a run writes (a row per client and round, and per layer): a
# finished run may keep them gzipped (``clients.csv.gz``, :func:`compress_csvs`), as the committed
# reproductions do, and every reader here takes either.
COMPRESSIBLE = ("clients.csv", "client_layers.csv")


def csv_path(run: str | os.PathLike, name: str) -> Path | None:
    """``run/name``, else its gzipped ``run/name.gz``; None when neither is a file."""
    for path in (Path(run) / name, Path(run) / f"{name}.gz"):
        if path.is_file():
            return path
    return None


def compress_csvs(run: str | os.PathLike, names: Iterable[str] = COMPRESSIBLE) -> list[Path]:
    """Gzip a finished run's per-client CSVs in place (``clients.csv`` -> ``clients.csv.gz``), for
    folders that are committed or copied: about a third of their size.  The same bytes give the same
    file (no time stamp, no name inside), so a run compressed twice changes nothing for git.  Each
    file is written beside its CSV, read back and compared before the CSV is removed.

    Only a finished run (``summary.json``): a run that is resumed cuts its CSVs back to the sizes
    its checkpoint recorded, which a gzipped file no longer has.  Returns the files written."""
    import gzip

    run = Path(run)
    if not (run / "summary.json").is_file():
        raise RunDirectoryError(f"{run}: not finished (no summary.json); its CSVs stay as they are, so it can be "
                                "resumed")
    written = []
    for name in names:
        plain, packed = run / name, run / f"{name}.gz"
        if not plain.is_file():
            continue
        data = plain.read_bytes()
        tmp = packed.with_name(packed.name + ".partial")
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(data)
        if gzip.decompress(tmp.read_bytes()) != data:  # never remove a CSV its copy does not hold
            tmp.unlink()
            raise RunDirectoryError(f"{tmp}: does not read back as {plain}; {plain} kept")
        tmp.replace(packed)
        plain.unlink()
        written.append(packed)
    return written


def read_csv(run: str | os.PathLike, name: str = "rounds.csv") -> pd.DataFrame | None:
    """One CSV of a run directory (``rounds.csv``, ``layers.csv``, ``clients.csv`` ...) as a
    DataFrame, or its gzipped ``name.gz``; None when the file is missing, empty or not CSV (a run
    cut off mid-write)."""
    path = csv_path(run, name)
    if path is None:
        return None
    try:
        return _csv(path)
    except RunDirectoryError:
        return None


# The columns each CSV of a run directory has (what the readers find rows by); other CSVs: ``round``.
KEY_COLUMNS = {"rounds.csv": ("round", "test_acc"), "partition.csv": ("client",)}


def _csv(path: Path) -> pd.DataFrame:
    """``pd.read_csv(path)``, checked: a file that is not CSV (rows of other widths, binary,
    unreadable), or not one fedrun writes (without its key columns, :data:`KEY_COLUMNS`, or with
    text where numbers belong) raises :class:`~fedrun.errors.RunDirectoryError` naming it."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise RunDirectoryError(f"{path}: empty, not a CSV file") from None
    except (pd.errors.ParserError, ValueError, OSError, EOFError) as e:  # UnicodeDecodeError is a ValueError;
        # a cut gzip is an EOFError, a damaged one gzip.BadGzipFile (an OSError)
        raise RunDirectoryError(f"{path}: not a CSV file ({first_line(e)})") from None
    name = path.name.removesuffix(".gz")  # pandas reads a gzipped CSV by its suffix
    keys = KEY_COLUMNS.get(name, ("round",))
    missing = [c for c in keys if c not in df]
    if missing:
        raise RunDirectoryError(f"{path}: no column {', '.join(missing)} (its columns: "
                                f"{', '.join(map(str, df.columns[:8]))}); not a {name} fedrun wrote")
    for column in df.columns if name == "rounds.csv" else keys:  # every column of rounds.csv is a number
        _numbers(df[column], path)
    return df


def _numbers(column: pd.Series, path: Path) -> None:
    """One line naming ``path``, the column and the first value that is not a number."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(column) or column.isna().all():
        return
    bad = column[column.notna() & pd.to_numeric(column, errors="coerce").isna()]
    if len(bad):
        raise RunDirectoryError(f"{path}: column {column.name}, row {bad.index[0] + 1}: {str(bad.iloc[0])[:30]!r} "
                                "where a number belongs")


def read_rounds(run: str | os.PathLike) -> pd.DataFrame:
    """``rounds.csv`` of a run directory with at least one round, for a figure or a table of
    rounds; otherwise :class:`~fedrun.errors.RunDirectoryError`, one line that says why: the file
    is missing or has no rows (the run stopped before its first round), or is not a rounds.csv
    fedrun wrote (:func:`_csv`)."""
    path = Path(run) / "rounds.csv"
    if not path.is_file() or path.stat().st_size == 0:
        raise RunDirectoryError(f"{run}: {no_rows(run)}; nothing to draw")
    df = _csv(path)
    if df.empty:
        raise RunDirectoryError(f"{run}: {no_rows(run)}; nothing to draw")
    return df


def without_rows(df: pd.DataFrame) -> list[tuple[str, str]]:
    """``(run_dir, why)`` for each run :func:`load` found (``attrs["runs"]``) that has no row in
    its table: it diverged in round 1 or stopped before its first round (:func:`no_rows`)."""
    drawn = set(df["run_dir"]) if "run_dir" in df else set()
    return [(run, no_rows(run)) for run in df.attrs.get("runs", []) if run not in drawn]


def require_rows(df: pd.DataFrame) -> None:
    """One line (:class:`~fedrun.errors.RunDirectoryError`) for a table of :func:`load` without a
    row, naming each run and why it has none, so a figure or table is never empty unsaid."""
    if df.empty:
        why = "; ".join(f"{run}: {why}" for run, why in without_rows(df)) or "no rows in rounds.csv"
        raise RunDirectoryError(f"{why}; nothing to draw or compare")


def no_rows(run: str | os.PathLike) -> str:
    """What to say of a run whose rounds.csv has no row: it diverged in round 1 (run.json), or it
    stopped before its first round."""
    return f"{stop_note(run) or 'stopped before its first round'} (no rows in rounds.csv)"


def require_column(frames: Iterable[pd.DataFrame], column: str, setting: str) -> None:
    """One line (:class:`~fedrun.errors.ConfigError`) unless some run has a value of ``column``
    (``frames``: the runs' rounds.csv tables, or one table of them all): the option that named it
    (``setting``) and the columns the runs do have values of."""
    import pandas as pd

    frames = [f for f in frames if f is not None]
    if any(column in f and f[column].notna().any() for f in frames):
        return
    have = sorted({str(c) for f in frames for c in f.columns if f[c].notna().any() and "." not in str(c)
                   and pd.api.types.is_numeric_dtype(f[c])} - {"round", *NOT_GROUPING})
    raise ConfigError(setting, column, f"no run has values of it; the runs' rounds.csv columns with values: "
                      f"{', '.join(have) or 'none'}")


def _flatten(node, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


# The methods' names as the papers write them, by their ``aggregator=`` option (a method of one's
# own keeps its option's name).
METHOD_NAMES = {
    "fedavg": "FedAvg", "fedprox": "FedProx", "normnorm": "Norm-Norm", "momentum": "Momentum",
    "fednnnn": "FedNNNN", "fedadp": "FedAdp", "fedlayerwise": "FedLayerWise", "fedlap": "FedLap",
    "fedavgm": "FedAvgM", "fedadagrad": "FedAdagrad", "fedadam": "FedAdam", "fedyogi": "FedYogi",
    "scaffold": "SCAFFOLD", "fednova": "FedNova",
}
# Identity columns that are not a run's settings (``seed`` is averaged over, not a group).
NOT_GROUPING = ("run_dir", "job", "method", "group", "seed", *NOT_RESULTS)
# The config groups people vary first, named first in a group's label.
FIRST = ("dataset", "partition", "model", "hyperparams", "experiment", "mode", "engine", "scale")
# fedrun's own config groups (a table's columns of these names are their options).
_GROUPS = ("aggregator", *FIRST, "logger")


def method_name(option) -> str:
    """The display name of an ``aggregator=`` option (``fednnnn`` -> ``FedNNNN``); ``run`` when a
    run records none."""
    if _absent(option):
        return "run"
    return METHOD_NAMES.get(str(option), str(option))


def _absent(value) -> bool:
    """A setting the run does not have: None in config.yaml, NaN once in a DataFrame."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def group_labels(identity: pd.DataFrame, choices: Iterable[str] = ()) -> list[str]:
    """One label per row of ``identity`` (:func:`run_identity`'s table), equal for the runs that
    differ only in their seed and different otherwise.

    A label is the method's name (:func:`method_name`), then the settings that tell the run's group
    apart: a config group's option (``partition=iid``) or a top-level setting (``vanilla_every``)
    where it differs among all runs; a setting of a config group (``aggregator.beta``,
    ``partition.alpha``) where it differs among the runs that chose the same option of that group
    (the runs of the same method, for the aggregator's).  A setting a run's option does not have
    is never shown (FedAvg has no ``beta``); where other runs of the same option have it, it is
    shown as ``beta unset``.  Never ``nan`` or ``None``.  ``choices``: the config group columns
    (default: those of the columns that hold no dot and are not settings of the run)."""
    choices = [c for c in choices] or [c for c in identity.columns if c in _GROUPS]
    columns = [c for c in identity.columns if c not in NOT_GROUPING and c != "aggregator"]

    def differs(rows, column) -> bool:
        return len({"unset" if _absent(v) else repr(v) for v in rows[column]}) > 1

    def option(row, group) -> str:
        return "" if group not in row or _absent(row[group]) else str(row[group])

    # For a setting of a config group: does it differ among the runs of each option of that group?
    within: dict[str, dict[str, bool]] = {}
    for column in columns:
        group = column.split(".", 1)[0]
        if "." in column and group in choices:
            options = identity[group].map(lambda v: "" if _absent(v) else str(v))
            within[column] = {o: differs(identity[options == o], column) for o in set(options)}
    everywhere = {c: differs(identity, c) for c in columns if c not in within}
    order = sorted(columns, key=lambda c: (FIRST.index(c.split(".")[0]) if c.split(".")[0] in FIRST
                                           else len(FIRST), "." in c, c))
    labels = []
    for _, row in identity.iterrows():
        shown = [c for c in order if (within[c][option(row, c.split(".", 1)[0])] if c in within else everywhere[c])]
        short = [c.rsplit(".", 1)[-1] for c in shown]
        parts = []
        for column, name in zip(shown, short):
            name = name if short.count(name) == 1 else column  # lr and aggregator.lr: the full names
            value = row[column]
            parts.append(f"{name} unset" if _absent(value) else f"{name}={_shown(value)}")
        labels.append(", ".join([method_name(row.get("aggregator"))] + parts))
    return labels


def run_identity(runs: list[Path]) -> pd.DataFrame:
    """One row per run: ``run_dir``, ``method``, ``group`` (:func:`group_labels`), the config group
    options and the settings that differ."""
    import pandas as pd

    configs = [read_config(run) for run in runs]
    settings = [_flatten({k: v for k, v in c.items() if k not in NOT_SETTINGS + NOT_RESULTS}) for c in configs]
    keys = sorted(set().union(*settings)) if settings else []
    _fill_later_settings(configs, settings, keys)
    # Left out: mirrors of hyperparams (the objects built from them), _target_s (the group's
    # option, a column of its own, names them), a preset's ``tuned`` values (inputs to the
    # settings that use them, which show the value where it acts: ``aggregator.mu``, not
    # ``tuned.fedprox.mu`` on a SCAFFOLD run) and its ``tags`` (the paper scripts' labels; the
    # ``experiment`` column names the preset), empty ones included; and ``dataset.load.root``,
    # where ``data_root`` (a launch setting) lands.
    differ = [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1
              and not k.startswith(("federation.", "local.", "participation.", "tuned.", "tags."))
              and k not in ("tuned", "tags", "dataset.load.root") and not k.endswith("._target_")]
    groups = sorted(set().union(*(c.get("choices", {}) for c in configs))) if configs else []
    rows = []
    for run, config, flat in zip(runs, configs, settings):
        row = {"run_dir": str(run)}
        row.update({g: config.get("choices", {}).get(g) for g in groups})
        row.update({k: flat.get(k) for k in differ if k not in row})
        rows.append(row)
    identity = pd.DataFrame(rows, columns=["run_dir", *groups, *[k for k in differ if k not in groups]])
    identity.insert(1, "job", [_job_number(run) for run in runs])
    identity.insert(2, "method", [method_name(m) for m in identity.get("aggregator", [None] * len(identity))])
    grouping = [g for g in groups if g not in NOT_RESULTS]
    identity.insert(3, "group", group_labels(identity, grouping) if len(identity) else [])
    identity.attrs["varied"] = [k for k in differ if k not in groups]
    identity.attrs["swept"] = _swept(configs)
    return identity


def _fill_later_settings(configs: list[dict], settings: list[dict], keys: list[str]) -> None:
    """Give a run made before a config group's setting existed that setting's value from the
    group's YAML (``aggregator.correction: gradient`` for a SCAFFOLD run made before
    ``correction`` was added), in place.

    A setting is added to a group with the default that keeps the earlier behaviour, so an older
    run *is* a run at the default; without this, its label would read ``correction unset`` and
    split one method's seeds into two groups.  Only a plain value of the run's own option's YAML
    fills a gap (``conf/<group>/<option>.yaml``; not an interpolation such as ``${oc.select:..}``,
    whose value depends on the rest of the config); a setting the run's option does not have stays
    absent (FedAvg has no ``correction``)."""
    defaults: dict[tuple[str, str], dict] = {}
    for config, flat in zip(configs, settings):
        for key in keys:
            group = key.split(".", 1)[0]
            option = (config.get("choices") or {}).get(group)
            if key in flat or "." not in key or not isinstance(option, str):
                continue
            if (group, option) not in defaults:
                defaults[group, option] = _group_yaml(group, option)
            value = defaults[group, option].get(key)
            if value is not None and not (isinstance(value, str) and "${" in value):
                flat[key] = value


def _group_yaml(group: str, option: str) -> dict:
    """The settings that ``conf/<group>/<option>.yaml`` sets itself, flattened under ``group.``
    (``{}`` when there is no such file or it cannot be read)."""
    from fedrun.paths import conf_dir

    path = conf_dir() / group / f"{option}.yaml"
    try:
        node = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError, ValueError):
        return {}
    if not isinstance(node, dict):
        return {}
    return _flatten({group: {k: v for k, v in node.items() if k != "defaults"}})


def _swept(configs: list[dict]) -> list[str]:
    """The command-line settings (``config.yaml``'s ``overrides``) whose values differ between
    the runs: what a sweep varied (``aggregator``, ``seed``, ``aggregator.beta``)."""
    values: dict[str, set] = {}
    for config in configs:
        given = dict(o.lstrip("+~").split("=", 1) for o in config.get("overrides") or [] if "=" in o)
        for key in set(values) | set(given):
            values.setdefault(key, set()).add(given.get(key))
    return sorted(k for k, v in values.items() if len(v) > 1)


def _job_number(run: Path) -> int | None:
    """A sweep job's number: its folder's name under the sweep folder (``hydra.sweep.subdir``'s
    default), or None for a run of its own or a sweep with other folder names."""
    return int(run.name) if run.name.isdigit() else None


def _load(paths, csv_name: str) -> pd.DataFrame:
    import pandas as pd

    runs = find_runs(*paths)
    if not runs:
        raise no_runs(paths)
    identity = run_identity(runs)
    frames = []
    for run, (_, who) in zip(runs, identity.iterrows()):
        path = csv_path(run, csv_name)
        if path is None or path.stat().st_size == 0:
            continue
        df = _csv(path)
        if df.empty:  # a header only (stopped before its first round): no rows, and no text columns
            continue
        for column, value in who.items():
            df[column] = [value] * len(df)
        frames.append(df)
    columns = list(identity.columns)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    out = out[columns + [c for c in out.columns if c not in columns]]
    out.attrs.update(identity.attrs)  # varied: the settings that differ between the runs; swept: the overrides
    out.attrs["runs"] = [str(run) for run in runs]  # every run found, those without a row too
    return out


def load(*paths: str | os.PathLike) -> pd.DataFrame:
    """``rounds.csv`` of every run under ``paths`` (runs or sweep folders; a list of them is taken
    too, :func:`folders`): one row per run and round, identity columns first (module docstring).
    ``attrs["runs"]``: every run found, also those without a row (stopped before their first
    round).  No run, or a damaged file: one line (:class:`~fedrun.errors.RunDirectoryError`)."""
    return _load(paths, "rounds.csv")


def load_layers(*paths: str | os.PathLike) -> pd.DataFrame:
    """As :func:`load`, for ``layers.csv`` (one row per run, round and layer)."""
    return _load(paths, "layers.csv")


def load_clients(*paths: str | os.PathLike) -> pd.DataFrame:
    """As :func:`load`, for ``clients.csv`` (one row per run, round and client)."""
    return _load(paths, "clients.csv")


def load_client_layers(*paths: str | os.PathLike) -> pd.DataFrame:
    """As :func:`load`, for ``client_layers.csv`` (one row per run, round, client and layer)."""
    return _load(paths, "client_layers.csv")


def load_output_layer(*paths: str | os.PathLike) -> pd.DataFrame:
    """As :func:`load`, for ``output_layer.csv`` (one row per run, round, learner and class)."""
    return _load(paths, "output_layer.csv")


def load_partition(*paths: str | os.PathLike) -> pd.DataFrame:
    """As :func:`load`, for ``partition.csv`` (one row per run and client: its examples of each class)."""
    return _load(paths, "partition.csv")


# summary.json's words (not numbers) that summaries() keeps: the objective's name and when and
# with what the run ran (``provenance.*``: fedrun, git_commit, git_dirty, python, torch, cuda,
# device, host; fedrun.harness.provenance).
SUMMARY_TEXT = ("objective", "started", "finished")


def summaries(*paths: str | os.PathLike) -> pd.DataFrame:
    """One row per run: identity columns, ``summary.json``'s numbers (runs without one: NaN), the
    objective's name and the run's provenance (``started``, ``finished``, ``provenance.torch``, ...)."""
    import pandas as pd

    runs = find_runs(*paths)
    if not runs:
        raise no_runs(paths)
    identity = run_identity(runs)
    rows = []
    for run in runs:
        summary = read_summary(run)
        row = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and not (isinstance(v, float) and math.isnan(v))}
        row.update({k: summary[k] for k in SUMMARY_TEXT if summary.get(k) is not None})
        row.update({f"provenance.{k}": v for k, v in (summary.get("provenance") or {}).items()})
        rows.append(row)
    out = pd.concat([identity, pd.DataFrame(rows, index=identity.index)], axis=1)
    out.attrs.update(identity.attrs)
    return out


# ----------------------------------------------------------------------------- groups over seeds

def last_round(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's last row of :func:`load`'s table (its final round, whatever its length)."""
    return df.sort_values(["run_dir", "round"], kind="stable").groupby("run_dir", sort=False).tail(1)


# The bands seed_curves() can draw around a group's mean, and what each is.
BANDS = {"std": "mean ± one standard deviation over seeds", "minmax": "mean and the range over seeds",
         "ci": "mean and its 95% confidence interval over seeds", "none": "mean over seeds"}
# t_{0.975, d}: the two-sided 95% quantiles of Student's t for d = 1..30 degrees of freedom (beyond: 1.96).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(dof: int) -> float:
    """t_{0.975, dof}, for ``band="ci"``: mean ± t975(n - 1) s / sqrt(n) over n seeds."""
    return T975[dof - 1] if 1 <= dof <= len(T975) else 1.96
CURVE_COLUMNS = ("group", "method", "metric", "round", "mean", "low", "high", "n")


def seed_curves(df: pd.DataFrame, metrics: Iterable[str], band: str = "std") -> pd.DataFrame:
    """Each group's mean over its runs (seeds), round by round, with a band: one row per group,
    metric and round with the columns :data:`CURVE_COLUMNS` (``n``: the runs averaged at that
    round; ``low``/``high``: the band, equal to the mean where n is 1 or ``band="none"``).

    Groups are the ``group`` column of :func:`load` (never NaN, so no run is left out), in the
    order of their methods in :data:`METHOD_NAMES`, then by label.  A metric a group has no
    value of (N/E of a centralized run) gives that group no rows for it."""
    import pandas as pd

    if band not in BANDS:
        raise ConfigError("band", band, f"choose one of: {', '.join(BANDS)}")
    order = list(METHOD_NAMES.values())
    keys = sorted(df["group"].unique(), key=lambda g: (order.index(g.split(",")[0]) if g.split(",")[0] in order
                                                        else len(order), g))
    frames = []
    for key in keys:
        rows = df[df["group"] == key]
        for metric in metrics:
            if metric not in rows:
                continue
            values = rows[["round", metric]].dropna()
            if values.empty:
                continue
            stats = values[metric].groupby(values["round"]).agg(["mean", "std", "min", "max", "count"])
            if band == "std":
                low, high = stats["mean"] - stats["std"].fillna(0.0), stats["mean"] + stats["std"].fillna(0.0)
            elif band == "minmax":
                low, high = stats["min"], stats["max"]
            elif band == "ci":  # a two-sided 95% t-interval; no spread where n is 1
                t = stats["count"].map(lambda n: t975(int(n) - 1))
                half = (t * stats["std"] / stats["count"] ** 0.5).fillna(0.0)
                low, high = stats["mean"] - half, stats["mean"] + half
            else:
                low = high = stats["mean"]
            frames.append(pd.DataFrame({"group": key, "method": rows["method"].iloc[0], "metric": metric,
                                        "round": stats.index.astype(int), "mean": stats["mean"].to_numpy(),
                                        "low": low.to_numpy(), "high": high.to_numpy(),
                                        "n": stats["count"].to_numpy()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(CURVE_COLUMNS))


# ----------------------------------------------------------------------------- one run at a time

def stopped(run: str | os.PathLike) -> dict | None:
    """How an unfinished run ended, from its last session in ``run.json``:
    ``{"reason": "diverged", "round": t, "error": "..."}`` with t the round that diverged (its
    CSVs hold the rounds before); None for a finished run (``summary.json``), one still running,
    or one stopped by Ctrl-C, a kill or a full disk (resumable).  Reads no other file, so a figure
    can name a diverged run whatever else its folder holds."""
    run = Path(run)
    if (run / "summary.json").is_file():
        return None
    try:
        sessions = json.loads((run / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    last = sessions[-1] if isinstance(sessions, list) and sessions and isinstance(sessions[-1], dict) else {}
    if not last.get("reason"):
        return None
    done = last.get("last_round")
    try:
        round_ = None if done is None else int(done) + 1
    except (TypeError, ValueError):  # a damaged run.json: the reason without the round
        round_ = None
    return {"reason": str(last["reason"]), "round": round_, "error": last.get("error")}


def stop_note(run: str | os.PathLike) -> str | None:
    """``diverged at round t`` (or another reason run.json gives) for a run that stopped so, else
    None: what a figure's legend or caption says of it, as the tables do."""
    how = stopped(run)
    if how is None:
        return None
    return f"{how['reason']} at round {how['round']}" if how["round"] is not None else how["reason"]


@dataclass
class Run:
    """One run directory: its resolved config (``config.yaml``), its summary (``summary.json``;
    empty while the run has not finished) and, read on first use and kept, its CSVs."""

    path: Path
    config: dict
    summary: dict
    _frames: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Run:
        """Read ``config.yaml`` and ``summary.json`` (an empty summary while the run is unfinished);
        a path that is no folder is one line (:class:`~fedrun.errors.RunDirectoryError`)."""
        path = folders(path)[0]
        return cls(path, read_config(path), read_summary(path))

    @property
    def finished(self) -> bool:
        """Whether the run wrote its ``summary.json`` (fedrun writes it last)."""
        return bool(self.summary)

    @property
    def stopped(self) -> dict | None:
        """How an unfinished run ended (:func:`stopped`); None for a finished run."""
        return None if self.finished else stopped(self.path)

    @property
    def tags(self) -> dict:
        """The config's ``tags`` (set by presets: ``paper``, ``dataset``, ``condition`` ...)."""
        tags = self.config.get("tags")
        return tags if isinstance(tags, dict) else {}

    @property
    def method(self) -> str | None:
        """The aggregator: ``summary.json``'s name, else the config's ``_target_`` function."""
        name = self.summary.get("aggregator")
        if not name:
            node = self.config.get("aggregator")
            target = node.get("_target_") if isinstance(node, dict) else None
            name = target.rsplit(".", 1)[-1] or None if isinstance(target, str) else None
        return name

    @property
    def dataset(self) -> str | None:
        """The dataset the run *stands for*: its ``tags.dataset`` (a paper's preset sets it, and
        it stays when another dataset is substituted), not necessarily the one it read; None
        without the tag."""
        return self.tags.get("dataset")

    @property
    def seed(self):
        return self.config.get("seed")

    def accuracy(self, which: str = "final") -> float | None:
        """``final_test_acc`` or ``best_test_acc`` from the summary (a fraction), or None."""
        value = self.summary.get(f"{which}_test_acc")
        return None if value is None else float(value)

    def csv(self, name: str) -> pd.DataFrame | None:
        """A CSV of the run directory (``rounds.csv``, ``clients.csv`` ...) as a DataFrame, read
        once and kept; None when the file is missing, empty or not CSV (:func:`read_csv`)."""
        if name not in self._frames:
            self._frames[name] = read_csv(self.path, name)
        return self._frames[name]

    def rounds(self) -> pd.DataFrame | None:
        """``rounds.csv`` (one row per round), or None."""
        return self.csv("rounds.csv")


def load_runs(paths: Iterable[str | os.PathLike], reject: Callable[[Run], str] | None = None,
              require: Iterable[str] = FINISHED_FILES) -> tuple[list[Run], list[tuple[Path, str]]]:
    """The runs under ``paths`` (:func:`find_runs` with ``require``: by default the finished ones)
    as :class:`Run` objects, in path order, and ``[(path, why)]`` for the run directories passed
    over: unreadable ones, and those ``reject(run)`` gives a reason for (a non-empty string).
    ``paths`` as :func:`folders` takes them (one path is a list of one)."""
    runs, skipped = [], []
    for path in find_runs(*folders(paths), require=require):
        try:
            run = Run.load(path)
        except (FedrunError, OSError, ValueError, yaml.YAMLError) as e:
            skipped.append((path, f"unreadable: {e}"))
            continue
        why = reject(run) if reject is not None else ""
        if why:
            skipped.append((path, why))
        else:
            runs.append(run)
    return runs, skipped
