#!/usr/bin/env python
"""Reproduce Tables 4-10 of "On federated learning of deep networks from non-IID data: parameter
divergence and the effects of hyperparametric methods": test accuracy of NetA/B/C and ResNet
models under vanilla (centralized) training with batch 50 / 500, and federated training (10
learners x 5000 examples, B = 50, E = 1) with IID and non-IID(2) data, for each optimizer
(pure SGD, Nesterov momentum and Adam, with the optimizer state averaged (-A) or kept per learner
(-WB)), network depth and width, weight decay, Batch (Re)Normalization, data augmentation and
Dropout.  Each printed cell is ``final (best)`` in %, beside the paper's ``final (best)`` and the
difference of the final accuracies.

Every row of the paper's tables (``../shared/papers/targets/parameter_divergence_tables4-10_accuracy.csv``,
transcribed in ``scripts/paper_targets/``) is one fedrun run:

=====================  ==========================================================================
table column           fedrun override
=====================  ==========================================================================
dataset                ``dataset=cifar10`` / ``dataset=svhn``
network                ``model=neta_baseline`` ... (NetA-Baseline -> neta_baseline, ResNet-14 -> resnet14)
optimizer              ``hyperparams=pd_sgd | pd_nmom_a | pd_nmom_wb | pd_adam_a | pd_adam_wb``
variant                ``wd=X`` -> ``hyperparams.weight_decay=X``; ``bn`` / ``brn`` -> ``model.norm=bn|brn``;
                       ``da`` -> ``hyperparams.augment=true``; ``do`` -> ``model.dropout=true``
setting                ``experiment=pd/vanilla_bs50 | pd/vanilla_bs500 | pd/iid | pd/noniid2``
=====================  ==========================================================================

Identical runs are run once: NetA-Baseline with NMom-A appears in every table, ``wd=0.00005`` is
the baseline weight decay (no override), and in vanilla training (a single learner) -WB and -A
are the same run (the paper prints the same numbers for both), so the -A run stands for both.

``run --out DIR``
    Launch every run of the chosen tables still missing, as ``fedrun -m`` sweeps: one per dataset,
    setting, optimizer and variant over its networks x seeds, into
    ``DIR/<dataset>/<setting>/<network>_<optimizer>[_<variant>]_seed<seed>`` (``hydra.sweep.dir``
    ``DIR/<dataset>/<setting>``, ``hydra.sweep.subdir`` the run's name; logs in ``DIR/logs``), then
    collect ``DIR``.  ``--population`` adds ``hydra/launcher=population``: the runs of a sweep that
    share a network (its seeds) train together.  A finished run (``summary.json``) is never
    redone; one that started but did not finish is skipped and reported unless ``--resume``
    continues it (``resume=true``, in sweeps of their own).  ``--tables 4,8``,
    ``--settings iid,noniid2``, ``--datasets cifar10``, ``--networks NetA-Baseline``,
    ``--optimizers nmom-a,adam-a`` and ``--variants none,bn`` pick a subset; ``--smoke`` adds
    ``scale=smoke`` (``--scale tiny``: 3 rounds on 300 images); ``--seeds 0,1,2`` repeats every
    run; ``--set KEY=VALUE`` adds an override to every run (e.g. ``device=cuda``);
    ``--substitute cifar10=cifar10_jpeg`` reads CIFAR-10's JPEG quality-75 copy ("CIFAR-10 (JPEG
    q75 copy)" in every table and title), ``--substitute cifar10=synthetic`` runs ``dataset=synthetic
    dataset.channels=3 dataset.image_size=32``, in place of an unavailable dataset (the run keeps
    the tag ``tags.dataset=cifar10`` it stands for and is marked as substituted); ``--dry-run``
    prints the plan and the commands.
    Cost at the paper's scale: a federated NetA-Baseline run is 200-300 rounds of 10 x 100 local
    steps, a vanilla run 100 epochs of CIFAR-10: a GPU job; the whole of Tables 4-10 is
    228 distinct runs (one seed).

``collect DIR [DIR ...]``
    Find every run directory below the DIRs, identify its row from its ``config.yaml``
    (``choices`` -> experiment, model, hyperparams; ``hyperparams.weight_decay``, ``model.norm``,
    ``model.dropout``, ``hyperparams.augment``; ``tags.dataset`` or ``dataset.name``), and print
    each table as the paper lays it out, with NOTES on smoke-scale runs, substituted data, other
    departures from the paper's setting, missing runs and runs that match no row.  Several seeds of
    one run are averaged (``xN``).  ``--csv PATH`` writes a tidy CSV (by default none: ``collect``
    never writes into the DIRs it reads unless asked; ``run`` writes OUT/pd_tables.csv).

Examples (from the repository root)::

    python scripts/pd/tables.py run --out outputs/pd --tables 4 --settings iid,noniid2   # GPU
    python scripts/pd/tables.py run --out outputs/pd_tiny --scale tiny --substitute cifar10=synthetic \\
        --substitute svhn=synthetic --tables 4                                         # CPU check
    python scripts/pd/tables.py run --out outputs/pd --dry-run                        # the plan
    python scripts/pd/tables.py collect outputs/pd --csv outputs/pd/pd_tables.csv
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # python scripts/pd/tables.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.common import grid, tables
from scripts.common.papers import half_up, count_notes, group, one_line_errors, setting_deviations

from fedrun.errors import UsageError
from fedrun.paths import conf_options
from fedrun import results
from fedrun.results import Run, folders, load_runs

PAPER_CSV = "parameter_divergence_tables4-10_accuracy.csv"  # in scripts/paper_targets, as in ../shared

TABLES = ("table4", "table5", "table6", "table7", "table8", "table9", "table10")
TABLE_TITLES = {
    "table4": "Table 4: NetA-Baseline, optimizers",
    "table5": "Table 5: network depth",
    "table6": "Table 6: network width",
    "table7": "Table 7: NetA-Baseline, weight decay levels",
    "table8": "Table 8: NetA-Baseline with/without Batch Normalization (BN) / Renormalization (BRN)",
    "table9": "Table 9: NetA-Baseline with/without data augmentation (DA)",
    "table10": "Table 10: NetA-Baseline with/without Dropout (DO)",
}
DATASETS = ("cifar10", "svhn")
DATASET_LABELS = {"cifar10": "CIFAR-10", "svhn": "SVHN"}
SETTINGS = ("vanilla_bs50", "vanilla_bs500", "iid", "noniid2")  # the tables' columns; noniid1 has none
SETTING_LABELS = {"vanilla_bs50": "Vanilla BS:50", "vanilla_bs500": "Vanilla BS:500", "iid": "IID",
                  "noniid2": "Non-IID(2)", "noniid1": "Non-IID(1)"}
NETWORKS = {
    "NetA-Baseline": "neta_baseline", "NetA-Deeper": "neta_deeper", "NetA-Deepest": "neta_deepest",
    "NetA-Narrower": "neta_narrower", "NetA-Narrowest": "neta_narrowest",
    "NetB-Baseline": "netb_baseline", "NetB-Wider": "netb_wider", "NetB-Widest": "netb_widest",
    "NetC-Baseline": "netc_baseline", "NetC-Wider": "netc_wider", "NetC-Widest": "netc_widest",
    "ResNet-14": "resnet14", "ResNet-20": "resnet20",
}
NETWORK_BY_OPTION = {v: k for k, v in NETWORKS.items()}
OPTIMIZERS = {"pure-sgd": "pd_sgd", "nmom-wb": "pd_nmom_wb", "nmom-a": "pd_nmom_a",
              "adam-wb": "pd_adam_wb", "adam-a": "pd_adam_a"}
OPTIMIZER_BY_OPTION = {v: k for k, v in OPTIMIZERS.items()}
OPTIMIZER_LABELS = {"pure-sgd": "pure SGD", "nmom-wb": "NMom-WB", "nmom-a": "NMom-A",
                    "adam-wb": "Adam-WB", "adam-a": "Adam-A"}
VARIANT_LABELS = {"bn": "BN", "brn": "BRN", "da": "DA", "do": "DO"}
BASE_WEIGHT_DECAY = 5e-5  # sec. 2.2: "The baseline value of the weight decay factor is set to 0.00005"
# The paper's setting (sec. 2.2, Table 1, Appendix A.2 and C), for the NOTES on departures.
FEDERATED = {"num_clients": 10, "client_fraction": 1.0, "local_epochs": 1, "batch_size": 50}  # 10 learners, E=1, B=50
PAPER_SETTING = {
    "iid": {"rounds": 200, **FEDERATED}, "noniid2": {"rounds": 300, **FEDERATED},
    "noniid1": {"rounds": 300, **FEDERATED},
    # Vanilla: one learner holding the whole training set (``mode=centralized``), 100 epochs.
    "vanilla_bs50": {"rounds": 100, "local_epochs": 1, "batch_size": 50},
    "vanilla_bs500": {"rounds": 100, "local_epochs": 1, "batch_size": 500},
}
PAPER_LR = {"pure-sgd": 0.05, "nmom-wb": 0.01, "nmom-a": 0.01, "adam-wb": 0.001, "adam-a": 0.001}
IMAGE_SHAPE = (3, 32)  # CIFAR-10's and SVHN's (channels, size): a synthetic stand-in takes it
CSV_NAME = "pd_tables.csv"
CSV_COLUMNS = ["table", "dataset", "network", "optimizer", "variant", "setting", "final", "best",
               "paper_final", "paper_best", "diff_final", "diff_best", "n_runs", "run_dirs", "notes"]


# ----------------------------------------------------------------------------- rows and runs

@dataclass(frozen=True)
class Target:
    """One row of the paper's CSV: a cell of one of the paper's tables."""

    table: str
    dataset: str
    network: str
    optimizer: str
    variant: str
    setting: str
    final: float | None
    best: float | None

    @property
    def key(self) -> tuple:
        return run_key(self.dataset, self.network, self.optimizer, self.variant, self.setting)


def _float(text: str | None) -> float | None:
    return None if text in (None, "", "-") else float(text)


def paper_rows(path: str | Path | None = None) -> list[Target]:
    """The paper's rows, in order: ``scripts/paper_targets``' transcription, or the CSV at ``path``."""
    return [Target(r["table"], r["dataset"], r["network"], r["optimizer"], r["variant"] or "", r["setting"],
                   _float(r["final_acc_pct"]), _float(r["best_acc_pct"])) for r in tables.paper_csv(path, PAPER_CSV)]


def canonical_variant(variant: str) -> str:
    """``wd=0.00005`` (the baseline) -> ``''``; ``wd=0.0`` -> ``wd=0``; parts sorted and joined by ``+``."""
    parts = []
    for part in filter(None, (variant or "").split("+")):
        if part.startswith("wd="):
            value = float(part[3:])
            if math.isclose(value, BASE_WEIGHT_DECAY, rel_tol=1e-9, abs_tol=1e-15):
                continue
            part = f"wd={value:g}"
        parts.append(part)
    return "+".join(sorted(parts))


def run_key(dataset: str, network: str, optimizer: str, variant: str, setting: str) -> tuple:
    """What identifies one fedrun run: (dataset, network, optimizer, variant, setting), canonical.

    Vanilla training has a single learner, so averaging its optimizer state (-A) or not (-WB)
    is the same run: -WB maps to -A there.
    """
    if setting.startswith("vanilla") and optimizer.endswith("-wb"):
        optimizer = optimizer[: -len("-wb")] + "-a"
    return dataset, network, optimizer, canonical_variant(variant), setting


# A variant's parts as fedrun overrides (weight decay is ``wd=X``).
VARIANT_OVERRIDES = {"bn": "model.norm=bn", "brn": "model.norm=brn", "da": "hyperparams.augment=true",
                     "do": "model.dropout=true"}


def variant_overrides(variant: str) -> list[str]:
    """The fedrun overrides of a (canonical) variant."""
    out = []
    for part in filter(None, variant.split("+")):
        if part.startswith("wd="):
            out.append(f"hyperparams.weight_decay={float(part[3:])!r}")
        elif part in VARIANT_OVERRIDES:
            out.append(VARIANT_OVERRIDES[part])
        else:
            raise ValueError(f"unknown variant {part!r}")
    return out


def _middle(key: tuple) -> str:
    """``<optimizer>[_<variant>]``: what a run's folder name says between its network and seed."""
    _dataset, _network, optimizer, variant, _setting = key
    slug = variant.replace("=", "").replace("+", "_")
    return f"{optimizer}{'_' + slug if slug else ''}"


