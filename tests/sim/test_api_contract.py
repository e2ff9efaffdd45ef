"""The API contract: behaviour spotguard relies on, checked against the simulated
cluster and (with SPOTGUARD_E2E_KUBECONFIG) a real one, through the official client.

Each test names the Kubernetes documentation it follows.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException

from tests.sim.conftest import Cluster, deployment_manifest, pod_manifest


def raw(cluster: Cluster, method: str, path: str, body: Any = None, *,
        content_type: str = "application/json", query: list[tuple[str, str]] | None = None
        ) -> tuple[int, Any]:
    """A raw API call through the official client; (status, decoded JSON body)."""
    try:
        resp = cluster.client.call_api(
            path, method, query_params=query or [], body=body,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False,
        )
        status, data = resp.status, resp.data
    except ApiException as exc:
        status, data = exc.status, exc.body
    return status, json.loads(data) if data else None


def test_discovery_lists_the_served_groups(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api"""
    status, version = raw(cluster, "GET", "/version")
    assert status == 200 and version["major"] == "1"
    status, groups = raw(cluster, "GET", "/apis")
    names = {g["name"] for g in groups["groups"]}
    assert {"apps", "coordination.k8s.io", "policy", "autoscaling",
            "admissionregistration.k8s.io"} <= names
    status, core = raw(cluster, "GET", "/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods"]["namespaced"] and not by_name["nodes"]["namespaced"]
    assert by_name["pods/eviction"]["group"] == "policy"
    assert by_name["pods/eviction"]["kind"] == "Eviction"
    status, apps = raw(cluster, "GET", "/apis/apps/v1")
    scale = {r["name"]: r for r in apps["resources"]}["deployments/scale"]
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")


