#!/usr/bin/env python
"""The loss surface of a run's global model (the parameter-divergence paper's Figure 4 and
Figures 31-32; footnote 9, after Li et al., "Visualizing the loss landscape of neural nets", 2018).

``L(a, b) = loss(theta + a d1 + b d2)`` on a ``--grid`` x ``--grid`` grid of ``a, b`` in
``[-span, span]``, where theta is the global model of the run (``checkpoint.pt``, the last round,
or ``--snapshot ROUND``: ``models/round_XXXX.pt``, written when the run had ``snapshots: [...]``)
and d1, d2 are two filter-normalized Gaussian directions (each conv filter / fc row scaled to the
norm of the model's; biases and normalization parameters not moved), made orthogonal
(``--no-orthogonalize`` keeps Li et al.'s plain random pair).  The loss is the mean cross-entropy
in eval mode (BatchNorm's running statistics of the checkpoint) on ``--samples`` training examples
drawn with ``--seed``.  Model and data are rebuilt from the run's ``config.yaml`` as ``fedrun``
built them (the ``model`` class and the ``dataset.load`` loader with their settings, and
``fedrun.data.preparation.prepare`` with the config's mean/std, normalization, validation split and seed).
Nothing in a run directory runs code: only fedrun's own model classes and dataset loaders are
built (anything else a ``config.yaml`` names is refused in one line, exit 2, nothing written),
checkpoints are read as tensors only, and the data is not downloaded unless ``--download``.

Writes to ``--out``: ``loss_surface.csv`` (alpha, beta, loss, accuracy), ``loss_surface.png``
(contours with their levels marked; ``+`` the centre, ``x`` the grid's minimum; ``--mark-level``
adds red dashed contours at fixed loss values, as the paper's red boxes, to compare runs) and
``loss_surface.json`` (the summary below).  Prints the centre and minimum loss and two sharpness
figures: Keskar et al.'s (2017) ``100 (max_{|(a,b)| <= r} L - L(0,0)) / (1 + L(0,0))`` over the disc
of radius ``r = span/2`` and the mean second difference of L at the centre along d1 and d2.

Example: ``python scripts/pd/loss_surface.py outputs/pd/cifar10/noniid2/neta_baseline_adam-wb_seed0
--snapshot 25 --grid 21 --span 1 --out outputs/pd_surfaces/adam_wb_r25``.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

if not __package__:  # python scripts/pd/loss_surface.py: the checkout's root on the path, for scripts.*
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import numpy as np
import torch
from scripts.common.papers import finite, integer, one_line_errors, positive
from scripts.common.plots import save_figure

from fedrun import results
from fedrun.errors import ArgumentParser, FedrunError, RunDirectoryError, UsageError, first_line
from fedrun.paths import writable_folder
from fedrun.plot import pyplot
from fedrun.results import Run
from fedrun.harness.rundir import check_own_targets, load_checkpoint

plt = pyplot()


def load_state(run_dir: Path, snapshot: int | None, device) -> tuple[dict, dict, int, Path]:
    """``(params, buffers, round, path)`` of the run's checkpoint or of ``models/round_XXXX.pt``."""
    if snapshot is None:
        path = run_dir / "checkpoint.pt"
    else:
        path = run_dir / "models" / f"round_{snapshot:04d}.pt"
    if not path.is_file():
        have = sorted(p.name for p in (run_dir / "models").glob("round_*.pt")) if (run_dir / "models").is_dir() else []
        hint = f"; snapshots there: {', '.join(have)}" if have else \
            " (set `snapshots: [ROUND, ...]` in the run's config to save them)" if snapshot is not None else ""
        raise RunDirectoryError(f"{path}: no such checkpoint{hint}")
    # Tensors and plain containers only: a crafted file cannot run code (one line if it tries).
    state = load_checkpoint(path, device)
    if not isinstance(state, dict) or not isinstance(state.get("params"), dict) \
            or not isinstance(state.get("buffers") or {}, dict):
        raise RunDirectoryError(f"{path}: not a fedrun checkpoint or snapshot (no params and buffers)")
    return dict(state["params"]), dict(state.get("buffers") or {}), int(state.get("round", -1)), path


