"""Sections ``fedlap_tuned`` and ``fedlap_mnist_tuned``: FedLap against baselines tuned by scripts/common/tune.py,
on FashionMNIST and on the whole MNIST."""
from __future__ import annotations

import math
from decimal import Decimal

from fedrun.results import Run, find_runs, read_rounds

from scripts.common.claims_core import Data, SEEDS, aggregator, dec, fmt, hyper, load_run, mean, pct
from scripts.common.claims_registry import claim
from scripts.fedlap.claims import FRACTIONS, T, ahead_of_both, fedlap_cells, seed_means, signed_range


# ----------------------------------------------------------------------------- FedLap against tuned baselines

LT = "fedlap_tuned"
TUNED = {"fedprox": "fedlap/tuned/fedprox", "fedlap": "fedlap/tuned/fedlap"}


def choice(data: Data, method: str, folders: dict[str, str] = TUNED) -> dict:
    """``OUT/choice.json`` of the tuning protocol (scripts/common/tune.py) for ``method`` (its OUT in ``folders``)."""
    import json

    return json.loads((data.folder(folders[method]) / "choice.json").read_text())


def grid_row(data: Data, method: str, folders: dict[str, str] = TUNED) -> dict:
    """The grid's points and each point's score recomputed from its tuning run (mean validation
    accuracy over rounds 1-20, %, exact), checked against choice.json, and the chosen point."""
    c = choice(data, method, folders)
    (key, values), = c["grid"].items()
    cells = []
    for value, row in zip(values, c["rows"]):
        run = load_run(data.folder(folders[method]) / "tune" / f"{key.rsplit('.', 1)[-1]}{value}_seed0")
        df = read_rounds(run.path)
        score = mean(pct(a) for a in df["val_acc"].dropna())
        if abs(float(score) - 100 * row["mean"]) > 1e-6:
            raise ValueError(f"{run.path}: choice.json's score {row['mean']} is not the run's {score}")
        cells.append(f"{value}: {fmt(score, 2)}")
    chosen = c["chosen"][key]
    best = max(zip(values, c["rows"]), key=lambda vr: vr[1]["mean"])[0]
    if chosen != best:
        raise ValueError(f"{method}: choice {chosen} is not the best point {best}")
    return {"cells": ", ".join(cells), "chosen": chosen}


@claim("fedlap_tuned.fedprox_grid", LT, "| FedProx, `aggregator.mu` | {cells} | {chosen} |")
def _(data):
    """FedProx's tuning: every point of its authors' grid scored on the validation split."""
    return grid_row(data, "fedprox")


@claim("fedlap_tuned.fedlap_grid", LT, "| FedLap, `aggregator.q` (`form=interpolate`) | {cells} | {chosen} |")
def _(data):
    """FedLap's tuning: q over the same number of points, scored the same way."""
    return grid_row(data, "fedlap")


@claim("fedlap_tuned.protocol_runs", LT, "The protocol's own test runs at 0% stragglers give FedProx (mu = {mu}) "
       "{prox}% and FedLap (q = {q}) {lap}% over rounds 1-20 (seeds 0, 1, 2)")
def _(data):
    """The means over rounds 1-20 of the test runs scripts/common/tune.py made for each method's chosen
    point (0% stragglers, seeds 0, 1, 2)."""
    mu = choice(data, "fedprox")["chosen"]["aggregator.mu"]
    q = choice(data, "fedlap")["chosen"]["aggregator.q"]
    prox = [load_run(data.folder(TUNED["fedprox"]) / "test" / f"mu{mu}_seed{s}") for s in SEEDS]
    lap = [load_run(data.folder(TUNED["fedlap"]) / "test" / f"q{q}_seed{s}") for s in SEEDS]
    return {"mu": mu, "q": q, "prox": fmt(mean(seed_means(data, prox))), "lap": fmt(mean(seed_means(data, lap)))}


@claim("fedlap_tuned.protocol_vs_earlier", LT, "agree with the earlier runs of the same setting to {digits} "
       "significant digits in round 1")
