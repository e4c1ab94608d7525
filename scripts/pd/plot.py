#!/usr/bin/env python
"""Plot the parameter-divergence paper's figures from fedrun run directories.

The runs found below the DIRs are drawn as curves, one per configuration and setting: the mean
over its seeds round by round, their range (min to max) shaded where there are several.  As in
the paper's figures, IID runs are dotted and non-IID(2) runs solid (non-IID(1) dashed, vanilla
dash-dotted); each configuration has its own colour and open marker, so the curves stay apart in
greyscale.  A configuration is labelled by what differs between the runs (network, optimizer,
variant, dataset), read from each run's ``config.yaml`` as ``pd/tables.py collect`` does (runs of
other presets are labelled by their folder); what the runs share is in the title, with the
dataset they read (``Fashion-MNIST in place of CIFAR-10`` for a substitute), and their setting
(partition, learners, E, B, rounds) in the caption under the panels.  Every figure is a 300-dpi
PNG with the same figure as a PDF (TrueType fonts) beside it, in fedrun-plot's 8-pt style at a
paper's page or column width.  Writes to ``--out``:

``pd_ls_layers.png``
    PD-Ls (Definition 1: mean pairwise cosine distance between the learners' local models w_k) per
    layer vs round, one panel per layer (``layers.csv`` column ``pd_ls``; panels named C$_{11}$ ..
    F$_3$ as in the paper; ``--layers F3,C11`` picks them, default every conv and fc layer):
    Figures 2, 3 and 7-30.
``pd_vl_layers.png``
    PD-VL (mean cosine distance of the local models from the vanilla-updated model) per layer, where the
    runs recorded it (``pd_vl``).
``pd_model.png``
    PD-Ls and PD-VL of the whole model (``rounds.csv``).
``train_loss.png``
    the mean local training loss of the learners vs round (``train_loss``): Figure 5.
``test_accuracy.png``
    test accuracy (%) vs round.
``neurons_<run>.png``
    per run with ``output_layer.csv``: the magnitude of the output-layer neurons (the norm of the
    last Linear layer's weight row of each class) of every learner after round ``--neuron-round``
    (default 1), learners x classes, brighter = larger: Figure 1.

Runs that depart from the paper's setting (smoke scale, substituted data) say so under each plot,
and runs that diverged are named there as not drawn.  The PNGs written are printed, one a line;
what each curve holds (runs, seeds, rounds) and what a figure leaves out go to stderr.
Example: ``python scripts/pd/plot.py outputs/pd/cifar10/iid outputs/pd/cifar10/noniid2 --out
outputs/pd_figs --layers C11,C21,C31,F1,F2,F3``.
"""
from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from pathlib import Path

if not __package__:  # python scripts/pd/plot.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import matplotlib
from matplotlib.lines import Line2D

from scripts.common import plots
from scripts.common.papers import (UNFINISHED, dataset_title, mean_by_round, one_line_errors, read_dataset,
                                   require_runs, round_number, stop_reason, stopped_notes, unreadable, with_rounds)
from scripts.pd import tables as pd_tables

from fedrun.errors import UsageError
from fedrun.paths import writable_folder
from fedrun.plot import (COLUMN_WIDTH, DATASET_NAMES, LINE_HEIGHT, MARKERS, RC, ROUNDS, integer_rounds, legend_layout,
                         parser as plot_parser, pyplot, setting as run_setting)
from fedrun.results import Run, folders, load_runs

plt = pyplot()

