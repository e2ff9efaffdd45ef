"""Unit tests of the scheduler's filters and scores (spotguard_sim.scheduler),
each citing the kube-scheduler documentation it follows."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from spotguard_sim import scheduler

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def node(name: str, *, cpu: str = "4", memory: str = "8Gi", pods: str = "110", zone: str = "a",
         labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         unschedulable: bool = False, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {HOST: name, ZONE: zone, **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(name: str = "p", *, cpu: str | None = None, memory: str | None = None,
        labels: dict[str, str] | None = None, ns: str = "default", **spec: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}], **spec},
    }


def cache_of(
    *nodes: dict[str, Any], bound: list[tuple[dict[str, Any], str]] | None = None
) -> scheduler.Cache:
    c = scheduler.Cache()
    for n in nodes:
        c.set_node(n)
    for p, n_name in bound or []:
        c.set_pod({**p, "spec": {**p["spec"], "nodeName": n_name}})
    return c


def run(p: dict[str, Any], c: scheduler.Cache) -> scheduler.Result:
    return scheduler.schedule(scheduler.PodInfo.from_pod(p), c)


def feasible(p: dict[str, Any], c: scheduler.Cache) -> set[str]:
    return scheduler.feasible_nodes(scheduler.PodInfo.from_pod(p), c)


# https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/ and
# https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#how-pods-with-resource-requests-are-scheduled
def test_resources_fit_counts_requests_of_bound_pods() -> None:
    c = cache_of(node("n1", cpu="1"), node("n2", cpu="2"),
                 bound=[(pod("a", cpu="800m"), "n1")])
    assert feasible(pod(cpu="500m"), c) == {"n2"}
    result = run(pod(cpu="3"), c)
    assert result.node is None
    assert result.message(2) == "0/2 nodes are available: 2 Insufficient cpu."


def test_pod_count_is_a_resource() -> None:
    c = cache_of(node("n1", pods="1"), node("n2", pods="2"), bound=[(pod("a"), "n1")])
    assert feasible(pod(), c) == {"n2"}
    assert run(pod(), cache_of(node("x", pods="0"))).message(1) == (
        "0/1 nodes are available: 1 Too many pods.")


def test_removing_a_bound_pod_frees_its_requests() -> None:
    c = cache_of(node("n1", cpu="1"), bound=[(pod("a", cpu="1"), "n1")])
    assert feasible(pod(cpu="1"), c) == set()
    c.remove_pod("default", "a")
    assert feasible(pod(cpu="1"), c) == {"n1"}


# https://kubernetes.io/docs/concepts/architecture/nodes/#manual-node-administration (cordon)
def test_unschedulable_and_not_ready_nodes_are_filtered() -> None:
    c = cache_of(node("cordoned", unschedulable=True), node("down", ready=False), node("ok"))
    assert feasible(pod(), c) == {"ok"}
    tolerant = pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                 "effect": "NoSchedule"}])
    assert feasible(tolerant, c) == {"cordoned", "ok"}


# https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_untolerated_taints_filter(effect: str) -> None:
    c = cache_of(node("spot", taints=[{"key": "spot", "value": "true", "effect": effect}]), node("od"))
    assert feasible(pod(), c) == {"od"}
    assert run(pod(nodeSelector={HOST: "spot"}), c).reasons[
        "node(s) had untolerated taint {spot: true}"] == 1
    equal = pod(tolerations=[{"key": "spot", "operator": "Equal", "value": "true", "effect": effect}])
    assert feasible(equal, c) == {"spot", "od"}
    wrong_value = pod(tolerations=[{"key": "spot", "operator": "Equal", "value": "no"}])
    assert feasible(wrong_value, c) == {"od"}
    exists = pod(tolerations=[{"operator": "Exists"}])
    assert feasible(exists, c) == {"spot", "od"}


def test_prefer_no_schedule_only_scores() -> None:
    c = cache_of(node("soft", taints=[{"key": "k", "effect": "PreferNoSchedule"}]), node("plain"))
    assert feasible(pod(), c) == {"soft", "plain"}
    assert run(pod(), c).node == "plain"
    tolerant = pod(tolerations=[{"key": "k", "operator": "Exists"}])
    scores = run(tolerant, c).scores
    assert scores["soft"] == scores["plain"]


# https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodeselector
def test_node_selector() -> None:
    c = cache_of(node("n1", labels={"disk": "ssd"}), node("n2", labels={"disk": "hdd"}))
    assert feasible(pod(nodeSelector={"disk": "ssd"}), c) == {"n1"}
    assert run(pod(nodeSelector={"disk": "nvme"}), c).message(2) == (
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.")


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


# https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#node-affinity
@pytest.mark.parametrize(("expr", "expected"), [
    ({"key": "size", "operator": "In", "values": ["2", "3"]}, {"n2", "n3"}),
    ({"key": "size", "operator": "NotIn", "values": ["2", "3"]}, {"n1", "none"}),
    ({"key": "size", "operator": "Exists"}, {"n1", "n2", "n3"}),
    ({"key": "size", "operator": "DoesNotExist"}, {"none"}),
    ({"key": "size", "operator": "Gt", "values": ["1"]}, {"n2", "n3"}),
    ({"key": "size", "operator": "Lt", "values": ["3"]}, {"n1", "n2"}),
])
def test_required_node_affinity_operators(expr: dict[str, Any], expected: set[str]) -> None:
    c = cache_of(node("n1", labels={"size": "1"}), node("n2", labels={"size": "2"}),
                 node("n3", labels={"size": "3"}), node("none"))
    assert feasible(pod(affinity=required({"matchExpressions": [expr]})), c) == expected


def test_terms_are_ored_and_expressions_anded() -> None:
    c = cache_of(node("a", labels={"x": "1", "y": "1"}), node("b", labels={"x": "1"}),
                 node("c", labels={"z": "1"}))
    anded = required({"matchExpressions": [{"key": "x", "operator": "Exists"},
                                           {"key": "y", "operator": "Exists"}]})
    assert feasible(pod(affinity=anded), c) == {"a"}
    ored = required({"matchExpressions": [{"key": "y", "operator": "Exists"}]},
                    {"matchExpressions": [{"key": "z", "operator": "Exists"}]})
    assert feasible(pod(affinity=ored), c) == {"a", "c"}
    # nodeSelector and affinity must both be satisfied
    both = pod(affinity=ored, nodeSelector={"x": "1"})
    assert feasible(both, c) == {"a"}
    # an empty term matches no node
    assert feasible(pod(affinity=required({})), c) == set()


def test_match_fields_metadata_name() -> None:
    c = cache_of(node("a"), node("b"))
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
    assert feasible(pod(affinity=required(term)), c) == {"b"}


# https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#node-affinity-weight
def test_preferred_node_affinity_weights() -> None:
    c = cache_of(node("spot", labels={"cap": "spot"}), node("od", labels={"cap": "od"}),
                 node("gpu", labels={"cap": "od", "gpu": "1"}))
    prefs = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "cap", "operator": "In",
                                                            "values": ["spot"]}]}},
        {"weight": 50, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}},
    ]}}
    result = run(pod(affinity=prefs), c)
    assert result.node == "gpu"
    assert result.scores["spot"] > result.scores["od"]


# https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/ (LeastAllocated)
def test_least_allocated_prefers_emptier_node() -> None:
    c = cache_of(node("busy"), node("idle"), bound=[(pod("a", cpu="3", memory="6Gi"), "busy")])
    assert run(pod(cpu="100m"), c).node == "idle"
    info = scheduler.PodInfo.from_pod(pod(cpu="1", memory="2Gi"))
    idle = c.nodes["idle"]
    # (4000-1000)/4000*100 = 75, (8Gi-2Gi)/8Gi*100 = 75 -> 75
    assert scheduler.score_least_allocated(info, idle) == 75


def spread(key: str, skew: int = 1, when: str = "DoNotSchedule", **extra: Any) -> dict[str, Any]:
    return {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": {"app": "web"}}, **extra}


WEB = {"app": "web"}


# https://kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints/
def test_topology_spread_do_not_schedule_max_skew() -> None:
    c = cache_of(node("a1", zone="a"), node("a2", zone="a"), node("b1", zone="b"),
                 bound=[(pod("w1", labels=WEB), "a1"), (pod("w2", labels=WEB), "a2"),
                        (pod("w3", labels=WEB), "b1")])
    p = pod(labels=WEB, topologySpreadConstraints=[spread(ZONE)])
    # zone a has 2, zone b has 1: placing in a gives skew 3-1=2 > 1
    assert feasible(p, c) == {"b1"}
    assert run(p, c).node == "b1"
    relaxed = pod(labels=WEB, topologySpreadConstraints=[spread(ZONE, skew=2)])
    assert feasible(relaxed, c) == {"a1", "a2", "b1"}
    # pods of other apps and other namespaces do not count
    other = pod(labels={"app": "web"}, ns="other", topologySpreadConstraints=[spread(ZONE)])
    assert feasible(other, c) == {"a1", "a2", "b1"}


def test_topology_spread_missing_label_and_min_domains() -> None:
    unlabeled = node("x")
    del unlabeled["metadata"]["labels"][ZONE]
    c = cache_of(node("a1", zone="a"), unlabeled, bound=[(pod("w1", labels=WEB), "a1")])
    p = pod(labels=WEB, topologySpreadConstraints=[spread(ZONE)])
    result = run(p, c)
    assert result.reasons[
        "node(s) didn't match pod topology spread constraints (missing required label)"] == 1
    # one domain, skew 1: zone a (1 pod) + 1 - min 1 = 1 <= 1 fits
    assert feasible(p, c) == {"a1"}
    # minDomains 2 with only 1 domain: the global minimum is 0, so skew is 2 > 1
    p_min = pod(labels=WEB, topologySpreadConstraints=[spread(ZONE, minDomains=2)])
    assert feasible(p_min, c) == set()


def test_topology_spread_node_affinity_policy() -> None:
    c = cache_of(node("a1", zone="a", labels={"pool": "x"}), node("b1", zone="b", labels={"pool": "y"}),
                 bound=[(pod("w1", labels=WEB), "b1"), (pod("w2", labels=WEB), "b1")])
    # Honor (default): zone b is not eligible for this pod, so only zone a counts
    honor = pod(labels=WEB, nodeSelector={"pool": "x"}, topologySpreadConstraints=[spread(ZONE)])
    assert feasible(honor, c) == {"a1"}
    # Honor with zone a counted alone: skew 1-0 fits; with Ignore, zone b (0) counts too
    c2 = cache_of(node("a1", zone="a", labels={"pool": "x"}), node("b1", zone="b", labels={"pool": "y"}),
                  bound=[(pod("w1", labels=WEB), "a1")])
    honor2 = pod(labels=WEB, nodeSelector={"pool": "x"}, topologySpreadConstraints=[spread(ZONE)])
    assert feasible(honor2, c2) == {"a1"}  # only zone a is counted: skew 2-2=0
    ignore2 = pod(labels=WEB, nodeSelector={"pool": "x"},
                  topologySpreadConstraints=[spread(ZONE, nodeAffinityPolicy="Ignore")])
    assert feasible(ignore2, c2) == set()  # zone b (0) counts: skew 2-0=2


def test_topology_spread_node_taints_policy() -> None:
    tainted = node("b1", zone="b", taints=[{"key": "k", "effect": "NoSchedule"}])
    c = cache_of(node("a1", zone="a"), tainted, bound=[(pod("w1", labels=WEB), "a1")])
    ignore = pod(labels=WEB, topologySpreadConstraints=[spread(ZONE)])
    assert feasible(ignore, c) == set()  # zone b (0 pods) counts; a would be skew 2
    honor = pod(labels=WEB, topologySpreadConstraints=[spread(ZONE, nodeTaintsPolicy="Honor")])
    assert feasible(honor, c) == {"a1"}


def test_topology_spread_match_label_keys() -> None:
    c = cache_of(node("a1", zone="a"), node("b1", zone="b"),
                 bound=[(pod("old1", labels={**WEB, "hash": "old"}), "a1"),
                        (pod("old2", labels={**WEB, "hash": "old"}), "a1")])
    plain = pod(labels={**WEB, "hash": "new"}, topologySpreadConstraints=[spread(ZONE)])
    assert feasible(plain, c) == {"b1"}
    keyed = pod(labels={**WEB, "hash": "new"},
                topologySpreadConstraints=[spread(ZONE, matchLabelKeys=["hash"])])
    assert feasible(keyed, c) == {"a1", "b1"}


def test_topology_spread_schedule_anyway_scores() -> None:
    c = cache_of(node("a1", zone="a"), node("b1", zone="b"),
                 bound=[(pod("w1", labels=WEB), "a1"), (pod("w2", labels=WEB), "a1")])
    p = pod(labels=WEB, topologySpreadConstraints=[spread(HOST, when="ScheduleAnyway")])
    assert feasible(p, c) == {"a1", "b1"}
    result = run(p, c)
    assert result.node == "b1"
    assert result.scores["b1"] > result.scores["a1"]


def test_selector_counts_follow_pod_changes() -> None:
    c = cache_of(node("a1", zone="a"), node("b1", zone="b"))
    p = pod(labels=WEB, topologySpreadConstraints=[spread(ZONE)])
    assert feasible(p, c) == {"a1", "b1"}
    c.set_pod({**pod("w1", labels=WEB), "spec": {"nodeName": "a1", "containers": []}})
    assert feasible(p, c) == {"b1"}
    # a terminating pod no longer counts for spreading
    c.set_pod({**pod("w1", labels=WEB), "spec": {"nodeName": "a1", "containers": []},
               "metadata": {"name": "w1", "namespace": "default", "labels": WEB,
                            "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert feasible(p, c) == {"a1", "b1"}


# https://kubernetes.io/docs/concepts/scheduling-eviction/scheduler-perf-tuning/
def test_percentage_of_nodes_to_score() -> None:
    assert scheduler.num_feasible_nodes_to_find(50) == 50
    assert scheduler.num_feasible_nodes_to_find(1000) == 420
    assert scheduler.num_feasible_nodes_to_find(5000) == 500
    assert scheduler.num_feasible_nodes_to_find(200, 10) == 100


def test_ties_are_broken_by_the_seeded_rng() -> None:
    c = cache_of(*(node(f"n{i}") for i in range(8)))
    info = scheduler.PodInfo.from_pod(pod())
    a = [scheduler.schedule(info, c, rng=random.Random(7)).node for _ in range(3)]
    b = [scheduler.schedule(info, c, rng=random.Random(7)).node for _ in range(3)]
    assert a == b
    picks = {scheduler.schedule(info, c, rng=random.Random(s)).node for s in range(30)}
    assert len(picks) > 1


# Upstream requeues unschedulable pods on a node update only when the update changes what
# scheduling reads (nodeSchedulingPropertiesChange, pkg/scheduler/eventhandlers.go:
# unschedulable, allocatable, labels, taints, condition statuses, annotations); a status
# write that changes none of them (a heartbeat) moves no pod.
def test_a_node_update_reports_whether_it_changes_what_scheduling_reads() -> None:
    c = scheduler.Cache()
    base = node("a")
    assert c.set_node(base) is True  # a new node
    heartbeat = node("a")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:10Z"
    heartbeat["status"]["nodeInfo"] = {"kubeletVersion": "v1.32.0"}
    assert c.set_node(heartbeat) is False
    pressure = node("a")
    pressure["status"]["conditions"].append({"type": "MemoryPressure", "status": "True"})
    annotated = node("a")
    annotated["metadata"]["annotations"] = {"example.com/x": "1"}
    for changed in (node("a", labels={"x": "y"}), node("a", cpu="8"), node("a", unschedulable=True),
                    node("a", taints=[{"key": "k", "effect": "NoSchedule"}]), node("a", ready=False),
                    pressure, annotated):
        assert c.set_node(changed) is True
        assert c.set_node(base) is True  # and back


def test_a_heartbeat_keeps_unschedulable_pods_waiting() -> None:
    from spotguard_sim import store as store_mod
    from spotguard_sim.controllers import scheduling

    loop = scheduling.SchedulerLoop(store_mod.Store())
    loop.handle("ADDED", "nodes", node("a"))
    loop._unschedulable[("default", "big")] = 0
    heartbeat = node("a")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:10Z"
    loop.handle("MODIFIED", "nodes", heartbeat)
    assert set(loop._unschedulable) == {("default", "big")} and not loop._active
    loop.handle("MODIFIED", "nodes", node("a", cpu="8"))  # more room: retried
    assert not loop._unschedulable and [key for _, _, key in loop._active] == [("default", "big")]


def test_a_pod_pinned_to_a_node_by_name_is_filtered_as_before() -> None:
    """NodeAffinity's PreFilter (matchFields metadata.name, a DaemonSet pod's) limits the
    nodes searched; the decision and the reasons when it fits nowhere are unchanged."""
    pinned = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}
    c = cache_of(node("a"), node("b", cpu="1"), node("c", unschedulable=True))
    assert scheduler.pinned_node_names(scheduler.PodInfo.from_pod(pod(affinity=pinned))) == {"b"}
    assert run(pod(affinity=pinned), c).node == "b"
    result = run(pod(cpu="2", affinity=pinned), c)
    assert result.node is None
    assert result.message(3) == ("0/3 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match "
                                 "Pod's node affinity/selector, 1 node(s) were unschedulable.")


# SelectVictimsOnNode (pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go)
# runs the filters with the nominated pods (RunFilterPluginsWithNominatedPods): room a first
# preemption freed for its preemptor is not counted again by a second preemptor of no higher
# priority, which preempts elsewhere (or nowhere) instead.
def test_a_preemption_does_not_count_on_room_nominated_to_another_preemptor() -> None:
    c = cache_of(node("a", cpu="2"), node("b", cpu="2"),
                 bound=[(pod("low-a", cpu="1500m", priority=0), "a"), (pod("low-b", cpu="1800m", priority=0), "b")])
    vip = scheduler.PodInfo.from_pod(pod("vip", cpu="1500m", priority=100))
    # alone, node a is the cheaper preemption (the same victim count, a's victim asks less)
    first = scheduler.preempt(vip, c)
    assert first is not None and first.node == "a"
    # WHEN another preemptor of equal priority was nominated to a (its victim still going)
    held = {"a": Counter({"cpu": 1500, "pods": 1})}
    second = scheduler.preempt(vip, c, nominated=held)
    # THEN a is full once the nominee counts: b's victim goes instead
    assert second is not None and second.node == "b"


# NodeResourcesBalancedAllocation (weight 1, pkg/scheduler/apis/config/v1/default_plugins.go),
# as kube-scheduler 1.35's pkg/scheduler/framework/plugins/noderesources/balanced_allocation.go
# (balancedResourceScorer) and resource_allocation.go (useRequested: the pods' own requests):
# https://kubernetes.io/docs/reference/scheduling/config/#scheduling-plugins
def test_balanced_allocation_breaks_a_least_allocated_tie_toward_the_balanced_node() -> None:
    # GIVEN two nodes where the pod (500m, 1Gi) would leave the same free share on average:
    # "lopsided" at 25 % cpu and 75 % memory, "even" at 50 % and 50 % (LeastAllocated 50 both)
    c = cache_of(node("lopsided"), node("even"),
                 bound=[(pod("a", cpu="500m", memory="5Gi"), "lopsided"),
                        (pod("b", cpu="1500m", memory="3Gi"), "even")])
    incoming = pod(cpu="500m", memory="1Gi")
    info = scheduler.PodInfo.from_pod(incoming)
    assert [scheduler.score_least_allocated(info, c.nodes[n]) for n in ("lopsided", "even")] == [50, 50]
    # WHEN it is scheduled (no other score tells them apart)
    result = run(incoming, c)
    # THEN the node where cpu and memory stay balanced wins, by BalancedAllocation's 25 points
    assert result.node == "even"
    assert result.scores["even"] - result.scores["lopsided"] == 25


def test_balanced_allocation_scores_as_upstream_formula() -> None:
    """Worked examples of ``int((1 - |f_cpu - f_mem| / 2) * 100)``, each fraction the node's
    requests with the pod's over allocatable, capped at 1."""
    # cpu (1500m + 1000m) / 4000m = 0.625, memory (1Gi + 512Mi) / 8Gi = 0.1875:
    # std 0.21875, (1 - 0.21875) * 100 = 78.125 -> 78
    c = cache_of(node("n", cpu="4", memory="8Gi"), bound=[(pod("a", cpu="1500m", memory="1Gi"), "n")])
    assert scheduler.score_balanced_allocation(scheduler.PodInfo.from_pod(pod(cpu="1", memory="512Mi")),
                                               c.nodes["n"]) == 78
    # cpu 920m / 1000m = 0.92, memory 80Mi / 1000Mi = 0.08: std 0.42000000000000004,
    # (1 - std) * 100 = 57.99999999999999, truncated as Go's int64() does -> 57 (not 58)
    c = cache_of(node("n", cpu="1", memory="1000Mi"), bound=[(pod("a", cpu="420m", memory="40Mi"), "n")])
    assert scheduler.score_balanced_allocation(scheduler.PodInfo.from_pod(pod(cpu="500m", memory="40Mi")),
                                               c.nodes["n"]) == 57
    # the pod's own requests, not the non-zero defaults (100m, 200Mi) LeastAllocated counts:
    # cpu 0 + 0, memory 4Gi / 8Gi: std 0.25 -> 75
    only_memory = scheduler.PodInfo.from_pod(pod(memory="4Gi"))
    assert scheduler.score_balanced_allocation(only_memory, cache_of(node("n")).nodes["n"]) == 75
    # a fraction above 1 counts as 1 (cpu 6 / 4 -> 1, memory 0.5): std 0.25 -> 75
    c = cache_of(node("n"), bound=[(pod("a", cpu="5"), "n")])
    assert scheduler.score_balanced_allocation(scheduler.PodInfo.from_pod(pod(cpu="1", memory="4Gi")),
                                               c.nodes["n"]) == 75
    # a resource the node has none of is left out: one fraction, std 0 -> 100
    assert scheduler.score_balanced_allocation(
        scheduler.PodInfo.from_pod(pod(cpu="1", memory="1Gi")),
        cache_of(node("n", memory="0")).nodes["n"]) == 100
    # a pod requesting neither is skipped (PreScore returns Skip: isBestEffortPod)
    assert scheduler.score_balanced_allocation(scheduler.PodInfo.from_pod(pod()), c.nodes["n"]) == 0


