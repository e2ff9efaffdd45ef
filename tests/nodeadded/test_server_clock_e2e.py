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

from tests.nodeadded import harness as h

KEY = "Deployment/shop/web"


@pytest.fixture
def spilled(tmp_path: Any) -> Iterator[Any]:
    with h.spilled_cluster(tmp_path, replicas=3, spot_nodes=1, time_scale=20.0) as sim:
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
