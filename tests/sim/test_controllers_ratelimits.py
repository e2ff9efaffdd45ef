"""Every controller's client rate limit, and kube-controller-manager's work queue's retries.

kube-controller-manager gives each controller its own client (``ControllerClientBuilder``
``ClientOrDie(name)``, cmd/kube-controller-manager/app), built from one rest config with
``--kube-api-qps`` 20 and ``--kube-api-burst`` 30 (pkg/controller/apis/config/v1alpha1
defaults.go; cloud-controller-manager's are the same): a burst of hundreds of writes goes at
20 a second once 30 have gone. A failed sync is requeued with the work queue's
``DefaultControllerRateLimiter`` (client-go util/workqueue/default_rate_limiters.go): 5 ms
doubling to 1000 s per item, and at most 10 retries a second after 100 overall.

Karpenter's controllers share one client (the controller-runtime manager's) of
``--kube-client-qps`` 200 and ``--kube-client-burst`` 300 (kubernetes-sigs/karpenter
pkg/operator/options/options.go, operator.go); the Cluster Autoscaler has one client of 5 and 10
(cluster-autoscaler/FAQ.md; main.go ``CreateKubeClient``).

The time scales are low on purpose: at a high one the machine's own processing, counted in
simulated seconds, would spread the writes as much as the limit does.
"""

from __future__ import annotations

import http.server
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from spotguard.logs import UserError
from spotguard_sim import capacity, catalogue, nodegroups, nodepools, objects, settings, testing, tls
from spotguard_sim import clock as simclock
from spotguard_sim import store as store_mod
from spotguard_sim.controllers import Controllers, instances, ratelimit

from tests.sim.test_karpenter import deployment

LIMITS = settings.ControllerManager()
QPS, BURST = LIMITS.kube_api_qps, LIMITS.kube_api_burst


def _paced(requests: int) -> float:
    """The least span, in simulated seconds, of ``requests`` through a full bucket (with slack)."""
    return (requests - BURST) / QPS * 0.9


