"""Plot any fedrun runs: accuracy, loss, N/E and the server step, averaged over seeds.

For runs of no paper in particular (the zero-argument ``fedrun``, a sweep of your own).  Every run
directory found below the DIRs is read with :func:`fedrun.results.load`; runs that differ only in
their seed form one group (the table's ``group`` column), drawn as the mean over its seeds with
a band: ``--band std`` (mean ± one standard deviation), ``ci`` (the mean's two-sided 95%
t-interval, mean ± t(0.975, n-1) s / sqrt(n) over n seeds), ``minmax`` (the seeds' range) or
``none``.  A group is labelled by its method's name and the settings that tell it apart: those
that differ among all runs (``partition=iid``) and the method's own that differ among its runs
(``beta=0.5``).  Each group has its own colour, line style and marker (legible in greyscale).

The panels are rounds.csv columns against integer rounds, ``--metrics`` (default: test_acc,
test_loss, N_over_E, server_step; the list is below), ``--cols`` to a row; ``--x bytes`` draws
them against the bytes communicated instead (``bytes_total``, down and up since round 1, in kB,
MB or GB: accuracy per byte sent, where methods that send more than the model, SCAFFOLD, pay for
it).  The figure fits one
column of a two-column paper by default (3.5 in wide, rows of 2.6 in; ``--figsize 7.16,2.6`` a
page's width, ``--figsize 20,4.2`` one wide row for a screen), in 8-pt text with TrueType fonts
(no Type 3 fonts in the PDF), the legend above the panels (a label wider than the figure breaks
between its settings, and a legend of many groups makes a default-sized figure taller, never its
panels smaller) and a caption line below with the runs' setting (dataset, partition, K clients, C
and clients a round, E, B, rounds; "varies" where the runs differ; ``--no-caption`` leaves it out).
Writes ``runs.png`` (300 dpi) and ``runs.pdf`` (``--formats png,pdf,svg``) to ``--out``, with
``runs.csv`` beside them: the numbers drawn (group, method, metric, round, mean, band bounds
low/high, runs n, in rounds.csv's units).  It prints one line per group drawn, a warning for every
group or panel left without values, and the setting.  A run that diverged (NaN or Inf; run.json
says so) is drawn up to the round before, its legend entry saying ``diverged at round t``; a run
with no row to draw (diverged in round 1, stopped before its first round) is named in the caption
and the log.  Bad input is refused before anything is written, in one line, exit 2: an option out
of range, a metric no run has, folders without runs or only runs without rows, a damaged or
foreign config.yaml or rounds.csv, an ``--out`` that is a file or cannot be written.

``--partition RUN`` draws a run's partition from its ``partition.csv``: one stacked bar per client
(its training examples of each class, a colour per class), titled with the dataset, the
partition option and its settings from the run's config.yaml; ``partition.png`` and
``partition.pdf`` in ``--out``.

    fedrun-plot outputs/multirun/2026-11-23 --out outputs/figs
    fedrun-plot outputs/multirun/2026-11-23 --out figs --band ci --metrics test_acc,N_over_E --figsize 7.16,2.2
    fedrun-plot outputs/multirun/2026-11-23 --out figs --x bytes --metrics test_acc
    fedrun-plot --partition outputs/multirun/2026-11-23/0 --out figs
"""
from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path

from fedrun import results
from fedrun.data.names import DATASET_NAMES, dataset_label  # noqa: F401 - DATASET_NAMES: the scripts' import
from fedrun.errors import ArgumentParser, FedrunError, UsageError, print_error
from fedrun.paths import writable_folder

PROG = "fedrun-plot"
ROUNDS = "Communication rounds"
ROUND = "Communication round"
# The rounds.csv columns fedrun-plot draws: column -> (axis label with units, in mathtext; scale; what it is).
METRICS = {
    "test_acc": ("Test accuracy (%)", 100.0, "accuracy of the evaluated model on the test set"),
    "test_loss": ("Test loss (nats)", 1.0, "its mean cross-entropy"),
    "average_test_acc": ("Test accuracy, average (%)", 100.0, "of the average-aggregated model"),
    "sent_test_acc": ("Test accuracy, sent (%)", 100.0, "of the model sent to clients"),
    "val_acc": ("Validation accuracy (%)", 100.0, "on the validation split"),
    "val_loss": ("Validation loss (nats)", 1.0, "on the validation split"),
    "train_loss": ("Training loss (nats)", 1.0, "the clients' mean local training loss"),
    "N": ("$N$", 1.0, "norm of the weighted mean client update (FedNNNN eq. 4)"),
    "E": ("$E$", 1.0, "weighted mean of the client update norms (eq. 5)"),
    "N_over_E": ("$N/E$", 1.0, "client agreement, 1 when all clients agree"),
    "server_step": (r"Server step $\|w_{t+1} - w_t\|$", 1.0, "norm of the server's step"),
    "server_step_sum": (r"Cumulative $\|w_{t+1} - w_t\|$", 1.0, "the server steps' running sum"),
    "pd_ls": ("PD-Ls (cosine distance)", 1.0, "parameter divergence among the learners"),
    "pd_vl": ("PD-VL (cosine distance)", 1.0, "divergence from the vanilla reference"),
    "lr": ("Learning rate $\\eta$", 1.0, "the round's client learning rate"),
    "wall_s": ("Round time (s)", 1.0, "wall-clock seconds of the round"),
    "bytes_total": ("Data sent (MB)", 1e-6, "bytes sent since round 1, down and up"),
}
DEFAULT_METRICS = ("test_acc", "test_loss", "N_over_E", "server_step")
# The range a metric's values can take, in its rounds.csv units: a band (a t-interval of few seeds
# is wide) is drawn within it, not below 0 % or above 100 %.  Unlisted metrics: >= 0.
BOUNDS = {"test_acc": (0.0, 1.0), "average_test_acc": (0.0, 1.0), "sent_test_acc": (0.0, 1.0),
          "val_acc": (0.0, 1.0), "N_over_E": (0.0, 1.0), "pd_ls": (0.0, 2.0), "pd_vl": (0.0, 2.0)}
