"""Scenario files: ordinary Kubernetes YAML (multi-document, or a ``kind: List``).

A scenario may hold a ``kind: Settings`` document (``apiVersion:
sim.spotguard.io/v1``, see :mod:`spotguard_sim.settings`): the timings of the
simulated control plane. It may also hold ``kind: Generate`` documents (``apiVersion:
sim.spotguard.io/v1``) that expand at load time into many nodes and workloads,
so a 1,000-node cluster fits in a few lines:

    apiVersion: sim.spotguard.io/v1
    kind: Generate
    metadata: {name: large}
    nodes:
    - {count: 700, namePrefix: spot-, capacity: spot, zones: [us-east-1a, us-east-1b],
       instanceType: m5.xlarge, allocatable: {cpu: "4", memory: 16Gi, pods: "110"}}
    workloads:
    - {count: 100, kind: Deployment, namePrefix: web-, namespaces: [shop],
       replicas: 20, requests: {cpu: 100m, memory: 128Mi}}

Node groups: ``count``, ``namePrefix``, ``capacity`` (spot | on-demand: sets
``node.kubernetes.io/capacity`` and ``karpenter.sh/capacity-type``), ``zones``
(round robin; ``topology.kubernetes.io/zone``), ``instanceType``,
``allocatable``, ``labels``, ``taints``. Each node gets an
``aws:///<zone>/i-...`` providerID derived from its name. Workload groups:
``count``, ``kind`` (Deployment | StatefulSet), ``namePrefix``, ``namespaces``
(round robin; created when missing), ``replicas``, ``requests``, ``labels``,
``annotations``, ``podAnnotations`` (on the pod template: ``sim.spotguard.io/readiness-flaps``
makes the pods' readiness flap, :mod:`spotguard_sim.controllers.kubelet`), ``pdb`` (a
PodDisruptionBudget spec without selector).
``systemDaemonSets: true`` adds the DaemonSets every node of a real cluster runs
(``system_daemonsets()``: CNI, kube-proxy, CSI node plugin, log agent).
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from spotguard.logs import UserError

from spotguard_sim import nodestatus

GENERATE_API = "sim.spotguard.io/v1"
Obj = dict[str, Any]


def load(source: str | os.PathLike[str] | Iterable[Mapping[str, Any]]) -> list[Obj]:
    """The objects of a scenario: a path to YAML, or an iterable of dicts."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise UserError(f"cannot read scenario {path}: {exc}") from exc
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise UserError(f"scenario {path} is not valid YAML: {exc}") from exc
        return flatten(docs, str(path))
    return flatten(list(source), "scenario")


def flatten(docs: list[Any], where: str) -> list[Obj]:
    out: list[Obj] = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise UserError(f"{where}: document {index + 1} is not a mapping")
        if doc.get("kind") == "Generate" and doc.get("apiVersion") == GENERATE_API:
            out.extend(generate(doc, f"{where}: document {index + 1}"))
            continue
        if str(doc.get("kind", "")).endswith("List") and "items" in doc:
            out.extend(flatten(list(doc.get("items") or []), where))
            continue
        if not doc.get("kind") or not doc.get("apiVersion"):
            raise UserError(f"{where}: document {index + 1} has no kind or apiVersion")
        out.append(_as_registered(dict(doc)))
    return _with_namespaces(out)


def _as_registered(obj: Obj) -> Obj:
    """A Node as its kubelet registers it: the status fields a kubelet reports, filled."""
    if obj.get("kind") == "Node" and obj.get("apiVersion") == "v1" and isinstance(obj.get("metadata"), Mapping):
        obj = copy.deepcopy(obj)
        nodestatus.fill(obj)
    return obj


def _with_namespaces(objs: list[Obj]) -> list[Obj]:
    """Add Namespace objects for namespaces used but not declared (kube-system and co exist)."""
    declared = {o["metadata"]["name"] for o in objs if o.get("kind") == "Namespace"}
    used = []
    for o in objs:
        ns = (o.get("metadata") or {}).get("namespace")
        if ns and ns not in declared and ns not in used:
            used.append(ns)
    builtin = {"default", "kube-system", "kube-public", "kube-node-lease"}
    extra = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
             for ns in used if ns not in builtin]
    return extra + objs


def instance_id(name: str) -> str:
    return "i-0" + hashlib.sha256(name.encode()).hexdigest()[:16]


def _int(group: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = group.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UserError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


def _daemonset(name: str, image: str, requests: list[dict[str, str]], *, host_network: bool,
               labels: dict[str, str], tolerate_all: bool = True) -> Obj:
    containers = [{"name": name if i == 0 else f"{name}-{i}", "image": image,
                   "resources": {"requests": dict(r)}} for i, r in enumerate(requests)]
    spec: Obj = {"priorityClassName": "system-node-critical", "containers": containers}
    if host_network:
        spec["hostNetwork"] = True
    if tolerate_all:
        spec["tolerations"] = [{"operator": "Exists"}]
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "kube-system", "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": dict(labels)}, "spec": spec},
        },
    }


