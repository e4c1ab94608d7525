"""``fedrun-plot`` (fedrun/plot.py) and the grouping it draws with (fedrun.results' ``group``
column and seed_curves): runs grouped by what differs but the seed, none left out, mean and band
over seeds."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY, fedrun_ok

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
    ci = results.seed_curves(df, ["test_acc"], "ci").set_index(["group", "round"])
    # n = 2: mean +- t_{0.975,1} s / sqrt(2), s = 0.1 / sqrt(2); no spread where the seeds agree.
    assert ci.loc[("FedAvg", 2), "high"] - 0.65 == pytest.approx(12.706 * 0.1 / math.sqrt(2) / math.sqrt(2))
    assert ci.loc[("FedAvg", 2), "low"] == pytest.approx(0.65 - 12.706 * 0.05)
    assert ci.loc[("FedAvg", 1), "low"] == ci.loc[("FedAvg", 1), "high"] == pytest.approx(0.5)
    with pytest.raises(results.ConfigError, match="band=sem: choose one of: std, minmax, ci, none"):
        results.seed_curves(df, ["test_acc"], "sem")


def test_the_confidence_interval_uses_t_quantiles():
    # t_{0.975, n-1} for n = 2, 3, 5, 10 seeds, as the tables give them; the normal 1.96 beyond 30.
    assert [results.t975(d) for d in (1, 2, 4, 9)] == [12.706, 4.303, 2.776, 2.262]
    assert results.t975(30) == 2.042 and results.t975(31) == results.t975(1000) == 1.96
    assert all(a > b for a, b in zip(results.T975, results.T975[1:]))  # falls with the degrees of freedom


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[16:24]
    return int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")


def test_writes_png_pdf_and_the_data_drawn(tmp_path, capsys):
    for i, (agg, seed) in enumerate([("fedavg", 0), ("fedavg", 1), ("fednnnn", 0), ("fednnnn", 1)]):
        fake_run(tmp_path / "runs" / str(i), agg, seed, [0.4, 0.5 + 0.2 * seed, 0.7], beta=0.7)
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs"), "--band", "minmax"]) == 0
    png, pdf = tmp_path / "figs" / "runs.png", tmp_path / "figs" / "runs.pdf"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert png_size(png) == (1050, 1560)  # one column, 3.5 x 5.2 in (two rows of two panels) at 300 dpi
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert b"/Type3" not in pdf.read_bytes() and b"/FontFile2" in pdf.read_bytes()  # TrueType fonts only
    drawn = pd.read_csv(tmp_path / "figs" / "runs.csv")
    assert len(drawn) == 2 * 4 * 3  # 2 groups x 4 panels x 3 rounds
    row = drawn[(drawn.group == "FedAvg") & (drawn.metric == "test_acc") & (drawn["round"] == 2)].iloc[0]
    assert (row["mean"], row["low"], row["high"], row["n"]) == pytest.approx((0.6, 0.5, 0.7, 2))
    printed = capsys.readouterr().out
    assert "FedAvg: 2 runs (seeds 0, 1), rounds 1-3, 4 of 4 panels" in printed
    assert "setting: fmnist" not in printed and "setting: Fashion-MNIST" in printed
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "svg"), "--formats", "svg"]) == 0
    assert (tmp_path / "svg" / "runs.svg").read_text().lstrip().startswith("<?xml")
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "x"), "--formats", "gif"]) == 2
    (tmp_path / "empty").mkdir()
    assert fedrun_plot.main([str(tmp_path / "empty"), "--out", str(tmp_path / "figs")]) == 2


def test_the_legend_wraps_long_labels_and_the_figure_grows_to_hold_it(tmp_path):
    # 3.5 in at 7 pt: 3.5 * 72 * 0.95 / (0.55 * 7) = 62 characters, 58 after the handle's 4.
    short, ncols, lines = fedrun_plot.legend_layout(["FedAvg", "FedNNNN, beta=0.7"], 3.5, "Mean (n = 2)")
    assert short == ["FedAvg", "FedNNNN, beta=0.7"] and ncols == 2 and lines == 2  # one row and the title
    long = ", ".join(f"setting{i}=value{i}" for i in range(6))  # 6 x 16 + 5 x 2 = 106 characters
    wrapped, ncols, lines = fedrun_plot.legend_layout(["FedAvg", long], 3.5)
    assert ncols == 1 and wrapped[0] == "FedAvg" and wrapped[1].replace("\n  ", " ") == long
    assert max(len(line) for line in wrapped[1].split("\n")) <= 58 and lines == 1 + 2
    # Nine groups of one run each (no title): two columns of up to 17 characters, five rows, two
    # lines more than a default figure holds, so the figure is two lines taller (the panels keep 5.2 in).
    for beta in range(9):
        fake_run(tmp_path / "runs" / str(beta), "fednnnn", 0, [0.5, 0.6], beta=beta / 10)
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs")]) == 0
    width, height = png_size(tmp_path / "figs" / "runs.png")
    assert width == 1050 and height == pytest.approx(300 * (5.2 + 2 * fedrun_plot.LINE_HEIGHT), abs=1)


def test_a_group_without_values_is_a_warning_not_a_silent_gap(tmp_path, capsys):
    fake_run(tmp_path / "a", "fedavg", 0, [0.5, 0.6])
    run = fake_run(tmp_path / "b", "momentum", 0, [0.5, 0.6], gamma=0.9)
    (run / "rounds.csv").write_text("round,test_acc,test_loss,N_over_E,server_step\n1,0.5,0.5,,0.1\n2,0.6,0.4,,0.1\n")
    assert fedrun_plot.main([str(tmp_path), "--out", str(tmp_path / "figs")]) == 0
    printed = capsys.readouterr().out
    assert "Momentum: 1 run, rounds 1-2, 3 of 4 panels" in printed
    assert "warning: Momentum: no values of N_over_E; left out of its panel" in printed


def diverged(run: Path, at: int) -> Path:
    """Make ``run`` one that diverged in round ``at``, as fedrun leaves it: run.json says so, its
    rounds.csv holds the rounds before, no summary.json."""
    (run / "run.json").write_text(json.dumps([{"first_round": 1, "last_round": at - 1, "reason": "diverged",
                                               "error": f"round {at}: parameter fc1.weight is NaN or Inf"}]))
    rows = (run / "rounds.csv").read_text().splitlines()
    (run / "rounds.csv").write_text("\n".join(rows[:at]) + "\n")
    return run


def test_a_diverged_run_says_so_in_the_legend_and_the_caption(tmp_path, capsys, monkeypatch):
    """FedAvg's seed 1 diverged at round 3 and Norm-Norm's only run at round 2: their legend
    entries say so (the curve ends early, not unexplained); Momentum diverged in round 1, so has
    nothing to draw: the caption and the log name it instead of dropping it unsaid."""
    from matplotlib.figure import Figure

    fake_run(tmp_path / "a0", "fedavg", 0, [0.4, 0.5, 0.6, 0.7])
    diverged(fake_run(tmp_path / "a1", "fedavg", 1, [0.4, 0.5, 0.6, 0.7]), 3)
    diverged(fake_run(tmp_path / "n0", "normnorm", 0, [0.3, 0.4, 0.5, 0.6], beta=1.0), 2)
    diverged(fake_run(tmp_path / "m0", "momentum", 0, [0.3, 0.4, 0.5, 0.6], gamma=0.9), 1)
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: figures.append(self))
    assert fedrun_plot.main([str(tmp_path), "--out", str(tmp_path / "figs"), "--formats", "png"]) == 0
    legend = [t.get_text().replace("\n  ", " ") for t in figures[0].legends[0].get_texts()]
    assert legend == ["FedAvg (mean of 2) (seed 1 diverged at round 3)", "Norm-Norm (diverged at round 2)"]
    caption = figures[0].get_supxlabel().replace("\n", " ")
    assert f"not drawn: m0: diverged at round 1 (no rows in rounds.csv)" in caption
    printed = capsys.readouterr().out
    assert "FedAvg: 2 runs (seeds 0, 1), rounds 1-4, 4 of 4 panels" not in printed
    assert "FedAvg: 2 runs (seeds 0, 1), seed 1 diverged at round 3, rounds 1-4, 4 of 4 panels" in printed
    assert "Norm-Norm: 1 run, diverged at round 2, rounds 1-1, 4 of 4 panels" in printed
    assert f"warning: {(tmp_path / 'm0').resolve()}: diverged at round 1 (no rows in rounds.csv); not drawn" in printed


def with_hyperparams(run: Path, **hyperparams) -> Path:
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["hyperparams"] = {"num_clients": 100, "client_fraction": 0.1, "local_epochs": 5, "batch_size": 50,
                             "rounds": 3, **hyperparams}
    config["choices"]["partition"], config["partition"] = "dirichlet", {"alpha": 0.1, "sizes": "balanced"}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def test_panels_columns_and_size_are_options(tmp_path, capsys):
    import matplotlib

    for i, seed in enumerate((0, 1, 2)):
        with_hyperparams(fake_run(tmp_path / "runs" / str(i), "fedavg", seed, [0.4, 0.5 + 0.1 * seed, 0.7]))
    fonttype = matplotlib.rcParams["pdf.fonttype"]
    args = [str(tmp_path / "runs"), "--out", str(tmp_path / "figs"), "--band", "ci", "--metrics", "test_acc,N_over_E",
            "--cols", "1", "--figsize", "3.5,4"]
    assert fedrun_plot.main(args) == 0
    assert matplotlib.rcParams["pdf.fonttype"] == fonttype  # the TrueType setting stays inside the figure
    assert png_size(tmp_path / "figs" / "runs.png") == (1050, 1200)
    drawn = pd.read_csv(tmp_path / "figs" / "runs.csv")
    assert sorted(set(drawn.metric)) == ["N_over_E", "test_acc"]
    row = drawn[(drawn.metric == "test_acc") & (drawn["round"] == 2)].iloc[0]
    # Seeds 0.5, 0.6, 0.7: mean 0.6, s = 0.1, t_{0.975,2} = 4.303.
    half = 4.303 * 0.1 / math.sqrt(3)
    assert (row["low"], row["high"]) == pytest.approx((0.6 - half, 0.6 + half))
    printed = capsys.readouterr().out
    assert "FedAvg: 3 runs (seeds 0, 1, 2), rounds 1-3, 2 of 2 panels" in printed
    assert "setting: Fashion-MNIST, Dirichlet α=0.1, K=100 clients, C=0.1 (10 a round), E=5, B=50, 3 rounds" in printed
    # A wide row for a screen, and without the caption line.
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "wide"), "--figsize", "20,4.2",
                             "--no-caption", "--formats", "png"]) == 0
    assert png_size(tmp_path / "wide" / "runs.png") == (6000, 1260)
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "x"), "--metrics", "test_acc,acc"]) == 2
    assert "--metrics=test_acc,acc: choose from test_acc, test_loss" in capsys.readouterr().err
    for bad in (["--figsize", "3.5"], ["--cols", "0"], ["--band", "sem"]):  # one line, no usage block
        assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "x"), *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedrun-plot: error: argument {bad[0]}: ") and err.count("\n") == 1


def test_the_caption_says_which_settings_vary(tmp_path):
    with_hyperparams(fake_run(tmp_path / "a", "fedavg", 0, [0.5]))
    with_hyperparams(fake_run(tmp_path / "b", "fedavg", 0, [0.5]), local_epochs=1, client_fraction=0.2)
    assert fedrun_plot.setting([tmp_path / "a", tmp_path / "b"]) == \
        "Fashion-MNIST, Dirichlet α=0.1, K=100 clients, C varies, E varies, B=50, 3 rounds"
    fake_run(tmp_path / "c", "fedavg", 0, [0.5])  # no hyperparams recorded: K, E ... said to vary
    assert fedrun_plot.setting([tmp_path / "a", tmp_path / "c"]) == \
        "Fashion-MNIST, partition varies, K varies, C varies, E varies, B varies, rounds vary"
    assert fedrun_plot.setting([tmp_path / "c"]) == "Fashion-MNIST"
    labels = {m: label for m, (label, _, _) in fedrun_plot.METRICS.items()}
    assert labels["server_step"].endswith(r"$\|w_{t+1} - w_t\|$") and labels["N_over_E"] == "$N/E$"
    assert fedrun_plot.layout(4) == (2, 2, (3.5, 5.2)) and fedrun_plot.layout(4, figsize=(7.16, 2.6))[:2] == (1, 4)


def test_the_caption_names_a_data_subset(tmp_path):
    run = with_hyperparams(fake_run(tmp_path / "a", "fedavg", 0, [0.5]))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["dataset"].update(max_train=1000, max_test=300)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert fedrun_plot.setting([run]).startswith(
        "Fashion-MNIST (1,000 random training images; 300 random test images), Dirichlet")
    other = with_hyperparams(fake_run(tmp_path / "b", "fedavg", 1, [0.5]))
    assert fedrun_plot.setting([run, other]).startswith("Fashion-MNIST data subset varies, ")


def test_a_seed_run_twice_and_a_clipped_band_are_said(tmp_path, capsys):
    """Two runs of one config and seed count as two seeds in the band: a warning names them; a
    band cut at an accuracy bound is drawn clipped and says so."""
    fake_run(tmp_path / "first", "fedavg", 0, [0.05, 0.98])
    fake_run(tmp_path / "again", "fedavg", 0, [0.5, 0.99])
    fake_run(tmp_path / "other", "fedavg", 1, [0.95, 0.40])
    assert fedrun_plot.main([str(tmp_path), "--out", str(tmp_path / "figs"), "--metrics", "test_acc"]) == 0
    out = capsys.readouterr().out
    assert "warning: FedAvg: seed 0 in 2 runs (again, first): the same config run again" in out
    assert ("note: FedAvg: the band of test_acc (mean ± one standard deviation over seeds) reaches past [0, 1]; "
            "drawn clipped to it") in out


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
    assert done.stdout.startswith("usage: fedrun-plot") and "--band {std,minmax,ci,none}" in done.stdout
    assert "--figsize W,H" in done.stdout and "server_step_sum" in done.stdout  # the panels one can choose
    assert "fedrun-plot outputs/multirun" in done.stdout  # the docstring is the help
    bad = subprocess.run([str(exe), str(tmp_path), "--out", str(tmp_path / "f")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("fedrun-plot: error: no run directories")
    light = subprocess.run([sys.executable, "-c", "import sys, fedrun.plot; print('matplotlib' in sys.modules)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert light.stdout.strip() == "False", light.stderr
    module = subprocess.run([sys.executable, "-m", "fedrun.plot", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert module.returncode == 0 and "usage: fedrun-plot" in module.stdout


# ----------------------------------------------------------------------------- --x bytes

def with_bytes(run: Path, totals: list[float]) -> Path:
    """Give a hand-made run the bytes_total column of a fedrun that counts communication."""
    rounds = pd.read_csv(run / "rounds.csv")
    rounds["bytes_total"] = totals
    rounds.to_csv(run / "rounds.csv", index=False)
    return run


def test_x_bytes_draws_against_the_bytes_sent(tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    # FedAvg's seeds sent 1, 2, 3 MB and 1, 2, 4 MB (a drop-out differs): each round at the mean.
    with_bytes(fake_run(tmp_path / "runs" / "a0", "fedavg", 0, [0.4, 0.5, 0.6]), [1e6, 2e6, 3e6])
    with_bytes(fake_run(tmp_path / "runs" / "a1", "fedavg", 1, [0.4, 0.7, 0.8]), [1e6, 2e6, 4e6])
    figures = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), save(self, *a, **k)))
    args = [str(tmp_path / "runs"), "--out", str(tmp_path / "figs"), "--x", "bytes", "--metrics", "test_acc"]
    assert fedrun_plot.main(args) == 0
    drawn = pd.read_csv(tmp_path / "figs" / "runs.csv").set_index("round")
    assert drawn["bytes_total"].tolist() == [1e6, 2e6, 3.5e6]
    assert drawn["mean"].tolist() == pytest.approx([0.4, 0.6, 0.7])
    ax = figures[0].axes[0]
    assert ax.get_xlabel() == "Data sent (MB)"
    assert ax.lines[0].get_xdata().tolist() == pytest.approx([1.0, 2.0, 3.5])  # in MB
    assert ax.lines[0].get_ydata().tolist() == pytest.approx([40, 60, 70])  # in %
    # The unit follows the largest total: kB below a megabyte, GB from a gigabyte.
    df = results.load(tmp_path / "runs")
    assert fedrun_plot.bytes_axis(df) == ("Data sent (MB)", 1e-6)
    assert fedrun_plot.bytes_axis(df.assign(bytes_total=df.bytes_total / 1000)) == ("Data sent (kB)", 1e-3)
    assert fedrun_plot.bytes_axis(df.assign(bytes_total=df.bytes_total * 1000)) == ("Data sent (GB)", 1e-9)
    assert fedrun_plot.main([*args[:3], "--out", str(tmp_path / "r")]) == 0  # --x round, the default: as before
    assert "bytes_total" not in pd.read_csv(tmp_path / "r" / "runs.csv")


def test_x_bytes_refuses_a_run_from_before_the_column_in_one_line(tmp_path, capsys):
    with_bytes(fake_run(tmp_path / "runs" / "new", "fedavg", 0, [0.4, 0.5]), [1e6, 2e6])
    old = fake_run(tmp_path / "runs" / "old", "fedavg", 1, [0.4, 0.5])  # rounds.csv without bytes_total
    out = tmp_path / "figs"
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(out), "--x", "bytes"]) == 2
    err = capsys.readouterr().err
    assert err == (f"fedrun-plot: error: --x=bytes: {old.resolve()}: rounds.csv has no bytes_total column (written "
                   "by a fedrun before the communication columns); draw it with --x round, or run it again\n")
    assert not out.exists() or not any(out.iterdir())  # nothing written
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(out)]) == 0  # by round, the old run is drawn
    assert fedrun_plot.main([str(tmp_path / "runs"), "--out", str(out), "--x", "time"]) == 2
    assert capsys.readouterr().err == ("fedrun-plot: error: argument --x: invalid choice: 'time' (choose from "
                                       "'round', 'bytes')\n")


# ----------------------------------------------------------------------------- --partition

def fake_partition(path: Path, counts: list[list[int]], partition: str = "shards", **settings) -> Path:
    """A run directory with a partition.csv of ``counts`` (a row per client, a column per class) as
    fedrun writes it, and the config.yaml of a synthetic-data run with that partition."""
    path.mkdir(parents=True)
    config = {"seed": 0, "dataset": {"name": "synthetic"}, "partition": settings,
              "hyperparams": {"num_clients": len(counts)}, "choices": {"dataset": "synthetic", "partition": partition}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    header = "client,examples," + ",".join(f"class_{c}" for c in range(len(counts[0])))
    rows = [f"{k},{sum(row)}," + ",".join(map(str, row)) for k, row in enumerate(counts)]
    (path / "partition.csv").write_text("\n".join([header, *rows]) + "\n")
    return path


def test_partition_draws_a_stacked_bar_per_client(tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    run = fake_partition(tmp_path / "run", [[4, 0, 4], [0, 8, 0], [2, 2, 4], [0, 0, 8]], shards_per_client=2,
                         shard_size=None)
    figures = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), save(self, *a, **k)))
    assert fedrun_plot.main(["--partition", str(run), "--out", str(tmp_path / "figs")]) == 0
    png, pdf = tmp_path / "figs" / "partition.png", tmp_path / "figs" / "partition.pdf"
    assert png_size(png) == (1050, 900)  # one column, 3.5 x 3.0 in at 300 dpi
    assert b"/Type3" not in pdf.read_bytes() and b"/FontFile2" in pdf.read_bytes()
    ax = figures[0].axes[0]
    assert ax.get_title() == "synthetic data, partition=shards\n(shards_per_client=2), K=4 clients"
    # 3 classes x 4 clients: each class's bars start where the classes below end.
    bars = [(p.get_x() + p.get_width() / 2, p.get_y(), p.get_height()) for p in ax.patches]
    assert bars[4:8] == [(0, 4, 0), (1, 0, 8), (2, 2, 2), (3, 0, 0)]  # class 1
    assert [b[1] + b[2] for b in bars[8:]] == [8, 8, 8, 8]  # the stacks' tops: each client's examples
    legend = figures[0].legends[0]
    assert legend.get_title().get_text() == "Class" and [t.get_text() for t in legend.get_texts()] == ["2", "1", "0"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["partition: synthetic data, partition=shards (shards_per_client=2), K=4 clients",
                           "  4 clients, 32 training examples, 3 classes; each bar a client's examples of each class"]


def test_partition_of_many_classes_is_a_heat_map_of_clients_by_classes(tmp_path, capsys, monkeypatch):
    """62 classes (FEMNIST's): a client a column, a class a row, its examples as the colour (blank
    where none), each client's size in a bar above."""
    from matplotlib.figure import Figure

    counts = [[(k * c) % 5 if (k + c) % 3 else 0 for c in range(62)] for k in range(12)]
    run = fake_partition(tmp_path / "run", counts, "dirichlet", alpha=0.5)
    figures = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), save(self, *a, **k)))
    fedrun_plot.plot_partition(run, tmp_path / "figs", ("png",))
    top, heat = figures[0].axes[:2]
    shown = heat.get_images()[0].get_array()
    assert shown.shape == (62, 12)  # classes x clients
    assert (shown.mask == (np.array(counts).T == 0)).all()  # no examples: a blank cell
    assert (shown.filled(0) == np.array(counts).T).all()
    assert [p.get_height() for p in top.patches] == [sum(row) for row in counts]
    assert heat.get_ylabel() == "Class" and top.get_ylabel() == "Examples"
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == (f"  12 clients, {sum(map(sum, counts)):,} training examples, 62 classes; each column a "
                          "client: its size above, its examples of each class below (blank: none)")


