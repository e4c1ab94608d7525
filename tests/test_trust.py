"""What a careless or hostile user can do to a run directory, and what fedrun does about it.

No code from a checkpoint or a run's config; one process per run directory; a resume that would
corrupt a run is refused before a byte is written; a finished run is left alone; a full disk and
Ctrl-C end in one line with the run resumable; a model that turns NaN/Inf is caught whichever
model (sent or evaluated) it is.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import TINY, data_rows, fedrun_ok, run_fedrun, same_run, snapshot, start_fedrun, wait_for_rows

from fedrun import aggregators as A
from fedrun.data import prepare, synthetic
from fedrun.errors import NoSpaceError, RunDirectoryError
from fedrun.federated_run import Federation
from fedrun.local_training import LocalTraining
from fedrun.models import MLP
from fedrun.partition import iid
from fedrun.rundir import check_own_targets, load_checkpoint
from fedrun.simulation import simulate

pytestmark = pytest.mark.slow

# Slower rounds (batch size 2, all 4 clients) so that a second process can meet a running one.
SLOW = [*TINY, "hyperparams.client_fraction=1.0", "hyperparams.batch_size=2", "hyperparams.rounds=5"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("trust")
    fedrun_ok([*TINY, f"hydra.run.dir={tmp}/run"], tmp)
    return tmp / "run"


def copy_of(run: Path, tmp_path: Path, name: str = "copy") -> Path:
    target = tmp_path / name
    shutil.copytree(run, target)
    return target


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


class Payload:
    """Unpickling this runs a shell command: what a crafted checkpoint.pt would hold."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ----------------------------------------------------------------------------- no code from files

