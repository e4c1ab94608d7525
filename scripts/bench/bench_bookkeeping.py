"""Round bookkeeping: what a round costs outside local training and evaluation.

Bookkeeping is everything the server does with a round's updates: aggregation, N and E, the
clients' angles, parameter divergence, the CSV rows and the checkpoint.  It is measured from the
run's own timing columns, ``wall_s - train_s - eval_s`` per round (the first round, which warms
caches and allocators, is left out), for each aggregator and number of clients a round, in one
process, with the share of the round it takes.  It also counts the host transfers of the
bookkeeping (``float()``, ``int()``, ``.item()``, ``.tolist()``, ``.cpu()``, ``bool()`` of a
tensor): on a GPU each one waits for the device.  Of the bookkeeping, the checkpoint's own time
(``Recorder.checkpoint``: ``torch.save`` and fsync) is a column: ``checkpoint_every`` saves it.

Data is synthetic of MNIST's shape (speed does not depend on pixels); every client holds
``--samples`` images and trains one epoch at B = 10 on the sequential engine (``--engine``).

``--paths after,before`` measures each configuration twice in the same process: ``after``, the
round's diagnostics streamed over the updates in O(m d) (:class:`fedrun.diagnostics.nwda.RoundSums`,
what a run does), and ``before``, the per-layer m x m Gram matrices of every round
(:func:`fedrun.diagnostics.nwda.layer_grams`, what every round computed before), side by side;
``--before-up-to`` skips ``before`` above that many clients a round (m^2 d multiply-adds a round).
``no_divergence`` is ``after`` with ``divergence_every=0``: no parameter divergence, so no second pass.

Usage::

    python scripts/bench/bench_bookkeeping.py                        # FedLap's MLP 784-200-10, K = 100, m = 10 and 100
    python scripts/bench/bench_bookkeeping.py --model mnist_cnn --device cuda --clients 100
    python scripts/bench/bench_bookkeeping.py --aggregators fedavg --clients 100,1000,5000 --num-clients 5000 \
        --rounds 3 --paths after,before --before-up-to 1000     # docs/performance.md, "Round bookkeeping"
"""
from __future__ import annotations

import argparse
import functools
import resource
import collections
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from fedrun import aggregators as A
from fedrun.harness import federated_run, simulation
from fedrun.client.batched import BatchedEngine
from fedrun.data.preparation import prepare
from fedrun.data.datasets import synthetic
from fedrun.client.engines import auto_engine
from fedrun.client.local_training import LocalTraining
from fedrun.client.participation import Participation
from fedrun.models.nets import MLP, LeafCNN, MnistCNN
from fedrun.data.partition import iid
from fedrun.harness.recorder import Recorder
from fedrun.diagnostics.nwda import layer_grams
from fedrun.client.sequential import SequentialEngine

# As conf/engine/*.yaml build them.
ENGINES = {"auto": auto_engine, "sequential": SequentialEngine,
           "batched": functools.partial(BatchedEngine, clients_per_step="auto")}
AGGREGATORS = {"fedavg": A.fedavg, "fednnnn": lambda: A.fednnnn(0.7, 0.8), "fedlayerwise": A.fedlayerwise,
               "fedlap": lambda: A.fedlap(0.5)}
# FedLap's MLP (159,010 parameters), FedNNNN's MNIST CNN (431,080) and LEAF's FEMNIST CNN (6.6 million at
# 62 classes; here 10, as the synthetic data's, 6,479,626): a round's stacked float32 updates are m x that.
MODELS = {"mlp": lambda: MLP(hidden=[200]), "mnist_cnn": MnistCNN, "leaf_cnn": lambda: LeafCNN(num_classes=10)}
TRANSFERS = ("__float__", "__int__", "item", "tolist", "cpu", "__bool__")


class TransferCounter:
    """Counts tensor-to-host transfers while ``active`` (local training and evaluation excluded)."""

    def __init__(self):
        self.count, self.active, self._saved = collections.Counter(), False, {}

    def __enter__(self):
        for name in TRANSFERS:
            original = self._saved[name] = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                if self.active:
                    self.count[_name] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)

    @contextlib.contextmanager
    def paused(self):
        was, self.active = self.active, False
        try:
            yield
        finally:
            self.active = was


def gram_path(deltas, layers, params=None, extra=None):
    """``before``: the round's per-layer m x m Gram matrices, which apply and round_divergence also take."""
    return layer_grams(deltas, layers, params, extra)


