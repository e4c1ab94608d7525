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

How a chunk trains: the round's schedule is worked out before its first step
(:mod:`fedrun.client.round_plan`), and the loop itself (:mod:`fedrun.client.lock_step`) does no host
work per step.  On a GPU (``capture``, default ``auto``) finished clients leave the step, the rest
are padded to a power of two, and each such step shape is captured once as a CUDA graph and
replayed (:mod:`fedrun.client.captured`): a lock-step then costs one launch, not hundreds, which is
what a round of an unbalanced partition (one client with ten times the mean client's steps) is
made of.

``precision`` (``fp32`` | ``tf32`` | ``bf16``) and ``compile`` are off by default; see
:mod:`fedrun.client.precision`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._python_dispatch import TorchDispatchMode

from fedrun.client.captured import Workspace, Workspaces, check_capture, static_reason
from fedrun.client.local_training import ClientResults, LocalTraining
from fedrun.client.lock_step import ChunkTraining
from fedrun.client.precision import check_engine_options, compile_errors, precision_scope
from fedrun.client.protocol import InProcessEngine, check_lr
from fedrun.client.regularizers import Regularizer
from fedrun.client.round_plan import RoundPlan
from fedrun.client.vmap_batchnorm import uses_batch_norm
from fedrun.errors import check
from fedrun.params import Params

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
# Round plans kept per engine (a round in several chunks has one a chunk).
PLANS = 4


class BatchedEngine(InProcessEngine):
    """Trains all clients of a round in lock-step; same interface as ``SequentialEngine``.

    Args:
      model, train_x, train_y, local, regularizer, seed: as ``SequentialEngine``.
      clients_per_step: train at most this many clients at once (``"auto"``, the default as in
        conf/engine/batched.yaml: as many as fit in the free GPU memory, ``CPU_CHUNK`` on a CPU;
        None: all of the round's).
      precision, compile: as ``SequentialEngine``; ``compile`` compiles the vmapped forward.
      capture: ``auto`` | ``on`` | ``off``: the static, padded layout of the lock-step, captured as
        CUDA graphs on a GPU (:mod:`fedrun.client.captured`).  ``auto``: on CUDA where the setting
        allows; ``on``: also on a CPU (padded, run eagerly: the same results); ``off``: never.
    """

    def __init__(self, model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor, local: LocalTraining,
                 regularizer: Regularizer | None, seed: int, clients_per_step: int | str | None = "auto",
                 precision: str = "fp32", compile: bool = False, capture: str = "auto"):
        check_clients_per_step(clients_per_step)
        check_engine_options(precision, compile)
        self.model, self.x, self.y = model, train_x, train_y
        self.local, self.regularizer, self.seed = local, regularizer, seed
        self.clients_per_step, self.precision, self.compile = clients_per_step, precision, compile
        self.capture = check_capture(capture)
        self._fit: int | None = None  # clients that fit in memory at once (clients_per_step="auto")
        self._workspaces = Workspaces()
        self._plans: dict[tuple, RoundPlan] = {}
        self._said: set[str] = set()  # the one-line notes about capturing already logged
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
              round_: int, epochs: list[int] | None, lr: float,
              opt_states: Params | None = None, inputs: Params | None = None,
              own: Params | None = None) -> ClientResults:
        """As :meth:`fedrun.client.sequential.SequentialEngine.train`: the round's clients in chunks of
        :meth:`chunk_size`, each chunk trained in lock-step by :func:`train_shares`."""
        return train_shares([Share(self, params, buffers, list(clients), list(indices), round_,
                                   None if epochs is None else list(epochs), lr, opt_states, inputs, own)])[0]

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

    def layout(self, shares: list["Share"]):
        """``(static, graphs)`` for a chunk of these shares: whether it takes the static layout, and
        whether its steps are captured as CUDA graphs."""
        if self.capture == "off":
            return False, False
        cuda = self.x.device.type == "cuda"
        if not cuda and self.capture == "auto":  # padding only costs on a CPU, and there are no graphs
            return False, False
        reason = static_reason(self, shares)
        if reason is not None:
            self._say(f"engine.capture={self.capture}: the lock-step runs eagerly ({reason})")
            return False, False
        if not cuda:
            self._say(f"engine.capture=on: no CUDA device ({self.x.device.type}): the static, padded "
                      "lock-step runs without graphs")
            return True, False
        return True, True

    def plan(self, shapes: list[tuple[int, int, int]], spans: list[tuple[int, int]], bucketed: bool) -> RoundPlan:
        """The round plan of a chunk of these ``(n, B, E)`` rows.  A plan depends on nothing else,
        and a run whose clients all train every round (C = 1, no stragglers) has the same one each
        round: kept, it costs its tens of milliseconds of host work once, not every round."""
        key = (tuple(shapes), tuple(spans), bucketed)
        plan = self._plans.pop(key, None) or RoundPlan(shapes, self.x.device, bucketed, spans)
        self._plans[key] = plan  # most recent last
        while len(self._plans) > PLANS:
            self._plans.pop(next(iter(self._plans)))
        return plan

    def workspace(self, shares: list["Share"]) -> Workspace:
        """The fixed tensors of this chunk's shape, loaded with the round's starting state."""
        return self._workspaces.get(shares)

    def _say(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            log.info("%s", line)

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
    epochs: list[int] | None  # None: E each
    lr: float  # this round's learning rate: required (None is a TypeError, never local.lr)
    opt_states: Params | None = None
    inputs: Params | None = None  # the regularizer's per-client inputs [m, ...] (SCAFFOLD's c - c_k), or None
    own: Params | None = None  # the clients' own starting values of some parameters/buffers [m, ...], or None

    def __post_init__(self):
        self.lr = check_lr(self.lr)
        if self.epochs is None:
            self.epochs = [self.engine.local.epochs] * len(self.clients)

    def part(self, i: int, j: int) -> "Share":
        """Clients ``i:j`` of this share (their optimizer states, regularizer inputs and own values too)."""
        rows = lambda stacked: None if stacked is None else {k: v[i:j] for k, v in stacked.items()}  # noqa: E731
        return Share(self.engine, self.params, self.buffers, self.clients[i:j], self.indices[i:j], self.round_,
                     self.epochs[i:j], self.lr, rows(self.opt_states), rows(self.inputs), rows(self.own))


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


def _train_chunk(shares: list[Share]) -> list[ClientResults]:
    """Train one chunk of m clients in lock-step (:class:`fedrun.client.lock_step.ChunkTraining`):
    in the static layout, captured, where the lead engine's ``capture`` setting allows it."""
    lead = shares[0].engine
    static, graphs = lead.layout(shares)
    training = ChunkTraining(shares, static=static, graphs=graphs)
    training.run()
    return training.results()


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
