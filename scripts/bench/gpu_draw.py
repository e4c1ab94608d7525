#!/usr/bin/env python
"""One GPU draw, fully used: what a GPU session of 15 minutes must bring back, in at most 9
minutes on one NVIDIA H100.  Run it through ``bash scripts/bench/gpu_check.sh draw``, which first
checks the data and installs hydra-core/omegaconf from the carried wheels (its header gives the
preparation and the one device call).

Steps, in the order of what matters most.  Each runs under its own time limit, so a slow or failing
step never costs the ones after it, and each writes what it learned before the next one starts:

``cuda``      tests/test_cuda.py (and augmentation's CUDA test) with ``FEDRUN_TEST_CAPTURE=on``:
              the engines on CUDA, captured lock-steps included, equal each other and the CPU within
              the bounds the tests document; auto chunking, TF32/bf16 bounds, a population, a CLI run.
``preset``    FedNNNN's MNIST non-IID unbalanced preset at its own scale
              (``experiment=fednnnn/mnist_noniid_ub``: K = 100, C = 1, E = 5, B = 50, 100 rounds;
              ``aggregator=fednnnn``) on the whole MNIST with ``engine=auto engine.capture=auto``: wall
              time from process start to exit, train / eval / bookkeeping seconds per round, final and
              best test accuracy beside Table 2's.
``engines``   the same workload for 3 rounds on ``engine=batched`` and ``engine=sequential``: the ratio
              of their training seconds per round (rounds 2-3: round 1 warms up), and their largest
              test-accuracy difference (the engines are equal up to rounding).
``balanced``  the balanced preset (``experiment=fednnnn/mnist_noniid_b``: clients of about 600 images, so
              a round is about the mean client's lock-steps, 65 on MNIST): the preset step's figures.
``lockstep``  scripts/bench/bench_lockstep.py on the device: both presets' lock-steps a round, critical
              path, bucketed shapes and occupancy; ms and kernels a lock-step of the MNIST CNN for one
              client and for all 100, eager and captured; each round's floor estimate.
``table2``    with the time left: Table 2's four MNIST conditions (IID and non-IID, balanced and
              unbalanced), then its four CIFAR-10 conditions on CIFAR-10's JPEG q75 copy
              (``dataset=cifar10_jpeg``, where prepare carried it: "CIFAR-10 (JPEG q75 copy)"
              in every file and table; 250 rounds), each the 5 methods (FedAvg, FedProx, Norm-Norm, Momentum, FedNNNN) as one
              population (``hydra/launcher=population``), seed 0, 100 rounds, one condition after
              another, balanced first.  They go on across sessions: the runs' folders, checkpoints
              included, come back as resume archives (scripts/bench/resume_runs.py); committed under
              outputs/reproductions/fednnnn_gpu/resume/ (replacing the earlier ones), the next draw
              unpacks them and resumes every run from its last round, so each session adds rounds
              to the table.  A finished or diverged run keeps only its config, rounds, summary and
              run record there (no checkpoint: it never trains again), so only the condition in
              training carries checkpoints: why the conditions train one after another (one
              condition's 5 are about 11 MiB, and a device call carries 64 MiB, checkout included).
              Each method's final and best accuracy beside the paper's.

What comes back, under ``--out`` ($OUT on the device), rewritten after every step: ``draw.log``
(every step's whole output), ``figures.csv`` (one row a figure: step, figure, value, unit, target,
note), ``report.md`` (the device and the figures beside the targets and the paper; also printed at
the end) and ``runs.tar.gz`` (every run folder without checkpoints and model files); after
``table2``, ``table2_resume_1.tar.gz`` (and ``_2`` ... when the runs need more than one 15 MiB
file; at most 4): the whole state of the table.  The run folders themselves are written under
``--work`` (default: a fresh folder in $TMPDIR).

``--size tiny`` (``GPU_CHECK_SIZE=tiny``) adds ``scale=tiny`` to every run and measures few
lock-steps: the CPU check of the whole script (``GPU_CHECK_DEVICE=cpu``; tests/test_gpu_check.py).
``--add-rounds N`` stops each table2 population once its runs have N more rounds (the resume test).
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

import resume_runs  # scripts/bench/, beside this script

ROOT = Path(__file__).resolve().parents[2]
PAPER_CSV = ROOT / "scripts" / "paper_targets" / "fednnnn_table2_accuracy.csv"

PRESET = "fednnnn/mnist_noniid_ub"
BALANCED = "fednnnn/mnist_noniid_b"
METHODS = ("fedavg", "fedprox", "normnorm", "momentum", "fednnnn")
# Table 2's conditions (preset name: the paper's condition), in the order table2 trains them: MNIST's
# first, the balanced ones first (rounds of about 60 lock-steps against the unbalanced ones' ~1,160);
# then CIFAR-10's, on its JPEG q75 copy (dataset=cifar10_jpeg) where prepare could carry it.
CONDITIONS = {"mnist_iid_b": "iid-b", "mnist_noniid_b": "noniid-b", "mnist_iid_ub": "iid-ub",
              "mnist_noniid_ub": "noniid-ub", "cifar10_iid_b": "iid-b", "cifar10_noniid_b": "noniid-b",
              "cifar10_iid_ub": "iid-ub", "cifar10_noniid_ub": "noniid-ub"}
# Where prepare puts the CIFAR-10 copy: beside the carried MNIST folder.
CIFAR10_COPY = Path("cifar10-jpeg") / "cifar10_jpeg_q75.npz.xz"
ROUNDS = {"mnist": 100, "cifar10": 250}  # Table 1: each dataset's rounds
STEPS = ("cuda", "preset", "engines", "balanced", "lockstep", "table2")
# Each step's time limit (seconds).  They sum to 420, leaving table2 at least 100 s of a 540 s budget;
# time a step does not use goes to table2.
LIMITS = {"cuda": 120, "preset": 120, "engines": 75, "balanced": 60, "lockstep": 45}
RESERVE = 20  # seconds kept back at the end for the report and the archives
GRACE = 20  # a process stopped at its limit may take this long to go (_stop: SIGTERM, SIGKILL 15 s later)
START_S = {"full": 30, "tiny": 5}  # table2 starts no population with less time than this left
# The targets of docs/performance.md: the FedNNNN MNIST run in 60 s (ambition 15 s) on one H100,
# the batched engine 10x the sequential one, bookkeeping under 10% of a round, one client's
# lock-step of the MNIST CNN in 0.3 ms, a Table 2 column's 5 methods as one population in 2x one run's time.
TARGET_RUN_S, AMBITION_RUN_S, TARGET_RATIO, TARGET_BOOKKEEPING = 60, 15, 10, 0.10
TARGET_STEP_MS, TARGET_POPULATION = 0.3, 2
SKIP_IN_ARCHIVE = ("checkpoint.pt", "output_layer.csv", "models")
# A file comes back from the device only up to 16 MiB: past 15, the per-client CSVs stay behind.
PER_CLIENT = ("clients.csv", "client_layers.csv")
MAX_ARCHIVE = 15 * 2**20
# The device returns at most 8 files: draw.log, figures.csv, report.md, runs.tar.gz and these.
RESUME_FILES = 4
RESUME_PREFIX = "table2"
RESUME = ROOT / "outputs" / "reproductions" / "fednnnn_gpu" / "resume"
LIGHT = ("config.yaml", "rounds.csv", "summary.json", "run.json")  # what a run that is done keeps there
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
    runs: Path = RESUME  # the table2 resume archives to go on from
    conditions: tuple[str, ...] = tuple(CONDITIONS)
    add_rounds: int = 0  # table2: stop a population once its runs have this many more rounds (0: time decides)
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

    def planned(self, dataset: str = "mnist") -> int:
        """A preset's rounds at the draw's size (scale=tiny: 3)."""
        return 3 if self.size == "tiny" else ROUNDS[dataset]

    def cifar10_copy(self) -> Path | None:
        """The carried CIFAR-10 JPEG copy (beside the MNIST folder), or None where prepare left it out."""
        path = self.data.parent / CIFAR10_COPY
        return path if path.is_file() else None

    def data_arg(self) -> str:
        """The data folder as the runs name it: relative to the checkout when inside it, so that a
        run's config.yaml is the same wherever the checkout lies and a later session can resume it."""
        try:
            return str(self.data.relative_to(ROOT))
        except ValueError:
            return str(self.data)

    def fedrun(self, *overrides: str, sweep: bool = False, dataset: str = "mnist") -> list[str]:
        """``python -m fedrun [-m]`` on the carried MNIST (``dataset="cifar10"``: the carried CIFAR-10
        JPEG copy, after the overrides, which name the CIFAR-10 preset), never downloading, at the
        draw's size.  The data root is a folder that does not exist, inside the data folder's name:
        nothing else is read (the copy's decoded cache goes to the work folder)."""
        size = ["scale=tiny"] if self.size == "tiny" else []
        data = self.data_arg()
        if dataset == "cifar10":
            copy = self.cifar10_copy()
            copy = copy.relative_to(ROOT) if copy is not None and copy.is_relative_to(ROOT) else copy
            reads = ["dataset=cifar10_jpeg", f"dataset.load.file={copy}", f"dataset.load.cache={self.work / 'cifar10_cache'}"]
            return [self.python, "-m", "fedrun", *(["-m"] if sweep else []), f"device={self.device}", "progress=false",
                    f"data_root={data}/no-data-root", *size, *overrides, *reads]
        return [self.python, "-m", "fedrun", *(["-m"] if sweep else []), f"device={self.device}", "progress=false",
                f"dataset.load.search=[{data}]", "dataset.load.download=false", f"data_root={data}/no-data-root",
                *size, *overrides]


