"""Find and read fedrun run directories (read-only), for the FedNNNN reproduction scripts.

A *run directory* is any folder holding both ``summary.json`` and ``config.yaml``: what one
``fedrun`` run (or one job of ``fedrun -m``) writes.  The FedNNNN presets
(``conf/experiment/fednnnn/*.yaml``) label their runs with ``tags: {paper, dataset, condition}``,
and ``summary.json`` names the aggregator, so every run can be filed under the cell
(method, dataset, condition) of the paper's Table 2 without parsing directory names.

Used by ``fednnnn_table2.py`` (Table 2) and ``plot_fednnnn.py`` (Figs. 3, 4, 7, 8, 9); both are
run as ``python scripts/<name>.py`` from the repository root, which puts this folder on
``sys.path``.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable

import yaml

# The paper's rows (Table 2 order), columns and display names.
METHODS = ("fedavg", "fedprox", "normnorm", "momentum", "fednnnn")
METHOD_LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "normnorm": "Norm-Norm",
                 "momentum": "Momentum", "fednnnn": "FedNNNN"}
DATASETS = ("mnist", "cifar10")
DATASET_LABELS = {"mnist": "MNIST", "cifar10": "CIFAR10"}
CONDITIONS = ("iid-b", "noniid-b", "iid-ub", "noniid-ub")
CONDITION_LABELS = {"iid-b": "IID - B", "noniid-b": "non-IID - B", "iid-ub": "IID - UB",
                    "noniid-ub": "non-IID - UB"}

# Table 1 (common settings) of the paper: what a full-scale run of each dataset uses.
TABLE1 = {
    "mnist": {"rounds": 100, "num_clients": 100, "client_fraction": 1.0, "local_epochs": 5,
              "batch_size": 50, "lr": 0.05, "weight_decay": 0.0},
    "cifar10": {"rounds": 250, "num_clients": 100, "client_fraction": 1.0, "local_epochs": 5,
                "batch_size": 50, "lr": 0.05, "weight_decay": 5.0e-4},
}
# The paper's CNNs (Table 3: MNIST, Table 4: CIFAR10), as fedrun's model classes.
MODELS = {"mnist": "fedrun.models.MnistCNN", "cifar10": "fedrun.models.Cifar10CNN"}
DATA_SIZE_KEYS = ("max_train", "max_test")


def find_runs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Every run directory at or below ``paths`` (each once, sorted by path)."""
    found: set[Path] = set()
    for top in paths:
        top = Path(top)
        if not top.exists():
            raise FileNotFoundError(f"no such directory: {top}")
        for dirpath, _dirnames, filenames in os.walk(top):
            if "summary.json" in filenames and "config.yaml" in filenames:
                found.add(Path(dirpath).resolve())
    return sorted(found)


@dataclass
class Run:
    """One run directory: its resolved config, its summary and (lazily) its CSVs."""

    path: Path
    config: dict
    summary: dict
    _frames: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Run":
        """Read ``config.yaml`` and ``summary.json`` (an empty summary while the run is unfinished)."""
        path = Path(path)
        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        summary_path = path / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        return cls(path, config, summary)

    @property
    def finished(self) -> bool:
        return bool(self.summary)

    # ------------------------------------------------------------------ where it belongs
    @property
    def tags(self) -> dict:
        return self.config.get("tags") or {}

    @property
    def method(self) -> str | None:
        """The aggregator: ``summary.json``'s name, else the config's ``_target_`` function."""
        name = self.summary.get("aggregator")
        if not name:
            target = (self.config.get("aggregator") or {}).get("_target_", "")
            name = target.rsplit(".", 1)[-1] or None
        return name

    @property
    def dataset(self) -> str | None:
        """The dataset the run *stands for* (the preset's tag), not necessarily the one it read."""
        return self.tags.get("dataset")

    @property
    def condition(self) -> str | None:
        return self.tags.get("condition")

    @property
    def cell(self) -> tuple[str | None, str | None, str | None]:
        return self.method, self.dataset, self.condition

    @property
    def seed(self):
        return self.config.get("seed")

    # ------------------------------------------------------------------ results
    def accuracy(self, which: str = "final") -> float | None:
        """``final_test_acc`` or ``best_test_acc`` from the summary (a fraction), or None."""
        value = self.summary.get(f"{which}_test_acc")
        return None if value is None else float(value)

    def rounds(self):
        """``rounds.csv`` as a pandas DataFrame (one row per round)."""
        return self._csv("rounds.csv")

    def layers(self):
        """``layers.csv`` as a pandas DataFrame (one row per round and layer)."""
        return self._csv("layers.csv")

    def _csv(self, name: str):
        if name not in self._frames:
            import pandas as pd

            self._frames[name] = pd.read_csv(self.path / name)
        return self._frames[name]

    # ------------------------------------------------------------------ how it differs from the paper
    @cached_property
    def deviations(self) -> list[str]:
        """How this run departs from the paper's setting (Table 1, the real dataset): a list of
        short phrases, empty for a run at the paper's scale on the paper's data."""
        out = []
        ds_cfg = self.config.get("dataset") or {}
        actual = ds_cfg.get("name")
        if self.dataset and actual and actual != self.dataset:
            out.append(f"data substituted: {actual} instead of {self.dataset}")
        limits = [f"{k}={ds_cfg[k]}" for k in DATA_SIZE_KEYS if ds_cfg.get(k) is not None]
        if limits:
            out.append("data subset " + " ".join(limits))
        model = (self.config.get("model") or {}).get("_target_")
        if model and self.dataset in MODELS and model != MODELS[self.dataset]:
            out.append(f"model {model.rsplit('.', 1)[-1]} (paper {MODELS[self.dataset].rsplit('.', 1)[-1]})")
        hp = self.config.get("hyperparams") or {}
        for key, want in TABLE1.get(self.dataset, {}).items():
            have = hp.get(key)
            if have is not None and float(have) != float(want):
                out.append(f"{key}={have} (paper {want})")
        return out


