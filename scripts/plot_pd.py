#!/usr/bin/env python
"""Plot the parameter-divergence paper's figures from fedrun run directories.

Every run directory found below the DIRs is one curve (seeds of one configuration and setting are
averaged round by round).  As in the paper's figures, IID runs are dotted and non-IID(2) runs solid
(non-IID(1) dashed, vanilla dash-dotted), with one colour per configuration; a configuration is
labelled by what differs between the runs (network, optimizer, variant, dataset), read from each
run's ``config.yaml`` as ``pd_tables.py collect`` does (runs of other presets are labelled by
their folder).  Writes to ``--out``:

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

Runs that depart from the paper's setting (smoke scale, substituted data) say so under each plot.
Example: ``python scripts/plot_pd.py outputs/pd/cifar10/iid outputs/pd/cifar10/noniid2 --out
outputs/pd_figs --layers C11,C21,C31,F1,F2,F3``.
"""
from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import pd_tables
import plots
from matplotlib.lines import Line2D
from papers import (mean_by_round, one_line_errors, require_runs, round_number, stop_reason, stopped_notes, unreadable,
                    with_rounds)

from fedrun.errors import UsageError
from fedrun.paths import writable_folder
from fedrun.plot import ROUNDS, integer_rounds, parser as plot_parser, pyplot
from fedrun.results import Run, folders, load_runs

plt = pyplot()

STYLES = {"iid": ":", "noniid2": "-", "noniid1": "--", "vanilla_bs50": "-.", "vanilla_bs500": "-.", None: "-"}
STYLE_NAMES = {**pd_tables.SETTING_LABELS, None: "other"}
SETTING_ORDER = ("vanilla_bs50", "vanilla_bs500", "iid", "noniid2", "noniid1", None)
FIELDS = ("dataset", "network", "optimizer", "variant")


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

    def rounds(self):
        return mean_by_round([r.rounds() for r in self.runs])

    def layer(self, name: str):
        """``layers.csv``'s rows of layer ``name``, averaged over the seeds; None without any."""
        frames = []
        for r in self.runs:
            df = r.csv("layers.csv")
            if df is not None and "layer" in df:
                sel = df[df["layer"].astype(str) == name]
                if len(sel):
                    frames.append(sel.drop(columns=[c for c in ("layer", "type") if c in sel]))
        return mean_by_round(frames)


def _key_label(key: tuple, fields: list[str]) -> str:
    """A configuration's label: the ``fields`` of its run key (those that differ between the runs)."""
    dataset, network, optimizer, variant, _setting = key
    shown = [("WD " + v[3:]) if v.startswith("wd=") else pd_tables.VARIANT_LABELS.get(v, v)
             for v in variant.split("+") if v]
    parts = {"dataset": pd_tables.DATASET_LABELS.get(dataset, dataset), "network": network,
             "optimizer": pd_tables.OPTIMIZER_LABELS.get(optimizer, optimizer),
             "variant": "+ " + " + ".join(shown) if shown else "baseline"}
    return " ".join(parts[f] for f in FIELDS if f in fields)


def curves(runs: list[Run]) -> list[Curve]:
    """Group runs into curves: one per (configuration, setting), labelled by what differs."""
    keys = {r.path: pd_tables.identify(r)[0] for r in runs}
    known = [k for k in keys.values() if k is not None]
    differing = [f for i, f in enumerate(FIELDS) if len({k[i] for k in known}) > 1] \
        or ["network", "optimizer", "variant"]
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        key = keys[r.path]
        groups[(r.path.name, None) if key is None else (_key_label(key, differing), key[4])].append(r)
    out = [Curve(label, setting, rs) for (label, setting), rs in groups.items()]
    labels = list(dict.fromkeys(c.label for c in out))
    out.sort(key=lambda c: (labels.index(c.label), SETTING_ORDER.index(c.setting)
                            if c.setting in SETTING_ORDER else len(SETTING_ORDER)))
    return out


def _colors(cs: list[Curve]) -> dict[str, str]:
    labels = list(dict.fromkeys(c.label for c in cs))
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def _legend(fig, cs: list[Curve], colors: dict) -> None:
    """Colours (configurations) and line styles (settings) of the curves drawn."""
    drawn = dict.fromkeys(c.label for c in cs)
    handles = [Line2D([], [], color=colors[lab], lw=2, label=lab) for lab in drawn]
    settings = [s for s in SETTING_ORDER if any(c.setting == s for c in cs)]
    if len(settings) > 1 or settings != [None]:
        handles += [Line2D([], [], color="black", ls=STYLES[s], label=STYLE_NAMES[s]) for s in settings]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 5), fontsize=7,
               bbox_to_anchor=(0.5, 1.0), frameon=False)


def _notes_of(run: Run) -> list[str]:
    """How a run departs from the paper's setting of its table row; a run of no row: its scale only."""
    key = pd_tables.identify(run)[0]
    if key is not None:
        return pd_tables.run_notes(run, key)
    return ["smoke scale (scale=smoke)"] if (run.config.get("choices") or {}).get("scale") == "smoke" else []


def _save(fig, cs: list[Curve], colors: dict, notes: list[str], path: Path, left_out=()) -> Path:
    """The legend above the panels (with room for its rows), then save (with the runs not drawn)."""
    _legend(fig, cs, colors)
    rows = math.ceil((len(colors) + len({c.setting for c in cs})) / 5)
    top = 1 - 0.05 * rows * (6 / max(fig.get_figheight(), 1))
    return plots.save_figure(fig, path, notes, left_out=left_out, bottom=0.05, top=top)


