"""Runs made before fedrun's modules moved into sub-packages name the old module paths in their
config.yaml: they are read as before (fedrun.results, the paper scripts through
``current_target``) and refused for resume in one line; every old path maps to a module that
exists now, and no old module is left behind."""
from __future__ import annotations

import importlib

import pytest
from conftest import REPO_ROOT, RESUMABLE, fedrun_ok, run_fedrun

from fedrun import results
from fedrun.moved import MODULES, SPLIT, current_target, moved_targets


def test_every_old_path_has_a_present_module():
    for old, new in MODULES.items():
        assert importlib.import_module(new).__name__ == new
        assert not (REPO_ROOT / (old.replace(".", "/") + ".py")).exists() or old == "fedrun.data", old
    for old, new in SPLIT.items():
        module, _, name = new.rpartition(".")
        assert hasattr(importlib.import_module(module), name), new


def test_current_target_by_hand():
    assert current_target("fedrun.partition.shards") == "fedrun.data.partition.shards"
    assert current_target("fedrun.models.MLP") == "fedrun.models.nets.MLP"
    assert current_target("fedrun.data.mnist") == "fedrun.data.datasets.mnist"
    assert current_target("fedrun.data.prepare") == "fedrun.data.preparation.prepare"
    assert current_target("fedrun.aggregators.Aggregator") == "fedrun.server.aggregator.Aggregator"
    # Present paths, the catalog of methods (it did not move) and non-strings stay as they are.
    for same in ("fedrun.data.partition.shards", "fedrun.aggregators.fedavg", "torch.nn.Linear", None, 3):
        assert current_target(same) == same


def make_old(run_dir):
    """Rewrite a run's config.yaml as fedrun's earlier layout wrote it (the old module paths)."""
    path = run_dir / "config.yaml"
    text = path.read_text()
    old = text.replace("fedrun.data.partition.", "fedrun.partition.").replace("fedrun.models.nets.", "fedrun.models.")
    assert old != text
    path.write_text(old)
    return old


def test_an_old_run_is_read_but_not_resumed(tmp_path):
    run = tmp_path / "old"
    fedrun_ok([*RESUMABLE, "hyperparams.rounds=2", f"hydra.run.dir={run}"], tmp_path)
    old = make_old(run)
    assert moved_targets(results.read_config(run))[0] == ("fedrun.models.MLP", "fedrun.models.nets.MLP")
    table = results.load(run)
    assert len(table) == 2 and table["method"].iloc[0] == "FedNNNN"
    proc = run_fedrun([*RESUMABLE, "hyperparams.rounds=3", "resume=true", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode != 0
    line = proc.stderr.strip().splitlines()[-1]
    assert "fedrun.models.MLP" in line and "earlier layout" in line and "fedrun.models.nets.MLP" in line
    assert (run / "config.yaml").read_text() == old  # nothing rewritten
    assert len(results.load(run)) == 2  # no round added


@pytest.mark.parametrize("stored", ["fedrun.models.MnistCNN", "fedrun.models.nets.MnistCNN"])
def test_paper_scripts_read_old_and_new_paths_alike(stored, tmp_path):
    """The paper scripts' check of a run's setting finds no departure in the model's old path,
    and still names a different model."""
    from scripts.common import papers

    def departures(target):
        run = results.Run(tmp_path, {"model": {"_target_": target}, "dataset": {"name": "mnist"}, "hyperparams": {}},
                          {})
        return papers.setting_deviations(run, {}, model={"_target_": "fedrun.models.nets.MnistCNN"})

    assert departures(stored) == []
    assert departures("fedrun.models.MLP") == ["model._target_=MLP (paper MnistCNN)"]
