"""Small builders of Kubernetes objects (plain dicts, as the API returns them) for policy tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spotguard.policy.views import NodeView, PodView

CAPACITY_LABEL = "node.kubernetes.io/capacity"


def node_json(
    name: str,
    capacity: str | None = "spot",
    *,
    cpu: str = "4",
    memory: str = "16Gi",
    pods: int | None = 110,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    ready: bool = True,
    labels: Mapping[str, str] | None = None,
    zone: str = "eu-west-1a",
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}
    if capacity is not None:
        all_labels[CAPACITY_LABEL] = capacity
    all_labels.update(labels or {})
    allocatable: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if pods is not None:
        allocatable["pods"] = str(pods)
    spec: dict[str, Any] = {"providerID": f"aws:///{zone}/i-{abs(hash(name)) % 10**12:012x}"}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node(name: str, capacity: str | None = "spot", **kw: Any) -> NodeView:
    return NodeView.from_json(node_json(name, capacity, **kw))


def pod_json(
    name: str = "web-abc12",
    namespace: str = "shop",
    *,
    owner: tuple[str, str] | None = ("ReplicaSet", "web-7d9f"),
    node_name: str | None = None,
    cpu: str | None = "100m",
    memory: str | None = "128Mi",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    ready: bool = True,
    phase: str | None = None,
    uid: str | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    container: dict[str, Any] = {"name": "app", "image": "nginx:1.27"}
    if requests:
        container["resources"] = {"requests": requests}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": dict(labels if labels is not None else {"app": "web"}),
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": f"uid-{owner[1]}",
                "controller": True,
            }
        ]
    body: dict[str, Any] = {"containers": [container]}
    body.update(spec or {})
    if node_name:
        body["nodeName"] = node_name
    status: dict[str, Any] = {"phase": phase or ("Running" if node_name else "Pending")}
    if node_name:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body, "status": status}


def pod(name: str = "web-abc12", namespace: str = "shop", **kw: Any) -> PodView:
    return PodView.from_json(pod_json(name, namespace, **kw))


def required(*terms: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A spec fragment with a required node affinity made of these terms (lists of expressions)."""
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]
                }
            }
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out
