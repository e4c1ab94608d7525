"""Communication cost (fedrun/diagnostics/communication.py): the bytes columns of rounds.csv, by
hand, from the payload formula to a whole run from the command line and its resume."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from conftest import TINY, fedrun_ok, run_fedrun, same_run, snapshot, tiny_mlp
from torch import nn

from fedrun import aggregators as A
from fedrun.client.local_training import LocalTraining, OptimizerStates
from fedrun.client.participation import Participation
from fedrun.data import partition as P
from fedrun.data.datasets import synthetic
from fedrun.data.preparation import prepare
from fedrun.diagnostics.communication import Payload, method_payload, nbytes, payload
from fedrun.errors import Interrupted
from fedrun.harness.federated_run import FederatedRun, Federation
from fedrun.harness.recorder import Recorder
from fedrun.harness.round_record import RoundRecord
from fedrun.harness.simulation import simulate
from fedrun.models.nets import MLP
from fedrun.params import split_state

# tiny_mlp: 16 -> 8 -> 10, P = 16*8 + 8 + 8*10 + 10 = 226 parameters, float32: 904 bytes.
P_MLP = 226
# TINY's model on the synthetic 28x28 images: 784 -> 8 -> 10, P = 784*8 + 8 + 8*10 + 10 = 6370.
P_TINY = 6370


def mlp_state():
    return split_state(tiny_mlp())


def test_payload_of_an_mlp_three_clients_one_dropped():
    params, buffers = mlp_state()
    assert sum(p.numel() for p in params.values()) == P_MLP and buffers == {}
    assert nbytes(params) == P_MLP * 4 and nbytes(None) == 0
    each = payload(params, buffers)
    assert each == Payload(down=P_MLP * 4, up=P_MLP * 4) == Payload(904, 904)
    # 3 sampled clients, 1 dropped out: all 3 received the model, 2 sent an update back.
    assert each.round(reported=2, dropped=1) == (3 * P_MLP * 4, 2 * P_MLP * 4) == (2712, 1808)
    assert each.round(reported=0, dropped=3) == (2712, 0)  # everyone dropped: nothing came back


@pytest.mark.parametrize("aggregator,copies", [(A.fedavg(), 1), (A.fedprox(), 1), (A.fednova(), 1), (A.fedlap(), 1),
                                               (A.fednnnn(), 1), (A.krum(), 1), (A.scaffold(), 2)])
def test_each_methods_payload(aggregator, copies):
    # SCAFFOLD sends c with the model and c_k+ - c_k with the update: twice FedAvg's bytes both ways;
    # FedNova's normalized update, FedProx's and FedLap's, the robust and server-side methods': the model's.
    params, buffers = mlp_state()
    each = method_payload(params, buffers, aggregator, OptimizerStates(LocalTraining(), params))
    assert each == Payload(copies * 904, copies * 904)
    assert each.round(2, 1) == (copies * 2712, copies * 1808)


def test_the_optimizer_state_counts_where_the_server_averages_it():
    params, buffers = mlp_state()
    fedavg = A.fedavg()

    def each(**local):
        return method_payload(params, buffers, fedavg, OptimizerStates(LocalTraining(**local), params)).down

    assert each(momentum=0.9) == 904  # reset every round: nothing travels
    assert each(momentum=0.9, optimizer_state="local") == 904  # each client keeps its own
    assert each(momentum=0.9, optimizer_state="average") == 904 + 904  # the momentum buffers, P floats
    # Adam: exp_avg and exp_avg_sq (2P floats) and the step count, a float64 scalar.
    assert each(optimizer="adam", lr=0.001, optimizer_state="average") == 3 * 904 + 8
    assert each(optimizer_state="average") == 904  # plain SGD has no state to average


def test_buffers_and_dtypes_count_at_their_size():
    # Linear(16, 8) + BatchNorm1d(8): P = 128 + 8 + 8 + 8 = 152 floats (608 bytes); the buffers
    # running_mean and running_var (8 floats each, 64 bytes) and num_batches_tracked (int64, 8).
    params, buffers = split_state(nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8)))
    assert nbytes(params) == 608 and nbytes(buffers) == 72
    assert payload(params, buffers) == Payload(680, 680)
    assert method_payload(params, buffers, A.scaffold(), OptimizerStates(LocalTraining(), params)).up == 608 + 680
    double, _ = split_state(tiny_mlp().double())  # float64: 8 bytes a parameter
    assert payload(double).down == P_MLP * 8


def test_the_recorder_keeps_the_running_total(tmp_path):
    recorder = Recorder(SimpleNamespace(path=tmp_path), [], {}, "fingerprint", payload=Payload(down=10, up=7))
    rounds = [RoundRecord(1, 0.1, {5: 12}, set(), clients=[1, 2]),  # 3 sampled, 1 dropped
              RoundRecord(2, 0.1, {}, set(), clients=[0, 3, 4]),  # all 3 reported
              RoundRecord(3, 0.1, {0: 9, 1: 9}, set(), clients=[])]  # everyone dropped: the server keeps w_t
    rows = [recorder.communicated(r) for r in rounds]
    assert rows == [{"bytes_down": 30, "bytes_up": 14, "bytes_total": 44},
                    {"bytes_down": 30, "bytes_up": 21, "bytes_total": 95},
                    {"bytes_down": 20, "bytes_up": 0, "bytes_total": 115}]
    assert Recorder(SimpleNamespace(path=tmp_path), [], {}, "f").communicated(rounds[0]) == {}  # no payload


# ----------------------------------------------------------------------------- whole runs

# 4 clients, 3 a round (C = 0.75), one of the 3 dropped each round (round(0.34 x 3) = 1).
DROPPING = [*TINY, "hyperparams.client_fraction=0.75", "hyperparams.dropouts=0.34"]


@pytest.fixture(scope="module")
def dropping_run(tmp_path_factory):
    top = tmp_path_factory.mktemp("communication")
    fedrun_ok([*DROPPING, f"hydra.run.dir={top / 'run'}"], top)
    return top / "run"


def test_a_run_from_the_command_line_has_the_bytes_by_hand(dropping_run, tmp_path):
    rounds = pd.read_csv(dropping_run / "rounds.csv")
    assert list(rounds.columns[-6:-3]) == ["bytes_down", "bytes_up", "bytes_total"]
    assert rounds["clients"].tolist() == [2, 2] and rounds["dropped"].tolist() == [1, 1]
    # 3 received w_t (P floats, 4 bytes each), 2 sent their update back.
    assert rounds["bytes_down"].tolist() == [3 * P_TINY * 4] * 2 == [76440] * 2
    assert rounds["bytes_up"].tolist() == [2 * P_TINY * 4] * 2 == [50960] * 2
    assert rounds["bytes_total"].tolist() == [127400, 254800]
    clients = pd.read_csv(dropping_run / "clients.csv")  # who received and who answered, as counted
    assert clients.groupby("round").size().tolist() == [3, 3] and clients["dropped"].sum() == 2
    # SCAFFOLD: c down with the model, c_k+ - c_k up with the update.
    fedrun_ok([*DROPPING, "aggregator=scaffold", f"hydra.run.dir={tmp_path / 'scaffold'}"], tmp_path)
    scaffold = pd.read_csv(tmp_path / "scaffold" / "rounds.csv")
    assert scaffold["bytes_down"].tolist() == [2 * 76440] * 2 and scaffold["bytes_up"].tolist() == [2 * 50960] * 2
    assert scaffold["bytes_total"].tolist() == [254800, 509600]


def tiny_run(run_dir, resume=False):
    """6 clients, 3 a round with 1 dropped, 4 rounds, a checkpoint every 2 rounds."""
    data = prepare(synthetic(num_train=120, num_test=40, image_size=6, noise=0.5), None, None)
    return simulate(run_dir, data, lambda: MLP(image_size=6, hidden=[8]), P.iid, A.fedavg(),
                    LocalTraining(batch_size=20), Federation(rounds=4, num_clients=6, client_fraction=0.5,
                                                             checkpoint_every=2),
                    Participation(dropouts=0.34), resume=resume, progress=False)


def test_a_resumed_run_continues_the_total_exactly(tmp_path, monkeypatch):
    tiny_run(tmp_path / "straight")
    record = FederatedRun.record

    def stop_in_round_4(run, r):  # rounds 1-3 recorded, the checkpoint after round 2
        if r.round == 4:
            raise KeyboardInterrupt
        return record(run, r)

    monkeypatch.setattr(FederatedRun, "record", stop_in_round_4)
    with pytest.raises(Interrupted):
        tiny_run(tmp_path / "stopped")
    assert pd.read_csv(tmp_path / "stopped" / "rounds.csv")["round"].tolist() == [1, 2, 3]
    monkeypatch.setattr(FederatedRun, "record", record)
    tiny_run(tmp_path / "stopped", resume=True)  # round 3's row cut, rounds 3-4 run again from round 2's total
    same_run(tmp_path / "straight", tmp_path / "stopped")
    # MLP 36 -> 8 -> 10: P = 36*8 + 8 + 8*10 + 10 = 386 floats; 3 received, 2 reported a round.
    per_round = 3 * 386 * 4 + 2 * 386 * 4
    totals = pd.read_csv(tmp_path / "stopped" / "rounds.csv")["bytes_total"].tolist()
    assert totals == [per_round * t for t in (1, 2, 3, 4)] and per_round == 7720
    assert torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=False)["bytes_total"] == 4 * per_round


def test_resuming_a_run_from_before_the_bytes_columns_is_one_line(dropping_run, tmp_path):
    # A run of a fedrun before the bytes columns: its rows cannot be continued (every later column
    # would shift), so the resume is refused in one line naming what is missing, touching nothing.
    old = tmp_path / "old"
    shutil.copytree(dropping_run, old)
    pd.read_csv(old / "rounds.csv").drop(columns=["bytes_down", "bytes_up", "bytes_total"]).to_csv(
        old / "rounds.csv", index=False)
    (old / "summary.json").unlink()
    before = snapshot(old)
    proc = run_fedrun([*DROPPING, f"hydra.run.dir={old}", "resume=true"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"fedrun: error: {old / 'rounds.csv'}: has other columns than this fedrun writes (without "
                     "bytes_down, bytes_up, bytes_total: another version wrote it); resume it with that version, or "
                     "start a new run directory (fedrun.results and fedrun-plot still read it)"]
    assert snapshot(old) == before


def test_the_summary_says_what_the_run_sent_and_what_reaching_each_target_took(tmp_path):
    from fedrun.harness.recorder import summarize
    rounds = tmp_path / "rounds.csv"
    rounds.write_text("round,test_acc,test_loss,bytes_total,client_acc_mean,client_acc_worst10\n"
                      "1,0.4,2.0,100,0.3,0.1\n2,0.6,1.5,250,,\n3,0.55,1.6,400,0.5,0.2\n")
    out = summarize(rounds, [0.5, 0.9])
    assert out["bytes_total"] == 400 and out["rounds_to_accuracy"] == {"0.5": 2, "0.9": None}
    assert out["bytes_to_accuracy"] == {"0.5": 250, "0.9": None}
    assert (out["final_client_acc_mean"], out["final_client_acc_worst10"]) == (0.5, 0.2)
