"""Section ``fednova_stragglers``: FedNova against FedAvg where clients take different numbers of steps."""
from __future__ import annotations

from decimal import Decimal

from fedrun.results import Run

from scripts.common.claims_core import Data, SEEDS, apart, bound_up, dec, exact, fmt, hyper
from scripts.common.claims_registry import claim
from scripts.niidbench.claims import cell_mean, nb


# ----------------------------------------------------------------------------- FedNova with stragglers

FN = "fednova_stragglers"
# The rows of the table: (label, folder, method).
FEDNOVA_ROWS = (("FedAvg, all E epochs", "niidbench/mnist_dir05", "fedavg"),
                ("FedNova, all E epochs", "niidbench/mnist_dir05", "fednova"),
                ("FedAvg, epochs drawn in [1, 10]", "niidbench_readings/mnist_dir05_stragglers", "fedavg"),
                ("FedNova, epochs drawn in [1, 10]", "niidbench_readings/mnist_dir05_stragglers", "fednova"),
                ("FedAvg, epochs drawn, momentum 0", "niidbench_readings/mnist_dir05_stragglers_momentum0", "fedavg"),
                ("FedNova, epochs drawn, momentum 0", "niidbench_readings/mnist_dir05_stragglers_momentum0", "fednova"))


def drawn(data: Data, method: str, momentum0: bool = False) -> list[Run]:
    folder = "mnist_dir05_stragglers" + ("_momentum0" if momentum0 else "")
    return [data.run(f"niidbench_readings/{folder}", method, s, 1.0) for s in SEEDS]


def a_norm(steps: int, rho) -> Decimal:
    """FedNova's ``||a_k||_1`` for ``steps`` local steps of SGD with momentum ``rho``:
    ``sum_{j=1..steps} (1 - rho^j) / (1 - rho)`` (the step count for rho = 0)."""
    rho = dec(rho)
    if rho == 0:
        return Decimal(steps)
    return sum(((1 - rho ** j) / (1 - rho) for j in range(1, steps + 1)), Decimal(0))


def round_one(data: Data, fednova: Run, fedavg: Run) -> dict:
    """Round 1 of a FedNova run and its FedAvg twin: the one-epoch and the ten-epoch client's steps,
    ``||a_k||_1`` and weights, checked against FedNova's rule ``q_k = tau_eff p_k / ||a_k||_1`` (p_k:
    FedAvg's weights)."""
    nova, avg = (data.clients(r) for r in (fednova, fedavg))
    nova, avg = nova[nova["round"] == 1].set_index("client"), avg[avg["round"] == 1].set_index("client")
    rho = hyper(fednova, "momentum")
    a = {k: a_norm(int(nova.at[k, "steps"]), rho) for k in nova.index}
    p = {k: dec(avg.at[k, "weight"]) for k in nova.index}
    tau = sum((p[k] * a[k] for k in a), Decimal(0))
    for k in a:  # the weights clients.csv holds are the rule's, to its 8 significant digits
        if abs(tau * p[k] / a[k] - dec(nova.at[k, "weight"])) > Decimal("1e-6") * tau * p[k] / a[k]:
            raise ValueError(f"{fednova.path}: client {k}'s weight is not tau_eff p_k / ||a_k||_1")
    out = {}
    for epochs in (1, 10):
        ks = [k for k in nova.index if int(nova.at[k, "epochs"]) == epochs]
        if len(ks) != 1:
            raise ValueError(f"{fednova.path}: {len(ks)} clients of {epochs} epochs in round 1, the doc names one")
        k = ks[0]
        out[epochs] = {"steps": int(nova.at[k, "steps"]), "a": a[k], "q": dec(nova.at[k, "weight"]), "p": p[k]}
    return out


def weight_sums(data: Data, runs: list[Run]) -> list[Decimal]:
    """Each round's sum of the clients' weights, over the runs."""
    return [sum((dec(w) for w in weights), Decimal(0)) for r in runs
            for _, weights in data.clients(r).groupby("round")["weight"]]


