"""The ``events.k8s.io/v1`` handlers: requests through the second group version of the
core/v1 Events, converted and validated by ``eventsapi`` (which the storage below
calls too).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from spotguard_sim import errors, eventsapi, partialmeta, patching, patchmeta, resources, wire

if TYPE_CHECKING:
    from spotguard_sim import routes

Obj = dict[str, Any]


def _check(name: str, causes: list[dict[str, str]]) -> None:
    if causes:
        raise errors.invalid("Event", name, causes, eventsapi.GROUP)


def _json_object(body: bytes) -> Obj:
    obj = wire.load(body)
    if not isinstance(obj, dict):
        raise errors.BadRequest("the request body must be a JSON object")
    return obj


def _input(obj: Obj) -> Obj:
    if obj.get("apiVersion") not in (None, eventsapi.API_VERSION) or obj.get("kind") not in (None, "Event"):
        raise errors.BadRequest(
            f"the API version in the data ({obj.get('apiVersion')}) does not match the expected "
            f"API version ({eventsapi.API_VERSION})")
    return eventsapi.to_core(obj)


def handle(api: routes.Api, request: wire.Request, t: wire.Target) -> wire.Response:
    """Serve one events.k8s.io/v1 request from the core/v1 Events of the store."""
    core_t = replace(t, rtype=resources.BY_PLURAL["events"])
    store, q, method = api.store, request.query, request.method
    dry_run = wire.dry_run(q)
    if method == "GET" and t.name is None:
        query = dict(q)
        if "fieldSelector" in query:
            query["fieldSelector"] = eventsapi.core_field_selector(query["fieldSelector"]) or ""
        core_request = replace(request, query=query)
        if wire.true(q.get("watch")):
            response = api._watch(core_request, core_t)
            table = response.watch_transform
            response.watch_transform = (
                eventsapi.raw_from_core if table is None else (lambda raw: table(eventsapi.raw_from_core(raw))))
            if response.watch_bookmark is not None:
                def bookmark() -> bytes:
                    return orjson.dumps({"kind": "Event", "apiVersion": eventsapi.API_VERSION,
                                         "metadata": {"resourceVersion": store.resource_version}})

                response.watch_bookmark = bookmark
            return response
        response = api._list(core_request, core_t)
        listed = orjson.loads(response.body)
        if listed.get("kind") == "EventList":
            listed["apiVersion"] = eventsapi.API_VERSION
            listed["items"] = [eventsapi.from_core(item) for item in listed.get("items") or []]
            response.body = wire.encode(listed)
        return response
    if method == "GET":
        assert t.name is not None
        partial = partialmeta.requested(request.headers.get("accept", ""))
        event = eventsapi.from_core(store.get("events", t.name, t.namespace))
        return wire.json_response(
            200, event if partial is None else partialmeta.of_object(event, partial))
    if method == "POST":
        if t.name is not None:
            raise errors.generic_method_not_allowed()
        obj = _json_object(request.body)
        wire.strict(t.rtype, q, obj)
        core = _input(obj)
        name = str((core.get("metadata") or {}).get("name") or "")
        _check(name, eventsapi.legacy_causes({**core, "metadata": {
            **(core.get("metadata") or {}), "namespace": t.namespace}}, v1_names=True)
            + eventsapi.create_causes(core))
        created = store.create("events", core, namespace=t.namespace, dry_run=dry_run,
                               user=request.user)
        return wire.json_response(201, eventsapi.from_core(created))
    if method in ("PUT", "PATCH"):
        if t.name is None:
            raise errors.generic_method_not_allowed()
        return wire.json_response(200, eventsapi.from_core(_write(api, request, t, dry_run)))
    if method == "DELETE":
        response = api._dispatch(request, core_t)
        with contextlib.suppress(ValueError):
            body = orjson.loads(response.body)
            if body.get("kind") == "Event":
                response.body = wire.encode(eventsapi.from_core(body))
        return response
    raise errors.generic_method_not_allowed()


def _write(api: routes.Api, request: wire.Request, t: wire.Target, dry_run: bool) -> Obj:
    """An update or patch through events.k8s.io/v1: the change is made on the v1 form."""
    assert t.name is not None
    store, q = api.store, request.query
    if request.method == "PUT":
        new_v1 = _json_object(request.body)
        wire.strict(t.rtype, q, new_v1)
        if (new_v1.get("metadata") or {}).get("name") not in (None, t.name):
            raise errors.BadRequest("the name of the object does not match the name on the URL")
        patch_type, patch = None, None
    else:
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        patch_type = patching.CONTENT_TYPES.get(ctype)
        if patch_type is None:
            raise errors.UnsupportedMediaType(
                "the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(patching.CONTENT_TYPES)}")
        patch = wire.load(request.body)
        if patch_type in ("merge", "strategic"):
            wire.strict(t.rtype, q, patch)
    for _attempt in range(20):
        old = store.get("events", t.name, t.namespace)
        if patch_type is not None:
            new_v1 = patching.apply(eventsapi.from_core(old), patch, patch_type, patchmeta.root(t.rtype))
        new = _input(new_v1)
        meta = new.setdefault("metadata", {})
        pinned = meta.get("resourceVersion") not in (None, "")
        if patch_type is not None and not pinned:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        meta["name"] = t.name
        _check(t.name, eventsapi.legacy_causes({**new, "metadata": {**meta, "namespace": t.namespace}},
                                     v1_names=True) + eventsapi.update_causes(old, new))
        try:
            return store.update("events", new, dry_run=dry_run, namespace=t.namespace,
                                user=request.user)
        except errors.Conflict:
            if pinned or patch_type is None:
                raise
    raise errors.Conflict(f'Operation cannot be fulfilled on events.events.k8s.io "{t.name}"')
