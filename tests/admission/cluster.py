"""Build workloads in a :class:`FakeKube`, and admit pods the way kube-apiserver would.

``admit_and_create`` sends the AdmissionReview through the core, applies the
returned JSONPatch with ``jsonpatch`` and stores the resulting pod (with a
generated name, as the ReplicaSet controller's generateName gives it).
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

import jsonpatch
from spotguard.admission import core
from spotguard.gateway import resources as r

from tests.admission.fakekube import FakeKube

Obj = dict[str, Any]
CAPACITY = "node.kubernetes.io/capacity"


def review(
    pod: Obj, namespace: str, *, uid: str | None = None, dry_run: bool = False, operation: str = "CREATE"
) -> Obj:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patch_of(answer: Obj) -> list[Obj]:
    response = answer["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def basic_cluster(k: FakeKube, on_demand_nodes: int = 3, spot_nodes: int = 6) -> None:
    for ns in ("default", "shop", "kube-system", "spotguard"):
        k.put(r.NAMESPACES, {"metadata": {"name": ns}})
    for i in range(on_demand_nodes):
        k.put(r.NODES, {"metadata": {"name": f"od-{i}", "labels": {CAPACITY: "on-demand"}}})
    for i in range(spot_nodes):
        k.put(r.NODES, {"metadata": {"name": f"spot-{i}", "labels": {CAPACITY: "spot"}}})


def deployment(
    k: FakeKube,
    name: str,
    replicas: int,
    *,
    namespace: str = "shop",
    annotations: Obj | None = None,
    template_hash: str = "abc123",
) -> tuple[Obj, Obj]:
    dep = k.put(
        r.DEPLOYMENTS,
        {
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
        },
    )
    rs = k.put(
        r.REPLICASETS,
        {
            "metadata": {
                "name": f"{name}-{template_hash}",
                "namespace": namespace,
                "labels": {"app": name, "pod-template-hash": template_hash},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": name,
                        "uid": dep["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name, "pod-template-hash": template_hash}},
            },
        },
    )
    return dep, rs


def statefulset(k: FakeKube, name: str, replicas: int, namespace: str = "shop", annotations: Obj | None = None) -> Obj:
    return k.put(
        r.STATEFULSETS,
        {
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
        },
    )


def pod_for(owner: Obj, *, name: str = "", ordinal: int | None = None) -> Obj:
    """A pod as the controller sends it to admission (no name for a ReplicaSet's pods)."""
    meta = owner["metadata"]
    labels = dict((owner.get("spec") or {}).get("selector", {}).get("matchLabels") or {})
    pod_meta: Obj = {
        "namespace": meta["namespace"],
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": owner["kind"],
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if ordinal is not None:
        pod_meta["name"] = f"{meta['name']}-{ordinal}"
        labels["apps.kubernetes.io/pod-index"] = str(ordinal)
        labels["statefulset.kubernetes.io/pod-name"] = pod_meta["name"]
    elif name:
        pod_meta["name"] = name
    else:
        pod_meta["generateName"] = meta["name"] + "-"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27", "resources": {"requests": {"cpu": "100m"}}}]},
    }


def admit_and_create(ctx: core.Context, k: FakeKube, pod: Obj, *, dry_run: bool = False) -> tuple[Obj, Obj]:
    """Admit ``pod`` and, unless dry-run, store the mutated pod. Returns (answer, pod)."""
    namespace = pod["metadata"]["namespace"]
    answer = core.serve(review(copy.deepcopy(pod), namespace, dry_run=dry_run), ctx)
    mutated = jsonpatch.apply_patch(pod, patch_of(answer))
    if not dry_run:
        meta = mutated["metadata"]
        with k.lock:
            if "name" not in meta:
                # generateName: a free name, as kube-apiserver gives one (5 random characters
                # collide once in a few thousand bursts; a taken one would silently replace a pod).
                taken = {name for plural, ns, name in k.objects if plural == r.PODS.plural and ns == namespace}
                while (name := meta.get("generateName", "pod-") + uuid.uuid4().hex[:5]) in taken:
                    pass
                meta["name"] = name
            k.put(r.PODS, mutated)
    return answer, mutated


def placements(k: FakeKube, namespace: str = "shop") -> dict[str, int]:
    out: dict[str, int] = {}
    for p in k.all(r.PODS, namespace):
        label = (p["metadata"].get("labels") or {}).get("spotguard.io/placement", "none")
        out[label] = out.get(label, 0) + 1
    return out
