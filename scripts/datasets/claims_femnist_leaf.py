"""Section ``femnist_leaf``: FEMNIST's writers as clients on LEAF's own files (``experiment=femnist/leaf``:
LEAF's CNN, 10 of 105 writers a round, 30 rounds; outputs/reproductions/femnist_leaf), FedAvg, FedProx,
SCAFFOLD and FedNova over seeds 0, 1 and 2: the doc's table (rewritten by ``claims.py --write``; it
names the seeds that have finished), the data the runs trained on, their
time a round, and how the methods compare."""
from __future__ import annotations

from decimal import Decimal

from fedrun.results import Run

from scripts.common.claims_core import Data, dec, fmt, joined, mean, pct, sd, thousands
from scripts.common.claims_registry import claim

FL = "femnist_leaf"
FL_METHODS = {"fedavg": "FedAvg", "fedprox": "FedProx (mu = 1)", "scaffold": "SCAFFOLD", "fednova": "FedNova"}
FL_NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova"}


def fl_runs(data: Data, method: str) -> list[Run]:
    """A method's runs that have started, in seed order (none before the folder exists)."""
    return data.runs(FL, method) if data.folder(FL).is_dir() else []


def fl_finished(data: Data, method: str) -> list[Run]:
    return [r for r in fl_runs(data, method) if r.finished]


def spread(values: list[Decimal], digits: int = 1) -> str:
    """``mean +- sd`` over the seeds (the sample standard deviation), the mean alone for one value."""
    return fmt(mean(values), digits) + (f" +- {fmt(sd(values), digits)}" if len(values) > 1 else "")


def last_row(data: Data, run: Run):
    """The last round's row of rounds.csv (its per-writer columns: the round's 10 sampled writers)."""
    return data.rounds(run).iloc[-1]


@claim("femnist_leaf.table", FL, "{rows}")
def _(data):
    """Per method over its finished seeds: the final and the best round's test accuracy (% of the
    test images of all 184 writers), and the last round's per-writer accuracy (each of its 10
    sampled writers scored on its own test images: their mean and the worst 10%, i.e. the worst
    writer), each as mean +- sd over seeds, and which seeds have finished (a run part way is left
    out: the table changes only when a run ends)."""
    rows = ["| method | final test acc % | best test acc % | per-writer acc %, mean | per-writer acc %, worst 10% | seeds |",
            "|---|---|---|---|---|---|"]
    for method, label in FL_METHODS.items():
        done = fl_finished(data, method)
        if done:
            finals = [data.final(r) for r in done]
            bests = [data.best(r) for r in done]
            means = [pct(last_row(data, r)["client_acc_mean"]) for r in done]
            worst = [pct(last_row(data, r)["client_acc_worst10"]) for r in done]
            cells = [spread(finals), spread(bests), spread(means), spread(worst)]
        else:
            cells = ["-"] * 4
        seeds = ", ".join(str(r.seed) for r in done) or "none finished"
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {seeds} |")
    return {"rows": "\n".join(rows)}


def fl_all(data: Data) -> list[Run]:
    runs = [r for m in FL_METHODS for r in fl_finished(data, m)]
    if not runs:
        raise ValueError(f"{data.folder(FL)}: no finished run")
    return runs


@claim("femnist_leaf.data", FL,
       "the {writers} writers that have training images hold {images} of them, {lo} to {hi} a writer")
def _(data):
    """The partition every finished run trained on (partition.csv, the same in every run: natural
    clients do not depend on the seed): how many writers, their training images together, and the
    fewest and most a writer holds."""
    parts = [data.partition(r) for r in fl_all(data)]
    first = parts[0]
    if any(not p.equals(first) for p in parts[1:]):
        raise ValueError("the runs' partition.csv differ: they did not train on the same writers")
    n = first["examples"]
    return {"writers": len(first), "images": thousands(int(n.sum())), "lo": int(n.min()), "hi": int(n.max())}


@claim("femnist_leaf.time", FL, "{mean} s a round on average (the runs' means: {lo} to {hi} s)")
def _(data):
    """The wall-clock time of a round (rounds.csv wall_s: training, evaluation and per-writer
    scoring), averaged over every round of every finished run, and the fastest and slowest run's mean."""
    per_run = [mean(dec(float(x)) for x in data.rounds(r)["wall_s"]) for r in fl_all(data)]
    every = [dec(float(x)) for r in fl_all(data) for x in data.rounds(r)["wall_s"]]
    return {"mean": fmt(mean(every)), "lo": fmt(min(per_run)), "hi": fmt(max(per_run))}


def fl_finals(data: Data) -> dict[str, dict[int, Decimal]]:
    """{method: {seed: final accuracy %}} over the seeds every method has finished (all three once
    the grid has run; the doc says which); empty dicts while no seed has."""
    done = {m: {r.seed: data.final(r) for r in fl_finished(data, m)} for m in FL_METHODS}
    common = sorted(set.intersection(*(set(d) for d in done.values())))
    return {m: {s: done[m][s] for s in common} for m in FL_METHODS}


NONE_YET = "No seed has finished for all four methods yet."


def seeds_text(seeds) -> str:
    seeds = list(seeds)
    return f"seed{'s' if len(seeds) > 1 else ''} {joined([str(s) for s in seeds])}"


@claim("femnist_leaf.order", FL, "{text}")
def _(data):
    """The methods sorted by their mean final test accuracy over the seeds every method has
    finished, highest first (a tie on the exact means joined by "="): the order the doc states."""
    finals = fl_finals(data)
    if not finals["fedavg"]:
        return {"text": NONE_YET}
    ranked = sorted(FL_METHODS, key=lambda m: mean(finals[m].values()), reverse=True)
    parts = [FL_NAMES[ranked[0]]]
    for a, b in zip(ranked, ranked[1:]):
        tie = mean(finals[a].values()) == mean(finals[b].values())
        parts.append(("= " if tie else "> ") + FL_NAMES[b])
    return {"text": f"By mean final accuracy over {seeds_text(finals['fedavg'])} the order is {' '.join(parts)}."}


@claim("femnist_leaf.pairs", FL, "{text}")
def _(data):
    """Per method against FedAvg, seed by seed over the seeds every method has finished (a seed
    gives both the same writers, batches and initial model): in how many of them its final accuracy
    is above FedAvg's, and the smallest and largest difference in points (its final minus FedAvg's)."""
    finals = fl_finals(data)
    seeds = list(finals["fedavg"])
    if not seeds:
        return {"text": ""}
    items = []
    for m in ("fedprox", "scaffold", "fednova"):
        diffs = [finals[m][s] - finals["fedavg"][s] for s in seeds]
        above = sum(d > 0 for d in diffs)
        span = fmt(diffs[0]) if len(diffs) == 1 else f"{fmt(min(diffs))} to {fmt(max(diffs))}"
        items.append(f"{FL_NAMES[m]} ends above FedAvg in {above} of {len(seeds)} seed{'s' if len(seeds) > 1 else ''} "
                     f"(its final minus FedAvg's: {span} points)")
    return {"text": joined(items) + "."}
