"""Moves of a Deployment under a HorizontalPodAutoscaler, on the simulated cluster.

The simulated HPA syncs every 15 s (cluster time) under a steady load that
needs the Deployment's count, as a real one does: it would undo a move's
"scale up one" at its next sync. A scale move raises the autoscaler's
minReplicas to the move's count (after the move's record, which says what to
put back) and restores it when the move ends, unless someone else changed it
meanwhile. A pass cut off anywhere is carried on by the next one. An
autoscaler at its maxReplicas leaves no room for "+1": the Deployment stays
where it is (never above the user's cap, never an eviction that lowers the
serving count).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy import config
from spotguard.policy.moves import MOVE, Action
from spotguard.policy.rebalance import SkipReason
from spotguard_sim import testing

from tests.interruption import sim_scenario
from tests.nodeadded import harness as h

TIME_SCALE = 20.0
READY_DELAY = 10.0
# One pod a move (these tests follow the autoscaler's minimum through single moves: 3 -> 4 -> 3).
CFG = config.Config(
    rebalance_move_timeout_seconds=200,
    rebalance_hold_seconds=100,
    rebalance_settle_seconds=60,
    rebalance_max_pods_per_workload=1,
)
NS = "shop"
API = "Deployment/shop/api"


@dataclasses.dataclass
class Cluster:
    sim: Any
    k: kube.Kube
    watcher: h.Watcher


@contextlib.contextmanager
def api_on_demand(tmp_path: Any, max_replicas: int = 6) -> Iterator[Cluster]:
    """api: 3 replicas on on-demand, an autoscaler 3..max under a load that needs 3; then spot
    joins. Served admission webhook; every change of api's Ready replicas watched."""
    nodes = [sim_scenario.namespace(NS), sim_scenario.namespace("spotguard")]
    nodes += [sim_scenario.node(f"od-{i}", "on-demand") for i in range(2)]
    with (
        testing.running_cluster(nodes, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        sim.store.apply_objects([sim_scenario.deployment("api", 3), sim_scenario.hpa("api", "api", 3, max_replicas)])
        h.wait_until(lambda: h.ready_pods(sim.store) == 3, 30, "every pod Ready")
        sim.store.apply_objects([sim_scenario.node(f"spot-{i}", "spot", cpu="8") for i in range(2)])
        watcher = h.Watcher()
        watcher.start(sim.store)
        watcher.arm([])
        yield Cluster(sim, kube.Kube(sim.api_client()), watcher)


def hpa_spec(k: kube.Kube) -> tuple[int, int]:
    spec = k.get(r.HPAS, "api", NS)["spec"]
    return int(spec["minReplicas"]), int(spec["maxReplicas"])


def record(k: kube.Kube) -> dict[str, Any] | None:
    text = (k.get(r.DEPLOYMENTS, "api", NS)["metadata"].get("annotations") or {}).get(MOVE)
    return json.loads(text) if text else None


def first_move(rec: Any) -> None:
    """Passes until one starts api's move (the settle time of fresh pods passes first)."""
    h.passes_until(rec, lambda rep: any(m.workload.key == API for m in rep.started), max_passes=80)


def test_an_autoscaled_deployment_goes_back_to_spot_and_its_minimum_comes_back(tmp_path: Any) -> None:
    with api_on_demand(tmp_path) as c:
        sim, k, watcher = c.sim, c.k, c.watcher
        rec = h.reconciler_for(sim, CFG)
        first_move(rec)
        moving = record(k)
        assert moving is not None and moving["hpa"] == {"name": "api", "minReplicas": 3, "setMin": 4}
        assert hpa_spec(k) == (4, 6)  # raised with the count: the autoscaler keeps the "+1"
        reports = h.passes_until(rec, lambda rep: rep.optimal and h.at_optimum(sim.store, [API]), max_passes=200)
        assert h.placement(sim.store)[API] == (1, 2, 0)
        assert hpa_spec(k) == (3, 6)  # the user's minimum is back
        assert record(k) is None
        assert watcher.lowest[API] >= 3
        # No move was undone by the autoscaler: each finished.
        steps = [(p.action, p.reason) for rep in reports for p in rep.progress if p.workload.key == API]
        steps = [s[0] for s in steps] if not any(a is Action.HOLD for a, _ in steps) else steps
        assert Action.FINISH in steps and not {Action.HOLD, Action.ABORT} & set(steps), steps
        # At the optimum the autoscaler is not written again.
        writes = rec.kube.stats.writes
        assert rec.reconcile().optimal and rec.kube.stats.writes == writes


def test_a_minimum_the_user_sets_during_a_move_is_kept(tmp_path: Any) -> None:
    with api_on_demand(tmp_path) as c:
        sim, k, watcher = c.sim, c.k, c.watcher
        rec = h.reconciler_for(sim, CFG)
        first_move(rec)
        assert hpa_spec(k) == (4, 6)
        # The user (or GitOps) sets the minimum to 5 while the move is on; the autoscaler
        # scales to 5 at once (a changed HPA syncs).
        k.patch(r.HPAS, "api", {"spec": {"minReplicas": 5}}, NS)
        h.wait_until(lambda: k.get(r.DEPLOYMENTS, "api", NS)["spec"]["replicas"] == 5, 30, "api scaled to 5")

        def over(rep: Any) -> bool:
            now = record(k)
            return now is None or "holdUntil" in now

        h.passes_until(rec, over, max_passes=80)
        assert hpa_spec(k) == (5, 6)  # theirs stays
        assert "hpa" not in (record(k) or {})  # nothing left to put back
        for _ in range(3):
            rec.reconcile()
        assert hpa_spec(k) == (5, 6)
        assert watcher.lowest[API] >= 3


def test_a_pass_cut_off_anywhere_is_carried_on_and_the_minimum_restored(tmp_path: Any) -> None:
    """Cut-offs, each a write that never happened (the process died before it): the autoscaler's
    raise after the move's record; the autoscaler's restore after the scale back. Each next pass
    runs in a new reconciler (a new process: nothing carried over but what the cluster holds)."""
    with api_on_demand(tmp_path) as c:
        sim, k, watcher = c.sim, c.k, c.watcher
        hpa_down = {"verb": "patch", "resource": "horizontalpodautoscalers", "error_rate": 1.0, "status": 500}
        # 1. The record is written; the autoscaler's raise is not (nor, then, the "+1").
        sim.faults.set(**hpa_down)
        try:
            h.passes_until(h.reconciler_for(sim, CFG), lambda rep: record(k) is not None, max_passes=80)
        finally:
            sim.faults.clear()
        assert hpa_spec(k) == (3, 6)
        assert k.get(r.DEPLOYMENTS, "api", NS)["spec"]["replicas"] == 3
        # The next process ends that move (a hold: nothing was raised, nothing to restore) and,
        # once the hold is over, starts another.
        rec = h.reconciler_for(sim, CFG)
        h.passes_until(rec, lambda rep: hpa_spec(k)[0] == 4, max_passes=200)
        assert k.get(r.DEPLOYMENTS, "api", NS)["spec"]["replicas"] == 4

        # 2. The move is ready to finish: the scale back happens, the restore does not.
        def finishing(rep: Any) -> bool:
            return any(p.workload.key == API and p.action is Action.FINISH for p in rep.progress)

        sim.faults.set(**hpa_down)
        try:
            h.passes_until(h.reconciler_for(sim, CFG), finishing, max_passes=200)
        finally:
            sim.faults.clear()
        assert hpa_spec(k) == (4, 6)  # still raised: the record says what to put back
        left = record(k)
        assert left is not None and left["hpa"] == {"name": "api", "minReplicas": 3, "setMin": 4}
        # Scaled back, and the autoscaler, still at 4, puts the "+1" back at its next sync.
        h.wait_until(lambda: k.get(r.DEPLOYMENTS, "api", NS)["spec"]["replicas"] == 4, 30, "the autoscaler's sync")
        # From now on a steady load: the autoscaler keeps whatever count it finds (it will not
        # scale the 4 back down by itself, as it would under a load that needs 3).
        sim.store.mutate("horizontalpodautoscalers", "api", NS,
                         lambda o: o["metadata"]["annotations"].pop("sim.spotguard.io/load-replicas", None))
        # 3. The next process restores it and scales back again: the 4 is the move's own
        # minimum at work, not someone else's count (which a hold would have kept for good:
        # under a steady load the autoscaler keeps whatever count it finds).
        rec = h.reconciler_for(sim, CFG)
        h.passes_until(rec, lambda rep: record(k) is None, max_passes=20)
        assert hpa_spec(k) == (3, 6)
        assert k.get(r.DEPLOYMENTS, "api", NS)["spec"]["replicas"] == 3
        h.passes_until(rec, lambda rep: h.at_optimum(sim.store, [API]) and rep.optimal, max_passes=200)
        assert hpa_spec(k) == (3, 6)
        assert record(k) is None
        assert k.get(r.DEPLOYMENTS, "api", NS)["spec"]["replicas"] == 3
        assert watcher.lowest[API] >= 3


def test_a_raise_survives_a_process_killed_before_the_restore(tmp_path: Any) -> None:
    with api_on_demand(tmp_path) as c:
        sim, k = c.sim, c.k
        first = h.reconciler_for(sim, CFG)
        first_move(first)
        assert hpa_spec(k) == (4, 6)
        del first  # killed: only the workload's record says what to put back
        rec = h.reconciler_for(sim, CFG)
        h.passes_until(rec, lambda rep: record(k) is None or "holdUntil" in (record(k) or {}), max_passes=200)
        assert hpa_spec(k) == (3, 6)


def test_an_autoscaler_at_its_maximum_leaves_the_deployment_where_it_is(tmp_path: Any) -> None:
    """maxReplicas == replicas: a move cannot add one. Raising the user's cap for a saving, or
    evicting (one replica fewer serving), are both worse than staying on on-demand: the
    Deployment is skipped (``autoscaler-at-max``), quietly, pass after pass."""
    with api_on_demand(tmp_path, max_replicas=3) as c:
        sim, k = c.sim, c.k
        rec = h.reconciler_for(sim, CFG)

        def skipped(rep: Any) -> bool:
            return any(s.workload.key == API and s.reason is SkipReason.AUTOSCALER_AT_MAX for s in rep.plan.skipped)

        h.passes_until(rec, skipped, max_passes=80)
        writes = rec.kube.stats.writes
        for _ in range(3):
            rep = rec.reconcile()
            assert skipped(rep) and not rep.started and not rep.progress
        assert rec.kube.stats.writes == writes
        assert hpa_spec(k) == (3, 3)
        assert h.placement(sim.store)[API] == (3, 0, 0)
        assert k.get(r.DEPLOYMENTS, "api", NS)["spec"]["replicas"] == 3
