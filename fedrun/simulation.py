"""The federated round loop: sample, train locally, aggregate, evaluate, record, checkpoint."""
from __future__ import annotations

import errno
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fedrun.aggregators import Aggregator, RoundOutcome, init_rule_state, server_round
from fedrun.data import FederatedData
from fedrun.divergence import Divergence, LearnerParams, mean_size, round_divergence, vanilla_indices
from fedrun.engine import LocalTraining, SequentialEngine, evaluate, split_state
from fedrun.errors import ConfigError, DivergenceError, Interrupted, NoSpaceError, check, first_line
from fedrun.layers import layers as model_layers
from fedrun.nwda import Params, layer_grams
from fedrun.participation import Participation
from fedrun.partition import class_counts, fingerprint
from fedrun.recorder import CsvLog, atomic_save, summarize, write_json
from fedrun.rundir import CHECKPOINT, RunDirectory, refuse_existing_run
from fedrun.seeding import clients_per_round, sample_clients

log = logging.getLogger(__name__)

# Seconds: local training (with the vanilla reference), evaluation, the whole round.  The only
# columns that differ between two runs of the same config and seed.
TIMING_COLUMNS = ("train_s", "eval_s", "wall_s")
ROUND_COLUMNS = [
    "round", "clients", "test_acc", "test_loss", "average_test_acc", "average_test_loss",
    "sent_test_acc", "sent_test_loss", "val_acc", "val_loss", "train_loss", "N", "E", "N_over_E", "server_step", "server_step_sum",
    "N_conv", "E_conv", "server_step_conv", "N_fc", "E_fc", "server_step_fc", "pd_ls", "pd_vl",
    "vanilla_loss", "lr", "skipped", "dropped", "stragglers", *TIMING_COLUMNS,
]
LAYER_COLUMNS = ["round", "layer", "type", "params", "N", "E", "N_over_E", "server_step", "pd_ls", "pd_vl"]
OUTPUT_COLUMNS = ["round", "client", "class", "weight_norm", "bias"]
CLIENT_COLUMNS = ["round", "client", "examples", "weight", "update_norm", "angle", "smoothed_angle",
                  "loss", "steps", "epochs", "straggler", "dropped", "reg_loss", "lambda_mean"]
CLIENT_LAYER_COLUMNS = ["round", "client", "layer", "update_norm", "angle", "smoothed_angle", "weight"]
COLUMNS = {"rounds": ROUND_COLUMNS, "layers": LAYER_COLUMNS, "clients": CLIENT_COLUMNS,
           "client_layers": CLIENT_LAYER_COLUMNS, "output_layer": OUTPUT_COLUMNS}


@dataclass(frozen=True)
class Federation:
    """Who trains when (Nagura et al. Table 1: total rounds, C, K)."""

    rounds: int = 10
    num_clients: int = 100  # K
    client_fraction: float = 0.1  # C; m = max(C K, 1) clients a round
    eval_every: int = 1

    vanilla_every: int = 0  # PD-VL's vanilla reference learner every n rounds (0: never)
    snapshots: tuple[int, ...] = ()  # rounds whose evaluated global model is saved to models/

    def __post_init__(self):
        check(self.rounds >= 1, "hyperparams.rounds", self.rounds, "must be >= 1")
        check(self.vanilla_every >= 0, "vanilla_every", self.vanilla_every, "must be >= 0 (0: off)")
        check(all(1 <= r <= self.rounds for r in self.snapshots), "snapshots", list(self.snapshots),
              f"rounds between 1 and hyperparams.rounds ({self.rounds})")
        check(self.num_clients >= 1, "hyperparams.num_clients", self.num_clients, "must be >= 1")
        check(0 < self.client_fraction <= 1, "hyperparams.client_fraction", self.client_fraction,
              "must be in (0, 1]")
        check(self.eval_every >= 1, "hyperparams.eval_every", self.eval_every, "must be >= 1")

    @property
    def per_round(self) -> int:
        return clients_per_round(self.num_clients, self.client_fraction)

    def vanilla_round(self, t: int) -> bool:
        """Rounds 1, 1 + n, 1 + 2n, ... get the PD-VL reference (round 1 shows the early divergence)."""
        return self.vanilla_every > 0 and (t - 1) % self.vanilla_every == 0


