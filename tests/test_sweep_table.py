"""The sweep's closing table as text, Markdown and LaTeX (fedrun.command.sweeps.sweep_table), the
files a sweep writes beside its jobs, ``fedrun-sweep-table`` and the renderers it shares with the
paper scripts (fedrun.tables).

The sweep is made by hand, two job folders small enough to check every line by eye: job 0 is
done (fedavg, lr 0.1, objective 0.8125), job 1 diverged in round 3 (fed_x, lr 0.5) and its
failure note is in the sweep folder, as a sweep's own job leaves it."""
from __future__ import annotations

import json

import pytest
import yaml
from conftest import REPO_ROOT

from fedrun import tables
from fedrun.command import sweeps
from fedrun.errors import ConfigError
from fedrun.harness.provenance import SWEEP_ID


def job(folder, overrides, summary=None, stopped_after=None):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "overrides": overrides}))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    if stopped_after is not None:  # what the recorder writes for a run that diverged after that round
        (folder / "run.json").write_text(json.dumps([{"sweep": "s", "last_round": stopped_after,
                                                      "reason": "diverged", "error": "NaN"}]))


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """The sweep folder, with the working folder its parent so its name is ``sweep`` as given."""
    monkeypatch.delenv(SWEEP_ID, raising=False)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "sweep"
    job(folder / "0", ["aggregator=fedavg", "hyperparams.lr=0.1", "seed=0"],
        {"objective": "best_test_acc", "objective_value": 0.8125})
    job(folder / "1", ["aggregator=fed_x", "hyperparams.lr=0.5", "seed=0"], stopped_after=2)
    sweeps.record_failure(folder, 1, folder / "1", "round 3: NaN or Inf", 3)
    return folder


def test_the_closing_table_as_text(sweep):
    assert sweeps.sweep_table(sweep) == [
        "job  aggregator  hyperparams.lr  best_test_acc  status",
        "0    fedavg      0.1             0.8125         done",
        "1    fed_x       0.5             -              diverged at round 3",
        f"1 of 2 jobs done, 1 failed (1 diverged); results in {sweep.resolve()}",
    ]


def test_the_closing_table_as_markdown(sweep):
    assert sweeps.sweep_table("sweep", fmt="markdown") == [
        "| job | aggregator | hyperparams.lr | best_test_acc | status |",
        "| --- | --- | --- | ---: | --- |",
        "| 0 | fedavg | 0.1 | 0.8125 | done |",
        "| 1 | fed_x | 0.5 | - | diverged at round 3 |",
        "",
        "1 of 2 jobs done, 1 failed (1 diverged); results in sweep",
    ]


def test_the_closing_table_as_latex(sweep):
    assert sweeps.sweep_table("sweep", fmt="latex") == [
        r"\begin{tabular}{lllrl}",
        r"\toprule",
        r"job & aggregator & hyperparams.lr & best\_test\_acc & status \\",
        r"\midrule",
        r"0 & fedavg & 0.1 & 0.8125 & done \\",
        r"1 & fed\_x & 0.5 & - & diverged at round 3 \\",
        r"\bottomrule",
        r"\end{tabular}",
        "% 1 of 2 jobs done, 1 failed (1 diverged); results in sweep",
    ]


def test_a_limit_counts_the_rows_left_out(sweep):
    assert sweeps.sweep_table("sweep", limit=1, fmt="latex")[-3:] == [
        r"\end{tabular}", "% ... and 1 more jobs", "% 1 of 2 jobs done, 1 failed (1 diverged); results in sweep"]
    with pytest.raises(ConfigError, match=r"^format=html: choose one of: text, markdown, latex$"):
        sweeps.sweep_table(sweep, fmt="html")


def test_a_job_refused_before_its_folder_is_a_row_not_a_column_of_every_setting(sweep):
    """Job 2 was refused before anything was written (its empty folder removed, its note left): it
    is listed as failed, and its unknown settings do not make every setting of the sweep look swept."""
    sweeps.record_failure(sweep, 2, sweep / "2", "hydra.run.dir=...: already holds a run", 2)
    assert sweeps.sweep_table("sweep", fmt="markdown")[:5] == [
        "| job | aggregator | hyperparams.lr | best_test_acc | status |",
        "| --- | --- | --- | ---: | --- |",
        "| 0 | fedavg | 0.1 | 0.8125 | done |",
        "| 1 | fed_x | 0.5 | - | diverged at round 3 |",
        "| 2 | - | - | - | failed |",
    ]


