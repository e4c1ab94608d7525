"""Lock-steps of FedNNNN's MNIST presets, counted and timed: what bounds a round of the batched engine.

The batched engine trains a round's clients in lock-step: its s-th step is every client's s-th
optimizer step.  A round therefore lasts as many lock-steps as its longest client takes (the
critical path, ``E * ceil(n_max / B)``), however little the others hold.  On the unbalanced preset
one client holds a fifth of MNIST, so most of a round's lock-steps train a handful of clients; on the
balanced one every client finishes together.  This script prints both sides of that picture.

Per workload (the preset's partition, built as fedrun builds it: the preset's config composed, its
``partition`` object called on the training labels with the run's seed), from the clients' sizes
alone (:func:`fedrun.client.round_plan.lock_step_profile`): clients, total steps (what the
sequential engine takes), mean steps, critical path, lock-steps a round (chunks of ``--width``
clients run one after another), the bucketed shapes (one captured graph each) and the occupancy
(real clients / padded rows of a lock-step).

Measured on ``--device``, once for both workloads (the same CNN, the same B): milliseconds per
lock-step of the MNIST CNN (:class:`fedrun.models.nets.MnistCNN`) through the
:class:`~fedrun.client.batched.BatchedEngine`, for one client and for a full-width step (``--width``
clients), eager and with ``capture='on'`` (left out, with a note, while the engine has no such
option; on a CPU ``on`` runs the same static-shape padded step eagerly), and what one such step
launches, counted with torch.profiler: CUDA kernels and launch calls on a GPU, outermost aten
operator calls on a CPU (about one kernel each on a GPU).

Then the round's floor estimate: the critical path x one captured one-client step, plus the other
clients' steps (total - critical path) at a full-width step's cost per client (its ms / width),
the arithmetic they add once they ride along in a wide step.  Figures only, no pass or fail: a
timing depends on the machine.

Usage::

    python scripts/bench/bench_lockstep.py                               # both presets, synthetic stand-in
    python scripts/bench/bench_lockstep.py --device cuda --data .gpudata/mnist --json lockstep.json
    python scripts/bench/bench_lockstep.py fednnnn_mnist_noniid_b --tiny  # a few steps measured
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import sys
import time
from pathlib import Path

import torch

WORKLOADS = {"fednnnn_mnist_noniid_ub": "fednnnn/mnist_noniid_ub", "fednnnn_mnist_noniid_b": "fednnnn/mnist_noniid_b"}
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
SYNTHETIC_IMAGES = 60_000  # MNIST's training set: the partition's sizes follow from it
TARGET_STEP_MS = 0.3  # docs/performance.md: one lock-step of the MNIST CNN for one client on one H100
# (lock-steps of a long timed round, rounds timed after one warm-up) per size and device; the short
# round is a quarter as long.
SIZES = {"tiny": (2, 1), "cpu": (16, 3), "cuda": (60, 3)}  # (lock-steps of the long round, rounds timed)


# ----------------------------------------------------------------------------- the workloads

def compose(experiment: str, data: Path | None):
    """The preset's config and its built objects (partition, federation, local training), as the
    CLI composes and builds them; with ``data``, its MNIST loader reads that folder and never downloads."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from fedrun.command.build import CONF_DIR, build

    overrides = [f"experiment={experiment}", "device=cpu"]
    if data is not None:
        overrides += [f"dataset.load.search=[{data}]", "dataset.load.download=false"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="bench_lockstep"):
        cfg = hydra_compose("config", overrides=overrides)
    return cfg, build(cfg)


def load_images(cfg, objects, data: Path | None, device: torch.device):
    """MNIST as the preset's loader reads it from ``data``, else a synthetic stand-in of MNIST's shape
    (60,000 training images, 10 balanced classes): (FederatedData, a line saying which)."""
    from fedrun.command.build import _prepare_data
    from fedrun.data.datasets import synthetic
    from fedrun.data.preparation import prepare

    if data is not None:
        prepared = _prepare_data(cfg, dict(objects, device=device))
        return prepared, f"MNIST from {data} ({len(prepared.train_y):,} training images)"
    raw = synthetic(num_train=SYNTHETIC_IMAGES, num_test=10, channels=1, image_size=28)
    return (prepare(raw, None, None, device=device),
            f"synthetic MNIST-shaped stand-in ({SYNTHETIC_IMAGES:,} images, 6,000 a class; no --data given)")


def client_sizes(objects, labels) -> list[int]:
    """n_k of the preset's partition on these labels, with the run's seed (FederatedRun's call)."""
    from fedrun.data.partition import client_ids

    partition = objects["partition"]
    parts = partition(labels=labels, num_clients=objects["federation"].num_clients, num_classes=10,
                      seed=objects["seed"], **client_ids(partition, None))
    return [len(p) for p in parts]