def build(run_dir: Path, device, data_root: str | None = None, download: bool = False):
    """The run's model and prepared data, rebuilt from its ``config.yaml`` as ``fedrun`` does.

    Only fedrun's own model classes and dataset loaders are built (:data:`fedrun.harness.rundir.MODEL_TARGETS`,
    :data:`fedrun.harness.rundir.DATA_LOADERS`), with the config's plain values: a crafted ``config.yaml``
    naming anything else is one line, and nothing is called.  The data is not downloaded unless
    ``download`` (into ``data_root``, else the run's)."""
    import inspect

    from fedrun.data.preparation import prepare
    from fedrun.harness.rundir import DATA_LOADERS, MODEL_TARGETS, run_object

    config = results.read_config(run_dir)
    source = run_dir / "config.yaml"
    make_model, model_kwargs = run_object(config, "model", MODEL_TARGETS, source)
    load, load_kwargs = run_object(config, "dataset.load", DATA_LOADERS, source)
    parameters = inspect.signature(load).parameters
    if data_root is not None and "root" in parameters:
        load_kwargs["root"] = data_root
    if "download" in parameters:
        load_kwargs["download"] = download
    try:
        model = make_model(**model_kwargs).to(device)
    except Exception as e:  # noqa: BLE001 - a config's settings the class does not take, in one line
        raise RunDirectoryError(f"{source}: model {make_model.__name__} cannot be built from it: "
                                f"{first_line(e)}") from None
    raw = load(**load_kwargs)  # fedrun's loaders fail in one line (DataError)
    ds = config["dataset"]
    seed = config.get("seed", 0)
    validation = (config.get("hyperparams") or {}).get("validation_fraction") or 0.0
    try:
        data = prepare(raw, ds.get("mean"), ds.get("std"), float(validation), int(seed), device, ds.get("max_train"),
                       ds.get("max_test"), normalize=ds.get("normalize", "per_channel"),
                       per_class=ds.get("per_class"))
    except FedrunError:
        raise
    except Exception as e:  # noqa: BLE001 - damaged dataset settings
        raise RunDirectoryError(f"{source}: its dataset settings cannot be used: {first_line(e)}") from None
    return model, data


