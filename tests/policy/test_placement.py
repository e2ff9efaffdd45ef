"""Placement: Deployment counting, reservations, StatefulSet ordinals, reinvocation, skips."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from spotguard.policy import capacity, config, floors, placement
from spotguard.policy.capacity import Capacity
from spotguard.policy.placement import Placement
from spotguard.policy.views import PodView
from spotguard.policy.workloads import Kind, Workload

from tests.policy.builders import expr, pod, required

CFG = config.Config()
NODES = {"od-1": Capacity.ON_DEMAND, "od-2": Capacity.ON_DEMAND, "spot-1": Capacity.SPOT}


def workload(kind: Kind = Kind.DEPLOYMENT, replicas: int = 4, **annotations: str) -> Workload:
    return Workload(kind=kind, namespace="shop", name="web", replicas=replicas, annotations=annotations)


def decide(
    new: PodView,
    wl: Workload,
    siblings: list[PodView] | tuple[PodView, ...] = (),
    reserved: int = 0,
) -> placement.Decision:
    return placement.decide(
        pod=new,
        workload=wl,
        floor=floors.floor_for(wl, CFG),
        siblings=siblings,
        node_capacity=NODES,
        reserved_on_demand=reserved,
    )


def labelled(name: str, where: str | None, node_name: str | None = None, **kw: Any) -> PodView:
    labels = {"app": "web"} | ({"spotguard.io/placement": where} if where else {})
    return pod(name, node_name=node_name, labels=labels, **kw)


@pytest.mark.parametrize(
    ("siblings", "reserved", "floor", "expected"),
    [
        ([], 0, "1", Placement.ON_DEMAND),
        ([], 1, "1", Placement.SPOT),  # a reservation in flight holds the slot
        ([labelled("a", None, "od-1")], 0, "1", Placement.SPOT),  # scheduled: by node
        ([labelled("a", "spot", "od-1")], 0, "1", Placement.SPOT),  # node beats label
        (
            [labelled("a", "on-demand", "spot-1")],
            0,
            "1",
            Placement.ON_DEMAND,
        ),  # on spot despite its label: counts as spot
        ([labelled("a", "on-demand")], 0, "1", Placement.SPOT),  # pending: by label
        ([labelled("a", "spot")], 0, "1", Placement.ON_DEMAND),
        ([labelled("a", None)], 0, "1", Placement.ON_DEMAND),  # pending, unlabelled: not counted
        ([labelled("a", None, "od-1"), labelled("b", None, "od-2")], 0, "3", Placement.ON_DEMAND),
        ([labelled("a", None, "od-1"), labelled("b", None, "od-2")], 1, "3", Placement.SPOT),
        ([labelled("a", None, "od-1"), labelled("b", None, "spot-1")], 0, "2", Placement.ON_DEMAND),
        ([labelled("a", None, "od-1", phase="Succeeded")], 0, "1", Placement.ON_DEMAND),
        ([labelled("a", None, "od-1", phase="Failed")], 0, "1", Placement.ON_DEMAND),
        ([], 0, "0", Placement.SPOT),
        ([], 0, "100%", Placement.ON_DEMAND),
        ([labelled(f"p{i}", "on-demand") for i in range(4)], 0, "100%", Placement.SPOT),
    ],
)
def test_deployment_counting(siblings: list[PodView], reserved: int, floor: str, expected: Placement) -> None:
    wl = workload(**{"spotguard.io/min-on-demand": floor})
    got = decide(pod("new", labels={"app": "web"}, uid=""), wl, siblings, reserved)
    assert got.placement is expected
    assert got.reason


def test_terminating_siblings_do_not_count() -> None:
    raw = labelled("a", None, "od-1")
    gone = dataclasses.replace(raw, terminating=True)
    assert decide(pod("new", uid=""), workload(), [gone]).placement is Placement.ON_DEMAND


def test_the_pod_itself_is_not_its_own_sibling() -> None:
    me = labelled("me", None, "od-1")
    assert decide(dataclasses.replace(me, labels={}), workload(), [me]).placement is (Placement.ON_DEMAND)


def test_unknown_capacity_nodes_count_as_mapped_by_the_caller() -> None:
    wl = workload()
    sib = labelled("a", None, "mystery")
    floor = floors.floor_for(wl, CFG)
    as_unknown = placement.decide(
        pod=pod("n", uid=""),
        workload=wl,
        floor=floor,
        siblings=[sib],
        node_capacity={"mystery": Capacity.UNKNOWN},
    )
    assert as_unknown.placement is Placement.ON_DEMAND  # unknown: not counted
    as_configured = placement.decide(
        pod=pod("n", uid=""),
        workload=wl,
        floor=floor,
        siblings=[sib],
        node_capacity={"mystery": CFG.node_capacity({})},
    )
    assert as_configured.placement is Placement.SPOT


@pytest.mark.parametrize(
    ("replicas", "name", "labels", "expected"),
    [
        (5, "db-0", {}, Placement.ON_DEMAND),
        (5, "db-2", {}, Placement.ON_DEMAND),  # floor 3
        (5, "db-3", {}, Placement.SPOT),
        (5, "db-4", {}, Placement.SPOT),
        (1, "db-0", {}, Placement.ON_DEMAND),
        (2, "db-1", {}, Placement.ON_DEMAND),  # floor 2 of 2
        (3, "db-2", {}, Placement.SPOT),
        (5, "db-x", {"apps.kubernetes.io/pod-index": "4"}, Placement.SPOT),  # label wins
        (5, "db-4", {"apps.kubernetes.io/pod-index": "1"}, Placement.ON_DEMAND),
        (5, "db-web-10", {"apps.kubernetes.io/pod-index": "bad"}, Placement.SPOT),
    ],
)
def test_statefulset_by_ordinal(replicas: int, name: str, labels: dict[str, str], expected: Placement) -> None:
    wl = workload(Kind.STATEFULSET, replicas)
    # a new set (no pods yet): the lowest ordinals take the floor
    got = decide(pod(name, labels=labels, owner=("StatefulSet", "db")), wl)
    assert got.placement is expected
    assert "ordinal" in got.reason


def sts_pod(ordinal: int, where: str | None = None, node_name: str | None = None) -> PodView:
    labels = {"app": "db"} | ({"spotguard.io/placement": where} if where else {})
    return pod(f"db-{ordinal}", node_name=node_name, labels=labels, owner=("StatefulSet", "db"))


def test_a_statefulset_grown_from_3_to_7_places_exactly_4_on_demand() -> None:
    # GIVEN pods 0, 1 on on-demand and pod 2 on spot, placed at size 3 (floor 2)
    placed = [sts_pod(0, "on-demand", "od-1"), sts_pod(1, "on-demand", "od-2"), sts_pod(2, "spot", "spot-1")]
    wl = workload(Kind.STATEFULSET, 7)  # floor 4
    # WHEN pods 3..6 are admitted one after the other
    for o in range(3, 7):
        got = decide(sts_pod(o), wl, placed)
        placed.append(sts_pod(o, got.placement.value if got.placement else None))
    # THEN pods 3 and 4 fill the two missing slots: 4 of 7 on on-demand
    assert [p.placement_label for p in placed] == ["on-demand"] * 2 + ["spot"] + ["on-demand"] * 2 + ["spot"] * 2


def test_statefulset_ordinals_start_counts_from_the_start() -> None:
    wl = workload(Kind.STATEFULSET, 3)  # floor 2, ordinals 5, 6, 7
    got = [
        placement.decide(
            pod=sts_pod(o), workload=wl, floor=floors.floor_for(wl, CFG), node_capacity=NODES, ordinal_start=5
        ).placement
        for o in (5, 6, 7)
    ]
    assert got == [Placement.ON_DEMAND, Placement.ON_DEMAND, Placement.SPOT]


def test_statefulset_pods_beyond_the_replicas_are_not_counted() -> None:
    wl = workload(Kind.STATEFULSET, 3)  # floor 2; pods 3, 4 are being scaled away
    placed = [sts_pod(0, "on-demand", "od-1"), sts_pod(3, "on-demand", "od-1"), sts_pod(4, "on-demand", "od-2")]
    assert decide(sts_pod(1), wl, placed).placement is Placement.ON_DEMAND
    assert decide(sts_pod(2), wl, placed).placement is Placement.SPOT


def test_statefulset_without_ordinal_is_left_alone() -> None:
    got = decide(pod("", owner=("StatefulSet", "db")), workload(Kind.STATEFULSET, 3))
    assert got.leave_alone


@pytest.mark.parametrize("label", ["on-demand", "spot"])
def test_reinvocation_keeps_the_earlier_decision(label: str) -> None:
    got = decide(labelled("a", label), workload(**{"spotguard.io/min-on-demand": "0"}), [], 5)
    assert got.placement is Placement(label)
    assert "reinvocation" in got.reason


def test_opted_out_workload_is_left_alone() -> None:
    got = decide(pod("a"), workload(**{"spotguard.io/enabled": "false"}))
    assert got.leave_alone and "opted out" in got.reason


def test_placement_of_capacity() -> None:
    assert Placement.of(Capacity.SPOT) is Placement.SPOT
    assert Placement.of(Capacity.ON_DEMAND) is Placement.ON_DEMAND
    assert Placement.of(Capacity.UNKNOWN) is None


SCHEME_KEYS = [s.key for s in capacity.DEFAULT_SCHEMES]


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"owner": ("DaemonSet", "agent")}, "owned by a DaemonSet"),
        ({"owner": ("Job", "batch")}, "owned by a Job"),
        ({"owner": None}, "bare pod"),
        ({"annotations": {"kubernetes.io/config.mirror": "abc"}}, "mirror pod"),
        ({"namespace": "kube-system"}, "excluded"),
        ({"namespace": "spotguard"}, "excluded"),
    ],
)
def test_skip_reasons(kw: dict[str, Any], reason: str) -> None:
    got = placement.skip_reason(pod("p", **kw), CFG)
    assert got is not None and reason in got


@pytest.mark.parametrize("key", SCHEME_KEYS)
def test_pinned_by_node_selector_on_any_scheme(key: str) -> None:
    got = placement.skip_reason(pod("p", spec={"nodeSelector": {key: "x"}}), CFG)
    assert got is not None and "pins" in got


@pytest.mark.parametrize("key", SCHEME_KEYS)
@pytest.mark.parametrize("operator", ["In", "NotIn", "Exists", "DoesNotExist"])
def test_pinned_by_required_affinity_on_any_scheme(key: str, operator: str) -> None:
    values = ("x",) if operator in ("In", "NotIn") else ()
    terms = [[expr("topology.kubernetes.io/zone", "In", "a")], [expr(key, operator, *values)]]
    got = placement.skip_reason(pod("p", spec=required(*terms)), CFG)
    assert got is not None and "pins" in got


def test_preferred_affinity_and_other_keys_do_not_pin() -> None:
    spec = required([expr("topology.kubernetes.io/zone", "In", "a")]) | {"nodeSelector": {"disk": "ssd"}}
    spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
        {"weight": 1, "preference": {"matchExpressions": [expr(SCHEME_KEYS[1], "In", "spot")]}}
    ]
    assert placement.skip_reason(pod("p", spec=spec), CFG) is None
    assert placement.skip_reason(pod("p", owner=("StatefulSet", "db")), CFG) is None


def test_the_on_demand_slots_a_surge_adds_are_surge_replicas() -> None:
    """The floor rises by a surge in progress; the slots above the base floor are the surge's
    extras (no deletion cost), the base floor's are not."""
    record = '{"replicas":4,"surge":2,"events":["e"],"nodes":["spot-1"],"started":1}'
    wl = workload(replicas=6, **{"spotguard.io/surge": record})
    floor = floors.floor_for(wl, CFG)
    assert floor.surge == 2
    base = floor.on_demand - floor.surge
    on_od = [pod(f"web-{i}", node_name="od-1") for i in range(base)]
    extra = decide(pod("web-new"), wl, on_od)
    assert extra.placement is Placement.ON_DEMAND and extra.surge
    short = decide(pod("web-new"), wl, on_od[:-1]) if base else None
    assert short is None or (short.placement is Placement.ON_DEMAND and not short.surge)
    surged = [
        dataclasses.replace(
            pod(f"web-s{i}", node_name="od-1", annotations={"spotguard.io/surge-replica": "true"}),
            creation_timestamp="2026-01-01T00:00:00Z",
        )
        for i in range(floor.surge)
    ]
    full = [pod(f"web-{i}", node_name="od-1") for i in range(base)] + surged
    assert decide(pod("web-new"), wl, full).placement is Placement.SPOT
    again = pod("web-new", labels={"spotguard.io/placement": "on-demand"},
                annotations={"spotguard.io/surge-replica": "true"})
    assert decide(again, wl).surge


