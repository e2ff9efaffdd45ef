"""What a request asks, for the authorizer: ``RequestInfoFactory.NewRequestInfo``
(``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``).

Read from the path alone, before any routing, so a resource the simulated cluster
does not serve is authorized like any other (a 403 comes before a 404, as upstream).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from spotguard_sim.rbac import Attributes

_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
# a fieldSelector that names exactly one object: metadata.name=x or metadata.name==x
_NAME_SELECTOR = re.compile(r"^metadata\.name==?([^,=!]+)$")


def attributes(method: str, path: str, query: Mapping[str, str], user: Mapping[str, Any]) -> Attributes:
    parts = [p for p in path.strip("/").split("/") if p] if path.strip("/") else []
    non_resource = Attributes(user=user, verb=method.lower(), resource_request=False, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in ("watch", "proxy"):  # the legacy /watch/ and /proxy/ prefixes
        if len(parts) < 2:
            return Attributes(user=user, verb=parts[0], resource_request=True, group=group, version=version)
        verb, parts = parts[0], parts[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        watch = query.get("watch")
        verb = "watch" if watch is not None and watch.lower() not in ("false", "0") else "list"
        match = _NAME_SELECTOR.match(query.get("fieldSelector") or "")
        if match:
            name = match.group(1)
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(
        user=user, verb=verb, resource_request=True, namespace=namespace, group=group, version=version,
        resource=resource, subresource=subresource, name=name, path=path,
    )
