"""The eviction guard's HTTP surface: routing, answers, and failing open (no cluster needed)."""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from typing import Any

from spotguard.admission import core, evictions, transport
from spotguard.gateway import errors as api_errors
from spotguard.gateway import resources as r
from spotguard.policy import config, surgecopy
from spotguard.policy import evictions as policy
from spotguard.policy.notices import NODE_NOTICE, NodeNotice, NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.workloads import SURGE_OF, surge_copy_name

from tests.admission import cluster
from tests.admission.fakekube import FakeKube


def review(**request: Any) -> bytes:
    body = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "eviction",
        "name": "web-1",
        "namespace": "shop",
        "operation": "CREATE",
        "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1"}},
        "dryRun": False,
        **request,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}).encode()


def answer(path: str, body: bytes, ctx: core.Context) -> dict[str, Any]:
    status, _, raw = transport.handle("POST", path, body, ctx)
    assert status == 200, raw
    response: dict[str, Any] = json.loads(raw)["response"]
    return response


class Broken:
    """A cluster connection whose every call fails with a bug (not an API error)."""

    stats = None

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{name} failed")

        return fail


def test_every_path_answers_an_eviction_review_and_without_a_cluster_it_is_allowed() -> None:
    ctx = core.Context(config.Config(), None)
    for path in ("/evictions", "/mutate", "/"):
        response = answer(path, review(), ctx)
        assert response["allowed"] is True
        assert response["auditAnnotations"] == {"spotguard.io/eviction": "no-cluster-connection"}


def test_an_internal_error_allows_the_eviction() -> None:
    ctx = core.Context(config.Config(), Broken())
    response = answer("/evictions", review(), ctx)
    assert response["allowed"] is True
    assert response["auditAnnotations"]["spotguard.io/eviction"].startswith("failed-open")


class Unwell:
    """A cluster connection whose every call fails as an unwell API server's do (500s)."""

    stats = None

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise api_errors.Transient(500, "InternalError", "etcdserver: leader changed")

        return fail


def test_an_unwell_api_server_gets_a_retry_for_the_error_hold_then_the_eviction() -> None:
    ctx = core.Context(config.Config(), Unwell(), review_seconds=0.2)
    now = [1000.0]
    evictions.configure(ctx, evictions.Guard(clock=lambda: now[0], timing=policy.Timing(error_hold=20.0)))
    first = answer("/evictions", review(), ctx)
    assert first["allowed"] is False
    assert first["status"]["code"] == 429 and first["status"]["details"] == {"retryAfterSeconds": 1}
    assert "could not check this eviction" in first["status"]["message"]
    assert first["auditAnnotations"]["spotguard.io/eviction"] == "api-error"
    now[0] += 19.0
    assert answer("/evictions", review(), ctx)["allowed"] is False
    # another pod's failures are counted from its own first one
    assert answer("/evictions", review(name="web-2"), ctx)["allowed"] is False
    now[0] += 1.0
    released = answer("/evictions", review(), ctx)
    assert released["allowed"] is True
    assert released["auditAnnotations"]["spotguard.io/eviction"] == "failed-open"


def test_a_failure_of_a_drain_long_over_does_not_start_the_error_hold_of_a_new_one() -> None:
    """A review failed during a drain that was aborted; a minute and a half later a new drain's
    review of the same pod fails too. Its failures in a row begin now: it gets the error
    hold's retries, not the eviction at once (chaos aborted-drain under timeouts: api 3 -> 2,
    failed-open 95 s after the aborted drain's failure)."""
    ctx = core.Context(config.Config(), Unwell(), review_seconds=0.2)
    now = [1000.0]
    evictions.configure(ctx, evictions.Guard(clock=lambda: now[0], timing=policy.Timing(error_hold=20.0)))
    assert answer("/evictions", review(), ctx)["auditAnnotations"]["spotguard.io/eviction"] == "api-error"
    now[0] += 95.0
    again = answer("/evictions", review(), ctx)
    assert again["allowed"] is False and again["auditAnnotations"]["spotguard.io/eviction"] == "api-error", again
    for _ in range(4):  # the new drain's retries, 5 s apart: failures in a row
        now[0] += 5.0
        last = answer("/evictions", review(), ctx)
    assert last["auditAnnotations"]["spotguard.io/eviction"] == "failed-open"


def test_not_an_eviction_is_not_judged_by_the_guard() -> None:
    ctx = core.Context(config.Config(), None)
    response = answer("/evictions", review(subResource="status", operation="UPDATE"), ctx)
    assert response["allowed"] is True and "status" not in response