# For the paper scripts that still name them: the default panels as (column, label, scale).
PANELS = tuple((m, METRICS[m][0], METRICS[m][1]) for m in DEFAULT_METRICS)
BANDS = tuple(results.BANDS)
FORMATS = ("png", "pdf", "svg")
COLUMN_WIDTH, ROW_HEIGHT, MIN_PANEL_WIDTH = 3.5, 2.6, 1.7  # inches
PAGE_WIDTH = 7.16  # inches: a two-column paper's text width (IEEE), the widest a partition figure grows
DPI = 300
FONT_SIZE = 8
# Each group's line style and marker as well as its colour, so overlapping and greyscale curves
# stay apart.
STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# Legible at the figure's printed size, and TrueType (Type 42) fonts: PDF checkers (IEEE PDF
# eXpress, ACM) reject the Type 3 fonts matplotlib embeds by default.
RC = {"font.size": FONT_SIZE, "axes.labelsize": FONT_SIZE, "axes.titlesize": FONT_SIZE,
      "xtick.labelsize": FONT_SIZE - 1, "ytick.labelsize": FONT_SIZE - 1, "legend.fontsize": FONT_SIZE - 1,
      "legend.title_fontsize": FONT_SIZE - 1, "figure.labelsize": FONT_SIZE - 1, "pdf.fonttype": 42,
      "ps.fonttype": 42, "svg.fonttype": "path", "text.usetex": False, "mathtext.fontset": "dejavusans",
      "lines.linewidth": 1.2, "lines.markersize": 3.5, "axes.linewidth": 0.6, "grid.linewidth": 0.4,
      "xtick.major.width": 0.6, "ytick.major.width": 0.6, "xtick.major.size": 2.5, "ytick.major.size": 2.5,
      "legend.handlelength": 2.6, "legend.columnspacing": 1.2}
# The x axis of fedrun-plot's panels (--x): rounds, or the bytes communicated (rounds.csv's bytes_total).
X_AXES = ("round", "bytes")
BYTES = "bytes_total"
# Decimal units of the bytes axis, the largest the data reaches first (1 MB = 10^6 bytes).
BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("bytes", 1.0))


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


def plain(doc: str) -> str:
    """A docstring as ``--help`` shows it: reST's markup taken out (````x```` is ``x``,
    ``:func:`fedrun.results.load``` is ``fedrun.results.load``, ``:func:`~a.b``` is ``b``)."""
    import re

    doc = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: m.group(1).rpartition(".")[2] if m.group(0).split("`")[1]
                 .startswith("~") else m.group(1), doc)
    return re.sub(r"``([^`]+)``", r"\1", doc)


def parser(prog: str | None, doc: str, out_required: bool = True, dirs_required: bool = True
           ) -> argparse.ArgumentParser:
    """A plot command line: DIRs searched for run directories (``dirs_required=False``: none is
    allowed, the program checks) and ``--out``; its errors are one line
    (:class:`fedrun.errors.ArgumentParser`)."""
    p = ArgumentParser(prog=prog, description=plain(doc), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+" if dirs_required else "*", metavar="DIR",
                   help="folders searched recursively for run directories")
    p.add_argument("--out", required=out_required,
                   help="folder for the figures" + ("" if out_required else " (required unless --summary)"))
    return p


# ----------------------------------------------------------------------------- the runs' setting

def _clients_per_round(k, c):
    """m = max(round(C K), 1), as fedrun.seeding.clients_per_round (without importing torch)."""
    return max(math.floor(c * k + 0.5), 1)


def _partition(config: dict) -> str | None:
    choice = (config.get("choices") or {}).get("partition")
    node = config.get("partition") or {}
    if choice is None:
        return None
    text = {"iid": "IID", "shards": f"shards, {node.get('shards_per_client')} per client",
            "classes": f"{node.get('classes_per_client')} classes per client",
            "dirichlet": f"Dirichlet α={node.get('alpha')}",
            "dirichlet_labels": f"Dirichlet labels α={node.get('alpha')}",
            "mixed": f"mixed, {node.get('iid_clients')} IID clients",
            "natural": "natural clients"}.get(choice, str(choice))
    return text + (", power-law sizes" if node.get("sizes") == "powerlaw" else "")


def _subset(node: dict) -> str | None:
    """The part of the dataset a run used, where it did not use all of it: ``dataset.max_train``,
    ``max_test`` (random subsets), ``per_class`` (the first n images of each class)."""
    parts = []
    if isinstance(node.get("per_class"), int):
        parts.append(f"the first {node['per_class']:,} training images of each class")
    if isinstance(node.get("max_train"), int):
        parts.append(f"{node['max_train']:,} random training images")
    if isinstance(node.get("max_test"), int):
        parts.append(f"{node['max_test']:,} random test images")
    return "; ".join(parts) or None


