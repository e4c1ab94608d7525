"""Shared fixtures: paths, tiny data and models, and a runner for the ``fedrun`` command."""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedrun.command import resolvers  # noqa: F401  (the scale presets resolve ${fedrun.num_clients:...})
from fedrun.harness.provenance import VOLATILE
from fedrun.harness.recorder import TIMING_COLUMNS

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
# ../shared/data beside the checkout: real datasets that users do not have (tests skip without it).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# The smallest run that still exercises every code path of a round (a few seconds from the CLI).
TINY = [
    "dataset=synthetic",
    "dataset.load.num_train=400",
    "dataset.load.num_test=100",
    "model=mlp",
    "model.hidden=[8]",
    "hyperparams.num_clients=4",
    "hyperparams.client_fraction=0.5",
    "hyperparams.rounds=2",
    "progress=false",
]
# Slower rounds (batch size 2, all 4 clients) so a 5-round run can be killed after round 2.
RESUMABLE = [*TINY, "hyperparams.client_fraction=1.0", "hyperparams.batch_size=2", "hyperparams.rounds=5"]


def compose(overrides: list[str] = (), resolve: bool = False, hydra: bool = False):
    """The config ``fedrun <overrides>`` would run, composed as the CLI does (a DictConfig, or
    plain values with ``resolve=True``; ``hydra``: with Hydra's node, which names the options
    chosen): the one way tests look at presets and defaults."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="test"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=hydra)
    return OmegaConf.to_container(cfg, resolve=True) if resolve else cfg


def aggregate(agg, params, deltas, n, layers, state=None, clients=None, buffers=None, steps=None, lr=1.0,
              num_clients=None):
    """One round of the aggregator ``agg`` on stacked ``deltas`` of clients with ``n`` examples:
    the outcome, with the aggregator's new state as ``outcome.state``.  ``state``: the previous
    round's (None: ``agg.init`` for ``num_clients``, by default the clients numbered 0..m-1 or
    those ``clients`` names).  ``steps``: each client's local steps (1 each unless given; FedNova
    and SCAFFOLD read them as ``||a_k||_1``); ``lr``: the clients' learning rate (SCAFFOLD's)."""
    from fedrun.client.local_training import ClientResults

    m = len(n)
    clients = list(range(m)) if clients is None else list(clients)
    total = max(clients, default=-1) + 1 if num_clients is None else num_clients
    state = agg.init(params, total, layers) if state is None else state
    steps = torch.ones(m, dtype=torch.long) if steps is None else torch.as_tensor(steps)
    results = ClientResults(clients, deltas, buffers or {}, torch.as_tensor(n), torch.zeros(m, dtype=torch.float64),
                            steps, torch.ones(m, dtype=torch.long), lr=torch.full((m,), float(lr), dtype=torch.float64),
                            effective_steps=steps.to(torch.float64))
    outcome, outcome.state = agg.apply(state, params, results)
    return outcome


class OnPartition:
    """An engine with a fixed partition, called as the round loop calls it: ``train(params,
    buffers, clients, round_, epochs, lr, ...)`` hands the engine ``indices[k]`` for each client k.

    ``epochs`` defaults to None (E each) and ``lr`` to the engine's ``local.lr``: a test's
    convenience for a round at the configured rate.  The engines themselves require ``lr``."""

    def __init__(self, engine, indices):
        self.engine, self.indices = engine, indices

    def train(self, params, buffers, clients, round_, epochs=None, lr=None, *args, **kwargs):
        lr = self.engine.local.lr if lr is None else lr
        return self.engine.train(params, buffers, clients, [self.indices[k] for k in clients], round_, epochs, lr,
                                 *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def refusal_failures(result: dict, expected: list[str], prefix: str = "fedrun: error: ", exit_ok=lambda code: code == 2,
                     named: str = "names the setting and what is allowed", **extra: bool) -> list[str]:
    """The checks a one-line refusal fails (empty: it passes them all).  ``result``: a catalogue
    driver's record of one command (``code``, ``stderr``, ``cwd``).  A refusal exits as
    ``exit_ok`` accepts, prints no traceback, prints exactly one line starting with ``prefix``
    that holds every string of ``expected``, and creates nothing in its working folder; ``extra``
    adds checks of the caller's own (name: passed)."""
    lines = result["stderr"].strip().splitlines()
    line = lines[0] if lines else ""
    checks = {
        "exit 2" if exit_ok(2) and not exit_ok(1) else "non-zero exit": exit_ok(result["code"]),
        "no traceback": "Traceback" not in result["stderr"],
        "one line": len(lines) == 1 and line.startswith(prefix),
        named: all(s in line for s in expected),
        "nothing created": not any(result["cwd"].iterdir()),
        **extra,
    }
    return [name for name, ok in checks.items() if not ok]