def test_a_sweep_writes_its_table_beside_its_jobs(sweep):
    written = sweeps.write_sweep_tables(sweep)
    assert [p.name for p in written] == ["sweep_table.md", "sweep_table.tex"]
    assert (sweep / "sweep_table.md").read_text().splitlines()[2] == "| 0 | fedavg | 0.1 | 0.8125 | done |"
    assert (sweep / "sweep_table.tex").read_text().splitlines()[5] == r"1 & fed\_x & 0.5 & - & diverged at round 3 \\"
    assert not list(sweep.glob("*.tmp"))


def test_fedrun_sweep_table_reads_a_folder_after_its_sweep(sweep, capsys):
    """The command reads the folder alone (the sweep's failure notes are gone once it ended): a job
    that diverged says so from its run.json, and a folder named by hydra.sweep.subdir is listed too."""
    sweeps.forget_failures(sweep)
    job(sweep / "fedprox_seed1", ["aggregator=fedprox", "hyperparams.lr=0.1", "seed=1"])  # still running
    assert sweeps.main(["sweep", "--format", "markdown"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "| job | aggregator | hyperparams.lr | seed | best_test_acc | status |",
        "| --- | --- | --- | --- | ---: | --- |",
        "| 0 | fedavg | 0.1 | 0 | 0.8125 | done |",
        "| 1 | fed_x | 0.5 | 0 | - | diverged at round 3 |",
        "| fedprox_seed1 | fedprox | 0.1 | 1 | - | not finished |",
        "",
        "1 of 3 jobs done, 1 failed (1 diverged), 1 not finished; results in sweep",
    ]
    # --out's suffix chooses the format when --format does not.
    assert sweeps.main(["sweep", "--out", "paper/table.tex"]) == 0
    assert capsys.readouterr().out == "wrote paper/table.tex\n"
    lines = (sweep.parent / "paper" / "table.tex").read_text().splitlines()
    assert lines[:3] == [r"\begin{tabular}{llllrl}", r"\toprule",
                         r"job & aggregator & hyperparams.lr & seed & best\_test\_acc & status \\"]
    assert lines[6] == r"fedprox\_seed1 & fedprox & 0.1 & 1 & - & not finished \\"


@pytest.mark.parametrize("args,error", [
    (["nowhere"], "fedrun-sweep-table: error: nowhere: no such file or directory"),
    (["empty"], "fedrun-sweep-table: error: no run directories (config.yaml) under empty: give fedrun's run or "
                "sweep folders"),
    (["sweep", "--format", "html"], "fedrun-sweep-table: error: argument --format: invalid choice: 'html' "
                                    "(choose from 'text', 'markdown', 'latex')"),
    (["sweep", "--limit", "0"], "fedrun-sweep-table: error: --limit=0: must be an integer >= 1 (rows shown)"),
    (["sweep", "--out", "sweep"], "fedrun-sweep-table: error: --out=sweep: is a folder, not a file; give a file "
                                  "name, such as sweep/table.csv"),
])
def test_fedrun_sweep_table_refuses_in_one_line(sweep, capsys, args, error):
    (sweep.parent / "empty").mkdir()
    assert sweeps.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == error + "\n"


def test_the_command_is_installed_beside_fedrun():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11's; the entry point is checked where it exists
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fedrun-sweep-table"] == "fedrun.command.sweeps:main"


def test_the_renderers_lay_out_any_columns():
    """fedrun.tables: per-column alignment, Markdown's escaped pipe, LaTeX's escaped specials,
    and a bad alignment refused in one line."""
    head, body = ["run", "acc", "note"], [["a|b", "0.5", "x_y & 50%"]]
    assert tables.render(head, body, "text", align="lrl").splitlines() == [
        "run | acc | note     ", "----+-----+----------", "a|b | 0.5 | x_y & 50%"]
    assert tables.render(head, body, "markdown", align="lrl").splitlines() == [
        "| run | acc | note |", "| --- | ---: | --- |", r"| a\|b | 0.5 | x_y & 50% |"]
    assert tables.render(head, body, "latex", align="lrl").splitlines()[4] == r"a|b & 0.5 & x\_y \& 50\% \\"
    with pytest.raises(ConfigError, match=r"^align=lr: give one letter per column \(3\), each l or r$"):
        tables.render(head, body, "text", align="lr")


@pytest.mark.slow
def test_a_real_sweep_ends_with_its_table_in_three_formats(tmp_path):
    from conftest import TINY, run_fedrun

    sweep = tmp_path / "sweep"
    proc = run_fedrun(["-m", *TINY, "hyperparams.rounds=1", "aggregator=fedavg,fedprox", f"hydra.sweep.dir={sweep}"],
                      tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[-2] == f"2 of 2 jobs done, 0 failed; results in {sweep.resolve()}"
    assert lines[-1] == f"the table as Markdown and LaTeX: {sweep / 'sweep_table.md'}, {sweep / 'sweep_table.tex'}"
    summaries = [json.loads((sweep / n / "summary.json").read_text()) for n in ("0", "1")]
    assert (sweep / "sweep_table.md").read_text().splitlines()[:4] == [
        "| job | aggregator | best_test_acc | status |", "| --- | --- | ---: | --- |",
        f"| 0 | fedavg | {summaries[0]['best_test_acc']:.4f} | done |",
        f"| 1 | fedprox | {summaries[1]['best_test_acc']:.4f} | done |"]
    assert (sweep / "sweep_table.tex").read_text().splitlines()[2] == r"job & aggregator & best\_test\_acc & status \\"


def test_a_sweep_without_a_job_writes_no_table(tmp_path):
    (tmp_path / "empty").mkdir()
    assert sweeps.write_sweep_tables(tmp_path / "empty") == [] and not list((tmp_path / "empty").iterdir())
    assert sweeps.write_sweep_tables(tmp_path / "absent") == [] and not (tmp_path / "absent").exists()


@pytest.mark.slow
def test_a_sweep_resumed_over_complete_runs_lists_them_as_done(tmp_path):
    """A job that finds its run already complete (``resume=true``) leaves the run untouched, so its
    run.json does not name the new sweep; the sweep's table still lists it, from the note its job
    left (SweepCallback.on_job_end), and not as 0 of 0 jobs."""
    from conftest import TINY, run_fedrun, snapshot

    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "hyperparams.rounds=1", "aggregator=fedavg,fedprox", f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=${hydra:runtime.choices.aggregator}"]
    first = run_fedrun(args, tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    before = {name: snapshot(sweep / name) for name in ("fedavg", "fedprox")}
    again = run_fedrun([*args, "resume=true"], tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.splitlines()[-2] == f"2 of 2 jobs done, 0 failed; results in {sweep.resolve()}"
    assert {name: snapshot(sweep / name) for name in ("fedavg", "fedprox")} == before  # runs untouched
    assert not (sweep / sweeps.FAILURES).exists()  # the notes are gone once listed


def test_sampled_values_are_shown_to_six_significant_digits(tmp_path, monkeypatch):
    """An Optuna trial's sampled values (16 digits in its config.yaml) read as a paper prints them;
    values as the user typed them stay as they are."""
    monkeypatch.delenv(SWEEP_ID, raising=False)
    monkeypatch.chdir(tmp_path)
    job(tmp_path / "optuna" / "0", ["aggregator.beta=0.9034962584119619", "hyperparams.lr=0.1"],
        {"objective": "acc", "objective_value": 0.5})
    job(tmp_path / "optuna" / "1", ["aggregator.beta=1.2e-05", "hyperparams.lr=100"],
        {"objective": "acc", "objective_value": 0.25})
    lines = sweeps.sweep_table("optuna", every=True)
    assert lines[1].split()[:3] == ["0", "0.903496", "0.1"] and lines[2].split()[:3] == ["1", "1.2e-05", "100"]
    assert [sweeps.short(v) for v in ("0.806515568076084", "3.14159265e-07", "fedavg", "7", "0.10")] == \
        ["0.806516", "3.14159e-07", "fedavg", "7", "0.10"]
