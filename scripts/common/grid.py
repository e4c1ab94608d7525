"""Launching a paper's grid of fedrun runs as ``fedrun -m`` sweeps, shared by the table scripts' ``run`` modes.

Every table script's ``run`` launches its missing runs as sweeps, so that ``--population`` (which
adds ``hydra/launcher=population``, see docs/sweeps.md) trains the runs of a sweep that share a
dataset and model together, and any other Hydra launcher can be named with ``--set``.  A sweep is
a product of values: a *column* of FedNNNN's or FedLayerWise's table (a condition, a scenario) is
swept over methods x seeds into ``OUT/<column>/<method>_seed<seed>`` (:func:`by_column`,
:func:`run_sweeps`); the parameter-divergence study sweeps networks x seeds (its own plan, in
``pd/tables.py``); :func:`launch` launches either (:data:`Plan`).  ``hydra.sweep.dir`` and
``hydra.sweep.subdir`` give every run the folder it has always had, so ``collect`` and earlier
outputs read the same.  Runs already finished are skipped: the runs still to do are split into
products (:func:`product_blocks`), one sweep each; what is still missing afterwards is reported.
A run that started but did not finish (Ctrl-C, a kill, a time limit) is skipped too, unless
``--resume``: then it goes on from its last checkpoint (``resume=true``); a run that diverged is
never resumed (it would diverge again at the same round).

A grid longer than one sitting (the whole MNIST's NIID-Bench table is days of CPU): ``--jobs N``
runs N processes at once, one run each (``--set threads=1`` on an N-core CPU); ``--stop-after
MINUTES`` stops them (each after its last complete round) before a session's or a batch job's
limit.  Checkpoints are not committed (outputs/reproductions' .gitignore), so ``run`` packs the
unfinished runs' checkpoints into ``OUT/resume.tar.gz``; committed with the folder, ``run
--resume`` in any checkout takes them back and goes on (:func:`pack_resume`, :func:`unpack_resume`;
``python scripts/common/grid.py pack|unpack DIR`` for runs launched by hand).

fedrun runs in the caller's working directory, as a ``fedrun`` typed there would (datasets are
looked for under its ``data/`` unless ``FEDRUN_DATA`` or ``data_root`` say otherwise).
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import io
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Callable, Hashable, Iterable, NamedTuple

from fedrun import results
from fedrun.command.sweeps import write_sweep_tables
from fedrun.paths import conf_options
from fedrun.results import Run

SUBDIR = "hydra.sweep.subdir=${hydra:runtime.choices.aggregator}_seed${seed}"
POPULATION = "hydra/launcher=population"
POLL_SECONDS = 5.0  # how often a running grid looks for finished runs
# No sweep starts this close to --stop-after's limit (at most a tenth of the limit): in less, a
# fedrun run loads its data and is stopped before its first round, leaving only a round-0 checkpoint.
LAST_START_SECONDS = 120.0


def fedrun_command() -> list[str]:
    """How to call fedrun: this interpreter's ``-m fedrun`` when importable, else ``fedrun`` on PATH."""
    if importlib.util.find_spec("fedrun") is not None:
        return [sys.executable, "-m", "fedrun"]
    exe = shutil.which("fedrun")
    if exe is None:
        sys.exit("fedrun is neither importable nor on PATH; activate its environment")
    return [exe]


def launcher(population: bool) -> list[str]:
    """The launcher override of ``run --population``: every sweep trained as populations."""
    return [POPULATION] if population else []


# ----------------------------------------------------------------------------- data stand-ins

def dataset_substitute(text: str, allowed: tuple[str, ...]) -> tuple[str, str]:
    """Parse ``DATASET=OPTION`` for ``--substitute``: DATASET in ``allowed``, OPTION one of fedrun's
    ``dataset`` options (its installed configs)."""
    real, sep, option = text.partition("=")
    if not sep or real not in allowed or not option:
        raise argparse.ArgumentTypeError(f"expected DATASET=OPTION with DATASET in {allowed}, got {text!r}")
    options = conf_options("dataset")
    if option not in options:
        raise argparse.ArgumentTypeError(f"unknown dataset option {option!r}; choose one of {options}")
    return real, option


