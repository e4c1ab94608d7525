#!/usr/bin/env python
"""The figures that docs/reproductions.md states in its prose, computed from the committed run
folders under ``outputs/reproductions/``, so that the docs and the data cannot drift apart.

A *claim* is one phrase of the doc with its numbers left as format fields (``in #C=2 FedAvg is
ahead of FedProx in each of the {n} seeds (by {lo} to {hi} points)``) and a function that computes
those fields from the run folders.  ``tests/test_claims.py`` renders every claim and checks that
the text occurs in docs/reproductions.md word for word; a claim whose data says otherwise renders
another text, and the test names it.  Where a sentence says something that is true or false rather
than a number ("in each seed", "within a point"), the field holds the words, and renders other
words when the data disagrees.

One rounding, everywhere: :func:`fmt` rounds half up (0.125 -> 0.13) on the exact decimal value
(``Decimal(str(x))``, never the binary float), and :func:`exact` writes a value that has at most
two decimals (an accuracy on 2,000 or 10,000 test images, in %) without rounding it at all.  Means,
differences and ranges are computed on the runs' unrounded values (accuracies read as decimals
from rounds.csv), never on the rounded cells of a table.

The sections are those of docs/reproductions.md: ``niidbench`` (the NIID-Bench grid and its
comparison with Flower's baseline), ``niidbench_readings`` (data size and SCAFFOLD's divergence),
``fednova_stragglers``, ``fedlap_fmnist`` (the bullets under "What holds and what does not"),
``fedlap_readings``, ``fedlap_mnist_train10k``, ``fedlap_tuned`` (FedLap against baselines tuned by scripts/tune.py) and
``fedlayerwise`` (Table I on the whole MNIST), ``fednnnn_gpu`` (Table 2's MNIST
non-IID unbalanced column, one GPU run), ``niidbench_gpu`` (NIID-Bench's #C=2 and IID rows on
the whole MNIST, GPU runs cut short), ``niidbench_tuned`` (FedProx's mu tuned per NIID-Bench cell
by scripts/tune.py), ``fedlap_mnist`` (FedLap's MNIST figures on the whole MNIST),
``fedlap_mnist_tuned`` (FedLap on the whole MNIST against baselines tuned by scripts/tune.py) and
``niidbench_whole`` (Table III's MNIST rows on the whole MNIST as far as the CPU runs go, and
SCAFFOLD under #C=2 there with both readings of its correction).  ``niidbench_table3.py collect`` and
``plot_fedlap.py --summary`` print the sections of the folders they read (:func:`print_section`).

Examples (from the repository root)::

    python scripts/claims.py                       # every section
    python scripts/claims.py --section fedlap_readings niidbench
    python scripts/claims.py --check               # also: is each text in docs/reproductions.md?
    python scripts/claims.py --write               # first rewrite the doc's marked claims (tables in progress)
"""
from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Callable, Iterable

import yaml

from fedrun.moved import current_target
from fedrun.results import Run, find_runs, read_csv, read_rounds, read_summary, stopped

ROOT = Path(__file__).resolve().parent.parent  # the repository root
RUNS = Path("outputs") / "reproductions"  # where the runs are, below a root
DOC = Path("docs") / "reproductions.md"
REFERENCE_CSV = Path("scripts") / "paper_targets" / "niidbench_reference_results.csv"  # Flower's numbers
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

    def final(self, run: Run) -> Decimal | None:
        """The accuracy (%) after the last round; None for a run that diverged (no final model)."""
        return None if diverged_at(run) else list(self.curve(run).values())[-1]

    def best(self, run: Run) -> Decimal:
        return max(self.curve(run).values())

    def at(self, run: Run, round_: int) -> Decimal:
        return self.curve(run)[round_]

    def mean_to(self, run: Run, round_: int) -> Decimal:
        """The mean accuracy (%) over rounds 1..round_ (plot_fedlap.py's "mean 1-20")."""
        curve = self.curve(run)
        if max(curve) < round_:
            raise ValueError(f"{run.path}: stopped before round {round_}")
        return mean(v for r, v in curve.items() if r <= round_)

    def clients(self, run: Run):
        df = read_csv(run.path, "clients.csv")
        if df is None:
            raise ValueError(f"{run.path}: no clients.csv")
        return df

    def train_images(self, run: Run) -> int:
        """The training images the run's clients hold together (partition.csv)."""
        df = read_csv(run.path, "partition.csv")
        if df is None:
            raise ValueError(f"{run.path}: no partition.csv")
        return int(df["examples"].sum())

    def reference(self) -> dict[tuple[str, str, str], Decimal]:
        """Flower's numbers that docs/reproductions.md quotes: {(method, dataset, partition): %}."""
        with open(self.root / REFERENCE_CSV, newline="") as f:
            return {(r["method"], r["dataset"], r["partition"]): Decimal(r["accuracy_pct"]) for r in csv.DictReader(f)
                    if r["source"] == "flower" and r["accuracy_pct"].strip()}


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


# ----------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Claim:
    """A phrase of docs/reproductions.md (``template``, with format fields) and the function that
    computes its fields from the runs (its docstring says what it checks)."""

    id: str
    section: str
    template: str
    compute: Callable[[Data], dict]

    def render(self, data: Data) -> str:
        return self.template.format(**self.compute(data))

    @property
    def checks(self) -> str:
        return " ".join((self.compute.__doc__ or "").split())


CLAIMS: dict[str, Claim] = {}


def claim(id: str, section: str, template: str):
    """Register the decorated function as the claim ``id`` of ``section``."""
    def register(compute: Callable[[Data], dict]) -> Callable[[Data], dict]:
        if id in CLAIMS:
            raise ValueError(f"claim {id} registered twice")
        CLAIMS[id] = Claim(id, section, template, compute)
        return compute
    return register


def sections() -> list[str]:
    return list(dict.fromkeys(c.section for c in CLAIMS.values()))


def render_section(section: str, data: Data) -> list[tuple[Claim, str | None, str | None]]:
    """``(claim, text, error)`` for each claim of ``section``; a claim that cannot be computed (its
    runs missing or damaged) has ``text`` None and the error's line."""
    out = []
    for c in CLAIMS.values():
        if c.section != section:
            continue
        try:
            out.append((c, c.render(data), None))
        except Exception as e:  # noqa: BLE001 - a table script prints the table whatever a claim does
            out.append((c, None, f"{type(e).__name__}: {e}"))
    return out


def print_section(section: str, root: str | Path = ROOT, file=None, data: Data | None = None) -> bool:
    """Print ``[section]`` and each of its claims' text, one line each, its id first; True when
    every claim could be computed."""
    file = file or sys.stdout
    if section not in sections():
        raise ValueError(f"no section {section!r}; the sections: {', '.join(sections())}")
    print(f"[{section}]", file=file)
    ok = True
    for c, text, error in render_section(section, data or Data(root)):
        print(f"{c.id}: {text if error is None else 'CANNOT BE COMPUTED: ' + error}", file=file)
        ok = ok and error is None
    return ok


def print_sections(names: Iterable[str], root: str | Path = ROOT, file=None) -> bool:
    """:data:`HEADING`, then :func:`print_section` for each of ``names`` (one reading of the runs)."""
    file = file or sys.stdout
    data = Data(root)
    print(f"\n{HEADING}", file=file)
    return all([print_section(name, root, file, data) for name in names])


def root_of(path: str | Path, below: str) -> Path | None:
    """The repository root of ``path`` if it lies at or under ``<root>/outputs/reproductions/<below>``
    (``below`` may name several levels, ``fedlap/fmnist``), else None."""
    parts = Path(path).resolve().parts
    want = (*RUNS.parts, *Path(below).parts)
    for i in range(len(parts) - len(want) + 1):
        if parts[i:i + len(want)] == want:
            return Path(*parts[:i]) if i else Path("/")
    return None


# The sections each table script prints, by the folder (below outputs/reproductions) its DIRs lie in.
NIIDBENCH_SECTIONS = {"niidbench": ("niidbench", "niidbench_readings", "fednova_stragglers", "niidbench_tuned"),
                      "niidbench_tuned": ("niidbench_tuned",), "niidbench_whole": ("niidbench_whole",),
                      "niidbench_whole_readings": ("niidbench_whole",)}
FEDLAYERWISE_SECTIONS = {"fedlayerwise/table1": ("fedlayerwise",)}
FEDLAP_SECTIONS = {"fedlap/tuned": ("fedlap_tuned",), "fedlap/fmnist": ("fedlap_fmnist",), "fedlap/mnist_train10k": ("fedlap_mnist_train10k",),
                   "fedlap/mnist": ("fedlap_mnist",), "fedlap/tuned_mnist": ("fedlap_mnist_tuned",),
                   "fedlap/readings": ("fedlap_readings",), "fedlap/preset": ("fedlap_readings",)}


def sections_of(dirs: Iterable[str | Path], by_folder: dict[str, tuple[str, ...]]) -> tuple[Path | None, list[str]]:
    """The repository root and the sections to print for a table script's DIRs: those of
    ``by_folder`` whose folder holds a DIR; no root (print nothing) unless every DIR lies in one
    of the folders of one checkout's outputs/reproductions."""
    roots, names = set(), []
    for d in dirs:
        found = [(root_of(d, folder), folder) for folder in by_folder]
        found = [(root, folder) for root, folder in found if root is not None]
        if not found:
            return None, []
        roots.add(found[0][0])
        names += [n for n in by_folder[found[0][1]] if n not in names]
    return (roots.pop(), names) if len(roots) == 1 else (None, [])


def normalized(text: str) -> str:
    """Markdown text with its line breaks joined and its white space collapsed to one space."""
    return " ".join(text.split())


def in_doc(text: str, doc: str) -> bool:
    return normalized(text) in normalized(doc)


# A claim the data owns outright (a table that fills as runs finish) stands in the doc between two
# HTML comments, invisible on the rendered page; `--write` puts its rendered text between them.
MARKED = re.compile(r"<!-- claim (?P<id>[\w.]+) -->(?P<body>.*?)<!-- end claim -->", re.S)


def write_marked(doc: str, data: Data) -> tuple[str, list[str]]:
    """``doc`` with every marked claim's text rendered afresh from ``data`` (the white space around
    the old text kept, so a table stays a block of its own), and the ids whose text changed.  An
    unknown id, or a claim that cannot be computed, raises: the doc is then left as it was."""
    changed = []

    def fresh(match: re.Match) -> str:
        id_, body = match["id"], match["body"]
        if id_ not in CLAIMS:
            raise ValueError(f"docs/reproductions.md marks an unknown claim {id_!r}")
        text = CLAIMS[id_].render(data)
        lead, trail = body[: len(body) - len(body.lstrip())], body[len(body.rstrip()):]
        if body.strip() != text:
            changed.append(id_)
        return f"<!-- claim {id_} -->{lead}{text}{trail}<!-- end claim -->"

    return MARKED.sub(fresh, doc), changed


# ============================================================================= NIID-Bench (MNIST)

NB = "niidbench"
PARTITIONS = ("dir05", "c1", "c2", "c3", "iid")
METHODS = ("fedavg", "fedprox", "scaffold", "fednova")


def nb(data: Data, partition: str, method: str) -> list[Run]:
    """The three seeds' runs of a NIID-Bench cell (outputs/reproductions/niidbench/mnist_<partition>)."""
    return [data.run(f"niidbench/mnist_{partition}", method, s) for s in SEEDS]


def finals(data: Data, partition: str, method: str) -> list[Decimal | None]:
    return [data.final(r) for r in nb(data, partition, method)]


def cell_mean(data: Data, partition: str, method: str) -> Decimal:
    """A cell's mean final accuracy (%) over the seeds that did not diverge (as the table's)."""
    return mean(v for v in finals(data, partition, method) if v is not None)


def flower_gaps(data: Data, partition: str) -> list[Decimal]:
    """Flower's one run minus our mean final accuracy, per method with a finished run."""
    ref = data.reference()
    return [ref[(m, "mnist", partition)] - cell_mean(data, partition, m) for m in METHODS
            if any(v is not None for v in finals(data, partition, m))]


def seed_leads(data: Data, partition: str, method: str) -> list[Decimal]:
    """Per seed: ``method``'s final accuracy minus the best of the other three (points)."""
    out = []
    for i in range(len(SEEDS)):
        others = [finals(data, partition, m)[i] for m in METHODS if m != method]
        out.append(finals(data, partition, method)[i] - max(v for v in others if v is not None))
    return out


def images(points: Decimal, tests: int) -> int:
    """A difference in accuracy (points) as a number of test images."""
    n = points * tests / 100
    if n != n.to_integral_value():
        raise ValueError(f"{points} points of {tests} images is no whole number of images")
    return int(n)


def nb_sizes(data: Data) -> dict:
    run = nb(data, "iid", "fedavg")[0]
    train = data.train_images(run)
    parties = hyper(run, "num_clients")
    return {"train": train, "parties": parties, "party": train // parties, "test": held_out_images(run, train),
            "B": hyper(run, "batch_size"), "E": hyper(run, "local_epochs")}


def sci(x) -> str:
    """A power of ten's multiple as the doc writes it: 1e-5."""
    mantissa, exponent = f"{float(x):e}".split("e")
    return f"{fmt(mantissa, 0) if float(mantissa).is_integer() else mantissa.rstrip('0')}e{int(exponent)}"


@claim("niidbench.setting", NB, "FedAvg, FedProx (mu = {mu}), SCAFFOLD and FedNova under p_k ~ Dir(0.5), #C=1, #C=2, "
       "#C=3 and IID, with the presets of `conf/experiment/niidbench/` (the simple CNN, {parties} parties all in every "
       "round, {rounds} rounds, E = {E}, B = {B}, SGD lr {lr} with momentum {momentum} and weight decay {wd};")
def _(data):
    """The settings every run of the grid shares (config.yaml: one value each over the 60 runs),
    and FedProx's mu."""
    runs = [r for p in PARTITIONS for m in METHODS for r in nb(data, p, m)]
    keys = ("num_clients", "client_fraction", "rounds", "local_epochs", "batch_size", "lr", "momentum", "weight_decay")
    values = {}
    for key in keys:
        seen = {hyper(r, key) for r in runs}
        if len(seen) != 1:
            raise ValueError(f"the grid's runs differ in hyperparams.{key}: {sorted(map(str, seen))}")
        values[key] = seen.pop()
    models = {current_target((r.config.get("model") or {}).get("_target_")) for r in runs}  # old layouts too
    mus = {aggregator(r, "mu") for p in PARTITIONS for r in nb(data, p, "fedprox")}
    if models != {"fedrun.models.nets.SimpleCNN"} or values["client_fraction"] != 1.0 or len(mus) != 1:
        raise ValueError(f"the grid's models {models}, client_fraction {values['client_fraction']}, FedProx mu {mus}")
    return {"mu": mus.pop(), "parties": values["num_clients"], "rounds": values["rounds"], "E": values["local_epochs"],
            "B": values["batch_size"], "lr": values["lr"], "momentum": values["momentum"],
            "wd": sci(values["weight_decay"])}


@claim("niidbench.data", NB, "{train} images to train ({party} a party, so {batches} batches an epoch and {steps} "
       "local steps a round, where the whole MNIST gives about {whole} on average) and {test} held out as the test set")
def _(data):
    """The IID runs' data: training images (partition.csv), per party, batches of B an epoch, the
    local steps every party takes a round (clients.csv, all seeds: one value), what the whole
    MNIST (60,000 images) gives with as many parties, and the held-out test images."""
    size = nb_sizes(data)
    steps = {int(s) for r in nb(data, "iid", "fedavg") for s in data.clients(r)["steps"]}
    if len(steps) != 1:
        raise ValueError(f"the IID parties take different numbers of steps: {sorted(steps)}")
    whole = math.ceil(MNIST_TRAIN / size["parties"] / size["B"]) * size["E"]
    return {"train": thousands(size["train"]), "party": thousands(size["party"]),
            "batches": math.ceil(size["party"] / size["B"]),
            "steps": steps.pop(), "whole": whole, "test": thousands(size["test"])}


@claim("niidbench.command", NB, "({n} runs; a finished run took {lo} to {hi} minutes")
def _(data):
    """How many runs the grid holds (finished and diverged) and the range of a finished run's time
    in its rounds (summary.json's round_seconds, the sum of rounds.csv's wall_s), in minutes."""
    runs = [r for p in PARTITIONS for m in METHODS for r in nb(data, p, m)]
    minutes = [dec(r.summary["round_seconds"]) / 60 for r in runs if r.finished]
    return {"n": len(runs), "lo": fmt(min(minutes), 0), "hi": fmt(max(minutes), 0)}


