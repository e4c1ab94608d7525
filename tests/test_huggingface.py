"""Bring your own data: Hugging Face datasets and flwr-datasets' partitioners, offline, from files
the tests write.  Skipped where the optional packages are absent (``fedrun[huggingface]``);
tests/test_extras.py installs that extra alone and runs the worked example."""
from __future__ import annotations

import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, TINY, fedrun_ok, run_fedrun

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before datasets is imported: never the network
datasets = pytest.importorskip("datasets", reason="pip install 'fedrun[huggingface]'")

from fedrun.data.huggingface import flwr_partition, hf_dataset  # noqa: E402
from fedrun.errors import ConfigError  # noqa: E402

EXAMPLE = REPO_ROOT / "docs" / "examples" / "bring_your_own" / "write_dataset.py"


def small(n=12, side=4, seed=0, writers=("b", "a", "c")):
    rng = np.random.default_rng(seed)
    return {"image": [rng.integers(0, 256, (side, side)).astype(np.uint8) for _ in range(n)],
            "label": [i % 3 for i in range(n)], "writer": [writers[i % len(writers)] for i in range(n)]}


def test_a_saved_dataset_dict_reads_as_images_labels_and_clients(tmp_path):
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["x", "y", "z", "w"]),
                                  "writer": datasets.Value("string")})
    train, test = small(), small(6, seed=1)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(train, features=features),
                          "test": datasets.Dataset.from_dict(test, features=features)}).save_to_disk(tmp_path / "d")
    raw = hf_dataset(str(tmp_path / "d"), client_column="writer", channels=1, image_size=4)
    assert raw.train_x.shape == (12, 1, 4, 4) and raw.test_x.shape == (6, 1, 4, 4)
    assert raw.num_classes == 4  # from the ClassLabel's names, not the largest label
    assert torch.equal(raw.train_x[0, 0], torch.from_numpy(train["image"][0]).float() / 255)
    # Writers numbered in sorted order: a -> 0, b -> 1, c -> 2 (the first image is b's).
    assert raw.train_groups.tolist()[:3] == [1, 0, 2] and raw.test_groups.tolist()[:3] == [1, 0, 2]
    with pytest.raises(ConfigError, match=r"^dataset.image_size=28: the training images are 1 x 4 x 4 .* set "
                                          r"dataset.channels=1 dataset.image_size=4$"):
        hf_dataset(str(tmp_path / "d"), channels=1, image_size=28)
    with pytest.raises(ConfigError, match=r"^dataset.load.client_column=user: is not a column of .*; it has: image, "
                                          r"label, writer$"):
        hf_dataset(str(tmp_path / "d"), client_column="user", image_size=4)


def test_local_parquet_files_without_a_test_split_hold_one_out(tmp_path):
    data = small(20)
    data["image"] = [img.flatten().tolist() for img in data["image"]]  # rows of 16 values
    datasets.Dataset.from_dict(data).to_parquet(str(tmp_path / "train.parquet"))
    raw = hf_dataset("parquet", data_files={"train": str(tmp_path / "train.parquet")}, image_size=4,
                     test_fraction=0.25)
    assert len(raw.train_y) == 15 and len(raw.test_y) == 5 and raw.num_classes == 3
    assert float(raw.train_x.max()) > 0.9  # integer pixels scaled to [0, 1]


def test_flower_partitioners_carry_over(tmp_path):
    pytest.importorskip("flwr_datasets", reason="pip install 'fedrun[huggingface]'")
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    labels = np.arange(1000) % 10
    parts = flwr_partition(labels, 4, 10, seed=0, partitioner=IidPartitioner)
    assert [len(p) for p in parts] == [250] * 4
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))  # every example once
    dirichlet = functools.partial(DirichletPartitioner, partition_by="label", alpha=0.3, min_partition_size=0)
    a, b, c = (flwr_partition(labels, 5, 10, seed=s, partitioner=dirichlet) for s in (0, 0, 1))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # the run's seed makes it reproducible
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    with pytest.raises(ConfigError, match=r"^partition.partitioner=None: name a flwr-datasets partitioner"):
        flwr_partition(labels, 4, 10, seed=0)


@pytest.mark.slow
def test_the_worked_example_runs_offline_with_natural_and_flower_partitions(tmp_path):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path / "my_hf_data")], check=True, env=env,
                   capture_output=True)
    common = ["dataset=huggingface", f"dataset.load.path={tmp_path / 'my_hf_data'}", "dataset.image_size=8",
              "dataset.num_classes=3", "model=mlp", "hyperparams.rounds=2", "aggregator=fedavg", "progress=false"]
    run = tmp_path / "natural"
    fedrun_ok([*common, "dataset.load.client_column=writer", "partition=natural", "hyperparams.num_clients=6",
               "hyperparams.client_fraction=0.5", f"hydra.run.dir={run}"], tmp_path)
    assert (run / "partition.csv").read_text().splitlines()[1].startswith("0,20,")  # writer_00's 20 images
    if __import__("importlib").util.find_spec("flwr_datasets") is not None:
        fedrun_ok([*common, "partition=flwr", "hyperparams.num_clients=4", f"hydra.run.dir={tmp_path / 'flwr'}"],
                  tmp_path)
    proc = run_fedrun([*TINY, "partition=flwr", "partition.partitioner._target_=flwr_datasets.partitioner.NoSuch",
                       f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fedrun: error: partition=") and "NoSuch" in last.split("Error loading")[1]
    assert not (tmp_path / "bad").exists()