def substitute_overrides(option: str | None, shape: tuple[int, int]) -> list[str]:
    """The overrides that read the dataset option ``option`` in place of a paper's dataset of image
    ``shape`` (channels, size): a synthetic stand-in takes that shape, so the paper's model is
    unchanged.  None: no substitute."""
    if option is None:
        return []
    channels, size = shape
    extra = [f"dataset.channels={channels}", f"dataset.image_size={size}"] if option == "synthetic" else []
    return [f"dataset={option}", *extra]


def seed_list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def seeds(text: str) -> str:
    """``--seeds``: comma-separated integer seeds, at least one (checked before anything runs)."""
    values = seed_list(text)
    if not values or not all(v.lstrip("-").isdigit() for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integer seeds, e.g. 0,1,2")
    return ",".join(values)


def print_banner(lines: list[str], extra: list[str]) -> None:
    """What the launched runs change from the paper's setting, and the extra overrides, as NOTE lines."""
    for line in lines + ([f"EXTRA OVERRIDES: {' '.join(extra)}"] if extra else []):
        print("NOTE: " + line, flush=True)


# ----------------------------------------------------------------------------- sweeps

def product_blocks(pairs: Iterable[tuple[Hashable, Hashable]]) -> list[tuple[list, list]]:
    """Split ``(a, b)`` pairs into products ``a-values x b-values`` that hold every pair once and
    nothing else: the a's that lack the same b's are one block (in the order the pairs first name
    them), so a sweep of a block runs exactly the runs still to do."""
    wanted: dict = {}
    for a, b in pairs:
        wanted.setdefault(a, []).append(b)
    blocks: dict[tuple, list] = {}
    for a, bs in wanted.items():
        blocks.setdefault(tuple(dict.fromkeys(bs)), []).append(a)
    return [(a_values, list(b_values)) for b_values, a_values in blocks.items()]


def run_logged(cmd: list[str], log_path: Path, poll: Callable[[], None] = lambda: None,
               every: float = POLL_SECONDS) -> tuple[int, float]:
    """Run ``cmd``, appending its output to ``log_path``; ``poll()`` every ``every`` seconds while it
    runs and once after (to report the runs it finished): ``(exit code, seconds)``."""
    ended: list = []
    run_at_once([Sweep("", cmd, log_path, poll, lambda rc, seconds: ended.extend((rc, seconds)))], every=every)
    return ended[0], ended[1]


class Sweep(NamedTuple):
    """One ``fedrun -m`` to launch: the line printed as it starts, the command, the log its output
    is appended to, ``poll()`` called while it runs and once after (to report the runs it finished)
    and ``finish(exit code, seconds)`` once it has ended."""
    line: str  # '' prints nothing
    cmd: list[str]
    log: Path
    poll: Callable[[], None]
    finish: Callable[[int, float], None]


def run_at_once(sweeps: Iterable[Sweep], jobs: int = 1, stop_after: float | None = None,
                every: float | None = None, clock: Callable[[], float] = time.monotonic) -> bool:
    """Run ``sweeps`` in order, ``jobs`` at a time (one after another with 1, as :func:`run_logged`).

    ``stop_after``: minutes from now after which every sweep still running gets SIGTERM and no
    other starts: fedrun ends each run after its last complete round, with the checkpoint it wrote
    then, so ``resume=true`` goes on from there (a time limit for a session, a batch job, a loan).
    No sweep starts in the limit's last ``LAST_START_SECONDS`` (or last tenth, if shorter): too
    little for a run's first round; once nothing runs then, the grid stops at once.
    Returns whether the time limit stopped the grid."""
    every = POLL_SECONDS if every is None else every
    pending = iter(sweeps)
    deadline = None if stop_after is None else clock() + 60 * stop_after
    last_start = None if stop_after is None else deadline - min(LAST_START_SECONDS, 6 * stop_after)
    running: list[tuple[subprocess.Popen, Sweep, float, object]] = []
    stopped = False
    while True:
        now = clock()
        if deadline is not None and not stopped and (now >= deadline or (not running and now >= last_start)):
            left = list(pending)  # counted; never started
            stopped = bool(running or left)
            if stopped:
                when = "passed" if now >= deadline else f"with {_duration(deadline - now)} left, too little to start a run"
                print(f"time limit: {_duration(60 * stop_after)} {when}; {len(running)} sweep(s) stopped after "
                      f"their last complete round, {len(left)} not started (`--resume` goes on with them)", flush=True)
            for proc, *_ in running:
                proc.send_signal(signal.SIGTERM)
        while not stopped and len(running) < jobs and (last_start is None or clock() < last_start):
            sweep = next(pending, None)
            if sweep is None:
                break
            if sweep.line:
                print(sweep.line, flush=True)
            log = open(sweep.log, "a")
            running.append((subprocess.Popen(sweep.cmd, stdout=log, stderr=subprocess.STDOUT), sweep, clock(), log))
        if not running:
            return stopped
        wait = every if deadline is None or stopped else max(0.0, min(every, deadline - clock()))
        try:  # the first sweep's end wakes us at once; the others are looked at every `every` seconds
            running[0][0].wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        for entry in list(running):
            proc, sweep, t0, log = entry
            sweep.poll()
            if proc.poll() is None:
                continue
            running.remove(entry)
            log.close()
            sweep.poll()
            sweep.finish(proc.returncode, clock() - t0)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else \
        f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def run_seconds(run: Path) -> float | None:
    """A finished run's time: its summary's ``round_seconds`` (the time in its rounds, summed over
    rounds.csv), else its start to its end (None if it says neither).

    The time in rounds first: a run stopped in one sitting and resumed in another has its start in
    the first, so start to end would count the hours between the sittings."""
    from datetime import datetime

    summary = results.read_summary(run)
    try:
        return float(summary["round_seconds"])
    except (KeyError, TypeError, ValueError):
        pass
    try:
        return (datetime.fromisoformat(summary["finished"]) - datetime.fromisoformat(summary["started"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


class Progress:
    """What a long grid says while it runs: the runs to do and a rough time before it starts (from
    the runs already finished in its folder, when there are some), then a line per finished run
    with what is left and an ETA at the mean time of the runs finished so far.

    ``jobs``: runs of one run a sweep going side by side (1 for one sweep after another, and for
    populations, whose runs finish together).  The time a run then divides by ``jobs``: the grid's
    own clock would not, as the first runs finish after a whole run's time with the next ones
    already half done.

    ``columns``: ``{column: runs to do in OUT/column}``; each column's runs are then guessed at the
    mean time of that column's finished runs, where it has some (a table's columns can differ
    many-fold: FedNNNN's CIFAR-10 columns train a larger model on other images than its MNIST
    ones; a column's runs also carry the speed of the machine they ran on), else at the mean over
    the folder."""

    def __init__(self, total: int, out: Path, clock: Callable[[], float] = time.perf_counter, jobs: int = 1,
                 columns: dict[str, int] | None = None):
        self.total, self.finished, self.clock, self.jobs = total, 0, clock, jobs
        self.took: list[float] = []  # the wall time of each run finished in this grid, where it says
        self.start = clock()
        by_folder: dict[Path, list[float]] = {}
        for run in results.find_runs(out, require=results.FINISHED_FILES) if out.is_dir() else []:
            seconds = run_seconds(run)
            if seconds is not None:
                by_folder.setdefault(run.parent.resolve(), []).append(seconds)
        earlier = [t for times in by_folder.values() for t in times]
        self.typical = sum(earlier) / len(earlier) if earlier else None
        self.earlier = len(earlier)
        self.per_column = bool(columns) and self.typical is not None and total > 0
        if self.per_column:  # the mean a run over the runs to do, each at its own column's pace
            own = {c: by_folder.get((out / c).resolve()) for c in columns}
            guess = sum(n * (sum(own[c]) / len(own[c]) if own[c] else self.typical) for c, n in columns.items())
            self.typical = guess / total

    def announce(self, sweeps: int | None = None) -> None:
        # The earlier runs' time a run is what they took, sharing the machine or not: `jobs` at once, about 1/jobs.
        how = "one after another" if self.jobs == 1 else f"{self.jobs} at a time"
        source = f"the {self.earlier} run(s) already in the folder"
        if self.per_column:
            source += ", each column's own where it has some"
        guess = (f"about {_duration(self.typical)} a run, from {source}: "
                 f"about {_duration(self.typical * self.total / self.jobs)} in all, {how}"
                 if self.typical is not None else "time: an ETA follows each finished run")
        where = f" in {sweeps} sweep(s)" if sweeps is not None else ""
        print(f"{self.total} run(s) to do{where}; {guess}", flush=True)

    def done(self, name: str, seconds: float | None) -> None:
        self.finished += 1
        left = self.total - self.finished
        if seconds is not None:
            self.took.append(seconds)
        # The mean wall time per finished run, as this grid ran them (a population finishes several at
        # once); runs side by side: their mean time over jobs.
        pace = (sum(self.took) / len(self.took) / self.jobs if self.jobs > 1 and self.took
                else (self.clock() - self.start) / self.finished)
        eta = time.strftime("%H:%M", time.localtime(time.time() + pace * left))
        took = f" in {_duration(seconds)}" if seconds is not None else ""
        print(f"    [{self.finished}/{self.total}] {name} done{took}; "
              + (f"{left} left, about {_duration(pace * left)} (ETA {eta})" if left else "all done"), flush=True)


def print_errors(log_path: Path, last: int) -> None:
    """The ``last`` lines of a log that mention an error, indented under the sweep's line."""
    errors = [line for line in log_path.read_text().splitlines() if "error" in line.lower()]
    if errors:
        print("    " + "\n    ".join(errors[-last:]), flush=True)


# ----------------------------------------------------------------------------- methods x seeds per column

def sweep_command(preset: str, methods: list[str], seeds: list[str], overrides: list[str], extra: list[str],
                  folder: Path, population: bool = False) -> list[str]:
    """One ``fedrun -m``: methods x seeds of one table column, into ``folder/<method>_seed<seed>``;
    ``population``: trained as populations (``hydra/launcher=population``)."""
    return [*fedrun_command(), "-m", f"experiment={preset}", f"aggregator={','.join(methods)}",
            f"seed={','.join(seeds)}", *overrides, "progress=false", *launcher(population), *extra,
            f"hydra.sweep.dir={folder}", SUBDIR]


def cell_state(folder: Path) -> tuple[set, set]:
    """(done, started-but-unfinished) (method, seed) pairs among the run directories in ``folder``."""
    done, started, _ = cell_states(folder)
    return done, started


def cell_states(folder: Path) -> tuple[set, set, set]:
    """(done, started-but-unfinished, diverged) (method, seed) pairs among the run directories in
    ``folder``; the diverged ones are among the started ones (they did not finish either)."""
    done, started, diverged = set(), set(), set()
    if not folder.is_dir():
        return done, started, diverged
    for path in results.find_runs(folder, require=("config.yaml",)):  # every run that started
        try:
            run = Run.load(path)
        except Exception:  # noqa: BLE001 - a half-written file counts as not started
            continue
        key = (run.method, str(run.seed))
        (done if run.finished else started).add(key)
        if not run.finished and (results.stopped(path) or {}).get("reason") == "diverged":
            diverged.add(key)
    return done, started - done, diverged - done


# ----------------------------------------------------------------------------- unfinished runs, elsewhere

RESUME_ARCHIVE = "resume.tar.gz"
# What a resume needs of a run folder beyond the files committed with it: outputs/reproductions'
# .gitignore keeps these out of git (a checkpoint is megabytes, rewritten every round), and a run
# goes on only from its checkpoint and the CSVs it recorded (output_layer.csv among them).  Not
# fedrun.log: a resume does without it, and it names the machine's folders.
RESUME_FILES = ("checkpoint.pt", "output_layer.csv")


def resumable_runs(out: Path) -> list[Path]:
    """The run folders under ``out`` that started and did not finish, nor diverge: what
    ``--resume`` goes on with."""
    runs = []
    for path in results.find_runs(out, require=("config.yaml",)) if out.is_dir() else []:
        if (path / "summary.json").is_file() or (results.stopped(path) or {}).get("reason") == "diverged":
            continue
        runs.append(Path(path))
    return sorted(runs)


def _members(archive: Path) -> dict[str, bytes]:
    """The files of a resume archive by their path below its folder; a member that is not a plain
    file of a run (a link, an absolute path, '..', another name) is refused, not unpacked."""
    with tarfile.open(archive, "r:gz") as tar:
        files = {}
        for m in tar.getmembers():
            path = PurePosixPath(m.name)
            if not m.isfile() or path.is_absolute() or ".." in path.parts or path.name not in RESUME_FILES:
                raise SystemExit(f"{archive}: member {m.name!r} is not one of a run's {', '.join(RESUME_FILES)}; "
                                 "nothing was unpacked (write the archive with `python scripts/common/grid.py pack`)")
            files[path.as_posix()] = tar.extractfile(m).read()
        return files


def pack_resume(out: Path) -> int:
    """Write ``out/resume.tar.gz``: the :data:`RESUME_FILES` of every run under ``out`` that can be
    resumed, so that ``out`` committed (checkpoints are not) goes on in another checkout with
    ``--resume`` (:func:`unpack_resume`).  A resumable run without a checkpoint here keeps what the
    archive held for it; runs that have finished or diverged since leave it.  No run left to resume:
    the archive is removed.  Written to a temporary file first, so a failure leaves the old one.
    Returns the number of runs packed."""
    out = Path(out).resolve()  # find_runs gives resolved run folders: resolved, a relative ``out`` is their prefix
    archive = out / RESUME_ARCHIVE
    old = _members(archive) if archive.is_file() else {}
    files: dict[str, bytes | Path] = {}
    for run in resumable_runs(out):
        rel = run.relative_to(out).as_posix()
        if (run / "checkpoint.pt").is_file():
            files.update({f"{rel}/{name}": run / name for name in RESUME_FILES if (run / name).is_file()})
        else:
            files.update({k: v for k, v in old.items() if PurePosixPath(k).parent.as_posix() == rel})
    runs = {PurePosixPath(k).parent for k in files}
    if not runs:
        archive.unlink(missing_ok=True)
        return 0
    tmp = archive.with_name(archive.name + ".partial")
    # mtime 0 and sorted members: the same files give the same bytes (no change for git to see)
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            data = files[name] if isinstance(files[name], bytes) else files[name].read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(archive)
    return len(runs)


def unpack_resume(out: Path) -> int:
    """Put back, from ``out/resume.tar.gz`` (:func:`pack_resume`), the files of every resumable run
    under ``out`` that has no checkpoint here (a fresh clone); a run with its own checkpoint keeps
    its files (they are newer).  Returns the number of runs restored."""
    out = Path(out).resolve()  # as pack_resume
    archive = out / RESUME_ARCHIVE
    if not archive.is_file():
        return 0
    files = _members(archive)
    restored = 0
    for run in resumable_runs(out):
        if (run / "checkpoint.pt").is_file():
            continue
        rel = run.relative_to(out).as_posix()
        mine = {PurePosixPath(k).name: v for k, v in files.items() if PurePosixPath(k).parent.as_posix() == rel}
        if "checkpoint.pt" not in mine:
            continue
        for name, data in mine.items():
            (run / name).write_bytes(data)
        restored += 1
    return restored


def say_unpacked(out: Path, restored: int) -> None:
    if restored:
        print(f"resume: {restored} run(s) take their checkpoint from {out / RESUME_ARCHIVE}", flush=True)


def say_packed(out: Path, packed: int) -> None:
    if packed:
        print(f"resume: {packed} unfinished run(s) packed into {out / RESUME_ARCHIVE} (their checkpoints, which "
              "git does not keep): commit it with the folder, and `run --resume` goes on with them anywhere",
              flush=True)


def seed_major(items: list, seeds: list[str], seed_of: Callable[[object], str]) -> list:
    """``items`` with seed 0's first, then seed 1's, ... (stable within a seed): the order runs are
    launched in one a sweep, so that a grid stopped early holds whole seeds of every method."""
    return sorted(items, key=lambda item: seeds.index(seed_of(item)))


# A grid's runs as sweeps, as one paper lays them out: ``plan(out, resume, jobs, dry_run)`` prints what
# it will run and what it leaves as it is, and returns the sweeps to launch (made as they are reached,
# in order) and ``missing()``, what did not finish, asked once they have ended (:func:`launch`).
Plan = Callable[[Path, bool, int, bool], tuple[Iterable[Sweep], Callable[[], list]]]


def launch(plan: Plan, out: Path, dry_run: bool, resume: bool = False, jobs: int = 1,
           stop_after: float | None = None) -> list:
    """Launch the sweeps of ``plan`` (:data:`Plan`) into ``out``: ``jobs`` at once
    (:func:`run_at_once`), stopped after ``stop_after`` minutes.  ``resume``: the runs that started
    but did not finish, and did not diverge, are to do as well (the plan adds ``resume=true``), each
    taking its checkpoint from ``OUT/resume.tar.gz`` where its folder has none
    (:func:`unpack_resume`); the runs left unfinished are packed into it afterwards for a later
    ``--resume`` elsewhere (:func:`pack_resume`).  A dry run prints each sweep's line, runs nothing
    and writes nothing.

    Returns the plan's ``missing()``: what did not finish (nothing after a dry run)."""
    if not dry_run:  # a dry run prints the commands and writes nothing
        (out / "logs").mkdir(parents=True, exist_ok=True)
        if resume:
            say_unpacked(out, unpack_resume(out))
    sweeps, missing = plan(out, resume, jobs, dry_run)
    if dry_run:
        for sweep in sweeps:
            print(sweep.line, flush=True)
        return []
    run_at_once(sweeps, jobs, stop_after)
    failures = missing()
    say_packed(out, pack_resume(out))
    return failures


def by_column(columns: list[str], command: Callable[[str, list[str], list[str]], list[str]],
              methods: list[str], seeds: list[str], population: bool = False) -> Plan:
    """The plan (:data:`Plan`) of a table whose columns are swept over methods x seeds into
    ``OUT/<column>/<method>_seed<seed>``: ``command(column, methods, seeds)`` for the runs of every
    column still to do, one sweep per column, or one per product of methods x seeds when the runs
    to do are not one.  Says how many runs there are and, as each finishes, how many are left and
    when the grid should end (:class:`Progress`).  Finished runs are skipped, and started ones
    unless resumed (a diverged one always).

    ``jobs`` > 1: every run is a sweep of its own (a product stays one sweep with ``population``,
    which trains its runs together), so that ``jobs`` of them run side by side, each logged to
    ``OUT/logs/<column>_<method>_seed<seed>.log``.

    ``missing()`` gives the (column, missing (method, seed) pairs) that did not finish.
    """
    def plan(out: Path, resume: bool, jobs: int, dry_run: bool) -> tuple[Iterable[Sweep], Callable[[], list]]:
        wanted = {(m, s) for m in methods for s in seeds}
        states = {column: cell_states(out / column) for column in columns}
        # What stays skipped in a column: the finished runs, and the started ones unless resumed (a diverged one always).
        kept = {column: done | (diverged if resume else started) for column, (done, started, diverged) in states.items()}
        split = jobs > 1 and not population  # one run a sweep, so that `jobs` of them run side by side

        def units(todo: list) -> list[tuple[list, list]]:
            return [([m], [s]) for m, s in seed_major(todo, seeds, lambda ms: ms[1])] if split else product_blocks(todo)

        progress = Progress(sum(len(wanted - k) for k in kept.values()), out, jobs=jobs if split else 1,
                            columns={column: len(wanted - k) for column, k in kept.items()})
        progress.announce(sum(len(units(sorted(wanted - k))) for k in kept.values()))
        seen = {column: set(states[column][0]) for column in columns}

        def report(column: str) -> None:
            for m, s in sorted(cell_state(out / column)[0] - seen[column]):
                seen[column].add((m, s))
                progress.done(f"{column}/{m}_seed{s}", run_seconds(out / column / f"{m}_seed{s}"))

        def sweeps():
            """The sweeps to launch, in column order; a column with nothing to do says why when reached."""
            for i, column in enumerate(columns, 1):
                done, started, diverged = states[column]
                todo = [(m, s) for m in methods for s in seeds if (m, s) not in kept[column]]
                if not todo:
                    left = len(wanted & diverged) if resume else len(wanted & started)
                    what = "diverged (not resumed)" if resume else "unfinished or failed (--resume continues them)"
                    print(f"[{i}/{len(columns)}] {column}: nothing to run ({len(wanted & done)} done, {left} {what}; "
                          "delete a run directory to redo it)", flush=True)
                    continue
                # What the column holds already: finished runs, runs left as they are, runs to go on from a checkpoint.
                held = [(len(wanted & done), "finished"),
                        (len(wanted & diverged), "diverged, not resumed") if resume else
                        (len(wanted & started), "unfinished, skipped"),
                        (len(wanted & (started - diverged)) if resume else 0, "to resume")]
                blocks = units(todo)
                for j, (todo_methods, todo_seeds) in enumerate(blocks, 1):
                    cmd = command(column, todo_methods, todo_seeds) + (["resume=true"] if resume else [])
                    part = f", sweep {j} of {len(blocks)}" if len(blocks) > 1 else ""
                    there = ", ".join(f"{k} {what}" for k, what in held if k)
                    there = f" ({there})" if there else ""
                    log = f"{column}_{todo_methods[0]}_seed{todo_seeds[0]}.log" if split else f"{column}.log"
                    before = cell_state(out / column)[0] if not dry_run else set()
                    own = {(m, s) for m in todo_methods for s in todo_seeds}  # not those of the sweeps beside it

                    def finish(rc: int, seconds: float, column=column, before=before, own=own,
                               log_path=out / "logs" / log):
                        after = cell_state(out / column)[0]
                        print(f"    exit {rc}, {len((after - before) & own)} run(s) finished in {seconds:.0f} s "
                              f"(log: {log_path})", flush=True)
                        if rc != 0:
                            print_errors(log_path, 4)

                    yield Sweep(f"[{i}/{len(columns)}] {column}{part}{there}: {shlex.join(cmd)}", cmd,
                                out / "logs" / log, lambda column=column: report(column), finish)

        def missing() -> list[tuple[str, list]]:
            if split:  # each one-run sweep wrote its folder's sweep_table.md with itself alone: the folder's runs instead
                for column in columns:
                    write_sweep_tables(out / column, every=True)
            failures = [(column, sorted(wanted - cell_state(out / column)[0])) for column in columns]
            return [(column, missing) for column, missing in failures if missing]

        return sweeps(), missing

    return plan


def run_sweeps(args, columns: list[str], command: Callable[[Path, str, list[str], list[str]], list[str]],
               banner: list[str], collect: Callable[[Path], object]) -> int:
    """A table script's ``run``: launch ``command(out, column, methods, seeds)`` per column (runs
    already in ``--out`` are skipped), then ``collect(out)``; the exit code (1 if a run is missing)."""
    out = Path(args.out)  # as given: a relative folder stays relative in the runs' records
    print_banner(banner, args.set)
    t_all = time.perf_counter()
    plan = by_column(columns, lambda column, methods, seeds: command(out, column, methods, seeds), args.methods,
                     seed_list(args.seeds), getattr(args, "population", False))
    failures = launch(plan, out, args.dry_run, getattr(args, "resume", False), getattr(args, "jobs", 1),
                      getattr(args, "stop_after", None))
    if args.dry_run:
        return 0
    print(f"\ngrid finished in {time.perf_counter() - t_all:.0f} s\n", flush=True)
    print_banner(banner, args.set)  # again, beside the table it qualifies
    print()
    collect(out)
    for column, missing in failures:
        print(f"FAILED or missing in {column}: {', '.join(f'{m} seed {s}' for m, s in missing)} "
              f"(see the logs in {out / 'logs'} and the run's fedrun.log)")
    return 1 if failures else 0


# ----------------------------------------------------------------------------- command line

def compress(out: Path) -> tuple[int, int, int]:
    """Gzip the per-client CSVs of every finished run under ``out`` (:func:`fedrun.results.compress_csvs`;
    runs not finished keep theirs, to be resumed).  Returns (runs, bytes before, bytes after)."""
    runs, before, after = 0, 0, 0
    for run in results.find_runs(out, require=results.FINISHED_FILES):
        sizes = {name: (run / name).stat().st_size for name in results.COMPRESSIBLE if (run / name).is_file()}
        written = results.compress_csvs(run)
        runs += bool(written)
        before += sum(sizes.values())
        after += sum(path.stat().st_size for path in written)
    return runs, before, after


def main(argv: list[str] | None = None) -> int:
    """``python scripts/common/grid.py pack|unpack|compress DIR...``: a grid's unfinished runs into, or back
    from, ``DIR/resume.tar.gz``, for runs launched by hand (the table scripts' ``run`` packs and,
    with ``--resume``, unpacks by itself); or its finished runs' per-client CSVs gzipped, before
    the folder is committed."""
    from fedrun.errors import ArgumentParser

    p = ArgumentParser(prog="grid.py", description=main.__doc__)
    p.add_argument("action", choices=("pack", "unpack", "compress"),
                   help="pack: the checkpoints (and output_layer.csv) of the runs under DIR that "
                        "can be resumed into DIR/resume.tar.gz; unpack: back into those of them that have none; "
                        "compress: clients.csv and client_layers.csv of the finished runs under DIR into "
                        ".csv.gz (fedrun.results and the scripts read either)")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="a grid's folder, searched recursively for run folders")
    args = p.parse_args(argv)
    for d in results.folders(args.dirs):
        if args.action == "compress":
            runs, before, after = compress(d)
            print(f"{d}: per-client CSVs of {runs} finished run(s) gzipped, {before / 2**20:.1f} MiB -> "
                  f"{after / 2**20:.1f} MiB" if runs else f"{d}: no finished run with a per-client CSV to gzip")
        elif args.action == "pack":
            n = pack_resume(d)
            print(f"{d}: {n} unfinished run(s) packed into {d / RESUME_ARCHIVE}" if n else
                  f"{d}: no run to resume (no {RESUME_ARCHIVE} kept)")
        else:
            print(f"{d}: {unpack_resume(d)} run(s) given their checkpoint back from {d / RESUME_ARCHIVE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
