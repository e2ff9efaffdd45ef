"""One pass of the node-added reconcile: back to spot, floors repaired, leftovers cleaned.

``Reconciler.reconcile()`` reads the cluster once (nodes, pods, Deployments,
ReplicaSets, StatefulSets, PodDisruptionBudgets, HorizontalPodAutoscalers,
Namespaces, Karpenter's NodePools, the admission Leases and the surge ledger: a fixed number of list
calls whatever the size of the cluster, shared with the spot-interruption
reconcile of step 3, which runs first on it), then

1. carries recorded moves on (:func:`spotguard.policy.moves.progress`):
   scales back once the new replica is Ready, undoes a move that did not work
   out, and leaves a hold where a move made no progress;
2. starts what the pure plan (:func:`spotguard.policy.rebalance.plan`) asks:
   repairs of floors first, then moves back to spot, batched like a rolling
   update (one move per workload at a time, of up to
   ``rebalance_max_pods_per_workload`` pods within its floor and budget, at most
   ``rebalance_max_in_flight`` pods moving across the cluster). Where no spot
   node has room, a move is planned where a Karpenter NodePool (read every pass;
   none where Karpenter is not installed) can launch spot for the pod: its new
   replicas wait Pending for the launch. A Deployment's move is create before
   evict: one patch (guarded by the resourceVersion) writes the move record and
   ``spec.replicas + k``, then the k pods that go get the lowest
   ``controller.kubernetes.io/pod-deletion-cost``; the admission webhook places
   the new pods (on spot only, while the record says a move to spot is under way, the count is
   the move's and no interruption surge is in progress; a pod still Pending on that requirement
   once the webhook would not give it is evicted, below). With an
   autoscaler, its ``minReplicas`` goes up for the move (record, then the
   autoscaler, then the "+1") and back after it (the count, then the
   autoscaler, then the record), only while it holds the move's value. A
   StatefulSet's move writes the record, then evicts the pod through the
   Eviction API (a budget's 429 leaves a short hold, never a retry loop);
3. cleans up: the spot-interruption function's own reconcile scales back
   surges that are over and deletes left-over temporary budgets
   (:meth:`spotguard.interruption.handler.Handler.reconcile`), which also
   finishes half-done handlings and untaints nodes that survived their notice;
   reservation Leases of ReplicaSets that no longer exist are deleted
   (:mod:`spotguard.nodeadded.cleanup`); a pod left Pending on the spot requirement a move to
   spot gave it, once the webhook would not give it (the move over, the count the owner's, a
   surge in progress), is evicted (a Pending pod: no budget
   counts it) so that its controller creates it again, placed as usual
   (:func:`spotguard.policy.moves.stranded`).

A cluster at its optimum costs only the list calls and writes nothing. A pass
never undoes the previous one: a move to spot stops at the floor and a repair
at the floor, and a workload with a move recorded is left to that move.
What moved and why is told in Kubernetes Events on the workloads, in the log
and in :mod:`spotguard.nodeadded.metrics`. ``dry_run=True`` reads and plans,
and writes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.gateway import settings
from spotguard.gateway.errors import ApiError, Conflict, Forbidden, Invalid, NotFound, TooManyRequests
from spotguard.interruption import handler as interruption_handler
from spotguard.nodeadded import cleanup, metrics
from spotguard.nodeadded import headroom as headroom_keeper
from spotguard.policy import floors, headroom, interruption, moves, nodepools, patches, rebalance, surgecopy
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.moves import MOVE, Action, Direction, Marked, Method, MoveRecord, Progress
from spotguard.policy.placement import Placement
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import DELETION_COST, MOVE_REQUIRES_SPOT, Kind, Workload

log = logging.getLogger("spotguard.nodeadded")

Obj = dict[str, Any]
LIST_PAGE = kube_mod.BIG_PAGE
WORKERS = 8
CONFLICT_ATTEMPTS = 4
WORKLOAD_RESOURCES = {Kind.DEPLOYMENT: r.DEPLOYMENTS, Kind.STATEFULSET: r.STATEFULSETS}
# The admission webhook caches a workload for 2 s of real time from when its read came back
# (spotguard.admission.resolve, ``workload_ttl``; ``$SPOTGUARD_WORKLOAD_CACHE_SECONDS``,
# spotguard.gateway.settings): a move's "+k" waits that long after its record, and a second
# for a read in flight, so that every replica it creates is admitted on a copy that carries
# the record (its new replicas then require spot).
READ_IN_FLIGHT_SECONDS = 1.0
ADMISSION_CACHE_SECONDS = settings.WORKLOAD_CACHE_SECONDS + READ_IN_FLIGHT_SECONDS


@dataclass
class _Begun:
    """A Deployment's move whose record is written; the "+k" is still to come."""

    batch: list[rebalance.Move]
    record: MoveRecord
    written: Obj
    hpa: interruption.Autoscaler | None


