"""Can this process do its job? The readiness of spot-interruption and node-added.

Liveness (``/healthz``, ``/health/liveness``) is the process alone: it answers.
Readiness (``/readyz``, ``/health/readiness``, func-python's ``ready()``) is the
function's own ability to do its job. Not ready:

* while this process has never reached the cluster: a probe reads spotguard's
  settings ConfigMap (any answer from the API server, a 404 included, is
  reached; no answer, 401 or 403 is not), at most every :data:`PROBE_SECONDS`;
* while its last :data:`FAILURES` attempts at its job all failed (a notice
  handling or a reconcile; a node-added pass). The probe then runs again (at
  most every :data:`RETRY_SECONDS`): once the cluster answers, the next attempt
  is let through, so a process that gets work only while ready (Knative) is not
  kept out for good by an outage that is over.

The admission webhook has its own rules (:mod:`spotguard.admission.health`):
it is never taken out of service for a condition of the whole cluster.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

FAILURES = 3
PROBE_SECONDS = 5.0
RETRY_SECONDS = 30.0


class Readiness:
    """Thread-safe: the transports record each attempt, the probes ask :meth:`check`."""

    def __init__(self, probe: Callable[[], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.probe = probe
        self.clock = clock
        self._lock = threading.Lock()
        self._recent: deque[bool] = deque(maxlen=FAILURES)
        self._reached = False
        self._probed: float | None = None
        self._why = ""  # the last failure or probe error

    def record(self, ok: bool, reason: str = "") -> None:
        """One attempt at the job: ``ok`` (then the cluster was reached), or why it failed."""
        with self._lock:
            self._recent.append(ok)
            if ok:
                self._reached = True
            else:
                self._why = reason or "failed"

    def check(self) -> str | None:
        """None when ready, else why not (a sentence for the probe's body and the logs)."""
        with self._lock:
            if not self._reached:
                if self._probe_due(PROBE_SECONDS) and self._probe_answers():
                    self._reached = True
                else:
                    return f"the cluster was never reached: {self._why or 'not tried yet'}"
            if len(self._recent) == FAILURES and not any(self._recent):
                if self._probe_due(RETRY_SECONDS) and self._probe_answers():
                    self._recent.clear()  # the cluster answers again: let the next attempt show
                    return None
                return f"the last {FAILURES} attempts failed: {self._why}"
            return None

    def _probe_due(self, every: float) -> bool:
        now = self.clock()
        if self._probed is not None and now - self._probed < every:
            return False
        self._probed = now
        return True

    def _probe_answers(self) -> bool:
        try:
            self.probe()
        except Exception as exc:
            self._why = f"{type(exc).__name__}: {str(exc)[:300]}"
            return False
        return True


def cluster_probe(kube: Any) -> Callable[[], None]:
    """One read of spotguard's settings ConfigMap, short timeouts and no retry (a 404 is an answer)."""
    from spotguard.gateway import resources, retry, settings

    quick = kube.with_policy(retry.Policy(attempts=1, deadline=3.0, timeout=3.0, connect_timeout=2.0))
    source = settings.Source.from_env(os.environ)

    def probe() -> None:
        quick.find(resources.CONFIGMAPS, source.name, source.namespace)

    return probe
