"""What a job returns to Hydra's sweepers: the run's ``objective`` setting as one number.

It lives with the run (the recorder writes it into ``summary.json``), so the run harness needs no
analysis module: :func:`objective` reads the run's own summary and ``rounds.csv`` with the
standard library alone.
"""
from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from fedrun.errors import ConfigError

# summary.json's numbers a sweep can optimize; see objective().
SUMMARY_OBJECTIVES = ("best_test_acc", "final_test_acc", "final_test_loss", "best_round", "final_val_acc",
                      "best_val_acc", "final_average_test_acc", "final_sent_test_acc")
# mean_<split>_acc_last_<n> (the last n evaluated rounds) and mean_<split>_acc (every evaluated round: the
# area under the accuracy curve, what "higher accuracy in the first T rounds" compares).
MEAN_ACC = re.compile(r"^mean_(test|val)_acc(?:_last_(\d+))?$")
LAST_N = re.compile(r"^mean_(?:test|val)_acc_last_(\d+)$")


def check_objective(name: str) -> None:
    """One line for an ``objective`` that no run can report."""
    match = MEAN_ACC.match(name)
    if name in SUMMARY_OBJECTIVES or (match and (match.group(2) is None or int(match.group(2)) >= 1)):
        return
    raise ConfigError("objective", name, f"choose one of: {', '.join(SUMMARY_OBJECTIVES)}, "
                      "mean_test_acc_last_<n> or mean_val_acc_last_<n> (the mean accuracy of the last n evaluated "
                      "rounds), or mean_test_acc / mean_val_acc (of every evaluated round)")


def objective(summary: dict, run_dir: str | Path, name: str) -> float:
    """The run's value of ``objective`` as a float: a number of ``summary.json``, or
    ``mean_test_acc_last_<n>``, the mean ``test_acc`` of the last n evaluated rounds (steadier
    than the final or best accuracy for tuning), ``mean_test_acc``, the mean over every evaluated
    round (the area under the curve), and the same of ``val_acc`` (``mean_val_acc_last_<n>``,
    ``mean_val_acc``) for tuning on a validation split."""
    check_objective(name)
    match = MEAN_ACC.match(name)
    if match:
        column = f"{match.group(1)}_acc"
        values = _column(Path(run_dir) / "rounds.csv", column)
        if not values:
            raise ConfigError("objective", name, f"this run has no {column} in rounds.csv ("
                              + ("needs hyperparams.validation_fraction > 0)" if column == "val_acc" else "none evaluated)"))
        if match.group(2):
            values = values[-int(match.group(2)):]
        return math.fsum(values) / len(values)
    value = summary.get(name)
    if value is None:
        raise ConfigError("objective", name, "this run has no such value (final_val_acc and best_val_acc need "
                          "hyperparams.validation_fraction > 0; final_average/sent_test_acc need an aggregator "
                          "whose two models differ)")
    return float(value)


def _column(path: Path, column: str) -> list[float]:
    """The numbers of one ``rounds.csv`` column, in round order, without its empty cells (the
    rounds not evaluated)."""
    with open(path, newline="") as f:
        cells = [row.get(column) for row in csv.DictReader(f)]
    return [float(c) for c in cells if c not in (None, "", "nan", "NaN")]
