"""fedrun: federated-learning simulation for research.

The library takes plain Python values; only :mod:`fedrun.cli` touches Hydra.  One round, in the
order a reader of the papers expects (see :func:`fedrun.simulation.simulate`):

1. sample the round's clients from ``(seed, round)``            -- :mod:`fedrun.seeding`
2. train them locally, updates returned as stacked tensors      -- :mod:`fedrun.sequential`, :mod:`fedrun.batched`
3. weight the clients and aggregate through server transforms  -- :mod:`fedrun.aggregators`
   (N, E per layer: :mod:`fedrun.nwda`; parameter divergence: :mod:`fedrun.divergence`)
4. evaluate the global model                                    -- :mod:`fedrun.evaluation`
5. write the round's CSV rows and the checkpoint                -- :mod:`fedrun.recorder`
"""

__version__ = "0.1.0"
