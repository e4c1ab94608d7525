"""Sweeps' failed jobs: each failure raised inside its job, noted in the sweep folder, listed at the end.

A sweep (``fedrun -m``) keeps going when a job fails.  The job raises :class:`JobFailed` (one
line, whatever the launcher: basic, joblib, submitit, Ray, population) and leaves a note in
``<sweep>/.failed_jobs/`` (:func:`record_failure`), written by the job's own process, so the
launching process finds every note (:func:`sweep_failures`) and the command lists the failed jobs
once the sweep is over.

The sweep then ends with a table of its jobs (:func:`sweep_table`), printed as text and written
beside them as ``sweep_table.md`` and ``sweep_table.tex`` (:func:`write_sweep_tables`), so a paper
or a README takes it as it is; ``fedrun-sweep-table`` (:func:`main`) prints or writes the table of
any sweep folder later, in any of the three formats (:mod:`fedrun.tables`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from fedrun import tables
from fedrun.errors import FedrunError, UsageError, first_line
from fedrun.harness.provenance import SWEEP_ID
from fedrun.harness.rundir import remove_empty_run_dir

log = logging.getLogger("fedrun")


class JobFailed(FedrunError, CompactHydraException):
    """A sweep job's failure, raised inside the job.  Hydra prints a CompactHydraException as its
    one line (no traceback); it pickles with its exit code, so launchers that run jobs in other
    processes (joblib, submitit, ray) hand it back intact."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):
        return JobFailed, (str(self), self.exit_code)


FAILURES = ".failed_jobs"  # in the sweep folder: one JSON per failed job, written by the job itself
COMPLETED = "completed"  # below a sweep's notes: one JSON per completed job (SweepCallback.on_job_end)
# The launching process's sweep id (SWEEP_ID, fedrun.harness.provenance), in the environment its jobs inherit
# (joblib's and submitit's processes too): each sweep keeps its notes apart, so two sweeps into one
# folder, or a sweep run again, list only their own failed jobs.


def _notes(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / FAILURES / os.environ.get(SWEEP_ID, "sweep")


def record_failure(sweep_dir: Path, job_num: int, run_dir: Path, error: str, exit_code: int) -> None:
    """Leave a note of the failed job where the launching process finds it, whichever process
    (or machine, with a shared file system) ran the job."""
    folder = _notes(sweep_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{job_num}.json").write_text(json.dumps(
        {"job": job_num, "run_dir": str(run_dir), "error": error, "exit_code": exit_code}))


def job_failed(sweep_dir: Path, job_num: int, run_dir: Path, error: FedrunError) -> JobFailed:
    """A sweep job's one-line failure: its directory removed if it holds nothing, the error logged
    and noted for the final list (:func:`record_failure`); the :class:`JobFailed` to hand Hydra."""
    remove_if_empty(run_dir)
    log.error("job %d failed: %s", job_num, error)
    record_failure(sweep_dir, job_num, run_dir, str(error), error.exit_code)
    return JobFailed(f"{run_dir}: {error}", error.exit_code)


def sweep_failures(sweep_dir: Path) -> list[dict]:
    """The failed jobs of this process's sweep, in job order."""
    folder = _notes(sweep_dir)
    notes = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            notes.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # a note cut off by a full disk: the job is still listed
            notes.append({"job": int(path.stem), "run_dir": "?", "error": f"failed ({path} is damaged)",
                          "exit_code": 1})
    return sorted(notes, key=lambda n: n["job"])


def record_job(sweep_dir: Path, job_num: int, run_dir: Path) -> None:
    """Note a completed job's run directory for the sweep's table.  A job usually says so itself
    (its run.json names the sweep), but a job that found its run already complete
    (``resume=true``) leaves the run untouched, so only this note lists it."""
    folder = _notes(sweep_dir) / COMPLETED
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{job_num}.json").write_text(json.dumps({"job": job_num, "run_dir": str(run_dir)}))


def sweep_completed(sweep_dir: Path) -> list[Path]:
    """The run directories of this process's sweep's completed jobs (:func:`record_job`)."""
    folder = _notes(sweep_dir) / COMPLETED
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            out.append(Path(json.loads(path.read_text())["run_dir"]))
    return out


