"""Sections ``fedlap_fmnist`` (the bullets under "What holds and what does not"), ``fedlap_readings``,
``fedlap_mnist_train10k`` and ``fedlap_mnist`` (FedLap's MNIST figures on the whole MNIST)."""
from __future__ import annotations

from decimal import Decimal
from typing import Callable

from fedrun.results import Run, read_csv

from scripts.common.claims_core import (Data, aggregator, bound_up, dec, fmt, held_out_images, hyper, joined, mean,
                                        thousands)
from scripts.common.claims_registry import claim


# ============================================================================= FedLap

LF = "fedlap_fmnist"
LR = "fedlap_readings"
LM = "fedlap_mnist_train10k"
FRACTIONS = (0.0, 0.5, 0.9)
BASELINES = ("fedprox", "fedavg")
T = 20  # the rounds of the claim "in the first 20 communication rounds"


def fedlap_cells(data: Data, folder: str) -> dict[tuple[str, float], list[Run]]:
    """``{(method, stragglers): [runs in seed order]}`` under ``fedlap/<folder>``."""
    out: dict[tuple[str, float], list[Run]] = {}
    for (m, seed, s, _n), run in sorted(data.index(f"fedlap/{folder}").items(), key=lambda kv: (kv[0][1], str(kv[0]))):
        out.setdefault((m, s), []).append(run)
    return out


def seed_means(data: Data, runs: list[Run]) -> list[Decimal]:
    return [data.mean_to(r, T) for r in runs]


def ahead_of_both(data: Data, lap: list[Run], others: list[list[Run]]) -> tuple[int, int]:
    """(seeds in which FedLap's mean over rounds 1-20 beats every other method's, seeds compared)."""
    by_seed = [{r.seed: data.mean_to(r, T) for r in runs} for runs in [lap, *others]]
    common = sorted(set.intersection(*(set(b) for b in by_seed)))
    ahead = sum(by_seed[0][s] > max(b[s] for b in by_seed[1:]) for s in common)
    return ahead, len(common)


@claim("fedlap.fmnist_ahead", LF, "its mean accuracy over rounds 1-20 beats both baselines in {k} of {n} (seed, "
       "fraction) pairs")
def _(data):
    """FashionMNIST presets: the (seed, straggler fraction) pairs in which FedLap's mean accuracy
    over rounds 1-20 beats both FedProx's and FedAvg's."""
    cells = fedlap_cells(data, "fmnist")
    k = n = 0
    for s in FRACTIONS:
        a, b = ahead_of_both(data, cells[("fedlap", s)], [cells[(m, s)] for m in BASELINES])
        k, n = k + a, n + b
    return {"k": k, "n": n}


def leads(data: Data, cells: dict, measure: Callable[[Run], Decimal]) -> list[Decimal]:
    """Per straggler fraction: FedLap's mean (over seeds) of ``measure`` minus the better of the
    baselines' means."""
    out = []
    for s in FRACTIONS:
        lap = mean(measure(r) for r in cells[("fedlap", s)])
        out.append(lap - max(mean(measure(r) for r in cells[(m, s)]) for m in BASELINES))
    return out


@claim("fedlap.fmnist_lead", LF, "By {lo} to {hi} points, not the paper's 3 to 5")
def _(data):
    """FashionMNIST presets: FedLap's mean over rounds 1-20 minus the better of FedProx's and
    FedAvg's (means over seeds), the range over the straggler fractions."""
    lead = leads(data, fedlap_cells(data, "fmnist"), lambda r: data.mean_to(r, T))
    return {"lo": fmt(min(lead)), "hi": fmt(max(lead))}


@claim("fedlap.fmnist_stragglers", LF, "the stragglers leave all three methods within {x} points of their mean "
       "accuracy over rounds 1-20 without stragglers")
def _(data):
    """FashionMNIST presets: the largest difference, over the methods and the 50% and 90% straggler
    fractions, between a method's mean over rounds 1-20 (mean over seeds) and its mean without
    stragglers (a bound: rounded up)."""
    return {"x": bound_up(straggler_change(data, "fmnist"))}


