"""What per-client accuracy costs: a natural-clients run with ``client_eval_every=0`` (off) and with
``client_eval_every=1`` (each sampled client's own test data scored every round), side by side.
``--personal`` adds every client scored every round (``client_eval_clients=all``): with FedAvg's
global model, and with each client's personal model too (FedPer: its own last layer; Ditto: its
own model, trained by a second local step), the cost of a personalized method's scores.

The data is LEAF's FEMNIST layout written by this script (``--writers`` writers, each with
``--train`` training and ``--test`` test images of 28x28 random pixels: speed does not depend on
them), so it runs offline.  Each setting runs ``--repeat`` times, interleaved, through fedrun's
Python entry (``fedrun.command.build.run``); the figures are the medians over the runs of the
per-round ``eval_s`` (the global test set plus, when on, the per-client pass) and ``wall_s``,
rounds 2 onward (the first round warms caches).

Usage (from the repository root)::

    python scripts/bench/bench_client_eval.py                       # 100 writers, 10 a round, MNIST CNN
    python scripts/bench/bench_client_eval.py --engine batched --rounds 5
    python scripts/bench/bench_client_eval.py --personal           # + all clients, FedPer, Ditto
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def write_leaf(root: Path, writers: int, train: int, test: int, seed: int = 0) -> Path:
    """<root>/femnist/data/{train,test}/all_data_0.json: ``writers`` writers, pixels in [0, 1]."""
    rng = np.random.default_rng(seed)
    names = [f"f{w:04d}_00" for w in range(writers)]
    for split, n in (("train", train), ("test", test)):
        folder = root / "femnist" / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        data = {"users": names, "num_samples": [n] * writers,
                "user_data": {w: {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
                              for w in names}}
        (folder / "all_data_0.json").write_text(json.dumps(data))
    return root


def measure(work: Path, args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    """Each setting's runs under ``work``, interleaved and rotated: per run, the median ``eval_s``
    and ``wall_s`` of rounds 2 onward."""
    from hydra import compose, initialize_config_dir

    from fedrun.command.build import run

    leaf = write_leaf(work / "leaf", args.writers, args.train, args.test)
    common = ["dataset=femnist", f"dataset.load.root={leaf}", "partition=natural", f"model={args.model}",
              f"hyperparams.num_clients={args.writers}", f"hyperparams.client_fraction={args.fraction}",
              f"hyperparams.rounds={args.rounds}", f"engine={args.engine}", "progress=false"]
    settings = {"off": ["aggregator=fedavg", "client_eval_every=0"], "on": ["aggregator=fedavg", "client_eval_every=1"]}
    if args.personal:
        every = ["client_eval_every=1", "client_eval_clients=all"]
        settings.update({"all": ["aggregator=fedavg", *every], "fedper_all": ["aggregator=fedper", *every],
                         "ditto_all": ["aggregator=ditto", *every]})
    rows = {name: [] for name in settings}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3", job_name="bench"):
        for r in range(args.repeat):
            for name in (settings if r % 2 == 0 else reversed(settings)):  # interleaved, rotated
                folder = work / f"{name}{r}"
                run(compose("config", overrides=common + settings[name]), folder, {}, [])
                df = pd.read_csv(folder / "rounds.csv").iloc[1:]
                rows[name].append((df["eval_s"].median(), df["wall_s"].median(), df["train_s"].median()))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", type=int, default=100)
    p.add_argument("--train", type=int, default=100, help="training images a writer (default 100)")
    p.add_argument("--test", type=int, default=20, help="test images a writer (default 20)")
    p.add_argument("--fraction", type=float, default=0.1, help="clients a round, as a fraction (default 0.1)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--model", default="mnist_cnn")
    p.add_argument("--engine", default="sequential")
    p.add_argument("--personal", action="store_true", help="also every client scored, with FedAvg's model and "
                                                           "with FedPer's and Ditto's personal models")
    args = p.parse_args(argv)
    for name in ("writers", "train", "test", "rounds", "repeat"):
        if getattr(args, name) < 1 or (name == "rounds" and args.rounds < 2):
            p.error(f"--{name} must be >= {2 if name == 'rounds' else 1}")

    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="fedrun-client-eval-"))  # the data and runs: removed at the end
    try:
        rows = measure(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m = max(1, round(args.fraction * args.writers))
    print(f"{args.writers} writers ({args.train} train, {args.test} test images each), {m} a round, "
          f"{args.model}, engine={args.engine}, rounds 2-{args.rounds}, {args.repeat} runs a setting")
    print(f"test set {args.writers * args.test:,} images; per-client pass {m * args.test:,} images a round")
    med = {name: tuple(statistics.median(row[i] for row in v) for i in range(3)) for name, v in rows.items()}
    labels = {"off": "fedavg, client_eval_every=0", "on": "fedavg, client_eval_every=1 (the sampled clients)",
              "all": "fedavg, every client scored", "fedper_all": "fedper, every client scored (+ personal models)",
              "ditto_all": "ditto, every client scored (+ personal models)"}
    for name, (e, w, t) in med.items():
        print(f"  {labels[name]}: eval_s {e:.4f}, train_s {t:.4f}, wall_s {w:.4f} s a round")
    print(f"  per-client accuracy adds {med['on'][0] - med['off'][0]:+.4f} s of evaluation a round "
          f"({med['on'][0] / med['off'][0]:.2f}x the evaluation, {med['on'][1] / med['off'][1]:.3f}x the round)")
    if args.personal:
        print(f"  every client scored: {med['all'][0] / med['off'][0]:.2f}x the evaluation; with FedPer's personal "
              f"models {med['fedper_all'][0] / med['all'][0]:.2f}x that, Ditto's {med['ditto_all'][0] / med['all'][0]:.2f}x; "
              f"Ditto's training with its personal step {med['ditto_all'][2] / med['all'][2]:.2f}x FedAvg's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
