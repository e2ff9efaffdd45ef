"""CloudEvents 1.0 over HTTP (binary and structured modes): the Knative face of the function.

Accepted event types:

=======================================  ===========================================
``dev.knative.eventing.aws-sqs``         Knative IntegrationSource ``aws.sqs``: data
(and ``dev.knative.connector.event.      is the SQS message body, the EventBridge
aws-sqs``, its earlier name)             event
``com.amazon.sqs.message``               an SQS source (TriggerMesh AWSSQSSource):
                                         data is the SQS message, ``Body`` holds the
                                         EventBridge event
any other type whose data has            an EventBridge event as data (an EventBridge
``detail-type``                          API destination, a replay)
``dev.knative.sources.ping``             PingSource: run ``handler.reconcile()``
=======================================  ===========================================

Answers: 200 with a structured CloudEvent (type ``dev.spotguard.interruption.result``,
JSON data saying what happened) for handled, ignored, malformed and foreign
events, so Knative never redelivers them; 503 only for a transient failure,
so Knative retries; 400 (from the HTTP layer) for a request that is not a
CloudEvent at all. Knative accepts an empty body or a CloudEvent as a reply,
nothing else, which is why the answer is itself a CloudEvent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cloudevents.core.base import BaseCloudEvent

from spotguard import eventhttp
from spotguard.interruption import dispatch, events
from spotguard.policy.notices import Notice

PING = "dev.knative.sources.ping"
SQS_BODY_TYPES = frozenset(
    {
        "dev.knative.eventing.aws-sqs",  # Knative eventing-integrations (IntegrationSource aws.sqs)
        "dev.knative.connector.event.aws-sqs",  # its name in earlier releases (late 2024)
        "dev.knative.eventing.aws.sqs",  # the spelling eventing-integrations' sink tests send
    }
)
SQS_MESSAGE_TYPES = frozenset({"com.amazon.sqs.message"})
RESULT_TYPE = "dev.spotguard.interruption.result"
RESULT_SOURCE = "/spotguard/spot-interruption"
STRUCTURED = eventhttp.STRUCTURED
NotACloudEvent = eventhttp.NotACloudEvent
decode_http = eventhttp.decode_http


class Reply(eventhttp.Reply):
    """What the function answers to one CloudEvent."""

    RESULT_TYPE = RESULT_TYPE
    RESULT_SOURCE = RESULT_SOURCE


def handle_event(event: BaseCloudEvent, handler: dispatch.Handler) -> Reply:
    """Handle one decoded CloudEvent."""
    ce_type = event.get_type()
    about = {"id": event.get_id(), "type": ce_type, "source": event.get_source()}
    if ce_type == PING:
        if dispatch.reconcile(handler, transport="cloudevents"):
            return Reply(200, {**about, "result": "reconciled"})
        return Reply(503, {**about, "result": "retry", "reason": "reconcile failed"})
    item = delivery(event)
    [result] = dispatch.deliver(handler, [item], transport="cloudevents")
    data: dict[str, Any] = {**about, "result": result.value}
    if item.notice is not None:
        data["notice"] = events.to_json(item.notice)
    if item.error is not None:
        data["reason"] = item.error.message
    if result is dispatch.Result.RETRY:
        data.setdefault("reason", "transient failure: deliver again")
        return Reply(503, data)
    return Reply(200, data)


def handle_http(headers: Mapping[str, str], body: bytes, handler: dispatch.Handler) -> eventhttp.Exchange:
    """The whole HTTP exchange: (status, headers, body). 400 when it is not a CloudEvent."""
    return eventhttp.handle_http(headers, body, lambda event: handle_event(event, handler))


def delivery(event: BaseCloudEvent) -> dispatch.Delivery:
    """The notice a CloudEvent carries, or why it carries none."""
    key = event.get_id()
    return dispatch.Delivery.decode(key, lambda: _notice(event))


def _notice(event: BaseCloudEvent) -> list[Notice]:
    ce_type = event.get_type()
    data = event.get_data()
    what = f"CloudEvent {event.get_id()} ({ce_type}) data"
    if ce_type in SQS_BODY_TYPES:
        return events.decode_all(_parsed(data, what), what)
    if ce_type in SQS_MESSAGE_TYPES:
        message = _parsed(data, what)
        if not isinstance(message, Mapping):
            raise events.Malformed(f"{what} is not an SQS message object")
        body = message.get("Body", message.get("body"))
        if isinstance(body, Mapping):
            return events.decode_all(body, f"{what} Body")
        if not isinstance(body, str):
            raise events.Malformed(f"{what} is an SQS message without a string 'Body'")
        return events.decode_json_all(body, f"{what} Body")
    try:
        parsed = _parsed(data, what)
    except events.Malformed:
        parsed = None
    if events.is_eventbridge(parsed):
        return events.decode_all(parsed, what)
    raise events.Foreign(f"CloudEvent type {ce_type!r} is not one this function handles")


def _parsed(data: object, what: str) -> object:
    if data is None:
        raise events.Malformed(f"{what} is missing")
    if isinstance(data, str | bytes | bytearray):
        return events.parse_json(data, what)
    return data
