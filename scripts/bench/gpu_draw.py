#!/usr/bin/env python
"""One GPU draw, fully used: what a 15-minute loan of one GPU must bring back, in at most 9
minutes on one NVIDIA H100.  Run it through ``bash scripts/bench/gpu_check.sh draw``, which first
checks the data and installs hydra-core/omegaconf from the carried wheels (its header gives the
preparation and the one device call).

Steps, in the order of what matters most.  Each runs under its own time limit, so a slow or failing
step never costs the ones after it, and each writes what it learned before the next one starts:

``cuda``     tests/test_cuda.py (and augmentation's CUDA test): the engines on CUDA equal each other
             and the CPU within the bounds the tests document, auto chunking from real free memory,
             TF32/bf16 bounds, a population on CUDA, one whole CLI run.
``preset``   FedNNNN's MNIST preset at its own scale (``experiment=fednnnn/mnist_noniid_ub``:
             K = 100, C = 1, E = 5, B = 50, 100 rounds; ``aggregator=fednnnn``) on the whole MNIST with
             ``engine=auto``: wall time from process start to exit, train / eval / bookkeeping seconds
             per round, final and best test accuracy beside Table 2's.
``engines``  the same workload for 3 rounds on ``engine=batched`` and ``engine=sequential``: the ratio
             of their training seconds per round (rounds 2-3: round 1 warms up), and their largest
             test-accuracy difference (the engines are equal up to rounding).
``column``   that preset's Table 2 column (FedAvg, FedProx, Norm-Norm, Momentum, FedNNNN) as one
             population (``hydra/launcher=population``), 100 rounds, in the time left: each method's
             final and best accuracy beside the paper's, and the rounds reached if time ran out.

What comes back, under ``--out`` ($OUT on the device), four files, rewritten after every step:
``draw.log`` (every step's whole output), ``figures.csv`` (one row a figure: step, figure, value,
unit, target, note), ``report.md`` (the device and the figures beside the targets and the paper;
also printed at the end) and ``runs.tar.gz`` (every run folder without checkpoints and model files).
The run folders themselves are written under ``--work`` (default: a fresh folder in $TMPDIR).

``--size tiny`` (``GPU_CHECK_SIZE=tiny``) adds ``scale=tiny`` to every run and shrinks the column
to 3 rounds: the CPU check of the whole script (``GPU_CHECK_DEVICE=cpu``; tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAPER_CSV = ROOT / "scripts" / "paper_targets" / "fednnnn_table2_accuracy.csv"

PRESET = "fednnnn/mnist_noniid_ub"
CELL = ("mnist", "noniid-ub")  # Table 2's column of the preset: (dataset, condition)
METHODS = ("fedavg", "fedprox", "normnorm", "momentum", "fednnnn")
STEPS = ("cuda", "preset", "engines", "column")
# Each step's time limit (seconds).  The first three sum to 390, leaving the column at least 150 s
# of a 540 s budget; time a step does not use goes to the column.
LIMITS = {"cuda": 150, "preset": 150, "engines": 90}
RESERVE = 20  # seconds kept back at the end for the report and the archive
# The targets of docs/performance.md: the FedNNNN MNIST run in 60 s (ambition 15 s) on one H100,
# the batched engine 10x the sequential one, bookkeeping under 10% of a round.
TARGET_RUN_S, AMBITION_RUN_S, TARGET_RATIO, TARGET_BOOKKEEPING = 60, 15, 10, 0.10
SKIP_IN_ARCHIVE = ("checkpoint.pt", "output_layer.csv", "models")
# A file comes back from the device only up to 16 MiB: past 15, the per-client CSVs stay behind.
PER_CLIENT = ("clients.csv", "client_layers.csv")
MAX_ARCHIVE = 15 * 2**20
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")


@dataclass
class Draw:
    """The state of one draw: where things go, the clock, and the figures learned so far."""

    out: Path
    work: Path
    device: str
    data: Path
    size: str
    budget: float
    python: str = sys.executable
    start: float = field(default_factory=time.monotonic)
    figures: list[dict] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def log(self, text: str, echo: bool = True) -> None:
        with open(self.out / "draw.log", "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        if echo:
            print(text, flush=True)

    def figure(self, step: str, name: str, value, unit: str = "", target="", note: str = "") -> None:
        if isinstance(value, float):
            value = round(value, 4)
        self.figures.append(dict(step=step, figure=name, value=value, unit=unit, target=target, note=note))

    def fedrun(self, *overrides: str, sweep: bool = False) -> list[str]:
        """``python -m fedrun [-m]`` on the carried MNIST, never downloading, at the draw's size."""
        size = ["scale=tiny"] if self.size == "tiny" else []
        return [self.python, "-m", "fedrun", *(["-m"] if sweep else []), f"device={self.device}", "progress=false",
                f"dataset.load.search=[{self.data}]", "dataset.load.download=false",
                f"data_root={self.work / 'no-data-root'}", *size, *overrides]


