"""Unreliable clients (FedLap sec. V.C): stragglers and drop-outs, drawn from (seed, round).

Then the angle rules and FedLap end to end: :func:`fedrun.harness.simulation.simulate` as a library (to
see which clients the engine trains) and ``python -m fedrun`` (the CSV columns).
"""
from __future__ import annotations

import functools
import math

import pandas as pd
import pytest
import torch
from conftest import TINY, on_partition, run_fedrun, tiny_mlp

from fedrun import aggregators as A
from fedrun.data import partition as P
from fedrun.errors import ConfigError
from fedrun.client.local_training import LocalTraining
from fedrun.params import split_state
from fedrun.client.participation import Participation
from fedrun.seeding import sample_clients
from fedrun.client.sequential import SequentialEngine
from fedrun.harness.federated_run import Federation
from fedrun.harness.simulation import simulate

POOL = list(range(3, 23))  # 20 sampled client ids (not starting at 0, to catch index/id mix-ups)


def half_up(x: float) -> int:
    return math.floor(x + 0.5)


# ----------------------------------------------------------------------------- stragglers

def test_no_stragglers_no_dropouts():
    active, epochs, dropped, slow = Participation().draw(0, 1, POOL, 5)
    assert active == POOL and epochs == [5] * 20 and dropped == [] and slow == set()
    active, epochs, dropped, slow = Participation(stragglers=0.0, dropouts=0.0).draw(7, 3, POOL, 2)
    assert (active, epochs, dropped, slow) == (POOL, [2] * 20, [], set())


def test_straggler_epochs_in_range_and_reproducible():
    part = Participation(stragglers=1.0)
    seen = set()
    for t in range(1, 6):
        active, epochs, dropped, slow = part.draw(0, t, POOL, 5)
        assert active == POOL and dropped == [] and slow == set(POOL)  # everyone straggles
        assert all(1 <= e <= 5 for e in epochs)
        assert part.draw(0, t, POOL, 5) == (active, epochs, dropped, slow)  # same (seed, round)
        seen.update(epochs)
    assert seen == {1, 2, 3, 4, 5}  # 100 uniform draws in [1, 5] hit every value
    # E = 1: a straggler can only run the one epoch.
    assert part.draw(0, 1, POOL, 1)[1] == [1] * 20


def test_straggler_count_and_non_stragglers_run_E():
    # round(0.5 * 20) = 10 stragglers, round(0.25 * 20) = 5 (half up), round(0.33 * 20) = 7.
    for fraction, count in ((0.5, 10), (0.25, 5), (0.33, 7), (0.02, 0), (0.025, 1)):
        active, epochs, dropped, slow = Participation(stragglers=fraction).draw(1, 2, POOL, 4)
        assert len(slow) == count == half_up(fraction * 20)
        assert slow <= set(active)
        for c, e in zip(active, epochs):
            assert e == 4 if c not in slow else 1 <= e <= 4