def _wait(what: Callable[[], Any], timeout: float = 60.0, message: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {message or what}")


class _Firsts:
    """The simulated time each object first matched ``when`` (by name), from the store's events."""

    def __init__(self, sim: testing.SimCluster, resource: str,
                 when: Callable[[str, dict[str, Any]], bool]) -> None:
        self.sim, self.resource, self.when = sim, resource, when
        self.times: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != self.resource or not self.when(event_type, obj):
            return
        with self._lock:
            self.times.setdefault(obj["metadata"]["name"], self.sim.clock.now())

    def __enter__(self) -> _Firsts:
        self.sim.store.subscribe(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.sim.store.unsubscribe(self)

    def span(self) -> float:
        with self._lock:
            return max(self.times.values()) - min(self.times.values())


def _cluster(time_scale: float, **node_loss: Any) -> Any:
    return testing.running_cluster(time_scale=time_scale, settings=settings.Settings(
        node_loss=settings.NodeLoss(**node_loss)))


def _bare_pods(sim: testing.SimCluster, node: str, count: int) -> None:
    for i in range(count):
        sim.store.create("pods", {"metadata": {"name": f"p{i}", "namespace": "default"}, "spec": {
            "nodeName": node, "containers": [{"name": "c", "image": objects.PAUSE}]}})
    _wait(lambda: sum(1 for p in sim.store.list("pods")[0] if sim.serving(p)) == count, message="pods ready")


def _ready(pod: dict[str, Any]) -> str | None:
    return next((c.get("status") for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready"), None)


COUNT = 200


def test_the_node_lifecycle_controller_marks_pods_not_ready_at_its_clients_pace() -> None:
    """MarkPodsNotReady (pkg/controller/util/node/controller_utils.go): one UpdateStatus a pod,
    through the node-controller client; 200 pods on a lost node turn not Ready over 8 s or more."""
    with _cluster(5.0, node_monitor_grace_period=5.0, node_monitor_period=1.0) as sim:
        sim.store.create("nodes", objects.node("big", pods="500", ready=False))
        _bare_pods(sim, "big", COUNT)
        with _Firsts(sim, "pods", lambda t, o: _ready(o) == "False") as not_ready:
            sim.reclaim(["big"], after_seconds=1, action="stop")
            _wait(lambda: len(not_ready.times) == COUNT, timeout=90, message="pods not Ready")
    assert not_ready.span() >= _paced(COUNT), not_ready.span()


def test_taint_eviction_deletes_at_its_clients_pace() -> None:
    """addConditionAndDeletePod (pkg/controller/tainteviction/taint_eviction.go): a GET, a status
    PATCH and a DELETE a pod; 200 pods that do not tolerate a NoExecute taint go over 25 s or more."""
    with _cluster(5.0) as sim:
        sim.store.create("nodes", objects.node("big", pods="500", ready=False))
        _bare_pods(sim, "big", COUNT)
        with _Firsts(sim, "pods", lambda t, o: bool(o["metadata"].get("deletionTimestamp"))) as evicted:
            sim.store.mutate("nodes", "big", None, lambda n: n.setdefault("spec", {}).setdefault(
                "taints", []).append({"key": "example.com/drain", "effect": "NoExecute"}))
            _wait(lambda: len(evicted.times) == COUNT, timeout=90, message="pods evicted")
    assert evicted.span() >= _paced(3 * COUNT), evicted.span()


def test_pod_gc_force_deletes_orphans_at_its_clients_pace() -> None:
    """gcOrphaned (pkg/controller/podgc/gc_controller.go): a GET of the missing node, then a
    status PATCH and a DELETE a pod; 200 orphans go over 16 s or more."""
    with _cluster(5.0, pod_gc_period=2.0, pod_gc_quarantine=2.0) as sim:
        sim.store.create("nodes", objects.node("big", pods="500", ready=False))
        _bare_pods(sim, "big", COUNT)
        with _Firsts(sim, "pods", lambda t, o: t == "DELETED") as gone:
            sim.store.delete("nodes", "big")
            _wait(lambda: len(gone.times) == COUNT, timeout=90, message="orphans deleted")
    assert gone.span() >= _paced(2 * COUNT + 1), gone.span()


def test_the_cloud_node_lifecycle_controller_deletes_nodes_at_its_clients_pace() -> None:
    """cloud-controller-manager's --kube-api-qps 20 / --kube-api-burst 30: 100 not Ready nodes whose
    instances are gone are deleted over 3 s or more, not in one tick."""
    count = 100
    with _cluster(2.0, shutting_down_seconds=0.0) as sim:
        for i in range(count):
            node = objects.node(f"n{i}")
            node["status"]["conditions"][0]["status"] = "False"
            sim.store.create("nodes", node)
        with _Firsts(sim, "nodes", lambda t, o: t == "DELETED") as gone:
            sim.reclaim([f"n{i}" for i in range(count)], after_seconds=1, action="terminate")
            _wait(lambda: len(gone.times) == count, timeout=90, message="nodes deleted")
    assert gone.span() >= _paced(count), gone.span()


def test_the_disruption_controller_writes_budgets_status_at_its_clients_pace() -> None:
    """updatePdbStatus through the disruption-controller client: 100 new budgets get their first
    status over 3 s or more."""
    count = 100
    with _cluster(2.0) as sim, _Firsts(
            sim, "poddisruptionbudgets", lambda t, o: "observedGeneration" in (o.get("status") or {})) as written:
        for i in range(count):
            sim.store.create("poddisruptionbudgets", objects.pdb(f"b{i}", f"app{i}", min_available=1))
        _wait(lambda: len(written.times) == count, timeout=60, message="budgets' status")
    assert written.span() >= _paced(count), written.span()


def test_the_hpa_controller_reads_scales_at_its_clients_pace() -> None:
    """The HPA controller's scale client (its own bucket): a GET of each target's scale a sync, so
    100 HPAs created at once finish their first sync over 3 s or more, not all at once."""
    count = 100
    with _cluster(4.0) as sim:
        for i in range(count):
            sim.store.create("replicasets", objects.replicaset(f"r{i}", 0))
            hpa = objects.hpa(f"h{i}", f"r{i}", 1, 3)
            hpa["spec"]["scaleTargetRef"].update(kind="ReplicaSet")
            sim.store.create("horizontalpodautoscalers", hpa)
        with _Firsts(sim, "horizontalpodautoscalers",
                     lambda t, o: "observedGeneration" in (o.get("status") or {})) as synced:
            _wait(lambda: len(synced.times) == count, timeout=60, message="the HPAs' first sync")
    assert synced.span() >= _paced(count), synced.span()


# ---- Karpenter's and the Cluster Autoscaler's clients ------------------------------------------

KARPENTER = settings.KarpenterClient()
CLUSTER_AUTOSCALER = settings.ClusterAutoscalerClient()


def _evicted(sim: testing.SimCluster) -> _Firsts:
    return _Firsts(sim, "pods", lambda t, o: bool(o["metadata"].get("deletionTimestamp")))


def test_the_client_limits_default_to_upstreams_and_are_scenario_settings() -> None:
    assert (KARPENTER.kube_client_qps, KARPENTER.kube_client_burst) == (200.0, 300)
    assert (CLUSTER_AUTOSCALER.kube_client_qps, CLUSTER_AUTOSCALER.kube_client_burst) == (5.0, 10)
    found = settings.from_doc({"apiVersion": settings.API_VERSION, "kind": settings.KIND,
                               "karpenter": {"kubeClientQPS": 50, "kubeClientBurst": 60},
                               "clusterAutoscaler": {"kubeClientQPS": 0}})
    assert found.karpenter == settings.KarpenterClient(50.0, 60)
    assert found.cluster_autoscaler == settings.ClusterAutoscalerClient(0.0, 10)
    with pytest.raises(UserError, match="unknown clusterAutoscaler field"):
        settings.from_doc({"clusterAutoscaler": {"scanIntervalSeconds": 10}})


def test_karpenters_controllers_take_their_turns_from_one_bucket() -> None:
    """One rest config, one controller-runtime manager, one client for every Karpenter controller:
    the provisioner's 300 requests use up the burst, and the disruption controller's next one waits
    its 1/200 s. The Cluster Autoscaler's bucket is its own."""
    store = store_mod.Store(simclock.Clock(time_scale=1e-3))  # (time all but stands still: no refill)
    running = Controllers(store)
    try:
        karpenter = {c.name: c for c in running.controllers if c.name.startswith("karpenter")}
        assert set(karpenter) == {"karpenter", "karpenter-disruption"}
        bucket = karpenter["karpenter"].client
        assert bucket is not None and karpenter["karpenter-disruption"].client is bucket
        assert (bucket.qps, bucket.burst) == (200.0, 300)
        assert [bucket.reserve() for _ in range(300)] == [0.0] * 300
        disruption_bucket = karpenter["karpenter-disruption"].client
        assert disruption_bucket is not None and disruption_bucket.reserve() == pytest.approx(1 / 200, rel=0.01)
        autoscaler = next(c for c in running.controllers if c.name == "cluster-autoscaler")
        assert autoscaler.client is not None and autoscaler.client is not bucket
        assert (autoscaler.client.qps, autoscaler.client.burst) == (5.0, 10)
    finally:
        running.stop()


def test_a_karpenter_drain_evicts_at_its_clients_pace() -> None:
    """A spot interruption notice on a Karpenter node of 400 pods (interruption handling on): the
    taint, then 400 evictions through the client of 300 burst and 200 a second, spread over
    (400 - 300) / 200 = 0.5 s or more (a low time scale, so the machine's own pace cannot)."""
    count = 400
    cfg = settings.Settings(capacity=capacity.Capacity(interruption_handling=True))
    with testing.running_cluster(time_scale=0.25, settings=cfg) as sim:
        sim.store.create("nodepools", objects.nodepool())
        sim.store.create("nodes", objects.node("big", pods="500", labels={nodepools.NODEPOOL: "default"}))
        _bare_pods(sim, "big", count)
        with _evicted(sim) as evicted:
            notice = sim.clock.iso(sim.clock.now() + 3600.0)
            sim.store.mutate("nodes", "big", None, lambda n: n["metadata"].setdefault(
                "annotations", {}).update({instances.TERMINATE_AT: notice}))
            _wait(lambda: len(evicted.times) == count, timeout=120, message="pods evicted")
    assert evicted.span() >= (count - KARPENTER.kube_client_burst) / KARPENTER.kube_client_qps * 0.9, \
        evicted.span()


def test_a_cluster_autoscaler_drain_evicts_at_its_clients_pace() -> None:
    """The Cluster Autoscaler scales down a node of 30 pods: the taint, then the evictions through
    its client of 10 burst and 5 a second: at most 10 (9 after the taint) at once, then about 5 a
    simulated second, over (30 - 10) / 5 = 4 s or more (each pod's eviction is a goroutine of its
    own upstream, all waiting at the one limiter)."""
    count = 30
    group = nodegroups.NodeGroup("od", catalogue.TYPES["m5.xlarge"], "on-demand", 0, 5)
    cfg = settings.Settings(capacity=capacity.Capacity(cluster_autoscaler=nodegroups.ClusterAutoscaler(
        node_groups=(group,), scale_down=nodegroups.ScaleDown(unneeded_time=5.0, delay_after_add=0.0))))
    with testing.running_cluster(time_scale=5.0, settings=cfg) as sim:
        # the group's node holds the pods (the other node cordoned until they are placed)
        sim.store.create("nodes", objects.node("a", labels=group.node_labels("a", "us-east-1a")))
        spare = objects.node("spare")
        spare.setdefault("spec", {})["unschedulable"] = True
        sim.store.create("nodes", spare)
        sim.store.create("deployments", deployment("web", count, cpu="10m"), namespace="default")
        _wait(lambda: sum(1 for p in sim.store.list("pods")[0] if sim.serving(p)) == count, message="pods ready")
        with _evicted(sim) as evicted:
            sim.store.mutate("nodes", "spare", None, lambda n: n["spec"].update(unschedulable=False))
            _wait(lambda: len(evicted.times) >= count, timeout=120, message="pods evicted")
        times = sorted(evicted.times.values())[:count]
    first = times[0]
    assert sum(1 for t in times if t - first < 1.0) <= CLUSTER_AUTOSCALER.kube_client_burst + 5 + 1, times
    paced = (count - CLUSTER_AUTOSCALER.kube_client_burst) / CLUSTER_AUTOSCALER.kube_client_qps * 0.9
    assert times[-1] - first >= paced, times


# ---- the work queue's retries ----------------------------------------------------------------


class _Denier(http.server.BaseHTTPRequestHandler):
    """An admission webhook (mutating: the simulated API server calls validating ones for evictions
    only) that refuses every pod and records when (simulated time) it was asked."""

    protocol_version = "HTTP/1.1"
    clock: Any = None
    asked: list[float] = []

    def do_POST(self) -> None:
        review = testing.read_review(self)
        type(self).asked.append(type(self).clock.now())
        testing.answer_review(self, {"uid": review["request"]["uid"], "allowed": False,
                                     "status": {"code": 403, "message": "no pods today"}})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def denier() -> Iterator[tuple[str, str]]:
    _Denier.asked = []
    server, url, ca_bundle = tls.serve_https(_Denier)
    try:
        yield url, ca_bundle
    finally:
        server.shutdown()


def test_a_refused_create_is_retried_with_exponential_back_off(denier: tuple[str, str]) -> None:
    """A ReplicaSet whose pods a webhook refuses is retried 5 ms, 10 ms, 20 ms, ... after each
    failure (AddRateLimited), not every second: within 60 simulated seconds at most 14 tries
    (5 ms x (2^13 - 1) = 41 s; the next would come at 82 s), and the later gaps grow past 10 s."""
    url, ca_bundle = denier
    with testing.running_cluster(time_scale=20.0) as sim:
        _Denier.clock = sim.clock
        sim.store.create("mutatingwebhookconfigurations", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "deny"},
            "webhooks": [{"name": "deny.spotguard.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "failurePolicy": "Fail", "clientConfig": {"url": url + "/", "caBundle": ca_bundle},
                          "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                     "resources": ["pods"]}]}]})
        sim.store.create("replicasets", objects.replicaset("refused", 1))
        _wait(lambda: _Denier.asked, message="the first try")
        start = _Denier.asked[0]
        _wait(lambda: sim.clock.now() >= start + 60.0, timeout=30, message="a simulated minute")
        asked = [t - start for t in _Denier.asked if t - start <= 60.0]
    assert 8 <= len(asked) <= 14, asked
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert max(gaps) >= 10.0, gaps


def test_the_default_controller_rate_limiter() -> None:
    """DefaultControllerRateLimiter: the max of 5 ms x 2^failures (at most 1000 s) per item and an
    overall bucket of 10 a second after a burst of 100; Forget resets an item."""
    clock = simclock.Clock()
    limiter = ratelimit.FailureRateLimiter(clock)
    assert [limiter.when("a") for _ in range(4)] == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert limiter.num_requeues("a") == 4
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0 and limiter.when("a") == pytest.approx(0.005)
    for _ in range(30):
        limiter.when("b")
    assert limiter.when("b") == pytest.approx(1000.0)
    fresh = ratelimit.FailureRateLimiter(clock)
    delays = [fresh.when(i) for i in range(120)]  # 120 items failing at once
    assert max(delays[:100]) == pytest.approx(0.005, abs=0.01)
    assert delays[100] >= 0.09 and delays[119] >= 1.9, delays[100:]
