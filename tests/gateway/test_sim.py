"""The gateway against the simulated cluster (real HTTPS, the kubeconfig it writes, its faults).

GIVEN a running simulated cluster, WHEN spotguard reads and writes through
``kube.connect(kubeconfig)``, THEN objects round-trip, a stale update is a
Conflict, and injected 500/429/timeouts are retried as :mod:`spotguard.gateway.retry` says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from spotguard.gateway import kube, retry
from spotguard.gateway import resources as r
from spotguard_sim import testing

NODES = [
    {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"node-{i}", "labels": {"node.kubernetes.io/capacity": "on-demand"}},
        "spec": {"providerID": f"aws:///eu-west-1a/i-{i:017x}"},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }
    for i in range(2)
]
NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
FAST = retry.Policy(attempts=5, deadline=10.0, timeout=2.0, base_delay=0.01, max_delay=0.05)


@pytest.fixture(scope="module")
def sim() -> Iterator[testing.SimCluster]:
    with testing.running_cluster([*NODES, NAMESPACE], controllers=False) as cluster:
        yield cluster


@pytest.fixture
def k(sim: testing.SimCluster) -> Iterator[kube.Kube]:
    sim.faults.clear()
    yield kube.connect(sim.kubeconfig, policy=FAST)
    sim.faults.clear()


def configmap(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "shop"}, "data": data}


def bare_pod(name: str, node: str = "node-0") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": "paging"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]},
    }


def test_get_and_list_nodes(k: kube.Kube) -> None:
    assert k.get(r.NODES, "node-0")["metadata"]["name"] == "node-0"
    items, version = k.list_with_version(r.NODES)
    assert sorted(n["metadata"]["name"] for n in items) == ["node-0", "node-1"]
    assert version
    assert k.stats.by_verb == {"get": 1, "list": 1}


def test_list_pages_through_many_objects(k: kube.Kube) -> None:
    for i in range(7):
        k.create(r.PODS, bare_pod(f"page-{i}", f"node-{i % 2}"), "shop")
    small_pages = kube.Kube(k.api_client, policy=FAST, page_limit=3)
    pods = small_pages.list(r.PODS, "shop", label_selector="app=paging")
    assert sorted(p["metadata"]["name"] for p in pods) == [f"page-{i}" for i in range(7)]
    assert small_pages.stats.by_verb["list"] == 3
    on_node = small_pages.list(r.PODS, "shop", field_selector="spec.nodeName=node-1")
    assert {p["spec"]["nodeName"] for p in on_node} == {"node-1"}


def test_create_conflict_on_a_stale_update_and_delete(k: kube.Kube) -> None:
    made = k.create(r.CONFIGMAPS, configmap("stale", a="1"), "shop")
    with pytest.raises(kube.AlreadyExists):
        k.create(r.CONFIGMAPS, configmap("stale", a="1"), "shop")
    fresh = dict(made, data={"a": "2"})
    k.replace(r.CONFIGMAPS, fresh)
    with pytest.raises(kube.Conflict):
        k.replace(r.CONFIGMAPS, dict(made, data={"a": "3"}))  # made's resourceVersion is stale now
    assert k.get(r.CONFIGMAPS, "stale", "shop")["data"] == {"a": "2"}
    k.delete(r.CONFIGMAPS, "stale", "shop")
    with pytest.raises(kube.NotFound):
        k.get(r.CONFIGMAPS, "stale", "shop")


def test_dry_run_creates_nothing(k: kube.Kube) -> None:
    k.create(r.CONFIGMAPS, configmap("dry"), "shop", dry_run=True)
    assert k.find(r.CONFIGMAPS, "dry", "shop") is None


def test_three_patch_types(k: kube.Kube) -> None:
    k.create(r.CONFIGMAPS, configmap("patched", a="1"), "shop")
    k.patch(r.CONFIGMAPS, "patched", {"data": {"b": "2"}}, "shop")
    k.patch(r.CONFIGMAPS, "patched", [{"op": "add", "path": "/data/c", "value": "3"}], "shop", patch_type="json")
    k.patch(r.CONFIGMAPS, "patched", {"metadata": {"labels": {"x": "y"}}}, "shop", patch_type="strategic")
    got = k.get(r.CONFIGMAPS, "patched", "shop")
    assert got["data"] == {"a": "1", "b": "2", "c": "3"}
    assert got["metadata"]["labels"] == {"x": "y"}
    assert k.stats.by_verb["patch"] == 3


def test_node_taint_with_a_strategic_merge_patch(k: kube.Kube) -> None:
    taint = {"key": "spotguard.io/interruption", "value": "e-1", "effect": "NoSchedule"}
    k.patch(r.NODES, "node-1", {"spec": {"taints": [taint]}}, patch_type="strategic")
    assert taint in k.get(r.NODES, "node-1")["spec"]["taints"]


def test_evict_a_pod(k: kube.Kube) -> None:
    k.create(r.PODS, bare_pod("evicted"), "shop")
    k.evict("evicted", "shop")
    pod = k.find(r.PODS, "evicted", "shop")
    assert pod is None or pod["metadata"].get("deletionTimestamp")
    with pytest.raises(kube.NotFound):
        k.evict("no-such-pod", "shop")


def test_events_are_written_and_listed(k: kube.Kube) -> None:
    node = k.get(r.NODES, "node-0")
    k.create_event(node, "SpotInterruption", "node is being reclaimed", "Warning", "spotguard-interruption")
    events = k.list(r.EVENTS, "default")
    mine = [e for e in events if e["reason"] == "SpotInterruption"]
    assert len(mine) == 1
    assert mine[0]["involvedObject"]["name"] == "node-0"
    assert mine[0]["source"]["component"] == "spotguard-interruption"


def test_scale_subresource(k: kube.Kube) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        },
    }
    k.create(r.DEPLOYMENTS, deployment, "shop")
    assert k.scale(r.DEPLOYMENTS, "web", "shop")["spec"]["replicas"] == 2
    k.set_scale(r.DEPLOYMENTS, "web", "shop", 5)
    assert k.get(r.DEPLOYMENTS, "web", "shop")["spec"]["replicas"] == 5


@pytest.mark.parametrize("code", [500, 503])
def test_injected_failures_on_reads_are_retried(sim: testing.SimCluster, k: kube.Kube, code: int) -> None:
    sim.faults.set(verb="get", resource="nodes", error_rate=0.3, status=code)
    k = k.with_policy(retry.Policy(attempts=12, base_delay=0.001, max_delay=0.01))
    for _ in range(20):
        assert k.get(r.NODES, "node-0")["kind"] == "Node"
    assert k.stats.requests > 20  # some attempts failed and were retried
    assert k.stats.retries == k.stats.requests - 20
    assert k.stats.by_code.get(code, 0) == k.stats.retries


def test_injected_500_on_a_write_is_not_retried(sim: testing.SimCluster, k: kube.Kube) -> None:
    sim.faults.set(verb="create", resource="configmaps", error_rate=1.0, status=500)
    with pytest.raises(kube.Transient):
        k.create(r.CONFIGMAPS, configmap("never"), "shop")
    assert k.stats.requests == 1


def test_injected_429_on_a_write_is_retried_after_retry_after(sim: testing.SimCluster, k: kube.Kube) -> None:
    sim.faults.set(verb="patch", resource="configmaps", error_rate=1.0, status=429)
    k.create(r.CONFIGMAPS, configmap("throttled"), "shop")
    twice = k.with_policy(retry.Policy(attempts=2, base_delay=0.01))
    started = time.monotonic()
    with pytest.raises(kube.TooManyRequests) as caught:
        twice.patch(r.CONFIGMAPS, "throttled", {"data": {"a": "1"}}, "shop")
    assert caught.value.retry_after is not None
    assert time.monotonic() - started >= caught.value.retry_after * 0.95
    assert k.stats.count("patch") == 2


def test_injected_timeouts_are_retried_for_reads(sim: testing.SimCluster) -> None:
    sim.faults.set(verb="get", resource="namespaces", error_rate=1.0, timeout=True, hold_seconds=0.4)
    k = kube.connect(sim.kubeconfig, policy=retry.Policy(attempts=2, timeout=0.2, base_delay=0.01))
    with pytest.raises(kube.Transient, match="Timeout"):
        k.get(r.NAMESPACES, "shop")
    assert k.stats.requests == 2
    sim.faults.clear()


def test_injected_conflict_is_not_retried(sim: testing.SimCluster, k: kube.Kube) -> None:
    sim.faults.set(verb="update", resource="configmaps", error_rate=1.0, status=409)
    made = k.create(r.CONFIGMAPS, configmap("conflicted"), "shop")
    with pytest.raises(kube.Conflict):
        k.replace(r.CONFIGMAPS, made)
    assert k.stats.count("update") == 1


def test_concurrent_requests_are_all_counted(k: kube.Kube) -> None:
    def work() -> None:
        for _ in range(10):
            k.get(r.NAMESPACES, "shop")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert k.stats.requests == 80
    assert k.stats.snapshot().by_resource == {"namespaces": 80}
