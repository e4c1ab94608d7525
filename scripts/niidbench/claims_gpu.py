"""Section ``niidbench_gpu``: NIID-Bench's #C=2 and IID rows on the whole MNIST, GPU runs cut short."""
from __future__ import annotations

import statistics
from decimal import Decimal

from fedrun.results import Run, read_rounds

from scripts.common.claims_core import Data, SEEDS, bound_up, dec, diverged_at, exact, fmt, hyper, mean, sd, thousands
from scripts.common.claims_registry import claim
from scripts.niidbench.claims import nb, readings


# ----------------------------------------------------------------------------- NIID-Bench, whole MNIST, GPU

NG = "niidbench_gpu"
NG_DRAW = "niidbench_gpu/h200_2026-11-27"  # scripts/bench/gpu_check.sh niidbench on one NVIDIA H200
NG_ROUNDS = {"c2": 14, "iid": 22}  # where each partition's population stopped at the budget
NG_NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova"}


def ng(data: Data, partition: str, method: str) -> list[Run]:
    """The whole-MNIST GPU runs of a NIID-Bench cell, seeds 0, 1, 2, all stopped at the same round."""
    runs = [data.run(f"{NG_DRAW}/niidbench/mnist_{partition}", method, s) for s in SEEDS]
    last = {max(data.curve(r)) for r in runs}
    if last != {NG_ROUNDS[partition]}:
        raise ValueError(f"mnist_{partition} {method}: the runs stopped at rounds {sorted(last)}, "
                         f"not all at {NG_ROUNDS[partition]}")
    if any(diverged_at(r) for r in runs):
        raise ValueError(f"mnist_{partition} {method}: a run diverged")
    return runs


def ng_at(data: Data, partition: str, method: str) -> list[Decimal]:
    """Each seed's accuracy (%) at the partition's last common round, whole MNIST."""
    return [data.at(r, NG_ROUNDS[partition]) for r in ng(data, partition, method)]


def small_at(data: Data, partition: str, method: str) -> list[Decimal]:
    """Each seed's accuracy (%) at the same round on MNIST's first 10,000 images (the CPU grid)."""
    return [data.at(r, NG_ROUNDS[partition]) for r in nb(data, partition, method)]


def ng_readings(data: Data, reading: str) -> list[Run]:
    return [data.run(f"{NG_DRAW}/readings/mnist_c2_{reading}", "scaffold", s) for s in SEEDS]


@claim("niidbench_gpu.rows", NG, "{rows}")
def _(data):
    """Per partition and method: the whole-MNIST runs' mean +- sd over seeds 0-2 at the round
    they all reached, the 10,000-image runs' mean at the same round, and Flower's 50-round run."""
    ref, rows = data.reference(), []
    labels = {"c2": "#C=2", "iid": "IID"}
    for part, r in NG_ROUNDS.items():
        for m, name in NG_NAMES.items():
            whole, small = ng_at(data, part, m), small_at(data, part, m)
            rows.append(f"| {labels[part]} | {r} | {name} | {fmt(mean(whole), 2)} +- {fmt(sd(whole), 2)} | "
                        f"{fmt(mean(small), 2)} | {fmt(ref[(m, 'mnist', part)])} |")
    return {"rows": "\n".join(rows)}


@claim("niidbench_gpu.size_gap", NG, "The whole MNIST is ahead at the same round in every cell, by {ilo} to "
       "{ihi} points under IID and {clo} to {chi} under #C=2")
def _(data):
    """Whole MNIST minus the 10,000 images, mean over seeds, at the same round, per method:
    its range under IID and under #C=2 (every difference positive)."""
    out = {}
    for key, part in (("i", "iid"), ("c", "c2")):
        gaps = [mean(ng_at(data, part, m)) - mean(small_at(data, part, m)) for m in NG_NAMES]
        if min(gaps) <= 0:
            raise ValueError(f"{part}: the whole MNIST is not ahead in every method")
        out.update({f"{key}lo": fmt(min(gaps)), f"{key}hi": fmt(max(gaps))})
    return out


