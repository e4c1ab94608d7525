#!/usr/bin/env python
"""Reproduce Table 2 of FedNNNN (Nagura, Bian, Sato): test accuracy of FedAvg, FedProx,
Norm-Norm, Momentum and FedNNNN on MNIST and CIFAR10 under IID / non-IID x balanced (B) /
unbalanced (UB), side by side with the paper's numbers.

Two modes:

``collect DIR [DIR ...]``
    Find every run directory below the DIRs (a folder with ``summary.json`` and ``config.yaml``),
    file it by (method = ``summary.json`` aggregator, dataset = ``tags.dataset``, condition =
    ``tags.condition``; the ``conf/experiment/fednnnn/*`` presets set the tags), and print Table 2
    laid out as in the paper: rows FedAvg ... FedNNNN, columns the 4 conditions x 2 datasets, each
    cell ``final / best@rR (paper; final - paper / best - paper)`` in percent: the accuracy after
    the last round, the highest accuracy over the rounds and the round R where it was first reached
    (``summary.json``'s ``best_round``, else the first maximum of ``rounds.csv``'s ``test_acc``;
    ``r?`` when neither is known), beside the paper's number.  Several runs of one cell (seeds) are
    averaged (final and best separately); ``[n]`` gives their count and ``rA-B`` the range of their
    best rounds.  ``-`` marks a cell with no run.  ``--csv PATH`` writes a long-form CSV (``run``:
    OUT/fednnnn_table2.csv unless ``--csv ''``; ``collect``: none unless asked, never into the DIRs
    it reads) of (method,dataset,condition,ours_pct,paper_pct,diff_pct,run_dir,n_runs,metric,deviations, then
    final_acc_pct,best_acc_pct,best_round,final_diff_pct,best_diff_pct,closer); ``ours_pct`` /
    ``diff_pct`` / ``metric`` hold the value chosen by ``--accuracy`` (default ``final``),
    ``best_round`` is one round, or the seeds' rounds joined by ``;`` in ``run_dir``'s order;
    ``closer`` says which of final and best is nearer the paper's number (``tie`` if equally near).
    Runs that depart from the paper's setting (substituted data, fewer rounds or clients: read from
    each run's own config.yaml) are marked ``*`` and listed in a NOTE under the table.

Which accuracy the paper's Table 2 holds (printed as a footnote under the table).
    The paper never names it: Table 2 is captioned "Summary of Accuracy Results" and Section 5.2
    says only that "the accuracy comparisons ... are summarized in Table 2".  The one metric its
    experiments name is the tuning criterion, Section 5.1 (Settings): "The hyperparameters η, λ, μ,
    β, γ were chosen to have the highest accuracy on the test data over the training rounds."  The
    table reports the runs so selected, so its numbers most plausibly are that same quantity: the
    BEST test accuracy over the rounds (an inference, not a statement of the paper; the appendix's
    "The accuracy of the final result has also been improved" describes the curves, not the table).
    The footnote also counts, over the cells whose runs are at the paper's setting (no ``*``), in
    how many cells our final and our best accuracy is the closer to the paper's number.  That count
    is evidence only at the paper's scale, and is biased: where our runs fall short of the paper,
    best (>= final) is closer whichever the paper used.

``run --out DIR``
    Launch the grid: one ``fedrun -m experiment=fednnnn/<cell> aggregator=<5 methods>`` per cell,
    into ``DIR/<cell>/<method>_seed<seed>``, then collect ``DIR`` as above.  ``--population`` adds
    ``hydra/launcher=population``: the methods and seeds of a cell train together, each run with
    the results it has alone on the batched engine (docs/sweeps.md).  ``--smoke`` adds
    ``scale=smoke`` (3 rounds, 2 local epochs, 1000/300 samples: a check that everything runs, not a
    reproduction).  ``--substitute DATASET=OPTION`` runs another ``conf/dataset`` option in place
    of a dataset that is not available (offline machines): ``cifar10=cifar10_jpeg`` reads all of
    CIFAR-10 from its JPEG quality-75 copy (shown everywhere as "CIFAR-10 (JPEG q75 copy)"; what
    the copy costs: docs/reproductions.md); ``cifar10=synthetic`` passes
    ``dataset=synthetic dataset.channels=3 dataset.image_size=32`` (random class templates of
    CIFAR-10's shape, so the CIFAR-10 CNN is unchanged); ``mnist=mnist_train10k`` passes
    ``dataset=mnist_train10k`` (the first 10,000 MNIST training images, 20% held out as test set).
    The runs keep their preset's tags, so they land in the cell they stand for, marked ``*``.
    Runs already finished in ``DIR`` are not redone.  A run that fails (e.g. diverges) is reported
    at the end and not retried; the sweep's other runs go on.
    Cost: the smoke grid is 40 runs; on 2 busy CPU cores it took 56 min (MNIST ~30 s a run, the
    CIFAR-10 CNN ~2 min a run); ``--cells`` / ``--methods`` pick a subset for a quicker check.

Examples (from the repository root)::

    python scripts/fednnnn/table2.py collect outputs/multirun
    python scripts/fednnnn/table2.py collect outputs/table2 --accuracy best
    python scripts/fednnnn/table2.py run --out outputs/table2                     # full scale (GPU)
    python scripts/fednnnn/table2.py run --smoke --substitute cifar10=synthetic \\
        --substitute mnist=mnist_train10k --out outputs/table2_smoke            # CPU check
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # python scripts/fednnnn/table2.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.common import grid, tables
from scripts.common.papers import half_up, group, load_tagged, one_line_errors, setting_deviations

from fedrun.moved import current_target
from fedrun.results import METHOD_NAMES, Run

PAPER = "fednnnn"
# The paper's rows (Table 2 order), columns and display names.
METHODS = ("fedavg", "fedprox", "normnorm", "momentum", "fednnnn")
METHOD_LABELS = {m: METHOD_NAMES[m] for m in METHODS}
DATASETS = ("mnist", "cifar10")
DATASET_LABELS = {"mnist": "MNIST", "cifar10": "CIFAR10"}
CONDITIONS = ("iid-b", "noniid-b", "iid-ub", "noniid-ub")
CONDITION_LABELS = {"iid-b": "IID - B", "noniid-b": "non-IID - B", "iid-ub": "IID - UB",
                    "noniid-ub": "non-IID - UB"}
# Table 2's cells (method, dataset, condition) in the paper's order: rows, then conditions, then datasets.
TABLE_CELLS = [(m, d, c) for m in METHODS for c in CONDITIONS for d in DATASETS]
# The 8 presets in conf/experiment/fednnnn, one per (dataset, condition): a column of Table 2.
CELLS = {f"{d}_{c.replace('-', '_')}": (d, c) for d in DATASETS for c in CONDITIONS}

# Table 1 (common settings) of the paper: what a full-scale run of each dataset uses.
TABLE1 = {
    "mnist": {"rounds": 100, "num_clients": 100, "client_fraction": 1.0, "local_epochs": 5,
              "batch_size": 50, "lr": 0.05, "weight_decay": 0.0},
    "cifar10": {"rounds": 250, "num_clients": 100, "client_fraction": 1.0, "local_epochs": 5,
                "batch_size": 50, "lr": 0.05, "weight_decay": 5.0e-4},
}
# The paper's CNNs (Table 3: MNIST, Table 4: CIFAR10), as fedrun's model classes.
MODELS = {"mnist": "fedrun.models.nets.MnistCNN", "cifar10": "fedrun.models.nets.Cifar10CNN"}
# Image shape (channels, size) of each paper dataset, for a synthetic stand-in the paper's CNN accepts.
SHAPES = {"mnist": (1, 28), "cifar10": (3, 32)}
PAPER_CSV = "fednnnn_table2_accuracy.csv"  # in scripts/paper_targets: method,dataset,condition,accuracy_pct
CSV_NAME = "fednnnn_table2.csv"
CSV_COLUMNS = ["method", "dataset", "condition", "ours_pct", "paper_pct", "diff_pct", "run_dir",
               "n_runs", "metric", "deviations",
               "final_acc_pct", "best_acc_pct", "best_round", "final_diff_pct", "best_diff_pct", "closer"]
# Which accuracy the paper's Table 2 appears to hold, and why (see the module docstring).
PAPER_METRIC = "best"
PAPER_EVIDENCE = (
    'Section 5.1 (Settings): "The hyperparameters eta, lambda, mu, beta, gamma were chosen to have the '
    'highest accuracy on the test data over the training rounds." [Greek symbols spelled out]',
    'Table 2 ("Summary of Accuracy Results") and Section 5.2 name no metric; the table reports the runs '
    'so selected, so its numbers are most plausibly their highest accuracy over the rounds '
    '(an inference: the paper does not say final or best).',
)
NOT_PAPER = ("NOTE: these runs do NOT use the paper's setting, so their accuracies are not comparable "
             "with the paper's Table 2 (see the departures listed):")


def paper_table(path: str | None = None) -> dict[tuple[str, str, str], float]:
    """Table 2 of the paper as {(method, dataset, condition): accuracy %}: ``scripts/paper_targets``'
    transcription, or the CSV at ``path`` (``--paper-csv``)."""
    return {(r["method"], r["dataset"], r["condition"]): float(r["accuracy_pct"])
            for r in tables.paper_csv(path, PAPER_CSV)}


def load_runs(dirs: list[str]) -> tuple[list[Run], list]:
    """The FedNNNN preset runs under ``dirs`` (tagged with a dataset and condition), and the skipped."""
    return load_tagged(dirs, PAPER, ("dataset", "condition"))


def cell(run: Run) -> tuple[str, str, str]:
    """The Table 2 cell of a run: (method, dataset, condition), from summary.json and the preset's tags."""
    return run.method, run.dataset, run.tags.get("condition")


