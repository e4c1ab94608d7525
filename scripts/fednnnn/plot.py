#!/usr/bin/env python
"""Plot the FedNNNN paper's curves (Nagura, Bian, Sato) from fedrun run directories.

For each chosen (dataset, condition), with the methods FedAvg, FedProx, Norm-Norm, Momentum and
FedNNNN overlaid (several seeds of one method are averaged round by round), it writes to ``--out``:

``<dataset>_<condition>_accuracy.png``
    test accuracy (%) vs communication round: Fig. 7 (CIFAR10 non-IID - B) and appendix Figs. 10,
    13, 16, 19 (MNIST), 22, 25, 28, 31 (CIFAR10).  Column ``test_acc`` (the average-aggregated
    model, sec. 4.1).
``<dataset>_<condition>_norms_fc.png`` / ``..._norms_conv.png``
    E (solid) and N (dashed) of the fully connected / convolutional layers: Figs. 8 / 9 and
    appendix Figs. 11-33.  E is eq. 5 (columns ``E_fc`` / ``E_conv``).  N is, as in those figures
    (eq. 24), the server step ``||w_{t+1} - w_t||`` (``server_step_fc`` / ``server_step_conv``);
    ``--n eq4`` plots eq. 4's N, the norm of the weighted mean client update (``N_fc`` / ``N_conv``),
    instead.  The two agree for FedAvg and FedProx.
``<dataset>_<condition>_norms_all.png``
    the same over the whole model (columns ``E``, ``server_step`` or ``N``): Fig. 3 style.
``<dataset>_<condition>_n_over_e.png``
    the ratio N/E: left eq. 4's N over E (``N_over_E``, at most 1 by Proposition 1: the WUDD
    diagnostic), right the server step over E (``server_step / E``; beta for Norm-Norm).
``<dataset>_<condition>_server_step_sum.png``
    the integrated server norm sum_tau ||w_{tau+1} - w_tau|| (``server_step_sum``): Fig. 4
    (with ``--n eq4``: the running sum of eq. 4's N).

Runs that depart from the paper's setting (substituted data, smoke scale) say so under each plot.
Example: ``python scripts/fednnnn/plot.py outputs/table2 --dataset cifar10 --condition noniid-b
--out outputs/figs``.
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # python scripts/fednnnn/plot.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.common import plots
from scripts.common.papers import (dataset_title, group, mean_by_round, one_line_errors, require_runs, stopped_notes,
                                   unreadable, with_rounds)
from scripts.fednnnn.table2 import (CONDITION_LABELS, CONDITIONS, DATASET_LABELS, DATASETS, METHOD_LABELS, METHODS,
                                    cell, deviations, load_runs)

from fedrun.paths import writable_folder
from fedrun.plot import ROUNDS, integer_rounds, mean_label, parser as plot_parser, pyplot
from fedrun.results import Run, folders

plt = pyplot()

COLORS = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
STEP_LABEL = r"N = $\|w_{t+1}-w_t\|$ (server step, eq. 24)"
EQ4_LABEL = r"N = $\|\sum_k p_k \Delta w_k\|$ (eq. 4)"


def _finish(fig, ax, title: str, notes: list[str], path: Path, left_out=()) -> Path:
    """FedNNNN's figures: round axis, the title over the axes, grid, then save."""
    ax.set_xlabel(ROUNDS)
    integer_rounds(ax)
    ax.set_title(plots.fitted(title, fig), fontsize=10)
    ax.grid(alpha=0.3)
    return plots.save_figure(fig, path, notes, left_out=left_out, bottom=0.06)


def _columns(df):
    """A method's mean rounds.csv with every column the figures draw (empty where a hand-made or
    older rounds.csv has none), and the server step over E."""
    df = df.assign(**{c: float("nan") for c in ("N_over_E", "server_step", "E", "N", "server_step_sum") if c not in df})
    return df.assign(step_over_E=df["server_step"] / df["E"])


