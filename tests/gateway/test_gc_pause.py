"""The gateway pauses the cyclic garbage collector while it parses a big list, and
restores it as it was (against the simulated cluster, over real HTTPS).

GIVEN 2,000 pods (about 2 MB of JSON), WHEN they are listed through ``Kube.list``,
THEN no collection runs during the list, and the collector is enabled afterwards only
if it was enabled before.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import testing

PODS = 2000


@pytest.fixture(scope="module")
def k() -> Iterator[kube.Kube]:
    with testing.running_cluster(controllers=False) as sim:
        sim.store.create("namespaces", {"metadata": {"name": "many"}})
        for i in range(PODS):
            sim.store.create("pods", {
                "metadata": {"name": f"pod-{i:05d}", "namespace": "many",
                             "labels": {"app": "many", "index": str(i)}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27",
                                         "resources": {"requests": {"cpu": "100m"}}}]},
            })
        yield kube.connect(sim.kubeconfig)


class Collections:
    """Counts the collector's runs (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.runs += 1

    def __enter__(self) -> Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def test_no_collection_while_listing_and_enabled_after(k: kube.Kube) -> None:
    assert gc.isenabled()
    with Collections() as during:
        pods = k.list(r.PODS, "many")
    assert len(pods) == PODS
    # at most the one collection owed once it is re-enabled
    assert during.runs <= 1
    assert gc.isenabled()
    # parsing the same JSON with the collector on runs it dozens of times
    body = orjson.dumps({"items": pods})
    with Collections() as unpaused:
        orjson.loads(body)
    assert unpaused.runs > 10


def test_a_disabled_collector_stays_disabled(k: kube.Kube) -> None:
    gc.disable()
    try:
        k.list(r.PODS, "many", label_selector="app=many")
        with kube.gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pauses_nest_across_callers() -> None:
    with kube.gc_paused():
        with kube.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
