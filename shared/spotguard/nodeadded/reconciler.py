"""One pass of the node-added reconcile: back to spot, floors repaired, leftovers cleaned.

``Reconciler.reconcile()`` reads the cluster once (nodes, pods, Deployments,
ReplicaSets, StatefulSets, PodDisruptionBudgets, Namespaces and the admission
Leases: a fixed number of list calls whatever the size of the cluster), then

1. carries recorded moves on (:func:`spotguard.policy.moves.progress`):
   scales back once the new replica is Ready, undoes a move that did not work
   out, and leaves a hold where a move made no progress;
2. starts what the pure plan (:func:`spotguard.policy.rebalance.plan`) asks:
   repairs of floors first, then moves back to spot, at most one per workload,
   a bounded number per pass. A Deployment's move is create before evict: the
   pod that goes gets the lowest ``controller.kubernetes.io/pod-deletion-cost``,
   then one patch (guarded by the resourceVersion) writes the move record and
   ``spec.replicas + 1``; the admission webhook places the new pod. A
   StatefulSet's move writes the record, then evicts the pod through the
   Eviction API (a budget's 429 leaves a hold, never a retry loop);
3. cleans up: the spot-interruption function's own reconcile scales back
   surges that are over and deletes left-over temporary budgets
   (:meth:`spotguard.interruption.handler.Handler.reconcile`); reservation
   Leases of ReplicaSets that no longer exist are deleted; interruption taints
   on nodes that survived are removed (:mod:`spotguard.nodeadded.cleanup`).

A cluster at its optimum costs only the list calls and writes nothing. A pass
never undoes the previous one: a move to spot stops at the floor and a repair
at the floor, and a workload with a move recorded is left to that move.
What moved and why is told in Kubernetes Events on the workloads, in the log
and in :mod:`spotguard.nodeadded.metrics`. ``dry_run=True`` reads and plans,
and writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.gateway.errors import ApiError, Conflict, NotFound, TooManyRequests
from spotguard.nodeadded import cleanup, metrics
from spotguard.policy import floors, interruption, moves, rebalance
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.moves import MOVE, Action, Direction, Method, MoveRecord, Progress
from spotguard.policy.placement import Placement
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import DELETION_COST, Kind, Workload

log = logging.getLogger("spotguard.nodeadded")

Obj = dict[str, Any]
LIST_PAGE = 5000
WORKERS = 8
WORKLOAD_RESOURCES = {Kind.DEPLOYMENT: r.DEPLOYMENTS, Kind.STATEFULSET: r.STATEFULSETS}


@dataclass
class Snapshot:
    """One read of the cluster."""

    nodes: list[Obj]
    pods: list[Obj]
    workloads: dict[str, Obj]  # key -> raw Deployment or StatefulSet (kind set)
    replicasets: list[Obj]
    budgets: list[Obj]
    namespaces: dict[str, dict[str, str]]
    leases: list[Obj]
    node_views: list[NodeView] = field(default_factory=list)
    pod_views: list[PodView] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.node_views = [NodeView.from_json(n) for n in self.nodes]
        # Light views: grouping and counting need no requests or affinity (20,000 pods).
        self.pod_views = [PodView.from_json(p, scheduling=False) for p in self.pods]

    def full_pod_views(self) -> list[PodView]:
        """Every pod with what fit reads; built only when some workload is off its optimum."""
        return [PodView.from_json(p) for p in self.pods]


@dataclass
class Report:
    """What one pass found and did."""

    plan: rebalance.Plan = field(default_factory=rebalance.Plan)
    progress: list[Progress] = field(default_factory=list)
    started: list[rebalance.Move] = field(default_factory=list)
    leases: list[cleanup.OrphanLease] = field(default_factory=list)
    taints: list[cleanup.TaintCleanup] = field(default_factory=list)
    surges_over: list[str] = field(default_factory=list)  # workloads whose surge the interruption reconcile ends
    failures: int = 0
    dry_run: bool = False
    seconds: float = 0.0

    @property
    def optimal(self) -> bool:
        return (
            not self.plan.surplus
            and not self.plan.deficits
            and not self.progress
            and not self.leases
            and not self.taints
            and not self.surges_over
        )


class Reconciler:
    """The node-added core shared by every transport (see the module docstring)."""

    def __init__(
        self,
        kube: kube_mod.Kube,
        config: Config | Callable[[], Config],
        *,
        namespace: str = "spotguard",
        clock: Callable[[], float] = time.time,
        workers: int = WORKERS,
        interruption_reconcile: Callable[[], None] | None = None,
        taint_grace: float = cleanup.TAINT_GRACE_SECONDS,
    ) -> None:
        self.kube = kube
        self._config = config
        self.namespace = namespace
        self.clock = clock
        self.workers = workers
        self.taint_grace = taint_grace
        self.last_timings: dict[str, float] = {}  # seconds of the last pass's read and plan
        # Scales back surges that are over and sweeps left-over temporary budgets.
        self.interruption_reconcile = interruption_reconcile or self._interruption_reconcile

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> Reconciler:
        """The Kubernetes connection and settings of this process (in-cluster, EKS token, kubeconfig)."""
        import os

        from spotguard.gateway import settings

        k = kube_mod.connect(kubeconfig)
        namespace = os.environ.get("SPOTGUARD_NAMESPACE") or settings.DEFAULT_NAMESPACE
        return cls(k, lambda: settings.load(k)[0], namespace=namespace)

    @property
    def config(self) -> Config:
        return self._config() if callable(self._config) else self._config

    # -- the pass ----------------------------------------------------------------------------

    def reconcile(self, *, dry_run: bool = False, trigger: str = "schedule") -> Report:
        started = time.perf_counter()
        try:
            report = self._pass(dry_run)
        except ApiError as exc:
            metrics.PASSES.labels(trigger, "failed").inc()
            metrics.ERRORS.labels("list").inc()
            log.error("could not read the cluster", extra={"error": str(exc), "trigger": trigger})
            raise
        report.seconds = time.perf_counter() - started
        metrics.PASS_SECONDS.observe(report.seconds)
        metrics.PASSES.labels(trigger, "done").inc()
        log.info(
            "reconcile pass done",
            extra={
                "trigger": trigger,
                "dry_run": dry_run,
                "started": len(report.started),
                "progressed": sum(1 for p in report.progress if p.action is not Action.WAIT),
                "surplus": len(report.plan.surplus),
                "deficits": len(report.plan.deficits),
                "skipped": len(report.plan.skipped),
                "leases": len(report.leases),
                "taints": len(report.taints),
                "failures": report.failures,
                "seconds": round(report.seconds, 3),
            },
        )
        return report

    def _pass(self, dry_run: bool) -> Report:
        config = self.config
        started = time.perf_counter()
        with kube_mod.gc_paused():
            snap = self.snapshot()
            read = time.perf_counter()
            now = self.clock()
            states, records, budgets = self._states(snap, config)
            capacity_of = {n.name: config.node_capacity(n.labels) for n in snap.node_views}
            progress = [
                moves.progress(
                    states[key],
                    record,
                    capacity_of,
                    now,
                    timeout=config.rebalance_move_timeout_seconds,
                    hold_seconds=config.rebalance_hold_seconds,
                )
                for key, record in sorted(records.items())
            ]
            plan = rebalance.plan(
                config, snap.node_views, snap.full_pod_views, states.values(), budgets=budgets, now=now
            )
        planned = time.perf_counter()
        self.last_timings = {"read": read - started, "plan": planned - read}
        report = Report(plan=plan, progress=progress, dry_run=dry_run)
        workload_views = [Workload.from_json(w) for w in snap.workloads.values()]
        report.leases = cleanup.orphan_leases(snap.leases, snap.replicasets)
        report.taints = cleanup.surviving_taints(snap.nodes, workload_views, now, self.taint_grace)
        done, _waiting = interruption.finish(
            workloads=workload_views, pods=snap.pod_views, nodes=snap.node_views, now=now
        )
        report.surges_over = [f.workload.key for f in done]
        self._gauges(plan)
        if dry_run:
            report.started = plan.first_step()
            return report
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            failures = list(pool.map(lambda p: self._progress(p, snap, states, capacity_of), progress))
            starts = list(pool.map(lambda m: self._start(m, snap, states, capacity_of, now), plan.first_step()))
            report.started = [m for m, ok in zip(plan.first_step(), starts, strict=True) if ok]
            failures += [not ok for ok in starts]
            failures += list(pool.map(self._delete_lease, report.leases))
            by_name = {str(n["metadata"]["name"]): n for n in snap.nodes}
            failures += list(pool.map(lambda t: self._taint(t, by_name, now), report.taints))
        report.failures = sum(1 for f in failures if f)
        try:
            self.interruption_reconcile()
        except Exception as exc:  # its own errors are its own; the pass is done
            metrics.ERRORS.labels("interruption").inc()
            log.warning("the interruption reconcile failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            report.failures += 1
        return report

    def _interruption_reconcile(self) -> None:
        from spotguard.interruption import handler

        handler.Handler(self.kube, self.config, clock=self.clock).reconcile()

    # -- reading -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        k = kube_mod.Kube(
            self.kube.api_client,
            policy=self.kube.policy,
            counter=self.kube.stats,
            page_limit=max(self.kube.page_limit, LIST_PAGE),
        )
        with ThreadPoolExecutor(max_workers=3) as pool:
            pods_f = pool.submit(k.list, r.PODS)
            nodes_f = pool.submit(k.list, r.NODES)
            # Leases before ReplicaSets: see spotguard.nodeadded.cleanup.
            leases = k.list(r.LEASES, self.namespace, label_selector=cleanup.LEASE_SELECTOR)
            replicasets = k.list(r.REPLICASETS)
            budgets = k.list(r.PODDISRUPTIONBUDGETS)
            namespaces = {
                str((ns.get("metadata") or {}).get("name")): dict((ns.get("metadata") or {}).get("annotations") or {})
                for ns in k.list(r.NAMESPACES)
            }
            workloads: dict[str, Obj] = {}
            for kind, res in WORKLOAD_RESOURCES.items():
                for w in k.list(res):
                    w["kind"] = str(kind)
                    meta = w.get("metadata") or {}
                    workloads[f"{kind}/{meta.get('namespace')}/{meta.get('name')}"] = w
            nodes = nodes_f.result()
            pods = pods_f.result()
        return Snapshot(nodes, pods, workloads, replicasets, budgets, namespaces, leases)

    def _states(
        self, snap: Snapshot, config: Config
    ) -> tuple[dict[str, WorkloadState], dict[str, MoveRecord], dict[str, int]]:
        owners: dict[tuple[str, str], str] = {}
        for rs in snap.replicasets:
            meta = rs.get("metadata") or {}
            for ref in meta.get("ownerReferences") or []:
                if ref.get("controller") and ref.get("kind") == "Deployment":
                    owners[(str(meta.get("namespace")), str(meta.get("name")))] = str(ref.get("name"))
        pods_by_key: dict[str, list[PodView]] = defaultdict(list)
        for p in snap.pod_views:
            key = interruption.workload_key_of(p, owners)
            if key is not None:
                pods_by_key[key].append(p)
        budget_views = [interruption.Budget.from_json(b) for b in snap.budgets]
        index = interruption.BudgetIndex(budget_views)
        allowed_by_name = {
            (str(b["metadata"].get("namespace")), str(b["metadata"].get("name"))): int(
                (b.get("status") or {}).get("disruptionsAllowed") or 0
            )
            for b in snap.budgets
        }
        states: dict[str, WorkloadState] = {}
        records: dict[str, MoveRecord] = {}
        budgets: dict[str, int] = {}
        for key, raw in snap.workloads.items():
            wl = Workload.from_json(raw)
            record = MoveRecord.of(wl)
            # The floor at the owner's count: a scale move adds a replica the owner did not ask for.
            replicas = record.replicas if record is not None and not record.held else None
            floor = floors.floor_for(wl, config, snap.namespaces.get(wl.namespace), replicas)
            wl_pods = tuple(pods_by_key.get(key, ()))
            states[key] = WorkloadState(wl, floor, wl_pods)
            if record is not None:
                records[key] = record
            elif MOVE in wl.annotations:
                log.warning("unreadable move record: removing it", extra={"workload": key})
                # A hold that is over: the next step removes the annotation.
                records[key] = MoveRecord(
                    Direction.TO_SPOT, Method.SCALE, "", "", wl.replicas, -1, 0.0, 0, hold_until=1.0
                )
            if wl.kind is Kind.STATEFULSET and wl_pods:
                users = interruption.user_budgets(wl_pods, index)
                if users:
                    budgets[key] = min(allowed_by_name.get((b.namespace, b.name), 0) for b in users)
        return states, records, budgets

    def _gauges(self, plan: rebalance.Plan) -> None:
        metrics.OFF_OPTIMUM.labels("surplus").set(len(plan.surplus))
        metrics.OFF_OPTIMUM.labels("deficit").set(len(plan.deficits))
        counts: dict[str, int] = defaultdict(int)
        for s in plan.skipped:
            counts[str(s.reason)] += 1
        for reason in rebalance.SkipReason:
            metrics.SKIPPED.labels(str(reason)).set(counts.get(str(reason), 0))

    # -- starting a move -----------------------------------------------------------------------

    def _start(
        self,
        move: rebalance.Move,
        snap: Snapshot,
        states: dict[str, WorkloadState],
        capacity_of: dict[str, Capacity],
        now: float,
    ) -> bool:
        """Start one move; False where a write failed (logged)."""
        wl = move.workload
        raw = snap.workloads.get(wl.key)
        if raw is None:
            return True
        state = states[wl.key]
        record = MoveRecord(
            direction=move.direction,
            method=move.method,
            pod=move.pod.name,
            uid=move.pod.uid,
            replicas=wl.replicas,
            scaled_to=wl.replicas + 1 if move.method is Method.SCALE else wl.replicas,
            started=now,
            on_demand=moves.count_on(state.pods, capacity_of, Placement.ON_DEMAND),
            cost=move.pod.annotations.get(DELETION_COST),
            reason=move.reason,
        )
        labels = (str(move.direction), str(move.method))
        try:
            if move.method is Method.SCALE:
                # The record first (the lock: a second reconcile loses on the resourceVersion),
                # then the ranking; a pass cut off between the two sets it at the finish.
                written = self._patch_workload(raw, {MOVE: record.to_json()}, replicas=record.scaled_to)
                with contextlib.suppress(NotFound):
                    self._set_cost(move.pod.namespace, move.pod.name, str(moves.FIRST_TO_GO))
            else:
                written = self._patch_workload(raw, {MOVE: record.to_json()})
                try:
                    self.kube.evict(move.pod.name, move.pod.namespace)
                except TooManyRequests:
                    # A budget forbids it now: leave a hold, never a retry loop.
                    metrics.MOVES.labels(*labels, "blocked").inc()
                    log.info("eviction refused by a budget: holding", extra={"workload": wl.key, "pod": move.pod.name})
                    hold = moves.held(record, now, "a budget refused the eviction", self.config.rebalance_hold_seconds)
                    self._patch_workload(written, {MOVE: hold.to_json()})
                    return True
                except NotFound:
                    pass
        except Conflict:
            # Someone else wrote the workload since it was read: the next pass plans it again.
            log.info("workload changed since it was read: next pass", extra={"workload": wl.key})
            return True
        except NotFound:
            return True
        except ApiError as exc:
            metrics.MOVES.labels(*labels, "failed").inc()
            metrics.ERRORS.labels("move").inc()
            log.warning("could not start a move", extra={"workload": wl.key, "error": str(exc)})
            return False
        metrics.MOVES.labels(*labels, "started").inc()
        what = "back to spot" if move.direction is Direction.TO_SPOT else "back to on-demand (floor)"
        how = (
            f"scaled {wl.replicas} -> {record.scaled_to}; {move.pod.name} on {move.from_node} "
            "goes once the new replica is Ready"
            if move.method is Method.SCALE
            else f"evicted {move.pod.name} on {move.from_node}; it comes back placed by the admission webhook"
        )
        log.info(
            "move started",
            extra={"workload": wl.key, "direction": str(move.direction), "pod": move.pod.name, "reason": move.reason},
        )
        self.kube.create_event(
            written, "SpotguardRebalance", f"moving one replica {what}: {how} ({move.reason})", best_effort=True
        )
        return True

    # -- carrying a move on ----------------------------------------------------------------------

    def _progress(
        self, step: Progress, snap: Snapshot, states: dict[str, WorkloadState], capacity_of: dict[str, Capacity]
    ) -> bool:
        if step.action is Action.WAIT:
            log.debug("move in progress", extra={"workload": step.workload.key, "reason": step.reason})
            return False
        wl, record = step.workload, step.record
        raw = snap.workloads.get(wl.key)
        if raw is None:
            return False
        labels = (str(record.direction), str(record.method))
        try:
            if step.restore_cost:
                with contextlib.suppress(NotFound):
                    self._set_cost(wl.namespace, record.pod, record.cost)
            elif step.action is Action.FINISH and record.method is Method.SCALE:
                marked = next((p for p in states[wl.key].pods if p.uid == record.uid and p.active), None)
                if marked is not None and marked.annotations.get(DELETION_COST) != str(moves.FIRST_TO_GO):
                    with contextlib.suppress(NotFound):
                        self._set_cost(wl.namespace, record.pod, str(moves.FIRST_TO_GO))
            if step.action is Action.EVICT:
                try:
                    self.kube.evict(record.pod, wl.namespace)
                except TooManyRequests:
                    metrics.MOVES.labels(*labels, "blocked").inc()
                except NotFound:
                    pass
                return False
            keep = step.hold.to_json() if step.hold is not None else None
            written = self._patch_workload(raw, {MOVE: keep}, replicas=step.replicas)
        except Conflict:
            log.info("workload changed since it was read: next pass", extra={"workload": wl.key})
            return False
        except NotFound:
            return False
        except ApiError as exc:
            metrics.ERRORS.labels("finish").inc()
            log.warning("could not carry a move on", extra={"workload": wl.key, "error": str(exc)})
            return True
        step_name = {
            Action.FINISH: "finished",
            Action.ABORT: "aborted",
            Action.HOLD: "held",
            Action.END: "ended",
        }[step.action]
        if step.action is Action.FINISH and step.hold is not None:
            step_name = "held"
        metrics.MOVES.labels(*labels, step_name).inc()
        log.info("move " + step_name, extra={"workload": wl.key, "pod": record.pod, "reason": step.reason})
        if step.action is not Action.END or record.held is False:
            message = {
                Action.FINISH: f"scaled back to {step.replicas}: {record.pod} goes ({step.reason})",
                Action.ABORT: f"move undone, scaled back to {step.replicas} ({step.reason}); holding",
                Action.HOLD: f"move over without progress ({step.reason}); holding",
                Action.END: f"move record removed ({step.reason})",
            }[step.action]
            if step.hold is not None and step.action is Action.FINISH:
                message += f"; holding: {step.hold.reason}"
            self.kube.create_event(
                written,
                "SpotguardRebalance",
                message,
                "Warning" if step_name in ("aborted", "held") else "Normal",
                best_effort=True,
            )
        return False

    # -- writes ------------------------------------------------------------------------------------

    def _set_cost(self, namespace: str, pod: str, cost: str | None) -> None:
        self.kube.patch(r.PODS, pod, {"metadata": {"annotations": {DELETION_COST: cost}}}, namespace)

    def _patch_workload(self, raw: Obj, annotations: dict[str, str | None], replicas: int | None = None) -> Obj:
        """One merge patch guarded by the resourceVersion read (409 Conflict when stale)."""
        meta = raw.get("metadata") or {}
        patch: Obj = {"metadata": {"annotations": annotations, "resourceVersion": meta.get("resourceVersion")}}
        if replicas is not None:
            patch["spec"] = {"replicas": replicas}
        kind = Kind(raw.get("kind", "Deployment"))
        written = self.kube.patch(WORKLOAD_RESOURCES[kind], str(meta.get("name")), patch, str(meta.get("namespace")))
        written["kind"] = str(kind)
        return written

    # -- cleanup -----------------------------------------------------------------------------------

    def _delete_lease(self, lease: cleanup.OrphanLease) -> bool:
        try:
            self.kube.delete(r.LEASES, lease.name, lease.namespace, resource_version=lease.resource_version or None)
        except (NotFound, Conflict):
            return False
        except ApiError as exc:
            metrics.ERRORS.labels("lease").inc()
            log.warning("could not delete a reservation lease", extra={"lease": lease.name, "error": str(exc)})
            return True
        metrics.CLEANUPS.labels("lease").inc()
        log.info(
            "reservation lease of a ReplicaSet that no longer exists deleted",
            extra={"lease": f"{lease.namespace}/{lease.name}", "replicaset": lease.replicaset},
        )
        return False

    def _taint(self, step: cleanup.TaintCleanup, nodes: dict[str, Obj], now: float) -> bool:
        node = nodes.get(step.node)
        if node is None:
            return False
        try:
            written = self.kube.patch(r.NODES, step.node, cleanup.taint_patch(node, step.step, now))
        except (NotFound, Conflict):
            return False
        except ApiError as exc:
            metrics.ERRORS.labels("taint").inc()
            log.warning("could not clean an interruption taint", extra={"node": step.node, "error": str(exc)})
            return True
        if step.step is cleanup.TaintStep.REMOVE:
            metrics.CLEANUPS.labels("taint").inc()
            log.info("interruption taint removed from a node that survived", extra={"node": step.node})
            self.kube.create_event(
                written, "SpotInterruptionOver", f"interruption taint removed: {step.reason}", best_effort=True
            )
        return False