def _ratio(n: float, e: float) -> float:
    return n / e if e > 0 else float("nan")


def simulate(run_dir: str | Path, data: FederatedData, make_model: Callable[[], nn.Module],
             partition: Callable[..., list[np.ndarray]], aggregator: Aggregator,
             local: LocalTraining, federation: Federation,
             participation: Participation = Participation(), make_engine: Callable = SequentialEngine,
             seed: int = 0,
             device: str | torch.device = "cpu", resume: bool = False,
             targets: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.99), progress: bool = True,
             config: dict | None = None) -> dict:
    """Run (or resume) one federated simulation and write its run directory.

    Args:
      run_dir: where ``rounds.csv``, ``layers.csv``, ``clients.csv``, ``client_layers.csv``,
        ``output_layer.csv``, ``partition.csv``, ``checkpoint.pt``, ``models/`` (snapshots),
        ``config.yaml``, ``fedrun.log`` and ``summary.json`` go.
      data: normalized tensors on ``device``.
      make_model: builds the architecture (called once, after seeding with ``seed``).
      partition: ``partition(labels, num_clients, num_classes, seed) -> [indices per client]``.
      aggregator, local, federation: the method, the client optimizer, the schedule.
      participation: stragglers and drop-outs.  ``federation.vanilla_every`` adds the PD-VL
        reference learner; PD-Ls (:mod:`fedrun.divergence`) is computed every round.
      make_engine: builds the client engine (``SequentialEngine``, ``BatchedEngine``, ...).
      resume: continue from ``checkpoint.pt`` if there is one.
      targets: accuracies whose first round the summary reports.
      config: the run's settings, written to ``config.yaml`` (on resume: compared with it).

    Returns:
      The summary dict written to ``summary.json``.

    Everything that can fail on the inputs (model, partition, engine) is built before the run
    directory is created; the directory is then locked for this process (:mod:`fedrun.rundir`).
    """
    run_dir = Path(run_dir)
    if not resume:
        refuse_existing_run(run_dir)  # fail before the work below

    torch.manual_seed(seed)
    model = _build_model(make_model, data, device)
    layers = model_layers(model)
    labels = data.train_y.cpu().numpy()
    parts = partition(labels=labels, num_clients=federation.num_clients,
                      num_classes=data.num_classes, seed=seed)
    print_ = fingerprint(parts)
    counts = class_counts(parts, labels, data.num_classes)
    client_indices = [torch.as_tensor(p, dtype=torch.long, device=device) for p in parts]
    # One more slot: the PD-VL vanilla reference learner, client K to the engine, whose IID data
    # is redrawn on the rounds that compute it (its batches then derive from (seed, round, K)).
    reference = federation.num_clients
    client_indices.append(client_indices[0][:0])
    engine = make_engine(model, data.train_x, data.train_y, client_indices, local,
                         aggregator.regularizer, seed)
    params, buffers = split_state(model)
    server_state = aggregator.server.init(params)
    rule_state = init_rule_state(aggregator, federation.num_clients, layers)
    opt = OptimizerStates(local, params)
    output_layer = _output_layer(model, layers)
    step_sum, first_round, offsets = 0.0, 1, None

    with RunDirectory.open(run_dir, resume) as run:
        ckpt = run.checkpoint(device) if resume else None
        run.write_config(config, resume)  # on resume: refuses settings that differ from the run's
        if ckpt is not None:
            if ckpt.get("partition") != print_:
                raise ConfigError("resume", "true", f"the checkpoint's partition ({ckpt.get('partition')}) differs "
                                  f"from this config's ({print_}); use the run's original settings")
            run.check_csvs(COLUMNS, ckpt["offsets"])
        if ckpt is not None and ckpt["round"] >= federation.rounds and (run_dir / "summary.json").is_file():
            log.info("%s is complete (%d of %d rounds); nothing to do", run_dir, ckpt["round"], federation.rounds)
            return json.loads((run_dir / "summary.json").read_text())
        run.start_log()
        log.info("run directory %s", run_dir.resolve())
        log.info("engine: %s", type(engine).__name__)
        if ckpt is not None:
            params, buffers, server_state = ckpt["params"], ckpt["buffers"], ckpt["server_state"]
            rule_state, opt.state = ckpt["rule_state"], ckpt.get("optimizer_state")
            step_sum, first_round, offsets = ckpt["step_sum"], ckpt["round"] + 1, ckpt["offsets"]
            log.info("resuming %s after round %d", run_dir, ckpt["round"])
        try:
            _write_partition(run_dir / "partition.csv", counts)
            logs = {name: CsvLog(run_dir / f"{name}.csv", cols, offsets and offsets.get(name))
                    for name, cols in COLUMNS.items()}
            m = federation.per_round
            log.info("%s: K=%d clients (%d a round), %d rounds, partition %s, %d parameters",
                     aggregator.name, federation.num_clients, m, federation.rounds, print_,
                     sum(p.numel() for p in params.values()))
            types = np.array([layer.type for layer in layers])
            # Small evaluation batches are fastest on CPU caches, large ones keep a GPU busy.
            eval_batch = 256 if torch.device(device).type == "cpu" else 4096
            sizes = [sum(params[p].numel() for p in layer.params) for layer in layers]
            done = first_round - 1  # the last round whose checkpoint is on disk

            bar = tqdm(range(first_round, federation.rounds + 1), initial=first_round - 1,
                       total=federation.rounds, desc=aggregator.name, unit="round", disable=not progress,
                       dynamic_ncols=True)
            last_acc = float("nan")
            try:
                for t in bar:
                    t0 = time.perf_counter()
                    sampled = sample_clients(seed, t, federation.num_clients, m)
                    clients, epochs, dropped, stragglers = participation.draw(seed, t, sampled, local.epochs)
                    lr = local.lr_at(t, federation.rounds)
                    row = {"round": t, "clients": len(clients), "dropped": len(dropped),
                           "stragglers": len(stragglers), "lr": lr}
                    client_rows = [{"round": t, "client": k, "examples": len(parts[k]), "dropped": 1}
                                   for k in dropped]
                    if clients:
                        starts = opt.starting(clients)
                        t_train = time.perf_counter()
                        results = engine.train(params, buffers, clients, t, epochs, lr, starts)
                        learners = LearnerParams(params, results.deltas)  # w_k^t = w^{t-1} + dw_k, read lazily
                        vanilla = None
                        if federation.vanilla_round(t):  # the vanilla-updated w_{-1}^t of Definition 1
                            client_indices[reference] = vanilla_indices(
                                len(data.train_y), mean_size(results.num_examples), seed, t, device)
                            start = None if starts is None else {k: v.mean(0, keepdim=True) for k, v in starts.items()}
                            vanilla = engine.train(params, buffers, [reference], t, [local.epochs], lr, start)
                            row["vanilla_loss"] = float(vanilla.loss[0])
                        _sync(device)
                        row["train_s"] = time.perf_counter() - t_train
                        # Every inner product of the round's diagnostics in one pass over the updates:
                        # N and E, the clients' angles, and the learners' divergence (fedrun.nwda).
                        grams = layer_grams(results.deltas, layers, params,
                                            None if vanilla is None else {k: v[0] for k, v in vanilla.deltas.items()})
                        divergence = round_divergence(grams)
                        out = server_round(aggregator, params, server_state, results.deltas, results.buffers,
                                           results.num_examples, layers, clients, rule_state, grams)
                        _check_finite(out, results.loss, t, aggregator.name)
                        step_sum += out.server_step
                        row.update(_norm_columns(out, types))
                        row.update(train_loss=float(out.stats_weights @ results.loss), server_step_sum=step_sum,
                                   skipped=int(out.skipped), pd_ls=divergence.ls, pd_vl=divergence.vl)
                        client_rows += _client_rows(t, results, out, stragglers)
                        opt.finish(clients, results.opt_states, out.stats_weights)
                        params, buffers, server_state, rule_state = out.sent, out.buffers, out.server_state, out.rule_state
                        models = {"average": out.average, "sent": out.sent}
                    else:  # everyone dropped out: the server keeps w_t
                        row.update(skipped=1, server_step=0.0, server_step_sum=step_sum)
                        models = {"average": params, "sent": params}
                    if t % federation.eval_every == 0 or t == federation.rounds:
                        t_eval = time.perf_counter()
                        row.update(_evaluate(model, models, buffers, aggregator.evaluate, data, eval_batch))
                        row["eval_s"] = time.perf_counter() - t_eval  # .item()s of the accuracies synchronize
                        last_acc = row["test_acc"]
                    _sync(device)
                    row["wall_s"] = time.perf_counter() - t0

                    logs["rounds"].append([row])
                    if clients:
                        logs["layers"].append(_layer_rows(t, out, layers, sizes, divergence))
                        logs["client_layers"].append(_client_layer_rows(t, results, out, layers))
                        if output_layer is not None:
                            logs["output_layer"].append(_output_rows(t, clients, learners, *output_layer))
                    logs["clients"].append(sorted(client_rows, key=lambda r: r["client"]))
                    if t in federation.snapshots:
                        (run_dir / "models").mkdir(exist_ok=True)
                        atomic_save({"round": t, "params": models[aggregator.evaluate], "buffers": buffers},
                                    run_dir / "models" / f"round_{t:04d}.pt")

                    atomic_save({"round": t, "params": params, "buffers": buffers, "server_state": server_state,
                                 "rule_state": rule_state, "optimizer_state": opt.state, "step_sum": step_sum,
                                 "partition": print_, "offsets": {name: lg.size() for name, lg in logs.items()}},
                                run_dir / CHECKPOINT)
                    done = t
                    bar.set_postfix(acc=f"{last_acc:.4f}", N_E=f"{row.get('N_over_E', float('nan')):.3f}")
            finally:
                bar.close()

            summary = {"aggregator": aggregator.name, "partition_fingerprint": print_,
                       **summarize(run_dir / "rounds.csv", list(targets))}
            write_json(summary, run_dir / "summary.json")
        except KeyboardInterrupt:
            raise Interrupted(done) from None
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(f"no space left on the device writing to {run_dir} (after round {done}); "
                                   "free space, then resume with resume=true") from None
            raise
    return summary


