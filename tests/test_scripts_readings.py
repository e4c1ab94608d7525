"""scripts/common/readings.py, the readings x outcome table, on tiny fake run directories: groups that
differ only in their seed, rounds to the target seed by seed, accuracies with their range, the
mean over the first rounds, --upto and --ignore.  Numbers checked by hand."""
from __future__ import annotations

import csv
import json

from scripts.common import readings
from test_scripts_fedlayerwise_fedlap import make_run


def _grid(tmp_path):
    top = tmp_path / "r"
    # Reading A (lr 0.005): seed 0 reaches 95% at round 3, seed 1 never in its 4 rounds.
    make_run(top / "a0", "fedavg", [0.5, 0.9, 0.95, 0.97], seed=0, hyperparams={"lr": 0.005})
    make_run(top / "a1", "fedavg", [0.3, 0.7, 0.9, 0.93], seed=1, hyperparams={"lr": 0.005})
    # Reading B (lr 0.001), run for 6 rounds: reaches at round 2 and at round 5.
    make_run(top / "b0", "fedavg", [0.6, 0.96, 0.97, 0.97, 0.98, 0.99], seed=0, hyperparams={"lr": 0.001, "rounds": 6})
    make_run(top / "b1", "fedavg", [0.4, 0.8, 0.9, 0.94, 0.95, 0.96], seed=1, hyperparams={"lr": 0.001, "rounds": 6})
    return top


def _lines(text):
    return {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in text.splitlines()
            if "lr=" in line.split("|")[0]}


def test_readings_table_by_hand(tmp_path, capsys):
    top = _grid(tmp_path)
    out_csv = tmp_path / "r.csv"
    assert readings.main([str(top), "--at", "1,2", "--mean-to", "2", "--csv", str(out_csv)]) == 0
    rows = _lines(capsys.readouterr().out)
    # The groups differ in lr and in rounds (6 vs the preset's 30): both show in the labels.
    a = next(v for k, v in rows.items() if "lr=0.005" in k)
    b = next(v for k, v in rows.items() if "lr=0.001" in k)
    assert a[1:] == ["2", "3, -", "3.0", "40.0 [30.0-50.0]", "80.0 [70.0-90.0]", "60.0", "95.0"]
    # Mean over rounds 1-2: seed 0 (0.6 + 0.96) / 2 = 78, seed 1 60 -> 69; final (0.99 + 0.96) / 2.
    assert b[1:] == ["2", "2, 5", "3.5", "50.0 [40.0-60.0]", "88.0 [80.0-96.0]", "69.0", "97.5"]
    written = list(csv.DictReader(out_csv.open()))
    assert len(written) == 4 and {r["at_round"] for r in written} == {"1", "2"}


def test_readings_upto_and_ignore(tmp_path, capsys):
    """--upto 4 compares reading B over its first 4 rounds (its seed 1 then never reaches 95%);
    --ignore rounds drops the rounds difference from the labels."""
    top = _grid(tmp_path)
    assert readings.main([str(top), "--at", "4", "--upto", "4", "--ignore", "rounds"]) == 0
    text = capsys.readouterr().out
    rows = _lines(text)
    assert not any("rounds=" in k for k in rows)
    b = next(v for k, v in rows.items() if "lr=0.001" in k)
    assert b[2:4] == ["2, -", "2.0"] and b[-1] == "95.5"
    assert "not reached within 4 rounds" in text


def test_readings_bad_input_is_one_line(tmp_path, capsys):
    assert readings.main([str(tmp_path / "nope")]) == 2
    assert readings.main([str(_grid(tmp_path)), "--at", "one"]) == 2
    err = capsys.readouterr().err
    assert "readings: error: argument --at: 'one': give comma-separated round numbers" in err
    (tmp_path / "empty").mkdir()
    assert readings.main([str(tmp_path / "empty")]) == 2
    assert "readings: error: no run directories" in capsys.readouterr().err


