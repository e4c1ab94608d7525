"""logger=tensorboard / logger=mlflow: the dashboards hold the CSVs' values, round by round, and
each run's identity (hparams, name, tags, params) and summary, read back from the stores."""
from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
import yaml
from conftest import TINY, fedrun_ok, run_fedrun

from fedrun.harness import dashboard_values, dashboards
from fedrun.harness.provenance import git_state
from fedrun.errors import ConfigError

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="pip install 'fedrun[dashboards]'")
needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="pip install 'fedrun[dashboards]'")
INTERNAL = ("_target_", "_partial_", "_convert_")


def config_of(overrides: list[str], **settings) -> dict:
    """A config.yaml as fedrun writes it, small: choices, overrides and the settings given."""
    return {"seed": 0, "hyperparams": {"rounds": 2, "lr": 0.05}, "aggregator": {"_target_": "x", "beta": 0.7},
            "choices": {"aggregator": "fednnnn", "dataset": "synthetic", "logger": "mlflow", "scale": None},
            "overrides": overrides, **settings}


def write_sweep(top, task: list[str], params: dict | None = None) -> None:
    """The multirun.yaml Hydra writes at the top of a sweep."""
    top.mkdir(parents=True, exist_ok=True)
    hydra = {"overrides": {"task": task}, "sweeper": {"params": params}}
    (top / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra}))


def test_a_run_is_named_by_its_method_and_what_its_sweep_varies(tmp_path):
    job = config_of(["dataset=synthetic", "progress=False", "aggregator.beta=0.5", "seed=1"])
    write_sweep(tmp_path / "sweep", ["dataset=synthetic", "progress=false", "aggregator.beta=0.5,0.9", "seed=range(2)"])
    job["aggregator"]["beta"], job["seed"] = 0.5, 1
    assert dashboard_values.swept_keys(tmp_path / "sweep" / "3") == ["aggregator.beta", "seed"]
    assert dashboard_values.run_name(job, tmp_path / "sweep" / "3") == "fednnnn beta=0.5 seed=1"
    # A swept aggregator is the name's first word, not a key=value; Optuna's params are swept too.
    write_sweep(tmp_path / "opt", ["aggregator=fedavg,fednnnn"], {"hyperparams.lr": "interval(0.01, 0.1)"})
    assert dashboard_values.run_name(config_of(["aggregator=fednnnn", "hyperparams.lr=0.05"]), tmp_path / "opt" / "0") == \
        "fednnnn lr=0.05"
    # No sweep: what the command line set, but not how the run was launched.
    alone = config_of(["dataset=synthetic", "hyperparams.rounds=2", "progress=false", "device=cpu",
                       "logger=mlflow", "+tags.note=x"])
    assert dashboard_values.swept_keys(tmp_path / "alone") is None
    assert dashboard_values.run_name(alone, tmp_path / "alone") == "fednnnn dataset=synthetic rounds=2"
    assert dashboard_values.run_name(None, tmp_path / "alone") == "alone"


def test_hparams_params_and_tags_leave_out_hydra_and_mirror_keys():
    config = config_of(["hyperparams.lr=0.05", "aggregator.beta=0.7"], centralized=False,
                       local={"_target_": "x", "_convert_": "all", "lr": 0.05},
                       federation={"_target_": "y", "rounds": 2}, participation={"_target_": "z", "dropouts": 0.0},
                       partition={"_target_": "p", "_partial_": True, "alpha": 0.1}, tags={"paper": "fednnnn"})
    hparams = dashboard_values.run_hparams(config, "r")
    assert hparams == {"aggregator": "fednnnn", "dataset": "synthetic", "seed": 0, "hyperparams.rounds": 2,
                       "hyperparams.lr": 0.05, "aggregator.beta": 0.7, "partition.alpha": 0.1}
    params = dashboard_values.run_params(config)
    assert not [k for k in params if k.endswith(INTERNAL) or k.startswith(("federation.", "local.", "participation."))]
    assert params["partition.alpha"] == "0.1" and params["choices.scale"] == "null"
    assert params["overrides"] == "hyperparams.lr=0.05 aggregator.beta=0.7"
    tags = dashboard_values.run_tags(config, "r")
    assert {k: tags[k] for k in ("aggregator", "dataset", "seed", "paper")} == \
        {"aggregator": "fednnnn", "dataset": "synthetic", "seed": "0", "paper": "fednnnn"}
    assert "scale" not in tags and tags["fedrun_version"] and tags["run_dir"].endswith("r")