def deviations(run: Run) -> list[str]:
    """How ``run`` departs from the paper's setting (Table 1, the paper's CNN, the real dataset):
    short phrases, empty for a run at the paper's scale on the paper's data."""
    out = setting_deviations(run, TABLE1.get(run.dataset, {}))
    model = current_target((run.config.get("model") or {}).get("_target_"))  # runs of the earlier layout too
    if model and run.dataset in MODELS and model != MODELS[run.dataset]:
        out.append(f"model {model.rsplit('.', 1)[-1]} (paper {MODELS[run.dataset].rsplit('.', 1)[-1]})")
    return out


# ----------------------------------------------------------------------------- collect

def best_round(run: Run) -> int | None:
    """The round of ``run``'s best test accuracy: ``summary.json``'s ``best_round`` (what fedrun
    writes), else the first round of ``rounds.csv`` whose ``test_acc`` is the maximum, provided
    that maximum is the summary's ``best_test_acc``; None when neither is known."""
    value = run.summary.get("best_round")
    if value is not None:
        return int(value)
    df = run.rounds()
    if df is None or "test_acc" not in df:
        return None
    df, best = df.dropna(subset=["test_acc"]), run.accuracy("best")
    if df.empty or (best is not None and abs(float(df["test_acc"].max()) - best) > 1e-9):
        return None
    return int(df.loc[df["test_acc"].idxmax(), "round"])


