"""Plot any fedrun runs: accuracy, loss, N/E and the server step, averaged over seeds.

For runs of no paper in particular (the zero-argument ``fedrun``, a sweep of your own).  Every run
directory found below the DIRs is read with :func:`fedrun.results.load`; runs that differ only in
their seed form one group (the table's ``group`` column), drawn as the mean over its seeds with
a band (``--band std``: mean +- one standard deviation; ``minmax``: the seeds' range; ``none``).
A group is labelled by its method's name and the settings that tell it apart: those that differ
among all runs (``partition=iid``) and the method's own that differ among its runs
(``beta=0.5``); a setting a method does not have is never shown.  Four panels: test accuracy
(%), test loss, N/E (eq. 4 over eq. 5 of FedNNNN: 1 when all clients agree) and the server step
``||w_{t+1} - w_t||``, against integer rounds.  Writes ``runs.png`` and ``runs.pdf``
(``--formats png,pdf,svg``) to ``--out``, with ``runs.csv`` beside them: the numbers drawn (group,
metric, round, mean, band bounds low/high, runs n).  It prints one line per group drawn and a
warning for every group or panel left without values.

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
BANDS = tuple(results.BANDS)
# Each group's line style and marker as well as its colour, so overlapping and greyscale curves
# stay apart.
STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot(df, out: Path, band: str = "std", formats: tuple[str, ...] = ("png", "pdf"),
         log=print) -> list[Path]:
    """Draw the four panels for every group of ``df`` (:func:`fedrun.results.load`'s table), the
    mean over each group's seeds with its band (:func:`fedrun.results.seed_curves`); write the
    figure and, beside it, ``runs.csv``: the numbers drawn (group, metric, round, mean, band, n).
    ``log`` gets one line per group drawn and a warning for each panel a group is missing from."""
    curves = results.seed_curves(df, [column for column, _, _ in PANELS], band)
    groups = list(dict.fromkeys(curves["group"]))
    runs = df.groupby("group")["run_dir"].nunique()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4.2))
    for ax, (column, ylabel, scale) in zip(axes, PANELS):
        for key in groups:
            c = curves[(curves["group"] == key) & (curves["metric"] == column)]
            i = groups.index(key)
            color, style = f"C{i % 10}", {**plots.markers(len(c)), "linestyle": STYLES[i % len(STYLES)]}
            if "marker" in style:
                style["marker"] = MARKERS[i % len(MARKERS)]
            ax.plot(c["round"], scale * c["mean"], color=color, label=plots.mean_label(key, runs[key]), **style)
            if band != "none" and (c["n"] > 1).any():
                ax.fill_between(c["round"], scale * c["low"], scale * c["high"], color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel(plots.ROUNDS)
        ax.set_ylabel(ylabel)
        plots.integer_rounds(ax)
        ax.grid(alpha=0.3)
    several = df["run_dir"].nunique() > len(groups)
    axes[0].legend(fontsize=8, title=results.BANDS[band] if several else None, title_fontsize=8)
    out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    paths = [out / f"runs.{fmt}" for fmt in formats]
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    data = out / "runs.csv"
    curves.to_csv(data, index=False)
    for key in groups + sorted(set(df["group"]) - set(groups)):
        seeds = sorted(df.loc[df["group"] == key, "seed"].unique()) if "seed" in df else []
        mine = curves[curves["group"] == key]
        drawn = [column for column, _, _ in PANELS if column in set(mine["metric"])]
        what = f"{runs[key]} run{'s' if runs[key] != 1 else ''}" + (f" (seeds {', '.join(map(str, seeds))})"
                                                                     if len(seeds) > 1 else "")
        if not drawn:
            log(f"warning: {key}: {what}, no values of {', '.join(c for c, _, _ in PANELS)}; not drawn")
            continue
        log(f"{key}: {what}, rounds {mine['round'].min()}-{mine['round'].max()}, "
            f"{len(drawn)} of {len(PANELS)} panels")
        for column, _, _ in PANELS:
            if column not in drawn:
                log(f"warning: {key}: no values of {column}; left out of its panel")
    return [*paths, data]


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
