"""Section ``personalized``: the personalized methods against FedAvg on MNIST's pathological shards
(outputs/reproductions/personalized: FedAvg, FedPer, FedBN and Ditto; personalized_ft: FedAvg +
one epoch of fine-tuning), 50 clients of 2 digits each, 10 a round, 50 rounds, seeds 0, 1 and 2,
every client scored on its own held-out fifth after the last round: the table in
docs/configuration.md's "Personalized methods" and what it shows."""
from __future__ import annotations

from decimal import Decimal

from fedrun.results import Run

from scripts.common.claims_core import Data, bound_up, fmt, joined, mean, pct, sd
from scripts.common.claims_registry import claim

DOC = "docs/configuration.md"
FOLDER, FT = "personalized", "personalized_ft"
# (label, folder, method): the table's rows, in its order.
ROWS = [("FedAvg", FOLDER, "fedavg"), ("FedAvg + fine-tuning (1 epoch)", FT, "fedavg"),
        ("FedPer (last layer kept)", FOLDER, "fedper"), ("FedBN (BatchNorm kept)", FOLDER, "fedbn"),
        ("Ditto (lam = 1)", FOLDER, "ditto")]
SEEDS = (0, 1, 2)


def finished(data: Data, folder: str, method: str) -> list[Run]:
    """The method's finished runs of seeds 0-2, in seed order; every one of them, or an error."""
    runs = [data.run(folder, method, seed) for seed in SEEDS]
    unfinished = [str(r.path) for r in runs if not r.finished]
    if unfinished:
        raise ValueError(f"not finished: {', '.join(unfinished)}")
    return runs


def last(data: Data, run: Run):
    """The last round's row (every client scored: client_eval_every=5 and the last round)."""
    return data.rounds(run).iloc[-1]


def spread(values: list[Decimal]) -> str:
    """``mean +- sd`` over the three seeds (the sample standard deviation), one decimal."""
    return f"{fmt(mean(values))} +- {fmt(sd(values))}"


def column(data: Data, runs: list[Run], name: str) -> list[Decimal] | None:
    """A rounds.csv column of the runs' last rounds, in %; None where the runs lack it (no personal
    models: FedAvg)."""
    rows = [last(data, r) for r in runs]
    if name not in rows[0] or rows[0][name] != rows[0][name]:
        return None
    return [pct(row[name]) for row in rows]


@claim("personalized.table", "personalized", "{rows}", doc=DOC)
def _(data):
    """Per method over seeds 0-2 (mean +- sd), after the last of 50 rounds: the global model's test
    accuracy (the 10,000 MNIST test images), its accuracy on each client's own test images (mean
    over the 50 clients), and each client's personal model on them (mean, and the worst 10%: the
    mean of the 5 lowest); FedAvg has no personal model."""
    out = ["| method | global model, test set % | global model, clients' own test % | personal models, mean % "
           "| personal models, worst 10% |", "|---|---|---|---|---|"]
    for label, folder, method in ROWS:
        runs = finished(data, folder, method)
        cells = [spread([data.final(r) for r in runs])]
        for name in ("client_acc_mean", "pers_acc_mean", "pers_acc_worst10"):
            values = column(data, runs, name)
            cells.append("-" if values is None else spread(values))
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return {"rows": "\n".join(out)}


@claim("personalized.ditto_global", "personalized", "Ditto's global model is FedAvg's {same}", doc=DOC)
def _(data):
    """Whether Ditto's and FedAvg's global test accuracy are equal after every round of every seed
    (Ditto's personal steps never touch the global model): "to the byte in each seed" when they
    are, else the largest difference."""
    diffs = []
    for seed in SEEDS:
        a = data.curve(data.run(FOLDER, "ditto", seed))
        b = data.curve(data.run(FOLDER, "fedavg", seed))
        if a.keys() != b.keys():
            raise ValueError(f"seed {seed}: Ditto and FedAvg evaluated different rounds")
        diffs += [abs(a[r] - b[r]) for r in a]
    return {"same": "(the same test accuracy after every round, in each seed)" if max(diffs) == 0
            else f"(within {fmt(max(diffs), 2)} points)"}


@claim("personalized.order", "personalized", "{text}", doc=DOC)
def _(data):
    """The methods with personal models, ordered by their mean personal accuracy over the seeds
    (highest first); whether the first three's spread (bounded up) is below the largest of their
    standard deviations over the seeds; and in how many seeds each is above the global model's
    accuracy on the clients' own test images (FedAvg's, the same model Ditto has)."""
    means, above, sds = {}, {}, {}
    fedavg = [last(data, r)["client_acc_mean"] for r in finished(data, FOLDER, "fedavg")]
    for label, folder, method in ROWS[1:]:
        runs = finished(data, folder, method)
        values = column(data, runs, "pers_acc_mean")
        means[label.split(" (")[0]] = mean(values)
        sds[label.split(" (")[0]] = sd(values)
        above[label.split(" (")[0]] = sum(pct(v) > pct(g) for v, g in zip([last(data, r)["pers_acc_mean"]
                                                                           for r in runs], fedavg))
    ranked = sorted(means, key=means.get, reverse=True)
    order = " > ".join(f"{name} ({fmt(means[name])}%)" for name in ranked)
    counts = sorted(set(above.values()))
    every = ("each of them in all 3 seeds" if counts == [3] else
             joined([f"{name} in {n} of 3 seeds" for name, n in above.items()]))
    top = ranked[:3]
    gap = means[top[0]] - means[top[-1]]
    widest = max(sds[name] for name in top)
    close = (f"the first three lie within {bound_up(gap)} points of each other, "
             + ("less than the largest of their standard deviations over the seeds "
                f"({fmt(widest)}): an order these seeds do not settle" if gap < widest
                else f"more than any of their standard deviations over the seeds (at most {fmt(widest)})"))
    return {"text": f"By their clients' mean personal accuracy: {order}; {close}. Above FedAvg's global model on "
                    f"the clients' own test images: {every}."}
