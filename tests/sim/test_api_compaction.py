"""Time-based etcd compaction: old resourceVersions expire as on a real cluster.

kube-apiserver compacts etcd every ``--etcd-compaction-interval`` (5 minutes) to the
revision it saw one interval before (staging/src/k8s.io/apiserver/pkg/storage/etcd3/
compact.go); https://kubernetes.io/docs/reference/using-api/api-concepts/#410-gone-responses.
A watch from a compacted resourceVersion gets one ERROR event with a 410 Status (the watch
cache's newErrWatcher), an Exact list at it and a continue token of a list at it are
410 Expired. The timings are scenario settings (``apiServer.etcdCompactionIntervalSeconds``).
"""

from __future__ import annotations

import json
import logging
import threading

import kubernetes
import pytest
from kubernetes.client import ApiException
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import settings, store, testing

from tests.sim import controller_helpers as h

FAST = settings.Settings(api_server=settings.ApiServer(etcd_compaction_interval=2.0))


def _configmap(name: str) -> dict[str, object]:
    return {"metadata": {"name": name}, "data": {"k": name}}


def _compacted_past(sim: testing.SimCluster, rv: int, core: kubernetes.client.CoreV1Api) -> None:
    """Write until the store has compacted past ``rv`` (each write runs the due ticks)."""
    written = [0]

    def past() -> bool:
        written[0] += 1
        core.create_namespaced_config_map("default", _configmap(f"tick-{written[0]}"))
        return sim.store.compacted_revision() > rv + 1

    h.wait_for(past, what=f"compaction past {rv}")


def test_the_default_interval_is_kube_apiservers_five_minutes() -> None:
    assert store.COMPACTION_INTERVAL == settings.ETCD_COMPACTION_INTERVAL == 300.0
    found, _ = settings.split([{"apiVersion": settings.API_VERSION, "kind": "Settings",
                                "apiServer": {"etcdCompactionIntervalSeconds": 60}}])
    assert found.api_server.etcd_compaction_interval == 60.0


def test_history_is_kept_between_one_and_two_intervals() -> None:
    """Each tick compacts to the revision seen at the tick before (compact.go)."""
    s = store.Store()
    s.set_compaction_interval(300)
    s.create("configmaps", _configmap("a"), namespace="default")
    first = int(s.resource_version)
    s.clock.advance(301)  # tick 1 records the revision, compacts nothing
    assert s.compacted_revision() == 0
    s.create("configmaps", _configmap("b"), namespace="default")
    s.watch("configmaps", "default", resource_version=str(first - 1)).close()
    s.clock.advance(300)  # tick 2 compacts to the revision seen at tick 1
    assert s.compacted_revision() == first
    with pytest.raises(Exception, match="too old resource version"):
        s.watch("configmaps", "default", resource_version=str(first - 2))
    s.watch("configmaps", "default", resource_version=str(first)).close()


