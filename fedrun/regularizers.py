"""Client-side regularizers: terms added to the local loss.

A method that changes local optimization (FedProx; FedLap in a later module) is a regularizer;
everything else about local training is the same loop for every method.
"""
from __future__ import annotations

import torch

from fedrun.errors import check
from fedrun.norms import Params


class Regularizer:
    """Interface: ``penalty(params, anchor)`` is added to the loss at every local step.

    ``params`` are the client's live parameters, ``anchor`` the round's global model ``w_t``.
    ``start_epoch`` is called before each local epoch (FedLap recomputes its coefficients there).
    """

    def start_epoch(self, epoch: int, params: Params, anchor: Params) -> None:
        pass

    def penalty(self, params: Params, anchor: Params) -> torch.Tensor:
        raise NotImplementedError


class Proximal(Regularizer):
    """FedProx's proximal term (Nagura et al. eq. 7; Li et al.): ``mu/2 ||w - w_t||^2``.

    Args:
      mu: strength, >= 0 (Table 5: 0.005-0.02); 0 is FedAvg.
    """

    def __init__(self, mu: float):
        check(mu >= 0, "aggregator.mu", mu, "must be >= 0")
        self.mu = mu

    def penalty(self, params, anchor):
        return 0.5 * self.mu * sum((params[k] - anchor[k]).pow(2).sum() for k in anchor)