@claim("niidbench_gpu.iid_flower", NG, "every method's mean at round 22 is within {bound} points of Flower's "
       "50-round run")
def _(data):
    """|mean at round 22 - Flower| under IID, the largest over the four methods (a bound: rounded
    up)."""
    ref = data.reference()
    worst = max(abs(mean(ng_at(data, "iid", m)) - ref[(m, "mnist", "iid")]) for m in NG_NAMES)
    return {"bound": bound_up(worst)}


@claim("niidbench_gpu.iid_fednova", NG, "FedNova and FedAvg differ by at most {gap} points at round 22")
def _(data):
    """Under IID every party takes the same steps (FedNova is FedAvg, equal on the CPU): the
    largest |FedNova - FedAvg| over the seeds at round 22 on the GPU."""
    gap = max(abs(a - b) for a, b in zip(ng_at(data, "iid", "fednova"), ng_at(data, "iid", "fedavg")))
    return {"gap": exact(gap)}


@claim("niidbench_gpu.c2_lead", NG, "SCAFFOLD is ahead in {k} of 3 seeds at round 14 (mean {s}% against FedProx "
       "{p}%, FedAvg {a}% and FedNova {n}%; in seed {other} FedAvg leads, {a_other}% against SCAFFOLD's {s_other}%). On the 10,000 images SCAFFOLD was the {small_rank} of the four at round 14")
def _(data):
    """#C=2 at round 14, whole MNIST: in how many seeds SCAFFOLD is the best of the four, the four
    means, and the seed where FedAvg leads instead; that SCAFFOLD's mean was the lowest of the four
    at round 14 on the 10,000 images."""
    at = {m: ng_at(data, "c2", m) for m in NG_NAMES}
    leaders = [max(NG_NAMES, key=lambda m: at[m][s]) for s in SEEDS]
    others = [s for s in SEEDS if leaders[s] != "scaffold"]
    if len(others) != 1 or leaders[others[0]] != "fedavg":
        raise ValueError(f"the leaders by seed are {leaders}")
    o = others[0]
    small = {m: mean(small_at(data, "c2", m)) for m in NG_NAMES}
    if min(small, key=small.get) != "scaffold":
        raise ValueError(f"on the 10,000 images at round 14 the means are {small}")
    return {"k": leaders.count("scaffold"), "s": fmt(mean(at["scaffold"]), 2), "p": fmt(mean(at["fedprox"]), 2),
            "a": fmt(mean(at["fedavg"]), 2), "n": fmt(mean(at["fednova"]), 2), "other": o,
            "a_other": fmt(at["fedavg"][o], 2), "s_other": fmt(at["scaffold"][o], 2), "small_rank": "lowest"}


@claim("niidbench_gpu.after_step", NG, "With NIID-Bench's reading (`correction=after_step`) all three seeds "
       "trained {r} rounds on the whole MNIST without diverging (round {r}: {a0}%, {a1}%, {a2}%; best {blo}% to "
       "{bhi}%), where on the 10,000 images {k} of 3 had diverged by round {r} (rounds {rounds})")
def _(data):
    """SCAFFOLD after_step under #C=2 on the whole MNIST: the round every seed reached (none
    diverged), each seed's accuracy there, the range of best rounds; the 10,000-image runs of the
    same reading that diverged by then and where (run.json)."""
    runs = ng_readings(data, "after_step")
    last = {max(data.curve(r)) for r in runs}
    if len(last) != 1 or any(diverged_at(r) for r in runs):
        raise ValueError(f"after_step: the runs stopped at {sorted(last)} or diverged")
    r = last.pop()
    small = [diverged_at(x) for x in readings(data, "mnist_c2_after_step", "scaffold")]
    early = [d for d in small if d is not None and d <= r]
    best = [data.best(x) for x in runs]
    return {"r": r, **{f"a{s}": fmt(data.at(runs[s], r), 2) for s in SEEDS}, "blo": fmt(min(best), 2),
            "bhi": fmt(max(best), 2), "k": len(early),
            "rounds": ", ".join(map(str, early))}