def straggler_change(data: Data, folder: str) -> Decimal:
    """The largest change, over the methods and the 50% and 90% straggler fractions, of a method's
    mean over rounds 1-20 (mean over seeds) with stragglers against without, under ``fedlap/<folder>``
    (exact, in points)."""
    cells = fedlap_cells(data, folder)
    fractions = sorted({s for (_m, s) in cells})
    if fractions[0] != 0.0 or len(fractions) < 2:
        raise ValueError(f"fedlap/{folder}: straggler fractions {fractions}")
    means = {key: mean(seed_means(data, runs)) for key, runs in cells.items()}
    return max(abs(means[(m, s)] - means[(m, 0.0)]) for m in ("fedlap", *BASELINES) for s in fractions[1:])


@claim("fedlap.fmnist_round20", LF, "After round 20 alone the differences are {inside} the seeds' ranges (which span "
       "{lo} to {hi} points)")
def _(data):
    """FashionMNIST presets, accuracy after round 20: FedLap's lead over the better baseline (means
    over seeds) is smaller than every method's range over seeds at that fraction; the ranges'
    smallest and largest width."""
    cells = fedlap_cells(data, "fmnist")
    widths = {key: max(data.at(r, T) for r in runs) - min(data.at(r, T) for r in runs) for key, runs in cells.items()}
    lead = leads(data, cells, lambda r: data.at(r, T))
    inside = all(abs(lead[i]) < min(widths[(m, s)] for m in ("fedlap", *BASELINES)) for i, s in enumerate(FRACTIONS))
    return {"inside": "inside" if inside else "NOT inside", "lo": fmt(min(widths.values()), 0),
            "hi": fmt(max(widths.values()), 0)}


def client_means(data: Data, runs: list[Run], column: str, round_: int) -> Decimal:
    """The mean over ``runs`` of a round's mean of a clients.csv column over the clients that trained."""
    values = []
    for r in runs:
        df = data.clients(r)
        df = df[(df["round"] == round_) & (df["dropped"].fillna(0) == 0)]
        values.append(mean(dec(v) for v in df[column]))
    return mean(values)


@claim("fedlap.fmnist_lambda", LF, "the clients' mean dissimilarity lambda falls from {l1} in round 1 to {l20} in "
       "round 20, and the regularization term from {r1} to {r20} (FedProx's with mu = 1: {p1} to {p20})")
def _(data):
    """FashionMNIST presets, all straggler fractions and seeds: the mean over runs of a round's mean
    ``lambda_mean`` and ``reg_loss`` (clients.csv) in rounds 1 and 20, FedLap's and FedProx's."""
    cells = fedlap_cells(data, "fmnist")
    lap = [r for s in FRACTIONS for r in cells[("fedlap", s)]]
    prox = [r for s in FRACTIONS for r in cells[("fedprox", s)]]
    return {"l1": fmt(client_means(data, lap, "lambda_mean", 1), 3),
            "l20": fmt(client_means(data, lap, "lambda_mean", T), 3),
            "r1": fmt(client_means(data, lap, "reg_loss", 1), 3), "r20": fmt(client_means(data, lap, "reg_loss", T), 3),
            "p1": fmt(client_means(data, prox, "reg_loss", 1), 2),
            "p20": fmt(client_means(data, prox, "reg_loss", T), 2)}


# ----------------------------------------------------------------------------- FedLap readings

def reading_runs(data: Data) -> dict[str, list[Run]]:
    """The runs the readings table sets side by side (FashionMNIST, no stragglers unless named)."""
    preset = {s: fedlap_cells(data, f"preset/stragglers{s:g}") for s in FRACTIONS}
    return {"fedavg": preset[0.0][("fedavg", 0.0)],
            "previous_lap": preset[0.0][("fedlap", 0.0)], "previous_prox": preset[0.0][("fedprox", 0.0)],
            **{f"previous_lap_{s:g}": preset[s][("fedlap", s)] for s in FRACTIONS},
            **{f"previous_prox_{s:g}": preset[s][("fedprox", s)] for s in FRACTIONS},
            **{f"fedavg_{s:g}": preset[s][("fedavg", s)] for s in FRACTIONS},
            "L1": fedlap_cells(data, "readings/L1_q1")[("fedlap", 0.0)],
            "L2": fedlap_cells(data, "readings/L2_interpolate")[("fedlap", 0.0)],
            "L3": fedlap_cells(data, "readings/L3_fedprox_mu1")[("fedprox", 0.0)],
            "L4": fedlap_cells(data, "readings/L4_fan_in")[("fedlap", 0.0)]}