def test_rounds_and_seeds_redraw():
    part = Participation(stragglers=0.5, dropouts=0.25)
    draws = [part.draw(0, t, POOL, 5) for t in range(1, 6)]
    assert len({frozenset(d[3]) for d in draws}) > 1  # different stragglers across rounds
    assert len({tuple(d[2]) for d in draws}) > 1  # different drop-outs across rounds
    other_seed = [part.draw(1, t, POOL, 5) for t in range(1, 6)]
    assert other_seed != draws
    assert [part.draw(0, t, POOL, 5) for t in range(1, 6)] == draws  # same seed: identical
    # A straggler's epochs are redrawn every round too (everyone straggles here, E = 5).
    everyone = Participation(stragglers=1.0)
    epochs = [everyone.draw(0, t, POOL, 5)[1] for t in range(1, 4)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert everyone.draw(1, 1, POOL, 5)[1] != epochs[0]  # and with the seed


def test_a_straggler_draws_its_epochs_from_seed_round_and_client():
    # The epochs of client c in round t derive from (seed, round, c), not from its position in the
    # pool: the same client straggles the same way whoever else was sampled or dropped.
    part = Participation(stragglers=1.0)
    _, full, _, _ = part.draw(0, 3, POOL, 5)
    _, sub, _, _ = part.draw(0, 3, [7, 12], 5)
    assert sub == [full[POOL.index(7)], full[POOL.index(12)]]


# ----------------------------------------------------------------------------- drop-outs

@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.25, 0.5])
def test_dropout_counts(fraction):
    for m in range(1, 13):
        if half_up(fraction * m) >= m:
            continue  # everyone would drop: see test_dropouts_below_one_leave_a_reporting_client
        pool = POOL[:m]
        active, epochs, dropped, slow = Participation(dropouts=fraction).draw(0, 1, pool, 3)
        assert len(dropped) == half_up(fraction * m), (m, dropped)
        # The sampled clients split into the reporting ones and the dropped ones, in order.
        assert sorted(active + dropped) == pool and not set(active) & set(dropped)
        assert active == [c for c in pool if c not in dropped] and dropped == sorted(dropped)
        assert len(epochs) == len(active) and slow == set()


def test_dropouts_do_not_depend_on_stragglers():
    a = Participation(stragglers=0.0, dropouts=0.3).draw(5, 4, POOL, 3)
    b = Participation(stragglers=0.9, dropouts=0.3).draw(5, 4, POOL, 3)
    assert a[2] == b[2] and a[0] == b[0]
    assert len(b[3]) == half_up(0.9 * 14)  # stragglers among the 20 - 6 reporting clients


@pytest.mark.parametrize("m,fraction", [(1, 0.5), (2, 0.75), (4, 0.9), (10, 0.95)])
def test_dropouts_below_one_leave_a_reporting_client(m, fraction):
    active, _, dropped, _ = Participation(dropouts=fraction).draw(0, 1, POOL[:m], 2)
    assert len(active) >= 1, f"m={m}, dropouts={fraction}: all {len(dropped)} clients dropped"


@pytest.mark.parametrize("kwargs,setting", [
    ({"stragglers": -0.1}, "hyperparams.stragglers"), ({"stragglers": 1.1}, "hyperparams.stragglers"),
    ({"dropouts": 1.0}, "hyperparams.dropouts"), ({"dropouts": -0.5}, "hyperparams.dropouts"),
])
def test_bad_fractions(kwargs, setting):
    with pytest.raises(ConfigError) as err:
        Participation(**kwargs)
    assert err.value.setting == setting


def test_sampled_clients_do_not_depend_on_participation():
    # sample_clients(seed, round, K, m) comes first; participation only splits that sample.
    for t in range(1, 6):
        sampled = sample_clients(0, t, 50, 20)
        for part in (Participation(), Participation(0.5, 0.0), Participation(0.0, 0.4), Participation(0.9, 0.9)):
            active, _, dropped, _ = part.draw(0, t, sampled, 3)
            assert sorted(active + dropped) == sampled


# ----------------------------------------------------------------------------- through the engine

def test_straggler_steps_through_the_engine(tiny_data):
    # n_k = 10, 23, 27 with B = 7: ceil(n_k / 7) = 2, 4, 4 steps an epoch.
    split = [range(0, 10), range(10, 33), range(33, 60)]
    model = tiny_mlp(0)
    engine = on_partition(SequentialEngine, model, tiny_data.train_x, tiny_data.train_y,
                              [torch.tensor(list(r)) for r in split],
                              LocalTraining(epochs=3, batch_size=7, lr=0.1), None, seed=0)
    params, buffers = split_state(model)
    res = engine.train(params, buffers, [0, 1, 2], round_=1, epochs=[1, 3, 2])
    assert res.epochs.tolist() == [1, 3, 2]
    assert res.steps.tolist() == [1 * 2, 3 * 4, 2 * 4] == [e * math.ceil(n / 7) for e, n in ((1, 10), (3, 23), (2, 27))]
    # A 1-epoch straggler's update is the first epoch of the full run: same batches, same start.
    full = engine.train(params, buffers, [0], round_=1, epochs=[1])
    for k in params:
        assert torch.equal(full.deltas[k][0], res.deltas[k][0])
    # epochs=None is E for everyone.
    assert engine.train(params, buffers, [0], round_=1).steps.tolist() == [3 * 2]