# ----------------------------------------------------------------------------- running a step

def run_command(draw: Draw, step: str, command: list[str], limit: float) -> tuple[str, float]:
    """Run ``command`` in the repository root with its output appended to draw.log, killed (its whole
    process group: SIGTERM, then SIGKILL) after ``limit`` seconds.  Returns ("ok" | "failed (exit N)" |
    "timed out after N s", wall seconds from start to exit)."""
    draw.log(f"$ {shlex.join(command)}   # limit {limit:.0f} s", echo=False)
    started = time.monotonic()
    with open(draw.out / "draw.log", "a") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = proc.wait(timeout=max(limit, 1))
        except subprocess.TimeoutExpired:
            _stop(proc)
            return f"timed out after {limit:.0f} s", time.monotonic() - started
    wall = time.monotonic() - started
    return ("ok" if rc == 0 else f"failed (exit {rc})"), wall


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (fedrun closes its run files on it), SIGKILL after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def rounds_of(run_dir: Path):
    """rounds.csv of a run folder (None when absent or empty); read with pandas (the device has it)."""
    import pandas as pd

    path = run_dir / "rounds.csv"
    if not path.is_file() or path.stat().st_size == 0:
        return None
    text = path.read_text(errors="replace")
    text = text[: text.rfind("\n") + 1]  # a run killed at its time limit may have cut its last row
    frame = pd.read_csv(io.StringIO(text)) if text.count("\n") > 1 else None
    return frame if frame is not None and len(frame) else None


def engine_of(run_dir: Path) -> str:
    """The engine a run used, from its log line 'run directory ... (engine: NAME)'."""
    log = run_dir / "fedrun.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = re.findall(r"\(engine: (\w+)\)", text)
    return found[-1] if found else "unknown"


def paper_accuracy(method: str) -> float | None:
    with open(PAPER_CSV) as f:
        for row in csv.DictReader(f):
            if (row["method"], row["dataset"], row["condition"]) == (method, *CELL):
                return float(row["accuracy_pct"])
    return None


def accuracy_figures(draw: Draw, step: str, method: str, rounds, planned: int, prefix: str = "") -> None:
    """Final and best test accuracy of a run (at the last round reached) beside Table 2's number."""
    paper = paper_accuracy(method)
    done = int(rounds["round"].iloc[-1])
    cut = "" if done >= planned else f"only {done} of {planned} rounds reached"
    acc = rounds["test_acc"].dropna()
    if acc.empty:
        draw.figure(step, f"{prefix}final_acc_pct", "", "%", "", "no round evaluated")
        return
    final, best = 100 * acc.iloc[-1], 100 * acc.max()
    best_round = int(rounds.loc[acc.idxmax(), "round"])
    paper_note = f"Table 2: {paper}" if paper is not None else ""
    draw.figure(step, f"{prefix}rounds_done", done, "rounds", planned, cut)
    draw.figure(step, f"{prefix}final_acc_pct", final, "%", paper if paper is not None else "",
                "; ".join(n for n in (paper_note, cut) if n))
    draw.figure(step, f"{prefix}best_acc_pct", best, "%", paper if paper is not None else "",
                f"round {best_round}")


