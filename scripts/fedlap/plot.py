#!/usr/bin/env python
"""Plot the FedLap paper's curves (Charteros, Koutsopoulos: "Lay Importance on the Layer: Federated
Learning for Non-IID data with Layer-based Regularization") from fedrun run directories, and print
their accuracies as a table.

Runs are found below the DIRs (folders with ``summary.json`` and ``config.yaml``) and filed by
dataset (``tags.dataset`` of the ``conf/experiment/fedlap/*`` presets: mnist, fmnist, cifar10),
straggler fraction (``hyperparams.stragglers`` of the run's config.yaml: 0, 0.5, 0.9 in the paper)
and method (``summary.json`` aggregator: FedLap, FedProx, FedAvg); several seeds of one method are
averaged round by round, their range (min to max) shaded.  For each dataset it writes to ``--out``:

``<dataset>_accuracy.png``
    test accuracy (%) vs communication round, FedLap, FedProx and FedAvg overlaid, one panel per
    straggler fraction present: the panel without stragglers is Fig. 1 (a: MNIST, b: FashionMNIST,
    c: CIFAR10), the 50% and 90% panels are the top and bottom of Fig. 2 (MNIST), Fig. 3
    (FashionMNIST) and Fig. 4 (CIFAR10).
``<dataset>_diagnostics.png``
    what the paper does not show: per round, the mean over the round's (not dropped) clients of
    ``lambda_mean`` (the mean layer dissimilarity lambda of eq. 10 the client trained with) and
    ``reg_loss`` (the regularization term's mean value over its local steps), from ``clients.csv``;
    one column per straggler fraction.  FedAvg has neither; FedProx has only ``reg_loss``
    (mu/2 ||w - w_g||^2).  Sec. IV.B predicts both of FedLap's to shrink as the global model converges.

``--summary`` prints (and ``--csv`` writes) a table instead of, or with ``--out`` besides, the
figures: per dataset x stragglers x method, the test accuracy at round ``--round`` (default 20: the
paper's "3-5% higher accuracy in the first 20 communication rounds"; the last evaluation at or before
it) with its range over seeds, the mean accuracy over rounds 1..round (the claim read as the area
under the curve), the final accuracy, the rounds run and the number of runs (seeds) averaged;
FedLap's lead over the better of FedProx and FedAvg at each of the three; and in how many of the
seeds that all three methods ran FedLap's mean over rounds 1..round beats both (a seed gives every
method the same clients and batches, so seeds pair up).  A DIR may be a run directory itself: to
set a reading of one method against the others' preset runs, name those runs' folders.

Runs that depart from the paper's setting (substituted data, fewer rounds, fewer local epochs: read
from each run's own config.yaml) say so under each plot and in a NOTE under the table.  When the
DIRs are committed runs (outputs/reproductions/fedlap/fmnist, mnist_train10k, readings, preset), the
figures docs/reproductions.md quotes from them follow the table (scripts/claims.py).  The paper
does not state its number of rounds T; the presets run 100, which is what runs are compared with.
Examples::

    python scripts/fedlap/plot.py outputs/fedlap --out outputs/fedlap/figs
    python scripts/fedlap/plot.py outputs/fedlap --summary --round 20 --csv outputs/fedlap/summary.csv
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # python scripts/fedlap/plot.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.common import claims_registry, plots, tables
from scripts.common.papers import (count_notes, dataset_title, group, half_up, load_tagged, mean_by_round,
                                   one_line_errors, require_runs, round_number, setting_deviations, stopped_notes,
                                   unreadable, with_rounds)
from scripts.fedlap import claims, claims_tuned  # noqa: F401  (their sections)

from fedrun.errors import UsageError
from fedrun.paths import writable_file, writable_folder
from fedrun.plot import ROUNDS, mean_label, parser as plot_parser, pyplot
from fedrun.results import METHOD_NAMES, Run, folders

plt = pyplot()

PAPER = "fedlap"
METHODS = ("fedlap", "fedprox", "fedavg")
METHOD_LABELS = {m: METHOD_NAMES[m] for m in METHODS}
COLORS = {"fedlap": "tab:red", "fedprox": "tab:orange", "fedavg": "tab:blue"}
DATASETS = ("mnist", "fmnist", "cifar10")
DATASET_LABELS = {"mnist": "MNIST", "fmnist": "FashionMNIST", "cifar10": "CIFAR10"}
# Which figure of the paper shows (dataset, stragglers).
FIGURES = {("mnist", 0.0): "Fig. 1a", ("fmnist", 0.0): "Fig. 1b", ("cifar10", 0.0): "Fig. 1c",
           ("mnist", 0.5): "Fig. 2 top", ("mnist", 0.9): "Fig. 2 bottom",
           ("fmnist", 0.5): "Fig. 3 top", ("fmnist", 0.9): "Fig. 3 bottom",
           ("cifar10", 0.5): "Fig. 4 top", ("cifar10", 0.9): "Fig. 4 bottom"}

# The paper's setting (sec. V.A): 100 clients, 10% a round, SGD lr 0.01 momentum 0.9, B = 10, E = 10,
# 2 label-sorted shards per client; a 2-layer MLP (MNIST, FashionMNIST) or the TensorFlow-tutorial
# CNN (CIFAR10).  T is not stated: the presets' 100 rounds are the reference.
PAPER_HYPERPARAMS = {"rounds": 100, "num_clients": 100, "client_fraction": 0.1, "local_epochs": 10,
                     "batch_size": 10, "lr": 0.01, "optimizer": "sgd", "momentum": 0.9, "dropouts": 0.0}
PAPER_MODELS = {"mnist": "fedrun.models.nets.MLP", "fmnist": "fedrun.models.nets.MLP",
                "cifar10": "fedrun.models.nets.TFTutorialCNN"}
PAPER_PARTITION = {"_target_": "fedrun.data.partition.shards", "shards_per_client": 2}
# Sec. V.A: "200 chunks of size 300, 300, and 200 respectively for MNIST, FashionMNIST, and CIFAR10"
# (300 is what 60,000 / 200 gives with shard_size null).
PAPER_SHARD_SIZE = {"cifar10": 200}
LABELS = {"rounds": "presets 100; the paper does not state T"}
SUMMARY_COLUMNS = ["dataset", "stragglers", "method", "acc_at_round_pct", "acc_at_round_min_pct",
                   "acc_at_round_max_pct", "round", "mean_acc_to_round_pct", "final_acc_pct", "rounds_run", "n_runs",
                   "seeds", "fedlap_lead_at_round_pct", "fedlap_lead_to_round_pct", "fedlap_lead_final_pct",
                   "fedlap_ahead_seeds", "run_dir", "deviations"]
NOT_PAPER = ("\nNOTE: these runs do NOT use the paper's setting (sec. V.A), so their accuracies are not comparable "
             "with the paper's figures:")
# The sections of docs/reproductions.md that ``--summary`` prints, by the folder (below
# outputs/reproductions) its DIRs lie in.
SECTIONS = {"fedlap/tuned": ("fedlap_tuned",), "fedlap/fmnist": ("fedlap_fmnist",),
            "fedlap/mnist_train10k": ("fedlap_mnist_train10k",), "fedlap/mnist": ("fedlap_mnist",),
            "fedlap/tuned_mnist": ("fedlap_mnist_tuned",), "fedlap/readings": ("fedlap_readings",),
            "fedlap/preset": ("fedlap_readings",)}


def deviations(run: Run) -> list[str]:
    """How ``run`` departs from the paper's setting (empty: the paper's setting, T = 100)."""
    model = {"_target_": PAPER_MODELS[run.dataset]} if run.dataset in PAPER_MODELS else None
    partition = {**PAPER_PARTITION, **({"shard_size": PAPER_SHARD_SIZE[run.dataset]}
                                       if run.dataset in PAPER_SHARD_SIZE else {})}
    return setting_deviations(run, PAPER_HYPERPARAMS, model=model, partition=partition, labels=LABELS)


def stragglers(run: Run) -> float:
    """The share of each round's clients that are stragglers (``hyperparams.stragglers``, 0 if unset)."""
    return float((run.config.get("hyperparams") or {}).get("stragglers") or 0.0)


