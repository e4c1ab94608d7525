"""Large federations (K up to 100,000 clients): what every partition makes, what it refuses, and a
whole run at K = 20,000 whose per-client files and checkpoint do not grow with K.

Labels here are synthetic, in equal numbers per class and shuffled: FashionMNIST's shape (60,000
training images, 10 classes) for the refusals, 200,000 of them for K = 100,000 clients.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedrun.data import partition as P
from fedrun.errors import ConfigError

K = 100_000


def labels_of(n: int, num_classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % num_classes)


@pytest.fixture(scope="module")
def labels_200k() -> np.ndarray:
    return labels_of(200_000)


@pytest.fixture(scope="module")
def fashion() -> np.ndarray:
    """FashionMNIST's shape: 60,000 labels, 6,000 of each of 10 classes."""
    return labels_of(60_000)


def check_parts(parts, labels, num_clients, everything=True):
    """Every example at most once (all of them when ``everything``), every client non-empty, each
    client's indices sorted; returns the clients x classes counts."""
    assert len(parts) == num_clients
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 1, f"{(sizes == 0).sum()} empty clients"
    idx = np.concatenate(parts)
    assert len(np.unique(idx)) == len(idx), "an example was given to two clients"
    assert idx.min() >= 0 and idx.max() < len(labels)
    if everything:
        assert len(idx) == len(labels)
    assert all(np.all(np.diff(p) > 0) for p in parts[:: max(1, num_clients // 1000)])
    counts = P.class_counts(parts, labels, 10)
    assert counts.sum(1).tolist() == sizes.tolist()
    return counts


# ----------------------------------------------------------------------------- K = 100,000

@pytest.mark.parametrize("scheme,kwargs,per_client,classes", [
    ("iid", {}, 2, 2),  # N / K = 2 a client, of 2 different classes (n_c / K = 0.2 of each)
    ("classes", {}, 2, 2),
    ("classes", {"classes_per_client": 1}, 2, 1),
    ("dirichlet", {"alpha": 0.5}, 2, 2),
    ("mixed", {"iid_clients": 5}, 2, 2),
])
def test_100k_clients_every_example_once(scheme, kwargs, per_client, classes, labels_200k):
    parts = getattr(P, scheme)(labels_200k, num_clients=K, num_classes=10, seed=0, **kwargs)
    counts = check_parts(parts, labels_200k, K)
    assert (counts.sum(1) == per_client).all()  # 200,000 / 100,000: the equal share exactly
    assert (counts > 0).sum(1).max() <= classes
    if scheme == "iid":
        assert counts.max() == 1  # at most ceil(n_c / K) = 1 of a class


def test_100k_clients_niidbench_and_shards_and_natural(labels_200k):
    parts = P.classes(labels_200k, num_clients=K, num_classes=10, seed=0, assign="niidbench")
    counts = check_parts(parts, labels_200k, K)
    assert (counts > 0).sum(1).max() <= 2
    # 2 shards of 1 example each (segments of 200,000 // 200,000 = 1).
    parts = P.shards(labels_200k, num_clients=K, num_classes=10, seed=0)
    check_parts(parts, labels_200k, K)
    assert {len(p) for p in parts} == {2}
    # The data's own clients: 100,000 writers of 2 examples each, kept whole.
    groups = np.arange(len(labels_200k)) // 2
    parts = P.natural(labels_200k, num_clients=K, num_classes=10, seed=0, groups=groups)
    check_parts(parts, labels_200k, K)
    assert all(np.array_equal(p, [2 * k, 2 * k + 1]) for k, p in enumerate(parts[:1000]))


def test_many_clients_samples_per_client(labels_200k):
    parts = P.iid(labels_200k, num_clients=20_000, num_classes=10, seed=0, samples_per_client=10)
    counts = check_parts(parts, labels_200k, 20_000)
    assert (counts == 1).all()  # 10 a client, one of each class


def test_100k_clients_dirichlet_labels_when_the_data_allows():
    """Label-wise Dirichlet at K = 100,000 needs far more data than clients (its sizes vary a lot):
    alpha = 100 on 1,000,000 labels, every client at least 5 (mean 10)."""
    labels = labels_of(1_000_000)
    parts = P.dirichlet_labels(labels, num_clients=K, num_classes=10, seed=0, alpha=100.0, min_size=5)
    counts = check_parts(parts, labels, K)
    assert counts.sum(1).min() >= 5


# ----------------------------------------------------------------------------- beyond a class's size

def test_iid_beyond_the_largest_class_is_still_iid(fashion):
    """K = 10,000 > 6,000 images a class: every client gets 6 (N / K) images of 6 different classes,
    never two of one class (n_c / K = 0.6), and the classes stay balanced over the clients."""
    parts = P.iid(fashion, num_clients=10_000, num_classes=10, seed=0)
    counts = check_parts(parts, fashion, 10_000)
    assert (counts.sum(1) == 6).all() and counts.max() == 1
    assert counts.sum(0).tolist() == [6000] * 10


def test_mixed_beyond_a_class_size_keeps_its_structure(fashion):
    """FashionMNIST, K = 10,000, 5 IID clients and 2 classes for the others: refused before (the IID
    clients' shares of each class, 0.6, all rounded down); now every client holds 6 images, the
    IID ones of 6 classes, the others of at most their 2."""
    parts = P.mixed(fashion, num_clients=10_000, num_classes=10, seed=0, iid_clients=5)
    counts = check_parts(parts, fashion, 10_000)
    assert (counts.sum(1) == 6).all()
    assert ((counts[:5] > 0).sum(1) == 6).all()
    assert (counts[5:] > 0).sum(1).max() <= 2


@pytest.mark.parametrize("scheme,num_clients,kwargs,expected", [
    ("iid", 6_000, {}, "4dacda91660a0408"),  # one of each class a client
    ("classes", 30_000, {}, "ed1039d5a68fcbb4"),  # 6,000 holders a class: one image of each
    ("dirichlet", 10_000, {"alpha": 0.5}, "765fc63b01c60b6f"),
    ("mixed", 3_000, {}, "70788eb74568a4b6"),
    ("shards", 30_000, {}, "07f53414ff09c109"),
    ("dirichlet_labels", 500, {}, "d58c1d05d0c6f6da"),
])
def test_partitions_that_built_before_are_unchanged(scheme, num_clients, kwargs, expected, fashion):
    """The samples moved only where the column-by-column cut leaves a client empty, and one pass
    of dealing replaced the loop over clients: these fingerprints are fedrun's before both (the
    largest K each built on FashionMNIST-shaped labels, or near it)."""
    parts = getattr(P, scheme)(fashion, num_clients=num_clients, num_classes=10, seed=0, **kwargs)
    assert P.fingerprint(parts) == expected


# ----------------------------------------------------------------------------- refusals

def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("scheme,kwargs,largest", [
    ("iid", {}, 60_000),
    ("classes", {}, 60_000),
    ("dirichlet", {}, 60_000),
    ("mixed", {}, 60_000),
    ("shards", {}, 30_000),
    ("shards", {"shards_per_client": 3}, 20_000),
])
def test_k_beyond_the_largest_is_one_line_naming_it(scheme, kwargs, largest, fashion):
    with pytest.raises(ConfigError) as error:
        getattr(P, scheme)(fashion, num_clients=K, num_classes=10, seed=0, **kwargs)
    message = one_line(error)
    assert error.value.setting == "hyperparams.num_clients"
    assert message.startswith(f"hyperparams.num_clients=100000: partition={scheme} ")
    assert message.endswith(f"the largest K here is {largest:,}")
    assert "60,000" in message  # what limits it: the training set's size


@pytest.mark.parametrize("scheme,kwargs,largest", [
    ("iid", {}, 60_000),
    ("dirichlet", {"alpha": 0.1}, 60_000),
    ("shards", {}, 30_000),
])
def test_the_largest_k_named_builds(scheme, kwargs, largest, fashion):
    parts = getattr(P, scheme)(fashion, num_clients=largest, num_classes=10, seed=0, **kwargs)
    check_parts(parts, fashion, largest, everything=scheme != "shards")
    with pytest.raises(ConfigError, match=r"^(hyperparams\.num_clients|partition\.shards_per_client)="):
        getattr(P, scheme)(fashion, num_clients=largest + 1, num_classes=10, seed=0, **kwargs)


def test_shards_between_half_and_all_names_both_settings(fashion):
    with pytest.raises(ConfigError) as error:
        P.shards(fashion, num_clients=40_000, num_classes=10, seed=0)
    assert one_line(error) == ("partition.shards_per_client=2: must be an integer between 1 and 1 (every shard needs "
                               "a sample: the training set has 60000 samples for 40000 clients); or use at most "
                               "30,000 clients (hyperparams.num_clients)")


def test_dirichlet_labels_names_about_the_largest_k(fashion):
    """The issue's case: K = 10,000 on FashionMNIST with the default min_size = 10; and K beyond N.
    The K named (a draw meets min_size there about half the time) builds, with its redraws."""
    with pytest.raises(ConfigError) as error:
        P.dirichlet_labels(fashion, num_clients=10_000, num_classes=10, seed=0)
    message = one_line(error)
    assert message.startswith("partition.min_size=10: must be an integer between 1 and 6 (the training set has 60000 "
                              "samples for 10000 clients); or use fewer clients (hyperparams.num_clients): the "
                              "largest K here is about ")
    largest = int(message.split("about ")[1].split(" ")[0].replace(",", ""))
    assert 300 <= largest <= 3_000, largest  # alpha 0.5, 10 a client: ~900 (fewer than N / min_size = 6,000)
    parts = P.dirichlet_labels(fashion, num_clients=largest, num_classes=10, seed=0)
    assert min(len(p) for p in parts) >= 10
    with pytest.raises(ConfigError) as error:
        P.dirichlet_labels(fashion, num_clients=K, num_classes=10, seed=0)
    assert one_line(error).startswith("hyperparams.num_clients=100000: partition=dirichlet_labels gives every client "
                                      "at least partition.min_size=10 samples and the training set has 60,000: the "
                                      f"largest K here is about {largest:,} ")


def test_dirichlet_labels_stops_redrawing_when_a_draw_leaves_many_short(fashion):
    """min_size = 1 at K = 20,000: a draw leaves thousands of clients empty, so the 1,000 redraws
    (each a draw of 200,000 Dirichlet shares) are not tried; the refusal says how many and the K."""
    with pytest.raises(ConfigError) as error:
        P.dirichlet_labels(fashion, num_clients=20_000, num_classes=10, seed=0, min_size=1)
    message = one_line(error)
    assert message.startswith("partition.min_size=1: not met: draw 1 of Dirichlet(alpha=0.5) over 20,000 clients "
                              "left ")
    assert "so no redraw will leave none" in message and "the largest K here is about " in message


def test_natural_names_the_clients_it_has(fashion):
    groups = np.arange(len(fashion)) // 3  # 20,000 writers of 3 examples
    with pytest.raises(ConfigError) as error:
        P.natural(fashion, num_clients=K, num_classes=10, seed=0, groups=groups)
    assert one_line(error).startswith("hyperparams.num_clients=100000: partition=natural keeps that many of the "
                                      "data's clients, and it has 20,000 ")


def test_classes_too_small_for_their_holders_name_the_k_that_always_works():
    # Class 9 has 30 examples; with 1 class a client its holders (K / 10) cannot each get one
    # beyond K = 300 (10 classes x 30 / 1), which the message names.
    labels = labels_of(9 * 1000 + 30, seed=1)
    labels = np.where(np.arange(len(labels)) < 9000, np.arange(len(labels)) % 9, 9)
    with pytest.raises(ConfigError) as error:
        P.classes(labels, num_clients=2_000, num_classes=10, seed=0, classes_per_client=1)
    message = one_line(error)
    assert message.startswith("partition=classes: cannot be built: ")
    assert message.endswith("at most 300 clients always works with balanced sizes")
    check_parts(P.classes(labels, num_clients=300, num_classes=10, seed=0, classes_per_client=1), labels, 300)


# ----------------------------------------------------------------------------- flwr-datasets

def test_flwr_reads_the_partitions_in_one_pass_and_refuses_empty_clients():
    pytest.importorskip("flwr_datasets", reason="pip install 'fedrun[huggingface]'")
    from functools import partial

    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    from fedrun.data import huggingface as H

    labels = labels_of(3_000)

    def one_by_one(made, num_clients):
        return [np.asarray(made.load_partition(k)["_fedrun_row"], dtype=np.int64) for k in range(num_clients)]

    partitioners = [IidPartitioner, partial(ShardPartitioner, partition_by="label", num_shards_per_partition=2),
                    partial(DirichletPartitioner, partition_by="label", alpha=0.5, min_partition_size=1)]
    for partitioner in partitioners:
        fast = H.flwr_partition(labels, 31, 10, seed=0, partitioner=partitioner)
        slow_parts = H._flwr_parts
        try:
            H._flwr_parts = one_by_one
            slow = H.flwr_partition(labels, 31, 10, seed=0, partitioner=partitioner)
        finally:
            H._flwr_parts = slow_parts
        assert len(fast) == len(slow) == 31 and all(np.array_equal(a, b) for a, b in zip(fast, slow))
    parts = H.flwr_partition(labels, 3_000, 10, seed=0, partitioner=IidPartitioner)
    check_parts(parts, labels, 3_000)
    with pytest.raises(ConfigError) as error:
        H.flwr_partition(labels, 3_001, 10, seed=0, partitioner=IidPartitioner)
    assert one_line(error).endswith("the training set has 3,000: the largest K here is 3,000")
    with pytest.raises(ConfigError) as error:  # Dirichlet(0.5) over 1,000 clients leaves some with nothing
        H.flwr_partition(labels, 1_000, 10, seed=0, partitioner=partial(
            DirichletPartitioner, partition_by="label", alpha=0.5, min_partition_size=0))
    assert one_line(error).startswith("partition.partitioner=DirichletPartitioner: left ")


# ----------------------------------------------------------------------------- a whole run

def large_run(tmp_path, num_clients: int) -> dict:
    import fedrun

    run = tmp_path / f"k{num_clients}"
    summary = fedrun.run(["dataset=synthetic", "dataset.load.num_train=40000", "dataset.load.num_test=100",
                          "dataset.image_size=8", "model=mlp", "model.hidden=[16]", "aggregator=fedavg",
                          "partition=iid", f"hyperparams.num_clients={num_clients}",
                          f"hyperparams.client_fraction={20 / num_clients}", "hyperparams.rounds=1",
                          "hyperparams.batch_size=10", "progress=false", "device=cpu"], run_dir=str(run))
    return {"dir": run, "summary": summary}


def test_a_run_of_20000_clients_writes_rows_for_the_sampled_only(tmp_path):
    """K = 20,000 clients (iid beyond the 4,000 images a class: 2 a client), 20 a round: clients.csv
    and client_layers.csv hold the 20 sampled clients' rows; partition.csv one row a client; the
    checkpoint is as large as at K = 1,000 (FedAvg keeps nothing per client)."""
    from fedrun.seeding import sample_clients

    big, small = large_run(tmp_path, 20_000), large_run(tmp_path, 1_000)
    clients = pd.read_csv(big["dir"] / "clients.csv")
    sampled = sample_clients(0, 1, 20_000, 20)
    assert sorted(clients["client"]) == sorted(sampled) and len(clients) == 20
    layers = pd.read_csv(big["dir"] / "client_layers.csv")
    assert sorted(set(layers["client"])) == sorted(sampled)
    assert len(layers) == 20 * layers["layer"].nunique()
    partition = pd.read_csv(big["dir"] / "partition.csv")
    assert len(partition) == 20_000 and partition["examples"].min() == 2 and partition["examples"].sum() == 40_000
    sizes = [(run["dir"] / "checkpoint.pt").stat().st_size for run in (big, small)]
    assert abs(sizes[0] - sizes[1]) <= 0.03 * sizes[1], sizes
    # Nothing in it is as long as the federation.
    ckpt = torch.load(big["dir"] / "checkpoint.pt", weights_only=False)

    def lengths(obj):
        if isinstance(obj, torch.Tensor):
            yield from obj.shape
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from lengths(v)
        elif isinstance(obj, (list, tuple)):
            if len(obj) >= 1_000:
                yield len(obj)
            for v in obj:
                yield from lengths(v)

    assert max(lengths(ckpt)) < 1_000
