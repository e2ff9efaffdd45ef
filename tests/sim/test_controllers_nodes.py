"""kubelet, node lifecycle and HorizontalPodAutoscaler behaviour of the simulated cluster."""

from __future__ import annotations

from typing import Any

import kubernetes
from spotguard_sim import clock as simclock
from spotguard_sim import testing

from tests.sim import controller_helpers as h

SCALE = 50.0


def _cond(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in pod["status"]["conditions"] if c["type"] == kind)


# https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions
def test_kubelet_starts_a_bound_pod_after_the_ready_delay() -> None:
    with testing.running_cluster(time_scale=SCALE, ready_delay_seconds=10.0) as sim:
        sim.store.create("nodes", h.node("n1"))
        core = kubernetes.client.CoreV1Api(sim.api_client())
        core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "nginx:1.27"}]}})
        h.wait_for(lambda: sim.store.get("pods", "p", "default")["spec"].get("nodeName"), what="bound")
        bound_at = sim.clock.now()
        assert sim.store.get("pods", "p", "default")["status"]["phase"] == "Pending"
        h.wait_for(lambda: h.is_ready(sim.store.get("pods", "p", "default")), what="ready")
        assert sim.clock.now() - bound_at >= 9.0
        pod = core.read_namespaced_pod("p", "default")
        assert pod.status.phase == "Running"
        assert pod.status.container_statuses[0].ready is True
        assert pod.status.container_statuses[0].state.running is not None
        assert pod.status.pod_ip and pod.status.host_ip and pod.status.start_time
        assert {c.type for c in pod.status.conditions} >= {
            "PodScheduled", "Initialized", "ContainersReady", "Ready"}


# https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination
def test_kubelet_removes_terminating_pods_after_the_shorter_grace() -> None:
    # time x10: the short pod's removal is told from the long one's by 18 simulated seconds,
    # 1.8 s of real slack on a loaded machine
    with testing.running_cluster(time_scale=10.0, termination_seconds=20.0) as sim:
        sim.store.create("nodes", h.node("n1"))
        core = kubernetes.client.CoreV1Api(sim.api_client())
        for name, grace in (("long", 60), ("short", 2)):
            core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {
                "terminationGracePeriodSeconds": grace,
                "containers": [{"name": "c", "image": "nginx:1.27"}]}})
        h.wait_for(lambda: all(h.is_ready(sim.store.get("pods", n, "default"))
                               for n in ("long", "short")), what="ready")
        start = sim.clock.now()
        core.delete_namespaced_pod("long", "default")
        core.delete_namespaced_pod("short", "default")
        assert core.read_namespaced_pod("long", "default").metadata.deletion_timestamp
        gone: dict[str, float] = {}

        def removed() -> bool:
            names = {p["metadata"]["name"] for p in sim.store.list("pods", "default")[0]}
            for n in ("long", "short"):
                if n not in names and n not in gone:
                    gone[n] = sim.clock.now() - start
            return len(gone) == 2

        h.wait_for(removed, what="removed")
        assert gone["short"] < 18.0  # its own grace period (2s): before termination_seconds (20s)
        assert 18.0 <= gone["long"] < 58.0  # termination_seconds (20s), not its grace period (60s)


# node lifecycle: https://kubernetes.io/docs/concepts/architecture/nodes/#node-status ;
# spot reclaim convention: sim.spotguard.io/terminate-at (SIM_STORE.md)
def test_reclaimed_node_goes_not_ready_then_is_removed_with_its_pods() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("spot-1", labels={"node.kubernetes.io/capacity": "spot"}))
        apps = kubernetes.client.AppsV1Api(sim.api_client())
        apps.create_namespaced_deployment("default", h.deployment("web", 2))
        h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 2, what="ready")
        node = sim.store.get("nodes", "spot-1")
        assert _cond(node, "Ready")["status"] == "True"
        seen: list[tuple[str, str]] = []

        def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
            if resource == "nodes":
                ready = next((c["status"] for c in obj.get("status", {}).get("conditions", [])
                              if c["type"] == "Ready"), "")
                seen.append((event_type, ready))

        sim.store.subscribe(watch)
        sim.reclaim(["spot-1"], after_seconds=20)
        when = simclock.parse_iso(
            sim.store.get("nodes", "spot-1")["metadata"]["annotations"]["sim.spotguard.io/terminate-at"])
        h.wait_for(lambda: not sim.store.list("nodes")[0], timeout=10, what="node removed")
        sim.store.unsubscribe(watch)
        assert sim.clock.now() >= when
        assert ("MODIFIED", "Unknown") in seen and seen[-1][0] == "DELETED"
        # the pods went with the node; their replacements wait for a node
        h.wait_for(lambda: len(h.pods_of(sim.store, "web")) == 2
                   and all(not p["spec"].get("nodeName") for p in h.pods_of(sim.store, "web")),
                   what="replacements pending")
        sim.store.create("nodes", h.node("od-1"))
        h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 2, what="rescheduled")


