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
from conftest import (TINY, data_rows, edit_same_length, fedrun_ok, run_fedrun, same_run, snapshot, start_fedrun,
                      wait_for_rows)

from fedrun import aggregators as A
from fedrun.data.preparation import prepare
from fedrun.data.datasets import synthetic
from fedrun.errors import NoSpaceError, RunDirectoryError
from fedrun.harness.federated_run import Federation
from fedrun.client.local_training import LocalTraining
from fedrun.models.nets import MLP
from fedrun.data.partition import iid
from fedrun.harness.rundir import check_own_targets, load_checkpoint
from fedrun.harness.simulation import simulate

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


def _crafted(run: Path, node: str, replacement: dict) -> None:
    """The run's config.yaml with its ``model`` (or ``dataset.load``) node replaced."""
    import yaml

    config = yaml_of(run)
    parent, key = (config, "model") if node == "model" else (config["dataset"], "load")
    parent[key] = replacement
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def test_loss_surface_builds_only_fedrun_models_and_loaders_and_reads_no_code(finished, tmp_path):
    """A crafted config.yaml names anything to call: os.system, fedrun's own functions that write
    (fedrun.harness.recorder.write_json) or run a job from a list of overrides (fedrun.command.cli.run_overrides,
    which would reach torch.load(weights_only=False) through a run's settings), a node nested in a
    model's settings, an interpolation OmegaConf would resolve into one.  Each is refused in one
    line (exit 2) before anything is called or written."""
    from scripts.pd import loss_surface
    marker = tmp_path / "pwned"
    touch = {"_target_": "os.system", "command": f"touch {marker}"}
    crafted = {
        "os.system": ("model", touch),
        "os.system through fedrun": ("model", {**touch, "_target_": "fedrun.harness.rundir.os.system"}),
        "a fedrun function that writes": ("model", {"_target_": "fedrun.harness.recorder.write_json", "obj": {"a": 1},
                                                    "path": str(marker)}),
        "run_overrides as a model": ("model", {"_target_": "fedrun.command.cli.run_overrides", "run_dir": str(marker),
                                               "overrides": ["dataset=synthetic", "resume=true"]}),
        "run_overrides as the loader": ("dataset.load", {"_target_": "fedrun.command.cli.run_overrides",
                                                         "overrides": ["model=mlp"], "run_dir": str(marker)}),
        "write_json as the loader": ("dataset.load", {"_target_": "fedrun.harness.recorder.write_json", "obj": [],
                                                      "path": str(marker)}),
        "a nested node": ("model", {"_target_": "fedrun.models.nets.MLP", "hidden": touch}),
        "Hydra's _args_": ("model", {"_target_": "fedrun.models.nets.MLP", "_args_": [f"touch {marker}"]}),
        "an interpolation": ("model", {"_target_": "fedrun.models.nets.MLP",
                                       "hidden": "${oc.decode:'{_target_: os.system, command: touch x}'}"}),
        "fedrun's own non-model": ("model", {"_target_": "fedrun.data.partition.iid"}),
        "no target": ("model", {"hidden": [8]}),
    }
    for i, (what, (node, replacement)) in enumerate(crafted.items()):
        run = copy_of(finished, tmp_path, f"crafted{i}")
        _crafted(run, node, replacement)
        with pytest.raises(RunDirectoryError) as error:
            loss_surface.build(run, "cpu")
        message = str(error.value)
        assert message.startswith(f"{run / 'config.yaml'}: {node}") and "\n" not in message, (what, message)
        out = tmp_path / f"out{i}"
        assert loss_surface.main([str(run), "--grid", "3", "--out", str(out)]) == 2, what
        assert not marker.exists() and not out.exists(), what
    evil = copy_of(finished, tmp_path, "evil_checkpoint")
    torch.save({"round": 2, "params": Payload(marker)}, evil / "checkpoint.pt")
    assert loss_surface.main([str(evil), "--grid", "3", "--out", str(tmp_path / "out")]) == 2
    assert not marker.exists() and not (tmp_path / "out").exists()
    # A run's own config is built: the model and the loader fedrun ran.
    model, data = loss_surface.build(finished, "cpu")
    assert type(model).__name__ == "MLP" and len(data.train_y) > 0
    check_own_targets(yaml_of(finished), "config.yaml")


def yaml_of(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())


def test_the_allowlists_hold_every_model_and_dataset_fedrun_ships(conf_dir):
    """MODEL_TARGETS and DATA_LOADERS name every model class and dataset loader of conf/, and
    each exists (a new preset's model must be added there to get loss surfaces)."""
    import importlib

    import yaml

    from fedrun.harness.rundir import DATA_LOADERS, MODEL_TARGETS

    models = {yaml.safe_load(p.read_text())["_target_"] for p in (conf_dir / "model").glob("*.yaml")}
    loaders = {yaml.safe_load(p.read_text())["load"]["_target_"] for p in (conf_dir / "dataset").glob("*.yaml")}
    assert models <= set(MODEL_TARGETS) and loaders <= set(DATA_LOADERS)
    for target in (*MODEL_TARGETS, *DATA_LOADERS):
        module, _, name = target.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), target


