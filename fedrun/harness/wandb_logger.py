"""``logger=wandb``: the run as a Weights & Biases run, fed what the other dashboards are fed.

W&B is where many Flower users already look at their runs, through the ``wandb`` library itself
(``pip install 'fedrun[wandb]'``).  What a fedrun run becomes there
(:mod:`fedrun.harness.dashboards` chooses it, beside TensorBoard and MLflow):

* its **config**: the run's settings, the ones MLflow gets as parameters
  (:func:`~fedrun.harness.dashboard_values.run_settings`: no Hydra keys, no mirrors of ``hyperparams``,
  nothing of how the run was carried out), nested as ``config.yaml`` nests them and with their
  values as they are, so W&B filters ``hyperparams.lr`` as a number;
* its **tags**: MLflow's tags as ``key=value`` labels (``aggregator=fedavg``, ``dataset=cifar10``,
  ``dataset_label=...`` for a stand-in, ``seed=0``, ``fedrun_version=...``, ``git_commit=...``
  and ``git_dirty=...`` where fedrun runs from a clone, the preset's tags), each cut to W&B's 64
  characters; its **notes**: the command line and the run directory;
* every round's values at ``step=round`` (``round/test_acc``, ``layer/<layer>/N`` ...), its
  **summary** the summary values at the end (``final_test_acc``, ``best_test_acc`` ...), and the
  CSVs, ``config.yaml``, ``summary.json`` and ``fedrun.log`` as an artifact of the run
  (``fedrun-<run id>``, type ``fedrun-run``: MLflow's artifacts).

The run's id is kept in ``<run dir>/wandb.json``: a resumed run continues the same W&B run
(``resume="allow"``), online or offline.  Offline (``WANDB_MODE=offline`` or
``logger.wandb_mode=offline``) nothing leaves the machine; ``wandb sync`` uploads the folders
``wandb.json`` lists later (one a session: a resumed run's sessions sync into its one run).
W&B's capture of the console is off: ``fedrun.log`` is the run's console, saved with the other
files.
"""
from __future__ import annotations

import json
from pathlib import Path

from fedrun.errors import ConfigError, disk_full, first_line
from fedrun.harness.dashboard_values import _points, _summary_values, run_name, run_settings, run_tags
from fedrun.paths import writable_folder

MODES = ("online", "offline", "disabled")
MARKER = "wandb.json"
TAG_LENGTH = 64  # W&B refuses a longer tag
# MLflow's tags that are no label here: the run directory and the command line go to the notes.
NOT_TAGS = ("run_dir", "mlflow.note.content")


def wandb_config(config: dict | None) -> dict:
    """The run's settings (:func:`run_settings`) nested again by their dotted keys, as
    ``config.yaml`` holds them (``{"hyperparams": {"lr": 0.05}}``, which W&B shows as
    ``hyperparams.lr``); a key whose parent holds a value already stays flat."""
    out: dict = {}
    for key, value in run_settings(config).items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                node = None
                break
            node = child
        if node is None:
            out[key] = value
        else:
            node[last] = value
    return out


def wandb_tags(config: dict | None, run_dir) -> list[str]:
    """MLflow's tags (:func:`run_tags`) as W&B labels, ``key=value``; MLflow's own name for the
    commit of fedrun's source becomes ``git_commit``."""
    tags = []
    for key, value in run_tags(config, run_dir).items():
        if key in NOT_TAGS:
            continue
        key = "git_commit" if key == "mlflow.source.git.commit" else key
        tags.append(f"{key}={value}"[:TAG_LENGTH])
    return tags


def wandb_notes(config: dict | None, run_dir) -> str:
    """The command line that made the run (as MLflow's note) and where its files are."""
    lines = []
    if config and config.get("overrides") is not None:
        lines.append("fedrun " + " ".join(map(str, config["overrides"])))
    lines.append(f"run directory: {Path(run_dir).resolve()}")
    return "\n".join(lines)


