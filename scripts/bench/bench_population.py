"""Benchmark a population against the same runs one by one, side by side in one process.

``python scripts/bench/bench.py population [--workload grid|small] [--runs R] [--rounds N]``

R runs of a workload are trained twice: one by one (each run alone on the batched engine, the way
``fedrun -m ...`` runs them under Hydra's basic launcher) and as one population
(``hydra/launcher=population``).  For each it prints the seconds per round of all R runs (steady
state: rounds 2..N of the runs' own ``wall_s`` column, so data loading and the first round's
warm-up are left out of both; the fastest of ``--repeat`` alternating tries), the runs per hour
that makes for the workload's full length, the population's speedup, the clients trained at once
(the engines' chunk) and the peak memory; then the whole measured time including set-up.  With
``--sequential`` the runs are also timed one by one on the sequential engine (what ``engine=auto``
picks on a CPU).  It checks that both modes wrote the same ``test_acc`` column.

Workloads (synthetic data of the real shape: speed does not depend on pixels):

``grid``   FedNNNN on MNIST, Table 1: K = 100, C = 1, E = 5, B = 50, 100 rounds, 600 images per
           client; the 25 runs of a beta x gamma grid (5 x 5).  For a GPU.
``small``  the MNIST CNN, K = 20, C = 0.5, E = 1, B = 50, 100 images per client, 100 rounds;
           4 runs (FedAvg and FedNNNN, 2 seeds each).  A minute on a 2-core CPU.
``tiny``   3 runs of an MLP on 8x8 images, 4 clients: seconds (the script's own check).

Usage::

    python scripts/bench/bench.py population --workload small --rounds 3
    python scripts/bench/bench.py population --workload grid --rounds 3 --device cuda
"""
from __future__ import annotations

import argparse
import itertools
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch


@dataclass(frozen=True)
class Workload:
    overrides: tuple[str, ...]  # the runs' common settings
    runs: tuple[tuple[str, ...], ...]  # each run's own
    full_rounds: int


GRID = tuple(("aggregator=fednnnn", f"aggregator.beta={b}", f"aggregator.gamma={g}")
             for b, g in itertools.product((0.5, 0.6, 0.7, 0.8, 0.9), (0.5, 0.6, 0.7, 0.8, 0.9)))
WORKLOADS = {
    "grid": Workload(("hyperparams=fednnnn_mnist", "model=mnist_cnn", "dataset=synthetic",
                      "dataset.load.num_train=60000", "dataset.load.num_test=10000", "partition=iid"), GRID, 100),
    "small": Workload(("model=mnist_cnn", "dataset=synthetic", "dataset.load.num_train=2000",
                       "dataset.load.num_test=1000", "hyperparams.num_clients=20", "hyperparams.client_fraction=0.5",
                       "hyperparams.local_epochs=1", "hyperparams.batch_size=50", "partition=iid"),
                      tuple((f"aggregator={a}", f"seed={s}") for a in ("fedavg", "fednnnn") for s in (0, 1)), 100),
    # Seconds: the script's own check.
    "tiny": Workload(("model=mlp", "model.hidden=[16]", "dataset=synthetic", "dataset.image_size=8",
                      "dataset.load.num_train=200", "dataset.load.num_test=50", "hyperparams.num_clients=4",
                      "hyperparams.client_fraction=1.0", "partition=iid"),
                     (("aggregator=fedavg",), ("aggregator=fednnnn", "seed=1"), ("aggregator=fedprox",)), 10),
}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from fedrun.paths import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="bench"):
        return hydra_compose("config", overrides=overrides)


def build(workload: Workload, n: int, rounds: int, device: str, root: Path, datasets: dict | None, engine: str,
          batched: bool):
    from fedrun.command.build import federated_run

    own = list(workload.runs[n])
    cfg = compose([*workload.overrides, *own, f"hyperparams.rounds={rounds}", f"device={device}",
                   f"engine={engine}", "progress=false"])
    return federated_run(cfg, root / f"run{n}", {}, own, datasets, batched=batched)