STYLES = {"iid": ":", "noniid2": "-", "noniid1": "--", "vanilla_bs50": "-.", "vanilla_bs500": "-.", None: "-"}
STYLE_NAMES = {**pd_tables.SETTING_LABELS, None: "other"}
SETTING_ORDER = ("vanilla_bs50", "vanilla_bs500", "iid", "noniid2", "noniid1", None)
FIELDS = ("dataset", "network", "optimizer", "variant")
# A paper's page width (two columns) for a grid of layer panels, one column's for one panel; the
# height of a panel.  The title, legend and caption add their own height, so the panels keep theirs.
PAGE_WIDTH, LAYER_HEIGHT, PANEL_HEIGHT = 7.16, 1.8, 2.4
LAYER_COLUMNS = 3
TITLE_SIZE = 9  # points: one size above the 8-pt text, as a figure's heading
MARKS_A_CURVE = 8  # open markers along a long curve (every point on one of a handful of rounds)


def layer_label(name: str) -> str:
    """``C11`` -> ``C$_{11}$``, ``F3`` -> ``F$_{3}$``, ``BN21`` -> ``BN$_{21}$``; other names as they are."""
    m = re.fullmatch(r"([A-Za-z]+)(\d+)", str(name))
    return f"{m.group(1)}$_{{{m.group(2)}}}$" if m else str(name)


class Curve:
    """The runs of one configuration under one setting (seeds), with their label and style."""

    def __init__(self, label: str, setting: str | None, runs: list[Run]):
        self.label, self.setting, self.runs = label, setting, runs

    @property
    def style(self) -> str:
        return STYLES.get(self.setting, "-")

    @property
    def name(self) -> str:
        """The configuration and its setting, as the report and the notes name the curve."""
        return f"{self.label}, {STYLE_NAMES.get(self.setting, self.setting)}"

    def frames(self) -> list:
        """Each seed's ``rounds.csv``."""
        return [r.rounds() for r in self.runs]

    def rounds(self):
        return mean_by_round(self.frames())

    def layer_frames(self, name: str) -> list:
        """Each seed's ``layers.csv`` rows of layer ``name`` (the seeds without any left out)."""
        frames = []
        for r in self.runs:
            df = r.csv("layers.csv")
            if df is not None and "layer" in df:
                sel = df[df["layer"].astype(str) == name]
                if len(sel):
                    frames.append(sel.drop(columns=[c for c in ("layer", "type") if c in sel]))
        return frames

    def layer(self, name: str):
        """``layers.csv``'s rows of layer ``name``, averaged over the seeds; None without any."""
        return mean_by_round(self.layer_frames(name))


def _key_label(key: tuple, fields: list[str]) -> str:
    """A configuration's label: the ``fields`` of its run key (those that differ between the runs)."""
    return " ".join(part for f, part in _key_parts(key).items() if f in fields)


def _key_parts(key: tuple) -> dict[str, str]:
    """A run key's dataset, network, optimizer and variant as the figures name them."""
    dataset, network, optimizer, variant, _setting = key
    shown = [("WD " + v[3:]) if v.startswith("wd=") else pd_tables.VARIANT_LABELS.get(v, v)
             for v in variant.split("+") if v]
    return {"dataset": pd_tables.DATASET_LABELS.get(dataset, dataset), "network": network,
            "optimizer": pd_tables.OPTIMIZER_LABELS.get(optimizer, optimizer),
            "variant": "+ " + " + ".join(shown) if shown else "baseline"}


def _differing(runs: list[Run]) -> list[str]:
    """The :data:`FIELDS` the runs' keys differ in (those that label a curve)."""
    known = [k for k in (pd_tables.identify(r)[0] for r in runs) if k is not None]
    return [f for i, f in enumerate(FIELDS) if len({k[i] for k in known}) > 1] or ["network", "optimizer", "variant"]


def curves(runs: list[Run]) -> list[Curve]:
    """Group runs into curves: one per (configuration, setting), labelled by what differs."""
    keys = {r.path: pd_tables.identify(r)[0] for r in runs}
    differing = _differing(runs)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        key = keys[r.path]
        groups[(r.path.name, None) if key is None else (_key_label(key, differing), key[4])].append(r)
    out = [Curve(label, setting, rs) for (label, setting), rs in groups.items()]
    labels = list(dict.fromkeys(c.label for c in out))
    out.sort(key=lambda c: (labels.index(c.label), SETTING_ORDER.index(c.setting)
                            if c.setting in SETTING_ORDER else len(SETTING_ORDER)))
    return out


