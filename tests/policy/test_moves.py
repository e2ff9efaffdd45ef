"""The node-added plan's extensions: repairs, what leaves a workload alone, and how a recorded move ends."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from typing import Any

import pytest
from spotguard.policy import config, floors, moves, rebalance
from spotguard.policy.capacity import Capacity
from spotguard.policy.moves import Action, Direction, Method, MoveRecord
from spotguard.policy.rebalance import SkipReason
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import PodView
from spotguard.policy.workloads import DELETION_COST, MOVE_REQUIRES_SPOT, SURGE, Kind, Workload

from tests.policy.builders import node, pod

CFG = config.Config()
NOW = 1_800_000_000.0
NODES = [node("od-1", "on-demand"), node("od-2", "on-demand"), node("spot-1", "spot"), node("spot-2", "spot")]
CAPACITY = {n.name: CFG.node_capacity(n.labels) for n in NODES}


def wpod(i: int, node_name: str | None, *, kind: Kind = Kind.DEPLOYMENT, ready: bool = True, **kw: Any) -> PodView:
    owner = ("StatefulSet", "db") if kind is Kind.STATEFULSET else ("ReplicaSet", "web-7d9f")
    name = f"db-{i}" if kind is Kind.STATEFULSET else f"web-7d9f-{i:05d}"
    return pod(name, owner=owner, node_name=node_name, ready=ready, labels={"app": "web"}, **kw)


def state(
    pods: Sequence[PodView], *, kind: Kind = Kind.DEPLOYMENT, replicas: int | None = None, **ann: str
) -> WorkloadState:
    name = "db" if kind is Kind.STATEFULSET else "web"
    wl = Workload(kind, "shop", name, len(pods) if replicas is None else replicas, ann)
    return WorkloadState(wl, floors.floor_for(wl, CFG), tuple(pods))


def plan(*states: WorkloadState, cfg: config.Config = CFG, **kw: Any) -> rebalance.Plan:
    pods = [p for s in states for p in s.pods]
    return rebalance.plan(cfg, NODES, pods, states, **kw)


# -- repairs ------------------------------------------------------------------------------


def test_a_deployment_below_its_floor_gets_a_replica_back_on_on_demand() -> None:
    s = state([wpod(0, "spot-1"), wpod(1, "spot-2"), wpod(2, "spot-1")])
    p = plan(s)
    [repair] = p.repairs
    assert repair.direction is Direction.TO_ON_DEMAND and repair.method is Method.SCALE
    assert repair.to_node in ("od-1", "od-2") and repair.pod.node_name.startswith("spot-")
    assert p.first_step() == [repair]


def test_a_statefulset_repair_evicts_its_lowest_ordinal_on_spot() -> None:
    s = state([wpod(i, "spot-1", kind=Kind.STATEFULSET) for i in range(3)], kind=Kind.STATEFULSET)
    [repair] = plan(s).repairs
    assert repair.method is Method.EVICT and repair.pod.name == "db-0"


def test_no_on_demand_room_no_repair() -> None:
    full = [node("od-1", "on-demand", pods=1), node("spot-1", "spot")]
    s = state([wpod(0, "spot-1"), wpod(1, "spot-1")])
    other = pod("other", owner=None, node_name="od-1")
    p = rebalance.plan(CFG, full, [*s.pods, other], [s])
    assert not p.repairs
    [skip] = p.skipped
    assert skip.reason is SkipReason.NO_ON_DEMAND_ROOM


@pytest.mark.parametrize(
    ("pods", "reason"),
    [
        ([wpod(0, "spot-1"), wpod(1, None)], SkipReason.PENDING_PODS),
        ([wpod(0, "spot-1"), wpod(1, "spot-2", ready=False)], SkipReason.NOT_READY_PODS),
        ([wpod(0, "spot-1")], SkipReason.PODS_MISSING),  # 1 of 2
        # 3 for 2: the scale-down after a finished move, its pod ranked first still there
        ([wpod(0, "od-1"), wpod(1, "od-2"), wpod(2, "spot-1")], SkipReason.PODS_LEAVING),
    ],
)
def test_a_workload_in_motion_is_left_alone(pods: list[PodView], reason: SkipReason) -> None:
    s = state(pods, replicas=2)
    p = plan(s)
    assert not p.repairs and [x.reason for x in p.skipped] == [reason]


def test_a_rollout_is_left_alone() -> None:
    other = pod("web-8e0a-00001", owner=("ReplicaSet", "web-8e0a"), node_name="spot-1", labels={"app": "web"})
    s = state([wpod(0, "spot-1"), other])
    assert [x.reason for x in plan(s).skipped] == [SkipReason.ROLLOUT]


def test_a_recorded_move_or_a_surge_leaves_the_workload_alone() -> None:
    record = MoveRecord(Direction.TO_SPOT, Method.SCALE, "x", "u", 3, 4, NOW, 2)
    s = state([wpod(0, "od-1"), wpod(1, "od-2")], **{moves.MOVE: record.to_json()})
    assert [x.reason for x in plan(s).skipped] == [SkipReason.MOVE_IN_PROGRESS]
    surge = json.dumps({"replicas": 3, "surge": 1, "events": [], "nodes": [], "started": NOW})
    s = state([wpod(0, "od-1"), wpod(1, "od-2"), wpod(2, "od-1")], **{"spotguard.io/surge": surge})
    assert [x.reason for x in plan(s).skipped] == [SkipReason.SURGE_IN_PROGRESS]
    done = json.dumps({"replicas": 2, "surge": 0, "events": [], "nodes": [], "started": NOW, "done": True})
    s = state([wpod(0, "od-1"), wpod(1, "od-2")], **{"spotguard.io/surge": done})
    assert len(plan(s).moves) == 1  # a finished surge no longer holds it


def test_a_budget_allowing_no_disruption_blocks_statefulset_moves_only() -> None:
    sts = state([wpod(i, "od-1", kind=Kind.STATEFULSET) for i in range(5)], kind=Kind.STATEFULSET)
    dep = state([wpod(0, "od-1"), wpod(1, "od-2")])
    p = plan(sts, dep, budgets={sts.key: 0, dep.key: 0})
    assert [m.workload.key for m in p.moves] == [dep.key]
    assert [(x.workload.key, x.reason) for x in p.skipped] == [(sts.key, SkipReason.BUDGET)]


def test_young_pods_settle_before_anything_moves() -> None:
    young = dataclasses.replace(wpod(1, "spot-2"), creation_timestamp="2027-01-15T08:00:00Z")
    s = state([wpod(0, "spot-1"), young])
    now = young.created + 10
    p = plan(s, now=now)
    assert [x.reason for x in p.skipped] == [SkipReason.SETTLING] and not p.repairs
    assert plan(s, now=now + CFG.rebalance_settle_seconds).repairs


def test_an_optimal_cluster_plans_nothing_and_never_reads_every_pod() -> None:
    s = state([wpod(0, "od-1"), wpod(1, "spot-1")])

    def pods() -> list[PodView]:
        raise AssertionError("read every pod for nothing")

    p = rebalance.plan(CFG, NODES, pods, [s])
    assert p.empty and not p.repairs and not p.skipped


# -- the record and how a move ends --------------------------------------------------------


def record(**kw: Any) -> MoveRecord:
    base = {
        "direction": Direction.TO_SPOT,
        "method": Method.SCALE,
        "pod": "web-7d9f-00000",
        "uid": "uid-shop-web-7d9f-00000",
        "replicas": 2,
        "scaled_to": 3,
        "started": NOW,
        "on_demand": 2,
        "cost": "1000",
    }
    base.update(kw)
    return MoveRecord(**base)


def test_the_record_round_trips_and_garbage_is_none() -> None:
    r = record(hold_until=NOW + 5, reason="why")
    assert MoveRecord.parse(r.to_json()) == r
    for text in ("", "[]", "{}", '{"direction": "sideways"}', "not json"):
        assert MoveRecord.parse(text) is None


def progress(pods: Sequence[PodView], r: MoveRecord, *, replicas: int = 3, now: float = NOW + 10) -> moves.Progress:
    s = state(pods, replicas=replicas, **{moves.MOVE: r.to_json()})
    return moves.progress(s, r, CAPACITY, now, timeout=300, hold_seconds=600)


def test_finish_once_the_new_replica_is_ready_on_spot() -> None:
    p = progress([wpod(0, "od-1"), wpod(1, "od-2"), wpod(2, "spot-1")], record())
    assert p.action is Action.FINISH and p.replicas == 2 and p.hold is None


def test_a_finish_whose_record_removal_lost_to_a_status_write_finishes_again() -> None:
    """A pass scaled back (record kept, scaled_to 2: the ranked pod went first) and lost the
    record's removal to a status write (409). The next pass finds the marked pod gone and the
    count at the move's: it finishes (removes the record) at that count, no hold, and says so."""
    r = record(scaled_to=2)
    p = progress([wpod(1, "od-2"), wpod(2, "spot-1")], r, replicas=2)
    assert p.action is Action.FINISH and p.replicas == 2 and p.hold is None
    assert p.reason == "2 replicas Ready; the 1 it replaces already gone"


