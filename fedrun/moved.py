"""Module paths of fedrun's earlier flat layout, and where each is now.

fedrun's modules moved into sub-packages by what a researcher comes to change (``server/``,
``client/``, ``diagnostics/``, ``data/``, ``models/``, ``harness/``, ``command/``; the map is in
docs/design.md).  A run folder made before names the old paths in its ``config.yaml``
(``_target_: fedrun.partition.shards``).  Reading it goes on as before: :func:`current_target`
gives a stored ``_target_`` its present path where the scripts compare or build one.  Resuming it
does not: its checkpoint and settings were written under the old names, and
:func:`moved_targets` lets the run folder refuse it in one line.
"""
from __future__ import annotations

# Definitions that left a module for one beside it (the Aggregator machine, data preparation).
SPLIT = {
    "fedrun.aggregators.EVALUATE": "fedrun.server.aggregator.EVALUATE",
    "fedrun.aggregators.RoundOutcome": "fedrun.server.aggregator.RoundOutcome",
    "fedrun.aggregators.Aggregator": "fedrun.server.aggregator.Aggregator",
    "fedrun.aggregators.average_buffers": "fedrun.server.aggregator.average_buffers",
    "fedrun.aggregators.check_finite": "fedrun.server.aggregator.check_finite",
    "fedrun.data.FederatedData": "fedrun.data.preparation.FederatedData",
    "fedrun.data.NORMALIZATIONS": "fedrun.data.preparation.NORMALIZATIONS",
    "fedrun.data.per_image_standardization": "fedrun.data.preparation.per_image_standardization",
    "fedrun.data.first_per_class": "fedrun.data.preparation.first_per_class",
    "fedrun.data.prepare": "fedrun.data.preparation.prepare",
}
# Whole modules: old path -> new path.
MODULES = {
    "fedrun.weighting": "fedrun.server.weighting",
    "fedrun.reduce": "fedrun.server.reduce",
    "fedrun.transforms": "fedrun.server.transforms",
    "fedrun.corrections": "fedrun.server.corrections",
    "fedrun.local_training": "fedrun.client.local_training",
    "fedrun.optim": "fedrun.client.optim",
    "fedrun.regularizers": "fedrun.client.regularizers",
    "fedrun.participation": "fedrun.client.participation",
    "fedrun.engines": "fedrun.client.engines",
    "fedrun.sequential": "fedrun.client.sequential",
    "fedrun.batched": "fedrun.client.batched",
    "fedrun.precision": "fedrun.client.precision",
    "fedrun.vmap_batchnorm": "fedrun.client.vmap_batchnorm",
    "fedrun.nwda": "fedrun.diagnostics.nwda",
    "fedrun.divergence": "fedrun.diagnostics.divergence",
    "fedrun.evaluation": "fedrun.diagnostics.evaluation",
    "fedrun.landscape": "fedrun.diagnostics.landscape",
    "fedrun.data": "fedrun.data.datasets",
    "fedrun.partition": "fedrun.data.partition",
    "fedrun.augment": "fedrun.data.augment",
    "fedrun.models": "fedrun.models.nets",
    "fedrun.pd_nets": "fedrun.models.pd_nets",
    "fedrun.batchnorm": "fedrun.models.batchnorm",
    "fedrun.layers": "fedrun.models.layers",
    "fedrun.federated_run": "fedrun.harness.federated_run",
    "fedrun.simulation": "fedrun.harness.simulation",
    "fedrun.population": "fedrun.harness.population",
    "fedrun.recorder": "fedrun.harness.recorder",
    "fedrun.rundir": "fedrun.harness.rundir",
    "fedrun.provenance": "fedrun.harness.provenance",
    "fedrun.dashboards": "fedrun.harness.dashboards",
    "fedrun.objective": "fedrun.harness.objective",
    "fedrun.cli": "fedrun.command.cli",
    "fedrun.build": "fedrun.command.build",
    "fedrun.settings": "fedrun.command.settings",
    "fedrun.sweeps": "fedrun.command.sweeps",
    "fedrun.resolvers": "fedrun.command.resolvers",
    "fedrun.help": "fedrun.command.help",
}


def current_target(target):
    """``target`` (a ``_target_`` string) at its present path: ``fedrun.partition.shards`` ->
    ``fedrun.data.partition.shards``; anything else (a present path, not a string) as it is."""
    if not isinstance(target, str):
        return target
    if target in SPLIT:
        return SPLIT[target]
    module, _, name = target.rpartition(".")
    return f"{MODULES[module]}.{name}" if module in MODULES else target


def moved_targets(config) -> list[tuple[str, str]]:
    """Every ``_target_`` in ``config`` (nested dicts and lists) that names an old path, with its
    present one: ``[(old, new), ...]`` in the order found; empty for a config of this layout."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and current_target(target) != target:
                found.append((target, current_target(target)))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return found
