"""Ranked deletion costs: a scale-down keeps exactly the floor's on-demand pods."""

from __future__ import annotations

import pytest
from spotguard.policy import config, floors, moves, patches, ranks
from spotguard.policy.floors import Count, FloorSpec, Percent
from spotguard.policy.placement import Placement
from spotguard.policy.ranks import Ranks
from spotguard.policy.workloads import DELETION_COST, Kind, Workload

from tests.policy.builders import pod_json

BASE = config.Config().on_demand_deletion_cost
SPECS: list[FloorSpec] = [Count(0), Count(1), Count(3), Percent(1), Percent(25), Percent(30), Percent(50),
                          Percent(75), Percent(99), Percent(100)]


def admit(r: Ranks, replicas: int) -> list[tuple[Placement, int]]:
    """Admit ``replicas`` pods one by one as placement.decide would (on-demand while fewer
    on-demand pods than the floor), each with its number: (placement, number)."""
    pods: list[tuple[Placement, int]] = []
    for _ in range(replicas):
        on_demand = sum(1 for where, _ in pods if where is Placement.ON_DEMAND)
        where = Placement.ON_DEMAND if on_demand < r.floor_at(replicas) else Placement.SPOT
        pods.append((where, r.number(where, {n for _, n in pods})))
    return pods


def keep(r: Ranks, pods: list[tuple[Placement, int]], m: int) -> list[tuple[Placement, int]]:
    """What a scale-down to ``m`` keeps of equally Ready pods: the highest deletion costs
    (upstream's ties go either way: the worst case, spot kept, is taken)."""
    ordered = sorted(pods, key=lambda p: (r.cost(p[1]), p[0] is Placement.SPOT), reverse=True)
    return ordered[:m]


def test_a_quarter_floor_numbers_every_fourth_replica_on_demand() -> None:
    r = Ranks(Percent(25), BASE)
    assert [n for n in range(1, 41) if r.is_on_demand(n)] == [1, 5, 9, 13, 17, 21, 25, 29, 33, 37]
    assert r.ordered


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_the_first_m_numbers_hold_exactly_the_floor_of_m(spec: FloorSpec) -> None:
    r = Ranks(spec, BASE)
    for m in range(0, 200):
        assert sum(1 for n in range(1, m + 1) if r.is_on_demand(n)) == spec.resolve(m)


@pytest.mark.parametrize("spec", [s for s in SPECS if s != Count(0)], ids=repr)
def test_every_scale_down_keeps_exactly_the_floor(spec: FloorSpec) -> None:
    r = Ranks(spec, BASE)
    pods = admit(r, 40)
    for m in range(0, 41):
        kept = keep(r, pods, m)
        assert sum(1 for where, _ in kept if where is Placement.ON_DEMAND) == spec.resolve(m), m


def test_forty_to_eight_at_a_quarter_keeps_two_on_demand() -> None:
    r = Ranks(Percent(25), BASE)
    kept = keep(r, admit(r, 40), 8)
    assert sorted(n for _, n in kept) == list(range(1, 9))
    assert [n for where, n in kept if where is Placement.ON_DEMAND] == [1, 5]


def test_a_replacement_takes_the_number_of_the_pod_it_replaces() -> None:
    r = Ranks(Percent(25), BASE)
    taken = set(range(1, 41)) - {5, 6}
    assert r.number(Placement.ON_DEMAND, taken) == 5
    assert r.number(Placement.SPOT, taken) == 6
    assert r.number(Placement.SPOT, set(range(1, 41))) == 42  # 41 is on-demand
    assert r.number(Placement.ON_DEMAND, set(range(1, 41))) == 41


def test_a_count_floor_gives_every_spot_pod_one_number_after_the_floor() -> None:
    """Spot numbers all come after the on-demand ones: their order among themselves is
    upstream's (co-located pods first), and no instance needs to agree on them."""
    r = Ranks(Count(3), BASE)
    assert not r.ordered
    assert [r.number(Placement.ON_DEMAND, set(range(1, k))) for k in (1, 2, 3)] == [1, 2, 3]
    assert r.number(Placement.SPOT, {1, 2, 3, 4}) == 4
    assert Ranks(Count(1), BASE).number(Placement.SPOT, set()) == 2


