"""A catalogue of bad command lines: each one line naming the setting and what is allowed.

Every case runs fedrun's console entry point (in one driver process: tests/cli_driver.py) in an
empty working directory and must exit non-zero with exactly one line on stderr,
``fedrun: error: <setting>=<value>: <what is allowed>``, no traceback, and nothing created: the
run directory (Hydra's default, under the working directory) is made only after every setting is
checked, the data loaded and the partition built.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, _cli_env, created_in, edit_same_length, fedrun_ok, refusal_failures

DRIVER = Path(__file__).resolve().parent / "cli_driver.py"

# (extra overrides, substrings the one line must hold: the setting, then what is allowed)
SETTINGS = [
    (["hyperparams.rounds=1.7"], ["hyperparams.rounds=1.7", "must be an integer"]),
    (["hyperparams.rounds=0"], ["hyperparams.rounds=0", "must be >= 1"]),
    (["hyperparams.rounds=abc"], ["hyperparams.rounds=abc", "must be an integer"]),
    (["+hyperparams.roundz=3"], ["hyperparams.roundz=3", "unknown setting", "rounds, num_clients"]),
    (["partiton=iid"], ["partiton=iid: unknown setting; did you mean partition? see `fedrun --help`"]),
    (["hyperparam.lr=0.1"], ["hyperparam.lr=0.1: unknown setting; did you mean hyperparams?"]),
    (["hyperparams.lr=0"], ["hyperparams.lr=0", "must be > 0"]),
    (["hyperparams.lr=nan"], ["hyperparams.lr=nan", "must be a finite number"]),
    (["hyperparams.client_fraction=1.5"], ["hyperparams.client_fraction=1.5", "(0, 1]"]),
    (["hyperparams.batch_size=0"], ["hyperparams.batch_size=0", ">= 1"]),
    (["hyperparams.local_epochs=2.5"], ["hyperparams.local_epochs=2.5", "must be an integer"]),
    (["hyperparams.momentum=1"], ["hyperparams.momentum=1", "[0, 1)"]),
    (["hyperparams.optimizer=rmsprop"], ["hyperparams.optimizer=rmsprop", "sgd", "adam"]),
    (["hyperparams.optimizer_state=keep"], ["hyperparams.optimizer_state=keep", "reset, average, local"]),
    (["hyperparams.nesterov=maybe"], ["hyperparams.nesterov=maybe", "true or false"]),
    (["hyperparams.lr_milestones=0.5"], ["hyperparams.lr_milestones=0.5", "a list of finite numbers"]),
    (["hyperparams.lr_milestones=[1.5]"], ["hyperparams.lr_milestones=[1.5]", "each in (0, 1)"]),
    (["hyperparams.betas=[0.9]"], ["hyperparams.betas=[0.9]", "a list of 2 finite numbers"]),
    (["hyperparams.stragglers=2"], ["hyperparams.stragglers=2", "[0, 1]"]),
    (["hyperparams.validation_fraction=1"], ["hyperparams.validation_fraction=1", "[0, 1)"]),
    (["hyperparams.eval_every=0"], ["hyperparams.eval_every=0", ">= 1"]),
    (["hyperparams.num_clients=0"], ["hyperparams.num_clients=0", ">= 1"]),
    (["hyperparams.num_clients=1000"], ["hyperparams.num_clients=1000", "the largest K here is 200"]),
    (["aggregator.beta=inf"], ["aggregator.beta=inf", "must be a finite number"]),
    (["aggregator.beta=big"], ["aggregator.beta=big", "must be a finite number"]),
    (["aggregator.beta=-1"], ["aggregator.beta=-1", "must be > 0"]),
    (["aggregator.gamma=1"], ["aggregator.gamma=1", "[0, 1)"]),
    (["+aggregator.foo=1"], ["aggregator.foo=1", "unknown setting of fednnnn", "beta, gamma"]),
    (["aggregator.weighting=size"], ["aggregator.weighting=size", "examples, uniform"]),
    (["aggregator=fedfoo"], ["aggregator=fedfoo", "unknown option", "fedavg"]),
    (["model=resnet99"], ["model=resnet99", "unknown option", "mnist_cnn"]),
    (["experiment=fednnnn/nonexistent"], ["experiment=fednnnn/nonexistent", "fednnnn/mnist_iid_b"]),
    (["model.hidden=abc"], ["model.hidden=abc", "a list of integers"]),
    (["engine.precision=fp16"], ["engine.precision=fp16", "fp32, tf32, bf16"]),
    (["engine.clients_per_step=0"], ["engine.clients_per_step=0"]),
    (["engine=batched", "engine.capture=maybe"], ["engine.capture=maybe", "auto", "on", "off"]),
    (["snapshots=3"], ["snapshots=3", "a list of integers"]),
    (["snapshots=[99]"], ["snapshots=[99]", "rounds between 1 and hyperparams.rounds (2)"]),
    (["targets=[abc]"], ["targets=[abc]", "a list of finite numbers"]),
    (["targets=[2]"], ["targets=[2]", "[0, 1]"]),
    (["seed=1.5"], ["seed=1.5", "must be an integer"]),
    (["vanilla_every=-1"], ["vanilla_every=-1", ">= 0"]),
    (["checkpoint_every=0"], ["checkpoint_every=0", "must be >= 1"]),
    (["mode=yes"], ["mode=yes", "centralized, federated"]),
    (["resume=maybe"], ["resume=maybe", "true or false"]),
    (["device=tpu"], ["device=tpu", "auto, cpu, cuda"]),
    (["dataset.max_train=0"], ["dataset.max_train=0", ">= 1 or null"]),
    (["dataset.max_train=-1"], ["dataset.max_train=-1", ">= 1 or null"]),
    (["dataset.max_test=0"], ["dataset.max_test=0", ">= 1 or null"]),
    (["dataset.std=[0]"], ["dataset.std=[0]", "> 0"]),
    (["dataset.mean=[0.1,0.2]"], ["dataset.mean=[0.1, 0.2]", "one value per channel"]),
    (["dataset.num_classes=1"], ["dataset.num_classes=1", ">= 2"]),
    (["partition=dirichlet", "partition.alpha=0"], ["partition.alpha=0", "finite number > 0"]),
    (["partition=shards", "partition.shards_per_client=1000"], ["partition.shards_per_client=1000", "between 1 and"]),
    (["partition=iid", "partition.samples_per_client=100000"], ["partition.samples_per_client=100000", "at most"]),
    (["partition=classes", "partition.classes_per_client=11"], ["partition.classes_per_client=11", "between 1 and 10"]),
    (["partition=iid", "partition.sizes=zipf"], ["partition.sizes=zipf", "balanced, powerlaw"]),
    # One source of truth: the objects built from hyperparams cannot be set apart from them.
    (["local.lr=0.3"], ["local.lr=0.3", "set by hyperparams.lr", "hyperparams.lr=0.3"]),
    (["federation.rounds=7"], ["federation.rounds=7", "set by hyperparams.rounds"]),
    (["+participation.rate=1"], ["participation.rate=1", "not a setting of participation"]),
    (["~local.batch_size"], ["local.batch_size=missing", "built from hyperparams.batch_size"]),
    (["mode=centralized"], ["hyperparams.num_clients=4", "mode=centralized trains one learner"]),
    (["centralized=true"], ["centralized=true", "mode=centralized"]),
    (["objective=best_val_acc"], ["objective=best_val_acc", "needs hyperparams.validation_fraction > 0"]),
    (["objective=final_average_test_acc", "aggregator=fedavg"], ["objective=final_average_test_acc", "one model"]),
    (["~seed"], ["seed=missing", "every run needs it"]),
    (["seed=99999999999999999999"], ["seed=99999999999999999999", "an integer (64-bit)"]),
    (["~hyperparams.lr"], ["hyperparams.lr=missing", "local.lr is built from it"]),
    (["hydra.run.dir=/proc/fedrun_run"], ["hydra.run.dir=/proc/fedrun_run", "cannot be written"]),
    (["hydra.run.dir=outputs/${nosuch}"], ["hydra.run.dir=outputs/${nosuch}", "cannot be resolved"]),
    (["logger=tensorboard", "logger.log_dir=/proc/fedrun_tb"], ["logger.log_dir=/proc/fedrun_tb", "cannot be written"]),
    (["-m", "hydra/launcher=population", "hydra.launcher.max_runs=0", "seed=0,1"],
     ["hydra.launcher.max_runs=0", "integer >= 1"]),
    (["-m", "partition=shards", "partition.shards_per_client=2,1000"],
     ["partition.shards_per_client=1000", "between 1 and", "nothing was run"]),
    (["aggregator=krum"], ["hyperparams.client_fraction=0.5", "aggregator=krum needs at least 5 clients a round"]),
    (["aggregator=trimmed_mean", "aggregator.beta=0.5"], ["aggregator.beta=0.5", "[0, 0.5)"]),
    # Known before the run, so refused before anything is written (not in the first round, nor in
    # Hydra's multi-line block of a failed sweep job).
    (["aggregator=krum", "hyperparams.num_clients=8", "hyperparams.client_fraction=1.0", "aggregator.multi=9"],
     ["aggregator.multi=9", "must be at most the clients a round", "1.0 of 8 clients is 8"]),
    (["-m", "aggregator=krum", "hyperparams.num_clients=8", "hyperparams.client_fraction=1.0", "aggregator.multi=1,9"],
     ["aggregator.multi=9", "must be at most the clients a round"]),
    (["hyperparams.betas=[1.0,0.999]"], ["hyperparams.betas=[1.0, 0.999]", "each in [0, 1)"]),
    (["hyperparams.betas=[0.9,-0.1]"], ["hyperparams.betas=[0.9, -0.1]", "each in [0, 1)"]),
    (["model.hidden=[0]"], ["model.hidden=[0]", ">= 1 unit"]),
    (["model.hidden=[8,-1]"], ["model.hidden=[8, -1]", ">= 1 unit"]),
    (["hyperparams.lr_milestones=[0.5,0.2]"], ["hyperparams.lr_milestones=[0.5, 0.2]", "must be increasing"]),
    (["hyperparams.lr_milestones=[0.3,0.3]"], ["hyperparams.lr_milestones=[0.3, 0.3]", "must be increasing"]),
    (["objective=mean_test_acc_last_3"], ["objective=mean_test_acc_last_3", "the run has 2", "n <= 2"]),
    (["objective=mean_test_acc_last_99"], ["objective=mean_test_acc_last_99", "n <= 2"]),
    # Folders: a run or a sweep never writes into the working directory itself, nor outside its sweep folder.
    (["hydra.run.dir="], ["hydra.run.dir='': is empty"]),
    (["-m", "seed=0,1", "hydra.sweep.dir="], ["hydra.sweep.dir='': is empty"]),
    (["-m", "seed=0,1", "hydra.sweep.subdir="], ["hydra.sweep.subdir='':", "a folder inside hydra.sweep.dir"]),
    (["-m", "seed=0,1", "hydra.sweep.subdir=."], ["hydra.sweep.subdir=.:", "a folder inside hydra.sweep.dir"]),
    (["-m", "seed=0,1", "hydra.sweep.subdir=../escape${seed}"],
     ["hydra.sweep.subdir=../escape${seed}", "a folder inside hydra.sweep.dir"]),
    (["-m", "seed=0,1", "hydra.sweep.subdir=a/../../b${seed}"], ["hydra.sweep.subdir=a/../../b${seed}", "inside"]),
    (["-m", "seed=0,1", "hydra.sweep.subdir=/tmp/fedrun_abs${seed}"], ["hydra.sweep.subdir=/tmp/fedrun_abs${seed}",
                                                                      "a folder inside hydra.sweep.dir"]),
    (["-m", "seed=0,1", "hydra.sweep.subdir=same"], ["hydra.sweep.subdir=same", "jobs that differ in seed",
                                                      "add ${seed}"]),
    (["-m", "seed=0,1", "aggregator=fedavg,fednnnn", "hydra.sweep.subdir=s${seed}"],
     ["hydra.sweep.subdir=s${seed}", "differ in aggregator", "add ${hydra:runtime.choices.aggregator}"]),
    (["-m", "seed=range(0)"], ["seed=range(0)", "sweeps no value"]),
    (["seed=0", "-m", "hyperparams.lr=0.1,-1"], ["hyperparams.lr=-1", "must be > 0"]),  # -m after an override
    # A misspelt key or option: the closest name first.
    (["aggregator=fedprx"], ["aggregator=fedprx", "unknown option; did you mean fedprox? choose one of:"]),
    (["hyperparams.lrr=0.1"], ["hyperparams.lrr=0.1", "unknown setting; did you mean lr? hyperparams has:"]),
    (["aggregator.betta=0.5"], ["aggregator.betta=0.5", "did you mean beta?"]),
    (["model=mnist_cn"], ["model=mnist_cn", "did you mean mnist_cnn?"]),
    # The setting the user wrote, not a copy the error was found on (dataset.load.num_classes:
    # ${..num_classes}, dataset.load.root: ${data_root}), nor another setting its check ran first.
    (["dataset.num_classes=1e1"], ["dataset.num_classes=10.0: must be an integer"]),
    (["dataset.channels=1.5"], ["dataset.channels=1.5: must be an integer"]),
    (["dataset.image_size=abc"], ["dataset.image_size=abc: must be an integer"]),
    (["data_root=null"], ["data_root=null: must be a string"]),
    (["mode=centralized", "hyperparams.client_fraction=7"], ["hyperparams.client_fraction=7: must be in (0, 1]"]),
    # A group's list form (several dashboards), and several values without -m.
    (["logger=[nosuch]"], ["logger=[nosuch]: nosuch is an unknown option", "mlflow, none, tensorboard"]),
    (["logger=[tensorboard,nosuch]"], ["logger=[tensorboard,nosuch]: nosuch is an unknown option"]),
    (["logger=[]"], ["logger=[]: chooses no option", "logger=none"]),
    (["logger=[none,tensorboard]"], ["logger=[none,tensorboard]", "logger=none alone, or logger=[tensorboard]"]),
    (["logger=tensorboard,mlflow"], ["logger=tensorboard,mlflow: sweeps several values", "add -m",
                                     "logger=[tensorboard,mlflow]"]),
    (["seed=0,1"], ["seed=0,1: sweeps several values", "add -m"]),
    (["hyperparams.lr=interval(0.1,1)"], ["hyperparams.lr=interval(0.1,1): sweeps several values", "add -m"]),
    # Flags: one line, not argparse's usage block.
    (["--help=true"], ["--help=true: --help takes no value"]),
    (["--cfg=bad"], ["--cfg", "invalid choice: 'bad'"]),
    (["--nosuchflag"], ["unrecognized arguments: --nosuchflag"]),
    (["--config-dir=/nonexistent/fedrun_conf"], ["--config-dir=/nonexistent/fedrun_conf: not a folder"]),
    # Hydra's composition errors: the override they are about, not every override of the line.
    (["hydra.run.dir=null"], ["hydra.run.dir=null: cannot be set", "not Optional"]),
    (["+seed=1"], ["+seed=1: seed is a setting already: write seed=1"]),
    (["~nosuch"], ["~nosuch: the config has no nosuch to remove"]),
    (["=1"], ["=1: names no setting"]),
    # A warning of a setting without effect is not printed above a refusal.
    (["hydra/launcher=population", "hyperparams.lr=-1"], ["hyperparams.lr=-1: must be > 0"]),
    (["hyperparams=5"], ["hyperparams=5: choose an option of the hyperparams group", "default"]),
    # Hydra's grammar reads a non-ASCII character only inside quotes: the setting named, and how to quote it.
    (["hydra.run.dir=outputs/\u00fc_run"], ["hydra.run.dir=outputs/\u00fc_run", "only inside quotes",
                                             "'hydra.run.dir=\"outputs/\u00fc_run\"'"]),
    (["seed=\u00fc"], ["seed=\u00fc", "only inside quotes"]),
    # Sweeps: what Hydra's sweeper cannot run is one line before the sweep (not its traceback), and
    # a sweep of no job is an error.
    (["-m", "hyperparams.lr=interval(0.1,1)"], ["hyperparams.lr=interval(0.1,1): is a range a sampler draws from",
                                                "the basic sweeper runs listed values"]),
    (["-m", "hyperparams.lr=range(0.1,1,0)"], ["hyperparams.lr=range(0.1,1,0): range(start,stop,step) needs a step "
                                               "other than 0"]),
    (["-m", "seed=range(0,3,0)"], ["seed=range(0,3,0): range(start,stop,step) needs a step other than 0"]),
    (["-m", "seed=choice()"], ["seed=choice(): cannot be read as a Hydra override", "empty choice"]),
    (["-m", "aggregator=glob(nomatch*)"], ["aggregator=glob(nomatch*): matches no option of aggregator",
                                           "no job", "fedavg"]),
    (["-m", "+hydra.launcher.chunk=2", "seed=0,1"], ["hydra.launcher.chunk=2: unknown setting of BasicLauncher"]),
    (["-m", "hydra.launcher.chunk=2", "seed=0,1"], ["hydra.launcher.chunk=2: unknown setting"]),
    (["-m", "hydra/launcher=population", "+hydra.launcher.chunk=2", "seed=0,1"],
     ["hydra.launcher.chunk=2: unknown setting of PopulationLauncher", "max_runs"]),
    (["-m", "seed=0,1", "+hydra.sweeper.chunk=2"], ["hydra.sweeper.chunk=2: unknown setting of BasicSweeper",
                                                   "max_batch_size"]),
    (["-m", "seed=0,1", "hydra.sweep.dir=outputs/\u00fc"], ["hydra.sweep.dir=outputs/\u00fc", "only inside quotes"]),
    (["-m", "--nosuchflag", "seed=0,1"], ["unrecognized arguments: --nosuchflag"]),
]
if importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is not None:  # fedrun[sweeps]
    SETTINGS += [
        (["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=0", "seed=0,1"],
         ["hydra.sweeper.n_trials=0", "an integer >= 1"]),
        (["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_jobs=0", "seed=0,1"], ["hydra.sweeper.n_jobs=0", ">= 1"]),
    ]
if torch.cuda.is_available():  # device=cuda is then valid
    SETTINGS = [case for case in SETTINGS if case[0] != ["device=cuda"]]
else:
    SETTINGS.append((["device=cuda"], ["device=cuda", "CUDA is not available"]))


def idx_file(path: Path, array: np.ndarray, truncate: int = 0, gz: bool = True) -> str:
    data = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    data += array.astype(np.uint8).tobytes()
    data = data[: len(data) - truncate]
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, str]:
    """Bad dataset files of every kind, and a finished run, outside the cases' working folders."""
    d = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 255, (50, 28, 28)), np.arange(50) % 10
    files = {
        "images": idx_file(d / "images.gz", images),
        "labels": idx_file(d / "labels.gz", labels),
        "truncated": idx_file(d / "truncated.gz", images, truncate=1000),
        "few_labels": idx_file(d / "few_labels.gz", labels[:40]),
        "labels_12": idx_file(d / "labels_12.gz", np.arange(50) % 13),
        "small_images": idx_file(d / "small.gz", images[:, :8, :8]),
    }
    (d / "not_idx.gz").write_bytes(b"<!DOCTYPE html><html>not found</html>")
    files["not_idx"] = str(d / "not_idx.gz")
    idx_file(d / "images_plain", images, gz=False)
    (d / "corrupt.gz").write_bytes(gzip.compress((d / "images_plain").read_bytes())[:5000])
    files["corrupt_gz"] = str(d / "corrupt.gz")
    run = d / "finished_run"
    run.mkdir()
    (run / "rounds.csv").write_text("round,test_acc\n1,0.5\n")
    files["finished_run"] = str(run)
    (d / "empty_root").mkdir()
    files["empty_root"] = str(d / "empty_root")
    # MNIST's four files where they are looked for, none of them an IDX file: the loader finds
    # them (and says which folder it reads) before it reads one.
    (d / "garbage_root" / "MNIST" / "raw").mkdir(parents=True)
    for name in IDX_NAMES:
        (d / "garbage_root" / "MNIST" / "raw" / name).write_bytes(b"not an IDX file\n")
    files["garbage_root"] = str(d / "garbage_root")
    # A dataset config of one's own that forgets a setting without a default (fedrun.data.datasets.DatasetConfig).
    (d / "own" / "dataset").mkdir(parents=True)
    (d / "own" / "dataset" / "no_channels.yaml").write_text(
        "name: mine\nload:\n  _target_: fedrun.data.datasets.synthetic\n  num_train: 100\nimage_size: 28\nnum_classes: 10\n")
    (d / "own" / "dataset" / "bad_normalize.yaml").write_text(
        "name: mine\nload:\n  _target_: fedrun.data.datasets.synthetic\nchannels: 1\nimage_size: 28\nnum_classes: 10\n"
        "normalize: zscore\n")
    files["own"] = str(d / "own")

    # MNIST's four files in the data root itself (not <root>/MNIST/raw), and split over two folders.
    for folder, names in (("bare_root", IDX_NAMES), ("split_root/MNIST/raw", IDX_NAMES[:2]), ("split_other", IDX_NAMES[2:])):
        (d / folder).mkdir(parents=True)
        for name in names:
            idx_file(d / folder / f"{name}.gz", images if "images" in name else labels)
        files[folder.split("/")[0]] = str(d / folder.split("/")[0])

    # A finished run whose copies are damaged in every way a resume must catch.
    fedrun_ok([*TINY, f"hydra.run.dir={d / 'run'}"], d)
    (d / "run" / "summary.json").unlink()  # so that a resume would go on, were it not refused
    for name, damage in RESUME_DAMAGE.items():
        shutil.copytree(d / "run", d / name)
        damage(d / name)
        files[name] = str(d / name)
    # Sweep folders a sweep must not write through.
    (d / "outside").mkdir()
    (d / "outside" / "target.yaml").write_text("untouched\n")
    for name, plant in SWEEP_DAMAGE.items():
        (d / name).mkdir()
        plant(d / name, d / "outside")
        files[name] = str(d / name)
    return files


IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def edit_config(run: Path, *keys: str, factor: float = 2) -> None:
    """config.yaml with a setting changed in every place it is recorded (as a careful editor would)."""
    import yaml

    config = yaml.safe_load((run / "config.yaml").read_text())
    for key in keys:
        node, last = config, key.split(".")
        for part in last[:-1]:
            node = node[part]
        node[last[-1]] = node[last[-1]] * factor
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


RESUME_DAMAGE = {
    "edited_rounds": lambda run: edit_same_length(run / "rounds.csv"),
    "edited_clients": lambda run: edit_same_length(run / "clients.csv"),
    "edited_layers": lambda run: edit_same_length(run / "layers.csv"),
    "edited_client_layers": lambda run: edit_same_length(run / "client_layers.csv"),
    "truncated_rounds": lambda run: (run / "rounds.csv").write_bytes((run / "rounds.csv").read_bytes()[:-10]),
    "edited_config_lr": lambda run: edit_config(run, "hyperparams.lr", "local.lr"),
    "edited_config_beta": lambda run: edit_config(run, "aggregator.beta", factor=0.5),
    "fifo_in_run": lambda run: os.mkfifo(run / "notes"),
    "fifo_in_models": lambda run: ((run / "models").mkdir(), os.mkfifo(run / "models" / "round_0001.pt")),
    "link_in_run": lambda run: (run / "layers.csv").unlink() or (run / "layers.csv").symlink_to(run / "rounds.csv"),
}