def test_a_denial_is_a_429_with_a_retry_hint() -> None:
    decision = policy.Decision(False, "protected", "spotguard: wait. Retry after 5s", 5)
    response = evictions.build_response("u1", decision)["response"]
    assert response["allowed"] is False
    assert response["status"] == {"code": 429, "reason": "TooManyRequests", "message": decision.message,
                                  "details": {"retryAfterSeconds": 5}}


def test_settings_from_the_environment() -> None:
    timing = evictions.timing_from_env({"SPOTGUARD_EVICTION_GRACE_SECONDS": "3",
                                        "SPOTGUARD_EVICTION_RELEASE_SECONDS": "-1",
                                        "SPOTGUARD_EVICTION_ERROR_HOLD_SECONDS": "45"})
    assert timing.grace == 3.0 and timing.release == policy.Timing().release and timing.error_hold == 45.0


def test_a_node_list_from_before_the_cordons_is_never_shared_with_a_later_eviction() -> None:
    """A drainer cordons spot-0 and spot-1 and evicts their pods. web wants 2 serving and
    has one pod on each spot node and one on on-demand. A node list read just before the
    cordons (for another review, within the sharing window) shows each review the other
    spot node as staying: shared, it let both pods go (each review counted the other's pod)
    and web fell to 1. The guard shares only a list that started after the review arrived."""
    k = FakeKube()
    cluster.basic_cluster(k, on_demand_nodes=1, spot_nodes=2)
    _, rs = cluster.deployment(k, "web", 2)
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    for name, node in (("web-a", "spot-0"), ("web-b", "spot-1"), ("web-c", "od-0")):
        pod = cluster.pod_for(rs, name=name)
        pod["spec"]["nodeName"] = node
        pod["status"] = ready
        k.put(r.PODS, pod)
    ctx = core.Context(config.Config(), k)
    evictions.configure(ctx, evictions.Guard(clock=lambda: 1000.0))
    # a review that reads the node list while nothing is cordoned yet
    assert answer("/evictions", review(name="web-c"), ctx)["auditAnnotations"]["spotguard.io/eviction"] == "node-stays"
    for node in ("spot-0", "spot-1"):
        obj = k.get(r.NODES, node)
        obj.setdefault("spec", {})["unschedulable"] = True
        k.put(r.NODES, obj)
    first = answer("/evictions", review(name="web-a"), ctx)
    second = answer("/evictions", review(name="web-b"), ctx)
    # only web-c serves on a node that stays: both are protected (the grace), neither goes
    assert (first["allowed"], second["allowed"]) == (False, False), (first, second)
    assert first["auditAnnotations"]["spotguard.io/eviction"] == "protected"


def test_a_sighting_restarts_with_a_new_drain_signal_and_ends_when_the_node_stops_going_away() -> None:
    """The grace counts from the first sighting of a node's drain signals, on this process's clock."""
    from spotguard.admission import sightings
    from spotguard.policy.notices import NodeNotice, NoticeKind

    seen = sightings.Sightings(clock=lambda: 0.0)
    cordoned = policy.NodeFacts("spot-0", spot=True, unschedulable=True)
    assert seen.observe(cordoned, 100.0) == 100.0
    assert seen.observe(cordoned, 105.0) == 100.0  # the same drain
    # a drainer's taint besides the cordon: a new drain
    tainted = policy.NodeFacts("spot-0", spot=True, unschedulable=True,
                               taint_keys=frozenset({"aws-node-termination-handler/spot-itn"}))
    assert seen.observe(tainted, 110.0) == 110.0
    assert seen.observe(cordoned, 111.0) == 110.0  # one signal gone: still that drain
    # a read that began before the sighting says nothing about it
    assert seen.observe(policy.NodeFacts("spot-0", spot=True), 112.0, read_at=109.0) == 110.0
    # uncordoned (the drain aborted), then cordoned again: a new sighting
    assert seen.observe(policy.NodeFacts("spot-0", spot=True), 120.0) is None
    assert seen.observe(cordoned, 140.0) == 140.0
    # spotguard's own mark is no drain signal: a rebalance-marked node drained later is a new drain
    mark = NodeNotice("rbl-1", NoticeKind.REBALANCE, 0.0, 600.0)
    marked = policy.NodeFacts("spot-1", spot=True, taint_keys=frozenset({"spotguard.io/interruption"}), notice=mark)
    assert seen.observe(marked, 10.0) is None
    assert seen.observe(dataclasses.replace(marked, unschedulable=True), 130.0) == 130.0
    # the list and the reader never start a sighting, and end an old one
    seen.observe_all([policy.NodeFacts("spot-2", spot=True, unschedulable=True)], read_at=150.0)
    assert "spot-2" not in seen.held()
    seen.observe_all([], read_at=150.0)  # spot-0 and spot-1 are gone
    assert seen.held() == []


