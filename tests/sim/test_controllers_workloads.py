"""Deployment, ReplicaSet and StatefulSet controllers against the simulated
cluster, driven with the official kubernetes client. Each test cites the
Kubernetes documentation or source it follows."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from spotguard_sim import pods as pod_util
from spotguard_sim import testing, tls
from spotguard_sim.controllers import deployment as deployment_ctl
from spotguard_sim.controllers import replicaset as replicaset_ctl

from tests.sim import controller_helpers as h

SCALE = 50.0


@pytest.fixture
def sim() -> Iterator[Any]:
    with testing.running_cluster(time_scale=SCALE, ready_delay_seconds=1.0,
                                 termination_seconds=1.0) as cluster:
        for i in range(3):
            cluster.store.create("nodes", h.node(f"n{i}", zone="abc"[i]))
        yield cluster


def apps(sim: Any) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(sim.api_client())


def core(sim: Any) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(sim.api_client())


def owned_replicasets(sim: Any, name: str) -> list[dict[str, Any]]:
    items, _ = sim.store.list("replicasets", namespace="default")
    return [rs for rs in items if any(r.get("name") == name for r in rs["metadata"].get("ownerReferences") or [])]


# https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#pod-template-hash-label
def test_deployment_creates_a_replicaset_named_by_template_hash(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment("web", 3))
    rs = h.wait_for(lambda: owned_replicasets(sim, "web"), what="replicaset")[0]
    pod_hash = rs["metadata"]["labels"]["pod-template-hash"]
    template = h.deployment("web", 3)["spec"]["template"]
    stored = sim.store.get("deployments", "web", "default")["spec"]["template"]
    assert pod_hash == deployment_ctl.template_hash(stored)
    assert template["metadata"]["labels"]["app"] == "web"
    assert rs["metadata"]["name"] == f"web-{pod_hash}"
    ref = rs["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("Deployment", "web", True)
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", "pod-template-hash": pod_hash}
    h.wait_for(lambda: (api.read_namespaced_deployment("web", "default").status.ready_replicas or 0) == 3,
               what="3 ready")
    d = api.read_namespaced_deployment("web", "default")
    assert (d.status.replicas, d.status.updated_replicas, d.status.available_replicas) == (3, 3, 3)
    assert d.status.observed_generation == d.metadata.generation
    conds = {c.type: c for c in d.status.conditions}
    assert conds["Available"].status == "True"
    assert conds["Available"].reason == "MinimumReplicasAvailable"
    assert d.metadata.annotations["deployment.kubernetes.io/revision"] == "1"
    for p in core(sim).list_namespaced_pod("default", label_selector="app=web").items:
        assert p.metadata.labels["pod-template-hash"] == pod_hash
        assert p.metadata.owner_references[0].name == rs["metadata"]["name"]
        assert p.metadata.name.startswith(f"web-{pod_hash}-")


# https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#scaling-a-deployment
def test_scaling_a_deployment(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment("web", 2))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 2, what="2 ready")
    api.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 5}})
    h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 5, what="5 ready")
    api.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 1}})
    h.wait_for(lambda: len(h.pods_of(sim.store, "web")) == 1, what="scaled down to 1")
    assert len(owned_replicasets(sim, "web")) == 1


# https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#max-surge and #max-unavailable
def test_rolling_update_respects_max_surge_and_max_unavailable(sim: Any) -> None:
    api = apps(sim)
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    api.create_namespaced_deployment("default", h.deployment("web", 4, strategy=strategy))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 4, what="4 ready")
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource in ("pods", "replicasets"):
            # maxSurge bounds the ReplicaSets' replicas (upstream's NewRSNewReplicas sums
            # spec.replicas), not the pods: an old pod the ReplicaSet controller has yet to
            # delete can briefly stand beside the new one, as on a real cluster.
            wanted = sum(int(rs["spec"].get("replicas") or 0) for rs in owned_replicasets(sim, "web"))
            items, _ = sim.store.list("pods", namespace="default", label_selector="app=web")
            live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
            with lock:
                seen.append((wanted, sum(1 for p in live if h.is_ready(p))))

    sim.store.subscribe(watch)
    api.patch_namespaced_deployment("web", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "nginx:1.28"}]}}}})
    h.wait_for(lambda: len(owned_replicasets(sim, "web")) == 2, what="new replicaset")

    def done() -> bool:
        d = api.read_namespaced_deployment("web", "default")
        return (d.status.updated_replicas == 4 and d.status.available_replicas == 4
                and d.status.replicas == 4)

    h.wait_for(done, timeout=20, what="rollout complete")
    sim.store.unsubscribe(watch)
    assert max(total for total, _ in seen) <= 5  # replicas + maxSurge, over the ReplicaSets
    assert min(ready for _, ready in seen) >= 4 - 1  # a pod being replaced may be counted gone
    rses = {rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]: rs
            for rs in owned_replicasets(sim, "web")}
    assert rses["1"]["spec"]["replicas"] == 0
    assert rses["2"]["spec"]["replicas"] == 4
    d = api.read_namespaced_deployment("web", "default")
    assert d.metadata.annotations["deployment.kubernetes.io/revision"] == "2"


def test_default_surge_and_unavailable_are_25_percent() -> None:
    # https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#rolling-update-deployment
    d = {"spec": {"replicas": 10, "strategy": {"type": "RollingUpdate", "rollingUpdate": {}}}}
    assert deployment_ctl.surge_and_unavailable(d) == (3, 2)  # surge rounds up, unavailable down
    d0 = {"spec": {"replicas": 4, "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}}}
    assert deployment_ctl.surge_and_unavailable(d0) == (0, 1)


# https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#recreate-deployment
def test_recreate_kills_old_pods_before_new_ones(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment("db", 2, strategy={"type": "Recreate"}))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "db")) == 2, what="2 ready")
    overlap: list[bool] = []

    def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "pods" and event_type == "ADDED":
            items, _ = sim.store.list("pods", namespace="default", label_selector="app=db")
            hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in items}
            overlap.append(len(hashes) > 1)

    sim.store.subscribe(watch)
    api.patch_namespaced_deployment("db", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "postgres:17"}]}}}})
    h.wait_for(lambda: api.read_namespaced_deployment("db", "default").status.updated_replicas == 2
               and len(h.ready_pods(sim.store, "db")) == 2, timeout=20, what="recreated")
    sim.store.unsubscribe(watch)
    assert overlap and not any(overlap)


class _Hook(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    inflight = 0
    peak = 0
    users: set[str] = set()
    lock = threading.Lock()

    def do_POST(self) -> None:
        review = testing.read_review(self)
        cls = type(self)
        with cls.lock:
            cls.inflight += 1
            cls.peak = max(cls.peak, cls.inflight)
            cls.users.add(review["request"]["userInfo"]["username"])
        time.sleep(0.05)
        with cls.lock:
            cls.inflight -= 1
        testing.answer_review(self, {"uid": review["request"]["uid"], "allowed": True})

    def log_message(self, *args: Any) -> None:
        pass


# pkg/controller/replicaset/replica_set.go manageReplicas + controller_utils.go slowStartBatch;
# https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/
def test_replicaset_creates_pods_concurrently_through_the_webhook(sim: Any) -> None:
    server, url, ca_bundle = tls.serve_https(_Hook)
    try:
        sim.store.create("mutatingwebhookconfigurations", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "probe"},
            "webhooks": [{"name": "probe.spotguard.io", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": "Fail",
                          "clientConfig": {"url": url + "/", "caBundle": ca_bundle},
                          "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                                     "apiVersions": ["v1"], "resources": ["pods"]}]}]})
        apps(sim).create_namespaced_replica_set("default", h.replicaset("burst", 16))
        h.wait_for(lambda: len(h.pods_of(sim.store, "burst")) == 16, timeout=20, what="16 pods")
    finally:
        server.shutdown()
    assert _Hook.users == {"system:serviceaccount:kube-system:replicaset-controller"}
    assert _Hook.peak >= 4  # batches of 1, 2, 4, 8 run concurrently


def test_slow_start_batches() -> None:
    from concurrent import futures

    calls: list[int] = []
    lock = threading.Lock()

    def ok() -> None:
        with lock:
            calls.append(1)

    with futures.ThreadPoolExecutor(8) as pool:
        assert replicaset_ctl.slow_start_batch(10, 1, ok, pool) == (10, [])
        count = 0

        def fail_after_three() -> None:
            nonlocal count
            with lock:
                count += 1
                n = count
            if n > 3:
                raise RuntimeError("quota")

        done, errs = replicaset_ctl.slow_start_batch(20, 1, fail_after_three, pool)
    # batches 1, 2 succeed (3 pods), the batch of 4 fails entirely, then it stops
    assert done == 3 and len(errs) == 4 and count == 7


def _pod(name: str, *, node: str | None = "n1", phase: str = "Running", ready: bool = True,
         cost: int | None = None, ready_at: str = "2026-01-01T00:00:00Z",
         created: str = "2026-01-01T00:00:00Z", restarts: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": name, "creationTimestamp": created}
    if cost is not None:
        meta["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": str(cost)}
    return {"metadata": meta, "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "containerStatuses": [{"restartCount": restarts}],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       "lastTransitionTime": ready_at}]}}


# pkg/controller/controller_utils.go ActivePodsWithRanks.Less;
# https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#scaling-a-replicaset
def test_scale_down_victim_order() -> None:
    now = 1_800_000_000.0
    pods = [
        _pod("ready-old", created="2026-01-01T00:00:00Z"),
        _pod("unassigned", node=None, phase="Pending", ready=False),
        _pod("pending", phase="Pending", ready=False),
        _pod("unknown", phase="Unknown", ready=False),
        _pod("not-ready", ready=False),
        _pod("cheap", cost=-10),
        _pod("expensive", cost=100),
        _pod("doubled", node="n2"),
        _pod("restarts", restarts=5),
    ]
    ranks = [2 if p["metadata"]["name"] == "doubled" else 1 for p in pods]
    order = [p["metadata"]["name"] for p in pod_util.deletion_order(pods, ranks, now)]
    assert order[:6] == ["unassigned", "pending", "unknown", "not-ready", "cheap", "doubled"]
    assert order[6] == "restarts"
    assert order[-1] == "expensive"
    # more recently ready goes first (log-scale buckets of ready time)
    recent = _pod("recent", ready_at="2027-01-15T07:00:00Z")
    long_ago = _pod("long", ready_at="2020-01-01T00:00:00Z")
    assert [p["metadata"]["name"] for p in pod_util.deletion_order([long_ago, recent], [0, 0], now)] == [
        "recent", "long"]


def test_replicaset_scale_down_removes_the_unscheduled_pod_first() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("n1", pods="2"))
        api = apps(sim)
        api.create_namespaced_replica_set("default", h.replicaset("web", 3))
        h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 2
                   and len(h.pods_of(sim.store, "web")) == 3, what="2 ready + 1 pending")
        victim = next(p for p in h.pods_of(sim.store, "web") if not p["spec"].get("nodeName"))
        keep = {p["metadata"]["name"] for p in h.ready_pods(sim.store, "web")}
        # a deletion cost makes one running pod the next victim
        cheap = sorted(keep)[0]
        core(sim).patch_namespaced_pod(cheap, "default", {"metadata": {"annotations": {
            "controller.kubernetes.io/pod-deletion-cost": "-5"}}})
        api.patch_namespaced_replica_set_scale("web", "default", {"spec": {"replicas": 2}})
        h.wait_for(lambda: victim["metadata"]["name"] not in
                   {p["metadata"]["name"] for p in h.pods_of(sim.store, "web")}, what="victim gone")
        assert {p["metadata"]["name"] for p in h.pods_of(sim.store, "web")} == keep
        api.patch_namespaced_replica_set_scale("web", "default", {"spec": {"replicas": 1}})
        h.wait_for(lambda: cheap not in {p["metadata"]["name"] for p in h.pods_of(sim.store, "web")},
                   what="cheap pod deleted")
        rs = api.read_namespaced_replica_set("web", "default")
        h.wait_for(lambda: api.read_namespaced_replica_set("web", "default").status.replicas == 1,
                   what="status")
        assert rs.status.observed_generation == rs.metadata.generation


# https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#deployment-and-scaling-guarantees
def test_statefulset_ordered_ready(sim: Any) -> None:
    created: list[tuple[str, bool]] = []

    def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "pods" and event_type == "ADDED" and obj["metadata"]["name"].startswith("db-"):
            items = h.ready_pods(sim.store, "db")
            created.append((obj["metadata"]["name"], len(items)))  # type: ignore[arg-type]

    sim.store.subscribe(watch)
    api = apps(sim)
    api.create_namespaced_stateful_set("default", h.statefulset("db", 3))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "db")) == 3, timeout=15, what="3 ready")
    sim.store.unsubscribe(watch)
    # each pod is created only once its predecessors are Running and Ready
    assert created == [("db-0", 0), ("db-1", 1), ("db-2", 2)]
    p = sim.store.get("pods", "db-1", "default")
    assert p["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "db-1"
    assert p["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"
    assert p["spec"]["hostname"] == "db-1" and p["spec"]["subdomain"] == "db"
    # a deleted pod comes back with the same name
    uid = sim.store.get("pods", "db-0", "default")["metadata"]["uid"]
    core(sim).delete_namespaced_pod("db-0", "default")
    h.wait_for(lambda: any(x["metadata"]["name"] == "db-0" and x["metadata"]["uid"] != uid
                           for x in h.ready_pods(sim.store, "db")), timeout=15, what="db-0 back")
    # scale down from the highest ordinal, one at a time
    gone: list[str] = []

    def watch_delete(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "pods" and event_type == "DELETED":
            gone.append(obj["metadata"]["name"])

    sim.store.subscribe(watch_delete)
    api.patch_namespaced_stateful_set_scale("db", "default", {"spec": {"replicas": 1}})
    h.wait_for(lambda: len(h.pods_of(sim.store, "db")) == 1, timeout=15, what="scaled down")
    sim.store.unsubscribe(watch_delete)
    assert gone == ["db-2", "db-1"]
    sts = api.read_namespaced_stateful_set("db", "default")
    h.wait_for(lambda: api.read_namespaced_stateful_set("db", "default").status.replicas == 1,
               what="status")
    assert sts.status.observed_generation == sts.metadata.generation


# https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#parallel-pod-management
def test_statefulset_parallel(sim: Any) -> None:
    created: list[int] = []

    def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "pods" and event_type == "ADDED" and obj["metadata"]["name"].startswith("cache-"):
            created.append(len(h.ready_pods(sim.store, "cache")))

    sim.store.subscribe(watch)
    apps(sim).create_namespaced_stateful_set("default", h.statefulset("cache", 3, policy="Parallel"))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "cache")) == 3, timeout=15, what="3 ready")
    sim.store.unsubscribe(watch)
    assert created == [0, 0, 0]  # all launched without waiting for readiness
    names = sorted(p["metadata"]["name"] for p in h.pods_of(sim.store, "cache"))
    assert names == ["cache-0", "cache-1", "cache-2"]


# https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#min-ready-seconds
def test_min_ready_seconds_delays_availability(sim: Any) -> None:
    body = h.deployment("slow", 2)
    body["spec"]["minReadySeconds"] = 30
    api = apps(sim)
    api.create_namespaced_deployment("default", body)
    h.wait_for(lambda: len(h.ready_pods(sim.store, "slow")) == 2, what="2 ready")
    ready_at = sim.clock.now()
    h.wait_for(lambda: api.read_namespaced_deployment("slow", "default").status.ready_replicas == 2,
               what="status shows 2 ready")
    d = api.read_namespaced_deployment("slow", "default")
    assert d.status.available_replicas in (None, 0)
    h.wait_for(lambda: api.read_namespaced_deployment("slow", "default").status.available_replicas == 2,
               timeout=10, what="available")
    assert sim.clock.now() - ready_at >= 25


# https://kubernetes.io/docs/concepts/architecture/garbage-collection/#foreground-deletion
def test_foreground_deletion_keeps_the_owner_until_its_dependents_are_gone(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment("fg", 2))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "fg")) == 2, what="2 ready pods")
    deletions = {r: sim.store.watch(r, "default", sim.store.resource_version)
                 for r in ("pods", "replicasets", "deployments")}
    api.delete_namespaced_deployment("fg", "default", propagation_policy="Foreground")

    def gone() -> bool:
        try:
            api.read_namespaced_deployment("fg", "default")
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    h.wait_for(gone, timeout=20, what="the deployment gone")
    assert not h.pods_of(sim.store, "fg") and not owned_replicasets(sim, "fg")
    last: dict[str, int] = {}
    marked: dict[str, bool] = {}
    for resource, watcher in deletions.items():
        while (event := watcher.get(timeout=0.2)) is not None:
            meta = event["object"]["metadata"]
            if event["type"] == "DELETED":
                last[resource] = int(meta["resourceVersion"])
            elif "foregroundDeletion" in (meta.get("finalizers") or []) and meta.get("deletionTimestamp"):
                marked[resource] = True
        watcher.close()
    assert marked == {"replicasets": True, "deployments": True}  # owners waited, marked
    assert last["pods"] < last["replicasets"] < last["deployments"]  # dependents first


# https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#rolling-updates
def test_statefulset_rolling_update_with_controller_revisions(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_stateful_set("default", h.statefulset("ss", 3))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "ss")) == 3, timeout=20, what="3 ready")
    h.wait_for(lambda: api.read_namespaced_stateful_set("ss", "default").status.current_revision,
               what="currentRevision")
    first = api.read_namespaced_stateful_set("ss", "default").status
    assert first.current_revision == first.update_revision
    api.patch_namespaced_stateful_set("ss", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "nginx:1.28"}]}}}})
    rolling = h.wait_for(lambda: (s := api.read_namespaced_stateful_set("ss", "default").status)
                         .update_revision != first.update_revision and s, what="a new update revision")
    assert rolling.current_revision == first.current_revision  # not complete yet
    order: list[str] = []

    def done() -> bool:
        for p in h.pods_of(sim.store, "ss"):
            if p["spec"]["containers"][0]["image"] == "nginx:1.28" and p["metadata"]["name"] not in order:
                order.append(p["metadata"]["name"])
        s = api.read_namespaced_stateful_set("ss", "default").status
        return s.current_revision == s.update_revision and s.updated_replicas == 3 and s.ready_replicas == 3

    h.wait_for(done, timeout=30, interval=0.01, what="the rolling update")
    assert order == ["ss-2", "ss-1", "ss-0"]  # highest ordinal first
    revs = kubernetes.client.AppsV1Api(sim.api_client()).list_namespaced_controller_revision("default").items
    assert sorted(r.revision for r in revs if r.metadata.name.startswith("ss-")) == [1, 2]
    labels = {p["metadata"]["labels"]["controller-revision-hash"] for p in h.pods_of(sim.store, "ss")}
    assert labels == {rolling.update_revision}


# https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#proportional-scaling
def test_scaling_during_a_rollout_is_proportional(sim: Any) -> None:
    """The documentation's example: 10 replicas, maxSurge 3, maxUnavailable 2, a rollout that
    cannot progress (old 8, new 5), scaled to 15: 3 more go to the old ReplicaSet, 2 to the new."""
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment(
        "prop", 10, strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}}))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "prop")) == 10, timeout=20, what="10 ready")
    api.patch_namespaced_deployment("prop", "default", {"spec": {"template": {"spec": {
        "nodeSelector": {"no-such-node": "true"}}}}})

    def sizes() -> list[int]:
        rses = sorted(owned_replicasets(sim, "prop"), key=lambda rs: rs["metadata"]["creationTimestamp"])
        return [rs["spec"]["replicas"] for rs in rses]

    h.wait_for(lambda: sizes() == [8, 5], timeout=20, what="old 8, new 5")
    api.patch_namespaced_deployment_scale("prop", "default", {"spec": {"replicas": 15}})
    h.wait_for(lambda: sizes() == [11, 7], timeout=20, what="old 11, new 7")


# https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#rolling-back-to-a-previous-revision
def test_rolling_back_reuses_the_old_replicaset_as_the_newest_revision(sim: Any) -> None:
    api = apps(sim)
    api.create_namespaced_deployment("default", h.deployment("undo", 2))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "undo")) == 2, what="2 ready")
    first = owned_replicasets(sim, "undo")[0]
    api.patch_namespaced_deployment("undo", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "nginx:1.28"}]}}}})
    h.wait_for(lambda: len(owned_replicasets(sim, "undo")) == 2, what="revision 2")
    # kubectl rollout undo: the Deployment's template becomes revision 1's again
    api.patch_namespaced_deployment("undo", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "nginx:1.27"}]}}}})

    def promoted() -> bool:
        rs = sim.store.get("replicasets", first["metadata"]["name"], "default")
        return rs["metadata"]["annotations"].get("deployment.kubernetes.io/revision") == "3"

    h.wait_for(promoted, what="revision 1 promoted to revision 3")
    rs = sim.store.get("replicasets", first["metadata"]["name"], "default")
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision-history"] == "1"
    assert len(owned_replicasets(sim, "undo")) == 2
    h.wait_for(lambda: sim.store.get("deployments", "undo", "default")["metadata"]["annotations"].get(
        "deployment.kubernetes.io/revision") == "3", what="the Deployment at revision 3")
