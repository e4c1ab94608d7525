"""The parameter-divergence presets carry the paper's settings (sec. 2.2, Table 1, Appendix A)."""
from __future__ import annotations

import pytest
from conftest import compose

from fedrun.command.build import build

SETTINGS = ("iid", "noniid2", "noniid1", "vanilla_bs50", "vanilla_bs500")
OPTIMIZERS = ("pd_sgd", "pd_nmom_a", "pd_nmom_wb", "pd_adam_a", "pd_adam_wb")




@pytest.mark.parametrize("setting,rounds,classes", [("iid", 200, None), ("noniid2", 300, 2), ("noniid1", 300, 1)])
def test_federated_settings(setting, rounds, classes):
    cfg = compose([f"experiment=pd/{setting}"])
    h = cfg.hyperparams
    assert (h.rounds, h.num_clients, h.client_fraction, h.local_epochs, h.batch_size) == (rounds, 10, 1.0, 1, 50)
    assert cfg.dataset.name == "cifar10" and cfg.model._target_ == "fedrun.models.pd_nets.PDNet"
    assert cfg.partition._target_ == ("fedrun.data.partition.iid" if classes is None else "fedrun.data.partition.classes")
    if classes:
        assert cfg.partition.classes_per_client == classes
    assert cfg.vanilla_every == 1 and list(cfg.snapshots) == [25, rounds]
    objects = build(cfg)
    assert objects["federation"].per_round == 10  # every learner every round
    assert objects["aggregator"].name == "fedavg"


@pytest.mark.parametrize("batch", [50, 500])
def test_vanilla_settings_are_one_learner_for_100_epochs(batch):
    objects = build(compose([f"experiment=pd/vanilla_bs{batch}"]))
    fed, local = objects["federation"], objects["local"]
    assert (fed.num_clients, fed.per_round, fed.rounds, fed.vanilla_every) == (1, 1, 100, 0)
    assert (local.batch_size, local.epochs) == (batch, 1)


@pytest.mark.parametrize("name,optimizer,lr,momentum,state", [
    ("pd_sgd", "sgd", 0.05, 0.0, "reset"), ("pd_nmom_a", "sgd", 0.01, 0.9, "average"),
    ("pd_nmom_wb", "sgd", 0.01, 0.9, "local"), ("pd_adam_a", "adam", 0.001, 0.0, "average"),
    ("pd_adam_wb", "adam", 0.001, 0.0, "local")])
def test_optimizers(name, optimizer, lr, momentum, state):
    local = build(compose([f"hyperparams={name}"]))["local"]
    assert (local.optimizer, local.lr, local.momentum, local.optimizer_state) == (optimizer, lr, momentum, state)
    assert local.nesterov == (momentum > 0)
    assert (local.weight_decay, local.weight_decay_mode) == (0.00005, "decoupled")
    assert tuple(local.lr_milestones) == (0.5, 0.75) and local.lr_gamma == 0.1


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_row_builds_at_tiny_scale(setting, optimizer):
    cfg = compose([f"experiment=pd/{setting}", f"hyperparams={optimizer}", "scale=tiny",
                        "model.norm=brn", "model.dropout=true", "hyperparams.augment=true"])
    objects = build(cfg)
    assert objects["federation"].rounds == 3 and objects["federation"].snapshots == ()
    assert objects["federation"].num_clients == (1 if setting.startswith("vanilla") else 10)


@pytest.mark.parametrize("setting,per_learner", [("iid", {c: 500 for c in range(10)}), ("noniid2", 2500),
                                                 ("noniid1", 5000)])
@pytest.mark.parametrize("dataset", ["cifar10", "svhn"])
def test_learners_get_exactly_the_papers_sizes(setting, per_learner, dataset):
    # Table 1: 10 learners x 5,000 examples; IID 500 of each class, Non-IID(2) 2 x 2,500,
    # Non-IID(1) 1 x 5,000.  Labels shaped like the datasets (CIFAR-10: 5,000 a class; SVHN's
    # train set with the first 10,000 extra images: uneven, at least 5,000 a class), through the
    # presets' class-balanced pool (dataset.per_class) and partition.
    import numpy as np
    import torch
    from hydra.utils import instantiate

    from fedrun.data.datasets import RawData
    from fedrun.data.preparation import prepare

    cfg = compose([f"experiment=pd/{setting}", f"dataset={dataset}"])
    assert cfg.dataset.per_class == 5000 and cfg.dataset.normalize == "per_image"
    counts = [5000] * 10 if dataset == "cifar10" else [5948, 14300, 10500, 8700, 7500, 6900, 5800, 5600, 5100, 5009]
    y = torch.from_numpy(np.random.default_rng(0).permutation(np.repeat(np.arange(10), counts)))
    x = torch.rand(len(y), 1, 2, 2)
    data = prepare(RawData(x, y, x[:10], y[:10], 10), None, None, normalize="per_image", per_class=5000)
    parts = instantiate(cfg.partition)(labels=data.train_y.numpy(), num_clients=10, num_classes=10, seed=0)
    for part in parts:
        held = np.bincount(data.train_y.numpy()[part], minlength=10)
        assert len(part) == 5000
        if isinstance(per_learner, dict):
            assert held.tolist() == [500] * 10
        else:
            assert sorted(held[held > 0].tolist()) == [per_learner] * (5000 // per_learner)
