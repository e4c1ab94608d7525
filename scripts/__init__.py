"""The papers' reproduction scripts, a folder a paper (``fednnnn/``, ``pd/``, ``fedlayerwise/``,
``fedlap/``, ``niidbench/``: its table, plot and claims code), ``datasets/`` (the reproductions
about the data itself), ``common/`` (what they share, importing no paper), ``claims.py`` (every
paper's claims of docs/reproductions.md, printed and checked) and ``bench/`` (fedrun's benchmarks,
apart).  Run one from the repository root as ``python scripts/<folder>/<name>.py`` (or ``python -m
scripts.<folder>.<name>``): each puts the root on the path and imports the others as ``scripts.*``.
"""
