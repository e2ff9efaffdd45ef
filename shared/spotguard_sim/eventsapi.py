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

The conversion and the validation, which the storage (``strategies``) and the
controllers use too; the handlers are ``eventshandlers``'s.
"""

from __future__ import annotations

from typing import Any

import orjson

from spotguard_sim import errors

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


def raw_from_core(raw: bytes) -> bytes:
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