def test_kept_resource_scores_follow_binds_and_deletions() -> None:
    """LeastAllocated plus BalancedAllocation, kept per node and pod size, equal the direct
    formulas after every bind and deletion (the kept score of the node that changed is dropped)."""
    c = cache_of(node("a"), node("b", cpu="8", memory="16Gi"))
    incoming = pod(cpu="500m", memory="1Gi")
    info = scheduler.PodInfo.from_pod(incoming)

    def check() -> None:
        want = {n: scheduler.score_least_allocated(info, c.nodes[n]) + scheduler.score_balanced_allocation(
            info, c.nodes[n]) + 300 for n in ("a", "b")}  # + TaintToleration's 100 * 3 (no taint)
        assert run(incoming, c).scores == want

    check()
    for i, (cpu, memory, where) in enumerate([("1", "6Gi", "a"), ("3", "1Gi", "b"), ("250m", "128Mi", "a")]):
        bound = pod(f"x{i}", cpu=cpu, memory=memory)
        c.set_pod({**bound, "spec": {**bound["spec"], "nodeName": where}})
        check()
    c.remove_pod("default", "x0")
    check()


# ImageLocality (weight 1), as kube-scheduler 1.35's
# pkg/scheduler/framework/plugins/imagelocality/image_locality.go and the scheduler cache's
# image states (addNodeImageStates): node.status.images
MB = 1024 * 1024


