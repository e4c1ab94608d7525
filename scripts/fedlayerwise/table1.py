#!/usr/bin/env python
"""Reproduce Table I of FedLayerWise (Lanjewar, Tran, Tran: "Layer-Wise Adaptive Weighting for
Faster Convergence in Federated Learning"): the number of communication rounds FedLayerWise,
FedAdp and FedAvg need to reach 95% accuracy on MNIST, in the scenarios "5 IID + 5 non-IID" and
"2 IID + 8 non-IID", side by side with the paper's numbers.

Two modes:

``collect DIR [DIR ...]``
    Find every run directory below the DIRs (a folder with ``summary.json`` and ``config.yaml``),
    file it by (method = ``summary.json`` aggregator, scenario = ``tags.scenario``; the
    ``conf/experiment/fedlayerwise/*`` presets set the tags ``paper: fedlayerwise``, ``dataset``,
    ``scenario``), and print Table I laid out as in the paper: rows FedLayerWise, FedAdp, FedAvg,
    columns the two scenarios, each cell ``ours (paper, ours - paper)`` in rounds.  *Ours* is the
    first round whose ``test_acc`` in ``rounds.csv`` is >= ``--target`` (default 0.95; ``--metric
    val_acc`` reads the validation accuracy instead, for runs with hyperparams.validation_fraction
    > 0).  A run that never gets there reads ``not reached in T (final x%)``, T being its last
    round; its difference is then only bounded, ``>+k`` (T - paper), or ``-`` when T is below the
    paper's number.  Several runs of one cell (seeds) are averaged over those that reached the
    target, and ``[11, 12, -]`` lists each run's rounds in seed order (``-``: not reached).  ``-``
    marks a cell with no run.  ``--csv PATH`` writes a long-form CSV (``run``: OUT/fedlayerwise_table1.csv
    unless ``--csv ''``; ``collect``: none unless asked, never into the DIRs it reads) of (method, scenario, target, metric,
    ours_rounds, paper_rounds, diff_rounds, n_runs, n_reached, rounds_run, final_acc_pct,
    per_run_rounds, run_dir: the runs' folders relative to the CSV's, deviations).  Runs that depart from the paper's setting (substituted
    data, fewer rounds, other client data sizes: read from each run's config.yaml) are marked ``*``
    and listed in a NOTE under the table.  The paper's numbers exist for 95% only; with another
    ``--target`` the paper column is ``-``.

``run --out DIR``
    Launch the grid: one ``fedrun -m experiment=fedlayerwise/mnist_<scenario>
    aggregator=fedavg,fedadp,fedlayerwise`` per scenario, into ``DIR/<scenario>/<method>_seed<seed>``,
    then collect ``DIR`` as above (``--population``: each scenario's runs trained together, with
    ``hydra/launcher=population``).  ``--substitute mnist=mnist_train10k`` reads the first 10,000
    MNIST training images (8,000 train / 2,000 held-out test: enough for the paper's 10 clients x
    600 samples) in place of the full MNIST, which is not available offline; the runs keep their
    preset's tags and are marked ``*``.  ``--smoke`` adds ``scale=smoke`` (3 rounds, 1,000 train /
    300 test images) and ``partition.samples_per_client=60`` (the smoke subset cannot give 10
    clients 600 samples each): a check that everything runs, not a reproduction, and 95% is not
    reached in 3 rounds.  Runs already finished in ``DIR`` are not redone; a run that failed
    (a config error, a divergence) is reported and not retried (delete its folder to redo it).
    Known limit: with ``mnist_train10k`` the 2 IID + 8 non-IID split of 10 x 600 samples cannot be
    built for some seeds (1, 3, 4 and 9 among 0-9: two non-IID clients holding digit 5 plus the IID
    clients need 720 of the 711 fives); those runs fail with a partition error.
    Cost on a 2-core x86 CPU, one thread a run (``--set threads=1``) and two runs at a time: a
    paper-scale round of the 582,026-parameter CNN (10 clients x 38 Adam steps) takes about 4.7 s,
    a 30-round run 2 to 3.5 minutes, the whole grid with 3 seeds (18 runs) about 25 minutes.

Examples (from the repository root)::

    python scripts/fedlayerwise/table1.py collect outputs/fedlayerwise
    python scripts/fedlayerwise/table1.py collect outputs/fedlayerwise --target 0.9
    python scripts/fedlayerwise/table1.py run --substitute mnist=mnist_train10k --out outputs/fedlayerwise
    python scripts/fedlayerwise/table1.py run --smoke --substitute mnist=mnist_train10k \\
        --scenarios 5iid_5noniid --out outputs/fedlayerwise_smoke            # CPU check
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # python scripts/fedlayerwise/table1.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.common import claims_registry, grid, tables
from scripts.common.papers import half_up, fraction, group, load_tagged, one_line_errors, setting_deviations
from scripts.fedlayerwise import claims  # noqa: F401  (its section)

from fedrun.errors import ConfigError
from fedrun.results import METHOD_NAMES, Run, require_column

PAPER = "fedlayerwise"
# Table I's rows (in the paper's order), columns and display names.
METHODS = ("fedlayerwise", "fedadp", "fedavg")
METHOD_LABELS = {m: METHOD_NAMES[m] for m in METHODS}
SCENARIOS = ("5iid_5noniid", "2iid_8noniid")
SCENARIO_LABELS = {"5iid_5noniid": "5 IID + 5 non-IID", "2iid_8noniid": "2 IID + 8 non-IID"}
TABLE_CELLS = [(m, s) for m in METHODS for s in SCENARIOS]
IID_CLIENTS = {"5iid_5noniid": 5, "2iid_8noniid": 2}
# The presets in conf/experiment/fedlayerwise, one per scenario.
PRESETS = {s: f"mnist_{s}" for s in SCENARIOS}
PAPER_TARGET = 0.95
PAPER_CSV = "fedlayerwise_table1_rounds_to_95pct.csv"  # in scripts/paper_targets
# The sections of docs/reproductions.md that ``collect`` prints, by the folder (below
# outputs/reproductions) its DIRs lie in.
SECTIONS = {"fedlayerwise/table1": ("fedlayerwise",)}

# The paper's setting (sec. IV.A): 10 clients, all every round, E = 1, B = 16, Adam lr 0.005, T = 30,
# 600 samples per client, the 582,026-parameter CNN (5x5 conv 32, 5x5 conv 64, FC 1024-512-10).
PAPER_HYPERPARAMS = {"rounds": 30, "num_clients": 10, "client_fraction": 1.0, "local_epochs": 1,
                     "batch_size": 16, "lr": 0.005, "optimizer": "adam", "stragglers": 0.0, "dropouts": 0.0}
PAPER_MODEL = {"_target_": "fedrun.models.nets.MnistCNN", "channels": [32, 64], "hidden": 512}
SMOKE_OVERRIDES = ["scale=smoke", "partition.samples_per_client=60"]
CSV_NAME = "fedlayerwise_table1.csv"
CSV_COLUMNS = ["method", "scenario", "target", "metric", "ours_rounds", "paper_rounds", "diff_rounds",
               "n_runs", "n_reached", "rounds_run", "final_acc_pct", "per_run_rounds", "run_dir", "deviations"]
NOT_PAPER = ("NOTE: these runs do NOT use the paper's setting, so their round counts are not comparable "
             "with the paper's Table I (see the departures listed):")
# What a substitute for MNIST is, for the NOTE on launched runs.
SUBSTITUTES = {"mnist_train10k": " (the first 10,000 MNIST training images: 8,000 train, 2,000 held out "
                                 "as the test set, instead of 60,000 / 10,000)",
               "synthetic": " (random class templates: NOT digits)"}


def paper_table(path: str | None = None) -> dict[tuple[str, str], int]:
    """Table I of the paper as {(method, scenario): rounds to 95%}: ``scripts/paper_targets``'
    transcription, or the CSV at ``path`` (``--paper-csv``).  Scenarios as in the tags
    (``5iid_5noniid``; the targets CSV writes ``5iid+5noniid``)."""
    return {(r["method"], r["scenario"].replace("+", "_")): int(r["rounds_to_95pct_accuracy"])
            for r in tables.paper_csv(path, PAPER_CSV)}


def load_runs(dirs: list[str]) -> tuple[list[Run], list]:
    """The FedLayerWise preset runs under ``dirs`` (tagged with a scenario), and the skipped."""
    return load_tagged(dirs, PAPER, ("scenario",))


def cell(run: Run) -> tuple[str, str]:
    """The Table I cell of a run: (method, scenario)."""
    return run.method, run.tags.get("scenario")


def deviations(run: Run) -> list[str]:
    """How ``run`` departs from the paper's setting for its scenario (empty: the paper's setting)."""
    partition = {"_target_": "fedrun.data.partition.mixed", "samples_per_client": 600}
    scenario = run.tags.get("scenario")
    if scenario in IID_CLIENTS:
        partition["iid_clients"] = IID_CLIENTS[scenario]
    return setting_deviations(run, PAPER_HYPERPARAMS, data="mnist", model=PAPER_MODEL, partition=partition)


# ----------------------------------------------------------------------------- collect

def rounds_to(run: Run, target: float = PAPER_TARGET, metric: str = "test_acc") -> dict:
    """``{"round": first round with metric >= target or None, "T": last evaluated round,
    "final": metric after the last round}`` from ``rounds.csv`` (rounds not evaluated are skipped);
    from ``summary.json`` (test accuracy only) when there is no ``rounds.csv``."""
    df = run.rounds()
    if df is None:
        reached = (run.summary.get("rounds_to_accuracy") or {}).get(f"{target:g}")
        return {"round": reached, "T": int(run.summary.get("rounds", 0)), "final": run.accuracy("final")}
    if metric not in df:
        raise ConfigError("--metric", metric, f"{run.path / 'rounds.csv'} has no such column")
    df = df.dropna(subset=[metric])
    if df.empty:
        return {"round": None, "T": 0, "final": None}
    hit = df[df[metric] >= target]
    return {"round": int(hit["round"].iloc[0]) if len(hit) else None, "T": int(df["round"].iloc[-1]),
            "final": float(df[metric].iloc[-1])}


def table1_rows(runs: list[Run], paper: dict, target: float = PAPER_TARGET, metric: str = "test_acc") -> list[dict]:
    """One long-form row per Table I cell (6 rows, missing cells included), in the paper's order."""
    cells = group(runs, cell)
    rows = []
    for key in TABLE_CELLS:
        seeds = sorted(cells.get(key, []), key=lambda r: (str(r.seed), str(r.path)))
        results = [rounds_to(r, target, metric) for r in seeds]
        reached = [x["round"] for x in results if x["round"] is not None]
        ours = tables.mean(reached)
        ref = paper.get(key) if abs(target - PAPER_TARGET) < 1e-12 else None
        rows.append({
            "method": key[0], "scenario": key[1], "target": target, "metric": metric,
            "ours_rounds": ours, "paper_rounds": ref, "diff_rounds": tables.minus(ours, ref),
            "n_runs": len(seeds), "n_reached": len(reached),
            "rounds_run": max((x["T"] for x in results), default=None),
            "final_acc_pct": tables.mean_pct(x["final"] for x in results),
            "per_run_rounds": ";".join("-" if x["round"] is None else str(x["round"]) for x in results),
            "run_dir": ";".join(str(r.path) for r in seeds),
            "deviations": "; ".join(sorted({d for r in seeds for d in deviations(r)})),
        })
    return rows


