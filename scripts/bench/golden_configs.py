"""Golden configurations: a refactoring must leave every run's results byte for byte as they were.

``run OUT`` runs 19 short configurations through the ``fedrun`` command into ``OUT/<name>/``:
every aggregator family on the sequential and the batched engine, stragglers and drop-outs,
FedLap's two forms, per-layer angles, BatchNorm with averaged optimizer state and the PD-VL
learner, Adam with per-client state, Batch Renormalization, centralized training, snapshots with a
validation split, a learning-rate schedule and augmentation, and a population sweep.  ``compare A
B`` then checks that two such folders hold the same results: every CSV without its timing
columns (a column one side lacks, such as the bytes columns new in rounds.csv, is reported and
left out), every ``summary.json`` and every model snapshot's tensors.  Run ``run`` with the code
before a change and with the code after it (``PYTHONPATH=<checkout>`` picks the code), then
``compare``::

    PYTHONPATH=../before python scripts/bench/golden_configs.py run outputs/golden/before
    python scripts/bench/golden_configs.py run outputs/golden/after
    python scripts/bench/golden_configs.py compare outputs/golden/before outputs/golden/after

Each run takes a few seconds on a CPU (synthetic data, 10 clients).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

BASE = ["dataset=synthetic", "dataset.load.num_train=600", "dataset.load.num_test=200", "hyperparams.num_clients=10",
        "hyperparams.client_fraction=0.3", "hyperparams.rounds=4", "hyperparams.batch_size=20", "progress=false",
        "device=cpu"]
MLP = ["model=mlp", "model.hidden=[16]"]  # every configuration but the CIFAR-shaped ones
CIFAR = ["dataset.channels=3", "dataset.image_size=32", "dataset.load.num_train=300", "dataset.load.num_test=100",
         "model.n=1", "model.m=1", "model.u=1"]
BOTH = ("engine=sequential", "engine=batched")
CONFIGS = {
    **{f"fedavg_{e[7:]}": ["aggregator=fedavg", e] for e in BOTH},
    **{f"fednnnn_{e[7:]}": ["aggregator=fednnnn", e] for e in BOTH},
    **{f"fedprox_stragglers_{e[7:]}": ["aggregator=fedprox", "hyperparams.stragglers=0.5",
                                        "hyperparams.local_epochs=3", e] for e in BOTH},
    "fedlap_linear": ["aggregator=fedlap", "engine=sequential"],
    "fedlap_interpolate": ["aggregator=fedlap", "aggregator.form=interpolate", "engine=batched"],
    "fedadp_dropouts": ["aggregator=fedadp", "hyperparams.dropouts=0.3", "hyperparams.client_fraction=0.5"],
    "fedlayerwise": ["aggregator=fedlayerwise", "engine=batched"],
    "momentum_uniform_sent_classes": ["aggregator=momentum", "aggregator.weighting=uniform",
                                      "aggregator.evaluate=sent", "partition=classes"],
    "normnorm_eval2": ["aggregator=normnorm", "hyperparams.eval_every=2", "hyperparams.rounds=5"],
    "fedadam_fedyogi": ["aggregator=fedadam", "engine=batched"],
    "neta_bn_average_vanilla": ["model=neta_baseline", "model.norm=bn", *CIFAR, "hyperparams.optimizer_state=average",
                                "hyperparams.momentum=0.9", "vanilla_every=1", "hyperparams.rounds=3"],
    "netb_adam_local_vanilla": ["model=netb_baseline", *CIFAR, "hyperparams.optimizer=adam", "hyperparams.lr=0.001",
                                "hyperparams.optimizer_state=local", "vanilla_every=2", "hyperparams.rounds=3",
                                "engine=batched"],
    "neta_brn": ["model=neta_baseline", "model.norm=brn", *CIFAR, "hyperparams.rounds=3", "engine=batched"],
    "centralized": ["mode=centralized", "hyperparams.rounds=2"],
    "snapshots_validation_schedule_augment": ["snapshots=[2,4]", "hyperparams.validation_fraction=0.2",
                                              "hyperparams.lr_milestones=[0.5]", "hyperparams.augment=true",
                                              "aggregator=fednnnn"],
}
# A sweep trained as one population (the same runs as alone, on the batched engine).
POPULATION = ["-m", "aggregator=fedavg,fednnnn", "seed=0,1", "hydra/launcher=population", "engine=batched"]
TIMING = ("train_s", "eval_s", "wall_s")
# What differs from one process to the next: when and where a run ran (fedrun.harness.provenance).
VOLATILE_FILES = ("checkpoint.pt", "mlflow.json", "run.json", "fedrun.log")
VOLATILE_SUMMARY = ("started", "finished", "round_seconds", "provenance", "processes")  # fedrun.harness.provenance.VOLATILE


def base(extra: list[str]) -> list[str]:
    """BASE, without the clients' number and fraction for a centralized run (one learner)."""
    if "mode=centralized" in extra:
        return [o for o in BASE if not o.startswith(("hyperparams.num_clients", "hyperparams.client_fraction"))]
    return BASE


