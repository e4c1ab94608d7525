"""FedNNNN (Nagura, Bian, Sato): Table 2 (table2.py), its curves (plot.py), and the claims of its
sections of docs/reproductions.md (claims_gpu.py, claims_whole.py)."""
