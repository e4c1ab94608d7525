"""What a dashboard shows of a run (:mod:`fedrun.harness.dashboards`): its settings without run
mechanics (:func:`run_settings`, :func:`run_params`), its identity (:func:`run_hparams`), its name
(:func:`run_name`), its tags (:func:`run_tags`), and a round's and a summary's numbers as points.
Every dashboard reads them from here (TensorBoard, MLflow, and W&B in
:mod:`fedrun.harness.wandb_logger`), so the three show one run alike.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from fedrun.data.names import own_label

LAYER_VALUES = ("N", "E", "N_over_E", "server_step", "pd_ls", "pd_vl")
# The summary values TensorBoard's HParams tab shows beside the hparams (summary.json's keys).
SUMMARY_METRICS = ("final_test_acc", "best_test_acc", "best_round", "final_test_loss")
# Keys Hydra reads to build objects, not settings of the run.
INTERNAL_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
# Nodes that repeat ``hyperparams`` for the objects built from them.
MIRRORS = ("federation", "local", "participation")
# How a run is carried out, not what it computes: no MLflow parameter (the dashboards, resuming,
# where the data files are read from, the progress bar, how often a checkpoint is written).
MECHANICS = ("logger", "choices.logger", "resume", "data_root", "progress", "checkpoint_every",
             "dataset.load.root", "dataset.load.search", "dataset.load.download")
# Settings of how a run is launched, not of what it computes: never in a name or the hparams.
ADMIN = ("progress", "device", "resume", "data_root", "threads", "checkpoint_every", "logger", "hydra",
         "objective", "targets", "snapshots", "choices", "overrides", "tags", "dataset.load.search",
         "dataset.load.download", "dataset.load.root")
# Config groups that are hparams (logger is not), in the order a name or a table shows them.
GROUPS = ("aggregator", "dataset", "model", "partition", "hyperparams", "mode", "experiment", "scale", "engine")
# hyperparams that identify a run wherever they were set.
CORE = ("rounds", "num_clients", "client_fraction", "local_epochs", "batch_size", "lr", "optimizer")
# MLflow's run tags from the config groups' options.
TAGGED_GROUPS = ("aggregator", "dataset", "model", "partition", "mode", "experiment", "scale")


def _numbers(row: dict, skip=("round",)) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k not in skip and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def _points(row: dict, layer_rows: list[dict]) -> dict[str, float]:
    points = {f"round/{k}": v for k, v in _numbers(row).items()}
    for layer in layer_rows:
        for k, v in _numbers({c: layer.get(c) for c in LAYER_VALUES}).items():
            points[f"layer/{layer['layer']}/{k}"] = v
    return points


def _summary_values(summary: dict | None) -> dict[str, float]:
    """summary.json's finite numbers, nested ones as ``rounds_to_accuracy.0.9``."""
    return _numbers(_flat(summary or {}), skip=())


# ----------------------------------------------------------------------------- who a run is

def _flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _internal(key: str) -> bool:
    """A flat config key that is no setting of its own: a Hydra key or a mirror of hyperparams."""
    return key.split(".", 1)[0] in MIRRORS or key.rsplit(".", 1)[-1] in INTERNAL_KEYS


def _under(key: str, names) -> bool:
    """``key`` is one of ``names`` or lies below one (``logger.use.mlflow`` under ``logger``)."""
    return any(key == a or key.startswith(a + ".") for a in names)


def _admin(key: str) -> bool:
    return _under(key, ADMIN)


def _get(config: dict, key: str):
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _overrides(config: dict) -> dict[str, str]:
    """The job's command-line overrides that set something (``key -> value`` as written; deletions
    ``~key`` and launch settings left out), in their order."""
    out = {}
    for line in config.get("overrides") or []:
        key, sep, value = str(line).partition("=")
        if not sep or key.startswith("~"):
            continue
        key = key.lstrip("+")
        if not _admin(key):
            out[key] = value
    return out


