"""``fedrun-plot`` (fedrun/plot.py) and the grouping it draws with (fedrun.results' ``group``
column and seed_curves): runs grouped by what differs but the seed, none left out, mean and band
over seeds."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import fedrun_ok

from fedrun import plot as fedrun_plot
from fedrun import results

# The README's sweep, shrunk as docs/sweeps.md advises (scale=tiny).
README_SWEEP = ["aggregator=fedavg,fedprox,normnorm,momentum,fednnnn", "seed=0,1", "scale=tiny", "progress=false"]
README_METHODS = ["FedAvg", "FedProx", "Norm-Norm", "Momentum", "FedNNNN"]


def fake_run(path: Path, aggregator: str, seed: int, accs: list[float], **settings) -> Path:
    """A run directory by hand: ``settings`` are the aggregator's keys (none: as FedAvg, no beta)."""
    path.mkdir(parents=True)
    config = {"seed": seed, "aggregator": {"_target_": f"fedrun.aggregators.{aggregator}", **settings},
              "dataset": {"name": "fmnist"}, "choices": {"aggregator": aggregator, "dataset": "fmnist"}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = ["round,test_acc,test_loss,N_over_E,server_step"]
    rows += [f"{t},{a},{1 - a},0.5,0.1" for t, a in enumerate(accs, start=1)]
    (path / "rounds.csv").write_text("\n".join(rows) + "\n")
    return path


def mixed_methods(top: Path) -> None:
    """FedAvg (no beta), Norm-Norm (beta 1.0) and FedNNNN at two betas, two seeds each: the
    setting ``aggregator.beta`` is NaN for FedAvg, the key pandas' groupby drops."""
    i = 0
    for agg, beta in [("fedavg", None), ("normnorm", 1.0), ("fednnnn", 0.7), ("fednnnn", 0.9)]:
        for seed in (0, 1):
            settings = {} if beta is None else {"beta": beta}
            fake_run(top / str(i), agg, seed, [0.5, 0.6 + 0.1 * seed], **settings)
            i += 1


def test_no_method_is_lost_to_a_nan_setting(tmp_path):
    mixed_methods(tmp_path)
    df = results.load(tmp_path)
    assert df["aggregator.beta"].isna().any()  # FedAvg has no beta: the trap pandas' groupby falls into
    assert len(df.groupby(["aggregator", "aggregator.beta"]).size()) == 3  # ... and loses FedAvg
    assert not df["group"].isna().any() and not df["method"].isna().any()
    final = results.last_round(df).groupby("group").test_acc.agg(["mean", "count"])
    # Labels: the method's name, and only the settings that differ within that method.
    assert sorted(final.index) == ["FedAvg", "FedNNNN, beta=0.7", "FedNNNN, beta=0.9", "Norm-Norm"]
    assert final["count"].tolist() == [2, 2, 2, 2] and final["mean"].tolist() == pytest.approx([0.65] * 4)
    assert not any("nan" in g.lower() or "none" in g.lower() for g in final.index)


def test_a_setting_that_differs_for_every_method_is_in_every_label(tmp_path):
    for i, (agg, lr) in enumerate([("fedavg", 0.1), ("fedavg", 0.2), ("fednnnn", 0.1), ("fednnnn", 0.2)]):
        run = fake_run(tmp_path / str(i), agg, 0, [0.5], **({"beta": 0.7} if agg == "fednnnn" else {}))
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["hyperparams"] = {"lr": lr}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    labels = sorted(set(results.load(tmp_path)["group"]))
    assert labels == ["FedAvg, lr=0.1", "FedAvg, lr=0.2", "FedNNNN, lr=0.1", "FedNNNN, lr=0.2"]


def test_a_setting_set_for_some_runs_of_a_method_only_is_shown_unset(tmp_path):
    fake_run(tmp_path / "a", "fednnnn", 0, [0.5], beta=0.7)
    fake_run(tmp_path / "b", "fednnnn", 0, [0.5])
    assert sorted(set(results.load(tmp_path)["group"])) == ["FedNNNN, beta unset", "FedNNNN, beta=0.7"]


def test_a_partition_setting_is_shown_only_where_runs_of_that_partition_differ(tmp_path):
    cells = [("shards", {"shards_per_client": 2}), ("dirichlet", {"alpha": 0.1}), ("dirichlet", {"alpha": 1.0})]
    for i, (partition, keys) in enumerate(cells):
        run = fake_run(tmp_path / str(i), "fedavg", 0, [0.5])
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["partition"], config["choices"]["partition"] = keys, partition
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    labels = sorted(set(results.load(tmp_path)["group"]))
    # shards has no alpha (not "alpha unset"), dirichlet no shards_per_client.
    assert labels == ["FedAvg, partition=dirichlet, alpha=0.1", "FedAvg, partition=dirichlet, alpha=1",
                      "FedAvg, partition=shards"]


def test_seed_curves_mean_and_bands_by_hand(tmp_path):
    mixed_methods(tmp_path)
    df = results.load(tmp_path)
    std = results.seed_curves(df, ["test_acc"], "std")
    assert list(std.columns) == list(results.CURVE_COLUMNS)
    # Methods in the order of METHOD_NAMES; every group, every round.
    assert list(dict.fromkeys(std["group"])) == ["FedAvg", "Norm-Norm", "FedNNNN, beta=0.7", "FedNNNN, beta=0.9"]
    avg = std[std["group"] == "FedAvg"].set_index("round")
    # Round 2: seeds at 0.6 and 0.7 -> mean 0.65, sample std 0.1/sqrt(2).
    assert avg.loc[2, "mean"] == pytest.approx(0.65) and avg.loc[2, "n"] == 2
    assert avg.loc[2, "high"] - avg.loc[2, "mean"] == pytest.approx(0.1 / math.sqrt(2))
    assert avg.loc[1, "low"] == avg.loc[1, "high"] == pytest.approx(0.5)  # both seeds 0.5: no spread
    mm = results.seed_curves(df, ["test_acc"], "minmax").set_index(["group", "round"])
    assert (mm.loc[("FedAvg", 2), "low"], mm.loc[("FedAvg", 2), "high"]) == pytest.approx((0.6, 0.7))
    with pytest.raises(results.ConfigError, match="band=ci: choose one of: std, minmax, none"):
        results.seed_curves(df, ["test_acc"], "ci")


def test_writes_png_pdf_and_the_data_drawn(tmp_path, capsys):
    for i, (agg, seed) in enumerate([("fedavg", 0), ("fedavg", 1), ("fednnnn", 0), ("fednnnn", 1)]):
        fake_run(tmp_path / "runs" / str(i), agg, seed, [0.4, 0.5 + 0.2 * seed, 0.7], beta=0.7)
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs"), "--band", "minmax"]) == 0
    png, pdf = tmp_path / "figs" / "runs.png", tmp_path / "figs" / "runs.pdf"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert pdf.read_bytes()[:5] == b"%PDF-"
    drawn = pd.read_csv(tmp_path / "figs" / "runs.csv")
    assert len(drawn) == 2 * 4 * 3  # 2 groups x 4 panels x 3 rounds
    row = drawn[(drawn.group == "FedAvg") & (drawn.metric == "test_acc") & (drawn["round"] == 2)].iloc[0]
    assert (row["mean"], row["low"], row["high"], row["n"]) == pytest.approx((0.6, 0.5, 0.7, 2))
    printed = capsys.readouterr().out
    assert "FedAvg: 2 runs (seeds 0, 1), rounds 1-3, 4 of 4 panels" in printed
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "svg"), "--formats", "svg"]) == 0
    assert (tmp_path / "svg" / "runs.svg").read_text().lstrip().startswith("<?xml")
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "x"), "--formats", "gif"]) == 2
    (tmp_path / "empty").mkdir()
    assert fedrun_plot.main([str(tmp_path / "empty"), "--out", str(tmp_path / "figs")]) == 2


