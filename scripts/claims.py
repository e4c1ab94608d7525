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

The claims live beside each paper's scripts (``scripts/<paper>/claims*.py``, a module per section
of the doc; ``scripts/datasets/`` those of the reproductions about data), made of
``scripts/common/claims_core.py`` (the numbers as text, the runs) and registered by
``scripts/common/claims_registry.py``; this command alone loads every one of them, in the doc's
order, prints them, checks them against the doc and rewrites the doc's marked ones.

One rounding, everywhere: :func:`fmt` rounds half up (0.125 -> 0.13) on the exact decimal value
(``Decimal(str(x))``, never the binary float), and :func:`exact` writes a value that has at most
two decimals (an accuracy on 2,000 or 10,000 test images, in %) without rounding it at all.  Means,
differences and ranges are computed on the runs' unrounded values (accuracies read as decimals
from rounds.csv), never on the rounded cells of a table.  A bound ("within 0.4 points", "at most
1.8") is rounded up instead (:func:`bound_up`), so that it holds of the exact values it bounds; and
a tie is decided on the exact values, never by two figures that print alike.

The sections are those of docs/reproductions.md: ``niidbench`` (the NIID-Bench grid and its
comparison with Flower's baseline), ``niidbench_readings`` (data size and SCAFFOLD's divergence),
``fednova_stragglers``, ``fedlap_fmnist`` (the bullets under "What holds and what does not"),
``fedlap_readings``, ``fedlap_mnist_train10k``, ``fedlap_tuned`` (FedLap against baselines tuned by scripts/common/tune.py) and
``fedlayerwise`` (Table I on the whole MNIST), ``fednnnn_gpu`` (Table 2's MNIST
non-IID unbalanced column, one GPU run), ``niidbench_gpu`` (NIID-Bench's #C=2 and IID rows on
the whole MNIST, GPU runs cut short), ``niidbench_tuned`` (FedProx's mu tuned per NIID-Bench cell
by scripts/common/tune.py), ``fedlap_mnist`` (FedLap's MNIST figures on the whole MNIST),
``fedlap_mnist_tuned`` (FedLap on the whole MNIST against baselines tuned by scripts/common/tune.py) and
``niidbench_whole`` (Table III's MNIST rows on the whole MNIST as far as the CPU runs go, and
SCAFFOLD under #C=2 there with both readings of its correction), ``fednnnn_whole`` (FedNNNN's Table 2,
MNIST half, on the whole MNIST on a CPU, as far as its runs have gone), ``cifar10_jpeg`` (what
CIFAR-10's JPEG q75 copy costs a model).  ``niidbench/table3.py collect`` and
``fedlap/plot.py --summary`` print the sections of the folders they read (:func:`print_section`).

Examples (from the repository root)::

    python scripts/claims.py                       # every section
    python scripts/claims.py --section fedlap_readings niidbench
    python scripts/claims.py --check               # also: is each text in docs/reproductions.md?
    python scripts/claims.py --write               # first rewrite the doc's marked claims (tables in progress)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # python scripts/claims.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from scripts.common.claims_core import Data, ROOT
from scripts.common.claims_registry import docs, in_doc, render_section, sections, write_marked
# Every paper's claims, each module registering its sections' as it is imported: in the doc's order,
# the order they are printed in (named after their sections).
from scripts.niidbench import claims as niidbench, claims_stragglers as fednova_stragglers  # noqa: F401
from scripts.fedlap import claims as fedlap  # noqa: F401
from scripts.fedlayerwise import claims as fedlayerwise  # noqa: F401
from scripts.fedlap import claims_tuned as fedlap_tuned  # noqa: F401
from scripts.fednnnn import claims_gpu as fednnnn_gpu  # noqa: F401
from scripts.niidbench import claims_gpu as niidbench_gpu, claims_tuned as niidbench_tuned  # noqa: F401
from scripts.niidbench import claims_whole as niidbench_whole  # noqa: F401
from scripts.fednnnn import claims_whole as fednnnn_whole  # noqa: F401
from scripts.datasets import claims_cifar10_jpeg as cifar10_jpeg, claims_femnist_leaf as femnist_leaf  # noqa: F401
# fedrun's own features measured (docs/configuration.md's result tables).
from scripts.features import claims_personalized as personalized, claims_privacy as privacy  # noqa: F401


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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    data = Data(args.root)
    if args.write:
        for name in docs():
            path = Path(args.root) / name
            if not path.is_file():  # a root with the runs and docs/reproductions.md alone
                continue
            text, changed = write_marked(path.read_text(), data, args.section)
            if changed:
                path.write_text(text)
            print(f"{name}: " + (f"rewrote {', '.join(changed)}" if changed else "every marked claim as the runs say"))
        args.check = True
    texts = {name: (Path(args.root) / name).read_text() if (Path(args.root) / name).is_file() else ""
             for name in docs()} if args.check else {}
    ok = True
    for section in args.section or sections():
        print(f"[{section}]")
        for c, text, error in render_section(section, data):
            if error is not None:
                print(f"{c.id}: CANNOT BE COMPUTED: {error}")
                ok = False
                continue
            missing = args.check and not in_doc(text, texts[c.doc])
            print(f"{c.id}: {text}" + (f"    <-- NOT IN {c.doc}" if missing else ""))
            ok = ok and not missing
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
