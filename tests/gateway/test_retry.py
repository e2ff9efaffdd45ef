"""GIVEN transient failures, THEN reads are retried, writes only where the server did not act.

Kubernetes clients retry 429 (API Priority and Fairness, with Retry-After) and
5xx on reads; a Conflict means re-read (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts).
"""

from __future__ import annotations

import random
import socket
import time

import pytest
from spotguard.gateway import kube, retry
from spotguard.gateway import resources as r

from tests.gateway.fakeapi import FAST, Answer, FakeApi, api_client, status

NODE = Answer(body={"kind": "Node", "metadata": {"name": "n"}})


def test_reads_are_retried_on_5xx(api: FakeApi, k: kube.Kube) -> None:
    api.on("GET", "/api/v1/nodes/n", status(500, "InternalError"), status(502, "BadGateway"), NODE)
    assert k.get(r.NODES, "n")["kind"] == "Node"
    assert k.stats.requests == 3
    assert k.stats.retries == 2
    assert k.stats.by_code == {500: 1, 502: 1, 200: 1}


def test_reads_give_up_after_the_attempts(api: FakeApi, k: kube.Kube) -> None:
    api.on("GET", "/api/v1/nodes", status(500, "InternalError"))
    with pytest.raises(kube.Transient):
        k.list(r.NODES)
    assert k.stats.requests == FAST.attempts == api.count("GET")


def test_a_list_page_is_retried_alone(api: FakeApi, k: kube.Kube) -> None:
    api.on(
        "GET",
        "/api/v1/nodes",
        lambda req: (
            Answer(body={"metadata": {}, "items": [{"metadata": {"name": "b"}}]})
            if req.query.get("continue") == "t" and api.count("GET") > 2
            else status(503, "ServiceUnavailable")
            if req.query.get("continue")
            else Answer(body={"metadata": {"continue": "t"}, "items": [{"metadata": {"name": "a"}}]})
        ),
    )
    assert [n["metadata"]["name"] for n in k.list(r.NODES)] == ["a", "b"]
    assert k.stats.requests == 3


def test_writes_are_not_retried_on_500(api: FakeApi, k: kube.Kube) -> None:
    api.on("POST", "/api/v1/namespaces/shop/pods", status(500, "InternalError"), Answer(201, {}))
    with pytest.raises(kube.Transient):
        k.create(r.PODS, {"metadata": {"generateName": "web-"}}, "shop")
    assert api.count("POST") == 1


@pytest.mark.parametrize("first", [status(503, "ServiceUnavailable"), status(429, "TooManyRequests")])
def test_writes_are_retried_on_503_and_429(api: FakeApi, k: kube.Kube, first: Answer) -> None:
    api.on("PATCH", "/apis/apps/v1/namespaces/shop/deployments/web", first, Answer(body={"kind": "Deployment"}))
    k.patch(r.DEPLOYMENTS, "web", {"spec": {"replicas": 3}}, "shop")
    assert api.count("PATCH") == 2
    assert k.stats.by_verb == {"patch": 2}


def test_conflict_is_never_retried(api: FakeApi, k: kube.Kube) -> None:
    api.on("PUT", "/apis/coordination.k8s.io/v1/namespaces/shop/leases/web", status(409, "Conflict"))
    with pytest.raises(kube.Conflict):
        k.replace(r.LEASES, {"metadata": {"name": "web", "namespace": "shop", "resourceVersion": "1"}})
    assert api.count("PUT") == 1


def test_a_budget_refusing_an_eviction_is_not_waited_for(api: FakeApi, k: kube.Kube) -> None:
    refusal = status(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        details={
            "causes": [{"reason": "DisruptionBudget", "message": "needs 2 healthy pods"}],
            "retryAfterSeconds": 10,
        },
    )
    api.on("POST", "/api/v1/namespaces/shop/pods/web-1/eviction", refusal)
    started = time.monotonic()
    with pytest.raises(kube.TooManyRequests) as caught:
        k.evict("web-1", "shop")
    assert time.monotonic() - started < 1.0
    assert api.count("POST") == 1
    assert caught.value.retry_after == 10.0
    assert caught.value.causes[0]["reason"] == "DisruptionBudget"