def test_mlflow_params_leave_out_how_a_run_was_carried_out_and_tags_name_its_commit(monkeypatch):
    """Dashboards, resuming, where the data is read from, the progress bar: no setting of what a run
    computes, so no MLflow parameter; the commit of fedrun's source is MLflow's own git tag."""
    from fedrun.harness import provenance

    logger = {"_target_": "fedrun.harness.dashboards.dashboards", "use": {"mlflow": True},
              "tracking_uri": "mlflow.db", "experiment": "fedrun"}
    config = config_of(["logger=mlflow", "resume=true", "threads=1"], logger=logger, resume=True,
                       data_root="/data/here", progress=False, checkpoint_every=1, threads=1,
                       dataset={"name": "synthetic", "max_train": 200,
                                "load": {"root": "/data/here", "download": True, "search": [], "num_train": 400}})
    params = dashboard_values.run_params(config)
    carried = [k for k in params if k.split(".")[0] in ("logger", "resume", "data_root", "progress", "checkpoint_every")
               or k in ("choices.logger", "dataset.load.root", "dataset.load.download", "dataset.load.search")]
    assert carried == []
    assert params["threads"] == "1" and params["dataset.max_train"] == "200" and params["dataset.load.num_train"] == "400"
    assert params["choices.aggregator"] == "fednnnn" and params["overrides"] == "logger=mlflow resume=true threads=1"
    monkeypatch.setattr(provenance, "git_state", lambda: ("0123abc", True))
    tags = dashboard_values.run_tags(config, "r")
    assert tags["mlflow.source.git.commit"] == "0123abc" and tags["git_dirty"] == "true"
    monkeypatch.setattr(provenance, "git_state", lambda: (None, None))  # an installed wheel: no commit to name
    assert not {"mlflow.source.git.commit", "git_dirty"} & set(dashboard_values.run_tags(config, "r"))