def test_finish_with_a_hold_when_the_new_replica_landed_on_on_demand() -> None:
    p = progress([wpod(0, "od-1"), wpod(1, "od-2"), wpod(2, "od-1")], record())
    assert p.action is Action.FINISH and p.hold is not None and p.hold.held


def test_wait_while_the_new_replica_is_not_ready_then_abort() -> None:
    pods = [wpod(0, "od-1"), wpod(1, "od-2"), wpod(2, "spot-1", ready=False)]
    assert progress(pods, record()).action is Action.WAIT
    p = progress(pods, record(), now=NOW + 301)
    assert p.action is Action.ABORT and p.replicas == 2 and p.restore_cost and p.hold is not None


def test_someone_else_changed_the_count_theirs_wins_and_nothing_loops() -> None:
    p = progress([wpod(0, "od-1"), wpod(1, "od-2")], record(), replicas=2)
    assert p.action is Action.HOLD and p.replicas is None and p.restore_cost and p.hold is not None


def test_a_move_whose_plus_k_never_followed_its_record_ends_without_a_hold() -> None:
    """The count changed between the record and the "+k" (an interruption surge, then its scale
    back to the owner's count): the move never began. It ends, its ranks back, with no hold;
    the record says so (``scaled``), and a "+k" that was written keeps the old rule."""
    never = record(scaled=False)
    assert MoveRecord.parse(never.to_json()) == never and MoveRecord.parse(record().to_json()).scaled is None
    pods = [wpod(0, "od-1"), wpod(1, "od-2")]
    # while the surge is on, nothing; within the start window, a wait for the "+k"
    surging = state(pods, replicas=4, **{moves.MOVE: never.to_json(), "spotguard.io/surge": '{"replicas":2}'})
    assert moves.progress(surging, never, CAPACITY, NOW + 100).action is Action.WAIT
    assert progress(pods, never, replicas=2, now=NOW + 5).action is Action.WAIT
    p = progress(pods, never, replicas=2, now=NOW + moves.START_SECONDS + 1)
    assert p.action is Action.END and p.hold is None and p.restore_cost
    # a "+k" written and then put back by someone else: theirs wins, held
    put_back = progress(pods, record(scaled=True), replicas=2, now=NOW + moves.START_SECONDS + 1)
    assert put_back.action is Action.HOLD and put_back.hold is not None