def capture(engine: str) -> list[str]:
    """``engine.capture=auto`` (CUDA graphs where the setting allows) for an engine whose config has
    the option, nothing for one that has not (the sequential engine; a checkout from before capture)."""
    path = ROOT / "conf" / "engine" / f"{engine}.yaml"
    has = path.is_file() and re.search(r"^capture:", path.read_text(), re.M)
    return ["engine.capture=auto"] if has else []


# ----------------------------------------------------------------------------- running a step

def run_command(draw: Draw, step: str, command: list[str], limit: float, stop_when=None,
                env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run ``command`` in the repository root with its output appended to draw.log, stopped (its whole
    process group: SIGTERM, then SIGKILL) after ``limit`` seconds, or as soon as ``stop_when()``
    (polled every half second) says so.  Returns ("ok" | "failed (exit N)" | "timed out after N s" |
    "stopped as asked", wall seconds from start to exit)."""
    draw.log(f"$ {shlex.join(command)}   # limit {limit:.0f} s", echo=False)
    started = time.monotonic()
    deadline = started + max(limit, 1)
    with open(draw.out / "draw.log", "a") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        while True:
            try:
                rc = proc.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)) if stop_when else
                               max(deadline - time.monotonic(), 0.01))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    _stop(proc)
                    return f"timed out after {limit:.0f} s", time.monotonic() - started
                if stop_when is not None and stop_when():
                    _stop(proc)
                    return "stopped as asked", time.monotonic() - started
    wall = time.monotonic() - started
    return ("ok" if rc == 0 else f"failed (exit {rc})"), wall


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (fedrun ends its runs after their last complete round and closes
    their files), SIGKILL after 15 s."""
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


def steady(rounds):
    """Rounds 2 on (round 1 warms up kernels, caches and graphs), or round 1 alone."""
    return rounds.iloc[1:] if len(rounds) > 1 else rounds


def engine_of(run_dir: Path) -> str:
    """The engine a run used, from its log line 'run directory ... (engine: NAME)'."""
    log = run_dir / "fedrun.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = re.findall(r"\(engine: (\w+)\)", text)
    return found[-1] if found else "unknown"


def capture_said(run_dir: Path) -> str:
    """The last line of a run's log about capture (what the engine chose and why), shortened."""
    log = run_dir / "fedrun.log"
    lines = [line for line in (log.read_text(errors="replace") if log.is_file() else "").splitlines()
             if "capture" in line.lower()]
    return lines[-1].split("] ", 1)[-1][:200] if lines else ""


def dataset_of(preset: str) -> str:
    """The paper's dataset of a Table 2 preset (``cifar10_iid_b`` -> ``cifar10``)."""
    return preset.split("_", 1)[0]


def paper_accuracy(method: str, condition: str = CONDITIONS["mnist_noniid_ub"], dataset: str = "mnist") -> float | None:
    with open(PAPER_CSV) as f:
        for row in csv.DictReader(f):
            if (row["method"], row["dataset"], row["condition"]) == (method, dataset, condition):
                return float(row["accuracy_pct"])
    return None


def accuracy_figures(draw: Draw, step: str, method: str, rounds, planned: int, prefix: str = "",
                     condition: str = CONDITIONS["mnist_noniid_ub"], dataset: str = "mnist") -> None:
    """Final and best test accuracy of a run (at the last round reached) beside Table 2's number."""
    paper = paper_accuracy(method, condition, dataset)
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
    part = steady(rounds)
    wall, train, ev = part["wall_s"].mean(), part["train_s"].mean(), part["eval_s"].mean()
    rest = wall - train - ev
    span = f"rounds {int(part['round'].iloc[0])}-{int(part['round'].iloc[-1])}"
    draw.figure(step, f"{prefix}round_s", wall, "s", "", span)
    draw.figure(step, f"{prefix}train_s_per_round", train, "s", "", span)
    draw.figure(step, f"{prefix}eval_s_per_round", ev, "s", "", span)
    draw.figure(step, f"{prefix}bookkeeping_s_per_round", rest, "s", "", span + ": wall - train - eval")
    draw.figure(step, f"{prefix}bookkeeping_share", rest / wall if wall else float("nan"), "fraction",
                TARGET_BOOKKEEPING, span)


def figure_of(draw: Draw, step: str, name: str):
    """A figure's value found earlier in this draw (None when absent or empty)."""
    value = next((f["value"] for f in draw.figures if (f["step"], f["figure"]) == (step, name)), None)
    return None if value in (None, "") else value


# ----------------------------------------------------------------------------- the steps

def step_cuda(draw: Draw, limit: float) -> str:
    xml = draw.work / "cuda_tests.xml"
    # Four pytest workers where pytest-xdist is installed (the GPU machine has 16 cores): the
    # population and CLI tests start processes of their own and wait on them.
    workers = ["-n", "4"] if draw.device != "cpu" and importlib.util.find_spec("xdist") else []
    command = [draw.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *workers,
               f"--junitxml={xml}", "tests/test_cuda.py", "tests/test_augment.py::test_cuda_matches_cpu"]
    status, wall = run_command(draw, "cuda", command, limit, env={"FEDRUN_TEST_CAPTURE": "on"})
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
                    ", ".join(failed) if kind == "failed" else "FEDRUN_TEST_CAPTURE=on")
    draw.figure("cuda", "wall_s", wall, "s")
    if status == "ok" and counts["skipped"] and not counts["passed"] and draw.device != "cpu":
        status = "failed (every CUDA test skipped: torch sees no GPU)"
    return status


