"""Client-level differential privacy (``privacy.*``, :mod:`fedrun.server.privacy`): DP-FedAvg's
clipping, fixed denominator and noise by hand, Andrew et al.'s adaptive clip, the accountant's
epsilon against a published value, FedAvg exactly without noise or clipping, resume, engines and
populations, whole runs from the CLI, and the one-line refusals."""
from __future__ import annotations

import functools
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import (CONF_DIR, TINY, compose, csv_without_wall, fedrun_ok, interrupted_while_recording, run_fedrun,
                      same_run)
from equivalence import assert_whole_runs_agree

from fedrun import aggregators as A
from fedrun.client.batched import BatchedEngine
from fedrun.client.local_training import ClientResults, LocalTraining
from fedrun.client.parallel import ParallelEngine
from fedrun.command.build import build
from fedrun.data import partition as P
from fedrun.data.datasets import synthetic
from fedrun.data.preparation import prepare
from fedrun.errors import ConfigError
from fedrun.harness.federated_run import Federation
from fedrun.harness.simulation import simulate
from fedrun.models.layers import Layer
from fedrun.models.nets import MLP
from fedrun.seeding import torch_generator
from fedrun.server import privacy
from fedrun.server.privacy import Privacy

dp_accounting = pytest.importorskip("dp_accounting", reason="the privacy extra: pip install 'fedrun[privacy]'")

LAYERS = [Layer("w", "fc", ("w",))]
PRIVATE = ["aggregator=fedavg", "aggregator.weighting=uniform"]  # DP-FedAvg's server: the uniform mean


def attach(settings: dict, aggregator=None, num_clients: int = 10, client_fraction: float = 0.3):
    """``aggregator`` (FedAvg, uniform) under ``Privacy(**settings)`` for K clients, C K a round."""
    return Privacy(**settings).attach(aggregator or A.fedavg("uniform"),
                                      Federation(rounds=5, num_clients=num_clients, client_fraction=client_fraction))


def one_round(agg, deltas: torch.Tensor, state=None, seed: int = 0, t: int = 1, d: int | None = None):
    """One round of ``agg`` on the updates ``deltas`` ``[m, d]`` from w = 0; (outcome, new state)."""
    m, d = deltas.shape
    params = {"w": torch.zeros(d)}
    state = agg.init(params, 10, LAYERS) if state is None else state
    ones = torch.ones(m, dtype=torch.long)
    results = ClientResults(list(range(m)), {"w": deltas}, {}, torch.full((m,), 10), torch.zeros(m, dtype=torch.float64),
                            ones, ones, lr=torch.ones(m, dtype=torch.float64), effective_steps=ones.to(torch.float64))
    return agg.apply(state, params, results, seed=seed, round_=t)


def updates(*norms: float, d: int = 4) -> torch.Tensor:
    """Updates of the given L2 norms, each along its own axis."""
    out = torch.zeros(len(norms), d)
    for k, n in enumerate(norms):
        out[k, k % d] = n
    return out


# ----------------------------------------------------------------------------- the round by hand

def test_clipped_sum_over_the_expected_number_of_clients():
    """McMahan et al. Algorithm 1 with z = 0: norms 0.5, 2, 4 clipped to C = 1 give 0.5, 1, 1; their
    sum over m = qK = 3 is the mean update, and each client's weight is min(1, C/||dw||)/m."""
    agg = attach({"clip": 1.0, "noise_multiplier": 0.0})
    outcome, state = one_round(agg, updates(0.5, 2.0, 4.0))
    torch.testing.assert_close(outcome.average["w"], torch.tensor([0.5, 1.0, 1.0, 0.0]) / 3, rtol=0, atol=1e-7)
    torch.testing.assert_close(outcome.weights, torch.tensor([1 / 3, 1 / 6, 1 / 12], dtype=torch.float64))
    assert outcome.privacy["dp_clip"] == 1.0 and outcome.privacy["dp_noise_std"] == 0.0
    assert outcome.privacy["dp_clipped_fraction"] == pytest.approx(2 / 3)
    assert state["privacy"] == {"clip": 1.0}  # a fixed clip stays
    # N and E stay the raw updates' (the diagnostics compare across methods): E = mean of 0.5, 2, 4.
    assert outcome.stats.E == pytest.approx((0.5 + 2 + 4) / 3)
    # A drop-out: the two updates that came are still divided by the 3 expected (the paper's f~_f).
    outcome, _ = one_round(agg, updates(0.5, 2.0))
    torch.testing.assert_close(outcome.average["w"], torch.tensor([0.5, 1.0, 0.0, 0.0]) / 3, rtol=0, atol=1e-7)


