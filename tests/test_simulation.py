"""Seeding, the recorder, and :func:`fedrun.harness.simulation.simulate` called as a library (no Hydra)."""
from __future__ import annotations

import functools
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedrun import aggregators as A
from fedrun.data import partition as P
from fedrun.data.preparation import prepare
from fedrun.data.datasets import synthetic
from fedrun.errors import ConfigError, Interrupted
from fedrun.client.local_training import LocalTraining
from fedrun.models.nets import MLP, MnistCNN
from fedrun.harness.recorder import TIMING_COLUMNS, CsvLog, Recorder, _fmt, atomic_save, summarize, write_json
from fedrun.seeding import clients_per_round, derive_seed, numpy_rng, sample_clients, torch_generator
from fedrun.harness.federated_run import Federation
from fedrun.harness.simulation import simulate

# ----------------------------------------------------------------------------- seeding

def test_derive_seed_is_pinned():
    # blake2b-64 of "0/clients/1", little-endian, >> 1.  Pinned: changing it changes every
    # published curve's client sampling, so it must not change silently.
    assert derive_seed(0, "clients", 1) == 5766893859723230331
    assert derive_seed(0) == 4246866556266386882
    assert 0 <= derive_seed(123, "x") < 2 ** 63
    assert derive_seed(0, "clients", 1) != derive_seed(0, "clients", 2) != derive_seed(1, "clients", 1)
    assert torch.equal(torch.rand(3, generator=torch_generator(0, "a")), torch.rand(3, generator=torch_generator(0, "a")))
    assert numpy_rng(0, "a").random() == numpy_rng(0, "a").random()


def test_sample_clients():
    s = sample_clients(0, 1, 100, 10)
    assert s == sorted(s) and len(set(s)) == 10 and all(0 <= k < 100 for k in s)
    assert s == sample_clients(0, 1, 100, 10)
    assert s != sample_clients(0, 2, 100, 10) and s != sample_clients(1, 1, 100, 10)
    assert sample_clients(0, 5, 4, 4) == [0, 1, 2, 3] == sample_clients(0, 5, 4, 9)
    # Over many rounds every client is sampled about equally often (10% of 200 rounds = 20).
    counts = np.bincount(np.concatenate([sample_clients(0, t, 100, 10) for t in range(1, 201)]), minlength=100)
    assert counts.sum() == 2000 and counts.min() >= 5 and counts.max() <= 40


@pytest.mark.parametrize("k,c,m", [(100, 0.1, 10), (100, 1.0, 100), (4, 0.1, 1), (4, 0.5, 2), (10, 0.01, 1)])
def test_clients_per_round(k, c, m):
    # m = max(C K, 1) (Alg. 1 line 3)
    assert clients_per_round(k, c) == m


# ----------------------------------------------------------------------------- recorder

def test_fmt():
    assert _fmt(None) == "" and _fmt(float("nan")) == ""
    assert _fmt(1 / 3) == "0.33333333"  # 8 significant digits
    assert _fmt(1.5e-12) == "1.5e-12" and _fmt(7) == "7" and _fmt("fc") == "fc"
    assert _fmt(float("inf")) == "inf"


def test_csvlog_append_and_truncate(tmp_path):
    path = tmp_path / "x.csv"
    log = CsvLog(path, ["a", "b"])
    log.append([{"a": 1, "b": 0.5}])
    size = log.size()
    log.append([{"a": 2}, {"a": 3, "b": "z,y"}])
    assert path.read_text() == 'a,b\n1,0.5\n2,\n3,"z,y"\n'
    # Resuming truncates back to the size recorded after the first row.
    CsvLog(path, ["a", "b"], truncate_to=size)
    assert path.read_text() == "a,b\n1,0.5\n"
    # Without truncate_to the file starts anew.
    CsvLog(path, ["a", "b"])
    assert path.read_text() == "a,b\n"


def test_atomic_save_and_write_json(tmp_path):
    atomic_save({"round": 3, "t": torch.arange(3)}, tmp_path / "c.pt")
    loaded = torch.load(tmp_path / "c.pt", weights_only=False)
    assert loaded["round"] == 3 and loaded["t"].tolist() == [0, 1, 2]
    write_json({"a": 1}, tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "s.json"]  # no .tmp left


def test_summarize_golden(tmp_path):
    path = tmp_path / "rounds.csv"
    path.write_text("round,test_acc,test_loss,sent_test_acc,val_acc\n"
                    "1,0.4,2.0,,\n2,,,,\n3,0.85,0.5,0.1,\n4,0.8,0.6,0.2,\n")
    s = summarize(path, [0.5, 0.8, 0.9])
    # Rows without test_acc (round 2, not evaluated) are ignored; best 0.85 at round 3.
    assert s == {"rounds": 4, "final_test_acc": 0.8, "final_test_loss": 0.6, "best_test_acc": 0.85,
                 "best_round": 3, "rounds_to_accuracy": {"0.5": 3, "0.8": 3, "0.9": None},
                 "final_sent_test_acc": 0.2}