@needs_tensorboard
def test_tensorboard_mirrors_rounds_and_layers_with_hparams_and_summary(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    run = tmp_path / "tb"
    fedrun_ok(TINY + ["logger=tensorboard", f"hydra.run.dir={run}"], tmp_path)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    rounds, layers = pd.read_csv(run / "rounds.csv"), pd.read_csv(run / "layers.csv")
    acc = events.Scalars("round/test_acc")
    assert [e.step for e in acc] == [1, 2]
    assert [e.value for e in acc] == pytest.approx(rounds.test_acc.tolist(), rel=1e-6)
    first = layers.layer.iloc[0]
    n = events.Scalars(f"layer/{first}/N")
    assert [e.value for e in n] == pytest.approx(layers[layers.layer == first].N.tolist(), rel=1e-6)
    # HParams: the run's identity, the summary values as its metrics, a session that ended well.
    plugin = events.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(plugin[metadata.SESSION_START_INFO_TAG])
    hparams = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
    assert {k: hparams[k] for k in ("aggregator", "dataset", "model", "partition", "seed", "hyperparams.rounds",
                                    "hyperparams.num_clients", "aggregator.beta")} == \
        {"aggregator": "fednnnn", "dataset": "synthetic", "model": "mlp", "partition": "shards", "seed": 0,
         "hyperparams.rounds": 2, "hyperparams.num_clients": 4, "aggregator.beta": 0.7}
    assert not [k for k in hparams if k.endswith(INTERNAL) or k.split(".")[0] in ("logger", "progress", "local")]
    experiment = metadata.parse_experiment_plugin_data(plugin[metadata.EXPERIMENT_TAG])
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics == [f"summary/{m}" for m in ("final_test_acc", "best_test_acc", "best_round", "final_test_loss")]
    assert sorted(h.name for h in experiment.hparam_infos) == sorted(hparams)
    summary = json.loads((run / "summary.json").read_text())
    for tag in metrics:
        (point,) = events.Scalars(tag)
        assert point.value == pytest.approx(summary[tag.split("/")[1]], rel=1e-6) and point.step == 2
    end = metadata.parse_session_end_info_plugin_data(plugin[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS


@needs_tensorboard
def test_tensorboard_resume_drops_the_interrupted_rounds(tmp_path):
    """A process killed after checkpointing round 1 but logging round 2: the resumed process
    starts at round 2 and the dashboard keeps its values, not the lost ones."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedrun.harness.dashboards import TensorBoard

    first = TensorBoard()
    first.start(tmp_path, None, 1)
    for t, acc in ((1, 0.1), (2, 0.9)):
        first.log(t, {"test_acc": acc}, [])
    first.close(None)
    resumed = TensorBoard()
    resumed.start(tmp_path, None, 2)
    for t, acc in ((2, 0.2), (3, 0.3)):
        resumed.log(t, {"test_acc": acc}, [{"layer": "fc1", "N": 1.0, "E": 2.0, "pd_vl": None}])
    resumed.close({"rounds": 3, "final_test_acc": 0.3})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("round/test_acc")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert "layer/fc1/pd_vl" not in events.Tags()["scalars"]  # no value that round: no point
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("summary/final_test_acc")] == [(3, 0.3)]


@needs_mlflow
def test_mlflow_sweep_runs_are_named_tagged_and_hold_rounds_summary_and_files(tmp_path):
    import mlflow

    from fedrun.harness.dashboards import MLflow

    sweep, db = tmp_path / "sweep", tmp_path / "mlflow.db"
    fedrun_ok(["-m", *TINY, "logger=mlflow", f"logger.tracking_uri={db}", "aggregator.beta=0.5,0.9",
               f"hydra.sweep.dir={sweep}"], tmp_path, timeout=300)
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}")
    for job, beta in (("0", "0.5"), ("1", "0.9")):
        run = sweep / job
        marker = json.loads((run / "mlflow.json").read_text())
        got = client.get_run(marker["run_id"])
        assert got.info.run_name == f"fednnnn beta={beta}"  # not "0", "1"
        tags = got.data.tags
        assert {k: tags[k] for k in ("aggregator", "dataset", "model", "partition", "seed")} == \
            {"aggregator": "fednnnn", "dataset": "synthetic", "model": "mlp", "partition": "shards", "seed": "0"}
        assert tags["run_dir"] == str(run.resolve()) and tags["fedrun_version"]
        params = got.data.params
        assert params["hyperparams.rounds"] == "2" and params["choices.aggregator"] == "fednnnn"
        assert params["aggregator.beta"] == beta
        assert not [k for k in params if k.endswith(INTERNAL) or k.startswith(("federation.", "local.",
                                                                              "participation."))]
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert len(params) == len(dashboard_values.run_params(config)) < 90  # was 109 with Hydra's keys and the mirrors
        assert not [k for k in params if k.split(".")[0] in ("logger", "resume", "data_root", "progress")]
        assert tags.get("mlflow.source.git.commit") == git_state()[0]  # None where fedrun runs from no clone
        history = sorted(client.get_metric_history(marker["run_id"], "round.test_acc"), key=lambda m: m.step)
        assert [m.step for m in history] == [1, 2]
        assert [m.value for m in history] == pytest.approx(pd.read_csv(run / "rounds.csv").test_acc.tolist(), rel=1e-6)
        summary = json.loads((run / "summary.json").read_text())
        metrics = got.data.metrics
        for name in ("final_test_acc", "best_test_acc", "best_round", "final_test_loss"):
            assert metrics[name] == pytest.approx(summary[name], rel=1e-6)
        files = {f.path for f in client.list_artifacts(marker["run_id"])}
        assert {"rounds.csv", "layers.csv", "clients.csv", "config.yaml", "summary.json"} <= files
        assert got.info.status == "FINISHED"
    assert (tmp_path / "mlartifacts").is_dir()  # beside the SQLite file, not in the working directory
    resumed = MLflow(tracking_uri=str(db))
    resumed.start(sweep / "0", None, 3)
    assert resumed.run_id == json.loads((sweep / "0" / "mlflow.json").read_text())["run_id"]  # the same MLflow run


@needs_mlflow
def test_mlflow_logs_the_params_in_batches(tmp_path, monkeypatch):
    import mlflow

    calls = []
    monkeypatch.setattr(mlflow.tracking.MlflowClient, "log_param", lambda *a, **k: pytest.fail("one param a call"))
    batch = mlflow.tracking.MlflowClient.log_batch
    monkeypatch.setattr(mlflow.tracking.MlflowClient, "log_batch",
                        lambda self, run_id, metrics=(), params=(), tags=(), **k:
                        calls.append(len(params)) or batch(self, run_id, metrics=metrics, params=params, tags=tags))
    config = config_of([], extra={f"k{i}": i for i in range(150)})
    dash = dashboards.MLflow(tracking_uri=str(tmp_path / "m.db"))
    dash.start(tmp_path, config, 1)
    assert calls == [100, len(dashboard_values.run_params(config)) - 100]  # MLflow takes 100 params a batch
    assert len(dash.client.get_run(dash.run_id).data.params) == len(dashboard_values.run_params(config))


def test_a_missing_tracking_store_is_one_line(tmp_path):
    if importlib.util.find_spec("mlflow") is None:
        proc = run_fedrun(TINY + ["logger=mlflow"], tmp_path)
        assert proc.returncode == 2 and "needs the mlflow package" in proc.stderr
        return
    proc = run_fedrun(TINY + ["logger=mlflow", "logger.tracking_uri=nosuchscheme://x", f"hydra.run.dir={tmp_path / 'r'}"],
                      tmp_path, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith("fedrun: error: logger.tracking_uri=nosuchscheme://x")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "rounds.csv").exists()  # nothing that would block a retry


@needs_tensorboard
@needs_mlflow
def test_two_dashboards_at_once_get_the_same_rounds(tmp_path):
    """``logger=[tensorboard,mlflow]``: both are fed every round (Lightning's list of loggers); each
    keeps its own settings; one option alone builds that dashboard alone; an unknown kind is one line."""
    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, db = tmp_path / "run", tmp_path / "m.db"
    fedrun_ok([*TINY, "logger=[tensorboard,mlflow]", f"logger.tracking_uri={db}", f"hydra.run.dir={run}"], tmp_path)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tb = [(e.step, round(e.value, 6)) for e in events.Scalars("round/test_acc")]
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}")
    run_id = json.loads((run / "mlflow.json").read_text())["run_id"]
    ml = sorted((m.step, round(m.value, 6)) for m in client.get_metric_history(run_id, "round.test_acc"))
    rounds = pd.read_csv(run / "rounds.csv")
    assert tb == ml == [(int(r), round(a, 6)) for r, a in zip(rounds["round"], rounds["test_acc"])]
    assert isinstance(dashboards.dashboards({"tensorboard": True}), dashboards.TensorBoard)
    assert dashboards.dashboards({}) is None
    with pytest.raises(ConfigError, match=r"^logger\.use=comet: choose among tensorboard, mlflow, wandb"):
        dashboards.dashboards({"comet": True})


@pytest.mark.parametrize("line", ["seed=0,1,2", "seed=range(2)", "seed=range(0,3)", "aggregator=fedavg,fednnnn",
                                  "model.hidden=[8,16]", "model.hidden=[8,16],[32]", "tags.note='a,b'",
                                  "tags.note=\"a,b\",c", "aggregator.beta=interval(0.5,1.1)", "x=choice(1,2)",
                                  "x={a:1,b:2}", "x=glob(*)", "hyperparams.lr=0.1", "x=f(1,2)", "x="])
def test_sweep_overrides_read_as_hydra_reads_them(line):
    """dashboards reads a sweep's varied settings without Hydra (only the command floor imports
    it); on these lines it agrees with Hydra's own override grammar."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        expected = OverridesParser.create().parse_overrides([line])[0].is_sweep_override()
    except Exception:  # noqa: BLE001 - a line Hydra refuses is no sweep for dashboards either
        expected = False
    assert dashboard_values._sweeps(line.partition("=")[2]) == expected


@needs_mlflow
def test_a_sqlite_store_without_sqlalchemy_is_one_line_before_the_run(tmp_path, monkeypatch):
    """mlflow-skinny alone has no SQLAlchemy or alembic, which its SQLite store runs on: said at
    the check, before the run directory exists, with the command that installs them."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "alembic" else real(name, *a))
    dash = dashboards.MLflow(tracking_uri=str(tmp_path / "m.db"))
    with pytest.raises(ConfigError, match=r"^logger.tracking_uri=.*m.db: MLflow's SQLite store needs alembic, which "
                                          r"mlflow-skinny does not install: pip install 'fedrun\[dashboards\]'"):
        dash.check()
    dashboards.MLflow(tracking_uri="http://localhost:5000").check()  # a server: nothing to import here


def test_an_error_quotes_its_cause_whole():
    from fedrun.errors import first_line

    cause = RuntimeError("Model registry functionality is unavailable; got unsupported URI 'sqlite:///m.db' for "
                         "model registry data storage. Supported URI schemes are: ['', 'file', 'databricks', "
                         "'databricks-uc', 'uc', 'http', 'https']. See the docs for SQLAlchemy.\nsecond line")
    assert first_line(cause) == str(cause).splitlines()[0]  # 230 characters, its advice at the end
    assert first_line(cause, limit=20) == str(cause)[:20]
