"""Metadata-only responses: meta.k8s.io PartialObjectMetadata and PartialObjectMetadataList.

A client that asks with ``Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1``
(client-go's metadata client, the Python client's dynamic client) gets each object's
``metadata`` only. As kube-apiserver (``endpoints/handlers/response.go``
``asPartialObjectMetadata`` / ``asPartialObjectMetadataList``): the Accept clauses are
tried in order and a clause asking for an unknown transform is skipped (406 when none
is left); PartialObjectMetadata of a list, or PartialObjectMetadataList of one object, is
406 NotAcceptable; a watch sends each event's object as PartialObjectMetadata (asked
as a list, the events carry the whole objects, as the watch server's Fixup falls back).

https://kubernetes.io/docs/reference/using-api/api-concepts/#receiving-resources-as-tables
(the same negotiation) and client-go ``metadata/metadata.go``.
"""

from __future__ import annotations

from typing import Any

from spotguard_sim import errors

Obj = dict[str, Any]

OBJECT = "PartialObjectMetadata"
LIST = "PartialObjectMetadataList"
GROUP = "meta.k8s.io"
VERSIONS = ("v1", "v1beta1")
TRANSFORMS = ("Table", OBJECT, LIST)


def requested(accept: str) -> tuple[str, str] | None:
    """``(kind, apiVersion)`` when the chosen Accept clause asks for metadata only, else None.

    The first clause without ``as=``, or with a transform the server has (a Table too),
    is the one chosen; clauses naming an unknown transform or group version are skipped."""
    clauses = [c for c in accept.split(",") if c.strip()]
    for clause in clauses:
        params: dict[str, str] = {}
        for part in clause.split(";")[1:]:
            key, _, value = part.partition("=")
            params[key.strip().lower()] = value.strip()
        target = params.get("as")
        if target is None:
            return None
        if target not in TRANSFORMS or params.get("g") != GROUP or params.get("v") not in VERSIONS:
            continue
        if target == "Table":
            return None
        return target, f"{GROUP}/{params['v']}"
    if clauses:
        raise errors.NotAcceptable(
            f"only the following media types are accepted: application/json, application/yaml "
            f"(with as=Table, as={OBJECT} or as={LIST};g={GROUP};v=v1), not {accept}"
        )
    return None


def of_object(obj: Obj, target: tuple[str, str]) -> Obj:
    """The PartialObjectMetadata of one object (a GET)."""
    kind, api_version = target
    if kind != OBJECT:
        raise errors.NotAcceptable(
            f"you requested {LIST}, but the requested object is not a list ({obj.get('kind')})"
        )
    return {"kind": OBJECT, "apiVersion": api_version, "metadata": obj.get("metadata") or {}}


def of_list(objs: list[Obj], target: tuple[str, str], list_meta: Obj) -> Obj:
    """The PartialObjectMetadataList of a list (its resourceVersion, continue and count kept)."""
    kind, api_version = target
    if kind != LIST:
        raise errors.NotAcceptable(f"you requested {OBJECT}, but the requested object is a list")
    return {
        "kind": LIST, "apiVersion": api_version, "metadata": list_meta,
        "items": [{"kind": OBJECT, "apiVersion": api_version, "metadata": o.get("metadata") or {}}
                  for o in objs],
    }
