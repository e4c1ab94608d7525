"""scripts/pd/plot.py drawn as the other paper scripts draw: the mean over seeds with their range
shaded, a colour and open marker per configuration and a line style per setting, titles naming
the data the runs read, the runs' setting as a caption, and a report of what each curve holds and
what a figure leaves out.  On the fake run directories of test_scripts_pd.py (make_run)."""
from __future__ import annotations

from pathlib import Path

from scripts.pd import plot as plot_pd
from scripts.common import plots
from test_scripts_pd import make_run

from fedrun.plot import pyplot
from fedrun.results import FINISHED_FILES, Run, find_runs


def substituted(top: Path) -> list[Run]:
    """Adam-A (one seed) and Adam-WB (two seeds) under IID and non-IID(2), on Fashion-MNIST in
    place of CIFAR-10, at smoke scale."""
    for setting in ("iid", "noniid2"):
        make_run(top / setting / "adam_a", setting, hyperparams="pd_adam_a", data_name="fmnist", scale="smoke")
        make_run(top / setting / "adam_wb", setting, hyperparams="pd_adam_wb", data_name="fmnist", scale="smoke")
        make_run(top / setting / "adam_wb_s1", setting, hyperparams="pd_adam_wb", data_name="fmnist", scale="smoke",
                 seed=1, pd_scale=2.0)
    return [Run.load(p) for p in find_runs(top, require=FINISHED_FILES)]


def test_curves_have_bands_open_markers_and_a_style_per_setting(tmp_path):
    cs = plot_pd.curves(substituted(tmp_path))
    assert [c.name for c in cs] == ["Adam-A, IID", "Adam-A, Non-IID(2)", "Adam-WB, IID", "Adam-WB, Non-IID(2)"]
    looks = plot_pd.looks(cs)
    assert looks["Adam-A"]["marker"] != looks["Adam-WB"]["marker"]
    assert looks["Adam-A"]["color"] != looks["Adam-WB"]["color"]
    fig, ax = pyplot().subplots()
    wb = cs[3]
    assert plot_pd._draw(ax, wb, wb.frames(), "pd_ls", 1.0, looks[wb.label], 3)
    line = ax.lines[0]
    assert line.get_linestyle() == "-" and line.get_markerfacecolor() == "none"
    assert list(line.get_ydata()) == [0.015, 0.0075, 0.005, 0.00375]  # the mean of 0.01/t and 0.02/t
    assert len(ax.collections) == 1  # the two seeds' range, shaded
    a = cs[0]
    assert plot_pd._draw(ax, a, a.frames(), "pd_ls", 1.0, looks[a.label], 0)
    assert ax.lines[1].get_linestyle() == ":" and len(ax.collections) == 1  # one seed: no band
    pyplot().close(fig)
    handles, labels, title = plot_pd._legend_entries(cs, looks)
    assert labels == ["Adam-A", "Adam-WB (mean of 2)", "IID", "Non-IID(2)"] and title == plots.BAND_NOTE


def test_titles_name_the_data_read_and_the_caption_the_setting(tmp_path):
    runs = substituted(tmp_path)
    assert plot_pd.data_title(runs) == "Fashion-MNIST in place of CIFAR-10"
    figure = plot_pd.Figure(plot_pd.curves(runs), [], report=lambda line: None)
    assert figure.title("PD-Ls per layer") == "PD-Ls per layer, Fashion-MNIST in place of CIFAR-10, NetA-Baseline"
    # make_run's configs all name partition=iid (its non-IID runs differ in their tags alone)
    assert figure.caption == ("Fashion-MNIST (1,000 random training images), IID, K=10 clients, C=1 (10 a round), "
                              "E=1, B=50, 4 rounds")
    title, stem = plot_pd._run_title(next(r for r in runs if r.path.name == "adam_wb_s1" and "iid" == r.path.parent.name))
    assert title == "Fashion-MNIST in place of CIFAR-10, NetA-Baseline Adam-WB, IID, seed 1"
    assert stem == "cifar10_iid_neta_baseline_adam-wb_seed1"


def test_the_report_says_what_each_curve_holds_and_what_a_figure_leaves_out(tmp_path, capsys):
    substituted(tmp_path / "runs")
    make_run(tmp_path / "runs" / "vanilla" / "a", "vanilla_bs50", hyperparams="pd_adam_a", data_name="fmnist",
             scale="smoke")  # one learner: no PD-Ls, no PD-VL
    assert plot_pd.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs"), "--layers", "F3"]) == 0
    printed = capsys.readouterr()
    assert all(Path(line).is_file() for line in printed.out.splitlines())  # stdout: the PNGs alone
    err = printed.err.splitlines()
    assert err[:5] == ["plot_pd: Adam-A, Vanilla BS:50: 1 run (seed 0), rounds 1-4",
                       "plot_pd: Adam-A, IID: 1 run (seed 0), rounds 1-4",
                       "plot_pd: Adam-A, Non-IID(2): 1 run (seed 0), rounds 1-4",
                       "plot_pd: Adam-WB, IID: 2 runs (seeds 0, 1), rounds 1-4",
                       "plot_pd: Adam-WB, Non-IID(2): 2 runs (seeds 0, 1), rounds 1-4"]
    assert err[5].startswith("plot_pd: setting: Fashion-MNIST (1,000 random training images), mode varies")
    assert "plot_pd: pd_ls_layers.png: left out Adam-A, Vanilla BS:50: no PD-Ls per layer" in err
    assert "plot_pd: pd_model.png: left out Adam-A, Vanilla BS:50: no PD-Ls and PD-VL of the whole model" in err
    for name in ("pd_ls_layers", "train_loss", "neurons_cifar10_iid_neta_baseline_adam-wb_seed1"):
        assert (tmp_path / "figs" / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