@claim("niidbench.paper_cells", NB, "`scripts/paper_targets/niidbench_table3_accuracy.csv` lists its {n} cells {empty}")
def _(data):
    """The transcription of the paper's Table III: how many cells it lists, and that none has a number."""
    with open(data.root / "scripts" / "paper_targets" / "niidbench_table3_accuracy.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    filled = sum(bool(r["accuracy_pct"].strip()) for r in rows)
    return {"n": len(rows), "empty": "empty" if not filled else f"with {filled} filled"}


@claim("niidbench.iid_spread", NB, "in each seed the four methods end within {spread} points of each other")
def _(data):
    """IID: the largest spread (best minus worst final accuracy) of the four methods in one seed."""
    spreads = []
    for i in range(len(SEEDS)):
        values = [finals(data, "iid", m)[i] for m in METHODS]
        spreads.append(max(values) - min(values))
    return {"spread": exact(max(spreads))}


@claim("niidbench.iid_fednova_is_fedavg", NB, "FedNova's runs are {same} to the last digit of every `rounds.csv` "
       "column but the timings")
def _(data):
    """IID: FedNova's rounds.csv equals FedAvg's, seed by seed, in every column but the timings
    (equal parties take equal steps, where FedNova is FedAvg)."""
    same = True
    for a, b in zip(nb(data, "iid", "fednova"), nb(data, "iid", "fedavg")):
        x, y = (data.rounds(r).drop(columns=list(TIMINGS)) for r in (a, b))
        same = same and list(x.columns) == list(y.columns) and x.equals(y)
    return {"same": "FedAvg's" if same else "NOT FedAvg's"}


@claim("niidbench.iid_scaffold", NB, "SCAFFOLD ends highest in {where}, by {lo} to {hi} points ({ilo} to {ihi} "
       "test images)")
def _(data):
    """IID: in how many seeds SCAFFOLD's final accuracy is above the other three's, by how much
    (points and test images of the 2,000)."""
    leads = seed_leads(data, "iid", "scaffold")
    tests = nb_sizes(data)["test"]
    ahead = sum(v > 0 for v in leads)
    return {"where": "each seed" if ahead == len(leads) else f"{ahead} of {len(leads)} seeds",
            "lo": exact(min(leads)), "hi": exact(max(leads)),
            "ilo": images(min(leads), tests), "ihi": images(max(leads), tests)}


@claim("niidbench.iid_flower", NB, "The gap to Flower's whole-MNIST run is {lo} to {hi} points, as under Dir(0.5)")
def _(data):
    """IID: Flower's one run minus our mean final accuracy, the range over the four methods."""
    gaps = flower_gaps(data, "iid")
    return {"lo": fmt(min(gaps)), "hi": fmt(max(gaps))}


@claim("niidbench.dir05_spread", NB, "the four methods are within {bound} of each other")
def _(data):
    """Dir(0.5): the four methods' final accuracies in one seed lie within a point (the largest
    spread over the seeds)."""
    spread = max(max(v) - min(v) for v in zip(*(finals(data, "dir05", m) for m in METHODS)))
    return {"bound": "a point" if spread < 1 else f"{fmt(spread)} points"}


@claim("niidbench.dir05_scaffold", NB, "SCAFFOLD is ahead of the other three in {where}, but by {lo} to {hi} "
       "points over the next best ({ilo} to {ihi} of the {test} test images)")
def _(data):
    """Dir(0.5): SCAFFOLD's final accuracy beats the other three's in each seed; its lead over the
    next best (points and test images)."""
    leads = seed_leads(data, "dir05", "scaffold")
    tests = nb_sizes(data)["test"]
    ahead = sum(v > 0 for v in leads)
    return {"where": f"each of the {len(leads)} seeds" if ahead == len(leads) else f"{ahead} of {len(leads)} seeds",
            "lo": exact(min(leads)), "hi": exact(max(leads)), "ilo": images(min(leads), tests),
            "ihi": images(max(leads), tests), "test": thousands(tests)}


@claim("niidbench.dir05_flower", NB, "Every method is {lo} to {hi} points below Flower's run on the whole MNIST")
def _(data):
    """Dir(0.5): Flower's one run minus our mean final accuracy, the range over the four methods."""
    gaps = flower_gaps(data, "dir05")
    return {"lo": fmt(min(gaps)), "hi": fmt(max(gaps))}


@claim("niidbench.fewer_images", NB, "what {ratio} times fewer training images")
def _(data):
    """The whole MNIST's 60,000 training images over the runs' (partition.csv)."""
    return {"ratio": fmt(Decimal(MNIST_TRAIN) / nb_sizes(data)["train"])}


@claim("niidbench.c1", NB, "FedAvg, FedProx and FedNova end anywhere between {lo}% and {hi}% depending on the seed "
       "(standard deviations of {sdlo} to {sdhi} points); SCAFFOLD stays at chance ({clo}-{chi}%) in {n} seeds and "
       "diverges at round {r} in the third")
def _(data):
    """#C=1: the range of FedAvg's, FedProx's and FedNova's final accuracies over their 9 runs, the
    range of the three methods' standard deviations over seeds; SCAFFOLD's finished runs (their
    final accuracies) and the round its third run diverged at."""
    values = {m: finals(data, "c1", m) for m in ("fedavg", "fedprox", "fednova")}
    every = [v for vs in values.values() for v in vs]
    sds = [statistics.stdev(vs) for vs in values.values()]
    scaffold = nb(data, "c1", "scaffold")
    ended = [data.final(r) for r in scaffold if data.final(r) is not None]
    rounds = [diverged_at(r) for r in scaffold if diverged_at(r)]
    if len(rounds) != 1:
        raise ValueError(f"#C=1: {len(rounds)} SCAFFOLD runs diverged, the doc says one")
    return {"lo": fmt(min(every), 0), "hi": fmt(max(every), 0), "sdlo": fmt(min(sds), 0), "sdhi": fmt(max(sds), 0),
            "clo": fmt(min(ended), 0), "chi": fmt(max(ended), 0), "n": words(len(ended)), "r": rounds[0]}


@claim("niidbench.c1_flower", NB, "Flower's one run scatters the same way (FedAvg {a}%, FedProx {p}%)")
def _(data):
    """#C=1: Flower's FedAvg and FedProx (scripts/paper_targets/niidbench_reference_results.csv)."""
    ref = data.reference()
    return {"a": fmt(ref[("fedavg", "mnist", "c1")]), "p": fmt(ref[("fedprox", "mnist", "c1")])}


@claim("niidbench.c2_fedavg_fedprox", NB, "In #C=2 FedAvg is ahead of FedProx in {where} (by {lo} to {hi} points)")
def _(data):
    """#C=2: FedAvg's final accuracy minus FedProx's, seed by seed (in how many seeds it is ahead,
    and the range of the differences)."""
    diffs = [a - p for a, p in zip(finals(data, "c2", "fedavg"), finals(data, "c2", "fedprox"))]
    ahead = sum(d > 0 for d in diffs)
    return {"where": f"each of the {len(diffs)} seeds" if ahead == len(diffs) else f"{ahead} of {len(diffs)} seeds",
            "lo": fmt(min(diffs)), "hi": fmt(max(diffs))}


@claim("niidbench.fednova_seed0", NB, "(FedNova's seed 0 ends at {c2}% under #C=2 and {c3}% under #C=3, after best "
       "rounds of {b2}% and {b3}%)")
def _(data):
    """FedNova, seed 0: its final and best accuracy under #C=2 and #C=3 (the last round's swing)."""
    c2, c3 = nb(data, "c2", "fednova")[0], nb(data, "c3", "fednova")[0]
    return {"c2": exact(data.final(c2)), "c3": exact(data.final(c3)), "b2": exact(data.best(c2)),
            "b3": exact(data.best(c3))}


@claim("niidbench.flower_gap_skew", NB, "{dlo} to {dhi} points under Dir(0.5), {c3lo} to {c3hi} under #C=3, {c2lo} to "
       "{c2hi} under #C=2")
def _(data):
    """Flower's one run minus our mean final accuracy, the range over the methods (those with a
    finished run), under Dir(0.5), #C=3 and #C=2."""
    out = {}
    for key, partition in (("d", "dir05"), ("c3", "c3"), ("c2", "c2")):
        gaps = flower_gaps(data, partition)
        out.update({f"{key}lo": fmt(min(gaps)), f"{key}hi": fmt(max(gaps))})
    return out


@claim("niidbench.party_size", NB, "Fewer images a party ({party} instead of about {whole})")
def _(data):
    """Training images per party here (partition.csv) and with the whole MNIST's 60,000."""
    size = nb_sizes(data)
    return {"party": thousands(size["party"]), "whole": thousands(MNIST_TRAIN // size["parties"])}


@claim("niidbench.scaffold_diverges", NB, "in {k2} of {n2} seeds under #C=2 (rounds {r2}) and in {k3} of {n3} under "
       "#C=3 (round {r3}; the other two end at {a}% and {b}%)")
def _(data):
    """SCAFFOLD under #C=2 and #C=3: how many seeds diverged and at which rounds (run.json), and
    the final accuracies of the #C=3 runs that did not."""
    out = {}
    for key, partition in (("2", "c2"), ("3", "c3")):
        runs = nb(data, partition, "scaffold")
        rounds = [str(diverged_at(r)) for r in runs if diverged_at(r)]
        out.update({f"k{key}": len(rounds), f"n{key}": len(runs), f"r{key}": ", ".join(rounds)})
    ended = [v for v in finals(data, "c3", "scaffold") if v is not None]
    if len(ended) != 2:
        raise ValueError(f"#C=3: {len(ended)} SCAFFOLD runs finished, the doc names two")
    return {**out, "a": exact(ended[0]), "b": exact(ended[1])}


@claim("niidbench.flower_scaffold", NB, "Flower's MNIST run does not ({c2}%, {c3}%; on FashionMNIST #C=2 its "
       "SCAFFOLD ends at chance, {f}%)")
def _(data):
    """Flower's SCAFFOLD on MNIST #C=2 and #C=3 and on FashionMNIST #C=2 (the reference CSV)."""
    ref = data.reference()
    return {"c2": fmt(ref[("scaffold", "mnist", "c2")]), "c3": fmt(ref[("scaffold", "mnist", "c3")]),
            "f": fmt(ref[("scaffold", "fmnist", "c2")])}


# ----------------------------------------------------------------------------- NIID-Bench readings

NR = "niidbench_readings"


def readings(data: Data, folder: str, method: str, max_train: int | None = None) -> list[Run]:
    return [data.run(f"niidbench_readings/{folder}", method, s, max_train=max_train) for s in SEEDS]


@claim("readings.mnist_half", NR, "(`dataset.max_train={max_train}`, {party} images a party) lowers the best round's "
       "accuracy in {where} ({h0}, {h1}, {h2}% against {f0}, {f1}, {f2}%) and the final mean from {fm}% to {hm}% "
       "(seed by seed {hs0}, {hs1}, {hs2} against {fs0}, {fs1}, {fs2})")
def _(data):
    """FedAvg under #C=2 with half of the training images (max_train=4000) against the grid's:
    the best round's accuracy seed by seed (in how many seeds it is lower) and the final
    accuracy, each seed and the mean over seeds."""
    half, full = readings(data, "mnist_c2_train4000", "fedavg", 4000), nb(data, "c2", "fedavg")
    hb, fb = [data.best(r) for r in half], [data.best(r) for r in full]
    hf, ff = [data.final(r) for r in half], [data.final(r) for r in full]
    lower = sum(h < f for h, f in zip(hb, fb))
    max_train = (half[0].config.get("dataset") or {}).get("max_train")
    out = {"max_train": max_train, "party": thousands(data.train_images(half[0]) // hyper(half[0], "num_clients")),
           "where": "each seed" if lower == len(hb) else f"{lower} of {len(hb)} seeds",
           "fm": fmt(mean(ff)), "hm": fmt(mean(hf))}
    for i in range(len(SEEDS)):
        out.update({f"h{i}": exact(hb[i]), f"f{i}": exact(fb[i]), f"hs{i}": exact(hf[i]), f"fs{i}": exact(ff[i])})
    return out


@claim("readings.fmnist_size", NR, "the full training set against its first {n8k} images ({pfull} against {p8k} a "
       "party, the same 10,000 test images), seeds 0 and 1: final {f0}% and {f1}% against {e0}% and {e1}% ({d0} and "
       "{d1} points lower), best rounds {b0}% and {b1}% against {c0}% and {c1}%; Flower's one whole-data run: {fl}%")
def _(data):
    """FedAvg on FashionMNIST #C=2, the whole training set against its first 8,000 images, seeds 0
    and 1: training images per party (partition.csv), final and best accuracy, the drop of the
    final accuracy seed by seed, and Flower's one run (the reference CSV)."""
    name = "niidbench_readings/fmnist_c2_size"
    full, small = [], []
    for r in data.runs(name, "fedavg"):
        (small if (r.config.get("dataset") or {}).get("max_train") else full).append(r)
    full.sort(key=lambda r: r.seed)
    small.sort(key=lambda r: r.seed)
    if [r.seed for r in full] != [0, 1] or [r.seed for r in small] != [0, 1]:
        raise ValueError(f"{name}: expected seeds 0 and 1 of both sizes")
    parties = hyper(full[0], "num_clients")
    out = {"n8k": thousands(data.train_images(small[0])), "pfull": thousands(data.train_images(full[0]) // parties),
           "p8k": thousands(data.train_images(small[0]) // parties),
           "fl": fmt(data.reference()[("fedavg", "fmnist", "c2")])}
    for i in range(2):
        out.update({f"f{i}": fmt(data.final(full[i])), f"e{i}": fmt(data.final(small[i])),
                    f"d{i}": fmt(data.final(full[i]) - data.final(small[i])),
                    f"b{i}": fmt(data.best(full[i])), f"c{i}": fmt(data.best(small[i]))})
    return out


@claim("readings.fmnist_apart", NR, "two seeds of the whole FashionMNIST end {d} points apart")
def _(data):
    """The whole FashionMNIST's two FedAvg runs (#C=2): the difference of their final accuracies."""
    full = [r for r in data.runs("niidbench_readings/fmnist_c2_size", "fedavg")
            if not (r.config.get("dataset") or {}).get("max_train")]
    values = [data.final(r) for r in full]
    return {"d": fmt(max(values) - min(values))}


@claim("readings.fmnist_minutes", NR, "the whole FashionMNIST's two #C=2 FedAvg runs took {a} and {b} minutes")
def _(data):
    """The whole FashionMNIST's two FedAvg runs (#C=2): each run's wall time (the sum of rounds.csv's
    wall_s over its 50 rounds) in whole minutes, shortest first; what a whole-data NIID-Bench run
    costs on the CPU."""
    full = [r for r in data.runs("niidbench_readings/fmnist_c2_size", "fedavg")
            if not (r.config.get("dataset") or {}).get("max_train")]
    minutes = sorted(sum(float(w) for w in read_rounds(r.path)["wall_s"]) / 60 for r in full)
    return {"a": fmt(dec(minutes[0]), 0), "b": fmt(dec(minutes[1]), 0)}


def seed_cells(data: Data, runs: list[Run]) -> dict:
    """A table row's cells, seed by seed: ``diverged at t`` or the final accuracy (exact) in %."""
    return {f"s{i}": f"diverged at {diverged_at(r)}" if diverged_at(r) else f"{exact(data.final(r))}%"
            for i, r in enumerate(runs)}


ROW = "| {s0} | {s1} | {s2} |"


@claim("readings.scaffold_gradient", NR, "| momentum 0.9, correction through the optimizer (`correction=gradient`, the "
       "preset) " + ROW)
def _(data):
    """SCAFFOLD under #C=2 with the preset's correction: each seed's divergence round or final accuracy."""
    return seed_cells(data, nb(data, "c2", "scaffold"))


@claim("readings.scaffold_after_step", NR, "| momentum 0.9, correction after each step (`correction=after_step`, "
       "NIID-Bench's code) " + ROW)
def _(data):
    """SCAFFOLD under #C=2 with correction=after_step: each seed's divergence round or final accuracy."""
    runs = readings(data, "mnist_c2_after_step", "scaffold")
    if any((r.config.get("aggregator") or {}).get("correction") != "after_step" for r in runs):
        raise ValueError("mnist_c2_after_step: a run without correction=after_step")
    return seed_cells(data, runs)


@claim("readings.scaffold_momentum0", NR, "| momentum 0 (plain SGD: both readings are one) " + ROW)
def _(data):
    """SCAFFOLD under #C=2 with momentum 0: each seed's final accuracy (or divergence round)."""
    runs = readings(data, "mnist_c2_momentum0", "scaffold")
    if any(hyper(r, "momentum") != 0 for r in runs):
        raise ValueError("mnist_c2_momentum0: a run with momentum")
    return seed_cells(data, runs)


@claim("readings.fedavg_momentum0", NR, "| FedAvg, momentum 0 (for comparison) " + ROW)
def _(data):
    """FedAvg under #C=2 with momentum 0: each seed's final accuracy."""
    return seed_cells(data, readings(data, "mnist_c2_momentum0", "fedavg"))


@claim("readings.c1_after_step", NR, "`correction=after_step` also ends at chance or diverges ({a}% and {b}%; seed "
       "{s} diverged at round {r})")
def _(data):
    """SCAFFOLD under #C=1 with correction=after_step: the finished seeds' final accuracies and the
    seed and round that diverged."""
    runs = readings(data, "mnist_c1_after_step", "scaffold")
    ended = [data.final(r) for r in runs if not diverged_at(r)]
    gone = [(r.seed, diverged_at(r)) for r in runs if diverged_at(r)]
    if len(ended) != 2 or len(gone) != 1:
        raise ValueError(f"mnist_c1_after_step: {len(ended)} finished and {len(gone)} diverged, the doc says 2 and 1")
    return {"a": fmt(ended[0]), "b": fmt(ended[1]), "s": gone[0][0], "r": gone[0][1]}


@claim("readings.momentum0_lower", NR, "It then ends lower ({slo} to {shi}%, against FedAvg's {flo} to {fhi}% with "
       "momentum), and so does FedAvg without momentum ({alo} to {ahi}%)")
def _(data):
    """#C=2: the range over seeds of the final accuracy of SCAFFOLD without momentum, of FedAvg
    with momentum (the grid) and of FedAvg without momentum."""
    s = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "scaffold")]
    f = finals(data, "c2", "fedavg")
    a = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "fedavg")]
    return {"slo": exact(min(s)), "shi": exact(max(s)), "flo": exact(min(f)), "fhi": exact(max(f)),
            "alo": exact(min(a)), "ahi": exact(max(a))}


@claim("readings.scaffold_vs_fedavg_momentum0", NR, "({ahead}, {behind})")
def _(data):
    """#C=2 without momentum: SCAFFOLD's final accuracy minus FedAvg's, seed by seed (the seeds it
    is ahead in and behind in, and by how much)."""
    s = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "scaffold")]
    a = [data.final(r) for r in readings(data, "mnist_c2_momentum0", "fedavg")]
    diffs = [x - y for x, y in zip(s, a)]

    def part(word, which):
        seeds = [i for i, d in enumerate(diffs) if which(d)]
        if not seeds:
            return f"{word} in no seed"
        label = "seeds" if len(seeds) > 1 else "seed"
        return (f"{word} in {label} {joined(str(SEEDS[i]) for i in seeds)} by "
                f"{joined(exact(abs(diffs[i])) for i in seeds)}")
    ahead = part("ahead", lambda d: d > 0) + " points"
    return {"ahead": ahead, "behind": part("behind", lambda d: d < 0)}


@claim("readings.steps", NR, "(about {whole} local steps a round instead of {steps})")
def _(data):
    """The local steps a party takes a round with the whole MNIST (60,000 images over the parties,
    batches of B, E epochs) and here (clients.csv of the IID runs)."""
    size = nb_sizes(data)
    steps = {int(s) for r in nb(data, "iid", "fedavg") for s in data.clients(r)["steps"]}
    return {"whole": math.ceil(MNIST_TRAIN / size["parties"] / size["B"]) * size["E"], "steps": joined(map(str, steps))}


# ----------------------------------------------------------------------------- FedNova with stragglers

FN = "fednova_stragglers"
# The rows of the table: (label, folder, method).
FEDNOVA_ROWS = (("FedAvg, all E epochs", "niidbench/mnist_dir05", "fedavg"),
                ("FedNova, all E epochs", "niidbench/mnist_dir05", "fednova"),
                ("FedAvg, epochs drawn in [1, 10]", "niidbench_readings/mnist_dir05_stragglers", "fedavg"),
                ("FedNova, epochs drawn in [1, 10]", "niidbench_readings/mnist_dir05_stragglers", "fednova"),
                ("FedAvg, epochs drawn, momentum 0", "niidbench_readings/mnist_dir05_stragglers_momentum0", "fedavg"),
                ("FedNova, epochs drawn, momentum 0", "niidbench_readings/mnist_dir05_stragglers_momentum0", "fednova"))


def drawn(data: Data, method: str, momentum0: bool = False) -> list[Run]:
    folder = "mnist_dir05_stragglers" + ("_momentum0" if momentum0 else "")
    return [data.run(f"niidbench_readings/{folder}", method, s, 1.0) for s in SEEDS]


def a_norm(steps: int, rho) -> Decimal:
    """FedNova's ``||a_k||_1`` for ``steps`` local steps of SGD with momentum ``rho``:
    ``sum_{j=1..steps} (1 - rho^j) / (1 - rho)`` (the step count for rho = 0)."""
    rho = dec(rho)
    if rho == 0:
        return Decimal(steps)
    return sum(((1 - rho ** j) / (1 - rho) for j in range(1, steps + 1)), Decimal(0))


def round_one(data: Data, fednova: Run, fedavg: Run) -> dict:
    """Round 1 of a FedNova run and its FedAvg twin: the one-epoch and the ten-epoch client's steps,
    ``||a_k||_1`` and weights, checked against FedNova's rule ``q_k = tau_eff p_k / ||a_k||_1`` (p_k:
    FedAvg's weights)."""
    nova, avg = (data.clients(r) for r in (fednova, fedavg))
    nova, avg = nova[nova["round"] == 1].set_index("client"), avg[avg["round"] == 1].set_index("client")
    rho = hyper(fednova, "momentum")
    a = {k: a_norm(int(nova.at[k, "steps"]), rho) for k in nova.index}
    p = {k: dec(avg.at[k, "weight"]) for k in nova.index}
    tau = sum((p[k] * a[k] for k in a), Decimal(0))
    for k in a:  # the weights clients.csv holds are the rule's, to its 8 significant digits
        if abs(tau * p[k] / a[k] - dec(nova.at[k, "weight"])) > Decimal("1e-6") * tau * p[k] / a[k]:
            raise ValueError(f"{fednova.path}: client {k}'s weight is not tau_eff p_k / ||a_k||_1")
    out = {}
    for epochs in (1, 10):
        ks = [k for k in nova.index if int(nova.at[k, "epochs"]) == epochs]
        if len(ks) != 1:
            raise ValueError(f"{fednova.path}: {len(ks)} clients of {epochs} epochs in round 1, the doc names one")
        k = ks[0]
        out[epochs] = {"steps": int(nova.at[k, "steps"]), "a": a[k], "q": dec(nova.at[k, "weight"]), "p": p[k]}
    return out


