#!/usr/bin/env python
"""Reproduce the MNIST and FashionMNIST rows of Table III of NIID-Bench (Li, Diao, Chen, He,
"Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022; code
Xtra-Computing/NIID-Bench): the test accuracy of FedAvg, FedProx, SCAFFOLD and FedNova under the
partitions #C=1, #C=2, #C=3 (quantity-based label imbalance), p_k ~ Dir(0.5) (distribution-based
label imbalance) and IID, side by side with the paper's numbers.

Two modes:

``collect DIR [DIR ...]``
    Find every run directory below the DIRs (a folder with ``summary.json`` and ``config.yaml``),
    file it by (method = ``summary.json`` aggregator, dataset = ``tags.dataset``, partition =
    ``tags.partition``; the ``conf/experiment/niidbench/*`` presets set the tags ``paper: niidbench``,
    ``dataset``, ``partition``), and print Table III laid out as in the paper: a row per dataset and
    partition, a column per method, each cell ``final / best [n] (paper; final - paper)`` in percent:
    the accuracy after the last round and the highest over the rounds, as the mean over the cell's
    runs (seeds) with their standard deviation (``final+-sd``) when there are several, beside the
    paper's number.  ``-`` marks a cell with no run (or no paper number).  ``--csv PATH`` writes a
    long-form CSV (``run``: OUT/niidbench_table3.csv unless ``--csv ''``; ``collect``: none unless
    asked, never into the DIRs it reads) of (method, dataset, partition, ours_pct, paper_pct,
    diff_pct, metric, final_acc_pct, final_sd_pct, best_acc_pct, best_sd_pct, paper_sd_pct,
    n_runs, run_dir, deviations); ``ours_pct`` / ``diff_pct`` hold the accuracy ``--accuracy`` names
    (default ``final``).  The paper reports the mean and standard deviation over three runs; which
    round's accuracy it reports is not stated in what this script's author could read, so both are
    shown.  Runs that depart from the paper's setting (substituted data, smoke scale, fewer rounds:
    read from each run's own config.yaml) are marked ``*`` and listed in a NOTE under the table.

    The paper's numbers (``scripts/paper_targets/niidbench_table3_accuracy.csv``): no number of the
    paper's Table III could be read and verified where this script was written (neither the paper's
    text nor its repository holds the MNIST and FashionMNIST rows in a readable form there), so that
    CSV has every cell with an empty ``accuracy_pct`` and a note, and the paper column reads ``-``.
    Fill it from the paper (``--paper-csv`` reads another copy), never from a reproduction.

    Until then a second table sets ours beside another published result for the same cells, named as
    such and never mixed into the paper column: ``scripts/paper_targets/niidbench_reference_results.csv``
    holds the numbers of Flower's reimplementation of NIID-Bench (adap/flower, baselines/niid_bench,
    README "Expected Results" at commit 6dc7b73 of pull request #2428: one run, seed 42, on the whole
    datasets; its FedProx mu tuned over {0.001, 0.01, 0.1, 1}; the README merged since reports other
    numbers, the best round's mean +- sd over three runs).  The CSV's ``reference_pct`` /
    ``reference_source`` columns carry them.  When the DIRs are the committed grid
    (outputs/reproductions/niidbench), the figures docs/reproductions.md quotes from it follow the
    tables (scripts/claims.py).

``run --out DIR``
    Launch the grid: one ``fedrun -m experiment=niidbench/<dataset>_<partition>
    aggregator=fedavg,fedprox,scaffold,fednova`` per preset, into
    ``DIR/<dataset>_<partition>/<method>_seed<seed>``, then collect ``DIR`` as above.
    ``--population`` adds ``hydra/launcher=population``: the methods and seeds of a preset train
    together (docs/sweeps.md).  ``--smoke`` adds ``scale=smoke`` (3 rounds, 2 local epochs, 1,000
    train / 300 test images: a check that everything runs, not a reproduction).
    ``--substitute mnist=mnist_train10k`` reads the first 10,000 MNIST training images (8,000 train,
    2,000 held out as the test set) in place of MNIST, which is not available offline; the runs keep
    their preset's tags and are marked ``*``.  ``--datasets``, ``--partitions`` and ``--methods``
    pick part of the grid.  Runs already finished in ``DIR`` are not redone; a run that fails is
    reported at the end and not retried.
    Cost (2-core x86 CPU, sequential engine, measured; docs/papers.md): one full-scale round (10
    parties x 10 epochs of the 44,426-parameter CNN at B = 64) took 3.7-3.9 s on ``mnist_train10k``
    (8,000 images, 1,310 local steps; SCAFFOLD 4.7 s, FedNova 3.7 s) and 29.7 s on the whole
    FashionMNIST (60,000 images, 9,410 steps); rounds ran several times slower while other jobs
    shared the cores.  A 50-round run is thus about 3.5 min (MNIST substituted) or 25-30 min
    (FashionMNIST), and the 40 runs of one seed about 10 CPU-hours (about 18 with the whole MNIST);
    three seeds, 1.2 (2.3) CPU-days.  The smoke grid (40 runs) took 7.4 min.

Examples (from the repository root)::

    python scripts/niidbench/table3.py collect outputs/niidbench
    python scripts/niidbench/table3.py run --out outputs/niidbench --substitute mnist=mnist_train10k --seeds 0,1,2
    python scripts/niidbench/table3.py run --smoke --substitute mnist=mnist_train10k --out outputs/niidbench_smoke
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

if not __package__:  # python scripts/niidbench/table3.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.common import claims_registry, grid, tables
from scripts.common.papers import half_up, DIVERGED, group, load_tagged, one_line_errors, setting_deviations
from scripts.niidbench import claims, claims_stragglers, claims_tuned, claims_whole  # noqa: F401  (their sections)

from fedrun.results import METHOD_NAMES, Run

PAPER = "niidbench"
# Table III's columns (methods), in the paper's order, and its rows (dataset, partition).
METHODS = ("fedavg", "fedprox", "scaffold", "fednova")
METHOD_LABELS = {m: METHOD_NAMES[m] for m in METHODS}
DATASETS = ("mnist", "fmnist")
DATASET_LABELS = {"mnist": "MNIST", "fmnist": "FMNIST"}
PARTITIONS = ("dir05", "c1", "c2", "c3", "iid")
PARTITION_LABELS = {"dir05": "p_k~Dir(0.5)", "c1": "#C=1", "c2": "#C=2", "c3": "#C=3", "iid": "IID"}
TABLE_CELLS = [(m, d, p) for d in DATASETS for p in PARTITIONS for m in METHODS]
# The 10 presets in conf/experiment/niidbench, one per (dataset, partition): a row of Table III.
CELLS = {f"{d}_{p}": (d, p) for d in DATASETS for p in PARTITIONS}
# Image shape (channels, size) of the paper's datasets, for a synthetic stand-in the simple CNN accepts.
SHAPES = {"mnist": (1, 28), "fmnist": (1, 28)}

# The paper's setting (sec. V, and its scripts): 10 parties, all every round, 50 rounds, E = 10, B = 64,
# SGD lr 0.01 momentum 0.9, the simple CNN.
PAPER_HYPERPARAMS = {"rounds": 50, "num_clients": 10, "client_fraction": 1.0, "local_epochs": 10,
                     "batch_size": 64, "lr": 0.01, "momentum": 0.9, "optimizer": "sgd"}
PAPER_MODEL = {"_target_": "fedrun.models.nets.SimpleCNN"}
PAPER_CSV = "niidbench_table3_accuracy.csv"  # in scripts/paper_targets: method,dataset,partition,accuracy_pct,...
# Other published results for the same cells, NOT the paper's: source,method,dataset,partition,accuracy_pct,...
REFERENCE_CSV = "niidbench_reference_results.csv"
REFERENCE_LABELS = {"flower": "Flower's NIID-Bench baseline (adap/flower baselines/niid_bench): one run, seed 42, "
                              "the whole dataset"}
CSV_NAME = "niidbench_table3.csv"
# The sections of docs/reproductions.md that ``collect`` prints, by the folder (below
# outputs/reproductions) its DIRs lie in.
SECTIONS = {"niidbench": ("niidbench", "niidbench_readings", "fednova_stragglers", "niidbench_tuned"),
            "niidbench_tuned": ("niidbench_tuned",), "niidbench_whole": ("niidbench_whole",),
            "niidbench_whole_readings": ("niidbench_whole",)}
CSV_COLUMNS = ["method", "dataset", "partition", "ours_pct", "paper_pct", "diff_pct", "metric",
               "final_acc_pct", "final_sd_pct", "best_acc_pct", "best_sd_pct", "paper_sd_pct", "n_runs",
               "n_diverged", "diverged_rounds", "reference_pct", "reference_source", "run_dir", "deviations"]
NOT_PAPER = ("NOTE: these runs do NOT use the paper's setting, so their accuracies are not comparable "
             "with the paper's Table III (see the departures listed):")
SUBSTITUTES = {"mnist_train10k": " (the first 10,000 MNIST training images: 8,000 train, 2,000 held out "
                                 "as the test set, instead of 60,000 / 10,000)",
               "synthetic": " (random class templates: NOT images of digits or clothes)"}


def paper_table(path: str | None = None) -> dict[tuple[str, str, str], tuple[float, float | None]]:
    """Table III of the paper as {(method, dataset, partition): (accuracy %, sd %)}, from
    ``scripts/paper_targets``' transcription (or the CSV at ``path``, ``--paper-csv``); cells whose
    ``accuracy_pct`` is empty (not transcribed) are left out."""
    out = {}
    for r in tables.paper_csv(path, PAPER_CSV):
        if (r.get("accuracy_pct") or "").strip():
            sd = (r.get("std_pct") or "").strip()
            out[(r["method"], r["dataset"], r["partition"])] = (float(r["accuracy_pct"]), float(sd) if sd else None)
    return out


def reference_table(path: str | None = None) -> dict[tuple[str, str, str], tuple[float, str]]:
    """Other published results for Table III's cells (NOT the paper's numbers) as
    {(method, dataset, partition): (accuracy %, source)}, from ``scripts/paper_targets/`` REFERENCE_CSV
    (or the CSV at ``path``).  Today one source: Flower's reimplementation of NIID-Bench, whose README
    reports one run (seed 42) of every MNIST, FashionMNIST and CIFAR-10 cell on the whole datasets."""
    out = {}
    for r in tables.paper_csv(path, REFERENCE_CSV):
        if (r.get("accuracy_pct") or "").strip():
            out[(r["method"], r["dataset"], r["partition"])] = (float(r["accuracy_pct"]), r["source"])
    return out


def load_runs(dirs: list[str]) -> tuple[list[Run], list]:
    """The NIID-Bench preset runs under ``dirs`` (tagged with a dataset and partition), and the skipped."""
    return load_tagged(dirs, PAPER, ("dataset", "partition"))


def cell(run: Run) -> tuple[str, str, str]:
    """The Table III cell of a run: (method, dataset, partition)."""
    return run.method, run.dataset, run.tags.get("partition")


def deviations(run: Run) -> list[str]:
    """How ``run`` departs from the paper's setting (empty: the paper's setting)."""
    return setting_deviations(run, PAPER_HYPERPARAMS, model=PAPER_MODEL)


# ----------------------------------------------------------------------------- collect

def _sd(values: list[float]) -> float | None:
    """The standard deviation over a cell's runs (as the paper's +-), None for fewer than two."""
    return statistics.stdev(values) if len(values) > 1 else None


def table3_rows(runs: list[Run], paper: dict, accuracy: str = "final", reference: dict | None = None,
                diverged: list[Run] = ()) -> list[dict]:
    """One long-form row per Table III cell (40 rows, missing cells included), in the paper's order;
    ``reference`` (``reference_table()``) fills ``reference_pct`` / ``reference_source``; the runs
    of ``diverged`` (NaN or Inf: no final model) are counted per cell (``n_diverged``, and the rounds
    they diverged at), apart from the means, which are over the finished runs."""
    cells = group(runs, cell)
    stopped = group(diverged, cell)
    reference = reference or {}
    rows = []
    for key in TABLE_CELLS:
        seeds = [r for r in cells.get(key, []) if r.accuracy("final") is not None]
        final = [100 * r.accuracy("final") for r in seeds]
        best = [100 * r.accuracy("best") for r in seeds if r.accuracy("best") is not None]
        ref, ref_sd = paper.get(key, (None, None))
        ours = tables.mean(final if accuracy == "final" else best)
        rows.append({
            **dict(zip(("method", "dataset", "partition"), key)),
            "ours_pct": ours, "paper_pct": ref, "diff_pct": tables.minus(ours, ref), "metric": f"{accuracy}_test_acc",
            "final_acc_pct": tables.mean(final), "final_sd_pct": _sd(final),
            "best_acc_pct": tables.mean(best), "best_sd_pct": _sd(best), "paper_sd_pct": ref_sd,
            "n_runs": len(seeds), "n_diverged": len(stopped.get(key, [])),
            "diverged_rounds": ";".join(str((r.stopped or {}).get("round")) for r in stopped.get(key, [])),
            "reference_pct": reference.get(key, (None, None))[0],
            "reference_source": reference.get(key, (None, None))[1],
            "run_dir": ";".join(str(r.path) for r in seeds),
            "deviations": "; ".join(sorted({d for r in seeds for d in deviations(r)})),
        })
    return rows


def _ours(row: dict) -> tuple[float | None, str, str]:
    """A cell's final accuracy (unrounded: the cells round it, and the differences are taken on it),
    its ``+-sd`` (over several runs) and its `` +k div`` (k runs diverged); the text is empty where
    there is none."""
    sd = "" if row["final_sd_pct"] is None else f"+-{half_up(row['final_sd_pct'])}"
    div = f" +{row['n_diverged']} div" if row.get("n_diverged") else ""
    return row["final_acc_pct"], sd, div


def format_cell(row: dict) -> str:
    """``final / best [n] (paper; final - paper)`` in % with one decimal, ``final+-sd`` over several
    runs; ``-`` where there is no run or no paper number."""
    paper = "-" if row["paper_pct"] is None else f"{half_up(row['paper_pct'])}" + (
        "" if row["paper_sd_pct"] is None else f"+-{half_up(row['paper_sd_pct'])}")
    final, sd, div = _ours(row)
    if row["n_runs"] == 0:
        return f"-{div} ({paper}; -)"
    text = f"{half_up(final)}{sd} / " + ("-" if row["best_acc_pct"] is None else f"{half_up(row['best_acc_pct'])}")
    text += (f" [{row['n_runs']}]" if row["n_runs"] > 1 else "") + ("*" if row["deviations"] else "") + div
    diff = "-" if row["paper_pct"] is None else f"{half_up(final - row['paper_pct'], 1, sign=True)}"
    return f"{text} ({paper}; {diff})"


def format_table(rows: list[dict], accuracy: str = "final") -> str:
    """Table III as text: a row per (dataset, partition), a column per method."""
    lookup = {(r["method"], r["dataset"], r["partition"]): r for r in rows}
    body = [[DATASET_LABELS[d], PARTITION_LABELS[p]] + [format_cell(lookup[(m, d, p)]) for m in METHODS]
            for d in DATASETS for p in PARTITIONS]
    text = tables.render(["dataset", "partition"] + [METHOD_LABELS[m] for m in METHODS], body, labels=2)
    title = ("NIID-Bench Table III: test accuracy (%), each cell: ours final / ours best = highest over the rounds "
             "(paper; final - paper); +-sd and [n] over n runs (seeds); * = not the paper's setting (see NOTE); "
             "+k div = k more runs diverged (NaN or Inf, listed below; not in the mean); "
             f"- = no run or no paper number.  CSV ours_pct/diff_pct: the {accuracy} test accuracy (--accuracy).")
    return title + "\n" + text


def format_reference_table(rows: list[dict]) -> str:
    """The rows that have both a run of ours and another published result, as
    ``ours final+-sd (reference; final - reference)``, with each source named: a second opinion while
    the paper's numbers are missing, never a substitute for them."""
    shown = [r for r in rows if (r["n_runs"] or r["n_diverged"]) and r["reference_pct"] is not None]
    if not shown:
        return ""
    lookup = {(r["method"], r["dataset"], r["partition"]): r for r in shown}
    body = []
    for d in DATASETS:
        for p in PARTITIONS:
            if not any((m, d, p) in lookup for m in METHODS):
                continue
            line = [DATASET_LABELS[d], PARTITION_LABELS[p]]
            for m in METHODS:
                r = lookup.get((m, d, p))
                if r is None:
                    line.append("-")
                    continue
                final, sd, div = _ours(r)
                if not r["n_runs"]:  # every run of the cell diverged: nothing to compare
                    line.append(f"-{div} ({half_up(r['reference_pct'])}; -)")
                    continue
                line.append(f"{half_up(final)}{sd}{'*' if r['deviations'] else ''}{div} "
                            f"({half_up(r['reference_pct'])}; {half_up(final - r['reference_pct'], 1, sign=True)})")
            body.append(line)
    sources = sorted({r["reference_source"] for r in shown})
    named = "; ".join(f"{s} = {REFERENCE_LABELS.get(s, s)}" for s in sources)
    title = ("Beside another published result (NOT the paper's Table III): ours final (reference; final - "
             "reference), * = not the paper's setting, +k div = k runs diverged.  "
             f"Reference: {named}.  Cells with no run of ours: left out.")
    return title + "\n" + tables.render(["dataset", "partition"] + [METHOD_LABELS[m] for m in METHODS], body, labels=2)


