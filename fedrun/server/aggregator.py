"""The Aggregator machine: one round of a method, FedJAX-shaped ``init``/``apply``, from the
clients' stacked updates to the sent and the average models (:class:`Aggregator`,
:class:`RoundOutcome`), and the round's checks.  The methods are built from these parts by
the factories of :mod:`fedrun.aggregators`; see there for the round's order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedrun.client.local_training import ClientResults, LocalTraining
from fedrun.client.regularizers import Regularizer
from fedrun.diagnostics.nwda import LayerGrams, NormStats, RoundSums, layer_norms, nwda
from fedrun.errors import ConfigError, DivergenceError, check
from fedrun.models.layers import Layer
from fedrun.params import Params
from fedrun.server import reduce as R
from fedrun.server import transforms as T
from fedrun.server.corrections import ClientCorrection
from fedrun.server.personal import Personalization
from fedrun.server.privacy import ClientLevelDP
from fedrun.server.weighting import WeightingRule, base_rule

EVALUATE = ("average", "sent")


@dataclass
class RoundOutcome:
    """What one round of aggregation produced, for the next round and for the CSVs."""

    sent: Params  # w_{t+1}: the model sent to clients next round
    average: Params  # w_t + reduce(dw, weights): the average-aggregated model (w_t + sum_k p_k dw_k by default)
    buffers: Params  # averaged non-trainable state (BatchNorm running statistics)
    weights: torch.Tensor  # [m] aggregation weights, or [L, m] for a per-layer rule
    stats: NormStats  # N and E (eq. 4-5), with the base weights
    step_layer_norms: torch.Tensor  # [L] ||w_{t+1} - w_t|| per layer (eq. 24)
    skipped: bool  # the server kept w_t (N ~ 0 under norm normalization)
    stats_weights: torch.Tensor = None  # [m] the base weights of N and E
    diagnostics: dict = field(default_factory=dict)  # the rule's per-client values (smoothed angles)
    privacy: dict = field(default_factory=dict)  # a private run's rounds.csv values (fedrun.server.privacy.COLUMNS)

    @property
    def client_weights(self) -> torch.Tensor:
        """``[m]``: each client's weight; for a per-layer rule, the mean over layers."""
        return self.weights if self.weights.ndim == 1 else self.weights.mean(0)

    @property
    def server_step(self) -> float:
        return float(self.step_layer_norms.pow(2).sum().sqrt())


