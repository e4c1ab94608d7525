"""What a run writes: CSVs appended and flushed every round, the checkpoint, the summary.

:class:`Recorder` owns the run directory's files: the CSV schemas (``COLUMNS``), the rows it
builds from what a round produced (:class:`RoundRecord`: the clients' results, the aggregator's
outcome, the parameter divergence, the evaluation, the timings), the model snapshots, the
checkpoint and ``summary.json``.  The round loop (:func:`fedrun.harness.simulation.simulate`) computes;
the recorder writes.

CSV files are only ever appended to; the checkpoint records their sizes and the SHA-256 of those
bytes after each complete round (and of the run's settings), and a resumed run checks them, then
truncates the CSVs back to those sizes before going on, so an interrupted run (even one killed
mid-write, or stopped by a full disk half-way through a row) ends with the same bytes as an
uninterrupted one, and an edited one is refused rather than continued.  Every other file (the checkpoint, the snapshots,
``summary.json``, ``run.json``, ``partition.csv``) is replaced whole, atomically
(:func:`fedrun.harness.rundir.write_atomic`); no file is opened through a symbolic link.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedrun.data.names import dataset_label
from fedrun.diagnostics import communication
from fedrun.harness import provenance
from fedrun.harness.objective import objective as objective_value
from fedrun.harness.round_record import RoundRecord  # what write() takes
from fedrun.server.privacy import COLUMNS as DP_COLUMNS
from fedrun.errors import ConfigError, RunDirectoryError
from fedrun.models.layers import Layer
from fedrun.params import Params
from fedrun.harness.rundir import differences, listed, open_run_file, settings_digest, settings_text, write_atomic

if TYPE_CHECKING:  # rundir reads CSV headers; the recorder only holds the open directory
    from fedrun.harness.rundir import RunDirectory

log = logging.getLogger(__name__)

# Seconds: local training (with the vanilla reference), evaluation, the whole round.  The only
# columns that differ between two runs of the same config and seed.
TIMING_COLUMNS = ("train_s", "eval_s", "wall_s")
ROUND_COLUMNS = [
    "round", "clients", "test_acc", "test_loss", "average_test_acc", "average_test_loss",
    "sent_test_acc", "sent_test_loss", "val_acc", "val_loss", "train_loss", "N", "E", "N_over_E", "server_step",
    "server_step_sum", "N_conv", "E_conv", "server_step_conv", "N_fc", "E_fc", "server_step_fc", "pd_ls", "pd_vl",
    "vanilla_loss", "lr", "skipped", "dropped", "stragglers", "client_acc_mean", "client_acc_std",
    "client_acc_worst10", *communication.COLUMNS, *TIMING_COLUMNS,
]
LAYER_COLUMNS = ["round", "layer", "type", "params", "N", "E", "N_over_E", "server_step", "pd_ls", "pd_vl"]
OUTPUT_COLUMNS = ["round", "client", "class", "weight_norm", "bias"]
CLIENT_COLUMNS = ["round", "client", "examples", "weight", "update_norm", "angle", "smoothed_angle",
                  "loss", "steps", "epochs", "straggler", "dropped", "reg_loss", "lambda_mean", "own_test_acc",
                  "own_test_loss"]
CLIENT_LAYER_COLUMNS = ["round", "client", "layer", "update_norm", "angle", "smoothed_angle", "weight"]
# What a checkpoint holds (Recorder.checkpoint), every key checked before a resume trusts it.
CHECKPOINT_KEYS = ("round", "params", "buffers", "aggregator", "optimizer_state", "step_sum", "partition", "offsets")
# The checkpoint's format, recorded in it as ``version``.  1: fedrun 0.1.0 before it was numbered
# (no ``version``); 2: with the data's digest and the settings themselves.  A checkpoint of this
# version must hold every field it is written with (CHECKPOINT_KEYS and VOUCHING_KEYS): one that
# lost its digests, settings or data digest is refused, never trusted less (a checkpoint without
# digests would let a resume append to edited CSVs, one without settings continue other settings).
CHECKPOINT_VERSION = 2
VOUCHING_KEYS = ("bytes_total", "digests", "settings", "values", "data", "run")
COLUMNS = {"rounds": ROUND_COLUMNS, "layers": LAYER_COLUMNS, "clients": CLIENT_COLUMNS,
           "client_layers": CLIENT_LAYER_COLUMNS, "output_layer": OUTPUT_COLUMNS}
# Columns a run has only where a setting asks for them (so every other run's CSVs stay as they were):
# personalize_epochs > 0, the clients' scores after fine-tuning the global model on their own data.
PERSONAL_COLUMNS = {"rounds": ["pers_acc_mean", "pers_acc_std", "pers_acc_worst10"],
                    "clients": ["pers_test_acc", "pers_test_loss"]}
# privacy.clip set: the clip DP-FedAvg used, the share of updates it clipped, the noise it added to
# the sum and the privacy spent so far (fedrun.server.privacy).
PRIVACY_COLUMNS = {"rounds": list(DP_COLUMNS)}


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return format(v, ".8g")
    return str(v)


class CsvLog:
    """An append-only CSV with a fixed header (opened without following a symbolic link), and the
    SHA-256 of everything written to it so far (:meth:`digest`, kept as it goes: a checkpoint
    records it without reading the file again)."""

    def __init__(self, path: Path, columns: list[str], truncate_to: int | None = None):
        self.path, self.columns = Path(path), columns
        if truncate_to is None or not self.path.exists():
            header = (",".join(columns) + "\n").encode()
            with open_run_file(self.path, "wb") as f:
                f.write(header)
            self._digest = hashlib.sha256(header)
        else:
            with open_run_file(self.path, "r+b") as f:
                f.truncate(truncate_to)
            self._digest = hashlib.sha256()
            with open(self.path, "rb") as f:  # the bytes kept, which the checkpoint vouched for
                while chunk := f.read(1 << 20):
                    self._digest.update(chunk)

    def append(self, rows: list[dict]) -> None:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in rows:
            writer.writerow([_fmt(row.get(c)) for c in self.columns])
        data = buf.getvalue().encode()
        with open_run_file(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._digest.update(data)

    def size(self) -> int:
        return self.path.stat().st_size

    def digest(self) -> str:
        """SHA-256 of the file's bytes so far (:func:`fedrun.harness.rundir.prefix_digest` of its size)."""
        return self._digest.copy().hexdigest()