def cell(run: Run) -> tuple[str, float, str]:
    """Where a run is filed: (dataset, stragglers, method)."""
    return run.dataset, stragglers(run), run.method


def straggler_label(s: float) -> str:
    return "no stragglers" if s == 0 else f"{100 * s:g}% stragglers"


def _order(values, preferred) -> list:
    return sorted(values, key=lambda v: (preferred.index(v) if v in preferred else len(preferred), str(v)))


def _panels(groups: dict, dataset: str) -> list[tuple[float, list[str]]]:
    """The straggler fractions of ``dataset`` (a panel each), with their methods in the paper's order."""
    return [(s, _order({m for d, s2, m in groups if d == dataset and s2 == s}, METHODS))
            for s in sorted({s for d, s, _m in groups if d == dataset})]


def client_means(run: Run):
    """Per round, the mean of ``lambda_mean`` and ``reg_loss`` over the clients that trained."""
    df = run.csv("clients.csv")
    if df is None or df.empty:
        return None
    if "dropped" in df:
        df = df[df["dropped"].fillna(0) == 0]
    cols = [c for c in ("lambda_mean", "reg_loss") if c in df]
    return df.groupby("round", as_index=False)[cols].mean() if cols else None


def plot_dataset(groups: dict[tuple[str, float, str], list[Run]], dataset: str, out: Path,
                 left_out=()) -> list[Path]:
    """Write the PNGs of one dataset; return their paths.  ``left_out``: the dataset's runs that
    diverged, named below the accuracy figure."""
    out.mkdir(parents=True, exist_ok=True)
    panels = _panels(groups, dataset)
    notes = sorted({d for (ds, _s, _m), rs in groups.items() if ds == dataset for r in rs for d in deviations(r)})
    name = dataset_title([r for (ds, _s, _m), rs in groups.items() if ds == dataset for r in rs], dataset,
                         DATASET_LABELS)
    written: list[Path] = []

    # Figs. 1-4: accuracy, one panel per straggler fraction.
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False, sharey=True)
    axes = list(axes[0])
    for ax, (s, methods) in zip(axes, panels):
        for i, m in enumerate(methods):
            rs = groups[(dataset, s, m)]
            plots.seed_curve(ax, [r.rounds() for r in rs], "test_acc", 100, color=COLORS.get(m),
                             label=mean_label(METHOD_LABELS.get(m, m), len(rs)), **plots.method_style(i))
        fig_ref = FIGURES.get((dataset, s))
        ax.set_title(straggler_label(s) + (f" ({fig_ref} style)" if fig_ref else ""), fontsize=9)
        ax.set_xlabel(ROUNDS)
        several = any(len(groups[(dataset, s, m)]) > 1 for m in methods)
        ax.legend(fontsize=8, title=plots.BAND_NOTE if several else None, title_fontsize=6)
    axes[0].set_ylabel("Test accuracy (%)")
    written.append(plots.finish(fig, axes, f"Test accuracy for FedLap, FedProx and FedAvg on {name}", notes,
                                out / f"{dataset}_accuracy.png", bottom=0.08, left_out=left_out))

    # Diagnostics: FedLap's lambda and the regularization term per round.
    series = {(s, m): mean_by_round([client_means(r) for r in groups[(dataset, s, m)]])
              for s, methods in panels for m in methods}
    series = {k: df for k, df in series.items() if df is not None}
    quantities = [(c, label) for c, label in
                  (("lambda_mean", r"mean layer dissimilarity $\lambda$ (lambda_mean)"),
                   ("reg_loss", "regularization term (reg_loss)"))
                  if any(c in df and df[c].notna().any() for df in series.values())]
    if quantities:
        fig, axes = plt.subplots(len(quantities), len(panels), figsize=(5.2 * len(panels), 3.4 * len(quantities)),
                                 squeeze=False, sharex="col")
        for i, (col, ylabel) in enumerate(quantities):
            for j, (s, _methods) in enumerate(panels):
                ax = axes[i][j]
                for (s2, m), df in series.items():
                    if s2 == s and col in df and df[col].notna().any():
                        plots.curve(ax, df, col, color=COLORS.get(m), label=METHOD_LABELS.get(m, m))
                if i == 0:
                    ax.set_title(straggler_label(s), fontsize=9)
                if j == 0:
                    ax.set_ylabel(ylabel, fontsize=8)
                if i == len(quantities) - 1:
                    ax.set_xlabel(ROUNDS)
                if ax.lines:
                    ax.legend(fontsize=7)
        written.append(plots.finish(fig, [a for row in axes for a in row],
                                    f"FedLap regularizer diagnostics on {name} (mean over each round's clients, "
                                    "clients.csv)", notes, out / f"{dataset}_diagnostics.png", bottom=0.08))
    return written


