"""The sequential engine: one client after another on one ``nn.Module``, the reference that every
other engine is checked against.

An engine is one call, ``engine.train(params, buffers, clients, indices, round_, epochs, lr) ->
ClientResults``: train these m clients, each on its own sample indices, from ``w_t = params``, and
return their updates stacked ``[m, *shape]``.  The engine holds the training set, the client
optimizer and the regularizer; the data each client trains on is handed to it per call, so any
learner (a client, the PD-VL reference learner) is just a client id and an index tensor.

The batch order of client k in round t comes from a generator seeded by ``(seed, round, client)``,
and so do its dropout masks and data augmentation, so every method sees the same batches.  The
optimizer state starts from zero every round, or is passed in and returned stacked
(:class:`fedrun.client.local_training.OptimizerStates`).  A straggler runs fewer epochs.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from fedrun.client.local_training import ClientResults, LocalTraining
from fedrun.client.optim import load_state, state_dict
from fedrun.params import Params
from fedrun.client.protocol import InProcessEngine, check_lr
from fedrun.client.precision import autocast, check_engine_options, compile_errors, precision_scope
from fedrun.client.regularizers import Regularizer
from fedrun.seeding import seed_global, torch_generator

log = logging.getLogger(__name__)


class SequentialEngine(InProcessEngine):
    """One client after another on one ``nn.Module``.

    Args:
      model: the architecture (its weights are overwritten with ``w_t`` for every client).
      train_x, train_y: the whole training set, already on the device.
      local: the client optimizer.
      regularizer: added to the loss (FedProx, FedLap), or None.
      seed: the run's seed.
      precision: ``fp32`` (default), ``tf32`` (CUDA only; :func:`fedrun.client.precision.precision_scope`)
        or ``bf16`` (autocast of the forward pass, :func:`fedrun.client.precision.autocast`).
      compile: ``torch.compile`` the model's forward (off by default: compiling costs tens of
        seconds on a CPU and pays only on long GPU runs).
    """

    def __init__(self, model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor, local: LocalTraining,
                 regularizer: Regularizer | None, seed: int, precision: str = "fp32", compile: bool = False):
        check_engine_options(precision, compile)
        self.model, self.x, self.y = model, train_x, train_y
        self.local, self.regularizer, self.seed = local, regularizer, seed
        self.precision, self.compile = precision, compile
        if precision == "tf32" and train_x.device.type != "cuda":
            log.info("engine.precision=tf32 has no effect on %s (TF32 is a CUDA mode): training in FP32",
                     train_x.device.type)
        # The compiled module shares the model's parameters, which load_state_dict updates in place.
        self._forward = torch.compile(model) if compile else model

    def train(self, params: Params, buffers: Params, clients: list[int], indices: list[torch.Tensor],
              round_: int, epochs: list[int] | None, lr: float,
              opt_states: Params | None = None, inputs: Params | None = None,
              own: Params | None = None) -> ClientResults:
        """Train ``clients`` from ``w_t = params``.

        Args:
          clients: the learners' ids (their batches, dropout and augmentation derive from them).
          indices: client j's training samples, an index tensor into the training set (on the device).
          epochs: client j runs ``epochs[j]`` epochs; None: E each (required all the same, as it
            comes before ``lr``).
          lr: this round's learning rate, required: the schedule is the caller's, and the engine
            never falls back to ``local.lr`` (None is a ``TypeError``, :func:`fedrun.client.protocol.check_lr`).
          opt_states: the clients' starting optimizer states, named tensors stacked ``[m, ...]``
            (:meth:`LocalTraining.fresh_state`); their final states come back in
            ``ClientResults.opt_states``.  None: a fresh state each, nothing returned.
          inputs: the regularizer's per-client inputs, named tensors stacked ``[m, ...]`` (SCAFFOLD's
            ``c - c_k``: :meth:`fedrun.server.aggregator.Aggregator.client_inputs`); client j's rows reach
            ``regularizer.init``.  None: the regularizer has none.
          own: the clients' own values of some parameters and buffers, named tensors stacked
            ``[m, ...]`` (a personalized method's local layers: :mod:`fedrun.server.personal`): client
            j starts from ``w_t`` with these replaced by its rows.  ``params`` stays the anchor: the
            regularizer's ``w_t`` and what the deltas are measured from.  None: every client starts
            from ``w_t``.
        """
        lr = check_lr(lr)
        with precision_scope(self.precision, self.x.device), compile_errors(self.compile):
            return self._train(params, buffers, clients, indices, round_, epochs, lr, opt_states, inputs, own)

    def _train(self, params, buffers, clients, indices, round_, epochs, lr, opt_states, inputs=None,
               own=None) -> ClientResults:
        m = len(clients)
        epochs = [self.local.epochs] * m if epochs is None else list(epochs)
        deltas = {k: torch.empty((m, *v.shape), dtype=v.dtype, device=v.device) for k, v in params.items()}
        stacked_buffers = {k: torch.empty((m, *v.shape), dtype=v.dtype, device=v.device)
                           for k, v in buffers.items()}
        final_states = None if opt_states is None else {k: v.clone() for k, v in opt_states.items()}
        losses, steps = torch.zeros(m, dtype=torch.float64), torch.zeros(m, dtype=torch.long)
        extras: dict[str, torch.Tensor] = {}
        for j, k in enumerate(clients):
            start = None if opt_states is None else {name: v[j].clone() for name, v in opt_states.items()}
            mine = None if inputs is None else {name: v[j : j + 1] for name, v in inputs.items()}
            first = None if own is None else {name: v[j] for name, v in own.items()}
            losses[j], steps[j], metrics, end = self._train_client(params, buffers, k, indices[j], round_,
                                                                   epochs[j], lr, start, mine, first)
            if final_states is not None:
                for name, v in end.items():
                    final_states[name][j] = v
            for name, value in metrics.items():
                extras.setdefault(name, torch.full((m,), float("nan"), dtype=torch.float64))[j] = value
            for name, p in self.model.named_parameters():
                deltas[name][j] = p.detach() - params[name]
            for name, b in self.model.named_buffers():
                stacked_buffers[name][j] = b
        sizes = torch.tensor([len(idx) for idx in indices])
        return ClientResults(list(clients), deltas, stacked_buffers, sizes, losses, steps,
                             torch.tensor(epochs), extras, final_states,
                             torch.full((m,), lr, dtype=torch.float64),
                             self.local.effective_steps(steps))

    def _train_client(self, params: Params, buffers: Params, client: int, idx: torch.Tensor, round_: int,
                      epochs: int, lr: float, start_state: Params | None = None,
                      inputs: Params | None = None, own: Params | None = None):
        """One client's local training: ``epochs`` passes over its samples ``idx`` in batches of B,
        one optimizer step (plus the regularizer's penalty) per batch.

        Returns its mean training loss over all steps (without the penalty), the number of steps,
        its regularizer metrics (``reg_loss``: the mean penalty per step, and the regularizer's
        own), and its final optimizer state (None when the state is reset every round).
        """
        model, local, reg = self.model, self.local, self.regularizer
        model.load_state_dict({**params, **buffers, **(own or {})})  # its own layers over w_t's
        model.train()
        names = [name for name, _ in model.named_parameters()]
        weights = [p for _, p in model.named_parameters()]
        # The regularizer's one form takes clients stacked [g, ...]: here g = 1, as views of the
        # live parameters, so the penalty's gradient flows into them.
        live = {name: w.unsqueeze(0) for name, w in zip(names, weights)}
        optimizer = local.make_optimizer()
        opt_state = optimizer.init(weights)
        if start_state is not None:
            opt_state = load_state(start_state, opt_state, names)
        # Dropout (and any other randomness in the forward pass) is seeded per (round, client).
        seed_global(self.seed, "forward", round_, client)
        shuffle = torch_generator(self.seed, "shuffle", round_, client)
        augment = local.augment
        augment_draws = torch_generator(self.seed, "augment", round_, client) if augment else None
        n = len(idx)
        loss_sum = torch.zeros((), dtype=torch.float64, device=idx.device)
        reg_sum = torch.zeros((), dtype=torch.float64, device=idx.device)
        steps = 0
        one = torch.zeros(1, dtype=torch.long, device=idx.device)  # the regularizer's row: this client
        reg_state = reg.init(params, 1, inputs) if reg is not None else None
        after_step = reg is not None and reg.acts_after_step
        for epoch in range(epochs):
            if reg is not None:
                reg.start_epoch(reg_state, one, torch.tensor([epoch == 0], device=idx.device), live, params)
            order = idx[torch.randperm(n, generator=shuffle).to(idx.device)]
            for start in range(0, n, local.batch_size):
                batch = order[start : start + local.batch_size]
                x = self.x[batch] if augment is None else augment(self.x[batch], augment_draws)
                with autocast(self.precision, x.device):
                    logits = self._forward(x)
                loss = F.cross_entropy(logits.float(), self.y[batch])
                total, added = loss, None
                if reg is not None:
                    with torch.no_grad():  # the penalty's gradient written out, where it has one
                        closed = reg.closed_form(reg_state, {k: w.detach() for k, w in live.items()}, params, one)
                    if closed is None:
                        penalty = reg.penalty(reg_state, live, params, one)[0]
                        total = loss + penalty
                    else:
                        penalty, added = closed[0][0], closed[1]
                    reg_sum += penalty.detach()
                grads = torch.autograd.grad(total, weights)
                if added:  # as autograd would sum them: one addition
                    mine = [(g, added[k][0]) for k, g in zip(names, grads) if k in added]
                    torch._foreach_add_([g for g, _ in mine], [a for _, a in mine])
                optimizer.step(weights, grads, opt_state, lr)
                if after_step:
                    with torch.no_grad():
                        reg.after_step(reg_state, live, one, lr)
                loss_sum += loss.detach() * len(batch)
                steps += 1
        metrics = {} if reg is None else {"reg_loss": float(reg_sum) / max(steps, 1),
                                          **{k: float(v[0]) for k, v in reg.metrics(reg_state).items()}}
        end_state = None if start_state is None else state_dict(opt_state, names)
        return float(loss_sum) / (n * epochs), steps, metrics, end_state
