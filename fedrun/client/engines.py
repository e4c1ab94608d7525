"""The ``engine`` config group: which engine trains the clients.

Each option names its engine class as ``_target_`` with ``_partial_: true``
(``conf/engine/sequential.yaml``: :class:`fedrun.client.sequential.SequentialEngine`,
``batched.yaml``: :class:`fedrun.client.batched.BatchedEngine`, ``parallel.yaml``:
:class:`fedrun.client.parallel.ParallelEngine`, ``auto.yaml``: :func:`auto_engine`), so
the CLI gets ``make_engine(model, train_x, train_y, local, regularizer, seed)`` from Hydra and
the simulation builds it once the model and data exist.
"""
from __future__ import annotations

import functools

import torch

from fedrun.client.batched import BatchedEngine, check_clients_per_step
from fedrun.errors import ConfigError
from fedrun.client.parallel import ParallelEngine, can_fork, check_workers, resolve_workers
from fedrun.client.precision import check_engine_options
from fedrun.client.sequential import SequentialEngine


def auto_engine(model, train_x, train_y, local, regularizer, seed,
                clients_per_step: int | str | None = "auto", precision: str = "fp32", compile: bool = False,
                workers: int | str = "auto"):
    """``engine=auto``: the batched engine on CUDA; on a CPU with two cores or more, the parallel
    engine; the sequential one elsewhere (:func:`choose`)."""
    options = dict(clients_per_step=clients_per_step, precision=precision, compile=compile, workers=workers)
    return choose(train_x.device, options)(model, train_x, train_y, local, regularizer, seed)


def choose(device: torch.device, options: dict, clients_a_round: int | None = None,
           reference_learner: bool = False) -> functools.partial:
    """What ``engine=auto`` stands for on ``device``, as the engine's partial with its options.

    CUDA: the batched engine.  A CPU: the conv kernels, not the client loop, set the pace there;
    the batched engine gains 6-7% on the MNIST CNN in chunks of ``CPU_CHUNK`` clients
    (scripts/bench/bench.py), too little to replace the reference engine, while single-threaded
    worker processes, one per core, train a round's clients faster than one process with a
    thread per core (scripts/bench/bench_parallel.py, docs/performance.md).  So auto picks the
    parallel engine where it has two cores and two threads or more (``threads=1``, or Hydra's
    joblib launcher sharing the cores among its jobs, keeps the sequential engine; the workers
    are at most the threads), ``compile`` is off, and a round trains two learners or more and
    no PD-VL reference learner (``vanilla_every``: one learner on all the data, which one thread
    would slow down more than the workers speed the clients up).  ``clients_a_round``: None when
    the caller does not know (the engine's own constructor).
    """
    options = dict(options)
    workers = options.pop("workers", "auto")
    if device.type == "cuda":
        return functools.partial(BatchedEngine, **options)
    options.pop("clients_per_step", None)
    check_workers(workers)
    n = min(resolve_workers(workers), torch.get_num_threads())
    one_learner = clients_a_round is not None and clients_a_round < 2
    if n >= 2 and not options.get("compile", False) and can_fork() and not one_learner and not reference_learner:
        return functools.partial(ParallelEngine, workers=n, **options)
    return functools.partial(SequentialEngine, **options)


def for_run(make_engine, device, clients_a_round: int, reference_learner: bool) -> functools.partial:
    """The engine a run builds: ``engine=auto`` resolved by :func:`choose` for the run's device,
    clients a round and reference learner; any other engine as it is."""
    if make_engine.func is auto_engine:
        return choose(torch.device(device), make_engine.keywords, clients_a_round, reference_learner)
    return make_engine


def check(make_engine) -> None:
    """Validate an engine's options when the config is built, before the run directory exists
    (Hydra's ``_partial_`` defers the constructor, which checks them again)."""
    if not isinstance(make_engine, functools.partial):
        raise ConfigError("engine", type(make_engine).__name__, "must be built with _partial_: true "
                          "(see conf/engine/*.yaml)")
    options = make_engine.keywords
    check_engine_options(options.get("precision", "fp32"), options.get("compile", False))
    if "clients_per_step" in options:
        check_clients_per_step(options["clients_per_step"])
    if "workers" in options:
        check_workers(options["workers"])


def as_batched(make_engine):
    """The batched engine a population trains its runs with: ``engine=batched`` as it is,
    ``engine=auto`` as the batched engine with the same options (whatever auto would pick on this
    device); None for the sequential engine, which trains one client at a time."""
    if make_engine.func is BatchedEngine:
        return make_engine
    if make_engine.func is auto_engine:
        return functools.partial(BatchedEngine, **make_engine.keywords)
    return None