def _panel(ax, ylabel: str, fontsize: int | None = None) -> None:
    ax.set_xlabel(ROUNDS, fontsize=fontsize)
    ax.set_ylabel(ylabel, fontsize=fontsize)
    ax.grid(alpha=0.3)
    integer_rounds(ax)


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
                notes: list[str], left_out=()) -> Path | None:
    """One panel per layer of ``column`` (pd_ls or pd_vl) vs round; None if no run has it."""
    colors = _colors(cs)
    panels = []
    for name in layers:
        data = [(c, c.layer(name)) for c in cs]
        if any(df is not None and column in df and df[column].notna().any() for _c, df in data):
            panels.append((name, data))
    if not panels:
        return None
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.8), squeeze=False)
    drawn = set()
    for ax, (name, data) in zip(axes.flat, panels):
        for c, df in data:
            if plots.curve(ax, df, column, ls=c.style, color=colors[c.label], lw=1.3):
                drawn.add(id(c))
        ax.set_title(layer_label(name), fontsize=10)
        ax.tick_params(labelsize=7)
        _panel(ax, title, 8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    return _save(fig, [c for c in cs if id(c) in drawn], colors, notes, path, left_out)


def plot_rounds(cs: list[Curve], panels: list[tuple[str, str, float]], path: Path, notes: list[str],
                left_out=()) -> Path | None:
    """Panels of ``rounds.csv`` columns ``(column, y label, scale)`` vs round; None if none has data."""
    colors = _colors(cs)
    frames = [(c, c.rounds()) for c in cs]
    have = [(col, ylabel, scale) for col, ylabel, scale in panels
            if any(df is not None and col in df and df[col].notna().any() for _c, df in frames)]
    if not have:
        return None
    fig, axes = plt.subplots(1, len(have), figsize=(5.2 * len(have), 4.0), squeeze=False)
    drawn = set()
    for ax, (col, ylabel, scale) in zip(axes.flat, have):
        for c, df in frames:
            if plots.curve(ax, df, col, scale, ls=c.style, color=colors[c.label], lw=1.3):
                drawn.add(id(c))
        _panel(ax, ylabel)
    return _save(fig, [c for c in cs if id(c) in drawn], colors, notes, path, left_out)


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
    fig, ax = plt.subplots(figsize=(0.45 * grid.shape[1] + 2.6, 0.35 * grid.shape[0] + 1.8))
    im = ax.imshow(grid.to_numpy(), cmap="gray", aspect="auto", interpolation="nearest")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], fontsize=7)
    ax.set_yticks(range(grid.shape[0]), [str(k) for k in grid.index], fontsize=7)
    ax.set_xlabel("class (output neuron)")
    ax.set_ylabel("learner")
    ax.set_title(f"{title}\noutput-layer neuron magnitude after round {round_}", fontsize=8)
    fig.colorbar(im, ax=ax, label=r"$\|d_q\|$ (weight row norm)")
    return plots.save_figure(fig, path, notes, bottom=0.05)


def _run_title(run: Run) -> tuple[str, str]:
    """A title and a file stem for one run."""
    key = pd_tables.identify(run)[0]
    if key is None:
        return run.path.name, run.path.name
    seed = run.config.get("seed", 0)
    title = f"{_key_label(key, list(FIELDS))}, {STYLE_NAMES.get(key[4], key[4])}, seed {seed}"
    return title, f"{key[0]}_{key[4]}_{pd_tables.run_name(key, seed)}"


def plot_all(runs: list[Run], out: Path, layers: list[str] | None = None, neuron_round: int = 1,
             left_out=()) -> list[Path]:
    """Every figure for ``runs``; returns the PNGs written.  ``left_out``: the runs that diverged,
    named below the curves' figures.  ``layers`` that no run has are refused before anything is
    written."""
    cs = curves(runs)
    have = default_layers(cs, types=None)
    unknown = [name for name in layers or [] if name not in have]
    if unknown:
        raise UsageError(f"--layers={','.join(layers)}: no run has layer {', '.join(unknown)}; the runs' layers.csv "
                         f"names: {', '.join(have) or 'none'}")
    out.mkdir(parents=True, exist_ok=True)
    notes = sorted({n for c in cs for r in c.runs for n in _notes_of(r)})
    chosen = layers or default_layers(cs)
    written = [
        plot_layers(cs, chosen, "pd_ls", "PD-Ls", out / "pd_ls_layers.png", notes, left_out),
        plot_layers(cs, chosen, "pd_vl", "PD-VL", out / "pd_vl_layers.png", notes, left_out),
        plot_rounds(cs, [("pd_ls", "PD-Ls (whole model)", 1.0), ("pd_vl", "PD-VL (whole model)", 1.0)],
                    out / "pd_model.png", notes, left_out),
        plot_rounds(cs, [("train_loss", "Training loss (mean of the learners)", 1.0)], out / "train_loss.png", notes,
                    left_out),
        plot_rounds(cs, [("test_acc", "Test accuracy (%)", 100.0)], out / "test_accuracy.png", notes, left_out),
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
    unreadable(skipped, "plot_pd")
    layers = [x.strip() for x in args.layers.split(",") if x.strip()] if args.layers else None
    left_out = stopped_notes(skipped, lambda r: None, lambda r: r.path.name).get(None, [])
    for path in plot_all(runs, Path(args.out), layers, args.neuron_round, left_out):
        print(path)
    return 0

if __name__ == "__main__":
    sys.exit(main())
