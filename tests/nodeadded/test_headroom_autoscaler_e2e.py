"""On-demand headroom beside the Cluster Autoscaler, end to end (issue 23).

As ``test_headroom_e2e.py`` (the functions served as Knative delivers to them, each as its
service account under the Helm chart's roles, every pod placed by the served admission
webhook), but the nodes are EKS managed node groups the simulated Cluster Autoscaler scales:
an on-demand group of m5.large (1 node at the start, up to 6) and a spot group of m5.xlarge
(2 nodes, fixed). web has 3 replicas of 1.5 CPU: its floor pod fills the on-demand node, the
2 others run on spot.

The Cluster Autoscaler ignores pods whose priority is *below* ``--expendable-pods-priority-cutoff``
(kubernetes/autoscaler ``cluster-autoscaler/core/utils/expendable.go``, ``IsExpendablePod``;
``core/podlistprocessor/filter_out_expendable.go``): at its default (-10) the placeholders
(priority -10) get on-demand nodes launched for them; with the cutoff raised to 0 they never do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.policy import config
from spotguard.policy.headroom import PRIORITY, UNPLACED_SECONDS, Cover
from spotguard_sim import capacity, catalogue, nodegroups, readiness, testing
from spotguard_sim import settings as settings_mod

from tests.interruption import sim_scenario
from tests.nodeadded import harness as h
from tests.nodeadded import test_headroom_e2e as e2e
from tests.nodeadded import test_launch_e2e as launch
from tests.security import test_rbac

SCALE = e2e.SCALE
NS = e2e.NS
WEB = e2e.WEB
OD_GROUP = "on-demand"
ON_DEMAND = nodegroups.NodeGroup(OD_GROUP, catalogue.TYPES["m5.large"], "on-demand", min_size=1, max_size=6)
SPOT = nodegroups.NodeGroup("spot", catalogue.TYPES["m5.xlarge"], "spot", min_size=2, max_size=2)


def cluster_autoscaler(cutoff: int) -> settings_mod.Settings:
    return settings_mod.Settings(capacity=capacity.Capacity(cluster_autoscaler=nodegroups.ClusterAutoscaler(
        node_groups=(ON_DEMAND, SPOT), expendable_pods_priority_cutoff=cutoff)))


def on_demand_nodes(store: Any) -> set[str]:
    return {n["metadata"]["name"] for n in store.list("nodes")[0]
            if (n["metadata"].get("labels") or {}).get(nodegroups.NODEGROUP) == OD_GROUP}


@dataclasses.dataclass
class Outcome:
    replacement_nodes: set[str]  # where web's replacements run (Ready)
    nodes_before: set[str]  # the nodes at the notice
    od_at_start: set[str]  # the on-demand group's nodes before node-added's first pass
    od_before: set[str]  # the on-demand group's nodes at the notice
    od_after: set[str]  # the on-demand group's nodes at the end
    placeholders_before: set[str]  # where the placeholders ran (Ready) at the notice
    placeholders_after: set[str]  # where they run once the autoscaler launched room for them again
    preempted: int  # placeholder pods deleted after the notice
    ever_scheduled: bool  # a placeholder was ever bound to a node
    at_risk: int  # web's replicas on the doomed node: the placeholders wanted
    unplaced: float  # node-added's gauge of placeholders with no room for long, before the notice
    priorities: set[tuple[int, str]]  # (spec.priority, spec.preemptionPolicy) of the placeholders


def cycle(tmp_path: Path, cutoff: int) -> Outcome:
    """web placed; node-added served with ``largest-node`` until its headroom runs (or, when the
    autoscaler never launches for it, for 150 simulated seconds); then a notice for the spot node
    with the most of web's replicas, the reclaim 120 s later."""
    cfg = config.Config(headroom=Cover.LARGEST_NODE)
    objs = [sim_scenario.namespace(NS), sim_scenario.namespace("spotguard"), e2e.shipped_priority_class()]
    with (
        testing.running_cluster(objs, time_scale=SCALE, ready_delay_seconds=e2e.READY_DELAY,
                                settings=cluster_autoscaler(cutoff)) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        h.wait_until(lambda: len(sim.store.list("nodes")[0]) == 3, 30, "the groups' nodes")
        roles = test_rbac.install_rbac(sim, "helm", tmp_path)
        sim.store.apply_objects([launch.deployment(WEB, 3, cpu="1500m")])
        h.wait_until(lambda: e2e.ready_of(sim.store, WEB) == 3, 90, "web Ready")
        caps = launch.capacity_of(sim.store)
        spot: dict[str, int] = {}
        for p in e2e.live(sim.store, NS):
            node = p["spec"]["nodeName"]
            if caps[node] == "spot":
                spot[node] = spot.get(node, 0) + 1
        assert sum(spot.values()) == 2, spot  # the floor on on-demand
        doomed = max(sorted(spot), key=lambda n: spot[n])
        at_risk = spot[doomed]  # largest-node: that many placeholders of 1.5 CPU
        od_at_start = on_demand_nodes(sim.store)
        scheduled: set[str] = set()

        def on_change(event_type: str, resource: str, obj: Any) -> None:
            if resource == "pods" and (obj.get("metadata") or {}).get("namespace") == "spotguard" and (
                    obj.get("spec") or {}).get("nodeName"):
                scheduled.add(str(obj["metadata"]["name"]))

        sim.store.subscribe(on_change)
        try:
            with (
                e2e.served_node_added(sim, kube.connect(roles["node-added"]), cfg) as (sender, node_added_url),
                e2e.served_spot_interruption(sim, kube.connect(roles["spot-interruption"])) as interruption_url,
            ):
                def ready_placeholders() -> list[Any]:
                    return [p for p in e2e.placeholders(sim.store) if readiness.is_ready(p)]

                if cutoff <= PRIORITY:
                    # the placeholders run on on-demand nodes the autoscaler launched for them
                    h.ping_until(sender, lambda: len(ready_placeholders()) == at_risk, 180, "the placeholders running")
                else:
                    # the placeholders are wanted and Pending, for many of the autoscaler's scans, past the
                    # time node-added says they have had no room (headroom.UNPLACED_SECONDS)
                    h.ping_until(sender, lambda: len(e2e.placeholders(sim.store)) == at_risk, 60,
                                 "the placeholders created")
                    until = sim.clock.now() + UNPLACED_SECONDS + 30
                    h.ping_until(sender, lambda: sim.clock.now() >= until, 120, "past the unplaced time", every=0.5)
                sender.ping()
                unplaced = e2e.metric(node_added_url, "spotguard_nodeadded_headroom_placeholders", state="unplaced")
                before = ready_placeholders()
                nodes_before = {n["metadata"]["name"] for n in sim.store.list("nodes")[0]}
                od_before = on_demand_nodes(sim.store)
                watch = e2e.Serving(sim, doomed, 3)
                sim.store.subscribe(watch.on_change)
                try:
                    e2e.notice(interruption_url, sim, sim.store.get("nodes", doomed))
                    sim.reclaim([doomed], after_seconds=e2e.NOTICE)
                    h.wait_until(lambda: watch.back_at is not None, 120, "web's count Ready away from the doomed node")
                    after: set[str] = set()
                    if cutoff <= PRIORITY and len(spot) > 1:
                        # the other spot node is still at risk: its placeholder, preempted or made again,
                        # runs on an on-demand node the autoscaler launched after the notice
                        def launched_again() -> bool:
                            after.clear()
                            after.update(e2e.running_on(ready_placeholders()) - nodes_before)
                            return bool(after)

                        h.ping_until(sender, launched_again, 180, "a placeholder on a node launched after the notice")
                finally:
                    sim.store.unsubscribe(watch.on_change)
                replacements = e2e.live(
                    sim.store, NS, lambda p: e2e.app(p) == WEB and p["spec"].get("nodeName") not in (None, doomed)
                )
                return Outcome(
                    replacement_nodes={p["spec"]["nodeName"] for p in replacements if readiness.is_ready(p)},
                    nodes_before=nodes_before,
                    od_at_start=od_at_start,
                    od_before=od_before,
                    od_after=on_demand_nodes(sim.store),
                    placeholders_before=e2e.running_on(before),
                    placeholders_after=after,
                    preempted=len(watch.placeholders_deleted & {p["metadata"]["name"] for p in before}),
                    ever_scheduled=bool(scheduled),
                    at_risk=at_risk,
                    unplaced=unplaced,
                    priorities={(p["spec"].get("priority"), p["spec"].get("preemptionPolicy"))
                                for p in e2e.placeholders(sim.store)},
                )
        finally:
            sim.store.unsubscribe(on_change)


@pytest.mark.timeout(600)
def test_the_cluster_autoscaler_launches_room_for_the_headroom_and_a_surge_takes_it(tmp_path: Path) -> None:
    # GIVEN the Cluster Autoscaler at its default cutoff (-10) and node-added keeping headroom
    # for the spot node whose reclaim needs the most
    out = cycle(tmp_path, nodegroups.EXPENDABLE_PODS_PRIORITY_CUTOFF)
    assert out.priorities == {(PRIORITY, "Never")}
    assert out.unplaced == 0  # node-added says nothing is wrong
    # THEN the on-demand group grew for the placeholders: they ran on nodes launched for them
    assert out.placeholders_before and out.placeholders_before <= out.od_before - out.od_at_start, out
    # AND at the notice the surge took their room: web's replacements run on nodes that were there
    # at the notice (no launch waited for), the placeholders were preempted ...
    assert out.replacement_nodes and out.replacement_nodes <= out.nodes_before, out
    assert out.preempted > 0, out
    # ... and the autoscaler launched on-demand room again for the placeholders still wanted
    assert out.placeholders_after and out.placeholders_after <= out.od_after - out.od_before, out


@pytest.mark.timeout(600)
def test_with_the_cutoff_raised_to_0_the_headroom_never_gets_room(tmp_path: Path) -> None:
    # GIVEN a Cluster Autoscaler run with --expendable-pods-priority-cutoff=0 (the placeholders'
    # -10 is below it: expendable)
    out = cycle(tmp_path, 0)
    # THEN no placeholder was ever scheduled and the on-demand group never grew for them
    assert not out.ever_scheduled and not out.placeholders_before, out
    assert out.od_before == out.od_at_start, out
    # AND node-added says so: the placeholders have had no room for over UNPLACED_SECONDS (its
    # gauge, beside the warning it logs)
    assert out.unplaced == out.at_risk, out
    # AND at the notice the surge waited for an on-demand node launched after it, as without headroom
    assert out.replacement_nodes - out.nodes_before, out
    assert out.preempted == 0, out
