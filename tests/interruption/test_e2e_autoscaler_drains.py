"""A node autoscaler's drain of a spot node, end to end: the served admission function's
eviction guard (HTTPS, the shipped webhook configuration) and the spot-interruption
function's reconcile (CloudEvents pings), the simulated cluster, evictions through the
official client as Karpenter's termination makes them.

Karpenter deletes an under-used spot node as it does an on-demand one: it taints it
``karpenter.sh/disrupted:NoSchedule`` and evicts every pod on it, retrying refusals, then
terminates it. No spot notice comes. After a return to spot that is how the spot nodes
launched for the moves are packed together; with spot nodes left out of spotguard's drain
handling the default demo lost 2 of api's 3 and 2 of thumbnails' 4 replicas for 32 s in 2
of 30 runs (the guard let the pods go after the 8 s grace of a reclaim whose warning never
came, and no surge was made).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from spotguard.policy import config
from spotguard.policy.workloads import SURGE_OF
from spotguard_sim import readiness, testing

from tests.interruption import e2e_harness as h
from tests.interruption import sim_scenario
from tests.interruption.copy_watch import copies_now
from tests.interruption.test_e2e_owners import READY_DELAY, TIME_SCALE, reconcile

DISRUPTED = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
# The first reconcile after the taint: past the guard's grace for a spot node without a notice
# (8 s), as with the shipped schedule (every minute) it most often is.
PING_AFTER = 30.0


def serving_on(store: Any, node: str) -> list[str]:
    return [p["metadata"]["name"] for p in store.list("pods", "shop")[0]
            if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")]


def evict_all(api: client.CoreV1Api, store: Any, node: str) -> int:
    """Karpenter's termination: an eviction for every pod still on ``node``; how many were refused."""
    refused = 0
    for name in serving_on(store, node):
        try:
            api.create_namespaced_pod_eviction(
                name, "shop", client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="shop")))
        except ApiException as exc:
            assert exc.status in (404, 429), exc
            refused += exc.status == 429
    return refused


