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

import argparse
import functools
import math
import os
import sys
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Callable, Hashable, Iterable

from fedrun.moved import current_target
from fedrun.errors import FedrunError, RunDirectoryError, UsageError, print_error
from fedrun.results import Run, folders, load_runs, read_rounds, stop_note

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
        return "" if run.finished else stop_reason(run)

    return load_runs(paths, reject, require=("config.yaml",))


def stop_reason(run: Run) -> str:
    """Why a run has no ``summary.json``: ``diverged at round t: <error>`` (``run.json``,
    :attr:`fedrun.results.Run.stopped`) or :data:`UNFINISHED`."""
    stopped = run.stopped
    if stopped and stopped["reason"] == "diverged":
        what = str(stopped["error"] or "").split(": ", 1)[-1].split(";")[0]  # "round t: <what>; ..."
        return f"{DIVERGED} {stopped['round']}" + (f": {what}" if what else "")
    return UNFINISHED


def group(runs: Iterable[Run], key: Callable[[Run], Hashable]) -> dict:
    """Runs filed by ``key(run)`` (a table cell), seeds of one cell together, in the runs' order."""
    cells: dict = defaultdict(list)
    for run in runs:
        cells[key(run)].append(run)
    return dict(cells)


def one_line_errors(prog: str):
    """A script's ``main(argv)`` with fedrun's refusals: a bad option, folders without the runs it
    needs, a damaged ``config.yaml``, ``summary.json`` or CSV (named by :mod:`fedrun.results`'
    readers), an output path that cannot be written, each printed as one line,
    ``prog: error: <what>: <what to do>`` on stderr, exit code 2, not a traceback (the script's
    parser, :class:`fedrun.errors.ArgumentParser`, says its own errors so too)."""
    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def guarded(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except FedrunError as e:
                print_error(prog, e)
            except OSError as e:  # an output that could not be written after all (a full disk)
                print_error(prog, f"{e.filename or 'a file'}: {e.strerror or e}")
            return 2
        return guarded
    return wrap


def unreadable(skipped: list[tuple[Path, str]], prog: str) -> list[tuple[Path, str]]:
    """Print ``prog: skipping <dir>: unreadable: <file>: <why>`` for each run directory
    :func:`~fedrun.results.load_runs` could not read, and ``prog: skipping <dir>: diverged at round
    t: ...`` for each of the paper's runs that diverged (one line each, on stderr); the others."""
    rest = []
    for path, why in skipped:
        if why.startswith(("unreadable", DIVERGED)):
            print(f"{prog}: skipping {path}: {why}", file=sys.stderr)
        else:
            rest.append((path, why))
    return rest


def with_rounds(runs: list[Run], skipped: list[tuple[Path, str]]) -> list[Run]:
    """The runs whose ``rounds.csv`` has rounds to draw (:func:`fedrun.results.read_rounds`); each
    other one is added to ``skipped`` as unreadable, with the reason (no rows: stopped before its
    first round; not a rounds.csv fedrun wrote), so that no run is left out of a figure unsaid."""
    kept = []
    for run in runs:
        try:
            read_rounds(run.path)
        except RunDirectoryError as e:
            skipped.append((run.path, f"unreadable: {e}"))
            continue
        kept.append(run)
    return kept


def require_runs(runs: list, skipped: list[tuple[Path, str]], what: str, dirs: Iterable) -> None:
    """One line when there is nothing to draw or tabulate: no ``what`` under ``dirs``, with why
    the run directories there were passed over (the first three), so a folder of unfinished,
    diverged or damaged runs says so instead of an empty figure or table."""
    if runs:
        return
    found = "; ".join(_passed_over(path, why) for path, why in skipped[:3])
    more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    raise UsageError(f"no {what} under {', '.join(map(str, folders(dirs)))}: "
                     + (f"{found}{more}" if found else "no run directories (config.yaml) there"))


def _passed_over(path: Path, why: str) -> str:
    """``<dir> (<why>)``, or the reason alone where it names the run directory already."""
    why = why.removeprefix("unreadable: ")
    return why if why.startswith(str(path)) else f"{path} ({why})"


def stopped_notes(skipped: list[tuple[Path, str]], key: Callable[[Run], Hashable],
                  label: Callable[[Run], str]) -> dict:
    """The paper's runs that diverged (:data:`DIVERGED`, from :func:`load_tagged`), filed by
    ``key(run)`` (a figure's cell) as the notes its figure prints below the panels after "Not
    drawn:" (:func:`plots.save_figure`): ``<label(run)> seed s: diverged at round t``, so that a
    diverged run is named where it would have been drawn."""
    notes: dict = defaultdict(list)
    for path, why in skipped:
        if why.startswith(DIVERGED):
            run = Run.load(path)
            notes[key(run)].append(f"{label(run)} seed {run.seed}: {stop_note(path)}")
    return dict(notes)


# ----------------------------------------------------------------------------- command-line values

def fraction(text: str) -> float:
    """An accuracy option (``--target``): a fraction in (0, 1], as rounds.csv holds accuracies;
    ``95`` is refused with the fraction to write instead."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an accuracy as a fraction in (0, 1], e.g. 0.95") from None
    if 1 < value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: accuracies are fractions in (0, 1]: write {value / 100:g} "
                                         f"for {value:g}%")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give an accuracy as a fraction in (0, 1], e.g. 0.95")
    return value


def integer(minimum: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``, refused in one line naming ``what`` it is."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give {what}, an integer >= {minimum}")
        return value
    return parse


# A round option (--upto, --round, --neuron-round): rounds count from 1.
round_number = integer(1, "a round number (rounds count from 1)")


def finite(text: str, positive: bool = False) -> float:
    """An argparse type: a finite number (``positive``: > 0), not nan or inf."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (positive and value <= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number{' > 0' if positive else ''}")
    return value


