"""CloudEvents in binary and structured HTTP modes, through the Flask app and the Knative entry point.

The Knative entry point is driven in-process exactly as func-python 0.8.1 serves
it: ``func_python.cloudevent.ASGIApplication(new())`` called with ASGI scopes,
lifespan included. Answers are read back with the cloudevents 2.x bindings.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.v1.event import CloudEvent
from spotguard.interruption import app as app_mod
from spotguard.interruption import cloudevents

from tests.interruption.transport_support import (
    EVENTS,
    NTH_INSTANCE,
    SPOT_INSTANCE,
    RecordingHandler,
    knative_function,
    sample,
)

CE_SAMPLES = sorted(p.name for p in EVENTS.glob("cloudevent-*.json"))
# (cloudevent-apiserversource-node.*: a Node added, for the node-added function: foreign here.)
NOTICE_SAMPLES = [
    n for n in CE_SAMPLES if not any(word in n for word in ("ping", "foreign", "malformed", "apiserversource"))
]


def request_of(name: str) -> tuple[dict[str, str], bytes]:
    payload = sample(name)
    return payload["headers"], payload["body"].encode()


def result_of(status_headers_body: tuple[int, dict[str, str], bytes]) -> tuple[int, dict[str, Any]]:
    """The status and the result CloudEvent's data, checking the answer is a valid CloudEvent."""
    status, headers, body = status_headers_body
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered["content-type"].startswith("application/cloudevents+json")
    event = ce_http.from_http_event(ce_http.HTTPMessage(headers=lowered, body=body))
    assert event.get_type() == cloudevents.RESULT_TYPE
    assert event.get_source() == cloudevents.RESULT_SOURCE
    data = event.get_data()
    assert isinstance(data, dict)
    return status, data


# -- the Flask app -----------------------------------------------------------------------------


@pytest.fixture
def handler() -> RecordingHandler:
    return RecordingHandler()


@pytest.fixture
def client(handler: RecordingHandler) -> Any:
    return app_mod.create_app(handler).test_client()


def post(client: Any, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    response = client.post("/", headers=headers, data=body)
    return response.status_code, dict(response.headers), response.get_data()


@pytest.mark.parametrize("name", NOTICE_SAMPLES)
def test_flask_handles_each_mode_and_type(client: Any, handler: RecordingHandler, name: str) -> None:
    # GIVEN a CloudEvent as Knative sends it (binary or structured mode)
    headers, body = request_of(name)
    # WHEN it is posted to /
    status, data = result_of(post(client, headers, body))
    # THEN it is handled, and the answer says so
    assert status == 200
    assert data["result"] == "done"
    assert data["id"] == (headers.get("ce-id") or json.loads(body)["id"])
    assert data["notice"]["instance_id"] in {SPOT_INSTANCE, NTH_INSTANCE}
    assert len(handler.calls) == 1 and len(handler.calls[0]) == 1


def test_a_transient_failure_answers_503_so_knative_redelivers(client: Any, handler: RecordingHandler) -> None:
    handler.outcomes = {SPOT_INSTANCE: "retry"}
    status, data = result_of(post(client, *request_of("cloudevent-aws-sqs.binary.json")))
    assert status == 503
    assert data["result"] == "retry"


def test_an_ignored_notice_answers_200(client: Any, handler: RecordingHandler) -> None:
    handler.outcomes = {SPOT_INSTANCE: "ignored"}
    status, data = result_of(post(client, *request_of("cloudevent-aws-sqs.binary.json")))
    assert (status, data["result"]) == (200, "ignored")


@pytest.mark.parametrize(
    ("name", "result", "reason"),
    [
        ("cloudevent-foreign.binary.json", "foreign", "is not one this function handles"),
        ("cloudevent-aws-sqs-malformed.binary.json", "malformed", "is not an RFC 3339 timestamp"),
    ],
)
def test_foreign_and_malformed_events_are_acknowledged_with_200(
    client: Any, handler: RecordingHandler, name: str, result: str, reason: str
) -> None:
    status, data = result_of(post(client, *request_of(name)))
    assert status == 200
    assert data["result"] == result
    assert reason in data["reason"]
    assert handler.calls == []


@pytest.mark.parametrize("name", ["cloudevent-ping.binary.json", "cloudevent-ping.structured.json"])
def test_a_ping_runs_the_reconcile(client: Any, handler: RecordingHandler, name: str) -> None:
    status, data = result_of(post(client, *request_of(name)))
    assert (status, data["result"]) == (200, "reconciled")
    assert handler.reconciles == 1


def test_a_failed_reconcile_answers_503(client: Any, handler: RecordingHandler) -> None:
    handler.reconcile_raises = TimeoutError("API server timed out")
    status, data = result_of(post(client, *request_of("cloudevent-ping.binary.json")))
    assert (status, data["result"]) == (503, "retry")


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        # An EventBridge event posted as plain JSON is not a CloudEvent.
        (
            {"content-type": "application/json"},
            json.dumps(sample("ec2-spot-instance-interruption-warning.json")).encode(),
            "expected a CloudEvent: binary mode",
        ),
        ({"content-type": "text/plain"}, b"hello", "expected a CloudEvent"),
        ({"content-type": "application/cloudevents+json"}, b"{not json", "not a valid CloudEvent in structured mode"),
        ({"content-type": "application/cloudevents+json"}, b"[1, 2]", "not a valid CloudEvent in structured mode"),
        (
            # No ce-type (the SDK fills in a missing id, never a missing type).
            {"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/x", "content-type": "application/json"},
            b"{}",
            "not a valid CloudEvent in binary mode",
        ),
        (
            {"ce-specversion": "1.0", "ce-id": "1", "ce-type": "x", "ce-source": "/x", "ce-time": "yesterday"},
            b"{}",
            "not a valid CloudEvent in binary mode",
        ),
    ],
)
def test_a_request_that_is_not_a_cloudevent_answers_400(
    client: Any, handler: RecordingHandler, headers: dict[str, str], body: bytes, reason: str
) -> None:
    status, _, answer = post(client, headers, body)
    assert status == 400
    assert reason in json.loads(answer)["reason"]
    assert handler.calls == [] and handler.reconciles == 0