def timing_figures(draw: Draw, step: str, rounds, prefix: str = "") -> None:
    """Seconds per round spent training, evaluating and on everything else (aggregation,
    diagnostics, CSV rows, checkpoint): rounds 2 on (round 1 warms up kernels and caches)."""
    steady = rounds.iloc[1:] if len(rounds) > 1 else rounds
    wall, train, ev = steady["wall_s"].mean(), steady["train_s"].mean(), steady["eval_s"].mean()
    rest = wall - train - ev
    span = f"rounds {int(steady['round'].iloc[0])}-{int(steady['round'].iloc[-1])}"
    draw.figure(step, f"{prefix}round_s", wall, "s", "", span)
    draw.figure(step, f"{prefix}train_s_per_round", train, "s", "", span)
    draw.figure(step, f"{prefix}eval_s_per_round", ev, "s", "", span)
    draw.figure(step, f"{prefix}bookkeeping_s_per_round", rest, "s", "", span + ": wall - train - eval")
    draw.figure(step, f"{prefix}bookkeeping_share", rest / wall if wall else float("nan"), "fraction",
                TARGET_BOOKKEEPING, span)


# ----------------------------------------------------------------------------- the steps

def step_cuda(draw: Draw, limit: float) -> str:
    xml = draw.work / "cuda_tests.xml"
    # Four pytest workers where pytest-xdist is installed (the GPU machine has 16 cores): the
    # population and CLI tests start processes of their own and wait on them.
    workers = ["-n", "4"] if draw.device != "cpu" and importlib.util.find_spec("xdist") else []
    command = [draw.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *workers,
               f"--junitxml={xml}", "tests/test_cuda.py", "tests/test_augment.py::test_cuda_matches_cpu"]
    status, wall = run_command(draw, "cuda", command, limit)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed = []
    if xml.is_file():
        for case in ET.parse(xml).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            kind = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            counts[kind] += 1
            if kind == "failed":
                failed.append(case.get("name", "?"))
    for kind, n in counts.items():
        draw.figure("cuda", f"tests_{kind}", n, "tests", "" if kind != "failed" else 0,
                    ", ".join(failed) if kind == "failed" else "")
    draw.figure("cuda", "wall_s", wall, "s")
    if status == "ok" and counts["skipped"] and not counts["passed"] and draw.device != "cpu":
        status = "failed (every CUDA test skipped: torch sees no GPU)"
    return status


def step_preset(draw: Draw, limit: float) -> str:
    run_dir = draw.work / "preset"
    status, wall = run_command(draw, "preset", draw.fedrun(
        f"experiment={PRESET}", "aggregator=fednnnn", "engine=auto", f"hydra.run.dir={run_dir}"), limit)
    rounds = rounds_of(run_dir)
    planned = 3 if draw.size == "tiny" else 100
    draw.figure("preset", "wall_s", wall, "s", TARGET_RUN_S,
                f"process start to exit; ambition {AMBITION_RUN_S} s")
    draw.figure("preset", "engine", engine_of(run_dir), "", "BatchedEngine" if draw.device != "cpu" else "")
    if rounds is None:
        return status if status != "ok" else "failed (no rounds.csv)"
    if len(rounds) < planned:  # cut by its limit: what 100 rounds would take at the steady pace
        steady = rounds.iloc[1:] if len(rounds) > 1 else rounds
        projected = wall + (planned - len(rounds)) * steady["wall_s"].mean()
        draw.figure("preset", "projected_wall_s", projected, "s", TARGET_RUN_S,
                    f"{len(rounds)} rounds reached; the rest at rounds 2-{len(rounds)}'s pace")
    timing_figures(draw, "preset", rounds)
    accuracy_figures(draw, "preset", "fednnnn", rounds, planned)
    return status


