"""The round plan (fedrun.client.round_plan) and the static, padded lock-step (engine.capture=on).

The plan is checked against its definition by hand: each client's steps are E ceil(n/B), each
epoch's batches tile the client's permutation in order, and a bucketed group is padded to a power
of two with the scratch row.  The static layout, which a GPU captures as CUDA graphs, is what a
CPU runs with ``capture="on"``: the padded step run eagerly.  It must compute what the sequential
engine computes (tests/equivalence.py's bounds) for every model family, optimizer, regularizer
and aggregator, and its workspace, reused from round to round, must carry nothing over.
"""
from __future__ import annotations

import contextlib
import functools
import logging

import pandas as pd
import pytest
import torch
from conftest import TINY, compose, on_partition, run_fedrun
from equivalence import F32_RTOL, assert_engines_agree, assert_whole_runs_agree, default_dtype, relative_difference
from hydra.utils import instantiate

from fedrun.client import engines
from fedrun.client.batched import BatchedEngine, Share, train_shares
from fedrun.client.local_training import LocalTraining
from fedrun.client.regularizers import ControlVariate, LayerAdaptive, Proximal
from fedrun.client.round_plan import RoundPlan, bucket, lock_step_profile
from fedrun.client.sequential import SequentialEngine
from fedrun.errors import ConfigError
from fedrun.harness.federated_run import Federation
from fedrun.models.nets import MLP, Cifar10CNN, MnistCNN
from fedrun.params import split_state

STATIC = functools.partial(BatchedEngine, capture="on")


# ----------------------------------------------------------------------------- the plan

def visits(plan: RoundPlan) -> dict[int, list[tuple[int, int, int]]]:
    """Each row's (step, batch size, start) in the plan's order, padding rows left out."""
    out: dict[int, list] = {}
    for s, step in enumerate(plan.lock_steps):
        for group in step.groups:
            assert list(group.rows) == sorted(group.rows)
            for row, start in zip(group.rows, group.starts[: len(group.rows)].tolist()):
                out.setdefault(int(row), []).append((s, group.size, start))
    return out


def test_each_clients_steps_tile_its_epochs_in_order():
    # Rows (n, B, E): 13 samples in batches of 8 over 2 epochs = 8 + 5 twice; 20 over 3 = 8, 8, 4
    # three times; 7 once; an empty client takes no step.  The round's sample order holds each row's
    # E permutations one after another: offsets 0, 26, 86, 93.
    plan = RoundPlan([(13, 8, 2), (20, 8, 3), (7, 8, 1), (0, 8, 2)])
    assert plan.steps == [4, 9, 1, 0] and plan.critical_path == 9 and len(plan.lock_steps) == 9
    got = visits(plan)
    assert got[0] == [(0, 8, 0), (1, 5, 8), (2, 8, 13), (3, 5, 21)]
    assert got[1] == [(s, size, 26 + start) for s, (size, start) in
                      enumerate([(8, 0), (8, 8), (4, 16), (8, 20), (8, 28), (4, 36), (8, 40), (8, 48), (4, 56)])]
    assert got[2] == [(0, 7, 86)] and 3 not in got
    # Step 0: rows 0 and 1 take 8 samples (one group), row 2 its 7 (another); every row starts epoch 1.
    first = plan.lock_steps[0]
    assert sorted((g.size, list(g.rows)) for g in first.groups) == [(7, [2]), (8, [0, 1])]
    assert first.epoch_rows.tolist() == [0, 1, 2] and first.epoch_first.all()
    # Later epoch starts: row 0 at step 2, row 1 at steps 3 and 6; none of them a first epoch.
    starts = {s: step.epoch_rows.tolist() for s, step in enumerate(plan.lock_steps) if len(step.epoch_rows)}
    assert starts == {0: [0, 1, 2], 2: [0], 3: [1], 6: [1]}
    assert not any(plan.lock_steps[s].epoch_first.any() for s in (2, 3, 6))
    assert plan.calls == sum(len(step.groups) for step in plan.lock_steps) == 13


