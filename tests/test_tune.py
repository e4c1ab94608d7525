"""scripts/common/tune.py, the fair-baseline protocol: tune a setting on a validation split, pick by a
validation objective, then run the choice with several seeds on the test set.  The pick is
checked by hand on fake run folders; one whole protocol runs from the command line."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml

from scripts.common import tune
from conftest import TINY
from fedrun import results
from fedrun.errors import ConfigError


def fake_run(folder, val, diverged_at=None):
    """A tuning run as the pick reads it: config.yaml, rounds.csv with ``val_acc``, and either
    summary.json (finished) or run.json saying it diverged."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "aggregator": {"_target_": "x.fedprox"}}))
    pd.DataFrame({"round": range(1, len(val) + 1), "test_acc": [0.5] * len(val), "val_acc": val}).to_csv(
        folder / "rounds.csv", index=False)
    if diverged_at is None:
        (folder / "summary.json").write_text(json.dumps({"final_val_acc": val[-1]}))
    else:
        (folder / "run.json").write_text(json.dumps([{"reason": "diverged", "last_round": diverged_at - 1}]))


def test_mean_val_acc_objectives_by_hand(tmp_path):
    fake_run(tmp_path / "r", [0.2, 0.4, 0.9])
    assert results.objective({}, tmp_path / "r", "mean_val_acc") == pytest.approx(0.5)
    assert results.objective({}, tmp_path / "r", "mean_val_acc_last_2") == pytest.approx(0.65)
    assert results.objective({}, tmp_path / "r", "mean_test_acc") == pytest.approx(0.5)
    for bad in ("mean_val_acc_last_0", "mean_train_acc", "mean_val_acc_last_"):
        with pytest.raises(ConfigError, match="mean_val_acc"):
            results.check_objective(bad)


def test_pick_by_hand(tmp_path):
    """mu=0.01: (0.6 + 0.8) / 2 = 0.7 over the rounds, seeds 0 and 1 -> (0.7 + 0.5) / 2 = 0.6;
    mu=0.1: 0.65 and 0.55 -> 0.6 as well (a tie: the point listed first wins); mu=1 diverges
    in seed 1 and scores -inf however well seed 0 did."""
    axes = [("aggregator.mu", ["0.01", "0.1", "1"])]
    fake_run(tmp_path / "tune" / "mu0.01_seed0", [0.6, 0.8])
    fake_run(tmp_path / "tune" / "mu0.01_seed1", [0.4, 0.6])
    fake_run(tmp_path / "tune" / "mu0.1_seed0", [0.6, 0.7])
    fake_run(tmp_path / "tune" / "mu0.1_seed1", [0.5, 0.6])
    fake_run(tmp_path / "tune" / "mu1_seed0", [0.9, 0.99])
    fake_run(tmp_path / "tune" / "mu1_seed1", [0.3], diverged_at=2)
    choice = tune.pick(axes, ["0", "1"], tmp_path, "mean_val_acc")
    means = {r["point"]["aggregator.mu"]: r["mean"] for r in choice["rows"]}
    assert means["0.01"] == pytest.approx(0.6) and means["0.1"] == pytest.approx(0.6)
    assert means["1"] == -math.inf
    assert choice["chosen"] == {"aggregator.mu": "0.01"}
    # Without mu=0.01's seed 1 the protocol has no choice yet (a tuning run is missing).
    import shutil
    shutil.rmtree(tmp_path / "tune" / "mu0.01_seed1")
    assert tune.pick(axes, ["0", "1"], tmp_path, "mean_val_acc")["chosen"] is None


def test_grid_points_and_names():
    axes = [tune.grid_axis("aggregator.q=0.25,0.5"), tune.grid_axis("hyperparams.lr=0.1,0.01")]
    pts = tune.points(axes)
    assert [tune.point_name(p) for p in pts] == ["q0.25_lr0.1", "q0.25_lr0.01", "q0.5_lr0.1", "q0.5_lr0.01"]


@pytest.mark.parametrize("argv, words", [
    (["out", "--grid", "aggregator.mu=1"], ["at least two values"]),
    (["out", "--grid", "aggregator.mu=1,1"], ["repeated"]),
    (["out", "--grid", "aggregator.mu=1,2", "--objective", "best_test_acc"], ["never on the test set"]),
    (["out", "--grid", "aggregator.mu=1,2", "--objective", "mean_val_loss"], ["objective"]),
    (["out", "--grid", "aggregator.mu=1,2", "--validation-fraction", "0"], ["(0, 1)"]),
    (["out", "--grid", "aggregator.mu=1,2", "--", "seed=3"], ["seed=3", "sets these itself"]),
    (["out", "--grid", "aggregator.mu=1,2", "--", "aggregator.mu=5"], ["aggregator.mu=5"]),
    (["out"], ["--grid"]),
])
def test_bad_input_is_one_line(argv, words, capsys, tmp_path):
    argv[0] = str(tmp_path / "out")
    with pytest.raises(SystemExit) as e:
        tune.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()  # nothing written


def test_protocol_from_the_command_line(tmp_path, capsys, monkeypatch):
    """Two learning rates tuned on 1 seed with a fifth of the training set held out, the choice
    run once on the whole training set; a second call finds every run done and runs nothing."""
    monkeypatch.chdir(tmp_path)
    argv = ["p", "--grid", "hyperparams.lr=0.5,0.05", "--validation-fraction", "0.2", "--seeds", "3", "--",
            *TINY, "hyperparams.client_fraction=1.0"]
    assert tune.main(argv) == 0
    choice = json.loads((tmp_path / "p" / "choice.json").read_text())
    rows = {r["point"]["hyperparams.lr"]: r["mean"] for r in choice["rows"]}
    for lr in ("0.5", "0.05"):  # each score is the mean validation accuracy of its run
        run = tmp_path / "p" / "tune" / f"lr{lr}_seed0"
        assert results.read_config(run)["hyperparams"]["validation_fraction"] == 0.2
        assert rows[lr] == pytest.approx(pd.read_csv(run / "rounds.csv")["val_acc"].mean())
    best = max(rows, key=lambda lr: (rows[lr], lr == "0.5"))
    assert choice["chosen"] == {"hyperparams.lr": best}
    test = results.read_config(tmp_path / "p" / "test" / f"lr{best}_seed3")
    assert test["hyperparams"]["validation_fraction"] == 0.0 and test["seed"] == 3
    assert test["hyperparams"]["lr"] == float(best)
    out = capsys.readouterr().out
    assert "budget: 2 grid point(s) x 1 tuning seed(s) = 2 tuning run(s), then 1 test run(s)" in out
    assert "<- chosen" in out and "seed 3: final" in out
    assert tune.main(argv) == 0
    assert capsys.readouterr().out.count("0 run(s) to do") == 2
