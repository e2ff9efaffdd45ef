"""ResourceQuota admission and the quota controller, as kube-apiserver and
kube-controller-manager (sources in ``spotguard_sim/quota.py``;
https://kubernetes.io/docs/concepts/policy/resource-quotas/)."""

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


def wait(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + 60
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def pod(name: str, cpu: str | None = "400m", memory: str | None = "256Mi") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [objects.container("app", cpu=cpu, memory=memory)]}}


def refusal(call: Callable[[], Any]) -> tuple[int, str, dict[str, Any]]:
    with pytest.raises(ApiException) as info:
        call()
    body = json.loads(info.value.body)
    return info.value.status, body["message"], body.get("details") or {}


def quota(core: kubernetes.client.CoreV1Api, sim: testing.SimCluster, name: str, hard: dict[str, str]) -> None:
    core.create_namespaced_resource_quota("shop", {"metadata": {"name": name}, "spec": {"hard": hard}})
    wait(lambda: (sim.store.get("resourcequotas", name, "shop").get("status") or {}).get("hard") == hard,
         "the quota controller")  # fmt: skip


def test_pods_beyond_the_quota_are_refused_with_upstreams_messages(sim: testing.SimCluster) -> None:
    core = kubernetes.client.CoreV1Api(sim.api_client())
    quota(core, sim, "compute", {"pods": "3", "requests.cpu": "1", "requests.memory": "1Gi"})
    assert refusal(lambda: core.create_namespaced_pod("shop", pod("bare", cpu=None, memory=None))) == (
        403, 'pods "bare" is forbidden: failed quota: compute: must specify requests.cpu for: app; '
             "requests.memory for: app", {"name": "bare", "kind": "pods"})  # fmt: skip
    core.create_namespaced_pod("shop", pod("p1"))
    core.create_namespaced_pod("shop", pod("p2"))
    assert refusal(lambda: core.create_namespaced_pod("shop", pod("p3")))[:2] == (
        403, 'pods "p3" is forbidden: exceeded quota: compute, requested: requests.cpu=400m, used: '
             "requests.cpu=800m, limited: requests.cpu=1")  # fmt: skip
    assert "p3" not in {p["metadata"]["name"] for p in sim.store.list("pods", "shop")[0]}
    used = {"pods": "2", "requests.cpu": "800m", "requests.memory": "512Mi"}
    wait(lambda: sim.store.get("resourcequotas", "compute", "shop")["status"]["used"] == used, "status.used")
    core.create_namespaced_pod("shop", pod("small", cpu="200m"))  # what still fits is admitted
    # a deleted pod frees its share
    core.delete_namespaced_pod("small", "shop", grace_period_seconds=0)
    wait(lambda: "small" not in {p["metadata"]["name"] for p in sim.store.list("pods", "shop")[0]}, "the deletion")
    core.create_namespaced_pod("shop", pod("again", cpu="200m"))


def test_object_counts(sim: testing.SimCluster) -> None:
    core = kubernetes.client.CoreV1Api(sim.api_client())
    apps = kubernetes.client.AppsV1Api(sim.api_client())
    quota(core, sim, "objects", {"count/deployments.apps": "1", "configmaps": "1"})
    apps.create_namespaced_deployment("shop", objects.deployment("a", 1, namespace="shop"))
    assert refusal(lambda: apps.create_namespaced_deployment("shop", objects.deployment("b", 1, namespace="shop"))) == (
        403, 'deployments.apps "b" is forbidden: exceeded quota: objects, requested: count/deployments.apps=1, '
             "used: count/deployments.apps=1, limited: count/deployments.apps=1",
        {"name": "b", "group": "apps", "kind": "deployments"})  # fmt: skip
    core.create_namespaced_config_map("shop", {"metadata": {"name": "one"}})
    assert refusal(lambda: core.create_namespaced_config_map("shop", {"metadata": {"name": "two"}}))[0] == 403


def test_a_surge_a_nearly_full_quota_refuses_waits_for_room(sim: testing.SimCluster) -> None:
    """A Deployment scaled past its namespace's quota gets what fits; the ReplicaSet
    controller reports FailedCreate and retries, and the rest come once there is room."""
    core = kubernetes.client.CoreV1Api(sim.api_client())
    apps = kubernetes.client.AppsV1Api(sim.api_client())
    quota(core, sim, "compute", {"pods": "3"})
    template = objects.pod_template("web", containers=[objects.container("web", cpu="100m")])
    apps.create_namespaced_deployment("shop", objects.deployment("web", 2, namespace="shop", template=template))
    web = lambda: sim.store.list("pods", "shop", "app=web")[0]  # noqa: E731
    wait(lambda: len(web()) == 2, "two pods")
    apps.patch_namespaced_deployment_scale("web", "shop", {"spec": {"replicas": 4}})
    failed = wait(lambda: [e for e in sim.store.list("events", "shop")[0] if e.get("reason") == "FailedCreate"],
                  "the ReplicaSet's FailedCreate")  # fmt: skip
    assert "exceeded quota: compute, requested: pods=1, used: pods=3, limited: pods=3" in failed[0]["message"]
    assert len(web()) == 3
    core.delete_namespaced_resource_quota("compute", "shop")
    wait(lambda: len(web()) == 4, "the fourth pod once the quota is gone")
