"""Events the controllers and the scheduler record (``kubectl describe`` shows them).

Like client-go's event broadcaster (k8s.io/client-go/tools/record), recording
never blocks the caller: events go to a queue that one thread writes as core/v1
Events. Repeats of the same (object, type, reason, message) within
``AGGREGATE_SECONDS`` update ``count`` and ``lastTimestamp`` of one Event instead
of creating another, as the event correlator does.
https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/

The scheduler records as kube-scheduler does, through the events.k8s.io/v1 recorder
(k8s.io/client-go/tools/events): ``eventTime``, ``action``, ``reportingController``
``default-scheduler`` and ``reportingInstance`` ``default-scheduler-<host>``, no
deprecated count, source or timestamps; the second occurrence of an isomorphic event
(same object, action, reason and controller) within ``SERIES_SECONDS`` writes
``series.count`` 2, later ones are only counted (the recorder's heartbeat, every 30
minutes, is not modelled).
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from typing import Any

from spotguard_sim import errors

log = logging.getLogger("spotguard.sim.events")
AGGREGATE_SECONDS = 600.0  # the correlator's spam/aggregation window (10 minutes)
SERIES_SECONDS = 360.0  # tools/events finishTime: an isomorphic event series ends after 6 min
HOST = "sim-control-plane"
_STOP = object()


class Recorder:
    """``record(obj, "Normal", "Scheduled", "...", component="default-scheduler")``."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._seen: dict[tuple[str, str, str, str], tuple[str, str, float]] = {}
        # events.k8s.io recorders: isomorphic key -> [namespace, name, count, last seen]
        self._series: dict[tuple[str, str, str, str], list[Any]] = {}
        self._thread = threading.Thread(target=self._run, name="sim-events", daemon=True)
        self._thread.start()

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str, *,
               component: str, action: str | None = None) -> None:
        """Record a core/v1 Event; with ``action``, through the events.k8s.io/v1 recorder."""
        meta = obj.get("metadata") or {}
        involved = {"kind": obj.get("kind", ""), "apiVersion": obj.get("apiVersion", ""),
                    "name": meta.get("name", ""), "namespace": meta.get("namespace", ""),
                    "uid": meta.get("uid", ""), "resourceVersion": meta.get("resourceVersion", "")}
        self._queue.put((involved, type_, reason, message, component, action))

    def stop(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                involved, type_, reason, message, component, action = item
                self._write(involved, type_, reason, message, component=component, action=action)
            except errors.StatusError as exc:
                log.debug("event not recorded", extra={"error": str(exc)})
            except Exception:
                log.exception("event not recorded")

    def _write_v1(self, involved: dict[str, Any], type_: str, reason: str, message: str, *,
                  component: str, action: str) -> None:
        from spotguard_sim import eventsapi

        ns = involved["namespace"] or "default"
        now = self.store.clock.now()
        micro = self.store.clock.iso_micro(now)
        key = (str(involved["uid"]), action, reason, component)
        seen = self._series.get(key)
        if seen is not None and now - seen[3] < SERIES_SECONDS:
            seen[2] += 1
            seen[3] = now
            if seen[2] == 2:  # the first repeat is written at once; later ones at the heartbeat
                def series(event: dict[str, Any]) -> None:
                    event["series"] = {"count": 2, "lastObservedTime": micro}

                try:
                    self.store.mutate("events", seen[1], seen[0], series)
                    return
                except errors.NotFound:
                    pass
            else:
                return
        name = f"{involved['name']}.{secrets.token_hex(8)}"
        self.store.create("events", eventsapi.to_core({
            "metadata": {"name": name, "namespace": ns},
            "regarding": {k: v for k, v in involved.items() if v},
            "eventTime": micro, "type": type_, "reason": reason, "action": action,
            "note": message[:eventsapi.NOTE_LIMIT], "reportingController": component,
            "reportingInstance": f"{component}-{HOST}",
        }), namespace=ns)
        if len(self._series) > 50_000:
            self._series.clear()
        self._series[key] = [ns, name, 1, now]

    def _write(self, involved: dict[str, Any], type_: str, reason: str, message: str, *,
               component: str, action: str | None = None) -> None:
        if action is not None:
            self._write_v1(involved, type_, reason, message, component=component, action=action)
            return
        ns = involved["namespace"] or "default"
        now = self.store.clock.now()
        iso = self.store.clock.iso(now)
        key = (str(involved["uid"]), type_, reason, message)
        seen = self._seen.get(key)
        if seen is not None and now - seen[2] < AGGREGATE_SECONDS:
            def bump(event: dict[str, Any]) -> None:
                event["count"] = int(event.get("count") or 1) + 1
                event["lastTimestamp"] = iso

            try:
                self.store.mutate("events", seen[1], seen[0], bump)
                self._seen[key] = (seen[0], seen[1], seen[2])
                return
            except errors.NotFound:
                pass
        name = f"{involved['name']}.{secrets.token_hex(8)}"
        self.store.create("events", {
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {k: v for k, v in involved.items() if v},
            "type": type_, "reason": reason, "message": message,
            "source": {"component": component},
            "reportingComponent": component, "reportingInstance": component,
            "firstTimestamp": iso, "lastTimestamp": iso, "count": 1,
            "eventTime": None,
        }, namespace=ns)
        if len(self._seen) > 50_000:
            self._seen.clear()
        self._seen[key] = (ns, name, now)
