"""fedrun.results' finding and reading of single run directories: find_runs(require=...),
read_config, read_summary, read_csv, Run and load_runs.  Tiny hand-made folders; fast, CPU,
offline."""
from __future__ import annotations

import json

import pytest

from fedrun import results
from fedrun.errors import RunDirectoryError


def _folder(path, *files, config="seed: 0\n"):
    path.mkdir(parents=True)
    for name in files:
        text = {"config.yaml": config, "summary.json": json.dumps({"final_test_acc": 0.5}),
                "rounds.csv": "round,test_acc\n1,0.4\n2,0.5\n"}[name]
        (path / name).write_text(text)
    return path.resolve()


@pytest.fixture
def tree(tmp_path):
    """A finished run, a finished run without rounds.csv, a started one, one with only config.yaml
    and a folder without config.yaml."""
    return {
        "done": _folder(tmp_path / "a" / "done", "config.yaml", "rounds.csv", "summary.json"),
        "no_rounds": _folder(tmp_path / "a" / "no_rounds", "config.yaml", "summary.json"),
        "started": _folder(tmp_path / "b" / "started", "config.yaml", "rounds.csv"),
        "config_only": _folder(tmp_path / "b" / "config_only", "config.yaml"),
        "no_config": _folder(tmp_path / "c", "rounds.csv", "summary.json"),
        "top": tmp_path,
    }


def test_find_runs_default_needs_config_and_rounds(tree):
    assert results.find_runs(tree["top"]) == sorted([tree["done"], tree["started"]])
    assert results.find_runs(tree["top"], require=results.RUN_FILES) == results.find_runs(tree["top"])


def test_find_runs_require_finished_and_started(tree):
    finished = results.find_runs(tree["top"], require=results.FINISHED_FILES)
    assert finished == sorted([tree["done"], tree["no_rounds"]])
    started = results.find_runs(tree["top"], require=["config.yaml"])
    assert started == sorted([tree["done"], tree["no_rounds"], tree["started"], tree["config_only"]])
    # Each once, whichever paths overlap; a run directory itself is a path too.
    assert results.find_runs(tree["top"], tree["top"] / "a", tree["done"], require=results.FINISHED_FILES) == finished
    assert results.find_runs(tree["done"], require=results.FINISHED_FILES) == [tree["done"]]


def test_find_runs_missing_path(tmp_path):
    with pytest.raises(RunDirectoryError, match="no such file or directory"):
        results.find_runs(tmp_path / "nope", require=results.FINISHED_FILES)


def test_read_config_and_summary(tree, tmp_path):
    assert results.read_config(tree["done"]) == {"seed": 0}
    assert results.read_config(_folder(tmp_path / "empty", "config.yaml", config="")) == {}
    assert results.read_summary(tree["done"]) == {"final_test_acc": 0.5}
    assert results.read_summary(tree["started"]) == {}  # not finished
    with pytest.raises(FileNotFoundError):
        results.read_config(tree["no_config"])


def test_read_csv_none_when_missing_empty_or_not_csv(tree):
    df = results.read_csv(tree["done"])
    assert list(df["test_acc"]) == [0.4, 0.5]
    assert results.read_csv(tree["no_rounds"]) is None
    assert results.read_csv(tree["done"], "layers.csv") is None
    (tree["done"] / "clients.csv").write_text("")
    assert results.read_csv(tree["done"], "clients.csv") is None
    (tree["done"] / "layers.csv").write_text("round,layer\n1,2\n3,4,5,6\n")  # not CSV: rows of other widths
    assert results.read_csv(tree["done"], "layers.csv") is None


def test_load_and_summaries_unchanged_by_the_readers(tree):
    df = results.load(tree["top"])
    assert sorted(set(df["run_dir"])) == sorted(str(p) for p in (tree["done"], tree["started"]))
    s = results.summaries(tree["top"])
    assert list(s["final_test_acc"].isna()) == [False, True]  # done, started (no summary.json)


def test_run_reads_config_summary_and_csvs_once(tree):
    run = results.Run.load(tree["done"])
    assert run.path == tree["done"] and run.config == {"seed": 0} and run.finished and run.seed == 0
    assert run.accuracy("final") == 0.5 and run.accuracy("best") is None
    assert run.tags == {} and run.dataset is None and run.method is None
    first = run.rounds()
    assert list(first["test_acc"]) == [0.4, 0.5] and run.rounds() is first  # read once, then kept
    (tree["done"] / "rounds.csv").write_text("round,test_acc\n1,0.9\n")
    assert run.csv("rounds.csv") is first and run.csv("layers.csv") is None
    started = results.Run.load(tree["started"])
    assert not started.finished and started.summary == {}


def test_run_method_from_summary_else_config(tmp_path):
    config = "aggregator:\n  _target_: fedrun.aggregators.fednnnn\ntags:\n  paper: fednnnn\n  dataset: mnist\n"
    run = results.Run.load(_folder(tmp_path / "r", "config.yaml", config=config))
    assert run.method == "fednnnn" and run.tags["paper"] == "fednnnn" and run.dataset == "mnist"
    run.summary = {"aggregator": "fedavg"}
    assert run.method == "fedavg"


def test_load_runs_finished_rejected_and_unreadable(tree):
    (tree["no_rounds"] / "config.yaml").write_text("seed: [unclosed\n")  # not YAML
    runs, skipped = results.load_runs([tree["top"]])
    assert [r.path for r in runs] == [tree["done"]]
    assert [(p, why.split(":")[0]) for p, why in skipped] == [(tree["no_rounds"], "unreadable")]
    runs, skipped = results.load_runs([tree["top"]], lambda run: "seed 0" if run.seed == 0 else "")
    assert runs == [] and [(p, why.split(":")[0]) for p, why in skipped] == [(tree["done"], "seed 0"),
                                                                              (tree["no_rounds"], "unreadable")]
    started, _ = results.load_runs([tree["top"]], require=["config.yaml"])
    assert [r.path for r in started] == sorted([tree["done"], tree["started"], tree["config_only"]])
