"""The surge record of a Deployment as the tests read it from the simulated cluster's store:
on the Deployment (the replica surge's) or on its surge copy (``surgecopy.RECORD``: a copy's
surge writes nothing on the Deployment)."""

from __future__ import annotations

import json
from typing import Any

from spotguard.policy import surgecopy
from spotguard.policy.workloads import SURGE, Workload, surge_copy_name


def surge_record(store: Any, name: str, namespace: str = "shop") -> dict[str, Any] | None:
    """The record as JSON, or None: the Deployment's own annotation first, else its copy's."""
    raw = (store.get("deployments", name, namespace)["metadata"].get("annotations") or {}).get(SURGE)
    if raw:
        return dict(json.loads(raw))
    copies = store.list("replicasets", namespace=namespace)[0]
    rs = next((c for c in copies if c["metadata"]["name"] == surge_copy_name(name)), None)
    text = ((rs or {}).get("metadata", {}).get("annotations") or {}).get(surgecopy.RECORD)
    return dict(json.loads(text)) if text else None


def with_copy_records(store: Any, views: dict[str, Workload]) -> dict[str, Workload]:
    """``views`` (workload key -> view) with each Deployment's copy record as its record,
    as the functions see them (``surgecopy.with_record``)."""
    return surgecopy.views_with_records(views, store.list("replicasets")[0])
