"""One federated run between rounds: :class:`Federation` (who trains when) and
:class:`FederatedRun` (a run's model, partition, engine, server and client state, open run
directory, and the steps of its round).

The round loop (:func:`fedrun.harness.simulation.simulate_runs`) calls the steps in order, for one run
or a population of runs: :meth:`FederatedRun.sample`, the engine's training on
:meth:`FederatedRun.training`, :meth:`FederatedRun.train_reference`,
:meth:`FederatedRun.aggregate`, :meth:`FederatedRun.evaluate`, :meth:`FederatedRun.record`.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from fedrun.data.client_tests import hold_out
from fedrun.data.names import dataset_label
from fedrun.server.aggregator import Aggregator, check_finite
from fedrun.server.personal import Personalization
from fedrun.data.preparation import FederatedData
from fedrun.diagnostics.communication import method_payload
from fedrun.diagnostics.divergence import LearnerParams, round_divergence, train_vanilla
from fedrun.errors import (ConfigError, DivergenceError, Interrupted, NoSpaceError, Terminated, check, disk_full,
                           first_line)
from fedrun.diagnostics.evaluation import client_scores, client_summary, eval_batch, evaluate_round
from fedrun.models.layers import layers as model_layers
from fedrun.client.local_training import LocalTraining, OptimizerStates
from fedrun.client.regularizers import Proximal
from fedrun.logs import FILE_ONLY, ROUND_LINE
from fedrun.diagnostics.nwda import RoundSums
from fedrun.params import split_state
from fedrun.client.participation import Participation
from fedrun.data.partition import class_counts, client_ids, client_test_rows, fingerprint
from fedrun.harness.recorder import Recorder
from fedrun.harness.round_record import RoundRecord
from fedrun.harness.rundir import CHECKPOINT, RunDirectory, refuse_existing_run
from fedrun.seeding import clients_per_round
from fedrun.client.sequential import SequentialEngine

log = logging.getLogger(__name__)

# The start of a run's log says how much memory the aggregator's state takes when it is more than this
# (SCAFFOLD's control variates grow with K).
STATE_NOTE_BYTES = 2**30


@dataclass(frozen=True)
class Federation:
    """Who trains when (Nagura et al. Table 1: total rounds, C, K)."""

    rounds: int = 10
    num_clients: int = 100  # K
    client_fraction: float = 0.1  # C; m = max(C K, 1) clients a round
    eval_every: int = 1

    vanilla_every: int = 0  # PD-VL's vanilla reference learner every n rounds (0: never)
    # PD-Ls/PD-VL every n rounds and the last (and on PD-VL's rounds); 0: on PD-VL's rounds only.  The
    # one diagnostic that reads the updates a second time (fedrun.diagnostics.nwda.RoundSums.mean_direction).
    divergence_every: int = 1
    snapshots: tuple[int, ...] = ()  # rounds whose evaluated global model is saved to models/
    checkpoint_every: int = 1  # checkpoint.pt after rounds n, 2n, ... and the last
    # Each sampled client's accuracy on its own test data every n rounds (and the last): None is
    # eval_every where the data has per-client test splits (natural clients), else off; 0: off.
    client_eval_every: int | None = None
    # A share of each client's own examples held out as its own test split (fedrun.data.client_tests),
    # on any partition; 0: none (natural clients' own test data, where the data has it).
    client_test_fraction: float = 0.0
    client_eval_clients: str = "sampled"  # whose own accuracy is scored: sampled (that round's) | all (the K)
    # FedAvg + fine-tuning, the usual personalized-FL baseline: on the client-scored rounds each scored
    # client also trains the global model this many local epochs on its own data and is scored again.
    personalize_epochs: int = 0

    def __post_init__(self):
        object.__setattr__(self, "snapshots", tuple(self.snapshots))  # a list from the config
        check(self.rounds >= 1, "hyperparams.rounds", self.rounds, "must be >= 1")
        check(self.vanilla_every >= 0, "vanilla_every", self.vanilla_every, "must be >= 0 (0: off)")
        check(isinstance(self.divergence_every, int) and self.divergence_every >= 0, "divergence_every",
              self.divergence_every, "must be an integer >= 0 (rounds between parameter-divergence values; 0: "
              "only PD-VL's rounds)")
        check(all(1 <= r <= self.rounds for r in self.snapshots), "snapshots", list(self.snapshots),
              f"rounds between 1 and hyperparams.rounds ({self.rounds})")
        check(self.num_clients >= 1, "hyperparams.num_clients", self.num_clients, "must be >= 1")
        check(0 < self.client_fraction <= 1, "hyperparams.client_fraction", self.client_fraction,
              "must be in (0, 1]")
        check(self.eval_every >= 1, "hyperparams.eval_every", self.eval_every, "must be >= 1")
        check(self.client_eval_every is None or self.client_eval_every >= 0, "client_eval_every",
              self.client_eval_every, "must be >= 0 (0: off; null: with eval_every where clients have their own test data)")
        check(isinstance(self.personalize_epochs, int) and self.personalize_epochs >= 0, "personalize_epochs",
              self.personalize_epochs, "must be an integer >= 0 (local epochs of fine-tuning before a client's "
              "personalized score; 0: off)")
        check(self.client_eval_clients in ("sampled", "all"), "client_eval_clients", self.client_eval_clients,
              "must be sampled (the round's clients) or all (every one of the K)")
        check(self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every,
              "must be >= 1 (rounds between checkpoints; the last round is always saved)")

    @property
    def per_round(self) -> int:
        return clients_per_round(self.num_clients, self.client_fraction)

    def checkpoint_round(self, t: int) -> bool:
        """Whether checkpoint.pt is written after round t (a resume continues from the last one)."""
        return t % self.checkpoint_every == 0 or t == self.rounds

    def divergence_round(self, t: int) -> bool:
        """Whether round t computes PD-Ls/PD-VL: every ``divergence_every`` rounds, the last, and each
        of PD-VL's rounds (its reference learner is trained for them)."""
        every = self.divergence_every
        return (every > 0 and (t % every == 0 or t == self.rounds)) or self.vanilla_round(t)

    def vanilla_round(self, t: int) -> bool:
        """Rounds 1, 1 + n, 1 + 2n, ... get the PD-VL reference (round 1 shows the early divergence)."""
        return self.vanilla_every > 0 and (t - 1) % self.vanilla_every == 0


