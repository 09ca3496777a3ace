"""Elastic training on fake Ray nodes (ray.cluster_utils.Cluster, in a subprocess: it
needs its own Ray): a removed node shrinks the gang, an added one grows it, a drained
one is left at a step boundary without losing a step."""

from __future__ import annotations

from own_cluster import run_scenario


def test_node_removed_added_and_drained(tmp_path):
    outcome, _ = run_scenario("elastic_cluster_run.py", tmp_path, timeout_s=600)
    resizes = outcome["resizes"]
    assert [(old, new) for old, new, _, _ in resizes] == [(3, 2), (2, 3), (3, 2)], outcome
    assert "worker lost" in resizes[0][3]
    assert resizes[1][3] == "resources free"
    assert "draining" in resizes[2][3]
    assert outcome["history"] == list(range(400))
    # Data parallel keeps every committed step through a loss, and a drain stops at a
    # step boundary: no step is ever done twice.
    assert sorted(outcome["steps"]) == list(range(400))