def _(data):
    """The protocol's FedProx test runs against the earlier runs of the same setting
    (fedlap/preset, mu = 0.01, 0% stragglers): the relative difference of round 1's test loss."""
    mu = choice(data, "fedprox")["chosen"]["aggregator.mu"]
    worst = 0.0
    for seed in SEEDS:
        a = read_rounds(data.folder(TUNED["fedprox"]) / "test" / f"mu{mu}_seed{seed}")
        b = read_rounds(data.folder("fedlap/preset/stragglers0") / f"fedprox_s0.0_seed{seed}")
        x, y = float(a["test_loss"].iloc[0]), float(b["test_loss"].iloc[0])
        worst = max(worst, abs(x - y) / abs(y))
    if worst == 0:
        return {"digits": "all"}
    return {"digits": str(int(-math.log10(worst)))}


def tuned_cells(data: Data) -> dict[tuple[str, float], list[Run]]:
    """FedLap at the paper's q = 0.5 and FedAvg (fedlap/fmnist), FedProx at the tuned mu
    (fedlap/preset holds it at every straggler fraction), by (method, stragglers), in seed order."""
    mu = float(choice(data, "fedprox")["chosen"]["aggregator.mu"])
    fmnist, preset = fedlap_cells(data, "fmnist"), fedlap_cells(data, "preset")
    cells = {}
    for s in FRACTIONS:
        cells[("fedlap", s)], cells[("fedavg", s)] = fmnist[("fedlap", s)], fmnist[("fedavg", s)]
        cells[("fedprox", s)] = preset[("fedprox", s)]
        if {aggregator(r, "mu") for r in cells[("fedprox", s)]} != {mu}:
            raise ValueError(f"fedlap/preset: FedProx at {s} is not at the tuned mu = {mu}")
    return cells


@claim("fedlap_tuned.q_everywhere", LT, "{text}")
def _(data):
    """FashionMNIST: FedLap at its tuned q with 0%, 50% and 90% stragglers against the table's
    methods, means over rounds 1-20 per fraction and seed by seed."""
    return {"text": Q_EVERYWHERE.format(**tuned_q_everywhere(data, TUNED, "fedlap/tuned/fedlap_stragglers",
                                                             tuned_cells(data)))}


def _cell(data: Data, runs: list[Run]) -> str:
    at = [data.at(r, T) for r in runs]
    return f"{fmt(mean(at))}% [{fmt(min(at))}-{fmt(max(at))}] / {fmt(mean(seed_means(data, runs)))}%"


@claim("fedlap_tuned.rows", LT, "| 0% | {r0} |\n| 50% | {r50} |\n| 90% | {r90} |")
def _(data):
    """The table: each method's accuracy after round 20 (mean [min-max] over seeds 0, 1, 2) and its
    mean over rounds 1-20, and the seeds in which FedLap's mean over rounds 1-20 beats both."""
    return tuned_rows(data, tuned_cells(data))


def tuned_rows(data: Data, cells: dict) -> dict:
    """A tuned-baselines table's rows (keys r0, r50, r90): each method's :func:`_cell` and the
    seeds in which FedLap's mean over rounds 1-20 beats both baselines."""
    out = {}
    for key, s in (("r0", 0.0), ("r50", 0.5), ("r90", 0.9)):
        ahead, n = ahead_of_both(data, cells[("fedlap", s)], [cells[("fedprox", s)], cells[("fedavg", s)]])
        out[key] = " | ".join([_cell(data, cells[(m, s)]) for m in ("fedlap", "fedprox", "fedavg")]
                              + [f"{ahead} of {n}"])
    return out


@claim("fedlap_tuned.prox_leads", LT, "FedProx's mean accuracy over rounds 1-20 beats FedLap's in {k} of {n} (seed, "
       "fraction) pairs, by {lo} to {hi} points as a mean over the seeds at each fraction; FedLap is ahead of both "
       "baselines in {both} of {n}")
