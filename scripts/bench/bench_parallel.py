"""Benchmark the parallel engine against the sequential one: whole runs from the command line,
side by side, interleaved.

``python scripts/bench/bench_parallel.py [--rounds 3 10] [--pairs 3] [--data DIR]``

Three engines train the same run (the same clients, batches and seeds):

``sequential, N threads``   ``engine=sequential`` with PyTorch's default threads (one per core);
``sequential, 1 thread``    ``engine=sequential threads=1``: the reference the parallel engine equals;
``parallel, N workers``     ``engine=parallel``: the round's clients in one single-threaded worker
                            process per core, the test set's batches too.

Each is a whole ``fedrun`` process (start-up, data loading, every round's training, aggregation
and evaluation on the 10,000 test images, the CSVs and checkpoints).  For each number of rounds
the three commands run ``--pairs`` times, in rotated order (so that none always runs first or
last on a machine that warms up), and the script prints per engine the median wall time, the CPU
seconds of all its processes (``RUSAGE_CHILDREN``: the run's process and its workers, reaped) and
the peak memory of all its processes together (the sum of their PSS, which counts each page the
workers share with the run's process once, sampled every 0.2 s), the seconds its rounds spent
training and evaluating (``rounds.csv``'s ``train_s`` and ``eval_s``), then the ratio of each
engine's wall time, and of its training time, to the parallel engine's (median of the per-pair
ratios, with their range), and whether
the parallel run's ``rounds.csv`` equals the one-thread sequential run's in every column but the
timings.

The workload: FashionMNIST, 100 clients x 600 images (IID), 10 a round, E = 1, B = 50, SGD with
lr 0.01, the MNIST CNN (431,080 parameters), FedAvg, the test set evaluated every round.

``--probe`` measures instead, in this process, why the parallel engine gains what it gains: one
round's training of 10 such clients (synthetic images of the same shape) with one thread, with
one thread per core, and on the parallel engine (one single-threaded worker per core), each the
fastest of ``--pairs`` tries, with the resulting speed-ups over one thread; the 10,000-image
evaluation the same three ways; and a plain PyTorch training loop (``zero_grad``, forward,
``backward``, ``torch.optim.SGD.step``) beside the engine's local step, with one thread, so that
the engine's own overhead shows.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ("aggregator=fedavg", "dataset=fmnist", "model=mnist_cnn", "partition=iid", "hyperparams.num_clients=100",
            "hyperparams.client_fraction=0.1", "hyperparams.local_epochs=1", "hyperparams.batch_size=50",
            "hyperparams.lr=0.01", "hyperparams.eval_every=1", "progress=false")
ENGINES = {
    "sequential, N threads": ("engine=sequential",),
    "sequential, 1 thread": ("engine=sequential", "threads=1"),
    "parallel, N workers": ("engine=parallel",),
}
TIMING_COLUMNS = ("wall_s", "train_s", "aggregate_s", "eval_s", "record_s", "diagnostics_s")


def tree_pss(root: int) -> int:
    """The summed proportional set size (bytes) of process ``root`` and its descendants: a page
    that n of them share counts 1/n in each, so the workers' copy-on-write data counts once."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def timed_run(overrides: list[str], run_dir: Path) -> dict:
    """One whole ``fedrun`` process: its wall time, CPU seconds (with its reaped workers') and
    peak memory (PSS of the process tree)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "fedrun", *overrides, f"hydra.run.dir={run_dir}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(0.2):
            peak[0] = max(peak[0], tree_pss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench_parallel: fedrun failed ({' '.join(overrides)}):\n{err[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rounds = pd.read_csv(run_dir / "rounds.csv")
    return {"wall": wall, "cpu": cpu, "peak": peak[0], "train": float(rounds["train_s"].sum()),
            "eval": float(rounds["eval_s"].sum()), "rounds": float(rounds["wall_s"].sum())}


def same_results(a: Path, b: Path) -> bool:
    """Whether two runs' rounds.csv agree in every column but the timings."""
    x, y = (pd.read_csv(d / "rounds.csv") for d in (a, b))
    keep = [c for c in x.columns if c not in TIMING_COLUMNS and not c.endswith("_s")]
    return list(x.columns) == list(y.columns) and x[keep].equals(y[keep])


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, torch {torch.__version__}, Python {platform.python_version()}"