def test_retry_after_is_honoured(api: FakeApi, k: kube.Kube) -> None:
    throttled = Answer(429, status(429, "TooManyRequests").body, {"Retry-After": "1"})
    api.on("GET", "/api/v1/nodes/n", throttled, NODE)
    started = time.monotonic()
    k.get(r.NODES, "n")
    assert time.monotonic() - started >= 0.95
    assert api.count("GET") == 2


def test_a_retry_after_beyond_the_deadline_gives_up_at_once(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(429, status(429, "TooManyRequests").body, {"Retry-After": "30"}), NODE)
    k = kube.Kube(api_client(api.url), policy=retry.Policy(attempts=5, deadline=2.0))
    started = time.monotonic()
    with pytest.raises(kube.TooManyRequests):
        k.get(r.NODES, "n")
    assert time.monotonic() - started < 1.0
    assert api.count("GET") == 1


def test_read_timeouts_are_retried(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(body={}, delay=1.0), NODE)
    k = kube.Kube(api_client(api.url), policy=retry.Policy(attempts=3, timeout=0.3, base_delay=0.01))
    assert k.get(r.NODES, "n")["kind"] == "Node"
    assert k.stats.requests == 2
    assert k.stats.by_code == {0: 1, 200: 1}


def test_a_write_that_timed_out_is_not_retried(api: FakeApi) -> None:
    api.on("PATCH", "/api/v1/nodes/n", Answer(body={}, delay=1.0), NODE)
    k = kube.Kube(api_client(api.url), policy=retry.Policy(attempts=3, timeout=0.3, base_delay=0.01))
    with pytest.raises(kube.Transient, match="Timeout"):
        k.patch(r.NODES, "n", {"spec": {"unschedulable": True}})
    assert k.stats.requests == 1


def test_a_write_that_could_not_connect_is_retried() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    k = kube.Kube(api_client(f"http://127.0.0.1:{port}"), policy=FAST)
    with pytest.raises(kube.Transient, match="ConnectionFailed"):
        k.create(r.CONFIGMAPS, {"metadata": {"name": "c"}}, "shop")
    assert k.stats.requests == FAST.attempts
    assert k.stats.retries == FAST.attempts - 1


def test_the_deadline_bounds_all_attempts(api: FakeApi) -> None:
    api.on("GET", "/api/v1/nodes/n", status(500, "InternalError"))
    policy = retry.Policy(attempts=50, deadline=0.6, base_delay=0.1, max_delay=0.2)
    k = kube.Kube(api_client(api.url), policy=policy)
    started = time.monotonic()
    with pytest.raises(kube.Transient):
        k.get(r.NODES, "n")
    assert time.monotonic() - started < 1.0
    assert 2 <= k.stats.requests < 10


def test_with_policy_shares_the_connection_and_the_counts(api: FakeApi, k: kube.Kube) -> None:
    api.on("GET", "/api/v1/nodes/n", status(500, "InternalError"))
    once = k.with_policy(retry.NONE)
    with pytest.raises(kube.Transient):
        once.get(r.NODES, "n")
    assert k.stats.requests == 1
    assert once.api_client is k.api_client


def test_delay_grows_with_jitter_and_a_cap() -> None:
    policy = retry.Policy(base_delay=0.1, max_delay=1.0)
    rng = random.Random(1)
    for n, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        for _ in range(20):
            assert ceiling / 2 <= policy.delay(n, rng=rng) <= ceiling
    assert policy.delay(1, retry_after=3.0, rng=rng) == 3.0


def test_retryable_table() -> None:
    def transient(code: int, sent: bool = True) -> kube.Transient:
        error = kube.Transient(code, "x", "y")
        error.request_sent = sent  # type: ignore[attr-defined]
        return error

    throttled = kube.TooManyRequests(429, "TooManyRequests", "slow down")
    assert retry.retryable(transient(500), write=False)
    assert not retry.retryable(transient(500), write=True)
    assert retry.retryable(transient(503), write=True)
    assert retry.retryable(transient(0, sent=False), write=True)
    assert not retry.retryable(transient(0, sent=True), write=True)
    assert retry.retryable(transient(0, sent=True), write=False)
    assert retry.retryable(throttled, write=True)
    assert not retry.retryable(throttled, write=True, retry_429=False)
    assert not retry.retryable(kube.Conflict(409, "Conflict", "stale"), write=False)
    assert not retry.retryable(kube.NotFound(404, "NotFound", "gone"), write=False)
    with pytest.raises(ValueError, match="attempts"):
        retry.Policy(attempts=0)
