"""The figures docs/reproductions.md states in its prose, computed from the committed run folders
under ``outputs/reproductions/``: a module per section of the doc (``scripts/claims.py`` is the
command that prints and checks them; its docstring says what a claim is).

:mod:`doc_claims.core` holds the numbers as text and the runs, :mod:`doc_claims.registry` the
claims and the doc; each other module registers the claims of its sections when imported, and the
package imports them in the doc's order, the order their claims are printed in.
"""
from doc_claims import core, registry  # noqa: F401  (first: what the sections are made of)
from doc_claims import (  # noqa: F401  (the sections, in the doc's order)
    niidbench, fednova_stragglers, fedlap, fedlayerwise, fedlap_tuned, fednnnn_gpu, niidbench_gpu, niidbench_tuned,
    niidbench_whole, fednnnn_whole, cifar10_jpeg, femnist_leaf)
from doc_claims.core import DOC, RUNS, Data, bound_up, exact, fmt, pct  # noqa: F401
from doc_claims.registry import (  # noqa: F401
    CLAIMS, FEDLAP_SECTIONS, FEDLAYERWISE_SECTIONS, NIIDBENCH_SECTIONS, in_doc, normalized, print_section,
    print_sections, render_section, sections, sections_of, write_marked)