class SweepCallback(Callback):
    """In the launching process: gives the sweep an id of its own (:data:`SWEEP_ID`, which its
    jobs inherit), so it lists only its own failed jobs, and remembers the sweep folder
    (:func:`last_sweep`) for the command's final list.  In the job's process: notes each completed
    job's folder (:func:`record_job`)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        global _SWEEP_DIR
        _SWEEP_DIR = Path(config.hydra.sweep.dir)
        os.environ[SWEEP_ID] = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        with contextlib.suppress(OSError):  # a note it cannot write: the table shows no trial numbers
            note_optuna_study(_SWEEP_DIR, config.hydra.get("sweeper"))

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        from hydra.core.utils import JobStatus

        hydra_cfg = config.hydra
        if job_return.status == JobStatus.COMPLETED and hydra_cfg.mode == RunMode.MULTIRUN:
            with contextlib.suppress(OSError):  # a note it cannot write: the job is still done
                record_job(Path(hydra_cfg.sweep.dir), hydra_cfg.job.num, Path(hydra_cfg.runtime.output_dir))


OPTUNA_NOTE = "optuna.study"  # among the sweep's notes (JSON, not *.json: those are failed jobs): the stored study


def note_optuna_study(sweep_dir: Path, sweeper) -> int | None:
    """An Optuna sweep into a stored study (``hydra.sweeper.storage``, resumed by a second
    command): how many trials the study holds already, noted for the sweep's table and said in
    the log, since Optuna numbers this sweep's trials from there (job j is trial ``first + j``,
    asked in job order; so long as no other process adds trials to the study meanwhile).  None
    (and no note) for any other sweep, or a study not stored yet."""
    if sweeper is None or "optuna" not in str(sweeper.get("_target_", "")) or not sweeper.get("storage"):
        return None
    import optuna

    name, storage = sweeper.get("study_name"), sweeper.get("storage")
    try:
        first = len(optuna.load_study(study_name=name, storage=storage).trials)
    except KeyError:  # optuna's "study not found": this sweep creates it, its trials from 0
        first = 0
    except Exception:  # noqa: BLE001 - a storage Optuna cannot open: the sweeper says so in its own line
        return None
    folder = _notes(sweep_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OPTUNA_NOTE).write_text(json.dumps({"study": name, "first_trial": first}))
    if first:
        log.info("Optuna study %s (%s) holds %d trials already: this sweep's jobs 0, 1, ... are its trials %d, "
                 "%d, ... (the sweep table's trial column)", name, storage, first, first, first + 1)
    return first


def optuna_first_trial(sweep_dir: Path) -> int | None:
    """The stored study's number of this sweep's job 0 (:func:`note_optuna_study`), or None."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((_notes(sweep_dir) / OPTUNA_NOTE).read_text())["first_trial"])
    return None


def forget_failures(sweep_dir: Path) -> None:
    """Remove this sweep's notes once listed (another sweep's stay)."""
    shutil.rmtree(_notes(sweep_dir), ignore_errors=True)
    with contextlib.suppress(OSError):
        (Path(sweep_dir) / FAILURES).rmdir()  # when no other sweep's notes are left


_SWEEP_DIR: Path | None = None


def last_sweep() -> Path | None:
    """The folder of the sweep this process launched (None: no sweep)."""
    return _SWEEP_DIR


def forget_sweep() -> None:
    """Forget the sweep an earlier command of this process launched (:func:`last_sweep`): a
    command in the same process (``fedrun.run``, a driver of many command lines) is not its sweep."""
    global _SWEEP_DIR
    _SWEEP_DIR = None


def remove_if_empty(run_dir: Path) -> None:
    """Hydra creates the job's directory before fedrun runs; a job refused before writing anything
    leaves nothing behind: the empty directory and the empty parents Hydra made for it go (up to
    the working directory; a directory holding anything is never touched, nor one another process
    has locked: :func:`fedrun.harness.rundir.remove_empty_run_dir`)."""
    cwd, path = Path.cwd().resolve(), run_dir.resolve()
    if not (path != cwd and cwd in path.parents) or not remove_empty_run_dir(path):
        return
    path = path.parent
    while path != cwd and cwd in path.parents:
        try:
            path.rmdir()  # only succeeds on an empty directory
        except OSError:
            return
        path = path.parent