SWEEP_DAMAGE = {
    "sweep_multirun_link": lambda sweep, out: (sweep / "multirun.yaml").symlink_to(out / "target.yaml"),
    "sweep_job_link": lambda sweep, out: (sweep / "0").symlink_to(out, target_is_directory=True),
    "sweep_deep_link": lambda sweep, out: ((sweep / "1").mkdir(), (sweep / "1" / "config.yaml").symlink_to(
        out / "target.yaml")),
    "sweep_fifo": lambda sweep, out: os.mkfifo(sweep / "multirun.yaml"),
}


# The smallest run on a real dataset's shape (TINY's keys are the synthetic dataset's).
BASE = ["model=mlp", "model.hidden=[8]", "hyperparams.num_clients=4", "hyperparams.rounds=2", "progress=false"]


def data_cases(f: dict[str, str]) -> list[tuple[list[str], list[str]]]:
    """Full command lines: bad files and folders, and an earlier run's directory."""
    import yaml

    def idx(images, labels):
        return [*BASE, "dataset=mnist_train10k", f"dataset.load.train_images={images}",
                f"dataset.load.train_labels={labels}"]

    return [
        (idx(f["truncated"], f["labels"]), [f["truncated"], "truncated IDX file"]),
        (idx(f["images"], f["few_labels"]), [f["images"], f["few_labels"], "50 images", "40 labels"]),
        (idx(f["not_idx"], f["labels"]), [f["not_idx"], "not an IDX file"]),
        (idx(f["corrupt_gz"], f["labels"]), [f["corrupt_gz"], "corrupt or truncated gzip"]),
        (idx(f["images"], f["labels_12"]), ["labels span 0..12", "dataset.num_classes=10", "0..9"]),
        (idx(f["small_images"], f["labels"]), ["dataset.channels/image_size=1/28", "1x8x8", "dataset.image_size=8"]),
        (idx(f["images"], f["labels"] + ".missing"), ["dataset.load.train_labels", "not found"]),
        ([*BASE, "dataset=mnist", "dataset.load.download=false", f"data_root={f['empty_root']}"],
         ["MNIST not found", f["empty_root"], "dataset.load.download=true"]),
        ([*BASE, "dataset=cifar10", "dataset.load.download=false", f"data_root={f['empty_root']}"],
         ["CIFAR-10 not found", "dataset.load.download=true"]),
        ([*TINY, f"hydra.run.dir={f['finished_run']}"],
         [f"hydra.run.dir={f['finished_run']}", "already holds a run", "resume=true"]),
        (["dataset=synthetic", "dataset.image_size=4", "model=mnist_cnn", "hyperparams.num_clients=4",
          "progress=false"], ["model", "1x4x4 images"]),
        ([*TINY, "model.depth=3"], ["model.depth=3", "unknown setting", "hidden"]),
        (["dataset=synthetic", "dataset.channels=3", "dataset.image_size=32", "model=neta_baseline", "model.init=xavier",
          "progress=false"], ["model.init=xavier", "fan_in, authors"]),
        ([*TINY, f"hydra.run.dir={f['images']}"], [f"hydra.run.dir={f['images']}", "is a file"]),
        ([*BASE, f"hydra.searchpath=[file://{f['own']}]", "dataset=no_channels"],
         ["dataset.channels=missing", "a dataset config needs name, load, channels, image_size, num_classes"]),
        ([*BASE, "-cd", f["own"], "dataset=bad_normalize"], ["dataset.normalize=zscore", "per_channel, per_image"]),
        # Data from where the user said, all four files from one folder, or a clear no.
        ([*BASE, "dataset=mnist", "dataset.load.download=false", f"data_root={f['bare_root']}"],
         ["MNIST not found", f"{f['bare_root']}/MNIST/raw", "all four in one of"]),
        ([*BASE, "dataset=mnist", "dataset.load.download=false", f"data_root={f['split_root']}",
          f"dataset.load.search=[{f['split_other']}]"], ["MNIST not found", "holds 2 of the 4"]),
        ([*BASE, "dataset=mnist", "data_root="], ["data_root=''", "is empty (FEDRUN_DATA set to nothing?)"]),
        ([*BASE, "dataset=cifar10", "data_root="], ["data_root=''", "is empty"]),
        ([*BASE, "dataset=mnist"], ["data_root=''", "is empty"], {"FEDRUN_DATA": ""}),
        ([*BASE, "dataset=mnist", "data_root=null"], ["data_root=null: must be a string"]),
        # The error alone on stderr: no "[INFO] ... reading <folder>" (nor the job's thread count) above it.
        ([*BASE, "dataset=mnist", "dataset.load.download=false", f"data_root={f['garbage_root']}", "threads=1"],
         [f"{f['garbage_root']}/MNIST/raw/train-images-idx3-ubyte: not an IDX file"]),
        # A resume trusts nothing edited since its checkpoint, and reads no link, pipe or device.
        *[([*TINY, f"hydra.run.dir={f[name]}", "resume=true"], [f"{f[name]}/{csv}.csv", "its first",
           "are not those the checkpoint records (edited since)"])
          for name, csv in (("edited_rounds", "rounds"), ("edited_clients", "clients"), ("edited_layers", "layers"),
                            ("edited_client_layers", "client_layers"))],
        ([*TINY, f"hydra.run.dir={f['truncated_rounds']}", "resume=true"],
         [f"{f['truncated_rounds']}/rounds.csv", "shorter than the"]),
        ([*TINY, f"hydra.run.dir={f['edited_config_lr']}", "resume=true", "hyperparams.lr=0.1"],
         [f"{f['edited_config_lr']}/config.yaml", "its settings are not those the checkpoint's 2 rounds ran with"]),
        ([*TINY, f"hydra.run.dir={f['edited_config_beta']}", "resume=true",
          f"aggregator.beta={yaml.safe_load(Path(f['edited_config_beta'], 'config.yaml').read_text())['aggregator']['beta']}"],
         [f"{f['edited_config_beta']}/config.yaml", "edited since"]),
        ([*TINY, f"hydra.run.dir={f['edited_config_lr']}", "resume=true"],
         ["resume=true", "the settings differ from the run's config.yaml in: hyperparams, local"]),
        ([*TINY, f"hydra.run.dir={f['fifo_in_run']}", "resume=true"], ["notes", "not a regular file or folder"]),
        ([*TINY, f"hydra.run.dir={f['fifo_in_models']}", "resume=true"],
         ["models/round_0001.pt", "not a regular file or folder"]),
        ([*TINY, f"hydra.run.dir={f['link_in_run']}", "resume=true"], ["symbolic link layers.csv"]),
        # Sweep folders are as safe as run folders.
        ([*TINY, "-m", "seed=0,1", f"hydra.sweep.dir={f['sweep_multirun_link']}", "resume=true"],
         [f["sweep_multirun_link"], "symbolic link multirun.yaml", "sweep folder"]),
        ([*TINY, "-m", "seed=0,1", f"hydra.sweep.dir={f['sweep_job_link']}"], ["symbolic link 0"]),
        ([*TINY, "-m", "seed=0,1", f"hydra.sweep.dir={f['sweep_deep_link']}"], ["symbolic link 1/config.yaml"]),
        ([*TINY, "-m", "seed=0,1", f"hydra.sweep.dir={f['sweep_fifo']}"], ["multirun.yaml", "not a regular file"]),
    ]


