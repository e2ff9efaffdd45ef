"""Paged lists (``limit`` / ``continue``) from the simulated API server.

https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks
Every object once, in (namespace, name) order, each page carrying the first page's
resourceVersion; and a paged list costs about what one list costs, not a re-sorted
copy of the whole collection per page.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException
from spotguard_sim import testing

PODS = 3000
NAMESPACES = ("alpha", "beta", "gamma")


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # names not created in sorted order, so the order comes from the server
        "metadata": {"name": f"pod-{(i * 7919) % PODS:05d}", "namespace": NAMESPACES[i % 3],
                     "labels": {"even": str(i % 2 == 0).lower()}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[testing.SimCluster]:
    with testing.running_cluster(controllers=False) as cluster:
        for ns in NAMESPACES:
            cluster.store.create("namespaces", {"metadata": {"name": ns}})
        for i in range(PODS):
            cluster.store.create("pods", _pod(i))
        yield cluster


@pytest.fixture(scope="module")
def core(sim: testing.SimCluster) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(sim.api_client())


def _pages(list_fn: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Each page, as JSON, following ``continue`` to the end."""
    token = None
    while True:
        response = list_fn(_continue=token, _preload_content=False, **kwargs)
        page: dict[str, Any] = json.loads(response.data)
        yield page
        token = page["metadata"].get("continue")
        if not token:
            return


def _keys(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items]


def test_all_pods_in_pages_of_100_once_each_in_order(core: kubernetes.client.CoreV1Api) -> None:
    expected = sorted((NAMESPACES[i % 3], f"pod-{(i * 7919) % PODS:05d}") for i in range(PODS))
    seen: list[tuple[str, str]] = []
    versions: set[str] = set()
    remaining: list[int | None] = []
    pages = 0
    for page in _pages(core.list_pod_for_all_namespaces, limit=100):
        pages += 1
        assert len(page["items"]) <= 100
        seen += _keys(page["items"])
        versions.add(page["metadata"]["resourceVersion"])
        remaining.append(page["metadata"].get("remainingItemCount"))
    assert pages == PODS // 100
    assert len(seen) == len(set(seen)) == PODS
    assert seen == expected
    assert len(versions) == 1  # every page carries the first page's resourceVersion
    assert remaining == [PODS - 100 * p for p in range(1, pages)] + [None]


def test_one_namespace_with_a_label_selector(core: kubernetes.client.CoreV1Api) -> None:
    whole = json.loads(core.list_namespaced_pod(
        "beta", label_selector="even=true", _preload_content=False).data)
    seen: list[tuple[str, str]] = []
    for page in _pages(core.list_namespaced_pod, namespace="beta", label_selector="even=true",
                       limit=77):
        seen += _keys(page["items"])
        # with a selector the server cannot know how many remain (upstream leaves it unset)
        assert "remainingItemCount" not in page["metadata"]
        assert all(i["metadata"]["labels"]["even"] == "true" for i in page["items"])
    assert seen == _keys(whole["items"])
    assert len(seen) == PODS // 6
    assert {ns for ns, _ in seen} == {"beta"}


def test_a_field_selector_on_the_node_pages_too(
    sim: testing.SimCluster, core: kubernetes.client.CoreV1Api
) -> None:
    sim.store.create("nodes", {"metadata": {"name": "paging-node"}})
    for i in range(9):
        sim.store.create("pods", {"metadata": {"name": f"on-node-{i}", "namespace": "gamma"},
                                  "spec": {"nodeName": "paging-node",
                                           "containers": [{"name": "c", "image": "nginx"}]}})
    pages = list(_pages(core.list_pod_for_all_namespaces,
                        field_selector="spec.nodeName=paging-node", limit=4))
    assert [len(p["items"]) for p in pages] == [4, 4, 1]
    assert [n for p in pages for _, n in _keys(p["items"])] == [f"on-node-{i}" for i in range(9)]


def test_objects_created_and_deleted_between_pages(
    sim: testing.SimCluster, core: kubernetes.client.CoreV1Api
) -> None:
    """Later pages show the store as it is then (the sim keeps no snapshots): no object
    twice, deleted ones not after they are gone, new ones after the continue key."""
    for i in range(30):
        sim.store.create("configmaps", {"metadata": {"name": f"cm-{i:02d}", "namespace": "alpha"}})
    first = json.loads(core.list_namespaced_config_map(
        "alpha", limit=10, _preload_content=False).data)
    assert _keys(first["items"]) == [("alpha", f"cm-{i:02d}") for i in range(10)]
    sim.store.remove("configmaps", "cm-15", "alpha")
    sim.store.create("configmaps", {"metadata": {"name": "cm-05b", "namespace": "alpha"}})
    sim.store.create("configmaps", {"metadata": {"name": "cm-99", "namespace": "alpha"}})
    rest: list[tuple[str, str]] = []
    token = first["metadata"]["continue"]
    while token:
        page = json.loads(core.list_namespaced_config_map(
            "alpha", limit=10, _continue=token, _preload_content=False).data)
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        rest += _keys(page["items"])
        token = page["metadata"].get("continue")
    names = [n for _, n in rest]
    assert names == [f"cm-{i:02d}" for i in range(10, 30) if i != 15] + ["cm-99"]


def test_a_bad_continue_token_is_a_400(core: kubernetes.client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("alpha", limit=10, _continue="not-a-token")
    assert info.value.status == 400


def test_paging_costs_about_one_list(sim: testing.SimCluster) -> None:
    """In the store: 3,000 pages of one pod cost about one list of all, not 3,000 sorts."""
    store = sim.store
    store.list_page("pods")  # warm
    start = time.perf_counter()
    whole = store.list_page("pods").entries
    one_list = time.perf_counter() - start
    start = time.perf_counter()
    paged = []
    after = None
    while True:
        page = store.list_page("pods", after=after, limit=1)
        paged += page.entries
        if not page.more:
            break
        meta = page.entries[-1].obj["metadata"]
        after = (meta["namespace"], meta["name"])
    in_pages = time.perf_counter() - start
    assert [e.obj["metadata"]["name"] for e in paged] == [e.obj["metadata"]["name"] for e in whole]
    # re-sorting 3,000 keys per page took over a second here; the index takes ~10 ms
    assert in_pages < 20 * one_list + 0.3, (in_pages, one_list)


def test_watch_bookmarks_when_allowed() -> None:
    """allowWatchBookmarks: the watch cache sends a BOOKMARK with the current
    resourceVersion about once a minute (simulated time here: 60x)
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks)."""
    import kubernetes
    from kubernetes import watch
    from spotguard_sim import testing

    with testing.running_cluster(controllers=False, time_scale=60.0) as sim:
        core = kubernetes.client.CoreV1Api(sim.api_client())
        rv = core.list_namespaced_config_map("default").metadata.resource_version
        sim.store.create("configmaps", {"metadata": {"name": "later"}}, namespace="default")
        events = []
        for event in watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=rv,
                                          allow_watch_bookmarks=True, timeout_seconds=4):
            events.append((event["type"], event["raw_object"]["metadata"].get("resourceVersion")))
            if event["type"] == "BOOKMARK":
                break
        assert events[0][0] == "ADDED"
        assert events[-1] == ("BOOKMARK", sim.store.resource_version)
