"""FedLap's layer-wise regularizer (Charteros & Koutsopoulos eq. 5-10, Algorithm 1).

The hand-checked case: a 2x2 PyTorch weight ``[out, in]`` whose per-neuron vectors (the fan-out of
input neuron j, eq. 5-8) are its *columns*:

    global  W_g = [[1, 0],     columns  w_g0 = [1, 0],  w_g1 = [0, 1]
                   [0, 1]]
    local   W_k = [[2, 1],     columns  w_k0 = [2, 0],  w_k1 = [1, 1]
                   [0, 1]]

* eq. 5, 7: ``lambda_0 = 1 - cos([2, 0], [1, 0]) = 1 - 1 = 0``;
  ``lambda_1 = 1 - cos([1, 1], [0, 1]) = 1 - 1/sqrt(2) = 1 - 0.707107 = 0.292893``;
* eq. 8: ``d_0 = ||[2, 0] - [1, 0]||^2 = 1``, ``d_1 = ||[1, 1] - [0, 1]||^2 = 1``;
* eq. 10 with q = 0.5 (``form=linear``: ``c = q lambda``):
  ``1/2 (0.5 * 0 * 1 + 0.5 * 0.292893 * 1) = 0.073223``.

Neuron 0 moved (``d_0 = 1``) but only along its own direction, so it is not penalized.  Were the
coefficient applied to rows instead of columns, the penalty would be 0 (row 1 did not move and
row 0 has lambda 0), so the golden number also pins the axis.
"""
from __future__ import annotations

import math

import pytest
import torch
from conftest import aggregate, compose, on_partition, tiny_mlp

from fedrun import aggregators as A
from fedrun.errors import ConfigError
from fedrun.models.layers import Layer
from fedrun.client.local_training import LocalTraining
from fedrun.params import split_state
from fedrun.client.regularizers import LayerAdaptive, Proximal, neuron_view
from fedrun.client.sequential import SequentialEngine

LAMBDA_1 = 1 - 1 / math.sqrt(2)  # 0.292893
WG = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
WK = torch.tensor([[2.0, 1.0], [0.0, 1.0]], dtype=torch.float64)


# ----------------------------------------------------------------------------- neuron_view

def test_neuron_view_linear_is_columns():
    w = torch.arange(12.0).reshape(3, 4)  # Linear(in=4, out=3): [out, in]
    v = neuron_view(w)
    assert v.shape == (4, 3)  # one fan-out vector of length out per input neuron
    for j in range(4):
        assert torch.equal(v[j], w[:, j])


def test_neuron_view_conv_is_input_channels():
    w = torch.arange(4 * 2 * 3 * 3.0).reshape(4, 2, 3, 3)  # Conv2d(in=2, out=4, 3x3)
    v = neuron_view(w)
    assert v.shape == (2, 4 * 3 * 3)  # [i, o*kh*kw]
    for j in range(2):
        assert torch.equal(v[j], w[:, j].flatten())


def test_neuron_view_fan_in_is_rows():
    """``vectors=fan_in``: row j of PyTorch's [out, in] weight (output neuron j's incoming weights);
    a conv weight gives one vector per filter."""
    w = torch.arange(12.0).reshape(3, 4)
    v = neuron_view(w, "fan_in")
    assert v.shape == (3, 4) and all(torch.equal(v[j], w[j]) for j in range(3))
    c = torch.arange(4 * 2 * 3 * 3.0).reshape(4, 2, 3, 3)
    vc = neuron_view(c, "fan_in")
    assert vc.shape == (4, 2 * 3 * 3) and all(torch.equal(vc[j], c[j].flatten()) for j in range(4))
    assert torch.equal(neuron_view(torch.arange(5.0), "fan_in"), torch.arange(5.0).unsqueeze(0))


def test_neuron_view_bias_is_one_vector():
    b = torch.arange(5.0)
    assert neuron_view(b).shape == (1, 5)
    assert torch.equal(neuron_view(b)[0], b)


# ----------------------------------------------------------------------------- lambda and the penalty

