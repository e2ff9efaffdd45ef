"""Scenarios for the interruption end-to-end tests and benchmark: a mixed cluster of
on-demand and spot nodes, Deployments and StatefulSets, as plain API objects."""

from __future__ import annotations

from typing import Any

CAPACITY = "node.kubernetes.io/capacity"
Obj = dict[str, Any]


def node(name: str, capacity: str, *, cpu: str = "16", pods: str = "110", zone: str = "us-east-1a") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                CAPACITY: capacity,
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": zone,
            },
        },
        "spec": {"providerID": f"aws:///{zone}/{instance_id(name)}"},
        "status": {
            "capacity": {"cpu": cpu, "memory": "64Gi", "pods": pods},
            "allocatable": {"cpu": cpu, "memory": "64Gi", "pods": pods},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def instance_id(node_name: str) -> str:
    return "i-" + node_name.encode().hex()[:17].ljust(17, "0")


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _template(app: str, cpu: str = "100m") -> Obj:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": cpu}}}
            ]
        },
    }


def deployment(name: str, replicas: int, ns: str = "shop", **annotations: str) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "annotations": dict(annotations)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": _template(name),
        },
    }


def statefulset(name: str, replicas: int, ns: str = "shop") -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": _template(name),
        },
    }


def pdb(name: str, app: str, ns: str = "shop", **spec: Any) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": app}}, **spec},
    }


def hpa(name: str, target: str, min_replicas: int, max_replicas: int, ns: str = "shop") -> Obj:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }


def mixed_nodes(on_demand: int = 3, spot: int = 6) -> list[Obj]:
    """The end-to-end cluster's namespace and nodes."""
    objs: list[Obj] = [namespace("shop")]
    objs += [node(f"od-{i}", "on-demand") for i in range(on_demand)]
    objs += [node(f"spot-{i}", "spot", cpu="8") for i in range(spot)]
    return objs


def mixed_workloads() -> list[Obj]:
    """A mix of workloads: many replicas and one, a user budget, an autoscaler, StatefulSets."""
    return [
        deployment("web", 6),
        pdb("web", "web", maxUnavailable=1),  # the user's own budget: no second one
        deployment("api", 3),
        hpa("api", "api", 3, 6),
        deployment("cart", 4, **{"spotguard.io/min-on-demand": "50%"}),
        deployment("single", 1),
        deployment("lonely", 1),
        deployment("solo", 1, **{"spotguard.io/min-on-demand": "0"}),  # a single replica on spot
        deployment("worker", 8),
        statefulset("db", 3),
        statefulset("queue", 5),
    ]
