"""Natural clients through every part of a run: every aggregator, both engines, one population,
an interrupted run resumed, each with the clients' own accuracies (LEAF's FEMNIST layout, written
by the tests; tests/test_natural_clients.py reads the formats)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import CONF_DIR, compose, same_run
from test_natural_clients import write_leaf
from test_population import assert_same_csvs

from fedrun.command.build import federated_run
from fedrun.errors import Interrupted
from fedrun.harness.federated_run import FederatedRun
from fedrun.harness.simulation import run_alone, simulate_runs

# Six writers (training, test images); 5 of the 6 a round, enough for Krum's m > 2f + 2 = 4.
WRITERS = {f"f{i:04d}_{i:02d}": (6 + 2 * i, 1 + i % 3) for i in range(6)}
# FedBN needs a model with BatchNorm, another architecture than the population's MLP (its population
# runs are in test_population.py's personalized population).
AGGREGATORS = sorted(p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml") if p.stem != "fedbn")


@pytest.fixture(scope="module")
def leaf(tmp_path_factory):
    return write_leaf(tmp_path_factory.mktemp("leaf"), WRITERS)


def base(root):
    return ["dataset=femnist", f"dataset.load.root={root}", "partition=natural", "model=mlp", "model.hidden=[8]",
            "hyperparams.num_clients=6", "hyperparams.client_fraction=0.84", "hyperparams.rounds=2",
            "hyperparams.batch_size=4", "progress=false", "device=cpu"]


def build(root, overrides, run_dir, datasets=None, **kwargs):
    return federated_run(compose(base(root) + overrides), run_dir, {}, list(overrides), datasets, **kwargs)


@pytest.mark.slow
def test_every_aggregator_on_natural_clients_in_a_population_equals_the_sequential_engine(leaf, tmp_path):
    """Every aggregator's run on FEMNIST's writers, trained as one population (the batched engine),
    writes what the run writes alone on the sequential engine, per-client accuracies included."""
    datasets = {}
    members = [[f"aggregator={name}", f"seed={n % 3}"] for n, name in enumerate(AGGREGATORS)]
    runs = [build(leaf, o, tmp_path / f"pop{n}", datasets, batched=True) for n, o in enumerate(members)]
    outcomes = simulate_runs(runs, progress=False)
    assert all(isinstance(o, dict) for o in outcomes), outcomes
    for n, overrides in enumerate(members):
        run_alone(build(leaf, [*overrides, "engine=sequential"], tmp_path / f"alone{n}"), progress=False)
        assert_same_csvs(tmp_path / f"alone{n}", tmp_path / f"pop{n}", rtol=1e-5)
        rounds = pd.read_csv(tmp_path / f"pop{n}" / "rounds.csv")
        clients = pd.read_csv(tmp_path / f"pop{n}" / "clients.csv")
        assert rounds["client_acc_mean"].notna().all(), AGGREGATORS[n]
        assert clients.groupby("round")["own_test_acc"].count().tolist() == [5, 5], AGGREGATORS[n]


@pytest.mark.slow
def test_an_interrupted_natural_run_resumes_byte_for_byte(leaf, tmp_path, monkeypatch):
    overrides = ["aggregator=fedlayerwise", "hyperparams.rounds=4", "client_eval_every=2"]
    run_alone(build(leaf, overrides, tmp_path / "straight"), progress=False)
    record = FederatedRun.record

    def stop_in_round_3(run, r):  # rounds 1-2 recorded and checkpointed
        if r.round == 3:
            raise KeyboardInterrupt
        return record(run, r)

    monkeypatch.setattr(FederatedRun, "record", stop_in_round_3)
    with pytest.raises(Interrupted):
        run_alone(build(leaf, overrides, tmp_path / "cut"), progress=False)
    monkeypatch.setattr(FederatedRun, "record", record)
    assert torch.load(tmp_path / "cut" / "checkpoint.pt")["round"] == 2
    run_alone(build(leaf, [*overrides, "resume=true"], tmp_path / "cut"), progress=False)
    same_run(tmp_path / "straight", tmp_path / "cut")
    rounds = pd.read_csv(tmp_path / "cut" / "rounds.csv")
    assert rounds["client_acc_mean"].notna().tolist() == [False, True, False, True]


def test_the_cost_benchmark_runs_both_settings_side_by_side(capsys, tmp_path, monkeypatch):
    """It prints both settings' figures and leaves nothing behind in the temporary folder."""
    import tempfile

    import bench_client_eval  # scripts/bench/ is on the tests' path (pyproject.toml: pythonpath)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert bench_client_eval.main(["--writers", "6", "--train", "8", "--test", "3", "--rounds", "2",
                                   "--repeat", "1", "--model", "mlp", "--fraction", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "3 a round" in out and "per-client pass 9 images a round" in out
    assert "fedavg, client_eval_every=0: eval_s" in out and "fedavg, client_eval_every=1 (the sampled clients): eval_s" in out
    assert "per-client accuracy adds" in out and "FedPer" not in out
    assert list(tmp_path.iterdir()) == []  # its data and runs removed
    # --personal: every client scored, with FedAvg's model and with FedPer's and Ditto's personal models too
    assert bench_client_eval.main(["--writers", "6", "--train", "8", "--test", "3", "--rounds", "2",
                                   "--repeat", "1", "--model", "mlp", "--fraction", "0.5", "--personal"]) == 0
    out = capsys.readouterr().out
    for line in ("fedavg, every client scored: eval_s", "fedper, every client scored (+ personal models): eval_s",
                 "ditto, every client scored (+ personal models): eval_s", "with FedPer's personal models"):
        assert line in out, line
    assert list(tmp_path.iterdir()) == []
