"""Plot any fedrun run directories side by side: accuracy, loss, N/E and the server step.

For runs of no paper in particular (the zero-argument ``fedrun``, a sweep of your own): every run
directory found below the DIRs becomes one line, labelled by the settings that differ between
the runs (or by its folder name).  Writes ``runs.png`` to ``--out`` with four panels: test
accuracy, test loss, N/E (eq. 4 over eq. 5 of FedNNNN: 1 when all clients agree), and the server
step ``||w_{t+1} - w_t||``.

    python scripts/plot_runs.py outputs/2026-11-22 --out outputs/figs
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plots  # noqa: E402  (first: it chooses matplotlib's headless backend)
from plots import plt  # noqa: E402
from runs import Run, find_runs  # noqa: E402

PANELS = (("test_acc", "test accuracy"), ("test_loss", "test loss"),
          ("N_over_E", "N / E (client agreement)"), ("server_step", "server step ||w_{t+1} - w_t||"))
# The settings people vary first, named before any other that differs (e.g. beta of one method).
FIRST = ("aggregator._target_", "dataset.name", "partition._target_", "model._target_", "seed")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)
    return out


def _item(key: str, value: str | None) -> str:
    """One setting in a label: ``fedavg`` for aggregator._target_, ``dataset=fmnist``, ``seed=0``."""
    if key.endswith("_target_"):
        return str(value).rsplit(".", 1)[-1]
    if key.endswith(".name"):
        return f"{key.rsplit('.', 2)[-2]}={value}"
    return f"{key.rsplit('.', 1)[-1]}={value}"


def labels(runs: list[Run]) -> list[str]:
    """Each run's label: the settings that differ between the runs (its folder if none do)."""
    flat = [_flat(r.config) for r in runs]
    keys = sorted({k for f in flat for k in f})
    differing = [k for k in keys if len({f.get(k) for f in flat}) > 1
                 and not k.startswith(("hydra", "progress", "resume", "device"))]
    # The axes people vary first, then settings every run has, then the rest.
    differing.sort(key=lambda k: (FIRST.index(k) if k in FIRST else len(FIRST), any(k not in f for f in flat), k))
    if not differing:
        return [r.path.name for r in runs]
    chosen = [k for k in differing if k in FIRST] or differing[:4]  # a group choice implies its values
    return [", ".join(_item(k, f[k]) for k in chosen if k in f) for f in flat]


def plot(runs: list[Run], out: Path) -> Path:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4))
    for run, label in zip(runs, labels(runs)):
        frame = run.rounds()
        for ax, (column, _) in zip(axes, PANELS if frame is not None else ()):
            if column in frame and frame[column].notna().any():
                rows = frame[frame[column].notna()]
                ax.plot(rows["round"], rows[column], marker=".", label=label)
    for ax, (_, title) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    out.mkdir(parents=True, exist_ok=True)
    return plots.save_figure(fig, out / "runs.png")


def main(argv: list[str] | None = None) -> int:
    p = plots.parser(None, __doc__)
    args = p.parse_args(argv)
    try:
        runs = [Run.load(path) for path in find_runs(args.dirs)]
    except FileNotFoundError as e:
        print(f"plot_runs: {e}", file=sys.stderr)
        return 2
    if not runs:
        print("plot_runs: no run directory (a folder with summary.json and config.yaml) found", file=sys.stderr)
        return 2
    print(plot(runs, Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