def _build_model(make_model: Callable[[], nn.Module], data: FederatedData, device) -> nn.Module:
    """The model, checked on one training image: a model that cannot be built for the data's
    shape, or cannot take its images, is one line before anything is written."""
    shape = "x".join(map(str, data.train_x.shape[1:]))
    try:
        model = make_model().to(device)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a constructor's arithmetic on a too-small image, ...
        raise ConfigError("model", type(e).__name__, f"cannot be built for the dataset's {shape} images: "
                          f"{first_line(e)}") from None
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(data.train_x[:1])
    except Exception as e:  # noqa: BLE001 - shape mismatches surface as RuntimeError
        raise ConfigError("model", type(model).__name__, f"cannot take the dataset's {shape} images "
                          f"(check dataset.channels and dataset.image_size): {first_line(e)}") from None
    finally:
        model.train(training)
    return model


def _evaluate(model, models: dict, buffers, evaluate_which: str, data: FederatedData, batch: int) -> dict:
    """Test (and validation) accuracy and loss of the evaluated model; when the model sent to
    clients differs from the average-aggregated one (FedNNNN sec. 4.1), both models' test
    accuracy, evaluating only the one not yet done."""
    evaluated = {**models[evaluate_which], **buffers}
    row = dict(zip(("test_acc", "test_loss"), evaluate(model, evaluated, data.test_x, data.test_y, batch)))
    if data.val_x is not None:
        row["val_acc"], row["val_loss"] = evaluate(model, evaluated, data.val_x, data.val_y, batch)
    if any(not torch.equal(models["sent"][k], models["average"][k]) for k in models["sent"]):
        other = "sent" if evaluate_which == "average" else "average"
        row[f"{evaluate_which}_test_acc"], row[f"{evaluate_which}_test_loss"] = row["test_acc"], row["test_loss"]
        row[f"{other}_test_acc"], row[f"{other}_test_loss"] = evaluate(
            model, {**models[other], **buffers}, data.test_x, data.test_y, batch)
    return row


