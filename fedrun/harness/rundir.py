"""A run directory held by one process, and what a resumed run may trust in it.

:meth:`RunDirectory.open` is the only way a run starts writing.  It creates the directory, takes
an exclusive OS lock on it for the life of the run (``flock`` on the directory itself: nothing is
written for it, and the kernel releases it when the process dies, even by SIGKILL, so a crashed
run never blocks its resume), and then decides, before writing a byte:

* a new run refuses a directory that holds an earlier run's results;
* a resumed run loads ``checkpoint.pt`` with ``torch.load(weights_only=True)`` (tensors and plain
  containers only: a crafted file cannot run code), and refuses a checkpoint that cannot be read
  that way, a config that differs from the run's ``config.yaml``, a ``config.yaml`` whose settings
  are not those the checkpoint was written with (:func:`settings_digest`), and CSVs that are
  missing, shorter than the sizes the checkpoint recorded, different in those first bytes from
  what it recorded (a SHA-256 of each, :func:`prefix_digest`), or written with other columns
  (appending to any of them would corrupt the run, or make one run of two);
* ``resume=true`` with no checkpoint starts from round 1, unless results are there without one.

Only then does it write ``config.yaml`` (a new run) and start ``fedrun.log``.

Nothing in a run directory redirects a write: a directory holding a symbolic link (directly, or
in ``models/`` or ``tensorboard/``) is refused before a byte is written (:func:`check_no_links`;
the run directory's own path may be or pass through a link), and every run file is opened
without following one (``O_NOFOLLOW``; :func:`open_run_file`).  Files that are replaced whole
are written by :func:`write_atomic`: a temporary file created exclusively (``O_EXCL``, after
unlinking a leftover one), synced, then renamed over the file, so a crash or a full disk never
leaves a half-written one.  A full disk in ``fedrun.log`` loses the line, quietly
(:class:`RunLog`): the write that stops the run says so in one line.

Nothing in a run directory runs code either: a checkpoint is read with ``weights_only=True``, and
what the scripts rebuild from a run's ``config.yaml`` is one of :data:`MODEL_TARGETS` or
:data:`DATA_LOADERS`, called with the node's plain values (:func:`run_object`).
"""
from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import IO, Callable

import torch
import yaml

from fedrun.moved import current_target, moved_targets
from fedrun.logs import CONSOLE_ONLY
from fedrun.errors import ConfigError, RunDirectoryError, disk_full, first_line

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
RESULTS = (CHECKPOINT, "rounds.csv", "summary.json")
LOG_FILE = "fedrun.log"
# Settings that may differ between a run and its resume: how it is launched and saved, not what it
# runs, so they do not change the results (dotted: a key inside a node, here the one federation copies).
RESUMABLE_DIFFERENCES = ("resume", "progress", "device", "overrides", "threads", "checkpoint_every",
                         "federation.checkpoint_every")
# Settings fedrun gained after runs were made, at the value that runs what runs without them ran: a
# setting at that value counts as absent, so a run from before it resumes (and its checkpoint's
# settings digest still matches), while any other value is a difference as usual.
ADDED_SETTINGS = {"hyperparams.sampling": "uniform", "hyperparams.availability": None,
                  "participation.sampling": "uniform", "participation.availability": None,
                  "client_test_fraction": 0.0, "federation.client_test_fraction": 0.0,
                  "client_eval_clients": "sampled", "federation.client_eval_clients": "sampled",
                  "personalize_epochs": 0, "federation.personalize_epochs": 0, "model.batch_norm": False,
                  "divergence_every": 1, "federation.divergence_every": 1, "dataset.label": None}
# The privacy node at its defaults (clip null: not private), as conf/config.yaml writes it.
ADDED_SETTINGS["privacy"] = {"_target_": "fedrun.server.privacy.Privacy", "clip": None, "noise_multiplier": 1.0,
                             "adaptive_quantile": None, "clip_lr": 0.2, "count_noise": None, "delta": 1e-05,
                             "accounting": "fixed_size"}

