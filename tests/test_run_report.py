"""What a run tells: a line a round and an end line saying where its results are (console and
fedrun.log), its provenance (run.json, summary.json, fedrun.results), the sweep's closing table,
and fedrun.run() from Python."""
from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import TINY, fedrun_ok, run_fedrun

import fedrun
from fedrun import results
from fedrun.errors import ConfigError
from fedrun.harness.provenance import RUN_FILE


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run without a progress bar (progress=false; the test's stderr is not a terminal either)."""
    top = tmp_path_factory.mktemp("report")
    run = top / "run"
    proc = fedrun_ok([*TINY, "objective=mean_test_acc_last_2", f"hydra.run.dir={run}"], top)
    return run, proc


def test_a_line_a_round_and_an_end_line_that_says_where(finished):
    run, proc = finished
    console = proc.stderr
    assert re.search(r"round 1/2: test accuracy \d+\.\d\d%, test loss \d\.\d{4}, N/E \d\.\d{3}, \d+\.\d\d s", console)
    assert "round 2/2:" in console
    end = [line for line in console.splitlines() if "done: " in line]
    assert len(end) == 1 and end[0].endswith(f"results in {run.resolve()}")
    summary = json.loads((run / "summary.json").read_text())
    assert f"final test accuracy {100 * summary['final_test_acc']:.2f}%" in end[0]
    assert f"mean_test_acc_last_2 = {summary['objective_value']:.4f}" in end[0]
    log = (run / "fedrun.log").read_text()
    for text in ("run directory", "round 1/2:", "round 2/2:", "done: "):
        assert text in log, text


def test_provenance_in_run_json_summary_and_results(finished):
    run, _ = finished
    sessions = json.loads((run / RUN_FILE).read_text())
    assert len(sessions) == 1
    session = sessions[0]
    assert session["fedrun"] == fedrun.__version__ and session["first_round"] == 1 and session["last_round"] == 2
    assert {"git_commit", "git_dirty", "python", "torch", "cuda", "device", "host", "started", "finished"} <= set(session)
    assert session["started"] <= session["finished"]
    # a CPU run: the model name, PyTorch's threads and the instruction set its kernels use
    assert session["device"].endswith(f" threads, {torch.backends.cpu.get_cpu_capability()})"), session["device"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["provenance"]["torch"] == session["torch"] and summary["processes"] == 1
    assert summary["started"] == session["started"] and summary["finished"] == session["finished"]
    assert summary["objective"] == "mean_test_acc_last_2"
    rounds = results.load(run)
    assert summary["objective_value"] == pytest.approx(rounds.test_acc.mean())  # the mean of the last 2 rounds
    assert summary["round_seconds"] == pytest.approx(rounds.wall_s.sum(), abs=2e-3)
    table = results.summaries(run)
    assert table.loc[0, "provenance.torch"] == session["torch"] and table.loc[0, "started"] == session["started"]
    assert table.loc[0, "objective"] == "mean_test_acc_last_2"


def test_a_resumed_run_adds_a_session(tmp_path):
    run = tmp_path / "run"
    fedrun_ok([*TINY, f"hydra.run.dir={run}"], tmp_path)
    fedrun_ok([*TINY, "hyperparams.rounds=3", f"hydra.run.dir={tmp_path / 'three'}"], tmp_path)
    # An interrupted run resumed: the checkpoint of round 2 of a 3-round run, then resume=true.
    three = tmp_path / "three"
    assert len(json.loads((three / RUN_FILE).read_text())) == 1
    (three / "summary.json").unlink()
    proc = run_fedrun([*TINY, "hyperparams.rounds=3", f"hydra.run.dir={three}", "resume=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sessions = json.loads((three / RUN_FILE).read_text())
    assert len(sessions) == 2 and sessions[1]["first_round"] == 4 and sessions[1]["last_round"] == 3


def test_a_sweep_ends_with_its_table(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_fedrun(["-m", *TINY, "aggregator=fedavg,fednnnn", "hyperparams.lr=0.1,1e30",
                       f"hydra.sweep.dir={sweep}"], tmp_path, timeout=300)
    assert proc.returncode == 3
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("job "))
    assert lines[head].split() == ["job", "aggregator", "hyperparams.lr", "best_test_acc", "status"]
    rows = [line.split() for line in lines[head + 1: head + 5]]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    # a job that diverged says so, with the round (its run.json), not only that it failed
    assert [" ".join(r[4:]) if len(r) > 5 else r[-1] for r in rows] == ["done", "diverged at round 1", "done",
                                                                          "diverged at round 1"]
    assert rows[0][3] == f"{json.loads((sweep / '0' / 'summary.json').read_text())['best_test_acc']:.4f}"
    assert lines[head + 5] == f"2 of 4 jobs done, 2 failed (2 diverged); results in {sweep.resolve()}"
    df = results.load(sweep)
    assert sorted(df.job.unique()) == [0, 2] and df.attrs["swept"] == ["aggregator", "hyperparams.lr"]
    assert len(results.load_partition(sweep)) == 4 * 4  # every run (the failed ones too) x four clients
    assert set(results.load_client_layers(sweep).run_dir) == set(df.run_dir)


def test_fedrun_run_from_python(tmp_path):
    with pytest.raises(ConfigError, match="overrides='a=b': must be a list of key=value strings"):
        fedrun.run("a=b")
    odd = tmp_path / "a,b=c[d] é's"  # Hydra's separators, brackets, an accent and a quote
    summary = fedrun.run(TINY, run_dir=odd)
    assert summary["run_dir"] == str(odd.resolve()) and (odd / "rounds.csv").is_file()
    assert summary["rounds"] == 2


def test_shell_completion_of_the_presets_in_folders(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import _cli_env

    def complete(line: str) -> list[str]:
        env = {**_cli_env(), "COMP_LINE": line, "COMP_POINT": str(len(line))}
        proc = subprocess.run([sys.executable, "-m", "fedrun", "-sc", "query=bash"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    presets = complete("fedrun experiment=")
    assert "experiment=fednnnn/mnist_iid_b" in presets and "experiment=pd/noniid2" in presets
    assert complete("fedrun aggregator=fedavg experiment=fednnnn/mnist_n") == [
        "experiment=fednnnn/mnist_noniid_b", "experiment=fednnnn/mnist_noniid_ub"]
    assert complete("fedrun experiment/") == presets  # the form fedrun takes, not experiment/fednnnn=
    assert "aggregator=krum" in complete("fedrun aggregator=")  # other groups: Hydra's own completion
    assert os.environ.get("COMP_LINE") is None


def test_a_line_logged_under_a_progress_bar_lands_above_it():
    """The console handler prints through tqdm.write: the bar is cleared (``\\r``), the line printed
    whole, and the bar drawn again after it, so a ``done:`` line never shares the bar's line."""
    import io
    import logging

    from tqdm import tqdm

    from fedrun.logs import TqdmStreamHandler

    out = io.StringIO()
    handler = TqdmStreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    bar = tqdm(total=3, file=out, desc="rounds", ascii=True)
    bar.update(1)
    handler.emit(logging.LogRecord("fedrun", logging.INFO, __file__, 1, "done: 3 rounds", None, None))
    bar.update(1)
    bar.close()
    text = out.getvalue()
    at = text.index("done: 3 rounds")
    assert text[at - 1] == "\r" and text[at + len("done: 3 rounds")] == "\n"  # its own line
    assert "rounds:" in text[:at] and "rounds:" in text[at:]  # the bar before, and drawn again after
