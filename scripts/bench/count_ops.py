"""Operators a lock-step of the batched engine dispatches, counted on any device.

On a GPU every operator that computes (not a view) launches at least one kernel, and a kernel
takes a few microseconds however little it does.  A small model's lock-step is then bound by how
many kernels it launches, not by its arithmetic: NIID-Bench's 44,426-parameter CNN kept an H200
busy (95-99% utilization) at about 1.4 ms a lock-step for 10 clients (docs/performance.md).  This
counts them without a GPU: one run of ``fedrun <overrides>`` with every operator of the batched
engine's training (``fedrun.client.batched._train_chunk``) counted, and prints the operators a
lock-step, views apart, with the most frequent ones.

    python scripts/bench/count_ops.py experiment=niidbench/mnist_c2 aggregator=scaffold \\
        'dataset.load.search=[../shared/data/mnist]' dataset.load.download=false \\
        hyperparams.rounds=1 hyperparams.local_epochs=1 engine.clients_per_step=null

A lock-step here is one step of the chunk's loop (every client's s-th optimizer step); with
``engine.clients_per_step=null`` the round is one chunk, as on a GPU with room for all clients.
"""
from __future__ import annotations

import collections
import sys
import tempfile

from torch.utils._python_dispatch import TorchDispatchMode

import fedrun.client.batched as batched
from fedrun.client.lock_step import sample_order
from fedrun.client.round_plan import RoundPlan


class _Count(TorchDispatchMode):
    """Counts every aten operator dispatched inside it, split into views and the rest."""

    def __init__(self, counts: collections.Counter, views: collections.Counter):
        super().__init__()
        self.counts, self.views = counts, views

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        (self.views if func.is_view else self.counts)[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def main(argv: list[str]) -> int:
    counts, views, steps = collections.Counter(), collections.Counter(), []
    train_chunk = batched._train_chunk

    def counted(shares):
        steps.append(RoundPlan(sample_order(shares)[1]).critical_path)
        with _Count(counts, views):
            return train_chunk(shares)

    batched._train_chunk = counted
    from fedrun.command.cli import main as fedrun_main

    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = ["fedrun", *argv, "engine=batched", "progress=false", f"hydra.run.dir={tmp}/run"]
        try:
            fedrun_main()
        except SystemExit as e:
            if e.code:
                return int(e.code)
    n = sum(steps)
    if not n:
        print("count_ops: the batched engine trained no lock-step", file=sys.stderr)
        return 1
    print(f"{n} lock-steps in {len(steps)} chunk(s); per lock-step: {sum(counts.values()) / n:.1f} operators "
          f"that compute (about one GPU kernel each), {sum(views.values()) / n:.1f} views")
    for name, c in counts.most_common(15):
        print(f"  {name:<32} {c / n:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
