"""Exact on-demand slot counting for Deployment pods, across processes and invocations.

The problem: a ReplicaSet creates hundreds of pods in slow-start batches,
several webhook instances (gunicorn workers, Knative pods, Lambda
invocations) admit them in parallel, and the pods do not exist yet when they
are admitted (``generateName``: no name either). The on-demand slots handed
out must equal the floor, even when a pod is refused after spotguard admitted
it, the API server is slow, or the instances' clocks disagree.

The design: one Lease per ReplicaSet, in spotguard's namespace, holds the
on-demand *reservations* handed out. Every on-demand decision is a
conditional write of that Lease (``resourceVersion``: a lost race answers 409
Conflict, and the loser re-reads and decides again), so on-demand decisions
are serialised cluster-wide. The Lease ``admission.<namespace>.<replicaset>``
(or ``admission.<sha256>`` when that name would be too long) carries, in the
annotation ``spotguard.io/reservations``::

    {"v": 2, "seq": 17, "pending": {"<request uid>": 16, ...}}   # token -> sequence

and ``spotguard.io/replicaset-uid`` (a ReplicaSet re-created under the same
name starts from scratch). The patch writes the token into the pod's
``spotguard.io/reservation`` annotation.

No wall-clock time is compared between instances: every age below is a local
``time.monotonic()`` duration measured by the instance that uses it, and the
only shared order is the sequence number (which reservation is older).

* Each instance counts the ReplicaSet's pods itself (a LIST, with the Lease
  read at the same time) and trusts its own count for ``trust_seconds``.
  Slots held = on-demand pods in the count + reservations whose pod the count
  does not show. A pod is classified by its node's capacity once scheduled,
  else by its ``spotguard.io/placement`` label.
* A reservation whose pod the count shows is kept in the Lease until that
  sighting is older than ``trust_seconds`` + 1 s: by then every instance's
  trusted count was made after the pod existed, so removing it loses no slot.
* A reservation whose pod has not appeared is *young* until this instance has
  known it for ``pending_grace`` seconds. A spot decision that depends on
  young reservations (the floor is met only by counting them) waits for them:
  it lists again until their pods appear (the usual case: a few
  milliseconds) or the grace has passed without them. A pod refused after its
  reservation (a later webhook, a ResourceQuota, a policy engine) is retried
  by the ReplicaSet controller within milliseconds; that retry finds the dead
  reservation, waits out its grace, and takes the slot. A pod that takes
  longer than the grace to be stored after its admission answer (a very slow
  API server) costs at most one extra replica on on-demand.
* Bound: the ReplicaSet never has more pods than its Deployment's replicas, so
  a fresh count whose pods plus unseen reservations plus this pod exceed the
  replicas proves that many unseen reservations dead; the oldest go.
* ``reservation_ttl_seconds`` is a backstop for reservations no count ever
  decides on; it is raised to cover the other timings (:meth:`Reservations.ttl`).

Replica numbers (``spotguard.policy.ranks``, the ranked deletion costs): an
on-demand reservation also records its pod's number (``nums``: token ->
number). Under a percentage floor a spot pod's number is recorded too, under
``spot:<uid>`` (no on-demand slot: left out of the slots held and of the
known pods); the reviews of one round (group commit, below) each get their
own, recorded in the round's one write. A number is held by a counted pod's
cost, or by a live reservation whose pod this instance has never seen.

A stale workload: the Deployment is cached for 2 s (``Resolver``), and a change
that creates pods (the interruption handler's surge; a scale under a
percentage floor) can land inside that window. The pods known to this
instance (its count's active pods, the unseen reservations and its own spot
admissions since the count) plus this pod exceeding the cached ``spec.replicas``
is evidence the copy is stale: ``refresh()`` reads it again. If the fresh copy
(or a workload read for this very review) does not cover the pods either,
the known number is too high (pods deleted since the count, or reservations
never created): the count is redone, dead
reservations found by the bound are dropped, and the rule is held off for
``stale_hold`` seconds for that ReplicaSet.

Group commit: inside one process the reviews of one ReplicaSet queue up and the
one at the head (the leader) decides for every review queued, in order, each on
what the ones before it took, and writes all their new reservations in one
conditional Lease write; nobody is answered before that write has landed (a
lost race: the round is decided again). A burst of N on-demand pods costs one
round trip, not N one after the other (on a slow API server the later ones ran
out of time).

Out of time: a review the API server leaves no time to finish (its write, its count,
its turn) is answered on what this instance knows rather than let through with no
placement (``_from_known``, ``_out_of_time``; ``Claim.degraded`` says how). On-demand
is the safe side: such a slot goes without a reservation, counted here (``Local.unreserved``)
until the next count shows its pod, so another instance may put one replica too many on
on-demand, never one too few.

API cost, warm: 0 requests for a spot pod while the count is trusted and no
young reservation decides it, 1 write for the on-demand pods of one round
(plus a GET after a lost race), a LIST + GET per ReplicaSet per trust window per instance, and a
LIST while a spot decision waits on a young reservation. dryRun reads and
never writes or waits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from spotguard.admission import deadline, metrics
from spotguard.admission.resolve import Resolved, Resolver, label_selector
from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.policy import placement
from spotguard.policy.config import Config
from spotguard.policy.placement import Decision, Placement
from spotguard.policy.ranks import Ranks, number_of
from spotguard.policy.views import PodView

log = logging.getLogger(__name__)
_JITTER = random.Random()  # our own: the global generator is the application's (and its tests') to seed

ANNOTATION = "spotguard.io/reservations"
RS_UID_ANNOTATION = "spotguard.io/replicaset-uid"
RS_ANNOTATION = "spotguard.io/replicaset"
POD_ANNOTATION = "spotguard.io/reservation"
HOLDER = "spotguard-admission"
MAX_NAME = 253
SEEN_MARGIN = 1.0  # seconds beyond the trust window before a seen reservation is removed
# seconds past its deadline a review waits for the round ahead of it (of the 15 % of the
# caller's timeout kept for the answer, deadline.CALLER_SHARE)
LATE_GRACE = 0.25
LIST_RESERVE = 0.3  # seconds a review keeps for its answer when it stops waiting on young reservations
Obj = dict[str, Any]


# what the API server not answering in time looks like to a call
UNANSWERED: tuple[type[BaseException], ...] = (deadline.DeadlineExceeded, kube_mod.Transient, kube_mod.TooManyRequests)


@dataclass
class Doc:
    """The reservations of one ReplicaSet as the Lease holds them."""

    seq: int = 0
    pending: dict[str, int] = field(default_factory=dict)  # token -> sequence number
    nums: dict[str, int] = field(default_factory=dict)  # token -> replica number (policy.ranks)

    def to_json(self) -> str:
        doc: dict[str, Any] = {"v": 2, "seq": self.seq, "pending": self.pending}
        nums = {t: n for t, n in self.nums.items() if t in self.pending}
        if nums:
            doc["nums"] = nums
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any] | None, rs_uid: str) -> Doc:
        if not lease:
            return cls()
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        if annotations.get(RS_UID_ANNOTATION, rs_uid) != rs_uid:
            return cls()
        try:
            doc = json.loads(annotations.get(ANNOTATION) or "{}")
            raw = doc.get("pending") or {}
            if doc.get("v", 1) == 1:  # written by an older version: [made, expires] per token
                return cls(seq=len(raw), pending={str(t): 0 for t in raw})
            return cls(
                seq=int(doc.get("seq") or 0),
                pending={str(t): int(v) for t, v in raw.items()},
                nums={str(t): int(v) for t, v in (doc.get("nums") or {}).items()},
            )
        except (ValueError, TypeError, AttributeError):
            log.warning("unreadable reservation lease; starting afresh", extra={"lease": _name_of(lease)})
            return cls()


@dataclass(frozen=True)
class Count:
    """One instance's count of a ReplicaSet's pods."""

    started: float  # time.monotonic() when the LIST was sent
    on_demand: frozenset[str]  # active pods on on-demand (by node, else by label)
    seen: frozenset[str]  # reservation tokens that listed pods carry
    pods: int  # active pods
    surge_created: tuple[float, ...] = ()  # creation times of the on-demand surge replicas
    numbers: frozenset[int] = frozenset()  # replica numbers the active pods hold (policy.ranks)


@dataclass
class Local:
    """What this instance knows of one ReplicaSet."""

    lease: Obj | None = None
    lease_read: bool = False
    count: Count | None = None
    first_seen: dict[str, float] = field(default_factory=dict)  # token -> when this instance first knew it
    seen_at: dict[str, float] = field(default_factory=dict)  # token -> when a count of ours first showed its pod
    dead: set[str] = field(default_factory=set)  # unseen tokens proven dead (bound, grace, ttl)
    spot: int = 0  # spot admissions of this instance since its count
    # on-demand admissions of this instance since its count answered without a reservation
    # (no time was left for the Lease write), and how many of them were surge slots
    unreserved: int = 0
    unreserved_surge: int = 0
    refuted: float = -1e18  # when a re-read last showed no newer scale
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the leader (and a warm-up)
    turn: threading.Condition = field(default_factory=threading.Condition)  # guards the queue below
    queue: list[Waiter] = field(default_factory=list)  # reviews waiting for a decision, oldest first
    leading: bool = False  # a review of this process is deciding for the queue
    recount_at: float | None = None  # count again then: a spot answer waits for young reservations


@dataclass(eq=False)
class Waiter:
    """One review waiting for its ReplicaSet's decision (see :meth:`Reservations.claim`)."""

    floor: int
    token: str
    decide: Decide
    dry_run: bool
    replicas: int | None
    refresh: Refresh | None
    ranks: Ranks | None
    began: float
    deadline: deadline.Deadline | None
    grow: Grow | None = None
    grown: bool = False  # decided on its workload grown to the pods known (``_grow``)
    refreshed: bool = False
    pause: float = 0.02  # the next wait for young reservations (doubling up to 0.2 s)
    lead: bool = False  # this review decides for the queue
    done: bool = False
    gone: bool = False  # left the queue (answered, or gave up)
    claim: Claim | None = None
    error: BaseException | None = None

    def remaining(self, default: float = 1e9) -> float:
        return default if self.deadline is None else self.deadline.remaining()

    def outcome(self) -> Claim:
        if self.error is not None:
            raise self.error
        if self.claim is None:
            raise deadline.DeadlineExceeded("no decision before the review's deadline")
        return self.claim