def _facts(config: dict) -> dict:
    choices, hp = config.get("choices") or {}, config.get("hyperparams") or {}
    node = config.get("dataset") or {}
    centralized = choices.get("mode") == "centralized" or config.get("centralized") is True
    k, c = hp.get("num_clients"), hp.get("client_fraction")
    federated = not centralized and k is not None
    return {"dataset": dataset_label(config), "subset": _subset(node),
            "mode": "centralized" if centralized else None,
            "partition": _partition(config) if not centralized else None,
            "K": k if federated else None, "C": c if federated else None,
            "m": _clients_per_round(k, c) if federated and c is not None else None,
            "E": hp.get("local_epochs"), "B": hp.get("batch_size"), "rounds": hp.get("rounds")}


def setting(run_dirs) -> str:
    """One line with the runs' setting, from their ``config.yaml``: dataset, partition, K clients,
    C (and m clients a round), E local epochs, B batch size, rounds; a fact the runs differ in is
    said to vary, one none of them records is left out.  ``""`` when nothing is known."""
    facts = [_facts(results.read_config(run)) for run in dict.fromkeys(run_dirs)]
    if not facts:
        return ""

    def one(key):
        values = {repr(f[key]) for f in facts}
        if len(values) > 1:
            return "varies"
        return facts[0][key]

    def fmt(value):
        return f"{value:g}" if isinstance(value, float) else str(value)

    parts = []
    for key in ("dataset", "mode", "partition"):
        value = one(key)
        if value == "varies":
            parts.append(f"{key} varies")
        elif value is not None:
            parts.append(str(value))
    subset = one("subset")  # beside the dataset's name: "Fashion-MNIST (1,000 random training images)"
    if subset is not None:
        said = "data subset varies" if subset == "varies" else f"({subset})"
        parts[0:1] = [f"{parts[0]} {said}"] if parts and one("dataset") is not None else [said, *parts]
    k, c, m = one("K"), one("C"), one("m")
    if k is not None:
        clients = "K varies" if k == "varies" else f"K={fmt(k)} clients"
        if c == "varies":
            clients += ", C varies"
        elif c is not None:
            clients += f", C={fmt(c)}" + (f" ({m} a round)" if m not in (None, "varies") else "")
        parts.append(clients)
    for key in ("E", "B"):
        value = one(key)
        if value is not None:
            parts.append(f"{key} varies" if value == "varies" else f"{key}={fmt(value)}")
    rounds = one("rounds")
    if rounds is not None:
        parts.append("rounds vary" if rounds == "varies" else f"{fmt(rounds)} rounds")
    return ", ".join(parts)


# ----------------------------------------------------------------------------- fedrun-plot