def test_the_reader_ends_a_sighting_when_the_node_is_uncordoned_between_two_reviews() -> None:
    """A drain aborted while no review comes: the sighted node's reads see it."""
    import time

    from spotguard.admission import sightings

    node = {"metadata": {"name": "spot-0", "labels": {"node.kubernetes.io/capacity": "spot"}},
            "spec": {"unschedulable": True}}
    seen = sightings.Sightings(clock=time.monotonic, refresh=0.01)
    assert seen.observe(evictions.node_facts(node, config.Config())) is not None
    seen.watch(lambda name: node, lambda raw: evictions.node_facts(raw, config.Config()))
    node = {**node, "spec": {}}  # uncordoned
    deadline = time.monotonic() + 5
    while seen.held() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen.held() == []


def web_on(k: FakeKube, *nodes: str) -> None:
    """Deployment web with one Ready replica on each of ``nodes`` (web-1, web-2, ...)."""
    _, rs = cluster.deployment(k, "web", len(nodes))
    for i, node in enumerate(nodes, 1):
        pod = cluster.pod_for(rs, name=f"web-{i}")
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        k.put(r.PODS, pod)


class PodListsFail(FakeKube):
    """An API server that answers 500 to every list of pods (the workload's reads), as under
    the chaos suite's 20 % 500s, where a review's several reads fail together often."""

    def list(self, res: r.Resource, *args: Any, **kwargs: Any) -> list[Any]:
        if res.plural == "pods":
            self.stats.record("list", res.name, 500)
            raise api_errors.Transient(500, "InternalError", "injected fault: list pods answered 500")
        return super().list(res, *args, **kwargs)


def test_a_pod_on_an_on_demand_node_an_autoscaler_drains_is_not_let_go_when_its_workload_cannot_be_read() -> None:
    """Karpenter consolidates a launched on-demand node: its drain taint is there before
    spotguard's drain notice. The guard held web's pods there, but a review whose workload
    reads failed answered "not-spot" (an on-demand node without a notice is never guarded)
    and let one go (consolidation-after-reclaim under 20 % 500s: worker 8 -> 7). It asks for
    a retry now, as for a spot node going away."""
    k = PodListsFail()
    cluster.basic_cluster(k, on_demand_nodes=2, spot_nodes=0)
    node = k.get(r.NODES, "od-1")
    node.setdefault("spec", {})["taints"] = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
    k.put(r.NODES, node)
    web_on(k, "od-1", "od-0")
    ctx = core.Context(config.Config(), k, review_seconds=0.2)
    evictions.configure(ctx, evictions.Guard(clock=lambda: 1000.0))
    response = answer("/evictions", review(name="web-1"), ctx)
    assert response["allowed"] is False, response
    assert response["auditAnnotations"]["spotguard.io/eviction"] == "api-error"


class MarkedWhileReading(FakeKube):
    """spotguard writes its notice on spot-0 while an eviction review's reads of the workload
    are slow: the review's read of the node comes first, then (its clock read) the pods list
    waits while the mark is written and the grace runs out."""

    def __init__(self, clock: list[float], mark: dict[str, Any]) -> None:
        super().__init__()
        self.now, self.mark = clock, mark
        self.reader: int | None = None
        self.read = threading.Event()

    def clock(self) -> float:
        if self.reader == threading.get_ident():
            self.read.set()  # the node read and its time taken
        return self.now[0]

    def get(self, res: r.Resource, name: str, namespace: str | None = None) -> Any:
        if res.plural == "nodes" and name == "spot-0" and self.reader is None:
            self.reader = threading.get_ident()
        return super().get(res, name, namespace)

    def list(self, res: r.Resource, *args: Any, **kwargs: Any) -> list[Any]:
        if res.plural == "pods" and self.read.wait(10) and self.now[0] < 1010.0:
            node = self.get(r.NODES, "spot-0")
            node["metadata"].setdefault("annotations", {})[NODE_NOTICE] = json.dumps(self.mark)
            self.put(r.NODES, node)
            self.now[0] = 1010.0  # the grace (8 s from the sighting at 1000) ran out meanwhile
        return super().list(res, *args, **kwargs)


