"""Aggregators: the server side of a method, FedJAX-shaped.

An :class:`Aggregator` is six parts and a choice:

* a client-weighting rule (:mod:`fedrun.server.weighting`): ``examples`` (``n_k / n``), ``uniform``
  (``1 / m``, what FedNNNN uses in its unbalanced runs, sec. 5.1), FedAdp/FedLayerWise's angle
  rules, or Krum's pairwise rule (it reads the round's Gram matrices);
* a reduce (:mod:`fedrun.server.reduce`) that turns the stacked client updates and the rule's weights
  into the mean update: the weighted mean (default), or the coordinate-wise median or trimmed mean;
* a chain of server transforms (:mod:`fedrun.server.transforms`) applied to the mean update;
* an optional client regularizer (:mod:`fedrun.client.regularizers`): FedProx, FedLap;
* an optional client correction (:mod:`fedrun.server.corrections`): per-client state across rounds that
  the regularizer reads (SCAFFOLD's control variates);
* an optional personalization (:mod:`fedrun.server.personal`): what each client keeps of its own
  across rounds, and the personal model it is scored with (FedBN, FedPer, Ditto);
* which model is evaluated (below).

The machine itself, :class:`~fedrun.server.aggregator.Aggregator`, is in :mod:`fedrun.server`;
this module is the catalog of methods.  It is used as two pure functions over one state, as in
FedJAX::

    state = aggregator.init(params, num_clients, layers)
    outcome, state = aggregator.apply(state, params, client_results)

The state is data (a dict of tensors, lists and strings: the transforms' state, the weighting
rule's state, the layer grouping and a correction's state), so a checkpoint is that dict.  The
factories below are the methods; each YAML file in ``conf/aggregator/`` names one of them as its
``_target_``.  A new server-side method is one transform, reduce or weighting rule (or existing
ones), one factory, one YAML.

FedNNNN keeps two models (sec. 4.1): the *average-aggregated* model ``w_t + sum_k p_k dw_k``
(``w_t + reduce(...)`` in general: the median's or Krum's choice for the robust methods),
"capable of performing highly-accurate inference", and the *normalized* model ``w_t + d_{t+1}``
that is sent to clients, whose own accuracy "remains extremely poor".  ``evaluate`` picks which
one the ``test_acc`` column reports (``average``, the paper's choice, or ``sent``); the other
model's accuracy is recorded as ``sent_test_acc`` whenever the two differ.
"""
from __future__ import annotations

import math

from fedrun.client.regularizers import ControlVariate, LayerAdaptive, Proximal
from fedrun.errors import check
from fedrun.server import reduce as R
from fedrun.server import transforms as T
from fedrun.server.aggregator import Aggregator
from fedrun.server.corrections import control_variates
from fedrun.server.personal import Personalization
from fedrun.server.weighting import angle_rule, base_rule, equal_rule, krum_rule, nova_rule


def fedavg(weighting: str = "examples") -> Aggregator:
    """FedAvg (McMahan et al.; Nagura et al. eq. 1): ``w_{t+1} = sum_k (n_k/n) w_k``."""
    return Aggregator("fedavg", T.identity(), base_rule(weighting))


def fedprox(mu: float = 0.01, weighting: str = "examples") -> Aggregator:
    """FedProx (Li et al.; Nagura et al. eq. 7): FedAvg with ``mu/2 ||w - w_t||^2`` on clients."""
    return Aggregator("fedprox", T.identity(), base_rule(weighting), Proximal(mu))


def normnorm(beta: float = 1.0, weighting: str = "examples", evaluate: str = "average",
             eps: float = 1e-6) -> Aggregator:
    """Norm-Norm (Nagura et al. eq. 8): the mean update rescaled to norm ``beta * E``."""
    return Aggregator("normnorm", T.normalize_norm(beta, eps), base_rule(weighting), None, evaluate)


def momentum(gamma: float = 0.9, weighting: str = "examples", evaluate: str = "average") -> Aggregator:
    """Server momentum (Nagura et al. eq. 10-11): ``d = gamma d + mean update``, ``w += d``."""
    return Aggregator("momentum", T.momentum(gamma), base_rule(weighting), None, evaluate)


def fednnnn(beta: float = 0.7, gamma: float = 0.8, weighting: str = "examples",
            evaluate: str = "average", eps: float = 1e-6) -> Aggregator:
    """FedNNNN (Nagura et al. eq. 12-13): normalization then momentum,
    ``d_{t+1} = gamma d_t + beta (E/N) sum_k p_k dw_k``, ``w_{t+1} = w_t + d_{t+1}``."""
    chain = T.chain(T.normalize_norm(beta, eps), T.momentum(gamma))
    return Aggregator("fednnnn", chain, base_rule(weighting), None, evaluate)


