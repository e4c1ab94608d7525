"""Section ``niidbench_tuned``: FedProx's mu tuned per NIID-Bench cell by scripts/common/tune.py."""
from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from fedrun.results import Run, read_rounds

from scripts.common.claims_core import Data, SEEDS, aggregator, bound_up, exact, fmt, joined, load_run, mean, pct
from scripts.common.claims_registry import claim
from scripts.niidbench.claims import PARTITIONS, cell_mean, nb


# ----------------------------------------------------------------------------- NIID-Bench, FedProx's mu tuned

NT = "niidbench_tuned"
NT_CELLS = PARTITIONS  # every cell's FedProx mu was tuned (outputs/reproductions/niidbench_tuned/fedprox_mnist_<cell>)
NT_LAST = 10  # the objective: mean validation accuracy over the last 10 rounds (mean_val_acc_last_10)
NT_PRESET = "0.01"  # the presets' mu: the FedProx column of the grid above
NT_LABELS = {"dir05": "p_k ~ Dir(0.5)", "c1": "#C=1", "c2": "#C=2", "c3": "#C=3", "iid": "IID"}


def nt_folder(data: Data, cell: str) -> Path:
    return data.folder(f"niidbench_tuned/fedprox_mnist_{cell}")


def nt_choice(data: Data, cell: str) -> dict:
    import json

    c = json.loads((nt_folder(data, cell) / "choice.json").read_text())
    if c["objective"] != f"mean_val_acc_last_{NT_LAST}" or c["chosen"] is None:
        raise ValueError(f"{cell}: choice.json has objective {c['objective']}, chosen {c['chosen']}")
    return c


def nt_chosen(data: Data, cell: str) -> str:
    return nt_choice(data, cell)["chosen"]["aggregator.mu"]


def nt_tuned(data: Data, cell: str) -> list[Run]:
    """FedProx at the cell's chosen mu, seeds 0-2 on the test set: the protocol's test runs (where
    the choice is the presets' 0.01, the grid's FedProx runs have the same setting but were made by
    an earlier fedrun: see niidbench_tuned.test)."""
    mu = nt_chosen(data, cell)
    runs = [load_run(nt_folder(data, cell) / "test" / f"mu{mu}_seed{s}") for s in SEEDS]
    for r in runs:
        if float(aggregator(r, "mu")) != float(mu):
            raise ValueError(f"{r.path}: mu {aggregator(r, 'mu')}, not the chosen {mu}")
    return runs


def nt_scores(data: Data, cell: str) -> dict[str, Decimal]:
    """{mu: score} of a cell's grid: each tuning run's mean validation accuracy over the last 10
    rounds (%, exact, recomputed from its rounds.csv), checked against choice.json's float."""
    c = nt_choice(data, cell)
    (_key, values), = c["grid"].items()
    out = {}
    for value, row in zip(values, c["rows"]):
        df = read_rounds(nt_folder(data, cell) / "tune" / f"mu{value}_seed0")
        score = mean(pct(a) for a in list(df["val_acc"].dropna())[-NT_LAST:])
        if abs(float(score) - 100 * row["mean"]) > 1e-6:
            raise ValueError(f"{cell}, mu {value}: choice.json's score {row['mean']} is not the run's {score}")
        out[value] = score
    return out


@claim("niidbench_tuned.grid", NT, "{rows}")
def _(data):
    """Per cell: every mu of NIID-Bench's grid scored by its tuning run's mean validation accuracy
    over the last 10 rounds (%, recomputed from rounds.csv and checked against choice.json), and
    the chosen mu (the best)."""
    rows = []
    for cell in NT_CELLS:
        c = nt_choice(data, cell)
        (key, values), = c["grid"].items()
        cells = [f"{value}: {fmt(score, 2)}" for value, score in nt_scores(data, cell).items()]
        best = max(zip(values, c["rows"]), key=lambda vr: vr[1]["mean"])[0]
        if c["chosen"][key] != best:
            raise ValueError(f"{cell}: the choice {c['chosen'][key]} is not the best point {best}")
        tuned = [data.final(r) for r in nt_tuned(data, cell)]
        shown = ", ".join("diverged" if v is None else exact(v) for v in tuned)
        done = [v for v in tuned if v is not None]
        rows.append(f"| {NT_LABELS[cell]} | {', '.join(cells)} | {best} | {shown} | "
                    f"{fmt(mean(done))} | {fmt(cell_mean(data, cell, 'fedprox'))} | {fmt(cell_mean(data, cell, 'fedavg'))} |")
    return {"rows": "\n".join(rows)}


