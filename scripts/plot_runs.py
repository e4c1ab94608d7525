"""Plot any fedrun runs: accuracy, loss, N/E and the server step, averaged over seeds.

For runs of no paper in particular (the zero-argument ``fedrun``, a sweep of your own).  Every run
directory found below the DIRs is read with :func:`fedrun.results.load`; runs that differ only in
their seed form one group, drawn as the mean over its seeds with a band (``--band std``: mean +-
one standard deviation; ``minmax``: the seeds' range; ``none``), labelled by the settings that
differ between the groups.  Four panels: test accuracy (%), test loss, N/E (eq. 4 over eq. 5 of
FedNNNN: 1 when all clients agree) and the server step ``||w_{t+1} - w_t||``, against integer
rounds.  Writes ``runs.png`` and ``runs.pdf`` (``--formats png,pdf,svg``) to ``--out``.

    python scripts/plot_runs.py outputs/multirun/2026-11-23 --out outputs/figs
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plots  # noqa: E402  (first: it chooses matplotlib's headless backend)
from plots import plt  # noqa: E402

from fedrun import results  # noqa: E402
from fedrun.errors import FedrunError  # noqa: E402

# column, y label (with units), scale
PANELS = (("test_acc", "test accuracy (%)", 100.0), ("test_loss", "test loss (cross-entropy, nats)", 1.0),
          ("N_over_E", "N / E (client agreement, 1 = all agree)", 1.0),
          ("server_step", "server step ||w_{t+1} - w_t||", 1.0))
# The config groups people vary first, named before any other setting that differs.
FIRST = ("aggregator", "dataset", "partition", "model", "hyperparams", "experiment", "mode")
BANDS = ("std", "minmax", "none")


def groups(df) -> tuple[list[str], list[str]]:
    """The identity columns that tell groups apart (all but ``run_dir`` and ``seed``, and only
    those that differ), and each group's label, ordered by the first of them."""
    identity = [c for c in df.columns[: list(df.columns).index("round")] if c not in ("run_dir", "seed")]
    differing = [c for c in identity if df[c].astype(str).nunique() > 1]
    differing.sort(key=lambda c: (FIRST.index(c) if c in FIRST else len(FIRST), c))
    return differing, [c for c in differing if c in FIRST] + [c for c in differing if c not in FIRST][:3]


def label(key: tuple, columns: list[str], shown: list[str], seeds: int) -> str:
    values = dict(zip(columns, key))
    text = ", ".join(str(values[c]) if c in FIRST else f"{c.rsplit('.', 1)[-1]}={values[c]}" for c in shown)
    return plots.mean_label(text or "runs", seeds) if seeds > 1 else text or "run"


def plot(df, out: Path, band: str = "std", formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """Draw the four panels of every group of ``df`` (:func:`fedrun.results.load`'s table)."""
    columns, shown = groups(df)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4.2))
    grouped = df.groupby([df[c].astype(str) for c in columns], sort=True) if columns else [((), df)]
    for key, rows in grouped:
        key = key if isinstance(key, tuple) else (key,)
        seeds = rows["run_dir"].nunique()
        name = label(key, columns, shown, seeds) if columns or seeds > 1 else Path(rows["run_dir"].iloc[0]).name
        for ax, (column, _, scale) in zip(axes, PANELS):
            values = rows[["round", column]].dropna() if column in rows else None
            if values is None or values.empty:
                continue
            stats = (values[column] * scale).groupby(values["round"]).agg(["mean", "std", "min", "max"])
            line, = ax.plot(stats.index, stats["mean"], label=name, **plots.markers(len(stats)))
            if seeds > 1 and band != "none":
                low, high = ((stats["mean"] - stats["std"], stats["mean"] + stats["std"]) if band == "std"
                             else (stats["min"], stats["max"]))
                ax.fill_between(stats.index, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    for ax, (_, ylabel, _) in zip(axes, PANELS):
        ax.set_xlabel(plots.ROUNDS)
        ax.set_ylabel(ylabel)
        plots.integer_rounds(ax)
        ax.grid(alpha=0.3)
    what = {"std": "mean +- std over seeds", "minmax": "mean and range over seeds", "none": "mean over seeds"}[band]
    axes[0].legend(fontsize=8, title=what if df["run_dir"].nunique() > len(grouped) else None, title_fontsize=8)
    out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    paths = [out / f"runs.{fmt}" for fmt in formats]
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = plots.parser(None, __doc__)
    p.add_argument("--band", choices=BANDS, default="std", help="the band around each group's mean over seeds")
    p.add_argument("--formats", default="png,pdf", help="comma-separated: png, pdf, svg")
    args = p.parse_args(argv)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        print(f"plot_runs: --formats={args.formats}: choose from png, pdf, svg", file=sys.stderr)
        return 2
    try:
        df = results.load(*args.dirs)
    except FedrunError as e:
        print(f"plot_runs: {e}", file=sys.stderr)
        return 2
    for path in plot(df, Path(args.out), args.band, formats):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