def _shown(value: float | None) -> float | None:
    """A percentage as printed (one decimal), so that differences check by hand."""
    return None if value is None else round(value, 1)


def closer(final: float | None, best: float | None, paper: float | None) -> str:
    """Which of our (printed) final and best accuracy is nearer the paper's: final, best, tie or ''."""
    if final is None or best is None or paper is None:
        return ""
    d_final, d_best = abs(_shown(final) - paper), abs(_shown(best) - paper)
    if abs(d_final - d_best) < 1e-9:
        return "tie"
    return "final" if d_final < d_best else "best"


def _best_rounds(runs: list[Run]):
    """The seeds' best rounds: one round, or all of them joined by ``;`` (``?`` where unknown)."""
    rounds = [best_round(r) for r in runs if r.accuracy("best") is not None]
    if not rounds:
        return None
    if len(set(rounds)) == 1 and None not in rounds:
        return rounds[0]
    return ";".join("?" if x is None else str(x) for x in rounds)


def table2_rows(runs: list[Run], paper: dict, accuracy: str = "final") -> list[dict]:
    """One long-form row per Table 2 cell (40 rows, missing cells included), in the paper's order.

    Each row has both ``final_acc_pct`` and ``best_acc_pct`` (means over the cell's runs) with
    ``best_round``; ``ours_pct`` / ``diff_pct`` repeat the one named by ``accuracy``.
    """
    cells = group(runs, cell)
    rows = []
    for key in TABLE_CELLS:
        seeds = [r for r in cells.get(key, []) if r.accuracy("final") is not None or r.accuracy("best") is not None]
        final = tables.mean_pct(r.accuracy("final") for r in seeds)
        best = tables.mean_pct(r.accuracy("best") for r in seeds)
        ref = paper.get(key)
        ours = final if accuracy == "final" else best
        rows.append({
            **dict(zip(("method", "dataset", "condition"), key)),
            "ours_pct": ours, "paper_pct": ref, "diff_pct": tables.minus(ours, ref),
            "run_dir": ";".join(str(r.path) for r in seeds), "n_runs": len(seeds), "metric": f"{accuracy}_test_acc",
            "deviations": "; ".join(sorted({d for r in seeds for d in deviations(r)})),
            "final_acc_pct": final, "best_acc_pct": best, "best_round": _best_rounds(seeds),
            "final_diff_pct": tables.minus(final, ref), "best_diff_pct": tables.minus(best, ref),
            "closer": closer(final, best, ref),
        })
    return rows


