"""Real LEAF FEMNIST files (../shared/data/femnist-leaf: LEAF's own output for 184 writers) through
``dataset=femnist``: the archive unpacks to the files its md5 list names, the loader gives what
LEAF's JSON files say (read here with the json module alone), and a whole run with
``partition=natural`` on them writes each writer's own accuracy.  Skipped where ../shared/data or
the archive is absent (users do not have it)."""
from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import SHARED_DATA, compose
from hydra.utils import instantiate

from fedrun.data.natural import femnist
from fedrun.models.layers import count_parameters

FOLDER = SHARED_DATA / "femnist-leaf"
ARCHIVE = FOLDER / "femnist_leaf_niid05_partial_json.tar.xz"
MD5SUMS = FOLDER / "MD5SUMS.json.txt"
TOP = "leaf_femnist_niid05_keep0"  # the archive's one folder: {train,test}/*.json


@pytest.fixture(scope="session")
def leaf_files(tmp_path_factory) -> Path:
    """The archive unpacked once for the session: the folder holding ``train/`` and ``test/``."""
    if not ARCHIVE.is_file() or not MD5SUMS.is_file():
        pytest.skip(f"{ARCHIVE.name} and {MD5SUMS.name} are absent from {FOLDER} (real data beside the checkout)")
    out = tmp_path_factory.mktemp("femnist_leaf")
    with tarfile.open(ARCHIVE, "r:xz") as tar:
        # The "data" filter (Python 3.11.4+, 3.10.12+) refuses links and paths out of the folder.
        tar.extractall(out, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return out / TOP


@pytest.fixture(scope="session")
def leaf_json(leaf_files) -> dict:
    """``{split: {writer: {"x": [...], "y": [...]}}}``, read with the json module alone (no fedrun):
    what the loader must give back."""
    splits = {}
    for split in ("train", "test"):
        users = {}
        for path in sorted((leaf_files / split).glob("*.json")):
            data = json.loads(path.read_text())
            assert data["num_samples"] == [len(data["user_data"][u]["y"]) for u in data["users"]], path.name
            for user in data["users"]:
                assert user not in users, f"{user} twice in {split}"
                users[user] = data["user_data"][user]
        splits[split] = users
    return splits


@pytest.fixture(scope="session")
def loaded(leaf_files):
    return femnist(train=str(leaf_files / "train"), test=str(leaf_files / "test"))


def test_the_unpacked_files_have_the_listed_md5s(leaf_files):
    listed = {}
    for line in MD5SUMS.read_text().splitlines():
        if line.strip():
            md5, name = line.split(maxsplit=1)
            listed[name.strip()] = md5
    found = {str(p.relative_to(leaf_files)): hashlib.md5(p.read_bytes()).hexdigest()
             for p in sorted(leaf_files.rglob("*.json"))}
    assert listed and found == listed


def test_the_loader_gives_what_leafs_json_files_say(leaf_json, loaded):
    train, test = leaf_json["train"], leaf_json["test"]
    writers = sorted(set(train) | set(test))  # the loader numbers writers by their sorted names
    assert loaded.num_classes == 62
    assert loaded.train_x.shape == (sum(len(u["y"]) for u in train.values()), 1, 28, 28)
    assert loaded.test_x.shape == (sum(len(u["y"]) for u in test.values()), 1, 28, 28)
    for split, raw_y, groups in (("train", loaded.train_y, loaded.train_groups), ("test", loaded.test_y, loaded.test_groups)):
        users = leaf_json[split]
        counts = np.bincount(groups.numpy(), minlength=len(writers))
        assert counts.tolist() == [len(users[w]["y"]) if w in users else 0 for w in writers], split
        assert Counter(raw_y.tolist()) == Counter(v for u in users.values() for v in u["y"]), split
        for i, w in enumerate(writers):  # each writer's labels, in LEAF's order
            assert raw_y[groups == i].tolist() == users.get(w, {"y": []})["y"], (split, w)
    # Writers in both splits keep one id: the training writers are all among the test writers.
    shared = sorted(set(train) & set(test))
    assert shared == sorted(train)
    ids = [writers.index(w) for w in shared]
    assert sorted(set(loaded.train_groups.tolist())) == ids
    assert set(ids) <= set(loaded.test_groups.tolist())
    # Pixels, exactly: the first and last writer's images and the largest writer's middle one.
    largest = max(train, key=lambda w: len(train[w]["y"]))
    for split, w, k in (("train", shared[0], 0), ("train", shared[-1], -1), ("train", largest, len(train[largest]["y"]) // 2),
                        ("test", writers[0], 0), ("test", writers[-1], -1)):
        x = loaded.train_x if split == "train" else loaded.test_x
        groups = loaded.train_groups if split == "train" else loaded.test_groups
        got = x[groups == writers.index(w)][k].view(-1).numpy()
        assert np.array_equal(got, np.asarray(leaf_json[split][w]["x"][k], dtype=np.float32)), (split, w, k)


def test_leafs_cnn_has_leafs_shapes():
    """LEAF's models/femnist/cnn.py: 'same' 5x5 convolutions keep 28 and 14, so FC 7*7*64 -> 2048 -> 62."""
    model = instantiate(compose(["experiment=femnist/leaf"]).model)
    assert count_parameters(model) == (25 * 32 + 32) + (25 * 32 * 64 + 64) + (7 * 7 * 64 * 2048 + 2048) + (2048 * 62 + 62)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 62)
    assert all(torch.count_nonzero(m.bias) == 0 for m in (model.conv1, model.conv2, model.fc1, model.fc2))  # TF's zeros


@pytest.mark.slow
def test_a_run_on_leafs_files_scores_every_writer_on_its_own_test_images(leaf_files, leaf_json, tmp_path):
    """The preset on one of LEAF's shards (its train and test file): every writer trains and is
    scored on its own test images, and those scores add up to the run's test accuracy."""
    import fedrun

    shard = min((leaf_files / "train").glob("*.json"), key=lambda p: p.stat().st_size)
    for split, name in (("train", shard.name), ("test", shard.name.replace("_train_", "_test_"))):
        (tmp_path / split).mkdir()
        shutil.copy(leaf_files / split / name, tmp_path / split / name)
    data = {s: json.loads(next((tmp_path / s).glob("*.json")).read_text())["user_data"] for s in ("train", "test")}
    writers = sorted(data["train"])
    run = tmp_path / "run"
    summary = fedrun.run(["experiment=femnist/leaf", f"dataset.load.train={tmp_path / 'train'}",
                          f"dataset.load.test={tmp_path / 'test'}", "model=mlp", "model.hidden=[16]",
                          f"hyperparams.num_clients={len(writers)}", "hyperparams.client_fraction=1.0",
                          "hyperparams.rounds=2", "hyperparams.batch_size=32", "progress=false", "device=cpu"],
                         run_dir=str(run))
    part = pd.read_csv(run / "partition.csv")
    assert part["examples"].tolist() == [len(data["train"][w]["y"]) for w in writers]
    classes = part.filter(like="class_").to_numpy()
    for k, w in enumerate(writers):  # each writer's label histogram
        assert classes[k].tolist() == np.bincount(data["train"][w]["y"], minlength=62).tolist(), w
    clients, rounds = pd.read_csv(run / "clients.csv"), pd.read_csv(run / "rounds.csv").set_index("round")
    tests = {k: len(data["test"][w]["y"]) for k, w in enumerate(writers)}
    for t, g in clients.groupby("round"):
        n = g["client"].map(tests)
        assert sorted(g["client"]) == list(range(len(writers)))
        assert ((g["own_test_acc"] * n).round(6) % 1 == 0).all()  # whole images right
        assert (g["own_test_acc"] * n).sum() / n.sum() == pytest.approx(rounds.loc[t, "test_acc"])
        assert rounds.loc[t, "client_acc_mean"] == pytest.approx(g["own_test_acc"].mean())
    assert summary["final_client_acc_mean"] == pytest.approx(rounds["client_acc_mean"].iloc[-1])


def test_the_docs_state_the_files_figures(leaf_files, leaf_json):
    """docs/reproductions.md's FEMNIST section gives the files' counts as the JSON files have them."""
    from conftest import REPO_ROOT

    text = " ".join((REPO_ROOT / "docs" / "reproductions.md").read_text().split("## FEMNIST (LEAF's writers, real data)")[1].split())
    train, test = leaf_json["train"], leaf_json["test"]
    images = sum(len(u["y"]) for u in test.values())
    shards = [len(list((leaf_files / s).glob("*.json"))) for s in ("train", "test")]
    assert f"the training files of {shards[0]} of its {shards[1]} shards and the test files of all {shards[1]}" in text
    assert (f"The test files hold {images:,} images of {len(test)} writers: those {len(train)} and "
            f"{len(set(test) - set(train))} writers whose training files are not among the {shards[0]}") in text
    assert f"in % of the {images:,} test images" in text