def test_an_on_demand_pod_beyond_a_count_floor_takes_the_first_free_number() -> None:
    r = Ranks(Count(2), BASE)
    assert r.number(Placement.ON_DEMAND, {1, 2, 3}) == 4


def test_costs_stay_above_surge_replicas_and_moves() -> None:
    """Surge replicas (no cost: 0) go first at the scale back, a move's pod and the doomed
    pods before them: below every numbered pod, whatever its number."""
    r = Ranks(Percent(25), 1000)
    assert [r.cost(n) for n in (1, 2, 999, 5000)] == [999, 998, 1, 1]
    default = Ranks(Percent(25), BASE)
    assert default.cost(100_000) > 0 > moves.SURGE_FIRST > moves.FIRST_TO_GO > moves.DOOMED_FIRST


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({DELETION_COST: str(BASE - 7)}, 7),
        ({DELETION_COST: str(BASE)}, None),  # an on-demand pod's unranked cost
        ({DELETION_COST: "0"}, None),
        ({DELETION_COST: "-1000000"}, None),  # a move's
        ({DELETION_COST: "x"}, None),
        ({}, None),
    ],
)
def test_the_number_a_cost_stands_for(annotations: dict[str, str], expected: int | None) -> None:
    assert ranks.number_of(annotations, BASE) == expected


def test_ranks_for_deployments_only_and_not_when_costs_are_off() -> None:
    deploy = Workload(kind=Kind.DEPLOYMENT, namespace="shop", name="w", replicas=40,
                      annotations={"spotguard.io/min-on-demand": "25%"})
    cfg = config.Config()
    assert ranks.ranks_for(floors.base_spec(deploy, cfg), BASE) == Ranks(Percent(25), BASE)
    plain = Workload(kind=Kind.DEPLOYMENT, namespace="shop", name="w", replicas=4, annotations={})
    assert floors.base_spec(plain, cfg) == Count(1)
    sts = Workload(kind=Kind.STATEFULSET, namespace="shop", name="db", replicas=4, annotations={})
    assert floors.base_spec(sts, cfg) is None
    off = Workload(kind=Kind.DEPLOYMENT, namespace="shop", name="w", replicas=4,
                   annotations={"spotguard.io/enabled": "false"})
    assert floors.base_spec(off, cfg) is None
    assert ranks.ranks_for(Percent(25), 0) is None


def test_the_patch_puts_the_ranked_cost_on_spot_and_on_demand_pods_but_keeps_the_users() -> None:
    cfg = config.Config()
    spot = patches.build(pod_json(), Placement.SPOT, cfg, cost=BASE - 6)
    assert {"op": "add", "path": "/metadata/annotations", "value": {DELETION_COST: str(BASE - 6)}} in spot
    on_demand = patches.build(pod_json(), Placement.ON_DEMAND, cfg, cost=BASE - 5)
    assert {"op": "add", "path": "/metadata/annotations", "value": {DELETION_COST: str(BASE - 5)}} in on_demand
    users = patches.build(pod_json(annotations={DELETION_COST: "7"}), Placement.SPOT, cfg, cost=BASE - 6)
    assert not [op for op in users if "annotations" in op["path"]]
    surge = patches.build(pod_json(), Placement.ON_DEMAND, cfg, surge=True, cost=BASE - 5)
    assert DELETION_COST not in str(surge)


def test_numbers_for_several_waiting_pods_in_one_pass() -> None:
    r = Ranks(Percent(25), BASE)
    assert r.numbers(Placement.SPOT, set(range(1, 9)), 4) == [10, 11, 12, 14]
    assert r.numbers(Placement.ON_DEMAND, {1}, 3) == [5, 9, 13]
    assert Ranks(Count(2), BASE).numbers(Placement.ON_DEMAND, {1, 2, 3}, 2) == [4, 5]
    assert Ranks(Count(2), BASE).numbers(Placement.SPOT, {1, 2, 3}, 2) == [3, 3]
