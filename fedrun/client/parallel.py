"""The parallel engine: a round's clients trained in N single-threaded worker processes on a CPU.

Clients are independent within a round (Nagura et al., Alg. 1: every sampled client trains from
the same ``w_t``), so they can train at the same time.  On a CPU the kernels of a small model
(the MNIST CNN, batches of 50) use a second intra-op thread at about half the efficiency of the
first; two processes with one thread each do the same work in less wall time
(``scripts/bench/bench_parallel.py``, docs/performance.md).

Each worker is a forked copy of the run's process made once, at the engine's first use: it holds
the model, the training and test sets (the fork shares their memory, copy-on-write, so the data is
never copied or sent), the client optimizer and the regularizer, and runs the reference
:class:`~fedrun.client.sequential.SequentialEngine` on the clients it is given with
``torch.set_num_threads(1)``.  A round sends ``w_t``, the buffers and each worker's clients
(their sample indices, epochs, optimizer states and regularizer inputs) once; the workers send
back their clients' updates, which the engine stacks in the round's client order.  A client's
update depends only on ``w_t`` and on seeds derived from ``(seed, round, client)``, so the result
is the sequential engine's with one thread, byte for byte, whatever worker trains whom.

Evaluation (:meth:`ParallelEngine.evaluate`) splits the test set's batches across the workers;
each returns its batches' summed loss and correct count, which the engine adds in batch order,
as :func:`fedrun.diagnostics.evaluation.evaluate` does: the same numbers again.

The server's own work (aggregation, diagnostics) runs in the run's process; ``fedrun`` gives it one
thread too (:func:`fedrun.command.build.federated_run`), so that a whole run equals
``engine=sequential threads=1`` (a sum over two threads rounds differently from one).

A worker that dies (killed, out of memory) is an error naming it, the client it was training and
the round, not a hang; a worker whose run's process dies exits on its own.  Ctrl-C and SIGTERM
stop the run's process as with any engine; it stops the workers.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import traceback
import weakref
from multiprocessing.connection import wait

import torch
from torch import nn

from fedrun.client.local_training import ClientResults, LocalTraining
from fedrun.client.precision import check_engine_options
from fedrun.client.protocol import check_lr
from fedrun.client.regularizers import Regularizer
from fedrun.client.sequential import SequentialEngine
from fedrun.client.worker_tasks import WorkerError, do_task, merge_results, note, rows_of, task_label
from fedrun.diagnostics.evaluation import batch_scores, total_scores
from fedrun.errors import ConfigError
from fedrun.params import Params

log = logging.getLogger(__name__)


BACKENDS = ("processes", "ray")


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: a SLURM or container limit), else
    the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether worker processes can be fork()ed here (Linux, macOS; not Windows)."""
    return "fork" in multiprocessing.get_all_start_methods()


def check_workers(workers) -> None:
    """``engine.workers``: a positive integer or ``auto`` (the cores this process may use)."""
    if workers == "auto" or (isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1):
        return
    raise ConfigError("engine.workers", workers, "a number of worker processes >= 1, or auto (one per core)")


def check_backend(backend: str, address: str | None = None) -> None:
    """``engine.backend`` is one of :data:`BACKENDS` (Ray installed for ``ray``); ``engine.address``
    only with Ray."""
    if backend not in BACKENDS:
        raise ConfigError("engine.backend", backend, f"choose one of: {', '.join(BACKENDS)}")
    if backend == "ray":
        from fedrun.client.ray_workers import check_ray

        check_ray()
    elif address is not None:
        raise ConfigError("engine.address", address, "is the Ray cluster to join: set engine.backend=ray, "
                          "or leave engine.address unset")


def resolve_workers(workers) -> int:
    check_workers(workers)
    return available_cores() if workers == "auto" else int(workers)


