"""Each optional extra alone installs what its documented commands need.

``pip install 'fedrun[dashboards]'`` must be enough for ``logger=mlflow`` (its SQLite store, and
``mlflow ui`` to look at the runs: it answers on localhost) and ``logger=tensorboard``; ``pip install 'fedrun[sweeps]'`` for a stored Optuna study that a second
command resumes; ``pip install 'fedrun[huggingface]'`` for the bring-your-own-data example
(docs/examples/bring_your_own) with ``partition=natural`` and ``partition=flwr`` (its default and
ShardPartitioner named with its own argument); ``pip install 'fedrun[wandb]'`` for ``logger=wandb``
offline; ``pip install 'fedrun[privacy]'`` for a private run's epsilon.  Each extra goes into a fresh virtual environment that holds nothing else of the
extras.  Installing needs the package index, so these tests are marked ``extras`` and left out of
the default run (pyproject's ``addopts``); ``.ci/run`` runs them after the suite:

    python -m pytest -q -m extras tests/test_extras.py

PyTorch is 5 GB a copy: the environment links this interpreter's installs of fedrun's core
dependencies (torch, torchvision, hydra-core, pandas ... and theirs) instead of installing them
again, so pip resolves and installs only fedrun and the extra's own packages, as it would for a
user who has the core already.
"""
from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.extras

TINY = ["dataset=synthetic", "model=mlp", "scale=tiny", "progress=false"]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]+)", requirement).group(1)).lower()


def _needed(requirement: str) -> bool:
    """A requirement of the core install: no marker, or one that holds here without an extra."""
    if ";" not in requirement:
        return True
    from packaging.requirements import Requirement

    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({"extra": ""})


def core_distributions() -> set[str]:
    """fedrun's core dependencies, and theirs, as installed here."""
    todo, seen = [_name(r) for r in metadata.requires("fedrun") or [] if _needed(r)], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo.extend(_name(r) for r in dist.requires or [] if _needed(r))
    return seen


