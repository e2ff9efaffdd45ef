"""A drainer beside spotguard, end to end through the served function (CloudEvents).

The simulated cluster's drainer acts as aws-node-termination-handler does without
cordon-only: it cordons and evicts everything on a node as soon as the node is marked
for reclaim. Both orders are run:

- spotguard first: the notice reaches spotguard, and the drainer starts 0 to 2 s
  (seeded) after the notice. The temporary budgets are written before anything else,
  so the drainer's evictions wait for the replacements;
- the drainer first: the drainer evicts at the notice and the warning reaches
  spotguard 0 to 2 s (seeded) later, with no rebalance recommendation before.

Both are won by the eviction guard (the admission function's validating webhook for
``pods/eviction``, served over HTTPS and registered from the shipped manifest): it
refuses (429) the eviction of a serving pod on the spot node going away until the
workload has its pre-notice count Ready on nodes that stay; the drainer retries every
5 s as kubectl drain does, and its drain still ends before the reclaim. Three
Deployments: web (6) and api (3) with no budget, shop (4) with its own permissive
budget (minAvailable 2), where spotguard cannot add a second budget.

And spotguard as the drainer (``drain: true``, nobody else draining): each doomed pod is
evicted once a replacement is Ready elsewhere, before the reclaim time.

In every case no Deployment has fewer Ready pods than just before the notice.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from spotguard.policy import config
from spotguard_sim import readiness, testing
from spotguard_sim.controllers import drainer, nodes

from tests.interruption import e2e_harness as h
from tests.interruption import sim_scenario
from tests.interruption.test_e2e_owners import (
    READY_DELAY,
    TIME_SCALE,
    reconcile,
    record,
    spot_nodes,
    warning,
)


def scenario() -> list[dict[str, Any]]:
    return [
        *sim_scenario.mixed_nodes(on_demand=2, spot=2),
        sim_scenario.deployment("web", 6),
        sim_scenario.deployment("api", 3),
    ]


def guarded_scenario() -> list[dict[str, Any]]:
    return [*scenario(), sim_scenario.deployment("shop", 4), sim_scenario.pdb("shop", "shop", min_available=2)]


def pods_on(store: Any, nodes: list[str]) -> int:
    return sum(
        1
        for p in store.list("pods")[0]
        if p["spec"].get("nodeName") in nodes and not p["metadata"].get("deletionTimestamp")
    )


def ready_counts(store: Any) -> dict[str, int]:
    return readiness.ready_counts(store.list("pods")[0])


def mark_for_reclaim(sim: Any, names: list[str], notice_time: float, drain_at: float) -> None:
    """The nodes go 120 s after the notice; the drainer starts on them at ``drain_at``."""

    def mark(node: dict[str, Any]) -> None:
        ann = node["metadata"].setdefault("annotations", {})
        ann[nodes.TERMINATE_AT] = sim.clock.iso(notice_time + 120)
        ann[drainer.DRAIN_AT] = sim.clock.iso_micro(drain_at)

    for n in names:
        sim.store.mutate("nodes", n, None, mark)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("order", ["spotguard-first", "drainer-first"])
def test_a_drainer_at_the_notice_never_takes_a_deployment_below_its_serving_count(
    order: str, seed: int, tmp_path: Any
) -> None:
    with testing.running_cluster(
        guarded_scenario(), time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY, drainer=True
    ) as sim, h.admission_webhook(sim, tmp_path, pods=False, evictions=True):
        store = sim.store
        h.wait_until(lambda: sum(ready_counts(store).values()) == 13, 30, "every pod Ready")
        handler = h.handler_for(sim)
        spot = spot_nodes(store)
        assert pods_on(store, spot) > 0
        before = ready_counts(store)
        watcher = h.Watcher()
        watcher.start(store)
        watcher.arm(spot)
        delay = random.Random(seed).uniform(0.0, 2.0)  # simulated seconds after the notice
        t0 = sim.clock.now()
        if order == "spotguard-first":
            warning(handler, sim, spot)
            mark_for_reclaim(sim, spot, t0, t0 + delay)  # the drainer starts 0-2 s after the notice
        else:
            mark_for_reclaim(sim, spot, t0, t0)  # the drainer acts at the notice...
            h.wait_until(lambda: sim.clock.now() >= t0 + delay, 5, "the notice's delivery delay")
            warning(handler, sim, spot)  # ...and the warning reaches spotguard 0-2 s later
        assert record(store, "web") is not None

        def emptied() -> bool:
            reconcile(handler)
            return pods_on(store, spot) == 0

        # The drainer's drain ends while the doomed nodes still exist (before the reclaim).
        h.wait_until(emptied, 60, "the drainer to empty the doomed nodes", step=0.2)
        assert {n["metadata"]["name"] for n in store.list("nodes")[0]} >= set(spot)

        def drained() -> bool:
            reconcile(handler)
            return not {n["metadata"]["name"] for n in store.list("nodes")[0]} & set(spot)

        h.wait_until(drained, 60, "the spot nodes to go", step=0.2)
        for key, count in before.items():
            assert watcher.lowest[key] >= count, (order, key, watcher.lowest[key], count)


def test_spotguard_drains_the_doomed_nodes_itself_create_before_evict() -> None:
    cfg = dataclasses.replace(config.Config(), drain=True)
    with testing.running_cluster(scenario(), time_scale=TIME_SCALE, ready_delay_seconds=READY_DELAY) as sim:
        store = sim.store
        h.wait_until(lambda: sum(ready_counts(store).values()) == 9, 30, "every pod Ready")
        handler = h.handler_for(sim, config=cfg)
        spot = spot_nodes(store)
        assert pods_on(store, spot) > 0
        before = ready_counts(store)
        watcher = h.Watcher()
        watcher.start(store)
        watcher.arm(spot)
        warning(handler, sim, spot)
        sim.reclaim(spot, after_seconds=120)

        def emptied() -> bool:
            reconcile(handler)
            return pods_on(store, spot) == 0

        # The doomed pods leave while their nodes still exist (before the reclaim time).
        h.wait_until(emptied, 60, "spotguard to drain the doomed nodes", step=0.2)
        assert {n["metadata"]["name"] for n in store.list("nodes")[0]} >= set(spot)
        for key, count in before.items():
            assert watcher.lowest[key] >= count, (key, watcher.lowest[key], count)