# ----------------------------------------------------------------------------- angle weighting

def fedadp(alpha: float = 5.0, gompertz: str = "decreasing", weighting: str = "examples") -> Aggregator:
    """FedAdp (Wu & Wang): client weights ``softmax(n_k e^{f(smoothed angle_k)})`` (FedLayerWise
    eq. 4-6 applied to the whole model), ``w_{t+1} = w_t + sum_k psi_k dw_k``."""
    return Aggregator("fedadp", T.identity(), angle_rule(alpha, gompertz, per_layer=False, weighting=weighting))


def fedlayerwise(alpha: float = 5.0, gompertz: str = "decreasing", weighting: str = "examples") -> Aggregator:
    """FedLayerWise (Lanjewar et al. eq. 1-7): FedAdp's weights computed per layer,
    ``w_l(t) = sum_k psi_{k,l} w_{k,l}``."""
    return Aggregator("fedlayerwise", T.identity(), angle_rule(alpha, gompertz, per_layer=True, weighting=weighting))


# ----------------------------------------------------------------------------- layer-wise regularization

def fedlap(q: float = 0.5, form: str = "linear", weighting: str = "examples", vectors: str = "fan_out") -> Aggregator:
    """FedLap (Charteros & Koutsopoulos eq. 10): FedAvg with the layer-wise regularizer
    ``q/2 sum_l <lambda_l, d_l>`` on clients (:class:`fedrun.client.regularizers.LayerAdaptive`): eq. 10
    as printed at q = 1, half of it at the default q = 0.5 (``form=linear``); per-neuron vectors
    the fan-out of eq. 5-8 (``vectors=fan_out``) or the fan-in (``fan_in``)."""
    return Aggregator("fedlap", T.identity(), base_rule(weighting), LayerAdaptive(q, form, vectors))


# ----------------------------------------------------------------------------- client drift (NIID-Bench's baselines)

def scaffold(eta_g: float = 1.0, weighting: str = "examples", evaluate: str = "sent",
             correction: str = "gradient") -> Aggregator:
    """SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020, Algorithm 1, option II).

    Every client k keeps a control variate ``c_k`` and the server one, ``c``, zero at the start and
    kept across rounds for every client, sampled or not (:func:`fedrun.server.corrections.control_variates`,
    part of the aggregator's state and so of the checkpoint).  A round:

    * line 10, each client's local step: ``y <- y - eta_l (g_k(y) - c_k + c)``, the linear penalty
      ``<c - c_k, y - x>`` added to its loss (:class:`fedrun.client.regularizers.ControlVariate`);
    * line 12, option II: ``c_k+ = c_k - c + (x - y_k) / (K_k eta_l)`` (K_k eta_l read as
      ``eta_l ||a_k||_1`` under client momentum);
    * lines 16-17: ``x <- x + eta_g sum_k p_k (y_k - x)`` and ``c <- c + |S|/N mean_k (c_k+ - c_k)``.

    The paper averages the model updates with ``1/|S|`` (``weighting=uniform``); the default
    ``examples`` (``n_k / n``) is NIID-Bench's, as for FedAvg.  With ``eta_g = 1`` the server step is
    the mean update (one model, as FedAvg's), and round 1 (all control variates 0) is FedAvg's round.

    Args:
      eta_g: the global step size eta_g, > 0 (the paper: 1).
      weighting: ``examples`` (``n_k / n``) or ``uniform`` (``1/|S|``, Algorithm 1).
      evaluate: with ``eta_g != 1``, which model ``test_acc`` reports: ``sent`` (the server's x) or
        ``average`` (``x + mean update``).
      correction: how line 10's correction meets client momentum (Algorithm 1 has plain SGD, where
        the two agree): ``gradient`` (the corrected gradient ``g - c_k + c`` goes through the
        optimizer, and option II divides by ``eta_l ||a_k||_1``) or ``after_step`` (NIID-Bench's
        code: the optimizer steps on ``g``, then ``y <- y - eta_l (c - c_k)``, and option II divides
        by ``eta_l K_k``; docs/decisions.md).
    """
    check(isinstance(eta_g, (int, float)) and not isinstance(eta_g, bool) and math.isfinite(eta_g) and eta_g > 0,
          "aggregator.eta_g", eta_g, "must be a finite number > 0 (SCAFFOLD's global step size; the paper: 1)")
    check(correction in ControlVariate.CORRECTIONS, "aggregator.correction", correction,
          f"must be one of {', '.join(ControlVariate.CORRECTIONS)} (gradient: through the client optimizer, "
          "Algorithm 1; after_step: after each optimizer step, NIID-Bench's code)")
    server = T.identity() if eta_g == 1 else T.scale(eta_g, "aggregator.eta_g")
    return Aggregator("scaffold", server, base_rule(weighting), ControlVariate(correction), evaluate,
                      correction=control_variates(counted=correction == "after_step"), client_optimizers=("sgd",))


