"""What every section's claims are made of: the numbers as text (one rounding, :func:`fmt`; :func:`exact`
for values that need none; :func:`bound_up` for bounds; :func:`apart` for values set side by side) and
the runs (:class:`Data`: the run folders under ``outputs/reproductions/``, read once, their accuracies
as exact decimals).

How a bound is rounded: a figure that bounds others ("within 0.4 points", "at most 1.8", "up to 7.11")
is computed on the exact values (the largest exact difference, never one of rounded figures) and then
rounded *up*, away from what it bounds (:func:`bound_up`: 0.3301 -> 0.4, 0.33 -> 0.33 at two decimals),
so the stated bound holds of the unrounded values; a bound that is itself a value with no more
decimals than shown is written as it is (:func:`exact`).  A figure that is a value, not a bound (a
mean, a difference, the ends of a range "1.1 to 1.8 points"), is rounded half up (:func:`fmt`).
Ties are decided on the exact values: two figures that print alike after rounding but are not equal
are either printed with the decimals that tell them apart or not called a tie."""
from __future__ import annotations

import csv
import statistics
from decimal import Decimal, ROUND_CEILING, ROUND_HALF_UP
from pathlib import Path
from typing import Iterable

import yaml

from fedrun.results import Run, find_runs, read_csv, read_rounds, read_summary, stopped


ROOT = Path(__file__).resolve().parents[2]  # the repository root (scripts/common/claims_core.py)
RUNS = Path("outputs") / "reproductions"  # where the runs are, below a root
DOC = Path("docs") / "reproductions.md"
REFERENCE_CSV = Path("scripts") / "paper_targets" / "niidbench_reference_results.csv"  # Flower's numbers
# Flower's README as merged since: the best round's accuracy, mean +- sd over three runs (MNIST).
FLOWER_BEST_CSV = Path("scripts") / "paper_targets" / "niidbench_flower_best_rounds.csv"
HEADING = "Figures quoted in docs/reproductions.md"
SEEDS = (0, 1, 2)
# The whole MNIST's training set (the runs read its first 10,000 images: mnist_train10k).
MNIST_TRAIN = 60_000
# rounds.csv's columns that time a round (they differ between two runs of the same numbers).
TIMINGS = ("train_s", "eval_s", "wall_s")
WORDS = {0: "no", 1: "one", 2: "two", 3: "three", 4: "four"}


# ----------------------------------------------------------------------------- numbers as text

def dec(x) -> Decimal:
    """``x`` as the decimal it was written as: ``Decimal(str(x))`` for a float (0.9655 stays
    0.9655, not the binary 0.96549999...), itself for a Decimal or an int."""
    if isinstance(x, Decimal):
        return x
    if isinstance(x, bool) or x is None:
        raise TypeError(f"not a number: {x!r}")
    return Decimal(x) if isinstance(x, int) else Decimal(str(float(x)))