def step_engines(draw: Draw, limit: float) -> str:
    """Batched first: if the sequential engine is too slow for the limit, its finished rounds still
    give the ratio (round 2 is a steady round)."""
    results, statuses = {}, []
    for engine in ("batched", "sequential"):
        run_dir = draw.work / "engines" / engine
        left = limit - sum(r[1] for r in results.values())
        status, wall = run_command(draw, "engines", draw.fedrun(
            f"experiment={PRESET}", "aggregator=fednnnn", f"engine={engine}", "hyperparams.rounds=3",
            f"hydra.run.dir={run_dir}"), max(left, 1))
        results[engine] = (rounds_of(run_dir), wall)
        statuses.append(f"{engine} {status}")
        rounds = results[engine][0]
        if rounds is not None:
            steady = rounds.iloc[1:] if len(rounds) > 1 else rounds
            draw.figure("engines", f"{engine}_train_s_per_round", steady["train_s"].mean(), "s", "",
                        f"rounds {int(steady['round'].iloc[0])}-{int(steady['round'].iloc[-1])}; "
                        f"engine {engine_of(run_dir)}")
            draw.figure("engines", f"{engine}_round_s", steady["wall_s"].mean(), "s")
    (bat, _), (seq, _) = results["batched"], results["sequential"]
    if bat is not None and seq is not None:
        def steady_mean(r, col):
            return (r.iloc[1:] if len(r) > 1 else r)[col].mean()

        draw.figure("engines", "train_ratio", steady_mean(seq, "train_s") / steady_mean(bat, "train_s"), "x",
                    TARGET_RATIO, "sequential / batched training seconds per round")
        draw.figure("engines", "round_ratio", steady_mean(seq, "wall_s") / steady_mean(bat, "wall_s"), "x", "",
                    "sequential / batched whole-round seconds")
        both = bat.merge(seq, on="round", suffixes=("_b", "_s"))
        diff = (both["test_acc_b"] - both["test_acc_s"]).abs().max()
        draw.figure("engines", "max_test_acc_diff_pct", 100 * diff, "points", "",
                    f"rounds 1-{len(both)}: the engines agree up to rounding")
    return "ok" if statuses == ["batched ok", "sequential ok"] else "; ".join(statuses)