def collect(dirs: list[str], accuracy: str = "final", csv_path: str | None = None,
            paper_csv: str | None = None, out=None, reference_csv: str | None = None,
            need_runs: bool = False) -> list[dict]:
    """Find, file, print and write Table III for the runs under ``dirs``; return the long-form rows.
    ``need_runs`` (the collect mode): no finished run of the paper is one line, not a table of dashes."""
    out = out or sys.stdout
    runs, skipped = load_runs(dirs)
    tables.require(runs, skipped, "NIID-Bench", dirs, need_runs)
    paper = paper_table(paper_csv)
    diverged = [Run.load(path) for path, why in skipped if why.startswith(DIVERGED)]
    rows = table3_rows(runs, paper, accuracy, reference_table(reference_csv), diverged)
    print(format_table(rows, accuracy), file=out)
    second = format_reference_table(rows)
    if second:
        print("\n" + second, file=out)
    if not paper:
        print(f"\nThe paper's numbers: none transcribed in {paper_csv or 'scripts/paper_targets/' + PAPER_CSV} "
              "(not verified where the script was written); the paper column reads -.", file=out)
    tables.report(runs, skipped, rows, dirs, cell=cell, table_cells=TABLE_CELLS, table="Table III",
                  paper="NIID-Bench", deviations=deviations, not_paper=NOT_PAPER, out=out)
    tables.write_csv(rows, csv_path, CSV_COLUMNS, ".4f", out)
    root, sections = claims_registry.sections_of(dirs, SECTIONS)
    if root is not None:  # the committed grid: the figures docs/reproductions.md quotes from it
        claims_registry.print_sections(sections, root, out)
    return rows