def fmt(x, digits: int = 1) -> str:
    """``x`` rounded half up to ``digits`` decimals (0 for an integer), on its exact decimal value:
    fmt(0.125, 2) == "0.13", fmt(2.675, 2) == "2.68", fmt(96.65, 1) == "96.7".  The one rounding
    of every claim."""
    value = dec(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{value.copy_abs() if value.is_zero() else value:f}"


def bound_up(x, digits: int = 1) -> str:
    """An upper bound of ``|x|`` with ``digits`` decimals: ``|x|`` rounded up (towards +inf) on its
    exact decimal value, so "within {bound_up(x)} points" holds of the unrounded ``x``:
    bound_up(0.3301) == "0.4", bound_up(0.33, 2) == "0.33", bound_up(1.734) == "1.8".  For
    "within", "at most", "up to", "no more than"; never round such a bound half up (:func:`fmt`
    would make 0.33 "0.3", less than what it bounds)."""
    value = abs(dec(x)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_CEILING)
    return f"{value:f}"


def apart(values: Iterable, digits: int = 1, most: int = 8) -> int:
    """The fewest decimals, at least ``digits``, at which values that differ also print differently
    under :func:`fmt` (equal values print alike at any): a tie is then one on the exact values,
    never one that rounding made.  apart([0.5595, 0.5607], 2) == 3."""
    values = sorted({dec(v) for v in values})
    for d in range(digits, most + 1):
        if len({fmt(v, d) for v in values}) == len(values):
            return d
    raise ValueError(f"{values} differ beyond {most} decimals")


def exact(x, digits: int = 2) -> str:
    """``x`` written out without rounding, with one to ``digits`` decimals (96.55, 97.2, 80.0): for
    a value that has no more decimals, as an accuracy in % on 2,000 test images has (multiples of
    0.05).  A value that would need rounding raises ValueError: use :func:`fmt` for it."""
    text = fmt(x, digits)
    if Decimal(text) != dec(x):
        raise ValueError(f"{x} has more than {digits} decimals: round it with fmt()")
    while text.endswith("0") and not text.endswith(".0"):
        text = text[:-1]
    return text


def pct(fraction) -> Decimal:
    """An accuracy (a fraction, as rounds.csv holds it) in %, exactly."""
    return dec(fraction) * 100


def mean(values: Iterable) -> Decimal:
    values = [dec(v) for v in values]
    return sum(values, Decimal(0)) / len(values)


def joined(items: Iterable[str], last: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {last} " + items[-1]


def words(n: int) -> str:
    return WORDS.get(n, str(n))


def thousands(n) -> str:
    """An integer with thousands separators (6,000)."""
    value = dec(n)
    if value != value.to_integral_value():
        raise ValueError(f"{n} is not an integer")
    return f"{int(value):,}"


# ----------------------------------------------------------------------------- the runs

class Data:
    """The run folders under ``root/outputs/reproductions``, read once: :meth:`run` by a folder
    name and (method, seed, stragglers), filed from each run's own config.yaml and summary.json,
    so folder names need not follow one pattern."""

    def __init__(self, root: str | Path = ROOT):
        self.root = Path(root)
        self._index: dict[str, dict] = {}
        self._rounds: dict[Path, object] = {}

    def folder(self, name: str) -> Path:
        return self.root / RUNS / name

    def index(self, name: str) -> dict[tuple, Run]:
        """``{(method, seed, stragglers, max_train): Run}`` for every run that started under ``name``
        (a folder below outputs/reproductions), the diverged ones included."""
        if name not in self._index:
            runs = [load_run(path) for path in find_runs(self.folder(name), require=("config.yaml",))]
            table = {}
            for run in runs:
                key = (run.method, run.seed, stragglers(run), (run.config.get("dataset") or {}).get("max_train"))
                if key in table:
                    raise ValueError(f"{name}: two runs of {key}: {table[key].path} and {run.path}")
                table[key] = run
            self._index[name] = table
        return self._index[name]

    def runs(self, name: str, method: str | None = None, stragglers: float | None = None) -> list[Run]:
        """The runs under ``name`` of ``method`` (and straggler fraction), in seed order."""
        return [run for (m, seed, s, _n), run in sorted(self.index(name).items(), key=lambda kv: str(kv[0]))
                if method in (None, m) and stragglers in (None, s)]

    def run(self, name: str, method: str, seed: int, stragglers: float = 0.0, max_train: int | None = None) -> Run:
        """The run under ``name`` of ``method``, ``seed``, ``stragglers`` (and ``dataset.max_train``)."""
        try:
            return self.index(name)[(method, seed, stragglers, max_train)]
        except KeyError:
            raise ValueError(f"{self.folder(name)}: no run of {method}, seed {seed}, stragglers {stragglers}"
                             + (f", max_train {max_train}" if max_train else "")) from None

    def rounds(self, run: Run):
        """rounds.csv (read once), the rows with a test accuracy."""
        if run.path not in self._rounds:
            self._rounds[run.path] = read_rounds(run.path).dropna(subset=["test_acc"]).reset_index(drop=True)
        return self._rounds[run.path]

    def curve(self, run: Run) -> dict[int, Decimal]:
        """``{round: test accuracy in %}``, exact."""
        df = self.rounds(run)
        return {int(r): pct(a) for r, a in zip(df["round"], df["test_acc"])}

    def reached(self, run: Run) -> int:
        """The last round with a test accuracy; 0 for a run stopped before its first round ended
        (rounds.csv missing or only its header), which :meth:`curve` refuses as nothing to draw."""
        path = run.path / "rounds.csv"
        if not path.is_file() or len(path.read_text().splitlines()) < 2:
            return 0
        curve = self.curve(run)
        return max(curve) if curve else 0

    def final(self, run: Run) -> Decimal | None:
        """The accuracy (%) after the last round; None for a run that diverged (no final model)."""
        return None if diverged_at(run) else list(self.curve(run).values())[-1]

    def best(self, run: Run) -> Decimal:
        return max(self.curve(run).values())

    def at(self, run: Run, round_: int) -> Decimal:
        return self.curve(run)[round_]

    def mean_to(self, run: Run, round_: int) -> Decimal:
        """The mean accuracy (%) over rounds 1..round_ (fedlap/plot.py's "mean 1-20")."""
        curve = self.curve(run)
        if max(curve) < round_:
            raise ValueError(f"{run.path}: stopped before round {round_}")
        return mean(v for r, v in curve.items() if r <= round_)

    def clients(self, run: Run):
        df = read_csv(run.path, "clients.csv")
        if df is None:
            raise ValueError(f"{run.path}: no clients.csv")
        return df

    def partition(self, run: Run):
        """The run's partition.csv (a row a client: ``examples`` and the per-class counts)."""
        df = read_csv(run.path, "partition.csv")
        if df is None:
            raise ValueError(f"{run.path}: no partition.csv")
        return df

    def train_images(self, run: Run) -> int:
        """The training images the run's clients hold together (partition.csv)."""
        return int(self.partition(run)["examples"].sum())

    def same_but_timings(self, a: Run, b: Run) -> bool:
        """Whether two runs' rounds.csv agree in every column but the timings (:data:`TIMINGS`), over
        the rows with a test accuracy (:meth:`rounds`; every row where a run evaluates each round)."""
        x, y = (self.rounds(r).drop(columns=list(TIMINGS)) for r in (a, b))
        return list(x.columns) == list(y.columns) and x.equals(y)

    def reference(self) -> dict[tuple[str, str, str], Decimal]:
        """Flower's numbers that docs/reproductions.md quotes: {(method, dataset, partition): %}."""
        with open(self.root / REFERENCE_CSV, newline="") as f:
            return {(r["method"], r["dataset"], r["partition"]): Decimal(r["accuracy_pct"]) for r in csv.DictReader(f)
                    if r["source"] == "flower" and r["accuracy_pct"].strip()}

    def flower_best(self) -> dict[tuple[str, str, str], tuple[Decimal, Decimal]]:
        """Flower's README as merged since (adap/flower fdef7af): {(method, dataset, partition):
        (the best round's accuracy, mean over three runs, %; their standard deviation)}."""
        with open(self.root / FLOWER_BEST_CSV, newline="") as f:
            return {(r["method"], r["dataset"], r["partition"]): (Decimal(r["accuracy_pct"]), Decimal(r["std_pct"]))
                    for r in csv.DictReader(f) if r["source"] == "flower_best3"}


def load_run(path: Path) -> Run:
    """:meth:`fedrun.results.Run.load`, with config.yaml parsed by libyaml where PyYAML has it (ten
    times faster than its Python parser: the claims read some 180 configs); the same Run, and a
    config that libyaml cannot read goes through :func:`fedrun.results.read_config` and its checks."""
    loader = getattr(yaml, "CSafeLoader", None)
    try:
        config = yaml.load((path / "config.yaml").read_bytes(), Loader=loader) if loader else None
    except yaml.YAMLError:
        config = None
    if not isinstance(config, dict) or not config:
        return Run.load(path)
    return Run(path, config, read_summary(path))


def stragglers(run: Run) -> float:
    return float((run.config.get("hyperparams") or {}).get("stragglers") or 0.0)


def diverged_at(run: Run) -> int | None:
    """The round a run's model became NaN or Inf (run.json), None for a run that did not."""
    how = None if run.finished else stopped(run.path)
    return how["round"] if how and how["reason"] == "diverged" else None


def hyper(run: Run, key: str):
    return (run.config.get("hyperparams") or {}).get(key)


def held_out_images(run: Run, train: int) -> int:
    """The held-out test images of a run on a split dataset (``dataset.load.test_fraction``)."""
    fraction = dec(((run.config.get("dataset") or {}).get("load") or {})["test_fraction"])
    return int(dec(train) * fraction / (1 - fraction))


def aggregator(run: Run, key: str):
    """A setting of the run's aggregator (``aggregator.mu``, ``aggregator.correction``), or None."""
    return (run.config.get("aggregator") or {}).get(key)


def sd(values: list[Decimal]) -> Decimal:
    """The sample standard deviation (n - 1 in the denominator) of ``values``, as a decimal."""
    return dec(statistics.stdev([float(v) for v in values]))
