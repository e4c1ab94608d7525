"""What the papers' plot scripts share: the headless backend, curves vs round, the figure's
closing (grid, integer round ticks, title, the notes on how the runs depart from the paper's
setting) and the command line's DIRs and ``--out``."""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines these run on
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

ROUNDS = "Communication rounds"


def markers(points: int) -> dict:
    """Markers on a curve of a handful of rounds, so single points show; none on long ones."""
    return {"marker": "o", "markersize": 3} if points <= 30 else {}


def curve(ax, df, column: str, scale: float = 1.0, **style) -> bool:
    """``scale * df[column]`` vs ``df["round"]``, rounds without a value left out; False when no
    round has one (an empty line is still drawn, so a labelled method keeps its legend entry)."""
    if df is None or column not in df:
        points = [[], []]
    else:
        d = df[["round", column]].dropna()
        points = [d["round"], scale * d[column]]
    ax.plot(*points, **markers(len(points[0])), **style)
    return len(points[0]) > 0


def mean_label(label: str, runs: int) -> str:
    """A legend label, with how many runs (seeds) its curve averages."""
    return label + (f" (mean of {runs})" if runs > 1 else "")


def integer_rounds(ax) -> None:
    """Integer round ticks on a matplotlib axis, also when only a round or two were run."""
    lo, hi = ax.get_xlim()
    if hi - lo < 3:
        first, last = int(round(lo + 0.05 * (hi - lo))), int(round(hi - 0.05 * (hi - lo)))
        ax.set_xticks(range(first, last + 1))
        ax.set_xlim(first - 0.5, last + 0.5)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig, path, notes=(), *, bottom: float = 0.06, right: float = 1.0, top: float = 1.0,
                dpi: int = 120) -> Path:
    """Lay out, save and close a matplotlib figure.

    ``notes`` (how the runs depart from the paper's setting) are printed in red along the
    bottom, in the figure fraction ``bottom`` kept free for them; ``right`` and ``top`` keep room
    for a legend placed outside the axes.
    """
    if notes:
        fig.text(0.01, 0.005, "NOT the paper's setting: " + "; ".join(notes), fontsize=6, color="firebrick",
                 va="bottom", wrap=True)
    fig.tight_layout(rect=(0, bottom if notes else 0, right, top))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def finish(fig, axes, title: str, notes: list[str], path: Path, *, bottom: float, right: float = 1.0) -> Path:
    """Grid and integer round ticks on every axis, ``title`` over the figure, then save."""
    for ax in axes:
        integer_rounds(ax)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, notes, bottom=bottom, right=right)


def parser(prog: str, doc: str, out_required: bool = True) -> argparse.ArgumentParser:
    """A plot script's command line: DIRs searched for run directories and ``--out``."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for run directories")
    p.add_argument("--out", required=out_required,
                   help="folder for the PNGs" + ("" if out_required else " (required unless --summary)"))
    return p