# The run directory whose fedrun.log takes the records made now (None: every open run's).
_SPEAKING: contextvars.ContextVar[Path | None] = contextvars.ContextVar("fedrun_run_speaking", default=None)

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one process per directory is then the user's care
    fcntl = None

# Open a file without following a symbolic link in its last component (0 where the OS has none).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# The run directory's folders whose entries are checked for links too (models/round_NNNN.pt, the
# TensorBoard event files).
LINK_CHECKED = ("models", "tensorboard")

# What the scripts may build from a run's config.yaml (scripts/pd/loss_surface.py): fedrun's model
# classes and dataset loaders, nothing else, whatever a crafted config.yaml names.
MODEL_TARGETS = ("fedrun.models.nets.MnistCNN", "fedrun.models.nets.TFTutorialCNN", "fedrun.models.nets.Cifar10CNN",
                 "fedrun.models.nets.SimpleCNN", "fedrun.models.nets.MLP", "fedrun.models.nets.LeafCNN",
                 "fedrun.models.pd_nets.PDNet", "fedrun.models.pd_nets.CifarResNet")
DATA_LOADERS = ("fedrun.data.datasets.mnist", "fedrun.data.datasets.fashion_mnist", "fedrun.data.datasets.cifar10", "fedrun.data.datasets.svhn",
                "fedrun.data.datasets.idx", "fedrun.data.datasets.synthetic", "fedrun.data.natural.femnist",
                "fedrun.data.natural.table", "fedrun.data.natural.synthetic_writers", "fedrun.data.huggingface.hf_dataset",
                "fedrun.data.cifar10_copy.cifar10_jpeg", "fedrun.data.cifar10_copy.cifar10_exact_subset")
# Hydra's instantiate keys: a node that holds one is not built from a run directory.
_HYDRA_KEYS = ("_args_", "_partial_", "_convert_", "_recursive_")


# ----------------------------------------------------------------------------- files, never through a link

def link_refused(run_dir: Path, name: str) -> RunDirectoryError:
    return RunDirectoryError(f"{run_dir} holds a symbolic link {name}; fedrun does not follow links in a run "
                             "directory")


def special_refused(folder: Path, name: str) -> RunDirectoryError:
    return RunDirectoryError(f"{folder} holds {name}, which is not a regular file or folder (a named pipe, "
                             "socket or device); fedrun reads and writes only regular files there: remove it")


def check_no_links(run_dir: str | Path) -> None:
    """Refuse a run directory holding a symbolic link, directly or in one of :data:`LINK_CHECKED`:
    fedrun would write (or resume from) wherever it points; and one holding anything that is not a
    regular file or folder (a named pipe would hang the resume that opens it).  The run directory
    itself may be a link, or lie below one."""
    run_dir = Path(run_dir)
    for folder in (run_dir, *(run_dir / name for name in LINK_CHECKED)):
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        shown = (lambda name: name) if folder == run_dir else (lambda name: f"{folder.name}/{name}")
        links = [e.name for e in entries if e.is_symlink()]
        if links:
            raise link_refused(run_dir, shown(links[0]))
        special = [e.name for e in entries if not e.is_dir(follow_symlinks=False) and not e.is_file(follow_symlinks=False)]
        if special:
            raise special_refused(run_dir, shown(special[0]))