def _round_text(rnd) -> str:
    """``r7``; the range ``r3-9`` of several seeds' rounds; ``r?`` where unknown."""
    if rnd is None:
        return "r?"
    if isinstance(rnd, int):
        return f"r{rnd}"
    known = sorted(int(x) for x in str(rnd).split(";") if x != "?")
    if not known or "?" in str(rnd).split(";"):
        return "r?" if not known else f"r{known[0]}-{known[-1]}?"
    return f"r{known[0]}" if known[0] == known[-1] else f"r{known[0]}-{known[-1]}"


def format_cell(row: dict) -> str:
    """``final / best@rR (paper; final - paper / best - paper)`` in % with one decimal; ``-`` where
    there is no run (or no paper value).

    The printed differences are taken between the printed (rounded) values, so they check by hand.
    """
    paper = "-" if row["paper_pct"] is None else f"{half_up(row['paper_pct'])}"
    if row["n_runs"] == 0:
        return f"- ({paper}; -)"
    final, best = _shown(row["final_acc_pct"]), _shown(row["best_acc_pct"])
    text = ("-" if final is None else f"{half_up(final)}") + " / " + \
        ("-" if best is None else f"{half_up(best)}@{_round_text(row['best_round'])}")
    text += (f" [{row['n_runs']}]" if row["n_runs"] > 1 else "") + ("*" if row["deviations"] else "")

    def diff(v):
        return "-" if v is None or row["paper_pct"] is None else f"{half_up(v - row['paper_pct'], 1, sign=True)}"

    return f"{text} ({paper}; {diff(final)} / {diff(best)})"


def which_is_closer(rows: list[dict]) -> dict:
    """Over the cells with runs at the paper's setting (no deviations) and a paper value: in how
    many our final / our best accuracy is the closer to the paper's, and the mean |ours - paper|."""
    usable = [r for r in rows if r["closer"] and not r["deviations"]]
    count = {k: sum(r["closer"] == k for r in usable) for k in ("final", "best", "tie")}
    mean = {k: tables.mean([abs(_shown(r[f"{k}_acc_pct"]) - r["paper_pct"]) for r in usable])
            for k in ("final", "best")}
    verdict = None if count["final"] == count["best"] else max(("final", "best"), key=count.get)
    return {"cells": len(usable), "count": count, "mean_abs_diff": mean, "verdict": verdict,
            "excluded": sum(1 for r in rows if r["closer"] and r["deviations"])}


def footnote(rows: list[dict]) -> str:
    """Which accuracy the paper's numbers appear to be: from its text, and from these runs."""
    ev = which_is_closer(rows)
    lines = [f"Which accuracy is the paper's? Its Table 2 appears to hold the {PAPER_METRIC.upper()} test "
             f"accuracy over the rounds (from the paper's text, not stated outright):"]
    lines += [f"  - {e}" for e in PAPER_EVIDENCE]
    if ev["cells"]:
        c, m = ev["count"], ev["mean_abs_diff"]
        runs = (f"these runs: best is closer to the paper in {c['best']}, final in {c['final']}, tie in "
                f"{c['tie']} of the {ev['cells']} cell(s) at the paper's setting (mean |ours - paper|: final "
                f"{half_up(m['final'], 2)}, best {half_up(m['best'], 2)})")
        if ev["verdict"] is None:
            runs += " -> the runs cannot tell"
        else:
            runs += (f" -> the runs point to {ev['verdict'].upper()}"
                     f" ({'agrees' if ev['verdict'] == PAPER_METRIC else 'disagrees'} with the text)")
    else:
        runs = "these runs: no cell at the paper's setting, so they cannot tell final from best"
    if ev["excluded"]:
        runs += f"; {ev['excluded']} cell(s) marked * left out"
    lines.append(f"  - {runs}. Caveat: where our runs fall short of the paper, best (>= final) is closer "
                 f"whichever the paper used.")
    return "\n".join(lines)