# ----------------------------------------------------------------------------- run

def run_grid(args) -> int:
    """Launch every requested preset (skipping runs already done in ``--out``), then collect."""
    substitutes = dict(args.substitute)

    def command(out: Path, column: str, methods: list[str], seeds: list[str]) -> list[str]:
        dataset = CELLS[column][0]
        overrides = [*grid.substitute_overrides(substitutes.get(dataset), SHAPES[dataset]),
                     *(["scale=smoke"] if args.smoke else [])]
        return grid.sweep_command(f"niidbench/{column}", methods, seeds, overrides, args.set, out / column,
                                  args.population)

    banner = []
    if args.smoke:
        banner.append("SMOKE SCALE (scale=smoke: 3 rounds, 2 local epochs, 1000 train / 300 test images): a "
                      "check that the pipeline runs, NOT the paper's setting (50 rounds, 10 local epochs).")
    for real, option in substitutes.items():
        banner.append(f"SUBSTITUTED DATA: {real} runs read dataset={option}{SUBSTITUTES.get(option, '')}, "
                      f"not the real {real}.")
    columns = [c for c, (d, p) in CELLS.items() if d in args.datasets and p in args.partitions]
    return grid.run_sweeps(args, columns, command, banner, lambda out: collect(
        [str(out)], args.accuracy, tables.run_csv(args, out, CSV_NAME), args.paper_csv))


