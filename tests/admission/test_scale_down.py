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
from spotguard_sim import objects

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


@pytest.mark.parametrize(
    ("name", "floor", "steps"),
    [
        # 25 % at 40: 10 on on-demand; scaled to 8, the floor of 8 (2) stays, not all 8;
        # scaling up refills the floor of the new count, and down again keeps exactly it
        ("quarter", "25%", [(40, 10), (8, 2), (20, 5), (13, 4)]),
        # an absolute floor of 3: its on-demand pods stay (the spot pods go), and at 2
        # replicas both left are on-demand
        ("three", "3", [(12, 3), (4, 3), (2, 2)]),
    ],
)
def test_a_scale_down_keeps_exactly_the_floor_of_the_new_count(
    served: harness.Served, name: str, floor: str, steps: list[tuple[int, int]]
) -> None:
    k = served.k
    (replicas, on_demand), *rest = steps
    # GIVEN the Deployment at its first count, exactly its floor on on-demand
    k.create(r.DEPLOYMENTS, harness.deployment(name, replicas, {MIN_ON_DEMAND: floor}), harness.NS)
    assert harness.on_demand(k, _ready(k, name, replicas)) == (on_demand, on_demand)
    for replicas, on_demand in rest:
        # WHEN it is scaled, THEN exactly the floor of the new count is on on-demand
        _scale(k, name, replicas)
        assert harness.on_demand(k, _ready(k, name, replicas)) == (on_demand, on_demand), replicas
