"""What the reconcile cleans up itself, decided from objects as the API returns them (no I/O here).

(Surges that are over, temporary budgets and interruption taints on nodes that
survived are the spot-interruption reconcile's, which every pass calls.)

- Reservation Leases of ReplicaSets that no longer exist. The admission
  webhook keeps one Lease per ReplicaSet in spotguard's namespace
  (:mod:`spotguard.admission.reservations`), labelled
  ``app.kubernetes.io/component=admission`` and annotated with the
  ReplicaSet's uid; nothing else ever deletes them. The Leases are listed
  before the ReplicaSets, so a ReplicaSet that existed when its Lease was read
  is in the later list; each deletion carries the Lease's resourceVersion as a
  precondition, so a Lease the webhook rewrote meanwhile (a ReplicaSet
  re-created under the same name) stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]

LEASE_SELECTOR = "app.kubernetes.io/component=admission"
RS_UID_ANNOTATION = "spotguard.io/replicaset-uid"  # as spotguard.admission.reservations writes it
RS_ANNOTATION = "spotguard.io/replicaset"


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
