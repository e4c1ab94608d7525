"""Client-side regularizers: terms added to the local loss.

A method that changes local optimization (FedProx, FedLap, SCAFFOLD's correction) is a
regularizer; everything else about local training is the same loop for every method.  There is
one form, for m clients stacked along a leading dimension, with its state as data (a dict of
``[m, ...]`` tensors the engine holds): the batched engine calls it with a round's chunk of
clients, the sequential engine with m = 1, so the two engines compute the same thing by
construction.  A regularizer may take per-client *inputs* from the server (SCAFFOLD's
``c - c_k``, :mod:`fedrun.server.corrections`): stacked ``[m, ...]`` like the state, handed to ``init``
for exactly the clients it is initialized with.
"""
from __future__ import annotations

import copy

import torch

from fedrun.errors import ConfigError, check
from fedrun.models.layers import Layer
from fedrun.params import Params


class Regularizer:
    """Interface, for clients whose live parameters are stacked ``[g, *shape]``.

    * ``init(anchor, m, inputs=None) -> state``: before m clients train from the global model
      ``anchor = w_t``; ``inputs`` (or None) are the server's per-client tensors for these m
      clients, stacked ``[m, ...]`` in their order (a chunk's rows in the batched engine);
    * ``start_epoch(state, rows, first, stacked, anchor)``: clients ``rows`` (an index tensor into
      the m) start a local epoch, ``first`` (bool ``[g]``) marks their first; FedLap recomputes its
      coefficients here;
    * ``penalty(state, stacked, anchor, rows) -> [g]``: each client's term, added to its loss at
      every local step; separable over clients, so one backward serves them all;
    * ``closed_form(state, stacked, anchor, rows) -> (penalty [g], {name: gradient}) | None``: the
      same penalty's value and its gradient with respect to ``stacked``, written out, which the
      engines add to the loss's gradient instead of differentiating ``penalty`` (saving its
      backward: about a hundred small operators a step for the CNNs here); None (the default):
      autograd differentiates ``penalty``.  Both ways give the same bits
      (tests/test_regularizers.py);
    * ``metrics(state) -> {name: [m] tensor}``: per-client diagnostics for ``clients.csv``;
    * ``after_step(state, stacked, rows, lr)``: only where ``acts_after_step`` is True, a change to
      the clients' parameters after each optimizer step, outside the optimizer (SCAFFOLD as
      NIID-Bench's code applies it); the engines call it under ``torch.no_grad``.

    The run hands its regularizer the model's layers before training (:meth:`for_layers`), so
    a method may treat conv, dense (``fc``) and normalization layers apart, as the engines and
    the per-layer diagnostics do: ``self.layers`` and ``self.kind(param)``.
    """

    acts_after_step = False
    layers: tuple[Layer, ...] = ()  # the model's layers (fedrun.models.layers.layers), set by for_layers

    def for_layers(self, layers) -> Regularizer:
        """A copy of this regularizer that knows the model's layers (each a
        :class:`~fedrun.models.layers.Layer`: its name, kind ``conv`` | ``fc`` | ``norm`` | ``other`` and
        parameter names).  A copy, so one aggregator's regularizer serves runs of other models."""
        out = copy.copy(self)
        out.layers = tuple(layers)
        out._kinds = {name: layer.type for layer in out.layers for name in layer.params}
        return out

    def kind(self, param: str) -> str:
        """The kind of the layer that owns parameter ``param`` (``conv``, ``fc``, ``norm``,
        ``other``); ``other`` before :meth:`for_layers` or for a name no layer owns."""
        return getattr(self, "_kinds", {}).get(param, "other")

    def init(self, anchor: Params, m: int, inputs: Params | None = None) -> dict:
        return {}

    def start_epoch(self, state: dict, rows: torch.Tensor, first: torch.Tensor, stacked: Params,
                    anchor: Params) -> None:
        pass

    def penalty(self, state: dict, stacked: Params, anchor: Params, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def closed_form(self, state: dict, stacked: Params, anchor: Params,
                    rows: torch.Tensor) -> tuple[torch.Tensor, Params] | None:
        """``(penalty, gradient)`` without autograd, or None; called under ``torch.no_grad``.  A
        parameter missing from ``gradient`` gets none from the penalty."""
        return None

    def metrics(self, state: dict) -> dict[str, torch.Tensor]:
        return {}

    def after_step(self, state: dict, stacked: Params, rows: torch.Tensor, lr: float) -> None:
        pass


class Proximal(Regularizer):
    """FedProx's proximal term (Nagura et al. eq. 7; Li et al.): ``mu/2 ||w - w_t||^2``.

    Args:
      mu: strength, >= 0 (Table 5: 0.005-0.02); 0 is FedAvg.
    """

    def __init__(self, mu: float):
        check(mu >= 0, "aggregator.mu", mu, "must be >= 0")
        self.mu = mu

    def penalty(self, state, stacked, anchor, rows):
        return 0.5 * self.mu * sum((stacked[k] - anchor[k]).pow(2).flatten(1).sum(1) for k in anchor)

    def closed_form(self, state, stacked, anchor, rows):
        """The penalty, and its gradient ``mu (w - w_t)``: autograd's ``(mu/2) * 2 (w - w_t)``
        rounds once to the same float, since halving and doubling are exact."""
        names = list(anchor)
        # On all tensors at once (a few kernels on a GPU): the same elementwise arithmetic.
        diffs = torch._foreach_sub([stacked[k] for k in names], [anchor[k] for k in names])
        value = 0.5 * self.mu * sum(d.pow(2).flatten(1).sum(1) for d in diffs)
        torch._foreach_mul_(diffs, self.mu)
        return value, dict(zip(names, diffs))


FEDLAP_FORMS = ("linear", "interpolate")
FEDLAP_VECTORS = ("fan_out", "fan_in")


def neuron_view(t: torch.Tensor, vectors: str = "fan_out") -> torch.Tensor:
    """``[neurons, length]``: FedLap's per-neuron vectors of one parameter tensor.

    ``fan_out`` (eq. 5-8 as written): row j of ``W_l`` (``n_l x n_{l+1}``), the weights *leaving*
    input neuron j.  A PyTorch ``Linear`` weight is ``[out, in]``, so that vector is column j; a
    conv weight ``[out, in, kh, kw]`` gives one vector per input channel j (``W[:, j]``, all
    filters and taps).  ``fan_in``: row j of PyTorch's ``[out, in]`` weight (the paper's code is
    PyTorch 1.6), the weights *entering* output neuron j; for a conv weight one vector per filter.
    A 1-D tensor (a bias, BatchNorm's scale or shift) is one vector either way.
    """
    if t.ndim == 1:
        return t.unsqueeze(0)
    return t.flatten(1) if vectors == "fan_in" else t.transpose(0, 1).flatten(1)


def _stacked_neuron_view(w: torch.Tensor, vectors: str) -> torch.Tensor:
    """:func:`neuron_view` of each client's tensor in ``w`` (``[g, *shape]``): ``[g, neurons, length]``."""
    if w.ndim == 2:
        return w.unsqueeze(1)
    return w.flatten(2) if vectors == "fan_in" else w.transpose(1, 2).flatten(2)


def _coefficient_shape(v: torch.Tensor, vectors: str) -> tuple[int, ...]:
    """The shape, after the client axis, of one coefficient per neuron vector of parameter ``v``,
    broadcastable over ``v``'s shape: ``(1, in, 1, ...)`` (fan-out), ``(out, 1, ...)`` (fan-in),
    ``(1,)`` for a 1-D tensor."""
    if v.ndim == 1:
        return (1,)
    if vectors == "fan_in":
        return (v.shape[0],) + (1,) * (v.ndim - 1)
    return (1, v.shape[1]) + (1,) * (v.ndim - 2)


class LayerAdaptive(Regularizer):
    """FedLap's layer-wise regularizer (Charteros & Koutsopoulos eq. 10):
    ``h_k = l_k + 1/2 sum_l <c_l, d_l>``, with per neuron j of layer l

    * ``lambda_{l,j} = 1 - cos(w^k_{l,j}, w^g_{l,j})`` (eq. 5, 7), computed at the start of every
      local epoch and held fixed during it (Algorithm 1 line 16); 0 in the first epoch, where the
      local model still equals the global one, so regularization starts in epoch 2;
    * ``d_{l,j} = ||w^k_{l,j} - w^g_{l,j}||^2`` (eq. 8), differentiated at every step;
    * ``c = q lambda`` (``form=linear``, default: q scales eq. 10; q = 0 is FedAvg exactly), or
      ``c = q lambda^(1-q)`` (``form=interpolate``: q = 0 is FedAvg, q = 1 is FedProx with mu = 1,
      the endpoints the paper names);
    * a neuron's vector is its fan-out (``vectors=fan_out``, eq. 5-8 as written) or its fan-in
      (``vectors=fan_in``: the rows of PyTorch's weight), :func:`neuron_view`.

    What q means: eq. 10 as printed, ``1/2 sum_l <lambda_l, d_l>``, has no q; the paper names
    q the regularization's importance in [0, 1] and gives no formula.  In the linear form the
    penalty is ``q/2 sum_l <lambda_l, d_l>``, so eq. 10 as printed is q = 1 and the default
    q = 0.5 (the paper's value) is half of it; ``aggregator.q=1`` gives eq. 10 exactly.

    Args:
      q: importance in [0, 1] (the paper uses 0.5; 1 is eq. 10 as printed in the linear form).
      form: ``linear`` or ``interpolate``.
      vectors: ``fan_out`` or ``fan_in``.
    """

    def __init__(self, q: float = 0.5, form: str = "linear", vectors: str = "fan_out"):
        check(0 <= q <= 1, "aggregator.q", q, "must be in [0, 1]")
        if form not in FEDLAP_FORMS:
            raise ConfigError("aggregator.form", form, f"choose one of: {', '.join(FEDLAP_FORMS)}")
        if vectors not in FEDLAP_VECTORS:
            raise ConfigError("aggregator.vectors", vectors, f"choose one of: {', '.join(FEDLAP_VECTORS)}")
        self.q, self.form, self.vectors = q, form, vectors

    def _coefficient(self, lam: torch.Tensor) -> torch.Tensor:
        return self.q * lam if self.form == "linear" else self.q * lam.pow(1 - self.q)

    def init(self, anchor, m, inputs=None):
        """Per client: the coefficients ``c`` per neuron (broadcastable over its parameter's
        stacked shape) and the running sum of its epochs' mean lambda, for ``lambda_mean``."""
        coef = {k: torch.zeros(m, *_coefficient_shape(v, self.vectors), dtype=v.dtype, device=v.device)
                for k, v in anchor.items()}
        device = next(iter(anchor.values())).device
        return {"coef": coef, "lambda_sum": torch.zeros(m, dtype=torch.float64, device=device),
                "epochs": torch.zeros(m, dtype=torch.float64, device=device)}

    @torch.no_grad()
    def start_epoch(self, state, rows, first, stacked, anchor):
        """Recompute lambda for the clients ``rows`` starting an epoch (``first``: their first)."""
        g = len(rows)
        total, count = torch.zeros(g, dtype=torch.float64, device=rows.device), 0
        for name, w in stacked.items():
            wk = w[rows]
            vk = _stacked_neuron_view(wk, self.vectors)  # [g, neurons, length]
            vg = neuron_view(anchor[name], self.vectors).unsqueeze(0)
            lam = (1 - torch.cosine_similarity(vk, vg, dim=2, eps=1e-12)).clamp(0, 2)
            lam = torch.where(first.view(-1, 1), torch.zeros_like(lam), lam)
            total += lam.double().sum(1)
            count += lam.shape[1]
            state["coef"][name][rows] = self._coefficient(lam).view(state["coef"][name][rows].shape)
        # Epochs after the first count toward lambda_mean; added as zeros for the first ones, not
        # selected with a boolean mask, which would wait for the GPU (a mask's size is data).
        later = (~first).to(total.dtype)
        state["lambda_sum"].index_add_(0, rows, later * (total / count))
        state["epochs"].index_add_(0, rows, later)

    def penalty(self, state, stacked, anchor, rows):
        return 0.5 * sum((state["coef"][k][rows] * (stacked[k] - anchor[k]).pow(2)).flatten(1).sum(1)
                         for k in anchor)

    def closed_form(self, state, stacked, anchor, rows):
        """The penalty, and its gradient ``c (w - w_g)`` per neuron vector (autograd's
        ``(c/2) * 2 (w - w_g)``, the same float)."""
        diffs = {k: stacked[k] - anchor[k] for k in anchor}
        coef = {k: state["coef"][k][rows] for k in anchor}
        value = 0.5 * sum((coef[k] * d.pow(2)).flatten(1).sum(1) for k, d in diffs.items())
        return value, {k: d.mul_(coef[k]) for k, d in diffs.items()}

    def metrics(self, state):
        return {"lambda_mean": (state["lambda_sum"] / state["epochs"].clamp_min(1)).cpu()}


class ControlVariate(Regularizer):
    """SCAFFOLD's local correction (Karimireddy et al., ICML 2020, Algorithm 1 line 10) as a
    linear term: client k's penalty is ``<c - c_k, y - x>``, whose gradient ``c - c_k`` is added
    to the loss's at every local step, so SGD takes Algorithm 1's step

        y <- y - eta_l (g_k(y) - c_k + c)

    (with momentum or weight decay, the corrected gradient is what the optimizer gets).  ``c - c_k``
    is the server's input for each client (:func:`fedrun.server.corrections.control_variates`), fixed for
    the round.  The value, ``<c - c_k, y - x>`` (0 at the start; ``x = w_t`` the anchor), is
    what ``clients.csv``'s ``reg_loss`` averages over the steps.  Without inputs (the PD-VL
    reference learner, which is no client) the correction is 0.
    """

    CORRECTIONS = ("gradient", "after_step")

    def __init__(self, correction: str = "gradient"):
        """``correction``: ``gradient`` (Algorithm 1: the corrected gradient goes through the client
        optimizer, momentum and weight decay included) or ``after_step`` (NIID-Bench's code: after
        each optimizer step on the plain gradient, ``y <- y - eta_l (c - c_k)``, outside the momentum;
        the penalty's value is still reported, without its gradient)."""
        if correction not in self.CORRECTIONS:
            raise ValueError(f"correction must be one of {', '.join(self.CORRECTIONS)} (got {correction!r})")
        self.correction = correction
        self.acts_after_step = correction == "after_step"

    def init(self, anchor, m, inputs=None):
        return {"correction": inputs}

    def penalty(self, state, stacked, anchor, rows):
        correction = state["correction"]
        if correction is None:
            return next(iter(stacked.values())).new_zeros(len(rows))
        value = sum((correction[k][rows] * (stacked[k] - anchor[k])).flatten(1).sum(1) for k in anchor)
        return value.detach() if self.acts_after_step else value

    def closed_form(self, state, stacked, anchor, rows):
        """The penalty, and its gradient ``c - c_k`` (none under ``after_step``, which corrects
        after the optimizer's step instead)."""
        correction = state["correction"]
        if correction is None:
            return next(iter(stacked.values())).new_zeros(len(rows)), {}
        names = list(anchor)
        rowed = [correction[k][rows] for k in names]
        # (c - c_k) * (y - x) on all tensors at once: the penalty's elementwise arithmetic, in its order.
        terms = torch._foreach_mul(rowed, torch._foreach_sub([stacked[k] for k in names], [anchor[k] for k in names]))
        value = sum(t.flatten(1).sum(1) for t in terms)
        return value, {} if self.acts_after_step else dict(zip(names, rowed))

    def after_step(self, state, stacked, rows, lr):
        """``after_step`` only: ``y <- y - eta_l (c - c_k)`` for the clients ``rows``, in place."""
        correction = state["correction"]
        if correction is None:
            return
        for k, v in stacked.items():
            v.sub_(correction[k][rows].to(v.dtype), alpha=lr)
