"""scripts/niidbench/table3.py on fake run directories (collect) and as a dry run (run).  Fast, offline."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from scripts.niidbench import table3 as T
import pytest
import yaml

PAPER_SCALE = dict(rounds=50, num_clients=10, client_fraction=1.0, local_epochs=10, batch_size=64, lr=0.01,
                   momentum=0.9, optimizer="sgd")


def make_run(folder: Path, method: str, dataset: str, partition: str, final: float, best: float, seed: int = 0,
             hyperparams: dict | None = None, data_name: str | None = None) -> Path:
    folder.mkdir(parents=True)
    config = {"dataset": {"name": data_name or dataset, "max_train": None, "max_test": None},
              "model": {"_target_": "fedrun.models.nets.SimpleCNN"},
              "aggregator": {"_target_": f"fedrun.aggregators.{method}"},
              "hyperparams": hyperparams or PAPER_SCALE, "seed": seed,
              "tags": {"paper": "niidbench", "dataset": dataset, "partition": partition}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "summary.json").write_text(json.dumps({"aggregator": method, "rounds": 3, "final_test_acc": final,
                                                     "best_test_acc": best, "best_round": 2}))
    (folder / "rounds.csv").write_text(f"round,test_acc\n1,{final / 2}\n2,{best}\n3,{final}\n")
    return folder


@pytest.fixture
def runs(tmp_path):
    top = tmp_path / "runs"
    make_run(top / "mnist_c2" / "scaffold_seed0", "scaffold", "mnist", "c2", 0.95, 0.96, 0)
    make_run(top / "mnist_c2" / "scaffold_seed1", "scaffold", "mnist", "c2", 0.97, 0.975, 1)
    make_run(top / "fmnist_iid" / "fednova_seed0", "fednova", "fmnist", "iid", 0.88, 0.89,
             hyperparams={**PAPER_SCALE, "rounds": 3, "local_epochs": 2})
    make_run(top / "mnist_dir05" / "fedavg_seed0", "fedavg", "mnist", "dir05", 0.98, 0.985, data_name="mnist_train10k")
    # SCAFFOLD seed 2 in #C=2 diverged at round 7 (run.json says so), seed 3 is still running: both
    # without summary.json, neither in the mean, each named under the table.
    stopped = make_run(top / "mnist_c2" / "scaffold_seed2", "scaffold", "mnist", "c2", 0.1, 0.1, 2)
    (stopped / "summary.json").unlink()
    (stopped / "run.json").write_text(json.dumps([{"started": "x", "first_round": 1, "stopped": "y", "last_round": 6,
                                                   "reason": "diverged", "error": "round 7: parameter fc1.weight of "
                                                   "the sent model is NaN or Inf after aggregation with scaffold; "
                                                   "the CSVs hold rounds before 7. Try a smaller hyperparams.lr"}]))
    running = make_run(top / "mnist_c2" / "scaffold_seed3", "scaffold", "mnist", "c2", 0.1, 0.1, 3)
    (running / "summary.json").unlink()
    other = top / "other"
    other.mkdir()
    (other / "config.yaml").write_text(yaml.safe_dump({"tags": {"paper": "fednnnn"}}))
    (other / "summary.json").write_text(json.dumps({"aggregator": "fedavg", "final_test_acc": 0.5}))
    return top


def test_collect_files_runs_into_cells(runs, tmp_path, capsys):
    paper = tmp_path / "paper.csv"
    paper.write_text("method,dataset,partition,accuracy_pct,std_pct,note\n"
                     "scaffold,mnist,c2,95.0,0.5,made up for this test\nfedavg,mnist,c1,,,\n")
    out_csv = tmp_path / "t3.csv"
    rows = T.collect([str(runs)], csv_path=str(out_csv), paper_csv=str(paper))
    text = capsys.readouterr().out
    cell = {(r["method"], r["dataset"], r["partition"]): r for r in rows}
    assert len(rows) == 40
    sc = cell["scaffold", "mnist", "c2"]
    assert sc["n_runs"] == 2 and sc["final_acc_pct"] == pytest.approx(96.0)
    assert sc["n_diverged"] == 1 and sc["diverged_rounds"] == "7"
    assert sc["final_sd_pct"] == pytest.approx(2 ** 0.5) and sc["best_acc_pct"] == pytest.approx(96.75)
    assert sc["paper_pct"] == 95.0 and sc["diff_pct"] == pytest.approx(1.0) and not sc["deviations"]
    assert T.format_cell(sc) == "96.0+-1.4 / 96.8 [2] +1 div (95.0+-0.5; +1.0)"
    assert cell["fedavg", "mnist", "c1"]["paper_pct"] is None  # an empty accuracy: not a number of the paper
    nova = cell["fednova", "fmnist", "iid"]
    assert "rounds=3 (paper 50)" in nova["deviations"] and T.format_cell(nova).startswith("88.0 / 89.0*")
    assert "data substituted: mnist_train10k instead of mnist" in cell["fedavg", "mnist", "dir05"]["deviations"]
    assert "p_k~Dir(0.5)" in text and "#C=2" in text and "NOTE" in text and "not tagged paper=niidbench" in text
    assert ("1 NIID-Bench run(s) diverged" in text and "scaffold_seed2 (diverged at round 7: parameter fc1.weight "
            "of the sent model is NaN or Inf after aggregation with scaffold)" in text)
    assert "1 NIID-Bench run(s) not finished" in text and "scaffold_seed3" in text
    with open(out_csv) as f:
        written = list(csv.DictReader(f))
    assert len(written) == 40 and written[0].keys() == set(T.CSV_COLUMNS)


def test_the_shipped_paper_csv_has_every_cell_and_no_unverified_number():
    with open(Path(T.tables.PAPER_TARGETS) / T.PAPER_CSV) as f:
        rows = list(csv.DictReader(f))
    assert {(r["method"], r["dataset"], r["partition"]) for r in rows} == set(T.TABLE_CELLS)
    assert all(r["note"] for r in rows if not r["accuracy_pct"])  # every empty cell says why
    assert len(T.paper_table()) == sum(bool(r["accuracy_pct"]) for r in rows)  # only transcribed numbers count


def test_dry_run_prints_one_sweep_per_preset(tmp_path, capsys):
    assert T.main(["run", "--out", str(tmp_path / "out"), "--dry-run", "--smoke", "--substitute",
                   "mnist=mnist_train10k", "--population", "--seeds", "0,1", "--partitions", "c1", "iid"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(lines) == 4  # (mnist, fmnist) x (c1, iid)
    mnist_c1 = next(line for line in lines if "mnist_c1:" in line and "fmnist" not in line)
    for word in ("experiment=niidbench/mnist_c1", "aggregator=fedavg,fedprox,scaffold,fednova", "seed=0,1",
                 "dataset=mnist_train10k", "scale=smoke", "hydra/launcher=population"):
        assert word in mnist_c1
    assert "dataset=" not in next(line for line in lines if "fmnist_iid:" in line)  # FashionMNIST is not substituted


def test_reference_results_stand_beside_ours_and_never_in_the_paper_column(runs, tmp_path, capsys):
    reference = tmp_path / "ref.csv"
    reference.write_text("source,method,dataset,partition,accuracy_pct,std_pct,n_runs,note\n"
                         "flower,scaffold,mnist,c2,96.6,,1,one run\nflower,fedavg,mnist,c1,10.0,,1,no run of ours\n")
    rows = T.collect([str(runs)], reference_csv=str(reference))
    text = capsys.readouterr().out
    cell = {(r["method"], r["dataset"], r["partition"]): r for r in rows}
    sc = cell["scaffold", "mnist", "c2"]
    assert sc["reference_pct"] == 96.6 and sc["reference_source"] == "flower" and sc["paper_pct"] is None
    assert cell["fedavg", "mnist", "c1"]["reference_pct"] == 10.0  # in the CSV even without a run of ours
    second = text[text.index("Beside another published result"):]
    assert "96.0+-1.4 +1 div (96.6; -0.6)" in second  # ours 96.0 = mean of 95 and 97, minus Flower's 96.6
    assert "#C=1" not in second  # a cell with no run of ours is left out, as the title says
    # A cell whose every run diverged still stands beside the reference, with nothing to subtract.
    assert T.format_reference_table([{**sc, "n_runs": 0, "n_diverged": 3}]).splitlines()[-1].split("|")[4].strip() \
        == "- +3 div (96.6; -)"
    assert "NOT the paper's Table III" in second and "Flower's NIID-Bench baseline" in second


def test_the_shipped_reference_csv_covers_every_cell_once_with_its_source():
    with open(Path(T.tables.PAPER_TARGETS) / T.REFERENCE_CSV) as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["method"], r["dataset"], r["partition"]) for r in rows) == sorted(T.TABLE_CELLS)
    assert all(r["source"] in T.REFERENCE_LABELS and r["note"] for r in rows)
    ref = T.reference_table()
    # Two numbers read by hand from Flower's README: MNIST IID FedAvg 99.1, FashionMNIST #C=2 SCAFFOLD 10.0.
    assert ref["fedavg", "mnist", "iid"] == (99.1, "flower") and ref["scaffold", "fmnist", "c2"] == (10.0, "flower")