def looks(cs: list[Curve]) -> dict[str, dict]:
    """Each configuration's colour and open marker, in the order the curves list them (the setting
    gives the line style, :data:`STYLES`)."""
    labels = list(dict.fromkeys(c.label for c in cs))
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {lab: {"color": cmap(i % cmap.N), "marker": MARKERS[i % len(MARKERS)]} for i, lab in enumerate(labels)}


def _draw(ax, c: Curve, frames: list, column: str, scale: float, look: dict, i: int) -> bool:
    """Curve ``c``: the mean over its seeds' ``frames`` with their range shaded
    (:func:`plots.seed_curve`), in its configuration's colour and open marker (about
    :data:`MARKS_A_CURVE` along it, staggered between curves so that coinciding curves show each
    other's) and its setting's line style.  False when no round has a value."""
    points = max((len(f) for f in frames if f is not None), default=0)
    every = max(1, points // MARKS_A_CURVE)
    return plots.seed_curve(ax, frames, column, scale, color=look["color"], ls=c.style, lw=1.1, marker=look["marker"],
                            markersize=3.5, markerfacecolor="none", markeredgewidth=0.7, markevery=(i % every, every))


def _legend_entries(cs: list[Curve], looks_: dict) -> tuple[list, list[str], str | None]:
    """(handles, labels, title) of the legend of the curves drawn: a configuration's colour and
    marker (how many seeds its curves average, where they do), then each setting's line style;
    the title says what the line and the shading are when a curve averages several seeds."""
    handles, labels = [], []
    for label in dict.fromkeys(c.label for c in cs):
        seeds = sorted({len(c.runs) for c in cs if c.label == label})
        n = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        handles.append(Line2D([], [], color=looks_[label]["color"], marker=looks_[label]["marker"], lw=1.1,
                              markerfacecolor="none", markersize=3.5, markeredgewidth=0.7))
        labels.append(label + (f" (mean of {n})" if seeds[-1] > 1 else ""))
    settings = [s for s in SETTING_ORDER if any(c.setting == s for c in cs)]
    if len(settings) > 1 or settings != [None]:
        for s in settings:
            handles.append(Line2D([], [], color="black", ls=STYLES[s], lw=1.1))
            labels.append(STYLE_NAMES[s])
    several = any(len(c.runs) > 1 for c in cs)
    return handles, labels, plots.BAND_NOTE if several else None


def _notes_of(run: Run) -> list[str]:
    """How a run departs from the paper's setting of its table row; a run of no row: its scale only."""
    key = pd_tables.identify(run)[0]
    if key is not None:
        return pd_tables.run_notes(run, key)
    return ["smoke scale (scale=smoke)"] if (run.config.get("choices") or {}).get("scale") == "smoke" else []


def data_title(runs: list[Run]) -> str:
    """The data the runs read, for a title: each dataset of the paper they stand for (their
    ``tags.dataset``) as :func:`papers.dataset_title` names it (``Fashion-MNIST in place of
    CIFAR-10`` for a substitute), and the runs of no preset by the dataset they read."""
    by_tag: dict = defaultdict(list)
    for r in runs:
        by_tag[r.dataset].append(r)
    parts = []
    for tag in sorted(by_tag, key=lambda t: (t is None, str(t))):
        if tag is not None:
            parts.append(dataset_title(by_tag[tag], tag, pd_tables.DATASET_LABELS))
        else:
            read = sorted({d for d in map(read_dataset, by_tag[tag]) if d})
            parts.append(" / ".join(DATASET_NAMES.get(d, d) for d in read) or "dataset not recorded")
    return "; ".join(parts)


def _shared(runs: list[Run]) -> str:
    """What every curve shares that no label says (``NetA-Baseline`` when only optimizers
    differ), for the title; the dataset is said apart (:func:`data_title`)."""
    keys = [pd_tables.identify(r)[0] for r in runs]
    if not keys or any(k is None for k in keys):
        return ""
    differing = _differing(runs)
    parts = _key_parts(keys[0])
    return " ".join(parts[f] for f in FIELDS[1:] if f not in differing and parts[f] != "baseline")


class Figure:
    """What the curve figures share: the title (what is drawn, the data read, what the runs
    share), the runs' setting as a caption, the notes on how they depart from the paper's
    setting, the runs that diverged, and the report (stderr) of what each figure left out."""

    def __init__(self, cs: list[Curve], notes: list[str], left_out=(), report=None):
        runs = [r for c in cs for r in c.runs]
        self.cs, self.notes, self.left_out = cs, notes, list(left_out)
        self.looks = looks(cs)
        self.data = data_title(runs)
        self.shared = _shared(runs)
        self.caption = run_setting([r.path for r in runs])
        self.report = report or (lambda line: print(f"plot_pd: {line}", file=sys.stderr))

    def title(self, what: str) -> str:
        return ", ".join(part for part in (what, self.data, self.shared) if part)

    def draw(self, path: Path, what: str, panels: list, columns: int, panel_size: tuple[float, float]) -> Path | None:
        """A grid of ``panels`` ``[(panel title or None, y label, column, scale, frames of each
        curve)]``, ``columns`` a row, each ``panel_size`` inches; the title, the legend of the
        curves drawn and the caption above and below (the figure grows by them), then saved as
        PNG and PDF.  A curve with no value in any panel is left out and named in the figure's
        "Not drawn" line and the report; None, with a report line, when no curve has a value."""
        panels = [p for p in panels if any(_has(frames, p[2]) for frames in p[4])]
        if not panels:
            self.report(f"{path.name}: not drawn: no run recorded {what}")
            return None
        columns = min(columns, len(panels))
        rows = math.ceil(len(panels) / columns)
        with matplotlib.rc_context(RC):
            fig, axes = plt.subplots(rows, columns, figsize=(panel_size[0] * columns, panel_size[1] * rows),
                                     squeeze=False)
            drawn: set[int] = set()
            for k, (ax, (name, ylabel, column, scale, frames_of)) in enumerate(zip(axes.flat, panels)):
                for i, (c, frames) in enumerate(zip(self.cs, frames_of)):
                    if _draw(ax, c, frames, column, scale, self.looks[c.label], i):
                        drawn.add(i)
                if name:
                    ax.set_title(name)
                if k % columns == 0 or name is None:  # a grid of one quantity: its label once a row
                    ax.set_ylabel(ylabel)
                if k + columns >= len(panels):  # the lowest panel of its column
                    ax.set_xlabel(ROUNDS)
                ax.grid(alpha=0.3)
                integer_rounds(ax)
            for ax in list(axes.flat)[len(panels):]:
                ax.axis("off")
            shown = [c for i, c in enumerate(self.cs) if i in drawn]
            missing = [f"{c.name}: no {what}" for i, c in enumerate(self.cs) if i not in drawn]
            for line in missing:
                self.report(f"{path.name}: left out {line}")
            top = self._head(fig, self.title(what), shown, self.left_out + missing)
            return plots.save_figure(fig, path, self.notes, left_out=self.left_out + missing, top=top,
                                     caption=self.caption)

    def _head(self, fig, title: str, shown: list[Curve], left_out: list[str]) -> float:
        """The title and, under it, the legend, above the panels; the figure made taller by them
        and by the caption (:func:`plots.under_height`), so the panels keep their size.  Returns
        the figure fraction the panels end at."""
        width, height = fig.get_size_inches()
        handles, labels, legend_title = _legend_entries(shown, self.looks)
        wrapped, ncols, lines = legend_layout(labels, width, legend_title)
        heading = plots.fitted(title, fig, TITLE_SIZE)
        title_h = (heading.count("\n") + 1) * 1.3 * TITLE_SIZE / 72 + 0.08
        legend_h = lines * LINE_HEIGHT + 0.08
        under = plots.under_height(width, self.caption, self.notes, left_out)
        total = height + title_h + legend_h + under
        fig.set_size_inches(width, total)
        # Placed by hand with the legend under it; tight_layout would keep its room a second time.
        fig.suptitle(heading, fontsize=TITLE_SIZE, y=1 - 0.04 / total, va="top").set_in_layout(False)
        fig.legend(handles, wrapped, loc="upper center", bbox_to_anchor=(0.5, 1 - title_h / total), ncols=ncols,
                   frameon=False, title=legend_title)
        return 1 - (title_h + legend_h) / total


def _has(frames: list, column: str) -> bool:
    return any(f is not None and column in f and f[column].notna().any() for f in frames)


def default_layers(cs: list[Curve], types: tuple[str, ...] | None = ("conv", "fc")) -> list[str]:
    """Every conv and fc layer (``types``; None: every layer) of the runs' ``layers.csv``, in the
    order the first run lists them."""
    names: dict[str, None] = {}
    for r in (r for c in cs for r in c.runs):
        df = r.csv("layers.csv")
        if df is not None and "layer" in df:
            sel = df[df["type"].isin(types)] if "type" in df and types else df
            names.update(dict.fromkeys(sel["layer"].astype(str)))
    return list(names)


def plot_layers(cs: list[Curve], layers: list[str], column: str, title: str, path: Path,
                notes: list[str], left_out=(), figure: Figure | None = None) -> Path | None:
    """One panel per layer of ``column`` (pd_ls or pd_vl) vs round, :data:`LAYER_COLUMNS` a row
    across a page; None if no run has it."""
    figure = figure or Figure(cs, notes, left_out)
    panels = [(layer_label(name), title, column, 1.0, [c.layer_frames(name) for c in cs]) for name in layers]
    return figure.draw(path, f"{title} per layer", panels, LAYER_COLUMNS, (PAGE_WIDTH / LAYER_COLUMNS, LAYER_HEIGHT))


def plot_rounds(cs: list[Curve], panels: list[tuple[str, str, float]], path: Path, notes: list[str],
                left_out=(), what: str = "", figure: Figure | None = None) -> Path | None:
    """Panels of ``rounds.csv`` columns ``(column, y label, scale)`` vs round, a column's width
    each; None if none has data."""
    figure = figure or Figure(cs, notes, left_out)
    frames = [c.frames() for c in cs]
    drawn = [p for p in panels if any(_has(f, p[0]) for f in frames)]
    if len(drawn) > 1:  # side by side across a page
        return figure.draw(path, what or " and ".join(p[1] for p in drawn),
                           [(None, label, column, scale, frames) for column, label, scale in drawn], len(drawn),
                           (PAGE_WIDTH / len(drawn), PANEL_HEIGHT))
    column, label, scale = (drawn or panels)[0]
    return figure.draw(path, what or label, [(None, label, column, scale, frames)], 1, (COLUMN_WIDTH, PANEL_HEIGHT))


def plot_neurons(run: Run, title: str, round_: int, path: Path, notes: list[str]) -> Path | None:
    """Figure 1: learners x classes heatmap of the output-layer neuron magnitudes after ``round_``."""
    df = run.csv("output_layer.csv")
    if df is None or not {"round", "client", "class", "weight_norm"} <= set(df.columns):
        return None
    sel = df[df["round"] == round_]
    if sel.empty:
        return None
    grid = sel.pivot_table(index="client", columns="class", values="weight_norm", aggfunc="mean",
                          dropna=False).sort_index()  # a learner or class without values: a blank, not a gap
    caption = run_setting([run.path])
    with matplotlib.rc_context(RC):
        width = max(COLUMN_WIDTH, 0.3 * grid.shape[1] + 1.6)
        fig, ax = plt.subplots(figsize=(width, 0.25 * grid.shape[0] + 1.0))
        im = ax.imshow(grid.to_numpy(), cmap="gray", aspect="auto", interpolation="nearest")
        ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [str(k) for k in grid.index])
        ax.set_xlabel("Class (output neuron)")
        ax.set_ylabel("Learner")
        fig.colorbar(im, ax=ax, label=r"$\|d_q\|$ (weight row norm)")
        heading = plots.fitted(f"{title}: output-layer neuron magnitude after round {round_} (Fig. 1 style)", fig,
                               TITLE_SIZE)
        title_h = (heading.count("\n") + 1) * 1.3 * TITLE_SIZE / 72 + 0.08
        height = fig.get_figheight()
        total = height + title_h + plots.under_height(width, caption, notes)
        fig.set_size_inches(width, total)
        fig.suptitle(heading, fontsize=TITLE_SIZE, y=1 - 0.04 / total, va="top").set_in_layout(False)
        return plots.save_figure(fig, path, notes, top=1 - title_h / total, caption=caption)


