"""What the simulated API server's handlers take and give: a request, a response, the
resource a path names, and the request helpers every handler shares (dry run, strict
field validation, a JSON or YAML body).

Below the handlers (``routes`` and the handlers it calls: ``accessreviews``,
``discovery``, ``eventshandlers``) and above the storage they call: a handler module
imports this one, never ``routes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from spotguard_sim import errors, resources

if TYPE_CHECKING:
    from spotguard_sim.store import Watcher

Obj = dict[str, Any]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]
    body: bytes
    user: dict[str, Any]


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    watch: Watcher | None = None
    watch_timeout: float | None = None
    # turns a watched object's JSON into what is sent (a one-row Table for kubectl get -w)
    watch_transform: Callable[[bytes], bytes] | None = None
    # allowWatchBookmarks: a BOOKMARK object's JSON, sent every watch_bookmark_seconds (real)
    watch_bookmark: Callable[[], bytes] | None = None
    watch_bookmark_seconds: float = 60.0


@dataclass(frozen=True)
class Target:
    rtype: resources.ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def verb_resource(self) -> str:
        return self.rtype.plural


def parse_query(raw: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}


def encode(obj: Any) -> bytes:
    """An API object's JSON as kube-apiserver writes it: encoding/json's ``Encoder.Encode``
    (apimachinery ``runtime/serializer/json`` ``doEncode``), which ends the value with a
    newline; streamed lists end with ``}\n`` too (``collections.go``). Not for what the
    server writes raw (``/version``, the OpenAPI documents)."""
    return orjson.dumps(obj) + b"\n"


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, encode(obj), headers=headers or {})


def status_response(exc: errors.StatusError) -> Response:
    headers = {}
    if exc.details.get("retryAfterSeconds"):  # an eviction refused by a budget sends none
        headers["Retry-After"] = str(exc.details["retryAfterSeconds"])
    return json_response(exc.code, exc.status(), headers)


def success(code: int = 200, details: dict[str, Any] | None = None) -> Response:
    body: dict[str, Any] = {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code,
    }
    if details:
        body["details"] = details
    return json_response(code, body)


def resolve(path: str) -> Target | None:
    """Map a resource path to its target, or None when it is not a resource path."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3 and (
        rest[2] in resources.PLURALS or rest[2] == "bindings"
    ):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    if plural == "bindings" and group == "" and namespace and len(rest) == 1:
        # the legacy Binding resource: POST a Binding named after the pod
        return Target(resources.BY_PLURAL["pods"], namespace, None, "binding")
    rtype = next((r for r in resources.SERVED
                  if (r.plural, r.group, r.version) == (plural, group, version)), None)
    if rtype is None:
        raise errors.generic_not_found()
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if len(rest) > 3:
        raise errors.generic_not_found()
    if sub is not None and sub not in rtype.subresources:
        raise errors.generic_not_found()
    if rtype.namespaced and name is not None and namespace is None:
        raise errors.generic_not_found()
    if not rtype.namespaced and namespace is not None:
        raise errors.generic_not_found()
    return Target(rtype, namespace, name, sub)


def verb_of(method: str, target: Target, query: Mapping[str, str]) -> str:
    if method == "GET":
        if target.name is None:
            return "watch" if true(query.get("watch")) else "list"
        return "get"
    return {
        "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete",
    }.get(method, method.lower())


def true(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "")


def dry_run(query: Mapping[str, str], body: Mapping[str, Any] | None = None) -> bool:
    value = query.get("dryRun")
    if value is not None:
        if value != "All":
            raise errors.BadRequest(f'Invalid dryRun value "{value}": valid values are "All"')
        return True
    if body and isinstance(body.get("dryRun"), list):
        return "All" in body["dryRun"]
    return False


def strict(rtype: resources.ResourceType, query: Mapping[str, str], body: Any) -> None:
    """fieldValidation=Strict: unknown fields are a 400, as kube-apiserver answers."""
    if query.get("fieldValidation") != "Strict" or not isinstance(body, dict):
        return
    from spotguard_sim import openapi

    unknown = openapi.unknown_fields(rtype, body)
    if unknown:
        raise errors.BadRequest(
            f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
            + "strict decoding error: "
            + ", ".join(f'unknown field "{u}"' for u in unknown)
        )


def load(body: bytes, what: str = "request body") -> Any:
    if not body:
        raise errors.BadRequest(f"the {what} is empty")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            import yaml

            return yaml.safe_load(body)
        except Exception as exc:
            raise errors.BadRequest(f"the {what} is not valid JSON: {exc}") from exc