# -- pods pinned to a node by spec.nodeName ----------------------------------------------


@pytest.mark.parametrize(
    ("node", "expected"),
    [("spot-1", Placement.SPOT), ("od-1", Placement.ON_DEMAND)],
)
def test_a_pod_pinned_to_a_node_is_placed_as_its_node(node: str, expected: Placement) -> None:
    decision = placement.pinned_slot(pod(node_name=node, phase="Pending"), NODES)
    assert decision is not None and decision.placement is expected


def test_a_pod_pinned_to_an_unknown_node_is_left_alone() -> None:
    decision = placement.pinned_slot(pod(node_name="gone", phase="Pending"), NODES)
    assert decision is not None and decision.leave_alone


def test_a_pod_not_pinned_is_decided_by_the_floor() -> None:
    assert placement.pinned_slot(pod(), NODES) is None


# -- a surge's replicas are on-demand every time -----------------------------------------

SURGE_AT = 1_800_000_000.0  # when the surge began (epoch seconds)


def _surging(replicas: int = 5, surge: int = 1) -> Workload:
    record = f'{{"replicas":{replicas - surge},"surge":{surge},"nodes":["spot-1"],"started":{SURGE_AT}}}'
    return workload(replicas=replicas, **{"spotguard.io/surge": record})


def _at(p: PodView, epoch: float) -> PodView:
    import datetime

    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return dataclasses.replace(p, creation_timestamp=stamp)


