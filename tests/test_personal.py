"""Personalized methods (fedrun.server.personal): FedBN, FedPer and Ditto against references written
from their papers, both engines, resume byte for byte, and their one-line refusals.

The references below train the same small case with plain torch (a manual SGD step, the papers'
algorithms as printed): 4 clients of 45 training examples, 2 a round, 2 local epochs in one full
batch (B = 64 > 45, so the batch order cannot matter), 3 rounds, every client scored on its own
held-out quarter after every round.  They take from fedrun only what is not the method: the
partition, the held-out rows and, from ``clients.csv``, which clients each round sampled.
"""
from __future__ import annotations

import functools

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, interrupted_while_recording, run_fedrun, same_run
from torch import nn

from fedrun import aggregators as A
from fedrun.client.batched import BatchedEngine
from fedrun.client.local_training import LocalTraining
from fedrun.client.sequential import SequentialEngine
from fedrun.data import partition as P
from fedrun.data.client_tests import hold_out
from fedrun.data.datasets import synthetic
from fedrun.data.preparation import prepare
from fedrun.errors import ConfigError
from fedrun.harness.federated_run import Federation
from fedrun.harness.simulation import simulate
from fedrun.models.nets import MLP
from fedrun.server.personal import Personalization

K, ROUNDS, LR, EPOCHS, HELD = 4, 3, 0.1, 2, 0.25