def positive(text: str) -> float:
    """An argparse type: a finite number > 0."""
    return finite(text, positive=True)


def round_list(text: str) -> list[int]:
    """Comma-separated rounds (``--at 1,5,15``), each >= 1."""
    try:
        rounds = [round_number(r.strip()) for r in text.split(",") if r.strip()]
    except argparse.ArgumentTypeError:
        rounds = []
    if not rounds:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated round numbers >= 1, e.g. 1,5,15")
    return rounds


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
        # A stand-in with a label of its own is named by it too: "CIFAR-10 (JPEG q75 copy)" is never taken for CIFAR-10.
        label = ds_cfg.get("label")
        out.append(f"data substituted: {actual}{f' = {label}' if label else ''} instead of {want}")
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
            if key == "_target_":  # a run of fedrun's earlier module layout names its old path
                have, ref = current_target(have), current_target(ref)
            if not _same(have, ref):
                name = key if section == "hyperparams" else f"{section}.{key}"
                shown, ref_shown = (_short(v) if key == "_target_" else v for v in (have, ref))
                out.append(f"{name}={shown} ({labels.get(key, f'paper {ref_shown}')})")
    return out


def half_up(x, digits: int = 1, sign: bool = False) -> str:
    """``x`` rounded half up to ``digits`` decimals: the one rounding of every table and every figure
    the docs quote (scripts/claims.py's ``fmt``).  It rounds the decimal the float stands for (its
    value to 9 decimals, so 100 x 0.9665 = 96.64999999999999 is 96.65, which rounds to 96.7), never
    the binary float half-even as ``f"{x:.1f}"`` does.  ``sign``: a leading + on values >= 0
    (differences)."""
    value = Decimal(str(round(float(x), 9))).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    if value.is_zero():
        value = value.copy_abs()
    text = f"{value:f}"
    return f"+{text}" if sign and value >= 0 else text


def _short(target):
    """``fedrun.models.nets.MnistCNN`` -> ``MnistCNN``."""
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


def read_dataset(run) -> str | None:
    """The dataset option a run read (``choices.dataset``, else ``dataset.name``), which can differ
    from the one it stands for in a paper's table (``Run.dataset``: its preset's ``tags.dataset``)."""
    config = run.config
    return (config.get("choices") or {}).get("dataset") or (config.get("dataset") or {}).get("name")


def dataset_title(runs, paper: str, labels: dict | None = None) -> str:
    """The dataset a figure's runs read, for its title: the paper's (``paper``, shown by
    ``labels``) when they read it, else what they read in its place (``Fashion-MNIST in place of
    MNIST``), so a substituted figure is never titled with a dataset it did not see."""
    from fedrun.plot import DATASET_NAMES, dataset_label

    labels = labels or {}
    shown = labels.get(paper, DATASET_NAMES.get(paper, paper))
    read = sorted({d for d in (read_dataset(r) for r in runs) if d})
    if not read or read == [paper]:
        return shown
    names = sorted({dataset_label(r.config) or read_dataset(r) for r in runs if read_dataset(r)})
    return f"{' / '.join(names)} in place of {shown}"