def step_column(draw: Draw, limit: float) -> str:
    sweep = draw.work / "column"
    rounds_planned = 3 if draw.size == "tiny" else 100
    status, wall = run_command(draw, "column", draw.fedrun(
        f"experiment={PRESET}", f"aggregator={','.join(METHODS)}", "engine=batched",
        f"hyperparams.rounds={rounds_planned}", "hydra/launcher=population", f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${hydra:runtime.choices.aggregator}", sweep=True), limit)
    draw.figure("column", "wall_s", wall, "s", "", f"{len(METHODS)} runs as one population, process start to exit")
    found = 0
    for method in METHODS:
        rounds = rounds_of(sweep / method)
        if rounds is None:
            draw.figure("column", f"{method}_final_acc_pct", "", "%", paper_accuracy(method) or "", "no round finished")
            continue
        found += 1
        accuracy_figures(draw, "column", method, rounds, rounds_planned, prefix=f"{method}_")
        if method == METHODS[0]:
            timing_figures(draw, "column", rounds, prefix="population_")
    # A population member has the results of its run alone on the batched engine (docs/sweeps.md):
    # the engines step's batched run is the column's FedNNNN run alone, for its first rounds.
    alone, member = rounds_of(draw.work / "engines" / "batched"), rounds_of(sweep / "fednnnn")
    if alone is not None and member is not None:
        both = alone.merge(member, on="round", suffixes=("_alone", "_member"))
        if len(both):
            diff = (both["test_acc_alone"] - both["test_acc_member"]).abs().max()
            draw.figure("column", "fednnnn_member_vs_alone_max_test_acc_diff_pct", 100 * diff, "points", 0,
                        f"rounds 1-{len(both)}: the population's FedNNNN vs the engines step's batched run")
    if status == "ok" and found < len(METHODS):
        status = f"failed ({len(METHODS) - found} of {len(METHODS)} runs wrote no rounds)"
    return status


STEP_FUNCTIONS = {"cuda": step_cuda, "preset": step_preset, "engines": step_engines, "column": step_column}


# ----------------------------------------------------------------------------- what comes back

def device_lines(draw: Draw) -> list[str]:
    lines = [f"date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
             f"python: {platform.python_version()}, machine: {platform.machine()}, cores: {os.cpu_count()}"]
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        lines.append(f"nvidia-smi: {done.stdout.strip() or done.stderr.strip()}")
    else:
        lines.append("nvidia-smi: not found")
    probe = ("import torch; print('torch', torch.__version__, '| cuda', torch.version.cuda, '| available', "
             "torch.cuda.is_available(), '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')")
    hydra = "import hydra, os; print('hydra-core', hydra.__version__, 'from', os.path.dirname(os.path.dirname(hydra.__file__)))"
    for code in (probe, hydra):
        done = subprocess.run([draw.python, "-c", code], capture_output=True, text=True, timeout=120)
        said = (done.stdout or done.stderr).strip().splitlines()
        lines.append(said[-1] if said else f"{code.split()[1]}: no answer")
    git = shutil.which("git")
    done = git and subprocess.run([git, "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                  text=True, timeout=30)
    lines.append(f"fedrun: {done.stdout.strip() if done and done.returncode == 0 else 'commit unknown (no git)'} ({ROOT})")
    return lines


def write_back(draw: Draw, header: list[str]) -> None:
    """figures.csv, report.md and runs.tar.gz as they stand now (each written whole, then renamed,
    so a kill mid-write leaves the previous complete file)."""
    columns = ["step", "figure", "value", "unit", "target", "note"]
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, lineterminator="\n")
    writer.writeheader()
    for step, status in draw.status.items():
        writer.writerow(dict(step=step, figure="status", value=status))
    writer.writerows(draw.figures)
    _replace(draw.out / "figures.csv", text.getvalue())
    _replace(draw.out / "report.md", report(draw, header))
    tmp = draw.out / "runs.tar.gz.part"
    for skip in (SKIP_IN_ARCHIVE, SKIP_IN_ARCHIVE + PER_CLIENT):
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(draw.work.rglob("*")):
                if path.is_file() and not any(part in skip for part in path.relative_to(draw.work).parts):
                    tar.add(path, arcname=str(path.relative_to(draw.work)))
        if tmp.stat().st_size <= MAX_ARCHIVE:
            break
        draw.log(f"runs.tar.gz: {tmp.stat().st_size / 2**20:.1f} MiB with every file, over "
                 f"{MAX_ARCHIVE / 2**20:.0f} MiB: the per-client CSVs are left out")
    tmp.replace(draw.out / "runs.tar.gz")


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    tmp.replace(path)


def report(draw: Draw, header: list[str]) -> str:
    lines = ["# GPU draw", "", *[f"- {h}" for h in header],
             f"- size: {draw.size}, device setting: {draw.device}, budget {draw.budget:.0f} s, "
             f"{time.monotonic() - draw.start:.0f} s used", "",
             "| step | figure | value | unit | target / paper | note |", "|---|---|---|---|---|---|"]
    for step, status in draw.status.items():
        lines.append(f"| {step} | status | {status} | | | |")
    for f in draw.figures:
        lines.append(f"| {f['step']} | {f['figure']} | {f['value']} | {f['unit']} | {f['target']} | {f['note']} |")
    column = {f["figure"]: f for f in draw.figures if f["step"] == "column"}
    if any(f"{m}_final_acc_pct" in column for m in METHODS):
        lines += ["", f"Table 2, MNIST non-IID UB (one seed; `experiment={PRESET}`):", "",
                  "| method | final % | best % | Table 2 % | rounds |", "|---|---|---|---|---|"]
        for m in METHODS:
            def value(name, m=m):
                return column.get(f"{m}_{name}", {}).get("value", "")

            best = column.get(f"{m}_best_acc_pct", {})
            lines.append(f"| {m} | {value('final_acc_pct')} | {best.get('value', '')} ({best.get('note', '')}) | "
                         f"{paper_accuracy(m)} | {value('rounds_done')} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.sh draw", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps", nargs="*", metavar="STEP", help=f"steps to run, in order (default: all of {', '.join(STEPS)})")
    p.add_argument("--out", default=os.environ.get("OUT") or "outputs/gpu_check/draw",
                   help="where the files that come back go (default: $OUT, else outputs/gpu_check/draw)")
    p.add_argument("--work", default=None, help="where the run folders go (default: a fresh folder in $TMPDIR)")
    p.add_argument("--device", default=os.environ.get("GPU_CHECK_DEVICE", "cuda"), choices=("cuda", "cpu"))
    p.add_argument("--data", default=os.environ.get("GPU_CHECK_DATA", ".gpudata/mnist"),
                   help="folder holding MNIST's four IDX files (default: .gpudata/mnist)")
    p.add_argument("--size", default=os.environ.get("GPU_CHECK_SIZE", "full"), choices=("full", "tiny"))
    p.add_argument("--budget", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET", 540)),
                   help="seconds for all the steps together (default 540: 9 minutes)")
    args = p.parse_args(argv)
    bad = [s for s in args.steps if s not in STEPS]
    if bad:
        print(f"gpu_check draw: unknown step {bad[0]!r}; choose from {', '.join(STEPS)}", file=sys.stderr)
        sys.exit(2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    data = Path(args.data).resolve()
    missing = [n for n in IDX_NAMES if not (data / n).is_file() and not (data / f"{n}.gz").is_file()]
    if missing:
        print(f"gpu_check draw: {data} lacks {missing[0]}(.gz): run 'bash scripts/bench/gpu_check.sh prepare' "
              f"and carry .gpudata", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="fedrun-gpu-draw-"))
    work.mkdir(parents=True, exist_ok=True)
    draw = Draw(out=out.resolve(), work=work.resolve(), device=args.device, data=data, size=args.size,
                budget=args.budget)
    (draw.out / "draw.log").write_text("")
    header = device_lines(draw)
    for line in header:
        draw.log(line)
    steps = args.steps or list(STEPS)
    for i, step in enumerate(steps):
        later = sum(LIMITS.get(s, 0) for s in steps[i + 1:])  # kept for the steps after this one
        limit = min(LIMITS.get(step, float("inf")), draw.left() - RESERVE - later)
        if limit < 10:
            draw.status[step] = f"skipped: {max(draw.left(), 0):.0f} s left"
            draw.log(f"== {step}: skipped, {max(draw.left(), 0):.0f} s left")
            continue
        draw.log(f"== {step} (limit {limit:.0f} s, {draw.left():.0f} s of the budget left)")
        try:
            draw.status[step] = STEP_FUNCTIONS[step](draw, limit)
        except Exception as e:  # noqa: BLE001 - a step's own bug must not cost the steps after it
            draw.status[step] = f"error in gpu_draw.py: {type(e).__name__}: {e}"
            draw.log(traceback.format_exc(), echo=False)
        draw.log(f"== {step}: {draw.status[step]}")
        write_back(draw, header)
    write_back(draw, header)
    print(report(draw, header))
    return 0 if all(s == "ok" for s in draw.status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