def fednova(weighting: str = "examples") -> Aggregator:
    """FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): normalized averaging,

        x_{t+1} = x_t - tau_eff sum_k p_k d_k,   d_k = (x_t - y_k) / ||a_k||_1,   tau_eff = sum_k p_k ||a_k||_1,

    i.e. ``w_t + sum_k (tau_eff p_k / ||a_k||_1) dw_k`` (:func:`fedrun.server.weighting.nova_rule`), with
    ``||a_k||_1`` client k's local steps tau_k (plain SGD) or ``sum_{j<=tau_k} (1 - rho^j)/(1 - rho)``
    under client momentum rho (``hyperparams.momentum``).  It matters where clients take different
    numbers of steps (unequal data sizes, stragglers' local epochs); with equal steps it is FedAvg.
    The clients' weights in ``clients.csv`` are ``tau_eff p_k / ||a_k||_1`` (their sum is >= 1).

    Args:
      weighting: ``p_k``: ``examples`` (``n_k / n``, the paper's and NIID-Bench's) or ``uniform``.
    """
    return Aggregator("fednova", T.identity(), nova_rule(weighting), client_optimizers=("sgd",))


# ----------------------------------------------------------------------------- FedOpt (Reddi et al., ICLR 2021)
# The server's model x_{t+1} is the model these methods evaluate (``evaluate="sent"``): with a
# server learning rate or adaptive scaling, ``w_t + mean update`` is not a model the method has.

def fedavgm(server_lr: float = 1.0, beta1: float = 0.9, weighting: str = "examples",
            evaluate: str = "sent") -> Aggregator:
    """FedAvgM (Hsu et al. 2019; Reddi et al. sec. 5): server SGD with momentum on the mean update,
    ``m_t = beta1 m_{t-1} + Delta_t``, ``x_{t+1} = x_t + eta m_t``.  At ``server_lr = 1`` it is
    FedNNNN's server Momentum (eq. 10-11) with ``gamma = beta1``."""
    chain = T.chain(T.momentum(beta1, "aggregator.beta1"), T.scale(server_lr))
    return Aggregator("fedavgm", chain, base_rule(weighting), None, evaluate)


def _fedopt(name: str, adaptive: T.ServerTransform, server_lr: float, weighting: str, evaluate: str) -> Aggregator:
    """Algorithm 2's direction ``m_t / (sqrt(v_t) + tau)``, then the server learning rate ``eta``."""
    return Aggregator(name, T.chain(adaptive, T.scale(server_lr)), base_rule(weighting), None, evaluate)


def fedadagrad(server_lr: float = 0.1, beta1: float = 0.9, tau: float = 1e-3, weighting: str = "examples",
               evaluate: str = "sent") -> Aggregator:
    """FedAdagrad (Reddi et al. Algorithm 2): ``v_t = v_{t-1} + Delta_t^2``,
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)`` (:func:`fedrun.server.transforms.adagrad`)."""
    return _fedopt("fedadagrad", T.adagrad(beta1, tau), server_lr, weighting, evaluate)


def fedadam(server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
            weighting: str = "examples", evaluate: str = "sent") -> Aggregator:
    """FedAdam (Reddi et al. Algorithm 2): ``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2``,
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)`` (:func:`fedrun.server.transforms.adam`)."""
    return _fedopt("fedadam", T.adam(beta1, beta2, tau), server_lr, weighting, evaluate)


def fedyogi(server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
            weighting: str = "examples", evaluate: str = "sent") -> Aggregator:
    """FedYogi (Reddi et al. Algorithm 2):
    ``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``,
    ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)`` (:func:`fedrun.server.transforms.yogi`)."""
    return _fedopt("fedyogi", T.yogi(beta1, beta2, tau), server_lr, weighting, evaluate)


# ----------------------------------------------------------------------------- Byzantine-robust aggregation
# The server replaces the weighted mean by a statistic that a few arbitrary (Byzantine) updates
# cannot drag far: a coordinate-wise median or trimmed mean (a reduce, fedrun.server.reduce), or Krum's
# choice of the update closest to the others (a pairwise weighting rule, fedrun.server.weighting).  The
# model is w_t + that statistic, sent and evaluated alike (identity server transform).

