"""Section ``niidbench``: the NIID-Bench grid on MNIST's first 10,000 images and its comparison with
Flower's baseline; ``niidbench_readings``: data size and SCAFFOLD's divergence, reading by reading."""
from __future__ import annotations

import csv
import math
import statistics
from decimal import Decimal

from fedrun.moved import current_target
from fedrun.results import Run, read_rounds

from scripts.common.claims_core import (Data, MNIST_TRAIN, SEEDS, aggregator, bound_up, dec, diverged_at, exact, fmt,
                                        held_out_images, hyper, joined, mean, sd, thousands, words)
from scripts.common.claims_registry import claim


# ============================================================================= NIID-Bench (MNIST)

NB = "niidbench"
PARTITIONS = ("dir05", "c1", "c2", "c3", "iid")
METHODS = ("fedavg", "fedprox", "scaffold", "fednova")


def nb(data: Data, partition: str, method: str) -> list[Run]:
    """The three seeds' runs of a NIID-Bench cell (outputs/reproductions/niidbench/mnist_<partition>)."""
    return [data.run(f"niidbench/mnist_{partition}", method, s) for s in SEEDS]


def finals(data: Data, partition: str, method: str) -> list[Decimal | None]:
    return [data.final(r) for r in nb(data, partition, method)]


def cell_mean(data: Data, partition: str, method: str) -> Decimal:
    """A cell's mean final accuracy (%) over the seeds that did not diverge (as the table's)."""
    return mean(v for v in finals(data, partition, method) if v is not None)


def flower_gaps(data: Data, partition: str) -> list[Decimal]:
    """Flower's one run minus our mean final accuracy, per method with a finished run."""
    ref = data.reference()
    return [ref[(m, "mnist", partition)] - cell_mean(data, partition, m) for m in METHODS
            if any(v is not None for v in finals(data, partition, m))]


def seed_leads(data: Data, partition: str, method: str) -> list[Decimal]:
    """Per seed: ``method``'s final accuracy minus the best of the other three (points)."""
    out = []
    for i in range(len(SEEDS)):
        others = [finals(data, partition, m)[i] for m in METHODS if m != method]
        out.append(finals(data, partition, method)[i] - max(v for v in others if v is not None))
    return out


def images(points: Decimal, tests: int) -> int:
    """A difference in accuracy (points) as a number of test images."""
    n = points * tests / 100
    if n != n.to_integral_value():
        raise ValueError(f"{points} points of {tests} images is no whole number of images")
    return int(n)


def nb_sizes(data: Data) -> dict:
    run = nb(data, "iid", "fedavg")[0]
    train = data.train_images(run)
    parties = hyper(run, "num_clients")
    return {"train": train, "parties": parties, "party": train // parties, "test": held_out_images(run, train),
            "B": hyper(run, "batch_size"), "E": hyper(run, "local_epochs")}


PARTITION_LABELS = {"dir05": "p_k ~ Dir(0.5)", "c1": "#C=1", "c2": "#C=2", "c3": "#C=3", "iid": "IID"}
METHOD_NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova"}


def grid_cell(data: Data, name: str, method: str) -> str:
    """One cell of a Table III grid (the runs of ``method`` under ``name``, a folder below
    outputs/reproductions) as far as its runs go: the finished runs' final accuracy, mean +- sd over
    seeds, then the best round's mean, with ``[seeds ...]`` while the cell lacks a seed; the
    diverged runs (``k div``, their rounds) and the runs stopped part way (``seed s at round r``)
    after it; ``-`` where no run has started.  Every figure rounded half up on the exact values."""
    runs = data.runs(name, method) if data.folder(name).is_dir() else []
    done = [r for r in runs if r.finished]
    div = [(r.seed, diverged_at(r)) for r in runs if diverged_at(r) is not None]
    parts = []
    if done:
        finals_ = [data.final(r) for r in done]
        text = fmt(mean(finals_)) + (f" +- {fmt(sd(finals_))}" if len(done) > 1 else "")
        text += f" / {fmt(mean(data.best(r) for r in done))}"
        if len(done) + len(div) < len(SEEDS):  # the cell is not complete: which seeds the mean is over
            text += f" [seed{'s' if len(done) > 1 else ''} {', '.join(str(r.seed) for r in done)}]"
        parts.append(text)
    if div:
        parts.append(f"{len(div)} div (round{'s' if len(div) > 1 else ''} {', '.join(str(d) for _, d in div)})")
    for r in runs:
        if not r.finished and diverged_at(r) is None:
            parts.append(f"seed {r.seed} at round {data.reached(r)}")
    return ", ".join(parts) if parts else "-"


