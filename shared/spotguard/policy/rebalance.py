"""The rebalance plan: move on-demand replicas above the floor back to spot.

Given the cluster (nodes, every pod) and the managed workloads with their
floors, :func:`plan` says

- which pods to move from on-demand to spot this step (``moves``): pods of
  workloads whose on-demand count is above their floor (leftover surges, pods
  that spilled while spot was full) and that have no surge in progress
  (annotation ``spotguard.io/surge``). A move is planned where a spot node
  that is Ready, schedulable and not under interruption notice has room for
  the pod by :mod:`spotguard.policy.fit`, with the spot tolerations the
  admission patch adds and without the on-demand requirement it removes, or,
  where none has, where a Karpenter NodePool can launch a spot node for it
  (:func:`spotguard.policy.nodepools.spot_for`: the new pod then waits Pending for the
  launch). Pods on the emptiest on-demand nodes go first (so the autoscaler can
  remove those nodes); every planned move takes its room on its spot node.
  Moves are batched like a rolling update: a step moves at most
  ``rebalance_max_pods_per_workload`` pods of a workload at once (one move,
  see :mod:`spotguard.policy.moves`), never more than it has above its floor
  nor more than its PodDisruptionBudget allows disrupted now (at least one: a
  scale move disrupts nothing), of at most ``rebalance_max_workloads_per_step``
  workloads, and no more pods than ``rebalance_max_in_flight`` less those
  already being moved;
- which workloads fell below their floor (``deficits``) and by how much, and
  for those that can be repaired now, the repair (``repairs``): one replica
  back on on-demand, where an on-demand node (Ready, schedulable, without
  notice) has room for it;
- why the other workloads off their optimum are not moved (``skipped``).

Every move and repair says its method (:mod:`spotguard.policy.moves`): a
Deployment's goes by create before evict (scale up by the batch, then back with
its pods ranked first), a StatefulSet's by eviction, one pod at a time, only while
every replica is Ready and the quorum (the floor) holds without it, and not
where a budget allows no disruption now. A workload with a move recorded
(``spotguard.io/rebalance``), an interruption surge in progress (its record, or a
surge copy serving it), a rollout in
progress (pods of two ReplicaSets), or fewer or more pods than replicas is left alone.

Pure: no I/O; the adapter carries the plan out.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.policy import fit, moves, nodepools, patches, placement
from spotguard.policy.capacity import Capacity, classify
from spotguard.policy.config import Config
from spotguard.policy.moves import MOVE, Direction, Method
from spotguard.policy.placement import Placement
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import INTERRUPTION_TAINT, Kind, Workload


class SkipReason(enum.StrEnum):
    DISABLED = "disabled"
    SURGE_IN_PROGRESS = "surge-in-progress"
    PENDING_PODS = "pending-pods"
    NOT_READY_PODS = "not-ready-pods"
    NO_MOVABLE_PODS = "no-movable-pods"
    NO_SPOT_ROOM = "no-spot-room"
    STEP_LIMIT = "step-limit"
    MOVE_IN_PROGRESS = "move-in-progress"
    ROLLOUT = "rollout-in-progress"
    PODS_MISSING = "pods-missing"
    PODS_LEAVING = "pods-leaving"
    NO_ON_DEMAND_ROOM = "no-on-demand-room"
    BUDGET = "budget-allows-no-disruption"
    QUORUM = "quorum"
    SETTLING = "settling"
    AUTOSCALER_AT_MAX = "autoscaler-at-max"


@dataclass(frozen=True)
class Move:
    """Replace ``pod`` (on on-demand node ``from_node``) by a spot replica."""

    workload: Workload
    pod: PodView
    from_node: str
    to_node: str  # the spot node whose room this move was planned against
    reason: str
    method: Method = Method.SCALE
    direction: Direction = Direction.TO_SPOT
    launch: str = ""  # no spot node has room: the NodePool that can launch one for it (to_node "")


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
    # One replica back on on-demand per workload below its floor (direction to-on-demand;
    # ``pod`` is the spot replica that goes, ``to_node`` the on-demand node with room).
    repairs: tuple[Move, ...] = ()

    def moves_by_workload(self) -> dict[str, list[Move]]:
        out: dict[str, list[Move]] = {}
        for m in self.moves:
            out.setdefault(m.workload.key, []).append(m)
        return out

    @property
    def empty(self) -> bool:
        return not self.moves and not self.deficits

    def first_step(self) -> list[Move]:
        """What to start now: the repairs, then the moves (a workload's together, one batch)."""
        return [m for batch in self.batches() for m in batch]

    def batches(self) -> list[list[Move]]:
        """One batch per workload, each started as one move: a repair alone, then the moves of
        each workload without a repair (never two moves of one workload at once)."""
        out: list[list[Move]] = [[m] for m in self.repairs]
        seen = {m.workload.key for m in self.repairs}
        by_key: dict[str, list[Move]] = {}
        for m in self.moves:
            if m.workload.key in seen:
                continue
            if m.workload.key not in by_key:
                by_key[m.workload.key] = []
                out.append(by_key[m.workload.key])
            by_key[m.workload.key].append(m)
        return out


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


def on_demand_target_problem(node: NodeView, config: Config) -> str | None:
    """Why a node cannot take a replica restored to on-demand, or None."""
    if config.node_capacity(node.labels) is not Capacity.ON_DEMAND:
        return "not an on-demand node"
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
    """True for the on-demand requirement the admission patch adds, and for the spot one it
    adds to a move's new replica."""
    mine = {_normal(e) for e in patches.on_demand_expressions(config)}
    mine |= {_normal(e) for term in patches.spot_terms(config) for e in term}

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


PodSource = Iterable[PodView] | Callable[[], Iterable[PodView]]


def _blocked(
    state: WorkloadState,
    active: Sequence[PodView],
    budgets: Mapping[str, int] | None,
    settle: tuple[float, float] | None = None,
    autoscaler_max: Mapping[str, int] | None = None,
) -> Skip | None:
    """Why the workload may not be touched now, whatever the direction (or None)."""
    wl = state.workload
    if MOVE in wl.annotations:
        record = moves.MoveRecord.of(wl)
        what = "a hold" if record is not None and record.held else "a move"
        return Skip(wl, SkipReason.MOVE_IN_PROGRESS, f"{what} is recorded ({MOVE})")
    if moves.surge_in_progress(wl):
        return Skip(wl, SkipReason.SURGE_IN_PROGRESS, "an interruption surge is in progress")
    if state.surge_copy:
        # Its copy's pods are the surge's, not strays or spill; its own may be short on
        # on-demand for now (the copy holds it): the spot-interruption reconcile owns it.
        return Skip(wl, SkipReason.SURGE_IN_PROGRESS, "a surge copy serves it (spotguard.io/surge-of)")
    if wl.kind is Kind.DEPLOYMENT and len({p.owner.name for p in active if p.owner}) > 1:
        return Skip(wl, SkipReason.ROLLOUT, "pods of more than one ReplicaSet")
    pending = [p for p in active if not p.node_name]
    if pending:
        return Skip(wl, SkipReason.PENDING_PODS, f"{len(pending)} pod(s) pending")
    not_ready = [p for p in active if not p.ready]
    if not_ready:
        return Skip(wl, SkipReason.NOT_READY_PODS, f"{len(not_ready)} pod(s) not Ready")
    if len(active) < wl.replicas:
        return Skip(wl, SkipReason.PODS_MISSING, f"{len(active)} of {wl.replicas} pods exist")
    if len(active) > wl.replicas:
        # A scale-down its controller has not carried out yet (a move just finished: the pod
        # ranked first to go is still there): that pod, counted as on-demand surplus, would be
        # moved a second time (two reconcilers at once left a move's "+1" behind that way).
        leaving = f"{len(active)} pods for {wl.replicas} replicas: a scale-down is under way"
        return Skip(wl, SkipReason.PODS_LEAVING, leaving)
    if settle is not None:
        now, seconds = settle
        newest = max((p.created for p in active), default=0.0)
        if now - newest < seconds:
            return Skip(wl, SkipReason.SETTLING, f"its newest pod is {max(0, int(now - newest))}s old")
    if method_for(wl) is Method.SCALE and autoscaler_max is not None and wl.key in autoscaler_max:
        top = autoscaler_max[wl.key]
        if wl.replicas + 1 > top:
            # A move adds one replica for a while; past the user's maxReplicas it would break their
            # cap, and an eviction would lower the serving count: neither, the workload stays.
            return Skip(wl, SkipReason.AUTOSCALER_AT_MAX, f"its autoscaler's maxReplicas is {top}: no room for +1")
    if wl.kind is Kind.STATEFULSET:
        if len(active) - 1 < state.floor.on_demand or len(active) < 2:
            return Skip(wl, SkipReason.QUORUM, "its quorum would not hold without one replica")
        if budgets is not None and budgets.get(wl.key, 1) <= 0:
            return Skip(wl, SkipReason.BUDGET, "a PodDisruptionBudget allows no disruption now")
    return None


def _batch_limit(
    cand: _Candidate, config: Config, budgets: Mapping[str, int] | None, autoscaler_max: Mapping[str, int] | None
) -> int:
    """How many pods of the workload one move takes: never more than above its floor, nor
    than ``rebalance_max_pods_per_workload``; a StatefulSet's one (an eviction at a time); a
    Deployment with a PodDisruptionBudget no more than it allows disrupted now (at least one:
    create before evict keeps every replica serving until its replacement is Ready)."""
    limit = min(cand.excess, config.rebalance_max_pods_per_workload)
    if cand.state.workload.kind is Kind.STATEFULSET:
        return min(limit, 1)
    if budgets is not None and cand.state.key in budgets:
        limit = min(limit, max(1, budgets[cand.state.key]))
    if autoscaler_max is not None and cand.state.key in autoscaler_max:
        # The move's count stays within the autoscaler's maxReplicas (the user's cap).
        limit = min(limit, autoscaler_max[cand.state.key] - cand.state.workload.replicas)
    return limit


def method_for(workload: Workload) -> Method:
    return Method.EVICT if workload.kind is Kind.STATEFULSET else Method.SCALE


def plan(
    config: Config,
    nodes: Iterable[NodeView],
    pods: PodSource,
    workloads: Iterable[WorkloadState],
    *,
    budgets: Mapping[str, int] | None = None,
    now: float | None = None,
    autoscaler_max: Mapping[str, int] | None = None,
    pools: Sequence[nodepools.NodePool] = (),
    in_flight: int = 0,
) -> Plan:
    """The rebalance plan for one step.

    ``pods`` are all pods in the cluster (for node usage), or a function that
    returns them: it is called only when some workload is off its optimum. The
    workloads' own pods may be light views (``PodView.from_json(scheduling=False)``):
    where ``pods`` holds the full view of one (same uid), fit reads that.
    ``budgets`` maps a workload key to the disruptions its PodDisruptionBudgets
    allow now (the lowest; absent: no budget). With ``now``, a workload whose
    newest pod was created less than ``rebalance_settle_seconds`` ago is left
    alone (``settling``): the admission webhook may not have counted it yet.
    ``autoscaler_max`` maps a Deployment's key to its autoscaler's maxReplicas: a
    scale move needs one replica above the count, so a Deployment at its maximum is
    left where it is (``autoscaler-at-max``), never moved past the user's cap.
    ``pools``: the Karpenter NodePools (a move to spot where no spot node has room is
    planned where one can launch spot for the pod); ``in_flight``: the pods being moved
    now (the moves recorded), counted against ``rebalance_max_in_flight``.
    """
    node_list = sorted(nodes, key=lambda n: n.name)
    capacity_of = {n.name: config.node_capacity(n.labels) for n in node_list}
    ours = _ours(config)

    surplus: list[Surplus] = []
    deficits: list[Deficit] = []
    skipped: list[Skip] = []
    candidates: list[_Candidate] = []
    short: list[tuple[WorkloadState, int, list[PodView]]] = []
    for state in sorted(workloads, key=lambda s: s.key):
        wl, floor = state.workload, state.floor
        if not floor.enabled:
            skipped.append(Skip(wl, SkipReason.DISABLED, "spotguard is disabled for it"))
            continue
        active = [p for p in state.pods if p.active]
        on_demand = placement.on_demand_pods(active, capacity_of)
        count = len(on_demand)
        if count == floor.on_demand:
            continue
        if count < floor.on_demand:
            deficits.append(Deficit(wl, floor.on_demand, count))
        else:
            surplus.append(Surplus(wl, floor.on_demand, count))
        settle = None if now is None else (now, float(config.rebalance_settle_seconds))
        blocked = _blocked(state, active, budgets, settle, autoscaler_max)
        if blocked is not None:
            skipped.append(blocked)
            continue
        if count < floor.on_demand:
            spot = [
                p
                for p in active
                if placement.placement_of(p, capacity_of) is Placement.SPOT and not pinned_by_user(p, config)
            ]
            if wl.kind is Kind.STATEFULSET:
                # The low ordinals are the ones an ordinal-placing admission puts on on-demand.
                spot.sort(key=lambda p: (p.ordinal is None, p.ordinal or 0, p.name))
            else:
                spot.sort(key=lambda p: (p.node_name, p.name))
            if not spot:
                skipped.append(Skip(wl, SkipReason.NO_MOVABLE_PODS, "no spot replica that is not pinned"))
                continue
            short.append((state, floor.on_demand - count, spot))
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

    if not candidates and not short:
        return Plan((), tuple(surplus), tuple(deficits), tuple(skipped))

    all_pods = list(pods() if callable(pods) else pods)
    usage = fit.usage_by_node(all_pods)
    # The workloads' pods may be light views (no requests, tolerations or affinity): fit
    # reads the full view of the same pod, by uid, where ``pods`` has one.
    full = {p.uid: p for p in all_pods if p.uid}

    def complete(p: PodView) -> PodView:
        return full.get(p.uid, p) if p.uid else p

    targets = [n for n in node_list if spot_target_problem(n, config) is None]
    od_targets = [n for n in node_list if on_demand_target_problem(n, config) is None]

    # Repairs first: a floor matters more than a saving.
    repairs: list[Move] = []
    for state, missing, spot in short:
        wl = state.workload
        if len(repairs) >= config.rebalance_max_workloads_per_step:
            skipped.append(Skip(wl, SkipReason.STEP_LIMIT, "step limit reached; next step"))
            continue
        pod = complete(spot[0])
        fits = [
            fit.check(pod, n, usage.get(n.name, fit.EMPTY), ignore_expression=ours) for n in od_targets
        ]
        room = [(-usage.get(f.node, fit.EMPTY).pods, f.node) for f in fits if f.ok]
        if not room:
            detail = _summarise(fits).replace("spot node", "on-demand node")
            skipped.append(Skip(wl, SkipReason.NO_ON_DEMAND_ROOM, detail))
            continue
        # The fullest on-demand node with room: keep the emptiest ones free to go.
        target = min(room)[1]
        usage[target] = usage.get(target, fit.EMPTY).plus(pod.requests)
        repairs.append(
            Move(
                workload=wl,
                pod=pod,
                from_node=pod.node_name,
                to_node=target,
                reason=(
                    f"{state.floor.on_demand - missing} on-demand replicas, floor "
                    f"{state.floor.on_demand}; on-demand node {target} has room"
                ),
                method=method_for(wl),
                direction=Direction.TO_ON_DEMAND,
            )
        )

    def emptiness(p: PodView) -> tuple[int, int, str]:
        u = usage.get(p.node_name, fit.EMPTY)
        return (u.pods, u.requests.get("cpu", 0), p.node_name)

    victims = sorted(
        ((p, c) for c in candidates for p in c.pods),
        key=lambda pc: (*emptiness(pc[0]), pc[1].state.key, pc[0].name, pc[0].uid),
    )
    planned: list[Move] = []
    moved: dict[str, int] = {}
    failed: dict[str, str] = {}
    budget_left = max(0, config.rebalance_max_workloads_per_step - len(repairs))
    pods_left = max(0, config.rebalance_max_in_flight - in_flight - len(repairs))
    for light, cand in victims:
        if pods_left <= 0:
            break
        pod = complete(light)
        key = cand.state.key
        if key in failed:
            continue
        if moved.get(key, 0) >= _batch_limit(cand, config, budgets, autoscaler_max):
            continue
        if key not in moved and len(moved) >= budget_left:
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
        # A StatefulSet's move evicts its pod first: it is down until it runs again, so only
        # where a spot node has room now, never for a launch (30-40 s at best; for as long as
        # EC2 refuses spot at worst). A Deployment's new replicas come first and may wait.
        evicts = method_for(cand.state.workload) is Method.EVICT
        pool = None if room or evicts else nodepools.spot_for(pod, pools, config.spot_tolerations, ours)
        if not room and pool is None:
            # Pods of one workload share a template: one failure speaks for all.
            why = "; a StatefulSet's pod is moved only to room that exists" if evicts and pools else ""
            failed[key] = _summarise(fits) + (why or ("; no NodePool can launch spot for it" if pools else ""))
            continue
        target = ""
        if room:
            target = min(room)[1]
            usage[target] = usage.get(target, fit.EMPTY).plus(pod.requests)
            where = f"spot node {target} has room"
        else:
            where = f"NodePool {pool} can launch a spot node for it"
        moved[key] = moved.get(key, 0) + 1
        pods_left -= 1
        planned.append(
            Move(
                workload=cand.state.workload,
                pod=pod,
                from_node=pod.node_name,
                to_node=target,
                reason=(
                    f"{cand.excess + cand.state.floor.on_demand} on-demand replicas, "
                    f"floor {cand.state.floor.on_demand}; {where}"
                ),
                method=method_for(cand.state.workload),
                launch=pool or "",
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
    return Plan(tuple(planned), tuple(surplus), tuple(deficits), tuple(skipped), tuple(repairs))
