"""Exact on-demand slot counting for Deployment pods, across processes and invocations.

The problem: a ReplicaSet creates 60 pods at once, several webhook instances
(gunicorn workers, Knative pods, Lambda invocations) admit them in parallel,
and the pods do not exist yet when they are admitted (``generateName``: no
name either). The on-demand slots handed out must equal the floor.

The design: one Lease per ReplicaSet, in spotguard's namespace, is the single
source of truth for "on-demand slots handed out". Every on-demand decision is
a conditional write of that Lease (``resourceVersion``: a lost race answers
409 Conflict, and the loser re-reads and decides again), so on-demand
decisions are serialised cluster-wide. Spot decisions need no write: the count
of slots held only grows while a burst is being admitted, so a spot decision
made on a slightly older copy stays right.

The Lease ``admission.<namespace>.<replicaset>`` (or ``admission.<sha256>`` when
that name would be too long) carries, in the annotation
``spotguard.io/reservations``, a JSON document::

    {"v": 1,
     "checked": 1764107000.25,           # wall-clock time of the last pod count
     "pods": 4,                          # active pods of the ReplicaSet counted then
     "on_demand": ["web-7c9f-abcde"],    # active pods counted on on-demand then
     "pending": {"<request uid>": [1764107000.1, 1764107030.1]}}  # token -> [made, expires]

and ``spotguard.io/replicaset-uid`` (a ReplicaSet re-created under the same
name starts from scratch). ``spec.holderIdentity``, ``renewTime`` and
``leaseDurationSeconds`` say who wrote it last and when.

* Slots held = ``len(on_demand)`` + unexpired ``pending`` tokens.
* An on-demand decision adds a pending token (the AdmissionReview uid) and the
  patch writes the same token into the pod's ``spotguard.io/reservation``
  annotation. A pending token is consumed when a later count lists a pod
  carrying it (it is then counted as a pod), or it expires after
  ``reservation_ttl_seconds`` (a pod that was never created: another webhook
  denied it, a quota refused it). A count also drops a token older than
  ``pending_grace`` seconds (default 5) whose pod it does not see: that pod was
  created and deleted again between two counts (a quick scale up and down), or
  never created. A pod is stored milliseconds after its admission answer, so
  a live reservation is never that old unless the API server is very slow (then
  at worst one extra replica lands on on-demand).
* Counting lists the ReplicaSet's pods (its selector, then ownerReference uid)
  and classifies each by its node's capacity once scheduled, else by its
  ``spotguard.io/placement`` label (``placement.placement_of``). The Lease is
  read first and the pods second: a token missing from the Lease was consumed
  by a count that saw its pod, which this listing sees too, so no slot is lost
  or counted twice between the two reads.
* A count is trusted for ``trust_seconds`` (default 3): within that window the
  Lease alone answers and no pod is listed. An on-demand pod deleted inside the
  window is noticed at the next count (the node-added reconcile also restores
  floors).
* Each process keeps the last Lease it read or wrote. A spot decision on that
  copy costs no API request at all; an on-demand decision on a stale copy loses
  its conditional write and re-reads. Within a process, decisions for one
  ReplicaSet are serialised by a lock, so the processes only race each other.

A stale workload: the Deployment is cached for 2 s (``Resolver``), and a
change that creates pods (the interruption handler's surge: ``spec.replicas``
and ``spotguard.io/surge`` in one patch; a scale under a percentage floor)
can land inside that window. Its pods must see the new floor. Every process
knows a lower bound of the ReplicaSet's pods: ``pods`` at the last count, plus
the unexpired reservations (pods admitted on-demand since, by any process),
plus the spot admissions this process made since that count. When that bound
plus the pod being admitted exceeds the cached ``spec.replicas``, the pod
belongs to a scale the cache has not seen: ``claim`` calls ``refresh`` (one
GET of the Deployment, bypassing the cache) and decides on the new floor. If
the fresh replicas still do not cover it, the bound is too high: pods deleted
since the count (replacements), or admitted and never created (a later
webhook or a quota refused them). Then the rule is held off for that
ReplicaSet for ``stale_hold`` seconds (0.5), so such pods cost at most one GET
per ReplicaSet per ``stale_hold``, not one per pod, until the next count
(``trust_seconds``) corrects the bound (counting at once would cost a LIST of
the ReplicaSet's pods each time: dearer than the GETs it saves). A burst
that only creates the pods of the cached scale never trips the rule: the
common case costs no extra request. Known limits: a surge landing within
``stale_hold`` after such a refuted re-read is decided on the cached floor
(until the hold ends or the cache expires); and with several webhook
processes, the spot admissions of the others are not in the bound (they write
nothing), so a surge inside the cache window right after a burst those
processes shared can be decided on the old floor until one process's bound
trips (or the cache expires, 2 s at most).

API cost per admitted pod, warm: 0 requests for a spot pod while the count is
trusted, 1 write for an on-demand pod (plus a GET after a lost race), and a GET
+ LIST + PUT per ReplicaSet per trust window. dryRun reads (GET, LIST if the
count is stale) and never writes.

Why per ReplicaSet: a rollout's new ReplicaSet gets its own floor and its own
Lease, so while both exist the Deployment briefly has up to two floors on
on-demand (never fewer than one); once the old ReplicaSet is scaled to zero
the count is exactly the floor again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spotguard.admission import metrics
from spotguard.admission.resolve import Resolved, Resolver
from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.policy import placement
from spotguard.policy.config import Config
from spotguard.policy.placement import Decision, Placement
from spotguard.policy.views import PodView

log = logging.getLogger(__name__)

ANNOTATION = "spotguard.io/reservations"
RS_UID_ANNOTATION = "spotguard.io/replicaset-uid"
RS_ANNOTATION = "spotguard.io/replicaset"
POD_ANNOTATION = "spotguard.io/reservation"
HOLDER = "spotguard-admission"
MAX_NAME = 253
Obj = dict[str, Any]


class Busy(Exception):
    """The Lease kept changing under us for longer than the deadline."""


@dataclass
class State:
    checked: float = 0.0
    on_demand: list[str] = field(default_factory=list)
    pending: dict[str, tuple[float, float]] = field(default_factory=dict)  # token -> (made, expires)
    pods: int = 0  # active pods at the count (0 in a Lease written before this field existed)

    def held(self, now: float) -> int:
        return len(self.on_demand) + self.reserved(now)

    def reserved(self, now: float) -> int:
        return sum(1 for _, exp in self.pending.values() if exp > now)

    def known_pods(self, now: float) -> int:
        """A lower bound of the ReplicaSet's pods: those counted, plus reservations not counted yet."""
        return max(self.pods, len(self.on_demand)) + self.reserved(now)

    def to_json(self, now: float) -> str:
        pending = {t: [round(m, 3), round(e, 3)] for t, (m, e) in self.pending.items() if e > now}
        return json.dumps(
            {
                "v": 1,
                "checked": round(self.checked, 3),
                "pods": self.pods,
                "on_demand": sorted(self.on_demand),
                "pending": pending,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any] | None, rs_uid: str) -> State:
        if not lease:
            return cls()
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        if annotations.get(RS_UID_ANNOTATION, rs_uid) != rs_uid:
            return cls()
        try:
            doc = json.loads(annotations.get(ANNOTATION) or "{}")
            return cls(
                checked=float(doc.get("checked") or 0.0),
                pods=max(0, int(doc.get("pods") or 0)),
                on_demand=[str(n) for n in doc.get("on_demand") or []],
                pending={str(t): _pending(v) for t, v in (doc.get("pending") or {}).items()},
            )
        except (ValueError, TypeError, AttributeError):
            log.warning("unreadable reservation lease; recounting", extra={"lease": _name_of(lease)})
            return cls()


