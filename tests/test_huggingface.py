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
from conftest import REPO_ROOT, TINY, compose, fedrun_ok, run_fedrun

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
    proc = run_fedrun([*TINY, "partition=flwr", "partition.partitioner=NoSuch", f"hydra.run.dir={tmp_path / 'bad'}"],
                      tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fedrun: error: partition.partitioner=NoSuch: not a partitioner of "
                           "flwr_datasets.partitioner; it has: ") and "ShardPartitioner" in last
    assert not (tmp_path / "bad").exists()


# ----------------------------------------------------------------------------- any partitioner, as Flower writes it

# A class and its own arguments, as a Flower user builds it (``ShardPartitioner(num_partitions=K,
# partition_by="label", num_shards_per_partition=2)``), and as fedrun's command line names it.
FLOWER = {
    "ShardPartitioner": {"num_shards_per_partition": 2},
    "PathologicalPartitioner": {"num_classes_per_partition": 2, "class_assignment_mode": "first-deterministic"},
    "IidPartitioner": {},
    "InnerDirichletPartitioner": {"partition_sizes": [120, 60, 100, 80, 90, 150], "alpha": 0.5},
    "LinearPartitioner": {},
}


def flower_config(name: str, arguments: dict, seed=None):
    """``partition=flwr`` composed from a command line naming the class and its own arguments
    (lists as Hydra reads them), and instantiated as fedrun does: the run's partition function."""
    from hydra.utils import instantiate

    from fedrun.command import resolvers  # noqa: F401  (${fedrun.default_of:...} in partition=flwr)

    written = [f"partition.{k}=[{','.join(map(str, v))}]" if isinstance(v, list) else f"partition.{k}={v}"
               for k, v in arguments.items()]
    seeded = [] if seed is None else [f"partition.seed={seed}"]
    cfg = compose(["partition=flwr", f"partition.partitioner={name}", *written, *seeded])
    return cfg, instantiate(cfg.partition)


def flower_own(name: str, arguments: dict, labels: np.ndarray, seed) -> list[set]:
    """flwr-datasets' own split: the class built directly on a ``datasets.Dataset`` of the same
    labels (a row column beside them, to read each partition's examples back), each partition's
    rows as a set."""
    import inspect

    import flwr_datasets.partitioner as partitioners

    cls = getattr(partitioners, name)
    params = inspect.signature(cls).parameters
    kwargs = dict(arguments)
    kwargs.update({k: v for k, v in (("num_partitions", 6), ("partition_by", "label"), ("seed", seed))
                   if k in params})
    made = cls(**kwargs)
    made.dataset = datasets.Dataset.from_dict({"label": labels, "row": np.arange(len(labels))})
    return [set(made.load_partition(k)["row"]) for k in range(6)]


@pytest.mark.parametrize("name", list(FLOWER))
def test_any_flower_partitioner_splits_as_flwr_datasets_itself_does(name):
    """Each class named with only its own arguments gives, client by client, the examples
    flwr-datasets' own partitioner gives on the same labels and seed: the user's seed when one is
    given (kept, not replaced by fedrun's), else the one fedrun derives from the run's seed."""
    partitioners = pytest.importorskip("flwr_datasets.partitioner", reason="pip install 'fedrun[huggingface]'")
    import inspect

    from fedrun.seeding import derive_seed

    labels = np.random.default_rng(3).permutation(np.arange(600) % 10)
    seeded = "seed" in inspect.signature(getattr(partitioners, name)).parameters  # Iid and Linear draw nothing
    cases = [(7, 7), (None, derive_seed(5, "flwr_partition") % 2**32)] if seeded else [(None, None)]
    for given, expected_seed in cases:
        cfg, partition = flower_config(name, FLOWER[name], seed=given)
        assert cfg.partition.seed == given and cfg.partition.alpha == FLOWER[name].get("alpha")
        parts = partition(labels=labels, num_clients=6, num_classes=10, seed=5)
        assert [set(p.tolist()) for p in parts] == flower_own(name, FLOWER[name], labels, expected_seed)
        rows = np.concatenate(parts)
        assert len(np.unique(rows)) == len(rows)  # no example twice (Pathological may leave a class out)


