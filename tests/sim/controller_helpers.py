"""Builders and waiting helpers for the controller tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from spotguard_sim import objects

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
    return objects.node(name, zone=zone, cpu=cpu, memory=memory, pods=pods, labels=labels,
                        taints=taints or [], ready=False)


def template(app: str, *, cpu: str = "100m", image: str = "nginx:1.27", **spec: Any) -> dict[str, Any]:
    return objects.pod_template(app, containers=[objects.container("c", image, cpu=cpu)], **spec)


def deployment(name: str, replicas: int, *, strategy: dict[str, Any] | None = None,
               **tmpl: Any) -> dict[str, Any]:
    return objects.deployment(name, replicas, template=template(name, **tmpl), strategy=strategy)


def replicaset(name: str, replicas: int, **tmpl: Any) -> dict[str, Any]:
    return objects.replicaset(name, replicas, template=template(name, **tmpl))


def statefulset(name: str, replicas: int, policy: str = "OrderedReady", **tmpl: Any) -> dict[str, Any]:
    return objects.statefulset(name, replicas, template=template(name, **tmpl), policy=policy)


def pods_of(store: Any, app: str, namespace: str = "default") -> list[dict[str, Any]]:
    items, _ = store.list("pods", namespace=namespace, label_selector=f"app={app}")
    return list(items)


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def ready_pods(store: Any, app: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(store, app)
            if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
