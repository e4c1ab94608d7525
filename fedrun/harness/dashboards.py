"""Dashboards: the values of ``rounds.csv`` and ``layers.csv`` sent to TensorBoard, MLflow or
Weights & Biases.

Off by default (``logger=none``); the CSVs stay the record, and a dashboard only mirrors them, one
point per round: ``round/<column>`` for every number of the round's ``rounds.csv`` row and
``layer/<layer>/<column>`` for N, E, N/E, the server step and the parameter divergence of each
layer.  At the end it adds the run's summary values (``final_test_acc``, ``best_test_acc``,
``best_round``, ``final_test_loss``, ...).  A resumed run continues the same dashboard run from
its next round.

A run is known by its *identity* (:func:`run_hparams`): the option of each config group
(``aggregator``, ``dataset``, ``model``, ``partition``, ...), the seed, the main hyperparameters,
the aggregator's and the partition's settings, and every setting the job's command line set
(for a job of a sweep, the settings the sweep varies); and by its *name* (:func:`run_name`): the
method and the settings its sweep varies, ``fednnnn beta=0.5 seed=1`` (a run of no sweep: the
settings its command line set).

* ``logger=tensorboard``: event files in ``<run dir>/tensorboard`` (``tensorboard --logdir
  outputs``), through ``torch.utils.tensorboard`` (``pip install tensorboard``).  The identity is
  the run's HParams (the HParams tab filters and compares runs by them) and the summary values
  are its HParams metrics (scalars ``summary/<name>``); the config is a text.
* ``logger=mlflow``: a run in an MLflow tracking store, a local SQLite file by default
  (``mlflow ui --backend-store-uri sqlite:///mlflow.db``), named as above, with tags
  (``aggregator``, ``dataset``, ``model``, ``partition``, ``seed``, ``fedrun_version``,
  ``mlflow.source.git.commit`` and ``git_dirty`` where fedrun runs from a git clone, ``run_dir``,
  and the preset's ``tags``), the run's settings as parameters (in batches; without Hydra's
  ``_target_``/``_partial_``/``_convert_`` keys, the ``federation``, ``local`` and
  ``participation`` nodes, which repeat ``hyperparams``, and how the run was carried out:
  ``logger.*``, ``resume``, ``data_root``, ``progress``, ...), the summary values as metrics and,
  at the end, the CSVs, ``config.yaml`` and ``summary.json`` as artifacts.  Logging needs only
  ``mlflow-skinny``; ``mlflow ui`` needs the whole ``mlflow`` package (its web server and pages),
  which ``pip install 'fedrun[dashboards]'`` installs.
* ``logger=wandb``: a Weights & Biases run (:mod:`fedrun.harness.wandb_logger`, ``pip install
  'fedrun[wandb]'``), with the same settings as its config (:func:`run_settings`, values kept as
  numbers), the tags as ``key=value`` labels, every round's values at ``step=round`` and the
  summary values as its summary; offline too (``WANDB_MODE=offline``, then ``wandb sync``).

Where the dataset option has a label of its own (a stand-in: ``dataset=cifar10_jpeg`` is "CIFAR-10
(JPEG q75 copy)"), both dashboards also carry it as ``dataset_label`` (an HParam, an MLflow tag),
so the stand-in's runs are never filtered or compared as the original's.

A dashboard is any object with ``start(run_dir, config, first_round)``, ``log(round, row,
layer_rows)`` and ``close(summary)``; a config's ``_target_`` names its factory.  ``config`` is
the run's resolved config as ``config.yaml`` holds it, with ``choices`` (group -> option) and
``overrides`` (the job's command line).
"""
from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path

from fedrun.errors import ConfigError, disk_full, first_line
from fedrun.paths import writable_folder

# What a dashboard shows of a run: fedrun.harness.dashboard_values (W&B's logger reads it too).
from fedrun.harness.dashboard_values import (SUMMARY_METRICS, _points, _summary_values, run_hparams, run_name,
                                             run_params, run_tags)


def none():
    """``logger=none``: no dashboard."""
    return None


KINDS = ("tensorboard", "mlflow", "wandb")