def fednova_finals(data: Data, folder: str, method: str) -> dict:
    stragglers_ = 0.0 if folder.startswith("niidbench/") else 1.0
    return {"finals": ", ".join(exact(data.final(data.run(folder, method, s, stragglers_))) for s in SEEDS)}


# readings.py prints the other columns of the table (rounds to 95%, their mean, the accuracy after
# round 10); the final accuracy seed by seed, the last column, is no script's.
for _label, _folder, _method in FEDNOVA_ROWS:
    def _row(data, _folder=_folder, _method=_method):
        """The last cell of a row of the FedNova table: each seed's final accuracy, exact."""
        return fednova_finals(data, _folder, _method)
    claim(f"fednova.finals.{_method}_{'all' if _folder.startswith('niidbench/') else 'drawn'}"
          f"{'_momentum0' if _folder.endswith('momentum0') else ''}", FN,
          "| {finals} |")(_row)


@claim("fednova.dir05_steps", FN, "the parties' sizes already differ ({lo} to {hi} local steps a round), and FedNova "
       "and FedAvg end {level}")
def _(data):
    """Dir(0.5), all E epochs: the fewest and most local steps a party takes a round (clients.csv,
    FedAvg's three seeds); FedNova's and FedAvg's mean final accuracy less than 0.1 points apart."""
    steps = [int(s) for r in nb(data, "dir05", "fedavg") for s in data.clients(r)["steps"]]
    nova, avg = cell_mean(data, "dir05", "fednova"), cell_mean(data, "dir05", "fedavg")
    return {"lo": min(steps), "hi": max(steps),
            "level": "level" if abs(nova - avg) < Decimal("0.1") else f"{fmt(abs(nova - avg))} points apart"}


@claim("fednova.unstable", FN, "in seed 1 its accuracy swings between {lo}% and {hi}% from round 5 to round 30, its "
       "server step (`server_step`, up to {ss}) is several times FedAvg's (at most {fa}), and it ends {side} FedAvg "
       "in {where} (by {d0}, {d1} and {d2} points)")
def _(data):
    """Epochs drawn, momentum 0.9: FedNova's seed 1, its lowest and highest accuracy from round 5 to
    30 and its largest server step, against FedAvg's largest in seed 1 (both bounds: rounded up);
    FedAvg's final accuracy minus FedNova's, seed by seed."""
    nova, avg = drawn(data, "fednova"), drawn(data, "fedavg")
    span = [v for t, v in data.curve(nova[1]).items() if 5 <= t <= 30]
    diffs = [data.final(a) - data.final(n) for a, n in zip(avg, nova)]
    below = sum(d > 0 for d in diffs)
    return {"lo": exact(min(span)), "hi": exact(max(span)),
            "ss": bound_up(data.rounds(nova[1])["server_step"].max(), 2),
            "fa": bound_up(data.rounds(avg[1])["server_step"].max(), 2), "side": "below" if below else "above",
            "where": "each seed" if below in (0, len(diffs)) else f"{below} of {len(diffs)} seeds",
            **{f"d{i}": exact(abs(d)) for i, d in enumerate(diffs)}}


@claim("fednova.a_norms", FN, "a client of one epoch ({s1} steps) has `||a_k||_1 = {a1}` and one of ten epochs "
       "({s10} steps) {a10}, {ratio} times as much")
def _(data):
    """Round 1 of seed 0 (epochs drawn, momentum 0.9): the one-epoch and the ten-epoch client's
    steps and ``||a_k||_1`` (from the steps and the momentum, checked against the weights in
    clients.csv), and their ratio."""
    one = round_one(data, drawn(data, "fednova")[0], drawn(data, "fedavg")[0])
    return {"s1": one[1]["steps"], "a1": fmt(one[1]["a"]), "s10": one[10]["steps"], "a10": fmt(one[10]["a"], 0),
            "ratio": fmt(one[10]["a"] / one[1]["a"], 0)}


