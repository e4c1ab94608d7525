"""Errors a user can cause and fix.  The CLI prints them as one line and exits with ``exit_code``."""
from __future__ import annotations

import argparse
import errno
import sys
from typing import NoReturn


class FedrunError(Exception):
    """Base of fedrun's one-line errors: the message says what happened and what to do."""

    exit_code = 2


class ConfigError(FedrunError, ValueError):
    """A setting has a value fedrun cannot use.

    The message names the setting, the value and what is allowed, e.g.
    ``aggregator.beta=-1: must be > 0``.
    """

    def __init__(self, setting: str, value, allowed: str):
        self.setting, self.value, self.allowed = setting, value, allowed
        super().__init__(f"{setting}={value}: {allowed}")


class UsageError(FedrunError, ValueError):
    """A command line a program cannot use: an option out of range, folders that hold no run to
    read, an output path that cannot be written.  The message names the option or path and what
    is allowed, e.g. ``--target=95: an accuracy is a fraction in (0, 1]: write 0.95 for 95%``."""


class DataError(FedrunError, RuntimeError):
    """A dataset could not be found, read or downloaded."""


class RunDirectoryError(FedrunError, RuntimeError):
    """The run directory cannot be used as asked: another process holds it, or resuming it would
    corrupt it (a CSV shorter than its checkpoint records, a missing file, an unreadable
    checkpoint).  Raised before anything in it is written."""


class DivergenceError(FedrunError, RuntimeError):
    """The model became NaN or Inf; the run stops with its CSVs intact."""

    exit_code = 3


class NoSpaceError(FedrunError, OSError):
    """The disk filled up; the run stops after its last complete round, resumable."""

    exit_code = 4


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a SLURM time limit, preemption), raised where the signal lands as Ctrl-C's
    KeyboardInterrupt is, so the run stops the same way (:func:`fedrun.command.cli.main` installs it)."""


class Interrupted(FedrunError):
    """Ctrl-C (SIGINT, exit 130) or SIGTERM (exit 143): the run stops after its last complete
    round, resumable."""

    exit_code = 130

    def __init__(self, last_round: int | None, recorded: int = 0, terminated: bool = False):
        """``last_round``: the round of the checkpoint on disk (0: the run's start); ``recorded``:
        the last round whose rows were written (later than the checkpoint's when
        ``checkpoint_every`` > 1); ``terminated``: stopped by SIGTERM rather than Ctrl-C."""
        self.last_round, self.recorded, self.terminated = last_round, recorded, terminated
        self.exit_code = 143 if terminated else 130
        what = "terminated (SIGTERM)" if terminated else "interrupted"
        if last_round is None:  # before the run directory was opened
            super().__init__(f"{what} before the run started; nothing was written")
            return
        if recorded > last_round:  # checkpoint_every > 1: the rounds since the checkpoint are run again
            again = (f"continues after round {last_round}, its last checkpoint" if last_round else
                     "starts over from round 1 (no checkpoint since the start)")
            super().__init__(f"{what} after round {recorded}; resume with resume=true, which {again} "
                             f"(checkpoint_every)")
            return
        done = f"after round {last_round}" if last_round else "before the first round completed"
        super().__init__(f"{what} {done}; resume with resume=true")


def disk_full(error: BaseException) -> bool:
    """Whether an error comes from a full disk or quota (ENOSPC, EDQUOT): an OSError itself, or an
    error raised while handling or from one, as torch.save's RuntimeError ("unexpected pos") is.
    A context suppressed (``raise ... from None``, as fedrun's own one-line errors are) is not
    followed: :class:`NoSpaceError` is already the one line, not a full disk to say again."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return False


def first_line(error: BaseException, limit: int | None = None) -> str:
    """The first non-empty line of an exception's message (its type's name if it has none), with
    the next one where the first ends with a colon (Hydra's "Error loading 'x':" puts the cause
    there): what a one-line error quotes of an underlying failure, whole (the cause is often at
    its end), or its first ``limit`` characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:  # "Error loading 'x.y':" and, below, why
        text = f"{text} {lines[1]}"
    return text if limit is None else text[:limit]


def did_you_mean(word: str, choices) -> str:
    """``did you mean X? `` for the closest of ``choices`` to a misspelt ``word`` (difflib's ratio
    >= 0.6, as Python's own NameError suggestions), or ``""``: the start of an error's advice."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"did you mean {close[0]}? " if close else ""


def check(condition: bool, setting: str, value, allowed: str) -> None:
    """Raise :class:`ConfigError` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(setting, value, allowed)


def program_name(prog: str) -> str:
    """The name a program's errors start with: its argparse ``prog`` without a subcommand or
    ``.py`` (``fednnnn_table2.py collect`` -> ``fednnnn_table2``)."""
    return prog.split()[0].removesuffix(".py") if prog.strip() else "fedrun"


def print_error(prog: str, error) -> None:
    """A program's refusal, as the ``fedrun`` command's: ``<prog>: error: <error>``, one line on
    stderr (the caller exits 2)."""
    print(f"{program_name(prog)}: error: {first_line(error, limit=2000)}", file=sys.stderr)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are fedrun's one-line refusals: a bad option raises
    :class:`UsageError` (``argument --target: '95': ...``), which the program's ``main`` prints
    as ``<prog>: error: <message>`` and returns 2, as for any other bad input; no usage block
    above it (``--help`` still prints the whole usage and exits 0).  Subcommands' parsers are of
    this class too."""

    def error(self, message: str) -> NoReturn:
        hint = "; --help lists them" if message.startswith(("the following arguments", "unrecognized")) else ""
        raise UsageError(f"{message}{hint}")


def exit_with(error, code: int) -> NoReturn:
    """The command's end on an error: ``fedrun: error: <error>`` on stderr (``fedrun: <error>``
    for Ctrl-C, the user's own choice), then exit with ``code``."""
    kind = "" if isinstance(error, Interrupted) else "error: "
    print(f"fedrun: {kind}{error}", file=sys.stderr)
    sys.exit(code)
