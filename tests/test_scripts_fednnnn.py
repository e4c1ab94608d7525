"""The FedNNNN reproduction scripts (scripts/fednnnn/table2.py, scripts/fednnnn/plot.py and the
run-directory reading of fedrun.results they file runs with) on tiny fake run directories, and the
conf/experiment/fednnnn presets (Table 5 values) through Hydra's compose API.  Fast, CPU, offline."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from scripts.fednnnn import table2 as fednnnn_table2
from scripts.common import papers
from scripts.fednnnn import plot as plot_fednnnn
import pytest
import yaml
from conftest import compose
from scripts.common.grid import product_blocks

from fedrun import results

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
PRESETS = sorted((CONF / "experiment" / "fednnnn").glob("*.yaml"))
TARGETS = ROOT.parent / "shared" / "papers" / "targets"

PAPER_SCALE = {"mnist": dict(rounds=100, num_clients=100, client_fraction=1.0, local_epochs=5,
                             batch_size=50, lr=0.05, weight_decay=0.0),
               "cifar10": dict(rounds=250, num_clients=100, client_fraction=1.0, local_epochs=5,
                               batch_size=50, lr=0.05, weight_decay=5.0e-4)}
ROUND_COLUMNS = ["round", "test_acc", "sent_test_acc", "N", "E", "N_over_E", "server_step",
                 "server_step_sum", "N_conv", "E_conv", "server_step_conv", "N_fc", "E_fc",
                 "server_step_fc"]


def make_run(folder: Path, method: str, dataset: str, condition: str, final: float | None = None,
             best: float | None = None, seed: int = 0, data_name: str | None = None,
             hyperparams: dict | None = None, tags: dict | None = None, rounds: int = 4,
             accs: list[float] | None = None, best_round_in_summary: bool = True) -> Path:
    """A run directory as fedrun writes it, reduced to what the scripts read.

    The test accuracy per round is ``accs`` when given (then final = its last, best = its first
    maximum), else rises linearly to ``best`` at round ``rounds - 1`` (to ``final`` at the last
    round when ``best`` is None or equal to it) and ends at ``final``.  ``best_round_in_summary``
    False writes a summary without ``best_round`` (the scripts then read it from rounds.csv).
    """
    if accs is None:
        if best is None or best == final:
            accs = [final * t / rounds for t in range(1, rounds + 1)]
        else:
            accs = [best * t / (rounds - 1) for t in range(1, rounds)] + [final]
    rounds, final, best = len(accs), accs[-1], max(accs)
    folder.mkdir(parents=True)
    config = {
        "dataset": {"name": data_name or dataset, "max_train": None, "max_test": None},
        "aggregator": {"_target_": f"fedrun.aggregators.{method}"},
        "hyperparams": hyperparams or PAPER_SCALE[dataset],
        "seed": seed,
        "tags": {"paper": "fednnnn", "dataset": dataset, "condition": condition} if tags is None else tags,
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {"aggregator": method, "rounds": rounds, "final_test_acc": final, "best_test_acc": best}
    if best_round_in_summary:
        summary["best_round"] = accs.index(best) + 1
    (folder / "summary.json").write_text(json.dumps(summary))
    lines = [",".join(ROUND_COLUMNS)]
    total = 0.0
    for t, acc in enumerate(accs, 1):
        n, e = 0.1 / t, 0.3 / t
        step = 2 * n if method in ("normnorm", "fednnnn") else n
        total += step
        row = [t, acc, "", n, e, n / e, step, total, n / 2, e / 2, step / 2, n / 2, e / 2, step / 2]
        lines.append(",".join(str(v) for v in row))
    (folder / "rounds.csv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def grid(tmp_path):
    """A few runs: paper-scale MNIST IID-B, two seeds of CIFAR10 non-IID-B, one smoke run, junk."""
    top = tmp_path / "runs"
    make_run(top / "a" / "fedavg", "fedavg", "mnist", "iid-b", 0.95, best=0.97)
    make_run(top / "a" / "fednnnn", "fednnnn", "mnist", "iid-b", 0.991)
    make_run(top / "b" / "s0", "fednnnn", "cifar10", "noniid-b", 0.80, seed=0)
    make_run(top / "b" / "s1", "fednnnn", "cifar10", "noniid-b", 0.82, seed=1)
    smoke = dict(PAPER_SCALE["cifar10"], rounds=3, num_clients=10)
    make_run(top / "c" / "deep" / "x", "momentum", "cifar10", "iid-ub", 0.5, data_name="synthetic",
             hyperparams=smoke)
    make_run(top / "untagged", "fedavg", "mnist", "iid-b", 0.10, tags={})
    (top / "not_a_run").mkdir()
    (top / "not_a_run" / "summary.json").write_text("{}")  # no config.yaml: not a run directory
    return top


def _line(text: str, label: str) -> list[str]:
    """The cells of the table row starting with ``label``."""
    row = next(line for line in text.splitlines() if line.split("|")[0].strip() == label)
    return [c.strip() for c in row.split("|")[1:]]


def _column(condition: str, dataset: str) -> int:
    return fednnnn_table2.CONDITIONS.index(condition) * 2 + fednnnn_table2.DATASETS.index(dataset)


# ----------------------------------------------------------------------------- discovery

def test_find_runs_needs_summary_and_config(grid):
    found = results.find_runs(grid, require=results.FINISHED_FILES)
    assert len(found) == 6
    assert all((p / "config.yaml").is_file() and (p / "summary.json").is_file() for p in found)
    loaded, skipped = fednnnn_table2.load_runs([grid])
    assert len(loaded) == 5 and len(skipped) == 1 and "untagged" in str(skipped[0][0])
    cells = papers.group(loaded, fednnnn_table2.cell)
    assert len(cells[("fednnnn", "cifar10", "noniid-b")]) == 2


def test_deviations_read_from_the_runs_config(grid):
    loaded, _ = fednnnn_table2.load_runs([grid])
    by_path = {r.path.name: r for r in loaded}
    assert fednnnn_table2.deviations(by_path["fedavg"]) == []
    dev = fednnnn_table2.deviations(by_path["x"])
    assert "data substituted: synthetic instead of cifar10" in dev
    assert "rounds=3 (paper 250)" in dev and "num_clients=10 (paper 100)" in dev


# ----------------------------------------------------------------------------- Table 2

def test_collect_prints_final_best_paper_and_differences(grid, tmp_path, capsys):
    out_csv = tmp_path / "t2.csv"
    assert fednnnn_table2.main(["collect", str(grid), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    fedavg, fednnnn = _line(text, "FedAvg"), _line(text, "FedNNNN")
    # Golden numbers: final 0.95, best 0.97 in round 3, vs the paper's 99.0 -> -4.0 / -2.0;
    # 0.991 (rising to its last round, 4) vs 99.2 -> -0.1.
    assert fedavg[_column("iid-b", "mnist")] == "95.0 / 97.0@r3 (99.0; -4.0 / -2.0)"
    assert fednnnn[_column("iid-b", "mnist")] == "99.1 / 99.1@r4 (99.2; -0.1 / -0.1)"
    # Two seeds: mean 81.0, count 2, vs 76.7 -> +4.3.
    assert fednnnn[_column("noniid-b", "cifar10")] == "81.0 / 81.0@r4 [2] (76.7; +4.3 / +4.3)"
    # A cell with no run, and a run at smoke scale on substituted data (marked * and explained).
    assert fedavg[_column("iid-b", "cifar10")] == "- (81.3; -)"
    assert _line(text, "Momentum")[_column("iid-ub", "cifar10")] == "50.0 / 50.0@r4* (84.2; -34.2 / -34.2)"
    assert "NOT use the paper's setting" in text and "synthetic instead of cifar10" in text
    assert _line(text, "FedProx") == ["- (99.0; -)", "- (81.4; -)", "- (98.1; -)", "- (74.2; -)",
                                      "- (99.1; -)", "- (83.2; -)", "- (87.9; -)", "- (55.6; -)"]
    # Caption and footnote: which accuracy the paper's numbers appear to be, with the quote.
    assert "The paper's numbers appear to be the best accuracy" in text
    assert "Table 2 appears to hold the BEST test accuracy" in text
    assert "Section 5.1 (Settings)" in text and "highest accuracy on the test data over the training rounds" in text
    # Paper-setting cells: fedavg (best closer), fednnnn mnist (tie), fednnnn cifar10 (tie); the
    # smoke run's cell is left out.
    assert "best is closer to the paper in 1, final in 0, tie in 2 of the 3 cell(s)" in text
    assert "the runs point to BEST (agrees with the text)" in text and "1 cell(s) marked * left out" in text

    rows = {(r["method"], r["dataset"], r["condition"]): r for r in csv.DictReader(out_csv.open())}
    assert len(rows) == 40
    assert list(rows.values())[0].keys() >= {"method", "dataset", "condition", "ours_pct", "paper_pct",
                                             "diff_pct", "run_dir", "final_acc_pct", "best_acc_pct",
                                             "best_round", "final_diff_pct", "best_diff_pct", "closer"}
    r = rows[("fedavg", "mnist", "iid-b")]
    assert float(r["ours_pct"]) == pytest.approx(95.0)  # --accuracy final (the default)
    assert r["metric"] == "final_test_acc"
    assert float(r["paper_pct"]) == pytest.approx(99.0)
    assert float(r["diff_pct"]) == pytest.approx(-4.0)
    assert float(r["final_acc_pct"]) == pytest.approx(95.0) and float(r["best_acc_pct"]) == pytest.approx(97.0)
    assert r["best_round"] == "3" and r["closer"] == "best"
    assert float(r["final_diff_pct"]) == pytest.approx(-4.0) and float(r["best_diff_pct"]) == pytest.approx(-2.0)
    assert r["run_dir"].endswith("fedavg")
    assert rows[("fedavg", "cifar10", "iid-b")]["ours_pct"] == ""
    assert rows[("fedavg", "cifar10", "iid-b")]["best_acc_pct"] == ""
    assert rows[("fedavg", "cifar10", "iid-b")]["closer"] == ""
    assert rows[("fednnnn", "cifar10", "noniid-b")]["n_runs"] == "2"


def test_collect_best_accuracy(grid, tmp_path, capsys):
    out_csv = tmp_path / "best.csv"
    fednnnn_table2.main(["collect", str(grid), "--accuracy", "best", "--csv", str(out_csv)])
    text = capsys.readouterr().out
    assert "CSV ours_pct/diff_pct: the best test accuracy" in text
    # The printed cell shows both whatever --accuracy says.
    assert _line(text, "FedAvg")[_column("iid-b", "mnist")] == "95.0 / 97.0@r3 (99.0; -4.0 / -2.0)"
    r = next(r for r in csv.DictReader(out_csv.open()) if (r["method"], r["dataset"], r["condition"])
             == ("fedavg", "mnist", "iid-b"))
    assert float(r["ours_pct"]) == pytest.approx(97.0) and float(r["diff_pct"]) == pytest.approx(-2.0)
    assert r["metric"] == "best_test_acc" and float(r["final_acc_pct"]) == pytest.approx(95.0)


def test_final_and_best_by_hand(tmp_path, capsys):
    """Hand-checkable curves: test_acc 0.5, 0.9, 0.8 -> final 80.0, best 90.0 in round 2."""
    top = tmp_path / "runs"
    # No best_round in its summary: read from rounds.csv.  Paper 98.2: -18.2 / -8.2 -> best closer.
    make_run(top / "a", "fedavg", "mnist", "noniid-b", accs=[0.5, 0.9, 0.8], best_round_in_summary=False)
    # Paper 83.1: final 84.0 (+0.9) is closer than best 86.0 (+2.9).
    make_run(top / "b", "momentum", "cifar10", "iid-b", accs=[0.70, 0.86, 0.84])
    # Two seeds, best in rounds 2 and 3: final mean (0.7 + 0.9) / 2 = 80.0, best (0.8 + 0.9) / 2 = 85.0;
    # paper 76.7: +3.3 / +8.3 -> final closer.
    make_run(top / "c0", "fednnnn", "cifar10", "noniid-b", accs=[0.6, 0.8, 0.7], seed=0)
    make_run(top / "c1", "fednnnn", "cifar10", "noniid-b", accs=[0.6, 0.7, 0.9], seed=1,
             best_round_in_summary=False)
    # Smoke scale (marked *): left out of the vote although best is closer.
    make_run(top / "d", "fedprox", "mnist", "iid-ub", accs=[0.3, 0.6, 0.5],
             hyperparams=dict(PAPER_SCALE["mnist"], rounds=3))
    out_csv = tmp_path / "t2.csv"
    assert fednnnn_table2.main(["collect", str(top), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert _line(text, "FedAvg")[_column("noniid-b", "mnist")] == "80.0 / 90.0@r2 (98.2; -18.2 / -8.2)"
    assert _line(text, "Momentum")[_column("iid-b", "cifar10")] == "84.0 / 86.0@r2 (83.1; +0.9 / +2.9)"
    assert _line(text, "FedNNNN")[_column("noniid-b", "cifar10")] == "80.0 / 85.0@r2-3 [2] (76.7; +3.3 / +8.3)"
    assert _line(text, "FedProx")[_column("iid-ub", "mnist")] == "50.0 / 60.0@r2* (99.1; -49.1 / -39.1)"
    # mean |diff|: final (18.2 + 0.9 + 3.3) / 3 = 7.47, best (8.2 + 2.9 + 8.3) / 3 = 6.47
    assert ("best is closer to the paper in 1, final in 2, tie in 0 of the 3 cell(s) at the paper's setting "
            "(mean |ours - paper|: final 7.47, best 6.47) -> the runs point to FINAL (disagrees with the text)"
            ) in text

    rows = {(r["method"], r["dataset"], r["condition"]): r for r in csv.DictReader(out_csv.open())}
    a = rows[("fedavg", "mnist", "noniid-b")]
    assert (float(a["final_acc_pct"]), float(a["best_acc_pct"]), a["best_round"]) == (80.0, 90.0, "2")
    assert (float(a["final_diff_pct"]), float(a["best_diff_pct"])) == pytest.approx((-18.2, -8.2))
    assert a["closer"] == "best"
    assert rows[("momentum", "cifar10", "iid-b")]["closer"] == "final"
    c = rows[("fednnnn", "cifar10", "noniid-b")]
    assert (float(c["final_acc_pct"]), float(c["best_acc_pct"]), c["best_round"]) == (80.0, 85.0, "2;3")
    assert c["n_runs"] == "2" and c["closer"] == "final"
    assert rows[("fedprox", "mnist", "iid-ub")]["best_round"] == "2"


def test_best_round_unknown_and_no_paper_scale_runs(tmp_path, capsys):
    top = tmp_path / "runs"
    run = make_run(top / "a", "fedavg", "cifar10", "iid-ub", accs=[0.4, 0.6], best_round_in_summary=False,
                   hyperparams=dict(PAPER_SCALE["cifar10"], rounds=2))
    (run / "rounds.csv").unlink()  # no summary best_round and no rounds.csv: round unknown
    assert fednnnn_table2.main(["collect", str(top), "--csv", ""]) == 0
    text = capsys.readouterr().out
    assert _line(text, "FedAvg")[_column("iid-ub", "cifar10")] == "60.0 / 60.0@r?* (83.5; -23.5 / -23.5)"
    assert "no cell at the paper's setting, so they cannot tell final from best" in text


def test_collect_writes_no_csv_unless_asked(grid, tmp_path, capsys, monkeypatch):
    """collect prints the table; it writes nothing into the folders it reads (nor anywhere) unless
    --csv names a file, and its --help says so."""
    monkeypatch.chdir(tmp_path)
    before = sorted(p for p in tmp_path.rglob("*"))
    assert fednnnn_table2.main(["collect", str(grid)]) == 0
    assert "wrote" not in capsys.readouterr().out
    assert sorted(p for p in tmp_path.rglob("*")) == before
    with pytest.raises(SystemExit):
        fednnnn_table2.main(["collect", "--help"])
    assert "by default none is written" in " ".join(capsys.readouterr().out.split())


def test_damaged_runs_are_named_in_one_line(grid, tmp_path, capsys):
    """A run whose summary.json is not JSON, or whose config.yaml is not a mapping: the table
    names the file (unreadable, skipped) and the plots say so on stderr; no traceback."""
    (grid / "a" / "fedavg" / "summary.json").write_text("{not json")
    (grid / "b" / "s1" / "config.yaml").write_text("- a list\n")
    assert fednnnn_table2.main(["collect", str(grid)]) == 0
    text = capsys.readouterr().out
    assert "2 run directories unreadable (skipped): " in text
    assert f"{grid / 'a' / 'fedavg' / 'summary.json'}: not valid JSON" in text
    assert f"{grid / 'b' / 's1' / 'config.yaml'}: not a mapping of settings (list)" in text
    assert plot_fednnnn.main([str(grid), "--out", str(tmp_path / "figs")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert sorted(line.split(": unreadable: ")[1].split(":")[0] for line in err) == \
        sorted([str(grid / "a" / "fedavg" / "summary.json"), str(grid / "b" / "s1" / "config.yaml")])
    assert all(line.startswith("plot_fednnnn: skipping ") for line in err)


def test_a_one_line_error_in_a_script_is_exit_2(grid, tmp_path, capsys, monkeypatch):
    from fedrun.errors import RunDirectoryError

    def damaged(*args, **kwargs):
        raise RunDirectoryError(f"{grid}/x/rounds.csv: not a CSV file")

    monkeypatch.setattr(fednnnn_table2, "collect", damaged)
    assert fednnnn_table2.main(["collect", str(grid)]) == 2
    assert capsys.readouterr().err == f"fednnnn_table2: error: {grid}/x/rounds.csv: not a CSV file\n"
    monkeypatch.setattr(plot_fednnnn, "load_runs", damaged)
    assert plot_fednnnn.main([str(grid), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"plot_fednnnn: error: {grid}/x/rounds.csv: not a CSV file\n"


def test_builtin_table2_matches_targets_csv():
    path = TARGETS / "fednnnn_table2_accuracy.csv"
    if not path.is_file():
        pytest.skip("../shared/papers/targets not present")
    assert fednnnn_table2.paper_table() == fednnnn_table2.paper_table(str(path))
    assert len(fednnnn_table2.paper_table()) == 40


def test_run_mode_dry_run_substitutes_and_smokes(tmp_path, capsys):
    rc = fednnnn_table2.main(["run", "--smoke", "--substitute", "cifar10=synthetic",
                              "--substitute", "mnist=mnist_train10k", "--out", str(tmp_path / "o"),
                              "--dry-run"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "SMOKE SCALE" in text and "SUBSTITUTED DATA" in text
    calls = [line for line in text.splitlines() if line.startswith("[")]
    assert len(calls) == 8
    cifar = next(c for c in calls if "experiment=fednnnn/cifar10_noniid_ub" in c)
    for piece in ("dataset=synthetic", "dataset.channels=3", "dataset.image_size=32", "scale=smoke",
                  "aggregator=fedavg,fedprox,normnorm,momentum,fednnnn", f"hydra.sweep.dir={tmp_path}"):
        assert piece in cifar
    mnist = next(c for c in calls if "experiment=fednnnn/mnist_iid_b" in c)
    assert "dataset=mnist_train10k" in mnist and "dataset.channels" not in mnist


def test_run_mode_sweeps_exactly_the_missing_runs_and_trains_populations(tmp_path, capsys):
    """What is left of a column that is not a product of methods x seeds is several sweeps, none
    of which redoes a finished run; --population adds the population launcher to each."""
    out = tmp_path / "o"
    make_run(out / "mnist_iid_b" / "fedavg_seed0", "fedavg", "mnist", "iid-b", final=0.5, seed=0)
    make_run(out / "mnist_iid_b" / "fedprox_seed1", "fedprox", "mnist", "iid-b", final=0.5, seed=1)
    assert fednnnn_table2.main(["run", "--out", str(out), "--cells", "mnist_iid_b", "mnist_noniid_b",
                                "--methods", "fedavg", "fedprox", "--seeds", "0,1", "--population", "--dry-run"]) == 0
    calls = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(calls) == 3
    first, second, other = calls
    assert first.startswith("[1/2] mnist_iid_b, sweep 1 of 2 (2 finished): ")
    assert " aggregator=fedavg seed=1 " in first and " aggregator=fedprox seed=0 " in second
    assert other.startswith("[2/2] mnist_noniid_b: ") and " aggregator=fedavg,fedprox seed=0,1 " in other
    assert all(" hydra/launcher=population " in c for c in calls)
    assert product_blocks([("a", 0), ("a", 1), ("b", 1), ("c", 0), ("c", 1)]) == [(["a", "c"], [0, 1]), (["b"], [1])]


def test_resume_continues_the_unfinished_runs_and_never_a_diverged_one(tmp_path, capsys):
    """Without --resume a run that started and did not finish is skipped; with it, it is run again
    with resume=true (a sweep of its own when the rest are not one product), while a run that
    diverged (run.json says so) stays as it is: resumed, it would diverge at the same round."""
    out = tmp_path / "o"
    make_run(out / "mnist_iid_b" / "fedavg_seed0", "fedavg", "mnist", "iid-b", final=0.5, seed=0)
    for name, method, reason in (("fedprox_seed0", "fedprox", None), ("fedavg_seed1", "fedavg", "diverged")):
        run = make_run(out / "mnist_iid_b" / name, method, "mnist", "iid-b", final=0.5, seed=int(name[-1]))
        (run / "summary.json").unlink()  # stopped before its last round
        session = {"started": "2026-11-27T10:00:00+00:00", "last_round": 2}
        if reason:
            session.update(stopped="2026-11-27T10:01:00+00:00", reason=reason, error="NaN in the model")
        (run / "run.json").write_text(json.dumps([session]))
    args = ["run", "--out", str(out), "--cells", "mnist_iid_b", "--methods", "fedavg", "fedprox", "--seeds", "0,1",
            "--dry-run"]
    assert fednnnn_table2.main(args) == 0
    text = capsys.readouterr().out
    calls = [line for line in text.splitlines() if line.startswith("[")]
    assert len(calls) == 1 and " aggregator=fedprox seed=1 " in calls[0] and "resume=true" not in calls[0]
    assert "(1 finished, 2 unfinished, skipped)" in calls[0]
    assert fednnnn_table2.main(args + ["--resume"]) == 0
    text = capsys.readouterr().out
    calls = [line for line in text.splitlines() if line.startswith("[")]
    assert text.startswith("2 run(s) to do")
    assert len(calls) == 1 and " aggregator=fedprox seed=0,1 " in calls[0] and calls[0].endswith(" resume=true")
    assert "(1 finished, 1 diverged, not resumed, 1 to resume)" in calls[0]


def test_a_grid_says_how_many_runs_and_a_time_before_it_starts_and_an_eta_after_each(tmp_path, capsys):
    """Before a grid starts: the runs to do and, from runs already finished in its folder (their
    summary's time in rounds, else its start and end), about how long; after each run that finishes:
    what is left and an ETA at the pace so far."""
    from scripts.common import grid

    out = tmp_path / "o"
    for i, seconds in enumerate((20, 40)):  # two earlier runs of 20 s and 40 s
        run = make_run(out / "mnist_iid_b" / f"fedavg_seed{i}", "fedavg", "mnist", "iid-b", final=0.5, seed=i)
        summary = json.loads((run / "summary.json").read_text())
        if i == 0:  # no round_seconds: start to end
            summary.update(started="2026-11-27T10:00:00+00:00", finished=f"2026-11-27T10:00:{seconds}+00:00")
        else:  # stopped and resumed two hours later: its 40 s in rounds, not the 2 h from start to end
            summary.update(started="2026-11-27T10:00:00+00:00", finished="2026-11-27T12:00:20+00:00",
                           round_seconds=float(seconds))
        (run / "summary.json").write_text(json.dumps(summary))
    clock = iter([70.0, 100.0, 130.0])  # the grid's clock at its start and at the two finished runs
    progress = grid.Progress(4, out, clock=lambda: next(clock))
    progress.announce(2)
    progress.done("mnist_iid_b/fedprox_seed0", 30.0)
    progress.done("mnist_iid_b/fedprox_seed1", None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("4 run(s) to do in 2 sweep(s); about 30 s a run, from the 2 run(s) already in the folder: "
                        "about 2 min in all, one after another")
    assert lines[1].startswith("    [1/4] mnist_iid_b/fedprox_seed0 done in 30 s; 3 left, about 90 s (ETA ")
    assert lines[2].startswith("    [2/4] mnist_iid_b/fedprox_seed1 done; 2 left, about 60 s (ETA ")
    side = grid.Progress(4, out, clock=lambda: 0.0, jobs=2)
    side.announce()  # two runs at a time: about half the wall time
    side.done("mnist_iid_b/fedprox_seed0", 60.0)  # its neighbour is half done: 60 s / 2 a run to come
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("about 60 s in all, 2 at a time")
    assert lines[1].startswith("    [1/4] mnist_iid_b/fedprox_seed0 done in 60 s; 3 left, about 90 s (ETA ")
    assert grid.Progress(1, tmp_path / "empty").typical is None  # no earlier run: the ETA comes after the first


def test_a_grids_first_guess_takes_each_columns_own_pace(tmp_path, capsys, monkeypatch):
    """Columns of one table can differ twofold in time a run: each column's runs to do are guessed at
    the mean of that column's finished runs (a: 20 s and 40 s, mean 30 s; c: 90 s), a column with
    none at the mean over the folder ((20 + 40 + 90) / 3 = 50 s): 1 x 30 + 2 x 90 + 1 x 50 = 260 s
    for 4 runs, 65 s a run, where the folder's mean alone would say 50 s."""
    from scripts.common import grid

    out = tmp_path / "o"
    for column, i, seconds in (("a", 0, 20.0), ("a", 1, 40.0), ("c", 0, 90.0)):
        run = make_run(out / column / f"fedavg_seed{i}", "fedavg", "mnist", "iid-b", final=0.5, seed=i)
        summary = json.loads((run / "summary.json").read_text())
        summary["round_seconds"] = seconds
        (run / "summary.json").write_text(json.dumps(summary))
    progress = grid.Progress(4, out, clock=lambda: 0.0, columns={"a": 1, "b": 1, "c": 2})
    progress.announce(3)
    assert capsys.readouterr().out.splitlines()[0] == (
        "4 run(s) to do in 3 sweep(s); about 65 s a run, from the 3 run(s) already in the folder, each column's "
        "own where it has some: about 4 min in all, one after another")
    assert grid.Progress(4, out, clock=lambda: 0.0).typical == 50.0  # without columns: the folder's mean
    monkeypatch.chdir(tmp_path)  # an OUT given relative: the columns are still found (find_runs resolves)
    assert grid.Progress(4, Path("o"), clock=lambda: 0.0, columns={"a": 1, "b": 1, "c": 2}).typical == 65.0
    assert grid.Progress(0, out, clock=lambda: 0.0, columns={"a": 0}).typical == 50.0  # nothing to do: no guess by column


def test_unknown_substitute_is_rejected(capsys):
    assert fednnnn_table2.main(["run", "--out", "x", "--substitute", "cifar10=nope"]) == 2
    assert "unknown dataset option" in capsys.readouterr().err


# ----------------------------------------------------------------------------- figures

@pytest.mark.parametrize("n_def", ["step", "eq4"])
def test_plot_writes_nonempty_pngs(tmp_path, capsys, n_def):
    top = tmp_path / "runs"
    for m in fednnnn_table2.METHODS:
        make_run(top / m, m, "cifar10", "noniid-b", 0.7)
    make_run(top / "seed1", "fedavg", "cifar10", "noniid-b", 0.6, seed=1)
    out = tmp_path / "figs"
    assert plot_fednnnn.main([str(top), "--dataset", "cifar10", "--condition", "noniid-b",
                              "--out", str(out), "--n", n_def]) == 0
    printed = capsys.readouterr().out.split()
    names = {Path(p).name for p in printed}
    assert names == {f"cifar10_noniid-b_{k}.png" for k in
                     ("accuracy", "norms_fc", "norms_conv", "norms_all", "n_over_e", "server_step_sum")}
    for p in printed:
        data = Path(p).read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
        pdf = Path(p).with_suffix(".pdf").read_bytes()  # the same figure for a paper: fonts embedded as TrueType
        assert pdf[:5] == b"%PDF-" and b"/Type3" not in pdf
        assert b"/CIDFontType2" in pdf or b"/TrueType" in pdf  # matplotlib's Type 42: TrueType outlines


def test_norm_figures_draw_seed_bands_and_each_methods_marker(tmp_path, monkeypatch):
    """As the accuracy figure: each curve the mean over seeds, the seeds' range shaded (FedAvg's two
    seeds here, E's and N's), each method with a marker of its own, the legend saying so."""
    from scripts.common import plots

    figures = {}
    save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, *a, **k: (figures.__setitem__(Path(path).stem, fig),
                                                                           save(fig, path, *a, **k))[1])
    top = tmp_path / "runs"
    for m in fednnnn_table2.METHODS:
        make_run(top / m, m, "cifar10", "noniid-b", 0.7)
    make_run(top / "seed1", "fedavg", "cifar10", "noniid-b", 0.6, seed=1)
    assert plot_fednnnn.main([str(top), "--out", str(tmp_path / "figs")]) == 0
    for name in ("norms_all", "n_over_e", "server_step_sum"):
        ax = figures[f"cifar10_noniid-b_{name}"].axes[0]
        bands = len(ax.collections)
        assert bands == (2 if name == "norms_all" else 1), name  # FedAvg's seeds: E and N, or the one curve
        lines = [line for line in ax.get_lines() if line.get_label()[0] != "_"]
        assert len({line.get_marker() for line in lines}) == len(fednnnn_table2.METHODS), name
        assert plots.BAND_NOTE in ax.get_legend().get_title().get_text(), name


