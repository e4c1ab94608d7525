#!/usr/bin/env python
"""Plot the FedLayerWise paper's curves (Lanjewar, Tran, Tran) from fedrun run directories, plus
diagnostics the paper could not show.

For each scenario found (``tags.scenario`` of the ``conf/experiment/fedlayerwise/*`` presets:
``5iid_5noniid``, ``2iid_8noniid``), with FedLayerWise, FedAdp and FedAvg overlaid (several seeds
of one method: their mean round by round, their range min to max shaded), it writes to ``--out``:

``<scenario>_accuracy.png``
    accuracy (%) vs communication round: Fig. 1.  The paper plots validation accuracy; fedrun's
    ``test_acc`` (the held-out test set) is plotted, or ``val_acc`` with ``--metric val_acc`` for
    runs with hyperparams.validation_fraction > 0.  The dotted line is the 95% of Table I; the
    crosses on it mark the paper's rounds to 95% (Table I) for each method.
``<scenario>_loss.png``
    loss vs communication round: Fig. 2.  ``val_loss`` where the runs recorded one, else
    ``test_loss``; the axis label says which.
``<scenario>_fedlayerwise_layers.png``
    FedLayerWise's aggregation (``client_layers.csv``), one column per layer: top row the weight
    psi_{k,l} each client gets in that layer (eq. 6; the dotted line is an equal share 1/m, FedAvg's
    n_k / n for the paper's equal client sizes), bottom
    row the smoothed angle (eq. 4, radians) it was computed from; one line per client, IID clients
    (the first ``partition.iid_clients`` ids) solid, non-IID clients dashed, with the classes they
    hold (from ``partition.csv``) in the legend.  One run (the lowest seed) is shown, since seeds
    deal the non-IID classes differently.
``<scenario>_fedadp_clients.png``
    the same for FedAdp's single, whole-model weight and smoothed angle (``clients.csv``), when
    there is a FedAdp run: the model-wise weighting FedLayerWise refines.

Runs that depart from the paper's setting (substituted data, smoke scale) say so under each plot.
Example: ``python scripts/fedlayerwise/plot.py outputs/fedlayerwise --out outputs/fedlayerwise/figs``.
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # python scripts/fedlayerwise/plot.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from matplotlib.lines import Line2D

from scripts.common import plots
from scripts.common.papers import (dataset_title, group, one_line_errors, require_runs, stopped_notes, unreadable,
                                   with_rounds)
from scripts.fedlayerwise.table1 import (METHOD_LABELS, METHODS, PAPER_TARGET, SCENARIO_LABELS, SCENARIOS, deviations,
                                         load_runs, paper_table)

from fedrun.paths import writable_folder
from fedrun.plot import ROUNDS, mean_label, parser as plot_parser, pyplot
from fedrun.results import Run, folders, require_column

plt = pyplot()

COLORS = {"fedlayerwise": "tab:red", "fedadp": "tab:green", "fedavg": "tab:blue"}


def loss_column(frames: list) -> str:
    """``val_loss`` when every run recorded one (validation split), else ``test_loss``."""
    if frames and all("val_loss" in f and f["val_loss"].notna().any() for f in frames):
        return "val_loss"
    return "test_loss"


def iid_clients(run: Run) -> int:
    """How many of the first client ids are IID (``partition.iid_clients``; 0 if unset)."""
    return int((run.config.get("partition") or {}).get("iid_clients") or 0)


def client_labels(run: Run) -> dict[int, str]:
    """``{client: "client k (IID)" / "client k (non-IID: 1,7)"}``, classes from ``partition.csv``."""
    n_iid = iid_clients(run)
    part = run.csv("partition.csv")
    classes: dict[int, str] = {}
    if part is not None:
        cols = [c for c in part.columns if c.startswith("class_")]
        for _, row in part.iterrows():
            classes[int(row["client"])] = ",".join(c.split("_", 1)[1] for c in cols if row[c] > 0)
    return {k: f"client {k} (IID)" if k < n_iid else f"client {k} (non-IID{': ' + classes[k] if k in classes else ''})"
            for k in sorted(set(classes) | set(range(n_iid)))}


def _client_style(k: int, n_iid: int, few: bool = False) -> dict:
    style = {"color": plt.get_cmap("tab10")(k % 10), "ls": "-" if k < n_iid else "--", "lw": 1.2}
    if few:  # a handful of rounds: markers, so single points show
        style.update(marker="o" if k < n_iid else "s", markersize=3)
    return style


def _client_lines(weight_ax, angle_ax, df, clients, n_iid: int, few: bool, per_round: float) -> None:
    """Each client's weight (and smoothed angle, when ``angle_ax``) per round; the dotted line is an
    equal share 1/m of the round's m clients."""
    for k in clients:
        c = df[df["client"] == k].sort_values("round")
        weight_ax.plot(c["round"], c["weight"], **_client_style(k, n_iid, few))
        if angle_ax is not None:
            angle_ax.plot(c["round"], c["smoothed_angle"], **_client_style(k, n_iid, few))
    weight_ax.axhline(1.0 / per_round, color="grey", ls=":", lw=1)