def run_name(key: tuple, seed) -> str:
    """``<network option>_<optimizer>[_<variant>]_seed<seed>``, e.g. ``neta_baseline_nmom-a_wd0.0005_seed0``."""
    return f"{NETWORKS[key[1]]}_{_middle(key)}_seed{seed}"


def sweep_subdir(key: tuple) -> str:
    """``hydra.sweep.subdir`` of a sweep over networks and seeds of ``key``'s optimizer and variant:
    each job's folder is :func:`run_name` (the network is the job's ``model`` option)."""
    return "${hydra:runtime.choices.model}_" + _middle(key) + "_seed${seed}"


def run_dir(out: Path, key: tuple, seed) -> Path:
    return out / key[0] / key[4] / run_name(key, seed)


def substitution_overrides(substitutes: dict[str, str], dataset: str) -> list[str]:
    """The overrides that run ``substitutes[dataset]`` in place of ``dataset`` (none without one)."""
    option = substitutes.get(dataset)
    if option is None:
        # SVHN's train set has 4,659 nines and 4,948 zeros: the class-balanced 10 x 5,000 pool of
        # the presets (dataset.per_class) takes the rest from its extra set, as the paper's code does.
        return [f"dataset={dataset}", *(["dataset.load.extra=10000"] if dataset == "svhn" else [])]
    # A stand-in has its own class sizes: no class-balanced pool of the real dataset's size.
    return [*grid.substitute_overrides(option, IMAGE_SHAPE),
            *(["dataset.per_class=null"] if option == "synthetic" else [])]


