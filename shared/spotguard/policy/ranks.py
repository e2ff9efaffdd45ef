"""Ranked deletion costs: which replicas a Deployment's scale-down keeps.

A ReplicaSet that scales down deletes its pods in upstream's order
(``ActivePodsWithRanks`` in ``pkg/controller/controller_utils.go``, used by the
ReplicaSet controller's ``getPodsToDelete``): unscheduled before scheduled,
Pending before Running, not Ready before Ready, then the lower
``controller.kubernetes.io/pod-deletion-cost`` first, then its own tie-breakers.
Among Ready pods the cost decides.

The replicas of a workload are numbered 1, 2, ... in the order its floor
function grows: replica number ``n`` is an on-demand number when
``floor(n) > floor(n - 1)``, a spot number otherwise. Each pod carries the cost
``base - n``, so a scale-down to ``m`` keeps the numbers ``1..m`` and exactly
``floor(m)`` of them are on-demand (a 25 % floor: on-demand numbers 1, 5, 9,
...; 40 -> 8 keeps 1..8, two on-demand). A new pod takes the lowest number of
its class that no live pod (or unseen reservation) holds, so a replacement
reuses the number of the pod it replaces.

Where the on-demand numbers are ``1..k`` (a count floor, the default floor of 1)
the spot pods' order among themselves does not matter: they all take the first
spot number and upstream's tie-breakers (co-located pods first) choose among
them. Only a percentage floor interleaves the classes (:attr:`Ranks.ordered`):
there every spot pod needs a number of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from spotguard.policy.floors import Count, FloorSpec, Percent
from spotguard.policy.placement import Placement
from spotguard.policy.workloads import DELETION_COST


@dataclass(frozen=True)
class Ranks:
    """The numbering of one workload's replicas.

    ``spec``: its base floor as a function of the replica count (a surge's extra
    replicas are not numbered: they carry no cost and go first at the scale back).
    ``base``: ``on_demand_deletion_cost``; replica ``n`` costs ``base - n`` (at least 1,
    so every numbered pod stays above a surge replica's 0 and a move's negative cost).
    """

    spec: FloorSpec
    base: int

    def floor_at(self, n: int) -> int:
        return self.spec.resolve(n) if n > 0 else 0

    def is_on_demand(self, n: int) -> bool:
        """Whether replica number ``n`` (1, 2, ...) is an on-demand number."""
        return n >= 1 and self.floor_at(n) > self.floor_at(n - 1)

    @property
    def ordered(self) -> bool:
        """Spot numbers lie between on-demand numbers: each spot pod needs its own number."""
        return isinstance(self.spec, Percent) and 0 < self.spec.value < 100

    def first_spot(self) -> int:
        if isinstance(self.spec, Count):
            return self.spec.value + 1
        return 1 if self.spec.value == 0 else 2  # a percentage: number 1 is on-demand unless 0 %

    def number(self, placement: Placement, taken: Collection[int]) -> int:
        """The number a new pod of ``placement`` takes, given the numbers live pods hold."""
        return self.numbers(placement, taken, 1)[0]

    def numbers(self, placement: Placement, taken: Collection[int], count: int) -> list[int]:
        """The ``count`` lowest free numbers of ``placement``, lowest first (one pass)."""
        if placement is Placement.SPOT and not self.ordered:
            return [self.first_spot()] * count
        want = placement is Placement.ON_DEMAND
        found: list[int] = []
        if want and isinstance(self.spec, Count):
            candidates: Iterable[int] = range(1, self.spec.value + 1)  # 1..k: the only ones
        else:
            candidates = itertools.count(1)  # a percentage has numbers of both classes without end
        for n in candidates:
            if len(found) == count:
                return found
            if n not in taken and self.is_on_demand(n) == want:
                found.append(n)
        # Every on-demand number of a count floor is held: rank the rest with the first free numbers.
        free = (n for n in itertools.count(1) if n not in taken and n not in found)
        return found + [next(free) for _ in range(count - len(found))]

    def cost(self, n: int) -> int:
        return max(1, self.base - n)


def ranks_for(spec: FloorSpec | None, base: int) -> Ranks | None:
    """The numbering for a workload with base floor ``spec``; None: no ranked costs
    (the workload is not a Deployment or opted out, or costs are configured off)."""
    if spec is None or base <= 1:
        return None
    return Ranks(spec, base)


def number_of(annotations: Mapping[str, str], base: int) -> int | None:
    """The replica number a pod's deletion cost stands for (``base - cost``); None: no
    ranked cost (none, the user's, a move's or a surge's, or ``base`` itself)."""
    raw = annotations.get(DELETION_COST)
    try:
        cost = int(raw) if raw is not None else None
    except ValueError:
        return None
    if cost is None or not 1 <= cost < base:
        return None
    return base - cost