@claim("niidbench_tuned.picks", NT, "The validation split picks mu = {picks}")
def _(data):
    """Which mu each cell's validation split picks, grouped by mu (smallest first), the presets'
    0.01 named as such."""
    chosen = {cell: nt_chosen(data, cell) for cell in NT_CELLS}
    groups = []
    for mu in sorted(set(chosen.values()), key=float):
        cells = joined(NT_LABELS[c] for c in NT_CELLS if chosen[c] == mu)
        preset = " (the presets')" if mu == NT_PRESET else ""
        groups.append(f"{mu}{preset} under {cells}")
    return {"picks": joined(groups)}


@claim("niidbench_tuned.close", NT, "Under IID the best three of the four mu score within {iid} points of each other, "
       "under Dir(0.5) the best two within {dir05}")
def _(data):
    """The spread of the best validation scores (%, mean over the last 10 rounds, exact from the
    tuning runs' rounds.csv) where the split hardly separates the mu: IID's best three, Dir(0.5)'s
    best two (bounds: rounded up)."""
    def spread(cell, top):
        scores = sorted(nt_scores(data, cell).values(), reverse=True)[:top]
        return bound_up(scores[0] - scores[-1], 2)
    return {"iid": spread("iid", 3), "dir05": spread("dir05", 2)}


@claim("niidbench_tuned.versus", NT, "Where the tuned mu is not the presets', FedProx at it ends above FedProx at 0.01 "
       "in {above_preset} of {n} (cell, seed) pairs and above FedAvg in {above_avg} of {n}")
def _(data):
    """Over the cells whose chosen mu is not 0.01 and their seeds: the tuned FedProx's final
    accuracy against the grid's FedProx (mu 0.01) and FedAvg of the same seed (a diverged run
    counts as below)."""
    above_preset = above_avg = n = 0
    for cell in NT_CELLS:
        if nt_chosen(data, cell) == NT_PRESET:
            continue
        for t, p, a in zip(nt_tuned(data, cell), nb(data, cell, "fedprox"), nb(data, cell, "fedavg")):
            t, p, a = (data.final(r) for r in (t, p, a))
            n += 1
            above_preset += t is not None and (p is None or t > p)
            above_avg += t is not None and (a is None or t > a)
    return {"above_preset": above_preset, "above_avg": above_avg, "n": n}


@claim("niidbench_tuned.moves", NT, "In the means, the tuned mu moves FedProx by {dir05}, {c3} and {iid} points under "
       "Dir(0.5), #C=3 and IID, and by {c1} under #C=1")
def _(data):
    """Where the chosen mu is not 0.01: FedProx's mean final accuracy at it minus the grid's mean at
    0.01 (points, signed, two decimals)."""
    out = {}
    for cell in ("dir05", "c3", "iid", "c1"):
        if nt_chosen(data, cell) == NT_PRESET:
            raise ValueError(f"{cell}: the tuned mu is the presets'")
        d = mean(data.final(r) for r in nt_tuned(data, cell)) - cell_mean(data, cell, "fedprox")
        out[cell] = ("+" if d > 0 else "") + fmt(d, 2)
    return out


@claim("niidbench_tuned.test", NT, "The protocol's test runs of #C=2 (mu = {mu}, the presets') equal the grid's FedProx "
       "runs in every column of rounds.csv but the timings, in {n} of 3 seeds")
def _(data):
    """#C=2, whose chosen mu is the grid's: the protocol's test runs against the grid's FedProx
    runs of the same seeds, column by column (those both CSVs have, the ``*_s`` timings left out)."""
    mu = nt_chosen(data, "c2")
    same = 0
    for test, grid_run in zip(nt_tuned(data, "c2"), nb(data, "c2", "fedprox")):
        if float(mu) != float(aggregator(grid_run, "mu")):
            raise ValueError(f"the tuned mu {mu} is not the grid's {aggregator(grid_run, 'mu')}")
        a, b = read_rounds(test.path), read_rounds(grid_run.path)
        columns = [c for c in b.columns if c in a.columns and not c.endswith("_s")]
        same += a[columns].equals(b[columns])
    return {"mu": mu, "n": same}
