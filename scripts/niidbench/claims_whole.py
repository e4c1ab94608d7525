"""Section ``niidbench_whole``: Table III's MNIST rows on the whole MNIST from the CPU runs (the
doc's table, rewritten by ``claims.py --write``; its cells say what has run while a row is part
way, and each row's reading is drawn only once its 12 runs have ended), and SCAFFOLD under #C=2
there with both readings of its correction."""
from __future__ import annotations

from decimal import Decimal

from fedrun.results import Run

from scripts.common.claims_core import (Data, SEEDS, WORDS, aggregator, bound_up, dec, diverged_at, exact, fmt,
                                        joined, mean, sd, thousands, words)
from scripts.common.claims_registry import claim
from scripts.niidbench.claims import METHOD_NAMES, PARTITION_LABELS, finals, grid_cell, grid_table


# ----------------------------------------------------------------------------- NIID-Bench, whole MNIST, CPU

NW = "niidbench_whole"
# SCAFFOLD under #C=2 on the whole MNIST, each reading of its correction: (its whole-MNIST folder,
# the 10,000-image folder of the same reading), below outputs/reproductions.
NW_READINGS = {"gradient": ("niidbench_whole/mnist_c2", "niidbench/mnist_c2"),
               "after_step": ("niidbench_whole_readings/mnist_c2_after_step", "niidbench_readings/mnist_c2_after_step")}
NW_LABELS = {"gradient": "the preset's (`gradient`)", "after_step": "NIID-Bench's (`after_step`)"}
NW_ROUNDS = 50


def nw_runs(data: Data, reading: str, whole: bool = True) -> dict[int, Run]:
    """SCAFFOLD's #C=2 runs of a reading by seed, on the whole MNIST (``whole``) or the first 10,000
    images; the seeds not started yet are absent."""
    folder = NW_READINGS[reading][0 if whole else 1]
    return {run.seed: run for run in data.runs(folder, "scaffold")}


def nw_state(data: Data, run: Run | None) -> str:
    """A run as the table gives it: its final (best) accuracy, the round it diverged at, or, when
    it has not finished, the last round it reached and its accuracy there."""
    if run is None:
        return "not started"
    d = diverged_at(run)
    if d is not None:
        return f"diverged at {d}"
    last = data.reached(run)
    if last == 0:
        return "round 0 (unfinished)"
    curve = data.curve(run)
    if run.finished:
        return f"{exact(curve[last])} ({exact(max(curve.values()))})"
    return f"round {last}: {exact(curve[last])} (unfinished)"


@claim("niidbench_whole.rows", NW, "{rows}")
def _(data):
    """SCAFFOLD #C=2 per reading and seed: final (best) accuracy on the whole MNIST, or where it
    diverged, or the round an unfinished run has reached; beside the same run on 10,000 images."""
    rows = []
    for reading, label in NW_LABELS.items():
        whole, small = nw_runs(data, reading), nw_runs(data, reading, whole=False)
        for seed in SEEDS:
            rows.append(f"| {label} | {seed} | {nw_state(data, whole.get(seed))} | {nw_state(data, small.get(seed))} |")
    return {"rows": "\n".join(rows)}


def nw_finished(data: Data) -> list[tuple[str, int, Run]]:
    """(reading, seed, run) of every whole-MNIST SCAFFOLD #C=2 run that ran its 50 rounds or diverged."""
    out = []
    for reading in NW_READINGS:
        for seed, run in sorted(nw_runs(data, reading).items()):
            if run.finished or diverged_at(run) is not None:
                out.append((reading, seed, run))
    return out


NW_PARTITIONS = PARTITION_LABELS
NW_METHODS = METHOD_NAMES


def nw_table_runs(data: Data, partition: str, method: str) -> list[Run]:
    """A whole-MNIST Table III cell's runs that have started (none where its row has not)."""
    name = f"{NW}/mnist_{partition}"
    return data.runs(name, method) if data.folder(name).is_dir() else []


def nw_all_runs(data: Data) -> list[Run]:
    """Every run of the whole-MNIST Table III that has started, row by row."""
    return [r for part in NW_PARTITIONS for m in NW_METHODS for r in nw_table_runs(data, part, m)]


def nw_cell(data: Data, partition: str, method: str) -> str:
    """One cell of the whole-MNIST Table III as far as its runs go (:func:`scripts.niidbench.claims.grid_cell`):
    the finished runs' final accuracy, mean +- sd over seeds, then the best round's mean, with
    ``[seeds ...]`` while the cell lacks a seed; the diverged runs (``k div``, their rounds) and the
    runs stopped part way (``seed s at round r``) after it; ``-`` where no run has started."""
    return grid_cell(data, f"{NW}/mnist_{partition}", method)