def test_crafted_checkpoint_runs_no_code_on_resume(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    (run / "summary.json").unlink()
    marker = tmp_path / "pwned"
    torch.save({"round": 1, "params": Payload(marker)}, run / "checkpoint.pt")
    before = snapshot(run)
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith(f"fedrun: error: {run / 'checkpoint.pt'}: cannot be read safely")
    assert "nothing was written" in line
    assert not marker.exists()
    assert snapshot(run) == before


def test_own_checkpoints_load_with_weights_only(finished):
    ckpt = load_checkpoint(finished / "checkpoint.pt")
    assert ckpt["round"] == 2 and set(ckpt["offsets"]) >= {"rounds", "clients"}


def test_loss_surface_builds_only_fedrun_objects_and_reads_no_code(finished, tmp_path):
    import loss_surface  # scripts/ is on the path (pyproject's pytest pythonpath)
    marker = tmp_path / "pwned"
    for i, target in enumerate(["os.system", "fedrun.rundir.os.system", "builtins.exec"]):
        run = copy_of(finished, tmp_path, f"target{i}")
        text = (run / "config.yaml").read_text()
        text = text.replace("_target_: fedrun.models.MLP", f"_target_: {target}\n  command: touch {marker}")
        (run / "config.yaml").write_text(text)
        with pytest.raises(RunDirectoryError, match=rf"model\._target_={target} is not one of fedrun's own objects"):
            loss_surface.build(run, "cpu")
        code = loss_surface.main([str(run), "--grid", "3", "--out", str(tmp_path / "out")])
        assert code == 2
    evil = copy_of(finished, tmp_path, "evil_checkpoint")
    torch.save({"round": 2, "params": Payload(marker)}, evil / "checkpoint.pt")
    assert loss_surface.main([str(evil), "--grid", "3", "--out", str(tmp_path / "out")]) == 2
    assert not marker.exists() and not (tmp_path / "out").exists()
    check_own_targets({"model": {"_target_": "fedrun.models.MLP"}, "x": [{"_target_": "fedrun.partition.iid"}]},
                      "config.yaml")  # fedrun's own: accepted


# ----------------------------------------------------------------------------- one process per run

def test_second_process_on_a_running_directory_is_refused(tmp_path):
    # 60 rounds of ~0.1 s: the first run is still going when the second has started Python.
    run, rounds = tmp_path / "run", 60
    long = [*SLOW, f"hydra.run.dir={run}", f"hyperparams.rounds={rounds}"]
    first = start_fedrun(long, tmp_path)
    try:
        wait_for_rows(first, run / "rounds.csv", 1)
        second = run_fedrun([*long, "resume=true"], tmp_path)
        assert first.poll() is None, "the first run ended while the second ran: the test proves nothing"
        assert second.returncode == 2
        assert one_line(second) == (f"fedrun: error: {run}: another fedrun process is running in this run "
                                    "directory; wait for it to finish (or stop it), then resume with resume=true")
        assert first.wait(180) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    for name in ("rounds", "clients", "layers"):  # no round written twice
        written = pd.read_csv(run / f"{name}.csv")["round"]
        assert sorted(set(written)) == list(range(1, rounds + 1)) and written.is_monotonic_increasing, name
    assert data_rows(run / "rounds.csv") == rounds


# ----------------------------------------------------------------------------- resume never corrupts

@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_resume_refuses_a_damaged_csv_and_touches_nothing(finished, tmp_path, damage):
    run = copy_of(finished, tmp_path)
    (run / "summary.json").unlink()
    clients = run / "clients.csv"
    if damage == "truncated":
        clients.write_bytes(clients.read_bytes()[: clients.stat().st_size // 2])
    else:
        clients.unlink()
    before = snapshot(run)
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith(f"fedrun: error: {clients}: ")
    assert ("shorter than the" if damage == "truncated" else "missing, but the checkpoint records") in line
    assert snapshot(run) == before
    assert not any(b"\0" in data for name, data in before.items() if name.endswith(".csv"))  # no padding


def test_finished_run_resumed_again_is_left_alone(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = snapshot(run)
    mtimes = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"{run} is complete (2 of 2 rounds); nothing to do" in proc.stderr
    assert snapshot(run) == before
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == mtimes


def test_resume_without_checkpoint_starts_from_round_one(finished, tmp_path):
    run = tmp_path / "fresh"
    proc = fedrun_ok([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert f"resume=true: no checkpoint.pt in {run}; starting from round 1" in proc.stderr
    same_run(finished, run)
    # A finished run whose checkpoint is gone cannot be resumed: starting over would overwrite it.
    (run / "checkpoint.pt").unlink()
    before = snapshot(run)
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode == 2 and "holds summary.json but no checkpoint.pt" in one_line(proc)
    assert snapshot(run) == before


def test_killed_before_its_first_checkpoint_resumes(finished, tmp_path):
    """A run stopped before any checkpoint (an earlier version's, killed in round 1): CSV headers
    and rows but no checkpoint.pt and no summary.json.  The resume starts it over, to the same bytes."""
    run = copy_of(finished, tmp_path)
    for name in ("checkpoint.pt", "summary.json"):
        (run / name).unlink()
    with open(run / "rounds.csv", "a") as f:
        f.write("1,half a row")  # cut mid-write
    proc = fedrun_ok([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert "stopped before its first one); starting it over from round 1" in proc.stderr
    same_run(finished, run)


def test_a_new_run_checkpoints_its_start_before_any_round(tmp_path):
    """The initial state is saved before round 1 (round 0): a kill at any instant resumes."""
    # A SIGKILL while round 1 trains: the CSVs hold their headers, checkpoint.pt round 0, and a
    # half-written checkpoint.pt.tmp of a later save may be left behind.
    fresh = tmp_path / "fresh"
    proc = start_fedrun([*SLOW, f"hydra.run.dir={fresh}"], tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (fresh / "checkpoint.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert load_checkpoint(fresh / "checkpoint.pt")["round"] in (0, 1)  # the start, or round 1 if it was fast
    (fresh / "checkpoint.pt.tmp").write_bytes(b"half a checkpoint")
    fedrun_ok([*SLOW, f"hydra.run.dir={fresh}", "resume=true"], tmp_path)
    straight = tmp_path / "straight"
    fedrun_ok([*SLOW, f"hydra.run.dir={straight}"], tmp_path)
    same_run(straight, fresh)
    assert not (fresh / "checkpoint.pt.tmp").exists()


def test_rerun_of_a_finished_sweep_refuses_every_job_and_keeps_their_logs(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "hyperparams.rounds=1", "aggregator=fedavg,fedprox", f"hydra.sweep.dir={sweep}"]
    fedrun_ok(args, tmp_path)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2 and all((job / "fedrun.log").stat().st_size > 0 for job in jobs)
    before = {job.name: snapshot(job) for job in jobs}
    proc = run_fedrun(args, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("already holds a run") >= 2 and "2 job(s) of the sweep failed" in proc.stderr
    assert {job.name: snapshot(job) for job in jobs} == before


# ----------------------------------------------------------------------------- disk full, Ctrl-C

def tiny_simulation(run_dir: Path, resume: bool = False) -> dict:
    data = prepare(synthetic(num_train=120, num_test=40, image_size=6, noise=0.5), None, None)
    return simulate(run_dir, data, lambda: MLP(image_size=6, hidden=[8]), iid, A.fedavg(),
                    LocalTraining(batch_size=20), Federation(rounds=3, num_clients=4, client_fraction=0.5),
                    resume=resume, progress=False)


def test_disk_full_is_one_line_and_the_run_resumes(tmp_path, monkeypatch):
    tiny_simulation(tmp_path / "straight")
    import fedrun.recorder

    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # round 2's checkpoint (after rounds 0 and 1): full half-way through the file
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(fedrun.recorder.torch, "save", save)
    run = tmp_path / "full"
    with pytest.raises(NoSpaceError) as error:
        tiny_simulation(run)
    assert str(error.value) == (f"no space left on the device writing to {run} (after round 1); free space, "
                                "then resume with resume=true")
    assert not (run / "checkpoint.pt.tmp").exists()
    assert load_checkpoint(run / "checkpoint.pt")["round"] == 1
    monkeypatch.setattr(fedrun.recorder.torch, "save", real_save)
    tiny_simulation(run, resume=True)
    same_run(tmp_path / "straight", run)


@pytest.mark.parametrize("sig,code,what", [(signal.SIGINT, 130, "interrupted"),
                                            (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_and_sigterm_are_one_line_and_the_run_resumes(sig, code, what, tmp_path):
    # 30 rounds of ~0.1 s: on a loaded machine 5 could end between two polls of rounds.csv.
    long = [*SLOW, "hyperparams.rounds=30"]
    straight = tmp_path / "straight"
    fedrun_ok([*long, f"hydra.run.dir={straight}"], tmp_path)
    run = tmp_path / "interrupted"
    proc = start_fedrun([*long, f"hydra.run.dir={run}"], tmp_path, capture=True)
    try:
        wait_for_rows(proc, run / "rounds.csv", 2)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == code
    # Round 2's rows are written before its checkpoint: a signal between the two leaves round 1
    # as the last complete round (and the resume cuts round 2's rows).
    done = load_checkpoint(run / "checkpoint.pt")["round"]
    assert 1 <= done < 30
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if not line.startswith("[")]  # not the log's INFO lines
    assert errors == [f"fedrun: {what} after round {done}; resume with resume=true"]
    assert not list(run.glob("*.tmp"))
    fedrun_ok([*long, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    same_run(straight, run)


# ----------------------------------------------------------------------------- NaN / Inf

def test_inf_in_the_sent_model_alone_is_caught(tmp_path):
    # Norm-Norm with beta = 1e39 sends w + beta (E/N) mean: beyond float32's range (3.4e38), while
    # the evaluated average model stays finite.  Round 1 must fail, naming the sent model.
    run = tmp_path / "inf"
    proc = run_fedrun([*TINY, "aggregator=normnorm", "aggregator.beta=1e39", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 3
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("fedrun: error: round 1: parameter ") and "of the sent model is NaN or Inf" in line
    assert data_rows(run / "rounds.csv") == 0 and load_checkpoint(run / "checkpoint.pt")["round"] == 0
