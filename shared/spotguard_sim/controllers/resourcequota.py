"""The resource quota controller (``pkg/controller/resourcequota``): each ResourceQuota's
status carries its ``hard`` limits and the namespace's ``used`` of each, recalculated
whenever a quota or an object it counts changes (replenishment) and on a resync.
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard_sim import errors, quota
from spotguard_sim.controllers import base


class ResourceQuotaController(base.Controller):
    name = "resourcequota-controller"
    primary = "resourcequotas"
    resync_seconds = 300.0  # --resource-quota-sync-period

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        ns = obj.get("metadata", {}).get("namespace")
        if ns and (resource == "resourcequotas" or self.store.count_in("resourcequotas", ns)):
            self.queue.add_coalesced(("", ns))

    def resync(self) -> None:
        for q in self.store.list("resourcequotas")[0]:
            self.queue.add(("", q["metadata"]["namespace"]))

    def sync(self, key: Any) -> None:
        _, ns = key
        now = self.clock.now()
        for item in self.store.list("resourcequotas", ns)[0]:
            hard = (item.get("spec") or {}).get("hard") or {}
            used = quota.namespace_usage(hard, lambda plural: self.store.list(plural, ns)[0], now)
            status = {"hard": dict(hard),
                      "used": {k: quota.render(k, used.get(k, 0), hard[k]) for k in hard if k in used}}
            if item.get("status") == status:
                continue

            def write(obj: dict[str, Any], status: dict[str, Any] = status) -> None:
                obj["status"] = status

            with contextlib.suppress(errors.NotFound):
                self.store.mutate("resourcequotas", item["metadata"]["name"], ns, write)