@dataclass(frozen=True)
class Claim:
    decision: Decision
    held: int
    token: str | None = None  # set when an on-demand slot was recorded under this token
    refreshed: bool = False  # the workload was read again (the cached one was older than this pod)


# ``refresh()`` reads the workload again, bypassing the cache, and returns its
# replicas and the decision function for its new floor.
Refresh = Callable[[], tuple[int, Callable[[int], Decision]]]


def _pending(value: Any) -> tuple[float, float]:
    if isinstance(value, (int, float)):
        return float(value), float(value)
    made, expires = value
    return float(made), float(expires)


def lease_name(namespace: str, replicaset: str) -> str:
    name = f"admission.{namespace}.{replicaset}"
    if len(name) <= MAX_NAME:
        return name
    return "admission." + hashlib.sha256(f"{namespace}/{replicaset}".encode()).hexdigest()[:40]


def _name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _micro_time(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Reservations:
    def __init__(
        self,
        kube: kube_mod.Kube,
        resolver: Resolver,
        namespace: str,
        *,
        trust_seconds: float = 3.0,
        pending_grace: float = 5.0,
        deadline: float = 2.0,
        wall: Callable[[], float] = time.time,
        stale_hold: float = 0.5,
    ) -> None:
        self.kube = kube
        self.resolver = resolver
        self.namespace = namespace
        self.trust_seconds = trust_seconds
        self.pending_grace = pending_grace
        self.deadline = deadline
        self.wall = wall
        self._leases: dict[str, Obj | None] = {}  # rs uid -> last Lease seen (None: none exists)
        self._spot: dict[str, tuple[float, int]] = {}  # rs uid -> (count it follows, spot admissions since)
        self._refuted: dict[str, float] = {}  # rs uid -> when a re-read last showed no newer scale
        self.stale_hold = stale_hold
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                if len(self._locks) > 10_000:
                    self._locks.clear()
                    self._leases.clear()
                    self._spot.clear()
                    self._refuted.clear()
                lock = self._locks[key] = threading.Lock()
            return lock

    def _read(self, name: str) -> Obj | None:
        metrics.api_call("get", r.LEASES.name)
        return self.kube.find(r.LEASES, name, self.namespace)

    def claim(
        self,
        *,
        resolved: Resolved,
        floor: int,
        token: str,
        config: Config,
        decide: Callable[[int], Decision],
        dry_run: bool = False,
        replicas: int | None = None,
        refresh: Refresh | None = None,
    ) -> Claim:
        """Decide with ``decide(held)`` and, for an on-demand answer, record the slot under ``token``.

        ``replicas`` is the workload's ``spec.replicas`` that ``decide`` assumes; when
        this pod would take the ReplicaSet past it, ``refresh()`` gives the fresh
        replicas and decision function (see the module docstring).
        """
        rs = resolved.replicaset or {}
        meta = rs.get("metadata") or {}
        rs_uid, rs_name, rs_ns = str(meta.get("uid") or ""), str(meta.get("name")), str(meta.get("namespace"))
        name = lease_name(rs_ns, rs_name)
        started = time.monotonic()
        attempt = 0
        refreshed = False
        with self._lock(rs_uid):
            while True:
                attempt += 1
                cached = rs_uid in self._leases
                lease = self._leases[rs_uid] if cached else self._read(name)
                state = State.from_lease(lease, rs_uid)
                now = self.wall()
                if token in state.pending:  # our own write landed (an earlier try timed out)
                    return Claim(Decision(Placement.ON_DEMAND, "reserved"), state.held(now), token)
                if cached and now - state.checked > self.trust_seconds:
                    lease = self._read(name)
                    state = State.from_lease(lease, rs_uid)
                    cached = False
                counted = False
                if now - state.checked > self.trust_seconds:
                    state = self._count(state, rs, config, now)
                    counted = True
                if (
                    replicas is not None
                    and refresh is not None
                    and self._beyond(state, rs_uid, now, replicas)
                    and time.monotonic() - self._refuted.get(rs_uid, -1e18) > self.stale_hold
                ):
                    replicas, decide = refresh()
                    refresh = None
                    refreshed = True
                    if self._beyond(state, rs_uid, now, replicas):
                        # The fresh workload does not cover the pods known either: the bound
                        # holds pods deleted since the count (or pods never created). Hold the
                        # rule off for a moment; the next count corrects the bound.
                        self._refuted[rs_uid] = time.monotonic()
                held = state.held(now)
                decision = decide(held)
                if decision.placement is not Placement.ON_DEMAND:
                    if not dry_run and decision.placement is Placement.SPOT:
                        self._note_spot(rs_uid, state.checked)
                    if counted and not dry_run:
                        self._write(name, lease=lease, state=state, rs=rs, config=config, now=now, best_effort=True)
                    elif not cached and lease is not None:
                        self._leases[rs_uid] = lease
                    return Claim(decision, held, refreshed=refreshed)
                if dry_run:
                    return Claim(decision, held, refreshed=refreshed)
                state.pending[token] = (now, now + config.reservation_ttl_seconds)
                try:
                    self._write(name, lease=lease, state=state, rs=rs, config=config, now=now)
                    return Claim(decision, held, token, refreshed)
                except (kube_mod.Conflict, kube_mod.AlreadyExists, kube_mod.Transient) as exc:
                    metrics.CONFLICTS.inc()
                    self._leases.pop(rs_uid, None)
                    if time.monotonic() - started > self.deadline:
                        raise Busy(f"lease {self.namespace}/{name} busy after {attempt} tries") from exc
                    time.sleep(random.uniform(0.0, min(0.05, 0.005 * attempt)))

    def _beyond(self, state: State, rs_uid: str, now: float, replicas: int) -> bool:
        """Whether this pod would take the ReplicaSet past ``replicas`` by what is known of its pods."""
        at, spot = self._spot.get(rs_uid, (state.checked, 0))
        known = state.known_pods(now) + (spot if at == state.checked else 0)
        return known + 1 > replicas

    def _note_spot(self, rs_uid: str, checked: float) -> None:
        at, spot = self._spot.get(rs_uid, (checked, 0))
        self._spot[rs_uid] = (checked, spot + 1 if at == checked else 1)

    def _count(self, previous: State, rs: Mapping[str, Any], config: Config, now: float) -> State:
        meta = rs.get("metadata") or {}
        namespace, uid = str(meta.get("namespace")), str(meta.get("uid") or "")
        match = ((rs.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(match.items())) or None
        metrics.api_call("list", r.PODS.name)
        raw = self.kube.list(r.PODS, namespace, label_selector=selector)
        pods = [PodView.from_json(p) for p in raw]
        mine = [p for p in pods if p.owner is not None and (not uid or p.owner.uid == uid)]
        capacity = self.resolver.node_capacity(config, [p.node_name for p in mine if p.node_name])
        seen = {p.annotations.get(POD_ANNOTATION) for p in mine}
        on_demand = [p.name for p in mine if p.active and placement.placement_of(p, capacity) is Placement.ON_DEMAND]
        pending = {
            t: (made, expires)
            for t, (made, expires) in previous.pending.items()
            if expires > now and t not in seen and now - made <= self.pending_grace
        }
        pods_now = sum(1 for p in mine if p.active)
        return State(checked=now, on_demand=on_demand, pending=pending, pods=pods_now)

    def _write(
        self,
        name: str,
        *,
        lease: Obj | None,
        state: State,
        rs: Mapping[str, Any],
        config: Config,
        now: float,
        best_effort: bool = False,
    ) -> None:
        meta = rs.get("metadata") or {}
        rs_uid = str(meta.get("uid") or "")
        annotations = {
            ANNOTATION: state.to_json(now),
            RS_UID_ANNOTATION: rs_uid,
            RS_ANNOTATION: f"{meta.get('namespace')}/{meta.get('name')}",
        }
        spec = {
            "holderIdentity": HOLDER,
            "leaseDurationSeconds": max(1, int(config.reservation_ttl_seconds)),
            "renewTime": _micro_time(now),
        }
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
                metrics.api_call("create", r.LEASES.name)
                written = self.kube.create(r.LEASES, body, self.namespace)
            else:
                body = json.loads(json.dumps(lease))
                body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}), **annotations}
                body["spec"] = {**(body.get("spec") or {}), **spec}
                metrics.api_call("update", r.LEASES.name)
                written = self.kube.replace(r.LEASES, body)
        except (kube_mod.Conflict, kube_mod.AlreadyExists, kube_mod.Transient):
            self._leases.pop(rs_uid, None)
            if best_effort:
                return
            raise
        self._leases[rs_uid] = written
