"""Placement: does a new pod fill an on-demand slot or a spot slot, or is it left alone."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.policy.capacity import Capacity, LabelScheme
from spotguard.policy.config import Config
from spotguard.policy.floors import Floor
from spotguard.policy.views import PodView
from spotguard.policy.workloads import SURGE_REPLICA, Kind, Workload, surge_copy_name, surge_deployment

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MANAGED_OWNERS = ("ReplicaSet", "StatefulSet")


class Placement(enum.StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"

    @classmethod
    def of(cls, capacity: Capacity) -> Placement | None:
        if capacity is Capacity.SPOT:
            return cls.SPOT
        if capacity is Capacity.ON_DEMAND:
            return cls.ON_DEMAND
        return None


@dataclass(frozen=True)
class Decision:
    placement: Placement | None  # None: leave the pod alone
    reason: str
    # An on-demand slot of a surge in progress (the floor raised by the surge): an extra
    # replica, which gets no deletion cost (a rebalance-only surge's scale back must remove
    # it, not the spot pods of the living node)
    surge: bool = False

    @property
    def leave_alone(self) -> bool:
        return self.placement is None


def _keys_in_terms(terms: Iterable[Mapping[str, Any]]) -> set[str]:
    keys: set[str] = set()
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            keys.add(str(expr.get("key", "")))
    return keys


def pins_capacity(pod: PodView, schemes: Iterable[LabelScheme]) -> bool:
    """True where the pod's own spec already chooses a capacity type."""
    keys = {s.key for s in schemes}
    if keys & set(pod.node_selector):
        return True
    return bool(keys & _keys_in_terms(pod.required_terms))


def skip_reason(pod: PodView, config: Config) -> str | None:
    """Why a pod is none of spotguard's business, judged from the pod alone."""
    if MIRROR_ANNOTATION in pod.annotations:
        return "mirror pod"
    if pod.namespace in config.excluded_namespaces:
        return f"namespace {pod.namespace} is excluded"
    if pod.owner is None:
        return "bare pod (no controller)"
    if pod.owner.kind not in MANAGED_OWNERS:
        return f"owned by a {pod.owner.kind}"
    if pins_capacity(pod, config.label_schemes):
        return "the pod's spec already pins a capacity type"
    of = surge_deployment(pod.labels, pod.annotations)
    if of and pod.owner.kind == "ReplicaSet" and pod.owner.name == surge_copy_name(of):
        # Its template says where it goes: a spot slot's for an autoscaler's drain
        # (spotguard.policy.surgecopy.build; else pinned to on-demand, skipped above).
        return "a pod of spotguard's surge copy (placed by its template)"
    return None


def pinned_slot(pod: PodView, node_capacity: Mapping[str, Capacity]) -> Decision | None:
    """The slot of a pod whose spec names its node (``spec.nodeName``): what that node is.

    Such a pod skips the scheduler, and its kubelet rejects it when its required node
    affinity does not match the node (the NodeAffinity predicate at admission; its
    controller then re-creates it in a loop): it is placed, and counted, as its node's
    capacity. None when the pod names no node; a decision to leave it alone when the
    node is not known (nothing to tell what it is).
    """
    if not pod.node_name:
        return None
    cap = node_capacity.get(pod.node_name)
    if cap is None:
        return Decision(None, f"pinned to node {pod.node_name}, which is not in the node list")
    where = Placement.of(cap)
    if where is None:
        return Decision(None, f"pinned to node {pod.node_name} of {cap} capacity")
    return Decision(where, f"pinned to node {pod.node_name} ({where})")


def placement_of(pod: PodView, node_capacity: Mapping[str, Capacity]) -> Placement | None:
    """Where a live pod counts: its node's capacity once scheduled, else its label."""
    if pod.node_name and pod.node_name in node_capacity:
        return Placement.of(node_capacity[pod.node_name])
    label = pod.placement_label
    if label in (Placement.ON_DEMAND.value, Placement.SPOT.value):
        return Placement(label)
    return None


def on_demand_pods(
    pods: Iterable[PodView], node_capacity: Mapping[str, Capacity], exclude: PodView | None = None
) -> list[PodView]:
    """The active pods among ``pods`` that count as on-demand (``exclude`` left out)."""
    return [
        p
        for p in pods
        if p.active
        and not (exclude is not None and p.uid and p.uid == exclude.uid)
        and placement_of(p, node_capacity) is Placement.ON_DEMAND
    ]


def is_surge_replica(pod: PodView) -> bool:
    """The pod was placed in an on-demand slot of a surge (``spotguard.io/surge-replica``)."""
    return pod.annotations.get(SURGE_REPLICA) == "true"


def surge_replicas(created: Iterable[float], since: float) -> int:
    """How many of the surge replicas created at ``created`` (epoch seconds, the API
    server's whole seconds) belong to the surge that began at ``since``."""
    start = int(since)
    return sum(1 for c in created if c > 0 and c >= start)