def reading_cells(data: Data, lap: list[Run], prox: list[Run], avg: list[Run]) -> tuple[str, str, str]:
    """A readings row: FedLap's and FedProx's mean over rounds 1-20 (%), and ``k of n`` seeds in
    which FedLap's beats both FedProx's and FedAvg's."""
    k, n = ahead_of_both(data, lap, [prox, avg])
    return (f"{fmt(mean(seed_means(data, lap)))}%", f"{fmt(mean(seed_means(data, prox)))}%", f"{k} of {n}")


def require(runs: list[Run], what: str, **settings) -> None:
    """Refuse a readings row whose runs do not have the settings its label names."""
    for r in runs:
        for key, want in settings.items():
            have = aggregator(r, key)
            if have != want and not (isinstance(want, float) and have is not None and float(have) == want):
                raise ValueError(f"{r.path}: {what}: aggregator.{key} is {have!r}, the row says {want!r}")


@claim("fedlap.readings_fedavg", LR, "mean test accuracy over rounds 1-20 (FedAvg: {x}%)")
def _(data):
    """FashionMNIST without stragglers: FedAvg's mean over rounds 1-20 (mean over seeds)."""
    return {"x": fmt(mean(seed_means(data, reading_runs(data)["fedavg"])))}


READING_ROWS = {
    "previous": ("| FedLap `form=linear` q = 0.5 (c = q lambda: half of eq. 10), FedProx mu = 0.01 (the previous "
                 "presets) | {lap} | {prox} | {ahead} |", "previous_lap", "previous_prox",
                 {"form": "linear", "q": 0.5}, {"mu": 0.01}),
    "q1": ("| FedLap linear q = 1 (eq. 10 exactly as printed), FedProx mu = 1 | {lap} | {prox} | {ahead} |",
           "L1", "L3", {"form": "linear", "q": 1.0}, {"mu": 1.0}),
    "linear_mu1": ("| FedLap linear q = 0.5, FedProx mu = 1 | {lap} | {prox} | {ahead} |", "previous_lap", "L3",
                   {"form": "linear", "q": 0.5}, {"mu": 1.0}),
    "presets": ("| **FedLap `form=interpolate` q = 0.5 (c = q lambda^(1-q)), FedProx mu = 1 (the presets)** | {lap} | "
                "{prox} | {ahead} |", "L2", "L3", {"form": "interpolate", "q": 0.5}, {"mu": 1.0}),
    "fan_in": ("| FedLap interpolate, `vectors=fan_in` (rows of PyTorch's weight), FedProx mu = 1 | {lap} | {prox} | "
               "{ahead} |", "L4", "L3", {"form": "interpolate", "vectors": "fan_in"}, {"mu": 1.0}),
}

for _key, (_template, _lap, _prox, _lap_settings, _prox_settings) in READING_ROWS.items():
    def _reading(data, _lap=_lap, _prox=_prox, _lap_settings=_lap_settings, _prox_settings=_prox_settings):
        """A row of the readings table (FashionMNIST, no stragglers): FedLap's and FedProx's mean
        over rounds 1-20 (means over seeds) and the seeds in which FedLap's beats both FedProx's and
        FedAvg's; the runs' aggregator settings must be the row's."""
        runs = reading_runs(data)
        require(runs[_lap], "FedLap", **_lap_settings)
        require(runs[_prox], "FedProx", **_prox_settings)
        lap, prox, ahead = reading_cells(data, runs[_lap], runs[_prox], runs["fedavg"])
        return {"lap": lap, "prox": prox, "ahead": ahead}
    claim(f"fedlap.readings_row.{_key}", LR, _template)(_reading)


