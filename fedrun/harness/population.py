"""A population: many runs of one model architecture on one training set, trained together.

A paper table or a tuning study is dozens of runs of the same small model on the same data
(seeds, beta x gamma, mu, methods).  One at a time, each leaves most of a GPU idle, as one client
did before the batched engine.  The round loop (:func:`fedrun.harness.simulation.simulate_runs`) stacks
the runs the way the batched engine stacks clients: every round, the sampled clients of *all*
runs train in one lock-step call (:func:`train_together`, chunked by free memory as usual), and
on a GPU the runs' global models are evaluated in one vmapped pass (:func:`evaluate_runs`).  This
module holds those two steps and the check that runs can share them (:func:`check_population`).

Everything else is each run's own, exactly as when it runs alone
(:class:`fedrun.harness.federated_run.FederatedRun`): its seed (initialization, partition, client sampling,
batches, stragglers), aggregator and server state, weighting, client optimizer state,
learning-rate schedule, regularizer, rounds, run directory, CSVs and checkpoint.  Runs may differ
in any of these and in the client learning rate, momentum, weight decay, batch size, local
epochs, number of clients and fraction; each run's CSVs equal those of the run alone on the
batched engine to float rounding.

Two exceptions: dropout masks are drawn per chunk (:mod:`fedrun.client.batched`), so a model with
dropout agrees with its lone run in distribution, not bitwise; and the timing columns are the
population's (``train_s``: the population's training call plus the run's own reference learner;
``eval_s``, ``wall_s``: the whole population's).
"""
from __future__ import annotations

import torch

from fedrun.client.batched import BatchedEngine, Share, train_shares
from fedrun.errors import ConfigError
from fedrun.diagnostics.evaluation import eval_batch, evaluate_stacked, evaluation_plan, evaluation_row, split
from fedrun.harness.federated_run import FederatedRun

# Images x models per vmapped evaluation call, in units of the device's evaluation batch: the
# stacked forward holds this many images' activations at once.
EVAL_MODELS_FACTOR = 4
# Evaluate the runs' models in one vmapped pass: None on CUDA only (evaluate_runs says why).
STACKED_EVALUATION: bool | None = None


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


def train_together(runs: list[FederatedRun], records: list) -> list:
    """Step 2 for several runs: every run's clients in one lock-step call of the batched engine
    (:func:`fedrun.client.batched.train_shares`); each run's :class:`~fedrun.client.local_training.ClientResults`."""
    return train_shares([Share(run.engine, *run.training(r)) for run, r in zip(runs, records)])


def evaluate_runs(runs: list[FederatedRun], records: list) -> list[dict]:
    """Step 4 for runs of one model on one data set: their evaluation columns.

    On a GPU, every model of several runs to score on a split (test, validation) goes through one
    vmapped forward pass (:func:`fedrun.diagnostics.evaluation.evaluate_stacked`).  On a CPU, and for a run
    alone, each run scores its own: a vmapped convolution on a CPU is a grouped one, slower than
    the models one by one.
    """
    if not runs:
        return []
    device = torch.device(runs[0].device)
    stacked = device.type == "cuda" if STACKED_EVALUATION is None else STACKED_EVALUATION
    stacked = stacked and len(runs) > 1
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
