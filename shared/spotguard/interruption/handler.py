"""Carry out the interruption plan on the cluster.

``Handler.handle(notices)`` reads the cluster once (nodes, pods, Deployments,
StatefulSets, PodDisruptionBudgets, HorizontalPodAutoscalers, Namespaces: a
fixed number of list calls whatever the size of the burst), asks the pure
:mod:`spotguard.policy.interruption` for one plan for the whole batch, then
writes it: one taint per doomed node (with the notice recorded beside it,
``spotguard.io/notice``) as soon as the nodes are read (:class:`_Marking`),
the temporary budgets where the user has none (so a drainer acting at the
notice meets them), then per affected
Deployment one patch (replicas and the ``spotguard.io/surge`` record
together), the autoscaler's limits, and Events. It then scales back the
surges that are over (to the count the owner wants now), evicts doomed pods
whose replacements are Ready (``drain: true``), untaints nodes that survived
their notice, and keeps the surge ledger (:mod:`spotguard.interruption.ledger`).
``reconcile()`` does the same on a schedule, after re-planning every notice
still pending on a tainted node, which finishes a handling cut off half-way.
The settings are a function re-read at their TTL (:attr:`Handler.config`).

Every write is idempotent or guarded by the object's resourceVersion; a write
that fails transiently makes the notices it serves ``RETRY`` (what succeeded
stays, and the next delivery completes the rest, because the plan only asks
for what the objects do not record yet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.gateway.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Invalid,
    NotFound,
    TooManyRequests,
    Transient,
)
from spotguard.interruption import finder, ledger, lifecycle, metrics, records
from spotguard.policy import drains, evictions, floors, interruption, patches, surgecopy, surges, unwind
from spotguard.policy import notices as notices_mod
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.interruption import Autoscaler, Budget, Finish, Plan, SurgeStep, TaintStep, Verdict
from spotguard.policy.notices import NodeNotice, Notice, NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import INTERRUPTION_TAINT, SURGE, SURGE_OF, Kind, Workload, surge_copy_name

log = logging.getLogger("spotguard.interruption")
T = TypeVar("T")

Obj = dict[str, Any]
Event = tuple[Obj, str, str, str]  # involved object, reason, message, type
CONFLICT_ATTEMPTS = 4
TAINT_RETRY_SECONDS = 0.1  # a failed taint write is tried again after 0.1 s, 0.2 s, 0.3 s
WORKERS = 16
# The snapshot reads every pod at once: bigger pages than the gateway's default (500)
# mean fewer round trips; kube-apiserver serves 5,000 a page without trouble.
LIST_PAGE = 5000
# The tag key that marks this cluster's instances (finder: aws-node-termination-handler's
# managed tag, e.g. aws-node-termination-handler/managed); empty: every instance.
MANAGED_TAG_ENV = "SPOTGUARD_MANAGED_TAG"
# Our budgets with no surge in progress are deleted once this old (a crash between
# the scale back and the budget's deletion leaves one behind).
ORPHAN_BUDGET_SECONDS = 60.0


def at_once(write: Callable[[], T], attempts: int = CONFLICT_ATTEMPTS) -> T:
    """``write()``, tried again within the handling where it failed transiently (a 5xx, a
    timeout, a connection dropped after the request went out: the write may or may not have
    happened), after 0.1 s, 0.2 s, 0.3 s, instead of at the notice's redelivery or the next
    reconcile. Under hung requests each of those costs a handling and a reconcile: tens of
    seconds of a two-minute notice (chaos gitops-revert under timeouts: a surge copy created
    at +58 s after one lost create instead of +20 s; made after about +88 s, its pods are not
    Ready by the reclaim).

    Only for a write that may be made twice: a create under a fixed name (made already, it
    answers AlreadyExists), a patch of absolute values, a delete (gone already: NotFound), a
    patch guarded by the resourceVersion (made already: Conflict, and the caller re-reads)."""
    for attempt in range(attempts):
        try:
            return write()
        except Transient:
            if attempt == attempts - 1:
                raise
            time.sleep(TAINT_RETRY_SECONDS * (attempt + 1))
    raise AssertionError("attempts must be at least 1")


class Outcome(enum.StrEnum):
    DONE = "done"
    IGNORED = "ignored"
    RETRY = "retry"


@dataclass
class Snapshot:
    """One read of the cluster, raw and as the policy sees it."""

    nodes: list[Obj]
    pods: list[Obj]
    workloads: dict[str, Obj]  # key -> raw Deployment or StatefulSet
    budgets: list[Obj]
    autoscalers: list[Obj]
    namespaces: dict[str, dict[str, str]]
    # The surge ledger (workload key -> record), as read before the workloads.
    ledger: dict[str, SurgeRecord] = field(default_factory=dict)
    node_views: list[NodeView] = field(default_factory=list)
    pod_views: list[PodView] = field(default_factory=list)
    workload_views: list[Workload] = field(default_factory=list)
    budget_views: list[Budget] = field(default_factory=list)
    autoscaler_views: list[Autoscaler] = field(default_factory=list)
    node_notices: dict[str, NodeNotice] = field(default_factory=dict)
    lost: dict[str, SurgeRecord] = field(default_factory=dict)  # records only the ledger still has
    # The surge copies (surge_copy): Deployment key -> its copy (a ReplicaSet of spotguard's).
    copies: dict[str, Obj] = field(default_factory=dict)
    node_names: frozenset[str] = field(default=frozenset(), init=False)  # of node_views
    _nodes_by_name: dict[str, Obj] = field(default_factory=dict, repr=False, compare=False)
    _pods_by_workload: tuple[dict[str, list[PodView]], dict[str, list[PodView]]] | None = field(
        default=None, repr=False, compare=False
    )
    _index_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # Deployment key -> the record its copy carries, parsed once from ``copies`` when built.
    _copy_records: dict[str, SurgeRecord] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.node_views = [NodeView.from_json(n) for n in self.nodes]
        self.node_names = frozenset(n.name for n in self.node_views)
        for n in self.nodes:
            meta = n.get("metadata") or {}
            mark = NodeNotice.parse((meta.get("annotations") or {}).get(notices_mod.NODE_NOTICE))
            if mark is not None:
                self.node_notices[str(meta.get("name"))] = mark
        self.pod_views = [_pod_view(p) for p in self.pods]
        parsed = ((key, surgecopy.record_of(rs)) for key, rs in self.copies.items())
        self._copy_records = {key: record for key, record in parsed if record is not None}
        self.workload_views = []
        # A copy's surge keeps its record on the copy only (surgecopy.RECORD): the Deployment
        # carries none. A record lost to a replace (the replica surge's, on the workload)
        # stands in from the ledger.
        on_copies = self.copy_records(done=True)
        for key, w in self.workloads.items():
            own = surgecopy.with_record(Workload.from_json(w), on_copies.get(key))
            view = _with_ledger(own, self.ledger)
            if view is not own:
                self.lost[key] = self.ledger[key]
            self.workload_views.append(view)
        self.budget_views = [Budget.from_json(b) for b in self.budgets]
        self.autoscaler_views = [Autoscaler.from_json(a) for a in self.autoscalers]

    def pods_of(self, key: str) -> list[PodView]:
        """The pods of the workload ``key`` (its own: ``interruption.workload_key_of``), from an
        index made once per snapshot. Each surge's copy step and end counted over every pod read:
        500 notices over 20,000 pods took 72 s to write their copies (bench/interruption.py)."""
        return self._index()[0].get(key, [])

    def copy_pods_of(self, key: str) -> list[PodView]:
        """The pods of the Deployment ``key``'s surge copy (``interruption.copy_workload_key``)."""
        return self._index()[1].get(key, [])

    def _index(self) -> tuple[dict[str, list[PodView]], dict[str, list[PodView]]]:
        with self._index_lock:
            if self._pods_by_workload is None:
                own: dict[str, list[PodView]] = {}
                copies: dict[str, list[PodView]] = {}
                for p in self.pod_views:
                    if (owner := interruption.workload_key_of(p)) is not None:
                        own.setdefault(owner, []).append(p)
                    elif (of := interruption.copy_workload_key(p)) is not None:
                        copies.setdefault(of, []).append(p)
                self._pods_by_workload = (own, copies)
            return self._pods_by_workload

    def copy_records(self, *, done: bool = False) -> dict[str, SurgeRecord]:
        """Deployment key -> the surge record its copy carries (a finished one, kept while a
        doomed node still exists, too where ``done``). Parsed once, when the snapshot is built."""
        records = self._copy_records
        return dict(records) if done else {key: record for key, record in records.items() if not record.done}

    def node(self, name: str) -> Obj | None:
        if not self._nodes_by_name:
            self._nodes_by_name = {str((n.get("metadata") or {}).get("name")): n for n in self.nodes}
        return self._nodes_by_name.get(name)


def _with_ledger(view: Workload, kept: Mapping[str, SurgeRecord]) -> Workload:
    """The workload as the plans see it: where it lost its record (replaced) but the ledger
    holds one, the ledger's copy stands in for it (marked lost)."""
    record = kept.get(view.key)
    if record is None or SURGE in view.annotations:
        return view
    extra = {SURGE: record.to_json(), surges.LOST: "true"}
    return dataclasses.replace(view, annotations={**view.annotations, **extra})


