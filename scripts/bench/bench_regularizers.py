"""What a regularizer's penalty costs a local step: its gradient written out
(``Regularizer.closed_form``, the engines' default) against autograd's gradient of the penalty,
side by side, with FedAvg (no penalty) as the floor.

One round of NIID-Bench's MNIST setting on random images (speed does not depend on them):
NIID-Bench's simple CNN (44,426 parameters), ``--clients`` clients of ``--images`` images each,
B = 64, E = ``--epochs``, SGD lr 0.01 with momentum 0.9 and weight decay 1e-5, every client in one
chunk of the batched engine (or the sequential engine, ``--engine``).  For each of FedProx
(mu = 0.01), SCAFFOLD (its correction through the gradient; random ``c - c_k``) and FedLap
(q = 0.5, interpolate) the two ways run ``--repeat`` times, interleaved with FedAvg's round; the
figures are the medians.  Both ways must give the same updates to the last bit on a CPU (the
script checks it and says so; on a GPU kernels may sum in another order, so it reports the
largest difference instead).

Usage (from the repository root)::

    python scripts/bench/bench_regularizers.py                      # CPU, 10 clients x 640 images
    python scripts/bench/bench_regularizers.py --device cuda --images 6000
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedrun.client.batched import BatchedEngine  # noqa: E402
from fedrun.client.local_training import LocalTraining  # noqa: E402
from fedrun.client.regularizers import ControlVariate, LayerAdaptive, Proximal  # noqa: E402
from fedrun.client.sequential import SequentialEngine  # noqa: E402
from fedrun.models.nets import SimpleCNN  # noqa: E402
from fedrun.params import split_state  # noqa: E402


def autograd_only(reg):
    """``reg`` with its closed form switched off: the engines then differentiate its penalty."""
    plain = copy.copy(reg)
    plain.closed_form = lambda *args: None
    return plain


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--engine", default="batched", choices=("batched", "sequential"))
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--images", type=int, default=640, help="images a client (default 640: 10 steps an epoch)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    for name in ("clients", "images", "epochs", "repeat", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = SimpleCNN().to(device)
    n = args.clients * args.images
    x, y = torch.randn(n, 1, 28, 28, device=device), torch.randint(0, 10, (n,), device=device)
    idx = [torch.arange(k * args.images, (k + 1) * args.images, device=device) for k in range(args.clients)]
    local = LocalTraining(epochs=args.epochs, batch_size=64, lr=0.01, momentum=0.9, weight_decay=1e-5)
    params, buffers = split_state(model)
    params = {k: v.detach().clone() for k, v in params.items()}
    correction = {k: 0.01 * torch.randn(args.clients, *v.shape, device=device) for k, v in params.items()}

    def round_seconds(reg, inputs=None):
        """One round's training seconds and its updates."""
        engine = (BatchedEngine(copy.deepcopy(model), x, y, local, reg, 0, clients_per_step=None)
                  if args.engine == "batched" else SequentialEngine(copy.deepcopy(model), x, y, local, reg, 0))
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = engine.train(params, buffers, list(range(args.clients)), idx, 1, None, local.lr, inputs=inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t, out.deltas

    regs = {"FedProx (mu 0.01)": (Proximal(0.01), None), "SCAFFOLD (gradient)": (ControlVariate("gradient"), correction),
            "FedLap (q 0.5)": (LayerAdaptive(0.5, form="interpolate"), None)}
    round_seconds(None)  # warm-up: allocator, kernels
    floor, rows = [], []
    times = {name: ([], []) for name in regs}
    differences = {}
    for _ in range(args.repeat):
        floor.append(round_seconds(None)[0])
        for name, (reg, inputs) in regs.items():
            closed, a = round_seconds(reg, inputs)
            auto, b = round_seconds(autograd_only(reg), inputs)
            times[name][0].append(closed)
            times[name][1].append(auto)
            differences[name] = max(float((a[k] - b[k]).abs().max()) for k in a)
    fedavg = statistics.median(floor)
    steps = args.epochs * -(-args.images // 64)
    print(f"{args.engine} engine on {device} ({args.threads} thread(s)), {args.clients} clients x {args.images} images, "
          f"E = {args.epochs}, B = 64 ({steps} steps a client), median of {args.repeat}; FedAvg: {fedavg:.3f} s a round")
    print(f"{'regularizer':22} {'closed form s':>14} {'autograd s':>11} {'autograd/closed':>16} "
          f"{'closed/FedAvg':>14} {'autograd/FedAvg':>16}  updates")
    for name, (closed, auto) in times.items():
        c, a = statistics.median(closed), statistics.median(auto)
        same = ("the same bits" if differences[name] == 0 else f"differ by up to {differences[name]:.1e}")
        rows.append(f"{name:22} {c:14.3f} {a:11.3f} {a / c:15.2f}x {c / fedavg:13.2f}x {a / fedavg:15.2f}x  {same}")
    print("\n".join(rows))
    exact = all(d == 0 for d in differences.values())
    if device.type == "cpu" and not exact:
        print("bench_regularizers: on a CPU both ways must give the same bits, and they do not", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