class FederatedRun:
    """One federated run between rounds: its model, partition, engine, server and client state,
    and its open run directory.  A round is five steps, in this order:

    1. :meth:`sample` the round's clients, drop-outs and stragglers, all from ``(seed, round)``;
    2. train them: ``engine.train(*run.training(r))`` (or a population's one call for all runs),
       then :meth:`train_reference`, the PD-VL reference learner on its rounds, and :meth:`keep_own`,
       what a personalized method's clients keep (Ditto's personal step);
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
                 dashboard=None, objective: str | None = None, notes: tuple[str, ...] = (),
                 data_digest: str | None = None, data_source: str = "the dataset"):
        self.run_dir, self.data, self.aggregator, self.local = Path(run_dir), data, aggregator, local
        self.federation, self.participation, self.seed, self.device = federation, participation, seed, device
        self.resume, self.targets, self.config, self.dashboard = resume, targets, config, dashboard
        self.objective = objective  # the summary's value a sweep optimizes (fedrun.harness.objective)
        self.notes = tuple(notes)  # settings without effect here (fedrun.command.build.no_effect): warned at the start
        # The data as loaded (fedrun.command.build.data_digest), recorded in every checkpoint: a data
        # file changed between a stop and its resume is refused, naming data_source.
        self.data_digest, self.data_source = data_digest, data_source
        self.population = False  # trained with other runs: its round lines go to its fedrun.log only
        if not resume:
            refuse_existing_run(self.run_dir)  # fail before the work below
        aggregator.check_local(local)
        torch.manual_seed(seed)
        self.model = build_model(make_model, data, device)
        self.layers, self.labels = model_layers(self.model), data.train_y.cpu().numpy()
        self.parts = partition(labels=self.labels, num_clients=federation.num_clients,
                               num_classes=data.num_classes, seed=seed, **client_ids(partition, data.train_groups))
        held = None
        if federation.client_test_fraction:  # each client's own test split, from its own examples
            self.parts, held = hold_out(self.parts, self.labels, federation.client_test_fraction, seed)
        self.client_data = [torch.as_tensor(p, dtype=torch.long, device=device) for p in self.parts]
        self.sizes = [len(p) for p in self.parts]  # n_k: sampling=size draws by them
        participation.check_clients(federation.num_clients)
        self.client_tests, self.client_eval_every, notes = _client_tests(self.parts, data, federation, device, held)
        # Where the own test rows index: the held-out training examples, or the data's own test split.
        self.client_test_x, self.client_test_y = (data.train_x, data.train_y) if held is not None else \
            (data.test_x, data.test_y)
        self.notes += notes
        # The regularizer learns the model's layers (their kinds: conv, fc, norm), as the engines know them.
        regularizer = None if aggregator.regularizer is None else aggregator.regularizer.for_layers(self.layers)
        self.engine = make_engine(self.model, data.train_x, data.train_y, local, regularizer, seed)
        # Fine-tuning for the personalized scores: the clients' own optimizer, no method's regularizer.
        self.tuner = None
        personal = aggregator.personal
        if personal is not None:  # a model without the layers it keeps is refused before anything is written
            check(not federation.personalize_epochs, "personalize_epochs", federation.personalize_epochs,
                  f"fine-tunes the global model; aggregator={aggregator.name} scores each client's own personal "
                  "model in the pers_* columns already: set personalize_epochs=0")
            check(self.client_eval_every > 0, "aggregator", aggregator.name,
                  "scores each client's personal model on the client's own test data: it needs "
                  "client_test_fraction > 0 (or natural clients with their own test split) and client_eval_every > 0")
            personal.local_names(*split_state(self.model), self.layers, f"model {type(self.model).__name__}")
        if personal is not None and personal.whole_model:  # Ditto's personal step: lambda/2 ||v - w_t||^2
            self.tuner = make_engine(self.model, data.train_x, data.train_y, local,
                                     Proximal(personal.lam).for_layers(self.layers), seed)
        if federation.personalize_epochs:
            check(self.client_eval_every > 0, "personalize_epochs", federation.personalize_epochs,
                  "scores each client on its own test data after fine-tuning: it needs client_test_fraction > 0 "
                  "(or natural clients with their own test split) and client_eval_every > 0")
            self.tuner = make_engine(self.model, data.train_x, data.train_y, local, None, seed)
        # The engine protocol (fedrun.client.protocol): fitted to the round's size (the parallel engine: no
        # more workers than can run), handed the evaluation splits, started before the directory is locked
        # (no worker holds the lock); each a no-op for an engine that trains in this process.
        fitted = self.engine.fit(federation.per_round)
        self.notes += (fitted,) if fitted else ()
        for x, y in ((data.test_x, data.test_y), (data.val_x, data.val_y)):
            if x is not None:
                self.engine.share(x, y)
        self.engine.start()
        if self.tuner is not None:
            self.tuner.fit(federation.per_round)
            self.tuner.start()
        self.params, self.buffers = split_state(self.model)
        self.state = aggregator.init(self.params, federation.num_clients, self.layers, self.buffers)
        self.opt = OptimizerStates(local, self.params)
        # The bytes one client's exchange costs each round (the rounds.csv bytes columns): FedBN's and
        # FedPer's local layers never travel.
        kept = () if personal is None or personal.whole_model else set(self.state["personal"]["names"])
        self.payload = method_payload({k: v for k, v in self.params.items() if k not in kept},
                                      {k: v for k, v in self.buffers.items() if k not in kept}, aggregator, self.opt)
        self.done = 0  # the last round recorded
        self.saved = 0  # the last round whose checkpoint is on disk (= done, unless checkpoint_every > 1)
        self.finished: dict | None = None  # the summary of a run a previous process completed
        self.dir: RunDirectory | None = None
        self.recorder: Recorder | None = None

    def __enter__(self) -> "FederatedRun":
        """Lock the run directory; check a resumed run's checkpoint, config and CSVs before
        writing a byte; open the CSVs (cut back to the checkpoint's sizes on resume)."""
        self.dir = RunDirectory.open(self.run_dir, self.resume)
        private = self.aggregator.privacy  # privacy.clip: DP-FedAvg's columns and summary values
        try:
            self.recorder = Recorder(self.dir, self.layers, self.params, fingerprint(self.parts), self.dashboard,
                                     self.device, config=self.config, payload=self.payload, data=self.data_digest,
                                     data_source=self.data_source, personal=self.personalized,
                                     privacy=None if private is None else private.summary())
            if self.resume:  # every check before a byte is written: a refused resume leaves the run as it was
                self.dir.check_config(self.config)  # settings that differ from config.yaml's
            ckpt = self.dir.checkpoint(self.device) if self.resume else None
            self.finished = self.recorder.resume(ckpt, self.federation.rounds)
            if self.finished is not None:
                return self
            self.dir.write_config(self.config, self.resume)  # a new run's; a resumed run's only where it is missing
            self.dir.start_log()
            if ckpt is not None:
                self.params, self.buffers = ckpt["params"], ckpt["buffers"]
                self.state, self.opt.state, self.done = ckpt["aggregator"], ckpt["optimizer_state"], ckpt["round"]
                self.saved = self.done
            with self.dir.speaks():
                self._log_start()
            self.recorder.open(class_counts(self.parts, self.labels, self.data.num_classes),
                               ckpt and ckpt["offsets"], self.done + 1, self.config)
            if ckpt is None:  # the run's start, saved before any round: a run stopped at any instant resumes
                self.recorder.checkpoint(0, self.params, self.buffers, self.state, self.opt.state)
        except BaseException:
            self.close()
            raise
        return self

    def _log_start(self) -> None:
        f = self.federation
        log.info("run directory %s (engine: %s)%s", self.run_dir.resolve(),
                 self.engine.summary,
                 f"; resuming after round {self.done}" if self.done else "")
        data = dataset_label(self.config)
        log.info("%s%s: K=%d clients (%d a round), %d rounds, partition %s, %d parameters", self.aggregator.name,
                 f" on {data}" if data else "", f.num_clients, f.per_round, f.rounds, self.recorder.fingerprint,
                 sum(p.numel() for p in self.params.values()))
        for note in self.notes:
            log.warning(note)
        if self.aggregator.personal is not None:  # the clients' kept state: K x the local layers
            kept = self.state["personal"]
            each = Personalization.client_bytes(kept)
            owners = list(dict.fromkeys(k.rpartition(".")[0] for k in kept["names"]))  # the layers, in order
            log.info("%s: each client keeps %s of its own (%d tensors), %.1f KiB a client once it has trained, "
                     "on %s and in every checkpoint.pt: %.1f MiB now, %.1f MiB once all K=%d clients have",
                     self.aggregator.name,
                     "a whole model" if self.aggregator.personal.whole_model else "the layers " + ", ".join(owners),
                     len(kept["names"]), each / 2**10, self.device, each * len(kept["clients"]) / 2**20,
                     each * self.federation.num_clients / 2**20, self.federation.num_clients)
        if "correction" in self.state and "clients" in self.state["correction"]:  # SCAFFOLD's c_k, kept per client
            corr = self.state["correction"]
            each = sum(v.shape[1:].numel() * v.element_size() for v in corr["c_k"].values())
            log.info("%s: each client keeps a control variate c_k once it has trained, %.1f KiB a client, on %s and "
                     "in every checkpoint.pt: %.1f MiB now, %.1f MiB once all K=%d clients have", self.aggregator.name,
                     each / 2**10, self.device, each * len(corr["clients"]) / 2**20,
                     each * self.federation.num_clients / 2**20, self.federation.num_clients)
        held = tensor_bytes(self.state)
        if held > STATE_NOTE_BYTES:  # server state that does not grow with the clients (or a dense c_k store)
            log.info("%s keeps %.1f GiB of server state%s, on %s and in every checkpoint.pt", self.aggregator.name,
                     held / 2**30, " (a control variate for each of the K clients)"
                     if "correction" in self.state and "clients" not in self.state["correction"] else "", self.device)

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the run directory (its lock and log) and the engine's workers, if it has any;
        again is harmless."""
        self.engine.close()
        if self.tuner is not None:
            self.tuner.close()
        if self.dir is not None:
            self.dir.close()

    @contextlib.contextmanager
    def guard(self):
        """Ctrl-C, SIGTERM and a full disk as their one-line errors, naming the last complete round;
        a divergence closes the session in ``run.json`` with its round and error (``Recorder.stopped``)."""
        try:
            yield
        except KeyboardInterrupt as e:  # SIGINT, or SIGTERM as fedrun.errors.Terminated
            raise Interrupted(self.saved_round(), self.done, terminated=isinstance(e, Terminated)) from None
        except DivergenceError as e:  # recorded in run.json: the run ended, not merely stopped
            if self.recorder is not None:
                self.recorder.stopped("diverged", str(e), self.done)
            raise
        except Exception as e:
            stop = _interrupt_behind(e)
            if stop is not None:  # Ctrl-C inside torch.save comes out as its RuntimeError ("unexpected pos")
                raise Interrupted(self.saved_round(), self.done, terminated=isinstance(stop, Terminated)) from None
            if disk_full(e):  # an OSError, or torch's error raised while handling one
                when = f"after round {self.done}" if self.done else "before the first round"
                saved = self.saved_round()
                again = "" if saved >= self.done else (  # checkpoint_every > 1: the rounds since run again
                    f", which continues after round {saved}, its last checkpoint (checkpoint_every)" if saved else
                    ", which starts over from round 1 (no checkpoint since the start)")
                raise NoSpaceError(f"no space left on the device writing to {self.run_dir} ({when}); free space, "
                                   f"then resume with resume=true{again}") from None
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

    def sample(self, t: int) -> RoundRecord:
        """Step 1: round t's reporting clients, their epochs and starting optimizer states."""
        f = self.federation
        sampled = self.participation.sample(self.seed, t, self.sizes, f.per_round)
        clients, epochs, dropped, stragglers = self.participation.draw(self.seed, t, sampled, self.local.epochs)
        r = RoundRecord(t, self.local.lr_at(t, f.rounds), {k: len(self.parts[k]) for k in dropped}, stragglers)
        r.clients, r.epochs = clients, epochs
        r.starts = self.opt.starting(clients) if clients else None
        r.inputs = self.aggregator.client_inputs(self.state, clients)  # SCAFFOLD's c - c_k, or None
        personal = self.aggregator.personal  # FedBN's, FedPer's local layers: each client starts from its own
        r.own = None if personal is None or personal.whole_model or not clients else \
            Personalization.own(self.state["personal"], clients)
        r.models = {"average": self.params, "sent": self.params}  # if everyone dropped out: keep w_t
        return r

    def training(self, r: RoundRecord) -> tuple:
        """Step 2's arguments of ``engine.train``: w_t, the clients and their data, the round, the
        regularizer's per-client inputs from the aggregator's correction (or None) and a personalized
        method's local layers, each client's own (or None)."""
        return (self.params, self.buffers, r.clients, [self.client_data[k] for k in r.clients], r.round,
                r.epochs, r.lr, r.starts, r.inputs, r.own)

    def train_reference(self, r: RoundRecord) -> None:
        """Step 2, end: on the rounds that have one, the PD-VL reference learner (client K, all the
        training data) trains from w_t as the clients did (:func:`fedrun.diagnostics.divergence.train_vanilla`)."""
        if self.federation.vanilla_round(r.round):
            r.vanilla = train_vanilla(self.engine, self.params, self.buffers, r.results, self.federation.num_clients,
                                      len(self.data.train_y), self.seed, r.round, self.local.epochs, r.lr, r.starts)
            r.vanilla_loss = float(r.vanilla.loss[0])

    def keep_own(self, r: RoundRecord) -> None:
        """Step 2, after the reference learner, for a personalized method (:mod:`fedrun.server.personal`): the clients keep
        what is their own.  FedBN and FedPer: their local layers after training, taken out of what
        the server aggregates.  Ditto: each client's personal step, ``personal_epochs`` epochs from
        its kept ``v_k`` on ``F_k(v) + lambda/2 ||v - w_t||^2`` (its batches from (seed, round,
        client), as its global update's), the result kept."""
        personal = self.aggregator.personal
        if personal is None:
            return
        kept = self.state["personal"]
        if personal.whole_model:
            epochs = [personal.epochs or self.local.epochs] * len(r.clients)
            trained = self.tuner.train(self.params, self.buffers, r.clients, [self.client_data[k] for k in r.clients],
                                       r.round, epochs, r.lr, own=Personalization.own(kept, r.clients))
            values = Personalization.trained(kept, self.params, trained)
        else:
            values = Personalization.trained(kept, self.params, r.results)
            r.results = Personalization.shared_only(kept, self.params, self.buffers, r.results)
        self.state = {**self.state, "personal": Personalization.keep(kept, r.clients, values)}

    def aggregate(self, r: RoundRecord) -> None:
        """Step 3: the new global model."""
        # The round's diagnostics stream over the updates, O(m d) (fedrun.diagnostics.nwda.RoundSums):
        # N and E, the clients' angles and the learners' norms in one pass, PD-Ls in one more.
        reference = None if r.vanilla is None else {k: v[0] for k, v in r.vanilla.deltas.items()}
        sums = RoundSums(r.results.deltas, self.layers, self.params, reference)
        r.outcome, self.state = self.aggregator.apply(self.state, self.params, r.results, sums, self.seed, r.round)
        r.divergence = round_divergence(sums) if self.federation.divergence_round(r.round) else None
        r.learners = LearnerParams(self.params, r.results.deltas)
        check_finite(r.outcome, r.results.loss, r.round, self.aggregator.name)
        self.opt.finish(r.clients, r.results.opt_states, r.outcome.stats_weights)
        self.params, self.buffers = r.outcome.sent, r.outcome.buffers
        r.models = {"average": r.outcome.average, "sent": r.outcome.sent}

    def evaluates(self, t: int) -> bool:
        return t % self.federation.eval_every == 0 or t == self.federation.rounds

    def evaluates_clients(self, t: int) -> bool:
        every = self.client_eval_every
        return every > 0 and (t % every == 0 or t == self.federation.rounds)

    def evaluate_clients(self, r: RoundRecord) -> dict:
        """Step 4, per client: the evaluated model on each sampled client's own test data (its
        ``own_test_acc``/``own_test_loss`` in clients.csv, kept in ``r.client_eval``) and the
        clients' mean, standard deviation and worst 10% for rounds.csv."""
        if self.federation.client_eval_clients == "all":  # every client, in one batched pass
            sampled = list(range(self.federation.num_clients))
        else:
            sampled = sorted({*r.clients, *r.dropped})
        scores = client_scores(self.model, {**r.models[self.aggregator.evaluate], **self.buffers}, self.client_test_x,
                               self.client_test_y, [self.client_tests[k] for k in sampled], eval_batch(self.device))
        r.client_eval = dict(zip(sampled, scores))
        out = client_summary([acc for acc, _ in scores])
        if self.aggregator.personal is not None:  # FedBN, FedPer, Ditto: each client's own model
            r.personal_eval = self.own_scores(r, sampled)
        elif self.tuner is not None:
            r.personal_eval = self.personalized_scores(r, sampled)
        if r.personal_eval:
            personal = client_summary([acc for acc, _ in r.personal_eval.values()])
            out.update({k.replace("client_acc", "pers_acc"): v for k, v in personal.items()})
        return out

    def own_scores(self, r: RoundRecord, clients: list[int]) -> dict[int, tuple[float, float]]:
        """A personalized method's scores: each client's personal model (the evaluated global model
        with its kept layers; Ditto: its whole ``v_k``) on its own test data.  A client never sampled
        yet keeps ``w_0``'s values."""
        state, kept = r.models[self.aggregator.evaluate], self.state["personal"]
        models = Personalization.models(kept, clients, state, self.buffers)
        return {k: client_scores(self.model, own, self.client_test_x, self.client_test_y, [self.client_tests[k]],
                                 eval_batch(self.device))[0]
                for k, own in zip(clients, models)}

    @property
    def personalized(self) -> bool:
        """Whether the run scores personal models (``pers_*`` columns): a personalized method's, or
        the global model fine-tuned (``personalize_epochs``)."""
        return self.aggregator.personal is not None or bool(self.federation.personalize_epochs)

    def personalized_scores(self, r: RoundRecord, clients: list[int]) -> dict[int, tuple[float, float]]:
        """FedAvg + fine-tuning (the personalized-FL baseline of Wang et al. 2019, "Federated evaluation
        of on-device personalization"): each client trains the round's evaluated model for
        ``personalize_epochs`` local epochs on its own training data (its batches from (seed, round,
        client); no method's regularizer) and its model ``w + dw_k`` is scored on its own test data."""
        state = r.models[self.aggregator.evaluate]
        epochs = [self.federation.personalize_epochs] * len(clients)
        tuned = self.tuner.train(state, self.buffers, clients, [self.client_data[k] for k in clients], r.round,
                                 epochs, r.lr)
        out = {}
        for j, k in enumerate(clients):
            own = {n: state[n] + tuned.deltas[n][j] for n in state}
            own.update({n: tuned.buffers[n][j] for n in tuned.buffers})
            out[k] = client_scores(self.model, own, self.client_test_x, self.client_test_y, [self.client_tests[k]],
                                   eval_batch(self.device))[0]
        return out

    def evaluate(self, r: RoundRecord) -> dict:
        """Step 4: the round's test (and validation) columns."""
        return evaluate_round(self.model, r.models, self.buffers, self.aggregator.evaluate, self.data,
                              eval_batch(self.device), self.engine.evaluate)

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
        row = self.recorder.last
        log.info("round %d/%d: test accuracy %s, test loss %s, N/E %s, %.2f s", t, self.federation.rounds,
                 _percent(row.get("test_acc")), _number(row.get("test_loss")), _number(row.get("N_over_E"), 3),
                 row.get("wall_s", float("nan")), extra={ROUND_LINE: True, FILE_ONLY: self.population})

    def summary(self) -> dict:
        """Write ``summary.json`` and say, in one line, where the results are and how the run went."""
        out = self.recorder.summary(self.aggregator.name, self.targets, self.objective)
        objective = ("" if out.get("objective_value") is None else
                     f"; {out['objective']} = {out['objective_value']:.4f}")
        log.info("done: %d rounds in %s; final test accuracy %s, best %s (round %s)%s; results in %s",
                 out.get("rounds", 0), _duration(out.get("round_seconds")), _percent(out.get("final_test_acc")),
                 _percent(out.get("best_test_acc")), out.get("best_round", "-"), objective, self.run_dir.resolve())
        return out


def _interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM, :class:`fedrun.errors.Terminated`) an error was raised while handling,
    if any: a library that catches the interrupt and raises its own error (``torch.save``'s zip
    writer, stopped mid-file, raises ``RuntimeError: unexpected pos``) must still stop the run as
    an interrupt, exit 130, not as a crash."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, KeyboardInterrupt):
            return error
        error = error.__cause__ or error.__context__
    return None