def created_in(result: dict) -> list[str]:
    """What a command created in its working folder, by name."""
    return sorted(p.name for p in result["cwd"].iterdir())


def on_partition(make, model, x, y, indices, *args, **kwargs) -> OnPartition:
    """``make(model, x, y, *args, **kwargs)`` (an engine class) bound to the partition ``indices``."""
    return OnPartition(make(model, x, y, *args, **kwargs), indices)


def pytest_configure(config):
    # Tiny tensors on a shared 2-core machine: one thread is faster and steadier than two.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def conf_dir() -> Path:
    return CONF_DIR


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data``; tests that use it skip cleanly where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (real datasets beside the checkout)")
    return SHARED_DATA


@pytest.fixture
def tiny_overrides() -> list[str]:
    return list(TINY)


def _cli_env() -> dict:
    env = dict(os.environ)
    env.pop("HYDRA_FULL_ERROR", None)  # fedrun's own one-line errors, not Hydra's tracebacks
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class _Zygote:
    """The client of tests/zygote.py: this worker's server that has imported PyTorch and fedrun once
    and forks a child per command line (started at the first command line, stopped at exit)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None  # made at the first command line (not in xdist's controller)
        self.count = 0

    def _start(self) -> None:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="fedrun-zygote-"))
            atexit.register(self.stop)
        sock = self.folder / "sock"
        sock.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py")), str(sock)],
                                     cwd=self.folder, env=_cli_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready", "tests/zygote.py did not start"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, argv: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.count += 1
        out, err = self.folder / f"{self.count}.out", self.folder / f"{self.count}.err"
        cmd = [sys.executable, *argv]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(self.folder / "sock"))
            conn.sendall((json.dumps({"argv": argv, "cwd": str(Path(cwd).resolve()), "env": env,
                                      "out": str(out), "err": str(err)}) + "\n").encode())
            conn.settimeout(timeout)
            replies = conn.makefile("r")
            try:
                pid = json.loads(replies.readline())["pid"]
                line = replies.readline()
            except (TimeoutError, socket.timeout):
                with contextlib.suppress(ProcessLookupError, UnboundLocalError):
                    os.killpg(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(cmd, timeout, _read(out), _read(err)) from None
        stdout, stderr = _read(out), _read(err)
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)
        if not line:  # the child died without a status (a signal, or a crash in the server's code)
            return subprocess.CompletedProcess(cmd, -signal.SIGKILL, stdout, stderr + "\n[ended without an exit status]")
        return subprocess.CompletedProcess(cmd, json.loads(line)["code"], stdout, stderr)


def _read(path: Path) -> str:
    """A child's output as ``subprocess.run(text=True)`` gives it (universal newlines)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


_ZYGOTE = _Zygote()


def python_run(argv: list[str], cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python ARGV`` in ``cwd`` (``argv`` as after ``python``: ``-m MODULE ...`` or ``SCRIPT ...``),
    stdout and stderr captured as text, as ``subprocess.run`` returns them, but forked from a
    process that has imported PyTorch and fedrun already (tests/zygote.py): a tiny run takes a
    tenth of a second instead of five.  A different environment from the suite's own gets a
    fresh interpreter (variables such as OMP_NUM_THREADS take effect at start-up)."""
    base = _cli_env()
    # Hydra's joblib, submitit and Ray launchers start worker processes of their own, which do
    # not come up under a forked child (joblib's loky hangs): those sweeps get a fresh interpreter.
    # (fedrun's population launcher trains in its own process, and is forked like a single run.)
    launcher = any(a.startswith(("hydra/launcher=joblib", "hydra/launcher=submitit", "hydra/launcher=ray"))
                   for a in argv)
    if launcher or (env is not None and env != base):
        return subprocess.run([sys.executable, *argv], cwd=cwd, env=base if env is None else env,
                              capture_output=True, text=True, timeout=timeout)
    return _ZYGOTE.run(argv, cwd, base, timeout)


def run_fedrun(args: list[str], cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m fedrun ARGS`` in ``cwd``; stdout and stderr captured as text (:func:`python_run`)."""
    return python_run(["-m", "fedrun", *args], cwd, timeout=timeout, env=env)


def _default_signals() -> None:
    """In the child, before Python starts: SIGINT and SIGTERM at their defaults, whatever this
    process inherited (a suite started from a background job of a non-interactive shell ignores
    SIGINT, and a child would inherit that and never see Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_fedrun(args: list[str], cwd: Path, capture: bool = False) -> subprocess.Popen:
    """Start ``python -m fedrun ARGS`` in the background (output discarded, or piped as text),
    with the default dispositions of SIGINT and SIGTERM, so the tests can send them."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "fedrun", *args], cwd=cwd, env=_cli_env(),
                            stdout=out, stderr=out, text=capture, preexec_fn=_default_signals)