def sweep_table(sweep_dir: Path, limit: int | None = 50, fmt: str = "text", every: bool = False) -> list[str]:
    """The lines a sweep ends with: one per job (its folder, the settings the sweep varied, its
    objective, done or failed), then how many jobs are done and where the results are.  Jobs are
    this sweep's folders (:func:`sweep_jobs`) and its failure notes; ``every``: every run
    directory in ``sweep_dir`` instead, whichever sweep ran it, and no notes (``fedrun-sweep-table``
    reads a folder after its sweep, whose notes are gone).  At most ``limit`` rows (None: all),
    the rest counted.

    ``fmt`` (:data:`fedrun.tables.FORMATS`): ``text``, the aligned columns the terminal shows;
    ``markdown``, a pipe table and the count as a paragraph under it; ``latex``, a booktabs
    ``tabular`` and the count as a ``%`` comment, the folder as given rather than resolved (the
    file is for a paper's repository, not this machine)."""
    tables.check_format(fmt)
    sweep_dir = Path(sweep_dir)
    head, rows, failed = _sweep_rows(sweep_dir, every)[:3]
    shown = rows if limit is None else rows[:limit]
    more = [f"... and {len(rows) - len(shown)} more jobs"] if len(shown) < len(rows) else []
    done = sum(row[-1] == "done" for row in rows)
    diverged = sum(row[-1].startswith("diverged") for row in rows)
    unfinished = sum(row[-1] == "not finished" for row in rows)
    failed_too = f" ({diverged} diverged)" if diverged else ""
    unfinished_too = f", {unfinished} not finished" if every and unfinished else ""
    where = sweep_dir.resolve() if fmt == "text" else sweep_dir
    count = (f"{done} of {len(rows)} jobs done, {failed} failed{failed_too}{unfinished_too}; "
             f"results in {where}")
    if fmt == "text":
        table = [head, *shown]
        widths = [max(len(r[i]) for r in table) for i in range(len(head))]
        return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table] + more + [count]
    # The job and the settings read as names, the objective as a number, the status as words.
    align = "l" * (len(head) - 2) + "rl"
    return tables.render(head, shown, fmt, align=align).splitlines() + tables.note(more + [count], fmt)


def _sweep_rows(sweep_dir: Path, every: bool) -> tuple[list[str], list[list[str]], int, list[float | None]]:
    """The sweep table's header, its rows (job, swept settings, objective, status), how many
    jobs failed (:func:`sweep_table`) and each row's objective value as a number (None: none)."""
    from fedrun import results

    folders = {path: name for name, path in sweep_jobs(sweep_dir, every).items()}
    names, failed = dict(folders), {}
    for note in [] if every else sweep_failures(sweep_dir):
        # A job refused its folder (or whose folder is gone) is known by its note alone.
        key = Path(note["run_dir"]).resolve() if note["run_dir"] != "?" else f"job {note['job']}"
        failed[key] = note
        names.setdefault(key, _relative(key, sweep_dir) if isinstance(key, Path) else str(note["job"]))
    # Numbered folders in job order, then the others (``fedavg_seed0``) by name.
    jobs = sorted(names, key=lambda key: (0, int(names[key]), "") if names[key].isdigit() else (1, 0, names[key]))
    overrides = {key: _given(key) if key in folders else {} for key in jobs}
    # What the sweep varied, among the jobs whose settings are known: a job refused before it made
    # its folder has none to read, and is not a job that differs in every setting.
    known = [key for key in jobs if key in folders] or jobs
    swept = sorted({k for key in known for k in overrides[key]
                    if len({overrides[m].get(k) for m in known}) > 1})
    summaries = {key: results.read_summary(key) if key in folders else {} for key in jobs}
    objective = next((s.get("objective") for s in summaries.values() if s.get("objective")), None) or "objective"
    # An Optuna sweep into a stored study: each numbered job's trial number in that study.
    first = None if every else optuna_first_trial(sweep_dir)
    trial = (lambda key: str(first + int(names[key])) if names[key].isdigit() else "-") if first is not None else None
    rows, values = [], []
    for key in jobs:
        value = summaries[key].get("objective_value")
        values.append(None if value is None else float(value))
        stopped = _stopped(key) if key in folders and not summaries[key] else None
        status = (f"diverged at round {stopped['round']}" if stopped and stopped["reason"] == "diverged" and stopped["round"]
                  else "failed" if key in failed else "done" if summaries[key] else "not finished")
        rows.append([names[key], *([trial(key)] if trial else []), *(short(overrides[key].get(k, "-")) for k in swept),
                     "-" if value is None else f"{value:.4f}", status])
    # Read from a folder alone, a job that diverged is the failed job its sweep listed.
    n_failed = sum(row[-1].startswith("diverged") for row in rows) if every else len(failed)
    return ["job", *(["trial"] if trial else []), *swept, objective, "status"], rows, n_failed, values


def short(value: str, digits: int = 6) -> str:
    """A setting's value as the table shows it: a number a sampler drew (Optuna's
    ``0.9034962584119619``) to ``digits`` significant digits (``0.903496``); any other value
    (``0.1``, ``100``, ``fedavg``) as it was given."""
    if not re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)", value):
        return value
    rounded = f"{float(value):.{digits}g}"
    return rounded if float(rounded) != float(value) else value  # more digits than ``digits``: rounded