def _pod_view(raw: Obj) -> PodView:
    """A PodView with only what the plan reads (20,000 pods: skip requests and tolerations)."""
    return PodView.from_json(raw, scheduling=False)


@dataclass
class Batch:
    """One handling: the notices, what was read, the plan, and what went wrong."""

    notices: Sequence[Notice]
    snap: Snapshot
    resolved: dict[str, str]
    plan: Plan
    failures: Failures
    events: list[Event] = field(default_factory=list)
    # Records written or removed by this handling (None: removed), for the ledger.
    records: dict[str, SurgeRecord | None] = field(default_factory=dict)
    # Each node's notice: its mark as read, or the notice this process is still retrying.
    marks: dict[str, NodeNotice] = field(default_factory=dict)
    # The taints written ahead of the plan, as soon as the nodes were read (:class:`_Marking`).
    marked: list[TaintStep] = field(default_factory=list)
    # The surge copies as this handling wrote them (Deployment key -> the API's answer): a
    # later step of the same pass is guarded by the copy's resourceVersion now, not as read.
    copies: dict[str, Obj] = field(default_factory=dict)

    def copy_of(self, key: str) -> Obj | None:
        return self.copies.get(key) or self.snap.copies.get(key)


@dataclass
class Failures:
    nodes: set[str] = field(default_factory=set)  # nodes whose notices must be retried
    count: int = 0


def read_before_workloads(
    k: kube_mod.Kube, copies: bool = False
) -> tuple[list[Obj], list[Obj], Any, list[Obj], dict[str, Obj]]:
    """Budgets, autoscalers, the surge ledger, the surge copies (``spotguard.io/surge-of``;
    none unless ``copies``), then the workloads (key -> object).

    Every list runs at once, but for one order: budgets, autoscalers, the ledger and the
    copies are read before the workloads. A budget seen here has its workload's record
    visible in the later list (see ``Handler._sweep_budgets``), a surge written between the
    ledger's read and the workloads' is never taken for a lost record (the ledger is
    written after the workloads), and a copy seen here has its record visible too (the
    record is written before the copy), so the sweep never takes a copy being made for a
    left-over. Under a slow or faulty API every request on this path delays the surges:
    two rounds of requests, not eight."""
    first: list[Any] = [r.PODDISRUPTIONBUDGETS, r.HPAS, ledger.read]
    if copies:
        first.append(lambda c: c.list(r.REPLICASETS, None, label_selector=SURGE_OF))
    budgets, autoscalers, kept, *found = k.read_concurrently(*first)
    deployments, statefulsets = k.read_concurrently(r.DEPLOYMENTS, r.STATEFULSETS)
    workloads: dict[str, Obj] = {}
    for kind, items in ((Kind.DEPLOYMENT, deployments), (Kind.STATEFULSET, statefulsets)):
        for w in items:
            w["kind"] = str(kind)
            meta = w.get("metadata") or {}
            workloads[f"{kind}/{meta.get('namespace')}/{meta.get('name')}"] = w
    return budgets, autoscalers, kept, found[0] if found else [], workloads


def namespaces_of(items: list[Obj]) -> dict[str, dict[str, str]]:
    """namespace -> its annotations (where a namespace opts out)."""
    return {
        str((ns.get("metadata") or {}).get("name")): dict((ns.get("metadata") or {}).get("annotations") or {})
        for ns in items
    }


class _Marking:
    """A handling's taints, written as soon as the nodes are read, while the rest of the
    cluster is still being read.

    The taint and the notice beside it (``spotguard.io/notice``) are what a drainer acting
    at the notice meets: the eviction guard holds a going-away spot node's pods for a short
    grace only (8 s) until spotguard's notice is on it. Written after the whole snapshot (two
    rounds of lists, every pod among them), a mark came 12 to 40 s after the notice under
    hung requests (each held 6 s, then read again), and the guard let a drainer that was ahead
    of spotguard take a serving pod (chaos aborted-drain under timeouts in copy mode:
    worker 8 -> 7). The marks depend on the notices, the nodes and the settings only
    (:func:`interruption.plan` with no pod or workload gives them); each node the plan then
    asks a taint of is written here (a write that fails is tried again at once, then its
    notices are retried), or by the plan as before where the node was found otherwise (EC2).
    Taints are idempotent and guarded by the resourceVersion."""

    def __init__(self, handler: Handler, notices: Sequence[Notice]) -> None:
        self.handler = handler
        self.notices = notices
        self.pool = ThreadPoolExecutor(max_workers=handler.workers, thread_name_prefix="marking")
        self.batch: Batch | None = None
        self.jobs: list[Future[None]] = []

    def __enter__(self) -> _Marking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True)

    def start(self, nodes: list[Obj]) -> None:
        """Plan the taints from ``nodes`` alone and write them (on this marking's own threads)."""
        h = self.handler
        try:
            snap = Snapshot(nodes, [], {}, [], [], {}, {})
            plan = interruption.plan(
                self.notices,
                nodes=snap.node_views,
                pods=(),
                workloads=(),
                config=h.config,
                now=h.clock(),
                node_notices=snap.node_notices,
            )
        except Exception:  # the plan after the snapshot writes them
            log.exception("could not plan the taints ahead of the surges")
            return
        self.batch = Batch(self.notices, snap, {}, plan, Failures())
        self.jobs = [self.pool.submit(h._taint, step, self.batch) for step in plan.taints]

    def result(self) -> tuple[list[TaintStep], set[str], list[Event]]:
        """The taints carried out here, the nodes whose taint failed (their notices are
        retried), and the Events of those written."""
        for job in self.jobs:
            job.result()
        if self.batch is None:
            return [], set(), []
        return list(self.batch.plan.taints), set(self.batch.failures.nodes), list(self.batch.events)