@claim("niidbench_whole.table", NW, "{rows}")
def _(data):
    """Table III's MNIST rows on the whole MNIST as far as the CPU runs go (outputs/reproductions/
    niidbench_whole): per partition and method the finished runs' final accuracy (mean +- sd /
    the best round's mean, the seeds when not all three), the diverged runs and the ones stopped
    part way, beside Flower's one run."""
    return {"rows": grid_table(data, NW)}


def signed(x, digits: int = 1) -> str:
    """A difference with its sign, rounded as :func:`fmt` (+0.1, -2.8, 0.0)."""
    text = fmt(x, digits)
    return text if text.startswith("-") or Decimal(text).is_zero() else "+" + text


@claim("niidbench_whole.flower", NW, "{items}")
def _(data):
    """Per cell with a finished whole-MNIST run: its mean final accuracy minus Flower's one run
    (points, on the unrounded mean), and the same for the cell's 10,000-image runs (outputs/
    reproductions/niidbench; "all diverged" where none finished): how much of the 10,000-image
    grid's gap to Flower the whole MNIST closes."""
    ref, items = data.reference(), []
    for part, label in NW_PARTITIONS.items():
        for m, name in NW_METHODS.items():
            done = [r for r in nw_table_runs(data, part, m) if r.finished]
            if not done:
                continue
            flower = ref[(m, "mnist", part)]
            small = [v for v in finals(data, part, m) if v is not None]
            was = f"{signed(mean(small) - flower)}" if small else "all diverged"
            items.append(f"{name} under {label} {signed(mean(data.final(r) for r in done) - flower)} "
                         f"(first 10,000 images: {was})")
    return {"items": "; ".join(items)}


@claim("niidbench_whole.dir05", NW, "under Dir(0.5) the {n} cells with a finished run are within {d} points of "
       "Flower's run")
def _(data):
    """The whole-MNIST Dir(0.5) cells with a finished run: the largest distance of their mean final
    accuracy from Flower's one run (points, a bound: rounded up), where the 10,000-image grid was
    2.1 to 2.3 below."""
    ref, gaps = data.reference(), []
    for m in NW_METHODS:
        done = [r for r in nw_table_runs(data, "dir05", m) if r.finished]
        if done:
            gaps.append(abs(mean(data.final(r) for r in done) - ref[(m, "mnist", "dir05")]))
    if not gaps:
        raise ValueError("no Dir(0.5) run has finished on the whole MNIST")
    return {"n": words(len(gaps)), "d": bound_up(max(gaps))}


def nw_ranked(cell_finals: dict[str, list[Decimal | None]]) -> list[tuple[str, Decimal | None, int]]:
    """The methods of a row by mean final accuracy over their seeds that did not diverge, highest
    first, each as (method, mean or None when every seed diverged, seeds that diverged); the
    methods with no finished seed last."""
    out = []
    for m, values in cell_finals.items():
        done = [v for v in values if v is not None]
        out.append((m, mean(done) if done else None, len(values) - len(done)))
    return sorted(out, key=lambda x: (x[1] is None, -(x[1] or 0)))


def nw_seed_leaders(cell_finals: dict[str, list[Decimal | None]]) -> list[str]:
    """Per seed, the method(s) with the highest final accuracy (a diverged run is below any
    finished one); ``A = B`` for a tie."""
    out = []
    for i in range(len(SEEDS)):
        seed = {m: v[i] for m, v in cell_finals.items() if v[i] is not None}
        if not seed:
            out.append("none finished")
            continue
        top = max(seed.values())
        out.append(" = ".join(NW_METHODS[m] for m in cell_finals if seed.get(m) == top))
    return out


def nw_row(data: Data, part: str) -> tuple[dict[str, dict[int, Run]], bool]:
    """A whole-MNIST row's runs by method and seed, and whether all its 12 have ended (finished or
    diverged)."""
    runs = {m: {r.seed: r for r in nw_table_runs(data, part, m)} for m in NW_METHODS}
    return runs, all(s in runs[m] and (runs[m][s].finished or diverged_at(runs[m][s]) is not None)
                     for m in NW_METHODS for s in SEEDS)


