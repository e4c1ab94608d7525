"""Time and memory to build a partition of many clients, for every partition option.

``python scripts/bench/bench_partitions.py [--n 60000] [--classes 10] [--clients 1000 10000 100000]
[--before REV] [--timeout 120]``

Each (partition, K) is built in a fresh Python process on synthetic labels: ``--n`` labels of
``--classes`` classes in equal numbers, shuffled (FashionMNIST's shape by default: 60,000 training
images, 10 classes; the build reads only the labels, so synthetic ones cost what real ones do).
``natural`` gets synthetic client ids as well: every example's writer drawn uniformly from
``n / 2`` ids (about 0.86 n / 2 of them hold an example).  Each partition takes its
``conf/partition/*.yaml`` defaults (``flwr``: flwr-datasets' ``DirichletPartitioner``, alpha 0.5,
``min_partition_size`` 0).  A row gives the seconds the build took, its peak memory (the same
build run again under ``tracemalloc``: NumPy's arrays and Python's objects) and what came out:
the clients' sizes, or the refusal's setting and the largest K it names (each refusal in full
below the table).  A K the partition refuses is built again at the largest K the refusal names
(``--no-largest``: not), in a row of its own.

``--before REV`` builds every case with fedrun's ``fedrun/`` package as of the git revision REV as
well (unpacked to a temporary folder with ``git archive``), side by side.  A build that takes
longer than ``--timeout`` seconds is stopped and shown as such.

``flwr`` needs flwr-datasets (``pip install 'fedrun[huggingface]'``); without it its rows say so.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ("iid", "classes", "shards", "dirichlet", "dirichlet_labels", "mixed", "natural", "flwr")


def one(case: str, num_clients: int, n: int, num_classes: int) -> dict:
    """Build one partition in this process: its seconds, peak memory and outcome."""
    import numpy as np

    from fedrun.data import partition as P
    from fedrun.errors import FedrunError

    rng = np.random.default_rng(0)
    labels = rng.permutation(np.arange(n) % num_classes)
    kwargs = {}
    if case == "natural":
        kwargs["groups"] = rng.integers(0, n // 2, size=n)
    if case == "flwr":
        from functools import partial

        from fedrun.data.huggingface import flwr_partition
        try:
            from flwr_datasets.partitioner import DirichletPartitioner
        except ImportError:
            return {"outcome": "flwr-datasets not installed"}
        build = partial(flwr_partition, partitioner=partial(DirichletPartitioner, partition_by="label", alpha=0.5,
                                                            min_partition_size=0))
    else:
        build = getattr(P, case)
    start = time.perf_counter()
    try:
        parts = build(labels, num_clients=num_clients, num_classes=num_classes, seed=0, **kwargs)
        out = {"seconds": time.perf_counter() - start}
        sizes = np.array([len(p) for p in parts])
        out["outcome"] = f"{len(parts):,} clients, {sizes.min():,}-{sizes.max():,} examples"
        del parts
    except FedrunError as e:
        out = {"seconds": time.perf_counter() - start, "refused": str(e)}
    # The peak memory of the same build again, traced (NumPy's arrays and Python's objects).
    tracemalloc.start()
    try:
        build(labels, num_clients=num_clients, num_classes=num_classes, seed=0, **kwargs)
    except FedrunError:
        pass
    out["peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return out


def _largest(message: str) -> int | None:
    """The largest K a refusal names (``... the largest K here is 60,000 ...``), if it names one."""
    found = re.search(r"(?:largest K (?:here )?is (?:about )?|hyperparams\.num_clients <= )([\d,]+)", message)
    return int(found.group(1).replace(",", "")) if found else None


def run(case: str, num_clients: int, args, source: Path | None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(source) if source else "",
                                                                     os.environ.get("PYTHONPATH", "")))))
    cmd = [sys.executable, __file__, "--one", case, str(num_clients), "--n", str(args.n),
           "--classes", str(args.classes)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"outcome": f"stopped after {args.timeout} s"}
    if done.returncode:
        return {"outcome": "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:80]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(result: dict | None) -> tuple[str, str, str]:
    if result is None:
        return "", "", ""
    seconds = f"{result['seconds']:.2f}" if "seconds" in result else "-"
    peak = f"{result['peak_mib']:.1f}" if "peak_mib" in result else "-"
    if "refused" not in result:
        return seconds, peak, result["outcome"]
    largest = re.search(r"(?:largest K (?:here )?is |hyperparams\.num_clients <= )((?:about )?[\d,]+)",
                        result["refused"])
    return seconds, peak, (f"refused ({result['refused'].split('=')[0]}"
                           + (f"; largest K {largest.group(1)})" if largest else ")"))


def _unpack(rev: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="fedrun_before_"))
    archive = subprocess.run(["git", "archive", rev, "fedrun"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(folder)
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60_000, help="training labels (default: FashionMNIST's 60,000)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--clients", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--before", metavar="REV", help="also build with fedrun/ as of this git revision")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a build may take")
    parser.add_argument("--no-largest", dest="largest", action="store_false",
                        help="do not build again at the largest K a refusal names")
    parser.add_argument("--json", type=Path, help="also write every result (and each refusal in full) to this file")
    parser.add_argument("--one", nargs=2, metavar=("CASE", "K"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.n, args.classes)))
        return
    before = _unpack(args.before) if args.before else None
    head = "| partition | K |" + (" before s | before MiB | before |" if before else "") + " s | MiB | outcome |"
    print(f"{args.n:,} synthetic labels, {args.classes} classes; seconds to build, traced peak memory in MiB")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    results, refusals = [], {}
    for case in args.cases:
        todo, done = list(args.clients), set()
        while todo:
            k = todo.pop(0)
            done.add(k)
            after = run(case, k, args, None)
            old = run(case, k, args, before) if before else None
            results.append({"partition": case, "K": k, "after": after, "before": old})
            cells = ((*_cell(old),) if before else ()) + _cell(after)
            print(f"| {case} | {k:,} | " + " | ".join(cells) + " |", flush=True)
            if "refused" in after:
                refusals.setdefault(after["refused"], (case, k))
            largest = _largest(after.get("refused", ""))
            if args.largest and largest and largest not in done | set(todo) and largest < k:
                todo.insert(0, largest)
    print("\nRefusals" + (" (this checkout's)" if before else "") + ":")
    for message, (case, k) in refusals.items():
        print(f"- {case}, K = {k:,}: `{message}`")
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "classes": args.classes, "before": args.before,
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
