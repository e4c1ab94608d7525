"""The command floor: the CLI, building a run from settings, the settings' checks, sweeps,
OmegaConf resolvers and ``fedrun --help``.  The only floor that imports Hydra.
"""