def _num(x: float, sign: str = "") -> str:
    """A round count (or difference) without a decimal when whole."""
    return f"{x:{sign}.0f}" if float(x).is_integer() else half_up(x, 1, sign=sign == "+")


def format_cell(row: dict) -> str:
    """``ours (paper, ours - paper)`` in rounds; ``not reached in T (final x%)`` when no run reached
    the target; ``-`` where there is no run (or no paper value)."""
    paper = "-" if row["paper_rounds"] is None else f"{row['paper_rounds']}"
    star = "*" if row["deviations"] else ""
    n, k = row["n_runs"], row["n_reached"]
    if n == 0:
        return f"- ({paper}, -)"
    if k == 0:
        T = row["rounds_run"]
        final = "-" if row["final_acc_pct"] is None else f"{half_up(row['final_acc_pct'])}%"
        text = f"not reached in {T} (final {final}{f', mean of {n}' if n > 1 else ''}){star}"
        # Never reached in T rounds: the run needs more than T, so ours - paper > T - paper.
        diff = "-" if row["paper_rounds"] is None or T < row["paper_rounds"] else f">{T - row['paper_rounds']:+d}"
        return f"{text} ({paper}, {diff})"
    # Several runs (seeds): each one's rounds, in seed order ("-": not reached), so the spread shows.
    each = f" [{row['per_run_rounds'].replace(';', ', ')}]" if n > 1 else ""
    text = _num(row["ours_rounds"]) + each + star
    diff = "-" if row["diff_rounds"] is None else _num(row["diff_rounds"], "+")
    return f"{text} ({paper}, {diff})"