def whole_run(draw: Draw, step: str, experiment: str, limit: float, target_s) -> str:
    """One preset's whole run (FedNNNN, engine=auto, capture=auto) as a user starts it: its wall time
    from process start to exit, the per-round split and the accuracy beside Table 2's."""
    run_dir = draw.work / step
    status, wall = run_command(draw, step, draw.fedrun(
        f"experiment={experiment}", "aggregator=fednnnn", "engine=auto", *capture("auto"),
        f"hydra.run.dir={run_dir}"), limit)
    rounds = rounds_of(run_dir)
    planned = draw.planned()
    draw.figure(step, "wall_s", wall, "s", target_s, f"process start to exit{'; ambition 15 s' if target_s else ''}")
    draw.figure(step, "engine", engine_of(run_dir), "", "BatchedEngine" if draw.device != "cpu" else "")
    draw.figure(step, "capture", "auto" if capture("auto") else "not in this checkout", "", "",
                capture_said(run_dir) or "fedrun.log has no line of a fallback to eager steps")
    if rounds is None:
        return status if status != "ok" else "failed (no rounds.csv)"
    if len(rounds) < planned:  # cut by its limit: what 100 rounds would take at the steady pace
        projected = wall + (planned - len(rounds)) * steady(rounds)["wall_s"].mean()
        draw.figure(step, "projected_wall_s", projected, "s", target_s,
                    f"{len(rounds)} rounds reached; the rest at rounds 2-{len(rounds)}'s pace")
    timing_figures(draw, step, rounds)
    accuracy_figures(draw, step, "fednnnn", rounds, planned, condition=CONDITIONS[experiment.split("/")[1]])
    return status


