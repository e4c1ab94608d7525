"""Optimizer state across rounds (-A vs -WB), decoupled weight decay, and the step learning rate."""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY, on_partition, run_fedrun

from fedrun import aggregators as A
from fedrun.data import partition as P
from fedrun.client.batched import BatchedEngine
from fedrun.data.preparation import prepare
from fedrun.data.datasets import synthetic
from fedrun.harness.federated_run import Federation
from fedrun.client.local_training import LocalTraining, OptimizerStates
from fedrun.models.nets import MLP
from fedrun.client.optim import SGD, Adam, lr_factor
from fedrun.params import split_state
from fedrun.harness.recorder import TIMING_COLUMNS
from fedrun.diagnostics.communication import COLUMNS as COMMUNICATION
from fedrun.client.sequential import SequentialEngine
from fedrun.harness.simulation import simulate


def fedrun_rounds(overrides: list[str], run_dir) -> pd.DataFrame:
    base = TINY
    if "mode=centralized" in overrides:  # one learner: TINY's clients' number and fraction are refused
        base = [o for o in TINY if not o.startswith(("hyperparams.num_clients", "hyperparams.client_fraction"))]
    proc = run_fedrun([*base, *overrides, f"hydra.run.dir={run_dir}"], run_dir.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return pd.read_csv(run_dir / "rounds.csv").drop(columns=list(TIMING_COLUMNS))


# ----------------------------------------------------------------------------- learning-rate schedule

def test_lr_drops_at_exactly_half_and_three_quarters():
    # T = 300 (the paper's non-IID runs): rounds 1-150 lr, 151-225 0.1 lr, 226-300 0.01 lr.
    factors = {t: lr_factor(t, 300, (0.5, 0.75), 0.1) for t in (1, 150, 151, 225, 226, 300)}
    assert factors == pytest.approx({1: 1, 150: 1, 151: 0.1, 225: 0.1, 226: 0.01, 300: 0.01})
    # Vanilla training, 100 epochs: the drops come after epochs 50 and 75.
    assert [lr_factor(t, 100, (0.5, 0.75)) for t in (50, 51, 75, 76)] == pytest.approx([1, 0.1, 0.1, 0.01])
    assert lr_factor(7, 10) == 1  # no milestones, no decay


def test_lr_column_from_the_cli(tmp_path):
    rounds = fedrun_rounds(["hyperparams.rounds=8", "hyperparams.lr=0.2", "hyperparams.lr_milestones=[0.5,0.75]"],
                           tmp_path / "run")
    lr = rounds["lr"].tolist()
    assert lr == pytest.approx([0.2] * 4 + [0.02] * 2 + [0.002] * 2)


# ----------------------------------------------------------------------------- decoupled weight decay

def test_decoupled_decay_golden():
    # w = 1, grad = 2, lr = 0.1, wd = 0.5: w = 1 - 0.5 * 1 - 0.1 * 2 = 0.3 (no lr on the decay).
    w = [torch.tensor([1.0])]
    SGD(0.1, weight_decay=0.5, decoupled=True).step(w, [torch.tensor([2.0])], {})
    assert w[0].item() == pytest.approx(0.3)
    # After a schedule drop to lr 0.01 the decay shrinks with it: 1 - 0.1 * 0.5 - 0.01 * 2 = 0.93.
    w = [torch.tensor([1.0])]
    SGD(0.1, weight_decay=0.5, decoupled=True).step(w, [torch.tensor([2.0])], {}, lr=0.01)
    assert w[0].item() == pytest.approx(0.93)


def test_decoupled_adam_is_adamw_with_the_decay_not_scaled_by_lr():
    # torch.optim.AdamW decays by lr * wd; ours by wd (x the schedule), so AdamW(wd / lr) matches.
    torch.manual_seed(0)
    ours = [torch.randn(4, 3)]
    theirs = [ours[0].clone().requires_grad_()]
    mine = Adam(0.01, weight_decay=0.001, decoupled=True)
    state = mine.init(ours)
    reference = torch.optim.AdamW(theirs, lr=0.01, weight_decay=0.001 / 0.01)
    for _ in range(5):
        g = torch.randn(4, 3)
        mine.step(ours, [g], state)
        theirs[0].grad = g.clone()
        reference.step()
    torch.testing.assert_close(ours[0], theirs[0].detach(), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- -A vs -WB

def test_average_and_local_differ_only_in_what_the_next_round_starts_from():
    local = LocalTraining(lr=0.01, momentum=0.9, nesterov=True, optimizer_state="average")
    params = {"w": torch.zeros(3)}
    avg, own = OptimizerStates(local, params), OptimizerStates(
        LocalTraining(lr=0.01, momentum=0.9, nesterov=True, optimizer_state="local"), params)
    # Before any round both start every client from zero.
    assert torch.equal(avg.starting([0, 1])["momentum.w"], own.starting([0, 1])["momentum.w"])
    final = {"momentum.w": torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])}
    weights = torch.tensor([0.25, 0.75], dtype=torch.float64)
    avg.finish([0, 1], final, weights)
    own.finish([0, 1], final, weights)
    # -A: every client gets the weighted mean 0.25 * 1 + 0.75 * 3 = 2.5; -WB: its own.
    assert avg.starting([1, 0])["momentum.w"].tolist() == [[2.5] * 3, [2.5] * 3]
    assert own.starting([1, 0])["momentum.w"].tolist() == [[3.0] * 3, [1.0] * 3]
    assert own.starting([2])["momentum.w"].tolist() == [[0.0] * 3]  # never trained: zero
    # Plain SGD has no state to keep: both behave as reset.
    assert OptimizerStates(LocalTraining(optimizer_state="average"), params).starting([0]) is None