def _run_title(run: Run) -> tuple[str, str]:
    """A title and a file stem for one run: the data it read, its configuration and setting, its seed."""
    key = pd_tables.identify(run)[0]
    if key is None:
        return f"{run.path.name} ({data_title([run])})", run.path.name
    seed = run.config.get("seed", 0)
    parts = _key_parts(key)
    config = " ".join(parts[f] for f in FIELDS[1:] if parts[f] != "baseline")  # no variant: the network alone
    title = f"{data_title([run])}, {config}, {STYLE_NAMES.get(key[4], key[4])}, seed {seed}"
    return title, f"{key[0]}_{key[4]}_{pd_tables.run_name(key, seed)}"


def report_curves(cs: list[Curve], report) -> None:
    """One line a curve: its runs, their seeds and rounds, so the figure's every line is accounted for."""
    for c in cs:
        seeds = sorted({str(r.seed) for r in c.runs})
        rounds = [f["round"] for f in c.frames() if f is not None and "round" in f and len(f)]
        span = f", rounds {int(min(r.min() for r in rounds))}-{int(max(r.max() for r in rounds))}" if rounds else ""
        report(f"{c.name}: {len(c.runs)} run{'s' if len(c.runs) != 1 else ''} (seed{'s' if len(seeds) != 1 else ''} "
               f"{', '.join(seeds)}){span}")


