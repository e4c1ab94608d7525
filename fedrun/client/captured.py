"""Captured lock-steps: the batched engine's step recorded once as a CUDA graph and replayed.

On a GPU a lock-step of a small model is bound by kernel launches, not arithmetic: a few hundred
launches of a few microseconds each, whatever few clients are left in it (FedNNNN's unbalanced
MNIST preset: 4.5 ms a lock-step on an H200 for 1,160 lock-steps a round, docs/performance.md).
A CUDA graph replays all of a step's kernels with one launch.  It needs what a graph records to
stay put: the same shapes, the same addresses, no host reads.  So:

* the state lives in a :class:`Workspace` that outlives the round: stacked parameters, BatchNorm
  buffers, loss sums, and per run (a population has several) its optimizer and regularizer state
  and its global model (the anchor of FedProx and FedLap), each with a scratch row for padding
  (:mod:`fedrun.client.round_plan`); a round copies its starting values in;
* each group's rows and batch are copied into the workspace's fixed buffers for its shape ``(G, B)``;
* :class:`StepGraphs` runs a shape's step eagerly the first ``warmup`` times (on a side stream, as
  CUDA graphs need), captures it the next time, and replays it from then on.  The learning rate is
  a constant of the recorded step, so it is part of the key (with the step's shape: each run's
  width and the batch size): a schedule's drop captures anew.

``engine.capture`` (``auto`` | ``on`` | ``off``): ``auto`` captures on CUDA where the setting allows;
``on`` also runs the static layout on a CPU (no graphs there: the padded step run eagerly, which
is how the CPU tests check that padding changes nothing); ``off`` never pads or captures.  What
cannot be captured runs eagerly, and the run says why once (:func:`static_reason`).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from fedrun.client.optim import state_dict
from fedrun.errors import check
from fedrun.params import Params

log = logging.getLogger(__name__)

CAPTURE = ("auto", "on", "off")
# Eager runs of a step's shape before it is captured: the first may choose kernels (cuDNN's
# autotuner) and allocate autograd's workspaces; CUDA graphs want those settled.
WARMUP = 2
# Workspaces kept at once (one a chunk shape: a round in two chunks needs two).
WORKSPACES = 4


def check_capture(value) -> str:
    """``engine.capture``, normalized (YAML's true/false read as on/off)."""
    if value is True or value is False:
        value = "on" if value else "off"
    check(value in CAPTURE, "engine.capture", value,
          "choose one of: auto (CUDA graphs where the setting allows), on, off")
    return value


def static_reason(engine, shares) -> str | None:
    """Why these shares' step cannot take the static (capturable) layout; None when it can."""
    if any(s.engine.local.augment is not None for s in shares):
        return "data augmentation draws each client's transforms on the host"
    if any(isinstance(mod, nn.modules.dropout._DropoutNd) and mod.p > 0 for mod in engine.model.modules()):
        return "dropout's masks would change with the padding rows"
    if engine.precision == "bf16":
        return "bf16 autocast"
    if engine.compile:
        return "engine.compile=true (torch.compile traces the forward its own way)"
    return None


def _tree(value):
    """A state tree's shape: the same nesting with (shape, dtype) for each tensor."""
    if isinstance(value, dict):
        return tuple((k, _tree(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_tree(v) for v in value)
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype
    return value


def _copy_tree(into, value) -> None:
    """Copy ``value``'s tensors into ``into``'s, in place (same nesting, :func:`_tree`)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _copy_tree(into[k], v)
    elif isinstance(value, (list, tuple)):
        for a, v in zip(into, value):
            _copy_tree(a, v)
    elif isinstance(value, torch.Tensor):
        into.copy_(value)


def _clone_tree(value):
    if isinstance(value, dict):
        return {k: _clone_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone_tree(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


def _padded(inputs: Params | None) -> Params | None:
    """A regularizer's per-client inputs ``[m, ...]`` with a zero scratch row: ``[m + 1, ...]``."""
    if inputs is None:
        return None
    return {k: torch.cat([v, v.new_zeros(1, *v.shape[1:])]) for k, v in inputs.items()}


class _Slot:
    """One share's (run's) own part of a workspace: its global model (the anchor of FedProx and
    FedLap), its optimizer and optimizer state, its regularizer's state; ``rows`` = its clients
    and its scratch row."""

    def __init__(self, share, rows: int):
        self.anchor = {k: v.clone() for k, v in share.params.items()}
        self.names = list(share.params)
        self.optimizer = share.engine.local.make_optimizer()
        stacked = [torch.zeros(rows, *v.shape, dtype=v.dtype, device=v.device) for v in share.params.values()]
        self.opt_state = self.optimizer.init(stacked)
        if "step" in self.opt_state:  # one Adam step counter per row
            self.opt_state["step"] = torch.zeros(rows, dtype=torch.float64, device=stacked[0].device)
        reg = share.engine.regularizer
        self.reg_state = None if reg is None else _clone_tree(reg.init(self.anchor, rows, _padded(share.inputs)))

    @torch.no_grad()
    def load(self, share, clients: int) -> None:
        for k, v in share.params.items():
            self.anchor[k].copy_(v)
        for k, v in state_dict(self.opt_state, self.names).items():
            v.zero_()
            if share.opt_states is not None:
                v[:clients].copy_(share.opt_states[k])
        reg = share.engine.regularizer
        if reg is not None:
            fresh = reg.init(self.anchor, clients + 1, _padded(share.inputs))
            if _tree(fresh) != _tree(self.reg_state):
                raise RuntimeError("the regularizer's state changed shape between rounds")  # signature() prevents it
            _copy_tree(self.reg_state, fresh)


class Workspace:
    """The fixed tensors of one chunk's shape (its shares' clients), reused round after round.

    Rows: share after share, each share's clients and then its scratch row, which its padding rows
    read and write (share n's first client is row ``lo_n + n``).  :meth:`load` copies a round's
    starting state in: each share's global model into all its rows, its scratch row included, so
    padding computes on finite values."""

    def __init__(self, shares, signature: tuple):
        self.signature = signature
        self.sizes = [len(s.clients) for s in shares]
        self.offsets = [sum(self.sizes[:n]) + n for n in range(len(shares))]
        rows = sum(self.sizes) + len(shares)
        first = shares[0]
        device = next(iter(first.params.values())).device
        self.stacked = {k: torch.zeros(rows, *v.shape, dtype=v.dtype, device=device) for k, v in first.params.items()}
        self.bufs = {k: torch.zeros(rows, *v.shape, dtype=v.dtype, device=device) for k, v in first.buffers.items()}
        self.slots = [_Slot(share, size + 1) for share, size in zip(shares, self.sizes)]
        self.loss_sum = torch.zeros(rows, dtype=torch.float64, device=device)
        self.reg_sum = torch.zeros(rows, dtype=torch.float64, device=device)
        self._inputs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs = StepGraphs()

    @staticmethod
    def signature(shares) -> tuple:
        """What must not change for the workspace (and its graphs) to serve a round."""
        described = lambda d: tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in d.items())  # noqa: E731
        return tuple((len(s.clients), described(s.params), described(s.buffers), s.engine.local.make_optimizer(),
                      id(s.engine.regularizer), None if s.inputs is None else described(s.inputs)) for s in shares)

    def rows(self, n: int) -> slice:
        """Share n's rows, its scratch row included."""
        return slice(self.offsets[n], self.offsets[n] + self.sizes[n] + 1)

    @torch.no_grad()
    def load(self, shares) -> None:
        """This round's starting state (class docstring), fresh or carried optimizer state, the
        regularizers' states for these clients, zero loss sums."""
        for n, share in enumerate(shares):
            rows = self.rows(n)
            for k, v in share.params.items():
                self.stacked[k][rows].copy_(v)  # broadcast over the share's rows
            for k, v in share.buffers.items():
                self.bufs[k][rows].copy_(v)
            first = self.offsets[n]  # the share's clients' own layers over w_t's (not the scratch row)
            for k, v in (share.own or {}).items():
                (self.stacked if k in self.stacked else self.bufs)[k][first:first + len(share.clients)].copy_(v)
            self.slots[n].load(share, self.sizes[n])
        self.loss_sum.zero_()
        self.reg_sum.zero_()

    def inputs(self, padded: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed buffers a step of G rows and batch size b reads: its rows ``[G]`` and batch ``[G, b]``."""
        key = (padded, size)
        if key not in self._inputs:
            device = self.loss_sum.device
            self._inputs[key] = (torch.zeros(padded, dtype=torch.long, device=device),
                                 torch.zeros(padded, size, dtype=torch.long, device=device))
        return self._inputs[key]


class Workspaces:
    """An engine's workspaces by :meth:`Workspace.signature`, the most recently used kept."""

    def __init__(self, limit: int = WORKSPACES):
        self.limit, self._kept = limit, {}

    def get(self, shares) -> Workspace:
        signature = Workspace.signature(shares)
        ws = self._kept.pop(signature, None) or Workspace(shares, signature)
        self._kept[signature] = ws  # most recent last
        while len(self._kept) > self.limit:
            self._kept.pop(next(iter(self._kept)))
        ws.load(shares)
        return ws


class StepGraphs:
    """A workspace's captured steps, one CUDA graph per key (module docstring).

    ``run(key, fn)``: ``fn`` (a step on the workspace's fixed buffers) is run eagerly for its key's
    first ``warmup`` calls, captured on the next and replayed then and ever after.  A capture that
    fails (an operation CUDA graphs refuse) turns capturing off for the workspace, says why in one
    line, and runs the step eagerly: results do not depend on capturing."""

    def __init__(self, warmup: int = WARMUP):
        self.warmup = warmup
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.seen: dict[tuple, int] = {}
        self.pool = None
        self.failed: str | None = None
        self.captures = self.replays = 0

    def run(self, key: tuple, fn) -> None:
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return
        if self.failed is not None:
            fn()
            return
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] <= self.warmup:
            self._side_stream(fn)
            return
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                fn()  # recorded, not run
        except Exception as e:  # noqa: BLE001 - any refusal: eager from here on
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("engine.capture: the step could not be captured (%s); it runs eagerly", self.failed)
            torch.cuda.synchronize()
            fn()
            return
        self.pool = graph.pool()  # the graphs share one memory pool: they never run at once
        self.graphs[key] = graph
        if not self.captures:
            log.info("engine.capture: the lock-steps are captured as CUDA graphs, one a step shape, and replayed")
        self.captures += 1
        graph.replay()
        self.replays += 1

    @staticmethod
    def _side_stream(fn) -> None:
        """Warm-up runs on a side stream, as ``torch.cuda.graph``'s documentation asks."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
