"""The skeleton the papers' table scripts share (fednnnn/table2.py, fedlayerwise/table1.py,
pd/tables.py; fedlap/plot.py's summary too).

A table script describes its paper's table: its cells (and which cell a run is filed under, from
its tags or its config), the reduction of a cell's runs (seeds) to one long-form row, how a row
prints, and its paper's numbers (a CSV in ``scripts/paper_targets/``, the same as
``../shared/papers/targets/``).  This module does
the rest: reading the paper's CSV, means over seeds, the text table (ours beside the paper's, with
the difference), the lines under it (counts, skipped runs, the NOTE on runs that are not the
paper's setting), the long-form CSV, and the ``collect`` / ``run`` command line.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

from scripts.common import grid
from scripts.common.papers import DIVERGED, UNFINISHED, count_notes, integer, positive, require_runs

from fedrun import tables as fedrun_tables
from fedrun.errors import ArgumentParser
from fedrun.paths import writable_file, writable_folder
from fedrun.results import Run, folders

PAPER_TARGETS = Path(__file__).resolve().parents[1] / "paper_targets"  # scripts/paper_targets


def paper_csv(path: str | Path | None, default: str) -> list[dict]:
    """The rows of a paper's numbers: from ``path`` (``--paper-csv``), else the transcription
    ``scripts/paper_targets/<default>``."""
    with open(path or PAPER_TARGETS / default, newline="") as f:
        return list(csv.DictReader(f))


def mean(values: Iterable[float | None]) -> float | None:
    """The mean over a cell's runs (seeds) that have a value; None when none has."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def mean_pct(fractions: Iterable[float | None]) -> float | None:
    """:func:`mean` of fractions (accuracies), in percent."""
    return mean(None if v is None else 100 * v for v in fractions)


def minus(ours: float | None, paper: float | None) -> float | None:
    """ours - paper, or None when either is missing."""
    return None if ours is None or paper is None else ours - paper


# ----------------------------------------------------------------------------- text

FORMATS = fedrun_tables.FORMATS
_FORMAT = ["text"]  # the format render() writes in, set by a script's --format (use_format)


@contextlib.contextmanager
def use_format(fmt: str):
    """While inside, :func:`render` writes ``fmt`` (one of :data:`FORMATS`): the ``--format`` of
    every table script, of readings.py and of fedlap/plot.py's summary."""
    _FORMAT.append(fedrun_tables.check_format(fmt, "--format"))
    try:
        yield
    finally:
        _FORMAT.pop()


def format_option(*parsers: argparse.ArgumentParser) -> None:
    for q in parsers:
        q.add_argument("--format", choices=FORMATS, default="text",
                       help="the table as aligned text (default), GitHub Markdown, or a LaTeX tabular (booktabs)")


def render(head: list[str], body: list[list[str]], labels: int = 1, groups: list[tuple[str, int]] | None = None,
           align_head: Callable[[str, int], str] = str.center) -> str:
    """A table: the first ``labels`` columns left-aligned, the values right-aligned under their
    headers (centred, or ``align_head``).  ``groups`` ``[(title, n)]`` puts a title over each run of
    ``n`` value columns (FedNNNN's condition over its two datasets).  As aligned text, or in the
    format :func:`use_format` chose: Markdown (a group's title prefixes its columns' headers, as
    Markdown has no spanning cells) or a LaTeX ``tabular`` with booktabs rules.  The layout is
    :func:`fedrun.tables.render`'s, which the sweep's closing table shares."""
    return fedrun_tables.render(head, body, _FORMAT[-1], labels=labels, groups=groups, align_head=align_head)


class LatexComments:
    """A stream that passes a LaTeX ``tabular`` through as it is and writes every other line
    (a table's title, its notes, the counts and ``wrote`` lines under it) as a ``%`` comment, so
    that what a script prints with ``--format latex`` is a file a paper can ``\\input``: the
    table alone, its caption and notes kept beside it for the author to read."""

    def __init__(self, stream):
        self.stream, self.partial, self.inside = stream, "", False

    def write(self, text: str) -> int:
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self.stream.write(self.line(line) + "\n")
        return len(text)

    def line(self, line: str) -> str:
        if line.startswith(r"\begin{tabular}"):
            self.inside = True
        if self.inside:
            self.inside = not line.startswith(r"\end{tabular}")
            return line
        return "%" + (" " + line if line.strip() else "")

    def flush(self) -> None:
        if self.partial:
            self.stream.write(self.line(self.partial) + "\n")
            self.partial = ""
        self.stream.flush()


@contextlib.contextmanager
def latex_only(fmt: str):
    """While inside, with ``fmt`` ``latex``, what is printed goes through :class:`LatexComments`:
    the ``tabular`` as it is, every other line a comment.  Other formats print as they are."""
    if fmt != "latex":
        yield
        return
    stream = LatexComments(sys.stdout)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.flush()