def run(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    jobs = [(name, [*base(extra), *([] if "dataset.channels=3" in extra else MLP), *extra,
                    f"hydra.run.dir={out / name}"]) for name, extra in CONFIGS.items()]
    jobs.append(("population", [*POPULATION, *BASE, *MLP, f"hydra.sweep.dir={out / 'population'}"]))
    for name, args in jobs:
        proc = subprocess.run([sys.executable, "-m", "fedrun", *args], capture_output=True, text=True, env=env)
        print(f"{name}: exit {proc.returncode}")
        if proc.returncode:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
    return 0


def _csv(path: Path, drop: tuple[str, ...] = ()) -> str:
    import pandas as pd

    df = pd.read_csv(path)
    return df.drop(columns=[c for c in (*TIMING, *drop) if c in df]).to_csv(index=False)


def _columns(path: Path) -> list[str]:
    with open(path) as f:
        return f.readline().rstrip("\n").split(",")


def compare(a: Path, b: Path) -> int:
    import torch

    files = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()}
                   | {p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    differ, same = [], 0
    for rel in files:
        if rel.suffix not in (".csv", ".json", ".pt") or rel.name in VOLATILE_FILES \
                or rel.parts[0] == ".failed_jobs":
            continue
        pa, pb = a / rel, b / rel
        if not (pa.is_file() and pb.is_file()):
            differ.append(f"{rel}: only in {'A' if pa.is_file() else 'B'}")
            continue
        if rel.suffix == ".csv":  # columns new since the older version compared are reported, not failed
            new = tuple(sorted(set(_columns(pa)) ^ set(_columns(pb))))
            if new:
                print(f"{rel}: columns in one only: {', '.join(new)}")
            equal = _csv(pa, new) == _csv(pb, new)
        elif rel.suffix == ".json":
            ja, jb = (json.loads(p.read_text()) for p in (pa, pb))
            if rel.name == "summary.json":  # keys new since the older version compared are reported, not failed
                new = sorted(set(ja) ^ set(jb))
                if new:
                    print(f"{rel}: keys in one only: {', '.join(new)}")
                ja, jb = ({k: v for k, v in j.items() if k not in VOLATILE_SUMMARY and k not in new} for j in (ja, jb))
            equal = ja == jb
        else:
            ta, tb = (torch.load(p, map_location="cpu", weights_only=True) for p in (pa, pb))
            equal = ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta if torch.is_tensor(ta[k]))
        if equal:
            same += 1
        else:
            differ.append(f"{rel}: differs")
    for line in differ:
        print(line)
    print(f"{same} files identical, {len(differ)} differ")
    return 1 if differ else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the golden configurations").add_argument("out", type=Path)
    c = sub.add_parser("compare", help="compare two folders of golden runs")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args(argv)
    return run(args.out) if args.command == "run" else compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
