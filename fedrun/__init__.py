"""fedrun: federated-learning simulation for research.

The library takes plain Python values; only the command floor (:mod:`fedrun.command.cli`, :mod:`fedrun.command.build`,
:mod:`fedrun.command.help`, :mod:`fedrun.command.sweeps`, :mod:`fedrun.command.resolvers`) touches Hydra and OmegaConf, so
``import fedrun`` loads neither (tests/test_layering.py).  One round, in the
order a reader of the papers expects (see :func:`fedrun.harness.simulation.simulate`):

1. sample the round's clients from ``(seed, round)``            -- :mod:`fedrun.seeding`
2. train them locally, updates returned as stacked tensors      -- :mod:`fedrun.client.sequential`, :mod:`fedrun.client.batched`
3. weight the clients and aggregate through server transforms  -- :mod:`fedrun.aggregators`
   (N, E per layer: :mod:`fedrun.diagnostics.nwda`; parameter divergence: :mod:`fedrun.diagnostics.divergence`)
4. evaluate the global model                                    -- :mod:`fedrun.diagnostics.evaluation`
5. write the round's CSV rows and the checkpoint                -- :mod:`fedrun.harness.recorder`
"""

__version__ = "0.1.0"


def run(overrides: list[str] | tuple[str, ...] = (), run_dir: str | None = None) -> dict:
    """Run one job from Python, as ``fedrun <overrides>`` would: same checks, outputs and one-line
    errors (raised as :class:`fedrun.errors.FedrunError`).  Returns the run's summary.

    >>> summary = fedrun.run(["aggregator=fedavg", "hyperparams.rounds=5"], run_dir="runs/a")
    """
    from fedrun.command.cli import run_overrides  # Hydra only when used

    return run_overrides(overrides, run_dir)