@claim("fedlap.readings_row.previous_stragglers", LR, "| the same at 50% / 90% stragglers | {lap5} / {lap9} | "
       "{prox5} / {prox9} | {a5} / {a9} |")
def _(data):
    """The previous presets (FedLap linear q = 0.5, FedProx mu = 0.01) at 50% and 90% stragglers:
    FedLap's and FedProx's mean over rounds 1-20 and the seeds in which FedLap's beats both."""
    runs = reading_runs(data)
    out = {}
    for s, key in ((0.5, "5"), (0.9, "9")):
        require(runs[f"previous_lap_{s:g}"], "FedLap", form="linear", q=0.5)
        require(runs[f"previous_prox_{s:g}"], "FedProx", mu=0.01)
        lap, prox, ahead = reading_cells(data, runs[f"previous_lap_{s:g}"], runs[f"previous_prox_{s:g}"],
                                         runs[f"fedavg_{s:g}"])
        out.update({f"lap{key}": lap, f"prox{key}": prox, f"a{key}": ahead})
    return out


@claim("fedlap.readings_spread", LR, "How FedLap's penalty is read changes its accuracy by {bound}")
def _(data):
    """Without stragglers: the range of FedLap's mean over rounds 1-20 (means over seeds) over the
    five readings of the table."""
    runs = reading_runs(data)
    values = [mean(seed_means(data, runs[k])) for k in ("previous_lap", "L1", "L2", "L4")]
    spread = max(values) - min(values)
    return {"bound": "less than a point" if spread < 1 else f"{fmt(spread)} points"}


@claim("fedlap.readings_lambda", LR, "its lambda is small ({lo} to {hi}, a round's mean over its clients)")
def _(data):
    """Without stragglers, FedLap's runs of the readings table: the smallest and largest of a
    round's mean ``lambda_mean`` over its clients (clients.csv)."""
    runs = reading_runs(data)
    values = []
    for key in ("previous_lap", "L1", "L2", "L4"):
        for r in runs[key]:
            df = data.clients(r)
            df = df[df["dropped"].fillna(0) == 0]
            values += [mean(dec(v) for v in g) for _, g in df.groupby("round")["lambda_mean"]]
    return {"lo": fmt(min(values), 3), "hi": fmt(max(values), 3)}


@claim("fedlap.readings_mu001", LR, "FedProx with mu = 0.01 (a value common in the FedProx literature) beats FedLap "
       "in its linear form (q = 0.5, the previous presets) in {lin} of {n} (seed, straggler fraction) pairs, and in "
       "the presets' interpolate form (q = 0.5) in {itp} of {n}{but}")
def _(data):
    """FedProx at mu = 0.01 (fedlap/preset, every straggler fraction) against FedLap at q = 0.5 in
    each form, linear (fedlap/preset, the previous presets) and interpolate (fedlap/fmnist, the
    presets): the (seed, straggler fraction) pairs in which FedProx's mean over rounds 1-20 beats
    FedLap's, and the pairs where it does not, with FedLap's lead there (points over rounds 1-20)."""
    runs, cells = reading_runs(data), fedlap_cells(data, "fmnist")
    lin = itp = n = 0
    others = []
    for s in FRACTIONS:
        require(runs[f"previous_prox_{s:g}"], "FedProx", mu=0.01)
        require(runs[f"previous_lap_{s:g}"], "FedLap", form="linear", q=0.5)
        require(cells[("fedlap", s)], "FedLap", form="interpolate", q=0.5)
        prox = {r.seed: data.mean_to(r, T) for r in runs[f"previous_prox_{s:g}"]}
        linear = {r.seed: data.mean_to(r, T) for r in runs[f"previous_lap_{s:g}"]}
        interp = {r.seed: data.mean_to(r, T) for r in cells[("fedlap", s)]}
        if not set(prox) == set(linear) == set(interp):
            raise ValueError(f"stragglers {s}: the three methods' seeds differ")
        for seed in sorted(prox):
            n += 1
            lin += prox[seed] > linear[seed]
            itp += prox[seed] > interp[seed]
            if prox[seed] <= interp[seed]:
                lead = fmt(interp[seed] - prox[seed], 2)
                others.append(f"seed {seed} at {fmt(100 * dec(s), 0)}% stragglers, by {lead}")
    but = f" (FedLap ahead in {joined(others)} points over rounds 1-20)" if others else ""
    return {"lin": lin, "itp": itp, "n": n, "but": but}