def format_table(rows: list[dict]) -> str:
    """Table I as text: the paper's layout (methods x scenarios)."""
    lookup = {(r["method"], r["scenario"]): r for r in rows}
    body = [[METHOD_LABELS[m]] + [format_cell(lookup[(m, s)]) for s in SCENARIOS] for m in METHODS]
    text = tables.render(["Fed Methods"] + [SCENARIO_LABELS[s] for s in SCENARIOS], body)
    target, metric = rows[0]["target"], rows[0]["metric"]
    title = (f"FedLayerWise Table I: communication rounds to reach {100 * target:g}% {metric.replace('_', ' ')} "
             f"on MNIST; each cell: ours (paper, ours - paper); several runs: their mean over the runs "
             f"that reached it [each run's rounds, in seed order; - = not reached]; "
             f"* = not the paper's setting (see NOTE); - = no run")
    if abs(target - PAPER_TARGET) > 1e-12:
        title += f"\n(the paper's numbers are for {100 * PAPER_TARGET:g}%: none shown for {100 * target:g}%)"
    return title + "\n" + text


def collect(dirs: list[str], target: float = PAPER_TARGET, metric: str = "test_acc", csv_path: str | None = None,
            paper_csv: str | None = None, out=None, need_runs: bool = False) -> list[dict]:
    """Find, file, print and write Table I for the runs under ``dirs``; return the long-form rows.
    ``need_runs`` (the collect mode): no finished run of the paper, or none with a value of
    ``metric``, is one line, not a table of dashes."""
    out = out or sys.stdout
    runs, skipped = load_runs(dirs)
    tables.require(runs, skipped, "FedLayerWise", dirs, need_runs)
    if need_runs and metric != "test_acc":  # test_acc is in summary.json too; another metric only in rounds.csv
        require_column([r.rounds() for r in runs], metric, "--metric")
    rows = table1_rows(runs, paper_table(paper_csv), target, metric)
    print(format_table(rows), file=out)
    tables.report(runs, skipped, rows, dirs, cell=cell, table_cells=TABLE_CELLS, table="Table I",
                  paper="FedLayerWise", deviations=deviations, not_paper=NOT_PAPER, out=out)
    tables.write_csv(rows, csv_path, CSV_COLUMNS, ".4g", out)
    root, sections = claims_registry.sections_of(dirs, SECTIONS)
    if root is not None:  # the committed grid: the figures docs/reproductions.md quotes from it
        claims_registry.print_sections(sections, root, out)
    return rows


