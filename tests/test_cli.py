"""End to end through ``python -m fedrun``: run directories, determinism, resume, errors, sweeps.

Every run is tiny (synthetic 400/100 images of 28x28, MLP 784-8-10, 4 clients, 2 a round) and
writes under pytest's tmp_path; most of a run's few seconds is Python and torch start-up.
"""
from __future__ import annotations

import json
import math
import shutil
import signal
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import CONF_DIR, RESUMABLE, TINY, fedrun_ok, run_fedrun, same_run, snapshot, start_fedrun, wait_for_rows

from fedrun.harness.recorder import CLIENT_COLUMNS, LAYER_COLUMNS, ROUND_COLUMNS

pytestmark = pytest.mark.slow

RUN_FILES = ("config.yaml", "rounds.csv", "layers.csv", "clients.csv", "partition.csv",
             "summary.json", "checkpoint.pt")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """The reference run: TINY with FedNNNN (the default aggregator), seed 0, 2 rounds."""
    tmp = tmp_path_factory.mktemp("cli")
    fedrun_ok([*TINY, f"hydra.run.dir={tmp}/run"], tmp)
    return tmp / "run"


# ----------------------------------------------------------------------------- the run directory

def test_run_directory_contents(base_run):
    for name in RUN_FILES:
        assert (base_run / name).is_file(), name
    rounds = pd.read_csv(base_run / "rounds.csv")
    assert list(rounds.columns) == ROUND_COLUMNS
    assert rounds["round"].tolist() == [1, 2]
    assert rounds["clients"].tolist() == [2, 2]  # m = max(0.5 * 4, 1)
    assert rounds["skipped"].tolist() == [0, 0]
    assert rounds["test_acc"].between(0, 1).all() and rounds["sent_test_acc"].notna().all()
    assert rounds["val_acc"].isna().all()  # validation_fraction = 0
    assert rounds["N_conv"].isna().all()  # the MLP has no conv layer ...
    assert rounds["N_fc"].tolist() == pytest.approx(rounds["N"].tolist(), rel=1e-6)  # ... all FC
    assert rounds["N_over_E"].tolist() == pytest.approx((rounds["N"] / rounds["E"]).tolist(), rel=1e-6)
    assert rounds["server_step_sum"].tolist() == pytest.approx(rounds["server_step"].cumsum().tolist(), rel=1e-6)
    # FedNNNN round 1 (d_0 = 0): the server step is beta E = 0.7 E (eq. 9, 12).
    assert rounds["server_step"][0] == pytest.approx(0.7 * rounds["E"][0], rel=1e-5)
    # The round's time split: local training and evaluation are parts of the whole round.
    assert (rounds["train_s"] > 0).all() and (rounds["eval_s"] > 0).all()
    assert (rounds["train_s"] + rounds["eval_s"] <= rounds["wall_s"]).all()

    layers = pd.read_csv(base_run / "layers.csv")
    assert list(layers.columns) == LAYER_COLUMNS
    assert len(layers) == 2 * 2  # rounds x layers (fc1, fc2)
    assert layers["layer"].tolist() == ["fc1", "fc2"] * 2 and set(layers["type"]) == {"fc"}
    assert layers["params"].tolist() == [784 * 8 + 8, 8 * 10 + 10] * 2
    for t, group in layers.groupby("round"):
        row = rounds[rounds["round"] == t].iloc[0]
        assert math.sqrt((group["N"] ** 2).sum()) == pytest.approx(row["N"], rel=1e-6)
        assert row["E"] <= group["E"].sum() * (1 + 1e-7)

    clients = pd.read_csv(base_run / "clients.csv")
    assert list(clients.columns) == CLIENT_COLUMNS
    assert len(clients) == 2 * 2 and clients["round"].tolist() == [1, 1, 2, 2]
    partition = pd.read_csv(base_run / "partition.csv")
    assert partition["client"].tolist() == [0, 1, 2, 3]
    assert partition["examples"].sum() == 400  # shards: 8 shards of 50
    assert (partition[[f"class_{c}" for c in range(10)]].sum(axis=1) == partition["examples"]).all()
    sizes = dict(zip(partition["client"], partition["examples"]))
    for _, c in clients.iterrows():
        assert c["examples"] == sizes[c["client"]]
        assert c["steps"] == math.ceil(c["examples"] / 50)  # E = 1, B = 50
    for t, group in clients.groupby("round"):
        # weights n_k / n, and E = sum_k p_k ||dw_k|| (eq. 5) from the per-client rows.
        assert group["weight"].tolist() == pytest.approx((group["examples"] / group["examples"].sum()).tolist())
        e = (group["weight"] * group["update_norm"]).sum()
        assert e == pytest.approx(rounds[rounds["round"] == t]["E"].iloc[0], rel=1e-6)

    summary = json.loads((base_run / "summary.json").read_text())
    assert summary["aggregator"] == "fednnnn" and summary["rounds"] == 2
    assert summary["final_test_acc"] == pytest.approx(rounds["test_acc"].iloc[-1])
    assert summary["best_test_acc"] == pytest.approx(rounds["test_acc"].max())

    config = yaml.safe_load((base_run / "config.yaml").read_text())
    assert config["hyperparams"]["num_clients"] == 4 and config["model"]["hidden"] == [8]
    assert config["dataset"]["name"] == "synthetic" and config["seed"] == 0

    ckpt = torch.load(base_run / "checkpoint.pt", weights_only=False)
    assert ckpt["round"] == 2 and ckpt["partition"] == summary["partition_fingerprint"]
    assert ckpt["offsets"]["rounds"] == (base_run / "rounds.csv").stat().st_size