def grid_table(data: Data, root: str) -> str:
    """Table III's MNIST rows from the grid under ``root`` (its folders ``mnist_<partition>``), a
    :func:`grid_cell` per partition and method, each beside Flower's one run."""
    ref = data.reference()
    rows = ["| partition | " + " | ".join(f"{name} | Flower" for name in METHOD_NAMES.values()) + " |",
            "|---|" + "---|" * 2 * len(METHOD_NAMES)]
    for part, label in PARTITION_LABELS.items():
        cells = [f"{grid_cell(data, f'{root}/mnist_{part}', m)} | {fmt(ref[(m, 'mnist', part)])}" for m in METHOD_NAMES]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def sci(x) -> str:
    """A power of ten's multiple as the doc writes it: 1e-5."""
    mantissa, exponent = f"{float(x):e}".split("e")
    return f"{fmt(mantissa, 0) if float(mantissa).is_integer() else mantissa.rstrip('0')}e{int(exponent)}"


@claim("niidbench.setting", NB, "FedAvg, FedProx (mu = {mu}), SCAFFOLD and FedNova under p_k ~ Dir(0.5), #C=1, #C=2, "
       "#C=3 and IID, with the presets of `conf/experiment/niidbench/` (the simple CNN, {parties} parties all in every "
       "round, {rounds} rounds, E = {E}, B = {B}, SGD lr {lr} with momentum {momentum} and weight decay {wd};")
def _(data):
    """The settings every run of the grid shares (config.yaml: one value each over the 60 runs),
    and FedProx's mu."""
    runs = [r for p in PARTITIONS for m in METHODS for r in nb(data, p, m)]
    keys = ("num_clients", "client_fraction", "rounds", "local_epochs", "batch_size", "lr", "momentum", "weight_decay")
    values = {}
    for key in keys:
        seen = {hyper(r, key) for r in runs}
        if len(seen) != 1:
            raise ValueError(f"the grid's runs differ in hyperparams.{key}: {sorted(map(str, seen))}")
        values[key] = seen.pop()
    models = {current_target((r.config.get("model") or {}).get("_target_")) for r in runs}  # old layouts too
    mus = {aggregator(r, "mu") for p in PARTITIONS for r in nb(data, p, "fedprox")}
    if models != {"fedrun.models.nets.SimpleCNN"} or values["client_fraction"] != 1.0 or len(mus) != 1:
        raise ValueError(f"the grid's models {models}, client_fraction {values['client_fraction']}, FedProx mu {mus}")
    return {"mu": mus.pop(), "parties": values["num_clients"], "rounds": values["rounds"], "E": values["local_epochs"],
            "B": values["batch_size"], "lr": values["lr"], "momentum": values["momentum"],
            "wd": sci(values["weight_decay"])}


@claim("niidbench.data", NB, "{train} images to train ({party} a party, so {batches} batches an epoch and {steps} "
       "local steps a round, where the whole MNIST gives about {whole} on average) and {test} held out as the test set")
