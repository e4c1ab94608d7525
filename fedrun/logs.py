"""What a run tells while it runs: a progress bar, or a line per round, and its log file.

A run writes to its ``fedrun.log`` (:mod:`fedrun.harness.rundir`) its start, one line per round (test
accuracy and loss, N/E, seconds) and its end.  On the console the same round lines show when no
progress bar does: with ``progress=false``, or when the console is not a terminal (``nohup``,
SLURM's log files), where a bar would be one long line of carriage returns.  In a notebook the bar
is tqdm's widget.  :class:`ConsoleFilter` (on the console handler of
``conf/hydra/job_logging/fedrun.yaml``) keeps the round lines off the console while a bar shows,
and a population's per-run round lines off it always (the population prints one line a round).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import sys

ROUND_LINE = "round_line"  # a log record's extra: a line of one round
FILE_ONLY = "file_only"  # a log record's extra: for the run's fedrun.log, not the console
CONSOLE_ONLY = "console_only"  # a log record's extra: for the console, not the runs' fedrun.log
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] %(message)s"

_BAR_SHOWN: contextvars.ContextVar[bool] = contextvars.ContextVar("fedrun_bar_shown", default=False)


def in_notebook() -> bool:
    """Running in a Jupyter kernel (where tqdm.auto draws its widget)."""
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and type(shell.get_ipython()).__name__ == "ZMQInteractiveShell"
    except Exception:  # noqa: BLE001 - no IPython shell: not a notebook
        return False


def bar_wanted(progress: bool) -> bool:
    """Whether a run shows a progress bar: asked for, and a terminal or notebook to draw it in."""
    return bool(progress) and (sys.stderr.isatty() or in_notebook())


@contextlib.contextmanager
def bar_shown(shown: bool):
    """While inside, the console drops round lines when ``shown`` (the bar says the same)."""
    token = _BAR_SHOWN.set(shown)
    try:
        yield
    finally:
        _BAR_SHOWN.reset(token)


class ConsoleFilter(logging.Filter):
    """The console handler's filter: no round lines under a progress bar, no file-only records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, FILE_ONLY, False):
            return False
        return not (getattr(record, ROUND_LINE, False) and _BAR_SHOWN.get())


class TqdmStreamHandler(logging.StreamHandler):
    """The console handler: a record printed through ``tqdm.write``, which lifts a progress bar
    showing on the same stream, prints the line and draws the bar again below it, so the run's
    ``done:`` line (or a warning mid-run) never lands on the bar's line.  Without a bar it prints
    as a plain ``StreamHandler``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging's own rule: a record that cannot print is reported, not raised
            self.handleError(record)


def ensure_console() -> logging.Handler | None:
    """Outside the command (``fedrun.run()`` in a script or notebook), where no handler prints
    fedrun's records: a console handler for the run's duration (returned, to remove after), as
    the command has; None where one is there already."""
    root, own = logging.getLogger(), logging.getLogger("fedrun")
    if root.handlers or own.handlers:
        return None
    handler = TqdmStreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(ConsoleFilter())
    own.addHandler(handler)
    return handler


class _HoldBack(logging.Filter):
    """A console handler's filter that holds back its records until a run starts (see
    :func:`held_until_started`); ``state`` is shared by every console handler's filter."""

    def __init__(self, handler: logging.Handler, state: dict):
        super().__init__()
        self.handler, self.state, self.held = handler, state, []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.state["released"]:
            return True
        if record.name == self.state["started"]:
            self.state["release"]()
            return True
        self.held.append(record)
        return False

    def flush_held(self) -> None:
        held, self.held = self.held, []
        for record in held:  # in their order, before the record that released them
            self.handler.handle(record)


@contextlib.contextmanager
def held_until_started(started: str = "fedrun.harness.federated_run", on_release=None):
    """While inside, what the console would show before a run starts (the job's thread count, a
    warning, the folder its data is read from) is held back: shown, in order, with the run's own
    first line (a record of the logger ``started``) or at a normal end, after ``on_release()``
    (which prints what the command held back itself); dropped when the job ends with an error
    before, so a refusal is its one line alone on stderr."""
    root = logging.getLogger()
    filters: list[_HoldBack] = []

    def release() -> None:
        if state["released"]:
            return
        state["released"] = True
        if on_release is not None:
            on_release()
        for hold in filters:
            hold.flush_held()

    state = {"released": False, "started": started, "release": release}
    filters += [_HoldBack(h, state) for h in root.handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    for hold in filters:
        hold.handler.addFilter(hold)
    try:
        yield
        release()
    finally:
        for hold in filters:
            hold.handler.removeFilter(hold)