def step_preset(draw: Draw, limit: float) -> str:
    return whole_run(draw, "preset", PRESET, limit, TARGET_RUN_S)


def step_balanced(draw: Draw, limit: float) -> str:
    return whole_run(draw, "balanced", BALANCED, limit, "")


def step_engines(draw: Draw, limit: float) -> str:
    """Batched first: if the sequential engine is too slow for the limit, its finished rounds still
    give the ratio (round 2 is a steady round)."""
    results, statuses = {}, []
    for engine in ("batched", "sequential"):
        run_dir = draw.work / "engines" / engine
        left = limit - sum(r[1] for r in results.values())
        status, wall = run_command(draw, "engines", draw.fedrun(
            f"experiment={PRESET}", "aggregator=fednnnn", f"engine={engine}", *capture(engine),
            "hyperparams.rounds=3", f"hydra.run.dir={run_dir}"), max(left, 1))
        results[engine] = (rounds_of(run_dir), wall)
        statuses.append(f"{engine} {status}")
        rounds = results[engine][0]
        if rounds is not None:
            part = steady(rounds)
            draw.figure("engines", f"{engine}_train_s_per_round", part["train_s"].mean(), "s", "",
                        f"rounds {int(part['round'].iloc[0])}-{int(part['round'].iloc[-1])}; "
                        f"engine {engine_of(run_dir)}")
            draw.figure("engines", f"{engine}_round_s", part["wall_s"].mean(), "s")
    (bat, _), (seq, _) = results["batched"], results["sequential"]
    if bat is not None and seq is not None:
        draw.figure("engines", "train_ratio", steady(seq)["train_s"].mean() / steady(bat)["train_s"].mean(), "x",
                    TARGET_RATIO, "sequential / batched training seconds per round")
        draw.figure("engines", "round_ratio", steady(seq)["wall_s"].mean() / steady(bat)["wall_s"].mean(), "x", "",
                    "sequential / batched whole-round seconds")
        both = bat.merge(seq, on="round", suffixes=("_b", "_s"))
        diff = (both["test_acc_b"] - both["test_acc_s"]).abs().max()
        draw.figure("engines", "max_test_acc_diff_pct", 100 * diff, "points", "",
                    f"rounds 1-{len(both)}: the engines agree up to rounding")
    return "ok" if statuses == ["batched ok", "sequential ok"] else "; ".join(statuses)