def check_sweep_folder(sweep_dir: str | Path) -> None:
    """Refuse, before Hydra writes the sweep's ``multirun.yaml``, a sweep folder that holds a
    symbolic link anywhere below it (``multirun.yaml`` itself, a job folder, a file in one: Hydra
    or a job would write through it, outside the folder) or anything that is not a regular file
    or folder.  The sweep folder itself may be a link, or lie below one."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return
    for folder, dirs, files in os.walk(sweep_dir):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            shown = path.relative_to(sweep_dir)
            if path.is_symlink():
                raise RunDirectoryError(f"{sweep_dir} holds a symbolic link {shown}; fedrun does not follow links "
                                        "in a sweep folder (Hydra or a job would write through it): remove it")
            if not path.is_dir() and not path.is_file():
                raise special_refused(sweep_dir, str(shown))


def _open_fd(path: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open`` without following a link at ``path``: a link is one line, not ELOOP."""
    try:
        return os.open(path, flags | NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise link_refused(Path(path).parent, Path(path).name) from None
        raise


def open_run_file(path: str | Path, mode: str = "a", **kwargs) -> IO:
    """``open(path, mode)`` for writing a run file, never through a symbolic link."""
    return open(path, mode, opener=lambda name, flags: _open_fd(Path(name), flags), **kwargs)


def write_atomic(path: str | Path, write: Callable[[IO], None], binary: bool = False) -> None:
    """Replace ``path`` with what ``write(f)`` writes, never half-written and never through a link.

    ``write`` writes to ``<path>.tmp``, created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``: not
    an existing file, not a link) after a leftover one is unlinked (which removes a link, not its
    target); the file is synced and renamed over ``path`` (a rename replaces a link, not what it
    points to).  On any error (a full disk, Ctrl-C) the temporary file is removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    # The create is inside the try: a signal that lands while os.open runs is raised (as
    # KeyboardInterrupt or Terminated) just after it returns, with the file already made. The
    # leftover was unlinked above, so a <path>.tmp found on the way out is this call's own.
    try:
        fd = _open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, "wb") if binary else open(fd, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class RunLog(logging.FileHandler):
    """``fedrun.log``: appended to, never through a symbolic link; a line the disk has no room
    for is lost quietly (``logging`` would print a traceback for it), since the run's own write
    that meets the full disk stops it in one line."""

    def _open(self):
        return open_run_file(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:
        if disk_full(sys.exc_info()[1]):
            return
        super().handleError(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as e:
            if not disk_full(e):
                raise

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:  # the lines still buffered are lost with the space
            if not disk_full(e):
                raise


def _settings(config: dict) -> dict:
    """``config`` without the :data:`RESUMABLE_DIFFERENCES` and the :data:`ADDED_SETTINGS` at their
    neutral value (a shallow copy of the nodes they are in)."""
    out = dict(config)
    for key in (*RESUMABLE_DIFFERENCES, *ADDED_SETTINGS):
        *nodes, last = key.split(".")
        parent = out
        for node in nodes:
            if not isinstance(parent.get(node), dict):
                break
            parent[node] = dict(parent[node])
            parent = parent[node]
        else:
            if key in RESUMABLE_DIFFERENCES or (last in parent and parent[last] == ADDED_SETTINGS[key]):
                parent.pop(last, None)
    return out


def settings_text(config: dict | None) -> str | None:
    """A run's settings (``config`` without the :data:`RESUMABLE_DIFFERENCES`) as canonical JSON,
    as the checkpoint records them (so a refused resume can name the settings that differ)."""
    if config is None:
        return None
    return json.dumps(_settings(config), sort_keys=True, default=str)


def settings_digest(config: dict | None) -> str | None:
    """SHA-256 of a run's settings (:func:`settings_text`), as the checkpoint records them: a
    resume whose settings hash otherwise ran other settings than the rounds before it
    (``config.yaml`` edited to match new overrides)."""
    text = settings_text(config)
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def differences(old, new, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested dicts of settings (a key only one
    holds counts), sorted: what a refusal names (``hyperparams.lr, local.lr``)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [] if old == new else [prefix.rstrip(".") or "the settings"]
    found = []
    for key in sorted(set(old) | set(new), key=str):
        if old.get(key, _ABSENT) != new.get(key, _ABSENT):
            found += differences(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{prefix}{key}.")
    return found


_ABSENT = object()  # a key one side of differences() lacks


def listed(keys: list[str], most: int = 4) -> str:
    """``a, b, c`` (and ``... (7 in all)`` past ``most``): a list of settings in one line."""
    return ", ".join(keys[:most]) + (f", ... ({len(keys)} in all)" if len(keys) > most else "")


def prefix_digest(path: Path, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of ``path`` (a CSV as a checkpoint vouches for it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while size > 0:
            chunk = f.read(min(size, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            size -= len(chunk)
    return digest.hexdigest()


def header_matches(path: Path, columns: list[str]) -> bool:
    """Whether the CSV at ``path`` (if it exists) has exactly ``columns`` as its header."""
    path = Path(path)
    if not path.exists():
        return True
    with open(path, "rb") as f:
        return f.readline().rstrip(b"\r\n") == ",".join(columns).encode()


def header_difference(path: Path, columns: list[str]) -> str:
    """How the header of the CSV at ``path`` differs from ``columns``, in words for an error:
    ``without bytes_down, bytes_up, bytes_total`` (a run of a fedrun before those columns), ``with
    x, which this fedrun does not write``, or ``in another order``."""
    with open(path, "rb") as f:
        found = f.readline().decode(errors="replace").rstrip("\r\n").split(",")
    missing = [c for c in columns if c not in found]
    extra = [c for c in found if c not in columns]
    parts = ([f"without {', '.join(missing)}"] if missing else []) + \
        ([f"with {', '.join(extra)}, which this fedrun does not write"] if extra else [])
    return "; ".join(parts) or "in another order"


def refuse_existing_run(run_dir: Path) -> None:
    """A new run never writes into a directory holding an earlier run's results, nor into one
    holding a symbolic link (:func:`check_no_links`)."""
    check_no_links(run_dir)
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


def check_own_targets(config, source: Path | str) -> None:
    """Refuse a run's config unless what the scripts build from it is fedrun's own: ``model`` one
    of :data:`MODEL_TARGETS` and ``dataset.load`` one of :data:`DATA_LOADERS`, each with plain
    keyword arguments (no nested ``_target_``, no Hydra keys).  A run directory may come from
    anywhere; rebuilding its model or data (scripts/pd/loss_surface.py) must not call whatever a
    crafted file names (``os.system``, ``fedrun.harness.recorder.write_json``, ``fedrun.command.cli.run_overrides``)."""
    run_object(config, "model", MODEL_TARGETS, source)
    run_object(config, "dataset.load", DATA_LOADERS, source)


def run_object(config, key: str, allowed: tuple[str, ...], source: Path | str) -> tuple[Callable, dict]:
    """``(callable, kwargs)`` of the node ``key`` (dotted) of a run's config: its ``_target_``, one
    of ``allowed``, and its other keys as plain values.  Anything else is one line
    (:class:`~fedrun.errors.RunDirectoryError`); nothing is called here."""
    node = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise RunDirectoryError(f"{source}: has no {key} settings to build (not a fedrun run's config)")
    target = current_target(node.get("_target_"))  # a run of the earlier module layout: its old path
    if target not in allowed:
        raise RunDirectoryError(f"{source}: {key}._target_={target} is not one of fedrun's own "
                                f"{'models' if key == 'model' else 'dataset loaders'}; only "
                                f"{', '.join(name.rsplit('.', 1)[-1] for name in allowed)} are built from a "
                                "run directory")
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    for name, value in kwargs.items():
        if name in _HYDRA_KEYS or not name.isidentifier():
            raise RunDirectoryError(f"{source}: {key}.{name}: not a setting of {target}; nothing is built "
                                    "from this run directory")
        where = _object_inside(value)
        if where is not None:
            raise RunDirectoryError(f"{source}: {key}.{name}{where}: an object to build inside {key}; only "
                                    f"{target}'s plain settings are read from a run directory")
    module, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module), attr), kwargs


def _object_inside(value, path: str = "") -> str | None:
    """Where ``value`` holds a node Hydra would build (a dict with ``_target_``), or an
    interpolation (``${...}``, resolved by OmegaConf: ``oc.decode`` makes nodes of text); None
    when it holds neither."""
    if isinstance(value, dict):
        if "_target_" in value or any(k in value for k in _HYDRA_KEYS):
            return path
        for k, v in value.items():
            found = _object_inside(v, f"{path}.{k}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _object_inside(v, f"{path}.{i}")
            if found is not None:
                return found
    elif isinstance(value, str) and "${" in value:
        return path
    return None


def _lock_directory(path: Path) -> int | None:
    """A descriptor of ``path`` holding its exclusive ``flock``; None when another process holds it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _still_there(fd: int, path: Path) -> bool:
    """Whether ``path`` is still the directory ``fd`` was opened on (not removed, not replaced)."""
    try:
        now, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def remove_empty_run_dir(path: Path) -> bool:
    """Remove the run directory ``path`` if it is empty and no process holds it; True if removed.

    A sweep job refused before writing anything tidies away the empty directory Hydra made for it.
    Two sweeps into one folder make the same job directories: the job refused here may be the one
    another process has just locked and is about to write into, so the directory is removed only
    under its lock (and :meth:`RunDirectory.open` relocks a directory removed under it)."""
    fd = None
    if fcntl is not None:
        try:
            fd = _lock_directory(path)
        except OSError:  # gone already, or not a directory
            return False
        if fd is None:
            return False  # another process runs in it
    try:
        path.rmdir()  # only succeeds on an empty directory
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


class RunDirectory:
    """One run's directory, locked by this process until :meth:`close`."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self._fd, self._handler = Path(path), fd, None

    @classmethod
    def open(cls, path: str | Path, resume: bool) -> "RunDirectory":
        path = Path(path)
        if not resume:
            refuse_existing_run(path)  # before creating anything
        fd = None
        for _ in range(5):
            try:
                path.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):  # a file, or a link to nowhere
                raise RunDirectoryError(f"{path}: not a directory; choose another run directory") from None
            if fcntl is None:
                break
            try:
                fd = _lock_directory(path)
            except FileNotFoundError:  # removed between mkdir and open (below): make it again
                continue
            if fd is None:
                raise RunDirectoryError(f"{path}: another fedrun process is running in this run directory; "
                                        "wait for it to finish (or stop it), then resume with resume=true")
            if _still_there(fd, path):
                break
            # Removed between mkdir and lock: a job of another sweep into the same folder, refused this
            # directory, tidied it away while empty (remove_empty_run_dir). Make it again and relock.
            os.close(fd)
            fd = None
        else:
            raise RunDirectoryError(f"{path}: removed again each time it was made; is another process "
                                    "deleting it? choose another run directory")
        run = cls(path, fd)
        try:
            if not resume:
                refuse_existing_run(path)  # again under the lock: another process may have started it
            check_no_links(path)  # before a byte is written, new run or resumed
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
        ckpt = load_checkpoint(self.checkpoint_path, device)
        if not isinstance(ckpt, dict):
            raise RunDirectoryError(f"{self.checkpoint_path}: not a fedrun checkpoint ({type(ckpt).__name__}); "
                                    "restore it or start a new run directory (nothing was written)")
        return ckpt

    def check_csvs(self, columns: dict[str, list[str]], offsets: dict[str, int],
                   digests: dict[str, str] | None = None, complete: bool = False) -> None:
        """Refuse to resume unless every CSV the checkpoint recorded is there, at least as long
        as recorded (rows after that are an interrupted round's and get cut), with this version's
        header, and, where the checkpoint recorded ``digests`` (fedrun 0.1.0 since resume checks
        them), with the very bytes it recorded up to that size: an edit of the same length too.

        ``complete``: the run has all its rounds, so nothing will be written; a CSV gzipped since
        (:func:`fedrun.results.compress_csvs`) is then passed over instead of refused."""
        for name, cols in columns.items():
            path = self.path / f"{name}.csv"
            recorded = offsets.get(name)
            if recorded is None:
                continue
            if path.exists() and not path.is_file():  # a folder of that name: nothing to append to
                raise RunDirectoryError(f"{path}: not a file, but the checkpoint records {recorded} bytes of it; "
                                        "restore it or start a new run directory (nothing was written)")
            if not path.exists():
                if path.with_name(path.name + ".gz").is_file():  # fedrun.results.compress_csvs
                    if complete:
                        continue
                    raise RunDirectoryError(f"{path}: gzipped ({path.name}.gz); gunzip it to resume the run "
                                            "(nothing was written)")
                raise RunDirectoryError(f"{path}: missing, but the checkpoint records {recorded} bytes of it; "
                                        "restore it or start a new run directory (nothing was written)")
            if not header_matches(path, cols):
                raise RunDirectoryError(f"{path}: has other columns than this fedrun writes "
                                        f"({header_difference(path, cols)}: another version wrote it); resume it "
                                        "with that version, or start a new run directory (fedrun.results and "
                                        "fedrun-plot still read it)")
            size = path.stat().st_size
            if size < recorded:
                raise RunDirectoryError(f"{path}: {size} bytes, shorter than the {recorded} the checkpoint "
                                        "records (truncated or edited); restore it or start a new run "
                                        "directory (nothing was written)")
            if digests and name in digests and prefix_digest(path, recorded) != digests[name]:
                raise RunDirectoryError(f"{path}: its first {recorded} bytes are not those the checkpoint "
                                        "records (edited since); restore it or start a new run directory "
                                        "(nothing was written)")

    def vouched(self, columns: dict[str, list[str]], offsets: dict[str, int],
                digests: dict[str, str]) -> dict[str, bool]:
        """For each CSV a checkpoint records rows of, and which is there with this version's header:
        whether it starts with the bytes the checkpoint records (a shorter one does not).  A
        checkpoint of this run vouches for some of its CSVs; one copied from another run for none
        (their rows differ), which tells a swapped checkpoint from an edited config.yaml."""
        found = {}
        for name, cols in columns.items():
            path, recorded = self.path / f"{name}.csv", offsets.get(name)
            if not isinstance(recorded, int) or recorded <= len(",".join(cols)) + 1 or name not in digests:
                continue  # no row recorded: every run's header is the same
            if not path.is_file() or not header_matches(path, cols):
                continue  # gone, gzipped or of another version: check_csvs says which
            found[name] = path.stat().st_size >= recorded and prefix_digest(path, recorded) == digests[name]
        return found

    def check_config(self, config: dict | None) -> None:
        """On resume, refuse a config that differs from the run's ``config.yaml`` (when it has one).
        Nothing is written here: a resume writes ``config.yaml`` (:meth:`write_config`) only once
        every check has passed, so a refused one never leaves a config.yaml of other settings
        behind (which would refuse every later resume with the run's own)."""
        path = self.path / "config.yaml"
        if config is None or not path.exists():
            return
        try:
            old = yaml.safe_load(path.read_bytes()) or {}
        except (yaml.YAMLError, ValueError) as e:
            raise RunDirectoryError(f"{path}: not valid YAML ({first_line(e)})") from None
        except OSError as e:  # a folder of that name, a file it may not read
            raise RunDirectoryError(f"{path}: cannot be read ({e.strerror or e}); restore it or start a new run "
                                    "directory (nothing was written)") from None
        if not isinstance(old, dict):
            raise RunDirectoryError(f"{path}: not a mapping of settings ({type(old).__name__}); restore it "
                                    "or start a new run directory")
        moved = moved_targets(old)
        if moved:
            was, now = moved[0]
            raise RunDirectoryError(f"{path}: names {was}, a module path of fedrun's earlier layout (now "
                                    f"{now}); this run cannot be resumed by this fedrun (fedrun.results and "
                                    "fedrun-plot still read it): start a new run directory")
        old, new = _settings(old), _settings(config)
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if diff:
            raise ConfigError("resume", "true", f"the settings differ from the run's config.yaml in: "
                              f"{', '.join(diff)}; resume with the original overrides")

    def write_config(self, config: dict | None, resume: bool) -> None:
        """Write ``config.yaml``: a new run's, or a resumed run's where it is missing (after every
        check of the resume: :meth:`check_config`, the checkpoint's settings)."""
        path = self.path / "config.yaml"
        if config is None or (resume and path.exists()):
            return
        text = yaml.safe_dump(config, sort_keys=False)
        write_atomic(path, lambda f: f.write(text))

    def start_log(self) -> None:
        """Append this process's log records to ``fedrun.log`` (a resumed run keeps its history).

        When several runs share the process (a population, :mod:`fedrun.harness.population`), a run's
        log takes the records made while it :meth:`speaks`, and those made while none does."""
        self._handler = RunLog(self.path / LOG_FILE, mode="a")
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