def test_a_group_without_values_is_a_warning_not_a_silent_gap(tmp_path, capsys):
    fake_run(tmp_path / "a", "fedavg", 0, [0.5, 0.6])
    run = fake_run(tmp_path / "b", "momentum", 0, [0.5, 0.6], gamma=0.9)
    (run / "rounds.csv").write_text("round,test_acc,test_loss,N_over_E,server_step\n1,0.5,0.5,,0.1\n2,0.6,0.4,,0.1\n")
    assert fedrun_plot.main([str(tmp_path), "--out", str(tmp_path / "figs")]) == 0
    printed = capsys.readouterr().out
    assert "Momentum: 1 run, rounds 1-2, 3 of 4 panels" in printed
    assert "warning: Momentum: no values of N_over_E; left out of its panel" in printed


@pytest.mark.slow
def test_the_readme_sweep_at_tiny_scale_draws_five_different_methods(tmp_path, shared_data, capsys):
    """The README's sweep at scale=tiny, plotted as the README says: five groups drawn and
    listed, the docstring's table has five rows, and the five methods' final losses differ."""
    data = [f"dataset.load.search=[{shared_data / 'fashion-mnist'}]", "dataset.load.download=false"]
    sweep = tmp_path / "sweep"
    proc = fedrun_ok(["-m", *README_SWEEP, *data, f"hydra.sweep.dir={sweep}"], tmp_path, timeout=300)
    assert "K=25 clients (3 a round), 3 rounds" in proc.stderr + proc.stdout  # C = 0.1 kept, 3 clients a round
    assert fedrun_plot.main([str(sweep), "--out", str(tmp_path / "figs")]) == 0
    printed = capsys.readouterr().out.splitlines()
    for method in README_METHODS:
        assert f"{method}: 2 runs (seeds 0, 1), rounds 1-3, 4 of 4 panels" in printed
    drawn = pd.read_csv(tmp_path / "figs" / "runs.csv")
    assert list(dict.fromkeys(drawn["group"])) == README_METHODS
    df = results.load(sweep)
    # The module docstring's example: one row per method.
    final = results.last_round(df).groupby("group").test_acc.agg(["mean", "std", "count"])
    assert sorted(final.index) == sorted(README_METHODS) and set(final["count"]) == {2}
    # At tiny scale the methods still differ: pairwise different final losses (each seed).
    last = results.last_round(df)
    for seed in (0, 1):
        losses = last[last.seed == seed].set_index("method")["test_loss"]
        assert len(set(losses.round(7))) == 5, losses
    assert (last["N_over_E"] < 1).all()  # several clients a round disagree
    local_steps = results.load_clients(sweep)["steps"]
    assert local_steps.min() >= 2  # FedProx's proximal term acts from the second step


def test_the_fedrun_plot_command_from_any_directory(tmp_path):
    """The console script ``pip install`` makes: its help from a folder that is not the checkout,
    and without loading matplotlib (only drawing does); ``python -m fedrun.plot`` too."""
    exe = Path(sys.executable).parent / "fedrun-plot"
    if not exe.is_file():
        pytest.skip("fedrun is not installed in this environment (no fedrun-plot beside python)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(exe), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: fedrun-plot") and "--band {std,minmax,none}" in done.stdout
    assert "fedrun-plot outputs/multirun" in done.stdout  # the docstring is the help
    bad = subprocess.run([str(exe), str(tmp_path), "--out", str(tmp_path / "f")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("fedrun-plot: no run directories")
    light = subprocess.run([sys.executable, "-c", "import sys, fedrun.plot; print('matplotlib' in sys.modules)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert light.stdout.strip() == "False", light.stderr
    module = subprocess.run([sys.executable, "-m", "fedrun.plot", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert module.returncode == 0 and "usage: fedrun-plot" in module.stdout
