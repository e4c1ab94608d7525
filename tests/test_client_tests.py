"""Every client its own test data on any partition (``client_test_fraction``), and scoring all K
clients (``client_eval_clients=all``): the split's properties, whole runs from the CLI, refusals."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import TINY, fedrun_ok, run_fedrun

from fedrun.data.client_tests import hold_out
from fedrun.errors import ConfigError


def parts_and_labels():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, 1000)
    order = rng.permutation(1000)
    sizes = [1, 3, 40, 156, 300, 500]
    cuts = np.cumsum([0, *sizes])
    return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:])], labels


def test_each_client_keeps_its_label_mix_and_one_example_to_train_on():
    parts, labels = parts_and_labels()
    train, test = hold_out(parts, labels, 0.2, seed=3)
    for part, tr, te in zip(parts, train, test):
        assert set(tr).isdisjoint(te) and sorted([*tr, *te]) == sorted(part)  # a split of the client's own
        assert len(tr) >= 1
        for c in np.unique(labels[part]):
            n = int((labels[part] == c).sum())
            held = int((labels[te] == c).sum())
            assert held == int(np.floor(0.2 * n + 0.5)) or (len(te) == len(part) - 1 and held <= n)
        assert list(tr) == [i for i in part if i in set(tr)]  # the partition's order kept
    assert [len(t) for t in test][:2] == [0, 0] and len(test[5]) in range(96, 105)  # 1: nothing, 3: none of 1-example classes
    again, _ = hold_out(parts, labels, 0.2, seed=3)
    other, _ = hold_out(parts, labels, 0.2, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(train, again))
    assert any(not np.array_equal(a, b) for a, b in zip(train, other))


@pytest.mark.parametrize("fraction", [1.0, -0.1, True])
def test_the_fraction_is_checked(fraction):
    parts, labels = parts_and_labels()
    with pytest.raises(ConfigError, match="client_test_fraction=.*must be in \\[0, 1\\)"):
        hold_out(parts, labels, fraction, 0)


def test_whole_runs_score_each_client_on_its_own_held_out_data(tmp_path):
    base = [*TINY, "hyperparams.num_clients=6", "partition=dirichlet", "client_test_fraction=0.25"]
    fedrun_ok([*base, f"hydra.run.dir={tmp_path / 'sampled'}"], tmp_path)
    clients = pd.read_csv(tmp_path / "sampled" / "clients.csv")
    rounds = pd.read_csv(tmp_path / "sampled" / "rounds.csv")
    assert clients["own_test_acc"].notna().all() and len(clients) == 2 * 3  # 3 of 6 a round, each scored
    assert rounds["client_acc_mean"].notna().all() and (rounds["client_acc_worst10"] <= rounds["client_acc_mean"]).all()
    fedrun_ok([*base[:-1], f"hydra.run.dir={tmp_path / 'none'}"], tmp_path)  # the same partition, nothing held out
    kept, whole = (pd.read_csv(tmp_path / run / "partition.csv") for run in ("sampled", "none"))
    classes = [c for c in whole.columns if c.startswith("class_")]
    expected = (whole[classes] - np.floor(0.25 * whole[classes] + 0.5)).clip(lower=0)
    assert (kept[classes] <= whole[classes]).all().all()
    assert (kept[classes] - expected).abs().to_numpy().sum() <= len(whole)  # a client's last example may stay
    fedrun_ok([*base, "client_eval_clients=all", f"hydra.run.dir={tmp_path / 'all'}"], tmp_path)
    every = pd.read_csv(tmp_path / "all" / "clients.csv")
    assert every.groupby("round")["client"].apply(sorted).tolist() == [list(range(6))] * 2
    assert every["own_test_acc"].notna().all()
    trained = every.dropna(subset=["update_norm"])
    assert trained.groupby("round").size().tolist() == [3, 3]  # the round's own clients still trained alone
    # The same clients train as without the option: the sampled ones' rows are the same
    assert trained[["round", "client", "loss"]].reset_index(drop=True).equals(
        clients[["round", "client", "loss"]].reset_index(drop=True))


def test_client_scores_without_own_test_data_name_the_fraction(tmp_path):
    proc = run_fedrun([*TINY, "client_eval_every=1", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    assert proc.returncode == 2 and "client_test_fraction > 0 (on any partition)" in proc.stderr
    proc = run_fedrun([*TINY, "client_test_fraction=0.2", "client_eval_clients=some", f"hydra.run.dir={tmp_path / 'r'}"],
                      tmp_path)
    assert proc.returncode == 2 and "client_eval_clients=some: must be sampled" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_personalized_scores_fine_tune_the_global_model_on_each_clients_own_data(tmp_path):
    """personalize_epochs: each scored client's fine-tuned model, scored on its own test split
    (clients.csv pers_test_*, rounds.csv pers_acc_*), beside the global model's own_test_*; the
    training is unchanged (the same rounds.csv as without it, the new columns and timings aside)."""
    base = [*TINY, "hyperparams.num_clients=4", "partition=dirichlet", "partition.alpha=0.1",
            "client_test_fraction=0.3"]
    fedrun_ok([*base, "personalize_epochs=3", f"hydra.run.dir={tmp_path / 'p'}"], tmp_path)
    fedrun_ok([*base, f"hydra.run.dir={tmp_path / 'g'}"], tmp_path)
    p_rounds, g_rounds = (pd.read_csv(tmp_path / run / "rounds.csv") for run in ("p", "g"))
    assert [c for c in p_rounds.columns if c not in g_rounds.columns] == ["pers_acc_mean", "pers_acc_std",
                                                                          "pers_acc_worst10"]
    timing = ["train_s", "eval_s", "wall_s"]
    pd.testing.assert_frame_equal(p_rounds[g_rounds.columns].drop(columns=timing), g_rounds.drop(columns=timing))
    clients = pd.read_csv(tmp_path / "p" / "clients.csv")
    assert clients["pers_test_acc"].notna().all() and clients["own_test_acc"].notna().all()
    # Fine-tuning on a client's own (alpha = 0.1: one or two classes) data moves its own accuracy.
    assert (clients["pers_test_acc"] != clients["own_test_acc"]).any()
    assert p_rounds["pers_acc_mean"].iloc[-1] == pytest.approx(clients[clients["round"] == 2]["pers_test_acc"].mean())
    import json
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["final_pers_acc_mean"] == pytest.approx(p_rounds["pers_acc_mean"].iloc[-1])
    refused = run_fedrun([*TINY, "personalize_epochs=2", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path)
    assert refused.returncode == 2 and "personalize_epochs=2: scores each client on its own test data" in refused.stderr
