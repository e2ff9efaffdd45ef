"""Behaviour of the simulated API server that a contract test cannot reach on a real
cluster (fault injection, expired watches, node binding, graceful deletion, garbage
collection, scale), checked over HTTP with the official client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import kubernetes
import pytest
import requests
from kubernetes.client import ApiException
from spotguard_sim import clock, errors, scenario, store, testing

from tests.sim.conftest import REPO, deployment_manifest, pod_manifest


@pytest.fixture
def sim() -> Iterator[testing.SimCluster]:
    with testing.running_cluster(controllers=False) as cluster:
        yield cluster


@pytest.fixture
def core(sim: testing.SimCluster) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(sim.api_client())


def session(sim: testing.SimCluster, tmp: Path) -> requests.Session:
    ca = tmp / "ca.pem"
    assert sim.ca_pem is not None
    ca.write_bytes(sim.ca_pem)
    s = requests.Session()
    s.trust_env = False  # REQUESTS_CA_BUNDLE would override verify
    s.verify = str(ca)
    s.headers["Authorization"] = f"Bearer {sim.token}"
    return s


def test_faults_fail_a_share_of_requests_with_a_status(sim: testing.SimCluster,
                                                       core: kubernetes.client.CoreV1Api) -> None:
    """Fault injection: errors per verb and resource, as Kubernetes Status objects
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#api-verbs and
    https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/)."""
    sim.faults.set(verb="list", resource="pods", error_rate=1.0, status=500)
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("default")
    assert info.value.status == 500
    assert json.loads(info.value.body)["reason"] == "InternalError"
    core.list_namespaced_config_map("default")  # other resources are not faulted
    sim.faults.clear()
    sim.faults.set(verb="create", resource="*", error_rate=1.0, status=429)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_config_map("default", {"metadata": {"name": "x"}})
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "1"
    sim.faults.clear()
    core.list_namespaced_pod("default")
    sim.faults.set(verb="get", resource="namespaces", error_rate=0.5, status=409)
    outcomes = []
    for _ in range(40):
        try:
            core.read_namespace("default")
            outcomes.append(200)
        except ApiException as exc:
            outcomes.append(exc.status)
    assert set(outcomes) == {200, 409}


def test_fault_latency_and_timeouts(sim: testing.SimCluster,
                                    core: kubernetes.client.CoreV1Api, tmp_path: Path) -> None:
    """Fault injection: latency, and a request held past the client's timeout."""
    sim.faults.set(verb="get", resource="namespaces", latency_seconds=0.3)
    started = time.monotonic()
    core.read_namespace("default")
    assert time.monotonic() - started >= 0.3
    sim.faults.clear()
    sim.faults.set(verb="list", resource="nodes", error_rate=1.0, timeout=True, hold_seconds=1.5)
    # The ReadTimeout is the proof: the server held the request past the client's 0.5 s
    # (an upper bound on the elapsed time was a timed assertion that failed under load).
    with pytest.raises(requests.exceptions.ReadTimeout):
        session(sim, tmp_path).get(f"{sim.url}/api/v1/nodes", timeout=0.5)
    sim.faults.clear()


def test_watch_from_an_expired_resource_version_is_410() -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#410-gone-responses"""
    small = store.Store(clock.Clock(), history=5)
    for i in range(10):
        small.create("configmaps", {"metadata": {"name": f"c{i}"}}, namespace="default")
    with pytest.raises(errors.Gone) as info:
        small.watch("configmaps", "default", resource_version="2")
    assert info.value.status()["code"] == 410 and info.value.status()["reason"] == "Expired"
    recent = small.watch("configmaps", "default", resource_version=small.resource_version)
    small.create("configmaps", {"metadata": {"name": "late"}}, namespace="default")
    event = recent.get(timeout=1)
    assert event is not None and event["object"]["metadata"]["name"] == "late"
    recent.close()


def test_binding_assigns_the_node_once(sim: testing.SimCluster,
                                       core: kubernetes.client.CoreV1Api) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#create-binding-of-the-specified-pod"""
    core.create_node({"metadata": {"name": "n1"}})
    core.create_namespaced_pod("default", pod_manifest("bound"))
    target = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"},
              "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    core.create_namespaced_binding("default", target, _preload_content=False)
    pod = core.read_namespaced_pod("bound", "default")
    assert pod.spec.node_name == "n1"
    assert any(c.type == "PodScheduled" and c.status == "True" for c in pod.status.conditions)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_binding("default", target, _preload_content=False)
    assert info.value.status == 409


def test_graceful_deletion_of_a_scheduled_pod(sim: testing.SimCluster,
                                              core: kubernetes.client.CoreV1Api) -> None:
    """https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination
    (the API marks the pod; the kubelet removes it after the grace period)"""
    core.create_namespaced_pod("default", pod_manifest("graceful", nodeName="n-x",
                                                       terminationGracePeriodSeconds=20))
    core.delete_namespaced_pod("graceful", "default")
    pod = core.read_namespaced_pod("graceful", "default")
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == 20
    sim.store.remove("pods", "graceful", "default")  # what the kubelet does
    with pytest.raises(ApiException):
        core.read_namespaced_pod("graceful", "default")
    core.create_namespaced_pod("default", pod_manifest("forced", nodeName="n-x"))
    core.delete_namespaced_pod("forced", "default", grace_period_seconds=0)
    with pytest.raises(ApiException):
        core.read_namespaced_pod("forced", "default")


