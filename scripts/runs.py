"""Find and read fedrun run directories (read-only), for the papers' table and plot scripts.

Runs are found and read with :mod:`fedrun.results`.  A run directory here is a *finished* one: a
folder holding both ``summary.json`` and ``config.yaml`` (``results.find_runs(...,
require=FINISHED)``), with or without ``rounds.csv``; a run that has not finished is not listed.
The papers' presets label their runs with ``tags`` (``paper``, ``dataset`` and a column such as
``condition`` or ``scenario``), and ``summary.json`` names the aggregator, so every run can be
filed under a cell of a paper's table without parsing directory names.

The scripts are run as ``python scripts/<name>.py`` from the repository root, which puts this
folder on ``sys.path``.
"""
from __future__ import annotations

import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Iterable

import yaml

from fedrun import results

# Dataset settings that shrink the data (a subset): named in every departure note.
DATA_SIZE_KEYS = ("max_train", "max_test")
# What makes a folder a run directory of the tables and plots: a finished run.
FINISHED = results.FINISHED_FILES


@dataclass
class Run:
    """One run directory: its resolved config, its summary and (lazily) its CSVs."""

    path: Path
    config: dict
    summary: dict
    _frames: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Run":
        """Read ``config.yaml`` and ``summary.json`` (an empty summary while the run is unfinished)."""
        path = Path(path)
        return cls(path, results.read_config(path), results.read_summary(path))

    @property
    def finished(self) -> bool:
        return bool(self.summary)

    @property
    def tags(self) -> dict:
        return self.config.get("tags") or {}

    @property
    def method(self) -> str | None:
        """The aggregator: ``summary.json``'s name, else the config's ``_target_`` function."""
        name = self.summary.get("aggregator")
        if not name:
            target = (self.config.get("aggregator") or {}).get("_target_", "")
            name = target.rsplit(".", 1)[-1] or None
        return name

    @property
    def dataset(self) -> str | None:
        """The dataset the run *stands for* (the preset's tag), not necessarily the one it read."""
        return self.tags.get("dataset")

    @property
    def seed(self):
        return self.config.get("seed")

    def accuracy(self, which: str = "final") -> float | None:
        """``final_test_acc`` or ``best_test_acc`` from the summary (a fraction), or None."""
        value = self.summary.get(f"{which}_test_acc")
        return None if value is None else float(value)

    def csv(self, name: str):
        """A CSV of the run directory (``rounds.csv``, ``clients.csv`` ...) as a pandas DataFrame,
        cached on the run; None when the file is missing, empty or not CSV (:func:`fedrun.results.read_csv`)."""
        if name not in self._frames:
            self._frames[name] = results.read_csv(self.path, name)
        return self._frames[name]

    def rounds(self):
        """``rounds.csv`` (one row per round), or None."""
        return self.csv("rounds.csv")


def load_runs(paths: Iterable[str | os.PathLike], reject: Callable[[Run], str]):
    """The runs under ``paths`` that ``reject`` passes (returns ``""``): ``(runs, skipped)``, with
    ``[(path, reason)]`` for the unreadable and rejected ones."""
    runs, skipped = [], []
    for path in results.find_runs(*paths, require=FINISHED):
        try:
            run = Run.load(path)
        except (OSError, ValueError, yaml.YAMLError) as e:
            skipped.append((path, f"unreadable: {e}"))
            continue
        why = reject(run)
        if why:
            skipped.append((path, why))
        else:
            runs.append(run)
    return runs, skipped


def load_tagged(paths: Iterable[str | os.PathLike], paper: str, keys: Iterable[str] = ("dataset",)):
    """The runs of a paper's presets: tagged ``paper``, with a method and every tag in ``keys``.
    Returns ``(runs, skipped)``."""
    keys = tuple(keys)

    def reject(run: Run) -> str:
        if run.tags.get("paper") != paper:
            return f"not tagged paper={paper}"
        if run.method is None or any(run.tags.get(k) is None for k in keys):
            return f"no method or no tags {'/'.join(keys)}"
        return ""

    return load_runs(paths, reject)


def group(runs: Iterable[Run], key: Callable[[Run], Hashable]) -> dict:
    """Runs filed by ``key(run)`` (a table cell), seeds of one cell together, in the runs' order."""
    cells: dict = defaultdict(list)
    for run in runs:
        cells[key(run)].append(run)
    return dict(cells)


def missing_dirs(dirs: list[str], prog: str) -> bool:
    """Print one line per argument that is not a directory; True if there was one."""
    bad = [d for d in dirs if not Path(d).is_dir()]
    for d in bad:
        print(f"{prog}: no such directory: {d}", file=sys.stderr)
    return bool(bad)


# ----------------------------------------------------------------------------- the paper's setting

def setting_deviations(run: Run, hyperparams: dict, data: str | None = None, model: dict | None = None,
                       partition: dict | None = None, labels: dict | None = None) -> list[str]:
    """How ``run`` departs from a paper's setting, as short phrases (empty: the paper's setting).

    ``hyperparams`` / ``model`` / ``partition`` map config keys (of the run's ``hyperparams``,
    ``model``, ``partition``) to the paper's values, ``data`` is the paper's dataset (default: the
    ``dataset`` tag).  ``labels`` may rename a reference value in the message
    (e.g. ``{"rounds": "preset 100; T not stated"}``).
    """
    labels = labels or {}
    out = []
    ds_cfg = run.config.get("dataset") or {}
    actual, want = ds_cfg.get("name"), data or run.dataset
    if want and actual and actual != want:
        out.append(f"data substituted: {actual} instead of {want}")
    limits = [f"{k}={ds_cfg[k]}" for k in DATA_SIZE_KEYS if ds_cfg.get(k) is not None]
    if limits:
        out.append("data subset " + " ".join(limits))
    for section, reference in (("model", model), ("partition", partition), ("hyperparams", hyperparams)):
        have_cfg = run.config.get(section) or {}
        for key, ref in (reference or {}).items():
            have = have_cfg.get(key)
            if key not in have_cfg:
                if section == "hyperparams":
                    continue  # not recorded (an older or hand-made config): nothing to compare
                have = "unset"
            if not _same(have, ref):
                name = key if section == "hyperparams" else f"{section}.{key}"
                shown, ref_shown = (_short(v) if key == "_target_" else v for v in (have, ref))
                out.append(f"{name}={shown} ({labels.get(key, f'paper {ref_shown}')})")
    return out


def _short(target):
    """``fedrun.models.MnistCNN`` -> ``MnistCNN``."""
    return target.rsplit(".", 1)[-1] if isinstance(target, str) else target


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) \
            and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def count_notes(per_run: Iterable[list[str]]) -> list[str]:
    """Distinct phrases over runs (one list per run), each with the number of runs it concerns."""
    counts: dict[str, int] = defaultdict(int)
    for phrases in per_run:
        for d in phrases:
            counts[d] += 1
    return [f"{d} ({n} run{'s' if n != 1 else ''})" for d, n in sorted(counts.items())]


def mean_by_round(frames: list, column: str = "round"):
    """DataFrames of one quantity per round (seeds of one method) averaged round by round; None
    without any."""
    import pandas as pd

    frames = [f for f in frames if f is not None]
    if not frames:
        return None
    if len(frames) == 1:
        return frames[0]
    return pd.concat(frames).groupby(column, as_index=False).mean(numeric_only=True)


def save_figure(*args, **kwargs):
    """:func:`plots.save_figure`, importable from here for ``loss_surface.py`` (which imports it
    from this module) without loading matplotlib into the table scripts."""
    from plots import save_figure as save

    return save(*args, **kwargs)
