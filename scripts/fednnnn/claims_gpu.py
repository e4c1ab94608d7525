"""Section ``fednnnn_gpu``: FedNNNN's Table 2, MNIST non-IID unbalanced column, one GPU run."""
from __future__ import annotations

import csv
from decimal import Decimal
from pathlib import Path

from fedrun.results import Run

from scripts.common.claims_core import Data, exact, fmt, load_run
from scripts.common.claims_registry import claim


# ----------------------------------------------------------------------------- FedNNNN on a GPU

FG = "fednnnn_gpu"
GPU_DRAW = "fednnnn_gpu/h200_2026-11-27"  # scripts/bench/gpu_check.sh draw on one NVIDIA H200
TABLE2_CSV = Path("scripts") / "paper_targets" / "fednnnn_table2_accuracy.csv"
FG_METHODS = {"fedavg": "FedAvg", "fedprox": "FedProx (mu = 0.02)", "normnorm": "Norm-Norm", "momentum": "Momentum",
              "fednnnn": "FedNNNN"}


def table2(data: Data, dataset: str = "mnist", condition: str = "noniid-ub") -> dict[str, Decimal]:
    """Table 2's accuracies (%) of one column: {method: %}."""
    with open(data.root / TABLE2_CSV, newline="") as f:
        return {r["method"]: Decimal(r["accuracy_pct"]) for r in csv.DictReader(f)
                if r["dataset"] == dataset and r["condition"] == condition}


def gpu_column(data: Data) -> dict[str, Run]:
    """The draw's Table 2 column, seed 0: {method: run}."""
    return {m: data.run(f"{GPU_DRAW}/column", m, 0) for m in FG_METHODS}


@claim("fednnnn_gpu.rows", FG, "{rows}")
def _(data):
    """Each method's accuracy at round 10 and at its last round (best and its round) beside
    Table 2's; every run reached the same last round."""
    paper, runs = table2(data), gpu_column(data)
    last = {max(data.curve(r)) for r in runs.values()}
    if last != {21}:
        raise ValueError(f"the column's runs stopped at rounds {sorted(last)}, not all at 21")
    rows = []
    for m, label in FG_METHODS.items():
        curve = data.curve(runs[m])
        best = max(curve.values())
        best_round = min(r for r, v in curve.items() if v == best)
        rows.append(f"| {label} | {exact(curve[10])} | {exact(curve[21])} ({exact(best)}, {best_round}) | {paper[m]} |")
    return {"rows": "\n".join(rows)}


@claim("fednnnn_gpu.order", FG, "At round 21 {here}; Table 2 (round 100) has {paper}")
def _(data):
    """The five runs ordered by their round-21 accuracy, and Table 2's order of the same column."""
    paper, runs = table2(data), gpu_column(data)
    names = {m: label.split(" (")[0] for m, label in FG_METHODS.items()}

    def ordered(score) -> list[str]:
        return [names[m] for m in sorted(FG_METHODS, key=score, reverse=True)]
    here = ordered(lambda m: data.at(runs[m], 21))
    there = ordered(lambda m: paper[m])
    return {"here": "the order is " + ", ".join(here), "paper": ", ".join(there)}


@claim("fednnnn_gpu.preset", FG, "FedNNNN alone (the `preset` step, 25 rounds) reached {final}% (best {best}%, "
       "round {round})")
def _(data):
    """The preset step's run: its last round (25) and best accuracy."""
    run = load_run(data.folder(GPU_DRAW) / "preset")
    curve = data.curve(run)
    if max(curve) != 25:
        raise ValueError(f"the preset run stopped at round {max(curve)}")
    best = max(curve.values())
    return {"final": exact(curve[25]), "best": exact(best), "round": min(r for r, v in curve.items() if v == best)}


@claim("fednnnn_gpu.gaps", FG, "FedAvg, Momentum and FedNNNN are within {lo} to {hi} points of the paper's "
       "round-100 figure already, while the paper's FedProx ends {paper_gap} points under FedAvg; here FedProx "
       "trails FedAvg by {gap} points at round 21")
def _(data):
    """|round 21 - Table 2| for FedAvg, Momentum and FedNNNN (exact: accuracies on 10,000 test
    images against Table 2's two decimals, so the range's ends are the values themselves); Table
    2's FedAvg - FedProx; the runs' FedAvg - FedProx at round 21."""
    paper, runs = table2(data), gpu_column(data)
    gaps = [abs(data.at(runs[m], 21) - paper[m]) for m in ("fedavg", "momentum", "fednnnn")]
    gap = data.at(runs["fedavg"], 21) - data.at(runs["fedprox"], 21)
    if gap <= 0:
        raise ValueError("FedProx does not trail FedAvg at round 21")
    return {"lo": exact(min(gaps)), "hi": exact(max(gaps)), "paper_gap": fmt(paper["fedavg"] - paper["fedprox"]),
            "gap": exact(gap)}