def dashboards(use: dict, log_dir: str | None = None, tracking_uri: str = "mlflow.db", experiment: str = "fedrun",
               run_name: str | None = None, project: str = "fedrun", entity: str | None = None,
               wandb_mode: str | None = None, wandb_dir: str | None = None):
    """``logger=tensorboard``, ``logger=mlflow``, ``logger=wandb``, or several at once
    (``logger=[tensorboard,mlflow]``, as Lightning takes a list of loggers).  Hydra merges the
    options chosen into one ``logger`` node: each option's YAML adds itself to ``use`` (a mapping,
    so the merge keeps both; a list would keep the last) and its own settings beside the other's.
    Returns the one dashboard, or :class:`Dashboards` feeding every round's values to each."""
    chosen = [kind for kind, on in (use or {}).items() if on]
    unknown = [kind for kind in chosen if kind not in KINDS]
    if unknown:
        raise ConfigError("logger.use", unknown[0], f"choose among {', '.join(KINDS)} (logger=tensorboard, "
                          "logger=mlflow, logger=wandb, or several: logger=[tensorboard,mlflow])")

    def make(kind: str):
        if kind == "tensorboard":
            return TensorBoard(log_dir)
        if kind == "mlflow":
            return MLflow(tracking_uri, experiment, run_name)
        from fedrun.harness.wandb_logger import WandB  # its own module: W&B's run, offline or not

        return WandB(project, entity, run_name, wandb_mode, wandb_dir)

    made = [make(kind) for kind in KINDS if kind in chosen]
    if not made:
        return None
    return made[0] if len(made) == 1 else Dashboards(made)


class Dashboards:
    """Several dashboards fed the same values (``logger=[tensorboard,mlflow]``); each is checked
    before the run and started, fed and closed in the order given."""

    def __init__(self, members: list):
        self.members = members

    def check(self) -> None:
        for member in self.members:
            member.check()

    def start(self, run_dir: Path, config: dict | None, first_round: int) -> None:
        for member in self.members:
            member.start(run_dir, config, first_round)

    def log(self, t: int, row: dict, layer_rows: list[dict]) -> None:
        for member in self.members:
            member.log(t, row, layer_rows)

    def close(self, summary: dict | None) -> None:
        for member in self.members:
            member.close(summary)


# ----------------------------------------------------------------------------- TensorBoard

def _quiet_disk_full_threads() -> None:
    """TensorBoard writes its event files from a thread of its own, which prints a traceback when
    the disk is full; the next point the run logs raises the same error, which stops the run in
    one line (``fedrun.harness.federated_run.FederatedRun.guard``).  So a thread's full-disk error is not
    printed; any other still is."""
    previous = threading.excepthook
    if getattr(previous, "fedrun_quiet", False):
        return

    def hook(args) -> None:
        if args.exc_value is not None and disk_full(args.exc_value):
            return
        previous(args)

    hook.fedrun_quiet = True
    threading.excepthook = hook


