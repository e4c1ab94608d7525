"""Tables a paper can ``\\input``: what the paper scripts' ``collect --format latex`` and
``fedrun-sweep-table --format latex`` print is a booktabs ``tabular`` with every other line (the
title, the notes, the counts) a ``%`` comment, and it compiles with ``pdflatex`` inside a minimal
document (where pdflatex and booktabs are installed: Debian's texlive-latex-base and
texlive-latex-recommended; skipped elsewhere).  Also the
escaping of a cell's special characters and ``fedrun-sweep-table --group-seeds`` (mean ± sd, n)
on runs made by hand."""
from __future__ import annotations

import shutil
import subprocess

from scripts.fednnnn import table2 as fednnnn_table2
from scripts.fedlayerwise import table1 as fedlayerwise_table1
from scripts.niidbench import table3 as niidbench_table3
from scripts.pd import tables as pd_tables
import pytest
from test_scripts_fedlayerwise_fedlap import fedlap_grid  # noqa: F401  (fixtures)
from test_scripts_fedlayerwise_fedlap import grid as fedlayerwise_runs  # noqa: F401
from test_scripts_fednnnn import grid as fednnnn_runs  # noqa: F401
from test_scripts_niidbench import runs as niidbench_runs  # noqa: F401
from test_scripts_pd import runs_dir as pd_runs  # noqa: F401
from test_sweep_table import job

from fedrun import tables
from fedrun.command import sweeps
from fedrun.harness.provenance import SWEEP_ID

DOCUMENT = "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n\\input{t.tex}\n\\end{document}\n"
SCRIPTS = {"fednnnn": (fednnnn_table2, "fednnnn_runs"), "niidbench": (niidbench_table3, "niidbench_runs"),
           "pd": (pd_tables, "pd_runs"), "fedlayerwise": (fedlayerwise_table1, "fedlayerwise_runs")}


def only_tabulars(text: str) -> None:
    """Every line of ``text`` is inside a ``tabular``, a ``%`` comment or blank; at least one tabular."""
    inside, tabulars = False, 0
    for line in text.splitlines():
        if line.startswith(r"\begin{tabular}"):
            inside, tabulars = True, tabulars + 1
        assert inside or line.startswith("%") or not line.strip(), f"not a comment outside the tabular: {line!r}"
        if line.startswith(r"\end{tabular}"):
            inside = False
    assert tabulars and not inside


def compiles(text: str, folder) -> None:
    """``text`` as t.tex, \\input by a minimal document, compiles with pdflatex (no error, no missing character)."""
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (Debian: apt-get install texlive-latex-base)")
    found = subprocess.run(["kpsewhich", "booktabs.sty"], capture_output=True, text=True)
    if not found.stdout.strip():
        pytest.skip("booktabs.sty is not installed (Debian: apt-get install texlive-latex-recommended)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "t.tex").write_text(text)
    (folder / "main.tex").write_text(DOCUMENT)
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "main.tex"], cwd=folder,
                          capture_output=True, text=True, timeout=120)
    log = (folder / "main.log").read_text(errors="replace")
    assert done.returncode == 0, log[-3000:]
    assert "Missing character" not in log, log[-3000:]
    assert (folder / "main.pdf").stat().st_size > 0


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_paper_scripts_latex_table_is_the_tabular_alone_and_compiles(name, request, tmp_path, capsys):
    script, fixture = SCRIPTS[name]
    runs = request.getfixturevalue(fixture)
    assert script.main(["collect", str(runs), "--format", "latex", "--csv", str(tmp_path / "t.csv")]) == 0
    text = capsys.readouterr().out
    only_tabulars(text)
    assert "% wrote " in text  # the lines under the table are kept, as comments
    compiles(text, tmp_path / "tex")


def test_readings_and_the_fedlap_summary_as_latex_compile(fedlap_grid, tmp_path, capsys):
    from scripts.fedlap import plot as plot_fedlap
    from scripts.common import readings
    from test_scripts_readings import _grid

    assert readings.main([str(_grid(tmp_path)), "--at", "1,2", "--format", "latex"]) == 0
    assert plot_fedlap.main([str(fedlap_grid), "--summary", "--round", "2", "--format", "latex"]) == 0
    text = capsys.readouterr().out
    only_tabulars(text)
    compiles(text, tmp_path / "tex")