def test_official_watch_from_a_compacted_version_sees_410() -> None:
    with testing.running_cluster(time_scale=10, settings=FAST, controllers=False) as sim:
        api = sim.api_client()
        core = kubernetes.client.CoreV1Api(api)
        old = int(core.list_namespaced_config_map("default").metadata.resource_version)
        _compacted_past(sim, old, core)
        # the raw answer: 200, one ERROR event carrying a 410 Expired Status, then the end
        resp = api.call_api("/api/v1/namespaces/default/configmaps", "GET",
                            query_params=[("watch", "true"), ("resourceVersion", str(old))],
                            auth_settings=["BearerToken"], _preload_content=False)
        lines = [json.loads(line) for line in resp.data.splitlines() if line.strip()]
        assert resp.status == 200 and [e["type"] for e in lines] == ["ERROR"]
        status = lines[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        assert status["message"].startswith(f"too old resource version: {old} (")
        # kubernetes.watch.Watch retries once after a 410 ERROR, then raises it
        with pytest.raises(ApiException) as info:
            for _ in kubernetes.watch.Watch().stream(
                    core.list_namespaced_config_map, "default", resource_version=str(old),
                    timeout_seconds=5):
                pass
        assert info.value.status == 410
        # the recovery every informer does: list again, watch from the new version
        fresh = core.list_namespaced_config_map("default").metadata.resource_version
        core.create_namespaced_config_map("default", _configmap("after"))
        seen = [e["object"].metadata.name for e in kubernetes.watch.Watch().stream(
            core.list_namespaced_config_map, "default", resource_version=fresh, timeout_seconds=2)]
        assert "after" in seen


def test_exact_list_and_continue_token_expire() -> None:
    with testing.running_cluster(time_scale=10, settings=FAST, controllers=False) as sim:
        core = kubernetes.client.CoreV1Api(sim.api_client())
        for i in range(3):
            core.create_namespaced_config_map("default", _configmap(f"c{i}"))
        first = core.list_namespaced_config_map("default", limit=1)
        old = first.metadata.resource_version
        assert core.list_namespaced_config_map(
            "default", resource_version=old, resource_version_match="Exact").items
        _compacted_past(sim, int(old), core)
        with pytest.raises(ApiException) as exact:
            core.list_namespaced_config_map("default", resource_version=old,
                                            resource_version_match="Exact")
        assert exact.value.status == 410
        assert json.loads(exact.value.body)["message"] == (
            "The resourceVersion for the provided list is too old.")
        with pytest.raises(ApiException) as token:
            core.list_namespaced_config_map("default", limit=1, _continue=first.metadata._continue)
        body = json.loads(token.value.body)
        assert token.value.status == 410 and body["reason"] == "Expired"
        assert body["message"].startswith("The provided continue parameter is too old")
        # the Status carries a token that continues the list inconsistently, at the latest
        rest = core.list_namespaced_config_map("default", _continue=body["metadata"]["continue"])
        names = [c.metadata.name for c in rest.items]
        assert first.items[0].metadata.name not in names and "c2" in names


def test_compaction_off_keeps_the_history() -> None:
    off = settings.Settings(api_server=settings.ApiServer(etcd_compaction_interval=0))
    with testing.running_cluster(time_scale=1000, settings=off, controllers=False) as sim:
        core = kubernetes.client.CoreV1Api(sim.api_client())
        old = core.list_namespaced_config_map("default").metadata.resource_version
        sim.clock.advance(3600)
        core.create_namespaced_config_map("default", _configmap("x"))
        assert sim.store.compacted_revision() == 0
        assert core.list_namespaced_config_map(
            "default", resource_version=old, resource_version_match="Exact").items == []


def test_gateway_list_recovers_when_compaction_lands_between_pages(
        caplog: pytest.LogCaptureFixture) -> None:
    """The product's one list path (spotguard.gateway.kube: admission, interruption and
    node-added all list through it) re-lists when etcd compacts between its pages."""
    with testing.running_cluster(controllers=False) as sim:
        core = kubernetes.client.CoreV1Api(sim.api_client())
        for i in range(12):
            core.create_namespaced_config_map("default", _configmap(f"item-{i:02d}"))
        lock, writes = threading.Lock(), [0]

        def write_and_compact() -> None:  # another client writes, then etcd compacts
            with lock:
                writes[0] += 1
                sim.store.create("configmaps", _configmap(f"w{writes[0]}"), namespace="kube-system")
                sim.store.compact()

        sim.faults.set(verb="list", resource="configmaps", before=write_and_compact)
        k = kube.Kube(sim.api_client(), page_limit=5)
        with caplog.at_level(logging.INFO, logger="spotguard.gateway.kube"):
            items, version = k.list_with_version(r.CONFIGMAPS, "default")
        names = sorted(i["metadata"]["name"] for i in items)
        expected = sorted(c.metadata.name for c in core.list_namespaced_config_map("default").items)
        assert names == expected and {f"item-{i:02d}" for i in range(12)} <= set(names)
        assert any("expired" in rec.getMessage() for rec in caplog.records)
        assert int(version) >= sim.store.compacted_revision() - 1
