"""The Knative function with the real handler: lifespan startup, then CloudEvents in both modes.

func-python's ASGIApplication wraps ``new()``; its lifespan startup calls
``start(cfg)``, which connects to the cluster from the environment (here the
simulated cluster's kubeconfig, EC2 on moto), exactly as in a Knative pod.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cloudevents.core.bindings import http as ce_http
from spotguard.gateway import kube, resources
from spotguard_sim import testing

from tests.interruption.test_cloudevents import asgi_request
from tests.interruption.transport_support import (
    Moto,
    assert_copy_surge,
    interruption_taint,
    knative_function,
    pods_on,
    sample,
    scenario,
    wait_for,
)


async def serve(app: Any, requests: list[tuple[str, dict[str, str], bytes]]) -> list[tuple[int, dict[str, Any]]]:
    """Run the ASGI lifespan around ``requests`` (method-less: POST /) and return status and result data."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await asyncio.wait_for(outbox.get(), 60))["type"] == "lifespan.startup.complete"
    answers = []
    for path, headers, body in requests:
        status, answer_headers, payload = await asgi_request(app, headers, body, path=path)
        if answer_headers.get("content-type", "").startswith("application/cloudevents+json"):
            event = ce_http.from_http_event(ce_http.HTTPMessage(headers=answer_headers, body=payload))
            data = event.get_data()
            assert isinstance(data, dict)
            answers.append((status, data))
        else:
            answers.append((status, {"body": payload.decode()}))
    await inbox.put({"type": "lifespan.shutdown"})
    assert (await asyncio.wait_for(outbox.get(), 10))["type"] == "lifespan.shutdown.complete"
    await lifespan
    return answers


def request(name: str) -> tuple[str, dict[str, str], bytes]:
    payload = sample(name)
    return "/", payload["headers"], payload["body"].encode()


def test_knative_function_on_the_cluster(aws_env: Moto, monkeypatch: pytest.MonkeyPatch) -> None:
    from func_python.cloudevent import ASGIApplication

    with testing.running_cluster(scenario()) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        api = kube.connect(sim.kubeconfig)
        wait_for(lambda: len(pods_on(api, "spot-a")) == 2, timeout=20)
        app = ASGIApplication(knative_function().new())
        answers = asyncio.run(
            serve(
                app,
                [
                    ("/health/readiness", {}, b""),
                    request("cloudevent-aws-sqs.binary.json"),  # spot-a, binary mode
                    request("cloudevent-aws-sqs.binary.json"),  # delivered twice
                    request("cloudevent-eventbridge.structured.json"),  # spot-b, structured mode
                    request("cloudevent-foreign.binary.json"),
                    request("cloudevent-ping.binary.json"),
                ],
            )
        )
        assert answers[0] == (200, {"body": "OK"})
        assert [(status, data["result"]) for status, data in answers[1:]] == [
            (200, "done"),
            (200, "done"),
            (200, "done"),
            (200, "foreign"),
            (200, "reconciled"),
        ]
        assert interruption_taint(api.get(resources.NODES, "spot-a")) == "12345678-1234-1234-1234-123456789012"
        assert interruption_taint(api.get(resources.NODES, "spot-b")) == "1e5527d7-bb36-4607-3370-4164db56a40e"
        # one surge for two deliveries: web's copy of two, its own count untouched
        assert assert_copy_surge(api, "web", 2, 2)["surge"] == 2


def test_knative_function_retries_while_the_cluster_fails(aws_env: Moto, monkeypatch: pytest.MonkeyPatch) -> None:
    from func_python.cloudevent import ASGIApplication

    with testing.running_cluster(scenario()) as sim:
        monkeypatch.setenv("KUBECONFIG", sim.kubeconfig)
        api = kube.connect(sim.kubeconfig)
        wait_for(lambda: len(pods_on(api, "spot-a")) == 2, timeout=20)
        sim.faults.set(verb="patch", resource="nodes", error_rate=1.0, status=500)
        app = ASGIApplication(knative_function().new())
        [(status, data)] = asyncio.run(serve(app, [request("cloudevent-aws-sqs.structured.json")]))
        # The rebalance recommendation's taint cannot be written: 503, so Knative delivers it again.
        assert (status, data["result"]) == (503, "retry")
