"""What the reconcile cleans up, decided from objects as the API returns them (no I/O here).

- Reservation Leases of ReplicaSets that no longer exist. The admission
  webhook keeps one Lease per ReplicaSet in spotguard's namespace
  (:mod:`spotguard.admission.reservations`), labelled
  ``app.kubernetes.io/component=admission`` and annotated with the
  ReplicaSet's uid; nothing else ever deletes them. The Leases are listed
  before the ReplicaSets, so a ReplicaSet that existed when its Lease was read
  is in the later list; each deletion carries the Lease's resourceVersion as a
  precondition, so a Lease the webhook rewrote meanwhile (a ReplicaSet
  re-created under the same name) stays.
- ``spotguard.io/interruption`` taints on nodes that survived (a rebalance
  recommendation never followed by an interruption, a stopped and restarted
  instance). A tainted node that is Ready and that no interruption surge in
  progress covers is first marked with the time it was seen so
  (``spotguard.io/interruption-seen``); once it has stayed so for
  :data:`TAINT_GRACE_SECONDS` (an interruption notice gives two minutes), the
  taint and the mark are removed. The times compared come from the same
  annotation, so clocks of different instances need only agree to within
  minutes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.policy import interruption
from spotguard.policy.workloads import INTERRUPTION_TAINT, Workload

Obj = Mapping[str, Any]

LEASE_SELECTOR = "app.kubernetes.io/component=admission"
RS_UID_ANNOTATION = "spotguard.io/replicaset-uid"  # as spotguard.admission.reservations writes it
RS_ANNOTATION = "spotguard.io/replicaset"
SEEN = "spotguard.io/interruption-seen"
TAINT_GRACE_SECONDS = 600.0


@dataclass(frozen=True)
class OrphanLease:
    name: str
    namespace: str
    resource_version: str
    replicaset: str  # namespace/name, as the Lease says


def orphan_leases(leases: Iterable[Obj], replicasets: Iterable[Obj]) -> list[OrphanLease]:
    """The admission Leases whose ReplicaSet (by uid) is not in ``replicasets``."""
    uids = {str((rs.get("metadata") or {}).get("uid") or "") for rs in replicasets}
    out: list[OrphanLease] = []
    for lease in leases:
        meta = lease.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if labels.get("app.kubernetes.io/managed-by") != "spotguard" or labels.get(
            "app.kubernetes.io/component"
        ) != "admission":
            continue
        uid = str(annotations.get(RS_UID_ANNOTATION) or "")
        if not uid or uid in uids:
            continue
        out.append(
            OrphanLease(
                name=str(meta.get("name") or ""),
                namespace=str(meta.get("namespace") or ""),
                resource_version=str(meta.get("resourceVersion") or ""),
                replicaset=str(annotations.get(RS_ANNOTATION) or ""),
            )
        )
    return out


class TaintStep(enum.StrEnum):
    MARK = "mark"  # note when the survivor was first seen
    REMOVE = "remove"  # remove the taint and the mark
    UNMARK = "unmark"  # a mark without a taint: remove the mark


@dataclass(frozen=True)
class TaintCleanup:
    node: str
    step: TaintStep
    reason: str


def _ready(node: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _float(text: Any) -> float | None:
    try:
        return float(str(text))
    except ValueError:
        return None


def surviving_taints(
    nodes: Iterable[Obj], workloads: Sequence[Workload], now: float, grace: float = TAINT_GRACE_SECONDS
) -> list[TaintCleanup]:
    """Interruption taints to mark or remove on nodes that survived (see the module docstring)."""
    covered: set[str] = set()
    for w in workloads:
        record = interruption.SurgeRecord.of(w)
        if record is not None and not record.done:
            covered.update(record.nodes)
    out: list[TaintCleanup] = []
    for node in nodes:
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        annotations = meta.get("annotations") or {}
        tainted = any(t.get("key") == INTERRUPTION_TAINT for t in (node.get("spec") or {}).get("taints") or [])
        seen = _float(annotations.get(SEEN)) if SEEN in annotations else None
        if not tainted:
            if SEEN in annotations:
                out.append(TaintCleanup(name, TaintStep.UNMARK, "no interruption taint any more"))
            continue
        if not _ready(node) or name in covered:
            continue
        if seen is None:
            out.append(TaintCleanup(name, TaintStep.MARK, "tainted, Ready and no surge in progress covers it"))
        elif now - seen >= grace:
            out.append(
                TaintCleanup(name, TaintStep.REMOVE, f"Ready for {int(now - seen)}s after its notice: it survived")
            )
    return out


def taint_patch(node: Obj, step: TaintStep, now: float) -> dict[str, Any]:
    """The merge patch for ``step``, guarded by the node's resourceVersion."""
    meta = node.get("metadata") or {}
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if step is TaintStep.MARK:
        patch["metadata"]["annotations"] = {SEEN: f"{now:.3f}"}
        return patch
    patch["metadata"]["annotations"] = {SEEN: None}
    if step is TaintStep.REMOVE:
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != INTERRUPTION_TAINT]
        patch["spec"] = {"taints": taints or None}
    return patch

