"""Communication cost: the bytes a round sends between the server and its clients.

Every method here is one exchange per sampled client and round: the server sends the global
model (and the method's extra state) down to each sampled client, and each client that reports
sends its update (and its extra state) back up.  A client that drops out received the model but
sends nothing.  Per round t, with m_t reporting clients and d_t dropped ones (``rounds.csv``'s
``clients`` and ``dropped``)::

    bytes_down(t)  = (m_t + d_t) x D
    bytes_up(t)    = m_t x U
    bytes_total(t) = sum_{s <= t} (bytes_down(s) + bytes_up(s))

    D = U = P + B + c x P + O

* P: the trainable parameters, sum over tensors of numel x element size (4 bytes for float32):
  w_t down, the update w_k - w_t up (FedNova's normalized update, the robust methods' and
  FedNNNN's are the same size);
* B: the buffers (BatchNorm's running statistics; ``num_batches_tracked`` is int64, 8 bytes):
  every method sends them down and averages the clients' (:func:`fedrun.server.aggregator.average_buffers`);
* c: model-sized copies a client correction adds each way
  (:attr:`fedrun.server.corrections.ClientCorrection.communicated`): SCAFFOLD's server control
  variate c down, the control-variate change ``c_k+ - c_k`` up, so c = 1 and SCAFFOLD sends twice
  FedAvg's bytes;
* O: the client optimizer state, under ``hyperparams.optimizer_state=average`` only (the server
  sends the mean state down and averages the clients' final states; momentum: P again; Adam: 2P
  and its float64 step count).  ``reset`` sends none, and under ``local`` each client keeps its own.

Not counted: the scalars a client reports besides (its n_k, loss, step count: a few bytes), the
PD-VL reference learner (a diagnostic, not a client), the data, and any protocol overhead; nothing
is compressed.  Everything travels at the dtype the server holds it in (the model is float32 under
every ``engine.precision``: bf16 autocast is local to training).
"""
from __future__ import annotations

from dataclasses import dataclass

from fedrun.params import Params

# rounds.csv's columns, in their order.
COLUMNS = ("bytes_down", "bytes_up", "bytes_total")


def nbytes(tensors: Params | None) -> int:
    """The bytes of named tensors as sent: ``sum numel x element_size`` (0 for None)."""
    return sum(t.numel() * t.element_size() for t in (tensors or {}).values())


@dataclass(frozen=True)
class Payload:
    """What one client's exchange of a round costs: ``down`` bytes to each sampled client,
    ``up`` bytes from each reporting one (the module docstring's D and U)."""

    down: int
    up: int

    def round(self, reported: int, dropped: int) -> tuple[int, int]:
        """``(bytes_down, bytes_up)`` of a round: ``((m + d) D, m U)`` for ``reported`` clients
        m and ``dropped`` clients d (the dropped received the model and sent nothing back)."""
        return (reported + dropped) * self.down, reported * self.up


def payload(params: Params, buffers: Params | None = None, correction: int = 0,
            optimizer_state: Params | None = None) -> Payload:
    """The module docstring's ``D = U = P + B + c P + O`` from the tensors themselves: ``params``
    (P), ``buffers`` (B), ``correction`` model-sized copies (c: 1 for SCAFFOLD) and the
    ``optimizer_state`` the server averages (O; None when it sends none)."""
    each = (1 + correction) * nbytes(params) + nbytes(buffers) + nbytes(optimizer_state)
    return Payload(down=each, up=each)


def method_payload(params: Params, buffers: Params, aggregator, optimizer_states) -> Payload:
    """A run's :func:`payload`: its model, the ``aggregator``'s correction (SCAFFOLD's control
    variates, :class:`fedrun.server.corrections.ClientCorrection`) and its client optimizer state
    when the server averages it (:class:`fedrun.client.local_training.OptimizerStates`, mode
    ``average``: its zero state has the shape of what travels)."""
    correction = 0 if aggregator.correction is None else aggregator.correction.communicated
    averaged = optimizer_states.fresh if optimizer_states.mode == "average" else None
    return payload(params, buffers, correction, averaged)