@dataclass(frozen=True)
class Claim:
    decision: Decision
    held: int
    token: str | None = None  # set when a slot was recorded under this token
    refreshed: bool = False  # the workload was read again (the cached one was older than this pod)
    number: int | None = None  # the pod's replica number (policy.ranks); None: not ranked
    # why the answer was given without its reservation confirmed ("" when it was written):
    # "unreserved" (no time left to write it), "unconfirmed" (the write did not come back in time)
    degraded: tuple[str, ...] = ()


# ``decide(held, surge_created, reserved_surge)``: the decision given the on-demand slots
# held (pods counted plus unseen reservations), the creation times of the counted surge
# replicas, and how many unseen reservations are surge slots.
Decide = Callable[[int, tuple[float, ...], int], Decision]
# ``refresh()`` reads the workload again, bypassing the cache, and returns its
# replicas and the decision function for its new floor.
Refresh = Callable[[], tuple[int, Decide]]
# ``grow(replicas)``: the decision function on the workload as known, grown to ``replicas``
# (the pods known prove at least that many and the workload could not be read in time).
Grow = Callable[[int], Decide]
SURGE_TOKEN = "surge:"  # a surge slot's reservation token starts with this
# A spot slot's reservation token starts with this: recorded only for its replica number
# (a percentage floor's spot pods each need their own), it holds no on-demand slot.
SPOT_TOKEN = "spot:"


