"""Launching a paper's grid of fedrun runs as ``fedrun -m`` sweeps, shared by the table scripts' ``run`` modes.

Every table script's ``run`` launches its missing runs as sweeps, so that ``--population`` (which
adds ``hydra/launcher=population``, see docs/sweeps.md) trains the runs of a sweep that share a
dataset and model together, and any other Hydra launcher can be named with ``--set``.  A sweep is
a product of values: a *column* of FedNNNN's or FedLayerWise's table (a condition, a scenario) is
swept over methods x seeds into ``OUT/<column>/<method>_seed<seed>`` (:func:`run_sweeps`); the
parameter-divergence study sweeps networks x seeds (``pd_tables.py``).  ``hydra.sweep.dir`` and
``hydra.sweep.subdir`` give every run the folder it has always had, so ``collect`` and earlier
outputs read the same.  Runs already finished are skipped: the runs still to do are split into
products (:func:`product_blocks`), one sweep each; what is still missing afterwards is reported.
A run that started but did not finish (Ctrl-C, a kill, a time limit) is skipped too, unless
``--resume``: then it goes on from its last checkpoint (``resume=true``); a run that diverged is
never resumed (it would diverge again at the same round).

fedrun runs in the caller's working directory, as a ``fedrun`` typed there would (datasets are
looked for under its ``data/`` unless ``FEDRUN_DATA`` or ``data_root`` say otherwise).
"""
from __future__ import annotations

import argparse
import importlib.util
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Hashable, Iterable

from fedrun import results
from fedrun.paths import conf_options
from fedrun.results import Run

