"""Every command block of README.md and docs/*.md runs as written, in smoke form.

Each ```bash block is split into commands, and each command is checked by what it is:

* ``fedrun ...``: its config is composed and checked as the command would before running
  (:func:`fedrun.command.cli.precheck`, every value of a sweep with :func:`fedrun.command.cli.precheck_sweep`),
  in a fresh working folder, with ``-cd`` and the ``cd`` of its block applied;
* ``fedrun-plot ...``: run on hand-made runs placed where the command looks;
* ``python scripts/<paper>/<table>.py run ...``: run with ``--dry-run`` (its commands printed, none run);
  the scripts' ``collect`` and plot commands: run on empty folders, which must not be an error of
  their command line;
* ``bash scripts/bench/gpu_check.sh <stage>``: the stage exists (the stages need a GPU);
* installing and environment commands (pip, apt-get, venv, export, pytest): listed, not run.

The data is what a user can have, made by the test (MNIST's and FashionMNIST's files where a
download or Debian's package puts them, and ``dataset=mnist_train10k``'s files as
scripts/datasets/mnist_train10k.py writes them): nothing beside the checkout, no network.  The README's
single runs are also built at ``scale=tiny``, as the README suggests.

A command of any other kind fails the test, so a new example is covered when it is written.
"""
from __future__ import annotations

import contextlib
import gzip
import importlib.util
import re
import shlex
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO_ROOT, compose, python_run

from fedrun import plot
from fedrun.command.cli import precheck, precheck_sweep

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
ENVIRONMENT = ("pip", "apt-get", "sudo", "python3", ".", "source", "export", "optuna-dashboard")
TABLE_SCRIPTS = ("fednnnn/table2.py", "fedlayerwise/table1.py", "pd/tables.py", "niidbench/table3.py",  # below scripts/
                 "datasets/cifar10_jpeg_cost.py")  # every script whose ``run`` trains: run with --dry-run


def commands() -> list[tuple[str, str, str]]:
    """(where, the command, the folder its block ``cd``-ed to) for every command of every
    ```bash block, continuation lines joined, comments dropped."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in re.finditer(r"^```(?:bash|sh)\n(.*?)^```", text, re.S | re.M):
            first = text[: block.start()].count("\n") + 2
            cwd = ""
            for n, line in enumerate(block.group(1).replace("\\\n", " ").splitlines()):
                words = shlex.split(line, comments=True)
                for command in " ".join(shlex.quote(w) for w in words).split(" '&&' ") if words else []:
                    if command.startswith("cd "):
                        cwd = command[3:].strip()
                        continue
                    found.append((f"{doc.relative_to(REPO_ROOT)}:{first + n}", command, cwd))
    return found


COMMANDS = commands()


def test_the_docs_have_commands():
    assert len(COMMANDS) >= 40
    assert sum(c.startswith("fedrun ") for _, c, _ in COMMANDS) >= 10


def fake_run(path: Path, aggregator: str, seed: int) -> None:
    path.mkdir(parents=True)
    config = {"seed": seed, "aggregator": {"_target_": f"fedrun.aggregators.{aggregator}"},
              "choices": {"aggregator": aggregator, "dataset": "fmnist"}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "rounds.csv").write_text("round,test_acc,test_loss,N_over_E,server_step,bytes_total\n"
                                     "1,0.5,1.0,0.5,0.1,1000000\n2,0.6,0.9,0.5,0.1,2000000\n")
    (path / "partition.csv").write_text("client,examples,class_0,class_1\n0,3,1,2\n1,3,3,0\n")


IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def write_idx(path: Path, array: np.ndarray) -> None:
    """An unsigned-byte IDX file, gzip-compressed (fast: the images are blank)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


@pytest.fixture(scope="session")
def user_data(tmp_path_factory) -> Path:
    """What a user can have, made here (no ../shared, no network): MNIST and FashionMNIST as
    torchvision's download or Debian's package leaves them (the four .gz files, 60,000 + 10,000
    images of every class, blank: the commands are checked, not trained), and the first 10,000
    MNIST training images as ``dataset=mnist_train10k`` reads them (sorted by digit)."""
    root = tmp_path_factory.mktemp("data")
    labels = {True: np.arange(60_000) % 10, False: np.arange(10_000) % 10}
    for name in ("MNIST", "FashionMNIST"):
        for (images, label), train in zip((IDX[:2], IDX[2:]), (True, False)):
            write_idx(root / name / "raw" / f"{images}.gz", np.zeros((len(labels[train]), 28, 28), np.uint8))
            write_idx(root / name / "raw" / f"{label}.gz", labels[train])
    write_idx(root / "mnist-train10k" / "images-idx3-ubyte.gz", np.zeros((10_000, 28, 28), np.uint8))
    write_idx(root / "mnist-train10k" / "labels-idx1-ubyte.gz", np.repeat(np.arange(10), 1_000))
    return root


