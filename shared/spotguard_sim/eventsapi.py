"""``events.k8s.io/v1`` Events: a second view of the core/v1 Events in the store.

kube-apiserver keeps one Event storage (``/registry/events``) and serves it through
both group versions, so an Event written through either is read through both. The
conversion is upstream's (``pkg/apis/events/v1/conversion.go``): ``regarding`` <->
``involvedObject``, ``note`` <-> ``message``, ``deprecatedSource`` <-> ``source``,
``deprecatedFirstTimestamp`` / ``deprecatedLastTimestamp`` / ``deprecatedCount`` <->
``firstTimestamp`` / ``lastTimestamp`` / ``count``, ``reportingController`` <-> core's
``reportingComponent``; ``eventTime``, ``series``, ``action``, ``reason``,
``related``, ``reportingInstance`` and ``type`` keep their names. Writes through
``events.k8s.io/v1`` get the strict validation of ``ValidateEventCreate`` /
``ValidateEventUpdate`` (``pkg/apis/core/validation/events.go``); field selectors
are translated as ``AddFieldLabelConversionsForEvent`` does.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from spotguard_sim import errors, partialmeta, patching, patchmeta, resources

if TYPE_CHECKING:
    from spotguard_sim import routes

Obj = dict[str, Any]

GROUP, VERSION = "events.k8s.io", "v1"
API_VERSION = f"{GROUP}/{VERSION}"
# (events.k8s.io/v1 name, core/v1 name) of the fields the conversion renames
_RENAMED = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
)
_KEPT = ("metadata", "eventTime", "series", "action", "reason", "related",
         "reportingInstance", "type")
# AddFieldLabelConversionsForEvent (pkg/apis/events/v1): every other label is a 400
_FIELD_LABELS = {
    "metadata.name": "metadata.name",
    "metadata.namespace": "metadata.namespace",
    "reason": "reason",
    "type": "type",
    "reportingController": "reportingComponent",
    **{f"regarding.{f}": f"involvedObject.{f}" for f in (
        "kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
}
# pkg/apis/core/validation/events.go
REPORTING_INSTANCE_LIMIT = ACTION_LIMIT = REASON_LIMIT = 128
NOTE_LIMIT = 1024
_IMMUTABLE = ("involvedObject", "reason", "message", "source", "firstTimestamp",
              "lastTimestamp", "count", "type", "eventTime", "action", "related",
              "reportingComponent", "reportingInstance")
_V1_NAME = {core: v1 for v1, core in _RENAMED}


def to_core(event: Obj) -> Obj:
    """An events.k8s.io/v1 Event as the core/v1 Event that is stored."""
    out: Obj = {"apiVersion": "v1", "kind": "Event"}
    for key in _KEPT:
        if key in event:
            out[key] = event[key]
    for new, old in _RENAMED:
        if new in event:
            out[old] = event[new]
    # what Go's encoding/json always writes for the core type (structs and Times)
    for key, empty in (("involvedObject", {}), ("source", {}), ("firstTimestamp", None),
                       ("lastTimestamp", None), ("eventTime", None)):
        out.setdefault(key, empty)
    return out


def from_core(event: Obj) -> Obj:
    """A stored core/v1 Event as events.k8s.io/v1 shows it."""
    out: Obj = {"apiVersion": API_VERSION, "kind": "Event"}
    for key in _KEPT:
        if key in event:
            out[key] = event[key]
    for new, old in _RENAMED:
        if old in event and event[old] not in (None, 0, "", {}):
            out[new] = event[old]
    # structs and Times are serialised even when zero (omitempty does not drop them)
    for key, empty in (("eventTime", None), ("regarding", {}), ("deprecatedSource", {}),
                       ("deprecatedFirstTimestamp", None), ("deprecatedLastTimestamp", None)):
        out.setdefault(key, empty)
    return out


def _raw_from_core(raw: bytes) -> bytes:
    return orjson.dumps(from_core(orjson.loads(raw)))


def core_field_selector(selector: str | None) -> str | None:
    """Translate an events.k8s.io/v1 field selector to core/v1's labels (400 when unknown)."""
    if not selector:
        return selector
    terms = []
    for term in selector.split(","):
        for op in ("!=", "==", "="):
            if op in term:
                key, value = term.split(op, 1)
                break
        else:
            raise errors.BadRequest(f"invalid field selector: {term!r}")
        mapped = _FIELD_LABELS.get(key.strip())
        if mapped is None:
            raise errors.BadRequest(f'field label not supported: {key.strip()}')
        terms.append(f"{mapped}{op}{value}")
    return ",".join(terms)


def _cause(field: str, message: str) -> dict[str, str]:
    return {"field": field, "message": message}


