"""LimitRange and the LimitRanger admission plugin, as kube-apiserver (sources in
``spotguard_sim/limitranges.py``; https://kubernetes.io/docs/concepts/policy/limit-range/).
Issue 26: "ResourceQuota and LimitRange admission"."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException
from spotguard_sim import objects, testing


@pytest.fixture
def sim() -> Iterator[testing.SimCluster]:
    scenario = [objects.namespace("shop"), objects.node("od-1", "on-demand", cpu="8", memory="32Gi")]
    with testing.running_cluster(scenario, time_scale=10) as sim:
        yield sim


def pod(name: str, **resources: dict[str, str]) -> dict[str, Any]:
    app: dict[str, Any] = {"name": "app", "image": objects.PAUSE}
    if resources:
        app["resources"] = resources
    return {"metadata": {"name": name}, "spec": {"containers": [app]}}


def limit_range(core: kubernetes.client.CoreV1Api, name: str, *items: dict[str, Any]) -> Any:
    return core.create_namespaced_limit_range("shop", {"metadata": {"name": name}, "spec": {"limits": list(items)}})


def refusal(call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(ApiException) as info:
        call()
    return info.value.status, json.loads(info.value.body)["message"]


def test_a_limit_range_is_defaulted_as_the_api_does(sim: testing.SimCluster) -> None:
    """SetDefaults_LimitRangeItem: default <- max, defaultRequest <- default, else <- min."""
    core = kubernetes.client.CoreV1Api(sim.api_client())
    made = limit_range(core, "bounds", {"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "64Mi"}})
    item = made.spec.limits[0]
    assert item.default == {"cpu": "2"}
    assert item.default_request == {"cpu": "2", "memory": "64Mi"}
    with pytest.raises(ApiException) as info:
        limit_range(core, "upside-down", {"type": "Container", "min": {"cpu": "2"}, "max": {"cpu": "1"}})
    assert info.value.status == 422
    assert "min value 2 is greater than max value 1" in json.loads(info.value.body)["message"]


def test_a_pod_without_resources_gets_the_defaults_and_the_annotation(sim: testing.SimCluster) -> None:
    core = kubernetes.client.CoreV1Api(sim.api_client())
    limit_range(core, "defaults", {"type": "Container", "defaultRequest": {"cpu": "250m", "memory": "128Mi"},
                                   "default": {"cpu": "500m"}})
    made = core.create_namespaced_pod("shop", pod("bare"))
    res = made.spec.containers[0].resources
    assert res.requests == {"cpu": "250m", "memory": "128Mi"}
    assert res.limits == {"cpu": "500m"}
    assert made.metadata.annotations["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: cpu, memory request for container app; cpu limit for container app")
    assert made.status.qos_class == "Burstable"  # BestEffort before the defaults
    # a pod that states its own keeps them; only what it leaves out is filled
    own = core.create_namespaced_pod("shop", pod("own", requests={"cpu": "100m"}))
    assert own.spec.containers[0].resources.requests == {"cpu": "100m", "memory": "128Mi"}


def test_a_pod_beyond_a_limit_range_is_refused_with_upstreams_messages(sim: testing.SimCluster) -> None:
    core = kubernetes.client.CoreV1Api(sim.api_client())
    limit_range(core, "bounds", {"type": "Container", "max": {"cpu": "1", "memory": "1Gi"},
                                 "min": {"cpu": "100m"}, "maxLimitRequestRatio": {"cpu": "4"}})
    assert refusal(lambda: core.create_namespaced_pod("shop", pod(
        "big", requests={"cpu": "500m"}, limits={"cpu": "2", "memory": "512Mi"}))) == (
        403, 'pods "big" is forbidden: maximum cpu usage per Container is 1, but limit is 2')
    status, message = refusal(lambda: core.create_namespaced_pod("shop", pod(
        "greedy", requests={"cpu": "50m"}, limits={"cpu": "1", "memory": "2Gi"})))
    assert status == 403
    assert message == ('pods "greedy" is forbidden: [minimum cpu usage per Container is 100m, but request is 50m, '
                       "maximum memory usage per Container is 1Gi, but limit is 2Gi, "
                       "cpu max limit to request ratio per Container is 4, but provided ratio is 20.000000]")
    core.create_namespaced_pod("shop", pod("fits", requests={"cpu": "500m"}, limits={"cpu": "1"}))
    assert {p.metadata.name for p in core.list_namespaced_pod("shop").items} == {"fits"}


def test_a_pod_item_bounds_the_sum_of_the_containers(sim: testing.SimCluster) -> None:
    core = kubernetes.client.CoreV1Api(sim.api_client())
    limit_range(core, "per-pod", {"type": "Pod", "max": {"cpu": "1"}})
    two = pod("two", requests={"cpu": "600m"}, limits={"cpu": "600m"})
    two["spec"]["containers"].append({"name": "side", "image": objects.PAUSE,
                                      "resources": {"limits": {"cpu": "600m"}}})
    assert refusal(lambda: core.create_namespaced_pod("shop", two)) == (
        403, 'pods "two" is forbidden: maximum cpu usage per Pod is 1, but limit is 1200m')


def test_limits_without_requests_become_the_requests(sim: testing.SimCluster) -> None:
    """SetDefaults_Pod: the scheduler and the quota see a limit-only container's limits as its
    requests (before, the sim saw no request: kinder to packing)."""
    core = kubernetes.client.CoreV1Api(sim.api_client())
    made = core.create_namespaced_pod("shop", pod("capped", limits={"cpu": "300m", "memory": "256Mi"}))
    assert made.spec.containers[0].resources.requests == {"cpu": "300m", "memory": "256Mi"}
    assert made.status.qos_class == "Guaranteed"


def test_a_replicaset_whose_pods_a_limit_range_refuses_creates_none(sim: testing.SimCluster) -> None:
    """The ReplicaSet controller's creates are refused (FailedCreate) and retried with its back-off;
    lowering nothing, no pod appears; once the LimitRange goes, they do."""
    core = kubernetes.client.CoreV1Api(sim.api_client())
    limit_range(core, "small", {"type": "Container", "max": {"cpu": "200m"}})
    rs = objects.replicaset("web", 2, template=objects.pod_template("web", containers=[
        {"name": "app", "image": objects.PAUSE,
         "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}}]))
    rs["metadata"]["namespace"] = "shop"
    sim.store.create("replicasets", rs)
    deadline = time.monotonic() + 30
    while not any(e["reason"] == "FailedCreate" for e in sim.store.list("events", "shop")[0]):
        assert time.monotonic() < deadline, "no FailedCreate event"
        time.sleep(0.05)
    failed = next(e for e in sim.store.list("events", "shop")[0] if e["reason"] == "FailedCreate")
    assert "maximum cpu usage per Container is 200m, but limit is 500m" in failed["message"]
    assert not sim.store.list("pods", "shop")[0]
    core.delete_namespaced_limit_range("small", "shop")
    deadline = time.monotonic() + 60
    while len(sim.store.list("pods", "shop")[0]) < 2:
        assert time.monotonic() < deadline, "the ReplicaSet's pods after the LimitRange went"
        time.sleep(0.05)