def test_health_and_metrics(client: Any) -> None:
    post(client, *request_of("cloudevent-aws-sqs.binary.json"))
    post(client, *request_of("cloudevent-foreign.binary.json"))
    assert client.get("/healthz").get_json() == {"status": "ok"}
    assert client.get("/health/readiness").status_code == 200
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    text = metrics.get_data(as_text=True)
    assert 'spotguard_interruption_notices_received_total{kind="interruption",result="done"}' in text
    assert 'spotguard_interruption_delivery_errors_total{error="foreign",transport="cloudevents"}' in text
    assert "spotguard_interruption_handle_seconds_bucket" in text


def test_get_on_the_event_endpoint_is_405(client: Any) -> None:
    response = client.get("/")
    assert response.status_code == 405
    assert "POST a CloudEvent" in response.get_json()["reason"]


def test_reply_is_valid_in_binary_mode_too() -> None:
    # A reply is a CloudEvent whichever mode a client prefers to read it in.
    reply = cloudevents.Reply(200, {"result": "done"})
    message = ce_http.to_binary_event(reply.to_event())
    event = ce_http.from_http_event(message)
    assert event.get_data() == {"result": "done"}


# -- the Knative entry point, in-process, as func-python serves it ---------------------------------

Message = dict[str, Any]


async def asgi_request(
    app: Callable[..., Awaitable[None]], headers: dict[str, str], body: bytes, path: str = "/", method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, payload


def asgi_app(handler: RecordingHandler | None) -> Any:
    from func_python.cloudevent import ASGIApplication

    module = knative_function()
    function = module.func.Function(handler=handler) if handler is not None else module.new()
    return ASGIApplication(function)


def test_new_is_what_func_python_serves() -> None:
    # func-python's serve() accepts a constructor only when it is named "new".
    module = knative_function()
    assert module.new.__name__ == "new"
    assert hasattr(module.new(), "handle")


@pytest.mark.parametrize("name", NOTICE_SAMPLES)
def test_knative_entry_handles_each_mode_and_type(name: str) -> None:
    handler = RecordingHandler()
    app = asgi_app(handler)
    status, data = result_of(asyncio.run(asgi_request(app, *request_of(name))))
    assert (status, data["result"]) == (200, "done")
    assert len(handler.calls) == 1


def test_knative_entry_answers_503_on_retry_and_200_on_ping() -> None:
    handler = RecordingHandler(outcomes={SPOT_INSTANCE: "retry"})
    app = asgi_app(handler)
    status, data = result_of(asyncio.run(asgi_request(app, *request_of("cloudevent-aws-sqs.binary.json"))))
    assert (status, data["result"]) == (503, "retry")
    status, data = result_of(asyncio.run(asgi_request(app, *request_of("cloudevent-ping.structured.json"))))
    assert (status, data["result"]) == (200, "reconciled")
    assert handler.reconciles == 1


def test_knative_entry_acknowledges_foreign_and_malformed() -> None:
    handler = RecordingHandler()
    app = asgi_app(handler)
    for name, result in [
        ("cloudevent-foreign.binary.json", "foreign"),
        ("cloudevent-aws-sqs-malformed.binary.json", "malformed"),
    ]:
        status, data = result_of(asyncio.run(asgi_request(app, *request_of(name))))
        assert (status, data["result"]) == (200, result)
    assert handler.calls == []


def test_knative_entry_rejects_what_is_not_a_cloudevent_with_400() -> None:
    handler = RecordingHandler()
    app = asgi_app(handler)
    body = json.dumps(sample("ec2-spot-instance-interruption-warning.json")).encode()
    status, _, _ = asyncio.run(asgi_request(app, {"content-type": "application/json"}, body))
    assert status == 400
    assert handler.calls == []


def test_knative_health_endpoints() -> None:
    ready = asyncio.run(asgi_request(asgi_app(RecordingHandler()), {}, b"", "/health/readiness", "GET"))
    assert ready[0] == 200
    # Not connected (no handler, and the connection fails): not ready, and events are retried.
    module = knative_function()
    function = module.new()
    function.error = "no cluster"
    from func_python.cloudevent import ASGIApplication

    app = ASGIApplication(function)
    assert asyncio.run(asgi_request(app, {}, b"", "/health/readiness", "GET"))[0] == 500
    assert asyncio.run(asgi_request(app, {}, b"", "/health/liveness", "GET"))[0] == 200


def test_a_reply_event_round_trips_through_func_python_sender() -> None:
    # The function answers through func-python's CloudEventSender.structured.
    event = CloudEvent({"type": "t", "source": "/s", "id": "1"}, {"a": 1})
    message = ce_http.to_structured_event(event)
    assert json.loads(message.body)["data"] == {"a": 1}