def test_pods_on_a_not_ready_node_become_not_ready() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("n1", zone="a"))
        sim.store.create("nodes", h.node("n2", zone="b", labels={"hold": "x"}))
        core = kubernetes.client.CoreV1Api(sim.api_client())
        core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {
            "nodeName": "n1", "containers": [{"name": "c", "image": "nginx:1.27"}]}})
        h.wait_for(lambda: h.is_ready(sim.store.get("pods", "p", "default")), what="ready")

        def down(node: dict[str, Any]) -> None:
            for c in node["status"]["conditions"]:
                if c["type"] == "Ready":
                    c["status"] = "False"

        sim.store.mutate("nodes", "n1", None, down)
        h.wait_for(lambda: not h.is_ready(sim.store.get("pods", "p", "default")), what="not ready")
        # MarkPodsNotReady sets the status only (pkg/controller/util/node/controller_utils.go)
        assert _cond(sim.store.get("pods", "p", "default"), "Ready")["status"] == "False"
        # a node reporting NotReady is tainted not-ready (TaintNodesByCondition, NoExecute tainter)
        h.wait_for(lambda: {(t["key"], t["effect"]) for t in sim.store.get("nodes", "n1")["spec"].get("taints", [])}
                   == {("node.kubernetes.io/not-ready", "NoSchedule"), ("node.kubernetes.io/not-ready", "NoExecute")},
                   what="not-ready taints")


# https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ (min/max replicas)
def test_hpa_keeps_replicas_within_bounds() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("n1"))
        apps = kubernetes.client.AppsV1Api(sim.api_client())
        apps.create_namespaced_deployment("default", h.deployment("web", 5))
        auto = kubernetes.client.AutoscalingV2Api(sim.api_client())
        auto.create_namespaced_horizontal_pod_autoscaler("default", {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "minReplicas": 2, "maxReplicas": 3,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                         "type": "Utilization", "averageUtilization": 80}}}]}})
        h.wait_for(lambda: apps.read_namespaced_deployment("web", "default").spec.replicas == 3,
                   what="clamped to max")
        h.wait_for(lambda: (auto.read_namespaced_horizontal_pod_autoscaler("web", "default")
                            .status.desired_replicas) == 3, what="hpa status")
        status = auto.read_namespaced_horizontal_pod_autoscaler("web", "default").status
        assert status.last_scale_time is not None
        assert {c.type: c.reason for c in status.conditions}["ScalingLimited"] in (
            "TooManyReplicas", "DesiredWithinRange")
        apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 1}})
        h.wait_for(lambda: apps.read_namespaced_deployment("web", "default").spec.replicas == 2,
                   what="clamped to min")
        apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 3}})
        h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 3, what="3 ready")
        assert apps.read_namespaced_deployment("web", "default").spec.replicas == 3


# https://kubernetes.io/docs/reference/node/node-status/ : a kubelet reports nodeInfo and addresses
def test_nodes_created_with_a_bare_status_read_through_the_client() -> None:
    from spotguard_sim import objects

    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", objects.node("bare", ready=True))
        core = kubernetes.client.CoreV1Api(sim.api_client())

        def listed() -> bool:
            try:
                return [n.metadata.name for n in core.list_node().items] == ["bare"]
            except ValueError:  # the client refuses a NodeSystemInfo without its required fields
                return False

        h.wait_for(listed, what="list_node")
        node = core.read_node("bare")
        assert node.status.node_info.kubelet_version and node.status.addresses