def _(data):
    """Seed by seed at each straggler fraction: tuned FedProx's mean over rounds 1-20 against
    FedLap's (q = 0.5), the mean lead per fraction, and the pairs where FedLap beats both."""
    cells = tuned_cells(data)
    k = n = both = 0
    leads = []
    for s in FRACTIONS:
        lap = {r.seed: data.mean_to(r, T) for r in cells[("fedlap", s)]}
        prox = {r.seed: data.mean_to(r, T) for r in cells[("fedprox", s)]}
        avg = {r.seed: data.mean_to(r, T) for r in cells[("fedavg", s)]}
        for seed in sorted(lap):
            n += 1
            k += prox[seed] > lap[seed]
            both += lap[seed] > max(prox[seed], avg[seed])
        leads.append(mean(prox.values()) - mean(lap.values()))
    if min(leads) <= 0:
        raise ValueError("FedProx does not lead at every fraction")
    return {"k": k, "n": n, "lo": fmt(min(leads)), "hi": fmt(max(leads)), "both": both}


@claim("fedlap_tuned.q1_is_mu1", LT, "FedLap at q = 1 scores what FedProx at mu = 1 scores, to the last digit")
def _(data):
    """The tuning runs of FedLap at q = 1 (interpolate form) and FedProx at mu = 1: the same
    validation and test accuracies in every round."""
    return q1_is_mu1(data, TUNED)


def q1_is_mu1(data: Data, folders: dict[str, str]) -> dict:
    """Raise unless the tuning runs of FedLap at q = 1 and FedProx at mu = 1 (under ``folders``)
    have the same validation and test accuracies in every round."""
    a = read_rounds(data.folder(folders["fedlap"]) / "tune" / "q1_seed0")
    b = read_rounds(data.folder(folders["fedprox"]) / "tune" / "mu1_seed0")
    if not (a["val_acc"].equals(b["val_acc"]) and a["test_acc"].equals(b["test_acc"])):
        raise ValueError("FedLap at q = 1 and FedProx at mu = 1 differ")
    return {}

# ----------------------------------------------------------------------------- FedLap against tuned baselines, the whole MNIST

LTM = "fedlap_mnist_tuned"
TUNED_MNIST = {"fedprox": "fedlap/tuned_mnist/fedprox", "fedlap": "fedlap/tuned_mnist/fedlap"}
# Tuned FedProx with stragglers (the protocol's test runs have none): a sweep at the chosen mu.
TUNED_MNIST_STRAGGLERS = "fedlap/tuned_mnist/fedprox_stragglers"


def protocol_tests(data: Data, method: str, folders: dict[str, str]) -> list[Run]:
    """The test runs scripts/common/tune.py made for ``method``'s chosen point (seeds 0, 1, 2), checked to
    train on the whole training set (no validation split)."""
    (key, value), = choice(data, method, folders)["chosen"].items()
    runs = [load_run(data.folder(folders[method]) / "test" / f"{key.rsplit('.', 1)[-1]}{value}_seed{s}")
            for s in SEEDS]
    for r in runs:
        if float(hyper(r, "validation_fraction") or 0) != 0 or not r.finished:
            raise ValueError(f"{r.path}: a validation split, or an unfinished run")
    return runs


def tuned_mnist_cells(data: Data) -> dict[tuple[str, float], list[Run]]:
    """FedLap at the paper's q = 0.5 and FedAvg (fedlap/mnist), FedProx at its tuned mu (the
    protocol's test runs without stragglers, TUNED_MNIST_STRAGGLERS with them), by (method,
    stragglers), in seed order."""
    mu = float(choice(data, "fedprox", TUNED_MNIST)["chosen"]["aggregator.mu"])
    whole = fedlap_cells(data, "mnist")
    cells = {}
    for s in FRACTIONS:
        cells[("fedlap", s)], cells[("fedavg", s)] = whole[("fedlap", s)], whole[("fedavg", s)]
        cells[("fedprox", s)] = (protocol_tests(data, "fedprox", TUNED_MNIST) if s == 0.0
                                 else data.runs(TUNED_MNIST_STRAGGLERS, "fedprox", s))
        if {float(aggregator(r, "mu")) for r in cells[("fedprox", s)]} != {mu}:
            raise ValueError(f"FedProx at {s} is not at the tuned mu = {mu}")
        if [r.seed for r in cells[("fedprox", s)]] != list(SEEDS):
            raise ValueError(f"FedProx at {s}: seeds {[r.seed for r in cells[('fedprox', s)]]}")
    if {float(aggregator(r, "q")) for s in FRACTIONS for r in cells[("fedlap", s)]} != {0.5}:
        raise ValueError("fedlap/mnist: FedLap is not at the paper's q = 0.5")
    return cells


