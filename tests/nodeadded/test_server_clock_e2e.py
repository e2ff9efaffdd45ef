"""node-added judges a pod's age on the API server's clock, not its own.

The simulated cluster's clock runs 20 times faster than this process's, as a control plane's
clock may run ahead of a skewed instance's: every creationTimestamp is "in the future" on the
local clock. A pass must still see that the spilled replicas have settled and move them back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.nodeadded import reconciler
from spotguard.policy import config
from spotguard.sim import testing

from tests.interruption import sim_scenario
from tests.nodeadded import harness as h

KEY = "Deployment/shop/web"


@pytest.fixture
def spilled(tmp_path: Any) -> Iterator[Any]:
    nodes = [sim_scenario.namespace("shop"), sim_scenario.node("od-0", "on-demand")]
    nodes += [sim_scenario.node("spot-0", "spot", cpu="8")]
    with (
        testing.running_cluster(nodes, time_scale=20.0, ready_delay_seconds=10) as sim,
        h.admission_webhook(sim, tmp_path),
    ):
        k = kube.Kube(sim.api_client())
        spot = h.nodes_named(sim.store, "spot")
        h.cordon(k, spot)
        sim.store.apply_objects([sim_scenario.deployment("web", 3)])
        h.wait_until(lambda: h.placement(sim.store).get(KEY) == (3, 0, 0), 30, "3 on on-demand")
        h.wait_until(lambda: h.ready_pods(sim.store) == 3, 30, "3 Ready")
        h.cordon(k, spot, on=False)
        yield sim


def test_a_pass_on_the_default_clock_moves_settled_replicas_though_the_cluster_clock_runs_ahead(spilled: Any) -> None:
    sim = spilled
    # GIVEN pods older than the settle time on the cluster's clock (30 simulated seconds)
    time.sleep(sim.clock.real(40))
    # WHEN node-added runs passes with its default clock (no clock handed in: as served)
    cfg = config.Config(rebalance_max_pods_per_workload=1)
    rec = reconciler.Reconciler(
        kube.Kube(sim.api_client()), cfg, admission_cache_seconds=h.admission_cache_seconds(sim)
    )
    reports = h.passes_until(rec, lambda rep: bool(rep.started), max_passes=20)
    # THEN a move starts within a few passes (on the local clock every pod would be from the
    # future, so "settling", pass after pass), and its record's start is on the cluster's clock
    assert not any(s.reason == "settling" for rep in reports for s in rep.plan.skipped)
    assert abs(rec.clock() - sim.clock.now()) < 2.0