def load_runs(paths: Iterable[str | os.PathLike], paper: str = "fednnnn"):
    """The FedNNNN runs under ``paths``: tagged ``paper`` with a method, dataset and condition.

    Returns ``(runs, skipped)`` with ``[(path, reason)]`` for the others.
    """
    return load_tagged(paths, paper, ("dataset", "condition"))


def missing_dirs(dirs: list[str], prog: str) -> bool:
    """Print one line per argument that is not a directory; True if there was one."""
    bad = [d for d in dirs if not Path(d).is_dir()]
    for d in bad:
        print(f"{prog}: no such directory: {d}", file=sys.stderr)
    return bool(bad)


def save_figure(fig, path, notes=(), *, bottom: float = 0.06, right: float = 1.0, top: float = 1.0,
                dpi: int = 120) -> Path:
    """Lay out, save and close a matplotlib figure.

    ``notes`` (how the runs depart from the paper's setting) are printed in red along the
    bottom, in the figure fraction ``bottom`` kept free for them; ``right`` and ``top`` keep room
    for a legend placed outside the axes.
    """
    import matplotlib.pyplot as plt

    if notes:
        fig.text(0.01, 0.005, "NOT the paper's setting: " + "; ".join(notes), fontsize=6, color="firebrick",
                 va="bottom", wrap=True)
    fig.tight_layout(rect=(0, bottom if notes else 0, right, top))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def integer_rounds(ax) -> None:
    """Integer round ticks on a matplotlib axis, also when only a round or two were run."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = ax.get_xlim()
    if hi - lo < 3:
        first, last = int(round(lo + 0.05 * (hi - lo))), int(round(hi - 0.05 * (hi - lo)))
        ax.set_xticks(range(first, last + 1))
        ax.set_xlim(first - 0.5, last + 0.5)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def by_cell(runs: Iterable[Run]) -> dict[tuple[str, str, str], list[Run]]:
    """Runs grouped by (method, dataset, condition), seeds of one cell together."""
    cells: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for run in runs:
        cells[run.cell].append(run)
    return dict(cells)


def deviation_notes(runs: Iterable[Run]) -> list[str]:
    """The distinct :attr:`Run.deviations` over ``runs``, each with the number of runs it concerns."""
    counts: dict[str, int] = defaultdict(int)
    for run in runs:
        for d in run.deviations:
            counts[d] += 1
    return [f"{d} ({n} run{'s' if n != 1 else ''})" for d, n in sorted(counts.items())]


# ----------------------------------------------------------------------------- other papers' presets
# Helpers for the FedLayerWise and FedLap scripts (fedlayerwise_table1.py, plot_fedlayerwise.py,
# plot_fedlap.py), whose presets tag their runs differently (``tags: {paper, dataset, scenario}``
# for FedLayerWise, ``tags: {paper, dataset}`` plus ``hyperparams.stragglers`` for FedLap).

def tag(run: Run, key: str):
    """``run.tags[key]``, or None."""
    return run.tags.get(key)


def stragglers(run: Run) -> float:
    """The share of each round's clients that are stragglers (``hyperparams.stragglers``, 0 if unset)."""
    value = (run.config.get("hyperparams") or {}).get("stragglers")
    return float(value or 0.0)


