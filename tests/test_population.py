"""Populations (:mod:`fedrun.harness.population`, ``hydra/launcher=population``): runs trained together
write the CSVs each run writes alone on the batched engine."""
from __future__ import annotations

import json
import signal

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import (
    CONF_DIR,
    RESUMABLE,
    compose,
    fedrun_ok,
    run_fedrun,
    same_run,
    start_fedrun,
    tiny_mlp,
    wait_for_rows,
)

from fedrun.harness import population
from fedrun.client.batched import BatchedEngine, Share, train_shares
from fedrun.command.build import federated_run
from fedrun.data.preparation import prepare
from fedrun.data.datasets import synthetic
from fedrun.errors import DivergenceError, Interrupted
from fedrun.diagnostics.evaluation import evaluate, evaluate_stacked
from fedrun.client.local_training import LocalTraining
from fedrun.harness.recorder import TIMING_COLUMNS
from fedrun.client.regularizers import LayerAdaptive, Proximal
from fedrun.harness.simulation import run_alone, simulate_runs

# Small runs: synthetic 8x8 images, 10 clients, 3 a round.
BASE = ["dataset=synthetic", "dataset.load.num_train=300", "dataset.load.num_test=100", "dataset.image_size=8",
        "hyperparams.rounds=3", "hyperparams.num_clients=10", "hyperparams.client_fraction=0.3", "progress=false",
        "device=cpu", "engine=batched", "model=mlp", "model.hidden=[16]"]
# One population of every aggregator family, with what makes runs differ: seeds, client optimizer
# settings, batch size, epochs, stragglers, drop-outs, carried optimizer state, the PD-VL
# reference learner, fewer rounds, evaluation every other round, a validation split's absence.
MEMBERS = {
    "fedavg": ["aggregator=fedavg"],
    "fedprox_stragglers": ["aggregator=fedprox", "aggregator.mu=0.1", "hyperparams.stragglers=0.5",
                           "hyperparams.local_epochs=2", "seed=1"],
    "fedlap": ["aggregator=fedlap", "hyperparams.local_epochs=3", "hyperparams.lr=0.1"],
    "fednnnn": ["aggregator=fednnnn", "hyperparams.batch_size=16", "seed=2"],
    "normnorm_fewer_rounds": ["aggregator=normnorm", "hyperparams.rounds=2", "hyperparams.eval_every=2"],
    "momentum_sgdm": ["aggregator=momentum", "hyperparams.momentum=0.9", "hyperparams.optimizer_state=average",
                      "hyperparams.weight_decay=0.001"],
    "fedadp_dropouts": ["aggregator=fedadp", "hyperparams.dropouts=0.3", "seed=3"],
    "fedlayerwise_adam": ["aggregator=fedlayerwise", "hyperparams.optimizer=adam", "hyperparams.lr=0.001",
                          "hyperparams.optimizer_state=local"],
    "fedadam_vanilla": ["aggregator=fedadam", "vanilla_every=2", "hyperparams.client_fraction=0.5"],
    "fedavgm": ["aggregator=fedavgm", "seed=4"],
    "fedadagrad": ["aggregator=fedadagrad", "hyperparams.local_epochs=2"],
    "fedyogi_nesterov": ["aggregator=fedyogi", "hyperparams.momentum=0.5", "hyperparams.nesterov=true"],
    "median": ["aggregator=median", "seed=5"],
    "trimmed_mean_weighted": ["aggregator=trimmed_mean", "aggregator.beta=0.2", "aggregator.weighted=true",
                              "hyperparams.client_fraction=0.5"],
    "krum": ["aggregator=krum", "hyperparams.client_fraction=0.5"],  # Krum (f=1) needs m > 2f + 2 = 4 a round
    # Control variates for all 10 clients, each round's clients' c - c_k cut into the population's chunks.
    "scaffold_stragglers": ["aggregator=scaffold", "hyperparams.stragglers=0.5", "hyperparams.local_epochs=2",
                            "hyperparams.momentum=0.5", "seed=6"],
    # NIID-Bench's reading: the correction after each momentum step, in the population's shares.
    "scaffold_after_step": ["aggregator=scaffold", "aggregator.correction=after_step", "hyperparams.local_epochs=2",
                            "hyperparams.momentum=0.9"],
    "fednova_momentum": ["aggregator=fednova", "hyperparams.stragglers=0.5", "hyperparams.local_epochs=3",
                         "hyperparams.momentum=0.9", "hyperparams.batch_size=16"],
}
# Every other aggregator of conf/aggregator/ joins with its YAML's defaults (5 clients a round, enough
# for Krum's m > 2f + 2), so a method added as one YAML is in the population test without an edit here.
_COVERED = {o.split("=")[1] for overrides in MEMBERS.values() for o in overrides if o.startswith("aggregator=")}
# The personalized methods train in a population of their own (test_personalized_population_...): an
# MLP with BatchNorm for FedBN to keep is another architecture.
PERSONAL = {name: [f"aggregator={name}", "hyperparams.client_fraction=0.5", "client_test_fraction=0.25",
                   "model.batch_norm=true", f"seed={n}"] for n, name in enumerate(("fedbn", "fedper", "ditto"))}