def step_lockstep(draw: Draw, limit: float) -> str:
    """bench_lockstep.py on the device: its figures, as it wrote them to JSON.  At tiny size on its
    synthetic stand-in of MNIST (the presets' partitions need 60,000 images, not a test's few)."""
    path = draw.work / "lockstep.json"
    data = ["--tiny"] if draw.size == "tiny" else ["--data", str(draw.data)]
    command = [draw.python, "scripts/bench/bench_lockstep.py", "--device", draw.device, *data, "--json", str(path)]
    status, wall = run_command(draw, "lockstep", command, limit)
    draw.figure("lockstep", "wall_s", wall, "s")
    if not path.is_file():
        return status if status != "ok" else "failed (no figures written)"
    found = json.loads(path.read_text())
    best = "captured" if found["capture"] else "eager"
    note = f"{found['steps']} lock-steps timed a round; {found['data']} data"
    for key, m in found["measured"].items():
        target = TARGET_STEP_MS if key == f"one_{best}" else ""
        draw.figure("lockstep", f"{key}_ms", m["ms"], "ms a lock-step", target,
                    note + ("" if key.startswith("one") else f"; {found['width']} clients"))
        for count in ("kernels", "launch_calls", "aten_calls"):
            if count in m:
                draw.figure("lockstep", f"{key}_{count}", m[count], "a lock-step", "",
                            "torch.profiler" + ("; outermost aten operators (CPU)" if count == "aten_calls" else ""))
    for name, w in found["workloads"].items():
        short = name.removeprefix("fednnnn_")
        for key, unit in (("total_steps", "steps"), ("mean_steps", "steps"), ("critical_path", "steps"),
                          ("lock_steps", "lock-steps"), ("shapes", "graphs"), ("occupancy", "fraction")):
            draw.figure("lockstep", f"{short}_{key}", float(w[key]) if key in ("mean_steps", "occupancy") else w[key],
                        unit, "", f"chunks of {found['chunk']}" if key == "lock_steps" else "")
        floor = w[f"floor_{best}_s"]
        draw.figure("lockstep", f"{short}_floor_s", floor, "s a round", "", f"critical path x one {best} "
                    f"one-client step + the rest's arithmetic; 100 rounds {100 * floor:.1f} s")
    return status