def test_a_review_held_by_slow_reads_does_not_take_its_old_read_of_the_node_for_no_notice() -> None:
    """A drainer ahead of spotguard evicts web's pod on spot-0 (cordoned, no notice yet). The
    review reads the node, then waits on the workload's reads (hung requests); meanwhile
    spotguard marks the node and the grace for a node without notice runs out. Deciding on
    its old read of the node, the review answered "no-notice" and let the pod go (chaos
    aborted-drain under timeouts: read at the drain's start, marked at +8.5 s, let go at
    +12.6 s). The
    lack of a notice is known as of the node's read: asked again, the drainer's next review
    reads the mark."""
    now = [1000.0]
    mark = NodeNotice("itn-1", NoticeKind.INTERRUPTION, 1000.0, 1120.0)
    k = MarkedWhileReading(now, json.loads(mark.to_json()))
    cluster.basic_cluster(k, on_demand_nodes=1, spot_nodes=1)
    spot = k.get(r.NODES, "spot-0")
    spot.setdefault("spec", {})["unschedulable"] = True
    k.put(r.NODES, spot)
    web_on(k, "spot-0", "od-0")
    ctx = core.Context(config.Config(), k)
    evictions.configure(ctx, evictions.Guard(clock=k.clock, timing=policy.Timing(grace=8)))
    first = answer("/evictions", review(name="web-1"), ctx)
    assert first["allowed"] is False, first
    assert first["auditAnnotations"]["spotguard.io/eviction"] == "protected"
    again = answer("/evictions", review(name="web-1"), ctx)
    assert again["allowed"] is False and "is reclaimed at" in again["status"]["message"], again


# --- the surge copy: its pods are the Deployment's, its record is the surge's -------------


def surge_copy(
    k: FakeKube, deployment: str, *, namespace: str = "shop", record: SurgeRecord | None = None
) -> dict[str, Any]:
    """spotguard's surge copy of ``deployment`` (no owner reference, as ``surgecopy.build``
    makes it), carrying ``record`` where given."""
    meta: dict[str, Any] = {"name": surge_copy_name(deployment), "namespace": namespace,
                            "labels": surgecopy.copy_labels(deployment)}
    if record is not None:
        meta["annotations"] = {surgecopy.RECORD: record.to_json()}
    return k.put(r.REPLICASETS, {"metadata": meta, "spec": {"replicas": 1, "selector": {"matchLabels": {
        "app": deployment, SURGE_OF: deployment}}}})


def serving(k: FakeKube, owner: dict[str, Any], name: str, node: str, labels: dict[str, str]) -> None:
    pod = cluster.pod_for(owner, name=name)
    pod["metadata"]["labels"] = labels
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    k.put(r.PODS, pod)


def noticed(k: FakeKube, node: str, mark: NodeNotice | None = None) -> None:
    """``node`` cordoned, with spotguard's notice on it where ``mark`` is given."""
    obj = k.get(r.NODES, node)
    obj.setdefault("spec", {})["unschedulable"] = True
    if mark is not None:
        obj["metadata"].setdefault("annotations", {})[NODE_NOTICE] = mark.to_json()
    k.put(r.NODES, obj)


def guarded(k: FakeKube, now: list[float], **settings: Any) -> core.Context:
    ctx = core.Context(config.Config(), k, **settings)
    evictions.configure(ctx, evictions.Guard(clock=lambda: now[0], timing=policy.Timing(grace=8.0, error_hold=20.0)))
    return ctx


def reason(response: dict[str, Any]) -> str:
    return str(response["auditAnnotations"]["spotguard.io/eviction"])


def test_a_pod_of_the_surge_copy_is_held_as_the_deployments_own() -> None:
    """A drain-only copy's pod placed on spot-0 beside web's own; spot-0 gets spotguard's
    notice and a drainer evicts the copy's pod. The copy's ReplicaSet has no controller, and
    the guard answered "not-managed": the pod went while web had nothing Ready on nodes that
    stay. It is web's replica (its surge-of label, its controller the copy so named): held."""
    k = FakeKube()
    cluster.basic_cluster(k, on_demand_nodes=1, spot_nodes=1)
    _, rs = cluster.deployment(k, "web", 2)
    copy = surge_copy(k, "web")
    serving(k, rs, "web-1", "spot-0", {"app": "web", "pod-template-hash": "abc123"})
    serving(k, copy, "spotguard-surge-web-x", "spot-0", {"app": "web", SURGE_OF: "web"})
    noticed(k, "spot-0", NodeNotice("itn-1", NoticeKind.INTERRUPTION, 1000.0, 1120.0))
    ctx = guarded(k, [1000.0])
    response = answer("/evictions", review(name="spotguard-surge-web-x"), ctx)
    assert response["allowed"] is False, response
    assert reason(response) == "protected"
    message = response["status"]["message"]
    assert "Deployment shop/web has 0 Ready pods on nodes that stay and keeps 2" in message, message


