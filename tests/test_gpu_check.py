"""``bash scripts/bench/gpu_check.sh draw``, the GPU draw, proven on the CPU before a GPU is lent.

A lent GPU has 15 minutes of device time in all and must not be spent on a typo, so the whole
script runs here end to end (``GPU_CHECK_DEVICE=cpu``, ``GPU_CHECK_SIZE=tiny``: every step, every
run, at ``scale=tiny``), on MNIST-format files the test writes, and brings back what the device
tool would: at most 8 files, at most two folders down, none over 16 MiB.  Its table2 step resumes
its populations from the archives an earlier draw brought back.  Its refusals (no wheels, an
incomplete wheels folder, no data, an unknown stage, step or condition) are single lines before
anything is written.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO_ROOT, _cli_env, data_rows
from test_models_data import write_idx

SCRIPT = "scripts/bench/gpu_check.sh"
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def mnist_files(folder: Path, n_train: int = 300, n_test: int = 100) -> Path:
    """MNIST's four files (gzip, torchvision's names) of random images, every class in both sets."""
    rng = np.random.default_rng(0)
    arrays = {IDX[0]: rng.integers(0, 256, (n_train, 28, 28)), IDX[1]: np.arange(n_train) % 10,
              IDX[2]: rng.integers(0, 256, (n_test, 28, 28)), IDX[3]: np.arange(n_test) % 10}
    for name, array in arrays.items():
        write_idx(folder / f"{name}.gz", array)
    return folder


def gpu_check(tmp_path: Path, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    environment = {**_cli_env(), "PYTHON": sys.executable, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_SIZE": "tiny",
                   "GPU_CHECK_WHEELS": str(tmp_path / "no-wheels"), "OUT": str(tmp_path / "out"),
                   "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", SCRIPT, *args], cwd=REPO_ROOT, env=environment, capture_output=True, text=True,
                          timeout=timeout)


def hidden_hydra(tmp_path: Path) -> str:
    """A PYTHONPATH on which hydra and omegaconf fail to import, as on the GPU machine."""
    for name in ("hydra", "omegaconf"):
        (tmp_path / "hide" / name).mkdir(parents=True)
        (tmp_path / "hide" / name / "__init__.py").write_text("raise ImportError('not installed here')\n")
    return str(tmp_path / "hide")


STEPS = ("cuda", "preset", "engines", "balanced", "lockstep", "table2")
CONDITIONS = ("mnist_iid_b", "mnist_noniid_b", "mnist_iid_ub", "mnist_noniid_ub")  # the CIFAR-10 ones need the copy
METHODS = ("fedavg", "fedprox", "normnorm", "momentum", "fednnnn")
# Table 2's MNIST accuracies (%), per condition and method (scripts/paper_targets/fednnnn_table2_accuracy.csv)
PAPER = {"mnist_iid_b": (99.0, 99.0, 99.1, 99.1, 99.2), "mnist_noniid_b": (98.2, 98.1, 99.0, 99.2, 99.1),
         "mnist_iid_ub": (99.1, 99.1, 99.2, 99.1, 99.2), "mnist_noniid_ub": (93.5, 87.9, 97.1, 96.9, 98.9)}


def returned(out: Path) -> list[str]:
    """The files under ``out``, checked as the device tool brings them back: at most 8 plain files, at
    most 2 folders down, 16 MiB each, names of letters, digits, '.', '_' and '-'."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8
    for p in files:
        assert len(p.relative_to(out).parts) <= 3 and p.stat().st_size <= 16 * 2**20
        assert re.fullmatch(r"[A-Za-z0-9._-]+", p.name)
    return sorted(p.name for p in files)


def figures_of(out: Path) -> dict:
    return {(r["step"], r["figure"]): r for r in csv.DictReader(open(out / "figures.csv"))}


