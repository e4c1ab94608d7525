"""Benchmark fedrun's client engines on named workloads, side by side in one process.

For each workload it trains the same round (same clients, same batches) with the sequential and
the batched engine and prints, per engine: samples/s (local training), seconds per round
(training + aggregation + evaluation), the projected time of the workload's full run, peak
memory, the batched/sequential speed ratio, and the fraction of the FLOP floor reached
(model FLOPs per sample x samples / device peak; the peak assumed is printed and can be set with
``--peak-tflops``).  Data is synthetic, of the workload's shape: speed does not depend on pixels.

``--precision tf32|bf16`` and/or ``--compile`` run every engine twice, in FP32 and in the chosen
mode, one after the other in the same process, and print the speed ratio (mode / FP32) and the
relative difference of the first round's updates (same start, same batches), the accuracy check
a mode needs before it is recommended.  The first (warm-up) round is not timed; with
``--compile`` it includes the compilation, whose time is printed.

``--clients N`` trains only the first N of the workload's K clients each round (same samples per
client, same batches): samples/s is measured on them and the round and full-run times are
projected to K clients (marked "projected"). That makes the CIFAR-10 workload measurable on a
CPU, where a full round takes about 10 minutes per engine.

``--clients-per-step auto,10,all`` runs the batched engine once per chunk size (clients trained
at once) and prints the chunk each run used ("auto" is fedrun's default: all that fit in free
GPU memory, 5 on a CPU).

``--profile`` runs one more round per engine under ``torch.profiler`` and prints where the time
goes: the share of local training spent in convolutions, linear layers, the optimizer step,
batch gathering, and everything else (Python, autograd bookkeeping, small kernels), then the
top operators by self time (``--profile-rows``). On CUDA it reports device time and the fraction
of the wall time the GPU was busy.

Workloads:

``small``            MNIST CNN, 20 clients x 100 samples, E = 1, B = 50: under a minute on 2 CPU cores
``fednnnn_mnist``    FedNNNN's MNIST run: K = 100, C = 1, B = 50, E = 5, 600 samples per client, 100 rounds
``fednnnn_cifar10``  FedNNNN's CIFAR-10 run: K = 100, C = 1, B = 50, E = 5, 500 per client, 250 rounds
``niidbench_mnist``  NIID-Bench's MNIST setting: the simple CNN (44,426 parameters), K = 10, C = 1, B = 64,
                     E = 10, 6,000 per client, SGD lr 0.01 with momentum 0.9 and weight decay 1e-5, 50
                     rounds (equal clients: the lock-step is every client's 940 steps)

``population`` (``python scripts/bench/bench.py population --help``): R runs trained as one population
against the same runs one by one (:mod:`bench_population`).

Usage::

    python scripts/bench/bench.py small
    python scripts/bench/bench.py small --precision bf16
    python scripts/bench/bench.py fednnnn_mnist --device cuda --rounds 2 --precision tf32 --compile
    python scripts/bench/bench.py fednnnn_cifar10 --clients 10 --profile
"""
from __future__ import annotations

import argparse
import functools
import resource
import sys
import time
from dataclasses import dataclass

import torch

from fedrun.aggregators import fedavg
from fedrun.client.batched import BatchedEngine
from fedrun.data.preparation import prepare
from fedrun.data.datasets import synthetic
from fedrun.diagnostics.evaluation import evaluate
from fedrun.models.layers import layers
from fedrun.client.local_training import LocalTraining
from fedrun.models.nets import Cifar10CNN, MnistCNN, SimpleCNN
from fedrun.params import split_state
from fedrun.client.precision import PRECISIONS
from fedrun.client.sequential import SequentialEngine


@dataclass(frozen=True)
class Workload:
    model: type
    channels: int
    side: int
    clients: int
    per_client: int
    epochs: int
    batch: int
    full_rounds: int
    test: int = 10_000
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0