@dataclass
class Snapshot:
    """One read of the cluster, shared with the spot-interruption reconcile (``shared``)."""

    shared: interruption_handler.Snapshot
    replicasets: list[Obj]
    leases: list[Obj]
    pools: list[nodepools.NodePool] = field(default_factory=list)  # Karpenter NodePools (none: not installed)
    autoscaler_max: dict[str, int] = field(default_factory=dict)  # Deployment key -> its HPA's maxReplicas

    def __post_init__(self) -> None:
        for a in self.shared.autoscaler_views:
            if a.target_kind == str(Kind.DEPLOYMENT):
                self.autoscaler_max[f"{Kind.DEPLOYMENT}/{a.namespace}/{a.target_name}"] = a.max_replicas

    # Light views (grouping and counting need no requests or affinity: 20,000 pods), built once
    # for both reconciles.
    @property
    def nodes(self) -> list[Obj]:
        return self.shared.nodes

    @property
    def pods(self) -> list[Obj]:
        return self.shared.pods

    @property
    def workloads(self) -> dict[str, Obj]:
        return self.shared.workloads

    @property
    def budgets(self) -> list[Obj]:
        return self.shared.budgets

    @property
    def namespaces(self) -> dict[str, dict[str, str]]:
        return self.shared.namespaces

    @property
    def node_views(self) -> list[NodeView]:
        return self.shared.node_views

    @property
    def pod_views(self) -> list[PodView]:
        return self.shared.pod_views

    def autoscaler_of(self, workload: Workload) -> interruption.Autoscaler | None:
        return interruption.autoscaler_for(workload, self.shared.autoscaler_views)

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
    # Pods Pending on a move's spot requirement no longer asked for (spotguard.policy.moves.stranded).
    stranded: list[PodView] = field(default_factory=list)
    surges_over: list[str] = field(default_factory=list)  # workloads whose surge the interruption reconcile ends
    # Nodes whose spotguard.io/spot label this pass sets ("true") or removes (None).
    node_labels: dict[str, str | None] = field(default_factory=dict)
    # The on-demand headroom wanted (spotguard.policy.headroom) and what this pass did to keep it.
    headroom: headroom.Headroom = field(default_factory=lambda: headroom.Headroom(headroom.Cover.OFF))
    headroom_step: headroom_keeper.Step = headroom_keeper.Step.UNCHANGED
    failures: int = 0
    dry_run: bool = False
    seconds: float = 0.0
    again: int = 0  # planned moves not begun because their workload changed since the read

    @property
    def in_flight(self) -> bool:
        """Moves begun or carried on by this pass, waiting for their new replicas (not a hold), or
        planned and not begun because their workload changed since the read: a pass soon has more
        to do for them (:class:`spotguard.nodeadded.service.Service` follows)."""
        return (
            bool(self.started)
            or self.again > 0
            or any(p.action is not Action.WAIT or not p.record.held for p in self.progress)
        )

    @property
    def optimal(self) -> bool:
        return (
            not self.plan.surplus
            and not self.plan.deficits
            and not self.progress
            and not self.leases
            and not self.stranded
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
        clock: Callable[[], float] | None = None,
        workers: int = WORKERS,
        interruption_reconcile: Callable[[interruption_handler.Snapshot], None] | None = None,
        admission_cache_seconds: float = ADMISSION_CACHE_SECONDS,
    ) -> None:
        self.kube = kube
        self.admission_cache_seconds = admission_cache_seconds
        self._config = config
        self.namespace = namespace
        # The API server's clock by default: a move's times and a pod's age are judged against
        # timestamps it wrote, whatever this process's own clock says (a skewed instance).
        server_now = getattr(kube, "server_now", None)
        self.clock: Callable[[], float] = clock or (server_now if callable(server_now) else time.time)
        self.workers = workers
        self.last_timings: dict[str, float] = {}  # seconds of the last pass's read and plan
        # Scales back surges that are over and sweeps left-over temporary budgets, on the
        # snapshot this pass read (no second read of the cluster).
        self.interruption_reconcile = interruption_reconcile or self._interruption_reconcile
        self.headroom = headroom_keeper.Keeper(kube, namespace)

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> Reconciler:
        """The Kubernetes connection and settings of this process (in-cluster, EKS token, kubeconfig)."""
        import os

        k = kube_mod.connect(kubeconfig)
        namespace = os.environ.get("SPOTGUARD_NAMESPACE") or settings.DEFAULT_NAMESPACE
        wait = settings.workload_cache_seconds() + READ_IN_FLIGHT_SECONDS
        return cls(k, lambda: settings.load(k)[0], namespace=namespace, admission_cache_seconds=wait)

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
                "headroom": report.headroom.count,
                "headroom_step": str(report.headroom_step),
                "failures": report.failures,
                "seconds": round(report.seconds, 3),
            },
        )
        return report

    def _pass(self, dry_run: bool) -> Report:
        config = self.config
        started = time.perf_counter()
        with kube_mod.gc_paused():
            snap = self.snapshot(config)
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
                    autoscaler_min=_autoscaler_min(snap, states[key].workload, record),
                )
                for key, record in sorted(records.items())
            ]
            plan = rebalance.plan(
                config,
                snap.node_views,
                snap.full_pod_views,
                states.values(),
                budgets=budgets,
                now=now,
                autoscaler_max=snap.autoscaler_max,
                pools=snap.pools,
                in_flight=sum(rec.size for rec in records.values() if not rec.held),
            )
        planned = time.perf_counter()
        self.last_timings = {"read": read - started, "plan": planned - read}
        report = Report(plan=plan, progress=progress, dry_run=dry_run)
        workload_views = [Workload.from_json(w) for w in snap.workloads.values()]
        report.leases = cleanup.orphan_leases(snap.leases, snap.replicasets)
        # Judged on the records as read, before this pass ends any move: a move this pass undoes
        # scales its own Pending replicas away; what is left is the next pass's.
        report.stranded = [
            p
            for st in states.values()
            for p in st.pods
            if moves.stranded(p, st.workload, now, surge_copy=st.surge_copy)
        ]
        done, _waiting = interruption.finish(
            workloads=workload_views,
            pods=snap.pod_views,
            nodes=snap.node_views,
            now=now,
            marks=snap.shared.node_notices,
        )
        alive = {n.name for n in snap.node_views}
        # A rebalance's surge whose node lives is the spot-interruption function's to end.
        report.surges_over = [f.workload.key for f in done if not interruption.rebalance_node_lives(f.record, alive)]
        report.node_labels = patches.spot_node_labels(((n.name, n.labels) for n in snap.node_views), config)
        report.headroom = self._headroom(config, snap, states, capacity_of)
        current_headroom = snap.workloads.get(headroom_keeper.key(self.namespace))
        self._gauges(plan)
        if dry_run:
            report.started = plan.first_step()
            report.headroom_step = self.headroom.keep(report.headroom, current_headroom, config, dry_run=True)
            return report
        batches = plan.batches()
        # The spot-interruption reconcile first, on the snapshot as read (its writes are then
        # against what it saw); it owns the workloads with a surge, which this plan leaves alone.
        try:
            self.interruption_reconcile(snap.shared)
        except Exception as exc:  # its own errors are its own; the pass goes on
            metrics.ERRORS.labels("interruption").inc()
            log.warning("the interruption reconcile failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            report.failures += 1
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            failures = list(pool.map(lambda p: self._progress(p, snap, states, capacity_of), progress))
            begun = list(pool.map(lambda b: self._start(b, snap, states, capacity_of, now), batches))
            if any(isinstance(b, _Begun) for b in begun):
                # Every record written, then the admission webhook's cached copies of these
                # workloads (without the record) expire before their new replicas are created.
                time.sleep(self.admission_cache_seconds)
            starts = list(pool.map(lambda b: self._scale_up(b) if isinstance(b, _Begun) else b, begun))
            report.started = [m for b, ok in zip(batches, starts, strict=True) if ok for m in b]
            # not now: the workload changed since the pass read it (or its "+k" found the count
            # changed): the next pass plans or ends it
            report.again = sum(1 for ok in starts if ok is None)
            failures += [ok is False for ok in starts]
            failures += list(pool.map(self._delete_lease, report.leases))
            if report.stranded:
                versions = _resource_versions(snap.pods, {p.uid for p in report.stranded})
                failures += list(pool.map(lambda p: self._evict_stranded(p, versions.get(p.uid)), report.stranded))
            failures += list(pool.map(self._label_node, report.node_labels.items()))
        report.headroom_step = self.headroom.keep(report.headroom, current_headroom, config)
        failures.append(report.headroom_step is headroom_keeper.Step.FAILED)
        self.headroom.unplaced(snap.pod_views if config.headroom is not headroom.Cover.OFF else [], now)
        report.failures += sum(1 for f in failures if f)
        return report

    def _headroom(
        self, config: Config, snap: Snapshot, states: dict[str, WorkloadState], capacity_of: dict[str, Capacity]
    ) -> headroom.Headroom:
        """The on-demand headroom wanted; the requests of the pods on spot nodes only are read."""
        if config.headroom is headroom.Cover.OFF:
            return headroom.Headroom(headroom.Cover.OFF)
        spot = {name for name, cap in capacity_of.items() if cap is Capacity.SPOT}
        full = headroom_keeper.with_requests(states.values(), snap.pods, spot)
        risks = headroom.at_risk(snap.node_views, full, capacity_of)
        return headroom.size(config.headroom, risks, config.headroom_max_pods)

    def _interruption_reconcile(self, snap: interruption_handler.Snapshot) -> None:
        # A rebalance recommendation's surge is ended by the spot-interruption function only:
        # a reclaim warning for its node may be in its hands, not yet written to the cluster.
        handler = interruption_handler.Handler(self.kube, self.config, clock=self.clock, ends_rebalance_surges=False)
        handler.reconcile(snap)

    # -- reading -----------------------------------------------------------------------------

    def snapshot(self, config: Config | None = None) -> Snapshot:
        """One read for both reconciles: the big lists side by side with two chains of small
        ones, each in the order its reader needs (Leases before ReplicaSets: see
        :mod:`spotguard.nodeadded.cleanup`; budgets, autoscalers and the surge ledger before
        the workloads: see :meth:`spotguard.interruption.handler.Handler.snapshot`)."""

        def leases_then_replicasets(k: kube_mod.Kube) -> tuple[list[Obj], list[Obj]]:
            leases = k.list(r.LEASES, self.namespace, label_selector=cleanup.LEASE_SELECTOR)
            return leases, k.list(r.REPLICASETS)

        def read_nodepools(k: kube_mod.Kube) -> list[Obj]:
            try:
                return k.list(r.NODEPOOLS)
            except NotFound:
                return []  # Karpenter is not installed
            except Forbidden as exc:
                log.warning("may not list NodePools: moves wait for spot room", extra={"error": str(exc)})
                return []

        # The surge copies (surge_copy) among the lists read before the workloads, as the
        # spot-interruption function reads them: its reconcile, run on this snapshot, sweeps
        # copies and carries out each surge's copy step.
        copies = (config or self.config).surge_copy
        before_workloads = functools.partial(interruption_handler.read_before_workloads, copies=copies)
        pods, nodes, namespace_list, (leases, replicasets), (budgets, autoscalers, kept, found, workloads), pools = (
            self.kube.read_concurrently(
                r.PODS,
                r.NODES,
                r.NAMESPACES,
                leases_then_replicasets,
                before_workloads,
                read_nodepools,
                page_limit=LIST_PAGE,
            )
        )
        namespaces = interruption_handler.namespaces_of(namespace_list)
        copies_found = surgecopy.copies_by_key(found)
        shared = interruption_handler.Snapshot(
            nodes, pods, workloads, budgets, autoscalers, namespaces, kept, copies=copies_found
        )
        return Snapshot(shared, replicasets, leases, [nodepools.NodePool.from_json(p) for p in pools])

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
        index = interruption.BudgetIndex(snap.shared.budget_views)
        allowed_by_name = {
            (str(b["metadata"].get("namespace")), str(b["metadata"].get("name"))): int(
                (b.get("status") or {}).get("disruptionsAllowed") or 0
            )
            for b in snap.budgets
        }
        states: dict[str, WorkloadState] = {}
        records: dict[str, MoveRecord] = {}
        budgets: dict[str, int] = {}
        # The snapshot's views (one per workload, in order): a copy's surge keeps its record on
        # the copy, and the Deployment is seen with it (a move waits while a surge is in progress:
        # moves.surge_in_progress). Not the ledger's stand-in for a record lost to a replace
        # (snap.shared.lost: the interruption reconcile's to mend): a move reads the workload as it is.
        on_copies = snap.shared.copy_records(done=True)
        lost = snap.shared.lost
        for (key, raw), view in zip(snap.workloads.items(), snap.shared.workload_views, strict=True):
            wl = Workload.from_json(raw) if key in lost else view
            record = MoveRecord.of(wl)
            # The floor at the owner's count: a scale move adds a replica the owner did not ask for.
            replicas = record.replicas if record is not None and not record.held else None
            floor = floors.floor_for(wl, config, snap.namespaces.get(wl.namespace), replicas)
            wl_pods = tuple(pods_by_key.get(key, ()))
            # A copy at 0 keeping a finished record (its doomed node still exists) serves nothing.
            held = key in on_copies and on_copies[key].done
            states[key] = WorkloadState(wl, floor, wl_pods, surge_copy=key in snap.shared.copies and not held)
            if record is not None:
                records[key] = record
            elif MOVE in wl.annotations:
                log.warning("unreadable move record: removing it", extra={"workload": key})
                # A hold that is over: the next step removes the annotation.
                records[key] = MoveRecord(
                    Direction.TO_SPOT, Method.SCALE, "", "", wl.replicas, -1, 0.0, 0, hold_until=1.0
                )
            if wl_pods:
                # A StatefulSet's eviction asks its budget; a Deployment's batch is bounded by it.
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
        batch: list[rebalance.Move],
        snap: Snapshot,
        states: dict[str, WorkloadState],
        capacity_of: dict[str, Capacity],
        now: float,
    ) -> _Begun | bool | None:
        """Begin one move (the batch of one workload): its record is written (the lock). A
        StatefulSet's eviction follows at once (True when started); a Deployment's move is
        carried on by :meth:`_scale_up` (a :class:`_Begun`). None when not now (changed or
        gone), False when a write failed."""
        move = batch[0]
        wl = move.workload
        raw = snap.workloads.get(wl.key)
        if raw is None:
            return None
        state = states[wl.key]
        more = tuple(Marked(m.pod.name, m.pod.uid, m.pod.annotations.get(DELETION_COST)) for m in batch[1:])
        if move.method is not Method.SCALE:
            more = ()
        record = MoveRecord(
            direction=move.direction,
            method=move.method,
            pod=move.pod.name,
            uid=move.pod.uid,
            replicas=wl.replicas,
            scaled_to=wl.replicas + 1 + len(more) if move.method is Method.SCALE else wl.replicas,
            started=now,
            on_demand=moves.count_on(state.pods, capacity_of, Placement.ON_DEMAND),
            cost=move.pod.annotations.get(DELETION_COST),
            reason=move.reason,
            more=more,
            generation=int((raw.get("metadata") or {}).get("generation") or 0),
            scaled=False if move.method is Method.SCALE else None,
        )
        hpa = snap.autoscaler_of(wl) if move.method is Method.SCALE else None
        if hpa is not None and hpa.min_replicas < record.scaled_to <= hpa.max_replicas:
            # Its autoscaler would undo the "+k" at its next sync: its minimum goes up for the move.
            record = dataclasses.replace(record, hpa=hpa.name, hpa_min=hpa.min_replicas, hpa_set=record.scaled_to)
        labels = (str(move.direction), str(move.method))
        try:
            # The record first: the lock (a second reconcile loses on the resourceVersion), what
            # an autoscaler is to get back, and what tells the admission webhook that the new
            # replicas are the move's (spot only). A pass cut off after it leaves the count as it
            # was, the record not ``scaled``: the next pass ends the move (spotguard.policy.moves.
            # progress) and restores what was raised.
            written = self._patch_workload(raw, {MOVE: record.to_json()})
            if move.method is Method.SCALE:
                return _Begun(batch, record, written, hpa if record.hpa_set is not None else None)
            try:
                self.kube.evict(move.pod.name, move.pod.namespace)
            except TooManyRequests as exc:
                if not exc.refused:
                    # The API server throttled it: the move stays recorded and the next
                    # pass evicts again (moves.progress: "still there"), no hold.
                    metrics.MOVES.labels(*labels, "throttled").inc()
                    log.info("eviction throttled by the API server: next pass",
                             extra={"workload": wl.key, "pod": move.pod.name})  # fmt: skip
                    return True
                # A budget forbids it now although its status allowed it when read: another
                # evictor took the disruption. A short hold, then the planner asks the budget's
                # status again (never a retry loop, never the long hold of a move without progress).
                metrics.MOVES.labels(*labels, "blocked").inc()
                wait = min(moves.BUDGET_HOLD_SECONDS, float(self.config.rebalance_hold_seconds))
                log.info("eviction refused by a budget: waiting for it",
                         extra={"workload": wl.key, "pod": move.pod.name, "seconds": wait})  # fmt: skip
                hold = moves.held(record, now, "a budget refused the eviction", wait)
                # Guarded by the record, not the resourceVersion the record's write returned: the
                # StatefulSet controller writes the set's status as its pods change (the rival's
                # eviction itself, a readyReplicas behind the pass's read), and a 409 here left the
                # move recorded without its hold: its eviction retried every pass, and the rival's
                # pod came back as the move's new replica (spot only), so the recorded pod, evicted
                # once the budget allowed, came back on on-demand for the floor: a 600 s hold.
                if not self._swap_record(written, record.to_json(), hold.to_json()):
                    log.info("the move's record changed since it was written: its hold not written",
                             extra={"workload": wl.key, "pod": move.pod.name})  # fmt: skip
                return True
            except NotFound:
                pass
        except Conflict:
            # Someone else wrote the workload since it was read: the next pass plans it again.
            log.info("workload changed since it was read: next pass", extra={"workload": wl.key})
            return None
        except NotFound:
            return None
        except ApiError as exc:
            return _start_failed(wl, labels, exc)
        self._started(_Begun(batch, record, written, None))
        return True

    def _scale_up(self, begun: _Begun) -> bool | None:
        """A Deployment's move, once its record is written and the admission webhook's cached
        copy of the workload is at least that old: the autoscaler's minimum raised (the record
        holds what it was), the pods that go ranked first, then the "+k" (only while the count
        is still the owner's: a JSON patch's test)."""
        record, wl = begun.record, begun.batch[0].workload
        labels = (str(record.direction), str(record.method))
        try:
            if begun.hpa is not None:
                self._raise_autoscaler(wl, record, begun.hpa)
            self._rank(wl.namespace, record.marked)
            written = self._scale_if(
                begun.written,
                record.replicas,
                record.scaled_to,
                record=record.to_json(),
                then=dataclasses.replace(record, scaled=True).to_json(),
            )
            if written is begun.written:
                # The test failed: the count or the record changed during the wait. The move began
                # only where the autoscaler whose minimum it raised made the "+k" itself.
                meta = written.get("metadata") or {}
                now = self.kube.get(r.DEPLOYMENTS, str(meta.get("name")), str(meta.get("namespace")))
                count = int((now.get("spec") or {}).get("replicas") or 0)
                if count != record.scaled_to:
                    metrics.MOVES.labels(*labels, "not-begun").inc()
                    log.info(
                        "move not begun: the count changed since the plan read it; the next pass ends it",
                        extra={"workload": wl.key, "replicas": count, "planned": record.replicas},
                    )
                    return None
                written = now
            begun.written = written
        except NotFound:
            return None
        except ApiError as exc:
            return _start_failed(wl, labels, exc)
        self._started(begun)
        return True

    def _started(self, begun: _Begun) -> None:
        record, move = begun.record, begun.batch[0]
        wl = move.workload
        metrics.MOVES.labels(str(record.direction), str(record.method), "started").inc()
        what = "back to spot" if move.direction is Direction.TO_SPOT else "back to on-demand (floor)"
        gone = ", ".join(m.pod for m in record.marked[:5]) + (" ..." if record.size > 5 else "")
        how = (
            f"scaled {record.replicas} -> {record.scaled_to}; {gone} on {move.from_node} "
            f"{'go' if record.size > 1 else 'goes'} once the new replicas are Ready"
            if move.method is Method.SCALE
            else f"evicted {move.pod.name} on {move.from_node}; it comes back placed by the admission webhook"
        )
        log.info(
            "move started",
            extra={
                "workload": wl.key,
                "direction": str(move.direction),
                "pod": move.pod.name,
                "pods": record.size,
                "reason": move.reason,
            },
        )
        count = "one replica" if record.size == 1 else f"{record.size} replicas"
        self.kube.create_event(
            begun.written, "SpotguardRebalance", f"moving {count} {what}: {how} ({move.reason})", best_effort=True
        )

    # -- carrying a move on ----------------------------------------------------------------------

    def _progress(
        self, step: Progress, snap: Snapshot, states: dict[str, WorkloadState], capacity_of: dict[str, Capacity]
    ) -> bool:
        wl, record = step.workload, step.record
        hpa = snap.autoscaler_of(wl) if record.hpa else None
        hpa_min = hpa.min_replicas if hpa is not None and hpa.name == record.hpa else None
        if step.action is Action.WAIT:
            log.debug("move in progress", extra={"workload": wl.key, "reason": step.reason})
            return False
        raw = snap.workloads.get(wl.key)
        if raw is None:
            return False
        labels = (str(record.direction), str(record.method))
        try:
            restore = moves.autoscaler_restore(record, hpa_min) if step.action is not Action.EVICT else None
            if hpa is not None and restore is not None and step.replicas not in (None, wl.replicas):
                # Scaled back first, the record kept (at the count now): with the minimum restored
                # first, the autoscaler would scale back itself, and the workload's write lose.
                # A pass cut off here finds the record and finishes again.
                scaled_back = dataclasses.replace(record, scaled_to=step.replicas)
                raw = self._patch_workload(raw, {MOVE: scaled_back.to_json()}, replicas=step.replicas)
            # Restored before the record goes: a pass cut off after this finds the record and the
            # autoscaler no longer at the move's value, and leaves it.
            if (
                hpa is not None
                and restore is not None
                and self._set_autoscaler_min(hpa, want=restore, expect=record.hpa_set)
            ):
                metrics.AUTOSCALER.labels("restored").inc()
                log.info(
                    "autoscaler minimum restored after the move",
                    extra={"workload": wl.key, "hpa": hpa.name, "min": restore},
                )
            for m in step.restore:
                with contextlib.suppress(NotFound):
                    self._set_cost(wl.namespace, m.pod, m.cost)
            if step.rank and record.method is Method.SCALE:
                # Ranked first again where a pass cut off at the start left one unranked.
                costs = {p.uid: p.annotations.get(DELETION_COST) for p in states[wl.key].pods if p.active}
                self._rank(wl.namespace, [m for m in step.rank if costs.get(m.uid) != str(moves.FIRST_TO_GO)])
            if step.action is Action.EVICT:
                try:
                    self.kube.evict(record.pod, wl.namespace)
                except TooManyRequests as exc:
                    metrics.MOVES.labels(*labels, "blocked" if exc.refused else "throttled").inc()
                except NotFound:
                    pass
                return False
            keep = moves.without_autoscaler(step.hold).to_json() if step.hold is not None else None
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
            names = ", ".join(m.pod for m in step.rank[:5]) or record.pod
            gone = f"{names} {'go' if len(step.rank) > 1 else 'goes'}"
            message = {
                Action.FINISH: f"scaled back to {step.replicas}: {gone} ({step.reason})",
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

    # -- the autoscaler -------------------------------------------------------------------------

    def _scale_if(self, raw: Obj, was: int, to: int, *, record: str | None = None, then: str | None = None) -> Obj:
        """spec.replicas ``was`` -> ``to``, only if it is still ``was`` (a JSON patch's test): the
        autoscaler, whose minimum is ``to`` now, may have scaled it already. With ``record``, only
        while the move record is still that one: another reconcile may have ended the move since
        it was written (the "+k" then would outlive its record and become the owner's count); and
        the record becomes ``then`` in the same write (the move's "+k" written, ``scaled``)."""
        meta = raw.get("metadata") or {}
        ops = [{"op": "test", "path": "/spec/replicas", "value": was}]
        path = "/metadata/annotations/" + MOVE.replace("~", "~0").replace("/", "~1")
        if record is not None:
            ops.append({"op": "test", "path": path, "value": record})
            if then is not None:
                ops.append({"op": "replace", "path": path, "value": then})
        ops.append({"op": "replace", "path": "/spec/replicas", "value": to})
        try:
            written = self.kube.patch(r.DEPLOYMENTS, str(meta.get("name")), ops, str(meta.get("namespace")), "json")
        except Invalid:
            return raw
        written["kind"] = str(Kind.DEPLOYMENT)
        return written

    def _raise_autoscaler(self, wl: Workload, record: MoveRecord, hpa: interruption.Autoscaler) -> None:
        assert record.hpa_set is not None and record.hpa_min is not None
        if self._set_autoscaler_min(hpa, want=record.hpa_set, expect=record.hpa_min):
            metrics.AUTOSCALER.labels("raised").inc()
            log.info(
                "autoscaler minimum raised for the move",
                extra={"workload": wl.key, "hpa": hpa.name, "min": record.hpa_set, "was": record.hpa_min},
            )

    def _set_autoscaler_min(self, hpa: interruption.Autoscaler, *, want: int, expect: int | None) -> bool:
        """Set the autoscaler's minReplicas to ``want`` while it holds ``expect``, guarded by its
        resourceVersion (its status writes change it: re-read and try again). False when someone
        else set another minimum meanwhile (theirs stays); Conflict when it kept changing."""
        rv, current = hpa.resource_version, hpa.min_replicas
        for _ in range(CONFLICT_ATTEMPTS):
            if current != expect:
                return False
            body: Obj = {"spec": {"minReplicas": want}}
            if rv:
                body["metadata"] = {"resourceVersion": rv}
            try:
                self.kube.patch(r.HPAS, hpa.name, body, hpa.namespace)
                return True
            except Conflict:
                fresh = interruption.Autoscaler.from_json(self.kube.get(r.HPAS, hpa.name, hpa.namespace))
                rv, current = fresh.resource_version, fresh.min_replicas
        raise Conflict(409, "Conflict", f"autoscaler {hpa.namespace}/{hpa.name} kept changing")

    # -- writes ------------------------------------------------------------------------------------

    def _rank(self, namespace: str, pods: Sequence[Marked]) -> None:
        """The pods a move removes, ranked first for deletion (gone ones skipped)."""
        for m in pods:
            with contextlib.suppress(NotFound):
                self._set_cost(namespace, m.pod, str(moves.FIRST_TO_GO))

    def _set_cost(self, namespace: str, pod: str, cost: str | None) -> None:
        """One pod's deletion cost (a merge patch of an absolute value: made twice, no harm), tried
        again at once where it failed transiently (:func:`interruption_handler.at_once`). A move
        ranks, and its end restores, up to ``rebalance_max_pods_per_workload`` pods one patch
        each; with one try each, under 20 % failed requests a batch of 10 got through one time in
        nine: worker's moves failed to start (its record left to end 30 s later) or to end, pass
        after pass, a move in progress for most of an hour (chaos spot-refused-after-reclaim)."""
        body = {"metadata": {"annotations": {DELETION_COST: cost}}}
        interruption_handler.at_once(lambda: self.kube.patch(r.PODS, pod, body, namespace))

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

    def _swap_record(self, raw: Obj, was: str, now: str) -> bool:
        """The move record ``was`` becomes ``now``, only while the workload still carries ``was``
        (a JSON patch's test): other writes to the workload since (its controller's status) do
        not stop it, another reconcile's record or its removal does (False)."""
        meta = raw.get("metadata") or {}
        path = "/metadata/annotations/" + MOVE.replace("~", "~0").replace("/", "~1")
        ops = [{"op": "test", "path": path, "value": was}, {"op": "replace", "path": path, "value": now}]
        kind = Kind(raw.get("kind", "Deployment"))
        try:
            self.kube.patch(WORKLOAD_RESOURCES[kind], str(meta.get("name")), ops, str(meta.get("namespace")), "json")
        except Invalid:
            return False
        return True

    def _label_node(self, change: tuple[str, str | None]) -> bool:
        """Sets or removes one node's ``spotguard.io/spot`` label; True when it failed."""
        name, value = change
        try:
            self.kube.patch(r.NODES, name, {"metadata": {"labels": {patches.SPOT_NODE_LABEL: value}}})
        except NotFound:
            return False  # the node is gone: nothing to label
        except ApiError as exc:
            metrics.ERRORS.labels("label").inc()
            log.warning("could not label a node", extra={"node": name, "error": str(exc)})
            return True
        return False

    # -- cleanup -----------------------------------------------------------------------------------

    def _evict_stranded(self, pod: PodView, resource_version: str | None) -> bool:
        """Evicts a pod left Pending on a move's spot requirement (:func:`moves.stranded`), only
        if it is still the pod read, unchanged (bound since: its resourceVersion moved); its
        controller creates it again. True when it failed."""
        try:
            self.kube.evict(pod.name, pod.namespace, uid=pod.uid or None, resource_version=resource_version)
        except (NotFound, Conflict):
            return False  # gone, or changed since the read (the next pass reads it again)
        except ApiError as exc:
            metrics.ERRORS.labels("stranded").inc()
            log.warning(
                "could not evict a pod left Pending on a move's spot requirement",
                extra={"pod": f"{pod.namespace}/{pod.name}", "error": str(exc)},
            )
            return True
        metrics.CLEANUPS.labels("pending-spot-pod").inc()
        log.info(
            "pod left Pending on a move's spot requirement no longer asked for evicted: its controller makes it again",
            extra={"pod": f"{pod.namespace}/{pod.name}", "move": pod.annotations.get(MOVE_REQUIRES_SPOT)},
        )
        return False

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


def _start_failed(wl: Workload, labels: tuple[str, str], exc: ApiError) -> bool:
    metrics.MOVES.labels(*labels, "failed").inc()
    metrics.ERRORS.labels("move").inc()
    log.warning("could not start a move", extra={"workload": wl.key, "error": str(exc)})
    return False


def _resource_versions(pods: Sequence[Obj], uids: set[str]) -> dict[str, str]:
    """The resourceVersion of each pod in ``uids``, as read (None-free)."""
    out: dict[str, str] = {}
    for p in pods:
        meta = p.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if uid in uids and meta.get("resourceVersion"):
            out[uid] = str(meta["resourceVersion"])
    return out


def _autoscaler_min(snap: Snapshot, workload: Workload, record: moves.MoveRecord) -> int | None:
    """The minReplicas of the autoscaler a move raised (None: none, or another one now)."""
    hpa = snap.autoscaler_of(workload) if record.hpa else None
    return hpa.min_replicas if hpa is not None and hpa.name == record.hpa else None
