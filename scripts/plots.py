"""What the papers' plot scripts share beyond :mod:`fedrun.plot` (pyplot on the headless backend,
markers, integer round ticks, legend labels, the DIRs/``--out`` command line): a curve of a run's
CSV against the round, the mean of several seeds' curves with their range shaded, and the figure's closing (grid, integer round ticks, title, the notes on
how the runs depart from the paper's setting)."""
from __future__ import annotations

from pathlib import Path

from fedrun.plot import DPI, integer_rounds, markers, pyplot


def curve(ax, df, column: str, scale: float = 1.0, **style) -> bool:
    """``scale * df[column]`` vs ``df["round"]``, rounds without a value left out; False when no
    round has one (an empty line is still drawn, so a labelled method keeps its legend entry)."""
    if df is None or column not in df:
        points = [[], []]
    else:
        d = df[["round", column]].dropna()
        points = [d["round"], scale * d[column]]
    ax.plot(*points, **{**markers(len(points[0])), **style})  # a curve's own marker wins over the default
    return len(points[0]) > 0


def method_style(i: int) -> dict:
    """The i-th method's line style and marker, as fedrun-plot draws groups: curves that coincide
    (FedAvg and FedProx at a small mu) stay apart in greyscale and where one hides the other."""
    from fedrun.plot import MARKERS, STYLES

    return {"linestyle": STYLES[i % len(STYLES)], "marker": MARKERS[i % len(MARKERS)], "markersize": 4,
            "markerfacecolor": "none"}


def seed_curve(ax, frames: list, column: str, scale: float = 1.0, **style) -> bool:
    """The mean over seeds of ``scale * column`` vs round (``frames``: one ``rounds.csv`` table per
    seed), with the seeds' range, min to max, shaded at the rounds where more than one seed has a
    value: with 3 seeds a band says more than a standard deviation would.  False when no round has
    a value (the mean's line is still drawn, empty, for the legend)."""
    import pandas as pd

    frames = [f[["round", column]].dropna() for f in frames if f is not None and column in f]
    if not frames:
        return curve(ax, None, column, scale, **style)
    stats = pd.concat(frames).groupby("round")[column].agg(["mean", "min", "max", "count"]).reset_index()
    drawn = curve(ax, stats.rename(columns={"mean": column}), column, scale, **style)
    spread = stats[stats["count"] > 1]
    if len(spread):
        ax.fill_between(spread["round"], scale * spread["min"], scale * spread["max"], color=style.get("color"),
                        alpha=0.15, lw=0)
    return drawn


BAND_NOTE = "lines: mean over seeds; shaded: min to max over seeds"


def fitted(title: str, fig, fontsize: float = 10) -> str:
    """``title`` broken into lines that fit the figure's width (about 0.55 em a character), so a
    long title (a substituted dataset's) is never cut at the figure's edge."""
    import textwrap

    return "\n".join(textwrap.wrap(title, max(20, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))))


def save_figure(fig, path, notes=(), *, left_out=(), bottom: float = 0.06, right: float = 1.0, top: float = 1.0,
                dpi: int = DPI) -> Path:
    """Lay out, save and close a matplotlib figure: ``path`` (a PNG at ``dpi``, 300 as
    ``fedrun-plot``'s) and beside it the same figure as a PDF with TrueType fonts (no Type 3 fonts,
    which IEEE PDF eXpress and ACM's checks reject), ready for a paper.

    ``notes`` (how the runs depart from the paper's setting) are printed in red along the
    bottom, in the figure fraction ``bottom`` kept free for them, and ``left_out`` (the runs of
    the figure that are not drawn, :func:`papers.stopped_notes`: ``FedAvg seed 1: diverged at
    round 5``) above them; ``right`` and ``top`` keep room for a legend placed outside
    the axes.
    """
    lines = ([f"NOT the paper's setting: {'; '.join(notes)}"] if notes else []) + \
        ([f"Not drawn: {'; '.join(left_out)}"] if left_out else [])
    if lines:
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=6, color="firebrick", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, bottom * len(lines), right, top))
    fig.savefig(path, dpi=dpi)
    import matplotlib

    with matplotlib.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42}):
        fig.savefig(Path(path).with_suffix(".pdf"))
    pyplot().close(fig)
    return Path(path)


def finish(fig, axes, title: str, notes: list[str], path: Path, *, bottom: float, right: float = 1.0,
           left_out=()) -> Path:
    """Grid and integer round ticks on every axis, ``title`` over the figure, then save (with the
    notes and the runs left out, :func:`save_figure`)."""
    for ax in axes:
        integer_rounds(ax)
        ax.grid(alpha=0.3)
    fig.suptitle(fitted(title, fig), fontsize=10)
    return save_figure(fig, path, notes, left_out=left_out, bottom=bottom, right=right)