WORKLOADS = {
    "small": Workload(MnistCNN, 1, 28, 20, 100, 1, 50, 100, test=1000),
    "fednnnn_mnist": Workload(MnistCNN, 1, 28, 100, 600, 5, 50, 100),
    "fednnnn_cifar10": Workload(Cifar10CNN, 3, 32, 100, 500, 5, 50, 250),
    "niidbench_mnist": Workload(SimpleCNN, 1, 28, 10, 6000, 10, 64, 50, lr=0.01, momentum=0.9, weight_decay=1e-5),
}
# Assumed dense FP32 peaks (TFLOP/s): H100 SXM 67 (no tensor cores), H200 the same chip;
# a 2-core AVX2 CPU at ~2.5 GHz: 2 x 2.5e9 x 32 FLOP/cycle = 0.16.
PEAKS = {"cuda": 67.0, "cpu": 0.16}


def flops_per_sample(model: torch.nn.Module, shape: tuple, device) -> float:
    """Forward + backward FLOPs of one training sample, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(8, *shape, device=device)
    y = torch.zeros(8, dtype=torch.long, device=device)
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 8


def peak_memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run(name: str, w: Workload, device: torch.device, rounds: int, peak_tflops: float, engines: list[str],
        precision: str = "fp32", compile: bool = False, clients_per_step=("auto",), clients: int | None = None,
        profile_rows: int = 0):
    n = w.clients * w.per_client
    raw = synthetic(num_train=n, num_test=w.test, channels=w.channels, image_size=w.side)
    data = prepare(raw, [0.5] * w.channels, [0.5] * w.channels, device=device)
    idx = [torch.arange(k * w.per_client, (k + 1) * w.per_client, device=device) for k in range(w.clients)]
    torch.manual_seed(0)
    model = w.model(in_channels=w.channels, image_size=w.side).to(device)
    initial = split_state(model)
    per_sample = flops_per_sample(model, (w.channels, w.side, w.side), device)
    local = LocalTraining(epochs=w.epochs, batch_size=w.batch, lr=w.lr, momentum=w.momentum,
                          weight_decay=w.weight_decay)
    agg, lays = fedavg(), layers(model)
    trained = min(clients or w.clients, w.clients)
    clients = list(range(trained))
    scale = w.clients / trained  # > 1: time `trained` clients and project the round to all K
    samples = trained * w.per_client * w.epochs
    modes = [("fp32", False)] + ([(precision, compile)] if (precision, compile) != ("fp32", False) else [])
    print(f"\n== {name}: {w.model.__name__}, {w.clients} clients x {w.per_client} samples, E={w.epochs}, "
          f"B={w.batch}, lr={w.lr}, momentum={w.momentum}, device={device}")
    print(f"   {per_sample / 1e6:.2f} MFLOP per training sample (fwd+bwd); {samples * scale:,.0f} samples a round; "
          f"assumed peak {peak_tflops} TFLOP/s (FP32)")
    if scale > 1:
        print(f"   timing {trained} of the {w.clients} clients a round ({samples:,} samples); "
              "round and full-run times are projected to all clients")
    results, first_deltas = {}, {}
    # (name, factory): the batched engine as fedrun builds it (engine.clients_per_step, default
    # auto), once per chunk asked for.
    variants = []
    for engine_name in engines:
        if engine_name == "sequential":
            variants.append(("sequential", SequentialEngine))
            continue
        for chunk in clients_per_step:
            tag = "" if len(clients_per_step) == 1 else f"[{'all' if chunk is None else chunk}]"
            variants.append((f"batched{tag}", functools.partial(BatchedEngine, clients_per_step=chunk)))
    for engine_name, make in variants:
        for prec, comp in modes:
            label = _label(prec, comp)
            params, buffers = (dict(t) for t in initial)
            engine = make(model, data.train_x, data.train_y, local, None, 0, precision=prec, compile=comp)
            state = agg.init(params, len(idx), lays)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            train_s = round_s = warm_s = 0.0
            for t in range(rounds + 1):  # round 0 warms up (kernels, allocator, compilation), not timed
                _sync(device)
                t0 = time.perf_counter()
                res = engine.train(params, buffers, clients, [idx[k] for k in clients], t + 1, None, local.lr)
                _sync(device)
                t1 = time.perf_counter()
                out, state = agg.apply(state, params, res)
                evaluate(model, {**out.average, **out.buffers}, data.test_x, data.test_y,
                         256 if device.type == "cpu" else 4096)
                _sync(device)
                t2 = time.perf_counter()
                if t == 0:
                    warm_s = t1 - t0
                    first_deltas[engine_name, label] = res.deltas
                else:
                    train_s += t1 - t0
                    round_s += t2 - t0
                params, buffers = out.sent, out.buffers
            train_s, round_s = train_s / rounds, round_s / rounds
            results[engine_name, label] = train_s
            # Projection: local training scales with the clients; aggregation and evaluation are
            # counted once (they are a few percent of a round, and evaluation does not scale).
            round_s += (scale - 1) * train_s
            floor = per_sample * samples / (peak_tflops * 1e12)
            chunk = (f" | {engine.chunk_size(params, buffers, len(clients))} clients a step"
                     if isinstance(engine, BatchedEngine) else "")
            print(f"   {engine_name:>13} {label:>12}: {samples / train_s:10,.0f} samples/s | {round_s:8.2f} s/round"
                  f"{' (projected)' if scale > 1 else ''} | "
                  f"full run ({w.full_rounds} rounds) {_duration(round_s * w.full_rounds)} | "
                  f"peak mem {peak_memory_mb(device):,.0f} MiB | {100 * floor / train_s:.1f}% of FLOP floor "
                  f"({floor * scale:.2f} s/round)" + chunk + (f" | warm-up round {warm_s:.1f} s" if comp else ""))
            if profile_rows:
                profile(lambda: engine.train(params, buffers, clients, [idx[k] for k in clients], rounds + 2, None,
                                             local.lr), device,
                        profile_rows)
    for prec, comp in modes:
        label = _label(prec, comp)
        for engine_name, _ in variants:
            if engine_name != "sequential" and ("sequential", label) in results:
                print(f"   {engine_name}/sequential speed ({label}): "
                      f"{results['sequential', label] / results[engine_name, label]:.2f}x "
                      "(local training, same process, same clients and batches)")
    if len(modes) == 2:
        label = _label(precision, compile)
        for engine_name, _ in variants:
            diff = _relative_difference(first_deltas[engine_name, "fp32"], first_deltas[engine_name, label])
            speed = results[engine_name, "fp32"] / results[engine_name, label]
            print(f"   {engine_name} {label}/fp32 speed: {speed:.2f}x"
                  f" | first round's updates differ from fp32 by {100 * diff:.2f}% (relative norm)")


# Operator families for the profile, matched on aten operator names (first match wins).
OP_FAMILIES = [
    ("convolution (fwd + bwd)", ("conv",)),
    ("linear / matmul", ("addmm", "mm", "matmul", "linear", "bmm", "baddbmm")),
    ("pooling, activation, norm, loss", ("pool", "relu", "threshold", "softmax", "nll", "cross_entropy",
                                   "dropout", "batch_norm", "bernoulli")),
    ("batch gathering, copies", ("index", "gather", "copy", "cat", "stack", "clone", "contiguous",
                                 "permute", "select", "slice")),
    ("elementwise (optimizer, grads)", ("add", "mul", "sub", "div", "lerp", "sqrt", "addcmul", "addcdiv",
                                        "fill", "zero", "neg", "sum", "mean", "pow", "where", "masked")),
]


def profile(train_round, device: torch.device, rows: int) -> None:
    """Profile one round of local training and print where its time goes.

    Self times (time in an operator minus its children) add up without double counting; on a
    CPU, the wall time they leave over is Python, autograd and dispatcher overhead.  On CUDA the
    device self times are what the GPU spent in kernels, so their sum / wall = how busy it was.
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    t0 = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        train_round()
        _sync(device)
    wall_us = (time.perf_counter() - t0) * 1e6
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    on_device = device.type == "cuda"
    own = (lambda e: e.self_device_time_total) if on_device else (lambda e: e.self_cpu_time_total)
    totals = {family: 0.0 for family, _ in OP_FAMILIES}
    totals["other operators"] = 0.0
    for e in events:
        op = e.key[len("aten::"):].lower()
        family = next((f for f, keys in OP_FAMILIES if any(k in op for k in keys)), "other operators")
        totals[family] += own(e)
    busy = sum(totals.values())
    where = "GPU kernel time" if on_device else "CPU self time"
    print(f"      profile of one round (wall {wall_us / 1e6:.2f} s, under the profiler), {where} by family:")
    for family, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"        {family:<32} {us / 1e6:8.2f} s  {100 * us / wall_us:5.1f}% of wall")
    idle = "GPU idle (launch, Python, sync)" if on_device else "Python, autograd, dispatch"
    print(f"        {idle:<32} {(wall_us - busy) / 1e6:8.2f} s  {100 * (wall_us - busy) / wall_us:5.1f}% of wall")
    print(f"      top {rows} operators by {where}:")
    for e in sorted(events, key=lambda e: -own(e))[:rows]:
        print(f"        {e.key:<40} {own(e) / 1e6:8.3f} s  {e.count:8d} calls")