class OneClient:
    """A regularizer's stacked form for one client (m = 1), as the sequential engine calls it."""

    ROW = torch.zeros(1, dtype=torch.long)

    def __init__(self, reg, anchor):
        self.reg, self.anchor, self.state = reg, anchor, reg.init(anchor, 1)

    def start_epoch(self, epoch, local):
        self.reg.start_epoch(self.state, self.ROW, torch.tensor([epoch == 0]), _stack(local), self.anchor)

    def penalty(self, local) -> float:
        return float(self.reg.penalty(self.state, _stack(local), self.anchor, self.ROW)[0])

    def metrics(self) -> dict:
        return {k: float(v[0]) for k, v in self.reg.metrics(self.state).items()}

    @property
    def coef(self) -> dict:
        return {k: v[0] for k, v in self.state["coef"].items()}


def _stack(params):
    return {k: v.unsqueeze(0) for k, v in params.items()}


def test_lambda_is_zero_in_the_first_epoch():
    reg = OneClient(LayerAdaptive(q=1.0), {"w": WG})
    reg.start_epoch(0, {"w": WK})  # the local model already differs from w_g
    assert torch.equal(reg.coef["w"], torch.zeros(1, 2, dtype=torch.float64))
    assert reg.penalty({"w": WK}) == 0.0
    assert reg.metrics() == {"lambda_mean": 0.0}  # no epoch >= 2 yet


def test_lambda_golden_linear():
    reg = OneClient(LayerAdaptive(q=0.5), {"w": WG})
    reg.start_epoch(1, {"w": WK})
    # c = q lambda = [0, 0.5 * 0.292893] on the input-neuron axis (1).
    assert reg.coef["w"].shape == (1, 2)
    assert reg.coef["w"][0].tolist() == pytest.approx([0.0, 0.5 * LAMBDA_1], abs=1e-15)
    assert reg.penalty({"w": WK}) == pytest.approx(0.5 * 0.5 * LAMBDA_1, rel=1e-12)
    assert reg.penalty({"w": WK}) == pytest.approx(0.073223, abs=1e-6)
    assert reg.metrics()["lambda_mean"] == pytest.approx(LAMBDA_1 / 2, rel=1e-12)  # mean(0, 0.292893)


def test_lambda_golden_fan_in():
    """Rows of W (fan-in): row 0 goes from [1, 0] to [2, 1], cos = 2 / sqrt(5) = 0.894427, lambda
    0.105573, d = 1 + 1 = 2; row 1 is unchanged (lambda 0).  q = 0.5: penalty
    1/2 * 0.5 * 0.105573 * 2 = 0.052786; lambda_mean = 0.105573 / 2 = 0.052786."""
    lam0 = 1 - 2 / math.sqrt(5)
    reg = OneClient(LayerAdaptive(q=0.5, vectors="fan_in"), {"w": WG})
    reg.start_epoch(1, {"w": WK})
    assert reg.coef["w"].shape == (2, 1)  # one coefficient per output neuron (row)
    assert reg.coef["w"][:, 0].tolist() == pytest.approx([0.5 * lam0, 0.0], abs=1e-15)
    assert reg.penalty({"w": WK}) == pytest.approx(0.5 * 0.5 * lam0 * 2, rel=1e-12)
    assert reg.penalty({"w": WK}) == pytest.approx(0.052786, abs=1e-6)
    assert reg.metrics()["lambda_mean"] == pytest.approx(lam0 / 2, rel=1e-12)
    # A move along row 1 (unchanged in the epoch's start) costs nothing; along row 0 it does.
    moved = WG.clone()
    moved[1, 0] += 3.0
    assert reg.penalty({"w": moved}) == 0.0
    with pytest.raises(ConfigError) as info:
        LayerAdaptive(vectors="rows")
    assert info.value.setting == "aggregator.vectors"


def test_lambda_golden_conv_and_bias():
    # The same 2x2 numbers as a 1x1 conv [out=2, in=2, 1, 1], plus a bias b_g = [1, 0], b_k = [1, 1]:
    # bias lambda = 1 - cos([1, 1], [1, 0]) = 0.292893, d = 1, term 1/2 * 0.5 * 0.292893 = 0.073223.
    # Penalty 0.073223 + 0.073223 = 0.146447; lambda_mean = (0 + 0.292893 + 0.292893) / 3 = 0.195262.
    anchor = {"c.weight": WG.view(2, 2, 1, 1), "c.bias": torch.tensor([1.0, 0.0], dtype=torch.float64)}
    local = {"c.weight": WK.view(2, 2, 1, 1), "c.bias": torch.tensor([1.0, 1.0], dtype=torch.float64)}
    reg = OneClient(LayerAdaptive(q=0.5), anchor)
    reg.start_epoch(1, local)
    assert reg.coef["c.weight"].shape == (1, 2, 1, 1)
    assert reg.penalty(local) == pytest.approx(0.5 * LAMBDA_1, rel=1e-12)
    assert reg.penalty(local) == pytest.approx(0.146447, abs=1e-6)
    assert reg.metrics()["lambda_mean"] == pytest.approx(2 * LAMBDA_1 / 3, rel=1e-12)
    assert reg.metrics()["lambda_mean"] == pytest.approx(0.195262, abs=1e-6)


