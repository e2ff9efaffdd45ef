"""GIVEN environment variables and the spotguard-config ConfigMap, THEN the ConfigMap wins,
a missing one is fine, an unreadable one falls back, and reads are cached for the TTL."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from spotguard.gateway import kube, retry, settings
from spotguard.gateway import resources as r
from spotguard.policy.config import RebalanceAction
from spotguard_sim import testing

from tests.gateway.fakeapi import Answer, FakeApi, api_client, status

NAMESPACES = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spotguard"}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}},
]
FAST = retry.Policy(attempts=2, deadline=5.0, timeout=2.0, base_delay=0.01)


@pytest.fixture(scope="module")
def sim() -> Iterator[testing.SimCluster]:
    with testing.running_cluster(NAMESPACES, controllers=False) as cluster:
        yield cluster


@pytest.fixture
def k(sim: testing.SimCluster) -> Iterator[kube.Kube]:
    k = kube.connect(sim.kubeconfig, policy=FAST)
    yield k
    for ns in ("spotguard", "ops"):
        if k.find(r.CONFIGMAPS, "spotguard-config", ns):
            k.delete(r.CONFIGMAPS, "spotguard-config", ns)


def put_configmap(k: kube.Kube, namespace: str = "spotguard", **data: str) -> None:
    body = {"metadata": {"name": "spotguard-config", "namespace": namespace}, "data": data}
    k.create(r.CONFIGMAPS, body, namespace)


def test_without_a_configmap_the_environment_applies(k: kube.Kube) -> None:
    config, problems = settings.Loader(k, {"SPOTGUARD_REBALANCE_ACTION": "surge"}).get()
    assert config.rebalance_action is RebalanceAction.SURGE
    assert problems == []


def test_the_configmap_overrides_the_environment(k: kube.Kube) -> None:
    put_configmap(k, **{"rebalance-action": "ignore", "excluded-namespaces": "kube-system,batch"})
    env = {"SPOTGUARD_REBALANCE_ACTION": "surge", "SPOTGUARD_RESERVATION_TTL_SECONDS": "60"}
    config, problems = settings.Loader(k, env).get()
    assert config.rebalance_action is RebalanceAction.IGNORE  # ConfigMap beats env
    assert config.reservation_ttl_seconds == 60  # env beats the default
    assert config.excluded_namespaces == frozenset({"kube-system", "batch"})
    assert problems == []


def test_namespace_and_name_come_from_the_environment(k: kube.Kube) -> None:
    put_configmap(k, "ops", **{"rebalance-action": "ignore"})
    config, _ = settings.Loader(k, {"SPOTGUARD_NAMESPACE": "ops"}).get()
    assert config.rebalance_action is RebalanceAction.IGNORE


def test_invalid_values_and_unknown_keys_are_problems_logged_once(
    k: kube.Kube, caplog: pytest.LogCaptureFixture
) -> None:
    put_configmap(k, **{"reservation-ttl-seconds": "-5", "rebalance-actoin": "surge"})
    loader = settings.Loader(k, {}, ttl=0)
    with caplog.at_level(logging.WARNING, logger="spotguard.gateway.settings"):
        config, problems = loader.get()
        loader.get()
    assert config.reservation_ttl_seconds == 30  # the default stays
    assert {p.field for p in problems} == {"reservation_ttl_seconds", "rebalance-actoin"}
    logged = [rec for rec in caplog.records if rec.getMessage() == "configuration problem"]
    assert len(logged) == 2  # two problems, each once although read twice


def test_reads_are_cached_for_the_ttl(k: kube.Kube) -> None:
    put_configmap(k, **{"rebalance-action": "ignore"})
    loader = settings.Loader(k, {}, ttl=0.3)
    k.stats.reset()
    for _ in range(5):
        loader.get()
    assert k.stats.count("get", "configmaps") == 1
    k.patch(r.CONFIGMAPS, "spotguard-config", {"data": {"rebalance-action": "surge"}}, "spotguard")
    assert loader.get()[0].rebalance_action is RebalanceAction.IGNORE  # still cached
    time.sleep(0.35)
    assert loader.get()[0].rebalance_action is RebalanceAction.SURGE
    assert k.stats.count("get", "configmaps") == 2


def test_load_shares_one_cache_per_client_and_environment(k: kube.Kube) -> None:
    env = {"SPOTGUARD_REBALANCE_ACTION": "taint", "UNRELATED": "x"}
    k.stats.reset()
    first = settings.load(k, env)
    second = settings.load(k, {**env, "UNRELATED": "y"})  # only SPOTGUARD_* variables matter
    assert first == second
    assert k.stats.count("get", "configmaps") == 1


def test_an_unreadable_configmap_falls_back(api: FakeApi) -> None:
    api.on("GET", "/api/v1/namespaces/spotguard/configmaps/spotguard-config", status(403, "Forbidden", "no"))
    k = kube.Kube(api_client(api.url), policy=FAST)
    config, problems = settings.Loader(k, {"SPOTGUARD_REBALANCE_ACTION": "surge"}).get()
    assert config.rebalance_action is RebalanceAction.SURGE
    assert [p.field for p in problems] == ["configmap"]
    assert "using the environment" in problems[0].message


def test_an_unreadable_configmap_keeps_the_last_good_configuration(api: FakeApi) -> None:
    good = {"kind": "ConfigMap", "data": {"rebalance-action": "ignore"}}

    api.on(
        "GET",
        "/api/v1/namespaces/spotguard/configmaps/spotguard-config",
        Answer(body=good),
        status(500, "InternalError"),
    )
    k = kube.Kube(api_client(api.url), policy=retry.NONE)
    loader = settings.Loader(k, {}, ttl=0)
    assert loader.get()[0].rebalance_action is RebalanceAction.IGNORE
    config, problems = loader.get()
    assert config.rebalance_action is RebalanceAction.IGNORE
    assert "last configuration" in problems[-1].message
