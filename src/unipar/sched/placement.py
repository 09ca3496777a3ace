"""Put GPU counts onto nodes: keep what does not change, consolidate what does.

A job keeps its GPUs when its count is unchanged (no restart) and no larger job needs its
nodes. Others are placed largest first, avoiding nodes that unchanged jobs hold: a job that
fits one node goes to the fullest node that still holds it (best fit); a larger job takes
whole free nodes, then best fit for the rest. Pollux §4.1 and Tiresias §4 both avoid
spreading a job across nodes when it can be avoided. With ``spread`` false a job that finds
no such room is shrunk to the room there is (whole free nodes, or the largest hole);
otherwise it is spread over the nodes with the most free GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

Nodes = tuple[tuple[int, int], ...]


def _take(free: dict[int, int], soft: dict[int, int], k: int, gpn: int, spread: bool):
    def room(n: int) -> int:
        return free[n] - soft.get(n, 0)

    got: dict[int, int] = {}
    whole = sorted((n for n in free if free[n] == gpn), key=lambda n: (soft.get(n, 0), n))
    if k >= gpn:
        want = k // gpn
        for n in whole[:want]:
            got[n] = gpn
        if not spread and len(got) < want and got:
            k = len(got) * gpn  # shrink to the whole nodes there are
        elif not spread and not got:
            k = min(k, gpn)
    left = k - sum(got.values())
    if left > 0:
        fits = [(room(n) < left, free[n], n) for n in free if free[n] >= left and n not in got]
        if fits:
            n = min(fits)[2]
            got[n] = left
            left = 0
        elif not spread:
            holes = [(free[n], n) for n in free if free[n] > 0 and n not in got]
            if holes and not got:
                g, n = max(holes)
                got[n] = g
            left = 0
    for n in sorted(free, key=lambda n: -free[n]):
        if left == 0:
            break
        g = min(free[n] - got.get(n, 0), left)
        if g > 0:
            got[n] = got.get(n, 0) + g
            left -= g
    if left > 0 or not got:
        return None
    for n, g in got.items():
        free[n] -= g
    return tuple(sorted(got.items()))


def place(
    demands: Sequence[tuple[str, int]],
    previous: dict[str, Nodes],
    available_nodes: Sequence[int],
    gpus_per_node: int,
    spread: bool = True,
) -> dict[str, Nodes]:
    """Nodes for each ``(job, gpus)`` demand; a demand that cannot be met is left out (or,
    with ``spread`` false, may get fewer GPUs). Demands are met in the order given when
    GPUs run short."""
    free = dict.fromkeys(available_nodes, gpus_per_node)
    budget = len(free) * gpus_per_node
    chosen = []
    for name, k in demands:  # in priority order: who gets GPUs at all
        if 0 < k <= budget:
            chosen.append((name, k))
            budget -= k
    keep: dict[str, Nodes] = {}
    soft: dict[int, int] = {}
    for name, k in chosen:
        prev = previous.get(name)
        if prev and sum(g for _, g in prev) == k and all(n in free for n, _ in prev):
            keep[name] = prev
            for n, g in prev:
                soft[n] = soft.get(n, 0) + g
    out: dict[str, Nodes] = {}
    for name, k in sorted(chosen, key=lambda d: -d[1]):  # largest first: less fragmentation
        prev = keep.get(name)
        if prev:
            for n, g in prev:
                soft[n] -= g
            if all(free[n] >= g for n, g in prev):
                for n, g in prev:
                    free[n] -= g
                out[name] = prev
                continue
        nodes = _take(free, soft, k, gpus_per_node, spread)
        if nodes is not None:
            out[name] = nodes
    return out