def run_overrides(key: tuple, seeds, substitutes: dict[str, str] | None = None, scale: str | None = None,
                  networks: list[str] | None = None) -> list[str]:
    """The overrides of ``key``'s run (``seeds``: one seed, or a list swept by ``fedrun -m``; the
    ``networks`` swept in place of ``key``'s), but not where it goes (and not ``progress``/extras).
    ``tags.dataset`` records the dataset the run stands for, also when another one is substituted."""
    dataset, network, optimizer, variant, setting = key
    seeds = [seeds] if isinstance(seeds, (str, int)) else seeds
    models = ",".join(NETWORKS[n] for n in (networks or [network]))
    return [f"experiment=pd/{setting}", *substitution_overrides(substitutes or {}, dataset),
            f"model={models}", f"hyperparams={OPTIMIZERS[optimizer]}", *variant_overrides(variant),
            f"seed={','.join(map(str, seeds))}", f"++tags.dataset={dataset}", *([f"scale={scale}"] if scale else [])]


def select(rows: list[Target], tables=None, settings=None, datasets=None, networks=None, optimizers=None,
           variants=None) -> list[Target]:
    """The rows in every given list (None: any); ``variants`` names the baseline ``none``."""
    return [r for r in rows if (not tables or r.table in tables) and (not settings or r.setting in settings)
            and (not datasets or r.dataset in datasets) and (not networks or r.network in networks)
            and (not optimizers or r.optimizer in optimizers)
            and (not variants or (canonical_variant(r.variant) or "none") in variants)]


