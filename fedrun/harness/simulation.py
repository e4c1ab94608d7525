"""The federated round loop: sample, train locally, aggregate, evaluate, record.

:func:`simulate_runs` is the one round loop, for a run alone and for a population of runs
(:mod:`fedrun.harness.population`: many runs of one model on one training set, every round's clients of
all runs trained in one batched call); a run alone is a population of one.  The steps of a round,
each a method of :class:`fedrun.harness.federated_run.FederatedRun`:

1. sample the round's clients from ``(seed, round)``, and who drops out or straggles
   (:mod:`fedrun.seeding`, :mod:`fedrun.client.participation`);
2. train them locally, updates returned stacked ``[m, *shape]`` (an engine: :mod:`fedrun.client.sequential`,
   :mod:`fedrun.client.batched`), and the PD-VL reference learner on the rounds that have one;
3. aggregate (:mod:`fedrun.aggregators`), with N, E (:mod:`fedrun.diagnostics.nwda`) and the parameter
   divergence (:mod:`fedrun.diagnostics.divergence`) from one pass over the updates;
4. evaluate the global model (:mod:`fedrun.diagnostics.evaluation`);
5. record the round's rows, snapshot and checkpoint (:mod:`fedrun.harness.recorder`).

The loop alone keeps the time (the ``train_s``, ``eval_s`` and ``wall_s`` columns).
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from fedrun.server.aggregator import Aggregator
from fedrun.data.preparation import FederatedData
from fedrun.errors import FedrunError, Interrupted, Terminated
from fedrun.harness.federated_run import Federation, FederatedRun, sync
from fedrun.client.local_training import LocalTraining
from fedrun.logs import CONSOLE_ONLY, ROUND_LINE, bar_shown, bar_wanted
from fedrun.client.participation import Participation
from fedrun.harness.population import check_population, evaluate_runs, train_together
from fedrun.harness.round_record import RoundRecord
from fedrun.client.sequential import SequentialEngine

log = logging.getLogger(__name__)


def simulate(run_dir: str | Path, data: FederatedData, make_model: Callable[[], nn.Module],
             partition: Callable[..., list[np.ndarray]], aggregator: Aggregator,
             local: LocalTraining, federation: Federation,
             participation: Participation = Participation(), make_engine: Callable = SequentialEngine,
             seed: int = 0, device: str | torch.device = "cpu", resume: bool = False,
             targets: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.99), progress: bool = True,
             config: dict | None = None, dashboard=None) -> dict:
    """Run (or resume) one federated simulation into ``run_dir``; return its summary.

    ``data`` is normalized and on ``device``; ``make_model()`` builds the architecture (after
    seeding with ``seed``); ``partition(labels, num_clients, num_classes, seed)`` gives each
    client's indices; ``make_engine(model, train_x, train_y, local, regularizer, seed)`` the
    engine; ``config`` is written to ``config.yaml`` (on resume: compared with it); ``targets``
    are the accuracies whose first round the summary reports; ``dashboard`` mirrors the rows to
    TensorBoard or MLflow (:mod:`fedrun.harness.dashboards`).  Everything that can fail on the
    inputs is built before the run directory is created and locked (:mod:`fedrun.harness.rundir`).
    """
    return run_alone(FederatedRun(run_dir, data, make_model, partition, aggregator, local, federation,
                                  participation, make_engine, seed, device, resume, targets, config, dashboard),
                     progress)


def run_alone(run: FederatedRun, progress: bool = True) -> dict:
    """Run (or resume) one :class:`FederatedRun` on its own engine: its summary, or the one-line
    error that stopped it, raised."""
    outcome, = simulate_runs([run], progress)
    if isinstance(outcome, FedrunError):
        raise outcome
    return outcome


def simulate_runs(runs: list[FederatedRun], progress: bool = True) -> list[dict | FedrunError]:
    """Run (or resume) ``runs`` round by round; per run, its summary or the error that stopped it.

    One run trains on its own engine.  Several form a population (:mod:`fedrun.harness.population`): they
    must share the model architecture, the training set and the device, and train on batched
    engines with the same options; each round, all runs' clients train in one lock-step call and,
    on a GPU, the runs' models are evaluated in one vmapped pass.  A run that diverges (or whose
    disk fills) stops with its error, its CSVs holding the rounds before; the others go on.  Runs
    may be at different rounds (resumed from different checkpoints, or with fewer rounds): each
    trains its own next round.  Ctrl-C stops every run after its last complete round
    (:class:`fedrun.errors.Interrupted`); ``resume=true`` continues each from its checkpoint.
    """
    if len(runs) > 1:
        check_population(runs)
    outcomes: list[dict | FedrunError | None] = [None] * len(runs)
    with contextlib.ExitStack() as stack:
        for i, run in enumerate(runs):
            try:
                with run.guard():
                    stack.enter_context(run)  # locks the directory, or resumes it; closed on the way out
            except FedrunError as e:
                outcomes[i] = e
                continue
            if run.finished is not None:  # a run a previous process completed: nothing to do
                outcomes[i] = run.finished
                run.close()
        live = [i for i, outcome in enumerate(outcomes) if outcome is None]
        try:
            if live:
                _rounds(runs, live, outcomes, progress)
        except (KeyboardInterrupt, Interrupted) as e:  # Ctrl-C or SIGTERM: every run stops
            opened = [run for run in runs if run.dir is not None]
            terminated = isinstance(e, Terminated) or getattr(e, "terminated", False)
            raise Interrupted(min((run.saved_round() for run in opened), default=None),
                              min((run.done for run in opened), default=0), terminated) from None
    return outcomes


def _rounds(runs: list[FederatedRun], live: list[int], outcomes: list, progress: bool) -> None:
    """The rounds of the live runs, each taking its own next round, until every run is done or
    stopped: the five steps of a round, timed here (the loop alone reads the clock)."""
    population = len(runs) > 1
    live = _finish_resumed(runs, live, outcomes, population)
    if not live:
        return
    device = runs[live[0]].device
    start = min(runs[i].done for i in live)
    steps = max(runs[i].federation.rounds - runs[i].done for i in live)
    if population:
        log.info("population of %d runs: %d rounds at most, all runs' clients trained together", len(live), steps)
    for run in runs:
        run.population = population
    shown = bar_wanted(progress)  # else a line a round (fedrun.logs)
    desc = f"population ({len(live)} runs)" if population else runs[live[0]].aggregator.name
    with bar_shown(shown), tqdm(total=start + steps, initial=start, desc=desc, unit="round", disable=not shown,
                                dynamic_ncols=True) as bar:
        while live:
            t0 = time.perf_counter()
            records = _sample(runs, live)                                   # 1. sample
            training = _train_round(runs, live, records, device)            # 2. train
            live = _aggregate(runs, live, training, records, outcomes, population)  # 3. aggregate
            _evaluate(runs, live, records)                                  # 4. evaluate
            wall = sync(device) - t0
            live = _record(runs, live, records, outcomes, population, wall)  # 5. record
            _show(bar, runs, live, records, population, wall)
            live = _finish(runs, live, outcomes, population)  # after the round's line: the log in round order


def _finish_resumed(runs: list[FederatedRun], live: list[int], outcomes: list, population: bool) -> list[int]:
    """Runs resumed after their last round's checkpoint but before their summary (killed in
    between) write the summary and close; the runs that still have rounds to take."""
    for i in live:
        if runs[i].done >= runs[i].federation.rounds:
            _step(runs, i, outcomes, lambda run: run.summary(), population)
            runs[i].close()
    return [i for i in live if outcomes[i] is None]


def _sample(runs: list[FederatedRun], live: list[int]) -> dict[int, RoundRecord]:
    """Step 1: each live run's next round, its clients drawn from (seed, round)."""
    records = {}
    for i in live:
        with runs[i].dir.speaks():
            records[i] = runs[i].sample(runs[i].done + 1)
    return records


