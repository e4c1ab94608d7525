"""A stand-in GPU on the CPU: catch, in the CPU suite, the device mixes that only CUDA refuses.

On a GPU the engines return the updates (``deltas``, buffers, optimizer states) on the model's
device and the per-client counts (``n_k``, steps, losses, learning rates) on the CPU.  An op that
combines a CPU tensor of one or more dimensions with a CUDA tensor fails there ("Expected all
tensors to be on the same device"), and passes unnoticed on a CPU.  Inside :func:`fake_gpu`, CPU
tensors marked "on the GPU" play the CUDA ones:

* ``x.to(FAKE)`` (a copy, as a real move is), a factory called with ``device=FAKE``, and
  ``model.to(FAKE)`` mark their results; :func:`on_gpu` marks tensors in place (test inputs);
* an op with a marked input marks its outputs, and ``.device`` of a marked tensor answers ``FAKE``;
* an op that mixes a marked tensor with an unmarked one of one or more dimensions raises
  :class:`DeviceMix`, as CUDA does; 0-dim CPU tensors and CPU indices in ``x[idx]`` /
  ``x[idx] = v`` are allowed, as on CUDA;
* ``.cpu()`` / ``.to("cpu")`` give an unmarked copy; ``.numpy()`` of a marked tensor raises.

The mark is an attribute of the tensor object, never a subclass: a subclass would wrap every
view in a new object, and autograd then loses the gradient through a view of a parameter updated
in place (the sequential engine's regularizer inputs).  ``FAKE`` is ``torch.device("meta")``: a
device torch knows without an accelerator, so code that compares devices runs unchanged; no tensor
is ever really on it.

Not covered: ``torch.func`` transforms (vmap's batched tensors carry no mark), so the batched
engine's inside runs unchecked; tests/test_cuda.py checks it on a real GPU.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

FAKE = torch.device("meta")
_MARK = "_fedrun_on_fake_gpu"


class DeviceMix(RuntimeError):
    pass


def is_on_gpu(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _MARK, False)


def _mark(x):
    def mark(t):
        if isinstance(t, torch.Tensor):
            setattr(t, _MARK, True)
        return t
    return tree_map(mark, x)


def on_gpu(x):
    """``x`` (a tensor, or a dict / list of them) "moved to the GPU": copies, marked."""
    return tree_map(lambda t: _mark(t.clone()) if isinstance(t, torch.Tensor) else t, x)


def _is_fake(device) -> bool:
    return device is not None and torch.device(device) == FAKE


_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
_UNCHECKED = {torch._has_compatible_shallow_copy_type}  # nn.Module.to's own type test, no arithmetic


class _FakeGPU(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func == torch.Tensor.device.__get__:  # a fresh method-wrapper each time: == not is
            return FAKE if is_on_gpu(args[0]) else func(*args)
        if func == torch.Tensor.data.__set__:  # nn.Module.to: param.data = moved
            func(*args)
            if is_on_gpu(args[1]):
                _mark(args[0])
            return None
        if func is torch.Tensor.numpy and is_on_gpu(args[0]):
            raise DeviceMix("can't convert a cuda tensor to numpy: use .cpu() first")
        if func is torch.Tensor.cpu:
            return args[0].clone() if is_on_gpu(args[0]) else func(*args, **kwargs)  # a real move copies
        to_gpu = to_host = False
        if kwargs.get("device") is not None:
            to_gpu, to_host = _is_fake(kwargs["device"]), not _is_fake(kwargs["device"])
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:  # to(device, dtype, ...), to(dtype, ...) or to(other, ...)
            rest = []
            for a in args[1:]:
                if isinstance(a, (str, torch.device)):
                    to_gpu, to_host, a = _is_fake(a), not _is_fake(a), torch.device("cpu")
                elif isinstance(a, torch.Tensor):
                    to_gpu, to_host = is_on_gpu(a), not is_on_gpu(a)
                rest.append(a)
            args = (args[0], *rest)
            if to_gpu != is_on_gpu(args[0]) and (to_gpu or to_host):
                kwargs["copy"] = True  # a real move between devices copies
        self._check(func, args, kwargs)
        out = func(*args, **kwargs)
        if to_gpu or (not to_host and any(is_on_gpu(t) for t in tree_flatten((args, kwargs))[0])):
            _mark(out)
        return out

    @staticmethod
    def _check(func, args, kwargs):
        if func in _UNCHECKED:
            return
        checked = args[:1] + args[2:] if func in _INDEXING else args  # a CPU index is fine on CUDA
        tensors = [t for t in tree_flatten((checked, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not any(is_on_gpu(t) for t in tensors):
            return
        host = [t for t in tensors if not is_on_gpu(t) and t.ndim > 0]
        if host:
            name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
            raise DeviceMix(f"{name}: a CPU tensor of shape {tuple(host[0].shape)} meets a GPU tensor "
                            f"(Expected all tensors to be on the same device)")


@contextlib.contextmanager
def fake_gpu():
    """Run the body with marked CPU tensors standing for CUDA ones (module docstring)."""
    autocast, grad, load = torch.autocast, torch.autograd.grad, torch.load

    def marked_grad(outputs, inputs, *a, **k):  # autograd's results come from no torch function
        out = grad(outputs, inputs, *a, **k)
        on = [is_on_gpu(t) for t in ([inputs] if isinstance(inputs, torch.Tensor) else inputs)]
        return tuple(_mark(g) if o and g is not None else g for g, o in zip(out, on))

    def marked_load(f, map_location=None, **k):  # a checkpoint loaded "onto the GPU"
        if map_location is not None and _is_fake(map_location):
            return _mark(load(f, map_location="cpu", **k))
        return load(f, map_location=map_location, **k)

    # autocast knows no "meta": the CPU's stands in (it is off unless precision=bf16)
    torch.autocast = lambda device_type, *a, **k: autocast("cpu" if device_type == FAKE.type else device_type, *a, **k)
    torch.autograd.grad, torch.load = marked_grad, marked_load
    try:
        with _FakeGPU():
            yield
    finally:
        torch.autocast, torch.autograd.grad, torch.load = autocast, grad, load
