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

Usage::

    python scripts/bench/bench_bookkeeping.py                        # FedLap's MLP 784-200-10, K = 100, m = 10 and 100
    python scripts/bench/bench_bookkeeping.py --model mnist_cnn --device cuda --clients 100
"""
from __future__ import annotations

import argparse
import functools
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
from fedrun.models.nets import MLP, MnistCNN
from fedrun.data.partition import iid
from fedrun.harness.recorder import Recorder
from fedrun.client.sequential import SequentialEngine

# As conf/engine/*.yaml build them.
ENGINES = {"auto": auto_engine, "sequential": SequentialEngine,
           "batched": functools.partial(BatchedEngine, clients_per_step="auto")}
AGGREGATORS = {"fedavg": A.fedavg, "fednnnn": lambda: A.fednnnn(0.7, 0.8), "fedlayerwise": A.fedlayerwise,
               "fedlap": lambda: A.fedlap(0.5)}
MODELS = {"mlp": lambda: MLP(hidden=[200]), "mnist_cnn": MnistCNN}
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


def measure(aggregator: str, clients: int, args, device) -> dict:
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

    evaluate, sample, checkpoint = federated_run.evaluate_round, federated_run.sample_clients, Recorder.checkpoint
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
    federated_run.evaluate_round, federated_run.sample_clients = paused_evaluate, start_counting
    Recorder.checkpoint = timed_checkpoint
    try:
        with counter:
            simulation.simulate(run, data, MODELS[args.model], iid, AGGREGATORS[aggregator](),
                                LocalTraining(batch_size=10), federated_run.Federation(
                                    rounds=args.rounds, num_clients=k, client_fraction=clients / k,
                                    vanilla_every=1 if args.vanilla else 0),
                                make_engine=engine, device=device, progress=False)
            counter.active = False
        rounds = pd.read_csv(run / "rounds.csv").iloc[1:]
    finally:
        federated_run.evaluate_round, federated_run.sample_clients = evaluate, sample
        Recorder.checkpoint = checkpoint
        shutil.rmtree(work, ignore_errors=True)
    rest = (rounds.wall_s - rounds.train_s - rounds.eval_s) * 1e3
    return {"aggregator": aggregator, "clients a round": clients,
            "train ms": rounds.train_s.mean() * 1e3, "eval ms": rounds.eval_s.mean() * 1e3,
            "bookkeeping ms": rest.mean(), "median ms": rest.median(),
            "of it checkpoint ms": sum(saving[1:]) / len(saving[1:]) * 1e3,
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
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = [measure(a, int(m), args, device) for m in args.clients.split(",") for a in args.aggregators.split(",")]
    table = pd.DataFrame(rows)
    print(f"{args.model}, K = {args.num_clients}, {args.samples} images a client, E = 1, B = 10, "
          f"{args.engine} engine on {device} ({torch.get_num_threads()} threads), rounds 2-{args.rounds}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