def test_the_autoscaler_restoring_the_plus_one_is_not_someone_elses_change() -> None:
    """The finish scaled back to 2 (record kept at scaled_to 2) but restoring the autoscaler's
    minimum (raised to 3 by the move) failed: the autoscaler put the count back to 3. That is
    the move's own minimum at work: the finish runs again (scale back, restore), instead of a
    hold that keeps 3 for good (steady load: the autoscaler keeps whatever count it finds;
    tests/chaos half under 500s: api left at 4)."""
    r = record(scaled_to=2, hpa="web", hpa_min=2, hpa_set=3)
    pods = [wpod(0, "od-1"), wpod(1, "spot-1"), wpod(2, "spot-2")]
    s = state(pods, replicas=3, **{moves.MOVE: r.to_json()})
    p = moves.progress(s, r, CAPACITY, NOW + 10, timeout=300, hold_seconds=600, autoscaler_min=3)
    assert p.action is Action.FINISH and p.replicas == 2
    # the autoscaler synced between the scale back and the restore: the same
    restored = moves.progress(s, r, CAPACITY, NOW + 10, timeout=300, hold_seconds=600, autoscaler_min=2)
    assert restored.action is Action.FINISH and restored.replicas == 2
    # the user (or anyone) set the minimum meanwhile: their count wins, as before
    p = moves.progress(s, r, CAPACITY, NOW + 10, timeout=300, hold_seconds=600, autoscaler_min=4)
    assert p.action is Action.HOLD and p.replicas is None


