"""The API contract for the workloads every cluster runs besides the user's own
(DaemonSets, Jobs, CronJobs, ReplicationControllers, PriorityClasses), strategic
merge keys and immutable fields: checked against the simulated cluster and,
with SPOTGUARD_E2E_KUBECONFIG, a real one, through the official client.
Each test names the upstream documentation or source it follows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes
import pytest
from kubernetes.client import ApiException

from tests.sim.conftest import Cluster, deployment_manifest, pod_manifest
from tests.sim.test_api_contract import raw

T = TypeVar("T")
PAUSE = "registry.k8s.io/pause:3.10"


def eventually(fn: Callable[[], T], timeout: float = 30.0) -> T:
    """A real cluster's garbage collector acts asynchronously: poll for it."""
    deadline = time.monotonic() + timeout
    while not (result := fn()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {fn}")
        time.sleep(0.1)
    return result


def batch(cluster: Cluster) -> kubernetes.client.BatchV1Api:
    return kubernetes.client.BatchV1Api(cluster.client)


def error(info: pytest.ExceptionInfo[ApiException]) -> tuple[int, str, str]:
    body = json.loads(info.value.body)
    return info.value.status, body["reason"], body["message"]


def job_manifest(name: str, restart: str = "Never") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": restart,
                                           "containers": [{"name": "c", "image": PAUSE}]}}}}


def daemonset_manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": PAUSE}]}}}}


