"""Fair baselines as one command: tune a method's own setting on a validation split, then run the
chosen setting with several seeds on the test set.

A method is compared fairly with baselines whose key setting was chosen the way their authors
ask, on held-out training data, never on the test set, and with the same budget for every
method.  This script is that protocol for any method and setting:

1. **tune**: one run per grid point and tuning seed, with ``hyperparams.validation_fraction=F``
   (a share of the training images held out, the clients partitioned from the rest), into
   ``OUT/tune/<point>_seed<s>``.  Each run is scored by ``--objective``, a validation number
   (``mean_val_acc``: the mean validation accuracy over every evaluated round, the area under
   the curve; ``mean_val_acc_last_<n>``; ``final_val_acc``; ``best_val_acc``).
2. **pick**: the grid point with the highest mean score over the tuning seeds (a run that
   diverged scores -inf; ties go to the point listed first).  The scores and the choice are
   written to ``OUT/choice.json`` and printed.
3. **test**: the chosen point with ``--seeds`` on the whole training set (``validation_fraction``
   back to ``--final-validation``, 0 by default) and the test set, into ``OUT/test/<point>_seed<s>``.

Runs already finished in ``OUT`` are kept (a re-run resumes the protocol; delete a run folder to
redo it).  The budget is printed before anything runs: give every method the same grid size
and tuning seeds.  Example, FedProx's mu over its authors' grid on FedLap's FashionMNIST setting::

    python scripts/common/tune.py outputs/tune/fedprox_fmnist --grid aggregator.mu=0.001,0.01,0.1,0.5,1 \\
        --objective mean_val_acc --tune-seeds 0 --seeds 0,1,2 \\
        -- experiment=fedlap/fmnist aggregator=fedprox hyperparams.rounds=20

``python scripts/common/tune.py OUT --show`` prints the scores and the test runs of a finished protocol.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import shlex
import sys
import time
from pathlib import Path

if not __package__:  # python scripts/common/tune.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.common import grid
from fedrun import results
from fedrun.errors import FedrunError
from fedrun.results import Run

CHOICE = "choice.json"


def grid_axis(text: str) -> tuple[str, list[str]]:
    """``--grid KEY=V1,V2,...``: one setting and its values (at least two, none empty)."""
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",")]
    if not sep or not key or key.startswith("-") or len(items) < 2 or not all(items):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=V1,V2,... with at least two values, "
                                         "e.g. aggregator.mu=0.001,0.01,0.1")
    if len(set(items)) < len(items):
        raise argparse.ArgumentTypeError(f"{text!r}: a value is repeated")
    return key, items


def points(axes: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """Every grid point, the first axis slowest, in the order the values were given."""
    keys = [k for k, _ in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in axes))]


def point_name(point: dict[str, str]) -> str:
    """A folder name for a grid point: ``mu0.01`` (the key's last part and the value), joined by ``_``."""
    return "_".join(f"{key.rsplit('.', 1)[-1]}{value}" for key, value in point.items())


def overrides(point: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in point.items()]


def run_one(folder: Path, args: list[str], log: Path) -> int:
    """One fedrun into ``folder``, its output appended to ``log``; the exit code."""
    cmd = [*grid.fedrun_command(), *args, "progress=false", f"hydra.run.dir={folder}"]
    print(f"    {shlex.join(cmd)}", flush=True)
    rc, _ = grid.run_logged(cmd, log)
    return rc


def state(folder: Path) -> str:
    """``done``, ``stopped`` (diverged or failed with a reason in run.json), ``partial`` or ``missing``."""
    if (folder / "summary.json").is_file():
        return "done"
    if results.stopped(folder) is not None:
        return "stopped"
    return "partial" if (folder / "config.yaml").is_file() else "missing"


def execute(jobs: list[tuple[Path, list[str]]], out: Path, dry_run: bool) -> None:
    """Run the jobs whose folder holds no finished or stopped run, with a line per finished run and an ETA."""
    todo = [(folder, args) for folder, args in jobs if state(folder) in ("missing", "partial")]
    progress = grid.Progress(len(todo), out)
    progress.announce()
    if dry_run:
        for folder, args in todo:
            print(f"    {shlex.join([*grid.fedrun_command(), *args, 'progress=false', f'hydra.run.dir={folder}'])}")
        return
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for folder, args in todo:
        rc = run_one(folder, args, out / "logs" / f"{folder.parent.name}.log")
        how = state(folder)
        if rc != 0 and how != "stopped":
            grid.print_errors(out / "logs" / f"{folder.parent.name}.log", 4)
        progress.done(f"{folder.parent.name}/{folder.name}" + ("" if how == "done" else f" ({how})"),
                      grid.run_seconds(folder))


def score(folder: Path, objective: str) -> float | None:
    """A tuning run's objective: -inf for a run that diverged, None for one not finished."""
    if state(folder) == "stopped":
        return -math.inf
    if state(folder) != "done":
        return None
    value = results.objective(results.read_summary(folder), folder, objective)
    return -math.inf if not math.isfinite(value) else value


def pick(axes, tune_seeds: list[str], out: Path, objective: str) -> dict:
    """The scores of every grid point and the chosen one, as written to ``OUT/choice.json``."""
    rows = []
    for point in points(axes):
        values = [score(out / "tune" / f"{point_name(point)}_seed{s}", objective) for s in tune_seeds]
        complete = all(v is not None for v in values)
        rows.append({"point": point, "scores": values,
                     "mean": (sum(values) / len(values)) if complete else None})
    scored = [r for r in rows if r["mean"] is not None]
    chosen = max(scored, key=lambda r: r["mean"]) if len(scored) == len(rows) else None  # first of ties
    return {"objective": objective, "grid": {k: v for k, v in axes}, "tune_seeds": tune_seeds,
            "rows": rows, "chosen": chosen["point"] if chosen else None}


def _pct(value) -> str:
    if value is None:
        return "-"
    return "diverged" if value == -math.inf else f"{100 * value:.2f}"


def show(choice: dict, out: Path, seeds: list[str]) -> None:
    """The tuning table (each seed's score and their mean, the choice marked) and the test runs."""
    objective = choice["objective"]
    grid_text = "; ".join(f"{k} in {{{', '.join(v)}}}" for k, v in choice["grid"].items())
    print(f"tuned {grid_text} by {objective} (%), tuning seeds {', '.join(choice['tune_seeds'])}:")
    for row in choice["rows"]:
        mark = "  <- chosen" if row["point"] == choice["chosen"] else ""
        each = ", ".join(_pct(v) for v in row["scores"])
        print(f"  {' '.join(overrides(row['point'])):<40} {_pct(row['mean']):>9}  [{each}]{mark}")
    if choice["chosen"] is None:
        print("no choice yet: a tuning run is missing")
        return
    name = point_name(choice["chosen"])
    print(f"test runs of {' '.join(overrides(choice['chosen']))} (test accuracy, %):")
    for s in seeds:
        folder = out / "test" / f"{name}_seed{s}"
        how = state(folder)
        if how == "done":
            run = Run.load(folder)
            rounds = run.rounds()
            mean = rounds["test_acc"].dropna().mean() if rounds is not None else float("nan")
            print(f"  seed {s}: final {100 * run.accuracy('final'):.2f}, best {100 * run.accuracy('best'):.2f}, "
                  f"mean over rounds {100 * mean:.2f}  ({folder})")
        else:
            print(f"  seed {s}: {results.stop_note(folder) or how}  ({folder})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s OUT --grid KEY=V1,V2,... [options] -- FEDRUN_OVERRIDES...",
                                     epilog="Overrides after -- apply to every run (the method and setting).")
    parser.add_argument("out", help="the protocol's folder: OUT/tune, OUT/test, OUT/choice.json")
    parser.add_argument("--grid", type=grid_axis, action="append", default=[], metavar="KEY=V1,V2,...",
                        help="a setting and the values to try; repeat for a product of settings")
    parser.add_argument("--objective", default="mean_val_acc",
                        help="the validation number to maximize (default mean_val_acc: the mean over every "
                             "evaluated round; or mean_val_acc_last_<n>, final_val_acc, best_val_acc)")
    parser.add_argument("--validation-fraction", type=float, default=0.1,
                        help="share of the training images held out while tuning (default 0.1)")
    parser.add_argument("--final-validation", type=float, default=0.0,
                        help="validation_fraction of the test runs (default 0: train on the whole training set)")
    parser.add_argument("--tune-seeds", type=grid.seeds, default="0", help="seeds of the tuning runs (default 0)")
    parser.add_argument("--seeds", type=grid.seeds, default="0,1,2", help="seeds of the test runs (default 0,1,2)")
    parser.add_argument("--dry-run", action="store_true", help="print the fedrun commands, run nothing")
    parser.add_argument("--show", action="store_true", help="print OUT's scores and test runs, run nothing")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.base = argv[cut + 1:]  # fedrun overrides for every run
    out = Path(args.out)
    tune_seeds, seeds = grid.seed_list(args.tune_seeds), grid.seed_list(args.seeds)
    if args.show:
        if not (out / CHOICE).is_file():
            sys.exit(f"tune.py: {out / CHOICE} not found: run the protocol into {out} first")
        show(json.loads((out / CHOICE).read_text()), out, seeds)
        return 0
    if not args.grid:
        parser.error("--grid: give at least one KEY=V1,V2,... to tune")
    if not ("_val_acc" in args.objective):
        parser.error(f"--objective {args.objective}: tune on a validation number (mean_val_acc, "
                     "mean_val_acc_last_<n>, final_val_acc, best_val_acc), never on the test set")
    try:
        results.check_objective(args.objective)
    except FedrunError as e:
        parser.error(str(e))
    if not 0 < args.validation_fraction < 1:
        parser.error(f"--validation-fraction {args.validation_fraction}: must be in (0, 1)")
    if not 0 <= args.final_validation < 1:
        parser.error(f"--final-validation {args.final_validation}: must be in [0, 1)")
    tuned_keys = {k for k, _ in args.grid}
    clash = [o for o in args.base if o.split("=", 1)[0].lstrip("+~") in tuned_keys | {"seed"}
             or o.split("=", 1)[0] in ("hyperparams.validation_fraction", "hydra.run.dir", "objective")]
    if clash:
        parser.error(f"{' '.join(clash)}: the protocol sets these itself (the grid, seeds, the split, the folders)")

    grid_points = points(args.grid)
    budget = len(grid_points) * len(tune_seeds)
    print(f"budget: {len(grid_points)} grid point(s) x {len(tune_seeds)} tuning seed(s) = {budget} tuning run(s), "
          f"then {len(seeds)} test run(s); base: {' '.join(args.base) or '(defaults)'}", flush=True)
    t0 = time.perf_counter()
    print("[1/3] tune, on a validation split of "
          f"{args.validation_fraction:g} of the training images:", flush=True)
    execute([(out / "tune" / f"{point_name(p)}_seed{s}",
              [*args.base, *overrides(p), f"seed={s}", f"hyperparams.validation_fraction={args.validation_fraction}",
               f"objective={args.objective}"]) for p in grid_points for s in tune_seeds], out, args.dry_run)
    if args.dry_run:
        print("[2/3] pick the grid point with the highest mean objective\n[3/3] test runs follow the choice")
        return 0
    choice = pick(args.grid, tune_seeds, out, args.objective)
    choice.update({"validation_fraction": args.validation_fraction, "final_validation": args.final_validation,
                   "base": args.base})
    (out / CHOICE).write_text(json.dumps(choice, indent=2, default=str) + "\n")
    print("[2/3] pick:", flush=True)
    if choice["chosen"] is None:
        show(choice, out, seeds)
        return 1
    print(f"    chosen: {' '.join(overrides(choice['chosen']))} (from {len(grid_points)} point(s))", flush=True)
    print("[3/3] test runs of the chosen setting on the whole training set:", flush=True)
    execute([(out / "test" / f"{point_name(choice['chosen'])}_seed{s}",
              [*args.base, *overrides(choice["chosen"]), f"seed={s}",
               f"hyperparams.validation_fraction={args.final_validation}"]) for s in seeds], out, False)
    print(f"\nprotocol finished in {time.perf_counter() - t0:.0f} s\n")
    show(choice, out, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
