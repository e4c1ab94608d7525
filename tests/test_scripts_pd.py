"""The parameter-divergence reproduction scripts (scripts/pd/tables.py, scripts/pd/plot.py,
scripts/pd/loss_surface.py) on tiny fake run directories laid out as fedrun writes them (config.yaml
with ``choices``, rounds.csv / layers.csv with pd_ls / pd_vl, output_layer.csv), plus one real tiny
CLI run for the loss surface.  CPU, offline."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from scripts.pd import loss_surface
from scripts.pd import tables as pd_tables
from scripts.pd import plot as plot_pd
import pytest
import yaml
from conftest import TINY, run_fedrun

from fedrun.results import FINISHED_FILES, Run, find_runs

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT.parent / "shared" / "papers" / "targets" / "parameter_divergence_tables4-10_accuracy.csv"

LAYERS = [("C11", "conv"), ("C21", "conv"), ("C31", "conv"), ("F1", "fc"), ("F2", "fc"), ("F3", "fc")]
ROUNDS = {"iid": 200, "noniid2": 300, "noniid1": 300, "vanilla_bs50": 100, "vanilla_bs500": 100}


def make_run(folder: Path, setting: str, model: str = "neta_baseline", hyperparams: str = "pd_nmom_a",
             final: float = 0.7, best: float | None = None, seed: int = 0, dataset: str = "cifar10",
             weight_decay: float = 5e-5, norm: str = "none", dropout: bool = False, augment: bool = False,
             scale: str | None = None, data_name: str | None = None, rounds: int = 4,
             experiment: str | None = None, choices: bool = True, pd_scale: float = 1.0) -> Path:
    """A finished run directory as fedrun writes it (the contract), reduced to what the scripts read."""
    folder.mkdir(parents=True)
    vanilla = setting.startswith("vanilla")
    lr = {"pd_sgd": 0.05, "pd_nmom_a": 0.01, "pd_nmom_wb": 0.01, "pd_adam_a": 0.001, "pd_adam_wb": 0.001}[hyperparams]
    config = {
        "seed": seed,
        "dataset": {"name": data_name or dataset, "max_train": 1000 if scale else None, "max_test": None},
        "model": {"_target_": "fedrun.models.pd_nets.PDNet", "norm": norm, "dropout": dropout},
        "hyperparams": {"rounds": rounds if scale else ROUNDS[setting], "num_clients": 100 if vanilla else 10,
                        "client_fraction": 1.0, "local_epochs": 1,
                        "batch_size": 500 if setting == "vanilla_bs500" else 50, "lr": lr,
                        "weight_decay": weight_decay, "augment": augment},
        "tags": {"paper": "pd", "setting": setting, "dataset": dataset},
        "choices": {"dataset": data_name or dataset, "model": model, "hyperparams": hyperparams,
                    "experiment": experiment or f"pd/{setting}", "aggregator": "fedavg",
                    "partition": "iid", "scale": scale, "mode": "centralized" if vanilla else "federated"},
    }
    if not choices:
        del config["choices"]
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    summary = {"aggregator": "fedavg", "rounds": rounds, "final_test_acc": final,
               "best_test_acc": final if best is None else best}
    (folder / "summary.json").write_text(json.dumps(summary))
    single = vanilla
    rows = ["round,clients,test_acc,test_loss,train_loss,pd_ls,pd_vl,lr"]
    layer_rows = ["round,layer,type,params,N,E,pd_ls,pd_vl"]
    neuron_rows = ["round,client,class,weight_norm,bias"]
    for t in range(1, rounds + 1):
        acc = final * t / rounds
        ls = "" if single else pd_scale * 0.01 / t
        vl = "" if single or t % 2 else pd_scale * 0.02 / t
        rows.append(f"{t},{1 if single else 10},{acc},{2 - acc},{2.3 / t},{ls},{vl},{lr}")
        for i, (name, kind) in enumerate(LAYERS):
            lls = "" if single else pd_scale * (i + 1) * 0.001 / t
            lvl = "" if single or t % 2 else pd_scale * (i + 1) * 0.002 / t
            layer_rows.append(f"{t},{name},{kind},{100 * (i + 1)},0.1,0.2,{lls},{lvl}")
        for k in range(1 if single else 10):
            for q in range(10):
                neuron_rows.append(f"{t},{k},{q},{0.5 + (0.3 if (q // 2) == (k % 5) else 0.0)},0.01")
    (folder / "rounds.csv").write_text("\n".join(rows) + "\n")
    (folder / "layers.csv").write_text("\n".join(layer_rows) + "\n")
    (folder / "output_layer.csv").write_text("\n".join(neuron_rows) + "\n")
    return folder


@pytest.fixture
def runs_dir(tmp_path):
    top = tmp_path / "runs"
    c = top / "cifar10"
    # NetA-Baseline NMom-A non-IID(2): a row of every table; two seeds.
    make_run(c / "noniid2" / "a0", "noniid2", final=0.7011, best=0.7123, seed=0)
    make_run(c / "noniid2" / "a1", "noniid2", final=0.7211, best=0.7323, seed=1)
    # Vanilla NMom-A, batch 50: also stands for NMom-WB's vanilla cell.
    make_run(c / "vanilla_bs50" / "a", "vanilla_bs50", final=0.8, best=0.81)
    # Table 7: weight decay 0.0005, IID.
    make_run(c / "iid" / "wd", "iid", weight_decay=0.0005, final=0.8, best=0.82)
    # Table 8: pure SGD + BN, non-IID(2), at smoke scale on substituted data.
    make_run(c / "noniid2" / "bn", "noniid2", hyperparams="pd_sgd", norm="bn", final=0.5, scale="smoke",
             data_name="synthetic", rounds=3)
    # Not in any table: NetC-Widest with BN.
    make_run(c / "noniid2" / "odd", "noniid2", model="netc_widest", norm="bn", final=0.3)
    # Not runs of the study.
    make_run(top / "other" / "fednnnn", "iid", experiment="fednnnn/cifar10_iid_b")
    make_run(top / "other" / "old", "iid", choices=False)
    return top


def _cells(text: str, table: str, label: list[str]) -> list[str]:
    """The setting cells of the row of ``table`` whose label cells are ``label``."""
    block = text.split(pd_tables.TABLE_TITLES[table], 1)[1].split("\n\n", 1)[0]
    for line in block.splitlines()[3:]:
        cells = [c.strip() for c in line.split(" | ")]
        if cells[: len(label)] == label:
            return cells[len(label):]
    raise AssertionError(f"no row {label} in {table}:\n{block}")


# ----------------------------------------------------------------------------- the paper's rows

def test_builtin_rows_match_the_targets_csv():
    rows = pd_tables.paper_rows()
    assert len(rows) == 308 and {r.table for r in rows} == set(pd_tables.TABLES)
    assert {r.network for r in rows} <= set(pd_tables.NETWORKS)
    assert {r.optimizer for r in rows} <= set(pd_tables.OPTIMIZERS)
    if not TARGETS.is_file():
        pytest.skip("../shared/papers/targets not present")
    assert pd_tables.paper_rows(TARGETS) == rows


def test_keys_dedup_baselines_and_map_overrides():
    key = pd_tables.run_key
    # wd=0.00005 is the baseline; vanilla -WB is the -A run; federated -WB stays itself.
    assert key("cifar10", "NetA-Baseline", "nmom-a", "wd=0.00005", "iid") == key("cifar10", "NetA-Baseline",
                                                                                "nmom-a", "", "iid")
    assert key("cifar10", "NetA-Baseline", "adam-wb", "", "vanilla_bs50")[2] == "adam-a"
    assert key("cifar10", "NetA-Baseline", "adam-wb", "", "noniid2")[2] == "adam-wb"
    assert pd_tables.canonical_variant("wd=0.0") == "wd=0"
    assert pd_tables.variant_overrides("wd=0") == ["hyperparams.weight_decay=0.0"]
    assert pd_tables.variant_overrides("brn") == ["model.norm=brn"]
    assert pd_tables.variant_overrides("da") == ["hyperparams.augment=true"]
    assert pd_tables.variant_overrides("do") == ["model.dropout=true"]


# ----------------------------------------------------------------------------- collect

def test_collect_matches_rows_and_computes_diffs(runs_dir, tmp_path, capsys):
    out_csv = tmp_path / "pd.csv"
    assert pd_tables.main(["collect", str(runs_dir), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    # Two seeds averaged: final 71.11, best 72.23 vs the paper's 74.11 (74.23): -3.00.
    t4 = _cells(text, "table4", ["CIFAR-10", "NMom-A"])
    assert t4[3] == "71.11 (72.23) x2 vs 74.11 (74.23) -3.00"
    assert t4[0] == "80.00 (81.00) vs 83.89 (83.90) -3.89"
    assert t4[2] == "- vs 81.49 (81.82)"
    # The vanilla -A run stands for -WB too; federated -WB has no run.
    wb = _cells(text, "table4", ["CIFAR-10", "NMom-WB"])
    assert wb[0] == "80.00 (81.00) vs 83.89 (83.90) -3.89" and wb[3] == "- vs 74.21 (74.31)"
    # The same run fills its row in every table (depth table: network column).
    assert _cells(text, "table5", ["CIFAR-10", "NetA-Baseline", "NMom-A"])[3].startswith("71.11 (72.23) x2")
    # Table 7 rows carry the weight decay factor; the baseline wd=0.00005 is the NMom-A run.
    assert _cells(text, "table7", ["CIFAR-10", "NMom-A", "0.0005"])[2] == "80.00 (82.00) vs 82.69 (83.14) -2.69"
    assert _cells(text, "table7", ["CIFAR-10", "NMom-A", "0.00005"])[3].startswith("71.11 (72.23) x2")
    # Smoke scale on substituted data: marked * and explained in the NOTES.
    assert _cells(text, "table8", ["CIFAR-10", "pure SGD + BN"])[3] == "50.00 (50.00)* vs 57.56 (58.68) -7.56"
    notes = text.split("NOTES:", 1)[1]
    assert "SMOKE SCALE" in notes and "scale=smoke (1 run)" in notes
    assert "synthetic instead of cifar10" in notes
    assert "MISSING" in notes and "IN NO TABLE" in notes and "NetC-Widest" in notes
    assert "SKIPPED 2" in notes and "no `choices`" in notes and "not a pd/* preset" in notes

    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 308
    assert set(rows[0]) >= {"table", "dataset", "network", "optimizer", "variant", "setting", "final", "best",
                            "paper_final", "paper_best", "diff_final"}
    mine = [r for r in rows if (r["network"], r["optimizer"], r["setting"], r["dataset"]) ==
            ("NetA-Baseline", "nmom-a", "noniid2", "cifar10") and r["variant"] in ("", "wd=0.00005")]
    assert len(mine) == 7  # tables 4-10 each list it
    for r in mine:
        assert float(r["final"]) == pytest.approx(71.11) and float(r["best"]) == pytest.approx(72.23)
        assert float(r["diff_final"]) == pytest.approx(71.11 - 74.11) and r["n_runs"] == "2"
    bn = next(r for r in rows if r["table"] == "table8" and r["optimizer"] == "pure-sgd" and r["variant"] == "bn"
              and r["setting"] == "noniid2")
    assert float(bn["paper_final"]) == 57.56 and "smoke" in bn["notes"]
    empty = next(r for r in rows if r["table"] == "table6" and r["network"] == "NetC-Widest")
    assert empty["final"] == "" and empty["diff_final"] == "" and empty["n_runs"] == "0"


def test_collect_one_table_and_no_runs(runs_dir, tmp_path, capsys):
    assert pd_tables.main(["collect", str(runs_dir), "--tables", "8", "--csv", ""]) == 0
    text = capsys.readouterr().out
    assert pd_tables.TABLE_TITLES["table8"] in text and pd_tables.TABLE_TITLES["table4"] not in text
    assert pd_tables.main(["collect", str(tmp_path / "absent")]) == 2


def test_collect_writes_no_csv_unless_asked_and_names_damaged_runs(runs_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    damaged = runs_dir / "cifar10" / "iid" / "wd" / "summary.json"
    damaged.write_text("{not json")
    before = sorted(tmp_path.rglob("*"))
    assert pd_tables.main(["collect", str(runs_dir)]) == 0
    text = capsys.readouterr().out
    assert sorted(tmp_path.rglob("*")) == before  # no pd_tables.csv in the DIR it read, nor elsewhere
    assert f"UNREADABLE 1 run directory (skipped): {damaged.parent} (unreadable: {damaged}: not valid JSON" in text
    assert plot_pd.main([str(runs_dir), "--out", str(tmp_path / "figs")]) == 0
    assert f"plot_pd: skipping {damaged.parent}: unreadable: {damaged}: not valid JSON" in capsys.readouterr().err


def test_loss_surface_names_a_damaged_config(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: [unclosed\n")
    assert loss_surface.main([str(run), "--grid", "3", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loss_surface: error: {run / 'config.yaml'}: not valid YAML") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- run --dry-run

SWEEP = re.compile(r"^\[\d+/\d+\] (\S+), (\d+) run\(s\) \(([^)]*)\): (.*)$")


def _sweeps(text: str) -> list[tuple[list[str], str]]:
    """The ``fedrun -m`` lines of ``run``'s output: (the run folders it makes, below OUT; the command)."""
    found = []
    for line in text.splitlines():
        if line.startswith("["):
            where, n, names, cmd = SWEEP.match(line).groups()
            found.append(([f"{where}/{name}" for name in names.split()], cmd))
            assert len(found[-1][0]) == int(n)
    return found