def test_a_bucketed_plan_pads_each_group_with_the_scratch_row():
    shapes = [(16, 4, 1), (8, 4, 1), (4, 4, 1), (4, 4, 1), (12, 4, 1)]  # steps 4, 2, 1, 1, 3
    exact, padded = RoundPlan(shapes), RoundPlan(shapes, bucketed=True)
    assert [bucket(g, 5) for g in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, 5]
    for a, b in zip(exact.lock_steps, padded.lock_steps):
        for ga, gb in zip(a.groups, b.groups):
            g = len(ga.rows)
            assert gb.padded == bucket(g, 5) and ga.padded == g
            assert gb.index[:g].tolist() == ga.index.tolist() == list(ga.rows)
            assert gb.index[g:].tolist() == [5] * (gb.padded - g)  # the scratch row, m = 5
            assert gb.starts[:g].tolist() == ga.starts.tolist() and gb.starts[g:].tolist() == [0] * (gb.padded - g)
    # Steps: all 5 rows, then rows 0, 1, 4 (padded to 4), then rows 0 and 4, then row 0.
    assert [list(g.rows) for step in padded.lock_steps for g in step.groups] == [[0, 1, 2, 3, 4], [0, 1, 4], [0, 4], [0]]
    assert [g.padded for step in padded.lock_steps for g in step.groups] == [5, 4, 2, 1]
    assert padded.shapes() == {(5, 4), (4, 4), (2, 4), (1, 4)} and exact.shapes() == {(5, 4), (3, 4), (2, 4), (1, 4)}


def test_lock_step_profile_by_hand():
    # Steps E ceil(n/B) with B = 50, E = 2: 100 -> 4, 50 -> 2, 1000 -> 40.
    one = lock_step_profile([100, 50, 1000], 50, 2)
    assert (one["total_steps"], one["critical_path"], one["lock_steps"], one["mean_steps"]) == (46, 40, 40, 46 / 3)
    assert lock_step_profile([100, 50, 1000], 50, 2, chunk=1)["lock_steps"] == 46  # one after another
    assert lock_step_profile([100, 50, 1000], 50, 2, chunk=2)["lock_steps"] == 4 + 40
    # Steps 1, 1, 2, 2, 2 (E = 1): step 0 has all 5 rows, step 1 three rows padded to 4: 8 real of 9.
    five = lock_step_profile([50, 50, 100, 100, 100], 50)
    assert five["shapes"] == 2 and five["occupancy"] == pytest.approx(8 / 9)
    assert lock_step_profile([], 50)["lock_steps"] == 0


# ----------------------------------------------------------------------------- the static layout == sequential

MODELS = {
    "mlp": (lambda: MLP(hidden=[16]), True),
    "mnist_cnn": (lambda: MnistCNN(channels=(4, 8), hidden=16), True),
    "cifar10_cnn_bn": (lambda: Cifar10CNN(), False),  # BatchNorm: float64 only (tests/equivalence.py)
}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_static_layout_matches_the_sequential_engine(name):
    # Sizes 13, 20, 7 in batches of 8, 2 epochs: 4, 6 and 2 steps, so groups of 3, 2 (padded to 2)
    # and 1 row, and last batches of 5 and 7 samples: every bucket and the scratch row are used.
    make, float32 = MODELS[name]
    torch.manual_seed(1)
    local = LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.5)
    seq, bat = assert_engines_agree(make(), local, float32=float32, sizes=(13, 20, 7), batched=STATIC)
    assert seq.steps.tolist() == bat.steps.tolist() == [4, 6, 2]


@pytest.mark.parametrize("local,regularizer", [
    (LocalTraining(epochs=2, batch_size=8, lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-3), Proximal(0.5)),
    (LocalTraining(epochs=1, batch_size=8, lr=1e-3, optimizer="adam"), Proximal(0.5)),
    (LocalTraining(epochs=3, batch_size=8, lr=0.05, momentum=0.5), LayerAdaptive(0.5, "interpolate")),
    (LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.5), ControlVariate("after_step")),
], ids=["nesterov-wd-fedprox", "adam-fedprox", "fedlap", "scaffold-after-step"])
def test_the_static_layout_matches_with_optimizers_and_regularizers(local, regularizer):
    torch.manual_seed(1)
    seq, bat = assert_engines_agree(MnistCNN(channels=(4, 8), hidden=16), local, regularizer=regularizer,
                                    epochs=[local.epochs, 1, local.epochs, local.epochs],
                                    f32_rtol=10 * F32_RTOL if local.optimizer == "adam" else F32_RTOL, batched=STATIC)
    assert bat.epochs.tolist() == [local.epochs, 1, local.epochs, local.epochs]  # a straggler with 1 epoch
    for name in seq.extras:
        torch.testing.assert_close(seq.extras[name], bat.extras[name], rtol=1e-4, atol=1e-8)


def scaffold_round(make, params, buffers, x, y, idx, inputs, round_=1):
    local = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.5)
    engine = make(MnistCNN(channels=(4, 8), hidden=16), x, y, local, ControlVariate(), 0)  # (float64 by default here)
    return engine.train(params, buffers, [0, 1, 2], idx, round_, None, local.lr, inputs=inputs)