def weight_sums(data: Data, runs: list[Run]) -> list[Decimal]:
    """Each round's sum of the clients' weights, over the runs."""
    return [sum((dec(w) for w in weights), Decimal(0)) for r in runs
            for _, weights in data.clients(r).groupby("round")["weight"]]


def fednova_finals(data: Data, folder: str, method: str) -> dict:
    stragglers_ = 0.0 if folder.startswith("niidbench/") else 1.0
    return {"finals": ", ".join(exact(data.final(data.run(folder, method, s, stragglers_))) for s in SEEDS)}


# readings.py prints the other columns of the table (rounds to 95%, their mean, the accuracy after
# round 10); the final accuracy seed by seed, the last column, is no script's.
for _label, _folder, _method in FEDNOVA_ROWS:
    def _row(data, _folder=_folder, _method=_method):
        """The last cell of a row of the FedNova table: each seed's final accuracy, exact."""
        return fednova_finals(data, _folder, _method)
    claim(f"fednova.finals.{_method}_{'all' if _folder.startswith('niidbench/') else 'drawn'}"
          f"{'_momentum0' if _folder.endswith('momentum0') else ''}", FN,
          "| {finals} |")(_row)


@claim("fednova.dir05_steps", FN, "the parties' sizes already differ ({lo} to {hi} local steps a round), and FedNova "
       "and FedAvg end {level}")
def _(data):
    """Dir(0.5), all E epochs: the fewest and most local steps a party takes a round (clients.csv,
    FedAvg's three seeds); FedNova's and FedAvg's mean final accuracy less than 0.1 points apart."""
    steps = [int(s) for r in nb(data, "dir05", "fedavg") for s in data.clients(r)["steps"]]
    nova, avg = cell_mean(data, "dir05", "fednova"), cell_mean(data, "dir05", "fedavg")
    return {"lo": min(steps), "hi": max(steps),
            "level": "level" if abs(nova - avg) < Decimal("0.1") else f"{fmt(abs(nova - avg))} points apart"}


@claim("fednova.unstable", FN, "in seed 1 its accuracy swings between {lo}% and {hi}% from round 5 to round 30, its "
       "server step (`server_step`, up to {ss}) is several times FedAvg's (at most {fa}), and it ends {side} FedAvg "
       "in {where} (by {d0}, {d1} and {d2} points)")
def _(data):
    """Epochs drawn, momentum 0.9: FedNova's seed 1, its lowest and highest accuracy from round 5 to
    30 and its largest server step, against FedAvg's largest in seed 1; FedAvg's final accuracy
    minus FedNova's, seed by seed."""
    nova, avg = drawn(data, "fednova"), drawn(data, "fedavg")
    span = [v for t, v in data.curve(nova[1]).items() if 5 <= t <= 30]
    diffs = [data.final(a) - data.final(n) for a, n in zip(avg, nova)]
    below = sum(d > 0 for d in diffs)
    return {"lo": exact(min(span)), "hi": exact(max(span)), "ss": fmt(data.rounds(nova[1])["server_step"].max()),
            "fa": fmt(data.rounds(avg[1])["server_step"].max()), "side": "below" if below else "above",
            "where": "each seed" if below in (0, len(diffs)) else f"{below} of {len(diffs)} seeds",
            **{f"d{i}": exact(abs(d)) for i, d in enumerate(diffs)}}


@claim("fednova.a_norms", FN, "a client of one epoch ({s1} steps) has `||a_k||_1 = {a1}` and one of ten epochs "
       "({s10} steps) {a10}, {ratio} times as much")
def _(data):
    """Round 1 of seed 0 (epochs drawn, momentum 0.9): the one-epoch and the ten-epoch client's
    steps and ``||a_k||_1`` (from the steps and the momentum, checked against the weights in
    clients.csv), and their ratio."""
    one = round_one(data, drawn(data, "fednova")[0], drawn(data, "fedavg")[0])
    return {"s1": one[1]["steps"], "a1": fmt(one[1]["a"]), "s10": one[10]["steps"], "a10": fmt(one[10]["a"], 0),
            "ratio": fmt(one[10]["a"] / one[1]["a"], 0)}


@claim("fednova.weights", FN, "(round 1 of seed 0: {q1} for the one-epoch client, against FedAvg's {p1}; {q10} for "
       "the ten-epoch client, against {p10}) sum to {lo} to {hi} a round")
def _(data):
    """Epochs drawn, momentum 0.9: the one-epoch and ten-epoch client's weights in round 1 of seed 0
    (FedNova's and FedAvg's, clients.csv), and the range over rounds and seeds of the sum of
    FedNova's weights."""
    one = round_one(data, drawn(data, "fednova")[0], drawn(data, "fedavg")[0])
    sums = weight_sums(data, drawn(data, "fednova"))
    return {"q1": fmt(one[1]["q"], 2), "p1": exact(one[1]["p"], 4), "q10": fmt(one[10]["q"], 3),
            "p10": fmt(one[10]["p"], 3), "lo": fmt(min(sums), 2), "hi": fmt(max(sums), 2)}


@claim("fednova.momentum0", FN, "`||a_k||_1` is the step count, the short and long clients differ {r0}-fold instead "
       "of {r}-fold, and FedNova is stable: its weights sum to {lo} to {hi} a round, its largest server step {eq} "
       "FedAvg's ({ss}), and it ends {side} FedAvg in {where} (by {d0}, {d1} and {d2} points)")
def _(data):
    """Epochs drawn, momentum 0: the ratio of the ten-epoch to the one-epoch client's ``||a_k||_1``
    in round 1 of seed 0 (against momentum 0.9's), the range of the sum of FedNova's weights a
    round, both methods' largest server step (two decimals), and FedNova's final accuracy minus
    FedAvg's, seed by seed."""
    m0 = round_one(data, drawn(data, "fednova", True)[0], drawn(data, "fedavg", True)[0])
    m9 = round_one(data, drawn(data, "fednova")[0], drawn(data, "fedavg")[0])
    nova, avg = drawn(data, "fednova", True), drawn(data, "fedavg", True)
    sums = weight_sums(data, nova)
    ss_nova = fmt(max(data.rounds(r)["server_step"].max() for r in nova), 2)
    ss_avg = fmt(max(data.rounds(r)["server_step"].max() for r in avg), 2)
    diffs = [data.final(n) - data.final(a) for n, a in zip(nova, avg)]
    ahead = sum(d > 0 for d in diffs)
    return {"r0": fmt(m0[10]["a"] / m0[1]["a"], 0), "r": fmt(m9[10]["a"] / m9[1]["a"], 0),
            "lo": fmt(min(sums), 2), "hi": fmt(max(sums), 2),
            "eq": "equals" if ss_nova == ss_avg else f"({ss_nova}) differs from", "ss": ss_avg,
            "side": "ahead of" if ahead else "behind",
            "where": "each seed" if ahead in (0, len(diffs)) else f"{ahead} of {len(diffs)} seeds",
            **{f"d{i}": exact(abs(d)) for i, d in enumerate(diffs)}}


@claim("fednova.momentum0_95", FN, "{who} reaches {target}% in {rounds} rounds at lr {lr} without momentum")
def _(data):
    """Epochs drawn, momentum 0: whether FedAvg or FedNova reaches 95% test accuracy in any round."""
    runs = drawn(data, "fedavg", True) + drawn(data, "fednova", True)
    reached = [r for r in runs if max(data.curve(r).values()) >= 95]
    rounds = {hyper(r, "rounds") for r in runs}
    lrs = {hyper(r, "lr") for r in runs}
    if len(rounds) != 1 or len(lrs) != 1:
        raise ValueError("the momentum-0 runs differ in rounds or lr")
    return {"who": "neither" if not reached else "one", "target": 95, "rounds": rounds.pop(), "lr": lrs.pop()}


# ============================================================================= FedLap

LF = "fedlap_fmnist"
LR = "fedlap_readings"
LM = "fedlap_mnist_train10k"
FRACTIONS = (0.0, 0.5, 0.9)
BASELINES = ("fedprox", "fedavg")
T = 20  # the rounds of the claim "in the first 20 communication rounds"


def fedlap_cells(data: Data, folder: str) -> dict[tuple[str, float], list[Run]]:
    """``{(method, stragglers): [runs in seed order]}`` under ``fedlap/<folder>``."""
    out: dict[tuple[str, float], list[Run]] = {}
    for (m, seed, s, _n), run in sorted(data.index(f"fedlap/{folder}").items(), key=lambda kv: (kv[0][1], str(kv[0]))):
        out.setdefault((m, s), []).append(run)
    return out


def seed_means(data: Data, runs: list[Run]) -> list[Decimal]:
    return [data.mean_to(r, T) for r in runs]


def ahead_of_both(data: Data, lap: list[Run], others: list[list[Run]]) -> tuple[int, int]:
    """(seeds in which FedLap's mean over rounds 1-20 beats every other method's, seeds compared)."""
    by_seed = [{r.seed: data.mean_to(r, T) for r in runs} for runs in [lap, *others]]
    common = sorted(set.intersection(*(set(b) for b in by_seed)))
    ahead = sum(by_seed[0][s] > max(b[s] for b in by_seed[1:]) for s in common)
    return ahead, len(common)


@claim("fedlap.fmnist_ahead", LF, "its mean accuracy over rounds 1-20 beats both baselines in {k} of {n} (seed, "
       "fraction) pairs")
def _(data):
    """FashionMNIST presets: the (seed, straggler fraction) pairs in which FedLap's mean accuracy
    over rounds 1-20 beats both FedProx's and FedAvg's."""
    cells = fedlap_cells(data, "fmnist")
    k = n = 0
    for s in FRACTIONS:
        a, b = ahead_of_both(data, cells[("fedlap", s)], [cells[(m, s)] for m in BASELINES])
        k, n = k + a, n + b
    return {"k": k, "n": n}


def leads(data: Data, cells: dict, measure: Callable[[Run], Decimal]) -> list[Decimal]:
    """Per straggler fraction: FedLap's mean (over seeds) of ``measure`` minus the better of the
    baselines' means."""
    out = []
    for s in FRACTIONS:
        lap = mean(measure(r) for r in cells[("fedlap", s)])
        out.append(lap - max(mean(measure(r) for r in cells[(m, s)]) for m in BASELINES))
    return out


@claim("fedlap.fmnist_lead", LF, "By {lo} to {hi} points, not the paper's 3 to 5")
def _(data):
    """FashionMNIST presets: FedLap's mean over rounds 1-20 minus the better of FedProx's and
    FedAvg's (means over seeds), the range over the straggler fractions."""
    lead = leads(data, fedlap_cells(data, "fmnist"), lambda r: data.mean_to(r, T))
    return {"lo": fmt(min(lead)), "hi": fmt(max(lead))}


@claim("fedlap.fmnist_stragglers", LF, "the stragglers leave all three methods within {x} points of their mean "
       "accuracy over rounds 1-20 without stragglers")
def _(data):
    """FashionMNIST presets: the largest difference, over the methods and the 50% and 90% straggler
    fractions, between a method's mean over rounds 1-20 (mean over seeds) and its mean without
    stragglers."""
    cells = fedlap_cells(data, "fmnist")
    means = {key: mean(seed_means(data, runs)) for key, runs in cells.items()}
    x = max(abs(means[(m, s)] - means[(m, 0.0)]) for m in ("fedlap", *BASELINES) for s in FRACTIONS[1:])
    return {"x": fmt(x)}


@claim("fedlap.fmnist_round20", LF, "After round 20 alone the differences are {inside} the seeds' ranges (which span "
       "{lo} to {hi} points)")
def _(data):
    """FashionMNIST presets, accuracy after round 20: FedLap's lead over the better baseline (means
    over seeds) is smaller than every method's range over seeds at that fraction; the ranges'
    smallest and largest width."""
    cells = fedlap_cells(data, "fmnist")
    widths = {key: max(data.at(r, T) for r in runs) - min(data.at(r, T) for r in runs) for key, runs in cells.items()}
    lead = leads(data, cells, lambda r: data.at(r, T))
    inside = all(abs(lead[i]) < min(widths[(m, s)] for m in ("fedlap", *BASELINES)) for i, s in enumerate(FRACTIONS))
    return {"inside": "inside" if inside else "NOT inside", "lo": fmt(min(widths.values()), 0),
            "hi": fmt(max(widths.values()), 0)}


def client_means(data: Data, runs: list[Run], column: str, round_: int) -> Decimal:
    """The mean over ``runs`` of a round's mean of a clients.csv column over the clients that trained."""
    values = []
    for r in runs:
        df = data.clients(r)
        df = df[(df["round"] == round_) & (df["dropped"].fillna(0) == 0)]
        values.append(mean(dec(v) for v in df[column]))
    return mean(values)


@claim("fedlap.fmnist_lambda", LF, "the clients' mean dissimilarity lambda falls from {l1} in round 1 to {l20} in "
       "round 20, and the regularization term from {r1} to {r20} (FedProx's with mu = 1: {p1} to {p20})")
def _(data):
    """FashionMNIST presets, all straggler fractions and seeds: the mean over runs of a round's mean
    ``lambda_mean`` and ``reg_loss`` (clients.csv) in rounds 1 and 20, FedLap's and FedProx's."""
    cells = fedlap_cells(data, "fmnist")
    lap = [r for s in FRACTIONS for r in cells[("fedlap", s)]]
    prox = [r for s in FRACTIONS for r in cells[("fedprox", s)]]
    return {"l1": fmt(client_means(data, lap, "lambda_mean", 1), 3),
            "l20": fmt(client_means(data, lap, "lambda_mean", T), 3),
            "r1": fmt(client_means(data, lap, "reg_loss", 1), 3), "r20": fmt(client_means(data, lap, "reg_loss", T), 3),
            "p1": fmt(client_means(data, prox, "reg_loss", 1), 2),
            "p20": fmt(client_means(data, prox, "reg_loss", T), 2)}


# ----------------------------------------------------------------------------- FedLap readings

def reading_runs(data: Data) -> dict[str, list[Run]]:
    """The runs the readings table sets side by side (FashionMNIST, no stragglers unless named)."""
    preset = {s: fedlap_cells(data, f"preset/stragglers{s:g}") for s in FRACTIONS}
    return {"fedavg": preset[0.0][("fedavg", 0.0)],
            "previous_lap": preset[0.0][("fedlap", 0.0)], "previous_prox": preset[0.0][("fedprox", 0.0)],
            **{f"previous_lap_{s:g}": preset[s][("fedlap", s)] for s in FRACTIONS},
            **{f"previous_prox_{s:g}": preset[s][("fedprox", s)] for s in FRACTIONS},
            **{f"fedavg_{s:g}": preset[s][("fedavg", s)] for s in FRACTIONS},
            "L1": fedlap_cells(data, "readings/L1_q1")[("fedlap", 0.0)],
            "L2": fedlap_cells(data, "readings/L2_interpolate")[("fedlap", 0.0)],
            "L3": fedlap_cells(data, "readings/L3_fedprox_mu1")[("fedprox", 0.0)],
            "L4": fedlap_cells(data, "readings/L4_fan_in")[("fedlap", 0.0)]}


def reading_cells(data: Data, lap: list[Run], prox: list[Run], avg: list[Run]) -> tuple[str, str, str]:
    """A readings row: FedLap's and FedProx's mean over rounds 1-20 (%), and ``k of n`` seeds in
    which FedLap's beats both FedProx's and FedAvg's."""
    k, n = ahead_of_both(data, lap, [prox, avg])
    return (f"{fmt(mean(seed_means(data, lap)))}%", f"{fmt(mean(seed_means(data, prox)))}%", f"{k} of {n}")


def aggregator(run: Run, key: str):
    return (run.config.get("aggregator") or {}).get(key)


def require(runs: list[Run], what: str, **settings) -> None:
    """Refuse a readings row whose runs do not have the settings its label names."""
    for r in runs:
        for key, want in settings.items():
            have = aggregator(r, key)
            if have != want and not (isinstance(want, float) and have is not None and float(have) == want):
                raise ValueError(f"{r.path}: {what}: aggregator.{key} is {have!r}, the row says {want!r}")


@claim("fedlap.readings_fedavg", LR, "mean test accuracy over rounds 1-20 (FedAvg: {x}%)")
def _(data):
    """FashionMNIST without stragglers: FedAvg's mean over rounds 1-20 (mean over seeds)."""
    return {"x": fmt(mean(seed_means(data, reading_runs(data)["fedavg"])))}


READING_ROWS = {
    "previous": ("| FedLap `form=linear` q = 0.5 (c = q lambda: half of eq. 10), FedProx mu = 0.01 (the previous "
                 "presets) | {lap} | {prox} | {ahead} |", "previous_lap", "previous_prox",
                 {"form": "linear", "q": 0.5}, {"mu": 0.01}),
    "q1": ("| FedLap linear q = 1 (eq. 10 exactly as printed), FedProx mu = 1 | {lap} | {prox} | {ahead} |",
           "L1", "L3", {"form": "linear", "q": 1.0}, {"mu": 1.0}),
    "linear_mu1": ("| FedLap linear q = 0.5, FedProx mu = 1 | {lap} | {prox} | {ahead} |", "previous_lap", "L3",
                   {"form": "linear", "q": 0.5}, {"mu": 1.0}),
    "presets": ("| **FedLap `form=interpolate` q = 0.5 (c = q lambda^(1-q)), FedProx mu = 1 (the presets)** | {lap} | "
                "{prox} | {ahead} |", "L2", "L3", {"form": "interpolate", "q": 0.5}, {"mu": 1.0}),
    "fan_in": ("| FedLap interpolate, `vectors=fan_in` (rows of PyTorch's weight), FedProx mu = 1 | {lap} | {prox} | "
               "{ahead} |", "L4", "L3", {"form": "interpolate", "vectors": "fan_in"}, {"mu": 1.0}),
}

for _key, (_template, _lap, _prox, _lap_settings, _prox_settings) in READING_ROWS.items():
    def _reading(data, _lap=_lap, _prox=_prox, _lap_settings=_lap_settings, _prox_settings=_prox_settings):
        """A row of the readings table (FashionMNIST, no stragglers): FedLap's and FedProx's mean
        over rounds 1-20 (means over seeds) and the seeds in which FedLap's beats both FedProx's and
        FedAvg's; the runs' aggregator settings must be the row's."""
        runs = reading_runs(data)
        require(runs[_lap], "FedLap", **_lap_settings)
        require(runs[_prox], "FedProx", **_prox_settings)
        lap, prox, ahead = reading_cells(data, runs[_lap], runs[_prox], runs["fedavg"])
        return {"lap": lap, "prox": prox, "ahead": ahead}
    claim(f"fedlap.readings_row.{_key}", LR, _template)(_reading)


@claim("fedlap.readings_row.previous_stragglers", LR, "| the same at 50% / 90% stragglers | {lap5} / {lap9} | "
       "{prox5} / {prox9} | {a5} / {a9} |")
def _(data):
    """The previous presets (FedLap linear q = 0.5, FedProx mu = 0.01) at 50% and 90% stragglers:
    FedLap's and FedProx's mean over rounds 1-20 and the seeds in which FedLap's beats both."""
    runs = reading_runs(data)
    out = {}
    for s, key in ((0.5, "5"), (0.9, "9")):
        require(runs[f"previous_lap_{s:g}"], "FedLap", form="linear", q=0.5)
        require(runs[f"previous_prox_{s:g}"], "FedProx", mu=0.01)
        lap, prox, ahead = reading_cells(data, runs[f"previous_lap_{s:g}"], runs[f"previous_prox_{s:g}"],
                                         runs[f"fedavg_{s:g}"])
        out.update({f"lap{key}": lap, f"prox{key}": prox, f"a{key}": ahead})
    return out