@contextlib.contextmanager
def two_spot_nodes(tmp_path: Any, *, pods: bool, surge_copy: bool = True) -> Iterator[tuple[Any, Any, str]]:
    """web (6) and api (3) on two on-demand and two spot nodes, every pod serving, the served
    eviction guard (and with ``pods``, the pod webhook); yields the cluster, the interruption
    handler (surging by a copy, the default, or with ``surge_copy=False`` by spec.replicas)
    and the spot node holding the most serving pods."""
    objs = [*sim_scenario.mixed_nodes(on_demand=2, spot=2), sim_scenario.deployment("web", 6),
            sim_scenario.deployment("api", 3)]
    with testing.running_cluster(objs, time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim, \
            h.admission_webhook(sim, tmp_path, pods=pods, evictions=True, timeout_seconds=None):
        h.wait_until(lambda: h.ready_pods(sim.store) == 9, 30, "every pod Ready")
        target = max(("spot-0", "spot-1"), key=lambda n: len(serving_on(sim.store, n)))
        assert serving_on(sim.store, target)
        yield sim, h.handler_for(sim, config=dataclasses.replace(config.Config(), surge_copy=surge_copy)), target


def test_a_spot_node_karpenter_consolidates_is_surged_before_its_pods_go(tmp_path: Any) -> None:
    # GIVEN web (6) and api (3) on two on-demand and two spot nodes, every pod serving
    with two_spot_nodes(tmp_path, pods=False) as (sim, handler, target):
        store = sim.store
        before = readiness.ready_counts(store.list("pods")[0])
        watcher = h.Watcher()
        watcher.start(store)
        watcher.arm([target])
        # WHEN Karpenter consolidates it: the taint, then every pod evicted, retried until gone
        store.mutate("nodes", target, None,
                     lambda n: n["spec"].__setitem__("taints", [*(n["spec"].get("taints") or []), DISRUPTED]))
        api = client.CoreV1Api(sim.api_client())
        refused = 0
        first_ping = next_ping = sim.clock.now() + PING_AFTER

        def drained() -> bool:
            nonlocal refused, next_ping
            if sim.clock.now() >= next_ping:  # the shipped schedule pings it every minute
                reconcile(handler)
                next_ping += PING_AFTER
            refused += evict_all(api, store, target)
            return not serving_on(store, target)

        h.wait_until(drained, 90, "Karpenter's drain of the spot node", step=0.5)
        assert sim.clock.now() > first_ping, "drained before spotguard's reconcile ran"
        store.delete("nodes", target)
        # THEN the drain waited for replacements (refused meanwhile) and no Deployment served
        # fewer replicas than before it
        assert refused > 0
        for key, count in before.items():
            assert watcher.lowest[key] >= count, (key, watcher.lowest[key], count)
        # AND spotguard said so on the node
        told = [e for e in store.list("events")[0] if e.get("reason") == "AutoscalerDrain"]
        assert [e["involvedObject"]["name"] for e in told] == [target], told


@pytest.mark.parametrize("surge", ["copy", "replica"])
def test_the_replacements_of_a_consolidated_spot_node_go_to_spot_where_the_autoscaler_found_room(
    tmp_path: Any, surge: str
) -> None:
    """Karpenter consolidates a spot node because its pods fit the others' room. The surge's
    replicas were pinned to on-demand: every such consolidation made Karpenter launch an
    on-demand node, consolidated in turn after the surge, and medium-karpenter never settled
    (its cost before a notice above all on-demand's). They now go to spot, where web's and
    api's other spot replicas are: in replica mode placed by the served webhook (the surge
    raises no on-demand floor for them), in copy mode by the copy's template (a spot slot's,
    surgecopy.build with on_demand=False; the webhook skips the copy's pods)."""
    copy_mode = surge == "copy"
    with two_spot_nodes(tmp_path, pods=True, surge_copy=copy_mode) as (sim, handler, target):
        store = sim.store
        other = "spot-1" if target == "spot-0" else "spot-0"
        on_target = len(serving_on(store, target))
        before = {p["metadata"]["uid"] for p in store.list("pods", "shop")[0]}
        watcher = h.Watcher()
        watcher.start(store)
        watcher.arm([target])
        readies = readiness.ready_counts(store.list("pods")[0])
        # WHEN Karpenter consolidates it and spotguard's reconcile runs
        store.mutate("nodes", target, None,
                     lambda n: n["spec"].__setitem__("taints", [*(n["spec"].get("taints") or []), DISRUPTED]))
        reconcile(handler)

        def new_pods() -> list[dict[str, Any]]:
            return [p for p in store.list("pods", "shop")[0] if p["metadata"]["uid"] not in before]

        h.wait_until(lambda: len(new_pods()) == on_target and all(readiness.is_ready(p) for p in new_pods()), 30,
                     "the surge's replicas Ready")
        surged = new_pods()
        # THEN each replacement was placed as a spot slot, on the spot node that stays
        for p in surged:
            labels = p["metadata"].get("labels") or {}
            assert labels.get("spotguard.io/placement") == "spot", (p["metadata"]["name"], labels)
            assert p["spec"]["nodeName"] == other, (p["metadata"]["name"], p["spec"]["nodeName"])
            # in copy mode they are the copies' pods; in replica mode the Deployments' own
            assert (SURGE_OF in labels) is copy_mode, (p["metadata"]["name"], labels)
        api = client.CoreV1Api(sim.api_client())
        refused = evict_all(api, store, target)
        reconcile(handler)

        def drained() -> bool:
            evict_all(api, store, target)
            return not serving_on(store, target)

        h.wait_until(drained, 60, "Karpenter's drain of the spot node", step=0.5)
        for key, count in readies.items():
            assert watcher.lowest[key] >= count, (key, watcher.lowest[key], count)
        if copy_mode:
            # AND the drain then empties the node with no Deployment below what it served: the
            # copies' pods serve for the drained ones, so Karpenter's evictions go through at
            # once; each Deployment replaces its evicted pods (placed by its usual floor: spot,
            # where the autoscaler found room) and the copy goes once they are Ready
            assert refused == 0
            h.wait_until(lambda: (reconcile(handler), not copies_now(store))[1], 60, "the copies' removal", 0.5)
            h.wait_until(lambda: h.ready_pods(store) == 9 and len(store.list("pods", "shop")[0]) == 9, 30,
                         "the copies' pods gone")
            own = new_pods()
            assert len(own) == on_target and not [p for p in own if SURGE_OF in p["metadata"]["labels"]], own
            for p in own:
                assert p["metadata"]["labels"].get("spotguard.io/placement") == "spot", p["metadata"]
            assert not [d for d in store.list("deployments", "shop")[0] if d["spec"]["replicas"] != {
                "web": 6, "api": 3}[d["metadata"]["name"]]]
            return
        # AND the drain then empties the node with no Deployment below what it served: Karpenter's
        # evictions refused, the next reconcile's scale back removes the drained pods
        assert refused == on_target
        # AND no pod was made beyond the surge's: an evicted pod of a surged ReplicaSet is
        # replaced once more (a pod Karpenter launches a node for, removed with the scale back)
        h.wait_until(lambda: h.ready_pods(store) == 9 and len(store.list("pods", "shop")[0]) == 9, 30,
                     "the scale back")
        assert len(new_pods()) == on_target, [p["metadata"]["name"] for p in new_pods()]
