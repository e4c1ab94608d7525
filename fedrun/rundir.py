"""A run directory held by one process, and what a resumed run may trust in it.

:meth:`RunDirectory.open` is the only way a run starts writing.  It creates the directory, takes
an exclusive OS lock on it for the life of the run (``flock`` on the directory itself: nothing is
written for it, and the kernel releases it when the process dies, even by SIGKILL, so a crashed
run never blocks its resume), and then decides, before writing a byte:

* a new run refuses a directory that holds an earlier run's results;
* a resumed run loads ``checkpoint.pt`` with ``torch.load(weights_only=True)`` (tensors and plain
  containers only: a crafted file cannot run code), and refuses a checkpoint that cannot be read
  that way, a config that differs from the run's ``config.yaml``, and CSVs that are missing,
  shorter than the sizes the checkpoint recorded, or written with other columns (appending to
  any of them would corrupt the run);
* ``resume=true`` with no checkpoint starts from round 1, unless results are there without one.

Only then does it write ``config.yaml`` (a new run) and start ``fedrun.log``.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from pathlib import Path

import torch
import yaml

from fedrun.logs import CONSOLE_ONLY
from fedrun.errors import ConfigError, RunDirectoryError, first_line

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
RESULTS = (CHECKPOINT, "rounds.csv", "summary.json")
LOG_FILE = "fedrun.log"
# Settings that may differ between a run and its resume: how it is launched and saved, not what it
# runs, so they do not change the results (dotted: a key inside a node, here the one federation copies).
RESUMABLE_DIFFERENCES = ("resume", "progress", "device", "overrides", "threads", "checkpoint_every",
                         "federation.checkpoint_every")

# The run directory whose fedrun.log takes the records made now (None: every open run's).
_SPEAKING: contextvars.ContextVar[Path | None] = contextvars.ContextVar("fedrun_run_speaking", default=None)

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one process per directory is then the user's care
    fcntl = None


def _settings(config: dict) -> dict:
    """``config`` without the :data:`RESUMABLE_DIFFERENCES` (a shallow copy of the nodes they are in)."""
    out = dict(config)
    for key in RESUMABLE_DIFFERENCES:
        *nodes, last = key.split(".")
        parent = out
        for node in nodes:
            if not isinstance(parent.get(node), dict):
                break
            parent[node] = dict(parent[node])
            parent = parent[node]
        else:
            parent.pop(last, None)
    return out


def header_matches(path: Path, columns: list[str]) -> bool:
    """Whether the CSV at ``path`` (if it exists) has exactly ``columns`` as its header."""
    path = Path(path)
    if not path.exists():
        return True
    with open(path, newline="") as f:
        return f.readline().rstrip("\r\n") == ",".join(columns)


def refuse_existing_run(run_dir: Path) -> None:
    """A new run never writes into a directory holding an earlier run's results."""
    if any((Path(run_dir) / name).exists() for name in RESULTS):
        raise ConfigError("hydra.run.dir", str(run_dir),
                          "already holds a run; pass resume=true to continue it, or choose another directory")