def test_generate_name_fills_name_uid_and_resource_version(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#generated-values"""
    pod = cluster.core.create_namespaced_pod(cluster.namespace, pod_manifest(generate_name="web-"))
    assert pod.metadata.name.startswith("web-") and len(pod.metadata.name) == len("web-") + 5
    assert pod.metadata.uid and pod.metadata.resource_version and pod.metadata.creation_timestamp
    assert pod.status.phase == "Pending"


def test_get_missing_object_is_a_404_status(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/"""
    status, body = raw(cluster, "GET", f"/api/v1/namespaces/{cluster.namespace}/pods/nope")
    assert status == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound" and body["code"] == 404
    assert body["details"]["name"] == "nope"


def test_create_twice_is_409_already_exists(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/ (create: 409 when it exists)"""
    cluster.core.create_namespaced_config_map(cluster.namespace, {"metadata": {"name": "c"}})
    with pytest.raises(ApiException) as info:
        cluster.core.create_namespaced_config_map(cluster.namespace, {"metadata": {"name": "c"}})
    assert info.value.status == 409
    assert json.loads(info.value.body)["reason"] == "AlreadyExists"


def test_invalid_name_is_422(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-subdomain-names"""
    with pytest.raises(ApiException) as info:
        cluster.core.create_namespaced_config_map(cluster.namespace,
                                                  {"metadata": {"name": "Not_Valid"}})
    assert info.value.status == 422
    assert json.loads(info.value.body)["reason"] == "Invalid"


def test_update_with_stale_resource_version_is_409_conflict(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions
    (optimistic concurrency: an update with an old resourceVersion is rejected)"""
    cm = cluster.core.create_namespaced_config_map(
        cluster.namespace, {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    first = cluster.core.read_namespaced_config_map("cfg", cluster.namespace)
    first.data = {"a": "2"}
    updated = cluster.core.replace_namespaced_config_map("cfg", cluster.namespace, first)
    assert updated.metadata.resource_version != cm.metadata.resource_version
    cm.data = {"a": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as info:
        cluster.core.replace_namespaced_config_map("cfg", cluster.namespace, cm)
    assert info.value.status == 409
    assert json.loads(info.value.body)["reason"] == "Conflict"


def test_label_selectors_equality_and_set_based(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"""
    ns = cluster.namespace
    for name, labels in (("a", {"app": "web", "tier": "fe"}), ("b", {"app": "web", "tier": "be"}),
                         ("c", {"app": "db"})):
        cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": name, "labels": labels}})

    def names(selector: str) -> list[str]:
        items = cluster.core.list_namespaced_config_map(ns, label_selector=selector).items
        return sorted(i.metadata.name for i in items if i.metadata.name in "abc")

    assert names("app=web") == ["a", "b"]
    assert names("app!=web") == ["c"]
    assert names("tier in (fe,xx)") == ["a"]
    assert names("tier notin (fe)") == ["b", "c"]
    assert names("tier") == ["a", "b"]
    assert names("!tier") == ["c"]
    assert names("app=web,tier=be") == ["b"]


def test_field_selectors(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/"""
    ns = cluster.namespace
    cluster.core.create_namespaced_pod(ns, pod_manifest("p1"))
    cluster.core.create_namespaced_pod(ns, pod_manifest("p2"))
    items = cluster.core.list_namespaced_pod(ns, field_selector="metadata.name=p2").items
    assert [p.metadata.name for p in items] == ["p2"]
    items = cluster.core.list_pod_for_all_namespaces(
        field_selector=f"metadata.namespace={ns},metadata.name!=p2").items
    assert [p.metadata.name for p in items] == ["p1"]
    unscheduled = cluster.core.list_namespaced_pod(ns, field_selector="spec.nodeName=").items
    assert {p.metadata.name for p in unscheduled} >= {"p1", "p2"}
    with pytest.raises(ApiException) as info:
        cluster.core.list_namespaced_pod(ns, field_selector="spec.notAField=x")
    assert info.value.status == 400


def test_list_in_chunks_with_limit_and_continue(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks"""
    ns = cluster.namespace
    for i in range(7):
        cluster.core.create_namespaced_config_map(
            ns, {"metadata": {"name": f"cm-{i}", "labels": {"chunk": "yes"}}})
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = cluster.core.list_namespaced_config_map(
            ns, label_selector="chunk=yes", limit=3, _continue=token)
        pages += 1
        seen += [i.metadata.name for i in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert pages == 3
    assert sorted(seen) == [f"cm-{i}" for i in range(7)]


def test_watch_from_resource_version(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes"""
    ns = cluster.namespace
    start = cluster.core.list_namespaced_config_map(ns).metadata.resource_version
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "w"}, "data": {"k": "1"}})
    cluster.core.patch_namespaced_config_map("w", ns, {"data": {"k": "2"}})
    cluster.core.delete_namespaced_config_map("w", ns)
    events = []
    watch = kubernetes.watch.Watch()
    for event in watch.stream(cluster.core.list_namespaced_config_map, ns,
                              resource_version=start, timeout_seconds=5):
        if event["object"].metadata.name == "w":
            events.append((event["type"], (event["object"].data or {}).get("k")))
        if len(events) == 3:
            watch.stop()
    assert events == [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")]


def test_watch_sees_live_changes(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes"""
    ns = cluster.namespace
    start = cluster.core.list_namespaced_config_map(ns).metadata.resource_version
    timer = threading.Timer(0.3, lambda: cluster.core.create_namespaced_config_map(
        ns, {"metadata": {"name": "later", "labels": {"w": "1"}}}))
    timer.start()
    watch = kubernetes.watch.Watch()
    got = None
    for event in watch.stream(cluster.core.list_namespaced_config_map, ns, label_selector="w=1",
                              resource_version=start, timeout_seconds=5):
        got = (event["type"], event["object"].metadata.name)
        watch.stop()
    timer.join()
    assert got == ("ADDED", "later")


def test_patch_types(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/
    (strategic merge merges containers by name and replaces tolerations; JSON merge
    patch replaces lists; JSON patch applies operations)"""
    ns = cluster.namespace
    dep = deployment_manifest("patchme")
    dep["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "a", "operator": "Exists", "effect": "NoSchedule"}]
    cluster.apps.create_namespaced_deployment(ns, dep)
    strategic = {"spec": {"template": {"spec": {
        "containers": [{"name": "side", "image": "busybox:1.36"}],
        "tolerations": [{"key": "b", "operator": "Exists", "effect": "NoSchedule"}],
    }}}}
    out = cluster.apps.patch_namespaced_deployment("patchme", ns, strategic)
    spec = out.spec.template.spec
    assert [c.name for c in spec.containers] == ["app", "side"]
    assert [t.key for t in spec.tolerations] == ["b"]
    delete = {"spec": {"template": {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}}}
    out = cluster.apps.patch_namespaced_deployment("patchme", ns, delete)
    assert [c.name for c in out.spec.template.spec.containers] == ["app"]
    status, body = raw(cluster, "PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/patchme",
                       {"metadata": {"labels": {"merged": "yes", "app": None}}},
                       content_type="application/merge-patch+json")
    assert status == 200 and body["metadata"]["labels"] == {"merged": "yes"}
    status, body = raw(cluster, "PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/patchme",
                       [{"op": "replace", "path": "/spec/replicas", "value": 3},
                        {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}],
                       content_type="application/json-patch+json")
    assert status == 200 and body["spec"]["replicas"] == 3
    assert body["metadata"]["annotations"] == {"x": "y"}
    assert body["metadata"]["generation"] >= 2
    status, body = raw(cluster, "PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/patchme",
                       [{"op": "test", "path": "/spec/replicas", "value": 99}],
                       content_type="application/json-patch+json")
    assert status == 422


def test_dry_run_does_not_persist(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run"""
    ns = cluster.namespace
    out = cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "dry"}},
                                                    dry_run="All")
    assert out.metadata.name == "dry"
    with pytest.raises(ApiException) as info:
        cluster.core.read_namespaced_config_map("dry", ns)
    assert info.value.status == 404
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "wet"}, "data": {"a": "1"}})
    cluster.core.patch_namespaced_config_map("wet", ns, {"data": {"a": "2"}}, dry_run="All")
    assert cluster.core.read_namespaced_config_map("wet", ns).data == {"a": "1"}
    cluster.core.delete_namespaced_config_map("wet", ns, dry_run="All")
    assert cluster.core.read_namespaced_config_map("wet", ns).data == {"a": "1"}


def test_scale_subresource(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/deployment-v1/#get-read-scale-of-the-specified-deployment"""
    ns = cluster.namespace
    cluster.apps.create_namespaced_deployment(ns, deployment_manifest("scaled", replicas=1))
    scale = cluster.apps.read_namespaced_deployment_scale("scaled", ns)
    assert scale.spec.replicas == 1 and scale.kind == "Scale"
    out = cluster.apps.patch_namespaced_deployment_scale("scaled", ns, {"spec": {"replicas": 4}})
    assert out.spec.replicas == 4
    assert cluster.apps.read_namespaced_deployment("scaled", ns).spec.replicas == 4
    scale = cluster.apps.read_namespaced_deployment_scale("scaled", ns)
    scale.spec.replicas = 2
    cluster.apps.replace_namespaced_deployment_scale("scaled", ns, scale)
    assert cluster.apps.read_namespaced_deployment("scaled", ns).spec.replicas == 2
    scale.spec.replicas = 5  # stale resourceVersion now
    with pytest.raises(ApiException) as info:
        cluster.apps.replace_namespaced_deployment_scale("scaled", ns, scale)
    assert info.value.status == 409


def test_status_subresource_separates_spec_and_status(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/#object-spec-and-status
    (the main resource ignores status changes; /status changes only status)"""
    ns = cluster.namespace
    cluster.apps.create_namespaced_deployment(ns, deployment_manifest("st", replicas=0))
    status, body = raw(cluster, "PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/st/status",
                       {"status": {"observedGeneration": 42}, "spec": {"replicas": 7}},
                       content_type="application/merge-patch+json")
    assert status == 200
    assert body["status"]["observedGeneration"] == 42 and body["spec"]["replicas"] == 0
    status, body = raw(cluster, "PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/st",
                       {"status": {"observedGeneration": 1000}, "spec": {"replicas": 0}},
                       content_type="application/merge-patch+json")
    assert body["status"].get("observedGeneration") != 1000


def test_deleting_an_unscheduled_pod_removes_it(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination
    (a pod not bound to a node has no kubelet to wait for)"""
    ns = cluster.namespace
    cluster.core.create_namespaced_pod(ns, pod_manifest("gone", nodeSelector={"no": "such-node"}))
    cluster.core.delete_namespaced_pod("gone", ns)
    with pytest.raises(ApiException) as info:
        cluster.core.read_namespaced_pod("gone", ns)
    assert info.value.status == 404


def test_create_in_missing_namespace_is_404(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#namespacelifecycle"""
    with pytest.raises(ApiException) as info:
        cluster.core.create_namespaced_config_map("sg-no-such-namespace",
                                                  {"metadata": {"name": "x"}})
    assert info.value.status == 404


def test_leases_for_optimistic_reservations(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/architecture/leases/"""
    coord = kubernetes.client.CoordinationV1Api(cluster.client)
    ns = cluster.namespace
    lease = coord.create_namespaced_lease(ns, {"metadata": {"name": "slots"},
                                               "spec": {"holderIdentity": "a"}})
    lease.spec.holder_identity = "b"
    coord.replace_namespaced_lease("slots", ns, lease)
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as info:
        coord.replace_namespaced_lease("slots", ns, lease)
    assert info.value.status == 409


def test_pdb_and_hpa_round_trip(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/tasks/run-application/configure-pdb/ and
    https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/"""
    ns = cluster.namespace
    cluster.policy.create_namespaced_pod_disruption_budget(ns, {
        "metadata": {"name": "pdb"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}})
    assert cluster.policy.read_namespaced_pod_disruption_budget("pdb", ns).spec.min_available == 1
    hpa_api = kubernetes.client.AutoscalingV2Api(cluster.client)
    hpa_api.create_namespaced_horizontal_pod_autoscaler(ns, {
        "metadata": {"name": "h"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                 "minReplicas": 2, "maxReplicas": 5}})
    assert hpa_api.read_namespaced_horizontal_pod_autoscaler("h", ns).spec.max_replicas == 5


def test_eviction_without_a_budget_deletes_the_pod(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/"""
    ns = cluster.namespace
    cluster.core.create_namespaced_pod(ns, pod_manifest("evictme", nodeSelector={"no": "node"}))
    cluster.core.create_namespaced_pod_eviction("evictme", ns, {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "evictme", "namespace": ns}})
    with pytest.raises(ApiException) as info:
        cluster.core.read_namespaced_pod("evictme", ns)
    assert info.value.status == 404
    with pytest.raises(ApiException) as info:
        cluster.core.create_namespaced_pod_eviction("evictme", ns, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "evictme"}})
    assert info.value.status == 404


def test_create_ignores_the_status_a_client_sends(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/#object-spec-and-status
    (status is written by the system, through the status subresource)"""
    pod = pod_manifest("claims-running", nodeSelector={"no": "node"})
    pod["status"] = {"phase": "Running"}
    created = cluster.core.create_namespaced_pod(cluster.namespace, pod)
    assert created.status.phase == "Pending"


def test_delete_answers_a_success_status_or_the_pod(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/ (DELETE returns a
    Status for objects removed at once; pods return the deleted object)"""
    ns = cluster.namespace
    cm = cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "del"}})
    status, body = raw(cluster, "DELETE", f"/api/v1/namespaces/{ns}/configmaps/del")
    assert status == 200 and body["kind"] == "Status" and body["status"] == "Success"
    assert body["details"]["name"] == "del" and body["details"]["uid"] == cm.metadata.uid
    cluster.core.create_namespaced_pod(ns, pod_manifest("delpod", nodeSelector={"no": "node"}))
    status, body = raw(cluster, "DELETE", f"/api/v1/namespaces/{ns}/pods/delpod")
    assert status == 200 and body["kind"] == "Pod"