def test_lambda_is_held_fixed_during_the_epoch_and_metrics_average_epochs():
    reg = OneClient(LayerAdaptive(q=0.5), {"w": WG})
    reg.start_epoch(0, {"w": WK})
    reg.start_epoch(1, {"w": WK})  # lambda mean 0.146447
    # The penalty at other parameters uses the epoch's coefficients: w = W_g + 2 e_{01} moves only
    # column 1 (d_1 = 4), so 1/2 * 0.146447 * 4 = 0.292893; a pure column-0 move costs nothing.
    moved = WG.clone()
    moved[0, 1] += 2.0
    assert reg.penalty({"w": moved}) == pytest.approx(0.5 * 0.5 * LAMBDA_1 * 4, rel=1e-12)
    moved0 = WG.clone()
    moved0[1, 0] += 5.0
    assert reg.penalty({"w": moved0}) == 0.0
    # Epoch 2 at w_k = W_g: lambda = 0 for both neurons; lambda_mean averages the epochs >= 2 only:
    # (0.146447 + 0) / 2 = 0.073223.
    reg.start_epoch(2, {"w": WG})
    assert reg.metrics()["lambda_mean"] == pytest.approx(LAMBDA_1 / 4, rel=1e-12)
    # The state is per client and per round: the next client starts from a fresh one.
    assert OneClient(LayerAdaptive(q=0.5), {"w": WG}).metrics() == {"lambda_mean": 0.0}


def test_clients_stacked_keep_their_own_coefficients():
    # Two clients at once (the batched engine's call): client 0 at W_k, client 1 at W_g.
    reg, rows = LayerAdaptive(q=0.5), torch.tensor([0, 1])
    state = reg.init({"w": WG}, 2)
    stacked = {"w": torch.stack([WK, WG])}
    reg.start_epoch(state, rows, torch.tensor([False, False]), stacked, {"w": WG})
    pen = reg.penalty(state, stacked, {"w": WG}, rows)
    assert pen.tolist() == pytest.approx([0.5 * 0.5 * LAMBDA_1, 0.0], rel=1e-12)
    assert reg.metrics(state)["lambda_mean"].tolist() == pytest.approx([LAMBDA_1 / 2, 0.0], rel=1e-12)


def test_interpolate_form_golden():
    # c = q lambda^(1 - q).  q = 0.5: c_1 = 0.5 sqrt(0.292893) = 0.5 * 0.541196 = 0.270598;
    # penalty 1/2 * 0.270598 * 1 = 0.135299.  Epoch 1 (lambda = 0): 0.5 * 0^0.5 = 0.
    reg = OneClient(LayerAdaptive(q=0.5, form="interpolate"), {"w": WG})
    reg.start_epoch(0, {"w": WK})
    assert reg.penalty({"w": WK}) == 0.0
    reg.start_epoch(1, {"w": WK})
    assert reg.penalty({"w": WK}) == pytest.approx(0.25 * math.sqrt(LAMBDA_1), rel=1e-12)
    assert reg.penalty({"w": WK}) == pytest.approx(0.135299, abs=1e-6)
    # q = 1: c = lambda^0 = 1 from the first step (0^0 = 1), i.e. FedProx with mu = 1:
    # 1/2 ||W_k - W_g||^2 = 1/2 (1 + 1) = 1.
    reg = OneClient(LayerAdaptive(q=1.0, form="interpolate"), {"w": WG})
    prox = OneClient(Proximal(1.0), {"w": WG})
    for epoch in (0, 1):
        reg.start_epoch(epoch, {"w": WK})
        assert reg.penalty({"w": WK}) == pytest.approx(1.0, rel=1e-12)
        assert reg.penalty({"w": WK}) == prox.penalty({"w": WK})