def plan(rows: list[Target]) -> list[tuple]:
    """The distinct run keys of ``rows``, in the order they first appear."""
    return list(dict.fromkeys(r.key for r in rows))


# ----------------------------------------------------------------------------- identifying a run

def identify(run: Run) -> tuple[tuple | None, str]:
    """The run key of a run directory, from its ``config.yaml`` (``choices``: the experiment, model
    and hyperparams options; the variant from the settings); ``(None, why)`` if it is not one of the
    study's runs."""
    cfg = run.config
    choices = cfg.get("choices")
    if not isinstance(choices, dict):
        return None, "no `choices` in config.yaml"
    experiment = str(choices.get("experiment") or "")
    if not experiment.startswith("pd/"):
        return None, f"experiment={experiment or 'none'} is not a pd/* preset"
    network = NETWORK_BY_OPTION.get(str(choices.get("model")))
    optimizer = OPTIMIZER_BY_OPTION.get(str(choices.get("hyperparams")))
    if network is None or optimizer is None:
        return None, f"model={choices.get('model')} hyperparams={choices.get('hyperparams')} is not in the tables"
    hp, model = cfg.get("hyperparams") or {}, cfg.get("model") or {}
    parts = [] if hp.get("weight_decay") is None else [f"wd={float(hp['weight_decay'])!r}"]
    if str(model.get("norm") or "").lower() in ("bn", "brn"):
        parts.append(str(model["norm"]).lower())
    parts += [part for part, value in (("do", model.get("dropout")), ("da", hp.get("augment"))) if _true(value)]
    return run_key(paper_dataset(run), network, optimizer, "+".join(parts), experiment.split("/", 1)[1]), ""


def _true(value) -> bool:
    if isinstance(value, str):
        return value.lower() in ("true", "1", "yes")
    return bool(value)


def paper_dataset(run: Run) -> str:
    """The dataset a run stands for: ``tags.dataset`` (set by ``run``, also when substituted), else
    the dataset it read."""
    tagged = run.tags.get("dataset")
    if tagged:
        return str(tagged)
    return str((run.config.get("dataset") or {}).get("name") or (run.config.get("choices") or {}).get("dataset"))


def run_notes(run: Run, key: tuple) -> list[str]:
    """How a run departs from the paper's setting of its row (smoke scale, data, rounds, lr ...)."""
    dataset, _network, optimizer, _variant, setting = key
    scale = scale_of(run)
    notes = [f"{scale} scale (scale={scale})"] if scale else []
    if setting.startswith("vanilla") and run.config.get("choices", {}).get("mode") != "centralized":
        notes.append("mode=federated (the paper's vanilla training is one learner on all the data: mode=centralized)")
    return notes + setting_deviations(run, dict(PAPER_SETTING.get(setting, {}), lr=PAPER_LR[optimizer]), data=dataset)


def scale_of(run: Run) -> str | None:
    """The ``scale`` option a run was shrunk with (smoke, tiny), or None at full scale."""
    scale = (run.config.get("choices") or {}).get("scale")
    return None if scale in (None, "null", "None") else str(scale)


# ----------------------------------------------------------------------------- collect

def _reject(run: Run) -> str:
    """Why a run directory is not a finished run of the study ('' if it is)."""
    key, why = identify(run)
    if key is None:
        return why
    return "" if run.accuracy("final") is not None else "no final_test_acc in summary.json"


def load(dirs: list[str]) -> tuple[dict[tuple, list[Run]], list[tuple[Path, str]]]:
    """Finished runs under ``dirs`` grouped by run key, and ``(path, why)`` for the others."""
    runs, skipped = load_runs(dirs, _reject)
    return group(runs, lambda r: identify(r)[0]), skipped