@claim("fednova.weights", FN, "(round 1 of seed 0: {q1} for the one-epoch client, against FedAvg's {p1}; {q10} for "
       "the ten-epoch client, against {p10}) sum to {lo} to {hi} a round")
def _(data):
    """Epochs drawn, momentum 0.9: the one-epoch and ten-epoch client's weights in round 1 of seed 0
    (FedNova's and FedAvg's, clients.csv), and the range over rounds and seeds of the sum of
    FedNova's weights."""
    one = round_one(data, drawn(data, "fednova")[0], drawn(data, "fedavg")[0])
    sums = weight_sums(data, drawn(data, "fednova"))
    return {"q1": fmt(one[1]["q"], 2), "p1": exact(one[1]["p"], 4), "q10": fmt(one[10]["q"], 3),
            "p10": fmt(one[10]["p"], 3), "lo": fmt(min(sums), 2), "hi": fmt(max(sums), 2)}


@claim("fednova.momentum0", FN, "`||a_k||_1` is the step count, the short and long clients differ {r0}-fold instead "
       "of {r}-fold, and FedNova is stable: its weights sum to {lo} to {hi} a round, its largest server step {eq} "
       "FedAvg's ({ss}), and it ends {side} FedAvg in {where} (by {d0}, {d1} and {d2} points)")
def _(data):
    """Epochs drawn, momentum 0: the ratio of the ten-epoch to the one-epoch client's ``||a_k||_1``
    in round 1 of seed 0 (against momentum 0.9's), the range of the sum of FedNova's weights a
    round, both methods' largest server step (compared on the exact values: "equals" only where
    they are equal, else both with the decimals that tell them apart, at least two), and FedNova's
    final accuracy minus FedAvg's, seed by seed."""
    m0 = round_one(data, drawn(data, "fednova", True)[0], drawn(data, "fedavg", True)[0])
    m9 = round_one(data, drawn(data, "fednova")[0], drawn(data, "fedavg")[0])
    nova, avg = drawn(data, "fednova", True), drawn(data, "fedavg", True)
    sums = weight_sums(data, nova)
    x_nova = dec(max(data.rounds(r)["server_step"].max() for r in nova))
    x_avg = dec(max(data.rounds(r)["server_step"].max() for r in avg))
    digits = apart([x_nova, x_avg], 2)
    ss_nova, ss_avg = fmt(x_nova, digits), fmt(x_avg, digits)
    side = "equals" if x_nova == x_avg else f"({ss_nova}) is below" if x_nova < x_avg else f"({ss_nova}) is above"
    diffs = [data.final(n) - data.final(a) for n, a in zip(nova, avg)]
    ahead = sum(d > 0 for d in diffs)
    return {"r0": fmt(m0[10]["a"] / m0[1]["a"], 0), "r": fmt(m9[10]["a"] / m9[1]["a"], 0),
            "lo": fmt(min(sums), 2), "hi": fmt(max(sums), 2),
            "eq": side, "ss": ss_avg,
            "side": "ahead of" if ahead else "behind",
            "where": "each seed" if ahead in (0, len(diffs)) else f"{ahead} of {len(diffs)} seeds",
            **{f"d{i}": exact(abs(d)) for i, d in enumerate(diffs)}}


@claim("fednova.momentum0_95", FN, "{who} reaches {target}% in {rounds} rounds at lr {lr} without momentum")
def _(data):
    """Epochs drawn, momentum 0: whether FedAvg or FedNova reaches 95% test accuracy in any round."""
    runs = drawn(data, "fedavg", True) + drawn(data, "fednova", True)
    reached = [r for r in runs if max(data.curve(r).values()) >= 95]
    rounds = {hyper(r, "rounds") for r in runs}
    lrs = {hyper(r, "lr") for r in runs}
    if len(rounds) != 1 or len(lrs) != 1:
        raise ValueError("the momentum-0 runs differ in rounds or lr")
    return {"who": "neither" if not reached else "one", "target": 95, "rounds": rounds.pop(), "lr": lrs.pop()}