def test_garbage_collection_follows_owner_references(sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/concepts/architecture/garbage-collection/
    (background cascading deletion; propagationPolicy Orphan keeps dependents)"""
    apps = kubernetes.client.AppsV1Api(sim.api_client())
    core = kubernetes.client.CoreV1Api(sim.api_client())

    def owned(kind: str, owner: object) -> dict[str, object]:
        meta = owner.metadata  # type: ignore[attr-defined]
        return {"apiVersion": "apps/v1", "kind": kind, "name": meta.name, "uid": meta.uid,
                "controller": True, "blockOwnerDeletion": True}

    for name, policy in (("gc", None), ("orphan", "Orphan")):
        dep = apps.create_namespaced_deployment("default", deployment_manifest(name))
        rs_body = {"metadata": {"name": f"{name}-rs", "ownerReferences": [owned("Deployment", dep)]},
                   "spec": {**deployment_manifest(name)["spec"]}}
        rs = apps.create_namespaced_replica_set("default", rs_body)
        pod = pod_manifest(f"{name}-pod")
        pod["metadata"]["ownerReferences"] = [owned("ReplicaSet", rs)]
        core.create_namespaced_pod("default", pod)
        apps.delete_namespaced_deployment(name, "default", propagation_policy=policy)
        rs_left = [r.metadata.name for r in apps.list_namespaced_replica_set("default").items]
        pods_left = [p.metadata.name for p in core.list_namespaced_pod("default").items]
        if policy == "Orphan":
            assert f"{name}-rs" in rs_left and f"{name}-pod" in pods_left
            assert not apps.read_namespaced_replica_set(f"{name}-rs", "default").metadata.owner_references
        else:
            assert f"{name}-rs" not in rs_left and f"{name}-pod" not in pods_left


def test_namespace_deletion_removes_its_objects(core: kubernetes.client.CoreV1Api) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/"""
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_config_map("doomed", {"metadata": {"name": "c"}})
    core.delete_namespace("doomed")
    with pytest.raises(ApiException):
        core.read_namespaced_config_map("c", "doomed")


def test_scenarios_load(sim: testing.SimCluster) -> None:
    """The shipped scenarios are valid: the small one loads, the large one expands to 1,000 nodes."""
    small = scenario.load(REPO / "infra" / "scenarios" / "small.yaml")
    sim.store.apply_objects(small)
    nodes, _ = sim.store.list("nodes")
    assert {n["metadata"]["labels"]["node.kubernetes.io/capacity"] for n in nodes} == {
        "spot", "on-demand"}
    assert all(n["spec"]["providerID"].startswith("aws:///us-east-1") for n in nodes)
    large = scenario.load(REPO / "infra" / "scenarios" / "large.yaml")
    kinds = [o["kind"] for o in large]
    assert kinds.count("Node") == 1000
    replicas = sum(o["spec"]["replicas"] for o in large if o["kind"] in ("Deployment", "StatefulSet"))
    assert replicas == 20000


@pytest.mark.slow
def test_scale_1000_nodes_20000_pods(sim: testing.SimCluster, tmp_path: Path) -> None:
    """1,000 nodes and 20,000 pods: listing every pod over HTTPS stays well under a second
    on an idle machine (the bound here leaves room for a loaded CI runner), and pods are
    created over HTTP at more than a hundred a second."""
    for obj in scenario.load(REPO / "infra" / "scenarios" / "large.yaml"):
        if obj["kind"] == "Node":
            sim.store.create("nodes", obj)
    for i in range(20000):
        sim.store.create("pods", {
            "metadata": {"name": f"p-{i:05d}", "namespace": "default",
                         "labels": {"app": f"a{i % 360}", "pod-template-hash": "5d8c9f7b6"}},
            "spec": {"nodeName": f"spot-{i % 700:04d}", "containers": [{
                "name": "app", "image": "nginx:1.27",
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]},
            "status": {"phase": "Running"},
        })
    s = session(sim, tmp_path)
    timings = []
    for _ in range(2):
        started = time.monotonic()
        reply = s.get(f"{sim.url}/api/v1/pods")
        body = reply.content
        timings.append(time.monotonic() - started)
    assert reply.status_code == 200
    assert body.count(b'"kind":"Pod"') == 20000
    on_node = s.get(f"{sim.url}/api/v1/pods", params={"fieldSelector": "spec.nodeName=spot-0001"})
    assert len(on_node.json()["items"]) == len(range(1, 20000, 700))
    body_doc = {"metadata": {"generateName": "c-"},
                "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}}
    sessions = [session(sim, tmp_path) for _ in range(8)]
    started = time.monotonic()
    with futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(
            lambda i: sessions[i % 8].post(f"{sim.url}/api/v1/namespaces/default/pods",
                                           json=body_doc).status_code, range(400)))
    rate = 400 / (time.monotonic() - started)
    print(f"list_pods_seconds={min(timings):.3f} create_pods_per_second={rate:.0f}")
    assert codes.count(201) == 400
    assert min(timings) < 2.0, f"listing 20,000 pods took {min(timings):.2f}s"
    assert rate > 100, f"only {rate:.0f} creates a second"


def test_a_generated_name_already_taken_is_drawn_again_a_chosen_one_is_a_409() -> None:
    """RetryGenerateName (KEP-4420, on by default since Kubernetes 1.31): kube-apiserver
    draws a generated name again when it is taken, where it once returned 409 (a burst of
    400 pods through the webhook lost one that way, once)."""
    st = store.Store()
    state = store._NAMES.getstate()
    taken = store._generate("cm-")  # the name the next generateName will draw
    store._NAMES.setstate(state)
    st.create("configmaps", {"metadata": {"name": taken}}, namespace="default")
    made = st.create("configmaps", {"metadata": {"generateName": "cm-"}}, namespace="default")
    assert made["metadata"]["name"].startswith("cm-") and made["metadata"]["name"] != taken
    with pytest.raises(errors.StatusError) as err:
        st.create("configmaps", {"metadata": {"name": taken}}, namespace="default")
    assert err.value.code == 409
