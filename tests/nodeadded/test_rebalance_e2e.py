"""Back to spot on the simulated cluster, through the served admission webhook.

- After every spot node is reclaimed at once (the spot-interruption function
  surges, the nodes go, the surges end) and new spot nodes join, every workload
  returns to its optimum within a bounded number of passes, with no moment
  where a Deployment has fewer Ready replicas than it had, nor a StatefulSet
  fewer than its quorum.
- A budget that forbids disruption blocks the eviction moves (StatefulSets)
  without errors piling up, while create-before-evict moves proceed.
- Spot without room: nothing moves, nothing is written, pass after pass.
- Leftovers: reservation Leases of ReplicaSets that are gone (surges that are
  over are ended by the spot-interruption reconcile each pass calls: see the
  mass reclaim above).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy import config
from spotguard.policy.moves import MOVE, START_SECONDS, MoveRecord
from spotguard.policy.rebalance import SkipReason
from spotguard.policy.workloads import Workload
from spotguard_sim import testing

from tests.interruption import e2e_harness as ih
from tests.interruption import sim_scenario
from tests.nodeadded import harness as h

TIME_SCALE = 20.0
READY_DELAY = 10.0
CFG = config.Config(rebalance_move_timeout_seconds=200, rebalance_hold_seconds=100, rebalance_settle_seconds=120)
NS = "shop"


def spot_nodes(prefix: str, n: int) -> list[dict[str, Any]]:
    return [sim_scenario.node(f"{prefix}-{i}", "spot", cpu="8") for i in range(n)]


def test_every_workload_back_to_spot_after_a_mass_reclaim(tmp_path: Any) -> None:
    with (
        testing.running_cluster(
            sim_scenario.mixed_nodes(), time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY
        ) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        store = sim.store
        before = ih.start_mixed_workloads(store)
        total = sum(replicas for replicas, _ in before.values())

        # Every spot node is reclaimed at once; the spot-interruption function surges, and
        # the reconcile's own call to its scale-back ends the surges.
        spot = h.nodes_named(store, "spot")
        handler = ih.handler_for(sim)
        ih.deliver(handler, ih.notices_for(sim, spot))
        sim.reclaim(spot, after_seconds=120)
        rec = h.reconciler_for(sim, CFG)

        lists: list[int] = []

        def over() -> bool:
            before_pass = rec.kube.stats.count("list")
            rec.reconcile()
            lists.append(rec.kube.stats.count("list") - before_pass)
            if set(h.nodes_named(store, "spot")) & set(spot):
                return False
            deployments = store.list("deployments")[0]
            if any("spotguard.io/surge" in (d["metadata"].get("annotations") or {}) for d in deployments):
                return False
            return h.floors_of(store) == before and h.ready_pods(store) == total

        h.wait_until(over, 60, "the reclaim to be over", step=0.3)
        # Each pass read the cluster once for both reconciles, surges in progress or not
        # (twelve lists of one page here, Karpenter's NodePools among them: the
        # spot-interruption reconcile used to read again; the twelfth is the surge copies,
        # ReplicaSets labelled spotguard.io/surge-of, read with the snapshot in copy mode,
        # the default: eleven with surge_copy=False).
        assert set(lists) == {12}, lists
        off = {k for k, (od, spot_count, _) in h.placement(store).items() if od > before[k][1]}
        assert off, "after the reclaim, workloads run above their floor on on-demand"

        # New spot nodes join; passes run until every workload is at its optimum.
        store.apply_objects(spot_nodes("spot-new", 6))
        watcher = h.Watcher()
        watcher.start(store)
        h.wait_until(lambda: h.ready_pods(store) == total, 30, "every pod Ready")
        watcher.arm([])
        ready_before = watcher.counts()
        reports = h.passes_until(rec, lambda rep: rep.optimal and h.at_optimum(store), max_passes=200)

        for key, (replicas, floor) in before.items():
            on_demand, spot_count, pending = h.placement(store)[key]
            assert (on_demand, spot_count, pending) == (floor, replicas - floor, 0), key
            lowest = watcher.lowest[key]
            if key.startswith("Deployment/"):
                assert lowest >= ready_before[key] == replicas, (key, lowest)
            else:
                assert lowest >= floor, (key, lowest)
        assert h.floors_of(store) == before  # every owner's count kept
        assert not any(rep.failures for rep in reports)
        # Bounded: one move per replica above the floor, none wasted.
        moves = sum(len(rep.started) for rep in reports)
        excess = {k: h.placement(store)[k] for k in off}
        assert moves <= sum(before[k][0] for k in off), (moves, excess)
        # No flapping: nothing ever moved back to on-demand (no floor was broken by a move).
        assert all(m.direction.value == "to-spot" for rep in reports for m in rep.started)
        # At the optimum: two passes write nothing.
        writes = rec.kube.stats.writes
        assert rec.reconcile().optimal and rec.reconcile().optimal
        assert rec.kube.stats.writes == writes
        # What moved is told on the workloads.
        events = [e for e in store.list("events", NS)[0] if e.get("reason") == "SpotguardRebalance"]
        assert {e["involvedObject"]["name"] for e in events} >= {k.rsplit("/", 1)[1] for k in off}


def test_a_budget_blocks_evictions_not_create_before_evict(tmp_path: Any) -> None:
    nodes = [sim_scenario.namespace(NS)] + [sim_scenario.node(f"od-{i}", "on-demand") for i in range(2)]
    with (
        testing.running_cluster(nodes, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        store = sim.store
        store.apply_objects(
            [
                sim_scenario.deployment("web", 3),
                sim_scenario.pdb("web", "web", max_unavailable=0),
                sim_scenario.statefulset("queue", 5),
                sim_scenario.pdb("queue", "queue", max_unavailable=0),
            ]
        )
        h.wait_until(lambda: h.ready_pods(store) == 8, 30, "every pod Ready")
        store.apply_objects(spot_nodes("spot", 3))
        watcher = h.Watcher()
        watcher.start(store)
        watcher.arm([])
        rec = h.reconciler_for(sim, CFG)
        reports = h.passes_until(
            rec, lambda rep: h.at_optimum(store, ["Deployment/shop/web"]) and not rep.progress, max_passes=80
        )
        assert h.placement(store)["Deployment/shop/web"] == (1, 2, 0)
        assert watcher.lowest["Deployment/shop/web"] >= 3
        # The StatefulSet's budget allows no disruption: it is left alone, quietly.
        assert h.placement(store)["StatefulSet/shop/queue"] == (5, 0, 0)
        last = rec.reconcile()
        [skip] = [s for s in last.plan.skipped if s.workload.key == "StatefulSet/shop/queue"]
        assert skip.reason is SkipReason.BUDGET
        evictions = rec.kube.stats.count(resource="pods/eviction")
        assert evictions == 0 and not any(rep.failures for rep in reports)
        writes = rec.kube.stats.writes
        for _ in range(3):
            rec.reconcile()
        assert rec.kube.stats.writes == writes  # no retry loop against the budget
        warnings = [e for e in store.list("events", NS)[0] if e.get("type") == "Warning"]
        assert not warnings


def test_spot_without_room_nothing_moves(tmp_path: Any) -> None:
    nodes = [sim_scenario.namespace(NS)] + [sim_scenario.node(f"od-{i}", "on-demand") for i in range(2)]
    with (
        testing.running_cluster(nodes, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        store = sim.store
        store.apply_objects([sim_scenario.deployment("web", 4), sim_scenario.statefulset("db", 3)])
        h.wait_until(lambda: h.ready_pods(store) == 7, 30, "every pod Ready")
        # Spot nodes join, but without room: one takes no more pods, one is cordoned.
        store.apply_objects(
            [sim_scenario.node("spot-full", "spot", pods="0"), sim_scenario.node("spot-cordoned", "spot")]
        )
        k = kube.Kube(sim.api_client())
        h.cordon(k, ["spot-cordoned"])
        rec = h.reconciler_for(sim, dataclasses.replace(CFG, rebalance_settle_seconds=0))
        first = rec.reconcile()
        reasons = {s.workload.key: s.reason for s in first.plan.skipped}
        assert reasons == {
            "Deployment/shop/web": SkipReason.NO_SPOT_ROOM,
            "StatefulSet/shop/db": SkipReason.NO_SPOT_ROOM,
        }
        assert not first.started
        writes = rec.kube.stats.writes
        for _ in range(3):
            rep = rec.reconcile()
            assert not rep.started and not rep.progress
        assert rec.kube.stats.writes == writes
        assert h.placement(store)["Deployment/shop/web"] == (4, 0, 0)


def test_leftovers_cleaned(tmp_path: Any) -> None:
    nodes = [sim_scenario.namespace(NS), sim_scenario.node("od-0", "on-demand"), *spot_nodes("spot", 2)]
    with (
        testing.running_cluster(nodes, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        store = sim.store
        k = kube.Kube(sim.api_client())
        store.apply_objects([sim_scenario.deployment("web", 3), sim_scenario.deployment("gone", 2)])
        h.wait_until(lambda: h.ready_pods(store) == 5, 30, "every pod Ready")

        def leases() -> set[str]:
            return {x["metadata"]["name"] for x in k.list(r.LEASES, "spotguard")}

        assert leases() == {f"admission.shop.{rs['metadata']['name']}" for rs in k.list(r.REPLICASETS, NS)}
        k.delete(r.DEPLOYMENTS, "gone", NS, propagation_policy="Foreground")
        h.wait_until(
            lambda: not [rs for rs in k.list(r.REPLICASETS, NS) if rs["metadata"]["name"].startswith("gone-")],
            30,
            "the ReplicaSet of gone deleted",
        )
        rec = h.reconciler_for(sim, CFG)
        gone = {n for n in leases() if n.startswith("admission.shop.gone-")}
        assert gone
        first = rec.reconcile()
        assert {lease.name for lease in first.leases} == gone
        assert leases() and all(n.startswith("admission.shop.web-") for n in leases())  # web's lease stays
        writes, lists = rec.kube.stats.writes, rec.kube.stats.count("list")
        assert rec.reconcile().optimal
        assert rec.kube.stats.writes == writes
        # One read for both reconciles: twelve lists (each one page here; the twelfth is the
        # surge copies, ReplicaSets labelled spotguard.io/surge-of, read in copy mode, the
        # default), none for the spot-interruption reconcile, which has nothing of its own to do.
        assert rec.kube.stats.count("list") - lists == 12


def test_a_move_whose_count_changed_before_its_scale_up_ends_without_a_hold(tmp_path: Any) -> None:
    """A pass writes the move's record, then the "+k" once the webhook's cache caught up. A
    surge of the spot-interruption function (a node autoscaler's drain) wrote the count in
    between: the "+k" (a JSON patch testing the count) did not apply, the surge's scale back put
    the owner's count back, and the move then read "replicas changed to 8 by someone else" and
    held the workload for 600 s (the demo's return to spot ran ten minutes longer). The record
    now says whether its "+k" was written; one never begun ends without a hold."""
    nodes = [sim_scenario.namespace(NS)] + [sim_scenario.node(f"od-{i}", "on-demand") for i in range(2)]
    with (
        testing.running_cluster(nodes, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        store = sim.store
        store.apply_objects([sim_scenario.deployment("web", 4)])
        h.wait_until(lambda: h.ready_pods(store) == 4, 30, "every pod Ready")
        # GIVEN web all on on-demand (floor 1) and a spot node with room: a move is due
        store.apply_objects([sim_scenario.node("spot-0", "spot")])
        raised = threading.Event()

        def other_writer(_event: str, _resource: str, obj: dict[str, Any]) -> None:
            # the surge: the count raised once the record is written, before the record's write
            # is answered (a store subscriber runs in the writing request's thread), so before the "+k"
            if (
                obj["metadata"]["name"] == "web"
                and MOVE in (obj["metadata"].get("annotations") or {})
                and not raised.is_set()
            ):
                raised.set()
                store.mutate("deployments", "web", NS, lambda d: d["spec"].__setitem__("replicas", 6))

        store.subscribe(other_writer, ["deployments"])
        rec = h.reconciler_for(sim, dataclasses.replace(CFG, rebalance_settle_seconds=0))
        # WHEN a pass starts the move (once the spot node is up) and the other writer raises the
        # count before its "+k"
        h.passes_until(rec, lambda _rep: raised.is_set(), max_passes=40)
        store.unsubscribe(other_writer)
        record = MoveRecord.of(Workload.from_json(store.get("deployments", "web", NS)))
        assert record is not None and record.scaled is False, record
        assert store.get("deployments", "web", NS)["spec"]["replicas"] == 6
        # AND the surge is over: the owner's count is back
        store.mutate("deployments", "web", NS, lambda d: d["spec"].__setitem__("replicas", 4))
        time.sleep(sim.clock.real(START_SECONDS + 5))
        rec.reconcile()
        # THEN the move never begun ends with no hold: its record is gone, and a later pass moves
        web = store.get("deployments", "web", NS)
        assert MOVE not in (web["metadata"].get("annotations") or {}), web["metadata"]["annotations"]
        assert web["spec"]["replicas"] == 4
        again = rec.reconcile()
        assert [m.workload.key for m in again.started][:1] == ["Deployment/shop/web"], again.plan


@pytest.mark.parametrize("set_written", [False, True], ids=["as-it-comes", "set-written-before-the-refusal"])
def test_a_budget_taken_by_another_evictor_delays_a_move_not_holds_it(tmp_path: Any, set_written: bool) -> None:
    """The budget allowed a disruption when the pass read it, but another evictor (a drainer,
    the autoscaler's consolidation) took it before spotguard's eviction arrived: refused (429,
    no retry hint). The move waits for the budget to allow one again, a short hold, not the
    hold of a move that made no progress (600 s here): the workload is back within a few
    minutes of the rival's pod being Ready, and the refused evictions are few (no retry loop).

    The rival's pod is re-created while the set is above its floor: the admission webhook places
    it on spot once its node list has the spot nodes (a list without any is read again at most
    every second of real time: 20 simulated seconds here, so a loaded machine crosses it), and
    then the rival's eviction did the move; before that, on on-demand, and the move is
    spotguard's, after the hold. Both are counted exactly below.

    ``set_written``: the StatefulSet controller writes the set's status (the rival's pod going)
    between spotguard's record and the refusal of its eviction, as it did now and then under
    load: the hold, guarded by the resourceVersion the record's write returned, was refused
    (409) and the move stayed recorded without it (its eviction retried every pass; the rival's
    pod came back as the move's, on spot, so the recorded pod came back on on-demand for the
    floor: "queue-3 did not land on spot", a 600 s hold)."""
    cfg = dataclasses.replace(CFG, rebalance_hold_seconds=600, rebalance_settle_seconds=0)
    nodes = [sim_scenario.namespace(NS)] + [sim_scenario.node(f"od-{i}", "on-demand") for i in range(2)]
    with (
        testing.running_cluster(nodes, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        store = sim.store
        k = kube.Kube(sim.api_client())
        store.apply_objects(
            [sim_scenario.statefulset("queue", 4), sim_scenario.pdb("queue", "queue", max_unavailable=1)]
        )
        h.wait_until(lambda: h.ready_pods(store) == 4, 30, "every pod Ready")
        store.apply_objects(spot_nodes("spot", 2))
        rival: list[str] = []
        came_back_on: list[str] = []  # the node of the rival's pod once re-created and bound

        def rival_evicts() -> None:
            # Once, just before spotguard's first eviction is served: another evictor takes the
            # budget's one allowed disruption (a pod spotguard did not pick).
            if rival:
                return
            pods = [p for p in store.list("pods", NS)[0] if h.live(p) and p["metadata"]["name"].startswith("queue-")]
            victim = min(pods, key=lambda p: str(p["metadata"]["name"]))
            rival.extend([victim["metadata"]["name"], victim["metadata"]["uid"]])
            k.evict(rival[0], NS)
            if set_written:

                def one_fewer_ready(sts: dict[str, Any]) -> None:
                    status = sts.setdefault("status", {})
                    status["readyReplicas"] = int(status.get("readyReplicas") or 0) - 1

                store.mutate("statefulsets", "queue", NS, one_fewer_ready)

        def returned(event_type: str, resource: str, obj: dict[str, Any]) -> None:
            meta, node = obj["metadata"], (obj.get("spec") or {}).get("nodeName")
            if rival and meta.get("name") == rival[0] and meta.get("uid") != rival[1] and node and not came_back_on:
                came_back_on.append(node)

        store.subscribe(returned, ["pods"])

        sim.faults.set(verb="create", resource="pods", before=rival_evicts)
        rec = h.reconciler_for(sim, cfg)
        start = sim.clock.now()
        reports = h.passes_until(rec, lambda rep: h.at_optimum(store) and not rep.progress, max_passes=150)
        took = sim.clock.now() - start

        assert rival, "the rival never evicted: no eviction of spotguard's was served"
        assert any("a budget refused the eviction" in p.reason for rep in reports for p in rep.progress), [
            h.summary(rep) for rep in reports
        ]
        assert took < 300, f"back at the optimum after {took:.0f} simulated s (a 600 s hold would be the cause)"
        # One eviction per replica spotguard moved, and the refused one: the short hold is no
        # retry loop. The rival's pod back on spot was one replica moved without spotguard.
        assert came_back_on, "the rival's pod never came back"
        rival_moved = h.capacity_of(store)[came_back_on[0]] == "spot"
        replicas, floor = h.floors_of(store)["StatefulSet/shop/queue"]
        assert rec.kube.stats.count(resource="pods/eviction") == replicas - floor - int(rival_moved) + 1, came_back_on


def test_a_move_whose_count_changed_during_its_wait_is_not_begun(tmp_path: Any, caplog: Any) -> None:
    """The pass plans a move of web, writes its record and waits for the admission webhook's cache;
    meanwhile another writer sets web's count (as a surge or an autoscaler does). The "+k"'s test
    fails: the move is not reported started (its log says "not begun"), nothing is scaled, and the
    next pass ends the record as someone else's count (theirs wins)."""
    import logging

    from spotguard.nodeadded import metrics

    with h.spilled_cluster(tmp_path, 3, 2, TIME_SCALE, READY_DELAY) as sim:
        store = sim.store
        k = kube.Kube(sim.api_client())
        rec = h.reconciler_for(sim, dataclasses.replace(CFG, rebalance_settle_seconds=0), admission_cache_seconds=2.0)

        wrote = threading.Event()

        def other_writer() -> None:
            h.wait_until(
                lambda: MOVE in (store.get("deployments", "web", NS)["metadata"].get("annotations") or {}),
                30,
                "the move's record",
                step=0.02,
            )
            k.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 7}}, NS)  # not the move's "+k" (5)
            wrote.set()

        not_begun = metrics.MOVES.labels("to-spot", "scale", "not-begun")._value.get()
        writer = threading.Thread(target=other_writer)
        writer.start()
        with caplog.at_level(logging.INFO, logger="spotguard.nodeadded"):
            first = rec.reconcile()
            # a pass whose record write lost to the Deployment controller's own status write (a
            # loaded machine delays it past the pass's read) plans again at the next pass
            for _ in range(5):
                if wrote.is_set() or not first.again:
                    break
                first = rec.reconcile()
        writer.join(30)
        assert wrote.is_set(), "the move's record was never written"
        assert not first.started, h.summary(first)
        assert metrics.MOVES.labels("to-spot", "scale", "not-begun")._value.get() == not_begun + 1
        messages = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("move not begun") for m in messages) and "move started" not in messages
        dep = store.get("deployments", "web", NS)
        assert dep["spec"]["replicas"] == 7  # the other writer's count, no "+k" on top
        assert MoveRecord.of(Workload.from_json(dep)) is not None and not MoveRecord.of(Workload.from_json(dep)).scaled
        second = rec.reconcile()
        assert [p.reason for p in second.progress] == ["replicas changed to 7 by someone else"]
