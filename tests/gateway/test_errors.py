"""GIVEN an API answer or a transport failure, THEN the gateway raises the matching error class.

Status codes and reasons follow the Kubernetes API conventions
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#http-status-codes).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from spotguard import certs
from spotguard.gateway import errors, kube, retry
from spotguard.gateway import resources as r

from tests.gateway.fakeapi import Answer, FakeApi, api_client, status

ONCE = retry.Policy(attempts=1, timeout=2.0)


@pytest.mark.parametrize(
    ("answer", "cls", "reason"),
    [
        (status(400, "BadRequest"), kube.BadRequest, "BadRequest"),
        (status(401, "Unauthorized"), kube.Unauthorized, "Unauthorized"),
        (status(403, "Forbidden", 'pods "p" is forbidden'), kube.Forbidden, "Forbidden"),
        (status(404, "NotFound", 'pods "p" not found'), kube.NotFound, "NotFound"),
        (status(409, "Conflict", "the object has been modified"), kube.Conflict, "Conflict"),
        (status(409, "AlreadyExists", 'pods "p" already exists'), kube.AlreadyExists, "AlreadyExists"),
        (status(410, "Expired", "too old resource version"), kube.Gone, "Expired"),
        (status(422, "Invalid", "spec.replicas: Invalid value"), kube.Invalid, "Invalid"),
        (status(429, "TooManyRequests"), kube.TooManyRequests, "TooManyRequests"),
        (status(500, "InternalError"), kube.Transient, "InternalError"),
        (status(504, "Timeout"), kube.Transient, "Timeout"),
        (status(418, "Teapot"), kube.ApiError, "Teapot"),
    ],
)
def test_status_answers_map_to_classes(api: FakeApi, answer: Answer, cls: type, reason: str) -> None:
    api.on("GET", "/api/v1/namespaces/shop/pods/p", answer)
    k = kube.Kube(api_client(api.url), policy=ONCE)
    with pytest.raises(cls) as caught:
        k.get(r.PODS, "p", "shop")
    assert type(caught.value) is cls
    assert caught.value.status == answer.status
    assert caught.value.reason == reason
    assert caught.value.message == answer.body["message"]
    assert caught.value.body["kind"] == "Status"


def test_already_exists_is_not_a_conflict() -> None:
    assert not issubclass(kube.AlreadyExists, kube.Conflict)
    assert not issubclass(kube.TooManyRequests, kube.Transient)
    assert set(kube.RETRY_LATER) == {kube.Transient, kube.TooManyRequests}


def test_invalid_carries_the_field_causes(api: FakeApi) -> None:
    causes = [{"reason": "FieldValueInvalid", "message": "must be >= 0", "field": "spec.replicas"}]
    api.on(
        "POST", "/apis/apps/v1/namespaces/shop/deployments", status(422, "Invalid", "bad", details={"causes": causes})
    )
    k = kube.Kube(api_client(api.url), policy=ONCE)
    with pytest.raises(kube.Invalid) as caught:
        k.create(r.DEPLOYMENTS, {"metadata": {"name": "d"}}, "shop")
    assert caught.value.causes == causes


def test_retry_after_comes_from_the_header_or_the_details(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/a", Answer(429, status(429, "TooManyRequests").body, {"Retry-After": "3"}))
    api.on("GET", "/api/v1/nodes/b", status(429, "TooManyRequests", details={"retryAfterSeconds": 7}))
    k = kube.Kube(api_client(api.url), policy=ONCE)
    with pytest.raises(kube.TooManyRequests) as a:
        k.get(r.NODES, "a")
    with pytest.raises(kube.TooManyRequests) as b:
        k.get(r.NODES, "b")
    assert a.value.retry_after == 3.0
    assert b.value.retry_after == 7.0


def test_an_error_body_that_is_not_a_status(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(502, b"<html>bad gateway</html>"))
    k = kube.Kube(api_client(api.url), policy=ONCE)
    with pytest.raises(kube.Transient) as caught:
        k.get(r.NODES, "n")
    assert caught.value.status == 502
    assert "bad gateway" in caught.value.message
    assert caught.value.body == {}


def test_a_success_that_is_not_json(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(200, b"not json"))
    k = kube.Kube(api_client(api.url), policy=ONCE)
    with pytest.raises(kube.Transient, match="not JSON"):
        k.get(r.NODES, "n")


def test_connection_refused_is_transient_and_not_sent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens here
    k = kube.Kube(api_client(f"http://127.0.0.1:{port}"), policy=ONCE)
    with pytest.raises(kube.Transient) as caught:
        k.get(r.NODES, "n")
    assert caught.value.status == 0
    assert caught.value.reason == "ConnectionFailed"
    assert retry.request_sent(caught.value) is False
    assert k.stats.by_code == {0: 1}


def test_a_slow_answer_is_a_timeout(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(body={}, delay=1.0))
    k = kube.Kube(api_client(api.url), policy=retry.Policy(attempts=1, timeout=0.2))
    with pytest.raises(kube.Transient) as caught:
        k.get(r.NODES, "n")
    assert caught.value.reason == "Timeout"
    assert retry.request_sent(caught.value) is True
    # AND the error names the call that was not answered (an operator reads which one from the log)
    assert "GET /api/v1/nodes/n: " in str(caught.value)


def test_a_dropped_connection_is_transient(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(drop=True))
    k = kube.Kube(api_client(api.url), policy=ONCE)
    with pytest.raises(kube.Transient) as caught:
        k.get(r.NODES, "n")
    assert caught.value.reason == "ConnectionError"


def test_an_untrusted_server_certificate_is_not_transient(tmp_path: Path) -> None:
    served = certs.make(tmp_path / "server", ["localhost"], ["127.0.0.1"])
    other = certs.make(tmp_path / "other", ["localhost"], ["127.0.0.1"])
    server = FakeApi(tls=(served.cert, served.key))
    try:
        k = kube.Kube(api_client(server.url, ca=str(other.ca_cert)), policy=retry.Policy(attempts=3))
        with pytest.raises(kube.ApiError) as caught:
            k.get(r.NODES, "n")
        assert type(caught.value) is kube.ApiError
        assert caught.value.reason == "TLSError"
        assert k.stats.requests == 1  # not retried
    finally:
        server.close()


def test_from_response_without_a_body() -> None:
    error = errors.from_response(503, None, "Service Unavailable")
    assert isinstance(error, errors.Transient)
    assert error.reason == "Service Unavailable"
    assert errors.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None


@pytest.mark.parametrize(
    ("message", "details", "refused"),
    [
        # kube-apiserver's eviction REST (pkg/registry/core/pod/storage/eviction.go): a budget
        (
            "Cannot evict pod as it would violate the pod's disruption budget.",
            {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget db needs 2 healthy pods"}]},
            True,
        ),
        ("Cannot evict pod as it would violate the pod's disruption budget.", {}, True),  # before the cause
        # a validating webhook's denial of pods/eviction with code 429 (spotguard's eviction guard)
        ('admission webhook "evictions.spotguard.io" denied the request: replacement not Ready', {}, True),
        # API Priority and Fairness / max-requests-inflight: throttling, not a refusal
        ("Too many requests, please try again later.", {"retryAfterSeconds": 1}, False),
        ("", {}, False),
    ],
)
def test_a_429_says_whether_the_eviction_was_refused_or_throttled(message: str, details: dict, refused: bool) -> None:
    body = status(429, "TooManyRequests", message, details=details).body
    exc = errors.TooManyRequests(429, "TooManyRequests", message, body)
    assert exc.refused is refused