def plot_all(runs: list[Run], out: Path, layers: list[str] | None = None, neuron_round: int = 1,
             left_out=(), report=None) -> list[Path]:
    """Every figure for ``runs``; returns the PNGs written.  ``left_out``: the runs that diverged,
    named below the curves' figures.  ``layers`` that no run has are refused before anything is
    written.  ``report`` (default: stderr, ``plot_pd: ...``) gets a line per curve drawn and per
    curve a figure leaves out, and the runs' setting."""
    cs = curves(runs)
    have = default_layers(cs, types=None)
    unknown = [name for name in layers or [] if name not in have]
    if unknown:
        raise UsageError(f"--layers={','.join(layers)}: no run has layer {', '.join(unknown)}; the runs' layers.csv "
                         f"names: {', '.join(have) or 'none'}")
    out.mkdir(parents=True, exist_ok=True)
    notes = sorted({n for c in cs for r in c.runs for n in _notes_of(r)})
    figure = Figure(cs, notes, left_out, report)
    report_curves(cs, figure.report)
    if figure.caption:
        figure.report(f"setting: {figure.caption}")
    chosen = layers or default_layers(cs)
    written = [
        plot_layers(cs, chosen, "pd_ls", "PD-Ls", out / "pd_ls_layers.png", notes, left_out, figure),
        plot_layers(cs, chosen, "pd_vl", "PD-VL", out / "pd_vl_layers.png", notes, left_out, figure),
        plot_rounds(cs, [("pd_ls", "PD-Ls (whole model)", 1.0), ("pd_vl", "PD-VL (whole model)", 1.0)],
                    out / "pd_model.png", notes, left_out, "PD-Ls and PD-VL of the whole model", figure),
        plot_rounds(cs, [("train_loss", "Training loss (nats)", 1.0)], out / "train_loss.png", notes,
                    left_out, "Training loss, mean of the learners (Fig. 5 style)", figure),
        plot_rounds(cs, [("test_acc", "Test accuracy (%)", 100.0)], out / "test_accuracy.png", notes, left_out,
                    "Test accuracy", figure),
    ]
    stems: dict[str, int] = defaultdict(int)
    for r in (r for c in cs for r in c.runs):
        title, stem = _run_title(r)
        stems[stem] += 1
        stem += f"_{stems[stem]}" if stems[stem] > 1 else ""
        key = pd_tables.identify(r)[0]
        written.append(plot_neurons(r, title, neuron_round, out / f"neurons_{stem}.png",
                                    pd_tables.run_notes(r, key) if key is not None else []))
    return [p for p in written if p is not None]


