"""The parameter-divergence paper: Tables 4-10 (tables.py), its figures (plot.py) and loss surfaces
(loss_surface.py)."""