def with_images(n: dict[str, Any], *images: tuple[list[str], int]) -> dict[str, Any]:
    n["status"]["images"] = [{"names": names, "sizeBytes": size} for names, size in images]
    return n


def image_pod(*images: str, **extra: Any) -> dict[str, Any]:
    p = pod(cpu="100m", memory="128Mi", **extra)
    p["spec"]["containers"] = [{"name": f"c{i}", "image": image, "resources": {"requests": {
        "cpu": "100m", "memory": "128Mi"}}} for i, image in enumerate(images)]
    return p


def test_image_locality_sends_a_pod_to_the_node_holding_its_image() -> None:
    # GIVEN three equal nodes, the last one reporting the pod's image (500 MiB)
    c = cache_of(node("x"), node("y"), with_images(node("z"), (["registry.example/app:1.0"], 500 * MB)))
    # WHEN the pod is scheduled
    result = run(image_pod("registry.example/app:1.0"), c)
    # THEN it goes there: int(500 MiB * 1/3) = 174762666, 100 * (174762666 - 23 MiB) // (1000 MiB - 23 MiB) = 14
    assert result.node == "z"
    assert result.scores["z"] - result.scores["x"] == 14


def test_image_locality_scores_as_upstream_formula() -> None:
    """``calculatePriority(sumImageScores)``: per image on the node its size times the share
    of nodes reporting it (truncated), summed; clamped to [23 MiB, 1000 MiB per container];
    scaled to 0..100."""
    a = with_images(node("a"), (["gcr.io/40:latest", "gcr.io/40:v1"], 40 * MB), (["gcr.io/300:latest"], 300 * MB),
                    (["gcr.io/2000:latest"], 2000 * MB))
    b = with_images(node("b"), (["gcr.io/250:latest"], 250 * MB), (["gcr.io/10:latest"], 10 * MB))
    c = cache_of(a, b, node("empty"))

    def scores(p: dict[str, Any]) -> list[int]:
        info = scheduler.PodInfo.from_pod(p)
        return [scheduler.score_image_locality(info, c.nodes[n], c) for n in ("a", "b", "empty")]

    # a: int(40 MiB / 3) + int(300 MiB / 3) = 13981013 + 104857600 = 118838613;
    # 100 * (118838613 - 24117248) // (2 * 1048576000 - 24117248) = 4 (two containers)
    assert scores(image_pod("gcr.io/40", "gcr.io/300")) == [4, 0, 0]  # "gcr.io/40" is "gcr.io/40:latest"
    # a: int(2000 MiB / 3) = 699050666; 100 * (699050666 - 23 MiB) // (1000 MiB - 23 MiB) = 65
    assert scores(image_pod("gcr.io/2000")) == [65, 0, 0]
    # b: int(10 MiB / 3) below 23 MiB: 0
    assert scores(image_pod("gcr.io/10")) == [0, 0, 0]
    # init containers and image volumes count (the volume does not raise the bound in 1.35):
    # int(250 MiB / 3) * 2 = 174762666; 100 * (174762666 - 23 MiB) // (2000 MiB - 23 MiB) = 7
    both = image_pod("gcr.io/250", volumes=[{"name": "v", "image": {"reference": "gcr.io/250:latest"}}])
    both["spec"]["initContainers"] = [{"name": "i", "image": "busybox"}]
    assert scores(both) == [0, 7, 0]
    # an image on more nodes weighs more (the spread factor): 250 MiB on 2 of 3 nodes
    c.set_node(with_images(node("a"), (["gcr.io/250:latest"], 250 * MB)))
    # int(250 MiB * 2/3) = 174762666; 100 * (174762666 - 23 MiB) // (1000 MiB - 23 MiB) = 14
    assert scores(image_pod("gcr.io/250")) == [14, 14, 0]
    # above 1000 MiB per container the score is clamped: int(2000 MiB * 2/3) on a and b -> 100
    c.set_node(with_images(node("a"), (["gcr.io/big:latest"], 2000 * MB)))
    c.set_node(with_images(node("b"), (["gcr.io/big:latest"], 2000 * MB)))
    assert scores(image_pod("gcr.io/big")) == [100, 100, 0]


def test_node_images_update_the_scores_without_requeueing() -> None:
    """status.images is read by ImageLocality only: an update of them alone moves no
    unschedulable pod (nodeSchedulingPropertiesChange ignores them), but is scored."""
    c = cache_of(node("a"), node("b"))
    p = image_pod("app:1")
    assert run(p, c).node == "a"  # a tie: the first
    assert c.set_node(with_images(node("b"), (["app:1"], 900 * MB))) is False
    assert run(p, c).node == "b"
    c.set_node(node("b"))  # the image gone from b
    assert run(p, c).node == "a"
    # a node that goes takes its images out of the counts: with b gone and c holding the
    # image, it is on 1 node of 2: int(900 MiB / 2) = 471859200 -> 100 * (471859200 - 23 MiB)
    # // (1000 MiB - 23 MiB) = 43 (b still counted: 2 of 2, 89)
    c.set_node(with_images(node("b"), (["app:1"], 900 * MB)))
    c.remove_node("b")
    c.set_node(with_images(node("c"), (["app:1"], 900 * MB)))
    assert scheduler.score_image_locality(scheduler.PodInfo.from_pod(p), c.nodes["c"], c) == 43
