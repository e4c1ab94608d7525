"""A finished run's per-client CSVs gzipped (fedrun.results.compress_csvs; ``python scripts/common/grid.py
compress``), as the committed reproductions keep them: the readers give the same frames as from
the plain files, the bytes are the same each time, a run not finished is refused untouched, a
damaged gzip is one line naming it, and ``resume=true`` on the complete run has nothing to do.
One tiny run from the CLI; CPU, offline."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY, fedrun_ok, run_fedrun

from fedrun import results
from fedrun.errors import RunDirectoryError
from scripts.common import grid


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tiny finished run (3 rounds), its CSVs plain."""
    top = tmp_path_factory.mktemp("compress")
    run = top / "run"
    fedrun_ok([*TINY, "hyperparams.rounds=3", f"hydra.run.dir={run}"], top)
    return run


def test_gzipped_per_client_csvs_read_as_the_plain_ones(finished, tmp_path, capsys):
    grid_dir = tmp_path / "grid"
    run = grid_dir / "c" / "fedavg_seed0"
    shutil.copytree(finished, run)
    plain = {name: (run / name).read_bytes() for name in results.COMPRESSIBLE}
    frames = {"clients": results.load_clients(run), "client_layers": results.load_client_layers(run)}
    one = results.Run.load(run).csv("clients.csv")
    assert len(frames["clients"]) == 3 * 2 and not frames["client_layers"].empty  # 2 clients a round, 3 rounds

    assert grid.main(["compress", str(grid_dir)]) == 0
    assert "per-client CSVs of 1 finished run(s) gzipped" in capsys.readouterr().out
    for name, data in plain.items():
        assert not (run / name).exists()
        assert gzip.decompress((run / f"{name}.gz").read_bytes()) == data
    pd.testing.assert_frame_equal(results.load_clients(run), frames["clients"])
    pd.testing.assert_frame_equal(results.load_client_layers(run), frames["client_layers"])
    pd.testing.assert_frame_equal(results.Run.load(run).csv("clients.csv"), one)
    assert results.csv_path(run, "clients.csv") == run / "clients.csv.gz"

    again = tmp_path / "again"  # the same CSVs, gzipped elsewhere later: the same bytes (git sees no change)
    shutil.copytree(finished, again)
    results.compress_csvs(again)
    for name in results.COMPRESSIBLE:
        assert (again / f"{name}.gz").read_bytes() == (run / f"{name}.gz").read_bytes()
    assert grid.main(["compress", str(grid_dir)]) == 0  # nothing left to gzip
    assert "no finished run with a per-client CSV to gzip" in capsys.readouterr().out


def test_a_run_not_finished_is_refused_and_left_as_it_was(finished, tmp_path):
    run = tmp_path / "stopped"
    shutil.copytree(finished, run)
    (run / "summary.json").unlink()  # stopped part way: a resume cuts its CSVs back by byte offsets
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(RunDirectoryError, match="not finished .no summary.json.; its CSVs stay as they are"):
        results.compress_csvs(run)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert grid.compress(tmp_path) == (0, 0, 0)


def test_a_damaged_gzip_is_one_line_naming_it(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    results.compress_csvs(run)
    path = run / "clients.csv.gz"
    path.write_bytes(path.read_bytes()[:40])  # cut off
    with pytest.raises(RunDirectoryError) as error:
        results.load_clients(run)
    assert str(error.value).startswith(f"{path}: not a CSV file") and "\n" not in str(error.value)
    assert results.read_csv(run, "clients.csv") is None


def test_resume_of_the_complete_compressed_run_has_nothing_to_do(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    results.compress_csvs(run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.name != "fedrun.log"}
    proc = run_fedrun([*TINY, "hyperparams.rounds=3", f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is complete (3 of 3 rounds); nothing to do" in proc.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != "fedrun.log"} == before

    (run / "summary.json").unlink()  # as if stopped before its summary: a resume would write, so it refuses
    proc = run_fedrun([*TINY, "hyperparams.rounds=3", f"hydra.run.dir={run}", "resume=true"], tmp_path)
    assert proc.returncode != 0
    assert f"{run / 'clients.csv'}: gzipped (clients.csv.gz); gunzip it to resume the run" in proc.stderr
