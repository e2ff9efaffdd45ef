"""Plain API objects for scenarios, tests and benchmarks.

Small keyword-argument builders for the objects a simulated cluster is loaded
with: nodes, namespaces, Deployments, ReplicaSets, StatefulSets,
PodDisruptionBudgets and HorizontalPodAutoscalers, as the JSON dicts the API
takes. A field is only written when the caller asks for it, so each caller gets
exactly the object it means.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

CAPACITY = "node.kubernetes.io/capacity"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
PAUSE = "registry.k8s.io/pause:3.10"


def instance_id(key: int | str) -> str:
    """An EC2 instance id: ``i-`` and 17 hex digits, from a number or (hex-encoded) from a node's name."""
    if isinstance(key, int):
        return f"i-{key:017x}"
    return "i-" + key.encode().hex()[:17].ljust(17, "0")


def provider_id(zone: str, instance: str) -> str:
    """The providerID an EKS node carries: ``aws:///<zone>/<instance id>``."""
    return f"aws:///{zone}/{instance}"


def node(
    name: str,
    capacity: str | None = None,
    *,
    zone: str | None = "us-east-1a",
    cpu: str = "16",
    memory: str = "64Gi",
    pods: str = "110",
    provider: str | None = None,
    labels: dict[str, str] | None = None,
    taints: list[Obj] | None = None,
    ready: bool = True,
    ready_reason: str | None = None,
) -> Obj:
    """A Node. ``capacity`` sets the ``node.kubernetes.io/capacity`` label, ``zone`` (None: no label)
    the zone label, ``provider`` the spec's providerID, ``taints`` the spec's taints (even empty);
    ``ready`` adds a Ready condition (with ``ready_reason`` as its reason)."""
    node_labels = {HOSTNAME: name}
    if zone is not None:
        node_labels[ZONE] = zone
    if capacity is not None:
        node_labels[CAPACITY] = capacity
    node_labels.update(labels or {})
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    obj: Obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}}
    spec: Obj = {}
    if provider is not None:
        spec["providerID"] = provider
    if taints is not None:
        spec["taints"] = taints
    if spec:
        obj["spec"] = spec
    status: Obj = {"capacity": dict(resources), "allocatable": dict(resources)}
    if ready:
        condition = {"type": "Ready", "status": "True"}
        if ready_reason is not None:
            condition["reason"] = ready_reason
        status["conditions"] = [condition]
    obj["status"] = status
    return obj


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def container(name: str = "main", image: str = PAUSE, *, cpu: str | None = "100m", memory: str | None = None) -> Obj:
    """A container; ``cpu`` and ``memory`` are its requests (None: not requested)."""
    obj: Obj = {"name": name, "image": image}
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    if requests:
        obj["resources"] = {"requests": requests}
    return obj


def pod_template(
    app: str, *, containers: list[Obj] | None = None, annotations: dict[str, str] | None = None, **spec: Any
) -> Obj:
    """A pod template labelled ``app=<app>``; ``spec`` adds pod spec fields (nodeSelector=..., ...)."""
    metadata: Obj = {"labels": {"app": app}}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {
        "metadata": metadata,
        "spec": {"containers": containers if containers is not None else [container()], **spec},
    }


def _metadata(name: str, namespace: str, annotations: dict[str, str] | None = None, uid: str | None = None) -> Obj:
    metadata: Obj = {"name": name, "namespace": namespace}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if uid is not None:
        metadata["uid"] = uid
    return metadata


def _workload(kind: str, metadata: Obj, replicas: int, template: Obj | None, **spec: Any) -> Obj:
    name = metadata["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template if template is not None else pod_template(name),
            **{k: v for k, v in spec.items() if v is not None},
        },
    }


def deployment(
    name: str,
    replicas: int,
    *,
    namespace: str = "default",
    template: Obj | None = None,
    annotations: dict[str, str] | None = None,
    uid: str | None = None,
    strategy: Obj | None = None,
) -> Obj:
    """A Deployment selecting ``app=<name>``; the template defaults to ``pod_template(name)``."""
    metadata = _metadata(name, namespace, annotations, uid)
    return _workload("Deployment", metadata, replicas, template, strategy=strategy or None)


def replicaset(name: str, replicas: int, *, namespace: str = "default", template: Obj | None = None) -> Obj:
    return _workload("ReplicaSet", _metadata(name, namespace), replicas, template)


def statefulset(
    name: str,
    replicas: int,
    *,
    namespace: str = "default",
    policy: str | None = None,
    template: Obj | None = None,
    annotations: dict[str, str] | None = None,
    uid: str | None = None,
) -> Obj:
    """A StatefulSet whose service is ``name``; ``policy`` is its podManagementPolicy (None: unset)."""
    metadata = _metadata(name, namespace, annotations, uid)
    return _workload("StatefulSet", metadata, replicas, template, serviceName=name, podManagementPolicy=policy)


def pdb(
    name: str,
    app: str,
    *,
    namespace: str = "default",
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
) -> Obj:
    """A PodDisruptionBudget selecting ``app=<app>``."""
    spec: Obj = {"selector": {"matchLabels": {"app": app}}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def hpa(
    name: str,
    target: str,
    min_replicas: int,
    max_replicas: int,
    *,
    namespace: str = "default",
    cpu_utilization: int | None = None,
) -> Obj:
    """An autoscaling/v2 HorizontalPodAutoscaler of the Deployment ``target``; ``cpu_utilization`` adds
    a CPU Utilization metric (None: no metrics)."""
    spec: Obj = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
    }
    if cpu_utilization is not None:
        spec["metrics"] = [
            {
                "type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": cpu_utilization}},
            }
        ]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def node_class(name: str = "default", *, discovery: str = "sim") -> Obj:
    """A ``karpenter.k8s.aws/v1`` EC2NodeClass as Karpenter's getting-started guide writes one
    (the NodePools below reference it by name)."""
    tags = [{"tags": {"karpenter.sh/discovery": discovery}}]
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name},
        "spec": {
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "role": f"KarpenterNodeRole-{discovery}",
            "subnetSelectorTerms": tags,
            "securityGroupSelectorTerms": tags,
        },
    }


def nodepool(
    name: str = "default",
    *,
    capacity_types: tuple[str, ...] = ("spot", "on-demand"),
    families: tuple[str, ...] = ("m5",),
    policy: str = "WhenEmpty",
    after: str = "30s",
    weight: int | None = None,
    limits: dict[str, str] | None = None,
    budgets: list[Obj] | None = None,
) -> Obj:
    """A ``karpenter.sh/v1`` NodePool of the EC2NodeClass ``default``: instance ``families``,
    ``capacity_types`` (empty: no capacity-type requirement, the label left undefined: see
    :func:`spotguard.policy.nodepools.spot_for`), consolidation ``policy`` after ``after``."""
    requirements: list[Obj] = []
    if capacity_types:
        requirements.append({"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(capacity_types)})
    requirements.append({"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": list(families)})
    spec: Obj = {
        "template": {
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": requirements,
            }
        },
        "disruption": {"consolidationPolicy": policy, "consolidateAfter": after},
    }
    if weight is not None:
        spec["weight"] = weight
    if limits is not None:
        spec["limits"] = limits
    if budgets is not None:
        spec["disruption"]["budgets"] = budgets
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec}