def decide(
    *,
    pod: PodView,
    workload: Workload,
    floor: Floor,
    siblings: Sequence[PodView] = (),
    node_capacity: Mapping[str, Capacity] | None = None,
    reserved_on_demand: int = 0,
    surge_created: Sequence[float] = (),
    reserved_surge: int = 0,
    ordinal_start: int = 0,
) -> Decision:
    """Decide the slot for ``pod``.

    ``siblings`` are the live pods that count against the same floor (for a
    Deployment, the pods of the pod's ReplicaSet; for a StatefulSet, its pods);
    ``reserved_on_demand`` is the number of on-demand slots handed out to pods not
    yet visible in ``siblings`` (Deployments only). ``ordinal_start`` is a
    StatefulSet's ``spec.ordinals.start``.

    During a surge (``floor.surge``) its replicas are on-demand every time: they are
    counted apart from the floor. ``surge_created`` are the creation times of the
    on-demand surge replicas counted in ``reserved_on_demand`` and ``reserved_surge``
    how many of its unseen reservations are surge slots; surge replicas among
    ``siblings`` are found by their annotation. Only those created since the surge
    began are its replicas: other on-demand pods (spilled, left by an earlier surge)
    fill the floor, and the surge still gets its own on-demand pods.
    """
    if not floor.enabled:
        return Decision(None, f"{workload.kind} {workload.namespace}/{workload.name} opted out")
    existing = pod.placement_label
    if existing in (Placement.ON_DEMAND.value, Placement.SPOT.value):
        return Decision(Placement(existing), "already placed (reinvocation)", surge=is_surge_replica(pod))
    if workload.kind is Kind.STATEFULSET:
        return statefulset_slot(
            pod,
            workload=workload,
            floor=floor,
            siblings=siblings,
            node_capacity=node_capacity or {},
            start=ordinal_start,
        )
    on_demand = on_demand_pods(siblings, node_capacity or {}, exclude=pod)
    held = len(on_demand) + reserved_on_demand
    if floor.surge:
        created = [*surge_created, *(p.created for p in on_demand if is_surge_replica(p))]
        surge_held = min(held, surge_replicas(created, floor.surge_since) + reserved_surge)
        base = floor.on_demand - floor.surge
        if held - surge_held < base:
            return Decision(Placement.ON_DEMAND, f"{held - surge_held} of {base} on-demand floor slots filled")
        if surge_held < floor.surge:
            return Decision(
                Placement.ON_DEMAND, f"{surge_held} of {floor.surge} surge replicas on on-demand", surge=True
            )
        return Decision(Placement.SPOT, f"on-demand floor {base} and surge {floor.surge} met ({held})")
    if held < floor.on_demand:
        return Decision(Placement.ON_DEMAND, f"{held} of {floor.on_demand} on-demand slots filled")
    return Decision(Placement.SPOT, f"on-demand floor {floor.on_demand} met ({held})")


def statefulset_slot(
    pod: PodView,
    *,
    workload: Workload,
    floor: Floor,
    siblings: Sequence[PodView],
    node_capacity: Mapping[str, Capacity],
    start: int = 0,
) -> Decision:
    """A StatefulSet pod's slot, decided by the pods actually placed.

    Of the ordinals ``start .. start+replicas-1``, those held by a live pod keep
    what that pod is (on-demand by its node or its label). The floor's missing
    on-demand slots go to the lowest ordinals that have no live pod yet. The
    answer depends on the siblings seen only through what they are, so pods
    decided at once (``podManagementPolicy: Parallel``), each seeing a different
    subset of the others, still fill exactly the floor; a set that grows (pod 2
    placed on spot at size 3, then scaled to 7) gets the extra on-demand pods it
    now needs, and one created with ``spec.ordinals.start`` counts from there.
    """
    ordinal = pod.ordinal
    if ordinal is None:
        return Decision(None, "StatefulSet pod without an ordinal")
    end = start + max(workload.replicas, 0)
    if not start <= ordinal < end:
        return Decision(Placement.SPOT, f"ordinal {ordinal} outside {start}..{end - 1}")
    taken: dict[int, bool] = {}
    for p in siblings:
        o = p.ordinal
        if o is None or o == ordinal or not p.active or not start <= o < end:
            continue
        taken[o] = taken.get(o, False) or placement_of(p, node_capacity) is Placement.ON_DEMAND
    held = sum(1 for on_demand in taken.values() if on_demand)
    need = floor.on_demand - held
    rank = sum(1 for o in range(start, ordinal) if o not in taken)
    if rank < need:
        return Decision(
            Placement.ON_DEMAND, f"ordinal {ordinal}: {held} of {floor.on_demand} on-demand, {need} to place"
        )
    return Decision(Placement.SPOT, f"ordinal {ordinal}: on-demand floor {floor.on_demand} covered ({held} placed)")