def run_catalogue(cases, tmp_path: Path) -> list[dict]:
    """Each case in its own empty working folder; returns the driver's results with the folder."""
    jobs = []
    for i, (args, _, *env) in enumerate(cases):
        cwd = tmp_path / f"case{i:03d}"
        cwd.mkdir()
        jobs.append({"args": args, "cwd": str(cwd), "env": env[0] if env else {}})
    proc = subprocess.run([sys.executable, str(DRIVER)], input=json.dumps(jobs), capture_output=True, text=True,
                          env=_cli_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(jobs)
    return [{**r, "cwd": Path(j["cwd"])} for r, j in zip(results, jobs)]


def tree(folder: Path) -> dict:
    """Every regular file's bytes below ``folder``, and where every link points (pipes are not read)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            found[str(path)] = ("link", os.readlink(path))
        elif path.is_file():
            found[str(path)] = path.read_bytes()
    return found


def test_every_bad_command_line_is_one_line_before_anything_is_written(data_files, tmp_path):
    cases = [([*TINY, *args], expected) for args, expected in SETTINGS] + data_cases(data_files)
    assert len(cases) >= 130
    files = Path(data_files["finished_run"]).parent
    before = tree(files)
    problems = []
    for (args, expected, *_), result in zip(cases, run_catalogue(cases, tmp_path)):
        failed = refusal_failures(result, expected, exit_ok=lambda code: code not in (0, -1))
        if failed:
            problems.append(f"{' '.join(args[len(TINY):] if args[:len(TINY)] == TINY else args)}: {', '.join(failed)} "
                            f"(exit {result['code']}; created {created_in(result)}):\n{result['stderr'][-1500:]}")
    assert not problems, "\n\n".join(problems)
    assert tree(files) == before  # the earlier runs, sweep folders and what their links point to: untouched


# Valid settings that do nothing (or only approximately what they say) in the combination chosen:
# the run goes on, with one warning line each, on the console and in fedrun.log; never refused, so a
# sweep over them (stragglers x local epochs ...) runs whole.  (overrides, the warnings' lines)
NO_EFFECT = [
    (["hyperparams.stragglers=0.5", "hyperparams.local_epochs=1"],
     ["hyperparams.stragglers=0.5: has no effect with hyperparams.local_epochs=1"]),
    (["hyperparams.optimizer_state=average"],
     ["hyperparams.optimizer_state=average: has no effect: the client optimizer (sgd, momentum 0.0) keeps no state"]),
    (["aggregator=fednova", "hyperparams.momentum=0.9", "hyperparams.optimizer_state=local"],
     ["hyperparams.optimizer_state=local: aggregator=fednova counts each client's steps from a zero momentum buffer"]),
    (["hydra/launcher=population"], ["fedrun: warning: hydra/launcher=population: has no effect without -m"]),
    # Capped at what can run (the cores, the clients a round), said once.
    (["engine=parallel", "engine.workers=1000"], ["engine.workers=1000: more than can run at once"]),
]


def test_help_of_a_sweep_describes_its_first_job(tmp_path):
    """``--help -m`` with swept settings: the help of the sweep's first job, on stdout, exit 0."""
    cases = [([*TINY, "--help", "-m", "seed=3,4", "aggregator=fedavg,fedprox"], []),
             ([*TINY, "-m", "--help", "hyperparams.lr=range(0.1,0.3,0.1)"], [])]
    results = run_catalogue(cases, tmp_path)
    for result in results:
        assert result["code"] == 0 and not result["stderr"], result["stderr"][-2000:]
        assert "Config groups" in result["stdout"] and not any(result["cwd"].iterdir())
    first, second = (r["stdout"] for r in results)
    assert "*fedavg" in first and re.search(r"^\s+seed=3\s", first, re.M)
    assert re.search(r"^\s+hyperparams\.lr=0\.1\s", second, re.M)


@pytest.mark.parametrize("call,what", [
    (lambda fedrun: fedrun.run(TINY, run_dir=123), "run_dir=123: must be a folder's path"),
    (lambda fedrun: fedrun.run(TINY, run_dir=""), "run_dir='': must be a folder's path"),
    (lambda fedrun: fedrun.run("dataset=synthetic"), "overrides='dataset=synthetic': must be a list of key=value"),
    (lambda fedrun: fedrun.run([*TINY, 7]), "must be a list of key=value strings"),
    (lambda fedrun: fedrun.run([*TINY, "-m", "seed=0,1"]), "overrides=-m: is a flag of the fedrun command"),
    (lambda fedrun: fedrun.run([*TINY, "seed=0,1"]), "seed=0,1: sweeps several values"),
])
def test_the_python_api_refuses_in_one_line(call, what, tmp_path, monkeypatch):
    """``fedrun.run`` raises the command's one-line errors (FedrunError), never a TypeError from
    deep inside, and creates nothing."""
    import fedrun
    from fedrun.errors import FedrunError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(FedrunError) as error:
        call(fedrun)
    assert what in str(error.value) and "\n" not in str(error.value)
    assert not any(tmp_path.iterdir())


def test_workers_and_threads_are_capped_at_what_can_run(tmp_path):
    """engine.workers=1000 for a round of 2 clients: no more processes than the cores and the
    clients a round, said once (console and fedrun.log); threads=1000: no more threads than cores,
    said once.  The runs go on."""
    cores = len(os.sched_getaffinity(0))
    run, threaded = tmp_path / "run", tmp_path / "threaded"
    workers_run, threads_run = run_catalogue(
        [([*TINY, "engine=parallel", "engine.workers=1000", f"hydra.run.dir={run}"], []),
         ([*TINY, "threads=1000", f"hydra.run.dir={threaded}"], [])], tmp_path)
    assert workers_run["code"] == 0, workers_run["stderr"][-2000:]
    workers = int(re.search(r"ParallelEngine, (\d+) single-threaded worker processes", workers_run["stderr"]).group(1))
    assert workers == min(2, cores)
    warned = [line for line in workers_run["stderr"].splitlines() if "engine.workers=1000: more than can run" in line]
    assert len(warned) == 1 and f"{workers} worker process(es) instead" in warned[0]
    assert (run / "fedrun.log").read_text().count("engine.workers=1000: more than can run at once") == 1
    assert threads_run["code"] == 0, threads_run["stderr"][-2000:]
    warned = [line for line in threads_run["stderr"].splitlines() if "threads=1000: more than the" in line]
    assert len(warned) == 1 and f"{cores} thread(s) instead" in warned[0]
    assert f"{cores} CPU thread(s) for this job" in threads_run["stderr"]


def test_settings_without_effect_are_one_warning_line_and_the_run_goes_on(tmp_path):
    cases = [([*TINY, *args, f"hydra.run.dir={tmp_path / f'run{i}'}"], lines) for i, (args, lines) in enumerate(NO_EFFECT)]
    for (args, lines), result in zip(cases, run_catalogue(cases, tmp_path)):
        assert result["code"] == 0, result["stderr"][-2000:]
        run = Path(args[-1].split("=", 1)[1])
        log = (run / "fedrun.log").read_text()
        for line in lines:
            shown = [l for l in result["stderr"].splitlines() if line in l]
            assert len(shown) == 1, (line, result["stderr"][-2000:])  # once, on one line
            assert line.startswith("fedrun: warning:") or line in log  # the run's own record keeps it
        assert (run / "summary.json").is_file()
