"""What one round produced: :class:`RoundRecord`, filled step by step by the round
(:class:`fedrun.harness.federated_run.FederatedRun`: sample, train, aggregate, evaluate) and read by
the :class:`fedrun.harness.recorder.Recorder`, which writes it to the CSVs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # types only: the record holds what the round's steps made
    from fedrun.client.local_training import ClientResults
    from fedrun.diagnostics.divergence import Divergence, LearnerParams
    from fedrun.params import Params
    from fedrun.server.aggregator import RoundOutcome


@dataclass
class RoundRecord:
    """Everything round t produced that a CSV reports.  ``results``/``outcome``/``divergence``
    are None when every sampled client dropped out (the server then keeps ``w_t``)."""

    round: int
    lr: float
    dropped: dict[int, int]  # client -> n_k, for the clients that returned nothing
    stragglers: set[int]
    clients: list[int] = field(default_factory=list)  # the reporting clients, in training order
    epochs: list[int] = field(default_factory=list)  # their local epochs (fewer for a straggler)
    starts: Optional[Params] = None  # their starting optimizer states, stacked (None: reset every round)
    inputs: Optional[Params] = None  # their regularizer inputs from the aggregator's correction (SCAFFOLD's c - c_k)
    own: Optional[Params] = None  # a personalized method's local layers, each client's own (FedBN, FedPer), stacked
    models: dict[str, Params] = field(default_factory=dict)  # {"average": ..., "sent": ...}: the round's global models
    results: Optional[ClientResults] = None  # the clients' updates, losses, steps
    outcome: Optional[RoundOutcome] = None  # the aggregator's new model, N, E and its per-round values
    divergence: Optional[Divergence] = None  # PD-Ls / PD-VL per layer
    learners: Optional[LearnerParams] = None  # the learners' parameters w + dw_k
    vanilla: Optional[ClientResults] = None  # the PD-VL reference learner's results (its rounds only)
    vanilla_loss: Optional[float] = None
    evaluation: dict[str, float] = field(default_factory=dict)  # test/val accuracy and loss (eval rounds only)
    client_eval: dict[int, tuple[float, float]] = field(default_factory=dict)  # client -> (accuracy, loss), own test data
    personal_eval: dict[int, tuple[float, float]] = field(default_factory=dict)  # the same with personal models (fine-tuned, or a personalized method's)
    seconds: dict[str, float] = field(default_factory=dict)  # TIMING_COLUMNS
