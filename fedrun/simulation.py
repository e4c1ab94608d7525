"""The federated round loop: sample, train locally, aggregate, evaluate, record.

:func:`simulate` is the whole of a run in one screen.  The parts it calls, in the order of a round:

1. sample the round's clients from ``(seed, round)``, and who drops out or straggles
   (:mod:`fedrun.seeding`, :mod:`fedrun.participation`);
2. train them locally, updates returned stacked ``[m, *shape]`` (an engine: :mod:`fedrun.sequential`,
   :mod:`fedrun.batched`), and the PD-VL reference learner on the rounds that have one;
3. aggregate (:mod:`fedrun.aggregators`), with N, E (:mod:`fedrun.nwda`) and the parameter
   divergence (:mod:`fedrun.divergence`) from one pass over the updates;
4. evaluate the global model (:mod:`fedrun.evaluation`);
5. record the round's rows, snapshot and checkpoint (:mod:`fedrun.recorder`).
"""
from __future__ import annotations

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
from fedrun.errors import ConfigError, Interrupted, NoSpaceError, check, first_line
from fedrun.evaluation import eval_batch, evaluate_round
from fedrun.layers import layers as model_layers
from fedrun.local_training import LocalTraining, OptimizerStates
from fedrun.nwda import layer_grams
from fedrun.params import split_state
from fedrun.participation import Participation
from fedrun.partition import class_counts, fingerprint
from fedrun.recorder import Recorder, RoundRecord
from fedrun.rundir import RunDirectory, refuse_existing_run
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

    @property
    def per_round(self) -> int:
        return clients_per_round(self.num_clients, self.client_fraction)

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
    run_dir = Path(run_dir)
    if not resume:
        refuse_existing_run(run_dir)  # fail before the work below
    torch.manual_seed(seed)
    model = build_model(make_model, data, device)
    layers, labels = model_layers(model), data.train_y.cpu().numpy()
    parts = partition(labels=labels, num_clients=federation.num_clients, num_classes=data.num_classes, seed=seed)
    client_data = [torch.as_tensor(p, dtype=torch.long, device=device) for p in parts]
    engine = make_engine(model, data.train_x, data.train_y, local, aggregator.regularizer, seed)
    params, buffers = split_state(model)
    state, opt = aggregator.init(params, federation.num_clients, layers), OptimizerStates(local, params)
    done = 0  # the last round whose checkpoint is on disk

    with RunDirectory.open(run_dir, resume) as run:
        recorder = Recorder(run, layers, params, fingerprint(parts), dashboard)
        ckpt = run.checkpoint(device) if resume else None
        run.write_config(config, resume)  # on resume: refuses settings that differ from the run's
        if (summary := recorder.resume(ckpt, federation.rounds)) is not None:
            return summary  # a finished run: nothing to do
        run.start_log()
        if ckpt is not None:
            params, buffers, state, opt.state = ckpt["params"], ckpt["buffers"], ckpt["aggregator"], ckpt["optimizer_state"]
            done = ckpt["round"]
        log.info("run directory %s (engine: %s)%s", run_dir.resolve(), type(engine).__name__,
                 f"; resuming after round {done}" if done else "")
        log.info("%s: K=%d clients (%d a round), %d rounds, partition %s, %d parameters", aggregator.name,
                 federation.num_clients, federation.per_round, federation.rounds, recorder.fingerprint,
                 sum(p.numel() for p in params.values()))
        try:
            recorder.open(class_counts(parts, labels, data.num_classes), ckpt and ckpt["offsets"], done + 1, config)
            with tqdm(range(done + 1, federation.rounds + 1), initial=done, total=federation.rounds,
                      desc=aggregator.name, unit="round", disable=not progress, dynamic_ncols=True) as bar:
                for t in bar:
                    t0 = time.perf_counter()
                    # 1. Sample: the round's clients, drop-outs and stragglers, all from (seed, round).
                    sampled = sample_clients(seed, t, federation.num_clients, federation.per_round)
                    clients, epochs, dropped, stragglers = participation.draw(seed, t, sampled, local.epochs)
                    r = RoundRecord(t, local.lr_at(t, federation.rounds), {k: len(parts[k]) for k in dropped},
                                    stragglers)
                    models = {"average": params, "sent": params}  # if everyone dropped out: keep w_t
                    if clients:
                        # 2. Train locally (and the PD-VL reference learner, client K, on its rounds).
                        starts = opt.starting(clients)
                        r.results = engine.train(params, buffers, clients, [client_data[k] for k in clients], t,
                                                 epochs, r.lr, starts)
                        vanilla = None
                        if federation.vanilla_round(t):
                            vanilla = train_vanilla(engine, params, buffers, r.results, federation.num_clients,
                                                    len(data.train_y), seed, t, local.epochs, r.lr, starts)
                            r.vanilla_loss = float(vanilla.loss[0])
                        r.seconds["train_s"] = sync(device) - t0
                        # 3. Aggregate.  Every inner product of the round's diagnostics comes from one
                        # pass over the updates: N and E, the clients' angles, the learners' divergence.
                        grams = layer_grams(r.results.deltas, layers, params,
                                            None if vanilla is None else {k: v[0] for k, v in vanilla.deltas.items()})
                        r.divergence, r.learners = round_divergence(grams), LearnerParams(params, r.results.deltas)
                        r.outcome, state = aggregator.apply(state, params, r.results, grams)
                        check_finite(r.outcome, r.results.loss, t, aggregator.name)
                        opt.finish(clients, r.results.opt_states, r.outcome.stats_weights)
                        params, buffers = r.outcome.sent, r.outcome.buffers
                        models = {"average": r.outcome.average, "sent": r.outcome.sent}
                    # 4. Evaluate the model the aggregator names (both, when FedNNNN's two differ).
                    if t % federation.eval_every == 0 or t == federation.rounds:
                        t_eval = time.perf_counter()
                        r.evaluation = evaluate_round(model, models, buffers, aggregator.evaluate, data,
                                                      eval_batch(device))
                        r.seconds["eval_s"] = time.perf_counter() - t_eval  # .item()s of the accuracies synchronize
                    r.seconds["wall_s"] = sync(device) - t0
                    # 5. Record: the round's rows, the snapshot, the checkpoint.
                    recorder.write(r)
                    if t in federation.snapshots:
                        recorder.snapshot(t, models[aggregator.evaluate], buffers)
                    recorder.checkpoint(t, params, buffers, state, opt.state)
                    done = t
                    bar.set_postfix(recorder.progress)
            return recorder.summary(aggregator.name, targets)
        except KeyboardInterrupt:
            raise Interrupted(done) from None
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(f"no space left on the device writing to {run_dir} (after round {done}); "
                                   "free space, then resume with resume=true") from None
            raise


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
