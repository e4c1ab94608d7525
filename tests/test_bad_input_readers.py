"""A catalogue of bad input for the programs that read runs: each one line, as the ``fedrun`` command's.

``fedrun-plot`` and the scripts in ``scripts/`` (readings.py, the table scripts' ``collect`` and
``run``, the plot scripts, loss_surface.py) are given damaged or foreign run folders, folders that
hold no run, runs that stopped before their first round or diverged, options out of range and
output paths that cannot be written.  Every case runs the program's ``main(argv)`` (in one driver
process: tests/readers_driver.py) in an empty working folder and must exit 2 with exactly one line
on stderr, ``<prog>: error: <what>: <what is allowed / what to do>``, no traceback and no usage
block, and create nothing: no figure folder, no CSV, no ``logs/`` of a dry run; the run folders
read and the output paths given stay as they were.  The library's readers (``fedrun.results``)
are checked beside: one path where a list is expected is a list of one, and each refusal is one
line.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import _cli_env, created_in, refusal_failures

from fedrun import results
from fedrun.errors import ConfigError, RunDirectoryError

DRIVER = Path(__file__).resolve().parent / "readers_driver.py"

# The tags of each paper's presets (what the table and plot scripts file runs by).
TAGS = {
    "fednnnn": {"paper": "fednnnn", "dataset": "mnist", "condition": "iid-b"},
    "fedlayerwise": {"paper": "fedlayerwise", "dataset": "mnist", "scenario": "5iid_5noniid"},
    "niidbench": {"paper": "niidbench", "dataset": "mnist", "partition": "iid"},
    "fedlap": {"paper": "fedlap", "dataset": "mnist"},
    "pd": {},
}
HEADER = "round,test_acc,test_loss,train_loss,N,E,N_over_E,server_step,server_step_sum,pd_ls,pd_vl"
DIVERGED_AT_3 = [{"first_round": 1, "last_round": 2, "reason": "diverged",
                  "error": "round 3: parameter fc1.weight of the sent model is NaN or Inf after aggregation with "
                           "fedavg; the CSVs hold rounds before 3. Try a smaller hyperparams.lr"}]


def row(t: int, acc) -> str:
    return f"{t},{acc},1.5,1.5,0.5,1.0,0.5,0.4,{0.4 * t},0.1,0.2"


ROWS = [row(1, 0.4), row(2, 0.5), row(3, 0.6)]


def config(paper: str) -> dict:
    """A run's config.yaml, reduced to what the readers use, tagged as ``paper``'s preset runs are."""
    c = {"seed": 0, "aggregator": {"_target_": "fedrun.aggregators.fedavg"}, "dataset": {"name": "mnist"},
         "hyperparams": {"rounds": 3, "num_clients": 10, "client_fraction": 0.1, "local_epochs": 1,
                         "batch_size": 50, "lr": 0.05},
         "choices": {"aggregator": "fedavg", "dataset": "mnist", "partition": "iid"}, "tags": dict(TAGS[paper])}
    if paper == "pd":
        c["choices"].update(experiment="pd/iid", model="neta_baseline", hyperparams="pd_nmom_a")
    return c


def make_run(path: Path, paper: str = "fednnnn", text: str | None = None, rounds: str | None = None,
             summary: bool = True, sessions: list | None = None, **changes) -> str:
    """A run directory by hand: config.yaml (``text``, or ``paper``'s config with ``changes``),
    rounds.csv (three rounds unless ``rounds``), summary.json unless not ``summary``, run.json."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(text if text is not None else yaml.safe_dump({**config(paper), **changes}))
    (path / "rounds.csv").write_text("\n".join([HEADER, *ROWS]) + "\n" if rounds is None else rounds)
    if summary:
        (path / "summary.json").write_text(json.dumps({"aggregator": "fedavg", "rounds": 3, "final_test_acc": 0.6,
                                                       "best_test_acc": 0.6, "best_round": 3}))
    if sessions is not None:
        (path / "run.json").write_text(json.dumps(sessions))
    return str(path)


# A run that diverges in round 2 (one client a round at a huge learning rate): its checkpoint is
# round 1's model, whose loss is NaN or Inf everywhere (loss_surface.py has nothing to draw).
DIVERGING = ["dataset=synthetic", "dataset.load.num_train=200", "dataset.load.num_test=50", "model=mlp",
             "model.hidden=[8]", "hyperparams.num_clients=10", "hyperparams.client_fraction=0.1",
             "hyperparams.rounds=3", "aggregator=fedavg", "hyperparams.lr=1e30", "progress=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    """Run folders of every kind, each its own DIR, outside the cases' working folders."""
    d = tmp_path_factory.mktemp("runs")
    k = {f"good_{paper}": make_run(d / f"good_{paper}", paper) for paper in TAGS}
    k.update(
        not_yaml=make_run(d / "not_yaml", text="seed: [unclosed\n"),
        yaml_list=make_run(d / "yaml_list", text="- 1\n- 2\n"),
        yaml_string=make_run(d / "yaml_string", text="just some words\n"),
        seed_string=make_run(d / "seed_string", seed="abc"),
        hp_number=make_run(d / "hp_number", hyperparams=5),
        foreign=make_run(d / "foreign", text=yaml.safe_dump({"trainer": {"max_epochs": 3}, "optimizer": "adam"})),
        csv_empty=make_run(d / "csv_empty", rounds=""),
        csv_no_round=make_run(d / "csv_no_round", rounds="step,test_acc\n1,0.4\n2,0.5\n"),
        csv_no_acc=make_run(d / "csv_no_acc", rounds="round,test_loss\n1,0.4\n2,0.5\n"),
        csv_text=make_run(d / "csv_text", rounds="\n".join([HEADER, row(1, "abc"), row(2, 0.5)]) + "\n"),
        stopped_0=make_run(d / "stopped_0", rounds=HEADER + "\n", summary=False, sessions=[{"first_round": 1}]),
        stopped_1=make_run(d / "stopped_1", rounds=f"{HEADER}\n{ROWS[0]}\n", summary=False,
                           sessions=[{"first_round": 1}]),
        diverged=make_run(d / "diverged", rounds="\n".join([HEADER, *ROWS[:2]]) + "\n", summary=False,
                          sessions=DIVERGED_AT_3),
        diverged_pd=make_run(d / "diverged_pd", "pd", rounds="\n".join([HEADER, *ROWS[:2]]) + "\n", summary=False,
                             sessions=DIVERGED_AT_3),
    )
    for name in ("empty", "unrelated", "a_dir"):
        (d / name).mkdir()
        k[name] = str(d / name)
    (d / "unrelated" / "notes.txt").write_text("hello\n")
    (d / "unrelated" / "data.csv").write_text("a,b\n1,2\n")
    (d / "a_file.txt").write_text("not a folder\n")
    k["file"], k["missing"] = str(d / "a_file.txt"), str(d / "no_such_folder")
    k["real_diverged"] = str(d / "real_diverged")
    run = subprocess.run([sys.executable, "-m", "fedrun", *DIVERGING, f"hydra.run.dir={k['real_diverged']}"], cwd=d,
                         env=_cli_env(), capture_output=True, text=True, timeout=180)
    assert run.returncode == 3, run.stderr[-2000:]  # diverged: exit 3, checkpoint.pt of round 1
    return k


def catalogue() -> list[tuple[str, list[str], list[str]]]:
    """(program, its arguments, substrings its one line must hold); ``{name}`` is a run folder of
    :func:`runs`.  Relative output paths land in the case's (empty) working folder."""
    plot_out = ["--out", "figs"]
    return [
        # 1. damaged or foreign config.yaml values; rounds.csv empty, without round or test_acc, with text
        ("fedrun-plot", ["{not_yaml}", *plot_out], ["{not_yaml}/config.yaml", "not valid YAML"]),
        ("fedrun-plot", ["{yaml_list}", *plot_out], ["{yaml_list}/config.yaml", "not a mapping of settings (list)"]),
        ("fedrun-plot", ["{yaml_string}", *plot_out], ["{yaml_string}/config.yaml", "not a mapping of settings (str)"]),
        ("fedrun-plot", ["{seed_string}", *plot_out], ["{seed_string}/config.yaml", "seed='abc': not an integer"]),
        ("fedrun-plot", ["{hp_number}", *plot_out], ["{hp_number}/config.yaml", "hyperparams=5: not a mapping"]),
        ("fedrun-plot", ["{foreign}", *plot_out], ["{foreign}/config.yaml", "not a fedrun config", "trainer"]),
        ("fedrun-plot", ["{csv_no_round}", *plot_out], ["{csv_no_round}/rounds.csv", "no column round"]),
        ("fedrun-plot", ["{csv_no_acc}", *plot_out], ["{csv_no_acc}/rounds.csv", "no column test_acc"]),
        ("fedrun-plot", ["{csv_text}", *plot_out], ["{csv_text}/rounds.csv", "column test_acc, row 1: 'abc'",
                                                    "where a number belongs"]),
        ("readings", ["{hp_number}"], ["{hp_number}/config.yaml", "hyperparams=5"]),
        ("readings", ["{foreign}"], ["{foreign}/config.yaml", "not a fedrun config"]),
        ("readings", ["{csv_text}"], ["{csv_text}/rounds.csv", "where a number belongs"]),
        ("readings", ["{csv_no_acc}"], ["{csv_no_acc}/rounds.csv", "no column test_acc"]),
        ("fednnnn_table2", ["collect", "{yaml_list}"], ["no finished FedNNNN preset runs", "not a mapping"]),
        ("fednnnn_table2", ["collect", "{seed_string}"], ["no finished FedNNNN preset runs", "seed='abc'"]),
        ("niidbench_table3", ["collect", "{foreign}"], ["no finished NIID-Bench preset runs", "not a fedrun config"]),
        ("pd_tables", ["collect", "{not_yaml}"], ["no finished parameter-divergence", "not valid YAML"]),
        ("plot_fednnnn", ["{csv_text}", *plot_out], ["no FedNNNN preset runs to draw", "where a number belongs"]),
        ("plot_fednnnn", ["{csv_no_acc}", *plot_out], ["no FedNNNN preset runs to draw", "no column test_acc"]),
        ("plot_fedlap", ["{hp_number}", *plot_out], ["no FedLap preset runs to draw", "hyperparams=5"]),
        ("plot_pd", ["{csv_no_round}", *plot_out], ["no finished runs to draw", "no column round"]),
        ("loss_surface", ["{yaml_string}", "--out", "out"], ["{yaml_string}/config.yaml", "not a mapping"]),
        # 2. folders that are not runs: empty, unrelated files, a file, a path that does not exist
        ("fedrun-plot", ["{empty}", *plot_out], ["no run directories (config.yaml and rounds.csv) under {empty}"]),
        ("fedrun-plot", ["{unrelated}", *plot_out], ["no run directories", "{unrelated}"]),
        ("fedrun-plot", ["{file}", *plot_out], ["{file}: a file, not a folder"]),
        ("fedrun-plot", ["{missing}", *plot_out], ["{missing}: no such file or directory"]),
        ("readings", ["{unrelated}"], ["no run directories", "{unrelated}"]),
        ("readings", ["{file}"], ["{file}: a file, not a folder"]),
        ("fednnnn_table2", ["collect", "{empty}"], ["no finished FedNNNN preset runs under {empty}",
                                                    "no run directories"]),
        ("fedlayerwise_table1", ["collect", "{unrelated}"], ["no finished FedLayerWise preset runs"]),
        ("niidbench_table3", ["collect", "{missing}"], ["{missing}: no such file or directory"]),
        ("pd_tables", ["collect", "{file}"], ["{file}: a file, not a folder"]),
        ("plot_fedlayerwise", ["{empty}", *plot_out], ["no FedLayerWise preset runs to draw", "no run directories"]),
        ("plot_fedlap", ["{missing}", "--summary"], ["{missing}: no such file or directory"]),
        ("plot_pd", ["{unrelated}", *plot_out], ["no finished runs to draw", "no run directories"]),
        ("loss_surface", ["{empty}", "--out", "out"], ["{empty}: not a run directory (no config.yaml)"]),
        ("loss_surface", ["{missing}", "--out", "out"], ["{missing}: no such file or directory"]),
        # 3. stopped before the first round, or unfinished, or diverged: said so, nothing drawn empty
        ("fedrun-plot", ["{stopped_0}", *plot_out], ["{stopped_0}: stopped before its first round",
                                                     "nothing to draw"]),
        ("fedrun-plot", ["{csv_empty}", *plot_out], ["{csv_empty}: stopped before its first round"]),
        ("readings", ["{stopped_0}"], ["{stopped_0}: stopped before its first round"]),
        ("fednnnn_table2", ["collect", "{stopped_1}"], ["no finished FedNNNN preset runs", "not finished"]),
        ("fednnnn_table2", ["collect", "{diverged}"], ["no finished FedNNNN preset runs", "diverged at round 3"]),
        ("plot_fednnnn", ["{stopped_0}", *plot_out], ["no FedNNNN preset runs to draw", "not finished"]),
        ("plot_fednnnn", ["{diverged}", *plot_out], ["no FedNNNN preset runs to draw", "diverged at round 3"]),
        ("plot_pd", ["{diverged_pd}", *plot_out], ["no finished runs to draw", "diverged at round 3"]),
        ("loss_surface", ["{real_diverged}", "--grid", "3", "--samples", "20", "--out", "out"],
         ["{real_diverged}/checkpoint.pt: the loss is NaN or Inf at every grid point", "diverged at round 2"]),
        # 5. options out of range, unknown metrics, non-numeric values
        ("readings", ["{good_fednnnn}", "--target", "95"], ["--target: '95'", "write 0.95 for 95%"]),
        ("readings", ["{good_fednnnn}", "--target", "abc"], ["--target: 'abc'", "fraction in (0, 1]"]),
        ("readings", ["{good_fednnnn}", "--metric", "accuracy"], ["--metric=accuracy: no run has values of it",
                                                                  "test_acc, test_loss"]),
        ("readings", ["{good_fednnnn}", "--upto", "0"], ["--upto: '0'", "integer >= 1"]),
        ("readings", ["{good_fednnnn}", "--at", "0"], ["--at: '0'", "round numbers >= 1"]),
        ("readings", ["{good_fednnnn}", "--at", "-3"], ["--at: '-3'", "round numbers >= 1"]),
        ("readings", ["{good_fednnnn}", "--mean-to", "0"], ["--mean-to: '0'", "integer >= 1"]),
        ("readings", ["{good_fednnnn}", "--mean-to", "x"], ["--mean-to: 'x'", "integer >= 1"]),
        ("readings", ["{good_fednnnn}", "--nosuch"], ["unrecognized arguments: --nosuch", "--help"]),
        ("fedrun-plot", ["{good_fednnnn}", *plot_out, "--metrics", "val_acc"],
         ["--metrics=val_acc: no run has values of it", "test_acc"]),
        ("fedrun-plot", ["{good_fednnnn}", *plot_out, "--metrics", "accuracy"], ["--metrics=accuracy: choose from"]),
        ("fedrun-plot", ["{good_fednnnn}", *plot_out, "--cols", "0"], ["--cols: '0'", ">= 1"]),
        ("fedrun-plot", ["{good_fednnnn}"], ["the following arguments are required: --out"]),
        ("fedrun-plot", ["{good_fednnnn}", *plot_out, "--x", "bytes"],  # a hand-made run: no bytes columns
         ["--x=bytes: ", "rounds.csv has no bytes_total column", "--x round"]),
        ("fedrun-plot", ["{good_fednnnn}", *plot_out, "--x", "time"], ["--x: invalid choice: 'time'", "'bytes'"]),
        ("fedrun-plot", [*plot_out], ["give DIRs", "--partition RUN"]),
        ("fedrun-plot", ["--partition", "{empty}", *plot_out], ["--partition={empty}: no partition.csv in it"]),
        ("fedlayerwise_table1", ["collect", "{good_fedlayerwise}", "--target", "95"], ["write 0.95 for 95%"]),
        ("fedlayerwise_table1", ["collect", "{good_fedlayerwise}", "--metric", "val_acc"],
         ["--metric=val_acc: no run has values of it"]),
        ("fednnnn_table2", ["collect", "{good_fednnnn}", "--accuracy", "mid"], ["--accuracy: invalid choice"]),
        ("fednnnn_table2", [], ["the following arguments are required: {{collect,run}}"]),
        ("fednnnn_table2", ["run", "--out", "grid", "--seeds", "a,b", "--dry-run"], ["--seeds: 'a,b'",
                                                                                     "integer seeds"]),
        ("pd_tables", ["collect", "{good_pd}", "--tables", "99"], ["--tables=99: unknown table99", "table4"]),
        ("pd_tables", ["run", "--out", "grid", "--dry-run", "--networks", "NetZ"], ["--networks=NetZ: unknown"]),
        ("plot_fedlayerwise", ["{good_fedlayerwise}", *plot_out, "--metric", "val_acc"],
         ["--metric=val_acc: no run has values of it"]),
        ("plot_fedlap", ["{good_fedlap}", "--summary", "--round", "0"], ["--round: '0'", "integer >= 1"]),
        ("plot_fedlap", ["{good_fedlap}"], ["give --out (figures) and/or --summary (table)"]),
        ("plot_pd", ["{good_pd}", *plot_out, "--layers", "C99"], ["--layers=C99: no run has layer C99"]),
        ("plot_pd", ["{good_pd}", *plot_out, "--settings", "noniid9"], ["--settings=noniid9: choose from", "iid"]),
        ("plot_pd", ["{good_pd}", *plot_out, "--neuron-round", "0"], ["--neuron-round: '0'"]),
        ("loss_surface", ["{good_pd}", "--grid", "4", "--out", "out"], ["--grid=4: must be odd and >= 3"]),
        ("loss_surface", ["{good_pd}", "--span", "0", "--out", "out"], ["--span: '0'", "> 0"]),
        ("loss_surface", ["{good_pd}", "--batch-size", "0", "--out", "out"], ["--batch-size: '0'", ">= 1"]),
        ("loss_surface", ["{good_pd}", "--device", "tpu", "--out", "out"], ["--device: 'tpu'", "auto, cpu"]),
        ("loss_surface", ["{real_diverged}", "--snapshot", "7", "--out", "out"],
         ["{real_diverged}/models/round_0007.pt: no such checkpoint"]),
        # 6. output paths: a file where a folder is expected, a folder where a file is, unwritable
        ("fedrun-plot", ["{good_fednnnn}", "--out", "{file}"], ["--out={file}: is a file, not a folder"]),
        ("fedrun-plot", ["{good_fednnnn}", "--out", "/proc/fedrun_figs"],
         ["--out=/proc/fedrun_figs: cannot be written"]),
        ("readings", ["{good_fednnnn}", "--csv", "{a_dir}"], ["--csv={a_dir}: is a folder, not a file"]),
        ("readings", ["{good_fednnnn}", "--csv", "/proc/readings.csv"],
         ["--csv=/proc/readings.csv: cannot be written"]),
        ("readings", ["{good_fednnnn}", "--csv", "{file}/r.csv"], ["--csv={file}/r.csv: cannot be written",
                                                                    "{file} is a file"]),
        ("fednnnn_table2", ["collect", "{good_fednnnn}", "--csv", "{a_dir}"], ["--csv={a_dir}: is a folder"]),
        ("niidbench_table3", ["collect", "{good_niidbench}", "--csv", "/proc/t3.csv"], ["--csv=/proc/t3.csv"]),
        ("fedlayerwise_table1", ["run", "--out", "{file}", "--dry-run"], ["--out={file}: is a file, not a folder"]),
        ("pd_tables", ["run", "--out", "grid", "--csv", "{a_dir}", "--dry-run"], ["--csv={a_dir}: is a folder"]),
        ("plot_fednnnn", ["{good_fednnnn}", "--out", "{file}"], ["--out={file}: is a file, not a folder"]),
        ("plot_fedlayerwise", ["{good_fedlayerwise}", "--out", "/proc/fedrun_figs"], ["cannot be written"]),
        ("plot_fedlap", ["{good_fedlap}", "--summary", "--csv", "{a_dir}"], ["--csv={a_dir}: is a folder"]),
        ("plot_pd", ["{good_pd}", "--out", "{file}"], ["--out={file}: is a file, not a folder"]),
        ("loss_surface", ["{real_diverged}", "--out", "{file}"], ["--out={file}: is a file, not a folder"]),
    ]


def run_catalogue(cases, runs: dict[str, str], tmp_path: Path) -> list[dict]:
    """Each case in its own empty working folder, all in one driver process; the driver's results
    with the folder."""
    jobs = []
    for i, (prog, args, _) in enumerate(cases):
        cwd = tmp_path / f"case{i:03d}"
        cwd.mkdir()
        jobs.append({"prog": prog, "args": [a.format(**runs) for a in args], "cwd": str(cwd)})
    proc = subprocess.run([sys.executable, str(DRIVER)], input=json.dumps(jobs), capture_output=True, text=True,
                          env=_cli_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(done) == len(jobs)
    return [{**r, "cwd": Path(j["cwd"])} for r, j in zip(done, jobs)]


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path below ``folder`` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_every_bad_input_is_one_line_before_anything_is_written(runs, tmp_path):
    cases = catalogue()
    assert len(cases) >= 60 and len({prog for prog, _, _ in cases}) == 11  # every program
    top = Path(runs["empty"]).parent
    before = tree(top)
    problems = []
    for (prog, args, expected), result in zip(cases, run_catalogue(cases, runs, tmp_path)):
        failed = refusal_failures(result, [s.format(**runs) for s in expected], prefix=f"{prog}: error: ",
                                  named="says what and what to do", **{"no usage block": "usage:" not in result["stderr"]})
        if failed:
            problems.append(f"{prog} {' '.join(a.format(**runs) for a in args)}: {', '.join(failed)} "
                            f"(exit {result['code']}; created {created_in(result)}):\n{result['stderr'][-1500:]}")
    assert not problems, "\n\n".join(problems)
    assert tree(top) == before  # the runs read, the file given as --out, the folder given as --csv: untouched


def test_a_dry_run_of_the_table_scripts_writes_nothing(runs, tmp_path):
    """``run --dry-run`` prints the sweeps it would launch, and creates no folder, no logs/ (it
    used to create OUT/logs)."""
    cases = [("fednnnn_table2", ["run", "--out", "grid", "--dry-run", "--cells", "mnist_iid_b"], []),
             ("fedlayerwise_table1", ["run", "--out", "grid", "--dry-run"], []),
             ("niidbench_table3", ["run", "--out", "grid", "--dry-run", "--datasets", "mnist"], []),
             ("pd_tables", ["run", "--out", "grid", "--dry-run", "--tables", "4"], [])]
    for (prog, _, _), result in zip(cases, run_catalogue(cases, runs, tmp_path)):
        assert result["code"] == 0, (prog, result["stderr"][-2000:])
        assert "fedrun" in result["stdout"] and " -m " in result["stdout"], prog
        assert not list(result["cwd"].iterdir()), prog


# ----------------------------------------------------------------------------- the library

def test_one_path_where_a_list_is_expected_is_a_list_of_one(runs, monkeypatch):
    """``load("outputs/run")``, ``load(["outputs/run"])``, ``summaries(Path)`` and
    ``load_runs("outputs/run")`` all read that one run; ``load_runs`` with a string used to walk
    each of its characters as a path (``/``: the whole disk)."""
    good = runs["good_fednnnn"]
    for paths in (good, Path(good), [good], (Path(good),)):
        assert set(results.load(paths)["run_dir"]) == {str(Path(good).resolve())}
        assert len(results.summaries(paths)) == 1
    assert set(results.load([good, runs["good_fedlap"]])["run_dir"]) == {str(Path(p).resolve())
                                                                        for p in (good, runs["good_fedlap"])}
    monkeypatch.chdir(Path(good).parent)
    found, skipped = results.load_runs("good_fednnnn")
    assert [r.path.name for r in found] == ["good_fednnnn"] and skipped == []
    assert [r.path.name for r in results.load_runs(Path("good_fednnnn"))[0]] == ["good_fednnnn"]


@pytest.mark.parametrize("call,what", [
    (lambda k: results.load(), "no folders given"),
    (lambda k: results.load(5), "paths=5: not a path"),
    (lambda k: results.load([k["good_fednnnn"], 7]), "paths=7: not a path"),
    (lambda k: results.summaries(k["empty"]), "no run directories (config.yaml and rounds.csv) under"),
    (lambda k: results.load(k["file"]), "a file, not a folder"),
    (lambda k: results.Run.load(k["missing"]), "no such file or directory"),
    (lambda k: results.load_runs(k["missing"]), "no such file or directory"),
    (lambda k: results.load(k["seed_string"]), "seed='abc': not an integer"),
    (lambda k: results.Run.load(k["hp_number"]), "hyperparams=5: not a mapping of settings"),
    (lambda k: results.load(k["csv_no_round"]), "rounds.csv: no column round"),
    (lambda k: results.load(k["csv_text"]), "where a number belongs"),
    (lambda k: results.read_rounds(k["stopped_0"]), "stopped before its first round"),
    (lambda k: results.read_rounds(k["csv_empty"]), "stopped before its first round"),
    (lambda k: results.require_rows(results.load(k["stopped_0"])), "stopped before its first round"),
], ids=["no path", "a number", "a number in the list", "summaries of an empty folder", "a file", "Run.load missing",
        "load_runs missing", "seed a string", "hyperparams a number", "no round column", "text in numbers",
        "no rows", "empty rounds.csv", "require_rows"])
def test_the_library_refuses_in_one_line(runs, call, what):
    with pytest.raises((RunDirectoryError, ConfigError)) as error:
        call(runs)
    assert what in str(error.value) and "\n" not in str(error.value)


def test_a_run_stopped_after_round_1_is_drawn_as_far_as_it_got(runs, tmp_path, capsys):
    """One row and no summary.json: what there is is drawn (one point a panel) and said; a run
    with no row beside it is named in the caption and the log, not left out unsaid."""
    from fedrun import plot

    assert plot.main([runs["stopped_1"], runs["stopped_0"], "--out", str(tmp_path / "figs"), "--formats", "png"]) == 0
    printed = capsys.readouterr().out
    assert "FedAvg: 1 run, rounds 1-1, 4 of 4 panels" in printed
    assert f"warning: {runs['stopped_0']}: stopped before its first round (no rows in rounds.csv); not drawn" \
        in printed
    drawn = pd.read_csv(tmp_path / "figs" / "runs.csv")
    assert set(drawn["round"]) == {1} and len(drawn) == 4


def test_a_diverged_run_is_named_below_the_paper_figures(tmp_path, capsys, monkeypatch):
    """plot_fednnnn.py draws the finished runs; FedAvg's seed 1, which diverged at round 3, is not
    left out unsaid: every figure of its cell says so below the panels, and stderr names it."""
    from scripts.fednnnn import plot as plot_fednnnn
    from matplotlib.figure import Figure

    make_run(tmp_path / "runs" / "ok")
    stopped = make_run(tmp_path / "runs" / "div", rounds="\n".join([HEADER, *ROWS[:2]]) + "\n", summary=False,
                       sessions=DIVERGED_AT_3, seed=1)
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: figures.append(self))
    assert plot_fednnnn.main([str(tmp_path / "runs"), "--out", str(tmp_path / "figs")]) == 0
    # accuracy, norms of all layers, N/E, server step sum (no conv/fc columns), each as PNG and PDF
    assert len(figures) == 8 and figures[0::2] == figures[1::2]
    for fig in figures:
        notes = "\n".join(t.get_text() for t in fig.texts).splitlines()  # below the panels, in red
        assert "Not drawn: FedAvg seed 1: diverged at round 3" in notes
    assert capsys.readouterr().err == (f"plot_fednnnn: skipping {Path(stopped).resolve()}: diverged at round 3: "
                                       "parameter fc1.weight of the sent model is NaN or Inf after aggregation with "
                                       "fedavg\n")
