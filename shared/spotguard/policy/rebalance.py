"""The rebalance plan: move on-demand replicas above the floor back to spot.

Given the cluster (nodes, every pod) and the managed workloads with their
floors, :func:`plan` says

- which pods to move from on-demand to spot this step (``moves``): pods of
  workloads whose on-demand count is above their floor (leftover surges, pods
  that spilled while spot was full) and that have no surge in progress
  (annotation ``spotguard.io/surge``). A move is planned only where a spot node
  that is Ready, schedulable and not under interruption notice has room for
  the pod by :mod:`spotguard.policy.fit`, with the spot tolerations the
  admission patch adds and without the on-demand requirement it removes. Pods
  on the emptiest on-demand nodes go first (so an autoscaler can remove those
  nodes); every planned move takes its room on its spot node; a step moves at
  most ``rebalance_max_pods_per_workload`` pods of at most
  ``rebalance_max_workloads_per_step`` workloads, and never more pods of a
  workload than it has above its floor;
- which workloads fell below their floor (``deficits``) and by how much;
- why the other workloads above their floor are not moved (``skipped``).

Pure: no I/O; the adapter carries the plan out (create before evict, through
the Eviction API).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.policy import fit, patches, placement
from spotguard.policy.capacity import Capacity, classify
from spotguard.policy.config import Config
from spotguard.policy.placement import Placement
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import INTERRUPTION_TAINT, SURGE, Kind, Workload


class SkipReason(enum.StrEnum):
    DISABLED = "disabled"
    SURGE_IN_PROGRESS = "surge-in-progress"
    PENDING_PODS = "pending-pods"
    NOT_READY_PODS = "not-ready-pods"
    NO_MOVABLE_PODS = "no-movable-pods"
    NO_SPOT_ROOM = "no-spot-room"
    STEP_LIMIT = "step-limit"


@dataclass(frozen=True)
class Move:
    """Replace ``pod`` (on on-demand node ``from_node``) by a spot replica."""

    workload: Workload
    pod: PodView
    from_node: str
    to_node: str  # the spot node whose room this move was planned against
    reason: str


@dataclass(frozen=True)
class Surplus:
    """A workload with more on-demand replicas than its floor."""

    workload: Workload
    floor: int
    on_demand: int

    @property
    def excess(self) -> int:
        return self.on_demand - self.floor


@dataclass(frozen=True)
class Deficit:
    """A workload with fewer on-demand replicas than its floor."""

    workload: Workload
    floor: int
    on_demand: int

    @property
    def missing(self) -> int:
        return self.floor - self.on_demand


@dataclass(frozen=True)
class Skip:
    workload: Workload
    reason: SkipReason
    detail: str


@dataclass(frozen=True)
class Plan:
    moves: tuple[Move, ...] = ()
    surplus: tuple[Surplus, ...] = ()
    deficits: tuple[Deficit, ...] = ()
    skipped: tuple[Skip, ...] = ()

    def moves_by_workload(self) -> dict[str, list[Move]]:
        out: dict[str, list[Move]] = {}
        for m in self.moves:
            out.setdefault(m.workload.key, []).append(m)
        return out

    @property
    def empty(self) -> bool:
        return not self.moves and not self.deficits


def spot_target_problem(node: NodeView, config: Config) -> str | None:
    """Why a node cannot take a pod moved to spot, or None."""
    if classify(node.labels, config.label_schemes) is not Capacity.SPOT:
        return "not a spot node"
    if any(t.key == INTERRUPTION_TAINT for t in node.taints):
        return "under interruption notice"
    if node.unschedulable:
        return "unschedulable"
    if not node.ready:
        return "not Ready"
    return None


def _normal(expr: Mapping[str, Any]) -> tuple[str, str, tuple[str, ...]]:
    values = tuple(sorted(str(v) for v in expr.get("values") or []))
    return (str(expr.get("key", "")), str(expr.get("operator", "")), values)


def _ours(config: Config) -> fit.ExpressionFilter:
    """True for the on-demand requirement the admission patch adds."""
    mine = {_normal(e) for e in patches.on_demand_expressions(config)}

    def test(expr: Mapping[str, Any]) -> bool:
        return _normal(expr) in mine

    return test


def pinned_by_user(pod: PodView, config: Config) -> bool:
    """The pod's own spec (not spotguard's patch) chooses a capacity type."""
    keys = {s.key for s in config.label_schemes}
    if keys & set(pod.node_selector):
        return True
    ours = _ours(config)
    for term in pod.required_terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") in keys and not ours(expr):
                return True
    return False


def _movable(pod: PodView, state: WorkloadState, config: Config) -> bool:
    if pinned_by_user(pod, config):
        return False
    if state.workload.kind is Kind.STATEFULSET:
        # A replacement keeps the ordinal; ordinals below the floor return to on-demand.
        ordinal = pod.ordinal
        return ordinal is not None and ordinal >= state.floor.on_demand
    return True


@dataclass
class _Candidate:
    state: WorkloadState
    excess: int
    pods: list[PodView]


def _summarise(fits: Sequence[fit.Fit]) -> str:
    if not fits:
        return "no usable spot node (none Ready, schedulable and without notice)"
    counts: dict[str, int] = {}
    for f in fits:
        for failure in f.failures:
            counts[failure.message] = counts.get(failure.message, 0) + 1
    parts = [f"{n} x {msg}" for msg, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return f"no spot node has room ({len(fits)} tried: " + ", ".join(parts[:4]) + ")"


def plan(
    config: Config,
    nodes: Iterable[NodeView],
    pods: Iterable[PodView],
    workloads: Iterable[WorkloadState],
) -> Plan:
    """The rebalance plan for one step. ``pods`` are all pods in the cluster (for node usage)."""
    node_list = sorted(nodes, key=lambda n: n.name)
    capacity_of = {n.name: config.node_capacity(n.labels) for n in node_list}
    usage = fit.usage_by_node(pods)
    targets = [n for n in node_list if spot_target_problem(n, config) is None]
    ours = _ours(config)

    surplus: list[Surplus] = []
    deficits: list[Deficit] = []
    skipped: list[Skip] = []
    candidates: list[_Candidate] = []
    for state in sorted(workloads, key=lambda s: s.key):
        wl, floor = state.workload, state.floor
        if not floor.enabled:
            skipped.append(Skip(wl, SkipReason.DISABLED, "spotguard is disabled for it"))
            continue
        active = [p for p in state.pods if p.active]
        on_demand = [
            p for p in active if placement.placement_of(p, capacity_of) is Placement.ON_DEMAND
        ]
        count = len(on_demand)
        if count < floor.on_demand:
            deficits.append(Deficit(wl, floor.on_demand, count))
        if count <= floor.on_demand:
            continue
        surplus.append(Surplus(wl, floor.on_demand, count))
        if SURGE in wl.annotations:
            skipped.append(Skip(wl, SkipReason.SURGE_IN_PROGRESS, f"{SURGE} is set"))
            continue
        pending = [p for p in active if not p.node_name]
        if pending:
            skipped.append(Skip(wl, SkipReason.PENDING_PODS, f"{len(pending)} pod(s) pending"))
            continue
        not_ready = [p for p in active if not p.ready]
        if not_ready:
            skipped.append(
                Skip(wl, SkipReason.NOT_READY_PODS, f"{len(not_ready)} pod(s) not Ready")
            )
            continue
        movable = [
            p
            for p in on_demand
            if capacity_of.get(p.node_name) is Capacity.ON_DEMAND and _movable(p, state, config)
        ]
        if not movable:
            skipped.append(
                Skip(wl, SkipReason.NO_MOVABLE_PODS, "its on-demand pods are pinned or floor pods")
            )
            continue
        candidates.append(_Candidate(state, count - floor.on_demand, movable))

    def emptiness(p: PodView) -> tuple[int, int, str]:
        u = usage.get(p.node_name, fit.EMPTY)
        return (u.pods, u.requests.get("cpu", 0), p.node_name)

    victims = sorted(
        ((p, c) for c in candidates for p in c.pods),
        key=lambda pc: (*emptiness(pc[0]), pc[1].state.key, pc[0].name, pc[0].uid),
    )
    moves: list[Move] = []
    moved: dict[str, int] = {}
    failed: dict[str, str] = {}
    for pod, cand in victims:
        key = cand.state.key
        if key in failed:
            continue
        limit = min(cand.excess, config.rebalance_max_pods_per_workload)
        if moved.get(key, 0) >= limit:
            continue
        if key not in moved and len(moved) >= config.rebalance_max_workloads_per_step:
            continue
        fits = [
            fit.check(
                pod,
                n,
                usage.get(n.name, fit.EMPTY),
                extra_tolerations=config.spot_tolerations,
                ignore_expression=ours,
            )
            for n in targets
        ]
        room = [(usage.get(f.node, fit.EMPTY).pods, f.node) for f in fits if f.ok]
        if not room:
            # Pods of one workload share a template: one failure speaks for all.
            failed[key] = _summarise(fits)
            continue
        target = min(room)[1]
        usage[target] = usage.get(target, fit.EMPTY).plus(pod.requests)
        moved[key] = moved.get(key, 0) + 1
        moves.append(
            Move(
                workload=cand.state.workload,
                pod=pod,
                from_node=pod.node_name,
                to_node=target,
                reason=(
                    f"{cand.excess + cand.state.floor.on_demand} on-demand replicas, "
                    f"floor {cand.state.floor.on_demand}; spot node {target} has room"
                ),
            )
        )
    for cand in candidates:
        key = cand.state.key
        if key in moved:
            continue
        wl = cand.state.workload
        if key in failed:
            skipped.append(Skip(wl, SkipReason.NO_SPOT_ROOM, failed[key]))
        else:
            skipped.append(Skip(wl, SkipReason.STEP_LIMIT, "step limit reached; next step"))
    return Plan(tuple(moves), tuple(surplus), tuple(deficits), tuple(skipped))
