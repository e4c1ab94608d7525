"""Local training: "train these m clients from w_t, return their stacked updates".

This is the hot path (~99% of a run).  The interface is one method,
``engine.train(params, buffers, clients, round_) -> ClientResults``, so a batched engine can
replace the :class:`SequentialEngine` without touching aggregators: everything downstream reads
stacked ``[m, *shape]`` tensors.

Local training is the client side of FedAvg (Nagura et al., Alg. 2): split the client's data into
batches of B, run E epochs of ``w <- w - eta grad l(w; batch)`` (SGD, optionally with momentum,
Nesterov and weight decay, or Adam: :mod:`fedrun.optim`), plus the method's regularizer.  The
optimizer state starts from zero every round (``optimizer_state: reset``), or is passed in and
returned stacked, for the server to average (``average``: the parameter-divergence paper's "-A")
or for each client to keep (``local``: its "-WB").  A straggler runs fewer epochs.  The batch
order of client k in round t comes from a generator seeded by ``(seed, round, client)``, and so do
its dropout masks and data augmentation, so every method sees the same batches.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from fedrun.errors import ConfigError, check
from fedrun.nwda import Params
from fedrun.optim import load_state, lr_factor, make_optimizer, state_dict
from fedrun.regularizers import Regularizer
from fedrun.seeding import derive_seed, torch_generator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalTraining:
    """How clients train: Nagura et al. Table 1 (E, B, eta, lambda), Adam for FedLayerWise, and
    the parameter-divergence paper's optimizer-state averaging, decoupled weight decay, step
    learning-rate decay and data augmentation (its sec. 2.2, 4.2, Appendix A.2, C.6)."""

    epochs: int = 1
    batch_size: int = 50
    lr: float = 0.05
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    optimizer: str = "sgd"  # sgd | adam
    betas: tuple[float, float] = (0.9, 0.999)  # Adam
    weight_decay_mode: str = "coupled"  # coupled (L2 in the gradient) | decoupled (SGDW/AdamW)
    optimizer_state: str = "reset"  # reset every round | average (-A) | local (-WB)
    lr_milestones: tuple[float, ...] = ()  # fractions of the rounds after which lr *= lr_gamma
    lr_gamma: float = 0.1
    augment: object = None  # fedrun.augment.Augmentation applied to every training batch, or None

    def __post_init__(self):
        check(self.epochs >= 1, "hyperparams.local_epochs", self.epochs, "must be >= 1")
        check(self.batch_size >= 1, "hyperparams.batch_size", self.batch_size, "must be >= 1")
        check(self.lr > 0, "hyperparams.lr", self.lr, "must be > 0")
        check(0 <= self.momentum < 1, "hyperparams.momentum", self.momentum, "must be in [0, 1)")
        check(not self.nesterov or self.momentum > 0, "hyperparams.nesterov", self.nesterov,
              "needs hyperparams.momentum > 0")
        check(self.weight_decay >= 0, "hyperparams.weight_decay", self.weight_decay, "must be >= 0")
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise ConfigError("hyperparams.optimizer_state", self.optimizer_state,
                              f"choose one of: {', '.join(OPTIMIZER_STATES)}")
        check(all(0 < f < 1 for f in self.lr_milestones), "hyperparams.lr_milestones",
              list(self.lr_milestones), "fractions of the rounds, each in (0, 1)")
        check(0 < self.lr_gamma <= 1, "hyperparams.lr_gamma", self.lr_gamma, "must be in (0, 1]")
        self.make_optimizer()  # validates the optimizer's name and settings

    def make_optimizer(self):
        return make_optimizer(self.optimizer, self.lr, self.momentum, self.nesterov,
                              self.weight_decay, tuple(self.betas), weight_decay_mode=self.weight_decay_mode)

    def lr_at(self, round_: int, rounds: int) -> float:
        """Round ``round_``'s learning rate under the step decay (:func:`fedrun.optim.lr_factor`)."""
        return self.lr * lr_factor(round_, rounds, tuple(self.lr_milestones), self.lr_gamma)

    @property
    def carries_state(self) -> bool:
        """Whether the optimizer state outlives a round (it has one, and it is not reset)."""
        return self.optimizer_state != "reset" and bool(self.fresh_state({"w": torch.zeros(1)}))

    def fresh_state(self, params: Params) -> Params:
        """A zero optimizer state as named tensors (``momentum.<p>``, ``exp_avg.<p>``, ``step``...):
        what a client starts from when it has no state; zeros are exactly ``init``'s state."""
        names = list(params)
        return state_dict(self.make_optimizer().init([params[k] for k in names]), names)


OPTIMIZER_STATES = ("reset", "average", "local")