def test_scaffold_corrections_reach_the_static_layout():
    # SCAFFOLD's per-client inputs c - c_k go through the workspace (with a zero scratch row).
    torch.manual_seed(2)
    x, y = torch.randn(45, 1, 28, 28).double(), torch.randint(0, 10, (45,))
    idx = [torch.arange(0, 13), torch.arange(13, 33), torch.arange(33, 45)]
    with default_dtype(torch.float64):
        params, buffers = split_state(MnistCNN(channels=(4, 8), hidden=16))
    inputs = {k: 0.1 * torch.randn(3, *v.shape, dtype=v.dtype) for k, v in params.items()}
    with default_dtype(torch.float64):
        seq = scaffold_round(SequentialEngine, params, buffers, x, y, idx, inputs)
        bat = scaffold_round(STATIC, params, buffers, x, y, idx, inputs)
        plain = scaffold_round(STATIC, params, buffers, x, y, idx, None)
    assert relative_difference(seq.deltas, bat.deltas) < 1e-10
    assert relative_difference(plain.deltas, bat.deltas) > 1e-3  # the corrections changed the updates


def test_the_workspace_carries_nothing_from_round_to_round():
    # One engine, two rounds from different global models and clients, against fresh engines:
    # equal to the bit (same layout, same kernels), and round 1's results not overwritten by round 2.
    torch.manual_seed(0)
    x, y = torch.randn(60, 1, 28, 28), torch.randint(0, 10, (60,))
    idx = [torch.arange(0, 13), torch.arange(13, 33), torch.arange(33, 40), torch.arange(40, 60)]
    local = LocalTraining(epochs=2, batch_size=8, lr=0.05, momentum=0.9, optimizer_state="local")
    make = lambda: on_partition(STATIC, MnistCNN(channels=(4, 8), hidden=16), x, y, idx, local, Proximal(0.1), 0)  # noqa: E731
    torch.manual_seed(3)
    engine = make()
    p1, b1 = split_state(engine.model)
    p2 = {k: v + 0.01 for k, v in p1.items()}
    first = engine.train(p1, b1, [0, 1, 2], 1)
    kept = {k: v.clone() for k, v in first.deltas.items()}
    momentum = {f"momentum.{k}": torch.full((3, *v.shape), 0.5) for k, v in p1.items()}
    second = engine.train(p2, b1, [1, 2, 3], 2, opt_states=momentum)
    assert all(torch.equal(first.deltas[k], kept[k]) for k in kept)
    torch.manual_seed(3)
    fresh = make().train(p2, b1, [1, 2, 3], 2, opt_states=momentum)
    assert all(torch.equal(second.deltas[k], fresh.deltas[k]) for k in fresh.deltas)
    assert all(torch.equal(second.opt_states[k], fresh.opt_states[k]) for k in fresh.opt_states)
    assert torch.equal(second.loss, fresh.loss) and torch.equal(second.extras["reg_loss"], fresh.extras["reg_loss"])
    # The plan depends only on the rows' (n, B, E): the same clients again reuse it.
    shapes, spans = [(20, 8, 2), (7, 8, 2), (20, 8, 2)], [(0, 3)]
    assert engine.plan(shapes, spans, True) is engine.plan(shapes, spans, True)
    assert engine.plan(shapes, spans, False) is not engine.plan(shapes, spans, True)


@functools.cache
def aggregator_names() -> list[str]:
    from conftest import CONF_DIR
    return sorted(p.stem for p in (CONF_DIR / "aggregator").glob("*.yaml"))


@pytest.mark.parametrize("name", aggregator_names())
def test_whole_runs_of_every_aggregator_match_in_the_static_layout(name, tmp_path):
    # 24 images a client in batches of 7, 2 epochs: last batches of 3, 5 clients a round (Krum's minimum).
    assert_whole_runs_agree(tmp_path, instantiate(compose([f"aggregator={name}"]).aggregator), STATIC,
                            LocalTraining(epochs=2, batch_size=7, lr=0.02),
                            Federation(rounds=3, num_clients=10, client_fraction=0.5))


# ----------------------------------------------------------------------------- when it applies

def test_what_cannot_take_the_static_layout_says_why_once(caplog):
    torch.manual_seed(0)
    x, y = torch.randn(30, 1, 8, 8), torch.randint(0, 10, (30,))
    idx = [torch.arange(0, 10), torch.arange(10, 30)]
    dropout = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 10))
    params, buffers = split_state(dropout)
    engine = on_partition(STATIC, dropout, x, y, idx, LocalTraining(batch_size=5), None, 0)
    with caplog.at_level(logging.INFO, logger="fedrun.client.batched"):
        engine.train(params, buffers, [0, 1], 1)
        engine.train(params, buffers, [0, 1], 2)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["engine.capture=on: the lock-step runs eagerly (dropout's masks would change with the padding rows)"]
    # A population where one run augments its data: each client's transforms are drawn on the host.
    from fedrun.data.augment import Augmentation

    plain = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    p, b = split_state(plain)
    caplog.clear()
    runs = [STATIC(plain, x, y, LocalTraining(batch_size=5, lr=0.1, augment=augment), None, 0)
            for augment in (None, Augmentation())]
    with caplog.at_level(logging.INFO, logger="fedrun.client.batched"):
        train_shares([Share(e, p, b, [0, 1], idx, 1, None, 0.1) for e in runs])
        runs[0].train(p, b, [0, 1], idx, 1, None, 0.1)  # alone, the other run takes the static layout
    said = [r.getMessage() for r in caplog.records]
    assert said == ["engine.capture=on: the lock-step runs eagerly (data augmentation draws each client's transforms "
                    "on the host)",
                    "engine.capture=on: no CUDA device (cpu): the static, padded lock-step runs without graphs"]