class OptimizerStates:
    """Client optimizer state across rounds (``hyperparams.optimizer_state``).

    ``reset``: none (every client starts from zero each round).  ``average`` (the
    parameter-divergence paper's "-A"): the server averages the clients' final states with the
    aggregation's base weights, as it averages weights and biases, and sends the mean to the next
    round's clients.  ``local`` ("-WB"): only weights and biases are averaged; each client keeps
    its own state for the next time it is sampled (zero before its first round).
    """

    def __init__(self, local: LocalTraining, params: Params):
        self.mode = local.optimizer_state if local.carries_state else "reset"
        self.fresh = local.fresh_state(params)
        self.state = None if self.mode == "reset" else {} if self.mode == "local" else self.fresh

    def starting(self, clients: list[int]) -> Params | None:
        """The round's starting states, stacked ``[m, ...]`` in client order (None: reset)."""
        if self.mode == "reset":
            return None
        if self.mode == "average":
            return {k: v.unsqueeze(0).expand(len(clients), *v.shape).clone() for k, v in self.state.items()}
        own = [self.state.get(k, self.fresh) for k in clients]
        return {name: torch.stack([s[name] for s in own]) for name in self.fresh}

    def finish(self, clients: list[int], final: Params | None, weights: torch.Tensor) -> None:
        if self.mode == "average":
            self.state = {k: torch.tensordot(weights.to(v.dtype), v, dims=1) for k, v in final.items()}
        elif self.mode == "local":
            for j, k in enumerate(clients):
                self.state[k] = {name: v[j].clone() for name, v in final.items()}


