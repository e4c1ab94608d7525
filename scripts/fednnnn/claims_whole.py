"""Section ``fednnnn_whole``: FedNNNN's Table 2, MNIST half, on the whole MNIST on a CPU, seed 0,
as far as its runs have gone (``scripts/fednnnn/table2.py run ... --resume``; unfinished runs go on
from the checkpoints packed in the folder's resume.tar.gz)."""
from __future__ import annotations

from scripts.common.claims_core import Data, exact
from scripts.common.claims_registry import claim
from scripts.fednnnn.claims_gpu import FG_METHODS, table2

FW = "fednnnn_whole"
FOLDER = "fednnnn_whole"
CELLS = {"mnist_iid_b": ("iid-b", "IID - B"), "mnist_noniid_b": ("noniid-b", "non-IID - B"),
         "mnist_iid_ub": ("iid-ub", "IID - UB"), "mnist_noniid_ub": ("noniid-ub", "non-IID - UB")}
ROUNDS = 100
NAMES = {m: label.split(" (")[0] for m, label in FG_METHODS.items()}


def runs(data: Data) -> dict[tuple[str, str], object]:
    """{(cell, method): the seed-0 run} of every run that has started."""
    out = {}
    for cell in CELLS:
        if not data.folder(f"{FOLDER}/{cell}").is_dir():
            continue
        for (method, seed, _s, _n), run in data.index(f"{FOLDER}/{cell}").items():
            if seed == 0 and method in FG_METHODS:
                out[cell, method] = run
    return out


@claim("fednnnn_whole.rows", FW, "{rows}")
def _(data):
    """Each cell's run: the round it has reached, its accuracy there and its best so far (with the
    round), beside Table 2's number; a run not started says so."""
    started, rows = runs(data), []
    for cell, (condition, label) in CELLS.items():
        paper = table2(data, "mnist", condition)
        for method, name in NAMES.items():
            run = started.get((cell, method))
            reached = data.reached(run) if run is not None else 0
            if not reached:
                rows.append(f"| {label} | {name} | not started | | | {paper[method]} |")
                continue
            curve = data.curve(run)
            best = max(curve.values())
            best_round = min(r for r, v in curve.items() if v == best)
            rows.append(f"| {label} | {name} | {reached} | {exact(curve[reached])} | {exact(best)} ({best_round}) | "
                        f"{paper[method]} |")
    return {"rows": "\n".join(rows)}


@claim("fednnnn_whole.state", FW, "{state}")
def _(data):
    """How far the 20 runs have gone: finished (100 rounds), under way (the rounds reached), not started."""
    started = runs(data)
    reached = {key: data.reached(run) for key, run in started.items()}
    done = [k for k, r in reached.items() if r >= ROUNDS]
    going = sorted(r for k, r in reached.items() if 0 < r < ROUNDS)
    todo = len(CELLS) * len(NAMES) - len(done) - len(going)
    under = (f"{len(going)} under way (at round {going[0]})" if len(set(going)) == 1 else
             f"{len(going)} under way (at rounds {going[0]} to {going[-1]})") if going else "none under way"
    return {"state": f"{len(done)} of the {len(CELLS) * len(NAMES)} runs have finished their {ROUNDS} rounds, "
                     f"{under}, {todo} not started"}