def test_N_le_E_in_every_row(base_run):
    for name in ("rounds.csv", "layers.csv"):
        df = pd.read_csv(base_run / name)
        assert len(df) > 0
        # Proposition 1, up to the CSV's 8 significant digits.
        assert (df["N"] <= df["E"] * (1 + 1e-7)).all(), name
        assert (df["N"] > 0).all()


def test_same_seed_same_results(base_run, tmp_path):
    fedrun_ok([*TINY, f"hydra.run.dir={tmp_path}/again"], tmp_path)
    same_run(base_run, tmp_path / "again")
    assert (base_run / "config.yaml").read_bytes() == (tmp_path / "again" / "config.yaml").read_bytes()


def test_other_aggregator_sees_same_clients_and_batches(base_run, tmp_path):
    fedrun_ok([*TINY, "aggregator=fedavg", f"hydra.run.dir={tmp_path}/fedavg"], tmp_path)
    a = pd.read_csv(base_run / "clients.csv")
    b = pd.read_csv(tmp_path / "fedavg" / "clients.csv")
    cols = ["round", "client", "examples", "weight", "steps"]
    assert a[cols].equals(b[cols])
    assert (base_run / "partition.csv").read_bytes() == (tmp_path / "fedavg" / "partition.csv").read_bytes()
    # Round 1 starts from the same w_0 with the same batches: identical client updates, N and E.
    r1a = pd.read_csv(base_run / "rounds.csv").iloc[0]
    r1b = pd.read_csv(tmp_path / "fedavg" / "rounds.csv").iloc[0]
    assert (r1a["N"], r1a["E"], r1a["train_loss"]) == (r1b["N"], r1b["E"], r1b["train_loss"])
    assert a[a["round"] == 1]["update_norm"].tolist() == b[b["round"] == 1]["update_norm"].tolist()
    # FedAvg's server step is N itself; the models then differ.
    assert r1b["server_step"] == pytest.approx(r1b["N"], rel=1e-6)
    assert pd.isna(r1b["sent_test_acc"])  # FedAvg sends the average model: nothing else to evaluate
    assert json.loads((tmp_path / "fedavg" / "summary.json").read_text())["aggregator"] == "fedavg"


# ----------------------------------------------------------------------------- resume