def test_noise_is_z_c_on_the_sum_drawn_from_seed_and_round():
    """Updates of zeros: the mean update is the noise alone, N(0, (z C / m)^2) per coordinate, drawn
    from (seed, round) exactly as fedrun.seeding derives every random choice."""
    z, c, m, d = 2.0, 0.5, 3, 200_000
    agg = attach({"clip": c, "noise_multiplier": z})
    outcome, _ = one_round(agg, torch.zeros(m, d), seed=7, t=4)
    noise = outcome.average["w"]
    expected = torch.randn(d, generator=torch_generator(7, "dp_noise", 4), dtype=torch.float32) * (z * c / m)
    assert torch.equal(noise, expected)
    assert float(noise.std()) == pytest.approx(z * c / m, rel=0.01)  # 200,000 draws: within 1%
    assert abs(float(noise.mean())) < 5 * z * c / m / math.sqrt(d)
    assert outcome.privacy["dp_noise_std"] == z * c
    again, _ = one_round(agg, torch.zeros(m, d), seed=7, t=4)
    other, _ = one_round(agg, torch.zeros(m, d), seed=7, t=5)
    assert torch.equal(again.average["w"], noise) and not torch.equal(other.average["w"], noise)


def test_adaptive_clip_is_andrew_et_als_geometric_update():
    """Andrew et al. Algorithm 1: C <- C exp(-eta_C (b~ - gamma)), b~ the noised share of updates
    within C; the noise on the updates is z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Theorem 1)."""
    agg = attach({"clip": 1.0, "noise_multiplier": 0.0, "adaptive_quantile": 0.5, "count_noise": 0.0})
    _, state = one_round(agg, updates(0.5, 2.0, 4.0))
    assert state["privacy"]["clip"] == pytest.approx(math.exp(-0.2 * (1 / 3 - 0.5)))
    # With noise: the count's noise from (seed, round), and z_Delta for z = 1, sigma_b = 1.
    agg = attach({"clip": 1.0, "noise_multiplier": 1.0, "adaptive_quantile": 0.5, "count_noise": 1.0, "clip_lr": 0.3})
    outcome, state = one_round(agg, updates(0.5, 2.0, 4.0), seed=3, t=2)
    zeta = float(torch.randn(1, generator=torch_generator(3, "dp_count", 2), dtype=torch.float64))
    assert state["privacy"]["clip"] == pytest.approx(math.exp(-0.3 * ((1 + zeta) / 3 - 0.5)))
    assert outcome.privacy["dp_noise_std"] == pytest.approx((1 - 1 / 4) ** -0.5)
    # Without noise, C settles at the target quantile of the norms: 100 clients of norms 1..100.
    agg = attach({"clip": 1.0, "noise_multiplier": 0.0, "adaptive_quantile": 0.3, "count_noise": 0.0},
                 num_clients=100, client_fraction=1.0)
    norms = updates(*range(1, 101), d=100)
    state = None
    for t in range(1, 301):
        _, state = one_round(agg, norms, state, t=t)
    assert 28 < state["privacy"]["clip"] < 32


# ----------------------------------------------------------------------------- the accountant

@pytest.mark.parametrize("clients,per_round,z,rounds,delta,expected", [
    (60_000, 150, 1.3, 6_000, 1e-5, 0.7242234026109595),
    (100_000, 100, 1.0, 30_000, 1e-7, 1.4154988495444842),
])
def test_epsilon_is_the_librarys_published_value(clients, per_round, z, rounds, delta, expected):
    """tensorflow/privacy's tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_test.py
    (test_compute_dp_sgd_privacy, Test0 and Test1) publishes these epsilons, computed with
    dp-accounting's RdpAccountant: Poisson sampling at q = 150/60,000, z = 1.3, 15 epochs (6,000
    steps), delta = 1e-5 -> 0.7242...; q = 100/100,000, z = 1.0, 30 epochs, delta = 1e-7 -> 1.4155.
    Read as K clients, m a round: privacy.accounting=poisson gives them."""
    eps = privacy.epsilon(rounds, z, clients, per_round, delta, "poisson")
    assert eps == pytest.approx(expected, rel=1e-9)


