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

    # Never inside a hyphenated name (NetA-Baseline, Fashion-MNIST): between words only.
    return "\n".join(textwrap.wrap(title, max(20, int(fig.get_figwidth() * 72 / (0.55 * fontsize))),
                                    break_on_hyphens=False))


# The text under the panels (the caption, the notes): its size in points, a line's height and a
# character's average width (DejaVu Sans), in inches, to wrap it to the figure and keep its room.
UNDER_SIZE = 6
UNDER_LINE = 1.3 * UNDER_SIZE / 72
UNDER_CHAR = 0.55 * UNDER_SIZE / 72


def under_panels(width: float, caption: str = "", notes=(), left_out=()) -> tuple[str, str]:
    """The text under a ``width``-inch figure's panels, wrapped to its width: the caption (what
    was drawn: the runs' setting) and the red lines (how the runs depart from the paper's
    setting; the runs not drawn)."""
    import textwrap

    chars = max(30, int(0.97 * width / UNDER_CHAR))
    red = ([f"NOT the paper's setting: {'; '.join(notes)}"] if notes else []) + \
        ([f"Not drawn: {'; '.join(left_out)}"] if left_out else [])
    return (textwrap.fill(caption, chars) if caption else "", "\n".join(textwrap.fill(line, chars) for line in red))


def under_height(width: float, caption: str = "", notes=(), left_out=()) -> float:
    """The height in inches :func:`under_panels`' text takes (0 without any), so a script can make
    its figure taller by it and the panels keep their size."""
    lines = sum(text.count("\n") + 1 for text in under_panels(width, caption, notes, left_out) if text)
    return lines * UNDER_LINE + 0.06 if lines else 0.0


def save_figure(fig, path, notes=(), *, left_out=(), bottom: float = 0.06, right: float = 1.0, top: float = 1.0,
                dpi: int = DPI, caption: str = "") -> Path:
    """Lay out, save and close a matplotlib figure: ``path`` (a PNG at ``dpi``, 300 as
    ``fedrun-plot``'s) and beside it the same figure as a PDF with TrueType fonts (no Type 3 fonts,
    which IEEE PDF eXpress and ACM's checks reject), ready for a paper.

    ``notes`` (how the runs depart from the paper's setting) are printed in red along the
    bottom, in the figure fraction ``bottom`` kept free for them, and ``left_out`` (the runs of
    the figure that are not drawn, :func:`papers.stopped_notes`: ``FedAvg seed 1: diverged at
    round 5``) above them; ``right`` and ``top`` keep room for a legend placed outside
    the axes.  ``caption`` (the runs' setting, :func:`fedrun.plot.setting`) goes under the panels
    above the red lines, all wrapped to the figure's width, with the room they take
    (:func:`under_height`) kept free instead of ``bottom``.
    """
    if caption:
        width, height = fig.get_size_inches()
        text, red = under_panels(width, caption, notes, left_out)
        low = 0.03 / height
        if red:
            fig.text(0.01, low, red, fontsize=UNDER_SIZE, color="firebrick", va="bottom")
            low += (red.count("\n") + 1) * UNDER_LINE / height
        fig.text(0.01, low, text, fontsize=UNDER_SIZE, va="bottom")
        rect = (0, under_height(width, caption, notes, left_out) / height, right, top)
    else:
        lines = ([f"NOT the paper's setting: {'; '.join(notes)}"] if notes else []) + \
            ([f"Not drawn: {'; '.join(left_out)}"] if left_out else [])
        if lines:
            fig.text(0.01, 0.005, "\n".join(lines), fontsize=6, color="firebrick", va="bottom", wrap=True)
        rect = (0, bottom * len(lines), right, top)
    fig.tight_layout(rect=rect)
    if fit_titles(fig):  # a title rewrapped is taller: lay the panels out again under it
        fig.tight_layout(rect=rect)
    return _save(fig, path, dpi)


def title_clear(ax, renderer=None, upright: bool = True) -> bool:
    """Whether ``ax``'s title lies inside its figure and clear of every other panel (its axes, ticks,
    labels and title); ``upright=False``: across only (the width, before the panels are laid out
    under a taller title)."""
    fig = ax.figure
    renderer = renderer or fig.canvas.get_renderer()
    box = ax.title.get_window_extent(renderer)
    if box.x0 < fig.bbox.x0 - 0.5 or box.x1 > fig.bbox.x1 + 0.5 or (upright and box.y1 > fig.bbox.y1 + 0.5):
        return False
    return not any(other is not ax and other.get_visible() and box.overlaps(other.get_tightbbox(renderer))
                   for other in fig.axes)


def fit_titles(fig) -> bool:
    """Rewrap every title that sticks out of its figure or over another panel (a title centred over
    an axes narrower than the figure: a legend beside it, two panels) to the width of its own axes,
    between words; True when one was."""
    import textwrap

    fig.draw_without_rendering()  # the titles where the layout put them
    renderer = fig.canvas.get_renderer()
    changed = False
    for ax in fig.axes:
        title = ax.title
        if not title.get_text() or title_clear(ax, renderer, upright=False):
            continue
        words = " ".join(title.get_text().split())
        room = ax.get_window_extent(renderer).width  # centred over its axes, it then sticks out nowhere
        chars = max(len(line) for line in title.get_text().split("\n"))
        while chars > 12 and title.get_window_extent(renderer).width > room:
            chars = min(chars - 1, int(chars * room / title.get_window_extent(renderer).width))
            title.set_text("\n".join(textwrap.wrap(words, max(chars, 12), break_on_hyphens=False)))
        changed = True
    return changed


def _save(fig, path, dpi: int) -> Path:
    """The PNG at ``dpi`` and the PDF with TrueType (Type 42) fonts beside it; the figure closed."""
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