# ----------------------------------------------------------------------------- no write through a link

LINK_LINE = "fedrun: error: {run} holds a symbolic link {name}; fedrun does not follow links in a run directory"


@pytest.mark.parametrize("name,target_exists", [("partition.csv", True), ("fedrun.log", True),
                                                ("summary.json.tmp", False), ("checkpoint.pt.tmp", False),
                                                ("models/round_0002.pt", False)])
def test_resume_refuses_a_link_planted_in_the_run_directory(finished, tmp_path, name, target_exists):
    """A link to a file outside (an existing one: overwritten or appended to if followed; a new
    one: created) is refused in one line before anything is written, inside or outside."""
    run = copy_of(finished, tmp_path)
    (run / "summary.json").unlink()  # an unfinished run: the resume would write everything again
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    if target_exists:
        victim.write_text("not fedrun's\n")
    (run / name).parent.mkdir(exist_ok=True)
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(victim)
    before = snapshot(run)
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode == 2
    assert one_line(proc) == LINK_LINE.format(run=run, name=name)
    assert snapshot(run) == before and (run / name).is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == (["victim"] if target_exists else [])
    assert not target_exists or victim.read_text() == "not fedrun's\n"


def test_a_new_run_refuses_dangling_links_and_creates_nothing_elsewhere(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "rounds.csv").symlink_to(elsewhere / "rounds.csv")
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 2
    assert one_line(proc) == LINK_LINE.format(run=run, name="rounds.csv")
    assert list(elsewhere.iterdir()) == [] and [p.name for p in run.iterdir()] == ["rounds.csv"]