def table_rows(targets: list[Target], by_key: dict[tuple, list[Run]]) -> list[dict]:
    """One tidy row per target row (ours averaged over seeds, in %)."""
    rows = []
    for t in targets:
        seeds = by_key.get(t.key, [])
        final, best = (tables.mean_pct(r.accuracy(which) for r in seeds) for which in ("final", "best"))
        rows.append({
            "table": t.table, "dataset": t.dataset, "network": t.network, "optimizer": t.optimizer,
            "variant": t.variant, "setting": t.setting, "final": final, "best": best,
            "paper_final": t.final, "paper_best": t.best,
            "diff_final": tables.minus(final, t.final), "diff_best": tables.minus(best, t.best),
            "n_runs": len(seeds), "run_dirs": ";".join(str(r.path) for r in seeds),
            "notes": "; ".join(sorted({n for r in seeds for n in run_notes(r, t.key)})),
        })
    return rows


def _pair(final: float | None, best: float | None) -> str:
    if final is None:
        return "-"
    return f"{half_up(final, 2)}" + (f" ({half_up(best, 2)})" if best is not None else "")


def format_cell(row: dict | None) -> str:
    """``ours final (best)[*][ xN] vs paper final (best) diff``; ``-`` where a side is missing."""
    if row is None:
        return "-"
    ours = _pair(row["final"], row["best"])
    if row["final"] is not None:
        ours += ("*" if row["notes"] else "") + (f" x{row['n_runs']}" if row["n_runs"] > 1 else "")
    if row["paper_final"] is None:
        return ours
    paper = _pair(row["paper_final"], row["paper_best"])
    if row["final"] is None:
        return f"- vs {paper}"
    # The difference between the printed (rounded) values, so it checks by hand.
    return f"{ours} vs {paper} {half_up(round(row['final'], 2) - row['paper_final'], 2, sign=True)}"


def _row_label(r: dict, networks: bool, wd: bool) -> list[str]:
    """The label cells of a table row: dataset, network (depth/width tables), method, WD factor."""
    extra = [VARIANT_LABELS.get(v, v) for v in r["variant"].split("+") if v and not v.startswith("wd=")]
    method = " + ".join([OPTIMIZER_LABELS.get(r["optimizer"], r["optimizer"]), *extra])
    weight_decay = next((v[3:] for v in r["variant"].split("+") if v.startswith("wd=")), f"{BASE_WEIGHT_DECAY:g}")
    return [DATASET_LABELS.get(r["dataset"], r["dataset"]), *([r["network"]] if networks else []), method,
            *([weight_decay] if wd else [])]


def format_table(table: str, rows: list[dict]) -> str:
    """One of the paper's tables as text: rows = dataset/network/method/variant, columns = settings."""
    mine = [r for r in rows if r["table"] == table]
    networks = len({r["network"] for r in mine}) > 1
    wd = any(r["variant"].startswith("wd=") for r in mine)
    labels: dict[tuple, list[str]] = {}
    cells: dict[tuple, dict] = {}
    for r in mine:
        ident = (r["dataset"], r["network"], r["optimizer"], r["variant"])
        labels.setdefault(ident, _row_label(r, networks, wd))
        cells[(*ident, r["setting"])] = r
    head = ["Dataset", *(["Network"] if networks else []), "Method", *(["WD Factor"] if wd else [])]
    body = [label + [format_cell(cells.get((*ident, s))) for s in SETTINGS] for ident, label in labels.items()]
    text = tables.render(head + [SETTING_LABELS[s] for s in SETTINGS], body, labels=len(head))
    done = sum(r["final"] is not None for r in mine)
    title = (f"{TABLE_TITLES.get(table, table)} -- test accuracy (%), each cell: ours final (best) vs "
             f"paper final (best) ours-paper final; * = not the paper's setting (NOTES); xN = mean of N seeds; "
             f"{done}/{len(mine)} cells run")
    return title + "\n" + text


def notes(by_key: dict[tuple, list[Run]], rows: list[dict], chosen: list[str], targets: list[Target],
          skipped: list) -> list[str]:
    """The NOTES under the tables: smoke scale, substituted data, other departures from the paper's
    setting, cells without a run, runs of no table, run directories that are not the study's."""
    out = []
    runs = [(r, k) for k, rs in by_key.items() for r in rs]
    scales = count_notes([[f"scale={scale_of(r)}"] for r, _k in runs if scale_of(r)])
    if scales:
        out.append(f"SMOKE SCALE: {', '.join(scales)} (few rounds, learners and examples): a check that the "
                   "pipeline runs, NOT comparable with the paper's accuracies.")
    departures = [run_notes(r, k) for r, k in runs]
    out += [f"SUBSTITUTED DATA: {n}: these numbers say nothing about the paper's dataset."
            for n in count_notes([[n for n in d if n.startswith("data substituted")] for d in departures])]
    other = count_notes([[n for n in d if not n.startswith("data substituted") and " scale (scale=" not in n]
                         for d in departures])
    if other:
        out.append("NOT THE PAPER'S SETTING: " + "; ".join(other))
    for table in chosen:
        missing = [r for r in rows if r["table"] == table and r["n_runs"] == 0]
        if missing:
            out.append(f"MISSING: {len(missing)} of {sum(r['table'] == table for r in rows)} cells of {table} "
                       f"have no run (e.g. {_describe(missing[0])})")
    used = {t.key for t in targets}
    unmatched = [(k, rs) for k, rs in by_key.items() if k not in used]
    if unmatched:
        out.append("IN NO TABLE (ignored): " + "; ".join(f"{_describe_key(k)} ({len(rs)} run(s))"
                                                        for k, rs in unmatched[:6])
                   + (" ..." if len(unmatched) > 6 else ""))
    damaged = [s for s in skipped if s[1].startswith("unreadable")]
    skipped = [s for s in skipped if not s[1].startswith("unreadable")]
    if damaged:  # a damaged config.yaml or summary.json, named by fedrun.results
        out.append(f"UNREADABLE {tables.directories(len(damaged))} (skipped): {tables.listing(damaged, 4)}")
    if skipped:
        out.append(f"SKIPPED {tables.directories(len(skipped))} (not runs of the study): {tables.listing(skipped, 4)}")
    return out