def _output_layer(model: nn.Module, layers) -> tuple[str, str | None] | None:
    """The last fully connected layer's weight and bias names (the neurons d_q of the paper's
    Appendix B, one row per class q), or None when the model ends otherwise."""
    last = [layer for layer in layers if layer.type == "fc"]
    if not last:
        return None
    weight = next((p for p in last[-1].params if p.endswith("weight")), None)
    bias = next((p for p in last[-1].params if p.endswith("bias")), None)
    return None if weight is None else (weight, bias)


def _output_rows(t: int, clients: list[int], learners, weight: str, bias: str | None) -> list[dict]:
    """Per learner and class: the norm of the output neuron's weight row (the paper's Fig. 1)."""
    norms = learners[weight].double().flatten(2).norm(dim=2).tolist()  # [m][classes]
    biases = learners[bias].tolist() if bias else None
    return [{"round": t, "client": k, "class": q, "weight_norm": norms[j][q],
             "bias": biases[j][q] if bias else None}
            for j, k in enumerate(clients) for q in range(len(norms[j]))]


# Row builders: each tensor family crosses to the host once (``tolist``), not one ``float()`` per
# client and layer, which on a GPU would be a synchronization each.

def _layer_rows(t: int, out: RoundOutcome, layers, sizes: list[int], divergence: Divergence) -> list[dict]:
    s = out.stats
    n, e, step = s.layer_N.tolist(), s.layer_E.tolist(), out.step_layer_norms.tolist()
    ls = divergence.layer_ls.tolist()
    vl = [None] * len(layers) if divergence.layer_vl is None else divergence.layer_vl.tolist()
    return [{"round": t, "layer": layer.name, "type": layer.type, "params": sizes[i], "N": n[i], "E": e[i],
             "N_over_E": _ratio(n[i], e[i]), "server_step": step[i], "pd_ls": ls[i], "pd_vl": vl[i]}
            for i, layer in enumerate(layers)]