def test_discovery_serves_batch_rcs_priority_classes_and_revisions(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/kubernetes-api/ (batch/v1, core/v1,
    scheduling.k8s.io/v1, apps/v1 resources)"""
    _, batch_v1 = raw(cluster, "GET", "/apis/batch/v1")
    assert {"jobs", "jobs/status", "cronjobs", "cronjobs/status"} <= {r["name"] for r in batch_v1["resources"]}
    _, core = raw(cluster, "GET", "/api/v1")
    rc = {r["name"]: r for r in core["resources"]}
    assert rc["replicationcontrollers"]["shortNames"] == ["rc"]
    assert rc["replicationcontrollers/scale"]["kind"] == "Scale"
    _, sched = raw(cluster, "GET", "/apis/scheduling.k8s.io/v1")
    pcs = {r["name"]: r for r in sched["resources"]}["priorityclasses"]
    assert not pcs["namespaced"] and pcs["shortNames"] == ["pc"]
    _, apps = raw(cluster, "GET", "/apis/apps/v1")
    assert "controllerrevisions" in {r["name"] for r in apps["resources"]}


def test_service_ports_merge_by_port(cluster: Cluster) -> None:
    """A strategic merge patch merges Service spec.ports by `port`
    (x-kubernetes-patch-merge-key in the published OpenAPI; the client e2e test_service_apis)."""
    ns = cluster.namespace
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "front", "labels": {"name": "front"}},
            "spec": {"ports": [{"name": "port", "port": 80, "protocol": "TCP", "targetPort": 80}],
                     "selector": {"name": "front"}}}
    cluster.core.create_namespaced_service(ns, body)
    body["spec"]["ports"] = [{"name": "new", "port": 8080, "protocol": "TCP", "targetPort": 8080}]
    patched = cluster.core.patch_namespaced_service("front", ns, body)
    assert sorted(p.port for p in patched.spec.ports) == [80, 8080]
    patched = cluster.core.patch_namespaced_service("front", ns, {"spec": {"ports": [
        {"port": 80, "name": "http", "targetPort": 8081}]}})
    assert {p.port: (p.name, p.target_port) for p in patched.spec.ports}[80] == ("http", 8081)


def test_container_ports_merge_by_container_port_and_tolerations_are_replaced(cluster: Cluster) -> None:
    """Containers by name, their ports by containerPort, finalizers as a set, tolerations atomic
    (https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/)."""
    ns = cluster.namespace
    dep = deployment_manifest("ports")
    dep["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    dep["spec"]["template"]["spec"]["tolerations"] = [{"key": "a", "operator": "Exists"}]
    dep["metadata"]["finalizers"] = ["example.com/a"]
    cluster.apps.create_namespaced_deployment(ns, dep)
    patched = cluster.apps.patch_namespaced_deployment("ports", ns, {
        "metadata": {"finalizers": ["example.com/b"]},
        "spec": {"template": {"spec": {
            "containers": [{"name": "app", "ports": [{"containerPort": 81}]}],
            "tolerations": [{"key": "b", "operator": "Exists"}]}}}})
    spec = patched.spec.template.spec
    assert [p.container_port for p in spec.containers[0].ports] == [80, 81]
    assert [t.key for t in spec.tolerations] == ["b"]
    assert patched.metadata.finalizers == ["example.com/a", "example.com/b"]
    cluster.apps.patch_namespaced_deployment("ports", ns, [{"op": "remove", "path": "/metadata/finalizers"}])


def test_daemonset_defaults_and_status_fields(cluster: Cluster) -> None:
    """apps/v1 DaemonSet defaults (updateStrategy RollingUpdate, maxUnavailable 1, maxSurge 0,
    revisionHistoryLimit 10); the status fields the API always serialises let the official
    client deserialise it (the client e2e test_create_daemonset)."""
    ns = cluster.namespace
    cluster.apps.create_namespaced_daemon_set(ns, daemonset_manifest("agent"))
    ds = cluster.apps.read_namespaced_daemon_set("agent", ns)
    rolling = ds.spec.update_strategy.rolling_update
    assert (ds.spec.update_strategy.type, rolling.max_unavailable, rolling.max_surge) == ("RollingUpdate", 1, 0)
    assert ds.spec.revision_history_limit == 10
    assert ds.status.number_misscheduled == 0 and ds.status.desired_number_scheduled >= 0
    bad = daemonset_manifest("bad")
    bad["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    with pytest.raises(ApiException) as info:
        cluster.apps.create_namespaced_daemon_set(ns, bad)
    assert error(info)[:2] == (422, "Invalid")
    cluster.apps.delete_namespaced_daemon_set("agent", ns)


def test_job_generated_selector_defaults_and_restart_policy(cluster: Cluster) -> None:
    """batch/v1 Job: generated selector and labels, defaults; restartPolicy must be Never or
    OnFailure (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-selector)."""
    ns = cluster.namespace
    job = batch(cluster).create_namespaced_job(ns, job_manifest("work"))
    uid = job.metadata.uid
    assert job.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    labels = job.spec.template.metadata.labels
    assert labels["batch.kubernetes.io/controller-uid"] == uid and labels["job-name"] == "work"
    assert (job.spec.completions, job.spec.parallelism, job.spec.backoff_limit) == (1, 1, 6)
    assert (job.spec.completion_mode, job.spec.suspend, job.spec.pod_replacement_policy) == (
        "NonIndexed", False, "TerminatingOrFailed")
    with pytest.raises(ApiException) as info:
        batch(cluster).create_namespaced_job(ns, job_manifest("always", restart="Always"))
    assert error(info)[:2] == (422, "Invalid") and "restartPolicy" in error(info)[2]
    with pytest.raises(ApiException) as info:
        batch(cluster).patch_namespaced_job("work", ns, {"spec": {"completions": 3}})
    assert error(info)[0] == 422 and "immutable" in error(info)[2]


def test_deleting_a_job_or_rc_without_propagation_orphans_dependents(cluster: Cluster) -> None:
    """batch/v1 Jobs and v1 ReplicationControllers default to OrphanDependents
    (DefaultGarbageCollectionPolicy in pkg/registry/batch/job/strategy.go and
    pkg/registry/core/replicationcontroller/strategy.go)."""
    ns = cluster.namespace
    job = batch(cluster).create_namespaced_job(ns, {**job_manifest("orphaner"), "spec": {
        **job_manifest("orphaner")["spec"], "suspend": True}})
    dependent = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dep", "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "orphaner", "uid": job.metadata.uid}]}}
    cluster.core.create_namespaced_config_map(ns, dependent)
    batch(cluster).delete_namespaced_job("orphaner", ns)
    eventually(lambda: not cluster.core.read_namespaced_config_map("dep", ns).metadata.owner_references)


def test_cronjob_defaults_and_schedule_validation(cluster: Cluster) -> None:
    """batch/v1 CronJob defaults (concurrencyPolicy Allow, history limits 3 and 1) and a schedule
    that does not parse is 422 (https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/)."""
    ns = cluster.namespace
    body = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick"},
            "spec": {"schedule": "*/5 * * * *", "suspend": True,
                     "jobTemplate": {"spec": job_manifest("tick")["spec"]}}}
    cj = batch(cluster).create_namespaced_cron_job(ns, body)
    assert (cj.spec.concurrency_policy, cj.spec.successful_jobs_history_limit,
            cj.spec.failed_jobs_history_limit) == ("Allow", 3, 1)
    body["metadata"]["name"] = "bad"
    body["spec"]["schedule"] = "every minute"
    with pytest.raises(ApiException) as info:
        batch(cluster).create_namespaced_cron_job(ns, body)
    assert error(info)[:2] == (422, "Invalid")


def test_replication_controller_apis(cluster: Cluster) -> None:
    """core/v1 ReplicationControllers are served; the selector defaults to the template labels
    (the client e2e test_replication_controller_apis)."""
    ns = cluster.namespace
    body = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "front"},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"name": "front"}},
                                                 "spec": {"containers": [{"name": "c", "image": PAUSE}]}}}}
    rc = cluster.core.create_namespaced_replication_controller(ns, body)
    assert (rc.spec.replicas, rc.spec.selector, rc.metadata.labels) == (2, {"name": "front"}, {"name": "front"})
    assert cluster.core.read_namespaced_replication_controller("front", ns).spec.replicas == 2
    scale = cluster.core.read_namespaced_replication_controller_scale("front", ns)
    assert scale.spec.replicas == 2
    cluster.core.delete_namespaced_replication_controller("front", ns, propagation_policy="Background")


def test_priority_classes(cluster: Cluster) -> None:
    """The system classes exist; a pod's priorityClassName resolves to its priority; an unknown
    class is refused with 403 by the Priority admission plugin
    (plugin/pkg/admission/priority/admission.go: admission.NewForbidden "no PriorityClass with
    name %v was found"; https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/)."""
    ns = cluster.namespace
    sched = kubernetes.client.SchedulingV1Api(cluster.client)
    names = {p.metadata.name: p.value for p in sched.list_priority_class().items}
    assert names["system-node-critical"] == 2_000_001_000
    assert names["system-cluster-critical"] == 2_000_000_000
    pc_name = f"{ns}-high"
    sched.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                 "metadata": {"name": pc_name}, "value": 1000})
    try:
        pod = cluster.core.create_namespaced_pod(ns, pod_manifest("high", priorityClassName=pc_name))
        assert (pod.spec.priority, pod.spec.preemption_policy) == (1000, "PreemptLowerPriority")
        with pytest.raises(ApiException) as info:
            cluster.core.create_namespaced_pod(ns, pod_manifest("nope", priorityClassName="no-such-class"))
        status, reason, message = error(info)
        assert (status, reason) == (403, "Forbidden")
        assert "no PriorityClass with name no-such-class was found" in message
        with pytest.raises(ApiException) as info:
            sched.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                         "metadata": {"name": f"{ns}-too-high"}, "value": 2_000_000_000})
        assert error(info)[0] in (403, 422)  # above the user maximum (validation or admission)
    finally:
        sched.delete_priority_class(pc_name)