def test_killed_run_resumes_to_identical_results(tmp_path):
    straight = tmp_path / "straight"
    fedrun_ok([*RESUMABLE, f"hydra.run.dir={straight}"], tmp_path)

    killed = tmp_path / "killed"
    proc = start_fedrun([*RESUMABLE, f"hydra.run.dir={killed}"], tmp_path)
    try:
        wait_for_rows(proc, killed / "rounds.csv", 2)
        proc.send_signal(signal.SIGKILL)  # its lock on the directory dies with it: the resume below proves it
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    done = torch.load(killed / "checkpoint.pt", weights_only=False)["round"]
    assert 1 <= done < 5
    assert json.loads((straight / "summary.json").read_text())["rounds"] == 5
    assert not (killed / "summary.json").exists()

    # Resuming with different settings is refused and leaves the CSVs as they are.
    before = snapshot(killed)
    bad = run_fedrun([*RESUMABLE, "seed=1", f"hydra.run.dir={killed}", "resume=true"], tmp_path)
    assert bad.returncode != 0
    assert "fedrun: error: resume=true" in bad.stderr and "seed" in bad.stderr
    assert snapshot(killed) == before

    fedrun_ok([*RESUMABLE, f"hydra.run.dir={killed}", "resume=true", "checkpoint_every=3"], tmp_path)  # may differ
    same_run(straight, killed)
    a = torch.load(straight / "checkpoint.pt", weights_only=False)
    b = torch.load(killed / "checkpoint.pt", weights_only=False)
    assert a["round"] == b["round"] == 5
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert a["step_sum"] == b["step_sum"]


def test_resume_refuses_csvs_of_another_version(base_run, tmp_path):
    # A run written by an older fedrun (here: rounds.csv without the timing columns train_s,
    # eval_s): appending this version's rows would misalign every column, so resume refuses
    # before touching any file.
    run_dir = tmp_path / "old"
    shutil.copytree(base_run, run_dir)
    rounds = pd.read_csv(run_dir / "rounds.csv").drop(columns=["train_s", "eval_s"])
    rounds.to_csv(run_dir / "rounds.csv", index=False)
    (run_dir / "summary.json").unlink()
    before = snapshot(run_dir)
    proc = run_fedrun([*TINY, f"hydra.run.dir={run_dir}", "resume=true"], tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"fedrun: error: {run_dir / 'rounds.csv'}: has other columns than this fedrun writes")
    assert snapshot(run_dir) == before


