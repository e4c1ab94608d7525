"""Section ``privacy``: DP-FedAvg's accuracy against the privacy it spends on MNIST
(outputs/reproductions/privacy: ``nodp/`` without clipping or noise, ``z0.5/``, ``z1.0/``,
``z2.0/`` with clip C = 1 and noise multiplier z), 6,000 clients of 10 images, 600 a round
(q = 0.1), 100 rounds, seeds 0, 1 and 2: the table in docs/configuration.md's "Privacy"."""
from __future__ import annotations

from decimal import Decimal

from fedrun.results import Run

from scripts.common.claims_core import Data, dec, fmt, mean, sd
from scripts.common.claims_registry import claim

DOC = "docs/configuration.md"
LEVELS = [("no clipping, no noise", "privacy/nodp"), ("0.5", "privacy/z0.5"), ("1.0", "privacy/z1.0"),
          ("2.0", "privacy/z2.0")]
SEEDS = (0, 1, 2)


def finished(data: Data, folder: str) -> list[Run]:
    runs = [data.run(folder, "fedavg", seed) for seed in SEEDS]
    unfinished = [str(r.path) for r in runs if not r.finished]
    if unfinished:
        raise ValueError(f"not finished: {', '.join(unfinished)}")
    return runs


def spread(values: list[Decimal]) -> str:
    """``mean +- sd`` over the seeds, two decimals (the seeds differ by hundredths of a point)."""
    return f"{fmt(mean(values), 2)} +- {fmt(sd(values), 2)}"


def finals(data: Data, folder: str) -> list[Decimal]:
    return [data.final(r) for r in finished(data, folder)]


@claim("privacy.table", "privacy", "{rows}", doc=DOC)
def _(data):
    """Per noise level over seeds 0-2: the privacy spent after the last of 100 rounds (epsilon at
    delta = 1e-5, fixed-size sampling: the same in every seed), and the final test accuracy
    (mean +- sd, the 10,000 MNIST test images)."""
    out = ["| noise multiplier z | epsilon after 100 rounds (delta = 1e-5) | final test accuracy % |",
           "|---|---|---|"]
    for label, folder in LEVELS:
        runs = finished(data, folder)
        summaries = [r.summary for r in runs]
        eps = {s.get("dp_epsilon") for s in summaries}
        if len(eps) != 1:
            raise ValueError(f"{folder}: epsilon differs between seeds: {sorted(map(str, eps))}")
        epsilon = eps.pop()
        shown = "- (not private)" if epsilon is None else fmt(dec(epsilon), 2)
        out.append(f"| {label} | {shown} | {spread([data.final(r) for r in runs])} |")
    return {"rows": "\n".join(out)}


@claim("privacy.cost", "privacy", "{text}", doc=DOC)
def _(data):
    """What privacy costs here: each noise level's mean final accuracy below the runs without
    clipping or noise (points, on the seeds' means), beside its epsilon; and whether every
    epsilon is above 10 (else the lowest)."""
    base = mean(finals(data, "privacy/nodp"))
    parts = []
    for label, folder in LEVELS[1:]:
        runs = finished(data, folder)
        epsilon = runs[0].summary["dp_epsilon"]
        parts.append(f"{fmt(base - mean(finals(data, folder)), 2)} points at z = {label} (epsilon {fmt(dec(epsilon), 2)})")
    lowest = min(dec(finished(data, folder)[0].summary["dp_epsilon"]) for _, folder in LEVELS[1:])
    guarantee = ("epsilon stays above 10 at every level here: a single-digit guarantee needs more noise, a smaller "
                 "q or fewer rounds" if lowest > 10 else f"the lowest epsilon is {fmt(lowest, 2)}")
    return {"text": "Against the runs without clipping or noise, the final accuracy is lower by " + ", ".join(parts[:-1])
                    + f" and {parts[-1]}: with 600 clients a round the noise on the mean (z C / 600 a coordinate) "
                    f"costs little accuracy, and {guarantee}."}