# ----------------------------------------------------------------------------- command line

def parser():
    p, c, r = tables.table_parser(
        "niidbench_table3.py", __doc__, "Table III", CSV_NAME, "<dataset>_<partition>/<method>_seed<seed>",
        "Launch one `fedrun -m` per Table III row (all four methods), then collect.", PAPER_CSV, DATASETS,
        "run conf/dataset OPTION in place of DATASET (not available offline), e.g. mnist=mnist_train10k; "
        "repeatable. The runs are marked as substituted")
    tables.accuracy_option(c, r)
    r.add_argument("--smoke", action="store_true",
                   help=f"add {tables.SMOKE}")
    r.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS), metavar="DATASET",
                   help=f"which datasets (default both: {', '.join(DATASETS)})")
    r.add_argument("--partitions", nargs="+", choices=PARTITIONS, default=list(PARTITIONS), metavar="PARTITION",
                   help=f"which partitions (default all 5: {', '.join(PARTITIONS)})")
    r.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                   help=f"which aggregators (default all 4: {', '.join(METHODS)})")
    return p


@one_line_errors("niidbench_table3")
def main(argv: list[str] | None = None) -> int:
    return tables.table_main(parser().parse_args(argv), run_grid,
                             lambda a, csv_path: collect(a.dirs, a.accuracy, csv_path, a.paper_csv,
                                                         need_runs=True))


if __name__ == "__main__":
    sys.exit(main())
