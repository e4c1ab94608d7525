#!/usr/bin/env python
"""Plot the FedLayerWise paper's curves (Lanjewar, Tran, Tran) from fedrun run directories, plus
diagnostics the paper could not show.

For each scenario found (``tags.scenario`` of the ``conf/experiment/fedlayerwise/*`` presets:
``5iid_5noniid``, ``2iid_8noniid``), with FedLayerWise, FedAdp and FedAvg overlaid (several seeds
of one method are averaged round by round), it writes to ``--out``:

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
Example: ``python scripts/plot_fedlayerwise.py outputs/fedlayerwise --out outputs/fedlayerwise/figs``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
import pandas as pd  # noqa: E402

from fedlayerwise_table1 import (METHOD_LABELS, METHODS, PAPER, PAPER_TABLE1, PAPER_TARGET,  # noqa: E402
                                 SCENARIO_LABELS, SCENARIOS, deviations)
from runs import Run, integer_rounds, load_tagged, mean_by_round, missing_dirs, read_csv, save_figure  # noqa: E402

COLORS = {"fedlayerwise": "tab:red", "fedadp": "tab:green", "fedavg": "tab:blue"}


def _style(df: pd.DataFrame) -> dict:
    return {"marker": "o", "markersize": 3} if len(df) <= 30 else {}


def _finish(fig, axes, title: str, notes: list[str], path: Path, written: list[Path],
            right: float = 1.0) -> None:
    for ax in axes:
        integer_rounds(ax)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    written.append(save_figure(fig, path, notes, bottom=0.07, right=right))


def loss_column(frames: list[pd.DataFrame]) -> str:
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
    part = read_csv(run, "partition.csv")
    classes: dict[int, str] = {}
    if part is not None:
        cols = [c for c in part.columns if c.startswith("class_")]
        for _, row in part.iterrows():
            held = [c.split("_", 1)[1] for c in cols if row[c] > 0]
            classes[int(row["client"])] = ",".join(held)
    out = {}
    for k in sorted(set(classes) | set(range(n_iid))):
        out[k] = f"client {k} (IID)" if k < n_iid else \
            f"client {k} (non-IID{': ' + classes[k] if k in classes else ''})"
    return out


def _client_style(k: int, n_iid: int, few: bool = False) -> dict:
    style = {"color": plt.get_cmap("tab10")(k % 10), "ls": "-" if k < n_iid else "--", "lw": 1.2}
    if few:  # a handful of rounds: markers, so single points show
        style.update(marker="o" if k < n_iid else "s", markersize=3)
    return style


def _client_legend(fig, labels: dict[int, str], clients, n_iid: int) -> None:
    handles = [Line2D([], [], **_client_style(k, n_iid)) for k in clients]
    text = [labels.get(k, f"client {k}") for k in clients]
    fig.legend(handles, text, fontsize=7, loc="center right", title="solid: IID, dashed: non-IID",
               title_fontsize=7)


def plot_layers(run: Run, where: str, notes: list[str], path: Path, written: list[Path]) -> bool:
    """The per-layer weights and smoothed angles of one FedLayerWise run; False without the data."""
    df = read_csv(run, "client_layers.csv")
    if df is None or df.empty or "weight" not in df:
        return False
    layers = list(dict.fromkeys(df["layer"]))
    clients = sorted(df["client"].unique())
    n_iid, labels = iid_clients(run), client_labels(run)
    has_angle = "smoothed_angle" in df and df["smoothed_angle"].notna().any()
    rows = 2 if has_angle else 1
    fig, axes = plt.subplots(rows, len(layers), figsize=(3.2 * len(layers) + 2.2, 3.0 * rows + 0.6),
                             sharex=True, squeeze=False)
    per_round = df.groupby("round")["client"].nunique().mean()  # clients in a round: 1/m is an equal share
    few = df["round"].nunique() <= 30
    for j, layer in enumerate(layers):
        sub = df[df["layer"] == layer]
        for k in clients:
            c = sub[sub["client"] == k].sort_values("round")
            axes[0][j].plot(c["round"], c["weight"], **_client_style(k, n_iid, few))
            if has_angle:
                axes[1][j].plot(c["round"], c["smoothed_angle"], **_client_style(k, n_iid, few))
        axes[0][j].axhline(1.0 / per_round, color="grey", ls=":", lw=1)
        axes[0][j].set_title(layer, fontsize=9)
        axes[-1][j].set_xlabel("Communication rounds")
    axes[0][0].set_ylabel(r"layer weight $\tilde\psi_{k,l}$ (eq. 6)" + "\n(dotted: equal share 1/m)")
    if has_angle:
        axes[1][0].set_ylabel(r"smoothed angle $\tilde\theta_{k,l}$ (rad, eq. 4)")
    _client_legend(fig, labels, clients, n_iid)
    seed = f", seed {run.seed}" if run.seed is not None else ""
    _finish(fig, [a for row in axes for a in row],
            f"FedLayerWise per-layer client weights and smoothed angles, {where}{seed}", notes, path, written,
            right=1 - 2.0 / fig.get_figwidth())
    return True


def plot_fedadp(run: Run, where: str, notes: list[str], path: Path, written: list[Path]) -> bool:
    """FedAdp's whole-model client weights and smoothed angles (``clients.csv``)."""
    df = read_csv(run, "clients.csv")
    if df is None or df.empty or "weight" not in df:
        return False
    if "dropped" in df:
        df = df[df["dropped"].fillna(0) == 0]
    clients = sorted(df["client"].unique())
    n_iid, labels = iid_clients(run), client_labels(run)
    has_angle = "smoothed_angle" in df and df["smoothed_angle"].notna().any()
    fig, axes = plt.subplots(1, 2 if has_angle else 1, figsize=(11 if has_angle else 7.5, 3.8), squeeze=False)
    axes = axes[0]
    per_round = df.groupby("round")["client"].nunique().mean()
    few = df["round"].nunique() <= 30
    for k in clients:
        c = df[df["client"] == k].sort_values("round")
        axes[0].plot(c["round"], c["weight"], **_client_style(k, n_iid, few))
        if has_angle:
            axes[1].plot(c["round"], c["smoothed_angle"], **_client_style(k, n_iid, few))
    axes[0].axhline(1.0 / per_round, color="grey", ls=":", lw=1)
    axes[0].set_ylabel(r"client weight $\tilde\psi_k$ (dotted: equal share 1/m)")
    if has_angle:
        axes[1].set_ylabel(r"smoothed angle $\tilde\theta_k$ (rad)")
    for ax in axes:
        ax.set_xlabel("Communication rounds")
    _client_legend(fig, labels, clients, n_iid)
    seed = f", seed {run.seed}" if run.seed is not None else ""
    _finish(fig, axes, f"FedAdp whole-model client weights and smoothed angles, {where}{seed}", notes,
            path, written, right=1 - 2.0 / fig.get_figwidth())
    return True


