"""Objects read from a real cluster, made fit to load into the simulated one (snapshots, kubectl exports).

:func:`clean` drops what the API server sets or owns (uid, resourceVersion,
creationTimestamp, managedFields, generation, status but a node's capacity),
and kubectl's last-applied annotation; :func:`secret_free` says whether an
object may be written to a scenario at all (no Secrets, no service-account
tokens); :func:`loadable` splits a scenario into what the simulated cluster
serves and the kinds it would refuse.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from spotguard_sim import resources as sim_resources
from spotguard_sim import settings as sim_settings

Obj = dict[str, Any]
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink")
DROPPED_ANNOTATIONS = (
    "kubectl.kubernetes.io/last-applied-configuration",
    "deployment.kubernetes.io/revision",
)
NODE_STATUS = ("capacity", "allocatable", "nodeInfo", "addresses")
# Made by controllers from the workloads: the simulated cluster makes its own.
DERIVED_KINDS = {"Pod", "ReplicaSet", "ControllerRevision", "EndpointSlice", "Endpoints", "Event", "Lease"}
# The cycle registers its own webhook; a captured one (service reference) would not be reachable.
LOCAL_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
SECRET_KINDS = {"Secret"}


def clean(obj: Obj, kind: str | None = None) -> Obj:
    out = copy.deepcopy(obj)
    if kind and "kind" not in out:
        out["kind"] = kind
    meta = out.setdefault("metadata", {})
    for f in SERVER_FIELDS:
        meta.pop(f, None)
    meta.pop("deletionTimestamp", None)
    meta.pop("deletionGracePeriodSeconds", None)
    annotations = meta.get("annotations") or {}
    for a in DROPPED_ANNOTATIONS:
        annotations.pop(a, None)
    if not annotations:
        meta.pop("annotations", None)
    if out.get("kind") == "Node":
        status = out.get("status") or {}
        out["status"] = {k: v for k, v in status.items() if k in NODE_STATUS}
    else:
        out.pop("status", None)
    if out.get("kind") != "Pod":
        meta.pop("ownerReferences", None)
    return out


def secret_free(obj: Obj) -> bool:
    """False for Secrets (and anything else that holds credentials): never written to a scenario."""
    return obj.get("kind") not in SECRET_KINDS


def loadable(objects: Iterable[Obj]) -> tuple[list[Obj], list[str]]:
    """(objects the simulated cluster serves, sorted kinds it does not, left out)."""
    keep: list[Obj] = []
    skipped: set[str] = set()
    for o in objects:
        kind = str(o.get("kind"))
        if sim_settings.is_settings(o):
            continue  # the control plane's timings: read by the cycle (cycle.settings_of), not served
        if kind in DERIVED_KINDS or kind in SECRET_KINDS or kind in LOCAL_KINDS:
            continue
        if kind not in sim_resources.BY_KIND:
            skipped.add(kind)
            continue
        keep.append(clean(o))
    return keep, sorted(skipped)