def test_another_partitioner_gets_none_of_dirichlets_defaults():
    """partition=flwr's alpha and min_partition_size are DirichletPartitioner's: null (not passed)
    for any other class, so ShardPartitioner is built from its own arguments alone."""
    pytest.importorskip("flwr_datasets", reason="pip install 'fedrun[huggingface]'")
    default, _ = flower_config("DirichletPartitioner", {})
    assert (default.partition.alpha, default.partition.min_partition_size) == (0.5, 0)
    dotted, _ = flower_config("flwr_datasets.partitioner.DirichletPartitioner", {})
    assert dotted.partition.alpha == 0.5
    shard, partition = flower_config("ShardPartitioner", {"num_shards_per_partition": 2})
    assert shard.partition.alpha is None and shard.partition.min_partition_size is None
    assert partition.keywords["partitioner"].keywords == {"num_shards_per_partition": 2}


def test_a_setting_the_partitioner_does_not_take_is_one_line():
    pytest.importorskip("flwr_datasets", reason="pip install 'fedrun[huggingface]'")
    from fedrun.data.flower import flwr_partitioner

    cases = [
        (dict(partitioner="ShardPartitioner", alpha=0.3),
         "partition.alpha=0.3: not an argument of ShardPartitioner; it takes: num_shards_per_partition, shard_size, "
         "keep_incomplete_shard, shuffle, seed (fedrun passes num_partitions and partition_by)"),
        (dict(partitioner="IidPartitioner", num_partitions=3),
         "partition.num_partitions=3: fedrun passes it itself: hyperparams.num_clients (K); leave it out"),
        (dict(partitioner="ShardPartitioner", partition_by="writer"),
         "partition.partition_by=writer: fedrun passes it itself: the training labels (fedrun's column 'label'); "
         "leave it out"),
        (dict(partitioner="PathologicalPartitioner"),
         "partition.num_classes_per_partition=null: PathologicalPartitioner needs it (its arguments: "
         "num_classes_per_partition, class_assignment_mode, shuffle, seed)"),
        (dict(partitioner="NoSuchPartitioner"), "partition.partitioner=NoSuchPartitioner: not a partitioner of "
                                                "flwr_datasets.partitioner; it has: ContinuousPartitioner, "),
        (dict(partitioner="numpy.random.Generator"),
         "partition.partitioner=numpy.random.Generator: is not a flwr-datasets partitioner"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError) as error:
            flwr_partitioner(**kwargs)
        assert str(error.value).startswith(message), str(error.value)
    partition = flwr_partitioner("InnerDirichletPartitioner", partition_sizes=[50, 50, 50], alpha=1.0)
    with pytest.raises(ConfigError, match=r"^partition.partition_sizes=\[50,50,50\]: gives 3 partitions, one a "
                                          r"client, and the run has K=4 clients \(hyperparams.num_clients\)$"):
        partition(labels=np.arange(200) % 10, num_clients=4, num_classes=10, seed=0)


@pytest.mark.slow
def test_a_run_names_shard_with_its_own_arguments_and_records_the_users_seed(tmp_path):
    """The documented command: ShardPartitioner and its own argument on the command line, no
    Dirichlet default in the way; the user's seed is the one config.yaml records."""
    pytest.importorskip("flwr_datasets", reason="pip install 'fedrun[huggingface]'")
    import yaml

    run = tmp_path / "shard"
    fedrun_ok([*TINY, "partition=flwr", "partition.partitioner=ShardPartitioner",
               "partition.num_shards_per_partition=2", "partition.seed=7", f"hydra.run.dir={run}"], tmp_path)
    node = yaml.safe_load((run / "config.yaml").read_text())["partition"]
    assert node["partitioner"] == "ShardPartitioner" and node["seed"] == 7 and node["num_shards_per_partition"] == 2
    assert node["alpha"] is None and node["min_partition_size"] is None
    classes = [sum(1 for c in row.split(",")[2:] if c != "0")
               for row in (run / "partition.csv").read_text().splitlines()[1:]]
    assert len(classes) == 4 and max(classes) <= 4  # two label-sorted shards a client: a few classes each