class ParallelEngine:
    """A round's clients trained in ``workers`` single-threaded processes (CPU only).

    Args: as :class:`~fedrun.client.sequential.SequentialEngine`, plus
      workers: the number of worker processes (``auto``: one per core this process may use; with
        Ray, one per CPU of the cluster).  With one worker, or a round of one client, the
        clients train in the run's process.
      backend: ``processes`` (forked on this machine) or ``ray`` (Ray actors, one CPU each, on
        the machines of a Ray cluster: :mod:`fedrun.client.ray_workers`).
      address: Ray only: the cluster to join (``auto``, ``ray://host:10001``); None: the one
        ``RAY_ADDRESS`` names, else a Ray instance started on this machine for the run.
    """

    def __init__(self, model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor, local: LocalTraining,
                 regularizer: Regularizer | None, seed: int, workers: int | str = "auto", precision: str = "fp32",
                 compile: bool = False, backend: str = "processes", address: str | None = None):
        check_engine_options(precision, compile)
        check_workers(workers)
        check_backend(backend, address)
        if train_x.device.type != "cpu":
            raise ConfigError("engine", "parallel", f"trains on a CPU, not on {train_x.device.type}: "
                              "use engine=batched (or auto) on a GPU")
        if compile:
            raise ConfigError("engine.compile", compile, "the parallel engine trains in eager mode (compiling in "
                              "every worker costs more than it saves on a CPU): set engine.compile=false")
        if backend == "processes" and not can_fork():
            raise ConfigError("engine", "parallel", "needs fork()ed worker processes (Linux, macOS): "
                              "use engine=sequential here")
        self.inner = SequentialEngine(model, train_x, train_y, local, regularizer, seed, precision, compile)
        self.model, self.local, self.seed, self.precision, self.compile = model, local, seed, precision, compile
        self.backend, self.address = backend, address
        # Ray: one actor per core of the cluster's by default, as Ray counts them once joined.
        self.workers = resolve_workers(workers) if backend == "processes" or workers != "auto" else None
        self._asked = workers  # as set: auto, or a number (fit says so when it lowers a number)
        self._shared: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pool: _Pool | None = None

    def fit(self, per_round: int) -> str | None:
        """Cap the workers, before they start, at what can run at once: the cores this process
        may use (forked processes; a Ray cluster counts its own) and the clients a round trains
        (a worker more would idle, each a copy of the run's process: engine.workers=1000 on 2
        cores forked 1,000 for a round of 2 clients).  The results are the same whatever the
        number.  Returns the one line that says so when a number the user set is lowered (the
        run logs it once, at its start), else None (``auto`` is fitted quietly)."""
        if self.workers is None or self._pool is not None:
            return None
        cores = available_cores() if self.backend == "processes" else None
        fitted = max(1, min(self.workers, per_round, cores or self.workers))
        if fitted == self.workers:
            return None
        asked, self.workers = self.workers, fitted
        if self._asked == "auto":
            return None
        why = [f"{cores} core(s) this process may use" if cores is not None and cores < asked else None,
               f"{per_round} client(s) a round" if per_round < asked else None]
        return (f"engine.workers={asked}: more than can run at once; {fitted} worker process(es) instead "
                f"({' and '.join(w for w in why if w)})")

    # ---------------------------------------------------------------- the data the workers hold

    def share(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Hand the workers an evaluation split (the test or validation set) before they start:
        :meth:`evaluate` on it then runs in the workers.  A split shared after they started is
        evaluated in the run's process (same result)."""
        if self._pool is None:
            self._shared[_key(x, y)] = (x, y)

    # ---------------------------------------------------------------- training

    def train(self, params: Params, buffers: Params, clients: list[int], indices: list[torch.Tensor],
              round_: int, epochs: list[int] | None, lr: float,
              opt_states: Params | None = None, inputs: Params | None = None,
              own: Params | None = None) -> ClientResults:
        """As :meth:`SequentialEngine.train`, the clients spread over the workers."""
        lr = check_lr(lr)  # here, not in a worker
        m = len(clients)
        epochs = [self.local.epochs] * m if epochs is None else list(epochs)
        if self.workers == 1 or m <= 1:
            return self.inner.train(params, buffers, clients, indices, round_, epochs, lr, opt_states, inputs, own)
        pool = self._start()
        # Longest work first onto the least loaded worker: the round ends when the last one does.
        cost = [len(indices[j]) * epochs[j] for j in range(m)]
        shares: list[list[int]] = [[] for _ in range(min(pool.size, m))]
        load = [0] * len(shares)
        for j in sorted(range(m), key=lambda j: -cost[j]):
            w = load.index(min(load))
            shares[w].append(j)
            load[w] += cost[j]
        tasks = []
        for rows in shares:
            rows.sort()
            tasks.append(("train", params, buffers, [clients[j] for j in rows], [indices[j] for j in rows], round_,
                          [epochs[j] for j in rows], lr, rows_of(opt_states, rows), rows_of(inputs, rows),
                          rows_of(own, rows)))
        parts = pool.run(tasks, what=f"round {round_}")
        return merge_results([(rows, part) for rows, part in zip(shares, parts)], list(clients))

    # ---------------------------------------------------------------- evaluation

    def evaluate(self, model: nn.Module, state: Params, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int = 2000) -> tuple[float, float]:
        """Accuracy and mean cross-entropy of ``state`` on ``(x, y)``, as
        :func:`fedrun.diagnostics.evaluation.evaluate`: batches of ``batch_size`` split into one
        contiguous range per worker, their scores added in batch order."""
        key = _key(x, y)
        starts = list(range(0, len(y), batch_size))
        if self.workers == 1 or key not in self._shared or len(starts) < 2:
            return total_scores(batch_scores(model, state, x, y, batch_size), len(y))
        pool = self._start()
        n = min(pool.size, len(starts))
        ranges = [starts[i * len(starts) // n: (i + 1) * len(starts) // n] for i in range(n)]
        parts = pool.run([("evaluate", state, key, r, batch_size) for r in ranges], what="the evaluation")
        return total_scores([s for part in parts for s in part], len(y))

    # ---------------------------------------------------------------- the workers' lives

    def start(self) -> None:
        """Fork the workers now (else at the first :meth:`train` or :meth:`evaluate`).  A run
        starts them before it locks its directory and opens its files, so that no worker holds
        the lock or a file of the run (a worker outliving a killed run would keep its directory
        locked until it noticed)."""
        self._start()

    def _start(self) -> "_Pool":
        if self._pool is None:
            if self.backend == "ray":
                from fedrun.client.ray_workers import RayPool

                self._pool = RayPool(self.workers, self.inner, self._shared, self.address)
                self.workers = self._pool.size
            else:
                self._pool = _Pool(self.workers, self.inner, self._shared)
            # The workers stop with the engine, or at the latest when the interpreter exits.
            self._finalizer = weakref.finalize(self, self._pool.close)
        return self._pool

    def close(self) -> None:
        """Stop the workers (the run calls it when it ends; a later call starts new ones)."""
        if self._pool is not None:
            self._finalizer()
            self._pool = None

    @property
    def summary(self) -> str:
        """What the run's log says of its engine."""
        if self.backend == "ray":
            return f"ParallelEngine, {self.workers or 'auto'} single-threaded Ray actors"
        return f"ParallelEngine, {self.workers} single-threaded worker processes"

    def __getstate__(self):
        raise TypeError("a ParallelEngine holds worker processes and cannot be pickled")


def _key(x: torch.Tensor, y: torch.Tensor) -> tuple:
    """What names a split between the run's process and its forked workers: the tensors' memory,
    which a fork keeps at the same addresses."""
    return (x.data_ptr(), tuple(x.shape), y.data_ptr(), tuple(y.shape))


class _Pool:
    """The worker processes and the pipes to them."""

    def __init__(self, n: int, engine: SequentialEngine, shared: dict):
        context = multiprocessing.get_context("fork")
        self.size = n
        self.processes, self.conns = [], []
        parent = os.getpid()
        for i in range(n):
            ours, theirs = context.Pipe()
            # A worker closes the run's ends of every pipe it inherited, so that each worker sees
            # its own pipe end when the run's process goes.
            process = context.Process(target=_serve, name=f"fedrun-worker-{i}", daemon=True,
                                      args=(theirs, [ours, *self.conns], engine, shared, parent))
            process.start()
            theirs.close()
            self.processes.append(process)
            self.conns.append(ours)
        log.debug("engine=parallel: %d worker processes (pids %s), one thread each", n,
                  ", ".join(str(p.pid) for p in self.processes))

    def run(self, tasks: list[tuple], what: str) -> list:
        """Send task i to worker i and return their answers in that order; a worker that dies or
        fails is a :class:`WorkerError` naming it and what it was doing."""
        for conn, task in zip(self.conns, tasks):
            conn.send(task)
        answers: dict[int, object] = {}
        doing = {i: None for i in range(len(tasks))}  # the client each worker trains now
        waiting = {self.conns[i]: i for i in range(len(tasks))}
        sentinels = {self.processes[i].sentinel: i for i in range(len(tasks))}
        while waiting:
            for ready in wait([*waiting, *sentinels]):
                if ready in sentinels:
                    i = sentinels[ready]
                    if self.conns[i] in waiting and not self.conns[i].poll():
                        raise self._died(i, doing[i], what)
                    continue
                i = waiting[ready]
                try:
                    kind, *payload = ready.recv()
                except (EOFError, OSError):
                    raise self._died(i, doing[i], what) from None
                if kind == "client":
                    doing[i] = payload[0]
                elif kind == "error":
                    error, trace = payload
                    note(error, f"in parallel worker {i} (pid {self.processes[i].pid}) on {task_label(doing[i], what)}:\n"
                                 f"{trace}")
                    raise error
                else:
                    answers[i] = payload[0]
                    del waiting[ready]
                    sentinels.pop(self.processes[i].sentinel, None)
        return [answers[i] for i in range(len(tasks))]

    def _died(self, i: int, client, what: str) -> WorkerError:
        process = self.processes[i]
        process.join(timeout=1)
        code = process.exitcode
        how = (f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}")
        if code is not None and code == -signal.SIGKILL:
            how += " (out of memory? the kernel's OOM killer sends SIGKILL)"
        self.close()
        return WorkerError(f"engine=parallel: worker {i} (pid {process.pid}) {how} on {task_label(client, what)}; "
                           "the run stops after its last complete round (resume=true continues it)")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
            conn.close()
        for process in self.processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join()
        self.conns, self.processes = [], []


# ------------------------------------------------------------------------------- in the worker

def _serve(conn, inherited, engine: SequentialEngine, shared: dict, parent: int) -> None:
    """A worker's life: answer the run's tasks until it says stop or goes away."""
    for other in inherited:
        other.close()
    # Ctrl-C (and a SIGTERM sent to the whole process group, as SLURM does) is the run's to
    # handle: it stops after its last complete round and then stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(1)
    while True:
        # Poll, not block: a worker whose run's process was SIGKILLed (and whose pipe another
        # worker may still hold) notices that its parent is gone.
        try:
            if not conn.poll(1.0):
                if os.getppid() != parent:
                    return
                continue
            task = conn.recv()
            if task[0] == "stop":
                return
            _answer(conn, task, engine, shared)
        except (EOFError, OSError):  # the run closed the pipe (it stopped, Ctrl-C): nobody to answer
            return


def _answer(conn, task: tuple, engine: SequentialEngine, shared: dict) -> None:
    """Do one task and send the result, or the failure with its traceback.  A broken pipe
    (the run has gone) propagates: :func:`_serve` ends quietly."""
    try:
        result = do_task(conn, task, engine, shared)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        raise
    except Exception as error:  # every failure of the work goes back to the run
        trace = traceback.format_exc()
        try:
            conn.send(("error", error, trace))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise
        except Exception:  # an error that does not pickle: its text does
            conn.send(("error", WorkerError(f"{type(error).__name__}: {error}"), trace))
        return
    conn.send(("done", result))
