"""The federated round loop: sample, train locally, aggregate, evaluate, record.

:func:`simulate_runs` is the one round loop, for a run alone and for a population of runs
(:mod:`fedrun.population`: many runs of one model on one training set, every round's clients of
all runs trained in one batched call); a run alone is a population of one.  The steps of a round,
each a method of :class:`FederatedRun`:

1. sample the round's clients from ``(seed, round)``, and who drops out or straggles
   (:mod:`fedrun.seeding`, :mod:`fedrun.participation`);
2. train them locally, updates returned stacked ``[m, *shape]`` (an engine: :mod:`fedrun.sequential`,
   :mod:`fedrun.batched`), and the PD-VL reference learner on the rounds that have one;
3. aggregate (:mod:`fedrun.aggregators`), with N, E (:mod:`fedrun.nwda`) and the parameter
   divergence (:mod:`fedrun.divergence`) from one pass over the updates;
4. evaluate the global model (:mod:`fedrun.evaluation`);
5. record the round's rows, snapshot and checkpoint (:mod:`fedrun.recorder`).

The loop alone keeps the time (the ``train_s``, ``eval_s`` and ``wall_s`` columns).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fedrun.aggregators import Aggregator, check_finite
from fedrun.data import FederatedData
from fedrun.divergence import LearnerParams, round_divergence, train_vanilla
from fedrun.errors import ConfigError, FedrunError, Interrupted, NoSpaceError, check, first_line
from fedrun.evaluation import eval_batch, evaluate_round
from fedrun.layers import layers as model_layers
from fedrun.local_training import LocalTraining, OptimizerStates
from fedrun.nwda import layer_grams
from fedrun.params import split_state
from fedrun.participation import Participation
from fedrun.partition import class_counts, fingerprint
from fedrun.population import check_population, evaluate_runs, train_together
from fedrun.recorder import Recorder, RoundRecord
from fedrun.rundir import CHECKPOINT, RunDirectory, refuse_existing_run
from fedrun.seeding import clients_per_round, sample_clients
from fedrun.sequential import SequentialEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Federation:
    """Who trains when (Nagura et al. Table 1: total rounds, C, K)."""

    rounds: int = 10
    num_clients: int = 100  # K
    client_fraction: float = 0.1  # C; m = max(C K, 1) clients a round
    eval_every: int = 1

    vanilla_every: int = 0  # PD-VL's vanilla reference learner every n rounds (0: never)
    snapshots: tuple[int, ...] = ()  # rounds whose evaluated global model is saved to models/
    checkpoint_every: int = 1  # checkpoint.pt after rounds n, 2n, ... and the last


    def __post_init__(self):
        object.__setattr__(self, "snapshots", tuple(self.snapshots))  # a list from the config
        check(self.rounds >= 1, "hyperparams.rounds", self.rounds, "must be >= 1")
        check(self.vanilla_every >= 0, "vanilla_every", self.vanilla_every, "must be >= 0 (0: off)")
        check(all(1 <= r <= self.rounds for r in self.snapshots), "snapshots", list(self.snapshots),
              f"rounds between 1 and hyperparams.rounds ({self.rounds})")
        check(self.num_clients >= 1, "hyperparams.num_clients", self.num_clients, "must be >= 1")
        check(0 < self.client_fraction <= 1, "hyperparams.client_fraction", self.client_fraction,
              "must be in (0, 1]")
        check(self.eval_every >= 1, "hyperparams.eval_every", self.eval_every, "must be >= 1")
        check(self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every,
              "must be >= 1 (rounds between checkpoints; the last round is always saved)")

    @property
    def per_round(self) -> int:
        return clients_per_round(self.num_clients, self.client_fraction)

    def checkpoint_round(self, t: int) -> bool:
        """Whether checkpoint.pt is written after round t (a resume continues from the last one)."""
        return t % self.checkpoint_every == 0 or t == self.rounds

    def vanilla_round(self, t: int) -> bool:
        """Rounds 1, 1 + n, 1 + 2n, ... get the PD-VL reference (round 1 shows the early divergence)."""
        return self.vanilla_every > 0 and (t - 1) % self.vanilla_every == 0


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
    TensorBoard or MLflow (:mod:`fedrun.dashboards`).  Everything that can fail on the
    inputs is built before the run directory is created and locked (:mod:`fedrun.rundir`).
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

    One run trains on its own engine.  Several form a population (:mod:`fedrun.population`): they
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
        except (KeyboardInterrupt, Interrupted):
            opened = [run for run in runs if run.dir is not None]
            raise Interrupted(min((run.saved_round() for run in opened), default=None),
                              min((run.done for run in opened), default=0)) from None
    return outcomes


def _rounds(runs: list[FederatedRun], live: list[int], outcomes: list, progress: bool) -> None:
    """The rounds of the live runs, each taking its own next round, until every run is done or
    stopped: the five steps, timed here."""
    population = len(runs) > 1
    for i in live:  # resumed from its last round's checkpoint, with no summary yet (killed in between)
        if runs[i].done >= runs[i].federation.rounds:
            _step(runs, i, outcomes, lambda run: run.summary(), population)
            runs[i].close()
    live = [i for i in live if outcomes[i] is None]
    if not live:
        return
    device = runs[live[0]].device
    start = min(runs[i].done for i in live)
    steps = max(runs[i].federation.rounds - runs[i].done for i in live)
    if population:
        log.info("population of %d runs: %d rounds at most, all runs' clients trained together", len(live), steps)
    desc = f"population ({len(live)} runs)" if population else runs[live[0]].aggregator.name
    with tqdm(total=start + steps, initial=start, desc=desc, unit="round", disable=not progress,
              dynamic_ncols=True) as bar:
        while live:
            t0 = time.perf_counter()
            # 1. Sample each run's next round.
            records = {}
            for i in live:
                with runs[i].dir.speaks():
                    records[i] = runs[i].sample(runs[i].done + 1)
            # 2. Train: one run on its engine, several in one lock-step call; then each run's
            # PD-VL reference learner on its rounds.
            t_train = time.perf_counter()
            training = [i for i in live if records[i].clients]
            for i, result in zip(training, _train([runs[i] for i in training], [records[i] for i in training])):
                records[i].results = result
            trained = sync(device) - t_train
            for i in training:
                t_reference = time.perf_counter()
                runs[i].train_reference(records[i])
                records[i].seconds["train_s"] = trained + sync(device) - t_reference
            # 3. Aggregate, each run on its own (a run that diverges stops; the others go on).
            for i in training:
                _step(runs, i, outcomes, lambda run: run.aggregate(records[i]), population)
            live = [i for i in live if outcomes[i] is None]
            # 4. Evaluate the runs whose round it is, together.
            t_eval = time.perf_counter()
            evaluating = [i for i in live if runs[i].evaluates(records[i].round)]
            rows = evaluate_runs([runs[i] for i in evaluating], [records[i] for i in evaluating])
            for i, row in zip(evaluating, rows):
                records[i].evaluation = row
            evaluated = time.perf_counter() - t_eval  # the accuracies' .item()s synchronize
            for i in evaluating:
                records[i].seconds["eval_s"] = evaluated
            # 5. Record; a run that has done its rounds writes its summary and closes.
            wall = sync(device) - t0
            for i in live:
                records[i].seconds["wall_s"] = wall
                _step(runs, i, outcomes, lambda run: run.record(records[i]), population)
                if outcomes[i] is None and runs[i].done == runs[i].federation.rounds:
                    _step(runs, i, outcomes, lambda run: run.summary(), population)
                    runs[i].close()
            live = [i for i in live if outcomes[i] is None]
            bar.update(1)
            if population:
                accuracies = [float(run.recorder.progress["acc"]) for run in runs if run.recorder is not None]
                bar.set_postfix(runs=len(live), best_acc=f"{max(accuracies, default=float('nan')):.4f}")
            else:
                bar.set_postfix(runs[0].recorder.progress)


def _train(runs: list[FederatedRun], records: list[RoundRecord]) -> list:
    """Step 2's client training: a run alone on its own engine (sequential or batched), several
    runs in one lock-step call (:func:`fedrun.population.train_together`)."""
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


class FederatedRun:
    """One federated run between rounds: its model, partition, engine, server and client state,
    and its open run directory.  A round is five steps, in this order:

    1. :meth:`sample` the round's clients, drop-outs and stragglers, all from ``(seed, round)``;
    2. train them: ``engine.train(*run.training(r))`` (or a population's one call for all runs),
       then :meth:`train_reference`, the PD-VL reference learner on its rounds;
    3. :meth:`aggregate`: N, E, the clients' angles and the learners' divergence from one pass
       over the updates, then the aggregator;
    4. :meth:`evaluate` the model the aggregator names (both, when FedNNNN's two differ), on the
       rounds :meth:`evaluates` says;
    5. :meth:`record` the round's rows, the snapshot and the checkpoint.

    Arguments as :func:`simulate`.  Construction builds everything that can fail on the inputs;
    entering the run (``with run:``) locks and opens the directory, or resumes it.
    """

    def __init__(self, run_dir, data: FederatedData, make_model, partition, aggregator: Aggregator,
                 local: LocalTraining, federation: Federation, participation: Participation = Participation(),
                 make_engine: Callable = SequentialEngine, seed: int = 0, device="cpu", resume: bool = False,
                 targets: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.99), config: dict | None = None,
                 dashboard=None):
        self.run_dir, self.data, self.aggregator, self.local = Path(run_dir), data, aggregator, local
        self.federation, self.participation, self.seed, self.device = federation, participation, seed, device
        self.resume, self.targets, self.config, self.dashboard = resume, targets, config, dashboard
        if not resume:
            refuse_existing_run(self.run_dir)  # fail before the work below
        torch.manual_seed(seed)
        self.model = build_model(make_model, data, device)
        self.layers, self.labels = model_layers(self.model), data.train_y.cpu().numpy()
        self.parts = partition(labels=self.labels, num_clients=federation.num_clients,
                               num_classes=data.num_classes, seed=seed)
        self.client_data = [torch.as_tensor(p, dtype=torch.long, device=device) for p in self.parts]
        self.engine = make_engine(self.model, data.train_x, data.train_y, local, aggregator.regularizer, seed)
        self.params, self.buffers = split_state(self.model)
        self.state = aggregator.init(self.params, federation.num_clients, self.layers)
        self.opt = OptimizerStates(local, self.params)
        self.done = 0  # the last round recorded
        self.saved = 0  # the last round whose checkpoint is on disk (= done, unless checkpoint_every > 1)
        self.finished: dict | None = None  # the summary of a run a previous process completed
        self.dir: RunDirectory | None = None
        self.recorder: Recorder | None = None

    def __enter__(self) -> "FederatedRun":
        """Lock the run directory; check a resumed run's checkpoint, config and CSVs before
        writing a byte; open the CSVs (cut back to the checkpoint's sizes on resume)."""
        self.dir = RunDirectory.open(self.run_dir, self.resume)
        try:
            self.recorder = Recorder(self.dir, self.layers, self.params, fingerprint(self.parts), self.dashboard)
            ckpt = self.dir.checkpoint(self.device) if self.resume else None
            self.dir.write_config(self.config, self.resume)  # on resume: refuses settings that differ from the run's
            self.finished = self.recorder.resume(ckpt, self.federation.rounds)
            if self.finished is not None:
                return self
            self.dir.start_log()
            if ckpt is not None:
                self.params, self.buffers = ckpt["params"], ckpt["buffers"]
                self.state, self.opt.state, self.done = ckpt["aggregator"], ckpt["optimizer_state"], ckpt["round"]
                self.saved = self.done
            with self.dir.speaks():
                self._log_start()
            self.recorder.open(class_counts(self.parts, self.labels, self.data.num_classes),
                               ckpt and ckpt["offsets"], self.done + 1, self.config)
        except BaseException:
            self.dir.close()
            raise
        return self

    def _log_start(self) -> None:
        f = self.federation
        log.info("run directory %s (engine: %s)%s", self.run_dir.resolve(), type(self.engine).__name__,
                 f"; resuming after round {self.done}" if self.done else "")
        log.info("%s: K=%d clients (%d a round), %d rounds, partition %s, %d parameters", self.aggregator.name,
                 f.num_clients, f.per_round, f.rounds, self.recorder.fingerprint,
                 sum(p.numel() for p in self.params.values()))

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the run directory (its lock and log); again is harmless."""
        if self.dir is not None:
            self.dir.close()

    @contextlib.contextmanager
    def guard(self):
        """Ctrl-C and a full disk as their one-line errors, naming the last complete round."""
        try:
            yield
        except KeyboardInterrupt:
            raise Interrupted(self.saved_round(), self.done) from None
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(f"no space left on the device writing to {self.run_dir} (after round "
                                   f"{self.done}); free space, then resume with resume=true") from None
            raise

    def saved_round(self) -> int:
        """The round of the checkpoint on disk: what a resume continues after.  Read from the file,
        since Ctrl-C may land between the checkpoint's rename and ``self.saved``'s update."""
        path = self.run_dir / CHECKPOINT
        if self.dir is None or not path.is_file():
            return self.saved
        try:
            return int(torch.load(path, map_location="cpu", weights_only=True)["round"])
        except Exception:  # noqa: BLE001 - unreadable: the in-memory count is the best left
            return self.saved

    def remaining(self) -> range:
        return range(self.done + 1, self.federation.rounds + 1)

    def sample(self, t: int) -> RoundRecord:
        """Step 1: round t's reporting clients, their epochs and starting optimizer states."""
        f = self.federation
        sampled = sample_clients(self.seed, t, f.num_clients, f.per_round)
        clients, epochs, dropped, stragglers = self.participation.draw(self.seed, t, sampled, self.local.epochs)
        r = RoundRecord(t, self.local.lr_at(t, f.rounds), {k: len(self.parts[k]) for k in dropped}, stragglers)
        r.clients, r.epochs = clients, epochs
        r.starts = self.opt.starting(clients) if clients else None
        r.models = {"average": self.params, "sent": self.params}  # if everyone dropped out: keep w_t
        return r

    def training(self, r: RoundRecord) -> tuple:
        """Step 2's arguments of ``engine.train``: w_t, the clients and their data, the round."""
        return (self.params, self.buffers, r.clients, [self.client_data[k] for k in r.clients], r.round,
                r.epochs, r.lr, r.starts)

    def train_reference(self, r: RoundRecord) -> None:
        """Step 2, end: on the rounds that have one, the PD-VL reference learner (client K, all the
        training data) trains from w_t as the clients did (:func:`fedrun.divergence.train_vanilla`)."""
        if self.federation.vanilla_round(r.round):
            r.vanilla = train_vanilla(self.engine, self.params, self.buffers, r.results, self.federation.num_clients,
                                      len(self.data.train_y), self.seed, r.round, self.local.epochs, r.lr, r.starts)
            r.vanilla_loss = float(r.vanilla.loss[0])

    def aggregate(self, r: RoundRecord) -> None:
        """Step 3: the new global model."""
        # Every inner product of the round's diagnostics comes from one pass over the updates:
        # N and E, the clients' angles, the learners' divergence.
        reference = None if r.vanilla is None else {k: v[0] for k, v in r.vanilla.deltas.items()}
        grams = layer_grams(r.results.deltas, self.layers, self.params, reference)
        r.divergence, r.learners = round_divergence(grams), LearnerParams(self.params, r.results.deltas)
        r.outcome, self.state = self.aggregator.apply(self.state, self.params, r.results, grams)
        check_finite(r.outcome, r.results.loss, r.round, self.aggregator.name)
        self.opt.finish(r.clients, r.results.opt_states, r.outcome.stats_weights)
        self.params, self.buffers = r.outcome.sent, r.outcome.buffers
        r.models = {"average": r.outcome.average, "sent": r.outcome.sent}

    def evaluates(self, t: int) -> bool:
        return t % self.federation.eval_every == 0 or t == self.federation.rounds

    def evaluate(self, r: RoundRecord) -> dict:
        """Step 4: the round's test (and validation) columns."""
        return evaluate_round(self.model, r.models, self.buffers, self.aggregator.evaluate, self.data,
                              eval_batch(self.device))

    def record(self, r: RoundRecord) -> None:
        """Step 5: the round's rows, its snapshot, the checkpoint (on the rounds it is due: the
        CSV rows written after it are cut off and written again by a resume)."""
        t = r.round
        self.recorder.write(r)
        if t in self.federation.snapshots:
            self.recorder.snapshot(t, r.models[self.aggregator.evaluate], self.buffers)
        if self.federation.checkpoint_round(t):
            self.recorder.checkpoint(t, self.params, self.buffers, self.state, self.opt.state)
            self.saved = t
        self.done = t

    def summary(self) -> dict:
        return self.recorder.summary(self.aggregator.name, self.targets)


def build_model(make_model: Callable[[], nn.Module], data: FederatedData, device) -> nn.Module:
    """The model, checked on one training image: a model that cannot be built for the data's
    shape, or cannot take its images, is one line before anything is written."""
    shape = "x".join(map(str, data.train_x.shape[1:]))
    try:
        model = make_model().to(device)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a constructor's arithmetic on a too-small image, ...
        raise ConfigError("model", type(e).__name__, f"cannot be built for the dataset's {shape} images: "
                          f"{first_line(e)}") from None
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(data.train_x[:1])
    except Exception as e:  # noqa: BLE001 - shape mismatches surface as RuntimeError
        raise ConfigError("model", type(model).__name__, f"cannot take the dataset's {shape} images "
                          f"(check dataset.channels and dataset.image_size): {first_line(e)}") from None
    finally:
        model.train(training)
    return model


def sync(device) -> float:
    """Wait for queued GPU work, so that a timing column holds the work it names; the time after."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
