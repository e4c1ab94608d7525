"""Testing the global model: accuracy and loss on the test (and validation) split."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedrun.data.preparation import FederatedData
from fedrun.params import Params


@torch.no_grad()
def evaluate(model: nn.Module, state: Params, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 2000) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``model`` loaded with ``state`` on ``(x, y)``."""
    model.load_state_dict(state)
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=y.device)
    loss = torch.zeros((), dtype=torch.float64, device=y.device)
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss += F.cross_entropy(logits, target, reduction="sum").double()
        correct += (logits.argmax(1) == target).sum()
    return float(correct) / len(y), float(loss) / len(y)


def eval_batch(device: str | torch.device) -> int:
    """Small evaluation batches are fastest on CPU caches, large ones keep a GPU busy."""
    return 256 if torch.device(device).type == "cpu" else 4096


def evaluate_round(model: nn.Module, models: dict[str, Params], buffers: Params, evaluated: str,
                   data: FederatedData, batch: int) -> dict:
    """A round's evaluation columns: ``test_acc``/``test_loss`` (and ``val_*``) of the evaluated
    model; when the model sent to clients differs from the average-aggregated one (FedNNNN
    sec. 4.1), both models' test accuracy, evaluating only the one not yet done.

    Args:
      models: ``{"average": ..., "sent": ...}`` trainable parameters.
      evaluated: which of them the ``test_acc`` column reports (``aggregator.evaluate``).
    """
    plan = evaluation_plan(models, buffers, evaluated, data)
    scores = [evaluate(model, state, *split(data, name), batch) for name, state in plan]
    return evaluation_row(plan, scores, evaluated)


def evaluation_plan(models: dict[str, Params], buffers: Params, evaluated: str,
                    data: FederatedData) -> list[tuple[str, Params]]:
    """What :func:`evaluate_round` scores: ``(column prefix, model state)`` pairs, the prefix
    naming the split (``test``, ``val``, or ``<other model>_test``)."""
    state = {**models[evaluated], **buffers}
    plan = [("test", state)] + ([("val", state)] if data.val_x is not None else [])
    if any(not torch.equal(models["sent"][k], models["average"][k]) for k in models["sent"]):
        other = "sent" if evaluated == "average" else "average"
        plan.append((f"{other}_test", {**models[other], **buffers}))
    return plan


def split(data: FederatedData, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The images and labels a plan entry is scored on."""
    return (data.val_x, data.val_y) if prefix == "val" else (data.test_x, data.test_y)


def evaluation_row(plan: list[tuple[str, Params]], scores: list[tuple[float, float]], evaluated: str) -> dict:
    """The plan's scores as CSV columns; with two models, the evaluated one's test columns twice
    (``test_*`` and ``<evaluated>_test_*``)."""
    row = {}
    for (prefix, _), (acc, loss) in zip(plan, scores):
        row[f"{prefix}_acc"], row[f"{prefix}_loss"] = acc, loss
    if any(prefix.endswith("_test") for prefix, _ in plan):
        row[f"{evaluated}_test_acc"], row[f"{evaluated}_test_loss"] = row["test_acc"], row["test_loss"]
    return row


@torch.no_grad()
def evaluate_stacked(model: nn.Module, states: list[Params], x: torch.Tensor, y: torch.Tensor,
                     batch_size: int = 4096) -> list[tuple[float, float]]:
    """:func:`evaluate` of many models of one architecture at once: their states stacked and the
    forward pass vmapped over them (``torch.func``), ``batch_size`` images x models a call (at
    least one image per call).  What a population (:mod:`fedrun.harness.population`) evaluates on a GPU,
    where one small model leaves most of it idle."""
    stacked = {k: torch.stack([s[k] for s in states]) for k in states[0]}
    model.eval()
    forward = vmap(lambda state, images: functional_call(model, state, (images,)), in_dims=(0, None))
    n = len(states)
    correct = torch.zeros(n, dtype=torch.long, device=y.device)
    loss = torch.zeros(n, dtype=torch.float64, device=y.device)
    step = max(1, batch_size // n)
    for start in range(0, len(y), step):
        logits = forward(stacked, x[start : start + step])  # [n, b, C]
        target = y[start : start + step]
        loss += F.cross_entropy(logits.flatten(0, 1), target.repeat(n), reduction="none").view(n, -1).sum(1).double()
        correct += (logits.argmax(2) == target).sum(1)
    return [(c / len(y), s / len(y)) for c, s in zip(correct.tolist(), loss.tolist())]
