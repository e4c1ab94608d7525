"""Data with natural clients: LEAF's FEMNIST JSON layout, a CSV table with a client column, and
``partition=natural``, which keeps those clients; all from small files of the real formats."""
from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import fedrun_ok, run_fedrun

from fedrun.data.datasets import RawData
from fedrun.data.natural import femnist, synthetic_writers, table, writer_sizes
from fedrun.data.partition import client_ids, client_test_rows, natural
from fedrun.diagnostics.evaluation import client_scores, client_summary
from fedrun.data.preparation import prepare
from fedrun.errors import ConfigError, DataError

# Writers and how many images each has in LEAF's training and test files.
WRITERS = {"f0001_41": (5, 2), "f0002_07": (3, 1), "f0100_12": (8, 2)}


def write_leaf(root, writers=WRITERS, seed=0):
    """LEAF's layout: <root>/femnist/data/{train,test}/*.json, the writers spread over two files."""
    rng = np.random.default_rng(seed)
    for split, col in (("train", 0), ("test", 1)):
        folder = root / "femnist" / "data" / split
        folder.mkdir(parents=True)
        names = sorted(writers)
        for part, chunk in enumerate((names[:2], names[2:])):
            data = {"users": chunk, "num_samples": [writers[w][col] for w in chunk], "user_data": {}}
            for w in chunk:
                n = writers[w][col]
                data["user_data"][w] = {"x": rng.random((n, 784)).round(4).tolist(),
                                        "y": [int(v) for v in rng.integers(0, 62, n)]}
            (folder / f"all_data_{part}_niid_05_keep_0_{split}_9.json").write_text(json.dumps(data))
    return root


def test_femnist_reads_leafs_json_one_client_a_writer(tmp_path):
    raw = femnist(str(write_leaf(tmp_path)))
    assert raw.num_classes == 62 and raw.train_x.shape == (16, 1, 28, 28) and raw.test_x.shape == (5, 1, 28, 28)
    # Writers are numbered in sorted order, the same in both splits: f0001_41 -> 0, f0002_07 -> 1, f0100_12 -> 2.
    assert torch.bincount(raw.train_groups).tolist() == [5, 3, 8]
    assert torch.bincount(raw.test_groups).tolist() == [2, 1, 2]
    first = json.loads(next((tmp_path / "femnist/data/train").glob("*_0_*.json")).read_text())
    assert torch.allclose(raw.train_x[0].flatten(), torch.tensor(first["user_data"]["f0001_41"]["x"][0]))


def test_natural_keeps_the_k_largest_clients_with_their_own_examples(tmp_path):
    raw = femnist(str(write_leaf(tmp_path)))
    labels, groups = raw.train_y.numpy(), raw.train_groups.numpy()
    parts = natural(labels, 2, 62, seed=0, groups=groups)
    # The 2 largest writers (8 and 5 images: ids 2 and 0), in id order, each exactly its rows.
    assert [sorted(p.tolist()) for p in parts] == [np.nonzero(groups == 0)[0].tolist(), np.nonzero(groups == 2)[0].tolist()]
    assert [len(p) for p in natural(labels, 2, 62, seed=0, groups=groups, order="id")] == [5, 3]
    assert [len(p) for p in natural(labels, 2, 62, seed=9, groups=groups, min_examples=4)] == [5, 8]  # no seed in it
    with pytest.raises(ConfigError, match=r"^hyperparams.num_clients=3: partition=natural keeps that many .* it has "
                                          r"2 with at least 4 training example\(s\): choose hyperparams.num_clients <= 2 "
                                          r"or a lower partition.min_examples$"):
        natural(labels, 3, 62, seed=0, groups=groups, min_examples=4)
    with pytest.raises(ConfigError, match=r"^partition=natural: .* this dataset has no client ids"):
        natural(labels, 2, 62, seed=0)
    with pytest.raises(ConfigError, match=r"^partition.order=size: choose one of: largest, id$"):
        natural(labels, 2, 62, seed=0, groups=groups, order="size")


