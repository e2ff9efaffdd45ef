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
from spotguard.gateway.errors import ApiError
from spotguard.nodeadded import instances, metrics, triggers
from spotguard.nodeadded.reconciler import Reconciler, Report
from spotguard.nodeadded.triggers import Kind, Trigger
from spotguard.policy.views import NodeView

log = logging.getLogger("spotguard.nodeadded")

DEFAULT_JOIN_WAIT = 60.0


class Transient(RuntimeError):
    """The pass could not run (the API server unreachable): deliver the trigger again."""


@dataclass(frozen=True)
class Answer:
    trigger: Trigger
    result: str  # reconciled, ignored, foreign
    joined: bool | None = None
    report: Report | None = None
    reason: str = ""

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
    ) -> None:
        """``owner``: whose cluster a running instance is (True: from the environment, built on
        first use; None or False: never asked, every running instance is waited for)."""
        self._build = build
        self._owner_wanted = owner is True
        self._owner: instances.Check | None = owner if callable(owner) else None
        self._reconciler: Reconciler | None = None
        if join_wait is None:
            join_wait = float(os.environ.get("SPOTGUARD_NODE_JOIN_WAIT_SECONDS") or DEFAULT_JOIN_WAIT)
        self.join_wait = join_wait
        self.poll = poll
        self.sleep = sleep
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
            rec = self.reconciler
            joined = None
            if trigger.kind in (Kind.NODE_ADDED, Kind.INSTANCE_RUNNING):
                joined = self._wait_for_node(rec, trigger)
            with self._lock:
                report = rec.reconcile(dry_run=dry_run, trigger=str(trigger.kind))
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
        return Answer(trigger, "reconciled", joined, report)

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


def _has_ready(node: dict[str, Any]) -> bool:
    """A Ready condition that is True (a node with no conditions yet has not joined)."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


__all__ = ["Answer", "Service", "Transient", "triggers"]