def test_a_pod_merely_labelled_surge_of_or_of_a_copy_elsewhere_is_not_the_deployments() -> None:
    """The label alone does not make a pod the copy's: its controller must be the ReplicaSet
    ``spotguard-surge-<name>``; and the Deployment it names is looked for in the pod's own
    namespace."""
    k = FakeKube()
    cluster.basic_cluster(k, on_demand_nodes=1, spot_nodes=1)
    cluster.deployment(k, "web", 2)
    impostor = k.put(r.REPLICASETS, {"metadata": {"name": "impostor", "namespace": "shop"},
                                     "spec": {"selector": {"matchLabels": {"app": "web"}}}})
    serving(k, impostor, "impostor-x", "spot-0", {"app": "web", SURGE_OF: "web"})
    elsewhere = surge_copy(k, "web", namespace="default")  # no Deployment web in default
    serving(k, elsewhere, "spotguard-surge-web-y", "spot-0", {"app": "web", SURGE_OF: "web"})
    noticed(k, "spot-0", NodeNotice("itn-1", NoticeKind.INTERRUPTION, 1000.0, 1120.0))
    ctx = guarded(k, [1000.0])
    assert reason(answer("/evictions", review(name="impostor-x"), ctx)) == "not-managed"
    assert reason(answer("/evictions", review(name="spotguard-surge-web-y", namespace="default"), ctx)) == (
        "not-managed")


def covering(node: str, until: float) -> SurgeRecord:
    return SurgeRecord(replicas=2, surge=1, events=("itn-1",), nodes=(node,), started=1000.0, ready=2,
                       written=2, until=((node, until),), copy=True)


def test_a_replaced_deployments_surge_record_is_read_from_its_copy() -> None:
    """web was replaced (kubectl replace: its spotguard.io/surge annotation gone) while its copy
    carries the surge's record, which names spot-0 (cordoned; spotguard's mark on it never
    written). Past the grace for a node without a notice, the guard let web's pod go
    ("no-notice"); the copy's record covers the node to its reclaim time: held."""
    k = FakeKube()
    cluster.basic_cluster(k, on_demand_nodes=1, spot_nodes=1)
    _, rs = cluster.deployment(k, "web", 2)
    surge_copy(k, "web", record=covering("spot-0", 1120.0))
    serving(k, rs, "web-1", "spot-0", {"app": "web", "pod-template-hash": "abc123"})
    noticed(k, "spot-0")
    now = [1000.0]
    ctx = guarded(k, now)
    first = answer("/evictions", review(name="web-1"), ctx)
    assert first["allowed"] is False, first
    now[0] = 1060.0  # the grace (8 s) long over
    held = answer("/evictions", review(name="web-1"), ctx)
    assert held["allowed"] is False and reason(held) == "protected", held
    assert "the workload's surge covers it" in held["status"]["message"], held
    now[0] = 1090.0  # 30 s before the reclaim time the record names
    assert reason(answer("/evictions", review(name="web-1"), ctx)) == "reclaim-near"


class CopyReadsFail(FakeKube):
    """An API server that answers 500 to every GET of a surge copy."""

    def get(self, res: r.Resource, name: str, namespace: str | None = None) -> Any:
        if res.plural == "replicasets" and name.startswith(surgecopy.PREFIX):
            self.stats.record("get", res.name, 500)
            raise api_errors.Transient(500, "InternalError", "injected fault: get replicasets answered 500")
        return super().get(res, name, namespace)


def test_a_copy_that_cannot_be_read_gets_the_retry_of_any_failed_read_then_the_eviction() -> None:
    """The copy's read failing (500s) is one of the guard's reads failing: a 1 s retry for the
    error hold, then the eviction (it never wedges the drain)."""
    k = CopyReadsFail()
    cluster.basic_cluster(k, on_demand_nodes=1, spot_nodes=1)
    _, rs = cluster.deployment(k, "web", 2)
    serving(k, rs, "web-1", "spot-0", {"app": "web", "pod-template-hash": "abc123"})
    noticed(k, "spot-0", NodeNotice("itn-1", NoticeKind.INTERRUPTION, 1000.0, 1120.0))
    now = [1000.0]
    ctx = guarded(k, now, review_seconds=0.2)
    first = answer("/evictions", review(name="web-1"), ctx)
    assert first["allowed"] is False and reason(first) == "api-error", first
    now[0] = 1020.0
    assert reason(answer("/evictions", review(name="web-1"), ctx)) == "failed-open"