def test_immutable_fields_are_422(cluster: Cluster) -> None:
    """A Deployment's spec.selector (apps/v1 ValidateDeploymentUpdate); a pod's spec beyond
    images, activeDeadlineSeconds, added tolerations and terminationGracePeriodSeconds
    (ValidatePodUpdate: nodeSelector, container resources without the resize subresource,
    removed tolerations)."""
    ns = cluster.namespace
    cluster.apps.create_namespaced_deployment(ns, deployment_manifest("web"))
    with pytest.raises(ApiException) as info:
        cluster.apps.patch_namespaced_deployment("web", ns, {"spec": {
            "selector": {"matchLabels": {"app": "web", "x": "y"}},
            "template": {"metadata": {"labels": {"app": "web", "x": "y"}}}}})
    assert error(info)[:2] == (422, "Invalid") and "spec.selector" in error(info)[2]
    pod = pod_manifest("fixed", tolerations=[{"key": "a", "operator": "Exists", "effect": "NoSchedule"}])
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    cluster.core.create_namespaced_pod(ns, pod)
    for change in (
        {"spec": {"nodeSelector": {"zone": "a"}}},
        {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "200m"}}}]}},
        {"spec": {"$setElementOrder/tolerations": [], "tolerations": []}},
    ):
        with pytest.raises(ApiException) as info:
            cluster.core.patch_namespaced_pod("fixed", ns, change)
        assert error(info)[:2] == (422, "Invalid"), change
    # what may change: the image, and added tolerations
    image = {"spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]}}
    cluster.core.patch_namespaced_pod("fixed", ns, image)
    added = cluster.core.read_namespaced_pod("fixed", ns)
    added.spec.tolerations.append(kubernetes.client.V1Toleration(key="b", operator="Exists", effect="NoSchedule"))
    cluster.core.replace_namespaced_pod("fixed", ns, added)


def test_no_finalizer_can_be_added_while_deleting(cluster: Cluster) -> None:
    """apimachinery ValidateObjectMetaUpdate: "no new finalizers can be added if the object is
    being deleted" (https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/)."""
    ns = cluster.namespace
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "held", "finalizers": ["example.com/a"]}})
    cluster.core.delete_namespaced_config_map("held", ns)
    with pytest.raises(ApiException) as info:
        more = {"metadata": {"finalizers": ["example.com/a", "example.com/b"]}}
        cluster.core.patch_namespaced_config_map("held", ns, more)
    assert error(info)[:2] == (422, "Invalid") and "finalizers" in error(info)[2]
    cluster.core.patch_namespaced_config_map("held", ns, [{"op": "remove", "path": "/metadata/finalizers"}])


