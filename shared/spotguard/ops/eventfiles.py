"""Recognise a captured event file: which kind it is, and what it asks for.

Kinds (each file is one JSON document):

=====================  ==================================================================
``eventbridge``        an EventBridge event (``detail-type``, ``source``, ``detail``)
``schedule``           a reconcile: the EventBridge ``Scheduled Event``, or the input the
                       EventBridge Scheduler sends (``{"spotguard": "reconcile", ...}``)
``sqs-message``        an SQS message as ReceiveMessage returns it (``MessageId``, ``Body``)
``lambda-sqs-batch``   a Lambda SQS event (``Records`` from ``aws:sqs``)
``cloudevent``         a CloudEvent: structured JSON (``specversion``), or an HTTP capture
                       ``{"headers": {...}, "body": "..."}`` in binary or structured mode
``apiserversource``    a CloudEvent ``dev.knative.apiserver.resource.add`` (a node joined)
``pingsource``         a CloudEvent ``dev.knative.sources.ping`` (a reconcile)
``admission-review``   an AdmissionReview ``admission.k8s.io/v1``
=====================  ==================================================================

:func:`read` raises :class:`BadFile` with a sentence for a person when a file
is not JSON or of none of these kinds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotguard.interruption import cloudevents as ce
from spotguard.interruption import dispatch, events, sqs

APISERVER_ADD = "dev.knative.apiserver.resource.add"
PING = "dev.knative.sources.ping"
SCHEDULED = "Scheduled Event"
RECONCILE = "reconcile"  # the "spotguard" key of the EventBridge Scheduler's input (infra/aws/template.yaml)


class BadFile(ValueError):
    """A file that cannot be replayed (the message says why, for a person)."""


@dataclass
class EventFile:
    path: Path
    kind: str
    payload: Any  # the parsed JSON
    event: Any = None  # the CloudEvent, for the CloudEvent kinds
    http: dict[str, Any] = field(default_factory=dict)  # headers and body, for an HTTP capture

    def deliveries(self) -> list[dispatch.Delivery]:
        """The interruption notices it carries (or why an item carries none)."""
        if self.kind == "eventbridge":
            return [dispatch.Delivery.decode(self.path.name, lambda: events.decode_all(self.payload, str(self.path)))]
        if self.kind == "sqs-message":
            return [sqs.decode_message(self.payload)]
        if self.kind == "lambda-sqs-batch":
            return [sqs.decode_record(r, i) for i, r in enumerate(self.payload["Records"])]
        if self.kind == "cloudevent":
            return [ce.delivery(self.event)]
        return []

    @property
    def function(self) -> str:
        """The function that handles it."""
        if self.kind == "admission-review":
            return "admission"
        if self.kind == "apiserversource":
            return "node-added"
        if self.kind == "eventbridge" and _running(self.payload):
            return "node-added"  # on AWS, a new instance is the node-added trigger
        return "spot-interruption"


def expand(paths: Iterable[str]) -> list[Path]:
    """Files as given, and the ``*.json`` files of each folder (sorted); a missing path is an error."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix == ".json")
            if not found:
                raise BadFile(f"{p} is a folder with no .json event files")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise BadFile(f"{p}: no such file or folder")
    return out


def read(path: Path) -> EventFile:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadFile(f"{path}: cannot be read ({exc})") from exc
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadFile(f"{path} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    return recognise(path, payload)


def recognise(path: Path, payload: Any) -> EventFile:
    if not isinstance(payload, Mapping):
        raise BadFile(f"{path}: an event file holds one JSON object, not a {type(payload).__name__}")
    if payload.get("kind") == "AdmissionReview":
        if not isinstance(payload.get("request"), Mapping):
            raise BadFile(f"{path}: an AdmissionReview without a request")
        return EventFile(path, "admission-review", payload)
    if isinstance(payload.get("headers"), Mapping) and "body" in payload:
        headers = {str(k): str(v) for k, v in payload["headers"].items()}
        body = payload["body"]
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        try:
            event = ce.decode_http(headers, raw)
        except ce.NotACloudEvent as exc:
            raise BadFile(f"{path}: an HTTP capture that is {exc}") from exc
        return _cloudevent(path, payload, event, {"headers": headers, "body": raw})
    if "specversion" in payload:
        raw = json.dumps(payload).encode()
        try:
            event = ce.decode_http({"content-type": ce.STRUCTURED}, raw)
        except ce.NotACloudEvent as exc:
            raise BadFile(f"{path}: {exc}") from exc
        return _cloudevent(path, payload, event, {"headers": {"content-type": ce.STRUCTURED}, "body": raw})
    if sqs.is_batch(payload):
        return EventFile(path, "lambda-sqs-batch", payload)
    if ("Body" in payload or "body" in payload) and ("MessageId" in payload or "messageId" in payload):
        return EventFile(path, "sqs-message", payload)
    if payload.get("detail-type") == SCHEDULED or payload.get("spotguard") == RECONCILE:
        return EventFile(path, "schedule", payload)
    if events.is_eventbridge(payload):
        return EventFile(path, "eventbridge", payload)
    raise BadFile(
        f"{path}: not an event spotguard knows. Expected an EventBridge event, an SQS message, a Lambda SQS "
        "batch, a CloudEvent (structured JSON, or an HTTP capture with headers and body), an AdmissionReview, "
        "a Knative ApiServerSource or PingSource event, or the EventBridge Scheduler's input "
        '{"spotguard": "reconcile"} (examples in infra/events/)'
    )


def _cloudevent(path: Path, payload: Any, event: Any, http: dict[str, Any]) -> EventFile:
    ce_type = event.get_type()
    kind = "apiserversource" if ce_type == APISERVER_ADD else "pingsource" if ce_type == PING else "cloudevent"
    return EventFile(path, kind, payload, event, http)


def _running(event: Mapping[str, Any]) -> bool:
    detail = event.get("detail")
    return (
        event.get("detail-type") == events.STATE_CHANGE
        and isinstance(detail, Mapping)
        and detail.get("state") == "running"
    )


def node_of(f: EventFile) -> Mapping[str, Any] | None:
    """The Node an ApiServerSource add event carries (mode Resource), if any."""
    data = f.event.get_data() if f.event is not None else None
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    return data if isinstance(data, Mapping) and data.get("kind") == "Node" else None
