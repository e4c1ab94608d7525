"""The server: the Aggregator machine (:mod:`.aggregator`), client weighting, the reduce of the
clients' updates, server transforms (optax-shaped) and SCAFFOLD's control variates.
The methods themselves are the factories of :mod:`fedrun.aggregators`.
"""
