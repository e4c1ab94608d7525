"""The FedLayerWise and FedLap reproduction scripts (scripts/fedlayerwise/table1.py,
scripts/fedlayerwise/plot.py, scripts/fedlap/plot.py and their helpers in scripts/common/papers.py) on tiny
fake run directories, and the conf/experiment/fedlayerwise, fedlap presets against the scripts'
paper settings through Hydra's compose API.  Fast, CPU, offline."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from scripts.fedlayerwise import table1 as t1
from scripts.common import papers
from scripts.fedlap import plot as plot_fedlap
from scripts.fedlayerwise import plot as plot_fedlayerwise
import pytest
import yaml
from conftest import compose

from fedrun.results import Run

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TARGETS = ROOT.parent / "shared" / "papers" / "targets"

PNG = b"\x89PNG\r\n\x1a\n"
LAYERS = ("conv1", "conv2", "fc1", "fc2")


def make_run(folder: Path, method: str, accs: list[float], *, paper: str = "fedlayerwise",
             tags: dict | None = None, hyperparams: dict | None = None, seed: int = 0,
             data_name: str = "mnist", model: dict | None = None, partition: dict | None = None,
             losses: list[float] | None = None, val: list[float] | None = None,
             reg: list[float] | None = None, lam: list[float] | None = None, num_clients: int = 4) -> Path:
    """A run directory as fedrun writes it, reduced to what the scripts read: config.yaml,
    summary.json, rounds.csv (one row per entry of ``accs``), clients.csv, client_layers.csv,
    partition.csv."""
    folder.mkdir(parents=True)
    if paper == "fedlayerwise":
        tags = {"paper": paper, "dataset": "mnist", "scenario": "5iid_5noniid"} if tags is None else tags
        hp = dict(t1.PAPER_HYPERPARAMS)
        model = model or dict(t1.PAPER_MODEL)
        iid = t1.IID_CLIENTS.get(tags.get("scenario"), 2)
        partition = partition or {"_target_": "fedrun.data.partition.mixed", "iid_clients": iid,
                                  "classes_per_client": 2, "samples_per_client": 600}
    else:
        tags = {"paper": paper, "dataset": "mnist"} if tags is None else tags
        hp = dict(plot_fedlap.PAPER_HYPERPARAMS, stragglers=0.0)
        model = model or {"_target_": plot_fedlap.PAPER_MODELS.get(tags.get("dataset"), "fedrun.models.nets.MLP"),
                          "hidden": [200]}
        partition = partition or dict(plot_fedlap.PAPER_PARTITION)
    hp.update(hyperparams or {})
    config = {"dataset": {"name": data_name, "max_train": None, "max_test": None}, "model": model,
              "partition": partition, "aggregator": {"_target_": f"fedrun.aggregators.{method}"},
              "hyperparams": hp, "seed": seed, "tags": tags}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    T = len(accs)
    reached = {f"{x:g}": next((t + 1 for t, a in enumerate(accs) if a >= x), None) for x in (0.5, 0.9, 0.95)}
    summary = {"aggregator": method, "rounds": T, "final_test_acc": accs[-1], "best_test_acc": max(accs),
               "rounds_to_accuracy": reached}
    (folder / "summary.json").write_text(json.dumps(summary))
    losses = losses or [2.0 / (t + 1) for t in range(T)]
    lines = ["round,clients,test_acc,test_loss,val_acc,val_loss,train_loss"]
    for t in range(T):
        v = "" if val is None else val[t]
        vl = "" if val is None else 1.5 / (t + 1)
        lines.append(f"{t + 1},{num_clients},{accs[t]},{losses[t]},{v},{vl},{losses[t]}")
    (folder / "rounds.csv").write_text("\n".join(lines) + "\n")
    rows = ["round,client,examples,weight,update_norm,angle,smoothed_angle,loss,steps,epochs,straggler,"
            "dropped,reg_loss,lambda_mean"]
    layer_rows = ["round,client,layer,update_norm,angle,smoothed_angle,weight"]
    for t in range(1, T + 1):
        for k in range(num_clients):
            r = "" if reg is None else reg[t - 1] * (1 + k)       # client mean: reg * (1 + mean k)
            lm = "" if lam is None else lam[t - 1] * (1 + k)
            rows.append(f"{t},{k},600,{1 / num_clients},1.0,0.5,{0.5 + 0.1 * k},0.3,38,1,0,0,{r},{lm}")
            for i, layer in enumerate(LAYERS):
                w = (1 + k) / sum(range(1, num_clients + 1))
                layer_rows.append(f"{t},{k},{layer},1.0,{0.4 + 0.1 * i},{0.4 + 0.05 * (i + k)},{w}")
        # A dropped client: no model, must not count in the means.
        rows.append(f"{t},{num_clients},600,,,,,,,,0,1,,")
    (folder / "clients.csv").write_text("\n".join(rows) + "\n")
    (folder / "client_layers.csv").write_text("\n".join(layer_rows) + "\n")
    part = ["client,examples," + ",".join(f"class_{c}" for c in range(10))]
    for k in range(num_clients):
        counts = [60] * 10 if k < partition.get("iid_clients", 0) else \
            [300 if c in (k % 10, (k + 1) % 10) else 0 for c in range(10)]
        part.append(f"{k},600," + ",".join(map(str, counts)))
    (folder / "partition.csv").write_text("\n".join(part) + "\n")
    return folder


def _cells(text: str, label: str) -> list[str]:
    """The cells of the table row starting with ``label``."""
    row = next(line for line in text.splitlines() if line.split("|")[0].strip() == label)
    return [c.strip() for c in row.split("|")[1:]]


FIVE, TWO = 0, 1  # column of each scenario in Table I


# ----------------------------------------------------------------------------- Table I

def test_rounds_to_target_golden(tmp_path):
    run = Run.load(make_run(tmp_path / "r", "fedlayerwise", [0.90, 0.94, 0.951, 0.93, 0.97]))
    assert t1.rounds_to(run) == {"round": 3, "T": 5, "final": 0.97}
    assert t1.rounds_to(run, 0.96)["round"] == 5
    assert t1.rounds_to(run, 0.99) == {"round": None, "T": 5, "final": 0.97}
    # Exactly the target counts as reached.
    run = Run.load(make_run(tmp_path / "e", "fedavg", [0.5, 0.95]))
    assert t1.rounds_to(run)["round"] == 2


@pytest.fixture
def grid(tmp_path):
    top = tmp_path / "runs"
    five = {"paper": "fedlayerwise", "dataset": "mnist", "scenario": "5iid_5noniid"}
    two = {"paper": "fedlayerwise", "dataset": "mnist", "scenario": "2iid_8noniid"}
    # Paper setting, reaches 95% at round 3 (paper: 11).
    make_run(top / "5" / "fedlayerwise_seed0", "fedlayerwise", [0.90, 0.94, 0.951, 0.96], tags=five)
    # Two seeds reaching at 10 and 13 (paper 12): mean 11.5.
    make_run(top / "5" / "fedadp_seed0", "fedadp", [0.9] * 9 + [0.95, 0.96], tags=five, seed=0)
    make_run(top / "5" / "fedadp_seed1", "fedadp", [0.9] * 12 + [0.955], tags=five, seed=1)
    # Never reached in 30 rounds (paper 21): more than 9 rounds over.
    make_run(top / "2" / "fedadp_seed0", "fedadp", [0.5] * 29 + [0.931], tags=two)
    # Never reached in 3 rounds of a smoke run on substituted data (paper 25): difference unknown.
    make_run(top / "2" / "fedavg_seed0", "fedavg", [0.5, 0.8, 0.9], tags=two, data_name="mnist_train10k",
             hyperparams={"rounds": 3}, partition={"_target_": "fedrun.data.partition.mixed", "iid_clients": 2,
                                                   "samples_per_client": 60})
    # One of two seeds reaches (at 12; paper 12).
    make_run(top / "2" / "fedlayerwise_seed0", "fedlayerwise", [0.9] * 11 + [0.96], tags=two, seed=0)
    make_run(top / "2" / "fedlayerwise_seed1", "fedlayerwise", [0.9] * 12, tags=two, seed=1)
    # Not FedLayerWise runs: skipped.
    make_run(top / "other", "fedavg", [0.99], paper="fedlap")
    return top


def test_collect_table1_ours_paper_difference(grid, tmp_path, capsys):
    out_csv = tmp_path / "t1.csv"
    assert t1.main(["collect", str(grid), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "rounds to reach 95% test acc" in text
    flw, adp, avg = _cells(text, "FedLayerWise"), _cells(text, "FedAdp"), _cells(text, "FedAvg")
    assert flw[FIVE] == "3 (11, -8)"
    assert adp[FIVE] == "11.5 [10, 13] (12, -0.5)"  # seed 0 reaches 95% at round 10, seed 1 at 13
    assert avg[FIVE] == "- (12, -)"
    assert adp[TWO] == "not reached in 30 (final 93.1%) (21, >+9)"
    assert avg[TWO] == "not reached in 3 (final 90.0%)* (25, -)"
    assert flw[TWO] == "12 [12, -] (12, +0)"
    assert "NOT use the paper's setting" in text
    assert "data substituted: mnist_train10k instead of mnist (1 run)" in text
    assert "rounds=3 (paper 30) (1 run)" in text
    assert "partition.samples_per_client=60 (paper 600) (1 run)" in text
    assert "1 run directory skipped" in text and "not tagged paper=fedlayerwise" in text

    rows = {(r["method"], r["scenario"]): r for r in csv.DictReader(out_csv.open())}
    assert len(rows) == 6
    r = rows[("fedlayerwise", "5iid_5noniid")]
    assert (r["ours_rounds"], r["paper_rounds"], r["diff_rounds"], r["n_reached"]) == ("3", "11", "-8", "1")
    r = rows[("fedadp", "5iid_5noniid")]
    assert float(r["ours_rounds"]) == 11.5 and float(r["diff_rounds"]) == -0.5
    assert r["per_run_rounds"] == "10;13" and r["n_runs"] == "2"
    r = rows[("fedadp", "2iid_8noniid")]
    assert r["ours_rounds"] == "" and r["n_reached"] == "0" and r["rounds_run"] == "30"
    assert float(r["final_acc_pct"]) == pytest.approx(93.1)
    assert r["deviations"] == ""
    assert rows[("fedavg", "5iid_5noniid")]["n_runs"] == "0"


def test_collect_other_target_has_no_paper_numbers(grid, capsys):
    t1.main(["collect", str(grid), "--target", "0.9", "--csv", ""])
    text = capsys.readouterr().out
    assert "rounds to reach 90% test acc" in text and "none shown for 90%" in text
    assert _cells(text, "FedLayerWise")[FIVE] == "1 (-, -)"
    assert _cells(text, "FedAdp")[TWO] == "30 (-, -)"  # 0.931 in the last round only
    loaded, _ = papers.load_tagged([grid], "fedlayerwise", ("scenario",))
    rows = {(r["method"], r["scenario"]): r for r in t1.table1_rows(loaded, t1.paper_table(), 0.94)}
    assert rows[("fedadp", "2iid_8noniid")]["ours_rounds"] is None
    assert rows[("fedlayerwise", "2iid_8noniid")]["per_run_rounds"] == "12;-"


def test_collect_val_acc_metric(tmp_path, capsys):
    make_run(tmp_path / "r" / "a", "fedavg", [0.96, 0.97], val=[0.90, 0.95])
    t1.main(["collect", str(tmp_path / "r"), "--metric", "val_acc", "--csv", ""])
    assert _cells(capsys.readouterr().out, "FedAvg")[FIVE] == "2 (12, -10)"


def test_collect_writes_no_csv_unless_asked(grid, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert t1.main(["collect", str(grid)]) == 0
    assert "wrote" not in capsys.readouterr().out and sorted(tmp_path.rglob("*")) == before


def test_damaged_runs_are_named_in_one_line(grid, fedlap_grid, tmp_path, capsys):
    damaged = grid / "5" / "fedadp_seed1" / "config.yaml"
    damaged.write_bytes(b"\x00\xff\x80garbage")
    assert t1.main(["collect", str(grid)]) == 0
    assert f"1 run directory unreadable (skipped): {damaged.parent} (unreadable: {damaged}: not valid YAML" \
        in capsys.readouterr().out
    assert plot_fedlayerwise.main([str(grid), "--out", str(tmp_path / "figs")]) == 0
    assert capsys.readouterr().err.startswith(f"plot_fedlayerwise: skipping {damaged.parent}: unreadable: {damaged}")
    summary = next(fedlap_grid.rglob("summary.json"))
    summary.write_text("[1, 2]")
    assert plot_fedlap.main([str(fedlap_grid), "--summary", "--round", "2"]) == 0
    assert capsys.readouterr().err == (f"plot_fedlap: skipping {summary.parent}: unreadable: {summary}: "
                                       "not a JSON object (list)\n")


def test_builtin_table1_matches_targets_csv():
    path = TARGETS / "fedlayerwise_table1_rounds_to_95pct.csv"
    if not path.is_file():
        pytest.skip("../shared/papers/targets not present")
    assert t1.paper_table() == t1.paper_table(str(path))
    assert len(t1.paper_table()) == 6


def test_run_mode_dry_run(tmp_path, capsys):
    out = tmp_path / "o"
    # A finished run is not redone.
    make_run(out / "5iid_5noniid" / "fedavg_seed0", "fedavg", [0.5])
    rc = t1.main(["run", "--smoke", "--substitute", "mnist=mnist_train10k", "--out", str(out), "--dry-run",
                  "--set", "device=cpu", "--seeds", "0"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "NOTE: SMOKE SCALE" in text and "NOTE: SUBSTITUTED DATA" in text and "EXTRA OVERRIDES" in text
    calls = [line for line in text.splitlines() if line.startswith("[")]
    assert len(calls) == 2
    five = next(c for c in calls if "experiment=fedlayerwise/mnist_5iid_5noniid" in c)
    two = next(c for c in calls if "experiment=fedlayerwise/mnist_2iid_8noniid" in c)
    assert "aggregator=fedadp,fedlayerwise " in five and "(1 finished)" in five
    for piece in ("aggregator=fedavg,fedadp,fedlayerwise", "dataset=mnist_train10k", "scale=smoke",
                  "partition.samples_per_client=60", "device=cpu", "seed=0",
                  f"hydra.sweep.dir={out / '2iid_8noniid'}"):
        assert piece in two


def test_run_mode_runs_three_seeds_by_default(tmp_path, capsys):
    """Without --seeds every cell gets seeds 0, 1, 2, so the table shows each cell's spread."""
    assert t1.main(["run", "--smoke", "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    calls = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(calls) == 2 and all(" seed=0,1,2 " in c for c in calls)


def test_run_mode_rejects_other_datasets(capsys):
    assert t1.main(["run", "--out", "x", "--substitute", "cifar10=synthetic"]) == 2
    assert "expected DATASET=OPTION with DATASET in ('mnist',)" in capsys.readouterr().err


# ----------------------------------------------------------------------------- FedLayerWise figures

def test_plot_fedlayerwise_writes_pngs(grid, tmp_path, capsys):
    out = tmp_path / "figs"
    assert plot_fedlayerwise.main([str(grid), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    names = {Path(p).name for p in printed}
    assert names == {f"{s}_{k}.png" for s in ("5iid_5noniid", "2iid_8noniid")
                     for k in ("accuracy", "loss", "fedlayerwise_layers", "fedadp_clients")}
    for p in printed:
        data = Path(p).read_bytes()
        assert len(data) > 1000 and data[:8] == PNG


def test_plot_fedlayerwise_loss_column_and_labels(tmp_path):
    with_val = Run.load(make_run(tmp_path / "v", "fedavg", [0.5, 0.6], val=[0.5, 0.6]))
    without = Run.load(make_run(tmp_path / "n", "fedavg", [0.5, 0.6]))
    assert plot_fedlayerwise.loss_column([with_val.rounds()]) == "val_loss"
    assert plot_fedlayerwise.loss_column([without.rounds()]) == "test_loss"
    assert plot_fedlayerwise.loss_column([with_val.rounds(), without.rounds()]) == "test_loss"
    labels = plot_fedlayerwise.client_labels(without)  # 5iid_5noniid: clients 0-4 IID
    assert labels[0] == "client 0 (IID)" and labels[3] == "client 3 (IID)"
    two = Run.load(make_run(tmp_path / "t", "fedlayerwise", [0.5], tags={
        "paper": "fedlayerwise", "dataset": "mnist", "scenario": "2iid_8noniid"}))
    labels = plot_fedlayerwise.client_labels(two)
    assert labels[1] == "client 1 (IID)" and labels[2] == "client 2 (non-IID: 2,3)"


def test_plot_fedlayerwise_without_runs_fails_cleanly(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert plot_fedlayerwise.main([str(tmp_path / "empty"), "--out", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.startswith("plot_fedlayerwise: error: no FedLayerWise preset runs")
    assert not (tmp_path / "f").exists()


# ----------------------------------------------------------------------------- FedLap

@pytest.fixture
def fedlap_grid(tmp_path):
    top = tmp_path / "fedlap"
    for s, shift in ((0.0, 0.0), (0.5, -0.1)):
        make_run(top / f"s{s}" / "fedlap", "fedlap", [0.5 + shift, 0.7 + shift, 0.8 + shift], paper="fedlap",
                 hyperparams={"stragglers": s}, reg=[0.3, 0.2, 0.1], lam=[0.02, 0.01, 0.005])
        make_run(top / f"s{s}" / "fedprox", "fedprox", [0.45 + shift, 0.55 + shift, 0.75 + shift], paper="fedlap",
                 hyperparams={"stragglers": s}, reg=[0.05, 0.05, 0.05])
        make_run(top / f"s{s}" / "fedavg", "fedavg", [0.4 + shift, 0.6 + shift, 0.85 + shift], paper="fedlap",
                 hyperparams={"stragglers": s})
    # A second seed of FedAvg without stragglers: 0.2, 0.4, 0.65 -> means 0.3, 0.5, 0.75.
    make_run(top / "s0.0" / "fedavg_seed1", "fedavg", [0.2, 0.4, 0.65], paper="fedlap", seed=1)
    # 90% stragglers on CIFAR10, a 2-round run at smoke scale.
    make_run(top / "c" / "fedlap", "fedlap", [0.3, 0.35], paper="fedlap",
             tags={"paper": "fedlap", "dataset": "cifar10"}, data_name="synthetic",
             hyperparams={"stragglers": 0.9, "rounds": 2, "local_epochs": 1})
    return top


def test_fedlap_summary_table(fedlap_grid, tmp_path, capsys):
    out_csv = tmp_path / "s.csv"
    assert plot_fedlap.main([str(fedlap_grid), "--summary", "--round", "2", "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "Acc@2 (%)" in text
    rows = {(r["dataset"], float(r["stragglers"]), r["method"]): r for r in csv.DictReader(out_csv.open())}
    assert len(rows) == 7

    def val(key, col):
        v = rows[key][col]
        return None if v == "" else float(v)

    assert val(("mnist", 0.0, "fedlap"), "acc_at_round_pct") == pytest.approx(70.0)
    assert val(("mnist", 0.0, "fedlap"), "final_acc_pct") == pytest.approx(80.0)
    assert val(("mnist", 0.0, "fedavg"), "acc_at_round_pct") == pytest.approx(50.0)  # mean of 60 and 40
    assert val(("mnist", 0.0, "fedavg"), "final_acc_pct") == pytest.approx(75.0)
    assert rows[("mnist", 0.0, "fedavg")]["n_runs"] == "2"
    # FedLap's lead over the better of FedProx (55 / 75) and FedAvg (50 / 75).
    assert val(("mnist", 0.0, "fedlap"), "fedlap_lead_at_round_pct") == pytest.approx(15.0)
    assert val(("mnist", 0.0, "fedlap"), "fedlap_lead_final_pct") == pytest.approx(5.0)
    assert val(("mnist", 0.5, "fedlap"), "acc_at_round_pct") == pytest.approx(60.0)
    assert val(("mnist", 0.5, "fedlap"), "fedlap_lead_final_pct") == pytest.approx(-5.0)  # FedAvg 75
    assert val(("cifar10", 0.9, "fedlap"), "acc_at_round_pct") == pytest.approx(35.0)
    assert val(("mnist", 0.0, "fedavg"), "acc_at_round_min_pct") == pytest.approx(40.0)
    assert val(("mnist", 0.0, "fedavg"), "acc_at_round_max_pct") == pytest.approx(60.0)
    assert val(("mnist", 0.0, "fedlap"), "mean_acc_to_round_pct") == pytest.approx(60.0)
    assert val(("mnist", 0.0, "fedlap"), "fedlap_lead_to_round_pct") == pytest.approx(10.0)
    # Seeds run by all three methods: seed 0 only (FedAvg's seed 1 has no FedLap or FedProx twin).
    assert rows[("mnist", 0.0, "fedlap")]["fedlap_ahead_seeds"] == "1 of 1"
    # The text table: rows in the paper's order, values to one decimal.
    lines = [line for line in text.splitlines() if line.startswith(("MNIST", "CIFAR10"))]
    assert [line.split("|")[2].strip() for line in lines[:3]] == ["FedLap", "FedProx", "FedAvg"]
    first = [c.strip() for c in lines[0].split("|")]
    # Mean over rounds 1-2: FedLap 60, FedProx 50, FedAvg (50 + 30) / 2 = 40 -> lead +10.
    assert first == ["MNIST", "0%", "FedLap", "70.0", "60.0", "80.0", "3", "1", "+15.0", "+10.0", "+5.0", "1 of 1"]
    avg = [c.strip() for c in lines[2].split("|")]
    assert avg[3] == "50.0 [40.0-60.0]" and avg[7] == "2"  # two FedAvg seeds: their range at round 2
    assert lines[-1].split("|")[2].strip() == "FedLap*"
    assert "NOT use the paper's setting" in text
    assert "data substituted: synthetic instead of cifar10 (1 run)" in text
    assert "rounds=2 (presets 100; the paper does not state T) (1 run)" in text
    assert "local_epochs=1 (paper 10) (1 run)" in text
    assert "rounds=3" not in text  # the fake runs' rounds.csv length is not the config's T


def test_fedlap_summary_round_past_the_end(fedlap_grid, capsys):
    plot_fedlap.main([str(fedlap_grid), "--summary", "--round", "3"])
    text = capsys.readouterr().out
    cifar = next(line for line in text.splitlines() if line.startswith("CIFAR10"))
    assert [c.strip() for c in cifar.split("|")][3:7] == ["-", "-", "35.0", "2"]  # stopped at round 2


def test_plot_fedlap_writes_pngs(fedlap_grid, tmp_path, capsys):
    out = tmp_path / "figs"
    assert plot_fedlap.main([str(fedlap_grid), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert {Path(p).name for p in printed} == {"mnist_accuracy.png", "mnist_diagnostics.png",
                                               "cifar10_accuracy.png"}  # no regularizer columns in cifar10
    for p in printed:
        data = Path(p).read_bytes()
        assert len(data) > 1000 and data[:8] == PNG


def test_fedlap_client_means_skip_dropped(fedlap_grid):
    run = Run.load(fedlap_grid / "s0.0" / "fedlap")
    means = plot_fedlap.client_means(run)
    # Clients 0-3 with reg * (1 + k): mean factor 2.5; the dropped client (empty) is left out.
    assert means["reg_loss"].tolist() == pytest.approx([0.75, 0.5, 0.25])
    assert means["lambda_mean"].tolist() == pytest.approx([0.05, 0.025, 0.0125])
    assert plot_fedlap.stragglers(run) == 0.0
    assert plot_fedlap.stragglers(Run.load(fedlap_grid / "c" / "fedlap")) == 0.9


def test_plot_fedlap_needs_out_or_summary(fedlap_grid, capsys):
    assert plot_fedlap.main([str(fedlap_grid)]) == 2
    assert "--out" in capsys.readouterr().err


# ----------------------------------------------------------------------------- presets vs paper settings

def test_fedlayerwise_presets_are_the_papers_setting(tmp_path):
    presets = sorted((CONF / "experiment" / "fedlayerwise").glob("*.yaml"))
    assert {p.stem for p in presets} == set(t1.PRESETS.values())
    for scenario, preset in t1.PRESETS.items():
        for method in t1.METHODS:
            cfg = compose([f"experiment=fedlayerwise/{preset}", f"aggregator={method}"], resolve=True)
            assert cfg["tags"] == {"paper": "fedlayerwise", "dataset": "mnist", "scenario": scenario}
            assert cfg["aggregator"]["_target_"] == f"fedrun.aggregators.{method}"
            assert t1.deviations(Run(tmp_path, cfg, {})) == []
    cfg = compose(["experiment=fedlayerwise/mnist_2iid_8noniid", "dataset=mnist_train10k", *t1.SMOKE_OVERRIDES],
                  resolve=True)
    dev = t1.deviations(Run(tmp_path, cfg, {}))
    assert "data substituted: mnist_train10k instead of mnist" in dev
    assert "rounds=3 (paper 30)" in dev and "partition.samples_per_client=60 (paper 600)" in dev


def test_fedlap_presets_are_the_papers_setting(tmp_path):
    presets = sorted((CONF / "experiment" / "fedlap").glob("*.yaml"))
    assert {p.stem for p in presets} == set(plot_fedlap.DATASETS)
    for dataset in plot_fedlap.DATASETS:
        for method in plot_fedlap.METHODS:
            for s in (0, 0.5, 0.9):
                cfg = compose([f"experiment=fedlap/{dataset}", f"aggregator={method}",
                               f"hyperparams.stragglers={s}"], resolve=True)
                run = Run(tmp_path, cfg, {})
                assert cfg["tags"] == {"paper": "fedlap", "dataset": dataset}
                assert plot_fedlap.deviations(run) == [] and plot_fedlap.stragglers(run) == s