@claim("fedlap.readings_mu1", LR, "which trains more slowly early on ({x}% over rounds 1-20)")
def _(data):
    """FedProx with mu = 1 (the presets), no stragglers: its mean over rounds 1-20 (mean over seeds)."""
    runs = reading_runs(data)
    require(runs["L3"], "FedProx", mu=1.0)
    return {"x": fmt(mean(seed_means(data, runs["L3"])))}


@claim("fedlap.readings_paper_lead", LR, "The paper's 3-5 point lead is {verdict} by any reading tried (FedLap's "
       "largest lead over the better of FedProx and FedAvg: {x} points over rounds 1-20)")
def _(data):
    """Without stragglers: the largest, over the table's readings, of FedLap's mean over rounds
    1-20 minus the better of its row's FedProx's and FedAvg's (means over seeds)."""
    runs = reading_runs(data)
    best = Decimal("-Infinity")
    for _template, lap, prox, _a, _b in READING_ROWS.values():
        rival = max(mean(seed_means(data, runs[prox])), mean(seed_means(data, runs["fedavg"])))
        best = max(best, mean(seed_means(data, runs[lap])) - rival)
    return {"verdict": "not reached" if best < 3 else "reached", "x": fmt(best)}


@claim("fedlap.readings_same_runs", LR, "(the same runs as those in `outputs/reproductions/fedlap/fmnist`: {same})")
def _(data):
    """The readings L2_interpolate and L3_fedprox_mu1 against the FashionMNIST presets' FedLap and
    FedProx without stragglers: every CSV of each seed equal, but rounds.csv's timing columns."""
    runs = reading_runs(data)
    cells = fedlap_cells(data, "fmnist")
    same = True
    for key, method in (("L2", "fedlap"), ("L3", "fedprox")):
        for a, b in zip(runs[key], cells[(method, 0.0)]):
            if a.seed != b.seed:
                return {"same": f"NOT the same seeds ({a.path}, {b.path})"}
            same = same and data.same_but_timings(a, b)
            for name in ("clients.csv", "layers.csv"):
                x, y = read_csv(a.path, name), read_csv(b.path, name)
                same = same and list(x.columns) == list(y.columns) and x.equals(y)
    return {"same": "their CSVs agree in every column but `rounds.csv`'s timings" if same
            else "their CSVs DIFFER beyond the timings"}


# ----------------------------------------------------------------------------- FedLap on MNIST's first 10,000 images

@claim("fedlap.mnist_data", LM, "{train} training images cut into {shards} label-sorted shards of {size} (not the "
       "paper's 300), so each client holds {per} images; {test} held-out training images are the test set. {n} runs, "
       "{minutes} minutes of CPU")
def _(data):
    """The MNIST runs' data (partition.csv, the partition's shards a client, the split's test
    fraction), how many runs and their time in their rounds together (summary.json round_seconds)."""
    out = fedlap_data(data, "fedlap/mnist_train10k")
    return {**out, "test": thousands(held_out_images(data.runs("fedlap/mnist_train10k")[0], out["train_n"]))}


def fedlap_data(data: Data, folder: str) -> dict:
    """A FedLap MNIST folder's shards and data (partition.csv: every client the same size), how
    many runs, and their time in their rounds together (summary.json round_seconds), in minutes."""
    runs = data.runs(folder)
    run = runs[0]
    train = data.train_images(run)
    shards = hyper(run, "num_clients") * (run.config.get("partition") or {})["shards_per_client"]
    sizes = {int(v) for v in read_csv(run.path, "partition.csv")["examples"]}
    if len(sizes) != 1 or not all(r.finished for r in runs):
        raise ValueError(f"{folder}: clients of sizes {sorted(sizes)}, or an unfinished run")
    minutes = sum(dec(r.summary["round_seconds"]) for r in runs) / 60
    return {"train": thousands(train), "train_n": train, "shards": shards, "size": train // shards,
            "per": sizes.pop(), "n": len(runs), "minutes": fmt(minutes, 0)}