def test_fixed_size_accounting_is_the_libraries_replace_one_sample():
    """accounting=fixed_size: dp-accounting's sampled-without-replacement Gaussian under replace-one
    neighbours at z/2 (the sum moves by 2C), as its own accountant composes t rounds; with every
    client every round (m = K), the plain Gaussian's; more rounds spend more; no noise: no bound."""
    rel = dp_accounting.NeighboringRelation.REPLACE_ONE
    for t in (1, 7, 40):
        acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=rel)
        acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(100, 10, dp_accounting.GaussianDpEvent(0.6)), t)
        assert privacy.epsilon(t, 1.2, 100, 10, 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
        whole = dp_accounting.rdp.RdpAccountant(neighboring_relation=rel)
        whole.compose(dp_accounting.GaussianDpEvent(0.6), t)
        assert privacy.epsilon(t, 1.2, 20, 20, 1e-5) == pytest.approx(whole.get_epsilon(1e-5), rel=1e-12)
    spent = [privacy.epsilon(t, 1.2, 100, 10, 1e-5) for t in range(1, 20)]
    assert all(a < b for a, b in zip(spent, spent[1:]))
    assert privacy.epsilon(5, 0.0, 100, 10, 1e-5) == math.inf
    # The papers' Poisson analysis (add-or-remove, z) is the smaller number: half the sensitivity.
    assert privacy.epsilon(20, 1.2, 100, 10, 1e-5, "poisson") < privacy.epsilon(20, 1.2, 100, 10, 1e-5)


def test_the_epsilons_docs_configuration_md_quotes():
    """docs/configuration.md#privacy: 100 of 1,000 clients a round, z = 1, delta = 1e-5."""
    quoted = {(10, 1.0, "fixed_size"): 17.5, (10, 1.0, "poisson"): 3.4, (50, 1.0, "fixed_size"): 47,
              (10, 2.0, "fixed_size"): 4.6}
    for (rounds, z, accounting), value in quoted.items():
        digits = 0 if isinstance(value, int) else 1
        assert round(privacy.epsilon(rounds, z, 1000, 100, 1e-5, accounting), digits) == value


# ----------------------------------------------------------------------------- whole runs

@pytest.fixture(scope="module")
def data():
    return prepare(synthetic(num_train=240, num_test=60, image_size=8, noise=0.5, seed=1), None, None)


def private_run(run_dir, data, agg_settings: dict, engine=None, resume=False, rounds=5):
    federation = Federation(rounds=rounds, num_clients=8, client_fraction=0.5)
    aggregator = Privacy(**agg_settings).attach(A.fedavgm(weighting="uniform"), federation)
    kwargs = {} if engine is None else {"make_engine": engine}
    return simulate(run_dir, data, lambda: MLP(image_size=8, hidden=[16]), functools.partial(P.classes,
                    classes_per_client=2), aggregator, LocalTraining(epochs=1, batch_size=10, lr=0.05), federation,
                    progress=False, resume=resume, **kwargs)


ADAPTIVE = {"clip": 0.3, "noise_multiplier": 0.8, "adaptive_quantile": 0.5, "count_noise": 1.0}


def test_a_resumed_private_run_equals_an_uninterrupted_one(tmp_path, data, monkeypatch):
    """Ctrl-C while round 3 is recorded: the checkpoint of round 2 holds the adapted clip; the resume
    draws round 3's noise from (seed, round) again and ends with the uninterrupted run's files."""
    private_run(tmp_path / "whole", data, ADAPTIVE)
    interrupted_while_recording(monkeypatch, 3, lambda: private_run(tmp_path / "cut", data, ADAPTIVE))
    ckpt = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 2 and ckpt["aggregator"]["privacy"]["clip"] != ADAPTIVE["clip"]
    private_run(tmp_path / "cut", data, ADAPTIVE, resume=True)
    same_run(tmp_path / "whole", tmp_path / "cut")
    rounds = pd.read_csv(tmp_path / "whole" / "rounds.csv")
    assert rounds["dp_clip"].nunique() == 5  # adapted every round


@pytest.mark.parametrize("engine", [BatchedEngine, functools.partial(ParallelEngine, workers=2)],
                         ids=["batched", "parallel"])
def test_engines_agree_on_a_private_run(tmp_path, engine):
    """The noise and the clip are the server's, from (seed, round): every engine's run is the
    sequential engine's to float rounding (the clients' updates differ by rounding only)."""
    federation = Federation(rounds=3, num_clients=6, client_fraction=0.5)
    aggregator = Privacy(**ADAPTIVE).attach(A.fedavg("uniform"), federation)
    assert_whole_runs_agree(tmp_path, aggregator, engine, LocalTraining(epochs=1, batch_size=10, lr=0.02), federation)
    seq, other = (pd.read_csv(tmp_path / name / "rounds.csv") for name in ("seq", "other"))
    for col in privacy.COLUMNS:
        np.testing.assert_allclose(seq[col], other[col], rtol=1e-6, err_msg=col)


def test_no_noise_and_no_clipping_is_fedavg_exactly(tmp_path):
    """z = 0 and a clip no update reaches: the CSVs of aggregator=fedavg (uniform weights) to the
    byte, timing aside, plus the privacy columns (epsilon: inf, no bound)."""
    fedrun_ok([*TINY, *PRIVATE, f"hydra.run.dir={tmp_path / 'avg'}"], tmp_path)
    fedrun_ok([*TINY, *PRIVATE, "privacy.clip=1e30", "privacy.noise_multiplier=0",
               f"hydra.run.dir={tmp_path / 'dp'}"], tmp_path)
    dp = pd.read_csv(tmp_path / "dp" / "rounds.csv")
    assert (dp["dp_clipped_fraction"] == 0).all() and (dp["dp_noise_std"] == 0).all()
    assert np.isinf(dp["dp_epsilon"]).all()
    without = tmp_path / "dp_rounds.csv"
    dp.drop(columns=list(privacy.COLUMNS)).to_csv(without, index=False)
    assert csv_without_wall(without) == csv_without_wall(tmp_path / "avg" / "rounds.csv")
    for name in ("layers.csv", "clients.csv", "client_layers.csv"):
        assert (tmp_path / "dp" / name).read_bytes() == (tmp_path / "avg" / name).read_bytes(), name
    summary = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert summary["dp_epsilon"] is None and summary["dp_noise_multiplier"] == 0  # JSON has no inf


def test_a_private_run_from_the_cli_spends_more_privacy_every_round(tmp_path):
    run = tmp_path / "run"
    fedrun_ok([*TINY, "aggregator=fedavgm", "aggregator.weighting=uniform", "hyperparams.rounds=4",
               "privacy.clip=0.5", "privacy.noise_multiplier=0.8", "privacy.delta=1e-4", f"hydra.run.dir={run}"],
              tmp_path)
    rounds = pd.read_csv(run / "rounds.csv")
    eps = rounds["dp_epsilon"].to_numpy()
    assert (np.diff(eps) > 0).all() and np.isfinite(eps).all()
    # TINY: K = 4 clients, m = 2 a round.
    assert eps == pytest.approx([privacy.epsilon(t, 0.8, 4, 2, 1e-4) for t in (1, 2, 3, 4)], rel=1e-6)
    assert (rounds["dp_clip"] == 0.5).all() and (rounds["dp_noise_std"] == 0.4).all()
    assert rounds["dp_clipped_fraction"].between(0, 1).all()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dp_epsilon"] == pytest.approx(eps[-1]) and summary["dp_delta"] == 1e-4
    assert summary["dp_accounting"] == "fixed_size"


def test_a_private_run_on_the_stand_in_gpu_equals_the_cpu(tmp_path, monkeypatch):
    """The noise is drawn on the CPU from (seed, round) and moved to the updates' device: the run
    on the stand-in GPU (tests/fake_gpu.py: any CPU/GPU mix refused) writes the CPU run's CSVs."""
    from fake_gpu import FAKE, fake_gpu

    import fedrun.command.build as command

    cfg = compose([*TINY, *PRIVATE, "engine=sequential", "hyperparams.rounds=3", "privacy.clip=0.3",
                   "privacy.noise_multiplier=0.8", "privacy.adaptive_quantile=0.5", "privacy.count_noise=1"])
    command.run(cfg, tmp_path / "cpu", {}, [])
    monkeypatch.setattr(command, "resolve_device", lambda name: FAKE)
    with fake_gpu():
        command.run(cfg, tmp_path / "gpu", {}, [])
    for table in ("rounds", "clients", "layers"):
        cpu, gpu = (pd.read_csv(tmp_path / where / f"{table}.csv") for where in ("cpu", "gpu"))
        columns = [c for c in cpu.columns if not c.endswith("_s")]  # timings differ
        pd.testing.assert_frame_equal(gpu[columns], cpu[columns], check_exact=True)


@pytest.mark.slow
def test_a_population_of_private_runs_equals_the_runs_alone(tmp_path):
    """hydra/launcher=population: private runs (two noise levels, one adaptive) trained together
    write what each writes alone on the batched engine."""
    base = [*TINY, *PRIVATE, "engine=batched", "hyperparams.rounds=3", "privacy.clip=0.5", "privacy.count_noise=1"]
    sweep = ["privacy.noise_multiplier=0.5,1.0", "privacy.adaptive_quantile=null,0.5"]
    fedrun_ok(["-m", *base, *sweep, "hydra/launcher=population", f"hydra.sweep.dir={tmp_path / 'pop'}"], tmp_path)
    jobs = sorted((tmp_path / "pop").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(jobs) == 4
    for job in jobs:
        overrides = compose_overrides(job)
        fedrun_ok([*base, *overrides, f"hydra.run.dir={tmp_path / ('alone' + job.name)}"], tmp_path)
        pop, alone = (pd.read_csv(d / "rounds.csv") for d in (job, tmp_path / f"alone{job.name}"))
        numbers = [c for c in pop.select_dtypes("number").columns if c not in ("train_s", "eval_s", "wall_s")]
        np.testing.assert_allclose(pop[numbers].to_numpy(float), alone[numbers].to_numpy(float), rtol=1e-5,
                                   atol=1e-7, equal_nan=True, err_msg=job.name)
        assert np.diff(pop["dp_epsilon"]).min() > 0


def compose_overrides(job) -> list[str]:
    """The sweep's overrides of one job (its config.yaml records them)."""
    import yaml

    swept = ("privacy.noise_multiplier=", "privacy.adaptive_quantile=")
    return [o for o in yaml.safe_load((job / "config.yaml").read_text())["overrides"] if o.startswith(swept)]


def test_a_run_from_before_privacy_existed_resumes(tmp_path):
    """A run whose config.yaml has no privacy node (made before it existed) resumes: the node at its
    defaults (clip null) is what that run ran; a private resume of it is refused."""
    run = tmp_path / "run"
    args = [*TINY, f"hydra.run.dir={run}"]
    fedrun_ok(args, tmp_path)
    config = run / "config.yaml"
    text = config.read_text()
    start = text.index("privacy:\n")
    end = text.index("\n", text.index("accounting:", start)) + 1
    config.write_text(text[:start] + text[end:])
    assert "privacy" not in config.read_text()
    fedrun_ok([*args, "resume=true"], tmp_path)
    refused = run_fedrun([*args, *PRIVATE, "privacy.clip=1", "resume=true"], tmp_path)
    assert refused.returncode == 2 and "differ" in refused.stderr


# ----------------------------------------------------------------------------- refusals

REFUSALS = [
    (["aggregator=krum"], "privacy.clip=1.0: aggregator=krum cannot run privately: its client weights are computed "
     "from the raw updates"),
    (["aggregator=median"], "aggregator=median cannot run privately: its server takes a coordinate-wise statistic"),
    (["aggregator=trimmed_mean"], "aggregator=trimmed_mean cannot run privately: its server takes a coordinate-wise"),
    (["aggregator=scaffold"], "aggregator=scaffold cannot run privately: its server keeps per-client state"),
    (["aggregator=fednova"], "aggregator=fednova cannot run privately: its client weights are computed"),
    (["aggregator=fedadp"], "aggregator=fedadp cannot run privately: its client weights are computed"),
    (["aggregator=fedlayerwise"], "aggregator=fedlayerwise cannot run privately: its client weights are computed"),
    (["aggregator=normnorm"], "aggregator=normnorm cannot run privately: its server step reads E"),
    (["aggregator=fednnnn"], "aggregator=fednnnn cannot run privately: its server step reads E"),
    (["aggregator=fedavg"], "aggregator.weighting=examples: privacy.clip needs aggregator.weighting=uniform"),
    ([*PRIVATE, "hyperparams.sampling=size"], "hyperparams.sampling=size: privacy.clip needs sampling=uniform or "
     "poisson"),
    ([*PRIVATE, "hyperparams.sampling=poisson"], "privacy.accounting=fixed_size: hyperparams.sampling=poisson draws "
     "each client with probability q = m/K: its accounting is privacy.accounting=poisson"),
    ([*PRIVATE, "aggregator=ditto", "model=mlp", "model.batch_norm=true", "client_test_fraction=0.2"],
     "privacy.clip=1.0: the model keeps running statistics"),
    ([*PRIVATE, "mode=centralized"], "privacy.clip=1.0: client-level privacy needs clients: use mode=federated"),
    ([*PRIVATE, "hyperparams.optimizer_state=average", "hyperparams.momentum=0.9"],
     "hyperparams.optimizer_state=average: privacy.clip: the server would average the clients' optimizer states"),
    ([*PRIVATE, "model=neta_baseline", "model.norm=bn", "dataset.channels=3", "dataset.image_size=32"],
     "privacy.clip=1.0: the model keeps running statistics"),
    ([*PRIVATE, "privacy.adaptive_quantile=0.5", "privacy.noise_multiplier=1.0"],
     "privacy.count_noise=0.1: must exceed privacy.noise_multiplier/2 = 0.5 under adaptive clipping"),
    ([*PRIVATE, "privacy.noise_multiplier=-1"], "privacy.noise_multiplier=-1: must be >= 0"),
    ([*PRIVATE, "privacy.accounting=gdp"], "privacy.accounting=gdp: choose one of: fixed_size, poisson"),
    ([*PRIVATE, "privacy.delta=1"], "privacy.delta=1: must be in (0, 1)"),
    ([*PRIVATE, "privacy.clip=0"], "privacy.clip=0: must be > 0"),
    ([*PRIVATE, "privacy.clip=null", "privacy.adaptive_quantile=0.5"],
     "privacy.adaptive_quantile=0.5: adapts privacy.clip, which is null"),
]


@pytest.mark.parametrize("overrides,expected", REFUSALS, ids=[" ".join(o) for o, _ in REFUSALS])
def test_what_cannot_be_private_is_refused_in_one_line(overrides, expected):
    dropped = ("hyperparams.num_clients", "hyperparams.client_fraction") if "mode=centralized" in overrides else ()
    dropped += ("model",) if any(o.startswith("model=") for o in overrides) else ()  # TINY's MLP
    settings = [*(o for o in TINY if not (dropped and o.startswith(dropped))), "privacy.clip=1.0", *overrides]
    with pytest.raises(ConfigError) as e:
        build(compose(settings))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_the_refusal_from_the_cli_and_the_missing_library(tmp_path, monkeypatch):
    bad = run_fedrun([*TINY, "aggregator=krum", "privacy.clip=1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert bad.returncode == 2 and not (tmp_path / "run").exists()
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "privacy works with aggregator=fedavg, fedprox, fedlap" in lines[0], bad.stderr
    monkeypatch.setattr(privacy.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"privacy.clip=1.0: needs pip install 'fedrun\[privacy\]'"):
        build(compose([*TINY, *PRIVATE, "privacy.clip=1.0"]))


def test_the_supported_list_is_every_aggregator_that_runs_privately():
    """privacy.SUPPORTED, which every refusal names, is exactly the conf/aggregator options that
    attach (with uniform weights where the method has a weighting)."""
    runs = set()
    for path in sorted(CONF_DIR.glob("aggregator/*.yaml")):
        try:
            build(compose([*TINY, f"aggregator={path.stem}", "aggregator.weighting=uniform", "privacy.clip=1.0"]))
        except ConfigError as e:
            assert f"aggregator={path.stem} cannot run privately" in str(e), str(e)
        else:
            runs.add(path.stem)
    assert runs == set(privacy.SUPPORTED)