def test_an_eviction_a_budget_refuses_is_429_without_retry_after(cluster: Cluster) -> None:
    """pkg/registry/core/pod/storage/eviction.go answers NewTooManyRequests(..., 0): no
    retryAfterSeconds, so no Retry-After header (unlike API Priority and Fairness throttling)
    (https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/#how-api-initiated-eviction-works)."""
    ns = cluster.namespace
    cluster.core.create_namespaced_pod(ns, pod_manifest("guarded", labels={"app": "guarded"}))
    if cluster.sim is not None:  # no kubelet in the contract suite's simulated cluster: play it

        def run(pod: dict[str, Any]) -> None:
            pod["spec"]["nodeName"] = "node-1"
            pod["status"].update(phase="Running", conditions=[{"type": "Ready", "status": "True"}])

        cluster.sim.store.mutate("pods", "guarded", ns, run)
    eventually(lambda: cluster.core.read_namespaced_pod("guarded", ns).status.phase == "Running", 120)
    cluster.policy.create_namespaced_pod_disruption_budget(ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "all"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}})
    if cluster.sim is not None:  # no disruption controller either: observe the budget as it would
        # (unobserved, eviction.go answers 429 with a retry after 10 s instead)
        cluster.sim.store.mutate("poddisruptionbudgets", "all", ns, lambda b: b.update(status={
            "observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
            "expectedPods": 1}))
    else:
        eventually(lambda: (cluster.policy.read_namespaced_pod_disruption_budget("all", ns).status
                            .observed_generation or 0) >= 1, 60)
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "guarded", "namespace": ns}}
    with pytest.raises(ApiException) as info:
        cluster.core.create_namespaced_pod_eviction("guarded", ns, body)
    status, reason, message = error(info)
    assert (status, reason) == (429, "TooManyRequests")
    assert "disruption budget" in message
    assert "Retry-After" not in (info.value.headers or {})
    assert "retryAfterSeconds" not in json.loads(info.value.body).get("details", {})