def grouped_table(sweep_dir: Path, fmt: str = "text", every: bool = True) -> list[str]:
    """The sweep's runs grouped by setting over their seeds, as a paper prints them: one row per
    combination of the swept settings other than ``seed``, its objective as mean ± sd (the sample
    standard deviation, over the runs that finished; the mean alone for one run, ``-`` for none)
    and ``n``, the number of finished runs it is the mean of.  A setting's runs that did not
    finish (failed, diverged, still going) are counted under the table, never averaged."""
    tables.check_format(fmt)
    sweep_dir = Path(sweep_dir)
    head, rows, _failed, values = _sweep_rows(sweep_dir, every)
    settings = [i for i, name in enumerate(head[1:-2], start=1) if name != "seed"]
    groups: dict[tuple[str, ...], list[float]] = {}
    left_out = 0
    for row, value in zip(rows, values):
        cell = groups.setdefault(tuple(row[i] for i in settings), [])
        if row[-1] == "done" and value is not None and math.isfinite(value):
            cell.append(value)
        else:
            left_out += 1
    body = [[*key, mean_sd(cell), str(len(cell))] for key, cell in groups.items()]
    # A sweep of seeds alone is one setting: its row is named by the folder.
    names = [head[i] for i in settings] or ["runs"]
    body = [row if settings else [sweep_dir.name, *row] for row in body]
    table_head = [*names, f"{head[-2]} (mean ± sd)", "n"]
    where = sweep_dir.resolve() if fmt == "text" else sweep_dir
    left = f"; {left_out} run(s) not finished or failed, left out" if left_out else ""
    count = (f"{len(body)} setting(s), {len(rows)} run(s), mean ± sd over the seeds of each (sample sd); "
             f"n: the finished runs averaged{left}; results in {where}")
    lines = tables.render(table_head, body, fmt, align="l" * len(names) + "rr").splitlines()
    return lines + (tables.note([count], fmt) if fmt != "text" else [count])


def mean_sd(values: list[float], digits: int = 4) -> str:
    """``mean ± sd`` of ``values`` (sample sd, n - 1), each to ``digits`` decimals: the mean
    alone for one value, ``-`` for none."""
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


# The sweep table's files in the sweep folder, by format: what a paper or a README takes as it is.
TABLE_FILES = {"markdown": "sweep_table.md", "latex": "sweep_table.tex"}


def write_sweep_tables(sweep_dir: Path, every: bool = False) -> list[Path]:
    """The sweep's closing table, every job of it, as ``sweep_table.md`` and ``sweep_table.tex``
    in the sweep folder (:data:`TABLE_FILES`), each replaced whole (never half-written, never
    through a link).  Returns the files written; one that cannot be written (a full disk, a
    read-only folder) is a warning, never the sweep's failure: its jobs' results are all there.
    Nothing is written for a sweep without a job (stopped before its first).  ``every``: the
    table of every run directory in the folder, whichever sweep ran it (:func:`sweep_table`), as a
    grid of one-run sweeps into one folder needs (``--jobs`` of the table scripts)."""
    from fedrun.harness.rundir import write_atomic

    if not Path(sweep_dir).is_dir() or not (sweep_jobs(sweep_dir, every) or (not every and sweep_failures(sweep_dir))):
        return []  # a sweep stopped before its first job: no table to write, nor a folder to write it to
    written = []
    for fmt, name in TABLE_FILES.items():
        path = Path(sweep_dir) / name
        try:
            lines = sweep_table(sweep_dir, limit=None, fmt=fmt, every=every)
            write_atomic(path, lambda f: f.write("\n".join(lines) + "\n"))
        except (OSError, FedrunError) as e:
            print(f"fedrun: warning: {path}: not written ({first_line(e)})", file=sys.stderr)
            continue
        written.append(path)
    return written


PROG = "fedrun-sweep-table"