# ----------------------------------------------------------------------------- simulate (library)

@pytest.fixture
def small_data():
    raw = synthetic(num_train=120, num_test=30, channels=1, image_size=16, num_classes=4, seed=0)
    return raw


def run_sim(run_dir, data, make_model, aggregator=None, rounds=2, resume=False, partition=None, **fed):
    return simulate(run_dir, data, make_model,
                    partition or functools.partial(P.iid),
                    aggregator or A.fednnnn(), LocalTraining(batch_size=20, lr=0.05),
                    Federation(rounds=rounds, num_clients=fed.pop("num_clients", 3),
                               client_fraction=fed.pop("client_fraction", 1.0), **fed),
                    seed=0, resume=resume, progress=False)


def test_simulate_conv_model_validation_and_eval_every(tmp_path, small_data):
    data = prepare(small_data, None, None, validation_fraction=0.25, seed=0)
    make = functools.partial(MnistCNN, in_channels=1, image_size=16, num_classes=4)
    summary = run_sim(tmp_path, data, make, rounds=3, eval_every=2)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    # Evaluated at rounds 2 (eval_every) and 3 (the last) only.
    assert rounds["test_acc"].notna().tolist() == [False, True, True]
    assert rounds["val_acc"].notna().tolist() == [False, True, True]
    # A CNN has conv and FC columns, and N^2 = N_conv^2 + N_fc^2.
    assert rounds["N_conv"].notna().all() and rounds["N_fc"].notna().all()
    assert (rounds["N_conv"] ** 2 + rounds["N_fc"] ** 2).tolist() == pytest.approx((rounds["N"] ** 2).tolist(), rel=1e-6)
    assert (rounds["N_conv"] <= rounds["E_conv"] * (1 + 1e-7)).all()
    assert (rounds["N_fc"] <= rounds["E_fc"] * (1 + 1e-7)).all()
    layers = pd.read_csv(tmp_path / "layers.csv")
    assert layers["layer"].tolist() == ["conv1", "conv2", "fc1", "fc2"] * 3
    # 90 training samples after the 25% validation split, over 3 IID clients.
    partition = pd.read_csv(tmp_path / "partition.csv")
    assert partition["examples"].sum() == 90
    assert summary["rounds"] == 3 and "final_val_acc" in summary


def test_simulate_refuses_changed_partition_on_resume(tmp_path, small_data):
    data = prepare(small_data, None, None)
    make = functools.partial(MLP, in_channels=1, image_size=16, num_classes=4, hidden=[4])
    run_sim(tmp_path, data, make, rounds=1)
    with pytest.raises(ConfigError, match="hydra.run.dir"):
        run_sim(tmp_path, data, make, rounds=2)
    with pytest.raises(ConfigError) as info:
        run_sim(tmp_path, data, make, rounds=2, resume=True,
                partition=functools.partial(P.classes, classes_per_client=2))
    assert info.value.setting == "resume"
    summary = run_sim(tmp_path, data, make, rounds=2, resume=True)
    assert summary["rounds"] == 2
    assert pd.read_csv(tmp_path / "rounds.csv")["round"].tolist() == [1, 2]


