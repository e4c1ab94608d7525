"""NIID-Bench (Li, Diao, Chen, He): Table III (table3.py), and the claims of its sections of
docs/reproductions.md (claims.py, claims_stragglers.py, claims_tuned.py, claims_whole.py, claims_gpu.py)."""