SUBDIR = "hydra.sweep.subdir=${hydra:runtime.choices.aggregator}_seed${seed}"
POPULATION = "hydra/launcher=population"


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
               every: float = 5.0) -> tuple[int, float]:
    """Run ``cmd``, appending its output to ``log_path``; ``poll()`` every ``every`` seconds while it
    runs and once after (to report the runs it finished): ``(exit code, seconds)``."""
    t0 = time.perf_counter()
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                rc = proc.wait(timeout=every)
                break
            except subprocess.TimeoutExpired:
                poll()
    poll()
    return rc, time.perf_counter() - t0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else \
        f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def run_seconds(run: Path) -> float | None:
    """A finished run's wall time, from its summary's start and end (None if it says neither)."""
    from datetime import datetime

    summary = results.read_summary(run)
    try:
        return (datetime.fromisoformat(summary["finished"]) - datetime.fromisoformat(summary["started"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


class Progress:
    """What a long grid says while it runs: the runs to do and a rough time before it starts (from
    the runs already finished in its folder, when there are some), then a line per finished run
    with what is left and an ETA at the mean time of the runs finished so far."""

    def __init__(self, total: int, out: Path, clock: Callable[[], float] = time.perf_counter):
        self.total, self.finished, self.clock = total, 0, clock
        self.start = clock()
        earlier = [t for t in (run_seconds(r) for r in results.find_runs(out, require=results.FINISHED_FILES))
                   if t is not None] if out.is_dir() else []
        self.typical = sum(earlier) / len(earlier) if earlier else None
        self.earlier = len(earlier)

    def announce(self, sweeps: int | None = None) -> None:
        guess = (f"about {_duration(self.typical)} a run, from the {self.earlier} run(s) already in the folder: "
                 f"about {_duration(self.typical * self.total)} in all, one after another"
                 if self.typical is not None else "time: an ETA follows each finished run")
        where = f" in {sweeps} sweep(s)" if sweeps is not None else ""
        print(f"{self.total} run(s) to do{where}; {guess}", flush=True)

    def done(self, name: str, seconds: float | None) -> None:
        self.finished += 1
        left = self.total - self.finished
        # The mean wall time per finished run, as this grid ran them (a population finishes several at once).
        pace = (self.clock() - self.start) / self.finished
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


def launch(columns: list[str], command: Callable[[str, list[str], list[str]], list[str]],
           methods: list[str], seeds: list[str], out: Path, dry_run: bool,
           resume: bool = False) -> list[tuple[str, list]]:
    """Run ``command(column, methods, seeds)`` for the runs of every column still to do: one
    sweep per column, or one per product of methods x seeds when the runs to do are not one.
    Says how many runs there are and, as each finishes, how many are left and when the grid
    should end (:class:`Progress`).  ``resume``: the runs that started but did not finish, and did
    not diverge, are to do as well, every sweep with ``resume=true`` (a new run starts at round 1,
    an unfinished one goes on from its checkpoint).

    Returns the (column, missing (method, seed) pairs) that did not finish.
    """
    if not dry_run:  # a dry run prints the commands and writes nothing
        (out / "logs").mkdir(parents=True, exist_ok=True)
    wanted = {(m, s) for m in methods for s in seeds}
    states = {column: cell_states(out / column) for column in columns}
    # What stays skipped in a column: the finished runs, and the started ones unless resumed (a diverged one always).
    kept = {column: done | (diverged if resume else started) for column, (done, started, diverged) in states.items()}
    progress = Progress(sum(len(wanted - k) for k in kept.values()), out)
    progress.announce(sum(len(product_blocks(sorted(wanted - k))) for k in kept.values()))
    failures = []
    for i, column in enumerate(columns, 1):
        done, started, diverged = states[column]
        todo = [(m, s) for m in methods for s in seeds if (m, s) not in kept[column]]
        if not todo:
            left = len(wanted & diverged) if resume else len(wanted & started)
            what = "diverged (not resumed)" if resume else "unfinished or failed (--resume continues them)"
            print(f"[{i}/{len(columns)}] {column}: nothing to run ({len(wanted & done)} done, {left} {what}; "
                  "delete a run directory to redo it)", flush=True)
        else:
            skip = len(wanted & kept[column])
            resumed = len(wanted & (started - diverged)) if resume else 0
            blocks = product_blocks(todo)
            log_path = out / "logs" / f"{column}.log"
            for j, (todo_methods, todo_seeds) in enumerate(blocks, 1):
                cmd = command(column, todo_methods, todo_seeds) + (["resume=true"] if resume else [])
                part = f", sweep {j} of {len(blocks)}" if len(blocks) > 1 else ""
                there = (f" ({skip} run(s) already there" + (f", {resumed} to resume" if resumed else "") + ")"
                         if skip or resumed else "")
                print(f"[{i}/{len(columns)}] {column}{part}{there}: {shlex.join(cmd)}", flush=True)
                if not dry_run:
                    before = cell_state(out / column)[0]
                    seen = set(before)

                    def report(column=column, seen=seen):
                        for m, s in sorted(cell_state(out / column)[0] - seen):
                            seen.add((m, s))
                            name = f"{column}/{m}_seed{s}"
                            progress.done(name, run_seconds(out / column / f"{m}_seed{s}"))

                    rc, seconds = run_logged(cmd, log_path, report)
                    after, _ = cell_state(out / column)
                    print(f"    exit {rc}, {len(after - before)} run(s) finished in {seconds:.0f} s "
                          f"(log: {log_path})", flush=True)
                    if rc != 0:
                        print_errors(log_path, 4)
        if not dry_run:
            missing = sorted(wanted - cell_state(out / column)[0])
            if missing:
                failures.append((column, missing))
    return failures


def run_sweeps(args, columns: list[str], command: Callable[[Path, str, list[str], list[str]], list[str]],
               banner: list[str], collect: Callable[[Path], object]) -> int:
    """A table script's ``run``: launch ``command(out, column, methods, seeds)`` per column (runs
    already in ``--out`` are skipped), then ``collect(out)``; the exit code (1 if a run is missing)."""
    out = Path(args.out)  # as given: a relative folder stays relative in the runs' records
    print_banner(banner, args.set)
    t_all = time.perf_counter()
    failures = launch(columns, lambda column, methods, seeds: command(out, column, methods, seeds),
                      args.methods, seed_list(args.seeds), out, args.dry_run, getattr(args, "resume", False))
    if args.dry_run:
        return 0
    print(f"\ngrid finished in {time.perf_counter() - t_all:.0f} s\n", flush=True)
    print_banner(banner, args.set)  # again, beside the table it qualifies
    print()
    collect(out)
    for column, missing in failures:
        print(f"FAILED or missing in {column}: {', '.join(f'{m} seed {s}' for m, s in missing)} "
              f"(see {out / 'logs' / (column + '.log')} and the run's fedrun.log)")
    return 1 if failures else 0