def test_checkpoint_every_resumes_from_its_last_checkpoint(tmp_path, small_data, monkeypatch):
    """checkpoint_every=2 over 5 rounds: checkpoints of the start (round 0) and after rounds 2, 4
    and 5 only.  Ctrl-C while
    round 4 is recorded leaves the checkpoint of round 2 and the rows of rounds 1-3; the resume
    (here with checkpoint_every=1: it may differ) cuts round 3 off, runs rounds 3-5 again and
    ends with the CSVs of an uninterrupted run."""
    data = prepare(small_data, None, None)
    make = functools.partial(MLP, in_channels=1, image_size=16, num_classes=4, hidden=[4])
    saved = []
    checkpoint = Recorder.checkpoint
    monkeypatch.setattr(Recorder, "checkpoint", lambda self, t, *a: (saved.append(t), checkpoint(self, t, *a)))
    run_sim(tmp_path / "whole", data, make, rounds=5, checkpoint_every=2)
    assert saved == [0, 2, 4, 5]

    write = Recorder.write

    def interrupt(self, r):
        if r.round == 4:
            raise KeyboardInterrupt
        write(self, r)

    monkeypatch.setattr(Recorder, "write", interrupt)
    with pytest.raises(Interrupted) as info:
        run_sim(tmp_path / "cut", data, make, rounds=5, checkpoint_every=2)
    assert str(info.value) == ("interrupted after round 3; resume with resume=true, which continues after "
                               "round 2, its last checkpoint (checkpoint_every)")
    assert pd.read_csv(tmp_path / "cut" / "rounds.csv")["round"].tolist() == [1, 2, 3]
    monkeypatch.setattr(Recorder, "write", write)
    saved.clear()
    run_sim(tmp_path / "cut", data, make, rounds=5, resume=True, checkpoint_every=1)
    assert saved == [3, 4, 5]
    # Ctrl-C before the first checkpoint after the start: the resume starts over, to the same results.
    monkeypatch.setattr(Recorder, "write", interrupt)
    with pytest.raises(Interrupted) as info:
        run_sim(tmp_path / "early", data, make, rounds=5, checkpoint_every=5)
    assert str(info.value) == ("interrupted after round 3; resume with resume=true, which starts over from "
                               "round 1 (no checkpoint since the start) (checkpoint_every)")
    monkeypatch.setattr(Recorder, "write", write)
    run_sim(tmp_path / "early", data, make, rounds=5, resume=True, checkpoint_every=5)
    for cut in ("cut", "early"):
        for name in ("rounds", "layers", "clients", "client_layers"):
            whole, other = (pd.read_csv(tmp_path / d / f"{name}.csv") for d in ("whole", cut))
            pd.testing.assert_frame_equal(whole.drop(columns=list(TIMING_COLUMNS), errors="ignore"),
                                          other.drop(columns=list(TIMING_COLUMNS), errors="ignore"))


def test_ctrl_c_inside_torch_save_is_an_interrupt(tmp_path, small_data, monkeypatch):
    """Ctrl-C while torch.save writes round 3's checkpoint: torch's zip writer turns it into its own
    RuntimeError ("unexpected pos"), which still stops the run as an interrupt (Interrupted: exit
    130, a resume hint), never as a crash; the resume ends with an uninterrupted run's CSVs."""
    import io

    data = prepare(small_data, None, None)
    make = functools.partial(MLP, in_channels=1, image_size=16, num_classes=4, hidden=[4])
    run_sim(tmp_path / "whole", data, make, rounds=4)

    class CutOff(io.RawIOBase):  # a file whose third write is where Ctrl-C lands
        writes = 0

        def writable(self):
            return True

        def write(self, b):
            CutOff.writes += 1
            if CutOff.writes == 3:
                raise KeyboardInterrupt
            return len(b)

    checkpoint = Recorder.checkpoint

    def cut_in_round_3(self, t, *a):
        if t == 3:
            torch.save({"w": torch.zeros(100_000)}, CutOff())  # as torch.save does it mid-file
        return checkpoint(self, t, *a)

    monkeypatch.setattr(Recorder, "checkpoint", cut_in_round_3)
    with pytest.raises(Interrupted) as info:
        run_sim(tmp_path / "cut", data, make, rounds=4)
    assert str(info.value) == "interrupted after round 2; resume with resume=true"  # round 3 not complete
    monkeypatch.setattr(Recorder, "checkpoint", checkpoint)
    run_sim(tmp_path / "cut", data, make, rounds=4, resume=True)
    for name in ("rounds", "layers", "clients"):
        whole, other = (pd.read_csv(tmp_path / d / f"{name}.csv") for d in ("whole", "cut"))
        pd.testing.assert_frame_equal(whole.drop(columns=list(TIMING_COLUMNS), errors="ignore"),
                                      other.drop(columns=list(TIMING_COLUMNS), errors="ignore"))


def test_simulate_skipped_round_keeps_model(tmp_path, small_data):
    """Norm-Norm with eps = 2: N <= E < 2 E always (Proposition 1), so every round is skipped,
    recorded as such, and w_t never moves (sec. 4.2: "return w_t as is")."""
    data = prepare(small_data, None, None)
    make = functools.partial(MLP, in_channels=1, image_size=16, num_classes=4, hidden=[4])
    run_sim(tmp_path, data, make, aggregator=A.normnorm(eps=2.0), rounds=2)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert rounds["skipped"].tolist() == [1, 1]
    assert rounds["server_step"].tolist() == [0, 0] and rounds["server_step_sum"].tolist() == [0, 0]
    # The model never moved: same accuracy both rounds (the average model is evaluated).
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    torch.manual_seed(0)
    w0 = dict(make().named_parameters())
    assert all(torch.equal(ckpt["params"][k], w0[k].detach()) for k in w0)
    assert math.isfinite(rounds["test_acc"].iloc[-1])