def profile_workload(objects, labels, chunk: int) -> dict:
    """The round's shape in lock-steps, ``chunk`` clients at once (round_plan.lock_step_profile),
    with the largest and smallest client."""
    from fedrun.client.round_plan import lock_step_profile

    local = objects["local"]
    sizes = client_sizes(objects, labels)
    figures = lock_step_profile(sizes, local.batch_size, local.epochs, chunk=chunk)
    return dict(figures, largest=max(sizes), smallest=min(sizes), batch_size=local.batch_size, epochs=local.epochs)


# ----------------------------------------------------------------------------- measuring a lock-step

def takes_capture() -> bool:
    """Whether this checkout's BatchedEngine has the ``capture`` option yet."""
    from fedrun.client.batched import BatchedEngine

    return "capture" in inspect.signature(BatchedEngine).parameters


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Bench:
    """A BatchedEngine on the MNIST CNN training ``width`` clients a round, each holding exactly
    ``steps`` batches (E = 1): a round is ``steps`` lock-steps of ``width`` clients.  A lock-step's
    cost is the difference between a long round and a short one (``steps`` and ``steps // 4``
    lock-steps) per lock-step between them, so the round's own setup (stacking the clients, the
    plan, the results) is left out of it and reported apart."""

    def __init__(self, data, local, device: torch.device, width: int, steps: int, capture: str | None):
        from fedrun.client.batched import BatchedEngine
        from fedrun.models.nets import MnistCNN
        from fedrun.params import split_state

        torch.manual_seed(0)
        model = MnistCNN().to(device)
        self.params, self.buffers = split_state(model)
        self.device, self.width = device, width
        self.lengths = (max(1, steps // 4), steps)  # short, long
        local = dataclasses.replace(local, epochs=1)
        extra = {} if capture is None else {"capture": capture}
        self.engine = BatchedEngine(model, data.train_x, data.train_y, local, None, 0, clients_per_step=None, **extra)
        total, b = len(data.train_y), local.batch_size
        self.indices = {s: [torch.arange(k * b * s, (k + 1) * b * s, device=device) % total for k in range(width)]
                        for s in self.lengths}
        self.round = 0

    def train(self, steps: int) -> None:
        self.round += 1
        self.engine.train(self.params, self.buffers, list(range(self.width)), self.indices[steps], self.round, None,
                          self.engine.local.lr)

    def timed(self, steps: int) -> float:
        """Seconds of one round of ``steps`` lock-steps."""
        _sync(self.device)
        start = time.perf_counter()
        self.train(steps)
        _sync(self.device)
        return time.perf_counter() - start

    def ms(self, rounds: int) -> dict[str, float]:
        """ms a lock-step (the long round's seconds less the short one's, per lock-step between them)
        and ms of a round's setup (the short round less its lock-steps).  Each length is warmed up
        once (kernels, caches, the graphs' capture), then the two alternate ``rounds`` times and
        each keeps its fastest round: on a shared machine the minimum is the figure least disturbed
        by other work."""
        short, long = self.lengths
        self.timed(short), self.timed(long)
        t_short, t_long = float("inf"), float("inf")
        for _ in range(rounds):
            t_short, t_long = min(t_short, self.timed(short)), min(t_long, self.timed(long))
        step = (t_long - t_short) / (long - short) if long > short else t_long / long
        return {"ms": 1e3 * step, "setup_ms": 1e3 * (t_short - short * step)}

    def launches(self) -> dict[str, float]:
        """Launches a lock-step, the short round's subtracted from the long one's as for the time, counted
        with torch.profiler: on CUDA, kernels run and launch calls made (a captured graph's replay is
        one launch call); on a CPU, outermost aten operator calls."""
        short, long = self.lengths
        counts = [self._count(s) for s in self.lengths]
        return {k: (counts[1][k] - counts[0][k]) / (long - short) if long > short else counts[1][k] / long
                for k in counts[1]}

    def _count(self, steps: int) -> dict[str, int]:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        _sync(self.device)
        with profile(activities=activities) as prof:
            self.train(steps)
            _sync(self.device)
        events = prof.events()
        if cuda:
            kernels = sum(1 for e in events if e.device_type == DeviceType.CUDA
                          and not e.name.startswith(("Memcpy", "Memset")))
            launches = sum(1 for e in events if e.name.startswith(("cudaLaunch", "cuLaunch", "cudaGraphLaunch")))
            return {"kernels": kernels, "launch_calls": launches}
        return {"aten_calls": sum(1 for e in events if e.name.startswith("aten::")
                                  and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")))}


def measure(data, local, device: torch.device, width: int, steps: int, rounds: int, capture: bool) -> dict:
    """ms and launches a lock-step, and ms of a round's setup, for one client and for ``width``
    clients, eager and (when the engine takes it) with ``capture='on'``."""
    out = {}
    for shape, w in (("one", 1), ("full", width)):
        for mode in ("eager", "captured") if capture else ("eager",):
            option = None if not capture else "off" if mode == "eager" else "on"
            bench = Bench(data, local, device, w, steps, option)
            out[shape, mode] = {**bench.ms(rounds), **bench.launches()}
    return out


# ----------------------------------------------------------------------------- the figures

def floor_s(figures: dict, one_ms: float, full_ms: float, width: int) -> float:
    """critical path x one one-client step + (total - critical path) x a full-width step's ms a client."""
    cp, total = figures["critical_path"], figures["total_steps"]
    return (cp * one_ms + (total - cp) * full_ms / width) / 1e3


def _ratio(a: float, b: float) -> float:
    """a / b; nan where b is not positive (a timing difference can be, on a busy machine)."""
    return a / b if b > 0 else float("nan")


def print_measured(measured: dict, device: torch.device, width: int, steps: int, batch: int, capture: bool) -> None:
    """The measured table: a row per step shape, ms and launches a lock-step per mode, side by side."""
    count = ("kernels", "launch_calls") if device.type == "cuda" else ("aten_calls",)
    modes = ("eager", "captured") if capture else ("eager",)
    print(f"\n== one lock-step of the MNIST CNN (B = {batch}), BatchedEngine on {device}: rounds of {steps} and "
          f"{max(1, steps // 4)} lock-steps timed, their difference per lock-step (a round's setup apart)")
    if not capture:
        print("   capture columns left out: this checkout's BatchedEngine has no capture option yet")
    elif device.type == "cpu":
        print("   captured on a CPU: capture='on' runs the same static-shape padded step eagerly (no graphs)")
    what = {"kernels": "kernels: CUDA kernels run a lock-step (memcpy/memset apart)",
            "launch_calls": "launches: launch calls a lock-step (a graph's replay is one)",
            "aten_calls": "aten calls: outermost aten operator calls a lock-step (on a GPU about one kernel each)"}
    print("   " + "; ".join(what[c] for c in count))
    short = {"kernels": "kernels", "launch_calls": "launches", "aten_calls": "aten calls"}
    columns = [f"{m} ms" for m in modes] + (["captured/eager"] if capture else [])
    columns += [f"{m} {short[c]}" for c in count for m in modes] + [f"{m} setup ms" for m in modes] + ["target ms"]
    print(f"   {'step':<26}" + "".join(f"{c:>{max(len(c) + 2, 10)}}" for c in columns))
    for shape, w in (("one", 1), ("full", width)):
        cells = [f"{measured[shape, m]['ms']:.3f}" for m in modes]
        if capture:
            cells.append(f"{_ratio(measured[shape, 'eager']['ms'], measured[shape, 'captured']['ms']):.2f}x")
        cells += [f"{measured[shape, m][c]:.1f}" for c in count for m in modes]
        cells += [f"{measured[shape, m]['setup_ms']:.1f}" for m in modes]
        cells.append(f"{TARGET_STEP_MS}" if w == 1 else "")
        name = "one client" if w == 1 else f"full width ({w} clients)"
        print(f"   {name:<26}" + "".join(f"{v:>{max(len(c) + 2, 10)}}" for c, v in zip(columns, cells)))
    best = modes[-1]
    one, full = measured["one", best]["ms"], measured["full", best]["ms"]
    print(f"   a client's step inside the full-width step ({best}): {full / width:.3f} ms, alone {one:.3f} ms "
          f"({_ratio(one, full / width):.1f}x); the full-width step costs {_ratio(full, one):.1f}x a one-client step")


def print_workload(name: str, experiment: str, figures: dict, measured: dict, chunk: int, width: int,
                   capture: bool) -> dict:
    """The workload's table; returns its floor estimates (seconds a round)."""
    f = figures
    print(f"\n== {name}: experiment={experiment} (K = {f['clients']}, E = {f['epochs']}, B = {f['batch_size']})")
    rows = [
        ("clients", f"{f['clients']:,}", ""),
        ("largest / smallest client", f"{f['largest']:,} / {f['smallest']:,}", "images"),
        ("total steps", f"{f['total_steps']:,}", "the sequential engine's steps a round"),
        ("mean steps", f"{f['mean_steps']:,.1f}", "a client's steps"),
        ("critical path", f"{f['critical_path']:,}", f"the longest client's steps: E x ceil({f['largest']:,} / B)"),
        ("lock-steps a round", f"{f['lock_steps']:,}", f"chunks of {chunk} clients one after another"),
        ("bucketed shapes (graphs)", f"{f['shapes']}", "distinct (clients padded to a power of two, batch) shapes"),
        ("occupancy", f"{f['occupancy']:.3f}", "real clients / padded rows of a lock-step"),
        ("critical path / mean", f"{_ratio(f['critical_path'], f['mean_steps']):.1f}x", "1x: balanced"),
    ]
    for label, value, note in rows:
        print(f"   {label:<28}{value:>14}   {note}")
    floors = {}
    for mode in ("eager", "captured") if capture else ("eager",):
        one, full = measured["one", mode]["ms"], measured["full", mode]["ms"]
        floors[mode] = floor_s(f, one, full, width)
        label = f"floor a round ({mode})"
        print(f"   {label:<28}{floors[mode]:>14.3f}   s: {f['critical_path']:,} x {one:.3f} ms "
              f"+ ({f['total_steps']:,} - {f['critical_path']:,}) x {full:.3f} / {width} ms; "
              f"100 rounds {100 * floors[mode]:.1f} s")
    if width == chunk:
        lock = measured["full", "captured" if capture else "eager"]["ms"]
        print(f"   {'lock-steps x full width':<28}{f['lock_steps'] * lock / 1e3:>14.3f}   s a round if every lock-step "
              f"cost a full-width one (no compaction)")
    return floors


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD", help=f"default: all of {', '.join(WORKLOADS)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    p.add_argument("--data", default=None, help="folder of MNIST's four IDX files (default: a synthetic stand-in)")
    p.add_argument("--width", type=int, default=None,
                   help="clients a lock-step trains at most, the engine's chunk (default: as "
                        "engine.clients_per_step=auto would for the MNIST CNN: all K on CUDA, the CPU chunk on a CPU)")
    p.add_argument("--tiny", action="store_true",
                   help="time rounds of 2 lock-steps, the full-width step at most 2 clients wide (the CPU test); "
                        "the workloads' figures are unchanged")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    bad = [w for w in args.workloads if w not in WORKLOADS]
    if bad:
        p.exit(2, f"bench_lockstep: unknown workload {bad[0]!r}; choose from {', '.join(WORKLOADS)}\n")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.exit(2, "bench_lockstep: --device cuda: this machine has no CUDA device (use --device cpu)\n")
    if args.width is not None and args.width < 1:
        p.exit(2, f"bench_lockstep: --width must be a positive number of clients, got {args.width}\n")
    if args.data is not None:
        data = Path(args.data)
        missing = [n for n in IDX_NAMES if not (data / n).is_file() and not (data / f"{n}.gz").is_file()]
        if missing:
            p.exit(2, f"bench_lockstep: --data {data} lacks {missing[0]}(.gz) (MNIST's four IDX files)\n")
    return args


def main(argv: list[str] | None = None) -> int:
    from fedrun.client.batched import CPU_CHUNK
    from fedrun.errors import FedrunError

    args = parse(argv)
    device = torch.device(args.device)
    names = args.workloads or list(WORKLOADS)
    data_dir = Path(args.data).resolve() if args.data else None
    try:  # the partitions first: data they cannot be built from is refused before anything is timed
        configs = {name: compose(WORKLOADS[name], data_dir) for name in names}
        cfg, objects = configs[names[0]]
        data, source = load_images(cfg, objects, data_dir, device)
        labels = data.train_y.cpu().numpy()
        k = objects["federation"].num_clients
        chunk = args.width or (k if device.type == "cuda" else CPU_CHUNK)
        figures = {name: profile_workload(configs[name][1], labels, chunk) for name in names}
    except FedrunError as e:
        print(f"bench_lockstep: {e}", file=sys.stderr)
        return 2
    capture = takes_capture()
    width = min(chunk, 2) if args.tiny else chunk  # the full-width step measured
    steps, rounds = SIZES["tiny" if args.tiny else device.type]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}, device {device}"
          + (f" ({name})" if device.type == "cuda" else f", {torch.get_num_threads()} threads")
          + f"; data: {source}; chunk {chunk} clients, full-width step measured {width} wide"
          + ("; --tiny" if args.tiny else ""))
    measured = measure(data, objects["local"], device, width, steps, rounds, capture)
    print_measured(measured, device, width, steps, objects["local"].batch_size, capture)
    report = {"device": str(device), "device_name": name,
              "data": "mnist" if data_dir else "synthetic", "chunk": chunk, "width": width, "steps": steps,
              "capture": capture, "measured": {f"{shape}_{mode}": v for (shape, mode), v in measured.items()},
              "workloads": {}}
    for name in names:
        floors = print_workload(name, WORKLOADS[name], figures[name], measured, chunk, width, capture)
        report["workloads"][name] = dict(figures[name], **{f"floor_{mode}_s": s for mode, s in floors.items()})
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
