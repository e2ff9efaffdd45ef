"""API discovery documents: /version, /api, /apis, group versions and OpenAPI.

https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api
"""

from __future__ import annotations

from typing import Any

import orjson

from spotguard_sim import errors, openapi, resources, wire

VERSION = {
    "major": "1",
    "minor": "35",
    "emulationMajor": "1",
    "emulationMinor": "35",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "34",
    "gitVersion": "v1.35.0-spotguard-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_SUB_VERBS = {
    "status": ["get", "patch", "update"],
    "scale": ["get", "patch", "update"],
    "eviction": ["create"],
    "binding": ["create"],
    "token": ["create"],
}


def _verbs(t: resources.ResourceType) -> list[str]:
    return list(t.verbs) if t.verbs else sorted(_READ + _WRITE)


def resource_list(group: str, version: str) -> dict[str, Any]:
    gv = f"{group}/{version}" if group else version
    out: list[dict[str, Any]] = []
    for t in resources.SERVED:
        if (t.group, t.version) != (group, version):
            continue
        entry: dict[str, Any] = {
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
            "kind": t.kind, "verbs": _verbs(t),
        }
        if t.short_names:
            entry["shortNames"] = list(t.short_names)
        if t.categories:
            entry["categories"] = list(t.categories)
        out.append(entry)
        for sub in t.subresources:
            sub_entry: dict[str, Any] = {
                "name": f"{t.plural}/{sub}", "singularName": "", "namespaced": t.namespaced,
                "kind": t.kind, "verbs": _SUB_VERBS[sub],
            }
            kind = resources.SUBRESOURCE_KINDS.get(sub)
            if kind is not None:
                sub_entry.update({"group": kind[0], "version": kind[1], "kind": kind[2]})
            out.append(sub_entry)
    if gv == "v1":
        out.append({"name": "bindings", "singularName": "binding", "namespaced": True,
                    "kind": "Binding", "verbs": ["create"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}


def _group(group: str) -> dict[str, Any]:
    versions = [v for g, v in resources.group_versions() if g == group]
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_groups() -> dict[str, Any]:
    groups: list[dict[str, Any]] = []
    for g, _ in resources.group_versions():
        if g and all(x["name"] != g for x in groups):
            groups.append(_group(g))
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def aggregated(core: bool) -> dict[str, Any]:
    """apidiscovery.k8s.io/v2 APIGroupDiscoveryList for /api (core) or /apis."""
    items: list[dict[str, Any]] = []
    for group, version in resources.group_versions():
        if bool(group) == core:
            continue
        res = []
        for t in resources.SERVED:
            if (t.group, t.version) != (group, version):
                continue
            entry: dict[str, Any] = {
                "resource": t.plural,
                "responseKind": {"group": group, "version": version, "kind": t.kind},
                "scope": "Namespaced" if t.namespaced else "Cluster",
                "singularResource": t.singular,
                "verbs": _verbs(t),
            }
            if t.short_names:
                entry["shortNames"] = list(t.short_names)
            if t.categories:
                entry["categories"] = list(t.categories)
            subs = []
            for sub in t.subresources:
                kind = resources.SUBRESOURCE_KINDS.get(sub, (group, version, t.kind))
                subs.append({
                    "subresource": sub,
                    "responseKind": {"group": kind[0], "version": kind[1], "kind": kind[2]},
                    "verbs": _SUB_VERBS[sub],
                })
            if subs:
                entry["subresources"] = subs
            res.append(entry)
        version_doc = {"version": version, "resources": res, "freshness": "Current"}
        existing = next((i for i in items if i["metadata"].get("name", "") == group), None)
        if existing:
            existing["versions"].append(version_doc)
        else:
            items.append({"metadata": {"name": group} if group else {}, "versions": [version_doc]})
    return {
        "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {}, "items": items,
    }


def serve(path: str, accept: str) -> wire.Response | None:
    """A discovery Response for ``path``, or None when the path is not a discovery path."""
    clean = "/" + "/".join(p for p in path.split("/") if p)
    if clean in ("/healthz", "/readyz", "/livez"):
        return wire.Response(200, b"ok", content_type="text/plain")
    if clean == "/version":
        return wire.Response(200, orjson.dumps(VERSION))  # WriteRawJSON: no newline
    if clean in ("/api", "/apis") and "apidiscovery.k8s.io" in accept and "v=v2;" in (accept + ";"):
        return wire.Response(200, wire.encode(aggregated(clean == "/api")),
                               content_type=_AGGREGATED)
    if clean == "/api":
        return wire.json_response(200, {
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": "127.0.0.1"}],
        })
    if clean == "/apis":
        return wire.json_response(200, api_groups())
    if clean.startswith("/openapi"):
        return _openapi(clean)
    parts = clean.split("/")[1:]
    if parts == ["api", "v1"]:
        return wire.json_response(200, resource_list("", "v1"))
    if len(parts) == 2 and parts[0] == "apis":
        if any(g == parts[1] for g, _ in resources.group_versions()):
            return wire.json_response(200, {"kind": "APIGroup", "apiVersion": "v1",
                                              **_group(parts[1])})
        return None
    gv = tuple(parts[1:])
    if len(parts) == 3 and parts[0] == "apis" and gv in resources.group_versions():
        return wire.json_response(200, resource_list(parts[1], parts[2]))
    return None


def _openapi(path: str) -> wire.Response:
    if path == "/openapi/v3":
        return wire.Response(200, orjson.dumps(openapi.index()))  # the handler's json.Marshal
    if path.startswith("/openapi/v3/"):
        body = openapi.documents().get(path[len("/openapi/v3/"):])
        if body is None:
            raise errors.generic_not_found()
        return wire.Response(200, body, headers={"Cache-Control": "public, immutable"})
    # /openapi/v2 is served as protobuf by kube-apiserver; kubectl uses v3 when present.
    raise errors.generic_not_found()
