"""The engine protocol: what a run asks of the engine that trains its clients.

A run (:class:`fedrun.harness.federated_run.FederatedRun`) builds its engine once, with
``make_engine(model, train_x, train_y, local, regularizer, seed)``, and then uses only what
:class:`Engine` lists:

* :meth:`~Engine.train` every round: the sampled clients from ``w_t`` at the round's learning
  rate (required: the schedule is the run's), their
  :class:`~fedrun.client.local_training.ClientResults` back (the one method that does the work);
* :meth:`~Engine.fit` once, before the start: the engine's fit to the round's size (the parallel
  engine caps its workers at what can run at once), returning a line for the run's log or None;
* :meth:`~Engine.share` the evaluation splits (test, validation) before the start, and
  :attr:`~Engine.evaluate`: an evaluation the engine runs itself (the parallel engine, in its
  workers), or None where the run evaluates in its own process;
* :meth:`~Engine.start` before the run locks its directory (workers are forked then, so none holds
  the lock), :meth:`~Engine.close` when the run ends (again is harmless);
* :attr:`~Engine.summary`: what the run's log says of its engine.

An engine that trains in the run's own process (the sequential and batched engines, or one of
your own) inherits :class:`InProcessEngine`, which has nothing to fit, share, start or close.
"""
from __future__ import annotations

import numbers
from typing import Callable, Optional, Protocol, runtime_checkable

import torch

from fedrun.client.local_training import ClientResults
from fedrun.params import Params


@runtime_checkable
class Engine(Protocol):
    """What a run calls on its engine (see the module)."""

    evaluate: Optional[Callable]

    def train(self, params: Params, buffers: Params, clients: list[int], indices: list[torch.Tensor],
              round_: int, epochs: list[int] | None, lr: float,
              opt_states: Params | None = None, inputs: Params | None = None,
              own: Params | None = None) -> ClientResults:
        """Train ``clients`` from ``w_t = params`` (the arguments:
        :meth:`fedrun.client.sequential.SequentialEngine.train`).  ``lr``, this round's learning
        rate, is required: the schedule is the run's, and an engine never falls back to
        ``local.lr`` (:func:`check_lr`).  ``epochs`` must be given too (it comes before ``lr``):
        each client's epochs, or None for E each."""
        ...

    def fit(self, per_round: int) -> str | None: ...

    def share(self, x: torch.Tensor, y: torch.Tensor) -> None: ...

    def start(self) -> None: ...

    def close(self) -> None: ...

    @property
    def summary(self) -> str: ...


def check_lr(lr) -> float:
    """``lr`` as an engine takes it: a number, this round's learning rate.  None (or anything else)
    is a ``TypeError``: an engine trains at the rate the run hands it, never at ``local.lr`` by
    default (after a schedule's drop the two differ)."""
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise TypeError(f"engine.train: lr must be this round's learning rate, a number (got {lr!r})")
    return float(lr)


class InProcessEngine:
    """The lifecycle of an engine that trains in the run's own process: nothing to fit, share,
    start or close, and the run evaluates its models itself (``evaluate = None``)."""

    evaluate: Optional[Callable] = None

    def fit(self, per_round: int) -> str | None:
        return None

    def share(self, x: torch.Tensor, y: torch.Tensor) -> None:
        return None

    def start(self) -> None:
        return None

    def close(self) -> None:
        return None

    @property
    def summary(self) -> str:
        return type(self).__name__
