"""The return to spot on a Karpenter cluster: moves that launch spot capacity, through the served function.

A Karpenter-provisioned simulated cluster (an EC2NodeClass and a NodePool; launch to
Ready in 30-40 s, consolidation on, docs/sim.md) keeps no idle spot room: the
replicas above each floor spilled onto on-demand nodes while spot was unavailable
(the NodePool allowed on-demand only). Then spot capacity returns (the NodePool
allows spot again) and node-added, served over HTTP as Knative delivers to it
(PingSource CloudEvents), moves them back: a move's new replicas are spot pods that
wait Pending while Karpenter launches a node for them, batched within the floor,
the budgets and the maximum in flight; a launch that never comes is undone without
service loss. The served admission webhook places every pod.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
from spotguard.ops import serving
from spotguard.policy import config
from spotguard.policy.moves import MOVE, MoveRecord
from spotguard_sim import capacity, objects, testing
from spotguard_sim import settings as settings_mod

from tests.interruption import sim_scenario
from tests.nodeadded import harness as h

SCALE = 20.0
READY_DELAY = 10.0
NS = "shop"
CFG = config.Config(rebalance_move_timeout_seconds=200, rebalance_hold_seconds=3000, rebalance_settle_seconds=30)
NODE_CLASS = objects.node_class()
CAPACITY_TYPE = "karpenter.sh/capacity-type"


def nodepool(*capacity_types: str, policy: str = "WhenEmptyOrUnderutilized") -> dict[str, Any]:
    return objects.nodepool(capacity_types=capacity_types, policy=policy)


def spot_returns(sim: Any) -> None:
    """Spot capacity is back: the NodePool may launch spot again (a user's patch, as kubectl sends it)."""
    api = kubernetes.client.CustomObjectsApi(sim.api_client())
    requirements = objects.nodepool(capacity_types=("spot", "on-demand"))["spec"]["template"]["spec"]["requirements"]
    body = {"spec": {"template": {"spec": {"requirements": requirements}}}}
    api.patch_cluster_custom_object("karpenter.sh", "v1", "nodepools", "default", body)


def capacity_of(store: Any) -> dict[str, str]:
    return {
        n["metadata"]["name"]: CFG.node_capacity(n["metadata"].get("labels") or {}).value
        for n in store.list("nodes")[0]
    }


def placement(store: Any) -> dict[str, tuple[int, int, int]]:
    """key -> (on-demand, spot, not scheduled) of the live pods, by their node's capacity."""
    caps = capacity_of(store)
    out: dict[str, list[int]] = {}
    for p in store.list("pods")[0]:
        key = h.ih.workload_key(p)
        if key is None or not h.live(p):
            continue
        row = out.setdefault(key, [0, 0, 0])
        node = (p.get("spec") or {}).get("nodeName")
        row[2 if not node else 1 if caps.get(node) == "spot" else 0] += 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def records(store: Any) -> dict[str, MoveRecord]:
    out = {}
    for d in store.list("deployments")[0]:
        raw = (d["metadata"].get("annotations") or {}).get(MOVE)
        rec = MoveRecord.parse(raw) if raw else None
        if rec is not None:
            out[f"Deployment/{d['metadata']['namespace']}/{d['metadata']['name']}"] = rec
    return out


def deployment(name: str, replicas: int, cpu: str = "500m") -> dict[str, Any]:
    obj = sim_scenario.deployment(name, replicas, NS)
    for c in obj["spec"]["template"]["spec"]["containers"]:
        c["resources"] = {"requests": {"cpu": cpu, "memory": "256Mi"}}
    return obj


class Moves:
    """Every move record written, as the store changes: the pods in flight at once (cluster-wide
    and per workload), never missed between two polls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most_in_flight = 0
        self.largest: dict[str, int] = {}
        self.holds: dict[str, str] = {}

    def on_change(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "deployments":
            return
        meta = obj.get("metadata") or {}
        key = f"Deployment/{meta.get('namespace')}/{meta.get('name')}"
        raw = (meta.get("annotations") or {}).get(MOVE) if event_type != "DELETED" else None
        rec = MoveRecord.parse(raw) if raw else None
        with self.lock:
            if rec is not None and rec.held:
                self.holds[key] = rec.reason
            self.now[key] = rec.size if rec is not None and not rec.held else 0
            self.largest[key] = max(self.largest.get(key, 0), self.now[key])
            self.most_in_flight = max(self.most_in_flight, sum(self.now.values()))


@contextlib.contextmanager
def karpenter_cluster(
    tmp_path: Any, workloads: list[dict[str, Any]], *, pool: tuple[str, ...] = ("on-demand",),
    settings: settings_mod.Settings | None = None, policy: str = "WhenEmptyOrUnderutilized",
) -> Iterator[tuple[Any, serving.Serving, Moves]]:
    """The workloads placed through the served admission webhook on nodes the NodePool launched
    (``pool``: its capacity types), every pod Ready; then serving (by capacity) and the move
    records are followed from here."""
    objs = [NODE_CLASS, nodepool(*pool, policy=policy), sim_scenario.namespace(NS), sim_scenario.namespace("spotguard")]
    with (
        testing.running_cluster(objs, time_scale=SCALE, ready_delay_seconds=READY_DELAY, settings=settings) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        sim.store.apply_objects(workloads)
        deployments = [w for w in workloads if w["kind"] == "Deployment"]
        total = sum(w["spec"]["replicas"] for w in deployments)
        h.wait_until(lambda: h.ready_pods(sim.store) == total, 90, "every pod Ready")
        tracker = serving.Serving(sim.clock.now, lambda labels: CFG.node_capacity(labels).value)
        tracker.start(sim.store)
        moves = Moves()
        sim.store.subscribe(moves.on_change)
        tracker.arm({f"Deployment/{NS}/{w['metadata']['name']}": w["spec"]["replicas"] for w in deployments})
        try:
            yield sim, tracker, moves
        finally:
            sim.store.unsubscribe(moves.on_change)
            tracker.stop(sim.store)


def lowest(tracker: serving.Serving) -> dict[str, tuple[int, int]]:
    """key -> (lowest serving replicas, lowest serving on on-demand) since the tracker was armed."""
    with tracker.lock:
        series = list(tracker.series)
    on_demand: dict[str, int] = {}
    for _, key, _spot, od in series:
        on_demand[key] = min(on_demand.get(key, od), od)
    return {key: (c.lowest, on_demand.get(key, 0)) for key, c in tracker.snapshot().items()}


def launched_spot_nodes(store: Any) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in store.list("nodes")[0]
        if (n["metadata"].get("labels") or {}).get(CAPACITY_TYPE) == "spot"
        and "karpenter.sh/nodepool" in (n["metadata"].get("labels") or {})
    )


def test_a_spilled_replica_returns_to_spot_on_a_launched_node(tmp_path: Any) -> None:
    # GIVEN web (3 replicas, floor 1) all on on-demand nodes Karpenter launched while spot was out
    with karpenter_cluster(tmp_path, [deployment("web", 3)]) as (sim, tracker, _moves):
        web = f"Deployment/{NS}/web"
        assert placement(sim.store)[web] == (3, 0, 0) and launched_spot_nodes(sim.store) == []
        on_demand_nodes = {n for n, c in capacity_of(sim.store).items() if c == "on-demand"}
        with h.served_node_added(sim, CFG) as sender:
            # WHEN spot capacity returns (no spot node exists: there is no room anywhere)
            spot_returns(sim)
            h.ping_until(sender, lambda: placement(sim.store).get(web) == (1, 2, 0) and not records(sim.store),
                         240, "web back at its optimum")  # fmt: skip
        # THEN its two replicas above the floor serve on spot nodes Karpenter launched for them
        spot = launched_spot_nodes(sim.store)
        assert spot and not set(spot) & on_demand_nodes
        for p in sim.store.list("pods", NS)[0]:
            if h.live(p) and p["spec"].get("nodeName") in spot:
                assert p["metadata"]["labels"]["spotguard.io/placement"] == "spot"
        # AND web never served fewer than its 3 replicas, nor fewer than its floor on on-demand
        assert lowest(tracker)[web] == (3, 1)


def test_a_batch_of_moves_stays_within_floor_budget_and_max_in_flight(tmp_path: Any) -> None:
    # GIVEN three Deployments of 6 (floor 1 each: 15 replicas to move); a's budget allows 2
    # disruptions; at most 4 pods in flight, at most 3 of one workload. The NodePool consolidates
    # empty nodes only (WhenEmpty: under-used spot nodes are not consolidated onto on-demand room)
    cfg = dataclasses.replace(CFG, rebalance_max_in_flight=4, rebalance_max_pods_per_workload=3)
    names = ("a", "b", "c")
    budget = sim_scenario.pdb("a", "a", NS, max_unavailable=2)
    workloads = [budget, *(deployment(n, 6) for n in names)]
    with karpenter_cluster(tmp_path, workloads, policy="WhenEmpty") as (sim, tracker, moves):
        keys = [f"Deployment/{NS}/{n}" for n in names]
        with h.served_node_added(sim, cfg) as sender:
            # WHEN spot capacity returns
            spot_returns(sim)
            h.ping_until(sender, lambda: all(placement(sim.store).get(k) == (1, 5, 0) for k in keys)
                         and not records(sim.store), 600, "every workload at its optimum")  # fmt: skip
        # THEN the moves went in batches (more than one pod of a workload at once) ...
        assert max(moves.largest.values()) > 1, moves.largest
        # ... never more than 4 pods in flight, nor more of a than its budget allows, nor 3 of one
        assert moves.most_in_flight <= 4, moves.most_in_flight
        assert moves.largest[keys[0]] <= 2 and all(moves.largest[k] <= 3 for k in keys), moves.largest
        # AND no workload served fewer than its 6 replicas, nor fewer than its floor on on-demand
        low = lowest(tracker)
        assert all(low[k] == (6, 1) for k in keys), low
        assert not moves.holds, moves.holds


def test_a_launch_that_never_comes_is_undone_without_service_loss(tmp_path: Any) -> None:
    # GIVEN a NodePool that may launch spot, but the cloud refuses every spot launch
    # (InsufficientInstanceCapacity, for good): web's replicas above its floor fell back on on-demand
    refused = settings_mod.Settings(capacity=capacity.Capacity(refusals=(capacity.Refusal("spot"),)))
    with karpenter_cluster(tmp_path, [deployment("web", 3)], pool=("spot", "on-demand"), settings=refused) as (
        sim, tracker, moves
    ):
        web = f"Deployment/{NS}/web"
        assert placement(sim.store)[web] == (3, 0, 0)
        with h.served_node_added(sim, CFG) as sender:
            # WHEN node-added moves them back to spot: the new spot pods wait for a launch that
            # never comes
            h.ping_until(sender, lambda: placement(sim.store)[web][2] > 0, 60, "a new replica Pending for a launch")
            # THEN after the move's timeout it is undone, and the workload held
            h.ping_until(sender, lambda: web in moves.holds and not placement(sim.store)[web][2]
                         and placement(sim.store)[web] == (3, 0, 0), 120, "the move undone")  # fmt: skip
        assert "did not become Ready" in moves.holds[web]
        dep = sim.store.get("deployments", "web", NS)
        assert dep["spec"]["replicas"] == 3  # the owner's count
        hold = json.loads(dep["metadata"]["annotations"][MOVE])
        assert hold["holdUntil"] > 0
        # the ranked pods got their deletion cost back: no on-demand pod is left first to go
        for p in sim.store.list("pods", NS)[0]:
            assert (p["metadata"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost") != str(
                -1_000_000
            )
        # AND web never served fewer than 3 replicas, nor fewer than its floor on on-demand
        assert lowest(tracker)[web] == (3, 1)