def parser():
    p = plot_parser("plot_pd.py", __doc__)
    p.add_argument("--layers", default=None, metavar="NAME[,NAME...]",
                   help="the layer panels, as named in layers.csv, e.g. F3,C11 (default: every conv and fc layer)")
    p.add_argument("--neuron-round", type=round_number, default=1,
                   help="the round of the output-layer neuron heatmaps (Figure 1: the first round; default 1)")
    p.add_argument("--settings", default=None, metavar="S[,S...]",
                   help="only runs of these settings, e.g. iid,noniid2 (default: all)")
    return p


def _not_plotted(run: Run, settings: list[str] | None) -> str:
    """Why a run is not plotted ('' if it is): it did not finish (diverged: named below the
    figures), or it is not of the chosen settings."""
    if not run.finished:
        return stop_reason(run)
    key = pd_tables.identify(run)[0]
    return "another setting" if settings and (key is None or key[4] not in settings) else ""


def _settings(text: str | None) -> list[str] | None:
    """``--settings``: comma-separated names of the study's settings (iid, noniid2 ...), checked."""
    if not text:
        return None
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in pd_tables.SETTING_LABELS]
    if unknown or not chosen:
        raise UsageError(f"--settings={text}: choose from {', '.join(pd_tables.SETTING_LABELS)}")
    return chosen


