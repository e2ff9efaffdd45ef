"""The eviction guard end to end: the served admission function (HTTPS, the shipped
ValidatingWebhookConfiguration), real ``pods/eviction`` calls with the official client
against the simulated cluster, and no notice handler at all.

- an ordinary drain of an on-demand node is never refused;
- a spot node cordoned with no spotguard notice is protected for the grace only;
- a dry-run eviction gets the same answer and changes nothing;
- the guard unreachable: evictions proceed (failurePolicy Ignore);
- the API server failing the guard's reads (500s): a 1 s retry, not the pod, for the
  error hold only.
(The race with a drainer at the notice: test_e2e_drainer.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from spotguard.admission import registration
from spotguard.policy import evictions
from spotguard_sim import testing

from tests.interruption import e2e_harness as h
from tests.interruption import sim_scenario
from tests.interruption.test_e2e_drainer import ready_counts
from tests.interruption.test_e2e_owners import READY_DELAY, TIME_SCALE

# The error hold is long in simulated seconds: a review whose reads all fail runs to its 2 s
# (real) deadline, 40 simulated seconds at x20.
# The grace is 2 real seconds at x20 (production's 8 s is 8 real seconds): two reviews must fit
# in it, and at 8 simulated seconds (0.4 real) a loaded machine's second review came too late
# (CI, two runs at once). The chaos bed floors it at 2 real seconds for the same reason.
TIMING = evictions.Timing(grace=40.0, release=30.0, error_hold=300.0)


@pytest.fixture
def sim() -> Iterator[Any]:
    objs = [*sim_scenario.mixed_nodes(on_demand=2, spot=2), sim_scenario.deployment("web", 6)]
    with testing.running_cluster(objs, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim:
        h.wait_until(lambda: sum(ready_counts(sim.store).values()) == 6, 30, "every pod Ready")
        yield sim


def cordon(sim: Any, node: str) -> None:
    sim.store.mutate("nodes", node, None, lambda n: n["spec"].__setitem__("unschedulable", True))


def ready_pod_on(sim: Any, node: str) -> str:
    for p in sim.store.list("pods", namespace="shop")[0]:
        if p["spec"].get("nodeName") == node and h.is_ready(p):
            return str(p["metadata"]["name"])
    raise AssertionError(f"no Ready pod on {node}")


def spot_with_web(sim: Any) -> str:
    counts: dict[str, int] = {}
    for p in sim.store.list("pods", namespace="shop")[0]:
        node = p["spec"].get("nodeName") or ""
        if node.startswith("spot") and h.is_ready(p):
            counts[node] = counts.get(node, 0) + 1
    assert counts, "no web pod on a spot node"
    return max(counts, key=lambda n: counts[n])


def evict(sim: Any, pod: str, dry_run: bool = False) -> ApiException | None:
    api = client.CoreV1Api(sim.api_client())
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace="shop"))
    try:
        api.create_namespaced_pod_eviction(pod, "shop", body, dry_run="All" if dry_run else None)
    except ApiException as exc:
        return exc
    return None


def exists(sim: Any, pod: str) -> bool:
    return any(p["metadata"]["name"] == pod and not p["metadata"].get("deletionTimestamp")
               for p in sim.store.list("pods", namespace="shop")[0])


def test_an_on_demand_node_drains_at_once(sim: Any, tmp_path: Any) -> None:
    with h.admission_webhook(sim, tmp_path, pods=False, evictions=True, timing=TIMING):
        node = next(n["metadata"]["name"] for n in sim.store.list("nodes")[0] if n["metadata"]["name"].startswith("od"))
        cordon(sim, node)
        pod = ready_pod_on(sim, node)
        assert evict(sim, pod) is None
        assert not exists(sim, pod)


def test_a_spot_node_without_a_notice_is_protected_for_the_grace_only(sim: Any, tmp_path: Any) -> None:
    with h.admission_webhook(sim, tmp_path, pods=False, evictions=True, timing=TIMING):
        node = spot_with_web(sim)
        cordon(sim, node)
        pod = ready_pod_on(sim, node)
        refused = evict(sim, pod)
        first = sim.clock.now()
        assert refused is not None and refused.status == 429, refused
        assert "spotguard" in refused.body and "Retry after" in refused.body
        assert refused.headers.get("Retry-After")
        # a dry run is answered the same and changes nothing
        dry = evict(sim, pod, dry_run=True)
        assert dry is not None and dry.status == 429
        assert exists(sim, pod)
        # once the grace has passed (simulated clock), the drain proceeds
        h.wait_until(lambda: sim.clock.now() >= first + TIMING.grace, 10, "the grace to pass")
        assert evict(sim, pod) is None
        assert not exists(sim, pod)


def test_an_api_server_failing_the_guards_reads_gets_a_retry_not_the_pod(sim: Any, tmp_path: Any) -> None:
    """A drainer at the notice under API 500s: the guard cannot read the workload's pods, so it
    cannot tell a sole replica from anything else. It asks for a retry in a second (the
    drainer's next try usually reads fine) instead of handing the pod over unchecked, and
    releases the drain once the error hold has passed."""
    with h.admission_webhook(sim, tmp_path, pods=False, evictions=True, timing=TIMING):
        node = spot_with_web(sim)
        cordon(sim, node)
        pod = ready_pod_on(sim, node)
        sim.faults.set(verb="list", resource="pods", error_rate=1.0, status=500)
        refused = evict(sim, pod)
        first = sim.clock.now()
        assert refused is not None and refused.status == 429, refused
        assert "could not check this eviction" in refused.body
        assert refused.headers.get("Retry-After") == "1"
        assert exists(sim, pod)
        # still failing after the grace (which alone would have released it): still a retry
        h.wait_until(lambda: sim.clock.now() >= first + TIMING.grace + 1, 10, "the grace to pass")
        again = evict(sim, pod)
        assert again is not None and again.status == 429 and "could not check" in again.body
        # the error hold bounds it: the drain is never wedged by an unwell API server
        h.wait_until(lambda: sim.clock.now() >= first + TIMING.error_hold, 60, "the error hold to pass")
        assert evict(sim, pod) is None
        assert not exists(sim, pod)


def test_the_guard_unreachable_fails_open(sim: Any, tmp_path: Any) -> None:
    from spotguard import certs

    paths = certs.make(tmp_path, ["localhost"], ["127.0.0.1"])
    # registered, but nothing listens there (port 9 is discard; refused on loopback)
    sim.store.create(
        "validatingwebhookconfigurations",
        registration.eviction_webhook_configuration("https://127.0.0.1:9/evictions", paths.ca_bundle),
    )
    node = spot_with_web(sim)
    cordon(sim, node)
    pod = ready_pod_on(sim, node)
    assert evict(sim, pod) is None
    assert not exists(sim, pod)


def test_a_parallel_drain_at_the_notice_keeps_every_deployment_serving(sim: Any, tmp_path: Any) -> None:
    """kubectl drain evicts a node's pods in parallel (one goroutine per pod) and retries each 429
    every 5 s: the guard's count (Ready pods on nodes that stay) is not changed by evicting a doomed
    pod, so parallel answers cannot race past it."""
    import concurrent.futures

    from tests.interruption.test_e2e_drainer import pods_on
    from tests.interruption.test_e2e_owners import reconcile, spot_nodes, warning

    with h.admission_webhook(sim, tmp_path, pods=False, evictions=True, timing=TIMING):
        store = sim.store
        spot = spot_nodes(store)
        before = ready_counts(store)
        watcher = h.Watcher()
        watcher.start(store)
        watcher.arm(spot)
        for n in spot:
            cordon(sim, n)  # the drainer first: cordoned before spotguard has the notice
        handler = h.handler_for(sim)
        doomed = [p["metadata"]["name"] for p in store.list("pods", namespace="shop")[0]
                  if p["spec"].get("nodeName") in spot and h.is_ready(p)]
        assert doomed
        refusals = 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(doomed)) as pool:
            answers = list(pool.map(lambda p: evict(sim, p), doomed))
        refusals += sum(1 for a in answers if a is not None and a.status == 429)
        assert refusals == len(doomed)  # nothing replaced yet: every one refused
        warning(handler, sim, spot)
        left = [p for p, a in zip(doomed, answers, strict=True) if a is not None]

        def drained() -> bool:
            nonlocal left
            reconcile(handler)
            retry_at = sim.clock.now() + 5
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(left))) as pool:
                results = list(pool.map(lambda p: evict(sim, p), left))
            left = [p for p, a in zip(left, results, strict=True) if a is not None and a.status == 429]
            if left:
                h.wait_until(lambda: sim.clock.now() >= retry_at, 10, "kubectl drain's 5 s")
            return not left and pods_on(store, spot) == 0

        h.wait_until(drained, 60, "the parallel drain to end", step=0.0)
        assert {n["metadata"]["name"] for n in store.list("nodes")[0]} >= set(spot)
        for key, count in before.items():
            assert watcher.lowest[key] >= count, (key, watcher.lowest[key], count)
