#!/usr/bin/env python
"""What the CIFAR-10 JPEG copy costs a model: the same model trained on the 8,068 CIFAR-10 training
images whose exact pixels are at hand, and on the same 8,068 images decoded from the JPEG
quality-75 copy, each tested on the 1,017 exact test images (``dataset=cifar10_exact``,
``dataset.load.train_pixels=exact|jpeg``), for each seed.  The two runs of a seed differ in the
training pixels alone (same images, labels, initialization and batches), so their accuracy
difference is the copy's cost, paired by seed.

Models (centralized training, one epoch a round, accuracy on the exact test images after each):

* ``fednnnn``: FedNNNN's CIFAR-10 CNN (Nagura et al., Table 4) with its Table 1 training settings
  (SGD, lr 0.05, B = 50, weight decay 5e-4), the learning rate x0.1 at 50% and 75% of the epochs:
  at a constant 0.05 its test accuracy on 8,068 images swings by 20-35 points from one epoch to
  the next (seed 0: 60% after epoch 10, 24% after epoch 8), which would drown the copy's effect;
  the decay settles each run on one model;
* ``pd``: the parameter-divergence paper's NetA-Baseline with its vanilla training
  (``experiment=pd/vanilla_bs50``: per-image standardization, momentum, lr x0.1 at 50% and 75%
  of the epochs), on all 8,068 images (its class-balanced pool of 5,000 a class needs more).

``run --out DIR`` trains what is not finished in DIR (``DIR/<model>_<pixels>_seed<seed>``; an
unfinished run goes on from its checkpoint), seed after seed so that every finished seed has both
of its runs; ``collect DIR`` prints the table: each model's final and best accuracy over the
epochs for exact and copied pixels (mean over seeds, and the range), and the paired difference.

    python scripts/datasets/cifar10_jpeg_cost.py run --out outputs/reproductions/cifar10_jpeg_cost --epochs 10
    python scripts/datasets/cifar10_jpeg_cost.py collect outputs/reproductions/cifar10_jpeg_cost
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from statistics import mean

MODELS = {
    "fednnnn": ["mode=centralized", "aggregator=fedavg", "model=cifar10_cnn", "hyperparams=fednnnn_cifar10",
                "hyperparams.local_epochs=1", "hyperparams.lr_milestones=[0.5,0.75]", "hyperparams.lr_gamma=0.1"],
    "pd": ["experiment=pd/vanilla_bs50", "dataset.per_class=null"],
}
LABELS = {"fednnnn": "FedNNNN CIFAR-10 CNN", "pd": "NetA-Baseline (PD paper)"}
PIXELS = ("exact", "jpeg")


def run_name(model: str, pixels: str, seed: int) -> str:
    return f"{model}_{pixels}_seed{seed}"


def command(model: str, pixels: str, seed: int, epochs: int, out: Path, extra: list[str]) -> list[str]:
    """The fedrun command of one run (``dataset=cifar10_exact`` after the model's preset, which
    would otherwise name CIFAR-10 itself)."""
    return [sys.executable, "-m", "fedrun", *MODELS[model], "dataset=cifar10_exact",
            f"dataset.load.train_pixels={pixels}", f"hyperparams.rounds={epochs}", f"seed={seed}",
            "progress=false", "resume=true", *extra, f"hydra.run.dir={out / run_name(model, pixels, seed)}"]


def finished(run_dir: Path) -> bool:
    return (run_dir / "summary.json").is_file()


def run(args) -> int:
    out = Path(args.out)
    failed = []
    for seed in args.seeds:
        for model in args.models:
            for pixels in PIXELS:
                if finished(out / run_name(model, pixels, seed)):
                    continue
                cmd = command(model, pixels, seed, args.epochs, out, args.set)
                print(" ".join(cmd[1:]), flush=True)
                if args.dry_run:
                    continue
                if subprocess.run(cmd).returncode != 0:
                    failed.append(run_name(model, pixels, seed))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    if args.dry_run:
        return 0
    collect(out)
    return 1 if failed else 0


def results(out: Path) -> dict[tuple[str, str, int], dict]:
    """{(model, pixels, seed): summary.json} for every finished run under ``out``."""
    found = {}
    for model in MODELS:
        for pixels in PIXELS:
            for summary in sorted(out.glob(f"{run_name(model, pixels, '*')}/summary.json")):
                seed = int(summary.parent.name.rsplit("seed", 1)[1])
                found[model, pixels, seed] = json.loads(summary.read_text())
    return found


def table(out: Path) -> list[dict]:
    """One row per model with every seed that has both runs: the accuracies (%) of each pixel kind
    (mean, min, max over seeds) and the paired differences copy - exact (mean, min, max)."""
    found = results(out)
    rows = []
    for model in MODELS:
        seeds = sorted(s for (m, p, s) in found if m == model and p == "exact" and (m, "jpeg", s) in found)
        if not seeds:
            continue
        row = {"model": model, "seeds": seeds, "epochs": {found[model, p, s]["rounds"] for p in PIXELS for s in seeds}}
        for metric in ("final_test_acc", "best_test_acc"):
            acc = {p: [100 * found[model, p, s][metric] for s in seeds] for p in PIXELS}
            diff = [j - e for e, j in zip(acc["exact"], acc["jpeg"])]
            row[metric] = {**{p: (mean(v), min(v), max(v)) for p, v in acc.items()},
                           "diff": (mean(diff), min(diff), max(diff))}
        rows.append(row)
    return rows


def collect(out: Path) -> int:
    rows = table(out)
    if not rows:
        print(f"{out}: no model has both runs (exact and jpeg) of a seed yet")
        return 1
    print("| model | seeds | epochs | accuracy | exact pixels % | JPEG-copy pixels % | copy - exact (points) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        for metric, name in (("final_test_acc", "final"), ("best_test_acc", "best")):
            cells = [f"{m:.2f} ({lo:.2f} to {hi:.2f})" for m, lo, hi in
                     (r[metric]["exact"], r[metric]["jpeg"], r[metric]["diff"])]
            print(f"| {LABELS[r['model']]} | {','.join(map(str, r['seeds']))} | "
                  f"{'/'.join(map(str, sorted(r['epochs'])))} | {name} | {' | '.join(cells)} |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cifar10_jpeg_cost.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="train the runs not finished in --out, then collect")
    r.add_argument("--out", required=True)
    r.add_argument("--epochs", type=int, default=10)
    r.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    r.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra fedrun override")
    r.add_argument("--dry-run", action="store_true", help="print the fedrun commands, run nothing")
    c = sub.add_parser("collect", help="print the table of the runs in DIR")
    c.add_argument("dir")
    args = p.parse_args(argv)
    return run(args) if args.mode == "run" else collect(Path(args.dir))


if __name__ == "__main__":
    sys.exit(main())
