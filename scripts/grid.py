"""Launching a paper's grid of fedrun sweeps, shared by the table scripts' ``run`` modes.

A *column* of a paper's table (a FedNNNN condition, a FedLayerWise scenario) is one
``fedrun -m`` call over methods and seeds into ``OUT/<column>/<method>_seed<seed>``; runs already
finished there are skipped, and what is still missing after the call is reported.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from runs import Run, missing_dirs

REPO = Path(__file__).resolve().parents[1]
SUBDIR = "hydra.sweep.subdir=${hydra:runtime.choices.aggregator}_seed${seed}"


def fedrun_command() -> list[str]:
    """How to call fedrun: this interpreter's ``-m fedrun`` when importable, else ``fedrun`` on PATH."""
    if importlib.util.find_spec("fedrun") is not None:
        return [sys.executable, "-m", "fedrun"]
    exe = shutil.which("fedrun")
    if exe is None:
        sys.exit("fedrun is neither importable nor on PATH; activate its environment")
    return [exe]


def cell_state(folder: Path) -> tuple[set, set]:
    """(done, started-but-unfinished) (method, seed) pairs among the run directories in ``folder``."""
    done, started = set(), set()
    if not folder.is_dir():
        return done, started
    for cfg in folder.rglob("config.yaml"):
        try:
            run = Run.load(cfg.parent)
        except Exception:  # noqa: BLE001 - a half-written file counts as not started
            continue
        (done if run.finished else started).add((run.method, str(run.seed)))
    return done, started - done


def launch(columns: list[str], command: Callable[[str, list[str], list[str]], list[str]],
           methods: list[str], seeds: list[str], out: Path, dry_run: bool) -> list[tuple[str, list]]:
    """Run ``command(column, methods, seeds)`` for every column with runs still to do.

    Returns the (column, missing (method, seed) pairs) that did not finish.
    """
    (out / "logs").mkdir(parents=True, exist_ok=True)
    failures = []
    for i, column in enumerate(columns, 1):
        wanted = {(m, s) for m in methods for s in seeds}
        done, started = cell_state(out / column)
        todo = wanted - done - started
        if not todo:
            print(f"[{i}/{len(columns)}] {column}: nothing to run ({len(wanted & done)} done, "
                  f"{len(wanted & started)} unfinished or failed: delete a run directory to redo it)", flush=True)
        else:
            todo_seeds = sorted({s for _, s in todo})
            todo_methods = [m for m in methods if any((m, s) in todo for s in todo_seeds)]
            cmd = command(column, todo_methods, todo_seeds)
            skip = len(wanted & (done | started))
            print(f"[{i}/{len(columns)}] {column}{f' ({skip} run(s) already there)' if skip else ''}: "
                  f"{shlex.join(cmd)}", flush=True)
            if not dry_run:
                log_path = out / "logs" / f"{column}.log"
                t0 = time.perf_counter()
                with open(log_path, "a") as log:
                    rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
                after, _ = cell_state(out / column)
                print(f"    exit {rc}, {len(after - done)} run(s) finished in {time.perf_counter() - t0:.0f} s "
                      f"(log: {log_path})", flush=True)
                if rc != 0:
                    errors = [line for line in log_path.read_text().splitlines() if "error" in line.lower()]
                    print("    " + "\n    ".join(errors[-4:]), flush=True)
        if not dry_run:
            missing = sorted(wanted - cell_state(out / column)[0])
            if missing:
                failures.append((column, missing))
    return failures


def report_failures(failures: list[tuple[str, list]], out: Path) -> int:
    for column, missing in failures:
        print(f"FAILED or missing in {column}: {', '.join(f'{m} seed {s}' for m, s in missing)} "
              f"(see {out / 'logs' / (column + '.log')} and the run's fedrun.log)")
    return 1 if failures else 0


def write_csv(rows: list[dict], path: Path, columns: list[str], float_format: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r[k] is None else (format(r[k], float_format) if isinstance(r[k], float)
                                                         else r[k])) for k in columns})


def dataset_substitute(text: str, allowed: tuple[str, ...]) -> tuple[str, str]:
    """Parse ``DATASET=OPTION`` for ``--substitute``: DATASET in ``allowed``, OPTION a conf/dataset file."""
    real, sep, option = text.partition("=")
    if not sep or real not in allowed or not option:
        raise argparse.ArgumentTypeError(f"expected DATASET=OPTION with DATASET in {allowed}, got {text!r}")
    if not (REPO / "conf" / "dataset" / f"{option}.yaml").is_file():
        options = sorted(p.stem for p in (REPO / "conf" / "dataset").glob("*.yaml"))
        raise argparse.ArgumentTypeError(f"unknown dataset option {option!r}; choose one of {options}")
    return real, option


def table_parser(prog: str, doc: str, table: str, csv_name: str, layout: str,
                 run_description: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser,
                                                 argparse.ArgumentParser]:
    """The command line every table script shares: ``collect DIR...`` and ``run --out OUT``.

    Returns ``(parser, collect, run)``; the script adds its own options to the two modes.
    ``layout``: where ``run`` puts each run below OUT.
    """
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("collect", help=f"print {table} from existing run directories",
                       description=f"Find run directories under DIRs and print {table} (ours vs paper).")
    c.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for run directories")
    c.add_argument("--csv", default=None,
                   help=f"long-form CSV to write (default: DIR/{csv_name} for the first DIR, or beside it when "
                        "DIR is itself a run directory; '' to write none)")
    r = sub.add_parser("run", help="launch the missing runs with fedrun, then collect", description=run_description)
    r.add_argument("--out", required=True, help=f"output folder: runs go to OUT/{layout}")
    add_launch_arguments(r, csv_name)
    return p, c, r


def table_main(args: argparse.Namespace, run_grid: Callable[[argparse.Namespace], int],
               collect: Callable[[argparse.Namespace, str | None], object], csv_name: str, prog: str) -> int:
    """Dispatch a table script's mode: ``run`` launches the grid; ``collect`` checks the DIRs
    and calls ``collect(args, csv_path)`` (csv_path None: write no CSV).  The exit code."""
    if args.mode == "run":
        return run_grid(args)
    if missing_dirs(args.dirs, prog):
        return 2
    csv_path = default_csv(args.dirs, csv_name) if args.csv is None else args.csv
    collect(args, csv_path or None)
    return 0


def add_launch_arguments(r: argparse.ArgumentParser, csv_name: str) -> None:
    """The options every ``run`` mode shares."""
    r.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2 (default 0)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra fedrun override for every run, e.g. --set device=cuda; repeatable. One value "
                        "each, not a sweep (runs are named <method>_seed<seed>)")
    r.add_argument("--csv", default=None, help=f"long-form CSV (default OUT/{csv_name}; '' for none)")
    r.add_argument("--dry-run", action="store_true", help="print the fedrun commands, run nothing")


def default_csv(dirs: list[str], name: str) -> str:
    """``collect``'s CSV: beside the runs (in DIR, or beside DIR when DIR is itself a run)."""
    first = Path(dirs[0])
    is_run = (first / "summary.json").is_file() and (first / "config.yaml").is_file()
    return str((first.parent if is_run else first) / name)