def create_causes(core: Obj) -> list[dict[str, str]]:
    """ValidateEventCreate's strict rules for events.k8s.io/v1 (on the core form)."""
    causes = _series_causes(core)
    if not core.get("eventTime"):
        causes.append(_cause("eventTime", "Required value"))
    if core.get("type") not in ("Normal", "Warning"):
        causes.append(_cause("type", f"Invalid value: \"\": has invalid value: {core.get('type') or ''}"))
    for field, v1 in (("firstTimestamp", "deprecatedFirstTimestamp"),
                      ("lastTimestamp", "deprecatedLastTimestamp"), ("count", "deprecatedCount")):
        if core.get(field):
            causes.append(_cause(v1, 'Invalid value: "": needs to be unset'))
    source = core.get("source") or {}
    if isinstance(source, dict) and (source.get("component") or source.get("host")):
        causes.append(_cause("deprecatedSource", 'Invalid value: "": needs to be unset'))
    return causes


def _series_causes(core: Obj) -> list[dict[str, str]]:
    series = core.get("series")
    if series is None:
        return []
    if not isinstance(series, dict):
        return [_cause("series", "Invalid value: must be an object")]
    causes = []
    count = series.get("count")
    if not isinstance(count, int) or count < 2:
        causes.append(_cause("series.count", 'Invalid value: "": should be at least 2'))
    if not series.get("lastObservedTime"):
        causes.append(_cause("series.lastObservedTime", "Required value"))
    return causes


def legacy_causes(core: Obj, *, v1_names: bool = False) -> list[dict[str, str]]:
    """legacyValidateEvent: what every Event write must pass, through either API."""
    causes: list[dict[str, str]] = []
    meta = core.get("metadata") or {}
    ns = meta.get("namespace") or ""
    involved = core.get("involvedObject") or {}
    involved_ns = involved.get("namespace") or "" if isinstance(involved, dict) else ""
    where = "regarding.namespace" if v1_names else "involvedObject.namespace"
    if not core.get("eventTime"):
        if (not involved_ns and ns not in ("", "default")) or (involved_ns and involved_ns != ns):
            causes.append(_cause(where, f'Invalid value: "{involved_ns}": does not match event.namespace'))
        return causes
    if not involved_ns and ns not in ("default", "kube-system"):
        causes.append(_cause(where, f'Invalid value: "{involved_ns}": does not match event.namespace'))
    controller_field = "reportingController" if v1_names else "reportingComponent"
    controller = str(core.get("reportingComponent") or "")
    if not controller:
        causes.append(_cause(controller_field, "Required value"))
    elif not _qualified_name(controller):
        causes.append(_cause(controller_field, f'Invalid value: "{controller}": must be a '
                             "qualified name ([prefix/]name, name at most 63 characters)"))
    instance = str(core.get("reportingInstance") or "")
    if not instance:
        causes.append(_cause("reportingInstance", "Required value"))
    elif len(instance) > REPORTING_INSTANCE_LIMIT:
        causes.append(_cause("reportingInstance", f'Invalid value: "": can have at most '
                             f"{REPORTING_INSTANCE_LIMIT} characters"))
    for field, limit in (("action", ACTION_LIMIT), ("reason", REASON_LIMIT)):
        value = str(core.get(field) or "")
        if not value:
            causes.append(_cause(field, "Required value"))
        elif len(value) > limit:
            causes.append(_cause(field, f'Invalid value: "": can have at most {limit} characters'))
    if len(str(core.get("message") or "")) > NOTE_LIMIT:
        causes.append(_cause("note" if v1_names else "message",
                             f'Invalid value: "": can have at most {NOTE_LIMIT} characters'))
    return causes


def _qualified_name(value: str) -> bool:
    """apimachinery IsQualifiedName: an optional DNS subdomain prefix, then a name of at
    most 63 characters."""
    from spotguard_sim import selectors

    prefix, _, name = value.rpartition("/")
    return (len(name) <= 63 and len(prefix) <= 253
            and selectors._KEY.match(value) is not None)


def update_causes(old: Obj, new: Obj) -> list[dict[str, str]]:
    """ValidateEventUpdate for events.k8s.io/v1: only the series (and metadata) may change."""
    causes = _series_causes(new)
    for field in _IMMUTABLE:
        if (old.get(field) or None) != (new.get(field) or None):  # zero values are equal
            causes.append(_cause(_V1_NAME.get(field, field), "Invalid value: field is immutable"))
    return causes


def _check(name: str, causes: list[dict[str, str]]) -> None:
    if causes:
        raise errors.invalid("Event", name, causes, GROUP)