def _(data):
    """The IID runs' data: training images (partition.csv), per party, batches of B an epoch, the
    local steps every party takes a round (clients.csv, all seeds: one value), what the whole
    MNIST (60,000 images) gives with as many parties, and the held-out test images."""
    size = nb_sizes(data)
    steps = {int(s) for r in nb(data, "iid", "fedavg") for s in data.clients(r)["steps"]}
    if len(steps) != 1:
        raise ValueError(f"the IID parties take different numbers of steps: {sorted(steps)}")
    whole = math.ceil(MNIST_TRAIN / size["parties"] / size["B"]) * size["E"]
    return {"train": thousands(size["train"]), "party": thousands(size["party"]),
            "batches": math.ceil(size["party"] / size["B"]),
            "steps": steps.pop(), "whole": whole, "test": thousands(size["test"])}


@claim("niidbench.command", NB, "({n} runs; a finished run took {lo} to {hi} minutes")
def _(data):
    """How many runs the grid holds (finished and diverged) and the range of a finished run's time
    in its rounds (summary.json's round_seconds, the sum of rounds.csv's wall_s), in minutes."""
    runs = [r for p in PARTITIONS for m in METHODS for r in nb(data, p, m)]
    minutes = [dec(r.summary["round_seconds"]) / 60 for r in runs if r.finished]
    return {"n": len(runs), "lo": fmt(min(minutes), 0), "hi": fmt(max(minutes), 0)}


@claim("niidbench.table", NB, "{rows}")
def _(data):
    """The grid's table (outputs/reproductions/niidbench: MNIST's first 10,000 images): per
    partition and method the final accuracy (mean +- sd over the seeds that did not diverge / the
    best round's mean), the diverged runs and their rounds, beside Flower's one run
    (:func:`grid_table`)."""
    return {"rows": grid_table(data, "niidbench")}


@claim("niidbench.flower_versions", NB, "which under #C=1 differ widely from the one run ({c1}) and elsewhere on "
       "MNIST by {lo} to {hi} points (the most: {most})")
def _(data):
    """Flower's two READMEs on MNIST, cell by cell: the merged one's best-round mean over three runs
    (scripts/paper_targets/niidbench_flower_best_rounds.csv) against the one run (the reference
    CSV); the #C=1 cells more than a point apart, listed, and the smallest and largest |difference|
    over the other cells (raises where one of those is more than a point apart)."""
    one, best = data.reference(), data.flower_best()
    wide, rest = [], []
    for part in PARTITION_LABELS:
        for m, name in METHOD_NAMES.items():
            (b, s), o = best[(m, "mnist", part)], one[(m, "mnist", part)]
            if part == "c1" and abs(b - o) > 1:
                wide.append(f"{name} {exact(b)} +- {exact(s)} against {fmt(o)}")
            else:
                rest.append((abs(b - o), f"{name} under {PARTITION_LABELS[part]}, {exact(b)} against {fmt(o)}"))
    far = max(rest, key=lambda x: x[0])
    if far[0] > 1:
        raise ValueError(f"outside the wide #C=1 cells Flower's two versions differ by more than a point: {far[1]}")
    return {"c1": ", ".join(wide), "lo": exact(min(d for d, _ in rest)), "hi": exact(far[0]), "most": far[1]}