def median(weighting: str = "examples", weighted: bool = False) -> Aggregator:
    """Coordinate-wise median (Yin, Chen, Ramchandran, Bartlett, ICML 2018, Definition 1):
    ``w_{t+1,j} = w_{t,j} + med_k dw_{k,j}`` for every coordinate j (:func:`fedrun.server.reduce.median`).

    Args:
      weighting: the base weights of N, E and the BatchNorm statistics: ``examples`` or ``uniform``.
      weighted: take the weighted median with the base weights (default: every client counts once,
        the paper's median; the clients' recorded weights are then ``1/m``).
    """
    rule = base_rule(weighting) if weighted else equal_rule(weighting)
    return Aggregator("median", T.identity(), rule, reduce=R.median(weighted))


def trimmed_mean(beta: float = 0.1, weighting: str = "examples", weighted: bool = False) -> Aggregator:
    """Coordinate-wise beta-trimmed mean (Yin et al. 2018, Definition 2): for every coordinate j,
    ``w_{t+1,j} = w_{t,j} + 1/((1 - 2 beta) m) sum_{x in U_j} x``, ``U_j`` the m values
    ``dw_{k,j}`` less the ``floor(beta m)`` largest and smallest (:func:`fedrun.server.reduce.trimmed_mean`).

    Args:
      beta: the fraction trimmed at each end, in [0, 0.5) (0: the plain mean).
      weighting: the base weights of N, E and the BatchNorm statistics: ``examples`` or ``uniform``.
      weighted: the weighted trimmed mean with the base weights (default: every client counts once).
    """
    rule = base_rule(weighting) if weighted else equal_rule(weighting)
    return Aggregator("trimmed_mean", T.identity(), rule, reduce=R.trimmed_mean(beta, weighted))


def krum(f: int = 1, multi: int = 1, weighting: str = "examples") -> Aggregator:
    """Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017, sec. 4-5).

    Each update's score is ``s(i) = sum_{i -> j} ||dw_i - dw_j||^2`` over its ``m - f - 2`` nearest
    others; Krum's model is ``w_t + dw_{i*}``, ``i* = argmin_i s(i)``; Multi-Krum's is ``w_t`` plus
    the mean of the ``multi`` updates of lowest score (:func:`fedrun.server.weighting.krum_rule`: one-hot or
    ``1/multi`` weights from the round's Gram matrices, then the weighted mean).

    Args:
      f: the number of Byzantine clients assumed, >= 0; every round needs m > 2f + 2 clients.
      multi: how many lowest-scoring updates to average, >= 1 (1: Krum).
      weighting: the base weights of N, E and the BatchNorm statistics: ``examples`` or ``uniform``.
    """
    return Aggregator("krum", T.identity(), krum_rule(f, multi, weighting))


# ----------------------------------------------------------------------------- personalized FL
# Every client keeps part of a model (or a whole one) of its own across rounds, in the aggregator's
# state and the checkpoint (fedrun.server.personal); its personal model is what clients.csv's
# pers_* scores and rounds.csv's pers_acc_* columns report, on each client's own test data.

def fedbn(weighting: str = "examples") -> Aggregator:
    """FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, Algorithm 1): FedAvg over every parameter but
    the BatchNorm layers', which each client keeps (scale, shift and running statistics),
    ``w_{t+1} = w_t + sum_k p_k dw_k`` outside them.  Needs a model with BatchNorm."""
    return Aggregator("fedbn", T.identity(), base_rule(weighting), personal=Personalization("fedbn"))


def fedper(local_layers: int = 1, weighting: str = "examples") -> Aggregator:
    """FedPer (Arivazhagan, Aggarwal, Singh, Choudhary 2019, sec. 3): the base layers averaged as in
    FedAvg, the last ``local_layers`` layers (the personalization layers) kept by each client."""
    return Aggregator("fedper", T.identity(), base_rule(weighting),
                      personal=Personalization("fedper", local_layers=local_layers))


def ditto(lam: float = 1.0, personal_epochs: int | None = None, weighting: str = "examples") -> Aggregator:
    """Ditto (Li, Hu, Beirami, Smith, ICML 2021, Algorithm 1): the global model is FedAvg's, and each
    sampled client k also trains its personal model on the regularized objective of eq. 2,
    ``min_v F_k(v) + lambda/2 ||v - w_t||^2``: ``personal_epochs`` local epochs of
    ``v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w_t))`` from its kept ``v_k`` (line 7;
    ``v_k`` starts as ``w_0``), with the clients' optimizer, batch size and learning rate.

    Args:
      lam: lambda >= 0 (0: local models only; the paper tunes it over {0.05, 0.1, 0.2, 0.5, 1, 2, 5}).
      personal_epochs: local epochs of the personal step (None: ``hyperparams.local_epochs``).
      weighting: the global model's FedAvg weights, ``examples`` or ``uniform``.
    """
    return Aggregator("ditto", T.identity(), base_rule(weighting),
                      personal=Personalization("ditto", lam=lam, epochs=personal_epochs))
