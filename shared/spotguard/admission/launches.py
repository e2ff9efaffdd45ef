"""Can an on-demand node be launched for a pod? The I/O half of ``policy.nodepools``.

``SPOTGUARD_ON_DEMAND_LAUNCHABLE`` (``Config.on_demand_launchable``):

* ``auto`` (default): Karpenter's NodePools (``karpenter.sh/v1``) decide where they can
  be read; otherwise (no Karpenter CRD: 404; the read forbidden: 403; the API failing)
  the existing nodes decide, as before, with a log line when that changes;
* ``true``: a node autoscaler can launch on-demand capacity (a Cluster Autoscaler
  on-demand node group, which no API lists: its labels live in the Auto Scaling group's
  ``k8s.io/cluster-autoscaler/node-template/label/...`` tags, cluster-autoscaler FAQ.md
  "How can I scale a node group to 0?") for any pod whose own
  node requirements name only well-known labels (a pin to a custom label, such as a
  node group's name, may hold it to a spot group: the existing nodes decide for it);
* ``false``: only the existing nodes decide.

The NodePool list is cached (``ttl`` seconds); a failed read is tried again after
``ttl`` and never blocks a review: the last list (or "unknown": the existing nodes
decide) is used meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.policy import nodepools, patches
from spotguard.policy.config import Config, Launchable
from spotguard.policy.views import PodView

log = logging.getLogger(__name__)
TTL_SECONDS = 30.0
SETTING = "SPOTGUARD_ON_DEMAND_LAUNCHABLE"


class Launches:
    def __init__(self, kube: Any, *, clock: Callable[[], float] = time.monotonic, ttl: float = TTL_SECONDS) -> None:
        self.kube = kube
        self.clock = clock
        self.ttl = ttl
        self._lock = threading.Lock()
        self._pools: list[nodepools.NodePool] | None = None
        self._read_at = -1e18
        self._state = ""  # what the last read found, for logging changes only

    def pools(self, max_age: float | None = None) -> list[nodepools.NodePool] | None:
        """The NodePools (cached), or None when they cannot be read (no Karpenter, forbidden)."""
        with self._lock:
            if self.clock() - self._read_at <= (self.ttl if max_age is None else max_age):
                return self._pools
            self._read_at = self.clock()
            try:
                raw = self.kube.list(r.NODEPOOLS)
            except kube_mod.NotFound:
                self._pools = None
                self._changed("absent", "no Karpenter NodePool API (404): the existing nodes decide where "
                              f"on-demand floors go ({SETTING}=true if a Cluster Autoscaler can launch on-demand)")
            except kube_mod.Forbidden as exc:
                self._pools = None
                self._changed("forbidden", "reading Karpenter NodePools is forbidden (403): the existing nodes "
                              "decide where on-demand floors go; grant list on karpenter.sh nodepools",
                              error=str(exc)[:200])
            except Exception as exc:  # keep the last list; the existing nodes decide if there is none
                self._changed("failing", "reading Karpenter NodePools failed; using the last list",
                              error=f"{type(exc).__name__}: {str(exc)[:200]}")
            else:
                self._pools = [nodepools.NodePool.from_json(p) for p in raw]
                self._changed("read", "Karpenter NodePools read", count=len(self._pools))
            return self._pools

    def _changed(self, state: str, message: str, **extra: Any) -> None:
        if state == self._state:
            return
        self._state = state
        (log.info if state == "read" else log.warning)(message, extra=extra)

    def for_pod(self, pod: PodView, config: Config) -> str | None:
        """What can launch an on-demand node this pod could run on (in words), or None."""
        setting = config.on_demand_launchable
        if setting is Launchable.FALSE:
            return None
        if setting is Launchable.TRUE:
            if any(nodepools.compatible({}, term) for term in nodepools.pod_terms(pod)):
                return f"{SETTING}=true"
            return None
        pools = self.pools()
        if not pools:
            return None
        name = nodepools.on_demand_for(pod, pools, patches.on_demand_terms(config))
        return None if name is None else f"NodePool {name}"

    def cluster_wide(self, config: Config) -> str | None:
        """What can launch on-demand capacity for some pod (in words), or None."""
        setting = config.on_demand_launchable
        if setting is Launchable.FALSE:
            return None
        if setting is Launchable.TRUE:
            return f"{SETTING}=true"
        pools = self.pools()
        names = sorted(p.name for p in pools or () if p.launches and p.allows(nodepools.ON_DEMAND))
        return f"NodePool {', '.join(names)}" if names else None
