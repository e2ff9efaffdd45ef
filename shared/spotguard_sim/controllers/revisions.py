"""ControllerRevisions of StatefulSets (pkg/controller/history): each distinct pod
template is stored once as ``<set>-<hash>`` (apps/v1 ControllerRevision, owned by
the set, ``revision`` counting up, ``data`` holding the template as a patch), and
pods carry the ``controller-revision-hash`` label of the revision they were made
from. Revisions beyond ``revisionHistoryLimit`` that no pod uses are deleted.
https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/controller-revision-v1/
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any

from spotguard_sim import errors
from spotguard_sim.controllers import base

HASH_LABEL = "controller-revision-hash"


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def owned(store: Any, owner: dict[str, Any]) -> list[dict[str, Any]]:
    # the entries are read in place and only the owner's copied (a namespace holds the
    # revisions of every set in it: copying them all on every sync was the controller's cost)
    entries, _ = store.list_entries("controllerrevisions", owner["metadata"]["namespace"])
    uid = owner["metadata"]["uid"]
    mine = [e.copy() for e in entries if base.controller_uid(e.obj) == uid]
    return sorted(mine, key=lambda r: int(r.get("revision") or 0))


def template_of(revision: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = ((revision.get("data") or {}).get("spec") or {}).get("template") or {}
    return {k: v for k, v in template.items() if k != "$patch"}


def ensure(store: Any, owner: dict[str, Any], kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The revision of the owner's current template (created if new) and all its revisions."""
    template = (owner.get("spec") or {}).get("template") or {}
    name = f"{owner['metadata']['name']}-{template_hash(template)}"
    history = owned(store, owner)
    found = next((r for r in history if r["metadata"]["name"] == name), None)
    latest = max((int(r.get("revision") or 0) for r in history), default=0)
    if found is not None:
        if int(found.get("revision") or 0) < latest:  # a rollback: the old template is newest again
            def bump(obj: dict[str, Any]) -> None:
                obj["revision"] = latest + 1

            found = store.mutate("controllerrevisions", name, owner["metadata"]["namespace"], bump)
            history = owned(store, owner)
        return found, history
    body = {
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": name, "namespace": owner["metadata"]["namespace"],
                     "labels": {**((template.get("metadata") or {}).get("labels") or {}),
                                HASH_LABEL: name.rsplit("-", 1)[1]},
                     "ownerReferences": [base.owner_reference(owner, kind)]},
        "data": {"spec": {"template": {**template, "$patch": "replace"}}},
        "revision": latest + 1,
    }
    try:
        created: dict[str, Any] = store.create("controllerrevisions", body,
                                               namespace=owner["metadata"]["namespace"])
    except errors.AlreadyExists:
        created = store.get("controllerrevisions", name, owner["metadata"]["namespace"])
    return created, owned(store, owner)


def prune(store: Any, owner: dict[str, Any], history: list[dict[str, Any]], in_use: set[str]) -> None:
    limit = int((owner.get("spec") or {}).get("revisionHistoryLimit", 10))
    old = [r for r in history if r["metadata"]["name"] not in in_use]
    for r in old[:max(0, len(old) - limit)]:
        with contextlib.suppress(errors.NotFound):
            store.delete("controllerrevisions", r["metadata"]["name"], r["metadata"]["namespace"])