def atomic_save(obj, path: Path) -> None:
    """``torch.save`` to a temporary file, fsync, then rename over ``path``: never half-written
    (:func:`fedrun.harness.rundir.write_atomic`)."""
    write_atomic(path, lambda f: torch.save(obj, f), binary=True)


def _finite(obj):
    """NaN/Inf -> None recursively, so the file is valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(obj, path: Path) -> None:
    """``obj`` as JSON (NaN and Inf as null), written atomically (:func:`fedrun.harness.rundir.write_atomic`)."""
    text = json.dumps(_finite(obj), indent=2, allow_nan=False) + "\n"
    write_atomic(path, lambda f: f.write(text))


def summarize(rounds_csv: Path, targets: list[float]) -> dict:
    """Final accuracy, best accuracy and its round, and the first round reaching each target.

    Read with the csv module, not pandas: every run ends here, and pandas' import alone would be
    a tenth of a small run's time."""
    with open(rounds_csv, newline="") as f:
        every = list(csv.DictReader(f))

    def filled(row: dict, column: str) -> bool:
        return row.get(column) not in (None, "")

    def value(row: dict, column: str) -> float:
        return float(row[column]) if filled(row, column) else math.nan

    def has(rows: list[dict], column: str) -> bool:
        return any(filled(row, column) for row in rows)

    rows = [row for row in every if filled(row, "test_acc")]
    if not rows:
        return {"rounds": 0}
    acc = [value(row, "test_acc") for row in rows]
    best = max(range(len(rows)), key=acc.__getitem__)  # the first round of the highest accuracy
    reached = {}
    for target in targets:
        hit = next((row for row, a in zip(rows, acc) if a >= target), None)
        reached[f"{target:g}"] = None if hit is None else int(hit["round"])
    last = rows[-1]
    out = {
        "rounds": int(last["round"]),
        "final_test_acc": acc[-1],
        "final_test_loss": value(last, "test_loss"),
        "best_test_acc": acc[best],
        "best_round": int(rows[best]["round"]),
        "rounds_to_accuracy": reached,
    }
    if has(every, "bytes_total"):  # what the run sent, and to reach each target
        sent = {int(row["round"]): int(row["bytes_total"]) for row in every if filled(row, "bytes_total")}
        out["bytes_total"] = sent[max(sent)]
        out["bytes_to_accuracy"] = {k: None if t is None else sent[t] for k, t in reached.items()}
    for column in ("client_acc_mean", "client_acc_worst10", "pers_acc_mean", "pers_acc_worst10"):  # last scored
        if has(every, column):
            out[f"final_{column}"] = [value(row, column) for row in every if filled(row, column)][-1]
    if every and "wall_s" in every[0]:  # the time the rounds took, over every process that ran them
        out["round_seconds"] = round(sum(value(row, "wall_s") for row in every if filled(row, "wall_s")), 3)
    if has(every, "dp_epsilon"):  # a private run: the privacy spent by its last round
        out["dp_epsilon"] = value(every[-1], "dp_epsilon")
    for model in ("average", "sent"):
        column = f"{model}_test_acc"
        if has(rows, column):
            out[f"final_{column}"] = value(last, column)
    if has(rows, "val_acc"):
        out["final_val_acc"] = value(last, "val_acc")
        out["best_val_acc"] = max(value(row, "val_acc") for row in rows if filled(row, "val_acc"))
    return out


