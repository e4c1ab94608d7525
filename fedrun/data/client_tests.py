"""Every client its own test data, on any partition: a share of each client's own examples held
out as that client's test split (``client_test_fraction``), the way FL-bench and PFLlib score
clients on data drawn like their own.

For each client and each class it holds, ``round(f n_kc)`` of its ``n_kc`` examples of that class
(rounded half up) are held out, drawn from (seed, client), so the client's test split has its own
label mix; a client keeps at least one training example (a class with one example stays in
training).  The held-out rows are indices into the *training* set: the client's accuracy on them is
its ``own_test_acc`` (clients.csv), their mean and worst 10% ``client_acc_*`` (rounds.csv).
"""
from __future__ import annotations

import numpy as np

from fedrun.errors import check
from fedrun.seeding import numpy_rng


def hold_out(parts: list[np.ndarray], labels: np.ndarray, fraction: float,
             seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(training parts, test rows)``: each client's examples split class by class, ``fraction``
    of each class held out (see the module); both lists in client order, indices into ``labels``."""
    check(isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 <= fraction < 1,
          "client_test_fraction", fraction, "must be in [0, 1) (the share of each client's examples held out as "
          "its own test split; 0: off)")
    labels = np.asarray(labels)
    train, test = [], []
    for k, part in enumerate(parts):
        part = np.asarray(part, dtype=np.int64)
        rng = numpy_rng(seed, "client_test", k)
        held = []
        for c in np.unique(labels[part]):
            mine = part[labels[part] == c]
            n = int(np.floor(fraction * len(mine) + 0.5))
            if n:
                held.append(rng.permutation(mine)[:n])
        held = np.sort(np.concatenate(held)) if held else np.empty(0, dtype=np.int64)
        if len(held) == len(part) and len(part):  # every class held out whole: keep one to train on
            held = held[1:]
        keep = np.setdiff1d(part, held, assume_unique=False)
        # The training rows in the partition's own order (the order batches are drawn from).
        train.append(part[np.isin(part, keep)])
        test.append(held)
    return train, test