def nw_ended_row(data: Data, part: str) -> dict[str, dict[int, Run]]:
    """A whole-MNIST row's runs by method and seed (:func:`nw_row`) for a reading written once all
    12 have ended; raises while any is still to run, so the reading is never drawn from part of it."""
    runs, ended = nw_row(data, part)
    if not ended:
        raise ValueError(f"the {NW_PARTITIONS[part]} row has not ended yet")
    return runs


def nw_row_finals(data: Data, runs: dict[str, dict[int, Run]]) -> dict[str, list[Decimal | None]]:
    """A row's final accuracies by method, one per seed in :data:`SEEDS` order (None for a run that
    diverged), from its runs by method and seed (:func:`nw_row`)."""
    return {m: [data.final(runs[m][s]) for s in SEEDS] for m in NW_METHODS}


@claim("niidbench_whole.order", NW, "{rows}")
def _(data):
    """Per row of the whole-MNIST Table III whose 12 runs have all ended (finished or diverged):
    the methods by mean final accuracy (%, over their seeds that did not diverge, two decimals),
    highest first, with the points each trails the first (on the unrounded means); which method ends
    highest in each seed; and the same row's order on the first 10,000 images (the grid above).
    The rows not ended yet are named, not left out unsaid."""
    rows, open_ = [], []
    for part, label in NW_PARTITIONS.items():
        runs, ended = nw_row(data, part)
        if not ended:
            open_.append(label)
            continue
        whole = nw_row_finals(data, runs)
        ranked = nw_ranked(whole)
        first = ranked[0][1]
        items = []
        for m, value, div in ranked:
            text = NW_METHODS[m] + (f" {fmt(value, 2)}" if value is not None else " (every seed diverged)")
            if value is not None and m != ranked[0][0]:
                text += f" ({signed(value - first, 2)})"
            if div and value is not None:
                text += f" [{div} of {len(SEEDS)} diverged]"
            items.append(text)
        small = [NW_METHODS[m] for m, _, _ in nw_ranked({m: finals(data, part, m) for m in NW_METHODS})]
        leaders = nw_seed_leaders(whole)
        rows.append(f"under {label}: {', '.join(items)}; highest in seed "
                    + ", ".join(f"{s}: {who}" for s, who in zip(SEEDS, leaders))
                    + f"; on the first 10,000 images {', '.join(small)}")
    if not rows:
        return {"rows": f"no row has all its {len(NW_METHODS) * len(SEEDS)} runs ended yet"}
    tail = f" (rows not ended yet: {joined(open_)})" if open_ else ""
    return {"rows": "; ".join(rows) + tail}


@claim("niidbench_whole.count", NW, "{done} of the table's {total} runs have finished, {div} diverged and {part} "
       "stopped part way")
def _(data):
    """How far the whole-MNIST Table III has come: runs finished, diverged, and stopped part way
    (their checkpoints in the folder's resume.tar.gz), of the 5 partitions x 4 methods x 3 seeds."""
    runs = nw_all_runs(data)
    div = sum(diverged_at(r) is not None for r in runs)
    done = sum(r.finished for r in runs)
    part = len(runs) - done - div
    return {"done": done, "total": len(NW_PARTITIONS) * len(NW_METHODS) * len(SEEDS),
            "div": words(div) if div else "none", "part": words(part) if part else "none"}


@claim("niidbench_whole.minutes", NW, "{lo} to {hi} minutes a run ({n} runs finished on the whole MNIST, two at a "
       "time), so a two-hour sitting finishes about {per} runs")
def _(data):
    """The time a finished whole-MNIST CPU run took in its rounds (summary.json's round_seconds,
    resumes' gaps left out), over the table's runs and SCAFFOLD's after_step reading runs; a
    sitting's runs: two at a time, 120 minutes over their mean."""
    runs = nw_all_runs(data)
    runs += nw_runs(data, "after_step").values()
    minutes = [dec(r.summary["round_seconds"]) / 60 for r in runs if r.finished]
    return {"lo": fmt(min(minutes), 0), "hi": fmt(max(minutes), 0), "n": len(minutes),
            "per": fmt(2 * 120 / mean(minutes), 0)}


def nw_parties(data: Data, run: Run) -> tuple[list[int], int, int]:
    """A run's party sizes n_k (its partition.csv), batch size B and local epochs E: party k takes
    E x ceil(n_k / B) local steps a round (the last batch of an epoch is kept, short)."""
    hp = run.config["hyperparams"]
    return [int(n) for n in data.partition(run)["examples"]], hp["batch_size"], hp["local_epochs"]


