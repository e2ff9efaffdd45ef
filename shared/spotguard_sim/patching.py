"""JSON patch, JSON merge patch and strategic merge patch, as kube-apiserver applies them.

Strategic merge patch follows
https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/
and the directives in
https://github.com/kubernetes/community/blob/master/contributors/devel/sig-api-machinery/strategic-merge-patch.md
Lists are merged as the type's OpenAPI schema says (``x-kubernetes-patch-strategy``
and ``x-kubernetes-patch-merge-key``, the Go struct tags kube-apiserver itself
uses: a Service's ``spec.ports`` by ``port``, a container's ``ports`` by
``containerPort``); lists without a merge strategy are replaced. Without a schema
(a bare ``strategic(obj, patch)``) the table ``MERGE_KEYS`` keyed by field name is
the fallback.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from spotguard_sim import errors, patchmeta

# field name -> merge key ("" merges a list of primitives); lists not named here are replaced.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "topologySpreadConstraints": "topologyKey",
    "hostAliases": "ip",
    "podIPs": "ip",
    "hostIPs": "ip",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "finalizers": "",
}
# fields whose map patches use the retainKeys strategy
RETAIN_KEYS = frozenset({"strategy"})

CONTENT_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


APPLY_NOT_SERVED = "server-side apply is not supported by the simulated cluster; use client-side apply"


def apply(
    obj: dict[str, Any], patch: Any, patch_type: str, schema: patchmeta.Node = None
) -> dict[str, Any]:
    """Return a new object with ``patch`` applied; raises BadRequest/Invalid/Conflict.

    ``schema`` (``patchmeta.root(rtype)``) gives strategic merge patches the type's
    merge keys; without it the field-name table applies."""
    if patch_type == "json":
        return apply_json(obj, patch)
    if patch_type == "merge":
        if not isinstance(patch, dict):
            raise errors.BadRequest("merge patch must be a JSON object")
        merged: dict[str, Any] = merge(obj, patch)
        return merged
    if patch_type == "strategic":
        if not isinstance(patch, dict):
            raise errors.BadRequest("strategic merge patch must be a JSON object")
        return strategic(obj, patch, schema)
    if patch_type == "apply":
        raise errors.UnsupportedMediaType(APPLY_NOT_SERVED)
    raise errors.UnsupportedMediaType(f"unknown patch type {patch_type!r}")


def apply_json(obj: dict[str, Any], patch: Any) -> dict[str, Any]:
    if not isinstance(patch, list):
        raise errors.BadRequest("json patch must be a JSON array of operations")
    try:
        result = jsonpatch.JsonPatch(patch).apply(obj, in_place=False)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise errors.generic_invalid() from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError,
            TypeError, ValueError) as exc:
        raise errors.generic_invalid() from exc
    if not isinstance(result, dict):
        raise errors.BadRequest("json patch replaced the object with a non-object")
    return result


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def strategic(
    target: dict[str, Any], patch: dict[str, Any], schema: patchmeta.Node = None
) -> dict[str, Any]:
    result = _merge_map(copy.deepcopy(target), patch, "", schema)
    if not isinstance(result, dict):
        raise errors.BadRequest("strategic merge patch deleted the whole object")
    return result


def _list_key(field: str, schema: patchmeta.Node) -> str | None:
    """The merge key of list ``field`` ("" for a merged list of primitives), None to replace."""
    if schema is None:
        return MERGE_KEYS.get(field)
    return patchmeta.list_merge_key(patchmeta.child(schema, field))


def _retains(field: str, schema: patchmeta.Node) -> bool:
    return field in RETAIN_KEYS if schema is None else patchmeta.retains_keys(schema)


def _merge_map(target: Any, patch: dict[str, Any], field: str,
               schema: patchmeta.Node = None) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive is not None:
        raise errors.BadRequest(f"unknown patch directive {directive!r}")
    result: dict[str, Any] = target if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key == "$retainKeys":
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = list(value or [])
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            existing = result.get(name)
            if isinstance(existing, list):
                drop = list(value or [])
                result[name] = [v for v in existing if v not in drop]
            continue
        if value is None:
            result.pop(key, None)
            continue
        current = result.get(key)
        if isinstance(value, dict):
            sub = patchmeta.child(schema, key) if schema is not None else None
            merged = _merge_map(current, value, key, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and (list_key := _list_key(key, schema)) is not None:
            items = patchmeta.items(patchmeta.child(schema, key)) if schema is not None else None
            result[key] = _merge_list(current, value, list_key, key, items)
        else:
            result[key] = copy.deepcopy(value)
    for name, order in orders.items():
        if isinstance(result.get(name), list):
            result[name] = _reorder(result[name], order, _list_key(name, schema) or "")
    if isinstance(retain, list):
        keep = set(retain)
        for key in list(result):
            if key not in keep:
                del result[key]
    elif retain is not None and _retains(field, schema):
        raise errors.BadRequest("$retainKeys must be a list")
    return result


def _merge_list(current: Any, patch: list[Any], key: str, field: str,
                items: patchmeta.Node = None) -> list[Any]:
    existing = list(current) if isinstance(current, list) else []
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if not key:  # list of primitives: union, keeping order
        out = list(existing)
        for item in patch:
            if item not in out:
                out.append(copy.deepcopy(item))
        return out
    out = list(existing)
    for item in patch:
        if not isinstance(item, dict):
            raise errors.BadRequest(f"{field}: strategic merge list items must be objects")
        if key not in item:
            raise errors.BadRequest(f"{field}: merge key {key!r} missing in patch item")
        index = next(
            (i for i, e in enumerate(out) if isinstance(e, dict) and e.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
            continue
        if index is None:
            added = _merge_map({}, item, field, items)
            out.append(added)
        else:
            out[index] = _merge_map(out[index], item, field, items)
    return out


def _reorder(items: list[Any], order: list[Any], key: str) -> list[Any]:
    def ident(item: Any) -> Any:
        return item.get(key) if key and isinstance(item, dict) else item

    if not key and not all(isinstance(i, (str, int, float, bool)) for i in items):
        return items
    positions = {}
    for i, o in enumerate(order):
        value = o.get(key) if key and isinstance(o, dict) else o
        positions[repr(value)] = i
    listed = [i for i in items if repr(ident(i)) in positions]
    rest = [i for i in items if repr(ident(i)) not in positions]
    listed.sort(key=lambda i: positions[repr(ident(i))])
    return listed + rest
