"""Numerics of local training: FP32, TF32 or bf16 autocast, and torch.compile's failures.

Both engines train inside :func:`precision_scope` and :func:`autocast`, and turn a compile
failure into one line (:func:`compile_errors`); evaluation runs outside them, in FP32.
"""
from __future__ import annotations

import contextlib

import torch

from fedrun.errors import ConfigError, check

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