def test_a_diverged_seed_is_named_and_left_out_of_final(tmp_path, capsys):
    """Reading A's seed 1 diverged at round 5 (run.json says so): its last row (round 4, 0.93) is no
    final accuracy, so final is seed 0's 97.0 alone, and the new column names round 5."""
    top = _grid(tmp_path)
    (top / "a1" / "summary.json").unlink()  # a diverged run writes none
    (top / "a1" / "run.json").write_text(json.dumps([{"first_round": 1, "last_round": 4, "reason": "diverged",
                                                      "error": "round 5: parameter w is NaN or Inf"}]))
    assert readings.main([str(top), "--at", "1"]) == 0
    text = capsys.readouterr().out
    rows = _lines(text)
    a = next(v for k, v in rows.items() if "lr=0.005" in k)
    b = next(v for k, v in rows.items() if "lr=0.001" in k)
    assert a[-2:] == ["97.0", "-, 5"] and b[-2:] == ["97.5", "-, -"]
    assert "diverged at" in text


def test_runs_of_one_seed_have_no_seed_column_and_still_make_a_table(tmp_path, capsys):
    """fedrun.results.load names a seed column only where the runs' seeds differ: readings.py
    read it anyway (KeyError: 'seed') on one run, or on readings all run with seed 0.  Each run's
    seed now comes from its config.yaml, and two runs of one seed in a group stay two runs."""
    top = tmp_path / "r"
    make_run(top / "a0", "fedavg", [0.5, 0.9, 0.95], seed=0, hyperparams={"lr": 0.005})
    assert readings.main([str(top / "a0"), "--at", "1,3"]) == 0  # one run
    body = capsys.readouterr().out.split("-+-")[-1].splitlines()[1:]
    assert [[c.strip() for c in line.split("|")] for line in body] == [["run", "1", "3", "3.0", "50.0", "95.0",
                                                                        "95.0"]]
    make_run(top / "b0", "fedavg", [0.6, 0.96, 0.97], seed=0, hyperparams={"lr": 0.001})
    make_run(top / "b0_again", "fedavg", [0.4, 0.8, 0.99], seed=0, hyperparams={"lr": 0.001})
    assert readings.main([str(top), "--at", "1"]) == 0  # three runs, all seed 0
    rows = _lines(capsys.readouterr().out)
    b = next(v for k, v in rows.items() if "lr=0.001" in k)
    assert b[1:5] == ["2", "2, 3", "2.5", "50.0 [40.0-60.0]"] and b[-1] == "98.0"


def test_a_real_run_of_one_seed(tmp_path, capsys):
    """The report's case: one run made by the fedrun command, read by readings.py."""
    from conftest import TINY, fedrun_ok

    fedrun_ok([*TINY, f"hydra.run.dir={tmp_path / 'one_run'}"], tmp_path)
    assert readings.main([str(tmp_path / "one_run")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Readings x outcome on test_acc") and "\nFedNNNN " in text
    assert capsys.readouterr().err == ""


def test_tables_come_as_text_markdown_or_latex():
    """Every script's table (tables.render): aligned text by default, GitHub Markdown (a group's
    title before its columns' names) or a booktabs LaTeX tabular (the title spans its columns;
    LaTeX's special characters escaped), chosen by --format."""
    from scripts.common import tables

    head, body = ["method", "MNIST", "CIFAR10"], [["FedAvg", "99.0", "81.3"], ["Fed_x & y", "50%", "-"]]
    assert tables.render(head, body).splitlines()[0].startswith("method    |")
    with tables.use_format("markdown"):
        assert tables.render(head, body, groups=[("IID", 2)]).splitlines() == [
            "| method | IID: MNIST | IID: CIFAR10 |", "| --- | ---: | ---: |", "| FedAvg | 99.0 | 81.3 |",
            "| Fed_x & y | 50% | - |"]
    with tables.use_format("latex"):
        lines = tables.render(head, body, groups=[("IID", 2)]).splitlines()
    assert lines[0] == r"\begin{tabular}{lrr}" and lines[-1] == r"\end{tabular}"
    assert r" & \multicolumn{2}{c}{IID} \\" in lines and r"\cmidrule(lr){2-3}" in lines
    assert r"Fed\_x \& y & 50\% & - \\" in lines
    assert tables.render(head, body).startswith("method")  # the format ends with its block