# ----------------------------------------------------------------------------- summary table

def acc_at(run: Run, round_: int) -> tuple[float | None, float | None, int]:
    """(test accuracy at the last evaluation at or before ``round_`` (None if the run stopped
    before it), final test accuracy, last round)."""
    df = run.rounds().dropna(subset=["test_acc"])
    if df.empty:
        return None, None, 0
    last = int(df["round"].iloc[-1])
    upto = df[df["round"] <= round_]
    at = float(upto["test_acc"].iloc[-1]) if last >= round_ and len(upto) else None
    return at, float(df["test_acc"].iloc[-1]), last


def mean_to(run: Run, round_: int) -> float | None:
    """The run's mean test accuracy over its evaluations in rounds 1..``round_`` (the paper's "higher
    accuracy in the first 20 communication rounds" read as the area under the curve there); None if
    the run stopped before ``round_``."""
    df = run.rounds().dropna(subset=["test_acc"])
    if df.empty or int(df["round"].iloc[-1]) < round_:
        return None
    return float(df.loc[df["round"] <= round_, "test_acc"].mean())


def _seeds(runs: list[Run]) -> dict:
    """``{seed: run}`` (a later run of a seed replaces an earlier one in path order)."""
    return {r.seed: r for r in sorted(runs, key=lambda r: str(r.path))}


