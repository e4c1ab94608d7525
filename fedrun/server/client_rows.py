"""Per-client server state kept for the clients that have trained only.

A method whose server keeps something for each client (SCAFFOLD's control variates ``c_k``,
:mod:`fedrun.server.corrections`; a personalized method's kept layers, :mod:`fedrun.server.personal`)
stores it as rows stacked ``[n, ...]`` in the order the clients first trained, beside their ids
``[n]``: it grows with the clients sampled so far, not with the federation's K (a client that has
not trained reads its method's starting value without a row).
"""
from __future__ import annotations

import torch

from fedrun.params import Params


def positions(ids: torch.Tensor, clients: list[int]) -> list[int]:
    """Each of ``clients``' row among the kept ``ids``, -1 for a client that has not trained yet."""
    where = {k: i for i, k in enumerate(ids.tolist())}
    return [where.get(int(k), -1) for k in clients]


def store(rows: Params, ids: torch.Tensor, clients: list[int], pos: list[int], values: Params
          ) -> tuple[Params, torch.Tensor]:
    """``rows`` and ``ids`` with ``values`` (stacked ``[m, ...]``) as the rows of ``clients`` (whose
    :func:`positions` are ``pos``): a kept row replaced, a new client's appended in ``clients``'
    order.  New tensors, the old ones untouched (server state is data)."""
    old = [j for j, p in enumerate(pos) if p >= 0]
    new = [j for j, p in enumerate(pos) if p < 0]
    out = {}
    for k, v in rows.items():
        fresh = values[k].to(v.dtype)
        if old:
            at = torch.as_tensor([pos[j] for j in old], dtype=torch.long, device=v.device)
            v = v.index_copy(0, at, fresh[old])
        out[k] = torch.cat([v, fresh[new]]) if new else v
    added = torch.as_tensor([clients[j] for j in new], dtype=torch.long, device=ids.device)
    return out, torch.cat([ids, added])