def main(argv: list[str] | None = None) -> int:
    """``fedrun-sweep-table SWEEP_DIR [--format text|markdown|latex] [--out FILE]``: a sweep
    folder's table of jobs, again, in the format asked.  The exit code (2: bad options, no such
    folder, no job in it, a file that cannot be written)."""
    from fedrun.errors import ArgumentParser, print_error
    from fedrun.paths import writable_file

    p = ArgumentParser(prog=PROG, description=(
        "Print the table a sweep (fedrun -m) ends with, for any sweep folder: one row per run directory in it "
        "(its folder, the settings that differ between the runs, the objective, done, diverged at round t or not "
        "finished), as aligned text, a GitHub Markdown table or a LaTeX tabular (booktabs) for a paper."))
    p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="the sweep folder (hydra.sweep.dir), or any folder of runs")
    p.add_argument("--format", choices=tables.FORMATS, default=None,
                   help="text, markdown or latex (default: from --out's suffix, .md or .tex; else text)")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="write the table to FILE instead of printing it (e.g. table.tex)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="at most N rows, the rest counted (default: all)")
    p.add_argument("--group-seeds", action="store_true",
                   help="one row per setting over its seeds, as a paper prints it: the objective's mean ± sd "
                        "(sample sd) over the finished runs, and n, how many")
    try:
        args = p.parse_args(argv)
        if args.limit is not None and args.limit < 1:
            raise UsageError(f"--limit={args.limit}: must be an integer >= 1 (rows shown)")
        fmt = args.format or (SUFFIX_FORMATS.get(Path(args.out).suffix, "text") if args.out else "text")
        if args.out:
            writable_file("--out", Path(args.out))
        from fedrun import results

        sweep_dir = results.folders(args.sweep_dir)[0]
        if not sweep_jobs(sweep_dir, every=True):
            raise results.no_runs(sweep_dir, require=("config.yaml",))
        if args.group_seeds and args.limit is not None:
            raise UsageError("--limit: not with --group-seeds (a grouped table shows every setting)")
        lines = (grouped_table(sweep_dir, fmt) if args.group_seeds
                 else sweep_table(sweep_dir, limit=args.limit, fmt=fmt, every=True))
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text("\n".join(lines) + "\n")
    except FedrunError as e:
        print_error(PROG, e)
        return 2
    except OSError as e:  # --out cannot be written after all (a full disk)
        print_error(PROG, f"{e.filename or args.out}: {e.strerror or e}")
        return 2
    print(f"wrote {args.out}" if args.out else "\n".join(lines))
    return 0


# --out's suffix, when --format is not given.
SUFFIX_FORMATS = {".md": "markdown", ".markdown": "markdown", ".tex": "latex", ".txt": "text"}


def _stopped(run_dir: Path) -> dict | None:
    """How an unfinished job ended (:func:`fedrun.results.stopped`, from run.json): diverged at round t, or None."""
    from fedrun import results

    return results.stopped(run_dir)


def sweep_jobs(sweep_dir: Path, every: bool = False) -> dict[str, Path]:
    """This sweep's job folders by name (their path below ``sweep_dir``): the numbered folders
    (``hydra.sweep.subdir``'s default, ``0``, ``1``, ...) and, whatever ``hydra.sweep.subdir``
    names them (``fedavg_seed0``), every run directory below ``sweep_dir`` whose ``run.json``
    says this sweep ran it (:data:`SWEEP_ID`), so a sweep into a folder that another sweep writes
    to lists its own jobs only.  ``every``: every run directory below ``sweep_dir`` (one holding
    ``config.yaml``), whichever sweep ran it."""
    from fedrun import results

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return {}
    jobs = {p.name: p.resolve() for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    mine = os.environ.get(SWEEP_ID)
    if every:
        for run in results.find_runs(sweep_dir, require=("config.yaml",)):
            if run not in jobs.values():
                jobs[_relative(run, sweep_dir)] = run
    elif mine:
        for run in results.find_runs(sweep_dir, require=("config.yaml", results.RUN_FILE)):
            if run not in jobs.values() and any(s.get("sweep") == mine for s in _sessions(run)):
                jobs[_relative(run, sweep_dir)] = run
        for run in sweep_completed(sweep_dir):  # a run found complete on resume names no session of this sweep
            run = run.resolve()
            if run.is_dir() and run not in jobs.values():
                jobs[_relative(run, sweep_dir)] = run
    return jobs


def _sessions(run_dir: Path) -> list[dict]:
    """``run.json``'s entries, ``[]`` when it cannot be read."""
    from fedrun import results

    try:
        sessions = json.loads((run_dir / results.RUN_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


def _relative(path: Path, sweep_dir: Path) -> str:
    try:
        return str(Path(path).relative_to(Path(sweep_dir).resolve()))
    except ValueError:
        return str(path)


def _given(run_dir: Path) -> dict[str, str]:
    """A job's command-line settings, from its ``config.yaml`` (``overrides``)."""
    from fedrun import results

    try:
        given = results.read_config(run_dir).get("overrides") or []
    except (OSError, ValueError, FedrunError):  # a damaged config.yaml: the table lists the job without them
        return {}
    if not isinstance(given, list):
        return {}
    return dict(o.lstrip("+~").split("=", 1) for o in given if isinstance(o, str) and "=" in o)


if __name__ == "__main__":
    sys.exit(main())
