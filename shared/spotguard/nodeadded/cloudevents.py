"""CloudEvents 1.0 over HTTP (binary and structured modes): the Knative face of the function.

Event types: see :mod:`spotguard.nodeadded.triggers`. Answers: 200 with a
structured CloudEvent (type ``dev.spotguard.node-added.result``, JSON data
saying what the pass did) for passes run and for events acknowledged without
one (foreign, malformed, nothing to do), so Knative never redelivers them; 503
when the pass could not run (Knative retries); 400 for a request that is not a
CloudEvent at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from cloudevents.core.base import BaseCloudEvent

from spotguard import eventhttp
from spotguard.nodeadded import service, triggers

RESULT_TYPE = "dev.spotguard.node-added.result"
RESULT_SOURCE = "/spotguard/node-added"
NotACloudEvent = eventhttp.NotACloudEvent
decode_http = eventhttp.decode_http


class Reply(eventhttp.Reply):
    RESULT_TYPE = RESULT_TYPE
    RESULT_SOURCE = RESULT_SOURCE


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


def handle_http(headers: Mapping[str, str], body: bytes, svc: service.Service) -> eventhttp.Exchange:
    """The whole HTTP exchange: (status, headers, body). 400 when it is not a CloudEvent."""
    return eventhttp.handle_http(headers, body, lambda event: handle_event(event, svc))