# ----------------------------------------------------------------------------- one run's files

class Recorder:
    """Writes one run's files; see the module docstring.

    Args:
      run: the locked run directory.
      layers: the model's layers (rows of ``layers.csv``, the conv/fc groups of ``rounds.csv``).
      params: the global model, for the layers' sizes.
      fingerprint: the partition's fingerprint, stored in the checkpoint and the summary.
      dashboard: mirrors every round's values to TensorBoard or MLflow (:mod:`fedrun.harness.dashboards`), or None.
      device: the run's device, named in ``run.json`` (:mod:`fedrun.harness.provenance`).
      config: the run's config; its settings (:func:`fedrun.harness.rundir.settings_text`) and their
        digest are recorded in every checkpoint and checked by a resume (None: no config).
      payload: what one client's exchange of a round costs (:func:`fedrun.diagnostics.communication.method_payload`),
        for the ``bytes_*`` columns (None: left empty).
      personal: the run fine-tunes and scores personalized models (``personalize_epochs``): the
        rounds.csv and clients.csv columns of :data:`PERSONAL_COLUMNS` are added.
      privacy: a private run's (``privacy.clip``) fixed values for ``summary.json`` (its delta and
        accounting, :meth:`fedrun.server.privacy.ClientLevelDP.summary`): the rounds.csv columns of
        :data:`PRIVACY_COLUMNS` are added.  None: not private.
      data: a digest of the data the run trains on (``fedrun.command.build``: the dataset as loaded),
        recorded in every checkpoint, so a data file changed since the run stopped is refused on
        resume; ``data_source`` names that data in the refusal (``dataset=table (dataset.load.path=...)``).
    """

    def __init__(self, run: RunDirectory, layers: list[Layer], params: Params, fingerprint: str, dashboard=None,
                 device="cpu", config: dict | None = None, payload: communication.Payload | None = None,
                 data: str | None = None, data_source: str = "the dataset", personal: bool = False,
                 privacy: dict | None = None):
        self.run, self.path, self.layers, self.fingerprint = run, run.path, layers, fingerprint
        # The CSVs' columns: fedrun's, and the personalized scores' where the run has them.
        self.columns = {name: cols + (PERSONAL_COLUMNS.get(name, []) if personal else [])
                        + (PRIVACY_COLUMNS.get(name, []) if privacy is not None else [])
                        for name, cols in COLUMNS.items()}
        self.privacy = privacy
        self.dashboard, self.device = dashboard, device
        self.values = settings_text(config)  # the run's settings as JSON, or None
        self.settings = settings_digest(config)  # their digest (fedrun.harness.rundir.settings_digest), or None
        self.data, self.data_source = data, data_source
        # The run's own id, made when it starts, in run.json's sessions and every checkpoint: a
        # checkpoint copied in from another run is named as such on resume (Recorder.resume).
        self.run_id: str | None = None
        self.types = np.array([layer.type for layer in layers])
        self.sizes = [sum(params[p].numel() for p in layer.params) for layer in layers]
        self.output_layer = output_layer(layers)
        self.step_sum = 0.0  # server_step_sum: the path length of the global model so far
        self.payload = payload
        # bytes_total: the bytes sent down and up since round 1, kept in the checkpoint as step_sum
        # is, so a resumed run continues it exactly (an int: no rounding however long the run).
        self.bytes_total = 0
        self.logs: dict[str, CsvLog] = {}
        self.progress = {"acc": "nan", "N_E": "nan"}  # the progress bar's last accuracy and N/E
        self.last: dict = {}  # the last rounds.csv row written

    def resume(self, ckpt: dict | None, rounds: int) -> dict | None:
        """Check a checkpoint to continue from against this run's partition and CSVs, before a byte
        is written, and take its ``server_step_sum``.  Returns the summary of a run that a previous
        process completed (nothing to do), else None."""
        if ckpt is None:
            return None
        self._check_fields(ckpt)
        done, config = ckpt["round"], self.path / "config.yaml"
        complete = done >= rounds and (self.path / "summary.json").is_file()
        # What the checkpoint says its rounds ran with against this run's: the first that differs.
        same = {"settings": ckpt["settings"] == self.settings, "data": ckpt["data"] == self.data,
                "partition": ckpt["partition"] == self.fingerprint}
        differs = next((what for what, equal in same.items() if not equal), None)
        ids = set(run_ids(self.sessions()))
        vouched = {} if ids else self.run.vouched(self.columns, ckpt["offsets"], ckpt["digests"])
        if (ids and ckpt["run"] not in ids) or (vouched and not any(vouched.values())):
            # Another run's id than run.json's (without run.json: not one CSV is what it records):
            # the checkpoint is the odd one out, not config.yaml or the data that disagree with it.
            why = f"; its {differs} {'differs' if differs == 'partition' else 'differ'} from this run's" \
                if differs else ""
            whose = (f"it is run {ckpt['run']}'s, and {provenance.RUN_FILE} here records run {', '.join(sorted(ids))}"
                     if ids else f"it records none of the CSVs here ({', '.join(f'{n}.csv' for n in vouched)})")
            raise RunDirectoryError(f"{self.run.checkpoint_path}: not this run's checkpoint: {whose}{why} (copied "
                                    "from another run?); restore this run's own checkpoint.pt or start a new run "
                                    "directory (nothing was written)")
        self.run_id = ckpt["run"]
        if differs == "settings":
            if not config.exists():  # config.yaml gone: the overrides are all there is to compare
                changed = self._changed(ckpt["values"])
                raise ConfigError("resume", "true", f"the settings differ from those the checkpoint's {done} rounds "
                                  f"ran with{' in: ' + listed(changed) if changed else ''} ({config.name}, which "
                                  "recorded them, is missing); resume with the run's original overrides (nothing "
                                  "was written)")
            # The settings equal config.yaml's (checked first), so config.yaml is not what the checkpoint ran.
            raise RunDirectoryError(f"{config}: its settings are not those the checkpoint's {done} rounds ran "
                                    "with (edited since); restore it or start a new run directory (nothing was "
                                    "written)")
        if differs == "data":  # the same settings, other data: a file the settings name was changed
            raise RunDirectoryError(f"{self.data_source}: its data are not those the checkpoint's {done} rounds "
                                    "trained on (a data file changed since the run stopped); restore the data or "
                                    "start a new run directory (nothing was written)")
        if differs == "partition":
            raise ConfigError("resume", "true", f"the checkpoint's partition ({ckpt['partition']}) differs "
                              f"from this config's ({self.fingerprint}); use the run's original settings")
        self.run.check_csvs(self.columns, ckpt["offsets"], ckpt["digests"], complete)
        self.step_sum, self.bytes_total = ckpt["step_sum"], ckpt["bytes_total"]
        if complete:
            try:
                summary = json.loads((self.path / "summary.json").read_bytes())
            except ValueError:  # damaged (not JSON): written again from the CSVs
                summary = None
            if isinstance(summary, dict):
                log.info("%s is complete (%d of %d rounds); nothing to do", self.path, ckpt["round"], rounds)
                return summary
            log.warning("resume=true: %s is not JSON; writing it again", self.path / "summary.json")
        return None

    def open(self, class_counts: np.ndarray, offsets: dict[str, int] | None = None, first_round: int = 1,
             config: dict | None = None) -> None:
        """Write ``partition.csv`` and open the CSVs: new, or cut back to a checkpoint's ``offsets``
        (and the dashboard, from ``first_round``)."""
        if self.dashboard is not None:  # first: a store it cannot reach leaves no results behind
            self.dashboard.start(self.path, config, first_round)
        sessions = self.sessions()
        # The run's id: the checkpoint's it resumes from, else an earlier session's, else a new one.
        self.run_id = self.run_id or next(reversed(run_ids(sessions)), None) or uuid.uuid4().hex[:16]
        # A sweep's job says which sweep ran it: the sweep's closing table lists its own jobs by it.
        sweep = {"sweep": os.environ[provenance.SWEEP_ID]} if os.environ.get(provenance.SWEEP_ID) else {}
        # The data it read, by the name people see (a stand-in such as "CIFAR-10 (JPEG q75 copy)" by its own).
        data = {"dataset": dataset_label(config)} if dataset_label(config) else {}
        sessions.append({**provenance.describe(self.device), **data, **sweep, "run": self.run_id,
                         "started": provenance.now(), "first_round": first_round})
        write_json(sessions, self.path / provenance.RUN_FILE)
        write_partition(self.path / "partition.csv", class_counts)
        self.logs = {name: CsvLog(self.path / f"{name}.csv", cols, offsets and offsets.get(name))
                     for name, cols in self.columns.items()}

    def write(self, r: RoundRecord) -> None:
        """Append round ``r``'s rows to every CSV (flushed and synced before returning)."""
        t, results, outcome = r.round, r.results, r.outcome
        row = {"round": t, "clients": 0 if results is None else len(results.clients), "dropped": len(r.dropped),
               "stragglers": len(r.stragglers), "lr": r.lr, "vanilla_loss": r.vanilla_loss,
               **self.communicated(r), **r.evaluation, **r.seconds}
        if outcome is None:  # everyone dropped out: the server keeps w_t
            row.update(skipped=1, server_step=0.0, server_step_sum=self.step_sum)
        else:
            self.step_sum += outcome.server_step
            row.update(norm_columns(outcome, self.types))
            row.update(train_loss=float(outcome.stats_weights.cpu() @ results.loss.cpu()), server_step_sum=self.step_sum,
                       skipped=int(outcome.skipped), **outcome.privacy)
            if r.divergence is not None:  # divergence_every: empty cells on the rounds without it
                row.update(pd_ls=r.divergence.ls, pd_vl=r.divergence.vl)
        self.logs["rounds"].append([row])
        self.last = row
        self.progress = {"acc": f"{row.get('test_acc', float(self.progress['acc'])):.4f}",
                         "N_E": f"{row.get('N_over_E', float('nan')):.3f}"}
        own = {k: {"own_test_acc": acc, "own_test_loss": loss} for k, (acc, loss) in r.client_eval.items()}
        for k, (acc, loss) in r.personal_eval.items():
            own.setdefault(k, {}).update(pers_test_acc=acc, pers_test_loss=loss)
        clients = [{"round": t, "client": k, "examples": n, "dropped": 1, **own.get(k, {})} for k, n in r.dropped.items()]
        layers = [] if outcome is None else layer_rows(t, outcome, self.layers, self.sizes, r.divergence)
        if outcome is not None:
            self.logs["layers"].append(layers)
            self.logs["client_layers"].append(client_layer_rows(t, results, outcome, self.layers))
            if self.output_layer is not None:
                self.logs["output_layer"].append(output_rows(t, results.clients, r.learners, *self.output_layer))
            clients += [{**row, **own.get(row["client"], {})} for row in client_rows(t, results, outcome, r.stragglers)]
        # client_eval_clients=all: the clients not in the round, their own scores alone
        in_round = {c["client"] for c in clients}
        clients += [{"round": t, "client": k, **scores} for k, scores in own.items() if k not in in_round]
        self.logs["clients"].append(sorted(clients, key=lambda c: c["client"]))
        if self.dashboard is not None:
            self.dashboard.log(t, row, layers)

    def communicated(self, r: RoundRecord) -> dict:
        """Round ``r``'s ``bytes_down``, ``bytes_up`` and the running ``bytes_total``
        (:mod:`fedrun.diagnostics.communication`): every sampled client received the model, the
        reporting ones (``r.clients``) sent theirs back, the dropped ones (``r.dropped``) nothing."""
        if self.payload is None:
            return {}
        down, up = self.payload.round(len(r.clients), len(r.dropped))
        self.bytes_total += down + up
        return {"bytes_down": down, "bytes_up": up, "bytes_total": self.bytes_total}

    def snapshot(self, t: int, params: Params, buffers: Params) -> None:
        """Save the evaluated global model of round t to ``models/round_NNNN.pt`` (loss surfaces)."""
        (self.path / "models").mkdir(exist_ok=True)
        atomic_save({"round": t, "params": params, "buffers": buffers}, self.path / "models" / f"round_{t:04d}.pt")

    def checkpoint(self, t: int, params: Params, buffers: Params, aggregator_state: dict,
                   optimizer_state: object) -> None:
        """Everything needed to continue after round t, with the CSVs' sizes at this point."""
        atomic_save({"version": CHECKPOINT_VERSION, "round": t, "params": params, "buffers": buffers,
                     "aggregator": aggregator_state, "optimizer_state": optimizer_state, "step_sum": self.step_sum,
                     "bytes_total": self.bytes_total, "partition": self.fingerprint,
                     "offsets": {name: lg.size() for name, lg in self.logs.items()},
                     "digests": {name: lg.digest() for name, lg in self.logs.items()},
                     "settings": self.settings, "values": self.values, "data": self.data, "run": self.run_id},
                    self.run.checkpoint_path)

    def _check_fields(self, ckpt: dict) -> None:
        """The checkpoint is of this fedrun's version and holds every field that version writes
        (:data:`CHECKPOINT_VERSION`): a downgraded one, a field removed (``digests``, ``settings``),
        is refused in one line, never resumed with fewer checks."""
        path, version = self.run.checkpoint_path, ckpt.get("version")
        core = [key for key in CHECKPOINT_KEYS if key not in ckpt]
        if core:  # not even a checkpoint of an earlier fedrun
            raise RunDirectoryError(f"{path}: not a fedrun checkpoint (missing or damaged: {', '.join(core)}); "
                                    "restore it or start a new run directory (nothing was written)")
        if version is None or (isinstance(version, int) and not isinstance(version, bool)
                               and version < CHECKPOINT_VERSION):
            which = "records no version" if version is None else f"is of version {version}"
            raise RunDirectoryError(f"{path}: {which}, and this fedrun writes and resumes version "
                                    f"{CHECKPOINT_VERSION} (written by an earlier fedrun, or fields removed since); "
                                    "resume it with the fedrun that wrote it, or start a new run directory (nothing "
                                    "was written)")
        if version != CHECKPOINT_VERSION:
            raise RunDirectoryError(f"{path}: of version {version}, not {CHECKPOINT_VERSION} (written by a newer "
                                    "fedrun?); resume it with that fedrun, or start a new run directory (nothing was "
                                    "written)")
        missing = [key for key in VOUCHING_KEYS if key not in ckpt]
        offsets, digests = ckpt["offsets"], ckpt.get("digests")
        if not missing:
            missing = [key for key, ok in (
                ("round", isinstance(ckpt["round"], int) and not isinstance(ckpt["round"], bool)),
                ("bytes_total", isinstance(ckpt["bytes_total"], int)),
                ("run", isinstance(ckpt["run"], str)),
                ("offsets", isinstance(offsets, dict) and all(isinstance(v, int) for v in offsets.values())),
                # A digest for every CSV it records the size of: a CSV without one would go unchecked.
                ("digests", isinstance(digests, dict) and isinstance(offsets, dict)
                 and all(isinstance(digests.get(name), str) for name in offsets)),
                # This run has settings and data digests to compare: a checkpoint without them is damaged.
                ("settings", (ckpt["settings"] is None) == (ckpt["values"] is None)
                 and (ckpt["settings"] is not None or self.settings is None)),
                ("data", ckpt["data"] is not None or self.data is None),
            ) if not ok]
        if missing:
            raise RunDirectoryError(f"{path}: not a whole fedrun checkpoint (missing or damaged: {', '.join(missing)}; "
                                    "every checkpoint this fedrun writes holds them); restore it or start a new run "
                                    "directory (nothing was written)")

    def _changed(self, values: str | None) -> list[str]:
        """The settings (dotted) that differ between the checkpoint's (JSON) and this run's."""
        try:
            return differences(json.loads(values), json.loads(self.values))
        except (TypeError, ValueError):  # either is None: no config on one side
            return []

    def sessions(self) -> list[dict]:
        """``run.json``: the processes that ran this run's rounds, oldest first (:mod:`fedrun.harness.provenance`)."""
        path = self.path / provenance.RUN_FILE
        try:
            sessions = json.loads(path.read_text()) if path.is_file() else []
        except (OSError, ValueError):  # damaged by a crash mid-write of an older version: start it again
            sessions = []
        return sessions if isinstance(sessions, list) else []

    def stopped(self, reason: str, error: str, last_round: int) -> None:
        """Close this process's session in ``run.json`` for a run that stopped with a one-line error
        it cannot resume past (``reason``: ``diverged``): when, after which round, and the error, so
        a table of runs can say "diverged at round t" instead of leaving the run out.  Best effort:
        a failure to write never hides the error that stopped the run."""
        sessions = self.sessions()
        if not sessions:
            return
        sessions[-1].update(stopped=provenance.now(), last_round=last_round, reason=reason, error=error)
        try:
            write_json(sessions, self.path / provenance.RUN_FILE)
        except OSError:
            pass

    def summary(self, aggregator: str, targets: list[float], objective: str | None = None) -> dict:
        """Write and return ``summary.json`` (:func:`summarize` of ``rounds.csv``, the run's
        ``objective`` and its provenance), closing this process's session in ``run.json``."""
        out = {"aggregator": aggregator, "partition_fingerprint": self.fingerprint,
               **summarize(self.path / "rounds.csv", list(targets)), **(self.privacy or {})}
        if objective is not None and out.get("rounds"):
            try:
                value = objective_value(out, self.path, objective)
            except ConfigError:  # a value this run does not have: the job reports it, the run is complete
                value = None
            out["objective"], out["objective_value"] = objective, value
        sessions = self.sessions()
        if sessions:
            sessions[-1].update(finished=provenance.now(), last_round=out.get("rounds"))
            write_json(sessions, self.path / provenance.RUN_FILE)
        out.update(provenance.summary_fields(sessions))
        write_json(out, self.path / "summary.json")
        if self.dashboard is not None:
            self.dashboard.close(out)
        return out