@pytest.mark.slow
def test_the_draw_runs_end_to_end_and_brings_back_what_the_device_returns(tmp_path):
    data = mnist_files(tmp_path / "mnist")
    done = gpu_check(tmp_path, "draw", GPU_CHECK_DATA=str(data), GPU_CHECK_RUNS=str(tmp_path / "no-runs"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert returned(out) == ["draw.log", "figures.csv", "report.md", "runs.tar.gz", "table2_resume_1.tar.gz"]

    figures = figures_of(out)
    assert {s: figures[s, "status"]["value"] for s in STEPS} == dict.fromkeys(STEPS, "ok")
    # cuda: tests/test_cuda.py was collected and ran (here every test skips: no CUDA)
    assert int(figures["cuda", "tests_skipped"]["value"]) >= 10 and figures["cuda", "tests_failed"]["value"] == "0"
    # preset and balanced: timed from process start to exit, split per round, accuracy beside Table 2's
    assert float(figures["preset", "wall_s"]["value"]) > 0 and figures["preset", "wall_s"]["target"] == "60"
    for step, paper in (("preset", "98.9"), ("balanced", "99.1")):
        assert figures[step, "engine"]["value"] == "SequentialEngine"  # engine=auto on a CPU
        parts = [float(figures[step, f]["value"]) for f in ("train_s_per_round", "eval_s_per_round",
                                                            "bookkeeping_s_per_round", "round_s")]
        assert abs(sum(parts[:3]) - parts[3]) < 1e-3
        assert figures[step, "final_acc_pct"]["target"] == paper and figures[step, "rounds_done"]["value"] == "3"
    # engines: both engines' training time and the ratio of the two; equal results
    seq, bat = (float(figures["engines", f"{e}_train_s_per_round"]["value"]) for e in ("sequential", "batched"))
    assert float(figures["engines", "train_ratio"]["value"]) == pytest.approx(seq / bat, rel=1e-2)
    assert float(figures["engines", "max_test_acc_diff_pct"]["value"]) == 0.0
    # lockstep: bench_lockstep.py's figures (its synthetic stand-in at tiny size): eq. (1) of round_plan
    assert int(figures["lockstep", "mnist_noniid_b_critical_path"]["value"]) == 60  # 5 epochs x 600 / 50
    ub = {k: float(figures["lockstep", f"mnist_noniid_ub_{k}"]["value"]) for k in ("critical_path", "lock_steps",
                                                                                  "mean_steps", "occupancy")}
    assert ub["lock_steps"] >= ub["critical_path"] > 10 * ub["mean_steps"] and 0 < ub["occupancy"] <= 1
    assert float(figures["lockstep", "one_eager_aten_calls"]["value"]) > 10
    # table2: every condition's five methods as one population, each beside its Table 2 number; the
    # non-IID UB population's FedNNNN equals the engines step's batched run (population == alone)
    for condition in CONDITIONS:
        assert figures["table2", f"{condition}_state"]["value"] == "finished; ok"
        for method, paper in zip(METHODS, PAPER[condition]):
            assert figures["table2", f"{condition}_{method}_final_acc_pct"]["target"] == str(paper)
            assert figures["table2", f"{condition}_{method}_rounds_done"]["value"] == "3"
    assert float(figures["table2", "fednnnn_member_vs_alone_max_test_acc_diff_pct"]["value"]) == 0.0
    log = (out / "draw.log").read_text()
    assert log.count("population of 5 runs (jobs") == 4 and "every run starts at round 1" in log
    # What comes back is committed: it names no folder of the machine (the run folders, $OUT, the checkout).
    assert str(tmp_path) not in log and str(REPO_ROOT) not in log and "<work>/" in log

    with tarfile.open(out / "runs.tar.gz") as tar:
        names = tar.getnames()
    runs = {str(Path(n).parent) for n in names if n.endswith("rounds.csv")}
    table2 = {f"table2/{c}/{m}" for c in CONDITIONS for m in METHODS}
    assert runs == {"preset", "balanced", "engines/batched", "engines/sequential", *table2}
    assert not [n for n in names if n.endswith(("checkpoint.pt", "output_layer.csv"))]
    # the resume archive: every run finished, so each keeps only what says so (no checkpoint)
    with tarfile.open(out / "table2_resume_1.tar.gz") as tar:
        kept = {n for n in tar.getnames() if tar.getmember(n).isfile()}
    assert kept == {f"{run}/{f}" for run in table2 for f in ("config.yaml", "rounds.csv", "summary.json", "run.json")}
    report = (out / "report.md").read_text()
    assert "| fednnnn | " in report and "(98.9) [3]" in report and "torch " in report
    assert done.stdout.rstrip().endswith(report.rstrip().splitlines()[-1])  # printed at the end


@pytest.mark.slow
def test_table2_resumes_its_populations_from_the_archive_an_earlier_draw_brought_back(tmp_path):
    """``draw table2`` twice on one condition, each adding a round (``GPU_CHECK_ADD_ROUNDS=1``): the
    second, given the first's resume archive (as committed under outputs/reproductions/fednnnn_gpu/resume),
    goes on from the first's round; the earlier rows are the first's, timing columns apart."""
    data = mnist_files(tmp_path / "mnist")
    env = dict(GPU_CHECK_DATA=str(data), GPU_CHECK_CONDITIONS="mnist_noniid_ub", GPU_CHECK_ADD_ROUNDS="1")
    first = gpu_check(tmp_path, "draw", "table2", GPU_CHECK_RUNS=str(tmp_path / "no-runs"), **env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = tmp_path / "out"
    assert returned(out) == ["draw.log", "figures.csv", "report.md", "runs.tar.gz", "table2_resume_1.tar.gz"]
    with tarfile.open(out / "table2_resume_1.tar.gz") as tar:
        tar.extractall(tmp_path / "first", filter="data")
    sweep = tmp_path / "first" / "table2" / "mnist_noniid_ub"
    assert sorted(p.name for p in sweep.iterdir()) == sorted(METHODS)
    for method in METHODS:  # unfinished: each run whole, checkpoint included
        assert (sweep / method / "checkpoint.pt").is_file() and not (sweep / method / "summary.json").exists()
    reached = data_rows(sweep / "fednnnn" / "rounds.csv")
    assert 1 <= reached < 3 and figures_of(out)["table2", "mnist_noniid_ub_state"]["value"].endswith("stopped as asked")

    committed = tmp_path / "committed"
    committed.mkdir()
    (out / "table2_resume_1.tar.gz").rename(committed / "table2_resume_1.tar.gz")
    second = gpu_check(tmp_path, "draw", "table2", GPU_CHECK_RUNS=str(committed), OUT=str(tmp_path / "out2"), **env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    log = (tmp_path / "out2" / "draw.log").read_text()
    assert "table2: continuing from 1 resume archive(s)" in log and "(5 checkpoints)" in log
    assert log.count(f"resuming after round {reached}") == 5
    with tarfile.open(tmp_path / "out2" / "table2_resume_1.tar.gz") as tar:
        tar.extractall(tmp_path / "second", filter="data")
    for method in METHODS:
        before = pd.read_csv(sweep / method / "rounds.csv")
        after = pd.read_csv(tmp_path / "second" / "table2" / "mnist_noniid_ub" / method / "rounds.csv")
        assert len(after) > len(before)
        timing = ["train_s", "eval_s", "wall_s"]
        pd.testing.assert_frame_equal(after.iloc[: len(before)].drop(columns=timing), before.drop(columns=timing))


@pytest.mark.slow
def test_table2_trains_a_cifar10_condition_on_the_carried_copy_under_its_label(tmp_path):
    """A CIFAR-10 condition of Table 2 reads the JPEG copy carried beside the MNIST folder
    (``.gpudata/cifar10-jpeg``, as prepare puts it), and its runs say so; without the copy the
    condition is "not reached" and the step still ends well."""
    from test_cifar10_copy import smooth_images, write_copy

    data = mnist_files(tmp_path / "gpudata" / "mnist")
    env = dict(GPU_CHECK_DATA=str(data), GPU_CHECK_CONDITIONS="cifar10_iid_b", GPU_CHECK_ADD_ROUNDS="1",
               GPU_CHECK_RUNS=str(tmp_path / "no-runs"))
    missing = gpu_check(tmp_path, "draw", "table2", OUT=str(tmp_path / "out0"), **env)
    assert missing.returncode == 0, missing.stdout[-3000:] + missing.stderr[-3000:]
    state = figures_of(tmp_path / "out0")["table2", "cifar10_iid_b_state"]["value"]
    assert state.startswith("not reached (no CIFAR-10 copy carried: cifar10-jpeg/cifar10_jpeg_q75.npz.xz beside ")

    (tmp_path / "gpudata" / "cifar10-jpeg").mkdir()
    write_copy(tmp_path / "gpudata" / "cifar10-jpeg" / "cifar10_jpeg_q75.npz.xz", smooth_images(300, 0),
               smooth_images(100, 1), np.arange(300) % 10, np.arange(100) % 10)
    done = gpu_check(tmp_path, "draw", "table2", **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = figures_of(tmp_path / "out")
    assert figures["table2", "cifar10_iid_b_state"]["value"].endswith("stopped as asked")
    for method, paper in zip(METHODS, (81.3, 81.4, 81.2, 83.1, 84.7)):  # Table 2's CIFAR10 IID - B column
        assert figures["table2", f"cifar10_iid_b_{method}_final_acc_pct"]["target"] == str(paper)
        assert figures["table2", f"cifar10_iid_b_{method}_rounds_done"]["target"] == "3"
    for archive in (tmp_path / "out").glob("table2_resume_*.tar.gz"):  # the CIFAR-10 CNN's checkpoints: several
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / "runs", filter="data")
    run = tmp_path / "runs" / "table2" / "cifar10_iid_b" / "fednnnn"
    assert "CIFAR-10 (JPEG q75 copy)" in (run / "run.json").read_text()
    assert "name: cifar10_jpeg" in (run / "config.yaml").read_text()


def test_a_rerun_of_one_step_runs_only_that_step(tmp_path):
    data = mnist_files(tmp_path / "mnist")
    done = gpu_check(tmp_path, "draw", "preset", GPU_CHECK_DATA=str(data))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "out" / "figures.csv")))
    assert [r["step"] for r in rows if r["figure"] == "status"] == ["preset"]


@pytest.mark.parametrize("case", ["no wheels", "incomplete wheels", "no data", "unknown stage", "unknown step",
                                  "no stage", "no CUDA", "no niidbench job", "unknown partition", "unknown reading",
                                  "too many chains", "unknown condition", "bad add-rounds"])
def test_refusals_are_one_line_and_write_nothing(tmp_path, case):
    data = str(mnist_files(tmp_path / "mnist"))
    env, args = {"GPU_CHECK_DATA": data}, ["draw"]
    expected = {"no wheels": "hydra-core and omegaconf are not installed and there is no",
                "incomplete wheels": "lacks antlr4_python3_runtime-4.9.3-py3-none-any.whl",
                "no data": "lacks train-images-idx3-ubyte.gz",
                "unknown stage": "stage must be one of prepare, draw,",
                "unknown step": "unknown step 'colum'; choose from cuda, preset, engines, balanced, lockstep, table2",
                "unknown condition": "unknown condition 'mnist_iid'; choose from mnist_iid_b, mnist_noniid_b, "
                                     "mnist_iid_ub, mnist_noniid_ub, cifar10_iid_b, cifar10_noniid_b, cifar10_iid_ub, "
                                     "cifar10_noniid_ub (comma-separated)",
                "bad add-rounds": "--add-rounds must be a number of rounds, 0 or more (got '-1')",
                "no stage": "usage: bash",
                "no CUDA": "torch sees no CUDA device here",
                "no niidbench job": "usage: bash scripts/bench/gpu_check.sh niidbench JOB [JOB ...]",
                "unknown partition": "job 'c4' must be c1, c2, c3, dir05 or iid",
                "unknown reading": "job 'c2:after': the reading after ':' must be after_step or gradient",
                "too many chains": "at most 3 chains side by side (got 4)"}[case]
    if case == "no wheels":
        env["PYTHONPATH"] = hidden_hydra(tmp_path)
    elif case == "incomplete wheels":
        wheels = tmp_path / "whl"
        wheels.mkdir()
        for name in ("hydra_core-1.3.8-py3-none-any.whl", "omegaconf-2.3.1-py3-none-any.whl"):
            (wheels / name).write_bytes(b"")
        env["GPU_CHECK_WHEELS"] = str(wheels)
    elif case == "no data":
        os.remove(Path(data) / "train-images-idx3-ubyte.gz")
    elif case == "unknown stage":
        args = ["drw"]
    elif case == "unknown step":
        args = ["draw", "colum"]
    elif case == "unknown condition":
        env["GPU_CHECK_CONDITIONS"] = "mnist_iid_b,mnist_iid"
    elif case == "bad add-rounds":
        env["GPU_CHECK_ADD_ROUNDS"] = "-1"
    elif case == "no stage":
        args = []
    elif case.startswith(("no niidbench", "unknown partition", "unknown reading", "too many")):
        args = {"no niidbench job": ["niidbench"], "unknown partition": ["niidbench", "iid", "c2+c4"],
                "unknown reading": ["niidbench", "c2:after"], "too many chains": ["niidbench", "c1", "c2", "c3", "iid"]}[case]
    elif case == "no CUDA":
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
        env["GPU_CHECK_DEVICE"] = "cuda"
    done = gpu_check(tmp_path, *args, timeout=120, **env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_niidbench_one_process_a_run_then_a_population_resumes_its_runs(tmp_path):
    """``GPU_CHECK_SPLIT=run`` runs each (method, seed) as its own process into the population's
    layout; its resume archive, carried to the next call in a folder of archives (as committed
    under outputs/reproductions/niidbench_gpu/resume), is unpacked and taken up by populations (the
    run folders' settings match, so the resume is accepted and the finished runs left as they are)."""
    data = mnist_files(tmp_path / "mnist")
    done = gpu_check(tmp_path, "niidbench", "c2:after_step", GPU_CHECK_DATA=str(data), GPU_CHECK_SPLIT="run",
                     GPU_CHECK_RUNS=str(tmp_path / "none"))  # not the checkout's .gpuruns
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "niidbench.tar.gz", "niidbench_c2_after_step.log", "niidbench_device.log",
        "niidbench_resume_c2_after_step.tar.gz"]
    log = (out / "niidbench_c2_after_step.log").read_text()
    assert "split c2:after_step: exit codes 0 0 0" in log
    assert [line for line in log.splitlines() if line.startswith("== ")] == [
        f"== c2:after_step scaffold_seed{s}" for s in range(3)]
    with tarfile.open(out / "niidbench_resume_c2_after_step.tar.gz") as tar:
        tar.extractall(tmp_path / "carried", filter="data")
    runs = tmp_path / "carried" / "readings" / "mnist_c2_after_step"
    for s in range(3):
        run = runs / f"scaffold_seed{s}"
        assert (run / "checkpoint.pt").is_file() and data_rows(run / "rounds.csv") == 2
        assert "correction: after_step" in (run / "config.yaml").read_text()

    (tmp_path / "archives").mkdir()
    (out / "niidbench_resume_c2_after_step.tar.gz").rename(tmp_path / "archives" / "niidbench_resume_c2_after_step.tar.gz")
    again = gpu_check(tmp_path, "niidbench", "c2:after_step", GPU_CHECK_DATA=str(data),
                      GPU_CHECK_RUNS=str(tmp_path / "archives"), OUT=str(tmp_path / "out2"))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "continuing the 3 checkpointed runs" in again.stdout
    log = (tmp_path / "out2" / "niidbench_c2_after_step.log").read_text()
    assert "job c2:after_step: exit 0" in log, log[-3000:]
    assert log.count("is complete (2 of 2 rounds); nothing to do") == 3, log[-3000:]
    assert "3 of 3 jobs done, 0 failed" in log, log[-3000:]  # listed, though their run.json is untouched


def test_the_regularizers_stage_times_both_gradients_and_finds_the_same_bits(tmp_path):
    """``regularizers``: bench_regularizers.py through the stage, at tiny size on the CPU: a row per
    regularizer with both timings, and the same updates from the closed form and from autograd."""
    done = gpu_check(tmp_path, "regularizers", GPU_CHECK_DATA=str(mnist_files(tmp_path / "mnist")))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (tmp_path / "out" / "regularizers.log").read_text()
    rows = [line for line in log.splitlines() if line.startswith(("FedProx", "SCAFFOLD", "FedLap"))]
    assert len(rows) == 3 and all(line.endswith("the same bits") for line in rows), log
    assert "10 clients x 64 images" in log


def test_resume_archives_are_split_under_the_size_limit_and_taken_back_whole(tmp_path):
    """resume_runs.pack_parts (table2's state): run folders, never split, into as few archives under
    the limit as they need (an estimate too low is halved until it fits), earlier archives removed,
    the files asked left out; take() brings every run back."""
    import resume_runs  # scripts/bench/ is on the tests' path

    rng = np.random.default_rng(0)
    root, out = tmp_path / "work", tmp_path / "out"
    runs = [f"table2/mnist_iid_b/{m}" for m in ("fedavg", "fedprox", "normnorm", "momentum")]
    for run in runs:
        (root / run).mkdir(parents=True)
        (root / run / "checkpoint.pt").write_bytes(rng.bytes(300_000))  # floats: incompressible
        (root / run / "clients.csv").write_bytes(rng.bytes(200_000))  # estimated at a third: too low
        (root / run / "rounds.csv").write_text("round\n1\n")
    done = root / runs[-1]
    leave_out = {done / "checkpoint.pt", done / "clients.csv"}
    out.mkdir()
    (out / "table2_resume_7.tar.gz").write_bytes(b"an earlier state")
    written, left = resume_runs.pack_parts(root, runs, out, "table2", leave_out, max_files=4, limit=1_000_000)
    assert left == [] and 2 <= len(written) <= 4
    assert sorted(p.name for p in out.iterdir()) == [f"table2_resume_{i}.tar.gz" for i in range(1, len(written) + 1)]
    assert all(p.stat().st_size <= 1_000_000 for p in written)
    assert resume_runs.take(out, "table2", tmp_path / "back") == 3  # the done run keeps no checkpoint
    for run in runs:
        kept = sorted(p.name for p in (tmp_path / "back" / run).iterdir())
        assert kept == (["rounds.csv"] if run == runs[-1] else ["checkpoint.pt", "clients.csv", "rounds.csv"])
    # one file allowed: the runs that do not fit are named, not packed
    written, left = resume_runs.pack_parts(root, runs, out, "table2", leave_out, max_files=1, limit=1_000_000)
    with tarfile.open(written[0]) as tar:
        packed = {str(Path(n).parent) for n in tar.getnames() if n.endswith("rounds.csv")}
    assert len(written) == 1 and left and sorted(packed | set(left)) == sorted(runs) and not packed & set(left)
