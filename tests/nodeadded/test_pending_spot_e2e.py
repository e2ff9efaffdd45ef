"""No pod stays Pending for good on the spot requirement a move back to spot gave it.

While node-added moves replicas of a Deployment back to spot, the admission webhook gives the
move's new replicas a required spot node affinity (so that Karpenter launches a spot node for
them, ``spotguard.policy.moves.launching_move``). Where EC2 refuses every spot launch, the move
is undone or held, and any pod still carrying that requirement would wait Pending for good:
nothing else scales it away or makes it again without the requirement. Through the served
functions on a Karpenter-provisioned simulated cluster (docs/sim.md), node-added under the roles
the chart ships.
"""

from __future__ import annotations

from typing import Any

import kubernetes
from spotguard.gateway import kube
from spotguard.policy.workloads import MOVE_REQUIRES_SPOT
from spotguard_sim import capacity
from spotguard_sim import settings as settings_mod

from tests.nodeadded import harness as h
from tests.nodeadded import test_headroom_e2e as served
from tests.nodeadded import test_launch_e2e as launch
from tests.security import test_rbac

NS = launch.NS
CFG = launch.CFG
REFUSED = settings_mod.Settings(capacity=capacity.Capacity(refusals=(capacity.Refusal("spot"),)))


def serving_of(store: Any, name: str) -> int:
    """The Ready pods of ``name`` on a node."""
    return sum(
        1
        for p in store.list("pods", NS)[0]
        if h.live(p)
        and (p["metadata"].get("labels") or {}).get("app") == name
        and p["spec"].get("nodeName")
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    )


class Marked:
    """The names of the pods created with a move's spot requirement (its mark), as the store changes."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_change(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if resource == "pods" and event_type == "ADDED" and MOVE_REQUIRES_SPOT in (meta.get("annotations") or {}):
            self.names.append(str(meta.get("name")))


def move_under_way(store: Any, key: str) -> bool:
    record = launch.records(store).get(key)
    return record is not None and not record.held


def test_replicas_admitted_during_a_move_to_refused_spot_all_serve_once_it_is_over(tmp_path: Any) -> None:
    """A move back to spot is under way (its new replicas require spot, Pending for a launch) when
    the owner scales the Deployment up, and EC2 refuses every spot launch. Before, the owner's new
    replica was admitted with the move's required spot affinity too; the owner's count won (the
    move held), nothing scaled back, and the move's two replicas and the owner's waited Pending
    for good (chaos spot-refused-after-reclaim under 500s: worker served 35 of the 38 its owner
    asked). Now the owner's replica gets a spot slot's preferences only, and node-added evicts the
    pods left Pending on the requirement of a move that is over: their ReplicaSet makes them
    again, placed as usual, and every replica the owner asked serves."""
    # GIVEN web (3 replicas, floor 1) on on-demand nodes; its NodePool may launch spot, but the
    # cloud refuses every spot launch (InsufficientInstanceCapacity, for good)
    with launch.karpenter_cluster(
        tmp_path, [launch.deployment("web", 3)], pool=("spot", "on-demand"), settings=REFUSED
    ) as (sim, tracker, moves):
        web = f"Deployment/{NS}/web"
        assert launch.placement(sim.store)[web] == (3, 0, 0)
        marked = Marked()
        sim.store.subscribe(marked.on_change)
        roles = test_rbac.install_rbac(sim, "helm", tmp_path)
        with served.served_node_added(sim, kube.connect(roles["node-added"]), CFG) as (sender, url):
            # (the metrics are the process's: counted from here)
            before = served.metric(url, "spotguard_nodeadded_cleanups_total", what="pending-spot-pod")
            errors = served.metric(url, "spotguard_nodeadded_errors_total", step="stranded")
            # AND node-added's move of its two replicas above the floor back to spot under way:
            # the new replicas wait Pending for a spot launch that never comes
            h.ping_until(sender, lambda: launch.placement(sim.store)[web][2] == 2 and move_under_way(sim.store, web),
                         60, "the move's new replicas Pending")  # fmt: skip
            # WHEN the owner scales web up meanwhile (kubectl scale --replicas=6; the move has it at 5)
            apps = kubernetes.client.AppsV1Api(sim.api_client())
            apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 6}})
            # THEN every replica the owner asked serves, and no move is under way
            h.ping_until(sender, lambda: serving_of(sim.store, "web") == 6 and launch.placement(sim.store)[web][2] == 0
                         and not move_under_way(sim.store, web), 150, "web serving the 6 its owner asked")  # fmt: skip
            evicted = served.metric(url, "spotguard_nodeadded_cleanups_total", what="pending-spot-pod") - before
            failed = served.metric(url, "spotguard_nodeadded_errors_total", step="stranded") - errors
        assert sim.store.get("deployments", "web", NS)["spec"]["replicas"] == 6  # the owner's count
        assert "by someone else" in moves.holds.get(web, ""), moves.holds  # the owner's count won
        sim.store.unsubscribe(marked.on_change)
        # only the move's two new replicas ever carried its requirement (the owner's did not: the
        # count above the move's), node-added evicted both (under the Helm roles: none refused)
        # and no live pod carries it now
        assert len(marked.names) == 2, marked.names
        assert evicted == 2 and failed == 0, (evicted, failed)
        left = [
            p["metadata"]["name"]
            for p in sim.store.list("pods", NS)[0]
            if h.live(p) and MOVE_REQUIRES_SPOT in (p["metadata"].get("annotations") or {})
        ]
        assert not left, left
        # no spot node was ever launched, and web never served fewer than its 3 replicas
        assert launch.launched_spot_nodes(sim.store) == []
        assert launch.lowest(tracker)[web][0] == 3
