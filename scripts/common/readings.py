#!/usr/bin/env python
"""A table of readings x outcome: how each reading of a paper's setting (a group of runs, one per
seed) fares on one accuracy column, seed by seed.

When a reproduction departs from its paper, the way to find out why is to run each candidate
reading (an initialization, a learning rate, a formula) over a few seeds and set the outcomes side
by side.  This script reads every run directory below the DIRs with :func:`fedrun.results.load`,
groups the runs that differ only in their seed (the ``group`` column: the method's name and the
settings that tell the groups apart, e.g. ``FedAvg, init=keras, adam_eps=1e-07``) and prints one
row per group:

* ``n`` and the seeds;
* ``--target`` (default 0.95): the first round each seed reaches it, in seed order (``-``: not
  within the rounds compared), and their mean over the seeds that reached it;
* ``--at`` (default ``1,5,15``): the accuracy at each of those rounds, the mean over seeds with
  the range [min-max];
* ``--mean-to R`` (optional): each seed's mean accuracy over rounds 1..R, averaged (the area under
  the curve: a claim such as "higher accuracy in the first 20 rounds");
* the final accuracy at the last round compared, over the seeds that did not diverge; and, when
  any did, the round each seed's model became NaN or Inf (``run.json``; ``-``: it did not).

``--upto T`` compares every run over its first T rounds only (readings run for 15 rounds beside a
preset run for 30); ``--ignore KEY`` leaves a setting out of the group labels (``--ignore rounds``
for that case).  ``--csv PATH`` writes the table's numbers in long form.  Examples::

    python scripts/common/readings.py outputs/reproductions/fedlayerwise/readings/* --upto 15 --ignore rounds
    python scripts/common/readings.py outputs/fedlap/readings --metric test_acc --at 5,10,20 --mean-to 20
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # python scripts/common/readings.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import pandas as pd
from scripts.common import tables
from scripts.common.papers import half_up, fraction, one_line_errors, round_list, round_number

from fedrun import results
from fedrun.errors import ArgumentParser
from fedrun.paths import writable_file
from fedrun.results import Run

COLUMNS = ["group", "n", "seeds", "target", "rounds_to_target", "mean_rounds_to_target", "diverged", "at_round",
           "mean_pct", "min_pct", "max_pct", "mean_to_round", "mean_to_pct", "upto", "final_pct"]


def relabel(df: pd.DataFrame, ignore: list[str]) -> pd.DataFrame:
    """``group`` without the ``key=value`` parts of the settings in ``ignore`` (matched on the key
    as it appears in the label: ``rounds`` for ``hyperparams.rounds``)."""
    if not ignore:
        return df

    def strip(label: str) -> str:
        parts = [p.strip() for p in label.split(",")]
        return ", ".join([parts[0]] + [p for p in parts[1:] if p.split("=")[0] not in ignore])

    return df.assign(group=df["group"].map(strip))


def first_reach(curve: pd.Series, target: float) -> int | None:
    """The first round (the index) whose value is >= ``target``; None if none."""
    hit = curve[curve >= target]
    return int(hit.index[0]) if len(hit) else None


def seeds_of(df: pd.DataFrame) -> pd.Series:
    """Each row's seed: :func:`fedrun.results.load`'s ``seed`` column, which it has only where the
    runs' seeds differ; else (runs of one seed, one run) the seed in each run's config.yaml."""
    if "seed" in df:
        return df["seed"]
    return df["run_dir"].map({run: Run.load(run).seed for run in df["run_dir"].unique()})


def reading_rows(df: pd.DataFrame, metric: str, target: float, at: list[int], mean_to: int | None,
                 upto: int | None) -> list[dict]:
    """One row per group: the numbers the table prints (accuracies in %, rounds as integers)."""
    results.require_column([df], metric, "--metric")
    df = df.assign(seed=seeds_of(df)).dropna(subset=[metric])
    if upto is not None:
        df = df[df["round"] <= upto]
    rows = []
    for group, runs in df.groupby("group", sort=False):
        # One curve per run, in seed order; a run that diverged (NaN or Inf) has no final model: its
        # last row is the round before, so it is named (the round it diverged at) and left out of
        # the final accuracy's mean.
        order = sorted(runs.groupby("run_dir"), key=lambda item: (str(item[1]["seed"].iloc[0]), item[0]))
        seeds = [part["seed"].iloc[0] for _, part in order]
        curves = [part.set_index("round")[metric].sort_index() for _, part in order]
        stopped = [(Run.load(run).stopped or {}).get("round") for run, _ in order]
        ended = [c for c, s in zip(curves, stopped) if s is None]
        reach = [first_reach(c, target) for c in curves]
        got = [r for r in reach if r is not None]
        row = {"group": group, "n": len(seeds), "seeds": ";".join(str(s) for s in seeds), "target": target,
               "rounds_to_target": ";".join("-" if r is None else str(r) for r in reach),
               "mean_rounds_to_target": sum(got) / len(got) if got else None, "at": {}, "mean_to_pct": None,
               "mean_to_round": mean_to, "upto": upto,
               "diverged": ";".join("-" if s is None else str(s) for s in stopped),
               "final_pct": 100 * sum(c.iloc[-1] for c in ended) / len(ended) if ended else None}
        for r in at:
            values = [100 * v for v in (c.get(r) for c in curves) if v is not None and pd.notna(v)]
            row["at"][r] = (sum(values) / len(values), min(values), max(values), len(values)) if values else None
        if mean_to is not None:
            means = [c[c.index <= mean_to].mean() for c in curves if c.index.max() >= mean_to]
            row["mean_to_pct"] = 100 * sum(means) / len(means) if len(means) == len(curves) else None
        rows.append(row)
    return rows


def format_table(rows: list[dict], metric: str, target: float, at: list[int], mean_to: int | None,
                 upto: int | None) -> str:
    def at_cell(v):
        if v is None:
            return "-"
        mean, lo, hi, n = v
        return f"{half_up(mean)}" if n == 1 else f"{half_up(mean)} [{half_up(lo)}-{half_up(hi)}]"

    head = ["Reading (group)", "n", f"rounds to {100 * target:g}% (each seed)", "mean"]
    head += [f"@{r} (%)" for r in at] + ([f"mean 1-{mean_to} (%)"] if mean_to else []) + ["final (%)"]
    diverged = any(row["diverged"].strip("-;") for row in rows)
    head += ["diverged at (each seed)"] if diverged else []
    body = []
    for row in rows:
        mean = row["mean_rounds_to_target"]
        line = [row["group"], str(row["n"]), row["rounds_to_target"].replace(";", ", "),
                "-" if mean is None else f"{half_up(mean)}"]
        line += [at_cell(row["at"][r]) for r in at]
        if mean_to:
            line.append("-" if row["mean_to_pct"] is None else f"{half_up(row['mean_to_pct'])}")
        line.append("-" if row["final_pct"] is None else f"{half_up(row['final_pct'])}")
        if diverged:
            line.append(row["diverged"].replace(";", ", "))
        body.append(line)
    title = (f"Readings x outcome on {metric}: one row per group of runs that differ only in their seed; "
             f"rounds to {100 * target:g}% per seed in seed order (- = not reached"
             f"{f' within {upto} rounds' if upto else ''}); accuracies: mean over seeds [min-max]"
             + ("; diverged at: the round each seed's model became NaN or Inf (- = it did not), such seeds "
                "left out of final" if diverged else ""))
    return title + "\n" + tables.render(head, body, labels=1, align_head=str.rjust)


def long_rows(rows: list[dict]) -> list[dict]:
    """The table in long form: one row per group and ``--at`` round."""
    out = []
    for row in rows:
        for r, v in row["at"].items():
            out.append({**{k: row[k] for k in COLUMNS if k in row}, "at_round": r,
                        "mean_pct": None if v is None else v[0], "min_pct": None if v is None else v[1],
                        "max_pct": None if v is None else v[2]})
    return out


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="readings.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for run directories")
    p.add_argument("--metric", default="test_acc", help="the rounds.csv accuracy column (default test_acc)")
    p.add_argument("--target", type=fraction, default=0.95, help="accuracy to reach, a fraction (default 0.95)")
    p.add_argument("--at", type=round_list, default="1,5,15", help="rounds whose accuracy is shown (default 1,5,15)")
    p.add_argument("--mean-to", type=round_number, default=None,
                   help="also show each group's mean accuracy over rounds 1..R")
    p.add_argument("--upto", type=round_number, default=None, help="compare the runs over their first T rounds only")
    p.add_argument("--ignore", action="append", default=[], metavar="KEY",
                   help="leave this setting out of the group labels (e.g. rounds); repeatable")
    p.add_argument("--csv", default=None, help="also write the numbers to this CSV (long form)")
    tables.format_option(p)
    return p


@one_line_errors("readings")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.csv:
        writable_file("--csv", Path(args.csv))
    df = results.load(*args.dirs)  # no run below the DIRs, a damaged file: one line (exit 2)
    results.require_rows(df)
    rows = reading_rows(relabel(df, args.ignore), args.metric, args.target, args.at, args.mean_to, args.upto)
    with tables.use_format(args.format), tables.latex_only(args.format):
        print(format_table(rows, args.metric, args.target, args.at, args.mean_to, args.upto))
        if args.csv:
            tables.write_csv(long_rows(rows), args.csv, COLUMNS, ".4g")
    return 0

if __name__ == "__main__":
    sys.exit(main())