def trained(rounds: pd.DataFrame) -> pd.DataFrame:
    """rounds.csv without the communication columns (fedrun.diagnostics.communication.COLUMNS)."""
    return rounds.drop(columns=[c for c in COMMUNICATION if c in rounds])


@pytest.mark.parametrize("hyper", ["pd_nmom", "pd_adam"])
def test_a_and_wb_runs_agree_on_round_one_and_then_differ(tmp_path, hyper):
    common = [f"hyperparams={hyper}_a", "hyperparams.rounds=3", "hyperparams.num_clients=4",
              "hyperparams.client_fraction=1", "hyperparams.lr=0.05", "aggregator=fedavg", "partition=classes"]
    a = fedrun_rounds(common, tmp_path / "a")
    wb = fedrun_rounds(common + ["hyperparams.optimizer_state=local"], tmp_path / "wb")
    reset = fedrun_rounds(common + ["hyperparams.optimizer_state=reset"], tmp_path / "reset")
    # The same training in round 1; what goes over the wire differs (-A also sends the optimizer state).
    pd.testing.assert_frame_equal(trained(a).iloc[:1], trained(wb).iloc[:1])
    pd.testing.assert_frame_equal(trained(a).iloc[:1], trained(reset).iloc[:1])
    assert (a["bytes_up"] > wb["bytes_up"]).all() and (wb["bytes_up"] == reset["bytes_up"]).all()
    assert not np.allclose(a["N"].iloc[1:], wb["N"].iloc[1:])
    assert not np.allclose(a["N"].iloc[1:], reset["N"].iloc[1:])


def test_with_one_learner_average_and_local_are_the_same_training(tmp_path):
    common = ["hyperparams=pd_adam_a", "mode=centralized", "hyperparams.rounds=3"]
    a = fedrun_rounds(common, tmp_path / "a")
    wb = fedrun_rounds(common + ["hyperparams.optimizer_state=local"], tmp_path / "wb")
    pd.testing.assert_frame_equal(trained(a), trained(wb))  # the bytes differ: -A counts the state it would send
    assert (a["clients"] == 1).all() and a["pd_ls"].isna().all() and a["pd_vl"].isna().all()
    partition = pd.read_csv(tmp_path / "a" / "partition.csv")
    assert len(partition) == 1 and partition["examples"].iloc[0] == 400  # one learner holds everything


def test_carried_state_is_checkpointed_so_resume_is_exact(tmp_path):
    data = prepare(synthetic(num_train=120, num_test=30, channels=1, image_size=8, num_classes=4, seed=0),
                   None, None)
    local = LocalTraining(batch_size=20, lr=0.01, optimizer="adam", optimizer_state="local")

    def sim(run_dir, rounds, resume=False):
        # 2 of 4 clients a round: -WB must remember each client's own state between its rounds.
        return simulate(run_dir, data, lambda: MLP(image_size=8, hidden=[8], num_classes=4),
                        functools.partial(P.iid), A.fedavg(), local,
                        Federation(rounds=rounds, num_clients=4, client_fraction=0.5), seed=0,
                        resume=resume, progress=False)

    sim(tmp_path / "whole", 4)
    sim(tmp_path / "split", 2)
    ckpt = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)
    assert set(ckpt["optimizer_state"]) and all(isinstance(k, int) for k in ckpt["optimizer_state"])
    sim(tmp_path / "split", 4, resume=True)
    whole, split = (pd.read_csv(tmp_path / d / "rounds.csv").drop(columns=list(TIMING_COLUMNS)) for d in ("whole", "split"))
    pd.testing.assert_frame_equal(whole, split)


# ----------------------------------------------------------------------------- both engines

@pytest.mark.parametrize("optimizer", [dict(optimizer="sgd", momentum=0.9, nesterov=True),
                                       dict(optimizer="adam")])
def test_engines_agree_with_carried_state_schedule_and_augmentation(optimizer):
    from fedrun.data.augment import Augmentation

    torch.manual_seed(0)
    model = MLP(in_channels=3, image_size=8, hidden=[16])
    sizes = (13, 40, 7)
    x, y = torch.randn(sum(sizes), 3, 8, 8), torch.randint(0, 10, (sum(sizes),))
    bounds = np.cumsum([0, *sizes])
    idx = [torch.arange(bounds[i], bounds[i + 1]) for i in range(3)]
    local = LocalTraining(lr=0.01, batch_size=8, weight_decay=0.01, weight_decay_mode="decoupled",
                          optimizer_state="local", augment=Augmentation(std=(1.0, 1.0, 1.0)), **optimizer)
    params, buffers = split_state(model)
    start = local.fresh_state(params)
    # Clients that already trained: non-zero states, and (Adam) different step counters.
    states = {k: torch.stack([v + 0.01 * j for j in range(3)]) for k, v in start.items()}
    if "step" in states:
        states["step"] = torch.tensor([0.0, 3.0, 7.0], dtype=torch.float64)
    seq = on_partition(SequentialEngine, model, x, y, idx, local, None, 0).train(params, buffers, [0, 1, 2], 2, None, 0.005, states)
    bat = on_partition(BatchedEngine, model, x, y, idx, local, None, 0).train(params, buffers, [0, 1, 2], 2, None, 0.005, states)
    for k in params:
        torch.testing.assert_close(seq.deltas[k], bat.deltas[k], rtol=1e-4, atol=1e-6)
    for k in seq.opt_states:
        torch.testing.assert_close(seq.opt_states[k], bat.opt_states[k], rtol=1e-4, atol=1e-7)
    assert not torch.equal(seq.opt_states[next(iter(seq.opt_states))], states[next(iter(states))])