def _finish_clients(fig, axes, run: Run, clients, title: str, notes: list[str], path: Path) -> Path:
    """A legend of the clients (IID solid, non-IID dashed, with their classes) right of the axes,
    the seed in the title, then save."""
    n_iid, labels = iid_clients(run), client_labels(run)
    handles = [Line2D([], [], **_client_style(k, n_iid)) for k in clients]
    fig.legend(handles, [labels.get(k, f"client {k}") for k in clients], fontsize=7, loc="center right",
               title="solid: IID, dashed: non-IID", title_fontsize=7)
    seed = f", seed {run.seed}" if run.seed is not None else ""
    return plots.finish(fig, axes, title + seed, notes, path, bottom=0.07, right=1 - 2.0 / fig.get_figwidth())


def _clients_frame(run: Run, name: str):
    """``clients.csv`` / ``client_layers.csv`` without dropped clients, its clients, whether it has
    smoothed angles, the clients of a round on average and whether there are few rounds; None
    without weights."""
    df = run.csv(name)
    if df is None or df.empty or "weight" not in df:
        return None
    if "dropped" in df:
        df = df[df["dropped"].fillna(0) == 0]
    has_angle = "smoothed_angle" in df and df["smoothed_angle"].notna().any()
    return (df, sorted(df["client"].unique()), has_angle, df.groupby("round")["client"].nunique().mean(),
            df["round"].nunique() <= 30)


def plot_layers(run: Run, where: str, notes: list[str], path: Path) -> Path | None:
    """The per-layer weights and smoothed angles of one FedLayerWise run; None without the data."""
    frame = _clients_frame(run, "client_layers.csv")
    if frame is None:
        return None
    df, clients, has_angle, per_round, few = frame
    layers = list(dict.fromkeys(df["layer"]))
    rows = 2 if has_angle else 1
    fig, axes = plt.subplots(rows, len(layers), figsize=(3.2 * len(layers) + 2.2, 3.0 * rows + 0.6),
                             sharex=True, squeeze=False)
    for j, layer in enumerate(layers):
        _client_lines(axes[0][j], axes[1][j] if has_angle else None, df[df["layer"] == layer], clients,
                      iid_clients(run), few, per_round)
        axes[0][j].set_title(layer, fontsize=9)
        axes[-1][j].set_xlabel(ROUNDS)
    axes[0][0].set_ylabel(r"layer weight $\tilde\psi_{k,l}$ (eq. 6)" + "\n(dotted: equal share 1/m)")
    if has_angle:
        axes[1][0].set_ylabel(r"smoothed angle $\tilde\theta_{k,l}$ (rad, eq. 4)")
    return _finish_clients(fig, [a for row in axes for a in row], run, clients,
                           f"FedLayerWise per-layer client weights and smoothed angles, {where}", notes, path)


def plot_fedadp(run: Run, where: str, notes: list[str], path: Path) -> Path | None:
    """FedAdp's whole-model client weights and smoothed angles (``clients.csv``); None without them."""
    frame = _clients_frame(run, "clients.csv")
    if frame is None:
        return None
    df, clients, has_angle, per_round, few = frame
    fig, axes = plt.subplots(1, 2 if has_angle else 1, figsize=(11 if has_angle else 7.5, 3.8), squeeze=False)
    axes = axes[0]
    _client_lines(axes[0], axes[1] if has_angle else None, df, clients, iid_clients(run), few, per_round)
    axes[0].set_ylabel(r"client weight $\tilde\psi_k$ (dotted: equal share 1/m)")
    if has_angle:
        axes[1].set_ylabel(r"smoothed angle $\tilde\theta_k$ (rad)")
    for ax in axes:
        ax.set_xlabel(ROUNDS)
    return _finish_clients(fig, axes, run, clients, f"FedAdp whole-model client weights and smoothed angles, {where}",
                           notes, path)


