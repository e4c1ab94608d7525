"""What the papers' table and plot scripts share about a paper's runs: which runs are a paper's,
how they are filed into a table's cells, and how they depart from the paper's setting.

Runs are found and read by :mod:`fedrun.results` (:class:`~fedrun.results.Run`,
:func:`~fedrun.results.load_runs`: every folder holding a ``config.yaml``; the tables use the
finished ones, which hold ``summary.json`` too, and name the others); this module only filters and
files them.  The papers' presets label their runs
with ``tags`` (``paper``, ``dataset`` and a column such as ``condition`` or ``scenario``), and
``summary.json`` names the aggregator, so every run can be filed under a cell of a paper's table
without parsing directory names.
"""
from __future__ import annotations

import functools
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Hashable, Iterable

from fedrun.errors import FedrunError
from fedrun.results import Run, load_runs

# Dataset settings that shrink the data (a subset): named in every departure note.
DATA_SIZE_KEYS = ("max_train", "max_test")


# The reasons load_tagged gives for a paper's runs that have no summary.json: nothing is left out of a
# table without a line saying so (tables.report prints them apart from the other skipped folders).
DIVERGED = "diverged at round"
UNFINISHED = "not finished (still running, or stopped by Ctrl-C, a kill or a full disk: resume=true continues it)"


def load_tagged(paths: Iterable[str | os.PathLike], paper: str, keys: Iterable[str] = ("dataset",)):
    """The runs of a paper's presets: tagged ``paper``, with a method and every tag in ``keys``.
    Returns ``(runs, skipped)``: the finished runs, and ``(path, why)`` for the folders passed over,
    among them the paper's runs that did not finish, as ``diverged at round t: <error>`` (from
    ``run.json``, :attr:`fedrun.results.Run.stopped`) or :data:`UNFINISHED`."""
    keys = tuple(keys)

    def reject(run: Run) -> str:
        if run.tags.get("paper") != paper:
            return f"not tagged paper={paper}"
        if run.method is None or any(run.tags.get(k) is None for k in keys):
            return f"no method or no tags {'/'.join(keys)}"
        if not run.finished:
            stopped = run.stopped
            if stopped and stopped["reason"] == "diverged":
                what = str(stopped["error"] or "").split(": ", 1)[-1].split(";")[0]  # "round t: <what>; ..."
                return f"{DIVERGED} {stopped['round']}" + (f": {what}" if what else "")
            return UNFINISHED
        return ""

    return load_runs(paths, reject, require=("config.yaml",))


def group(runs: Iterable[Run], key: Callable[[Run], Hashable]) -> dict:
    """Runs filed by ``key(run)`` (a table cell), seeds of one cell together, in the runs' order."""
    cells: dict = defaultdict(list)
    for run in runs:
        cells[key(run)].append(run)
    return dict(cells)


def one_line_errors(prog: str):
    """A script's ``main(argv)``, with fedrun's one-line errors (a damaged ``config.yaml``,
    ``summary.json`` or CSV, named by :mod:`fedrun.results`' readers) printed as ``prog: <error>``
    on stderr and exit code 2, not a traceback."""
    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def guarded(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except FedrunError as e:
                print(f"{prog}: {e}", file=sys.stderr)
                return 2
        return guarded
    return wrap


def unreadable(skipped: list[tuple[Path, str]], prog: str) -> list[tuple[Path, str]]:
    """Print ``prog: skipping <dir>: unreadable: <file>: <why>`` for each run directory
    :func:`~fedrun.results.load_runs` could not read (one line each, on stderr); the others."""
    rest = []
    for path, why in skipped:
        if why.startswith("unreadable"):
            print(f"{prog}: skipping {path}: {why}", file=sys.stderr)
        else:
            rest.append((path, why))
    return rest


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
