"""Batch Normalization and Batch Renormalization whose running statistics average across clients.

The parameter-divergence paper (footnote 8, Appendix C.5) runs Batch Normalization under FedAvg
by letting every learner k keep, beside the moving mean E[phi]_k, the moving second moment
E[phi^2]_k; the server then takes the moving variance as

    Var[phi] = (1/K) sum_k E[phi^2]_k - E[phi]^2,   E[phi] = (1/K) sum_k E[phi]_k

("a federated version of distributed Batch Normalization").  Averaging PyTorch's ``running_var``
instead would drop the spread of the clients' means, which is large under non-IID data (each
learner sees 1 or 2 classes): the averaged variance would underestimate the population's.

The modules here therefore keep the buffers ``running_mean`` (moving E[phi]) and ``running_sq``
(moving E[phi^2]) and evaluate with ``running_sq - running_mean^2``.  fedrun's server averages
every float buffer with the client weights p_k (:func:`fedrun.server.aggregator.average_buffers`), so
no server-side code is needed: with p_k = n_k / n (or 1/K for equal n_k, the paper's setting)
the averaged buffers give exactly footnote 8's variance, i.e. the variance of the pooled
activations when each client's buffers hold one batch's statistics (``tests/test_pd_nets.py``).
There is no ``num_batches_tracked`` (the moving averages use a fixed rate).
:class:`BatchRenorm` adds TensorFlow's renorm statistics (``renorm_mean``, ``renorm_stddev`` and
their scalar debiasing weights), float buffers that the server averages the same way, and
updates ``running_mean``/``running_sq`` as TF updates its moving mean and variance under
renorm (see its docstring).

Conventions (both modules):

* ``momentum`` is PyTorch's: ``running = (1 - momentum) running + momentum batch``.  The
  default 0.01 is TensorFlow's ``decay = 0.99`` (``tf.layers``/Keras BatchNormalization; the
  paper's code is TensorFlow) and equals the paper's Batch Renormalization rate alpha = 0.01
  (Appendix C.5).  With 5000 examples at B = 50 a learner takes 100 steps a round, so one
  round's statistics weigh 1 - 0.99^100 = 63% of the moving averages.
* ``eps = 1e-3``, TensorFlow's default, added to variances before the square root.
* Training normalizes with the batch mean and the biased batch variance (Ioffe & Szegedy 2015,
  Alg. 1); E[phi^2]_batch = var_batch + mean_batch^2.  Evaluation uses the moving statistics.
  For :class:`FederatedBatchNorm`, ``running_sq - running_mean^2`` estimates the variance of
  all activations seen (within-batch plus between-batch spread, law of total variance), not the
  mean batch variance; :class:`BatchRenorm`'s is TF's moving variance (of the debiased renorm
  standard deviations), to which only the server's averaging adds the clients' spread.
* The running statistics are updated in place (``mul_``/``add_`` under ``no_grad``), so the
  modules also run under ``torch.func.functional_call`` + ``vmap`` with stacked per-client
  buffers, as :mod:`fedrun.client.batched` runs them.
* Channels are dimension 1; the statistics are over every other dimension (N, or N, H, W).
"""
from __future__ import annotations

import torch
from torch import nn