@claim("niidbench.paper_cells", NB, "`scripts/paper_targets/niidbench_table3_accuracy.csv` lists its {n} cells {empty}")
def _(data):
    """The transcription of the paper's Table III: how many cells it lists, and that none has a number."""
    with open(data.root / "scripts" / "paper_targets" / "niidbench_table3_accuracy.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    filled = sum(bool(r["accuracy_pct"].strip()) for r in rows)
    return {"n": len(rows), "empty": "empty" if not filled else f"with {filled} filled"}


@claim("niidbench.iid_spread", NB, "in each seed the four methods end within {spread} points of each other")
def _(data):
    """IID: the largest spread (best minus worst final accuracy) of the four methods in one seed."""
    spreads = []
    for i in range(len(SEEDS)):
        values = [finals(data, "iid", m)[i] for m in METHODS]
        spreads.append(max(values) - min(values))
    return {"spread": exact(max(spreads))}


@claim("niidbench.iid_fednova_is_fedavg", NB, "FedNova's runs are {same} to the last digit of every `rounds.csv` "
       "column but the timings")
def _(data):
    """IID: FedNova's rounds.csv equals FedAvg's, seed by seed, in every column but the timings
    (equal parties take equal steps, where FedNova is FedAvg)."""
    same = all(data.same_but_timings(a, b) for a, b in zip(nb(data, "iid", "fednova"), nb(data, "iid", "fedavg")))
    return {"same": "FedAvg's" if same else "NOT FedAvg's"}


def scaffold_lead(data: Data, partition: str, all_seeds: str) -> dict:
    """SCAFFOLD's lead over the best of the other three, seed by seed, under ``partition``: in how
    many seeds it is ahead (``all_seeds`` when in every one), the smallest and largest lead in points
    and in test images of the held-out set (``test``)."""
    leads = seed_leads(data, partition, "scaffold")
    tests = nb_sizes(data)["test"]
    ahead = sum(v > 0 for v in leads)
    return {"where": all_seeds if ahead == len(leads) else f"{ahead} of {len(leads)} seeds",
            "lo": exact(min(leads)), "hi": exact(max(leads)), "ilo": images(min(leads), tests),
            "ihi": images(max(leads), tests), "test": thousands(tests)}


@claim("niidbench.iid_scaffold", NB, "SCAFFOLD ends highest in {where}, by {lo} to {hi} points ({ilo} to {ihi} "
       "test images)")
def _(data):
    """IID: in how many seeds SCAFFOLD's final accuracy is above the other three's, by how much
    (points and test images of the 2,000)."""
    return scaffold_lead(data, "iid", "each seed")


@claim("niidbench.iid_flower", NB, "The gap to Flower's whole-MNIST run is {lo} to {hi} points, as under Dir(0.5)")
def _(data):
    """IID: Flower's one run minus our mean final accuracy, the range over the four methods."""
    gaps = flower_gaps(data, "iid")
    return {"lo": fmt(min(gaps)), "hi": fmt(max(gaps))}


@claim("niidbench.dir05_spread", NB, "the four methods are within {bound} of each other")
def _(data):
    """Dir(0.5): the four methods' final accuracies in one seed lie within a point (the largest
    spread over the seeds)."""
    spread = max(max(v) - min(v) for v in zip(*(finals(data, "dir05", m) for m in METHODS)))
    return {"bound": "a point" if spread < 1 else f"{bound_up(spread)} points"}


@claim("niidbench.dir05_scaffold", NB, "SCAFFOLD is ahead of the other three in {where}, but by {lo} to {hi} "
       "points over the next best ({ilo} to {ihi} of the {test} test images)")
def _(data):
    """Dir(0.5): SCAFFOLD's final accuracy beats the other three's in each seed; its lead over the
    next best (points and test images)."""
    return scaffold_lead(data, "dir05", f"each of the {len(SEEDS)} seeds")


@claim("niidbench.dir05_flower", NB, "Every method is {lo} to {hi} points below Flower's run on the whole MNIST")
def _(data):
    """Dir(0.5): Flower's one run minus our mean final accuracy, the range over the four methods."""
    gaps = flower_gaps(data, "dir05")
    return {"lo": fmt(min(gaps)), "hi": fmt(max(gaps))}


@claim("niidbench.fewer_images", NB, "what {ratio} times fewer training images")
def _(data):
    """The whole MNIST's 60,000 training images over the runs' (partition.csv)."""
    return {"ratio": fmt(Decimal(MNIST_TRAIN) / nb_sizes(data)["train"])}


@claim("niidbench.c1", NB, "FedAvg, FedProx and FedNova end anywhere between {lo}% and {hi}% depending on the seed "
       "(standard deviations of {sdlo} to {sdhi} points); SCAFFOLD stays at chance ({clo}-{chi}%) in {n} seeds and "
       "diverges at round {r} in the third")
def _(data):
    """#C=1: the range of FedAvg's, FedProx's and FedNova's final accuracies over their 9 runs, the
    range of the three methods' standard deviations over seeds; SCAFFOLD's finished runs (their
    final accuracies) and the round its third run diverged at."""
    values = {m: finals(data, "c1", m) for m in ("fedavg", "fedprox", "fednova")}
    every = [v for vs in values.values() for v in vs]
    sds = [statistics.stdev(vs) for vs in values.values()]
    scaffold = nb(data, "c1", "scaffold")
    ended = [data.final(r) for r in scaffold if data.final(r) is not None]
    rounds = [diverged_at(r) for r in scaffold if diverged_at(r)]
    if len(rounds) != 1:
        raise ValueError(f"#C=1: {len(rounds)} SCAFFOLD runs diverged, the doc says one")
    return {"lo": fmt(min(every), 0), "hi": fmt(max(every), 0), "sdlo": fmt(min(sds), 0), "sdhi": fmt(max(sds), 0),
            "clo": fmt(min(ended), 0), "chi": fmt(max(ended), 0), "n": words(len(ended)), "r": rounds[0]}


@claim("niidbench.c1_flower", NB, "Flower's one run scatters the same way (FedAvg {a}%, FedProx {p}%)")
def _(data):
    """#C=1: Flower's FedAvg and FedProx (scripts/paper_targets/niidbench_reference_results.csv)."""
    ref = data.reference()
    return {"a": fmt(ref[("fedavg", "mnist", "c1")]), "p": fmt(ref[("fedprox", "mnist", "c1")])}


@claim("niidbench.c2_fedavg_fedprox", NB, "In #C=2 FedAvg is ahead of FedProx in {where} (by {lo} to {hi} points)")
def _(data):
    """#C=2: FedAvg's final accuracy minus FedProx's, seed by seed (in how many seeds it is ahead,
    and the range of the differences)."""
    diffs = [a - p for a, p in zip(finals(data, "c2", "fedavg"), finals(data, "c2", "fedprox"))]
    ahead = sum(d > 0 for d in diffs)
    return {"where": f"each of the {len(diffs)} seeds" if ahead == len(diffs) else f"{ahead} of {len(diffs)} seeds",
            "lo": fmt(min(diffs)), "hi": fmt(max(diffs))}


@claim("niidbench.fednova_seed0", NB, "(FedNova's seed 0 ends at {c2}% under #C=2 and {c3}% under #C=3, after best "
       "rounds of {b2}% and {b3}%)")
def _(data):
    """FedNova, seed 0: its final and best accuracy under #C=2 and #C=3 (the last round's swing)."""
    c2, c3 = nb(data, "c2", "fednova")[0], nb(data, "c3", "fednova")[0]
    return {"c2": exact(data.final(c2)), "c3": exact(data.final(c3)), "b2": exact(data.best(c2)),
            "b3": exact(data.best(c3))}


@claim("niidbench.flower_gap_skew", NB, "{dlo} to {dhi} points under Dir(0.5), {c3lo} to {c3hi} under #C=3, {c2lo} to "
       "{c2hi} under #C=2")
def _(data):
    """Flower's one run minus our mean final accuracy, the range over the methods (those with a
    finished run), under Dir(0.5), #C=3 and #C=2."""
    out = {}
    for key, partition in (("d", "dir05"), ("c3", "c3"), ("c2", "c2")):
        gaps = flower_gaps(data, partition)
        out.update({f"{key}lo": fmt(min(gaps)), f"{key}hi": fmt(max(gaps))})
    return out


@claim("niidbench.party_size", NB, "Fewer images a party ({party} instead of about {whole})")
def _(data):
    """Training images per party here (partition.csv) and with the whole MNIST's 60,000."""
    size = nb_sizes(data)
    return {"party": thousands(size["party"]), "whole": thousands(MNIST_TRAIN // size["parties"])}


@claim("niidbench.scaffold_diverges", NB, "in {k2} of {n2} seeds under #C=2 (rounds {r2}) and in {k3} of {n3} under "
       "#C=3 (round {r3}; the other two end at {a}% and {b}%)")
def _(data):
    """SCAFFOLD under #C=2 and #C=3: how many seeds diverged and at which rounds (run.json), and
    the final accuracies of the #C=3 runs that did not."""
    out = {}
    for key, partition in (("2", "c2"), ("3", "c3")):
        runs = nb(data, partition, "scaffold")
        rounds = [str(diverged_at(r)) for r in runs if diverged_at(r)]
        out.update({f"k{key}": len(rounds), f"n{key}": len(runs), f"r{key}": ", ".join(rounds)})
    ended = [v for v in finals(data, "c3", "scaffold") if v is not None]
    if len(ended) != 2:
        raise ValueError(f"#C=3: {len(ended)} SCAFFOLD runs finished, the doc names two")
    return {**out, "a": exact(ended[0]), "b": exact(ended[1])}


@claim("niidbench.flower_scaffold", NB, "Flower's MNIST run does not ({c2}%, {c3}%; on FashionMNIST #C=2 its "
       "SCAFFOLD ends at chance, {f}%)")
def _(data):
    """Flower's SCAFFOLD on MNIST #C=2 and #C=3 and on FashionMNIST #C=2 (the reference CSV)."""
    ref = data.reference()
    return {"c2": fmt(ref[("scaffold", "mnist", "c2")]), "c3": fmt(ref[("scaffold", "mnist", "c3")]),
            "f": fmt(ref[("scaffold", "fmnist", "c2")])}


# ----------------------------------------------------------------------------- NIID-Bench readings

NR = "niidbench_readings"


def readings(data: Data, folder: str, method: str, max_train: int | None = None) -> list[Run]:
    return [data.run(f"niidbench_readings/{folder}", method, s, max_train=max_train) for s in SEEDS]


@claim("readings.mnist_half", NR, "(`dataset.max_train={max_train}`, {party} images a party) lowers the best round's "
       "accuracy in {where} ({h0}, {h1}, {h2}% against {f0}, {f1}, {f2}%) and the final mean from {fm}% to {hm}% "
       "(seed by seed {hs0}, {hs1}, {hs2} against {fs0}, {fs1}, {fs2})")
def _(data):
    """FedAvg under #C=2 with half of the training images (max_train=4000) against the grid's:
    the best round's accuracy seed by seed (in how many seeds it is lower) and the final
    accuracy, each seed and the mean over seeds."""
    half, full = readings(data, "mnist_c2_train4000", "fedavg", 4000), nb(data, "c2", "fedavg")
    hb, fb = [data.best(r) for r in half], [data.best(r) for r in full]
    hf, ff = [data.final(r) for r in half], [data.final(r) for r in full]
    lower = sum(h < f for h, f in zip(hb, fb))
    max_train = (half[0].config.get("dataset") or {}).get("max_train")
    out = {"max_train": max_train, "party": thousands(data.train_images(half[0]) // hyper(half[0], "num_clients")),
           "where": "each seed" if lower == len(hb) else f"{lower} of {len(hb)} seeds",
           "fm": fmt(mean(ff)), "hm": fmt(mean(hf))}
    for i in range(len(SEEDS)):
        out.update({f"h{i}": exact(hb[i]), f"f{i}": exact(fb[i]), f"hs{i}": exact(hf[i]), f"fs{i}": exact(ff[i])})
    return out


@claim("readings.fmnist_size", NR, "the full training set against its first {n8k} images ({pfull} against {p8k} a "
       "party, the same 10,000 test images), seeds 0 and 1: final {f0}% and {f1}% against {e0}% and {e1}% ({d0} and "
       "{d1} points lower), best rounds {b0}% and {b1}% against {c0}% and {c1}%; Flower's one whole-data run: {fl}%")
def _(data):
    """FedAvg on FashionMNIST #C=2, the whole training set against its first 8,000 images, seeds 0
    and 1: training images per party (partition.csv), final and best accuracy, the drop of the
    final accuracy seed by seed, and Flower's one run (the reference CSV)."""
    name = "niidbench_readings/fmnist_c2_size"
    full, small = [], []
    for r in data.runs(name, "fedavg"):
        (small if (r.config.get("dataset") or {}).get("max_train") else full).append(r)
    full.sort(key=lambda r: r.seed)
    small.sort(key=lambda r: r.seed)
    if [r.seed for r in full] != [0, 1] or [r.seed for r in small] != [0, 1]:
        raise ValueError(f"{name}: expected seeds 0 and 1 of both sizes")
    parties = hyper(full[0], "num_clients")
    out = {"n8k": thousands(data.train_images(small[0])), "pfull": thousands(data.train_images(full[0]) // parties),
           "p8k": thousands(data.train_images(small[0]) // parties),
           "fl": fmt(data.reference()[("fedavg", "fmnist", "c2")])}
    for i in range(2):
        out.update({f"f{i}": fmt(data.final(full[i])), f"e{i}": fmt(data.final(small[i])),
                    f"d{i}": fmt(data.final(full[i]) - data.final(small[i])),
                    f"b{i}": fmt(data.best(full[i])), f"c{i}": fmt(data.best(small[i]))})
    return out


@claim("readings.fmnist_apart", NR, "two seeds of the whole FashionMNIST end {d} points apart")
def _(data):
    """The whole FashionMNIST's two FedAvg runs (#C=2): the difference of their final accuracies."""
    full = [r for r in data.runs("niidbench_readings/fmnist_c2_size", "fedavg")
            if not (r.config.get("dataset") or {}).get("max_train")]
    values = [data.final(r) for r in full]
    return {"d": fmt(max(values) - min(values))}


@claim("readings.fmnist_minutes", NR, "the whole FashionMNIST's two #C=2 FedAvg runs took {a} and {b} minutes")
def _(data):
    """The whole FashionMNIST's two FedAvg runs (#C=2): each run's wall time (the sum of rounds.csv's
    wall_s over its 50 rounds) in whole minutes, shortest first; what a whole-data NIID-Bench run
    costs on the CPU."""
    full = [r for r in data.runs("niidbench_readings/fmnist_c2_size", "fedavg")
            if not (r.config.get("dataset") or {}).get("max_train")]
    minutes = sorted(sum(float(w) for w in read_rounds(r.path)["wall_s"]) / 60 for r in full)
    return {"a": fmt(dec(minutes[0]), 0), "b": fmt(dec(minutes[1]), 0)}


def seed_cells(data: Data, runs: list[Run]) -> dict:
    """A table row's cells, seed by seed: ``diverged at t`` or the final accuracy (exact) in %."""
    return {f"s{i}": f"diverged at {diverged_at(r)}" if diverged_at(r) else f"{exact(data.final(r))}%"
            for i, r in enumerate(runs)}


ROW = "| {s0} | {s1} | {s2} |"


@claim("readings.scaffold_gradient", NR, "| momentum 0.9, correction through the optimizer (`correction=gradient`, the "
       "preset) " + ROW)
def _(data):
    """SCAFFOLD under #C=2 with the preset's correction: each seed's divergence round or final accuracy."""
    return seed_cells(data, nb(data, "c2", "scaffold"))


@claim("readings.scaffold_after_step", NR, "| momentum 0.9, correction after each step (`correction=after_step`, "
       "NIID-Bench's code) " + ROW)
def _(data):
    """SCAFFOLD under #C=2 with correction=after_step: each seed's divergence round or final accuracy."""
    runs = readings(data, "mnist_c2_after_step", "scaffold")
    if any((r.config.get("aggregator") or {}).get("correction") != "after_step" for r in runs):
        raise ValueError("mnist_c2_after_step: a run without correction=after_step")
    return seed_cells(data, runs)


@claim("readings.scaffold_momentum0", NR, "| momentum 0 (plain SGD: both readings are one) " + ROW)
def _(data):
    """SCAFFOLD under #C=2 with momentum 0: each seed's final accuracy (or divergence round)."""
    runs = readings(data, "mnist_c2_momentum0", "scaffold")
    if any(hyper(r, "momentum") != 0 for r in runs):
        raise ValueError("mnist_c2_momentum0: a run with momentum")
    return seed_cells(data, runs)


@claim("readings.fedavg_momentum0", NR, "| FedAvg, momentum 0 (for comparison) " + ROW)
def _(data):
    """FedAvg under #C=2 with momentum 0: each seed's final accuracy."""
    return seed_cells(data, readings(data, "mnist_c2_momentum0", "fedavg"))


@claim("readings.c1_after_step", NR, "`correction=after_step` also ends at chance or diverges ({a}% and {b}%; seed "
       "{s} diverged at round {r})")
def _(data):
    """SCAFFOLD under #C=1 with correction=after_step: the finished seeds' final accuracies and the
    seed and round that diverged."""
    runs = readings(data, "mnist_c1_after_step", "scaffold")
    ended = [data.final(r) for r in runs if not diverged_at(r)]
    gone = [(r.seed, diverged_at(r)) for r in runs if diverged_at(r)]
    if len(ended) != 2 or len(gone) != 1:
        raise ValueError(f"mnist_c1_after_step: {len(ended)} finished and {len(gone)} diverged, the doc says 2 and 1")
    return {"a": fmt(ended[0]), "b": fmt(ended[1]), "s": gone[0][0], "r": gone[0][1]}


@claim("readings.momentum0_lower", NR, "It then ends lower ({slo} to {shi}%, against FedAvg's {flo} to {fhi}% with "
       "momentum), and so does FedAvg without momentum ({alo} to {ahi}%)")
def _(data):
    """#C=2: the range over seeds of the final accuracy of SCAFFOLD without momentum, of FedAvg
    with momentum (the grid) and of FedAvg without momentum."""
    s = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "scaffold")]
    f = finals(data, "c2", "fedavg")
    a = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "fedavg")]
    return {"slo": exact(min(s)), "shi": exact(max(s)), "flo": exact(min(f)), "fhi": exact(max(f)),
            "alo": exact(min(a)), "ahi": exact(max(a))}


@claim("readings.scaffold_vs_fedavg_momentum0", NR, "({ahead}, {behind})")
def _(data):
    """#C=2 without momentum: SCAFFOLD's final accuracy minus FedAvg's, seed by seed (the seeds it
    is ahead in and behind in, and by how much)."""
    s = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "scaffold")]
    a = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "fedavg")]
    diffs = [x - y for x, y in zip(s, a)]

    def part(word, which):
        seeds = [i for i, d in enumerate(diffs) if which(d)]
        if not seeds:
            return f"{word} in no seed"
        label = "seeds" if len(seeds) > 1 else "seed"
        return (f"{word} in {label} {joined(str(SEEDS[i]) for i in seeds)} by "
                f"{joined(exact(abs(diffs[i])) for i in seeds)}")
    ahead = part("ahead", lambda d: d > 0) + " points"
    return {"ahead": ahead, "behind": part("behind", lambda d: d < 0)}


@claim("readings.steps", NR, "(about {whole} local steps a round instead of {steps})")
def _(data):
    """The local steps a party takes a round with the whole MNIST (60,000 images over the parties,
    batches of B, E epochs) and here (clients.csv of the IID runs)."""
    size = nb_sizes(data)
    steps = {int(s) for r in nb(data, "iid", "fedavg") for s in data.clients(r)["steps"]}
    return {"whole": math.ceil(MNIST_TRAIN / size["parties"] / size["B"]) * size["E"], "steps": joined(map(str, steps))}