@claim("fedlap.readings_spread", LR, "How FedLap's penalty is read changes its accuracy by {bound}")
def _(data):
    """Without stragglers: the range of FedLap's mean over rounds 1-20 (means over seeds) over the
    five readings of the table."""
    runs = reading_runs(data)
    values = [mean(seed_means(data, runs[k])) for k in ("previous_lap", "L1", "L2", "L4")]
    spread = max(values) - min(values)
    return {"bound": "less than a point" if spread < 1 else f"{fmt(spread)} points"}


@claim("fedlap.readings_lambda", LR, "its lambda is small ({lo} to {hi}, a round's mean over its clients)")
def _(data):
    """Without stragglers, FedLap's runs of the readings table: the smallest and largest of a
    round's mean ``lambda_mean`` over its clients (clients.csv)."""
    runs = reading_runs(data)
    values = []
    for key in ("previous_lap", "L1", "L2", "L4"):
        for r in runs[key]:
            df = data.clients(r)
            df = df[df["dropped"].fillna(0) == 0]
            values += [mean(dec(v) for v in g) for _, g in df.groupby("round")["lambda_mean"]]
    return {"lo": fmt(min(values), 3), "hi": fmt(max(values), 3)}


@claim("fedlap.readings_mu001", LR, "FedProx with mu = 0.01 (a value common in the FedProx literature) beats FedLap "
       "{where}")
def _(data):
    """The previous presets (FedProx mu = 0.01, FedLap linear q = 0.5): the (seed, straggler fraction)
    pairs in which FedProx's mean over rounds 1-20 beats FedLap's."""
    runs = reading_runs(data)
    wins = n = 0
    for s in FRACTIONS:
        prox = {r.seed: data.mean_to(r, T) for r in runs[f"previous_prox_{s:g}"]}
        lap = {r.seed: data.mean_to(r, T) for r in runs[f"previous_lap_{s:g}"]}
        wins += sum(prox[k] > lap[k] for k in lap)
        n += len(lap)
    return {"where": "in every seed, at every straggler fraction" if wins == n else
            f"in {wins} of {n} (seed, fraction) pairs"}


@claim("fedlap.readings_mu1", LR, "which trains more slowly early on ({x}% over rounds 1-20)")
def _(data):
    """FedProx with mu = 1 (the presets), no stragglers: its mean over rounds 1-20 (mean over seeds)."""
    runs = reading_runs(data)
    require(runs["L3"], "FedProx", mu=1.0)
    return {"x": fmt(mean(seed_means(data, runs["L3"])))}


@claim("fedlap.readings_paper_lead", LR, "The paper's 3-5 point lead is {verdict} by any reading tried (FedLap's "
       "largest lead over the better of FedProx and FedAvg: {x} points over rounds 1-20)")
def _(data):
    """Without stragglers: the largest, over the table's readings, of FedLap's mean over rounds
    1-20 minus the better of its row's FedProx's and FedAvg's (means over seeds)."""
    runs = reading_runs(data)
    best = Decimal("-Infinity")
    for _template, lap, prox, _a, _b in READING_ROWS.values():
        rival = max(mean(seed_means(data, runs[prox])), mean(seed_means(data, runs["fedavg"])))
        best = max(best, mean(seed_means(data, runs[lap])) - rival)
    return {"verdict": "not reached" if best < 3 else "reached", "x": fmt(best)}


@claim("fedlap.readings_same_runs", LR, "(the same runs as those in `outputs/reproductions/fedlap/fmnist`: {same})")
def _(data):
    """The readings L2_interpolate and L3_fedprox_mu1 against the FashionMNIST presets' FedLap and
    FedProx without stragglers: every CSV of each seed equal, but rounds.csv's timing columns."""
    runs = reading_runs(data)
    cells = fedlap_cells(data, "fmnist")
    same = True
    for key, method in (("L2", "fedlap"), ("L3", "fedprox")):
        for a, b in zip(runs[key], cells[(method, 0.0)]):
            if a.seed != b.seed:
                return {"same": f"NOT the same seeds ({a.path}, {b.path})"}
            for name in ("rounds.csv", "clients.csv", "layers.csv"):
                x, y = read_csv(a.path, name), read_csv(b.path, name)
                if name == "rounds.csv":
                    x, y = x.drop(columns=list(TIMINGS)), y.drop(columns=list(TIMINGS))
                same = same and list(x.columns) == list(y.columns) and x.equals(y)
    return {"same": "their CSVs agree in every column but `rounds.csv`'s timings" if same
            else "their CSVs DIFFER beyond the timings"}


# ----------------------------------------------------------------------------- FedLap on MNIST's first 10,000 images

@claim("fedlap.mnist_data", LM, "{train} training images cut into {shards} label-sorted shards of {size} (not the "
       "paper's 300), so each client holds {per} images; {test} held-out training images are the test set. {n} runs, "
       "{minutes} minutes of CPU")
def _(data):
    """The MNIST runs' data (partition.csv, the partition's shards a client, the split's test
    fraction), how many runs and their time in their rounds together (summary.json round_seconds)."""
    out = fedlap_data(data, "fedlap/mnist_train10k")
    return {**out, "test": thousands(held_out_images(data.runs("fedlap/mnist_train10k")[0], out["train_n"]))}


def fedlap_data(data: Data, folder: str) -> dict:
    """A FedLap MNIST folder's shards and data (partition.csv: every client the same size), how
    many runs, and their time in their rounds together (summary.json round_seconds), in minutes."""
    runs = data.runs(folder)
    run = runs[0]
    train = data.train_images(run)
    shards = hyper(run, "num_clients") * (run.config.get("partition") or {})["shards_per_client"]
    sizes = {int(v) for v in read_csv(run.path, "partition.csv")["examples"]}
    if len(sizes) != 1 or not all(r.finished for r in runs):
        raise ValueError(f"{folder}: clients of sizes {sorted(sizes)}, or an unfinished run")
    minutes = sum(dec(r.summary["round_seconds"]) for r in runs) / 60
    return {"train": thousands(train), "train_n": train, "shards": shards, "size": train // shards,
            "per": sizes.pop(), "n": len(runs), "minutes": fmt(minutes, 0)}


@claim("fedlap.mnist_fedavg", LM, "FedLap starts ahead of FedAvg ({lo} to {hi} points over rounds 1-20) and ends close "
       "to it ({elo} to {ehi} points {side} it after round 20)")
def _(data):
    """MNIST: FedLap's mean over rounds 1-20 minus FedAvg's, and its accuracy after round 20 minus
    FedAvg's (means over seeds), the range over the straggler fractions."""
    cells = fedlap_cells(data, "mnist_train10k")
    start = [mean(seed_means(data, cells[("fedlap", s)])) - mean(seed_means(data, cells[("fedavg", s)]))
             for s in FRACTIONS]
    end = [mean(data.at(r, T) for r in cells[("fedlap", s)]) - mean(data.at(r, T) for r in cells[("fedavg", s)])
           for s in FRACTIONS]
    if min(start) <= 0:
        raise ValueError("MNIST: FedLap does not start ahead of FedAvg at every fraction")
    side = "below" if max(end) < 0 else "above" if min(end) > 0 else "around"
    return {"lo": fmt(min(start)), "hi": fmt(max(start)), "elo": fmt(min(abs(e) for e in end)),
            "ehi": fmt(max(abs(e) for e in end)), "side": side}


@claim("fedlap.mnist_fedprox", LM, "here FedProx starts {side} FedLap (by {lo} to {hi} points over rounds 1-20, at "
       "{where}), where the paper has it behind, and with {per} images a client the stragglers change little (a "
       "method's mean over rounds 1-20 by at most {x} points)")
def _(data):
    """MNIST: FedProx's mean over rounds 1-20 minus FedLap's (means over seeds) at each straggler
    fraction; the largest change of a method's mean over rounds 1-20 with stragglers against
    without; the images a client holds (partition.csv)."""
    cells = fedlap_cells(data, "mnist_train10k")
    means = {key: mean(seed_means(data, runs)) for key, runs in cells.items()}
    diffs = [means[("fedprox", s)] - means[("fedlap", s)] for s in FRACTIONS]
    ahead = sum(d > 0 for d in diffs)
    change = max(abs(means[(m, s)] - means[(m, 0.0)]) for m in ("fedlap", *BASELINES) for s in FRACTIONS[1:])
    sizes = {int(v) for v in read_csv(cells[("fedlap", 0.0)][0].path, "partition.csv")["examples"]}
    return {"side": "ahead of" if ahead == len(diffs) else "behind" if ahead == 0 else "level with",
            "lo": fmt(min(abs(d) for d in diffs)), "hi": fmt(max(abs(d) for d in diffs)),
            "where": "every straggler fraction" if ahead in (0, len(diffs)) else f"{ahead} of {len(diffs)} fractions",
            "per": joined(map(str, sorted(sizes))), "x": fmt(change)}


# ----------------------------------------------------------------------------- FedLap, the whole MNIST

LW = "fedlap_mnist"


def signed_range(values: list[Decimal], above: str, below: str) -> str:
    """``0.6 to 0.8 points <above>`` when every value is positive, ``... <below>`` when every one
    is negative, else ``between -0.3 and 0.4 points from``."""
    if min(values) > 0 or max(values) < 0:
        side = above if min(values) > 0 else below
        return f"{fmt(min(abs(v) for v in values))} to {fmt(max(abs(v) for v in values))} points {side}"
    return f"between {fmt(min(values))} and {fmt(max(values))} points from"


@claim("fedlap_mnist.data", LW, "{train} training images cut into {shards} label-sorted shards of {size}, so each "
       "client holds {per} images, as the paper has it. {n} runs, {minutes} minutes of CPU")
def _(data):
    """The whole-MNIST FedLap runs' data (partition.csv: every client the same size; the shards a
    client), how many runs and their time in their rounds together (summary.json round_seconds)."""
    return fedlap_data(data, "fedlap/mnist")


def lw_fractions(cells: dict) -> list[float]:
    return sorted({s for (_m, s) in cells})


@claim("fedlap_mnist.rows", LW, "{rows}")
def _(data):
    """Whole MNIST, per straggler fraction: each method's accuracy after round 20 (mean over seeds
    [min-max]) / its mean over rounds 1-20 (mean over seeds), and the seeds in which FedLap's mean
    over rounds 1-20 beats both baselines."""
    cells = fedlap_cells(data, "mnist")
    rows = []
    for s in lw_fractions(cells):
        parts = []
        for m in ("fedlap", "fedprox", "fedavg"):
            at20 = [data.at(r, T) for r in cells[(m, s)]]
            parts.append(f"{fmt(mean(at20))}% [{fmt(min(at20))}-{fmt(max(at20))}] / "
                         f"{fmt(mean(seed_means(data, cells[(m, s)])))}%")
        k, n = ahead_of_both(data, cells[("fedlap", s)], [cells[(m, s)] for m in BASELINES])
        rows.append(f"| {fmt(100 * dec(s), 0)}% | {' | '.join(parts)} | {k} of {n} |")
    return {"rows": "\n".join(rows)}


@claim("fedlap_mnist.versus", LW, "Over rounds 1-20 FedLap is {avg} FedAvg and {prox} FedProx (mu = 1); after round "
       "20 it is {avg20} FedAvg and {prox20} FedProx")
def _(data):
    """Whole MNIST: FedLap's mean over rounds 1-20 minus each baseline's, and its accuracy after
    round 20 minus each baseline's (means over seeds), the range over the straggler fractions."""
    cells = fedlap_cells(data, "mnist")
    fr = lw_fractions(cells)
    mus = {float(aggregator(r, "mu")) for s in fr for r in cells[("fedprox", s)]}
    if mus != {1.0}:
        raise ValueError(f"FedProx's mu is {mus}, not the preset's 1")

    def diffs(m: str, measure) -> list[Decimal]:
        return [mean(measure(r) for r in cells[("fedlap", s)]) - mean(measure(r) for r in cells[(m, s)]) for s in fr]
    start = lambda r: data.mean_to(r, T)  # noqa: E731
    end = lambda r: data.at(r, T)  # noqa: E731
    return {"avg": signed_range(diffs("fedavg", start), "ahead of", "behind"),
            "prox": signed_range(diffs("fedprox", start), "ahead of", "behind"),
            "avg20": signed_range(diffs("fedavg", end), "ahead of", "behind"),
            "prox20": signed_range(diffs("fedprox", end), "ahead of", "behind")}


@claim("fedlap_mnist.ahead", LW, "FedLap's mean accuracy over rounds 1-20 beats both baselines in {k} of {n} (seed, "
       "fraction) pairs")
def _(data):
    """Whole MNIST: the (seed, straggler fraction) pairs in which FedLap's mean over rounds 1-20
    beats FedProx's and FedAvg's."""
    cells = fedlap_cells(data, "mnist")
    k = n = 0
    for s in lw_fractions(cells):
        a, b = ahead_of_both(data, cells[("fedlap", s)], [cells[(m, s)] for m in BASELINES])
        k, n = k + a, n + b
    return {"k": k, "n": n}


@claim("fedlap_mnist.stragglers", LW, "the stragglers move a method's mean over rounds 1-20 by at most {x} points")
def _(data):
    """Whole MNIST: the largest change of a method's mean over rounds 1-20 (mean over seeds) with
    stragglers against without."""
    cells = fedlap_cells(data, "mnist")
    fr = lw_fractions(cells)
    if fr[0] != 0.0 or len(fr) < 2:
        raise ValueError(f"straggler fractions {fr}")
    means = {key: mean(seed_means(data, runs)) for key, runs in cells.items()}
    return {"x": fmt(max(abs(means[(m, s)] - means[(m, 0.0)]) for m in ("fedlap", *BASELINES) for s in fr[1:]))}


# ----------------------------------------------------------------------------- command line

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="claims.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--section", nargs="+", choices=sections(), default=None, metavar="NAME",
                   help=f"the sections to print (default all: {', '.join(sections())})")
    p.add_argument("--root", default=str(ROOT), help="the repository root whose outputs/reproductions is read "
                                                     "(default: this checkout)")
    p.add_argument("--check", action="store_true", help="also say, for each claim, whether its text is in "
                                                        "docs/reproductions.md (exit 1 if one is not)")
    p.add_argument("--write", action="store_true",
                   help="first rewrite the claims docs/reproductions.md marks (<!-- claim ID --> ... <!-- end "
                        "claim -->: tables that fill as runs finish) from the runs, then --check")
    return p



# ----------------------------------------------------------------------------- FedLayerWise (the whole MNIST)

FLW = "fedlayerwise"
SCENARIOS = ("5iid_5noniid", "2iid_8noniid")
FLW_METHODS = ("fedlayerwise", "fedadp", "fedavg")
FLW_PAPER = {("fedlayerwise", "5iid_5noniid"): 11, ("fedlayerwise", "2iid_8noniid"): 12,
             ("fedadp", "5iid_5noniid"): 12, ("fedadp", "2iid_8noniid"): 21,
             ("fedavg", "5iid_5noniid"): 12, ("fedavg", "2iid_8noniid"): 25}  # Table I


def flw_runs(data: Data, scenario: str, method: str, folder: str = "table1") -> list[Run]:
    """The runs of ``method`` under ``fedlayerwise/<folder>/<scenario>``, in seed order."""
    return data.runs(f"fedlayerwise/{folder}/{scenario}", method)


def to_95(data: Data, run: Run) -> int | None:
    """The first round whose test accuracy is at least 95% (None: not within the run)."""
    return next((r for r, a in data.curve(run).items() if a >= 95), None)


def flw_mean_rounds(data: Data, scenario: str, method: str) -> Decimal:
    rounds = [to_95(data, r) for r in flw_runs(data, scenario, method)]
    if None in rounds:
        raise ValueError(f"{scenario} {method}: a run does not reach 95%")
    return mean(rounds)


@claim("flw.data", FLW, "seeds {seeds} in both scenarios")
def _(data):
    """Every Table I cell holds the same seeds, on the whole MNIST (60,000 training images to deal
    from, MNIST's 10,000 test images)."""
    seeds = {tuple(r.seed for r in flw_runs(data, s, m)) for s in SCENARIOS for m in FLW_METHODS}
    if len(seeds) != 1:
        raise ValueError(f"the cells hold different seeds: {seeds}")
    for s in SCENARIOS:
        for run in flw_runs(data, s, "fedavg"):
            if (run.config.get("dataset") or {}).get("name") != "mnist" or len(data.curve(run)) != 30:
                raise ValueError(f"{run.path}: not a 30-round run on the whole MNIST")
    return {"seeds": joined(str(s) for s in next(iter(seeds)))}


@claim("flw.final", FLW, "Test accuracy after 30 rounds: {a} / {b} / {c}% (5 + 5) and {d} / {e} / {f}% (2 + 8)")
def _(data):
    """The mean over seeds of each method's accuracy after round 30, FedLayerWise / FedAdp / FedAvg."""
    values = [fmt(mean(data.final(r) for r in flw_runs(data, s, m))) for s in SCENARIOS for m in FLW_METHODS]
    return dict(zip("abcdef", values))


@claim("flw.sooner", FLW, "Every method reaches 95% sooner than the paper says**, by {lo} to {hi} rounds")
def _(data):
    """The paper's rounds minus the mean over seeds, in each of the six cells: all positive."""
    gaps = [FLW_PAPER[(m, s)] - flw_mean_rounds(data, s, m) for s in SCENARIOS for m in FLW_METHODS]
    if min(gaps) <= 0:
        raise ValueError("a cell reaches 95% no sooner than the paper")
    return {"lo": fmt(min(gaps)), "hi": fmt(max(gaps))}


@claim("flw.harder", FLW, "FedAvg needs {a} rounds with 8 non-IID clients against {b} with 5, FedLayerWise {c} "
       "against {d}")
def _(data):
    """Mean rounds to 95% over seeds, 2 + 8 against 5 + 5."""
    return {"a": fmt(flw_mean_rounds(data, "2iid_8noniid", "fedavg")),
            "b": fmt(flw_mean_rounds(data, "5iid_5noniid", "fedavg")),
            "c": fmt(flw_mean_rounds(data, "2iid_8noniid", "fedlayerwise")),
            "d": fmt(flw_mean_rounds(data, "5iid_5noniid", "fedlayerwise"))}


@claim("flw.fedadp_first", FLW, "in 2 IID + 8 non-IID FedAdp reaches 95% no later than the other two in {k} of 3 "
       "seeds ({adp} rounds against FedLayerWise's {lw} and FedAvg's {avg})")
def _(data):
    """Seed by seed in 2 + 8: FedAdp's rounds to 95% at most both others'."""
    r = {m: [to_95(data, x) for x in flw_runs(data, "2iid_8noniid", m)] for m in FLW_METHODS}
    k = sum(a <= min(b, c) for a, b, c in zip(r["fedadp"], r["fedlayerwise"], r["fedavg"]))
    return {"k": k, "adp": joined(map(str, r["fedadp"])), "lw": joined(map(str, r["fedlayerwise"])),
            "avg": joined(map(str, r["fedavg"]))}


@claim("flw.lw_vs_avg", FLW, "FedLayerWise reaches 95% before FedAvg in {k} of 3 seeds of 2 IID + 8 non-IID "
       "({level}; {x} rounds sooner on average)")
def _(data):
    """Seed by seed in 2 + 8: FedLayerWise's rounds to 95% against FedAvg's."""
    lw = [to_95(data, x) for x in flw_runs(data, "2iid_8noniid", "fedlayerwise")]
    avg = [to_95(data, x) for x in flw_runs(data, "2iid_8noniid", "fedavg")]
    k = sum(a < b for a, b in zip(lw, avg))
    level = [str(run.seed) for run, a, b in zip(flw_runs(data, "2iid_8noniid", "fedavg"), lw, avg) if a == b]
    return {"k": k, "level": f"level in seed {joined(level)}" if level else "never level",
            "x": fmt(mean(avg) - mean(lw))}


