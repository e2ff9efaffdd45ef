"""Strategic merge patch metadata from the served types' OpenAPI schemas.

kube-apiserver merges lists in a strategic merge patch by the Go struct tags
``patchStrategy`` / ``patchMergeKey``, which the published OpenAPI carries as
``x-kubernetes-patch-strategy`` / ``x-kubernetes-patch-merge-key``
(https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/#notes-on-the-strategic-merge-patch).
Reading them from the real 1.35 schemas (``spotguard_sim.openapi``) instead of a
hand-kept table gives every list the key upstream uses: a Service's
``spec.ports`` by ``port``, a container's ``ports`` by ``containerPort``, a
pod's ``conditions`` by ``type``, ``metadata.finalizers`` merged as a set,
tolerations and taints replaced.
"""

from __future__ import annotations

import functools
from typing import Any

from spotguard_sim import errors, openapi, resources

Node = dict[str, Any] | None  # a schema node as found under its parent (annotations intact)


@functools.cache
def _root(plural: str) -> dict[str, Any] | None:
    rtype = resources.get(plural)
    try:
        name = openapi._def_for(rtype.group, rtype.version, rtype.kind)
        return dict(openapi._schemas()[name])
    except (errors.StatusError, KeyError):
        return None


def root(rtype: resources.ResourceType) -> Node:
    """The schema of a served type, or None when the schemas are unavailable."""
    return _root(rtype.plural)


def child(node: Node, key: str) -> Node:
    """The schema of field ``key`` of an object node (or of a map's values)."""
    resolved = openapi._resolve(node)
    props = resolved.get("properties")
    if isinstance(props, dict) and key in props:
        found = props[key]
        return found if isinstance(found, dict) else None
    extra = resolved.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def items(node: Node) -> Node:
    found = openapi._resolve(node).get("items")
    return found if isinstance(found, dict) else None


def _strategy(node: Node) -> list[str]:
    if not isinstance(node, dict):
        return []
    return str(node.get("x-kubernetes-patch-strategy") or "").split(",")


def list_merge_key(node: Node) -> str | None:
    """The merge key of a list field ("" merges a list of primitives); None replaces it."""
    if "merge" not in _strategy(node):
        return None
    assert node is not None
    return str(node.get("x-kubernetes-patch-merge-key") or "")


def retains_keys(node: Node) -> bool:
    return "retainKeys" in _strategy(node)