# ----------------------------------------------------------------------------- simulate (library)

K, M, E = 6, 3, 3  # 6 clients of 10 samples, 3 a round, 3 local epochs, B = 5: 2 steps an epoch


def simulate_recording(run_dir, data, monkeypatch, participation, aggregator=None, rounds=4):
    """simulate() with the engine's train() calls recorded: [(round, clients, epochs)]."""
    calls = []
    original = SequentialEngine.train

    def spy(self, params, buffers, clients, indices, round_, epochs=None, *args):
        calls.append((round_, list(clients), None if epochs is None else list(epochs)))
        return original(self, params, buffers, clients, indices, round_, epochs, *args)

    monkeypatch.setattr(SequentialEngine, "train", spy)
    simulate(run_dir, data, functools.partial(tiny_mlp, 0), functools.partial(P.iid),
             aggregator or A.fedadp(), LocalTraining(epochs=E, batch_size=5, lr=0.1),
             Federation(rounds=rounds, num_clients=K, client_fraction=M / K), participation,
             seed=0, progress=False)
    return calls


def test_dropped_clients_never_train(tmp_path, tiny_data, monkeypatch):
    part = Participation(stragglers=0.5, dropouts=0.34)  # round(0.34 * 3) = 1 dropped, 1 straggler of 2
    calls = simulate_recording(tmp_path / "run", tiny_data, monkeypatch, part)
    clients = pd.read_csv(tmp_path / "run" / "clients.csv")
    assert [c[0] for c in calls] == [1, 2, 3, 4]
    for t, trained, epochs in calls:
        sampled = sample_clients(0, t, K, M)
        active, want_epochs, dropped, slow = part.draw(0, t, sampled, E)
        assert trained == active and epochs == want_epochs and len(dropped) == 1
        assert not set(trained) & set(dropped)
        rows = clients[clients["round"] == t].set_index("client")
        assert sorted(rows.index) == sampled
        assert rows.loc[dropped, "dropped"].tolist() == [1] and rows.loc[trained, "dropped"].tolist() == [0, 0]
        assert rows.loc[trained, "epochs"].tolist() == want_epochs
        assert rows.loc[trained, "straggler"].tolist() == [int(c in slow) for c in trained]
        # steps = epochs * ceil(10 / 5)
        assert rows.loc[trained, "steps"].tolist() == [2 * e for e in want_epochs]
        assert rows.loc[dropped, ["weight", "loss", "steps", "angle"]].isna().all(axis=None)
    rounds = pd.read_csv(tmp_path / "run" / "rounds.csv")
    assert rounds["dropped"].tolist() == [1] * 4 and rounds["stragglers"].tolist() == [1] * 4
    assert rounds["clients"].tolist() == [2] * 4


def test_participation_leaves_the_sample_and_batches_alone(tmp_path, tiny_data, monkeypatch):
    plain = simulate_recording(tmp_path / "a", tiny_data, monkeypatch, Participation())
    monkeypatch.undo()
    unreliable = simulate_recording(tmp_path / "b", tiny_data, monkeypatch, Participation(0.5, 0.34))
    for (t, a, _), (u, b, _) in zip(plain, unreliable):
        assert t == u and a == sample_clients(0, t, K, M)  # without participation: the whole sample
        assert set(b) < set(a)  # the reporting clients are a subset of the same sample
    # Round 1 starts from the same w_t: a client that trains E epochs in both runs has the same loss.
    ca = pd.read_csv(tmp_path / "a" / "clients.csv").query("round == 1").set_index("client")
    cb = pd.read_csv(tmp_path / "b" / "clients.csv").query("round == 1 and dropped == 0 and epochs == @E")
    for k, row in cb.set_index("client").iterrows():
        assert row["loss"] == ca.loc[k, "loss"]