@claim("flw.five_five", FLW, "In 5 IID + 5 non-IID the three reach 95% within a round of each other in every seed "
       "({lo} to {hi} rounds)")
def _(data):
    """5 + 5: in each seed the largest minus the smallest rounds to 95% over the three methods is at most 1."""
    per_seed = list(zip(*[[to_95(data, x) for x in flw_runs(data, "5iid_5noniid", m)] for m in FLW_METHODS]))
    if any(max(s) - min(s) > 1 for s in per_seed):
        raise ValueError("5 + 5: a seed's methods are more than a round apart")
    flat = [v for s in per_seed for v in s]
    return {"lo": min(flat), "hi": max(flat)}


@claim("flw.train10k", FLW, "gave the same ordering in 2 IID + 8 non-IID, each cell {lo} to {hi} rounds slower")
def _(data):
    """The earlier stand-in (MNIST's first 10,000 images, seeds 0, 2, 5): FedAdp < FedLayerWise <
    FedAvg in 2 + 8 as on the whole MNIST, and each cell's mean rounds to 95% minus the whole
    MNIST's, all positive."""
    def mean_rounds(folder, s, m):
        rounds = [to_95(data, r) for r in flw_runs(data, s, m, folder)]
        if None in rounds:
            raise ValueError(f"{folder} {s} {m}: a run does not reach 95%")
        return mean(rounds)

    order = {folder: sorted(FLW_METHODS, key=lambda m: mean_rounds(folder, "2iid_8noniid", m))
             for folder in ("table1", "table1_train10k")}
    if order["table1"] != order["table1_train10k"]:
        raise ValueError(f"the orderings differ: {order}")
    gaps = [mean_rounds("table1_train10k", s, m) - mean_rounds("table1", s, m) for s in SCENARIOS for m in FLW_METHODS]
    if min(gaps) <= 0:
        raise ValueError("a cell of the stand-in is not slower")
    return {"lo": fmt(min(gaps)), "hi": fmt(max(gaps))}


def one_class(data: Data, scenario: str = "2iid_8noniid") -> dict[str, list[int | None]]:
    """A scenario with one class per non-IID client (partition.classes_per_client=1), seeds 0, 1,
    2: each method's rounds to 95%, seed by seed."""
    out = {}
    for m in FLW_METHODS:
        rs = flw_runs(data, scenario, m, "table1_1class")
        if [r.seed for r in rs] != list(SEEDS) or not all(r.finished for r in rs) or any(
                (r.config.get("partition") or {}).get("classes_per_client") != 1 for r in rs):
            raise ValueError(f"table1_1class {scenario} {m}: not the finished runs of seeds 0, 1, 2 with one "
                             "class a client")
        out[m] = [to_95(data, r) for r in rs]
    return out


def seeds_cell(rounds: list[int | None]) -> str:
    """A Table I cell: the mean over seeds and each seed's rounds, ``7.3 [7, 8, 7]``."""
    if None in rounds:
        raise ValueError(f"a run does not reach 95%: {rounds}")
    return f"{fmt(mean(rounds), 1).removesuffix('.0')} [{', '.join(map(str, rounds))}]"


@claim("flw.one_class", FLW, "95% comes after FedLayerWise {lw}, FedAdp {adp} and FedAvg {avg} rounds (mean "
       "[seeds 0, 1, 2]; paper: 12, 21 and 25)")
def _(data):
    """2 + 8 with one class per non-IID client, seeds 0, 1, 2: each method's rounds to 95% on the
    whole MNIST, the mean and each seed's."""
    rounds = one_class(data)
    return {k: seeds_cell(rounds[m]) for k, m in (("lw", "fedlayerwise"), ("adp", "fedadp"), ("avg", "fedavg"))}


@claim("flw.one_class_slower", FLW, "The stronger skew slows FedAvg by {lo} to {hi} rounds and FedLayerWise by "
       "{llo} to {lhi}, FedAdp by {alo} to {ahi}")
def _(data):
    """Seed by seed, 2 + 8: rounds to 95% with one class per non-IID client minus with two (Table
    I's runs), the range over seeds for each method."""
    return one_class_slowdown(data, "2iid_8noniid")


def one_class_slowdown(data: Data, scenario: str) -> dict:
    """Seed by seed in ``scenario``: rounds to 95% with one class per non-IID client minus with two
    (Table I's runs), the range over seeds for each method (keys lo/hi: FedAvg, llo/lhi:
    FedLayerWise, alo/ahi: FedAdp)."""
    one = one_class(data, scenario)
    out = {}
    for key, m in (("", "fedavg"), ("l", "fedlayerwise"), ("a", "fedadp")):
        two = [to_95(data, r) for r in flw_runs(data, scenario, m)]
        d = [a - b for a, b in zip(one[m], two)]
        out.update({f"{key}lo": min(d), f"{key}hi": max(d)})
    return out


@claim("flw.one_class_order", FLW, "FedAdp reaches 95% first in {adp} of 3 seeds, FedLayerWise before FedAvg in "
       "{lw} of 3")
def _(data):
    """2 + 8, one class per non-IID client: in how many seeds FedAdp's round to 95% is strictly
    the lowest of the three, and FedLayerWise's strictly below FedAvg's."""
    r = one_class(data)
    adp = sum(r["fedadp"][s] < min(r["fedlayerwise"][s], r["fedavg"][s]) for s in range(3))
    lw = sum(r["fedlayerwise"][s] < r["fedavg"][s] for s in range(3))
    return {"adp": adp, "lw": lw}


@claim("flw.one_class_five", FLW, "In 5 IID + 5 non-IID with one class a non-IID client, 95% comes after "
       "FedLayerWise {lw}, FedAdp {adp} and FedAvg {avg} rounds (paper: 11, 12 and 12)")
def _(data):
    """5 + 5 with one class per non-IID client, seeds 0, 1, 2: each method's rounds to 95%, the
    mean and each seed's."""
    rounds = one_class(data, "5iid_5noniid")
    return {k: seeds_cell(rounds[m]) for k, m in (("lw", "fedlayerwise"), ("adp", "fedadp"), ("avg", "fedavg"))}


@claim("flw.one_class_five_slower", FLW, "the one-class skew slows FedAvg by {lo} to {hi} rounds and changes "
       "FedLayerWise's count by {llo} to {lhi} rounds and FedAdp's by {alo} to {ahi}")
def _(data):
    """Seed by seed, 5 + 5: rounds to 95% with one class per non-IID client minus with two."""
    return one_class_slowdown(data, "5iid_5noniid")


@claim("flw.one_class_five_order", FLW, "FedLayerWise reaches 95% before FedAvg in {lw} of 3 seeds, FedAdp before "
       "FedAvg in {adp} of 3, and FedLayerWise before FedAdp in {lw_adp} of 3 ({level} level, {adp_lw} FedAdp first)")
def _(data):
    """5 + 5, one class per non-IID client: seed by seed, strict orderings of the rounds to 95%."""
    r = one_class(data, "5iid_5noniid")
    lw, adp, avg = r["fedlayerwise"], r["fedadp"], r["fedavg"]
    return {"lw": sum(a < b for a, b in zip(lw, avg)), "adp": sum(a < b for a, b in zip(adp, avg)),
            "lw_adp": sum(a < b for a, b in zip(lw, adp)), "level": sum(a == b for a, b in zip(lw, adp)),
            "adp_lw": sum(a > b for a, b in zip(lw, adp))}


def torch_init(data: Data, scenario: str = "2iid_8noniid") -> dict[str, list[Run]]:
    """Table I's runs under PyTorch's initialization (``model.init=torch``, the presets otherwise),
    seeds 0, 1, 2 of each method: {method: runs}, each checked finished, 30 rounds on the whole MNIST."""
    out = {}
    for m in FLW_METHODS:
        rs = flw_runs(data, scenario, m, "table1_torch_init")
        if [r.seed for r in rs] != list(SEEDS) or not all(
                r.finished and (r.config.get("model") or {}).get("init") == "torch"
                and (r.config.get("dataset") or {}).get("name") == "mnist" and len(data.curve(r)) == 30 for r in rs):
            raise ValueError(f"table1_torch_init {scenario} {m}: not the finished 30-round runs of seeds 0, 1, 2 "
                             "with model.init=torch on the whole MNIST")
        out[m] = rs
    return out


CHANCE = Decimal(20)  # an accuracy (%) below which a 10-class model has learned nothing usable
FLW_NAMES = {"fedlayerwise": "FedLayerWise", "fedadp": "FedAdp", "fedavg": "FedAvg"}


def torch_rows(data: Data, scenario: str) -> dict:
    """Under PyTorch's initialization: each method's rounds to 95% (``-``: not within 30 rounds)
    and accuracy after round 30, seed by seed, and their mean over the seeds."""
    rows = []
    for m, rs in torch_init(data, scenario).items():
        rounds = [to_95(data, r) for r in rs]
        finals = [data.final(r) for r in rs]
        rows.append(f"| {FLW_NAMES[m]} | {', '.join('-' if x is None else str(x) for x in rounds)} | "
                    f"{', '.join(exact(f) for f in finals)} | {fmt(mean(finals))} |")
    return {"rows": "\n".join(rows)}


def torch_chance(data: Data, scenario: str) -> dict:
    """Under PyTorch's initialization: the runs whose accuracy after round 30 is below 20%, and
    the runs that reach 95%."""
    runs = torch_init(data, scenario)
    low = [f"{FLW_NAMES[m]} seed {r.seed}" for m, rs in runs.items() for r in rs if data.final(r) < CHANCE]
    reach = sum(to_95(data, r) is not None for rs in runs.values() for r in rs)
    return {"k": words(len(low)).capitalize(), "end": "ends" if len(low) == 1 else "end",
            "which": joined(low) or "none", "reach": words(reach)}


def torch_order(data: Data, scenario: str) -> dict:
    """Under PyTorch's initialization: seed by seed, which method's accuracy after round 30 is
    higher (the rounds to 95% cannot order runs that do not reach it)."""
    r = {m: [data.final(x) for x in rs] for m, rs in torch_init(data, scenario).items()}
    lw, adp, avg = r["fedlayerwise"], r["fedadp"], r["fedavg"]
    return {"lw": sum(a > b for a, b in zip(lw, avg)), "lw_adp": sum(a > b for a, b in zip(lw, adp)),
            "adp": sum(a > b for a, b in zip(adp, avg))}


TORCH_CHANCE = "{k} of the 9 runs {end} at chance ({which}: below 20% after round 30) and {reach} of 9 reach 95% " \
               "within 30 rounds"
TORCH_ORDER = "FedLayerWise ends above FedAvg in {lw} of 3 seeds and above FedAdp in {lw_adp} of 3; FedAdp ends " \
              "above FedAvg in {adp} of 3"


def _torch_claims() -> None:
    """Register the rows, chance and order claims of both Table I scenarios under PyTorch's
    initialization (``flw.torch_<name>`` for 2 + 8, ``flw.torch_<name>_five`` for 5 + 5)."""
    for suffix, scenario, label in (("", "2iid_8noniid", "2 + 8"), ("_five", "5iid_5noniid", "5 + 5")):
        for name, template, compute in (("rows", "{rows}", torch_rows), ("chance", TORCH_CHANCE, torch_chance),
                                        ("order", TORCH_ORDER, torch_order)):
            def one(data, compute=compute, scenario=scenario):
                return compute(data, scenario)
            one.__doc__ = f"{label}. {compute.__doc__}"
            claim(f"flw.torch_{name}{suffix}", FLW, template)(one)


_torch_claims()


@claim("flw.torch_reach_five", FLW, "counting a run that never reaches 95% as last, FedLayerWise reaches it "
       "before FedAvg in {lw} of 3 seeds and before FedAdp in {lw_adp} of 3 ({level} level), FedAdp before FedAvg "
       "in {adp} of 3")
def _(data):
    """5 + 5 under PyTorch's initialization: seed by seed, which method reaches 95% first (a run
    that does not reach it within 30 rounds comes after one that does; two that do not are level)."""
    never = 10 ** 6
    r = {m: [never if x is None else x for x in (to_95(data, run) for run in rs)]
         for m, rs in torch_init(data, "5iid_5noniid").items()}
    lw, adp, avg = r["fedlayerwise"], r["fedadp"], r["fedavg"]
    return {"lw": sum(a < b for a, b in zip(lw, avg)), "lw_adp": sum(a < b for a, b in zip(lw, adp)),
            "level": words(sum(a == b for a, b in zip(lw, adp))), "adp": sum(a < b for a, b in zip(adp, avg))}


@claim("flw.torch_slower_five", FLW, "{k} runs need more rounds to reach 95% than the same method and "
       "seed under the presets' initialization (Table I above), {never} of them never reaching it")
def _(data):
    """5 + 5: each run under PyTorch's initialization against Table I's run of the same method and
    seed (the presets' Glorot initialization): later to 95%, or not within 30 rounds."""
    k = never = 0
    for m, rs in torch_init(data, "5iid_5noniid").items():
        for run, preset in zip(rs, flw_runs(data, "5iid_5noniid", m)):
            mine, theirs = to_95(data, run), to_95(data, preset)
            if theirs is None or run.seed != preset.seed:
                raise ValueError(f"Table I's {m} seed {preset.seed} run does not reach 95%, or the seeds differ")
            k += mine is None or mine > theirs
            never += mine is None
    return {"k": "All 9" if k == 9 else f"{words(k).capitalize()} of the 9", "never": words(never)}


@claim("flw.torch_all_reach", FLW, "Where all three reach 95% (seed {seeds}), {order}")
def _(data):
    """2 + 8 under PyTorch's initialization: the seeds in which every method reaches 95%, and in
    each such seed the methods in the order they reach it."""
    names = FLW_NAMES
    r = {m: [to_95(data, x) for x in rs] for m, rs in torch_init(data).items()}
    seeds = [i for i in range(len(SEEDS)) if all(r[m][i] is not None for m in FLW_METHODS)]
    if len(seeds) != 1:
        raise ValueError(f"the claim is worded for one seed in which all reach 95%, not {len(seeds)}")
    i = seeds[0]
    ranked = sorted(FLW_METHODS, key=lambda m: r[m][i])
    if len({r[m][i] for m in FLW_METHODS}) != 3:
        raise ValueError("two methods reach 95% in the same round")
    first, second, third = ranked
    return {"seeds": SEEDS[i], "order": f"{names[first]} does first ({r[first][i]} rounds), then "
                                       f"{names[second]} ({r[second][i]}) and {names[third]} ({r[third][i]})"}


# ----------------------------------------------------------------------------- FedLap against tuned baselines

LT = "fedlap_tuned"
TUNED = {"fedprox": "fedlap/tuned/fedprox", "fedlap": "fedlap/tuned/fedlap"}


def choice(data: Data, method: str, folders: dict[str, str] = TUNED) -> dict:
    """``OUT/choice.json`` of the tuning protocol (scripts/tune.py) for ``method`` (its OUT in ``folders``)."""
    import json

    return json.loads((data.folder(folders[method]) / "choice.json").read_text())


def grid_row(data: Data, method: str, folders: dict[str, str] = TUNED) -> dict:
    """The grid's points and each point's score recomputed from its tuning run (mean validation
    accuracy over rounds 1-20, %, exact), checked against choice.json, and the chosen point."""
    c = choice(data, method, folders)
    (key, values), = c["grid"].items()
    cells = []
    for value, row in zip(values, c["rows"]):
        run = load_run(data.folder(folders[method]) / "tune" / f"{key.rsplit('.', 1)[-1]}{value}_seed0")
        df = read_rounds(run.path)
        score = mean(pct(a) for a in df["val_acc"].dropna())
        if abs(float(score) - 100 * row["mean"]) > 1e-6:
            raise ValueError(f"{run.path}: choice.json's score {row['mean']} is not the run's {score}")
        cells.append(f"{value}: {fmt(score, 2)}")
    chosen = c["chosen"][key]
    best = max(zip(values, c["rows"]), key=lambda vr: vr[1]["mean"])[0]
    if chosen != best:
        raise ValueError(f"{method}: choice {chosen} is not the best point {best}")
    return {"cells": ", ".join(cells), "chosen": chosen}


@claim("fedlap_tuned.fedprox_grid", LT, "| FedProx, `aggregator.mu` | {cells} | {chosen} |")
def _(data):
    """FedProx's tuning: every point of its authors' grid scored on the validation split."""
    return grid_row(data, "fedprox")


@claim("fedlap_tuned.fedlap_grid", LT, "| FedLap, `aggregator.q` (`form=interpolate`) | {cells} | {chosen} |")
def _(data):
    """FedLap's tuning: q over the same number of points, scored the same way."""
    return grid_row(data, "fedlap")


@claim("fedlap_tuned.protocol_runs", LT, "The protocol's own test runs at 0% stragglers give FedProx (mu = {mu}) "
       "{prox}% and FedLap (q = {q}) {lap}% over rounds 1-20 (seeds 0, 1, 2)")
def _(data):
    """The means over rounds 1-20 of the test runs scripts/tune.py made for each method's chosen
    point (0% stragglers, seeds 0, 1, 2)."""
    mu = choice(data, "fedprox")["chosen"]["aggregator.mu"]
    q = choice(data, "fedlap")["chosen"]["aggregator.q"]
    prox = [load_run(data.folder(TUNED["fedprox"]) / "test" / f"mu{mu}_seed{s}") for s in SEEDS]
    lap = [load_run(data.folder(TUNED["fedlap"]) / "test" / f"q{q}_seed{s}") for s in SEEDS]
    return {"mu": mu, "q": q, "prox": fmt(mean(seed_means(data, prox))), "lap": fmt(mean(seed_means(data, lap)))}


@claim("fedlap_tuned.protocol_vs_earlier", LT, "agree with the earlier runs of the same setting to {digits} "
       "significant digits in round 1")
def _(data):
    """The protocol's FedProx test runs against the earlier runs of the same setting
    (fedlap/preset, mu = 0.01, 0% stragglers): the relative difference of round 1's test loss."""
    mu = choice(data, "fedprox")["chosen"]["aggregator.mu"]
    worst = 0.0
    for seed in SEEDS:
        a = read_rounds(data.folder(TUNED["fedprox"]) / "test" / f"mu{mu}_seed{seed}")
        b = read_rounds(data.folder("fedlap/preset/stragglers0") / f"fedprox_s0.0_seed{seed}")
        x, y = float(a["test_loss"].iloc[0]), float(b["test_loss"].iloc[0])
        worst = max(worst, abs(x - y) / abs(y))
    if worst == 0:
        return {"digits": "all"}
    return {"digits": str(int(-math.log10(worst)))}


def tuned_cells(data: Data) -> dict[tuple[str, float], list[Run]]:
    """FedLap at the paper's q = 0.5 and FedAvg (fedlap/fmnist), FedProx at the tuned mu
    (fedlap/preset holds it at every straggler fraction), by (method, stragglers), in seed order."""
    mu = float(choice(data, "fedprox")["chosen"]["aggregator.mu"])
    fmnist, preset = fedlap_cells(data, "fmnist"), fedlap_cells(data, "preset")
    cells = {}
    for s in FRACTIONS:
        cells[("fedlap", s)], cells[("fedavg", s)] = fmnist[("fedlap", s)], fmnist[("fedavg", s)]
        cells[("fedprox", s)] = preset[("fedprox", s)]
        if {aggregator(r, "mu") for r in cells[("fedprox", s)]} != {mu}:
            raise ValueError(f"fedlap/preset: FedProx at {s} is not at the tuned mu = {mu}")
    return cells