def directories(n: int) -> str:
    return f"{n} run director{'ies' if n > 1 else 'y'}"


def listing(skipped: list[tuple[Path, str]], limit: int) -> str:
    """``path (why); ...`` for the first ``limit`` skipped runs."""
    return "; ".join(f"{p} ({why})" for p, why in skipped[:limit]) + (" ..." if len(skipped) > limit else "")


def print_notes(heading: str, notes: list[str], out) -> None:
    if notes:
        print(heading, file=out)
        for n in notes:
            print(f"  - {n}", file=out)


def report(runs: list[Run], skipped: list, rows: list[dict], dirs: list[str], *, cell: Callable[[Run], tuple],
           table_cells: list[tuple], table: str, paper: str, deviations: Callable[[Run], list[str]], not_paper: str,
           out) -> None:
    """The lines under a table of methods x columns: how many runs filled how many of its cells,
    the runs' cells that are not in the table, the skipped run directories, and the NOTE on runs
    that are not the paper's setting (each departure with the number of runs it concerns)."""
    filled = sum(r["n_runs"] > 0 for r in rows)
    print(f"\n{len(runs)} run(s) in {filled} of {len(rows)} cells, from {', '.join(map(str, folders(dirs)))}", file=out)
    unknown = sorted({cell(r) for r in runs} - set(table_cells))
    if unknown:
        print(f"not in {table} (ignored): {unknown}", file=out)
    damaged = [s for s in skipped if s[1].startswith("unreadable")]
    diverged = [s for s in skipped if s[1].startswith(DIVERGED)]
    unfinished = [s for s in skipped if s[1] == UNFINISHED]
    skipped = [s for s in skipped if s not in damaged + diverged + unfinished]
    if damaged:  # a damaged config.yaml or summary.json, named by fedrun.results
        print(f"{directories(len(damaged))} unreadable (skipped): {listing(damaged, 5)}", file=out)
    if diverged:  # a NaN/Inf model: no final accuracy to average; the cell's means leave them out
        print(f"{len(diverged)} {paper} run(s) diverged (NaN or Inf; no final accuracy, so left out of the "
              f"means): {listing(diverged, 20)}", file=out)
    if unfinished:
        print(f"{len(unfinished)} {paper} run(s) {UNFINISHED}, left out: "
              f"{'; '.join(str(p) for p, _ in unfinished[:20])}{' ...' if len(unfinished) > 20 else ''}", file=out)
    if skipped:
        print(f"{directories(len(skipped))} skipped (not {paper} preset runs): {listing(skipped, 5)}", file=out)
    print_notes("\n" + not_paper, count_notes(deviations(r) for r in runs), out)


# The long-form CSVs' column of run folders (several joined by ";"), written relative to the CSV's folder.
RUN_DIR_COLUMN = "run_dir"


def write_csv(rows: list[dict], path: str | None, columns: list[str], float_format: str, out=None) -> None:
    """The long-form CSV (floats as ``float_format``; None and NaN empty) and a ``wrote`` line;
    nothing when ``path`` is None or empty.  The run folders of a ``run_dir`` column are written
    relative to the CSV's folder (``5iid_5noniid/fedavg_seed0``, ``../runs/fedavg_seed0``), never as
    this machine's absolute paths, so the CSV stays right wherever its folder is checked out."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    folder = Path(path).resolve().parent
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: relative_runs(r[k], folder) if k == RUN_DIR_COLUMN else _csv_value(r[k], float_format)
                             for k in columns})
    print(f"\nwrote {path}", file=out or sys.stdout)


def relative_runs(value, folder: Path) -> str:
    """``value``'s run folders (one path, or several joined by ``;``) relative to ``folder``, with
    ``/`` between the names; empty for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or str(value) == "":
        return ""
    return ";".join(Path(os.path.relpath(Path(p).resolve(), folder)).as_posix() for p in str(value).split(";") if p)


def _csv_value(value, float_format: str):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return format(value, float_format) if isinstance(value, float) else value


# ----------------------------------------------------------------------------- command line

# What scale=smoke does to a preset (conf/scale/smoke.yaml), for the scripts' --smoke help.
SMOKE = ("scale=smoke: 3 rounds, 2 local epochs, at least 3 clients a round, 1,000/300 train/test images; "
         "checks the pipeline, is not the paper's setting")


def accuracy_option(*parsers: argparse.ArgumentParser) -> None:
    """``--accuracy final|best`` on the modes that fill a table's CSV."""
    for q in parsers:
        q.add_argument("--accuracy", choices=("final", "best"), default="final",
                       help="which accuracy fills the CSV's ours_pct/diff_pct columns: final_test_acc (after the "
                            "last round; default) or best_test_acc (highest over the rounds). The table and the "
                            "CSV's final_*/best_* columns always show both")