def test_a_population_in_the_static_layout_equals_its_runs_alone(tmp_path):
    # Every run's part of a step padded on its own: FedAvg, FedProx with stragglers, FedLap,
    # momentum with carried state, Adam, SCAFFOLD (after the step).
    from test_population import MEMBERS, population_equals_alone

    names = ("fedavg", "fedprox_stragglers", "fedlap", "momentum_sgdm", "fedlayerwise_adam", "scaffold_after_step")
    population_equals_alone(tmp_path, [MEMBERS[k] + ["engine.capture=on"] for k in names])


def test_capture_values_are_checked_when_the_config_is_built():
    for ok in ("auto", "on", "off", True, False):
        engines.check(functools.partial(BatchedEngine, capture=ok))
    with pytest.raises(ConfigError, match=r"^engine\.capture=maybe: choose one of: auto \(CUDA graphs"):
        engines.check(functools.partial(engines.auto_engine, capture="maybe"))


def test_capture_on_from_the_cli(tmp_path):
    done = run_fedrun([*TINY, "engine=batched", "engine.capture=on", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the static, padded lock-step runs without graphs" in (tmp_path / "run" / "fedrun.log").read_text()
    rounds = pd.read_csv(tmp_path / "run" / "rounds.csv")
    assert rounds["test_acc"].notna().all() and len(rounds) == 2


# ----------------------------------------------------------------------------- capture's protocol

class _Recorder:
    """torch.cuda's graph API, played on the CPU: inside ``graph(g)`` a step is recorded into g,
    not run (as CUDA graph capture records kernels without running them); ``g.replay()`` runs it."""

    def __init__(self):
        self.capturing = None

    def install(self, monkeypatch):
        recorder = self

        class Graph:
            def __init__(self):
                self.step = None

            def replay(self):
                self.step()

            def pool(self):
                return "pool"

        class Capture:
            def __init__(self, graph, pool=None, capture_error_mode="global"):
                self.graph = graph

            def __enter__(self):
                recorder.capturing = self.graph

            def __exit__(self, *exc):
                recorder.capturing = None

        class Stream:
            def wait_stream(self, other):
                pass

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", Capture)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", Stream)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)


def test_steps_run_eagerly_twice_then_are_captured_once_and_replayed(monkeypatch, caplog):
    from fedrun.client.captured import StepGraphs

    recorder = _Recorder()
    recorder.install(monkeypatch)
    ran = []

    def step(name, fails=False):
        def fn():
            if recorder.capturing is not None:
                if fails:
                    raise RuntimeError("operation not permitted when stream is capturing\nmore")
                recorder.capturing.step = fn  # recorded, not run
            else:
                ran.append(name)
        return fn

    graphs = StepGraphs(warmup=2)
    caplog.set_level(logging.INFO, logger="fedrun.client.captured")
    for _ in range(5):
        graphs.run((4, 50, 0.1), step("a"))
    assert ran == ["a"] * 5  # two warm-ups, the capture's replay, two replays
    assert (graphs.captures, graphs.replays) == (1, 3)
    graphs.run((1, 50, 0.1), step("b"))
    graphs.run((4, 50, 0.01), step("c"))  # another learning rate: another graph
    assert ran[-2:] == ["b", "c"] and graphs.captures == 1
    assert caplog.messages == ["engine.capture: the lock-steps are captured as CUDA graphs, one a step shape, and replayed"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedrun.client.captured"):
        for _ in range(4):
            graphs.run((2, 7, 0.1), step("d", fails=True))
        graphs.run((8, 50, 0.1), step("e"))
    assert ran[-5:] == ["d"] * 4 + ["e"]  # the failed capture's step still ran, eagerly, and all after it
    assert graphs.failed == "RuntimeError: operation not permitted when stream is capturing"
    assert [r.getMessage() for r in caplog.records] == [
        "engine.capture: the step could not be captured (RuntimeError: operation not permitted when stream is "
        "capturing); it runs eagerly"]
