"""docs/reproductions.md against the committed runs: every figure its prose quotes is a claim of
scripts/<paper>/claims*.py (loaded and printed by scripts/claims.py), computed from outputs/reproductions/, and each claim's text must occur in the
doc word for word.  Also: the one rounding (half up, by hand), that a claim whose data changed no
longer matches the doc, and that no committed file under outputs/, docs/ or scripts/ holds a
machine's absolute path."""
from __future__ import annotations

import csv
import gzip
import io
import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from scripts import claims  # noqa: F401  (every paper's claims, registered in the doc's order)
from scripts.common import claims_core as core, claims_registry as registry, tables
from scripts.fedlap import plot as plot_fedlap
from scripts.niidbench import claims_whole as niidbench_whole, table3 as niidbench_table3

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "reproductions.md"


@pytest.fixture(scope="module")
def data():
    """The committed runs, read once for every claim."""
    return core.Data(REPO_ROOT)


@pytest.fixture(scope="module")
def doc():
    return registry.normalized(DOC.read_text())


@pytest.fixture(scope="module")
def docs():
    """Every doc that states claims, normalized, by its path from the repository root."""
    return {name: registry.normalized((REPO_ROOT / name).read_text()) for name in registry.docs()}


@pytest.mark.parametrize("claim_id", list(registry.CLAIMS))
def test_claim_is_quoted_in_the_doc(claim_id, data, docs):
    c = registry.CLAIMS[claim_id]
    text = c.render(data)
    assert registry.normalized(text) in docs[c.doc], (f"{claim_id} ({c.checks}) renders\n  {text}\nwhich {c.doc} "
                                                    "does not say: correct the doc's sentence to what the data says")


def test_every_claim_says_what_it_checks():
    for c in registry.CLAIMS.values():
        assert len(c.checks) > 20, f"{c.id} has no docstring saying what it checks"
    assert set(registry.sections()) == {"niidbench", "niidbench_readings", "fednova_stragglers", "fedlap_fmnist",
                                      "fedlap_readings", "fedlap_mnist_train10k", "fedlayerwise", "fedlap_tuned", "fednnnn_gpu",
                                      "niidbench_gpu", "niidbench_tuned", "fedlap_mnist",
                                      "fedlap_mnist_tuned", "niidbench_whole", "fednnnn_whole", "cifar10_jpeg",
                                      "femnist_leaf", "personalized", "privacy"}
    assert registry.docs() == ["docs/reproductions.md", "docs/configuration.md"]


def test_doc_phrase_may_span_lines():
    assert registry.in_doc("in #C=2 FedAvg is\nahead", "so: in #C=2   FedAvg\n  is ahead of FedProx")
    assert not registry.in_doc("FedAvg is behind", "FedAvg is\nahead")


def test_rounding_half_up_by_hand():
    assert core.fmt(0.125, 2) == "0.13"  # the binary 0.125 is exact: half up, not to even (0.12)
    assert core.fmt(2.675, 2) == "2.68"  # the binary 2.675 is 2.67499...: the decimal 2.675 is rounded
    assert core.fmt(96.65, 1) == "96.7"
    assert core.fmt(0.35, 1) == "0.4" and core.fmt(4.55, 1) == "4.6" and core.fmt(4.549, 1) == "4.5"
    assert core.fmt(12.5, 0) == "13" and core.fmt(1310.0, 0) == "1310"
    assert core.fmt(-0.04, 1) == "0.0" and core.fmt(-1.25, 1) == "-1.3"
    # Differences on the exact decimals: 96.6 - 92.55 is 4.05 (4.1), where floats give 4.0499999... (4.0).
    assert core.fmt(Decimal("96.6") - Decimal("92.55"), 1) == "4.1"
    assert core.fmt(96.6 - 92.55, 1) == "4.0"
    assert core.pct(0.9055) == Decimal("90.55")
    assert core.exact(core.pct(0.9055)) == "90.55" and core.exact(80.0) == "80.0" and core.exact(0.2) == "0.2"
    with pytest.raises(ValueError):
        core.exact(96.555)