def load_checkpoint(path: Path, device="cpu") -> dict:
    """A checkpoint's contents, read with ``weights_only=True``; one line if it cannot be."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - unpickling refused, truncated, not a torch file ...
        raise RunDirectoryError(f"{path}: cannot be read safely as a fedrun checkpoint "
                                f"({type(e).__name__}: {first_line(e)}); nothing was written") from None


def check_own_targets(config, source: Path | str, path: str = "") -> None:
    """Refuse a run's config naming any ``_target_`` but fedrun's own classes and functions.

    A run directory may come from anywhere; rebuilding its model or data from ``config.yaml``
    (scripts/loss_surface.py) must not call whatever a crafted file names (``os.system``)."""
    if isinstance(config, dict):
        target = config.get("_target_")
        if target is not None and not _is_fedrun_object(target):
            raise RunDirectoryError(f"{source}: {path}_target_={target} is not one of fedrun's own objects; "
                                    "only fedrun.* classes and functions are built from a run directory")
        for key, value in config.items():
            check_own_targets(value, source, f"{path}{key}.")
    elif isinstance(config, list):
        for i, value in enumerate(config):
            check_own_targets(value, source, f"{path}{i}.")


def _is_fedrun_object(target) -> bool:
    if not isinstance(target, str) or not target.startswith("fedrun."):
        return False
    from fedrun.settings import locate

    try:
        obj = locate(target)
    except Exception:  # noqa: BLE001 - not importable: not fedrun's
        return False
    # "fedrun.rundir.os.system" starts with fedrun. but is os.system: judge the object's own module.
    return str(getattr(obj, "__module__", "")).startswith("fedrun.")


class RunDirectory:
    """One run's directory, locked by this process until :meth:`close`."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self._fd, self._handler = Path(path), fd, None

    @classmethod
    def open(cls, path: str | Path, resume: bool) -> "RunDirectory":
        path = Path(path)
        if not resume:
            refuse_existing_run(path)  # before creating anything
        path.mkdir(parents=True, exist_ok=True)
        fd = None
        if fcntl is not None:
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise RunDirectoryError(f"{path}: another fedrun process is running in this run directory; "
                                        "wait for it to finish (or stop it), then resume with resume=true") from None
        run = cls(path, fd)
        try:
            if not resume:
                refuse_existing_run(path)  # again under the lock: another process may have started it
        except BaseException:
            run.close()
            raise
        return run

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    def checkpoint(self, device="cpu") -> dict | None:
        """The checkpoint to resume from, or None (start from round 1, said in one line)."""
        if not self.checkpoint_path.exists():
            if (self.path / "summary.json").exists():  # finished, and its checkpoint removed since
                raise RunDirectoryError(f"{self.path}: holds summary.json but no {CHECKPOINT}, so it cannot be "
                                        "resumed; choose another directory (nothing was written)")
            if (self.path / "rounds.csv").exists():  # stopped before its first checkpoint: no round complete
                log.warning("resume=true: %s has no %s (it stopped before its first one); starting it over "
                            "from round 1", self.path, CHECKPOINT)
            else:
                log.warning("resume=true: no %s in %s; starting from round 1", CHECKPOINT, self.path)
            return None
        return load_checkpoint(self.checkpoint_path, device)

    def check_csvs(self, columns: dict[str, list[str]], offsets: dict[str, int]) -> None:
        """Refuse to resume unless every CSV the checkpoint recorded is there, at least as long
        as recorded (rows after that are an interrupted round's and get cut) and with this
        version's header."""
        for name, cols in columns.items():
            path = self.path / f"{name}.csv"
            recorded = offsets.get(name)
            if recorded is None:
                continue
            if not path.exists():
                raise RunDirectoryError(f"{path}: missing, but the checkpoint records {recorded} bytes of it; "
                                        "restore it or start a new run directory (nothing was written)")
            if not header_matches(path, cols):
                raise RunDirectoryError(f"{path}: has other columns than this fedrun writes (another version "
                                        "wrote it); resume it with that version, or start a new run directory")
            size = path.stat().st_size
            if size < recorded:
                raise RunDirectoryError(f"{path}: {size} bytes, shorter than the {recorded} the checkpoint "
                                        "records (truncated or edited); restore it or start a new run "
                                        "directory (nothing was written)")

    def write_config(self, config: dict | None, resume: bool) -> None:
        """Write ``config.yaml``; on resume, refuse a config that differs from the run's own."""
        if config is None:
            return
        path = self.path / "config.yaml"
        if resume and path.exists():
            try:
                old = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError as e:
                raise RunDirectoryError(f"{path}: not valid YAML ({first_line(e)})") from None
            old, new = _settings(old), _settings(config)
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            if diff:
                raise ConfigError("resume", "true", f"the settings differ from the run's config.yaml in: "
                                  f"{', '.join(diff)}; resume with the original overrides")
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        os.replace(tmp, path)

    def start_log(self) -> None:
        """Append this process's log records to ``fedrun.log`` (a resumed run keeps its history).

        When several runs share the process (a population, :mod:`fedrun.population`), a run's
        log takes the records made while it :meth:`speaks`, and those made while none does."""
        self._handler = logging.FileHandler(self.path / LOG_FILE, mode="a")
        self._handler.addFilter(lambda record: _SPEAKING.get() in (None, self.path)
                                and not getattr(record, CONSOLE_ONLY, False))
        console = next((h for h in logging.getLogger().handlers if h.formatter is not None), None)
        self._handler.setFormatter(console.formatter if console else
                                   logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
        logging.getLogger().addHandler(self._handler)

    @contextlib.contextmanager
    def speaks(self):
        """Log records made inside go to this run's ``fedrun.log`` only (and to the console)."""
        token = _SPEAKING.set(self.path)
        try:
            yield
        finally:
            _SPEAKING.reset(token)

    def close(self) -> None:
        """Stop the log and release the lock (the kernel would, at exit, anyway)."""
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