def run_ids(sessions: list) -> list[str]:
    """The run ids ``run.json``'s sessions record (:attr:`Recorder.run_id`), oldest first."""
    return [s["run"] for s in sessions if isinstance(s, dict) and isinstance(s.get("run"), str)]


def write_partition(path: Path, counts: np.ndarray) -> None:
    """``partition.csv``: per client, its number of examples and of each class."""
    header = "client,examples," + ",".join(f"class_{c}" for c in range(counts.shape[1]))
    lines = [header] + [f"{k},{row.sum()}," + ",".join(map(str, row)) for k, row in enumerate(counts)]
    text = "\n".join(lines) + "\n"
    write_atomic(path, lambda f: f.write(text))


# ----------------------------------------------------------------------------- rows
# Each tensor family crosses to the host once (``tolist``), not one ``float()`` per client and
# layer, which on a GPU would be a synchronization each.

def _ratio(n: float, e: float) -> float:
    return n / e if e > 0 else float("nan")


def norm_columns(outcome, types: np.ndarray) -> dict:
    """N, E, N/E and the server step for the whole model and per layer type (conv, fc)."""
    n, e = outcome.stats.N, outcome.stats.E
    row = {"N": n, "E": e, "N_over_E": _ratio(n, e), "server_step": outcome.server_step}
    for kind in ("conv", "fc"):
        mask = torch.as_tensor(types == kind)
        if mask.any():
            nk, ek = outcome.stats.group(mask, outcome.stats_weights)
            row.update({f"N_{kind}": nk, f"E_{kind}": ek,
                        f"server_step_{kind}": float(outcome.step_layer_norms[mask].pow(2).sum().sqrt())})
    return row