def read_csv(run: Run, name: str):
    """A CSV of the run directory (``clients.csv``, ``client_layers.csv`` ...) as a pandas
    DataFrame, cached on the run; None when the file is missing or empty."""
    import pandas as pd

    if name not in run._frames:
        path = run.path / name
        try:
            run._frames[name] = pd.read_csv(path) if path.is_file() else None
        except pd.errors.EmptyDataError:
            run._frames[name] = None
    return run._frames[name]


def load_tagged(paths: Iterable[str | os.PathLike], paper: str, keys: Iterable[str] = ("dataset",)):
    """Like :func:`load_runs` for a paper whose presets set other tags: every run tagged
    ``paper`` that has a method and every tag in ``keys``.  Returns ``(runs, skipped)``."""
    keys = tuple(keys)
    runs, skipped = [], []
    for path in find_runs(paths):
        try:
            run = Run.load(path)
        except (OSError, ValueError, yaml.YAMLError) as e:
            skipped.append((path, f"unreadable: {e}"))
            continue
        if run.tags.get("paper") != paper:
            skipped.append((path, f"not tagged paper={paper}"))
        elif run.method is None or any(run.tags.get(k) is None for k in keys):
            skipped.append((path, f"no method or no tags {'/'.join(keys)}"))
        else:
            runs.append(run)
    return runs, skipped


def setting_deviations(run: Run, hyperparams: dict, data: str | None = None, model: dict | None = None,
                       partition: dict | None = None, labels: dict | None = None) -> list[str]:
    """How ``run`` departs from a paper's setting, as in :attr:`Run.deviations` but against the given
    reference: ``hyperparams`` / ``model`` / ``partition`` map config keys (of the run's
    ``hyperparams``, ``model``, ``partition``) to the paper's values, ``data`` is the paper's dataset
    (default: the ``dataset`` tag).  ``labels`` may rename a reference value in the message
    (e.g. ``{"rounds": "preset 100; T not stated"}``)."""
    labels = labels or {}
    out = []
    ds_cfg = run.config.get("dataset") or {}
    actual, want = ds_cfg.get("name"), data or run.dataset
    if want and actual and actual != want:
        out.append(f"data substituted: {actual} instead of {want}")
    limits = [f"{k}={ds_cfg[k]}" for k in DATA_SIZE_KEYS if ds_cfg.get(k) is not None]
    if limits:
        out.append("data subset " + " ".join(limits))
    for section, reference in (("model", model), ("partition", partition), ("hyperparams", hyperparams)):
        have_cfg = run.config.get(section) or {}
        for key, ref in (reference or {}).items():
            have = have_cfg.get(key)
            if key not in have_cfg:
                if section == "hyperparams":
                    continue  # not recorded (an older or hand-made config): nothing to compare
                have = "unset"
            if not _same(have, ref):
                shown = have.rsplit(".", 1)[-1] if isinstance(have, str) and key == "_target_" else have
                ref_shown = ref.rsplit(".", 1)[-1] if isinstance(ref, str) and key == "_target_" else ref
                name = key if section == "hyperparams" else f"{section}.{key}"
                out.append(f"{name}={shown} ({labels.get(key, f'paper {ref_shown}')})")
    return out


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) \
            and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def mean_by_round(frames: list, column: str = "round"):
    """DataFrames of one quantity per round (seeds of one method) averaged round by round."""
    import pandas as pd

    frames = [f for f in frames if f is not None]
    if not frames:
        return None
    if len(frames) == 1:
        return frames[0]
    return pd.concat(frames).groupby(column, as_index=False).mean(numeric_only=True)


def count_notes(per_run: Iterable[list[str]]) -> list[str]:
    """Distinct phrases over runs (one list per run), each with the number of runs it concerns."""
    counts: dict[str, int] = defaultdict(int)
    for phrases in per_run:
        for d in phrases:
            counts[d] += 1
    return [f"{d} ({n} run{'s' if n != 1 else ''})" for d, n in sorted(counts.items())]
