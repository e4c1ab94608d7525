"""Dashboards: the values of ``rounds.csv`` and ``layers.csv`` sent to TensorBoard or MLflow.

Off by default (``logger=none``); the CSVs stay the record, and a dashboard only mirrors them, one
point per round: ``round/<column>`` for every number of the round's ``rounds.csv`` row and
``layer/<layer>/<column>`` for N, E, N/E, the server step and the parameter divergence of each
layer.  A resumed run continues the same dashboard run from its next round.

* ``logger=tensorboard``: event files in ``<run dir>/tensorboard`` (``tensorboard --logdir
  outputs``), through ``torch.utils.tensorboard`` (``pip install tensorboard``);
* ``logger=mlflow``: a run in an MLflow tracking store, a local SQLite file by default
  (``mlflow ui --backend-store-uri sqlite:///mlflow.db``), with the run's settings as parameters
  (``pip install mlflow-skinny``).

A dashboard is any object with ``start(run_dir, config, first_round)``, ``log(round, row,
layer_rows)`` and ``close(summary)``; a config's ``_target_`` names its factory.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from fedrun.errors import ConfigError, first_line

LAYER_VALUES = ("N", "E", "N_over_E", "server_step", "pd_ls", "pd_vl")


def none():
    """``logger=none``: no dashboard."""
    return None


def _numbers(row: dict, skip=("round",)) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k not in skip and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def _points(row: dict, layer_rows: list[dict]) -> dict[str, float]:
    points = {f"round/{k}": v for k, v in _numbers(row).items()}
    for layer in layer_rows:
        for k, v in _numbers({c: layer.get(c) for c in LAYER_VALUES}).items():
            points[f"layer/{layer['layer']}/{k}"] = v
    return points


class TensorBoard:
    """Event files for TensorBoard, in ``log_dir`` (default: ``<run dir>/tensorboard``)."""

    def __init__(self, log_dir: str | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        except ImportError:
            raise ConfigError("logger", "tensorboard", "needs the tensorboard package: pip install tensorboard "
                              "(or pip install 'fedrun[dashboards]')") from None
        self._writer_class, self.log_dir, self.writer = SummaryWriter, log_dir, None

    def start(self, run_dir: Path, config: dict | None, first_round: int) -> None:
        # purge_step drops the points an interrupted process wrote after its last checkpoint.
        self.writer = self._writer_class(self.log_dir or str(Path(run_dir) / "tensorboard"), purge_step=first_round)
        if config is not None and first_round == 1:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```")

    def log(self, t: int, row: dict, layer_rows: list[dict]) -> None:
        for name, value in _points(row, layer_rows).items():
            self.writer.add_scalar(name, value, t)
        self.writer.flush()

    def close(self, summary: dict | None) -> None:
        if self.writer is not None:
            self.writer.close()


class MLflow:
    """A run in an MLflow tracking store (default: the SQLite file ``mlflow.db`` in the working
    directory; a plain path is taken as a SQLite file, since MLflow retired its folder store), in
    ``experiment``; the run's id is kept in ``<run dir>/mlflow.json``, so a resumed run logs into
    the same MLflow run."""

    def __init__(self, tracking_uri: str = "mlflow.db", experiment: str = "fedrun", run_name: str | None = None):
        try:
            import mlflow
        except ImportError:
            raise ConfigError("logger", "mlflow", "needs the mlflow package: pip install mlflow-skinny "
                              "(or pip install 'fedrun[dashboards]')") from None
        self.mlflow, self.tracking_uri, self.experiment, self.run_name = mlflow, tracking_uri, experiment, run_name
        self.client, self.run_id = None, None

    def start(self, run_dir: Path, config: dict | None, first_round: int) -> None:
        try:
            self._start(run_dir, config)
        except Exception as e:  # noqa: BLE001 - the store's own errors, in one line
            raise ConfigError("logger.tracking_uri", self.tracking_uri, f"MLflow cannot use it: {first_line(e)}") from None

    def _start(self, run_dir: Path, config: dict | None) -> None:
        uri = self.tracking_uri
        if ":" not in uri:  # a path: a SQLite file
            uri = "sqlite:///" + str(Path(uri).resolve())
        self.client = self.mlflow.tracking.MlflowClient(tracking_uri=uri)
        marker = Path(run_dir) / "mlflow.json"
        if marker.is_file():
            self.run_id = json.loads(marker.read_text())["run_id"]
            return
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        run = self.client.create_run(experiment_id, run_name=self.run_name or Path(run_dir).name)
        self.run_id = run.info.run_id
        marker.write_text(json.dumps({"tracking_uri": uri, "run_id": self.run_id}) + "\n")
        for key, value in _flat(config or {}).items():
            self.client.log_param(self.run_id, key[:250], str(value)[:500])

    def log(self, t: int, row: dict, layer_rows: list[dict]) -> None:
        from mlflow.entities import Metric

        stamp = int(1000 * time.time())
        metrics = [Metric(name.replace("/", "."), value, stamp, t) for name, value in _points(row, layer_rows).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, summary: dict | None) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id)


def _flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