def test_bounds_round_up_and_ties_are_decided_on_exact_values():
    """A bound ("within", "at most") holds of the exact value it bounds: rounded up, never half up
    (0.33 is "within 0.4", not "within 0.3"); values set side by side get the decimals that tell
    apart the ones that differ (0.5595 and 0.5607 are 0.560 and 0.561, not both 0.56)."""
    bound_up, apart = core.bound_up, core.apart
    assert bound_up(Decimal("0.33")) == "0.4" and bound_up(Decimal("0.33"), 2) == "0.33"
    assert bound_up(Decimal("1.734")) == "1.8" and bound_up(Decimal("-0.4467")) == "0.5" and bound_up(0.5) == "0.5"
    assert bound_up(Decimal("5.667"), 0) == "6" and bound_up(0.0) == "0.0"
    assert core.fmt(Decimal("0.33"), 1) == "0.3"  # what half up would have claimed
    assert apart([0.5595, 0.5607], 2) == 3 and apart([Decimal("97.0333"), Decimal("96.9833")]) == 2
    assert apart([1.0, 1.0, 2.0]) == 1  # equal values may print alike: that tie is real


def _copy_runs(tmp_path: Path, folder: str, names: list[str]) -> Path:
    """Copy run folders of outputs/reproductions/<folder> under tmp_path's own outputs/reproductions."""
    for name in names:
        shutil.copytree(REPO_ROOT / core.RUNS / folder / name, tmp_path / core.RUNS / folder / name)
    return tmp_path