def _plan(tmp_path, capsys, *extra) -> dict[str, str]:
    """Every run a dry run plans, below OUT, with the command of its sweep (each run once)."""
    extra = extra if "--seeds" in extra else (*extra, "--seeds", "0")
    assert pd_tables.main(["run", "--out", str(tmp_path / "o"), "--dry-run", *extra]) == 0
    sweeps = _sweeps(capsys.readouterr().out)
    runs = [(run, cmd) for names, cmd in sweeps for run in names]
    assert len({run for run, _ in runs}) == len(runs)
    return dict(runs)


def _independent_count(tables) -> int:
    """Distinct runs of ``tables`` counted straight from the targets, with the two dedup rules."""
    keys = set()
    for r in pd_tables.paper_rows():
        if r.table in tables:
            opt = r.optimizer.replace("-wb", "-a") if r.setting.startswith("vanilla") else r.optimizer
            variant = "" if r.variant == "wd=0.00005" else r.variant
            keys.add((r.dataset, r.network, opt, variant, r.setting))
    return len(keys)


def test_run_dry_run_dedups_across_tables(tmp_path, capsys):
    # Table 4: 20 CIFAR-10 cells less 4 vanilla -WB cells, plus 4 SVHN cells.
    assert len(_plan(tmp_path, capsys, "--tables", "4")) == 20 == _independent_count({"table4"})
    # Tables 4 + 8: 20 + 40 less the 12 cells they share (pure SGD, NMom-A, Adam-A baselines on CIFAR-10).
    calls = _plan(tmp_path, capsys, "--tables", "4,8")
    assert len(calls) == 48 == _independent_count({"table4", "table8"})
    every = _plan(tmp_path, capsys)
    assert len(every) == _independent_count(set(pd_tables.TABLES)) < 308
    out = tmp_path / "o"
    bn = calls["cifar10/noniid2/neta_baseline_adam-a_bn_seed0"]
    for piece in ("-m", "experiment=pd/noniid2", "dataset=cifar10", "model=neta_baseline", "hyperparams=pd_adam_a",
                  "model.norm=bn", "seed=0", "progress=false", f"hydra.sweep.dir={out}/cifar10/noniid2",
                  "'hydra.sweep.subdir=${hydra:runtime.choices.model}_adam-a_bn_seed${seed}'"):
        assert f" {piece} " in f" {bn} ", piece
    wd = every["cifar10/iid/neta_baseline_pure-sgd_wd0.0005_seed0"]
    assert " hyperparams.weight_decay=0.0005 " in wd and "experiment=pd/iid" in wd and "hyperparams=pd_sgd" in wd
    assert not any("wd5e-05" in c or "weight_decay=5e-05" in c for c in every.values())  # the baseline: no override
    vanilla = calls["cifar10/vanilla_bs500/neta_baseline_nmom-a_seed0"]
    assert "experiment=pd/vanilla_bs500" in vanilla and "hyperparams=pd_nmom_a" in vanilla
    assert not any("vanilla" in run and "-wb_" in run for run in every)


