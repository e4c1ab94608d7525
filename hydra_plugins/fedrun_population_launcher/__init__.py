"""fedrun's Hydra launcher ``hydra/launcher=population`` (see :mod:`.population_launcher`)."""