@claim("fedlap_tuned.q_everywhere", LT, "{text}")
def _(data):
    """FashionMNIST: FedLap at its tuned q with 0%, 50% and 90% stragglers against the table's
    methods, means over rounds 1-20 per fraction and seed by seed."""
    return {"text": Q_EVERYWHERE.format(**tuned_q_everywhere(data, TUNED, "fedlap/tuned/fedlap_stragglers",
                                                             tuned_cells(data)))}


def _cell(data: Data, runs: list[Run]) -> str:
    at = [data.at(r, T) for r in runs]
    return f"{fmt(mean(at))}% [{fmt(min(at))}-{fmt(max(at))}] / {fmt(mean(seed_means(data, runs)))}%"


@claim("fedlap_tuned.rows", LT, "| 0% | {r0} |\n| 50% | {r50} |\n| 90% | {r90} |")
def _(data):
    """The table: each method's accuracy after round 20 (mean [min-max] over seeds 0, 1, 2) and its
    mean over rounds 1-20, and the seeds in which FedLap's mean over rounds 1-20 beats both."""
    return tuned_rows(data, tuned_cells(data))


def tuned_rows(data: Data, cells: dict) -> dict:
    """A tuned-baselines table's rows (keys r0, r50, r90): each method's :func:`_cell` and the
    seeds in which FedLap's mean over rounds 1-20 beats both baselines."""
    out = {}
    for key, s in (("r0", 0.0), ("r50", 0.5), ("r90", 0.9)):
        ahead, n = ahead_of_both(data, cells[("fedlap", s)], [cells[("fedprox", s)], cells[("fedavg", s)]])
        out[key] = " | ".join([_cell(data, cells[(m, s)]) for m in ("fedlap", "fedprox", "fedavg")]
                              + [f"{ahead} of {n}"])
    return out


@claim("fedlap_tuned.prox_leads", LT, "FedProx's mean accuracy over rounds 1-20 beats FedLap's in {k} of {n} (seed, "
       "fraction) pairs, by {lo} to {hi} points as a mean over the seeds at each fraction; FedLap is ahead of both "
       "baselines in {both} of {n}")
def _(data):
    """Seed by seed at each straggler fraction: tuned FedProx's mean over rounds 1-20 against
    FedLap's (q = 0.5), the mean lead per fraction, and the pairs where FedLap beats both."""
    cells = tuned_cells(data)
    k = n = both = 0
    leads = []
    for s in FRACTIONS:
        lap = {r.seed: data.mean_to(r, T) for r in cells[("fedlap", s)]}
        prox = {r.seed: data.mean_to(r, T) for r in cells[("fedprox", s)]}
        avg = {r.seed: data.mean_to(r, T) for r in cells[("fedavg", s)]}
        for seed in sorted(lap):
            n += 1
            k += prox[seed] > lap[seed]
            both += lap[seed] > max(prox[seed], avg[seed])
        leads.append(mean(prox.values()) - mean(lap.values()))
    if min(leads) <= 0:
        raise ValueError("FedProx does not lead at every fraction")
    return {"k": k, "n": n, "lo": fmt(min(leads)), "hi": fmt(max(leads)), "both": both}


@claim("fedlap_tuned.q1_is_mu1", LT, "FedLap at q = 1 scores what FedProx at mu = 1 scores, to the last digit")
def _(data):
    """The tuning runs of FedLap at q = 1 (interpolate form) and FedProx at mu = 1: the same
    validation and test accuracies in every round."""
    return q1_is_mu1(data, TUNED)


def q1_is_mu1(data: Data, folders: dict[str, str]) -> dict:
    """Raise unless the tuning runs of FedLap at q = 1 and FedProx at mu = 1 (under ``folders``)
    have the same validation and test accuracies in every round."""
    a = read_rounds(data.folder(folders["fedlap"]) / "tune" / "q1_seed0")
    b = read_rounds(data.folder(folders["fedprox"]) / "tune" / "mu1_seed0")
    if not (a["val_acc"].equals(b["val_acc"]) and a["test_acc"].equals(b["test_acc"])):
        raise ValueError("FedLap at q = 1 and FedProx at mu = 1 differ")
    return {}

# ----------------------------------------------------------------------------- FedLap against tuned baselines, the whole MNIST

LTM = "fedlap_mnist_tuned"
TUNED_MNIST = {"fedprox": "fedlap/tuned_mnist/fedprox", "fedlap": "fedlap/tuned_mnist/fedlap"}
# Tuned FedProx with stragglers (the protocol's test runs have none): a sweep at the chosen mu.
TUNED_MNIST_STRAGGLERS = "fedlap/tuned_mnist/fedprox_stragglers"


def protocol_tests(data: Data, method: str, folders: dict[str, str]) -> list[Run]:
    """The test runs scripts/tune.py made for ``method``'s chosen point (seeds 0, 1, 2), checked to
    train on the whole training set (no validation split)."""
    (key, value), = choice(data, method, folders)["chosen"].items()
    runs = [load_run(data.folder(folders[method]) / "test" / f"{key.rsplit('.', 1)[-1]}{value}_seed{s}")
            for s in SEEDS]
    for r in runs:
        if float(hyper(r, "validation_fraction") or 0) != 0 or not r.finished:
            raise ValueError(f"{r.path}: a validation split, or an unfinished run")
    return runs


def tuned_mnist_cells(data: Data) -> dict[tuple[str, float], list[Run]]:
    """FedLap at the paper's q = 0.5 and FedAvg (fedlap/mnist), FedProx at its tuned mu (the
    protocol's test runs without stragglers, TUNED_MNIST_STRAGGLERS with them), by (method,
    stragglers), in seed order."""
    mu = float(choice(data, "fedprox", TUNED_MNIST)["chosen"]["aggregator.mu"])
    whole = fedlap_cells(data, "mnist")
    cells = {}
    for s in FRACTIONS:
        cells[("fedlap", s)], cells[("fedavg", s)] = whole[("fedlap", s)], whole[("fedavg", s)]
        cells[("fedprox", s)] = (protocol_tests(data, "fedprox", TUNED_MNIST) if s == 0.0
                                 else data.runs(TUNED_MNIST_STRAGGLERS, "fedprox", s))
        if {float(aggregator(r, "mu")) for r in cells[("fedprox", s)]} != {mu}:
            raise ValueError(f"FedProx at {s} is not at the tuned mu = {mu}")
        if [r.seed for r in cells[("fedprox", s)]] != list(SEEDS):
            raise ValueError(f"FedProx at {s}: seeds {[r.seed for r in cells[('fedprox', s)]]}")
    if {float(aggregator(r, "q")) for s in FRACTIONS for r in cells[("fedlap", s)]} != {0.5}:
        raise ValueError("fedlap/mnist: FedLap is not at the paper's q = 0.5")
    return cells


@claim("fedlap_mnist_tuned.fedprox_grid", LTM, "| FedProx, `aggregator.mu` | {cells} | {chosen} |")
def _(data):
    """Whole MNIST: FedProx's tuning, every point of its authors' grid scored on the validation split."""
    return grid_row(data, "fedprox", TUNED_MNIST)


@claim("fedlap_mnist_tuned.fedlap_grid", LTM, "| FedLap, `aggregator.q` (`form=interpolate`) | {cells} | {chosen} |")
def _(data):
    """Whole MNIST: FedLap's q over the same number of points, scored the same way."""
    return grid_row(data, "fedlap", TUNED_MNIST)


@claim("fedlap_mnist_tuned.rows", LTM, "| 0% | {r0} |\n| 50% | {r50} |\n| 90% | {r90} |")
def _(data):
    """Whole MNIST, the table: each method's accuracy after round 20 (mean [min-max] over seeds 0,
    1, 2) / its mean over rounds 1-20, and the seeds in which FedLap's mean over rounds 1-20 beats
    both baselines."""
    return tuned_rows(data, tuned_mnist_cells(data))


def pair_counts(data: Data, cells: dict, a: str, b: str) -> tuple[int, int, list[Decimal]]:
    """(pairs (seed, fraction) in which ``a``'s mean over rounds 1-20 beats ``b``'s, pairs, and at
    each fraction ``a``'s mean over the seeds minus ``b``'s)."""
    k = n = 0
    diffs = []
    for s in FRACTIONS:
        x = {r.seed: data.mean_to(r, T) for r in cells[(a, s)]}
        y = {r.seed: data.mean_to(r, T) for r in cells[(b, s)]}
        for seed in sorted(set(x) & set(y)):
            n += 1
            k += x[seed] > y[seed]
        diffs.append(mean(x.values()) - mean(y.values()))
    return k, n, diffs


def tuned_q_everywhere(data: Data, folders: dict[str, str], stragglers: str, cells: dict) -> dict:
    """FedLap at its tuned q at every straggler fraction (the protocol's test runs at 0%, the sweep
    ``stragglers`` at 50% and 90%) against the tuned FedProx and FedAvg of ``cells``: the means over
    rounds 1-20 (and over seeds) per fraction, and the (seed, fraction) pairs FedLap wins."""
    q = choice(data, "fedlap", folders)["chosen"]["aggregator.q"]
    lap = {0.0: protocol_tests(data, "fedlap", folders)}
    for f in FRACTIONS[1:]:
        lap[f] = data.runs(stragglers, "fedlap", f)
        if [r.seed for r in lap[f]] != list(SEEDS) or not all(r.finished for r in lap[f]) or \
                {str(aggregator(r, "q")) for r in lap[f]} != {q}:
            raise ValueError(f"{stragglers}: not the finished runs of FedLap at q = {q}, seeds 0, 1, 2, at {f}")
    mine = {**cells, **{("lap_q", f): rs for f, rs in lap.items()}}
    kp, n, _dp = pair_counts(data, mine, "lap_q", "fedprox")
    ka, _n, _da = pair_counts(data, mine, "lap_q", "fedavg")

    def per_fraction(method):
        return ", ".join(f"{fmt(mean(seed_means(data, mine[(method, f)])))}%" for f in FRACTIONS)

    return {"q": q, "lap": per_fraction("lap_q"), "prox": per_fraction("fedprox"), "avg": per_fraction("fedavg"),
            "half": per_fraction("fedlap"), "kp": kp, "ka": ka, "n": n}


Q_EVERYWHERE = ("With stragglers too (q = {q} at every fraction: the protocol's runs at 0%, a sweep at 50% and "
                "90%), FedLap's means over rounds 1-20 at 0%, 50% and 90% are {lap}, against {half} at q = 0.5, "
                "{prox} for the tuned FedProx and {avg} for FedAvg; FedLap at q = {q} beats FedProx in {kp} of {n} "
                "(seed, fraction) pairs and FedAvg in {ka} of {n}")


@claim("fedlap_mnist_tuned.q_everywhere", LTM, Q_EVERYWHERE)
def _(data):
    """Whole MNIST: FedLap at its tuned q with 0%, 50% and 90% stragglers against the table's
    methods, means over rounds 1-20 per fraction and seed by seed."""
    return tuned_q_everywhere(data, TUNED_MNIST, "fedlap/tuned_mnist/fedlap_stragglers", tuned_mnist_cells(data))


@claim("fedlap_mnist_tuned.versus", LTM, "Over rounds 1-20 the tuned FedProx beats FedLap in {kp} of {n} (seed, "
       "fraction) pairs ({prox} FedLap as a mean over the seeds at each fraction) and FedAvg beats FedLap in {ka} "
       "of {n} ({avg} FedLap); FedLap is ahead of both in {both} of {n}")
def _(data):
    """Whole MNIST, seed by seed at each straggler fraction: the tuned FedProx's and FedAvg's mean
    over rounds 1-20 against FedLap's (q = 0.5), the differences of the means over seeds per
    fraction, and the pairs where FedLap beats both."""
    cells = tuned_mnist_cells(data)
    kp, n, dp = pair_counts(data, cells, "fedprox", "fedlap")
    ka, _n, da = pair_counts(data, cells, "fedavg", "fedlap")
    both = sum(ahead_of_both(data, cells[("fedlap", s)], [cells[("fedprox", s)], cells[("fedavg", s)]])[0]
               for s in FRACTIONS)
    return {"kp": kp, "ka": ka, "n": n, "both": both,
            "prox": signed_range(dp, "ahead of", "behind"), "avg": signed_range(da, "ahead of", "behind")}


@claim("fedlap_mnist_tuned.prox_vs_avg", LTM, "the tuned FedProx's mean over rounds 1-20 is {side} FedAvg's at each "
       "fraction and beats it in {k} of {n} pairs")
def _(data):
    """Whole MNIST: the tuned FedProx against FedAvg, mean over rounds 1-20, seed by seed and as
    means over the seeds per fraction."""
    cells = tuned_mnist_cells(data)
    k, n, d = pair_counts(data, cells, "fedprox", "fedavg")
    return {"side": signed_range(d, "ahead of", "behind"), "k": k, "n": n}


@claim("fedlap_mnist_tuned.protocol_runs", LTM, "The protocol's test runs of FedLap at its tuned q = {q} give {lap}% "
       "over rounds 1-20 without stragglers (seeds 0, 1, 2), against {half}% at the paper's q = 0.5, {prox}% for the "
       "tuned FedProx and {avg}% for FedAvg; seed by seed FedLap at q = {q} beats FedProx in {kp} of 3 and FedAvg in "
       "{ka} of 3")
def _(data):
    """Whole MNIST, 0% stragglers: FedLap's test runs at its chosen q against the q = 0.5 runs of
    fedlap/mnist, the tuned FedProx and FedAvg, means over rounds 1-20 (and over seeds), and seed
    by seed."""
    q = choice(data, "fedlap", TUNED_MNIST)["chosen"]["aggregator.q"]
    lap = protocol_tests(data, "fedlap", TUNED_MNIST)
    cells = tuned_mnist_cells(data)
    half, prox, avg = (cells[(m, 0.0)] for m in ("fedlap", "fedprox", "fedavg"))
    mine = seed_means(data, lap)
    return {"q": q, "lap": fmt(mean(mine)), "half": fmt(mean(seed_means(data, half))),
            "prox": fmt(mean(seed_means(data, prox))), "avg": fmt(mean(seed_means(data, avg))),
            "kp": sum(a > b for a, b in zip(mine, seed_means(data, prox))),
            "ka": sum(a > b for a, b in zip(mine, seed_means(data, avg)))}


@claim("fedlap_mnist_tuned.q1_is_mu1", LTM, "FedLap at q = 1 again scores what FedProx at mu = 1 scores, to the last "
       "digit")
def _(data):
    """Whole MNIST: the tuning runs of FedLap at q = 1 (interpolate form) and FedProx at mu = 1
    have the same validation and test accuracies in every round."""
    return q1_is_mu1(data, TUNED_MNIST)


@claim("fedlap_mnist_tuned.peaks", LTM, "Both grids peak at a light regularization (mu = {mu}; q = {q}, {where}) "
       "and fall with every larger mu or q")
def _(data):
    """Whole MNIST: each grid's chosen point, and its scores strictly falling over the points after it."""
    out = {}
    for method, key in (("fedprox", "mu"), ("fedlap", "q")):
        c = choice(data, method, TUNED_MNIST)
        (setting, values), = c["grid"].items()
        scores = [row["mean"] for row in c["rows"]]
        at = values.index(c["chosen"][setting])
        if any(a <= b for a, b in zip(scores[at:], scores[at + 1:])):
            raise ValueError(f"{method}: the scores do not fall after the chosen point: {scores}")
        out[key] = c["chosen"][setting]
        if method == "fedlap":
            out["where"] = f"the smallest {key} tried" if at == 0 else f"point {at + 1} of {len(values)}"
    return out


@claim("fedlap_mnist_tuned.budget", LTM, "{tune} tuning runs and {test} test runs, {minutes} minutes of CPU")
def _(data):
    """Whole MNIST: the protocol's runs (both methods' tune/ and test/) and the tuned FedProx's
    straggler runs, and their time in their rounds together (summary.json round_seconds)."""
    def found(name: str) -> list[Run]:
        return [load_run(p) for p in find_runs(data.folder(name), require=("config.yaml",))]
    tune = [r for m in TUNED_MNIST for r in found(f"{TUNED_MNIST[m]}/tune")]
    test = [r for m in TUNED_MNIST for r in found(f"{TUNED_MNIST[m]}/test")] + found(TUNED_MNIST_STRAGGLERS)
    if not all(r.finished for r in tune + test):
        raise ValueError("an unfinished run")
    minutes = sum(dec(r.summary["round_seconds"]) for r in tune + test) / 60
    return {"tune": len(tune), "test": len(test), "minutes": fmt(minutes, 0)}


# ----------------------------------------------------------------------------- FedNNNN on a GPU

FG = "fednnnn_gpu"
GPU_DRAW = "fednnnn_gpu/h200_2026-11-27"  # scripts/bench/gpu_check.sh draw on one NVIDIA H200
TABLE2_CSV = Path("scripts") / "paper_targets" / "fednnnn_table2_accuracy.csv"
FG_METHODS = {"fedavg": "FedAvg", "fedprox": "FedProx (mu = 0.02)", "normnorm": "Norm-Norm", "momentum": "Momentum",
              "fednnnn": "FedNNNN"}


def table2(data: Data, dataset: str = "mnist", condition: str = "noniid-ub") -> dict[str, Decimal]:
    """Table 2's accuracies (%) of one column: {method: %}."""
    with open(data.root / TABLE2_CSV, newline="") as f:
        return {r["method"]: Decimal(r["accuracy_pct"]) for r in csv.DictReader(f)
                if r["dataset"] == dataset and r["condition"] == condition}


def gpu_column(data: Data) -> dict[str, Run]:
    """The draw's Table 2 column, seed 0: {method: run}."""
    return {m: data.run(f"{GPU_DRAW}/column", m, 0) for m in FG_METHODS}


@claim("fednnnn_gpu.rows", FG, "{rows}")
def _(data):
    """Each method's accuracy at round 10 and at its last round (best and its round) beside
    Table 2's; every run reached the same last round."""
    paper, runs = table2(data), gpu_column(data)
    last = {max(data.curve(r)) for r in runs.values()}
    if last != {21}:
        raise ValueError(f"the column's runs stopped at rounds {sorted(last)}, not all at 21")
    rows = []
    for m, label in FG_METHODS.items():
        curve = data.curve(runs[m])
        best = max(curve.values())
        best_round = min(r for r, v in curve.items() if v == best)
        rows.append(f"| {label} | {exact(curve[10])} | {exact(curve[21])} ({exact(best)}, {best_round}) | {paper[m]} |")
    return {"rows": "\n".join(rows)}


@claim("fednnnn_gpu.order", FG, "At round 21 {here}; Table 2 (round 100) has {paper}")
def _(data):
    """The five runs ordered by their round-21 accuracy, and Table 2's order of the same column."""
    paper, runs = table2(data), gpu_column(data)
    names = {m: label.split(" (")[0] for m, label in FG_METHODS.items()}

    def ordered(score) -> list[str]:
        return [names[m] for m in sorted(FG_METHODS, key=score, reverse=True)]
    here = ordered(lambda m: data.at(runs[m], 21))
    there = ordered(lambda m: paper[m])
    return {"here": "the order is " + ", ".join(here), "paper": ", ".join(there)}


@claim("fednnnn_gpu.preset", FG, "FedNNNN alone (the `preset` step, 25 rounds) reached {final}% (best {best}%, "
       "round {round})")
def _(data):
    """The preset step's run: its last round (25) and best accuracy."""
    run = load_run(data.folder(GPU_DRAW) / "preset")
    curve = data.curve(run)
    if max(curve) != 25:
        raise ValueError(f"the preset run stopped at round {max(curve)}")
    best = max(curve.values())
    return {"final": exact(curve[25]), "best": exact(best), "round": min(r for r, v in curve.items() if v == best)}


