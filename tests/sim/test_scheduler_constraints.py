"""Scheduler constraints that keep pods Pending on a real cluster: required pod
anti-affinity and affinity, host ports, scheduling gates, the system default
topology spreading, and preemption, in the running simulated cluster.
https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity
https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/
https://kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints/#internal-default-constraints
https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from spotguard_sim import errors, scheduler, testing

from tests.sim import controller_helpers as h

HOST = "kubernetes.io/hostname"


@pytest.fixture
def sim() -> Iterator[Any]:
    with testing.running_cluster(time_scale=50.0, ready_delay_seconds=1.0) as cluster:
        for i in range(5):
            cluster.store.create("nodes", h.node(f"n{i}", zone="abc"[i % 3],
                                                 labels={HOST: f"n{i}", "topology.kubernetes.io/zone": "abc"[i % 3]}))
        yield cluster


def apps(sim: Any) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(sim.api_client())


def core(sim: Any) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(sim.api_client())


def placement(sim: Any, app: str) -> tuple[list[str], int]:
    """(nodes of the bound pods, number of pending pods)."""
    pods = [p for p in h.pods_of(sim.store, app) if not p["metadata"].get("deletionTimestamp")]
    return sorted(p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")), sum(
        1 for p in pods if not p["spec"].get("nodeName"))


def anti(app: str, key: str = HOST) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}}


def high_priority(sim: Any) -> None:
    """The PriorityClass ``high`` (value 1000)."""
    kubernetes.client.SchedulingV1Api(sim.api_client()).create_priority_class(
        {"metadata": {"name": "high"}, "value": 1000})


def create_pod(sim: Any, name: str, app: str, cpu: str, *, node: str | None = None, high: bool = False,
               **spec: Any) -> None:
    """A pod ``name`` of ``app`` in ``default`` requesting ``cpu``: bound to ``node`` when given,
    of priority ``high`` when asked; ``spec`` goes into its spec as is."""
    pod_spec: dict[str, Any] = {"containers": [
        {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}], **spec}
    if node is not None:
        pod_spec["nodeName"] = node
    if high:
        pod_spec["priorityClassName"] = "high"
    core(sim).create_namespaced_pod("default", {"metadata": {"name": name, "labels": {"app": app}}, "spec": pod_spec})


def condition(sim: Any, app: str) -> dict[str, Any]:
    """The PodScheduled condition of a pending pod of ``app`` ({} while there is none yet)."""
    pending = next((p for p in h.pods_of(sim.store, app) if not p["spec"].get("nodeName")), None)
    conditions = (pending or {}).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


def test_required_anti_affinity_leaves_the_sixth_replica_pending(sim: Any) -> None:
    apps(sim).create_namespaced_deployment("default", h.deployment("web", 6, affinity=anti("web")))
    h.wait_for(lambda: placement(sim, "web") == (["n0", "n1", "n2", "n3", "n4"], 1), what="5 bound, 1 pending")
    cond = h.wait_for(lambda: condition(sim, "web").get("reason") == "Unschedulable" and condition(sim, "web"))
    assert "node(s) didn't match pod anti-affinity rules" in cond["message"]


def test_existing_pods_anti_affinity_is_symmetric(sim: Any) -> None:
    """A pod without terms of its own is kept off the nodes of pods that repel it."""
    apps(sim).create_namespaced_deployment("default", h.deployment("loner", 5, affinity={
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "guest"}}, "topologyKey": HOST}]}}))
    h.wait_for(lambda: len(placement(sim, "loner")[0]) == 5, what="a loner on every node")
    apps(sim).create_namespaced_deployment("default", h.deployment("guest", 1))
    h.wait_for(lambda: placement(sim, "guest") == ([], 1), what="the guest pending")
    assert "existing pods anti-affinity" in h.wait_for(lambda: condition(sim, "guest").get("message"))


def test_required_pod_affinity_colocates_by_zone(sim: Any) -> None:
    cache = {"metadata": {"name": "cache", "labels": {"app": "cache"}},
             "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}}
    core(sim).create_namespaced_pod("default", cache)
    apps(sim).create_namespaced_deployment("default", h.deployment("near", 4, affinity={
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "topology.kubernetes.io/zone"}]}}))
    nodes, _ = h.wait_for(lambda: (p := placement(sim, "near"))[1] == 0 and len(p[0]) == 4 and p,
                          what="4 bound pods")
    assert set(nodes) <= {"n1", "n4"}  # zone b


def test_self_affine_group_starts_anywhere_then_follows(sim: Any) -> None:
    apps(sim).create_namespaced_deployment("default", h.deployment("pack", 3, affinity={
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "pack"}}, "topologyKey": HOST}]}}))
    nodes, _ = h.wait_for(lambda: (p := placement(sim, "pack"))[1] == 0 and len(p[0]) == 3 and p)
    assert len(set(nodes)) == 1


def test_host_port_conflicts(sim: Any) -> None:
    tmpl_port = [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}]
    body = h.deployment("edge", 6)
    body["spec"]["template"]["spec"]["containers"][0]["ports"] = tmpl_port
    apps(sim).create_namespaced_deployment("default", body)
    h.wait_for(lambda: placement(sim, "edge") == (["n0", "n1", "n2", "n3", "n4"], 1), what="one per node")
    assert "free ports" in h.wait_for(lambda: condition(sim, "edge").get("message"))


def test_scheduling_gates_hold_a_pod_until_removed(sim: Any) -> None:
    api = core(sim)
    api.create_namespaced_pod("default", {"metadata": {"name": "gated", "labels": {"app": "gated"}}, "spec": {
        "schedulingGates": [{"name": "example.com/quota"}], "containers": [{"name": "c", "image": "x"}]}})
    cond = h.wait_for(lambda: condition(sim, "gated").get("reason") == "SchedulingGated" and condition(sim, "gated"))
    assert cond["status"] == "False"
    with pytest.raises(kubernetes.client.ApiException) as info:  # gates may only be removed
        api.patch_namespaced_pod("gated", "default", {"spec": {"schedulingGates": [
            {"name": "example.com/quota"}, {"name": "example.com/more"}]}})
    assert info.value.status == 422
    api.patch_namespaced_pod("gated", "default", {"spec": {"schedulingGates": None}})
    h.wait_for(lambda: placement(sim, "gated")[0], what="bound once the gate is gone")


def test_system_default_spreading_spreads_a_replicaset_over_nodes_and_zones() -> None:
    """Without constraints of its own, a ReplicaSet's pods get ScheduleAnyway spreading over
    hostnames (maxSkew 3) and zones (maxSkew 5): on empty, equal nodes they spread evenly."""
    with testing.running_cluster(time_scale=50.0) as sim:
        for i in range(6):
            sim.store.create("nodes", h.node(f"m{i}", cpu="64", memory="256Gi", labels={
                HOST: f"m{i}", "topology.kubernetes.io/zone": "xyz"[i % 3]}))
        # an unrelated, bigger workload makes the least-allocated score prefer m3-m5
        for i in range(3):
            sim.store.create("pods", {"metadata": {"name": f"other-{i}"}, "spec": {
                "nodeName": f"m{i}", "containers": [{"name": "c", "image": "x",
                                                     "resources": {"requests": {"cpu": "2"}}}]}})
        apps(sim).create_namespaced_deployment("default", h.deployment("spread", 12, cpu="10m"))
        nodes, _ = h.wait_for(lambda: (p := placement(sim, "spread"))[1] == 0 and len(p[0]) == 12 and p)
        per_node = collections.Counter(nodes)
        assert max(per_node.values()) - min(per_node.get(f"m{i}", 0) for i in range(6)) <= 3, per_node


def test_default_spreading_uses_the_controller_selector() -> None:
    pod = {"metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"}},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    info = scheduler.PodInfo.from_pod(pod, {"matchLabels": {"app": "a"}})
    assert [(s.topology_key, s.max_skew, s.hard) for s in info.spreads] == [
        (HOST, 3, False), ("topology.kubernetes.io/zone", 5, False)]
    own = {**pod, "spec": {**pod["spec"], "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"app": "a"}}}]}}
    assert [s.max_skew for s in scheduler.PodInfo.from_pod(own, {"matchLabels": {"app": "a"}}).spreads] == [1]


def test_a_higher_priority_pod_preempts_lower_priority_ones() -> None:
    with testing.running_cluster(time_scale=50.0, ready_delay_seconds=1.0) as sim:
        sim.store.create("nodes", h.node("only", cpu="2"))
        high_priority(sim)
        apps(sim).create_namespaced_deployment("default", h.deployment("low", 3, cpu="600m"))
        h.wait_for(lambda: len(placement(sim, "low")[0]) == 3, what="three low-priority pods")
        create_pod(sim, "vip", "vip", "1", high=True)
        h.wait_for(lambda: placement(sim, "vip")[0] == ["only"], timeout=20, what="the vip bound")
        vip = sim.store.get("pods", "vip", "default")
        assert vip["spec"]["priority"] == 1000 and vip["status"].get("nominatedNodeName") == "only"
        # two victims sufficed (600m + 600m free); the replacements stay pending
        h.wait_for(lambda: (len((p := placement(sim, "low"))[0]), p[1]) == (1, 2), what="1 bound, 2 pending")


def test_preemption_prefers_victims_no_budget_protects() -> None:
    with testing.running_cluster(time_scale=50.0, ready_delay_seconds=1.0) as sim:
        sim.store.create("nodes", h.node("a", cpu="1"))
        sim.store.create("nodes", h.node("b", cpu="1"))
        high_priority(sim)
        for app, node in (("guarded", "a"), ("free", "b")):
            create_pod(sim, app, app, "800m", node=node)
        kubernetes.client.PolicyV1Api(sim.api_client()).create_namespaced_pod_disruption_budget("default", {
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
        h.wait_for(lambda: all(h.is_ready(sim.store.get("pods", n, "default")) for n in ("guarded", "free")),
                   what="both running")
        h.wait_for(lambda: (sim.store.get("poddisruptionbudgets", "guarded", "default").get("status") or {})
                   .get("currentHealthy") == 1, what="the budget computed")
        create_pod(sim, "vip", "vip", "500m", high=True)
        h.wait_for(lambda: placement(sim, "vip")[0] == ["b"], timeout=20, what="the vip on b")
        assert not sim.store.get("pods", "guarded", "default")["metadata"].get("deletionTimestamp")


def test_preferred_pod_affinity_and_anti_affinity_are_scored(sim: Any) -> None:
    """InterPodAffinity Score (weight 2): preferred terms pull pods towards (or push them away
    from) the domains of the pods they select."""
    cache = {"metadata": {"name": "cache", "labels": {"app": "cache"}},
             "spec": {"nodeName": "n3", "containers": [{"name": "c", "image": "x"}]}}
    core(sim).create_namespaced_pod("default", cache)

    def preferring(name: str, kind: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"app": kind}}, "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}],
            "affinity": {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": HOST}}]}}}}

    for i in range(4):
        core(sim).create_namespaced_pod("default", preferring(f"near-{i}", "podAffinity"))
    h.wait_for(lambda: placement(sim, "podAffinity") == (["n3"] * 4, 0), what="all four next to the cache")
    for i in range(4):
        core(sim).create_namespaced_pod("default", preferring(f"far-{i}", "podAntiAffinity"))
    nodes, _ = h.wait_for(lambda: (p := placement(sim, "podAntiAffinity"))[1] == 0 and len(p[0]) == 4 and p)
    assert "n3" not in nodes


def test_existing_pods_preferred_terms_score_the_incoming_pod(sim: Any) -> None:
    """InterPodAffinity's symmetric part (interpodaffinity/scoring.go processExistingPod):
    a bound pod's preferred affinity pulls the pods it selects into its domain, its
    preferred anti-affinity pushes them away, its required affinity pulls with
    HardPodAffinityWeight (1)."""
    def host(name: str, node: str, kind: str, selects: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"app": name}}, "spec": {
            "nodeName": node, "containers": [{"name": "c", "image": "x"}],
            "affinity": {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app": selects}}, "topologyKey": HOST}}]}}}}

    def plain(name: str, app: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"app": app}}, "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]}}

    core(sim).create_namespaced_pod("default", host("magnet", "n3", "podAffinity", "friend"))
    for i in range(4):
        core(sim).create_namespaced_pod("default", plain(f"friend-{i}", "friend"))
    h.wait_for(lambda: placement(sim, "friend") == (["n3"] * 4, 0), what="all four drawn to n3")
    core(sim).create_namespaced_pod("default", host("repeller", "n1", "podAntiAffinity", "shy"))
    for i in range(4):
        core(sim).create_namespaced_pod("default", plain(f"shy-{i}", "shy"))
    nodes, _ = h.wait_for(lambda: (p := placement(sim, "shy"))[1] == 0 and len(p[0]) == 4 and p,
                          what="four shy pods bound")
    assert "n1" not in nodes


def test_preemption_rechecks_inter_pod_anti_affinity() -> None:
    """SelectVictimsOnNode re-runs every filter: a node where an equal-priority pod the
    preemptor is anti-affine to stays is no candidate, however cheap its victims; on the
    chosen node a lower-priority pod the preemptor is anti-affine to is a victim even
    though the resources would let it stay."""
    with testing.running_cluster(time_scale=50.0, ready_delay_seconds=1.0) as sim:
        sim.store.create("nodes", h.node("a", cpu="1", labels={HOST: "a"}))
        sim.store.create("nodes", h.node("b", cpu="1", labels={HOST: "b"}))
        high_priority(sim)
        create_pod(sim, "rival", "rival", "100m", node="a")
        create_pod(sim, "filler-1", "filler", "450m", node="a")
        create_pod(sim, "filler-2", "filler", "450m", node="a")
        create_pod(sim, "blocker", "rival", "100m", node="b", high=True)
        create_pod(sim, "filler-b", "filler", "800m", node="b")
        create_pod(sim, "vip", "vip", "500m", high=True, affinity=anti("rival"))
        h.wait_for(lambda: placement(sim, "vip")[0] == ["a"], timeout=20, what="the vip on a")

        def deleting(name: str) -> bool:
            try:
                return bool(sim.store.get("pods", name, "default")["metadata"].get("deletionTimestamp"))
            except errors.NotFound:
                return True  # gone

        assert deleting("rival") and not deleting("blocker") and not deleting("filler-b")
        assert [deleting("filler-1"), deleting("filler-2")].count(True) == 1


def test_preemption_rechecks_hard_topology_spread() -> None:
    """A node where evicting the cheapest victims would still leave the preemptor's
    DoNotSchedule spread skewed is no candidate (SelectVictimsOnNode runs
    PodTopologySpread's filter too)."""
    zone = "topology.kubernetes.io/zone"
    with testing.running_cluster(time_scale=50.0, ready_delay_seconds=1.0) as sim:
        sim.store.create("nodes", h.node("a", cpu="1", zone="x", labels={HOST: "a", zone: "x"}))
        sim.store.create("nodes", h.node("b", cpu="1", zone="y", labels={HOST: "b", zone: "y"}))
        high_priority(sim)
        for name, node, app, cpu, high in (("web-1", "a", "web", "100m", True),
                                           ("filler-a", "a", "filler", "800m", False),
                                           ("filler-b1", "b", "filler", "450m", False),
                                           ("filler-b2", "b", "filler", "450m", False)):
            create_pod(sim, name, app, cpu, node=node, high=high)
        create_pod(sim, "web-2", "web", "500m", high=True, topologySpreadConstraints=[
            {"maxSkew": 1, "topologyKey": zone, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "web"}}}])
        h.wait_for(lambda: sim.store.get("pods", "web-2", "default")["spec"].get("nodeName") == "b",
                   timeout=20, what="web-2 on b")
        assert not sim.store.get("pods", "filler-a", "default")["metadata"].get("deletionTimestamp")