def test_existing_run_dir_is_refused(base_run, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(base_run, run_dir)
    before = snapshot(run_dir)
    proc = run_fedrun([*TINY, "seed=1", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedrun: error: hydra.run.dir=")
    assert "resume=true" in lines[0] and "Traceback" not in proc.stderr
    assert snapshot(run_dir) == before


def test_existing_run_without_checkpoint_keeps_its_config(base_run, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(base_run, run_dir)
    (run_dir / "checkpoint.pt").unlink()
    before = snapshot(run_dir)
    proc = run_fedrun([*TINY, "seed=1", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode != 0 and "already holds a run" in proc.stderr
    assert snapshot(run_dir) == before


# ----------------------------------------------------------------------------- errors

# Out-of-range values are test_bad_input.py's catalogue (one driver process); these are the
# three kinds of error Hydra itself raises, seen through a fresh process each.
@pytest.mark.parametrize("overrides,setting", [
    (["aggregator=nosuch"], "aggregator"),
    (["nosuchkey=1"], "nosuchkey"),
    (["hyperparams.lr=abc"], "hyperparams.lr"),
])
def test_bad_values_one_line_error(overrides, setting, tmp_path):
    proc = run_fedrun([*TINY, *overrides, f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"fedrun: error: {setting}=")
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "run").exists()  # refused before any run directory is touched


def test_help_lists_config_groups(tmp_path):
    proc = fedrun_ok(["--help"], tmp_path)
    out = proc.stdout
    section = out.split("Config groups (group=option; * the one in use):\n", 1)[1].split("\n\n", 1)[0]
    groups: dict[str, str] = {}
    for line in section.splitlines():  # "  group: a, b," then indented continuation lines
        if not line.startswith("   "):
            name, _, rest = line.strip().partition(": ")
            groups[name] = rest
        else:
            groups[name] += " " + line.strip()
    for group, default in (("aggregator", "fednnnn"), ("model", "mnist_cnn"), ("partition", "shards")):
        names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))  # every YAML file of the group
        assert groups[group] == ", ".join(f"*{n}" if n == default else n for n in names)
    assert "synthetic" in groups["dataset"] and "*default" in groups["hyperparams"]


def test_multirun_creates_one_dir_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    fedrun_ok(["-m", "aggregator=fedavg,fednnnn", *TINY, "hyperparams.rounds=1", f"hydra.sweep.dir={sweep}"],
              tmp_path)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(runs) == 2
    assert [r.name for r in runs] == ["0", "1"]  # the job number: any number of overrides fits
    assert [yaml.safe_load((r / "config.yaml").read_text())["choices"]["aggregator"] for r in runs] == ["fedavg", "fednnnn"]
    names = [json.loads((r / "summary.json").read_text())["aggregator"] for r in runs]
    assert names == ["fedavg", "fednnnn"]
    for r in runs:
        assert len(pd.read_csv(r / "rounds.csv")) == 1


def test_divergence_stops_with_nan_error(tmp_path):
    run_dir = tmp_path / "nan"
    proc = run_fedrun([*TINY, "aggregator=fedavg", "hyperparams.lr=1e6", "hyperparams.rounds=4",
                       f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fedrun: error: round ") and "NaN" in last
    assert "Traceback" not in proc.stderr
    rounds = pd.read_csv(run_dir / "rounds.csv")  # what was written stays parseable
    failed = int(last.split()[3].rstrip(":"))  # "fedrun: error: round T: ..."
    assert rounds["round"].tolist() == list(range(1, failed))
    assert len(pd.read_csv(run_dir / "clients.csv")) == 2 * (failed - 1)
    assert not (run_dir / "summary.json").exists()


def test_a_failed_sweep_job_does_not_stop_the_sweep(tmp_path):
    # Both jobs diverge at round 1; the second still runs, and the sweep exits non-zero, listing both.
    sweep = tmp_path / "sweep"
    proc = run_fedrun(["-m", *TINY, "aggregator=fedavg,fedprox", "hyperparams.lr=1e30",
                       f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 3
    assert sorted(d.name for d in sweep.iterdir() if d.is_dir() and not d.name.startswith(".")) == ["0", "1"]
    assert proc.stderr.count("NaN or Inf") >= 2 and "2 job(s) of the sweep failed" in proc.stderr


def test_threads_are_shared_among_side_by_side_jobs_and_a_busy_machine_is_told(monkeypatch, caplog):
    """joblib's n_jobs and submitit_local's array_parallelism share the cores among the jobs that run
    at once; at PyTorch's default, a machine with more runnable work than cores gets one line of
    advice (threads=1), never a changed thread count (it would change how sums round)."""
    import logging
    import os

    import torch
    from omegaconf import OmegaConf

    from fedrun.command import cli

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr("fedrun.client.parallel.available_cores", lambda: 4)
    before = torch.get_num_threads()
    try:
        for launcher, settings, expected in (("joblib", {"n_jobs": 2}, 2), ("joblib", {"n_jobs": -1}, 1),
                                             ("submitit_local", {"array_parallelism": 256}, 1),
                                             ("submitit_local", {"array_parallelism": 2}, 2)):
            hydra_cfg = OmegaConf.create({"runtime": {"choices": {"hydra/launcher": launcher}}, "launcher": settings})
            cli._thread_budget(OmegaConf.create({"threads": None}), hydra_cfg)
            assert torch.get_num_threads() == expected, (launcher, settings)
        torch.set_num_threads(before)
        plain = OmegaConf.create({"runtime": {"choices": {"hydra/launcher": "basic"}}})
        for load, said in ((5.9, False), (6.5, True)):  # 4 cores: told from a load of 6
            monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="fedrun"):
                cli._thread_budget(OmegaConf.create({"threads": None}), plain)
            assert ("threads=1 runs a job several times faster" in caplog.text) == said, load
            assert torch.get_num_threads() == before  # PyTorch's default, busy or not
    finally:
        torch.set_num_threads(before)
