"""Client-level differential privacy: DP-FedAvg with fixed or adaptive clipping.

The ``privacy`` settings wrap an aggregator whose server takes the mean of the round's updates
(:func:`Privacy.attach`), so that the model the server sends is differentially private with
respect to each client's whole data set (user-level privacy):

* McMahan, Ramage, Talwar, Zhang, "Learning differentially private recurrent language models",
  ICLR 2018, Algorithm 1 (DP-FedAvg): every client's update ``dw_k`` is clipped to L2 norm ``C``,
  the server sums the clipped updates, adds Gaussian noise of standard deviation ``z C`` to the sum
  and divides by the *expected* number of clients ``qK`` (their fixed-denominator estimator
  ``f~_f`` with every client's weight ``w_k = 1``, so ``qW = qK``)::

      Delta_t = ( sum_k dw_k min(1, C / ||dw_k||)  +  N(0, (z C)^2 I) ) / (qK)

  fedrun samples exactly ``m = qK`` clients a round (``hyperparams.sampling=uniform``), so the
  denominator is ``m``, which a drop-out does not lower (a missing update counts as zero, as in
  the paper's estimator).  The server's transforms (momentum, FedAdam ...) then act on
  ``Delta_t``, which is post-processing: they keep the guarantee.
* Andrew, Thakkar, McMahan, Ramaswamy, "Differentially private learning with adaptive clipping",
  NeurIPS 2021, Algorithm 1: ``C`` follows a target quantile ``gamma`` of the update norms.  Each
  client also reports ``b_k = 1[||dw_k|| <= C_t]``; the server takes the noised fraction
  ``b~_t = (sum_k b_k + N(0, sigma_b^2)) / m`` and updates geometrically,
  ``C_{t+1} = C_t exp(-eta_C (b~_t - gamma))``.  Releasing ``b~_t`` costs privacy too; Theorem 1
  gives the noise on the updates that keeps the pair at the overall noise multiplier ``z``:
  ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``.  The defaults are the paper's: ``eta_C = 0.2``,
  ``sigma_b = m / 20``.

The privacy spent after each round, (epsilon, delta), comes from Google's ``dp-accounting``
library (RDP accountant; install ``fedrun[privacy]``), never from code of fedrun's own:

* ``accounting=fixed_size`` (default), the guarantee for what fedrun does: each round samples
  ``m`` of the ``K`` clients uniformly without replacement, and neighbouring federations differ
  in one client's data (replace-one).  Replacing one client's data moves the sum of clipped
  updates by up to ``2C``, so the Gaussian's noise-to-sensitivity ratio is ``z/2``
  (``SampledWithoutReplacementDpEvent(K, m, GaussianDpEvent(z/2))``; Wang, Balle, Kasiviswanathan,
  AISTATS 2019, Theorem 27);
* ``accounting=poisson``: the analysis of McMahan et al. and Andrew et al., each client in each
  round independently with probability ``q = m/K`` and add-or-remove-one neighbours
  (``PoissonSampledDpEvent(q, GaussianDpEvent(z))``): the epsilon those papers report, for
  comparison under ``hyperparams.sampling=uniform``, whose sampler is not Poisson (not a guarantee
  for the run); the guarantee under ``hyperparams.sampling=poisson``, which samples this way (and
  needs this accounting).

Rounds compose: epsilon after round t is the accountant's for t identical rounds.  The noise is
drawn from ``(seed, round)`` (:func:`fedrun.seeding.torch_generator`) and the adaptive ``C`` is
part of the aggregator's state (so of the checkpoint): a run is reproducible, and a resumed run
equal to an uninterrupted one, byte for byte.

What is private and what is not: the models the server sends (and evaluates) are.  The
diagnostics fedrun records from the clients' raw updates (N, E, update norms, angles,
``dp_clipped_fraction``) are not, nor is anything the server would need raw updates or per-client
state for; :meth:`Privacy.attach` refuses those methods and settings in one line.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import math
from dataclasses import dataclass, replace

import torch

from fedrun.errors import check
from fedrun.models.layers import Layer
from fedrun.models.layers import layers as model_layers
from fedrun.params import Params
from fedrun.seeding import torch_generator
from fedrun.server import reduce as R
from fedrun.server.weighting import base_weighting

ACCOUNTINGS = ("fixed_size", "poisson")
# rounds.csv's columns of a private run (recorder.PRIVACY_COLUMNS).
COLUMNS = ("dp_clip", "dp_clipped_fraction", "dp_noise_std", "dp_epsilon")
# The conf/aggregator options that run privately (tests/test_privacy.py checks this list against
# every YAML): FedAvg's weighted mean, any client-side change and any server transform that reads
# the mean update alone; the personalized methods too, whose kept layers never leave the clients
# (FedBN, FedPer: what they send is clipped; Ditto: its global model is FedAvg's).
SUPPORTED = ("fedavg", "fedprox", "fedlap", "momentum", "fedavgm", "fedadagrad", "fedadam", "fedyogi", "fedbn",
             "fedper", "ditto")
INSTALL = "pip install 'fedrun[privacy]' (Google's dp-accounting, which computes epsilon)"


@dataclass(frozen=True)
class Privacy:
    """The ``privacy`` settings (conf/config.yaml).  ``clip=None`` is off: the run is not private
    and :meth:`attach` returns the aggregator unchanged.

    Args:
      clip: C, the L2 norm each client's update is clipped to (the starting C when adaptive); None: off.
      noise_multiplier: z >= 0: the noise on the sum of clipped updates has standard deviation z C
        (z_Delta C under adaptive clipping, which keeps the overall multiplier at z).
      adaptive_quantile: gamma in [0, 1]: adapt C to this quantile of the update norms (Andrew et
        al.); None: C fixed.
      clip_lr: eta_C > 0, the geometric step of the adaptive C (the paper: 0.2).
      count_noise: sigma_b >= 0, the noise on the count of unclipped updates; None: m/20 (the paper's).
      delta: the delta of the (epsilon, delta) reported, in (0, 1).
      accounting: ``fixed_size`` (fedrun's sampler: m of K without replacement, replace-one
        neighbours) or ``poisson`` (the papers' analysis, for comparison).
    """

    clip: float | None = None
    noise_multiplier: float = 1.0
    adaptive_quantile: float | None = None
    clip_lr: float = 0.2
    count_noise: float | None = None
    delta: float = 1e-5
    accounting: str = "fixed_size"

    def __post_init__(self):
        check(self.clip is None or self.clip > 0, "privacy.clip", self.clip,
              "must be > 0 (the L2 norm each client's update is clipped to), or null for no privacy")
        check(self.noise_multiplier >= 0, "privacy.noise_multiplier", self.noise_multiplier,
              "must be >= 0 (the noise's standard deviation on the sum, in units of privacy.clip)")
        check(self.adaptive_quantile is None or 0 <= self.adaptive_quantile <= 1, "privacy.adaptive_quantile",
              self.adaptive_quantile, "must be in [0, 1] (the share of updates left unclipped), or null for a fixed "
              "clip")
        check(self.adaptive_quantile is None or self.clip is not None, "privacy.adaptive_quantile",
              self.adaptive_quantile, "adapts privacy.clip, which is null (privacy off): set privacy.clip, the "
              "starting C")
        check(self.clip_lr > 0, "privacy.clip_lr", self.clip_lr, "must be > 0 (the adaptive clip's geometric step)")
        check(self.count_noise is None or self.count_noise >= 0, "privacy.count_noise", self.count_noise,
              "must be >= 0, or null for m/20 (Andrew et al.)")
        check(0 < self.delta < 1, "privacy.delta", self.delta, "must be in (0, 1) (choose it below 1/K)")
        check(self.accounting in ACCOUNTINGS, "privacy.accounting", self.accounting,
              f"choose one of: {', '.join(ACCOUNTINGS)}")

    def attach(self, aggregator, federation, participation=None, local=None, centralized: bool = False,
               model: torch.nn.Module | None = None):
        """``aggregator`` run privately (:class:`ClientLevelDP` in its ``privacy`` slot), or as it is
        when ``clip`` is null.  Refuses, in one line naming the setting, what cannot be private:
        a server that reads more than the mean of the updates, n_k weights, server-averaged client
        state, sampling that is not uniform, one learner, and the accountant missing."""
        if self.clip is None:
            return aggregator
        value = self.clip
        check(not centralized, "privacy.clip", value, "client-level privacy needs clients: use mode=federated")
        _refuse_aggregator(aggregator, value)
        if participation is not None:
            check(participation.sampling in ("uniform", "poisson"), "hyperparams.sampling", participation.sampling,
                  "privacy.clip needs sampling=uniform or poisson: the accountant's rate q = m/K is that of a "
                  "uniform or a Poisson sample")
            check(participation.sampling != "poisson" or self.accounting == "poisson", "privacy.accounting",
                  self.accounting, "hyperparams.sampling=poisson draws each client with probability q = m/K: "
                  "its accounting is privacy.accounting=poisson")
        if local is not None:
            check(local.optimizer_state != "average", "hyperparams.optimizer_state", local.optimizer_state,
                  "privacy.clip: the server would average the clients' optimizer states without clipping or "
                  "noise; choose reset or local")
        if model is not None:
            # FedBN keeps its BatchNorm layers, running statistics included, on the clients: nothing to noise.
            # (Ditto's personal models stay too, but its global model is FedAvg's, statistics averaged.)
            personal = aggregator.personal
            own = set() if personal is None or personal.whole_model else set(personal.local_names(
                dict(model.named_parameters()), dict(model.named_buffers()), model_layers(model), strict=False))
            kept = [name for name, b in model.named_buffers() if b.is_floating_point() and name not in own]
            check(not kept, "privacy.clip", value, f"the model keeps running statistics ({kept[0] if kept else ''}"
                  "...), which the server averages from the clients without clipping or noise: choose a model "
                  "without BatchNorm (model.norm=none where the model has it)")
        check(importlib.util.find_spec("dp_accounting") is not None, "privacy.clip", value, f"needs {INSTALL}")
        m = federation.per_round
        sigma_b = m / 20 if self.count_noise is None else self.count_noise
        if self.adaptive_quantile is not None and self.noise_multiplier > 0:
            check(2 * sigma_b > self.noise_multiplier, "privacy.count_noise", sigma_b,
                  f"must exceed privacy.noise_multiplier/2 = {self.noise_multiplier / 2:g} under adaptive "
                  "clipping (Andrew et al. Theorem 1 splits z between the updates and the count; m/20 is the default)")
        dp = ClientLevelDP(self.clip, self.noise_multiplier, self.adaptive_quantile, self.clip_lr, sigma_b,
                           self.delta, self.accounting, federation.num_clients, m)
        return replace(aggregator, privacy=dp)


def _refuse_aggregator(aggregator, value) -> None:
    """One line for a method whose server needs what the noise does not cover."""
    name = aggregator.name
    why = None
    if aggregator.correction is not None:
        why = "its server keeps per-client state built from the raw updates (SCAFFOLD's control variates)"
    elif aggregator.reduce is not R.mean:
        why = "its server takes a coordinate-wise statistic of the raw updates (median, trimmed mean), not their mean"
    elif base_weighting(aggregator.weighting) is None:
        why = "its client weights are computed from the raw updates (angles, Krum's distances, FedNova's local steps)"
    elif getattr(aggregator.server, "reads_stats", False):
        why = "its server step reads E, the mean norm of the raw updates (Norm-Norm's beta E / N)"
    allowed = f"privacy works with aggregator={', '.join(SUPPORTED[:-1])} or {SUPPORTED[-1]}"
    check(why is None, "privacy.clip", value, f"aggregator={name} cannot run privately: {why}; {allowed}")
    weighting = base_weighting(aggregator.weighting)
    check(weighting == "uniform", "aggregator.weighting", weighting,
          "privacy.clip needs aggregator.weighting=uniform: DP-FedAvg counts every client once (sum of clipped "
          "updates / m); n_k weights would let one client's size set its share")


@dataclass(frozen=True)
class ClientLevelDP:
    """DP-FedAvg bound to a federation: :class:`Privacy`'s values (``count_noise`` resolved), K and
    m.  The aggregator calls :meth:`init` and :meth:`aggregate`; the state is ``{"clip": C_t}``."""

    clip: float
    noise_multiplier: float
    adaptive_quantile: float | None
    clip_lr: float
    count_noise: float
    delta: float
    accounting: str
    num_clients: int
    per_round: int

    @property
    def update_noise(self) -> float:
        """The noise multiplier on the sum of the updates: z with a fixed clip; under adaptive
        clipping Andrew et al.'s Theorem 1, ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``, so that the
        updates and the count together have multiplier z."""
        z = self.noise_multiplier
        if self.adaptive_quantile is None or z == 0:
            return z
        return (z ** -2 - (2 * self.count_noise) ** -2) ** -0.5

    def init(self) -> dict:
        """Before round 1: the clip C_0 (a Python float, so the checkpoint keeps it exactly)."""
        return {"clip": float(self.clip)}

    def aggregate(self, state: dict, stacked: Params, norms: torch.Tensor, layers: list[Layer], reduce: R.Reduce,
                  seed: int, round_: int) -> tuple[Params, torch.Tensor, dict, dict]:
        """One round of McMahan et al.'s Algorithm 1 (and Andrew et al.'s Algorithm 1 when adaptive).

        Args:
          state: ``{"clip": C_t}``.
          stacked: the clients' updates ``{name: [m', ...]}`` (m' <= m after drop-outs).
          norms: ``[m']`` float64, ``||dw_k||`` over the whole model (the round's N/E pass made them).
          layers, reduce: the aggregator's; ``reduce`` is the weighted mean.
          seed, round_: the noise's generator keys.

        Returns:
          ``(Delta_t, weights, new state, values)``: the noised mean update, each client's
          coefficient ``min(1, C_t/||dw_k||) / m`` (its weight in clients.csv), ``{"clip": C_{t+1}}``
          and the round's rounds.csv values (:data:`COLUMNS`).
        """
        c = state["clip"]
        m = self.per_round
        # The clip folded into the weights: the weighted mean is sum_k (s_k / m) dw_k with no copy of
        # the updates, and an unclipped client's weight is 1/m to the bit (FedAvg's uniform weight).
        scale = (c / norms).clamp(max=1.0)
        weights = scale / m
        mean = reduce(stacked, weights, layers)
        sigma = self.update_noise * c  # standard deviation of the noise on the sum
        if sigma > 0:
            g = torch_generator(seed, "dp_noise", round_)  # (seed, round): the same noise on resume
            for name, v in mean.items():  # the model's order: fixed
                noise = torch.randn(v.shape, generator=g, dtype=torch.float32)
                mean[name] = v + noise.to(v.device, v.dtype) * (sigma / m)
        unclipped = (norms <= c).to(torch.float64)
        values = {"dp_clip": c, "dp_clipped_fraction": float(1 - unclipped.mean()), "dp_noise_std": sigma,
                  "dp_epsilon": self.epsilon(round_)}
        if self.adaptive_quantile is not None:  # Andrew et al. Algorithm 1, the last two lines
            count = float(unclipped.sum())
            if self.count_noise > 0:
                count += self.count_noise * float(torch.randn(1, generator=torch_generator(seed, "dp_count", round_),
                                                              dtype=torch.float64))
            c = c * math.exp(-self.clip_lr * (count / m - self.adaptive_quantile))
        return mean, weights, {"clip": c}, values

    def summary(self) -> dict:
        """``summary.json``'s fixed values of a private run (its ``dp_epsilon``, the last round's,
        comes from rounds.csv beside them)."""
        return {"dp_delta": self.delta, "dp_accounting": self.accounting, "dp_noise_multiplier": self.noise_multiplier}

    def epsilon(self, rounds: int) -> float:
        """Epsilon at :attr:`delta` after ``rounds`` rounds (:func:`epsilon`)."""
        return epsilon(rounds, self.noise_multiplier, self.num_clients, self.per_round, self.delta, self.accounting)


# ----------------------------------------------------------------------------- the accountant

@contextlib.contextmanager
def _quiet_absl():
    """dp-accounting logs, through absl, each RDP order whose series does not converge and that it
    leaves out of the bound (documented behaviour); once per order is noise on a run's console."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _event(noise_multiplier: float, num_clients: int, per_round: int, accounting: str):
    """One round as a dp-accounting event, and the neighbouring relation it is analysed under."""
    import dp_accounting

    rel = dp_accounting.NeighboringRelation
    if noise_multiplier == 0:  # no noise: no finite epsilon
        return dp_accounting.NonPrivateDpEvent(), rel.ADD_OR_REMOVE_ONE
    if accounting == "poisson":
        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
        return dp_accounting.PoissonSampledDpEvent(per_round / num_clients, gaussian), rel.ADD_OR_REMOVE_ONE
    # Replace-one: the sum of clipped updates moves by up to 2C, so noise z C is z/2 sensitivities.
    return (dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round,
                                                           dp_accounting.GaussianDpEvent(noise_multiplier / 2)),
            rel.REPLACE_ONE)