def steady_seconds(run_dirs: list[Path], population: bool) -> float:
    """Seconds a round of all runs takes, from the runs' ``wall_s`` column (rounds 2..N): summed
    over runs one by one; in a population every run's ``wall_s`` is the population's round."""
    walls = [pd.read_csv(d / "rounds.csv")["wall_s"].iloc[1:] for d in run_dirs]
    return float(walls[0].mean()) if population else float(sum(w.mean() for w in walls))


def peak_memory(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process RSS so far)"


def measure(name: str, workload: Workload, runs: int, rounds: int, device: torch.device, sequential: bool,
            repeat: int = 2) -> None:
    from fedrun.harness.simulation import run_alone, simulate_runs

    runs = min(runs or len(workload.runs), len(workload.runs))
    print(f"\n== population benchmark '{name}': {runs} runs, {rounds} rounds timed (of {workload.full_rounds}), "
          f"device={device}; each mode {repeat}x, alternating, the fastest kept")
    print("   " + " ".join(workload.overrides))
    modes = [("one by one, batched engine", "batched", False)] + \
            ([("one by one, sequential engine", "sequential", False)] if sequential else []) + \
            [("population", "batched", True)]
    results = {}
    for label, engine, together in [m for _ in range(repeat) for m in modes]:
        root = Path(tempfile.mkdtemp(prefix="fedrun-bench-"))
        try:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            if together:
                datasets: dict = {}
                members = [build(workload, n, rounds, str(device), root, datasets, engine, True) for n in range(runs)]
                outcomes = simulate_runs(members, progress=True)
                failed = [o for o in outcomes if not isinstance(o, dict)]
                if failed:
                    raise SystemExit(f"population: {failed[0]}")
                chunk = members[0].engine._fit
            else:
                chunk = None
                for n in range(runs):
                    member = build(workload, n, rounds, str(device), root, None, engine, False)
                    run_alone(member, progress=n == 0)
                    chunk = getattr(member.engine, "_fit", None)
            total = time.perf_counter() - start
            dirs = [root / f"run{n}" for n in range(runs)]
            per_round = steady_seconds(dirs, together)
            accuracy = [pd.read_csv(d / "rounds.csv")["test_acc"].tolist() for d in dirs]
            if label not in results or per_round < results[label][0]:  # the best of the repeats
                results[label] = (per_round, total, chunk, peak_memory(device), accuracy)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    base = results[modes[0][0]][0]
    print(f"\n   {'mode':<31} {'s/round (all runs)':>18} {'runs/hour':>10} {'speedup':>8} {'chunk':>6}  peak memory")
    for label, (per_round, total, chunk, memory, _) in results.items():
        per_hour = runs * 3600 / (per_round * workload.full_rounds)
        print(f"   {label:<31} {per_round:18.4f} {per_hour:10.2f} {base / per_round:7.2f}x {str(chunk or '-'):>6}"
              f"  {memory}")
    full = results["population"][0] * workload.full_rounds
    print(f"   the {runs} runs' {workload.full_rounds} rounds: {full / 60:.1f} min as a population, "
          f"{base * workload.full_rounds / 60:.1f} min one by one (projected from the timed rounds)")
    print("   measured time including set-up: " + ", ".join(f"{label} {total:.1f} s"
                                                           for label, (_, total, *_) in results.items()))
    alone, together = results[modes[0][0]][4], results["population"][4]
    worst = max(abs(a - b) for x, y in zip(alone, together) for a, b in zip(x, y))
    print(f"   test accuracy, population vs one by one (batched): largest difference {worst:.4f} over "
          f"{runs} runs x {rounds} rounds")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.py population", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="small", choices=sorted(WORKLOADS))
    parser.add_argument("--runs", type=int, default=None, help="the first R runs of the workload (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds trained per run (the first is not timed)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--repeat", type=int, default=2,
                        help="time each mode this many times, alternating, and keep the fastest (timings on a "
                             "shared CPU vary by 10-20%% from one run to the next)")
    parser.add_argument("--sequential", action="store_true",
                        help="also time the runs one by one on the sequential engine")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first round is warm-up)")
    if args.runs is not None and args.runs < 2:
        parser.error("--runs must be at least 2 (a population of one is a run)")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (use --device cpu or auto)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    measure(args.workload, WORKLOADS[args.workload], args.runs, args.rounds, device, args.sequential, args.repeat)


if __name__ == "__main__":
    main()
