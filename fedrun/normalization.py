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
every float buffer with the client weights p_k (:func:`fedrun.aggregators.average_buffers`), so
no server-side code is needed: with p_k = n_k / n (or 1/K for equal n_k, the paper's setting)
the averaged buffers give exactly footnote 8's variance, i.e. the variance of the pooled
activations when each client's buffers hold one batch's statistics (``tests/test_nets.py``).
There is no ``num_batches_tracked`` (the moving averages use a fixed rate).

Conventions (both modules):

* ``momentum`` is PyTorch's: ``running = (1 - momentum) running + momentum batch``.  The
  default 0.01 is TensorFlow's ``decay = 0.99`` (``tf.layers``/Keras BatchNormalization; the
  paper's code is TensorFlow) and equals the paper's Batch Renormalization rate alpha = 0.01
  (Appendix C.5).  With 5000 examples at B = 50 a learner takes 100 steps a round, so one
  round's statistics weigh 1 - 0.99^100 = 63% of the moving averages.
* ``eps = 1e-3``, TensorFlow's default, added to variances before the square root.
* Training normalizes with the batch mean and the biased batch variance (Ioffe & Szegedy 2015,
  Alg. 1); E[phi^2]_batch = var_batch + mean_batch^2.  Evaluation uses the moving statistics.
  Note that ``running_sq - running_mean^2`` estimates the variance of all activations seen
  (within-batch plus between-batch spread, law of total variance), not the mean batch variance.
* The running statistics are updated in place (``mul_``/``add_`` under ``no_grad``), so the
  modules also run under ``torch.func.functional_call`` + ``vmap`` with stacked per-client
  buffers, as :mod:`fedrun.batched` runs them.
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
    """Batch Renormalization (Ioffe 2017, Alg. 1) with footnote 8's federated moving variance.

    Training, with the moving statistics mu and sigma = sqrt(running_sq - running_mean^2 + eps)
    taken *before* this step's update::

        sigma_B = sqrt(var_B + eps)
        r = stop_gradient(clip(sigma_B / sigma, 1 / r_max, r_max))
        d = stop_gradient(clip((mu_B - mu) / sigma, -d_max, d_max))
        x_hat = (x - mu_B) / sigma_B * r + d,   y = gamma x_hat + beta

    then the moving averages are updated with rate ``momentum`` (Ioffe's alpha).  Evaluation is
    as for Batch Normalization, with the moving statistics.  r = 1, d = 0 (``r_max = 1,
    d_max = 0``) is Batch Normalization.  Defaults are the paper's (Appendix C.5): alpha = 0.01,
    r_max = 2, d_max = 2, fixed throughout training (no warm-up schedule; footnote 12).

    Ioffe keeps a moving average of sigma itself; here the moving E[phi^2] is kept instead (and
    sigma derived from it), so that the server's plain average of the buffers is footnote 8's
    federated variance, as for :class:`FederatedBatchNorm`.
    """

    def __init__(self, num_features: int, eps: float = 1e-3, momentum: float = 0.01, affine: bool = True,
                 r_max: float = 2.0, d_max: float = 2.0):
        super().__init__(num_features, eps, momentum, affine)
        if r_max < 1 or d_max < 0:
            raise ValueError(f"r_max={r_max}, d_max={d_max}: need r_max >= 1 and d_max >= 0")
        self.r_max, self.d_max = r_max, d_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        self._check_input_dim(x)
        shape = self._shape(x)
        mean, var = self._batch_stats(x, shape)
        sigma_b = torch.sqrt(var + self.eps)
        with torch.no_grad():  # r and d are constants for the gradient (Ioffe 2017, Alg. 1)
            sigma = torch.sqrt(self.running_var + self.eps)
            r = (sigma_b.detach() / sigma).clamp(1 / self.r_max, self.r_max)
            d = ((mean.detach() - self.running_mean) / sigma).clamp(-self.d_max, self.d_max)
        self._update(mean, var)
        x_hat = (x - mean.view(shape)) / sigma_b.view(shape) * r.view(shape) + d.view(shape)
        return self._affine(x_hat, shape)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, r_max={self.r_max}, d_max={self.d_max}"


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