@functools.lru_cache(maxsize=64)
def round_rdp(noise_multiplier: float, num_clients: int, per_round: int, accounting: str):
    """dp-accounting's RDP accountant after one round: ``(orders, rdp)``, its default orders.
    Computed once per setting (the subsampled Gaussian's series take a fraction of a second)."""
    from dp_accounting.rdp import RdpAccountant

    event, relation = _event(noise_multiplier, num_clients, per_round, accounting)
    accountant = RdpAccountant(neighboring_relation=relation)
    with _quiet_absl():
        accountant.compose(event)
    return accountant.orders, accountant.rdp


def epsilon(rounds: int, noise_multiplier: float, num_clients: int, per_round: int, delta: float,
            accounting: str = "fixed_size") -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds of DP-FedAvg, from dp-accounting's RDP
    accountant: the RDP of ``rounds`` identical rounds is ``rounds`` times one round's (the
    accountant's own composition, ``RdpAccountant.compose(event, count)``), converted by
    ``rdp_privacy_accountant.compute_epsilon``.  ``inf`` without noise."""
    from dp_accounting.rdp import rdp_privacy_accountant

    orders, rdp = round_rdp(float(noise_multiplier), int(num_clients), int(per_round), accounting)
    with _quiet_absl():
        eps, _ = rdp_privacy_accountant.compute_epsilon(orders, rounds * rdp, delta)
    return float(eps)
