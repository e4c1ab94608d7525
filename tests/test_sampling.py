"""Which clients a round asks (``hyperparams.sampling``): uniform, by data size, and only the
reachable ones (a seeded availability or a CSV trace); each drawn from (seed, round), so every
aggregator is asked the same clients, and whole runs from the CLI."""
from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest
from conftest import TINY, fedrun_ok, run_fedrun

from fedrun.client.participation import Participation, read_trace
from fedrun.errors import ConfigError, DataError
from fedrun.seeding import sample_clients


def test_uniform_is_the_papers_draw():
    sizes = [10] * 50
    for t in (1, 2, 7):
        assert Participation().sample(3, t, sizes, 10) == sample_clients(3, t, 50, 10)
    assert Participation().sample(3, 1, sizes, 50) == list(range(50))


def test_size_sampling_draws_clients_in_proportion_to_their_data():
    # Client 0 holds 91% of the data: drawn in nearly every round of one; the others by their share.
    sizes = [900] + [10] * 9
    drawn = Counter(k for t in range(1, 2001) for k in Participation(sampling="size").sample(0, t, sizes, 1))
    assert 0.88 < drawn[0] / 2000 < 0.94  # expected 900 / 990 = 0.909
    assert sum(drawn.values()) == 2000 and set(drawn) <= set(range(10))
    # Without replacement: m distinct clients, never one without examples.
    for t in range(1, 50):
        picked = Participation(sampling="size").sample(1, t, [0, 5, 5, 5, 100], 3)
        assert len(set(picked)) == 3 and 0 not in picked and picked == sorted(picked)
    assert Participation(sampling="size").sample(1, 1, [0, 0, 5], 2) == [2]  # only one client can be drawn


def test_poisson_sampling_asks_each_client_with_probability_m_over_k():
    """Each client in each round independently with q = m/K: every client about q of the rounds,
    the round's size binomial(K, q) (mean m, variance m (1 - q)), sometimes no client at all."""
    p = Participation(sampling="poisson")
    rounds = [p.sample(0, t, [1] * 100, 10) for t in range(1, 2001)]
    sizes = [len(r) for r in rounds]
    mean = sum(sizes) / len(sizes)
    var = sum((n - mean) ** 2 for n in sizes) / (len(sizes) - 1)
    assert 9.7 < mean < 10.3 and 7.5 < var < 10.5  # binomial(100, 0.1): mean 10, variance 9
    drawn = Counter(k for r in rounds for k in r)
    assert set(drawn) == set(range(100)) and all(140 < c < 260 for c in drawn.values())  # 200 expected
    assert all(r == sorted(set(r)) for r in rounds) and p.sample(0, 7, [1] * 100, 10) == rounds[6]
    assert p.sample(1, 7, [1] * 100, 10) != rounds[6]  # another seed, another draw
    tiny = [len(p.sample(0, t, [1] * 20, 1)) for t in range(1, 201)]  # q = 1/20: many rounds ask nobody
    assert tiny.count(0) > 40


def test_a_poisson_round_without_clients_keeps_the_model(tmp_path):
    """A round that asks nobody trains nothing: rounds.csv says 0 clients and the model stays w_t
    (FedAvg: one model, so the round's test loss is the previous round's)."""
    run = tmp_path / "run"
    fedrun_ok([*TINY, "aggregator=fedavg", "hyperparams.num_clients=20", "hyperparams.client_fraction=0.05", "hyperparams.sampling=poisson",
               "hyperparams.rounds=6", f"hydra.run.dir={run}"], tmp_path)
    rounds = pd.read_csv(run / "rounds.csv")
    assert 0 in set(rounds["clients"]) and rounds["clients"].max() >= 1
    for t in rounds.index[rounds["clients"] == 0]:
        if t > 0:  # the same model as the round before
            assert rounds.loc[t, "test_loss"] == rounds.loc[t - 1, "test_loss"]


def test_seeded_availability_is_a_bernoulli_draw_per_round():
    p = Participation(sampling="available", availability=0.3)
    reach = [len(p.reachable(0, t, 1000)) for t in range(1, 21)]
    assert all(240 < r < 360 for r in reach)  # about 300 of 1,000 each round
    assert p.reachable(0, 5, 1000) == p.reachable(0, 5, 1000) != p.reachable(0, 6, 1000)
    asked = p.sample(0, 5, [1] * 1000, 10)
    assert len(asked) == 10 and set(asked) <= set(p.reachable(0, 5, 1000))
    few = Participation(sampling="available", availability=0.001)  # a round of one reachable client, or none
    for t in range(1, 30):
        assert 1 <= len(few.sample(2, t, [1] * 20, 5)) <= 5