_COVERED |= set(PERSONAL)
MEMBERS.update({name: [f"aggregator={name}", "hyperparams.client_fraction=0.5"]
                for name in sorted(p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml")) if name not in _COVERED})
CSVS = ("rounds", "layers", "clients", "client_layers", "output_layer", "partition")


def build(overrides, run_dir, datasets=None, **kwargs):
    base = [o for o in BASE if not o.startswith("model")] if any(o.startswith("model=") for o in overrides) else BASE
    return federated_run(compose(base + overrides), run_dir, {}, list(overrides), datasets, **kwargs)


def assert_same_csvs(a, b, rtol=1e-5):
    """Every CSV of two run directories: the same rows and text columns, numbers to ``rtol``
    (the timing columns aside); the same summary keys and checkpoint round."""
    for name in CSVS:
        x, y = (pd.read_csv(d / f"{name}.csv").drop(columns=list(TIMING_COLUMNS), errors="ignore") for d in (a, b))
        assert list(x.columns) == list(y.columns) and x.shape == y.shape, name
        numbers = x.select_dtypes("number").columns
        pd.testing.assert_frame_equal(x.drop(columns=numbers), y.drop(columns=numbers), obj=name)
        np.testing.assert_allclose(x[numbers].to_numpy(float), y[numbers].to_numpy(float), rtol=rtol, atol=1e-7,
                                   equal_nan=True, err_msg=f"{a.name}/{name}.csv")
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert sa.keys() == sb.keys() and sa["rounds"] == sb["rounds"]
    assert torch.load(a / "checkpoint.pt")["round"] == torch.load(b / "checkpoint.pt")["round"]


def population_equals_alone(tmp_path, members, rtol=1e-5):
    """Train ``members`` (override lists) as one population, then each alone: the same CSVs."""
    datasets = {}
    runs = [build(o, tmp_path / f"pop{n}", datasets, batched=True) for n, o in enumerate(members)]
    outcomes = simulate_runs(runs, progress=False)
    assert all(isinstance(o, dict) for o in outcomes), outcomes
    for n, overrides in enumerate(members):
        run_alone(build(overrides, tmp_path / f"alone{n}"), progress=False)
        assert_same_csvs(tmp_path / f"alone{n}", tmp_path / f"pop{n}", rtol=rtol)


# ----------------------------------------------------------------------------- the engine

@pytest.mark.parametrize("capture", ["off", "on"])
def test_train_shares_equals_each_share_alone(capture):
    """Shares of different runs (seeds, learning rates, momentum, Adam, batch sizes, epochs,
    stragglers, FedProx and FedLap, carried optimizer state) in one lock-step call, cut into
    chunks that straddle shares: each share's results are its own call's.  ``capture=on``: the
    static layout, each share's rows padded on their own (fedrun.client.round_plan)."""
    raw = synthetic(num_train=120, num_test=10, channels=1, image_size=4, num_classes=10, seed=3)
    data = prepare(raw, None, None)
    model = tiny_mlp()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {}
    parts = [torch.arange(i, 120, 6) for i in range(6)]  # 20 samples each
    sgdm = LocalTraining(epochs=2, batch_size=8, lr=0.1, momentum=0.9, optimizer_state="local")
    specs = [  # (local, regularizer, seed, clients, epochs, lr, start state)
        (LocalTraining(epochs=2, batch_size=8, lr=0.1), None, 0, [0, 1, 2], None, 0.1, None),
        (LocalTraining(epochs=2, batch_size=5, lr=0.05), Proximal(0.5), 1, [3, 4], [2, 1], 0.05, None),
        (LocalTraining(epochs=3, batch_size=8, lr=0.1), LayerAdaptive(0.5), 2, [0, 5], None, 0.02, None),
        (sgdm, None, 3, [1, 2], None, 0.1, {k: torch.randn(2, *v.shape) * 0.1 for k, v in sgdm.fresh_state(params).items()}),
        (LocalTraining(epochs=1, batch_size=8, lr=0.01, optimizer="adam"), None, 4, [4], None, 0.01, None),
        (LocalTraining(epochs=2, batch_size=8, lr=0.1), None, 5, [3], None, 0.1, None),  # shares the first's cohort
    ]
    shares, alone = [], []
    for n, (local, reg, seed, clients, epochs, lr, start) in enumerate(specs):
        engine = BatchedEngine(model, data.train_x, data.train_y, local, reg, seed, clients_per_step=4, capture=capture)
        start_params = {k: v + 0.01 * n for k, v in params.items()}  # every run has its own w_t
        args = (start_params, buffers, clients, [parts[k] for k in clients], 1 + n % 2, epochs, lr, start)
        shares.append(Share(engine, *args))
        alone.append(engine.train(*args))
    together = train_shares(shares)
    for a, b in zip(alone, together):
        assert a.clients == b.clients and a.steps.tolist() == b.steps.tolist() and a.epochs.tolist() == b.epochs.tolist()
        for k in a.deltas:
            torch.testing.assert_close(b.deltas[k], a.deltas[k], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(b.loss, a.loss)
        assert a.extras.keys() == b.extras.keys()
        for k in a.extras:
            torch.testing.assert_close(b.extras[k], a.extras[k])
        assert (a.opt_states is None) == (b.opt_states is None)
        for k in a.opt_states or {}:
            torch.testing.assert_close(b.opt_states[k], a.opt_states[k], rtol=1e-5, atol=1e-7)
    assert together[1].steps.tolist() == [2 * 4, 4]  # 20 samples in batches of 5, a straggler's one epoch


def test_evaluate_stacked_equals_evaluate(tiny_data):
    """The vmapped evaluation of many models gives each model's own accuracy and loss."""
    models = [tiny_mlp(seed) for seed in range(3)]
    states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
    one = [evaluate(models[0], s, tiny_data.test_x, tiny_data.test_y, 7) for s in states]
    many = evaluate_stacked(models[0], states, tiny_data.test_x, tiny_data.test_y, 3 * 7)
    for (acc, loss), (acc2, loss2) in zip(one, many):
        assert acc == acc2 and loss == pytest.approx(loss2, rel=1e-6)
    assert len({acc for acc, _ in one}) > 1 or len({loss for _, loss in one}) == 3  # distinct models


# ----------------------------------------------------------------------------- whole runs

def test_every_aggregator_has_a_population_member():
    chosen = {o.split("=")[1] for overrides in [*MEMBERS.values(), *PERSONAL.values()] for o in overrides
              if o.startswith("aggregator=")}
    assert len(chosen) >= 15 and chosen == {p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml")}


@pytest.mark.slow
def test_population_equals_runs_alone(tmp_path):
    """Every aggregator, trained in one population, writes each run's CSVs as alone."""
    datasets = {}
    runs = [build(o, tmp_path / f"pop_{name}", datasets, batched=True) for name, o in MEMBERS.items()]
    assert len(datasets) == 1 and all(r.data is runs[0].data for r in runs)  # one copy of the data
    outcomes = simulate_runs(runs, progress=False)
    assert all(isinstance(o, dict) for o in outcomes), outcomes
    for (name, overrides), outcome in zip(MEMBERS.items(), outcomes):
        summary = run_alone(build(overrides, tmp_path / f"alone_{name}"), progress=False)
        assert outcome["rounds"] == summary["rounds"] == (2 if "fewer" in name else 3)
        assert_same_csvs(tmp_path / f"alone_{name}", tmp_path / f"pop_{name}")


def test_a_populations_log_is_in_round_order(tmp_path, caplog):
    """The console's lines: each population round's line, and the runs' "done" lines after the last."""
    import logging

    datasets = {}  # one training set for both
    runs = [build([f"aggregator={name}"], tmp_path / name, datasets, batched=True) for name in ("fedavg", "fedprox")]
    with caplog.at_level(logging.INFO, logger="fedrun"):
        simulate_runs(runs, progress=False)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("population round", "done:"))]
    assert [line.split(":")[0] for line in lines] == ["population round 1", "population round 2",
                                                     "population round 3", "done", "done"]


def test_personalized_population_equals_runs_alone(tmp_path):
    """FedBN, FedPer and Ditto in one population: each client's own layers reach its rows of the
    shared lock-step, and each run writes its CSVs (personal scores included) as alone."""
    population_equals_alone(tmp_path, list(PERSONAL.values()))
    clients = pd.read_csv(tmp_path / "pop0" / "clients.csv")
    assert clients["pers_test_acc"].notna().any()


@pytest.mark.slow
def test_population_of_batchnorm_cnns(tmp_path):
    """A CNN with torch.nn BatchNorm (the fused per-client BatchNorm across runs), two seeds."""
    cnn = ["model=cifar10_cnn", "dataset.channels=3", "dataset.image_size=16", "dataset.load.num_train=200",
           "hyperparams.rounds=2"]
    population_equals_alone(tmp_path, [cnn + ["aggregator=fedavg"], cnn + ["aggregator=fednnnn", "seed=1"]], rtol=1e-4)


@pytest.mark.slow
def test_stacked_evaluation_of_a_population(tmp_path, monkeypatch):
    """The GPU's evaluation path (every run's models in one vmapped pass), here on the CPU: test
    and validation columns, and FedNNNN's two models, as each run evaluates them alone."""
    monkeypatch.setattr(population, "STACKED_EVALUATION", True)
    members = [["aggregator=fednnnn"], ["aggregator=fedavg"], ["aggregator=fedlayerwise", "hyperparams.eval_every=2"]]
    split = ["hyperparams.validation_fraction=0.2", "hyperparams.rounds=2"]
    population_equals_alone(tmp_path, [o + split for o in members])
    rounds = pd.read_csv(tmp_path / "pop0" / "rounds.csv")
    assert rounds[["val_acc", "sent_test_acc", "average_test_acc"]].notna().all().all()


@pytest.mark.slow
def test_a_diverging_run_stops_alone(tmp_path):
    """A run whose model becomes NaN stops with its error and the rounds before it on disk; the
    others finish as if it had never been there."""
    members = [["aggregator=fedavg"], ["aggregator=fedavg", "hyperparams.lr=1e30"], ["aggregator=fednnnn"]]
    datasets = {}
    runs = [build(o, tmp_path / f"pop{n}", datasets, batched=True) for n, o in enumerate(members)]
    outcomes = simulate_runs(runs, progress=False)
    assert isinstance(outcomes[1], DivergenceError), outcomes[1]
    stopped = int(str(outcomes[1]).split(":")[0].removeprefix("round "))  # "round 3: parameter ... is NaN"
    assert not (tmp_path / "pop1" / "summary.json").exists()
    assert len(pd.read_csv(tmp_path / "pop1" / "rounds.csv")) == stopped - 1
    assert torch.load(tmp_path / "pop1" / "checkpoint.pt")["round"] == stopped - 1
    for n in (0, 2):
        run_alone(build(members[n], tmp_path / f"alone{n}"), progress=False)
        assert_same_csvs(tmp_path / f"alone{n}", tmp_path / f"pop{n}")


@pytest.mark.slow
def test_interrupted_population_resumes_identically(tmp_path, monkeypatch):
    """Ctrl-C while the runs record round 2 (one has checkpointed it, the others not): resumed,
    every run ends byte-identical to an uninterrupted population."""
    members = [MEMBERS["fedavg"], MEMBERS["momentum_sgdm"], MEMBERS["fedlayerwise_adam"]]
    datasets = {}
    whole = [build(o, tmp_path / f"whole{n}", datasets, batched=True) for n, o in enumerate(members)]
    simulate_runs(whole, progress=False)

    from fedrun.harness.federated_run import FederatedRun
    record = FederatedRun.record

    def interrupt(self, r):
        if r.round == 2 and self.run_dir.name == "cut1":
            raise KeyboardInterrupt
        record(self, r)

    monkeypatch.setattr(FederatedRun, "record", interrupt)
    cut = [build(o, tmp_path / f"cut{n}", datasets, batched=True) for n, o in enumerate(members)]
    with pytest.raises(Interrupted):
        simulate_runs(cut, progress=False)
    monkeypatch.setattr(FederatedRun, "record", record)
    done = [torch.load(tmp_path / f"cut{n}" / "checkpoint.pt")["round"] for n in range(3)]
    assert done == [2, 1, 1]  # interrupted in run 1's record: run 0 had recorded round 2
    resumed = [federated_run(compose(BASE + o + ["resume=true"]), tmp_path / f"cut{n}", {}, list(o), datasets,
                             batched=True) for n, o in enumerate(members)]
    assert all(isinstance(o, dict) for o in simulate_runs(resumed, progress=False))
    for n in range(3):
        assert_same_csvs(tmp_path / f"whole{n}", tmp_path / f"cut{n}", rtol=0)
        for name in CSVS:
            if name != "rounds":
                assert (tmp_path / f"whole{n}" / f"{name}.csv").read_bytes() == \
                       (tmp_path / f"cut{n}" / f"{name}.csv").read_bytes()


# ----------------------------------------------------------------------------- the launcher

@pytest.mark.slow
def test_population_launcher_sweep(tmp_path):
    """``hydra/launcher=population``: jobs grouped by data, model and engine (at most
    ``max_runs`` a population), a sequential-engine job and a lone job run as usual, a diverging
    job listed at the end with a non-zero exit, the others' results those of the basic launcher."""
    sweep = ["-m", *[o for o in BASE if o != "engine=batched"], "hyperparams.rounds=2",
             "aggregator=fedavg,fednnnn", "hyperparams.lr=0.05,1e30", "engine=batched,sequential"]
    proc = run_fedrun(sweep + ["hydra/launcher=population", "hydra.launcher.max_runs=3",
                               f"hydra.sweep.dir={tmp_path / 'pop'}"], tmp_path, timeout=300)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    # Jobs 0-7: (fedavg, fednnnn) x (0.05, 1e30) x (batched, sequential), the last setting fastest.
    assert "population of 3 runs (jobs 0, 2, 4)" in err and "job 6 runs alone: no other job" in err
    assert "job 1 runs alone: engine=sequential" in err
    failed = [line for line in err.splitlines() if line.startswith("fedrun: error: job ")]
    assert [line.split(":")[2].strip() for line in failed] == ["job 2", "job 3", "job 6", "job 7"]
    assert "4 job(s) of the sweep failed" in err
    for job, aggregator in ((0, "fedavg"), (4, "fednnnn")):  # lr=0.05 on the batched engine
        run_alone(build(["hyperparams.rounds=2", f"aggregator={aggregator}"], tmp_path / f"alone{job}"), progress=False)
        assert_same_csvs(tmp_path / f"alone{job}", tmp_path / "pop" / str(job))
    assert (tmp_path / "pop" / "1" / "summary.json").is_file()  # a sequential job, run alone


def test_the_launcher_survives_hydras_plugin_scan():
    """Hydra's scan executes a plugin module before putting it in sys.modules (an installed wheel,
    or a run from the checkout's root): the module must import that way."""
    import importlib.util

    from conftest import REPO_ROOT

    path = REPO_ROOT / "hydra_plugins" / "fedrun_population_launcher" / "population_launcher.py"
    spec = importlib.util.spec_from_file_location("hydra_plugins_scan_check.population_launcher", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # as hydra.core.plugins._scan_all_plugins does
    assert module.PopulationLauncherConf().max_runs is None


@pytest.mark.slow
def test_killed_population_sweep_resumes_identically(tmp_path):
    """SIGKILL a population sweep (checkpoints every other round) mid-run, then run the same sweep
    with ``resume=true``: every run finishes with the CSVs, summary and checkpoint of the
    uninterrupted sweep (checkpoints every round; timing aside)."""
    sweep = ["-m", *RESUMABLE, "engine=batched", "seed=0,1", "hydra/launcher=population"]
    fedrun_ok(sweep + [f"hydra.sweep.dir={tmp_path / 'straight'}"], tmp_path, timeout=300)
    killed = tmp_path / "killed"
    proc = start_fedrun(sweep + [f"hydra.sweep.dir={killed}", "checkpoint_every=2"], tmp_path)
    try:
        wait_for_rows(proc, killed / "1" / "rounds.csv", 3)  # both runs past round 2's checkpoint
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    done = [torch.load(killed / str(job) / "checkpoint.pt", weights_only=False)["round"] for job in (0, 1)]
    assert done in ([2, 2], [4, 2], [4, 4]) and not (killed / "0" / "summary.json").exists()
    fedrun_ok(sweep + [f"hydra.sweep.dir={killed}", "checkpoint_every=2", "resume=true"], tmp_path, timeout=300)
    for job in ("0", "1"):
        same_run(tmp_path / "straight" / job, killed / job)
        a = torch.load(tmp_path / "straight" / job / "checkpoint.pt", weights_only=False)
        b = torch.load(killed / job / "checkpoint.pt", weights_only=False)
        assert a["round"] == b["round"] == 5 and all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