def plot_scenario(groups: dict[str, list[Run]], scenario: str, out: Path, metric: str = "test_acc",
                  left_out=()) -> list[Path]:
    """Write the PNGs of one scenario from ``{method: [runs]}``; return their paths.  ``left_out``:
    the scenario's runs that diverged, named below the accuracy and loss figures."""
    out.mkdir(parents=True, exist_ok=True)
    methods = [m for m in METHODS if groups.get(m)] + sorted(m for m in groups if m not in METHODS and groups[m])
    frames = {m: [r.rounds() for r in groups[m]] for m in methods}
    several = any(len(frames[m]) > 1 for m in methods)
    notes = sorted({d for rs in groups.values() for r in rs for d in deviations(r)})
    runs = [r for rs in groups.values() for r in rs]
    read = dataset_title(runs, "mnist")  # the presets' dataset: MNIST
    where = SCENARIO_LABELS.get(scenario, scenario) + ("" if read == "MNIST" else f" ({read})")
    label = {m: mean_label(METHOD_LABELS.get(m, m), len(groups[m])) for m in methods}
    paper = paper_table()
    written: list[Path] = []

    # Fig. 1: accuracy curves, with Table I's target and the paper's rounds to reach it.
    fig, ax = plt.subplots(figsize=(6.6, 4.4))
    for i, m in enumerate(methods):
        plots.seed_curve(ax, frames[m], metric, 100, color=COLORS.get(m), label=label[m], **plots.method_style(i))
        if (m, scenario) in paper:
            ax.plot([paper[(m, scenario)]], [100 * PAPER_TARGET], marker="x", ms=9, mew=2, color=COLORS.get(m),
                    ls="none", label=f"{METHOD_LABELS.get(m, m)}: paper reaches 95% at round {paper[(m, scenario)]}")
    ax.axhline(100 * PAPER_TARGET, color="grey", ls=":", lw=1)
    what = {"test_acc": "Test accuracy (%)", "val_acc": "Validation accuracy (%)"}[metric]
    ax.set_ylabel(what)
    ax.set_xlabel(ROUNDS)
    ax.legend(fontsize=7, title=plots.BAND_NOTE if several else None, title_fontsize=6)
    written.append(plots.finish(fig, [ax], f"{what.split(' (')[0]}, {where} (Fig. 1 style; x: Table I)", notes,
                                out / f"{scenario}_accuracy.png", bottom=0.07, left_out=left_out))

    # Fig. 2: loss curves.
    column = loss_column([f for fs in frames.values() for f in fs])
    fig, ax = plt.subplots(figsize=(6.6, 4.4))
    for i, m in enumerate(methods):
        plots.seed_curve(ax, frames[m], column, color=COLORS.get(m), label=label[m], **plots.method_style(i))
    ax.set_ylabel({"val_loss": "Validation loss (val_loss)",
                   "test_loss": "Test loss (test_loss; no validation split recorded)"}[column])
    ax.set_xlabel(ROUNDS)
    ax.legend(fontsize=8, title=plots.BAND_NOTE if several else None, title_fontsize=6)
    written.append(plots.finish(fig, [ax], f"Loss, {where} (Fig. 2 style)", notes, out / f"{scenario}_loss.png",
                                bottom=0.07, left_out=left_out))

    # Diagnostics: FedLayerWise per layer, FedAdp per client (one run each: the lowest seed).
    for m, func, name in (("fedlayerwise", plot_layers, "fedlayerwise_layers"),
                          ("fedadp", plot_fedadp, "fedadp_clients")):
        if groups.get(m):
            run = sorted(groups[m], key=lambda r: (str(r.seed), str(r.path)))[0]
            path = func(run, where, sorted(set(deviations(run))), out / f"{scenario}_{name}.png")
            written += [path] if path else []
    return written


def parser():
    p = plot_parser("plot_fedlayerwise.py", __doc__)
    p.add_argument("--scenario", choices=SCENARIOS, default=None,
                   help="the scenario tag to plot (default: every scenario found)")
    p.add_argument("--metric", choices=("test_acc", "val_acc"), default="test_acc",
                   help="accuracy column of rounds.csv to plot (default test_acc)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                   help=f"methods to overlay (default: {' '.join(METHODS)})")
    return p


@one_line_errors("plot_fedlayerwise")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    folders(args.dirs)
    writable_folder("--out", Path(args.out))
    runs, skipped = load_runs(args.dirs)
    runs = [r for r in with_rounds(runs, skipped) if r.method in args.methods]
    by_scenario = group((r for r in runs if args.scenario in (None, r.tags["scenario"])), lambda r: r.tags["scenario"])
    require_runs(list(by_scenario), skipped, f"FedLayerWise preset runs to draw for scenario={args.scenario or 'any'}",
                 args.dirs)
    require_column([r.rounds() for rs in by_scenario.values() for r in rs], args.metric, "--metric")
    unreadable(skipped, "plot_fedlayerwise")
    left_out = stopped_notes(skipped, lambda r: r.tags.get("scenario"), lambda r: METHOD_LABELS.get(r.method, r.method))
    for scenario in sorted(by_scenario, key=lambda s: SCENARIOS.index(s) if s in SCENARIOS else 99):
        for path in plot_scenario(group(by_scenario[scenario], lambda r: r.method), scenario, Path(args.out),
                                  args.metric, left_out.get(scenario, [])):
            print(path)
    return 0

if __name__ == "__main__":
    sys.exit(main())