@claim("fedlap_mnist_tuned.fedprox_grid", LTM, "| FedProx, `aggregator.mu` | {cells} | {chosen} |")
def _(data):
    """Whole MNIST: FedProx's tuning, every point of its authors' grid scored on the validation split."""
    return grid_row(data, "fedprox", TUNED_MNIST)


@claim("fedlap_mnist_tuned.fedlap_grid", LTM, "| FedLap, `aggregator.q` (`form=interpolate`) | {cells} | {chosen} |")
def _(data):
    """Whole MNIST: FedLap's q over the same number of points, scored the same way."""
    return grid_row(data, "fedlap", TUNED_MNIST)


@claim("fedlap_mnist_tuned.rows", LTM, "| 0% | {r0} |\n| 50% | {r50} |\n| 90% | {r90} |")
def _(data):
    """Whole MNIST, the table: each method's accuracy after round 20 (mean [min-max] over seeds 0,
    1, 2) / its mean over rounds 1-20, and the seeds in which FedLap's mean over rounds 1-20 beats
    both baselines."""
    return tuned_rows(data, tuned_mnist_cells(data))


def pair_counts(data: Data, cells: dict, a: str, b: str) -> tuple[int, int, list[Decimal]]:
    """(pairs (seed, fraction) in which ``a``'s mean over rounds 1-20 beats ``b``'s, pairs, and at
    each fraction ``a``'s mean over the seeds minus ``b``'s)."""
    k = n = 0
    diffs = []
    for s in FRACTIONS:
        x = {r.seed: data.mean_to(r, T) for r in cells[(a, s)]}
        y = {r.seed: data.mean_to(r, T) for r in cells[(b, s)]}
        for seed in sorted(set(x) & set(y)):
            n += 1
            k += x[seed] > y[seed]
        diffs.append(mean(x.values()) - mean(y.values()))
    return k, n, diffs


def tuned_q_everywhere(data: Data, folders: dict[str, str], stragglers: str, cells: dict) -> dict:
    """FedLap at its tuned q at every straggler fraction (the protocol's test runs at 0%, the sweep
    ``stragglers`` at 50% and 90%) against the tuned FedProx and FedAvg of ``cells``: the means over
    rounds 1-20 (and over seeds) per fraction, and the (seed, fraction) pairs FedLap wins."""
    q = choice(data, "fedlap", folders)["chosen"]["aggregator.q"]
    lap = {0.0: protocol_tests(data, "fedlap", folders)}
    for f in FRACTIONS[1:]:
        lap[f] = data.runs(stragglers, "fedlap", f)
        if [r.seed for r in lap[f]] != list(SEEDS) or not all(r.finished for r in lap[f]) or \
                {str(aggregator(r, "q")) for r in lap[f]} != {q}:
            raise ValueError(f"{stragglers}: not the finished runs of FedLap at q = {q}, seeds 0, 1, 2, at {f}")
    mine = {**cells, **{("lap_q", f): rs for f, rs in lap.items()}}
    kp, n, _dp = pair_counts(data, mine, "lap_q", "fedprox")
    ka, _n, _da = pair_counts(data, mine, "lap_q", "fedavg")

    def per_fraction(method):
        return ", ".join(f"{fmt(mean(seed_means(data, mine[(method, f)])))}%" for f in FRACTIONS)

    return {"q": q, "lap": per_fraction("lap_q"), "prox": per_fraction("fedprox"), "avg": per_fraction("fedavg"),
            "half": per_fraction("fedlap"), "kp": kp, "ka": ka, "n": n}