def collect(dirs: list[str], csv_path: str | None = None, which: list[str] | None = None, paper_csv: str | None = None,
            out=None, need_runs: bool = False) -> list[dict]:
    """Find, identify, print and write Tables 4-10 (or ``which`` of them) for the runs under ``dirs``;
    return the tidy rows.  ``need_runs`` (the collect mode): no finished run of the study is one
    line (:func:`tables.require`), not a table of dashes."""
    out = out or sys.stdout
    targets = paper_rows(paper_csv)
    by_key, skipped = load(dirs)
    tables.require(by_key, skipped, "parameter-divergence (pd/*)", dirs, need_runs)
    chosen = [t for t in TABLES if not which or t in which]
    rows = table_rows([t for t in targets if t.table in chosen], by_key)
    for table in [t for t in chosen if any(r["table"] == t and r["n_runs"] for r in rows)] or chosen:
        print(format_table(table, rows) + "\n", file=out)
    print(f"{sum(map(len, by_key.values()))} run(s) of {len(by_key)} distinct setting(s) found under "
          f"{', '.join(map(str, folders(dirs)))}", file=out)
    tables.print_notes("\nNOTES:", notes(by_key, rows, chosen, targets, skipped), out)
    tables.write_csv(rows, csv_path, CSV_COLUMNS, ".4f", out)
    return rows


def _describe(row: dict) -> str:
    return _describe_key(run_key(row["dataset"], row["network"], row["optimizer"], row["variant"], row["setting"]))


def _describe_key(key: tuple) -> str:
    dataset, network, optimizer, variant, setting = key
    return f"{dataset} {network} {optimizer}{' ' + variant if variant else ''} {setting}"


# ----------------------------------------------------------------------------- run

def run_state(path: Path) -> str:
    """``done`` (summary.json), ``diverged`` (run.json says so: never resumed, it would diverge
    again), ``started`` (config.yaml or a checkpoint, no summary) or ``todo``."""
    if (path / "summary.json").is_file():
        return "done"
    if (results.stopped(path) or {}).get("reason") == "diverged":
        return "diverged"
    if (path / "config.yaml").is_file() or (path / "checkpoint.pt").is_file():
        return "started"
    return "todo"


def sweeps(jobs: list[tuple[tuple, str, bool]]) -> list[tuple[tuple, list[str], list[str], bool]]:
    """The ``fedrun -m`` sweeps that run ``jobs`` ``(key, seed, resume)``, each once: one per
    dataset, setting, optimizer, variant and resume (a folder name spells the optimizer and
    variant, which no config value does) and product of networks x seeds
    (:func:`grid.product_blocks`).  Each is ``(a key of it, networks, seeds, resume)``."""
    by_sweep: dict[tuple, list] = {}
    for key, seed, resume in jobs:
        dataset, network, optimizer, variant, setting = key
        by_sweep.setdefault((dataset, setting, optimizer, variant, resume), []).append((network, seed))
    out = []
    for (dataset, setting, optimizer, variant, resume), pairs in by_sweep.items():
        for networks, seeds in grid.product_blocks(pairs):
            out.append(((dataset, networks[0], optimizer, variant, setting), networks, seeds, resume))
    return out


def sweep_command(key: tuple, networks: list[str], seeds: list[str], out: Path, substitutes: dict[str, str],
                  scale: str | None, extra: list[str], resume: bool = False, population: bool = False) -> list[str]:
    """One ``fedrun -m`` over ``networks`` x ``seeds`` of ``key``'s dataset, setting, optimizer
    and variant, into ``OUT/<dataset>/<setting>/<network>_<optimizer>[_<variant>]_seed<seed>``."""
    return [*grid.fedrun_command(), "-m", *run_overrides(key, seeds, substitutes, scale, networks),
            *(["resume=true"] if resume else []), "progress=false", *grid.launcher(population), *extra,
            f"hydra.sweep.dir={out / key[0] / key[4]}", f"hydra.sweep.subdir={sweep_subdir(key)}"]