def test_run_sweeps_networks_and_seeds_of_one_optimizer_and_variant(tmp_path, capsys):
    """Table 5 (depth) on CIFAR-10, IID: one sweep per optimizer over its networks x seeds, with
    --population; the subdir names each run as run_name() does."""
    assert pd_tables.main(["run", "--out", str(tmp_path), "--dry-run", "--tables", "5", "--settings", "iid",
                           "--datasets", "cifar10", "--seeds", "0,1", "--population"]) == 0
    sweeps = _sweeps(capsys.readouterr().out)
    assert len(sweeps) == 2
    (runs, cmd), _ = sweeps
    assert runs == [f"cifar10/iid/{net}_nmom-a_seed{seed}" for net in ("neta_baseline", "neta_deeper", "neta_deepest")
                    for seed in (0, 1)]
    for piece in ("model=neta_baseline,neta_deeper,neta_deepest", "seed=0,1", "hydra/launcher=population"):
        assert f" {piece} " in f" {cmd} ", piece
    key = pd_tables.run_key("cifar10", "NetA-Deeper", "nmom-a", "", "iid")
    subdir = pd_tables.sweep_subdir(key).replace("${hydra:runtime.choices.model}", "neta_deeper")
    assert subdir.replace("${seed}", "1") == pd_tables.run_name(key, 1) == "neta_deeper_nmom-a_seed1"


