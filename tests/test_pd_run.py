"""A whole run's parameter-divergence outputs, from the CLI: PD columns, the vanilla reference's
rounds, output-layer neurons, model snapshots and the recorded config-group choices."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
import yaml
from conftest import TINY, run_fedrun
from hydra.utils import instantiate

from fedrun.data.preparation import prepare
from fedrun.diagnostics.evaluation import evaluate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("pd")
    args = [*TINY, "partition=classes", "aggregator=fedavg", "hyperparams.rounds=3", "vanilla_every=2",
            "snapshots=[2]", f"hydra.run.dir={root}/run"]
    proc = run_fedrun(args, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "run"


def test_divergence_columns_and_vanilla_rounds(run_dir):
    rounds = pd.read_csv(run_dir / "rounds.csv")
    assert rounds["pd_ls"].between(0, 2).all() and (rounds["pd_ls"] > 0).all()
    # vanilla_every=2: the reference learner trains in rounds 1 and 3 only.
    assert rounds["pd_vl"].notna().tolist() == [True, False, True]
    assert rounds["vanilla_loss"].notna().tolist() == [True, False, True]
    layers = pd.read_csv(run_dir / "layers.csv")
    assert layers.groupby("round").size().tolist() == [2, 2, 2]  # fc1, fc2 of the MLP
    assert layers["pd_ls"].between(0, 2).all()
    assert layers.set_index("round")["pd_vl"].notna().groupby(level=0).all().tolist() == [True, False, True]


def test_output_layer_neurons(run_dir):
    out = pd.read_csv(run_dir / "output_layer.csv")
    clients = pd.read_csv(run_dir / "clients.csv")
    assert len(out) == len(clients) * 10  # every reporting learner x every class, every round
    assert (out["weight_norm"] > 0).all() and out["bias"].notna().all()
    assert set(out["class"]) == set(range(10))


def test_snapshot_is_the_evaluated_model(run_dir):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["choices"]["model"] == "mlp" and cfg["choices"]["partition"] == "classes"
    snap = torch.load(run_dir / "models" / "round_0002.pt", weights_only=False)
    assert snap["round"] == 2
    model = instantiate(cfg["model"])
    d = cfg["dataset"]
    raw = instantiate(d["load"])
    data = prepare(raw, d["mean"], d["std"], 0.0, cfg["seed"], "cpu", d["max_train"], d["max_test"])
    acc, _ = evaluate(model, {**snap["params"], **snap["buffers"]}, data.test_x, data.test_y)
    assert acc == pytest.approx(pd.read_csv(run_dir / "rounds.csv")["test_acc"][1], abs=1e-9)