@dataclass
class ClientResults:
    """One round's client outputs, stacked along a leading client dimension of size m."""

    clients: list[int]
    deltas: Params  # w_k - w_t per parameter, [m, *shape]
    buffers: Params  # final buffers per client, [m, *shape]
    num_examples: torch.Tensor  # [m] n_k
    loss: torch.Tensor  # [m] mean local training loss over all local steps (without regularizer)
    steps: torch.Tensor  # [m] optimizer steps taken
    epochs: torch.Tensor  # [m] local epochs run (fewer than E for stragglers)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # [m] regularizer diagnostics
    opt_states: Params | None = None  # final optimizer states [m, ...] when they outlive the round


def split_state(model: nn.Module) -> tuple[Params, Params]:
    """Detached copies of the model's trainable parameters and of its buffers."""
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    return params, buffers


# ----------------------------------------------------------------------------- precision, compile
# Shared by both engines (fedrun.batched imports them).

PRECISIONS = ("fp32", "tf32", "bf16")


def check_engine_options(precision: str, compile: bool) -> None:
    """One-line errors for ``engine.precision`` / ``engine.compile`` (the CLI prints them)."""
    check(precision in PRECISIONS, "engine.precision", precision, f"choose one of: {', '.join(PRECISIONS)}")
    check(isinstance(compile, bool), "engine.compile", compile, "must be true or false")


@contextlib.contextmanager
def precision_scope(precision: str, device: torch.device):
    """TF32 on or off for local training, restored afterwards (so evaluation is untouched).

    PyTorch lets cuDNN convolutions use TF32 by default while matmuls stay IEEE FP32; here
    ``fp32`` (and ``bf16``, whose non-autocast ops run in float32) turns both off, so "fp32"
    really is FP32 and the FLOP-floor figures, which assume an FP32 peak, mean what they say;
    ``tf32`` turns both on.  A no-op off CUDA.
    """
    if device.type != "cuda":
        yield
        return
    restore = set_tf32(precision == "tf32")
    try:
        yield
    finally:
        restore()


def set_tf32(on: bool):
    """Turn TF32 on or off for CUDA matmuls and cuDNN convolutions; returns a function that
    restores the previous settings.

    PyTorch >= 2.9 has per-backend ``fp32_precision`` flags ("ieee" | "tf32" | "none" =
    inherit) and deprecates ``allow_tf32``; once a user has set the new flags, reading the old
    ones raises ("mix of the legacy and new APIs").  So the new API is used wherever it exists.
    """
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(conv, "conv"):
        saved = matmul.fp32_precision, conv.conv.fp32_precision
        matmul.fp32_precision = conv.conv.fp32_precision = "tf32" if on else "ieee"

        def restore():
            matmul.fp32_precision, conv.conv.fp32_precision = saved
    else:  # PyTorch < 2.9
        saved = matmul.allow_tf32, conv.allow_tf32
        matmul.allow_tf32 = conv.allow_tf32 = on

        def restore():
            matmul.allow_tf32, conv.allow_tf32 = saved
    return restore