def _sweep_file(run_dir: Path) -> Path | None:
    """``multirun.yaml``, which Hydra writes at the top of a sweep, when run_dir is one of its jobs."""
    for folder in list(Path(run_dir).resolve().parents)[:2]:
        if (folder / "multirun.yaml").is_file():
            return folder / "multirun.yaml"
    return None


def swept_keys(run_dir: str | Path) -> list[str] | None:
    """The settings the sweep that ran ``run_dir`` varies (``aggregator.beta``, ``seed``: its
    overrides with several values, and a sweeper's ``params``, Optuna's), in command-line order;
    None when ``run_dir`` is not a job of a sweep (or its ``multirun.yaml`` cannot be read)."""
    path = _sweep_file(Path(run_dir))
    if path is None:
        return None
    try:
        import yaml

        hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra") or {}
        lines = [str(line) for line in (hydra.get("overrides") or {}).get("task") or []]
        params = (hydra.get("sweeper") or {}).get("params") or {}
    except Exception:  # noqa: BLE001 - a name without the sweep rather than a failed run
        return None
    keys = [key.lstrip("+~") for key, sep, value in (line.partition("=") for line in lines) if sep and _sweeps(value)]
    return list(dict.fromkeys(keys + [str(k).lstrip("+") for k in params]))


# Hydra's sweep functions (``seed=range(0,3)``, ``'aggregator.beta=interval(0.5,1.1)'``).
SWEEP_FUNCTIONS = ("range", "choice", "interval", "glob", "shuffle", "sort", "tag")


