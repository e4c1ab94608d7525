"""A population: many runs of one model architecture on one training set, trained together.

A paper table or a tuning study is dozens of runs of the same small model on the same data
(seeds, beta x gamma, mu, methods).  One at a time, each leaves most of a GPU idle, as one client
did before the batched engine.  :func:`simulate_population` stacks the runs the way the batched
engine stacks clients: every round, the sampled clients of *all* runs train in one lock-step
call (:func:`fedrun.batched.train_shares`, chunked by free memory as usual), and on a GPU the
runs' global models are evaluated in one vmapped pass (:func:`fedrun.evaluation.evaluate_stacked`).

Everything else is each run's own, exactly as when it runs alone (:class:`FederatedRun`): its
seed (initialization, partition, client sampling, batches, stragglers), aggregator and server
state, weighting, client optimizer state, learning-rate schedule, regularizer, rounds, run
directory, CSVs and checkpoint.  Runs may differ in any of these and in the client learning
rate, momentum, weight decay, batch size, local epochs, number of clients and fraction; each
run's CSVs equal those of the run alone on the batched engine to float rounding.

Two exceptions: dropout masks are drawn per chunk (:mod:`fedrun.batched`), so a model with
dropout agrees with its lone run in distribution, not bitwise; and the timing columns are the
population's (``train_s``: the population's training call plus the run's own reference learner;
``eval_s``, ``wall_s``: the whole population's).

A run that diverges (or whose disk fills) stops with its error, its CSVs holding the rounds
before; the others go on.  Runs may be at different rounds (a resumed population whose runs
were checkpointed at different rounds, runs with fewer rounds): each trains its own next round.
"""
from __future__ import annotations

import logging
import time

import torch
from tqdm import tqdm

from fedrun.batched import BatchedEngine, Share, train_shares
from fedrun.errors import ConfigError, FedrunError, Interrupted
from fedrun.evaluation import eval_batch, evaluate_stacked, evaluation_plan, evaluation_row, split
from fedrun.simulation import FederatedRun, sync

log = logging.getLogger(__name__)

# Images x models per vmapped evaluation call, in units of the device's evaluation batch: the
# stacked forward holds this many images' activations at once.
EVAL_MODELS_FACTOR = 4
# Evaluate the runs' models in one vmapped pass: None on CUDA only (evaluate_runs says why).
STACKED_EVALUATION: bool | None = None


def simulate_population(runs: list[FederatedRun], progress: bool = True) -> list[dict | FedrunError]:
    """Run (or resume) every run of ``runs`` together; per run, its summary or the error that
    stopped it, in order.

    The runs must share the model architecture, the training set (the same
    :class:`fedrun.data.FederatedData`) and the device, and train on batched engines with the same
    options; :func:`fedrun.cli` groups a sweep's jobs so.  Ctrl-C stops every run after its last
    complete round (:class:`fedrun.errors.Interrupted`); ``resume=true`` continues each from its
    own checkpoint.
    """
    check_population(runs)
    outcomes: list[dict | FedrunError | None] = [None] * len(runs)
    live: list[int] = []
    try:
        for i, run in enumerate(runs):
            try:
                run.__enter__()
            except FedrunError as e:
                outcomes[i] = e
                continue
            if run.finished is not None:
                outcomes[i] = run.finished
                run.__exit__(None, None, None)
            else:
                live.append(i)
        if live:
            _rounds(runs, live, outcomes, progress)
    except (KeyboardInterrupt, Interrupted):
        raise Interrupted(min((runs[i].saved_round() for i in live), default=None)) from None
    finally:
        for i in live:
            runs[i].__exit__(None, None, None)
    return outcomes


def check_population(runs: list[FederatedRun]) -> None:
    """The runs can share one training call: batched engines, one training set, one device."""
    lead = runs[0]
    for run in runs:
        if not isinstance(run.engine, BatchedEngine):
            raise ConfigError("engine", type(run.engine).__name__, "a population trains on the batched engine "
                              "(engine=batched, or engine=auto)")
        if run.data is not lead.data or torch.device(run.device) != torch.device(lead.device):
            raise ConfigError("hydra/launcher", "population", "the runs of a population share one training set "
                              "and device")
        def signature(r: FederatedRun) -> tuple:
            shapes = tuple((k, tuple(v.shape)) for k, v in [*r.params.items(), *r.buffers.items()])
            return r.engine.precision, r.engine.compile, type(r.model), shapes

        if signature(run) != signature(lead):
            raise ConfigError("hydra/launcher", "population", "the runs of a population share the model "
                              "architecture and the engine's precision and compile settings")


