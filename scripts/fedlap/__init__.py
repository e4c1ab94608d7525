"""FedLap (Charteros, Koutsopoulos): its curves and summary table (plot.py), and the claims of its
sections of docs/reproductions.md (claims.py, claims_tuned.py)."""