@claim("niidbench_gpu.gradient", NG, "The preset's reading reached round {r} in the population and round {ra} "
       "alone, without diverging in any seed; on the 10,000 images its first divergence came at round {first}")
def _(data):
    """SCAFFOLD with the preset's correction under #C=2, whole MNIST: the last round of the
    population's runs and of the 3 runs alone (none diverged), and the earliest divergence of
    the 10,000-image grid's SCAFFOLD #C=2 runs."""
    pop, alone = ng(data, "c2", "scaffold"), ng_readings(data, "gradient")
    if any(diverged_at(x) for x in alone) or len({max(data.curve(x)) for x in alone}) != 1:
        raise ValueError("the runs alone diverged or stopped at different rounds")
    first = min(d for d in (diverged_at(x) for x in nb(data, "c2", "scaffold")) if d is not None)
    return {"r": max(data.curve(pop[0])), "ra": max(data.curve(alone[0])), "first": first}


@claim("niidbench_gpu.alone", NG, "The same SCAFFOLD run alone and in the population differ by up to {gap} points "
       "of accuracy over rounds 1 to {r} under #C=2")
def _(data):
    """The preset's SCAFFOLD #C=2 runs, alone against the population's, same seed: the largest
    |difference| in test accuracy over the rounds both have (GPU runs are not bitwise repeatable)."""
    pop, alone = ng(data, "c2", "scaffold"), ng_readings(data, "gradient")
    r = max(data.curve(alone[0]))
    gap = max(abs(data.at(p, k) - data.at(a, k)) for p, a in zip(pop, alone) for k in range(1, r + 1))
    return {"gap": exact(gap), "r": r}


@claim("niidbench_gpu.speed", NG, "A round of the 12 #C=2 runs took {c2} s (median of rounds 2 to 14; "
       "{steps} lock-steps, the largest party's 10 epochs), of the 12 IID runs {iid} s ({isteps} lock-steps), "
       "with the two populations and SCAFFOLD's after-step runs ({after} s) sharing the GPU; SCAFFOLD's 3 runs "
       "alone took {alone} s a round, {ms} ms a lock-step for 30 clients")
def _(data):
    """rounds.csv wall_s (the population's round), median over rounds 2..last of each
    population; the largest party's local steps a round (clients.csv, all rounds and seeds);
    SCAFFOLD alone's median round over #C=2's lock-steps, in ms."""
    c2, iid = ng_speed(data)
    alone = median_wall(ng_readings(data, "gradient")[0])
    return {"c2": fmt(c2, 1), "steps": thousands(lock_steps(data, "c2")), "iid": fmt(iid, 1),
            "isteps": lock_steps(data, "iid"), "after": fmt(median_wall(ng_readings(data, "after_step")[0]), 1),
            "alone": fmt(alone, 1), "ms": fmt(alone * 1000 / lock_steps(data, "c2"), 0)}


@claim("niidbench_gpu.rest", NG, "the {rounds} rounds #C=2 still lacks would take {minutes} minutes at that speed")
def _(data):
    """(50 - the round #C=2 reached) x the median #C=2 population round above, in minutes."""
    rounds = hyper(ng(data, "c2", "fedavg")[0], "rounds") - NG_ROUNDS["c2"]
    return {"rounds": rounds, "minutes": fmt(ng_speed(data)[0] * rounds / 60, 0)}


NG_SPLIT = "niidbench_gpu/h200_2026-11-27b"  # the second draw: #C=2 afresh, one process a run


@claim("niidbench_gpu.split", NG, "all {n} runs reached rounds {lo} to {hi} in the call's {budget} s and none "
       "diverged: the preset's reading trained {g} rounds in every seed (round {g}: {g0}%, {g1}%, {g2}%), "
       "NIID-Bench's {a} (round {a}: {a0}%, {a1}%, {a2}%)")