@claim("fednnnn_gpu.gaps", FG, "FedAvg, Momentum and FedNNNN are within {lo} to {hi} points of the paper's "
       "round-100 figure already, while the paper's FedProx ends {paper_gap} points under FedAvg; here FedProx "
       "trails FedAvg by {gap} points at round 21")
def _(data):
    """|round 21 - Table 2| for FedAvg, Momentum and FedNNNN; Table 2's FedAvg - FedProx; the
    runs' FedAvg - FedProx at round 21."""
    paper, runs = table2(data), gpu_column(data)
    gaps = [abs(data.at(runs[m], 21) - paper[m]) for m in ("fedavg", "momentum", "fednnnn")]
    gap = data.at(runs["fedavg"], 21) - data.at(runs["fedprox"], 21)
    if gap <= 0:
        raise ValueError("FedProx does not trail FedAvg at round 21")
    return {"lo": fmt(min(gaps)), "hi": fmt(max(gaps)), "paper_gap": fmt(paper["fedavg"] - paper["fedprox"]),
            "gap": exact(gap)}


# ----------------------------------------------------------------------------- NIID-Bench, whole MNIST, GPU

NG = "niidbench_gpu"
NG_DRAW = "niidbench_gpu/h200_2026-11-27"  # scripts/bench/gpu_check.sh niidbench on one NVIDIA H200
NG_ROUNDS = {"c2": 14, "iid": 22}  # where each partition's population stopped at the budget
NG_NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova"}


def ng(data: Data, partition: str, method: str) -> list[Run]:
    """The whole-MNIST GPU runs of a NIID-Bench cell, seeds 0, 1, 2, all stopped at the same round."""
    runs = [data.run(f"{NG_DRAW}/niidbench/mnist_{partition}", method, s) for s in SEEDS]
    last = {max(data.curve(r)) for r in runs}
    if last != {NG_ROUNDS[partition]}:
        raise ValueError(f"mnist_{partition} {method}: the runs stopped at rounds {sorted(last)}, "
                         f"not all at {NG_ROUNDS[partition]}")
    if any(diverged_at(r) for r in runs):
        raise ValueError(f"mnist_{partition} {method}: a run diverged")
    return runs


def ng_at(data: Data, partition: str, method: str) -> list[Decimal]:
    """Each seed's accuracy (%) at the partition's last common round, whole MNIST."""
    return [data.at(r, NG_ROUNDS[partition]) for r in ng(data, partition, method)]


def small_at(data: Data, partition: str, method: str) -> list[Decimal]:
    """Each seed's accuracy (%) at the same round on MNIST's first 10,000 images (the CPU grid)."""
    return [data.at(r, NG_ROUNDS[partition]) for r in nb(data, partition, method)]


def sd(values: list[Decimal]) -> Decimal:
    return dec(statistics.stdev([float(v) for v in values]))


def ng_readings(data: Data, reading: str) -> list[Run]:
    return [data.run(f"{NG_DRAW}/readings/mnist_c2_{reading}", "scaffold", s) for s in SEEDS]


@claim("niidbench_gpu.rows", NG, "{rows}")
def _(data):
    """Per partition and method: the whole-MNIST runs' mean +- sd over seeds 0-2 at the round
    they all reached, the 10,000-image runs' mean at the same round, and Flower's 50-round run."""
    ref, rows = data.reference(), []
    labels = {"c2": "#C=2", "iid": "IID"}
    for part, r in NG_ROUNDS.items():
        for m, name in NG_NAMES.items():
            whole, small = ng_at(data, part, m), small_at(data, part, m)
            rows.append(f"| {labels[part]} | {r} | {name} | {fmt(mean(whole), 2)} +- {fmt(sd(whole), 2)} | "
                        f"{fmt(mean(small), 2)} | {fmt(ref[(m, 'mnist', part)])} |")
    return {"rows": "\n".join(rows)}


@claim("niidbench_gpu.size_gap", NG, "The whole MNIST is ahead at the same round in every cell, by {ilo} to "
       "{ihi} points under IID and {clo} to {chi} under #C=2")
def _(data):
    """Whole MNIST minus the 10,000 images, mean over seeds, at the same round, per method:
    its range under IID and under #C=2 (every difference positive)."""
    out = {}
    for key, part in (("i", "iid"), ("c", "c2")):
        gaps = [mean(ng_at(data, part, m)) - mean(small_at(data, part, m)) for m in NG_NAMES]
        if min(gaps) <= 0:
            raise ValueError(f"{part}: the whole MNIST is not ahead in every method")
        out.update({f"{key}lo": fmt(min(gaps)), f"{key}hi": fmt(max(gaps))})
    return out


@claim("niidbench_gpu.iid_flower", NG, "every method's mean at round 22 is within {bound} points of Flower's "
       "50-round run")
def _(data):
    """|mean at round 22 - Flower| under IID, the largest over the four methods (rounded up to
    the first decimal at which it is a bound)."""
    ref = data.reference()
    worst = max(abs(mean(ng_at(data, "iid", m)) - ref[(m, "mnist", "iid")]) for m in NG_NAMES)
    bound = dec(math.ceil(worst * 10)) / 10
    return {"bound": fmt(bound)}


@claim("niidbench_gpu.iid_fednova", NG, "FedNova and FedAvg differ by at most {gap} points at round 22")
def _(data):
    """Under IID every party takes the same steps (FedNova is FedAvg, equal on the CPU): the
    largest |FedNova - FedAvg| over the seeds at round 22 on the GPU."""
    gap = max(abs(a - b) for a, b in zip(ng_at(data, "iid", "fednova"), ng_at(data, "iid", "fedavg")))
    return {"gap": exact(gap)}


@claim("niidbench_gpu.c2_lead", NG, "SCAFFOLD is ahead in {k} of 3 seeds at round 14 (mean {s}% against FedProx "
       "{p}%, FedAvg {a}% and FedNova {n}%; in seed {other} FedAvg leads, {a_other}% against SCAFFOLD's {s_other}%). On the 10,000 images SCAFFOLD was the {small_rank} of the four at round 14")
def _(data):
    """#C=2 at round 14, whole MNIST: in how many seeds SCAFFOLD is the best of the four, the four
    means, and the seed where FedAvg leads instead; that SCAFFOLD's mean was the lowest of the four
    at round 14 on the 10,000 images."""
    at = {m: ng_at(data, "c2", m) for m in NG_NAMES}
    leaders = [max(NG_NAMES, key=lambda m: at[m][s]) for s in SEEDS]
    others = [s for s in SEEDS if leaders[s] != "scaffold"]
    if len(others) != 1 or leaders[others[0]] != "fedavg":
        raise ValueError(f"the leaders by seed are {leaders}")
    o = others[0]
    small = {m: mean(small_at(data, "c2", m)) for m in NG_NAMES}
    if min(small, key=small.get) != "scaffold":
        raise ValueError(f"on the 10,000 images at round 14 the means are {small}")
    return {"k": leaders.count("scaffold"), "s": fmt(mean(at["scaffold"]), 2), "p": fmt(mean(at["fedprox"]), 2),
            "a": fmt(mean(at["fedavg"]), 2), "n": fmt(mean(at["fednova"]), 2), "other": o,
            "a_other": fmt(at["fedavg"][o], 2), "s_other": fmt(at["scaffold"][o], 2), "small_rank": "lowest"}


@claim("niidbench_gpu.after_step", NG, "With NIID-Bench's reading (`correction=after_step`) all three seeds "
       "trained {r} rounds on the whole MNIST without diverging (round {r}: {a0}%, {a1}%, {a2}%; best {blo}% to "
       "{bhi}%), where on the 10,000 images {k} of 3 had diverged by round {r} (rounds {rounds})")
def _(data):
    """SCAFFOLD after_step under #C=2 on the whole MNIST: the round every seed reached (none
    diverged), each seed's accuracy there, the range of best rounds; the 10,000-image runs of the
    same reading that diverged by then and where (run.json)."""
    runs = ng_readings(data, "after_step")
    last = {max(data.curve(r)) for r in runs}
    if len(last) != 1 or any(diverged_at(r) for r in runs):
        raise ValueError(f"after_step: the runs stopped at {sorted(last)} or diverged")
    r = last.pop()
    small = [diverged_at(x) for x in readings(data, "mnist_c2_after_step", "scaffold")]
    early = [d for d in small if d is not None and d <= r]
    best = [data.best(x) for x in runs]
    return {"r": r, **{f"a{s}": fmt(data.at(runs[s], r), 2) for s in SEEDS}, "blo": fmt(min(best), 2),
            "bhi": fmt(max(best), 2), "k": len(early),
            "rounds": ", ".join(map(str, early))}


@claim("niidbench_gpu.gradient", NG, "The preset's reading reached round {r} in the population and round {ra} "
       "alone, without diverging in any seed; on the 10,000 images its first divergence came at round {first}")
def _(data):
    """SCAFFOLD with the preset's correction under #C=2, whole MNIST: the last round of the
    population's runs and of the 3 runs alone (none diverged), and the earliest divergence of
    the 10,000-image grid's SCAFFOLD #C=2 runs."""
    pop, alone = ng(data, "c2", "scaffold"), ng_readings(data, "gradient")
    if any(diverged_at(x) for x in alone) or len({max(data.curve(x)) for x in alone}) != 1:
        raise ValueError("the runs alone diverged or stopped at different rounds")
    first = min(d for d in (diverged_at(x) for x in nb(data, "c2", "scaffold")) if d is not None)
    return {"r": max(data.curve(pop[0])), "ra": max(data.curve(alone[0])), "first": first}


@claim("niidbench_gpu.alone", NG, "The same SCAFFOLD run alone and in the population differ by up to {gap} points "
       "of accuracy over rounds 1 to {r} under #C=2")
def _(data):
    """The preset's SCAFFOLD #C=2 runs, alone against the population's, same seed: the largest
    |difference| in test accuracy over the rounds both have (GPU runs are not bitwise repeatable)."""
    pop, alone = ng(data, "c2", "scaffold"), ng_readings(data, "gradient")
    r = max(data.curve(alone[0]))
    gap = max(abs(data.at(p, k) - data.at(a, k)) for p, a in zip(pop, alone) for k in range(1, r + 1))
    return {"gap": exact(gap), "r": r}


@claim("niidbench_gpu.speed", NG, "A round of the 12 #C=2 runs took {c2} s (median of rounds 2 to 14; "
       "{steps} lock-steps, the largest party's 10 epochs), of the 12 IID runs {iid} s ({isteps} lock-steps), "
       "with the two populations and SCAFFOLD's after-step runs ({after} s) sharing the GPU; SCAFFOLD's 3 runs "
       "alone took {alone} s a round, {ms} ms a lock-step for 30 clients")
def _(data):
    """rounds.csv wall_s (the population's round), median over rounds 2..last of each
    population; the largest party's local steps a round (clients.csv, all rounds and seeds);
    SCAFFOLD alone's median round over #C=2's lock-steps, in ms."""
    c2, iid = ng_speed(data)
    alone = median_wall(ng_readings(data, "gradient")[0])
    return {"c2": fmt(c2, 1), "steps": thousands(lock_steps(data, "c2")), "iid": fmt(iid, 1),
            "isteps": lock_steps(data, "iid"), "after": fmt(median_wall(ng_readings(data, "after_step")[0]), 1),
            "alone": fmt(alone, 1), "ms": fmt(alone * 1000 / lock_steps(data, "c2"), 0)}


@claim("niidbench_gpu.rest", NG, "the {rounds} rounds #C=2 still lacks would take {minutes} minutes at that speed")
def _(data):
    """(50 - the round #C=2 reached) x the median #C=2 population round above, in minutes."""
    rounds = hyper(ng(data, "c2", "fedavg")[0], "rounds") - NG_ROUNDS["c2"]
    return {"rounds": rounds, "minutes": fmt(ng_speed(data)[0] * rounds / 60, 0)}


NG_SPLIT = "niidbench_gpu/h200_2026-11-27b"  # the second loan: #C=2 afresh, one process a run


@claim("niidbench_gpu.split", NG, "all {n} runs reached rounds {lo} to {hi} in the call's {budget} s and none "
       "diverged: the preset's reading trained {g} rounds in every seed (round {g}: {g0}%, {g1}%, {g2}%), "
       "NIID-Bench's {a} (round {a}: {a0}%, {a1}%, {a2}%)")
def _(data):
    """The second loan's #C=2 runs (four methods and SCAFFOLD after_step, seeds 0-2, each its own
    process): the range of rounds they reached, that none diverged (run.json), and SCAFFOLD's
    accuracy per seed at the last round all three seeds of each reading reached."""
    runs = {m: [data.run(f"{NG_SPLIT}/niidbench/mnist_c2", m, s) for s in SEEDS] for m in NG_NAMES}
    after = [data.run(f"{NG_SPLIT}/readings/mnist_c2_after_step", "scaffold", s) for s in SEEDS]
    every = [r for group in runs.values() for r in group] + after
    last = [max(data.curve(r)) for r in every]
    if any(diverged_at(r) for r in every):
        raise ValueError("a run of the second loan diverged")
    out = {"n": len(last), "lo": min(last), "hi": max(last), "budget": 550}
    for key, group in (("g", runs["scaffold"]), ("a", after)):
        k = min(max(data.curve(r)) for r in group)
        out.update({key: k, **{f"{key}{s}": fmt(data.at(group[s], k), 2) for s in SEEDS}})
    return out


def ng_split_runs(data: Data) -> list[Run]:
    """The second loan's 15 processes: #C=2's 4 methods x seeds 0-2 and SCAFFOLD's after-step runs."""
    return [data.run(f"{NG_SPLIT}/niidbench/mnist_c2", m, s) for m in NG_NAMES for s in SEEDS] + \
           [data.run(f"{NG_SPLIT}/readings/mnist_c2_after_step", "scaffold", s) for s in SEEDS]


@claim("niidbench_gpu.split_speed", NG, "the 15 processes took {lo} to {hi} s a round each, together {split} "
       "run-rounds a second, where the first loan's populations advanced #C=2's 15 runs at {pop} run-rounds a second "
       "and 12 IID runs at {iid} besides")
def _(data):
    """Second loan: each run's median round (rounds 2..last; one process a run), their range and
    the sum of 1 / median (run-rounds a second, all 15).  First loan: 12 / the #C=2 population's
    median round + 3 / the after-step population's, and 12 / the IID population's (all sharing the GPU)."""
    walls = [median_wall(r) for r in ng_split_runs(data)]
    c2, iid = ng_speed(data)
    after = median_wall(ng_readings(data, "after_step")[0])
    return {"lo": fmt(min(walls), 1), "hi": fmt(max(walls), 1), "split": fmt(sum(1 / w for w in walls), 2),
            "pop": fmt(12 / c2 + 3 / after, 2), "iid": fmt(12 / iid, 2)}


@claim("niidbench_gpu.calls", NG, "#C=2 alone takes about {calls} calls of 9 minutes (50 rounds at {lo} to {hi} s a round)")
def _(data):
    """What #C=2's 50 rounds cost in GPU calls: the fastest median round of the second loan's
    processes and the first loan's population's median round (s, whole), and 50 rounds at their
    mean over a call's 540 s of budget, rounded half up."""
    lo, hi = min(median_wall(r) for r in ng_split_runs(data)), ng_speed(data)[0]
    return {"calls": fmt(50 * (lo + hi) / 2 / 540, 0), "lo": fmt(lo, 0), "hi": fmt(hi, 0)}


def median_wall(run: Run) -> Decimal:
    """A population's median round (rounds.csv wall_s) over rounds 2..last (round 1 warms up)."""
    df = read_rounds(run.path)
    return dec(statistics.median(float(w) for r, w in zip(df["round"], df["wall_s"]) if r >= 2))


def lock_steps(data: Data, part: str) -> int:
    """The largest party's local steps a round over the partition's GPU runs (the lock-step's length)."""
    return max(int(data.clients(r)["steps"].max()) for r in ng(data, part, "fedavg"))


def ng_speed(data: Data) -> tuple[Decimal, Decimal]:
    return median_wall(ng(data, "c2", "fedavg")[0]), median_wall(ng(data, "iid", "fedavg")[0])


# ----------------------------------------------------------------------------- NIID-Bench, FedProx's mu tuned

NT = "niidbench_tuned"
NT_CELLS = PARTITIONS  # every cell's FedProx mu was tuned (outputs/reproductions/niidbench_tuned/fedprox_mnist_<cell>)
NT_LAST = 10  # the objective: mean validation accuracy over the last 10 rounds (mean_val_acc_last_10)
NT_PRESET = "0.01"  # the presets' mu: the FedProx column of the grid above
NT_LABELS = {"dir05": "p_k ~ Dir(0.5)", "c1": "#C=1", "c2": "#C=2", "c3": "#C=3", "iid": "IID"}


def nt_folder(data: Data, cell: str) -> Path:
    return data.folder(f"niidbench_tuned/fedprox_mnist_{cell}")


def nt_choice(data: Data, cell: str) -> dict:
    import json

    c = json.loads((nt_folder(data, cell) / "choice.json").read_text())
    if c["objective"] != f"mean_val_acc_last_{NT_LAST}" or c["chosen"] is None:
        raise ValueError(f"{cell}: choice.json has objective {c['objective']}, chosen {c['chosen']}")
    return c


def nt_chosen(data: Data, cell: str) -> str:
    return nt_choice(data, cell)["chosen"]["aggregator.mu"]


def nt_tuned(data: Data, cell: str) -> list[Run]:
    """FedProx at the cell's chosen mu, seeds 0-2 on the test set: the protocol's test runs (where
    the choice is the presets' 0.01, the grid's FedProx runs have the same setting but were made by
    an earlier fedrun: see niidbench_tuned.test)."""
    mu = nt_chosen(data, cell)
    runs = [load_run(nt_folder(data, cell) / "test" / f"mu{mu}_seed{s}") for s in SEEDS]
    for r in runs:
        if float(aggregator(r, "mu")) != float(mu):
            raise ValueError(f"{r.path}: mu {aggregator(r, 'mu')}, not the chosen {mu}")
    return runs


@claim("niidbench_tuned.grid", NT, "{rows}")
def _(data):
    """Per cell: every mu of NIID-Bench's grid scored by its tuning run's mean validation accuracy
    over the last 10 rounds (%, recomputed from rounds.csv and checked against choice.json), and
    the chosen mu (the best)."""
    rows = []
    for cell in NT_CELLS:
        c = nt_choice(data, cell)
        (key, values), = c["grid"].items()
        cells = []
        for value, row in zip(values, c["rows"]):
            df = read_rounds(nt_folder(data, cell) / "tune" / f"mu{value}_seed0")
            score = mean(pct(a) for a in list(df["val_acc"].dropna())[-NT_LAST:])
            if abs(float(score) - 100 * row["mean"]) > 1e-6:
                raise ValueError(f"{cell}, mu {value}: choice.json's score {row['mean']} is not the run's {score}")
            cells.append(f"{value}: {fmt(score, 2)}")
        best = max(zip(values, c["rows"]), key=lambda vr: vr[1]["mean"])[0]
        if c["chosen"][key] != best:
            raise ValueError(f"{cell}: the choice {c['chosen'][key]} is not the best point {best}")
        tuned = [data.final(r) for r in nt_tuned(data, cell)]
        shown = ", ".join("diverged" if v is None else exact(v) for v in tuned)
        done = [v for v in tuned if v is not None]
        rows.append(f"| {NT_LABELS[cell]} | {', '.join(cells)} | {best} | {shown} | "
                    f"{fmt(mean(done))} | {fmt(cell_mean(data, cell, 'fedprox'))} | {fmt(cell_mean(data, cell, 'fedavg'))} |")
    return {"rows": "\n".join(rows)}