def _sweeps(value: str) -> bool:
    """Whether an override's value is a sweep, as Hydra's grammar reads it: a sweep function, or
    values separated by a comma outside brackets, braces, parentheses and quotes (``fedavg,fedprox``;
    not ``[1,2]`` nor ``'a,b'``).  Read here without Hydra, which only the command floor imports."""
    value = value.strip()
    if any(value.startswith(f"{name}(") for name in SWEEP_FUNCTIONS):
        return True
    depth, quote = 0, None
    for i, ch in enumerate(value):
        if quote:
            quote = None if ch == quote and value[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return True
    return False


def _value(text: str):
    """An override's value as YAML reads it (``0.5`` -> 0.5), else as written."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _shown(key: str, config: dict, written: str | None):
    """A setting's value for a name or an hparam: the resolved config's, else the override's."""
    choices = config.get("choices") or {}
    if key in choices:
        return choices[key]
    value = _get(config, key)
    if value is None and written is not None:
        value = _value(written)
    return value


def run_name(config: dict | None, run_dir: str | Path) -> str:
    """A dashboard run's name: the method (the ``aggregator`` option; ``centralized`` for
    ``mode=centralized``) and the settings that tell the run apart, as ``key=value`` with the
    key's last part (``fednnnn beta=0.5 seed=1``): for a job of a sweep the settings the sweep
    varies, else those its command line set.  The run directory's name without a config."""
    if not config:
        return Path(run_dir).name
    choices = config.get("choices") or {}
    lead = "centralized" if choices.get("mode") == "centralized" or config.get("centralized") is True \
        else str(choices.get("aggregator") or "run")
    written = _overrides(config)
    swept = swept_keys(run_dir)
    keys = [k for k in (swept if swept is not None else written) if not _admin(k) and k != "aggregator"
            and not (k == "mode" and lead == "centralized")]
    short = [k.rsplit(".", 1)[-1] for k in keys]
    parts = []
    for key, name in zip(keys, short):
        value = _shown(key, config, written.get(key))
        if isinstance(value, float):
            value = f"{value:g}"
        elif isinstance(value, (list, dict)):
            value = json.dumps(value, separators=(",", ":"))
        parts.append(f"{name if short.count(name) == 1 else key}={value}")
    name = " ".join([lead, *parts])
    return name if len(name) <= 250 else name[:249] + "…"


def _hparam(value):
    if isinstance(value, bool):  # a choice of two, not the numbers 0 and 1
        return str(value).lower()
    if isinstance(value, (int, float, str)):
        return value
    return json.dumps(value, separators=(",", ":"), default=str)


def run_hparams(config: dict | None, run_dir: str | Path) -> dict:
    """A run's identity, as TensorBoard's hparams: each config group's option (``aggregator``,
    ``dataset``, ...), ``seed``, the core hyperparams (``hyperparams.lr`` ...), the aggregator's
    and the partition's settings (``aggregator.beta``) and every setting the job's command line
    set or its sweep varies, by their dotted keys; values are numbers, booleans or strings
    (lists as JSON); unset ones are left out."""
    if not config:
        return {}
    choices = config.get("choices") or {}
    out = {g: choices[g] for g in GROUPS if choices.get(g) is not None}
    out["dataset_label"] = own_label(config)  # left out below where the option has no label of its own
    out["seed"] = config.get("seed")
    out.update({f"hyperparams.{k}": _get(config, f"hyperparams.{k}") for k in CORE})
    for group in ("aggregator", "partition"):
        node = config.get(group) or {}
        if isinstance(node, dict):
            out.update({f"{group}.{k}": v for k, v in node.items() if k not in INTERNAL_KEYS
                        and not isinstance(v, dict)})
    written = _overrides(config)
    for key in [*written, *(swept_keys(run_dir) or [])]:
        if not _admin(key) and key not in out:
            out[key] = _shown(key, config, written.get(key))
    return {k: _hparam(v) for k, v in out.items() if v is not None}


def run_settings(config: dict | None) -> dict:
    """The run's settings, as the dashboards record them: config.yaml flattened (``hyperparams.lr``,
    ``choices.aggregator``, ``overrides`` as one line), without Hydra's keys, the mirrors of
    ``hyperparams`` and how the run was carried out (:data:`MECHANICS`: ``logger.*``, ``resume``,
    ``data_root``, ``progress`` ...); values as they are (W&B's config keeps numbers numbers)."""
    out = {}
    for key, value in _flat(config or {}).items():
        if _internal(key) or _under(key, MECHANICS):
            continue
        if key == "overrides" and isinstance(value, list):
            value = " ".join(map(str, value))
        out[key] = value
    return out


def run_params(config: dict | None) -> dict[str, str]:
    """The run's settings as MLflow parameters (:func:`run_settings`), each a string."""
    return {k: "null" if v is None else str(v) for k, v in run_settings(config).items()}


def run_tags(config: dict | None, run_dir: str | Path) -> dict[str, str]:
    """MLflow tags: the options of the main config groups, the seed, the fedrun version, the git
    commit of fedrun's source where it runs from a clone (MLflow's own ``mlflow.source.git.commit``,
    and ``git_dirty``: whether tracked files differed from it), the run directory and the preset's
    ``tags`` (``paper``, ``condition``, ...; a name taken already is left to fedrun's)."""
    from fedrun import __version__
    from fedrun.harness.provenance import git_state

    config = config or {}
    choices = config.get("choices") or {}
    tags = {g: str(choices[g]) for g in TAGGED_GROUPS if choices.get(g) is not None}
    if own_label(config):  # a stand-in by its own name ("CIFAR-10 (JPEG q75 copy)"): never taken for the original
        tags["dataset_label"] = own_label(config)
    if config.get("seed") is not None:
        tags["seed"] = str(config["seed"])
    tags.update(fedrun_version=__version__, run_dir=str(Path(run_dir).resolve()))
    commit, dirty = git_state()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["git_dirty"] = str(bool(dirty)).lower()
    for key, value in (config.get("tags") or {}).items():
        tags.setdefault(str(key), str(value))
    if config.get("overrides") is not None:
        tags["mlflow.note.content"] = "fedrun " + " ".join(map(str, config["overrides"]))
    return tags
