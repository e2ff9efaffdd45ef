"""Small builders of nodes, pods, workloads and notices for the interruption tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from spotguard.policy.notices import Notice, NoticeKind
from spotguard.policy.views import NodeView, Owner, PodView
from spotguard.policy.workloads import SURGE, Kind, Workload

T0 = datetime(2026, 11, 25, 21, 0, tzinfo=UTC)


def node(name: str, capacity: str = "spot", instance: str | None = None, taints: list[Any] | None = None) -> NodeView:
    raw = {
        "metadata": {"name": name, "labels": {"node.kubernetes.io/capacity": capacity}},
        "spec": {"providerID": f"aws:///us-east-1a/{instance or 'i-' + name}", "taints": taints or []},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    return NodeView.from_json(raw)


def deployment(name: str, replicas: int, namespace: str = "shop", **annotations: str) -> Workload:
    return Workload(Kind.DEPLOYMENT, namespace, name, replicas, annotations, selector={"app": name})


def statefulset(name: str, replicas: int, namespace: str = "shop", **annotations: str) -> Workload:
    return Workload(Kind.STATEFULSET, namespace, name, replicas, annotations, selector={"app": name})


def pod(wl: Workload, index: int, node_name: str, ready: bool = True, terminating: bool = False) -> PodView:
    if wl.kind is Kind.DEPLOYMENT:
        owner = Owner("ReplicaSet", f"{wl.name}-abc12")
        labels = {"app": wl.name, "pod-template-hash": "abc12"}
        name = f"{wl.name}-abc12-{index:05d}"
    else:
        owner = Owner("StatefulSet", wl.name)
        labels = {"app": wl.name}
        name = f"{wl.name}-{index}"
    return PodView(
        namespace=wl.namespace,
        name=name,
        uid=f"uid-{wl.name}-{index}",
        labels=labels,
        owner=owner,
        node_name=node_name,
        phase="Running" if node_name else "Pending",
        ready=ready,
        terminating=terminating,
    )


def notice(
    instance: str, event_id: str = "ev-1", kind: NoticeKind = NoticeKind.INTERRUPTION, state: str = ""
) -> Notice:
    return Notice(event_id=event_id, kind=kind, instance_id=instance, time=T0, state=state, action="terminate")


def with_surge(wl: Workload, record_json: str) -> Workload:
    return Workload(
        wl.kind, wl.namespace, wl.name, wl.replicas, {**wl.annotations, SURGE: record_json}, wl.uid, wl.selector
    )