@claim("niidbench_tuned.picks", NT, "The validation split picks mu = {picks}")
def _(data):
    """Which mu each cell's validation split picks, grouped by mu (smallest first), the presets'
    0.01 named as such."""
    chosen = {cell: nt_chosen(data, cell) for cell in NT_CELLS}
    groups = []
    for mu in sorted(set(chosen.values()), key=float):
        cells = joined(NT_LABELS[c] for c in NT_CELLS if chosen[c] == mu)
        preset = " (the presets')" if mu == NT_PRESET else ""
        groups.append(f"{mu}{preset} under {cells}")
    return {"picks": joined(groups)}


@claim("niidbench_tuned.close", NT, "Under IID the best three of the four mu score within {iid} points of each other, "
       "under Dir(0.5) the best two within {dir05}")
def _(data):
    """The spread of the best validation scores (%, mean over the last 10 rounds) where the split
    hardly separates the mu: IID's best three, Dir(0.5)'s best two."""
    def spread(cell, top):
        scores = sorted((100 * r["mean"] for r in nt_choice(data, cell)["rows"]), reverse=True)[:top]
        return fmt(dec(scores[0]) - dec(scores[-1]), 2)
    return {"iid": spread("iid", 3), "dir05": spread("dir05", 2)}


@claim("niidbench_tuned.versus", NT, "Where the tuned mu is not the presets', FedProx at it ends above FedProx at 0.01 "
       "in {above_preset} of {n} (cell, seed) pairs and above FedAvg in {above_avg} of {n}")
def _(data):
    """Over the cells whose chosen mu is not 0.01 and their seeds: the tuned FedProx's final
    accuracy against the grid's FedProx (mu 0.01) and FedAvg of the same seed (a diverged run
    counts as below)."""
    above_preset = above_avg = n = 0
    for cell in NT_CELLS:
        if nt_chosen(data, cell) == NT_PRESET:
            continue
        for t, p, a in zip(nt_tuned(data, cell), nb(data, cell, "fedprox"), nb(data, cell, "fedavg")):
            t, p, a = (data.final(r) for r in (t, p, a))
            n += 1
            above_preset += t is not None and (p is None or t > p)
            above_avg += t is not None and (a is None or t > a)
    return {"above_preset": above_preset, "above_avg": above_avg, "n": n}


@claim("niidbench_tuned.moves", NT, "In the means, the tuned mu moves FedProx by {dir05}, {c3} and {iid} points under "
       "Dir(0.5), #C=3 and IID, and by {c1} under #C=1")
def _(data):
    """Where the chosen mu is not 0.01: FedProx's mean final accuracy at it minus the grid's mean at
    0.01 (points, signed, two decimals)."""
    out = {}
    for cell in ("dir05", "c3", "iid", "c1"):
        if nt_chosen(data, cell) == NT_PRESET:
            raise ValueError(f"{cell}: the tuned mu is the presets'")
        d = mean(data.final(r) for r in nt_tuned(data, cell)) - cell_mean(data, cell, "fedprox")
        out[cell] = ("+" if d > 0 else "") + fmt(d, 2)
    return out


@claim("niidbench_tuned.test", NT, "The protocol's test runs of #C=2 (mu = {mu}, the presets') equal the grid's FedProx "
       "runs in every column of rounds.csv but the timings, in {n} of 3 seeds")
def _(data):
    """#C=2, whose chosen mu is the grid's: the protocol's test runs against the grid's FedProx
    runs of the same seeds, column by column (those both CSVs have, the ``*_s`` timings left out)."""
    mu = nt_chosen(data, "c2")
    same = 0
    for test, grid_run in zip(nt_tuned(data, "c2"), nb(data, "c2", "fedprox")):
        if float(mu) != float(aggregator(grid_run, "mu")):
            raise ValueError(f"the tuned mu {mu} is not the grid's {aggregator(grid_run, 'mu')}")
        a, b = read_rounds(test.path), read_rounds(grid_run.path)
        columns = [c for c in b.columns if c in a.columns and not c.endswith("_s")]
        same += a[columns].equals(b[columns])
    return {"mu": mu, "n": same}


# ----------------------------------------------------------------------------- NIID-Bench, whole MNIST, CPU

NW = "niidbench_whole"
# SCAFFOLD under #C=2 on the whole MNIST, each reading of its correction: (its whole-MNIST folder,
# the 10,000-image folder of the same reading), below outputs/reproductions.
NW_READINGS = {"gradient": ("niidbench_whole/mnist_c2", "niidbench/mnist_c2"),
               "after_step": ("niidbench_whole_readings/mnist_c2_after_step", "niidbench_readings/mnist_c2_after_step")}
NW_LABELS = {"gradient": "the preset's (`gradient`)", "after_step": "NIID-Bench's (`after_step`)"}
NW_ROUNDS = 50


def nw_runs(data: Data, reading: str, whole: bool = True) -> dict[int, Run]:
    """SCAFFOLD's #C=2 runs of a reading by seed, on the whole MNIST (``whole``) or the first 10,000
    images; the seeds not started yet are absent."""
    folder = NW_READINGS[reading][0 if whole else 1]
    return {run.seed: run for run in data.runs(folder, "scaffold")}


def nw_state(data: Data, run: Run | None) -> str:
    """A run as the table gives it: its final (best) accuracy, the round it diverged at, or, when
    it has not finished, the last round it reached and its accuracy there."""
    if run is None:
        return "not started"
    d = diverged_at(run)
    if d is not None:
        return f"diverged at {d}"
    curve = data.curve(run)
    last = max(curve)
    if run.finished:
        return f"{exact(curve[last])} ({exact(max(curve.values()))})"
    return f"round {last}: {exact(curve[last])} (unfinished)"


@claim("niidbench_whole.rows", NW, "{rows}")
def _(data):
    """SCAFFOLD #C=2 per reading and seed: final (best) accuracy on the whole MNIST, or where it
    diverged, or the round an unfinished run has reached; beside the same run on 10,000 images."""
    rows = []
    for reading, label in NW_LABELS.items():
        whole, small = nw_runs(data, reading), nw_runs(data, reading, whole=False)
        for seed in SEEDS:
            rows.append(f"| {label} | {seed} | {nw_state(data, whole.get(seed))} | {nw_state(data, small.get(seed))} |")
    return {"rows": "\n".join(rows)}


def nw_finished(data: Data) -> list[tuple[str, int, Run]]:
    """(reading, seed, run) of every whole-MNIST SCAFFOLD #C=2 run that ran its 50 rounds or diverged."""
    out = []
    for reading in NW_READINGS:
        for seed, run in sorted(nw_runs(data, reading).items()):
            if run.finished or diverged_at(run) is not None:
                out.append((reading, seed, run))
    return out


NW_PARTITIONS = {"dir05": "p_k ~ Dir(0.5)", "c1": "#C=1", "c2": "#C=2", "c3": "#C=3", "iid": "IID"}
NW_METHODS = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova"}


def nw_table_runs(data: Data, partition: str, method: str) -> list[Run]:
    """A whole-MNIST Table III cell's runs that have started (none where its row has not)."""
    name = f"{NW}/mnist_{partition}"
    return data.runs(name, method) if data.folder(name).is_dir() else []


def nw_all_runs(data: Data) -> list[Run]:
    """Every run of the whole-MNIST Table III that has started, row by row."""
    return [r for part in NW_PARTITIONS for m in NW_METHODS for r in nw_table_runs(data, part, m)]


def nw_cell(data: Data, partition: str, method: str) -> str:
    """One cell of the whole-MNIST Table III as far as its runs go: the finished runs' final
    accuracy, mean +- sd over seeds, then the best round's mean (as the 10,000-image table), with
    ``[seeds ...]`` while the cell lacks a seed; the diverged runs (``k div``, their
    rounds) and the runs stopped part way (``seed s at round r``) after it; ``-`` where no run has
    started."""
    runs = nw_table_runs(data, partition, method)
    done = [r for r in runs if r.finished]
    div = [(r.seed, diverged_at(r)) for r in runs if diverged_at(r) is not None]
    parts = []
    if done:
        finals_ = [data.final(r) for r in done]
        text = fmt(mean(finals_)) + (f" +- {fmt(sd(finals_))}" if len(done) > 1 else "")
        text += f" / {fmt(mean(data.best(r) for r in done))}"
        if len(done) + len(div) < len(SEEDS):  # the cell is not complete: which seeds the mean is over
            text += f" [seed{'s' if len(done) > 1 else ''} {', '.join(str(r.seed) for r in done)}]"
        parts.append(text)
    if div:
        parts.append(f"{len(div)} div (round{'s' if len(div) > 1 else ''} {', '.join(str(d) for _, d in div)})")
    for r in runs:
        if not r.finished and diverged_at(r) is None:
            curve = data.curve(r) if (r.path / "rounds.csv").is_file() else {}
            parts.append(f"seed {r.seed} at round {max(curve) if curve else 0}")
    return ", ".join(parts) if parts else "-"


@claim("niidbench_whole.table", NW, "{rows}")
def _(data):
    """Table III's MNIST rows on the whole MNIST as far as the CPU runs go (outputs/reproductions/
    niidbench_whole): per partition and method the finished runs' final accuracy (mean +- sd /
    the best round's mean, the seeds when not all three), the diverged runs and the ones stopped
    part way, beside Flower's one run."""
    ref = data.reference()
    rows = ["| partition | " + " | ".join(f"{name} | Flower" for name in NW_METHODS.values()) + " |",
            "|---|" + "---|" * 2 * len(NW_METHODS)]
    for part, label in NW_PARTITIONS.items():
        cells = [f"{nw_cell(data, part, m)} | {fmt(ref[(m, 'mnist', part)])}" for m in NW_METHODS]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return {"rows": "\n".join(rows)}


def signed(x, digits: int = 1) -> str:
    """A difference with its sign, rounded as :func:`fmt` (+0.1, -2.8, 0.0)."""
    text = fmt(x, digits)
    return text if text.startswith("-") or Decimal(text).is_zero() else "+" + text


@claim("niidbench_whole.flower", NW, "{items}")
def _(data):
    """Per cell with a finished whole-MNIST run: its mean final accuracy minus Flower's one run
    (points, on the unrounded mean), and the same for the cell's 10,000-image runs (outputs/
    reproductions/niidbench; "all diverged" where none finished): how much of the 10,000-image
    grid's gap to Flower the whole MNIST closes."""
    ref, items = data.reference(), []
    for part, label in NW_PARTITIONS.items():
        for m, name in NW_METHODS.items():
            done = [r for r in nw_table_runs(data, part, m) if r.finished]
            if not done:
                continue
            flower = ref[(m, "mnist", part)]
            small = [v for v in finals(data, part, m) if v is not None]
            was = f"{signed(mean(small) - flower)}" if small else "all diverged"
            items.append(f"{name} under {label} {signed(mean(data.final(r) for r in done) - flower)} "
                         f"(first 10,000 images: {was})")
    return {"items": "; ".join(items)}


@claim("niidbench_whole.dir05", NW, "under Dir(0.5) the {n} cells with a finished run are within {d} points of "
       "Flower's run")
def _(data):
    """The whole-MNIST Dir(0.5) cells with a finished run: the largest distance of their mean final
    accuracy from Flower's one run (points), where the 10,000-image grid was 2.1 to 2.3 below."""
    ref, gaps = data.reference(), []
    for m in NW_METHODS:
        done = [r for r in nw_table_runs(data, "dir05", m) if r.finished]
        if done:
            gaps.append(abs(mean(data.final(r) for r in done) - ref[(m, "mnist", "dir05")]))
    if not gaps:
        raise ValueError("no Dir(0.5) run has finished on the whole MNIST")
    return {"n": words(len(gaps)), "d": fmt(max(gaps))}


def nw_ranked(cell_finals: dict[str, list[Decimal | None]]) -> list[tuple[str, Decimal | None, int]]:
    """The methods of a row by mean final accuracy over their seeds that did not diverge, highest
    first, each as (method, mean or None when every seed diverged, seeds that diverged); the
    methods with no finished seed last."""
    out = []
    for m, values in cell_finals.items():
        done = [v for v in values if v is not None]
        out.append((m, mean(done) if done else None, len(values) - len(done)))
    return sorted(out, key=lambda x: (x[1] is None, -(x[1] or 0)))


def nw_seed_leaders(cell_finals: dict[str, list[Decimal | None]]) -> list[str]:
    """Per seed, the method(s) with the highest final accuracy (a diverged run is below any
    finished one); ``A = B`` for a tie."""
    out = []
    for i in range(len(SEEDS)):
        seed = {m: v[i] for m, v in cell_finals.items() if v[i] is not None}
        if not seed:
            out.append("none finished")
            continue
        top = max(seed.values())
        out.append(" = ".join(NW_METHODS[m] for m in cell_finals if seed.get(m) == top))
    return out


@claim("niidbench_whole.order", NW, "{rows}")
def _(data):
    """Per row of the whole-MNIST Table III whose 12 runs have all ended (finished or diverged):
    the methods by mean final accuracy (%, over their seeds that did not diverge, two decimals),
    highest first, with the points each trails the first (on the unrounded means); which method ends
    highest in each seed; and the same row's order on the first 10,000 images (the grid above).
    The rows not ended yet are named, not left out unsaid."""
    rows, open_ = [], []
    for part, label in NW_PARTITIONS.items():
        runs = {m: {r.seed: r for r in nw_table_runs(data, part, m)} for m in NW_METHODS}
        ended = all(s in runs[m] and (runs[m][s].finished or diverged_at(runs[m][s]) is not None)
                    for m in NW_METHODS for s in SEEDS)
        if not ended:
            open_.append(label)
            continue
        whole = {m: [data.final(runs[m][s]) for s in SEEDS] for m in NW_METHODS}
        ranked = nw_ranked(whole)
        first = ranked[0][1]
        items = []
        for m, value, div in ranked:
            text = NW_METHODS[m] + (f" {fmt(value, 2)}" if value is not None else " (every seed diverged)")
            if value is not None and m != ranked[0][0]:
                text += f" ({signed(value - first, 2)})"
            if div and value is not None:
                text += f" [{div} of {len(SEEDS)} diverged]"
            items.append(text)
        small = [NW_METHODS[m] for m, _, _ in nw_ranked({m: finals(data, part, m) for m in NW_METHODS})]
        leaders = nw_seed_leaders(whole)
        rows.append(f"under {label}: {', '.join(items)}; highest in seed "
                    + ", ".join(f"{s}: {who}" for s, who in zip(SEEDS, leaders))
                    + f"; on the first 10,000 images {', '.join(small)}")
    if not rows:
        return {"rows": f"no row has all its {len(NW_METHODS) * len(SEEDS)} runs ended yet"}
    tail = f" (rows not ended yet: {joined(open_)})" if open_ else ""
    return {"rows": "; ".join(rows) + tail}


@claim("niidbench_whole.count", NW, "{done} of the table's {total} runs have finished, {div} diverged and {part} "
       "stopped part way")
def _(data):
    """How far the whole-MNIST Table III has come: runs finished, diverged, and stopped part way
    (their checkpoints in the folder's resume.tar.gz), of the 5 partitions x 4 methods x 3 seeds."""
    runs = nw_all_runs(data)
    div = sum(diverged_at(r) is not None for r in runs)
    done = sum(r.finished for r in runs)
    part = len(runs) - done - div
    return {"done": done, "total": len(NW_PARTITIONS) * len(NW_METHODS) * len(SEEDS),
            "div": words(div) if div else "none", "part": words(part) if part else "none"}


@claim("niidbench_whole.minutes", NW, "{lo} to {hi} minutes a run ({n} runs finished on the whole MNIST, two at a "
       "time), so a two-hour sitting finishes about {per} runs")
def _(data):
    """The time a finished whole-MNIST CPU run took in its rounds (summary.json's round_seconds,
    resumes' gaps left out), over the table's runs and SCAFFOLD's after_step reading runs; a
    sitting's runs: two at a time, 120 minutes over their mean."""
    runs = nw_all_runs(data)
    runs += nw_runs(data, "after_step").values()
    minutes = [dec(r.summary["round_seconds"]) / 60 for r in runs if r.finished]
    return {"lo": fmt(min(minutes), 0), "hi": fmt(max(minutes), 0), "n": len(minutes),
            "per": fmt(2 * 120 / mean(minutes), 0)}


@claim("niidbench_whole.none", NW, "{none} of the {n} runs that have ended on the whole MNIST diverged, where on the "
       "10,000 images {k} of the same {n} (reading, seed) pairs did (at rounds {rounds})")
def _(data):
    """The whole-MNIST SCAFFOLD #C=2 runs that ended (both readings): how many diverged (as a word,
    "None" when none did), and how many of the same (reading, seed) diverged on the 10,000 images,
    at which rounds."""
    ended = nw_finished(data)
    if not ended:
        raise ValueError("no whole-MNIST SCAFFOLD run has ended")
    diverged = sum(diverged_at(run) is not None for _, _, run in ended)
    small = [diverged_at(nw_runs(data, reading, whole=False)[seed]) for reading, seed, _ in ended]
    early = [d for d in small if d is not None]
    return {"none": WORDS[diverged].capitalize() if diverged else "None", "n": len(ended), "k": len(early),
            "rounds": joined(map(str, early))}


@claim("niidbench_whole.ends", NW, "they end at {lo}% to {hi}% (best rounds {blo}% to {bhi}%), against Flower's "
       "one run at {flower}%")
def _(data):
    """The finished whole-MNIST SCAFFOLD #C=2 runs' final and best accuracies (ranges over both
    readings and the seeds), and Flower's SCAFFOLD #C=2 number (one run, whole MNIST)."""
    runs = [run for _, _, run in nw_finished(data) if run.finished]
    finals_, bests = [data.final(r) for r in runs], [data.best(r) for r in runs]
    return {"lo": exact(min(finals_)), "hi": exact(max(finals_)), "blo": exact(min(bests)), "bhi": exact(max(bests)),
            "flower": fmt(data.reference()[("scaffold", "mnist", "c2")])}


@claim("niidbench_whole.swings", NW, "after round 20, {k} of the {n} finished runs still fall below 90% at least "
       "once ({lows}) and are back above 90% within {back} rounds")
def _(data):
    """The finished whole-MNIST SCAFFOLD #C=2 runs whose test accuracy falls below 90% after round
    20, each with its lowest point there (by reading and seed), and the most rounds any of them took
    from that low to 90% or more again: the swings of a label-skewed federation, not divergence."""
    items, back, n = [], 0, 0
    for reading, seed, run in nw_finished(data):
        if not run.finished:
            continue
        n += 1
        curve = data.curve(run)
        at, low = min(((r, v) for r, v in curve.items() if r > 20), key=lambda rv: rv[1])
        if low >= 90:
            continue
        again = [r for r, v in curve.items() if r > at and v >= 90]
        if not again:
            raise ValueError(f"{run.path}: not back above 90% after round {at}")
        back = max(back, again[0] - at)
        items.append(f"{'preset' if reading == 'gradient' else reading} seed {seed}: {exact(low)}% at round {at}")
    return {"k": WORDS.get(len(items), len(items)), "n": WORDS.get(n, n), "lows": "; ".join(items), "back": back}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    data = Data(args.root)
    if args.write:
        path = Path(args.root) / DOC
        text, changed = write_marked(path.read_text(), data)
        if changed:
            path.write_text(text)
        print(f"{DOC}: " + (f"rewrote {', '.join(changed)}" if changed else "every marked claim as the runs say"))
        args.check = True
    doc = (Path(args.root) / DOC).read_text() if args.check else ""
    ok = True
    for section in args.section or sections():
        print(f"[{section}]")
        for c, text, error in render_section(section, data):
            if error is not None:
                print(f"{c.id}: CANNOT BE COMPUTED: {error}")
                ok = False
                continue
            missing = args.check and not in_doc(text, doc)
            print(f"{c.id}: {text}" + ("    <-- NOT IN docs/reproductions.md" if missing else ""))
            ok = ok and not missing
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
