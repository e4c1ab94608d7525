"""What the paper scripts share (imports no paper): launching a grid (grid.py), reading and filing runs
(papers.py), the table scripts' skeleton (tables.py), plotting (plots.py), the readings table
(readings.py), fair baselines (tune.py), and the claims of docs/reproductions.md: their numbers as text
and runs (claims_core.py) and their registry (claims_registry.py)."""