class Handler:
    """The spot-interruption core shared by every transport (see the module docstring)."""

    def __init__(
        self,
        kube: kube_mod.Kube,
        config: Config | Callable[[], Config],
        ec2: Any = None,
        clock: Callable[[], float] = time.time,
        *,
        workers: int = WORKERS,
        ends_rebalance_surges: bool = True,
        managed_tag: str = "",
        autoscaling: Any = None,
    ) -> None:
        """``ends_rebalance_surges=False``: a surge whose node had only a rebalance
        recommendation and still exists is left to the spot-interruption function's own
        reconcile (the node-added pass): only that function knows a reclaim warning for the
        node that it could not write yet (:meth:`_remember_retries`)."""
        self.kube = kube
        # A Config, or a function giving the current one (the settings, re-read at their TTL).
        self._config = config
        self.ec2 = ec2
        # Only instances with this tag key are this cluster's where no node names them by
        # providerID (finder: aws-node-termination-handler's managed tag).
        self.managed_tag = managed_tag
        self.clock = clock
        # ASG lifecycle hooks: held with heartbeats until the surge is Ready, then completed.
        self.hooks = lifecycle.Hooks(autoscaling, clock) if autoscaling is not None else None
        self.workers = workers
        self.ends_rebalance_surges = ends_rebalance_surges
        self.last_timings: dict[str, float] = {}  # seconds of the last handle(), by phase
        # event id -> a reclaim notice that could not be carried out yet (it is retried).
        self._retrying: dict[str, Notice] = {}
        self._retrying_lock = threading.Lock()
        # Events of a handling that hurried (notices were waiting): posted from here, after it.
        self._background: ThreadPoolExecutor | None = None
        self._background_lock = threading.Lock()

    @property
    def config(self) -> Config:
        return self._config() if callable(self._config) else self._config

    @property
    def surge_copy(self) -> bool:
        """The surge is a spotguard-owned copy of the Deployment (spotguard.policy.surgecopy),
        not its spec.replicas (the default)."""
        return self.config.surge_copy

    @classmethod
    def from_environment(cls) -> Handler:
        """The Kubernetes connection, the settings (re-read at their TTL) and the AWS clients."""
        k = kube_mod.connect()
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return cls.for_region(k, lambda: _load_config(k), region)

    @classmethod
    def for_region(
        cls,
        k: kube_mod.Kube,
        config: Config | Callable[[], Config],
        region: str | None,
        endpoint_url: str | None = None,
    ) -> Handler:
        """A handler with EC2 and Auto Scaling clients where a region is known, and the
        managed tag of ``$SPOTGUARD_MANAGED_TAG``."""
        ec2 = autoscaling = None
        if region:
            import boto3

            ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)
            autoscaling = boto3.client("autoscaling", region_name=region, endpoint_url=endpoint_url)
        managed_tag = os.environ.get(MANAGED_TAG_ENV, "").strip()
        return cls(k, config, ec2, managed_tag=managed_tag, autoscaling=autoscaling)

    # -- the entry points ------------------------------------------------------------------

    def handle(self, notices: Sequence[Notice], *, hurry: Callable[[], bool] | None = None) -> list[Outcome]:
        """One plan for the whole batch; one outcome per notice, in order.

        ``hurry``: asked once the surges are written; True when other notices wait for this
        handling (:class:`dispatch.Serialized`). The handling then ends there: its Events are
        posted in the background and the upkeep (scale backs, untaints, the ledger) is left to
        the next pass, so that the waiting notices' surges are not held behind requests that
        may hang (chaos one-after-another under timeouts: 26 s of Events and ledger writes
        held two warnings until 50 s before their reclaims)."""
        # The collector stays paused through the writes too: it found almost nothing there
        # (1,683 objects in cycles over 5,060 requests), but its full pass over the snapshot
        # stalled every request for 0.33 s of CPU in the middle of the surges.
        with _gc_paused():
            return self._handle(notices, hurry)

    def _handle(self, notices: Sequence[Notice], hurry: Callable[[], bool] | None = None) -> list[Outcome]:
        notices = [self._with_hook_timeout(n) for n in notices]
        if not notices:
            return []
        started = time.perf_counter()
        with _gc_paused(), _Marking(self, notices) as marking:
            try:
                snap = self.snapshot(on_nodes=marking.start)
            except ApiError as exc:
                metrics.ERRORS.labels("list").inc()
                log.error("could not read the cluster", extra={"error": str(exc), "event_ids": _ids(notices)})
                self._remember_retries([(n, Outcome.RETRY) for n in notices])
                return self._count(notices, [Outcome.RETRY] * len(notices))
            read = time.perf_counter()
            resolved, lookup_failed = self._resolve(notices, snap)
            now = self.clock()
            plan = self._plan(notices, snap, resolved, now)
            marked, unmarked, marked_events = marking.result()
        planned = time.perf_counter()
        batch = Batch(notices, snap, resolved, plan, Failures(nodes=unmarked), events=marked_events, marked=marked)
        failures = batch.failures
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            self._carry_out(batch, pool)
            written = time.perf_counter()
            hurried = hurry is not None and hurry()
            if hurried:
                self._tell_later(batch)
            else:
                self._tell(batch, pool)
            told = time.perf_counter()
            surged = {s.workload.key for s in plan.surges}
            if hurried:
                metrics.HURRIED.inc()
                log.info(
                    "notices are waiting: the upkeep (scale backs, untaints, the ledger) is left to the next pass",
                    extra={"event_ids": _ids(notices)},
                )
            else:
                self._upkeep(snap, pool, skip=surged, batch=batch)
        written_marks = {
            t.node: t.notice for t in (*marked, *plan.taints) if t.notice is not None and t.node not in failures.nodes
        }
        instances = {res.node: res.notice.instance_id for res in plan.notices if res.node}
        self._lifecycle_pass(snap, {**snap.node_notices, **written_marks}, instances)
        self.last_timings = {
            "read": read - started,
            "plan": planned - read,
            "surges_written": written - started,
            "events": told - written,
            "total": time.perf_counter() - started,
        }

        outcomes: list[Outcome] = []
        for res in plan.notices:
            if res.verdict is Verdict.FOREIGN:
                if res.notice.instance_id in lookup_failed:
                    outcomes.append(Outcome.RETRY)
                else:
                    log.info(
                        "notice for an instance that is not in this cluster: acknowledged",
                        extra={
                            "event_id": res.notice.event_id,
                            "instance_id": res.notice.instance_id,
                            "managed_tag": self.managed_tag,
                        },
                    )
                    outcomes.append(Outcome.IGNORED)
            elif res.verdict is Verdict.IGNORED:
                log.info(
                    "notice needs nothing",
                    extra={"event_id": res.notice.event_id, "node": res.node, "reason": res.reason},
                )
                outcomes.append(Outcome.IGNORED)
            elif res.node in failures.nodes:
                outcomes.append(Outcome.RETRY)
            else:
                outcomes.append(Outcome.DONE)
        self._remember_retries([(res.notice, out) for res, out in zip(plan.notices, outcomes, strict=True)])
        log.info(
            "plan carried out",
            extra={
                "event_ids": _ids(notices),
                "notices": len(notices),
                "taints": len(plan.taints),
                "surges": sum(1 for s in plan.surges if s.added),
                "warnings": len(plan.warnings),
                "retry": outcomes.count(Outcome.RETRY),
                "seconds": round(self.clock() - now, 3),
            },
        )
        return self._count(notices, outcomes)

    def _remember_retries(self, outcomes: Iterable[tuple[Notice, Outcome]]) -> None:
        """Keep the reclaim notices that must be retried until they are carried out.

        Until then a node may lack its mark and a workload its surge record (a write, or the
        read before the plan, failed), and a rebalance recommendation's surge for the same
        node would end at the rebalance's end as if no reclaim were coming. This process's
        scale backs read them as the nodes' marks (:meth:`_marks`); another process (the
        node-added reconcile) knows the reclaim once the node's mark is written."""
        with self._retrying_lock:
            for notice, outcome in outcomes:
                if notice.kind is NoticeKind.REBALANCE:
                    continue
                if outcome is Outcome.RETRY:
                    self._retrying[notice.event_id] = notice
                else:
                    self._retrying.pop(notice.event_id, None)

    def _marks(self, snap: Snapshot, now: float) -> dict[str, NodeNotice]:
        """The nodes' marks as read, with the reclaim notices this process still retries
        (those past their reclaim are forgotten)."""
        config = self.config
        with self._retrying_lock:
            for key, notice in list(self._retrying.items()):
                if interruption.verdict_of(notice, config, now)[0] is not Verdict.DOOMED:
                    del self._retrying[key]
            retrying = list(self._retrying.values())
        if not retrying:
            return snap.node_notices
        marks = dict(snap.node_notices)
        nodes = interruption.match_nodes(retrying, snap.node_views)
        for notice in retrying:
            node = nodes.get(notice.instance_id)
            if node is None:
                continue
            mark = interruption.node_notice(notice, config, now)
            old = marks.get(node)
            if old is None or not interruption.mark_stands(old, mark, now):
                marks[node] = mark
        return marks

    def _carry_out(self, batch: Batch, pool: ThreadPoolExecutor) -> None:
        """Write a plan: the temporary budgets first (a drainer acting at the notice then meets
        them before its first eviction), then the taints and the surges. The Events come
        after (:meth:`_tell`): they are best effort, and must not delay a surge."""
        plan = batch.plan
        # Queued first, so the workers take them first.
        budgets = [pool.submit(self._budget, s, batch) for s in plan.surges if s.budget is not None]
        done = {t.node for t in batch.marked}  # carried out ahead of the plan (:class:`_Marking`)
        taints = [pool.submit(self._taint, s, batch) for s in plan.taints if s.node not in done]
        # The surges wait for the taints (one round trip): a surge pod created while its
        # doomed node is still untainted (a taint write in its retry backoff) can be bound
        # there and die with the node. A taint that failed does not hold the surge back.
        for f in taints:
            f.result()
        surges = [pool.submit(self._surge, s, batch) for s in plan.surges]
        for f in (*budgets, *surges):
            f.result()

    def _tell(self, batch: Batch, pool: ThreadPoolExecutor) -> None:
        """The Events and quorum warnings of a plan (best effort, after every write)."""
        plan, snap = batch.plan, batch.snap
        new_taints = {t.node for t in (*batch.marked, *plan.taints)}
        for w in plan.warnings:
            if new_taints & set(w.nodes):
                pool.submit(self._warn_quorum, w, snap)
        list(pool.map(lambda e: self.kube.create_event(*e, best_effort=True), batch.events))

    def _tell_later(self, batch: Batch) -> None:
        """:meth:`_tell` on a pool of its own that outlives the handling (best effort: in a
        process that stops meanwhile, they are lost, as a failed Event is)."""
        with self._background_lock:
            if self._background is None:
                self._background = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="events")
            self._background.submit(self._tell_in_background, batch)

    def _tell_in_background(self, batch: Batch) -> None:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            self._tell(batch, pool)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for the Events posted in the background (tests; a process about to stop)."""
        with self._background_lock:
            background, self._background = self._background, None
        if background is not None:
            done = threading.Event()
            background.submit(done.set)
            done.wait(timeout)
            background.shutdown(wait=False)

    def reconcile(
        self, snap: Snapshot | None = None, *, looked: bool = False, hurry: Callable[[], bool] | None = None
    ) -> None:
        """Finish what a handling left half-done, scale back the surges that are over, drain
        (where configured), untaint the nodes that survived, and keep the ledger.

        Half-done handling: a node tainted for a notice that is still pending (its record
        on the node, ``spotguard.io/notice``) whose workloads lack their surge, budget or
        autoscaler minimum gets them now: the notice is planned again, which only adds
        what the objects do not record yet.

        ``snap``: a snapshot the caller just read (the node-added pass shares its own),
        instead of reading the cluster again. ``looked``: the caller found something to
        reconcile (:meth:`anything_to_reconcile`) just before. ``hurry``: True when notices
        wait for this reconcile (:class:`dispatch.Serialized`): it then stops before its
        upkeep (the half-done handlings it found are still carried out), and the next one
        does it; a reconcile under hung requests held a notice 13 s.
        """
        if snap is None:
            if not looked and not self.anything_to_reconcile():
                return
            with _gc_paused():
                snap = self.snapshot()
        elif not anything_to_reconcile(snap):
            return
        now = self.clock()
        pending = self._pending_notices(snap, now)
        drained = self._drains(snap, now)
        resolved = drains.resolved(drained, snap.node_views)
        pending += drained
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            batch = Batch(pending, snap, resolved, self._plan(pending, snap, resolved, now), Failures())
            if pending:
                self._carry_out(batch, pool)
                self._tell(batch, pool)
            if hurry is not None and hurry():
                metrics.HURRIED.inc()
                log.info("notices are waiting: the reconcile stops before its upkeep; the next one does it")
                return
            skip = {s.workload.key for s in batch.plan.surges if s.write_workload}
            self._upkeep(snap, pool, skip=skip, batch=batch)
        self._lifecycle_pass(snap, snap.node_notices, {})

    def _pending_notices(self, snap: Snapshot, now: float) -> list[Notice]:
        """The notices recorded on tainted nodes that still doom them (for the reconcile)."""
        out: list[Notice] = []
        for node in snap.node_views:
            mark = snap.node_notices.get(node.name)
            if mark is None or not interruption.has_interruption_taint(node) or now >= mark.until:
                continue
            out.append(
                Notice(
                    event_id=mark.event_id,
                    kind=mark.kind,
                    instance_id=node.instance_id or node.provider_id.rsplit("/", 1)[-1],
                    time=datetime.fromtimestamp(mark.time, UTC),
                    state=mark.state,
                    action=mark.action,
                    until=datetime.fromtimestamp(mark.until, UTC) if mark.kind in notices_mod.ADVANCE_KINDS else None,
                    lifecycle=mark.lifecycle,
                )
            )
        return out

    def _drains(self, snap: Snapshot, now: float) -> list[Notice]:
        """A ``drain`` notice for each node a node autoscaler drains that holds serving pods of
        managed Deployments (:mod:`spotguard.policy.drains`): their replacements come first."""
        out = drains.notices(
            nodes=snap.node_views,
            pods=snap.pod_views,
            workloads=snap.workload_views,
            marks=snap.node_notices,
            config=self.config,
            now=now,
            workload_key_of=interruption.workload_key_of,
            namespace_annotations=snap.namespaces,
        )
        for notice in out:
            metrics.NOTICES.labels(str(notice.kind), "planned").inc()
            log.info(
                "a node autoscaler drains a node with serving replicas: surging them before it evicts",
                extra={"event_id": notice.event_id, "instance_id": notice.instance_id},
            )
        return out

    def anything_to_reconcile(self) -> bool:
        """A cheap look before reading every pod: a surge record, a budget of ours, a node
        of ours, a ledger entry, a surge copy. It only reads: a served process takes it
        before serializing the reconcile with the handlings (:class:`dispatch.Serialized`)."""
        if self.surge_copy and self.kube.list(r.REPLICASETS, None, label_selector=SURGE_OF):
            return True
        for d in self.kube.list(r.DEPLOYMENTS):
            if SURGE in ((d.get("metadata") or {}).get("annotations") or {}):
                return True
        if any(Budget.from_json(b).ours for b in self.kube.list(r.PODDISRUPTIONBUDGETS)):
            return True
        for n in self.kube.list(r.NODES):
            if notices_mod.NODE_NOTICE in ((n.get("metadata") or {}).get("annotations") or {}):
                return True
            view = NodeView.from_json(n)
            if interruption.has_interruption_taint(view) or drains.autoscaler_drained(view):
                return True
        return bool(ledger.read(self.kube))

    # -- ASG lifecycle hooks ---------------------------------------------------------------

    def _with_hook_timeout(self, notice: Notice) -> Notice:
        """A lifecycle notice's reclaim time from its hook: the global timeout (lifecycle)."""
        if self.hooks is None or notice.lifecycle is None or notice.kind is not NoticeKind.LIFECYCLE:
            return notice
        timeouts = self.hooks.timeouts(notice.lifecycle)
        try:
            return dataclasses.replace(notice, until=notice.time + timedelta(seconds=timeouts.global_))
        except OverflowError:  # a time at the end of the calendar: keep the default
            return notice

    def _lifecycle_pass(self, snap: Snapshot, marks: Mapping[str, NodeNotice], instances: Mapping[str, str]) -> None:
        """Heartbeat every held lifecycle action whose node's surge is not Ready; complete the others."""
        if self.hooks is None:
            return
        held = {
            name: mark.lifecycle
            for name, mark in marks.items()
            if mark.lifecycle is not None and not self.hooks.done(mark.lifecycle)
        }
        if not held:
            return
        config = self.config
        facts: dict[str, evictions.NodeFacts] = {}
        for view in snap.node_views:
            taints = frozenset(t.key for t in view.taints)
            if view.name in marks:
                taints |= {INTERRUPTION_TAINT}  # marked in this pass: going away
            facts[view.name] = evictions.NodeFacts(
                name=view.name,
                spot=config.node_capacity(view.labels) is Capacity.SPOT,
                unschedulable=view.unschedulable,
                taint_keys=taints,
                notice=marks.get(view.name),
            )
        managed: list[tuple[Workload, int]] = []
        for wl in snap.workload_views:
            floor = floors.floor_for(wl, config, snap.namespaces.get(wl.namespace))
            if floor.enabled:
                managed.append((wl, floor.on_demand))
        views = {v.name: v for v in snap.node_views}
        for name, life in sorted(held.items()):
            node_view = views.get(name)
            if node_view is None:
                continue  # the node is gone: so is the instance
            instance = instances.get(name) or node_view.instance_id or node_view.provider_id.rsplit("/", 1)[-1]
            replaced = evictions.node_replaced(
                name,
                workloads=managed,
                pods=snap.pod_views,
                nodes=facts,
                owner_of=_serving_for,
            )
            if replaced:
                self.hooks.complete(life, instance)
            else:
                self.hooks.heartbeat(life, instance)

    # -- reading ---------------------------------------------------------------------------

    def snapshot(self, on_nodes: Callable[[list[Obj]], None] | None = None) -> Snapshot:
        """Read the cluster. ``on_nodes``: called with the nodes as soon as they are read,
        while the other lists are still being read (a handling marks its nodes then)."""
        # The big lists and the namespaces run beside the ordered small ones (the copies
        # among the first of those: read before the workloads).
        before_workloads = functools.partial(read_before_workloads, copies=self.surge_copy)

        def read_nodes(k: kube_mod.Kube) -> list[Obj]:
            items = k.list(r.NODES)
            if on_nodes is not None:
                on_nodes(items)
            return items

        pods, nodes, namespace_list, (budgets, autoscalers, kept, copies, workloads) = self.kube.read_concurrently(
            r.PODS, read_nodes, r.NAMESPACES, before_workloads, page_limit=LIST_PAGE
        )
        namespaces = namespaces_of(namespace_list)
        copies_found = surgecopy.copies_by_key(copies)
        return Snapshot(nodes, pods, workloads, budgets, autoscalers, namespaces, kept, copies=copies_found)

    def _resolve(self, notices: Sequence[Notice], snap: Snapshot) -> tuple[dict[str, str], set[str]]:
        """instance id -> node for the instances no providerID names (asks EC2 once)."""
        by_provider = interruption.match_nodes(notices, snap.node_views)
        unmatched = sorted({n.instance_id for n in notices if n.instance_id not in by_provider})
        if not unmatched or self.ec2 is None:
            return {}, set()
        try:
            names = finder.private_dns_names(self.ec2, unmatched, self.managed_tag)
        except finder.LookupDenied as exc:
            # Not transient: retrying would only fill the dead-letter queue with every
            # other cluster's notices. No node names these instances: not ours.
            metrics.ERRORS.labels("ec2-denied").inc()
            log.warning(
                "EC2 refused DescribeInstances: instances no node names by providerID are taken as another cluster's",
                extra={"error": str(exc), "instance_ids": unmatched},
            )
            return {}, set()
        except finder.LookupFailed as exc:
            metrics.ERRORS.labels("ec2").inc()
            log.warning("could not ask EC2 for the instances' DNS names", extra={"error": str(exc)})
            return {}, set(unmatched)
        return finder.by_dns(names, snap.node_views), set()

    def _plan(self, notices: Sequence[Notice], snap: Snapshot, resolved: dict[str, str], now: float) -> Plan:
        return interruption.plan(
            notices,
            nodes=snap.node_views,
            pods=snap.pod_views,
            workloads=snap.workload_views,
            config=self.config,
            now=now,
            budgets=snap.budget_views,
            autoscalers=snap.autoscaler_views,
            resolved=resolved,
            namespace_annotations=snap.namespaces,
            node_notices=snap.node_notices,
            surge_copy=self.surge_copy,
        )

    # -- writing: taints -----------------------------------------------------------------

    def _taint(self, step: TaintStep, batch: Batch) -> None:
        snap, plan, failures, events_out = batch.snap, batch.plan, batch.failures, batch.events
        node = snap.node(step.node)
        events = plan.node_events.get(step.node, ())
        try:
            for attempt in range(CONFLICT_ATTEMPTS):
                if node is None:
                    return
                try:
                    self.kube.patch(r.NODES, step.node, records.taint_patch(node, step))
                    break
                except (Conflict, Transient) as exc:
                    # A 500 or a timeout may hide a write that happened; the taint and its mark
                    # are the same whoever writes them twice, so read the node and write again
                    # now (the surges wait for this, and a drainer at the notice is held only
                    # for the guard's short grace until the mark is there), not at the notice's
                    # redelivery seconds later.
                    if isinstance(exc, Transient):
                        if attempt == CONFLICT_ATTEMPTS - 1:
                            raise
                        time.sleep(TAINT_RETRY_SECONDS * (attempt + 1))
                    node = self.kube.find(r.NODES, step.node)
                    if node is not None and _marked(node, step):
                        return
            else:
                raise Conflict(409, "Conflict", f"node {step.node} kept changing")
        except NotFound:
            return
        except ApiError as exc:
            self._failed("taint", exc=exc, failures=failures, nodes=[step.node], event_ids=events)
            return
        metrics.TAINTS.inc()
        reason = next((x.reason for x in plan.notices if x.node == step.node), "")
        log.info("node tainted", extra={"event_id": step.event_id, "event_ids": list(events), "node": step.node})
        events_out.append(
            (
                node,
                NODE_EVENT_REASONS.get(step.kind, "SpotInterruption"),
                records.taint_message(step, reason),
                "Warning",
            )
        )

    # -- writing: surges -----------------------------------------------------------------

    def _budget(self, step: SurgeStep, batch: Batch) -> None:
        """The temporary budget, before anything else of the plan is written."""
        wl = step.workload
        raw = batch.snap.workloads.get(wl.key)
        if raw is None or step.budget is None:
            return
        try:
            body = records.budget_object(raw, step.budget, step.record)
            at_once(functools.partial(self.kube.create, r.PODDISRUPTIONBUDGETS, body, wl.namespace))
            log.info(
                "temporary budget created",
                extra={"workload": wl.key, "budget": step.budget.name, "min_available": step.budget.min_available},
            )
        except AlreadyExists:
            pass
        except NotFound:
            return
        except ApiError as exc:
            nodes = sorted(set(step.record.nodes) & set(batch.plan.node_events))
            self._failed(
                "budget", exc=exc, failures=batch.failures, nodes=nodes, event_ids=step.record.events, workload=wl.key
            )

    def _raise_autoscaler(self, namespace: str, step: interruption.AutoscalerStep, hpa: Autoscaler | None) -> None:
        """Raise the autoscaler's limits, guarded by its resourceVersion; on a conflict (its
        status, or the user) re-read it and raise from what it holds then."""
        rv = hpa.resource_version if hpa is not None else ""
        want_min, want_max = step.min_replicas, step.max_replicas
        for _ in range(CONFLICT_ATTEMPTS):
            # The values set, on the autoscaler too (in the same write): a raise that fails
            # after its record was written leaves an earlier value of ours, known as ours.
            body: Obj = {
                "spec": {"minReplicas": want_min, "maxReplicas": want_max},
                "metadata": {
                    "annotations": {interruption.HPA_SET_MIN: str(want_min), interruption.HPA_SET_MAX: str(want_max),
                                    interruption.HPA_RESTORED: None}
                },
            }
            if rv:
                body["metadata"]["resourceVersion"] = rv
            try:
                self.kube.patch(r.HPAS, step.name, body, namespace)
                return
            except Conflict:
                fresh = Autoscaler.from_json(self.kube.get(r.HPAS, step.name, namespace))
                if step.surge and fresh.restored == step.surge:
                    return  # this surge's end put the limits back meanwhile: not raised again
                rv = fresh.resource_version
                want_min = max(fresh.min_replicas, step.min_replicas)
                want_max = max(fresh.max_replicas, want_min)
        raise Transient(409, "Conflict", f"autoscaler {namespace}/{step.name} kept changing")

    def _restore_autoscaler(self, namespace: str, step: unwind.RestoreAutoscaler, hpa: Autoscaler | None) -> bool:
        """Put the autoscaler's limits back where they still hold spotguard's values."""
        rv = hpa.resource_version if hpa is not None else ""
        want_min, want_max = step.min_replicas, step.max_replicas
        for _ in range(CONFLICT_ATTEMPTS):
            spec: Obj = {}
            if want_min is not None:
                spec["minReplicas"] = want_min
            if want_max is not None:
                spec["maxReplicas"] = want_max
            if not spec:
                return True
            body: Obj = {
                "spec": spec,
                "metadata": {"annotations": {interruption.HPA_SET_MIN: None, interruption.HPA_SET_MAX: None,
                                             interruption.HPA_RESTORED: interruption.restore_key(step.record)}},
            }
            if rv:
                body["metadata"]["resourceVersion"] = rv
            try:
                self.kube.patch(r.HPAS, step.record.hpa, body, namespace)
                return True
            except Conflict:
                fresh = Autoscaler.from_json(self.kube.get(r.HPAS, step.record.hpa, namespace))
                rv = fresh.resource_version
                want_min, want_max = unwind.limits_after_conflict(step.record, fresh, want_min, want_max)
        return False

    def _surge(self, step: SurgeStep, batch: Batch) -> None:
        snap, failures = batch.snap, batch.failures
        wl = step.workload
        raw = snap.workloads.get(wl.key)
        batch_nodes = sorted(set(step.record.nodes) & set(batch.plan.node_events))
        try:
            if raw is None:
                return
            copied = self.surge_copy and wl.kind is Kind.DEPLOYMENT
            if step.write_workload:
                write = self._write_copy_surge if copied else self._write_surge
                written, raw = write(step, raw, batch)
                if written is None:
                    return  # read again, the workload wants no surge now: nothing was written
                step = written
                batch.records[wl.key] = step.record
                wl = step.workload
            elif copied:
                self._copy(wl, step.record, raw, batch, retry=True)
            if step.autoscaler is not None:
                a = step.autoscaler
                hpa = next((h for h in snap.autoscaler_views if h.namespace == wl.namespace and h.name == a.name), None)
                self._raise_autoscaler(wl.namespace, a, hpa)
                log.info(
                    "autoscaler minimum raised for the surge",
                    extra={
                        "workload": wl.key,
                        "hpa": a.name,
                        "min_replicas": a.min_replicas,
                        "event_ids": list(step.record.events),
                    },
                )
        except NotFound:
            return  # the workload (or its autoscaler) is gone: nothing to protect
        except ApiError as exc:
            self._failed(
                "surge", exc=exc, failures=failures, nodes=batch_nodes, event_ids=step.record.events, workload=wl.key
            )

    def _write_surge(self, step: SurgeStep, raw: Obj, batch: Batch) -> tuple[SurgeStep | None, Obj]:
        """The replica surge: ``spec.replicas`` and the record in one patch of the workload,
        guarded by its resourceVersion (a conflict: read again, plan again)."""
        snap, notices, resolved = batch.snap, batch.notices, batch.resolved
        wl = step.workload
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                patch = records.surge_patch(raw, step.record, None if self.surge_copy else step.replicas)
                at_once(functools.partial(self.kube.patch, r.DEPLOYMENTS, wl.name, patch, wl.namespace))
                break
            except Conflict:
                # Someone else wrote the workload (its controller's status, the user, another
                # instance of this function, or this write, made though its answer was lost):
                # re-read it and plan this workload again.
                raw = self.kube.get(r.DEPLOYMENTS, wl.name, wl.namespace)
                raw.setdefault("kind", "Deployment")
                again = self._replan_one(raw, snap, notices, resolved)
                if again is None or not again.write_workload:
                    # None: not one surge step now (opted out meanwhile); else the record the
                    # workload holds already. Never the planned record, which was not written.
                    return again, raw
                step = again
        else:
            raise Conflict(409, "Conflict", f"{wl.key} kept changing")
        return self._surge_written(step, raw, batch)

    def _write_copy_surge(self, step: SurgeStep, raw: Obj, batch: Batch) -> tuple[SurgeStep | None, Obj]:
        """A copy's surge: the copy made or resized with its record (``surgecopy.RECORD``) in one
        write, conditional (a create, or a merge patch guarded by the copy's resourceVersion); the
        Deployment is not written. On a conflict (another pass wrote the copy meanwhile) the
        copy and the Deployment are read again and the workload planned again on the copy's
        record. A Deployment that cannot be copied keeps its record on itself (no surge)."""
        snap, notices, resolved = batch.snap, batch.notices, batch.resolved
        current = fresh = batch.copy_of(step.workload.key)
        for _ in range(CONFLICT_ATTEMPTS):
            wl = step.workload
            try:
                if not self._put_copy(wl, step.record, raw, current, batch, grow_only=current is not fresh):
                    return self._write_surge(step, raw, batch)
                break
            except (Conflict, AlreadyExists, NotFound):
                # Another pass (another instance of this function, or node-added's reconcile)
                # wrote the copy since this one read it, or deleted it (a surge's end): plan
                # again on the copy as it is now (NotFound from the Deployment's read: it is gone).
                current = self._get_copy(wl)
                raw = self.kube.get(r.DEPLOYMENTS, wl.name, wl.namespace)
                raw.setdefault("kind", "Deployment")
                again = self._replan_one(raw, snap, notices, resolved, copy=current)
                if again is None or not again.write_workload:
                    if again is not None:  # the copy holds the record already: its size step
                        w, rec = again.workload, again.record
                        self._copy(w, rec, raw, batch, retry=True, current=current, grow_only=True)
                    return again, raw
                step = again
        else:
            raise Conflict(409, "Conflict", f"the surge copy of {step.workload.key} kept changing")
        return self._surge_written(step, raw, batch)

    def _get_copy(self, wl: Workload) -> Obj | None:
        try:
            return self.kube.get(r.REPLICASETS, surge_copy_name(wl.name), wl.namespace)
        except NotFound:
            return None

    def _surge_written(self, step: SurgeStep, raw: Obj, batch: Batch) -> tuple[SurgeStep | None, Obj]:
        """Count, log and tell a surge written (its record at least)."""
        notices, events_out = batch.notices, batch.events
        wl = step.workload
        if step.added <= 0:
            log.info(
                "surge record updated",
                extra={"workload": wl.key, "event_ids": list(step.new_events), "nodes": list(step.record.nodes)},
            )
            return step, raw
        now = self.clock()
        metrics.SURGES.labels("workloads").inc()
        metrics.SURGES.labels("replicas").inc(step.added)
        ours = [n for n in notices if n.event_id in step.new_events]
        for n in ours:
            metrics.NOTICE_TO_SURGE.observe(max(0.0, now - _epoch(n.time)))
        log.info(
            "surge written",
            extra={
                "workload": wl.key,
                "event_ids": list(step.new_events),
                "from_replicas": wl.replicas,
                "to_replicas": step.replicas,
                "nodes": list(step.new_nodes),
            },
        )
        events_out.append((raw, "SpotInterruptionSurge", records.surge_message(step), "Normal"))
        return step, raw

    def _replan_one(
        self,
        raw: Obj,
        snap: Snapshot,
        notices: Sequence[Notice],
        resolved: dict[str, str],
        copy: Obj | None = None,
    ) -> SurgeStep | None:
        # The record as in the snapshot: the copy's (``copy``, as read again); else, where the
        # workload was replaced, the ledger's stands in (else a fresh surge takes the
        # autoscaler's raised minimum for its original and leaves it raised for good).
        own = Workload.from_json(raw)
        if self.surge_copy and own.kind is Kind.DEPLOYMENT:
            own = surgecopy.with_record(own, None if copy is None else surgecopy.record_of(copy))
        wl = _with_ledger(own, snap.ledger)
        plan = interruption.plan(
            notices,
            nodes=snap.node_views,
            pods=snap.pod_views,
            workloads=[wl],
            config=self.config,
            now=self.clock(),
            budgets=snap.budget_views,
            autoscalers=snap.autoscaler_views,
            resolved=resolved,
            namespace_annotations=snap.namespaces,
            surge_copy=self.surge_copy,
        )
        return next((s for s in plan.surges if s.workload.key == wl.key), None)

    def _warn_quorum(self, warning: interruption.QuorumWarning, snap: Snapshot) -> None:
        raw = snap.workloads.get(warning.workload.key)
        log.warning("quorum at risk", extra={"workload": warning.workload.key, "nodes": list(warning.nodes)})
        if raw is not None:
            self.kube.create_event(raw, "QuorumAtRisk", warning.message, "Warning", best_effort=True)

    # -- scaling back --------------------------------------------------------------------

    def _upkeep(self, snap: Snapshot, pool: ThreadPoolExecutor, skip: set[str], batch: Batch) -> None:
        """After a plan (or alone, on schedule): scale back what is over, drain, untaint, keep the ledger."""
        now = self.clock()
        config = self.config
        batch.marks = self._marks(snap, now)
        views = [w for w in snap.workload_views if w.key not in skip]
        done, waiting = interruption.finish(
            workloads=views,
            pods=snap.pod_views,
            nodes=snap.node_views,
            now=now,
            autoscalers=snap.autoscaler_views,
            marks=batch.marks,
            surge_copy=self.surge_copy,
        )
        if not self.ends_rebalance_surges:
            alive = snap.node_names
            kept = []
            for f in done:
                if interruption.rebalance_node_lives(f.record, alive):
                    log.debug(
                        "a rebalance's surge: its end is the spot-interruption function's",
                        extra={"workload": f.workload.key},
                    )
                else:
                    kept.append(f)
            done = kept
        for w in waiting:
            log.debug("surge in progress", extra={"workload": w.workload.key, "reason": w.reason})
        list(pool.map(lambda f: self._finish(f, snap, batch), done))
        if self.surge_copy:
            # The surges of this pass's plan had their copy's step with their surge (_surge).
            stepped = {s.workload.key for s in batch.plan.surges}
            self._copies(snap, pool, views, skip | stepped | {f.workload.key for f in done}, batch)
        if config.drain:
            evictions = interruption.evictions(
                workloads=[w for w in views if w.key not in {f.workload.key for f in done}],
                pods=snap.pod_views,
                nodes=snap.node_views,
                now=now,
                marks=batch.marks,
            )
            list(pool.map(self._evict, evictions))
        self._untaint_survivors(snap, pool, now, batch.marks)
        self._sweep_budgets(snap, pool)
        self._keep_ledger(snap, batch)
        self._gauges(snap, now, config, batch)

    # -- the surge copy -----------------------------------------------------------------------

    def _copies(
        self, snap: Snapshot, pool: ThreadPoolExecutor, views: Sequence[Workload], skip: set[str], batch: Batch
    ) -> None:
        """Each surge in progress: its copy's step; each copy without a surge record (left by
        a crash, its Deployment gone): deleted. A copy holding a finished record (kept while a
        doomed node exists) stays at 0: the surge's end deletes it (:meth:`_finish`)."""
        active: set[str] = set(skip)
        jobs: list[Future[Any]] = []
        for wl in views:
            record = SurgeRecord.of(wl)
            raw = snap.workloads.get(wl.key)
            if record is not None and raw is not None:
                active.add(wl.key)
            if wl.key in skip or record is None or record.done or raw is None or wl.kind is not Kind.DEPLOYMENT:
                continue
            jobs.append(pool.submit(self._copy, wl, record, raw, batch))
        for key, rec in batch.records.items():
            if rec is not None:
                active.add(key)
        for key, rs in snap.copies.items():
            if key not in active:
                jobs.append(pool.submit(self._delete_copy, rs, "no surge in progress"))
        for j in jobs:
            j.result()

    def _copy_step(self, wl: Workload, record: SurgeRecord, batch: Batch, current: Obj | None) -> surgecopy.CopyStep:
        """Count what the copy's state machine decides on and ask it."""
        snap = batch.snap
        now = self.clock()
        marks = batch.marks or snap.node_notices
        alive = snap.node_names
        deadlines, last = interruption.node_deadlines(record, marks)
        # A rebalance's node that lives on past its end stays, with its pods; only where this
        # process ends rebalance surges (a reclaim for it may be retried by another process).
        staying = (
            interruption.rebalance_survivors(record, alive, now, marks, deadlines)
            if self.ends_rebalance_surges
            else set()
        )
        facts = surgecopy.facts_for(
            wl,
            record.ready,
            snap.pods_of(wl.key) + snap.copy_pods_of(wl.key),
            doomed=set(record.nodes) - staying,
            live_doomed={n for n, t in deadlines.items() if n in alive and now < t},
            copy_replicas=None if current is None else _replicas(current),
            last_deadline=last,
            now=now,
        )
        return surgecopy.copy_step(facts)

    def _put_copy(
        self, wl: Workload, record: SurgeRecord, raw: Obj, current: Obj | None, batch: Batch, *, grow_only: bool = False
    ) -> bool:
        """Write the copy with ``record`` at the size its step asks for, in one conditional
        write: a create (AlreadyExists where another pass made it), or a merge patch of
        ``current`` guarded by its resourceVersion (Conflict). While its surge is in progress
        a copy that needs no pod stays at 0: it holds the record. False where the Deployment
        cannot be copied (logged). ``grow_only``: ``current`` was read after this pass's pods
        (surgecopy.size_of_found_copy: a stale count never shrinks a copy)."""
        step = self._copy_step(wl, record, batch, current)
        size = _copy_size(step, current, grow_only)
        # A surge whose replicas need no on-demand (they replace pods a node autoscaler only
        # drains) has its copy's pods placed as spot slots (surgecopy.build).
        spot_slots = record.on_demand_surge == 0
        snap = batch.snap
        if current is None:
            key = patches.spot_only_key((n.labels for n in snap.node_views), self.config) if spot_slots else None
            body = surgecopy.build(
                raw, size, self.config, record.events, on_demand=not spot_slots, spot_key=key, record=record
            )
            if isinstance(body, surgecopy.Refusal):
                log.warning("no surge copy", extra={"workload": wl.key, "reason": body.reason})
                return False
            batch.copies[wl.key] = at_once(functools.partial(self.kube.create, r.REPLICASETS, body, wl.namespace))
        else:
            template = None
            if not spot_slots and surgecopy.spot_slots(current):
                # A warning came for a node an autoscaler only drained: the copy's next pods go
                # to on-demand (a reclaim leaves no time for a spot launch that may be refused).
                fresh = surgecopy.build(raw, size, self.config, record.events, record=record)
                if not isinstance(fresh, surgecopy.Refusal):
                    template = fresh["spec"]["template"]
            patch = surgecopy.update_patch(current, size, record, on_demand_template=template)
            name = surge_copy_name(wl.name)
            batch.copies[wl.key] = at_once(functools.partial(self.kube.patch, r.REPLICASETS, name, patch, wl.namespace))
        log.info(
            "surge copy written",
            extra={
                "workload": wl.key,
                "state": str(step.state),
                "replicas": size,
                "reason": step.reason,
                "event_ids": list(record.events),
                "on_demand": template is not None if current is not None else not spot_slots,
            },
        )
        return True

    def _copy(
        self,
        wl: Workload,
        record: SurgeRecord,
        raw: Obj,
        batch: Batch,
        *,
        retry: bool = False,
        current: Obj | None = None,
        grow_only: bool = False,
    ) -> None:
        """A surge in progress whose record is written: its copy's size step. ``retry``: a
        write that fails is raised (a handling: its notices are retried, as for a failed
        surge write), not only logged for the next reconcile. ``current``: the copy as read
        again (else the snapshot's)."""
        if current is None:
            current = batch.copy_of(wl.key)
        # A copy read again (``grow_only``) may hold a newer record than this pass's: only its
        # size is written then.
        on_copy = (wl.annotations.get(surges.ON_COPY) == "true" or grow_only) and current is not None
        try:
            if not on_copy:
                # The record is not on a copy yet (a surge begun before records moved to the
                # copy, or one whose copy was deleted by someone: the ledger's): write it there.
                self._put_copy(wl, record, raw, current, batch, grow_only=grow_only)
                return
            step = self._copy_step(wl, record, batch, current)
            assert current is not None
            # Only the size is written, guarded by the copy's resourceVersion (a record written
            # meanwhile by another pass is never overwritten by this one's).
            size = _copy_size(step, current, grow_only)
            if size == _replicas(current):
                return
            patch = surgecopy.resize(size, resource_version=(current.get("metadata") or {}).get("resourceVersion"))
            name = surge_copy_name(wl.name)
            batch.copies[wl.key] = at_once(functools.partial(self.kube.patch, r.REPLICASETS, name, patch, wl.namespace))
        except AlreadyExists:
            # Made since this pass's read (another pass's surge): read again, grown only.
            if not grow_only and (fresh := self._get_copy(wl)) is not None:
                self._copy(wl, record, raw, batch, retry=retry, current=fresh, grow_only=True)
            return
        except (NotFound, Conflict):
            return  # the copy changed (or went) since this pass's read: the next pass decides again
        except ApiError as exc:
            metrics.ERRORS.labels("copy").inc()
            log.warning("could not write the surge copy", extra={"workload": wl.key, "error": str(exc)})
            if retry:
                raise
            return
        log.info(
            "surge copy",
            extra={
                "workload": wl.key,
                "state": str(step.state),
                "action": str(step.action),
                "replicas": size,
                "reason": step.reason,
            },
        )

    def _delete_copy(self, rs: Obj, reason: str) -> bool:
        """Delete a surge copy (its pods go with it); False where it may still be there."""
        meta = rs.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        try:
            at_once(functools.partial(self.kube.delete, r.REPLICASETS, name, namespace, uid=meta.get("uid")))
        except NotFound:
            return True
        except ApiError as exc:  # a Conflict too: another copy under that name now
            metrics.ERRORS.labels("copy").inc()
            log.warning("could not delete a surge copy", extra={"copy": meta.get("name"), "error": str(exc)})
            return False
        log.info("surge copy deleted", extra={"copy": f"{meta.get('namespace')}/{meta.get('name')}", "reason": reason})
        return True

    def _evict(self, ev: interruption.Eviction) -> None:
        try:
            self.kube.evict(ev.pod, ev.namespace)
            metrics.EVICTIONS.inc()
            log.info(
                "doomed pod evicted: its replacement is Ready",
                extra={"workload": ev.workload, "pod": f"{ev.namespace}/{ev.pod}", "node": ev.node},
            )
        except TooManyRequests as exc:
            why = "refused by a budget or webhook" if exc.refused else "throttled by the API server"
            log.debug(f"eviction {why}; later", extra={"pod": f"{ev.namespace}/{ev.pod}"})
        except NotFound:
            pass
        except ApiError as exc:
            metrics.ERRORS.labels("evict").inc()
            log.warning("could not evict", extra={"pod": f"{ev.namespace}/{ev.pod}", "error": str(exc)})

    def _untaint_survivors(
        self, snap: Snapshot, pool: ThreadPoolExecutor, now: float, marks: Mapping[str, NodeNotice]
    ) -> None:
        """A node that is Ready again past the notice it was tainted for survived it
        (a stop and start, a rebalance recommendation never followed): untaint it. A node
        whose reclaim notice this process still retries has not survived it yet."""
        for node in snap.node_views:
            mark = marks.get(node.name)
            if mark is None or not node.ready or now < mark.until + interruption.STALE_SECONDS:
                continue
            if drains.mark_kept(mark, node):
                continue
            raw = snap.node(node.name)
            if raw is not None:
                pool.submit(self._untaint, raw, mark)

    def _untaint(self, raw: Obj, mark: NodeNotice) -> None:
        name = str((raw.get("metadata") or {}).get("name"))
        try:
            self.kube.patch(r.NODES, name, records.untaint_patch(raw))
        except (Conflict, NotFound):
            return  # changed (a new notice?) or gone: the next reconcile looks again
        except ApiError as exc:
            metrics.ERRORS.labels("untaint").inc()
            log.warning("could not untaint a node", extra={"node": name, "error": str(exc)})
            return
        log.info("node survived its notice: untainted", extra={"node": name, "event_id": mark.event_id})
        self.kube.create_event(
            raw,
            "SpotInterruptionOver",
            f"still Ready after notice {mark.event_id} ({mark.kind}): taint removed",
            "Normal",
            best_effort=True,
        )

    def _keep_ledger(self, snap: Snapshot, batch: Batch) -> None:
        want: dict[str, SurgeRecord | None] = {}
        for w in snap.workload_views:
            want[w.key] = SurgeRecord.of(w)
        want.update(batch.records)
        for key in snap.ledger:
            if key not in snap.workloads:
                want[key] = None  # the workload is gone
        ledger.sync(self.kube, want, snap.ledger)

    def _gauges(self, snap: Snapshot, now: float, config: Config, batch: Batch) -> None:
        """The gauges an operator alerts on, as this handling leaves the records."""
        surging = overdue = 0
        for w in snap.workload_views:
            rec = batch.records[w.key] if w.key in batch.records else SurgeRecord.of(w)
            if rec is None or rec.done:
                continue
            surging += 1
            if interruption.deadline_passed(rec, now, marks=batch.marks):
                overdue += 1
        metrics.SURGING.set(surging)
        metrics.OVERDUE.set(overdue)
        metrics.BELOW_FLOOR.set(_below_floor(snap, config))

    def _finish(self, fin: Finish, snap: Snapshot, batch: Batch) -> None:
        """Carry out the end of a surge that is over (:func:`unwind.steps`), step by step; the
        first that fails stops it there (the next reconcile finishes again)."""
        wl = fin.workload
        raw = snap.workloads.get(wl.key)
        if raw is None:
            return
        try:
            on_workload = SURGE in ((raw.get("metadata") or {}).get("annotations") or {})
            steps = unwind.steps(
                fin, snap.pods_of(wl.key), batch.marks, surge_copy=self.surge_copy, on_workload=on_workload
            )
            for step in steps:
                match step:
                    case unwind.DeleteCopy():
                        # (By name where this snapshot did not list the copies.)
                        stub = {"metadata": {"name": step.name, "namespace": wl.namespace}}
                        done = self._delete_copy(batch.copy_of(wl.key) or stub, step.reason)
                        if done:
                            batch.records[wl.key] = None  # the record went with the copy
                    case unwind.HoldCopy():
                        done = self._hold_copy(wl, step, batch.copy_of(wl.key))
                        batch.records[wl.key] = step.keep
                    case unwind.RankFirstToGo():
                        done = self._annotate_pods(wl, step.changes, "could not rank a pod first to go")
                    case unwind.EndProtection():
                        done = self._annotate_pods(wl, step.changes, "could not end a surge replica's protection")
                    case unwind.RestoreAutoscaler():
                        hpas = snap.autoscaler_views
                        hpa = next((h for h in hpas if h.namespace == wl.namespace and h.name == step.record.hpa), None)
                        done = self._restore_autoscaler(wl.namespace, step, hpa)
                    case unwind.DeleteBudget():
                        with contextlib.suppress(NotFound):
                            self.kube.delete(r.PODDISRUPTIONBUDGETS, step.name, wl.namespace)
                        done = True
                    case unwind.DropLedgerEntry():
                        batch.records[wl.key] = None
                        log.info(
                            "surge over: no record on the workload and it is at its owner's count; "
                            "ledger entry dropped",
                            extra={"workload": wl.key, "event_ids": list(fin.record.events), "replicas": wl.replicas},
                        )
                        return
                    case unwind.WriteBack():
                        written = self._write_back(fin, step, raw, snap, batch)
                        if written is None:
                            return  # not over now, or the workload kept changing: the next reconcile
                        fin, raw = written
                        done = True
                if not done:
                    return  # the next reconcile finishes again
        except NotFound:
            return
        except ApiError as exc:
            metrics.ERRORS.labels("finish").inc()
            log.warning("could not scale back yet", extra={"workload": wl.key, "error": str(exc)})
            return
        if fin.scale:
            metrics.SCALE_BACKS.inc()
            log.info(
                "surge over: scaled back",
                extra={
                    "workload": wl.key,
                    "event_ids": list(fin.record.events),
                    "replicas": fin.replicas,
                    "reason": fin.reason,
                },
            )
            self.kube.create_event(
                raw,
                "SpotInterruptionScaledBack",
                f"scaled back to {fin.replicas} replicas (surge of {fin.record.surge} over: {fin.reason})",
                "Normal",
                best_effort=True,
            )

    def _hold_copy(self, wl: Workload, step: unwind.HoldCopy, current: Obj | None) -> bool:
        """The copy at 0 with the finished record (guarded by its resourceVersion as read). A
        copy gone or changed since: the ledger keeps the record; the next pass decides again."""
        patch: Obj = {
            "spec": {"replicas": 0},
            "metadata": {"annotations": {surgecopy.RECORD: surgecopy.plain(step.keep)}},
        }
        rv = ((current or {}).get("metadata") or {}).get("resourceVersion")
        if rv:
            patch["metadata"]["resourceVersion"] = rv
        try:
            at_once(functools.partial(self.kube.patch, r.REPLICASETS, step.name, patch, wl.namespace))
        except (NotFound, Conflict):
            return True
        log.info("surge over: its copy at 0 keeps the record while a doomed node exists", extra={"workload": wl.key})
        return True

    def _write_back(
        self, fin: Finish, step: unwind.WriteBack, raw: Obj, snap: Snapshot, batch: Batch
    ) -> tuple[Finish, Obj] | None:
        """The end's last write (``spec.replicas`` and the record), guarded by the
        resourceVersion; on a conflict, read again and ask the policy how it ends now
        (:func:`unwind.again`). The end as written and the workload it was written on; None
        where nothing was (not over now, or it kept changing)."""
        wl = fin.workload
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                patch = records.finish_patch(raw, step.replicas, step.keep)
                self.kube.patch(r.DEPLOYMENTS, wl.name, patch, wl.namespace)
                batch.records[wl.key] = step.keep
                return fin, raw
            except Conflict:
                raw = self.kube.get(r.DEPLOYMENTS, wl.name, wl.namespace)
                raw.setdefault("kind", "Deployment")
                fresh = unwind.again(
                    Workload.from_json(raw),
                    fin,
                    pods=snap.pod_views,
                    nodes=snap.node_views,
                    now=self.clock(),
                    marks=batch.marks,
                    surge_copy=self.surge_copy,
                )
                if fresh is None:
                    return None
                fin, step = fresh, unwind.write_back(fresh)
        return None

    def _annotate_pods(
        self, wl: Workload, changes: Sequence[tuple[PodView, Mapping[str, str | None]]], failed: str
    ) -> bool:
        """Merge-patch each pod's annotations (None removes one); a pod gone is skipped. False
        (logged as ``failed``) where one could not be patched: the next reconcile tries again."""
        for p, notes in changes:
            try:
                self.kube.patch(r.PODS, p.name, {"metadata": {"annotations": dict(notes)}}, p.namespace)
            except NotFound:
                continue
            except ApiError as exc:
                metrics.ERRORS.labels("finish").inc()
                log.warning(failed, extra={"workload": wl.key, "error": str(exc)})
                return False
        return True

    def _sweep_budgets(self, snap: Snapshot, pool: ThreadPoolExecutor) -> None:
        """Delete our budgets whose workload has no surge in progress (left by a crash)."""
        active = set()
        for w in snap.workload_views:
            rec = SurgeRecord.of(w)
            if rec is not None and not rec.done and rec.budget:
                active.add((w.namespace, rec.budget))
        now = self.clock()
        for raw, b in zip(snap.budgets, snap.budget_views, strict=True):
            if not b.ours or (b.namespace, b.name) in active:
                continue
            created = _parse_time((raw.get("metadata") or {}).get("creationTimestamp"))
            if created is not None and now - created < ORPHAN_BUDGET_SECONDS:
                continue
            pool.submit(self._delete_budget, b)

    def _delete_budget(self, b: Budget) -> None:
        try:
            self.kube.delete(r.PODDISRUPTIONBUDGETS, b.name, b.namespace)
            log.info("left-over temporary budget deleted", extra={"budget": f"{b.namespace}/{b.name}"})
        except ApiError:
            pass

    # -- helpers ---------------------------------------------------------------------------

    def _failed(
        self,
        step: str,
        *,
        exc: ApiError,
        failures: Failures,
        nodes: Iterable[str],
        event_ids: Iterable[str],
        workload: str = "",
    ) -> None:
        metrics.ERRORS.labels(step).inc()
        permanent = isinstance(exc, Invalid | BadRequest)
        log.warning(
            "write failed" + ("" if permanent else ": the notices will be retried"),
            extra={
                "step": step,
                "workload": workload,
                "nodes": list(nodes),
                "event_ids": list(event_ids),
                "error": str(exc),
            },
        )
        if not permanent:
            failures.nodes.update(nodes)
        failures.count += 1

    def _count(self, notices: Sequence[Notice], outcomes: list[Outcome]) -> list[Outcome]:
        for n, o in zip(notices, outcomes, strict=True):
            metrics.NOTICES.labels(str(n.kind), str(o)).inc()
        return outcomes