Q_EVERYWHERE = ("With stragglers too (q = {q} at every fraction: the protocol's runs at 0%, a sweep at 50% and "
                "90%), FedLap's means over rounds 1-20 at 0%, 50% and 90% are {lap}, against {half} at q = 0.5, "
                "{prox} for the tuned FedProx and {avg} for FedAvg; FedLap at q = {q} beats FedProx in {kp} of {n} "
                "(seed, fraction) pairs and FedAvg in {ka} of {n}")


@claim("fedlap_mnist_tuned.q_everywhere", LTM, Q_EVERYWHERE)
def _(data):
    """Whole MNIST: FedLap at its tuned q with 0%, 50% and 90% stragglers against the table's
    methods, means over rounds 1-20 per fraction and seed by seed."""
    return tuned_q_everywhere(data, TUNED_MNIST, "fedlap/tuned_mnist/fedlap_stragglers", tuned_mnist_cells(data))


@claim("fedlap_mnist_tuned.versus", LTM, "Over rounds 1-20 the tuned FedProx beats FedLap in {kp} of {n} (seed, "
       "fraction) pairs ({prox} FedLap as a mean over the seeds at each fraction) and FedAvg beats FedLap in {ka} "
       "of {n} ({avg} FedLap); FedLap is ahead of both in {both} of {n}")
def _(data):
    """Whole MNIST, seed by seed at each straggler fraction: the tuned FedProx's and FedAvg's mean
    over rounds 1-20 against FedLap's (q = 0.5), the differences of the means over seeds per
    fraction, and the pairs where FedLap beats both."""
    cells = tuned_mnist_cells(data)
    kp, n, dp = pair_counts(data, cells, "fedprox", "fedlap")
    ka, _n, da = pair_counts(data, cells, "fedavg", "fedlap")
    both = sum(ahead_of_both(data, cells[("fedlap", s)], [cells[("fedprox", s)], cells[("fedavg", s)]])[0]
               for s in FRACTIONS)
    return {"kp": kp, "ka": ka, "n": n, "both": both,
            "prox": signed_range(dp, "ahead of", "behind"), "avg": signed_range(da, "ahead of", "behind")}


@claim("fedlap_mnist_tuned.prox_vs_avg", LTM, "the tuned FedProx's mean over rounds 1-20 is {side} FedAvg's at each "
       "fraction and beats it in {k} of {n} pairs")
def _(data):
    """Whole MNIST: the tuned FedProx against FedAvg, mean over rounds 1-20, seed by seed and as
    means over the seeds per fraction."""
    cells = tuned_mnist_cells(data)
    k, n, d = pair_counts(data, cells, "fedprox", "fedavg")
    return {"side": signed_range(d, "ahead of", "behind"), "k": k, "n": n}


@claim("fedlap_mnist_tuned.protocol_runs", LTM, "The protocol's test runs of FedLap at its tuned q = {q} give {lap}% "
       "over rounds 1-20 without stragglers (seeds 0, 1, 2), against {half}% at the paper's q = 0.5, {prox}% for the "
       "tuned FedProx and {avg}% for FedAvg; seed by seed FedLap at q = {q} beats FedProx in {kp} of 3 and FedAvg in "
       "{ka} of 3")
def _(data):
    """Whole MNIST, 0% stragglers: FedLap's test runs at its chosen q against the q = 0.5 runs of
    fedlap/mnist, the tuned FedProx and FedAvg, means over rounds 1-20 (and over seeds), and seed
    by seed."""
    q = choice(data, "fedlap", TUNED_MNIST)["chosen"]["aggregator.q"]
    lap = protocol_tests(data, "fedlap", TUNED_MNIST)
    cells = tuned_mnist_cells(data)
    half, prox, avg = (cells[(m, 0.0)] for m in ("fedlap", "fedprox", "fedavg"))
    mine = seed_means(data, lap)
    return {"q": q, "lap": fmt(mean(mine)), "half": fmt(mean(seed_means(data, half))),
            "prox": fmt(mean(seed_means(data, prox))), "avg": fmt(mean(seed_means(data, avg))),
            "kp": sum(a > b for a, b in zip(mine, seed_means(data, prox))),
            "ka": sum(a > b for a, b in zip(mine, seed_means(data, avg)))}


