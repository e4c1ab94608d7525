"""The round's diagnostics alone: N, E, the clients' norms and angles and parameter divergence
(PD-Ls, PD-VL's norms) from m stacked updates of FedLap's MLP (784-200-10, 159,010 parameters),
streamed over the updates in float64 blocks of each ``--chunks`` size (:class:`fedrun.diagnostics.nwda.RoundSums`),
and, up to ``--gram-up-to`` clients, from the per-layer m x m Gram matrices
(:func:`fedrun.diagnostics.nwda.layer_grams`), side by side in one process on the same updates.

Each figure is the median of ``--repeat`` timings (milliseconds) of ``stats`` (one pass: N, E, the
norms, the angles) and ``divergence`` (PD-Ls' second pass), with the ratio to the default block
size's (:func:`fedrun.diagnostics.nwda.stream_chunk`).  The updates are random (the cost does not
depend on their values).

Usage::

    python scripts/bench/bench_round_sums.py                                   # m = 100, 300, 1,000
    python scripts/bench/bench_round_sums.py --clients 5000,10000 --gram-up-to 0
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedrun.diagnostics.divergence import round_divergence
from fedrun.diagnostics.nwda import RoundSums, layer_grams, nwda, stream_chunk
from fedrun.models.layers import Layer

SHAPES = {"fc1.weight": (200, 784), "fc1.bias": (200,), "fc2.weight": (10, 200), "fc2.bias": (10,)}
LAYERS = [Layer("fc1", "fc", ("fc1.weight", "fc1.bias")), Layer("fc2", "fc", ("fc2.weight", "fc2.bias"))]


def timed(fn, repeat: int) -> tuple[float, float]:
    """Median milliseconds of the two phases ``fn`` returns the times of."""
    runs = [fn() for _ in range(repeat)]
    return tuple(statistics.median(r[i] for r in runs) * 1e3 for i in range(2))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="100,300,1000", help="m, comma-separated")
    p.add_argument("--chunks", default="4194304,1048576,524288", help="float64 values a block, comma-separated")
    p.add_argument("--gram-up-to", type=int, default=1000, help="time the Gram path up to this m (m^2 d work)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    default = stream_chunk(torch.device("cpu"))
    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"FedLap's MLP, random updates, CPU, {args.threads} threads; median of {args.repeat}; "
          f"default block {default:,} values ({default * 8 / 2**20:g} MiB of float64)")
    print(f"{'m':>6} {'path':>22} {'stats ms':>9} {'divergence ms':>14} {'total ms':>9} {'x default':>10}")
    for m in (int(c) for c in args.clients.split(",")):
        g = torch.Generator().manual_seed(m)
        deltas = {k: 0.01 * torch.randn(m, *s, generator=g) for k, s in SHAPES.items()}
        params = {k: torch.randn(*s, generator=g) for k, s in SHAPES.items()}
        p_k = torch.full((m,), 1 / m, dtype=torch.float64)

        def streamed(chunk):
            def once():
                sums = RoundSums(deltas, LAYERS, params, chunk=chunk)
                t0 = time.perf_counter()
                sums.stats(p_k)
                t1 = time.perf_counter()
                round_divergence(sums)
                return t1 - t0, time.perf_counter() - t1
            return once

        def gram():
            t0 = time.perf_counter()
            grams = layer_grams(deltas, LAYERS, params)
            nwda(deltas, p_k, LAYERS, grams)
            t1 = time.perf_counter()
            round_divergence(grams)
            return t1 - t0, time.perf_counter() - t1

        rows = {f"streamed, {c * 8 / 2**20:g} MiB blocks": timed(streamed(c), args.repeat) for c in sorted({*chunks, default})}
        if m <= args.gram_up_to:
            rows["Gram matrices"] = timed(gram, args.repeat)
        base = sum(rows[f"streamed, {default * 8 / 2**20:g} MiB blocks"])
        for name, (stats_ms, div_ms) in rows.items():
            print(f"{m:>6,} {name:>22} {stats_ms:>9.1f} {div_ms:>14.1f} {stats_ms + div_ms:>9.1f} "
                  f"{(stats_ms + div_ms) / base:>10.2f}")


if __name__ == "__main__":
    main()