@claim("fedlap.mnist_fedavg", LM, "FedLap starts ahead of FedAvg ({lo} to {hi} points over rounds 1-20) and ends close "
       "to it ({elo} to {ehi} points {side} it after round 20)")
def _(data):
    """MNIST: FedLap's mean over rounds 1-20 minus FedAvg's, and its accuracy after round 20 minus
    FedAvg's (means over seeds), the range over the straggler fractions."""
    cells = fedlap_cells(data, "mnist_train10k")
    start = [mean(seed_means(data, cells[("fedlap", s)])) - mean(seed_means(data, cells[("fedavg", s)]))
             for s in FRACTIONS]
    end = [mean(data.at(r, T) for r in cells[("fedlap", s)]) - mean(data.at(r, T) for r in cells[("fedavg", s)])
           for s in FRACTIONS]
    if min(start) <= 0:
        raise ValueError("MNIST: FedLap does not start ahead of FedAvg at every fraction")
    side = "below" if max(end) < 0 else "above" if min(end) > 0 else "around"
    return {"lo": fmt(min(start)), "hi": fmt(max(start)), "elo": fmt(min(abs(e) for e in end)),
            "ehi": fmt(max(abs(e) for e in end)), "side": side}


@claim("fedlap.mnist_fedprox", LM, "here FedProx starts {side} FedLap (by {lo} to {hi} points over rounds 1-20, at "
       "{where}), where the paper has it behind, and with {per} images a client the stragglers change little (a "
       "method's mean over rounds 1-20 by at most {x} points)")
def _(data):
    """MNIST: FedProx's mean over rounds 1-20 minus FedLap's (means over seeds) at each straggler
    fraction; the largest change of a method's mean over rounds 1-20 with stragglers against
    without (a bound: rounded up); the images a client holds (partition.csv)."""
    cells = fedlap_cells(data, "mnist_train10k")
    means = {key: mean(seed_means(data, runs)) for key, runs in cells.items()}
    diffs = [means[("fedprox", s)] - means[("fedlap", s)] for s in FRACTIONS]
    ahead = sum(d > 0 for d in diffs)
    change = straggler_change(data, "mnist_train10k")
    sizes = {int(v) for v in read_csv(cells[("fedlap", 0.0)][0].path, "partition.csv")["examples"]}
    return {"side": "ahead of" if ahead == len(diffs) else "behind" if ahead == 0 else "level with",
            "lo": fmt(min(abs(d) for d in diffs)), "hi": fmt(max(abs(d) for d in diffs)),
            "where": "every straggler fraction" if ahead in (0, len(diffs)) else f"{ahead} of {len(diffs)} fractions",
            "per": joined(map(str, sorted(sizes))), "x": bound_up(change)}


# ----------------------------------------------------------------------------- FedLap, the whole MNIST

LW = "fedlap_mnist"


def signed_range(values: list[Decimal], above: str, below: str) -> str:
    """``0.6 to 0.8 points <above>`` when every value is positive, ``... <below>`` when every one
    is negative, else ``between -0.3 and 0.4 points from``."""
    if min(values) > 0 or max(values) < 0:
        side = above if min(values) > 0 else below
        return f"{fmt(min(abs(v) for v in values))} to {fmt(max(abs(v) for v in values))} points {side}"
    return f"between {fmt(min(values))} and {fmt(max(values))} points from"


@claim("fedlap_mnist.data", LW, "{train} training images cut into {shards} label-sorted shards of {size}, so each "
       "client holds {per} images, as the paper has it. {n} runs, {minutes} minutes of CPU")
def _(data):
    """The whole-MNIST FedLap runs' data (partition.csv: every client the same size; the shards a
    client), how many runs and their time in their rounds together (summary.json round_seconds)."""
    return fedlap_data(data, "fedlap/mnist")