# ----------------------------------------------------------------------------- local training

SPLIT = [range(0, 10), range(10, 33), range(33, 60)]  # n_k = 10, 23, 27 of tiny_data's 60


def train(data, regularizer, epochs=3, lr=0.5, batch_size=7, clients=(0, 1, 2), client_epochs=None):
    model = tiny_mlp(0)
    indices = [torch.tensor(list(r)) for r in SPLIT]
    local = LocalTraining(epochs=epochs, batch_size=batch_size, lr=lr)
    engine = on_partition(SequentialEngine, model, data.train_x, data.train_y, indices, local, regularizer, seed=0)
    params, buffers = split_state(model)
    return engine.train(params, buffers, list(clients), round_=1, epochs=client_epochs)


def update_norms(res):
    names = list(res.deltas)
    return torch.stack([torch.cat([res.deltas[k][j].flatten() for k in names]).norm()
                        for j in range(len(res.clients))])


@pytest.mark.parametrize("form", ["linear", "interpolate"])
def test_q0_is_fedavg_exactly(tiny_data, form):
    ref = train(tiny_data, None)
    lap = train(tiny_data, LayerAdaptive(q=0.0, form=form))
    for k in ref.deltas:
        assert torch.equal(lap.deltas[k], ref.deltas[k]), k
    assert torch.equal(lap.loss, ref.loss) and torch.equal(lap.steps, ref.steps)
    assert lap.extras["reg_loss"].tolist() == [0.0, 0.0, 0.0]
    assert bool((lap.extras["lambda_mean"] > 0).all())  # lambda is still measured
    assert ref.extras == {}


def test_one_epoch_is_fedavg_exactly(tiny_data):
    # E = 1: lambda = 0 throughout (regularization starts in epoch 2), whatever q.
    ref = train(tiny_data, None, epochs=1)
    lap = train(tiny_data, LayerAdaptive(q=1.0), epochs=1)
    for k in ref.deltas:
        assert torch.equal(lap.deltas[k], ref.deltas[k]), k
    assert lap.extras["reg_loss"].tolist() == [0.0, 0.0, 0.0]
    assert lap.extras["lambda_mean"].tolist() == [0.0, 0.0, 0.0]


def test_interpolate_q1_is_fedprox_mu1(tiny_data):
    prox = train(tiny_data, Proximal(1.0))
    lap = train(tiny_data, LayerAdaptive(q=1.0, form="interpolate"))
    ref = train(tiny_data, None)
    for k in prox.deltas:
        assert torch.allclose(lap.deltas[k], prox.deltas[k], rtol=1e-5, atol=1e-6), k
        assert not torch.allclose(lap.deltas[k], ref.deltas[k], rtol=1e-3, atol=1e-4), k
    assert torch.allclose(lap.loss, prox.loss, rtol=1e-5)


def test_regularization_shrinks_updates(tiny_data):
    # E = 3, lr 0.5, q = 1 (linear): measured norms ~ [1.42, 1.78, 1.42] against FedAvg's
    # ~ [1.53, 2.39, 1.76]; every client's update is shorter.
    ref = update_norms(train(tiny_data, None))
    lap_res = train(tiny_data, LayerAdaptive(q=1.0))
    lap = update_norms(lap_res)
    assert bool((lap < 0.97 * ref).all()), (lap.tolist(), ref.tolist())
    assert bool((lap_res.extras["reg_loss"] > 0).all())


def test_metrics_in_client_results(tiny_data):
    # A straggler's epochs: client 0 runs 1 epoch (lambda 0 throughout), clients 1-2 run 3 and 2.
    res = train(tiny_data, A.fedlap(q=0.5).regularizer, client_epochs=[1, 3, 2])
    assert set(res.extras) == {"reg_loss", "lambda_mean"}
    lam, reg = res.extras["lambda_mean"], res.extras["reg_loss"]
    assert lam.shape == (3,) and reg.shape == (3,) and lam.dtype == torch.float64
    assert lam[0].item() == 0.0 and reg[0].item() == 0.0
    assert bool((lam[1:] > 0).all() and (lam[1:] <= 2).all() and (reg[1:] > 0).all())
    # steps = epochs * ceil(n_k / B): 1*ceil(10/7) = 2, 3*ceil(23/7) = 12, 2*ceil(27/7) = 8.
    assert res.steps.tolist() == [2, 12, 8]
    assert res.epochs.tolist() == [1, 3, 2]