def _label(precision: str, compile: bool) -> str:
    return precision + ("+compile" if compile else "")


def _relative_difference(a: dict, b: dict) -> float:
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a) ** 0.5
    den = sum(float(a[k].double().pow(2).sum()) for k in a) ** 0.5
    return num / max(den, 1e-30)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def main():
    if sys.argv[1:2] == ["population"]:  # runs trained together vs one by one: bench_population.py
        from bench_population import main as population

        return population(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="+", choices=sorted(WORKLOADS))
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds per engine (after one warm-up)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak for the FLOP floor")
    parser.add_argument("--engines", default="sequential,batched", help="comma-separated")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="also run every engine in this precision and compare it with fp32")
    parser.add_argument("--compile", action="store_true",
                        help="also run every engine with torch.compile and compare it with fp32 eager")
    parser.add_argument("--clients-per-step", default="auto",
                        help="the batched engine's chunk: auto (fedrun's default), all, or a number; "
                             "comma-separated values run the batched engine once per value (e.g. auto,10,25,all)")
    parser.add_argument("--clients", type=int, default=None,
                        help="train only the first N of the K clients a round and project the round to K")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more round per engine and print where the time goes")
    parser.add_argument("--profile-rows", type=int, default=12, help="operators listed by --profile")
    args = parser.parse_args()
    if args.clients is not None and args.clients < 1:
        parser.error(f"--clients must be a positive number of clients, got {args.clients}")
    chunks = []
    for text in args.clients_per_step.split(","):
        if text in ("auto", "all"):
            chunks.append("auto" if text == "auto" else None)
        elif text.isdigit() and int(text) > 0:
            chunks.append(int(text))
        else:
            parser.error(f"--clients-per-step: {text!r} is not auto, all or a positive number")
    engines = args.engines.split(",")
    if any(e not in ("sequential", "batched") for e in engines):
        parser.error(f"--engines: {args.engines!r}; allowed: sequential, batched (comma-separated)")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (use --device cpu or auto)")
    peak = args.peak_tflops or PEAKS[device.type]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
    for name in args.workloads:
        run(name, WORKLOADS[name], device, args.rounds, peak, engines, args.precision, args.compile,
            chunks, args.clients, args.profile_rows if args.profile else 0)


if __name__ == "__main__":
    main()
