"""Where a run ran and with what: versions, source commit, device, host and times.

Every process that runs rounds of a run appends a *session* to the run directory's ``run.json``
(fedrun's version, the git commit of fedrun's source when it runs from a clone, dirty or not,
Python, PyTorch and CUDA versions, the device's name, the host, the data it read by its shown name
(:func:`fedrun.data.names.dataset_label`), the rounds it started from, its start and, when it gets
there, its end), so a table reproduced later can say what made each run;
``summary.json`` repeats the finishing session's provenance, the run's first start and its end
(:func:`summary_fields`).  Nothing here is compared on resume: a run may be resumed on another
machine or version, and run.json says so.
"""
from __future__ import annotations

import functools
import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

import fedrun

RUN_FILE = "run.json"
# The environment variable holding the id of the sweep that launched a job (set by the sweep's
# launching process, fedrun.command.sweeps.SweepCallback); each session of a sweep's job records it.
SWEEP_ID = "FEDRUN_SWEEP_ID"
# summary.json's values that say when and where a run ran, not what it computed: two runs of one
# config and seed differ in these alone.
VOLATILE = ("round_seconds", "provenance", "started", "finished", "processes")


def now() -> str:
    """The time now in UTC, ISO 8601 to the second (``2026-11-24T23:41:02+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@functools.cache
def git_state() -> tuple[str | None, bool | None]:
    """The commit of fedrun's source and whether its tracked files differ from it, when fedrun runs
    from a git clone (an editable install, ``PYTHONPATH``); ``(None, None)`` for an installed wheel
    or where git is missing."""
    source = Path(fedrun.__file__).resolve().parents[1]
    if not (source / ".git").exists():
        return None, None
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(status.strip())


def device_name(device) -> str:
    """The accelerator's name (``NVIDIA H100 80GB HBM3``), or the CPU's: its model name where the
    system says it, the threads PyTorch may use, and the vector instructions its CPU kernels run
    (``AMD EPYC (1 threads, AVX2)``, from ``torch.backends.cpu.get_cpu_capability``).  The last
    because one model name may cover machines whose rounds of one run take twice as long as
    another's, and the kernels PyTorch dispatches to (AVX2 or AVX-512) are one difference a
    timing table can then name."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_model()} ({torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()})"


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def describe(device) -> dict:
    """This process: fedrun, git, Python, PyTorch, CUDA versions, the device and the host."""
    commit, dirty = git_state()
    return {"fedrun": fedrun.__version__, "git_commit": commit, "git_dirty": dirty,
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": device_name(device), "host": socket.gethostname()}


def summary_fields(sessions: list[dict]) -> dict:
    """What ``summary.json`` says of the processes that ran the run (``run.json``'s entries): the
    last one's provenance, the first one's start, the last one's end, and how many there were."""
    last = sessions[-1] if sessions else {}
    keep = ("fedrun", "git_commit", "git_dirty", "python", "torch", "cuda", "device", "host", "dataset")
    return {"provenance": {k: last.get(k) for k in keep}, "started": sessions[0].get("started") if sessions else None,
            "finished": last.get("finished"), "processes": len(sessions)}
