"""fedrun's own features measured, beyond the papers: the personalized methods against FedAvg
(claims_personalized.py) and DP-FedAvg's accuracy against epsilon (claims_privacy.py), whose tables
docs/configuration.md states."""