@dataclass
class RunState:
    """How far a run folder is: its rounds recorded, and whether it can train no further."""

    rounds: int
    finished: bool
    diverged: bool

    @property
    def done(self) -> bool:
        return self.finished or self.diverged


def run_state(run_dir: Path) -> RunState:
    """A run is finished when it wrote summary.json, diverged when run.json's last session says so."""
    rounds = rounds_of(run_dir)
    diverged = False
    try:
        sessions = json.loads((run_dir / "run.json").read_text())
        diverged = isinstance(sessions, list) and bool(sessions) and sessions[-1].get("reason") == "diverged"
    except (OSError, ValueError, AttributeError):
        pass
    return RunState(0 if rounds is None else int(rounds["round"].iloc[-1]), (run_dir / "summary.json").is_file(),
                    diverged)


def take_carried(draw: Draw) -> None:
    """Unpack the table2 resume archives carried in ``draw.runs`` into the work folder."""
    found = resume_runs.archives(draw.runs, RESUME_PREFIX) if draw.runs.is_dir() else []
    if not found:
        draw.log(f"table2: no resume archives in {draw.runs}: every run starts at round 1")
        return
    checkpoints = resume_runs.take(draw.runs, RESUME_PREFIX, draw.work)
    draw.log(f"table2: continuing from {len(found)} resume archive(s) in {draw.runs} ({checkpoints} checkpoints)")


def pack_state(draw: Draw) -> None:
    """Every table2 run folder into the resume archives (the whole state, replacing the last ones);
    a run that is done keeps only :data:`LIGHT`, enough to be skipped and reported."""
    runs = sorted(str(p.parent.relative_to(draw.work)) for p in (draw.work / "table2").glob("*/*/config.yaml"))
    leave_out = set()
    for run in runs:
        if run_state(draw.work / run).done:
            leave_out |= {f for f in (draw.work / run).iterdir() if f.name not in LIGHT}
    written, left = resume_runs.pack_parts(draw.work, runs, draw.out, RESUME_PREFIX, leave_out, RESUME_FILES)
    size = sum(p.stat().st_size for p in written) / 2**20
    draw.log(f"table2: {len(runs)} runs packed into {len(written)} resume archive(s), {size:.1f} MiB"
             + (f"; left out (over {RESUME_FILES} files of 15 MiB; they start afresh next time): {', '.join(left)}"
                if left else ""))


