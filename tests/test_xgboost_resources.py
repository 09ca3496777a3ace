"""How many actors with how many CPUs and GPUs (pure logic, no Ray), and XGBoost-Ray's
module names (imports only)."""

from __future__ import annotations

import pytest

from unipar import ConfigError
from unipar.xgboost import RayParams
from unipar.xgboost.resources import plan_actors, plan_in_bundles

TWO_NODES = [{"CPU": 8.0}, {"CPU": 4.0}]


def test_default_is_one_actor_per_node_with_all_its_cpus():
    plan = plan_actors(RayParams(), [{"CPU": 16.0, "memory": 1e9}], {})
    assert (plan.num_actors, plan.cpus_per_actor, plan.gpus_per_actor) == (1, 16, 0)
    plan = plan_actors(RayParams(), [*TWO_NODES, {"GPU": 1.0}], {})  # a node without CPUs
    assert (plan.num_actors, plan.cpus_per_actor, plan.strategy) == (2, 4, "SPREAD")


def test_zero_cpus_per_actor_divides_the_cluster_over_the_actors():
    # 12 CPUs over 3 actors: 4 each (at most the smallest node's 4)
    assert plan_actors(RayParams(num_actors=3), TWO_NODES, {}).cpus_per_actor == 4
    assert plan_actors(RayParams(num_actors=6), TWO_NODES, {}).cpus_per_actor == 2
    assert plan_actors(RayParams(num_actors=24), TWO_NODES, {}).cpus_per_actor == 1
    # explicit values are kept, and the placement strategy is the user's
    explicit = RayParams(num_actors=5, cpus_per_actor=3, placement_options={"strategy": "SPREAD"})
    plan = plan_actors(explicit, TWO_NODES, {})
    assert (plan.num_actors, plan.cpus_per_actor, plan.strategy) == (5, 3, "SPREAD")


def test_minus_one_gpus_per_actor_follows_the_cluster_and_the_params():
    gpu_nodes = [{"CPU": 8.0, "GPU": 2.0}]
    on_gpu = {"device": "cuda"}
    assert plan_actors(RayParams(num_actors=2), TWO_NODES, on_gpu).gpus_per_actor == 0
    assert plan_actors(RayParams(num_actors=2), gpu_nodes, on_gpu).gpus_per_actor == 1
    assert (
        plan_actors(RayParams(num_actors=2), gpu_nodes, {"tree_method": "gpu_hist"}).gpus_per_actor
        == 1
    )
    assert plan_actors(RayParams(num_actors=2), gpu_nodes, {"device": "cpu"}).gpus_per_actor == 0
    assert plan_actors(RayParams(num_actors=3), gpu_nodes, on_gpu).gpus_per_actor == 0
    assert plan_actors(RayParams(num_actors=2, gpus_per_actor=2), TWO_NODES, {}).gpus_per_actor == 2


def test_actors_fit_a_tune_trials_bundles():
    bundles = RayParams(num_actors=2, cpus_per_actor=3).get_tune_resources().bundles
    assert bundles == [{"CPU": 3}, {"CPU": 3}]  # Tune drops the empty bundle of the trial
    plan = plan_in_bundles(RayParams(), bundles, caller_holds=False)
    assert (plan.num_actors, plan.cpus_per_actor, plan.first_bundle) == (2, 3, 0)
    assert plan_in_bundles(RayParams(num_actors=3), bundles, caller_holds=False) is None
    # a trial that holds the first bundle itself
    plan = plan_in_bundles(RayParams(num_actors=1), [{"CPU": 1}, *bundles], caller_holds=True)
    assert (plan.num_actors, plan.cpus_per_actor, plan.first_bundle) == (1, 3, 1)
    assert plan_in_bundles(RayParams(), [{"CPU": 1}], caller_holds=True) is None  # plain trial
    with pytest.raises(ConfigError, match="get_tune_resources needs explicit num_actors"):
        RayParams().get_tune_resources()


def test_bad_ray_params():
    with pytest.raises(ConfigError, match="gpus_per_actor >= -1"):
        RayParams(gpus_per_actor=-2)
    with pytest.raises(ConfigError, match="max_actor_restarts must be >= -1"):
        RayParams(max_actor_restarts=-2)
    with pytest.raises(ConfigError, match="no node with a CPU"):
        plan_actors(RayParams(), [{"GPU": 1.0}], {})


def test_xgboost_ray_names_import():
    from unipar.xgboost_ray.callback import DistributedCallback, EnvironmentCallback
    from unipar.xgboost_ray.main import RayParams as MainRayParams
    from unipar.xgboost_ray.main import RayXGBoostActorAvailable, predict, train

    import unipar.xgboost_ray as by_module
    from unipar import xgboost as xgboost_ray
    from unipar import xgboost_ray as by_name
    from unipar.xgboost import driver, session
    from unipar.xgboost_ray import session as aliased_session

    assert by_module is by_name is xgboost_ray
    assert aliased_session is session and MainRayParams is RayParams
    assert (train, predict) == (driver.train, driver.predict)
    assert issubclass(EnvironmentCallback, DistributedCallback)
    assert issubclass(RayXGBoostActorAvailable, RuntimeError)
    # XGBoost-Ray 0.1.19's top-level names
    names = [
        "RayParams",
        "RayDMatrix",
        "RayDeviceQuantileDMatrix",
        "RayFileType",
        "RayShardingMode",
        "Data",
        "combine_data",
        "train",
        "predict",
        "RayXGBClassifier",
        "RayXGBRegressor",
        "RayXGBRFClassifier",
        "RayXGBRFRegressor",
        "RayXGBRanker",
    ]
    assert [n for n in names if not hasattr(xgboost_ray, n)] == []
    assert xgboost_ray.__version__ == "0.1.19"


def test_session_outside_an_actor():
    from unipar.xgboost.session import get_actor_rank, put_queue

    with pytest.raises(ConfigError, match="only inside a training actor"):
        get_actor_rank()
    with pytest.raises(ConfigError, match="only inside a training actor"):
        put_queue(1)


def test_unknown_train_keyword_fails_before_any_actor_starts():
    import numpy as np

    from unipar.xgboost import RayDMatrix, train

    data = RayDMatrix(np.zeros((4, 2)), np.zeros(4))
    with pytest.raises(TypeError, match=r"does not take: \['totally_invalid_kwarg'\]"):
        train({}, data, 2, totally_invalid_kwarg="")


def test_feature_weights_need_one_weight_per_feature():
    import numpy as np

    from unipar.xgboost import RayDMatrix

    with pytest.raises(ConfigError, match="data has 3 features and feature_weights has 2"):
        RayDMatrix(np.zeros((4, 3)), np.zeros(4), feature_weights=[1, 2])