def table_parser(prog: str, doc: str, table: str, csv_name: str, layout: str, run_description: str,
                 paper: str, datasets: tuple[str, ...], substitute_help: str,
                 substitute_metavar: str = "DATASET=OPTION") -> tuple[argparse.ArgumentParser,
                                                                     argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line every table script shares: ``collect DIR...`` and ``run --out OUT``, both
    with ``--paper-csv`` (a CSV like ``paper``, the script's transcription), ``run`` with
    ``--substitute`` for one of ``datasets``.

    Returns ``(parser, collect, run)``; the script adds its own options to the two modes.
    ``layout``: where ``run`` puts each run below OUT.
    """
    p = ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True, metavar="{collect,run}")
    c = sub.add_parser("collect", help=f"print {table} from existing run directories",
                       description=f"Find run directories under DIRs and print {table} (ours vs paper).")
    c.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for run directories")
    c.add_argument("--csv", default=None, metavar="PATH",
                   help=f"also write the long-form CSV to PATH (e.g. {csv_name}); by default none is written: "
                        "the table is printed only, and nothing is written into the DIRs read")
    r = sub.add_parser("run", help="launch the missing runs with fedrun, then collect", description=run_description)
    r.add_argument("--out", required=True, help=f"output folder: runs go to OUT/{layout}")
    r.add_argument("--seeds", default="0,1,2", type=grid.seeds,
                   help="comma-separated seeds (default 0,1,2: three runs a cell, so each cell shows its "
                        "spread over seeds; 0 for one run)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra fedrun override for every run, e.g. --set device=cuda; repeatable. One value "
                        "each, not a sweep (runs are named <method>_seed<seed>)")
    r.add_argument("--csv", default=None, help=f"long-form CSV (default OUT/{csv_name}; '' for none)")
    r.add_argument("--dry-run", action="store_true", help="print the fedrun commands, run nothing")
    r.add_argument("--population", action="store_true",
                   help=f"add {grid.POPULATION} to every sweep: the runs of a sweep that share a dataset and "
                        "model train together, each with the results it has alone (docs/sweeps.md)")
    r.add_argument("--substitute", action="append", type=lambda text: grid.dataset_substitute(text, datasets),
                   default=[], metavar=substitute_metavar, help=substitute_help)
    r.add_argument("--resume", action="store_true",
                   help="continue runs that started but did not finish (resume=true) instead of skipping them, "
                        f"their checkpoints taken from OUT/{grid.RESUME_ARCHIVE} where the folder has none; "
                        "a run that diverged is not resumed")
    r.add_argument("--jobs", type=integer(1, "a number of processes"), default=1, metavar="N",
                   help="run N fedrun processes at once, one run each (with --population, one sweep each); on a "
                        "CPU of N cores add --set threads=1 (default 1: one sweep after another)")
    r.add_argument("--stop-after", type=positive, default=None, metavar="MINUTES",
                   help="stop the runs going after MINUTES (each after its last complete round); none starts in "
                        f"the last 2 minutes; the unfinished runs' checkpoints are packed into OUT/{grid.RESUME_ARCHIVE}, so "
                        "the folder, committed or copied, goes on with --resume")
    format_option(c, r)
    columns = ",".join(paper_csv(None, paper)[0])
    for q in (c, r):
        q.add_argument("--paper-csv", default=None,
                       help=f"read the paper's numbers from this CSV ({columns}, e.g. ../shared/papers/targets/"
                            f"{paper}) instead of the built-in transcription")
    return p, c, r


def table_main(args: argparse.Namespace, run_grid: Callable[[argparse.Namespace], int],
               collect: Callable[[argparse.Namespace, str | None], object]) -> int:
    """Dispatch a table script's mode, once its paths are checked (nothing is written before):
    ``run`` launches the grid into ``--out``; ``collect`` reads the DIRs and calls
    ``collect(args, csv_path)`` (csv_path: ``--csv``; None, the default, writes no CSV).  The exit
    code; the script's ``main`` is wrapped in :func:`papers.one_line_errors`, so a refusal is one
    line, ``prog: error: ...``, exit 2."""
    if args.csv:
        writable_file("--csv", Path(args.csv))
    with use_format(args.format), latex_only(args.format):
        if args.mode == "run":
            writable_folder("--out", Path(args.out))
            return run_grid(args)
        folders(args.dirs)
        collect(args, args.csv or None)  # no CSV unless asked: collect writes nothing into what it reads
    return 0


def require(runs, skipped: list[tuple[Path, str]], paper: str, dirs, needed: bool) -> None:
    """``collect``'s refusal (when ``needed``: the collect mode; ``run`` prints what it has) of
    folders without a finished run of the paper, in one line that says what was found there
    (unfinished, diverged, damaged or other runs: :func:`papers.require_runs`)."""
    if needed:
        require_runs(runs, skipped, f"finished {paper} preset runs", dirs)


def run_csv(args, out: Path, name: str) -> str | None:
    """``run``'s CSV after the grid: ``--csv``, by default OUT/<name>; None for ``--csv ''``."""
    return str(out / name) if args.csv is None else args.csv or None
