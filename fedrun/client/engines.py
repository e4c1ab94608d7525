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

from fedrun.client.batched import BatchedEngine, check_clients_per_step
from fedrun.client.captured import check_capture
from fedrun.errors import ConfigError
from fedrun.client.parallel import ParallelEngine, check_backend, check_workers
from fedrun.client.precision import check_engine_options
from fedrun.client.sequential import SequentialEngine


def auto_engine(model, train_x, train_y, local, regularizer, seed,
                clients_per_step: int | str | None = "auto", precision: str = "fp32", compile: bool = False,
                capture: str = "auto"):
    """``engine=auto``: the batched engine on CUDA, the sequential one elsewhere.

    On a CPU the conv kernels, not the client loop, set the pace: the batched engine gains 6-7%
    on the MNIST CNN in chunks of ``CPU_CHUNK`` clients (scripts/bench/bench.py), too little, measured on
    too few models, to replace the reference engine as the default there.  The parallel engine
    (one single-threaded worker process per core) measured no faster than the sequential engine
    with a thread per core on a 2-core CPU (scripts/bench/bench_parallel.py: 1.02x on whole
    10-round runs, within the noise; docs/performance.md), so auto leaves it to be chosen
    (``engine=parallel``) where it measures faster, as on CPUs with more cores than a small
    model's kernels keep busy.
    """
    if train_x.device.type == "cuda":
        return BatchedEngine(model, train_x, train_y, local, regularizer, seed, clients_per_step, precision, compile,
                             capture)
    return SequentialEngine(model, train_x, train_y, local, regularizer, seed, precision, compile)


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
    if "capture" in options:
        check_capture(options["capture"])
    if "workers" in options:
        check_workers(options["workers"])
    if make_engine.func is ParallelEngine:
        check_backend(options.get("backend", "processes"), options.get("address"))


def as_batched(make_engine):
    """The batched engine a population trains its runs with: ``engine=batched`` as it is,
    ``engine=auto`` as the batched engine with the same options (whatever auto would pick on this
    device); None for the sequential engine, which trains one client at a time."""
    if make_engine.func is BatchedEngine:
        return make_engine
    if make_engine.func is auto_engine:
        return functools.partial(BatchedEngine, **make_engine.keywords)
    return None