def test_a_hold_ends_and_gives_the_cost_back() -> None:
    held = record(hold_until=NOW + 50, reason="x")
    assert progress([wpod(0, "od-1"), wpod(1, "od-2")], held, replicas=2).action is Action.WAIT
    p = progress([wpod(0, "od-1"), wpod(1, "od-2")], held, replicas=2, now=NOW + 51)
    assert p.action is Action.END and p.restore_cost


def test_an_eviction_move_ends_when_the_pod_is_back_where_wanted() -> None:
    r = record(method=Method.EVICT, pod="db-2", uid="old", replicas=3, scaled_to=3)
    sts = [wpod(0, "od-1", kind=Kind.STATEFULSET), wpod(1, "od-1", kind=Kind.STATEFULSET)]
    back_on_spot = wpod(2, "spot-1", kind=Kind.STATEFULSET)
    back_on_od = wpod(2, "od-2", kind=Kind.STATEFULSET)
    still = dataclasses.replace(back_on_od, uid="old")

    def step(pods: list[PodView], now: float = NOW + 10) -> moves.Progress:
        s = state(pods, kind=Kind.STATEFULSET, replicas=3)
        return moves.progress(s, r, CAPACITY, now, timeout=300, hold_seconds=600)

    assert step([*sts, back_on_spot]).action is Action.END
    assert step([*sts, back_on_od]).action is Action.HOLD
    assert step([*sts, still]).action is Action.EVICT
    assert step(sts).action is Action.WAIT
    assert step(sts, NOW + 400).action is Action.HOLD


def test_capacity_of_unknown_nodes_is_the_configured_one() -> None:
    assert CAPACITY["od-1"] is Capacity.ON_DEMAND


# -- the autoscaler's minimum during a scale move --------------------------------------------


def test_the_autoscaler_part_of_the_record_round_trips() -> None:
    r = record(hpa="web", hpa_min=2, hpa_set=3)
    assert MoveRecord.parse(r.to_json()) == r
    assert json.loads(r.to_json())["hpa"] == {"name": "web", "minReplicas": 2, "setMin": 3}
    assert MoveRecord.parse(r.to_json().replace('"setMin":3', '"setMin":"3"')) is None  # not an integer
    assert moves.without_autoscaler(r) == record()


def test_the_minimum_is_restored_only_while_it_holds_the_moves_value() -> None:
    r = record(hpa="web", hpa_min=2, hpa_set=3)
    assert moves.autoscaler_restore(r, 3) == 2
    assert moves.autoscaler_restore(r, 5) is None  # someone else set it: theirs stays
    assert moves.autoscaler_restore(r, 2) is None  # already back
    assert moves.autoscaler_restore(r, None) is None  # the autoscaler is gone
    assert moves.autoscaler_restore(record(), 3) is None  # nothing was raised


def test_an_autoscaler_at_its_maximum_leaves_no_room_for_a_scale_move() -> None:
    dep = state([wpod(0, "od-1"), wpod(1, "od-2"), wpod(2, "od-1")])
    sts = state([wpod(i, "od-1", kind=Kind.STATEFULSET) for i in range(3)], kind=Kind.STATEFULSET)
    at_max = plan(dep, sts, autoscaler_max={dep.key: 3})
    assert [(x.workload.key, x.reason) for x in at_max.skipped] == [(dep.key, SkipReason.AUTOSCALER_AT_MAX)]
    assert [m.workload.key for m in at_max.moves] == [sts.key]  # an eviction move needs no "+1"
    assert dep.key in {m.workload.key for m in plan(dep, autoscaler_max={dep.key: 4}).moves}