def _set_final_accuracy(run: Path, accuracy: str) -> None:
    with open(run / "rounds.csv", newline="") as f:
        rows = list(csv.reader(f))
    rows[-1][rows[0].index("test_acc")] = accuracy
    with open(run / "rounds.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)


def test_a_claim_whose_data_changed_fails(tmp_path, doc):
    """#C=2's FedAvg-against-FedProx claim on a copy of its six runs: the doc's text, until FedProx's
    seed 1 ends 5 points higher (94.05% instead of 89.05%) in rounds.csv."""
    names = [f"{m}_seed{s}" for m in ("fedavg", "fedprox") for s in (0, 1, 2)]
    root = _copy_runs(tmp_path, "niidbench/mnist_c2", names)
    c = registry.CLAIMS["niidbench.c2_fedavg_fedprox"]
    before = c.render(core.Data(root))
    assert before == "In #C=2 FedAvg is ahead of FedProx in each of the 3 seeds (by 1.2 to 4.6 points)"
    assert registry.normalized(before) in doc
    _set_final_accuracy(root / core.RUNS / "niidbench/mnist_c2/fedprox_seed1", "0.9405")
    after = c.render(core.Data(root))
    assert after == "In #C=2 FedAvg is ahead of FedProx in 2 of 3 seeds (by -0.5 to 1.7 points)"
    assert registry.normalized(after) not in doc


def test_whole_mnist_table_cells_say_what_has_run(tmp_path):
    """A cell of the whole-MNIST Table III in progress, on copies of 10,000-image #C=3 runs: SCAFFOLD's
    seed 0 diverged at round 20, seeds 1 and 2 ended at 96.4% and 90.55% (best 96.75%, 95.4%), so
    mean 93.475 -> 93.5, sd 5.85 / sqrt(2) = 4.14 -> 4.1, best mean 96.075 -> 96.1; a FedAvg run cut
    after round 7 is "stopped part way", one stopped before its first round is at round 0; a cell or
    row with no run is "-"."""
    names = ["scaffold_seed0", "scaffold_seed1", "scaffold_seed2", "fedavg_seed0"]
    for name in names:
        shutil.copytree(REPO_ROOT / core.RUNS / "niidbench/mnist_c3" / name,
                        tmp_path / core.RUNS / niidbench_whole.NW / "mnist_c3" / name)
    cut = tmp_path / core.RUNS / niidbench_whole.NW / "mnist_c3" / "fedavg_seed0"
    (cut / "summary.json").unlink()
    lines = (cut / "rounds.csv").read_text().splitlines(keepends=True)
    (cut / "rounds.csv").write_text("".join(lines[:8]))  # the header and rounds 1-7
    data = core.Data(tmp_path)
    assert niidbench_whole.nw_cell(data, "c3", "scaffold") == "93.5 +- 4.1 / 96.1, 1 div (round 20)"
    assert niidbench_whole.nw_cell(data, "c3", "fedavg") == "seed 0 at round 7"
    assert niidbench_whole.nw_cell(data, "c3", "fednova") == "-" and niidbench_whole.nw_cell(data, "c1", "fedavg") == "-"
    assert registry.CLAIMS["niidbench_whole.count"].render(data) == (
        "2 of the table's 60 runs have finished, one diverged and one stopped part way")
    shutil.rmtree(tmp_path / core.RUNS / niidbench_whole.NW / "mnist_c3" / "scaffold_seed2")
    # seed 2 not there: the cell is incomplete, so it names the seed its mean is over (96.75 -> 96.8)
    assert niidbench_whole.nw_cell(core.Data(tmp_path), "c3", "scaffold") == "96.4 / 96.8 [seed 1], 1 div (round 20)"
    # a run stopped before its first round ended (rounds.csv holds only its header) is at round 0,
    # not an error: the grid's time limit can fall just after it started a run
    (cut / "rounds.csv").write_text(lines[0])
    assert niidbench_whole.nw_cell(core.Data(tmp_path), "c3", "fedavg") == "seed 0 at round 0"
    (cut / "rounds.csv").unlink()
    assert niidbench_whole.nw_cell(core.Data(tmp_path), "c3", "fedavg") == "seed 0 at round 0"


def test_whole_mnist_order_of_a_row_once_its_runs_have_ended(tmp_path):
    """The order of a whole-MNIST row, on a copy of the 10,000-image #C=3 row as if it were the
    whole MNIST's: FedProx (95.4 + 95.7 + 94.35) / 3 = 95.15, FedAvg 284.9 / 3 = 94.967 (-0.183),
    SCAFFOLD (96.4 + 90.55) / 2 = 93.475 over the seeds that did not diverge (-1.675, half up),
    FedNova 277.75 / 3 = 92.583 (-2.567); seed 0's highest FedProx (95.4 against FedAvg's 95.35).
    A row with a run still going is named, not ordered."""
    for folder in ("niidbench/mnist_c3", f"{niidbench_whole.NW}/mnist_c3", f"{niidbench_whole.NW}/mnist_c1"):
        source = REPO_ROOT / core.RUNS / "niidbench" / folder.rsplit("/", 1)[1]
        shutil.copytree(source, tmp_path / core.RUNS / folder)
    shutil.copytree(REPO_ROOT / "scripts" / "paper_targets", tmp_path / "scripts" / "paper_targets")
    (tmp_path / core.RUNS / niidbench_whole.NW / "mnist_c1" / "fedavg_seed2" / "summary.json").unlink()  # still going
    data = core.Data(tmp_path)
    assert registry.CLAIMS["niidbench_whole.order"].render(data) == (
        "under #C=3: FedProx 95.15, FedAvg 94.97 (-0.18), SCAFFOLD 93.48 (-1.68) [1 of 3 diverged], "
        "FedNova 92.58 (-2.57); highest in seed 0: FedProx, 1: SCAFFOLD, 2: FedProx; on the first 10,000 "
        "images FedProx, FedAvg, SCAFFOLD, FedNova (rows not ended yet: p_k ~ Dir(0.5), #C=1, #C=2 and IID)")
    shutil.rmtree(tmp_path / core.RUNS / niidbench_whole.NW / "mnist_c3" / "fednova_seed1")
    assert registry.CLAIMS["niidbench_whole.order"].render(core.Data(tmp_path)) == \
        "no row has all its 12 runs ended yet"
    assert niidbench_whole.nw_seed_leaders({"fedavg": [None, 2, 3], "fedprox": [None, 2, 1]}) == \
        ["none finished", "FedAvg = FedProx", "FedAvg"]


def test_whole_mnist_iid_fednova_is_fedavg_where_every_party_takes_the_same_steps(tmp_path):
    """IID seed 0 on the whole MNIST: every party holds 5,996 to 6,006 images, ceil(n / 64) = 94
    batches (5996 / 64 = 93.7, 6006 / 64 = 93.8), 10 epochs = 940 steps each, so FedNova's run is
    FedAvg's round for round.  A curve that departs in one round, or a party with a 95th batch
    (6,050 images), makes the claim fail rather than print a reason that no longer holds."""
    keep = shutil.ignore_patterns("checkpoint.pt", "*.gz", "*.log")
    for m in ("fedavg", "fednova"):
        shutil.copytree(REPO_ROOT / core.RUNS / niidbench_whole.NW / "mnist_iid" / f"{m}_seed0",
                        tmp_path / core.RUNS / niidbench_whole.NW / "mnist_iid" / f"{m}_seed0", ignore=keep)
    shutil.copytree(REPO_ROOT / "scripts" / "paper_targets", tmp_path / "scripts" / "paper_targets")
    c = registry.CLAIMS["niidbench_whole.iid_nova"]
    assert c.render(core.Data(tmp_path)) == (
        "FedNova's runs repeat FedAvg's round for round in the one seed both have finished (seed 0: every "
        "`rounds.csv` column but the timings equal, in each of the 50 rounds), where Flower's one run of each ends at 99.1% and 99.0%: "
        "every party holds 5,996 to 6,006 images, 94 batches of 64, so each takes the same 940 local steps, and "
        "FedNova's normalized average is then FedAvg's")
    nova = tmp_path / core.RUNS / niidbench_whole.NW / "mnist_iid" / "fednova_seed0"
    partition = nova / "partition.csv"
    lines = partition.read_text().splitlines(keepends=True)
    row = lines[1].split(",")
    partition.write_text(lines[0] + ",".join([row[0], "6050"] + row[2:]) + "".join(lines[2:]))
    with pytest.raises(ValueError, match="different numbers of local steps"):
        c.render(core.Data(tmp_path))
    partition.write_text("".join(lines))
    _set_final_accuracy(nova, "0.9901")
    with pytest.raises(ValueError, match="departs from FedAvg's, seed 0"):
        c.render(core.Data(tmp_path))


def test_whole_mnist_times_split_into_earlier_and_later_sittings(tmp_path):
    """The work a round, by hand: parties of 64 and 65 images take 10 x (1 + 2) = 30 steps, one of
    128 takes 10 x 2 = 20.  Three #C=3 runs of 36, 38 and 80 minutes split at the widest gap (38 to
    80) into the earlier sittings' 36 to 38 and the later ones' 80; a slow run that finished first
    makes the split no longer the sittings', and the claim fails."""
    import json

    keep = shutil.ignore_patterns("checkpoint.pt", "*.gz", "*.log")
    folder = tmp_path / core.RUNS / niidbench_whole.NW / "mnist_c3"
    timing = {0: ("2026-11-20T10:00:00", 36 * 60), 1: ("2026-11-21T10:00:00", 38 * 60), 2: ("2026-11-28T10:00:00", 80 * 60)}
    for seed, (finished, seconds) in timing.items():
        run = folder / f"fedavg_seed{seed}"
        shutil.copytree(REPO_ROOT / core.RUNS / niidbench_whole.NW / "mnist_c3" / f"fedavg_seed{seed}", run, ignore=keep)
        summary = json.loads((run / "summary.json").read_text())
        summary.update(finished=finished, round_seconds=float(seconds))
        (run / "summary.json").write_text(json.dumps(summary))
        (run / "partition.csv").write_text("client,examples\n0,64\n1,65\n" if seed < 2 else "client,examples\n0,128\n")
    c = registry.CLAIMS["niidbench_whole.work"]
    assert c.render(core.Data(tmp_path)) == (
        "every row's parties take 20 to 30 local steps a round together (10 epochs of ceil(n_k / 64) batches each), "
        "so the spread is the machine's, not the partition's: the #C=3 row's runs took 36 to 38 minutes in its "
        "earlier sittings and 80 to 80 minutes in its later ones")
    summary = json.loads((folder / "fedavg_seed2" / "summary.json").read_text())
    summary["finished"] = "2026-11-19T10:00:00"  # the slow run first: fast and slow interleave in time
    (folder / "fedavg_seed2" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="interleave in time"):
        c.render(core.Data(tmp_path))


def test_write_rewrites_only_the_marked_claims(tmp_path):
    """`claims.py --write`: the text between a claim's markers becomes what the runs say (the blank
    lines around a table kept), the rest of the doc stays byte for byte; an unknown id is refused."""
    data = core.Data(REPO_ROOT)
    count = registry.CLAIMS["niidbench_whole.count"].render(data)
    table = registry.CLAIMS["niidbench_whole.table"].render(data)
    doc = ("Prose 1 of 60 runs.\nSo far <!-- claim niidbench_whole.count -->1 of the table's 60 runs<!-- end claim -->;"
           " more.\n\n<!-- claim niidbench_whole.table -->\n\n| old |\n|---|\n\n<!-- end claim -->\nEnd.\n")
    text, changed = registry.write_marked(doc, data)
    assert changed == ["niidbench_whole.count", "niidbench_whole.table"]
    assert text == (f"Prose 1 of 60 runs.\nSo far <!-- claim niidbench_whole.count -->{count}<!-- end claim -->;"
                    f" more.\n\n<!-- claim niidbench_whole.table -->\n\n{table}\n\n<!-- end claim -->\nEnd.\n")
    assert registry.write_marked(text, data) == (text, [])  # as the runs say: nothing to rewrite
    with pytest.raises(ValueError, match="unknown claim 'nosuch.claim'"):
        registry.write_marked("<!-- claim nosuch.claim -->x<!-- end claim -->", data)
    # the committed docs are as their runs say
    for name in registry.docs():
        assert registry.write_marked((REPO_ROOT / name).read_text(), data)[1] == [], name


def test_print_section(capsys):
    out = io.StringIO()
    assert registry.print_section("fedlap_mnist_train10k", REPO_ROOT, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[fedlap_mnist_train10k]"
    ids = [c.id for c in registry.CLAIMS.values() if c.section == "fedlap_mnist_train10k"]
    assert [line.split(": ", 1)[0] for line in lines[1:]] == ids
    with pytest.raises(ValueError, match="no section"):
        registry.print_section("nosuch", REPO_ROOT, out)


def test_a_missing_run_is_one_line_not_a_crash(tmp_path):
    out = io.StringIO()
    assert not registry.print_section("fedlap_mnist_train10k", tmp_path, out)
    assert all("CANNOT BE COMPUTED" in line for line in out.getvalue().splitlines()[1:])


def test_which_sections_a_table_script_prints(tmp_path):
    runs = tmp_path / "outputs" / "reproductions"
    assert registry.sections_of([runs / "niidbench"], niidbench_table3.SECTIONS) == (
        tmp_path, ["niidbench", "niidbench_readings", "fednova_stragglers", "niidbench_tuned"])
    assert registry.sections_of([runs / "niidbench_tuned" / "fedprox_mnist_c3"], niidbench_table3.SECTIONS) == (
        tmp_path, ["niidbench_tuned"])
    assert registry.sections_of([runs / "fedlap/readings/L1_q1", runs / "fedlap/preset/stragglers0/fedavg_s0.0_seed0",
                               runs / "fedlap/fmnist"], plot_fedlap.SECTIONS) == (
        tmp_path, ["fedlap_readings", "fedlap_fmnist"])
    # Runs elsewhere (a user's own grid) print no claims about the committed ones.
    assert registry.sections_of([tmp_path / "outputs" / "niidbench"], niidbench_table3.SECTIONS) == (None, [])
    assert registry.sections_of([runs / "niidbench", tmp_path / "mine"], niidbench_table3.SECTIONS) == (None, [])


def test_table_csv_stores_run_folders_relative_to_itself(tmp_path):
    runs = [tmp_path / "grid" / "c2" / "fedavg_seed0", tmp_path / "grid" / "c2" / "fedavg_seed1"]
    path = tmp_path / "tables" / "t.csv"
    tables.write_csv([{"run_dir": ";".join(map(str, runs)), "x": 0.5}, {"run_dir": "", "x": None}], str(path),
                     ["run_dir", "x"], ".2f", io.StringIO())
    rows = list(csv.DictReader(open(path)))
    assert rows[0] == {"run_dir": "../grid/c2/fedavg_seed0;../grid/c2/fedavg_seed1", "x": "0.50"}
    assert rows[1] == {"run_dir": "", "x": ""}
    assert [(path.parent / p).resolve() for p in rows[0]["run_dir"].split(";")] == [r.resolve() for r in runs]


# A path that begins at a machine's root (not part of a relative path or a URL).
MACHINE_PATH = re.compile(rb"(?<![\w.\-/~])/(work|home|tmp|Users|root|mnt|scratch)/")


def test_no_machine_paths_in_committed_files():
    """Files tracked under outputs/, docs/ and scripts/ name no folder of the machine they were made
    on; Hydra's multirun.yaml files, which do, are being taken out of git apart from this."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "outputs", "docs", "scripts"], cwd=REPO_ROOT,
                                capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    found = []
    for name in filter(None, listed.decode().split("\0")):
        path = REPO_ROOT / name
        if path.name == "multirun.yaml" or not path.is_file():
            continue
        text = path.read_bytes()
        if path.name.endswith(".csv.gz"):  # a finished run's gzipped CSV (fedrun.results.compress_csvs)
            text = gzip.decompress(text)
        if not MACHINE_PATH.search(text):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{name}:{number}: {line.decode(errors='replace').strip()[:100]}")
    assert not found, "absolute machine paths in committed files:\n" + "\n".join(found)
