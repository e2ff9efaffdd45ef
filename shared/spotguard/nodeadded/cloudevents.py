"""CloudEvents 1.0 over HTTP (binary and structured modes): the Knative face of the function.

Event types: see :mod:`spotguard.nodeadded.triggers`. Answers: 200 with a
structured CloudEvent (type ``dev.spotguard.node-added.result``, JSON data
saying what the pass did) for passes run and for events acknowledged without
one (foreign, malformed, nothing to do), so Knative never redelivers them; 503
when the pass could not run (Knative retries); 400 for a request that is not a
CloudEvent at all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.v1.event import CloudEvent

from spotguard.interruption import cloudevents as interruption_ce
from spotguard.nodeadded import service, triggers

RESULT_TYPE = "dev.spotguard.node-added.result"
RESULT_SOURCE = "/spotguard/node-added"
NotACloudEvent = interruption_ce.NotACloudEvent
decode_http = interruption_ce.decode_http


@dataclass(frozen=True)
class Reply:
    status: int
    data: dict[str, Any] = field(default_factory=dict)

    def to_event(self) -> CloudEvent:
        return CloudEvent(
            attributes={
                "type": RESULT_TYPE,
                "source": RESULT_SOURCE,
                "id": str(uuid.uuid4()),
                "time": datetime.now(UTC),
                "datacontenttype": "application/json",
            },
            data=self.data,
        )

    def to_http(self) -> ce_http.HTTPMessage:
        return ce_http.to_structured_event(self.to_event())


def handle_event(event: BaseCloudEvent, svc: service.Service) -> Reply:
    about = {"id": event.get_id(), "type": event.get_type(), "source": event.get_source()}
    try:
        trigger = triggers.from_cloudevent(event.get_type(), event.get_id(), event.get_data())
    except triggers.TriggerError as exc:
        result = "foreign" if isinstance(exc, triggers.Foreign) else "malformed"
        service.log.info("acknowledged without a pass: %s", exc.message, extra={**about, "result": result})
        return Reply(200, {**about, "result": result, "reason": exc.message})
    try:
        answer = svc.handle(trigger)
    except service.Transient as exc:
        return Reply(503, {**about, "result": "retry", "reason": str(exc)})
    return Reply(200, {**about, **answer.to_json()})


def handle_http(headers: Mapping[str, str], body: bytes, svc: service.Service) -> tuple[int, dict[str, str], bytes]:
    """The whole HTTP exchange: (status, headers, body). 400 when it is not a CloudEvent."""
    try:
        event = decode_http(headers, body)
    except NotACloudEvent as exc:
        text = json.dumps({"error": "not a CloudEvent", "reason": str(exc)}).encode()
        return 400, {"content-type": "application/json"}, text
    reply = handle_event(event, svc)
    message = reply.to_http()
    return reply.status, dict(message.headers), message.body