def _percent(value) -> str:
    return "-" if value is None or value != value else f"{100 * value:.2f}%"


def _number(value, digits: int = 4) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    if seconds < 59.95:  # what rounds to 60.0 s is a minute
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(float(seconds)), 60)
    return f"{minutes} min {rest} s"


def _client_tests(parts, data: FederatedData, federation: Federation, device,
                  held: list | None = None) -> tuple[list | None, int, tuple]:
    """Each client's own test rows on the device (None without them), how often they are scored
    (:attr:`Federation.client_eval_every`, its null resolved), and the run's notes about them.
    ``held``: the rows ``client_test_fraction`` held out of each client's training examples, which
    take the place of the data's own per-client test split."""
    rows = held if held is not None else client_test_rows(parts, data.train_groups, data.test_groups)
    notes = ()
    if rows is not None and not any(len(r) for r in rows):
        # The per-client columns would stay empty for the whole run without a word (the test
        # split's clients are others: writers missing from LEAF's test files, a dataset.max_test
        # subset): warned when the run starts; not refused, the run's global scores stand.
        notes = (f"partition=natural: none of the {len(parts)} clients kept has test examples of its own (no test "
                 "example carries their ids): clients.csv's own_test_acc/own_test_loss and rounds.csv's "
                 "client_acc_mean/_std/_worst10 stay empty",)
    every = federation.client_eval_every
    if every is None:
        every = federation.eval_every if rows is not None else 0
    check(every == 0 or rows is not None, "client_eval_every", every,
          "needs each client's own test data: client_test_fraction > 0 (on any partition), or partition=natural "
          "on a dataset with a per-client test split (dataset=femnist, dataset=table, or dataset=huggingface with "
          "a client column); 0: off")
    if rows is None or every == 0:
        return None, every, notes
    return [torch.as_tensor(r, dtype=torch.long, device=device) for r in rows], every, notes


def build_model(make_model: Callable[[], nn.Module], data: FederatedData, device) -> nn.Module:
    """The model, checked on one training image: a model that cannot be built for the data's
    shape, or cannot take its images, is one line before anything is written."""
    shape = "x".join(map(str, data.train_x.shape[1:]))
    try:
        model = make_model().to(device)
    except Exception as e:  # noqa: BLE001 - a constructor's arithmetic on a too-small image, ...
        cause = e
        while cause is not None and not isinstance(cause, ConfigError):  # Hydra wraps the constructor's own
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
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


def tensor_bytes(obj) -> int:
    """The bytes of every tensor in a nested dict / list (an aggregator's state)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0