def train_condition(draw: Draw, condition: str, deadline: float) -> str:
    """One Table 2 condition's unfinished runs as one population, resumed, until they finish or
    the time (or ``--add-rounds``) runs out.  Returns what happened, in a few words."""
    sweep = draw.work / "table2" / condition
    before = {m: run_state(sweep / m) for m in METHODS}
    todo = [m for m in METHODS if not before[m].done]
    if not todo:
        return "finished"
    dataset = dataset_of(condition)
    if dataset == "cifar10" and draw.cifar10_copy() is None:
        return f"not reached (no CIFAR-10 copy carried: {CIFAR10_COPY} beside {draw.data_arg()})"
    left = deadline - time.monotonic() - GRACE
    if left < START_S[draw.size]:
        return f"not reached ({max(left, 0):.0f} s left)"

    def enough() -> bool:
        now = {m: run_state(sweep / m) for m in todo}
        return all(now[m].done or now[m].rounds >= before[m].rounds + draw.add_rounds for m in todo)

    status, wall = run_command(draw, "table2", draw.fedrun(
        f"experiment=fednnnn/{condition}", f"aggregator={','.join(todo)}", "engine=batched", *capture("batched"),
        "resume=true", "hydra/launcher=population", f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${hydra:runtime.choices.aggregator}", sweep=True, dataset=dataset), left,
        stop_when=enough if draw.add_rounds else None)
    after = {m: run_state(sweep / m) for m in METHODS}
    start, end = min(before[m].rounds for m in todo), max(after[m].rounds for m in todo)
    trained = f"rounds {start + 1}-{end} this session" if end > start else "no round finished this session"
    draw.figure("table2", f"{condition}_wall_s", wall, "s", "",
                f"{len(todo)} runs as one population, process start to exit; {trained}")
    population_figures(draw, condition, sweep, todo, before)
    diverged = [m for m in todo if after[m].diverged and not before[m].diverged]
    if status.startswith("failed") and not [m for m in todo if not after[m].done]:
        status = "ok"  # a diverged run ends the sweep with an error; every run ended, which is the table
    ended = f" ({len(diverged)} diverged: {', '.join(diverged)})" if diverged else ""
    reached = sorted({after[m].rounds for m in todo})
    at = f"at round {reached[0]}" if len(reached) == 1 else f"at rounds {reached[0]}-{reached[-1]}"
    if status in ("ok", "stopped as asked") or status.startswith("timed out"):
        return f"{'finished' if all(after[m].done for m in METHODS) else at}{ended}; {status}"
    return f"failed {at}{ended}: {status}"


def population_figures(draw: Draw, condition: str, sweep: Path, todo: list[str], before: dict) -> None:
    """The population's seconds a round this session, beside one run's alone where a step of this
    draw ran that run (target: 5 methods in 2x one run's time)."""
    rounds = rounds_of(sweep / todo[0])
    if rounds is None:
        return
    this = rounds[rounds["round"] > before[todo[0]].rounds]
    if this.empty:
        return
    wall = steady(this)["wall_s"].mean()
    span = f"rounds {int(steady(this)['round'].iloc[0])}-{int(this['round'].iloc[-1])}"
    draw.figure("table2", f"{condition}_population_round_s", wall, "s", "", f"{len(todo)} runs; {span}")
    alone_step = {"mnist_noniid_ub": "preset", "mnist_noniid_b": "balanced"}.get(condition)
    alone = figure_of(draw, alone_step, "round_s") if alone_step else None
    if alone and len(todo) == len(METHODS) and len(this) > 1:
        draw.figure("table2", f"{condition}_population_vs_alone", wall / float(alone), "x", TARGET_POPULATION,
                    f"the 5 methods' round / FedNNNN's round alone ({alone_step} step)")


def step_table2(draw: Draw, limit: float) -> str:
    deadline = time.monotonic() + limit
    take_carried(draw)
    outcomes = {}
    for condition in draw.conditions:
        outcomes[condition] = train_condition(draw, condition, deadline)
        draw.log(f"table2 {condition}: {outcomes[condition]}")
        if outcomes[condition] != "finished" and not outcomes[condition].startswith("not reached"):
            pack_state(draw)  # after every population: a later kill loses none of its rounds
    for condition in draw.conditions:
        draw.figure("table2", f"{condition}_state", outcomes[condition], "", "")
        for method in METHODS:
            rounds = rounds_of(draw.work / "table2" / condition / method)
            prefix = f"{condition}_{method}_"
            dataset = dataset_of(condition)
            if rounds is None:
                draw.figure("table2", f"{prefix}final_acc_pct", "", "%",
                            paper_accuracy(method, CONDITIONS[condition], dataset) or "", "no round yet")
                continue
            accuracy_figures(draw, "table2", method, rounds, draw.planned(dataset), prefix, CONDITIONS[condition],
                             dataset)
    # A population member has the results of its run alone on the batched engine (docs/sweeps.md):
    # the engines step's batched run is the non-IID UB population's FedNNNN alone, for its first rounds.
    alone = rounds_of(draw.work / "engines" / "batched")
    member = rounds_of(draw.work / "table2" / "mnist_noniid_ub" / "fednnnn")
    if alone is not None and member is not None:
        both = alone.merge(member, on="round", suffixes=("_alone", "_member"))
        if len(both):
            diff = (both["test_acc_alone"] - both["test_acc_member"]).abs().max()
            draw.figure("table2", "fednnnn_member_vs_alone_max_test_acc_diff_pct", 100 * diff, "points", 0,
                        f"rounds 1-{len(both)}: non-IID UB's population FedNNNN vs the engines step's batched run")
    failed = [c for c, o in outcomes.items() if o.startswith("failed")]
    return "ok" if not failed else "; ".join(f"{c} {outcomes[c]}" for c in failed)


STEP_FUNCTIONS = {"cuda": step_cuda, "preset": step_preset, "engines": step_engines, "balanced": step_balanced,
                  "lockstep": step_lockstep, "table2": step_table2}


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
    log = draw.out / "draw.log"
    if log.is_file():  # between steps: no command is appending to it now
        _replace(log, without_machine_paths(log.read_text(errors="replace"), draw))
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


def without_machine_paths(text: str, draw: Draw) -> str:
    """``text`` with the device's folders named as a reader can place them: the run folders as
    ``<work>``, the folder that comes back as ``$OUT``, the data as ``<data>``, the resume archives'
    folder as ``<runs>``, the checkout as ``.``, the interpreter as ``python``; what comes back is committed, and a committed file names no folder of the machine it
    was made on (tests/test_claims.py::test_no_machine_paths_in_committed_files)."""
    text = text.replace(draw.python, "python")
    for folder, name in sorted(((draw.work, "<work>"), (draw.out, "$OUT"), (draw.data, "<data>"),
                                (Path(draw.runs), "<runs>"), (ROOT, ".")),
                               key=lambda pair: -len(str(pair[0].resolve()))):  # the longest first: nested folders
        for spelling in {str(folder), str(folder.resolve())}:
            if spelling not in (".", ""):
                text = text.replace(spelling, name)
    return text


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
    return "\n".join(lines + table2_lines(draw)) + "\n"


def table2_lines(draw: Draw) -> list[str]:
    """Table 2's MNIST part as trained so far: each method's final accuracy (Table 2's) [rounds]."""
    table = {f["figure"]: f for f in draw.figures if f["step"] == "table2"}
    if not any(f"{c}_{m}_rounds_done" in table for c in CONDITIONS for m in METHODS):
        return []
    lines = ["", "Table 2, MNIST (seed 0; final test accuracy %, Table 2's in brackets, rounds reached):", "",
             "| method | " + " | ".join(CONDITIONS.values()) + " |", "|---" * (len(CONDITIONS) + 1) + "|"]
    for m in METHODS:
        cells = []
        for c, cond in CONDITIONS.items():
            final, done = table.get(f"{c}_{m}_final_acc_pct", {}), table.get(f"{c}_{m}_rounds_done", {})
            value = final.get("value", "")
            cells.append(f"{value} ({paper_accuracy(m, cond)}) [{done.get('value', 0)}]" if value != "" else
                         f"- ({paper_accuracy(m, cond)}) [0]")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


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
    p.add_argument("--runs", default=os.environ.get("GPU_CHECK_RUNS") or str(RESUME.relative_to(ROOT)),
                   help="folder of table2's resume archives to go on from (default: $GPU_CHECK_RUNS, else "
                        "outputs/reproductions/fednnnn_gpu/resume)")
    p.add_argument("--conditions", default=os.environ.get("GPU_CHECK_CONDITIONS") or ",".join(CONDITIONS),
                   help=f"table2's conditions, in order (default: {','.join(CONDITIONS)})")
    p.add_argument("--add-rounds", default=os.environ.get("GPU_CHECK_ADD_ROUNDS") or "0",
                   help="table2: stop each population once its runs have this many more rounds (default 0: "
                        "as many as the time allows)")
    args = p.parse_args(argv)
    bad = [s for s in args.steps if s not in STEPS]
    if bad:
        _refuse(f"unknown step {bad[0]!r}; choose from {', '.join(STEPS)}")
    args.conditions = tuple(c for c in args.conditions.split(",") if c)
    unknown = [c for c in args.conditions if c not in CONDITIONS]
    if unknown or not args.conditions:
        _refuse(f"unknown condition {(unknown or [''])[0]!r}; choose from {', '.join(CONDITIONS)} (comma-separated)")
    if not args.add_rounds.isdigit():
        _refuse(f"--add-rounds must be a number of rounds, 0 or more (got {args.add_rounds!r})")
    args.add_rounds = int(args.add_rounds)
    return args


def _refuse(message: str) -> None:
    print(f"gpu_check draw: {message}", file=sys.stderr)
    sys.exit(2)


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
    runs = Path(args.runs) if Path(args.runs).is_absolute() else ROOT / args.runs
    draw = Draw(out=out.resolve(), work=work.resolve(), device=args.device, data=data, size=args.size,
                budget=args.budget, runs=runs, conditions=args.conditions, add_rounds=args.add_rounds)
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
