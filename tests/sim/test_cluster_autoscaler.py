"""Cluster Autoscaler node groups in the simulated cluster, against kubernetes/autoscaler's FAQ
(scan interval, expanders, scale-down utilization and unneeded time, backoff; docs/sim.md)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from spotguard.logs import UserError
from spotguard_sim import billing, capacity, catalogue, nodegroups, objects, testing
from spotguard_sim import settings as settings_mod
from spotguard_sim.controllers import provisioner

from tests.sim import controller_helpers as h
from tests.sim.test_karpenter import deployment, ready_pods

SCALE = 20.0


def group(name: str, instance_type: str = "m5.xlarge", capacity_type: str = "on-demand", *,
          min_size: int = 0, max_size: int = 5) -> nodegroups.NodeGroup:
    return nodegroups.NodeGroup(name, catalogue.TYPES[instance_type], capacity_type, min_size, max_size)


def settings(*groups: nodegroups.NodeGroup, **fields: Any) -> settings_mod.Settings:
    extra = {k: fields.pop(k) for k in ("refusals", "prices") if k in fields}
    return settings_mod.Settings(capacity=capacity.Capacity(
        cluster_autoscaler=nodegroups.ClusterAutoscaler(node_groups=groups, **fields), **extra))


def group_nodes(sim: testing.SimCluster, name: str | None = None) -> list[dict[str, Any]]:
    return [n for n in sim.store.list("nodes")[0]
            if (name or n["metadata"]["labels"].get(nodegroups.NODEGROUP)) == n["metadata"]["labels"].get(
                nodegroups.NODEGROUP)]


def test_min_size_nodes_exist_from_the_start_labelled_as_an_eks_node_group() -> None:
    with testing.running_cluster([], time_scale=SCALE, settings=settings(group("od", min_size=2))) as sim:
        nodes = h.wait_for(lambda: group_nodes(sim, "od"), what="nodes")
        assert len(nodes) == 2
        labels = nodes[0]["metadata"]["labels"]
        assert labels["eks.amazonaws.com/capacityType"] == "ON_DEMAND"
        assert labels["node.kubernetes.io/instance-type"] == "m5.xlarge"
        assert {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes} == {"us-east-1a", "us-east-1b"}


def test_unschedulable_pods_scale_a_group_up_by_the_nodes_they_need_within_max() -> None:
    # 5 pods of 1.5 CPU: two fit an m5.xlarge (3920m); max 2 nodes: one pod stays Pending
    with testing.running_cluster([deployment("web", 5, cpu="1500m")], time_scale=SCALE,
                                 settings=settings(group("od", max_size=2))) as sim:
        h.wait_for(lambda: ready_pods(sim, "web") == 4, timeout=40, what="four pods Ready")
        time.sleep(sim.clock.real(25))
        assert len(group_nodes(sim, "od")) == 2
        assert ready_pods(sim, "web") == 4
        assert {(s.instance_type, s.capacity_type) for s in billing.of(sim.store).spans()} == {
            ("m5.xlarge", "on-demand")}


def test_least_waste_and_price_expanders_choose_differently() -> None:
    small = group("small-od", "m5.large")
    cheap = group("cheap-spot", "m5.xlarge", "spot")
    prices = catalogue.Prices({"m5.xlarge": {"spot": 0.05}})
    chosen = {}
    for expander in ("least-waste", "price"):
        with testing.running_cluster([deployment("web", 1)], time_scale=SCALE,
                                     settings=settings(small, cheap, expander=expander, prices=prices)) as sim:
            h.wait_for(lambda s=sim: ready_pods(s, "web") == 1, timeout=40, what="pod Ready")
            chosen[expander] = {n["metadata"]["labels"][nodegroups.NODEGROUP] for n in group_nodes(sim)}
    # least-waste: 1 CPU leaves less idle on an m5.large; price: the spot m5.xlarge at $0.05 is cheaper
    assert chosen == {"least-waste": {"small-od"}, "price": {"cheap-spot"}}


def test_a_refused_group_backs_off_and_another_group_scales_up() -> None:
    cfg = settings(group("spot", capacity_type="spot"), group("od", "m5.2xlarge"), expander="least-waste",
                   refusals=(capacity.Refusal("spot"),))
    # least-waste prefers the spot m5.xlarge for one 1-CPU pod; it is refused, so the next scan takes od
    with testing.running_cluster([deployment("web", 1)], time_scale=SCALE, settings=cfg) as sim:
        h.wait_for(lambda: ready_pods(sim, "web") == 1, timeout=40, what="pod Ready")
        assert {n["metadata"]["labels"][nodegroups.NODEGROUP] for n in group_nodes(sim)} == {"od"}
        ca = next(c for c in sim.controllers.controllers if c.name == "cluster-autoscaler")
        assert "spot" in ca._backoff


def test_unneeded_nodes_go_after_the_unneeded_time_down_to_min_size() -> None:
    cfg = settings(group("od", min_size=1), scale_down=nodegroups.ScaleDown(unneeded_time=30.0, delay_after_add=0.0))
    with testing.running_cluster([deployment("web", 2, cpu="3")], time_scale=SCALE, settings=cfg) as sim:
        h.wait_for(lambda: ready_pods(sim, "web") == 2, timeout=40, what="pods Ready")
        assert len(group_nodes(sim, "od")) == 2
        sim.store.mutate("deployments", "web", "default", lambda d: d["spec"].update(replicas=0))
        h.wait_for(lambda: not h.pods_of(sim.store, "web"), timeout=20, what="pods gone")
        emptied = sim.clock.now()
        h.wait_for(lambda: len(group_nodes(sim, "od")) == 1, timeout=60, what="scaled down to min")
        assert sim.clock.now() - emptied >= 29.0
        time.sleep(sim.clock.real(45))
        assert len(group_nodes(sim, "od")) == 1  # never below minSize


def test_a_node_above_the_utilization_threshold_or_with_an_unsafe_pod_stays() -> None:
    cfg = settings(group("od"), scale_down=nodegroups.ScaleDown(unneeded_time=20.0, delay_after_add=0.0))
    busy = deployment("busy", 1, cpu="2500m")  # 2500m / 3920m: above 0.5
    pinned = deployment("pinned", 1, cpu="500m")
    pinned["spec"]["template"]["metadata"]["annotations"] = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    with testing.running_cluster([busy], time_scale=SCALE, settings=cfg) as sim:
        h.wait_for(lambda: ready_pods(sim, "busy") == 1, timeout=40, what="busy Ready")
        sim.store.create("deployments", pinned, namespace="default")
        h.wait_for(lambda: ready_pods(sim, "pinned") == 1, timeout=40, what="pinned Ready")
        nodes = {n["metadata"]["name"] for n in group_nodes(sim, "od")}
        time.sleep(sim.clock.real(50))
        assert {n["metadata"]["name"] for n in group_nodes(sim, "od")} == nodes


def test_a_scale_down_whose_evictions_are_refused_fails_after_the_max_pod_eviction_time() -> None:
    # GIVEN two od nodes holding one pod of web each (1500m of 3920m: unneeded, each fits the
    # other), and a budget that allows one disruption (the autoscaler checks it before it
    # picks a node)
    cfg = settings(group("od", min_size=1), scale_down=nodegroups.ScaleDown(unneeded_time=20.0, delay_after_add=0.0))
    with testing.running_cluster([deployment("web", 3, cpu="1500m"), objects.pdb("web", "web", min_available=1)],
                                 time_scale=SCALE, settings=cfg) as sim:
        h.wait_for(lambda: ready_pods(sim, "web") == 3, timeout=40, what="pods Ready")
        sim.store.mutate("deployments", "web", "default", lambda d: d["spec"].update(replicas=2))
        h.wait_for(lambda: ready_pods(sim, "web") == 2 and len(h.pods_of(sim.store, "web")) == 2, timeout=20,
                   what="one pod per node")
        nodes = {n["metadata"]["name"] for n in group_nodes(sim, "od")}
        assert len(nodes) == 2

        def tainted() -> set[str]:
            return {n["metadata"]["name"] for n in group_nodes(sim, "od")
                    if any(t.get("key") == "ToBeDeletedByClusterAutoscaler" for t in n["spec"].get("taints") or [])}

        # WHEN the autoscaler scales one down and its eviction is refused (429) again and again:
        # the budget tightened the moment the node is picked (in the autoscaler's own write, before
        # its first eviction), as a webhook or another drain would
        def tighten(budget: dict[str, Any]) -> None:
            budget["spec"]["minAvailable"] = 2
            budget.setdefault("status", {})["disruptionsAllowed"] = 0

        drain_began: list[float] = []

        def picked(event_type: str, resource: str, obj: dict[str, Any]) -> None:
            if any(t.get("key") == "ToBeDeletedByClusterAutoscaler" for t in obj["spec"].get("taints") or []):
                if not drain_began:
                    drain_began.append(sim.clock.now())  # the taint's write: when the drain began
                sim.store.mutate("poddisruptionbudgets", "web", "default", tighten)

        sim.store.subscribe(picked, ["nodes"])
        h.wait_for(tainted, timeout=60, what="a scale-down")
        # (from the taint's write, not from when this poll saw it: a poll is up to a fraction of a
        # simulated second late under load, and the bound below is the give-up's own)
        began = drain_began[0]
        # THEN the Auto Scaling group launches no replacement while the node drains (its instance
        # is still the group's until the autoscaler terminates it)
        seen: set[str] = set()

        def given_up() -> bool:
            seen.update(n["metadata"]["name"] for n in group_nodes(sim, "od"))
            return not tainted()

        # AND after maxPodEvictionTime (2 min) it gives up: the taint goes, the node stays
        h.wait_for(given_up, timeout=30, what="the scale-down given up")
        assert seen == nodes, f"launched while the node drained: {sorted(seen - nodes)}"
        gave_up = sim.clock.now()
        assert 119.0 <= gave_up - began <= 120.0 + 10.0 + 2.0, gave_up - began
        assert {n["metadata"]["name"] for n in group_nodes(sim, "od")} == nodes
        assert ready_pods(sim, "web") == 2
        # AND no scale-down is tried for scaleDownDelayAfterFailure (3 min)
        while sim.clock.now() - gave_up < 170.0:
            assert not tainted(), f"a scale-down {sim.clock.now() - gave_up:.0f} s after the failure"
            time.sleep(0.05)
        # AND after it, with the budget relaxed, the node goes
        sim.store.unsubscribe(picked)
        sim.store.mutate("poddisruptionbudgets", "web", "default", lambda b: b["spec"].update(minAvailable=1))
        h.wait_for(lambda: len(group_nodes(sim, "od")) == 1, timeout=40, what="scaled down after the delay")
        assert sim.clock.now() - gave_up >= 180.0


def test_without_node_groups_the_autoscaler_starts_nothing() -> None:
    with testing.running_cluster([deployment("web", 1)], time_scale=SCALE) as sim:
        ca = next(c for c in sim.controllers.controllers if c.name == "cluster-autoscaler")
        assert ca._threads == []
        time.sleep(sim.clock.real(15))
        assert sim.store.list("nodes")[0] == []


def test_the_auto_scaling_group_replaces_a_reclaimed_spot_node() -> None:
    # GIVEN a spot group holding 2 nodes (its desired capacity) WHEN EC2 reclaims one
    with testing.running_cluster([], time_scale=SCALE, settings=settings(group("spot", capacity_type="spot",
                                                                               min_size=2))) as sim:
        nodes = h.wait_for(lambda: len(group_nodes(sim, "spot")) == 2 and group_nodes(sim, "spot"), what="nodes")
        lost = nodes[0]["metadata"]["name"]
        sim.reclaim([lost], after_seconds=1.0)
        # THEN the node goes (its instance terminated) and the group launches a replacement
        h.wait_for(lambda: lost not in {n["metadata"]["name"] for n in group_nodes(sim, "spot")}, timeout=30,
                   what="the reclaimed node deleted")
        h.wait_for(lambda: sum(1 for n in group_nodes(sim, "spot") if h.is_ready(n)) == 2, timeout=30,
                   what="a replacement Ready")


def _node(name: str, *, ready: bool = True, cpu: str = "4") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": "a"}},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _pod(name: str, cpu: str, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def test_a_pending_pod_that_fits_an_existing_node_triggers_no_scale_up() -> None:
    # GIVEN a Ready node with 1 cpu free (3 of 4 taken), a NotReady one that is empty
    nodes = [_node("a"), _node("booting", ready=False)]
    on = {"a": [_pod("running", "3")], "booting": []}
    fits, second, elsewhere = _pod("fits", "1"), _pod("second", "1"), _pod("elsewhere", "500m", {"pool": "b"})
    # WHEN the scan filters the pending pods (upstream's FilterOutSchedulablePodListProcessor)
    left = nodegroups.not_schedulable_now([fits, second, elsewhere], nodes, lambda n: on[n])
    # THEN the first fits node a and needs nothing; the second no longer fits after it, and
    # the third's selector matches no node: those two are what a scale-up is for
    assert [p["metadata"]["name"] for p in left] == ["second", "elsewhere"]


# -- expendable pods: --expendable-pods-priority-cutoff (default -10) ----------------------------
# kubernetes/autoscaler cluster-autoscaler/core/utils/expendable.go (IsExpendablePod: a priority
# set and *below* the cutoff), core/podlistprocessor/filter_out_expendable.go (no scale-up),
# core/static_autoscaler.go and core/scaledown/actuation/actuator.go (left out of the snapshot:
# no room taken, never keep a node, not drained)


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "preemptionPolicy": "Never"}


def with_priority(obj: dict[str, Any], class_name: str) -> dict[str, Any]:
    obj["spec"]["template"]["spec"]["priorityClassName"] = class_name
    return obj


CLASSES = [priority_class("below", -11), priority_class("at-default", -10)]


def test_pods_below_the_cutoff_scale_nothing_up_and_pods_at_it_do() -> None:
    # GIVEN an on-demand group at 0 nodes and the default cutoff (-10)
    with testing.running_cluster(CLASSES, time_scale=SCALE, settings=settings(group("od"))) as sim:
        # WHEN a pod of priority -11 is Pending THEN no node is launched for it (three scans and more)
        sim.store.create("deployments", with_priority(deployment("low", 1), "below"), namespace="default")
        h.wait_for(lambda: any(provisioner.unschedulable(p) for p in h.pods_of(sim.store, "low")), timeout=20,
                   what="low marked unschedulable")
        time.sleep(sim.clock.real(40))
        assert group_nodes(sim, "od") == [] and billing.of(sim.store).spans() == []
        # WHEN a pod of priority -10 (not below the cutoff) is Pending THEN the group scales up for it
        sim.store.create("deployments", with_priority(deployment("placeholder", 1), "at-default"),
                         namespace="default")
        h.wait_for(lambda: ready_pods(sim, "placeholder") == 1, timeout=40, what="placeholder Ready")
        assert len(group_nodes(sim, "od")) == 1


def test_with_the_cutoff_raised_to_0_a_pod_at_minus_10_scales_nothing_up() -> None:
    cfg = settings(group("od"), expendable_pods_priority_cutoff=0)
    with testing.running_cluster(CLASSES, time_scale=SCALE, settings=cfg) as sim:
        sim.store.create("deployments", with_priority(deployment("placeholder", 1), "at-default"),
                         namespace="default")
        h.wait_for(lambda: any(provisioner.unschedulable(p) for p in h.pods_of(sim.store, "placeholder")), timeout=20,
                   what="placeholder marked unschedulable")
        time.sleep(sim.clock.real(40))
        assert group_nodes(sim, "od") == []
        # a pod without a class (priority 0, not below 0) still scales the group up
        sim.store.create("deployments", deployment("web", 1), namespace="default")
        h.wait_for(lambda: ready_pods(sim, "web") == 1, timeout=40, what="web Ready")


def test_an_expendable_pod_keeps_no_node_and_gets_no_node_back() -> None:
    # GIVEN web (3 CPU) on the group's one node, and an expendable pod (-11, 500m) beside it
    cfg = settings(group("od"), scale_down=nodegroups.ScaleDown(unneeded_time=20.0, delay_after_add=0.0))
    with testing.running_cluster([*CLASSES, deployment("web", 1, cpu="3")], time_scale=SCALE, settings=cfg) as sim:
        h.wait_for(lambda: ready_pods(sim, "web") == 1, timeout=40, what="web Ready")
        sim.store.create("deployments", with_priority(deployment("low", 1, cpu="500m"), "below"),
                         namespace="default")
        h.wait_for(lambda: ready_pods(sim, "low") == 1, timeout=40, what="low Ready beside web")
        [node] = group_nodes(sim, "od")
        # WHEN web goes THEN the node is removed though the expendable pod runs there (it is not
        # counted, nor moved first: upstream leaves it out of the snapshot and it goes with the node)
        sim.store.mutate("deployments", "web", "default", lambda d: d["spec"].update(replicas=0))
        h.wait_for(lambda: group_nodes(sim, "od") == [], timeout=60, what="the node scaled down")
        # AND the expendable pod, Pending again, gets no node launched for it
        h.wait_for(lambda: any(provisioner.unschedulable(p) for p in h.pods_of(sim.store, "low")), timeout=30,
                   what="low Pending again")
        time.sleep(sim.clock.real(40))
        assert group_nodes(sim, "od") == []
        assert node["metadata"]["name"] not in {n["metadata"]["name"] for n in sim.store.list("nodes")[0]}


def test_the_cutoff_is_a_scenario_setting_that_defaults_to_minus_10() -> None:
    assert nodegroups.from_doc({}, "here").expendable_pods_priority_cutoff == -10
    assert nodegroups.from_doc({"expendablePodsPriorityCutoff": 0}, "here").expendable_pods_priority_cutoff == 0
    with pytest.raises(UserError, match="expendablePodsPriorityCutoff"):
        nodegroups.from_doc({"expendablePodsPriorityCutoff": "-10"}, "here")
    low = {"spec": {"priority": -11}}
    assert nodegroups.expendable(low, -10) and not nodegroups.expendable({"spec": {"priority": -10}}, -10)
    assert not nodegroups.expendable({"spec": {}}, 0)  # no priority: never expendable
