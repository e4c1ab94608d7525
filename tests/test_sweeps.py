"""Sweeps as the unit of work: objectives for Hydra's sweepers, failed jobs, short job folders,
runs from Python, the user's own configs, results as one table.

Every run here is TINY (2 rounds, 4 clients, a small MLP on synthetic images)."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO_ROOT, TINY, _cli_env, fedrun_ok, run_fedrun, same_run, start_fedrun

import fedrun
from fedrun import results
from fedrun.command.cli import precheck_sweep
from fedrun.errors import ConfigError, RunDirectoryError

EXAMPLE = REPO_ROOT / "docs" / "examples" / "own_configs"


def has(plugin: str) -> bool:
    return importlib.util.find_spec(f"hydra_plugins.{plugin}") is not None


# ----------------------------------------------------------------------------- the objective

def test_objective_names_and_values(tmp_path):
    summary = fedrun.run(TINY + ["objective=mean_test_acc_last_2"], run_dir=tmp_path / "a")
    rounds = pd.read_csv(tmp_path / "a" / "rounds.csv")
    assert results.objective(summary, tmp_path / "a", "mean_test_acc_last_2") == pytest.approx(rounds.test_acc.mean())
    assert results.objective(summary, tmp_path / "a", "best_test_acc") == summary["best_test_acc"]
    with pytest.raises(ConfigError, match=r"^objective=final_val_acc: this run has no such value"):
        results.objective(summary, tmp_path / "a", "final_val_acc")  # no validation split
    with pytest.raises(ConfigError, match=r"^objective=accuracy: choose one of: best_test_acc"):
        fedrun.run(TINY + ["objective=accuracy"], run_dir=tmp_path / "b")
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(not has("hydra_optuna_sweeper"), reason="pip install 'fedrun[sweeps]'")
def test_optuna_tunes_fednnnn_beta_and_gamma(tmp_path):
    sweep = tmp_path / "optuna"
    proc = run_fedrun(["-m", *TINY, "aggregator=fednnnn", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3",
                       "hydra.sweeper.direction=maximize", "aggregator.beta=interval(0.5,1.0)",
                       "aggregator.gamma=interval(0.5,0.95)", f"hydra.sweep.dir={sweep}"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"aggregator.beta", "aggregator.gamma"}
    trials = results.summaries(sweep)
    assert len(trials) == 3 and best["best_value"] == pytest.approx(trials.best_test_acc.max())
    assert trials["aggregator.beta"].nunique() == 3  # the sampled values are columns of the table


@pytest.mark.skipif(not has("hydra_optuna_sweeper"), reason="pip install 'fedrun[sweeps]'")
def test_a_stored_study_resumed_shows_its_trial_numbers(tmp_path):
    """A second sweep into a stored study adds trials 2 and 3: its table says so beside jobs 0 and 1,
    and each row's sampled value is that trial's in the study."""
    import optuna

    study = ["-m", *TINY, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=maximize",
             "hydra.sweeper.storage=sqlite:///optuna.db", "hydra.sweeper.study_name=again",
             "aggregator.beta=interval(0.5,1.1)"]
    for name in ("first", "second"):
        proc = run_fedrun([*study, f"hydra.sweep.dir={tmp_path / name}"], tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert "holds 2 trials already: this sweep's jobs 0, 1, ... are its trials 2, 3" in proc.stdout
    table = (tmp_path / "second" / "sweep_table.md").read_text().splitlines()
    assert table[0].startswith("| job | trial | aggregator.beta |")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:4]]
    trials = optuna.load_study(study_name="again", storage=f"sqlite:///{tmp_path}/optuna.db").trials
    for job, trial, beta, *_ in rows:
        assert int(trial) == int(job) + 2
        assert float(beta) == pytest.approx(trials[int(trial)].params["aggregator.beta"], rel=1e-5)


@pytest.mark.skipif(not has("hydra_optuna_sweeper"), reason="pip install 'fedrun[sweeps]'")
def test_a_sweeper_that_stops_before_any_job_is_said_not_tabled(tmp_path):
    """A storage Optuna cannot open stops the sweeper before its first job: no table of 0 jobs,
    one line saying that none ran."""
    sweep = tmp_path / "optuna"
    proc = run_fedrun(["-m", *TINY, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
                       f"hydra.sweeper.storage=sqlite:///{tmp_path}/no/such/folder/optuna.db",
                       "aggregator.beta=interval(0.5,1.0)", f"hydra.sweep.dir={sweep}"], tmp_path, timeout=300)
    assert proc.returncode != 0
    assert "0 of 0 jobs done" not in proc.stdout
    assert "fedrun: error: no job of the sweep ran: Hydra's sweeper stopped before the first one" in proc.stderr


# ----------------------------------------------------------------------------- failed jobs

LAUNCHERS = [pytest.param([], id="basic"),
             pytest.param(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], id="joblib",
                          marks=pytest.mark.skipif(not has("hydra_joblib_launcher"), reason="fedrun[sweeps]")),
             pytest.param(["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5"], id="submitit_local",
                          marks=pytest.mark.skipif(not has("hydra_submitit_launcher"), reason="fedrun[sweeps]"))]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_failed_job_is_listed_and_the_others_finish(launcher, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_fedrun(["-m", *TINY, "hyperparams.lr=0.1,1e30,0.05", *launcher, f"hydra.sweep.dir={sweep}"],
                      tmp_path, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]  # the failed job's own exit code (divergence)
    assert "fedrun: error: job 1: round 1: " in proc.stderr and "NaN or Inf" in proc.stderr
    assert "1 job(s) of the sweep failed" in proc.stderr and "Traceback" not in proc.stderr
    # The closing table says how the job ended, not only that it failed.
    table = proc.stdout + proc.stderr
    assert re.search(r"^1\s+1e\+30\s+-\s+diverged at round 1$", table, re.M), table[-2000:]
    assert "2 of 3 jobs done, 1 failed (1 diverged)" in table
    assert (sweep / "0" / "summary.json").is_file() and (sweep / "2" / "summary.json").is_file()
    assert not (sweep / "1" / "summary.json").exists()


def test_a_bad_value_anywhere_in_a_sweep_is_one_line_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_fedrun(["-m", *TINY, "aggregator=fedavg,fedprx", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 2 and not sweep.exists()
    assert proc.stderr.startswith("fedrun: error: aggregator=fedprx: unknown option; did you mean fedprox? choose one of:")
    assert len(proc.stderr.strip().splitlines()) == 1
    # The same check in-process: a value out of range in a later position, a missing plugin.
    with pytest.raises(ConfigError, match=r"^hyperparams\.lr=-1: must be > 0$"):
        precheck_sweep([*TINY, "hyperparams.lr=0.1,-1", "seed=0,1"])
    with pytest.raises(ConfigError, match=r"^hydra/launcher=joblb: unknown option;"):
        precheck_sweep([*TINY, "hydra/launcher=joblb", "seed=0,1"])
    precheck_sweep([*TINY, "seed=range(0,3)", "aggregator=fednnnn"])
    # interval(...) is a sampler's to draw from: the basic sweeper would end in a traceback.
    with pytest.raises(ConfigError, match=r"^aggregator\.beta=interval\(0\.5,1\.0\): is a range a sampler draws"):
        precheck_sweep([*TINY, "seed=range(0,3)", "aggregator.beta=interval(0.5,1.0)", "aggregator=fednnnn"])
    if has("hydra_optuna_sweeper"):
        precheck_sweep([*TINY, "hydra/sweeper=optuna", "aggregator.beta=interval(0.5,1.0)", "aggregator=fednnnn"])


def test_a_rerun_sweep_lists_only_its_own_failures(tmp_path):
    sweep = tmp_path / "sweep"
    for other in ("sweep", "host-123-456"):  # notes another sweep left (an older one, a concurrent one)
        (sweep / ".failed_jobs" / other).mkdir(parents=True)
        (sweep / ".failed_jobs" / other / "7.json").write_text('{"job": 7, "error": "stale", "exit_code": 3}')
    again = run_fedrun(["-m", *TINY, "hyperparams.rounds=1", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert again.returncode == 0 and "stale" not in again.stderr, again.stderr[-2000:]
    assert (sweep / ".failed_jobs" / "host-123-456" / "7.json").is_file()  # not this sweep's to remove


def test_two_sweeps_into_one_folder_report_their_own_jobs(tmp_path):
    """Two processes sweep the same jobs into one folder at once: each job runs once (the other
    process is refused its directory), and each process lists only the jobs it failed."""
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "hyperparams.batch_size=2", "aggregator=fedavg,fedprox,fednnnn", f"hydra.sweep.dir={sweep}"]
    procs = [start_fedrun(args, tmp_path, capture=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    failed = [{int(m) for m in re.findall(r"fedrun: error: job (\d+):", err)} for _, err in outputs]
    for proc, fails in zip(procs, failed):
        assert proc.returncode == (2 if fails else 0)
    # Each job ran in one process and was refused its directory in the other: every job is listed
    # as failed by exactly one process, the one that did not run it.
    assert not failed[0] & failed[1] and failed[0] | failed[1] == {0, 1, 2}
    done = {int(p.name) for p in sweep.iterdir() if p.name.isdigit() and (p / "summary.json").is_file()}
    assert done == {0, 1, 2}


def test_a_sweep_with_named_job_folders_lists_its_own_jobs(tmp_path):
    """``hydra.sweep.subdir`` naming the folders (``fedavg_seed0``, as the paper scripts do): the
    closing table lists the sweep's jobs by folder name, and a later sweep into the same folder
    lists only its own (``run.json`` records the sweep that ran each job)."""
    sweep = tmp_path / "sweep"
    named = [f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra:runtime.choices.aggregator}_seed${seed}"]
    first = run_fedrun(["-m", *TINY, "aggregator=fedavg,fednnnn", *named], tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = [line.split() for line in first.stdout.splitlines()]
    head = next(i for i, row in enumerate(rows) if row[:1] == ["job"])
    assert [(r[0], r[1], r[-1]) for r in rows[head + 1: head + 3]] == [("fedavg_seed0", "fedavg", "done"),
                                                                          ("fednnnn_seed0", "fednnnn", "done")]
    assert f"2 of 2 jobs done, 0 failed; results in {sweep.resolve()}" in first.stdout
    second = run_fedrun(["-m", *TINY, "aggregator=fedprox", "seed=0,1", *named], tmp_path, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    rows = [line.split() for line in second.stdout.splitlines()]
    head = next(i for i, row in enumerate(rows) if row[:1] == ["job"])
    assert [r[0] for r in rows[head + 1: head + 3]] == ["fedprox_seed0", "fedprox_seed1"]
    assert f"2 of 2 jobs done, 0 failed; results in {sweep.resolve()}" in second.stdout
    sessions = json.loads((sweep / "fedprox_seed1" / "run.json").read_text())
    assert sessions[0]["sweep"] != json.loads((sweep / "fedavg_seed0" / "run.json").read_text())[0]["sweep"]


def test_a_refused_job_never_removes_a_directory_another_process_holds(tmp_path, monkeypatch):
    """The race behind two sweeps into one folder: job 0's directory is locked by the sweep that runs
    it but still empty when the other sweep, refused it, tidies up; it must stay (else the running
    job writes into a removed directory and fails with a traceback)."""
    from fedrun.harness import rundir
    from fedrun.command.sweeps import remove_if_empty

    monkeypatch.chdir(tmp_path)
    job = tmp_path / "sweep" / "0"
    running = rundir.RunDirectory.open(job, resume=False)  # locked, nothing written yet
    try:
        with pytest.raises(RunDirectoryError, match="another fedrun process is running"):
            rundir.RunDirectory.open(job, resume=False)
        remove_if_empty(job)  # what the refused job does
        assert job.is_dir()
    finally:
        running.close()
    remove_if_empty(job)  # unlocked and empty: removed, with its empty parent
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("removed", ["before_open", "after_lock"])
def test_a_run_directory_removed_before_its_lock_is_made_again(tmp_path, monkeypatch, removed):
    """The other side of the race: a directory removed between this process's mkdir and its lock
    (before it is opened, or opened and then removed) is made again and locked, so the run writes
    into a directory that exists."""
    from fedrun.harness import rundir

    lock, calls = rundir._lock_directory, []

    def lock_after_removal(path):
        calls.append(path)
        if len(calls) > 1:
            return lock(path)
        if removed == "before_open":
            path.rmdir()  # the refused job of another sweep tidies the empty directory away
            return lock(path)
        fd = lock(path)
        path.rmdir()  # our descriptor now holds a directory no longer in the tree
        return fd

    monkeypatch.setattr(rundir, "_lock_directory", lock_after_removal)
    job = tmp_path / "0"
    with rundir.RunDirectory.open(job, resume=False) as run:
        assert len(calls) == 2 and rundir._still_there(run._fd, job)
        (job / "config.yaml").write_text("seed: 0\n")
    assert (job / "config.yaml").is_file()


# ----------------------------------------------------------------------------- job folders

def test_a_sweep_with_14_overrides_runs_and_keeps_them(tmp_path):
    sweep = tmp_path / "sweep"
    many = ["hyperparams.lr=0.05,0.1", "hyperparams.momentum=0.5", "hyperparams.weight_decay=0.0001",
            "hyperparams.batch_size=20", "hyperparams.eval_every=1", "hyperparams.lr_gamma=0.5",
            "hyperparams.lr_milestones=[0.5]", "aggregator=fednnnn", "aggregator.beta=0.8",
            "aggregator.gamma=0.6", "aggregator.eps=0.000001", "seed=3", "targets=[0.3,0.5,0.7]",
            "+tags.note=a_label_long_enough_that_folder_names_made_of_every_override_would_not_fit_in_255_bytes"]
    assert len(many) == 14
    fedrun_ok(["-m", *TINY, *many, f"hydra.sweep.dir={sweep}"], tmp_path, timeout=300)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    config = yaml.safe_load((sweep / "1" / "config.yaml").read_text())
    assert "hyperparams.lr=0.1" in config["overrides"] and "aggregator.beta=0.8" in config["overrides"]
    assert config["tags"]["note"].startswith("a_label")
    assert config["choices"]["aggregator"] == "fednnnn" and config["hyperparams"]["lr"] == 0.1


# ----------------------------------------------------------------------------- from Python

def test_run_from_python_equals_the_cli(tmp_path):
    summary = fedrun.run(TINY + ["aggregator=fedavg"], run_dir=tmp_path / "py")
    fedrun_ok(TINY + ["aggregator=fedavg", f"hydra.run.dir={tmp_path / 'cli'}"], tmp_path)
    same_run(tmp_path / "py", tmp_path / "cli")
    assert summary == {**json.loads((tmp_path / "py" / "summary.json").read_text()), "run_dir": str(tmp_path / "py")}
    assert "fedavg on synthetic data: K=4 clients (2 a round), 2 rounds" in (tmp_path / "py" / "fedrun.log").read_text()
    config = yaml.safe_load((tmp_path / "py" / "config.yaml").read_text())
    assert config["choices"]["aggregator"] == "fedavg" and "aggregator=fedavg" in config["overrides"]
    with pytest.raises(ConfigError, match="already holds a run"):
        fedrun.run(TINY, run_dir=tmp_path / "py")  # never overwrites a run
    with pytest.raises(ConfigError, match=r"^hyperparams\.lr=-1: must be > 0$"):
        fedrun.run(TINY + ["hyperparams.lr=-1"], run_dir=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


# ----------------------------------------------------------------------------- the user's own configs

def test_own_model_and_dataset_from_a_folder_of_their_own(tmp_path, monkeypatch):
    own = tmp_path / "own"
    shutil.copytree(EXAMPLE, own)
    args = ["model=two_layer", "dataset=blobs", "hyperparams.rounds=2", "hyperparams.num_clients=4",
            "progress=false", "device=cpu"]
    proc = run_fedrun(["-cd", "conf", *args, f"hydra.run.dir={own / 'cli'}"], own,
                      env={**_cli_env(), "PYTHONPATH": str(own)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((own / "cli" / "summary.json").read_text())["rounds"] == 2
    typo = run_fedrun(["-cd", "conf", "model=two_layr", "dataset=blobs"], own,
                      env={**_cli_env(), "PYTHONPATH": str(own)})
    assert typo.returncode == 2 and typo.stderr.startswith("fedrun: error: model=two_layr: unknown option;")
    assert "two_layer" in typo.stderr and "mnist_cnn" in typo.stderr  # Hydra's list: both folders
    monkeypatch.syspath_prepend(str(own))
    summary = fedrun.run([f"hydra.searchpath=[file://{own / 'conf'}]", *args], run_dir=own / "py")
    assert summary["rounds"] == 2
    same_run(own / "cli", own / "py")


# ----------------------------------------------------------------------------- results as one table

def test_results_load_joins_runs_with_what_differs(tmp_path):
    sweep = tmp_path / "sweep"
    fedrun_ok(["-m", *TINY, "aggregator=fedavg,fednnnn", "seed=0,1", f"hydra.sweep.dir={sweep}"], tmp_path,
              timeout=300)
    df = results.load(sweep)
    assert len(df) == 4 * 2  # 4 runs x 2 rounds
    assert list(df.columns[:6]) == ["run_dir", "job", "method", "group", "aggregator", "dataset"]
    assert set(df.group) == {"FedAvg", "FedNNNN"}  # fedavg has no beta: still a group of its own
    assert set(df.aggregator) == {"fedavg", "fednnnn"} and set(df.seed) == {0, 1}
    assert "hyperparams.lr" not in df  # the same in every run: not a column
    assert {"aggregator.beta", "aggregator.gamma"} <= set(df.columns)  # fednnnn's settings (NaN for fedavg)
    one = df[(df.aggregator == "fedavg") & (df.seed == 1)]
    expected = pd.read_csv(Path(one.run_dir.iloc[0]) / "rounds.csv")
    assert one.test_acc.tolist() == expected.test_acc.tolist()
    layers, clients = results.load_layers(sweep), results.load_clients(sweep)
    assert set(layers.run_dir) == set(df.run_dir) and {"layer", "N", "E"} <= set(layers.columns)
    assert {"client", "update_norm"} <= set(clients.columns)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirectoryError, match="no run directories"):
        results.load(tmp_path / "empty")


def test_a_checkout_on_pythonpath_composes_its_own_configs(tmp_path):
    """Code and configs come from one copy: a second checkout run with ``PYTHONPATH`` reads its own
    ``conf/``, even where the environment holds an (editable) install of another checkout, whose
    finder would hand ``fedrun.conf`` to the other copy."""
    other = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / "fedrun", other / "fedrun", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "conf", other / "conf")
    env = {**_cli_env(), "PYTHONPATH": str(other)}
    code = "from fedrun.paths import conf_dir; import fedrun; print(conf_dir()); print(fedrun.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == [str((other / "conf").resolve()), str((other / "fedrun" / "__init__.py").resolve())]
