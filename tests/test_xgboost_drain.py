"""XGBoost on fake Ray nodes (ray.cluster_utils.Cluster, in a subprocess: it needs its
own Ray): an actor whose node is drained leaves after a round, before the node goes,
so no round is lost or redone and no failure is counted."""

from __future__ import annotations

from own_cluster import run_scenario
from xgboost_drain_run import ROUNDS


def test_an_actor_on_a_draining_node_leaves_without_losing_a_round(tmp_path):
    outcome, stderr = run_scenario("xgboost_drain_run.py", tmp_path)
    assert outcome["drained_after"] is not None and outcome["drained_after"] < ROUNDS, outcome
    assert "leave draining nodes" in stderr, stderr[-3000:]
    assert outcome["failures"] == 0, outcome  # it left before its node was removed
    assert outcome["boosted"] == ROUNDS
    assert outcome["rounds"] == list(range(ROUNDS)), outcome  # none redone, none skipped
    assert outcome["nodes"] == 2, outcome  # rank 0 left its node and another took over