def _norm_columns(out: RoundOutcome, types: np.ndarray) -> dict:
    """N, E, N/E and the server step for the whole model and per layer type (conv, fc)."""
    n, e = out.stats.N, out.stats.E
    row = {"N": n, "E": e, "N_over_E": _ratio(n, e), "server_step": out.server_step}
    for kind in ("conv", "fc"):
        mask = torch.as_tensor(types == kind)
        if mask.any():
            nk, ek = out.stats.group(mask, out.stats_weights)
            row.update({f"N_{kind}": nk, f"E_{kind}": ek,
                        f"server_step_{kind}": float(out.step_layer_norms[mask].pow(2).sum().sqrt())})
    return row


def _client_rows(t: int, results, out: RoundOutcome, stragglers: set[int]) -> list[dict]:
    smoothed = out.diagnostics.get("smoothed_angle")
    columns = {"examples": results.num_examples, "weight": out.client_weights, "update_norm": out.stats.client_norms,
               "angle": out.stats.angles(), "loss": results.loss, "steps": results.steps, "epochs": results.epochs,
               **results.extras}
    if smoothed is not None and smoothed.ndim == 1:
        columns["smoothed_angle"] = smoothed
    values = {name: v.tolist() for name, v in columns.items()}
    return [{"round": t, "client": k, **{name: v[j] for name, v in values.items()},
             "straggler": int(k in stragglers), "dropped": 0}
            for j, k in enumerate(results.clients)]


def _client_layer_rows(t: int, results, out: RoundOutcome, layers) -> list[dict]:
    angles, norms = out.stats.layer_angles().tolist(), out.stats.client_sq.sqrt().tolist()
    smoothed = out.diagnostics.get("smoothed_angle")
    smoothed = smoothed.tolist() if smoothed is not None and smoothed.ndim == 2 else None
    weights = out.weights.T.tolist() if out.weights.ndim == 2 else [[w] * len(layers) for w in out.weights.tolist()]
    return [{"round": t, "client": k, "layer": layer.name, "update_norm": norms[j][i], "angle": angles[j][i],
             "weight": weights[j][i], "smoothed_angle": None if smoothed is None else smoothed[j][i]}
            for j, k in enumerate(results.clients) for i, layer in enumerate(layers)]


def _sync(device) -> None:
    """Wait for queued GPU work, so that a timing column holds the work it names."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _check_finite(out: RoundOutcome, losses: torch.Tensor, t: int, name: str) -> None:
    """Both models: the one sent to clients (the server state, e.g. FedNNNN's normalized model)
    and the average-aggregated one that is evaluated; they differ when the server transforms."""
    models = {"sent": out.sent, "average": out.average}
    names = [(which, k) for which, model in models.items() for k in model]
    flags = [torch.isfinite(models[which][k]).all() for which, k in names]
    flags.append(torch.isfinite(losses).all().to(flags[0].device))
    finite = torch.stack(flags).tolist()  # one transfer for every check
    bad = [name for name, ok in zip(names, finite) if not ok]
    norms_ok = math.isfinite(out.stats.N) and math.isfinite(out.stats.E)
    if bad or not norms_ok or not finite[-1]:
        what = (f"parameter {bad[0][1]} of the {bad[0][0]} model" if bad else "the update norm N or E"
                if not norms_ok else "the local training loss")
        raise DivergenceError(f"round {t}: {what} is NaN or Inf after aggregation with {name}; the "
                              f"CSVs hold rounds before {t}. Try a smaller hyperparams.lr (or beta/gamma)")


def _write_partition(path: Path, counts: np.ndarray) -> None:
    header = "client,examples," + ",".join(f"class_{c}" for c in range(counts.shape[1]))
    lines = [header] + [f"{k},{row.sum()}," + ",".join(map(str, row)) for k, row in enumerate(counts)]
    path.write_text("\n".join(lines) + "\n")