def summary_rows(groups: dict[tuple[str, float, str], list[Run]], round_: int = 20) -> list[dict]:
    """One row per (dataset, stragglers, method) present, in the paper's order, accuracies in %:
    means over the cell's runs (seeds) with the range of the accuracy at ``round_``."""
    rows = []
    for dataset in _order({d for d, _s, _m in groups}, DATASETS):
        for s, methods in _panels(groups, dataset):
            block = []
            for m in methods:
                rs = groups[(dataset, s, m)]
                got = [acc_at(r, round_) for r in rs]
                ats = [g[0] for g in got]
                complete = all(a is not None for a in ats)
                tos = [mean_to(r, round_) for r in rs]
                block.append({"dataset": dataset, "stragglers": s, "method": m,
                              "acc_at_round_pct": tables.mean_pct(ats) if complete else None,
                              "acc_at_round_min_pct": 100 * min(ats) if complete else None,
                              "acc_at_round_max_pct": 100 * max(ats) if complete else None,
                              "round": round_,
                              "mean_acc_to_round_pct": tables.mean_pct(tos) if None not in tos else None,
                              "final_acc_pct": tables.mean_pct(g[1] for g in got),
                              "rounds_run": min((g[2] for g in got), default=0), "n_runs": len(rs),
                              "seeds": ";".join(str(r.seed) for r in rs),
                              "fedlap_lead_at_round_pct": None, "fedlap_lead_to_round_pct": None,
                              "fedlap_lead_final_pct": None, "fedlap_ahead_seeds": None,
                              "run_dir": ";".join(str(r.path) for r in rs),
                              "deviations": "; ".join(sorted({d for r in rs for d in deviations(r)}))})
            _leads(block, {m: groups[(dataset, s, m)] for m in methods}, round_)
            rows += block
    return rows


def _leads(block: list[dict], runs: dict[str, list[Run]], round_: int) -> None:
    """On FedLap's row: its lead over the better of FedProx and FedAvg (means over seeds) at the
    round, over rounds 1..round and final; and ``k of n``, the seeds run by all three methods in
    which FedLap's mean over rounds 1..round beats both (same seed: same clients and batches)."""
    lap = next((b for b in block if b["method"] == "fedlap"), None)
    others = [b for b in block if b["method"] in ("fedprox", "fedavg")]
    if not (lap and others):
        return
    for key, lead in (("acc_at_round_pct", "fedlap_lead_at_round_pct"),
                      ("mean_acc_to_round_pct", "fedlap_lead_to_round_pct"),
                      ("final_acc_pct", "fedlap_lead_final_pct")):
        rivals = [b[key] for b in others if b[key] is not None]
        if lap[key] is not None and rivals:
            lap[lead] = lap[key] - max(rivals)
    by_seed = {b["method"]: _seeds(runs[b["method"]]) for b in [lap] + others}
    common = sorted(set.intersection(*(set(v) for v in by_seed.values())), key=str)
    scores = [{m: mean_to(by_seed[m][seed], round_) for m in by_seed} for seed in common]
    scores = [sc for sc in scores if None not in sc.values()]
    if scores:
        ahead = sum(sc["fedlap"] > max(v for m, v in sc.items() if m != "fedlap") for sc in scores)
        lap["fedlap_ahead_seeds"] = f"{ahead} of {len(scores)}"