def _gc_paused() -> contextlib.AbstractContextManager[None]:
    """Pause the cyclic garbage collector while a snapshot of the cluster is read and planned.

    Reading 20,000 pods allocates millions of objects; each allocation burst would trigger
    full collections over all of them. Reference counting still frees what is dropped.
    The gateway's pause (counted across threads) moves the snapshot to the oldest
    generation when it ends: re-enabled as it was, the collector's first passes during the
    writes walked it all again (0.7 s of CPU with 500 notices over 20,000 pods, every
    request stalled meanwhile).
    """
    return kube_mod.gc_paused()


# The Event on a tainted node, by the kind of its notice.
NODE_EVENT_REASONS = {NoticeKind.REBALANCE: "RebalanceRecommendation", NoticeKind.DRAIN: "AutoscalerDrain"}


def anything_to_reconcile(snap: Snapshot) -> bool:
    """What :meth:`Handler.anything_to_reconcile` looks for, in a snapshot already read."""
    if any(SURGE in w.annotations for w in snap.workload_views) or any(b.ours for b in snap.budget_views):
        return True
    if snap.node_notices or any(
        interruption.has_interruption_taint(n) or drains.autoscaler_drained(n) for n in snap.node_views
    ):
        return True
    return bool(snap.ledger) or bool(snap.copies)