def autocast(precision: str, device: torch.device):
    """bf16 autocast around the forward pass; parameters, gradients and optimizer state stay FP32.

    The loss is computed outside it, from the logits cast back to float32.  Caveat measured on
    CPU: under ``vmap`` (the batched engine) CPU autocast does not reach convolutions (the batching
    rule calls ``aten::convolution``, which is not in CPU autocast's list; on CUDA it is), so on
    a CPU only the linear layers' matmuls run in bf16 there.
    """
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def _is_compile_failure(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) comes from torch.compile's machinery."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(c.__module__.startswith(("torch._dynamo", "torch._inductor")) for c in type(e).__mro__):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def compile_errors(enabled: bool):
    """Turn a torch.compile failure (no C++ compiler, an unsupported op...) into one line.

    Compilation happens at the first call (and again for each new batch shape), deep inside a
    round, where a traceback of dynamo internals tells the user nothing actionable; the fix is
    always the same, so the error says it.
    """
    try:
        yield
    except Exception as e:
        if not enabled or not _is_compile_failure(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError("engine.compile", "true", f"torch.compile failed ({type(e).__name__}: {first}); "
                          "run with engine.compile=false") from e


class SequentialEngine:
    """One client after another on one ``nn.Module``: the reference every engine is checked against.

    Args:
      model: the architecture (its weights are overwritten with ``w_t`` for every client).
      train_x, train_y: the whole training set, already on the device.
      client_indices: the partition, one index tensor per client (on the device).
      local: the client optimizer.
      regularizer: added to the loss (FedProx), or None.
      seed: the run's seed.
      precision: ``fp32`` (default), ``tf32`` (CUDA only; :func:`precision_scope`) or ``bf16``
        (autocast of the forward pass, :func:`autocast`).
      compile: ``torch.compile`` the model's forward (off by default: compiling costs tens of
        seconds on a CPU and pays only on long GPU runs).
    """

    def __init__(self, model: nn.Module, train_x: torch.Tensor, train_y: torch.Tensor,
                 client_indices: list[torch.Tensor], local: LocalTraining,
                 regularizer: Regularizer | None, seed: int, precision: str = "fp32", compile: bool = False):
        check_engine_options(precision, compile)
        self.model, self.x, self.y = model, train_x, train_y
        self.indices, self.local, self.regularizer, self.seed = client_indices, local, regularizer, seed
        self.precision, self.compile = precision, compile
        if precision == "tf32" and train_x.device.type != "cuda":
            log.info("engine.precision=tf32 has no effect on %s (TF32 is a CUDA mode): training in FP32",
                     train_x.device.type)
        # The compiled module shares the model's parameters, which load_state_dict updates in place.
        self._forward = torch.compile(model) if compile else model

    def train(self, params: Params, buffers: Params, clients: list[int], round_: int,
              epochs: list[int] | None = None, lr: float | None = None,
              opt_states: Params | None = None) -> ClientResults:
        """Train ``clients`` from ``w_t = params``.

        Args:
          epochs: client j runs ``epochs[j]`` epochs (default E).
          lr: this round's learning rate (default ``local.lr``; the schedule is the caller's).
          opt_states: the clients' starting optimizer states, named tensors stacked ``[m, ...]``
            (:meth:`LocalTraining.fresh_state`); their final states come back in
            ``ClientResults.opt_states``.  None: a fresh state each, nothing returned.
        """
        with precision_scope(self.precision, self.x.device), compile_errors(self.compile):
            return self._train(params, buffers, clients, round_, epochs, lr, opt_states)

    def _train(self, params, buffers, clients, round_, epochs, lr, opt_states) -> ClientResults:
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
            losses[j], steps[j], metrics, end = self._train_client(params, buffers, k, round_, epochs[j], lr, start)
            if final_states is not None:
                for name, v in end.items():
                    final_states[name][j] = v
            for name, value in metrics.items():
                extras.setdefault(name, torch.full((m,), float("nan"), dtype=torch.float64))[j] = value
            for name, p in self.model.named_parameters():
                deltas[name][j] = p.detach() - params[name]
            for name, b in self.model.named_buffers():
                stacked_buffers[name][j] = b
        sizes = torch.tensor([len(self.indices[k]) for k in clients])
        return ClientResults(list(clients), deltas, stacked_buffers, sizes, losses, steps,
                             torch.tensor(epochs), extras, final_states)

    def _train_client(self, params: Params, buffers: Params, client: int, round_: int, epochs: int,
                      lr: float | None = None, start_state: Params | None = None):
        model, local, reg = self.model, self.local, self.regularizer
        model.load_state_dict({**params, **buffers})
        model.train()
        names = [name for name, _ in model.named_parameters()]
        weights = [p for _, p in model.named_parameters()]
        live = dict(zip(names, weights))
        optimizer = local.make_optimizer()
        opt_state = optimizer.init(weights)
        if start_state is not None:
            opt_state = load_state(start_state, opt_state, names)
        # Dropout (and any other randomness in the forward pass) is seeded per (round, client).
        torch.manual_seed(derive_seed(self.seed, "forward", round_, client))
        shuffle = torch_generator(self.seed, "shuffle", round_, client)
        augment = local.augment
        augment_draws = torch_generator(self.seed, "augment", round_, client) if augment else None
        idx = self.indices[client]
        n = len(idx)
        loss_sum = torch.zeros((), dtype=torch.float64, device=idx.device)
        reg_sum = torch.zeros((), dtype=torch.float64, device=idx.device)
        steps = 0
        if reg is not None:
            reg.start_client(params)
        for epoch in range(epochs):
            if reg is not None:
                reg.start_epoch(epoch, live, params)
            order = idx[torch.randperm(n, generator=shuffle).to(idx.device)]
            for start in range(0, n, local.batch_size):
                batch = order[start : start + local.batch_size]
                x = self.x[batch] if augment is None else augment(self.x[batch], augment_draws)
                with autocast(self.precision, x.device):
                    logits = self._forward(x)
                loss = F.cross_entropy(logits.float(), self.y[batch])
                total = loss
                if reg is not None:
                    penalty = reg.penalty(live, params)
                    total = loss + penalty
                    reg_sum += penalty.detach()
                grads = torch.autograd.grad(total, weights)
                optimizer.step(weights, grads, opt_state, lr)
                loss_sum += loss.detach() * len(batch)
                steps += 1
        metrics = {} if reg is None else {"reg_loss": float(reg_sum) / max(steps, 1), **reg.metrics()}
        end_state = None if start_state is None else state_dict(opt_state, names)
        return float(loss_sum) / (n * epochs), steps, metrics, end_state


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
