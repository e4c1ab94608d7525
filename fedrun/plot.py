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
test_loss, N_over_E, server_step; the list is below), ``--cols`` to a row.  The figure fits one
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

    fedrun-plot outputs/multirun/2026-11-23 --out outputs/figs
    fedrun-plot outputs/multirun/2026-11-23 --out figs --band ci --metrics test_acc,N_over_E --figsize 7.16,2.2
"""
from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path

from fedrun import results
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
DATASET_NAMES = {"mnist": "MNIST", "fmnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "svhn": "SVHN",
                 "mnist_train10k": "MNIST (10k training images)", "synthetic": "synthetic data"}


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
    """A plot command line: DIRs searched for run directories and ``--out``; its errors are one line
    (:class:`fedrun.errors.ArgumentParser`)."""
    p = ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for run directories")
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
            "mixed": f"mixed, {node.get('iid_clients')} IID clients"}.get(choice, str(choice))
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
    dataset = choices.get("dataset") or node.get("name")
    centralized = choices.get("mode") == "centralized" or config.get("centralized") is True
    k, c = hp.get("num_clients"), hp.get("client_fraction")
    federated = not centralized and k is not None
    return {"dataset": DATASET_NAMES.get(dataset, dataset), "subset": _subset(node),
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
         figsize: tuple[float, float] | None = None, caption: bool = True) -> list[Path]:
    """Draw one panel per ``metrics`` column (:data:`METRICS`) for every group of ``df``
    (:func:`fedrun.results.load`'s table), the mean over each group's seeds with its band
    (:func:`fedrun.results.seed_curves`), ``cols`` panels a row in a ``figsize`` figure
    (:func:`layout`); write the figure as ``runs.<format>`` into ``out`` and, beside it,
    ``runs.csv``: the numbers drawn (group, method, metric, round, mean, band, n).  ``log`` gets
    one line per group drawn, a warning for each panel a group is missing from, and the setting
    (:func:`setting`), which ``caption`` also writes below the panels.  Returns the paths written.

    The figure is a :class:`matplotlib.figure.Figure` of its own, not pyplot's, drawn in an
    ``rc_context``: drawing it changes neither the backend, the current figure nor the rcParams
    of a notebook that calls this."""
    import matplotlib
    from matplotlib.figure import Figure

    metrics = tuple(metrics)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise results.ConfigError("metrics", ",".join(metrics), f"choose from: {', '.join(METRICS)}")
    out = Path(out)
    check_drawable(df, metrics)
    not_drawn = results.without_rows(df)
    curves = results.seed_curves(df, list(metrics), band)
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
            clipped += _draw_panel(ax, column, curves, groups, band, handles)
        _round_axes(axes, len(metrics), cols, bool(groups))
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


def _draw_panel(ax, column: str, curves, groups: list[str], band: str, handles: dict) -> list[tuple]:
    """One panel: each group's mean over seeds (its own colour, line style and open markers, about
    8 a curve, staggered between groups) and its band, clipped to the metric's bounds.  The first
    line of each group goes into ``handles``; returns ``(group, metric, low, high)`` for each band
    that reached past a bound."""
    ylabel, scale, _ = METRICS[column]
    clipped = []
    for i, key in enumerate(groups):
        c = curves[(curves["group"] == key) & (curves["metric"] == column)]
        if c.empty:
            continue
        color = f"C{i % 10}"
        every = max(1, len(c) // 8)
        line, = ax.plot(c["round"], scale * c["mean"], color=color, linestyle=STYLES[i % len(STYLES)],
                        marker=MARKERS[i % len(MARKERS)], markevery=(i % every, every),
                        markeredgewidth=0.6, label=key)
        handles.setdefault(key, line)
        if band != "none" and (c["n"] > 1).any():
            low, high = BOUNDS.get(column, (0.0, None))
            if (c["low"] < low).any() or (high is not None and (c["high"] > high).any()):
                clipped.append((key, column, low, high))
            ax.fill_between(c["round"], scale * c["low"].clip(low, high), scale * c["high"].clip(low, high),
                            color=color, alpha=0.2, linewidth=0)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return clipped


def _round_axes(axes, panels: int, cols: int, any_group: bool) -> None:
    """Hide the unused panels; the lowest panel of each column carries the round axis (integers)."""
    for ax in axes[panels:]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[:panels]):
        if i + cols >= panels:
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel(ROUND)
    if any_group:
        integer_rounds(axes[0])


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
    [--figsize W,H] [--formats png,pdf] [--no-caption]``: the exit code (2 for bad options or
    no runs under the DIRs)."""
    p = parser(PROG, __doc__ + "\n" + _metrics_help())
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
    try:  # bad options, folders without runs, a damaged config.yaml or CSV: one line, nothing written
        args = p.parse_args(argv)
        formats, metrics = _choices("formats", args.formats, FORMATS), _choices("metrics", args.metrics, METRICS)
        writable_folder("--out", Path(args.out))
        df = results.load(*args.dirs)
        if args.metrics != p.get_default("metrics"):  # named by the user: each must be there
            for metric in metrics:
                results.require_column([df], metric, "--metrics")
        written = plot(df, Path(args.out), args.band, formats, metrics=metrics, cols=args.cols,
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


def _choices(option: str, text: str, allowed) -> tuple[str, ...]:
    """A comma-separated option's values, each one of ``allowed``; else one line."""
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values or any(v not in allowed for v in values):
        raise UsageError(f"--{option}={text}: choose from {', '.join(allowed)}")
    return values


if __name__ == "__main__":
    sys.exit(main())