def _replicas(obj: Obj) -> int:
    return int((obj.get("spec") or {}).get("replicas") or 0)


def _copy_size(step: surgecopy.CopyStep, current: Obj | None, grow_only: bool) -> int:
    """The copy's size for its step while its surge is in progress: at 0 where it needs no
    pod (it stays: it holds the record; the surge's end deletes it). ``grow_only``: never
    below ``current``'s (surgecopy.size_of_found_copy)."""
    keeps = (surgecopy.Action.CREATE, surgecopy.Action.RESIZE, surgecopy.Action.KEEP)
    size = step.replicas if step.action in keeps else 0
    if grow_only and current is not None:
        found = _replicas(current)
        grown = surgecopy.size_of_found_copy(size, found)
        return found if grown is None else grown
    return size


def _serving_for(pod: PodView) -> str | None:
    """The workload a pod serves: its own, or the Deployment its surge copy stands in for
    (``interruption.copy_workload_key``, as the eviction guard counts them). Without the
    copy's pods a lifecycle action was held until its global timeout in copy mode: the
    Deployment's own replacements come only once the doomed pods go with the instance."""
    return interruption.workload_key_of(pod) or interruption.copy_workload_key(pod)


def _marked(node: Obj, step: TaintStep) -> bool:
    """The node carries our taint and the step's notice already (another writer was first)."""
    if not interruption.has_interruption_taint(NodeView.from_json(node)):
        return False
    mark = NodeNotice.parse(((node.get("metadata") or {}).get("annotations") or {}).get(notices_mod.NODE_NOTICE))
    return step.notice is None or (mark is not None and mark.until <= step.notice.until)


