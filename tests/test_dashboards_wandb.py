"""logger=wandb: a W&B run holds the run's settings as its config, its tags, every round's values
at step=round, the summary and the run's files, read back from W&B's own offline run files
(``WANDB_MODE=offline``: no network, no login).  Skipped without wandb (``fedrun[wandb]``), but
the refusal without it, which needs no wandb."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import TINY, fedrun_ok

from fedrun.errors import ConfigError
from fedrun.harness import dashboard_values, dashboards
from fedrun.harness.provenance import git_state

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="pip install 'fedrun[wandb]'")


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    """W&B offline, all its folders in tmp_path (its run folders under WANDB_DIR, its artifacts'
    staging copies, cache and settings), with no login: nothing leaves the machine or the test."""
    folder = tmp_path / "wandb-files"
    for name, path in (("WANDB_DIR", folder), ("WANDB_DATA_DIR", tmp_path / "wandb-data"),
                       ("WANDB_CACHE_DIR", tmp_path / "wandb-cache"), ("WANDB_CONFIG_DIR", tmp_path / "wandb-config")):
        path.mkdir()
        monkeypatch.setenv(name, str(path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return folder


def _chunks(path: Path):
    """The records of a ``.wandb`` file: LevelDB's log format (32 KiB blocks of chunks, each with a
    7-byte header: checksum, length, kind full/first/middle/last) after W&B's 7-byte file header."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def logged(folder: str | Path) -> dict:
    """What an offline W&B run folder holds: the run (id, name, tags, notes, config), its history
    by step, its summary, its artifacts (name -> file names) and its exit code."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(folder).glob("run-*.wandb")
    out = {"config": {}, "history": {}, "summary": {}, "artifacts": {}, "exit": None}

    def key(item):
        return item.key or "/".join(item.nested_key)

    for data in _chunks(path):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            values = {key(i): json.loads(i.value_json) for i in record.history.item}
            out["history"][int(values["_step"])] = values
        elif kind == "summary":
            out["summary"].update({key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "artifact":
            out["artifacts"][record.artifact.name] = (record.artifact.type,
                                                      sorted(c.path for c in record.artifact.manifest.contents))
        elif kind == "exit":
            out["exit"] = record.exit.exit_code
    out["config"].pop("_wandb", None)
    return out


@needs_wandb
def test_a_run_is_a_wandb_run_with_its_settings_tags_rounds_summary_and_files(tmp_path, offline):
    run = tmp_path / "run"
    fedrun_ok([*TINY, "logger=wandb", f"hydra.run.dir={run}"], tmp_path)
    marker = json.loads((run / "wandb.json").read_text())
    (folder,) = marker["folders"]
    assert Path(folder).parent == offline / "wandb" and Path(folder).name.endswith(marker["run_id"])
    got = logged(folder)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert got["run"].run_id == marker["run_id"] and got["run"].project == marker["project"] == "fedrun"
    assert got["run"].display_name == dashboard_values.run_name(config, run)
    # The config: the settings MLflow gets as parameters, nested, numbers kept numbers.
    from fedrun.harness.wandb_logger import wandb_config

    assert got["config"] == json.loads(json.dumps(wandb_config(config)))
    assert got["config"]["hyperparams"]["rounds"] == 2 and got["config"]["aggregator"]["beta"] == 0.7
    assert got["config"]["choices"]["aggregator"] == "fednnnn"
    assert not {"logger", "resume", "data_root", "progress", "federation", "local"} & set(got["config"])
    assert "_target_" not in got["config"]["aggregator"]
    flat = dashboard_values._flat(got["config"])
    assert set(flat) == set(dashboard_values.run_params(config))  # MLflow's parameters, key for key
    tags = set(got["run"].tags)
    assert {"aggregator=fednnnn", "dataset=synthetic", "model=mlp", "partition=shards", "seed=0"} <= tags
    assert any(t.startswith("fedrun_version=") for t in tags) and all(len(t) <= 64 for t in tags)
    commit = git_state()[0]
    assert (f"git_commit={commit}" in tags) if commit else not any(t.startswith("git_commit=") for t in tags)
    assert got["run"].notes.startswith("fedrun dataset=synthetic") and str(run.resolve()) in got["run"].notes
    # Every round at step=round, as rounds.csv and layers.csv hold it.
    rounds, layers = pd.read_csv(run / "rounds.csv"), pd.read_csv(run / "layers.csv")
    assert sorted(got["history"]) == [1, 2]
    assert [got["history"][t]["round/test_acc"] for t in (1, 2)] == pytest.approx(rounds.test_acc.tolist(), rel=1e-6)
    first = layers.layer.iloc[0]
    assert [got["history"][t][f"layer/{first}/N"] for t in (1, 2)] == \
        pytest.approx(layers[layers.layer == first].N.tolist(), rel=1e-6)
    summary = json.loads((run / "summary.json").read_text())
    for name in ("final_test_acc", "best_test_acc", "best_round", "final_test_loss"):
        assert got["summary"][name] == pytest.approx(summary[name], rel=1e-6)
    kind, files = got["artifacts"][f"fedrun-{marker['run_id']}"]
    assert kind == "fedrun-run"
    assert {"rounds.csv", "layers.csv", "config.yaml", "summary.json", "fedrun.log"} <= set(files)
    assert got["exit"] == 0


@needs_wandb
def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, offline):
    """The W&B run's id is kept in the run directory: a second session (a resume) logs into the
    same run, from the round it starts at, in a folder of its own that `wandb sync` uploads into it."""
    from fedrun.harness.wandb_logger import WandB

    first = WandB()
    first.start(tmp_path, None, 1)
    first.log(1, {"test_acc": 0.1}, [])
    first.close(None)
    resumed = WandB()
    resumed.start(tmp_path, None, 2)
    for t, acc in ((2, 0.2), (3, 0.3)):
        resumed.log(t, {"test_acc": acc}, [{"layer": "fc1", "N": 1.0, "pd_vl": None}])
    resumed.close({"rounds": 3, "final_test_acc": 0.3})
    marker = json.loads((tmp_path / "wandb.json").read_text())
    one, two = (logged(f) for f in marker["folders"])
    assert one["run"].run_id == two["run"].run_id == marker["run_id"]
    assert {t: h["round/test_acc"] for t, h in one["history"].items()} == {1: 0.1}
    assert {t: h["round/test_acc"] for t, h in two["history"].items()} == pytest.approx({2: 0.2, 3: 0.3})
    assert "layer/fc1/pd_vl" not in two["history"][2]  # no value that round: no point
    assert two["summary"]["final_test_acc"] == 0.3


def test_wandb_without_the_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails, as where it is not installed
    with pytest.raises(ConfigError, match=r"^logger=wandb: needs the wandb package: pip install 'fedrun\[wandb\]' "
                                          r"\(or pip install wandb\)$"):
        dashboards.dashboards({"wandb": True})
    with pytest.raises(ConfigError, match=r"^logger\.use=comet: choose among tensorboard, mlflow, wandb "):
        dashboards.dashboards({"comet": True})


@needs_wandb
def test_wandb_settings_and_a_run_it_cannot_start_are_one_line(tmp_path, monkeypatch, offline):
    from fedrun.harness.wandb_logger import WandB

    assert isinstance(dashboards.dashboards({"wandb": True}), WandB)
    with pytest.raises(ConfigError, match=r"^logger\.wandb_mode=cloud: choose online, offline, disabled"):
        WandB(wandb_mode="cloud")
    # Online with no login and no terminal to ask for one: W&B's refusal, in one line, and how to go on.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    dash = WandB(wandb_mode="online")
    with pytest.raises(ConfigError, match=r"^logger=wandb: W&B cannot start the run: .*\(log in with `wandb login`, "
                                          r"or log offline: logger\.wandb_mode=offline, then `wandb sync`\)$"):
        dash.start(tmp_path, None, 1)
    assert not (tmp_path / "wandb.json").exists()