class BNNet(nn.Module):
    """fc1 -> BatchNorm -> ReLU -> fc2: one layer of each kind the methods keep."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x.flatten(1)))))


@pytest.fixture(scope="module")
def data():
    return prepare(synthetic(num_train=240, num_test=60, image_size=8, noise=2.0, seed=3), None, None)


def run(path, data, aggregator, engine=SequentialEngine, rounds=ROUNDS, resume=False, model=BNNet):
    return simulate(path, data, model, P.iid, aggregator, LocalTraining(epochs=EPOCHS, batch_size=64, lr=LR),
                    Federation(rounds=rounds, num_clients=K, client_fraction=0.5, client_test_fraction=HELD,
                               client_eval_every=1, client_eval_clients="all"),
                    make_engine=engine, resume=resume, progress=False)


# ----------------------------------------------------------------------------- the references

def split(data):
    parts = P.iid(labels=data.train_y.numpy(), num_clients=K, num_classes=10, seed=0)
    train, test = hold_out(parts, data.train_y.numpy(), HELD, 0)
    return [torch.as_tensor(p) for p in train], [torch.as_tensor(p) for p in test]


def local_sgd(model, x, y, epochs, anchor=None, lam=0.0):
    """``epochs`` full-batch steps ``w <- w - lr (grad F_k(w) + lam (w - anchor))`` (Ditto's line 7;
    lam = 0: plain local SGD)."""
    model.train()
    for _ in range(epochs):
        loss = F.cross_entropy(model(x), y)
        if anchor is not None:
            loss = loss + lam / 2 * sum((p - anchor[n]).pow(2).sum() for n, p in model.named_parameters())
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= LR * g


def score(model, state, x, y):
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        logits = model(x)
        return (logits.argmax(1) == y).double().mean().item(), F.cross_entropy(logits, y).item()


def reference(data, sampled, kept: set[str] | None, ditto_lam: float | None = None, ditto_epochs: int = 1):
    """FedPer / FedBN (``kept``: the layers each client keeps; the rest averaged with ``n_k / n``, the
    running statistics of shared BatchNorm layers too) or Ditto (``ditto_lam``: FedAvg's global model
    and each sampled client's personal model).  Per round, every client's personal (accuracy, loss)."""
    train, test = split(data)
    x, y = data.train_x, data.train_y
    torch.manual_seed(0)
    model = BNNet()
    glob = {k: v.clone() for k, v in model.state_dict().items()}
    own = {k: {n: v.clone() for n, v in glob.items() if ditto_lam is not None or n.rpartition(".")[0] in kept}
           for k in range(K)}
    scores = {}
    for t in range(1, ROUNDS + 1):
        trained, sizes = [], []
        for k in sampled[t]:
            start = {**glob} if ditto_lam is not None else {**glob, **own[k]}
            model.load_state_dict(start)
            local_sgd(model, x[train[k]], y[train[k]], EPOCHS)
            trained.append({n: v.detach().clone() for n, v in model.state_dict().items()})
            sizes.append(len(train[k]))
            if ditto_lam is None:
                own[k] = {n: trained[-1][n] for n in own[k]}
            else:  # the personal step from v_k, pulled toward w_t
                model.load_state_dict(own[k])
                local_sgd(model, x[train[k]], y[train[k]], ditto_epochs, anchor=glob, lam=ditto_lam)
                own[k] = {n: v.detach().clone() for n, v in model.state_dict().items()}
        p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
        for n in glob:
            if ditto_lam is None and n.rpartition(".")[0] in kept:
                continue  # the server never sees the kept layers
            if n.endswith("num_batches_tracked"):
                glob[n] = torch.stack([s[n] for s in trained]).max(0).values
            else:
                glob[n] = sum(float(w) * s[n].double() for w, s in zip(p, trained)).to(glob[n].dtype)
        scores[t] = {k: score(model, {**glob, **own[k]}, x[test[k]], y[test[k]]) for k in range(K)}
    return scores, glob, own


def check_against(path, ref_scores, ref_glob, ref_own, kept_names):
    clients = pd.read_csv(path / "clients.csv")
    for (t, k), row in clients.set_index(["round", "client"]).iterrows():
        acc, loss = ref_scores[t][k]
        assert row["pers_test_acc"] == pytest.approx(acc, abs=1e-9), (t, k)
        assert row["pers_test_loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6), (t, k)
    assert set(clients["client"]) == set(range(K)) and set(clients["round"]) == set(range(1, ROUNDS + 1))
    ckpt = torch.load(path / "checkpoint.pt", weights_only=True)
    state = {**ckpt["params"], **ckpt["buffers"]}
    for n, v in ref_glob.items():
        torch.testing.assert_close(state[n], v, rtol=1e-4, atol=1e-5, msg=n)
    kept = ckpt["aggregator"]["personal"]
    assert kept["names"] == kept_names
    for k in range(K):
        for n in kept_names:
            torch.testing.assert_close(Personalization.own(kept, [k])[n][0], ref_own[k][n], rtol=1e-4, atol=1e-5,
                                       msg=f"{k} {n}")


def sampled_clients(path) -> dict[int, list[int]]:
    clients = pd.read_csv(path / "clients.csv")
    trained = clients[clients["steps"].notna() & (clients["steps"] > 0)]
    return {t: sorted(g["client"].tolist()) for t, g in trained.groupby("round")}


BN = ["bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]


def test_fedper_equals_its_reference(tmp_path, data):
    run(tmp_path, data, A.fedper(local_layers=1))
    sampled = sampled_clients(tmp_path)
    assert all(len(c) == 2 for c in sampled.values())
    check_against(tmp_path, *reference(data, sampled, kept={"fc2"}), ["fc2.weight", "fc2.bias"])


def test_fedbn_equals_its_reference(tmp_path, data):
    run(tmp_path, data, A.fedbn())
    check_against(tmp_path, *reference(data, sampled_clients(tmp_path), kept={"bn"}), BN)


def test_ditto_equals_its_reference(tmp_path, data):
    run(tmp_path, data, A.ditto(lam=0.5, personal_epochs=1))
    net = BNNet()  # the whole model: its parameters, then its buffers
    names = [*(n for n, _ in net.named_parameters()), *(n for n, _ in net.named_buffers())]
    check_against(tmp_path, *reference(data, sampled_clients(tmp_path), None, ditto_lam=0.5), names)


def test_kept_layers_never_move_on_the_server_and_unsampled_clients_keep_w0(tmp_path, data):
    run(tmp_path, data, A.fedper())
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    torch.manual_seed(0)
    w0 = BNNet().state_dict()
    assert torch.equal(ckpt["params"]["fc2.weight"], w0["fc2.weight"])  # the global head is w_0's
    assert not torch.equal(ckpt["params"]["fc1.weight"], w0["fc1.weight"])
    sampled = {k for c in sampled_clients(tmp_path).values() for k in c}
    kept = ckpt["aggregator"]["personal"]
    assert sorted(kept["clients"].tolist()) == sorted(sampled)  # rows only for the clients that trained
    assert kept["own"]["fc2.weight"].shape[0] == len(sampled) < K
    for k in range(K):
        own = Personalization.own(kept, [k])["fc2.weight"][0]
        assert torch.equal(own, w0["fc2.weight"]) == (k not in sampled)
    # clients.csv: the global model and each client's own model scored side by side
    clients = pd.read_csv(tmp_path / "clients.csv")
    assert {"own_test_acc", "pers_test_acc"} <= set(clients.columns)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert rounds["pers_acc_mean"].notna().all()


def test_dittos_global_model_is_fedavgs(tmp_path, data):
    """Ditto's personal steps touch only the personal models: its global model, and every column
    about it, is FedAvg's to the byte."""
    run(tmp_path / "ditto", data, A.ditto(lam=0.5))
    run(tmp_path / "fedavg", data, A.fedavg())
    ditto, fedavg = (pd.read_csv(tmp_path / d / "rounds.csv") for d in ("ditto", "fedavg"))
    for col in ("test_acc", "test_loss", "N", "E", "train_loss", "client_acc_mean"):
        pd.testing.assert_series_equal(ditto[col], fedavg[col])
    assert (ditto["pers_acc_mean"] != ditto["client_acc_mean"]).any()


def test_ditto_with_lambda_zero_trains_purely_local_models(tmp_path, data):
    run(tmp_path, data, A.ditto(lam=0.0, personal_epochs=3))
    sampled = sampled_clients(tmp_path)
    ref_scores, _, ref_own = reference(data, sampled, None, ditto_lam=0.0, ditto_epochs=3)
    kept = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["aggregator"]["personal"]
    for k in range(K):
        torch.testing.assert_close(Personalization.own(kept, [k])["fc1.weight"][0], ref_own[k]["fc1.weight"],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("aggregator", [A.fedbn(), A.fedper(), A.ditto(lam=0.5)], ids=["fedbn", "fedper", "ditto"])
def test_both_engines_agree(tmp_path, data, aggregator):
    run(tmp_path / "seq", data, aggregator)
    run(tmp_path / "bat", data, aggregator, BatchedEngine)
    seq, bat = (pd.read_csv(tmp_path / d / "clients.csv") for d in ("seq", "bat"))
    pd.testing.assert_series_equal(seq["client"], bat["client"])
    for col in ("pers_test_acc", "pers_test_loss", "own_test_loss", "update_norm"):
        pd.testing.assert_series_equal(seq[col], bat[col], rtol=1e-3, atol=1e-4, check_exact=False)


@pytest.mark.parametrize("aggregator", [A.fedbn(), A.ditto(lam=0.5)], ids=["fedbn", "ditto"])
def test_resume_after_ctrl_c_is_byte_exact(tmp_path, data, monkeypatch, aggregator):
    go = functools.partial(run, data=data, aggregator=aggregator)
    go(tmp_path / "whole")
    interrupted_while_recording(monkeypatch, 3, lambda: go(tmp_path / "cut"))
    go(tmp_path / "cut", resume=True)
    same_run(tmp_path / "whole", tmp_path / "cut")
    end = [torch.load(tmp_path / d / "checkpoint.pt", weights_only=True)["aggregator"]["personal"]
           for d in ("whole", "cut")]
    assert torch.equal(end[0]["clients"], end[1]["clients"])
    assert all(torch.equal(end[0]["own"][n], end[1]["own"][n]) for n in end[0]["own"])


# ----------------------------------------------------------------------------- refusals

def test_fedbn_without_batchnorm_is_refused(tmp_path, data):
    with pytest.raises(ConfigError, match="keeps the BatchNorm layers local"):
        run(tmp_path, data, A.fedbn(), model=lambda: MLP(image_size=8, hidden=[16]))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_fedper_keeping_every_layer_is_refused(tmp_path, data):
    with pytest.raises(ConfigError, match="aggregator.local_layers"):
        run(tmp_path, data, A.fedper(local_layers=3))


@pytest.mark.parametrize("bad", [{"lam": -1.0}, {"lam": float("nan")}, {"personal_epochs": 0}])
def test_bad_ditto_settings_are_refused(bad):
    with pytest.raises(ConfigError):
        A.ditto(**bad)


def test_a_personalized_method_needs_each_clients_test_data(tmp_path, data):
    with pytest.raises(ConfigError, match="own test data"):
        simulate(tmp_path, data, BNNet, P.iid, A.fedper(), LocalTraining(batch_size=64),
                 Federation(rounds=1, num_clients=K), progress=False)


def test_one_line_refusals_from_the_cli(tmp_path):
    """What a researcher would mistype, refused in one line before a run directory is made."""
    cases = {"bn": ["aggregator=fedbn", "model=mlp", "client_test_fraction=0.2"],
             "twice": ["aggregator=ditto", "client_test_fraction=0.2", "personalize_epochs=1"],
             "untested": ["aggregator=fedper"],
             "lam": ["aggregator=ditto", "aggregator.lam=-1", "client_test_fraction=0.2"]}
    said = {"bn": "fedrun: error: aggregator=fedbn: keeps the BatchNorm layers local, and model MLP has none",
            "twice": "fedrun: error: personalize_epochs=1: fine-tunes the global model; aggregator=ditto scores",
            "untested": "fedrun: error: aggregator=fedper: scores each client's personal model on the client's own",
            "lam": "fedrun: error: aggregator.lam=-1"}
    for name, args in cases.items():
        bad = run_fedrun([*TINY, *args, f"hydra.run.dir={tmp_path / name}"], tmp_path)
        assert bad.returncode == 2, (name, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1 and bad.stderr.startswith(said[name]), (name, bad.stderr)
        assert not (tmp_path / name).exists()


def test_fedbn_runs_privately_with_its_batchnorm_kept_on_the_clients(tmp_path):
    """DP-FedAvg refuses a model whose running statistics the server averages without noise; FedBN
    keeps them on the clients, so its private run goes ahead, and reports the privacy spent."""
    pytest.importorskip("dp_accounting")
    from conftest import fedrun_ok

    run = tmp_path / "run"
    fedrun_ok([*TINY, "aggregator=fedbn", "aggregator.weighting=uniform", "model=mlp", "model.batch_norm=true",
               "client_test_fraction=0.2", "privacy.clip=1.0", f"hydra.run.dir={run}"], tmp_path)
    rounds = pd.read_csv(run / "rounds.csv")
    assert rounds["dp_epsilon"].is_monotonic_increasing and rounds["pers_acc_mean"].notna().all()
