"""Builders and waiting helpers for the controller tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> T:
    """Poll ``fn`` until it returns something truthy; fail after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    last: T = fn()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or fn}: last={last!r}")
        time.sleep(interval)
        last = fn()
    return last


def node(name: str, *, cpu: str = "4", memory: str = "16Gi", pods: str = "110", zone: str = "a",
         labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                              "topology.kubernetes.io/zone": zone, **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
                   "capacity": {"cpu": cpu, "memory": memory, "pods": pods}},
    }


def template(app: str, *, cpu: str = "100m", image: str = "nginx:1.27", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": image,
                                 "resources": {"requests": {"cpu": cpu}}}], **spec},
    }


def deployment(name: str, replicas: int, *, strategy: dict[str, Any] | None = None,
               **tmpl: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                            "template": template(name, **tmpl)}
    if strategy:
        spec["strategy"] = strategy
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def replicaset(name: str, replicas: int, **tmpl: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": template(name, **tmpl)}}


def statefulset(name: str, replicas: int, policy: str = "OrderedReady", **tmpl: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "serviceName": name, "podManagementPolicy": policy,
                     "selector": {"matchLabels": {"app": name}}, "template": template(name, **tmpl)}}


def pods_of(store: Any, app: str, namespace: str = "default") -> list[dict[str, Any]]:
    items, _ = store.list("pods", namespace=namespace, label_selector=f"app={app}")
    return list(items)


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def ready_pods(store: Any, app: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(store, app)
            if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