def grid_plan(keys: list[tuple], seeds: list[str], substitutes: dict[str, str], scale: str | None,
              extra: list[str], population: bool = False) -> grid.Plan:
    """The plan (:data:`grid.Plan`, launched by :func:`grid.launch`) of every (key, seed) not
    finished in OUT, as ``fedrun -m`` sweeps (:func:`sweeps`): more than one job at once, a run a
    sweep, unless ``population``; with ``resume``, the runs that started are resumed too.  Its
    ``missing()`` gives the ``(key, seed, state)`` that are not finished afterwards."""
    def launched(out: Path, resume: bool, jobs: int, dry_run: bool) -> tuple:
        jobs_ = [(k, s) for k in keys for s in seeds]
        states = {(k, s): run_state(run_dir(out, k, s)) for k, s in jobs_}
        todo = [(k, s, states[k, s] == "started") for k, s in jobs_
                if states[k, s] == "todo" or (states[k, s] == "started" and resume)]
        to_run = sweeps(todo)
        if jobs > 1 and not population:  # a run a sweep, seed 0 of every run first, so that `jobs` run side by side
            to_run = grid.seed_major([((key[0], n, *key[2:]), [n], [s], resuming) for key, networks, ss, resuming
                                      in to_run for n in networks for s in ss], seeds, lambda sweep: sweep[2][0])
        counts = Counter(states.values())
        print(f"plan: {len(keys)} distinct run(s) x {len(seeds)} seed(s) = {len(jobs_)} fedrun run(s): "
              f"{counts['done']} done, {counts['started']} started but unfinished, "
              + (f"{counts['diverged']} diverged, " if counts["diverged"] else "") + f"{counts['todo']} to run; "
              f"{len(to_run)} fedrun -m sweep(s)", flush=True)
        progress = grid.Progress(len(todo), out, jobs=jobs if not population else 1)
        progress.announce(len(to_run))
        unfinished = []
        for key, seed in jobs_:
            where, state = run_dir(out, key, seed).relative_to(out), states[key, seed]
            if state == "done":
                print(f"{where}: done", flush=True)
            elif state == "started" and not resume:
                print(f"{where}: started but unfinished: skipped (--resume continues it; delete the folder to redo it)",
                      flush=True)
                unfinished.append((key, seed, state))
            elif state == "diverged":
                print(f"{where}: diverged ({results.stop_note(run_dir(out, key, seed))}): not run again", flush=True)
                unfinished.append((key, seed, state))

        def to_launch():
            for i, (key, networks, sweep_seeds, resuming) in enumerate(to_run, 1):
                cmd = sweep_command(key, networks, sweep_seeds, out, substitutes, scale, extra, resuming, population)
                runs = [((*key[:1], n, *key[2:]), s) for n in networks for s in sweep_seeds]
                paths = [run_dir(out, k, s) for k, s in runs]
                line = (f"[{i}/{len(to_run)}] {key[0]}/{key[4]}, {len(paths)} run(s) "
                        f"({' '.join(p.name for p in paths)}): {shlex.join(cmd)}")
                log_path = out / "logs" / (f"{key[0]}_{key[4]}_{_middle(key)}"
                                           + (f"_{networks[0]}_seed{sweep_seeds[0]}" if jobs > 1 and not population
                                              else "") + ".log")
                seen: set = set()

                def report(paths=paths, seen=seen):
                    for path in paths:
                        if path not in seen and run_state(path) == "done":
                            seen.add(path)
                            progress.done(str(path.relative_to(out)), grid.run_seconds(path))

                def finish(rc, seconds, paths=paths, log_path=log_path):
                    after = [run_state(p) for p in paths]
                    print(f"    exit {rc}, {after.count('done')} of {len(paths)} run(s) done in {seconds:.0f} s "
                          f"(log: {log_path})", flush=True)
                    if after.count("done") < len(paths):
                        grid.print_errors(log_path, 3)

                yield grid.Sweep(line, cmd, log_path, report, finish)

        def missing() -> list[tuple[tuple, str, str]]:
            for key, networks, sweep_seeds, _ in to_run:
                for k, s in [((*key[:1], n, *key[2:]), s) for n in networks for s in sweep_seeds]:
                    state = run_state(run_dir(out, k, s))
                    if state != "done":
                        unfinished.append((k, s, state))
            return unfinished

        return to_launch(), missing

    return launched