def training_subset(data, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` training examples drawn without replacement with ``seed`` (all when fewer)."""
    n = len(data.train_y)
    if samples <= 0 or samples >= n:
        return data.train_x, data.train_y
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:samples].sort().values
    idx = idx.to(data.train_y.device)
    return data.train_x[idx], data.train_y[idx]


def grid_coordinates(points: int, span: float) -> list[float]:
    """``points`` evenly spaced values in ``[-span, span]`` with an exact 0 in the middle."""
    if points < 3 or points % 2 == 0:
        raise UsageError(f"--grid={points}: must be odd and >= 3 (the centre must be a grid point)")
    half = points // 2
    return [span * i / half for i in range(-half, half + 1)]


def _title(run_dir: Path) -> str:
    try:
        from scripts.pd import tables as pd_tables

        run = Run.load(run_dir)
        key = pd_tables.identify(run)[0]
        if key is not None:
            dataset, network, optimizer, variant, setting = key
            where = f"{pd_tables.DATASET_LABELS.get(dataset, dataset)} {pd_tables.SETTING_LABELS.get(setting, setting)}"
            return f"{network} {pd_tables.OPTIMIZER_LABELS[optimizer]}{' ' + variant if variant else ''}, {where}"
    except Exception:  # noqa: BLE001 - a title is optional
        pass
    return run_dir.name


def _notes(run_dir: Path) -> list[str]:
    try:
        from scripts.pd import tables as pd_tables

        run = Run(run_dir, results.read_config(run_dir), {})
        key = pd_tables.identify(run)[0]
        return pd_tables.run_notes(run, key) if key is not None else []
    except Exception:  # noqa: BLE001
        return []


def plot(losses: np.ndarray, alphas: list[float], betas: list[float], summary: dict, title: str,
         levels: int, mark: list[float], notes: list[str], path: Path, vmax: float | None = None) -> None:
    """Figure 4 style: contour lines of L(a, b) with their values, filled beneath (up to ``vmax``)."""
    A, B = np.meshgrid(alphas, betas, indexing="ij")
    finite = losses[np.isfinite(losses)]
    lo, hi = float(finite.min()), float(finite.max())
    if vmax is not None and lo < vmax < hi:
        hi = vmax
        losses = np.minimum(losses, vmax)
    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    if hi > lo:
        lv = np.linspace(lo, hi, levels + 2)[1:-1]
        ax.contourf(B, A, losses, levels=np.linspace(lo, hi, 4 * levels), cmap="viridis", alpha=0.85)
        cs = ax.contour(B, A, losses, levels=lv, colors="white", linewidths=0.7)
        ax.clabel(cs, fmt="%.2f", fontsize=6)
        for level in mark:
            if lo < level < hi:
                m = ax.contour(B, A, losses, levels=[level], colors="red", linestyles="dashed", linewidths=1.4)
                ax.clabel(m, fmt="%.2f", fontsize=7)
    ax.plot(0, 0, "+", color="red", markersize=10, label=f"centre: {summary['centre']:.3f}")
    a_min, b_min = summary["argmin"]
    ax.plot(b_min, a_min, "x", color="orange", markersize=8, label=f"minimum: {summary['min']:.3f}")
    ax.set_xlabel(r"$\beta$ (direction $\gamma$)")
    ax.set_ylabel(r"$\alpha$ (direction $\delta$)")
    ax.set_aspect("equal")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"{title}\nround {summary['round']}: Keskar sharpness {summary['keskar']:.1f}, "
                 f"curvature {summary['curvature']:.2f}", fontsize=8)
    save_figure(fig, path, notes, bottom=0.05)


def _device(text: str) -> str:
    """``--device``: auto, or a device torch knows that this machine has (cuda only with CUDA)."""
    if text == "auto":
        return text
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r}: give auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available here; give auto or cpu")
    return text


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="loss_surface.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a fedrun run directory (config.yaml, checkpoint.pt)")
    p.add_argument("--snapshot", type=integer(0, "a round"), default=None, metavar="ROUND",
                   help="use models/round_XXXX.pt of this round (default: checkpoint.pt, the last round)")
    p.add_argument("--grid", type=int, default=21, help="points per axis, odd (default 21)")
    p.add_argument("--span", type=positive, default=1.0, help="alpha and beta range over [-span, span] (default 1)")
    p.add_argument("--samples", type=integer(0, "a number of examples"), default=2000,
                   help="training examples the loss is averaged over (default 2000; 0 = all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the directions and of the examples (default 0)")
    p.add_argument("--batch-size", type=integer(1, "a batch size"), default=1000, help="evaluation batch size (default 1000)")
    p.add_argument("--no-orthogonalize", action="store_true",
                   help="keep the two random directions as drawn (Li et al.), not made exactly orthogonal")
    p.add_argument("--levels", type=integer(1, "a number of contour lines"), default=10, help="contour lines drawn and labelled (default 10)")
    p.add_argument("--mark-level", type=finite, action="append", default=[], metavar="LOSS",
                   help="a red dashed contour at this loss (repeatable), to compare surfaces at one level")
    p.add_argument("--vmax", type=finite, default=None,
                   help="draw contours only up to this loss (the paper's plots zoom on the bowl)")
    p.add_argument("--device", type=_device, default="auto",
                   help="auto (CUDA when present; default), cpu, cuda ... (a 21x21 NetA surface on 2000 "
                        "examples is 441 evaluations: minutes on a GPU, most of an hour on 2 CPU cores)")
    p.add_argument("--data-root", default=None, help="where the dataset is (default: the run's data_root)")
    p.add_argument("--download", action="store_true",
                   help="download the dataset when it is not there (into --data-root, else the run's data_root); "
                        "by default nothing is downloaded")
    p.add_argument("--out", required=True, help="folder for loss_surface.csv / .png / .json")
    return p


@one_line_errors("loss_surface")
def main(argv: list[str] | None = None) -> int:
    from fedrun.diagnostics.landscape import filter_normalized_direction, loss_surface, orthogonalize, sharpness

    args = parser().parse_args(argv)
    run_dir = results.folders(args.run_dir)[0]
    if not (run_dir / "config.yaml").is_file():
        raise RunDirectoryError(f"{run_dir}: not a run directory (no config.yaml)")
    coords = grid_coordinates(args.grid, args.span)
    writable_folder("--out", Path(args.out))
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    # An unsafe checkpoint or config, missing data: one line (before reading anything else).
    check_own_targets(results.read_config(run_dir), run_dir / "config.yaml")
    params, buffers, round_, state_path = load_state(run_dir, args.snapshot, device)
    model, data = build(run_dir, device, args.data_root, args.download)
    try:
        model.load_state_dict({**params, **buffers})
    except RuntimeError as e:
        raise RunDirectoryError(f"{state_path} does not fit the model of config.yaml: {first_line(e)}") from None
    x, y = training_subset(data, args.samples, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    d1 = filter_normalized_direction(params, g)
    d2 = filter_normalized_direction(params, g)
    if not args.no_orthogonalize:
        d2 = orthogonalize(d1, d2)
    t0 = time.perf_counter()
    losses, accs = loss_surface(model, params, buffers, x, y, d1, d2, coords, coords, args.batch_size,
                                return_accuracy=True)
    seconds = time.perf_counter() - t0
    if not torch.isfinite(losses).any():  # nothing to draw: say why before writing anything
        diverged = results.stop_note(run_dir)
        raise RunDirectoryError(f"{state_path}: the loss is NaN or Inf at every grid point"
                                + (f" (the run {diverged})" if diverged else "") + "; nothing to draw")
    summary = sharpness(losses, coords, coords, radius=args.span / 2)
    summary.update(round=round_, state=str(state_path), run_dir=str(run_dir.resolve()), grid=args.grid,
                   span=args.span, samples=len(y), seed=args.seed, orthogonal=not args.no_orthogonalize,
                   seconds=seconds, centre_accuracy=float(accs[len(coords) // 2, len(coords) // 2]))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "loss_surface.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["alpha", "beta", "loss", "accuracy"])
        for i, a in enumerate(coords):
            for j, b in enumerate(coords):
                w.writerow([f"{a:.6g}", f"{b:.6g}", f"{float(losses[i, j]):.8g}", f"{float(accs[i, j]):.6g}"])
    (out / "loss_surface.json").write_text(json.dumps(summary, indent=2) + "\n")
    notes = _notes(run_dir)
    plot(losses.numpy(), coords, coords, summary, _title(run_dir), args.levels, args.mark_level, notes,
         out / "loss_surface.png", args.vmax)

    print(f"{run_dir} round {round_} ({state_path.name}), {len(y)} training examples, "
          f"{args.grid}x{args.grid} grid over [-{args.span:g}, {args.span:g}]^2 in {seconds:.0f} s")
    print(f"centre loss   {summary['centre']:.4f} (accuracy {100 * summary['centre_accuracy']:.2f}%)")
    print(f"minimum loss  {summary['min']:.4f} at alpha={summary['argmin'][0]:g}, beta={summary['argmin'][1]:g}")
    print(f"sharpness     Keskar {summary['keskar']:.2f} (radius {summary['radius']:g}), "
          f"curvature {summary['curvature']:.4f}")
    for n in notes:
        print(f"NOTE: not the paper's setting: {n}")
    for name in ("loss_surface.csv", "loss_surface.png", "loss_surface.json"):
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