def test_a_trace_says_who_is_reachable_and_repeats(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("round,client\n1,0\n1,3\n2,1\n3,2\n3,3\n3,4\n")
    p = Participation(sampling="available", availability=str(trace))
    assert read_trace(trace) == {1: [0, 3], 2: [1], 3: [2, 3, 4]}
    assert [p.sample(0, t, [1] * 5, 5) for t in (1, 2, 3, 4, 5)] == [[0, 3], [1], [2, 3, 4], [0, 3], [1]]
    two = p.sample(0, 3, [1] * 5, 2)
    assert len(two) == 2 and set(two) <= {2, 3, 4}
    with pytest.raises(ConfigError, match=r"lists client 4, but there are K = 4 clients \(0 .. 3\)"):
        p.check_clients(4)


@pytest.mark.parametrize("text,expected", [
    ("client,when\n0,1\n", "needs the columns round and client (it has: client, when)"),
    ("round,client\n1,a\n", "line 2: round and client must be integers (got '1', 'a')"),
    ("round,client\n0,1\n", "line 2: rounds count from 1 and clients from 0 (got round 0, client 1)"),
    ("round,client\n1,0\n3,0\n", "round 2 lists no client"),
    ("round,client\n", "lists no client"),
])
def test_a_bad_trace_is_one_line_naming_it(tmp_path, text, expected):
    trace = tmp_path / "trace.csv"
    trace.write_text(text)
    with pytest.raises(DataError) as e:
        Participation(sampling="available", availability=str(trace))
    assert expected in str(e.value) and str(trace) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs,expected", [
    (dict(sampling="random"), "hyperparams.sampling=random: must be one of uniform, poisson, size, available"),
    (dict(availability=0.5), "hyperparams.availability=0.5: is read only with hyperparams.sampling=available"),
    (dict(sampling="available"), "hyperparams.availability=None: must be a probability in (0, 1] or the path"),
    (dict(sampling="available", availability=1.5), "must be a probability in (0, 1] (each client's chance"),
    (dict(sampling="available", availability="none.csv"), "hyperparams.availability: none.csv not found"),
])
def test_sampling_settings_are_checked(kwargs, expected):
    with pytest.raises((ConfigError, DataError)) as e:
        Participation(**kwargs)
    assert expected in str(e.value)


def test_whole_runs_ask_the_sampled_clients(tmp_path):
    """From the CLI: sampling=size asks m clients a round, the same ones for every method; a trace
    limits each round to its reachable clients (the rounds.csv ``clients`` column)."""
    runs = {}
    for method in ("fedavg", "fedprox"):
        run = tmp_path / method
        fedrun_ok([*TINY, "hyperparams.num_clients=8", "hyperparams.client_fraction=0.25", "hyperparams.sampling=size",
                   "partition=dirichlet", f"aggregator={method}", f"hydra.run.dir={run}"], tmp_path)
        runs[method] = pd.read_csv(run / "clients.csv")
    assert (runs["fedavg"]["client"] == runs["fedprox"]["client"]).all()
    assert set(runs["fedavg"].groupby("round")["client"].count()) == {2}
    trace = tmp_path / "trace.csv"
    trace.write_text("round,client\n1,0\n2,1\n2,2\n2,3\n")
    fedrun_ok([*TINY, "hyperparams.sampling=available", f"hyperparams.availability={trace}",
               f"hydra.run.dir={tmp_path / 'trace'}"], tmp_path)
    assert list(pd.read_csv(tmp_path / "trace" / "rounds.csv")["clients"]) == [1, 2]  # round 2: 2 of 3 reachable
    bad = run_fedrun([*TINY, "hyperparams.sampling=available", f"hyperparams.availability={trace}",
                      "hyperparams.num_clients=3", f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path)
    assert bad.returncode == 2 and "lists client 3, but there are K = 3 clients" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_a_run_from_before_sampling_existed_resumes(tmp_path):
    """A run made before ``hyperparams.sampling`` existed (its config.yaml without the setting) resumes:
    the setting at ``uniform`` is what that run ran; any other value is a difference, refused."""
    run = tmp_path / "run"
    args = [*TINY, f"hydra.run.dir={run}"]
    fedrun_ok(args, tmp_path)
    config = run / "config.yaml"
    old = "\n".join(line for line in config.read_text().splitlines()
                    if not line.strip().startswith(("sampling:", "availability:")))
    config.write_text(old + "\n")
    fedrun_ok([*args, "resume=true"], tmp_path)
    refused = run_fedrun([*args, "resume=true", "hyperparams.sampling=size"], tmp_path)
    assert refused.returncode == 2 and "the settings differ from the run's config.yaml in: hyperparams" in refused.stderr