class WandB:
    """A W&B run in ``project`` (of ``entity``, null: the login's default), named ``run_name``
    (null: :func:`~fedrun.harness.dashboard_values.run_name`'s method and swept settings), in
    ``wandb_mode`` (null: ``WANDB_MODE``, else online), its local files in ``wandb_dir`` (null:
    ``WANDB_DIR``, else W&B's own ``./wandb``)."""

    def __init__(self, project: str = "fedrun", entity: str | None = None, run_name: str | None = None,
                 wandb_mode: str | None = None, wandb_dir: str | None = None):
        try:
            import wandb
        except ImportError:
            raise ConfigError("logger", "wandb", "needs the wandb package: pip install 'fedrun[wandb]' "
                              "(or pip install wandb)") from None
        if wandb_mode is not None and wandb_mode not in MODES:
            raise ConfigError("logger.wandb_mode", wandb_mode, f"choose {', '.join(MODES)} (null: WANDB_MODE, "
                              "else online)")
        self.wandb, self.project, self.entity, self.run_name = wandb, project, entity, run_name
        self.mode, self.dir = wandb_mode, wandb_dir
        self.run, self.run_dir = None, None

    def check(self) -> None:
        """Before the run starts: a ``wandb_dir`` that can be written."""
        if self.dir is not None:
            writable_folder("logger.wandb_dir", Path(self.dir))

    def start(self, run_dir: Path, config: dict | None, first_round: int) -> None:
        try:
            self._start(Path(run_dir), config)
        except Exception as e:  # noqa: BLE001 - W&B's own errors (no login, no network), in one line
            if disk_full(e):
                raise
            raise ConfigError("logger", "wandb", f"W&B cannot start the run: {first_line(e)} (log in with `wandb "
                              "login`, or log offline: logger.wandb_mode=offline, then `wandb sync`)") from None

    def _start(self, run_dir: Path, config: dict | None) -> None:
        self.run_dir = run_dir
        marker = run_dir / MARKER
        known = json.loads(marker.read_text()) if marker.is_file() else {}
        if self.dir is not None:
            Path(self.dir).mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(
            project=known.get("project", self.project), entity=known.get("entity", self.entity),
            name=self.run_name or run_name(config, run_dir), id=known.get("run_id"), resume="allow",
            config=wandb_config(config), tags=wandb_tags(config, run_dir),
            notes=wandb_notes(config, run_dir), mode=self.mode, dir=self.dir,
            # Several runs in one process (a population) are each a run of their own; fedrun.log,
            # saved at the end, is the console.
            reinit="create_new", settings=self.wandb.Settings(console="off"))
        # Each session's local folder (offline: what `wandb sync` uploads), the first one's id.
        folders = [*known.get("folders", []), str(Path(self.run.dir).parent)]
        marker.write_text(json.dumps({"run_id": self.run.id, "project": self.run.project,
                                      "entity": known.get("entity", self.run.entity or self.entity),
                                      "folders": folders}) + "\n")

    def log(self, t: int, row: dict, layer_rows: list[dict]) -> None:
        self.run.log(_points(row, layer_rows), step=t)

    def close(self, summary: dict | None) -> None:
        if self.run is None:
            return
        if summary:
            self.run.summary.update(_summary_values(summary))
        # The files as a W&B artifact (MLflow's artifacts): run.save would put fedrun's config.yaml
        # where W&B keeps the run's own config.yaml.
        files = self.wandb.Artifact(f"fedrun-{self.run.id}", type="fedrun-run",
                                    description=f"the run directory's files: {self.run_dir.resolve()}")
        names = ("config.yaml", "summary.json", "fedrun.log")
        for path in sorted(self.run_dir.glob("*.csv")) + [self.run_dir / n for n in names]:
            if path.is_file():
                files.add_file(str(path), name=path.name)
        self.run.log_artifact(files)
        self.run.finish()
        self.run = None