@dataclass(frozen=True)
class Aggregator:
    """A method's server side.  Per round: ``weighting`` gives the clients' weights, ``reduce`` turns
    the stacked updates and those weights into the mean update, ``server`` turns that into the step
    ``w_{t+1} - w_t``; ``regularizer`` (if any) acts on the clients' local training, with the
    per-client inputs of ``correction`` (if any), whose state outlives the round for every client.
    ``client_optimizers`` names the client optimizers the method is defined for (empty: any).
    ``privacy`` (set by :meth:`fedrun.server.privacy.Privacy.attach`, never by a method) clips the
    updates, takes their mean over the expected number of clients and noises it: DP-FedAvg.
    ``personal`` (a personalized method: FedBN, FedPer, Ditto) says what every client keeps of its
    own across rounds (:mod:`fedrun.server.personal`)."""

    name: str
    server: T.ServerTransform
    weighting: WeightingRule = field(default_factory=base_rule)
    regularizer: Regularizer | None = None
    evaluate: str = "average"
    reduce: R.Reduce = R.mean  # (stacked updates, weights, layers) -> the mean update
    correction: ClientCorrection | None = None  # per-client state across rounds (fedrun.server.corrections)
    client_optimizers: tuple[str, ...] = ()
    privacy: ClientLevelDP | None = None  # client-level DP around the mean (fedrun.server.privacy)
    personal: Personalization | None = None  # what each client keeps of its own (fedrun.server.personal)

    def __post_init__(self):
        if self.evaluate not in EVALUATE:
            raise ConfigError("aggregator.evaluate", self.evaluate, f"choose one of: {', '.join(EVALUATE)}")

    def check_local(self, local: LocalTraining) -> None:
        """Refuse, in one line, a client optimizer the method is not defined for (FedNova and
        SCAFFOLD normalize by SGD's step coefficients, which Adam does not have)."""
        check(not self.client_optimizers or local.optimizer in self.client_optimizers, "hyperparams.optimizer",
              local.optimizer, f"aggregator={self.name} is defined for client {' or '.join(self.client_optimizers)} "
              "(it normalizes by the SGD steps' coefficients ||a_k||_1); choose hyperparams.optimizer=sgd")

    @property
    def two_models(self) -> bool:
        """Whether the model sent to clients can differ from the average-aggregated one (a server
        transform other than the identity), so both have a test accuracy."""
        return self.server is not T.IDENTITY

    def init(self, params: Params, num_clients: int, layers: list[Layer], buffers: Params | None = None) -> dict:
        """The server's state before round 1: the transforms' (``d_0 = 0``, FedOpt's moments), the
        weighting rule's (per client, so ``num_clients``), the layer grouping the rules use, a
        correction's (SCAFFOLD's control variates, per client too) and a personalized method's
        kept values (every client's, ``buffers`` among them where it keeps BatchNorm layers)."""
        state = {"server": self.server.init(params), "weighting": self.weighting.init(num_clients, len(layers)),
                 "layers": [(layer.name, layer.type, tuple(layer.params)) for layer in layers]}
        if self.correction is not None:  # only then: every other method's state (and checkpoint) is as it was
            state["correction"] = self.correction.init(params, num_clients)
        if self.privacy is not None:  # the adaptive clip C_t, kept in the checkpoint
            state["privacy"] = self.privacy.init()
        if self.personal is not None:
            state["personal"] = self.personal.init(params, buffers or {}, num_clients, layers)
        return state

    def client_inputs(self, state: dict, clients: list[int]) -> Params | None:
        """Before the round's training: the regularizer's per-client inputs for ``clients``, stacked
        ``[m, ...]`` in their order (SCAFFOLD's ``c - c_k``), from the correction's state; None for
        a method without a correction."""
        if self.correction is None or not clients:
            return None
        return self.correction.inputs(state["correction"], clients)

    def apply(self, state: dict, params: Params, results: ClientResults,
              grams: RoundSums | LayerGrams | None = None, seed: int = 0, round_: int = 0
              ) -> tuple[RoundOutcome, dict]:
        """Aggregate one round's client results into the next global model.

        Args:
          state: from :meth:`init` or the previous round.
          params: the global model ``w_t`` (trainable parameters).
          results: the clients' stacked updates ``w_k - w_t``, final buffers and sizes ``n_k``.
          grams: the round's :class:`fedrun.diagnostics.nwda.RoundSums` (the simulation shares them with
            parameter divergence) or already built :func:`fedrun.diagnostics.nwda.layer_grams`; None:
            :class:`~fedrun.diagnostics.nwda.RoundSums` of the updates here.  N and E stream over the
            updates (O(m d)); the m x m Gram matrices are built only if the rule reads them (Krum).
          seed, round_: the run's seed and this round's number, which a private run's noise is
            drawn from (:mod:`fedrun.server.privacy`); every other method ignores them.

        N and E always use the base weights (``examples`` or ``uniform``), as eq. 4-5 define them,
        so they compare across aggregators; the rule's weights (angle, Krum, ...) then go to the
        reduce, which forms the mean update.  BatchNorm statistics are averaged with the base
        weights too: they are not updates to weigh.
        """
        check(len(results.num_examples) > 0, "round", 0, "needs at least one client update")
        layers = [Layer(*layer) for layer in state["layers"]]
        rule = self.weighting
        # The engines return the per-client counts (n_k, steps) on the CPU and the updates on the
        # model's device: every weight lives where the updates it multiplies are.
        device = next(iter(results.deltas.values())).device
        base = rule.base(results.num_examples.to(device))
        grams = RoundSums(results.deltas, layers) if grams is None else grams
        stats = nwda(results.deltas, base, layers, grams)
        steps = results.steps if results.effective_steps is None else results.effective_steps
        steps = steps.to(device=device, dtype=torch.float64)
        weights, rule_state, diagnostics = rule.update(stats, base, results.clients, state["weighting"], grams, steps)
        private, private_state = {}, None
        if self.privacy is None:
            mean = self.reduce(results.deltas, weights, layers)
        else:  # DP-FedAvg: the clipped updates' sum over the expected m, noised; N and E stay the raw updates'
            mean, weights, private_state, private = self.privacy.aggregate(
                state["privacy"], results.deltas, stats.client_norms, layers, self.reduce, seed, round_)
        step, server_state = self.server.update(mean, state["server"], stats)
        skipped = step is None
        if skipped:
            step, server_state = {k: torch.zeros_like(v) for k, v in mean.items()}, state["server"]
        outcome = RoundOutcome(sent={k: params[k] + step[k] for k in params},
                               average={k: params[k] + mean[k] for k in params},
                               buffers=average_buffers(results.buffers, base), weights=weights, stats=stats,
                               step_layer_norms=layer_norms(step, layers).to(torch.float64), skipped=skipped,
                               stats_weights=base, diagnostics=diagnostics, privacy=private)
        new_state = {**state, "server": server_state, "weighting": rule_state}
        if self.correction is not None:  # the clients' training of this round updates their state
            new_state["correction"] = self.correction.update(state["correction"], results)
        if private_state is not None:
            new_state["privacy"] = private_state
        return outcome, new_state


def average_buffers(buffers: Params, weights: torch.Tensor) -> Params:
    """Weighted mean of float buffers; integer counters (``num_batches_tracked``) take the max."""
    out = {}
    for name, stacked in buffers.items():
        if stacked.is_floating_point():
            out[name] = torch.tensordot(weights.to(stacked.device, stacked.dtype), stacked, dims=1)
        else:
            out[name] = stacked.max(0).values
    return out


def check_finite(outcome: RoundOutcome, losses: torch.Tensor, t: int, name: str) -> None:
    """Raise :class:`DivergenceError` when a round diverged: NaN or Inf in either model (the one
    sent to clients, e.g. FedNNNN's normalized model, and the evaluated average; they differ when
    the server transforms), in N or E, or in the local losses.  One host transfer for all checks."""
    models = {"sent": outcome.sent, "average": outcome.average}
    names = [(which, k) for which, model in models.items() for k in model]
    flags = [torch.isfinite(models[which][k]).all() for which, k in names]
    flags.append(torch.isfinite(losses).all().to(flags[0].device))
    finite = torch.stack(flags).tolist()
    bad = [name for name, ok in zip(names, finite) if not ok]
    norms_ok = math.isfinite(outcome.stats.N) and math.isfinite(outcome.stats.E)
    if bad or not norms_ok or not finite[-1]:
        what = (f"parameter {bad[0][1]} of the {bad[0][0]} model" if bad else "the update norm N or E"
                if not norms_ok else "the local training loss")
        raise DivergenceError(f"round {t}: {what} is NaN or Inf after aggregation with {name}; the "
                              f"CSVs hold rounds before {t}. Try a smaller hyperparams.lr (or beta/gamma)")


# ----------------------------------------------------------------------------- FedNNNN's methods