def _rounds(runs: list[FederatedRun], live: list[int], outcomes: list, progress: bool) -> None:
    """The population's rounds: each live run's next round, all runs' clients in one call."""
    device = runs[live[0]].device
    start = min(runs[i].done for i in live)
    steps = max(runs[i].federation.rounds - runs[i].done for i in live)
    log.info("population of %d runs: %d rounds at most, all runs' clients trained together", len(live), steps)
    with tqdm(total=start + steps, initial=start, desc=f"population ({len(live)} runs)", unit="round",
              disable=not progress, dynamic_ncols=True) as bar:
        while live:
            t0 = time.perf_counter()
            records = {}
            for i in live:
                with runs[i].dir.speaks():
                    records[i] = runs[i].sample(runs[i].done + 1)
            # 2. Train: one lock-step call for every run's clients.
            t_train = time.perf_counter()
            training = [i for i in live if records[i].clients]
            if training:
                results = train_shares([Share(runs[i].engine, *runs[i].training(records[i])) for i in training])
                for i, result in zip(training, results):
                    records[i].results = result
            trained = sync(device) - t_train
            # 3. Aggregate, each run on its own (a run that diverges stops; the others go on).
            for i in training:
                _step(runs, i, outcomes, lambda run: run.aggregate(records[i], time.perf_counter() - trained))
            live = [i for i in live if outcomes[i] is None]
            # 4. Evaluate the runs whose round it is, together.
            t_eval = time.perf_counter()
            evaluating = [i for i in live if runs[i].evaluates(records[i].round)]
            for i, row in zip(evaluating, evaluate_runs([runs[i] for i in evaluating],
                                                        [records[i] for i in evaluating])):
                records[i].evaluation = row
            evaluated = time.perf_counter() - t_eval
            for i in evaluating:
                records[i].seconds["eval_s"] = evaluated
            # 5. Record; a run that has done its rounds writes its summary and closes.
            wall = sync(device) - t0
            for i in live:
                records[i].seconds["wall_s"] = wall
                _step(runs, i, outcomes, lambda run: run.record(records[i]))
                if outcomes[i] is None and runs[i].done == runs[i].federation.rounds:
                    _step(runs, i, outcomes, lambda run: run.summary())
                    runs[i].__exit__(None, None, None)
            live = [i for i in live if outcomes[i] is None]
            bar.update(1)
            accuracies = [float(runs[i].recorder.progress["acc"]) for i in range(len(runs))
                          if runs[i].recorder is not None]
            bar.set_postfix(runs=len(live), best_acc=f"{max(accuracies, default=float('nan')):.4f}")


def _step(runs: list[FederatedRun], i: int, outcomes: list, work) -> None:
    """``work(run)`` for run i, its log records in its own ``fedrun.log``: a summary becomes the
    run's outcome; a one-line error (divergence, full disk) stops the run alone."""
    run = runs[i]
    try:
        with run.guard(), run.dir.speaks():  # a full disk as its one-line error
            out = work(run)
    except Interrupted:  # Ctrl-C stops the whole population
        raise
    except FedrunError as e:
        outcomes[i] = e
    else:
        if isinstance(out, dict):
            outcomes[i] = out
        return
    log.error("%s: %s", run.run_dir, outcomes[i])
    run.__exit__(None, None, None)


def evaluate_runs(runs: list[FederatedRun], records: list) -> list[dict]:
    """Step 4 for several runs of one model on one data set: their evaluation columns.

    On a GPU, every model to score on a split (test, validation) goes through one vmapped forward
    pass (:func:`fedrun.evaluation.evaluate_stacked`).  On a CPU each run scores its own: a
    vmapped convolution there is a grouped one, slower than the models one by one.
    """
    if not runs:
        return []
    device = torch.device(runs[0].device)
    stacked = device.type == "cuda" if STACKED_EVALUATION is None else STACKED_EVALUATION
    if not stacked:
        return [run.evaluate(r) for run, r in zip(runs, records)]
    plans = [evaluation_plan(r.models, run.buffers, run.aggregator.evaluate, run.data) for run, r in zip(runs, records)]
    entries = [(n, j) for n, plan in enumerate(plans) for j in range(len(plan))]
    scores: dict[tuple[int, int], tuple[float, float]] = {}
    for name in ("test", "val"):  # the two splits; "<other>_test" entries score on test
        chosen = [(n, j) for n, j in entries if (plans[n][j][0] == "val") == (name == "val")]
        if not chosen:
            continue
        x, y = split(runs[0].data, plans[chosen[0][0]][chosen[0][1]][0])
        states = [plans[n][j][1] for n, j in chosen]
        scores.update(zip(chosen, evaluate_stacked(runs[0].model, states, x, y,
                                                   EVAL_MODELS_FACTOR * eval_batch(device))))
    return [evaluation_row(plan, [scores[n, j] for j in range(len(plan))], run.aggregator.evaluate)
            for n, (run, plan) in enumerate(zip(runs, plans))]
