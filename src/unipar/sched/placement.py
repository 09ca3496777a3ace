"""Put GPU counts onto nodes: keep what does not change, consolidate what does.

A job keeps its GPUs when its count is unchanged (no restart). Others are placed largest
first: a job that fits one node goes to the fullest node that still holds it (best fit);
a larger job takes whole free nodes, then best fit for the rest. Only when no such room
exists is a job spread over the nodes with the most free GPUs (Pollux §4.1 and Tiresias §4
both avoid spreading a job across nodes when it can be avoided).
"""

from __future__ import annotations

from collections.abc import Sequence

Nodes = tuple[tuple[int, int], ...]


def _best_fit(free: dict[int, int], k: int) -> int | None:
    fits = [(g, n) for n, g in free.items() if g >= k]
    return min(fits)[1] if fits else None


def _take(free: dict[int, int], k: int, gpn: int) -> Nodes | None:
    if sum(free.values()) < k:
        return None
    got: dict[int, int] = {}
    if k > gpn:
        for n in [n for n, g in free.items() if g == gpn][: k // gpn]:
            got[n] = gpn
            free[n] = 0
        k -= sum(got.values())
    if k > 0:
        n = _best_fit(free, k)
        if n is not None:
            got[n] = got.get(n, 0) + k
            free[n] -= k
            k = 0
    for n in sorted(free, key=lambda n: -free[n]):
        if k == 0:
            break
        g = min(free[n], k)
        if g:
            got[n] = got.get(n, 0) + g
            free[n] -= g
            k -= g
    return tuple(sorted(got.items()))


def place(
    demands: Sequence[tuple[str, int]],
    previous: dict[str, Nodes],
    available_nodes: Sequence[int],
    gpus_per_node: int,
) -> dict[str, Nodes]:
    """Nodes for each ``(job, gpus)`` demand; a demand that cannot be met is left out.

    Demands are met in the order given when GPUs run short.
    """
    free = dict.fromkeys(available_nodes, gpus_per_node)
    out: dict[str, Nodes] = {}
    for name, k in demands:
        prev = previous.get(name)
        if prev and sum(g for _, g in prev) == k and all(free.get(n, 0) >= g for n, g in prev):
            for n, g in prev:
                free[n] -= g
            out[name] = prev
    rest = [(name, k) for name, k in demands if name not in out and k > 0]
    budget = sum(free.values())
    chosen = []
    for name, k in rest:  # in priority order: who gets GPUs at all
        if k <= budget:
            chosen.append((name, k))
            budget -= k
    for name, k in sorted(chosen, key=lambda d: -d[1]):  # largest first: less fragmentation
        nodes = _take(free, k, gpus_per_node)
        if nodes is not None:
            out[name] = nodes
    return out