def layout(panels: int, cols: int | None = None, figsize: tuple[float, float] | None = None
           ) -> tuple[int, int, tuple[float, float]]:
    """(rows, cols, (width, height) in inches) for ``panels`` panels: by default one column of a
    paper (3.5 in) with panels at least 1.7 in wide (two a row), rows of 2.6 in."""
    width = figsize[0] if figsize else COLUMN_WIDTH
    if cols is None:
        cols = max(1, min(panels, int(width // MIN_PANEL_WIDTH)))
    cols = max(1, min(cols, panels))
    rows = math.ceil(panels / cols)
    return rows, cols, tuple(figsize) if figsize else (COLUMN_WIDTH, ROW_HEIGHT * rows)


# A legend of this many text lines (its title included) fits above the panels of a default-sized
# figure; each line more makes the figure taller by a line, so the panels keep their size.
LEGEND_ROOM_LINES = 3
LINE_HEIGHT = 1.3 * (FONT_SIZE - 1) / 72  # inches: one legend line, with matplotlib's spacing


def legend_layout(labels: list[str], width: float, title: str | None = None) -> tuple[list[str], int, int]:
    """(labels wrapped at ", " to fit ``width`` inches, columns, text lines) for the legend above
    the panels: as many columns as the longest label allows, rows as full as each other; a label
    longer than the figure is wide (runs of unrelated presets, whose labels name every setting
    that differs) is broken into lines between its settings rather than running off the page.
    The text lines count each row at its tallest entry, plus one for ``title``."""
    # Points a character of the legend's font takes, on average, and the handle's width in characters.
    char, handle = 0.55 * (FONT_SIZE - 1), 4
    fits = max(10, int(width * 72 * 0.95 / char) - handle)  # characters a line of one column
    wrapped = [textwrap.fill(label, width=fits, break_on_hyphens=False, subsequent_indent="  ")
               if len(label) > fits else label for label in labels]
    longest = max((len(line) for label in wrapped for line in label.split("\n")), default=1)
    ncols = max(1, min(len(labels), int(width * 72 * 0.95 // ((longest + handle) * char))))
    ncols = math.ceil(len(labels) / math.ceil(len(labels) / ncols)) if labels else 1
    rows = [wrapped[i:i + ncols] for i in range(0, len(wrapped), ncols)]
    lines = sum(max(label.count("\n") + 1 for label in row) for row in rows) + (1 if title else 0)
    return wrapped, ncols, lines


def plot(df, out: str | Path, band: str = "std", formats: tuple[str, ...] = ("png", "pdf"),
         log=print, metrics: tuple[str, ...] = DEFAULT_METRICS, cols: int | None = None,
         figsize: tuple[float, float] | None = None, caption: bool = True, x: str = "round") -> list[Path]:
    """Draw one panel per ``metrics`` column (:data:`METRICS`) for every group of ``df``
    (:func:`fedrun.results.load`'s table), the mean over each group's seeds with its band
    (:func:`fedrun.results.seed_curves`), ``cols`` panels a row in a ``figsize`` figure
    (:func:`layout`); write the figure as ``runs.<format>`` into ``out`` and, beside it,
    ``runs.csv``: the numbers drawn (group, method, metric, round, mean, band, n).  ``log`` gets
    one line per group drawn, a warning for each panel a group is missing from, and the setting
    (:func:`setting`), which ``caption`` also writes below the panels.  Returns the paths written.

    ``x="bytes"`` draws the panels against the bytes communicated (:func:`bytes_axis`) rather
    than the round: each point at its group's mean ``bytes_total`` of that round (the seeds'
    totals differ only with drop-outs), which ``runs.csv`` then has as a column ``bytes_total``.

    The figure is a :class:`matplotlib.figure.Figure` of its own, not pyplot's, drawn in an
    ``rc_context``: drawing it changes neither the backend, the current figure nor the rcParams
    of a notebook that calls this."""
    import matplotlib
    from matplotlib.figure import Figure

    metrics = tuple(metrics)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise results.ConfigError("metrics", ",".join(metrics), f"choose from: {', '.join(METRICS)}")
    if x not in X_AXES:
        raise results.ConfigError("x", x, f"choose one of: {', '.join(X_AXES)}")
    out = Path(out)
    check_drawable(df, metrics)
    not_drawn = results.without_rows(df)
    curves = results.seed_curves(df, list(metrics), band)
    xlabel, xscale = (ROUND, 1.0) if x == "round" else bytes_axis(df)
    if x == "bytes":  # each group's mean bytes_total at each round, beside the values drawn there
        sent = results.seed_curves(df, [BYTES], "none")[["group", "round", "mean"]].rename(columns={"mean": BYTES})
        curves = curves.merge(sent, on=["group", "round"], how="left")
    groups = list(dict.fromkeys(curves["group"]))
    runs = df.groupby("group")["run_dir"].nunique()
    text = setting(df["run_dir"].unique()) if "run_dir" in df else ""
    stops = diverged_groups(df)
    rows, cols, size = layout(len(metrics), cols, figsize)
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=size, layout="constrained")
        axes = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
        handles, clipped = {}, []
        for ax, column in zip(axes, metrics):
            clipped += _draw_panel(ax, column, curves, groups, band, handles, "round" if x == "round" else BYTES,
                                   xscale)
        _round_axes(axes, len(metrics), cols, bool(groups) and x == "round", xlabel)
        _legend(fig, handles, groups, runs, stops, band, size, figsize)
        below = ([text] if text else []) + \
            (["not drawn: " + "; ".join(f"{Path(run).name}: {why}" for run, why in not_drawn)] if not_drawn else [])
        if caption and below:
            width = int(size[0] * 72 / (0.5 * (FONT_SIZE - 1)))
            fig.supxlabel("\n".join(textwrap.fill(line, width=width) for line in below), fontsize=FONT_SIZE - 1)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"runs.{fmt}" for fmt in formats]
        for path in paths:
            fig.savefig(path, dpi=DPI)
    data = out / "runs.csv"
    curves.to_csv(data, index=False)
    _report(log, df, curves, groups, runs, stops, metrics, clipped, band, not_drawn, text)
    return [*paths, data]


def _draw_panel(ax, column: str, curves, groups: list[str], band: str, handles: dict, x: str = "round",
                xscale: float = 1.0) -> list[tuple]:
    """One panel: each group's mean over seeds (its own colour, line style and open markers, about
    8 a curve, staggered between groups) and its band, clipped to the metric's bounds, against
    ``curves``' column ``x`` (``round``, or ``bytes_total`` times ``xscale``).  The first line of
    each group goes into ``handles``; returns ``(group, metric, low, high)`` for each band that
    reached past a bound."""
    ylabel, scale, _ = METRICS[column]
    clipped = []
    for i, key in enumerate(groups):
        c = curves[(curves["group"] == key) & (curves["metric"] == column)]
        if c.empty:
            continue
        color = f"C{i % 10}"
        every = max(1, len(c) // 8)
        xs = xscale * c[x]
        line, = ax.plot(xs, scale * c["mean"], color=color, linestyle=STYLES[i % len(STYLES)],
                        marker=MARKERS[i % len(MARKERS)], markevery=(i % every, every),
                        markeredgewidth=0.6, label=key)
        handles.setdefault(key, line)
        if band != "none" and (c["n"] > 1).any():
            low, high = BOUNDS.get(column, (0.0, None))
            if (c["low"] < low).any() or (high is not None and (c["high"] > high).any()):
                clipped.append((key, column, low, high))
            ax.fill_between(xs, scale * c["low"].clip(low, high), scale * c["high"].clip(low, high),
                            color=color, alpha=0.2, linewidth=0)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return clipped


def _round_axes(axes, panels: int, cols: int, rounds: bool, xlabel: str = ROUND) -> None:
    """Hide the unused panels; the lowest panel of each column carries the x axis, labelled
    ``xlabel`` (with ``rounds``: integer round ticks)."""
    for ax in axes[panels:]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[:panels]):
        if i + cols >= panels:
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel(xlabel)
    if rounds:
        integer_rounds(axes[0])


def bytes_axis(df) -> tuple[str, float]:
    """``(axis label, scale)`` of the bytes axis: ``bytes_total`` in the largest decimal unit the
    runs reach (:data:`BYTE_UNITS`: ``Data sent (MB)`` and 1e-6 once a run passes
    1 MB), so the ticks read 0.5, 1, 1.5 rather than 500000.  Every run must have the column: one
    of a fedrun before it (no ``bytes_total`` values) is one line naming it, before anything is
    written (:class:`fedrun.errors.UsageError`)."""
    import pandas as pd

    has = df.groupby("run_dir")[BYTES].apply(lambda v: v.notna().any()) if BYTES in df else pd.Series(dtype=bool)
    lacking = [run for run in dict.fromkeys(df["run_dir"]) if not has.get(run, False)]
    if lacking:
        others = f" (and {len(lacking) - 1} more of the {df['run_dir'].nunique()} runs)" if len(lacking) > 1 else ""
        raise UsageError(f"--x=bytes: {lacking[0]}{others}: rounds.csv has no {BYTES} column (written by a fedrun "
                         "before the communication columns); draw it with --x round, or run it again")
    most = float(df[BYTES].max())
    unit, factor = next(((u, f) for u, f in BYTE_UNITS if most >= f), BYTE_UNITS[-1])
    return f"Data sent ({unit})", 1.0 / factor


def _legend(fig, handles: dict, groups: list[str], runs, stops: dict, band: str, size, figsize) -> None:
    """The legend above the panels: a group's label says how many seeds its mean is over when the
    groups differ in it (else the title does) and how a diverged run stopped; a tall legend makes
    the figure taller rather than squeeze the panels."""
    seeds = {int(runs[g]) for g in groups}
    if len(seeds) == 1:
        labels = groups
        n = seeds.pop()
        title = f"{results.BANDS[band].capitalize()} (n = {n})" if n > 1 else None
    else:
        labels = [mean_label(key, int(runs[key])) for key in groups]
        title = results.BANDS[band].capitalize()
    labels = [label + (f" ({stops[key]})" if key in stops else "") for key, label in zip(groups, labels)]
    if not handles:
        return
    shown = [(handles[k], label) for k, label in zip(groups, labels) if k in handles]
    wrapped, ncols, lines = legend_layout([label for _, label in shown], size[0], title)
    fig.legend([h for h, _ in shown], wrapped, loc="outside upper center", ncols=ncols, frameon=False, title=title)
    if figsize is None and lines > LEGEND_ROOM_LINES:
        fig.set_size_inches(size[0], size[1] + (lines - LEGEND_ROOM_LINES) * LINE_HEIGHT)


def _report(log, df, curves, groups: list[str], runs, stops: dict, metrics, clipped: list, band: str,
            not_drawn: list, text: str) -> None:
    """What was drawn, one line a group (its runs, seeds, rounds, panels), and what was not: a
    group or panel without values, a clipped band, a seed run twice, a run without rows; then the
    setting."""
    for key in groups + sorted(set(df["group"]) - set(groups)):
        seeds_of = sorted(df.loc[df["group"] == key, "seed"].unique()) if "seed" in df else []
        mine = curves[curves["group"] == key]
        drawn = [column for column in metrics if column in set(mine["metric"])]
        what = f"{runs[key]} run{'s' if runs[key] != 1 else ''}" + (f" (seeds {', '.join(map(str, seeds_of))})"
                                                                     if len(seeds_of) > 1 else "")
        what += f", {stops[key]}" if key in stops else ""
        if not drawn:
            log(f"warning: {key}: {what}, no values of {', '.join(metrics)}; not drawn")
            continue
        log(f"{key}: {what}, rounds {mine['round'].min()}-{mine['round'].max()}, "
            f"{len(drawn)} of {len(metrics)} panels")
        for column in metrics:
            if column not in drawn:
                log(f"warning: {key}: no values of {column}; left out of its panel")
    for key, column, low, high in clipped:
        log(f"note: {key}: the band of {column} ({results.BANDS[band]}) reaches past [{low:g}, "
            f"{'inf' if high is None else f'{high:g}'}]; drawn clipped to it")
    for key, seed, dirs in repeated_seeds(df):
        log(f"warning: {key}: seed {seed} in {len(dirs)} runs ({', '.join(dirs)}): the same config run again, "
            "counted as separate seeds in the mean and band")
    for run, why in not_drawn:
        log(f"warning: {run}: {why}; not drawn")
    if text:
        log(f"setting: {text}")


def repeated_seeds(df) -> list[tuple[str, object, list[str]]]:
    """``(group, seed, run folders)`` for each seed more than one run of a group has: the same
    config and seed run twice (into two folders), which the mean and the band count twice."""
    if "seed" not in df or "run_dir" not in df:
        return []
    runs = df.drop_duplicates("run_dir")
    found = []
    for (key, seed), rows in runs.groupby(["group", "seed"], sort=True):
        if len(rows) > 1:
            found.append((key, seed, [Path(r).name for r in rows["run_dir"]]))
    return found


def check_drawable(df, metrics: tuple[str, ...]) -> None:
    """One line, before anything is written, for a figure that would be empty: no run has a row
    (each says why, :func:`fedrun.results.require_rows`), or none has a value of any of
    ``metrics`` (the columns that have values are named)."""
    results.require_rows(df)
    if not any(m in df and df[m].notna().any() for m in metrics):
        results.require_column([df], ",".join(metrics), "--metrics")


def diverged_groups(df) -> dict[str, str]:
    """For each group with a run that diverged (run.json, :func:`fedrun.results.stop_note`): what
    its legend entry adds, ``diverged at round t`` (one run) or ``seed s diverged at round t``
    (one of several), so a curve that ends early says why."""
    out = {}
    for key, rows in df.groupby("group", sort=False):
        runs = rows.drop_duplicates("run_dir")
        notes = [(seed, results.stop_note(run)) for run, seed in
                 zip(runs["run_dir"], runs["seed"] if "seed" in runs else [None] * len(runs))]
        notes = [(seed, note) for seed, note in notes if note]
        if notes:
            out[key] = "; ".join(note if len(runs) == 1 or seed is None else f"seed {seed} {note}"
                                 for seed, note in notes)
    return out


def _figsize(text: str) -> tuple[float, float]:
    try:
        w, h = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give W,H in inches, such as 3.5,2.6") from None
    if not (0 < w <= 100 and 0 < h <= 100):
        raise argparse.ArgumentTypeError(f"{text!r}: W and H must be in (0, 100] inches")
    return w, h


def _cols(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of panels >= 1")
    return value


def _metrics_help() -> str:
    width = max(map(len, METRICS))
    plain = {"$": "", "\\|": "||", "\\eta": "eta"}
    lines = []
    for m, (label, _, what) in METRICS.items():
        for tex, text in plain.items():
            label = label.replace(tex, text)
        lines.append(f"  {m:<{width}}  {label}: {what}")
    return "panels (--metrics), rounds.csv columns:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``fedrun-plot DIR... --out OUT [--band std|minmax|ci|none] [--metrics a,b] [--cols n]
    [--figsize W,H] [--formats png,pdf] [--no-caption] [--x round|bytes] [--partition RUN]``: the
    exit code (2 for bad options or no runs under the DIRs)."""
    p = parser(PROG, __doc__ + "\n" + _metrics_help(), dirs_required=False)
    p.add_argument("--band", choices=BANDS, default="std",
                   help="the band around each group's mean over seeds (ci: its 95%% t-interval)")
    p.add_argument("--metrics", default=",".join(DEFAULT_METRICS),
                   help="comma-separated rounds.csv columns, one panel each (default: %(default)s; list below)")
    p.add_argument("--cols", type=_cols, help="panels a row (default: as many as fit, 1.7 in or wider)")
    p.add_argument("--figsize", type=_figsize, metavar="W,H",
                   help=f"the figure's size in inches (default: {COLUMN_WIDTH} wide, {ROW_HEIGHT} a row)")
    p.add_argument("--caption", action=argparse.BooleanOptionalAction, default=True,
                   help="a line below the panels with the runs' setting (default: on)")
    p.add_argument("--formats", default="png,pdf", help="comma-separated: " + ", ".join(FORMATS))
    p.add_argument("--x", choices=X_AXES, default="round",
                   help="the panels' x axis: round, or bytes (rounds.csv's bytes_total, the bytes sent down and "
                        "up since round 1, in kB, MB or GB; runs of a fedrun before that column are refused)")
    p.add_argument("--partition", metavar="RUN",
                   help="also (or, without DIRs, only) draw the run directory RUN's partition.csv: a stacked bar "
                        f"of each client's examples per class, the first {MAX_CLIENTS_DRAWN} clients, into "
                        "partition.png and partition.pdf")
    try:  # bad options, folders without runs, a damaged config.yaml or CSV: one line, nothing written
        args = p.parse_args(argv)
        if not args.dirs and args.partition is None:
            raise UsageError("give DIRs (folders of runs to draw), --partition RUN (a run's partition), or both; "
                             "--help lists the options")
        formats, metrics = _choices("formats", args.formats, FORMATS), _choices("metrics", args.metrics, METRICS)
        writable_folder("--out", Path(args.out))
        written = []
        if args.partition is not None:
            table = read_partition(args.partition)  # checked before any figure is written
        if args.dirs:
            df = results.load(*args.dirs)
            if args.metrics != p.get_default("metrics"):  # named by the user: each must be there
                for metric in metrics:
                    results.require_column([df], metric, "--metrics")
            if args.x == "bytes":
                bytes_axis(df)  # every run must have the column: one line before anything is drawn
            written += plot(df, Path(args.out), args.band, formats, metrics=metrics, cols=args.cols,
                            figsize=args.figsize, caption=args.caption, x=args.x)
        if args.partition is not None:
            written += plot_partition(args.partition, Path(args.out), formats, table=table,
                                      figsize=args.figsize, caption=args.caption)
    except FedrunError as e:
        print_error(PROG, e)
        return 2
    except OSError as e:  # --out cannot be written after all (a full disk)
        print_error(PROG, f"{e.filename or 'the figures'}: {e.strerror or e}")
        return 2
    for path in written:
        print(path)
    return 0


# ----------------------------------------------------------------------------- fedrun-plot --partition

# The partition figure draws this many clients at most (the first, by id); the caption says how
# many more there are.  Beyond it bars are thinner than a line at a page's width.
MAX_CLIENTS_DRAWN = 100
# Classes up to this many get a legend entry each (tab10/tab20's distinct colours); more (FEMNIST's
# 62) get a colour bar over a continuous map, which a legend of that many entries would not beat.
MAX_LEGEND_CLASSES = 20
# The settings of each partition option that tell its partitions apart (conf/partition/*.yaml);
# an option not listed shows its scalar settings.
PARTITION_SETTINGS = {
    "iid": ("sizes", "samples_per_client"),
    "shards": ("shards_per_client", "shard_size"),
    "classes": ("classes_per_client", "assign", "sizes", "samples_per_client"),
    "dirichlet": ("alpha", "sizes", "samples_per_client"),
    "dirichlet_labels": ("alpha", "min_size", "balance"),
    "mixed": ("iid_clients", "classes_per_client", "sizes", "samples_per_client"),
    "natural": ("min_examples", "order"),
}


def read_partition(run: str | Path):
    """A run directory's ``partition.csv`` (``client``, ``examples``, ``class_0`` ... ``class_{C-1}``),
    sorted by client, with the run's config.yaml as ``attrs["config"]`` (the title's facts): both
    read before any figure is drawn.  One line for a path that is no folder or holds no
    partition.csv (:class:`fedrun.errors.UsageError`), and for a partition.csv or config.yaml
    that is missing, damaged or not fedrun's (:class:`fedrun.errors.RunDirectoryError`)."""
    path = Path(run) / "partition.csv"
    if not Path(run).is_dir():
        raise UsageError(f"--partition={run}: not a folder; give a run directory (it holds partition.csv)")
    if not path.is_file():
        raise UsageError(f"--partition={run}: no partition.csv in it; give a run directory, which holds one "
                         "from its start")
    df = results._csv(path)
    classes = [c for c in df.columns if str(c).startswith("class_")]
    if not classes or df.empty:
        raise results.RunDirectoryError(f"{path}: no class_0 ... columns or no client rows; not a partition.csv "
                                        "fedrun wrote")
    for column in classes:
        results._numbers(df[column], path)
    df = df.sort_values("client", kind="stable").reset_index(drop=True)
    df.attrs["config"] = results.read_config(run)
    return df


def partition_title(config: dict, clients: int) -> str:
    """The partition figure's title from a run's config.yaml: the dataset, ``partition=<option>``
    with its settings that matter (:data:`PARTITION_SETTINGS`; a power-law exponent only with
    power-law sizes; nulls left out), and the number of clients K, such as
    ``synthetic data, partition=dirichlet (alpha=0.5), K=10 clients``."""
    facts = _facts(config)
    choice = (config.get("choices") or {}).get("partition")
    node = config.get("partition") or {}
    parts = [str(facts["dataset"])] if facts["dataset"] else []
    if choice is not None:
        keys = PARTITION_SETTINGS.get(choice) or [k for k, v in node.items() if not k.startswith("_")
                                                  and not isinstance(v, (dict, list))]
        shown = {k: node[k] for k in keys if node.get(k) is not None}
        if shown.get("sizes") == "balanced":  # the default of every option: said only when it is not
            del shown["sizes"]
        elif shown.get("sizes") == "powerlaw" and node.get("power_law_exponent") is not None:
            shown["power_law_exponent"] = node["power_law_exponent"]
        inner = node.get("partitioner")  # partition=flwr: the flwr-datasets partitioner and its settings
        if isinstance(inner, dict) and inner.get("_target_"):
            shown = {"partitioner": str(inner["_target_"]).rsplit(".", 1)[-1],
                     **{k: v for k, v in inner.items() if not k.startswith("_") and not isinstance(v, (dict, list))}}
        settings = ", ".join(f"{k}={_setting(v)}" for k, v in shown.items())
        parts.append(f"partition={choice}" + (f" ({settings})" if settings else ""))
    parts.append(f"K={clients} client{'s' if clients != 1 else ''}")
    return ", ".join(parts)


def _setting(value) -> str:
    """A setting's value as an override writes it: ``0.5``, ``false``, ``largest``."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def tick_step(bars: int, digits: int, inches: float) -> int:
    """Label every ``step``-th of ``bars`` bars, ``step`` the smallest of 1, 2, 5, 10, 20, 50 ...
    whose labels (``digits`` characters of the 7-pt tick font each, a space between) fit the
    axis' ``inches``: every client's id when they fit, never ids printed over each other."""
    label = (digits + 1) * 0.6 * (FONT_SIZE - 1) / 72  # inches a label and its gap take
    steps = (n * 10 ** e for e in range(len(str(max(bars, 1))) + 1) for n in (1, 2, 5))
    return next((step for step in steps if bars / step * label <= inches), max(bars, 1))


def class_colors(count: int) -> list:
    """A colour per class: matplotlib's tab10 (up to 10 classes) or tab20 (up to 20), whose colours
    stay apart side by side; beyond, evenly spaced along viridis."""
    import matplotlib

    if count <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(count)]
    if count <= MAX_LEGEND_CLASSES:
        return [matplotlib.colormaps["tab20"](i) for i in range(count)]
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(i / (count - 1)) for i in range(count)]


def plot_partition(run: str | Path, out: str | Path, formats: tuple[str, ...] = ("png", "pdf"), log=print,
                   table=None, most: int = MAX_CLIENTS_DRAWN, figsize: tuple[float, float] | None = None,
                   caption: bool = True) -> list[Path]:
    """Draw the run directory ``run``'s partition (:func:`read_partition`) as a stacked bar chart:
    one bar per client (by id; the first ``most`` of them, the caption saying how many were left
    out), its training examples of each class stacked in the class's colour (:func:`class_colors`),
    a legend of the classes beside the bars.  Beyond :data:`MAX_LEGEND_CLASSES` classes (FEMNIST's
    62), where neighbouring colours cannot be told apart, a heat map instead (:func:`_class_heat_map`):
    a client a column, a class a row, its examples as the cell's colour, blank where it has none,
    under a bar of each client's size.  Titled with :func:`partition_title`; written as ``partition.<format>`` into ``out`` (300-dpi
    PNG, PDF with TrueType fonts, as :func:`plot`'s).  The width grows with the clients drawn,
    from one column (3.5 in, up to about 20 clients) to a page (7.16 in, from about 75), unless
    ``figsize`` is given.  ``table``: :func:`read_partition`'s, when the caller read it already.
    ``log`` gets the title and the caption.  Returns the paths written."""
    import matplotlib
    import numpy as np
    from matplotlib.figure import Figure

    df = read_partition(run) if table is None else table
    classes = [c for c in df.columns if str(c).startswith("class_")]
    counts = df[classes].to_numpy(dtype=float)
    ids = df["client"].to_numpy()
    total, drawn = len(df), min(len(df), most)
    title = partition_title(df.attrs.get("config") or results.read_config(run), total)
    below = [f"{total} clients, {int(counts.sum()):,} training examples, {len(classes)} classes; each bar a client's "
             "examples of each class"]
    if drawn < total:
        below.append(f"clients {ids[0]}-{ids[drawn - 1]} drawn, the first {drawn} by id; {total - drawn} more "
                     f"(clients {ids[drawn]}-{ids[-1]}) left out")
    if len(classes) > MAX_LEGEND_CLASSES:
        below[0] = (f"{total} clients, {int(counts.sum()):,} training examples, {len(classes)} classes; each column "
                    "a client: its size above, its examples of each class below (blank: none)")
    colors = class_colors(len(classes))
    legend_cols = 1 if len(classes) <= 10 else 2
    width = min(PAGE_WIDTH, max(COLUMN_WIDTH, 1.6 + 0.35 * legend_cols + 0.07 * drawn))
    size = tuple(figsize) if figsize else (width, ROW_HEIGHT + 0.4)
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=size, layout="constrained")
        if len(classes) > MAX_LEGEND_CLASSES:
            _class_heat_map(fig, counts[:drawn], ids[:drawn], title, size)
            return _save_partition(fig, out, formats, title, below, size, caption, log)
        ax = fig.subplots()
        x = np.arange(drawn)
        bottom = np.zeros(drawn)
        bars = []
        for c, name in enumerate(classes):
            height = counts[:drawn, c]
            bars.append(ax.bar(x, height, bottom=bottom, width=0.85 if drawn <= 40 else 1.0, color=colors[c],
                               linewidth=0, label=name.removeprefix("class_")))
            bottom += height
        ax.set_xlim(-0.6, drawn - 0.4)
        ax.set_ylim(0, 1.04 * max(bottom.max(), 1))  # the tallest bar below the frame, not on it
        ax.set_xlabel("Client")
        ax.set_ylabel("Training examples")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        step = tick_step(drawn, len(str(max(ids[:drawn], key=lambda k: len(str(k))))), size[0] - 1.2)
        ax.set_xticks(x[::step], [str(k) for k in ids[:drawn:step]])
        # Over the bars alone (the legend beside them keeps the figure's top right): wrapped to the
        # characters of the title's font the bars' width holds.
        chars = int((size[0] - 0.6 - 0.45 * legend_cols) * 72 / (0.55 * FONT_SIZE))
        ax.set_title(textwrap.fill(title, width=max(chars, 20)), fontsize=FONT_SIZE)
        # right of the bars, never over them
        fig.legend([b[0] for b in bars[::-1]], [b.get_label() for b in bars[::-1]], loc="outside right upper",
                   ncols=legend_cols, frameon=False, title="Class", handlelength=1.2, columnspacing=0.8)
        return _save_partition(fig, out, formats, title, below, size, caption, log)


def _class_heat_map(fig, counts, ids, title: str, size: tuple[float, float]) -> None:
    """The partition of many classes (:func:`plot_partition`): on top, each client's training
    examples as a bar; below, a heat map of ``counts`` (clients x classes), a client a column and a
    class a row, the cell's colour its examples of that class on a log scale (class sizes differ
    by orders of magnitude between writers), white where it has none; a colour bar beside."""
    import matplotlib
    import numpy as np
    from matplotlib.colors import LogNorm

    drawn, classes = counts.shape
    fig.set_size_inches(size[0], max(size[1], 1.2 + 0.035 * classes))
    top, ax = fig.subplots(2, 1, sharex=True, height_ratios=[1, 3])
    x = np.arange(drawn)
    top.bar(x, counts.sum(1), width=0.85 if drawn <= 40 else 1.0, color="0.35", linewidth=0)
    top.set_ylabel("Examples")
    top.grid(axis="y", alpha=0.3)
    top.set_axisbelow(True)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    shown = np.ma.masked_equal(counts.T, 0)  # no examples of a class: a blank cell, not the darkest colour
    image = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap, origin="lower",
                      norm=LogNorm(vmin=1, vmax=max(counts.max(), 2)), extent=(-0.5, drawn - 0.5, -0.5, classes - 0.5))
    ax.set_ylabel("Class")
    ax.set_yticks(range(0, classes, 10))  # the classes' own numbers, every tenth
    ax.set_xlabel("Client")
    step = tick_step(drawn, len(str(max(ids, key=lambda k: len(str(k))))), size[0] - 1.2)
    ax.set_xticks(x[::step], [str(k) for k in ids[::step]])
    bar = fig.colorbar(image, ax=[top, ax], pad=0.01, aspect=30)
    bar.set_label("Examples of the class")
    chars = int((size[0] - 1.0) * 72 / (0.55 * FONT_SIZE))
    top.set_title(textwrap.fill(title, width=max(chars, 20)), fontsize=FONT_SIZE)


def _save_partition(fig, out, formats, title: str, below: list[str], size, caption: bool, log) -> list[Path]:
    """The partition figure's caption (``below``), its files ``partition.<format>`` in ``out`` and
    its log lines; the paths written."""
    if caption:
        wrap = int(size[0] * 72 / (0.5 * (FONT_SIZE - 1)))
        fig.supxlabel("\n".join(textwrap.fill(line, width=wrap) for line in below), fontsize=FONT_SIZE - 1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"partition.{fmt}" for fmt in formats]
    for path in paths:
        fig.savefig(path, dpi=DPI)
    log(f"partition: {title}")
    for line in below:
        log(f"  {line}")
    return paths


def _choices(option: str, text: str, allowed) -> tuple[str, ...]:
    """A comma-separated option's values, each one of ``allowed``; else one line."""
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values or any(v not in allowed for v in values):
        raise UsageError(f"--{option}={text}: choose from {', '.join(allowed)}")
    return values


if __name__ == "__main__":
    sys.exit(main())