def layer_rows(t: int, outcome, layers: list[Layer], sizes: list[int], divergence) -> list[dict]:
    s = outcome.stats
    n, e, step = s.layer_N.tolist(), s.layer_E.tolist(), outcome.step_layer_norms.tolist()
    ls = [None] * len(layers) if divergence is None else divergence.layer_ls.tolist()
    vl = [None] * len(layers) if divergence is None or divergence.layer_vl is None else divergence.layer_vl.tolist()
    return [{"round": t, "layer": layer.name, "type": layer.type, "params": sizes[i], "N": n[i], "E": e[i],
             "N_over_E": _ratio(n[i], e[i]), "server_step": step[i], "pd_ls": ls[i], "pd_vl": vl[i]}
            for i, layer in enumerate(layers)]


def client_rows(t: int, results, outcome, stragglers: set[int]) -> list[dict]:
    smoothed = outcome.diagnostics.get("smoothed_angle")
    columns = {"examples": results.num_examples, "weight": outcome.client_weights,
               "update_norm": outcome.stats.client_norms, "angle": outcome.stats.angles(), "loss": results.loss,
               "steps": results.steps, "epochs": results.epochs, **results.extras}
    if smoothed is not None and smoothed.ndim == 1:
        columns["smoothed_angle"] = smoothed
    values = {name: v.tolist() for name, v in columns.items()}
    return [{"round": t, "client": k, **{name: v[j] for name, v in values.items()},
             "straggler": int(k in stragglers), "dropped": 0}
            for j, k in enumerate(results.clients)]


