"""logger=tensorboard / logger=mlflow: the dashboards hold the CSVs' values, round by round."""
from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
from conftest import TINY, fedrun_ok, run_fedrun


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="pip install 'fedrun[dashboards]'")
def test_tensorboard_mirrors_rounds_and_layers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="pip install 'fedrun[dashboards]'")
def test_tensorboard_resume_drops_the_interrupted_rounds(tmp_path):
    """A process killed after checkpointing round 1 but logging round 2: the resumed process
    starts at round 2 and the dashboard keeps its values, not the lost ones."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedrun.dashboards import TensorBoard

    first = TensorBoard()
    first.start(tmp_path, None, 1)
    for t, acc in ((1, 0.1), (2, 0.9)):
        first.log(t, {"test_acc": acc}, [])
    first.close(None)
    resumed = TensorBoard()
    resumed.start(tmp_path, None, 2)
    for t, acc in ((2, 0.2), (3, 0.3)):
        resumed.log(t, {"test_acc": acc}, [{"layer": "fc1", "N": 1.0, "E": 2.0, "pd_vl": None}])
    resumed.close(None)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("round/test_acc")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert "layer/fc1/pd_vl" not in events.Tags()["scalars"]  # no value that round: no point


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="pip install 'fedrun[dashboards]'")
def test_mlflow_run_holds_the_rounds_and_settings(tmp_path):
    import mlflow

    from fedrun.dashboards import MLflow

    run = tmp_path / "ml"
    fedrun_ok(TINY + ["logger=mlflow", f"logger.tracking_uri={tmp_path / 'mlflow.db'}", f"hydra.run.dir={run}"],
              tmp_path, timeout=300)
    marker = json.loads((run / "mlflow.json").read_text())
    client = mlflow.tracking.MlflowClient(tracking_uri=marker["tracking_uri"])
    history = sorted(client.get_metric_history(marker["run_id"], "round.test_acc"), key=lambda m: m.step)
    assert [m.step for m in history] == [1, 2]
    assert [m.value for m in history] == pytest.approx(pd.read_csv(run / "rounds.csv").test_acc.tolist(), rel=1e-6)
    params = client.get_run(marker["run_id"]).data.params
    assert params["hyperparams.rounds"] == "2" and params["choices.aggregator"] == "fednnnn"
    resumed = MLflow(tracking_uri=str(tmp_path / "mlflow.db"))
    resumed.start(run, None, 3)
    assert resumed.run_id == marker["run_id"]  # a resumed run logs into the same MLflow run


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
