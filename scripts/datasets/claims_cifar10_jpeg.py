"""Section ``cifar10_jpeg``: what CIFAR-10's JPEG q75 copy costs a model, from the runs of
``scripts/datasets/cifar10_jpeg_cost.py`` (the same model and seed trained on the exact pixels and on the
copy's pixels of the same 8,068 training images, each tested on the 1,017 exact test images)."""
from __future__ import annotations

from decimal import Decimal

from scripts.common.claims_core import Data, fmt, load_run, mean
from scripts.common.claims_registry import claim

CJ = "cifar10_jpeg"
FOLDER = "cifar10_jpeg_cost"
MODELS = {"fednnnn": "FedNNNN's CIFAR-10 CNN", "pd": "NetA-Baseline"}
METRICS = {"final": "after the last epoch", "best": "best epoch", "last3": "mean of the last 3 epochs"}


def pairs(data: Data, model: str) -> dict[int, tuple]:
    """{seed: (exact run, copy run)} of every seed whose two runs of ``model`` have finished."""
    folder = data.folder(FOLDER)
    out = {}
    for exact in sorted(folder.glob(f"{model}_exact_seed*/summary.json")):
        seed = int(exact.parent.name.rsplit("seed", 1)[1])
        copy = folder / f"{model}_jpeg_seed{seed}"
        if (copy / "summary.json").is_file():
            out[seed] = (load_run(exact.parent), load_run(copy))
    return out


def value(data: Data, run, metric: str) -> Decimal:
    curve = list(data.curve(run).values())
    return {"final": curve[-1], "best": max(curve), "last3": mean(curve[-3:])}[metric]


def spread(values: list[Decimal]) -> str:
    return f"{fmt(mean(values), 2)} ({fmt(min(values), 2)} to {fmt(max(values), 2)})"


@claim("cifar10_jpeg.table", CJ, "{rows}")
def _(data):
    """Each model's accuracy on the exact test images, trained on exact and on copied pixels (mean
    over the seeds with both runs, and their range), and the paired difference copy - exact."""
    rows = []
    for model, label in MODELS.items():
        runs = pairs(data, model)
        if not runs:
            continue
        epochs = {len(data.curve(r)) for pair in runs.values() for r in pair}
        if len(epochs) != 1:
            raise ValueError(f"{model}: runs of different lengths {sorted(epochs)}")
        for metric, name in METRICS.items():
            exact = [value(data, e, metric) for e, _ in runs.values()]
            copy = [value(data, c, metric) for _, c in runs.values()]
            diff = [c - e for e, c in zip(exact, copy)]
            rows.append(f"| {label} | {', '.join(map(str, runs))} | {min(epochs)} | {name} | {spread(exact)} | "
                        f"{spread(copy)} | {spread(diff)} |")
    if not rows:
        raise ValueError(f"{data.folder(FOLDER)}: no seed with both runs of a model")
    return {"rows": "\n".join(rows)}


@claim("cifar10_jpeg.cost", CJ, "{sentence}")
def _(data):
    """The paired differences copy - exact of every model and seed: their range for the final and
    the last-3-epoch accuracy, and in how many pairs the copy is below."""
    seeds = {m: sorted(pairs(data, m)) for m in MODELS}
    if not any(seeds.values()):
        raise ValueError("no finished pair of runs")
    parts = []
    for metric, what in (("final", "the accuracy after the last epoch"), ("last3", "the mean of the last 3 epochs")):
        diffs = [value(data, c, metric) - value(data, e, metric) for m in MODELS for e, c in pairs(data, m).values()]
        below = sum(d < 0 for d in diffs)
        parts.append(f"{what} moved by {fmt(min(diffs), 2)} to {fmt(max(diffs), 2)} points (lower with the copy in "
                     f"{below} of the {len(diffs)} pairs)")
    counted = " and ".join(f"{label}: seed{'s' if len(seeds[m]) != 1 else ''} {', '.join(map(str, seeds[m]))}"
                           for m, label in MODELS.items() if seeds[m])
    return {"sentence": f"Trained on the copy's pixels instead of the exact ones (the same images, paired by seed; "
                        f"{counted}), {parts[0]}, and {parts[1]}"}