def client_layer_rows(t: int, results, outcome, layers: list[Layer]) -> list[dict]:
    angles, norms = outcome.stats.layer_angles().tolist(), outcome.stats.client_sq.sqrt().tolist()
    smoothed = outcome.diagnostics.get("smoothed_angle")
    smoothed = smoothed.tolist() if smoothed is not None and smoothed.ndim == 2 else None
    weights = (outcome.weights.T.tolist() if outcome.weights.ndim == 2
               else [[w] * len(layers) for w in outcome.weights.tolist()])
    return [{"round": t, "client": k, "layer": layer.name, "update_norm": norms[j][i], "angle": angles[j][i],
             "weight": weights[j][i], "smoothed_angle": None if smoothed is None else smoothed[j][i]}
            for j, k in enumerate(results.clients) for i, layer in enumerate(layers)]


def output_layer(layers: list[Layer]) -> tuple[str, str | None] | None:
    """The last fully connected layer's weight and bias names (the neurons d_q of the
    parameter-divergence paper's Appendix B, one row per class q), or None when the model ends
    otherwise."""
    last = [layer for layer in layers if layer.type == "fc"]
    if not last:
        return None
    weight = next((p for p in last[-1].params if p.endswith("weight")), None)
    bias = next((p for p in last[-1].params if p.endswith("bias")), None)
    return None if weight is None else (weight, bias)


def output_rows(t: int, clients: list[int], learners, weight: str, bias: str | None) -> list[dict]:
    """Per learner and class: the norm of the output neuron's weight row (the paper's Fig. 1)."""
    norms = learners[weight].double().flatten(2).norm(dim=2).tolist()  # [m][classes]
    biases = learners[bias].tolist() if bias else None
    return [{"round": t, "client": k, "class": q, "weight_norm": norms[j][q],
             "bias": biases[j][q] if bias else None}
            for j, k in enumerate(clients) for q in range(len(norms[j]))]
