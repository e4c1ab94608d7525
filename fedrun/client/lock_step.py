"""One chunk of clients trained in lock-step: the batched engine's loop, in named steps.

The sequential engine's loop (:mod:`fedrun.client.sequential`), reorganized so that step s is every
client's s-th optimizer step at once.  :class:`ChunkTraining` holds the chunk's stacked state
(parameters, BatchNorm buffers, optimizer state, regularizer state, loss sums); a round's
:class:`~fedrun.client.round_plan.RoundPlan` says, before the first step, which rows take each
step on which samples.  Each lock-step is:

1. :meth:`ChunkTraining.start_epochs`: a regularizer that recomputes its coefficients when a client
   starts a local epoch (FedLap, Charteros & Koutsopoulos Alg. 1 line 16) does so for the rows the
   plan lists;
2. :meth:`ChunkTraining.step`, per group of equal batch size: gather the group's rows, one vmapped
   forward, the cross-entropy, the regularizers' penalties (each share's own; separable over
   clients, so one backward serves them all) or their written-out gradients
   (``Regularizer.closed_form``), one ``torch.autograd.grad``, the optimizer step per cohort
   (:class:`_Cohort`), a regularizer's change after the step (SCAFFOLD as NIID-Bench applies it),
   and the rows written back.

Two layouts of the same arithmetic:

* **eager** (``static=False``): exactly the group's rows; a group of every row works on the stacked
  tensors in place.  Any shares, cohorts, augmentation, dropout.
* **static** (``static=True``): the state lives in a :class:`~fedrun.client.captured.Workspace` kept
  across rounds, each share's clients followed by a scratch row; each share's part of a group is
  padded to a power of two with its scratch row (the plan's ``bucketed`` layout), and the step
  reads its rows and batch from fixed buffers, so it has a fixed shape and fixed addresses and can
  be captured as a CUDA graph once and replayed (:mod:`fedrun.client.captured`).  Off CUDA it runs
  as it is: the tests check there that padding changes nothing.  Not for augmentation or dropout
  (whose draws are per step on the host, or would change with the padding).

Both equal the sequential engine to float rounding (tests/test_batched.py, tests/test_round_plan.py).
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from fedrun.client.local_training import ClientResults
from fedrun.client.optim import load_state, state_dict
from fedrun.client.precision import autocast
from fedrun.client.regularizers import Regularizer
from fedrun.client.round_plan import Group, LockStep
from fedrun.client.vmap_batchnorm import FusedClientBatchNorm
from fedrun.params import Params
from fedrun.seeding import seed_global, torch_generator


class _Cohort:
    """The rows of a chunk that take the same optimizer step (same optimizer settings and this
    round's learning rate), with their stacked optimizer state.  A single run is one cohort; a
    population sweeping the client learning rate or momentum has one per value."""

    def __init__(self, optimizer, lr: float, rows: list[int], state: dict):
        self.optimizer, self.lr, self.state = optimizer, lr, state
        self.local = {r: i for i, r in enumerate(rows)}  # chunk row -> row of the cohort's state


def _cohorts(shares, spans: list[tuple[int, int]], stacked: Params, names: list[str]) -> list[_Cohort]:
    """Group a chunk's rows by optimizer step, each cohort's state initialized or loaded from the
    shares' starting states (zeros for a share that starts fresh)."""
    keys: dict[tuple, list[int]] = {}
    for n, share in enumerate(shares):
        keys.setdefault((share.engine.local.make_optimizer(), share.lr), []).append(n)
    cohorts = []
    device = stacked[names[0]].device
    for (optimizer, lr), members in keys.items():
        rows = [r for n in members for r in range(*spans[n])]
        index = torch.tensor(rows, device=device)
        whole = len(rows) == len(stacked[names[0]])
        state = optimizer.init([stacked[k] if whole else stacked[k][index] for k in names])
        if "step" in state:  # one Adam step counter per client: clients may finish at different steps
            state["step"] = torch.zeros(len(rows), dtype=torch.float64, device=state["step"].device)
        if any(shares[n].opt_states is not None for n in members):
            flat = [shares[n].opt_states if shares[n].opt_states is not None
                    else {k: torch.zeros_like(v[: len(shares[n].clients)]) for k, v in state_dict(state, names).items()}
                    for n in members]
            start = {k: torch.cat([f[k] for f in flat]) if len(flat) > 1 else flat[0][k].clone() for k in flat[0]}
            state = load_state(start, state, names)
        cohorts.append(_Cohort(optimizer, lr, rows, state))
    return cohorts


def sample_order(shares) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    """The round's samples in the order the clients visit them, and each row's ``(n, B, E)``.

    Client k of a share shuffles its samples once per local epoch with the generator
    ``(seed, "shuffle", round, k)``, as the sequential engine does; its epochs' permutations follow
    one another, and the rows follow one another (the layout :class:`RoundPlan` indexes).  The
    permutations are drawn on the CPU (the generators are), then the order comes from one
    transfer and one gather on the device."""
    perms, shapes, offset = [], [], 0
    for share in shares:
        b = share.engine.local.batch_size
        for k, idx, e in zip(share.clients, share.indices, share.epochs):
            n = len(idx)
            shuffle = torch_generator(share.engine.seed, "shuffle", share.round_, k)
            perms += [torch.randperm(n, generator=shuffle).add_(offset) for _ in range(e)]  # to its samples
            offset += n
            shapes.append((n, b, e))
    everything = torch.cat([idx for share in shares for idx in share.indices])
    return (everything[torch.cat(perms).to(everything.device)] if perms else everything), shapes


class ChunkTraining:
    """One chunk's lock-step training (module docstring): :meth:`run` then :meth:`results`.

    Args:
      shares: the chunk's parts of one or more runs (:class:`fedrun.client.batched.Share`); the first
        one's engine (model, data, options) serves all.
      static: the static layout (module docstring): padded, fixed shapes, state in a workspace.
      graphs: (static layout only) run each step through the workspace's CUDA graphs
        (:class:`fedrun.client.captured.StepGraphs`): captured once per shape, then replayed.
    """

    def __init__(self, shares, static: bool = False, graphs: bool = False):
        self.shares, self.static = shares, static
        self.runner = None
        self.lead = lead = shares[0].engine
        self.spans, m = [], 0
        for share in shares:
            self.spans.append((m, m + len(share.clients)))
            m += len(share.clients)
        self.m = m
        self.owner = [n for n, (a, b) in enumerate(self.spans) for _ in range(a, b)]  # chunk row -> share
        self.names = list(shares[0].params)
        self.order, shapes = sample_order(shares)
        device = lead.x.device
        self.plan = lead.plan(shapes, self.spans, static)
        self.steps = torch.tensor(self.plan.steps)
        self.regs = [s.engine.regularizer for s in shares]
        self.regularized = [n for n, reg in enumerate(self.regs) if reg is not None]
        self.stepping = [n for n in self.regularized if self.regs[n].acts_after_step]
        self.epoch_acting = [n for n in self.regularized  # those whose start_epoch does something
                             if type(self.regs[n]).start_epoch is not Regularizer.start_epoch]
        self.augments = [s.engine.local.augment for s in shares]
        self.draws = [torch_generator(shares[self.owner[j]].engine.seed, "augment", shares[self.owner[j]].round_, k)
                      if self.augments[self.owner[j]] else None
                      for j, k in enumerate(c for s in shares for c in s.clients)]
        self.augmented = any(d is not None for d in self.draws)
        self._arange = torch.arange(max([b for _, b, _ in shapes], default=1), device=device)
        if static:
            self._load_workspace()
            self.runner = self.workspace.graphs.run if graphs else None
        else:
            self._stack()

    # ------------------------------------------------------------------------- state

    def _stack(self) -> None:
        """The eager layout: the chunk's m rows, built fresh for the round."""
        shares, m = self.shares, self.m

        def stack(key: str) -> Params:
            if len(shares) == 1:
                return {k: v.unsqueeze(0).repeat(m, *([1] * v.ndim)) for k, v in getattr(shares[0], key).items()}
            return {k: torch.cat([getattr(s, key)[k].unsqueeze(0).expand(len(s.clients), *v.shape) for s in shares])
                    for k, v in getattr(shares[0], key).items()}

        self.stacked, self.bufs = stack("params"), stack("buffers")
        for share, (lo, hi) in zip(shares, self.spans):  # a personalized method's own layers over w_t's
            for k, v in (share.own or {}).items():
                (self.stacked if k in self.stacked else self.bufs)[k][lo:hi] = v
        self.anchors = [s.params for s in shares]
        self.cohorts = _cohorts(shares, self.spans, self.stacked, self.names)
        self.share_cohorts = [next((c, c.local[lo]) for c in self.cohorts if lo in c.local) if hi > lo else
                              (self.cohorts[0], 0) for lo, hi in self.spans]
        device = self.stacked[self.names[0]].device
        self.loss_sum = torch.zeros(m, dtype=torch.float64, device=device)
        self.reg_sum = torch.zeros(m, dtype=torch.float64, device=device)
        # A regularizer's state covers its share's rows of this chunk; rows index them (0 .. the part's m - 1).
        self.reg_states = [None if reg is None else reg.init(s.params, len(s.clients), s.inputs)
                           for s, reg in zip(shares, self.regs)]

    def _load_workspace(self) -> None:
        """The static layout: the engine's workspace (each share's clients and a scratch row)
        loaded with this round's starting state; the workspace is reused, so a captured step stays
        valid.  Each share is a cohort of its own, with its own state rows."""
        ws = self.workspace = self.lead.workspace(self.shares)
        self.stacked, self.bufs = ws.stacked, ws.bufs
        self.anchors = [slot.anchor for slot in ws.slots]
        self.loss_sum, self.reg_sum = ws.loss_sum, ws.reg_sum
        self.reg_states = [slot.reg_state for slot in ws.slots]
        self.cohorts = [_Cohort(slot.optimizer, share.lr, list(range(size + 1)), slot.opt_state)
                        for slot, share, size in zip(ws.slots, self.shares, ws.sizes)]
        self.share_cohorts = [(cohort, 0) for cohort in self.cohorts]

    def _rows(self, n: int) -> slice:
        """Share n's clients among the stacked rows."""
        if self.static:
            o = self.workspace.offsets[n]
            return slice(o, o + len(self.shares[n].clients))
        return slice(*self.spans[n])

    # ------------------------------------------------------------------------- the loop

    def run(self) -> None:
        """Every lock-step of the plan."""
        self.lead.model.train()
        # Dropout masks: one stream per chunk (fedrun.client.batched's docstring), reproducible from the seed.
        share = self.shares[0]
        seed_global(self.lead.seed, "forward-batched", share.round_, share.clients[0])
        for lock_step in self.plan.lock_steps:
            self.start_epochs(lock_step)
            for group in lock_step.groups:
                if self.static:
                    self._static_step(group)
                else:
                    self.step(group, group.index, self._batch(group), group.padded == self.m)

    def start_epochs(self, lock_step: LockStep) -> None:
        """Regularizers that act when a client starts a local epoch (FedLap's lambda), for the plan's
        rows (device views: no copy from the host here)."""
        if not self.epoch_acting or not len(lock_step.epoch_rows):
            return
        for n in self.epoch_acting:
            lo, hi = self.spans[n]
            i0, i1 = (int(i) for i in np.searchsorted(lock_step.epoch_rows, [lo, hi]))  # the plan's rows are sorted
            if i0 == i1:
                continue
            mine, first = lock_step.epoch_index[i0:i1], lock_step.epoch_is_first[i0:i1]
            if lo:
                mine = mine - lo
            rows = self.workspace.rows(n) if self.static else slice(lo, hi)
            part = self.stacked if len(self.shares) == 1 else {k: v[rows] for k, v in self.stacked.items()}
            self.regs[n].start_epoch(self.reg_states[n], mine, first, part, self.anchors[n])

    def _batch(self, group: Group) -> torch.Tensor:
        """The group's batches, ``[G, b]`` indices into the training set."""
        return self.order[group.starts.unsqueeze(1) + self._arange[: group.size]]

    def _static_step(self, group: Group) -> None:
        """A static group: its rows and batch copied into the workspace's fixed buffers for its shape,
        then the step on those buffers (captured and replayed where the runner does so)."""
        ws = self.workspace
        index, batch = ws.inputs(group.padded, group.size)
        index.copy_(group.index)
        batch.copy_(self._batch(group))
        if self.runner is None:
            self.step(group, index, batch, whole=False)
        else:  # one graph a shape and learning rates (a rate is a constant of the captured step)
            key = (group.size, group.parts, tuple(cohort.lr for cohort in self.cohorts))
            self.runner(key, lambda: self.step(group, index, batch, whole=False))

    def step(self, group: Group, idx: torch.Tensor, batch: torch.Tensor, whole: bool) -> None:
        """One group's step (module docstring, step 2).  ``idx`` ``[G]``: the rows; ``batch``
        ``[G, b]``: their samples; ``whole``: the group is every row of the chunk, in order (then the
        stacked tensors are used in place, without gathering).  In the static layout ``idx`` and
        ``batch`` are the workspace's fixed buffers and nothing here reads the host: the step can be
        captured."""
        lead, names, b = self.lead, self.names, group.size
        g = idx.shape[0]
        p_g = {k: (v if whole else v.index_select(0, idx)).requires_grad_(True) for k, v in self.stacked.items()}
        b_g = self.bufs if whole else {k: v.index_select(0, idx) for k, v in self.bufs.items()}
        if not self.augmented:
            x = lead.x[batch.t()]  # [b, g, ...]: sample-major (see BatchedEngine.__init__)
        else:  # each client's own draws, in the sequential engine's order
            x = torch.stack([lead.x[batch[i]] if self.draws[j] is None
                             else self.augments[self.owner[j]](lead.x[batch[i]], self.draws[j])
                             for i, j in enumerate(group.rows.tolist())], dim=1)
        with autocast(lead.precision, x.device), \
                (FusedClientBatchNorm() if lead._fuse_bn else contextlib.nullcontext()):
            logits = lead._forward(p_g, b_g, x)  # [g, b, C]
        loss = F.cross_entropy(logits.float().flatten(0, 1), lead.y[batch].flatten(),
                               reduction="none").view(g, b).mean(1)  # [g]
        total = loss.sum()
        added = []  # (rows i0:i1, a penalty's gradient written out): added to the loss's below
        slices = [(n, *self._share_rows(group, n, idx)) for n in self.regularized]
        for n, i0, i1, mine in slices:  # each share's penalty on its rows i0:i1 of the (sorted) group
            if i0 == i1:
                continue
            with torch.no_grad():
                closed = self.regs[n].closed_form(self.reg_states[n], {k: v[i0:i1].detach() for k, v in p_g.items()},
                                                  self.anchors[n], mine)
            if closed is None:
                pen = self.regs[n].penalty(self.reg_states[n], {k: v[i0:i1] for k, v in p_g.items()},
                                           self.anchors[n], mine)
                total = total + pen.sum()
            else:
                pen = closed[0]
                added.append((i0, i1, closed[1]))
            self.reg_sum.index_add_(0, idx[i0:i1], pen.detach().double())
        grads = torch.autograd.grad(total, [p_g[k] for k in names])
        for i0, i1, gradient in added:  # as autograd would sum them: one addition a row
            pairs = [(gr if i0 == 0 and i1 == g else gr[i0:i1], gradient[k])
                     for k, gr in zip(names, grads) if k in gradient]
            if pairs:
                torch._foreach_add_([gr for gr, _ in pairs], [a for _, a in pairs])
        self.loss_sum.index_add_(0, idx, loss.detach().double() * b)
        with torch.no_grad():
            weights = [p_g[k].detach() for k in names]
            self._optimizer_steps(group, idx, weights, list(grads), whole)
            for n, i0, i1, mine in slices:
                if n in self.stepping and i0 < i1:  # a change after the optimizer's step (SCAFFOLD as NIID-Bench applies it)
                    share = self.shares[n]
                    self.regs[n].after_step(self.reg_states[n], {k: w[i0:i1] for k, w in zip(names, weights)}, mine,
                                            share.lr)
            if not whole:
                for k, w in zip(names, weights):
                    self.stacked[k].index_copy_(0, idx, w)
                for k, v in b_g.items():
                    self.bufs[k].index_copy_(0, idx, v)
        if whole:
            for k in names:
                self.stacked[k] = self.stacked[k].detach()

    def _optimizer_steps(self, group: Group, idx: torch.Tensor, weights: list[torch.Tensor],
                         grads: list[torch.Tensor], whole: bool) -> None:
        """Each share's rows of the group take their cohort's optimizer step: the cohort's state
        gathered for them, stepped with their rows of ``weights`` (updated in place), scattered back.
        A share's rows are consecutive in the (sorted) group and in its cohort's state, so the
        indices are device arithmetic on ``idx``, never a list sent from the host."""
        if whole and len(self.cohorts) == 1:  # every row, one cohort: the state as it is
            cohort = self.cohorts[0]
            cohort.optimizer.step(weights, grads, cohort.state, cohort.lr)
            return
        for n, (cohort, first_row) in enumerate(self.share_cohorts):
            i0, i1, mine = self._share_rows(group, n, idx)
            if i0 == i1:
                continue
            at = mine if first_row == 0 else mine + first_row  # rows of the cohort's state
            sub = _gather(cohort.state, at)
            part = (lambda ts: ts) if i0 == 0 and i1 == idx.shape[0] else (lambda ts: [t[i0:i1] for t in ts])
            cohort.optimizer.step(part(weights), part(grads), sub, cohort.lr)  # views: in place
            _scatter(cohort.state, sub, at)

    def _share_rows(self, group: Group, n: int, idx: torch.Tensor) -> tuple[int, int, torch.Tensor | None]:
        """Share n's rows in the group: positions ``i0:i1`` (the plan's part for it; padding
        included in the static layout, where padding rows read the share's scratch row) and their
        indices into the share's own state rows."""
        for share, position, width in group.parts:
            if share == n:
                base = self.workspace.offsets[n] if self.static else self.spans[n][0]
                mine = idx[position:position + width]
                return position, position + width, (mine - base if base else mine)
        return 0, 0, None

    # ------------------------------------------------------------------------- what the chunk returns

    def results(self) -> list[ClientResults]:
        """Each share's :class:`ClientResults` (copies: a workspace is overwritten next round)."""
        out, names = [], self.names
        for n, share in enumerate(self.shares):
            rows, m_n = self._rows(n), len(share.clients)
            deltas = {k: self.stacked[k][rows] - share.params[k].unsqueeze(0) for k in names}
            sizes = torch.tensor([len(idx) for idx in share.indices])
            n_epochs = torch.tensor(share.epochs)
            extras = {}
            a, b = self.spans[n]  # its rows of the plan (per-row steps)
            steps = self.steps[a:b]
            if self.regs[n] is not None:
                extras["reg_loss"] = (self.reg_sum[rows] / steps.clamp_min(1).to(self.reg_sum)).cpu()
                extras.update({k: v[:m_n].clone() for k, v in self.regs[n].metrics(self.reg_states[n]).items()})
            loss = (self.loss_sum[rows] / (sizes * n_epochs).to(self.loss_sum)).cpu()
            cohort, first_row = self.share_cohorts[n]
            final = None if share.opt_states is None else {
                k: v[first_row:first_row + m_n].clone() for k, v in state_dict(cohort.state, names).items()}
            out.append(ClientResults(list(share.clients), deltas, {k: v[rows].clone() for k, v in self.bufs.items()},
                                     sizes, loss, steps, n_epochs, extras, final,
                                     torch.full((m_n,), share.lr, dtype=torch.float64),
                                     share.engine.local.effective_steps(steps)))
        return out


# Optimizer state: every entry is per client, lists of stacked [m, ...] tensors or an [m] tensor
# (Adam's step counters).

def _gather(state: dict, idx: torch.Tensor) -> dict:
    return {k: ([t.index_select(0, idx) for t in v] if isinstance(v, list) else v.index_select(0, idx))
            for k, v in state.items()}


def _scatter(state: dict, sub: dict, idx: torch.Tensor) -> None:
    for k, v in sub.items():
        if isinstance(v, list):
            for full, part in zip(state[k], v):
                full.index_copy_(0, idx, part)
        else:
            state[k].index_copy_(0, idx, v)