@one_line_errors("plot_pd")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = _settings(args.settings)
    folders(args.dirs)
    writable_folder("--out", Path(args.out))
    runs, skipped = load_runs(args.dirs, lambda r: _not_plotted(r, settings), require=("config.yaml",))
    runs = with_rounds(runs, skipped)
    require_runs(runs, skipped, "finished runs to draw" + (f" of settings {args.settings}" if settings else ""),
                 args.dirs)
    rest = unreadable(skipped, "plot_pd")
    # The other runs passed over, counted, so that no run is left out of the figures unsaid.
    other = [p for p, why in rest if why == "another setting"]
    if other:
        print(f"plot_pd: {len(other)} run(s) of other settings not drawn (--settings {args.settings})", file=sys.stderr)
    unfinished = [p for p, why in rest if why == UNFINISHED]
    if unfinished:
        print(f"plot_pd: {len(unfinished)} run(s) {UNFINISHED}; not drawn: "
              f"{', '.join(str(p) for p in unfinished[:5])}{' ...' if len(unfinished) > 5 else ''}", file=sys.stderr)
    layers = [x.strip() for x in args.layers.split(",") if x.strip()] if args.layers else None
    left_out = stopped_notes(skipped, lambda r: None, lambda r: r.path.name).get(None, [])
    for path in plot_all(runs, Path(args.out), layers, args.neuron_round, left_out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
