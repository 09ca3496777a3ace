"""Ranking data split over actors at query boundaries (pure: no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from unipar.errors import ConfigError
from unipar.xgboost.sharding import split_at_queries


@pytest.mark.parametrize(
    ("qid", "actors"),
    [
        ([0, 0, 0, 0, 0, 0, 1, 2], 3),  # one big query: both even cuts fall on its end
        ([0] * 10 + [1] * 10 + [2, 3], 4),
        ([0, 0, 1, 1, 2, 2, 3, 3], 4),
        ([0, 1, 1, 1, 1, 1, 1, 1, 1, 2], 2),
    ],
)
def test_every_actor_gets_whole_queries(qid, actors):
    qid = np.array(qid)
    shards = split_at_queries(qid, actors)
    assert len(shards) == actors
    assert all(s.stop > s.start for s in shards)  # none empty
    assert [s.start for s in shards[1:]] == [s.stop for s in shards[:-1]]  # contiguous
    assert shards[0].start == 0 and shards[-1].stop == len(qid)
    for s in shards[1:]:
        assert qid[s.start - 1] != qid[s.start]  # no query cut in two


def test_even_queries_split_evenly():
    qid = np.repeat(np.arange(8), 5)
    assert [s.stop - s.start for s in split_at_queries(qid, 4)] == [10, 10, 10, 10]


def test_fewer_queries_than_actors_and_unsorted_rows_are_refused():
    with pytest.raises(ConfigError, match="3 queries cannot be split over 4 actors"):
        split_at_queries(np.array([0, 0, 1, 2]), 4)
    with pytest.raises(ConfigError, match="sorted by qid"):
        split_at_queries(np.array([1, 0]), 2)