@pytest.fixture
def data_root(user_data, monkeypatch):
    """The data where fedrun looks for it ($FEDRUN_DATA/<MNIST|FashionMNIST>/raw, as after a download
    or with Debian's package; ``dataset=mnist_train10k``'s folder in $FEDRUN_MNIST10K): a sweep's
    partitions are built on its data before the sweep starts."""
    monkeypatch.setenv("FEDRUN_DATA", str(user_data))
    monkeypatch.setenv("FEDRUN_MNIST10K", str(user_data / "mnist-train10k"))
    return user_data


@pytest.mark.parametrize("where,command,cwd", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_the_command_runs_as_written(where, command, cwd, tmp_path, monkeypatch, data_root):
    words = shlex.split(command)
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):  # PYTHONPATH=. fedrun ...
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    program, args = words[0], words[1:]
    folder = (REPO_ROOT / cwd) if cwd else tmp_path
    if not cwd and "../shared/data/" in command:  # a record of runs that read MNIST's files from a folder there
        shared = tmp_path.parent / "shared" / "data"
        shared.mkdir(parents=True, exist_ok=True)
        for name, made in (("mnist", data_root / "MNIST" / "raw"), ("mnist-train10k", data_root / "mnist-train10k")):
            with contextlib.suppress(FileExistsError):
                (shared / name).symlink_to(made)
    if program in ENVIRONMENT or (program == "python" and args[:2] == ["-m", "pytest"]):
        pytest.skip(f"installs or sets up the environment: {command}")
    if program == "fedrun":
        check_fedrun(args, folder, env, monkeypatch)
    elif program == "fedrun-plot":
        check_plot(args, tmp_path, monkeypatch)
    elif program == "python" and args and args[0].startswith("scripts/"):
        check_script(args, tmp_path)
    elif program == "python" and args[:1] == ["-c"]:
        assert "<date>" in args[1], "a Python one-liner of the docs reads a placeholder path only"
        pytest.skip("reads a run directory named by placeholders")
    elif program == "bash" and args and args[0] == "scripts/bench/gpu_check.sh":
        stages = re.search(r"usage: bash \$0 ([a-z|]+)", (REPO_ROOT / args[0]).read_text()).group(1).split("|")
        assert args[1] in stages, f"{args[1]} is not a stage of gpu_check.sh ({stages})"
    else:
        pytest.fail(f"{where}: a command of a kind this test does not know: {command}")


def check_fedrun(args: list[str], folder: Path, env: dict, monkeypatch) -> None:
    """Compose and check the run (or every run of the sweep) as ``fedrun`` does before it starts."""
    if "hydra/launcher=ray" in args and importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None:
        pytest.skip("the Ray launcher is installed apart (pip install 'fedrun[ray]')")
    monkeypatch.chdir(folder)
    if env.get("PYTHONPATH") == ".":
        monkeypatch.syspath_prepend(str(folder))
    sweep = "-m" in args
    overrides, dirs, i = [], [], 0
    while i < len(args):
        if args[i] in ("-cd", "--config-dir"):
            dirs.append(str((folder / args[i + 1]).resolve()))
            i += 2
            continue
        if args[i] != "-m":
            overrides.append(args[i])
        i += 1
    if dirs:
        overrides.append(f"hydra.searchpath=[{','.join('file://' + d for d in dirs)}]")
    (precheck_sweep if sweep else precheck)(overrides)


