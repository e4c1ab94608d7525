"""Testing the global model: accuracy and loss on the test (and validation) split."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedrun.data import FederatedData
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
    state = {**models[evaluated], **buffers}
    row = dict(zip(("test_acc", "test_loss"), evaluate(model, state, data.test_x, data.test_y, batch)))
    if data.val_x is not None:
        row["val_acc"], row["val_loss"] = evaluate(model, state, data.val_x, data.val_y, batch)
    if any(not torch.equal(models["sent"][k], models["average"][k]) for k in models["sent"]):
        other = "sent" if evaluated == "average" else "average"
        row[f"{evaluated}_test_acc"], row[f"{evaluated}_test_loss"] = row["test_acc"], row["test_loss"]
        row[f"{other}_test_acc"], row[f"{other}_test_loss"] = evaluate(
            model, {**models[other], **buffers}, data.test_x, data.test_y, batch)
    return row