def wait_for_rows(proc: subprocess.Popen, path: Path, rows: int, timeout: float = 150) -> None:
    """Wait until the CSV at ``path`` has ``rows`` data rows while ``proc`` runs; fail if it ended."""
    deadline = time.monotonic() + timeout
    while data_rows(path) < rows and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before {path.name} had {rows} rows (too fast?)"


# ----------------------------------------------------------------------------- run directories

def fedrun_ok(args, cwd, timeout=180):
    proc = run_fedrun(args, cwd, timeout=timeout)
    assert proc.returncode == 0, f"fedrun {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    return proc


def csv_without_wall(path: Path) -> str:
    """A CSV without its timing columns (train_s, eval_s, wall_s: all else is reproducible)."""
    df = pd.read_csv(path)
    return df.drop(columns=[c for c in TIMING_COLUMNS if c in df]).to_csv(index=False)


def interrupted_while_recording(monkeypatch, round_: int, go) -> None:
    """Ctrl-C while round ``round_``'s rows are written (rounds before it recorded and, by default,
    checkpointed): ``go()`` must stop with :class:`fedrun.errors.Interrupted`; then the writer is
    put back, so that a resume runs as usual."""
    from fedrun.errors import Interrupted
    from fedrun.harness.recorder import Recorder

    write = Recorder.write

    def interrupt(self, r):
        if r.round == round_:
            raise KeyboardInterrupt
        write(self, r)

    monkeypatch.setattr(Recorder, "write", interrupt)
    try:
        with pytest.raises(Interrupted):
            go()
    finally:
        monkeypatch.setattr(Recorder, "write", write)


def same_run(a: Path, b: Path) -> None:
    """Two run directories hold the same results (all but the wall-clock column)."""
    assert csv_without_wall(a / "rounds.csv") == csv_without_wall(b / "rounds.csv")
    for name in ("layers.csv", "clients.csv", "partition.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert results_of(a / "summary.json") == results_of(b / "summary.json")


def results_of(summary_json: Path) -> dict:
    """summary.json without when and where the run ran (fedrun.harness.provenance.VOLATILE)."""
    return {k: v for k, v in json.loads(summary_json.read_text()).items() if k not in VOLATILE}


def snapshot(run_dir: Path) -> dict:
    """Every file's bytes (a refused process touches none, its log included)."""
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


def edit_same_length(path: Path) -> None:
    """Change one digit of the file's last row: the same size, other numbers."""
    data = bytearray(path.read_bytes())
    at = max(i for i in range(data.rindex(b"\n", 0, len(data) - 1), len(data)) if chr(data[i]).isdigit())
    data[at] = ord("7") if data[at] != ord("7") else ord("3")
    path.write_bytes(bytes(data))


def data_rows(path: Path) -> int:
    try:
        return max(len(path.read_text().splitlines()) - 1, 0)
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="session")
def fedrun_cli():
    return run_fedrun


@pytest.fixture
def labels_1000() -> np.ndarray:
    """1,000 labels, 100 of each of 10 classes, in a shuffled order."""
    rng = np.random.default_rng(12345)
    return rng.permutation(np.arange(1000) % 10)


@pytest.fixture
def tiny_data():
    """A normalized synthetic dataset of 4x4 grey images, 10 classes, 60 train / 20 test."""
    from fedrun.data.preparation import prepare
    from fedrun.data.datasets import synthetic

    raw = synthetic(num_train=60, num_test=20, channels=1, image_size=4, num_classes=10, seed=3)
    return prepare(raw, None, None)


def tiny_mlp(seed: int = 0, hidden=(8,)):
    """MLP 16 -> 8 -> 10 on 4x4 grey images, initialized from ``seed``."""
    from fedrun.models.nets import MLP

    torch.manual_seed(seed)
    return MLP(in_channels=1, image_size=4, num_classes=10, hidden=list(hidden))