def _list(text: str | None, allowed, prefix: str = "", option: str = "") -> list[str] | None:
    """A comma-separated selection (``4,8`` -> table4, table8 with ``prefix='table'``), checked."""
    if not text:
        return None
    items = [x.strip() if x.strip().startswith(prefix) else prefix + x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad:
        raise UsageError(f"{option}={text}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def run_grid(args) -> int:
    """Launch the missing runs of the selected table cells (each distinct run once), then collect."""
    out = Path(args.out).resolve()
    substitutes = dict(args.substitute)
    which = _list(args.tables, TABLES, "table", "--tables")
    selection = [which, _list(args.settings, SETTINGS, option="--settings"),
                 _list(args.datasets, DATASETS, option="--datasets"),
                 _list(args.networks, list(NETWORKS), option="--networks"),
                 _list(args.optimizers, list(OPTIMIZERS), option="--optimizers")]
    all_rows = paper_rows(args.paper_csv)
    variants = _list(args.variants, sorted({canonical_variant(r.variant) or "none" for r in all_rows}),
                     option="--variants")
    seeds = grid.seed_list(args.seeds)
    rows = select(all_rows, *selection, variants)
    if not rows:
        raise UsageError("no table cell matches the selection (--tables, --settings, --datasets, --networks, "
                         "--optimizers, --variants): widen it")
    keys = plan(rows)
    scale = args.scale or ("smoke" if args.smoke else None)
    banner = []
    if scale:
        banner.append(f"SMOKE SCALE (scale={scale}: few rounds, learners and examples): a check that the pipeline "
                      "runs, NOT the paper's setting.")
    for real in substitutes:
        banner.append(f"SUBSTITUTED DATA: {real} runs read {' '.join(substitution_overrides(substitutes, real))}, "
                      f"not the real {real}.")
    grid.print_banner(banner, args.set)
    print(f"{len(rows)} table cell(s) of {', '.join(sorted({r.table for r in rows}, key=TABLES.index))} "
          f"-> {len(keys)} distinct run(s) (shared baselines, wd=0.00005 and vanilla -WB = -A run once)", flush=True)
    t0 = time.perf_counter()
    unfinished = grid.launch(grid_plan(keys, seeds, substitutes, scale, args.set, args.population), out,
                             args.dry_run, args.resume, args.jobs, args.stop_after)
    if args.dry_run:
        return 0
    print(f"\nfinished in {time.perf_counter() - t0:.0f} s\n", flush=True)
    collect([str(out)], tables.run_csv(args, out, CSV_NAME), which, args.paper_csv)
    for key, seed, state in unfinished:
        why = {"started": "failed or unfinished", "diverged": "diverged"}.get(state, "not run")
        print(f"MISSING ({why}): {_describe_key(key)} "
              f"seed {seed} in {run_dir(out, key, seed)} (see {out / 'logs'} and the run's fedrun.log)")
    return 1 if unfinished else 0


# ----------------------------------------------------------------------------- command line

def parser() -> argparse.ArgumentParser:
    p, c, r = tables.table_parser(
        "pd_tables.py", __doc__, "Tables 4-10", CSV_NAME,
        "<dataset>/<setting>/<network>_<optimizer>[_<variant>]_seed<seed>",
        "Launch the missing runs of the chosen tables as `fedrun -m` sweeps, then collect.", PAPER_CSV, DATASETS,
        "run conf/dataset OPTION in place of DATASET, e.g. cifar10=cifar10_jpeg (CIFAR-10's JPEG q75 copy) or "
        "cifar10=synthetic (adds dataset.channels=3 "
        "dataset.image_size=32); repeatable. Marked as substituted")
    for q in (c, r):
        q.add_argument("--tables", default=None, metavar="N[,N...]", help="which tables, e.g. 4,8 (default: 4-10)")
    r.add_argument("--settings", default=None, metavar="S[,S...]",
                   help=f"which columns: {','.join(SETTINGS)} (default: all)")
    r.add_argument("--datasets", default=None, metavar="D[,D...]", help="cifar10 and/or svhn (default: both)")
    r.add_argument("--networks", default=None, metavar="NET[,NET...]",
                   help=f"only these networks, as the paper names them ({', '.join(NETWORKS)})")
    r.add_argument("--optimizers", default=None, metavar="OPT[,OPT...]",
                   help=f"only these optimizers ({', '.join(OPTIMIZERS)})")
    r.add_argument("--variants", default=None, metavar="V[,V...]",
                   help="only these variants: none (the baseline), wd=0, wd=0.0001, wd=0.0005, bn, brn, da, do")
    r.add_argument("--smoke", action="store_true", help=f"add {tables.SMOKE}")
    r.add_argument("--scale", default=None, choices=conf_options("scale"),
                   help="add scale=SCALE (e.g. tiny: 3 rounds on 300 images, the whole grid in minutes)")
    return p


@one_line_errors("pd_tables")
def main(argv: list[str] | None = None) -> int:
    return tables.table_main(
        parser().parse_args(argv), run_grid,
        lambda a, csv_path: collect(a.dirs, csv_path, _list(a.tables, TABLES, "table", "--tables"), a.paper_csv,
                                    need_runs=True))


if __name__ == "__main__":
    sys.exit(main())