# ----------------------------------------------------------------------------- end to end (CLI)

# 10 clients of 40 samples, all sampled: round(0.2 * 10) = 2 drop out, round(0.5 * 8) = 4 of the
# other 8 straggle; E = 2 and B = 50, so one step an epoch.
E2E = [*TINY, "hyperparams.num_clients=10", "hyperparams.client_fraction=1.0", "hyperparams.rounds=3",
       "hyperparams.local_epochs=2", "hyperparams.stragglers=0.5", "hyperparams.dropouts=0.2"]
ROUNDS, SAMPLED, DROPPED, REPORTING, STRAGGLERS, LAYERS = 3, 10, 2, 8, 4, 2  # MLP 784-8-10: fc1, fc2


@pytest.fixture(scope="module")
def e2e_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("participation")
    runs = {}
    for agg in ("fedadp", "fedlayerwise", "fedlap"):
        proc = run_fedrun([*E2E, f"aggregator={agg}", f"hydra.run.dir={tmp}/{agg}"], tmp, timeout=180)
        assert proc.returncode == 0, f"{agg}:\n{proc.stderr[-3000:]}"
        runs[agg] = tmp / agg
    return runs


def read(run, name):
    return pd.read_csv(run / name)


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["fedadp", "fedlayerwise", "fedlap"])
def test_e2e_clients_csv(e2e_runs, agg):
    run = e2e_runs[agg]
    rounds = read(run, "rounds.csv")
    assert rounds["round"].tolist() == [1, 2, 3]
    assert rounds["dropped"].tolist() == [DROPPED] * ROUNDS
    assert rounds["stragglers"].tolist() == [STRAGGLERS] * ROUNDS
    assert rounds["clients"].tolist() == [REPORTING] * ROUNDS and rounds["skipped"].tolist() == [0] * ROUNDS
    clients = read(run, "clients.csv")
    assert len(clients) == ROUNDS * SAMPLED
    dropped, rep = clients[clients["dropped"] == 1], clients[clients["dropped"] == 0]
    assert dropped.groupby("round").size().tolist() == [DROPPED] * ROUNDS
    assert dropped[["weight", "loss", "steps", "epochs", "angle", "straggler"]].isna().all(axis=None)
    assert rep.groupby("round")["straggler"].sum().tolist() == [STRAGGLERS] * ROUNDS
    assert rep["epochs"].between(1, 2).all()
    assert (rep.loc[rep["straggler"] == 0, "epochs"] == 2).all()
    assert (rep["steps"] == rep["epochs"]).all()  # ceil(40 / 50) = 1 step an epoch
    assert rep["angle"].between(0, math.pi).all()
    assert rep.groupby("round")["weight"].sum().tolist() == pytest.approx([1.0] * ROUNDS, abs=1e-6)
    assert (rep["weight"] > 0).all()
    if agg == "fedadp":
        assert rep["smoothed_angle"].notna().all()
    else:
        assert clients["smoothed_angle"].isna().all()  # per layer only (client_layers.csv)
    if agg == "fedlap":
        assert rep[["reg_loss", "lambda_mean"]].notna().all(axis=None)
        assert (rep["reg_loss"] >= 0).all() and rep["lambda_mean"].between(0, 2).all()
        one = rep[rep["epochs"] == 1]  # lambda = 0 in the first epoch: nothing to regularize
        assert (one["lambda_mean"] == 0).all() and (one["reg_loss"] == 0).all()
        assert (rep.loc[rep["epochs"] == 2, "lambda_mean"] > 0).all()
    else:
        assert clients[["reg_loss", "lambda_mean"]].isna().all(axis=None)


