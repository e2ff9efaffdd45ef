"""What the handler writes on the cluster's objects, built from the plan.

Everything spotguard did is recorded on the objects themselves: the node's
taint (``spotguard.io/interruption=<event id>:NoSchedule``), the workload's
``spotguard.io/surge`` annotation (JSON: the replicas before the surge, the
surge, the event ids, the nodes, when it started, the autoscaler's original
limits, the temporary budget) and the temporary PodDisruptionBudget's labels.
"""

from __future__ import annotations

from typing import Any

from spotguard.policy import interruption
from spotguard.policy.interruption import BudgetStep, TaintStep
from spotguard.policy.notices import NODE_NOTICE
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.workloads import INTERRUPTION_TAINT, SURGE

SURGE_FOR = "spotguard.io/surge-for"  # on the temporary budget: the workload it protects

Obj = dict[str, Any]


def taint_patch(node: Obj, step: TaintStep) -> Obj:
    """A merge patch adding the taint to the node's taints (guarded by its resourceVersion)."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != INTERRUPTION_TAINT]
    taints.append(step.taint_json())
    meta = node.get("metadata") or {}
    patch: Obj = {"spec": {"taints": taints}, "metadata": {}}
    if step.notice is not None:
        patch["metadata"]["annotations"] = {NODE_NOTICE: step.notice.to_json()}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return patch


def untaint_patch(node: Obj) -> Obj:
    """Remove the interruption taint and the notice recorded beside it (guarded by the resourceVersion)."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != INTERRUPTION_TAINT]
    meta = node.get("metadata") or {}
    patch: Obj = {"spec": {"taints": taints or None}, "metadata": {"annotations": {NODE_NOTICE: None}}}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return patch


def surge_patch(workload: Obj, record: SurgeRecord, replicas: int | None) -> Obj:
    """One merge patch: the surged replica count (None: the count is left alone, the surge
    is a copy) and the record, guarded by the resourceVersion."""
    meta = workload.get("metadata") or {}
    patch: Obj = {"metadata": {"annotations": {SURGE: record.to_json()}}}
    if replicas is not None:
        patch["spec"] = {"replicas": replicas}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return patch


def finish_patch(workload: Obj, replicas: int | None, keep: SurgeRecord | None) -> Obj:
    """Scale back and remove the record (or keep a done record while doomed nodes remain)."""
    meta = workload.get("metadata") or {}
    patch: Obj = {"metadata": {"annotations": {SURGE: keep.to_json() if keep else None}}}
    if replicas is not None:
        patch["spec"] = {"replicas": replicas}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return patch


def budget_object(workload: Obj, step: BudgetStep, record: SurgeRecord) -> Obj:
    """The temporary PodDisruptionBudget: the workload's selector, minAvailable = Ready now."""
    meta = workload.get("metadata") or {}
    selector = (workload.get("spec") or {}).get("selector") or {}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": step.name,
            "namespace": meta.get("namespace"),
            "labels": {interruption.MANAGED_BY_LABEL: interruption.MANAGED_BY},
            "annotations": {
                SURGE_FOR: f"{workload.get('kind', 'Deployment')}/{meta.get('name')}",
                "spotguard.io/events": ",".join(record.events)[:1000],
            },
            "ownerReferences": [
                {
                    "apiVersion": workload.get("apiVersion", "apps/v1"),
                    "kind": workload.get("kind", "Deployment"),
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ]
            if meta.get("uid")
            else [],
        },
        "spec": {"minAvailable": step.min_available, "selector": selector},
    }


def surge_message(step: interruption.SurgeStep) -> str:
    nodes = ", ".join(step.new_nodes[:10]) + (" ..." if len(step.new_nodes) > 10 else "")
    return (
        f"surged {step.workload.replicas} -> {step.replicas} replicas (+{step.added} on on-demand): "
        f"{step.added} pods run on nodes going away ({nodes}); events {', '.join(step.new_events[:5])}"
    )


def taint_message(step: TaintStep, reason: str) -> str:
    return (
        f"tainted {INTERRUPTION_TAINT}={step.event_id}:NoSchedule: {reason}; "
        "no new pod lands here and its Deployments get on-demand replacements"
    )
