"""A cross-device round at FEMNIST's scale: LEAF's 3,550 writers (``dataset=synthetic_writers``: their
number and the spread of their sizes, 226.83 +- 88.94 images a writer), ``--per-round`` of them a
round (100), LEAF's FEMNIST CNN and settings (``hyperparams=leaf_femnist``: SGD lr 0.06, B = 10,
E = 1), FedAvg, through the ``fedrun`` command as a user runs it.

It prints what such a run costs on this machine: building the data and the partition, and per
round (the median of rounds 2 onward: the first warms caches) the local training, the bookkeeping
(``wall_s - train_s - eval_s``: aggregation, N/E, angles, parameter divergence, CSV rows, the
checkpoint) and the test set's evaluation, the process's peak memory, the round's stacked updates
(m x d float32) and the run's files.  Speed does not depend on the pixels; the accuracy on this
synthetic data says nothing about FEMNIST's.

Usage (from the repository root)::

    python scripts/bench/bench_cross_device.py                               # 3,550 writers, 100 a round, 3 rounds
    python scripts/bench/bench_cross_device.py --model mlp --rounds 5
    python scripts/bench/bench_cross_device.py --writers 500 --per-round 50 --rounds 2   # a quicker look
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--writers", type=int, default=3550, help="clients (LEAF's FEMNIST: 3,550 writers)")
    p.add_argument("--per-round", type=int, default=100, help="clients a round (m)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="leaf_cnn", help="a conf/model name (leaf_cnn: LEAF's FEMNIST CNN)")
    p.add_argument("--aggregator", default="fedavg")
    p.add_argument("--threads", type=int, default=None, help="torch's CPU threads (fedrun's threads=)")
    p.add_argument("--out", type=Path, default=None, help="keep the run here (default: a temporary folder, removed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one more fedrun override")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.out or Path(tmp) / "run"
        overrides = ["dataset=synthetic_writers", f"dataset.load.writers={args.writers}", f"model={args.model}",
                     "partition=natural", "hyperparams=leaf_femnist", f"hyperparams.num_clients={args.writers}",
                     f"hyperparams.client_fraction={args.per_round / args.writers!r}",  # C K = m exactly
                     f"hyperparams.rounds={args.rounds}", f"aggregator={args.aggregator}", "progress=false",
                     "client_eval_every=0", f"hydra.run.dir={run_dir}", *args.set]
        if args.threads:
            overrides.append(f"threads={args.threads}")
        command = [sys.executable, "-m", "fedrun", *overrides]
        print("fedrun " + " ".join(o for o in overrides if not o.startswith("hydra.run.dir=")), flush=True)
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
            return proc.returncode
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
        rounds = pd.read_csv(run_dir / "rounds.csv")
        summary = json.loads((run_dir / "summary.json").read_text())
        later = rounds[rounds["round"] > 1] if len(rounds) > 1 else rounds
        train, evaluate = later["train_s"].median(), later["eval_s"].median()
        book = (later["wall_s"] - later["train_s"] - later["eval_s"]).median()
        part = pd.read_csv(run_dir / "partition.csv")
        log = (run_dir / "fedrun.log").read_text()
        params = int(re.search(r"(\d+) parameters", log).group(1).replace(",", "")) if "parameters" in log else None
        m = args.per_round
        print(f"{args.writers:,} writers ({part['examples'].sum():,} training images, {part['examples'].min()}-"
              f"{part['examples'].max()} a writer, mean {part['examples'].mean():.1f}), {m} a round, "
              f"{args.model}{f' ({params:,} parameters)' if params else ''}, {args.aggregator}, {args.rounds} rounds")
        print(f"whole run {seconds:.1f} s (data, partition, model and every round); before round 1: "
              f"{seconds - rounds['wall_s'].sum():.1f} s")
        print(f"a round (median of rounds {int(later['round'].min())}-{int(later['round'].max())}): training "
              f"{train:.2f} s, bookkeeping {book:.3f} s ({book / train:.1%} of training), evaluation {evaluate:.3f} s")
        if params:
            print(f"the round's stacked updates: {m * params * 4 / 2**20:,.0f} MiB ({params * 4 / 2**20:.1f} MiB a "
                  f"sampled client, float32)")
        print(f"peak memory of the fedrun process: {peak_mib:,.0f} MiB")
        sizes = {name: (run_dir / name).stat().st_size for name in ("partition.csv", "clients.csv", "checkpoint.pt")
                 if (run_dir / name).exists()}
        print("files: " + ", ".join(f"{k} {v / 1024:,.0f} KiB" for k, v in sizes.items()))
        print(f"final test accuracy {summary.get('final_test_acc', float('nan')):.4f} (synthetic data: no measure "
              "of FEMNIST's accuracy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