def system_daemonsets() -> list[Obj]:
    """The DaemonSets of an EKS node (requests as their default manifests and charts set
    them): the VPC CNI, kube-proxy, the EBS CSI node plugin (three containers) and a log
    agent; they take 195m CPU, 290Mi and 4 pod slots of every node."""
    return [
        _daemonset("aws-node", "602401143452.dkr.ecr.us-east-1.amazonaws.com/amazon-k8s-cni:v1.19.2",
                   [{"cpu": "25m"}], host_network=True, labels={"k8s-app": "aws-node"}),
        _daemonset("kube-proxy", "602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/kube-proxy:v1.35.0",
                   [{"cpu": "100m"}], host_network=True, labels={"k8s-app": "kube-proxy"}),
        _daemonset("ebs-csi-node", "public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver:v1.41.0",
                   [{"cpu": "10m", "memory": "40Mi"}] * 3, host_network=False,
                   labels={"app": "ebs-csi-node"}),
        _daemonset("fluent-bit", "public.ecr.aws/aws-observability/aws-for-fluent-bit:2.32.5",
                   [{"cpu": "40m", "memory": "170Mi"}], host_network=False,
                   labels={"k8s-app": "fluent-bit"}),
    ]


def generate(doc: Mapping[str, Any], where: str) -> list[Obj]:
    out: list[Obj] = []
    if doc.get("systemDaemonSets"):
        out.extend(system_daemonsets())
    for gi, group in enumerate(doc.get("nodes") or []):
        here = f"{where}: nodes[{gi}]"
        if not isinstance(group, Mapping):
            raise UserError(f"{here} is not a mapping")
        count = _int(group, "count", here)
        prefix = str(group.get("namePrefix") or f"node-{gi}-")
        capacity = str(group.get("capacity", "on-demand"))
        if capacity not in ("spot", "on-demand"):
            raise UserError(f"{here}: capacity must be spot or on-demand, got {capacity!r}")
        zones = list(group.get("zones") or ["us-east-1a"])
        instance_type = str(group.get("instanceType", "m5.xlarge"))
        allocatable = dict(group.get("allocatable") or {"cpu": "4", "memory": "16Gi",
                                                          "pods": "110"})
        for i in range(count):
            name = f"{prefix}{i:04d}"
            zone = str(zones[i % len(zones)])
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/region": zone[:-1],
                "node.kubernetes.io/instance-type": instance_type,
                "node.kubernetes.io/capacity": capacity,
                "karpenter.sh/capacity-type": capacity,
                **{str(k): str(v) for k, v in (group.get("labels") or {}).items()},
            }
            node: Obj = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"providerID": f"aws:///{zone}/{instance_id(name)}"},
                "status": {"capacity": dict(allocatable), "allocatable": dict(allocatable),
                           "nodeInfo": {"kubeletVersion": "v1.35.0",
                                        "containerRuntimeVersion": "containerd://2.1.4",
                                        "osImage": "Amazon Linux 2023",
                                        "operatingSystem": "linux", "architecture": "amd64"}},
            }
            if group.get("taints"):
                node["spec"]["taints"] = list(group["taints"])
            out.append(nodestatus.fill(node))
    for gi, group in enumerate(doc.get("workloads") or []):
        here = f"{where}: workloads[{gi}]"
        if not isinstance(group, Mapping):
            raise UserError(f"{here} is not a mapping")
        count = _int(group, "count", here)
        kind = str(group.get("kind", "Deployment"))
        if kind not in ("Deployment", "StatefulSet"):
            raise UserError(f"{here}: kind must be Deployment or StatefulSet, got {kind!r}")
        prefix = str(group.get("namePrefix") or f"app-{gi}-")
        namespaces = list(group.get("namespaces") or ["default"])
        replicas = _int(group, "replicas", here, 1)
        requests = dict(group.get("requests") or {"cpu": "100m", "memory": "128Mi"})
        for i in range(count):
            name = f"{prefix}{i:04d}"
            ns = str(namespaces[i % len(namespaces)])
            labels = {"app": name, **{str(k): str(v) for k, v in (group.get("labels") or {}).items()}}
            workload: Obj = {
                "apiVersion": "apps/v1", "kind": kind,
                "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {"containers": [{
                            "name": "app", "image": str(group.get("image", "nginx:1.27")),
                            "resources": {"requests": dict(requests)},
                        }]},
                    },
                },
            }
            if group.get("annotations"):
                workload["metadata"]["annotations"] = {
                    str(k): str(v) for k, v in group["annotations"].items()
                }
            if group.get("podAnnotations"):  # e.g. sim.spotguard.io/readiness-flaps (controllers/kubelet.py)
                workload["spec"]["template"]["metadata"]["annotations"] = {
                    str(k): str(v) for k, v in group["podAnnotations"].items()
                }
            if kind == "StatefulSet":
                workload["spec"]["serviceName"] = name
            out.append(workload)
            if group.get("pdb"):
                out.append({
                    "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {**dict(group["pdb"]), "selector": {"matchLabels": {"app": name}}},
                })
    return out
