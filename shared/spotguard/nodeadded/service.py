"""The one entry every transport calls: a trigger in, a pass run, an answer out.

A Node that was just added is often not Ready yet, and an EC2 instance that is
``running`` has usually not joined the cluster yet (its kubelet registers a
minute or so later). Spot room on it counts only once it is Ready, so for those
triggers :class:`Service` waits for the node, checking every ``poll`` seconds
for at most ``join_wait`` seconds (``$SPOTGUARD_NODE_JOIN_WAIT_SECONDS``,
default 60; keep it inside the Lambda timeout), then runs the pass either way:
a node that joins later is the next scheduled pass's (it never waits forever,
and never fails the delivery for it). An instance that is another cluster's
(its tags say so, or EC2 does not know it: :mod:`spotguard.nodeadded.instances`)
is answered at once (``foreign``), without a wait or a pass.

A pass that leaves moves in flight (begun, or waiting for their new replicas;
not a hold) is **followed**: further passes every ``follow_every`` seconds
(``$SPOTGUARD_FOLLOW_EVERY_SECONDS``, default 10) while moves are in flight,
for at most ``follow_seconds`` (``$SPOTGUARD_FOLLOW_SECONDS``, default 90; 0:
never) from the delivery's start, its join wait included, inside the same
delivery. The shipped schedules run a pass a minute (PingSource ``* * * * *``,
EventBridge Scheduler ``rate(1 minute)``, the in-cluster timer's 60 s), and a
move needs a pass to begin it and one once its new replicas are Ready (on a
provisioned cluster after a launch: 40-60 s, then the pod's start): without
the follow, each step of a return to spot would wait up to a minute for the
next delivery. The window stays inside the function's timeout (120 s in the
shipped Knative Service and Lambda); a delivery that overlaps the next one is
harmless (one pass at a time per process; across processes a move's record is
written under the workload's resourceVersion).

One pass at a time per process (a lock), so HTTP workers and a timer never
plan over each other's half-written moves. Every pass is recorded in
:attr:`Service.readiness` (:mod:`spotguard.readiness`): not ready while the
cluster was never reached or the last passes all failed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spotguard import readiness
from spotguard.gateway import resources as r
from spotguard.gateway import settings
from spotguard.gateway.errors import ApiError
from spotguard.nodeadded import instances, metrics, triggers
from spotguard.nodeadded.reconciler import Reconciler, Report
from spotguard.nodeadded.triggers import Kind, Trigger
from spotguard.policy.views import NodeView

log = logging.getLogger("spotguard.nodeadded")

DEFAULT_JOIN_WAIT = 60.0
DEFAULT_FOLLOW_SECONDS = 90.0
DEFAULT_FOLLOW_EVERY = 10.0


class Transient(RuntimeError):
    """The pass could not run (the API server unreachable): deliver the trigger again."""


@dataclass(frozen=True)
class Answer:
    trigger: Trigger
    result: str  # reconciled, ignored, foreign
    joined: bool | None = None
    report: Report | None = None
    reason: str = ""
    followed: int = 0  # passes after the first, for moves in flight

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"result": self.result, "trigger": self.trigger.to_json()}
        if self.reason:
            out["reason"] = self.reason
        if self.joined is not None:
            out["joined"] = self.joined
        if self.report is not None:
            rep = self.report
            out["started"] = [f"{m.workload.key}:{m.direction}:{m.pod.name}" for m in rep.started]
            out["progressed"] = [f"{p.workload.key}:{p.action}" for p in rep.progress if str(p.action) != "wait"]
            out["skipped"] = len(rep.plan.skipped)
            out["leases_deleted"] = len(rep.leases)
            out["failures"] = rep.failures
            out["seconds"] = round(rep.seconds, 3)
        if self.followed:
            out["followed"] = self.followed
        return out


class Service:
    def __init__(
        self,
        build: Callable[[], Reconciler],
        *,
        join_wait: float | None = None,
        poll: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        owner: instances.Check | bool | None = True,
        follow_seconds: float | None = None,
        follow_every: float | None = None,
        follow_sleep: Callable[[float], None] | None = None,
        follow_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``owner``: whose cluster a running instance is (True: from the environment, built on
        first use; None or False: never asked, every running instance is waited for).
        ``follow_seconds``, ``follow_every``: the follow of moves in flight (module docstring;
        None: from the environment); ``follow_sleep``, ``follow_clock``: how it waits and
        measures its window (default: ``sleep`` and the monotonic clock; the demo's are the
        simulated cluster's)."""
        self._build = build
        self._owner_wanted = owner is True
        self._owner: instances.Check | None = owner if callable(owner) else None
        self._reconciler: Reconciler | None = None
        if join_wait is None:
            join_wait = float(os.environ.get("SPOTGUARD_NODE_JOIN_WAIT_SECONDS") or DEFAULT_JOIN_WAIT)
        self.join_wait = join_wait
        self.follow_seconds = _seconds("SPOTGUARD_FOLLOW_SECONDS", follow_seconds, DEFAULT_FOLLOW_SECONDS)
        self.follow_every = _seconds("SPOTGUARD_FOLLOW_EVERY_SECONDS", follow_every, DEFAULT_FOLLOW_EVERY) or 1.0
        self.poll = poll
        self.sleep = sleep
        self.follow_sleep = follow_sleep or sleep
        self.follow_clock = follow_clock
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self.readiness = readiness.Readiness(self._probe)

    def _probe(self) -> None:
        readiness.cluster_probe(self.reconciler.kube)()

    def ready(self) -> str | None:
        """None when this process can run passes, else why not."""
        return self.readiness.check()

    @property
    def reconciler(self) -> Reconciler:
        with self._build_lock:
            if self._reconciler is None:
                self._reconciler = self._build()
            return self._reconciler

    def handle(self, trigger: Trigger, *, dry_run: bool = False) -> Answer:
        """Run a pass for ``trigger``; raises :class:`Transient` when it could not."""
        if trigger.kind is Kind.NOTHING:
            log.info("trigger needs nothing", extra=trigger.to_json())
            return Answer(trigger, "ignored")
        try:
            if trigger.kind is Kind.INSTANCE_RUNNING:
                whose, why = self._whose(trigger.instance_id)
                if whose is instances.Owner.OTHER:
                    log.info(
                        "a running instance of another cluster: nothing to do", extra={**trigger.to_json(), "why": why}
                    )
                    return Answer(trigger, "foreign", joined=False, reason=f"instance {trigger.instance_id}: {why}")
            began = self.follow_clock()
            rec = self.reconciler
            joined = None
            if trigger.kind in (Kind.NODE_ADDED, Kind.INSTANCE_RUNNING):
                joined = self._wait_for_node(rec, trigger)
            with self._lock:
                report = rec.reconcile(dry_run=dry_run, trigger=str(trigger.kind))
            followed = 0 if dry_run else self._follow(rec, report, began + self.follow_seconds)
        except ApiError as exc:
            self.readiness.record(False, f"a pass failed: {exc}")
            raise Transient(f"reconcile failed: {exc}") from exc
        except Transient as exc:
            self.readiness.record(False, str(exc))
            raise
        except Exception as exc:
            metrics.ERRORS.labels("pass").inc()
            log.exception("reconcile failed", extra={"trigger": str(trigger.kind)})
            self.readiness.record(False, f"a pass raised {type(exc).__name__}: {exc}")
            raise Transient(f"reconcile failed: {type(exc).__name__}: {exc}") from exc
        self.readiness.record(True)
        return Answer(trigger, "reconciled", joined, report, followed=followed)

    def _follow(self, rec: Reconciler, report: Report, until: float) -> int:
        """Passes every ``follow_every`` seconds while moves are in flight, none starting after
        ``until`` less a period (``follow_clock``: a slow API server's long passes count); how
        many ran. A pass that fails ends the follow (the schedule goes on)."""
        most = int(max(0.0, until - self.follow_clock()) // self.follow_every)  # a bound whatever the clock
        passes = 0
        while report.in_flight and passes < most and self.follow_clock() + self.follow_every <= until:
            if passes == 0:
                log.info("moves in flight: following them", extra={"every": self.follow_every,
                                                                    "for": self.follow_seconds})  # fmt: skip
            self.follow_sleep(self.follow_every)
            passes += 1
            try:
                with self._lock:
                    report = rec.reconcile(trigger="follow")
            except Exception as exc:  # the delivery is done: a failed follow is the schedule's to repeat
                why = f"{type(exc).__name__}: {exc}"
                log.warning("a follow pass failed; the schedule goes on", extra={"error": why})
                break
        return passes

    def _whose(self, instance_id: str) -> tuple[instances.Owner, str]:
        with self._build_lock:
            if self._owner_wanted:
                self._owner_wanted = False
                try:
                    self._owner = instances.from_environment()
                except Exception as exc:  # boto3 missing or misconfigured: wait, as without the check
                    log.warning("no EC2 client: running instances are waited for", extra={"error": str(exc)})
            check = self._owner
        return check(instance_id) if check is not None else (instances.Owner.UNKNOWN, "not asked")

    def _wait_for_node(self, rec: Reconciler, trigger: Trigger) -> bool:
        deadline = time.monotonic() + self.join_wait
        while True:
            if self._ready(rec, trigger):
                return True
            if time.monotonic() + self.poll > deadline:
                log.info(
                    "the node has not joined (or is not Ready) yet: passing now, the next schedule picks it up",
                    extra=trigger.to_json(),
                )
                return False
            self.sleep(self.poll)

    @staticmethod
    def _ready(rec: Reconciler, trigger: Trigger) -> bool:
        if trigger.node:
            node = rec.kube.find(r.NODES, trigger.node)
            return node is not None and NodeView.from_json(node).ready and _has_ready(node)
        for raw in rec.kube.list(r.NODES):
            view = NodeView.from_json(raw)
            if view.provider_id.rsplit("/", 1)[-1] == trigger.instance_id:
                return view.ready and _has_ready(raw)
        return False


def _seconds(name: str, given: float | None, default: float) -> float:
    """``given``, else ``$name`` (0 to 600), else ``default`` (:func:`spotguard.gateway.settings.seconds`)."""
    if given is not None:
        return max(0.0, given)
    return settings.seconds(os.environ, name, default, 600.0, log)


def _has_ready(node: dict[str, Any]) -> bool:
    """A Ready condition that is True (a node with no conditions yet has not joined)."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


__all__ = ["Answer", "Service", "Transient", "triggers"]