def test_a_surge_replica_is_on_demand_though_the_floor_is_already_exceeded() -> None:
    # a floor of 1, but two pods on on-demand (one spilled there): the surge adds one
    wl = _surging()
    siblings = [pod("web-a", node_name="od-1"), pod("web-b", node_name="od-2"), pod("web-c", node_name="spot-1")]
    decision = decide(pod("web-new"), wl, siblings)
    assert decision.placement is Placement.ON_DEMAND and decision.surge


def test_an_earlier_surges_leftover_is_not_this_surges_replica() -> None:
    # an on-demand surge replica created before this surge began counts against the floor
    wl = _surging()
    old = _at(pod("web-old", node_name="od-1", annotations={"spotguard.io/surge-replica": "true"}), SURGE_AT - 600)
    decision = decide(pod("web-new"), wl, [pod("web-a", node_name="od-1"), old])
    assert decision.placement is Placement.ON_DEMAND and decision.surge


def test_once_the_surge_has_its_replicas_the_next_pod_is_spot() -> None:
    wl = _surging()
    mine = _at(pod("web-s", node_name="od-1", annotations={"spotguard.io/surge-replica": "true"}), SURGE_AT + 1)
    assert decide(pod("web-new"), wl, [pod("web-a", node_name="od-1"), mine]).placement is Placement.SPOT
    # likewise when the surge replica is only reserved (a Deployment's Lease), not yet listed
    held = placement.decide(
        pod=pod("web-new"), workload=wl, floor=floors.floor_for(wl, CFG), reserved_on_demand=2, reserved_surge=1
    )
    assert held.placement is Placement.SPOT
    counted = placement.decide(
        pod=pod("web-new"), workload=wl, floor=floors.floor_for(wl, CFG), reserved_on_demand=2,
        surge_created=(SURGE_AT + 1,),
    )
    assert counted.placement is Placement.SPOT
    extra = placement.decide(
        pod=pod("web-new"), workload=wl, floor=floors.floor_for(wl, CFG), reserved_on_demand=2,
        surge_created=(SURGE_AT - 60,),
    )
    assert extra.placement is Placement.ON_DEMAND and extra.surge


def test_a_pod_of_spotguards_surge_copy_is_placed_by_its_template() -> None:
    # A copy's pods go where its template says (on-demand, or a spot slot for an autoscaler's
    # drain: surgecopy.build); a ReplicaSet named like one but not the label's is not a copy.
    labels = {"app": "web", "spotguard.io/surge-of": "web"}
    got = placement.skip_reason(pod("p", labels=labels, owner=("ReplicaSet", "spotguard-surge-web")), CFG)
    assert got is not None and "surge copy" in got
    assert placement.skip_reason(pod("p", labels=labels, owner=("ReplicaSet", "web-abc12")), CFG) is None
    plain = pod("p", labels={"app": "web"}, owner=("ReplicaSet", "spotguard-surge-web"))
    assert placement.skip_reason(plain, CFG) is None