def test_every_title_fits_inside_its_figure(tmp_path, monkeypatch):
    """The longest titles (substituted data, a legend beside the panel, two panels side by side)
    lie inside their figure and over no other panel, as saved: none is cut at the figure's edge."""
    from scripts.common import plots

    saved = []

    def checked(fig, path, dpi):
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            if not ax.get_title():
                continue
            box = ax.title.get_window_extent(renderer)
            assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, \
                f"{Path(path).name}: title cut ({box.x0:.0f}..{box.x1:.0f} of 0..{fig.bbox.x1:.0f}): {ax.get_title()!r}"
            for other in fig.axes:
                assert other is ax or not box.overlaps(other.get_tightbbox(renderer)), \
                    f"{Path(path).name}: title over another panel: {ax.get_title()!r}"
        saved.append(Path(path).name)
        return save(fig, path, dpi)

    save = plots._save
    monkeypatch.setattr(plots, "_save", checked)
    smoke = dict(PAPER_SCALE["mnist"], rounds=3, num_clients=25, local_epochs=2)
    for m in fednnnn_table2.METHODS:
        make_run(tmp_path / "runs" / m, m, "mnist", "noniid-ub", 0.7, data_name="mnist_train10k", hyperparams=smoke)
    assert plot_fednnnn.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs")]) == 0
    assert len(saved) == 6


