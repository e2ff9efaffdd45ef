"""An in-memory stand-in for ``spotguard.gateway.kube.Kube`` (the project's own API wrapper).

Objects live in a dict; writes bump ``resourceVersion`` and a ``replace`` with a
stale one raises :class:`kube.Conflict`, like kube-apiserver. Thread-safe, so
several admission contexts (standing in for processes) can race on one Lease.
Used for the core's unit tests; the end-to-end tests use the simulated cluster.
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from typing import Any

from spotguard.gateway import kube, stats
from spotguard.gateway import resources as r

Obj = dict[str, Any]


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        self.lock = threading.Lock()
        self.version = itertools.count(1)
        self.stats = stats.Stats()
        self.events: list[Obj] = []
        self.fail: type[kube.ApiError] | None = None  # every request raises this when set

    def with_policy(self, policy: Any) -> FakeKube:
        return self

    def _record(self, verb: str, res: r.Resource) -> None:
        self.stats.record(verb, res.name, 200)
        if self.fail is not None:
            raise self.fail(503, "ServiceUnavailable", "injected")

    # -- helpers for tests ------------------------------------------------------------------

    def put(self, res: r.Resource, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(self.version))
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        self.objects[(res.plural, meta.get("namespace") if res.namespaced else None, meta["name"])] = obj
        return obj

    def all(self, res: r.Resource, namespace: str | None = None) -> list[Obj]:
        return [
            copy.deepcopy(o)
            for (plural, ns, _), o in self.objects.items()
            if plural == res.plural and (namespace is None or ns == namespace)
        ]

    # -- the Kube surface the admission uses ----------------------------------------------

    def get(self, res: r.Resource, name: str, namespace: str | None = None) -> Obj:
        with self.lock:
            self._record("get", res)
            obj = self.objects.get((res.plural, namespace if res.namespaced else None, name))
            if obj is None:
                raise kube.NotFound(404, "NotFound", f"{res.plural} {name} not found")
            return copy.deepcopy(obj)

    def find(self, res: r.Resource, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.get(res, name, namespace)
        except kube.NotFound:
            return None

    def list(
        self,
        res: r.Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        with self.lock:
            self._record("list", res)
            wanted = dict(p.split("=", 1) for p in (label_selector or "").split(",") if p)
            out = []
            for o in self.all(res, namespace if res.namespaced else None):
                labels = (o.get("metadata") or {}).get("labels") or {}
                if all(labels.get(k) == v for k, v in wanted.items()):
                    out.append(o)
            return out

    def create(self, res: r.Resource, obj: Obj, namespace: str | None = None, dry_run: bool = False) -> Obj:
        with self.lock:
            self._record("create", res)
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if namespace:
                meta["namespace"] = namespace
            key = (res.plural, meta.get("namespace") if res.namespaced else None, meta.get("name", ""))
            if key in self.objects:
                raise kube.AlreadyExists(409, "AlreadyExists", f"{key} exists")
            return copy.deepcopy(self.put(res, obj))

    def replace(self, res: r.Resource, obj: Obj, dry_run: bool = False) -> Obj:
        with self.lock:
            self._record("update", res)
            meta = obj.get("metadata") or {}
            key = (res.plural, meta.get("namespace") if res.namespaced else None, meta.get("name", ""))
            current = self.objects.get(key)
            if current is None:
                raise kube.NotFound(404, "NotFound", f"{key} not found")
            if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise kube.Conflict(409, "Conflict", "the object has been modified")
            obj = copy.deepcopy(obj)
            obj["metadata"]["uid"] = current["metadata"]["uid"]
            return copy.deepcopy(self.put(res, obj))

    def create_event(
        self,
        involved_object: Obj,
        reason: str,
        message: str,
        type: str = "Normal",
        component: str = "spotguard",
        **kw: Any,
    ) -> Obj:
        with self.lock:
            self._record("create", r.EVENTS)
            event = {
                "involvedObject": involved_object.get("metadata", {}).get("name"),
                "reason": reason,
                "message": message,
                "type": type,
            }
            self.events.append(event)
            return event