def plot_scenario(groups: dict[str, list[Run]], scenario: str, out: Path, metric: str = "test_acc") -> list[Path]:
    """Write the PNGs of one scenario from ``{method: [runs]}``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    methods = [m for m in METHODS if groups.get(m)] + sorted(m for m in groups if m not in METHODS and groups[m])
    frames = {m: [r.rounds() for r in groups[m]] for m in methods}
    data = {m: mean_by_round(frames[m]) for m in methods}
    notes = sorted({d for rs in groups.values() for r in rs for d in deviations(r)})
    where = SCENARIO_LABELS.get(scenario, scenario)
    counts = {m: len(groups[m]) for m in methods}
    label = {m: METHOD_LABELS.get(m, m) + (f" (mean of {counts[m]})" if counts[m] > 1 else "") for m in methods}
    written: list[Path] = []

    # Fig. 1: accuracy curves, with Table I's target and the paper's rounds to reach it.
    fig, ax = plt.subplots(figsize=(6.6, 4.4))
    for m, df in data.items():
        acc = df.dropna(subset=[metric]) if metric in df else df.iloc[0:0]
        ax.plot(acc["round"], 100 * acc[metric], color=COLORS.get(m), label=label[m], **_style(df))
        paper = PAPER_TABLE1.get((m, scenario))
        if paper is not None:
            ax.plot([paper], [100 * PAPER_TARGET], marker="x", ms=9, mew=2, color=COLORS.get(m), ls="none",
                    label=f"{METHOD_LABELS.get(m, m)}: paper reaches 95% at round {paper}")
    ax.axhline(100 * PAPER_TARGET, color="grey", ls=":", lw=1)
    what = {"test_acc": "Test accuracy (%)", "val_acc": "Validation accuracy (%)"}[metric]
    ax.set_ylabel(what)
    ax.set_xlabel("Communication rounds")
    ax.legend(fontsize=7)
    _finish(fig, [ax], f"{what.split(' (')[0]}, {where} (Fig. 1 style; x: Table I)", notes,
            out / f"{scenario}_accuracy.png", written)

    # Fig. 2: loss curves.
    column = loss_column([f for fs in frames.values() for f in fs])
    fig, ax = plt.subplots(figsize=(6.6, 4.4))
    for m, df in data.items():
        loss = df.dropna(subset=[column]) if column in df else df.iloc[0:0]
        ax.plot(loss["round"], loss[column], color=COLORS.get(m), label=label[m], **_style(df))
    ax.set_ylabel({"val_loss": "Validation loss (val_loss)",
                   "test_loss": "Test loss (test_loss; no validation split recorded)"}[column])
    ax.set_xlabel("Communication rounds")
    ax.legend(fontsize=8)
    _finish(fig, [ax], f"Loss, {where} (Fig. 2 style)", notes, out / f"{scenario}_loss.png", written)

    # Diagnostics: FedLayerWise per layer, FedAdp per client (one run each: the lowest seed).
    for m, func, name in (("fedlayerwise", plot_layers, "fedlayerwise_layers"),
                          ("fedadp", plot_fedadp, "fedadp_clients")):
        if groups.get(m):
            run = sorted(groups[m], key=lambda r: (str(r.seed), str(r.path)))[0]
            func(run, where, sorted(set(deviations(run))), out / f"{scenario}_{name}.png", written)
    return written


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="plot_fedlayerwise.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for run directories")
    p.add_argument("--scenario", choices=SCENARIOS, default=None,
                   help="the scenario tag to plot (default: every scenario found)")
    p.add_argument("--out", required=True, help="folder for the PNGs")
    p.add_argument("--metric", choices=("test_acc", "val_acc"), default="test_acc",
                   help="accuracy column of rounds.csv to plot (default test_acc)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                   help=f"methods to overlay (default: {' '.join(METHODS)})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if missing_dirs(args.dirs, "plot_fedlayerwise"):
        return 2
    runs, _skipped = load_tagged(args.dirs, PAPER, ("scenario",))
    runs = [r for r in runs if r.method in args.methods and (r.path / "rounds.csv").is_file()]
    scenarios = sorted({r.tags["scenario"] for r in runs if args.scenario in (None, r.tags["scenario"])},
                       key=lambda s: SCENARIOS.index(s) if s in SCENARIOS else 99)
    if not scenarios:
        print(f"plot_fedlayerwise: no FedLayerWise preset runs for scenario={args.scenario or 'any'} "
              f"under {', '.join(args.dirs)}", file=sys.stderr)
        return 1
    for scenario in scenarios:
        groups: dict[str, list[Run]] = {}
        for r in runs:
            if r.tags["scenario"] == scenario:
                groups.setdefault(r.method, []).append(r)
        for path in plot_scenario(groups, scenario, Path(args.out), args.metric):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