def environment_with(extra: str, where: Path) -> Path:
    """A fresh venv that sees the core's installs and has ``fedrun[extra]`` installed by pip; its bin/.

    The core's packages are linked into a folder *outside* the venv, which a ``.pth`` file puts on
    its path: pip counts them as installed but never changes them (it leaves a distribution
    outside its environment alone, and installs another version, where the extra needs one, in
    the venv's own site-packages, which comes first).  Links inside site-packages would let pip
    uninstall through them, deleting this interpreter's own files under running processes."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    core = where.parent / f"{where.name}-core"
    core.mkdir()
    for name in core_distributions():
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            if top in ("..", "__pycache__") or (core / top).exists() or not (base / top).exists():
                continue
            (core / top).symlink_to(base / top)
    (site / "fedrun_core.pth").write_text(f"{core}\n")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", f"{REPO_ROOT}[{extra}]"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"pip install 'fedrun[{extra}]' failed:\n{proc.stderr[-3000:]}"
    return where / "bin"


def fedrun(bin_: Path, args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(bin_ / "fedrun"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"fedrun {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    return proc


def importable(bin_: Path, module: str) -> bool:
    return subprocess.run([str(bin_ / "python"), "-c", f"import {module}"], capture_output=True).returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_ui(bin_: Path, store: Path, cwd: Path, timeout: float = 180) -> tuple[bytes, dict]:
    """``mlflow ui --backend-store-uri sqlite:///<store>`` started, asked for its front page and for
    the experiment ``fedrun`` through its REST API once it answers, and stopped: (page, answer)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = cwd / "mlflow_ui.log"  # a file, not a pipe nobody reads while the server runs
    with log.open("wb") as out:
        proc = subprocess.Popen([str(bin_ / "mlflow"), "ui", "--backend-store-uri", f"sqlite:///{store}",
                                 "--host", "127.0.0.1", "--port", str(port)], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(base + "/", timeout=10) as answer:
                    page = answer.read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    stop(proc)
                    output = log.read_text(errors="replace")
                    pytest.fail(f"mlflow ui did not answer on {base}:\n{output[-3000:]}")
                time.sleep(1)
        query = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=fedrun"
        with urllib.request.urlopen(base + query, timeout=30) as answer:
            found = json.loads(answer.read())
        return page, found
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """A server started in its own process group, stopped with its workers."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_dashboards_extra_alone_runs_mlflow_and_tensorboard(tmp_path):
    bin_ = environment_with("dashboards", tmp_path / "venv")
    assert not importable(bin_, "optuna")  # the extra alone
    fedrun(bin_, [*TINY, "logger=mlflow", f"hydra.run.dir={tmp_path / 'mlflow_run'}"], tmp_path)
    # The run is in MLflow's default store, mlflow.db in the folder the command ran in.
    check = ("import mlflow; c = mlflow.MlflowClient('sqlite:///mlflow.db'); "
             "e = c.get_experiment_by_name('fedrun'); r = c.search_runs([e.experiment_id]); "
             "print(len(r), len(c.get_metric_history(r[0].info.run_id, 'round.test_acc')))")
    out = subprocess.run([str(bin_ / "python"), "-c", check], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.split() == ["1", "3"], out.stderr[-2000:]  # one run, 3 rounds of test accuracy
    # The way to look at it, as the docs give it: MLflow's web UI on that store answers on localhost.
    page, found = mlflow_ui(bin_, tmp_path / "mlflow.db", tmp_path)
    assert b"<html" in page.lower(), page[:500]
    assert found["experiment"]["name"] == "fedrun", found
    fedrun(bin_, [*TINY, "logger=tensorboard", f"hydra.run.dir={tmp_path / 'tb_run'}"], tmp_path)
    assert list((tmp_path / "tb_run" / "tensorboard").rglob("events.out.tfevents.*"))


def test_the_sweeps_extra_alone_stores_an_optuna_study_and_resumes_it(tmp_path):
    bin_ = environment_with("sweeps", tmp_path / "venv")
    assert not importable(bin_, "mlflow")
    study = [*TINY, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=maximize",
             "hydra.sweeper.storage=sqlite:///optuna.db", "hydra.sweeper.study_name=extras",
             "aggregator.beta=interval(0.5,1.1)"]
    first = fedrun(bin_, ["-m", *study, f"hydra.sweep.dir={tmp_path / 'first'}"], tmp_path)
    assert "2 of 2 jobs done, 0 failed" in first.stdout
    fedrun(bin_, ["-m", *study, f"hydra.sweep.dir={tmp_path / 'again'}"], tmp_path)  # the same study, resumed
    count = ("import optuna; s = optuna.load_study(study_name='extras', storage='sqlite:///optuna.db'); "
             "print(len([t for t in s.trials if t.state.name == 'COMPLETE']))")
    out = subprocess.run([str(bin_ / "python"), "-c", count], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip() == "4", out.stderr[-2000:]


def test_the_huggingface_extra_alone_runs_the_worked_example(tmp_path):
    bin_ = environment_with("huggingface", tmp_path / "venv")
    assert not importable(bin_, "mlflow") and not importable(bin_, "optuna")
    example = REPO_ROOT / "docs" / "examples" / "bring_your_own" / "write_dataset.py"
    env = {"HF_DATASETS_OFFLINE": "1"}
    subprocess.run([str(bin_ / "python"), str(example), str(tmp_path / "my_hf_data")], check=True, cwd=tmp_path,
                   env={**__import__("os").environ, **env}, capture_output=True)
    common = ["dataset=huggingface", f"dataset.load.path={tmp_path / 'my_hf_data'}", "dataset.image_size=8",
              "dataset.num_classes=3", "model=mlp", "hyperparams.rounds=2", "progress=false"]
    fedrun(bin_, [*common, "dataset.load.client_column=writer", "partition=natural", "hyperparams.num_clients=6",
                  "hyperparams.client_fraction=0.5", f"hydra.run.dir={tmp_path / 'natural'}"], tmp_path)
    fedrun(bin_, [*common, "partition=flwr", "hyperparams.num_clients=4", f"hydra.run.dir={tmp_path / 'flwr'}"],
           tmp_path)
    assert (tmp_path / "flwr" / "summary.json").is_file()
    fedrun(bin_, [*common, "partition=flwr", "partition.partitioner=ShardPartitioner",
                  "partition.num_shards_per_partition=2", "hyperparams.num_clients=4",
                  f"hydra.run.dir={tmp_path / 'shard'}"], tmp_path)
    assert (tmp_path / "shard" / "summary.json").is_file()


def test_the_privacy_extra_alone_runs_dp_fedavg_and_reports_epsilon(tmp_path):
    """``pip install 'fedrun[privacy]'`` brings Google's dp-accounting: a private run writes the
    privacy spent after every round (``dp_epsilon``, growing) and in its summary."""
    bin_ = environment_with("privacy", tmp_path / "venv")
    assert importable(bin_, "dp_accounting") and not importable(bin_, "mlflow") and not importable(bin_, "optuna")
    run = tmp_path / "private"
    fedrun(bin_, [*TINY, "aggregator=fedavg", "aggregator.weighting=uniform", "privacy.clip=1.0",
                  "privacy.noise_multiplier=1.0", f"hydra.run.dir={run}"], tmp_path)
    lines = (run / "rounds.csv").read_text().splitlines()
    column = lines[0].split(",").index("dp_epsilon")
    epsilons = [float(line.split(",")[column]) for line in lines[1:]]
    assert len(epsilons) == 3 and 0 < epsilons[0] < epsilons[1] < epsilons[2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dp_epsilon"] == epsilons[-1] and summary["dp_delta"] == 1e-5


def test_the_wandb_extra_alone_logs_a_run_offline(tmp_path, monkeypatch):
    """logger=wandb with W&B offline (no network, no login): a W&B run folder that `wandb sync`
    would upload, named in the run directory's wandb.json."""
    bin_ = environment_with("wandb", tmp_path / "venv")
    assert not importable(bin_, "mlflow") and not importable(bin_, "optuna")
    for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    fedrun(bin_, [*TINY, "logger=wandb", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    marker = json.loads((tmp_path / "run" / "wandb.json").read_text())
    (folder,) = marker["folders"]
    assert list(Path(folder).glob(f"run-{marker['run_id']}.wandb"))