@claim("fedlap_mnist_tuned.q1_is_mu1", LTM, "FedLap at q = 1 again scores what FedProx at mu = 1 scores, to the last "
       "digit")
def _(data):
    """Whole MNIST: the tuning runs of FedLap at q = 1 (interpolate form) and FedProx at mu = 1
    have the same validation and test accuracies in every round."""
    return q1_is_mu1(data, TUNED_MNIST)


@claim("fedlap_mnist_tuned.peaks", LTM, "Both grids peak at a light regularization (mu = {mu}; q = {q}, {where}) "
       "and fall with every larger mu or q")
def _(data):
    """Whole MNIST: each grid's chosen point, and its scores strictly falling over the points after it."""
    out = {}
    for method, key in (("fedprox", "mu"), ("fedlap", "q")):
        c = choice(data, method, TUNED_MNIST)
        (setting, values), = c["grid"].items()
        scores = [row["mean"] for row in c["rows"]]
        at = values.index(c["chosen"][setting])
        if any(a <= b for a, b in zip(scores[at:], scores[at + 1:])):
            raise ValueError(f"{method}: the scores do not fall after the chosen point: {scores}")
        out[key] = c["chosen"][setting]
        if method == "fedlap":
            out["where"] = f"the smallest {key} tried" if at == 0 else f"point {at + 1} of {len(values)}"
    return out


@claim("fedlap_mnist_tuned.budget", LTM, "{tune} tuning runs and {test} test runs, {minutes} minutes of CPU")
def _(data):
    """Whole MNIST: the protocol's runs (both methods' tune/ and test/) and the tuned FedProx's
    straggler runs, and their time in their rounds together (summary.json round_seconds)."""
    def found(name: str) -> list[Run]:
        return [load_run(p) for p in find_runs(data.folder(name), require=("config.yaml",))]
    tune = [r for m in TUNED_MNIST for r in found(f"{TUNED_MNIST[m]}/tune")]
    test = [r for m in TUNED_MNIST for r in found(f"{TUNED_MNIST[m]}/test")] + found(TUNED_MNIST_STRAGGLERS)
    if not all(r.finished for r in tune + test):
        raise ValueError("an unfinished run")
    minutes = sum(dec(r.summary["round_seconds"]) for r in tune + test) / 60
    return {"tune": len(tune), "test": len(test), "minutes": fmt(minutes, 0)}


@claim("fedlap_tuned.q_edge", LT, "FedLap's q grid peaks at its end on both datasets (q = {q} on FashionMNIST and "
       "{qm} on the whole MNIST, the smallest q tried), so its optimum is not bracketed")
def _(data):
    """FashionMNIST's and the whole MNIST's tuning of FedLap's q: the chosen point is the grid's
    smallest q (raises otherwise: then the optimum is bracketed from below)."""
    out = {}
    for key, folders in (("q", TUNED), ("qm", TUNED_MNIST)):
        c = choice(data, "fedlap", folders)
        (setting, values), = c["grid"].items()
        if float(c["chosen"][setting]) != min(float(v) for v in values):
            raise ValueError(f"{folders['fedlap']}: the chosen q {c['chosen'][setting]} is not the smallest tried")
        out[key] = c["chosen"][setting]
    return out


@claim("fedlap_tuned.q_edge_cost", LT, "FedLap's tuning runs took {lo} to {hi} minutes each here ({n} runs, "
       "FashionMNIST and the whole MNIST)")
def _(data):
    """The time in their rounds (summary.json round_seconds) of FedLap's tuning runs on both
    datasets, the fewest and most minutes: what each further point of the q grid costs."""
    minutes = []
    for folders in (TUNED, TUNED_MNIST):
        runs = [load_run(p) for p in find_runs(data.folder(folders["fedlap"]) / "tune", require=("config.yaml",))]
        if not runs or not all(r.finished for r in runs):
            raise ValueError(f"{folders['fedlap']}: no tuning run, or an unfinished one")
        minutes += [dec(r.summary["round_seconds"]) / 60 for r in runs]
    return {"lo": fmt(min(minutes), 0), "hi": fmt(max(minutes), 0), "n": len(minutes)}