def test_the_client_ids_follow_their_examples_through_the_preparation():
    # Labels that name their client (y = group), so a misaligned id would show.
    groups = torch.arange(40) % 7
    raw = RawData(torch.rand(40, 1, 4, 4), groups.clone(), torch.rand(9, 1, 4, 4), torch.arange(9) % 7, 7,
                  groups.clone(), torch.arange(9) % 7)
    data = prepare(raw, None, None, validation_fraction=0.25, seed=3, max_train=30, max_test=5)
    assert len(data.train_y) == 22 and len(data.val_y) == 8 and len(data.test_y) == 5
    assert torch.equal(data.train_groups, data.train_y) and torch.equal(data.test_groups, data.test_y)
    assert client_ids(natural, data.train_groups)["groups"].tolist() == data.train_y.tolist()
    assert client_ids(lambda labels, num_clients, num_classes, seed: None, data.train_groups) == {}


def write_table(path, rows_per_user=(6, 3, 1), features=5, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user", *[f"f{i}" for i in range(features)], "target"])
        for u, n in zip(("carol", "alice", "bob"), rows_per_user):
            for _ in range(n):
                w.writerow([u, *rng.random(features).round(3), int(rng.integers(0, 3))])
    return path


def test_a_table_with_a_client_column_splits_each_client_into_its_own_train_and_test(tmp_path):
    path = write_table(tmp_path / "t.csv")
    raw = table(str(path), label_column="target", client_column="user", channels=1, image_size=None, test_fraction=0.3)
    # 5 features fit a 3 x 3 square, zero-padded; alice -> 0, bob -> 1, carol -> 2.
    assert raw.train_x.shape[1:] == (1, 3, 3) and raw.num_classes == 3
    assert float(raw.train_x.flatten(1)[:, 5:].abs().sum()) == 0.0
    # Each client's rows split by round(0.3 n), at least 1 of 2 or more, none of 1 row: alice 3 -> 1,
    # bob 1 -> 0, carol 6 -> 2.
    assert torch.bincount(raw.test_groups, minlength=3).tolist() == [1, 0, 2]
    assert torch.bincount(raw.train_groups, minlength=3).tolist() == [2, 1, 4]
    with pytest.raises(ConfigError, match=r"^dataset.load.client_column=device: is not a column of t.csv; it has: "
                                          r"user, f0, f1, f2, f3, f4, target$"):
        table(str(path), label_column="target", client_column="device")
    with pytest.raises(ConfigError, match=r"^dataset.load.feature_columns=5: features cannot fit in 1 x 2 x 2"):
        table(str(path), label_column="target", client_column="user", image_size=2)
    with pytest.raises(DataError, match=r"^dataset.load.path: file .*nothing.csv not found$"):
        table(str(tmp_path / "nothing.csv"))


def test_a_bad_leaf_folder_is_one_line(tmp_path):
    with pytest.raises(DataError, match=r"^dataset.load.train: folder .*femnist/data/train not found"):
        femnist(str(tmp_path))
    (tmp_path / "femnist/data/train").mkdir(parents=True)
    (tmp_path / "femnist/data/test").mkdir(parents=True)
    (tmp_path / "femnist/data/train/a.json").write_text('{"users": ["u"], "user_data": {}}')
    (tmp_path / "femnist/data/test/a.json").write_text('{"users": [], "user_data": {}}')
    with pytest.raises(DataError, match=r"a.json: not a LEAF file \(KeyError"):
        femnist(str(tmp_path))


@pytest.mark.slow
def test_a_femnist_run_from_leaf_files_keeps_the_writers(tmp_path):
    root = write_leaf(tmp_path / "leaf")
    run = tmp_path / "run"
    fedrun_ok(["dataset=femnist", f"dataset.load.root={root}", "partition=natural", "model=mlp", "model.hidden=[8]",
               "hyperparams.num_clients=2", "hyperparams.client_fraction=1.0", "hyperparams.rounds=2",
               "hyperparams.batch_size=4", "aggregator=fedavg", "progress=false", f"hydra.run.dir={run}"], tmp_path)
    part = pd.read_csv(run / "partition.csv")
    assert part["examples"].tolist() == [5, 8]  # the two largest writers, f0001_41 and f0100_12
    rounds = pd.read_csv(run / "rounds.csv")
    assert len(rounds) == 2 and rounds["test_acc"].between(0, 1).all()


# ----------------------------------------------------------------------------- per-client accuracy

def test_client_scores_by_hand():
    # logits [x, -x]: class 0 where x > 0.  Client 0: x = 1 (y 0, right), -1 (y 0, wrong); client 1:
    # x = 2 (y 1, wrong), -3 (y 1, right); client 2 has no test data.  Cross-entropy of [a, -a] for
    # class 0 is log(1 + e^(-2a)), for class 1 log(1 + e^(2a)).
    model = torch.nn.Linear(1, 2, bias=False)
    state = {"weight": torch.tensor([[1.0], [-1.0]])}
    x, y = torch.tensor([[1.0], [-1.0], [2.0], [-3.0]]), torch.tensor([0, 0, 1, 1])
    rows = [torch.tensor([0, 1]), torch.tensor([3, 2]), torch.tensor([], dtype=torch.long)]
    (a0, l0), (a1, l1), (a2, l2) = client_scores(model, state, x, y, rows, batch_size=3)  # a batch spans two clients
    assert (a0, a1) == (0.5, 0.5) and a2 != a2 and l2 != l2
    assert l0 == pytest.approx((np.log1p(np.exp(-2)) + np.log1p(np.exp(2))) / 2)  # 1.126928
    assert l1 == pytest.approx((np.log1p(np.exp(4)) + np.log1p(np.exp(-6))) / 2)  # 2.010313


def test_client_summary_mean_std_and_worst_tenth():
    out = client_summary([1.0, 0.5, 0.0, float("nan")])  # the client without test data left out
    assert out == pytest.approx({"client_acc_mean": 0.5, "client_acc_std": (1 / 6) ** 0.5, "client_acc_worst10": 0.0})
    twenty = client_summary([k / 20 for k in range(20)])  # the worst 10% of 20 clients: the two lowest
    assert twenty["client_acc_worst10"] == pytest.approx(0.025)
    assert client_summary([float("nan")]) == {}


def test_each_natural_client_owns_the_test_rows_of_its_id():
    train_groups, test_groups = np.array([7, 3, 7, 9, 3]), np.array([9, 7, 7, 5, 3])
    parts = [np.array([1, 4]), np.array([0, 2]), np.array([3])]  # clients 3, 7, 9
    rows = client_test_rows(parts, torch.as_tensor(train_groups), torch.as_tensor(test_groups))
    assert [r.tolist() for r in rows] == [[4], [1, 2], [0]]
    assert client_test_rows([np.array([0, 1])], train_groups, test_groups) is None  # a part mixing two clients
    assert client_test_rows(parts, train_groups, None) is None


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_each_sampled_writers_own_accuracy_adds_up_to_the_test_sets(tmp_path, engine):
    # Every writer kept and sampled: the test set is the writers' test images together, so the
    # test-size-weighted mean of their own scores is the global model's test score.
    root = write_leaf(tmp_path / "leaf")
    run = tmp_path / "run"
    common = ["dataset=femnist", f"dataset.load.root={root}", "partition=natural", "model=mlp", "model.hidden=[8]",
              "hyperparams.num_clients=3", "hyperparams.rounds=3", "hyperparams.batch_size=4", "aggregator=fedavg",
              "progress=false", f"engine={engine}"]
    fedrun_ok([*common, "hyperparams.client_fraction=1.0", f"hydra.run.dir={run}"], tmp_path)
    clients, rounds = pd.read_csv(run / "clients.csv"), pd.read_csv(run / "rounds.csv")
    tests = {0: 2, 1: 1, 2: 2}  # the writers' test images, in id order (f0001_41, f0002_07, f0100_12)
    for t, g in clients.groupby("round"):
        row = rounds.set_index("round").loc[t]
        n = g["client"].map(tests)
        assert sorted(g["client"]) == [0, 1, 2]
        assert ((g["own_test_acc"] * n).round(9) % 1 == 0).all()  # whole images right
        assert (g["own_test_loss"] * n).sum() / n.sum() == pytest.approx(row["test_loss"], rel=1e-6)
        assert (g["own_test_acc"] * n).sum() / n.sum() == pytest.approx(row["test_acc"])
        assert row["client_acc_mean"] == pytest.approx(g["own_test_acc"].mean())
        assert row["client_acc_worst10"] == pytest.approx(g["own_test_acc"].min())  # 1 of 3 clients
    # One client a round, scored every second round (and the last): the others' rows stay empty.
    fedrun_ok([*common, "hyperparams.client_fraction=0.34", "client_eval_every=2", f"hydra.run.dir={tmp_path / 'r2'}"],
              tmp_path)
    clients, rounds = pd.read_csv(tmp_path / "r2" / "clients.csv"), pd.read_csv(tmp_path / "r2" / "rounds.csv")
    assert rounds["client_acc_mean"].notna().tolist() == [False, True, True]
    assert clients.groupby("round")["own_test_acc"].count().tolist() == [0, 1, 1]
    assert rounds["client_acc_std"].dropna().tolist() == [0.0, 0.0]


@pytest.mark.slow
def test_per_client_accuracy_without_per_client_test_data_is_one_line(tmp_path):
    proc = run_fedrun(["dataset=synthetic", "model=mlp", "scale=tiny", "client_eval_every=1",
                       f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "fedrun: error: client_eval_every=1: needs each client's own test data: client_test_fraction > 0 (on any partition), "
        "or partition=natural")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_table_run_and_bad_input_from_the_command_line(tmp_path):
    path = write_table(tmp_path / "t.csv", rows_per_user=(12, 10, 8))
    common = ["dataset=table", f"dataset.load.path={path}", "dataset.load.label_column=target",
              "dataset.load.client_column=user", "dataset.num_classes=3", "dataset.image_size=3", "model=mlp",
              "model.hidden=[4]", "partition=natural", "hyperparams.client_fraction=1.0", "hyperparams.rounds=2",
              "hyperparams.batch_size=4", "aggregator=fedavg", "progress=false"]
    fedrun_ok([*common, "hyperparams.num_clients=3", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    proc = run_fedrun([*common, "hyperparams.num_clients=4", f"hydra.run.dir={tmp_path / 'four'}"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "fedrun: error: hyperparams.num_clients=4: partition=natural keeps that many of the data's clients, and it "
        "has 3 with at least 1 training example(s): choose hyperparams.num_clients <= 3")
    assert not (tmp_path / "four").exists()
    proc = run_fedrun(["dataset=synthetic", "model=mlp", "partition=natural", "scale=tiny",
                       f"hydra.run.dir={tmp_path / 'synthetic'}"], tmp_path)
    assert proc.returncode == 2 and "partition=natural: keeps the clients a dataset names" in proc.stderr
    assert not (tmp_path / "synthetic").exists()


def test_a_tables_features_are_standardized_each_on_its_own_as_standard_scaler(tmp_path):
    """dataset=table standardizes every feature column by its own training mean and std (ddof=0,
    StandardScaler's), so an income in thousands and a ratio in hundredths weigh alike; the
    zero padding (no variance) stays 0; the test rows use the training rows' statistics."""
    from conftest import compose

    path = tmp_path / "scales.csv"
    rng = np.random.default_rng(1)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user", "income", "ratio", "age", "target"])
        for i in range(40):
            w.writerow([f"u{i % 4}", round(rng.normal(50_000, 9_000), 1), round(rng.normal(0.02, 0.005), 5),
                        int(rng.integers(18, 90)), i % 2])
    raw = table(str(path), label_column="target", client_column="user", channels=1, image_size=None)
    assert compose(["dataset=table"], resolve=True)["dataset"]["normalize"] == "per_feature"
    data = prepare(raw, None, None, normalize="per_feature")
    train = raw.train_x.flatten(1).double().numpy()
    mean, std = train[:, :3].mean(0), train[:, :3].std(0)  # StandardScaler: ddof=0
    got = data.train_x.flatten(1).double().numpy()
    np.testing.assert_allclose(got[:, :3], (train[:, :3] - mean) / std, atol=1e-4)
    np.testing.assert_allclose(got[:, :3].mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(got[:, :3].std(0), 1, atol=1e-4)
    assert float(np.abs(got[:, 3:]).max()) == 0.0  # the 4th value pads 3 features to 2 x 2
    test = raw.test_x.flatten(1).double().numpy()
    np.testing.assert_allclose(data.test_x.flatten(1).double().numpy()[:, :3], (test[:, :3] - mean) / std, atol=1e-4)
    # per_channel, the images' normalization, scales every feature by one std: the ratio's spread vanishes.
    channel = prepare(raw, None, None, normalize="per_channel").train_x.flatten(1).double().numpy()
    assert channel[:, 1].std() < 1e-3
    with pytest.raises(ConfigError, match=r"^dataset.mean=\[0.5\]: must be null with dataset.normalize=per_feature"):
        prepare(raw, [0.5], [0.2], normalize="per_feature")


# ----------------------------------------------------------------------------- FEMNIST-shaped synthetic writers

def test_writer_sizes_have_leafs_mean_and_spread():
    # 20,000 draws of LEAF's log-normal: the mean 226.83 and the std 88.94 within a few standard errors
    # (std of the mean: 88.94 / sqrt(20,000) = 0.63); every writer at least 2 examples; seeded.
    sizes = writer_sizes(20_000, 226.83, 88.94, seed=0)
    assert abs(sizes.mean() - 226.83) < 3 and abs(sizes.std() - 88.94) < 3 and sizes.min() >= 2
    assert np.array_equal(sizes, writer_sizes(20_000, 226.83, 88.94, seed=0))
    assert not np.array_equal(sizes, writer_sizes(20_000, 226.83, 88.94, seed=1))
    assert writer_sizes(5, 10.0, 0.0, seed=3).tolist() == [10] * 5  # no spread: every writer the mean
    assert writer_sizes(1000, 2.0, 50.0, seed=0).min() == 2  # small draws raised to one train and one test example


def test_synthetic_writers_split_each_writer_as_leaf():
    # 4 writers of exactly 20 examples each: LEAF's --tf 0.9 holds 2 of each out (floor(0.1 * 20)).
    raw = synthetic_writers(writers=4, size_mean=20, size_std=0, num_classes=5, image_size=4, seed=0)
    assert torch.bincount(raw.train_groups).tolist() == [18] * 4 and torch.bincount(raw.test_groups).tolist() == [2] * 4
    assert raw.train_x.shape == (72, 1, 4, 4) and raw.num_classes == 5 and int(raw.train_y.max()) < 5
    again = synthetic_writers(writers=4, size_mean=20, size_std=0, num_classes=5, image_size=4, seed=0)
    assert torch.equal(raw.train_x, again.train_x) and torch.equal(raw.test_y, again.test_y)
    # Each writer's style: two writers' images of one class differ on average by their styles' difference.
    no_noise = synthetic_writers(writers=2, size_mean=400, size_std=0, num_classes=2, image_size=4, noise=0.0, seed=1)
    x, y, g = no_noise.train_x, no_noise.train_y, no_noise.train_groups
    a, b = x[(g == 0) & (y == 0)], x[(g == 1) & (y == 0)]
    assert torch.allclose(a - a[0], torch.zeros_like(a)) and not torch.allclose(a[0], b[0])  # one image a (writer, class)
    with pytest.raises(ConfigError, match="dataset.load.test_fraction"):
        synthetic_writers(writers=2, test_fraction=1.0)


def test_a_run_on_synthetic_writers_keeps_the_largest(tmp_path):
    run = tmp_path / "run"
    fedrun_ok(["dataset=synthetic_writers", "dataset.load.writers=30", "dataset.load.size_mean=12",
               "dataset.load.size_std=6", "dataset.image_size=8", "dataset.num_classes=4", "partition=natural",
               "model=mlp", "model.hidden=[8]", "hyperparams.num_clients=10", "hyperparams.client_fraction=0.5",
               "hyperparams.rounds=2", "hyperparams.batch_size=4", "aggregator=fedavg", "progress=false",
               f"hydra.run.dir={run}"], tmp_path)
    raw = synthetic_writers(writers=30, size_mean=12, size_std=6, image_size=8, num_classes=4)
    largest = sorted(torch.bincount(raw.train_groups).tolist(), reverse=True)[:10]
    assert sorted(pd.read_csv(run / "partition.csv")["examples"].tolist(), reverse=True) == largest
    rounds = pd.read_csv(run / "rounds.csv")
    assert len(rounds) == 2 and rounds["client_acc_mean"].notna().all()  # the writers' own test splits are scored