# -- batches (several pods in one move) ------------------------------------------------------


def new(p: PodView, seconds_after_start: float = 5) -> PodView:
    """A replica the move created (after it began)."""
    stamp = datetime.datetime.fromtimestamp(NOW + seconds_after_start, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return dataclasses.replace(p, creation_timestamp=stamp)


def batch_record() -> MoveRecord:
    more = (moves.Marked("web-7d9f-00001", "uid-shop-web-7d9f-00001", None),
            moves.Marked("web-7d9f-00002", "uid-shop-web-7d9f-00002", "1000"))  # fmt: skip
    return record(replicas=4, scaled_to=7, on_demand=4, more=more)


def test_a_batch_record_round_trips_and_names_every_pod_it_removes() -> None:
    r = batch_record()
    assert MoveRecord.parse(r.to_json()) == r
    assert [m.pod for m in r.marked] == ["web-7d9f-00000", "web-7d9f-00001", "web-7d9f-00002"] and r.size == 3


def batch_pods(ready_new: int, pending_new: int, *, restored: Sequence[int] = ()) -> list[PodView]:
    # 0, 1, 2 ranked first by the move (``restored``: their cost already back); 3 the floor
    before = {1: None, 2: "1000"}
    ranked = {DELETION_COST: str(moves.FIRST_TO_GO)}

    def cost(i: int) -> dict[str, str]:
        if i >= 3:
            return {}
        if i in restored:
            return {} if before.get(i) is None else {DELETION_COST: str(before[i])}
        return ranked

    old = [wpod(i, "od-1", annotations=cost(i)) for i in range(4)]
    fresh = [new(wpod(10 + i, "spot-1")) for i in range(ready_new)]
    fresh += [new(wpod(20 + i, None, ready=False)) for i in range(pending_new)]
    return old + fresh


def test_a_batch_waits_for_pending_replicas_then_finishes_when_all_are_ready() -> None:
    r = batch_record()
    # two Ready on spot, one Pending (waiting for a launch): progress, not failure
    p = progress(batch_pods(2, 1), r, replicas=7, now=NOW + 60)
    assert p.action is Action.WAIT and "1 Pending" in p.reason
    p = progress(batch_pods(3, 0), r, replicas=7, now=NOW + 90)
    assert p.action is Action.FINISH and p.replicas == 4 and p.hold is None
    assert [m.pod for m in p.rank] == [m.pod for m in r.marked] and not p.restore


def test_a_launch_that_never_comes_keeps_what_arrived_and_undoes_the_rest() -> None:
    r = batch_record()
    # at the timeout, 1 of 3 new replicas is Ready: one ranked pod goes, two get their cost back
    p = progress(batch_pods(1, 2), r, replicas=7, now=NOW + 301)
    assert p.action is Action.FINISH and p.replicas == 4 and p.hold is None
    assert [m.pod for m in p.rank] == ["web-7d9f-00000"]
    assert [(m.pod, m.cost) for m in p.restore] == [("web-7d9f-00001", None), ("web-7d9f-00002", "1000")]
    # none arrived: undone, every rank back, and a hold
    p = progress(batch_pods(0, 3), r, replicas=7, now=NOW + 301)
    assert p.action is Action.ABORT and p.replicas == 4 and len(p.restore) == 3 and p.hold is not None


def test_a_cost_already_back_is_not_restored_again() -> None:
    """A pass whose restores failed half-way (one patch a pod) keeps those it made; the next
    restores only the rest. Patching every ranked pod each pass, a move of 30 replicas under
    20 % failed requests never got all 30 through in one pass and stayed in progress for good
    (chaos spot-refused-after-reclaim under 500s)."""
    r = batch_record()
    p = progress(batch_pods(0, 3, restored=(1,)), r, replicas=7, now=NOW + 301)
    assert p.action is Action.ABORT
    assert [(m.pod, m.cost) for m in p.restore] == [("web-7d9f-00000", "1000"), ("web-7d9f-00002", "1000")]
    p = progress(batch_pods(0, 3, restored=(1, 2)), r, replicas=7, now=NOW + 301)
    assert [m.pod for m in p.restore] == ["web-7d9f-00000"]


def test_a_never_begun_batch_restores_only_the_costs_not_back() -> None:
    """A batch whose "+k" never followed its record ends (no hold), its ranks back: only those
    not back yet. Restoring all ten of worker's each pass under 20 % failed requests, its record
    stayed (a move in progress) for minutes (chaos spot-refused-after-reclaim under 500s)."""
    r = dataclasses.replace(batch_record(), scaled=False)
    pods = batch_pods(0, 0, restored=(1,))
    p = progress(pods, r, replicas=4, now=NOW + moves.START_SECONDS + 1)
    assert p.action is Action.END and p.hold is None
    assert [m.pod for m in p.restore] == ["web-7d9f-00000", "web-7d9f-00002"]
    p = progress(batch_pods(0, 0, restored=(1, 2)), r, replicas=4, now=NOW + moves.START_SECONDS + 1)
    assert p.action is Action.END and [m.pod for m in p.restore] == ["web-7d9f-00000"]


def test_a_move_to_spot_under_way_asks_new_replicas_to_require_spot() -> None:
    wl = Workload(Kind.DEPLOYMENT, "shop", "web", 5, {moves.MOVE: batch_record().to_json()})
    assert moves.launching(wl)
    held = Workload(Kind.DEPLOYMENT, "shop", "web", 4, {moves.MOVE: record(hold_until=NOW).to_json()})
    repair = Workload(Kind.DEPLOYMENT, "shop", "web", 4,
                      {moves.MOVE: record(direction=Direction.TO_ON_DEMAND).to_json()})  # fmt: skip
    assert not moves.launching(held) and not moves.launching(repair)
    assert not moves.launching(Workload(Kind.DEPLOYMENT, "shop", "web", 4, {}))


def test_replicas_the_owner_adds_during_a_move_to_spot_do_not_require_spot() -> None:
    """The move set the count to 7 (4 + 3). A count above that is someone else's (the owner, an
    autoscaler): the replicas created for it are placed as any spot slot (spot preferred), not
    given the move's requirement. Before, with spot refused, three of worker's owner's new
    replicas waited Pending for good (chaos spot-refused-after-reclaim under 500s)."""
    r = batch_record()  # replicas 4, scaled_to 7
    for count in (4, 7):  # the "+k" to come (the admission webhook's copy read before it), or made
        wl = Workload(Kind.DEPLOYMENT, "shop", "web", count, {moves.MOVE: r.to_json()})
        assert moves.launching_move(wl) == r
    grown = Workload(Kind.DEPLOYMENT, "shop", "web", 8, {moves.MOVE: r.to_json()})
    assert moves.launching_move(grown) is None and not moves.launching(grown)


def test_replicas_created_during_an_interruption_surge_do_not_require_spot() -> None:
    """An interruption surge on the workload (a notice; a node autoscaler's drain) while a move to
    spot is recorded: the move waits, and the replicas created now replace pods going away. With
    the move's requirement, a drained pod's replacement waited Pending while EC2 refused spot and
    the surge's copy went at its deadline: a replica fewer serving (chaos spot-refused-after-
    reclaim under 500s: web 6 -> 5 after a Karpenter consolidation's drain)."""
    r = batch_record()
    surging = Workload(Kind.DEPLOYMENT, "shop", "web", 7, {moves.MOVE: r.to_json(), SURGE: '{"replicas": 7}'})
    assert moves.launching_move(surging) is None
    over = Workload(Kind.DEPLOYMENT, "shop", "web", 7, {moves.MOVE: r.to_json(), SURGE: '{"done": true}'})
    assert moves.launching_move(over) == r


def stranded_pod(i: int, tag: str | None, *, node_name: str | None = None, age: float = 60.0) -> PodView:
    p = new(wpod(i, node_name, ready=False), seconds_after_start=0)
    p = dataclasses.replace(p, annotations={MOVE_REQUIRES_SPOT: tag} if tag is not None else {})
    stamp = datetime.datetime.fromtimestamp(NOW + 1000 - age, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return dataclasses.replace(p, creation_timestamp=stamp)


def test_a_pod_pending_on_a_moves_spot_requirement_is_stranded_once_the_move_is_no_longer_under_way() -> None:
    """The rule node-added follows to take the pods nothing else takes: Pending, with the spot
    requirement a move gave them (the admission webhook's mark names the move), once that move
    is over (no record, held, another move since): their controller makes them again, placed
    as usual. Never the pods of the move under way, a pod on a node, a pod just created, or a
    pod without spotguard's mark (a user's own spot requirement)."""
    now = NOW + 1000
    r = batch_record()
    tag = moves.move_id(r)
    assert tag == f"{NOW:.3f}"
    under_way = Workload(Kind.DEPLOYMENT, "shop", "web", 7, {moves.MOVE: r.to_json()})
    held = Workload(Kind.DEPLOYMENT, "shop", "web", 8, {moves.MOVE: moves.held(r, now, "replicas changed").to_json()})
    over = Workload(Kind.DEPLOYMENT, "shop", "web", 7, {})
    another = dataclasses.replace(r, started=NOW + 900)
    later = Workload(Kind.DEPLOYMENT, "shop", "web", 7, {moves.MOVE: another.to_json()})
    grown = Workload(Kind.DEPLOYMENT, "shop", "web", 8, {moves.MOVE: r.to_json()})
    surging = Workload(Kind.DEPLOYMENT, "shop", "web", 7, {moves.MOVE: r.to_json(), SURGE: '{"replicas": 7}'})
    pending = stranded_pod(20, tag)
    # the move under way: its replicas wait for the launch
    assert not moves.stranded(pending, under_way, now)
    # the move held (someone else set the count), ended, or another move since: stranded
    assert moves.stranded(pending, held, now)
    assert moves.stranded(pending, over, now)
    assert moves.stranded(pending, later, now)
    # what admission would not give now either: the count the owner's, an interruption surge
    # (its record on the workload, or its copy serving it)
    assert moves.stranded(pending, grown, now)
    assert moves.stranded(pending, surging, now)
    assert moves.stranded(pending, under_way, now, surge_copy=True)
    # never a pod that has a node, is gone, is younger than the settle time, or has no mark
    assert not moves.stranded(stranded_pod(21, tag, node_name="spot-1"), over, now)
    assert not moves.stranded(dataclasses.replace(pending, terminating=True), over, now)
    assert not moves.stranded(stranded_pod(22, tag, age=moves.START_SECONDS - 1), over, now)
    assert not moves.stranded(stranded_pod(23, None), over, now)


def test_a_move_whose_count_has_not_followed_its_record_yet_is_starting_not_someone_elses_change() -> None:
    """A pass writes the record, waits for the admission webhook's cache, then scales: a second
    reconcile reading in between (the spec untouched: the record's generation) waits instead of
    ending the move with a hold (two reconcilers at once then never moved anything)."""
    r = record(generation=7)
    pods = [wpod(0, "od-1"), wpod(1, "od-2")]

    def at(generation: int, now: float) -> moves.Progress:
        wl = Workload(Kind.DEPLOYMENT, "shop", "web", 2, {moves.MOVE: r.to_json()}, generation=generation)
        s = WorkloadState(wl, floors.floor_for(wl, CFG), tuple(pods))
        return moves.progress(s, r, CAPACITY, now, timeout=300, hold_seconds=600)

    assert at(7, NOW + 5).action is Action.WAIT
    # the count put back after the "+1" (the spec written twice since): theirs wins, as before
    assert at(9, NOW + 5).action is Action.HOLD
    # a pass cut off after its record: ended with a hold once the start is overdue
    assert at(7, NOW + moves.START_SECONDS + 1).action is Action.HOLD
    # a record without a generation (written before it was kept): as before
    assert progress(pods, record(), replicas=2).action is Action.HOLD
    assert MoveRecord.parse(r.to_json()) == r