def _write_reserve(kube: Any) -> float:
    """The time a Lease write needs left (the API server's current pace, see ``DeadlineKube``)."""
    reserve = getattr(kube, "write_reserve", None)
    return float(reserve()) if callable(reserve) else deadline.WRITE_RESERVE


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def lease_name(namespace: str, replicaset: str) -> str:
    name = f"admission.{namespace}.{replicaset}"
    if len(name) <= MAX_NAME:
        return name
    return "admission." + hashlib.sha256(f"{namespace}/{replicaset}".encode()).hexdigest()[:40]


def _name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


class Reservations:
    def __init__(
        self,
        kube: Any,
        resolver: Resolver,
        namespace: str,
        *,
        trust_seconds: float = 3.0,
        pending_grace: float = 1.0,
        review_seconds: float = 2.0,
        stale_hold: float = 0.5,
        pool: futures.Executor | None = None,  # for the Lease read beside a LIST: only ever runs _read
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.resolver = resolver
        self.namespace = namespace
        self.trust_seconds = trust_seconds
        self.pending_grace = pending_grace
        self.review_seconds = review_seconds
        self.stale_hold = stale_hold
        self.pool = pool
        self.clock = clock
        self._locals: dict[str, Local] = {}
        self._guard = threading.Lock()
        self._ttl_warned: set[int] = set()

    # -- timings ---------------------------------------------------------------------

    def minimum_ttl(self) -> float:
        """The shortest backstop that never drops a reservation the other rules still need."""
        return self.trust_seconds + SEEN_MARGIN + self.pending_grace + 2 * self.review_seconds

    def ttl(self, config: Config) -> float:
        """``reservation_ttl_seconds``, raised (with a warning, once) to :meth:`minimum_ttl`."""
        wanted = config.reservation_ttl_seconds
        floor = self.minimum_ttl()
        if wanted >= floor:
            return float(wanted)
        if wanted not in self._ttl_warned:
            self._ttl_warned.add(wanted)
            log.warning(
                "reservation_ttl_seconds is shorter than the trust window, the grace and two review "
                "deadlines together; using the minimum",
                extra={"configured": wanted, "using": round(floor, 3)},
            )
        return floor

    # -- per ReplicaSet state --------------------------------------------------------

    def _local(self, rs_uid: str) -> Local:
        with self._guard:
            local = self._locals.get(rs_uid)
            if local is None:
                if len(self._locals) > 10_000:
                    self._locals.clear()
                local = self._locals[rs_uid] = Local()
            return local

    def _read(self, name: str) -> Obj | None:
        found: Obj | None = self.kube.find(r.LEASES, name, self.namespace)
        return found

    def _count(self, rs: Mapping[str, Any], config: Config) -> Count:
        meta = rs.get("metadata") or {}
        namespace, uid = str(meta.get("namespace")), str(meta.get("uid") or "")
        match = ((rs.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = label_selector(match)
        started = self.clock()
        raw = self.kube.list(r.PODS, namespace, label_selector=selector)
        pods = [PodView.from_json(p, scheduling=False) for p in raw]
        mine = [p for p in pods if p.owner is not None and (not uid or p.owner.uid == uid)]
        capacity = self.resolver.node_capacity(config, [p.node_name for p in mine if p.node_name])
        on_demand = placement.on_demand_pods(mine, capacity)
        return Count(
            started=started,
            on_demand=frozenset(p.name for p in on_demand),
            seen=frozenset(t for p in mine if (t := p.annotations.get(POD_ANNOTATION))),
            pods=sum(1 for p in mine if p.active),
            surge_created=tuple(p.created for p in on_demand if placement.is_surge_replica(p)),
            numbers=frozenset(
                n
                for p in mine
                if p.active and (n := number_of(p.annotations, config.on_demand_deletion_cost)) is not None
            ),
        )

    def _recount(self, local: Local, name: str, rs: Mapping[str, Any], config: Config) -> None:
        """Read the Lease and list the pods, at the same time (two round trips become one)."""
        if self.pool is not None:
            lease_f = deadline.submit(self.pool, self._read, name)
            count = self._count(rs, config)
            lease = lease_f.result()
        else:
            lease = self._read(name)
            count = self._count(rs, config)
        local.lease, local.lease_read, local.count = lease, True, count
        local.spot = local.unreserved = local.unreserved_surge = 0
        for t in count.seen:
            local.seen_at.setdefault(t, count.started)

    def needs_count(self, rs: Mapping[str, Any]) -> bool:
        """Whether a claim for this ReplicaSet would list its pods first (no trusted count here)."""
        local = self._local(str((rs.get("metadata") or {}).get("uid") or ""))
        return local.count is None or self.clock() - local.count.started > self.trust_seconds

    def warm(self, rs: Mapping[str, Any], config: Config) -> None:
        """Count ahead while the caller resolves the Deployment (a cold start's round trips overlap)."""
        meta = rs.get("metadata") or {}
        local = self._local(str(meta.get("uid") or ""))
        if not local.lock.acquire(blocking=False):
            return  # a claim is counting already (and a blocked warm-up would hold a pool thread)
        try:
            if local.count is None or self.clock() - local.count.started > self.trust_seconds:
                self._recount(local, lease_name(str(meta.get("namespace")), str(meta.get("name"))), rs, config)
        finally:
            local.lock.release()

    # -- deciding --------------------------------------------------------------------

    def _observe(self, local: Local, doc: Doc, config: Config, now: float) -> None:
        """Note newly known tokens; mark dead the ones past the grace or the backstop."""
        count = local.count
        ttl = self.ttl(config)
        for t in doc.pending:
            first = local.first_seen.setdefault(t, now)
            if count is None or t in count.seen:
                continue
            if count.started >= first + self.pending_grace or now - first > ttl:
                local.dead.add(t)
        for stale in [t for t in local.first_seen if t not in doc.pending]:
            local.first_seen.pop(stale, None)
            local.seen_at.pop(stale, None)
            local.dead.discard(stale)

    def _unseen(self, local: Local, doc: Doc) -> list[str]:
        """Live on-demand reservations whose pods this instance's count does not show, oldest first."""
        seen = local.count.seen if local.count is not None else frozenset()
        return sorted(
            (t for t in doc.pending if t not in seen and t not in local.dead and not t.startswith(SPOT_TOKEN)),
            key=lambda t: doc.pending[t],
        )

    def _taken(self, local: Local, doc: Doc) -> set[int]:
        """The replica numbers held: by the counted pods, and by live reservations of either
        class whose pods have not appeared yet (a reservation whose pod a count of this
        instance showed holds nothing once its pod has gone: its replacement reuses the number)."""
        count = local.count
        taken = set(count.numbers if count is not None else ())
        taken.update(
            n
            for t, n in doc.nums.items()
            if t in doc.pending and t not in local.seen_at and t not in local.dead
        )
        return taken

    def _prunable(self, local: Local, doc: Doc, now: float) -> list[str]:
        gone = [t for t in doc.pending if t in local.dead]
        gone += [
            t
            for t in doc.pending
            if t not in local.dead and t in local.seen_at and now - local.seen_at[t] > self.trust_seconds + SEEN_MARGIN
        ]
        return gone

    def _known(self, local: Local, doc: Doc) -> int:
        pods = local.count.pods if local.count is not None else 0
        return pods + len(self._unseen(local, doc)) + local.spot + local.unreserved

    def claim(
        self,
        *,
        resolved: Resolved,
        floor: int,
        token: str,
        config: Config,
        decide: Decide,
        dry_run: bool = False,
        replicas: int | None = None,
        refresh: Refresh | None = None,
        ranks: Ranks | None = None,
        grow: Grow | None = None,
    ) -> Claim:
        """Decide with ``decide(held)`` and, for an on-demand answer, record the slot under ``token``.

        ``replicas`` is the workload's ``spec.replicas`` that ``decide`` assumes; when
        this pod would take the ReplicaSet past it, ``refresh()`` gives the fresh
        replicas and decision function (see the module docstring).

        ``ranks``: the pod also gets the lowest free replica number of its class (the
        numbers the counted pods' deletion costs stand for and those of the unseen
        reservations are taken). An on-demand number is recorded with the slot; where
        the floor interleaves the classes (a percentage) a spot number is recorded too,
        under ``spot:<token>``, so that instances deciding at once never share one.

        Group commit: the reviews of one ReplicaSet in this process queue up; the one at
        the head (the leader) decides for every review queued, one after the other on what
        the ones before them took, and writes all their reservations in one Lease write. A
        burst of N pods waiting on one ReplicaSet costs one round trip, not N.
        """
        rs = resolved.replicaset or {}
        meta = rs.get("metadata") or {}
        rs_uid, rs_name, rs_ns = str(meta.get("uid") or ""), str(meta.get("name")), str(meta.get("namespace"))
        name = lease_name(rs_ns, rs_name)
        local = self._local(rs_uid)
        waiter = Waiter(
            floor=floor,
            token=token,
            decide=decide,
            dry_run=dry_run,
            replicas=replicas,
            refresh=refresh,
            ranks=ranks,
            grow=grow,
            began=self.clock(),
            deadline=deadline.current(),
        )
        with local.turn:
            local.queue.append(waiter)
            if not local.leading:
                local.leading = waiter.lead = True
            while not (waiter.done or waiter.lead):
                # past its deadline a review still waits a moment: the round ahead of it ends
                # by then (its write runs under an earlier review's deadline) and the next one
                # answers it on what is known (``_from_known``) rather than not at all
                left = waiter.remaining() + LATE_GRACE
                if left <= 0:
                    self._leave(local, waiter)
                    raise deadline.DeadlineExceeded(f"waiting for lease {name} in this process")
                local.turn.wait(min(left, 30.0))
        if not waiter.done:
            try:
                if not local.lock.acquire(timeout=max(0.0, waiter.remaining(30.0) + LATE_GRACE)):
                    raise deadline.DeadlineExceeded(f"waiting for lease {name} in this process")
                try:
                    rounds = 0
                    while not waiter.done:
                        rounds += 1
                        self._round(local, name=name, rs=rs, rs_uid=rs_uid, config=config, rounds=rounds)
                finally:
                    local.lock.release()
            finally:
                with local.turn:
                    self._leave(local, waiter)
        return waiter.outcome()

    def _leave(self, local: Local, waiter: Waiter) -> None:
        """(Holding ``local.turn``.) Take ``waiter`` off the queue; the next undecided
        review at its head leads, or no one does."""
        waiter.gone = True
        local.queue = [w for w in local.queue if not (w.done or w.gone)]
        if waiter.lead:
            waiter.lead = False
            if local.queue:
                local.queue[0].lead = True
            else:
                local.leading = False
        local.turn.notify_all()

    def _answer(self, local: Local, waiter: Waiter, claim: Claim | None, error: BaseException | None = None) -> None:
        if claim is not None and waiter.grown and "stale_read" not in claim.degraded:
            claim = dataclasses.replace(claim, degraded=(*claim.degraded, "stale_read"))
        with local.turn:
            waiter.claim, waiter.error, waiter.done = claim, error, True
            local.turn.notify_all()

    def _round(
        self, local: Local, *, name: str, rs: Mapping[str, Any], rs_uid: str, config: Config, rounds: int
    ) -> None:
        """Decide for the reviews queued (in order, each on what the ones before took), write
        the on-demand ones' reservations in one Lease write, then answer them. A review whose
        spot answer waits on young reservations ends the round: it and those behind it are
        decided in the next round, after one count for all of them."""
        with local.turn:
            batch = [w for w in local.queue if not (w.done or w.gone)]
        for w in batch:
            if w.remaining() <= 0:  # waited for its turn until its deadline
                self._from_known(local, w, rs_uid, config)
        batch = [w for w in batch if not w.done]
        if not batch:
            return
        stale = local.count is None or self.clock() - local.count.started > self.trust_seconds
        if local.recount_at is not None or stale or not local.lease_read:
            head = batch[0]
            if head.lead and head.remaining() <= _write_reserve(self.kube):
                # Too little time left for a call at the API server's pace: this review is
                # answered on what is known and the next one in the queue (more time left) reads.
                self._from_known(local, head, rs_uid, config)
                return
        try:
            if local.recount_at is not None:  # a spot answer waits for young reservations' pods
                time.sleep(max(0.0, local.recount_at - self.clock()))
                local.recount_at = None
                self._recount(local, name, rs, config)
            if local.count is None or self.clock() - local.count.started > self.trust_seconds:
                self._recount(local, name, rs, config)
            elif not local.lease_read:
                local.lease, local.lease_read = self._read(name), True
        except UNANSWERED:
            # The count or the Lease not answered in time: every review waiting is answered
            # on what is known rather than not at all (the next review counts afresh).
            for w in batch:
                self._from_known(local, w, rs_uid, config)
            return
        added: dict[str, int | None] = {}  # this round's reservations (token -> number), oldest first
        doc = self._doc(local, rs_uid, added, config)
        decided: list[tuple[Waiter, Claim]] = []
        writers: list[tuple[Waiter, str]] = []
        for w in batch:
            try:
                step = self._decide(local, w, name=name, rs=rs, rs_uid=rs_uid, config=config, doc=doc, added=added)
            except Exception as exc:
                if not w.lead:
                    break  # the leader's own time or call: the next leader decides it
                if isinstance(exc, UNANSWERED):
                    self._from_known(local, w, rs_uid, config)
                else:
                    self._answer(local, w, None, exc)
                continue
            if step is None:  # waits for young reservations: this round ends here
                break
            claim, doc, new = step
            if claim is None:
                continue  # answered already (no time left to write its reservation)
            decided.append((w, claim))
            if new and claim.token is not None:
                writers.append((w, claim.token))
        if writers:
            first = min((w.deadline for w, _ in writers if w.deadline is not None), key=lambda d: d.at, default=None)
            try:
                with deadline.running(first) if first is not None else _nothing():
                    self._write(local, name, doc=doc, rs=rs, config=config)
            except (kube_mod.Conflict, kube_mod.AlreadyExists, kube_mod.Transient, deadline.DeadlineExceeded) as exc:
                lost = isinstance(exc, (kube_mod.Conflict, kube_mod.AlreadyExists))
                if lost:
                    metrics.CONFLICTS.inc()
                # (a deadline reached: the earliest writer's, whose time the write ran under)
                ran_out = first if isinstance(exc, deadline.DeadlineExceeded) else None
                self._out_of_time(local, writers, decided, ran_out, landed=not lost)
                leader = next((w for w in batch if w.lead and not w.done), None)
                if leader is not None and leader.remaining() <= deadline.WRITE_RESERVE:
                    # the Lease kept changing under it until its time ran out: on what is known
                    log.info("lease busy until the review's deadline", extra={"lease": name, "tries": rounds})
                    self._from_known(local, leader, rs_uid, config)
                    return
                if any(not w.done for w in batch):
                    try:
                        local.lease, local.lease_read = self._read(name), True
                    except UNANSWERED:
                        # not read again in time: the next round's leader reads it, or answers
                        # on what is known (an error here let the reviews through unplaced)
                        local.lease_read = False
                    time.sleep(_JITTER.uniform(0.0, min(0.05, 0.005 * rounds)))
                return  # the others are decided again on the Lease as it is now
            for _, token in writers:
                local.first_seen.setdefault(token, self.clock())
        for w, claim in decided:
            if not w.dry_run and claim.decision.placement is Placement.SPOT:
                local.spot += 1  # a spot admission since the count
            self._answer(local, w, claim)
        spot = [c for w, c in decided if not w.dry_run and c.decision.placement is not Placement.ON_DEMAND]
        if not writers and spot and self._prunable(local, doc, self.clock()):
            self._write(local, name, doc=doc, rs=rs, config=config, best_effort=True)

    def _out_of_time(
        self,
        local: Local,
        writers: list[tuple[Waiter, str]],
        decided: list[tuple[Waiter, Claim]],
        ran_out: deadline.Deadline | None,
        *,
        landed: bool,
    ) -> None:
        """After a round's Lease write failed: the writers with no time left for another are
        answered as decided all the same (an on-demand slot is the safe side), the others
        are decided again in the next round.

        ``landed``: the write may have landed (it timed out, or the API server failed it
        after it arrived). The pod then carries its token: a write that landed is its
        reservation, one that did not leaves an on-demand pod the next count shows, never a
        slot counted twice. A write that lost a race (409) did not land: the pod goes
        without a token and this instance counts it until its next count."""
        reserve = _write_reserve(self.kube)
        late = {id(w) for w, _ in writers if w.remaining() <= reserve or (ran_out and w.deadline == ran_out)}
        for w, claim in decided:
            if id(w) not in late:
                continue
            if landed:
                self._answer(local, w, dataclasses.replace(claim, degraded=("unconfirmed",)))
                continue
            self._unreserved(local, w, dataclasses.replace(claim, token=None, degraded=("unreserved",)))

    def _unreserved(self, local: Local, w: Waiter, claim: Claim) -> None:
        """Answer ``w`` with ``claim``, which holds no reservation: this instance counts it
        until its next count shows the pod (an on-demand slot here; a percentage floor's
        spot pod, its replica number not recorded, as a spot admission). Another instance
        does not know it until its own count: at worst a replica over the floor, which
        node-added moves back to spot; never one under it."""
        if w.dry_run:
            pass
        elif claim.decision.placement is Placement.ON_DEMAND:
            local.unreserved += 1
            local.unreserved_surge += int(claim.decision.surge)
        elif claim.decision.placement is Placement.SPOT:
            local.spot += 1
        self._answer(local, w, claim)

    def _grow(self, w: Waiter, replicas: int) -> None:
        """``w`` decides on its workload grown to ``replicas``: the pods known prove that many
        and the workload could not be read in time (a cached copy from before a scale-up
        would give a percentage or capped floor too low)."""
        if w.grow is None or w.replicas is None:
            return
        w.replicas, w.decide, w.grown = replicas, w.grow(replicas), True

    def _from_known(self, local: Local, w: Waiter, rs_uid: str, config: Config) -> None:
        """Answer ``w``, which has no time left for the call its decision needs (a count or
        the Lease), on what this instance knows: its last count however old (none: no pod
        counted), the Lease as last read and its own answers since. An on-demand answer is
        the safe side; a spot one needs a count that shows the floor held (an on-demand pod
        deleted since the count is the one way it errs, and node-added repairs it)."""
        doc = Doc.from_lease(local.lease, rs_uid)
        self._observe(local, doc, config, self.clock())
        if w.replicas is not None and self._known(local, doc) + 1 > w.replicas:
            self._grow(w, self._known(local, doc) + 1)  # a scale-up the cached copy does not show
        _, held, decision = self._held_and_decided(local, w, doc)
        self._unreserved(local, w, Claim(decision, held, None, w.refreshed, degraded=("uncounted",)))

    def _held_and_decided(self, local: Local, w: Waiter, doc: Doc) -> tuple[list[str], int, Decision]:
        """The reservations whose pods the count does not show, the on-demand slots held
        (pods counted, those reservations and this instance's unreserved answers), and
        ``w``'s decision on them."""
        unseen = self._unseen(local, doc)
        held = len(local.count.on_demand if local.count is not None else ()) + len(unseen) + local.unreserved
        decision = w.decide(
            held,
            local.count.surge_created if local.count is not None else (),
            sum(1 for t in unseen if t.startswith(SURGE_TOKEN)) + local.unreserved_surge,
        )
        return unseen, held, decision

    def _doc(self, local: Local, rs_uid: str, added: Mapping[str, int | None], config: Config) -> Doc:
        """The Lease's reservations with this round's own (not written yet) on top."""
        doc = Doc.from_lease(local.lease, rs_uid)
        self._observe(local, doc, config, self.clock())
        for t, number in added.items():
            if t not in doc.pending:
                doc.seq += 1
                doc.pending[t] = doc.seq
                if number is not None:
                    doc.nums[t] = number
        return doc

    def _decide(
        self,
        local: Local,
        w: Waiter,
        *,
        name: str,
        rs: Mapping[str, Any],
        rs_uid: str,
        config: Config,
        doc: Doc,
        added: dict[str, int | None],
    ) -> tuple[Claim | None, Doc, bool] | None:
        """One review's answer on the Lease and count as this round has them: the claim
        (None when the review was answered already: no time left for its write), the
        round's ``doc`` (a reservation it takes is added to it and to ``added``), and
        whether it took a new reservation. None when it waits for young reservations'
        pods to appear."""
        token = w.token
        if token in doc.pending and token not in added:  # our own write landed (an earlier try timed out)
            reserved = Decision(Placement.ON_DEMAND, "reserved")
            return Claim(reserved, len(doc.pending), token, number=doc.nums.get(token)), doc, False
        if SURGE_TOKEN + token in doc.pending and SURGE_TOKEN + token not in added:
            surge = Decision(Placement.ON_DEMAND, "reserved", surge=True)
            return Claim(surge, len(doc.pending), SURGE_TOKEN + token), doc, False
        if (spot := SPOT_TOKEN + token) in doc.pending and spot not in added:
            reserved = Decision(Placement.SPOT, "reserved")
            return Claim(reserved, len(doc.pending), spot, number=doc.nums.get(spot)), doc, False
        now = self.clock()
        if (
            w.replicas is not None
            and self._known(local, doc) + 1 > w.replicas
            and now - local.refuted > self.stale_hold
        ):
            if w.refresh is not None:  # a cached workload: read it again first
                try:
                    w.replicas, w.decide = w.refresh()
                    w.refreshed = True
                except UNANSWERED:
                    self._grow(w, self._known(local, doc) + 1)
                w.refresh = None
            if self._known(local, doc) + 1 > w.replicas:
                # The fresh workload does not cover the known pods either: pods deleted
                # since the count, or reservations whose pods were never created.
                if local.count is None or local.count.started < w.began:
                    self._recount(local, name, rs, config)
                    doc = self._doc(local, rs_uid, added, config)
                self._apply_bound(local, doc, w.replicas)
                local.refuted = self.clock()
        unseen, held, decision = self._held_and_decided(local, w, doc)
        if (
            decision.placement is Placement.SPOT
            and not w.dry_run
            and unseen
            and held - len(unseen) - local.unreserved < w.floor
            and self._wait(local, w, unseen)
        ):
            # The floor is met only by reservations whose pods have not appeared yet:
            # look again (they appear within milliseconds, or they are dead).
            return None
        number = None
        if w.ranks is not None and decision.placement is not None and not decision.surge:
            number = w.ranks.number(decision.placement, self._taken(local, doc))
        # a percentage floor's spot pod records its number (instances deciding at once)
        ordered_spot = decision.placement is Placement.SPOT and w.ranks is not None and w.ranks.ordered
        if (decision.placement is not Placement.ON_DEMAND and not ordered_spot) or w.dry_run:
            return Claim(decision, held, refreshed=w.refreshed, number=number), doc, False
        if w.remaining() <= _write_reserve(self.kube):
            # No time left to write this one's reservation: answered as decided all the same
            # (an on-demand slot is the safe side: the floor never waits on a write), and
            # counted by this instance until its next count shows the pod. Another instance
            # does not know it until its own count: at worst a replica over the floor, which
            # node-added moves back to spot; never one under it.
            self._unreserved(local, w, Claim(decision, held, None, w.refreshed, number, degraded=("unreserved",)))
            return None, doc, False
        if decision.placement is Placement.SPOT:
            mine = SPOT_TOKEN + token
        else:
            mine = SURGE_TOKEN + token if decision.surge else token
        added[mine] = number
        doc.seq += 1
        doc.pending[mine] = doc.seq
        if number is not None:
            doc.nums[mine] = number
        return Claim(decision, held, mine, w.refreshed, number), doc, True

    def _wait(self, local: Local, w: Waiter, unseen: list[str]) -> bool:
        """Whether ``w`` can wait for the young reservations' pods; if so the next round
        counts again after a pause (``local.recount_at``)."""
        count = local.count
        assert count is not None
        due = min(local.first_seen.get(t, count.started) for t in unseen) + self.pending_grace
        sleep = max(0.0, min(w.pause, due - self.clock()))
        # the count after the pause takes a call at the API server's current pace
        if w.remaining() - sleep - _write_reserve(self.kube) <= LIST_RESERVE:
            log.info(
                "no time left to wait for reserved pods to appear; counting them as placed",
                extra={"reservations": len(unseen)},
            )
            return False
        w.pause = min(0.2, w.pause * 2)
        local.recount_at = self.clock() + sleep
        return True

    def _apply_bound(self, local: Local, doc: Doc, replicas: int) -> None:
        """Pods + unseen reservations + this pod beyond the replicas: the oldest unseen ones are dead."""
        if local.count is None:
            return
        unseen = self._unseen(local, doc)
        excess = local.count.pods + len(unseen) + 1 - replicas
        if excess > 0:
            dropped = unseen[:excess]
            local.dead.update(dropped)
            log.info(
                "reservations without pods beyond the replicas: dropped as dead",
                extra={"dropped": len(dropped), "replicas": replicas, "pods": local.count.pods},
            )

    def _write(
        self,
        local: Local,
        name: str,
        *,
        doc: Doc,
        rs: Mapping[str, Any],
        config: Config,
        best_effort: bool = False,
    ) -> None:
        for t in self._prunable(local, doc, self.clock()):
            doc.pending.pop(t, None)
            doc.nums.pop(t, None)
        meta = rs.get("metadata") or {}
        rs_uid = str(meta.get("uid") or "")
        annotations = {
            ANNOTATION: doc.to_json(),
            RS_UID_ANNOTATION: rs_uid,
            RS_ANNOTATION: f"{meta.get('namespace')}/{meta.get('name')}",
        }
        # Informational only (who wrote it last, and how long a reservation may live):
        # no decision reads these times back.
        spec = {"holderIdentity": HOLDER, "leaseDurationSeconds": max(1, round(self.ttl(config)))}
        lease = local.lease
        try:
            if lease is None:
                body: Obj = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": name,
                        "namespace": self.namespace,
                        "labels": {
                            "app.kubernetes.io/managed-by": "spotguard",
                            "app.kubernetes.io/component": "admission",
                        },
                        "annotations": annotations,
                    },
                    "spec": spec,
                }
                written = self.kube.create(r.LEASES, body, self.namespace)
            else:
                body = json.loads(json.dumps(lease))
                body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}), **annotations}
                body["spec"] = {**(body.get("spec") or {}), **spec}
                written = self.kube.replace(r.LEASES, body)
        except (kube_mod.Conflict, kube_mod.AlreadyExists, kube_mod.Transient, deadline.DeadlineExceeded):
            local.lease_read = False
            if best_effort:
                return
            raise
        local.lease, local.lease_read = written, True