def _(data):
    """The second draw's #C=2 runs (four methods and SCAFFOLD after_step, seeds 0-2, each its own
    process): the range of rounds they reached, that none diverged (run.json), and SCAFFOLD's
    accuracy per seed at the last round all three seeds of each reading reached."""
    runs = {m: [data.run(f"{NG_SPLIT}/niidbench/mnist_c2", m, s) for s in SEEDS] for m in NG_NAMES}
    after = [data.run(f"{NG_SPLIT}/readings/mnist_c2_after_step", "scaffold", s) for s in SEEDS]
    every = [r for group in runs.values() for r in group] + after
    last = [max(data.curve(r)) for r in every]
    if any(diverged_at(r) for r in every):
        raise ValueError("a run of the second draw diverged")
    out = {"n": len(last), "lo": min(last), "hi": max(last), "budget": 550}
    for key, group in (("g", runs["scaffold"]), ("a", after)):
        k = min(max(data.curve(r)) for r in group)
        out.update({key: k, **{f"{key}{s}": fmt(data.at(group[s], k), 2) for s in SEEDS}})
    return out


def ng_split_runs(data: Data) -> list[Run]:
    """The second draw's 15 processes: #C=2's 4 methods x seeds 0-2 and SCAFFOLD's after-step runs."""
    return [data.run(f"{NG_SPLIT}/niidbench/mnist_c2", m, s) for m in NG_NAMES for s in SEEDS] + \
           [data.run(f"{NG_SPLIT}/readings/mnist_c2_after_step", "scaffold", s) for s in SEEDS]


@claim("niidbench_gpu.split_speed", NG, "the 15 processes took {lo} to {hi} s a round each, together {split} "
       "run-rounds a second, where the first draw's populations advanced #C=2's 15 runs at {pop} run-rounds a second "
       "and 12 IID runs at {iid} besides")
def _(data):
    """Second draw: each run's median round (rounds 2..last; one process a run), their range and
    the sum of 1 / median (run-rounds a second, all 15).  First draw: 12 / the #C=2 population's
    median round + 3 / the after-step population's, and 12 / the IID population's (all sharing the GPU)."""
    walls = [median_wall(r) for r in ng_split_runs(data)]
    c2, iid = ng_speed(data)
    after = median_wall(ng_readings(data, "after_step")[0])
    return {"lo": fmt(min(walls), 1), "hi": fmt(max(walls), 1), "split": fmt(sum(1 / w for w in walls), 2),
            "pop": fmt(12 / c2 + 3 / after, 2), "iid": fmt(12 / iid, 2)}


@claim("niidbench_gpu.calls", NG, "#C=2 alone takes about {calls} calls of 9 minutes (50 rounds at {lo} to {hi} s a round)")
def _(data):
    """What #C=2's 50 rounds cost in GPU calls: the fastest median round of the second draw's
    processes and the first draw's population's median round (s, whole), and 50 rounds at their
    mean over a call's 540 s of budget, rounded half up."""
    lo, hi = min(median_wall(r) for r in ng_split_runs(data)), ng_speed(data)[0]
    return {"calls": fmt(50 * (lo + hi) / 2 / 540, 0), "lo": fmt(lo, 0), "hi": fmt(hi, 0)}


def median_wall(run: Run) -> Decimal:
    """A population's median round (rounds.csv wall_s) over rounds 2..last (round 1 warms up)."""
    df = read_rounds(run.path)
    return dec(statistics.median(float(w) for r, w in zip(df["round"], df["wall_s"]) if r >= 2))


def lock_steps(data: Data, part: str) -> int:
    """The largest party's local steps a round over the partition's GPU runs (the lock-step's length)."""
    return max(int(data.clients(r)["steps"].max()) for r in ng(data, part, "fedavg"))


def ng_speed(data: Data) -> tuple[Decimal, Decimal]:
    return median_wall(ng(data, "c2", "fedavg")[0]), median_wall(ng(data, "iid", "fedavg")[0])
