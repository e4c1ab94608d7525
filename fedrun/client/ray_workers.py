"""The parallel engine's workers as Ray actors (``engine=parallel engine.backend=ray``): a run's
clients spread over the cores of a Ray cluster, one single-threaded actor per core.

Each actor is built once, at the run's start, from the run's engine: the model, the client
optimizer, the regularizer, and the training set and evaluation splits, which go into Ray's
object store once as NumPy arrays (an actor on the run's machine reads them without a copy; one on
another machine fetches them once).  A round then sends ``w_t`` and each actor's clients, as the
forked workers get them (:mod:`fedrun.client.parallel`), and the actors answer with their
clients' updates, computed by the same code with one thread: the same results, byte for byte, on
any cluster of the same CPUs and PyTorch build.

Ray is optional (``pip install 'fedrun[ray]'``, which also brings Hydra's Ray launcher).  With
``engine.address`` unset the engine joins the cluster ``RAY_ADDRESS`` names or, without one,
starts a Ray instance on this machine for the run and stops it at the end; a cluster the engine
joined is left running.
"""
from __future__ import annotations

import logging
import warnings

import torch

from fedrun.client.sequential import SequentialEngine
from fedrun.client.worker_tasks import WorkerError, do_task, note
from fedrun.errors import ConfigError

log = logging.getLogger(__name__)


def check_ray() -> None:
    """One line where Ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("engine.backend", "ray", "needs Ray: pip install 'fedrun[ray]' (or pip install ray), "
                          "or use engine.backend=processes") from None


def _tensor(array) -> torch.Tensor:
    """A tensor over an array from Ray's object store (read-only shared memory: no copy; the
    engine never writes its data)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


class _Actor:
    """One worker: the run's engine rebuilt on the actor's data, one thread."""

    def __init__(self, model, train_x, train_y, local, regularizer, seed, precision, shared):
        torch.set_num_threads(1)
        self.engine = SequentialEngine(model, _tensor(train_x), _tensor(train_y), local, regularizer, seed, precision)
        self.shared = {key: (_tensor(x), _tensor(y)) for key, (x, y) in shared.items()}

    def do(self, task):
        return do_task(None, task, self.engine, self.shared)


class RayPool:
    """``n`` actors (None: one per CPU of the cluster), each holding the run's engine."""

    def __init__(self, n: int | None, engine: SequentialEngine, shared: dict, address: str | None):
        import ray

        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.size = int(n or max(1, ray.cluster_resources().get("CPU", 1)))
        put = ray.put
        args = (put(engine.model), put(engine.x.numpy()), put(engine.y.numpy()), put(engine.local),
                put(engine.regularizer), engine.seed, engine.precision,
                put({key: (x.numpy(), y.numpy()) for key, (x, y) in shared.items()}))
        actor = ray.remote(num_cpus=1)(_Actor)
        self.actors = [actor.remote(*args) for _ in range(self.size)]
        log.debug("engine=parallel: %d Ray actors", self.size)

    def run(self, tasks: list[tuple], what: str) -> list:
        """Task i on actor i; their answers in that order.  An actor that dies is a
        :class:`WorkerError` naming it and its clients; a failure in one reaches the run as its
        own exception."""
        ray = self.ray
        refs = [actor.do.remote(task) for actor, task in zip(self.actors, tasks)]
        answers = []
        for i, ref in enumerate(refs):
            try:
                answers.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                clients = tasks[i][3] if tasks[i][0] == "train" else None
                self.close()
                doing = f"clients {clients} of {what}" if clients else what
                raise WorkerError(f"engine=parallel: Ray actor {i} died on {doing}; the run stops after its last "
                                  "complete round (resume=true continues it)") from None
            except ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, BaseException):
                    note(cause, f"in Ray actor {i} on {what}")
                    raise cause from None
                raise WorkerError(f"engine=parallel: Ray actor {i} failed on {what}: {e}") from None
        return answers

    def close(self) -> None:
        for actor in getattr(self, "actors", []):
            try:
                self.ray.kill(actor)
            except Exception:  # an actor already gone
                pass
        self.actors = []
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
            self.started = False