def test_partition_of_many_clients_draws_the_first_hundred_and_says_so(tmp_path, capsys):
    counts = [[k % 7, 3, (k * 5) % 11] for k in range(150)]
    run = fake_partition(tmp_path / "run", counts, "dirichlet", alpha=0.1, sizes="powerlaw", power_law_exponent=1.5)
    paths = fedrun_plot.plot_partition(run, tmp_path / "figs", ("png",))
    assert paths == [tmp_path / "figs" / "partition.png"]
    assert png_size(paths[0]) == (2148, 900)  # a page's width, 7.16 in
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == ("partition: synthetic data, partition=dirichlet (alpha=0.1, sizes=powerlaw, "
                          "power_law_exponent=1.5), K=150 clients")
    assert printed[2] == "  clients 0-99 drawn, the first 100 by id; 50 more (clients 100-149) left out"


def test_partition_titles_and_ticks_by_hand():
    def title(choice, node):
        return fedrun_plot.partition_title({"choices": {"partition": choice, "dataset": "cifar10"},
                                            "partition": node}, 10)

    assert title("iid", {"sizes": "balanced", "power_law_exponent": 1.0, "samples_per_client": None}) == \
        "CIFAR-10, partition=iid, K=10 clients"
    assert title("classes", {"classes_per_client": 2, "assign": "niidbench", "sizes": "balanced"}) == \
        "CIFAR-10, partition=classes (classes_per_client=2, assign=niidbench), K=10 clients"
    assert title("dirichlet_labels", {"alpha": 0.5, "min_size": 10, "balance": False}) == \
        "CIFAR-10, partition=dirichlet_labels (alpha=0.5, min_size=10, balance=false), K=10 clients"
    assert title("flwr", {"partitioner": {"_target_": "flwr_datasets.partitioner.DirichletPartitioner",
                                          "_partial_": True, "partition_by": "label", "alpha": 0.3}}) == \
        "CIFAR-10, partition=flwr (partitioner=DirichletPartitioner, partition_by=label, alpha=0.3), K=10 clients"
    assert fedrun_plot.partition_title({}, 1) == "K=1 client"
    # Tick labels: every id while they fit, else every 2nd, 5th, 10th ... (2-digit ids: 0.29 in each).
    assert fedrun_plot.tick_step(8, 1, 2.3) == 1 and fedrun_plot.tick_step(25, 2, 2.3) == 2
    assert fedrun_plot.tick_step(100, 2, 5.9) == 5 and fedrun_plot.tick_step(1000, 3, 5.9) == 50


