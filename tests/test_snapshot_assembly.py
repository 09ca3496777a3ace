"""How a gang's in-memory snapshot parts are put together (pure)."""

from __future__ import annotations

from unipar.runtime.elastic.snapshot import SnapshotAssembly, SnapshotPart


def part(step: int, rank: int) -> SnapshotPart:
    return SnapshotPart(step=step, rank=rank, files={f"__{rank}_0.distcp": bytes([rank])})


def test_a_rank_that_sends_one_step_twice_counts_once():
    """Rank 0's cadence snapshot and its pause snapshot of the same step arrive before
    rank 1's part: the snapshot is whole only with rank 1's."""
    assembly = SnapshotAssembly(2)
    assert assembly.add(part(10, 0)) is None
    assert assembly.add(part(10, 0)) is None
    whole = assembly.add(part(10, 1))
    assert whole is not None and [p.rank for p in whole] == [0, 1]


def test_parts_come_out_in_rank_order_and_older_steps_are_dropped():
    assembly = SnapshotAssembly(3)
    assert assembly.add(part(5, 2)) is None  # step 5 never completes
    for rank in (2, 0):
        assert assembly.add(part(8, rank)) is None
    whole = assembly.add(part(8, 1))
    assert whole is not None and [p.rank for p in whole] == [0, 1, 2]
    assert assembly.add(part(5, 0)) is None  # dropped: it starts over
    assert assembly.add(part(5, 1)) is None
