"""The ServiceAccount controller (pkg/controller/serviceaccount): every namespace
gets a ServiceAccount named ``default`` soon after it is created.
https://kubernetes.io/docs/concepts/security/service-accounts/#default-service-accounts
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard_sim import errors
from spotguard_sim.controllers import base

DEFAULT = "default"


class ServiceAccountsController(base.Controller):
    name = "serviceaccount-controller"
    primary = "namespaces"
    resync_seconds = 300.0

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "namespaces" and event_type != "DELETED":
            self.queue.add(base.key_of(obj))
        elif resource == "serviceaccounts" and event_type == "DELETED" and \
                obj["metadata"].get("name") == DEFAULT:
            self.queue.add(("", obj["metadata"].get("namespace", "")))

    def resync(self) -> None:
        for ns in self.store.list("namespaces")[0]:
            self.queue.add(base.key_of(ns))

    def sync(self, key: Any) -> None:
        _, ns = key
        try:
            namespace = self.store.get("namespaces", ns)
        except errors.NotFound:
            return
        if namespace["metadata"].get("deletionTimestamp"):
            return
        with contextlib.suppress(errors.AlreadyExists, errors.NotFound, errors.Forbidden):
            self.store.create("serviceaccounts", {"metadata": {"name": DEFAULT}}, namespace=ns)