def measure(aggregator: str, clients: int, args, device, path: str = "after") -> dict:
    k = args.num_clients
    data = prepare(synthetic(num_train=k * args.samples, num_test=500, noise=0.5), None, None, device=device)
    counter = TransferCounter()
    make_engine = ENGINES[args.engine]

    def engine(*a, **kw):  # the engine's own transfers are training's, not bookkeeping's
        inner = make_engine(*a, **kw)
        train = inner.train

        def paused_train(*ta, **tkw):
            with counter.paused():
                return train(*ta, **tkw)
        inner.train = paused_train
        return inner

    evaluate, sample, checkpoint = federated_run.evaluate_round, Participation.sample, Recorder.checkpoint
    saving = []

    def timed_checkpoint(*a, **kw):
        start = time.perf_counter()
        checkpoint(*a, **kw)
        saving.append(time.perf_counter() - start)

    def paused_evaluate(*a, **kw):
        with counter.paused():
            return evaluate(*a, **kw)

    def start_counting(*a, **kw):  # the round begins: count from here
        counter.active = True
        return sample(*a, **kw)

    work = Path(tempfile.mkdtemp(prefix="fedrun-bookkeeping-"))  # removed once its rounds.csv is read
    run = work / "run"
    federated_run.evaluate_round, Participation.sample = paused_evaluate, start_counting
    sums = federated_run.RoundSums
    if path == "before":
        federated_run.RoundSums = gram_path
    Recorder.checkpoint = timed_checkpoint
    try:
        with counter:
            simulation.simulate(run, data, MODELS[args.model], iid, AGGREGATORS[aggregator](),
                                LocalTraining(batch_size=10), federated_run.Federation(
                                    rounds=args.rounds, num_clients=k, client_fraction=clients / k,
                                    vanilla_every=1 if args.vanilla else 0,
                                    divergence_every=0 if path == "no_divergence" else 1),
                                make_engine=engine, device=device, progress=False)
            counter.active = False
        rounds = pd.read_csv(run / "rounds.csv").iloc[1:]
    finally:
        federated_run.evaluate_round, Participation.sample = evaluate, sample
        federated_run.RoundSums = sums
        Recorder.checkpoint = checkpoint
        shutil.rmtree(work, ignore_errors=True)
    rest = (rounds.wall_s - rounds.train_s - rounds.eval_s) * 1e3
    size = sum(p.numel() for p in MODELS[args.model]().parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux: MiB, this process so far
    return {"aggregator": aggregator, "clients a round": clients, "path": path,
            "updates MiB": clients * size * 4 / 2**20, "peak MiB so far": peak,
            "train s": rounds.train_s.mean(), "eval s": rounds.eval_s.mean(),
            "bookkeeping s": rest.mean() / 1e3, "median s": rest.median() / 1e3,
            "of training": rest.mean() / (rounds.train_s.mean() * 1e3),
            "of it checkpoint s": sum(saving[1:]) / len(saving[1:]),
            "share of round": rest.sum() / (rounds.wall_s.sum() * 1e3),
            "transfers a round": sum(counter.count.values()) / args.rounds}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=list(MODELS), default="mlp")
    p.add_argument("--aggregators", default="fedavg,fednnnn,fedlayerwise")
    p.add_argument("--clients", default="10,100", help="clients a round, comma-separated (K = --num-clients)")
    p.add_argument("--num-clients", type=int, default=100)
    p.add_argument("--samples", type=int, default=60, help="images per client")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--vanilla", action="store_true", help="PD-VL's reference learner every round")
    p.add_argument("--engine", choices=["sequential", "batched"], default="sequential")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--paths", default="after", help="after (streamed sums, a run's), before (m x m Gram matrices), "
                   "no_divergence (streamed sums without PD-Ls/PD-VL: divergence_every=0), comma-separated")
    p.add_argument("--before-up-to", type=int, default=None, help="measure before only up to this many clients a round")
    args = p.parse_args(argv)
    unknown = [path for path in args.paths.split(",") if path not in ("after", "before", "no_divergence")]
    if unknown:
        p.error(f"--paths: {unknown[0]!r} is not after, before or no_divergence")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    for m in map(int, args.clients.split(",")):
        for a in args.aggregators.split(","):
            for path in args.paths.split(","):
                if path == "before" and args.before_up_to is not None and m > args.before_up_to:
                    continue
                rows.append(measure(a, m, args, device, path))
                print(pd.DataFrame(rows[-1:]).to_string(index=False, float_format=lambda v: f"{v:.3g}"), flush=True)
    table = pd.DataFrame(rows)
    print(f"{args.model}, K = {args.num_clients}, {args.samples} images a client, E = 1, B = 10, "
          f"{args.engine} engine on {device} ({torch.get_num_threads()} threads), rounds 2-{args.rounds}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
