"""The aggregator's APIService availability controllers (kube-aggregator
``pkg/controllers/status/local`` and ``remote``): each APIService's ``Available``
condition, set again when the APIService or the service it names changes, and on a
resync. A local APIService is Available; a service-backed one never is here, since no
aggregated API server runs (``spotguard_sim.apiregistration.available`` says why).
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard_sim import apiregistration, errors
from spotguard_sim.controllers import base


class AvailableConditionController(base.Controller):
    name = "apiservice-availability-controller"
    primary = "apiservices"
    resync_seconds = 30.0  # the remote controller's informer resync

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "apiservices" and event_type != "DELETED":
            self.queue.add(base.key_of(obj))
        elif resource == "services":
            meta = obj.get("metadata") or {}
            target = (meta.get("namespace"), meta.get("name"))
            for apiservice in self.store.list("apiservices")[0]:
                ref = (apiservice.get("spec") or {}).get("service") or {}
                if (ref.get("namespace"), ref.get("name")) == target:
                    self.queue.add(base.key_of(apiservice))

    def resync(self) -> None:
        for apiservice in self.store.list("apiservices")[0]:
            self.queue.add(base.key_of(apiservice))

    def sync(self, key: Any) -> None:
        _, name = key
        try:
            apiservice = self.store.get("apiservices", name)
        except errors.NotFound:
            return
        ref = (apiservice.get("spec") or {}).get("service")
        service = None
        if ref:
            with contextlib.suppress(errors.NotFound):
                service = self.store.get("services", ref.get("name", ""), ref.get("namespace", ""))
        status, reason, message = apiregistration.available(apiservice, service)
        now = self.clock.iso()

        def write(obj: dict[str, Any]) -> None:
            apiregistration.set_available(obj, status, reason, message, now)

        with contextlib.suppress(errors.NotFound):
            self.write("apiservices", name, None, write)
