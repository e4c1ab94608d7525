"""FedLayerWise (Lanjewar, Tran, Tran): Table I (table1.py), its curves (plot.py), and the claims of
its section of docs/reproductions.md (claims.py)."""
