"""fedrun.results' finding and reading of single run directories: find_runs(require=...),
read_config, read_summary, read_csv, Run and load_runs, and what they say of damaged files (one
line naming the file, never a traceback; fedrun-plot prints it and exits 2).  Tiny hand-made
folders, and one tiny diverging run from the CLI; fast, CPU, offline."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY, fedrun_ok, run_fedrun

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
    with pytest.raises(RunDirectoryError, match=r"c/config.yaml: cannot be read \(No such file or directory\)$"):
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


# ----------------------------------------------------------------------------- damaged files: one line naming them

DAMAGED_CONFIGS = {
    "not YAML": (b"seed: [unclosed\n", "not valid YAML"),
    "binary": (b"\xff\xfe\x00garbage\x80", "not valid YAML"),
    "a list": (b"- 1\n- 2\n", "not a mapping of settings (list)"),
    "a number": (b"7\n", "not a mapping of settings (int)"),
}
DAMAGED_SUMMARIES = {
    "not JSON": (b"{not json", "not valid JSON"),
    "binary": (b"\xff\xfe\x00", "not valid JSON"),
    "a list": (b"[1, 2]", "not a JSON object (list)"),
}


def _one_line(error: Exception, path) -> str:
    text = str(error)
    assert "\n" not in text and text.startswith(f"{path}: "), text
    return text


@pytest.mark.parametrize("kind", DAMAGED_CONFIGS)
def test_a_damaged_config_is_one_line_naming_it(tree, kind):
    data, what = DAMAGED_CONFIGS[kind]
    path = tree["done"] / "config.yaml"
    path.write_bytes(data)
    for read in (results.read_config, results.Run.load, lambda run: results.load(run),
                 lambda run: results.summaries(run)):
        with pytest.raises(RunDirectoryError) as error:
            read(tree["done"])
        assert what in _one_line(error.value, path)
    runs, skipped = results.load_runs([tree["top"]])
    assert [r.path for r in runs] == [tree["no_rounds"]]
    assert [p for p, _ in skipped] == [tree["done"]] and skipped[0][1].startswith(f"unreadable: {path}: {what}")


@pytest.mark.parametrize("kind", DAMAGED_SUMMARIES)
def test_a_damaged_summary_is_one_line_naming_it(tree, kind):
    data, what = DAMAGED_SUMMARIES[kind]
    path = tree["done"] / "summary.json"
    path.write_bytes(data)
    for read in (results.read_summary, results.Run.load, lambda run: results.summaries(run)):
        with pytest.raises(RunDirectoryError) as error:
            read(tree["done"])
        assert what in _one_line(error.value, path)
    assert list(results.load(tree["done"])["test_acc"]) == [0.4, 0.5]  # load() reads no summary
    _, skipped = results.load_runs([tree["done"]])
    assert skipped[0][1].startswith(f"unreadable: {path}: {what}")


@pytest.mark.parametrize("data", [b"round,test_acc\n1,0.4\n2,0.5,7,8\n", b"\x00\xff\x80\x81garbage"],
                         ids=["other widths", "binary"])
def test_a_csv_that_is_not_csv(tree, data):
    path = tree["done"] / "rounds.csv"
    path.write_bytes(data)
    with pytest.raises(RunDirectoryError) as error:
        results.load(tree["top"])
    assert "not a CSV file" in _one_line(error.value, path)
    assert results.read_csv(tree["done"]) is None  # the reader of one run: None, as for a run cut off mid-write
    assert results.Run.load(tree["done"]).rounds() is None


@pytest.mark.parametrize("config,what", [
    ("tags: 5\naggregator: [1]\n", "aggregator=[1]: not a mapping of settings (list)"),
    ("seed: 0\nhyperparams: 5\n", "hyperparams=5: not a mapping of settings (int)"),
    ("seed: abc\n", "seed='abc': not an integer"),
    ("trainer: {max_epochs: 3}\noptimizer: adam\n", "not a fedrun config (its keys: trainer, optimizer"),
], ids=["odd nodes", "hyperparams a number", "seed a string", "another tool's"])
def test_a_config_that_is_not_fedrun_s_is_one_line_naming_it(tmp_path, config, what):
    """Odd nodes where fedrun writes mappings, a seed that is no integer, another tool's keys: one
    line naming the file for every reader, not an AttributeError deep in a script."""
    run = _folder(tmp_path / "r", "config.yaml", "rounds.csv", config=config)
    for read in (results.read_config, results.Run.load, results.load, results.summaries):
        with pytest.raises(RunDirectoryError) as error:
            read(run)
        assert what in _one_line(error.value, run / "config.yaml")


@pytest.mark.parametrize("name,data", [("config.yaml", b"- 1\n"), ("rounds.csv", b"\x00\xff\x80garbage")])
def test_fedrun_plot_says_which_file_is_damaged(tree, tmp_path, capsys, name, data):
    from fedrun import plot

    (tree["done"] / name).write_bytes(data)
    assert plot.main([str(tree["top"]), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fedrun-plot: error: {tree['done'] / name}: ")
    assert not (tmp_path / "figs").exists()


def test_a_diverged_run_says_so_in_run_json_and_results(tmp_path):
    """A run that diverges closes its run.json session with the reason, the last complete round and
    the error, so tables can report "diverged at round t" rather than leave the run out."""
    run_dir = tmp_path / "div"
    proc = run_fedrun([*TINY, "aggregator=fedavg", "hyperparams.lr=1e30", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 3
    session = json.loads((run_dir / "run.json").read_text())[-1]
    assert session["reason"] == "diverged" and session["last_round"] == 0 and "stopped" in session
    assert session["error"].startswith("round 1: ") and "NaN or Inf" in session["error"]
    run = results.Run.load(run_dir)
    assert not run.finished and run.stopped == {"reason": "diverged", "round": 1, "error": session["error"]}
    ok = tmp_path / "ok"
    fedrun_ok([*TINY, f"hydra.run.dir={ok}"], tmp_path)
    assert results.Run.load(ok).stopped is None


def test_a_run_made_before_a_setting_existed_counts_as_its_default(tmp_path):
    """A SCAFFOLD run whose config.yaml predates ``aggregator.correction`` reads as the YAML's
    default (``gradient``, the earlier behaviour): one group with the newer runs at the default,
    apart from runs at another value; FedAvg (no such setting) gains nothing.  Empty ``tags`` and
    ``tuned`` and another data root are not settings that tell runs apart."""
    def config(method, seed, extra=""):
        return (f"seed: {seed}\nchoices: {{aggregator: {method}}}\n"
                f"aggregator: {{_target_: fedrun.aggregators.{method}, weighting: examples{extra}}}\n")

    _folder(tmp_path / "old", "config.yaml", "rounds.csv", config=config("scaffold", 0))
    _folder(tmp_path / "new", "config.yaml", "rounds.csv", config=config("scaffold", 1, ", correction: gradient"))
    _folder(tmp_path / "other", "config.yaml", "rounds.csv", config=config("scaffold", 0, ", correction: after_step"))
    _folder(tmp_path / "fedavg", "config.yaml", "rounds.csv",
            config=config("fedavg", 0) + "tags: {}\ntuned: {}\ndataset: {load: {root: /elsewhere}}\n")
    identity = results.run_identity(results.find_runs(tmp_path)).set_index("run_dir")
    group = {Path(k).name: v for k, v in identity["group"].items()}
    assert group == {"old": "SCAFFOLD, correction=gradient", "new": "SCAFFOLD, correction=gradient",
                     "other": "SCAFFOLD, correction=after_step", "fedavg": "FedAvg"}


def test_settings_that_change_no_result_never_split_a_group(tmp_path):
    """The dashboard, the sweep's objective, the summary's targets and the snapshots change what a
    run logs or reports, not its rounds: runs that differ only in them are one group."""
    def config(seed, logger, extra=""):
        return (f"seed: {seed}\nchoices: {{aggregator: fedavg, logger: {logger}}}\n"
                f"aggregator: {{_target_: fedrun.aggregators.fedavg}}\nlogger: {{_target_: x, use: {{{logger}: true}}}}\n"
                + extra)

    _folder(tmp_path / "a", "config.yaml", "rounds.csv", config=config(0, "tensorboard", "objective: best_test_acc\n"))
    _folder(tmp_path / "b", "config.yaml", "rounds.csv", config=config(1, "mlflow", "objective: final_test_acc\n"
                                                                                   "targets: [0.5]\nsnapshots: [2]\n"))
    identity = results.run_identity(results.find_runs(tmp_path))
    assert set(identity["group"]) == {"FedAvg"}


@pytest.mark.parametrize("loader,name", [("load_layers", "layers.csv"), ("load_clients", "clients.csv"),
                                         ("load_client_layers", "client_layers.csv"),
                                         ("load_output_layer", "output_layer.csv"), ("load_partition", "partition.csv")])
def test_every_per_run_csv_has_its_loader(tmp_path, loader, name):
    """One loader a CSV a run writes: its rows, run by run, with the run's folder beside them."""
    for run, value in (("r1", 1.5), ("r2", 2.5)):
        _folder(tmp_path / run, "config.yaml", "rounds.csv")
        key = "client" if name == "partition.csv" else "round"  # partition.csv: a row a client
        (tmp_path / run / name).write_text(f"{key},value\n1,{value}\n2,{value + 1}\n")
    df = getattr(results, loader)(tmp_path)
    assert list(df["value"]) == [1.5, 2.5, 2.5, 3.5]
    assert list(df["run_dir"]) == [str(tmp_path / "r1")] * 2 + [str(tmp_path / "r2")] * 2