def _json_object(body: bytes) -> Obj:
    from spotguard_sim import routes as routes_mod

    obj = routes_mod._load(body)
    if not isinstance(obj, dict):
        raise errors.BadRequest("the request body must be a JSON object")
    return obj


def _input(obj: Obj) -> Obj:
    if obj.get("apiVersion") not in (None, API_VERSION) or obj.get("kind") not in (None, "Event"):
        raise errors.BadRequest(
            f"the API version in the data ({obj.get('apiVersion')}) does not match the expected "
            f"API version ({API_VERSION})")
    return to_core(obj)


def handle(api: routes.Api, request: routes.Request, t: routes.Target) -> routes.Response:
    """Serve one events.k8s.io/v1 request from the core/v1 Events of the store."""
    from spotguard_sim import routes as routes_mod

    core_t = replace(t, rtype=resources.BY_PLURAL["events"])
    store, q, method = api.store, request.query, request.method
    dry_run = routes_mod._dry_run(q)
    if method == "GET" and t.name is None:
        query = dict(q)
        if "fieldSelector" in query:
            query["fieldSelector"] = core_field_selector(query["fieldSelector"]) or ""
        core_request = replace(request, query=query)
        if routes_mod._true(q.get("watch")):
            response = api._watch(core_request, core_t)
            table = response.watch_transform
            response.watch_transform = (
                _raw_from_core if table is None else (lambda raw: table(_raw_from_core(raw))))
            if response.watch_bookmark is not None:
                def bookmark() -> bytes:
                    return orjson.dumps({"kind": "Event", "apiVersion": API_VERSION,
                                         "metadata": {"resourceVersion": store.resource_version}})

                response.watch_bookmark = bookmark
            return response
        response = api._list(core_request, core_t)
        listed = orjson.loads(response.body)
        if listed.get("kind") == "EventList":
            listed["apiVersion"] = API_VERSION
            listed["items"] = [from_core(item) for item in listed.get("items") or []]
            response.body = orjson.dumps(listed)
        return response
    if method == "GET":
        assert t.name is not None
        partial = partialmeta.requested(request.headers.get("accept", ""))
        event = from_core(store.get("events", t.name, t.namespace))
        return routes_mod.json_response(
            200, event if partial is None else partialmeta.of_object(event, partial))
    if method == "POST":
        if t.name is not None:
            raise errors.generic_method_not_allowed()
        obj = _json_object(request.body)
        routes_mod._strict(t.rtype, q, obj)
        core = _input(obj)
        name = str((core.get("metadata") or {}).get("name") or "")
        _check(name, legacy_causes({**core, "metadata": {
            **(core.get("metadata") or {}), "namespace": t.namespace}}, v1_names=True)
            + create_causes(core))
        created = store.create("events", core, namespace=t.namespace, dry_run=dry_run,
                               user=request.user)
        return routes_mod.json_response(201, from_core(created))
    if method in ("PUT", "PATCH"):
        if t.name is None:
            raise errors.generic_method_not_allowed()
        return routes_mod.json_response(200, from_core(_write(api, request, t, dry_run)))
    if method == "DELETE":
        response = api._dispatch(request, core_t)
        with contextlib.suppress(ValueError):
            body = orjson.loads(response.body)
            if body.get("kind") == "Event":
                response.body = orjson.dumps(from_core(body))
        return response
    raise errors.generic_method_not_allowed()


def _write(api: routes.Api, request: routes.Request, t: routes.Target, dry_run: bool) -> Obj:
    """An update or patch through events.k8s.io/v1: the change is made on the v1 form."""
    from spotguard_sim import routes as routes_mod

    assert t.name is not None
    store, q = api.store, request.query
    if request.method == "PUT":
        new_v1 = _json_object(request.body)
        routes_mod._strict(t.rtype, q, new_v1)
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
        patch = routes_mod._load(request.body)
        if patch_type in ("merge", "strategic"):
            routes_mod._strict(t.rtype, q, patch)
    for _attempt in range(20):
        old = store.get("events", t.name, t.namespace)
        if patch_type is not None:
            new_v1 = patching.apply(from_core(old), patch, patch_type, patchmeta.root(t.rtype))
        new = _input(new_v1)
        meta = new.setdefault("metadata", {})
        pinned = meta.get("resourceVersion") not in (None, "")
        if patch_type is not None and not pinned:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        meta["name"] = t.name
        _check(t.name, legacy_causes({**new, "metadata": {**meta, "namespace": t.namespace}},
                                     v1_names=True) + update_causes(old, new))
        try:
            return store.update("events", new, dry_run=dry_run, namespace=t.namespace,
                                user=request.user)
        except errors.Conflict:
            if pinned or patch_type is None:
                raise
    raise errors.Conflict(f'Operation cannot be fulfilled on events.events.k8s.io "{t.name}"')