def lw_fractions(cells: dict) -> list[float]:
    return sorted({s for (_m, s) in cells})


@claim("fedlap_mnist.rows", LW, "{rows}")
def _(data):
    """Whole MNIST, per straggler fraction: each method's accuracy after round 20 (mean over seeds
    [min-max]) / its mean over rounds 1-20 (mean over seeds), and the seeds in which FedLap's mean
    over rounds 1-20 beats both baselines."""
    cells = fedlap_cells(data, "mnist")
    rows = []
    for s in lw_fractions(cells):
        parts = []
        for m in ("fedlap", "fedprox", "fedavg"):
            at20 = [data.at(r, T) for r in cells[(m, s)]]
            parts.append(f"{fmt(mean(at20))}% [{fmt(min(at20))}-{fmt(max(at20))}] / "
                         f"{fmt(mean(seed_means(data, cells[(m, s)])))}%")
        k, n = ahead_of_both(data, cells[("fedlap", s)], [cells[(m, s)] for m in BASELINES])
        rows.append(f"| {fmt(100 * dec(s), 0)}% | {' | '.join(parts)} | {k} of {n} |")
    return {"rows": "\n".join(rows)}


@claim("fedlap_mnist.versus", LW, "Over rounds 1-20 FedLap is {avg} FedAvg and {prox} FedProx (mu = 1); after round "
       "20 it is {avg20} FedAvg and {prox20} FedProx")
def _(data):
    """Whole MNIST: FedLap's mean over rounds 1-20 minus each baseline's, and its accuracy after
    round 20 minus each baseline's (means over seeds), the range over the straggler fractions."""
    cells = fedlap_cells(data, "mnist")
    fr = lw_fractions(cells)
    mus = {float(aggregator(r, "mu")) for s in fr for r in cells[("fedprox", s)]}
    if mus != {1.0}:
        raise ValueError(f"FedProx's mu is {mus}, not the preset's 1")

    def diffs(m: str, measure) -> list[Decimal]:
        return [mean(measure(r) for r in cells[("fedlap", s)]) - mean(measure(r) for r in cells[(m, s)]) for s in fr]
    start = lambda r: data.mean_to(r, T)  # noqa: E731
    end = lambda r: data.at(r, T)  # noqa: E731
    return {"avg": signed_range(diffs("fedavg", start), "ahead of", "behind"),
            "prox": signed_range(diffs("fedprox", start), "ahead of", "behind"),
            "avg20": signed_range(diffs("fedavg", end), "ahead of", "behind"),
            "prox20": signed_range(diffs("fedprox", end), "ahead of", "behind")}


@claim("fedlap_mnist.ahead", LW, "FedLap's mean accuracy over rounds 1-20 beats both baselines in {k} of {n} (seed, "
       "fraction) pairs")
def _(data):
    """Whole MNIST: the (seed, straggler fraction) pairs in which FedLap's mean over rounds 1-20
    beats FedProx's and FedAvg's."""
    cells = fedlap_cells(data, "mnist")
    k = n = 0
    for s in lw_fractions(cells):
        a, b = ahead_of_both(data, cells[("fedlap", s)], [cells[(m, s)] for m in BASELINES])
        k, n = k + a, n + b
    return {"k": k, "n": n}


@claim("fedlap_mnist.stragglers", LW, "the stragglers move a method's mean over rounds 1-20 by at most {x} points "
       "(with {per} images a client, below, by at most {y})")
def _(data):
    """Whole MNIST, and MNIST's first 10,000 images (its clients' size from partition.csv): the
    largest change of a method's mean over rounds 1-20 (mean over seeds) with stragglers against
    without (bounds: rounded up)."""
    small = fedlap_cells(data, "mnist_train10k")
    sizes = {int(v) for v in read_csv(small[("fedlap", 0.0)][0].path, "partition.csv")["examples"]}
    return {"x": bound_up(straggler_change(data, "mnist")), "y": bound_up(straggler_change(data, "mnist_train10k")),
            "per": joined(map(str, sorted(sizes)))}