def test_sweeps_are_products_of_what_is_left_to_run():
    key = pd_tables.run_key("cifar10", "NetA-Baseline", "nmom-a", "bn", "iid")
    deeper = (*key[:1], "NetA-Deeper", *key[2:])
    # Baseline lacks seeds 0 and 1, Deeper only seed 1: two sweeps, no run twice, none left out.
    jobs = [(key, "0", False), (key, "1", False), (deeper, "1", False), (deeper, "2", True)]
    plan = pd_tables.sweeps(jobs)
    assert [(networks, seeds, resume) for _k, networks, seeds, resume in plan] == [
        (["NetA-Baseline"], ["0", "1"], False), (["NetA-Deeper"], ["1"], False), (["NetA-Deeper"], ["2"], True)]


def test_run_dry_run_options_and_skips_finished(tmp_path, capsys):
    calls = _plan(tmp_path, capsys, "--tables", "4", "--settings", "iid,noniid2", "--datasets", "cifar10",
                  "--seeds", "0,1", "--smoke", "--substitute", "cifar10=synthetic", "--set", "device=cpu")
    assert len(calls) == 5 * 2 * 2
    for piece in ("dataset=synthetic", "dataset.channels=3", "dataset.image_size=32", "++tags.dataset=cifar10",
                  "scale=smoke", "device=cpu", "seed=0,1"):
        assert all(f" {piece} " in f" {c} " for c in calls.values()), piece
    assert sum(run.endswith("_seed1") for run in calls) == 10
    assert not any("hydra/launcher=population" in c for c in calls.values())
    # A finished run is not redone; an unfinished one is skipped unless --resume.
    out = tmp_path / "o"
    key = pd_tables.run_key("cifar10", "NetA-Baseline", "pure-sgd", "", "iid")
    make_run(pd_tables.run_dir(out, key, 0), "iid", hyperparams="pd_sgd")
    started = pd_tables.run_dir(out, pd_tables.run_key("cifar10", "NetA-Baseline", "adam-a", "", "iid"), 0)
    started.mkdir(parents=True)
    (started / "config.yaml").write_text("{}")
    args = ["--tables", "4", "--settings", "iid", "--datasets", "cifar10", "--seeds", "0"]
    assert pd_tables.main(["run", "--out", str(out), "--dry-run", *args]) == 0
    text = capsys.readouterr().out
    assert "1 done, 1 started but unfinished, 3 to run; 3 fedrun -m sweep(s)" in text
    assert "cifar10/iid/neta_baseline_pure-sgd_seed0: done" in text
    assert "cifar10/iid/neta_baseline_adam-a_seed0: started but unfinished: skipped" in text
    assert len(_sweeps(text)) == 3 and not any("resume=true" in c for _r, c in _sweeps(text))
    calls = _plan(tmp_path, capsys, *args, "--resume")
    assert len(calls) == 4 and [run for run, c in calls.items() if " resume=true " in c] == [
        "cifar10/iid/neta_baseline_adam-a_seed0"]
    # A run that diverged is never resumed (it would diverge again): reported, and left out of the plan.
    (started / "run.json").write_text('[{"last_round": 3, "reason": "diverged", "error": "NaN"}]')
    assert pd_tables.main(["run", "--out", str(out), "--dry-run", *args, "--resume"]) == 0
    text = capsys.readouterr().out
    assert "1 done, 0 started but unfinished, 1 diverged, 3 to run; 3 fedrun -m sweep(s)" in text
    assert "cifar10/iid/neta_baseline_adam-a_seed0: diverged (diverged at round 4): not run again" in text
    assert not any("resume=true" in c for _r, c in _sweeps(text))
    # Narrower selections.
    assert len(_plan(tmp_path, capsys, "--tables", "8", "--variants", "bn", "--optimizers", "adam-a")) == 4
    assert len(_plan(tmp_path, capsys, "--tables", "6", "--networks", "NetC-Widest", "--datasets", "svhn")) == 2