def plot_cell(groups: dict[str, list[Run]], dataset: str, condition: str, out: Path,
              n_def: str = "step", left_out=()) -> list[Path]:
    """Write the PNGs of one (dataset, condition) from ``{method: [runs]}``; return their paths.
    ``left_out``: the cell's runs that diverged, named below each figure."""
    out.mkdir(parents=True, exist_ok=True)
    data = {m: _columns(mean_by_round([r.rounds() for r in groups[m]])) for m in METHODS if groups.get(m)}
    # Each seed's rounds.csv with the drawn columns: every figure the mean over seeds, the seeds' range shaded.
    frames = {m: [_columns(r.rounds()) for r in groups[m]] for m in data}
    # A method's marker (and, where E and N do not take the line style, its line style), as in the accuracy figure.
    full = {m: plots.method_style(i) for i, m in enumerate(data)}
    style = {m: {k: v for k, v in full[m].items() if k != "linestyle"} for m in data}
    notes = sorted({d for rs in groups.values() for r in rs for d in deviations(r)})
    runs = [r for rs in groups.values() for r in rs]
    where = f"{dataset_title(runs, dataset, DATASET_LABELS)}, {CONDITION_LABELS.get(condition, condition)}"

    def png(name: str) -> Path:
        return out / f"{dataset}_{condition}_{name}.png"

    label = {m: mean_label(METHOD_LABELS.get(m, m), len(groups[m])) for m in data}
    written: list[Path] = []

    # Fig. 7: accuracy curves.
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, m in enumerate(data):
        plots.seed_curve(ax, [r.rounds() for r in groups[m]], "test_acc", 100, color=COLORS.get(m), label=label[m],
                         **plots.method_style(i))
    ax.set_ylabel("Test accuracy (%)")
    several = any(len(groups[m]) > 1 for m in data)
    band = f"\n{plots.BAND_NOTE}" if several else ""
    ax.legend(fontsize=8, title=plots.BAND_NOTE if several else None, title_fontsize=6)
    written.append(_finish(fig, ax, f"Accuracy curves, {where} (Fig. 7 style)", notes, png("accuracy"), left_out))

    # Figs. 8, 9 (and Fig. 3 over the whole model): E solid, N dashed.
    n_label = STEP_LABEL if n_def == "step" else EQ4_LABEL
    for part, suffix, fig_ref, what in (("fc", "_fc", "Fig. 8", "fully connected layers"),
                                        ("conv", "_conv", "Fig. 9", "convolutional layers"),
                                        ("all", "", "Fig. 3", "whole model")):
        e_col, n_col = f"E{suffix}", f"server_step{suffix}" if n_def == "step" else f"N{suffix}"
        present = {m: df for m, df in data.items() if e_col in df and n_col in df and df[e_col].notna().any()}
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(9, 4.6))
        for m in present:
            for col, ls, name in ((e_col, "-", "E"), (n_col, "--", "N")):
                plots.seed_curve(ax, frames[m], col, color=COLORS.get(m), linestyle=ls, label=f"{label[m]} {name}",
                                 **style[m])
        ax.set_ylabel(r"$L_2$ norm")
        ax.legend(fontsize=7, handlelength=3.5, title=f"solid: E (eq. 5)\ndashed: {n_label}{band}",
                  title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        written.append(_finish(fig, ax, f"N and E of the {what}, {where} ({fig_ref} style)", notes,
                               png(f"norms_{part}"), left_out))

    # N/E: eq. 4 (Proposition 1: <= 1) and server step / E.
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True)
    for m in data:
        plots.seed_curve(axes[0], frames[m], "N_over_E", color=COLORS.get(m), label=label[m], **full[m])
        plots.seed_curve(axes[1], frames[m], "step_over_E", color=COLORS.get(m), label=label[m], **full[m])
    axes[0].set_ylabel("N / E  (N of eq. 4)")
    axes[1].set_ylabel(r"$\|w_{t+1}-w_t\|$ / E  (server step, eq. 24)")
    axes[1].set_xlabel(ROUNDS)
    axes[1].grid(alpha=0.3)
    axes[1].set_title("server step over E", fontsize=10)
    axes[0].legend(fontsize=8, title=plots.BAND_NOTE if several else None, title_fontsize=6)
    written.append(_finish(fig, axes[0], f"N/E ratio, {where}", notes, png("n_over_e"), left_out))

    # Fig. 4: the integrated server norm.
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for m in data:
        summed = [f.assign(n_sum=f["server_step_sum"] if n_def == "step" else f["N"].cumsum()) for f in frames[m]]
        plots.seed_curve(ax, summed, "n_sum", color=COLORS.get(m), label=label[m], **full[m])
    ax.set_ylabel(r"$\mathcal{N} = \sum_\tau \|w_{\tau+1}-w_\tau\|$" if n_def == "step"
                  else r"$\sum_\tau N_\tau$ (N of eq. 4)")
    ax.legend(fontsize=8, title=plots.BAND_NOTE if several else None, title_fontsize=6)
    written.append(_finish(fig, ax, f"Integrated server norm, {where} (Fig. 4 style)", notes,
                           png("server_step_sum"), left_out))
    return written


def parser():
    p = plot_parser("plot_fednnnn.py", __doc__)
    p.add_argument("--dataset", choices=DATASETS, default=None,
                   help="the dataset tag to plot (default: every dataset found)")
    p.add_argument("--condition", choices=CONDITIONS, default=None,
                   help="the condition tag to plot (default: every condition found)")
    p.add_argument("--n", choices=("step", "eq4"), default="step", dest="n_def",
                   help="what N means in the norm plots: step = ||w_{t+1} - w_t|| as in the paper's "
                        "figures (eq. 24, default), eq4 = norm of the weighted mean client update (eq. 4)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                   help=f"methods to overlay (default: {' '.join(METHODS)})")
    return p


@one_line_errors("plot_fednnnn")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    folders(args.dirs)
    writable_folder("--out", Path(args.out))
    runs, skipped = load_runs(args.dirs)
    cells = group((r for r in with_rounds(runs, skipped) if r.method in args.methods), cell)
    pairs = sorted({(d, c) for (_m, d, c) in cells if args.dataset in (None, d) and args.condition in (None, c)},
                   key=lambda dc: (DATASETS.index(dc[0]) if dc[0] in DATASETS else 99,
                                   CONDITIONS.index(dc[1]) if dc[1] in CONDITIONS else 99))
    require_runs(pairs, skipped, f"FedNNNN preset runs to draw for dataset={args.dataset or 'any'} "
                 f"condition={args.condition or 'any'}", args.dirs)
    unreadable(skipped, "plot_fednnnn")
    left_out = stopped_notes(skipped, lambda r: (r.dataset, r.tags.get("condition")),
                             lambda r: METHOD_LABELS.get(r.method, r.method))
    for dataset, condition in pairs:
        groups = {m: cells.get((m, dataset, condition), []) for m in args.methods}
        for path in plot_cell(groups, dataset, condition, Path(args.out), args.n_def,
                              left_out.get((dataset, condition), [])):
            print(path)
    return 0

if __name__ == "__main__":
    sys.exit(main())
