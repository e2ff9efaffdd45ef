"""OpenAPI v3 documents for the served types, as kubectl reads them.

kubectl (apply, validation) downloads ``/openapi/v3`` (an index of group
versions) and then ``/openapi/v3/apis/<group>/<version>``: it checks that the
PATCH operation of a kind takes the ``fieldValidation`` parameter (then it lets
the server validate) and accepts ``application/strategic-merge-patch+json``,
and computes strategic merge patches from the schemas'
``x-kubernetes-patch-merge-key`` / ``x-kubernetes-patch-strategy``.

The schemas are the real Kubernetes 1.35 definitions, shipped by the
``kubernetes-validate`` package (JSON-schema form); they are converted to
OpenAPI 3.0 here (``$ref`` paths, single types, int-or-string).
See https://kubernetes.io/docs/concepts/overview/kubernetes-api/#openapi-v3
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

import orjson

from spotguard_sim import errors, resources

K8S_VERSION = "v1.35.0"
_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)
_lock = threading.Lock()


def _definitions_file() -> Path:
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        raise errors.NotFound("OpenAPI schemas are unavailable (kubernetes-validate missing)")
    root = Path(next(iter(spec.submodule_search_locations))) / "kubernetes-json-schema"
    wanted = root / f"{K8S_VERSION}-local" / "_definitions.json"
    if wanted.exists():
        return wanted
    candidates = sorted(root.glob("v*-local/_definitions.json"))
    if not candidates:
        raise errors.NotFound("OpenAPI schemas are unavailable")
    return candidates[-1]


def _convert(node: Any) -> Any:
    """JSON schema (as kubernetes-validate ships it) to OpenAPI 3.0 schema objects."""
    if isinstance(node, list):
        return [_convert(x) for x in node]
    if not isinstance(node, dict):
        return node
    if "oneOf" in node and all(isinstance(x, dict) and "type" in x for x in node["oneOf"]):
        one_of = {t for x in node["oneOf"] for t in _types(x["type"])}
        out: dict[str, Any] = {k: _convert(v) for k, v in node.items() if k != "oneOf"}
        out["type"] = "string"
        if "integer" in one_of:
            out["format"] = "int-or-string"
            out["x-kubernetes-int-or-string"] = True
        return out
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = value.replace("#/$defs/", "#/components/schemas/")
        elif key == "type":
            types = [t for t in _types(value) if t != "null"]
            if types:
                out[key] = types[0]
        elif key in ("$schema", "$id"):
            continue
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _convert(prop) for name, prop in value.items()}
        else:
            out[key] = _convert(value)
    if "enum" in out and set(out) & {"description"} and out.get("type") == "string" and len(
        out["enum"]
    ) == 1:
        del out["enum"]  # apiVersion / kind pinned by the JSON-schema generator
    return out


def _types(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value or []]


@functools.cache
def _schemas() -> dict[str, Any]:
    raw = json.loads(_definitions_file().read_text())
    defs = raw.get("$defs") or raw.get("definitions") or {}
    converted: dict[str, Any] = _convert(defs)
    known = {(g.get("group", ""), g.get("version"), g.get("kind"))
             for schema in converted.values() for g in schema.get("x-kubernetes-group-version-kind") or []}
    for t in resources.TYPES:
        if (t.group, t.version, t.kind) not in known:
            converted.update(_custom(t))
    return converted


def _custom(t: resources.ResourceType) -> dict[str, Any]:
    """Schemas for a custom resource (Karpenter's): apiVersion, kind, metadata; its spec and
    status are kept as sent (a structural schema with ``x-kubernetes-preserve-unknown-fields``)."""
    prefix = ".".join(reversed(t.group.split("."))) + f".{t.version}"
    gvk = [{"group": t.group, "version": t.version, "kind": t.kind}]
    open_object = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    item = {"type": "object", "x-kubernetes-group-version-kind": gvk, "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "metadata": _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
        "spec": dict(open_object), "status": dict(open_object)}}
    listing = {"type": "object", "required": ["items"],
               "x-kubernetes-group-version-kind": [{**gvk[0], "kind": t.list_kind}], "properties": {
                   "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                   "items": {"type": "array", "items": _ref(f"{prefix}.{t.kind}")},
                   "metadata": _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta")}}
    return {f"{prefix}.{t.kind}": item, f"{prefix}.{t.list_kind}": listing}


def _def_for(group: str, version: str, kind: str) -> str:
    for name, schema in _schemas().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            if (gvk.get("group", ""), gvk.get("version"), gvk.get("kind")) == (group, version, kind):
                return str(name)
    raise errors.NotFound(f"no OpenAPI schema for {group}/{version} {kind}")


def _reachable(names: list[str]) -> dict[str, Any]:
    schemas = _schemas()
    seen: dict[str, Any] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen or name not in schemas:
            continue
        seen[name] = schemas[name]
        stack = [schemas[name]]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                    todo.append(ref.rsplit("/", 1)[-1])
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    return dict(sorted(seen.items()))


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _param(name: str, where: str = "query", schema_type: str = "string") -> dict[str, Any]:
    return {"name": name, "in": where, "schema": {"type": schema_type, "uniqueItems": True},
            "description": name}


def _response(name: str) -> dict[str, Any]:
    return {"description": "OK", "content": {"application/json": {"schema": _ref(name)}}}


def _operation(  # noqa: PLR0917
    action: str, op_id: str, gvk: dict[str, str], body: str | None, reply: str,
    params: list[dict[str, Any]], *, patch: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": op_id,
        "parameters": params,
        "responses": {"200": _response(reply), "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    }
    if body is not None:
        types = _PATCH_TYPES if patch else ("*/*",)
        op["requestBody"] = {"content": {t: {"schema": _ref(body)} for t in types},
                             "required": True}
    return op


def _write_params() -> list[dict[str, Any]]:
    return [_param("dryRun"), _param("fieldManager"), _param("fieldValidation")]


def group_version_doc(group: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.0 document of one group version."""
    paths: dict[str, Any] = {}
    roots: list[str] = [
        "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Patch",
        "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    ]
    for t in resources.SERVED:
        if (t.group, t.version) != (group, version):
            continue
        kind_def = _def_for(group, version, t.kind)
        gvk = {"group": group, "version": version, "kind": t.kind}
        base = t.prefix + ("/namespaces/{namespace}" if t.namespaced else "")
        ident = f"{t.kind}{'Namespaced' if t.namespaced else ''}"
        path_params = [_param("namespace", "path")] if t.namespaced else []
        if t.verbs == ("create",):  # an access review: POST only, no list kind
            roots.append(kind_def)
            paths[f"{base}/{t.plural}"] = {
                "post": _operation("post", f"create{ident}", gvk, kind_def, kind_def, _write_params()),
                "parameters": path_params,
            }
            continue
        list_def = _def_for(group, version, t.list_kind)
        roots += [kind_def, list_def]
        paths[f"{base}/{t.plural}"] = {
            "get": _operation("list", f"list{ident}", gvk, None, list_def,
                              [_param("labelSelector"), _param("fieldSelector"),
                               _param("limit", schema_type="integer"), _param("continue"),
                               _param("watch", schema_type="boolean"),
                               _param("resourceVersion")]),
            "post": _operation("post", f"create{ident}", gvk, kind_def, kind_def,
                               _write_params()),
            "delete": _operation("deletecollection", f"deleteCollection{ident}", gvk,
                                 "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
                                 "io.k8s.apimachinery.pkg.apis.meta.v1.Status", []),
            "parameters": path_params,
        }
        item_params = [_param("name", "path"), *path_params]
        paths[f"{base}/{t.plural}/{{name}}"] = {
            "get": _operation("get", f"read{ident}", gvk, None, kind_def, []),
            "put": _operation("put", f"replace{ident}", gvk, kind_def, kind_def, _write_params()),
            "patch": _operation("patch", f"patch{ident}", gvk,
                                "io.k8s.apimachinery.pkg.apis.meta.v1.Patch", kind_def,
                                [*_write_params(), _param("force", schema_type="boolean")],
                                patch=True),
            "delete": _operation("delete", f"delete{ident}", gvk,
                                 "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions", kind_def,
                                 [_param("dryRun"), _param("gracePeriodSeconds", schema_type="integer"),
                                  _param("propagationPolicy")]),
            "parameters": item_params,
        }
        for sub in t.subresources:
            sub_path = f"{base}/{t.plural}/{{name}}/{sub}"
            if sub == "status":
                sub_gvk, sub_def = gvk, kind_def
            else:
                g, v, k = resources.SUBRESOURCE_KINDS[sub]
                sub_gvk = {"group": g, "version": v, "kind": k}
                sub_def = _def_for(g, v, k)
                roots.append(sub_def)
            ops: dict[str, Any] = {"parameters": item_params}
            if sub in ("status", "scale"):
                ops["get"] = _operation("get", f"read{ident}{sub.title()}", sub_gvk, None,
                                        sub_def, [])
                ops["put"] = _operation("put", f"replace{ident}{sub.title()}", sub_gvk, sub_def,
                                        sub_def, _write_params())
                ops["patch"] = _operation("patch", f"patch{ident}{sub.title()}", sub_gvk,
                                          "io.k8s.apimachinery.pkg.apis.meta.v1.Patch", sub_def,
                                          [*_write_params(), _param("force", schema_type="boolean")],
                                          patch=True)
            else:
                ops["post"] = _operation("post", f"create{ident}{sub.title()}", sub_gvk, sub_def,
                                         sub_def, _write_params())
            paths[sub_path] = ops
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": K8S_VERSION},
        "paths": paths,
        "components": {
            "schemas": _reachable(roots),
            "securitySchemes": {"BearerToken": {"type": "apiKey", "name": "authorization",
                                                "in": "header"}},
        },
    }


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@functools.cache
def _documents() -> dict[str, bytes]:
    return {_gv_path(g, v): orjson.dumps(group_version_doc(g, v))
            for g, v in resources.group_versions()}


def documents() -> dict[str, bytes]:
    with _lock:
        return _documents()


def index() -> dict[str, Any]:
    docs = documents()
    return {"paths": {
        path: {"serverRelativeURL": f"/openapi/v3/{path}?hash="
               f"{hashlib.sha512(body).hexdigest().upper()}"}
        for path, body in docs.items()
    }}


def _resolve(schema: Any) -> dict[str, Any]:
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema and seen < 50:
        schema = _schemas().get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
        seen += 1
    if isinstance(schema, dict) and "allOf" in schema and len(schema["allOf"]) == 1:
        return _resolve(schema["allOf"][0])
    return schema if isinstance(schema, dict) else {}


def unknown_fields(rtype: resources.ResourceType, obj: Any) -> list[str]:
    """Fields of ``obj`` (an object, or a merge patch) that the type's schema does not have.

    This is the ``fieldValidation=Strict`` check kubectl asks for:
    https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation
    """
    try:
        root = _schemas()[_def_for(rtype.group, rtype.version, rtype.kind)]
    except (errors.StatusError, KeyError):
        return []
    found: list[str] = []

    def walk(value: Any, schema: Any, path: str) -> None:
        schema = _resolve(schema)
        if not schema or schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        if isinstance(value, dict):
            props = schema.get("properties")
            extra = schema.get("additionalProperties")
            for key, item in value.items():
                if key.startswith("$"):
                    continue  # strategic merge patch directives
                where = f"{path}.{key}" if path else key
                if props is not None and key in props:
                    walk(item, props[key], where)
                elif isinstance(extra, dict):
                    walk(item, extra, where)
                elif props is not None or extra is False:
                    found.append(where)
        elif isinstance(value, list) and "items" in schema:
            for index, item in enumerate(value):
                walk(item, schema["items"], f"{path}[{index}]")

    walk(obj, root, "")
    return found