def format_table(rows: list[dict], accuracy: str = "final") -> str:
    """Table 2 as text: the paper's layout (methods x (condition, dataset))."""
    lookup = {(r["method"], r["dataset"], r["condition"]): r for r in rows}
    body = [[METHOD_LABELS[m]] + [format_cell(lookup[(m, d, c)]) for c in CONDITIONS for d in DATASETS]
            for m in METHODS]
    head = [""] + [DATASET_LABELS[d] for _c in CONDITIONS for d in DATASETS]
    text = tables.render(head, body, groups=[(CONDITION_LABELS[c], len(DATASETS)) for c in CONDITIONS])
    title = ("FedNNNN Table 2: test accuracy (%), each cell: ours final / ours best@rR = highest over the "
             "rounds, first reached in round R (paper; final - paper / best - paper); [n] = mean of n runs "
             "(rA-B: their best rounds); * = not the paper's setting (see NOTE); - = no run.\n"
             f"The paper's numbers appear to be the {PAPER_METRIC} accuracy (see the footnote). "
             f"CSV ours_pct/diff_pct: the {accuracy} test accuracy (--accuracy).")
    return title + "\n" + text + "\n\n" + footnote(rows)


def collect(dirs: list[str], accuracy: str = "final", csv_path: str | None = None,
            paper_csv: str | None = None, out=None, need_runs: bool = False) -> list[dict]:
    """Find, file, print and write Table 2 for the runs under ``dirs``; return the long-form rows.
    ``need_runs`` (the collect mode): no finished run of the paper is one line, not a table of dashes."""
    out = out or sys.stdout
    runs, skipped = load_runs(dirs)
    tables.require(runs, skipped, "FedNNNN", dirs, need_runs)
    rows = table2_rows(runs, paper_table(paper_csv), accuracy)
    print(format_table(rows, accuracy), file=out)
    tables.report(runs, skipped, rows, dirs, cell=cell, table_cells=TABLE_CELLS, table="Table 2", paper="FedNNNN",
                  deviations=deviations, not_paper=NOT_PAPER, out=out)
    tables.write_csv(rows, csv_path, CSV_COLUMNS, ".4f", out)
    return rows


# ----------------------------------------------------------------------------- run

def run_grid(args) -> int:
    """Launch every requested cell (skipping runs already done in ``--out``), then collect."""
    substitutes = dict(args.substitute)

    def overrides(dataset: str) -> list[str]:
        return grid.substitute_overrides(substitutes.get(dataset), SHAPES[dataset])

    def command(out: Path, column: str, methods: list[str], seeds: list[str]) -> list[str]:
        return grid.sweep_command(f"fednnnn/{column}", methods, seeds,
                                  [*overrides(CELLS[column][0]), *(["scale=smoke"] if args.smoke else [])],
                                  args.set, out / column, args.population)

    banner = []
    if args.smoke:
        banner.append("SMOKE SCALE (scale=smoke: 3 rounds, 2 local epochs, 1000 train / 300 test samples): a "
                      "check that the pipeline runs, NOT the paper's Table 1 setting.")
    for real, option in substitutes.items():
        banner.append(f"SUBSTITUTED DATA: {real} runs read dataset={option} ({' '.join(overrides(real))}), "
                      f"not the real {real}.")
    return grid.run_sweeps(args, args.cells or list(CELLS), command, banner, lambda out: collect(
        [str(out)], args.accuracy, tables.run_csv(args, out, CSV_NAME), args.paper_csv))


# ----------------------------------------------------------------------------- command line

def parser():
    p, c, r = tables.table_parser(
        "fednnnn_table2.py", __doc__, "Table 2", CSV_NAME, "<cell>/<method>_seed<seed>",
        "Launch one `fedrun -m` per Table 2 column (all methods), then collect.", PAPER_CSV, DATASETS,
        "run conf/dataset OPTION in place of DATASET (not available offline), e.g. cifar10=cifar10_jpeg (CIFAR-10's "
        "JPEG q75 copy), cifar10=synthetic (adds "
        "dataset.channels=3 dataset.image_size=32) or mnist=mnist_train10k; repeatable. The runs are marked as "
        "substituted")
    tables.accuracy_option(c, r)
    r.add_argument("--smoke", action="store_true",
                   help=f"add {tables.SMOKE}")
    r.add_argument("--cells", nargs="+", choices=list(CELLS), default=None, metavar="CELL",
                   help=f"which presets of conf/experiment/fednnnn (default: all 8: {', '.join(CELLS)})")
    r.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                   help=f"which aggregators (default: all 5: {', '.join(METHODS)})")
    return p


@one_line_errors("fednnnn_table2")
def main(argv: list[str] | None = None) -> int:
    return tables.table_main(parser().parse_args(argv), run_grid,
                             lambda a, csv_path: collect(a.dirs, a.accuracy, csv_path, a.paper_csv,
                                                         need_runs=True))


if __name__ == "__main__":
    sys.exit(main())