def format_summary(rows: list[dict], round_: int) -> str:
    def pct(v):
        return "-" if v is None else f"{half_up(v)}"

    def spread(r):
        if r["acc_at_round_pct"] is None or r["n_runs"] < 2:
            return pct(r["acc_at_round_pct"])
        return (f"{half_up(r['acc_at_round_pct'])} [{half_up(r['acc_at_round_min_pct'])}-"
                f"{half_up(r['acc_at_round_max_pct'])}]")

    def lead(v):
        return "" if v is None else f"{half_up(v, 1, sign=True)}"

    head = ["Dataset", "Stragglers", "Method", f"Acc@{round_} (%)", f"Mean 1-{round_} (%)", "Final (%)", "T", "n",
            f"FedLap lead @{round_}", f"lead 1-{round_}", "lead final", "FedLap ahead"]
    body = [[DATASET_LABELS.get(r["dataset"], r["dataset"]), f"{100 * r['stragglers']:g}%",
             METHOD_LABELS.get(r["method"], r["method"]) + ("*" if r["deviations"] else ""),
             spread(r), pct(r["mean_acc_to_round_pct"]), pct(r["final_acc_pct"]), str(r["rounds_run"]),
             str(r["n_runs"]), lead(r["fedlap_lead_at_round_pct"]), lead(r["fedlap_lead_to_round_pct"]),
             lead(r["fedlap_lead_final_pct"]), r["fedlap_ahead_seeds"] or ""] for r in rows]
    title = (f"FedLap Figs. 1-4 summary: test accuracy at round {round_} (last evaluation at or before it; "
             f"- = the run stopped before; [min-max] over the runs), its mean over rounds 1-{round_} and after "
             f"the last round T, means over n runs (seeds); FedLap lead = FedLap minus the better of FedProx "
             f"and FedAvg (points); FedLap ahead = the seeds in which FedLap's mean over rounds 1-{round_} beats "
             f"both; * = not the paper's setting (see NOTE)")
    return title + "\n" + tables.render(head, body, labels=3, align_head=str.rjust)


# ----------------------------------------------------------------------------- command line

def parser():
    p = plot_parser("plot_fedlap.py", __doc__, out_required=False)
    p.add_argument("--dataset", choices=DATASETS, default=None,
                   help="the dataset tag to plot (default: every dataset found)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                   help=f"methods to overlay (default: {' '.join(METHODS)})")
    p.add_argument("--summary", action="store_true",
                   help="print the accuracy table (at --round and final, per dataset x stragglers x method)")
    p.add_argument("--round", type=round_number, default=20, dest="round_",
                   help="the round of the table's first accuracy column (default 20)")
    p.add_argument("--csv", default=None, help="with --summary: also write the table to this CSV")
    tables.format_option(p)
    return p


@one_line_errors("plot_fedlap")
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.out is None and not args.summary:
        raise UsageError("give --out (figures) and/or --summary (table)")
    folders(args.dirs)
    if args.out:
        writable_folder("--out", Path(args.out))
    if args.csv:
        writable_file("--csv", Path(args.csv))
    runs, skipped = load_tagged(args.dirs, PAPER, ("dataset",))
    runs = [r for r in with_rounds(runs, skipped) if r.method in args.methods and args.dataset in (None, r.dataset)]
    require_runs(runs, skipped, f"FedLap preset runs to draw for dataset={args.dataset or 'any'}", args.dirs)
    unreadable(skipped, "plot_fedlap")
    groups = group(runs, cell)
    if args.summary:
        rows = summary_rows(groups, args.round_)
        with tables.use_format(args.format), tables.latex_only(args.format):
            print(format_summary(rows, args.round_))
            tables.print_notes(NOT_PAPER, count_notes(deviations(r) for r in runs), sys.stdout)
            root, sections = claims_registry.sections_of(args.dirs, SECTIONS)
            if root is not None:  # the committed runs: the figures docs/reproductions.md quotes from them
                claims_registry.print_sections(sections, root, sys.stdout)
            if args.csv:
                tables.write_csv(rows, args.csv, SUMMARY_COLUMNS, ".4g")
    if args.out:
        left_out = stopped_notes(skipped, lambda r: r.dataset, lambda r: f"{METHOD_LABELS.get(r.method, r.method)}, "
                                 f"{straggler_label(stragglers(r))},")
        for dataset in _order({r.dataset for r in runs}, DATASETS):
            for path in plot_dataset(groups, dataset, Path(args.out), left_out.get(dataset, [])):
                print(path)
    return 0

if __name__ == "__main__":
    sys.exit(main())