def test_a_cells_special_characters_are_escaped():
    assert tables.latex_escape("50%_a&b#1$2") == r"50\%\_a\&b\#1\$2"
    line = tables.render(["run", "note"], [["x", "%_&#$ ±"]], "latex").splitlines()[4]
    assert line == r"x & \%\_\&\#\$ $\pm$ \\"


def test_the_comments_filter_keeps_the_tabular_and_comments_the_rest():
    import io

    from scripts.common import tables as script_tables

    out = io.StringIO()
    stream = script_tables.LatexComments(out)
    stream.write("Title: 50% of_runs\n\\begin{tabular}{l}\na \\\\\n\\end{tabular}\n\nwrote x")
    stream.flush()
    assert out.getvalue() == "% Title: 50% of_runs\n\\begin{tabular}{l}\na \\\\\n\\end{tabular}\n%\n% wrote x\n"


@pytest.fixture
def seeds(tmp_path, monkeypatch):
    """Two settings of a sweep over three seeds: fedavg (0.80, 0.82, 0.84: mean 0.82, sd 0.02) and
    fed_x (0.5 and 0.7: mean 0.6, sd 0.1414; its seed 2 diverged, left out)."""
    monkeypatch.delenv(SWEEP_ID, raising=False)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "my_sweep"
    n = 0
    for aggregator, values in (("fedavg", [0.80, 0.82, 0.84]), ("fed_x", [0.5, 0.7, None])):
        for seed, value in enumerate(values):
            job(folder / str(n), [f"aggregator={aggregator}", "hyperparams.lr=0.1", f"seed={seed}"],
                None if value is None else {"objective": "best_test_acc", "objective_value": value},
                stopped_after=None if value is not None else 2)
            n += 1
    return folder


def test_group_seeds_prints_mean_sd_and_n_per_setting(seeds, capsys):
    assert sweeps.main(["my_sweep", "--group-seeds"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "aggregator | best_test_acc (mean ± sd) | n",
        "-----------+---------------------------+--",
        "fedavg     |           0.8200 ± 0.0200 | 3",
        "fed_x      |           0.6000 ± 0.1414 | 2",
        "2 setting(s), 6 run(s), mean ± sd over the seeds of each (sample sd); n: the finished runs averaged; "
        f"1 run(s) not finished or failed, left out; results in {seeds.resolve()}",
    ]


def test_group_seeds_as_latex_compiles(seeds, tmp_path, capsys):
    assert sweeps.main(["my_sweep", "--group-seeds", "--out", "grouped.tex"]) == 0
    text = (tmp_path / "grouped.tex").read_text()
    assert r"fedavg & 0.8200 $\pm$ 0.0200 & 3 \\" in text.splitlines()
    only_tabulars(text)
    compiles(text, tmp_path / "tex")


def test_group_seeds_with_one_run_and_a_seed_sweep_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(SWEEP_ID, raising=False)
    monkeypatch.chdir(tmp_path)
    for seed, value in enumerate([0.25, 0.75]):
        job(tmp_path / "only_seeds" / str(seed), [f"seed={seed}"], {"objective": "acc", "objective_value": value})
    assert sweeps.grouped_table(tmp_path / "only_seeds", "markdown")[:3] == [
        "| runs | acc (mean ± sd) | n |", "| --- | ---: | ---: |", "| only_seeds | 0.5000 ± 0.3536 | 2 |"]
    assert sweeps.mean_sd([0.5]) == "0.5000" and sweeps.mean_sd([]) == "-"


def test_the_sweep_tables_latex_file_compiles(seeds, tmp_path):
    written = sweeps.write_sweep_tables(seeds, every=True)
    tex = next(p for p in written if p.suffix == ".tex").read_text()
    only_tabulars(tex)
    compiles(tex, tmp_path / "tex")