def test_unknown_selection_is_rejected(tmp_path):
    assert pd_tables.main(["run", "--out", str(tmp_path), "--dry-run", "--tables", "3"]) == 2
    assert pd_tables.main(["run", "--out", str(tmp_path), "--substitute", "cifar10=nope"]) == 2


# ----------------------------------------------------------------------------- figures

def test_plot_pd_writes_pngs(tmp_path, capsys):
    top = tmp_path / "runs"
    for setting in ("iid", "noniid2"):
        make_run(top / setting / "adam_a", setting, hyperparams="pd_adam_a")
        make_run(top / setting / "adam_wb", setting, hyperparams="pd_adam_wb", pd_scale=2.0)
        make_run(top / setting / "adam_wb_s1", setting, hyperparams="pd_adam_wb", seed=1)
    make_run(top / "vanilla" / "a", "vanilla_bs50", hyperparams="pd_adam_a")
    out = tmp_path / "figs"
    assert plot_pd.main([str(top), "--out", str(out)]) == 0
    names = {Path(p).name for p in capsys.readouterr().out.split()}
    assert {"pd_ls_layers.png", "pd_vl_layers.png", "pd_model.png", "train_loss.png", "test_accuracy.png"} <= names
    heatmaps = sorted(n for n in names if n.startswith("neurons_"))
    assert len(heatmaps) == 7 and "neurons_cifar10_noniid2_neta_baseline_adam-wb_seed1.png" in heatmaps
    for n in names:
        data = (out / n).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    # Labels name what differs (the optimizer); seeds of one configuration are one curve.
    curves = plot_pd.curves([Run.load(p) for p in find_runs(top, require=FINISHED_FILES)])
    assert {(c.label, c.setting, len(c.runs)) for c in curves} >= {("Adam-WB", "noniid2", 2), ("Adam-A", "iid", 1)}
    assert {c.style for c in curves if c.setting == "iid"} == {":"}
    assert {c.style for c in curves if c.setting == "noniid2"} == {"-"}
    assert plot_pd.layer_label("C11") == "C$_{11}$" and plot_pd.layer_label("F3") == "F$_{3}$"
    # Chosen panels, another neuron round; a folder without runs.
    assert plot_pd.main([str(top / "noniid2"), "--out", str(tmp_path / "f2"), "--layers", "F3,C11",
                         "--neuron-round", "2", "--settings", "noniid2"]) == 0
    assert (tmp_path / "f2" / "pd_ls_layers.png").stat().st_size < (out / "pd_ls_layers.png").stat().st_size
    assert plot_pd.main([str(tmp_path / "figs"), "--out", str(tmp_path / "f3")]) == 2
    assert "plot_pd: error: no finished runs to draw under" in capsys.readouterr().err


