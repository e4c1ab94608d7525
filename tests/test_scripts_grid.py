"""scripts/common/grid.py's launching of a grid: runs side by side (``--jobs``), a time limit that stops
them resumably (``--stop-after``), and unfinished runs packed into ``OUT/resume.tar.gz`` and
taken back from it (what a committed grid folder needs to go on in another checkout: git keeps
no checkpoint).  A stand-in for fedrun writes the files the launcher reads, so the scheduling is
checked in seconds; fedrun's own stop-and-resume is tested in test_resume*.py."""
from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from scripts.common import grid
from scripts.niidbench import table3 as niidbench_table3

ROOT = Path(__file__).resolve().parents[1]

# A fedrun stand-in: the run folder as fedrun starts it (config.yaml, a checkpoint, output_layer.csv),
# then `slow` waits for SIGTERM (fedrun's exit after its last complete round) and `quick` finishes
# (summary.json).  With resume=true it records which checkpoint it found.
FAKE = r'''
import json, signal, sys, time
from pathlib import Path
run, method, seed, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
run.mkdir(parents=True, exist_ok=True)
(run / "config.yaml").write_text(f"aggregator:\n  _target_: fedrun.aggregators.{method}\nseed: {seed}\n")
if "resume=true" in sys.argv and (run / "checkpoint.pt").exists():  # resume=true and none: round 1
    (run / "resumed_from.txt").write_text((run / "checkpoint.pt").read_text())
(run / "checkpoint.pt").write_text(f"round 1 of {method} seed {seed}")
(run / "output_layer.csv").write_text("round,layer\n1,conv1\n")
if mode == "slow":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    time.sleep(120)
(run / "summary.json").write_text(json.dumps({"aggregator": method}))
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_fedrun.py"
    script.write_text(FAKE)
    monkeypatch.setattr(grid, "POLL_SECONDS", 0.1)

    def command(out: Path, mode: str):
        def cmd(column, methods, seeds):
            (m,), (s,) = methods, seeds  # --jobs > 1: one run a sweep
            return [sys.executable, str(script), str(out / column / f"{m}_seed{s}"), m, s, mode]
        return cmd
    return command


def test_jobs_run_side_by_side_a_time_limit_stops_them_and_resume_goes_on_from_the_archive(tmp_path, fake, capsys):
    """Two runs at once, seed 0 of each method first; after the time limit both are stopped (each
    had started: one process after the other would have started one) and seed 1 never starts.
    Their checkpoints go into OUT/resume.tar.gz; in a checkout without them (a fresh clone: git
    keeps none) --resume takes them back from it, the runs finish, and the archive is removed."""
    out = tmp_path / "grid"
    plan = grid.by_column(["mnist_c2"], fake(out, "slow"), ["fedavg", "fedprox"], ["0", "1"])
    failures = grid.launch(plan, out, dry_run=False, jobs=2, stop_after=0.05)
    text = capsys.readouterr().out
    assert failures == [("mnist_c2", [("fedavg", "0"), ("fedavg", "1"), ("fedprox", "0"), ("fedprox", "1")])]
    started = [line for line in text.splitlines() if line.startswith("[1/1]")]
    assert [line.split()[-3:-1] for line in started] == [["fedavg", "0"], ["fedprox", "0"]]  # seed 0 of both
    assert "time limit: 3 s passed; 2 sweep(s) stopped after their last complete round, 2 not started" in text
    assert text.count("    exit 143, 0 run(s) finished") == 2
    assert (out / "logs" / "mnist_c2_fedprox_seed0.log").is_file()
    with tarfile.open(out / grid.RESUME_ARCHIVE) as tar:
        assert sorted(tar.getnames()) == [f"mnist_c2/{m}_seed0/{f}" for m in ("fedavg", "fedprox")
                                          for f in ("checkpoint.pt", "output_layer.csv")]
    assert "resume: 2 unfinished run(s) packed into" in text

    for m in ("fedavg", "fedprox"):  # what a fresh clone of the committed folder lacks
        for f in ("checkpoint.pt", "output_layer.csv"):
            (out / "mnist_c2" / f"{m}_seed0" / f).unlink()
    plan = grid.by_column(["mnist_c2"], fake(out, "quick"), ["fedavg", "fedprox"], ["0", "1"])
    failures = grid.launch(plan, out, dry_run=False, resume=True, jobs=2)
    text = capsys.readouterr().out
    assert failures == []
    assert "resume: 2 run(s) take their checkpoint from" in text and " (2 to resume)" in text
    assert (out / "mnist_c2" / "fedprox_seed0" / "resumed_from.txt").read_text() == "round 1 of fedprox seed 0"
    assert (out / "mnist_c2" / "fedavg_seed1" / "resumed_from.txt").exists() is False  # a new run: nothing to resume
    assert not (out / grid.RESUME_ARCHIVE).exists()  # every run finished: nothing left to resume
    assert "[4/4] mnist_c2/" in text and "all done" in text
    assert text.count("    exit 0, 1 run(s) finished") == 4  # each sweep its own run, not its neighbour's
    # the folder's sweep table lists its four runs, not the last one-run sweep alone
    assert "4 of 4 jobs done" in (out / "mnist_c2" / "sweep_table.md").read_text()


def test_no_run_starts_in_the_last_minutes_before_the_time_limit(tmp_path, capsys):
    """A run started two minutes before the limit would be stopped before its first round: once the
    first sweep ends 100 s before a 60-minute limit, the other two are not started and the grid
    stops then (nothing runs) rather than waiting for the limit.  The clock is a stand-in."""
    now = [0.0]
    ended = []

    def finish(rc, seconds):
        ended.append(rc)
        now[0] = 3600 - 100

    sweeps = [grid.Sweep(f"start {i}", [sys.executable, "-c", ""], tmp_path / f"{i}.log", lambda: None, finish)
              for i in range(3)]
    assert grid.run_at_once(sweeps, jobs=1, stop_after=60, every=0.05, clock=lambda: now[0]) is True
    text = capsys.readouterr().out
    assert ended == [0] and "start 0" in text and "start 1" not in text
    assert ("time limit: 60 min with 100 s left, too little to start a run; 0 sweep(s) stopped after their "
            "last complete round, 2 not started") in text
    now[0], ended[:] = 0.0, []  # 130 s before the limit: still time to start the next one
    sweeps = [s._replace(finish=lambda rc, seconds: (ended.append(rc), now.__setitem__(0, 3600 - 130))) for s in sweeps]
    assert grid.run_at_once(sweeps, jobs=1, stop_after=60, every=0.05, clock=lambda: now[0]) is False
    assert ended == [0, 0, 0]


def _run(folder: Path, method: str, seed: int, files: dict[str, str], finished: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"aggregator:\n  _target_: fedrun.aggregators.{method}\nseed: {seed}\n")
    for name, text in files.items():
        (folder / name).write_text(text)
    if finished:
        (folder / "summary.json").write_text("{}")
    return folder


def test_pack_keeps_what_a_resume_needs_and_unpack_never_overwrites_a_newer_checkpoint(tmp_path, capsys, monkeypatch):
    """pack: the unfinished runs' checkpoint and output_layer.csv (not fedrun.log, which names the
    machine's folders), nothing of a finished or diverged run; a run with no checkpoint here keeps the archive's.  The same files give the
    same bytes.  unpack: only into runs without a checkpoint."""
    out = tmp_path / "g"
    a = _run(out / "c2" / "fedavg_seed0", "fedavg", 0, {"checkpoint.pt": "A3", "output_layer.csv": "a", "fedrun.log": "la"})
    b = _run(out / "c2" / "scaffold_seed0", "scaffold", 0, {"checkpoint.pt": "B5", "output_layer.csv": "b"})
    _run(out / "c2" / "fedprox_seed0", "fedprox", 0, {"checkpoint.pt": "done"}, finished=True)
    d = _run(out / "c2" / "fednova_seed0", "fednova", 0, {"checkpoint.pt": "D"})
    (d / "run.json").write_text('[{"started": "2026-11-28T01:00:00", "stopped": "2026-11-28T01:10:00", '
                                '"reason": "diverged", "round": 4, "error": "NaN"}]')
    assert grid.main(["pack", str(out)]) == 0
    assert f"{out}: 2 unfinished run(s) packed into" in capsys.readouterr().out
    first = (out / grid.RESUME_ARCHIVE).read_bytes()
    with tarfile.open(out / grid.RESUME_ARCHIVE) as tar:
        assert sorted(tar.getnames()) == ["c2/fedavg_seed0/checkpoint.pt", "c2/fedavg_seed0/output_layer.csv", "c2/scaffold_seed0/checkpoint.pt",
                                          "c2/scaffold_seed0/output_layer.csv"]
    assert grid.pack_resume(out) == 2 and (out / grid.RESUME_ARCHIVE).read_bytes() == first  # nothing new, no change
    monkeypatch.chdir(tmp_path)  # a folder given relative, as the table scripts pass --out on
    assert grid.pack_resume(Path("g")) == 2 and (out / grid.RESUME_ARCHIVE).read_bytes() == first

    (a / "checkpoint.pt").unlink()  # a fresh clone: fedavg has no checkpoint, scaffold went on (a newer one)
    (a / "output_layer.csv").write_text("stale")
    (b / "checkpoint.pt").write_text("B7")
    assert grid.pack_resume(out) == 2  # fedavg keeps the archive's files, scaffold's are the newer ones
    assert grid.unpack_resume(Path("g")) == 1
    assert (a / "checkpoint.pt").read_text() == "A3" and (a / "output_layer.csv").read_text() == "a"
    assert (b / "checkpoint.pt").read_text() == "B7"
    assert grid.main(["unpack", str(out)]) == 0  # everything has its checkpoint: nothing to do
    assert f"{out}: 0 run(s) given their checkpoint back" in capsys.readouterr().out


def test_an_archive_member_that_is_not_a_run_file_is_refused_and_nothing_is_written(tmp_path):
    out = tmp_path / "g"
    run = _run(out / "c2" / "fedavg_seed0", "fedavg", 0, {})
    with tarfile.open(out / grid.RESUME_ARCHIVE, "w:gz") as tar:
        for name in ("c2/fedavg_seed0/checkpoint.pt", "../escape/checkpoint.pt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SystemExit, match=r"member '\.\./escape/checkpoint\.pt' is not one of a run's"):
        grid.unpack_resume(out)
    assert not (run / "checkpoint.pt").exists() and not (tmp_path / "escape").exists()


def test_table_scripts_take_jobs_and_a_time_limit(tmp_path, capsys):
    """--jobs 2: one run a sweep, seed 0 of every method before seed 1; --population keeps a
    product a sweep; bad values are one-line errors naming the option."""
    args = ["run", "--out", str(tmp_path / "o"), "--datasets", "mnist", "--partitions", "c2",
            "--methods", "fedavg", "scaffold", "--seeds", "0,1", "--dry-run", "--jobs", "2"]
    assert niidbench_table3.main(args) == 0
    calls = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [(c.split(" aggregator=")[1].split()[0], c.split(" seed=")[1].split()[0]) for c in calls] == [
        ("fedavg", "0"), ("scaffold", "0"), ("fedavg", "1"), ("scaffold", "1")]
    assert niidbench_table3.main(args + ["--population"]) == 0
    calls = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(calls) == 1 and " aggregator=fedavg,scaffold seed=0,1 " in calls[0]
    for option, value in (("--jobs", "0"), ("--stop-after", "-1"), ("--stop-after", "nan")):
        assert niidbench_table3.main(["run", "--out", str(tmp_path / "o"), option, value]) == 2
        assert f"argument {option}: '{value}'" in capsys.readouterr().err