def check_plot(args: list[str], folder: Path, monkeypatch) -> None:
    """fedrun-plot on two methods x two seeds placed in each folder it is given (the DIR
    arguments, before the first option), and a run where ``--partition`` names one."""
    monkeypatch.chdir(folder)
    dirs = args[: next((i for i, a in enumerate(args) if a.startswith("-")), len(args))]
    for top in dirs:
        for n, (aggregator, seed) in enumerate([("fedavg", 0), ("fedavg", 1), ("fednnnn", 0), ("fednnnn", 1)]):
            fake_run(folder / top / str(n), aggregator, seed)
    if "--partition" in args and not (folder / args[args.index("--partition") + 1]).exists():
        fake_run(folder / args[args.index("--partition") + 1], "fedavg", 0)  # the run whose partition it draws
    assert plot.main(args) == 0


def check_script(args: list[str], folder: Path) -> None:
    """A paper script: ``run`` with ``--dry-run``; other modes on empty folders, where the
    command line must be accepted (argparse's errors print its usage)."""
    script = Path(args[0]).relative_to("scripts").as_posix()
    if script == "claims.py":  # on the committed runs, but --write rewrites a copy of the doc, not the checkout's
        root = folder / "root"
        (root / "docs").mkdir(parents=True)
        for doc in (REPO_ROOT / "docs").glob("*.md"):  # reproductions.md, and configuration.md's result tables
            shutil.copy(doc, root / "docs")
        (root / "outputs").symlink_to(REPO_ROOT / "outputs")
        (root / "scripts").symlink_to(REPO_ROOT / "scripts")
        proc = python_run([str(REPO_ROOT / args[0]), *args[1:], "--root", str(root)], folder, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return
    if script in TABLE_SCRIPTS and len(args) > 1 and args[1] == "run":
        args = [*args, "--dry-run"]
    elif script == "common/tune.py" and "--show" not in args:  # the protocol's runs printed, none run
        cut = args.index("--") if "--" in args else len(args)
        args = [*args[:cut], "--dry-run", *args[cut:]]
    else:
        for a in args[1:]:
            if not a.startswith("-") and "=" not in a and not a[0].isdigit() and a not in ("collect", "run"):
                (folder / a).mkdir(parents=True, exist_ok=True)
    proc = python_run([str(REPO_ROOT / args[0]), *args[1:]], folder, timeout=300)
    assert "usage:" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    if (script in TABLE_SCRIPTS or script == "common/tune.py") and "--dry-run" in args:
        assert proc.returncode == 0, proc.stderr[-2000:]


README_RUNS = [(w, c) for w, c, cwd in COMMANDS if w.startswith("README.md") and c.startswith("fedrun ")
               and "-m" not in shlex.split(c) and not cwd]


@pytest.mark.parametrize("where,command", README_RUNS, ids=[w for w, _ in README_RUNS])
def test_the_readmes_runs_build_at_tiny_scale(where, command, data_root):
    """The README: "add scale=tiny to this or any command": each of its single runs, shrunk so,
    builds its partition on its data (the run's own check before its first round), and where the
    partition deals every class over all the clients (partition=iid) some class has an image for
    each of them whatever the images drawn (tiny's training images / classes >= clients)."""
    from fedrun.command.build import check_partition

    overrides = [*shlex.split(command)[1:], "scale=tiny"]
    cfg = compose(overrides)
    values = compose(overrides, resolve=True)
    if values["partition"]["_target_"].endswith(".iid") and values["partition"]["sizes"] == "balanced":
        per_class = -(-values["dataset"]["max_train"] // values["dataset"]["num_classes"])
        assert per_class >= values["hyperparams"]["num_clients"], \
            f"{command} scale=tiny: {values['hyperparams']['num_clients']} clients, a class sure of {per_class}"
    check_partition(cfg, {})


def test_the_bring_your_own_data_commands_train_several_clients_a_round():
    """A worked example of federated learning trains more than one client a round: the
    huggingface and table commands of docs/configuration.md, composed as fedrun composes them."""
    from fedrun.seeding import clients_per_round

    text = (REPO_ROOT / "docs" / "configuration.md").read_text().replace("\\\n", " ")
    found = re.findall(r"^ {4}(fedrun dataset=(?:huggingface|table) .*)$", text, re.M)
    assert len(found) == 2 and any("dataset=huggingface" in c for c in found)
    for command in found:
        overrides = [w for w in shlex.split(command)[1:] if "=" in w and not w.startswith("dataset.load.path=")]
        hp = compose(overrides, resolve=True)["hyperparams"]
        assert clients_per_round(hp["num_clients"], hp["client_fraction"]) >= 2, command
