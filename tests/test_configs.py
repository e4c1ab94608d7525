"""Every YAML file under conf/ composes, and what it names can be built.

The files are globbed, so a new aggregator, partition, model, dataset, hyperparams or experiment
file is covered without touching this test.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from conftest import CONF_DIR, compose
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedrun.command import build
from fedrun.paths import conf_options
from fedrun.data.partition import client_ids
from fedrun.server.aggregator import Aggregator
from fedrun.models.layers import count_parameters
from fedrun.client.local_training import LocalTraining
from fedrun.harness.federated_run import Federation

GROUPS = ("dataset", "model", "partition", "aggregator", "hyperparams", "experiment", "scale")


def options(group):
    folder = CONF_DIR / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


# Options built from an optional extra's package: instantiated where it is installed.
NEEDS = {("partition", "flwr"): "flwr_datasets"}
CASES = [pytest.param(g, o, marks=pytest.mark.skipif(
             (g, o) in NEEDS and importlib.util.find_spec(NEEDS[g, o]) is None,
             reason="pip install 'fedrun[huggingface]'")) for g in GROUPS for o in options(g)]
IDS = [f"{g}={o}" for g in GROUPS for o in options(g)]




def test_groups_are_not_empty():
    for group in ("dataset", "model", "partition", "aggregator", "hyperparams"):
        assert options(group), group
    assert {"fedavg", "fedprox", "normnorm", "momentum", "fednnnn"} <= set(options("aggregator"))
    assert {"iid", "classes", "shards", "dirichlet", "mixed"} <= set(options("partition"))
    assert conf_options("aggregator") == options("aggregator")  # what the CLI offers


@pytest.mark.parametrize("group,option", CASES, ids=IDS)
def test_config_composes_and_builds(group, option):
    cfg = compose([f"{group}={option}"])
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    if group not in ("experiment", "scale"):
        # The chosen file is what the group holds: its plain (non-interpolated) values are there.
        raw = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
        plain = [k for k in raw if k != "defaults" and not OmegaConf.is_interpolation(raw, k)]
        assert plain
        for key in plain:
            assert cfg[group][key] == raw[key], f"{group}.{key}"
    # The aggregator and partition instantiate (the same calls fedrun.command.build.build makes).
    aggregator = instantiate(cfg.aggregator)
    assert isinstance(aggregator, Aggregator)
    assert aggregator.name == cfg.aggregator._target_.rsplit(".", 1)[1]
    partition = instantiate(cfg.partition)
    k, c = int(cfg.hyperparams.num_clients), int(cfg.dataset.num_classes)
    per_class = max(50 * k, 2 * k * (OmegaConf.select(cfg, "partition.samples_per_client") or 0))
    labels = np.random.default_rng(0).permutation(np.arange(per_class * c) % c)  # >= 50 per client per class
    # partition=natural keeps the data's own clients: here k of them, every k-th example each.
    groups = torch.as_tensor(np.arange(len(labels)) % k)
    parts = partition(labels=labels, num_clients=k, num_classes=c, seed=0, **client_ids(partition, groups))
    assert len(parts) == k and len(np.unique(np.concatenate(parts))) == sum(len(p) for p in parts)
    model = instantiate(cfg.model)
    assert count_parameters(model) > 0
    objects = build.build(cfg)
    assert isinstance(objects["federation"], Federation) and isinstance(objects["local"], LocalTraining)
    if cfg.dataset.name == "synthetic":
        raw = instantiate(cfg.dataset.load, num_train=40, num_test=10)
        assert raw.train_x.shape == (40, cfg.dataset.channels, cfg.dataset.image_size, cfg.dataset.image_size)
        assert raw.num_classes == cfg.dataset.num_classes


def test_model_configs_match_the_paper():
    # Table 3 and Table 4 parameter counts through the configs (dataset fills the shapes).
    cfg = compose(["model=mnist_cnn", "dataset=mnist"])
    assert count_parameters(instantiate(cfg.model)) == 431_080
    cfg = compose(["model=cifar10_cnn", "dataset=cifar10"])
    assert count_parameters(instantiate(cfg.model)) == 1_146_088
    cfg = compose(["model=cifar10_cnn", "dataset=cifar10", "model.batch_norm=false"])
    assert count_parameters(instantiate(cfg.model)) == 1_145_192


def test_aggregator_defaults_and_overrides():
    cfg = compose(["aggregator=fednnnn"])
    agg = instantiate(cfg.aggregator)
    assert (cfg.aggregator.beta, cfg.aggregator.gamma) == (0.7, 0.8)
    assert agg.evaluate == "average" and agg.weighting.base(torch.tensor([1, 3])).tolist() == [0.25, 0.75]
    cfg = compose(["aggregator=fednnnn", "aggregator.evaluate=sent", "aggregator.weighting=uniform"])
    agg = instantiate(cfg.aggregator)
    assert agg.evaluate == "sent" and agg.weighting.base(torch.tensor([1, 3])).tolist() == [0.5, 0.5]
    # Tuned values in `tuned` (what experiment presets set) reach every aggregator config.
    cfg = compose(["aggregator=fedprox", "+tuned.fedprox.mu=0.02"])
    assert instantiate(cfg.aggregator).regularizer.mu == 0.02


@pytest.mark.parametrize("option", [o for o in options("experiment")])
def test_experiment_presets_set_tuned_values(option):
    cfg = compose([f"experiment={option}"])
    # Each aggregator picks its tuned value from the preset.
    for name, key in (("fedprox", "mu"), ("normnorm", "beta"), ("momentum", "gamma"), ("fednnnn", "beta")):
        tuned = OmegaConf.select(cfg, f"tuned.{name}.{key}")
        if tuned is None:
            continue
        with_agg = compose([f"experiment={option}", f"aggregator={name}"])
        assert with_agg.aggregator[key] == tuned
