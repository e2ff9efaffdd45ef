"""GIVEN requests through one Kube, THEN the counts add up per verb, resource and code, also in Prometheus."""

from __future__ import annotations

import threading

import prometheus_client
import pytest
from spotguard.gateway import kube, stats
from spotguard.gateway import resources as r

from tests.gateway.fakeapi import Answer, FakeApi, status


def prometheus_count(verb: str, resource: str, code: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(
        "spotguard_kube_requests_total", {"verb": verb, "resource": resource, "code": code}
    )
    return value or 0.0


def test_counts_by_verb_resource_and_code(api: FakeApi, k: kube.Kube) -> None:
    api.on("GET", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
    api.on("PATCH", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
    api.on("DELETE", "/api/v1/namespaces/shop/pods/p", status(404, "NotFound"))
    before = prometheus_count("patch", "nodes", "200")

    k.get(r.NODES, "n")
    k.patch(r.NODES, "n", {"spec": {"unschedulable": True}})
    with pytest.raises(kube.NotFound):
        k.delete(r.PODS, "p", "shop")

    assert k.stats.requests == 3
    assert k.stats.writes == 2
    assert k.stats.by_verb == {"get": 1, "patch": 1, "delete": 1}
    assert k.stats.by_resource == {"nodes": 2, "pods": 1}
    assert k.stats.by_code == {200: 2, 404: 1}
    assert k.stats.count("patch", "nodes") == 1
    assert prometheus_count("patch", "nodes", "200") == before + 1

    snap = k.stats.snapshot()
    k.stats.reset()
    assert k.stats.requests == 0 and k.stats.by_verb == {}
    assert snap.as_dict()["by_code"] == {"200": 2, "404": 1}  # the snapshot kept its numbers


def test_concurrent_records_are_not_lost() -> None:
    counter = stats.Stats()

    def work() -> None:
        for _ in range(2000):
            counter.record("get", "pods", 200)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.requests == 8000
    assert counter.writes == 0


def test_two_gateways_share_the_prometheus_counter_without_duplicates(api: FakeApi) -> None:
    from tests.gateway.fakeapi import api_client

    api.on("GET", "/api/v1/nodes/n", Answer(body={"kind": "Node"}))
    before = prometheus_count("get", "nodes", "200")
    one, two = kube.Kube(api_client(api.url)), kube.Kube(api_client(api.url))
    one.get(r.NODES, "n")
    two.get(r.NODES, "n")
    assert (one.stats.requests, two.stats.requests) == (1, 1)
    assert prometheus_count("get", "nodes", "200") == before + 2