class TensorBoard:
    """Event files for TensorBoard, in ``log_dir`` (default: ``<run dir>/tensorboard``)."""

    def __init__(self, log_dir: str | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        except ImportError:
            raise ConfigError("logger", "tensorboard", "needs the tensorboard package: pip install tensorboard "
                              "(or pip install 'fedrun[dashboards]')") from None
        self._writer_class, self.log_dir, self.writer = SummaryWriter, log_dir, None
        self.last_round = 0

    def check(self) -> None:
        """Before the run starts: a ``log_dir`` that can be written (the default lies in the run
        directory, checked with it)."""
        if self.log_dir is not None:
            writable_folder("logger.log_dir", Path(self.log_dir))

    def start(self, run_dir: Path, config: dict | None, first_round: int) -> None:
        _quiet_disk_full_threads()
        # purge_step drops the points an interrupted process wrote after its last checkpoint.
        self.writer = self._writer_class(self.log_dir or str(Path(run_dir) / "tensorboard"), purge_step=first_round)
        if config is not None and first_round == 1:
            from torch.utils.tensorboard.summary import hparams

            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```")
            self.writer.add_text("run", f"{run_name(config, run_dir)}  \n{Path(run_dir).resolve()}")
            # The HParams tab: this run's hparams, and the summary scalars as its metrics.
            experiment, start, _ = hparams(run_hparams(config, run_dir), {f"summary/{m}": 0 for m in SUMMARY_METRICS})
            for summary in (experiment, start):
                self.writer.file_writer.add_summary(summary)
            self.writer.flush()

    def log(self, t: int, row: dict, layer_rows: list[dict]) -> None:
        for name, value in _points(row, layer_rows).items():
            self.writer.add_scalar(name, value, t)
        self.last_round = max(self.last_round, t)
        self.writer.flush()

    def close(self, summary: dict | None) -> None:
        if self.writer is None:
            return
        if summary:
            from torch.utils.tensorboard.summary import hparams

            step = int(summary.get("rounds") or self.last_round)
            for name, value in _summary_values(summary).items():
                self.writer.add_scalar(f"summary/{name}", value, step)
            self.writer.file_writer.add_summary(hparams({}, {})[2])  # the session ended, successfully
        self.writer.close()


# ----------------------------------------------------------------------------- MLflow

def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


class MLflow:
    """A run in an MLflow tracking store (default: the SQLite file ``mlflow.db`` in the working
    directory; a plain path is taken as a SQLite file, since MLflow retired its folder store), in
    ``experiment``, named ``run_name`` (default: :func:`run_name`); the run's id is kept in
    ``<run dir>/mlflow.json``, so a resumed run logs into the same MLflow run.  An experiment
    fedrun creates in a SQLite store keeps its artifacts in ``mlartifacts`` beside the file."""

    def __init__(self, tracking_uri: str = "mlflow.db", experiment: str = "fedrun", run_name: str | None = None):
        try:
            import mlflow
        except ImportError:
            raise ConfigError("logger", "mlflow", "needs the mlflow package: pip install 'fedrun[dashboards]' "
                              "(or pip install mlflow)") from None
        self.mlflow, self.tracking_uri, self.experiment, self.run_name = mlflow, tracking_uri, experiment, run_name
        self.client, self.run_id, self.run_dir, self.last_round = None, None, None, 0

    def check(self) -> None:
        """Before the run starts: a store fedrun can reach without the network (a SQLite file in a
        folder it can write to; a server's address is taken as given)."""
        uri = self.tracking_uri
        if ":" not in uri or uri.startswith("sqlite:///"):
            writable_folder("logger.tracking_uri", Path(uri[len("sqlite:///"):] if ":" in uri else uri).parent, uri)
            # MLflow's SQLite store runs on SQLAlchemy and alembic, which mlflow-skinny does not
            # bring: said here, before the run directory exists, not as MLflow's registry error.
            missing = [name for name in ("sqlalchemy", "alembic") if importlib.util.find_spec(name) is None]
            if missing:
                raise ConfigError("logger.tracking_uri", uri, f"MLflow's SQLite store needs {' and '.join(missing)}, "
                                  "which mlflow-skinny does not install: pip install 'fedrun[dashboards]' (or pip "
                                  "install 'sqlalchemy<2' alembic), or use a tracking server (http://host:5000)")
        elif uri.split(":", 1)[0] not in ("http", "https", "databricks", "postgresql", "mysql", "mssql", "file"):
            raise ConfigError("logger.tracking_uri", uri, "choose a SQLite file (mlflow.db, sqlite:///path.db) or "
                              "a tracking server (http://host:5000)")

    def start(self, run_dir: Path, config: dict | None, first_round: int) -> None:
        try:
            self._start(Path(run_dir), config)
        except Exception as e:  # noqa: BLE001 - the store's own errors, in one line
            if disk_full(e):  # mlflow.json: the run's full disk, said as such by the run
                raise
            raise ConfigError("logger.tracking_uri", self.tracking_uri, f"MLflow cannot use it: {first_line(e)}") from None

    def _experiment_id(self, uri: str) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found:
            return found.experiment_id
        location = None
        if uri.startswith("sqlite:///"):
            location = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
        try:
            return self.client.create_experiment(self.experiment, artifact_location=location)
        except Exception:  # a parallel job created it first
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def _start(self, run_dir: Path, config: dict | None) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import (
            MAX_PARAM_VAL_LENGTH,
            MAX_PARAMS_TAGS_PER_BATCH,
        )

        uri = self.tracking_uri
        if ":" not in uri:  # a path: a SQLite file
            uri = "sqlite:///" + str(Path(uri).resolve())
        self.client, self.run_dir = self.mlflow.tracking.MlflowClient(tracking_uri=uri), run_dir
        marker = run_dir / "mlflow.json"
        if marker.is_file():
            self.run_id = json.loads(marker.read_text())["run_id"]
            return
        run = self.client.create_run(self._experiment_id(uri), tags=run_tags(config, run_dir),
                                     run_name=self.run_name or run_name(config, run_dir))
        self.run_id = run.info.run_id
        marker.write_text(json.dumps({"tracking_uri": uri, "run_id": self.run_id}) + "\n")
        params = [Param(k[:250], v[:MAX_PARAM_VAL_LENGTH]) for k, v in run_params(config).items()]
        for batch in _chunks(params, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch)

    def _metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        stamp = int(1000 * time.time())
        metrics = [Metric(name.replace("/", "."), value, stamp, step) for name, value in values.items()]
        for batch in _chunks(metrics, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch)

    def log(self, t: int, row: dict, layer_rows: list[dict]) -> None:
        self._metrics(_points(row, layer_rows), t)
        self.last_round = max(self.last_round, t)

    def close(self, summary: dict | None) -> None:
        if self.client is None or self.run_id is None:
            return
        if summary:
            self._metrics(_summary_values(summary), int(summary.get("rounds") or self.last_round))
        for path in sorted(self.run_dir.glob("*.csv")) + [self.run_dir / n for n in ("config.yaml", "summary.json")]:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id)