# ----------------------------------------------------------------------------- loss surface (a real run)

def test_loss_surface_on_a_real_tiny_run(tmp_path, capsys):
    if "snapshots" not in (ROOT / "conf" / "config.yaml").read_text():
        pytest.skip("the contract's `snapshots` setting is not in conf/config.yaml yet")
    run = tmp_path / "run"
    proc = run_fedrun([*TINY, "snapshots=[1]", f"hydra.run.dir={run}"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "models" / "round_0001.pt").is_file()

    out = tmp_path / "surface"
    assert loss_surface.main([str(run), "--snapshot", "1", "--grid", "5", "--span", "0.5", "--samples", "120",
                              "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "round 1 (round_0001.pt)" in printed and "centre loss" in printed and "sharpness" in printed
    rows = list(csv.DictReader((out / "loss_surface.csv").open()))
    assert len(rows) == 25 and {float(r["alpha"]) for r in rows} == {-0.5, -0.25, 0.0, 0.25, 0.5}
    summary = json.loads((out / "loss_surface.json").read_text())
    assert summary["round"] == 1 and summary["samples"] == 120
    assert summary["min"] <= summary["centre"]
    centre = next(float(r["loss"]) for r in rows if float(r["alpha"]) == 0 and float(r["beta"]) == 0)
    assert centre == pytest.approx(summary["centre"], rel=1e-6)
    assert (out / "loss_surface.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The centre is the snapshot's loss on the same examples, computed independently.
    import torch

    from fedrun.diagnostics.evaluation import evaluate

    model, data = loss_surface.build(run, torch.device("cpu"))
    x, y = loss_surface.training_subset(data, 120, 0)
    state = torch.load(run / "models" / "round_0001.pt", weights_only=False)
    assert state["round"] == 1
    assert evaluate(model, {**state["params"], **state["buffers"]}, x, y)[1] == pytest.approx(centre, rel=1e-5)

    # Default: the checkpoint (the last round); a missing snapshot is a clear error.
    assert loss_surface.main([str(run), "--grid", "3", "--samples", "50", "--out", str(tmp_path / "s2")]) == 0
    assert json.loads((tmp_path / "s2" / "loss_surface.json").read_text())["round"] == 2
    assert loss_surface.main([str(run), "--snapshot", "7", "--out", str(tmp_path / "s3")]) == 2
    assert "round_0007.pt: no such checkpoint" in capsys.readouterr().err
    assert loss_surface.main([str(run), "--grid", "4", "--out", str(tmp_path / "s4")]) == 2
    assert "--grid=4: must be odd" in capsys.readouterr().err


# ----------------------------------------------------------------------------- end to end (real runs)

def test_run_collect_plot_surface_end_to_end(tmp_path, capsys):
    """One real row (NetA-Baseline, Adam-A, non-IID(2)) at tiny scale on synthetic CIFAR-10-shaped
    data: run, collect, plot and loss surface read what fedrun really writes."""
    if not (ROOT / "conf" / "experiment" / "pd" / "noniid2.yaml").is_file():
        pytest.skip("the contract's pd presets are not in conf/ yet")
    out = tmp_path / "pd"
    rc = pd_tables.main(["run", "--out", str(out), "--scale", "tiny", "--substitute", "cifar10=synthetic",
                         "--tables", "4", "--settings", "noniid2", "--datasets", "cifar10", "--optimizers", "adam-a",
                         "--seeds", "0", "--set", "dataset.load.num_train=300", "--set", "snapshots=[1]"])
    text = capsys.readouterr().out
    assert rc == 0, text[-3000:]
    run = out / "cifar10" / "noniid2" / "neta_baseline_adam-a_seed0"
    assert (run / "summary.json").is_file() and (run / "models" / "round_0001.pt").is_file()
    cell = _cells(text, "table4", ["CIFAR-10", "Adam-A"])[3]
    assert "* vs 75.32 (75.45)" in cell
    assert "scale=tiny (1 run)" in text and "synthetic instead of cifar10" in text
    row = next(r for r in csv.DictReader((out / "pd_tables.csv").open())
               if r["optimizer"] == "adam-a" and r["setting"] == "noniid2" and r["dataset"] == "cifar10")
    assert row["n_runs"] == "1" and row["final"] != ""

    figs = tmp_path / "figs"
    assert plot_pd.main([str(out), "--out", str(figs)]) == 0
    written = {Path(p).name for p in capsys.readouterr().out.split()}
    assert {"pd_ls_layers.png", "pd_vl_layers.png", "train_loss.png",
            "neurons_cifar10_noniid2_neta_baseline_adam-a_seed0.png"} <= written
    assert plot_pd.default_layers(plot_pd.curves([Run.load(run)])) == ["C11", "C21", "C31", "F1", "F2", "F3"]

    assert loss_surface.main([str(run), "--snapshot", "1", "--grid", "3", "--samples", "40",
                              "--out", str(tmp_path / "surface")]) == 0
    assert "NOTE: not the paper's setting: tiny scale" in capsys.readouterr().out
    assert json.loads((tmp_path / "surface" / "loss_surface.json").read_text())["round"] == 1
