"""A full disk, for real: a run directory on a small tmpfs filled at a chosen write.

Every case mounts a tmpfs (``mount -t tmpfs``: root only; the tests skip, saying why, where the
process may not mount), runs ``fedrun`` with the file system filled just before one of its
writes (:mod:`disk_full_driver`: a ballast file written until the kernel says ENOSPC, so the
write meets a real full disk, torch's wrapped error included), and checks what the user gets:
exit 4, one line ``fedrun: error: no space left on the device writing to <dir> (after round t);
free space, then resume with resume=true``, no traceback (fedrun.log's and TensorBoard's
included), no temporary file left; then frees the space and resumes, to the same CSVs and
summary as an uninterrupted run.  In a population only the run whose disk is full stops.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import REPO_ROOT, fedrun_ok, python_run, same_run

pytestmark = pytest.mark.slow

DRIVER = REPO_ROOT / "tests" / "disk_full_driver.py"
# 40 clients a round: output_layer.csv grows by ~14 KB a round, so its append always needs new
# pages of the tmpfs, and a full disk cuts it mid-row.  A snapshot at round 2.
BASE = ["dataset=synthetic", "dataset.load.num_train=400", "dataset.load.num_test=100", "model=mlp",
        "model.hidden=[8]", "hyperparams.num_clients=40", "hyperparams.client_fraction=1.0", "hyperparams.rounds=3",
        "snapshots=[2]", "progress=false"]
BEFORE = "before the first round"


def mount_tmpfs(where: Path, size: str = "4m") -> None:
    """Mount a tmpfs of ``size`` at ``where``, or skip the test saying why it cannot be."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs these tests as root)")
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")


def unmount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB tmpfs (unmounted after the test)."""
    where = tmp_path / f"tmpfs_{uuid.uuid4().hex[:8]}"
    mount_tmpfs(where)
    try:
        yield where
    finally:
        unmount(where)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The run, uninterrupted."""
    tmp = tmp_path_factory.mktemp("straight")
    fedrun_ok([*BASE, f"hydra.run.dir={tmp}/run"], tmp)
    return tmp / "run"


def run_full(mount: Path, point: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``fedrun ARGS`` with ``mount`` filled before the write ``point`` (disk_full_driver.py)."""
    return python_run([str(DRIVER), str(mount), point, "--", *args], cwd, timeout=300)


def errors(stderr: str) -> list[str]:
    """The lines of stderr that are not the log's (``[time][logger][LEVEL] ...``)."""
    return [line for line in stderr.splitlines() if not line.startswith("[")]


def no_traceback(stderr: str) -> None:
    for what in ("Traceback", "--- Logging error ---", "Exception in thread"):
        assert what not in stderr, stderr[-3000:]


def no_space_line(run: Path, when: str) -> str:
    return (f"fedrun: error: no space left on the device writing to {run} ({when}); free space, then resume "
            "with resume=true")


def leftovers(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*.tmp"))


# (where the disk fills, the round the line names, extra settings)
POINTS = [
    ("now", BEFORE, []),  # before fedrun starts: config.yaml
    ("partition", BEFORE, []),
    ("csv:clients.csv:0", BEFORE, []),  # a CSV's header
    ("save:checkpoint.pt:0", BEFORE, []),  # the start's checkpoint
    ("csv:output_layer.csv:2", "after round 1", []),  # an append, cut mid-row
    ("save:round_0002.pt:2", "after round 1", []),  # a snapshot
    ("save:checkpoint.pt:2", "after round 1", []),  # torch.save's RuntimeError, raised while handling ENOSPC
    ("log:2", "after round 2", []),  # fedrun.log: the line is lost, quietly; the next write stops the run
    ("json:run.json", "after round 3", []),
    ("json:summary.json", "after round 3", []),
    ("dashboard:2", "after round 1", ["logger=tensorboard"]),  # TensorBoard's writer thread
]


@pytest.mark.parametrize("point,when,extra", POINTS, ids=[p[0] for p in POINTS])
def test_full_disk_is_one_line_and_the_run_resumes_to_the_same_results(point, when, extra, straight, tmpfs,
                                                                       tmp_path):
    if point.startswith("dashboard"):
        pytest.importorskip("tensorboard")
    run = tmpfs / "run"
    args = [*BASE, *extra, f"hydra.run.dir={run}"]
    proc = run_full(tmpfs, point, args, tmp_path)
    assert proc.returncode == 4, proc.stderr[-3000:]
    no_traceback(proc.stderr)
    assert errors(proc.stderr) == [no_space_line(run, when)]
    assert not run.exists() or leftovers(run) == []
    if point == "csv:output_layer.csv:2":  # the disk filled mid-row: a half row after round 1's checkpoint
        assert not (run / "output_layer.csv").read_bytes().endswith(b"\n")
    (tmpfs / "ballast").unlink()
    if when == BEFORE and point != "save:checkpoint.pt:0":
        # Stopped before round 1's checkpoint: the resume of a run without one starts from round 1
        # (test_trust.py's test_resume_without_checkpoint_starts_from_round_one); one such point
        # below resumes here too.
        return
    resumed = fedrun_ok([*args, "resume=true"], tmp_path)
    no_traceback(resumed.stderr)
    same_run(straight, run)
    assert leftovers(run) == []


def test_population_only_the_run_on_the_full_disk_stops(tmp_path):
    """hydra/launcher=population, three runs; job 1's directory (a tmpfs mounted there: a sweep
    folder holds no link, but its job folders may be mount points) fills in round 2.  It stops in
    one line; the others finish; the sweep exits 4; after freeing space, the sweep resumed ends as
    one never interrupted."""
    sweep = tmp_path / "sweep"
    job1 = sweep / "1"
    mount_tmpfs(job1)
    try:
        args = ["-m", *BASE, "hydra/launcher=population", "engine=batched", "aggregator=fedavg,fedprox,fednnnn"]
        proc = run_full(job1, "csv:output_layer.csv:2", [*args, f"hydra.sweep.dir={sweep}"], tmp_path)
        assert proc.returncode == 4, proc.stderr[-3000:]
        no_traceback(proc.stderr)
        line = no_space_line(job1, "after round 1").replace("fedrun: error: ", "fedrun: error: job 1: ")
        assert line in errors(proc.stderr)
        assert (sweep / "0" / "summary.json").is_file() and (sweep / "2" / "summary.json").is_file()
        assert not (job1 / "summary.json").exists() and leftovers(job1) == []
        (job1 / "ballast").unlink()
        fedrun_ok([*args, f"hydra.sweep.dir={sweep}", "resume=true"], tmp_path, timeout=300)
        straight = tmp_path / "straight"
        fedrun_ok([*args, f"hydra.sweep.dir={straight}"], tmp_path, timeout=300)
        for job in "012":
            same_run(straight / job, sweep / job)
    finally:
        unmount(job1)