def _ids(notices: Iterable[Notice]) -> list[str]:
    out: list[str] = []
    for n in notices:
        if n.event_id not in out:
            out.append(n.event_id)
    return out[:50]


def _epoch(t: datetime) -> float:
    return t.timestamp()


def _parse_time(text: Any) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _below_floor(snap: Snapshot, config: Config) -> int:
    """Workloads with fewer Ready pods on on-demand nodes than their floor (without a surge)."""
    capacity = {n.name: config.node_capacity(n.labels) for n in snap.node_views}
    on_demand: dict[str, int] = {}
    for p in snap.pod_views:
        if not (p.active and p.ready) or capacity.get(p.node_name) is not Capacity.ON_DEMAND:
            continue
        key = interruption.workload_key_of(p)
        if key is not None:
            on_demand[key] = on_demand.get(key, 0) + 1
    count = 0
    for w in snap.workload_views:
        floor = floors.floor_for(w, config, snap.namespaces.get(w.namespace))
        if floor.enabled and w.replicas > 0 and on_demand.get(w.key, 0) < floor.on_demand - floor.surge:
            count += 1
    return count


def _load_config(k: kube_mod.Kube) -> Config:
    """spotguard's settings: the environment, then the spotguard-config ConfigMap."""
    from spotguard.gateway import settings

    cfg, _problems = settings.load(k)  # settings logs its problems once
    return cfg


__all__ = ["Handler", "Outcome", "Snapshot"]