@pytest.mark.parametrize(("change", "field"), [
    ({"sideEffects": None}, "sideEffects"),
    ({"sideEffects": "Some"}, "sideEffects"),
    ({"clientConfig": {"url": "http://127.0.0.1:1/mutate"}}, "clientConfig.url"),
    ({"clientConfig": {"url": "https://127.0.0.1:1/mutate?x=1"}}, "clientConfig.url"),
    ({"matchConditions": [{"name": "broken", "expression": "object.metadata.(("}]}, "matchConditions[0].expression"),
    ({"timeoutSeconds": 31}, "timeoutSeconds"),
    ({"name": "short"}, "name"),
    ({"admissionReviewVersions": []}, "admissionReviewVersions"),
])
def test_webhook_configurations_are_validated(cluster: Cluster, change: dict[str, Any], field: str) -> None:
    """pkg/apis/admissionregistration/validation (admissionregistration.k8s.io/v1): 422 for a
    configuration kube-apiserver would not store
    (https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/)."""
    hook = {"name": "pods.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": "https://127.0.0.1:1/mutate"}, "failurePolicy": "Ignore",
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": cluster.namespace}}}
    api = kubernetes.client.AdmissionregistrationV1Api(cluster.client)
    body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": f"{cluster.namespace}-hook"},
            "webhooks": [{k: v for k, v in {**hook, **change}.items() if v is not None}]}
    with pytest.raises(ApiException) as info:
        api.create_mutating_webhook_configuration(body)
    status, reason, message = error(info)
    assert (status, reason) == (422, "Invalid") and f"webhooks[0].{field}" in message


def test_resource_version_match(cluster: Cluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-get-and-list:
    Exact lists the collection as it was; NotOlderThan at least that fresh; misuse is 400."""
    ns = cluster.namespace
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "a"}, "data": {"v": "1"}})
    then = cluster.core.list_namespaced_config_map(ns).metadata.resource_version
    cluster.core.patch_namespaced_config_map("a", ns, {"data": {"v": "2"}})
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "b"}})
    past = cluster.core.list_namespaced_config_map(ns, resource_version=then, resource_version_match="Exact")
    assert past.metadata.resource_version == then
    assert {c.metadata.name: (c.data or {}).get("v") for c in past.items if c.metadata.name in "ab"} == {"a": "1"}
    fresh = cluster.core.list_namespaced_config_map(ns, resource_version=then, resource_version_match="NotOlderThan")
    assert {c.metadata.name for c in fresh.items} >= {"a", "b"}
    for kwargs in ({"resource_version_match": "Exact"},
                   {"resource_version": "0", "resource_version_match": "Exact"},
                   {"resource_version": then, "resource_version_match": "Sometimes"}):
        with pytest.raises(ApiException) as info:
            cluster.core.list_namespaced_config_map(ns, **kwargs)
        assert info.value.status == 400, kwargs


def test_foreground_deletion_waits_for_dependents(cluster: Cluster) -> None:
    """Foreground cascading deletion: the owner gets deletionTimestamp and the
    foregroundDeletion finalizer and stays while a dependent (blockOwnerDeletion) exists
    (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#foreground-deletion)."""
    ns = cluster.namespace
    owner = cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    cluster.core.create_namespaced_config_map(ns, {"metadata": {
        "name": "dependent", "finalizers": ["example.com/hold"], "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid,
            "blockOwnerDeletion": True}]}})
    cluster.core.delete_namespaced_config_map("owner", ns, propagation_policy="Foreground")
    held = eventually(lambda: (o := cluster.core.read_namespaced_config_map("owner", ns)).metadata.finalizers and o)
    assert held.metadata.deletion_timestamp and "foregroundDeletion" in held.metadata.finalizers
    eventually(lambda: cluster.core.read_namespaced_config_map("dependent", ns).metadata.deletion_timestamp)
    cluster.core.patch_namespaced_config_map("dependent", ns, [{"op": "remove", "path": "/metadata/finalizers"}])

    def owner_gone() -> bool:
        try:
            cluster.core.read_namespaced_config_map("owner", ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    eventually(owner_gone)