def fastest(fn, tries: int) -> float:
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def probe(tries: int) -> None:
    """Where the parallel engine's gain comes from and where it ends (see the module's docstring)."""
    import torch
    import torch.nn.functional as F

    from fedrun.client.local_training import LocalTraining
    from fedrun.client.parallel import ParallelEngine, available_cores
    from fedrun.client.sequential import SequentialEngine
    from fedrun.diagnostics.evaluation import evaluate
    from fedrun.models.nets import MnistCNN

    cores = available_cores()
    torch.manual_seed(0)
    x, y = torch.randn(6000, 1, 28, 28), torch.randint(0, 10, (6000,))
    test_x, test_y = torch.randn(10000, 1, 28, 28), torch.randint(0, 10, (10000,))
    model = MnistCNN()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    indices = [torch.arange(600 * j, 600 * (j + 1)) for j in range(10)]
    local = LocalTraining(lr=0.01, batch_size=50)
    seq = SequentialEngine(model, x, y, local, None, 0)
    par = ParallelEngine(MnistCNN(), x, y, local, None, 0, workers=cores)
    par.share(test_x, test_y)
    state = model.state_dict()
    train, test = {}, {}
    try:
        par.start()
        for threads in (1, cores):
            torch.set_num_threads(threads)
            train[f"sequential, {threads} thread(s)"] = fastest(lambda: seq.train(params, {}, list(range(10)), indices, 1, None, local.lr), tries)
            test[f"sequential, {threads} thread(s)"] = fastest(lambda: evaluate(model, state, test_x, test_y, 256), tries)
        torch.set_num_threads(1)
        train[f"parallel, {cores} workers"] = fastest(lambda: par.train(params, {}, list(range(10)), indices, 1, None, local.lr), tries)
        test[f"parallel, {cores} workers"] = fastest(lambda: par.evaluate(model, state, test_x, test_y, 256), tries)
    finally:
        par.close()
    print(f"one round's training of 10 clients x 600 (120 steps of 50) and the 10,000-image evaluation, "
          f"fastest of {tries}:")
    one_train, one_test = train["sequential, 1 thread(s)"], test["sequential, 1 thread(s)"]
    for name in train:
        print(f"  {name:26s} training {train[name]:5.2f} s ({one_train / train[name]:4.2f}x one thread), "
              f"evaluation {test[name]:5.2f} s ({one_test / test[name]:4.2f}x)")
    torch.set_num_threads(1)
    net = MnistCNN()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    batches = [torch.randint(0, 6000, (50,)) for _ in range(120)]

    def plain():
        for b in batches:
            optimizer.zero_grad()
            F.cross_entropy(net(x[b]), y[b]).backward()
            optimizer.step()

    print(f"  one thread, ms a local step of 50 images: plain PyTorch loop {1000 * fastest(plain, tries) / 120:.1f}, "
          f"fedrun's sequential engine {1000 * one_train / 120:.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, nargs="+", default=[3, 10], help="run lengths to time (default 3 10)")
    parser.add_argument("--pairs", type=int, default=3, help="times each engine runs per length (default 3)")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "fashion-mnist"),
                        help="a folder holding FashionMNIST's four IDX files (default ../shared/data/fashion-mnist; "
                             "Debian's /usr/share/datasets/fashion-mnist is searched too)")
    parser.add_argument("--workers", default="auto", help="engine.workers of the parallel engine (default auto)")
    parser.add_argument("--probe", action="store_true", help="measure the scaling of training and evaluation in "
                        "this process instead (one thread, a thread per core, a worker per core)")
    args = parser.parse_args(argv)
    if args.probe:
        print(f"{datetime.date.today()}: {machine()}")
        probe(args.pairs)
        return
    if any(r < 1 for r in args.rounds) or args.pairs < 1:
        parser.error("--rounds and --pairs take numbers >= 1")
    common = [*WORKLOAD, f"dataset.load.search=[{args.data}]", "dataset.load.download=false"]
    engines = dict(ENGINES)
    engines["parallel, N workers"] = ("engine=parallel", f"engine.workers={args.workers}")
    names = list(engines)
    print(f"{datetime.date.today()}: {machine()}")
    print(f"workload: {' '.join(WORKLOAD)}")
    total = len(args.rounds) * args.pairs * len(names)
    print(f"{total} runs to do; each prints a line", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_parallel_") as tmp:
        for rounds in args.rounds:
            results: dict[str, list[dict]] = {name: [] for name in names}
            same = []
            for pair in range(args.pairs):
                order = names[pair % len(names):] + names[:pair % len(names)]
                dirs = {}
                for name in order:
                    dirs[name] = Path(tmp) / f"r{rounds}_p{pair}_{names.index(name)}"
                    r = timed_run([*common, f"hyperparams.rounds={rounds}", *engines[name]], dirs[name])
                    results[name].append(r)
                    print(f"  {rounds} rounds, try {pair + 1}: {name:24s} {r['wall']:6.1f} s wall, "
                          f"{r['cpu']:6.1f} CPU-s, peak {r['peak'] / 2**20:6.0f} MiB; training {r['train']:5.1f} s, "
                          f"evaluation {r['eval']:5.1f} s, the rest of the rounds {r['rounds'] - r['train'] - r['eval']:4.1f} s, "
                          f"outside the rounds {r['wall'] - r['rounds']:4.1f} s", flush=True)
                same.append(same_results(dirs["sequential, 1 thread"], dirs["parallel, N workers"]))
            print(f"\n{rounds} rounds, median of {args.pairs}:")
            print(f"  {'engine':24s} {'wall s':>8s} {'CPU s':>8s} {'peak MiB':>9s} {'train s':>8s} {'eval s':>7s} "
                  f"{'wall / parallel':>22s} {'train / parallel':>22s}")
            for name in names:
                rs = results[name]
                ratios = [a["wall"] / b["wall"] for a, b in zip(rs, results["parallel, N workers"])]
                train = [a["train"] / b["train"] for a, b in zip(rs, results["parallel, N workers"])]
                print(f"  {name:24s} {statistics.median(r['wall'] for r in rs):8.1f} "
                      f"{statistics.median(r['cpu'] for r in rs):8.1f} "
                      f"{statistics.median(r['peak'] for r in rs) / 2**20:9.0f} "
                      f"{statistics.median(r['train'] for r in rs):8.1f} {statistics.median(r['eval'] for r in rs):7.1f} "
                      f"{statistics.median(ratios):8.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) "
                      f"{statistics.median(train):8.2f}x ({min(train):.2f}-{max(train):.2f})")
            print(f"  parallel rounds.csv == sequential 1-thread rounds.csv (all but timings): "
                  f"{sum(same)} of {len(same)} pairs\n", flush=True)


if __name__ == "__main__":
    main()