def test_partition_from_a_real_run_and_its_bad_input(tmp_path, capsys):
    run = tmp_path / "run"
    fedrun_ok([*TINY, "partition=shards", f"hydra.run.dir={run}"], tmp_path)
    both = ["--partition", str(run), str(run), "--out", str(tmp_path / "figs"), "--x", "bytes", "--formats", "png"]
    assert fedrun_plot.main(both) == 0  # a run's curves and its partition, side by side in one folder
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["partition.png", "runs.csv", "runs.png"]
    printed = capsys.readouterr().out
    assert "partition: synthetic data, partition=shards (shards_per_client=2), K=4 clients" in printed
    assert "  4 clients, 400 training examples, 10 classes;" in printed
    (tmp_path / "bare").mkdir()  # a partition.csv without the run's config.yaml: no title to give it
    shutil.copy(run / "partition.csv", tmp_path / "bare")
    for args, error in [(["--out", str(tmp_path / "x")], "give DIRs (folders of runs to draw), --partition RUN"),
                        (["--partition", str(tmp_path / "bare"), "--out", str(tmp_path / "x")],
                         f"{tmp_path / 'bare' / 'config.yaml'}: cannot be read"),
                        (["--partition", str(tmp_path), "--out", str(tmp_path / "x")],
                         f"--partition={tmp_path}: no partition.csv in it"),
                        (["--partition", str(run / "rounds.csv"), "--out", str(tmp_path / "x")],
                         f"--partition={run / 'rounds.csv'}: not a folder")]:
        assert fedrun_plot.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedrun-plot: error: {error}") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_the_help_shows_no_rest_markup(capsys):
    """fedrun-plot --help is its docstring without reST's ``literals`` and :func:`roles`."""
    from fedrun import plot

    with pytest.raises(SystemExit):
        plot.main(["--help"])
    text = capsys.readouterr().out
    assert "read with fedrun.results.load;" in text and "(partition=iid)" in text
    assert "``" not in text and ":func:" not in text and ":class:" not in text
    assert plot.plain("see :func:`~fedrun.results.load` and :mod:`fedrun.plot`, ``x=1``") == \
        "see load and fedrun.plot, x=1"
