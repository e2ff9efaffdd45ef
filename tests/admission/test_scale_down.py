"""End to end, default settings: a Deployment's scale-down keeps exactly its floor on on-demand.

GIVEN a simulated cluster labelled as Karpenter labels it and ``spotguard serve
admission`` with no configuration (two worker processes, its default) behind the
shipped webhook configuration, WHEN a Deployment with a percentage floor is
scaled down, THEN the ReplicaSet controller (upstream's deletion order:
``controller.kubernetes.io/pod-deletion-cost`` among Ready pods) keeps exactly the
floor of the new count on on-demand, not every on-demand pod; an absolute floor
is still kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.sim import objects

from tests.admission import harness

KARPENTER_OD = {"karpenter.sh/capacity-type": "on-demand"}
KARPENTER_SPOT = {"karpenter.sh/capacity-type": "spot"}
MIN_ON_DEMAND = "spotguard.io/min-on-demand"


def _scenario() -> list[dict[str, Any]]:
    nodes = [harness.node(f"od-{i}", dict(KARPENTER_OD), zone=f"us-east-1{'ab'[i]}") for i in range(2)]
    nodes += [harness.node(f"spot-{i}", dict(KARPENTER_SPOT), zone=f"us-east-1{'abc'[i]}") for i in range(3)]
    return [objects.namespace(n) for n in (harness.NS, "spotguard")] + nodes


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Served]:
    with harness.served(_scenario(), tmp_path_factory.mktemp("scale-down"), workers=2) as s:
        yield s


def _ready(k: kube.Kube, app: str, replicas: int) -> list[dict[str, Any]]:
    """The ``replicas`` live pods of ``app`` once every one is Ready (and no other is left)."""

    def done() -> bool:
        pods = k.list(r.PODS, harness.NS, label_selector=f"app={app}")
        return len(pods) == replicas and all(
            not p["metadata"].get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions") or [])
            for p in pods
        )

    harness.wait_for(done, what=f"{replicas} Ready pods of {app}")
    return harness.live_pods(k, app)


def _scale(k: kube.Kube, name: str, replicas: int) -> None:
    k.patch(r.DEPLOYMENTS, name, {"spec": {"replicas": replicas}}, harness.NS)


def test_a_quarter_floor_scaled_from_40_to_8_keeps_two_on_demand(served: harness.Served) -> None:
    # GIVEN a Deployment with a 25 % floor at 40 replicas: 10 on on-demand
    k = served.k
    k.create(r.DEPLOYMENTS, harness.deployment("quarter", 40, {MIN_ON_DEMAND: "25%"}), harness.NS)
    assert harness.on_demand(k, _ready(k, "quarter", 40)) == (10, 10)
    # WHEN it is scaled to 8
    _scale(k, "quarter", 8)
    # THEN 2 of the 8 (the floor of 8) are on on-demand, not all 8
    assert harness.on_demand(k, _ready(k, "quarter", 8)) == (2, 2)
    # AND scaling up again refills the floor of the new count
    _scale(k, "quarter", 20)
    assert harness.on_demand(k, _ready(k, "quarter", 20)) == (5, 5)
    _scale(k, "quarter", 13)
    assert harness.on_demand(k, _ready(k, "quarter", 13)) == (4, 4)


def test_an_absolute_floor_is_kept_through_a_scale_down(served: harness.Served) -> None:
    # GIVEN a Deployment with a floor of 3 at 12 replicas
    k = served.k
    k.create(r.DEPLOYMENTS, harness.deployment("three", 12, {MIN_ON_DEMAND: "3"}), harness.NS)
    assert harness.on_demand(k, _ready(k, "three", 12)) == (3, 3)
    # WHEN it is scaled to 4, THEN its 3 on-demand pods stay (the spot pods go)
    _scale(k, "three", 4)
    assert harness.on_demand(k, _ready(k, "three", 4)) == (3, 3)
    # AND to 2: both left are on-demand (the floor of 2 replicas is 2)
    _scale(k, "three", 2)
    assert harness.on_demand(k, _ready(k, "three", 2)) == (2, 2)
