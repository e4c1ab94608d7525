"""The batched client engine: every client of a round trained at once.

Models this small leave a GPU idle when clients train one after another.  Here the parameters of
the round's m clients are stacked (``[m, *shape]``), the model is evaluated for all of them in
one call (``torch.func.functional_call`` under ``torch.func.vmap``), and one optimizer step
(:mod:`fedrun.client.optim`, elementwise, so it runs on stacked tensors as is) updates every client.

Exactly the sequential engine's computation, reorganized:

* client k's batches come from the same generator ``(seed, "shuffle", round, k)`` in the same
  order, so client k's s-th step sees the same samples in both engines;
* clients whose s-th batch has the same size are vmapped together (nearly always one group: all
  clients with a full batch of B).  A client's last, smaller batch and a client that has already
  finished (fewer samples, or a straggler's fewer epochs) are handled by grouping, not by
  padding, so BatchNorm's batch statistics never see padding;
* BatchNorm running statistics are per client (stacked buffers updated in place under vmap);
  ``torch.nn`` BatchNorm layers run as one BatchNorm over the chunk's clients x channels
  (:mod:`fedrun.client.vmap_batchnorm`), the same arithmetic in fewer passes.

Results equal the sequential engine's to float rounding (the tests check this for every
aggregator and model family).  ``clients_per_step`` bounds memory by training the round's
clients in chunks, with the same results; ``"auto"`` chooses the chunk from the free GPU memory
(:func:`choose_chunk`).

Dropout is the exception to equality.  Under ``vmap(..., randomness="different")`` every client
draws its own masks, but from one global random stream for the whole chunk (vmap cannot give
each client its own generator), seeded at the start of each chunk from
``(seed, "forward-batched", round, first client of the chunk)``.  So a batched run with dropout
is reproducible (same seed, same chunks: identical updates), its masks are independent across
clients and have the right rate, but they are not the sequential engine's masks (one stream per
client, ``(seed, "forward", round, client)``): the two engines agree in distribution, not
bitwise, and changing ``clients_per_step`` changes the draws.

``precision`` (``fp32`` | ``tf32`` | ``bf16``) and ``compile`` are off by default; see
:mod:`fedrun.client.precision`.
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._python_dispatch import TorchDispatchMode

from fedrun.errors import check
from fedrun.client.local_training import ClientResults, LocalTraining
from fedrun.client.optim import load_state, state_dict
from fedrun.params import Params
from fedrun.client.precision import autocast, check_engine_options, compile_errors, precision_scope
from fedrun.client.regularizers import Regularizer
from fedrun.seeding import derive_seed, torch_generator
from fedrun.client.vmap_batchnorm import FusedClientBatchNorm, uses_batch_norm

log = logging.getLogger(__name__)

# clients_per_step="auto" uses at most this fraction of the free GPU memory: the per-client
# estimate (client_bytes) leaves out the kernels' workspaces and the allocator's fragmentation.
MEMORY_SAFETY = 0.7
# clients_per_step="auto" on a CPU: memory is not the limit there, cache is.  A vmapped conv with
# per-client weights is one grouped convolution over all the chunk's clients, and on CPU it slows
# down as the groups grow.  MNIST CNN, 20 clients x 100 samples, B = 50 (samples/s, sequential
# engine 2,050 on one thread / 3,610 on two): chunks of 20 -> 1,650 / 2,950, 10 -> 2,010 / 3,600,
# 5 -> 2,280 / 3,940, 2 -> 2,210 / 3,840.
CPU_CHUNK = 5
# choose_chunk's cap when the chunk is measured once for the whole run (calls may differ in m).
MAX_CHUNK = 2**20


class BatchedEngine:
    """Trains all clients of a round in lock-step; same interface as ``SequentialEngine``.

    Args:
      model, train_x, train_y, local, regularizer, seed: as ``SequentialEngine``.
      clients_per_step: train at most this many clients at once (``"auto"``, the default as in
        conf/engine/batched.yaml: as many as fit in the free GPU memory, ``CPU_CHUNK`` on a CPU;
        None: all of the round's).
      precision, compile: as ``SequentialEngine``; ``compile`` compiles the vmapped forward.
    """

    def __init__(self, model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor, local: LocalTraining,
                 regularizer: Regularizer | None, seed: int, clients_per_step: int | str | None = "auto",
                 precision: str = "fp32", compile: bool = False):
        check_clients_per_step(clients_per_step)
        check_engine_options(precision, compile)
        self.model, self.x, self.y = model, train_x, train_y
        self.local, self.regularizer, self.seed = local, regularizer, seed
        self.clients_per_step, self.precision, self.compile = clients_per_step, precision, compile
        self._fit: int | None = None  # clients that fit in memory at once (clients_per_step="auto")
        if precision == "tf32" and train_x.device.type != "cuda":
            log.info("engine.precision=tf32 has no effect on %s (TF32 is a CUDA mode): training in FP32",
                     train_x.device.type)

        def forward(params, buffers, x):
            return functional_call(self.model, (params, buffers), (x,))

        # The images come sample-major, [b, m, ...] (client dimension 1): then vmap's rule for a
        # convolution with batched weights (a grouped convolution over [b, m*C, H, W]) finds its
        # input already in that layout instead of permuting a copy at every layer.  Measured on
        # the MNIST CNN, 10 clients x 50, one CPU thread: 1.04-1.17x the client-major layout.
        self._forward = vmap(forward, in_dims=(0, 0, 1), randomness="different")
        if compile:
            self._forward = torch.compile(self._forward)
        # torch.nn BatchNorm layers: all clients as one BatchNorm over m*C channels (see
        # fedrun.client.vmap_batchnorm); left to vmap's own rule under torch.compile, which traces it.
        self._fuse_bn = uses_batch_norm(model) and not compile

    def train(self, params: Params, buffers: Params, clients: list[int], indices: list[torch.Tensor],
              round_: int, epochs: list[int] | None = None, lr: float | None = None,
              opt_states: Params | None = None, inputs: Params | None = None) -> ClientResults:
        """As :meth:`fedrun.client.sequential.SequentialEngine.train`: the round's clients in chunks of
        :meth:`chunk_size`, each chunk trained in lock-step by :func:`train_shares`."""
        return train_shares([Share(self, params, buffers, list(clients), list(indices), round_,
                                   None if epochs is None else list(epochs), lr, opt_states, inputs)])[0]

    def chunk_size(self, params: Params, buffers: Params, m: int) -> int:
        """How many of this call's m clients train at once.

        ``"auto"`` measures once (the first round) and keeps the result for the run, so the chunks
        do not move with the allocator's state from round to round (they fix dropout's draws).
        """
        if self.clients_per_step is None:
            return m
        if self.clients_per_step != "auto":
            return self.clients_per_step
        if self._fit is None:
            free = self._free_bytes()
            if free is None:  # CPU: the chunk that keeps the grouped convolutions in cache
                self._fit = CPU_CHUNK
            else:
                per = client_bytes(self.model, params, buffers, self.x[: self.local.batch_size],
                                   self.local, self.regularizer is not None)
                self._fit = choose_chunk(free, per, MAX_CHUNK, MEMORY_SAFETY)
                log.info("engine.clients_per_step=auto: %d clients at once (%.1f GiB free, about %.1f MiB "
                         "per client, %.0f%% of the free memory used at most)", self._fit, free / 2**30,
                         per / 2**20, 100 * MEMORY_SAFETY)
        return max(1, min(m, self._fit))

    def _free_bytes(self) -> int | None:
        """Free device memory in bytes (what the driver reports plus what torch's cache holds
        unused), or None off CUDA."""
        device = self.x.device
        if device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)

@dataclass
class Share:
    """One learner group's part of a lock-step training call: the arguments of
    :meth:`BatchedEngine.train`, with the engine that holds its local training, regularizer and
    seed.  A single run's round is one share; a population (:mod:`fedrun.harness.population`) trains one
    share per run, all on the same model architecture and training set."""

    engine: BatchedEngine
    params: Params
    buffers: Params
    clients: list[int]
    indices: list[torch.Tensor]
    round_: int
    epochs: list[int] | None = None
    lr: float | None = None
    opt_states: Params | None = None
    inputs: Params | None = None  # the regularizer's per-client inputs [m, ...] (SCAFFOLD's c - c_k), or None

    def __post_init__(self):
        if self.epochs is None:
            self.epochs = [self.engine.local.epochs] * len(self.clients)

    def part(self, i: int, j: int) -> "Share":
        """Clients ``i:j`` of this share (their optimizer states and regularizer inputs too)."""
        rows = lambda stacked: None if stacked is None else {k: v[i:j] for k, v in stacked.items()}  # noqa: E731
        return Share(self.engine, self.params, self.buffers, self.clients[i:j], self.indices[i:j], self.round_,
                     self.epochs[i:j], self.lr, rows(self.opt_states), rows(self.inputs))


def train_shares(shares: list[Share]) -> list[ClientResults]:
    """Train every share's clients in lock-step; one :class:`ClientResults` per share.

    All their clients form one row list, cut into chunks of the smallest :meth:`chunk_size` of the
    shares' engines; each chunk (parts of one or more shares) is one :func:`_train_chunk`.  The
    shares' engines must share the model architecture, training set and engine options (the
    first one's vmapped forward serves all).
    """
    lead = shares[0].engine
    total = sum(len(s.clients) for s in shares)
    size = min(s.engine.chunk_size(s.params, s.buffers, total) for s in shares)
    chunks, current, filled = [], [], 0  # each chunk: [(share index, part)]
    for n, share in enumerate(shares):
        i = 0
        while i < len(share.clients):
            j = min(len(share.clients), i + size - filled)
            current.append((n, share.part(i, j)))
            filled += j - i
            i = j
            if filled == size:
                chunks.append(current)
                current, filled = [], 0
    if current:
        chunks.append(current)
    parts: list[list[ClientResults]] = [[] for _ in shares]
    with precision_scope(lead.precision, lead.x.device), compile_errors(lead.compile):
        for chunk in chunks:
            for (n, _), result in zip(chunk, _train_chunk([part for _, part in chunk])):
                parts[n].append(result)
    return [_concat(p) for p in parts]


def _concat(parts: list[ClientResults]) -> ClientResults:
    """One share's results from its chunks' parts, in client order."""
    if len(parts) == 1:
        return parts[0]
    cat = lambda key: {k: torch.cat([getattr(p, key)[k] for p in parts]) for k in getattr(parts[0], key)}  # noqa: E731
    return ClientResults([k for p in parts for k in p.clients], cat("deltas"), cat("buffers"),
                         torch.cat([p.num_examples for p in parts]), torch.cat([p.loss for p in parts]),
                         torch.cat([p.steps for p in parts]), torch.cat([p.epochs for p in parts]),
                         {k: torch.cat([p.extras[k] for p in parts]) for k in parts[0].extras},
                         None if parts[0].opt_states is None else cat("opt_states"),
                         torch.cat([p.lr for p in parts]), torch.cat([p.effective_steps for p in parts]))


class _Cohort:
    """The rows of a chunk that take the same optimizer step (same optimizer settings and this
    round's learning rate), with their stacked optimizer state.  A single run is one cohort; a
    population sweeping the client learning rate or momentum has one per value."""

    def __init__(self, optimizer, lr: float | None, rows: list[int], state: dict):
        self.optimizer, self.lr, self.state = optimizer, lr, state
        self.local = {r: i for i, r in enumerate(rows)}  # chunk row -> row of the cohort's state


def _cohorts(shares: list[Share], spans: list[tuple[int, int]], stacked: Params, names: list[str]) -> list[_Cohort]:
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


class _Schedule:
    """Every row's batches (index tensors into the training set), in the sequential engine's
    order: client k of a share shuffles its samples once per local epoch with the generator
    ``(seed, "shuffle", round, k)`` and cuts them into batches of B (the last one smaller when B
    does not divide n_k).

    The permutations are drawn on the CPU (the generators are), then all rows' batches come from
    one transfer and one gather on the device, not one per client and epoch.  When every row has
    the same number of steps of one full batch size (the usual case: n_k a multiple of B, no
    stragglers), ``table[row, step]`` holds them all and a step's batch is one slice; otherwise
    ``rows[row][step]`` (built only then: a population's rows hold ~10^5 batches)."""

    def __init__(self, shares: list[Share]):
        perms, self._shapes, self.steps, sizes, offset = [], [], [], set(), 0
        for share in shares:
            b = share.engine.local.batch_size
            for k, idx, e in zip(share.clients, share.indices, share.epochs):
                n = len(idx)
                shuffle = torch_generator(share.engine.seed, "shuffle", share.round_, k)
                perms += [torch.randperm(n, generator=shuffle).add_(offset) for _ in range(e)]  # to its samples
                offset += n
                self._shapes.append((n, b, e))
                self.steps.append(e * math.ceil(n / b))
                if e and n:  # this row's batch sizes: B, and the remainder when B does not divide n
                    sizes.update([min(b, n)] + ([n % b] if n > b and n % b else []))
        everything = torch.cat([idx for share in shares for idx in share.indices])
        self._order = everything[torch.cat(perms).to(everything.device)] if perms else everything
        uniform = len(sizes) == 1 and len(set(self.steps)) == 1  # (no batches at all: not uniform)
        self.table = self._order.view(len(self.steps), self.steps[0], sizes.pop()) if uniform else None

    @functools.cached_property
    def rows(self) -> list[list[torch.Tensor]]:
        """Each row's batches in order: epoch after epoch, B at a time, the last one smaller."""
        cuts = [[min(b, n - i) for _ in range(e) for i in range(0, n, b)] for n, b, e in self._shapes]
        return [list(part.split(c)) for part, c in zip(self._order.split([sum(c) for c in cuts]), cuts)]

    def batch(self, rows: list[int], s: int, whole: bool, index: torch.Tensor) -> torch.Tensor:
        """Step s's batches of ``rows`` (all of the same size), ``[g, b]``."""
        if self.table is not None:
            return self.table[:, s] if whole else self.table[index, s]
        return torch.stack([self.rows[j][s] for j in rows])


def _train_chunk(shares: list[Share]) -> list[ClientResults]:
    """Train one chunk of m clients in lock-step: the sequential engine's loop, reorganized.

    The chunk's rows are the shares' clients, share after share.  Step s of the loop is every
    client's s-th optimizer step.  The clients whose s-th batch has the same size form one group
    (nearly always all of them), whose stacked parameters go through one vmapped forward, one
    backward, and one optimizer step per cohort (:class:`_Cohort`); a client whose batches have
    run out (fewer samples, a straggler's fewer epochs) is simply in no group.  A regularizer's
    coefficients are recomputed for the clients that start an epoch at step s; its penalty is
    each share's own (separable over clients, so the one backward serves all), and where the
    regularizer writes its gradient out (``Regularizer.closed_form``) that gradient is added to the
    backward's on the share's rows instead.  Buffers
    (BatchNorm statistics) and optimizer state stay per client throughout.
    """
    lead = shares[0].engine
    spans, m = [], 0
    for share in shares:
        spans.append((m, m + len(share.clients)))
        m += len(share.clients)
    owner = [n for n, (a, b) in enumerate(spans) for _ in range(a, b)]  # chunk row -> share
    names = list(shares[0].params)

    def stack(key: str) -> Params:
        if len(shares) == 1:
            return {k: v.unsqueeze(0).repeat(m, *([1] * v.ndim)) for k, v in getattr(shares[0], key).items()}
        return {k: torch.cat([getattr(s, key)[k].unsqueeze(0).expand(len(s.clients), *v.shape) for s in shares])
                for k, v in getattr(shares[0], key).items()}

    stacked, bufs = stack("params"), stack("buffers")
    cohorts = _cohorts(shares, spans, stacked, names)
    single = len(cohorts) == 1
    augments = [s.engine.local.augment for s in shares]
    draws = [torch_generator(shares[owner[j]].engine.seed, "augment", shares[owner[j]].round_, k) if augments[owner[j]]
             else None for j, k in enumerate(c for s in shares for c in s.clients)]
    augmented = any(d is not None for d in draws)
    schedule = _Schedule(shares)
    steps = torch.tensor(schedule.steps)
    device = stacked[names[0]].device
    loss_sum = torch.zeros(m, dtype=torch.float64, device=device)
    reg_sum = torch.zeros(m, dtype=torch.float64, device=device)
    regs = [s.engine.regularizer for s in shares]
    # A regularizer's state covers its share's rows of this chunk; rows index them (0 .. the part's m - 1).
    reg_states = [None if reg is None else reg.init(s.params, len(s.clients), s.inputs) for s, reg in zip(shares, regs)]
    per_epoch = [math.ceil(len(idx) / s.engine.local.batch_size) for s in shares for idx in s.indices]
    lead.model.train()
    # Dropout masks: one stream per chunk (module docstring), reproducible from the seed.
    torch.manual_seed(derive_seed(lead.seed, "forward-batched", shares[0].round_, shares[0].clients[0]))

    regularized = [n for n, reg in enumerate(regs) if reg is not None]
    stepping = [n for n in regularized if regs[n].acts_after_step]
    for s in range(max(schedule.steps)):
        groups: dict[int, list[int]] = {}
        if schedule.table is not None:
            groups[schedule.table.shape[2]] = list(range(m))
        else:
            for j, batches in enumerate(schedule.rows):
                if s < len(batches):
                    groups.setdefault(len(batches[s]), []).append(j)
        for n in regularized:  # FedLap recomputes lambda when a client starts an epoch
            lo, hi = spans[n]
            mine = [j - lo for j in range(lo, hi) if s < schedule.steps[j] and s % per_epoch[j] == 0]
            if mine:
                part = stacked if len(shares) == 1 else {k: v[lo:hi] for k, v in stacked.items()}
                regs[n].start_epoch(reg_states[n], torch.tensor(mine, device=device),
                                torch.tensor([s == 0 for _ in mine], device=device), part, shares[n].params)
        for b, rows in groups.items():
            whole = len(rows) == m
            idx = torch.tensor(rows, device=device)
            p_g = {k: (v if whole else v[idx]).requires_grad_(True) for k, v in stacked.items()}
            b_g = bufs if whole else {k: v[idx] for k, v in bufs.items()}
            batch = schedule.batch(rows, s, whole, idx)  # [g, b]
            if not augmented:
                x = lead.x[batch.t()]  # [b, g, ...]: sample-major (see BatchedEngine.__init__)
            else:  # each client's own draws, in the sequential engine's order
                x = torch.stack([lead.x[batch[i]] if draws[j] is None else augments[owner[j]](lead.x[batch[i]], draws[j])
                                 for i, j in enumerate(rows)], dim=1)
            with autocast(lead.precision, x.device), \
                    (FusedClientBatchNorm() if lead._fuse_bn else contextlib.nullcontext()):
                logits = lead._forward(p_g, b_g, x)  # [g, b, C]
            loss = F.cross_entropy(logits.float().flatten(0, 1), lead.y[batch].flatten(),
                                   reduction="none").view(len(rows), b).mean(1)  # [g]
            total = loss.sum()
            added = []  # (rows i0:i1, a penalty's gradient written out): added to the loss's below
            for n in regularized:  # each share's penalty on its rows: rows i0:i1 of the (sorted) group
                i0, i1 = bisect.bisect_left(rows, spans[n][0]), bisect.bisect_left(rows, spans[n][1])
                if i0 == i1:
                    continue
                mine = idx[i0:i1] - spans[n][0]
                with torch.no_grad():
                    closed = regs[n].closed_form(reg_states[n], {k: v[i0:i1].detach() for k, v in p_g.items()},
                                                 shares[n].params, mine)
                if closed is None:
                    pen = regs[n].penalty(reg_states[n], {k: v[i0:i1] for k, v in p_g.items()}, shares[n].params,
                                          mine)
                    total = total + pen.sum()
                else:
                    pen = closed[0]
                    added.append((i0, i1, closed[1]))
                reg_sum[idx[i0:i1]] += pen.detach().double()
            grads = torch.autograd.grad(total, [p_g[k] for k in names])
            for i0, i1, gradient in added:  # as autograd would sum them: one addition a row
                pairs = [(g if i0 == 0 and i1 == len(rows) else g[i0:i1], gradient[k])
                         for k, g in zip(names, grads) if k in gradient]
                if pairs:
                    torch._foreach_add_([g for g, _ in pairs], [a for _, a in pairs])
            loss_sum[idx] += loss.detach().double() * b
            with torch.no_grad():
                weights = [p_g[k].detach() for k in names]
                for cohort in cohorts:
                    _step(cohort, rows, weights, list(grads), whole and single, single)
                for n in stepping:  # a change after the optimizer's step (SCAFFOLD as NIID-Bench applies it)
                    i0, i1 = bisect.bisect_left(rows, spans[n][0]), bisect.bisect_left(rows, spans[n][1])
                    if i0 < i1:
                        lr_n = shares[n].engine.local.lr if shares[n].lr is None else shares[n].lr
                        regs[n].after_step(reg_states[n], {k: w[i0:i1] for k, w in zip(names, weights)},
                                           idx[i0:i1] - spans[n][0], lr_n)
                if not whole:
                    for k, w in zip(names, weights):
                        stacked[k][idx] = w
                    for k, v in b_g.items():
                        bufs[k][idx] = v
            for k in names:
                stacked[k] = stacked[k].detach()

    out = []
    for n, (share, (a, b)) in enumerate(zip(shares, spans)):
        deltas = {k: stacked[k][a:b] - share.params[k].unsqueeze(0) for k in names}
        sizes = torch.tensor([len(idx) for idx in share.indices])
        n_epochs = torch.tensor(share.epochs)
        extras = {}
        if regs[n] is not None:
            extras["reg_loss"] = (reg_sum[a:b] / steps[a:b].clamp_min(1).to(reg_sum)).cpu()
            extras.update(regs[n].metrics(reg_states[n]))
        loss = (loss_sum[a:b] / (sizes * n_epochs).to(loss_sum)).cpu()
        final = None if share.opt_states is None else _final_state(cohorts, a, b, names)
        lr = share.engine.local.lr if share.lr is None else share.lr
        out.append(ClientResults(list(share.clients), deltas, {k: v[a:b] for k, v in bufs.items()}, sizes, loss,
                                 steps[a:b], n_epochs, extras, final, torch.full((b - a,), lr, dtype=torch.float64),
                                 share.engine.local.effective_steps(steps[a:b])))
    return out


def _step(cohort: _Cohort, rows: list[int], weights: list[torch.Tensor], grads: list[torch.Tensor],
          whole: bool, single: bool) -> None:
    """One optimizer step for the cohort's clients among ``rows`` (a group of the chunk, whose
    stacked ``weights`` and ``grads`` are updated in place).  ``whole``: the group is the whole
    chunk and the cohort all of it, so the state needs no gathering; ``single``: the cohort is
    every row of the chunk."""
    if whole:
        cohort.optimizer.step(weights, grads, cohort.state, cohort.lr)
        return
    pos = [i for i, j in enumerate(rows) if j in cohort.local]
    if not pos:
        return
    device = weights[0].device
    mine = torch.tensor([cohort.local[rows[i]] for i in pos], device=device)
    sub = _gather(cohort.state, mine)
    if single:  # every row of the group is the cohort's: step the group's tensors in place
        cohort.optimizer.step(weights, grads, sub, cohort.lr)
    else:
        at = torch.tensor(pos, device=device)
        w, g = [v[at] for v in weights], [v[at] for v in grads]
        cohort.optimizer.step(w, g, sub, cohort.lr)
        for full, part in zip(weights, w):
            full[at] = part
    _scatter(cohort.state, sub, mine)


def _final_state(cohorts: list[_Cohort], a: int, b: int, names: list[str]) -> Params:
    """Rows ``a:b``'s final optimizer states (one share's clients, all in one cohort)."""
    cohort = next(c for c in cohorts if a in c.local)
    flat = state_dict(cohort.state, names)
    i = cohort.local[a]
    return {k: v[i : i + b - a] for k, v in flat.items()}


# Optimizer state: every entry is per client, lists of stacked [m, ...] tensors or an [m] tensor
# (Adam's step counters).

def _gather(state: dict, idx: torch.Tensor) -> dict:
    return {k: ([t[idx] for t in v] if isinstance(v, list) else v[idx]) for k, v in state.items()}


def _scatter(state: dict, sub: dict, idx: torch.Tensor) -> None:
    for k, v in sub.items():
        if isinstance(v, list):
            for full, part in zip(state[k], v):
                full[idx] = part
        else:
            state[k][idx] = v


def check_clients_per_step(value) -> None:
    check(value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
          "engine.clients_per_step", value, "an integer >= 1, auto (from the free GPU memory) or null (all clients at once)")


# ----------------------------------------------------------------------------- memory

def choose_chunk(free_bytes: float, per_client_bytes: float, m: int, safety: float = MEMORY_SAFETY) -> int:
    """Clients to train at once: as many of ``m`` as fit in ``safety * free_bytes``, at least 1.

    At least one: a single client that does not fit fails the same way in either engine, with
    CUDA's out-of-memory error, which names the sizes.
    """
    if per_client_bytes <= 0:
        return m
    return max(1, min(m, int(safety * free_bytes // per_client_bytes)))


class _OutputBytes(TorchDispatchMode):
    """Sums the bytes of every new (non-view) tensor that the operations under it create."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    self.total += t.numel() * t.element_size()
        return out


def client_bytes(model: nn.Module, params: Params, buffers: Params, batch_x: torch.Tensor,
                 local: LocalTraining, regularized: bool = False) -> int:
    """Device memory one more client of a chunk costs, estimated from one probe forward pass.

    Per client: its stacked parameters, their gradients, the copy a partial group gathers, its
    delta (4 x the parameters; one more with a regularizer's stacked state), its optimizer state
    (:meth:`LocalTraining.fresh_state`), its batch, and twice the tensors its forward pass creates
    on ``batch_x`` (counted by a dispatch mode; autograd saves most of them for the backward, which
    creates gradients of the same sizes while it runs).  FP32 throughout, so an over-estimate for
    bf16.  The probe runs in eval mode without gradients on copies of the buffers: it changes no
    running statistics and draws no random numbers.
    """
    param_bytes = sum(v.numel() * v.element_size() for v in params.values())
    opt_bytes = sum(v.numel() * v.element_size() for v in local.fresh_state(params).values())
    copies = {k: v.clone() for k, v in buffers.items()}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _OutputBytes() as counter:
            functional_call(model, (params, copies), (batch_x,))
    finally:
        model.train(was_training)
    return ((5 if regularized else 4) * param_bytes + opt_bytes
            + batch_x.numel() * batch_x.element_size() + 2 * counter.total)