def test_the_run_directory_itself_may_be_a_link(finished, tmp_path):
    """outputs/ on another disk: the run directory's own path may be, or pass through, a link."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "outputs").symlink_to(disk)
    fedrun_ok([*TINY, f"hydra.run.dir={tmp_path / 'outputs' / 'run'}"], tmp_path)
    (tmp_path / "direct").symlink_to(disk / "run")
    fedrun_ok([*TINY, f"hydra.run.dir={tmp_path / 'direct'}", "resume=true"], tmp_path)
    same_run(finished, disk / "run")


def test_run_files_are_never_written_through_a_link(tmp_path):
    """Below the directory check: a temporary file is created exclusively after a leftover one
    (here a link) is unlinked, so the link's target is untouched; an append or a new CSV through a
    link is refused (O_NOFOLLOW)."""
    from fedrun.harness.recorder import CsvLog, write_json
    from fedrun.harness.rundir import write_atomic

    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "summary.json.tmp").symlink_to(victim)
    write_json({"a": 1}, tmp_path / "summary.json")
    assert victim.read_text() == "keep\n" and not (tmp_path / "summary.json.tmp").exists()
    assert (tmp_path / "summary.json").read_text() == '{\n  "a": 1\n}\n'
    (tmp_path / "x.csv").symlink_to(victim)
    with pytest.raises(RunDirectoryError, match="holds a symbolic link x.csv"):
        CsvLog(tmp_path / "x.csv", ["a"])
    log = CsvLog(tmp_path / "y.csv", ["a"])
    (tmp_path / "y.csv").unlink()
    (tmp_path / "y.csv").symlink_to(victim)
    with pytest.raises(RunDirectoryError, match="holds a symbolic link y.csv"):
        log.append([{"a": 1}])
    with pytest.raises(RunDirectoryError, match="holds a symbolic link y.csv"):
        CsvLog(tmp_path / "y.csv", ["a"], truncate_to=2)
    assert victim.read_text() == "keep\n"
    with pytest.raises(KeyboardInterrupt):  # interrupted mid-write: no temporary file left
        write_atomic(tmp_path / "z.json", lambda f: (f.write("half"), (_ for _ in ()).throw(KeyboardInterrupt)))
    assert not (tmp_path / "z.json.tmp").exists() and not (tmp_path / "z.json").exists()


def test_a_signal_while_the_temporary_file_is_created_leaves_none(tmp_path, monkeypatch):
    """A signal that arrives while os.open runs is raised just after the file is created, before
    write_atomic has the descriptor (SIGTERM during a checkpoint left checkpoint.pt.tmp behind):
    the file is removed all the same, and the old checkpoint is untouched."""
    from fedrun.harness import rundir

    real = rundir._open_fd

    def created_then_interrupted(path, flags, mode=0o666):
        os.close(real(path, flags, mode))
        raise KeyboardInterrupt

    (tmp_path / "checkpoint.pt").write_bytes(b"round 1")
    monkeypatch.setattr(rundir, "_open_fd", created_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        rundir.write_atomic(tmp_path / "checkpoint.pt", lambda f: f.write(b"round 2"), binary=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"round 1"


def test_a_full_disk_loses_a_log_line_without_a_traceback(tmp_path, capsys):
    """logging prints '--- Logging error ---' and a traceback for a failed emit; fedrun.log's
    handler drops the line when the disk is full (the run's next write stops it in one line)."""
    import logging

    from fedrun.harness.rundir import RunLog

    handler = RunLog(tmp_path / "fedrun.log")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    handler.stream.write = full
    handler.stream.flush = full
    record = logging.LogRecord("fedrun", logging.INFO, __file__, 1, "round 2/3", None, None)
    handler.emit(record)
    handler.close()
    assert capsys.readouterr().err == ""
    other = RunLog(tmp_path / "other.log")
    other.stream.write = lambda *args: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error"))
    other.emit(record)  # any other error is still reported as logging reports it
    other.close()
    assert "--- Logging error ---" in capsys.readouterr().err


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

@pytest.mark.parametrize("damage", ["truncated", "deleted", "edited"])
def test_resume_refuses_a_damaged_csv_and_touches_nothing(finished, tmp_path, damage):
    run = copy_of(finished, tmp_path)
    (run / "summary.json").unlink()
    clients = run / "clients.csv"
    size = clients.stat().st_size
    if damage == "truncated":
        clients.write_bytes(clients.read_bytes()[: clients.stat().st_size // 2])
    elif damage == "deleted":
        clients.unlink()
    else:
        edit_same_length(clients)
        assert clients.stat().st_size == size
    before = snapshot(run)
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith(f"fedrun: error: {clients}: ")
    assert {"truncated": "shorter than the", "deleted": "missing, but the checkpoint records",
            "edited": f"its first {size} bytes are not those the checkpoint records (edited since)"}[damage] in line
    assert snapshot(run) == before
    assert not any(b"\0" in data for name, data in before.items() if name.endswith(".csv"))  # no padding


def test_resume_refuses_a_config_yaml_edited_to_match_new_settings(finished, tmp_path):
    """Editing config.yaml's lr and resuming with that lr would make one run of two learning rates,
    recorded as one: the checkpoint's digest of the settings refuses it."""
    import yaml

    run = copy_of(finished, tmp_path)
    (run / "summary.json").unlink()
    config = yaml.safe_load((run / "config.yaml").read_text())
    lr = config["hyperparams"]["lr"]
    config["hyperparams"]["lr"] = config["local"]["lr"] = lr * 2  # both places config.yaml records it
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    before = snapshot(run)
    proc = run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true", f"hyperparams.lr={lr * 2}"], tmp_path)
    assert proc.returncode == 2
    assert one_line(proc) == (f"fedrun: error: {run / 'config.yaml'}: its settings are not those the checkpoint's "
                              "2 rounds ran with (edited since); restore it or start a new run directory (nothing "
                              "was written)")
    assert snapshot(run) == before
    # With the original settings on both sides the run resumes (and is complete).
    (run / "config.yaml").write_bytes((finished / "config.yaml").read_bytes())
    assert run_fedrun([*TINY, f"hydra.run.dir={run}", "resume=true"], tmp_path).returncode == 0


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
    import fedrun.harness.recorder

    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # round 2's checkpoint (after rounds 0 and 1): full half-way through the file
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(fedrun.harness.recorder.torch, "save", save)
    run = tmp_path / "full"
    with pytest.raises(NoSpaceError) as error:
        tiny_simulation(run)
    assert str(error.value) == (f"no space left on the device writing to {run} (after round 1); free space, "
                                "then resume with resume=true")
    assert not (run / "checkpoint.pt.tmp").exists()
    assert load_checkpoint(run / "checkpoint.pt")["round"] == 1
    monkeypatch.setattr(fedrun.harness.recorder.torch, "save", real_save)
    tiny_simulation(run, resume=True)
    same_run(tmp_path / "straight", run)


def test_a_damaged_checkpoint_or_summary_on_resume_is_one_line(tmp_path):
    """A checkpoint that loads as tensors but is not fedrun's is refused in one line; a finished
    run whose summary.json is not JSON gets it written again from its CSVs."""
    straight = tmp_path / "straight"
    tiny_simulation(straight)
    for name, content in (("list", [1, 2]), ("no offsets", {"round": 1, "params": {}, "buffers": {},
                                                            "aggregator": {}, "step_sum": 0.0})):
        run = tmp_path / name.replace(" ", "_")
        shutil.copytree(straight, run)
        (run / "summary.json").unlink()
        torch.save(content, run / "checkpoint.pt")
        before = snapshot(run)
        with pytest.raises(RunDirectoryError, match=rf"^{run / 'checkpoint.pt'}: not a fedrun checkpoint"):
            tiny_simulation(run, resume=True)
        assert snapshot(run) == before
    run = tmp_path / "summary"
    shutil.copytree(straight, run)
    (run / "summary.json").write_text("{half a summ")
    tiny_simulation(run, resume=True)
    same_run(straight, run)


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