class FederatedBatchNorm(nn.Module):
    """Batch Normalization with ``running_mean``/``running_sq`` buffers (footnote 8).

    Training (Ioffe & Szegedy 2015, Alg. 1)::

        mu_B = mean(x),  var_B = mean((x - mu_B)^2)
        y = gamma (x - mu_B) / sqrt(var_B + eps) + beta
        running_mean <- (1 - momentum) running_mean + momentum mu_B
        running_sq   <- (1 - momentum) running_sq   + momentum (var_B + mu_B^2)

    Evaluation: ``y = gamma (x - running_mean) / sqrt(running_sq - running_mean^2 + eps) + beta``.

    Args:
      num_features: channels C (dimension 1 of the input).
      eps: added to the variance (TensorFlow's default 1e-3).
      momentum: the moving-average rate, PyTorch's convention (0.01 = TF decay 0.99).
      affine: learn the scale gamma (``weight``, init 1) and shift beta (``bias``, init 0).
    """

    def __init__(self, num_features: int, eps: float = 1e-3, momentum: float = 0.01, affine: bool = True):
        super().__init__()
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum={momentum}: must be in (0, 1]")
        self.num_features, self.eps, self.momentum, self.affine = num_features, eps, momentum, affine
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_sq", torch.ones(num_features))  # E[phi^2]: variance 1 at start

    def reset_running_stats(self) -> None:
        self.running_mean.zero_()
        self.running_sq.fill_(1.0)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    @property
    def running_var(self) -> torch.Tensor:
        """The evaluation variance ``running_sq - running_mean^2`` (clamped at 0 against rounding)."""
        return (self.running_sq - self.running_mean * self.running_mean).clamp_min(0)

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    @staticmethod
    def _shape(x: torch.Tensor) -> tuple:
        """Per-channel statistics broadcast as (1, C, 1, ...)."""
        return (1, -1) + (1,) * (x.dim() - 2)

    @staticmethod
    def _batch_stats(x: torch.Tensor, shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        dims = [0, *range(2, x.dim())]
        mean = x.mean(dims)
        var = (x - mean.view(shape)).pow(2).mean(dims)  # biased, as Alg. 1 normalizes with
        return mean, var

    def _update(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        """In-place moving averages of E[phi] and E[phi^2] (works on vmapped per-client buffers)."""
        with torch.no_grad():
            m = self.momentum
            mean, var = mean.detach(), var.detach()
            self.running_mean.mul_(1 - m).add_(mean, alpha=m)
            self.running_sq.mul_(1 - m).add_(var + mean * mean, alpha=m)

    def _affine(self, x_hat: torch.Tensor, shape: tuple) -> torch.Tensor:
        if not self.affine:
            return x_hat
        return x_hat * self.weight.view(shape) + self.bias.view(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        shape = self._shape(x)
        if self.training:
            mean, var = self._batch_stats(x, shape)
            self._update(mean, var)
        else:
            mean, var = self.running_mean, self.running_var
        x_hat = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        return self._affine(x_hat, shape)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class BatchRenorm(FederatedBatchNorm):
    """Batch Renormalization (Ioffe 2017) as TensorFlow 1.13 runs it, with footnote 8's moving variance.

    The paper's code (fl-noniid/fl-noniid @ 973ff66, ``fl_noniid.py`` l. 603-607) calls
    ``tf.layers.batch_normalization(out, training=is_train, renorm=True, renorm_clipping={'rmax':
    2.0, 'rmin': 0.5, 'dmax': 2.0})`` on TF 1.13.1 (its README): momentum = renorm_momentum = 0.99
    (here ``momentum = renorm_momentum = 0.01``, PyTorch's convention), epsilon = 1e-3, constant
    clipping.  TF's layer (``tensorflow/python/keras/layers/normalization.py`` of the 1.13.1
    wheel) keeps, beside the inference statistics ``moving_mean``/``moving_variance``, the
    renorm statistics ``renorm_mean``, ``renorm_stddev`` and their scalar weights
    ``renorm_mean_weight``, ``renorm_stddev_weight``, all zero-initialized (l. 385-407).  These
    are the buffers of the same names here.  One training step, with alpha = ``renorm_momentum``,
    m = ``momentum``, every buffer on the right its value *before* the step (l. 484-548)::

        mu_B = mean(x),  var_B = mean((x - mu_B)^2),  sigma_B = sqrt(var_B + eps)       (l. 486, 624)
        mu_mix    = renorm_mean   + (1 - renorm_mean_weight)   mu_B                   (l. 489-492)
        sigma_mix = renorm_stddev + (1 - renorm_stddev_weight) sigma_B
        r = stop_gradient(clip(sigma_B / sigma_mix, 1 / r_max, r_max))               (l. 494-508)
        d = stop_gradient(clip((mu_B - mu_mix) / sigma_mix, -d_max, d_max))
        y = gamma ((x - mu_B) / sigma_B r + d) + beta                                  (l. 649-656, 683)

        renorm_mean   <- (1 - alpha) renorm_mean   + alpha mu_B     (l. 515-544, with l. 414-430:
        renorm_stddev <- (1 - alpha) renorm_stddev + alpha sigma_B   var -= (var - value)(1 - decay))
        renorm_*_weight <- (1 - alpha) renorm_*_weight + alpha      (so weight_t = 1 - (1 - alpha)^t)
        mu_hat = renorm_mean / renorm_mean_weight                   (new values: the debiased EMAs,
        sigma_hat = renorm_stddev / renorm_stddev_weight             l. 534)
        moving_mean     <- (1 - m) moving_mean     + m mu_hat                        (l. 658-671)
        moving_variance <- (1 - m) moving_variance + m (sigma_hat^2 - eps)           (l. 546)

    The mixed statistics are "the moving averages as if initialized with this batch's moments":
    while the weights are 0 (the first step) mu_mix = mu_B and sigma_mix = sigma_B, so r = 1,
    d = 0 and the step is plain Batch Normalization; r and d are *not* computed from the debiased
    EMAs (those feed only the inference statistics).  Evaluation is Batch Normalization with the
    inference statistics, ``y = gamma (x - moving_mean) / sqrt(moving_variance + eps) + beta``
    (TF: "the inference is the same for either value of [renorm]").

    Federated averaging, as in the paper's code: the server plainly averages every variable
    (``fl_noniid.py`` l. 333-345, run at l. 504; sent back to the learners, l. 347-363 and
    529-536), the renorm statistics and their weights included, then overwrites only the
    global model's moving variance with
    ``mean_k(moving_variance_k + moving_mean_k^2) - (mean_k moving_mean_k)^2`` (l. 307-318,
    365-383, run at l. 505).  As :class:`FederatedBatchNorm`, this module stores the inference
    statistics as ``running_mean`` = moving_mean and ``running_sq`` = moving_variance +
    moving_mean^2, so fedrun's weighted average of every float buffer
    (:func:`fedrun.server.aggregator.average_buffers`) yields exactly that variance, and the renorm
    buffers (float, weights included) are averaged like TF's.  The TF update of moving_mean and
    moving_variance above is carried over exactly to that storage::

        running_mean <- (1 - m) running_mean + m mu_hat
        running_sq   <- (1 - m) running_sq + m (sigma_hat^2 - eps + mu_hat^2)
                        - m (1 - m) (running_mean_old - mu_hat)^2

    (= new moving_variance + new moving_mean^2, written without the cancellation of
    ``running_sq - running_mean^2``).  Initial state: moving mean 0, moving variance 1
    (``running_sq`` = 1), renorm buffers and weights 0, as TF's initializers.

    Args:
      num_features, eps, momentum, affine: as :class:`FederatedBatchNorm`; ``momentum`` is the
        rate of the inference statistics (TF's ``1 - momentum``).
      r_max, d_max: the clipping, r in [1 / r_max, r_max] and d in [-d_max, d_max] (the paper's
        2 and 2, fixed throughout training; Appendix C.5, footnote 12).  ``r_max = 1, d_max = 0``
        gives Batch Normalization's outputs (the buffers still move as above).
      renorm_momentum: the rate alpha of the renorm statistics (TF's ``1 - renorm_momentum``);
        None (default) takes ``momentum``, as TF's defaults (both 0.99) do.
    """

    def __init__(self, num_features: int, eps: float = 1e-3, momentum: float = 0.01, affine: bool = True,
                 r_max: float = 2.0, d_max: float = 2.0, renorm_momentum: float | None = None):
        super().__init__(num_features, eps, momentum, affine)
        if r_max < 1 or d_max < 0:
            raise ValueError(f"r_max={r_max}, d_max={d_max}: need r_max >= 1 and d_max >= 0")
        renorm_momentum = momentum if renorm_momentum is None else renorm_momentum
        if not 0 < renorm_momentum <= 1:
            raise ValueError(f"renorm_momentum={renorm_momentum}: must be in (0, 1]")
        self.r_max, self.d_max, self.renorm_momentum = r_max, d_max, renorm_momentum
        self.register_buffer("renorm_mean", torch.zeros(num_features))
        self.register_buffer("renorm_mean_weight", torch.zeros(()))
        self.register_buffer("renorm_stddev", torch.zeros(num_features))
        self.register_buffer("renorm_stddev_weight", torch.zeros(()))

    def reset_running_stats(self) -> None:
        super().reset_running_stats()
        for buffer in (self.renorm_mean, self.renorm_mean_weight, self.renorm_stddev, self.renorm_stddev_weight):
            buffer.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        self._check_input_dim(x)
        shape = self._shape(x)
        mean, var = self._batch_stats(x, shape)
        sigma_b = torch.sqrt(var + self.eps)
        with torch.no_grad():  # r, d and every buffer update are constants for the gradient
            mu_b, s_b = mean.detach(), sigma_b.detach()
            # r and d from the pre-update renorm statistics, mixed with this batch's (TF l. 489-508).
            mu_mix = self.renorm_mean + (1 - self.renorm_mean_weight) * mu_b
            sigma_mix = self.renorm_stddev + (1 - self.renorm_stddev_weight) * s_b
            r = (s_b / sigma_mix).clamp(1 / self.r_max, self.r_max)
            d = ((mu_b - mu_mix) / sigma_mix).clamp(-self.d_max, self.d_max)
            # Renorm EMAs and weights, in place (per-client buffers under vmap), then debiased.
            a = self.renorm_momentum
            self.renorm_mean.mul_(1 - a).add_(mu_b, alpha=a)
            self.renorm_mean_weight.mul_(1 - a).add_(a)
            self.renorm_stddev.mul_(1 - a).add_(s_b, alpha=a)
            self.renorm_stddev_weight.mul_(1 - a).add_(a)
            mu_hat = self.renorm_mean / self.renorm_mean_weight
            sigma_hat = self.renorm_stddev / self.renorm_stddev_weight
            # Inference statistics: TF's moving_mean/moving_variance update, stored as E[phi], E[phi^2].
            m = self.momentum
            shift = self.running_mean - mu_hat
            self.running_sq.mul_(1 - m).add_(sigma_hat * sigma_hat - self.eps + mu_hat * mu_hat, alpha=m)
            self.running_sq.sub_(shift * shift, alpha=m * (1 - m))
            self.running_mean.mul_(1 - m).add_(mu_hat, alpha=m)
        x_hat = (x - mean.view(shape)) / sigma_b.view(shape) * r.view(shape) + d.view(shape)
        return self._affine(x_hat, shape)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, r_max={self.r_max}, d_max={self.d_max}, "
                f"renorm_momentum={self.renorm_momentum}")


def _dim_check(expected: tuple[int, ...], label: str):
    def check(self, x: torch.Tensor) -> None:
        if x.dim() not in expected:
            raise ValueError(f"expected {label} input (got {x.dim()}D input)")
    return check


class FederatedBatchNorm1d(FederatedBatchNorm):
    """:class:`FederatedBatchNorm` on (N, C) or (N, C, L) inputs (after FC layers)."""

    _check_input_dim = _dim_check((2, 3), "2D or 3D")


class FederatedBatchNorm2d(FederatedBatchNorm):
    """:class:`FederatedBatchNorm` on (N, C, H, W) inputs (after conv layers)."""

    _check_input_dim = _dim_check((4,), "4D")


class BatchRenorm1d(BatchRenorm):
    """:class:`BatchRenorm` on (N, C) or (N, C, L) inputs (after FC layers)."""

    _check_input_dim = _dim_check((2, 3), "2D or 3D")


class BatchRenorm2d(BatchRenorm):
    """:class:`BatchRenorm` on (N, C, H, W) inputs (after conv layers)."""

    _check_input_dim = _dim_check((4,), "4D")