def _train_round(runs: list[FederatedRun], live: list[int], records: dict, device) -> list[int]:
    """Step 2: the clients of every run that has some, one run on its engine or several in one
    lock-step call; then each run's PD-VL reference learner on its rounds and a personalized
    method's own step (:meth:`FederatedRun.keep_own`).  The runs that trained."""
    t_train = time.perf_counter()
    training = [i for i in live if records[i].clients]
    for i, result in zip(training, _train([runs[i] for i in training], [records[i] for i in training])):
        records[i].results = result
    trained = sync(device) - t_train
    for i in training:
        t_reference = time.perf_counter()
        runs[i].train_reference(records[i])
        runs[i].keep_own(records[i])  # a personalized method's kept layers; Ditto's personal step is training
        records[i].seconds["train_s"] = trained + sync(device) - t_reference
    return training


def _aggregate(runs: list[FederatedRun], live: list[int], training: list[int], records: dict, outcomes: list,
               population: bool) -> list[int]:
    """Step 3: each run aggregates on its own; one that diverges stops, the others go on."""
    for i in training:
        _step(runs, i, outcomes, lambda run: run.aggregate(records[i]), population)
    return [i for i in live if outcomes[i] is None]


def _evaluate(runs: list[FederatedRun], live: list[int], records: dict) -> None:
    """Step 4: the runs whose round it is evaluated together (one vmapped pass on a GPU)."""
    t_eval = time.perf_counter()
    evaluating = [i for i in live if runs[i].evaluates(records[i].round)]
    rows = evaluate_runs([runs[i] for i in evaluating], [records[i] for i in evaluating])
    for i, row in zip(evaluating, rows):
        records[i].evaluation = row
    for i in live:  # each client's own test data (natural clients), on its own interval
        if runs[i].evaluates_clients(records[i].round):
            records[i].evaluation.update(runs[i].evaluate_clients(records[i]))
            if i not in evaluating:
                evaluating.append(i)
    evaluated = time.perf_counter() - t_eval  # the accuracies' .item()s synchronize
    for i in evaluating:
        records[i].seconds["eval_s"] = evaluated


