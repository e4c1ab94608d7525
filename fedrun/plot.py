"""Plot any fedrun runs: accuracy, loss, N/E and the server step, averaged over seeds.

For runs of no paper in particular (the zero-argument ``fedrun``, a sweep of your own).  Every run
directory found below the DIRs is read with :func:`fedrun.results.load`; runs that differ only in
their seed form one group (the table's ``group`` column), drawn as the mean over its seeds with
a band (``--band std``: mean +- one standard deviation; ``minmax``: the seeds' range; ``none``).
A group is labelled by its method's name and the settings that tell it apart: those that differ
among all runs (``partition=iid``) and the method's own that differ among its runs
(``beta=0.5``); a setting a method does not have is never shown.  Four panels: test accuracy
(%), test loss, N/E (eq. 4 over eq. 5 of FedNNNN: 1 when all clients agree) and the server step
``||w_{t+1} - w_t||``, against integer rounds.  Writes ``runs.png`` and ``runs.pdf``
(``--formats png,pdf,svg``) to ``--out``, with ``runs.csv`` beside them: the numbers drawn (group,
metric, round, mean, band bounds low/high, runs n).  It prints one line per group drawn and a
warning for every group or panel left without values.

    fedrun-plot outputs/multirun/2026-11-23 --out outputs/figs
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedrun import results
from fedrun.errors import FedrunError

PROG = "fedrun-plot"
ROUNDS = "Communication rounds"
# column, y label (with units), scale
PANELS = (("test_acc", "test accuracy (%)", 100.0), ("test_loss", "test loss (cross-entropy, nats)", 1.0),
          ("N_over_E", "N / E (client agreement, 1 = all agree)", 1.0),
          ("server_step", "server step ||w_{t+1} - w_t||", 1.0))
BANDS = tuple(results.BANDS)
FORMATS = ("png", "pdf", "svg")
# Each group's line style and marker as well as its colour, so overlapping and greyscale curves
# stay apart.
STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


# ----------------------------------------------------------------------------- helpers the plot scripts share

def pyplot():
    """matplotlib's pyplot on the headless Agg backend (files only: no display on the machines
    plots are made on), imported on first use so that ``import fedrun`` stays light."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def markers(points: int) -> dict:
    """Markers on a curve of a handful of rounds, so single points show; none on long ones."""
    return {"marker": "o", "markersize": 3} if points <= 30 else {}


def mean_label(label: str, runs: int) -> str:
    """A legend label, with how many runs (seeds) its curve averages."""
    return label + (f" (mean of {runs})" if runs > 1 else "")


def integer_rounds(ax) -> None:
    """Integer round ticks on a matplotlib axis, also when only a round or two were run."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = ax.get_xlim()
    if hi - lo < 3:
        first, last = int(round(lo + 0.05 * (hi - lo))), int(round(hi - 0.05 * (hi - lo)))
        ax.set_xticks(range(first, last + 1))
        ax.set_xlim(first - 0.5, last + 0.5)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def parser(prog: str | None, doc: str, out_required: bool = True) -> argparse.ArgumentParser:
    """A plot command line: DIRs searched for run directories and ``--out``."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for run directories")
    p.add_argument("--out", required=out_required,
                   help="folder for the figures" + ("" if out_required else " (required unless --summary)"))
    return p


# ----------------------------------------------------------------------------- fedrun-plot

def plot(df, out: str | Path, band: str = "std", formats: tuple[str, ...] = ("png", "pdf"),
         log=print) -> list[Path]:
    """Draw the four panels for every group of ``df`` (:func:`fedrun.results.load`'s table), the
    mean over each group's seeds with its band (:func:`fedrun.results.seed_curves`); write the
    figure as ``runs.<format>`` into ``out`` and, beside it, ``runs.csv``: the numbers drawn
    (group, method, metric, round, mean, band, n).  ``log`` gets one line per group drawn and a
    warning for each panel a group is missing from.  Returns the paths written.

    The figure is a :class:`matplotlib.figure.Figure` of its own, not pyplot's: drawing it
    changes neither the backend nor the current figure of a notebook that calls this."""
    from matplotlib.figure import Figure

    out = Path(out)
    curves = results.seed_curves(df, [column for column, _, _ in PANELS], band)
    groups = list(dict.fromkeys(curves["group"]))
    runs = df.groupby("group")["run_dir"].nunique()
    fig = Figure(figsize=(5 * len(PANELS), 4.2))
    axes = fig.subplots(1, len(PANELS))
    for ax, (column, ylabel, scale) in zip(axes, PANELS):
        for key in groups:
            c = curves[(curves["group"] == key) & (curves["metric"] == column)]
            i = groups.index(key)
            color, style = f"C{i % 10}", {**markers(len(c)), "linestyle": STYLES[i % len(STYLES)]}
            if "marker" in style:
                style["marker"] = MARKERS[i % len(MARKERS)]
            ax.plot(c["round"], scale * c["mean"], color=color, label=mean_label(key, runs[key]), **style)
            if band != "none" and (c["n"] > 1).any():
                ax.fill_between(c["round"], scale * c["low"], scale * c["high"], color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel(ROUNDS)
        ax.set_ylabel(ylabel)
        integer_rounds(ax)
        ax.grid(alpha=0.3)
    several = df["run_dir"].nunique() > len(groups)
    axes[0].legend(fontsize=8, title=results.BANDS[band] if several else None, title_fontsize=8)
    out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    paths = [out / f"runs.{fmt}" for fmt in formats]
    for path in paths:
        fig.savefig(path, dpi=120)
    data = out / "runs.csv"
    curves.to_csv(data, index=False)
    for key in groups + sorted(set(df["group"]) - set(groups)):
        seeds = sorted(df.loc[df["group"] == key, "seed"].unique()) if "seed" in df else []
        mine = curves[curves["group"] == key]
        drawn = [column for column, _, _ in PANELS if column in set(mine["metric"])]
        what = f"{runs[key]} run{'s' if runs[key] != 1 else ''}" + (f" (seeds {', '.join(map(str, seeds))})"
                                                                     if len(seeds) > 1 else "")
        if not drawn:
            log(f"warning: {key}: {what}, no values of {', '.join(c for c, _, _ in PANELS)}; not drawn")
            continue
        log(f"{key}: {what}, rounds {mine['round'].min()}-{mine['round'].max()}, "
            f"{len(drawn)} of {len(PANELS)} panels")
        for column, _, _ in PANELS:
            if column not in drawn:
                log(f"warning: {key}: no values of {column}; left out of its panel")
    return [*paths, data]


def main(argv: list[str] | None = None) -> int:
    """``fedrun-plot DIR... --out OUT [--band std|minmax|none] [--formats png,pdf]``: the exit
    code (2 for bad options or no runs under the DIRs)."""
    p = parser(PROG, __doc__)
    p.add_argument("--band", choices=BANDS, default="std", help="the band around each group's mean over seeds")
    p.add_argument("--formats", default="png,pdf", help="comma-separated: " + ", ".join(FORMATS))
    args = p.parse_args(argv)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        print(f"{PROG}: --formats={args.formats}: choose from {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    try:
        df = results.load(*args.dirs)
    except FedrunError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    for path in plot(df, Path(args.out), args.band, formats):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