def test_a_figure_of_substituted_data_is_titled_with_what_it_read(tmp_path):
    """A FashionMNIST run filed under a MNIST preset (``--substitute``) is titled with the data it
    read, beside the paper's, never as MNIST."""
    from scripts.common import papers

    real = results.Run.load(make_run(tmp_path / "a", "fedavg", "mnist", "iid-b", 0.5))
    other = results.Run.load(make_run(tmp_path / "b", "fedavg", "mnist", "iid-b", 0.5, data_name="fmnist", seed=1))
    assert papers.dataset_title([real], "mnist") == "MNIST"
    assert papers.dataset_title([other], "mnist") == "Fashion-MNIST in place of MNIST"
    assert papers.dataset_title([real, other], "mnist", {"mnist": "MNIST"}) == "Fashion-MNIST / MNIST in place of MNIST"


def test_plot_without_matching_runs_fails_cleanly(grid, tmp_path, capsys):
    assert plot_fednnnn.main([str(grid), "--dataset", "mnist", "--condition", "noniid-ub",
                              "--out", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err.startswith("plot_fednnnn: error: no FedNNNN preset runs to draw for dataset=mnist "
                                              "condition=noniid-ub")
    assert not (tmp_path / "f").exists()


# ----------------------------------------------------------------------------- presets

def _table5() -> dict:
    """Table 5 of the paper: {(dataset, condition): {method: {param: value}}}."""
    path = TARGETS / "fednnnn_table5_scenario_hyperparams.csv"
    out: dict = {}
    if path.is_file():
        for r in csv.DictReader(path.open()):
            out.setdefault((r["dataset"], r["condition"]), {}).setdefault(r["method"], {})[r["param"]] = \
                float(r["value"])
    return out


def test_presets_compose_with_table5_values():
    assert {p.stem for p in PRESETS} == set(fednnnn_table2.CELLS)
    table5 = _table5()
    for preset in PRESETS:
        dataset, condition = fednnnn_table2.CELLS[preset.stem]
        assert preset.read_text().startswith("# @package _global_")
        for method in fednnnn_table2.METHODS:
            c = compose([f"experiment=fednnnn/{preset.stem}", f"aggregator={method}"], resolve=True)
            assert c["tags"] == {"paper": "fednnnn", "dataset": dataset, "condition": condition}
            assert c["dataset"]["name"] == dataset
            assert c["model"]["_target_"].endswith("MnistCNN" if dataset == "mnist" else "Cifar10CNN")
            assert c["hyperparams"]["rounds"] == (100 if dataset == "mnist" else 250)
            assert c["hyperparams"]["num_clients"] == 100 and c["hyperparams"]["local_epochs"] == 5
            iid, balanced = condition.startswith("iid"), condition.endswith("-b")
            assert c["partition"]["_target_"] == f"fedrun.data.partition.{'iid' if iid else 'classes'}"
            if not iid:
                assert c["partition"]["classes_per_client"] == 2
            assert c["partition"]["sizes"] == ("balanced" if balanced else "powerlaw")
            assert c["aggregator"]["weighting"] == ("examples" if balanced else "uniform")
            assert c["aggregator"]["_target_"] == f"fedrun.aggregators.{method}"
            for param, value in table5.get((dataset, condition), {}).get(method, {}).items():
                assert c["aggregator"][param] == pytest.approx(value), (preset.stem, method, param)
    # One cell checked by hand against the paper's Table 5 (independent of the CSV).
    cfg = compose(["experiment=fednnnn/mnist_noniid_ub", "aggregator=fednnnn"])
    assert cfg.aggregator.beta == 0.7 and cfg.aggregator.gamma == 0.8
    assert cfg.aggregator.weighting == "uniform" and cfg.partition.sizes == "powerlaw"
    cfg = compose(["experiment=fednnnn/cifar10_iid_b", "aggregator=fedprox"])
    assert cfg.aggregator.mu == 0.015 and cfg.hyperparams.weight_decay == 5.0e-4