@pytest.mark.slow
@pytest.mark.parametrize("agg", ["fedadp", "fedlayerwise", "fedlap"])
def test_e2e_client_layers_csv(e2e_runs, agg):
    run = e2e_runs[agg]
    cl = read(run, "client_layers.csv")
    clients = read(run, "clients.csv")
    rep = clients[clients["dropped"] == 0]
    assert len(cl) == ROUNDS * REPORTING * LAYERS
    assert cl["layer"].unique().tolist() == ["fc1", "fc2"]
    # Only reporting clients appear, each with every layer.
    assert sorted(map(tuple, cl[["round", "client"]].drop_duplicates().values.tolist())) == \
        sorted(map(tuple, rep[["round", "client"]].values.tolist()))
    assert cl["angle"].between(0, math.pi).all()
    per_layer = cl.groupby(["round", "layer"])["weight"].sum()
    assert per_layer.tolist() == pytest.approx([1.0] * ROUNDS * LAYERS, abs=1e-6)
    if agg == "fedlayerwise":
        assert cl["smoothed_angle"].notna().all()
        # clients.csv's weight is the client's mean weight over the layers.
        mean = cl.groupby(["round", "client"])["weight"].mean()
        assert rep.set_index(["round", "client"])["weight"].tolist() == \
            pytest.approx(mean.loc[list(map(tuple, rep[["round", "client"]].values))].tolist(), abs=1e-7)
    else:
        assert cl["smoothed_angle"].isna().all()
        # One weight per client, the same for every layer.
        assert (cl.groupby(["round", "client"])["weight"].nunique() == 1).all()


@pytest.mark.slow
@pytest.mark.parametrize("agg,table,keys", [
    ("fedadp", "clients.csv", ["client"]),
    ("fedlayerwise", "client_layers.csv", ["client", "layer"]),
])
def test_e2e_smoothing_is_the_mean_over_the_rounds_a_client_reported(e2e_runs, agg, table, keys):
    # Eq. 4 unrolled: the smoothed angle after a client's t-th participation is the mean of its t
    # instantaneous angles; rounds where it dropped out do not count.
    df = read(e2e_runs[agg], table)
    df = df[df["angle"].notna()].sort_values("round")
    late = 0
    for _, group in df.groupby(keys):
        expected = group["angle"].expanding().mean()
        assert group["smoothed_angle"].tolist() == pytest.approx(expected.tolist(), rel=2e-7, abs=1e-7)
        late += group["round"].tolist() != list(range(1, len(group) + 1))
    # Some client reported after missing an earlier round (2 of 10 drop out each round); there a
    # smoothing with t = the round number, not the client's count, would fail the check above.
    assert late > 0


@pytest.mark.slow
def test_e2e_everyone_dropped_still_completes(tmp_path):
    # TINY: 2 clients a round; dropouts=0.9 would drop round(1.8) = 2, capped at 1: one reports.
    proc = run_fedrun([*TINY, "aggregator=fedadp", "hyperparams.dropouts=0.9",
                       "hyperparams.stragglers=0.5", f"hydra.run.dir={tmp_path}/run"], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    rounds = read(run, "rounds.csv")
    assert rounds["round"].tolist() == [1, 2]
    assert (rounds["clients"] + rounds["dropped"]).tolist() == [2, 2]
    assert rounds["test_acc"].notna().all()
    empty = rounds[rounds["clients"] == 0]
    assert (empty["skipped"] == 1).all() and (empty["server_step"] == 0).all()
    clients = read(run, "clients.csv")
    assert len(clients) == 4 and clients.loc[clients["dropped"] == 1, "weight"].isna().all()
    assert (run / "summary.json").is_file() and (run / "client_layers.csv").is_file()