# ----------------------------------------------------------------------------- run

def run_grid(args) -> int:
    """Launch every requested scenario (skipping runs already in ``--out``), then collect."""
    option = dict(args.substitute).get("mnist")
    overrides = [*grid.substitute_overrides(option, (1, 28)), *(SMOKE_OVERRIDES if args.smoke else [])]

    def command(out: Path, scenario: str, methods: list[str], seeds: list[str]) -> list[str]:
        return grid.sweep_command(f"fedlayerwise/{PRESETS[scenario]}", methods, seeds, overrides, args.set,
                                  out / scenario, args.population)

    banner = []
    if args.smoke:
        banner.append("SMOKE SCALE (" + " ".join(SMOKE_OVERRIDES) + ": 3 rounds, 1,000 train / 300 test "
                      "images, 60 per client instead of 600): a check that the pipeline runs, NOT the "
                      "paper's setting (30 rounds, 600 samples per client); 95% will not be reached.")
    if option:
        banner.append(f"SUBSTITUTED DATA: runs read dataset={option}{SUBSTITUTES.get(option, '')}, not the real MNIST.")
    return grid.run_sweeps(args, args.scenarios, command, banner, lambda out: collect(
        [str(out)], args.target, args.metric, tables.run_csv(args, out, CSV_NAME), args.paper_csv))


# ----------------------------------------------------------------------------- command line

def parser() -> argparse.ArgumentParser:
    p, c, r = tables.table_parser(
        "fedlayerwise_table1.py", __doc__, "Table I", CSV_NAME, "<scenario>/<method>_seed<seed>",
        "Launch one `fedrun -m` per Table I column (all methods), then collect.", PAPER_CSV, ("mnist",),
        "run conf/dataset OPTION in place of MNIST (not available offline), e.g. mnist=mnist_train10k. The runs "
        "are marked as substituted", "mnist=OPTION")
    for q in (c, r):
        q.add_argument("--target", type=fraction, default=PAPER_TARGET,
                       help="accuracy to reach, a fraction (default 0.95, the paper's; the paper's numbers "
                            "are shown for 0.95 only)")
        q.add_argument("--metric", choices=("test_acc", "val_acc"), default="test_acc",
                       help="rounds.csv column compared with the target (default test_acc; val_acc needs "
                            "runs with hyperparams.validation_fraction > 0)")
    r.add_argument("--smoke", action="store_true",
                   help="add " + " ".join(SMOKE_OVERRIDES) + " (3 rounds, 1,000 train images, 60 per "
                        "client): checks the pipeline, is not the paper's setting")
    r.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), metavar="SCENARIO",
                   help=f"which presets of conf/experiment/fedlayerwise (default both: {', '.join(SCENARIOS)})")
    r.add_argument("--methods", nargs="+", choices=METHODS, default=["fedavg", "fedadp", "fedlayerwise"],
                   metavar="METHOD", help="which aggregators (default all 3: fedavg fedadp fedlayerwise)")
    return p


@one_line_errors("fedlayerwise_table1")
def main(argv: list[str] | None = None) -> int:
    return tables.table_main(parser().parse_args(argv), run_grid,
                             lambda a, csv_path: collect(a.dirs, a.target, a.metric, csv_path, a.paper_csv,
                                                         need_runs=True))


if __name__ == "__main__":
    sys.exit(main())
