"""Testing the global model: accuracy and loss on the test (and validation) split, and on each
client's own test data (natural clients)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedrun.data.preparation import FederatedData
from fedrun.params import Params


def evaluate(model: nn.Module, state: Params, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 2000) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``model`` loaded with ``state`` on ``(x, y)``."""
    return total_scores(batch_scores(model, state, x, y, batch_size), len(y))


@torch.no_grad()
def batch_scores(model: nn.Module, state: Params, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                 starts=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each batch's summed cross-entropy (float64) and number of correct predictions, for the
    batches of ``batch_size`` that begin at ``starts`` (default: all of them).  Apart from
    :func:`total_scores` so that the parallel engine's workers can score ranges of batches."""
    model.load_state_dict(state)
    model.eval()
    scores = []
    for start in range(0, len(y), batch_size) if starts is None else starts:
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        scores.append((F.cross_entropy(logits, target, reduction="sum").double(), (logits.argmax(1) == target).sum()))
    return scores


def total_scores(scores: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> tuple[float, float]:
    """Accuracy and mean loss over ``n`` examples from :func:`batch_scores`, added in batch order
    (float64 sums depend on their order: every engine adds them in this one)."""
    loss = torch.zeros((), dtype=torch.float64, device=scores[0][0].device)
    correct = torch.zeros((), dtype=torch.long, device=scores[0][0].device)
    for batch_loss, batch_correct in scores:
        loss += batch_loss
        correct += batch_correct
    return float(correct) / n, float(loss) / n


@torch.no_grad()
def client_scores(model: nn.Module, state: Params, x: torch.Tensor, y: torch.Tensor, rows: list[torch.Tensor],
                  batch_size: int) -> list[tuple[float, float]]:
    """Accuracy and mean cross-entropy of one model on each client's own test examples ``rows[k]``
    (indices into ``x``, ``y``): all clients' examples in batches of ``batch_size``, each example's
    scores added to its client's.  A client without test examples scores ``(nan, nan)``.  (On a
    GPU, ``index_add_`` adds with atomics: a client's loss may differ in its last bits between two
    runs; on a CPU it is the same every run.)"""
    sizes = [len(r) for r in rows]
    if not sizes or sum(sizes) == 0:
        return [(math.nan, math.nan)] * len(sizes)
    model.load_state_dict(state)
    model.eval()
    index = torch.cat(rows)
    owner = torch.repeat_interleave(torch.arange(len(rows), device=index.device),
                                    torch.tensor(sizes, device=index.device))
    correct = torch.zeros(len(rows), dtype=torch.long, device=index.device)
    loss = torch.zeros(len(rows), dtype=torch.float64, device=index.device)
    for start in range(0, len(index), batch_size):
        batch, who = index[start : start + batch_size], owner[start : start + batch_size]
        logits, target = model(x[batch]), y[batch]
        loss.index_add_(0, who, F.cross_entropy(logits, target, reduction="none").double())
        correct.index_add_(0, who, (logits.argmax(1) == target).long())
    return [(c / n, s / n) if n else (math.nan, math.nan) for c, s, n in zip(correct.tolist(), loss.tolist(), sizes)]


def client_summary(accuracies: list[float]) -> dict:
    """``rounds.csv``'s view of the clients' own accuracies: their mean, standard deviation
    (population, ddof = 0) and ``client_acc_worst10``, the mean of the worst 10% of them (at least
    one client), the fairness figure FL papers quote.  Clients without test data are left out."""
    acc = sorted(a for a in accuracies if a == a)
    if not acc:
        return {}
    mean = sum(acc) / len(acc)
    worst = acc[: max(1, math.ceil(0.1 * len(acc)))]
    return {"client_acc_mean": mean, "client_acc_std": math.sqrt(sum((a - mean) ** 2 for a in acc) / len(acc)),
            "client_acc_worst10": sum(worst) / len(worst)}


def eval_batch(device: str | torch.device) -> int:
    """Small evaluation batches are fastest on CPU caches, large ones keep a GPU busy."""
    return 256 if torch.device(device).type == "cpu" else 4096


def evaluate_round(model: nn.Module, models: dict[str, Params], buffers: Params, evaluated: str,
                   data: FederatedData, batch: int, scorer=None) -> dict:
    """A round's evaluation columns: ``test_acc``/``test_loss`` (and ``val_*``) of the evaluated
    model; when the model sent to clients differs from the average-aggregated one (FedNNNN
    sec. 4.1), both models' test accuracy, evaluating only the one not yet done.

    Args:
      models: ``{"average": ..., "sent": ...}`` trainable parameters.
      evaluated: which of them the ``test_acc`` column reports (``aggregator.evaluate``).
      scorer: what scores a model on a split, with :func:`evaluate`'s arguments and result (the
        default), e.g. the parallel engine's :meth:`~fedrun.client.parallel.ParallelEngine.evaluate`.
    """
    plan = evaluation_plan(models, buffers, evaluated, data)
    scorer = evaluate if scorer is None else scorer
    scores = [scorer(model, state, *split(data, name), batch) for name, state in plan]
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