# ----------------------------------------------------------------------------- the aggregator and errors

def test_fedlap_aggregator_is_fedavg_on_the_server():
    agg = A.fedlap()
    assert agg.name == "fedlap" and not agg.weighting.per_layer and isinstance(agg.regularizer, LayerAdaptive)
    assert (agg.regularizer.q, agg.regularizer.form) == (0.5, "linear")
    deltas = {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)}
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    out = aggregate(agg, params, deltas, torch.tensor([1, 3]), [Layer("w", "fc", ("w",))])
    assert out.weights.tolist() == [0.25, 0.75]
    assert out.sent["w"].tolist() == pytest.approx([0.25, 0.75])


@pytest.mark.parametrize("q", [-0.1, 1.5, float("nan")])
def test_bad_q(q):
    with pytest.raises(ConfigError) as err:
        LayerAdaptive(q=q)
    assert err.value.setting == "aggregator.q"
    with pytest.raises(ConfigError, match="aggregator.q"):
        A.fedlap(q=q)


def test_bad_form():
    with pytest.raises(ConfigError) as err:
        A.fedlap(form="quadratic")
    assert err.value.setting == "aggregator.form"
    assert "linear" in str(err.value) and "interpolate" in str(err.value)


def test_bad_q_through_the_cli_precheck():
    from fedrun.command.cli import precheck

    with pytest.raises(ConfigError) as err:
        precheck(["aggregator=fedlap", "aggregator.q=2"])
    assert err.value.setting == "aggregator.q"


# ----------------------------------------------------------------------------- experiment presets



@pytest.mark.parametrize("preset,dataset,model,params", [
    ("cifar10", "cifar10", "TFTutorialCNN", 122_570),
    # 784 * 200 + 200 + 200 * 10 + 10 = 159,010: FedLap's two-layer MLP.
    ("mnist", "mnist", "MLP", 159_010),
    ("fmnist", "fmnist", "MLP", 159_010),
])
def test_fedlap_presets(preset, dataset, model, params):
    from hydra.utils import instantiate

    from fedrun.command import build
    from fedrun.models.layers import count_parameters

    cfg = compose([f"experiment=fedlap/{preset}"])
    assert cfg.dataset.name == dataset
    assert cfg.partition._target_ == "fedrun.data.partition.shards" and cfg.partition.shards_per_client == 2
    h = cfg.hyperparams
    assert (h.optimizer, h.lr, h.momentum, h.nesterov) == ("sgd", 0.01, 0.9, False)
    assert (h.local_epochs, h.batch_size, h.num_clients, h.client_fraction) == (10, 10, 100, 0.1)
    assert (h.stragglers, h.dropouts) == (0.0, 0.0)
    assert cfg.aggregator._target_ == "fedrun.aggregators.fedlap"
    # "For q = 0 and q = 1, FedLap becomes FedAvg and FedProx": the interpolate form, and the FedProx
    # compared is its q = 1 end (mu = 1); plain aggregator=fedlap keeps the linear form.
    assert (cfg.aggregator.q, cfg.aggregator.form) == (0.5, "interpolate")
    assert compose(["aggregator=fedlap"]).aggregator.form == "linear"
    net = instantiate(cfg.model)
    assert type(net).__name__ == model and count_parameters(net) == params
    objects = build.build(cfg)
    assert objects["local"].momentum == 0.9 and objects["local"].epochs == 10
    assert objects["federation"].per_round == 10
    reg = objects["aggregator"].regularizer
    assert isinstance(reg, LayerAdaptive) and reg.q == 0.5
    # The comparison runs of Figs. 1-4: FedProx picks the preset's mu; stragglers as an override.
    prox = compose([f"experiment=fedlap/{preset}", "aggregator=fedprox", "hyperparams.stragglers=0.9"])
    assert prox.aggregator.mu == 1.0
    assert compose(["aggregator=fedprox"]).aggregator.mu == 0.01  # outside the FedLap presets
    assert build.build(prox)["participation"].stragglers == 0.9