@claim("niidbench_whole.work", NW, "every row's parties take {lo} to {hi} local steps a round together ({epochs} "
       "epochs of ceil(n_k / {bs}) batches each), so the spread is the machine's, not the partition's: the #C=3 row's "
       "runs took {a} to {b} minutes in its earlier sittings and {c} to {d} minutes in its later ones")
def _(data):
    """Why the whole-MNIST runs' times spread: the work a round (sum over the parties of
    local_epochs x ceil(n_k / B) steps, from each run's partition.csv and config) over every run of
    the table, and the #C=3 row's finished runs' minutes (round_seconds), split at the widest gap
    between them, the faster group all finished (summary.json) before the slower one began to
    finish; raises where the two groups interleave in time (then the split is not the sittings')."""
    steps, shape = set(), set()
    for run in nw_all_runs(data):
        sizes, bs, epochs = nw_parties(data, run)
        steps.add(sum(epochs * -(-n // bs) for n in sizes))
        shape.add((epochs, bs))
    if len(shape) != 1:
        raise ValueError(f"the whole-MNIST runs differ in local epochs or batch size: {sorted(shape)}")
    (epochs, bs), = shape
    runs = sorted((r for m in NW_METHODS for r in nw_table_runs(data, "c3", m) if r.finished),
                  key=lambda r: r.summary["finished"])
    minutes = [dec(r.summary["round_seconds"]) / 60 for r in runs]
    ordered = sorted(minutes)
    cut = max(range(1, len(ordered)), key=lambda i: ordered[i] - ordered[i - 1])
    fast, slow = ordered[:cut], ordered[cut:]
    if sorted(minutes[:len(fast)]) != fast:
        raise ValueError("the #C=3 row's fast and slow runs interleave in time: not earlier and later sittings")
    return {"lo": thousands(min(steps)), "hi": thousands(max(steps)), "epochs": epochs, "bs": bs,
            "a": fmt(min(fast), 0), "b": fmt(max(fast), 0), "c": fmt(min(slow), 0), "d": fmt(max(slow), 0)}


@claim("niidbench_whole.none", NW, "{none} of the {n} runs that have ended on the whole MNIST diverged, where on the "
       "10,000 images {k} of the same {n} (reading, seed) pairs did (at rounds {rounds})")
def _(data):
    """The whole-MNIST SCAFFOLD #C=2 runs that ended (both readings): how many diverged (as a word,
    "None" when none did), and how many of the same (reading, seed) diverged on the 10,000 images,
    at which rounds."""
    ended = nw_finished(data)
    if not ended:
        raise ValueError("no whole-MNIST SCAFFOLD run has ended")
    diverged = sum(diverged_at(run) is not None for _, _, run in ended)
    small = [diverged_at(nw_runs(data, reading, whole=False)[seed]) for reading, seed, _ in ended]
    early = [d for d in small if d is not None]
    return {"none": WORDS[diverged].capitalize() if diverged else "None", "n": len(ended), "k": len(early),
            "rounds": joined(map(str, early))}


@claim("niidbench_whole.ends", NW, "they end at {lo}% to {hi}% (best rounds {blo}% to {bhi}%), against Flower's "
       "one run at {flower}%")
def _(data):
    """The finished whole-MNIST SCAFFOLD #C=2 runs' final and best accuracies (ranges over both
    readings and the seeds), and Flower's SCAFFOLD #C=2 number (one run, whole MNIST)."""
    runs = [run for _, _, run in nw_finished(data) if run.finished]
    finals_, bests = [data.final(r) for r in runs], [data.best(r) for r in runs]
    return {"lo": exact(min(finals_)), "hi": exact(max(finals_)), "blo": exact(min(bests)), "bhi": exact(max(bests)),
            "flower": fmt(data.reference()[("scaffold", "mnist", "c2")])}


@claim("niidbench_whole.swings", NW, "after round 20, {k} of the {n} finished runs still fall below 90% at least "
       "once ({lows}) and are back above 90% within {back} rounds")
def _(data):
    """The finished whole-MNIST SCAFFOLD #C=2 runs whose test accuracy falls below 90% after round
    20, each with its lowest point there (by reading and seed), and the most rounds any of them took
    from that low to 90% or more again: the swings of a label-skewed federation, not divergence."""
    items, back, n = [], 0, 0
    for reading, seed, run in nw_finished(data):
        if not run.finished:
            continue
        n += 1
        curve = data.curve(run)
        at, low = min(((r, v) for r, v in curve.items() if r > 20), key=lambda rv: rv[1])
        if low >= 90:
            continue
        again = [r for r, v in curve.items() if r > at and v >= 90]
        if not again:
            raise ValueError(f"{run.path}: not back above 90% after round {at}")
        back = max(back, again[0] - at)
        items.append(f"{'preset' if reading == 'gradient' else reading} seed {seed}: {exact(low)}% at round {at}")
    return {"k": WORDS.get(len(items), len(items)), "n": WORDS.get(n, n), "lows": "; ".join(items), "back": back}


def nw_row_spread(data: Data, part: str) -> dict:
    """The figures of a whole-MNIST row's reading, once its 12 runs have ended: for the methods none
    of whose seeds diverged, how far apart their three seeds end (the highest final accuracy minus
    the lowest, in points, the smallest and largest of those gaps over the methods), and whether any
    run of the row ends at or above Flower's highest number in the row (and which method that is)."""
    runs = nw_ended_row(data, part)
    whole = [m for m in NW_METHODS if all(runs[m][s].finished for s in SEEDS)]
    gaps = [max(data.final(runs[m][s]) for s in SEEDS) - min(data.final(runs[m][s]) for s in SEEDS) for m in whole]
    ref = data.reference()
    top = max(NW_METHODS, key=lambda m: ref[(m, "mnist", part)])
    highest = max(data.final(r) for m in NW_METHODS for r in runs[m].values() if r.finished)
    return {"methods": joined([NW_METHODS[m] for m in whole]), "lo": fmt(min(gaps), 0), "hi": fmt(max(gaps), 0),
            "reach": "no" if highest < ref[(top, "mnist", part)] else "a", "flower": NW_METHODS[top]}


@claim("niidbench_whole.c1_seeds", NW, "the three seeds of {methods} each end {lo} to {hi} points apart, and {reach} "
       "run of the row reaches Flower's {flower} run")
def _(data):
    """Under #C=1 on the whole MNIST: how far apart the three seeds of each method with no diverged
    seed end (points, smallest to largest gap), and whether any run of the row reaches Flower's
    highest run in the row (:func:`nw_row_spread`)."""
    return nw_row_spread(data, "c1")


@claim("niidbench_whole.c1_pair", NW, "{a} and {b} trail each other by {gap} points on their means, less than "
       "either's standard deviation over seeds ({sa} and {sb}), and each ends highest in at least one seed")
def _(data):
    """Under #C=1 on the whole MNIST, once its 12 runs have ended: the two methods with the highest
    means, how far apart their means are (points, unrounded), their sample standard deviations over
    seeds; raises where the gap is not below both deviations or one of the two never ends highest
    in a seed (:func:`nw_seed_leaders`), since then the sentence would not hold."""
    whole = nw_row_finals(data, nw_ended_row(data, "c1"))
    (a, ma, _), (b, mb, _) = nw_ranked(whole)[:2]
    spread = {m: sd([v for v in whole[m] if v is not None]) for m in (a, b)}
    if ma - mb >= min(spread.values()):
        raise ValueError(f"#C=1: {a} and {b} are {ma - mb} points apart, not less than both deviations {spread}")
    leaders = {name for top in nw_seed_leaders(whole) for name in top.split(" = ")}
    for m in (a, b):
        if NW_METHODS[m] not in leaders:
            raise ValueError(f"#C=1: {m} ends highest in no seed")
    return {"a": NW_METHODS[a], "b": NW_METHODS[b], "gap": fmt(ma - mb), "sa": fmt(spread[a]),
            "sb": fmt(spread[b])}


def nw_close_row(data: Data, part: str) -> dict:
    """The figures of a reading for a whole-MNIST row whose methods end close together, once its 12
    runs have ended: the largest minus the smallest method mean (points, unrounded means; a bound,
    rounded up, as is "each within" below), the range
    of Flower's one run minus each method's mean, in words ("each 0.2 to 2.8 points below"; where
    the methods end on both sides of it, how close the furthest is and which end on each side), and
    the runs that diverged, beside the same row's diverged runs on the first 10,000 images; the
    method whose seeds end furthest apart, and how far (highest final minus lowest)."""
    row = nw_ended_row(data, part)
    ref, means, gaps, div, spreads = data.reference(), [], [], 0, {}
    for m in NW_METHODS:
        runs = row[m].values()
        div += sum(diverged_at(r) is not None for r in runs)
        done = [data.final(r) for r in runs if r.finished]
        means.append(mean(done))
        spreads[m] = max(done) - min(done)
        gaps.append(ref[(m, "mnist", part)] - mean(done))
    if min(gaps) >= 0:
        side = f"each {fmt(min(gaps))} to {fmt(max(gaps))} points below Flower's run of it"
    elif max(gaps) < 0:
        side = f"each {fmt(-max(gaps))} to {fmt(-min(gaps))} points above Flower's run of it"
    else:  # some method ends above Flower's one run: say which, and how close every method is
        above = [NW_METHODS[m] for m, g in zip(NW_METHODS, gaps) if g < 0]
        below = [NW_METHODS[m] for m, g in zip(NW_METHODS, gaps) if g >= 0]
        side = (f"each within {bound_up(max(abs(g) for g in gaps))} points of Flower's run of it ({joined(below)} "
                f"below it, {joined(above)} above)")
    small = sum(v is None for m in NW_METHODS for v in finals(data, part, m))
    return {"spread": bound_up(max(means) - min(means)), "flower": side,
            "div": words(div) if div else "none", "n": len(NW_METHODS) * len(SEEDS),
            "small": words(small) if small else "none",
            "wide": NW_METHODS[max(spreads, key=spreads.get)], "wgap": fmt(max(spreads.values()))}


# The reading of a row whose methods end close together (#C=2, #C=3, IID), filled by :func:`nw_close_row`.
NW_CLOSE_READING = ("the four methods' mean final accuracies lie within {spread} points of each other, {flower}, "
                    "and {div} of the row's {n} runs diverged, where on the first 10,000 images {small} did; the "
                    "widest method is {wide}, whose three seeds end {wgap} points apart")


@claim("niidbench_whole.c2_reading", NW, NW_CLOSE_READING)
def _(data):
    """Under #C=2 on the whole MNIST, once its 12 runs have ended (:func:`nw_close_row`)."""
    return nw_close_row(data, "c2")


@claim("niidbench_whole.c3_reading", NW, NW_CLOSE_READING)
def _(data):
    """Under #C=3 on the whole MNIST, once its 12 runs have ended (:func:`nw_close_row`)."""
    return nw_close_row(data, "c3")


@claim("niidbench_whole.iid_reading", NW, NW_CLOSE_READING)
def _(data):
    """Under IID on the whole MNIST, once its 12 runs have ended (:func:`nw_close_row`)."""
    return nw_close_row(data, "iid")


@claim("niidbench_whole.iid_nova", NW, "FedNova's runs repeat FedAvg's round for round in {which} both have finished "
       "({seeds}: every `rounds.csv` column but the timings equal, in each of the {rounds} rounds), where Flower's "
       "one run of each ends at {favg}% and {fnova}%: every party holds {lo} to {hi} images, {batches} batches of "
       "{bs}, so each takes the same {steps} local steps, and FedNova's normalized average is then FedAvg's")
def _(data):
    """Under IID on the whole MNIST: FedNova's and FedAvg's finished runs of each seed have equal
    rounds.csv but the timings (raises for a seed where they do not; as the 10,000-image grid's
    ``niidbench.iid_fednova_is_fedavg``); and why, from the runs' own partition.csv and config
    (:func:`nw_parties`): every party's ceil(n_k / B) batches a local epoch are the same, so tau_k
    (and FedNova's ||a_k||_1) is the same for every party, tau_eff p_k / ||a_k||_1 = p_k, and
    FedNova's update is FedAvg's.  Also raises where the parties' steps differ (the reason would
    not hold) or no seed has both runs finished."""
    avg = {r.seed: r for r in nw_table_runs(data, "iid", "fedavg") if r.finished}
    nova = {r.seed: r for r in nw_table_runs(data, "iid", "fednova") if r.finished}
    both = sorted(set(avg) & set(nova))
    if not both:
        raise ValueError("no seed has both FedAvg's and FedNova's IID runs finished")
    sizes, batches = set(), set()
    for seed in both:
        if not data.same_but_timings(avg[seed], nova[seed]):
            raise ValueError(f"{nova[seed].path}: FedNova's IID curve departs from FedAvg's, seed {seed}")
        for run in (avg[seed], nova[seed]):
            n, bs, epochs = nw_parties(data, run)
            sizes |= set(n)
            batches |= {(-(-x // bs), bs, epochs) for x in n}
    if len(batches) != 1:
        raise ValueError(f"the IID parties take different numbers of local steps: {sorted(batches)}")
    (per_epoch, bs, epochs), = batches
    ref = data.reference()
    return {"which": "every seed" if len(both) > 1 else "the one seed",
            "seeds": f"seed{'s' if len(both) > 1 else ''} {joined(map(str, both))}",
            "rounds": NW_ROUNDS, "favg": fmt(ref[("fedavg", "mnist", "iid")]),
            "fnova": fmt(ref[("fednova", "mnist", "iid")]), "lo": thousands(min(sizes)),
            "hi": thousands(max(sizes)), "batches": per_epoch, "bs": bs, "steps": thousands(per_epoch * epochs)}


# ----------------------------------------------------------------------------- like for like, Flower's merged README

NW_NEAR = Decimal("0.5")  # a best-round mean this close to Flower's (points) is "near"; a cell further is named


def nw_best_gaps(data: Data) -> dict[tuple[str, str], tuple[Decimal, Decimal, Decimal, Decimal]]:
    """Per whole-MNIST cell whose runs have all ended: (our best-round mean over the finished
    seeds, our standard deviation of the seeds' best rounds, Flower's best-round mean over its three
    runs, its standard deviation), all in %: the table's figure after the slash, exact, against the
    README merged since (scripts/paper_targets/niidbench_flower_best_rounds.csv)."""
    best, out = data.flower_best(), {}
    for part in NW_PARTITIONS:
        runs, ended = nw_row(data, part)
        if not ended:
            continue
        for m in NW_METHODS:
            values = [data.best(r) for r in runs[m].values() if r.finished]
            out[(part, m)] = (mean(values), exact_sd(values), *best[(m, "mnist", part)])
    return out


def exact_sd(values: list[Decimal]) -> Decimal:
    """The sample standard deviation (n - 1) of ``values`` in decimal arithmetic (0.22 for 96.34,
    96.56 and 96.12, where :func:`scripts.common.claims_core.sd`'s floats give 0.21999...)."""
    m = mean(values)
    return (sum(((v - m) ** 2 for v in values), Decimal(0)) / (len(values) - 1)).sqrt()


def nw_cell_name(part: str, m: str) -> str:
    return f"{NW_METHODS[m]} under {NW_PARTITIONS[part]}"


@claim("niidbench_whole.best_flower", NW, "outside #C=1, {k} of the {n} cells' best-round means are within {bound} "
       "points of Flower's (the furthest: {furthest}) and {m} are more than half a point off: {far}. Under #C=1, where "
       "the seeds scatter on both sides (standard deviations up to {c1ours} points here and {c1theirs} in Flower's), "
       "ours minus Flower's runs from {c1lo} to {c1hi} points")
def _(data):
    """The whole-MNIST table's best-round means (over the finished seeds, exact) minus the merged
    README's (the best round's mean over Flower's three runs), cell by cell: outside #C=1 the cells
    within half a point (NW_NEAR) and their largest |gap| (a bound: rounded up), the cells further,
    each with both means; under #C=1 both sides' largest standard deviation and the range of the
    gaps."""
    gaps = nw_best_gaps(data)
    near, far, c1 = [], [], []
    for (part, m), (ours, sd_ours, theirs, sd_theirs) in gaps.items():
        d = ours - theirs
        if part == "c1":
            c1.append((d, sd_ours, sd_theirs))
        else:
            (near if abs(d) <= NW_NEAR else far).append((part, m, d, ours, theirs))
    if not near or not c1:
        raise ValueError("the #C=1 row or every other row has not ended")
    top = max(near, key=lambda x: abs(x[2]))
    return {"k": len(near), "n": len(near) + len(far), "bound": bound_up(abs(top[2]), 2),
            "furthest": f"{nw_cell_name(top[0], top[1])}, {fmt(top[3], 2)} against {exact(top[4])}",
            "m": words(len(far)), "far": "; ".join(f"{nw_cell_name(p, m)}, {signed(d, 2)} ({fmt(o, 2)} against "
                                                   f"{exact(t)})" for p, m, d, o, t in far) or "none",
            "c1ours": fmt(max(s for _, s, _ in c1), 2), "c1theirs": exact(max(s for _, _, s in c1)),
            "c1lo": signed(min(d for d, _, _ in c1), 2), "c1hi": signed(max(d for d, _, _ in c1), 2)}


def nw_far(data: Data, part: str, m: str) -> tuple[Decimal, Decimal, Decimal, Decimal]:
    """A cell of :func:`nw_best_gaps` that must be more than half a point from Flower's (raises
    otherwise: its explanation would explain nothing)."""
    cell = nw_best_gaps(data)[(part, m)]
    if abs(cell[0] - cell[2]) <= NW_NEAR:
        raise ValueError(f"{nw_cell_name(part, m)} is within half a point of Flower's best-round mean")
    return cell


@claim("niidbench_whole.best_fednova_dir05", NW, "Flower's FedNova is the low one of its row: its other three "
       "methods' best-round means are {lo} to {hi}, and its one earlier run of FedNova ended at {one}%; ours, {ours}, "
       "{where} our other three ({olo} to {ohi})")
def _(data):
    """Under Dir(0.5): the merged README's FedNova against its other three methods (best-round
    means) and its earlier one run of FedNova; our FedNova's best-round mean against our other
    three's (exact, two decimals)."""
    ours, _s, _t, _ts = nw_far(data, "dir05", "fednova")
    best, one, gaps = data.flower_best(), data.reference(), nw_best_gaps(data)
    theirs = [best[(m, "mnist", "dir05")][0] for m in NW_METHODS if m != "fednova"]
    others = [gaps[("dir05", m)][0] for m in NW_METHODS if m != "fednova"]
    if best[("fednova", "mnist", "dir05")][0] >= min(theirs):
        raise ValueError("Flower's FedNova under Dir(0.5) is not below its other three methods")
    closest = min(abs(ours - o) for o in others)
    where = "lies among" if min(others) <= ours <= max(others) else f"lies {fmt(closest, 2)} points from"
    return {"lo": exact(min(theirs)), "hi": exact(max(theirs)), "one": fmt(one[("fednova", "mnist", "dir05")]),
            "ours": fmt(ours, 2), "where": where, "olo": fmt(min(others), 2), "ohi": fmt(max(others), 2)}


@claim("niidbench_whole.best_fedprox_c2", NW, "our FedProx, at the presets' mu = {mu}, reaches a lower best round than "
       "our FedAvg in {k} of {n} seeds ({p} against {a}), where Flower's FedProx, at one of the four mu its script "
       "runs (its README does not say which), is {fd} points from its FedAvg ({fp} against {fa})")
def _(data):
    """Under #C=2: our FedProx's best round against our FedAvg's seed by seed (exact), with its mu
    from the runs' config; the merged README's FedProx and FedAvg best-round means."""
    nw_far(data, "c2", "fedprox")
    runs, _ended = nw_row(data, "c2")
    prox = [data.best(runs["fedprox"][s]) for s in SEEDS]
    avg = [data.best(runs["fedavg"][s]) for s in SEEDS]
    mus = {str(aggregator(r, "mu")) for r in runs["fedprox"].values()}
    if len(mus) != 1:
        raise ValueError(f"FedProx's #C=2 runs differ in mu: {mus}")
    best = data.flower_best()
    fp, fa = best[("fedprox", "mnist", "c2")][0], best[("fedavg", "mnist", "c2")][0]
    return {"mu": mus.pop(), "k": sum(p < a for p, a in zip(prox, avg)), "n": len(SEEDS),
            "p": ", ".join(exact(v) for v in prox), "a": ", ".join(exact(v) for v in avg),
            "fd": exact(abs(fp - fa)), "fp": exact(fp), "fa": exact(fa)}


@claim("niidbench_whole.best_fedavg_c2", NW, "FedAvg's gap, {gap} points, is {cmp} the two sides' standard deviations "
       "over seeds added together ({so} here, {st} in Flower's), and our SCAFFOLD and FedNova under #C=2 are within "
       "{x} points of Flower's")
def _(data):
    """Under #C=2: FedAvg's best-round mean minus Flower's (exact), against the sum of the two
    sample standard deviations of the seeds' best rounds (ours in decimal arithmetic, Flower's as
    its README prints it); the largest |gap| of SCAFFOLD and FedNova in the row (a bound: rounded
    up)."""
    ours, so, theirs, st = nw_far(data, "c2", "fedavg")
    gap, gaps = abs(ours - theirs), nw_best_gaps(data)
    cmp = "no larger than" if gap <= so + st else "larger than"
    x = max(abs(gaps[("c2", m)][0] - gaps[("c2", m)][2]) for m in ("scaffold", "fednova"))
    return {"gap": fmt(gap, 2), "cmp": cmp, "so": fmt(so, 2), "st": fmt(st, 2), "x": bound_up(x, 2)}