def _record(runs: list[FederatedRun], live: list[int], records: dict, outcomes: list, population: bool,
            wall: float) -> list[int]:
    """Step 5: each run's CSV rows and checkpoint.  The runs still going (a run whose disk filled
    stops here)."""
    for i in live:
        records[i].seconds["wall_s"] = wall
        _step(runs, i, outcomes, lambda run: run.record(records[i]), population)
    return [i for i in live if outcomes[i] is None]


def _finish(runs: list[FederatedRun], live: list[int], outcomes: list, population: bool) -> list[int]:
    """After the round's line: each run that has done its rounds writes its summary (its "done"
    line) and closes.  The runs still going."""
    for i in live:
        if runs[i].done == runs[i].federation.rounds:
            _step(runs, i, outcomes, lambda run: run.summary(), population)
            runs[i].close()
    return [i for i in live if outcomes[i] is None]


def _show(bar, runs: list[FederatedRun], live: list[int], records: dict, population: bool, wall: float) -> None:
    """The progress bar's round (and, for a population, a line with the best accuracy so far)."""
    bar.update(1)
    if population:
        accuracies = [float(run.recorder.progress["acc"]) for run in runs if run.recorder is not None]
        best = max(accuracies, default=float("nan"))
        bar.set_postfix(runs=len(live), best_acc=f"{best:.4f}")
        log.info("population round %d: %d of %d runs, best test accuracy %.2f%%, %.2f s",
                 max(records[i].round for i in records), len(records), len(runs), 100 * best, wall,
                 extra={ROUND_LINE: True, CONSOLE_ONLY: True})
    else:
        bar.set_postfix(runs[0].recorder.progress)


def _train(runs: list[FederatedRun], records: list[RoundRecord]) -> list:
    """Step 2's client training: a run alone on its own engine (sequential or batched), several
    runs in one lock-step call (:func:`fedrun.harness.population.train_together`)."""
    if len(runs) == 1:
        return [runs[0].engine.train(*runs[0].training(records[0]))]
    return train_together(runs, records) if runs else []


def _step(runs: list[FederatedRun], i: int, outcomes: list, work, population: bool) -> None:
    """``work(run)`` for run i, its log records in its own ``fedrun.log``: a summary becomes the
    run's outcome; a one-line error (divergence, full disk) stops that run alone."""
    run = runs[i]
    try:
        with run.guard(), run.dir.speaks():  # a full disk as its one-line error
            out = work(run)
    except Interrupted:  # Ctrl-C stops every run
        raise
    except FedrunError as e:
        outcomes[i] = e
    else:
        if isinstance(out, dict):
            outcomes[i] = out
        return
    if population:  # a run alone: the command prints the error
        log.error("%s: %s", run.run_dir, outcomes[i])
    run.close()
